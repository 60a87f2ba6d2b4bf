"""The KV cache, as llama_kv_cache (unified, one stream) keeps it for the DFlash graphs.

Cells hold a position and a set of sequences. A batch takes slots from `head` on (empty cells,
or cells of one sequence that its sliding window masks), K/V are written with set_rows through
index inputs, and the graph reads views over the first n_kv cells, n_kv padded to 256.
With flash attention off the V cache is transposed, one row per head element.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import GraphgenError, KVCacheFullError
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
    # (seq, pos0, n) per run of consecutive positions, when the batch is such runs of distinct
    # sequences (what drivers send): its position checks then cost O(runs)
    runs: list | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.pos.shape[0])

    @property
    def is_embd(self) -> bool:
        return self.embd is not None


class KVCache:
    def __init__(self, hparams, layer_ids, kv_size: int, type_k: int, type_v: int, v_trans: bool,
                 n_swa: int = 0, backend=None, k_only: bool = False, n_seq_max: int = 1):
        self.hparams = hparams
        # K-only caches (the DSpark DSV4 / ML4 backbones): attention reads V as a view of K
        self.k_only = k_only
        self.layer_ids = list(layer_ids)
        self.size = kv_size
        self.type_k, self.type_v = type_k, type_v
        self.n_rot_k, self.n_rot_v = self._rotations()
        self.v_trans = v_trans
        self.n_swa = n_swa
        self.pos = np.full(kv_size, -1, dtype=np.int64)
        self.seq_mask = np.zeros((n_seq_max, kv_size), dtype=bool)
        self.head = 0
        self._stats = None     # [cells used, last used cell + 1, pos max per seq, pos min per seq]
        self._journal = None   # changes since the outermost open snapshot
        self._v_rows = None
        self.k: dict[int, object] = {}
        self.v: dict[int, object] = {}
        self._ctx = None
        self._buf = None
        if backend is not None and self.layer_ids:
            self._alloc(backend)

    def _rotations(self) -> tuple[int, int]:
        """Orders of the Hadamard rotations applied before a quantized cache (0: none), as
        llama_kv_cache sizes them. Rotating spreads outliers over a head, so the blocks quantize
        with less error; K takes the largest power of two >= 64 dividing the head, V takes 64.
        LLAMA_ATTN_ROT_DISABLE turns them off here as it does in llama.cpp."""
        if not self.layer_ids or int(os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0") or 0):
            return 0, 0
        hp = self.hparams
        n_rot_k = n_rot_v = 0
        if G.ggml_is_quantized(self.type_k) and hp.n_embd_head_k % 64 == 0:
            n_rot_k = 64
            while hp.n_embd_head_k % (2 * n_rot_k) == 0:
                n_rot_k *= 2
        # a K-only cache has no V rows of its own (V is a view of the rotated K)
        if not self.k_only and G.ggml_is_quantized(self.type_v) and hp.n_embd_head_v % 64 == 0:
            n_rot_v = 64
        return n_rot_k, n_rot_v

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
    def buffer(self):
        """The backend buffer holding the cache's tensors (None before allocation)."""
        return self._buf

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
    # What every batch asks (cells used, the last used cell, each sequence's first and last
    # position) is kept up to date as batches land, so a step costs O(tokens), not O(cells);
    # seq_rm and restore recompute it on the next query. Changes made while a snapshot is open
    # are journaled (the cells a batch takes, with what they held), so restoring undoes them
    # without copying the whole cache.
    def _ensure_seq(self, seq: int):
        if seq >= self.seq_mask.shape[0]:
            self._journal_full()
            grow = np.zeros((seq + 1 - self.seq_mask.shape[0], self.size), dtype=bool)
            self.seq_mask = np.vstack([self.seq_mask, grow])
            self._stats = None

    def _compute_stats(self):
        used = self.pos >= 0
        nz = np.flatnonzero(used)
        held = np.where(self.seq_mask, self.pos[None, :], -1)
        pmax = held.max(axis=1) if self.size else np.full(self.seq_mask.shape[0], -1)
        pmin = np.where(self.seq_mask, self.pos[None, :], np.iinfo(np.int64).max).min(axis=1) \
            if self.size else np.full(self.seq_mask.shape[0], -1)
        pmin = np.where(pmax >= 0, pmin, -1)
        self._stats = [int(nz.size), int(nz[-1]) + 1 if nz.size else 0, pmax.astype(np.int64), pmin.astype(np.int64)]
        return self._stats

    def _get_stats(self):
        return self._stats if self._stats is not None else self._compute_stats()

    def used(self) -> int:
        return self._get_stats()[0]

    def used_max_p1(self) -> int:
        return self._get_stats()[1]

    def seq_pos_max(self, seq: int) -> int:
        pmax = self._get_stats()[2]
        return int(pmax[seq]) if 0 <= seq < pmax.shape[0] else -1

    def seq_pos_min(self, seq: int) -> int:
        pmin = self._get_stats()[3]
        return int(pmin[seq]) if 0 <= seq < pmin.shape[0] else -1

    def find_slot(self, ub: UBatch) -> np.ndarray:
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
                pmax = self._get_stats()[2]
                can_use |= single & ((pmax[owner] + 1 - self.pos) >= self.n_swa)
        found = np.flatnonzero(can_use[head:])[:n] + head
        if found.size < n:
            found = np.concatenate([found, np.flatnonzero(can_use[:head])[:n - found.size]])
        if found.size < n:
            raise KVCacheFullError(f"the KV cache ({self.size} cells, {self.used()} used) has no room "
                                   f"for {n} more tokens; remove a sequence or raise n_ctx")
        return found.astype(np.int64)

    def apply_ubatch(self, idxs, ub: UBatch):
        idx = np.asarray(idxs, dtype=np.int64)
        old_pos = self.pos[idx]
        if ub.runs is not None and self._stats is not None and not (old_pos >= 0).any():
            self._apply_runs(idx, ub)
            return
        seqs = np.asarray(ub.seq, dtype=np.int64)
        self._ensure_seq(int(seqs.max()))
        if self._journal is not None:
            self._journal.append(("cells", idx, old_pos.copy(), self.seq_mask[:, idx].copy()))
        rm_max: dict[int, int] = {}
        taken = idx[old_pos >= 0]
        for c in taken:  # reused out-of-window cells (one sequence each)
            q = int(np.argmax(self.seq_mask[:, c]))
            rm_max[q] = max(rm_max.get(q, -1), int(self.pos[c]))
        self.seq_mask[:, idx] = False
        pos = np.asarray(ub.pos, dtype=np.int64)
        self.pos[idx] = pos
        self.seq_mask[seqs, idx] = True
        if taken.size:
            self._stats = None
        elif self._stats is not None:
            st = self._stats
            st[0] += int(idx.size)
            st[1] = max(st[1], int(idx.max()) + 1)
            s0 = int(seqs[0])
            if (seqs == s0).all():
                st[2][s0] = max(st[2][s0], int(pos.max()))
                st[3][s0] = int(pos.min()) if st[3][s0] < 0 else min(st[3][s0], int(pos.min()))
            else:
                np.maximum.at(st[2], seqs, pos)
                lo = st[3].copy()
                lo[lo < 0] = np.iinfo(np.int64).max
                np.minimum.at(lo, seqs, pos)
                st[3] = np.where(lo == np.iinfo(np.int64).max, -1, lo)
        # a sequence's overwritten (out-of-window) positions are purged as a range
        for q, pmax in rm_max.items():
            pmin = self.seq_pos_min(q)
            if 0 <= pmin <= pmax:
                self.seq_rm(q, pmin, pmax + 1)
        self.head = int(idx[-1]) + 1

    def _apply_runs(self, idx: np.ndarray, ub: UBatch):
        """apply_ubatch for a batch of runs (ub.runs) landing on empty cells, the common case:
        the journal needs only the cells (they were empty), the bookkeeping only the runs."""
        runs = ub.runs
        top = max(s for s, _, _ in runs)
        self._ensure_seq(top)
        if self._journal is not None:
            self._journal.append(("empty", idx))
        st = self._get_stats()  # before the cells change (growing the sequence rows drops it)
        self.pos[idx] = ub.pos
        if len(runs) == 1:
            s, p0, n = runs[0]
            self.seq_mask[s, idx] = True
        else:
            self.seq_mask[ub.seq, idx] = True
        st[0] += int(idx.size)
        st[1] = max(int(st[1]), int(idx.max()) + 1)
        for s, p0, n in runs:
            st[2][s] = max(int(st[2][s]), p0 + n - 1)
            st[3][s] = p0 if st[3][s] < 0 else min(int(st[3][s]), p0)
        self.head = int(idx[-1]) + 1

    def _journal_full(self):
        if self._journal is not None:
            self._journal.append(("full", self.pos.copy(), self.seq_mask.copy()))

    def snapshot(self):
        """Open a snapshot: restore(snap) undoes every change since; commit(snap) keeps them."""
        if self._journal is None:
            self._journal = []
        return len(self._journal), self.head

    def restore(self, snap):
        mark, head = snap
        while len(self._journal) > mark:
            entry = self._journal.pop()
            if entry[0] == "full":
                self.pos, self.seq_mask = entry[1], entry[2]
            elif entry[0] == "empty":
                self.pos[entry[1]] = -1
                self.seq_mask[:, entry[1]] = False
            else:
                _, idx, pos, mask = entry
                self.pos[idx] = pos
                self.seq_mask[:mask.shape[0], idx] = mask
                self.seq_mask[mask.shape[0]:, idx] = False
        self.head = head
        self._stats = None
        if mark == 0:
            self._journal = None

    def commit(self, snap):
        if snap[0] == 0:
            self._journal = None

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        p0 = max(p0, 0)
        p1 = np.iinfo(np.int64).max if p1 < 0 else p1
        in_range = (self.pos >= 0) & (self.pos >= p0) & (self.pos < p1)
        if seq >= self.seq_mask.shape[0]:
            return True
        self._journal_full()
        if seq < 0:
            hit = in_range
            self.seq_mask[:, hit] = False
        else:
            hit = in_range & self.seq_mask[seq]
            self.seq_mask[seq, hit] = False
        freed = hit & ~self.seq_mask.any(axis=0)
        self.pos[freed] = -1
        nz = np.flatnonzero(freed)
        if nz.size and nz[0] < self.head:
            self.head = int(nz[0])
        st = self._stats
        if seq < 0 or st is None:
            self._stats = None
        else:
            # only `seq` lost positions; cells it shared with others stay used
            st[0] -= int(nz.size)
            if nz.size and int(nz[-1]) + 1 == st[1]:
                used = np.flatnonzero(self.pos[:st[1]] >= 0)
                st[1] = int(used[-1]) + 1 if used.size else 0
            ps = self.pos[self.seq_mask[seq]]
            st[2][seq], st[3][seq] = (int(ps.max()), int(ps.min())) if ps.size else (-1, -1)
        return True

    def clear(self):
        self._journal_full()
        self.pos[:] = -1
        self.seq_mask[:] = False
        self.head = 0
        n = self.seq_mask.shape[0]
        self._stats = [0, 0, np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)]

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
        if self._v_rows is None:  # the first row of each head element, in the transposed cache
            self._v_rows = np.arange(self.hparams.n_embd_v_gqa, dtype=np.int64) * self.size
        return (self._v_rows[None, :] + np.asarray(idxs, dtype=np.int64)[:, None]).reshape(-1)

    def kq_mask_values(self, ub: UBatch, n_kv: int, causal: bool, dtype, block_uniform: bool = False,
                       out: np.ndarray | None = None) -> np.ndarray:
        """[n_tokens, n_kv]: 0 where a query sees a key, -inf where it does not; written into
        `out` when given (the input tensor's own memory, on a host backend).

        block_uniform (the seed's DSV4.1 / ML4 SWA mask): every query row of a block, the batch's
        tokens of one sequence, is the row of the block's first query, the anchor."""
        if block_uniform:
            full = self.kq_mask_values(ub, n_kv, causal, np.float32)
            seq = np.asarray(ub.seq)
            for s in np.unique(seq):
                rows = np.nonzero(seq == s)[0]
                full[rows] = full[rows[0]]
            if out is None:
                return full.astype(dtype)
            out[...] = full
            return out
        # A query at position p sees a cell of its sequence at position q when q <= p (causal)
        # and p - q < n_swa (sliding window). Within a sequence the queries' positions span a
        # short range, so almost every cell is seen by all of the sequence's rows or by none:
        # one row is computed per sequence and copied, and only the cells whose position falls
        # inside the queries' range are decided per row. O(n_kv) per sequence plus the copy.
        pos = self.pos[:n_kv]
        seq, p1 = ub.seq, ub.pos.astype(np.int64)
        self._ensure_seq(int(seq.max()))
        zero, ninf = np.array([0.0, -np.inf], dtype=dtype)
        if out is None:
            out = np.empty((seq.shape[0], n_kv), dtype=dtype)
        elif out.shape != (seq.shape[0], n_kv) or out.dtype != np.dtype(dtype):
            raise ValueError(f"mask output {out.shape} {out.dtype} is not [{seq.shape[0]}, {n_kv}] {np.dtype(dtype)}")
        held = pos >= 0
        big = np.iinfo(np.int64).max // 2
        s0 = int(seq[0])
        groups = [(s0, slice(None))] if (seq == s0).all() else [(int(q), np.flatnonzero(seq == q)) for q in np.unique(seq)]
        for s, rows in groups:
            base = self.seq_mask[s, :n_kv] & held
            q = p1[rows]
            hi_lo, hi_hi = (int(q.min()), int(q.max())) if causal else (big, big)
            lo_lo, lo_hi = (int(q.min()) - self.n_swa, int(q.max()) - self.n_swa) if self.n_swa > 0 else (-big, -big)
            out[rows] = np.where(base & (pos > lo_hi) & (pos <= hi_lo), zero, ninf)
            edge = base & (((pos > lo_lo) & (pos <= lo_hi)) | ((pos > hi_lo) & (pos <= hi_hi)))
            cells = np.flatnonzero(edge)
            if cells.size:
                pc, qc = pos[cells][None, :], q[:, None]
                seen = (pc <= qc) if causal else np.ones((q.shape[0], cells.size), dtype=bool)
                if self.n_swa > 0:
                    seen &= (qc - pc) < self.n_swa
                at = np.ix_(np.arange(seq.shape[0]), cells) if isinstance(rows, slice) else np.ix_(rows, cells)
                out[at] = np.where(seen, zero, ninf)
        return out


# ---- cache types llama.cpp's context refuses ----

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
