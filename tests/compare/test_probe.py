"""graphgen.compare.probe: `graphgen diff --at NODE`, its targets, largest errors and windows."""

import hashlib
import math

import numpy as np
import pytest

from graphgen.dump.format import Node, load_dump, write_dump
from graphgen.compare.probe import (TOP, WINDOW, ProbeError, coord, find_pairs, format_probe,
                                    largest_errors, parse_target, probe, stats_of, window)

HEADER = {
    "source": {"engine": "llama.cpp", "version": "b6000"},
    "model": "m.gguf",
    "settings": {"flash_attn": False, "type_k": "f16", "type_v": "f16", "n_ctx": 64,
                 "n_ubatch": 4, "n_kv": 4, "causal": False},
    "cpu_features": {},
}


def ggml_coord(flat, ne):
    """[i0, i1, i2, i3] by numpy: unravel in (ne3, ne2, ne1, ne0) order, then reverse."""
    ne4 = list(ne) + [1] * (4 - len(ne))
    return [int(x) for x in reversed(np.unravel_index(flat, tuple(reversed(ne4))))]


@pytest.mark.parametrize("ne", [[5, 3, 2, 2], [7, 4], [6], [1, 1, 1, 1], [2, 3, 4, 5]])
def test_coord_is_ggml_order_fastest_first(ne):
    """Every flat index maps to the ggml coordinates numpy finds in the reversed shape."""
    n = int(np.prod(ne))
    for flat in range(n):
        assert coord(flat, ne) == ggml_coord(flat, ne)


def test_coord_by_hand():
    """i0 + ne0 * (i1 + ne1 * (i2 + ne2 * i3)) read back."""
    ne = [5, 3, 2, 2]
    assert coord(0, ne) == [0, 0, 0, 0]
    assert coord(4, ne) == [4, 0, 0, 0]
    assert coord(5, ne) == [0, 1, 0, 0]
    assert coord(3 + 5 * (2 + 3 * (1 + 2 * 1)), ne) == [3, 2, 1, 1]
    assert coord(59, ne) == [4, 2, 1, 1]


def test_largest_errors_largest_first_with_coordinates():
    """Elements that differ, by |ours - ref| from largest, at most k, each with its flat index,
    coordinates and both values; equal elements are left out."""
    ne = [4, 3]
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = a.copy()
    b[0, 1] += 0.5     # flat 1
    b[2, 3] -= 3.0     # flat 11
    b[1, 0] += 1.0     # flat 4
    b[1, 2] += 0.25    # flat 6
    got = largest_errors(a, b, ne)
    assert [e["index"] for e in got] == [11, 4, 1, 6]
    assert got[0] == {"index": 11, "coord": [3, 2, 0, 0], "ref": 11.0, "ours": 8.0, "abs": 3.0}
    assert got[1]["coord"] == [0, 1, 0, 0] and got[1]["abs"] == 1.0
    assert [e["abs"] for e in got] == [3.0, 1.0, 0.5, 0.25]
    assert [e["index"] for e in largest_errors(a, b, ne, k=2)] == [11, 4]


def test_largest_errors_keeps_at_most_top():
    """By default TOP elements come back, the largest ones."""
    a = np.zeros(20)
    b = np.arange(1, 21, dtype=np.float64)
    got = largest_errors(a, b, [20])
    assert len(got) == TOP
    assert [e["index"] for e in got] == list(range(19, 19 - TOP, -1))


def test_largest_errors_empty_when_all_agree():
    """Equal arrays, NaN against NaN and an infinity against the same infinity give no errors."""
    a = np.array([1.0, np.nan, np.inf, -np.inf, 0.0])
    assert largest_errors(a, a.copy(), [5]) == []
    assert largest_errors(np.array([-0.0]), np.array([0.0]), [1]) == []


def test_largest_errors_ties_keep_index_order():
    """Equal errors are listed by flat index."""
    a = np.zeros(6)
    b = np.array([0.0, 2.0, 1.0, 2.0, 0.0, 2.0])
    assert [e["index"] for e in largest_errors(a, b, [6])] == [1, 3, 5, 2]


