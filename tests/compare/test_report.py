"""graphgen.compare.report: a graph pair's result (status, text and JSON report, the per-layer
strip), the descriptions of its differences, the build line of a dump, and the exit code."""

import json
import math
from pathlib import Path

import pytest

from graphgen.compare.report import (
    MAX_LISTED,
    Difference,
    DiffResult,
    NumericResult,
    describe_build,
    digest_reason,
    exit_code,
    layer_strip,
    source_indices,
)
from graphgen.dump.format import FORMAT, Dump, Node


def num(i, nmse, ok=True, name=None, **kw):
    return NumericResult(i, i, name or f"n{i}", "f32", 4, nmse, 0.0, 1e-7, ok, **kw)


def test_differences_describe_themselves():
    ins = Difference("inserted", None, 4, {}, ours_name="extra", op="CONT")
    dele = Difference("deleted", 3, None, {}, ref_name="gone", op="ADD")
    eps = [0x3727C5AC] + [0] * 15          # 1e-5 as float bits
    eps2 = [0x358637BD] + [0] * 15         # 1e-6
    chg = Difference("changed", 1, 2, {"ne": ([4, 1, 1, 1], [8, 1, 1, 1]), "view_src": (None, "x"),
                                       "op_params": (eps, eps2)}, ref_name="norm-0", op="RMS_NORM")
    assert ins.describe() == "inserted ours #4 'extra' CONT"
    assert dele.describe() == "deleted ref #3 'gone' ADD"
    text = chg.describe()
    assert text.startswith("changed ref #1 / ours #2 'norm-0': ne: [4, 1, 1, 1] -> [8, 1, 1, 1]; view_src: null -> \"x\"; ")
    assert "op_params: eps=1e-05 -> eps=1e-06" in text
    assert chg.to_dict()["fields"]["ne"] == {"ref": [4, 1, 1, 1], "ours": [8, 1, 1, 1]}


def test_op_params_outside_the_ops_layout_stay_raw():
    # RMS_NORM's layout is its eps alone: a slot beyond it decodes the same on both sides
    a = [0x3727C5AC] + [0] * 15
    b = a[:5] + [7] + a[6:]
    d = Difference("changed", 0, 0, {"op_params": (a, b)}, ref_name="x", op="RMS_NORM")
    assert f"op_params: {json.dumps(a)} -> {json.dumps(b)}" in d.describe()


def test_numeric_result_describe_and_json():
    r = NumericResult(3, 5, "kq-0", "f32", 16, 2.5e-3, 0.25, 1e-7, False, op="MUL_MAT",
                      worst={"index": 7, "coord": [3, 1, 0, 0], "ref": 1.5, "ours": 1.25, "abs": 0.25})
    assert r.describe() == ("values ref #3 / ours #5 'kq-0' (f32): nmse 0.0025 > 1e-07, max abs 0.25 "
                            "at [3, 1, 0, 0] (ref 1.5, ours 1.25)")
    why = NumericResult(0, 0, "x", "f32", 4, math.nan, math.inf, 1e-7, False, reason="NaN/Inf positions differ")
    assert why.describe().startswith("values ref #0 / ours #0 'x' (f32): NaN/Inf positions differ, max abs inf")
    d = why.to_dict()
    assert d["nmse"] == "nan" and d["max_abs"] == "inf" and json.loads(json.dumps(d)) == d


@pytest.mark.parametrize("kw, status", [
    ({"identical": True}, "IDENTICAL"),
    ({"identical": False, "nothing_selected": True}, "NOTHING SELECTED"),
    ({"identical": False, "unpaired": "ref"}, "NO PARTNER"),
    ({"identical": False, "not_compared": [(1, 1, "x", "no values")]}, "NOT COMPARED"),
    ({"identical": False, "unseen": [{"side": "ref", "index": 2}]}, "PARTIAL"),
    ({"identical": False, "unseen": [{}], "numeric": [num(0, 1.0, ok=False)]}, "DIVERGED"),
    ({"identical": False, "not_compared": [(1, 1, "x", "w")], "settings_differ": ["n_kv ref=1 ours=2"]}, "DIVERGED"),
    ({"identical": False, "not_compared": [(1, 1, "x", "w")],
      "structural": [Difference("deleted", 0, None, {})]}, "DIVERGED"),
    ({"identical": False}, "DIVERGED"),
])
def test_status(kw, status):
    r = DiffResult("a", "b", "block", **kw)
    assert r.status == status and r.to_dict()["status"] == status


