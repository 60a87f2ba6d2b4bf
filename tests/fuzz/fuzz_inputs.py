"""Fuzz inputs: base drafts, a GGUF layout parser for byte-level edits, and the functions that
turn a case (a small JSON dict) back into files, so every case replays from its JSON alone."""

from __future__ import annotations

import json
import shutil
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
REF_DUMPS = ROOT / "tests" / "data" / "reference"

# name -> make_model arguments; the fuzz draws edits against each of these
BASES = {
    "dflash": ("dflash", "base", {}),
    "dflash-iswa": ("dflash", "base", {"n_layer": 3, "swa_window": 4, "swa_pattern": [True, False, True]}),
    "dflash2": ("dflash2", "base", {}),
    "dspark": ("dspark", "base", {"conf": True}),
    "lilicorr": ("lilicorr", "base", {}),
    "dspark-dsv4": ("dspark", "dsv4", {}),
    "dspark-ml4": ("dspark", "mistral-large4", {}),
}


def base_model(name: str, cache: Path, seed: int = 0) -> Path:
    from graphgen.synth import make_model
    cache.mkdir(parents=True, exist_ok=True)
    p = cache / f"{name}-s{seed}.gguf"
    if not p.exists():
        variant, backbone, kw = BASES[name]
        # a per-process name: two workers may build the same base at once
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        make_model(tmp, variant, backbone, seed=seed, **kw)
        tmp.replace(p)
    return p


# ---- GGUF layout (v3): where every field sits, for byte-level edits --------------------------

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass
class KV:
    key: str
    type_pos: int     # the value type tag (u32)
    value_pos: int    # the value itself
    value_len: int
    vtype: int


@dataclass
class TInfo:
    name: str
    name_pos: int
    ndims_pos: int
    dims_pos: int
    ndims: int
    type_pos: int
    offset_pos: int


def layout(data: bytes) -> tuple[list[KV], list[TInfo], int]:
    """(kvs, tensor infos, end of the tensor info) of a well-formed GGUF v3."""
    pos = 4 + 4
    n_t, n_kv = struct.unpack_from("<QQ", data, pos)
    pos += 16

    def string(p):
        n, = struct.unpack_from("<Q", data, p)
        return data[p + 8:p + 8 + n].decode(), p + 8 + n

    def value(p, t):
        if t == 8:
            _, q = string(p)
            return q
        if t == 9:
            sub, n = struct.unpack_from("<IQ", data, p)
            q = p + 12
            if n > len(data):  # an earlier edit made the count absurd: the layout ends here
                raise ValueError(f"array of {n} elements in a {len(data)}-byte file")
            for _ in range(n):
                q = value(q, sub)
            return q
        return p + struct.calcsize("<" + _SCALAR[t])

    kvs = []
    for _ in range(n_kv):
        key, pos = string(pos)
        t, = struct.unpack_from("<I", data, pos)
        end = value(pos + 4, t)
        kvs.append(KV(key, pos, pos + 4, end - pos - 4, t))
        pos = end
    infos = []
    for _ in range(n_t):
        name_pos = pos
        name, pos = string(pos)
        nd, = struct.unpack_from("<I", data, pos)
        infos.append(TInfo(name, name_pos, pos, pos + 4, nd, pos + 4 + 8 * nd, pos + 8 + 8 * nd))
        pos += 4 + 8 * nd + 4 + 8
    return kvs, infos, pos


# ---- materializing cases ----------------------------------------------------------------------

def apply_bytes(data: bytes, muts: list) -> bytes:
    """Byte-level edits: [op, ...] with op truncate/flip/set/poke64/poke32/delete/insert/dup."""
    b = bytearray(data)
    for m in muts:
        op = m[0]
        if op == "truncate":
            del b[min(m[1], len(b)):]
        elif op == "flip" and m[1] < len(b):
            b[m[1]] ^= 1 << m[2]
        elif op == "set" and m[1] < len(b):
            v = bytes.fromhex(m[2])
            b[m[1]:m[1] + len(v)] = v
        elif op == "poke64" and m[1] + 8 <= len(b):
            b[m[1]:m[1] + 8] = struct.pack("<Q", m[2] % (1 << 64))
        elif op == "poke32" and m[1] + 4 <= len(b):
            b[m[1]:m[1] + 4] = struct.pack("<I", m[2] % (1 << 32))
        elif op == "delete":
            del b[m[1]:m[1] + m[2]]
        elif op == "insert":
            b[m[1]:m[1]] = bytes.fromhex(m[2])
        elif op == "dup" and m[1] < len(b):
            chunk = b[m[1]:m[1] + m[2]]
            b[m[1]:m[1]] = chunk
    return bytes(b)


