"""Session: a backend, a loaded draft and its KV cache; batches in, numpy results out.

Per batch: validate it (ggml asserts would kill the interpreter), take KV slots, build the
graph for the batch's shapes, let the scheduler allocate it, set the inputs, compute, read the
outputs. A batch that fails leaves the cache as it was.

Long because the compute path of a batch is one piece: the KV cache's cells, the scheduler, the
shared compute buffer and its placement invariants, inputs and outputs; the invariants and the code
relying on them stay together.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
import weakref

import numpy as np

from . import batch as B
from ..graph import GraphParams, MemSlot, graph_capacity, graph_max_nodes
from ..models.arch import build_arch_graph
from ..ops import ggml as G
from .backends import open_backend
from .kvcache import KVCache, KVCacheTypeError, UBatch, check_kv_types
from .model import Model, load
from ..errors import ContextError, GraphgenError
from ..cachetypes import KV_TYPE_IDS
from ..staging import deferred, pending, raise_pending

KV_TYPES = dict(KV_TYPE_IDS)


class Result:
    """One batch's outputs: logits [n_tokens, n_vocab], embd [n_tokens, n_embd] (result_norm),
    h_nextn, each None when the graph has none.

    An output is read back from the backend when first asked for: a drafter wants the block's
    logits, not result_norm, and reading what nobody uses is a cost on every step. Whatever was
    not read yet is read before the graph that holds it computes again or is freed, so a Result
    keeps its values however long it is kept."""

    __slots__ = ("graph", "n_nodes", "_tensors", "_values", "__weakref__")
    OUTPUTS = ("logits", "embd", "h_nextn")

    def __init__(self, graph: str, n_nodes: int = 0, tensors: dict | None = None):
        self.graph, self.n_nodes = graph, n_nodes
        self._tensors = tensors or {}
        self._values: dict[str, np.ndarray | None] = {}

    def _get(self, name: str) -> np.ndarray | None:
        if name not in self._values:
            self._values[name] = _read(self._tensors.get(name))
        return self._values[name]

    def _materialize(self) -> None:
        for name in self.OUTPUTS:
            self._get(name)
        self._tensors = {}

    logits = property(lambda self: self._get("logits"))
    embd = property(lambda self: self._get("embd"))
    h_nextn = property(lambda self: self._get("h_nextn"))

    def __repr__(self) -> str:
        return f"Result(graph={self.graph!r}, n_nodes={self.n_nodes})"


def _read(t, shape_from=None) -> np.ndarray | None:
    if t is None or not t.contents.buffer:
        return None
    c = t.contents
    out = np.empty((c.ne[3], c.ne[2], c.ne[1], c.ne[0]), dtype=np.float32)
    if c.type != G.GGML_TYPE_F32:
        return None
    G.ggml_backend_tensor_get(t, _address(out), 0, out.nbytes)
    return out.reshape(-1, c.ne[0]) if c.ne[2] * c.ne[3] == 1 else out


def _address(arr: np.ndarray) -> int:
    """The data address of a C-contiguous array (arr.ctypes.data costs several times more)."""
    if arr.flags.writeable and arr.nbytes:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))
    return arr.ctypes.data


_VIEW_DTYPES = {G.GGML_TYPE_F32: np.float32, G.GGML_TYPE_F16: np.float16}


def _host_view(t) -> np.ndarray | None:
    """A 2-D numpy view [ne1, ne0] of a contiguous f32/f16 tensor in host memory, else None."""
    c = t.contents
    if c.type not in _VIEW_DTYPES or not c.data or not G.ggml_backend_buffer_is_host(c.buffer):
        return None
    if c.ne[2] * c.ne[3] != 1 or not G.ggml_is_contiguous(t):
        return None
    dt = np.dtype(_VIEW_DTYPES[c.type])
    raw = (ctypes.c_char * (c.ne[0] * c.ne[1] * dt.itemsize)).from_address(c.data)
    return np.frombuffer(raw, dtype=dt).reshape(c.ne[1], c.ne[0])


_NO_CALLBACK = G.ggml_backend_sched_eval_callback(0)


def _graph_tensors(g) -> list:
    """The structs of every tensor g reaches: its nodes, their sources and the tensors views
    stand on, and its inputs (one it does not use included)."""
    seen: dict[int, object] = {}
    todo = [G.ggml_graph_node(g.gf, i) for i in range(G.ggml_graph_n_nodes(g.gf))]
    todo += [t for t, _ in g.res.inputs]
    while todo:
        t = todo.pop()
        a = ctypes.cast(t, ctypes.c_void_p).value
        if not a or a in seen:
            continue
        c = seen[a] = t.contents
        todo += [s for s in c.src if s]
        if c.view_src:
            todo.append(c.view_src)
    return list(seen.values())


class GraphSlot:
    """A graph kind's scheduler and its last graph."""

    def __init__(self, sched):
        self.sched = sched
        self.graph = None
        self.sig = None
        self.results: list[weakref.ref] = []   # Results whose outputs live in this graph

    def settle(self):
        """Read the outputs of earlier Results still held by someone, before they are overwritten."""
        for ref in self.results:
            r = ref()
            if r is not None:
                r._materialize()
        self.results = []

    def drop(self):
        self.settle()
        if self.graph is not None:
            self.graph.free()
        self.graph, self.sig = None, None


