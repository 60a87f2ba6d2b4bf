"""A DiffResult as per-node statuses, for the viewers.

Statuses: matched, changed (structure), value (NMSE or NaN/Inf failure), missing (in ref, not in
ours), extra (in ours only), explained (covered by an equivalence rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from graphgen.diff import DiffResult
from graphgen.dump import Dump

STATUSES = ("matched", "changed", "value", "missing", "extra", "explained")
STATUS_COLOURS = {"matched": "#c8e6c9", "changed": "#ffcc80", "value": "#f48fb1",
                  "missing": "#ef9a9a", "extra": "#90caf9", "explained": "#e0e0e0"}


@dataclass
class Row:
    ref: int | None
    ours: int | None
    status: str
    nmse: float | None = None
    max_abs: float | None = None
    detail: str = ""


@dataclass
class DiffMap:
    rows: list[Row]
    ref_status: dict[int, Row] = field(default_factory=dict)
    ours_status: dict[int, Row] = field(default_factory=dict)
    first: Row | None = None


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None


def diff_map(res: DiffResult, ref: Dump, ours: Dump) -> DiffMap:
    """Rows in alignment order: ref nodes in order, inserted ours nodes where they occur."""
    deleted = {d.ref_index for d in res.structural if d.kind == "deleted"}
    inserted = {d.ours_index: d for d in res.structural if d.kind == "inserted"}
    changed = {d.ref_index: d for d in res.structural if d.kind == "changed"}
    ex_ref = {i for e in res.explained for i in e.ref_indices}
    ex_ours = {j for e in res.explained for j in e.ours_indices}
    numeric = {r.ref_index: r for r in res.numeric}

    # The alignment is monotonic, so the paired nodes are what is left on each side, in order.
    ref_paired = [i for i in range(len(ref.nodes)) if i not in deleted and i not in ex_ref]
    ours_paired = [j for j in range(len(ours.nodes)) if j not in inserted and j not in ex_ours]
    pair = dict(zip(ref_paired, ours_paired))

    ins_at: dict[int, list[int]] = {}
    for j, d in sorted(inserted.items()):
        ins_at.setdefault(d.ref_pos, []).append(j)
    rows: list[Row] = []
    for i in range(len(ref.nodes) + 1):
        rows += [Row(None, j, "extra", detail=inserted[j].describe()) for j in ins_at.get(i, [])]
        if i == len(ref.nodes):
            break
        if i in deleted:
            rows.append(Row(i, None, "missing", detail=f"ref #{i} '{ref.nodes[i].name}' has no counterpart in ours"))
            continue
        if i in ex_ref:
            rows.append(Row(i, None, "explained", detail="covered by an equivalence rule"))
            continue
        row = Row(i, pair.get(i), "matched")
        if i in changed:
            row.status, row.detail = "changed", changed[i].describe()
        nr = numeric.get(i)
        if nr is not None:
            row.nmse, row.max_abs = _num(nr.nmse), _num(nr.max_abs)
            if not nr.ok and row.status == "matched":
                row.status, row.detail = "value", nr.describe()
        rows.append(row)
    # ours nodes covered by rules on the ours side only have no ref row
    for j in sorted(ex_ours - {r.ours for r in rows if r.ours is not None}):
        rows.append(Row(None, j, "explained", detail="covered by an equivalence rule"))

    dm = DiffMap(rows)
    for r in rows:
        if r.ref is not None:
            dm.ref_status[r.ref] = r
        if r.ours is not None:
            dm.ours_status[r.ours] = r
    fd = res.first_divergence
    if fd:
        if fd.get("ref_index") is not None:
            dm.first = dm.ref_status.get(fd["ref_index"])
        elif fd.get("ours_index") is not None:
            dm.first = dm.ours_status.get(fd["ours_index"])
    return dm
