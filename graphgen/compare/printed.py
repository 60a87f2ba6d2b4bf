"""Values compared from what an eval-callback text prints.

llama.cpp's eval callback (common/debug.cpp, used by llama-eval-callback and llama-debug) prints
for each node of a non-quantized type the first and last 3 elements of each dimension with
`%12.4f` and the float32 sum of all elements (`sum += v` in index order) with `%f`. That is enough
to check a run by value as far as it goes: an element agrees when it is within half a unit of its
last printed digit (plus a little float32 rounding), the sum when it is within half a unit of its
last digit plus what float32 summation in another order, or of values a few ulps apart, can move
it. The other side is a full dump (values, or only statistics for a node over --max-data) or
another import (printed against printed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from graphgen.dump.format import Dump

EPS32 = 2.0 ** -23   # float32 machine epsilon
ELEMENT_ULPS = 2     # float32 ulps an element may differ by on top of the print precision (other kernels)


@dataclass
class Printed:
    """One node's printed values."""
    at: np.ndarray          # flat indices, numpy order
    values: np.ndarray      # float64
    half: np.ndarray        # half a unit of each element's last printed digit
    sum: float | None
    sum_half: float | None


@dataclass
class Side:
    """What one side knows of a node's values: printed ones, all of them, or statistics."""
    printed: Printed | None = None
    values: np.ndarray | None = None
    stats: dict | None = None
    missing: str = ""       # why this side has nothing, for the report


@dataclass
class Outcome:
    elements: int = 0       # printed elements compared
    sum_checked: bool = False
    failures: list[str] = field(default_factory=list)
    nmse: float = 0.0
    max_abs: float = 0.0
    tolerance: float = 0.0  # the largest element tolerance used
    not_compared: str | None = None  # why nothing could be compared


def _half_unit(text: str) -> float:
    # "%12.4f" -> 4 decimals -> 5e-05; a value printed without a point is an integer
    t = text.strip()
    if "." not in t or not t[-1].isdigit():
        return 0.5
    return 0.5 * 10.0 ** -(len(t) - t.index(".") - 1)


def parse_printed(entry: dict | None) -> Printed | str | None:
    """The Printed of a `source.import.printed` entry; a reason when it could not be read."""
    if entry is None:
        return None
    if "unreadable" in entry:
        return str(entry["unreadable"])
    texts = list(entry.get("values") or [])
    s = entry.get("sum")
    return Printed(np.asarray(entry.get("at") or [], dtype=np.int64), np.array([float(t) for t in texts], dtype=np.float64),
                   np.array([_half_unit(t) for t in texts], dtype=np.float64),
                   float(s) if s is not None else None, _half_unit(s) if s is not None else None)


def side_of(d: Dump, index: int) -> Side:
    """What dump `d` knows of node `index`'s values."""
    imp = (d.source or {}).get("import")
    node = d.nodes[index]
    if isinstance(imp, dict):
        entry = (imp.get("printed") or {}).get(str(index))
        p = parse_printed(entry)
        if isinstance(p, Printed):
            return Side(printed=p)
        if isinstance(p, str):
            return Side(missing=f"its printed values cannot be read ({p})")
        if _quantized(node.type):
            return Side(missing=f"the callback prints no values of a quantized type ({node.type})")
        return Side(missing="no values printed")
    vals = d.values(index)
    if vals is not None:
        return Side(values=np.asarray(vals, dtype=np.float32))
    if node.stats and node.stats.get("count"):
        return Side(stats=dict(node.stats))
    return Side(missing="the dump keeps neither its values nor their statistics")


def _quantized(typ: str) -> bool:
    return typ not in ("f32", "f16", "bf16", "f64", "i8", "i16", "i32", "i64")


