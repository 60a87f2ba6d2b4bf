"""The dump format `graphgen-dump/1`: one graph evaluation as JSON, its node values as npz.

A dump folder holds `NN-<graph>.json` (NN = evaluation index 00, 01, ...; graph is inject, block
or encoder) and, next to each, an optional `NN-<graph>.npz` with node values keyed `n<index>` in
numpy order (ne3, ne2, ne1, ne0). The graph's inputs (token ids, positions, masks: the leaves
the builder marks as inputs) may be listed too, under `inputs`, their values keyed `i<k>`; with
them every node can be re-run alone on the dump's own data (graphgen.compare.local). llama.cpp
(the reference) and graphgen both write it, and graph-diff compares two dumps node for node.

Reading is strict: a malformed field raises DumpError with a one-line message naming the file and
the field, because a silently misread dump would turn the diff into nonsense. Unknown keys are
ignored so that /1 can gain optional fields without breaking readers.

One format, one module: its writer, its reader and the validation of every field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

FORMAT = "graphgen-dump/1"
GRAPHS = ("inject", "block", "encoder")
ENGINES = ("llama.cpp", "graphgen", "torch")  # torch: the draft authors' own model (graphgen.authors)
MAX_NODES = 1_000_000
N_OP_PARAMS = 16
DUMP_NAME_RE = re.compile(r"^(\d{2,})-([A-Za-z0-9_]+)\.json$")

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class DumpError(Exception):
    """A dump that cannot be read or is malformed; the message is one line naming file and field."""


@dataclass
class Node:
    index: int
    name: str
    op: str
    type: str
    ne: list[int]
    src: list[str] = field(default_factory=list)
    view_src: str | None = None
    view_offs: int = 0
    op_params: list[int] = field(default_factory=lambda: [0] * N_OP_PARAMS)
    backend: str | None = None  # the ggml backend that computed the node, when recorded
    digest: str | None = None   # sha256 of the node's bytes, for every node the recorder could read
    stats: dict | None = None   # count, sum, sumsq, min, max, nan, inf of its values
    # the index of the node each src slot read, where the recorder saw it (None: a leaf, or a
    # scheduler's copy): names repeat (" (reshaped)"), indices do not
    src_at: list[int | None] | None = None
    nb: list[int] | None = None  # its strides in bytes, as the recorder saw them (a view's are not its shape's)
    src_input: list[int | None] | None = None  # per src slot, the index in the dump's `inputs` it read

    @property
    def nelements(self) -> int:
        return math.prod(self.ne)

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy shape of the node's values: ne reversed."""
        return tuple(reversed(self.ne))

    def to_dict(self) -> dict[str, Any]:
        d = {"index": self.index, "name": self.name, "op": self.op, "type": self.type,
                "ne": list(self.ne), "src": list(self.src), "view_src": self.view_src,
                "view_offs": self.view_offs, "op_params": list(self.op_params)}
        if self.backend is not None:
            d["backend"] = self.backend
        if self.digest is not None:
            d["digest"] = self.digest
            d["stats"] = dict(self.stats or {})
        if self.src_at is not None:
            d["src_at"] = list(self.src_at)
        if self.nb is not None:
            d["nb"] = list(self.nb)
        if self.src_input is not None:
            d["src_input"] = list(self.src_input)
        return d


@dataclass
class Input:
    """A graph input as a node first read it: a leaf, so no op, no sources."""
    name: str
    type: str
    ne: list[int]
    digest: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "type": self.type, "ne": list(self.ne)}
        if self.digest is not None:
            d["digest"] = self.digest
        return d


