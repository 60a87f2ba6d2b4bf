"""Read a computed ggml node into the dump format: the eval-callback half of a dump.

Both engines use this: the reference passes node pointers from llama.cpp's cb_eval, graphgen
from its own scheduler callback. The struct below is ggml's `struct ggml_tensor`, whose layout is
the same across ggml 0.15 to 0.27; it is declared here so the reference process never has to
import a second ggml through ggml-python.
"""

from __future__ import annotations

import ctypes
import hashlib
import re

import numpy as np

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64
GGML_MAX_OP_PARAMS = 64


class TensorStruct(ctypes.Structure):
    pass


TensorStruct._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
    ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(TensorStruct) * GGML_MAX_SRC),
    ("view_src", ctypes.POINTER(TensorStruct)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * GGML_MAX_NAME),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]

# ggml_type ids shared by both ggml versions for the plain types
NUMPY_TYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64,
               28: np.float64}
GGML_TYPE_BF16 = 30

CPU_FEATURES = ("sse3", "ssse3", "avx", "avx_vnni", "avx2", "bmi2", "f16c", "fma", "avx512",
                "avx512_vbmi", "avx512_vnni", "avx512_bf16", "amx_int8", "neon", "arm_fma", "fp16_va",
                "dotprod", "matmul_int8", "sve", "sme", "riscv_v", "vsx", "wasm_simd", "llamafile")


def cpu_features(cpu_lib) -> dict:
    """What the ggml CPU library in `cpu_lib` (a ctypes CDLL) was built for."""
    out = {}
    for feat in CPU_FEATURES:
        fn = getattr(cpu_lib, f"ggml_cpu_has_{feat}", None)
        if fn is None:
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = []
        out[feat.upper()] = bool(fn())
    return out


# the scheduler feeds a node on another backend through a copy named "<backend>#<tensor>#<copy>"
_SCHED_COPY = re.compile(r"^[^#]+#(.+)#\d+$")


def src_names(t: TensorStruct) -> list[str]:
    """Source names; scheduler copies are named after the tensor they copy, so the structure of a
    graph reads the same whichever backends ran it."""
    names = []
    for i in range(GGML_MAX_SRC):
        s = t.src[i]
        name = s.contents.name.decode(errors="replace") if s else ""
        m = _SCHED_COPY.match(name)
        names.append(m.group(1) if m else name)
    while names and names[-1] == "":
        names.pop()
    return names


GGML_TENSOR_FLAG_INPUT = 1
GGML_TENSOR_FLAG_OUTPUT = 2
GGML_OP_NONE = 0  # the one op id every ggml version shares: a leaf


def read_array(t: TensorStruct, read_bytes=None, addr: int = 0) -> np.ndarray | None:
    """A computed node's elements in numpy order (ne3, ne2, ne1, ne0) and its own dtype (bf16 as
    uint16), or None when it has none or is quantized. Views are read through their strides;
    `read_bytes(addr, nbytes)` fetches device memory when the data pointer is not host memory."""
    ne = [int(x) for x in t.ne]
    if ne[0] * ne[1] * ne[2] * ne[3] == 0:
        return None
    if t.type == GGML_TYPE_BF16:
        dt = np.uint16
    elif t.type in NUMPY_TYPES:
        dt = NUMPY_TYPES[t.type]
    else:
        return None  # quantized: not compared by value
    nb = [int(x) for x in t.nb]
    return _strided(t, (ne[3], ne[2], ne[1], ne[0]), dt, (nb[3], nb[2], nb[1], nb[0]), read_bytes, addr)


def _strided(t: TensorStruct, shape, dtype, strides, read_bytes=None, addr: int = 0) -> np.ndarray | None:
    """A numpy view of a node's bytes with these shape and strides: device memory through
    `read_bytes(addr, nbytes)`, host memory in place; None when a host node has no data."""
    extent = sum((n - 1) * st for n, st in zip(shape, strides)) + np.dtype(dtype).itemsize
    if read_bytes is not None:
        raw = read_bytes(addr, extent)
    else:
        if not t.data:
            return None
        raw = (ctypes.c_char * extent).from_address(t.data)
    return np.ndarray(shape=shape, dtype=dtype, buffer=raw, strides=strides)


# ggml_type -> (values per block, bytes per block) of the block-quantized types (ggml.h's enum;
# these ids and layouts are fixed): a quantized cache's rows are whole blocks
QUANT_BLOCKS = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
                10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
                15: (256, 292), 20: (32, 18)}


