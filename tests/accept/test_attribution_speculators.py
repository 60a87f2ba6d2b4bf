"""The stage attribution with the shipped speculators DSpark draft, whose authors' loop is
graphgen.accept.speculators_loop: with nothing planted the draft forward, the sampling and the
verification agree with b11739 in every round; a Markov chain started from the wrong token (the
mask, not the anchor) is the draft forward, target features read one layer late are the target
features. llama.cpp's run is made once, the authors' loop run again per plant."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.reference]

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("dflash.model")
pytest.importorskip("speculators.models.dspark.core")

from graphgen.accept import authors_loop as AL  # noqa: E402
from graphgen.accept.attribute import (DRAFT, DRAFT_TIE, FEATURE_NMSE_BAND, FEATURES, SAMPLING,  # noqa: E402
                                       TIE_BAND, VERIFICATION, attribute)
from graphgen.accept.compare import run_engines  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "drafts" / "smollm2-dspark"
DRAFT_GGUF = FOLDER / "draft.gguf"
PROMPTS = ["The capital of France is", "Our team meeting on Monday will cover"]
N = 16


@pytest.fixture(scope="module")
def target():
    from graphgen.speculative.targets import resolve
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield resolve("smollm2")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llama(target):
    return run_engines(target, DRAFT_GGUF, PROMPTS, n_predict=N, engines=("llama.cpp",))["llama.cpp"]


def _attribute(target, llama):
    authors = run_engines(target, DRAFT_GGUF, PROMPTS, n_predict=N, engines=("authors",))["authors"]
    return authors, attribute(target, {"llama.cpp": llama, "authors": authors}, FOLDER)


def test_without_a_fault_the_draft_forward_sampling_and_verification_agree(target, llama):
    authors, at = _attribute(target, llama)
    assert llama.n_max == authors.n_max == 8  # sample_from_anchor: the anchor's row drafts too
    assert at.features_in_band and [x for x, _, _ in at.nmse] == llama.layers == authors.layers
    for name in (DRAFT, SAMPLING, VERIFICATION):
        assert not at.stage(name).blamed, (name, at.stage(name))
    assert at.stage(DRAFT).checked == len(llama.blocks) and at.stage(DRAFT).failed == 0
    if at.parting is not None:  # the targets' numerics, or a tie the drafts' weights decide
        assert at.explained_by in (FEATURES, DRAFT_TIE), at.explanation
    # the field's figure, 1 + accepted / drafts, from each run's blocks: every block drafted but
    # llama.cpp's last of a prompt, with one token left (llama-server drafts the tokens left minus one)
    assert all(b["n_drafted"] > 0 for b in authors.blocks)
    assert all(b["n_drafted"] > 0 for rs in llama.rounds for b in rs[:-1])
    for run in (llama, authors):
        drafted = [b for b in run.blocks if b["n_drafted"] > 0]
        assert run.drafts == len(drafted)
        assert run.mean_acceptance_length == pytest.approx(1 + sum(b["n_accepted"] for b in drafted) / len(drafted))
    assert abs(authors.mean_acceptance_length - llama.mean_acceptance_length) <= at.mean_band
    # the confidence head scored every drafted token
    assert all(len(b["confidence"]) == b["n_drafted"] for b in authors.blocks)


def test_a_markov_chain_from_the_mask_token_is_the_draft_forward(target, llama, monkeypatch):
    import graphgen.authors.forward as F
    real = F.dspark_heads

    def from_the_mask(draft, hidden, full, raw, anchor):
        return real(draft, hidden, full, raw, draft.mask_token_id)
    # the DSpark heads the loop's draft session and the attribution's replays both chain
    monkeypatch.setattr(F, "dspark_heads", from_the_mask)
    _, at = _attribute(target, llama)
    assert at.stage(DRAFT).blamed and at.stage(DRAFT).failed > 0
    assert at.stage(DRAFT).first["gap"] > TIE_BAND
    assert at.explained_by == DRAFT, (at.parting, at.explanation)
    assert at.features_in_band and not at.stage(VERIFICATION).blamed


def test_features_one_layer_late_are_the_target_features(target, llama, monkeypatch):
    real = AL._load

    def late(*a, **kw):
        tgt, draft, n_vocab = real(*a, **kw)
        draft.target_layers = [int(i) + 1 for i in draft.target_layers]
        return tgt, draft, n_vocab
    monkeypatch.setattr(AL, "_load", late)
    authors, at = _attribute(target, llama)
    assert authors.layers == [x + 1 for x in llama.layers]
    assert at.stage(FEATURES).blamed and not at.features_in_band
    assert all(v > 10 * FEATURE_NMSE_BAND for _, _, v in at.nmse), at.nmse
    assert not at.stage(DRAFT).blamed and not at.stage(VERIFICATION).blamed