@dataclass
class Dump:
    path: Path
    format: str
    source: dict[str, Any]
    model: str
    graph: str
    settings: dict[str, Any]
    cpu_features: dict[str, bool]
    nodes: list[Node]
    values_path: Path | None = None
    model_sha256: str | None = None       # of the GGUF file; absent in dumps made before it was recorded
    scenario: dict[str, Any] | None = None  # digest (of its canonical JSON), name, path, seed
    # the whole scenario document that ran (the file's `scenario.doc`), which parse_scenario reads
    # back to rerun it; kept apart from `scenario` so reports that show `scenario` stay short
    scenario_doc: dict[str, Any] | None = None
    inputs: list[Input] = field(default_factory=list)  # absent from dumps made before they were recorded
    _npz: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def seq(self) -> int | None:
        """Evaluation index from the file name (`NN-<graph>.json`), None for other names."""
        m = DUMP_NAME_RE.match(self.path.name)
        return int(m.group(1)) if m else None

    @property
    def has_values(self) -> bool:
        return self.values_path is not None

    def values(self, index: int) -> np.ndarray | None:
        """Values of node `index` in numpy shape (ne3, ne2, ne1, ne0), or None if not stored."""
        node = self.nodes[index]
        return self._array(f"n{index}", node.nelements, node.shape,
                           f"node {index} ('{node.name}') has ne {node.ne}")

    def qrows(self, index: int) -> np.ndarray | None:
        """A quantized node's rows as raw bytes (uint8, ne3, ne2, ne1, row bytes), or None."""
        node = self.nodes[index]
        rows = self._stored(f"q{index}")
        if rows is None:
            return None
        if rows.ndim != 4 or list(rows.shape[:3]) != [node.ne[3], node.ne[2], node.ne[1]]:
            raise DumpError(f"{self.values_path}: array 'q{index}' is {list(rows.shape)}, not the rows of node "
                            f"{index} ('{node.name}') with ne {node.ne}")
        return rows

    def input_values(self, name: str | int) -> np.ndarray | None:
        """Values of a graph input (its index in `inputs`, or the first of that name) in numpy
        shape, or None when the dump does not keep them."""
        ks = [name] if isinstance(name, int) else [k for k, inp in enumerate(self.inputs) if inp.name == name][:1]
        for k in ks:
            if 0 <= k < len(self.inputs):
                inp = self.inputs[k]
                return self._array(f"i{k}", math.prod(inp.ne), inp.shape, f"input '{inp.name}' has ne {inp.ne}")
        return None

    def input_partner(self, other: Dump, k: int) -> int | None:
        """The index of this dump's input that is `other`'s input k: the same name, the same rank
        among inputs of that name (an iSWA draft has two masks of one name)."""
        name = other.inputs[k].name
        rank = sum(inp.name == name for inp in other.inputs[:k])
        mine = [j for j, inp in enumerate(self.inputs) if inp.name == name]
        return mine[rank] if rank < len(mine) else None

    def _stored(self, key: str) -> np.ndarray | None:
        """Array `key` of the sibling .npz as stored, or None when the dump keeps none."""
        if self.values_path is None:
            return None
        try:
            if self._npz is None:
                self._npz = np.load(self.values_path, allow_pickle=False)
            if key not in self._npz.files:
                return None
            return self._npz[key]
        except (OSError, ValueError, zipfile.BadZipFile, zlib.error, EOFError) as e:
            raise DumpError(f"{self.values_path}: cannot read array '{key}': {_one_line(e)}") from None

    def _array(self, key: str, size: int, shape, mismatch: str) -> np.ndarray | None:
        arr = self._stored(key)
        if arr is None:
            return None
        if arr.size != size:
            raise DumpError(f"{self.values_path}: array '{key}' has {arr.size} elements but {mismatch}")
        return arr.reshape(shape)

    def close(self) -> None:
        if self._npz is not None:
            self._npz.close()
            self._npz = None

    def __enter__(self) -> Dump:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- validation -------------------------------------------------------------------------------

def _one_line(e: object) -> str:
    return " ".join(str(e).split())


def _short(v: Any, limit: int = 60) -> str:
    try:
        s = json.dumps(v)
    except (TypeError, ValueError):
        s = repr(v)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true must not pass as 1


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_dict(v: Any) -> bool:
    return isinstance(v, dict)


def _is_list(v: Any) -> bool:
    return isinstance(v, list)


def _is_int_or_null(v: Any) -> bool:
    return v is None or _is_int(v)


