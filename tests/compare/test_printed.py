"""graphgen.compare.printed: an eval-callback import's printed values against the other side's."""

import math

import numpy as np
import pytest

from graphgen.dump.format import Node, load_dump, write_dump
from graphgen.compare.importers import printed_positions
from graphgen.compare.printed import Printed, Side, compare_node, parse_printed, side_of

EPS = 2.0 ** -23     # float32 epsilon
ULPS = 2             # float32 ulps an element may differ by, on top of the printed digits

HEADER = {
    "source": {"engine": "llama.cpp", "version": "b6000"},
    "model": "m.gguf",
    "settings": {"flash_attn": False, "type_k": "f16", "type_v": "f16", "n_ctx": 64,
                 "n_ubatch": 4, "n_kv": 4, "causal": False},
    "cpu_features": {},
}


def printed(at, texts, total=None):
    entry = {"at": list(at), "values": list(texts)}
    if total is not None:
        entry["sum"] = total
    p = parse_printed(entry)
    assert isinstance(p, Printed)
    return Side(printed=p)


def full(values, shape=None):
    v = np.asarray(values, dtype=np.float32)
    return Side(values=v.reshape(shape) if shape else v)


def f32_after(x, steps):
    """float32 `steps` ulps above x."""
    v = np.float32(x)
    for _ in range(steps):
        v = np.nextafter(v, np.float32(np.inf))
    return v


# ---- reading what was printed ------------------------------------------------------------------

def test_parse_printed_values_and_half_units():
    """Each printed text gives its value and half a unit of its last digit; a text without a point
    (an integer, nan, inf) half of one; positions are ints and the sum is read the same way."""
    p = parse_printed({"at": [0, 7, 9, 11, 12, 13], "values": ["1.0000", " -12.5000", "3", "0.50", "nan", "-inf"],
                       "sum": "21.000000"})
    assert p.at.tolist() == [0, 7, 9, 11, 12, 13] and p.at.dtype.kind == "i"
    assert p.values[:4].tolist() == [1.0, -12.5, 3.0, 0.5]
    assert math.isnan(p.values[4]) and p.values[5] == -math.inf
    assert p.half.tolist() == pytest.approx([5e-5, 5e-5, 0.5, 5e-3, 0.5, 0.5], rel=1e-12)
    assert p.sum == 21.0 and p.sum_half == pytest.approx(5e-7, rel=1e-12)


def test_parse_printed_without_sum_or_entry():
    """No sum: None for it; no entry: None; an unreadable entry: its reason."""
    p = parse_printed({"at": [3], "values": ["2.5000"]})
    assert p.sum is None and p.sum_half is None
    assert parse_printed(None) is None
    assert parse_printed({"unreadable": "rows do not fit ne"}) == "rows do not fit ne"
    empty = parse_printed({"sum": "0.000000"})
    assert empty.at.size == 0 and empty.values.size == 0 and empty.sum == 0.0


@pytest.mark.parametrize("ne, edge", [([8, 1, 1, 1], 3), ([2, 8, 5, 2], 3), ([7, 9, 1, 3], 3),
                                      ([3, 2, 4, 1], None), ([1, 1, 1, 1], 3), ([6, 4, 9, 1], 2)])
def test_printed_positions_are_the_flat_indices_printed(ne, edge):
    """The callback's positions, in print order (i3, i2, i1, i0), as flat numpy indices: of each of
    ne2, ne1, ne0 the first and last `edge` when longer than 2*edge, every ne3 slice."""
    def shown(n):
        return list(range(n)) if edge is None or n <= 2 * edge else list(range(edge)) + list(range(n - edge, n))
    grid = np.arange(int(np.prod(ne))).reshape(ne[3], ne[2], ne[1], ne[0])
    want = grid[:, shown(ne[2])][:, :, shown(ne[1])][:, :, :, shown(ne[0])].ravel().tolist()
    assert printed_positions(ne, edge) == want


# ---- what each side knows ----------------------------------------------------------------------

