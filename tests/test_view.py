"""Viewers (networkx, DOT/SVG, HTML, Model Explorer), trace in eval-callback format, importers."""

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.cli import main as cli_main
from graphgen.diff import diff_dumps
from graphgen.dump import FORMAT, Dump, Node, dump_files, load_dump, write_dump
from graphgen.view import dot as D
from graphgen.view import graph as V
from graphgen.view.diffmap import STATUS_COLOURS, diff_map
from graphgen.view.explorer import export, graph_json
from graphgen.view.html import to_html
from graphgen.view.importers import import_file, import_text, project
from graphgen.view.trace import header_line, value_lines

CASES = sorted(p.name for p in REF_DIR.iterdir() if (p / "case.json").is_file())
REF_FILES = [f for c in CASES for f in dump_files(REF_DIR / c)]
IDS = [f"{f.parent.name}/{f.stem}" for f in REF_FILES]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _page_data(page: str) -> dict:
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(m.group(1).replace("<\\/", "</"))


# ---- networkx ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", REF_FILES, ids=IDS)
def test_networkx_every_reference_dump(path):
    d = load_dump(path)
    g = V.from_dump(d)
    assert V.graph_nodes(g) == list(range(len(d.nodes)))
    for n in d.nodes:
        attrs = g.nodes[n.index]
        assert (attrs["name"], attrs["op"], attrs["type"], attrs["ne"]) == (n.name, n.op, n.type, n.ne)
        # every source is an edge: from the producing node, or from a leaf
        assert g.in_degree(n.index) == len({s for s in n.src if s} | ({n.view_src} - {None}))
    assert nx.is_directed_acyclic_graph(g)
    # the layers partition the graph nodes
    assert sum(len(ks) for _, ks in V.iter_layer_nodes(g)) == len(d.nodes)


def test_networkx_queries():
    d = load_dump(REF_DIR / "dflash-iswa-fa-off" / "01-block.json")
    g = V.from_dump(d)
    assert V.layers(g) == [None, 0, 1, 2]
    sub = V.layer_subgraph(g, 1, leaves=False)
    names = {sub.nodes[k]["name"] for k in sub}
    assert "kq-1" in names and "l_out-1" in names and "kq-0" not in names
    assert {"node_43", " (reshaped)"} <= names  # automatic names follow their source's layer
    path = V.path_between(g, "inp_noise_embd", "result_output")
    assert g.nodes[path[0]]["name"] == "inp_noise_embd" and g.nodes[path[-1]]["name"] == "result_output"
    assert any(g.nodes[k]["name"] == "l_out-2" for k in path)
    anc = V.ancestors_of(g, "kq-0")
    anc_names = {g.nodes[k]["name"] for k in anc}
    assert {"inp_noise_embd", "Qcur-0", "cache_k_l0 (view)"} <= anc_names
    assert all(k < V.find(g, "kq-0") for k in anc)
    assert V.layer_overview(g).has_edge("layer 0", "layer 1")


# ---- DOT / SVG --------------------------------------------------------------------------------

@pytest.mark.parametrize("path", REF_FILES, ids=IDS)
def test_dot_every_reference_dump(path):
    d = load_dump(path)
    g = V.from_dump(d)
    text = D.to_dot(g, path.stem)
    layers = [il for il in V.layers(g) if il is not None]
    assert re.findall(r"subgraph cluster_layer_(\d+) \{", text) == [str(il) for il in sorted(layers)]
    for n in d.nodes:
        assert len(re.findall(rf"^\s*n{n.index} \[", text, re.M)) == 1
        assert f'fillcolor="{D.op_colour(n.op)}"' in re.search(rf"^\s*n{n.index} \[.*$", text, re.M).group(0)
    leaves = [k for k, a in g.nodes(data=True) if a["kind"] == "leaf"]
    assert text.count("shape=ellipse, fontsize=7") == len(leaves)
    # a node sits in the cluster of its layer
    for il in layers:
        body = text.split(f"subgraph cluster_layer_{il} {{")[1].split("\n  }")[0]
        for k in V.graph_nodes(V.layer_subgraph(g, il)):
            assert re.search(rf"^\s*n{k} \[", body, re.M)


