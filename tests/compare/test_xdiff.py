"""graphgen.compare.xdiff: one scenario's dumps from two backends compared node by node, with
per-op NMSE bounds (or one bound for all), integer results exact, a top-k's order free, and any
structural difference, missing graph or uncompared node a failure."""

import json

import numpy as np
import pytest
from conftest import REF_DIR

from graphgen.compare.nodefilter import FilterError, NodeFilter
from graphgen.compare.xdiff import (
    DEFAULT_NMSE,
    OP_NMSE,
    XDiffResult,
    compare_dirs,
    xdiff,
)
from graphgen.dump.format import Node, load_dump_dir, write_dump
from graphgen.play.scenario import load_scenario

HEADER = {"source": {"engine": "graphgen", "version": "0.1"}, "model": "m.gguf",
          "settings": {"flash_attn": False, "type_k": "f16", "type_v": "f16", "n_ctx": 64, "n_ubatch": 8,
                       "n_kv": 8, "causal": True},
          "cpu_features": {}}

# name, op, type, ne, src
GRAPH = [("x", "MUL_MAT", "f32", [4, 2, 1, 1], ["w", "inp"]),
         ("tk", "TOP_K", "i32", [3, 2, 1, 1], ["x"]),
         ("sel", "GET_ROWS", "f32", [3, 2, 1, 1], ["x", "tk"]),
         ("out", "ADD", "f32", [4, 2, 1, 1], ["x", "x"]),
         ("pos", "ADD", "i32", [4, 1, 1, 1], ["p", "p"])]


def values():
    rng = np.random.default_rng(0)
    v = {k: rng.standard_normal(int(np.prod(ne))).astype(np.float32) for k, (_, _, t, ne, _) in enumerate(GRAPH)
         if t == "f32"}
    v[1] = np.array([[0, 1, 2], [3, 2, 1]], np.int32)
    v[4] = np.arange(4, dtype=np.int32)
    return v


def side(tmp_path, name, edit=None, graph=GRAPH, graphs=("block",)):
    nodes = [Node(k, n, op, t, ne, src) for k, (n, op, t, ne, src) in enumerate(graph)]
    v = values()
    if edit:
        edit(v)
    for seq, kind in enumerate(graphs):
        write_dump(tmp_path / name, seq, kind, HEADER, nodes, v)
    return tmp_path / name


def scaled(k, factor):
    """An edit: node k's values times (1 + factor), so its NMSE is factor squared."""
    def edit(v):
        v[k] = v[k] * np.float32(1 + factor)
    return edit


def test_equal_runs_pass(tmp_path):
    res = compare_dirs(side(tmp_path, "a"), side(tmp_path, "b"), ["CPU", "Vulkan0"])
    assert res.ok and res.backends == ["CPU", "Vulkan0"]
    [g] = res.graphs
    assert (g["graph"], g["nodes"], g["structural"], g["worst_nmse"], g["first_bad"]) == ("block", 5, [], 0.0, None)
    assert res.format_text().startswith("xdiff CPU vs Vulkan0: PASS\n  [block] 5 nodes, structure identical")


def test_per_op_bounds(tmp_path):
    a = side(tmp_path, "a")
    # MUL_MAT's bound is 5e-4: an NMSE of 1e-4 passes, 1e-3 fails naming the node and the bound
    assert compare_dirs(a, side(tmp_path, "b", scaled(0, 1e-2)), ["cpu", "x"]).ok
    res = compare_dirs(a, side(tmp_path, "c", scaled(0, 0.04)), ["cpu", "x"])
    assert not res.ok
    bad = res.graphs[0]["first_bad"]
    assert (bad["index"], bad["name"], bad["op"], bad["threshold"]) == (0, "x", "MUL_MAT", OP_NMSE["MUL_MAT"])
    assert bad["nmse"] == pytest.approx(0.04 ** 2, rel=1e-3)
    assert "first node past its threshold: #0 x (MUL_MAT) nmse 0.0016 > 0.0005" in res.format_text()
    assert "FAIL" in res.format_text().splitlines()[0]
    # an op the table lacks takes the default bound
    assert DEFAULT_NMSE == 5e-4 and "ADD" not in OP_NMSE
    assert not compare_dirs(a, side(tmp_path, "d", scaled(3, 0.04)), ["cpu", "x"]).ok
    assert compare_dirs(a, side(tmp_path, "e", scaled(3, 0.01)), ["cpu", "x"]).ok