def node(i, typ="f32", ne=(3, 2, 1, 1), values=None):
    v = None if values is None else np.asarray(values, np.float32)
    stats = None
    if v is not None:
        stats = {"count": int(v.size), "sum": float(v.sum()), "sumsq": float(np.dot(v.ravel(), v.ravel())),
                 "min": float(v.min()), "max": float(v.max()), "nan": 0, "inf": 0}
    return Node(i, f"n{i}", "ADD", typ, list(ne), digest="0" * 64 if v is not None else None, stats=stats)


def test_side_of_an_import(tmp_path):
    """An import's node: its printed values, else why there are none (unreadable, a quantized type,
    nothing printed)."""
    header = dict(HEADER, source={"engine": "llama.cpp", "version": "b6000", "import": {"printed": {
        "0": {"at": [0, 5], "values": ["1.5000", "2.0000"], "sum": "3.500000"},
        "1": {"unreadable": "a row too long"}}}})
    nodes = [node(0), node(1), node(2, typ="q8_0"), node(3), node(4, typ="f16")]
    d = load_dump(write_dump(tmp_path, 0, "block", header, nodes))
    s = side_of(d, 0)
    assert s.printed.at.tolist() == [0, 5] and s.printed.values.tolist() == [1.5, 2.0] and s.printed.sum == 3.5
    assert s.values is None and s.stats is None
    assert side_of(d, 1).printed is None
    assert side_of(d, 1).missing == "its printed values cannot be read (a row too long)"
    assert side_of(d, 2).missing == "the callback prints no values of a quantized type (q8_0)"
    assert side_of(d, 3).missing == "no values printed"
    assert side_of(d, 4).missing == "no values printed"


def test_side_of_a_full_dump(tmp_path):
    """A full dump's node: its values as float32 when kept, else its statistics when recorded
    (and counting something), else why there is nothing."""
    big = np.arange(6, dtype=np.float64).reshape(1, 1, 2, 3) * 0.5
    empty = Node(3, "n3", "ADD", "f32", [0, 1, 1, 1], digest="0" * 64,
                 stats={"count": 0, "sum": 0.0, "sumsq": 0.0, "min": None, "max": None, "nan": 0, "inf": 0})
    nodes = [node(0, values=big), node(1, ne=(2, 1, 1, 1), values=[1.0, 2.0]), node(2), empty]
    d = load_dump(write_dump(tmp_path, 0, "block", HEADER, nodes, {0: big, 1: np.array([1.0, 2.0])}, max_data=4))
    s0 = side_of(d, 0)
    assert s0.values is None and s0.printed is None
    assert s0.stats == {"count": 6, "sum": 7.5, "sumsq": 13.75, "min": 0.0, "max": 2.5, "nan": 0, "inf": 0}
    s1 = side_of(d, 1)
    assert s1.values.dtype == np.float32 and s1.values.ravel().tolist() == [1.0, 2.0]
    assert side_of(d, 2).missing == "the dump keeps neither its values nor their statistics"
    assert side_of(d, 3).stats is None
    assert side_of(d, 3).missing == "the dump keeps neither its values nor their statistics"


# ---- elements ----------------------------------------------------------------------------------

@pytest.mark.parametrize("steps, ok", [(0, True), (4, True), (5, False)])
def test_an_element_may_differ_by_half_a_digit_plus_two_ulps(steps, ok):
    """Printed `1000.0000` against 1000 + steps float32 ulps: allowed 5e-5 + 2 ulps of the larger
    (4 ulps of 6.1e-5 pass, 5 do not), at the flat index printed."""
    x = f32_after(1000.0, steps)
    vals = np.full(6, -7.0, np.float32)
    vals[5] = x
    out = compare_node(printed([5], ["1000.0000"]), full(vals, (1, 1, 2, 3)), [3, 2, 1, 1])
    assert out.elements == 1
    assert out.tolerance == pytest.approx(5e-5 + ULPS * EPS * float(x), rel=1e-9)
    assert (out.failures == []) is ok
    assert out.max_abs == pytest.approx(float(x) - 1000.0, abs=1e-12)