@pytest.mark.skipif(not D.dot_available(), reason="Graphviz dot is not installed")
@pytest.mark.parametrize("path", REF_FILES, ids=IDS)
def test_svg_every_reference_dump(path):
    d = load_dump(path)
    svg = D.render_svg(D.to_dot(V.from_dump(d), path.stem))
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    titles = re.findall(r"<title>(n\d+)</title>", svg)
    assert sorted(titles) == sorted(f"n{k}" for k in range(len(d.nodes)))
    assert len(re.findall(r"<title>cluster_layer_\d+</title>", svg)) == len(
        [il for il in V.layers(V.from_dump(d)) if il is not None])


def test_svg_without_graphviz_says_so(monkeypatch):
    monkeypatch.setattr(D.shutil, "which", lambda name: None)
    with pytest.raises(D.ViewError, match="apt-get install graphviz"):
        D.render_svg("digraph { a }")


# ---- seeded changes ---------------------------------------------------------------------------

def _seeded(tmp_path):
    """ref = the plain DFlash block; ours with a changed op (node 40), node 60 deleted, a node
    inserted after 70, and the values of node 20 perturbed."""
    src = REF_DIR / "dflash-fa-off" / "01-block.json"
    ref = load_dump(src)
    vals = {i: ref.values(i) for i in range(len(ref.nodes)) if ref.values(i) is not None}
    nodes = [dataclasses.replace(n) for n in ref.nodes]
    nodes[40] = dataclasses.replace(nodes[40], op="SUB")
    vals[20] = vals[20] + 1.0
    extra = dataclasses.replace(nodes[70], name="extra_scale-1", op="SCALE", src=[nodes[70].name], view_src=None)
    order = [nodes[i] for i in range(71)] + [extra] + [nodes[i] for i in range(71, len(nodes)) if i != 60]
    order = [n for n in order if n is not nodes[60]]
    new_vals, out_nodes = {}, []
    for k, n in enumerate(order):
        old = n.index
        out_nodes.append(dataclasses.replace(n, index=k))
        if n is not extra and old in vals:
            new_vals[k] = vals[old]
    header = {"source": ref.source, "model": ref.model, "settings": ref.settings, "cpu_features": ref.cpu_features}
    p = write_dump(tmp_path / "ours", 1, "block", header, out_nodes, new_vals)
    return ref, load_dump(p)


def test_diff_statuses_and_colours(tmp_path):
    ref, ours = _seeded(tmp_path)
    res = diff_dumps(ref, ours)
    dm = diff_map(res, ref, ours)
    st = {i: r.status for i, r in dm.ref_status.items()}
    assert st[20] == "value" and st[40] == "changed" and st[60] == "missing"
    assert [r.status for r in dm.rows if r.ref is None] == ["extra"]
    assert st[0] == "matched" and dm.first.ref == 20
    assert dm.ref_status[20].nmse > 1e-3
    # DOT: fill by status, the first divergence outlined
    status = {i: (r.status, r.nmse) for i, r in dm.ref_status.items()}
    text = D.to_dot(V.from_dump(ref), "diff", status, dm.first.ref)
    for i, s in ((20, "value"), (40, "changed"), (60, "missing"), (0, "matched")):
        line = re.search(rf"^\s*n{i} \[.*$", text, re.M).group(0)
        assert f'fillcolor="{STATUS_COLOURS[s]}"' in line
    assert 'color="#d50000", penwidth=3' in re.search(r"^\s*n20 \[.*$", text, re.M).group(0)
    # HTML: statuses and NMSE in the page data, first divergence row
    data = _page_data(to_html(ref, ours, res))
    f = {k: i for i, k in enumerate(data["fields"])}
    by_ref = {r[f["ref"]]: r for r in data["rows"] if r[f["ref"]] is not None}
    assert by_ref[40][f["status"]] == "changed" and by_ref[60][f["status"]] == "missing"
    assert by_ref[20][f["nmse"]] > 1e-3
    assert data["rows"][data["first"]][f["ref"]] == 20
    assert sum(r[f["status"]] == "extra" for r in data["rows"]) == 1
    # Model Explorer: diff attribute and NMSE overlay
    gj = graph_json(ref, status={i: r.status for i, r in dm.ref_status.items()})
    node40 = next(n for n in gj["graphs"][0]["nodes"] if n["id"] == "40")
    assert {"key": "diff", "value": "changed"} in node40["attrs"]
    assert node40["style"]["backgroundColor"] == STATUS_COLOURS["changed"]


