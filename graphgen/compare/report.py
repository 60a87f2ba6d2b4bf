"""graph-diff's results and their report: the per-node differences, numeric results and
explained runs of one graph pair (`DiffResult`), the text and JSON reports with the first
structural change, the first value failure and the per-layer strip, and the exit code of a set
of results."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..dump.format import Node
from .importers import FORMAT_LABELS, import_format
from .layers import node_layers
from .probe import format_probe


MAX_LISTED = 20            # differences listed in the text report


# ---- result types -----------------------------------------------------------------------------

@dataclass
class Difference:
    kind: str                      # "changed" | "inserted" | "deleted"
    ref_index: int | None          # None for inserted
    ours_index: int | None         # None for deleted
    fields: dict[str, tuple[Any, Any]]  # field -> (ref value, ours value); empty unless changed
    ref_name: str | None = None
    ours_name: str | None = None
    op: str = ""                   # the node's op (ref's for changed)
    ref_pos: int = 0               # place in ref order (for inserted: the ref node that follows)
    ours_pos: int = 0              # place in ours order (for deleted: the ours node that follows)

    def describe(self) -> str:
        if self.kind == "inserted":
            return f"inserted ours #{self.ours_index} '{self.ours_name}' {self.op}"
        if self.kind == "deleted":
            return f"deleted ref #{self.ref_index} '{self.ref_name}' {self.op}"
        changes = "; ".join(_fmt_op_params(self.op, a, b) if f == "op_params" else f"{f}: {fmt_value(a)} -> {fmt_value(b)}"
                            for f, (a, b) in self.fields.items())
        return f"changed ref #{self.ref_index} / ours #{self.ours_index} '{self.ref_name}': {changes}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "ref_index": self.ref_index, "ours_index": self.ours_index,
                "ref_name": self.ref_name, "ours_name": self.ours_name, "op": self.op,
                "fields": {f: {"ref": a, "ours": b} for f, (a, b) in self.fields.items()}}


@dataclass
class NumericResult:
    ref_index: int
    ours_index: int
    name: str
    type: str
    n: int
    nmse: float
    max_abs: float
    threshold: float
    ok: bool
    reason: str | None = None      # NaN/Inf disagreement, when that is why it failed
    by_digest: bool = False        # compared through the bytes' digests (values not kept)
    op: str = ""
    # the element furthest apart (index, coord [i0..i3], ref, ours, abs); None when the values are
    # equal or not kept
    worst: dict[str, Any] | None = None
    local: Any = None  # graphgen.compare.local.Local: the node's own error, when asked for

    def describe(self) -> str:
        why = self.reason or f"nmse {self.nmse:.3g} > {self.threshold:g}"
        at = ""
        if self.worst:
            w = self.worst
            at = f" at {w['coord']} (ref {w['ref']:.6g}, ours {w['ours']:.6g})"
        return (f"values ref #{self.ref_index} / ours #{self.ours_index} '{self.name}' ({self.type}): "
                f"{why}, max abs {self.max_abs:.3g}{at}")

    def to_dict(self) -> dict[str, Any]:
        worst = None if self.worst is None else {k: _json_float(v) if isinstance(v, float) else v
                                                 for k, v in self.worst.items()}
        return {"ref_index": self.ref_index, "ours_index": self.ours_index, "name": self.name,
                "op": self.op, "type": self.type, "n": self.n, "nmse": _json_float(self.nmse),
                "max_abs": _json_float(self.max_abs), "threshold": self.threshold, "ok": self.ok,
                "reason": self.reason, "by_digest": self.by_digest, "worst": worst,
                "local": None if self.local is None else self.local.to_dict()}


@dataclass
class Explained:
    rule: str
    ref_indices: list[int]
    ours_indices: list[int]


@dataclass
class DiffResult:
    ref_path: str | None
    ours_path: str | None
    graph: str
    identical: bool
    structural: list[Difference] = field(default_factory=list)
    numeric: list[NumericResult] = field(default_factory=list)
    first_divergence: dict[str, Any] | None = None
    rules_fired: dict[str, int] = field(default_factory=dict)
    explained: list[Explained] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    builds: dict[str, str] = field(default_factory=dict)
    not_compared: list[tuple[int, int, str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)    # the sides ran different models or scenarios
    provenance: dict[str, Any] = field(default_factory=dict)
    unpaired: str | None = None    # "ref" or "ours": this graph found no partner on the other side
    # settings both dumps record with different values ("n_kv ref=256 ours=512"): the graphs were
    # not computed under the same conditions, a divergence whatever their nodes say
    settings_differ: list[str] = field(default_factory=list)
    # nodes of one side the other side's format cannot show (a GGML_SCHED_DEBUG log's views), as
    # {side, index, name, op, why}: while any is left the result is PARTIAL, never IDENTICAL
    unseen: list[dict[str, Any]] = field(default_factory=list)
    # the first structural change and the first value failure, each as first_divergence is
    first_structural: dict[str, Any] | None = None
    first_value: dict[str, Any] | None = None
    layers: list[dict[str, Any]] = field(default_factory=list)  # the per-layer strip
    probes: list[dict[str, Any]] = field(default_factory=list)  # what --at asked for
    selection: str | None = None   # "-o MUL_MAT: 12 of 270 nodes" when a filter narrowed the diff
    show_layers: bool = False      # print the per-layer strip even when every value agrees
    nothing_selected: bool = False  # the filter selected no node of this graph: nothing was compared
    local: dict[str, Any] | None = None  # each node's own error, summed up (summarize_local)
    inputs: list[dict[str, Any]] = field(default_factory=list)  # graph inputs both sides record (compare_inputs)

    @property
    def status(self) -> str:
        """IDENTICAL, DIVERGED, or NOT COMPARED: structure equal and no value differs, but some
        nodes had neither values nor a digest on a side, so equality was not shown."""
        if self.nothing_selected:
            # the filter left nothing of this graph to compare: nothing diverged, nothing was shown
            return "NOTHING SELECTED"
        if self.identical:
            return "IDENTICAL"
        if self.unpaired:
            return "NO PARTNER"
        if self.not_compared and not self.structural and not self.numeric_failures and not self.settings_differ:
            return "NOT COMPARED"
        if self.unseen and not self.structural and not self.numeric_failures and not self.settings_differ:
            return "PARTIAL"
        return "DIVERGED"

    def _values_verdict(self) -> str:
        if not self.numeric:
            return "none compared"
        if all(r.ok and r.nmse == 0 for r in self.numeric):
            return f"bit-exact on all {len(self.numeric)} compared nodes"
        worst = max(self.numeric, key=lambda r: r.nmse if not math.isnan(r.nmse) else math.inf)
        where = f"#{worst.ref_index} '{worst.name}'"
        state = "within thresholds" if all(r.ok for r in self.numeric) else "outside thresholds"
        return f"{state}, largest nmse {worst.nmse:.3g} at {where}"

    @property
    def numeric_failures(self) -> list[NumericResult]:
        return [r for r in self.numeric if not r.ok]

    def to_dict(self) -> dict[str, Any]:
        summary = {k: _json_float(v) if isinstance(v, float) else v for k, v in self.summary.items()}
        return {"ref": self.ref_path, "ours": self.ours_path, "graph": self.graph,
                "identical": self.identical,
                "structural": [d.to_dict() for d in self.structural],
                "numeric": [r.to_dict() for r in self.numeric],
                "first_divergence": self.first_divergence, "rules_fired": dict(self.rules_fired),
                "explained": [vars(e) for e in self.explained], "notes": list(self.notes),
                "summary": summary, "builds": dict(self.builds), "status": self.status,
                "not_compared": [{"ref_index": i, "ours_index": j, "name": n, "why": w}
                                 for i, j, n, w in self.not_compared],
                "warnings": list(self.warnings), "provenance": self.provenance, "unpaired": self.unpaired,
                "settings_differ": list(self.settings_differ), "unseen": list(self.unseen),
                "first_structural": self.first_structural, "first_value": self.first_value,
                "layers": [_json_row(r) for r in self.layers], "probes": [_json_row(p) for p in self.probes],
                "selection": self.selection, "local": None if self.local is None else _json_row(self.local),
                "inputs": [_json_row(r) for r in self.inputs]}

    def format_text(self) -> str:
        s = self.summary
        out = [f"graph-diff [{self.graph}]  ref: {self.ref_path or '-'}  ours: {self.ours_path or '-'}",
               f"result: {self.status}" + (f" (only the nodes {self.selection})" if self.selection else "")]
        out += [f"warning: {w}" for w in self.warnings]
        if self.builds:
            out += [f"  {side:4s} build: {desc}" for side, desc in self.builds.items()]
        for title, fd in (("first structural change", self.first_structural),
                          ("first value failure", self.first_value)):
            if not fd:
                continue
            out += ["", f"{title}: {fd['detail']}"]
            for side in ("ref", "ours"):
                out.append(f"  {side}:")
                for row in fd["context"][side]:
                    mark = ">" if row["mark"] else " "
                    out.append(f"  {mark} {row['index']:>5}  {row['name'][:40]:<40} {row['op']:<14} "
                               f"{row['type']:<5} {row['ne']}")
        if s:
            out += ["", "summary:",
                    f"  nodes            ref {s['nodes_ref']}, ours {s['nodes_ours']}",
                    f"  matched          {s['matched']}",
                    f"  changed          {s['changed']}",
                    f"  inserted         {s['inserted']}",
                    f"  deleted          {s['deleted']}",
                    f"  rule-explained   ref {s['explained_ref']}, ours {s['explained_ours']}",
                    f"  numeric          {s['numeric_compared']} compared ({s.get('by_digest', 0)} by digest, {s.get('from_printed', 0)} from printed values), "
                    f"{s['numeric_failed']} failed, {s.get('not_compared', 0)} not compared",
                    f"  values           {self._values_verdict()}"]
            if s.get("inputs_compared"):
                out.append(f"  graph inputs     {s['inputs_compared']} recorded on both sides, "
                           f"{s['inputs_differ']} differ")
        if self.layers and (self.show_layers or any(r["max_nmse"] for r in self.layers)):
            out += ["", "per layer (where the error grows):"]
            out += [f"  {_strip_line(r)}" for r in self.layers]
        differ = [r for r in self.inputs if not r["equal"]]
        if differ:
            out += ["", "graph inputs that differ (every node reading one is fed differently):"]
            out += [f"  '{r['name']}': {r.get('detail') or 'bytes differ (digest)'}" for r in differ]
        if self.settings_differ:
            out += ["", "settings differ (the graphs ran under different settings):"]
            out += [f"  {d}" for d in self.settings_differ]
        if self.structural:
            out += ["", "differences:"]
            out += [f"  {d.describe()}" for d in self.structural[:MAX_LISTED]]
            if len(self.structural) > MAX_LISTED:
                out.append(f"  ... {len(self.structural) - MAX_LISTED} more")
        fails = self.numeric_failures
        if fails:
            out += ["", "numeric failures:"]
            out += [f"  {r.describe()}" for r in fails[:MAX_LISTED]]
            if len(fails) > MAX_LISTED:
                out.append(f"  ... {len(fails) - MAX_LISTED} more")
        if self.not_compared:
            out += ["", "not compared (no values or digest):"]
            out += [f"  ref #{i} / ours #{j} '{n}': {w}" for i, j, n, w in self.not_compared[:MAX_LISTED]]
            if len(self.not_compared) > MAX_LISTED:
                out.append(f"  ... {len(self.not_compared) - MAX_LISTED} more")
        if self.rules_fired:
            out += ["", "rules fired:"]
            out += [f"  {name} x{count}" for name, count in self.rules_fired.items()]
        if self.notes:
            out += ["", "notes:"]
            out += [f"  - {n}" for n in self.notes]
        for pr in self.probes:
            out += [""] + format_probe(pr)
        if self.local is not None:
            out += [""] + format_local(self.local)
        return "\n".join(out)


OWN_LISTED = 8


def summarize_local(numeric: Sequence[NumericResult]) -> dict[str, Any]:
    """What re-running each node alone found: the nodes with the largest own error first (those
    that explain most of what follows), the first node whose own error passes its bound, and
    every node that could not be re-run, with why."""
    rows = [r for r in numeric if r.local is not None]
    rerun = [r for r in rows if r.local.kind == "rerun"]

    def row(r: NumericResult) -> dict[str, Any]:
        loc = r.local
        share = loc.nmse / r.nmse if r.nmse and math.isfinite(r.nmse) and loc.nmse is not None else None
        return {"ref_index": r.ref_index, "ours_index": r.ours_index, "name": r.name, "op": r.op,
                "own_nmse": loc.nmse, "own_max_abs": loc.max_abs, "total_nmse": r.nmse, "threshold": r.threshold,
                "own_share": share, "replay_exact": loc.replay_exact}
    # a node whose replay on its own values is not exact has no own error to trust: listed apart
    trusted = [r for r in rerun if r.local.replay_exact is not False]
    own = sorted((r for r in trusted if r.local.nmse), key=lambda r: (-r.local.nmse, r.ref_index))
    past = [r for r in trusted if r.local.nmse is not None and (r.local.nmse > r.threshold or r.local.why)]
    skipped = [r for r in rows if r.local.kind == "skipped"]
    reasons: dict[str, list[str]] = {}
    for r in skipped:
        via = f" via {r.local.source}" if r.local.source else ""
        reasons.setdefault(r.local.why or "?", []).append(f"#{r.ours_index} {r.name} ({r.op}){via}")
    return {"rerun": len(rerun), "views": sum(r.local.kind == "view" for r in rows), "skipped": len(skipped),
            "not_asked": len(numeric) - len(rows),
            "own": [row(r) for r in own[:OWN_LISTED]],
            "first_own_past_bound": row(min(past, key=lambda r: r.ref_index)) if past else None,
            "not_rerun": [{"why": why, "count": len(names), "nodes": names[:6]} for why, names in reasons.items()],
            "replay_inexact": [row(r) for r in rerun if r.local.replay_exact is False][:OWN_LISTED],
            "n_replay_inexact": sum(r.local.replay_exact is False for r in rerun),
            "n_replay_exact": sum(r.local.replay_exact is True for r in rerun),
            "n_inputs_from_ours": sum(r.local.inputs_from_ours for r in rerun),
            "n_replay_unchecked": sum(r.local.replay_exact is None for r in rerun)}


def local_unmeasured(locs: Sequence[dict[str, Any]]) -> str | None:
    """--local that re-ran no node in any graph measured nothing: why, in a line (None when it
    measured)."""
    if any(loc.get("rerun") for loc in locs):
        return None
    whys = sorted({g["why"] for loc in locs for g in loc.get("not_rerun", [])} |
                  {loc["error"] for loc in locs if loc.get("error")})
    return "--local: no node could be re-run alone" + (f" ({'; '.join(whys)})" if whys else "")


def format_local(loc: dict[str, Any]) -> list[str]:
    if loc.get("error"):
        return [f"own error: not measured: {loc['error']}"]
    out = [f"own error (each node of ours re-run alone on ref's values, on the backend that ran it): "
           f"{loc['rerun']} re-run, {loc['views']} views (nil), {loc['skipped']} not re-run alone",
           f"  replayed on ours's own values: {loc['n_replay_exact']} give ours's output exactly, "
           f"{loc['n_replay_inexact']} do not, {loc['n_replay_unchecked']} not replayed (ours keeps no values of "
           "a source)"]
    if loc.get("n_inputs_from_ours"):
        out.append(f"  note: ref records no graph inputs, so {loc['n_inputs_from_ours']} nodes reading one were fed "
                   "ours's (a fault in ours's inputs does not show in their own error)")
    for r in loc.get("inputs_differ", []):
        out.append(f"  the graph input '{r['name']}' differs, an origin of its own: {r.get('detail') or 'bytes differ'}")
    if loc["first_own_past_bound"]:
        r = loc["first_own_past_bound"]
        out.append(f"  first node whose own error passes its bound: ref #{r['ref_index']} / ours "
                   f"#{r['ours_index']} '{r['name']}' ({r['op']}) own nmse {r['own_nmse']:.3g} > {r['threshold']:g}")
    if loc["own"]:
        out.append("  largest own error first (own / total nmse at the node):")
        for r in loc["own"]:
            share = f"  ({r['own_share']:.0%} of its total)" if r["own_share"] is not None else ""
            out.append(f"    ours #{r['ours_index']:<5} {r['name'][:40]:<40} {r['op']:<14} own {r['own_nmse']:.3g}  "
                       f"total {r['total_nmse']:.3g}{share}")
    elif loc["rerun"]:
        out.append("  every node re-run alone gives ref's output exactly: no node adds error of its own")
    for g in loc["not_rerun"]:
        more = f", ... {g['count'] - len(g['nodes'])} more" if g["count"] > len(g["nodes"]) else ""
        out.append(f"  not re-run alone ({g['count']}): {g['why']}: {', '.join(g['nodes'])}{more}")
    if loc["n_replay_inexact"]:
        out.append(f"  warning: {loc['n_replay_inexact']} nodes re-run on ours's own values do not give ours's own "
                   "output exactly, so their own error is uncertain: "
                   + ", ".join(f"#{r['ours_index']} {r['name']}" for r in loc["replay_inexact"]))
    return out


def digest_reason(r: Node, o: Node) -> str:
    """What the statistics say about two nodes whose bytes differ."""
    rs, os_ = r.stats or {}, o.stats or {}
    parts = [f"{k} ref {rs.get(k)} ours {os_.get(k)}" for k in ("nan", "inf") if rs.get(k) != os_.get(k)]
    if rs.get("sumsq") and os_.get("sumsq") is not None:
        parts.append(f"sum of squares ref {rs['sumsq']:.6g} ours {os_['sumsq']:.6g}")
    return "bytes differ (digest; values not kept, raise --max-data to see them)" + (
        ": " + ", ".join(parts) if parts else "")


def exit_code(results: Sequence[DiffResult]) -> int:
    """0 when every pair is identical, 1 on any divergence."""
    return 0 if all(r.identical for r in results) else 1

# ---- helpers ----------------------------------------------------------------------------------

def fmt_value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, str, type(None))) else str(v)


def _fmt_op_params(op: str, a: list[int], b: list[int]) -> str:
    """op_params of a changed pair, decoded (eps, scales, modes) when graphgen.compare.opparams is there,
    else the raw int32 slots."""
    raw = f"op_params: {fmt_value(a)} -> {fmt_value(b)}"
    try:
        from .opparams import format_op_params
        da, db = format_op_params(op, list(a)), format_op_params(op, list(b))
    except Exception:  # noqa: BLE001 - absent or failing: the raw slots still say what differs
        return raw
    # a difference the decoding does not show (a slot outside the op's layout) keeps the raw ints
    return raw if da == db else f"op_params: {da or '(none)'} -> {db or '(none)'}"


def _json_float(v: float | None) -> float | str | None:
    # JSON has no NaN/Inf; spell them out rather than emit invalid JSON.
    if v is None or math.isfinite(v):
        return v
    return str(v)


def source_indices(nodes: list[Node]) -> list[list[int | None]]:
    """For each node, its sources (src slots then view_src) as indices of earlier nodes.

    A name resolves to the latest earlier node carrying it (names repeat, e.g. "Qcur-0" before and
    after RoPE); None means a leaf (weight, input, cache) or an empty slot.
    """
    latest: dict[str, int] = {}
    out = []
    for node in nodes:
        names = list(node.src) + [node.view_src or ""]
        out.append([latest.get(s) if s else None for s in names])
        latest[node.name] = node.index
    return out


def _json_row(row: Any) -> Any:
    """A report row with every float JSON cannot spell (NaN, Inf), however deep, as its string."""
    if isinstance(row, dict):
        return {k: _json_row(v) for k, v in row.items()}
    if isinstance(row, (list, tuple)):
        return [_json_row(v) for v in row]
    return _json_float(row) if isinstance(row, float) else row


def _bar(nmse: float | None) -> str:
    # one '#' per decade above 1e-16, so a strip shows at a glance where the error grows
    if not nmse:
        return ""
    if not math.isfinite(nmse):
        return "#" * 16 + "!"
    return "#" * max(1, min(16, int(math.log10(nmse)) + 17))


def _strip_line(r: dict[str, Any]) -> str:
    name = "global" if r["layer"] == "global" else f"layer {r['layer']}"
    worst = r.get("worst")
    at = f" at #{worst['ref_index']} '{worst['name']}'" if worst else ""
    nm = "-" if r["max_nmse"] is None else f"{r['max_nmse']:.3g}"
    return (f"{name:<10} {r['nodes']:>5} nodes {r['compared']:>5} compared {r['failed']:>4} failed "
            f"{r['changed']:>3} changed  max nmse {nm:<9} {_bar(r['max_nmse']):<17}{at}")


def layer_strip(R: list[Node], numeric: list[NumericResult], structural: list[Difference]) -> list[dict[str, Any]]:
    """One row per layer in the order layers first appear in ref (nodes outside any layer in a
    'global' row): its nodes, how many were compared and failed, structural changes, and the
    largest NMSE with the node that has it."""
    layer_of = node_layers(R)
    rows: dict[Any, dict[str, Any]] = {}
    for node, il in zip(R, layer_of):
        key = "global" if il is None else il
        row = rows.setdefault(key, {"layer": key, "nodes": 0, "compared": 0, "failed": 0, "changed": 0,
                                    "max_nmse": None, "worst": None})
        row["nodes"] += 1
    for d in structural:
        if d.ref_index is not None:
            il = layer_of[d.ref_index]
            rows["global" if il is None else il]["changed"] += 1
    for res in numeric:
        row = rows["global" if layer_of[res.ref_index] is None else layer_of[res.ref_index]]
        row["compared"] += 1
        row["failed"] += not res.ok
        nm = math.inf if math.isnan(res.nmse) else res.nmse
        if nm > 0 and (row["max_nmse"] is None or nm > row["max_nmse"]):
            row["max_nmse"] = nm
            row["worst"] = {"ref_index": res.ref_index, "name": res.name}
    for row in rows.values():
        if row["max_nmse"] is None and row["compared"]:
            row["max_nmse"] = 0.0
    return list(rows.values())

SIMD_FEATURES = ("AVX", "AVX2", "AVX512", "F16C", "FMA", "BMI2", "LLAMAFILE", "NEON", "SVE")


def describe_build(d) -> str:
    """Which engine, ggml and CPU kernels computed a dump,
    e.g. 'graphgen 0.1.0 on ggml 0.27.0 (/path/to/libs) [AVX AVX2 F16C FMA LLAMAFILE]'; for an
    import only what its format tells, e.g. 'llama.cpp eval-callback text (imported; build, ggml
    and CPU features not recorded)'."""
    src = d.source or {}
    fmt = import_format(d)
    if fmt:
        return (f"{src.get('engine', 'llama.cpp')} {FORMAT_LABELS.get(fmt, fmt)} "
                "(imported; build, ggml and CPU features not recorded)")
    feats = " ".join(f for f in SIMD_FEATURES if d.cpu_features.get(f))
    where = src.get("ggml_dir") or src.get("llama_dir")
    ggml = f" on ggml {src['ggml']}" + (f" ({where})" if where else "") if src.get("ggml") else ""
    return f"{src.get('engine', '?')} {src.get('version', '?')}{ggml} [{feats or 'no SIMD features'}]"


def fmt_feature(v: bool | None) -> str:
    return "absent" if v is None else str(v).lower()

