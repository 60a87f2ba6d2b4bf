"""Equivalence rules for graph-diff: a run of nodes on one side that stands for a run on the other
(one fused op in ref = a chain of ops in ours; a rule with one empty side marks pass-through nodes
such as an extra CONT), and the node fields each rule may forgive (`explains`). Parsed from JSON,
each error naming the rule and field."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

from ..dump.format import N_OP_PARAMS, Node


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

