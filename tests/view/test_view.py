"""Viewers (networkx, DOT/SVG, HTML, Model Explorer), trace in eval-callback format, importers."""

import dataclasses
import io
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.cli import main as cli_main
from graphgen.compare.diff import diff_dumps
from graphgen.dump.format import FORMAT, Dump, Node, dump_files, load_dump, write_dump
from graphgen.compare.opparams import decode_op_params, format_op_params
from graphgen.view import dot as D
from graphgen.view import graph as V
from graphgen.view.diffmap import STATUS_COLOURS, diff_map
from graphgen.view.explorer import export, graph_json
from graphgen.view.html import to_html
from graphgen.compare.importers import VIEW_OPS, import_file, import_text, project
from graphgen.view.trace import header_line, value_lines

CASES = sorted(p.name for p in REF_DIR.iterdir() if (p / "case.json").is_file())
REF_FILES = [f for c in CASES for f in dump_files(REF_DIR / c)]
IDS = [f"{f.parent.name}/{f.stem}" for f in REF_FILES]
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
NO_CHROMIUM = "no Chromium binary (chromium, chromium-browser or google-chrome) on PATH"


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
    assert st[20] == "value" and st[40] == "changed" and st[60] == "deleted"
    assert [r.status for r in dm.rows if r.ref is None] == ["inserted"]
    assert st[0] == "matched" and dm.first.ref == 20
    assert dm.ref_status[20].nmse > 1e-3
    # DOT: fill by status, the first divergence outlined
    status = {i: (r.status, r.nmse) for i, r in dm.ref_status.items()}
    text = D.to_dot(V.from_dump(ref), "diff", status, dm.first.ref)
    for i, s in ((20, "value"), (40, "changed"), (60, "deleted"), (0, "matched")):
        line = re.search(rf"^\s*n{i} \[.*$", text, re.M).group(0)
        assert f'fillcolor="{STATUS_COLOURS[s]}"' in line
    assert 'color="#d50000", penwidth=3' in re.search(r"^\s*n20 \[.*$", text, re.M).group(0)
    # HTML: statuses and NMSE in the page data, first divergence row
    data = _page_data(to_html(ref, ours, res))
    f = {k: i for i, k in enumerate(data["fields"])}
    by_ref = {r[f["ref"]]: r for r in data["rows"] if r[f["ref"]] is not None}
    assert by_ref[40][f["status"]] == "changed" and by_ref[60][f["status"]] == "deleted"
    assert by_ref[20][f["nmse"]] > 1e-3
    assert data["rows"][data["first"]][f["ref"]] == 20
    assert sum(r[f["status"]] == "inserted" for r in data["rows"]) == 1
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
    # no network: nothing fetched, linked or imported (the SVG namespace URI is a name, not a fetch)
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?(?:https?:)?//""", page)
    assert "<link" not in page and "@import" not in page and "fetch(" not in page and "XMLHttpRequest" not in page
    assert "<svg id=\"canvas\"" in page and "function layoutGroup" in page  # the drawing code is inlined
    data = _page_data(page)
    f = {k: i for i, k in enumerate(data["fields"])}
    assert [r[f["name"]] for r in data["rows"]] == [n.name for n in d.nodes]
    assert sorted(r[f["ref"]] for r in data["rows"]) == list(range(len(d.nodes)))
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert title == f"{d.graph} graph of {d.model}, {d.source['engine']} {d.source['version']}"
    for n, r in zip(d.nodes, data["rows"]):
        if n.op in ("RMS_NORM", "NORM", "L2_NORM"):
            assert r[f["params"]].startswith("eps=")
        if d.has_values and d.values(n.index) is not None:
            vals = d.values(n.index).astype(np.float64).ravel()
            # JSON has no NaN or Infinity: the page gets them as the strings Python prints
            assert r[f["vals"]] == [pytest.approx(x, rel=1e-6) if np.isfinite(x) else str(x) for x in vals[:8]]
            fin = vals[np.isfinite(vals)]
            if fin.size:
                assert r[f["stats"]][:3] == pytest.approx([fin.min(), fin.max(), fin.mean()], rel=1e-6, abs=1e-9)
            assert r[f["stats"]][3:] == [np.isnan(vals).sum(), np.isinf(vals).sum(), vals.size]


