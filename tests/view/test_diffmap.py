"""graphgen.view.diffmap: a graph-diff's result as one status per node, in alignment order, for
the viewers: matched, changed, value, deleted, inserted, explained, uncompared."""

import dataclasses
import math
from pathlib import Path

import numpy as np

from graphgen.compare.diff import diff_dumps
from graphgen.compare.report import Difference, DiffResult, Explained, NumericResult
from graphgen.dump.format import FORMAT, Dump, Node, load_dump, write_dump
from graphgen.view.diffmap import STATUS_COLOURS, STATUS_LABELS, STATUSES, diff_map


def dump(names):
    nodes = [Node(k, n, "ADD", "f32", [4, 1, 1, 1]) for k, n in enumerate(names)]
    return Dump(path=Path("00-block.json"), format=FORMAT, source={"engine": "graphgen", "version": "1"},
                model="m", graph="block", settings={}, cpu_features={}, nodes=nodes)


def numeric(i, j, nmse, ok, **kw):
    return NumericResult(i, j, f"n{i}", "f32", 4, nmse, 0.5, 1e-7, ok, **kw)


def test_every_status_has_a_colour_and_the_diffs_word():
    assert set(STATUS_COLOURS) == set(STATUS_LABELS) == set(STATUSES)
    assert STATUS_LABELS["deleted"].startswith("deleted") and STATUS_LABELS["inserted"].startswith("inserted")
    assert STATUS_LABELS["matched"] == "identical"


def test_rows_follow_the_alignment():
    # ref:  a b c d e f g        ours: a X c d e f' g h   (b deleted, X inserted before c,
    # e's values fail, f changed, g not compared, h's run explained by a rule on ours's side only)
    ref, ours = dump("abcdefg"), dump("aXcdeFgh")
    res = DiffResult("r", "o", "block", False,
                     structural=[Difference("deleted", 1, None, {}, ref_name="b", op="ADD", ours_pos=1),
                                 Difference("inserted", None, 1, {}, ours_name="X", op="ADD", ref_pos=2),
                                 Difference("changed", 5, 5, {"name": ("f", "F")}, ref_name="f", op="ADD")],
                     numeric=[numeric(0, 0, 0.0, True), numeric(3, 3, 1e-9, True),
                              numeric(4, 4, 0.25, False, worst={"index": 2, "coord": [2, 0, 0, 0], "ref": 1.0,
                                                                "ours": 1.5, "abs": 0.5})],
                     not_compared=[(6, 6, "g", "no values or digest on either side")],
                     explained=[Explained("extra", [], [7])],
                     first_divergence={"kind": "deleted", "ref_index": 1, "ours_index": None},
                     first_structural={"ref_index": None, "ours_index": 1},
                     first_value={"ref_index": 4, "ours_index": 4})
    dm = diff_map(res, ref, ours)
    assert [(r.ref, r.ours, r.status) for r in dm.rows] == [
        (0, 0, "matched"), (1, None, "deleted"), (None, 1, "inserted"), (2, 2, "matched"), (3, 3, "matched"),
        (4, 4, "value"), (5, 5, "changed"), (6, 6, "uncompared"), (None, 7, "explained")]
    rows = {(r.ref, r.ours): r for r in dm.rows}
    assert rows[1, None].detail == "ref #1 'b' has no counterpart in ours"
    assert rows[None, 1].detail == "inserted ours #1 'X' ADD"
    assert rows[3, 3].nmse == 1e-9 and rows[0, 0].nmse == 0.0 and rows[2, 2].nmse is None
    assert rows[4, 4].detail.startswith("values ref #4 / ours #4 'n4' (f32): nmse 0.25")
    assert rows[4, 4].worst == {"index": 2, "coord": [2, 0, 0, 0], "ref": 1.0, "ours": 1.5, "abs": 0.5}
    assert rows[5, 5].fields == {"name": ("f", "F")} and rows[5, 5].detail.startswith("changed ref #5")
    assert rows[6, 6].detail == "values not compared: no values or digest on either side"
    assert dm.ref_status[4].status == "value" and dm.ours_status[1].status == "inserted"
    assert dm.first is rows[1, None] and dm.first_structural is rows[None, 1] and dm.first_value is rows[4, 4]


def test_a_changed_node_whose_values_fail_stays_changed_and_nan_is_no_number():
    ref, ours = dump("ab"), dump("ab")
    res = DiffResult("r", "o", "block", False,
                     structural=[Difference("changed", 1, 1, {"op": ("ADD", "SUB")}, ref_name="b", op="ADD")],
                     numeric=[numeric(0, 0, math.nan, False, reason="NaN/Inf positions differ"),
                              numeric(1, 1, 1.0, False)])
    dm = diff_map(res, ref, ours)
    assert [(r.status, r.nmse) for r in dm.rows] == [("value", None), ("changed", 1.0)]
    assert dm.first is None


def test_a_rule_on_both_sides_pairs_what_is_left():
    # ref: a FUSED c   ours: a p q r c   (FUSED explained by the chain p q r)
    ref, ours = dump(["a", "FUSED", "c"]), dump(["a", "p", "q", "r", "c"])
    res = DiffResult("r", "o", "block", True, explained=[Explained("fuse", [1], [1, 2, 3])])
    dm = diff_map(res, ref, ours)
    # the ref run in its place; the ours run, which no ref row holds, after the rest
    assert [(r.ref, r.ours, r.status) for r in dm.rows] == [(0, 0, "matched"), (1, None, "explained"),
                                                           (2, 4, "matched"), (None, 1, "explained"),
                                                           (None, 2, "explained"), (None, 3, "explained")]


def test_a_real_diff_maps_onto_both_graphs(tmp_path):
    ref = load_dump(Path(__file__).resolve().parents[1] / "data" / "reference" / "dflash-fa-off" / "01-block.json")
    nodes = [dataclasses.replace(n) for n in ref.nodes]
    values = {n.index: ref.values(n.index) for n in ref.nodes}
    values[40] = values[40] + np.float32(1.0)    # l_out-0's values differ
    header = {"source": ref.source, "model": ref.model, "settings": ref.settings, "cpu_features": ref.cpu_features}
    ours = load_dump(write_dump(tmp_path, 1, "block", header, nodes, values))
    dm = diff_map(diff_dumps(ref, ours), ref, ours)
    assert [(r.ref, r.status) for r in dm.rows if r.status != "matched"] == [(40, "value")]
    assert len(dm.rows) == len(ref.nodes) and dm.first_value.ref == 40 and dm.first.ref == 40
    assert dm.ref_status[40].nmse > 0 and dm.ref_status[39].nmse == 0.0
