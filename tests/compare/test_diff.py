import argparse
import dataclasses
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.cli import main as cli_main
from graphgen.cli.dump import add_diff_args, run_diff
from graphgen.compare.diff import diff_dumps
from graphgen.compare.pairing import diff_paths
from graphgen.compare.report import exit_code
from graphgen.compare.rules import RulesError, load_rules, normalize_name, parse_rules
from graphgen.compare.values import compare_values
from graphgen.dump.format import Node, load_dump, write_dump
from graphgen.compare.importers import VIEW_OPS, import_file

HEADER = {
    "source": {"engine": "llama.cpp", "version": "b6000"},
    "model": "tiny-dit.gguf",
    "settings": {"flash_attn": False, "type_k": "f16", "type_v": "f16", "n_ctx": 64,
                 "n_ubatch": 4, "n_kv": 4, "causal": False},
    "cpu_features": {"AVX": True, "AVX2": True, "AVX512": False, "F16C": True, "FMA": True,
                     "LLAMAFILE": True},
}

# name, op, type, ne, src, view_src  (one transformer block, llama.cpp style names)
GRAPH = [
    ("inp_noise_embd", "GET_ROWS", "f32", [16, 4], ["noise_embd.weight", "inp_noise"], None),
    ("noise_norm-0", "RMS_NORM", "f32", [16, 4], ["inp_noise_embd"], None),
    ("norm-0", "MUL", "f32", [16, 4], ["noise_norm-0", "blk.0.attn_norm.weight"], None),
    ("Qcur-0", "MUL_MAT", "f32", [16, 4], ["blk.0.attn_q.weight", "norm-0"], None),
    ("Kcur-0", "MUL_MAT", "f32", [16, 4], ["blk.0.attn_k.weight", "norm-0"], None),
    ("Vcur-0", "MUL_MAT", "f32", [16, 4], ["blk.0.attn_v.weight", "norm-0"], None),
    ("Qcur-0 (reshaped)", "RESHAPE", "f32", [8, 2, 4], ["Qcur-0"], "Qcur-0"),
    ("Kcur-0 (reshaped)", "RESHAPE", "f32", [8, 2, 4], ["Kcur-0"], "Kcur-0"),
    ("Qcur-0", "ROPE", "f32", [8, 2, 4], ["Qcur-0 (reshaped)", "inp_pos"], None),
    ("Kcur-0", "ROPE", "f32", [8, 2, 4], ["Kcur-0 (reshaped)", "inp_pos"], None),
    ("node_10", "VIEW", "f16", [8, 2, 4], ["cache_k_l0"], "cache_k_l0"),
    ("node_11", "CPY", "f16", [8, 2, 4], ["Kcur-0", "node_10"], "node_10"),
    ("Qcur-0 (permuted)", "PERMUTE", "f32", [8, 4, 2], ["Qcur-0"], "Qcur-0"),
    ("cache_k_l0 (view)", "VIEW", "f16", [8, 4, 2], ["cache_k_l0"], "cache_k_l0"),
    ("kq-0", "MUL_MAT", "f32", [4, 4, 2], ["cache_k_l0 (view)", "Qcur-0 (permuted)"], None),
    ("kq_soft_max-0", "SOFT_MAX", "f32", [4, 4, 2], ["kq-0", "KQ_mask"], None),
    ("node_16", "VIEW", "f16", [4, 8, 2], ["cache_v_l0"], "cache_v_l0"),
    ("kqv-0", "MUL_MAT", "f32", [8, 4, 2], ["node_16", "kq_soft_max-0"], None),
    ("kqv_merged-0", "PERMUTE", "f32", [8, 2, 4], ["kqv-0"], "kqv-0"),
    ("kqv_merged_cont-0", "CONT", "f32", [16, 4], ["kqv_merged-0"], None),
    ("attn_out-0", "MUL_MAT", "f32", [16, 4], ["blk.0.attn_output.weight", "kqv_merged_cont-0"], None),
    ("ffn_inp-0", "ADD", "f32", [16, 4], ["attn_out-0", "inp_noise_embd"], None),
    ("ffn_norm-0", "RMS_NORM", "f32", [16, 4], ["ffn_inp-0"], None),
    ("node_23", "MUL", "f32", [16, 4], ["ffn_norm-0", "blk.0.ffn_norm.weight"], None),
    ("ffn_gate-0", "MUL_MAT", "f32", [32, 4], ["blk.0.ffn_gate.weight", "node_23"], None),
    ("ffn_up-0", "MUL_MAT", "f32", [32, 4], ["blk.0.ffn_up.weight", "node_23"], None),
    ("ffn_swiglu-0", "SWIGLU_CLAMP", "f32", [32, 4], ["ffn_gate-0", "ffn_up-0"], None),
    ("ffn_out-0", "MUL_MAT", "f32", [16, 4], ["blk.0.ffn_down.weight", "ffn_swiglu-0"], None),
    ("l_out-0", "ADD", "f32", [16, 4], ["ffn_out-0", "ffn_inp-0"], None),
    ("result_norm", "RMS_NORM", "f32", [16, 4], ["l_out-0"], None),
    ("result_output", "MUL", "f32", [16, 4], ["result_norm", "output_norm.weight"], None),
]
SWIGLU = 26
SWIGLU_LIMIT = 7.0


def f32_bits(*xs):
    """Floats as the int32 bit patterns ggml keeps in op_params."""
    return np.array(xs, dtype=np.float32).view(np.int32).tolist()


def make_graph(seed=0):
    """[(Node, values)] for the block above, with random values."""
    rng = np.random.default_rng(seed)
    out = []
    for k, (name, op, typ, ne, src, view_src) in enumerate(GRAPH):
        ne = list(ne) + [1] * (4 - len(ne))
        params = [0] * 16
        if op == "RMS_NORM":
            params[0] = 0x3727C5AC  # eps 1e-5 as float bits, as ggml stores it
        if op == "SWIGLU_CLAMP":
            params[0] = f32_bits(SWIGLU_LIMIT)[0]
        node = Node(k, name, op, typ, ne, list(src), view_src, 0, params)
        out.append((node, rng.standard_normal(node.nelements).astype(np.float32)))
    return out


