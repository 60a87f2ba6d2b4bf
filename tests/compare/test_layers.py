"""graphgen.compare.layers: the layer a node belongs to, from its name or from its sources."""

import pytest

from graphgen.dump.format import Node
from graphgen.compare.layers import is_auto_name, name_layer, node_layers, resolve_sources


def nodes_of(*rows):
    """Nodes from (name, src) or (name, src, view_src) rows, indexed in order."""
    out = []
    for i, row in enumerate(rows):
        name, src = row[0], row[1]
        view_src = row[2] if len(row) > 2 else None
        out.append(Node(index=i, name=name, op="ADD", type="f32", ne=[4, 1, 1, 1], src=list(src),
                        view_src=view_src))
    return out


@pytest.mark.parametrize("name, layer", [
    ("ffn_out-1", 1),
    ("attn_norm-10", 10),
    ("ffn_inp-123", 123),
    ("Kcur-0 (view)", 0),
    ("Kcur-7 (view) (permuted)", 7),
    ("a-b-3", 3),
    ("cache_k_l1", 1),
    ("cache_v_l23", 23),
    ("cache_k_l4 (view)", 4),
    ("blk.1.ffn_up.weight", 1),
    ("blk.12.attn_q.weight", 12),
])
def test_name_layer_reads_the_layer_a_name_states(name, layer):
    """A suffix `-N` (views' parenthesised notes aside), `cache_[kv]_lN` and `blk.N.` give layer N."""
    assert name_layer(name) == layer


@pytest.mark.parametrize("name", [
    "inp_embd", "result_output", "node_12", "leaf_3", "", "norm-x", "ffn_out-1x",
    "cache_k_l", "cache_k_l1x", "cache_q_l1", "xblk.1.w", "blk.a.w", "Kcur-0 (View)",
    "ffn_out_1", "-",
])
def test_name_layer_none_when_the_name_states_no_layer(name):
    """A name without a layer suffix, cache or weight prefix states no layer."""
    assert name_layer(name) is None


@pytest.mark.parametrize("name", ["node_12", "leaf_3", "node_0 (view)", " (reshaped)",
                                  " (reshaped) (permuted)", "leaf_10 (copy of x)", ""])
def test_automatic_names_are_recognised(name):
    """ggml's automatic names, with or without view notes, are automatic."""
    assert is_auto_name(name)


@pytest.mark.parametrize("name", ["ffn_out-1", "node_", "node_12x", "my_node_12", "node_1_2",
                                  "inp_embd (view)", "leaf3", "Node_1"])
def test_other_names_are_not_automatic(name):
    """A name a graph gave, or one only resembling ggml's pattern, is not automatic."""
    assert not is_auto_name(name)


def test_sources_resolve_to_the_latest_earlier_producer():
    """A source name resolves to the most recent earlier node of that name; unknown and later ones
    to None; empty slots are skipped keeping their slot number; view_src comes last as slot -1."""
    nodes = nodes_of(
        ("x", []),                          # 0
        ("y", ["x", "w.weight"]),           # 1
        ("x", ["y"]),                       # 2  x again
        ("z", ["", "x", "later"]),          # 3  slot 0 empty
        ("v", ["z"], "y"),                  # 4  view of y, not a src
        ("u", ["z"], "z"),                  # 5  view_src among the srcs: not repeated
        ("later", ["later"]),               # 6  its own name: the earlier one (none)
    )
    assert resolve_sources(nodes) == [
        [],
        [(0, "x", 0), (1, "w.weight", None)],
        [(0, "y", 1)],
        [(1, "x", 2), (2, "later", None)],
        [(0, "z", 3), (-1, "y", 1)],
        [(0, "z", 3)],
        [(0, "later", None)],
    ]


def test_a_node_named_like_its_source_resolves_to_the_earlier_one():
    """A node whose name repeats its source's points at the earlier node, never at itself."""
    nodes = nodes_of(("a", []), ("a", ["a"]), ("a", ["a"]))
    assert [row[0][2] if row else None for row in resolve_sources(nodes)] == [None, 0, 1]


def test_node_layers_from_names():
    """Named nodes take the layer their name states; names without one (not automatic) stay None
    whatever their sources say."""
    nodes = nodes_of(("inp_embd", []), ("norm-0", ["inp_embd"]), ("ffn_out-1", ["norm-0"]),
                     ("result_norm", ["ffn_out-1"]), ("cache_k_l2", []))
    assert node_layers(nodes) == [None, 0, 1, None, 2]


def test_automatic_names_take_the_first_source_with_a_layer():
    """An automatic name takes the layer of its first source that has one: a producer's layer
    (itself inherited, along a chain), else the layer the source's name states (a weight)."""
    nodes = nodes_of(
        ("inp_embd", []),                                   # 0 None
        ("ffn_out-3", ["inp_embd"]),                        # 1 3
        ("node_2", ["inp_embd", "ffn_out-3"]),              # 2 first src has none: the second's, 3
        ("node_3", ["node_2"]),                             # 3 chain: 3
        ("node_4", ["blk.5.ffn_up.weight", "node_3"]),      # 4 a weight's name: 5
        ("node_5", ["inp_embd"]),                           # 5 nothing has a layer
        (" (reshaped)", [], "node_4"),                      # 6 via view_src: 5
        ("node_7", ["norm-1", "ffn_out-3"]),                # 7 norm-1 not produced: its name, 1
    )
    assert node_layers(nodes) == [None, 3, 3, 3, 5, None, 5, 1]


def test_node_layers_uses_the_sources_given():
    """Sources passed in are used instead of resolving them again."""
    nodes = nodes_of(("ffn_out-1", []), ("ffn_out-4", []), ("node_2", ["ffn_out-1"]))
    given = [[], [], [(0, "ffn_out-1", 1)]]
    assert node_layers(nodes, given) == [1, 4, 4]
    assert node_layers(nodes) == [1, 4, 1]
