"""Each node's own error: a node of one dump re-run alone on the other dump's recorded inputs.

Where two runs legitimately differ a little (two backends, ggml against the authors' PyTorch, a
q8_0 draft against its f32 source), every node after the first imprecise one inherits its error,
and a node's total error cannot tell a kernel that is wrong from one that is fed wrong inputs.
Re-running the node of `ours` on the values `ref` recorded for its sources, on the backend that
computed it, and comparing with `ref`'s output leaves only what the node itself adds: its local
error (the FX Numeric Suite's shadow comparison, for ggml graphs).

A node's sources come from `ref`'s values of the nodes they are paired with, its inputs (token
ids, positions, masks) from the inputs a dump records, its weights from `ours`'s GGUF. The node is
rebuilt from what the dump says of it (op, type, ne, op_params) with contiguous sources: ggml's
kernels read sources through their strides, so a permuted view fed as contiguous values computes
the same elements. In the same graph the node also runs on `ours`'s own recorded sources; that
replay must give `ours`'s own output bit for bit, or the re-run does not reproduce the node and
its local figure is flagged. A node that cannot be re-run alone says why.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..dump.format import Dump, Node
from ..errors import GraphgenError
from .values import ORDER_FREE, compare_values

# ops that compute nothing: their output is their source's bytes, so their own error is nil
VIEW_OPS = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"}
# the source a kernel writes into rather than reads (its result is a view of it): only its layout,
# which is the node's own, matters; the output starts from the recorded output, so elements the
# kernel leaves alone (a cache's other rows) agree by construction
WRITE_TARGET = {"SET_ROWS": 2, "CPY": 1, "FILL": 0}
# ops whose parameters hold what a dump cannot carry (function pointers)
NOT_REPLAYABLE = {"CUSTOM": "a custom op's function pointer is not in the dump",
                  "MAP_CUSTOM1": "a custom op's function pointer is not in the dump",
                  "MAP_CUSTOM2": "a custom op's function pointer is not in the dump",
                  "MAP_CUSTOM3": "a custom op's function pointer is not in the dump"}


@dataclass
class Local:
    """One node's own error. `kind`: rerun (nmse set), view (nil by construction), or skipped
    (`why` says what stopped it)."""
    ref_index: int
    ours_index: int
    name: str
    op: str
    kind: str
    nmse: float | None = None
    max_abs: float | None = None
    why: str | None = None
    source: str | None = None  # the source that stopped it, when one did: "source 2 'cache_k_l0'"
    # the node on ours's own sources against ours's own output: exact when the re-run reproduces it
    replay_exact: bool | None = None
    replay_nmse: float | None = None
    inputs_from_ours: bool = False  # ref records no graph inputs: ours's fed the re-run

    def to_dict(self) -> dict[str, Any]:
        def f(v):
            return v if v is None or math.isfinite(v) else str(v)
        return {"kind": self.kind, "nmse": f(self.nmse), "max_abs": f(self.max_abs), "why": self.why, "source": self.source,
                "replay_exact": self.replay_exact, "replay_nmse": f(self.replay_nmse),
                "inputs_from_ours": self.inputs_from_ours}


class LocalError(GraphgenError, ValueError):
    """Local errors cannot be computed at all (a model that is not ours's, or unreadable)."""


# ---- the weights a node reads ------------------------------------------------------------------

class Weights:
    """Tensors of the GGUFs a graph read weights from (the draft, then a target lending it its
    embeddings and head), by name: ggml type id, ne and raw bytes, as the backend receives them."""

    def __init__(self, *paths):
        self.paths = [Path(p) for p in paths if p]
        self.path = self.paths[0] if self.paths else None
        self._by_name: dict[str, Any] = {}
        self._readers = []
        from gguf import GGUFReader
        for p in self.paths:
            try:
                reader = GGUFReader(str(p))
            except (OSError, ValueError) as e:
                raise LocalError(f"{p}: cannot read the model: {' '.join(str(e).split())}") from None
            self._readers.append(reader)
            for t in reader.tensors:
                self._by_name.setdefault(t.name, t)  # the draft's own before a lender's

    def get(self, name: str) -> tuple[int, list[int], np.ndarray] | None:
        t = self._by_name.get(name)
        if t is None:
            return None
        ne = [int(x) for x in t.shape] + [1] * (4 - len(t.shape))
        return int(t.tensor_type), ne, np.ascontiguousarray(t.data).view(np.uint8).ravel()


# ---- ggml ids by name, in the loaded library ---------------------------------------------------

def _op_id(G, desc: str, op_params: list[int]) -> tuple[int | None, str | None]:
    """The loaded ggml's op id for a dump's op description (op_desc names a unary or GLU op by its
    sub-op), or why there is none."""
    ids = G.OP_IDS
    if f"GGML_OP_{desc}" in ids and desc not in ("UNARY", "GLU"):
        return ids[f"GGML_OP_{desc}"], None
    if f"GGML_GLU_OP_{desc}" in ids:
        if ids[f"GGML_GLU_OP_{desc}"] != op_params[0]:
            return None, f"GLU op {desc} has another id in this ggml ({ids[f'GGML_GLU_OP_{desc}']}, dump {op_params[0]})"
        return ids["GGML_OP_GLU"], None
    sub = op_params[0]
    if 0 <= sub < G.GGML_UNARY_OP_COUNT and G.ggml_unary_op_name(sub).decode() == desc:
        return ids["GGML_OP_UNARY"], None
    return None, f"this ggml has no op {desc}"


def _type_ids(G) -> dict[str, int]:
    return {G.ggml_type_name(i).decode(): i for i in range(G.GGML_TYPE_COUNT)}


def _encode(values: np.ndarray, type_name: str) -> np.ndarray | None:
    """Float values as a tensor of `type_name` holds them, rounded as ggml rounds; None when the
    type is quantized (a dump keeps no values of such a node)."""
    v = np.asarray(values)
    if type_name == "f32":
        return np.ascontiguousarray(v, dtype=np.float32)
    if type_name == "f16":
        return np.ascontiguousarray(v.astype(np.float32).astype(np.float16))
    if type_name == "bf16":
        bits = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(v.astype(np.float32))
        return np.where(nan, ((bits >> 16) | 64).astype(np.uint16), rounded)
    ints = {"i32": np.int32, "i64": np.int64, "i16": np.int16, "i8": np.int8}
    if type_name in ints:
        return np.ascontiguousarray(np.rint(v) if v.dtype.kind == "f" else v, dtype=ints[type_name])
    if type_name == "f64":
        return np.ascontiguousarray(v, dtype=np.float64)
    return None


def _decode(raw: np.ndarray, type_name: str) -> np.ndarray:
    if type_name == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    dt = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64, "i16": np.int16,
          "i8": np.int8, "f64": np.float64}[type_name]
    return raw.view(dt).astype(np.float32)


