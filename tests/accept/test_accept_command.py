"""`graphgen accept`: the shipped SmolLM2 draft in b11739's loop and in graphgen's, round for round.

The command's JSON is checked against its own rounds (the mean and the per-position rates are
recomputed here), the two engines must draft and accept alike, the SVG has a line per engine, and
a token planted in one engine's draft is found at the round it was planted in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from graphgen.accept.train import HELD_OUT_PROMPTS

pytestmark = pytest.mark.reference

ROOT = Path(__file__).resolve().parents[2]
DRAFT = ROOT / "drafts" / "smollm2-dflash" / "draft.gguf"
CLI = [sys.executable, "-m", "graphgen.cli"]
# the card's held-out prompts, on which the draft's mean accepted length was measured (0.23)
PROMPTS = HELD_OUT_PROMPTS[:3]
N = 24
TRAINED_MIN = 0.12  # half the card's figure: a margin for other machines' numerics


def _args(svg=None) -> list[str]:
    out = ["accept", "-m", "smollm2", "-md", str(DRAFT), "-n", str(N), "-np", str(len(PROMPTS)), "--json"]
    for p in PROMPTS:
        out += ["-p", p]
    return out + (["--svg", str(svg)] if svg else [])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("accept")
    svg = folder / "acc.svg"
    p = subprocess.run(CLI + _args(svg), capture_output=True, text=True, cwd=folder)
    return p, svg, folder


def test_the_engines_draft_and_accept_alike_in_every_round(run):
    from graphgen.accept.compare import first_divergence
    p, _, _ = run
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    a, b = doc["engines"]["llama.cpp"], doc["engines"]["graphgen"]
    assert doc["identical"] is True and doc["first_divergence"] is None
    assert first_divergence(a, b) is None
    assert len(a["rounds"]) == len(PROMPTS) and a["rounds"] == b["rounds"] and a["tokens"] == b["tokens"]
    assert all(len(t) == N for t in a["tokens"]) and a["text"] == b["text"]


def test_the_numbers_follow_from_the_rounds(run):
    p, _, _ = run
    doc = json.loads(p.stdout)
    for name, e in doc["engines"].items():
        blocks = [r for rs in e["rounds"] for r in rs]
        assert blocks and all(r["n_drafted"] == len(r["draft"]) for r in blocks)
        accepted = sum(r["n_accepted"] for r in blocks)
        assert e["blocks"] == len(blocks) and e["accepted_tokens"] == accepted
        assert e["mean_accepted_length"] == pytest.approx(accepted / len(blocks))
        rates = []
        for i in range(e["n_max"]):
            long_enough = [r for r in blocks if len(r["draft"]) > i]
            rates.append(sum(r["n_accepted"] > i for r in long_enough) / len(long_enough))
        assert e["acceptance_per_position"] == pytest.approx(rates)
        assert e["generated_tokens"] == N * len(PROMPTS)
        assert e["tokens_per_s"] == pytest.approx(e["generated_tokens"] / e["seconds"])
        assert e["mean_accepted_length"] > TRAINED_MIN, (name, e["mean_accepted_length"])


def test_the_svg_has_a_line_per_engine_and_nothing_half_written_beside_it(run):
    p, svg, folder = run
    text = svg.read_text()
    assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
    assert text.count("<polyline") == 2 and "llama.cpp" in text and "graphgen" in text
    assert sorted(f.name for f in folder.iterdir()) == ["acc.svg"]


def test_a_planted_draft_token_is_found_at_its_round(monkeypatch, capsys):
    from graphgen.accept import compare
    from graphgen.cli import main

    planted_round = 3
    real = compare.open_drafter

    def faulty(engine, *a, **kw):
        session, drafter = real(engine, *a, **kw)
        if engine == "graphgen":
            calls = {"n": 0}
            draft = drafter.draft

            def planted(reqs):
                out = draft(reqs)
                if calls["n"] == planted_round:
                    out[0] = [(out[0][0] + 1) % 49152] + list(out[0][1:])
                calls["n"] += 1
                return out
            drafter.draft = planted
        return session, drafter
    monkeypatch.setattr(compare, "open_drafter", faulty)
    assert main(_args()) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["identical"] is False
    assert doc["first_divergence"]["prompt"] == 0 and doc["first_divergence"]["round"] == planted_round
    assert doc["first_divergence"]["position"] == 1
    d = compare.first_divergence(doc["engines"]["llama.cpp"], doc["engines"]["graphgen"])
    assert (d.prompt, d.round, d.position) == (0, planted_round, 1)


def test_bad_inputs_are_one_line_naming_them(tmp_path):
    p = subprocess.run(CLI + ["accept", "-m", "smollm2", "-md", "nowhere.gguf"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip() == "graphgen: error: nowhere.gguf: no such draft model file"
    p = subprocess.run(CLI + ["accept", "-m", "smollm2", "-md", str(DRAFT), "--engines", "llama.cpp,torch"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "'torch'" in p.stderr
    # the authors' engine needs the checkpoint beside the GGUF (or --authors-draft): said before any run
    lone = tmp_path / "lone" / "draft.gguf"
    lone.parent.mkdir()
    lone.write_bytes(DRAFT.read_bytes())
    p = subprocess.run(CLI + ["accept", "-m", "smollm2", "-md", str(lone), "--engines", "graphgen,authors"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"{lone.parent}: no authors' checkpoint there" in p.stderr and "--authors-draft" in p.stderr


@pytest.mark.torch
def test_the_authors_engine_is_attributed_and_a_planted_fault_named(monkeypatch, capsys):
    """--engines llama.cpp,authors: the JSON carries the attribution; a wrong mask token planted in
    the authors' draft is named as the draft forward, and the command exits 1."""
    pytest.importorskip("dflash.model")
    from graphgen.accept import authors_loop
    from graphgen.cli import main
    real = authors_loop._load

    def remasked(*a, **kw):
        tgt, draft, n_vocab = real(*a, **kw)
        draft.mask_token_id = int(draft.mask_token_id) + 1
        return tgt, draft, n_vocab
    monkeypatch.setattr(authors_loop, "_load", remasked)
    args = ["accept", "-m", "smollm2", "-md", str(DRAFT), "-n", "16", "-p", PROMPTS[0], "--engines",
            "llama.cpp,authors", "--json"]
    assert main(args) == 1
    doc = json.loads(capsys.readouterr().out)
    at = doc["attribution"]
    assert at["explained_by"] == "draft forward" and "draft forward" in at["blamed"]
    assert at["parting"]["prompt"] == 0 and at["features_in_band"] is True
    assert "verification" not in at["blamed"] and "identical" not in doc
    lead = doc["engines"]["llama.cpp"]["rounds"][0][at["parting"]["round"]]["draft"][at["parting"]["position"] - 1]
    assert f"llama.cpp drafted {lead}" in at["explanation"]