# ---- HTML -------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", REF_FILES, ids=IDS)
def test_html_every_reference_dump(path):
    d = load_dump(path)
    page = to_html(d)
    assert "http://" not in page and "https://" not in page and "<link" not in page  # no network
    data = _page_data(page)
    f = {k: i for i, k in enumerate(data["fields"])}
    assert [r[f["name"]] for r in data["rows"]] == [n.name for n in d.nodes]
    assert sorted(r[f["ref"]] for r in data["rows"]) == list(range(len(d.nodes)))


def _chromium(url: str, tmp_path: Path) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chrome-profile'}",
           "--virtual-time-budget=5000", "--dump-dom", url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_html_diff_in_headless_chromium(tmp_path):
    ref, ours = _seeded(tmp_path)
    page = tmp_path / "diff.html"
    page.write_text(to_html(ref, ours))
    dom = _chromium(page.as_uri() + "#search=kq_soft_max-1", tmp_path)
    assert 'data-ready="1"' in dom, "the page script did not finish"
    errors = re.search(r'<div id="errors"[^>]*>(.*?)</div>', dom, re.S)
    assert errors and errors.group(1).strip() == "", f"JS errors: {errors.group(1) if errors else dom[:500]}"
    # the first divergence (node 20, a value change) is highlighted
    first = re.findall(r'<div class="node[^"]*first-divergence[^"]*" data-row="(\d+)"[^>]*>'
                       r'<span class="idx">#(\d+)</span><span class="nm">([^<]*)', dom)
    assert len(first) == 1 and first[0][1] == "20" and first[0][2] == ref.nodes[20].name
    # the search found the node, selected it and listed it
    hit = re.findall(r'<div class="node[^"]*\bhit\b[^"]*"[^>]*><span class="idx">#(\d+)</span>'
                     r'<span class="nm">([^<]*)', dom)
    assert hit == [(str(next(n.index for n in ref.nodes if n.name == "kq_soft_max-1")), "kq_soft_max-1")]
    assert re.search(r'<div id="results"><p>1 match</p>', dom)
    # other layers stay collapsed
    assert len(re.findall(r'class="layer"', dom)) >= 1


def _big_dump(n=100_000, per_layer=100) -> Dump:
    ops = ["RMS_NORM", "MUL", "MUL_MAT", "ADD", "ROPE", "SOFT_MAX", "VIEW", "PERMUTE", "CONT", "SILU"]
    nodes, prev = [], "inp"
    for k in range(n):
        il = k // per_layer
        name = f"x{k % per_layer}-{il}" if k % 7 else f"node_{k}"
        nodes.append(Node(k, name, ops[k % 10], "f32", [64, 4, 1, 1], [prev, f"blk.{il}.w"]))
        prev = name
    return Dump(path=Path("00-block.json"), format=FORMAT, source={"engine": "graphgen"}, model="big.gguf",
                graph="block", settings={}, cpu_features={}, nodes=nodes)