def _is_str_or_null(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _fail(path: Path, fld: str, msg: str) -> DumpError:
    return DumpError(f"{path}: field '{fld}': {msg}")


def _get(obj: dict, key: str, path: Path, prefix: str, ok: Callable[[Any], bool], what: str) -> Any:
    if key not in obj:
        raise DumpError(f"{path}: missing field '{prefix}{key}'")
    v = obj[key]
    if not ok(v):
        raise _fail(path, prefix + key, f"expected {what}, got {_short(v)}")
    return v


_SETTINGS = (("flash_attn", _is_bool, "true/false"), ("type_k", _is_str, "a string"),
             ("type_v", _is_str, "a string"), ("n_ctx", _is_int, "an int"),
             ("n_ubatch", _is_int, "an int"), ("n_kv", _is_int_or_null, "an int or null"),
             ("causal", _is_bool, "true/false"))


def _parse_node(raw: Any, pos: int, path: Path) -> Node:
    fld = f"nodes[{pos}]"
    if not isinstance(raw, dict):
        raise _fail(path, fld, f"expected an object, got {_short(raw)}")
    index = _get(raw, "index", path, fld + ".", _is_int, "an int")
    if index != pos:
        why = f"duplicate index {index}" if index < pos else f"index {index} skips ahead"
        raise _fail(path, fld + ".index", f"{why}; indices must run 0, 1, 2, ... (expected {pos})")
    name = _get(raw, "name", path, fld + ".", _is_str, "a string")
    fld = f"nodes[{pos}] ('{name}')"  # from here on the node name helps find it
    op = _get(raw, "op", path, fld + ".", _is_nonempty_str, "an op name")
    typ = _get(raw, "type", path, fld + ".", _is_nonempty_str, "a type name")
    ne = _get(raw, "ne", path, fld + ".", _is_list, "a list of 4 ints")
    if len(ne) != 4 or not all(_is_int(x) and x >= 0 for x in ne):
        raise _fail(path, fld + ".ne", f"expected 4 non-negative ints, got {_short(ne)}")
    src = _get(raw, "src", path, fld + ".", _is_list, "a list of source names")
    if not all(isinstance(s, str) for s in src):
        raise _fail(path, fld + ".src",
                    f"expected a list of strings (\"\" for an empty slot), got {_short(src)}")
    view_src = _get(raw, "view_src", path, fld + ".", _is_str_or_null, "a string or null")
    view_offs = _get(raw, "view_offs", path, fld + ".", _is_int, "an int")
    if view_offs < 0:
        raise _fail(path, fld + ".view_offs", f"expected a non-negative int, got {view_offs}")
    op_params = _get(raw, "op_params", path, fld + ".", _is_list, f"a list of {N_OP_PARAMS} ints")
    if len(op_params) != N_OP_PARAMS or not all(_is_int(x) and _INT32_MIN <= x <= _INT32_MAX
                                                 for x in op_params):
        raise _fail(path, fld + ".op_params", f"expected {N_OP_PARAMS} int32 values, got {_short(op_params)}")
    backend = raw.get("backend")
    if backend is not None and not isinstance(backend, str):
        raise _fail(path, fld + ".backend", f"expected a string or null, got {_short(backend)}")
    digest = raw.get("digest")
    if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                   and all(c in "0123456789abcdef" for c in digest)):
        raise _fail(path, fld + ".digest", f"expected a sha256 in hex, got {_short(digest)}")
    stats = raw.get("stats")
    if stats is not None and not isinstance(stats, dict):
        raise _fail(path, fld + ".stats", f"expected an object, got {_short(stats)}")
    src_at = raw.get("src_at")
    if src_at is not None and not (isinstance(src_at, list) and len(src_at) == len(src) and
                                   all(k is None or (_is_int(k) and 0 <= k < pos) for k in src_at)):
        raise _fail(path, fld + ".src_at", f"expected one earlier node index (or null) per source, got {_short(src_at)}")
    nb = raw.get("nb")
    if nb is not None and not (isinstance(nb, list) and len(nb) == 4 and all(_is_int(x) and x >= 0 for x in nb)):
        raise _fail(path, fld + ".nb", f"expected 4 non-negative ints, got {_short(nb)}")
    src_input = raw.get("src_input")
    if src_input is not None and not (isinstance(src_input, list) and len(src_input) == len(src) and
                                      all(k is None or (_is_int(k) and k >= 0) for k in src_input)):
        raise _fail(path, fld + ".src_input", f"expected one input index (or null) per source, got {_short(src_input)}")
    return Node(index, name, op, typ, list(ne), list(src), view_src, view_offs, list(op_params), backend,
                digest, dict(stats) if stats is not None else None, None if src_at is None else list(src_at),
                None if nb is None else list(nb), None if src_input is None else list(src_input))


