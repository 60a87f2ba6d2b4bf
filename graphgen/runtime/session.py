"""Session: a backend, a loaded draft and its KV cache; batches in, numpy results out.

Per batch: validate it (ggml asserts would kill the interpreter), take KV slots, build the
graph for the batch's shapes, let the scheduler allocate it, set the inputs, compute, read the
outputs. A batch that fails leaves the cache as it was.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field

import numpy as np

from .. import validate as V
from ..graph import GRAPH_MAX_NODES, GraphParams, MemSlot
from ..models.arch import build_arch_graph
from ..ops import ggml as G
from .backends import open_backend
from .kvcache import KVCache, UBatch
from .model import Model, load

KV_TYPES = {"f32": G.GGML_TYPE_F32, "f16": G.GGML_TYPE_F16}


@dataclass
class Result:
    graph: str
    logits: np.ndarray | None = None     # [n_tokens, n_vocab]
    embd: np.ndarray | None = None       # [n_tokens, n_embd]
    h_nextn: np.ndarray | None = None
    n_nodes: int = 0
    extra: dict = field(default_factory=dict)


def _read(t, shape_from=None) -> np.ndarray | None:
    if t is None or not t.contents.buffer:
        return None
    c = t.contents
    out = np.empty((c.ne[3], c.ne[2], c.ne[1], c.ne[0]), dtype=np.float32)
    if c.type != G.GGML_TYPE_F32:
        return None
    G.ggml_backend_tensor_get(t, out.ctypes.data, 0, out.nbytes)
    return out.reshape(-1, c.ne[0]) if c.ne[2] * c.ne[3] == 1 else out


_NO_CALLBACK = G.ggml_backend_sched_eval_callback(0)


class GraphSlot:
    """A scheduler and the graph it last allocated."""

    def __init__(self, sched):
        self.sched = sched
        self.graph = None
        self.sig = None

    def drop(self):
        if self.graph is not None:
            self.graph.free()
        self.graph, self.sig = None, None


class Session:
    def __init__(self, model, *, n_ctx: int = 256, n_ubatch: int = 64, flash_attn: bool = False,
                 type_kv: str = "f16", n_seq: int = 1, n_threads: int = 1, backend: str = "cpu",
                 reuse_graphs: bool = True):
        if type_kv not in KV_TYPES:
            raise ValueError(f"type_kv must be one of {', '.join(KV_TYPES)}, got {type_kv!r} "
                             "(quantized caches need Hadamard rotations graphgen does not build)")
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
        self.model = model if isinstance(model, Model) else load(model)
        if self.model.backend is None:
            self.model.upload(self.backend)
        self.hparams = hp = self.model.hparams
        self.n_ctx, self.n_ubatch, self.n_seq = n_ctx, n_ubatch, n_seq
        self.flash_attn = flash_attn
        self.type_kv = type_kv
        self.n_threads = n_threads
        t = KV_TYPES[type_kv]
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
            self.caches = {"base": KVCache(hp, base_layers, n_ctx, t, t, v_trans, 0, self.backend, k_only=k_only),
                           "swa": KVCache(hp, swa_layers, size_swa, t, t, v_trans, hp.n_swa, self.backend,
                                          k_only=k_only)}
        else:
            self.caches = {"base": KVCache(hp, range(hp.n_layer), n_ctx, t, t, v_trans, 0, self.backend)}
        # one scheduler per graph kind, each keeping its last graph: a drafting loop alternates
        # inject and block graphs, and each is reused while its shapes repeat
        self._scheds: dict[str, GraphSlot] = {}
        self.stats = {"builds": 0, "allocs": 0, "reuses": 0}
        self.reuse_graphs = reuse_graphs
        self.last_graph = None

    # -- batches ----------------------------------------------------------------------------
    def _check_common(self, pos, seq):
        V.check_batch(pos, seq, self.n_ubatch, self.n_seq)

    def make_inject(self, features, pos0: int, seq: int = 0) -> UBatch:
        x = V.check_features(features, self.hparams.n_embd_inp_enc)
        n = x.shape[0]
        pos0 = V.check_positions(pos0, n, "inject")
        seq = V.check_seq(seq, self.n_seq)
        pos = np.arange(pos0, pos0 + n, dtype=np.int32)
        sq = np.full(n, seq, dtype=np.int32)
        self._check_common(pos, sq)
        return UBatch(pos=pos, seq=sq, embd=x)

    def make_block(self, blocks, embd_state=None) -> UBatch:
        """blocks: [(seq, tokens, pos0), ...] into one batch, in that order."""
        tokens, pos_a, seq_a = V.block_arrays(blocks, self.model.variant, self.hparams.n_vocab,
                                              self.hparams.block_size)
        self._check_common(pos_a, seq_a)
        st = V.check_embd_state(embd_state, tokens.size, self.hparams.n_embd)
        return UBatch(pos=pos_a, seq=seq_a, tokens=tokens, embd_state=st)

    def seq_pos_max(self, seq: int) -> int:
        """The last position the KV cache holds for `seq`, -1 when it holds none."""
        return max(c.seq_pos_max(seq) for c in self.caches.values())

    def _check_positions(self, ub: UBatch) -> None:
        # llama.cpp checks every batch's positions against the cache, the encoder's too
        V.check_seq_positions(ub.pos, ub.seq, self.seq_pos_max, self.hparams.n_pos_per_embd > 1, ub.is_embd)

    # -- compute ----------------------------------------------------------------------------
    def decode(self, ub: UBatch, recorder=None) -> Result:
        with self._lock:
            self._check_positions(ub)
            snaps = {k: c.snapshot() for k, c in self.caches.items()}
            try:
                mem = {}
                for k, c in self.caches.items():
                    idxs = c.find_slot(ub)
                    c.apply_ubatch(idxs, ub)
                    mem[k] = MemSlot(c, idxs, c.get_n_kv())
                return self._compute(ub, mem, recorder)
            except BaseException:
                for k, c in self.caches.items():
                    c.restore(snaps[k])
                raise

    def _signature(self, ub: UBatch, mem: dict, graph_type: str) -> tuple:
        """What a graph's structure depends on: the batch's shapes, never its values."""
        return (graph_type, ub.is_embd, ub.n_tokens, len(set(ub.seq.tolist())), ub.embd_state is not None,
                tuple((k, m.n_kv) for k, m in sorted(mem.items())))

    def _slot(self, kind: str) -> "GraphSlot":
        slot = self._scheds.get(kind)
        if slot is None:
            n = len(self.backends)
            arr = (ctypes.c_void_p * n)(*self.backends)
            sched = G.ggml_backend_sched_new(arr, None, n, GRAPH_MAX_NODES, False, True)
            slot = self._scheds[kind] = GraphSlot(sched)
        return slot

    def _compute(self, ub: UBatch, mem: dict, recorder, graph_type: str = "decoder") -> Result:
        causal = self.hparams.causal_attn if not ub.is_embd else True
        params = GraphParams(model=self.model, ubatch=ub, mem=mem, flash_attn=self.flash_attn,
                             causal_attn=causal, graph_type=graph_type)
        kind = "encoder" if graph_type == "encoder" else "inject" if ub.is_embd else "block"
        slot = self._slot(kind)
        sig = self._signature(ub, mem, graph_type)
        if self.reuse_graphs and slot.graph is not None and slot.sig == sig:
            g = slot.graph
            g.params = params
            self.stats["reuses"] += 1
        else:
            slot.drop()
            g = build_arch_graph(params)
            g.res.set_outputs()
            self.stats["builds"] += 1
            # the graph's own order, before a backend's graph_optimize permutes its nodes in place
            g.node_order = {G.addr(G.ggml_graph_node(g.gf, i)): i for i in range(G.ggml_graph_n_nodes(g.gf))}
            G.ggml_backend_sched_reset(slot.sched)
            if not G.ggml_backend_sched_alloc_graph(slot.sched, g.gf):
                g.free()
                raise MemoryError("the scheduler could not allocate the graph")
            self.stats["allocs"] += 1
            slot.graph, slot.sig = g, sig
        cb_keep = None
        if recorder is not None:
            sched = slot.sched

            def _eval(t, ask, _ud):
                if not ask:
                    b = G.ggml_backend_sched_get_tensor_backend(sched, t)
                    recorder.record(ctypes.cast(t, ctypes.c_void_p).value,
                                    backend=G.ggml_backend_name(b).decode() if b else None)
                return True
            cb_keep = G.ggml_backend_sched_eval_callback(_eval)
            G.ggml_backend_sched_set_eval_callback(slot.sched, cb_keep, None)
        else:
            G.ggml_backend_sched_set_eval_callback(slot.sched, _NO_CALLBACK, None)
        try:
            # the scheduler reuses input memory for later nodes: inputs are set before every compute
            for t, values in g.res.inputs:
                if not t.contents.buffer:
                    continue  # an input the graph does not use has no memory
                arr = np.ascontiguousarray(values(g.params))
                G.ggml_backend_tensor_set(t, arr.ctypes.data, 0, arr.nbytes)
            status = G.ggml_backend_sched_graph_compute(slot.sched, g.gf)
            if status != 0:
                raise RuntimeError(f"ggml compute failed with status {status}")
            if recorder is not None and hasattr(recorder, "reorder"):
                recorder.reorder(g.node_order)
            res = Result(graph=kind, n_nodes=G.ggml_graph_n_nodes(g.gf))
            res.logits = _read(g.res.t_logits)
            res.embd = _read(g.res.t_embd)
            res.h_nextn = _read(g.res.t_h_nextn)
            self.last_graph = {"n_nodes": res.n_nodes}
            return res
        except BaseException:
            slot.drop()
            raise
        finally:
            if cb_keep is not None:
                G.ggml_backend_sched_set_eval_callback(slot.sched, _NO_CALLBACK, None)
            del cb_keep

    def compute_buffer_size(self) -> int:
        total = 0
        for slot in self._scheds.values():
            for b in self.backends:
                total += int(G.ggml_backend_sched_get_buffer_size(slot.sched, b))
        return total

    def encode(self, features, pos0: int = 0, seq: int = 0, recorder=None) -> Result:
        """The encoder graph: target features through fc and the encoder norm, no KV cache."""
        ub = self.make_inject(features, pos0, seq)
        with self._lock:
            self._check_positions(ub)
            return self._compute(ub, {}, recorder, graph_type="encoder")

    def inject(self, features, pos0: int, seq: int = 0, recorder=None) -> Result:
        return self.decode(self.make_inject(features, pos0, seq), recorder)

    def block(self, tokens, pos0: int, seq: int = 0, recorder=None, embd_state=None) -> Result:
        return self.decode(self.make_block([(seq, tokens, pos0)], embd_state), recorder)

    def block_multi(self, blocks, recorder=None, embd_state=None) -> Result:
        return self.decode(self.make_block(blocks, embd_state), recorder)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1):
        with self._lock:
            for c in self.caches.values():
                c.seq_rm(seq, p0, p1)

    def settings(self, graph: str) -> dict:
        return {"flash_attn": self.flash_attn, "type_k": self.type_kv, "type_v": self.type_kv,
                "n_ctx": self.n_ctx, "n_ubatch": self.n_ubatch, "n_kv": None,
                "causal": self.hparams.causal_attn if graph == "block" else True}

    def close(self):
        for slot in getattr(self, "_scheds", {}).values():
            slot.drop()
            G.ggml_backend_sched_free(slot.sched)
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
