"""llama.cpp's default sampler chain and the target's loop without a draft.

`TargetSampler` is llama.cpp's default sampler chain with its default settings, penalties, DRY and
XTC being off there: top-k 40, top-p 0.95, min-p 0.05, temperature, then a draw from std::mt19937
seeded with --seed (graphgen's own, in float32; temperature <= 0 is greedy, the first best logit).
`run_alone` is the target generating on its own over any decode function, so the reference child
runs it beside b11739 and graphgen's verifier runs it beside its own target.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..ops.cmath import softmaxf
from .mt19937 import MT19937, uniform_real

F32 = np.float32
TOP_K, TOP_P, MIN_P = 40, 0.95, 0.05
TRACE_K = 8        # candidates kept per sampled token, for the margin where two runs part


def best_ids(row: np.ndarray, k: int) -> np.ndarray:
    """A row's k best ids, best first, ties in id order, as llama_sampler_top_k keeps them: every id
    at or above the k-th largest logit is a candidate, sorted stably (a full sort of the
    vocabulary gives the same order at a millisecond a row)."""
    neg = -np.asarray(row, dtype=np.float32)
    kth = np.partition(neg, k - 1)[k - 1]
    cand = np.flatnonzero(neg <= kth)
    if len(cand) < k:   # NaN among the k best: the full sort's order
        return np.argsort(neg, kind="stable")[:k]
    return cand[np.argsort(neg[cand], kind="stable")][:k]


class TargetSampler:
    """One sequence's sampler: greedy (temp <= 0), or the default chain at `temp` with its own MT19937."""

    def __init__(self, temp: float, seed: int):
        self.temp = float(temp)
        self.rng = MT19937(seed & 0xFFFFFFFF)

    def sample(self, ids: np.ndarray, logits: np.ndarray) -> int:
        """ids / logits: one row's best candidates, best first (ties in id order)."""
        if self.temp <= 0:
            return int(ids[0])
        lg = np.asarray(logits[:TOP_K], dtype=np.float32)
        cand = ids[:TOP_K]
        # top-p on the softmax at temperature 1: keep the fewest best whose mass reaches p
        p = softmaxf(lg)
        keep = len(p)
        cum = F32(0)
        for i, pi in enumerate(p):
            cum = F32(cum + pi)
            if cum >= F32(TOP_P):
                keep = i + 1
                break
        lg, cand = lg[:keep], cand[:keep]
        # min-p: drop candidates whose probability is under MIN_P of the best one's
        floor = F32(lg[0] + F32(math.log(MIN_P)))
        n = max(1, int(np.sum(lg >= floor)))
        lg, cand = lg[:n], cand[:n]
        p = softmaxf(np.array([F32(v / F32(self.temp)) for v in lg], dtype=np.float32))
        u = uniform_real(self.rng, 0.0, 1.0)
        for i, pi in enumerate(p):
            u -= float(pi)
            if u < 0.0:
                return int(cand[i])
        return int(cand[len(cand) - 1])


def run_alone(decode, is_eog, prompts: dict, n_predict: int, *, temp: float, seed: int):
    """generate_alone's loop over `decode` (rows -> (best ids, their logits) per row, best first,
    in chunks the target takes) and `is_eog`: (tokens, {"prompt": s, "generation": s}, trace)."""
    samplers = {seq: TargetSampler(temp, seed) for seq in prompts}
    trace: dict = {}

    def sample(seq, ids, top):
        trace.setdefault(seq, []).append((ids[:TRACE_K].copy(), top[:TRACE_K].copy()))
        return samplers[seq].sample(ids, top)
    toks = {seq: list(p) for seq, p in prompts.items()}
    t0 = time.perf_counter()
    rows = [(seq, t, pos) for seq, p in prompts.items() for pos, t in enumerate(p)]
    ids, top = decode(rows)
    last, at = {}, 0
    for seq, p in prompts.items():
        at += len(p)
        last[seq] = sample(seq, ids[at - 1], top[at - 1])
    t_prompt = time.perf_counter() - t0
    active = list(prompts)
    n_gen = dict.fromkeys(prompts, 0)
    while active:
        for seq in active:
            toks[seq].append(last[seq])
            n_gen[seq] += 1
        active = [s for s in active if n_gen[s] < n_predict and not is_eog(last[s])]
        if not active:
            break
        ids, top = decode([(seq, last[seq], len(toks[seq]) - 1) for seq in active])
        for i, seq in enumerate(active):
            last[seq] = sample(seq, ids[i], top[i])
    return toks, {"prompt": t_prompt, "generation": time.perf_counter() - t0 - t_prompt}, trace
