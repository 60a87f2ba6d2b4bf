"""Speculative decoding on a real target (SmolLM2-135M in b11739), the helpers its tests share.

`run_loop` drafts with one engine (graphgen's Session, or b11739's draft context opened in the
target's own child, borrowing its embeddings and lm head) and verifies on the real target. It
records every block the draft computed (`Recording`) and the head's own drafts, so that two
engines' runs can be compared block by block.

Random drafts almost never agree with the target, which would leave the acceptance path of the
loop untested: `Oracle` hands the verifier drafts whose first k tokens are the target's own
continuation (known from its run alone) and the rest the head's, with k cycling from 0 (the head's
draft as it is) to the whole block. The drafts stay whatever the verifier is given, so the
invariants hold for them exactly as for the heads' own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphgen.speculative.pair import default_target_layers
from graphgen.reference.session import ReferenceTarget
from graphgen.speculative.drafters import DraftParams, create_drafter
from graphgen.runtime.session import Session
from graphgen.speculative.loop import run_speculative
from graphgen.synth import make_model
from graphgen.speculative.verifier import TargetVerifier

TARGET_N_LAYER = 30
LAYERS = default_target_layers(TARGET_N_LAYER)
N_SEQ_MAX = 4
N_CTX = 512
N_UBATCH = 64
# texts of odd token counts, so that blocks straddle odd positions
TEXTS = ("The capital of France is",
         "Once upon a time, in a small village by the sea,",
         "def fib(n):",
         "List three colors: red, green,")

# head -> (variant, make_model options); a head size of 64 lets q8_0 caches hold whole blocks
HEADS = {
    "dflash": ("dflash", {"n_layer": 1}),
    "dflash-iswa": ("dflash", {"n_layer": 2, "swa_window": 4, "swa_pattern": [1, 0]}),
    "dflash2": ("dflash2", {"n_layer": 1}),
    "dspark": ("dspark", {"n_layer": 1}),
    "dspark-conf": ("dspark", {"n_layer": 1, "conf": True}),
    "dspark-d2t": ("dspark", {"n_layer": 1, "d2t_vocab": 2000}),
    "lilicorr": ("lilicorr", {"n_layer": 1}),
}
SHAPE = {"block_size": 8, "n_head": 9, "n_head_kv": 3, "n_ff": 256}

# cache name -> Session / open_draft settings (a quantized V cache needs flash attention)
CACHES = {
    "f16": {"type_k": "f16", "type_v": "f16", "flash_attn": False},
    "f16-fa": {"type_k": "f16", "type_v": "f16", "flash_attn": True},
    "q8_0": {"type_k": "q8_0", "type_v": "q8_0", "flash_attn": True},
    "q8_0-k": {"type_k": "q8_0", "type_v": "f16", "flash_attn": False},
}


def make_draft(path, head: str, target, seed: int = 1):
    variant, kw = HEADS[head]
    make_model(path, variant, target=target, seed=seed, **SHAPE, **kw)
    return path


def open_target(path, n_seq: int = N_SEQ_MAX) -> ReferenceTarget:
    return ReferenceTarget(path, LAYERS, n_ctx=1024, n_batch=N_UBATCH, n_seq=n_seq, n_threads=1)


def clear(*holders, n_seq: int = N_SEQ_MAX) -> None:
    """Empty every sequence of targets and draft sessions, for the next run."""
    for h in holders:
        for seq in range(n_seq):
            h.seq_rm(seq, -1, -1)


class Recording:
    """A draft session that keeps a copy of what every block gave the driver."""

    def __init__(self, session):
        self.session, self.blocks = session, []

    def __getattr__(self, name):
        return getattr(self.session, name)

    def block_multi(self, blocks, embd_state=None, **kw):
        r = self.session.block_multi(blocks, embd_state=embd_state, **kw)
        self.blocks.append((None if r.logits is None else np.array(r.logits),
                            None if r.h_nextn is None else np.array(r.h_nextn)))
        return r


class Oracle:
    """A driver whose drafts start with the target's own next tokens: k of them (`schedule`
    cycled over the rounds and sequences), then the head's draft from token k on. `own` keeps the
    head's drafts as it made them."""

    def __init__(self, drafter, truth: dict | None, schedule=(0, 8, 1, 3, 0, 2, 5)):
        self.drafter, self.truth, self.schedule = drafter, truth, schedule
        self.own: list = []
        self.n_calls = 0

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def draft(self, requests):
        out = self.drafter.draft(requests)
        self.own.append({seq: list(d) for seq, d in out.items()})
        if self.truth is not None:
            for i, (seq, d) in enumerate(sorted(out.items())):
                k = min(self.schedule[(self.n_calls + i) % len(self.schedule)], len(d))
                # draft token j is checked against the token at pos0 + 1 + j
                right = self.truth[seq][requests[seq].pos0 + 1:requests[seq].pos0 + 1 + k]
                out[seq] = list(right) + d[len(right):]
        self.n_calls += 1
        return out