def read_quantized_rows(t: TensorStruct, read_bytes=None, addr: int = 0) -> np.ndarray | None:
    """A block-quantized node's rows as raw bytes, uint8 (ne3, ne2, ne1, row bytes), read through
    its strides; None for other types. Bytes are what a quantized cache holds, so equal bytes
    are bit-exact equality of the cached values."""
    if t.type not in QUANT_BLOCKS:
        return None
    ne = [int(x) for x in t.ne]
    blck, size = QUANT_BLOCKS[t.type]
    if ne[0] * ne[1] * ne[2] * ne[3] == 0 or ne[0] % blck:
        return None
    row = ne[0] // blck * size
    nb = [int(x) for x in t.nb]
    return _strided(t, (ne[3], ne[2], ne[1], row), np.uint8, (nb[3], nb[2], nb[1], 1), read_bytes, addr)


def as_float32(arr: np.ndarray, t_type: int) -> np.ndarray:
    if t_type == GGML_TYPE_BF16:
        return (arr.astype(np.uint32) << 16).view(np.float32).copy()
    return arr.astype(np.float32)


def read_values(t: TensorStruct, max_data: int, read_bytes=None, addr: int = 0) -> np.ndarray | None:
    """Values of a computed node as float32 in numpy order, or None (too large, quantized, empty)."""
    ne = [int(x) for x in t.ne]
    if ne[0] * ne[1] * ne[2] * ne[3] > max_data:
        return None
    arr = read_array(t, read_bytes, addr)
    return None if arr is None else as_float32(arr, t.type)


def summarize(arr: np.ndarray, t_type: int) -> tuple[str, dict]:
    """The sha256 of a node's bytes (contiguous, its own dtype) and summary statistics: enough to
    tell bit-exact equality of nodes whose values a dump does not keep, and to locate a change."""
    contiguous = np.ascontiguousarray(arr)
    digest = hashlib.sha256(contiguous.tobytes()).hexdigest()
    v = as_float32(contiguous, t_type).astype(np.float64).ravel()
    finite = v[np.isfinite(v)]
    stats = {"count": int(v.size), "sum": float(finite.sum()), "sumsq": float(np.dot(finite, finite)),
             "min": float(finite.min()) if finite.size else None,
             "max": float(finite.max()) if finite.size else None,
             "nan": int(np.isnan(v).sum()), "inf": int(np.isinf(v).sum())}
    return digest, stats


