"""graphgen.view.dot: DOT text of a graph (clusters per layer, colours by op kind or by diff
status, leaves drawn small, views dashed), the one-pass layer overview, and SVG through Graphviz."""

import re
import shutil

import pytest

from graphgen.dump.format import Node
from graphgen.view import dot as D
from graphgen.view import graph as V
from graphgen.view.diffmap import STATUS_COLOURS

EPS = 0x3727C5AC   # 1e-5 as float bits
NODES = [
    Node(0, "inp_embd", "GET_ROWS", "f32", [8, 2, 1, 1], ["token_embd.weight", "inp_tokens"]),
    Node(1, "norm-0", "RMS_NORM", "f32", [8, 2, 1, 1], ["inp_embd"], op_params=[EPS] + [0] * 15),
    Node(2, 'say "hi"-0', "MUL", "f32", [8, 2, 1, 1], ["norm-0", "blk.0.attn_norm.weight"]),
    Node(3, "v-0", "VIEW", "f32", [8, 1, 1, 1], ['say "hi"-0'], view_src="cache_k_l0"),
    Node(4, "ffn_out-1", "SILU", "f32", [8, 2, 1, 1], ['say "hi"-0']),
    Node(5, "result_output", "MUL_MAT", "f32", [16, 2, 1, 1], ["output.weight", "ffn_out-1"]),
    Node(6, "custom", "MAP_CUSTOM1", "f32", [16, 2, 1, 1], ["result_output"]),
]


def line_of(dot, node_id):
    return next(ln for ln in dot.splitlines() if ln.strip().startswith(node_id + " ["))


@pytest.mark.parametrize("op, kind", [("MUL_MAT", "matmul"), ("FLASH_ATTN_EXT", "attention"), ("RMS_NORM", "norm"),
                                      ("ROPE", "rope"), ("SWIGLU", "activation"), ("ADD", "elementwise"),
                                      ("PERMUTE", "layout"), ("MAP_CUSTOM1", "other")])
def test_op_kinds_and_colours(op, kind):
    assert D.op_kind(op) == kind
    assert D.op_colour(op) == (D.OP_KINDS[kind][1] if kind != "other" else D.OTHER_COLOUR)


def test_dot_clusters_nodes_by_layer_and_labels_them():
    dot = D.to_dot(V.from_nodes(NODES), "my graph")
    assert dot.startswith('digraph "my graph" {') and dot.endswith("}\n")
    # one cluster per layer, holding its nodes and its leaves; the rest outside any cluster
    clusters = dict(re.findall(r"subgraph cluster_layer_(\d+) \{(.*?)\n  \}", dot, re.DOTALL))
    assert set(clusters) == {"0", "1"}
    assert all(f"n{k} [" in clusters["0"] for k in (1, 2, 3)) and '"l_cache_k_l0" [' in clusters["0"]
    assert "n4 [" in clusters["1"] and "n5 [" not in clusters["0"] + clusters["1"]
    assert 'label="layer 0"' in clusters["0"]
    norm = line_of(dot, "n1")
    assert 'label="#1 norm-0\\nRMS_NORM f32 [8, 2, 1, 1]\\neps=1e-05"' in norm
    assert f'fillcolor="{D.op_colour("RMS_NORM")}"' in norm and 'class="op-norm"' in norm
    assert 'tooltip="RMS_NORM eps=1e-05"' in norm
    # a quote in a name is escaped
    assert '#2 say \\"hi\\"-0' in line_of(dot, "n2")
    assert f'fillcolor="{D.OTHER_COLOUR}"' in line_of(dot, "n6")
    leaf = line_of(dot, '"l_token_embd.weight"')
    assert "shape=ellipse" in leaf and f'fillcolor="{D.LEAF_COLOUR}"' in leaf


def test_edges_and_views():
    dot = D.to_dot(V.from_nodes(NODES))
    assert '  "l_cache_k_l0" -> n3 [style=dashed];' in dot.splitlines()
    assert "  n2 -> n3;" in dot.splitlines() and "  n5 -> n6;" in dot.splitlines()
    bare = D.to_dot(V.from_nodes(NODES), leaves=False)
    assert '"l_' not in bare and "  n2 -> n3;" in bare.splitlines()


def test_diff_status_colours_and_the_first_divergence():
    dot = D.to_dot(V.from_nodes(NODES), status={2: ("value", 3.5e-3), 4: ("deleted", None)}, first=2)
    mul = line_of(dot, "n2")
    assert f'fillcolor="{STATUS_COLOURS["value"]}"' in mul and "\\nvalue nmse 3.50e-03" in mul
    assert 'color="#d50000", penwidth=3' in mul
    assert f'fillcolor="{STATUS_COLOURS["deleted"]}"' in line_of(dot, "n4") and "\\ndeleted\"" in line_of(dot, "n4")
    # a node the map does not name is matched
    assert f'fillcolor="{STATUS_COLOURS["matched"]}"' in line_of(dot, "n0") and "penwidth" not in line_of(dot, "n0")


def test_long_op_params_wrap():
    rope = Node(0, "Qcur-0", "ROPE", "f32", [16, 4, 4, 1], ["x", "pos"],
                op_params=[0, 16, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000, 0, 0] + [0] * 6)
    label = re.search(r'label="([^"]*)"', line_of(D.to_dot(V.from_nodes([rope])), "n0")).group(1)
    lines = label.split("\\n")
    assert len(lines) > 3 and all(len(x) <= 48 for x in lines[2:])


def test_overview_has_one_box_per_layer():
    dot = D.overview_dot(NODES, "t")
    assert 'label="t (layer overview)"' in dot
    assert '  layer_0 [label="layer 0\\n3 nodes\\nRMS_NORM 1, MUL 1, VIEW 1"];' in dot.splitlines()
    assert '  global [label="global\\n3 nodes\\nGET_ROWS 1, MUL_MAT 1, MAP_CUSTOM1 1"];' in dot.splitlines()
    edges = sorted(ln.strip() for ln in dot.splitlines() if "->" in ln)
    assert edges == ["global -> layer_0;", "layer_0 -> layer_1;", "layer_1 -> global;"]


def test_svg_needs_graphviz(monkeypatch):
    if D.dot_available():
        svg = D.render_svg(D.to_dot(V.from_nodes(NODES[:2])))
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "#0 inp_embd" in svg
        with pytest.raises(D.ViewError, match="Graphviz dot failed"):
            D.render_svg("digraph { a -> }")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert not D.dot_available()
    with pytest.raises(D.ViewError, match="needs Graphviz's `dot`, which is not installed"):
        D.render_svg("digraph { a }")