def renumber(graph):
    """Reindex after nodes were inserted/removed, renaming automatic names as ggml would."""
    auto = re.compile(r"node_[0-9a-z]+")
    rename = {n.name: f"node_{k}" for k, (n, _) in enumerate(graph) if auto.fullmatch(n.name)}
    out = []
    for k, (n, v) in enumerate(graph):
        out.append((dataclasses.replace(
            n, index=k, name=rename.get(n.name, n.name), src=[rename.get(s, s) for s in n.src],
            view_src=rename.get(n.view_src, n.view_src)), v))
    return out


def write(directory, graph, header=HEADER, seq=0):
    nodes = [n for n, _ in graph]
    values = {n.index: v for n, v in graph if v is not None}
    return write_dump(directory, seq, "block", header, nodes, values)


def diff(tmp_path, ours_graph, ref_graph=None, **kw):
    ref = write(tmp_path / "ref", ref_graph or make_graph())
    ours = write(tmp_path / "ours", ours_graph)
    return diff_dumps(load_dump(ref), load_dump(ours), **kw)


def copy_graph():
    return [(dataclasses.replace(n, src=list(n.src), ne=list(n.ne)), v.copy()) for n, v in make_graph()]


def test_identical(tmp_path):
    r = diff(tmp_path, make_graph())
    assert r.identical and exit_code([r]) == 0
    assert r.structural == [] and r.first_divergence is None and r.notes == []
    assert r.summary["matched"] == len(GRAPH) == r.summary["numeric_compared"]
    assert r.summary["max_nmse"] == 0.0
    assert "IDENTICAL" in r.format_text()


def test_op_changed(tmp_path):
    g = copy_graph()
    g[21][0].op = "SUB"
    r = diff(tmp_path, g)
    assert not r.identical and exit_code([r]) == 1
    [d] = r.structural
    assert (d.kind, d.ref_index, d.ours_index) == ("changed", 21, 21)
    assert d.fields == {"op": ("ADD", "SUB")}
    assert r.first_divergence["kind"] == "changed" and r.first_divergence["ref_index"] == 21


def test_shape_changed(tmp_path):
    g = copy_graph()
    g[24][0].ne = [16, 8, 1, 1]
    r = diff(tmp_path, g)
    [d] = r.structural
    assert (d.kind, d.ref_index, d.ours_index) == ("changed", 24, 24)
    assert d.fields == {"ne": ([32, 4, 1, 1], [16, 8, 1, 1])}
    assert all(n.ref_index != 24 for n in r.numeric)  # values of a reshaped node are not compared
    assert exit_code([r]) == 1


def test_source_changed(tmp_path):
    g = copy_graph()
    g[3][0].src = ["blk.0.attn_q.weight", "noise_norm-0"]
    r = diff(tmp_path, g)
    [d] = r.structural
    assert (d.kind, d.ref_index, d.ours_index) == ("changed", 3, 3)
    assert d.fields == {"src": (["blk.0.attn_q.weight", "norm-0"], ["blk.0.attn_q.weight", "noise_norm-0"])}
    assert exit_code([r]) == 1


def test_inserted_node(tmp_path):
    g = copy_graph()
    scale = Node(0, "kq_scaled-0", "SCALE", "f32", [4, 4, 2, 1], ["kq-0"])
    g.insert(15, (scale, np.ones(32, dtype=np.float32)))
    g[16][0].src = ["kq_scaled-0", "KQ_mask"]  # the softmax now reads the scaled kq
    g = renumber(g)
    assert g[17][0].name == "node_17"  # automatic names shifted by one
    r = diff(tmp_path, g)
    kinds = [(d.kind, d.ref_index, d.ours_index) for d in r.structural]
    assert kinds == [("inserted", None, 15), ("changed", 15, 16)]
    assert r.structural[1].fields.keys() == {"src"}
    fd = r.first_divergence
    assert fd["kind"] == "inserted" and fd["ours_index"] == 15
    marked = [row["index"] for row in fd["context"]["ours"] if row["mark"]]
    assert marked == [15] and len(fd["context"]["ours"]) == 7
    assert r.summary["inserted"] == 1 and r.summary["deleted"] == 0
    assert exit_code([r]) == 1


def test_deleted_node(tmp_path):
    g = renumber([p for k, p in enumerate(copy_graph()) if k != 12])
    r = diff(tmp_path, g)
    assert r.structural[0].kind == "deleted" and r.structural[0].ref_index == 12
    assert r.summary["deleted"] == 1


def test_perturbed_value(tmp_path):
    g = copy_graph()
    g[17] = (g[17][0], g[17][1] + 0.01)
    r = diff(tmp_path, g)
    assert r.structural == []
    [f] = r.numeric_failures
    assert (f.ref_index, f.ours_index, f.name) == (17, 17, "kqv-0")
    assert f.nmse > 1e-7 and f.max_abs == pytest.approx(0.01, rel=1e-3)
    assert r.first_divergence["kind"] == "numeric" and r.first_divergence["ref_index"] == 17
    assert exit_code([r]) == 1
    # a loose enough threshold accepts it
    assert diff(tmp_path, g, nmse=1e-2).identical


def test_nan_positions_must_agree():
    a = np.array([1.0, np.nan, -np.inf, 2.0], dtype=np.float32)
    assert compare_values(a, a.copy()) == (0.0, 0.0, None)
    b = a.copy()
    b[2] = np.inf
    assert "NaN/Inf" in compare_values(a, b)[2]
    b = a.copy()
    b[1] = 0.0
    assert "NaN/Inf" in compare_values(a, b)[2]


