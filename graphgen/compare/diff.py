"""graph-diff: two graphgen-dump/1 dumps compared node for node (`diff_dumps`).

The node sequences are aligned (`align`); aligned pairs are compared field by field, an
automatic-name difference alone never reported, and sources compared by what they resolve to
(the aligned node, or for a rule's run its last node), not by spelling. A rule (`rules`) forgives
only the field differences it declares. Nodes stored on both sides are compared by value
(`values`); the result and its report are `report`'s. Loading two sides and pairing their graphs
is `pairing`'s.
"""

from __future__ import annotations

import math
import os

import numpy as np
from collections import Counter
from typing import Any, Sequence

from ..dump.format import Dump, Node
from .importers import FORMAT_LABELS, SCHED_UNSEEN_WHY, VIEW_OPS, common_fields, import_format
from .printed import compare_node, side_of
from .nodefilter import NodeFilter
from .probe import Target, find_pairs, largest_errors, probe
from .align import align_nodes
from .report import (DiffResult, Difference, Explained, NumericResult, describe_build, digest_reason, fmt_feature,
                     fmt_value, layer_strip, source_indices, summarize_local)
from .rules import Rule, load_rules, normalize_name
from .values import compare_values, thresholds


CONTEXT = 3                # nodes shown before/after the first divergence


# ---- diff -------------------------------------------------------------------------------------

def _node_row(node: Node, mark: bool) -> dict[str, Any]:
    return {"index": node.index, "name": node.name, "op": node.op, "type": node.type,
            "ne": list(node.ne), "mark": mark}


def _context(nodes: list[Node], pos: int, marked: int | None) -> list[dict[str, Any]]:
    lo, hi = max(0, pos - CONTEXT), min(len(nodes), pos + CONTEXT + 1)
    return [_node_row(nodes[k], k == marked) for k in range(lo, hi)]


class _Sources:
    """Resolves a node's sources on one side, seeing through pass-through nodes.

    Pass-through nodes are those a one-sided rule explains (e.g. an extra CONT in ours): a
    consumer of one is treated as reading that node's first source instead.
    """

    def __init__(self, nodes: list[Node], passthrough: set[int]):
        self.nodes, self.res, self.passthrough = nodes, source_indices(nodes), passthrough

    def slots(self, index: int) -> list[tuple[str, int | None]]:
        """(name, resolved index) for each src slot, then one for view_src."""
        node = self.nodes[index]
        names = list(node.src) + [node.view_src or ""]
        return [self._follow(name, k) for name, k in zip(names, self.res[index])]

    def _follow(self, name: str, k: int | None) -> tuple[str, int | None]:
        while k is not None and k in self.passthrough and self.nodes[k].src:
            name, k = self.nodes[k].src[0], self.res[k][0]
        return name, k


def _same_source(a: tuple[str, int | None], b: tuple[str, int | None], pair_map: dict[int, int]) -> bool:
    # Sources that are nodes must be aligned with each other; leaves compare by name.
    if a[1] is not None and b[1] is not None:
        return pair_map.get(a[1]) == b[1]
    return a[1] is None and b[1] is None and normalize_name(a[0]) == normalize_name(b[0])


def _own_fields(r: Node, o: Node) -> dict[str, tuple[Any, Any]]:
    fields: dict[str, tuple[Any, Any]] = {}
    if normalize_name(r.name) != normalize_name(o.name):
        fields["name"] = (r.name, o.name)
    for f in ("op", "type", "ne", "op_params", "view_offs"):
        if getattr(r, f) != getattr(o, f):
            fields[f] = (getattr(r, f), getattr(o, f))
    return fields


def _compare_fields(i: int, j: int, rsrc: _Sources, osrc: _Sources, pair_map: dict[int, int]) -> dict:
    r, o = rsrc.nodes[i], osrc.nodes[j]
    fields = _own_fields(r, o)
    r_slots, o_slots = rsrc.slots(i), osrc.slots(j)
    if len(r.src) != len(o.src) or not all(_same_source(a, b, pair_map)
                                           for a, b in zip(r_slots[:-1], o_slots[:-1])):
        fields["src"] = (list(r.src), list(o.src))
    if not _same_source(r_slots[-1], o_slots[-1], pair_map):
        fields["view_src"] = (r.view_src, o.view_src)
    return fields


