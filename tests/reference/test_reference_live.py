"""The committed reference dumps: node counts as documented, and regenerated live they match."""

import json

import pytest

from conftest import REF_DIR
from graphgen.compare.pairing import diff_paths
from make_references import build_model

# reference-llama-cpp.md, "What b11739 produced for a tiny draft" (FA off / FA on)
DOCUMENTED = {
    "dflash-fa-off": {"inject": 29, "block": 84}, "dflash-fa-on": {"inject": 25, "block": 74},
    "dflash2-fa-off": {"block": 390}, "dspark-fa-off": {"block": 112},
    "dspark-conf-fa-off": {"block": 144}, "lilicorr-fa-off": {"block": 228},
}
LAST_NODE = {"dflash2-fa-off": "dflash2_lattice", "lilicorr-fa-off": "lilicorr_lattice"}


@pytest.mark.parametrize("case", sorted(DOCUMENTED))
def test_node_counts_as_documented(case):
    for graph, n in DOCUMENTED[case].items():
        (path,) = (REF_DIR / case).glob(f"[0-9][0-9]-{graph}.json")
        doc = json.loads(path.read_text())
        assert doc["source"]["engine"] == "llama.cpp" and doc["source"]["version"] == "b11739"
        assert len(doc["nodes"]) == n
        if graph == "block" and case in LAST_NODE:
            assert doc["nodes"][-1]["name"] == LAST_NODE[case]


@pytest.mark.reference
@pytest.mark.parametrize("case", ["dflash-iswa-fa-on", "lilicorr-fa-off"])
def test_regenerated_reference_equals_committed(case, tmp_path):
    from graphgen.reference.runner import run_reference

    case_dir = REF_DIR / case
    model = build_model(case_dir, tmp_path)
    run_reference(model, case_dir / "scenario.json", tmp_path / "ref")
    results = diff_paths(case_dir, tmp_path / "ref")
    assert results and all(r.identical for r in results), "\n".join(r.format_text() for r in results)
    assert all(n.nmse == 0.0 for r in results for n in r.numeric)
