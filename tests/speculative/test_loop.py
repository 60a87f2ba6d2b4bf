"""The speculative loop (graphgen/speculative/loop.py) over the seed's drivers, on tiny random
drafts in graphgen's Session: `run_speculative`'s rounds, what it commits and where it stops, the
simulated verifier, the summary's figures, `check_block_fits`, `RecordingSession` and
`open_drafter`'s refusals. The drivers themselves: test_drafters.py."""

import numpy as np
import pytest

from graphgen.errors import GraphgenError
from graphgen.runtime.session import Session
from graphgen.speculative.drafters import DraftParams, DraftRequest, create_drafter
from graphgen.speculative.loop import (LoopResult, RecordingSession, RoundRecord, SimulatedVerifier,
                                       check_block_fits, open_drafter, run_speculative)
from graphgen.synth import make_model


def prompt_features(session, n, seed=1):
    return np.random.default_rng(seed).standard_normal((n, session.hparams.n_embd_inp_enc), dtype=np.float32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("loop")
    out = {}
    for name, v, kw in (("dflash", "dflash", {}), ("dflash2", "dflash2", {"selector_top_k": 4}),
                        ("dspark", "dspark", {"conf": True})):
        out[name] = d / f"{name}.gguf"
        make_model(out[name], v, seed=3, block_size=5, **kw)
    return out


# -- rounds and what they commit ----------------------------------------------------------------

def test_run_speculative_api(tiny):
    with Session(tiny["dflash"], n_ctx=128) as s:
        d = create_drafter(s, None, DraftParams(n_max=3))
        feats = prompt_features(s, 40, seed=9)
        ver = SimulatedVerifier(accept=[2, 0, -1], n_vocab=s.hparams.n_vocab, mask_token=d.mask_token_id)
        seen = []
        res = run_speculative(d, [(list(range(1, 9)), feats)], n_predict=12, verifier=ver, progress=seen.append)
        assert seen == res.rounds and len(res.rounds) >= 3
        assert [r.n_accepted for r in res.rounds[:3]] == [2, 0, 3]
        # as llama-server: a round drafts at most the tokens left to -n minus one (the target adds its own)
        assert [len(r.draft) for r in res.rounds] == [min(3, 12 - (r.pos0 - 8 + 1) - 1) for r in res.rounds]
        toks = res.tokens[0]
        # the committed tokens: prompt, then per round id_last + the accepted prefix
        pos = 8
        for r in res.rounds:
            assert r.pos0 == pos and toks[pos] == r.id_last and toks[pos + 1: pos + 1 + r.n_accepted] == r.draft[:r.n_accepted]
            pos += 1 + r.n_accepted
        sm = res.summary()
        assert sm["blocks"] == len(res.rounds) and sm["drafted_tokens"] == sum(len(r.draft) for r in res.rounds)
        # the field's mean acceptance length, from the rounds: 1 + accepted / drafts (a round that
        # drafted nothing is no draft)
        drafts = [r for r in res.rounds if r.draft]
        assert sm["drafts"] == len(drafts) >= len(res.rounds) - 1
        assert sm["mean_acceptance_length"] == pytest.approx(1 + sum(r.n_accepted for r in drafts) / len(drafts))
        assert "mean_accepted_length" not in sm
        assert sm["generated_tokens"] == len(toks) - 8 >= 12
        # only the committed positions stay in the draft's KV cache
        assert d.seq_pos_max(0) == res.rounds[-1].pos0 + res.rounds[-1].n_accepted


def test_a_round_that_drafted_nothing_is_no_draft(tiny):
    """The field's mean acceptance length is 1 + accepted / drafts: a round whose draft came back
    empty (llama.cpp's n_min / p_min cut) is counted as a round but not as a draft."""
    with Session(tiny["dflash"], n_ctx=128) as s:
        d = create_drafter(s, None, DraftParams(n_max=3))
        feats = prompt_features(s, 40, seed=9)
        real, calls = d.draft, {"n": 0}

        def one_empty(reqs):
            out = real(reqs)
            if calls["n"] == 1:
                out = {q: [] for q in out}
            calls["n"] += 1
            return out
        d.draft = one_empty
        ver = SimulatedVerifier(accept=[-1], n_vocab=s.hparams.n_vocab, mask_token=d.mask_token_id)
        res = run_speculative(d, [(list(range(1, 9)), feats)], n_predict=12, verifier=ver)
    assert [len(r.draft) for r in res.rounds][:3] == [3, 0, 3]
    drafts = [r for r in res.rounds if r.draft]
    sm = res.summary()
    assert sm["blocks"] == len(res.rounds) and sm["drafts"] == len(drafts) == len(res.rounds) - 1
    assert sm["mean_acceptance_length"] == pytest.approx(1 + sum(r.n_accepted for r in drafts) / len(drafts))
    # over the rounds instead it would be lower: the drafts accepted something
    assert sm["accepted_tokens"] > 0 and sm["mean_acceptance_length"] > 1 + sm["accepted_tokens"] / len(res.rounds)


def test_run_speculative_target_tokens(tiny):
    """A verifier holding the target's continuation accepts the matching prefix: feeding it the draft's own
    greedy continuation accepts everything."""
    with Session(tiny["dflash2"], n_ctx=128) as s:
        d = create_drafter(s, None, DraftParams(n_max=None))
        feats = prompt_features(s, 30, seed=2)
        d.process(feats[:5], 0, 0)
        first = d.draft({0: DraftRequest(11, 5)})[0]
        s.seq_rm(0, 0, -1)
        ver = SimulatedVerifier(target_tokens=[11] + first + [3, 3, 3])
        res = run_speculative(d, [([1, 2, 3, 4, 5], feats)], n_predict=8, verifier=ver)
        assert res.rounds[0].draft == first and res.rounds[0].n_accepted == len(first)


# -- where the loop stops ---------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["dflash", "dspark"])
@pytest.mark.parametrize("accept", [[-1], [2, 0, -1], [1]])
def test_n_predict_is_exact(variant, accept, tiny):
    """Exactly n_predict tokens: as llama-server, each round drafts at most the tokens left minus one,
    so the accepted run and the target's token end at n_predict."""
    with Session(tiny[variant], n_ctx=256) as s:
        d = create_drafter(s, None, DraftParams(n_max=3))
        feats = prompt_features(s, 80, seed=5)
        prompt = list(range(1, 7))

        def loop(n):
            d.seq_rm(0, 0, -1)
            ver = SimulatedVerifier(accept=accept, n_vocab=s.hparams.n_vocab, mask_token=d.mask_token_id, seed=1)
            return run_speculative(d, [(prompt, feats)], n_predict=n, verifier=ver)

        for n in (1, 2, 5, 8, 9, 13):
            res = loop(n)
            toks = res.tokens[0]
            assert len(toks) - len(prompt) == n == res.summary()["generated_tokens"], (n, accept)
            # before a round at pos0, pos0 - len(prompt) + 1 tokens were generated (id_last the last)
            assert [len(r.draft) for r in res.rounds] == [min(3, n - (r.pos0 - len(prompt) + 1) - 1)
                                                          for r in res.rounds], (n, accept)
            assert res.stop_reasons == {0: "n_predict"} and res.summary()["stop_reasons"] == ["n_predict"]
            if res.rounds:
                last = res.rounds[-1]
                # the round's tokens end where n_predict does, and only they stay in the KV cache
                assert toks[last.pos0] == last.id_last
                assert toks[last.pos0 + 1:last.pos0 + 1 + last.n_accepted] == last.draft[:last.n_accepted]
                if last.bonus < 0:
                    assert len(toks) == last.pos0 + 1 + last.n_accepted
                    assert d.seq_pos_max(0) == len(toks) - 1


@pytest.mark.parametrize("variant", ["dflash", "dspark"])
def test_the_authors_edges_shrink_the_block_to_the_tokens_left(variant, tiny):
    """dflash_generate's edges: a round drafts up to every token left (not one fewer), in a block
    shrunk to them, whose rows are the block graphgen runs; a whole accepted last draft ends the run
    without the target's token."""
    with Session(tiny[variant], n_ctx=256) as s:
        d = create_drafter(s, None, DraftParams(n_max=3))
        rec = RecordingSession(s)
        d.session = rec
        feats = prompt_features(s, 80, seed=5)
        prompt = list(range(1, 7))
        dropped = 0
        for n in (2, 3, 5, 9):
            d.seq_rm(0, 0, -1)
            rec.steps.clear()
            ver = SimulatedVerifier(accept=[-1], n_vocab=s.hparams.n_vocab, mask_token=d.mask_token_id, seed=1)
            res = run_speculative(d, [(prompt, feats)], n_predict=n, verifier=ver, edges="authors")
            left = [n - (r.pos0 - len(prompt) + 1) for r in res.rounds]
            assert [len(r.draft) for r in res.rounds] == [min(3, k) for k in left], n
            extra = 0 if variant == "dspark" and d.sample_from_anchor else 1
            blocks = [st["block"]["seqs"][0]["tokens"] for st in rec.steps if "block" in st]
            assert [len(b) for b in blocks] == [min(3, k) + extra for k in left], n
            assert len(res.tokens[0]) - len(prompt) == n
            # a last round that drafted all that was left, all accepted, has no target token after it
            last = res.rounds[-1]
            assert (last.bonus == -1) == (len(last.draft) == left[-1]), n
            dropped += last.bonus == -1
        assert dropped == 2   # n 2 and 3
        with pytest.raises(GraphgenError, match="server, simple or authors"):
            run_speculative(d, [(prompt, feats)], n_predict=4, edges="zlab")


def test_target_tokens_running_out_says_so(tiny):
    with Session(tiny["dflash"], n_ctx=128) as s:
        d = create_drafter(s, None, DraftParams(n_max=3))
        feats = prompt_features(s, 60, seed=2)
        ver = SimulatedVerifier(target_tokens=[9, 8, 7, 6, 5])
        res = run_speculative(d, [([1, 2, 3], feats)], n_predict=20, verifier=ver)
        assert res.stop_reasons == {0: "target_tokens"} and res.tokens[0][3:] == [9, 8, 7, 6, 5]
        d.seq_rm(0, 0, -1)
        ver = SimulatedVerifier(target_tokens=[9, 8, 7, 6, 5])
        res = run_speculative(d, [([1, 2, 3], feats)], n_predict=3, verifier=ver)
        assert res.stop_reasons == {0: "n_predict"} and res.tokens[0][3:] == [9, 8, 7]


def test_several_sequences_draft_in_one_round_each_to_n_predict(tiny):
    with Session(tiny["dflash"], n_ctx=256, n_seq=2) as s:
        d = create_drafter(s, None, DraftParams(n_max=3))
        f0, f1 = prompt_features(s, 60, seed=1), prompt_features(s, 60, seed=2)
        ver = SimulatedVerifier(accept=[1, -1], n_vocab=s.hparams.n_vocab, mask_token=d.mask_token_id)
        res = run_speculative(d, [([1, 2, 3, 4], f0), ([5, 6], f1)], n_predict=9, verifier=ver)
        assert {seq: len(t) - n for (seq, t), n in zip(res.tokens.items(), (4, 2))} == {0: 9, 1: 9}
        assert res.n_prompt == {0: 4, 1: 2} and res.stop_reasons == {0: "n_predict", 1: "n_predict"}
        # each round drafts for every sequence still going, in sequence order
        by_round = {}
        for r in res.rounds:
            by_round.setdefault(r.round, []).append(r.seq)
        assert by_round[0] == [0, 1] and all(seqs in ([0, 1], [0], [1]) for seqs in by_round.values())
        for seq in (0, 1):
            # each sequence's own committed tokens: prompt, then per round id_last + the accepted prefix
            toks, pos = res.tokens[seq], res.n_prompt[seq]
            mine = [r for r in res.rounds if r.seq == seq]
            for r in mine:
                assert r.pos0 == pos and toks[pos:pos + 1 + r.n_accepted] == [r.id_last] + r.draft[:r.n_accepted]
                pos += 1 + r.n_accepted
            # only they stay in the draft's cache
            assert d.seq_pos_max(seq) == mine[-1].pos0 + mine[-1].n_accepted


def test_a_sequence_without_room_in_the_targets_context_drafts_nothing(tiny):
    """With the target's n_ctx, a round drafts at most what leaves two cells free; with none left
    the target decodes id_last alone."""
    with Session(tiny["dflash"], n_ctx=128) as s:
        d = create_drafter(s, None, DraftParams(n_max=3))
        feats = prompt_features(s, 40)
        ver = SimulatedVerifier(accept=[-1], n_vocab=s.hparams.n_vocab, mask_token=d.mask_token_id)
        res = run_speculative(d, [(list(range(1, 9)), feats)], n_predict=6, verifier=ver, n_ctx=12)
        # 8 tokens: 12 - 8 - 2 = 2 drafted (not n_max 3); after them and the target's token 11 tokens:
        # no room, nothing drafted, the target's token alone, twice
        assert [len(r.draft) for r in res.rounds] == [2, 0, 0]
        assert [r.n_accepted for r in res.rounds] == [2, 0, 0]
        assert len(res.tokens[0]) - 8 == 6 and res.summary()["drafts"] == 1


def test_bad_runs_are_refused_before_any_round(tiny):
    with Session(tiny["dflash"], n_ctx=128) as s:
        d = create_drafter(s, None, DraftParams(n_max=3))
        feats = prompt_features(s, 20)
        for seqs, kw, msg in (
                ([([1], feats), ([2], feats)], {}, "^2 sequences for a session of n_seq 1$"),
                ([([1], feats)], {"n_predict": 0}, "^n_predict must be at least 1, got 0$"),
                ([([], feats)], {}, "^sequence 0: the prompt is empty$"),
                ([([1], feats[0])], {}, r"^sequence 0: features must be a 2-D array \[n_positions, "),
                ([([1, 2, 3], feats)], {"n_predict": 16},
                 "^sequence 0: the features hold 20 positions; 3 prompt tokens, n_predict 16 and n_max 3 need 21$"),
                ([([1], feats)], {"n_predict": 2, "edges": "simple"}, "need a real target verifying"),
                ([([1], feats)], {"n_predict": 2, "edges": "zlab"},
                 "^edges must be server, simple or authors, got 'zlab'$")):
            with pytest.raises(GraphgenError, match=msg):
                run_speculative(d, seqs, **kw)
        assert d.seq_pos_max(0) == -1  # nothing was injected


# -- the simulated verifier -------------------------------------------------------------------------

def test_the_simulated_verifier_accepts_the_given_counts_in_turn():
    v = SimulatedVerifier(accept=[2, 0, -1, 9], n_vocab=50, mask_token=7)
    v.attach(0, [1, 2], np.zeros((30, 4), np.float32))
    assert v.first_token(0) is not None
    draft = [11, 12, 13, 14]
    assert [v.verify_one(0, r, draft)[0] for r in range(6)] == [2, 0, 4, 4, 2, 0]


def test_the_simulated_target_never_samples_the_mask_or_the_rejected_token():
    v = SimulatedVerifier(accept=[1], n_vocab=3, mask_token=0, seed=5)
    v.attach(0, [1], np.zeros((200, 4), np.float32))
    v.first_token(0)
    # token 1 was drafted at the rejected position: 2 is the only token left to sample
    assert {v.verify_one(0, r, [2, 1])[1] for r in range(30)} == {2}
    # a whole accepted draft: anything but the mask
    v.accept = [-1]
    assert {v.verify_one(0, r, [2, 1])[1] for r in range(60)} == {1, 2}


def test_the_simulated_verifier_follows_the_given_continuation():
    v = SimulatedVerifier(target_tokens={0: [5, 6, 7, 8], 1: [9]})
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    v.attach(0, [1, 2, 3], rows)
    v.attach(1, [1], rows)
    first = v.prefill([0, 1])
    assert first[0][1] == 5 and first[1][1] == 9
    assert np.array_equal(first[0][0], rows[:3]) and np.array_equal(first[1][0], rows[:1])
    # the longest matching prefix of the draft, then the continuation's next token
    assert v.verify_one(0, 0, [6, 0, 8]) == (1, 7)
    assert v.verify_one(0, 1, [8, 8]) == (1, None)   # used up after 8
    out = v.verify(2, {1: (9, 1, [4, 4])})
    n_acc, nxt, feats, eog = out[1]
    assert (n_acc, nxt, eog) == (0, None, False)
    # the verify batch [id_last, draft...] at pos0.. gives these positions' rows
    assert np.array_equal(feats, rows[1:4])
    with pytest.raises(GraphgenError, match="^sequence 3: a simulated verifier needs the target features given$"):
        v.attach(3, [1], None)


# -- the summary --------------------------------------------------------------------------------------

def test_the_summary_counts_drafts_positions_and_shared_round_times():
    rounds = [RoundRecord(0, 0, 4, 9, [1, 2, 3], 2, 5, 0.2, 0.01),
              RoundRecord(0, 1, 3, 8, [4, 5], 0, 6, 0.2, 0.01),   # drafted in the same decode: 0.2 s once
              RoundRecord(1, 0, 7, 5, [], 0, 7, 0.1, 0.02)]       # drafted nothing: no draft
    res = LoopResult("draft-dflash", "dflash", 3, rounds, {0: [0] * 9, 1: [0] * 6}, {0: 4, 1: 3}, 0.5, 2.0,
                     {0: "n_predict", 1: "eog"})
    assert res.per_position() == [0.5, 0.5, 0.0]
    sm = res.summary()
    assert (sm["rounds"], sm["blocks"], sm["drafts"]) == (2, 3, 2)
    assert (sm["drafted_tokens"], sm["accepted_tokens"], sm["generated_tokens"]) == (5, 2, 8)
    assert sm["mean_acceptance_length"] == pytest.approx(1 + 2 / 2)
    assert sm["acceptance_rate"] == pytest.approx(2 / 5)
    assert sm["drafted_tokens_per_s"] == pytest.approx(5 / 0.3)
    assert sm["ms_draft_per_round"] == pytest.approx(1e3 * 0.3 / 2)
    assert sm["ms_process_per_round"] == pytest.approx(1e3 * 0.04 / 2)
    assert sm["ms_per_round"] == pytest.approx(1e3 * 0.34 / 2)
    assert sm["stop_reasons"] == ["n_predict", "eog"] and sm["acceptance_per_position"] == [0.5, 0.5, 0.0]
    empty = LoopResult("draft-dflash", "dflash", 3, [], {0: [1]}, {0: 1}, 0.0, 0.0).summary()
    assert (empty["mean_acceptance_length"], empty["rounds"], empty["ms_per_round"]) == (1.0, 0, 0.0)


# -- a block one micro-batch holds ------------------------------------------------------------------

def test_a_block_larger_than_the_micro_batch_is_refused_naming_both(tiny):
    with Session(tiny["dflash"], n_ubatch=4) as s:
        d = create_drafter(s, None, DraftParams(n_max=4))
        msg = ("a draft block of 5 tokens (n_max 4) does not fit the draft's micro-batch of 4{}: a block is one "
               "non-causal batch; give -ub and -b of at least 5, or a smaller --spec-draft-n-max")
        with pytest.raises(GraphgenError) as e:
            check_block_fits(d)
        assert str(e.value) == msg.format("")
        with pytest.raises(GraphgenError) as e:
            check_block_fits(d, n_batch=4)
        assert str(e.value) == msg.format(" (-b 4 caps it)")
        # a -b above the micro-batch did not cap it: -ub did
        with pytest.raises(GraphgenError) as e:
            check_block_fits(d, n_batch=8)
        assert str(e.value) == msg.format("")
        check_block_fits(create_drafter(s, None, DraftParams(n_max=3)))  # 4 tokens: fits


# -- the recording session ----------------------------------------------------------------------------

def test_a_recorded_run_holds_every_call_and_the_features_it_injected(tiny):
    with Session(tiny["dflash"], n_ctx=128) as s:
        d = open_drafter(tiny["dflash"], None, DraftParams(n_max=2), n_ctx=128, wrap=RecordingSession)
        rec = d.session
        try:
            assert isinstance(rec, RecordingSession) and rec.hparams.n_vocab == s.hparams.n_vocab
            feats = prompt_features(s, 30, seed=4)
            ver = SimulatedVerifier(accept=[1, -1], n_vocab=s.hparams.n_vocab, mask_token=d.mask_token_id)
            res = run_speculative(d, [([1, 2, 3, 4, 5], feats)], n_predict=5, verifier=ver)
            steps = rec.scenario(n_ctx=128)["steps"]
            assert rec.scenario(n_ctx=128)["n_ctx"] == 128
            kinds = [next(iter(st)) for st in steps]
            assert steps[0] == {"inject": {"n_tokens": 5, "pos0": 0, "seq": 0}}
            assert np.array_equal(rec.features["step0"], feats[:5])
            # per round: the block, its removal, the verified rows injected, the rejected ones removed
            assert kinds[1:] == ["block", "seq_rm", "inject", "seq_rm"] * len(res.rounds)
            for k, r in enumerate(res.rounds):
                block, _, inject, rm = steps[1 + 4 * k:5 + 4 * k]
                assert block["block"]["seqs"] == [{"seq": 0, "tokens": [r.id_last] + [d.mask_token_id] * 2,
                                                   "pos0": r.pos0}]
                assert inject["inject"] == {"n_tokens": len(r.draft) + 1, "pos0": r.pos0, "seq": 0}
                assert np.array_equal(rec.features[f"step{3 + 4 * k}"], feats[r.pos0:r.pos0 + len(r.draft) + 1])
                assert rm["seq_rm"] == {"seq": 0, "p0": r.pos0 + r.n_accepted + 1, "p1": -1}
        finally:
            d.session.close()


# -- open_drafter's refusals ---------------------------------------------------------------------------

def test_open_drafter_refuses_an_unknown_engine_and_a_reference_off_the_cpu(tiny):
    with pytest.raises(ValueError, match="^engine must be one of graphgen, llama.cpp, torch, got 'vllm'$"):
        open_drafter(tiny["dflash"], engine="vllm")
    with pytest.raises(GraphgenError, match="^the llama.cpp draft engine runs on the CPU$"):
        open_drafter(tiny["dflash"], engine="llama.cpp", backend="Vulkan0")


def test_open_drafter_opens_the_heads_driver(tiny):
    for name, spec in (("dflash", "draft-dflash"), ("dflash2", "draft-dflash2"), ("dspark", "draft-dspark")):
        d = open_drafter(tiny[name], n_ctx=64)
        try:
            assert d.type == spec and d.session.n_ctx == 64
        finally:
            d.session.close()
