"""graphgen's graphs against the committed llama.cpp b11739 dumps: node for node, bit for bit."""

import json

import pytest

from conftest import REF_DIR
from graphgen.diff import diff_paths
from graphgen.engine import run_scenario
from graphgen.ops import ggml as G
from graphgen.record import cpu_features
from graphgen.scenario import load_scenario
from make_references import build_model

PORTED_VARIANTS = {"dflash", "dflash2", "dspark"}
CASES = sorted(p.name for p in REF_DIR.iterdir() if (p / "case.json").is_file())
PORTED = [c for c in CASES
          if json.loads((REF_DIR / c / "case.json").read_text())["make_model"]["variant"] in PORTED_VARIANTS]


def same_build_as_reference(case_dir) -> bool:
    ref = json.loads(sorted(case_dir.glob("[0-9][0-9]-*.json"))[0].read_text())["cpu_features"]
    ours = cpu_features(G.cpu_lib())
    return all(ours.get(k) == v for k, v in ref.items() if k in ours)


def test_every_case_has_dumps():
    assert len(CASES) >= 16
    for c in CASES:
        assert (REF_DIR / c / "scenario.json").is_file()
        assert list((REF_DIR / c).glob("*-inject.json")) and list((REF_DIR / c).glob("*-block.json"))


@pytest.mark.parametrize("case", PORTED)
def test_graphgen_matches_llama_cpp(case, tmp_path, models_dir):
    case_dir = REF_DIR / case
    model = build_model(case_dir, models_dir)
    run_scenario(model, load_scenario(case_dir / "scenario.json"), tmp_path)
    results = diff_paths(case_dir, tmp_path)
    assert len(results) == len(list(case_dir.glob("[0-9][0-9]-*.json"))) >= 2
    for res in results:
        assert not res.structural, res.format_text()
        if same_build_as_reference(case_dir):
            # the reference's CPU flags: bit-identical values on every node
            assert res.identical, res.format_text()
            assert all(n.nmse == 0.0 for n in res.numeric if n.nmse is not None), res.format_text()
        else:
            assert all((n.nmse or 0.0) <= 1e-6 for n in res.numeric), res.format_text()
