"""A sequence batched against alone, on hand-made graphs whose differences are planted with
numpy: its rows cut out, bits not closeness, graphs taken as they come, and an output one graph
lacks (a real head's) counted as a difference."""

import hashlib

import numpy as np
import pytest

from graphgen.checkbatch import check_batch
from graphgen.checkbatch.engines import Graph
from graphgen.checkbatch.measure import compare_case, compare_sequence, summarize
from graphgen.checkbatch.plan import Case, CheckBatchError
from graphgen.checkbatch.results import SeqResult
from graphgen.dump.format import Node
from graphgen.synth import make_model


def _node(i, name, ne, src=()):
    return Node(index=i, name=name, op="MUL_MAT", type="f32", ne=list(ne) + [1] * (4 - len(ne)), src=list(src))


def _graph(nodes, values):
    return Graph(nodes, dict(enumerate(values)))


def test_comparison_cuts_each_sequence_rows():
    # two sequences of 3 and 2 tokens; a per-token node [8, T] and an output [5, T] reading it
    case = Case(2, "unequal", prompts=[4, 6], blocks=[[1, 9, 9], [2, 9]])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8), dtype=np.float32)       # numpy order: [T, 8]
    y = rng.standard_normal((5, 5), dtype=np.float32)
    batched = _graph([_node(0, "x", (8, 5)), _node(1, "out", (5, 5), ["x"])], [x[None, None], y[None, None]])
    alone0 = _graph([_node(0, "x", (8, 3)), _node(1, "out", (5, 3), ["x"])], [x[None, None, :3], y[None, None, :3]])
    y1 = y[3:].copy()
    y1[1, 2] += 1e-3   # sequence 1's last row, one value
    alone1 = _graph([_node(0, "x", (8, 2)), _node(1, "out", (5, 2), ["x"])], [x[None, None, 3:], y1[None, None]])
    got0, skipped0 = compare_sequence(batched, alone0, case, 0)
    assert skipped0 == 0 and [(n, s) for n, _, s, _ in got0] == [("x", True), ("out", True)]
    got1, _ = compare_sequence(batched, alone1, case, 1)
    assert [(n, s, o) for n, _, s, o in got1] == [("x", True, False), ("out", False, True)]
    want = float(np.sum((y1 - y[3:]).astype(np.float64) ** 2) / np.sum(y1.astype(np.float64) ** 2))
    assert got1[1][1] == pytest.approx(want, rel=1e-9)
    # one unit in the last place is a difference: bits, not closeness
    y2 = y[3:].copy()
    y2[0, 0] = np.nextafter(y2[0, 0], np.float32(np.inf))
    alone2 = _graph([_node(0, "x", (8, 2)), _node(1, "out", (5, 2), ["x"])], [x[None, None, 3:], y2[None, None]])
    got2, _ = compare_sequence(batched, alone2, case, 1)
    assert [s for _, _, s, _ in got2] == [True, False] and 0 < got2[1][1] < 1e-12
    res = SeqResult(1, 2, 6)
    summarize(res, got1, 0)
    assert (res.identical, res.worst_node, res.first_node, res.nodes_differ) == (False, "out", "out", 1)
    assert res.outputs_nmse == pytest.approx(want, rel=1e-9)


def test_case_graphs_compared_as_they_come():
    """A case's graphs arrive one at a time: each is compared with the first batched block and
    its values let go (16 sequences of a realistic draft would not fit in memory otherwise); a
    wrong number of graphs is refused."""
    case = Case(1, "equal", prompts=[4], blocks=[[1, 9]])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8), dtype=np.float32)
    y = rng.standard_normal((2, 5), dtype=np.float32)
    nodes = [_node(0, "x", (8, 2)), _node(1, "out", (5, 2), ["x"])]
    for n, v in zip(nodes, (x, y)):
        n.digest = hashlib.sha256(v.tobytes()).hexdigest()
    roles = [("batched", -1), ("alone", 0), ("batched", -1), ("own", 0), ("batched", -1)]
    made = []

    def graphs(n):
        for _ in range(n):
            made.append(_graph(nodes, [x[None, None].copy(), y[None, None].copy()]))
            yield made[-1]
    seqs, reproducible, kept = compare_case(case, graphs(5), roles)
    assert reproducible and seqs[0].identical and seqs[0].own_outputs_identical
    assert kept[0] is made[0] and kept[0].values
    assert all(k.values == {} and k.nodes is g.nodes for k, g in zip(kept[1:], made[1:]))
    for n in (4, 6):
        with pytest.raises(CheckBatchError, match="block graphs"):
            compare_case(case, graphs(n), roles, "graphgen")


def test_comparison_refuses_when_no_output_can_be_cut():
    case = Case(2, "equal", prompts=[4, 4], blocks=[[1, 9], [2, 9]])
    v = np.zeros((1, 1, 3, 3), dtype=np.float32)
    batched = _graph([_node(0, "out", (3, 3))], [v])   # no axis of 4 tokens: cannot be cut
    alone = _graph([_node(0, "out", (3, 2))], [v[:, :, :2]])
    with pytest.raises(CheckBatchError, match="no output"):
        compare_sequence(batched, alone, case, 0)


def test_an_output_missing_in_the_batch_is_a_difference(tmp_path):
    # LiliCorr builds its lattice only for a batch of full blocks: batched with a shorter block,
    # a full block gets logits alone; by itself it gets its lattice
    path = tmp_path / "lilicorr.gguf"
    make_model(path, "lilicorr", "base")
    rep = check_batch(path, n_seqs=[2], engines=("graphgen",))
    full, short = rep.cases[1].seqs["graphgen"]
    assert (full.n_tokens, short.n_tokens) == (4, 3)
    assert full.outputs_nmse == np.inf and full.first_node.endswith("(absent batched)")
    assert short.identical
