"""Where in a node two dumps disagree: its largest errors, both sides around the worst of them,
and each side's statistics (`graphgen diff --at NODE`), and the worst element every value
comparison records.

Coordinates are given in ggml's order, [i0, i1, i2, i3] with i0 the fastest, as a llama.cpp
developer reads `ne`; a flat index counts elements in memory order (i0 + ne0 * (i1 + ...)).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphgen.dump.format import Dump, Node

TOP = 5            # largest errors listed per node
WINDOW = (4, 2)    # elements shown either side of the worst one along i0 and i1


class ProbeError(ValueError):
    """--at names no node of either dump."""


def coord(flat: int, ne: list[int]) -> list[int]:
    """ggml coordinates [i0, i1, i2, i3] of a flat index into a tensor of shape ne."""
    out = []
    for n in list(ne) + [1] * (4 - len(ne)):
        out.append(int(flat % n))
        flat //= n
    return out


def largest_errors(a: np.ndarray, b: np.ndarray, ne: list[int], k: int = TOP) -> list[dict[str, Any]]:
    """The k elements where b (ours) is furthest from a (ref), largest first; an element where the
    two disagree on NaN or Inf ranks above any finite error. Elements that agree are left out."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - b)
    same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & np.isinf(b) & (a == b))
    err[same_special] = 0.0
    err[np.isnan(err)] = np.inf  # NaN on one side only
    nz = np.flatnonzero(err > 0)
    if not nz.size:
        return []
    top = nz[np.argsort(-err[nz], kind="stable")[:k]]
    return [{"index": int(f), "coord": coord(int(f), ne), "ref": float(a[f]), "ours": float(b[f]),
             "abs": float(err[f])} for f in top]


def stats_of(v: np.ndarray | None, node: Node) -> dict[str, Any] | None:
    """count, sum, sumsq, min, max, nan and inf of a side: from its values when kept, else what
    the dump recorded for the node."""
    if v is None:
        return dict(node.stats) if node.stats else None
    x = np.asarray(v, dtype=np.float64).ravel()
    fin = x[np.isfinite(x)]
    return {"count": int(x.size), "sum": float(fin.sum()), "sumsq": float(np.dot(fin, fin)),
            "min": float(fin.min()) if fin.size else None, "max": float(fin.max()) if fin.size else None,
            "nan": int(np.isnan(x).sum()), "inf": int(np.isinf(x).sum())}


def window(v: np.ndarray, ne: list[int], at: list[int]) -> dict[str, Any]:
    """The rows i1 +- WINDOW[1] and columns i0 +- WINDOW[0] of v at the (i2, i3) of `at`."""
    ne4 = list(ne) + [1] * (4 - len(ne))
    grid = np.asarray(v).reshape(ne4[3], ne4[2], ne4[1], ne4[0])[at[3], at[2]]
    c0, c1 = max(0, at[0] - WINDOW[0]), min(ne4[0], at[0] + WINDOW[0] + 1)
    r0, r1 = max(0, at[1] - WINDOW[1]), min(ne4[1], at[1] + WINDOW[1] + 1)
    return {"i0": [c0, c1], "i1": [r0, r1], "values": grid[r0:r1, c0:c1].astype(np.float64).tolist()}


@dataclass
class Target:
    """What --at asked for: a node index on one side, or a name."""
    side: str | None  # "ref", "ours", or None for a name
    index: int | None
    name: str | None
    text: str = ""    # as the user wrote it

    def __str__(self) -> str:
        if self.name is not None:
            return repr(self.name)
        return f"{self.side} #{self.index}"


def parse_target(text: str) -> Target:
    """NODE as --at takes it: `12` or `#12` (ref's index), `ours#12`, `ref#12`, or a node name."""
    m = re.fullmatch(r"(?:(ref|ours)\s*)?#?(\d+)", text.strip())
    if m:
        return Target(m.group(1) or "ref", int(m.group(2)), None, text)
    if not text.strip():
        raise ProbeError("--at: empty node name")
    return Target(None, None, text, text)