def _agree(a: float, b: float, tol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol


def _coord(flat: int, ne: list[int]) -> str:
    i0 = flat % ne[0]
    i1 = flat // ne[0] % ne[1]
    i2 = flat // (ne[0] * ne[1]) % ne[2]
    i3 = flat // (ne[0] * ne[1] * ne[2])
    return f"[{i0}, {i1}, {i2}, {i3}]"


def _seq_sum(v: np.ndarray) -> tuple[float, float]:
    """The callback's float32 sum (in index order) and the sum of |partial sums|, which bounds
    how far float32 rounding can move it."""
    flat = v.astype(np.float32).ravel()
    if flat.size == 0:
        return 0.0, 0.0
    partial = np.cumsum(flat, dtype=np.float32)
    fin = partial[np.isfinite(partial)]
    return float(partial[-1]), float(np.abs(fin.astype(np.float64)).sum())


def compare_node(ref: Side, ours: Side, ne: list[int]) -> Outcome:
    """Compare one node's values as far as the printed ones go (ref is `a` in the NMSE)."""
    out = Outcome()
    if ref.printed is None and ours.printed is None:
        out.not_compared = "; ".join(f"{name}: {side.missing}" for side, name in ((ref, "ref"), (ours, "ours"))
                                     if side.missing) or "neither side printed values"
        return out
    for side, name in ((ref, "ref"), (ours, "ours")):
        if side.printed is None and side.values is None and side.stats is None:
            out.not_compared = f"{name}: {side.missing}"
            return out
    a_list, b_list = [], []
    fails = []
    # elements: printed positions against the other side's printed or full values
    if ref.printed is not None and ours.printed is not None:
        pos_o = {int(k): i for i, k in enumerate(ours.printed.at)}
        pairs = [(int(k), ref.printed.values[i], ours.printed.values[pos_o[int(k)]],
                  ref.printed.half[i] + ours.printed.half[pos_o[int(k)]])
                 for i, k in enumerate(ref.printed.at) if int(k) in pos_o]
    else:
        p, full, p_is_ref = (ref.printed, ours, True) if ref.printed is not None else (ours.printed, ref, False)
        pairs = []
        if full.values is not None:
            flat = full.values.ravel()
            for i, k in enumerate(p.at):
                x = float(flat[int(k)])
                pr = float(p.values[i])
                pairs.append((int(k), pr, x, p.half[i]) if p_is_ref else (int(k), x, pr, p.half[i]))
    for k, a, b, half in pairs:
        tol = half + ELEMENT_ULPS * EPS32 * max(abs(a), abs(b)) if math.isfinite(a) and math.isfinite(b) else half
        out.tolerance = max(out.tolerance, tol)
        out.elements += 1
        if not _agree(a, b, tol):
            fails.append((k, a, b, tol))
        elif math.isfinite(a) and math.isfinite(b):
            a_list.append(a)
            b_list.append(b)
    if fails:
        k, a, b, tol = max(fails, key=lambda f: abs(f[1] - f[2]) if math.isfinite(f[1] - f[2]) else math.inf)
        out.failures.append(f"printed elements differ beyond the print precision at {len(fails)} of "
                            f"{out.elements} positions, most at {_coord(k, ne)} (flat {k}): ref {a:.6g}, "
                            f"ours {b:.6g} (allowed {tol:.2g})")
        for _, a, b, _ in fails:
            if math.isfinite(a) and math.isfinite(b):
                a_list.append(a)
                b_list.append(b)
    if a_list:
        a_arr, b_arr = np.array(a_list), np.array(b_list)
        d = a_arr - b_arr
        ref_sq = float(np.dot(a_arr, a_arr))
        out.nmse = float(np.dot(d, d)) / ref_sq if ref_sq > 0 else float(np.dot(d, d))
        out.max_abs = float(np.abs(d).max())
    elif fails:
        out.nmse = out.max_abs = math.inf
    # the sum
    s = _sum_check(ref, ours)
    if s is not None:
        out.sum_checked = True
        a, b, tol = s
        if not _agree(a, b, tol):
            out.failures.append(f"printed sum differs: ref {a:.6f}, ours {b:.6f} (allowed {tol:.2g})")
    if out.elements == 0 and not out.sum_checked:
        out.not_compared = ("the printed values fall on no position the other side keeps"
                            if ref.printed is not None and ours.printed is not None else
                            "the other side keeps only statistics (values over --max-data), and they cannot "
                            "give the printed sum (an infinity of unknown sign)")
    return out


def _sum_check(ref: Side, ours: Side) -> tuple[float, float, float] | None:
    """(ref sum, ours sum, tolerance), or None when the sum cannot be compared."""
    if ref.printed is not None and ours.printed is not None:
        a, b = ref.printed.sum, ours.printed.sum
        if a is None or b is None:
            return None
        tol = ref.printed.sum_half + ours.printed.sum_half
        return a, b, tol + ELEMENT_ULPS * EPS32 * max(abs(a), abs(b)) if math.isfinite(a + b) else tol
    p, full, p_is_ref = (ref.printed, ours, True) if ref.printed is not None else (ours.printed, ref, False)
    if p.sum is None:
        return None
    if full.values is not None:
        x, partials = _seq_sum(full.values)
        absum = float(np.abs(full.values[np.isfinite(full.values)].astype(np.float64)).sum())
        # each side's float32 rounding is at most eps/2 of every partial sum; the values themselves
        # may be ELEMENT_ULPS apart
        tol = p.sum_half + EPS32 * (partials + ELEMENT_ULPS * absum)
    else:
        st = full.stats or {}
        if st.get("sum") is None:
            return None
        n = int(st.get("count") or 0)
        if st.get("nan"):
            x = math.nan
        elif st.get("inf"):
            return None  # the statistics do not say the infinities' signs
        else:
            x = float(st["sum"])
        # no partial sums to bound the rounding by: sum |v| <= sqrt(n * sumsq), each of n partials
        # at most that
        absum = math.sqrt(n * float(st.get("sumsq") or 0.0))
        tol = p.sum_half + EPS32 * (n + ELEMENT_ULPS) * absum
    return (p.sum, x, tol) if p_is_ref else (x, p.sum, tol)