def _chromium(url: str, tmp_path: Path) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chrome-profile'}",
           "--virtual-time-budget=5000", "--dump-dom", url]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_html_diff_in_headless_chromium(tmp_path):
    ref, ours = _seeded(tmp_path)
    page = tmp_path / "diff.html"
    page.write_text(to_html(ref, ours))
    data = _page_data(page.read_text())
    f = {k: i for i, k in enumerate(data["fields"])}
    # the page opens at the first divergence (node 20, a value change): drawn, highlighted, selected
    dom = _chromium(page.as_uri(), tmp_path)
    first = re.findall(r'<g class="gnode([^"]*first-divergence[^"]*)" data-row="(\d+)"', dom)
    assert [data["rows"][int(k)][f["ref"]] for _, k in first] == [20] and "selected" in first[0][0]
    assert re.search(rf'<h3 data-row="{first[0][1]}">{re.escape(ref.nodes[20].name)} \u2014 first value failure</h3>', dom)
    dom = _chromium(page.as_uri() + "#search=kq_soft_max-1", tmp_path)
    assert 'data-ready="1"' in dom, "the page script did not finish"
    errors = re.search(r'<div id="errors"[^>]*>(.*?)</div>', dom, re.S)
    assert errors and errors.group(1).strip() == "", f"JS errors: {errors.group(1) if errors else dom[:500]}"
    # the search found the node, selected it and listed it
    hit = re.findall(r'<g class="gnode[^"]*\bhit\b[^"]*" data-row="(\d+)"', dom)
    assert [data["rows"][int(k)][f["name"]] for k in hit] == ["kq_soft_max-1"]
    assert re.search(r'<div id="results"><p>1 match</p>', dom)
    assert re.search(r'<h3 data-row="(\d+)">kq_soft_max-1</h3>', dom)
    # only the layers holding the first divergence and the hit are open
    opened = re.findall(r'<g class="glayer open[^"]*" data-group="\d+" data-layer="([^"]+)"', dom)
    assert sorted(opened) == ["layer 0", "layer 1"]


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
    t0 = time.perf_counter()
    page = to_html(d)
    assert time.perf_counter() - t0 < 10
    (tmp_path / "big.html").write_text(page)
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    t0 = time.perf_counter()
    dom = _chromium((tmp_path / "big.html").as_uri() + "#search=x5-999", tmp_path)
    assert time.perf_counter() - t0 < 60
    assert 'data-ready="1"' in dom
    # every layer drawn as a box; only the searched node's layer opened, and only its nodes drawn
    assert len(re.findall(r'<g class="glayer', dom)) == 1000
    assert re.findall(r'<g class="glayer open[^"]*" data-group="\d+" data-layer="([^"]+)"', dom) == ["layer 999"]
    rows = [int(k) for k in re.findall(r'<g class="gnode[^"]*" data-row="(\d+)"', dom)]
    assert rows and all(99_900 <= k < 100_000 for k in rows)


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
            attrs = {a["key"]: a["value"] for a in n["attrs"]}
            node = d.nodes[int(n["id"])]
            if node.op == "RMS_NORM":
                assert attrs["op_params"] == "eps=1e-06"
            if node.op == "VIEW" and node.view_offs:
                assert attrs["op_params"] == f"offset={node.view_offs}"
            if node.op in ("ADD", "MUL", "GET_ROWS", "RESHAPE"):
                assert "op_params" not in attrs
            assert ("op_params_raw" in attrs) == any(node.op_params)
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


# ---- op_params --------------------------------------------------------------------------------

def _gguf_kv(case: str, models_dir) -> dict:
    import gguf
    from make_references import build_model
    r = gguf.GGUFReader(str(build_model(REF_DIR / case, models_dir)))
    return {k: f.contents() for k, f in r.fields.items() if k.startswith("dflash.")}


def _f32(x: float) -> float:
    return float(np.float32(x))


def _nodes(case: str, graph: str = "01-block", op: str | None = None) -> tuple[Dump, list[Node]]:
    d = load_dump(REF_DIR / case / f"{graph}.json")
    return d, [n for n in d.nodes if op is None or n.op == op]


