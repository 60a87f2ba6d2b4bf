"""graph-diff can only say IDENTICAL about what it compared: every node by its values or, past
--max-data, by the digest of its bytes; outputs are kept whole; a node with neither on a side
makes the result NOT COMPARED."""

import json
import shutil

import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.compare.pairing import diff_paths
from graphgen.compare.report import exit_code
from graphgen.dump.format import load_dump
from graphgen.play.engine import run_scenario
from graphgen.play.scenario import load_scenario
from make_references import build_model


@pytest.fixture(scope="module")
def small_dumps(tmp_path_factory, models_dir):
    """dflash2 block in both engines with --max-data 64: most nodes keep only a digest."""
    from graphgen.reference.runner import run_reference
    tmp = tmp_path_factory.mktemp("yard")
    case = REF_DIR / "dflash2-fa-off"
    model = build_model(case, models_dir)
    run_reference(model, case / "scenario.json", tmp / "ref", max_data=64)
    run_scenario(model, load_scenario(case / "scenario.json"), tmp / "ours", max_data=64)
    return tmp


@pytest.mark.reference
def test_every_node_compared_by_values_or_digest(small_dumps):
    results = diff_paths(small_dumps / "ref", small_dumps / "ours")
    for r in results:
        assert r.identical and r.status == "IDENTICAL", r.format_text()
        with load_dump(r.ref_path) as ref:
            assert len(r.numeric) == len(ref.nodes)  # no node skipped
            digest_only = [i for i, n in enumerate(ref.nodes) if n.nelements > 64 and ref.values(i) is None]
            assert digest_only and sorted(x.ref_index for x in r.numeric if x.by_digest) == digest_only
        assert "bit-exact on all" in r.format_text()


@pytest.mark.reference
def test_outputs_are_kept_whole_in_both_engines(small_dumps):
    for side in ("ref", "ours"):
        with load_dump(sorted((small_dumps / side).glob("*-block.json"))[0]) as d:
            out = {n.name: i for i, n in enumerate(d.nodes)}
            for name in ("result_output", "result_norm", "dflash2_lattice"):
                assert d.nodes[out[name]].nelements > 64
                assert d.values(out[name]) is not None, (side, name)


def _edit_node(src_dir, dst_dir, edit):
    shutil.copytree(src_dir, dst_dir)
    path = sorted(dst_dir.glob("*-block.json"))[0]
    doc = json.loads(path.read_text())
    k = next(i for i, n in enumerate(doc["nodes"]) if n["op"] == "MUL_MAT" and np.prod(n["ne"]) > 64)
    edit(doc["nodes"][k])
    path.write_text(json.dumps(doc))
    return doc["nodes"][k]["name"]


@pytest.mark.reference
def test_a_different_digest_is_a_divergence(small_dumps, tmp_path):
    def flip(node):
        node["digest"] = ("0" if node["digest"][0] != "0" else "1") + node["digest"][1:]
    name = _edit_node(small_dumps / "ours", tmp_path / "ours", flip)
    res = [r for r in diff_paths(small_dumps / "ref", tmp_path / "ours") if r.graph == "block"][0]
    assert res.status == "DIVERGED" and exit_code([res]) == 1
    assert res.numeric_failures[0].name == name and "bytes differ" in res.numeric_failures[0].reason


@pytest.mark.reference
def test_a_node_without_values_or_digest_is_not_compared(small_dumps, tmp_path):
    def strip(node):
        node.pop("digest")
        node.pop("stats")
    name = _edit_node(small_dumps / "ours", tmp_path / "ours", strip)
    res = [r for r in diff_paths(small_dumps / "ref", tmp_path / "ours") if r.graph == "block"][0]
    assert res.status == "NOT COMPARED" and not res.identical and exit_code([res]) == 1
    assert [n for _, _, n, _ in res.not_compared] == [name]
    assert "result: NOT COMPARED" in res.format_text()


def test_values_kept_up_to_max_data(tmp_path, models_dir):
    """The dump contract: every node of at most --max-data elements keeps its values (a diff then
    reports NMSE, not only equal or unequal bytes); larger ones keep a digest."""
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    for max_data, out in ((262144, tmp_path / "all"), (100, tmp_path / "small")):
        run_scenario(model, load_scenario(case / "scenario.json"), out, max_data=max_data)
        with load_dump(sorted(out.glob("*-block.json"))[0]) as d:
            for i, n in enumerate(d.nodes):
                assert n.digest is not None, n.name
                if n.nelements <= max_data:
                    assert d.values(i) is not None, (max_data, n.name)
            if max_data == 100:
                assert any(d.values(i) is None for i, n in enumerate(d.nodes))