def test_largest_errors_nan_or_inf_disagreement_ranks_first():
    """NaN on one side, opposite infinities and an infinity against a finite value rank above any
    finite error, with |error| infinite."""
    a = np.array([0.0, 1.0, np.nan, 2.0, np.inf, 5.0, np.inf], dtype=np.float32)
    b = np.array([1e30, np.nan, 3.0, 2.0, -np.inf, np.inf, np.inf], dtype=np.float32)
    got = largest_errors(a, b, [7])
    assert [e["index"] for e in got] == [1, 2, 4, 5, 0]
    assert all(e["abs"] == math.inf for e in got[:4])
    assert got[4]["abs"] == pytest.approx(1e30, rel=1e-6)
    assert math.isnan(got[0]["ours"]) and math.isnan(got[1]["ref"])


def test_largest_errors_one_element():
    """A one-element tensor: its one error, at [0, 0, 0, 0]."""
    got = largest_errors(np.array([[[[2.0]]]]), np.array([[[[-1.0]]]]), [1, 1, 1, 1])
    assert got == [{"index": 0, "coord": [0, 0, 0, 0], "ref": 2.0, "ours": -1.0, "abs": 3.0}]


def test_stats_of_values():
    """count of every element; sum, sumsq, min, max over the finite ones; NaNs and infinities counted."""
    v = np.array([[1.0, -2.0, np.nan], [np.inf, 3.5, -np.inf]], dtype=np.float32)
    n = Node(0, "x", "ADD", "f32", [3, 2])
    assert stats_of(v, n) == {"count": 6, "sum": 2.5, "sumsq": 1 + 4 + 12.25, "min": -2.0, "max": 3.5,
                              "nan": 1, "inf": 2}


def test_stats_of_no_finite_value():
    """Without a finite value min and max are None, sums 0."""
    s = stats_of(np.array([np.nan, np.inf]), Node(0, "x", "ADD", "f32", [2]))
    assert s == {"count": 2, "sum": 0.0, "sumsq": 0.0, "min": None, "max": None, "nan": 1, "inf": 1}


def test_stats_of_without_values_are_the_recorded_ones():
    """No values: a copy of what the dump recorded, or None when it recorded nothing."""
    rec = {"count": 4, "sum": 1.0, "sumsq": 2.0, "min": 0.0, "max": 1.0, "nan": 0, "inf": 0}
    n = Node(0, "x", "ADD", "f32", [4], stats=rec)
    got = stats_of(None, n)
    assert got == rec and got is not rec
    assert stats_of(None, Node(0, "x", "ADD", "f32", [4])) is None


def test_window_around_an_inner_element():
    """Columns i0 +- WINDOW[0] and rows i1 +- WINDOW[1] of the (i2, i3) plane of the element."""
    ne = [12, 7, 3, 2]
    v = np.arange(np.prod(ne), dtype=np.float32).reshape(2, 3, 7, 12)
    at = [6, 3, 2, 1]
    w = window(v, ne, at)
    c0, c1 = at[0] - WINDOW[0], at[0] + WINDOW[0] + 1
    r0, r1 = at[1] - WINDOW[1], at[1] + WINDOW[1] + 1
    assert w["i0"] == [c0, c1] and w["i1"] == [r0, r1]
    assert w["values"] == v[1, 2, r0:r1, c0:c1].tolist()
    flat = 6 + 12 * (3 + 7 * (2 + 3 * 1))
    centre = w["values"][at[1] - r0][at[0] - c0]
    assert centre == float(flat)


