"""The KV cache, as llama_kv_cache (unified, one stream) keeps it for the DFlash graphs.

Cells hold a position and a set of sequences. A batch takes slots from `head` on (empty cells,
or cells of one sequence that its sliding window masks), K/V are written with set_rows through
index inputs, and the graph reads views over the first n_kv cells, n_kv padded to 256.
With flash attention off the V cache is transposed, one row per head element.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import KVCacheFullError
from ..ops import ggml as G

N_KV_PAD = 256


@dataclass
class UBatch:
    """One graph's worth of tokens, in batch order."""
    pos: np.ndarray            # int32 [n_tokens]
    seq: np.ndarray            # int32 [n_tokens]
    tokens: np.ndarray | None = None   # int32 [n_tokens] for token batches
    embd: np.ndarray | None = None     # float32 [n_tokens, n_embd_inp] for injection batches
    embd_state: np.ndarray | None = None  # float32 [n_tokens, n_embd] (LiliCorr blocks)

    @property
    def n_tokens(self) -> int:
        return int(self.pos.shape[0])

    @property
    def is_embd(self) -> bool:
        return self.embd is not None


def is_masked_swa(n_swa: int, p0: int, p1: int) -> bool:
    """Standard sliding window: key p0 is out of the window of query p1."""
    return n_swa > 0 and p1 - p0 >= n_swa


