"""graph-diff: compare two graphgen-dump/1 dumps node for node.

Structure: the two node sequences are aligned on (name, op) with difflib, with automatic names
(`node_12`, `leaf_3`, also inside derived names such as "node_3 (view)") treated as equal to each
other, since one inserted node renumbers every later one. Each region the alignment cannot match
is resolved by a small edit-distance search that pairs nodes of the same name (or op) as
"changed", leaves the rest "inserted"/"deleted", and lets equivalence rules explain runs of nodes
(one fused op in ref = a chain of ops in ours; a rule with one empty side marks pass-through
nodes such as an extra CONT). Aligned pairs are compared field by field; an automatic-name
difference alone is never reported, and sources are compared by what they resolve to (the
aligned node, or for a rule's run its last node), not by spelling. A rule forgives only the
field differences it declares in `explains` (see `Rule`); any other difference inside its run
is reported as "changed".

Values: aligned nodes stored on both sides are compared with the NMSE of llama.cpp's
test-backend-ops, sum((a-b)^2) / sum(a^2) with a = ref; NaN and Inf positions must agree.

One module of about 1,300 lines: the alignment, the per-node comparison, the rules and the
report share the pairing of nodes and its result types; split, each part would pass them all to the
next.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from graphgen.dump import N_OP_PARAMS, Dump, DumpError, Node, dump_files, load_dump
from graphgen.importers import FORMAT_LABELS, SCHED_UNSEEN_WHY, VIEW_OPS, common_fields, import_file, import_format
from graphgen.printed import compare_node, side_of
from graphgen.layers import node_layers
from graphgen.nodefilter import FilterError, NodeFilter
from graphgen.probe import ProbeError, Target, find_pairs, format_probe, largest_errors, probe

DEFAULT_NMSE = {"f32": 1e-7, "f16": 1e-7, "bf16": 1e-7, "i32": 0, "i64": 0}
EXACT_TYPES = frozenset({"i8", "i16", "i32", "i64"})  # integers always compare exactly
CONTEXT = 3                # nodes shown before/after the first divergence
MAX_DP_CELLS = 250_000     # larger unmatched regions fall back to a name-only alignment
MAX_LISTED = 20            # differences listed in the text report

_AUTO_NAME = re.compile(r"\b(node|leaf)_\d+\b")


def normalize_name(name: str) -> str:
    """`node_12 (view)` -> `node_# (view)`: ggml's automatic names shift when nodes are inserted."""
    return _AUTO_NAME.sub(r"\1_#", name)


# ---- equivalence rules ------------------------------------------------------------------------

class RulesError(Exception):
    """A malformed rules file; the message is one line naming the file and the rule."""


@dataclass(frozen=True)
class Pattern:
    op: str
    name: re.Pattern | None = None  # matched against the whole node name

    def matches(self, node: Node) -> bool:
        return node.op == self.op and (self.name is None or self.name.fullmatch(node.name) is not None)


# Node fields a rule may declare in "explains"; op_params slots also as "op_params[k]" or
# "op_params[a:b]" (half-open, as in Python).
EXPLAINABLE = ("name", "op", "type", "ne", "src", "view_src", "view_offs", "op_params")
_SLOTS = re.compile(r"op_params\[(\d+)(?::(\d+))?\]")