def test_one_bound_replaces_the_table_and_per_op_bounds_override_both(tmp_path):
    a, b = side(tmp_path, "a"), side(tmp_path, "b", scaled(0, 0.04))
    assert compare_dirs(a, b, ["cpu", "x"], nmse=1e-2).ok
    tight = compare_dirs(a, side(tmp_path, "c", scaled(3, 1e-2)), ["cpu", "x"], nmse=1e-5)
    assert not tight.ok and tight.graphs[0]["first_bad"]["threshold"] == 1e-5
    assert "(nmse bound 1e-05 for every inexact node)" in tight.format_text()
    assert compare_dirs(a, b, ["cpu", "x"], per_op={"MUL_MAT": 1e-2}).ok
    assert compare_dirs(a, b, ["cpu", "x"], per_op={"f32": 1e-2}).ok
    assert not compare_dirs(a, b, ["cpu", "x"], nmse=1.0, per_op={"MUL_MAT": 1e-4}).ok
    with pytest.raises(ValueError, match="nmse must be a non-negative number"):
        compare_dirs(a, b, ["cpu", "x"], nmse=-1)


def test_integer_nodes_compare_exactly_under_any_bound(tmp_path):
    def off_by_one(v):
        v[4] = v[4] + 1
    res = compare_dirs(side(tmp_path, "a"), side(tmp_path, "b", off_by_one), ["cpu", "x"], nmse=1.0,
                       per_op={"ADD": 1.0, "default": 1.0})
    assert not res.ok and res.graphs[0]["first_bad"]["name"] == "pos"
    assert res.graphs[0]["first_bad"]["threshold"] == 0.0


def test_a_top_k_in_another_order_and_what_reads_it_compare_as_multisets(tmp_path):
    def reorder(v):
        v[1] = v[1][:, ::-1].copy()
        v[2] = v[2].reshape(2, 3)[:, ::-1].ravel().copy()  # the rows it gathered, in that order
    res = compare_dirs(side(tmp_path, "a"), side(tmp_path, "b", reorder), ["cpu", "x"])
    assert res.ok, res.format_text()
    assert res.graphs[0]["order_dependent"] == 2
    assert "2 nodes follow a top-k in another order (compared as multisets)" in res.format_text()

    def other_set(v):
        v[1] = np.array([[0, 1, 3], [3, 2, 1]], np.int32)
    assert not compare_dirs(side(tmp_path, "a"), side(tmp_path, "c", other_set), ["cpu", "x"]).ok


def test_structure_and_missing_graphs_fail(tmp_path):
    a = side(tmp_path, "a")
    renamed = [("y",) + GRAPH[0][1:]] + GRAPH[1:]
    res = compare_dirs(a, side(tmp_path, "b", graph=renamed), ["cpu", "x"], nmse=1.0)
    assert not res.ok and res.graphs[0]["structural"]
    assert "structure DIFFERS" in res.format_text()
    two = side(tmp_path, "c", graphs=("block", "block"))
    res = compare_dirs(two, a, ["cpu", "x"])
    assert not res.ok and [g["nodes"] for g in res.graphs] == [5, None]


def test_a_node_without_values_on_a_side_fails_unless_it_is_a_quantized_caches(tmp_path):
    def drop(v):
        del v[3]
    res = compare_dirs(side(tmp_path, "a"), side(tmp_path, "b", drop), ["cpu", "x"])
    assert not res.ok and res.graphs[0]["not_compared"] == ["out"]
    cache = [GRAPH[0], GRAPH[1], GRAPH[2], ("cache_k_l0 (view)",) + GRAPH[3][1:], GRAPH[4]]
    assert compare_dirs(side(tmp_path, "c", graph=cache), side(tmp_path, "d", drop, graph=cache), ["cpu", "x"]).ok


def test_a_filter_keeps_the_comparison_to_its_nodes(tmp_path):
    a, b = side(tmp_path, "a"), side(tmp_path, "b", scaled(3, 0.5))
    res = compare_dirs(a, b, ["cpu", "x"], select=NodeFilter.build(ops=["MUL_MAT"]))
    assert res.ok and res.selection == "-o MUL_MAT"
    assert "(only the nodes -o MUL_MAT)" in res.format_text()
    assert not compare_dirs(a, b, ["cpu", "x"], select=NodeFilter.build(names=["out"])).ok
    with pytest.raises(FilterError, match="selects no node"):
        compare_dirs(a, b, ["cpu", "x"], select=NodeFilter.build(ops=["CONV_3D"]))


def test_xdiff_runs_the_scenario_on_both_backends(tmp_path, models_dir):
    from make_references import build_model
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    with pytest.raises(ValueError, match="compares two backends"):
        xdiff(model, load_scenario(case / "scenario.json"), ["cpu"])
    res = xdiff(model, load_scenario(case / "scenario.json"), ["cpu", "cpu"], out=tmp_path)
    assert isinstance(res, XDiffResult) and res.ok, res.format_text()
    assert [g["worst_nmse"] for g in res.graphs] == [0.0, 0.0]
    # the same backend twice: two folders still, each with every value kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu", "cpu-2"]
    for d in ("cpu", "cpu-2"):
        assert all(all(x.values(n.index) is not None for n in x.nodes) for x in load_dump_dir(tmp_path / d))
    assert json.loads(json.dumps(res.to_dict()))["backends"] == ["cpu", "cpu"]
