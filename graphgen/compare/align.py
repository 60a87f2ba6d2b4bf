"""Aligning two graphs' node sequences: difflib on (name, op) with automatic names (`node_12`,
`leaf_3`, also inside derived names) equal to each other, since one inserted node renumbers every
later one; each region it cannot match resolved by a small edit-distance search that pairs nodes
of the same name (or op) as changed, leaves the rest inserted or deleted, and lets the rules
explain runs of nodes."""

from __future__ import annotations

import difflib
import math
from typing import Any, Sequence

from ..dump.format import Node
from .rules import Pattern, Rule, normalize_name


MAX_DP_CELLS = 250_000     # larger unmatched regions fall back to a name-only alignment


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


def align_nodes(R: list[Node], O: list[Node], rules: Sequence[Rule]) -> list[tuple]:
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