def test_elements_read_from_the_printed_positions():
    """Each printed value is compared with the other side's element at its flat index."""
    vals = np.arange(12, dtype=np.float32)
    out = compare_node(printed([0, 7, 11], ["0.0000", "7.0000", "11.0000"]), full(vals, (1, 1, 3, 4)),
                       [4, 3, 1, 1])
    assert out.elements == 3 and out.failures == [] and out.max_abs == 0.0
    out = compare_node(printed([0, 7, 11], ["0.0000", "11.0000", "7.0000"]), full(vals, (1, 1, 3, 4)),
                       [4, 3, 1, 1])
    assert len(out.failures) == 1 and "at 2 of 3 positions" in out.failures[0]


def test_the_failure_names_the_worst_position_in_ggml_coordinates():
    """Of the positions beyond tolerance the one furthest apart is named: ggml coordinates, flat
    index, both values; NMSE (over ref) and max |diff| count every finite pair."""
    ne = [3, 2, 2, 1]
    ref_vals = np.arange(12, dtype=np.float32) + 1
    at = [1, 4, 10]
    ours_txt = [f"{ref_vals[1]:.4f}", f"{ref_vals[4] + 1:.4f}", f"{ref_vals[10] - 5:.4f}"]
    out = compare_node(full(ref_vals, (1, 2, 2, 3)), printed(at, ours_txt), ne)
    c = [int(x) for x in reversed(np.unravel_index(10, (1, 2, 2, 3)))]
    assert c == [1, 1, 1, 0]
    assert len(out.failures) == 1
    assert out.failures[0].startswith(f"printed elements differ beyond the print precision at 2 of 3 positions, "
                                      f"most at [{c[0]}, {c[1]}, {c[2]}, {c[3]}] (flat 10): ref 11, ours 6 ")
    a = ref_vals[at].astype(np.float64)
    b = np.array([float(t) for t in ours_txt])
    assert out.nmse == pytest.approx(np.sum((a - b) ** 2) / np.sum(a * a), rel=1e-12)
    assert out.max_abs == 5.0


def test_nmse_is_relative_to_the_ref_side():
    """ref full, ours printed: NMSE divides by ref's values, not ours'."""
    ref_x = np.float32(2.04)
    out = compare_node(full([ref_x, 0.0]), printed([0], ["2.0"]), [2, 1, 1, 1])
    assert out.failures == []
    d = float(ref_x) - 2.0
    assert out.nmse == pytest.approx(d * d / float(ref_x) ** 2, rel=1e-9)
    out = compare_node(printed([0], ["2.0"]), full([ref_x, 0.0]), [2, 1, 1, 1])
    assert out.nmse == pytest.approx(d * d / 4.0, rel=1e-9)


@pytest.mark.parametrize("text, x, ok", [("nan", np.nan, True), ("inf", np.inf, True), ("-inf", -np.inf, True),
                                         ("-inf", np.inf, False), ("inf", -np.inf, False), ("nan", 1.0, False),
                                         ("1.0000", np.nan, False), ("1.0000", np.inf, False),
                                         ("inf", 3.4e38, False)])
def test_nan_and_infinities_agree_only_with_themselves(text, x, ok):
    """NaN agrees with NaN, an infinity with the same infinity, nothing else with either."""
    out = compare_node(printed([0], [text]), full([x]), [1, 1, 1, 1])
    assert out.elements == 1
    assert (out.failures == []) is ok


def test_only_non_finite_failures_make_nmse_infinite():
    """When every differing pair is non-finite and no finite pair was compared, NMSE and max are infinite;
    a finite pair alongside gives them its own values."""
    out = compare_node(printed([0], ["nan"]), full([1.0, 2.0]), [2, 1, 1, 1])
    assert out.nmse == math.inf and out.max_abs == math.inf
    out = compare_node(printed([0, 1], ["nan", "2.5000"]), full([1.0, 2.0]), [2, 1, 1, 1])
    assert out.max_abs == pytest.approx(0.5) and out.nmse == pytest.approx(0.25 / 6.25)