def find_pairs(target: Target, R: list[Node], O: list[Node], pairs: dict[int, int]) -> list[tuple[int | None, int | None]]:
    """(ref index, ours index) of each node the target names; None where the node has no
    partner on that side."""
    back = {j: i for i, j in pairs.items()}
    if target.name is not None:
        hits = [(n.index, pairs.get(n.index)) for n in R if n.name == target.name]
        seen = {j for _, j in hits}
        hits += [(None, n.index) for n in O if n.name == target.name and n.index not in seen]
        return hits
    if target.side == "ref":
        return [(target.index, pairs.get(target.index))] if target.index < len(R) else []
    return [(back.get(target.index), target.index)] if target.index < len(O) else []


def probe(ref: Dump, ours: Dump, i: int | None, j: int | None, nmse: float | None = None,
          threshold: float | None = None) -> dict[str, Any]:
    """Everything --at prints for one node pair."""
    r = ref.nodes[i] if i is not None else None
    o = ours.nodes[j] if j is not None else None
    node = r or o
    out: dict[str, Any] = {"ref_index": i, "ours_index": j, "name": node.name, "op": node.op,
                           "type": node.type, "ne": list(node.ne), "nmse": nmse, "threshold": threshold}
    if r is None or o is None:
        out["note"] = f"no partner in {'ref' if r is None else 'ours'}: values cannot be compared"
        return out
    a, b = ref.values(i), ours.values(j)
    out["stats"] = {"ref": stats_of(a, r), "ours": stats_of(b, o)}
    if a is None or b is None:
        missing = " and ".join(s for s, v in (("ref", a), ("ours", b)) if v is None)
        same = r.digest is not None and r.digest == o.digest
        out["note"] = (f"values not kept in {missing} ({node.nelements} elements; raise --max-data to keep them)"
                       + ("; the bytes' digests are equal" if same else
                          "; the bytes' digests differ" if r.digest and o.digest else ""))
        return out
    if r.ne != o.ne:
        out["note"] = f"shapes differ (ref {r.ne}, ours {o.ne}): values cannot line up"
        return out
    errs = largest_errors(a, b, r.ne)
    out["largest"] = errs
    fa, fb = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    with np.errstate(invalid="ignore"):
        out["differing"] = int(np.sum(~((fa == fb) | (np.isnan(fa) & np.isnan(fb)))))
    if errs:
        at = errs[0]["coord"]
        out["window"] = {"at": at, "ref": window(a, r.ne, at), "ours": window(b, r.ne, at)}
    return out


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.6g}"


def format_probe(p: dict[str, Any]) -> list[str]:
    """The text --at prints for one node."""
    head = f"node ref #{p['ref_index'] if p['ref_index'] is not None else '-'} / ours #" \
           f"{p['ours_index'] if p['ours_index'] is not None else '-'} '{p['name']}' {p['op']} {p['type']} {p['ne']}"
    out = [head]
    if p.get("nmse") is not None:
        out.append(f"  nmse {_num(p['nmse'])}" + (f" (threshold {p['threshold']:g})" if p.get("threshold") is not None else ""))
    for side in ("ref", "ours"):
        s = (p.get("stats") or {}).get(side)
        if s:
            out.append(f"  {side:4s} stats: " + ", ".join(f"{k} {_num(s.get(k))}" for k in
                                                        ("count", "sum", "sumsq", "min", "max", "nan", "inf")))
    if "note" in p:
        out.append(f"  {p['note']}")
        return out
    n = 1
    for d in p["ne"]:
        n *= d
    out.append(f"  {p['differing']} of {n} elements differ")
    if p["largest"]:
        out.append("  largest errors (flat index, [i0, i1, i2, i3], ref, ours, |ours - ref|):")
        for e in p["largest"]:
            out.append(f"    {e['index']:>9}  {str(e['coord']):<20} {_num(e['ref']):>13} {_num(e['ours']):>13} "
                       f"{_num(e['abs']):>11}")
        w = p["window"]
        at = w["at"]
        for side in ("ref", "ours"):
            win = w[side]
            (c0, c1), (r0, r1) = win["i0"], win["i1"]
            out.append(f"  {side} around {at} (i0 {c0}..{c1 - 1} across, i1 {r0}..{r1 - 1} down, "
                       f"i2 {at[2]}, i3 {at[3]}):")
            for k, row in enumerate(win["values"]):
                cells = []
                for c, v in enumerate(row):
                    mark = "*" if (r0 + k, c0 + c) == (at[1], at[0]) else " "
                    cells.append(f"{_num(v):>12}{mark}")
                out.append(f"    {r0 + k:>5} " + "".join(cells))
    return out