class Session:
    def __init__(self, model, *, n_ctx: int = 256, n_ubatch: int = 64, flash_attn: bool = False,
                 type_kv: str = "f16", n_seq: int = 1, n_threads: int = 1, backend: str = "cpu",
                 reuse_graphs: bool = True, type_k: str | None = None, type_v: str | None = None,
                 target=None):
        # type_kv names both caches; type_k / type_v, when given, override it for one of them
        type_k = type_kv if type_k is None else type_k
        type_v = type_kv if type_v is None else type_v
        for key, name in (("type_kv", type_kv), ("type_k", type_k), ("type_v", type_v)):
            if name not in KV_TYPES:
                raise KVCacheTypeError(f"{key} must be one of {', '.join(KV_TYPES)}, got {name!r}")
        if n_ctx < 1 or n_ubatch < 1 or n_seq < 1:
            raise ValueError("n_ctx, n_ubatch and n_seq must be positive")
        self._lock = threading.Lock()
        # weights and the KV cache live on the chosen backend; the CPU backend, last in the
        # scheduler's list, runs what the chosen one does not support
        self.backend, self.backend_name = open_backend(backend, n_threads)
        self.backends = [self.backend]
        if self.backend_name != "CPU":
            cpu = G.ggml_backend_cpu_init()
            G.ggml_backend_cpu_set_n_threads(cpu, n_threads)
            self.backends.append(cpu)
        # target: the model whose embeddings and lm head a draft without them borrows
        self.model = model if isinstance(model, Model) else load(model, target=target)
        try:
            # llama.cpp refuses these at context creation, before any memory is taken
            check_kv_types(self.model.hparams, type_k, type_v, flash_attn, k_only=self.model.backbone != "base")
        except ValueError:
            if self.model is not model:
                self.model.close()
            self.model = None
            self.close()
            raise
        if self.model.backend is None:
            self.model.upload(self.backend)
        self.hparams = hp = self.model.hparams
        self.block_rules = self.model.head.block_rules(hp)
        self.n_ctx, self.n_ubatch, self.n_seq = n_ctx, n_ubatch, n_seq
        # the most tokens a batch holds: a causal llama.cpp context caps its batch at the n_ctx
        # asked for (before padding), and a batch is one ubatch here
        self.n_batch = min(n_ctx, n_ubatch) if hp.ctx_causal else n_ubatch
        if n_seq > self.n_batch:
            if self.model is not model:
                self.model.close()
            self.model = None
            self.close()
            why = f"n_ubatch {n_ubatch}" + (f" capped at n_ctx {n_ctx}" if self.n_batch < n_ubatch else "")
            raise ContextError(f"n_seq {n_seq} is more than a batch holds ({self.n_batch}: {why}); llama.cpp "
                               "aborts creating such a context (its output buffer holds a batch)")
        # one node budget for every graph of the session, as a llama_context sizes its graphs
        self.max_nodes = graph_max_nodes(hp, len(self.model.tensors), self.n_batch)
        self.flash_attn = flash_attn
        self.type_k, self.type_v = type_k, type_v
        self.n_threads = n_threads
        tk, tv = KV_TYPES[type_k], KV_TYPES[type_v]
        v_trans = not flash_attn
        # llama.cpp pads the context to a multiple of 256 cells, and the caches take that size
        n_ctx = -(-n_ctx // 256) * 256
        if hp.use_iswa:
            base_layers = [il for il in range(hp.n_layer) if not hp.is_swa(il)]
            swa_layers = [il for il in range(hp.n_layer) if hp.is_swa(il)]
            # llama.cpp's default swa_full: the sliding cache is as large as the base cache
            size_swa = n_ctx
            # the DSpark backbones keep K only (V is a view of K) on every layer, all sliding
            k_only = self.model.backbone != "base"
            self.caches = {"base": KVCache(hp, base_layers, n_ctx, tk, tv, v_trans, 0, self.backend, k_only=k_only),
                           "swa": KVCache(hp, swa_layers, size_swa, tk, tv, v_trans, hp.n_swa, self.backend,
                                          k_only=k_only)}
        else:
            self.caches = {"base": KVCache(hp, range(hp.n_layer), n_ctx, tk, tv, v_trans, 0, self.backend)}
        # a slot per graph kind, each keeping its last graph: a drafting loop alternates inject
        # and block graphs, and each is reused while its shapes repeat. On one backend the kinds
        # share a scheduler (see _allocate); with a fallback backend the scheduler copies inputs
        # between backends into tensors it makes anew, so each kind keeps its own.
        self._scheds: dict[str, GraphSlot] = {}
        self._share_sched = len(self.backends) == 1
        self._remote = self.backend_name.startswith("RPC")
        self._allocated: dict = {}   # scheduler -> the graph it holds
        # graphs built, allocations, graphs reused, and reused graphs placed again after the
        # shared buffer moved under them
        self.stats = {"builds": 0, "allocs": 0, "reuses": 0, "replaced": 0}
        self.reuse_graphs = reuse_graphs
        self.last_graph = None
        # seconds per phase of the last batch: validate, kv, graph, inputs, compute, outputs
        self.timings: dict[str, float] = {}
        self._t_lap = 0.0

    # -- batches ----------------------------------------------------------------------------
    def _check_common(self, pos, seq):
        B.check_batch(pos, seq, self.n_batch, self.n_seq, self._batch_limit())

    def _batch_limit(self) -> str:
        if self.n_batch < self.n_ubatch:
            return (f"the batch size {self.n_batch} (n_ubatch {self.n_ubatch} capped at n_ctx {self.n_ctx}, "
                    "as llama.cpp caps a causal context's batch)")
        return f"n_ubatch {self.n_ubatch}"

    def make_inject(self, features, pos0: int, seq: int = 0) -> UBatch:
        x = B.check_features(features, self.hparams.n_embd_inp_enc)
        n = x.shape[0]
        pos0 = B.check_positions(pos0, n, "inject")
        seq = B.check_seq(seq, self.n_seq)
        pos = np.arange(pos0, pos0 + n, dtype=np.int32)
        sq = np.full(n, seq, dtype=np.int32)
        if not 0 < n <= self.n_batch:
            self._check_common(pos, sq)  # raises, naming the size
        return UBatch(pos=pos, seq=sq, embd=x, runs=[(seq, pos0, n)])

    def make_block(self, blocks, embd_state=None) -> UBatch:
        """blocks: [(seq, tokens, pos0), ...] into one batch, in that order."""
        quick = B.quick_blocks(blocks, self.block_rules, self.hparams.n_vocab, self.n_batch, self.n_seq)
        if quick is not None:
            tokens, pos_a, seq_a, runs = quick
        else:
            tokens, pos_a, seq_a = B.block_arrays(blocks, self.block_rules, self.hparams.n_vocab)
            self._check_common(pos_a, seq_a)
            runs = None
        st = B.check_embd_state(embd_state, tokens.size, self.hparams.n_embd)
        return UBatch(pos=pos_a, seq=seq_a, tokens=tokens, embd_state=st, runs=runs)

    def seq_pos_max(self, seq: int) -> int:
        """The last position the KV cache holds for `seq`, -1 when it holds none."""
        return max(c.seq_pos_max(seq) for c in self.caches.values())

    def _check_positions(self, ub: UBatch) -> None:
        # llama.cpp checks every batch's positions against the cache, the encoder's too
        mrope = self.hparams.n_pos_per_embd > 1
        if ub.runs is not None and B.runs_follow_cache(ub.runs, self.seq_pos_max, mrope, ub.is_embd):
            return
        B.check_seq_positions(ub.pos, ub.seq, self.seq_pos_max, self.hparams.n_pos_per_embd > 1, ub.is_embd)

    # -- compute ----------------------------------------------------------------------------
    def _lap(self, phase: str) -> None:
        """Charge the time since the last lap to `phase` of the current batch (see `timings`)."""
        t = time.perf_counter()
        self.timings[phase] = self.timings.get(phase, 0.0) + t - self._t_lap
        self._t_lap = t

    def _start(self) -> None:
        self.timings = {}
        self._t_lap = time.perf_counter()
        self.model.check_file()  # mapped weights: refuse a file changed in place (one fstat)

    def clear(self) -> None:
        """Empty the KV cache (llama_memory_clear): every sequence, every cell."""
        with self._lock:
            for c in self.caches.values():
                c.clear()

    @contextlib.contextmanager
    def trial_params(self, ub: UBatch, graph_type: str = "decoder"):
        """The GraphParams a batch would be built with, its cells taken in the cache only while
        the block runs: what building a graph alone (no compute) needs, as a benchmark times it."""
        with self._lock:
            snaps = {k: c.snapshot() for k, c in self.caches.items()}
            try:
                mem = {}
                if graph_type != "encoder":
                    for k, c in self.caches.items():
                        idxs = c.find_slot(ub)
                        c.apply_ubatch(idxs, ub)
                        mem[k] = MemSlot(c, idxs, c.get_n_kv())
                yield GraphParams(model=self.model, ubatch=ub, mem=mem, flash_attn=self.flash_attn,
                                  causal_attn=self.hparams.causal_attn, max_nodes=self.max_nodes,
                                  graph_type=graph_type)
            finally:
                for k, c in self.caches.items():
                    c.restore(snaps[k])

    def decode(self, ub: UBatch, recorder=None, _started: bool = False) -> Result:
        if not _started:
            self._start()
        with self._lock:
            self._check_positions(ub)
            self._lap("validate")
            snaps = {k: c.snapshot() for k, c in self.caches.items()}
            try:
                mem = {}
                for k, c in self.caches.items():
                    idxs = c.find_slot(ub)
                    c.apply_ubatch(idxs, ub)
                    mem[k] = MemSlot(c, idxs, c.get_n_kv())
                self._lap("kv")
                res = self._compute(ub, mem, recorder)
            except BaseException:
                for k, c in self.caches.items():
                    c.restore(snaps[k])
                raise
            for k, c in self.caches.items():
                c.commit(snaps[k])
            return res

    def _signature(self, ub: UBatch, mem: dict, graph_type: str) -> tuple:
        """What a graph's structure depends on: the batch's shapes, never its values."""
        return (graph_type, ub.is_embd, ub.n_tokens, len(set(ub.seq.tolist())), ub.embd_state is not None,
                tuple((k, m.n_kv) for k, m in sorted(mem.items())))

    def _slot(self, kind: str) -> "GraphSlot":
        slot = self._scheds.get(kind)
        if slot is None:
            shared = next(iter(self._scheds.values())).sched if self._scheds and self._share_sched else None
            if shared is None:
                n = len(self.backends)
                arr = (ctypes.c_void_p * n)(*self.backends)
                shared = G.ggml_backend_sched_new(arr, None, n, graph_capacity(self.max_nodes), False, True)
            slot = self._scheds[kind] = GraphSlot(shared)
        return slot

    def _drop(self, slot: "GraphSlot") -> None:
        if slot.graph is not None and self._allocated.get(slot.sched) is slot.graph:
            self._allocated[slot.sched] = None
        slot.drop()

    def _unplace(self, g) -> None:
        """Forget where the scheduler put g's tensors (its buffer moved), so that the next
        allocation places them afresh; weights and KV cache tensors stay where they are."""
        keep = {self.model.buffer} | {c.buffer for c in self.caches.values()}
        # every tensor the allocator placed: nodes, inputs, and leaves that are neither (a shape
        # a fill starts from): one left behind keeps a pointer to the freed buffer, which the
        # scheduler reads when it next assigns the graph's backends
        for c in _graph_tensors(g):
            if c.buffer and c.buffer not in keep:
                c.data = None
                c.buffer = None
        g.placed = False
        g.moved = True

    def _sched_size(self, sched) -> int:
        return sum(int(G.ggml_backend_sched_get_buffer_size(sched, b)) for b in self.backends)

    def _allocate(self, slot: "GraphSlot", g, for_sched: bool) -> None:
        """Give g's tensors their places in the compute buffer; for_sched: also make g the graph
        the scheduler's own state (its splits) describes, which computing through it needs.

        On one backend every graph kind shares one scheduler, so one compute buffer, as large as
        the largest graph, as llama.cpp's. A graph placed once keeps its places (ggml's
        allocator leaves tensors that have data alone, and only one graph computes at a time),
        and is computed on the backend directly, so a drafting loop that alternates inject and
        block graphs allocates nothing. Only a new graph that grows the buffer moves it; the
        other kinds' graphs then lose their places and are placed afresh when next used."""
        if self._allocated.get(slot.sched) is g or (g.placed and not for_sched):
            return
        # outputs still held in the buffer are read before it is reused or moved
        for other in self._scheds.values():
            if other.sched == slot.sched:
                other.settle()
        before = self._sched_size(slot.sched)
        if g.moved:
            self.stats["replaced"] += 1
            g.moved = False
        G.ggml_backend_sched_reset(slot.sched)
        if not G.ggml_backend_sched_alloc_graph(slot.sched, g.gf):
            self._allocated[slot.sched] = None
            raise MemoryError("the scheduler could not allocate the graph")
        self._allocated[slot.sched] = g
        g.placed = True
        self.stats["allocs"] += 1
        if self._sched_size(slot.sched) > before:
            for other in self._scheds.values():
                if other is not slot and other.sched == slot.sched and other.graph is not None:
                    self._unplace(other.graph)
        if self._remote and self._sched_size(slot.sched) != before:
            # a moved buffer on an RPC server drops every graph the server has cached (its
            # free_buffer discards them all), while each scheduler's client side still holds the
            # uids of its splits and would ask for a recompute the server can no longer do; the
            # other schedulers' graphs are built afresh (new uids, sent whole) when next computed
            for other in self._scheds.values():
                if other.sched != slot.sched and other.graph is not None:
                    self._drop(other)
        # an input the graph does not use gets no memory and is never set; one that can be
        # written in place gets a numpy view of its memory, valid while g keeps its places
        g.live_inputs = [(t, values, _host_view(t) if hasattr(values, "into") else None)
                         for t, values in g.res.inputs if t.contents.buffer]

    def _compute(self, ub: UBatch, mem: dict, recorder, graph_type: str = "decoder") -> Result:
        causal = self.hparams.causal_attn if not ub.is_embd else True
        params = GraphParams(model=self.model, ubatch=ub, mem=mem, flash_attn=self.flash_attn,
                             causal_attn=causal, graph_type=graph_type, max_nodes=self.max_nodes)
        kind = "encoder" if graph_type == "encoder" else "inject" if ub.is_embd else "block"
        slot = self._slot(kind)
        sig = self._signature(ub, mem, graph_type)
        if self.reuse_graphs and slot.graph is not None and slot.sig == sig:
            g = slot.graph
            g.params = params
            self.stats["reuses"] += 1
        else:
            self._drop(slot)
            g = build_arch_graph(params)
            n_nodes = G.ggml_graph_n_nodes(g.gf)
            if n_nodes > self.max_nodes:
                g.free()
                raise GraphgenError(f"the {kind} graph has {n_nodes} nodes, more than llama.cpp's budget for this "
                                    f"draft ({self.max_nodes}: graph_max_nodes of {len(self.model.tensors)} tensors), "
                                    "on which llama.cpp aborts")
            g.res.set_outputs()
            self.stats["builds"] += 1
            # the graph's own order, before a backend's graph_optimize permutes its nodes in place
            g.node_order = {G.addr(G.ggml_graph_node(g.gf, i)): i for i in range(G.ggml_graph_n_nodes(g.gf))}
            g.placed = g.moved = False
            slot.graph, slot.sig = g, sig
        # one backend, no eval callback: compute the graph on the backend directly (the
        # scheduler would run it as one split on that backend all the same)
        direct = self._share_sched and recorder is None
        try:
            self._allocate(slot, g, for_sched=not direct)
        except MemoryError:
            self._drop(slot)
            raise
        cb_keep = None
        failed: list[BaseException] = []
        if recorder is not None:
            sched = slot.sched
            # the scheduler's copies of inputs for another backend carry no input flag: name them
            recorder.input_names = {G.tname(t) for t, _, _ in g.live_inputs}

            def _eval(t, ask, _ud):
                # an exception cannot cross the C callback (ctypes would print and drop it, and the
                # graph would go on): keep it, stop the compute, raise it once ggml returns; a
                # signal is only noted while ggml computes (staging.deferred) and stops it here
                if failed or pending():
                    return False
                try:
                    if not ask:
                        b = G.ggml_backend_sched_get_tensor_backend(sched, t)
                        recorder.record(ctypes.cast(t, ctypes.c_void_p).value,
                                        backend=G.ggml_backend_name(b).decode() if b else None)
                    return True
                except BaseException as e:  # noqa: BLE001 - Ctrl-C included
                    failed.append(e)
                    return False
            cb_keep = G.ggml_backend_sched_eval_callback(_eval)
            G.ggml_backend_sched_set_eval_callback(slot.sched, cb_keep, None)
        # otherwise no callback is set: the one a recorder sets is unset when its compute ends
        # computing overwrites the scheduler's buffer: outputs held there are read first
        for other in self._scheds.values():
            if other.results and other.sched == slot.sched:
                other.settle()
        self._lap("graph")
        try:
            # the scheduler reuses input memory for later nodes: inputs are set before every compute
            for t, values, view in g.live_inputs:
                if view is not None:
                    values.into(g.params, view)
                    continue
                arr = np.ascontiguousarray(values(g.params))
                G.ggml_backend_tensor_set(t, _address(arr), 0, arr.nbytes)
            self._lap("inputs")
            with deferred():
                if direct:
                    status = G.ggml_backend_graph_compute(self.backend, g.gf)
                else:
                    status = G.ggml_backend_sched_graph_compute(slot.sched, g.gf)
            self._lap("compute")
            if failed:
                raise failed[0]
            raise_pending()
            if status != 0:
                raise RuntimeError(f"ggml compute failed with status {status}")
            if recorder is not None and hasattr(recorder, "reorder"):
                recorder.reorder(g.node_order)
            res = Result(kind, G.ggml_graph_n_nodes(g.gf),
                         {"logits": g.res.t_logits, "embd": g.res.t_embd, "h_nextn": g.res.t_h_nextn})
            slot.results.append(weakref.ref(res))
            self.last_graph = {"n_nodes": res.n_nodes}
            self._lap("outputs")
            return res
        except BaseException:
            self._drop(slot)
            raise
        finally:
            if cb_keep is not None:
                G.ggml_backend_sched_set_eval_callback(slot.sched, _NO_CALLBACK, None)
            del cb_keep

    @property
    def type_kv(self) -> str:
        """One name for both caches, or "K/V" when they differ."""
        return self.type_k if self.type_k == self.type_v else f"{self.type_k}/{self.type_v}"

    def compute_buffer_size(self) -> int:
        return sum(self._sched_size(sched) for sched in {slot.sched for slot in self._scheds.values()})

    def encode(self, features, pos0: int = 0, seq: int = 0, recorder=None) -> Result:
        """The encoder graph: target features through fc and the encoder norm, no KV cache."""
        self._start()
        ub = self.make_inject(features, pos0, seq)
        with self._lock:
            self._check_positions(ub)
            self._lap("validate")
            return self._compute(ub, {}, recorder, graph_type="encoder")

    def inject(self, features, pos0: int, seq: int = 0, recorder=None) -> Result:
        self._start()
        return self.decode(self.make_inject(features, pos0, seq), recorder, _started=True)

    def block(self, tokens, pos0: int, seq: int = 0, recorder=None, embd_state=None) -> Result:
        self._start()
        return self.decode(self.make_block([(seq, tokens, pos0)], embd_state), recorder, _started=True)

    def block_multi(self, blocks, recorder=None, embd_state=None) -> Result:
        self._start()
        return self.decode(self.make_block(blocks, embd_state), recorder, _started=True)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1):
        with self._lock:
            for c in self.caches.values():
                c.seq_rm(seq, p0, p1)

    def settings(self, graph: str) -> dict:
        return {"flash_attn": self.flash_attn, "type_k": self.type_k, "type_v": self.type_v,
                "n_ctx": self.n_ctx, "n_ubatch": self.n_ubatch, "n_kv": None,
                "causal": self.hparams.causal_attn if graph == "block" else True}

    def close(self):
        for slot in getattr(self, "_scheds", {}).values():
            slot.drop()
        for sched in {slot.sched for slot in getattr(self, "_scheds", {}).values()}:
            G.ggml_backend_sched_free(sched)
        self._scheds = {}
        for c in getattr(self, "caches", {}).values():
            c.free()
        self.caches = {}
        if getattr(self, "model", None) is not None:
            self.model.close()
        for b in getattr(self, "backends", []):
            G.ggml_backend_free(b)
        self.backends = []
        self.backend = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