@dataclass(frozen=True)
class Rule:
    """Runs `ref` and `ours` (consecutive nodes matching the patterns) stand for each other.

    What a match forgives:
    - Structure: the run's nodes are not reported as inserted/deleted, and their count and ops
      need no other justification (each pattern names its node's op, so an op difference between
      the runs' paired nodes is part of the rule; listing "op" is allowed and changes nothing).
    - A one-sided rule (an empty side) marks pass-through nodes: consumers read through them to
      their first source. Nothing is paired, so it cannot declare `explains`.
    - A two-sided rule pairs one node on each side: the last node of each run (its output). The
      pair's fields are compared as for any aligned pair, except that for a run of more than one
      node "src" means the run's inputs: the sources, in order and without repeats, that its
      nodes read from outside the run (inner nodes read each other, so their slots cannot line
      up); and a view_src inside the run matches one inside the other run. Inner nodes are not
      compared field by field; the output's values still are (when the names agree).
    - Of the pair's field differences, only those named in `explains` (`fields`, and op_params
      slots in `op_params_slots`) are forgiven, plus a name difference when both output
      patterns give a name regex. Any other difference is reported as "changed", and that pair
      is not counted among the rule's explained nodes.
    """
    name: str
    reason: str
    ref: tuple[Pattern, ...]
    ours: tuple[Pattern, ...]
    fields: frozenset[str] = frozenset()            # whole fields from EXPLAINABLE, op_params aside
    op_params_slots: frozenset[int] = frozenset()   # op_params indices whose difference is forgiven

    def unexplained(self, fields: dict[str, tuple[Any, Any]], r: Node, o: Node) -> dict[str, tuple[Any, Any]]:
        """The differences of its output pair (r, o) that this rule does not declare."""
        out = {}
        for f, v in fields.items():
            if f in self.fields or f == "op":
                continue
            if f == "name" and self.ref[-1].name is not None and self.ours[-1].name is not None:
                continue
            if f == "op_params" and all(
                    a == b for k, (a, b) in enumerate(zip_longest(r.op_params, o.op_params, fillvalue=0))
                    if k not in self.op_params_slots):
                continue
            out[f] = v
        return out


def _parse_pattern(p: Any, where: str) -> Pattern:
    if isinstance(p, str) and p:
        return Pattern(p)
    if not isinstance(p, dict):
        raise RulesError(f"{where}: expected an op name or {{\"op\": ..., \"name\": regex}}, got {p!r}")
    unknown = set(p) - {"op", "name"}
    if unknown:
        raise RulesError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    op = p.get("op")
    if not isinstance(op, str) or not op:
        raise RulesError(f"{where}: 'op' must be a non-empty string")
    name = p.get("name")
    if name is None:
        return Pattern(op)
    if not isinstance(name, str):
        raise RulesError(f"{where}: 'name' must be a regular expression string")
    try:
        return Pattern(op, re.compile(name))
    except re.error as e:
        raise RulesError(f"{where}: bad 'name' regex {name!r}: {e}") from None


def _parse_explains(v: Any, at: str) -> tuple[frozenset[str], frozenset[int]]:
    if not isinstance(v, list):
        raise RulesError(f"{at}: 'explains' must be a list of field names")
    fields: set[str] = set()
    slots: set[int] = set()
    for k, e in enumerate(v):
        bad = f"{at}: explains[{k}] {e!r}:"
        if e == "op_params":
            slots.update(range(N_OP_PARAMS))
        elif isinstance(e, str) and e in EXPLAINABLE:
            fields.add(e)
        elif isinstance(e, str) and (m := _SLOTS.fullmatch(e)):
            a = int(m[1])
            b = int(m[2]) if m[2] is not None else a + 1
            if not a < b <= N_OP_PARAMS:
                raise RulesError(f"{bad} op_params slots run from 0 to {N_OP_PARAMS - 1}, "
                                 "and a range [a:b] needs a < b")
            slots.update(range(a, b))
        else:
            raise RulesError(f"{bad} expected one of {', '.join(EXPLAINABLE)}, "
                             "op_params[k] or op_params[a:b]")
    return frozenset(fields), frozenset(slots)


