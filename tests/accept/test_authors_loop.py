"""The authors' own loop (z-lab's dflash_generate) with the shipped SmolLM2 draft: greedy, it
generates what the target alone generates; its per-round counts follow the loop's arithmetic; the
trained draft gets tokens accepted; bad input is refused naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("dflash.model")

from graphgen.accept.authors_loop import AuthorsLoopError, authors_accept, mean_acceptance_length  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DRAFT_DIR = ROOT / "drafts" / "smollm2-dflash"
N_PREDICT = 24
BLOCK = 8  # the checkpoint's dflash_config.block_size
# held-out prompts (graphgen/training/prompts.py's HELD_OUT_PROMPTS) as the target's tokenizer splits
# them: "The capital of France is", "A good breakfast should include"
PROMPTS = [[504, 3575, 282, 4649, 314], [49, 1123, 13848, 868, 1453]]


@pytest.fixture(scope="module")
def threads():
    # one thread: two threads on two shared cores slow the small matmuls several-fold when busy
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    from graphgen.speculative.targets import resolve
    return resolve("smollm2")


@pytest.fixture(scope="module")
def runs(target, threads):
    return authors_accept(target, DRAFT_DIR, PROMPTS, N_PREDICT)


def _greedy_alone(target, prompt, n):
    """The target's own greedy continuation in transformers: the whole sequence re-run for every token
    (no cache, no draft)."""
    from graphgen.accept.features import transformers_model
    model = transformers_model(target)
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([ids]), use_cache=False).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids


def test_greedy_generates_what_the_target_alone_does(runs, target):
    for prompt, run in zip(PROMPTS, runs):
        assert run["tokens"][:len(prompt)] == prompt
        assert run["tokens"] == _greedy_alone(target, prompt, N_PREDICT)
        assert run["seconds"] > 0


def test_round_counts_follow_the_loop(runs):
    for prompt, run in zip(PROMPTS, runs):
        assert len(run["tokens"]) - len(prompt) == N_PREDICT
        generated, dropped = 1, 0  # the prefill's token
        for i, (drafted, accepted) in enumerate(run["rounds"]):
            # a block drafts what is left of n_predict, at most block - 1 tokens
            assert drafted == min(BLOCK - 1, N_PREDICT - generated), (i, run["rounds"])
            assert 0 <= accepted <= drafted
            # the agreed drafted tokens then the target's own, which the round reaching n_predict drops
            added = min(accepted + 1, N_PREDICT - generated)
            dropped += int(added == accepted)
            assert run["authors_lengths"][i] == added
            generated += added
        assert generated == N_PREDICT
        assert dropped <= 1
        assert 1 + sum(a for _, a in run["rounds"]) + len(run["rounds"]) - dropped == N_PREDICT


def test_the_shipped_draft_gets_tokens_accepted(runs):
    # the field's mean acceptance length, 1 + accepted / rounds (every round drafts), recomputed from
    # the rounds; measured: 1.394 on these two prompts (13 accepted in 33 rounds)
    rounds = [r for run in runs for r in run["rounds"]]
    assert rounds and all(drafted > 0 for drafted, _ in rounds)
    accepted = sum(a for _, a in rounds)
    assert accepted > 0
    assert mean_acceptance_length(runs) == pytest.approx(1 + accepted / len(rounds))
    # a draft that never hits has 1.0, and no rounds at all is no acceptance either
    assert mean_acceptance_length([{"rounds": [(7, 0), (7, 0)]}]) == 1.0
    assert mean_acceptance_length([{"rounds": []}]) == 1.0


def test_bad_input_is_refused_naming_it(target, tmp_path):
    missing = tmp_path / "no-such-draft"
    with pytest.raises(AuthorsLoopError, match="no-such-draft"):
        authors_accept(target, missing, PROMPTS, N_PREDICT)
    gguf = DRAFT_DIR / "draft.gguf"
    with pytest.raises(AuthorsLoopError, match=r"draft\.gguf.*GGUF"):
        authors_accept(target, gguf, PROMPTS, N_PREDICT)
    with pytest.raises(AuthorsLoopError, match="n_predict"):
        authors_accept(target, DRAFT_DIR, PROMPTS, 0)


# -- z-lab's DFlash2: dflash_generate drafts through its candidate selector ----------------------

DFLASH2_DIR = ROOT / "drafts" / "smollm2-dflash2"


@pytest.fixture(scope="module")
def dflash2(target, threads):
    from graphgen.accept import authors_loop as AL
    tmodel, draft, _ = AL.load(target, DFLASH2_DIR)
    return tmodel, draft, authors_accept(target, DFLASH2_DIR, PROMPTS, N_PREDICT)


def test_dflash2_is_loaded_as_its_class_and_generates_what_the_target_alone_does(dflash2, target):
    import dflash.model as zm
    _, draft, runs = dflash2
    assert type(draft) is zm.DFlash2DraftModel  # dflash_generate picks the selector path by the class
    for prompt, run in zip(PROMPTS, runs):
        assert run["tokens"] == _greedy_alone(target, prompt, N_PREDICT)
        generated = 1
        for (drafted, accepted), added in zip(run["rounds"], run["authors_lengths"]):
            assert drafted == min(BLOCK - 1, N_PREDICT - generated)
            assert added == min(accepted + 1, N_PREDICT - generated)
            generated += added
        assert generated == N_PREDICT


def test_dflash2_drafts_are_the_selectors_walk_and_the_replay_gives_them(dflash2, target):
    """Every round's draft is what draft_block gives from the text's features (the selector's greedy
    walk over the top-k of each row, from the anchor): at some positions not the rows' argmax."""
    from graphgen.accept import authors_loop as AL
    from graphgen.accept.features import transformers_run
    tmodel, draft, runs = dflash2
    walked_off_argmax = 0
    for run in runs:
        feats = transformers_run(target, run["layers"], run["tokens"])[0]
        for b in run["blocks"]:
            pos0 = b["pos0"]
            tokens, logits = AL.draft_block(tmodel, draft, feats[:pos0], b["id_last"], pos0, b["n_drafted"] + 1)
            assert tokens == b["draft"] == AL.replay(tmodel, draft, feats[:pos0], b["id_last"], pos0, b["n_drafted"])
            top = logits.argsort(axis=-1)[:, ::-1][:, :draft.candidate_selector.top_k]
            assert all(t in top[i] for i, t in enumerate(tokens))  # the walk picks among each row's top-k
            walked_off_argmax += int(tokens != [int(x) for x in logits.argmax(axis=-1)])
    assert walked_off_argmax > 0


def test_dflash2_replay_scores_rank_each_walked_token_first(dflash2, target):
    """replay(logits=True) gives DFlash2's rows as its selector scores them (after the walk's token
    before): each walked token is its row's best, as the attribution's tie check reads them."""
    import numpy as np
    from graphgen.accept import authors_loop as AL
    from graphgen.accept.features import transformers_run
    tmodel, draft, runs = dflash2
    run = runs[0]
    feats = transformers_run(target, run["layers"], run["tokens"])[0]
    for b in run["blocks"][:4]:
        tokens, scores = AL.replay(tmodel, draft, feats[:b["pos0"]], b["id_last"], b["pos0"], b["n_drafted"],
                                   logits=True)
        assert tokens == b["draft"] and [int(x) for x in scores.argmax(axis=-1)] == tokens
        assert (np.isfinite(scores).sum(axis=-1) == draft.candidate_selector.top_k).all()