def _run_inputs(srcs: _Sources, lo: int, hi: int) -> list[tuple[str, int | None]]:
    """What nodes[lo:hi] read from outside the run: src slots in order, each source once."""
    seen: set[tuple[str, int | None]] = set()
    out = []
    for k in range(lo, hi):
        for name, at in srcs.slots(k)[:-1]:
            if at is not None and lo <= at < hi:
                continue
            key = (normalize_name(name), None) if at is None else ("", at)
            if key not in seen:
                seen.add(key)
                out.append((name, at))
    return out


def _compare_run(i0: int, i1: int, j0: int, j1: int, rsrc: _Sources, osrc: _Sources,
                 pair_map: dict[int, int]) -> dict:
    """Field differences of a two-sided rule's output pair (see `Rule`)."""
    i, j = i1 - 1, j1 - 1
    if i1 - i0 == 1 and j1 - j0 == 1:
        return _compare_fields(i, j, rsrc, osrc, pair_map)
    r, o = rsrc.nodes[i], osrc.nodes[j]
    fields = _own_fields(r, o)
    r_in, o_in = _run_inputs(rsrc, i0, i1), _run_inputs(osrc, j0, j1)
    if len(r_in) != len(o_in) or not all(_same_source(a, b, pair_map) for a, b in zip(r_in, o_in)):
        fields["src"] = ([n for n, _ in r_in], [n for n, _ in o_in])
    rv, ov = rsrc.slots(i)[-1], osrc.slots(j)[-1]
    r_inner = rv[1] is not None and i0 <= rv[1] < i1
    o_inner = ov[1] is not None and j0 <= ov[1] < j1
    # a view of a node inside the run matches a view of one inside the other run
    if (r_inner != o_inner) or (not r_inner and not _same_source(rv, ov, pair_map)):
        fields["view_src"] = (r.view_src, o.view_src)
    return fields