def test_nmse_of_zero_reference():
    nmse, max_abs, _ = compare_values(np.zeros(4), np.full(4, 0.5))
    assert nmse == pytest.approx(1.0) and max_abs == 0.5


def test_auto_names_normalized():
    assert normalize_name("node_3 (view)") == normalize_name("node_17 (view)") == "node_# (view)"
    assert normalize_name("leaf_2") == "leaf_#"
    assert normalize_name("mynode_3") == "mynode_3"


def swiglu_chain_graph():
    g = copy_graph()
    gate, up, fused = g[24][0], g[25][0], g[SWIGLU]
    rng = np.random.default_rng(7)
    # ours clamps gate and up itself; its SWIGLU then carries no limit
    clamp_gate = [0] * 16
    clamp_gate[0:2] = f32_bits(-np.inf, SWIGLU_LIMIT)
    clamp_up = [0] * 16
    clamp_up[0:2] = f32_bits(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    chain = [
        (Node(0, "node_a", "CLAMP", "f32", list(gate.ne), ["ffn_gate-0"], None, 0, clamp_gate),
         rng.standard_normal(128)),
        (Node(0, "node_b", "CLAMP", "f32", list(up.ne), ["ffn_up-0"], None, 0, clamp_up),
         rng.standard_normal(128)),
        (dataclasses.replace(fused[0], op="SWIGLU", src=["node_a", "node_b"], op_params=[0] * 16), fused[1]),
    ]
    return renumber(g[:SWIGLU] + chain + g[SWIGLU + 1:])


RULES = {"rules": [{
    "name": "swiglu_clamp",
    "reason": "llama.cpp fuses the clamps into one SWIGLU_CLAMP op",
    "ref": [{"op": "SWIGLU_CLAMP", "name": r"ffn_swiglu-\d+"}],
    "ours": ["CLAMP", "CLAMP", {"op": "SWIGLU"}],
    "explains": ["op_params[0]"],  # the fused op's limit; ours keeps it in the CLAMPs
}]}


def test_rule_explains_fused_op(tmp_path):
    g = swiglu_chain_graph()
    plain = diff(tmp_path, g)
    assert not plain.identical and plain.rules_fired == {}

    rules_path = tmp_path / "rules.json"
    rules_path.write_text(json.dumps(RULES))
    r = diff(tmp_path, g, rules=rules_path)
    assert r.identical and exit_code([r]) == 0
    assert r.rules_fired == {"swiglu_clamp": 1}
    [e] = r.explained
    assert (e.ref_indices, e.ours_indices) == ([26], [26, 27, 28])
    # the fused output and the chain's last node carry the same name: their values are compared
    assert any((n.ref_index, n.ours_index) == (26, 28) for n in r.numeric)
    assert "swiglu_clamp x1" in r.format_text()


def test_rule_does_not_hide_value_error(tmp_path):
    g = swiglu_chain_graph()
    g[28] = (g[28][0], g[28][1] + 1.0)
    r = diff(tmp_path, g, rules=load_rules_from(tmp_path))
    assert not r.identical
    assert [(f.ref_index, f.ours_index) for f in r.numeric_failures] == [(26, 28)]


def load_rules_from(tmp_path):
    p = tmp_path / "rules.json"
    p.write_text(json.dumps(RULES))
    return load_rules(p)


def test_one_sided_rule_is_pass_through(tmp_path):
    g = copy_graph()
    cont = Node(0, "node_c", "CONT", "f32", [16, 4, 1, 1], ["kqv_merged_cont-0"])
    g.insert(20, (cont, g[19][1].copy()))
    g[21][0].src = ["blk.0.attn_output.weight", "node_c"]  # attn_out reads the extra copy
    g = renumber(g)
    rules = {"rules": [{"name": "extra_cont", "reason": "ours keeps a redundant copy",
                        "ref": [], "ours": ["CONT"]}]}
    p = tmp_path / "rules.json"
    p.write_text(json.dumps(rules))
    r = diff(tmp_path, g, rules=p)
    assert r.identical and r.rules_fired == {"extra_cont": 1}
    assert not diff(tmp_path, g).identical


def test_fused_rule_forgives_only_what_it_declares(tmp_path):
    g = swiglu_chain_graph()
    undeclared = {"rules": [dict(RULES["rules"][0], explains=[])]}
    r = diff(tmp_path, g, rules=parse_rules(undeclared))
    assert r.status == "DIVERGED" and r.rules_fired == {"swiglu_clamp": 1}
    [d] = r.structural
    assert (d.kind, d.ref_index, d.ours_index) == ("changed", 26, 28)
    assert d.fields.keys() == {"op_params"}  # op and the inner CLAMPs are the replacement itself
    # the output pair is counted as changed, not as explained
    [e] = r.explained
    assert (e.ref_indices, e.ours_indices) == ([], [26, 27])
    assert r.summary["changed"] == 1 and r.summary["explained_ref"] == 0


def test_fused_rule_checks_run_inputs(tmp_path):
    g = swiglu_chain_graph()
    g[26][0].src = ["ffn_up-0"]  # the gate's clamp reads the wrong input
    r = diff(tmp_path, g, rules=load_rules_from(tmp_path))
    assert r.status == "DIVERGED" and r.rules_fired == {"swiglu_clamp": 1}
    [d] = r.structural
    assert (d.ref_index, d.ours_index) == (26, 28)
    assert d.fields == {"src": (["ffn_gate-0", "ffn_up-0"], ["ffn_up-0"])}


def clamp_graph(lo):
    """x, then clamp(x, lo, 1); x lies within (-0.5, 0.5), so the clamp's values do not depend on lo."""
    x = np.random.default_rng(3).uniform(-0.5, 0.5, 8).astype(np.float32)
    params = [0] * 16
    params[0:2] = f32_bits(lo, 1.0)
    return [(Node(0, "x", "ADD", "f32", [8, 1, 1, 1], ["a", "b"]), x),
            (Node(1, "x_clamped", "CLAMP", "f32", [8, 1, 1, 1], ["x"], None, 0, params), x.copy())]


def clamp_rule(**extra):
    return parse_rules({"rules": [dict({"name": "clamp", "reason": "same op in both builds",
                                        "ref": ["CLAMP"], "ours": ["CLAMP"]}, **extra)]})


def test_one_to_one_rule_does_not_hide_clamp_bound(tmp_path):
    ref, ours = clamp_graph(-1.0), clamp_graph(-1000.0)
    r = diff(tmp_path, ours, ref_graph=ref, rules=clamp_rule(explains=["op"]))
    assert r.status == "DIVERGED" and exit_code([r]) == 1
    [d] = r.structural
    assert (d.kind, d.ref_index, d.ours_index) == ("changed", 1, 1) and d.fields.keys() == {"op_params"}
    bounds = [np.array(v[:2], dtype=np.int32).view(np.float32).tolist() for v in d.fields["op_params"]]
    assert bounds == [[-1.0, 1.0], [-1000.0, 1.0]]
    assert r.first_divergence["ref_index"] == 1
    assert r.rules_fired == {"clamp": 1} and r.summary["explained_ref"] == 0
    assert not r.numeric_failures  # the values agree: only the field check sees it
    assert diff(tmp_path, ours, ref_graph=ref, rules=clamp_rule()).status == "DIVERGED"


@pytest.mark.parametrize("explains, identical", [
    (["op_params[0]"], True),
    (["op_params[0:2]"], True),
    (["op_params"], True),
    (["op_params[1]"], False),
    (["op_params[1:16]"], False),
    (["op", "type", "ne", "src", "view_src", "view_offs", "name"], False),
])
def test_declared_op_params_slot_explains_bound(tmp_path, explains, identical):
    ref, ours = clamp_graph(-1.0), clamp_graph(-1000.0)
    r = diff(tmp_path, ours, ref_graph=ref, rules=clamp_rule(explains=explains))
    assert r.identical is identical and r.rules_fired == {"clamp": 1}
    if identical:
        [e] = r.explained
        assert (e.ref_indices, e.ours_indices) == ([1], [1])
        assert [(n.ref_index, n.ours_index) for n in r.numeric] == [(0, 0), (1, 1)]


def test_rule_name_difference(tmp_path):
    ref = clamp_graph(-1.0)
    ours = clamp_graph(-1.0)
    ours[1] = (dataclasses.replace(ours[1][0], name="x_clipped"), ours[1][1])
    # the patterns do not name the nodes: the rename is undeclared
    r = diff(tmp_path, ours, ref_graph=ref, rules=clamp_rule())
    assert [d.fields.keys() for d in r.structural] == [{"name"}]
    assert diff(tmp_path, ours, ref_graph=ref, rules=clamp_rule(explains=["name"])).structural == []
    named = parse_rules({"rules": [{"name": "clip", "reason": "renamed",
                                    "ref": [{"op": "CLAMP", "name": "x_clamped"}],
                                    "ours": [{"op": "CLAMP", "name": "x_clipped"}]}]})
    assert diff(tmp_path, ours, ref_graph=ref, rules=named).structural == []


@pytest.mark.parametrize("explains, fragment", [
    ("op", "'explains' must be a list"),
    (["shape"], "explains[0] 'shape'"),
    (["op", "op_params[16]"], "explains[1] 'op_params[16]'"),
    (["op_params[2:2]"], "explains[0] 'op_params[2:2]'"),
    (["op_params[-1]"], "explains[0] 'op_params[-1]'"),
    (["op_params [0]"], "explains[0] 'op_params [0]'"),
    ([3], "explains[0] 3"),
])
def test_bad_explains(tmp_path, explains, fragment):
    p = tmp_path / "rules.json"
    p.write_text(json.dumps({"rules": [{"name": "bad_rule", "reason": "", "ref": ["CLAMP"], "ours": ["CLAMP"],
                                        "explains": explains}]}))
    with pytest.raises(RulesError) as info:
        load_rules(p)
    msg = str(info.value)
    assert str(p) in msg and "rule 'bad_rule'" in msg and fragment in msg and "\n" not in msg


def test_one_sided_rule_cannot_explain(tmp_path):
    p = tmp_path / "rules.json"
    p.write_text(json.dumps({"rules": [{"name": "extra_cont", "reason": "", "ref": [], "ours": ["CONT"],
                                        "explains": ["ne"]}]}))
    with pytest.raises(RulesError, match="rule 'extra_cont': 'explains' needs nodes on both sides"):
        load_rules(p)


@pytest.mark.parametrize("doc, fragment", [
    ({"rule": []}, "list 'rules'"),
    ({"rules": [{"name": "x", "reason": "", "ref": [], "ours": []}]}, "both empty"),
    ({"rules": [{"name": "x", "reason": "", "ref": [{"op": "A", "name": "("}], "ours": []}]},
     "bad 'name' regex"),
    ({"rules": [{"name": "x", "reason": "", "ref": ["A"], "our": ["B"]}]}, "unknown key"),
    ({"rules": [{"name": "x", "ref": ["A"], "ours": ["B"]}]}, "'reason'"),
])
def test_bad_rules(tmp_path, doc, fragment):
    p = tmp_path / "rules.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(RulesError) as info:
        load_rules(p)
    assert fragment in str(info.value) and str(p) in str(info.value) and "\n" not in str(info.value)


def test_cpu_features_note(tmp_path):
    header = dict(HEADER, cpu_features=dict(HEADER["cpu_features"], AVX512=True))
    ref = write(tmp_path / "ref", make_graph())
    ours = write(tmp_path / "ours", make_graph(), header=header)
    r = diff_dumps(load_dump(ref), load_dump(ours))
    assert r.identical
    [note] = r.notes
    assert "AVX512 ref=false ours=true" in note and "last-bit" in note
    assert note in r.format_text()


def test_folders_paired_in_order(tmp_path):
    for seq in range(3):
        write(tmp_path / "ref", make_graph(), seq=seq)
    for seq in range(2):
        write(tmp_path / "ours", make_graph(), seq=seq)
    results = diff_paths(tmp_path / "ref", tmp_path / "ours")
    assert [r.identical for r in results] == [True, True, False]
    assert results[2].unpaired == "ref" and results[2].status == "NO PARTNER"
    assert "02-block.json (block #2) has no partner" in results[2].notes[0]
    assert exit_code(results) == 1


def cli(*argv):
    parser = add_diff_args(argparse.ArgumentParser(prog="graphgen graph-diff"))
    return run_diff(parser.parse_args([str(a) for a in argv]))


def test_cli_identical_and_json(tmp_path, capsys):
    ref = write(tmp_path / "ref", make_graph())
    assert cli(ref, ref) == 0
    assert "IDENTICAL" in capsys.readouterr().out
    g = copy_graph()
    g[21][0].op = "SUB"
    ours = write(tmp_path / "ours", g)
    assert cli(ref, ours, "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["identical"] is False
    assert doc["results"][0]["structural"][0]["fields"] == {"op": {"ref": "ADD", "ours": "SUB"}}


def test_cli_missing_file(tmp_path, capsys):
    ref = write(tmp_path / "ref", make_graph())
    assert cli(ref, tmp_path / "nope.json") == 2
    err = capsys.readouterr().err
    assert err.startswith("graphgen: error: ") and "nope.json" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_wrong_format(tmp_path, capsys):
    ref = write(tmp_path / "ref", make_graph())
    bad = tmp_path / "bad" / "00-block.json"
    bad.parent.mkdir()
    doc = json.loads(ref.read_text())
    doc["format"] = "graphgen-dump/0"
    bad.write_text(json.dumps(doc))
    assert cli(ref, bad) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphgen: error: ") and "graphgen-dump/0" in err and err.count("\n") == 1


def test_cli_bad_rules(tmp_path, capsys):
    ref = write(tmp_path / "ref", make_graph())
    rules = tmp_path / "rules.json"
    rules.write_text("{not json")
    assert cli(ref, ref, "--rules", rules) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphgen: error: ") and "invalid JSON" in err and err.count("\n") == 1


# ---- imported dumps, pairing, provenance, op_params, progress, xdiff bounds ---------------------

EVAL_CB_FIELDS = ["name", "op", "type", "ne", "src[:2]"]


def test_imported_folder_compared_on_its_fields(tmp_path, models_dir, capsys):
    from make_references import build_model

    from graphgen.play.scenario import load_scenario
    from graphgen.view.trace import run_trace
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    buf = io.StringIO()
    assert run_trace(model, load_scenario(case / "scenario.json"), buf) == 0
    trace = tmp_path / "trace.txt"
    trace.write_text(buf.getvalue())
    assert cli_main(["import", str(trace), "--out", str(tmp_path / "imp")]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "imp" / "01-block.json").read_text())
    assert doc["source"]["import"]["format"] == "eval-callback"
    assert doc["source"]["import"]["fields"] == EVAL_CB_FIELDS
    # the reference has names with leading spaces (" (reshaped)"), op_params and view sources, none
    # of which the text shows: the folder must compare as the text itself does
    assert any(n.name.startswith(" ") for n in load_dump(case / "01-block.json").nodes)
    for ours in (trace, tmp_path / "imp"):
        results = diff_paths(case, ours)
        assert [(r.graph, r.status) for r in results] == [("inject", "IDENTICAL"), ("block", "IDENTICAL")], \
            "\n".join(r.format_text() for r in results)
        for r in results:
            assert any("compared on the fields eval-callback shows (name, op, type, ne, src[:2]); both sides cut"
                       in n for n in r.notes)
            assert not any("cpu_features" in n or "settings differ" in n for n in r.notes)
    assert cli_main(["diff", str(case), str(tmp_path / "imp")]) == 0
    out = capsys.readouterr().out
    assert out.count("result: IDENTICAL") == 2 and "both sides cut to them" in out
    # what the text does show is still compared
    doc["nodes"][5]["op"] = "NORM"
    (tmp_path / "imp" / "01-block.json").write_text(json.dumps(doc))
    block = diff_paths(case, tmp_path / "imp")[1]
    assert block.status == "DIVERGED"
    assert [(d.ref_index, d.fields) for d in block.structural] == [(5, {"op": ("RMS_NORM", "NORM")})]


@pytest.mark.reference
def test_sched_debug_log_pairs_with_dump(tmp_path, models_dir):
    from make_references import build_model
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    # the child `graphgen dump --engine llama.cpp` runs, with the scheduler's debug log on stderr
    p = subprocess.run([sys.executable, "-m", "graphgen.reference.runner", str(model), str(case / "scenario.json"),
                        str(tmp_path / "ref")], capture_output=True, text=True,
                       env=dict(os.environ, GGML_SCHED_DEBUG="2"))
    assert p.returncode == 0, p.stderr[-2000:]
    log = tmp_path / "sched.log"
    log.write_text(p.stderr)
    assert p.stderr.count("graph_reserve:") >= 2  # the context reserved with graphs it never computes
    dumps = import_file(log)
    assert [d.graph for d in dumps] == ["inject", "block"]
    for d, f in zip(dumps, ["00-inject", "01-block"]):
        ref = load_dump(case / f"{f}.json")
        assert [n.op[:10] for n in d.nodes] == [n.op[:10] for n in ref.nodes if n.op not in VIEW_OPS]
    for ours in (log, tmp_path / "imp"):
        if ours != log:
            assert cli_main(["import", str(log), "--out", str(ours)]) == 0
        results = diff_paths(case, ours)
        # the log's nodes all agree, but it shows no views: PARTIAL, never IDENTICAL
        assert [(r.graph, r.status) for r in results] == [("inject", "PARTIAL"), ("block", "PARTIAL")], \
            "\n".join(r.format_text() for r in results)
        assert all(any("sched-debug shows" in n for n in r.notes) for r in results)
        assert [len(r.unseen) for r in results] == [sum(n.op in VIEW_OPS for n in load_dump(case / f"{f}.json").nodes)
                                                    for f in ("00-inject", "01-block")]
    # a node renamed in the log is found
    bad = tmp_path / "bad.log"
    bad.write_text(p.stderr.replace("        ffn_inp-1 (", "        ffn_XXX-1 ("))
    block = diff_paths(case, bad)[1]
    assert block.status == "DIVERGED" and any(d.ref_name == "ffn_inp-1" for d in block.structural)


def write_kind(directory, seq, kind, graph):
    nodes = [n for n, _ in graph]
    return write_dump(directory, seq, kind, HEADER, nodes, {n.index: v for n, v in graph})


def inject_graph():
    """A graph unlike the block: compared with it, everything differs."""
    g = make_graph(seed=3)[:3]
    return [(dataclasses.replace(n, name=f"inj_{n.name}"), v) for n, v in g]


def test_folders_pair_by_kind_and_step(tmp_path, capsys):
    write_kind(tmp_path / "ref", 0, "inject", inject_graph())
    write_kind(tmp_path / "ref", 1, "block", make_graph())
    write_kind(tmp_path / "ref", 2, "block", make_graph(seed=1))
    # ours ran no inject: by position its first block would meet ref's inject
    write_kind(tmp_path / "ours", 0, "block", make_graph())
    write_kind(tmp_path / "ours", 1, "block", make_graph(seed=1))
    results = diff_paths(tmp_path / "ref", tmp_path / "ours")
    assert [(r.graph, r.status) for r in results] == [("inject", "NO PARTNER"), ("block", "IDENTICAL"),
                                                      ("block", "IDENTICAL")]
    assert [Path(r.ref_path).name for r in results[1:]] == ["01-block.json", "02-block.json"]
    assert [Path(r.ours_path).name for r in results[1:]] == ["00-block.json", "01-block.json"]
    assert "00-inject.json (inject #0) has no partner" in results[0].notes[0]
    assert exit_code(results) == 1
    assert cli(tmp_path / "ref", tmp_path / "ours") == 1
    out = capsys.readouterr().out
    assert "result: NO PARTNER" in out and "2 graphs compared, 0 diverged, no partner for ref 00-inject.json" in out
    assert cli(tmp_path / "ref", tmp_path / "ours", "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["unpaired"] == [{"side": "ref", "graph": "inject", "path": str(tmp_path / "ref" / "00-inject.json")}]


def test_one_file_pairs_with_its_kind(tmp_path, capsys):
    write_kind(tmp_path / "ref", 0, "inject", inject_graph())
    write_kind(tmp_path / "ref", 1, "block", make_graph())
    one = write_kind(tmp_path / "ours", 7, "block", make_graph())
    [res] = diff_paths(tmp_path / "ref", one)
    assert res.status == "IDENTICAL" and Path(res.ref_path).name == "01-block.json"
    assert any("not compared, the other side being one graph: ref 00-inject.json (inject #0)" in n
               for n in res.notes)
    assert cli(tmp_path / "ref", one) == 0
    # two files the user picked are compared whatever their kinds
    [res] = diff_paths(tmp_path / "ref" / "00-inject.json", one)
    assert res.status == "DIVERGED" and "comparing a 'inject' graph with a 'block' graph" in res.notes


def with_provenance(model_sha=None, scenario=None):
    h = dict(HEADER)
    if model_sha is not None:
        h["model_sha256"] = model_sha
    if scenario is not None:
        h["scenario"] = scenario
    return h


def test_different_models_and_scenarios_warn(tmp_path, capsys):
    sha_a, sha_b = hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()
    sc_a = {"digest": hashlib.sha256(b"s1").hexdigest(), "name": "s.json", "path": "/x/s.json", "seed": 1}
    sc_b = dict(sc_a, digest=hashlib.sha256(b"s2").hexdigest(), seed=2)
    ref = write(tmp_path / "ref", make_graph(), header=with_provenance(sha_a, sc_a))
    same = write(tmp_path / "same", make_graph(), header=with_provenance(sha_a, sc_a))
    other = write(tmp_path / "other", make_graph(), header=with_provenance(sha_b, sc_b))
    old = write(tmp_path / "old", make_graph())

    r = diff_dumps(load_dump(ref), load_dump(same))
    assert r.warnings == [] and r.provenance["same_model"] is True and r.provenance["same_scenario"] is True
    r = diff_dumps(load_dump(ref), load_dump(old))  # a dump from before these fields: nothing claimed
    assert r.warnings == [] and r.provenance["same_model"] is None and r.identical

    r = diff_dumps(load_dump(ref), load_dump(other))
    assert r.status == "IDENTICAL"  # still compared
    assert r.provenance["same_model"] is False and r.provenance["same_scenario"] is False
    [w_model, w_scen] = r.warnings
    assert "different models" in w_model and sha_a[:12] in w_model and sha_b[:12] in w_model
    assert "different scenarios" in w_scen and "seed 1" in w_scen and "seed 2" in w_scen
    lines = r.format_text().splitlines()
    assert lines[2] == f"warning: {w_model}" and lines[3] == f"warning: {w_scen}"
    assert cli(ref, other, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["warnings"] == sorted([w_model, w_scen])
    assert doc["results"][0]["provenance"]["ours"]["model_sha256"] == sha_b
    assert doc["results"][0]["provenance"]["ref"]["scenario"]["seed"] == 1


def test_changed_op_params_shown_decoded(tmp_path, monkeypatch):
    g = copy_graph()
    g[1][0].op_params = f32_bits(1e-6) + [0] * 15
    res = diff(tmp_path, g)
    eps5, eps6 = f32_bits(1e-5)[0], f32_bits(1e-6)[0]
    fake = types.ModuleType("graphgen.compare.opparams")
    fake.format_op_params = lambda op, params: f"{op.lower()} eps={np.array(params[:1], np.int32).view(np.float32)[0]:g}"
    monkeypatch.setitem(sys.modules, "graphgen.compare.opparams", fake)
    text = res.format_text()
    assert "op_params: rms_norm eps=1e-05 -> rms_norm eps=1e-06" in text
    assert res.to_dict()["structural"][0]["fields"]["op_params"]["ref"][0] == eps5  # JSON keeps the ints
    # a difference the decoding does not show keeps the raw slots
    fake.format_op_params = lambda op, params: "same"
    assert f"op_params: [{eps5}, 0," in res.format_text()
    # without the module, the raw ints
    monkeypatch.setitem(sys.modules, "graphgen.compare.opparams", None)
    text = res.format_text()
    assert f"op_params: [{eps5}, 0," in text and f"-> [{eps6}, 0," in text


def test_progress_on_stderr_not_stdout(tmp_path, capsys, monkeypatch):
    from graphgen import progress
    write_kind(tmp_path / "ref", 0, "inject", inject_graph())
    write_kind(tmp_path / "ref", 1, "block", make_graph())
    write_kind(tmp_path / "ours", 0, "inject", inject_graph())
    write_kind(tmp_path / "ours", 1, "block", make_graph())
    monkeypatch.setattr(progress, "_mode", "always")
    assert cli(tmp_path / "ref", tmp_path / "ours", "--json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["identical"] is True
    assert "graph 1 of 2: 00-inject.json / 00-inject.json" in err
    assert "graph 2 of 2: 01-block.json / 01-block.json" in err
    monkeypatch.setattr(progress, "_mode", "never")  # --quiet
    assert cli(tmp_path / "ref", tmp_path / "ours") == 0
    out, err = capsys.readouterr()
    assert err == "" and "2 graphs compared, 0 diverged" in out


def test_diff_quiet_flag_sets_silence(tmp_path, capsys):
    ref = write(tmp_path / "ref", make_graph())
    assert cli_main(["diff", str(ref), str(ref), "--quiet", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["identical"] is True and err == ""


def xdiff_dirs(tmp_path, scale):
    """Two folders of one graph, ours with one MUL_MAT perturbed to an nmse of about scale**2."""
    from graphgen.compare.xdiff import compare_dirs
    base = make_graph()
    g = copy_graph()
    k = 3  # Qcur-0, a MUL_MAT
    g[k] = (g[k][0], base[k][1] * (1 + scale))
    write(tmp_path / "a", base)
    write(tmp_path / "b", g)
    return lambda nmse=None: compare_dirs(tmp_path / "a", tmp_path / "b", ["cpu", "other"], nmse)


def test_xdiff_nmse_override(tmp_path):
    run = xdiff_dirs(tmp_path, 1e-3)  # nmse 1e-6, within the matmul bound 5e-4
    res = run()
    assert res.ok and res.nmse is None
    res = run(1e-7)
    assert not res.ok
    bad = res.graphs[0]["first_bad"]
    assert (bad["name"], bad["op"], bad["threshold"]) == ("Qcur-0", "MUL_MAT", 1e-7)
    assert bad["nmse"] == pytest.approx(1e-6, rel=1e-3)
    assert "nmse bound 1e-07" in res.format_text() and res.to_dict()["nmse"] == 1e-7
    assert run(1e-5).ok
    with pytest.raises(ValueError, match="nmse"):
        run(-1.0)


def test_xdiff_cli_nmse(tmp_path, models_dir, capsys):
    from make_references import build_model
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    with pytest.raises(SystemExit) as stop:
        cli_main(["xdiff", str(model), "--scenario", str(case / "scenario.json"), "--backends", "cpu,x",
                  "--nmse", "-1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("graphgen: error: ") and "--nmse" in err and err.count("\n") == 1
    assert cli_main(["xdiff", str(model), "--scenario", str(case / "scenario.json"), "--backends", "cpu,cpu",
                     "--nmse", "0", "--out", str(tmp_path / "x"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["nmse"] == 0.0 and [g["graph"] for g in doc["graphs"]] == ["inject", "block"]


# -- the rules the help text promises ------------------------------------------------------------

def _with_int_node(tmp_path, delta):
    """The block graph plus an i32 node (token ids gathered by a GET_ROWS, an op that carries
    floats elsewhere: only the type makes it exact); ours off by `delta`."""
    def graph(d):
        g = copy_graph()
        n = Node(len(g), "ids", "GET_ROWS", "i32", [4, 1, 1, 1], ["result_output", "inp_pos"], None, 0, [0] * 16)
        g.append((n, np.array([3, 1, 4, 1 + d], dtype=np.int32)))
        return g
    return write(tmp_path / "ref", graph(0)), write(tmp_path / "ours", graph(delta))


@pytest.mark.parametrize("nmse", [None, 1e-3, 1.0, 1e9, {"i32": 0.5, "f32": 1.0}])
def test_integer_nodes_compare_exactly_whatever_the_threshold(tmp_path, nmse):
    ref, ours = _with_int_node(tmp_path, 1)
    r = diff_dumps(load_dump(ref), load_dump(ours), nmse=nmse)
    [bad] = r.numeric_failures
    assert (bad.name, bad.threshold) == ("ids", 0.0)
    assert not r.identical and exit_code([r]) == 1
    ref, ours = _with_int_node(tmp_path / "same", 0)
    assert diff_dumps(load_dump(ref), load_dump(ours), nmse=nmse).identical


@pytest.mark.parametrize("key,value", [("n_kv", 512), ("flash_attn", True), ("type_k", "q8_0"), ("n_ctx", 128),
                                       ("causal", True)])
def test_a_settings_difference_is_a_divergence(tmp_path, capsys, key, value):
    """Two graphs that ran under different settings do not pass as identical, even with every
    node equal: the difference is counted, shown and fails the exit code."""
    header = dict(HEADER, settings=dict(HEADER["settings"], **{key: value}))
    write(tmp_path / "ref", make_graph())
    write(tmp_path / "ours", make_graph(), header=header)
    [r] = diff_paths(tmp_path / "ref", tmp_path / "ours")
    assert not r.identical and r.status == "DIVERGED" and exit_code([r]) == 1
    assert r.structural == [] and not r.numeric_failures  # the nodes themselves agree
    assert r.settings_differ == [f"{key} ref={_fmt_setting(HEADER['settings'][key])} ours={_fmt_setting(value)}"]
    assert r.summary["settings_differ"] == 1 and r.to_dict()["settings_differ"] == r.settings_differ
    assert "settings differ" in r.format_text()
    assert cli_main(["diff", str(tmp_path / "ref"), str(tmp_path / "ours")]) == 1
    assert f"{key} ref=" in capsys.readouterr().out


def _fmt_setting(v):
    return json.dumps(v) if isinstance(v, (list, str, type(None))) else str(v)


def test_a_setting_only_one_side_records_is_a_note(tmp_path):
    """A setting beyond the required ones that only one side records cannot disagree: a note,
    not a divergence."""
    header = dict(HEADER, settings=dict(HEADER["settings"], n_threads=4))
    write(tmp_path / "ref", make_graph())
    write(tmp_path / "ours", make_graph(), header=header)
    [r] = diff_paths(tmp_path / "ref", tmp_path / "ours")
    assert r.identical and r.settings_differ == []
    assert any("n_threads (ours only)" in n for n in r.notes)


# -- xdiff's failures ---------------------------------------------------------------------------

def test_xdiff_fails_on_a_structural_difference(tmp_path):
    from graphgen.compare.xdiff import compare_dirs
    g = copy_graph()
    g[21][0].op = "SUB"
    write(tmp_path / "a", make_graph())
    write(tmp_path / "b", g)
    res = compare_dirs(tmp_path / "a", tmp_path / "b", ["cpu", "other"])
    assert not res.ok
    assert "FAIL" in res.format_text() and "structure DIFFERS" in res.format_text()
    assert any("SUB" in d for d in res.graphs[0]["structural"])


def test_xdiff_fails_on_a_graph_one_backend_did_not_run(tmp_path):
    from graphgen.compare.xdiff import compare_dirs
    for seq in range(2):
        write(tmp_path / "a", make_graph(), seq=seq)
    write(tmp_path / "b", make_graph())
    res = compare_dirs(tmp_path / "a", tmp_path / "b", ["cpu", "other"])
    assert not res.ok and len(res.graphs) == 2 and res.graphs[1]["nodes"] is None


def test_xdiff_keeps_integer_nodes_exact_under_any_bound(tmp_path):
    from graphgen.compare.xdiff import compare_dirs
    ref, ours = _with_int_node(tmp_path, 1)
    res = compare_dirs(ref.parent, ours.parent, ["cpu", "other"], nmse=1e9)
    assert not res.ok
    bad = res.graphs[0]["first_bad"]
    assert (bad["name"], bad["threshold"]) == ("ids", 0.0)


def test_xdiff_fails_when_a_node_was_not_compared(tmp_path):
    """Values missing on a side are no agreement: the node is named and the run fails."""
    from graphgen.compare.xdiff import compare_dirs
    g = make_graph()
    write(tmp_path / "a", g)
    nodes = [n for n, _ in g]
    values = {n.index: v for n, v in g if n.name != "kq-0"}
    d = write_dump(tmp_path / "b", 0, "block", HEADER, nodes, values)
    doc = json.loads(d.read_text())
    for n in doc["nodes"]:
        if n["name"] == "kq-0":
            n.pop("digest", None)
    d.write_text(json.dumps(doc))
    res = compare_dirs(tmp_path / "a", tmp_path / "b", ["cpu", "other"])
    assert not res.ok and res.graphs[0]["not_compared"] == ["kq-0"]
    assert "not compared" in res.format_text()


def test_xdiff_cli_exits_1_and_says_where(tmp_path, models_dir, capsys, monkeypatch):
    """The command's failure path: the second backend's run perturbed in one matmul."""
    import graphgen.compare.xdiff as X
    from make_references import build_model
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    real = X.run_scenario
    runs = []

    def perturbed(model, scenario, out, **kw):
        res = real(model, scenario, out, **kw)
        runs.append(out)
        if len(runs) == 2:
            for path in sorted(Path(out).glob("*-block.json")):
                doc = json.loads(path.read_text())
                k = next(n["index"] for n in doc["nodes"] if n["op"] == "MUL_MAT")
                z = dict(np.load(path.with_suffix(".npz")))
                z[f"n{k}"] = z[f"n{k}"] * np.float32(1.1)  # nmse 1e-2, past the matmul bound
                np.savez(path.with_suffix(".npz"), **z)
        return res
    monkeypatch.setattr(X, "run_scenario", perturbed)
    code = cli_main(["xdiff", str(model), "--scenario", str(case / "scenario.json"), "--backends", "cpu,cpu",
                     "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["ok"] is False
    [inject, block] = doc["graphs"]
    assert inject["first_bad"] is None and block["first_bad"]["op"] == "MUL_MAT"