@pytest.mark.parametrize("case", ["dflash-fa-off", "dflash-fa-on", "dsv4-fa-off", "dsv4-fa-on"])
def test_op_params_norm_rope_attention_from_the_gguf(case, models_dir):
    kv = _gguf_kv(case, models_dir)
    eps = _f32(kv["dflash.attention.layer_norm_rms_epsilon"])
    head_dim = kv.get("dflash.attention.key_length", kv["dflash.embedding_length"] // kv["dflash.attention.head_count"])
    n_rot = kv.get("dflash.rope.dimension_count", head_dim)
    d, _ = _nodes(case)
    norms = [n for n in d.nodes if n.op == "RMS_NORM"]
    assert norms and all(decode_op_params(n.op, n.op_params) == {"eps": eps} for n in norms)
    assert format_op_params("RMS_NORM", norms[0].op_params) == "eps=1e-06"
    ropes = [decode_op_params(n.op, n.op_params) for n in d.nodes if n.op in ("ROPE", "ROPE_BACK")]
    assert ropes
    for r in ropes:
        assert r["n_dims"] == n_rot and r["freq_base"] == kv["dflash.rope.freq_base"]
        assert (r["freq_scale"], r["attn_factor"], r["ext_factor"]) == (1.0, 1.0, 0.0)
        if case.startswith("dsv4"):
            # DeepSeek-V4 ropes the tail of each head: normal mode, no YaRN, offset by the nope part
            assert (r["mode"], r["n_ctx_orig"], r["n_offs"]) == ("NORMAL", 0, head_dim - n_rot)
        else:
            # the DFlash backbone is Qwen3's: NeoX rope over the training context, YaRN's defaults
            assert (r["mode"], r["n_ctx_orig"], r["n_offs"]) == ("NEOX", kv["dflash.context_length"], 0)
            assert (r["beta_fast"], r["beta_slow"]) == (32.0, 1.0)
    attn = [n for n in d.nodes if n.op in ("FLASH_ATTN_EXT", "SOFT_MAX") and n.name.startswith("kq")
            or n.op == "FLASH_ATTN_EXT"]
    assert attn
    for n in attn:
        p = decode_op_params(n.op, n.op_params)
        assert p["scale"] == _f32(1 / math.sqrt(head_dim)) and p["max_bias"] == 0.0
        if n.op == "FLASH_ATTN_EXT":
            assert p["logit_softcap"] == 0.0 and p["precision"] == "F32"  # llama.cpp asks F32 accumulation
    if case == "dflash-fa-off":
        kq = [n for n in d.nodes if n.op == "MUL_MAT" and re.fullmatch(r"kq-\d+", n.name)]
        assert kq and all(decode_op_params("MUL_MAT", n.op_params)["prec"] == "F32" for n in kq)
        assert format_op_params("MUL_MAT", kq[0].op_params) == "prec=F32"


def test_op_params_deepseek4_fused_ops_from_the_gguf(models_dir):
    kv = _gguf_kv("dsv4-fa-on", models_dir)
    d, _ = _nodes("dsv4-fa-on")
    by_op: dict[str, list[dict]] = {}
    for n in d.nodes:
        by_op.setdefault(n.op, []).append(decode_op_params(n.op, n.op_params, n.ne))
    assert by_op["DSV4_HC_COMB"] and all(
        p == {"eps": _f32(kv["dflash.hyper_connection.epsilon"]),
              "n_iter": kv["dflash.hyper_connection.sinkhorn_iterations"]} for p in by_op["DSV4_HC_COMB"])
    assert all(p == {"scale": 1.0, "gated": False} for p in by_op["DSV4_HC_PRE"])
    assert all(p == {} for p in by_op["DSV4_HC_POST"])
    assert by_op["SWIGLU_CLAMP"] and all(
        p == {"glu": "SWIGLU_CLAMP", "swapped": False, "limit": kv["dflash.swiglu_clamp_exp"]}
        for p in by_op["SWIGLU_CLAMP"])
    assert any(p["s"] == kv["dflash.expert_weights_scale"] and p["b"] == 0.0 for p in by_op["SCALE"])
    # the MoE weight sum is clamped below at the smallest normal f16, unbounded above
    assert all(p == {"min": 6.103515625e-5, "max": math.inf} for p in by_op["CLAMP"])
    clamp = next(n for n in d.nodes if n.op == "CLAMP")
    assert format_op_params("CLAMP", clamp.op_params) == "min=6.103516e-05 max=inf"
    # the experts are picked by a descending sort
    assert by_op["ARGSORT"] and all(p == {"order": "DESC"} for p in by_op["ARGSORT"])


@pytest.mark.parametrize("path", REF_FILES, ids=IDS)
def test_op_params_against_each_node_structure(path):
    """What a node's shape and op name say about its params, for every op that has them."""
    d = load_dump(path)
    latest = {}
    for n in d.nodes:
        p = decode_op_params(n.op, n.op_params, n.ne)
        srcs = [latest.get(s) for s in n.src]
        if n.op == "VIEW":
            assert p == {"offset": n.view_offs}
        elif n.op == "PERMUTE" and srcs[0] is not None:
            assert sorted(p["axes"]) == [0, 1, 2, 3]
            assert [n.ne[p["axes"][i]] for i in range(4)] == srcs[0].ne
        elif n.op == "CONCAT" and all(s is not None for s in srcs[:2]):
            dim = p["dim"]
            assert n.ne[dim] == srcs[0].ne[dim] + srcs[1].ne[dim]
        elif n.op == "PAD" and srcs[0] is not None:
            assert [srcs[0].ne[i] + p[f"lp{i}"] + p[f"rp{i}"] for i in range(4)] == n.ne
        elif n.op in ("SILU", "SIGMOID", "SOFTPLUS", "STEP"):  # ggml_op_desc printed the unary op's name
            assert p == {"unary": n.op}
        elif n.op in ("SWIGLU", "SWIGLU_CLAMP"):
            assert p["glu"] == n.op and p["swapped"] is False
        elif n.op == "TOP_K":
            assert p == {"k": n.ne[0]}
        elif n.op == "ARANGE":
            assert math.ceil((p["stop"] - p["start"]) / p["step"]) == n.ne[0]
        elif n.op in ("GET_ROWS", "SET_ROWS", "CPY", "ADD", "MUL", "RESHAPE", "CONT"):
            assert p == {}
            assert format_op_params(n.op, n.op_params) == ""
        latest[n.name] = n


def test_op_params_layouts_by_hand():
    def ints(fmt, *vals):
        raw = struct.pack("<" + fmt, *vals)
        return list(struct.unpack(f"<{len(raw) // 4}i", raw))
    # a view past 4 GiB keeps the high half of its size_t offset in the second slot
    assert decode_op_params("VIEW", ints("Q", 5 * 2**32 + 12)) == {"offset": 5 * 2**32 + 12}
    rope = ints("5i6f4ii", 0, 128, 8, 0, 32768, 1e6, 0.25, 1.0, 1.5, 32.0, 1.0, 24, 20, 20, 0, 0)
    p = decode_op_params("ROPE", rope)
    assert (p["mode"], p["sections"], p["freq_base"], p["freq_scale"], p["n_ctx_orig"]) == (
        "MROPE", [24, 20, 20, 0], 1e6, 0.25, 32768)
    assert format_op_params("ROPE", rope) == (
        "n_dims=128 mode=MROPE n_ctx_orig=32768 freq_base=1000000 freq_scale=0.25 "
        "ext_factor=1 attn_factor=1.5 beta_fast=32 beta_slow=1 sections=[24,20,20,0]")
    assert "sections" not in format_op_params("ROPE", ints("3i", 0, 64, 2))
    assert decode_op_params("GLU", ints("ii", 1, 1)) == {"glu": "GEGLU", "swapped": True}
    assert decode_op_params("SWIGLU_OAI", ints("iiff", 3, 0, 1.702, 7.0)) == {
        "glu": "SWIGLU_OAI", "swapped": False, "alpha": _f32(1.702), "limit": 7.0}
    assert decode_op_params("UNARY", [10]) == {"unary": "SILU"}
    assert decode_op_params("SOFT_MAX", ints("ff", 0.125, 8.0)) == {"scale": 0.125, "max_bias": 8.0}
    assert decode_op_params("SCALE", ints("ff", 2.0, -1.0)) == {"s": 2.0, "b": -1.0}
    assert decode_op_params("FILL", ints("f", -math.inf)) == {"c": -math.inf}
    assert decode_op_params("CONCAT", [2]) == {"dim": 2}
    assert decode_op_params("ARGSORT", [0]) == {"order": "ASC"}
    assert decode_op_params("PAD", ints("9i", 1, 2, 0, 0, 0, 0, 0, 3, 1))["circular"] is True
    assert format_op_params("PAD", ints("8i", 0, 2, 0, 0, 0, 0, 0, 0)) == "rp0=2"
    assert decode_op_params("MUL_MAT", [10, 1, 0, 30]) == {"prec": "F32", "hint": "SRC0_IS_HADAMARD", "prec_src1": "Q8"}
    # an op without a layout keeps its ints; an enum value this ggml does not know stays a number
    assert decode_op_params("WIN_PART", [7, 0, 3] + [0] * 13) == {"raw": [7, 0, 3]}
    assert format_op_params("WIN_PART", [7, 0, 3]) == "op_params=[7,0,3]"
    assert format_op_params("WIN_PART", [0] * 16) == ""
    assert decode_op_params("UNARY", [99]) == {"unary": 99}
    for bad, what in (([0] * 17, "at most 16"), ([2**31], r"op_params\[0\] of ROPE"), ([0, 1.5], r"op_params\[1\]"),
                      ("0000", "at most 16"), ([True], r"op_params\[0\]")):
        with pytest.raises(ValueError, match=what):
            decode_op_params("ROPE", bad)


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

    from graphgen.play.scenario import load_scenario
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

    from graphgen.play.engine import run_scenario
    from graphgen.play.scenario import load_scenario
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
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    log = tmp_path / "sched.log"
    log.write_text(p.stderr)
    dumps = import_file(log)
    assert [d.graph for d in dumps] == ["inject", "block"]
    assert set(dumps[1].source["import"]["backends"].values()) == {"CPU"}
    for d, f in zip(dumps, ["00-inject", "01-block"]):
        full = load_dump(case / f"{f}.json")
        res = diff_dumps(project(full, "sched-debug"), d)
        # every node the log shows agrees; its views are not shown, so never IDENTICAL
        assert res.status == "PARTIAL" and not res.structural, res.format_text()
        assert len(res.unseen) == sum(n.op in VIEW_OPS for n in full.nodes)
    # the CLI: import to a folder, and diff takes the log directly (PARTIAL: exit 1)
    assert cli_main(["import", str(log), "--out", str(tmp_path / "imp")]) == 0
    assert len(dump_files(tmp_path / "imp")) == 2
    assert cli_main(["diff", str(case), str(log)]) == 1


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


def test_view_cli_rules_and_title(tmp_path, capsys):
    ref, ours = _seeded(tmp_path)
    doc = json.loads(ours.path.read_text())
    doc["source"] = {"engine": "graphgen", "version": "0.1.0", "ggml": "0.27.0"}
    ours.path.write_text(json.dumps(doc))
    ours = load_dump(ours.path)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [{"name": "extra_scale", "reason": "ours scales once more",
                                            "ref": [], "ours": [{"op": "SCALE", "name": "extra_scale-1"}]}]}))
    out = tmp_path / "d.html"

    def statuses(*extra):
        assert cli_main(["view", str(ref.path), str(ours.path), "--out", str(out), *extra]) == 0
        data = _page_data(out.read_text())
        f = {k: i for i, k in enumerate(data["fields"])}
        return [r[f["status"]] for r in data["rows"]], out.read_text()
    plain, _ = statuses()
    assert plain.count("inserted") == 1 and "explained" not in plain
    ruled, page = statuses("--rules", str(rules))
    assert "inserted" not in ruled and ruled.count("explained") == 1
    assert ruled.count("deleted") == plain.count("deleted") == 1  # the rule covers only what it names
    # the title names each side's engine and the model, not the file names
    want = f"block graph of {ref.model}: llama.cpp b11739 vs graphgen 0.1.0"
    assert re.search(r"<title>(.*?)</title>", page).group(1) == html_escape(want)
    assert "01-block.json vs" not in page
    # dot and the Model Explorer export take the same rules
    capsys.readouterr()
    assert cli_main(["view", str(ref.path), str(ours.path), "--format", "dot", "--rules", str(rules)]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith(f"digraph {json.dumps(want)}")
    assert cli_main(["view", str(ref.path), str(ours.path), "--format", "explorer", "--rules", str(rules),
                     "--out", str(tmp_path / "me")]) == 0
    capsys.readouterr()
    # bad rules, or rules without a second dump: one line, exit 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"rules": [{"name": "x"}]}')
    assert cli_main(["view", str(ref.path), str(ours.path), "--out", str(out), "--rules", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphgen: error: ") and str(bad) in err and len(err.strip().splitlines()) == 1
    assert cli_main(["view", str(ref.path), "--out", str(out), "--rules", str(rules)]) == 2
    assert "--rules needs two dumps" in capsys.readouterr().err
    assert cli_main(["view", str(ref.path), str(ours.path), "--out", str(out), "--rules", str(tmp_path / "no.json")]) == 2
    assert "no.json: no such file" in capsys.readouterr().err


def html_escape(s: str) -> str:
    import html
    return html.escape(s)


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


def test_trace_json_lines_match_the_reference_dump(tmp_path, models_dir):
    """trace --json: one object a node, in evaluation order, as the reference's dump has them
    (name, op, type, shape, op_params), with the digest of the node's bytes."""
    from make_references import build_model
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "trace", str(model), "--scenario",
                        str(case / "scenario.json"), "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    for graph, ref_file in (("00-inject", "00-inject.json"), ("01-block", "01-block.json")):
        ref = load_dump(case / ref_file)
        got = [r for r in rows if r["graph"] == graph]
        assert [(r["name"], r["op"], r["type"], r["ne"], r["op_params"]) for r in got] == \
            [(n.name, n.op, n.type, n.ne, n.op_params) for n in ref.nodes]
        assert all(r.get("digest") == n.digest for r, n in zip(got, ref.nodes) if n.digest)


def test_view_does_not_replace_a_file_it_did_not_write(tmp_path, capsys):
    """--out naming the user's own file is refused unless --force; a page view wrote earlier is
    replaced as dump replaces its dumps."""
    one = REF_DIR / "dflash-iswa-fa-off" / "01-block.json"
    mine = tmp_path / "afile.txt"
    mine.write_text("my notes\n")
    assert cli_main(["view", str(one), "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert "afile.txt: exists and is not a page graphgen view wrote; pass --force" in err
    assert mine.read_text() == "my notes\n" and sorted(p.name for p in tmp_path.iterdir()) == ["afile.txt"]
    assert cli_main(["view", str(one), "--out", str(mine), "--force"]) == 0
    assert mine.read_text().startswith("<!DOCTYPE html>")
    # its own page, written again: no --force needed; so for dot
    assert cli_main(["view", str(one), "--out", str(mine)]) == 0
    dot = tmp_path / "g.dot"
    assert cli_main(["view", str(one), "--format", "dot", "--out", str(dot)]) == 0
    assert cli_main(["view", str(one), "--format", "dot", "--out", str(dot)]) == 0
    # a folder's pages and Model Explorer files likewise
    folder = tmp_path / "pages"
    folder.mkdir()
    (folder / "00-inject.html").write_text("<p>mine</p>")
    assert cli_main(["view", str(one.parent), "--out", str(folder)]) == 2
    assert (folder / "00-inject.html").read_text() == "<p>mine</p>" and not (folder / "01-block.html").exists()
    me = tmp_path / "me"
    me.mkdir()
    (me / "01-block.graph.json").write_text('{"mine": 1}')
    assert cli_main(["view", str(one), "--format", "explorer", "--out", str(me)]) == 2
    assert (me / "01-block.graph.json").read_text() == '{"mine": 1}'
    assert cli_main(["view", str(one), "--format", "explorer", "--out", str(me), "--force"]) == 0
    assert cli_main(["view", str(one), "--format", "explorer", "--out", str(me)]) == 0
    capsys.readouterr()


def test_view_of_several_graphs_writes_the_page_named(tmp_path, capsys):
    """`view A B --out diff.html` over several graphs: diff.html is an index linking one page per
    graph; a .dot or .svg name cannot hold several graphs and is refused."""
    a, b = REF_DIR / "dflash-iswa-fa-off", REF_DIR / "dflash-iswa-fa-on"
    out = tmp_path / "diff.html"
    assert cli_main(["view", str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diff-00-inject.html", "diff-01-block.html", "diff.html"]
    assert printed[-1] == str(out)
    index = out.read_text()
    assert 'href="diff-00-inject.html"' in index and 'href="diff-01-block.html"' in index
    assert cli_main(["view", str(a), "--format", "dot", "--out", str(tmp_path / "g.dot")]) == 2
    assert "names one .dot file and there are 2 graphs" in capsys.readouterr().err
    assert not (tmp_path / "g.dot").exists()


def test_staged_files_appear_together_or_not_at_all(tmp_path):
    from graphgen.staging import staged_files
    a, b = tmp_path / "x" / "a.html", tmp_path / "b.html"
    with pytest.raises(RuntimeError):
        with staged_files([a, b]) as (ta, tb):
            ta.write_text("page a")
            raise RuntimeError("the second page failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no page, no temporary, no folder made
    with staged_files([a, b]) as (ta, tb):
        ta.write_text("page a")
        tb.write_text("page b")
        assert not a.exists() and not b.exists()
    assert (a.read_text(), b.read_text()) == ("page a", "page b")