def _parse_doc(doc: Any, path: Path) -> dict[str, Any]:
    """Validate a decoded dump document; returns the keyword arguments of Dump (less path)."""
    if not isinstance(doc, dict):
        raise DumpError(f"{path}: expected a JSON object at top level, got {type(doc).__name__}")
    if "format" not in doc:
        raise DumpError(f"{path}: missing field 'format' (not a {FORMAT} file?)")
    if doc["format"] != FORMAT:
        raise _fail(path, "format", f"expected \"{FORMAT}\", got {_short(doc['format'])}")
    source = _get(doc, "source", path, "", _is_dict, "an object")
    engine = _get(source, "engine", path, "source.", _is_str, "a string")
    if engine not in ENGINES:
        raise _fail(path, "source.engine", f"expected one of {', '.join(ENGINES)}, got {_short(engine)}")
    _get(source, "version", path, "source.", _is_str, "a string")
    model = _get(doc, "model", path, "", _is_str, "a string")
    graph = _get(doc, "graph", path, "", _is_str, "a string")
    if graph not in GRAPHS:
        raise _fail(path, "graph", f"expected one of {', '.join(GRAPHS)}, got {_short(graph)}")
    settings = _get(doc, "settings", path, "", _is_dict, "an object")
    for key, ok, what in _SETTINGS:
        _get(settings, key, path, "settings.", ok, what)
    cpu = _get(doc, "cpu_features", path, "", _is_dict, "an object")
    for key, v in cpu.items():
        if not _is_bool(v):
            raise _fail(path, f"cpu_features.{key}", f"expected true/false, got {_short(v)}")
    raw_nodes = _get(doc, "nodes", path, "", _is_list, "a list")
    if len(raw_nodes) > MAX_NODES:
        raise _fail(path, "nodes", f"{len(raw_nodes)} nodes is more than the limit of {MAX_NODES}")
    nodes = [_parse_node(raw, pos, path) for pos, raw in enumerate(raw_nodes)]
    model_sha256 = doc.get("model_sha256")
    if model_sha256 is not None and not _is_sha256(model_sha256):
        raise _fail(path, "model_sha256", f"expected a sha256 in hex, got {_short(model_sha256)}")
    scenario = doc.get("scenario")
    if scenario is not None:
        if not isinstance(scenario, dict):
            raise _fail(path, "scenario", f"expected an object, got {_short(scenario)}")
        if "digest" in scenario and not _is_sha256(scenario["digest"]):
            raise _fail(path, "scenario.digest", f"expected a sha256 in hex, got {_short(scenario['digest'])}")
        for key in ("name", "path"):
            if key in scenario and not _is_str(scenario[key]):
                raise _fail(path, f"scenario.{key}", f"expected a string, got {_short(scenario[key])}")
        if "seed" in scenario and not _is_int_or_null(scenario["seed"]):
            raise _fail(path, "scenario.seed", f"expected an int, got {_short(scenario['seed'])}")
        # its fields are checked where it is rerun (parse_scenario), so a reader of an older
        # graphgen still reads the rest of a dump whose scenario has fields it does not know
        if "doc" in scenario and not _is_dict(scenario["doc"]):
            raise _fail(path, "scenario.doc", f"expected an object, got {_short(scenario['doc'])}")
    scenario = dict(scenario) if scenario is not None else None
    scenario_doc = scenario.pop("doc", None) if scenario is not None else None
    inputs = _parse_inputs(doc.get("inputs", []), path)
    for n in nodes:
        bad = [k for k in n.src_input or [] if k is not None and k >= len(inputs)]
        if bad:
            raise _fail(path, f"nodes[{n.index}] ('{n.name}').src_input",
                        f"input {bad[0]} does not exist ({len(inputs)} inputs)")
    return {"format": FORMAT, "source": dict(source), "model": model, "graph": graph,
            "settings": dict(settings), "cpu_features": dict(cpu), "nodes": nodes,
            "model_sha256": model_sha256, "scenario": scenario, "scenario_doc": scenario_doc,
            "inputs": inputs}


def _parse_inputs(raw: Any, path: Path) -> list[Input]:
    if not _is_list(raw):
        raise _fail(path, "inputs", f"expected a list, got {_short(raw)}")
    out = []
    for pos, item in enumerate(raw):
        fld = f"inputs[{pos}]"
        if not _is_dict(item):
            raise _fail(path, fld, f"expected an object, got {_short(item)}")
        name = _get(item, "name", path, fld + ".", _is_nonempty_str, "a name")  # names may repeat
        typ = _get(item, "type", path, fld + ".", _is_nonempty_str, "a type name")
        ne = _get(item, "ne", path, fld + ".", _is_list, "a list of 4 ints")
        if len(ne) != 4 or not all(_is_int(x) and x >= 0 for x in ne):
            raise _fail(path, fld + ".ne", f"expected 4 non-negative ints, got {_short(ne)}")
        digest = item.get("digest")
        if digest is not None and not _is_sha256(digest):
            raise _fail(path, fld + ".digest", f"expected a sha256 in hex, got {_short(digest)}")
        out.append(Input(name, typ, list(ne), digest))
    return out


