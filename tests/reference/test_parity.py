"""graphgen's graphs against the committed llama.cpp b11739 dumps: node for node, bit for bit."""

import pytest

from conftest import REF_DIR
from graphgen.compare.pairing import diff_paths
from graphgen.play.engine import run_scenario
from graphgen.play.scenario import load_scenario
from make_references import build_model
from parity_check import assert_parity

CASES = sorted(p.name for p in REF_DIR.iterdir() if (p / "case.json").is_file())


def test_every_case_has_dumps():
    assert len(CASES) >= 16
    for c in CASES:
        assert (REF_DIR / c / "scenario.json").is_file()
        assert list((REF_DIR / c).glob("*-inject.json")) and list((REF_DIR / c).glob("*-block.json"))


@pytest.mark.parametrize("case", CASES)
def test_graphgen_matches_llama_cpp(case, tmp_path, models_dir):
    case_dir = REF_DIR / case
    model = build_model(case_dir, models_dir)
    run_scenario(model, load_scenario(case_dir / "scenario.json"), tmp_path)
    results = diff_paths(case_dir, tmp_path)
    assert len(results) == len(list(case_dir.glob("[0-9][0-9]-*.json"))) >= 2
    assert_parity(results, case)