def diff_dumps(ref: Dump, ours: Dump, nmse: float | dict[str, float] | None = None,
               rules: Sequence[Rule] | str | os.PathLike | None = None, on_values=None,
               select: NodeFilter | None = None, per_op: dict[str, float] | None = None,
               at: Sequence[Target] = (), local: bool = False, model: str | os.PathLike | None = None,
               on_local=None, lenders: Sequence[str | os.PathLike] = ()) -> DiffResult:
    """Compare two dumps; `rules` is a list of Rule or the path of a rules file.

    When either side is imported (structure only), both are first cut down to the fields every
    import involved shows, and a note says so. `on_values(done, total)` follows the value
    comparison, the slow part of a large graph. `select` keeps the comparison to the nodes it
    selects (on either side); `per_op` bounds NMSE per op or type (graphgen.compare.nodefilter); `at`
    names nodes to probe (graphgen.compare.probe). `local` re-runs each compared node of ours alone
    on ref's values (graphgen.compare.local), with `model` (ours's GGUF) for its weights and
    `on_local(done, total)` following it."""
    if isinstance(rules, (str, os.PathLike)):
        rules = load_rules(rules)
    rules = list(rules or ())
    full_ref, full_ours = ref, ours
    ref, ours, cut_note = common_fields(ref, ours)
    threshold = thresholds(nmse, per_op)
    select = select or NodeFilter()
    R, O = ref.nodes, ours.nodes
    steps = align_nodes(R, O, rules)

    pair_map: dict[int, int] = {}
    pass_r: set[int] = set()
    pass_o: set[int] = set()
    for st in steps:
        if st[0] == "pair":
            pair_map[st[1]] = st[2]
        elif st[0] == "rule":
            _, _, i0, i1, j0, j1 = st
            if i0 < i1 and j0 < j1:
                pair_map[i1 - 1] = j1 - 1  # a rule's outputs: the last node of each run
            else:
                (pass_r if i0 < i1 else pass_o).update(range(i0, i1) if i0 < i1 else range(j0, j1))

    rsrc, osrc = _Sources(R, pass_r), _Sources(O, pass_o)
    structural: list[Difference] = []
    explained: list[Explained] = []
    compare: list[tuple[int, int]] = []  # (ref, ours) pairs whose values are compared
    matched = 0
    for st in steps:
        if st[0] == "pair":
            i, j = st[1], st[2]
            fields = _compare_fields(i, j, rsrc, osrc, pair_map)
            if fields:
                structural.append(Difference("changed", i, j, fields, R[i].name, O[j].name, R[i].op, i, j))
            else:
                matched += 1
            compare.append((i, j))
        elif st[0] == "del":
            i, j = st[1], st[2]
            structural.append(Difference("deleted", i, None, {}, R[i].name, None, R[i].op, i, j))
        elif st[0] == "ins":
            i, j = st[1], st[2]
            structural.append(Difference("inserted", None, j, {}, None, O[j].name, O[j].op, i, j))
        else:
            rule, i0, i1, j0, j1 = st[1:]
            ref_run, ours_run = list(range(i0, i1)), list(range(j0, j1))
            if i1 > i0 and j1 > j0:
                i, j = i1 - 1, j1 - 1
                fields = rule.unexplained(_compare_run(i0, i1, j0, j1, rsrc, osrc, pair_map), R[i], O[j])
                if fields:
                    # the rule matched but does not account for this: a divergence at its output,
                    # counted as changed rather than explained
                    structural.append(Difference("changed", i, j, fields, R[i].name, O[j].name,
                                                 R[i].op, i, j))
                    ref_run.remove(i)
                    ours_run.remove(j)
                # the two outputs stand for one value whatever they are called: compare it
                compare.append((i, j))
            explained.append(Explained(rule.name, ref_run, ours_run))

    numeric: list[NumericResult] = []
    not_compared: list[tuple[int, int, str, str]] = []  # (ref, ours, name, why)
    notes: list[str] = []
    structure_only = [side for side, d in (("ref", ref), ("ours", ours)) if (d.source or {}).get("import")]
    if cut_note:
        notes.append(cut_note)
    fmts = {import_format(d) for d in (ref, ours)} - {None}
    from_printed: set[int] = set()  # id() of the results compared from printed values
    unseen: list[dict[str, Any]] = []
    if "sched-debug" in fmts:
        # the log lists no views: name those of a side that has them, else the gaps in a log's numbering
        for side, full in (("ref", full_ref), ("ours", full_ours)):
            if import_format(full) != "sched-debug":
                unseen += [{"side": side, "index": k, "name": n.name, "op": n.op, "why": SCHED_UNSEEN_WHY}
                           for k, n in enumerate(full.nodes) if n.op in VIEW_OPS]
        if not unseen:
            for side, full in (("ref", full_ref), ("ours", full_ours)):
                gaps = ((full.source or {}).get("import") or {}).get("unseen") or {}
                unseen += [{"side": side, "index": k, "name": None, "op": None, "why": SCHED_UNSEEN_WHY}
                           for k in gaps.get("indices") or []]
        if unseen:
            shown = ", ".join(f"{u['side']} #{u['index']}" + (f" '{u['name']}' {u['op']}" if u["name"] else "")
                              for u in unseen[:6]) + (f", ... {len(unseen) - 6} more" if len(unseen) > 6 else "")
            notes.append(f"compared on the {len(R)} nodes the log shows; {len(unseen)} not shown, so not paired "
                         f"({shown}): {SCHED_UNSEEN_WHY}")
    if fmts == {"eval-callback"}:
        # the text prints some values of each node: compare them as far as they go
        n_elements = n_sums = 0
        for i, j in compare:
            r, o = R[i], O[j]
            if r.ne != o.ne:
                continue  # already a structural difference; values cannot line up
            sides = []
            for cut, full, k in ((ref, full_ref, i), (ours, full_ours, j)):
                src = cut if import_format(cut) else full  # a full side's values live in the uncut dump
                sides.append(side_of(src, k) if len(src.nodes) == len(cut.nodes) else None)
            if None in sides:
                not_compared.append((i, j, r.name, "its values cannot be lined up with the printed ones"))
                continue
            res = compare_node(sides[0], sides[1], r.ne)
            if res.not_compared:
                not_compared.append((i, j, r.name, f"printed values not compared: {res.not_compared}"))
                continue
            n_elements += res.elements
            n_sums += res.sum_checked
            nr = NumericResult(i, j, r.name, r.type, res.elements, res.nmse, res.max_abs, res.tolerance,
                               not res.failures, "; ".join(res.failures) or None)
            from_printed.add(id(nr))
            numeric.append(nr)
        notes.append(f"values compared from printed values: {n_elements} printed elements and {n_sums} printed "
                     f"sums on {len(from_printed)} nodes; an element agrees within half a unit of its last "
                     "printed digit plus 2 float32 ulps, a sum within that of its last digit plus float32 "
                     "summation error; elements the text does not print are seen only through the sum")
        notes += _build_notes(ref, ours)
    elif structure_only:
        shows = " and ".join(FORMAT_LABELS[f] for f in sorted(fmts - {"eval-callback"}))
        notes.append(f"{' and '.join(structure_only)} is an imported dump and a {shows} shows no values: "
                     "values not compared")
    if not structure_only:
        for k, (i, j) in enumerate(compare):
            if on_values is not None and k % 16 == 0:
                on_values(k, len(compare))
            r, o = R[i], O[j]
            if r.ne != o.ne:
                continue  # already a structural difference; values cannot line up
            a, b = ref.values(i), ours.values(j)
            if a is not None and b is not None:
                nm, max_abs, reason = compare_values(a, b)
                thr = threshold(r.type, r.op)
                ok = reason is None and nm <= thr
                worst = largest_errors(a, b, r.ne, 1) if (nm or reason or max_abs) else []
                numeric.append(NumericResult(i, j, r.name, r.type, int(a.size), nm, max_abs, thr, ok, reason,
                                             op=r.op, worst=worst[0] if worst else None))
            elif r.digest and o.digest:
                # values not kept (over --max-data): the bytes' digests still tell bit-exact equality
                same = r.digest == o.digest
                numeric.append(NumericResult(i, j, r.name, r.type, r.nelements, 0.0 if same else math.inf,
                                             0.0 if same else math.inf, threshold(r.type, r.op), same,
                                             None if same else digest_reason(r, o), by_digest=True, op=r.op))
            else:
                why = " and ".join(side for side, n, v in (("ref", r, a), ("ours", o, b))
                                   if v is None and not n.digest)
                not_compared.append((i, j, r.name, f"no values or digest in {why}"))

    inputs = [] if structure_only else compare_inputs(full_ref, full_ours)
    local_summary = None
    if local:
        local_summary = _local(full_ref, full_ours, numeric, pair_map, osrc, model, on_local, structure_only,
                               from_printed, lenders)
        if local_summary is not None and not local_summary.get("error"):
            local_summary["inputs_differ"] = [d for d in inputs if not d["equal"]]
    if ref.graph != ours.graph:
        notes.append(f"comparing a '{ref.graph}' graph with a '{ours.graph}' graph")
    warnings, provenance = _provenance(full_ref, full_ours)
    # an import knows neither the build nor the settings: nothing to compare them with
    settings_differ: list[str] = []
    if not structure_only:
        notes += _build_notes(ref, ours)
        settings_differ = _settings_differ(ref, ours)

    selection = None
    nothing_selected = False
    if select.active:
        # a difference counts when a node it involves is selected, on either side
        structural = [d for d in structural if (d.ref_index is not None and select(R[d.ref_index]))
                      or (d.ours_index is not None and select(O[d.ours_index]))]
        numeric = [r for r in numeric if select(R[r.ref_index]) or select(O[r.ours_index])]
        not_compared = [c for c in not_compared if select(R[c[0]]) or select(O[c[1]])]
        n_sel = sum(map(select, R))
        selection = f"{select}: {n_sel} of {len(R)} ref nodes"
        # a filter that selects nothing in this graph must not read as IDENTICAL (diff_paths
        # refuses a filter that selects nothing in any graph)
        nothing_selected = n_sel == 0 and not any(map(select, O))

    # First divergence in ref order; a structural difference precedes a value failure at the same
    # node, and value failures propagate downstream, so the earliest one is the origin. The first
    # structural change and the first value failure are also kept apart: a value failure before a
    # later type change is where to look first.
    def event(ev) -> dict[str, Any]:
        if isinstance(ev, Difference):
            rp, op_, kind, detail = ev.ref_pos, ev.ours_pos, ev.kind, ev.describe()
        else:
            rp, op_, kind, detail = ev.ref_index, ev.ours_index, "numeric", ev.describe()
        return {"kind": kind, "ref_index": ev.ref_index, "ours_index": ev.ours_index, "detail": detail,
                "context": {"ref": _context(R, rp, ev.ref_index), "ours": _context(O, op_, ev.ours_index)}}
    s_events = [((d.ref_pos, d.ours_pos, 0), d) for d in structural]
    v_events = [((r.ref_index, r.ours_index, 1), r) for r in numeric if not r.ok]
    first = event(min(s_events + v_events, key=lambda e: e[0])[1]) if s_events or v_events else None
    first_s = event(min(s_events, key=lambda e: e[0])[1]) if s_events else None
    first_v = event(min(v_events, key=lambda e: e[0])[1]) if v_events else None

    probes = []
    nm_at = {r.ref_index: r for r in numeric}
    for target in at:
        for i, j in find_pairs(target, R, O, pair_map):
            res = nm_at.get(i) if i is not None else None
            probes.append(probe(ref, ours, i, j, res.nmse if res else None, res.threshold if res else None))

    fails = [r for r in numeric if not r.ok]
    finite = [r.nmse for r in numeric if math.isfinite(r.nmse)]
    summary = {
        "nodes_ref": len(R), "nodes_ours": len(O), "matched": matched,
        "changed": sum(d.kind == "changed" for d in structural),
        "inserted": sum(d.kind == "inserted" for d in structural),
        "deleted": sum(d.kind == "deleted" for d in structural),
        "explained_ref": sum(len(e.ref_indices) for e in explained),
        "explained_ours": sum(len(e.ours_indices) for e in explained),
        "numeric_compared": len(numeric), "numeric_failed": len(fails),
        "by_digest": sum(r.by_digest for r in numeric), "from_printed": sum(id(r) in from_printed for r in numeric), "not_compared": len(not_compared),
        "max_nmse": max(finite) if finite else None, "settings_differ": len(settings_differ),
        "inputs_compared": len(inputs), "inputs_differ": sum(not r["equal"] for r in inputs),
    }
    # first_divergence is the earlier of the two below (kept for readers of older reports)
    return DiffResult(ref_path=str(ref.path), ours_path=str(ours.path), graph=ref.graph,
                      identical=(not structural and not fails and not not_compared and not settings_differ
                                 and not unseen),
                      nothing_selected=nothing_selected,
                      settings_differ=settings_differ, unseen=unseen, structural=structural,
                      numeric=numeric, not_compared=not_compared,
                      first_divergence=first, first_structural=first_s, first_value=first_v,
                      layers=layer_strip(R, numeric, structural), probes=probes, selection=selection,
                      rules_fired=dict(Counter(e.rule for e in explained)),
                      explained=explained, notes=notes, summary=summary,
                      builds={"ref": describe_build(ref), "ours": describe_build(ours)},
                      warnings=warnings, provenance=provenance, local=local_summary, inputs=inputs)