# ---- the backends nodes ran on -----------------------------------------------------------------

def backend_spec(name: str | None) -> str:
    """A node's recorded backend name (CPU, Vulkan0, CUDA1, RPC[host:port]) as open_backend's spec."""
    if not name or name == "CPU":
        return "cpu"
    for prefix, kind in (("Vulkan", "vulkan"), ("CUDA", "cuda"), ("Metal", "metal"), ("MTL", "metal")):
        if name.startswith(prefix):
            tail = name[len(prefix):]
            return f"{kind}:{tail}" if tail.isdigit() else kind
    if name.startswith("RPC[") and name.endswith("]"):
        return f"rpc://{name[4:-1]}"
    return name


class _Backends:
    """The backends the re-runs compute on, opened once each, and one buffer per backend that every
    re-run reuses: a buffer is never freed while its backend lives (freeing a Vulkan buffer between
    graphs has corrupted the process's memory in ggml 0.26.0's Vulkan backend)."""

    def __init__(self, n_threads: int):
        self.n_threads, self.open = n_threads, {}
        self.arena: dict[int, int] = {}   # backend -> its buffer
        self.retired: list[int] = []      # outgrown buffers, freed with their backend

    def buffer(self, G, backend, ctx):
        """A buffer of `backend` holding every tensor of `ctx` (placed), or None."""
        buf = self.arena.get(backend)
        if buf is None or not _place(G, buf, ctx):
            need = ctx_bytes(G, backend, ctx)
            if buf is not None:
                self.retired.append(buf)
                need = max(need, 2 * G.ggml_backend_buffer_get_size(buf))
            buf = G.ggml_backend_buft_alloc_buffer(G.ggml_backend_get_default_buffer_type(backend), need)
            if not buf:
                return None
            self.arena[backend] = buf
            if not _place(G, buf, ctx):
                return None
        return buf

    def get(self, spec: str):
        if spec not in self.open:
            from ..runtime.backends import BackendUnavailable, open_backend
            try:
                self.open[spec] = open_backend(spec, self.n_threads)[0]
            except BackendUnavailable as e:
                self.open[spec] = e
        b = self.open[spec]
        if isinstance(b, Exception):
            raise b
        return b

    def close(self, G):
        for buf in self.retired + list(self.arena.values()):
            G.ggml_backend_buffer_free(buf)
        self.retired, self.arena = [], {}
        for b in self.open.values():
            if not isinstance(b, Exception):
                G.ggml_backend_free(b)
        self.open.clear()