def summary(**kw):
    return dict({"nodes_ref": 3, "nodes_ours": 3, "matched": 3, "changed": 0, "inserted": 0, "deleted": 0,
                 "explained_ref": 0, "explained_ours": 0, "numeric_compared": 3, "numeric_failed": 0}, **kw)


def test_text_report_says_how_the_values_agree():
    exact = DiffResult("r", "o", "block", True, numeric=[num(0, 0.0), num(1, 0.0)], summary=summary())
    assert "values           bit-exact on all 2 compared nodes" in exact.format_text()
    near = DiffResult("r", "o", "block", True, numeric=[num(0, 1e-9), num(1, 3e-8, name="big")], summary=summary())
    assert "values           within thresholds, largest nmse 3e-08 at #1 'big'" in near.format_text()
    bad = DiffResult("r", "o", "block", False, numeric=[num(0, 1e-9), num(1, 0.5, ok=False, name="bad")],
                     summary=summary(numeric_failed=1))
    text = bad.format_text()
    assert "outside thresholds, largest nmse 0.5 at #1 'bad'" in text and "result: DIVERGED" in text
    assert "numeric failures:\n  values ref #1 / ours #1 'bad'" in text
    none = DiffResult("r", "o", "block", True, summary=summary(numeric_compared=0))
    assert "values           none compared" in none.format_text()


def test_text_report_lists_at_most_max_listed_differences():
    diffs = [Difference("deleted", k, None, {}, ref_name=f"d{k}", op="ADD") for k in range(MAX_LISTED + 3)]
    text = DiffResult("r", "o", "block", False, structural=diffs, rules_fired={"swiglu": 2},
                      notes=["a note"], warnings=["other model"], selection="-o ADD: 3 of 9 nodes").format_text()
    assert f"deleted ref #{MAX_LISTED - 1} 'd{MAX_LISTED - 1}'" in text and f"'d{MAX_LISTED}'" not in text
    assert "  ... 3 more" in text
    assert "rules fired:\n  swiglu x2" in text and "notes:\n  - a note" in text
    assert text.splitlines()[1] == "result: DIVERGED (only the nodes -o ADD: 3 of 9 nodes)"
    assert "warning: other model" in text


def test_json_report_is_valid_json_with_nan_spelled_out():
    r = DiffResult("r", "o", "block", False, numeric=[num(0, math.nan, ok=False)], summary={"worst": math.inf},
                   layers=[{"layer": 0, "max_nmse": math.nan}], not_compared=[(1, 2, "x", "why")])
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert d["summary"]["worst"] == "inf" and d["layers"][0]["max_nmse"] == "nan"
    assert d["not_compared"] == [{"ref_index": 1, "ours_index": 2, "name": "x", "why": "why"}]


def test_digest_reason_names_what_the_statistics_say():
    r = Node(0, "x", "ADD", "f32", [4, 1, 1, 1], stats={"nan": 0, "inf": 0, "sumsq": 2.0})
    o = Node(0, "x", "ADD", "f32", [4, 1, 1, 1], stats={"nan": 1, "inf": 0, "sumsq": 3.0})
    assert digest_reason(r, o) == ("bytes differ (digest; values not kept, raise --max-data to see them): "
                                   "nan ref 0 ours 1, sum of squares ref 2 ours 3")
    plain = Node(0, "x", "ADD", "f32", [4, 1, 1, 1])
    assert digest_reason(plain, plain) == "bytes differ (digest; values not kept, raise --max-data to see them)"