def test_100k_nodes_overview_and_html(tmp_path):
    d = _big_dump()
    t0 = time.perf_counter()
    text = D.overview_dot(d.nodes, "big")
    assert time.perf_counter() - t0 < 2.0
    assert text.count("nodes\\n") == 1000 and "layer_0 -> layer_1;" in text
    page = to_html(d)
    (tmp_path / "big.html").write_text(page)
    if CHROMIUM is None:
        pytest.skip("chromium is not installed")
    t0 = time.perf_counter()
    dom = _chromium((tmp_path / "big.html").as_uri() + "#search=x5-999", tmp_path)
    assert time.perf_counter() - t0 < 60
    assert 'data-ready="1"' in dom
    # collapsed by default: only the searched node's layer was put in the page
    assert len(re.findall(r'class="layer', dom)) == 1000
    assert 0 < len(re.findall(r'<div class="node', dom)) <= 100


# ---- Model Explorer ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", REF_FILES, ids=IDS)
def test_explorer_every_reference_dump(path, tmp_path):
    d = load_dump(path)
    paths = export(tmp_path, d, d)
    gj = json.loads(paths[0].read_text())
    nodes = gj["graphs"][0]["nodes"]
    ids = [n["id"] for n in nodes]
    assert len(ids) == len(set(ids))
    assert sorted(int(i) for i in ids if i.isdigit()) == list(range(len(d.nodes)))
    g = V.from_dump(d)
    for n in nodes:
        if n["id"].isdigit():
            il = g.nodes[int(n["id"])]["layer"]
            assert n["namespace"] == ("" if il is None else f"layer_{il}")
            for e in n["incomingEdges"]:
                assert e["sourceNodeId"] in set(ids)
    overlay = json.loads((tmp_path / f"{path.stem}.nmse.json").read_text())
    assert set(overlay) == {d.graph}
    if d.has_values:
        assert all(r["value"] == 0 for r in overlay[d.graph]["results"].values())
    assert {p.name.split(".")[-2] for p in paths[1:]} == {"nmse", "max_abs", "backend"}


def test_explorer_files_load_in_model_explorer(tmp_path):
    pytest.importorskip("model_explorer")
    from dacite import Config, from_dict
    from model_explorer import graph_builder as gb
    from model_explorer import node_data_builder as ndb
    from model_explorer.builtin_hfgraph_adapter import BuiltinHfGraphAdapter

    ref, ours = _seeded(tmp_path)
    paths = export(tmp_path / "me", ref, ours)
    coll = from_dict(gb.GraphCollection, json.loads(paths[0].read_text()), config=Config(strict=True))
    assert len([n for n in coll.graphs[0].nodes if n.id.isdigit()]) == len(ref.nodes)
    # the GraphCollection JSON reader Model Explorer's Python side ships
    hf = paths[0].with_suffix(".hfgraph")
    shutil.copy(paths[0], hf)
    graphs = BuiltinHfGraphAdapter().convert(str(hf), {})
    assert len(graphs["graphCollections"][0].graphs[0].nodes) == len(coll.graphs[0].nodes)
    for p in paths[1:]:
        doc = json.loads(p.read_text())
        md = ndb.ModelNodeData(graphsData={k: from_dict(ndb.GraphNodeData, v, config=Config(strict=True))
                                           for k, v in doc.items()})
        assert set(md.graphsData) == {"block"}
        md.to_json_string()
    nmse = json.loads((tmp_path / "me" / "01-block.nmse.json").read_text())["block"]["results"]
    assert nmse["20"]["value"] > 1e-3 and nmse["0"]["value"] == 0
    import model_explorer
    cfg = model_explorer.config().add_model_from_path(str(paths[0]))
    for p in paths[1:]:
        cfg.add_node_data_from_path(str(p))
    assert len(cfg.node_data_sources) == 3


# ---- eval-callback format ---------------------------------------------------------------------