def compare_inputs(ref: Dump, ours: Dump) -> list[dict[str, Any]]:
    """The graph inputs both dumps record, by name: equal, or how they differ. A differing input
    is an origin of its own: every node reading it is fed differently on the two sides."""
    out = []
    for k, inp in enumerate(ref.inputs):
        j = ours.input_partner(ref, k)
        if j is None:
            continue
        o = ours.inputs[j]
        a, b = ref.input_values(k), ours.input_values(j)
        row: dict[str, Any] = {"name": inp.name, "type_ref": inp.type, "type_ours": o.type, "ne_ref": inp.ne,
                               "ne_ours": o.ne}
        if a is None or b is None:
            row.update(equal=inp.digest is not None and inp.digest == o.digest and inp.type == o.type, by_digest=True)
        elif a.shape != b.shape:
            row.update(equal=False, detail=f"ne {inp.ne} against {o.ne}")
        else:
            same = bool(np.array_equal(a, b, equal_nan=True))
            row["equal"] = same
            if not same:
                diff = np.flatnonzero(~((a == b) | (np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64)))))
                k = int(diff[0])
                nm, mx, _ = compare_values(a, b)
                row.update(nmse=nm, max_abs=mx, n_differ=int(diff.size),
                           detail=f"{diff.size} of {a.size} elements differ, first at flat index {k}: "
                                  f"ref {a.ravel()[k].item()!r}, ours {b.ravel()[k].item()!r}")
        out.append(row)
    return out