def parse_rules(doc: Any, where: str = "rules") -> list[Rule]:
    """Validate a decoded rules document `{"rules": [{name, reason, ref, ours, explains?}, ...]}`;
    see `Rule` for what a rule forgives and `EXPLAINABLE` for what `explains` may list."""
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), list):
        raise RulesError(f"{where}: expected an object with a list 'rules'")
    rules: list[Rule] = []
    for k, r in enumerate(doc["rules"]):
        at = f"{where}: rules[{k}]"
        if not isinstance(r, dict):
            raise RulesError(f"{at}: expected an object")
        name = r.get("name")
        if not isinstance(name, str) or not name:
            raise RulesError(f"{at}: 'name' must be a non-empty string")
        at = f"{where}: rule '{name}'"
        unknown = set(r) - {"name", "reason", "ref", "ours", "explains"}
        if unknown:
            raise RulesError(f"{at}: unknown key(s) {', '.join(sorted(unknown))}")
        if not isinstance(r.get("reason"), str):
            raise RulesError(f"{at}: 'reason' must be a string")
        sides = {}
        for side in ("ref", "ours"):
            pats = r.get(side)
            if not isinstance(pats, list):
                raise RulesError(f"{at}: '{side}' must be a list of patterns")
            sides[side] = tuple(_parse_pattern(p, f"{at}: {side}[{j}]") for j, p in enumerate(pats))
        if not sides["ref"] and not sides["ours"]:
            raise RulesError(f"{at}: 'ref' and 'ours' are both empty")
        if any(x.name == name for x in rules):
            raise RulesError(f"{at}: duplicate rule name")
        fields, slots = frozenset(), frozenset()
        if "explains" in r:
            if not sides["ref"] or not sides["ours"]:
                raise RulesError(f"{at}: 'explains' needs nodes on both sides (a one-sided rule pairs none)")
            fields, slots = _parse_explains(r["explains"], at)
        rules.append(Rule(name, r["reason"], sides["ref"], sides["ours"], fields, slots))
    return rules


def load_rules(path: str | os.PathLike) -> list[Rule]:
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RulesError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RulesError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    except json.JSONDecodeError as e:
        raise RulesError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    return parse_rules(doc, str(path))


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
        changes = "; ".join(_fmt_op_params(self.op, a, b) if f == "op_params" else f"{f}: {_fmt(a)} -> {_fmt(b)}"
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
                "reason": self.reason, "by_digest": self.by_digest, "worst": worst}


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
                "selection": self.selection}

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
        if self.layers and (self.show_layers or any(r["max_nmse"] for r in self.layers)):
            out += ["", "per layer (where the error grows):"]
            out += [f"  {_strip_line(r)}" for r in self.layers]
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
        return "\n".join(out)


def _digest_reason(r: Node, o: Node) -> str:
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

def _fmt(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, str, type(None))) else str(v)


def _fmt_op_params(op: str, a: list[int], b: list[int]) -> str:
    """op_params of a changed pair, decoded (eps, scales, modes) when graphgen.opparams is there,
    else the raw int32 slots."""
    raw = f"op_params: {_fmt(a)} -> {_fmt(b)}"
    try:
        from graphgen.opparams import format_op_params
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


def _resolve_sources(nodes: list[Node]) -> list[list[int | None]]:
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


def _layer_strip(R: list[Node], numeric: list[NumericResult], structural: list[Difference]) -> list[dict[str, Any]]:
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


def _thresholds(nmse: float | dict[str, float] | None, per_op: dict[str, float] | None = None):
    table = dict(DEFAULT_NMSE)
    fallback = DEFAULT_NMSE["f32"]
    if isinstance(nmse, (int, float)) and not isinstance(nmse, bool):
        fallback = float(nmse)
        table = {t: (v if t in EXACT_TYPES else fallback) for t, v in table.items()}
    elif isinstance(nmse, dict):
        table.update(nmse)
        fallback = table.get("f32", fallback)
    elif nmse is not None:
        raise TypeError(f"nmse must be a float or a dict of type -> float, got {nmse!r}")

    per_op = dict(per_op or {})
    if "default" in per_op:
        fallback = per_op["default"]
        table = {t: (v if t in EXACT_TYPES else fallback) for t, v in table.items()}

    def threshold(typ: str, op: str = "") -> float:
        # an integer node (indices, positions, argmax) is right or wrong: no threshold loosens it
        if typ in EXACT_TYPES:
            return 0.0
        if op in per_op:
            return per_op[op]
        if typ in per_op:
            return per_op[typ]
        return float(table[typ]) if typ in table else fallback
    return threshold