@pytest.mark.parametrize("ours, ok", [("1.001", True), ("0.999", True), ("1.002", False)])
def test_printed_against_printed_allows_both_sides_half_digits(ours, ok):
    """Printed against printed: an element may differ by both half digits (5e-4 + 5e-4) plus ulps."""
    out = compare_node(printed([2], ["1.000"]), printed([2], [ours]), [4, 1, 1, 1])
    assert out.elements == 1
    assert (out.failures == []) is ok
    assert out.tolerance == pytest.approx(1e-3 + ULPS * EPS * max(1.0, float(ours)), rel=1e-9)


def test_printed_against_printed_compares_shared_positions_only():
    """Only positions both sides printed are compared; none shared and no sums: nothing compared."""
    out = compare_node(printed([0, 1, 5], ["1.0", "2.0", "3.0"]), printed([5, 1, 9], ["3.0", "9.0", "4.0"]),
                       [10, 1, 1, 1])
    assert out.elements == 2 and len(out.failures) == 1
    assert "at 1 of 2 positions" in out.failures[0] and "(flat 1)" in out.failures[0]
    out = compare_node(printed([0], ["1.0"]), printed([1], ["1.0"]), [2, 1, 1, 1])
    assert out.elements == 0 and not out.sum_checked
    assert out.not_compared == "the printed values fall on no position the other side keeps"


def test_one_element_tensor():
    """A one-element tensor compares its one value and its sum."""
    out = compare_node(printed([0], ["-3.2500"], "-3.250000"), full([[[[-3.25]]]]), [1, 1, 1, 1])
    assert out.elements == 1 and out.sum_checked and out.failures == [] and out.not_compared is None


# ---- sums --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, ok", [("21.000000", True), ("21.000010", True), ("20.999990", True),
                                      ("21.000013", False), ("20.999987", False)])
def test_sum_against_full_values_within_float32_summation_error(text, ok):
    """Against 1..6: allowed half a digit (5e-7) plus eps * (sum of |partial sums| 1+3+6+10+15+21 = 56
    + 2 ulps of each of the values' sum 21), 1.218e-5."""
    vals = np.arange(1, 7, dtype=np.float32).reshape(1, 1, 2, 3)
    out = compare_node(printed([], [], text), full(vals), [3, 2, 1, 1])
    assert out.sum_checked and out.elements == 0
    assert (out.failures == []) is ok, out.failures
    tol = 5e-7 + EPS * (56 + ULPS * 21)
    assert (abs(float(text) - 21.0) <= tol) is ok


def test_sum_is_the_float32_sum_in_index_order():
    """The other side's sum is float32 accumulated in index order (here 1, not the exact 2)."""
    vals = np.array([1e8, 1.0, -1e8, 1.0], dtype=np.float32)
    acc = np.float32(0)
    for v in vals:
        acc = np.float32(acc + v)
    assert float(acc) == 1.0
    out = compare_node(printed([], [], "100.000000"), full(vals), [4, 1, 1, 1])
    assert out.failures == [f"printed sum differs: ref 100.000000, ours {float(acc):.6f} (allowed "
                            f"{5e-7 + EPS * ((1e8 + 1e8 + 0 + 1) + ULPS * (2e8 + 2)):.2g})"]
    out = compare_node(full(vals), printed([], [], "100.000000"), [4, 1, 1, 1])
    assert out.failures[0].startswith(f"printed sum differs: ref {float(acc):.6f}, ours 100.000000")


def test_sum_with_nan_values():
    """A NaN among the values makes the sum NaN: a printed nan agrees, a number does not."""
    vals = np.array([1.0, np.nan, 2.0], dtype=np.float32)
    assert compare_node(printed([], [], "nan"), full(vals), [3, 1, 1, 1]).failures == []
    assert len(compare_node(printed([], [], "3.000000"), full(vals), [3, 1, 1, 1]).failures) == 1


