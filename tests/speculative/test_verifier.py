"""The real target's verification (graphgen/speculative/verifier.py): acceptance against drafts whose right tokens
are known, the end of generation, and where a drafted run parts from the target alone."""

import math

import numpy as np
import pytest

from graphgen.reference.session import ReferenceTarget
from graphgen.speculative.drafters import DraftParams, create_drafter
from graphgen.runtime.session import Session
from graphgen.speculative.loop import run_speculative
from graphgen.speculative.verifier import TargetVerifier, generate_alone

PROMPT = "The capital of France is"
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from graphgen.synth import make_model
    from graphgen.speculative.targets import resolve
    target = resolve("smollm2")
    draft = tmp_path_factory.mktemp("v") / "draft.gguf"
    make_model(draft, "dflash", target=target, n_layer=1, block_size=6, seed=5)
    from graphgen.runtime.model import load
    m = load(draft, target=target)
    layers = list(m.hparams.target_layers)
    m.close()
    tg = ReferenceTarget(target, layers, n_ctx=1024, n_batch=128, n_seq=2)
    yield target, draft, tg
    tg.close()


def _clear(tg, n=2):
    for s in range(n):
        tg.seq_rm(s, -1, -1)


def _run(pair, prompts, n_predict, oracle=None, n_seq=1):
    """The loop with graphgen drafting; `oracle(seq, pos0, n)` replaces the draft's tokens."""
    target, draft, tg = pair
    _clear(tg)
    sess = Session(draft, target=target, n_ctx=1024, n_seq=n_seq)
    try:
        drafter = create_drafter(sess, None, DraftParams(n_max=None))
        if oracle is not None:
            real = drafter.draft

            def draft_fn(reqs):
                out = real(reqs)
                for seq, dp in reqs.items():
                    dp.result = oracle(seq, dp.pos0, len(out[seq]))
                    out[seq] = list(dp.result)
                return out
            drafter.draft = draft_fn
        res = run_speculative(drafter, [(p, None) for p in prompts], n_predict=n_predict, verifier=TargetVerifier(tg))
        # the tests check the draft's cache ends holding every accepted position (the last id_last and
        # the accepted tokens behind it), nothing of the rejected rows
        res.draft_pos_max = {seq: sess.seq_pos_max(seq) for seq in range(len(prompts))}
        return res
    finally:
        sess.close()


def test_a_draft_of_the_right_tokens_is_accepted_whole(pair):
    _, _, tg = pair
    prompts = [tg.tokenize(PROMPT), tg.tokenize("Once upon a time")]
    _clear(tg)
    alone, _ = generate_alone(tg, dict(enumerate(prompts)), 30)
    # the tokens after position pos0 - 1 are alone[seq][pos0 + 1 ...] (id_last sits at pos0)
    res = _run(pair, prompts, 30, oracle=lambda s, p0, n: alone[s][p0 + 1:p0 + 1 + n], n_seq=2)
    assert res.tokens == alone
    for seq in range(2):
        mine = [r for r in res.rounds if r.seq == seq][-1]
        assert res.draft_pos_max[seq] == mine.pos0 + mine.n_accepted
    full = [r for r in res.rounds if len(r.draft) == 5]
    assert full and all(r.n_accepted == 5 for r in full)
    assert res.summary()["acceptance_per_position"] == [1.0] * 5


@pytest.mark.parametrize("k", [0, 1, 3])
def test_acceptance_stops_at_the_first_wrong_token(pair, k):
    _, _, tg = pair
    prompt = tg.tokenize(PROMPT)
    _clear(tg)
    alone, _ = generate_alone(tg, {0: prompt}, 24)

    def oracle(seq, p0, n):
        right = alone[seq][p0 + 1:p0 + 1 + n]
        # wrong from position k on: a token the target never picks there
        return right[:k] + [(t + 1) % 49152 for t in right[k:]]
    res = _run(pair, [prompt], 24, oracle=oracle)
    assert res.tokens[0] == alone[0]
    assert all(r.n_accepted == min(k, len(r.draft)) for r in res.rounds[:-1])
    assert len(res.rounds) == math.ceil((24 - 1) / (k + 1))