def _local(ref: Dump, ours: Dump, numeric: list[NumericResult], pair_map: dict[int, int], osrc: _Sources,
           model, on_local, structure_only, from_printed, lenders=()) -> dict[str, Any]:
    """Each compared node's own error, set on its NumericResult; what was re-run, summed up."""
    from .local import local_errors
    if structure_only or from_printed:
        return {"error": "an imported dump keeps no values to re-run nodes on"}
    pairs = [(r.ref_index, r.ours_index) for r in numeric]
    ref_of = {j: i for i, j in pair_map.items()}

    def slots(j: int) -> list[tuple[str, int | None]]:
        # the recorded source indices where the dump has them (names repeat: " (reshaped)"),
        # else the names resolved as the diff resolves them
        by_name = osrc.slots(j)
        at = ours.nodes[j].src_at
        if at is None or osrc.passthrough:
            return by_name
        return [(name, k if k is not None else by_name[s][1]) for s, (name, k) in
                enumerate(zip(ours.nodes[j].src, at))] + by_name[len(at):]
    found = local_errors(ref, ours, pairs, ref_of, slots, model=model, progress=on_local, lenders=list(lenders))
    for r in numeric:
        r.local = found.get(r.ours_index)
    return summarize_local(numeric)


def _build_notes(ref: Dump, ours: Dump) -> list[str]:
    """What differs in how the two sides were computed (CPU kernels, ggml, settings)."""
    imported = [(side, import_format(d)) for side, d in (("ref", ref), ("ours", ours)) if import_format(d)]
    if imported:
        # an import records no build: say what cannot be checked rather than compare placeholders
        return [f"{side}: an imported {FORMAT_LABELS[f]} records no build (ggml version, CPU features), so "
                "last-bit value differences cannot be told from another build's kernels" for side, f in imported]
    notes = []
    feats = sorted(set(ref.cpu_features) | set(ours.cpu_features))
    differ = [f"{f} ref={fmt_feature(ref.cpu_features.get(f))} ours={fmt_feature(ours.cpu_features.get(f))}"
              for f in feats if ref.cpu_features.get(f) != ours.cpu_features.get(f)]
    if differ:
        notes.append(f"cpu_features differ ({', '.join(differ)}): different kernels may run, so "
                     "last-bit differences in values are expected")
    ggml_ref, ggml_ours = (ref.source or {}).get("ggml"), (ours.source or {}).get("ggml")
    if ggml_ref and ggml_ours and ggml_ref != ggml_ours:
        notes.append(f"computed on different ggml versions (ref {ggml_ref}, ours {ggml_ours}): kernels may "
                     "differ, so value differences need not come from the graph")
    one_side = [f"{k} ({'ref' if k in ref.settings else 'ours'} only)"
                for k in sorted(set(ref.settings) ^ set(ours.settings))]
    if one_side:
        notes.append(f"settings recorded by one side only: {', '.join(one_side)}")
    return notes


