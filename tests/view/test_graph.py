"""graphgen.view.graph: dumps, node lists and built ggml graphs as networkx graphs (nodes by
evaluation index, sources no node produces as leaves, edges by source slot), and the queries the
viewers ask of them."""

import networkx as nx
import pytest
from conftest import REF_DIR

from graphgen.dump.format import Node, load_dump
from graphgen.view import graph as V

NODES = [
    Node(0, "inp_embd", "GET_ROWS", "f32", [8, 2, 1, 1], ["token_embd.weight", "inp_tokens"]),
    Node(1, "norm-0", "RMS_NORM", "f32", [8, 2, 1, 1], ["inp_embd"]),
    Node(2, "node_2", "MUL", "f32", [8, 2, 1, 1], ["norm-0", "blk.0.attn_norm.weight"]),
    Node(3, "sq-0", "MUL", "f32", [8, 2, 1, 1], ["node_2", "node_2"]),
    Node(4, "v-0", "VIEW", "f32", [8, 1, 1, 1], ["sq-0"], view_src="cache_k_l0"),
    Node(5, "ffn_out-1", "ADD", "f32", [8, 2, 1, 1], ["sq-0", "inp_embd"]),
    Node(6, "result_output", "MUL_MAT", "f32", [16, 2, 1, 1], ["output.weight", "ffn_out-1"]),
]


@pytest.fixture
def g():
    return V.from_nodes(NODES, leaf_shapes={"token_embd.weight": [8, 16, 1, 1]})


def test_nodes_carry_their_fields_and_layer(g):
    assert V.graph_nodes(g) == list(range(7))
    d = g.nodes[2]
    assert (d["kind"], d["name"], d["op"], d["type"], d["ne"], d["shape"]) == \
        ("node", "node_2", "MUL", "f32", [8, 2, 1, 1], (1, 1, 2, 8))
    # named layers, an automatic name taking its first source's, and the nodes outside any layer
    assert [g.nodes[k]["layer"] for k in range(7)] == [None, 0, 0, 0, 0, 1, None]


def test_leaves_and_edges(g):
    leaves = sorted(k for k, d in g.nodes(data=True) if d["kind"] == "leaf")
    assert leaves == ["leaf:blk.0.attn_norm.weight", "leaf:cache_k_l0", "leaf:inp_tokens", "leaf:output.weight",
                      "leaf:token_embd.weight"]
    tok = g.nodes[V.leaf_key("token_embd.weight")]
    assert tok["ne"] == [8, 16, 1, 1] and tok["shape"] == (1, 1, 16, 8) and tok["op"] == "NONE"
    assert g.nodes[V.leaf_key("inp_tokens")]["ne"] is None
    # a leaf's layer: its own name's (blk.0., cache_k_l0), else the node that reads it
    assert g.nodes[V.leaf_key("blk.0.attn_norm.weight")]["layer"] == 0
    assert g.nodes[V.leaf_key("cache_k_l0")]["layer"] == 0
    assert g.nodes[V.leaf_key("output.weight")]["layer"] is None
    assert g.edges[V.leaf_key("token_embd.weight"), 0]["slot"] == 0
    assert g.edges[V.leaf_key("inp_tokens"), 0]["slot"] == 1
    assert g.edges[0, 5]["slot"] == 1 and g.edges[3, 5]["slot"] == 0
    # x * x keeps one edge; a view_src that is no source is slot -1
    assert g.number_of_edges(2, 3) == 1 and g.edges[2, 3]["slot"] == 0
    assert g.edges[V.leaf_key("cache_k_l0"), 4]["slot"] == -1


def test_without_leaves():
    g = V.from_nodes(NODES, leaves=False)
    assert all(isinstance(k, int) for k in g) and sorted(g.edges()) == [(0, 1), (0, 5), (1, 2), (2, 3), (3, 4),
                                                                        (3, 5), (5, 6)]


def test_names_resolve_to_the_latest_node_carrying_them():
    nodes = [Node(0, "Qcur-0", "MUL_MAT", "f32", [4, 1, 1, 1], ["w", "x"]),
             Node(1, "Qcur-0", "ROPE", "f32", [4, 1, 1, 1], ["Qcur-0", "pos"]),
             Node(2, "kq-0", "MUL_MAT", "f32", [4, 1, 1, 1], ["k", "Qcur-0"])]
    g = V.from_nodes(nodes)
    assert g.has_edge(0, 1) and g.has_edge(1, 2) and not g.has_edge(0, 2)
    assert V.find(g, "Qcur-0") == 0 and V.find(g, "Qcur-0", last=True) == 1