C_PRINTER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#define INDENT "    "
#define LOG printf
static void nestr(char * s, const int64_t * ne) { sprintf(s, "%lld, %lld, %lld, %lld", (long long) ne[0], (long long) ne[1], (long long) ne[2], (long long) ne[3]); }
static void rd(FILE * f, char * buf) { fgets(buf, 256, f); buf[strcspn(buf, "\n")] = 0; }
/* common/debug.cpp: common_debug_print_tensor for f32 data, and the callback's header line */
static void print_tensor(const float * data, const int64_t * ne, int64_t n) {
    float sum = 0;
    for (int64_t i = 0; i < ne[0]*ne[1]*ne[2]*ne[3]; i++) sum += data[i];
    for (int64_t i3 = 0; i3 < ne[3]; i3++) {
        LOG(INDENT "[\n");
        for (int64_t i2 = 0; i2 < ne[2]; i2++) {
            if (i2 == n && ne[2] > 2 * n) { LOG(INDENT INDENT "..., \n"); i2 = ne[2] - n; }
            LOG(INDENT INDENT "[\n");
            for (int64_t i1 = 0; i1 < ne[1]; i1++) {
                if (i1 == n && ne[1] > 2 * n) { LOG(INDENT INDENT INDENT "..., \n"); i1 = ne[1] - n; }
                LOG(INDENT INDENT INDENT "[");
                for (int64_t i0 = 0; i0 < ne[0]; i0++) {
                    if (i0 == n && ne[0] > 2 * n) { LOG("   ..., "); i0 = ne[0] - n; }
                    const float v = data[((i3*ne[2] + i2)*ne[1] + i1)*ne[0] + i0];
                    LOG("%12.4f", v);
                    if (i0 < ne[0] - 1) LOG(", ");
                }
                LOG("  ],\n");
            }
            LOG(INDENT INDENT "],\n");
        }
        LOG(INDENT "]\n");
        LOG(INDENT "sum = %f\n", sum);
    }
}
int main(int argc, char ** argv) {
    FILE * f = fopen(argv[1], "r");
    char name[256], type[256], op[256], s0[256], s1[256], line[256];
    while (fgets(name, 256, f)) {
        name[strcspn(name, "\n")] = 0;
        rd(f, type); rd(f, op); rd(f, s0);
        int64_t ne0[4], ne1[4], ne[4]; char a[128], b[128], c[128];
        rd(f, line); sscanf(line, "%lld %lld %lld %lld", (long long*)&ne0[0], (long long*)&ne0[1], (long long*)&ne0[2], (long long*)&ne0[3]);
        rd(f, s1);
        rd(f, line); sscanf(line, "%lld %lld %lld %lld", (long long*)&ne1[0], (long long*)&ne1[1], (long long*)&ne1[2], (long long*)&ne1[3]);
        rd(f, line); sscanf(line, "%lld %lld %lld %lld", (long long*)&ne[0], (long long*)&ne[1], (long long*)&ne[2], (long long*)&ne[3]);
        int64_t n = ne[0]*ne[1]*ne[2]*ne[3];
        float * data = malloc(n * sizeof(float));
        for (int64_t i = 0; i < n; i++) { rd(f, line); data[i] = strtof(line, NULL); }
        char src1_str[128] = { 0 };
        nestr(b, ne1);
        if (strcmp(s1, "-") != 0) snprintf(src1_str, sizeof(src1_str), "%s{%s}", s1, b);
        nestr(a, ne0); nestr(c, ne);
        LOG("%s: %24s = (%s) %10s(%s{%s}, %s}) = {%s}\n", "common_debug_cb_eval", name, type, op, s0, a,
            strcmp(s1, "-") != 0 ? src1_str : "", c);
        print_tensor(data, ne, 3);
        free(data);
    }
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_trace_format_matches_debug_cpp_byte_for_byte(tmp_path):
    rng = np.random.default_rng(0)
    cases = [("inp_embd", "f32", "GET_ROWS", ("token_embd.weight", [64, 256, 1, 1]), ("inp_tokens", [4, 1, 1, 1]), [64, 4, 1, 1]),
             (" (reshaped)", "f32", "RESHAPE", ("node_3", [64, 4, 1, 1]), None, [16, 4, 4, 1]),
             ("Qcur-0 (view) (permuted) long", "f16", "PERMUTE", ("Qcur-0 (view)", [16, 4, 4, 1]), None, [16, 4, 4, 1]),
             ("kq-0", "f32", "MUL_MAT", ("cache_k_l0 (view) (permuted)", [16, 256, 4, 1]), ("q", [16, 4, 4, 1]), [7, 8, 9, 2]),
             ("s", "f32", "SUM", ("x", [5, 1, 1, 1]), None, [1, 1, 1, 1]),
             ("nan-0", "f32", "DIV", ("a", [6, 1, 1, 1]), ("b", [6, 1, 1, 1]), [6, 1, 1, 1])]
    spec, expected = [], []
    for name, typ, op, s0, s1, ne in cases:
        vals = (rng.standard_normal(int(np.prod(ne))) * 3).astype(np.float32)
        if name.startswith("nan"):
            vals[2] = np.nan
        spec += [name, typ, op, s0[0], " ".join(map(str, s0[1])), s1[0] if s1 else "-",
                 " ".join(map(str, s1[1] if s1 else [0, 0, 0, 0])), " ".join(map(str, ne))]
        spec += [float(v).hex() for v in vals]
        expected.append(header_line(name, typ, op, s0, s1, ne))
        expected += value_lines(vals.reshape(tuple(reversed(ne))))
    (tmp_path / "in.txt").write_text("\n".join(spec) + "\n")
    (tmp_path / "p.c").write_text(C_PRINTER)
    subprocess.run(["cc", "-O0", "-o", str(tmp_path / "p"), str(tmp_path / "p.c")], check=True)
    got = subprocess.run([str(tmp_path / "p"), str(tmp_path / "in.txt")], capture_output=True, text=True,
                         check=True).stdout
    assert got.splitlines() == expected


def test_trace_dflash_block_matches_reference(tmp_path, models_dir):
    from make_references import build_model

    from graphgen.scenario import load_scenario
    from graphgen.view.trace import run_trace
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    buf = io.StringIO()
    assert run_trace(model, load_scenario(case / "scenario.json"), buf, dump_dir=tmp_path / "d") == 0
    text = buf.getvalue()
    ref = load_dump(case / "01-block.json")
    block = text.split("graphgen trace: graph 01-block\n")[1]
    heads = [ln for ln in block.splitlines() if ln.startswith("common_debug_cb_eval: ")]
    assert len(heads) == len(ref.nodes)
    # line for line: the header llama.cpp prints for the reference's node, where the reference
    # knows the source shapes (node sources; leaves' shapes are not in dumps)
    latest = {}
    for line, n in zip(heads, ref.nodes):
        m = re.match(r"common_debug_cb_eval: (.{24,}) = \((\w+)\) +(\S+)\((.*)\) = \{(.*)\}$", line)
        assert m, line
        name = m.group(1).lstrip() if len(m.group(1)) == 24 else m.group(1)
        assert (name, m.group(2), m.group(3), m.group(5)) == (n.name.lstrip() if len(n.name) < 24 else n.name,
                                                           n.type, n.op, ", ".join(map(str, n.ne)))
        for s in n.src[:2]:
            if s in latest:
                assert f"{s}{{{', '.join(map(str, latest[s].ne))}}}" in m.group(4)
        want = header_line(n.name, n.type, n.op,
                           (n.src[0], latest[n.src[0]].ne) if n.src[0] in latest else None,
                           (n.src[1], latest[n.src[1]].ne) if len(n.src) > 1 and n.src[1] in latest else None,
                           n.ne)
        if n.src[0] in latest and (len(n.src) < 2 or n.src[1] in latest):
            assert line == want
        latest[n.name] = n
    # parsing the text back gives the dump's structure
    dumps = import_text(text)
    assert [d.graph for d in dumps] == ["inject", "block"]
    for d, f in zip(dumps, ["00-inject", "01-block"]):
        res = diff_dumps(project(load_dump(case / f"{f}.json"), "eval-callback"), d)
        assert res.identical, res.format_text()
        res = diff_dumps(project(load_dump(tmp_path / "d" / f"{f}.json"), "eval-callback"), d)
        assert res.identical, res.format_text()


def test_trace_cli_filter(tmp_path, models_dir, capsys):
    from make_references import build_model
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    assert cli_main(["trace", str(model), "--scenario", str(case / "scenario.json"), "--filter", "kq"]) == 0
    heads = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("common_debug_cb_eval")]
    names = [ln.split(" = (")[0].split(": ", 1)[1].strip() for ln in heads]
    assert names and all(n.startswith("kq") for n in names)
    assert "kq-0" in names and "kq_soft_max-1" in names
    assert cli_main(["trace", str(model), "--scenario", str(case / "scenario.json"), "--filter", "("]) == 2