class KVCache:
    def __init__(self, hparams, layer_ids, kv_size: int, type_k: int, type_v: int, v_trans: bool,
                 n_swa: int = 0, backend=None, k_only: bool = False, n_seq_max: int = 1):
        self.hparams = hparams
        # K-only caches (the DSpark DSV4 / ML4 backbones): attention reads V as a view of K
        self.k_only = k_only
        self.layer_ids = list(layer_ids)
        self.size = kv_size
        self.type_k, self.type_v = type_k, type_v
        self.v_trans = v_trans
        self.n_swa = n_swa
        self.pos = np.full(kv_size, -1, dtype=np.int64)
        self.seq_mask = np.zeros((n_seq_max, kv_size), dtype=bool)
        self.head = 0
        self.k: dict[int, object] = {}
        self.v: dict[int, object] = {}
        self._ctx = None
        self._buf = None
        if backend is not None and self.layer_ids:
            self._alloc(backend)

    # -- storage ----------------------------------------------------------------------------
    def _alloc(self, backend):
        n = 2 * len(self.layer_ids)
        params = G.ggml_init_params(mem_size=G.ggml_tensor_overhead() * (n + 2), mem_buffer=None, no_alloc=True)
        self._ctx = G.ggml_init(params)
        hp = self.hparams
        for il in self.layer_ids:
            k = G.ggml_new_tensor_3d(self._ctx, self.type_k, hp.n_embd_k_gqa, self.size, 1)
            v = None if self.k_only else G.ggml_new_tensor_3d(self._ctx, self.type_v, hp.n_embd_v_gqa, self.size, 1)
            G.set_name(k, f"cache_k_l{il}")
            self.k[il] = k
            if self.k_only:
                continue
            G.set_name(v, f"cache_v_l{il}")
            self.v[il] = v
        self._buf = G.ggml_backend_alloc_ctx_tensors(self._ctx, backend)
        if not self._buf:
            raise MemoryError("could not allocate the KV cache")
        G.ggml_backend_buffer_clear(self._buf, 0)

    @property
    def nbytes(self) -> int:
        return int(G.ggml_backend_buffer_get_size(self._buf)) if self._buf else 0

    def free(self):
        if self._buf:
            G.ggml_backend_buffer_free(self._buf)
            self._buf = None
        if self._ctx:
            G.ggml_free(self._ctx)
            self._ctx = None

    # -- cells ------------------------------------------------------------------------------
    # A cell holds a position (-1 when empty) and a set of sequences, kept as a bool matrix
    # [n_seq_max, size] so every query below is one numpy expression rather than a Python loop.
    def _ensure_seq(self, seq: int):
        if seq >= self.seq_mask.shape[0]:
            grow = np.zeros((seq + 1 - self.seq_mask.shape[0], self.size), dtype=bool)
            self.seq_mask = np.vstack([self.seq_mask, grow])

    def used(self) -> int:
        return int(np.count_nonzero(self.pos >= 0))

    def used_max_p1(self) -> int:
        nz = np.flatnonzero(self.pos >= 0)
        return int(nz[-1]) + 1 if nz.size else 0

    def seq_pos_max(self, seq: int) -> int:
        if seq >= self.seq_mask.shape[0]:
            return -1
        ps = self.pos[self.seq_mask[seq]]
        return int(ps.max()) if ps.size else -1

    def seq_pos_min(self, seq: int) -> int:
        if seq >= self.seq_mask.shape[0]:
            return -1
        ps = self.pos[self.seq_mask[seq]]
        return int(ps.min()) if ps.size else -1

    def find_slot(self, ub: UBatch) -> list[int]:
        """Cells for the batch's tokens, searched from head as upstream's find_slot (non-contiguous)."""
        n = ub.n_tokens
        if n > self.size:
            raise KVCacheFullError(f"a batch of {n} tokens is larger than the KV cache ({self.size} cells)")
        head = self.head
        if head > self.used() + 2 * n:
            head = 0
        # a cell is usable when empty, or held by one sequence whose window has moved past it
        can_use = self.pos < 0
        if self.n_swa > 0:
            counts = self.seq_mask.sum(axis=0)
            single = (counts == 1) & ~can_use
            if single.any():
                owner = np.argmax(self.seq_mask, axis=0)
                pmax = np.array([self.seq_pos_max(q) for q in range(self.seq_mask.shape[0])], dtype=np.int64)
                can_use |= single & ((pmax[owner] + 1 - self.pos) >= self.n_swa)
        order = np.concatenate([np.arange(head, self.size), np.arange(0, head)])
        found = order[can_use[order]][:n]
        if found.size < n:
            raise KVCacheFullError(f"the KV cache ({self.size} cells, {self.used()} used) has no room "
                                   f"for {n} more tokens; remove a sequence or raise n_ctx")
        return [int(i) for i in found]

    def apply_ubatch(self, idxs: list[int], ub: UBatch):
        idx = np.asarray(idxs, dtype=np.int64)
        rm_max: dict[int, int] = {}
        taken = idx[self.pos[idx] >= 0]
        for c in taken:  # reused out-of-window cells (one sequence each)
            q = int(np.argmax(self.seq_mask[:, c]))
            rm_max[q] = max(rm_max.get(q, -1), int(self.pos[c]))
        self.seq_mask[:, idx] = False
        self.pos[idx] = np.asarray(ub.pos, dtype=np.int64)
        seqs = np.asarray(ub.seq, dtype=np.int64)
        self._ensure_seq(int(seqs.max()))
        self.seq_mask[seqs, idx] = True
        # a sequence's overwritten (out-of-window) positions are purged as a range
        for q, pmax in rm_max.items():
            pmin = self.seq_pos_min(q)
            if 0 <= pmin <= pmax:
                self.seq_rm(q, pmin, pmax + 1)
        self.head = int(idx[-1]) + 1

    def snapshot(self):
        return self.pos.copy(), self.seq_mask.copy(), self.head

    def restore(self, snap):
        self.pos, self.seq_mask, self.head = snap[0].copy(), snap[1].copy(), snap[2]

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        p0 = max(p0, 0)
        p1 = np.iinfo(np.int64).max if p1 < 0 else p1
        in_range = (self.pos >= 0) & (self.pos >= p0) & (self.pos < p1)
        if seq < 0:
            hit = in_range
            self.seq_mask[:, hit] = False
        else:
            if seq >= self.seq_mask.shape[0]:
                return True
            hit = in_range & self.seq_mask[seq]
            self.seq_mask[seq, hit] = False
        freed = hit & ~self.seq_mask.any(axis=0)
        self.pos[freed] = -1
        nz = np.flatnonzero(freed)
        if nz.size and nz[0] < self.head:
            self.head = int(nz[0])
        return True

    def clear(self):
        self.pos[:] = -1
        self.seq_mask[:] = False
        self.head = 0

    def get_n_kv(self) -> int:
        used = self.used_max_p1()
        padded = -(-used // N_KV_PAD) * N_KV_PAD
        return min(self.size, max(N_KV_PAD, padded))

    # -- graph side -------------------------------------------------------------------------
    def build_input_k_idxs(self, ctx, n_tokens: int):
        t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I64, n_tokens)
        G.ggml_set_input(t)
        return G.set_name(t, "attn_inp_k_idxs")

    def build_input_v_idxs(self, ctx, n_tokens: int):
        n = n_tokens * self.hparams.n_embd_v_gqa if self.v_trans else n_tokens
        t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I64, n)
        G.ggml_set_input(t)
        return G.set_name(t, "attn_inp_v_idxs")

    def cpy_k(self, ctx, k_cur, k_idxs, il: int):
        k = self.k[il]
        n_embd_gqa = G.ne(k_cur, 0) * G.ne(k_cur, 1)
        # dims 0 and 1 merge: rows of one token are contiguous
        k_cur = G.ggml_view_2d(ctx, k_cur, n_embd_gqa, G.ne(k_cur, 2), G.nb(k_cur, 2), 0)
        return G.ggml_set_rows(ctx, k, k_cur, k_idxs)

    def cpy_v(self, ctx, v_cur, v_idxs, il: int):
        v = self.v[il]
        n_embd_gqa = G.ne(v_cur, 0) * G.ne(v_cur, 1)
        n_tokens = G.ne(v_cur, 2)
        if not self.v_trans:
            v_cur = G.ggml_view_2d(ctx, v_cur, n_embd_gqa, n_tokens, G.nb(v_cur, 2), 0)
            return G.ggml_set_rows(ctx, v, v_cur, v_idxs)
        if G.ggml_row_size(G.ttype(v_cur), n_embd_gqa) == G.nb(v_cur, 2):
            v_cur = G.ggml_reshape_2d(ctx, v_cur, n_embd_gqa, n_tokens)
        else:
            v_cur = G.ggml_cont_2d(ctx, v_cur, n_embd_gqa, n_tokens)
        # each row of the transposed cache is a single head element
        v_view = G.ggml_reshape_2d(ctx, v, 1, G.nelements(v))
        v_cur = G.ggml_reshape_2d(ctx, v_cur, 1, G.nelements(v_cur))
        return G.ggml_set_rows(ctx, v_view, v_cur, v_idxs)

    def get_k(self, ctx, il: int, n_kv: int):
        k = self.k[il]
        hp = self.hparams
        rs = lambda n: G.ggml_row_size(G.ttype(k), n)  # noqa: E731
        return G.ggml_view_4d(ctx, k, hp.n_embd_head_k, hp.n_head_kv, n_kv, 1,
                              rs(hp.n_embd_head_k), rs(hp.n_embd_k_gqa), rs(hp.n_embd_k_gqa * self.size), 0)

    def get_v(self, ctx, il: int, n_kv: int):
        v = self.v[il]
        hp = self.hparams
        rs = lambda n: G.ggml_row_size(G.ttype(v), n)  # noqa: E731
        if not self.v_trans:
            return G.ggml_view_4d(ctx, v, hp.n_embd_head_v, hp.n_head_kv, n_kv, 1,
                                  rs(hp.n_embd_head_v), rs(hp.n_embd_v_gqa), rs(hp.n_embd_v_gqa * self.size), 0)
        return G.ggml_view_4d(ctx, v, n_kv, hp.n_head_kv, hp.n_embd_head_v, 1,
                              rs(self.size * hp.n_embd_head_v), rs(self.size),
                              rs(self.size * hp.n_embd_v_gqa), 0)

    # -- input values -----------------------------------------------------------------------
    def k_idxs_values(self, idxs: list[int]) -> np.ndarray:
        return np.asarray(idxs, dtype=np.int64)

    def v_idxs_values(self, idxs: list[int]) -> np.ndarray:
        if not self.v_trans:
            return np.asarray(idxs, dtype=np.int64)
        n_gqa = self.hparams.n_embd_v_gqa
        j = np.arange(n_gqa, dtype=np.int64)
        return (j[None, :] * self.size + np.asarray(idxs, dtype=np.int64)[:, None]).reshape(-1)

    def kq_mask_values(self, ub: UBatch, n_kv: int, causal: bool, dtype, block_uniform: bool = False) -> np.ndarray:
        """[n_tokens, n_kv]: 0 where a query sees a key, -inf where it does not.

        block_uniform (the seed's DSV4.1 / ML4 SWA mask): every query row of a block, the batch's
        tokens of one sequence, is the row of the block's first query, the anchor."""
        if block_uniform:
            out = self.kq_mask_values(ub, n_kv, causal, np.float32)
            seq = np.asarray(ub.seq)
            for s in np.unique(seq):
                rows = np.nonzero(seq == s)[0]
                out[rows] = out[rows[0]]
            return out.astype(dtype)
        pos = self.pos[:n_kv]
        seq = np.asarray(ub.seq, dtype=np.int64)
        self._ensure_seq(int(seq.max()))
        keep = self.seq_mask[seq, :n_kv] & (pos >= 0)[None, :]   # [n_tokens, n_kv]
        p1 = np.asarray(ub.pos, dtype=np.int64)[:, None]
        if causal:
            keep &= pos[None, :] <= p1
        if self.n_swa > 0:
            keep &= (p1 - pos[None, :]) < self.n_swa
        out = np.where(keep, np.float32(0.0), np.float32(-np.inf))
        return out.astype(dtype)
