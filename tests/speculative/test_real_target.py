"""Speculative decoding's invariants on a real target (SmolLM2-135M Q4_1 in b11739).

- Greedy: drafting changes the speed, never the text. Every head, on either draft engine, with
  one to four sequences and f16 or q8_0 draft caches, generates the target's own greedy tokens.
- The two draft engines (graphgen's Session and b11739's draft context borrowing the target's
  embeddings and lm head) fed the same real features agree on every round and on every block's
  logits and h_nextn, bit for bit.
- Sampling: the verifier draws once per generated token, so with a fixed seed the engines give the
  same tokens, and those of the target sampling alone.
- The yardstick is not vacuous: a verifier accepting one token too many breaks the greedy check,
  and a one-ulp change in one block breaks the engines' comparison.

The drafts of random heads almost never agree with the target; support/real_target.Oracle puts
the target's next tokens at the start of some drafts, so that acceptances of every length happen.
"""

import numpy as np
import pytest

from graphgen.speculative import targets
from graphgen.speculative.verifier import TargetVerifier, generate_alone
from real_target import (TEXTS, assert_drafted, assert_same_runs, assert_tokens_equal, clear, make_draft,
                         open_target, run_loop)

pytestmark = [pytest.mark.reference]

N_PREDICT = 24
TEMP, SEED = 0.8, 42

# (head, n_seq, draft cache): every head twice, n_seq 1..4 and the caches spread over them
CASES = [
    ("dflash", 1, "f16"), ("dflash", 3, "q8_0"),
    ("dflash-iswa", 2, "q8_0"), ("dflash-iswa", 4, "f16-fa"),
    ("dflash2", 3, "f16"), ("dflash2", 1, "q8_0-k"),
    ("dspark", 4, "q8_0"), ("dspark", 2, "f16"),
    ("dspark-conf", 1, "f16-fa"), ("dspark-conf", 3, "q8_0"),
    ("dspark-d2t", 2, "q8_0-k"), ("dspark-d2t", 4, "f16"),
    ("lilicorr", 4, "q8_0"), ("lilicorr", 2, "f16-fa"),
]
SAMPLED = [("dflash-iswa", 2, "q8_0"), ("dflash2", 3, "f16"), ("dspark-d2t", 4, "f16-fa")]


@pytest.fixture(scope="session")
def target_path():
    return targets.resolve("smollm2")


@pytest.fixture(scope="session")
def target(target_path):
    """The target the graphgen engine's runs share (a b11739 draft needs a child of its own)."""
    t = open_target(target_path)
    yield t
    t.close()


@pytest.fixture(scope="session")
def prompts(target):
    return [target.tokenize(t) for t in TEXTS]


@pytest.fixture(scope="session")
def alone(target, prompts):
    """The target on its own, every prompt: {"greedy" | "sampled": {seq: prompt + N_PREDICT tokens}}."""
    out = {}
    for name, temp in (("greedy", 0.0), ("sampled", TEMP)):
        out[name], _ = generate_alone(target, dict(enumerate(prompts)), N_PREDICT, temp=temp, seed=SEED)
        clear(target)
    return out


@pytest.fixture(scope="session")
def drafts(tmp_path_factory, target_path):
    made = {}

    def get(head):
        if head not in made:
            made[head] = make_draft(tmp_path_factory.mktemp("drafts") / f"{head}.gguf", head, target_path)
        return made[head]
    return get


def _both_engines(drafts, target_path, target, prompts, alone, head, n_seq, cache, *, temp=0.0):
    kind = "greedy" if temp <= 0 else "sampled"
    truth = {s: alone[kind][s] for s in range(n_seq)}
    runs = {}
    for engine in ("graphgen", "llama.cpp"):
        run = run_loop(engine, drafts(head), target_path, prompts[:n_seq], cache=cache, n_predict=N_PREDICT,
                       temp=temp, seed=SEED, truth=truth, target=target)
        assert_drafted(run.result)
        assert run.result.summary()["accepted_tokens"] > 0, "the oracle's drafts were never accepted"
        assert_tokens_equal(run.result, truth, f"{head} on {engine}, {cache} cache, {kind}: drafting vs the target alone")
        runs[engine] = run
    return runs


@pytest.mark.parametrize("head,n_seq,cache", CASES, ids=[f"{h}-np{n}-{c}" for h, n, c in CASES])
def test_greedy_drafting_is_the_target_alone_on_both_engines(drafts, target_path, target, prompts, alone,
                                                             head, n_seq, cache):
    runs = _both_engines(drafts, target_path, target, prompts, alone, head, n_seq, cache)
    n = assert_same_runs(runs["graphgen"], runs["llama.cpp"], f"{head} np{n_seq} {cache}: graphgen vs b11739")
    assert n >= len({r.round for r in runs["graphgen"].result.rounds})


@pytest.mark.parametrize("head,n_seq,cache", SAMPLED, ids=[f"{h}-np{n}-{c}" for h, n, c in SAMPLED])
def test_sampled_drafting_is_the_same_on_both_engines(drafts, target_path, target, prompts, alone, head, n_seq, cache):
    runs = _both_engines(drafts, target_path, target, prompts, alone, head, n_seq, cache, temp=TEMP)
    assert_same_runs(runs["graphgen"], runs["llama.cpp"], f"{head} np{n_seq} {cache} at temp {TEMP}: graphgen vs b11739")
    assert any(alone["sampled"][s] != alone["greedy"][s] for s in range(n_seq)), "sampling drew the greedy tokens"


def test_a_verifier_accepting_one_token_too_many_breaks_the_invariant(monkeypatch, drafts, target_path, target,
                                                                      prompts, alone):
    real_verify = TargetVerifier.verify

    def one_too_many(self, round_idx, drafts_):
        real_rm = self.target.seq_rm
        # the target keeps the row of the wrongly accepted token, so that decoding goes on
        self.target.seq_rm = lambda seq, p0=-1, p1=-1: real_rm(seq, p0 + 1 if p0 >= 0 else p0, p1)
        try:
            out = real_verify(self, round_idx, drafts_)
        finally:
            del self.target.seq_rm
        return {seq: (min(n + 1, len(drafts_[seq][2])), nxt, rows, eog) for seq, (n, nxt, rows, eog) in out.items()}

    monkeypatch.setattr(TargetVerifier, "verify", one_too_many)
    truth = {s: alone["greedy"][s] for s in range(2)}
    run = run_loop("graphgen", drafts("dflash"), target_path, prompts[:2], truth=truth, target=target, n_predict=8)
    assert_drafted(run.result)
    with pytest.raises(AssertionError, match="differs at token"):
        assert_tokens_equal(run.result, truth, "one token too many")


def test_a_one_ulp_change_in_a_block_breaks_the_engines_comparison(drafts, target_path, target, prompts, alone):
    truth = {0: alone["greedy"][0]}
    run = run_loop("graphgen", drafts("dflash"), target_path, prompts[:1], truth=truth, target=target, n_predict=6)
    k = len(run.blocks) // 2
    logits, h = run.blocks[k]
    bumped = logits.copy()
    bumped.flat[7] = np.nextafter(bumped.flat[7], np.float32(np.inf))
    other = type(run)(run.result, run.blocks[:k] + [(bumped, h)] + run.blocks[k + 1:], run.own)
    assert assert_same_runs(run, run, "itself") == len(run.blocks)
    with pytest.raises(AssertionError, match=f"block {k} logits differs"):
        assert_same_runs(run, other, "bumped")
