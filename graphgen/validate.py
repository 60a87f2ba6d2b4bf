"""Checks that run before ggml calls that can assert: a GGML_ASSERT kills the interpreter, so
shapes, types and index ranges are checked here, in Python, and refused with graphgen's
documented exceptions (GGUFModelError, BatchError) naming the key, tensor, shape or field.

Long because every check that must run before a ggml call that could assert is here, in one place,
so none is missed.
"""

from __future__ import annotations

import os
import re

import numpy as np

from .errors import BatchError, GGUFModelError, GraphgenError
from .models.head import BlockRules

POS_MAX = 2**31 - 1          # llama_pos is int32
N_DIMS_MAX = 4               # GGML_MAX_DIMS


# ---- GGUF files -------------------------------------------------------------------------------

def check_tensor_data(reader, path, file_size: int) -> int:
    """Every tensor's dims and data range are sane; returns the bytes the weights need."""
    total = 0
    for t in reader.tensors:
        shape = [int(x) for x in t.shape]
        if not 1 <= len(shape) <= N_DIMS_MAX or any(d <= 0 for d in shape):
            raise GGUFModelError(f"{path}: tensor '{t.name}' has shape {shape}; ggml takes 1 to "
                                 f"{N_DIMS_MAX} positive dims")
        n = int(t.n_bytes)
        off = int(t.data_offset)
        if off < 0 or n < 0 or off + n > file_size:
            raise GGUFModelError(f"{path}: tensor '{t.name}' data lies past the end of the file "
                                 f"(offset {off} + {n} bytes > {file_size})")
        total += n
    return total


INT_TENSORS = {"d2t"}        # the only integer tensor a draft holds (read by ggml_get_rows)
_INT_TYPES = {24: "i8", 25: "i16", 26: "i32", 27: "i64"}


# tensors that only enter elementwise ops (ggml_add/ggml_mul with f32 operands)
_ELEMENTWISE = re.compile(r"(norm\.|_norm$|\.bias$|\.scale$|_sinks|rope_freqs|_conv_base$|_embedding\.weight$|"
                          r"exp_probs_b|_base\.weight$|_scale\.weight$|attention_bias)")
# ggml_type -> values per block, for the quantized types a weight may have
_QUANT_BLOCK = {2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 9: 32, 10: 256, 11: 256, 12: 256, 13: 256, 14: 256, 15: 256}


def check_tensor_types(reader, path) -> None:
    """Weights are float (f32/f16/bf16/q8_0): an integer weight in a matmul or an add makes ggml
    abort or read out of bounds."""
    for t in reader.tensors:
        tt = int(t.tensor_type)
        if tt in _INT_TYPES and t.name not in INT_TENSORS:
            raise GGUFModelError(f"{path}: tensor '{t.name}' has integer type {_INT_TYPES[tt]}; "
                                 "weights must be f32, f16, bf16 or q8_0")
        # norms, biases and scales enter ggml_mul/ggml_add with f32 activations, which need f32
        if len(t.shape) == 1 and tt != 0 and t.name not in INT_TENSORS:
            raise GGUFModelError(f"{path}: tensor '{t.name}' (1-D: a norm, bias or scale) has type "
                                 f"{t.tensor_type.name}; it must be F32")
        # so do the many-dimensional tensors that only meet activations elementwise
        if tt != 0 and _ELEMENTWISE.search(t.name):
            raise GGUFModelError(f"{path}: tensor '{t.name}' is used elementwise with f32 activations and "
                                 f"has type {t.tensor_type.name}; it must be F32")
        # a quantized row is made of whole blocks
        blk = _QUANT_BLOCK.get(tt)
        if blk and len(t.shape) and int(t.shape[0]) % blk:
            raise GGUFModelError(f"{path}: tensor '{t.name}' has {int(t.shape[0])} values per row, not a "
                                 f"multiple of its {t.tensor_type.name} block of {blk}")


