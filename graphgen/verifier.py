"""The target side of speculative decoding: a real model verifies every draft.

`TargetVerifier` plays the part the server plays around common/speculative.cpp: it prefills the
prompts on the target (b11739, graphgen/reference/session.ReferenceTarget), hands the draft the
target's layer inputs of every decoded row, and verifies each round's drafts in one batched target
decode of [id_last, draft...] per sequence: the target samples a token at every row, the longest
prefix of the draft it agrees with is accepted, plus the target's own token after it; the rest is
removed from the target's cache. `generate_alone` is the target without a draft, the yardstick:
with greedy sampling, drafting must give exactly its tokens.

`TargetSampler` is llama.cpp's default sampler chain with its default settings, penalties, DRY and
XTC being off there: top-k 40, top-p 0.95, min-p 0.05, temperature, then a draw from std::mt19937
seeded with --seed (graphgen's own, in float32; temperature <= 0 is greedy, the first best logit).
"""

from __future__ import annotations

import math
import time

import numpy as np

from .errors import GraphgenError
from .ops.cmath import softmaxf
from .runtime.mt19937 import MT19937, uniform_real

F32 = np.float32
TOP_K, TOP_P, MIN_P = 40, 0.95, 0.05


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


class TargetVerifier:
    """Verification by a real target; see the module's docstring. `t_target` sums the seconds spent
    in target decodes."""

    simulated = False

    def __init__(self, target, *, temp: float = 0.0, seed: int = 0):
        self.target = target
        self.temp = temp
        self.samplers: dict[int, TargetSampler] = {}
        self.seed = seed
        self.t_target = 0.0
        self.prompts: dict[int, list[int]] = {}
        self._eog_cache: dict[int, bool] = {}

    # the loop's interface (speculate.run_speculative)
    def attach(self, seq: int, prompt: list[int], features) -> None:
        if features is not None:
            raise GraphgenError("a real target computes the features; give none")
        self.prompts[seq] = list(prompt)
        self.samplers[seq] = TargetSampler(self.temp, self.seed)

    def is_eog(self, token: int) -> bool:
        if token not in self._eog_cache:
            self._eog_cache[token] = bool(self.target.pieces([token])[1][0])
        return self._eog_cache[token]

    def _decode(self, rows):
        """Decode rows in chunks of the target's batch; (ids, top logits, features) of every row."""
        out_ids, out_top, out_f = [], [], []
        t0 = time.perf_counter()
        for b in range(0, len(rows), self.target.n_batch):
            ids, top, f = self.target.decode(rows[b:b + self.target.n_batch])
            out_ids.append(ids)
            out_top.append(top)
            out_f.append(f)
        self.t_target += time.perf_counter() - t0
        return np.concatenate(out_ids), np.concatenate(out_top), np.concatenate(out_f)

    def prefill(self, seqs) -> dict:
        """{seq: (features of the prompt's rows, the target's first token)} after decoding every prompt."""
        rows = [(seq, tok, pos) for seq in seqs for pos, tok in enumerate(self.prompts[seq])]
        ids, top, feats = self._decode(rows)
        out, at = {}, 0
        for seq in seqs:
            n = len(self.prompts[seq])
            out[seq] = (feats[at:at + n], self.samplers[seq].sample(ids[at + n - 1], top[at + n - 1]))
            at += n
        return out

    def verify(self, round_idx: int, drafts: dict) -> dict:
        """drafts: {seq: (id_last, pos0, draft)} -> {seq: (n_accepted, next token, features of the
        verified rows [len(draft) + 1, width], eog)}: one target decode for every sequence."""
        rows = []
        for seq, (id_last, pos0, draft) in drafts.items():
            rows += [(seq, t, pos0 + i) for i, t in enumerate([id_last] + list(draft))]
        ids, top, feats = self._decode(rows)
        out, at = {}, 0
        for seq, (id_last, pos0, draft) in drafts.items():
            n_rows = len(draft) + 1
            smp = self.samplers[seq]
            n_acc, nxt, eog = 0, None, False
            # common_sampler_sample_and_accept_n: sample at each row, go on while it is the drafted token
            for i in range(n_rows):
                tok = smp.sample(ids[at + i], top[at + i])
                eog = self.is_eog(tok)
                if i < len(draft) and tok == draft[i] and not eog:
                    n_acc += 1
                    continue
                nxt = tok  # an end-of-generation token always ends here, drafted or not
                break
            # the rows past the accepted ones leave the target's cache, as the server removes them
            self.target.seq_rm(seq, pos0 + n_acc + 1, -1)
            out[seq] = (n_acc, nxt, feats[at:at + n_rows], eog)
            at += n_rows
        return out


def generate_alone(target, prompts: dict, n_predict: int, *, temp: float = 0.0, seed: int = 0) -> tuple[dict, float]:
    """The target generating on its own, every sequence one token per decode: ({seq: prompt +
    generated tokens}, seconds). Stops a sequence at n_predict tokens or an end-of-generation token."""
    samplers = {seq: TargetSampler(temp, seed) for seq in prompts}
    ver = TargetVerifier(target)
    toks = {seq: list(p) for seq, p in prompts.items()}
    t0 = time.perf_counter()
    rows = [(seq, t, pos) for seq, p in prompts.items() for pos, t in enumerate(p)]
    ids, top, _ = ver._decode(rows)
    last, at = {}, 0
    for seq, p in prompts.items():
        at += len(p)
        last[seq] = samplers[seq].sample(ids[at - 1], top[at - 1])
    active = list(prompts)
    n_gen = dict.fromkeys(prompts, 0)
    while active:
        for seq in active:
            toks[seq].append(last[seq])
            n_gen[seq] += 1
        active = [s for s in active if n_gen[s] < n_predict and not ver.is_eog(last[s])]
        if not active:
            break
        ids, top, _ = ver._decode([(seq, last[seq], len(toks[seq]) - 1) for seq in active])
        for i, seq in enumerate(active):
            last[seq] = samplers[seq].sample(ids[i], top[i])
    return toks, time.perf_counter() - t0