def compare_values(a: np.ndarray, b: np.ndarray) -> tuple[float, float, str | None]:
    """(nmse, max abs error, reason) with a = ref; reason is set when NaN/Inf positions disagree.

    NMSE is taken over the positions finite on both sides, as test-backend-ops does after its
    NaN/Inf check.
    """
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    reason = None
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    bad = (nan_a != nan_b) | (inf_a != inf_b) | (inf_a & inf_b & (np.signbit(a) != np.signbit(b)))
    if bad.any():
        k = int(np.argmax(bad))
        reason = f"NaN/Inf positions differ ({int(bad.sum())} elements, first at {k}: {a[k]} vs {b[k]})"
    fin = np.isfinite(a) & np.isfinite(b)
    d = a[fin] - b[fin]
    err = float(np.dot(d, d))
    ref = float(np.dot(a[fin], a[fin]))
    nmse = err / ref if ref > 0 else err
    max_abs = float(np.abs(d).max()) if d.size else 0.0
    return nmse, max_abs, reason


# ---- alignment --------------------------------------------------------------------------------

# Steps, in order: ("pair", i, j), ("del", i, j), ("ins", i, j), ("rule", rule, i0, i1, j0, j1).
# For "del" j is the ours position at that point, for "ins" i is the ref position.

def _pair_cost(r: Node, o: Node) -> float:
    # Below 2 (= delete + insert) means "worth reporting as one changed node".
    same_name = normalize_name(r.name) == normalize_name(o.name)
    if same_name and r.op == o.op:
        return 0.0
    if same_name:
        return 0.5
    if r.op == o.op:
        return 1.0
    return math.inf


def _match_runs(nodes: list[Node], lo: int, hi: int, pats: tuple[Pattern, ...]) -> list[bool]:
    """ok[k]: nodes[lo+k : lo+k+len(pats)] lies within [lo, hi) and matches pats."""
    n = len(pats)
    return [lo + k + n <= hi and all(p.matches(nodes[lo + k + t]) for t, p in enumerate(pats))
            for k in range(hi - lo + 1)]


def _align_region(R: list[Node], O: list[Node], i0: int, i1: int, j0: int, j1: int,
                  rules: Sequence[Rule]) -> list[tuple]:
    n, m = i1 - i0, j1 - j0
    if (n + 1) * (m + 1) > MAX_DP_CELLS:
        # Too big for the edit-distance search: pair equal names, the rest is inserted/deleted.
        steps: list[tuple] = []
        sm = difflib.SequenceMatcher(None, [normalize_name(x.name) for x in R[i0:i1]],
                                     [normalize_name(x.name) for x in O[j0:j1]], autojunk=False)
        for tag, a1, a2, b1, b2 in sm.get_opcodes():
            if tag == "equal":
                steps += [("pair", i0 + a1 + k, j0 + b1 + k) for k in range(a2 - a1)]
            else:
                steps += [("del", i0 + k, j0 + b1) for k in range(a1, a2)]
                steps += [("ins", i0 + a2, j0 + k) for k in range(b1, b2)]
        return steps

    ref_ok = [_match_runs(R, i0, i1, r.ref) for r in rules]
    ours_ok = [_match_runs(O, j0, j1, r.ours) for r in rules]
    # cost[i][j]: cheapest explanation of R[i0+i:i1] against O[j0+j:j1]; ties prefer the
    # earlier choice, so a rule wins over an equally cheap plain pairing.
    inf = math.inf
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    choice: list[list[Any]] = [[None] * (m + 1) for _ in range(n + 1)]
    cost[n][m] = 0.0
    for i in range(n, -1, -1):
        for j in range(m, -1, -1):
            if i == n and j == m:
                continue
            best, ch = inf, None
            for k, rule in enumerate(rules):
                lr, lo = len(rule.ref), len(rule.ours)
                if ref_ok[k][i] and ours_ok[k][j] and cost[i + lr][j + lo] < best:
                    best, ch = cost[i + lr][j + lo], ("rule", k)
            if i < n and j < m:
                c = _pair_cost(R[i0 + i], O[j0 + j]) + cost[i + 1][j + 1]
                if c < best:
                    best, ch = c, ("pair",)
            if i < n and 1 + cost[i + 1][j] < best:
                best, ch = 1 + cost[i + 1][j], ("del",)
            if j < m and 1 + cost[i][j + 1] < best:
                best, ch = 1 + cost[i][j + 1], ("ins",)
            cost[i][j], choice[i][j] = best, ch

    steps = []
    i = j = 0
    while (i, j) != (n, m):
        ch = choice[i][j]
        if ch[0] == "rule":
            rule = rules[ch[1]]
            steps.append(("rule", rule, i0 + i, i0 + i + len(rule.ref), j0 + j, j0 + j + len(rule.ours)))
            i, j = i + len(rule.ref), j + len(rule.ours)
        elif ch[0] == "pair":
            steps.append(("pair", i0 + i, j0 + j))
            i, j = i + 1, j + 1
        elif ch[0] == "del":
            steps.append(("del", i0 + i, j0 + j))
            i += 1
        else:
            steps.append(("ins", i0 + i, j0 + j))
            j += 1
    return steps