def test_find(g):
    assert V.find(g, "norm-0") == 1 and V.find(g, "#5") == 5 and V.find(g, "6") == 6
    assert V.find(g, "output.weight") == "leaf:output.weight"
    with pytest.raises(KeyError, match="no node named 'nothing'"):
        V.find(g, "nothing")


def test_layers_and_subgraphs(g):
    assert V.layers(g) == [None, 0, 1]
    assert V.graph_nodes(V.layer_subgraph(g, 0, leaves=False)) == [1, 2, 3, 4]
    with_leaves = V.layer_subgraph(g, 0)
    assert set(with_leaves) == {1, 2, 3, 4, "leaf:blk.0.attn_norm.weight", "leaf:cache_k_l0"}
    assert dict(V.iter_layer_nodes(g)) == {None: [0, 6], 0: [1, 2, 3, 4], 1: [5]}
    assert V.layer_label(None) == "global" and V.layer_label(3) == "layer 3"


def test_paths_ancestors_and_neighbourhoods(g):
    assert V.path_between(g, "inp_embd", "result_output") == [0, 5, 6]
    assert V.path_between(g, 1, 4) == [1, 2, 3, 4]
    assert V.ancestors_of(g, "sq-0") == [0, 1, 2]
    assert V.ancestors_of(g, 3, nodes_only=False) == [0, 1, 2, "leaf:blk.0.attn_norm.weight", "leaf:inp_tokens",
                                                      "leaf:token_embd.weight"]
    assert set(V.around(g, "sq-0", depth=1)) == {2, 3, 4, 5}
    # up to depth edges downstream and upstream (not along undirected paths: inp_embd is a sibling)
    assert set(V.around(g, 3, depth=2)) == {1, 2, 3, 4, 5, 6, "leaf:blk.0.attn_norm.weight"}


def test_layer_overview(g):
    ov = V.layer_overview(g)
    assert list(ov) == ["global", "layer 0", "layer 1"]
    assert ov.nodes["layer 0"]["count"] == 4 and ov.nodes["layer 0"]["ops"] == {"RMS_NORM": 1, "MUL": 2, "VIEW": 1}
    assert ov.nodes["global"]["ops"] == {"GET_ROWS": 1, "MUL_MAT": 1}
    assert sorted(ov.edges()) == [("global", "layer 0"), ("global", "layer 1"), ("layer 0", "layer 1"),
                                  ("layer 1", "global")]


def test_from_dump_reads_a_reference_graph():
    d = load_dump(REF_DIR / "dflash-fa-off" / "01-block.json")
    g = V.from_dump(d)
    assert g.graph == {"graph": "block", "model": d.model, "engine": "llama.cpp"}
    assert [g.nodes[k]["name"] for k in V.graph_nodes(g)] == [n.name for n in d.nodes]
    assert V.layers(g) == [None, 0, 1]
    assert nx.is_directed_acyclic_graph(g)
    # every edge runs forward in evaluation order
    assert all(u < v for u, v in g.edges() if isinstance(u, int))


def test_from_cgraph_reads_a_built_graph():
    from graphgen.ops import ggml as G
    ctx = G.ggml_init(G.ggml_init_params(mem_size=16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(),
                                         mem_buffer=None, no_alloc=True))
    try:
        x = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 2)
        G.ggml_set_name(x, b"inp")
        w = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 8, 4)
        G.ggml_set_name(w, b"blk.1.w.weight")
        y = G.ggml_mul_mat(ctx, w, x)
        G.ggml_set_name(y, b"mm-1")
        z = G.ggml_reshape_3d(ctx, y, 2, 2, 2)
        gf = G.ggml_new_graph(ctx)
        G.ggml_build_forward_expand(gf, z)
        g = V.from_cgraph(gf)
    finally:
        G.ggml_free(ctx)
    assert g.graph["graph"] == "built"
    assert [(g.nodes[k]["name"], g.nodes[k]["op"], g.nodes[k]["ne"]) for k in V.graph_nodes(g)] == [
        ("mm-1", "MUL_MAT", [4, 2, 1, 1]), ("mm-1 (reshaped)", "RESHAPE", [2, 2, 2, 1])]
    assert g.nodes[V.leaf_key("blk.1.w.weight")]["ne"] == [8, 4, 1, 1]
    assert g.nodes[V.leaf_key("inp")]["layer"] == 1 and g.has_edge(0, 1)