def _settings_differ(ref: Dump, ours: Dump) -> list[str]:
    return [f"{k} ref={fmt_value(ref.settings[k])} ours={fmt_value(ours.settings[k])}"
            for k in sorted(set(ref.settings) & set(ours.settings)) if ref.settings[k] != ours.settings[k]]


def _provenance(ref: Dump, ours: Dump) -> tuple[list[str], dict[str, Any]]:
    """Warnings when the two sides ran different models or scenarios, and what each side ran.
    Dumps made before these fields existed, and imports, say nothing, so nothing is claimed."""
    def side(d: Dump) -> dict[str, Any]:
        return {"model": d.model, "model_sha256": d.model_sha256, "scenario": d.scenario}

    def scen(d: Dump) -> str:
        sc = d.scenario or {}
        where = sc.get("path") or sc.get("name") or "a scenario"
        seed = f", seed {sc['seed']}" if sc.get("seed") is not None else ""
        return f"{where} ({str(sc.get('digest'))[:12]}{seed})"

    info = {"ref": side(ref), "ours": side(ours), "same_model": None, "same_scenario": None}
    warnings = []
    if ref.model_sha256 and ours.model_sha256:
        info["same_model"] = ref.model_sha256 == ours.model_sha256
        if not info["same_model"]:
            warnings.append(f"the two sides ran different models: ref {ref.model} (sha256 "
                            f"{ref.model_sha256[:12]}), ours {ours.model} (sha256 {ours.model_sha256[:12]}); "
                            "compared anyway")
    dr, do = (ref.scenario or {}).get("digest"), (ours.scenario or {}).get("digest")
    if dr and do:
        info["same_scenario"] = dr == do
        if not info["same_scenario"]:
            warnings.append(f"the two sides ran different scenarios: ref {scen(ref)}, ours {scen(ours)}; "
                            "compared anyway")
    return warnings, info