# ---- one node, alone ---------------------------------------------------------------------------

@dataclass
class _Source:
    type: int
    ne: list[int]
    ref: np.ndarray | None      # bytes fed to the re-run on ref's values
    ours: np.ndarray | None     # bytes fed to the replay on ours's own values
    layout_only: bool = False   # a write target: its values are never read
    nb: list[int] | None = None  # the strides it was read through, when the dump has them
    strided: bool = False        # those strides are not its shape's own: it is laid out as read
    quantized: bool = False      # ref / ours are raw rows of blocks (uint8, ne3, ne2, ne1, row bytes)
    from_ours: bool = False     # a graph input ref does not record, taken from ours


ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "i16": 2, "i8": 1, "f64": 8}


def _row_layout(ne: list[int], type_name: str, type_id: int) -> tuple[int, int] | None:
    """(bytes of one element or block, bytes of one row) of a plain or block-quantized type."""
    from ..dump.record import QUANT_BLOCKS
    if type_name in ITEMSIZE:
        return ITEMSIZE[type_name], ITEMSIZE[type_name] * ne[0]
    if type_id in QUANT_BLOCKS and ne[0] % QUANT_BLOCKS[type_id][0] == 0:
        blck, size = QUANT_BLOCKS[type_id]
        return size, ne[0] // blck * size
    return None


def _strided(ne: list[int], nb: list[int] | None, type_name: str, type_id: int) -> bool:
    """Whether a source was read through strides other than its shape's own (a permuted view)."""
    layout = _row_layout(ne, type_name, type_id)
    if nb is None or layout is None:
        return False
    want = [layout[0], layout[1], layout[1] * ne[1], layout[1] * ne[1] * ne[2]]
    return any(nb[k] != want[k] for k in range(4) if ne[k] > 1)