def test_window_clipped_at_the_edges():
    """Near the tensor's edges the window stops at them."""
    ne = [3, 2, 2]
    v = np.arange(12, dtype=np.float64).reshape(2, 2, 3)
    w = window(v.ravel(), ne, [0, 1, 1, 0])
    assert w["i0"] == [0, 3] and w["i1"] == [0, 2]
    assert w["values"] == [[6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]
    w = window(v, ne, [2, 0, 0, 0])
    assert w["i0"] == [0, 3] and w["i1"] == [0, 2]
    assert w["values"] == v[0].tolist()


def test_window_of_one_element():
    """A one-element tensor's window is that element."""
    w = window(np.array([4.5], dtype=np.float32), [1], [0, 0, 0, 0])
    assert w == {"i0": [0, 1], "i1": [0, 1], "values": [[4.5]]}


@pytest.mark.parametrize("text, side, index", [("12", "ref", 12), ("#12", "ref", 12), ("ref#3", "ref", 3),
                                               ("ours#7", "ours", 7), ("ours #0", "ours", 0),
                                               ("  ref 4 ", "ref", 4)])
def test_parse_target_indices(text, side, index):
    """`12` and `#12` are ref's index; `ours#K` and `ref#K` name the side."""
    t = parse_target(text)
    assert (t.side, t.index, t.name, t.text) == (side, index, None, text)
    assert str(t) == f"{side} #{index}"


@pytest.mark.parametrize("text", ["ffn_out-1", "ours", "12a", "node_12", "#", "ours#x", "theirs#1", "-1"])
def test_parse_target_names(text):
    """Anything else is a node name, kept as written."""
    t = parse_target(text)
    assert (t.side, t.index, t.name) == (None, None, text)
    assert str(t) == repr(text)


@pytest.mark.parametrize("text", ["", "   "])
def test_parse_target_refuses_an_empty_name(text):
    """An empty or blank NODE is refused."""
    with pytest.raises(ProbeError, match="empty"):
        parse_target(text)


def nodes(*names):
    return [Node(i, nm, "ADD", "f32", [4]) for i, nm in enumerate(names)]


R = nodes("a", "b", "x", "x", "c")
O = nodes("a", "x", "b", "x", "x", "d")
PAIRS = {0: 0, 1: 2, 2: 1, 3: 3}   # ref -> ours; ref 4 ('c') and ours 4, 5 unpaired


def test_find_pairs_by_name_every_node_of_that_name():
    """A name: each ref node of that name with its partner, then ours' nodes of that name that are no
    ref node's partner."""
    assert find_pairs(parse_target("x"), R, O, PAIRS) == [(2, 1), (3, 3), (None, 4)]
    assert find_pairs(parse_target("c"), R, O, PAIRS) == [(4, None)]
    assert find_pairs(parse_target("d"), R, O, PAIRS) == [(None, 5)]
    assert find_pairs(parse_target("nope"), R, O, PAIRS) == []


def test_find_pairs_by_index_on_either_side():
    """`K` / `ref#K` finds ref's node K and its partner; `ours#K` ours' node K and the ref node paired with it."""
    assert find_pairs(parse_target("1"), R, O, PAIRS) == [(1, 2)]
    assert find_pairs(parse_target("4"), R, O, PAIRS) == [(4, None)]
    assert find_pairs(parse_target("ours#2"), R, O, PAIRS) == [(1, 2)]
    assert find_pairs(parse_target("ours#1"), R, O, PAIRS) == [(2, 1)]
    assert find_pairs(parse_target("ours#5"), R, O, PAIRS) == [(None, 5)]


def test_find_pairs_index_out_of_range_finds_nothing():
    """An index past the side's last node finds nothing."""
    assert find_pairs(parse_target("5"), R, O, PAIRS) == []
    assert find_pairs(parse_target("ours#6"), R, O, PAIRS) == []
    assert find_pairs(parse_target("ref#5"), R, O, PAIRS) == []
    assert find_pairs(parse_target("ours#5"), R, O, PAIRS) != []


def digest_of(arr):
    return hashlib.sha256(np.asarray(arr, np.float32).tobytes()).hexdigest()


def dump_pair(tmp_path, ref_vals, ours_vals, ne=(4, 3, 1, 1), max_data=None, ours_ne=None, same_digest=False):
    """Two one-node dumps ('t', MUL_MAT) with the given values, read back from disk."""
    ne = list(ne)
    def one(folder, vals, shape):
        d = np.asarray(vals, np.float32)
        dig = digest_of(ref_vals) if same_digest else digest_of(d)
        n = Node(0, "t", "MUL_MAT", "f32", shape, digest=dig,
                 stats={"count": int(d.size), "sum": float(d.sum()), "sumsq": float((d.astype(np.float64) ** 2).sum()),
                        "min": float(d.min()), "max": float(d.max()), "nan": 0, "inf": 0})
        return load_dump(write_dump(tmp_path / folder, 0, "block", HEADER, [n], {0: d}, max_data=max_data))
    return one("ref", ref_vals, ne), one("ours", ours_vals, list(ours_ne or ne))


def test_probe_lists_errors_and_windows_both_sides_at_the_worst(tmp_path):
    """A pair with values: its largest errors, the count of differing elements, each side's stats
    and both sides' windows around the worst element."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = a.copy()
    b[2, 1] = 100.0   # worst: flat 9, [1, 2, 0, 0]
    b[0, 0] = 0.5     # flat 0
    ref, ours = dump_pair(tmp_path, a, b)
    p = probe(ref, ours, 0, 0, nmse=0.25, threshold=1e-7)
    assert (p["ref_index"], p["ours_index"], p["name"], p["op"], p["type"], p["ne"]) == (0, 0, "t", "MUL_MAT", "f32", [4, 3, 1, 1])
    assert p["nmse"] == 0.25 and p["threshold"] == 1e-7
    assert p["differing"] == 2
    assert [e["index"] for e in p["largest"]] == [9, 0]
    assert p["window"]["at"] == [1, 2, 0, 0]
    assert p["window"]["ref"]["values"] == a[0:3, 0:4].tolist()
    assert p["window"]["ours"]["values"] == b[0:3, 0:4].tolist()
    assert p["stats"]["ref"]["sum"] == float(a.sum())
    assert p["stats"]["ours"]["max"] == 100.0
    text = format_probe(p)
    assert text[0] == "node ref #0 / ours #0 't' MUL_MAT f32 [4, 3, 1, 1]"
    assert "  2 of 12 elements differ" in text
    assert any(line.split()[:2] == ["9", "[1,"] for line in text)
    starred = [line for line in text if "*" in line]
    assert len(starred) == 2 and all(line.split()[0] == "2" for line in starred)
    assert "100*" in starred[1].replace(" ", "")


def test_probe_nan_on_both_sides_is_not_a_difference(tmp_path):
    """NaN against NaN is not counted as differing; NaN against a number is."""
    a = np.array([[np.nan, 1.0, 2.0, np.nan]], dtype=np.float32)
    b = np.array([[np.nan, 1.0, 2.0, 3.0]], dtype=np.float32)
    ref, ours = dump_pair(tmp_path, a, b, ne=(4, 1, 1, 1))
    p = probe(ref, ours, 0, 0)
    assert p["differing"] == 1
    assert [e["index"] for e in p["largest"]] == [3]


def test_probe_equal_values_have_no_window(tmp_path):
    """Equal values: nothing differs, no errors, no window."""
    a = np.ones((3, 4), np.float32)
    ref, ours = dump_pair(tmp_path, a, a)
    p = probe(ref, ours, 0, 0)
    assert p["differing"] == 0 and p["largest"] == [] and "window" not in p
    assert "  0 of 12 elements differ" in format_probe(p)


def test_probe_without_partner(tmp_path):
    """A node with no partner says which side lacks it, and compares nothing."""
    a = np.ones((3, 4), np.float32)
    ref, ours = dump_pair(tmp_path, a, a)
    p = probe(ref, ours, None, 0)
    assert p["note"].startswith("no partner in ref") and "largest" not in p and "stats" not in p
    p = probe(ref, ours, 0, None)
    assert p["note"].startswith("no partner in ours")


def test_probe_values_not_kept_says_whether_digests_agree(tmp_path):
    """Values over --max-data: a note naming the side(s) and whether the bytes' digests agree."""
    a = np.ones((3, 4), np.float32)
    ref, ours = dump_pair(tmp_path / "same", a, a + 1, max_data=4, same_digest=True)
    p = probe(ref, ours, 0, 0)
    assert p["note"].startswith("values not kept in ref and ours (12 elements")
    assert p["note"].endswith("the bytes' digests are equal")
    assert p["stats"]["ours"]["sum"] == 24.0   # the recorded statistics
    ref, ours = dump_pair(tmp_path / "differ", a, a + 1, max_data=4)
    assert probe(ref, ours, 0, 0)["note"].endswith("the bytes' digests differ")


def test_probe_shapes_differ(tmp_path):
    """Different shapes: values cannot line up."""
    a = np.arange(12, dtype=np.float32)
    ref, ours = dump_pair(tmp_path, a, a, ne=(4, 3, 1, 1), ours_ne=(3, 4, 1, 1))
    p = probe(ref, ours, 0, 0)
    assert p["note"] == "shapes differ (ref [4, 3, 1, 1], ours [3, 4, 1, 1]): values cannot line up"
    assert "largest" not in p
