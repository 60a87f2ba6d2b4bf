#!/usr/bin/env python3
"""The floors of graphgen/: which package imports which, and whether any import runs back up.

A group is a package under graphgen/ or a module at its root. Every import statement counts, at
module level or inside a function. The groups are stacked by their imports (a group sits one floor
above the highest group it imports); an import that closes a circle between groups climbs back up,
and modules that import each other form a circle even inside one package. Prints the floors, the
five largest modules, and every climbing import and circle; exits 1 when there is one.

    python tools/layers.py            # the floors; exit 1 on a climbing import or a circle
    python tools/layers.py --edges    # and what each group imports
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in sorted((root / "graphgen").rglob("*.py")):
        name = ".".join(p.relative_to(root).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the graphgen modules it imports (a `from pkg import mod` names the module)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            edges[m].update(n for n in names if n in mods and n != m)
    return edges


def circles(nodes, edges) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(edges[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "graphgen"


def analyse(root: Path = ROOT) -> dict:
    mods = modules(root)
    edges = imports(mods)
    groups: dict[str, set[str]] = {}
    for m, targets in edges.items():
        g = group(m)
        if g == "graphgen":   # the package's __init__ (its version) is below everything
            continue
        groups.setdefault(g, set()).update(group(t) for t in targets if group(t) not in (g, "graphgen"))
    group_circles = circles(sorted(groups), groups)
    in_circle = {g: i for i, c in enumerate(group_circles) for g in c}
    climbing = sorted((m, t) for m, ts in edges.items() for t in ts
                      if group(m) != group(t) and group(m) in in_circle
                      and in_circle.get(group(t)) == in_circle[group(m)])
    floor: dict[str, int] = {}

    def height(g, seen=()):
        if g not in floor:
            below = [height(h, seen + (g,)) for h in groups[g] if h not in seen]
            floor[g] = 1 + max(below) if below else 0
        return floor[g]
    for g in groups:
        height(g)
    sizes = sorted(((len(p.read_text().splitlines()), m) for m, p in mods.items()), reverse=True)
    return {"modules": len(mods), "groups": groups, "floors": floor, "climbing": climbing,
            "circles": circles(sorted(mods), edges), "group_circles": group_circles, "largest": sizes[:5]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edges", action="store_true", help="also print what each group imports")
    args = ap.parse_args(argv)
    a = analyse()
    by_floor: dict[int, list[str]] = {}
    for g, f in a["floors"].items():
        by_floor.setdefault(f, []).append(g)
    print(f"{a['modules']} modules in {len(a['groups'])} groups on {len(by_floor)} floors")
    for f in sorted(by_floor, reverse=True):
        print(f"  {f:2d}  {', '.join(sorted(by_floor[f]))}")
    if args.edges:
        for g in sorted(a["groups"]):
            print(f"  {g} -> {', '.join(sorted(a['groups'][g])) or '-'}")
    print("largest: " + ", ".join(f"{m} ({n})" for n, m in a["largest"]))
    for m, t in a["climbing"]:
        print(f"climbs back up: {m} imports {t}")
    for c in a["circles"]:
        print(f"circle: {' <-> '.join(c)}")
    bad = bool(a["climbing"] or a["circles"])
    print("FAIL" if bad else "no import climbs back up, no circle")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
