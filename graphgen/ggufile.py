"""A GGUF file: its layout checked, its reader, its fields. The one entry point every reader of a draft
goes through.

`check_layout` walks the header, metadata and tensor infos as ggml's own gguf reader does, with every
count bounded by the file's size; `open_reader` then opens gguf-py's reader on it (metadata and the
tensor table; the data stays on disk), its errors naming the file; `field_value` reads one field as
a Python value, the one getter the loader (models/loader.py's GGUFMeta), the drivers' spec-type
detection and the reference runner use.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from .errors import GGUFModelError

N_DIMS_MAX = 4               # GGML_MAX_DIMS

_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GGML_TYPE_COUNT = 43          # ggml 0.27.0 (b11739)
GGML_MAX_NAME = 64
GGUF_DEFAULT_ALIGNMENT = 32
TENSOR_ALIGNMENT = 32         # ggml's alignment of a tensor's data
# ggml type -> (values per block, bytes per block) in ggml 0.27.0; (0, 0) for removed types
GGML_TYPE_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 4: (0, 0), 5: (0, 0), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    31: (0, 0), 32: (0, 0), 33: (0, 0), 34: (256, 54), 35: (256, 66), 36: (0, 0), 37: (0, 0), 38: (0, 0),
    39: (32, 17), 40: (64, 36), 41: (128, 18), 42: (64, 18)}
INT64_MAX = 2**63 - 1


def check_layout(path, data=None) -> None:
    """Walk a GGUF's header, metadata and tensor infos as ggml's gguf reader does, refusing what
    it refuses (an empty or repeated key, a value type it does not know, an alignment that is not
    a u32 power of 2, a tensor name of 64 bytes or more, a repeated tensor name, more than 4 or
    negative dims, an element count past int64, a type outside ggml's, a row that is not whole
    blocks, and tensor data that does not start where the previous tensor's padded data ends).

    Every count is bounded by the file's size on the way: gguf-py trusts the counts it reads,
    and an array that claims 2^63 elements makes it loop for hours. The walk is linear in the
    file's size and raises GGUFModelError instead.
    """
    import mmap
    import struct as _s

    with open(path, "rb") as f:
        magic = f.read(4)
        if magic != b"GGUF":
            raise GGUFModelError(f"{path}: not a GGUF file (magic {magic!r})")
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise GGUFModelError(f"{path}: truncated GGUF ({size} bytes, the header alone takes 24)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        version, n_t, n_kv = _s.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise GGUFModelError(f"{path}: unsupported GGUF version {version}")
        if n_kv > size // 13 or n_t > size // 24:
            raise GGUFModelError(f"{path}: header claims {n_kv} keys and {n_t} tensors, more than a "
                                 f"{size}-byte file can hold")
        pos = 24

        def need(p, n, what):
            if n < 0 or p + n > size:
                raise GGUFModelError(f"{path}: {what} runs past the end of the file (truncated or corrupt)")

        def string(p, what):
            need(p, 8, what)
            n, = _s.unpack_from("<Q", buf, p)
            need(p + 8, n, what)
            return bytes(buf[p + 8:p + 8 + n]), p + 8 + n

        def value(p, t, key):
            if t in _GGUF_SCALAR:
                need(p, _GGUF_SCALAR[t], f"key '{key}'")
                return p + _GGUF_SCALAR[t]
            if t == 8:
                return string(p, f"key '{key}'")[1]
            if t == 9:
                need(p, 12, f"key '{key}'")
                sub, n = _s.unpack_from("<IQ", buf, p)
                p += 12
                if sub in _GGUF_SCALAR:
                    need(p, n * _GGUF_SCALAR[sub], f"key '{key}' ({n} elements)")
                    return p + n * _GGUF_SCALAR[sub]
                if sub == 8:
                    if n * 8 > size - p:
                        raise GGUFModelError(f"{path}: key '{key}' claims {n} strings, more than the file holds")
                    for _ in range(n):
                        p = string(p, f"key '{key}'")[1]
                    return p
                raise GGUFModelError(f"{path}: key '{key}' is an array of unsupported type {sub} "
                                     "(gguf: invalid GGUF type)")
            raise GGUFModelError(f"{path}: key '{key}' has unknown GGUF type {t} (gguf: invalid GGUF type)")

        keys: set = set()
        alignment = GGUF_DEFAULT_ALIGNMENT
        for i in range(n_kv):
            kb, pos = string(pos, "a metadata key")
            key = kb.decode(errors="replace")
            if not kb:
                raise GGUFModelError(f"{path}: metadata key {i} is empty (gguf: key is empty)")
            if kb in keys:
                raise GGUFModelError(f"{path}: duplicate key '{key}' (gguf: duplicate key for KV pair {i})")
            keys.add(kb)
            need(pos, 4, f"key '{key}'")
            t, = _s.unpack_from("<I", buf, pos)
            end = value(pos + 4, t, key)
            if kb == b"general.alignment":
                if t != 4:
                    names = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 5: "i32", 6: "f32", 7: "bool", 8: "str", 9: "arr",
                             10: "u64", 11: "i64", 12: "f64"}
                    raise GGUFModelError(f"{path}: key 'general.alignment' must be of type u32 but is "
                                         f"{names.get(t, t)} (gguf)")
                alignment, = _s.unpack_from("<I", buf, pos + 4)
                if alignment == 0 or alignment & (alignment - 1):
                    raise GGUFModelError(f"{path}: key 'general.alignment' = {alignment} is not a power of 2 (gguf)")
            pos = end
        names: set = set()
        infos = []
        for _ in range(n_t):
            nb, pos = string(pos, "a tensor name")
            name = nb.decode(errors="replace")
            if len(nb) >= GGML_MAX_NAME:
                raise GGUFModelError(f"{path}: tensor name '{name}' is too long: {len(nb)} >= {GGML_MAX_NAME} (gguf)")
            if nb in names:
                raise GGUFModelError(f"{path}: duplicated tensor '{name}' (gguf: duplicate tensor name)")
            names.add(nb)
            need(pos, 4, f"tensor '{name}'")
            nd, = _s.unpack_from("<I", buf, pos)
            if nd > 4:
                raise GGUFModelError(f"{path}: tensor '{name}' has {nd} dimensions (ggml has at most 4)")
            need(pos + 4, 8 * nd + 12, f"tensor '{name}'")
            ne = list(_s.unpack_from(f"<{nd}q", buf, pos + 4)) + [1] * (4 - nd)
            if any(d < 0 for d in ne):
                raise GGUFModelError(f"{path}: tensor '{name}' has shape {ne[:max(nd, 1)]}: a negative number of "
                                     "elements (gguf)")
            count = 1
            for d in ne:
                count *= d
            if count > INT64_MAX:
                raise GGUFModelError(f"{path}: tensor '{name}' has shape {ne[:max(nd, 1)]}, more elements than int64 "
                                     "holds (gguf)")
            ttype, off = _s.unpack_from("<iQ", buf, pos + 4 + 8 * nd)
            if not 0 <= ttype < GGML_TYPE_COUNT:
                raise GGUFModelError(f"{path}: tensor '{name}' has invalid ggml type {ttype} (gguf: should be in "
                                     f"[0, {GGML_TYPE_COUNT}))")
            blck, tsize = GGML_TYPE_BLOCKS[ttype]
            if blck == 0 or ne[0] % blck:
                raise GGUFModelError(f"{path}: tensor '{name}' of ggml type {ttype} has {ne[0]} elements per row, not "
                                     f"a multiple of its block size ({blck}) (gguf)")
            infos.append((name, count // blck * tsize, off))
            pos += 4 + 8 * nd + 12
        expected = 0
        data_start = -(-pos // alignment) * alignment
        for name, nbytes, off in infos:
            if off != expected:
                raise GGUFModelError(f"{path}: tensor '{name}' has data offset {off}, expected {expected} (gguf "
                                     "requires each tensor's data to follow the previous tensor's)")
            if (data_start + off) % TENSOR_ALIGNMENT:
                # llama.cpp maps the file and points each weight into it; ggml asserts the address
                raise GGUFModelError(f"{path}: tensor '{name}' data lies at file offset {data_start + off}, not a "
                                     f"multiple of {TENSOR_ALIGNMENT} (key 'general.alignment' = {alignment}); "
                                     "llama.cpp asserts ggml's tensor alignment on it")
            expected += -(-nbytes // alignment) * alignment
    finally:
        buf.close()


def open_reader(path: Path):
    """The GGUF's reader (metadata and tensor table; the data stays on disk), its errors naming
    the file."""
    # the magic, then every count bounded by the file's size: gguf-py trusts the counts and can
    # loop for hours
    check_layout(path)
    try:
        return _bounded_reader_class()(str(path), "r")
    except GGUFModelError as e:
        raise GGUFModelError(f"{path}: {e}") from None
    except Exception as e:  # gguf-py raises ValueError/IndexError/struct.error on truncation
        raise GGUFModelError(f"{path}: malformed or truncated GGUF ({type(e).__name__}: {e})") from None


@functools.lru_cache(maxsize=None)
def _bounded_reader_class():
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

    class BoundedReader(GGUFReader):
        """gguf-py's reader, naming the first tensor whose data runs past the end of a truncated
        file (as llama.cpp's loader does) instead of failing to reshape an array.

        It reads the same fields, parts and tensors, faster: a vocabulary's arrays make gguf-py
        slice its np.memmap 100,000 times (a Python-level __getitem__ each: 3.5 s of a realistic
        draft's 4.2 s load), so slices come from a plain ndarray view of the same mapping, and an
        array of numbers is read in one slice and cut into its elements' parts."""

        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            dt = np.dtype(dtype)
            arr = plain[offset:offset + dt.itemsize * count].view(dtype=dt)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type == GGUFValueType.ARRAY:
                itype = self._get(orig_offs, np.uint32)
                alen = self._get(orig_offs + 4, np.uint64)
                try:
                    sub = GGUFValueType(int(itype[0]))
                except ValueError:
                    sub = None
                nptype = self.gguf_scalar_to_np.get(sub)
                if nptype is not None:
                    n = int(alen[0])
                    vals = self._get(orig_offs + 12, nptype, n)
                    if vals.size != n:
                        raise GGUFModelError(f"an array of {n} values at offset {orig_offs} runs past the end of "
                                             "the file: the GGUF is truncated or corrupt")
                    parts = [itype, alen] + [vals[i:i + 1] for i in range(n)]
                    return 12 + int(vals.nbytes), parts, list(range(2, 2 + n)), [GGUFValueType.ARRAY, sub]
                if sub == GGUFValueType.STRING:
                    # each string as gguf-py gives it: its length (a u64 part) and its bytes
                    len_type, byte_type = self._get(0, np.uint64).dtype, self._get(0, np.uint8).dtype
                    plain, n, off = self._plain, int(alen[0]), orig_offs + 12
                    parts, idxs = [itype, alen], []
                    for _ in range(n):
                        ln = plain[off:off + 8].view(len_type)
                        size = int(ln[0]) if ln.size == 1 else -1
                        text = plain[off + 8:off + 8 + size].view(byte_type)
                        if size < 0 or text.size != size:
                            raise GGUFModelError(f"a string array at offset {orig_offs} runs past the end of the "
                                                 "file: the GGUF is truncated or corrupt")
                        idxs.append(len(parts) + 1)
                        parts += (ln, text)
                        off += 8 + size
                    return off - orig_offs, parts, idxs, [GGUFValueType.ARRAY, sub]
            return super()._get_field_parts(orig_offs, raw_type)

        def _build_tensors(self, start_offs, fields):
            size = len(self.data)
            for info in fields:
                _, name_data, _, dims, raw_dtype, offset = info.parts
                try:
                    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_dtype[0]))]
                except (ValueError, KeyError):
                    continue  # the parent names the bad type
                n_bytes = int(np.prod(dims.astype(np.int64))) * type_size // block
                at = int(start_offs + offset[0])
                if at + n_bytes > size:
                    name = bytes(name_data).decode("utf-8", "replace")
                    raise GGUFModelError(f"tensor '{name}' ({n_bytes} bytes at offset {at}) runs past the end of "
                                         f"the file ({size} bytes): the GGUF is truncated or corrupt")
            return super()._build_tensors(start_offs, fields)
    return BoundedReader


_ARR, _STR = 9, 8   # gguf value types: array, string


def field_value(reader, key: str):
    """A field's value as a Python str, int, float, bool or list, or None when the key is absent.
    Raises GGUFModelError naming the key when its data is malformed."""
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        t = int(f.types[0])
        vals = [f.parts[i] for i in f.data]
        if t != _ARR:
            v = vals[0]
            return v.tobytes().decode(errors="replace") if t == _STR else v[0].item()
        if len(f.types) > 1 and int(f.types[1]) == _STR:
            return [v.tobytes().decode(errors="replace") for v in vals]
        return [v[0].item() for v in vals]
    except Exception as e:  # noqa: BLE001 - malformed field data, whatever gguf-py made of it
        raise GGUFModelError(f"key '{key}' is malformed ({e})") from None


def try_open(path):
    """The reader, or None for a file that is not a readable GGUF (where upstream's spec-type
    detection finds nothing rather than failing)."""
    try:
        return open_reader(Path(path))
    except (GGUFModelError, OSError):
        return None