def _align(R: list[Node], O: list[Node], rules: Sequence[Rule]) -> list[tuple]:
    key = lambda x: (normalize_name(x.name), x.op)  # noqa: E731
    sm = difflib.SequenceMatcher(None, [key(x) for x in R], [key(x) for x in O], autojunk=False)
    # Segments: single matched pairs, or unmatched regions (i1, i2, j1, j2).
    segs: list[tuple] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            segs += [("eq", i1 + k, j1 + k) for k in range(i2 - i1)]
        else:
            segs.append(("diff", i1, i2, j1, j2))

    # A rule's run may straddle a region's edge (a fused op and the last node of its chain can
    # share name and op), so each region also takes in up to `reach` matched pairs either side.
    # A pair uses a node of each side, so a run holds at most min(len(ref), len(ours)) pairs:
    # long unfused chains against one fused node keep regions small.
    reach = max((min(len(r.ref), len(r.ours)) for r in rules), default=0)
    # a one-node-for-one-node rule explains a matched pair's field difference (e.g. an op that
    # returns a view in one ggml and a new tensor in the other): such pairs go to the search too
    unit = [r for r in rules if len(r.ref) == 1 and len(r.ours) == 1]
    absorbed = [False] * len(segs)
    for s, seg in enumerate(segs):
        if seg[0] == "eq" and any(r.ref[0].matches(R[seg[1]]) and r.ours[0].matches(O[seg[2]]) for r in unit):
            absorbed[s] = True
    for s, seg in enumerate(segs):
        if seg[0] == "diff":
            for t in range(max(0, s - reach), min(len(segs), s + reach + 1)):
                absorbed[t] = True

    steps: list[tuple] = []
    s = 0
    while s < len(segs):
        if not absorbed[s]:
            steps.append(("pair", segs[s][1], segs[s][2]))
            s += 1
            continue
        t = s
        while t < len(segs) and absorbed[t]:
            t += 1
        first, last = segs[s], segs[t - 1]
        i0, j0 = (first[1], first[2]) if first[0] == "eq" else (first[1], first[3])
        i1, j1 = (last[1] + 1, last[2] + 1) if last[0] == "eq" else (last[2], last[4])
        steps += _align_region(R, O, i0, i1, j0, j1, rules)
        s = t
    return steps


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
        self.nodes, self.res, self.passthrough = nodes, _resolve_sources(nodes), passthrough

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
               at: Sequence[Target] = ()) -> DiffResult:
    """Compare two dumps; `rules` is a list of Rule or the path of a rules file.

    When either side is imported (structure only), both are first cut down to the fields every
    import involved shows, and a note says so. `on_values(done, total)` follows the value
    comparison, the slow part of a large graph. `select` keeps the comparison to the nodes it
    selects (on either side); `per_op` bounds NMSE per op or type (graphgen.nodefilter); `at`
    names nodes to probe (graphgen.probe)."""
    if isinstance(rules, (str, os.PathLike)):
        rules = load_rules(rules)
    rules = list(rules or ())
    full_ref, full_ours = ref, ours
    ref, ours, cut_note = common_fields(ref, ours)
    threshold = _thresholds(nmse, per_op)
    select = select or NodeFilter()
    R, O = ref.nodes, ours.nodes
    steps = _align(R, O, rules)

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
                                             None if same else _digest_reason(r, o), by_digest=True, op=r.op))
            else:
                why = " and ".join(side for side, n, v in (("ref", r, a), ("ours", o, b))
                                   if v is None and not n.digest)
                not_compared.append((i, j, r.name, f"no values or digest in {why}"))

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
    }
    # first_divergence is the earlier of the two below (kept for readers of older reports)
    return DiffResult(ref_path=str(ref.path), ours_path=str(ours.path), graph=ref.graph,
                      identical=(not structural and not fails and not not_compared and not settings_differ
                                 and not unseen),
                      nothing_selected=nothing_selected,
                      settings_differ=settings_differ, unseen=unseen, structural=structural,
                      numeric=numeric, not_compared=not_compared,
                      first_divergence=first, first_structural=first_s, first_value=first_v,
                      layers=_layer_strip(R, numeric, structural), probes=probes, selection=selection,
                      rules_fired=dict(Counter(e.rule for e in explained)),
                      explained=explained, notes=notes, summary=summary,
                      builds={"ref": describe_build(ref), "ours": describe_build(ours)},
                      warnings=warnings, provenance=provenance)


