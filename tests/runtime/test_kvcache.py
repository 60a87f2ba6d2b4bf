"""The KV cache's cell bookkeeping against a brute-force model of the same cells.

KVCache keeps what every batch asks (cells used, last used cell, each sequence's first and last
position) up to date incrementally and journals changes under a snapshot; here random batches,
seq_rm calls, snapshots and restores are applied both to it and to plain Python lists of cells,
and every answer is compared after every operation.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from graphgen.errors import KVCacheFullError
from graphgen.runtime.kvcache import KVCache, UBatch

HP = SimpleNamespace(n_embd_k_gqa=8, n_embd_v_gqa=8, n_embd_head_k=8, n_embd_head_v=8, n_head_kv=1)


class Cells:
    """The model: a list of (pos, set of seqs) per cell, recomputed from scratch on each query."""

    def __init__(self, size):
        self.pos = [-1] * size
        self.seqs = [set() for _ in range(size)]

    def used(self):
        return sum(p >= 0 for p in self.pos)

    def used_max_p1(self):
        idx = [i for i, p in enumerate(self.pos) if p >= 0]
        return idx[-1] + 1 if idx else 0

    def seq_pos(self, s):
        ps = [p for p, q in zip(self.pos, self.seqs) if s in q]
        return (max(ps), min(ps)) if ps else (-1, -1)

    def apply(self, idxs, pos, seq):
        for i, p, s in zip(idxs, pos, seq):
            self.pos[i], self.seqs[i] = p, {s}

    def seq_rm(self, seq, p0, p1):
        p1 = 2**62 if p1 < 0 else p1
        for i, p in enumerate(self.pos):
            if p >= 0 and max(p0, 0) <= p < p1 and (seq < 0 or seq in self.seqs[i]):
                if seq < 0:
                    self.seqs[i] = set()
                else:
                    self.seqs[i].discard(seq)
                if not self.seqs[i]:
                    self.pos[i] = -1

    def copy(self):
        c = Cells(len(self.pos))
        c.pos, c.seqs = list(self.pos), [set(q) for q in self.seqs]
        return c


def _agree(c: KVCache, m: Cells, n_seq: int):
    assert c.used() == m.used()
    assert c.used_max_p1() == m.used_max_p1()
    for s in range(n_seq + 1):
        assert (c.seq_pos_max(s), c.seq_pos_min(s)) == m.seq_pos(s), f"sequence {s}"
    assert [int(p) for p in c.pos] == m.pos


@pytest.mark.parametrize("seed", range(12))
def test_bookkeeping_matches_brute_force(seed):
    rng = random.Random(seed)
    size, n_seq = 64, rng.choice([1, 2, 4])
    c = KVCache(HP, [], size, 1, 1, False, n_seq_max=1)
    m = Cells(size)
    ends = [0] * n_seq          # the next position of each sequence
    snap = None
    for _ in range(120):
        op = rng.random()
        if op < 0.5:
            n = rng.randint(1, 6)
            seqs = sorted(rng.choice(range(n_seq)) for _ in range(n))
            pos = []
            for s in seqs:
                pos.append(ends[s])
                ends[s] += 1
            # half the batches say they are runs of distinct sequences, as drivers' batches are
            runs = None
            if rng.random() < 0.5:
                runs = [(q, min(p for p, t in zip(pos, seqs) if t == q), seqs.count(q)) for q in sorted(set(seqs))]
            ub = UBatch(pos=np.array(pos, np.int32), seq=np.array(seqs, np.int32), runs=runs)
            try:
                idxs = c.find_slot(ub)
            except KVCacheFullError:
                for s in seqs:
                    ends[s] -= 1
                assert m.used() + n > size
                continue
            assert all(m.pos[i] < 0 for i in idxs), "find_slot gave a used cell"
            c.apply_ubatch(idxs, ub)
            m.apply(idxs, pos, seqs)
        elif op < 0.75:
            s = rng.choice(list(range(n_seq)) + [-1])
            p0 = rng.randint(0, max(ends))
            p1 = rng.choice([-1, p0 + rng.randint(1, 8)])
            c.seq_rm(s, p0, p1)
            m.seq_rm(s, p0, p1)
            for q in range(n_seq):  # keep each sequence's next position after what is left
                ends[q] = m.seq_pos(q)[0] + 1
        elif op < 0.85 and snap is None:
            snap = (c.snapshot(), m.copy(), list(ends))
        elif op < 0.95 and snap is not None:
            c.restore(snap[0])
            m, ends = snap[1], snap[2]
            snap = None
        elif snap is not None:
            c.commit(snap[0])
            snap = None
        _agree(c, m, n_seq)


def test_restore_undoes_batches_and_seq_rm_under_one_snapshot():
    c = KVCache(HP, [], 32, 1, 1, False)
    ub = UBatch(pos=np.arange(8, dtype=np.int32), seq=np.zeros(8, np.int32))
    c.apply_ubatch(c.find_slot(ub), ub)
    before = (c.pos.copy(), c.seq_mask.copy(), c.head)
    snap = c.snapshot()
    ub2 = UBatch(pos=np.arange(8, 12, dtype=np.int32), seq=np.array([0, 0, 1, 1], np.int32))
    c.apply_ubatch(c.find_slot(ub2), ub2)  # grows the sequence rows too
    c.seq_rm(0, 2, 5)
    c.restore(snap)
    assert (c.pos == before[0]).all() and c.head == before[2]
    assert (c.seq_mask[:before[1].shape[0]] == before[1]).all() and not c.seq_mask[before[1].shape[0]:].any()
    assert c.seq_pos_max(0) == 7 and c.seq_pos_max(1) == -1 and c.used() == 8


def test_mask_matches_cells_for_mixed_sequences():
    c = KVCache(HP, [], 256, 1, 1, False)
    ub = UBatch(pos=np.array([0, 1, 2, 0, 1], np.int32), seq=np.array([0, 0, 0, 1, 1], np.int32))
    c.apply_ubatch(c.find_slot(ub), ub)
    q = UBatch(pos=np.array([3, 2], np.int32), seq=np.array([0, 1], np.int32))
    c.apply_ubatch(c.find_slot(q), q)
    for dtype in (np.float32, np.float16):
        mask = c.kq_mask_values(q, 256, True, dtype)
        assert mask.dtype == dtype and mask.shape == (2, 256)
        seen = [[j for j in range(256) if mask[r, j] == 0] for r in range(2)]
        assert seen == [[0, 1, 2, 5], [3, 4, 6]]
        assert np.isneginf(mask[0, 3]) and np.isneginf(mask[1, 0])


@pytest.mark.parametrize("seed", range(8))
def test_mask_matches_the_rule_cell_by_cell(seed):
    """Random caches and batches: every mask entry against the visibility rule written out."""
    rng = np.random.default_rng(seed)
    n_swa = int(rng.choice([0, 3, 7]))
    c = KVCache(HP, [], 256, 1, 1, False, n_swa=n_swa)
    n_seq = int(rng.integers(1, 4))
    ends = [0] * n_seq
    for _ in range(int(rng.integers(1, 5))):
        s = int(rng.integers(n_seq))
        n = int(rng.integers(1, 20))
        ub = UBatch(pos=np.arange(ends[s], ends[s] + n, dtype=np.int32), seq=np.full(n, s, np.int32))
        c.apply_ubatch(c.find_slot(ub), ub)
        ends[s] += n
    seqs = np.sort(rng.integers(0, n_seq, size=int(rng.integers(1, 12)))).astype(np.int32)
    pos = np.array([ends[s] + k for k, s in enumerate(seqs)], dtype=np.int32)
    q = UBatch(pos=pos, seq=seqs)
    c.apply_ubatch(c.find_slot(q), q)
    for causal in (True, False):
        mask = c.kq_mask_values(q, 256, causal, np.float32)
        for r in range(len(seqs)):
            for j in range(256):
                p, s = int(c.pos[j]), int(seqs[r])
                seen = p >= 0 and bool(c.seq_mask[s, j]) and (not causal or p <= pos[r]) \
                    and (n_swa == 0 or pos[r] - p < n_swa)
                assert mask[r, j] == (0 if seen else -np.inf), (causal, r, j)
