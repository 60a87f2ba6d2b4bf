"""The target side of speculative decoding: a real model verifies every draft.

`TargetVerifier` plays the part the server plays around common/speculative.cpp: it prefills the
prompts on the target (b11739, graphgen/reference/session.ReferenceTarget), hands the draft the
target's layer inputs of every decoded row, and verifies each round's drafts in one batched target
decode of [id_last, draft...] per sequence: the target samples a token at every row, the longest
prefix of the draft it agrees with is accepted, plus the target's own token after it; the rest is
removed from the target's cache. `generate_alone` is the target without a draft, the yardstick:
with greedy sampling, drafting must give exactly its tokens.

Sampling is graphgen/runtime/sampler.py's (llama.cpp's default chain).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import GraphgenError
from ..runtime.sampler import TRACE_K, TargetSampler, run_alone

# How far the target's batch shapes move the difference of two tokens' logits: a verify decodes the
# drafted rows of every sequence in one batch where the target alone decodes one row per sequence.
# Measured on SmolLM2 Q4_1 (b11739, CPU, f16 K/V, -fa auto) over the six held-out prompts and two
# more at -n 64, the shifts of the best token's lead over the next three candidates, at every
# position the two runs shared: none at -np 1 (bit-identical logits), up to 0.30 at -np 2 (median
# 0, 99th percentile 0.09). A parting within this band is a near tie those numerics decide.
TIE_BAND = 0.5


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
        # seq -> one (ids, logits) of the best TRACE_K candidates per sampled token, in the order the
        # tokens were generated: where a drafted run parts from the target alone, the margin there
        self.trace: dict[int, list] = {}
        self.t_prefill = 0.0
        self.t_sample = 0.0    # seconds in the sampler chain (and keeping the trace)

    def _sample(self, seq: int, ids, top) -> int:
        t0 = time.perf_counter()
        self.trace.setdefault(seq, []).append((ids[:TRACE_K].copy(), top[:TRACE_K].copy()))
        tok = self.samplers[seq].sample(ids, top)
        self.t_sample += time.perf_counter() - t0
        return tok

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

    def prefill(self, seqs, hold_last: bool = False) -> dict:
        """{seq: (features of the prompt's rows, the target's first token)} after decoding every prompt.
        hold_last (llama-speculative-simple's start): each prompt but its last token is decoded, and
        nothing is sampled (the token is None; the prompt's last token drafts the first round)."""
        keep = {seq: self.prompts[seq][:-1] if hold_last else self.prompts[seq] for seq in seqs}
        rows = [(seq, tok, pos) for seq in seqs for pos, tok in enumerate(keep[seq])]
        t0 = self.t_target
        if rows:
            ids, top, feats = self._decode(rows)
        else:
            feats = np.zeros((0, self.target.width), dtype=np.float32)
        self.t_prefill += self.t_target - t0
        out, at = {}, 0
        for seq in seqs:
            n = len(keep[seq])
            first = None if hold_last else self._sample(seq, ids[at + n - 1], top[at + n - 1])
            out[seq] = (feats[at:at + n], first)
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
            n_acc, nxt, eog = 0, None, False
            # common_sampler_sample_and_accept_n: sample at each row, go on while it is the drafted token
            for i in range(n_rows):
                tok = self._sample(seq, ids[at + i], top[at + i])
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


def generate_alone(target, prompts: dict, n_predict: int, *, temp: float = 0.0, seed: int = 0,
                   timing: dict | None = None, trace: dict | None = None) -> tuple[dict, float]:
    """The target generating on its own, every sequence one token per decode: ({seq: prompt +
    generated tokens}, seconds). Stops a sequence at n_predict tokens or an end-of-generation token.
    `timing`, when given, gets the seconds of the prompt's decode ("prompt") and of the rest
    ("generation"), as llama.cpp reports prompt processing and generation apart; `trace`, each
    sampled token's best candidates per sequence (TargetVerifier.trace). A target that runs the loop
    itself (ReferenceTarget.generate: in its own process, no round trip per token) is asked to."""
    t0 = time.perf_counter()
    # the class's own method: a wrapper that forwards attributes (train._Recorder) records the
    # decodes, so it keeps the loop here
    if callable(getattr(type(target), "generate", None)):
        toks, times, tr = target.generate(prompts, n_predict, temp=temp, seed=seed)
    else:
        ver = TargetVerifier(target, temp=temp, seed=seed)
        toks, times, tr = run_alone(lambda rows: ver._decode(rows)[:2], ver.is_eog, prompts, n_predict,
                                    temp=temp, seed=seed)
    total = time.perf_counter() - t0
    if timing is not None:
        timing.update(prompt=times["prompt"], generation=total - times["prompt"])
    if trace is not None:
        trace.update(tr)
    return toks, total


@dataclass
class Parting:
    """Where a drafted sequence's greedy text first differs from the target alone's."""
    seq: int
    index: int                 # among the generated tokens (0: the first token after the prompt)
    drafted: int               # the drafted run's token there
    alone: int                 # the target alone's
    margin_alone: float | None     # alone: logit(its token) - logit(the drafted run's); None: not among its best
    margin_drafted: float | None   # the drafted run: logit(its token) - logit(the alone token's)
    floor_alone: float = 0.0       # with a margin of None: at least this (its best minus its TRACE_K-th)
    floor_drafted: float = 0.0

    @property
    def near_tie(self) -> bool:
        """The two runs' logits for the two tokens differ by no more than TIE_BAND: the target alone
        leads with its token by margin_alone and the drafted run with its own by margin_drafted, so
        their batch numerics moved the difference by the sum."""
        if self.margin_alone is None or self.margin_drafted is None:
            return False
        return self.margin_alone + self.margin_drafted <= TIE_BAND

    def describe(self, pieces=None) -> str:
        def tok(t):
            return f"{t} {pieces(t)!r}" if pieces else str(t)

        def margin(m, floor):
            return f"{m:.3f}" if m is not None else f"more than {floor:.3f}"
        what = (f"a near tie the target's batch numerics decide (together within {TIE_BAND:g} logits)"
                if self.near_tie else f"not a near tie (the band is {TIE_BAND:g} logits)")
        return (f"sequence {self.seq}, generated token {self.index}: drafting gave {tok(self.drafted)}, the target "
                f"alone {tok(self.alone)}; logit margins: the target alone prefers its token by "
                f"{margin(self.margin_alone, self.floor_alone)}, the drafted run its own by "
                f"{margin(self.margin_drafted, self.floor_drafted)}: {what}")

    def to_dict(self) -> dict:
        return {"seq": self.seq, "index": self.index, "drafted": self.drafted, "alone": self.alone,
                "margin_alone": self.margin_alone, "margin_drafted": self.margin_drafted,
                "near_tie": self.near_tie}


def _margin(cand, mine: int, other: int) -> tuple[float | None, float]:
    """logit(mine) - logit(other) among one row's best candidates; (None, floor) when `other` is
    not among them (the margin is then more than the floor)."""
    ids, logits = cand
    ids = [int(i) for i in ids]
    if mine not in ids:
        raise GraphgenError(f"token {mine} was sampled but is not among its row's best candidates")
    lm = float(logits[ids.index(mine)])
    if other in ids:
        return lm - float(logits[ids.index(other)]), 0.0
    return None, lm - float(logits[-1])


def first_partings(drafted: dict, alone: dict, n_prompt: dict, trace_drafted: dict, trace_alone: dict) -> list:
    """Per sequence whose generated tokens differ: the first Parting (greedy runs)."""
    out = []
    for seq in sorted(alone):
        a, d = alone[seq][n_prompt[seq]:], drafted[seq][n_prompt[seq]:]
        k = next((i for i, (x, y) in enumerate(zip(a, d)) if x != y), None)
        if k is None:
            if len(a) != len(d):
                raise GraphgenError(f"sequence {seq}: drafting generated {len(d)} tokens where the target alone "
                                    f"generated {len(a)}, the same ones as far as both go")
            continue
        ma, fa = _margin(trace_alone[seq][k], a[k], d[k])
        md, fd = _margin(trace_drafted[seq][k], d[k], a[k])
        out.append(Parting(seq, k, d[k], a[k], ma, md, fa, fd))
    return out