def test_generation_ends_at_the_end_of_generation_token(pair):
    _, _, tg = pair
    prompt = tg.tokenize(CHAT)
    _clear(tg)
    alone, _ = generate_alone(tg, {0: prompt}, 200)
    gen = alone[0][len(prompt):]
    assert len(gen) < 200 and tg.pieces([gen[-1]])[1][0], "the chat answer ends with an end-of-generation token"
    res = _run(pair, [prompt], 200, oracle=lambda s, p0, n: alone[s][p0 + 1:p0 + 1 + n])
    assert res.tokens[0] == alone[0] and res.stop_reasons[0] == "eog"
    res = _run(pair, [prompt], 200)
    assert res.tokens[0] == alone[0] and res.stop_reasons[0] == "eog"


# -- where a drafted run parts from the target alone ---------------------------------------------

def _cand(pairs):
    """One row's best candidates, best first: [(token, logit), ...] -> (ids, logits)."""
    return (np.array([t for t, _ in pairs], dtype=np.int32), np.array([v for _, v in pairs], dtype=np.float32))


def test_first_partings_name_the_first_differing_token_and_both_margins():
    from graphgen.speculative.verifier import TIE_BAND, first_partings
    n_prompt = {0: 2, 1: 2}
    alone = {0: [1, 2, 10, 11, 12], 1: [1, 2, 20, 21, 22]}
    drafted = {0: [1, 2, 10, 11, 12], 1: [1, 2, 20, 23, 24]}
    same = [_cand([(10, 5.0), (9, 1.0)]), _cand([(11, 5.0), (9, 1.0)]), _cand([(12, 5.0), (9, 1.0)])]
    trace_alone = {0: same, 1: [_cand([(20, 4.0), (7, 1.0)]), _cand([(21, 3.00), (23, 2.75), (5, 1.0)]),
                                _cand([(22, 1.0)])]}
    trace_drafted = {0: same, 1: [_cand([(20, 4.0), (7, 1.0)]), _cand([(23, 3.10), (21, 3.00), (5, 1.0)]),
                                  _cand([(24, 1.0)])]}
    (pt,) = first_partings(drafted, alone, n_prompt, trace_drafted, trace_alone)
    assert (pt.seq, pt.index, pt.drafted, pt.alone) == (1, 1, 23, 21)
    assert pt.margin_alone == pytest.approx(0.25) and pt.margin_drafted == pytest.approx(0.10)
    # the logits' difference moved by the sum of the margins, 0.35: within the band it is a near tie
    assert pt.near_tie == (0.35 <= TIE_BAND)
    assert "sequence 1, generated token 1" in pt.describe() and "23" in pt.describe()


def test_a_parting_beyond_the_band_or_off_the_candidates_is_no_near_tie(monkeypatch):
    import graphgen.speculative.verifier as V
    n_prompt = {0: 1}
    alone, drafted = {0: [1, 5, 6]}, {0: [1, 5, 7]}
    trace_alone = {0: [_cand([(5, 9.0)]), _cand([(6, 2.0), (7, 1.95)])]}
    trace_drafted = {0: [_cand([(5, 9.0)]), _cand([(7, 2.0), (6, 1.9)])]}
    (pt,) = V.first_partings(drafted, alone, n_prompt, trace_drafted, trace_alone)
    assert pt.margin_alone + pt.margin_drafted == pytest.approx(0.15)
    # each margin alone is within 0.1, their sum (how far the numerics moved) is not
    monkeypatch.setattr(V, "TIE_BAND", 0.1)
    assert not pt.near_tie
    monkeypatch.setattr(V, "TIE_BAND", 0.2)
    assert pt.near_tie
    # the target alone's token is not even among the drafted run's best: far from a tie
    trace_drafted = {0: [_cand([(5, 9.0)]), _cand([(7, 9.0), (8, 8.0)])]}
    (pt,) = V.first_partings(drafted, alone, n_prompt, trace_drafted, trace_alone)
    assert pt.margin_drafted is None and pt.floor_drafted == pytest.approx(1.0) and not pt.near_tie
    assert "more than 1.000" in pt.describe()


def test_runs_that_agree_have_no_parting_and_unequal_lengths_are_named():
    from graphgen.errors import GraphgenError
    from graphgen.speculative.verifier import first_partings
    tr = {0: [_cand([(5, 1.0)]), _cand([(6, 1.0)])]}
    assert first_partings({0: [1, 5, 6]}, {0: [1, 5, 6]}, {0: 1}, tr, tr) == []
    with pytest.raises(GraphgenError, match="sequence 0: drafting generated 1 tokens where the target alone generated 2"):
        first_partings({0: [1, 5]}, {0: [1, 5, 6]}, {0: 1}, tr, tr)
