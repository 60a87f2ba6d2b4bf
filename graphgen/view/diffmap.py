"""A DiffResult as per-node statuses, for the viewers.

Statuses: matched (identical), changed (structure), value (NMSE or NaN/Inf failure), deleted (in
ref, not in ours), inserted (in ours only), explained (covered by an equivalence rule), uncompared
(structure equal, but a side kept neither values nor a digest). deleted and inserted are the
words `graphgen diff` prints, so a page and a report name a node's status alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from graphgen.compare.report import DiffResult
from graphgen.dump.format import Dump

STATUSES = ("matched", "changed", "value", "deleted", "inserted", "explained", "uncompared")
STATUS_COLOURS = {"matched": "#c8e6c9", "changed": "#ffcc80", "value": "#f48fb1",
                  "deleted": "#ef9a9a", "inserted": "#90caf9", "explained": "#e0e0e0",
                  "uncompared": "#fff59d"}
# what a legend calls each status: the diff's own words for them
STATUS_LABELS = {"matched": "identical", "changed": "changed", "value": "value failure",
                 "deleted": "deleted (ref only)", "inserted": "inserted (ours only)",
                 "explained": "explained by a rule", "uncompared": "not compared"}


@dataclass
class Row:
    ref: int | None
    ours: int | None
    status: str
    nmse: float | None = None
    max_abs: float | None = None
    detail: str = ""
    # a changed node's fields, field -> (ref value, ours value)
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    # the element furthest apart of a compared node (DiffResult's numeric "worst"), or None
    worst: dict[str, Any] | None = None
    # the node's own error (diff --local): its NMSE re-run alone on ref's values, or why it has none
    own: float | None = None
    own_why: str | None = None


@dataclass
class DiffMap:
    rows: list[Row]
    ref_status: dict[int, Row] = field(default_factory=dict)
    ours_status: dict[int, Row] = field(default_factory=dict)
    first: Row | None = None
    first_structural: Row | None = None
    first_value: Row | None = None


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
    uncompared = {i: why for i, _, _, why in res.not_compared}

    # The alignment is monotonic, so the paired nodes are what is left on each side, in order.
    ref_paired = [i for i in range(len(ref.nodes)) if i not in deleted and i not in ex_ref]
    ours_paired = [j for j in range(len(ours.nodes)) if j not in inserted and j not in ex_ours]
    pair = dict(zip(ref_paired, ours_paired))

    ins_at: dict[int, list[int]] = {}
    for j, d in sorted(inserted.items()):
        ins_at.setdefault(d.ref_pos, []).append(j)
    rows: list[Row] = []
    for i in range(len(ref.nodes) + 1):
        rows += [Row(None, j, "inserted", detail=inserted[j].describe()) for j in ins_at.get(i, [])]
        if i == len(ref.nodes):
            break
        if i in deleted:
            rows.append(Row(i, None, "deleted", detail=f"ref #{i} '{ref.nodes[i].name}' has no counterpart in ours"))
            continue
        if i in ex_ref:
            rows.append(Row(i, None, "explained", detail="covered by an equivalence rule"))
            continue
        row = Row(i, pair.get(i), "matched")
        if i in changed:
            row.status, row.detail, row.fields = "changed", changed[i].describe(), dict(changed[i].fields)
        nr = numeric.get(i)
        if nr is not None:
            row.nmse, row.max_abs = _num(nr.nmse), _num(nr.max_abs)
            # read through to_dict: the shape the diff publishes, whatever its fields are called
            row.worst = nr.to_dict().get("worst")
            loc = nr.local
            if loc is not None:
                row.own = None if loc.nmse is None else _num(loc.nmse)
                row.own_why = ("a view: computes nothing" if loc.kind == "view" else
                               (f"{loc.source}: {loc.why}" if loc.source else loc.why) if loc.kind == "skipped"
                               else None)
            if not nr.ok and row.status == "matched":
                row.status, row.detail = "value", nr.describe()
        elif i in uncompared and row.status == "matched":
            # equal structure is not equal values: a node nobody compared is not shown as identical
            row.status, row.detail = "uncompared", f"values not compared: {uncompared[i]}"
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
    dm.first = _row_of(dm, res.first_divergence)
    dm.first_structural = _row_of(dm, res.first_structural)
    dm.first_value = _row_of(dm, res.first_value)
    return dm


def _row_of(dm: DiffMap, event: dict | None) -> Row | None:
    """The row a first-divergence event (kind, ref_index, ours_index, ...) points at."""
    if not event:
        return None
    if event.get("ref_index") is not None:
        return dm.ref_status.get(event["ref_index"])
    if event.get("ours_index") is not None:
        return dm.ours_status.get(event["ours_index"])
    return None
