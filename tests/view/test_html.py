"""graphgen.view.html: the self-contained page for one dump or a diff of two: its data rows
(fields in FIELDS order, sources as row numbers, statistics and first values, backends, diff
statuses), its title and summary, and the NMSE plot along the graph."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from graphgen.compare.diff import diff_dumps
from graphgen.dump.format import FORMAT, Dump, Node, load_dump, write_dump
from graphgen.view import html as H
from graphgen.view.diffmap import STATUS_COLOURS

EPS = 0x3727C5AC
HEADER = {"source": {"engine": "graphgen", "version": "0.1.0", "backend": "Vulkan0"}, "model": "m.gguf",
          "settings": {"flash_attn": False, "type_k": "f16", "type_v": "f16", "n_ctx": 8, "n_ubatch": 8, "n_kv": 8,
                       "causal": True}, "cpu_features": {}}
NODES = [
    Node(0, "inp_embd", "GET_ROWS", "f32", [4, 2, 1, 1], ["token_embd.weight", "inp_tokens"]),
    Node(1, "norm-0", "RMS_NORM", "f32", [4, 2, 1, 1], ["inp_embd"], op_params=[EPS] + [0] * 15, backend="CPU"),
    Node(2, "</script>-0", "ADD", "f32", [4, 2, 1, 1], ["norm-0", "inp_embd"]),
]


def values():
    v = {k: np.arange(8, dtype=np.float32) - k for k in range(3)}
    v[2][3] = np.nan
    return v


def data_of(page):
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.DOTALL).group(1)
    return json.loads(blob)


def rows_of(page):
    d = data_of(page)
    return [dict(zip(d["fields"], r)) for r in d["rows"]]


@pytest.fixture
def ref(tmp_path):
    return load_dump(write_dump(tmp_path / "ref", 1, "block", HEADER, NODES, values()))


def test_a_single_dumps_page(ref):
    page = H.to_html(ref)
    assert page.startswith("<!DOCTYPE html>") and "%%" not in page
    assert "<title>block graph of m.gguf, graphgen 0.1.0</title>" in page
    assert '<div id="summary">3 nodes, block graph, m.gguf, graphgen 0.1.0</div>' in page
    d = data_of(page)
    assert d["mode"] == "single" and d["fields"] == list(H.FIELDS) and d["first"] is None
    assert d["opKinds"] == {"GET_ROWS": "layout", "RMS_NORM": "norm", "ADD": "elementwise"}
    rows = rows_of(page)
    assert [(r["name"], r["op"], r["layer"], r["ref"]) for r in rows] == [
        ("inp_embd", "GET_ROWS", None, 0), ("norm-0", "RMS_NORM", 0, 1), ("</script>-0", "ADD", 0, 2)]
    # sources as [name, producing row] (-1: a leaf)
    assert rows[0]["src"] == [["token_embd.weight", -1], ["inp_tokens", -1]]
    assert rows[2]["src"] == [["norm-0", 1], ["inp_embd", 0]]
    assert rows[1]["params"] == "eps=1e-05" and rows[0]["params"] == ""
    # the node's backend, else the one the dump's source names
    assert rows[1]["backend"] == "CPU" and rows[0]["backend"] == "Vulkan0"
    # statistics from the recorded stats: [min, max, mean, nan, inf, count]; first values, NaN spelled out
    assert rows[0]["stats"] == [0.0, 7.0, 3.5, 0, 0, 8]
    assert rows[2]["stats"][3] == 1 and rows[2]["stats"][:2] == [-2.0, 5.0]
    assert rows[2]["vals"][:4] == [-2.0, -1.0, 0.0, "nan"] and len(rows[2]["vals"]) == H.N_FIRST_VALUES
    assert rows[0]["status"] == "" and rows[0]["nmse"] is None
    # a name holding </script> cannot end the data early
    assert "<\\/script>-0" in page


def test_stats_from_values_when_the_dump_records_none():
    d = Dump(path=Path("00-block.json"), format=FORMAT, source={"engine": "graphgen", "version": "1"}, model="m",
             graph="block", settings={}, cpu_features={}, nodes=[Node(0, "x", "ADD", "f32", [2, 1, 1, 1])])
    assert rows_of(H.to_html(d))[0]["stats"] is None


def test_a_diffs_page(ref, tmp_path):
    v = values()
    v[2] = v[2] * np.float32(2)
    changed = [NODES[0], NODES[1], Node(2, "</script>-0", "SUB", "f32", [4, 2, 1, 1], ["norm-0", "inp_embd"]),
               Node(3, "extra", "CONT", "f32", [4, 2, 1, 1], ["</script>-0"])]
    v[3] = v[0]
    ours = load_dump(write_dump(tmp_path / "ours", 1, "block", dict(HEADER, model="other.gguf"), changed, v))
    page = H.to_html(ref, ours)
    d = data_of(page)
    assert d["mode"] == "diff"
    assert "<title>block graph: graphgen 0.1.0 on m.gguf vs graphgen 0.1.0 on other.gguf</title>" in page
    rows = rows_of(page)
    assert [(r["ref"], r["ours"], r["status"]) for r in rows] == [(0, 0, "matched"), (1, 1, "matched"),
                                                                 (2, 2, "changed"), (None, 3, "inserted")]
    assert rows[2]["changes"] == [["op", "ADD", "SUB"]]
    assert rows[0]["nmse"] == 0.0 and rows[1]["ostats"] == rows[1]["stats"]
    # an inserted node's side is ours: its statistics under ostats, its sources by row
    assert rows[3]["stats"] is None and rows[3]["ostats"] == [0.0, 7.0, 3.5, 0, 0, 8]
    assert rows[3]["src"] == [["</script>-0", 2]] and rows[3]["obackend"] == "Vulkan0"
    assert d["firstStructural"] == 2 and d["first"] == 2
    summary = re.search(r'<div id="summary">(.*?)</div>', page).group(1)
    assert summary.startswith("DIVERGED: ref 3 nodes, ours 4; ")
    assert "0 deleted, 1 inserted" in summary
    assert "first structural change:" in summary
    assert '<svg id="nmse-svg"' in page


def test_page_title_and_side_label(ref):
    imp = Dump(path=Path("00-block.json"), format=FORMAT, model="m.gguf", graph="block", settings={},
               cpu_features={}, nodes=[], source={"engine": "llama.cpp", "version": "b11739", "import": {"format": "dot"}})
    assert H.side_label(imp) == "llama.cpp b11739 (dot import)"
    assert H.page_title(ref, imp) == "block graph of m.gguf: graphgen 0.1.0 vs llama.cpp b11739 (dot import)"
    assert H.to_html(ref, title="mine").count("<title>mine</title>") == 1


def plot_rows(nmses, statuses=None, layers=None):
    fi = {f: i for i, f in enumerate(H.FIELDS)}
    rows = []
    for k, v in enumerate(nmses):
        r = [None] * len(H.FIELDS)
        r[fi["name"]], r[fi["nmse"]] = f"n{k}", v
        r[fi["status"]] = (statuses or {}).get(k, "matched")
        r[fi["layer"]] = (layers or [None] * len(nmses))[k]
        rows.append(r)
    return rows


def test_nmse_plot():
    svg = H.nmse_plot(plot_rows([0.0, 1e-9, None, 1e-3], statuses={3: "value"}, layers=[None, 0, 0, 1]), 1e-7)
    pts = re.findall(r'<circle class="pt" data-row="(\d+)" cx="[\d.]+" cy="([\d.]+)" r="2.6" fill="([^"]+)"', svg)
    assert [p[0] for p in pts] == ["0", "1", "3"]      # a node with no NMSE has no point
    ys = {int(k): float(y) for k, y, _ in pts}
    assert ys[0] > ys[1] > ys[3]                        # 0 lowest, larger errors higher
    assert {int(k): c for k, _, c in pts}[3] == STATUS_COLOURS["value"]
    assert '<line class="threshold"' in svg and "threshold 1.0e-07" in svg
    assert re.findall(r">(1e-?\d+)</text>", svg) == [f"1e{e}" for e in range(-9, -2)]
    assert svg.count('class="band"') == 3
    assert "3 of 3 compared nodes shown)" in svg


def test_nmse_plot_keeps_each_columns_worst_node():
    n = 2000
    nmses = [1e-9] * n
    nmses[1001] = 1e-2
    svg = H.nmse_plot(plot_rows(nmses), None, width=100)
    rows_shown = {int(k) for k in re.findall(r'data-row="(\d+)"', svg)}
    assert 1001 in rows_shown and len(rows_shown) <= 40
    assert f"of {n} compared nodes shown" in svg and "threshold" not in svg


def test_no_nan_reaches_the_pages_json(ref, tmp_path):
    v = values()
    v[1] = np.full(8, np.inf, np.float32)
    ours = load_dump(write_dump(tmp_path / "ours", 1, "block", HEADER, NODES, v))
    res = diff_dumps(ref, ours)
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', H.to_html(ref, ours, res), re.DOTALL)
    d = json.loads(blob.group(1), parse_constant=lambda c: pytest.fail(f"{c} in the page's JSON"))
    row = dict(zip(d["fields"], d["rows"][1]))
    assert row["status"] == "value" and "NaN/Inf positions differ" in row["detail"]
    assert row["ostats"] == [None, None, None, 0, 8, 8] and row["ovals"] == ["inf"] * 8