def _build_notes(ref: Dump, ours: Dump) -> list[str]:
    """What differs in how the two sides were computed (CPU kernels, ggml, settings)."""
    imported = [(side, import_format(d)) for side, d in (("ref", ref), ("ours", ours)) if import_format(d)]
    if imported:
        # an import records no build: say what cannot be checked rather than compare placeholders
        return [f"{side}: an imported {FORMAT_LABELS[f]} records no build (ggml version, CPU features), so "
                "last-bit value differences cannot be told from another build's kernels" for side, f in imported]
    notes = []
    feats = sorted(set(ref.cpu_features) | set(ours.cpu_features))
    differ = [f"{f} ref={_fmt_feat(ref.cpu_features.get(f))} ours={_fmt_feat(ours.cpu_features.get(f))}"
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
    return [f"{k} ref={_fmt(ref.settings[k])} ours={_fmt(ours.settings[k])}"
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


def _fmt_feat(v: bool | None) -> str:
    return "absent" if v is None else str(v).lower()


def _unpaired(dump: Dump, side: str, why: str) -> DiffResult:
    path = str(dump.path)
    return DiffResult(ref_path=path if side == "ref" else None, ours_path=path if side == "ours" else None,
                      graph=dump.graph, identical=False, unpaired=side, notes=[why])


def _is_dump_json(path: Path) -> bool:
    # told from other JSON by its "format" key near the top, without parsing the whole file
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return '"format"' in f.read(200)
    except OSError:
        return False


def load_side(path: str | os.PathLike) -> list[Dump]:
    """The graphs of one side of a diff: a dump folder, a dump file, or a file the importers read
    (eval-callback text, a ggml dot file, a GGML_SCHED_DEBUG log; structure only)."""
    path = Path(path)
    if not path.exists():
        raise DumpError(f"{path}: no such file or folder")
    if path.is_dir():
        return [load_dump(p) for p in dump_files(path)]
    if path.suffix == ".json":
        if not _is_dump_json(path):  # no importer reads JSON
            raise DumpError(f"{path}: not a graphgen dump (no \"format\": \"graphgen-dump/1\" key)")
        return [load_dump(path)]
    return import_file(path)


def _step_label(dumps: list[Dump]) -> list[tuple[str, int]]:
    """(kind, step) of each graph: its kind and its place among the graphs of that kind."""
    seen: Counter = Counter()
    out = []
    for d in dumps:
        out.append((d.graph, seen[d.graph]))
        seen[d.graph] += 1
    return out


def _describe_graph(d: Dump, kind_step: tuple[str, int]) -> str:
    return f"{d.path.name} ({kind_step[0]} #{kind_step[1]})"


def pair_graphs(refs: list[Dump], ours: list[Dump], single: bool = False
                ) -> tuple[list[tuple[Dump, Dump]], list[Dump], list[Dump]]:
    """Pair the graphs of two sides by kind (inject, block, encoder) and step (their order within
    that kind): the second block of ref goes with the second block of ours, whatever the
    evaluations around them. Returns (pairs in ref's order, ref graphs without a partner, ours
    graphs without a partner). With `single`, two one-graph sides pair whatever their kinds (the
    user picked both)."""
    if single and len(refs) == 1 and len(ours) == 1:
        return [(refs[0], ours[0])], [], []
    ours_at = {key: d for key, d in zip(_step_label(ours), ours)}
    pairs, lone_ref, used = [], [], set()
    for key, d in zip(_step_label(refs), refs):
        o = ours_at.get(key)
        if o is None:
            lone_ref.append(d)
        else:
            pairs.append((d, o))
            used.add(key)
    lone_ours = [d for key, d in zip(_step_label(ours), ours) if key not in used]
    return pairs, lone_ref, lone_ours


def diff_paths(ref_path: str | os.PathLike, ours_path: str | os.PathLike,
               nmse: float | dict[str, float] | None = None,
               rules_path: str | os.PathLike | None = None, progress=None,
               select: NodeFilter | None = None, per_op: dict[str, float] | None = None,
               at: Sequence[Target] = (), show_layers: bool = False) -> list[DiffResult]:
    """Diff two sides, each a dump folder, a dump file or an importable file (see `load_side`).

    Graphs are paired by kind and step (`pair_graphs`); a graph without a partner gives a result
    that says so and fails, except that when one side is a single file the other side's remaining
    graphs are only named in a note (one graph was asked for). An imported side is compared on
    the fields its format shows (`graphgen.importers.common_fields`). `progress(k, n, name,
    detail)` is called as the work goes on: graph k of n, the files' names, how far its values are."""
    ref_path, ours_path = Path(ref_path), Path(ours_path)
    for p in (ref_path, ours_path):
        if not p.exists():
            raise DumpError(f"{p}: no such file or folder")
    rules = load_rules(rules_path) if rules_path is not None else []
    refs, ours = load_side(ref_path), load_side(ours_path)
    # a side that is one file holding one graph: the user asked about that graph alone
    single_ref = not ref_path.is_dir() and len(refs) == 1
    single_ours = not ours_path.is_dir() and len(ours) == 1
    pairs, lone_ref, lone_ours = pair_graphs(refs, ours, single=single_ref and single_ours)
    ref_keys = dict(zip(map(id, refs), _step_label(refs)))
    ours_keys = dict(zip(map(id, ours), _step_label(ours)))

    # results in ref's order, a graph without a partner where it would have been compared
    place = {id(d): k for k, d in enumerate(refs)}
    place.update({id(d): len(refs) + k for k, d in enumerate(ours)})
    placed: list[tuple[int, DiffResult]] = []
    skipped = []  # graphs of a folder left out because the other side is one file
    for side, lone, keys, other_single, other in (("ref", lone_ref, ref_keys, single_ours, ours_path),
                                                  ("ours", lone_ours, ours_keys, single_ref, ref_path)):
        for d in lone:
            label = _describe_graph(d, keys[id(d)])
            if other_single and pairs:
                skipped.append(f"{side} {label}")
            else:
                placed.append((place[id(d)], _unpaired(d, side, f"{side} {label} has no partner in {other} "
                                                               "(graphs pair by kind and step)")))
    n = len(pairs)
    for k, (r, o) in enumerate(pairs):
        if progress is not None:
            progress(k + 1, n, f"{r.path.name} / {o.path.name}", "")

        def on_values(done, total, k=k, r=r, o=o):
            progress(k + 1, n, f"{r.path.name} / {o.path.name}", f"values {done}/{total}")
        try:
            res = diff_dumps(r, o, nmse, rules, on_values=on_values if progress is not None else None,
                             select=select, per_op=per_op, at=at)
        finally:
            r.close()
            o.close()
        res.show_layers = show_layers
        if skipped:
            res.notes.append(f"not compared, the other side being one graph: {', '.join(skipped)}")
        placed.append((place[id(r)], res))
    results = [res for _, res in sorted(placed, key=lambda x: x[0])]
    for target in at:
        if not any(p["name"] == target.name if target.name is not None else
                   p[f"{target.side}_index"] == target.index for res in results for p in res.probes):
            raise ProbeError(f"--at {target.text}: no such node in "
                             + ("either side" if target.name is not None else target.side))
    if select is not None and select.active and results and all(r.nothing_selected or r.unpaired for r in results):
        raise FilterError(f"{select}: selects no node of any graph compared")
    return results