class NodeRecorder:
    """Collects nodes in evaluation order for one graph, as dump.Node objects plus values."""

    def __init__(self, op_desc, type_name, max_data: int = 262144, read_bytes=None):
        self.op_desc = op_desc      # callable(ptr) -> str
        self.type_name = type_name  # callable(int) -> str
        self.max_data = max_data
        self.read_bytes = read_bytes
        self.nodes = []
        self.values = {}
        self.backends = {}
        self.addrs = []
        self.inputs = []   # (dump.format.Input, values) of each graph input, as first read
        self.qrows = {}    # index -> a quantized node's rows as raw bytes (uint8, ne3, ne2, ne1, row bytes)
        self._node_names = set()  # names of the nodes recorded
        self._input_at: dict[int, int] = {}  # an input's address -> its index in `inputs`
        self._input_by_digest: dict[tuple[str, str], int] = {}
        self._at: dict[int, int] = {}  # address -> index of the nodes recorded
        self._by_digest: dict[tuple[str, str], int] = {}  # (name, digest) -> index, for copies
        self.input_names = set()  # inputs the engine names, where a leaf's flags do not tell

    def reset(self):
        self.nodes, self.values, self.backends, self.addrs, self.inputs = [], {}, {}, [], []
        self.qrows = {}
        self._node_names, self._at, self._by_digest = set(), {}, {}
        self._input_at, self._input_by_digest = {}, {}

    def reorder(self, graph_index: dict):
        """Put the nodes in the graph's order. The CPU evaluates a graph in that order; a backend
        that reorders nodes for concurrency (Vulkan) reports them otherwise, and the dump should
        read the same whichever backend ran it."""
        order = sorted(range(len(self.nodes)), key=lambda k: (graph_index.get(self.addrs[k], 1 << 62), k))
        if order == list(range(len(self.nodes))):
            return
        nodes, values, backends, qrows = [], {}, {}, {}
        for new, old in enumerate(order):
            n = self.nodes[old]
            n.index = new
            nodes.append(n)
            if old in self.values:
                values[new] = self.values[old]
            if old in self.qrows:
                qrows[new] = self.qrows[old]
            if old in self.backends:
                backends[new] = self.backends[old]
        self.addrs = [self.addrs[o] for o in order]
        new_of = {old: new for new, old in enumerate(order)}
        for n in nodes:
            if n.src_at is not None:
                n.src_at = [None if k is None else new_of[k] for k in n.src_at]
        self._at = {a: k for k, a in enumerate(self.addrs)}
        self._by_digest = {(n.name, n.digest): n.index for n in nodes if n.digest}
        self.nodes, self.values, self.backends, self.qrows = nodes, values, backends, qrows

    def record(self, addr: int, backend: str | None = None):
        from .format import Node
        t = TensorStruct.from_address(addr)
        idx = len(self.nodes)
        self.addrs.append(addr)
        names = src_names(t)
        src_at = [self._source_at(t.src[k], names[k]) if t.src[k] else None for k in range(len(names))]
        self._at[addr] = idx
        vs = t.view_src
        self.nodes.append(Node(
            index=idx,
            name=t.name.decode(errors="replace"),
            op=self.op_desc(addr),
            type=self.type_name(t.type),
            ne=[int(x) for x in t.ne],
            src=names,
            view_src=vs.contents.name.decode(errors="replace") if vs else None,
            view_offs=int(t.view_offs),
            op_params=[int(x) for x in t.op_params],
            backend=backend,
            src_at=src_at,
            nb=[int(x) for x in t.nb],
        ))
        if backend is not None:
            self.backends[idx] = backend
        src_in = self._record_inputs(t)
        if any(k is not None for k in src_in):
            self.nodes[idx].src_input = src_in
        self._node_names.add(self.nodes[idx].name)
        arr = read_array(t, self.read_bytes, addr)
        if arr is None:
            rows = read_quantized_rows(t, self.read_bytes, addr)
            if rows is not None:  # no float values, but the digest shows bit-exact equality
                rows = np.ascontiguousarray(rows)
                self.nodes[idx].digest = hashlib.sha256(rows.tobytes()).hexdigest()
                self.nodes[idx].stats = {"count": int(np.prod(t.ne[:4]))}
                if int(np.prod(t.ne[:4])) <= self.max_data:
                    self.qrows[idx] = rows.copy()  # the blocks themselves, to re-run a node on
            return
        node = self.nodes[idx]
        node.digest, node.stats = summarize(arr, t.type)
        self._by_digest[(node.name, node.digest)] = idx
        # what a caller reads back (logits, embeddings, lattices) is kept whole at any size
        if arr.size <= self.max_data or t.flags & GGML_TENSOR_FLAG_OUTPUT:
            self.values[idx] = as_float32(arr, t.type)


    def _source_at(self, src, name: str) -> int | None:
        """The index of the recorded node a source is: by address, or for a scheduler's copy
        (another backend's, named "<backend>#<name>#<n>") by its name and the digest of its bytes."""
        saddr = ctypes.addressof(src.contents)
        at = self._at.get(saddr)
        if at is not None or not _SCHED_COPY.match(src.contents.name.decode(errors="replace")):
            return at
        arr = read_array(src.contents, self.read_bytes, saddr)
        if arr is None:
            return None
        return self._by_digest.get((name, hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()))

    def _record_inputs(self, t: TensorStruct) -> list[int | None]:
        """The graph inputs `t` reads, each recorded on its first read (the scheduler may hand an
        input's memory to a later node once its last reader ran, so nothing later can read it
        back); returns, per src slot, the index of the input it is in `inputs`, or None. Inputs
        are told apart by address (an iSWA draft has two masks of one name), a scheduler's copy
        by its name and bytes."""
        from .format import Input
        names = src_names(t)
        out: list[int | None] = []
        for i, name in enumerate(names):
            s = t.src[i]
            out.append(None)
            if not name or not s or s.contents.op != GGML_OP_NONE:
                continue
            if not s.contents.flags & GGML_TENSOR_FLAG_INPUT and name not in self.input_names:
                continue
            if name in self._node_names:
                continue  # a scheduler's copy of a node: not an input
            src = s.contents
            saddr = ctypes.addressof(src)
            if saddr in self._input_at:
                out[-1] = self._input_at[saddr]
                continue
            arr = read_array(src, self.read_bytes, saddr)
            if arr is None or arr.size > self.max_data:
                continue
            digest = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
            k = self._input_by_digest.get((name, digest)) if _SCHED_COPY.match(src.name.decode(errors="replace")) \
                else None
            if k is None:
                vals = arr.copy() if arr.dtype.kind in "iu" else as_float32(arr, src.type)
                k = len(self.inputs)
                self.inputs.append((Input(name, self.type_name(src.type), [int(x) for x in src.ne], digest), vals))
                self._input_by_digest.setdefault((name, digest), k)
            self._input_at[saddr] = k
            out[-1] = k
        return out


def n_kv_from_nodes(nodes) -> int | None:
    """n_kv as the graph used it: the cell count of the first K-cache view the attention reads."""
    for n in nodes:
        if n.op == "VIEW" and (n.view_src or "").startswith("cache_k_l"):
            return int(n.ne[2])
    return None