def available_memory() -> int | None:
    """Bytes of memory available for new allocations (MemAvailable), None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def check_memory(need: int, path, what: str = "its tensors") -> None:
    """Refuse before allocating when `need` bytes would not fit in available memory."""
    have = available_memory()
    if have is not None and need > have:
        raise GGUFModelError(f"{path}: {what} need {_gib(need)} ({need} bytes), only {_gib(have)} "
                             "of memory is available")


# ---- batches ----------------------------------------------------------------------------------

def _int(v, what: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise BatchError(f"{what} must be an integer, got {v!r}")
    return int(v)


def check_positions(pos0, n: int, what: str = "batch") -> int:
    """pos0 .. pos0 + n - 1 fit llama_pos (int32) and are not negative."""
    p = _int(pos0, f"{what}: position pos0")
    if p < 0:
        raise BatchError(f"{what}: negative position {p} in the batch")
    if p + max(n, 1) - 1 > POS_MAX:
        raise BatchError(f"{what}: position {p + n - 1} is past the largest position {POS_MAX}")
    return p


def check_seq(seq, n_seq: int, what: str = "batch") -> int:
    """A sequence id in [0, n_seq), checked before it is cast to int32."""
    s = _int(seq, f"{what}: sequence id")
    if not 0 <= s < n_seq:
        raise BatchError(f"sequence id {s} is outside [0, {n_seq})")
    return s


def check_batch(pos: np.ndarray, seq: np.ndarray, n_ubatch: int, n_seq: int, limit: str = "") -> None:
    """The checks of every batch: size, positions, sequence ids.

    A position may repeat within a sequence: llama.cpp accepts that as long as the positions
    neither decrease nor leave a gap (check_seq_positions)."""
    if pos.ndim != 1 or pos.shape[0] == 0:
        raise BatchError("a batch needs at least one token")
    if pos.shape[0] > n_ubatch:
        raise BatchError(f"batch of {pos.shape[0]} tokens is larger than {limit or f'n_ubatch {n_ubatch}'}")
    if (pos < 0).any():
        raise BatchError(f"negative position {int(pos.min())} in the batch")
    bad = (seq < 0) | (seq >= n_seq)
    if bad.any():
        raise BatchError(f"sequence id {int(seq[bad][0])} is outside [0, {n_seq})")


def _positions_ok(pos: np.ndarray, seq: np.ndarray, cache_pos_max, mrope: bool, is_embd: bool) -> bool:
    """True when the batch passes every rule of check_seq_positions, in O(tokens) numpy work.

    Any doubt returns False, and the rule-by-rule walk finds the first rule broken and says so."""
    if pos.size == 0:
        return False
    if seq[0] == seq[-1] and (seq == seq[0]).all():
        groups = [(int(seq[0]), pos)]
    else:
        order = np.argsort(seq, kind="stable")
        ss, ps = seq[order], pos[order]
        cuts = np.flatnonzero(np.diff(ss)) + 1
        groups = [(int(g[0]), p) for g, p in zip(np.split(ss, cuts), np.split(ps, cuts))]
    for s, p in groups:
        d = np.diff(p)
        if (d < 0).any():
            return False  # decreasing: the walk names the row
        y, x = int(p[0]), int(cache_pos_max(s))
        if mrope:
            if x >= 0 and (x > y if is_embd else x >= y):
                return False
            continue
        if x >= 0 and y != x + 1:
            return False
        # non-decreasing, so the distinct positions are the first one and every increase
        if int(p[-1]) - y + 1 > 1 + int(np.count_nonzero(d)):
            return False
    return True


def check_seq_positions(pos: np.ndarray, seq: np.ndarray, cache_pos_max, mrope: bool, is_embd: bool) -> None:
    """The position rules llama.cpp's batch allocator applies before a batch runs, in its order.

    `cache_pos_max(s)` is the last position the KV cache holds for sequence s (-1: none). Per
    sequence of the batch, lowest id first: without M-RoPE its first position Y must follow the
    cache's last one X (Y = X + 1) and its positions must leave no gap; with M-RoPE positions may
    jump forward, but a token batch must start after X (X < Y) and an embedding batch at or after
    it (X <= Y). Then, in batch order, no sequence's positions may decrease. llama.cpp refuses a
    batch that breaks one of these (llama_process returns -1), so graphgen does too."""
    pos = np.asarray(pos, dtype=np.int64)
    seq = np.asarray(seq, dtype=np.int64)
    if _positions_ok(pos, seq, cache_pos_max, mrope, is_embd):
        return
    for s in sorted(set(seq.tolist())):
        p = pos[seq == s]
        y, x = int(p.min()), int(cache_pos_max(s))
        if mrope:
            if x >= 0 and (x > y if is_embd else x >= y):
                rule = "X <= Y for an embedding batch" if is_embd else "X < Y for a token batch"
                raise BatchError(f"sequence {s}: inconsistent sequence positions: the KV cache's last position "
                                 f"for sequence {s} is X = {x} and the batch starts at position Y = {y}; "
                                 f"with M-RoPE llama.cpp requires {rule}")
            continue
        if x >= 0 and y != x + 1:
            raise BatchError(f"sequence {s}: inconsistent sequence positions: the KV cache's last position for "
                             f"sequence {s} is X = {x} and the batch starts at position Y = {y}; llama.cpp "
                             "requires the sequence positions to remain consecutive: Y = X + 1 (remove the "
                             "cache's later positions with seq_rm first)")
        n_distinct = len(set(p.tolist()))
        if int(p.max()) - y + 1 > n_distinct:
            raise BatchError(f"sequence {s} positions are not continuous: the batch holds {n_distinct} distinct "
                             f"positions between {y} and {int(p.max())} for sequence {s}")
    last: dict[int, int] = {}
    for i, (s, p) in enumerate(zip(seq.tolist(), pos.tolist())):
        if p < last.get(s, -1):
            raise BatchError(f"sequence {s} positions are decreasing (not allowed): batch row {i} has "
                             f"position {p} after position {last[s]}")
        last[s] = p


def check_features(x, width: int) -> np.ndarray:
    """Target features: a finite float32 [n_tokens, width] array."""
    try:
        a = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise BatchError(f"target features are not a numeric array ({e})") from None
    if a.ndim != 2 or a.shape[1] != width:
        raise BatchError(f"target features must be [n_tokens, {width}] (len(target_layers) * n_embd), "
                         f"got shape {list(a.shape)}")
    if not np.isfinite(a).all():
        raise BatchError("target features contain NaN or Inf")
    return np.ascontiguousarray(a)


def _rules(rules) -> BlockRules:
    """A head's BlockRules, or those of a head that asks nothing."""
    return rules if rules is not None else _NO_RULES


