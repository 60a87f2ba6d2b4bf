"""The speculators loop (graphgen.accept.speculators_loop) with the shipped DSpark draft: greedy, it
generates what the target alone generates; each round drafts a whole block (sample_from_anchor:
block_size tokens) shrunk to what n_predict leaves, and its counts follow the loop's arithmetic;
every round's draft is what the draft drafts from scratch on the target's features of its context,
each slot's token the argmax of the base logits plus the Markov bias of the token drafted at the
slot before (the anchor for the first); the confidences are the confidence head's, and p_min ends
a draft before the first slot scored below it, as llama.cpp's dspark drafter does."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("dflash.model")
pytest.importorskip("speculators.models.dspark.core")

from graphgen.accept import authors_loop as AL  # noqa: E402
from graphgen.accept import speculators_loop as SL  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DRAFT_DIR = ROOT / "drafts" / "smollm2-dspark"
N_PREDICT = 24
BLOCK = 8  # the checkpoint's block_size; sample_from_anchor: every row drafts
# held-out prompts as the target's tokenizer splits them: "The capital of France is",
# "A good breakfast should include"
PROMPTS = [[504, 3575, 282, 4649, 314], [49, 1123, 13848, 868, 1453]]


@pytest.fixture(scope="module")
def loaded():
    from graphgen.speculative.targets import resolve
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores
    target = resolve("smollm2")
    tmodel, draft, _ = AL.load(target, DRAFT_DIR)
    yield target, tmodel, draft
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runs(loaded):
    target, _, _ = loaded
    return AL.authors_accept(target, DRAFT_DIR, PROMPTS, N_PREDICT)


def _greedy_alone(tmodel, prompt, n):
    """The target's own greedy continuation: the whole sequence re-run for every token, no cache."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(tmodel(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
    return ids


def test_the_draft_is_speculators_dspark_with_the_targets_embeddings(loaded):
    _, tmodel, draft = loaded
    assert type(draft.model).__name__ == "DSparkDraftModel" and draft.variant == "dspark"
    assert draft.sample_from_anchor and draft.block_size == BLOCK and draft.d2t is not None
    assert draft.model.markov_head is not None and draft.model.confidence_head is not None
    # the verifier's embeddings are the GGUF's, as transformers dequantized them
    assert torch.equal(draft.model.embed_tokens.weight, tmodel.get_input_embeddings().weight)
    assert AL.read_layers(draft) == [2, 15, 28]  # aux_hidden_state_layer_ids: the layers' inputs


def test_greedy_generates_what_the_target_alone_does(runs, loaded):
    _, tmodel, _ = loaded
    for prompt, run in zip(PROMPTS, runs):
        assert run["tokens"] == _greedy_alone(tmodel, prompt, N_PREDICT)
        assert run["seconds"] > 0


def test_round_counts_follow_the_loop(runs):
    for prompt, run in zip(PROMPTS, runs):
        assert len(run["tokens"]) - len(prompt) == N_PREDICT
        generated, dropped = 1, 0  # the prefill's token
        for i, (drafted, accepted) in enumerate(run["rounds"]):
            # the anchor's row drafts too: a whole block, at most what is left of n_predict
            assert drafted == min(BLOCK, N_PREDICT - generated), (i, run["rounds"])
            assert 0 <= accepted <= drafted
            added = min(accepted + 1, N_PREDICT - generated)
            dropped += int(added == accepted)
            assert run["authors_lengths"][i] == added
            generated += added
        assert generated == N_PREDICT and dropped <= 1
        assert 1 + sum(a for _, a in run["rounds"]) + len(run["rounds"]) - dropped == N_PREDICT
        seq = run["tokens"]
        for b in run["blocks"]:
            # the accepted drafted tokens are the text's, the target's token after them too
            assert seq[b["pos0"]] == b["id_last"]
            assert seq[b["pos0"] + 1:b["pos0"] + 1 + b["n_accepted"]] == b["draft"][:b["n_accepted"]]
            if b["bonus"] != -1:
                assert seq[b["pos0"] + 1 + b["n_accepted"]] == b["bonus"] == b["target"][b["n_accepted"]]
    # the field's mean acceptance length, from the rounds: 1 + accepted / rounds, each round a draft
    rounds = [r for run in runs for r in run["rounds"]]
    assert all(drafted > 0 for drafted, _ in rounds)
    accepted = sum(a for _, a in rounds)
    assert accepted > 0 and AL.mean_acceptance_length(runs) == pytest.approx(1 + accepted / len(rounds))