def _is_sha256(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


# ---- reading ----------------------------------------------------------------------------------

def load_dump(path: str | os.PathLike) -> Dump:
    """Read and validate one dump JSON; values are loaded lazily from the sibling .npz."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DumpError(f"{path}: no such file") from None
    except OSError as e:
        raise DumpError(f"{path}: cannot read: {e.strerror or _one_line(e)}") from None
    except UnicodeDecodeError:
        raise DumpError(f"{path}: not UTF-8 text (not a {FORMAT} file?)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DumpError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise DumpError(f"{path}: invalid JSON: nested too deeply") from None
    fields = _parse_doc(doc, path)
    m = DUMP_NAME_RE.match(path.name)
    if m and m.group(2) != fields["graph"]:
        raise _fail(path, "graph", f"is \"{fields['graph']}\" but the file name says \"{m.group(2)}\"")
    npz = path.with_suffix(".npz")
    return Dump(path=path, values_path=npz if npz.is_file() else None, **fields)


def dump_files(directory: str | os.PathLike) -> list[Path]:
    """The `NN-<graph>.json` files of a dump folder, in evaluation order."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DumpError(f"{directory}: no such folder")
    found: dict[int, Path] = {}
    for p in directory.iterdir():
        m = DUMP_NAME_RE.match(p.name)
        if not m or not p.is_file():
            continue
        seq = int(m.group(1))
        if seq in found:
            raise DumpError(f"{directory}: two dumps with evaluation index {seq}: "
                            f"{found[seq].name} and {p.name}")
        found[seq] = p
    if not found:
        raise DumpError(f"{directory}: no dump files (expected NN-<graph>.json)")
    return [found[k] for k in sorted(found)]


def load_dump_dir(directory: str | os.PathLike) -> list[Dump]:
    """All dumps of a folder, sorted by evaluation index NN."""
    return [load_dump(p) for p in dump_files(directory)]


# ---- writing ----------------------------------------------------------------------------------

_HEADER_KEYS = ("source", "model", "model_sha256", "scenario", "settings", "cpu_features")


def _encode(doc: dict[str, Any]) -> str:
    # One header field and one node per line: stable, compact, and friendly to text diffs.
    lines = ["{"]
    for key in ("format", "source", "model", "model_sha256", "scenario", "graph", "settings", "cpu_features"):
        if key in doc:
            lines.append(f" {json.dumps(key)}: {json.dumps(doc[key], sort_keys=True)},")
    if doc.get("inputs"):
        lines.append(' "inputs": [')
        lines.append(",\n".join("  " + json.dumps(i) for i in doc["inputs"]))
        lines.append(" ],")
    lines.append(' "nodes": [')
    lines.append(",\n".join("  " + json.dumps(n) for n in doc["nodes"]))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(line for line in lines if line) + "\n"


def _replace_atomically(path: Path, write: Callable[[Any], None]) -> None:
    # A reader (or a crashed writer) must never see half a file.
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_npz(f: Any, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed's layout, written so that an interrupt leaves no archive behind: numpy's
    own writer, stopped inside its zip's close, left a ZipFile whose finalizer later wrote to the
    file this module had already closed (an "Exception ignored" traceback after Ctrl-C)."""
    z = zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True)
    try:
        for name, a in arrays.items():
            with z.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(a), allow_pickle=False)
        z.close()
    except BaseException:
        z.fp = None  # the half-written file is thrown away: nothing may write to it any more
        raise


def check_dump_dir(directory: str | os.PathLike) -> list[Path]:
    """The earlier graphgen dumps in `directory` (a new run's would replace them); a file that
    would be overwritten but is not a graphgen dump is refused. Changes nothing."""
    out = Path(directory)
    stale = []
    for path in sorted(out.iterdir()) if out.is_dir() else []:
        if not DUMP_NAME_RE.match(path.name):
            continue
        try:
            tag = json.loads(path.read_text()).get("format")
        except (OSError, ValueError, AttributeError):
            tag = None
        if tag != FORMAT:
            raise DumpError(f"{out}: {path.name} is not a graphgen dump; it would be overwritten, so "
                            "write the dumps to another folder")
        stale.append(path)
    return stale


def prepare_dump_dir(directory: str | os.PathLike) -> Path:
    """Make `directory` ready for a new run's dumps: earlier graphgen dumps in it are removed (a
    stale 05-block.json would otherwise pair with the new run's), anything else is left alone,
    and a file that would be overwritten but is not a graphgen dump is refused."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for path in check_dump_dir(out):
        path.unlink()
        path.with_suffix(".npz").unlink(missing_ok=True)
    return out


def write_dump(directory: str | os.PathLike, seq: int, graph: str, header: dict[str, Any],
               nodes: list[Node], values: dict[int, np.ndarray] | None = None,
               max_data: int | None = None, inputs: list[tuple[Input, np.ndarray]] = (),
               qrows: dict[int, np.ndarray] | None = None) -> Path:
    """Write `NN-<graph>.json` (and `.npz` when there are values) into `directory`.

    `header` holds source, model, settings and cpu_features, and optionally model_sha256 and
    scenario (see `provenance`); `inputs` the graph's inputs with their values, as the recorder
    read them; `qrows` quantized nodes' rows as raw bytes (uint8, ne3, ne2, ne1, row bytes). Values are stored for nodes with
    at most `max_data` elements (all when None), as float32 unless given as integers. The
    document is validated with the reader's rules first, so what is written can be read back.
    """
    directory = Path(directory)
    if not _is_int(seq) or seq < 0:
        raise DumpError(f"{directory}: evaluation index must be a non-negative int, got {_short(seq)}")
    json_path = directory / f"{seq:02d}-{graph}.json"
    if header.get("format", FORMAT) != FORMAT:
        raise _fail(json_path, "format", f"expected \"{FORMAT}\", got {_short(header['format'])}")
    doc: dict[str, Any] = {"format": FORMAT, "graph": graph}
    doc.update({k: header[k] for k in _HEADER_KEYS
                if k in header and not (header[k] is None and k in ("model_sha256", "scenario"))})
    doc["nodes"] = [n.to_dict() for n in nodes]
    if inputs:
        doc["inputs"] = [inp.to_dict() for inp, _ in inputs]
    parsed = _parse_doc(doc, json_path)

    arrays: dict[str, np.ndarray] = {}
    for index, arr in sorted((values or {}).items()):
        if not _is_int(index) or not 0 <= index < len(parsed["nodes"]):
            raise DumpError(f"{json_path}: values for node {_short(index)}, which does not exist")
        node = parsed["nodes"][index]
        arr = np.asarray(arr)
        if arr.size != node.nelements:
            raise DumpError(f"{json_path}: values for node {index} ('{node.name}') have {arr.size} "
                            f"elements, ne {node.ne} needs {node.nelements}")
        if max_data is not None and arr.size > max_data:
            continue
        if arr.dtype.kind not in "iu":
            arr = arr.astype(np.float32, copy=False)
        arrays[f"n{index}"] = arr.reshape(node.shape)
    for index, rows in sorted((qrows or {}).items()):
        node = parsed["nodes"][index]
        rows = np.asarray(rows)
        if rows.dtype != np.uint8 or rows.ndim != 4 or list(rows.shape[:3]) != [node.ne[3], node.ne[2], node.ne[1]]:
            raise DumpError(f"{json_path}: quantized rows of node {index} ('{node.name}') are {rows.dtype} "
                            f"{list(rows.shape)}, not uint8 [ne3, ne2, ne1, row bytes] of ne {node.ne}")
        arrays[f"q{index}"] = rows
    for k, (inp, arr) in enumerate(inputs):
        arr = np.asarray(arr)
        if arr.size != math.prod(inp.ne):
            raise DumpError(f"{json_path}: values of input '{inp.name}' have {arr.size} elements, ne "
                            f"{inp.ne} needs {math.prod(inp.ne)}")
        arrays[f"i{k}"] = arr.reshape(inp.shape)

    directory.mkdir(parents=True, exist_ok=True)
    npz_path = json_path.with_suffix(".npz")
    if arrays:
        _replace_atomically(npz_path, lambda f: _write_npz(f, arrays))
    else:
        npz_path.unlink(missing_ok=True)  # a stale npz would pair old values with new nodes
    # The JSON goes last: its presence marks a complete dump.
    _replace_atomically(json_path, lambda f: f.write(_encode(doc).encode("utf-8")))
    return json_path


# ---- provenance: which model and scenario a dump ran ------------------------------------------

_sha_lock = threading.Lock()
_sha_memo: dict[tuple[str, int, int], str] = {}


def _cache_file() -> Path:
    from ..cache import root
    return root() / "model-sha256.json"


def model_sha256(path: str | os.PathLike) -> str:
    """sha256 of a model file, hashed once per (path, mtime, size): in this process and, through a
    small file in graphgen's cache folder, across processes (a dump and its reference each need it,
    and a published-size draft takes seconds to hash)."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_mtime_ns, st.st_size)
    with _sha_lock:
        if key in _sha_memo:
            return _sha_memo[key]
        cache_path = _cache_file()
        try:
            cache = json.loads(cache_path.read_text())
            hit = cache.get(key[0]) if isinstance(cache, dict) else None
        except (OSError, ValueError):
            cache, hit = {}, None
        if isinstance(hit, dict) and hit.get("mtime_ns") == key[1] and hit.get("size") == key[2] \
                and _is_sha256(hit.get("sha256")):
            _sha_memo[key] = hit["sha256"]
            return hit["sha256"]
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        digest = h.hexdigest()
        _sha_memo[key] = digest
        cache = cache if isinstance(cache, dict) else {}
        cache[key[0]] = {"mtime_ns": key[1], "size": key[2], "sha256": digest}
        try:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            # a temporary name of its own: two processes (a dump and its reference) may write at once
            tmp = cache_path.with_name(f"{cache_path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=0))
            os.replace(tmp, cache_path)
        except OSError:
            pass  # a read-only cache costs a re-hash next time, nothing else
        return digest


def scenario_digest(doc: dict[str, Any]) -> str:
    """sha256 of a scenario's canonical JSON (sorted keys, no spaces): files that differ only in
    layout or key order share it."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def provenance(model_path: str | os.PathLike | None = None, scenario: Any = None,
               scenario_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The header fields that say what ran: `model_sha256`, and `scenario` with the digest of
    `scenario.to_dict()` (defaults filled in, so an omitted default and a spelled-out one agree),
    its file's name and path, its seed, and `doc`, that document itself (what `--scenario-from`
    reruns)."""
    out: dict[str, Any] = {}
    if model_path is not None:
        out["model_sha256"] = model_sha256(model_path)
    if scenario is not None:
        doc = scenario.to_dict()
        info: dict[str, Any] = {"digest": scenario_digest(doc), "doc": doc}
        if scenario_path is not None:
            info["name"] = Path(scenario_path).name
            info["path"] = str(Path(scenario_path).resolve())
        seed = getattr(scenario, "seed", None)
        if seed is not None:
            info["seed"] = seed
        out["scenario"] = info
    return out


def recorded_scenario(path: str | os.PathLike) -> tuple[dict[str, Any], Path]:
    """The scenario document a dump recorded, and the dump file it came from: `path` is a dump
    folder (its first graph's file) or one dump file. A dump that records none (made before dumps
    recorded their scenario, or imported from llama.cpp's logs) is refused, as is one whose
    document no longer matches its digest (edited: it would not rerun what ran)."""
    p = Path(path)
    file = dump_files(p)[0] if p.is_dir() else p
    try:
        head = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DumpError(f"{file}: no such file") from None
    except (OSError, ValueError) as e:
        raise DumpError(f"{file}: not a {FORMAT} dump ({_one_line(e)}), so it records no scenario") from None
    if not isinstance(head, dict) or "format" not in head:
        raise DumpError(f"{file}: not a {FORMAT} dump, so it records no scenario")
    d = load_dump(file)
    if d.scenario_doc is None:
        how = "it was imported" if "import" in d.source else "it was made before dumps recorded it"
        raise DumpError(f"{file}: records no scenario ({how}); give the scenario with --scenario FILE")
    digest = (d.scenario or {}).get("digest")
    if digest is not None and digest != scenario_digest(d.scenario_doc):
        raise _fail(file, "scenario.doc", "does not match scenario.digest (edited since it ran?)")
    return d.scenario_doc, file