_NO_RULES = BlockRules("dflash")


def _blocks_fit(rules, n: int, n_blocks: int) -> bool:
    """The head's rules hold for n tokens in n_blocks blocks."""
    if not rules.equal_blocks or not n_blocks:
        return True
    return not n % n_blocks and not (rules.max_block > 0 and n // n_blocks > rules.max_block)


def quick_blocks(blocks, rules, n_vocab: int, n_ubatch: int, n_seq: int):
    """(tokens, positions, sequence ids, runs) for a batch of plainly valid blocks of distinct
    sequences, checked in Python at the cost of a few comparisons per block; None for anything
    else, which block_arrays and check_batch then check one rule at a time (naming the problem).
    Covers block_arrays' and check_batch's rules; the positions against the cache are
    runs_follow_cache's."""
    if type(blocks) not in (list, tuple) or not blocks:
        return None
    runs, toks, seen, n = [], [], set(), 0
    for b in blocks:
        if type(b) not in (list, tuple) or len(b) != 3:
            return None
        s, t, p0 = b
        if type(s) is not int or type(p0) is not int or type(t) not in (list, tuple) or not t:
            return None
        if s in seen or not 0 <= s < n_seq or p0 < 0 or p0 + len(t) - 1 > POS_MAX:
            return None
        if not all(type(x) is int for x in t) or min(t) < 0 or max(t) >= n_vocab:
            return None
        seen.add(s)
        runs.append((s, p0, len(t)))
        toks.extend(t)
        n += len(t)
    if n > n_ubatch:
        return None
    if not _blocks_fit(_rules(rules), n, len(runs)):
        return None
    if len(runs) == 1:
        s, p0, k = runs[0]
        pos, seq = np.arange(p0, p0 + k, dtype=np.int32), np.full(k, s, dtype=np.int32)
    else:
        pos = np.concatenate([np.arange(p0, p0 + k, dtype=np.int32) for _, p0, k in runs])
        seq = np.repeat(np.array([s for s, _, _ in runs], dtype=np.int32), [k for _, _, k in runs])
    return np.array(toks, dtype=np.int32), pos, seq, runs


def runs_follow_cache(runs, cache_pos_max, mrope: bool, is_embd: bool) -> bool:
    """check_seq_positions' rules for runs of consecutive positions of distinct sequences: each
    run must follow its sequence's last cached position. False: let check_seq_positions say why."""
    for s, p0, _ in runs:
        x = cache_pos_max(s)
        if mrope:
            if x >= 0 and (x > p0 if is_embd else x >= p0):
                return False
        elif x >= 0 and p0 != x + 1:
            return False
    return True


def _block_arrays_fast(blocks, n_vocab: int):
    """block_arrays' result in a few numpy calls when every entry is plainly valid, else None
    (and the entry-by-entry walk names the first problem)."""
    toks, pos, seq = [], [], []
    for b in blocks:
        if type(b) not in (list, tuple) or len(b) != 3 or type(b[0]) is not int or type(b[2]) is not int:
            return None
        s, t, p0 = b
        if isinstance(t, np.ndarray):
            if t.ndim != 1 or t.dtype.kind not in "iu":
                return None
        elif type(t) not in (list, tuple) or not all(type(x) is int for x in t):
            return None
        n = len(t)
        if not 0 <= s <= POS_MAX or p0 < 0 or p0 + max(n, 1) - 1 > POS_MAX:
            return None
        toks.append(np.asarray(t, dtype=np.int64))
        pos.append(np.arange(p0, p0 + n, dtype=np.int32))
        seq.append(np.full(n, s, dtype=np.int32))
    t = np.concatenate(toks) if len(toks) > 1 else toks[0]
    if t.size and (t.min() < 0 or t.max() >= n_vocab):
        return None
    return (t.astype(np.int32), np.concatenate(pos) if len(pos) > 1 else pos[0],
            np.concatenate(seq) if len(seq) > 1 else seq[0])


def _blocks_divide(seq: np.ndarray, rules) -> bool:
    """The head's block rules hold for these sequence ids (or do not apply)."""
    if not rules.equal_blocks or seq.size == 0:
        return True
    n_blocks = len(np.unique(seq)) if seq[0] != seq[-1] or not (seq == seq[0]).all() else 1
    return _blocks_fit(rules, int(seq.size), n_blocks)


def block_arrays(blocks, rules, n_vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[(seq, tokens, pos0), ...] -> int32 tokens, positions, sequence ids, checked before any cast.

    A sequence may come twice (llama.cpp accepts it when its positions stay continuous; the
    positions are checked against the cache in check_seq_positions). A head whose rules ask for
    equal blocks (graphgen.models.head.BlockRules) takes one block per distinct sequence: the
    batch must divide into equal blocks, and a lattice that keeps max_block rows per block (DFlash2)
    must cover every token, since llama.cpp reads one lattice row per token and aborts otherwise."""
    rules = _rules(rules)
    if not isinstance(blocks, (list, tuple)) or not blocks:
        raise BatchError("a block batch needs at least one (seq, tokens, pos0) entry")
    fast = _block_arrays_fast(blocks, n_vocab)
    if fast is not None and _blocks_divide(fast[2], rules):
        return fast
    toks, pos, seq = [], [], []
    for k, b in enumerate(blocks):
        if not isinstance(b, (list, tuple)) or len(b) != 3:
            raise BatchError(f"block {k} must be (seq, tokens, pos0), got {b!r}")
        s = _int(b[0], f"block {k}: sequence id")
        t = [_int(x, f"block {k}: token") for x in b[1]]
        p0 = check_positions(b[2], len(t), f"block {k}")
        for x in t:
            if not 0 <= x < n_vocab:
                raise BatchError(f"token id {x} is outside the vocabulary [0, {n_vocab})")
        if not -2**31 <= s <= POS_MAX:
            raise BatchError(f"sequence id {s} is outside [0, {POS_MAX}]")
        toks += t
        pos += range(p0, p0 + len(t))
        seq += [s] * len(t)
    n, n_blocks = len(toks), len(set(seq))
    if rules.equal_blocks and n_blocks and n % n_blocks:
        sizes = [seq.count(s) for s in sorted(set(seq))]
        raise BatchError(f"a block batch of {n} tokens over {n_blocks} sequences (tokens per sequence {sizes}) "
                         f"does not divide into equal blocks, which the {rules.head} head needs "
                         "(llama.cpp asserts n_tokens % n_seqs == 0)")
    if rules.equal_blocks and rules.max_block > 0 and n_blocks and n // n_blocks > rules.max_block:
        raise BatchError(f"blocks of {n // n_blocks} tokens are longer than the trained block size {rules.max_block} "
                         f"(key 'dflash.block_size'): the {rules.head} lattice has block_size rows per block and "
                         "llama.cpp aborts reading one row per token")
    return (np.asarray(toks, dtype=np.int32), np.asarray(pos, dtype=np.int32), np.asarray(seq, dtype=np.int32))


def check_embd_state(st, n_tokens: int, n_embd: int) -> np.ndarray | None:
    """LiliCorr's per-token state rows: float32 [n_tokens, n_embd], finite."""
    if st is None:
        return None
    try:
        a = np.asarray(st, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise BatchError(f"embd_state is not a numeric array ({e})") from None
    if a.shape != (n_tokens, n_embd):
        raise BatchError(f"embd_state must be [{n_tokens}, {n_embd}], got {list(a.shape)}")
    return np.ascontiguousarray(a)


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


def check_gguf_layout(path, data=None) -> None:
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


class KVCacheTypeError(GraphgenError, ValueError):
    """KV cache types llama.cpp refuses for this draft (or computes garbage with)."""


# ggml's block size for each quantized cache type graphgen takes (all hold 32 values a block)
_KV_BLOCK = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "iq4_nl": 32}


def check_kv_types(hp, type_k: str, type_v: str, flash_attn: bool, k_only: bool = False) -> None:
    """llama.cpp's context checks on the cache types: a quantized V cache needs flash attention,
    and a quantized head must hold whole blocks. llama.cpp checks the heads only with flash
    attention; without it, it takes such a K cache and scores against K rows that start inside a
    block (garbage, and not reproducible), which graphgen refuses instead. The same holds for a
    K-only cache (the DSpark backbones read V as a view of K): llama.cpp does not check its
    quantized K without flash attention, and then copies it transposed, block by block."""
    if type_v in _KV_BLOCK and not flash_attn:
        raise KVCacheTypeError(f"type_v {type_v}: a quantized V cache requires flash attention (flash_attn on)")
    if getattr(hp, "n_lora_kv", 0) > 0 and type_k != type_v:
        # llama.cpp's check for MLA models (Mistral Large 4 here): one latent cache, one type
        raise KVCacheTypeError(f"type_k {type_k} / type_v {type_v}: an MLA draft does not support different K "
                               "and V cache types")
    if k_only and type_k in _KV_BLOCK and not flash_attn:
        raise KVCacheTypeError(f"type_k {type_k}: this backbone reads V from the K cache, so a quantized K cache "
                         "requires flash attention (flash_attn on)")
    for key, name, head in (("type_k", type_k, hp.n_embd_head_k), ("type_v", type_v, hp.n_embd_head_v)):
        blck = _KV_BLOCK.get(name)
        if blck is not None and head % blck != 0:
            what = "n_embd_head_k" if key == "type_k" else "n_embd_head_v"
            raise KVCacheTypeError(f"{key} {name}: its block size {blck} does not divide {what}={head}")