def _markov_chain(draft, hidden, anchor, n):
    """Each slot's token from the authors' modules directly: lm_head over the draft vocabulary plus
    markov_w2(markov_w1[previous token]), the previous token the anchor for slot 0 and the slot
    before's token after; d2t maps a draft id to the target's."""
    m = draft.model
    d2t = torch.as_tensor(draft.d2t)
    prev, out, conf = int(anchor), [], []
    with torch.inference_mode():
        for k in range(n):
            emb = m.markov_head.markov_w1.weight[prev]
            col = m.lm_head(hidden[0, k]) + m.markov_head.markov_w2(emb)
            prev = int(d2t[int(col.argmax())])
            out.append(prev)
            conf.append(float(torch.sigmoid(m.confidence_head.proj(torch.cat([hidden[0, k], emb])))))
    return out, conf


def test_every_round_is_the_drafts_markov_chain_on_the_targets_features(runs, loaded):
    target, _, draft = loaded
    chained_differs = 0
    for run in runs:
        feats = _feats(target, run)
        for b in run["blocks"]:
            pos0, n = b["pos0"], b["n_drafted"]
            # the loop's cache against a block drafted from scratch on the same text's features
            assert SL.draft_block(draft, feats[:pos0], b["id_last"], pos0, n)[0] == b["draft"], b
            block = [b["id_last"]] + [draft.mask_token_id] * (n - 1)
            with torch.inference_mode():
                hidden = draft.backbone(draft.new_cache(), torch.as_tensor(feats[:pos0])[None],
                                        draft.embed_tokens(block), torch.arange(pos0 + n)[None],
                                        list(range(pos0 + n)))
                base = [int(draft.d2t[int(t)]) for t in draft.model.lm_head(hidden[0]).argmax(-1)]
            chain, conf = _markov_chain(draft, hidden, b["id_last"], n)
            assert chain == b["draft"], b
            assert b["confidence"] == pytest.approx(conf, abs=1e-5)
            assert all(0 < c < 1 for c in b["confidence"])
            chained_differs += int(base != chain)
    # the Markov bias decides some slots: without it these drafts would differ
    assert chained_differs > 0


def test_p_min_ends_a_draft_before_the_first_slot_scored_below_it(runs, loaded):
    target, tmodel, draft = loaded
    scores = sorted(c for run in runs for b in run["blocks"] for c in b["confidence"])
    p_min = scores[len(scores) // 2]
    res = AL._one(tmodel, draft, PROMPTS[0], N_PREDICT, 0.0, 0, None, p_min)
    res["layers"] = runs[0]["layers"]
    assert res["tokens"] == runs[0]["tokens"]  # drafting never changes a greedy target's text
    feats, cut = _feats(target, res), 0
    for b in res["blocks"]:
        assert all(c >= p_min for c in b["confidence"])
        full = min(BLOCK, len(res["tokens"]) - 1 - b["pos0"])
        if b["n_drafted"] < full:
            cut += 1
            # the slot after the kept ones scored below p_min
            _, _, conf = SL.draft_block(draft, feats[:b["pos0"]], b["id_last"], b["pos0"], full)
            assert conf[b["n_drafted"]] < p_min <= min(conf[:b["n_drafted"]], default=1.0)
    assert cut > 0


def _feats(target, run):
    """transformers' features of the run's text, [n_tokens, n_layers * n_embd] as the draft's fc takes them."""
    from graphgen.accept.features import transformers_run
    return transformers_run(target, run["layers"], run["tokens"])[0].reshape(len(run["tokens"]), -1)


def test_a_checkpoint_the_loop_cannot_run_is_refused_naming_it(loaded, tmp_path):
    import json
    import shutil
    target, _, _ = loaded
    bad = tmp_path / "ck"
    shutil.copytree(DRAFT_DIR, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["speculators_model_type"] = "eagle3"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(AL.AuthorsLoopError, match="speculators_model_type"):
        AL.authors_accept(target, bad, PROMPTS, N_PREDICT)
    with pytest.raises(AL.AuthorsLoopError, match="greedy only"):
        AL.authors_accept(target, DRAFT_DIR, PROMPTS, N_PREDICT, temp=0.5)
