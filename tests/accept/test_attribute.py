"""Stage attribution between b11739's loop and the authors' own, on the shipped SmolLM2 draft: with
nothing planted only the quantized target's numerics are blamed and the authors' mean acceptance
length lies within the stated band of llama.cpp's; each planted fault in the authors' loop (a
target layer off by one, a wrong mask token, a verification accepting one drafted token too many)
is named as its stage, and no other fault's stage is.

llama.cpp's run does not depend on the plants: it is made once, and the authors' loop run again
per plant."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.reference]

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
dm = pytest.importorskip("dflash.model")

from graphgen.accept import authors_loop as AL  # noqa: E402
from graphgen.accept.attribute import (DRAFT, DRAFT_TIE, FEATURE_NMSE_BAND, FEATURES, SAMPLING,  # noqa: E402
                                       TIE_BAND, VERIFICATION, attribute)
from graphgen.accept.compare import run_engines  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "drafts" / "smollm2-dflash"
DRAFT_GGUF = FOLDER / "draft.gguf"
# short held-out text, none a training prompt
PROMPTS = ["The capital of France is", "Our team meeting on Monday will cover"]
N = 24


@pytest.fixture(scope="module")
def target():
    from graphgen.speculative.targets import resolve
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores: one torch thread beside b11739's child
    yield resolve("smollm2")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llama(target):
    return run_engines(target, DRAFT_GGUF, PROMPTS, n_predict=N, engines=("llama.cpp",))["llama.cpp"]


def _attribute(target, llama):
    authors = run_engines(target, DRAFT_GGUF, PROMPTS, n_predict=N, engines=("authors",))["authors"]
    return authors, attribute(target, {"llama.cpp": llama, "authors": authors}, FOLDER)


def _plant_in_draft(monkeypatch, change):
    """The authors' draft as its loop (and the attribution's replay) loads it, changed."""
    real = AL._load

    def planted(*a, **kw):
        tgt, draft, n_vocab = real(*a, **kw)
        change(draft)
        return tgt, draft, n_vocab
    monkeypatch.setattr(AL, "_load", planted)


@pytest.fixture(scope="module")
def clean(target, llama):
    return _attribute(target, llama)


def test_without_a_fault_only_the_targets_numerics_are_blamed(clean, llama):
    authors, at = clean
    assert at.features_in_band, at.nmse
    assert [x for x, _, _ in at.nmse] == llama.layers and [y for _, y, _ in at.nmse] == authors.layers
    assert all(0 < v <= FEATURE_NMSE_BAND for _, _, v in at.nmse), at.nmse
    for name in (DRAFT, SAMPLING, VERIFICATION):
        assert not at.stage(name).blamed, (name, at.stage(name))
    # every llama.cpp round's verified draft replayed from b11739's features
    assert at.stage(DRAFT).checked == len(llama.blocks) and at.stage(DRAFT).failed == 0
    if at.parting is not None:
        # the float target's greedy token may differ from the Q4_1 one's; or llama.cpp's q8_0 draft
        # takes a token the authors' draft scores within TIE_BAND of its best
        assert at.explained_by in (FEATURES, DRAFT_TIE), at.explanation
    text = "\n".join(at.lines())
    assert all(f"{name:<16} ok" in text for name in (DRAFT, SAMPLING, VERIFICATION)), text
    assert "within the quantized target's band" in text


def test_the_authors_mean_is_within_the_band_of_llama_cpps(clean, llama):
    authors, at = clean
    # the band: the features' own shift on llama.cpp's rounds (what its target accepts of the authors'
    # draft on transformers' against b11739's features) plus two standard errors of the
    # difference of two means of its rounds (docs/acceptance.md); recomputed here from the rounds
    n = [r["n_accepted"] for r in llama.blocks]
    m = sum(n) / len(n)
    sd = (sum((x - m) ** 2 for x in n) / (len(n) - 1)) ** 0.5
    shift = abs(at.counterfactual_mean - at.counterfactual_llama)
    assert at.mean_band == pytest.approx(shift + 2 * sd * (2 / len(n)) ** 0.5)
    # the authors' draft on b11739's features drafts llama.cpp's tokens: its counterfactual is llama.cpp's
    assert at.counterfactual_llama == pytest.approx(m)
    assert at.mean_band < 0.5, at.mean_band  # a band that wide would accept a loop counting its own token
    # the field's figure, 1 + accepted / drafts, from each run's blocks: every block drafted but
    # llama.cpp's last round of a prompt where one token was left (llama-server drafts no more than
    # the tokens left minus one)
    assert all(b["n_drafted"] > 0 for b in authors.blocks)
    assert all(b["n_drafted"] > 0 for rs in llama.rounds for b in rs[:-1])
    for run in (llama, authors):
        drafted = [b for b in run.blocks if b["n_drafted"] > 0]
        assert run.drafts == len(drafted)
        assert run.mean_acceptance_length == pytest.approx(1 + sum(b["n_accepted"] for b in drafted) / len(drafted))
    assert abs(authors.mean_acceptance_length - llama.mean_acceptance_length) <= at.mean_band
    # the authors' rounds are recorded as llama.cpp's: every round's draft and accepted count
    for p, rs in enumerate(authors.rounds):
        seq = authors.prompt_tokens[p] + authors.tokens[p]
        for r in rs:
            assert seq[r["pos0"]] == r["id_last"]
            assert seq[r["pos0"] + 1:r["pos0"] + 1 + r["n_accepted"]] == r["draft"][:r["n_accepted"]]


def test_a_target_layer_off_by_one_is_the_target_features(target, llama, clean, monkeypatch):
    def shift(draft):
        draft.target_layer_ids = [int(i) + 1 for i in draft.target_layer_ids]
    _plant_in_draft(monkeypatch, shift)
    authors, at = _attribute(target, llama)
    assert authors.layers == [x + 1 for x in llama.layers]
    assert at.stage(FEATURES).blamed and not at.features_in_band
    # every draft layer's input read one layer late: far beyond the quantized target's numerics
    assert all(v > 10 * FEATURE_NMSE_BAND for _, _, v in at.nmse), at.nmse
    assert not at.stage(DRAFT).blamed and not at.stage(VERIFICATION).blamed
    if at.parting is not None:  # unless a tie the drafts' weights decide comes first
        assert at.explained_by in (FEATURES, DRAFT_TIE), at.explanation
    assert clean[1].features_in_band  # without the plant


def test_a_wrong_mask_token_is_the_draft_forward(target, llama, clean, monkeypatch):
    def remask(draft):
        draft.mask_token_id = int(draft.mask_token_id) + 1
    _plant_in_draft(monkeypatch, remask)
    _, at = _attribute(target, llama)
    assert at.stage(DRAFT).blamed and at.stage(DRAFT).failed > 0
    first = at.stage(DRAFT).first
    assert first["authors"] != first["llama"] and first["gap"] > TIE_BAND
    assert at.explained_by == DRAFT, (at.parting, at.explanation)
    assert (at.parting.prompt, at.parting.round, at.parting.position) == \
        (first["prompt"], first["round"], first["position"])
    assert at.features_in_band and not at.stage(VERIFICATION).blamed
    assert not clean[1].stage(DRAFT).blamed  # without the plant


def _accept_one_more(module, args, kwargs, output):
    """The target's logits of a verified block changed so that it agrees with one more drafted
    token than it does: dflash_generate's own rule then accepts it."""
    ids = args[0] if args else kwargs["input_ids"]
    logits = output.logits
    if ids.shape[1] < 2 or logits.shape[1] != ids.shape[1]:
        return output  # the prefill (its last row only)
    best = logits[0].argmax(dim=-1)
    drafted = ids[0, 1:]
    n = int((drafted == best[:-1]).to(torch.int64).cumprod(0).sum())
    if n < drafted.numel():
        logits[0, n, drafted[n]] = logits[0, n].max() + 1
    return output


def test_a_verification_accepting_one_too_many_is_the_verification(target, llama, clean, monkeypatch):
    real = dm.dflash_generate

    def planted(draft, tgt, *a, **kw):
        handle = tgt.register_forward_hook(_accept_one_more, with_kwargs=True, prepend=True)
        with contextlib.ExitStack() as stack:
            stack.callback(handle.remove)
            return real(draft, tgt, *a, **kw)
    monkeypatch.setattr(dm, "dflash_generate", planted)
    authors, at = _attribute(target, llama)
    assert at.stage(VERIFICATION).blamed
    first = at.stage(VERIFICATION).first
    # the authors' loop accepted one more than its own target agrees with
    assert first["engine"] == "authors" and first["accepted"] == first["rule"] + 1
    # where the loops part first: the accepted count, unless a tie the drafts' weights decide comes first
    assert at.explained_by in (VERIFICATION, DRAFT_TIE), (at.parting, at.explanation)
    assert at.parting.kind == ("accepted" if at.explained_by == VERIFICATION else "draft")
    assert not at.stage(DRAFT).blamed and at.features_in_band
    assert not clean[1].stage(VERIFICATION).blamed  # without the plant
