"""Lining two graphs of a block up: a sequence's rows of a batched node along its token or block
axis, and ggml's own node names replaced by what the node does and reads."""

from graphgen.checkbatch.matching import node_label, rows_of
from graphgen.dump.format import Node


def test_rows_of_token_and_block_axes():
    # [64, T] with T = 7 (blocks 4 and 3): sequence 1 is rows 4..7
    assert rows_of([64, 7, 1, 1], [64, 3, 1, 1], 7, 3, 4, 2, 1) == (2, 4, 7)
    # [1, 64 T] token-major: 64 values a token
    assert rows_of([1, 448, 1, 1], [1, 192, 1, 1], 7, 3, 4, 2, 1) == (2, 256, 448)
    # [4, n_blocks] per block: block 1 of 2
    assert rows_of([4, 2, 1, 1], [4, 1, 1, 1], 8, 4, 4, 2, 1) == (2, 1, 2)
    assert rows_of([64, 7, 2, 1], [64, 3, 1, 1], 7, 3, 4, 2, 1) is None
    assert rows_of([64, 256, 1, 1], [64, 256, 1, 1], 7, 3, 4, 2, 1) == "whole"


def test_unnamed_nodes_reported_by_op_source_and_index():
    """ggml names an unnamed node `node_<i>`: the report names its op, the named node it reads
    (through unnamed ones) and its index instead."""
    nodes = [Node(index=0, name="Kcur-0", op="MUL_MAT", type="f32", ne=[8, 4, 1, 1], src=["w", "x"]),
             Node(index=1, name="node_1", op="VIEW", type="f32", ne=[8, 2, 1, 1], src=["Kcur-0"]),
             Node(index=2, name="node_2 (reshaped)", op="RESHAPE", type="f32", ne=[16, 1, 1, 1], src=["node_1"]),
             Node(index=3, name="node_3", op="MUL_MAT", type="f32", ne=[1, 1, 1, 1], src=["w2", "node_2 (reshaped)"]),
             Node(index=4, name="node_4", op="SCALE", type="f32", ne=[1, 1, 1, 1], src=["node_3"]),
             Node(index=5, name="kq-0", op="SCALE", type="f32", ne=[1, 1, 1, 1], src=["node_4"])]
    assert [node_label(nodes, k) for k in range(6)] == [
        "Kcur-0", "VIEW of Kcur-0 (#1)", "RESHAPE of Kcur-0 (#2)", "MUL_MAT of w2 (#3)", "SCALE of w2 (#4)", "kq-0"]