def _source_tensor(G, ctx, s: "_Source", data):
    """A source tensor laid out as the node read it: a permuted view read through its strides
    takes another kernel path than its contiguous copy (llamafile's sgemm wants contiguous
    operands), so the values are placed at the recorded strides of a buffer and viewed there."""
    ne = (ctypes.c_int64 * 4)(*s.ne)
    if not s.strided:
        t = G.ggml_new_tensor(ctx, s.type, 4, ne)
        return t, t, data
    unit, blck = G.ggml_type_size(s.type), G.ggml_blck_size(s.type)   # bytes and elements of a block
    row = s.ne[0] // blck * unit
    # the bytes the strided view spans, and at least what ggml takes a view of this shape to need
    extent = sum((n - 1) * b for n, b in zip(s.ne[1:], s.nb[1:])) + (row if blck > 1 else (s.ne[0] - 1) * s.nb[0] + unit)
    extent = max(extent, row * s.ne[1] * s.ne[2] * s.ne[3])
    base = G.ggml_new_tensor_1d(ctx, s.type, (extent + unit - 1) // unit * blck)
    view = G.ggml_view_4d(ctx, base, s.ne[0], s.ne[1], s.ne[2], s.ne[3], s.nb[1], s.nb[2], s.nb[3], 0)
    for k in range(4):
        view.contents.nb[k] = s.nb[k]
    if data is None:
        return view, base, None
    raw = np.zeros(G.ggml_nbytes(base), dtype=np.uint8)
    if s.quantized:  # whole blocks: rows of bytes at the row strides
        shape, strides = (s.ne[3], s.ne[2], s.ne[1], data.shape[-1]), (s.nb[3], s.nb[2], s.nb[1], 1)
    else:
        shape, strides = tuple(reversed(s.ne)), tuple(reversed(s.nb))
    placed = np.ndarray(shape=shape, dtype=data.dtype, buffer=raw, strides=strides)
    placed[...] = data.reshape(placed.shape)
    return view, base, raw


def _run_alone(G, backends: _Backends, backend, node: Node, op_id: int, sources: list[_Source | None], type_id: int,
               prefill: tuple[np.ndarray | None, np.ndarray | None]) -> tuple[np.ndarray | None, ...] | str:
    """Compute `node` twice in one graph (on ref's sources, on ours's), returning both outputs'
    raw bytes, or why the backend cannot."""
    n_tensors = 2 * (len(sources) + 1)
    params = G.ggml_init_params(mem_size=(n_tensors + 4) * G.ggml_tensor_overhead() + G.ggml_graph_overhead(),
                                mem_buffer=None, no_alloc=True)
    ctx = G.ggml_init(params)
    try:
        outs, feeds = [], []
        for side in (0, 1):
            srcs = []
            for s in sources:
                if s is None:
                    srcs.append(None)
                    continue
                t, fed, data = _source_tensor(G, ctx, s, s.ref if side == 0 else s.ours)
                srcs.append(t)
                feeds.append((fed, data))
            out = G.ggml_new_tensor(ctx, type_id, 4, (ctypes.c_int64 * 4)(*node.ne))
            c = out.contents
            c.op = op_id
            for k, v in enumerate(node.op_params):
                c.op_params[k] = v
            for k, t in enumerate(srcs):
                if t is not None:
                    c.src[k] = t
            G.ggml_set_output(out)
            outs.append(out)
            if prefill[side] is not None:
                feeds.append((out, prefill[side]))
        if not G.ggml_backend_supports_op(backend, outs[0]):
            return f"the {G.ggml_backend_name(backend).decode()} backend does not run this op on these types"
        gf = G.ggml_new_graph_custom(ctx, 16, False)
        for out in outs:
            G.ggml_build_forward_expand(gf, out)
        buf = backends.buffer(G, backend, ctx)
        if not buf:
            return "could not allocate its tensors on the backend"
        for t, data in feeds:
            if data is None:
                continue
            G.ggml_backend_tensor_set(t, data.ctypes.data_as(ctypes.c_void_p), 0, data.nbytes)
        status = G.ggml_backend_graph_compute(backend, gf)
        G.ggml_backend_synchronize(backend)
        if status != 0:
            return f"the backend's compute failed (status {status})"
        results = []
        for out in outs:
            raw = np.empty(G.ggml_nbytes(out), dtype=np.uint8)
            G.ggml_backend_tensor_get(out, raw.ctypes.data_as(ctypes.c_void_p), 0, raw.nbytes)
            results.append(raw)
        return tuple(results)
    finally:
        G.ggml_free(ctx)


def _place(G, buf, ctx) -> bool:
    """Every tensor of `ctx` at its aligned place in `buf`; False when they do not fit."""
    buft = G.ggml_backend_buffer_get_type(buf)
    align = G.ggml_backend_buft_get_alignment(buft)
    base, cap = G.ggml_backend_buffer_get_base(buf), G.ggml_backend_buffer_get_size(buf)
    places, views, off = [], [], 0
    t = G.ggml_get_first_tensor(ctx)
    while t:
        if t.contents.view_src:
            views.append(t)  # a view lives in its source's memory
        else:
            places.append((t, off))
            off += (G.ggml_backend_buft_get_alloc_size(buft, t) + align - 1) // align * align
        t = G.ggml_get_next_tensor(ctx, t)
    if off > cap:
        return False
    if not all(G.ggml_backend_tensor_alloc(buf, t, ctypes.c_void_p(base + o)) == 0 for t, o in places):
        return False
    return all(G.ggml_backend_view_init(v) == 0 for v in views)


def ctx_bytes(G, backend, ctx) -> int:
    buft = G.ggml_backend_get_default_buffer_type(backend)
    align = G.ggml_backend_buft_get_alignment(buft)
    n, t = 0, G.ggml_get_first_tensor(ctx)
    while t:
        if not t.contents.view_src:
            n += (G.ggml_backend_buft_get_alloc_size(buft, t) + align - 1) // align * align
        t = G.ggml_get_next_tensor(ctx, t)
    return n


def local_errors(ref: Dump, ours: Dump, pairs: list[tuple[int, int]], ref_of: dict[int, int],
                 source_slots: Callable[[int], list[tuple[str, int | None]]], model: str | Path | None = None,
                 n_threads: int = 1, progress: Callable[[int, int], None] | None = None,
                 lenders: list[str | Path] = ()) -> dict[int, Local]:
    """Local error of each ours node in `pairs` (ref index, ours index), keyed by ours index.

    `ref_of` maps an ours node index to its ref partner; `source_slots(j)` gives ours node j's src
    slots as (name, ours index or None for a leaf); `model` is ours's GGUF, for the weights, and
    `lenders` the GGUFs that lent it tensors (a target's embeddings and head).

    The nodes are re-run in a child process, one backend instance for all of them: a node whose
    kernel aborts (a GGML_ASSERT) ends the child, not the caller, and is reported as such; the
    rest go on in a new child. A GPU backend is opened there once, as the run it checks did (a
    second instance of a Vulkan device in one process has corrupted memory in ggml 0.26.0)."""
    if model is not None and ours.model_sha256:
        from ..dump.format import model_sha256
        if model_sha256(model) != ours.model_sha256:
            raise LocalError(f"{model} is not the model ours ran ({ours.model}, sha256 {ours.model_sha256[:12]}): "
                             "the weights a node reads must be the ones it ran with")
    models = [str(m) for m in (model, *lenders) if m is not None]
    Weights(*models)  # an unreadable model is refused here, in a line, not in the child
    request = {"ref": str(ref.path), "ours": str(ours.path), "models": models,
               "n_threads": n_threads, "ref_of": {str(j): i for j, i in ref_of.items()},
               "slots": {str(j): [list(s) for s in source_slots(j)] for _, j in pairs}}
    out: dict[int, Local] = {}
    todo = list(pairs)
    while todo:
        request["pairs"] = todo
        done_now = _child(request, out, len(pairs), progress)
        if done_now is None:
            break
        # the child died at todo[done_now]: that node says so, the rest go on in a new child
        i, j, why = done_now
        node = ours.nodes[j]
        out[j] = Local(i, j, node.name, node.op, "skipped", why=why)
        todo = [p for p in todo if p[1] not in out]
    return out


_ROW = "graphgen-local-row "


def _child(request: dict, out: dict[int, Local], total: int, progress) -> tuple[int, int, str] | None:
    """Run one child over request["pairs"], filling `out`; None when it finished them all, else
    (ref index, ours index, why) of the node it died on."""
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ)
    from ..ops.runtime import activate
    rt = activate()
    if rt.origin != "reference":
        env["GRAPHGEN_GGML_DIR"] = str(rt.lib_dir)  # the ggml this process computes on
    p = subprocess.Popen([sys.executable, "-m", "graphgen.compare.local"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        p.stdin.write(json.dumps(request))
        p.stdin.close()
        pending = list(request["pairs"])
        for line in p.stdout:
            # ggml's abort prints a backtrace on stdout: only the rows marked as such are read
            if not line.startswith(_ROW):
                continue
            row = json.loads(line[len(_ROW):])
            j = row["ours_index"]
            out[j] = Local(**row)
            pending = [x for x in pending if x[1] != j]
            if progress is not None and len(out) % 16 == 0:
                progress(len(out), total)
        err = p.stderr.read()
        rc = p.wait()
    except BaseException:
        p.kill()
        p.wait()
        raise
    if not pending:
        return None
    lines = [ln for ln in err.splitlines() if "ggml_vulkan" not in ln]
    tail = next((ln.strip() for ln in lines if "GGML_ASSERT" in ln or "error" in ln.lower()), " ".join(lines[-3:]))[-300:]
    if rc == 0:
        raise RuntimeError(f"the re-run ended without {len(pending)} of its nodes: {tail}")
    if rc == 2 and not out:
        raise LocalError(f"the nodes cannot be re-run: {tail or 'exit status 2'}")
    how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
    i, j = pending[0]
    return i, j, f"re-running it alone ended its backend's process ({how}): {tail or 'nothing printed'}"


def _serve() -> int:
    """The child's side (`python -m graphgen.compare.local`): a request on stdin, a JSON line per
    node on stdout, as each is done."""
    import json
    import sys
    from ..dump.format import load_dump
    from ..ops import ggml as G
    req = json.loads(sys.stdin.read())
    ref, ours = load_dump(req["ref"]), load_dump(req["ours"])
    weights = Weights(*req["models"])
    ref_of = {int(j): i for j, i in req["ref_of"].items()}
    slots = {int(j): [(n, k) for n, k in v] for j, v in req["slots"].items()}
    types = _type_ids(G)
    backends = _Backends(req["n_threads"])
    try:
        for i, j in req["pairs"]:
            res = _one(G, ref, ours, i, j, ref_of, slots.__getitem__, weights, types, backends)
            sys.stdout.write(_ROW + json.dumps(vars(res)) + "\n")
            sys.stdout.flush()
    finally:
        backends.close(G)
    return 0


def _one(G, ref: Dump, ours: Dump, i: int, j: int, ref_of, source_slots, weights: Weights, types,
         backends: _Backends) -> Local:
    node = ours.nodes[j]
    res = Local(i, j, node.name, node.op, "skipped")
    if node.op in VIEW_OPS:
        res.kind, res.nmse, res.max_abs = "view", 0.0, 0.0
        return res
    if node.op in NOT_REPLAYABLE:
        res.why = NOT_REPLAYABLE[node.op]
        return res
    op_id, why = _op_id(G, node.op, node.op_params)
    if op_id is None:
        res.why = why
        return res
    if node.type not in types:
        res.why = f"this ggml has no type {node.type}"
        return res
    quantized = node.type not in _DECODABLE
    if quantized:
        expect = ref.qrows(i) if ref.nodes[i].type == node.type else None
        if expect is None:
            res.why = f"ref keeps no blocks of it ({node.type})"
            return res
    else:
        expect = ref.values(i)
        if expect is None:
            res.why = "ref keeps no values of it (over --max-data)"
            return res
    target = WRITE_TARGET.get(node.op)
    sources: list[_Source | None] = []
    slots = source_slots(j)
    for s, name in enumerate(node.src):
        if not name:
            sources.append(None)
            continue
        if s == target:
            sources.append(_Source(types[node.type], list(node.ne), None, None, layout_only=True))
            continue
        inp_k = node.src_input[s] if node.src_input is not None else None
        src, why = _source(ref, ours, slots[s], ref_of, weights, types, inp_k)
        if src is None:
            res.why, res.source = why, f"source {s} '{name}'"
            return res
        sources.append(src)
    res.inputs_from_ours = any(s is not None and s.from_ours for s in sources)
    prefill = (None, None)
    if target is not None:
        if quantized:
            prefill = (np.ascontiguousarray(expect), ours.qrows(j))
        else:
            own = ours.values(j)
            prefill = (_encode(expect, node.type), None if own is None else _encode(own, node.type))
    from ..runtime.backends import BackendUnavailable
    try:
        backend = backends.get(backend_spec(node.backend))
    except BackendUnavailable as e:
        res.why = f"its backend cannot be opened here: {e}"
        return res
    ran = _run_alone(G, backends, backend, node, op_id, sources, types[node.type], prefill)
    if isinstance(ran, str):
        res.why = ran
        return res
    if quantized:
        return _compare_blocks(res, node, types[node.type], expect, ran, ours.qrows(j), sources)
    got = _decode(ran[0], node.type).reshape(node.shape)
    res.kind = "rerun"
    if node.op in ORDER_FREE:
        # the order among equal-ranked candidates is the kernel's: compared as sorted rows
        expect, got = np.sort(expect, axis=-1), np.sort(got, axis=-1)
    res.nmse, res.max_abs, reason = compare_values(expect, got)
    if reason:
        res.why = reason
    own = ours.values(j)
    if own is not None and all(s is None or s.layout_only or s.ours is not None for s in sources):
        replay = _decode(ran[1], node.type).reshape(node.shape)
        if node.op in ORDER_FREE:
            own, replay = np.sort(own, axis=-1), np.sort(replay, axis=-1)
        res.replay_exact = bool(np.array_equal(own, replay, equal_nan=True))
        res.replay_nmse = compare_values(own, replay)[0]
    return res


_DECODABLE = {"f32", "f16", "bf16", "i32", "i64", "i16", "i8", "f64"}


def _compare_blocks(res: Local, node: Node, type_id: int, expect: np.ndarray, ran, own, sources) -> Local:
    """A quantized output (a write into a q8_0 cache): its blocks dequantized as gguf-py does, the
    NMSE of those values; the replay must give ours's blocks byte for byte."""
    from gguf.quants import dequantize
    row = expect.shape[-1]
    try:
        want = dequantize(np.ascontiguousarray(expect).reshape(-1, row), type_id)
        got = dequantize(ran[0].reshape(-1, row), type_id)
    except (NotImplementedError, ValueError, KeyError) as e:
        res.why = f"its output is {node.type}, which cannot be dequantized here ({' '.join(str(e).split())})"
        return res
    res.kind = "rerun"
    res.nmse, res.max_abs, reason = compare_values(want, got)
    if reason:
        res.why = reason
    if own is not None and all(s is None or s.layout_only or s.ours is not None for s in sources):
        res.replay_exact = bool(np.array_equal(np.ascontiguousarray(own).ravel(), ran[1].ravel()))
        res.replay_nmse = compare_values(dequantize(np.ascontiguousarray(own).reshape(-1, row), type_id),
                                         dequantize(ran[1].reshape(-1, row), type_id))[0]
    return res


def _source(ref: Dump, ours: Dump, slot: tuple[str, int | None], ref_of: dict[int, int], weights: Weights,
            types: dict[str, int], inp_k: int | None = None) -> tuple[_Source | None, str | None]:
    name, at = slot
    if at is not None:
        src = ours.nodes[at]
        if src.type not in types:
            return None, f"this ggml has no type {src.type}"
        k = ref_of.get(at)
        if k is None:
            return None, "it has no counterpart in ref"
        strided = _strided(src.ne, src.nb, src.type, types[src.type])
        if src.type not in _DECODABLE:
            # a quantized source (a q8_0 cache's view): its blocks as ref recorded them
            if ref.nodes[k].type != src.type:
                return None, f"it is {src.type} in ours and {ref.nodes[k].type} in ref"
            data = ref.qrows(k)
            if data is None:
                return None, f"ref keeps no blocks of it ({src.type}: a dump made before they were kept, or over --max-data)"
            return _Source(types[src.type], list(src.ne), data, ours.qrows(at), nb=src.nb, strided=strided,
                           quantized=True), None
        vals = ref.values(k)
        if vals is None:
            return None, "ref keeps no values of it (over --max-data)"
        if vals.size != math.prod(src.ne):
            return None, f"ref's counterpart has {vals.size} elements, ours's {math.prod(src.ne)}"
        own = ours.values(at)
        return _Source(types[src.type], list(src.ne), _encode(vals, src.type),
                       None if own is None else _encode(own, src.type), nb=src.nb, strided=strided), None
    # a graph input as ref fed it; a dump that records no inputs at all (made before they were
    # recorded, or the authors' torch side) lends ours's, and the node says so
    if inp_k is None:  # a dump without src_input: the first input of the name
        inp_k = next((j for j, inp in enumerate(ours.inputs) if inp.name == name), None)
    if inp_k is not None:
        inp = ours.inputs[inp_k]
        own = ours.input_values(inp_k)
        rk = ref.input_partner(ours, inp_k) if ref.inputs else None
        vals = ref.input_values(rk) if rk is not None else (own if not ref.inputs else None)
        if vals is not None and inp.type in types:
            return _Source(types[inp.type], list(inp.ne), _encode(vals, inp.type),
                           None if own is None else _encode(own, inp.type), from_ours=not ref.inputs), None
        if ref.inputs:
            return None, f"the graph input '{name}' has no counterpart among ref's inputs"
    w = weights.get(name)
    if w is not None:
        t, ne, raw = w
        return _Source(t, ne, raw, raw), None
    if weights.path is None:
        return None, ("a leaf the dumps do not record: a weight needs the model (--weights), an input a dump that "
                      "records inputs")
    return None, f"a leaf neither dump records and {' nor '.join(p.name for p in weights.paths)} holds"


if __name__ == "__main__":
    import sys as _sys
    _sys.exit(_serve())