def test_nan_sum_prints_as_glibc_does():
    lines = value_lines(np.array([1.0, np.nan, 2.0], dtype=np.float32).reshape(1, 1, 1, 3))
    assert lines[-1] == "    sum = nan"
    assert "         nan" in lines[2]


# ---- importers --------------------------------------------------------------------------------

def _capture_built_graphs(monkeypatch, tmp_path):
    """Wrap the graph builder: keep each built graph as networkx and as ggml_graph_dump_dot."""
    import graphgen.runtime.session as S
    from graphgen.ops import ggml as G
    built = []
    orig = S.build_arch_graph

    def wrapper(params):
        g = orig(params)
        path = tmp_path / f"g{len(built)}.dot"
        G.ggml_graph_dump_dot(g.gf, g.gf, str(path).encode())
        built.append((V.from_cgraph(g.gf), path))
        return g
    monkeypatch.setattr(S, "build_arch_graph", wrapper)
    return built


def test_built_graph_networkx_and_dot_import(monkeypatch, tmp_path, models_dir):
    from make_references import build_model

    from graphgen.engine import run_scenario
    from graphgen.scenario import load_scenario
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    built = _capture_built_graphs(monkeypatch, tmp_path)
    run_scenario(model, load_scenario(case / "scenario.json"), tmp_path / "d")
    assert len(built) == 2
    for (g, dot_path), f in zip(built, ["00-inject", "01-block"]):
        ref = load_dump(case / f"{f}.json")
        assert [g.nodes[k]["name"] for k in V.graph_nodes(g)] == [n.name for n in ref.nodes]
        assert [g.nodes[k]["op"] for k in V.graph_nodes(g)] == [n.op for n in ref.nodes]
        leaf = g.nodes[V.leaf_key("token_embd.weight")] if f == "01-block" else g.nodes[V.leaf_key("fc.weight")]
        assert leaf["kind"] == "leaf" and leaf["ne"] is not None
        (imported,) = import_file(dot_path)
        res = diff_dumps(project(ref, "dot"), imported)
        assert res.identical, res.format_text()