@pytest.mark.parametrize("ours, ok", [("1000.000230", True), ("1000.000250", False)])
def test_printed_sums_allow_both_half_digits_and_two_ulps(ours, ok):
    """Printed sum against printed sum: 5e-7 + 5e-7 + 2 ulps of the larger (2.38e-4 at 1000)."""
    out = compare_node(printed([], [], "1000.000000"), printed([], [], ours), [1, 1, 1, 1])
    assert out.sum_checked
    assert (out.failures == []) is ok
    assert (abs(float(ours) - 1000.0) <= 1e-6 + ULPS * EPS * float(ours)) is ok


def test_sum_not_checked_without_both_sums():
    """A side that printed no sum leaves the sum unchecked."""
    out = compare_node(printed([0], ["1.0"]), printed([0], ["1.0"], "5.000000"), [1, 1, 1, 1])
    assert not out.sum_checked and out.failures == []
    out = compare_node(printed([0], ["1.0"]), full([9.0]), [1, 1, 1, 1])
    assert not out.sum_checked and len(out.failures) == 1


def stats_side(values, **over):
    v = np.asarray(values, np.float64)
    st = {"count": v.size, "sum": float(v.sum()), "sumsq": float(np.dot(v, v)), "min": float(v.min()),
          "max": float(v.max()), "nan": 0, "inf": 0}
    st.update(over)
    return Side(stats=st)


def test_sum_against_statistics():
    """Against statistics only: the recorded sum, allowed half a digit + eps * (n + 2) * sqrt(n * sumsq);
    no element is compared."""
    vals = [3.0, 4.0, 5.0, 6.0]                    # n 4, sumsq 86
    tol = 5e-7 + EPS * (4 + ULPS) * math.sqrt(4 * 86.0)
    inside, outside = 18.0 + 0.9 * tol, 18.0 + 1.2 * tol
    out = compare_node(printed([0], ["3.0000"], f"{inside:.6f}"), stats_side(vals), [4, 1, 1, 1])
    assert out.sum_checked and out.elements == 0 and out.failures == [] and out.not_compared is None
    out = compare_node(stats_side(vals), printed([0], ["3.0000"], f"{outside:.6f}"), [4, 1, 1, 1])
    assert len(out.failures) == 1 and out.failures[0].startswith("printed sum differs: ref 18.000000, ours")


def test_statistics_with_nan_or_infinities():
    """Statistics with a NaN give a NaN sum (a printed nan agrees); with infinities of unknown sign
    the sum cannot be compared, and then nothing is."""
    assert compare_node(printed([], [], "nan"), stats_side([1.0], nan=1), [1, 1, 1, 1]).failures == []
    assert compare_node(printed([], [], "1.000000"), stats_side([1.0], nan=1), [1, 1, 1, 1]).failures != []
    out = compare_node(printed([], [], "inf"), stats_side([1.0], inf=1), [1, 1, 1, 1])
    assert not out.sum_checked and out.failures == []
    assert out.not_compared.startswith("the other side keeps only statistics")


# ---- nothing to compare ------------------------------------------------------------------------

def test_neither_side_printed():
    """Without printed values on either side nothing is compared; the reasons are joined."""
    out = compare_node(Side(missing="no values printed"), Side(missing="the dump keeps neither"), [1, 1, 1, 1])
    assert out.not_compared == "ref: no values printed; ours: the dump keeps neither"
    assert compare_node(Side(), Side(values=np.ones(1)), [1, 1, 1, 1]).not_compared == "neither side printed values"


def test_a_side_with_nothing_against_printed():
    """Printed values against a side that knows nothing: nothing compared, that side's reason given."""
    out = compare_node(printed([0], ["1.0"], "1.0"), Side(missing="no values kept"), [1, 1, 1, 1])
    assert out.not_compared == "ours: no values kept" and out.elements == 0 and not out.sum_checked
    out = compare_node(Side(missing="gone"), printed([0], ["1.0"]), [1, 1, 1, 1])
    assert out.not_compared == "ref: gone"