@pytest.mark.torch
@pytest.mark.parametrize("name", ["smollm2-dspark", "smollm2-dflash2"])
def test_the_authors_loop_of_each_class_runs_and_only_the_targets_numerics_are_blamed(name, tmp_path):
    """--engines llama.cpp,authors with speculators' DSpark (the speculators loop) and z-lab's DFlash2
    (dflash_generate through its selector): nothing planted, so the authors' draft on b11739's
    features drafts b11739's verified tokens in every round, no stage but the target's features is
    blamed, and the command exits 0."""
    pytest.importorskip("dflash.model")
    pytest.importorskip("speculators.models.dspark.core")
    args = ["accept", "-m", "smollm2", "-md", name, "-n", "16", "--engines", "llama.cpp,authors", "--json"]
    for p in PROMPTS[:2]:
        args += ["-p", p]
    p = subprocess.run(CLI + args, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    at, authors = doc["attribution"], doc["engines"]["authors"]
    assert set(at["blamed"]) <= {"target features"} and at["features_in_band"], at
    draft = next(s for s in at["stages"] if s["name"] == "draft forward")
    assert draft["failed"] == 0 and draft["checked"] == doc["engines"]["llama.cpp"]["blocks"]
    assert doc["authors_within_band"] is True
    # a whole block a round where -n leaves room: DSpark drafts from the anchor's row too
    block = 8 if name == "smollm2-dspark" else 7
    assert authors["n_max"] == doc["engines"]["llama.cpp"]["n_max"] == block
    assert all(len(t) == 16 for t in authors["tokens"])