def test_sched_debug_import(tmp_path, models_dir):
    from make_references import build_model
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    env = dict(os.environ, GGML_SCHED_DEBUG="2")
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "dump", str(model), "--scenario",
                        str(case / "scenario.json"), "--out", str(tmp_path / "d")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    log = tmp_path / "sched.log"
    log.write_text(p.stderr)
    dumps = import_file(log)
    assert [d.graph for d in dumps] == ["inject", "block"]
    assert set(dumps[1].source["import"]["backends"].values()) == {"CPU"}
    for d, f in zip(dumps, ["00-inject", "01-block"]):
        res = diff_dumps(project(load_dump(case / f"{f}.json"), "sched-debug"), d)
        assert res.identical, res.format_text()
    # the CLI: import to a folder, and diff takes the log directly
    assert cli_main(["import", str(log), "--out", str(tmp_path / "imp")]) == 0
    assert len(dump_files(tmp_path / "imp")) == 2
    assert cli_main(["diff", str(case), str(log)]) == 0


def test_eval_callback_import_splits_plain_logs():
    text = ("llama_context: graph nodes = 2\n"
            "common_debug_cb_eval:                 inp_embd = (f32)   GET_ROWS(token_embd.weight{8, 16, 1, 1}, "
            "inp_tokens{2, 1, 1, 1}}) = {8, 2, 1, 1}\n"
            "    [\n        [\n            [      1.0000,       2.0000  ],\n        ],\n    ]\n    sum = 3.000000\n"
            "common_debug_cb_eval:                   norm-0 = (f32)   RMS_NORM(CUDA0#inp_embd#0{8, 2, 1, 1}, }) = {8, 2, 1, 1}\n"
            "llama_decode: next batch\n"
            "common_debug_cb_eval:                 inp_embd = (f32)   GET_ROWS(token_embd.weight{8, 16, 1, 1}, "
            "inp_tokens{1, 1, 1, 1}}) = {8, 1, 1, 1}\n")
    dumps = import_text(text, graph="block")
    assert [len(d.nodes) for d in dumps] == [2, 1]
    n = dumps[0].nodes[1]
    assert (n.name, n.op, n.src, n.ne) == ("norm-0", "RMS_NORM", ["inp_embd"], [8, 2, 1, 1])
    with pytest.raises(Exception, match="not an eval-callback log"):
        import_text("hello\n")