@dataclass
class Run:
    result: object          # speculate.LoopResult
    blocks: list            # (logits, h_nextn) of every block, in order
    own: list               # the head's own drafts per drafting call


def run_loop(engine: str, draft_path, target_path, prompts, *, cache: str = "f16", n_predict: int = 24,
             temp: float = 0.0, seed: int = 0, truth: dict | None = None, target: ReferenceTarget | None = None,
             verifier_cls=TargetVerifier) -> Run:
    """One speculative run of `prompts` (sequence i on seq id i). engine "graphgen" uses `target`
    (left empty again after the run) or its own; "llama.cpp" opens a target of its own, as its child
    holds one draft context only."""
    n_seq = len(prompts)
    settings = dict(n_ctx=N_CTX, n_ubatch=N_UBATCH, n_seq=n_seq, n_threads=1, **CACHES[cache])
    own_target = engine == "llama.cpp" or target is None
    tgt = open_target(target_path) if own_target else target
    session = None
    try:
        if engine == "graphgen":
            session = Session(draft_path, target=target_path, **settings)
        elif engine == "llama.cpp":
            session = tgt.open_draft(draft_path, **settings)
        else:
            raise ValueError(engine)
        rec = Recording(session)
        oracle = Oracle(create_drafter(rec, None, DraftParams(n_max=None)), truth)
        res = run_speculative(oracle, [(p, None) for p in prompts], n_predict=n_predict,
                              verifier=verifier_cls(tgt, temp=temp, seed=seed))
        return Run(res, rec.blocks, oracle.own)
    finally:
        if session is not None:
            session.close()
        if own_target:
            tgt.close()
        else:
            clear(tgt)


def assert_tokens_equal(result, expected: dict, what: str) -> None:
    """Every sequence's prompt + generated tokens as `expected` ({seq: tokens}) has them."""
    assert sorted(result.tokens) == sorted(expected), what
    for seq, toks in result.tokens.items():
        want = expected[seq]
        if toks != want:
            at = next((i for i, (a, b) in enumerate(zip(toks, want)) if a != b), min(len(toks), len(want)))
            raise AssertionError(f"{what}: sequence {seq} differs at token {at} (prompt {result.n_prompt[seq]}): "
                                 f"{toks[at:at + 4]} != {want[at:at + 4]}; lengths {len(toks)} / {len(want)}")


def assert_drafted(result) -> None:
    """The run did draft and verify: some rounds, some drafted tokens."""
    s = result.summary()
    assert s["rounds"] > 0 and s["drafted_tokens"] > 0, s


def round_key(r) -> tuple:
    return (r.round, r.seq, r.pos0, r.id_last, r.draft, r.n_accepted, r.bonus, r.q)


def assert_same_runs(a: Run, b: Run, what: str) -> int:
    """Two engines' runs (a: graphgen's, b: b11739's) agree on every round and on every block, bit
    for bit; -> blocks compared."""
    assert [round_key(r) for r in a.result.rounds] == [round_key(r) for r in b.result.rounds], f"{what}: rounds"
    assert a.own == b.own, f"{what}: the head's own drafts"
    assert a.result.tokens == b.result.tokens, f"{what}: tokens"
    assert len(a.blocks) == len(b.blocks) > 0, f"{what}: {len(a.blocks)} / {len(b.blocks)} blocks"
    for k, ((la, ha), (lb, hb)) in enumerate(zip(a.blocks, b.blocks)):
        assert la is not None or ha is not None, f"{what}: block {k} gave neither logits nor h_nextn"
        for name, x, y in (("logits", la, lb), ("h_nextn", ha, hb)):
            # b11739 returns h_nextn whatever the head; graphgen only where its driver reads it
            if name == "logits":
                assert (x is None) == (y is None), f"{what}: block {k} logits on one engine only"
            if x is not None:
                assert y is not None, f"{what}: block {k} {name} on the first engine only"
                assert x.shape == y.shape and np.array_equal(x, y), \
                    f"{what}: block {k} {name} differs (max |d| {np.max(np.abs(x - y)) if x.shape == y.shape else 'shape'})"
    return len(a.blocks)