def test_exit_code():
    same, other = DiffResult("a", "b", "block", True), DiffResult("a", "b", "block", False)
    assert exit_code([same, same]) == 0 and exit_code([same, other]) == 1 and exit_code([]) == 0


def test_source_indices_resolve_to_the_latest_node_of_that_name():
    nodes = [Node(0, "Qcur-0", "MUL_MAT", "f32", [1, 1, 1, 1], ["w", "x"]),
             Node(1, "Qcur-0", "ROPE", "f32", [1, 1, 1, 1], ["Qcur-0", "pos"]),
             Node(2, "v", "VIEW", "f32", [1, 1, 1, 1], ["Qcur-0", ""], view_src="Qcur-0")]
    assert source_indices(nodes) == [[None, None, None], [0, None, None], [1, None, 1]]


def test_layer_strip_keeps_each_layers_largest_error():
    R = [Node(0, "inp", "GET_ROWS", "f32", [1, 1, 1, 1]), Node(1, "a-0", "ADD", "f32", [1, 1, 1, 1]),
         Node(2, "b-0", "ADD", "f32", [1, 1, 1, 1]), Node(3, "c-0", "ADD", "f32", [1, 1, 1, 1]),
         Node(4, "a-1", "ADD", "f32", [1, 1, 1, 1]), Node(5, "node_5", "ADD", "f32", [1, 1, 1, 1], ["a-1"])]
    numeric = [num(1, 1e-9), num(2, 1e-3, ok=False), num(3, 1e-6), num(4, 0.0), num(5, math.nan, ok=False)]
    rows = layer_strip(R, numeric, [Difference("changed", 3, 3, {})])
    assert [(r["layer"], r["nodes"], r["compared"], r["failed"], r["changed"]) for r in rows] == [
        ("global", 1, 0, 0, 0), (0, 3, 3, 1, 1), (1, 2, 2, 1, 0)]
    assert rows[0]["max_nmse"] is None
    assert rows[1]["max_nmse"] == 1e-3 and rows[1]["worst"] == {"ref_index": 2, "name": "n2"}
    # a NaN counts as the largest error there is
    assert rows[2]["max_nmse"] == math.inf and rows[2]["worst"]["ref_index"] == 5


def test_the_strip_shows_in_the_text_report_where_an_error_grew():
    rows = [{"layer": 0, "nodes": 3, "compared": 3, "failed": 0, "changed": 0, "max_nmse": 0.0, "worst": None},
            {"layer": 1, "nodes": 2, "compared": 2, "failed": 1, "changed": 0, "max_nmse": 1e-4,
             "worst": {"ref_index": 4, "name": "a-1"}}]
    text = DiffResult("r", "o", "block", False, layers=rows).format_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("layer 1"))
    assert "max nmse 0.0001" in line and "#" * 13 in line and "#" * 14 not in line and "at #4 'a-1'" in line
    quiet = DiffResult("r", "o", "block", True, layers=rows[:1]).format_text()
    assert "per layer" not in quiet
    assert "per layer" in DiffResult("r", "o", "block", True, layers=rows[:1], show_layers=True).format_text()


def dump(source, cpu=None):
    return Dump(path=Path("00-block.json"), format=FORMAT, source=source, model="m", graph="block", settings={},
                cpu_features=cpu or {}, nodes=[])


def test_describe_build():
    d = dump({"engine": "graphgen", "version": "0.1.0", "ggml": "0.27.0", "ggml_dir": "/libs"},
             {"AVX": True, "AVX2": True, "AVX512": False, "FMA": True})
    assert describe_build(d) == "graphgen 0.1.0 on ggml 0.27.0 (/libs) [AVX AVX2 FMA]"
    assert describe_build(dump({"engine": "llama.cpp", "version": "b11739"})) == "llama.cpp b11739 [no SIMD features]"
    imp = dump({"engine": "llama.cpp", "version": "?", "import": {"format": "dot"}})
    assert describe_build(imp) == "llama.cpp ggml_graph_dump_dot file (imported; build, ggml and CPU features not recorded)"