# ---- CLI --------------------------------------------------------------------------------------

def test_view_cli(tmp_path, capsys):
    case = REF_DIR / "dflash-iswa-fa-off"
    assert cli_main(["view", str(case / "01-block.json"), "--format", "dot", "--layer", "1"]) == 0
    out = capsys.readouterr().out
    assert "cluster_layer_1" in out and "cluster_layer_0" not in out
    assert cli_main(["view", str(case / "01-block.json"), "--format", "dot", "--around", "kq-2", "--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert "kq-2" in out and "kq_soft_max-2" in out and "l_out-0" not in out
    assert cli_main(["view", str(case), "--format", "html", "--out", str(tmp_path / "h")]) == 0
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["00-inject.html", "01-block.html"]
    assert cli_main(["view", str(case), str(REF_DIR / "dflash-iswa-fa-on"), "--graph", "block",
                     "--format", "explorer", "--out", str(tmp_path / "me")]) == 0
    assert (tmp_path / "me" / "01-block.nmse.json").is_file()
    assert cli_main(["view", str(case), "--format", "dot", "--overview", "--graph", "01"]) == 0
    assert "layer_2 -> global" in capsys.readouterr().out
    capsys.readouterr()
    assert cli_main(["view", str(case / "01-block.json"), "--format", "dot", "--layer", "7"]) == 2
    assert "no layer 7" in capsys.readouterr().err
    assert cli_main(["view", str(case / "01-block.json"), "--format", "dot", "--around", "nope"]) == 2
    assert cli_main(["view", str(case / "01-block.json"), "--format", "html"]) == 2


def test_trace_abort_on_nan(tmp_path, models_dir, capsys):
    import gguf
    from make_references import build_model
    case = REF_DIR / "dflash-fa-off"
    model = tmp_path / "nan.gguf"
    shutil.copy(build_model(case, models_dir), model)
    r = gguf.GGUFReader(str(model), "r+")
    t = next(t for t in r.tensors if t.name == "blk.1.attn_norm.weight")
    t.data[...] = np.nan
    r.data.flush()
    del r
    assert cli_main(["trace", str(model), "--scenario", str(case / "scenario.json"), "--abort-on-nan"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "encountered NaN - aborting"
    last = [ln for ln in out if ln.startswith("common_debug_cb_eval")][-1]
    assert "blk.1.attn_norm.weight" in last and out[-2].endswith("nan")
    block = out[out.index("graphgen trace: graph 01-block"):]
    assert 0 < sum(ln.startswith("common_debug_cb_eval") for ln in block) < 84  # stopped inside the block