def _field_value(f):
    import gguf
    vtype = gguf.GGUFValueType(int(f.types[0]))
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = gguf.GGUFValueType(int(f.types[1]))
        vals = [bytes(f.parts[i]).decode() if sub == gguf.GGUFValueType.STRING else f.parts[i][0].item()
                for i in f.data]
        return vtype, vals, sub
    if vtype == gguf.GGUFValueType.STRING:
        return vtype, bytes(f.parts[f.data[0]]).decode(), None
    return vtype, f.parts[f.data[0]][0].item(), None


def rewrite(src: Path, dst: Path, edits: dict) -> Path:
    """Structured edits with gguf-py: drop/set keys (with any value type), drop/reshape/retype tensors."""
    import gguf
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "dflash")
    drop, setk = set(edits.get("drop_keys", ())), edits.get("set_keys", {})
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop or name in setk:
            continue
        vtype, val, sub = _field_value(f)
        w.add_key_value(name, val, vtype, sub_type=sub)
    for name, (tname, val, subname) in setk.items():
        vtype = gguf.GGUFValueType[tname]
        sub = gguf.GGUFValueType[subname] if subname else None
        if name == "general.architecture":
            continue
        w.add_key_value(name, val, vtype, sub_type=sub)
    reshape, retype = edits.get("reshape", {}), edits.get("retype", {})
    for t in r.tensors:
        if t.name in edits.get("drop_tensors", ()):
            continue
        data = np.array(t.data)
        if t.name in reshape:
            shape = [max(1, int(x)) for x in reshape[t.name]]
            data = np.zeros(shape[::-1], dtype=data.dtype)
        if t.name in retype:
            data = data.astype(retype[t.name])
        w.add_tensor(t.name, data)
    have = {t.name for t in r.tensors} - set(edits.get("drop_tensors", ()))
    for name, shape in edits.get("add_tensors", {}).items():
        if name in have:  # gguf-py refuses duplicates; duplicates come from the raw 'dupname' edit
            continue
        w.add_tensor(name, np.zeros([max(1, int(x)) for x in shape][::-1], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def tinfo_edit(data: bytes, edit: list) -> bytes:
    """Tensor-info edits by tensor index: offset/dim/ndims/type/name."""
    kvs, infos, end = layout(data)
    b = bytearray(data)
    op, k = edit[0], edit[1] % len(infos)
    ti = infos[k]
    if op == "offset":
        b[ti.offset_pos:ti.offset_pos + 8] = struct.pack("<Q", edit[2] % (1 << 64))
    elif op == "dim":
        d = edit[2] % ti.ndims
        b[ti.dims_pos + 8 * d:ti.dims_pos + 8 * d + 8] = struct.pack("<Q", edit[3] % (1 << 64))
    elif op == "ndims":
        b[ti.ndims_pos:ti.ndims_pos + 4] = struct.pack("<I", edit[2] % (1 << 32))
    elif op == "type":
        b[ti.type_pos:ti.type_pos + 4] = struct.pack("<I", edit[2] % (1 << 32))
    elif op == "dupname":
        # rename tensor k to the name of another tensor of the same name length: a duplicate
        other = [t for t in infos if t.name != ti.name and len(t.name) == len(ti.name)]
        if other:
            o = other[edit[2] % len(other)]
            b[ti.name_pos + 8:ti.name_pos + 8 + len(ti.name)] = o.name.encode()
    return bytes(b)


def kv_edit(data: bytes, edit: list) -> bytes:
    """Metadata edits by key name: change the type tag, or poke the value bytes."""
    kvs, _, _ = layout(data)
    by = {kv.key: kv for kv in kvs}
    kv = by.get(edit[1])
    if kv is None:
        return data
    b = bytearray(data)
    if edit[0] == "kvtype":
        b[kv.type_pos:kv.type_pos + 4] = struct.pack("<I", edit[2] % (1 << 32))
    elif edit[0] == "kvpoke":
        n = min(kv.value_len, 8)
        raw = struct.pack("<Q", edit[2] % (1 << 64))[:n]
        b[kv.value_pos:kv.value_pos + n] = raw
    return bytes(b)


def make_gguf(case: dict, out_dir: Path, cache: Path) -> Path:
    """The GGUF a gguf-family case describes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = base_model(case["base"], cache, case.get("seed", 0))
    dst = out_dir / "model.gguf"
    if case.get("edits"):
        rewrite(base, dst, case["edits"])
    else:
        shutil.copyfile(base, dst)
    data = dst.read_bytes()
    for e in case.get("raw", []):
        # an earlier edit may have broken the layout the next one needs: then it is skipped
        try:
            data = _raw_edit(data, e)
        except (struct.error, UnicodeDecodeError, IndexError, KeyError, ZeroDivisionError, ValueError):
            pass
    data = apply_bytes(data, case.get("bytes", []))
    dst.write_bytes(data)
    return dst


def _raw_edit(data: bytes, e: list) -> bytes:
    if e[0] in ("offset", "dim", "ndims", "type", "dupname"):
        return tinfo_edit(data, e)
    return kv_edit(data, e)


# ---- dumps ------------------------------------------------------------------------------------

def _set_path(doc, path, value, delete=False):
    cur = doc
    for p in path[:-1]:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and isinstance(p, int) and cur:
            cur = cur[p % len(cur)]
        else:
            return
    last = path[-1]
    if isinstance(cur, dict):
        if delete:
            cur.pop(last, None)
        else:
            cur[last] = value
    elif isinstance(cur, list) and isinstance(last, int) and cur:
        if delete:
            cur.pop(last % len(cur))
        else:
            cur[last % len(cur)] = value


def make_dump_case(case: dict, out_dir: Path) -> dict:
    """Write a dumps-family case: two dump folders (ref, ours) and a rules file."""
    src = REF_DUMPS / case["ref_case"]
    paths = {}
    for side in ("ref", "ours"):
        d = out_dir / side
        d.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.glob("[0-9][0-9]-*.json")):
            shutil.copyfile(f, d / f.name)
            npz = f.with_suffix(".npz")
            if npz.exists() and case.get("values", True):
                shutil.copyfile(npz, d / npz.name)
        paths[side] = d
    target = sorted(paths["ours"].glob("*.json"))[case.get("file", 0) % 2 if len(list(paths["ours"].glob("*.json"))) > 1 else 0]
    doc = json.loads(target.read_text())
    for e in case.get("doc_edits", []):
        if not isinstance(doc, dict):  # an earlier edit replaced the whole document
            break
        op = e[0]
        if op == "set":
            _set_path(doc, e[1], e[2])
        elif op == "del":
            _set_path(doc, e[1], None, delete=True)
        elif op == "cycle" and isinstance(doc.get("nodes"), list) and doc["nodes"]:
            # node a takes node b (later or itself) as a source: a cycle in the source graph
            n = len(doc["nodes"])
            a, b = e[1] % n, e[2] % n
            na, nb = doc["nodes"][a], doc["nodes"][b]
            # an earlier edit may have broken these nodes already: nothing to link then
            if not (isinstance(na, dict) and isinstance(nb, dict) and isinstance(na.get("src", []), list)
                    and isinstance(nb.get("src", []), list) and "name" in na and "name" in nb):
                continue
            doc["nodes"][a]["src"] = [doc["nodes"][b]["name"]] + doc["nodes"][a].get("src", [])[1:]
            doc["nodes"][b]["src"] = [doc["nodes"][a]["name"]] + doc["nodes"][b].get("src", [])[1:]
        elif op == "grow" and isinstance(doc.get("nodes"), list) and doc["nodes"]:
            # many nodes: repeat the graph up to e[1] nodes, with indices renumbered
            base = doc["nodes"]
            nodes = []
            while len(nodes) < e[1]:
                for nd in base:
                    nd = dict(nd, index=len(nodes)) if isinstance(nd, dict) else nd
                    nodes.append(nd)
                    if len(nodes) >= e[1]:
                        break
            doc["nodes"] = nodes
        elif op == "ne" and isinstance(doc.get("nodes"), list) and doc["nodes"]:
            nd = doc["nodes"][e[1] % len(doc["nodes"])]
            if isinstance(nd, dict):
                nd["ne"] = list(e[2])
    text = json.dumps(doc).encode()
    text = apply_bytes(text, case.get("text_bytes", []))
    target.write_bytes(text)
    npz = target.with_suffix(".npz")
    if npz.exists() and case.get("npz_bytes"):
        npz.write_bytes(apply_bytes(npz.read_bytes(), case["npz_bytes"]))
    rules = None
    if case.get("rules") is not None:
        rules = out_dir / "rules.json"
        r = case["rules"]
        rules.write_bytes(r.encode() if isinstance(r, str) else json.dumps(r).encode())
    return {"ref": paths["ref"], "ours": paths["ours"], "target": target, "rules": rules}
