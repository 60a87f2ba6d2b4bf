"""DOT and SVG: clusters per layer, colours by op kind (or diff status), leaves drawn small."""

from __future__ import annotations

import shutil
import subprocess

import networkx as nx

from graphgen.dump.format import Node
from graphgen.compare.opparams import format_op_params

from . import graph as V
from .diffmap import STATUS_COLOURS

OP_KINDS = {
    "matmul": ({"MUL_MAT", "MUL_MAT_ID", "OUT_PROD"}, "#bbdefb"),
    "attention": ({"FLASH_ATTN_EXT", "SOFT_MAX", "SOFT_MAX_BACK"}, "#d1c4e9"),
    "norm": ({"RMS_NORM", "NORM", "L2_NORM", "GROUP_NORM"}, "#fff9c4"),
    "rope": ({"ROPE", "ROPE_BACK"}, "#f8bbd0"),
    "activation": ({"SILU", "GELU", "GELU_QUICK", "GELU_ERF", "RELU", "SIGMOID", "TANH", "EXP",
                    "SWIGLU", "SWIGLU_OAI", "GEGLU", "REGLU", "GEGLU_ERF", "GEGLU_QUICK", "SOFTPLUS",
                    "UNARY", "GLU"}, "#ffe0b2"),
    "elementwise": ({"ADD", "ADD1", "SUB", "MUL", "DIV", "SCALE", "SQR", "SQRT", "LOG", "SUM",
                     "SUM_ROWS", "MEAN", "ARGMAX", "ARGSORT", "TOP_K", "CLAMP", "ADD_ID", "SIN", "COS",
                     "CUMSUM", "FILL", "ARANGE"}, "#c8e6c9"),
    "layout": ({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT", "CPY", "DUP", "SET_ROWS",
                "GET_ROWS", "CONCAT", "PAD", "SET", "ACC", "REPEAT"}, "#eeeeee"),
}
OTHER_COLOUR = "#ffffff"
LEAF_COLOUR = "#fafafa"
FULL_LIMIT = 2000  # above this many nodes a whole-graph view shows the layer overview instead


class ViewError(Exception):
    """A view that cannot be produced; the message is one line."""


def op_kind(op: str) -> str:
    for kind, (ops, _) in OP_KINDS.items():
        if op in ops:
            return kind
    return "other"


def op_colour(op: str) -> str:
    kind = op_kind(op)
    return OP_KINDS[kind][1] if kind in OP_KINDS else OTHER_COLOUR


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _ne(ne) -> str:
    return "[" + ", ".join(str(x) for x in ne) + "]" if ne else "?"


def _wrap(text: str, width: int = 48) -> str:
    """op_params text over several label lines, so a ROPE node stays narrow."""
    lines, cur = [], ""
    for word in text.split(" "):
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return "\n".join(lines + [cur])


def _node_id(k) -> str:
    return f"n{k}" if isinstance(k, int) else _q("l_" + str(k)[5:])


def to_dot(g: nx.DiGraph, title: str = "graph", status: dict | None = None,
           first: int | None = None, leaves: bool = True) -> str:
    """DOT text of `g` (a from_* graph or a subgraph of one).

    `status` maps a node key to (status, nmse or None): nodes are then filled by diff status
    (see diffmap.STATUS_COLOURS) instead of op kind; `first` is outlined as the first divergence.
    """
    out = [f"digraph {_q(title)} {{", "  rankdir=TB; newrank=true;",
           '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
           '  edge [color="#777777", arrowsize=0.6];',
           f"  label={_q(title)}; labelloc=t;"]

    def node_line(k, d) -> str:
        if d["kind"] == "leaf":
            return (f"  {_node_id(k)} [label={_q(d['name'])}, shape=ellipse, fontsize=7, height=0.15, "
                    f'width=0.15, margin="0.02,0.01", fillcolor="{LEAF_COLOUR}", color="#bbbbbb"];')
        label = f"#{k} {d['name'] or '(unnamed)'}\n{d['op']} {d['type']} {_ne(d['ne'])}"
        params = format_op_params(d["op"], d.get("op_params") or [], d["ne"])
        if params:
            label += "\n" + _wrap(params)
        fill = op_colour(d["op"])
        extra = ""
        if status is not None:
            st, nmse = status.get(k, ("matched", None))
            fill = STATUS_COLOURS.get(st, fill)
            label += f"\n{st}" + (f" nmse {nmse:.2e}" if nmse is not None else "")
        if first is not None and k == first:
            extra = ', color="#d50000", penwidth=3'
        return (f"  {_node_id(k)} [label={_q(label)}, fillcolor=\"{fill}\", "
                f"class={_q('op-' + op_kind(d['op']))}, tooltip={_q((d['op'] + ' ' + params).strip())}{extra}];")

    groups: dict[int | None, list] = {}
    for k, d in g.nodes(data=True):
        if d["kind"] == "leaf" and not leaves:
            continue
        groups.setdefault(d["layer"], []).append(k)
    order = lambda k: (isinstance(k, str), k if isinstance(k, int) else 0, str(k))  # noqa: E731
    for il in sorted(groups, key=lambda x: (x is not None, x if x is not None else 0)):
        keys = sorted(groups[il], key=order)
        if il is None:
            out += [node_line(k, g.nodes[k]) for k in keys]
            continue
        out.append(f"  subgraph cluster_layer_{il} {{")
        out.append(f'    label="layer {il}"; style="rounded,dashed"; color="#9e9e9e";')
        out += ["  " + node_line(k, g.nodes[k]) for k in keys]
        out.append("  }")
    for u, v, d in g.edges(data=True):
        if not leaves and (g.nodes[u]["kind"] == "leaf" or g.nodes[v]["kind"] == "leaf"):
            continue
        style = " [style=dashed]" if d.get("slot") == -1 else ""  # a view of its source's memory
        out.append(f"  {_node_id(u)} -> {_node_id(v)}{style};")
    out.append("}")
    return "\n".join(out) + "\n"


def overview_dot(nodes: list[Node], title: str = "graph") -> str:
    """One box per layer with its node count and top ops; one pass, no networkx, so that a
    100,000-node graph takes well under 2 s."""
    latest: dict[str, int] = {}
    layer: list[int | None] = []
    counts: dict[int | None, dict[str, int]] = {}
    edges: set[tuple] = set()
    name_layer, is_auto = V.name_layer, V.is_auto_name
    for n in nodes:
        producers = [latest.get(s) for s in n.src if s]
        il = name_layer(n.name)
        if il is None and is_auto(n.name):
            for k, s in zip(producers, [s for s in n.src if s]):
                il = layer[k] if k is not None else name_layer(s)
                if il is not None:
                    break
        layer.append(il)
        for k in producers:
            if k is not None and layer[k] != il:
                edges.add((layer[k], il))
        ops = counts.setdefault(il, {})
        ops[n.op] = ops.get(n.op, 0) + 1
        latest[n.name] = n.index

    def nid(il):
        return "global" if il is None else f"layer_{il}"
    out = [f"digraph {_q(title)} {{", "  rankdir=TB;",
           '  node [shape=box, style="rounded,filled", fillcolor="#e3f2fd", fontname="Helvetica", fontsize=10];',
           f"  label={_q(title + ' (layer overview)')}; labelloc=t;"]
    for il, ops in counts.items():
        top = sorted(ops.items(), key=lambda kv: -kv[1])[:4]
        label = (f"{V.layer_label(il)}\n{sum(ops.values())} nodes\n"
                 + ", ".join(f"{op} {c}" for op, c in top))
        out.append(f"  {nid(il)} [label={_q(label)}];")
    for a, b in sorted(edges, key=lambda e: (str(e[0]), str(e[1]))):
        out.append(f"  {nid(a)} -> {nid(b)};")
    out.append("}")
    return "\n".join(out) + "\n"


def dot_available() -> bool:
    return shutil.which("dot") is not None


def render_svg(dot_text: str, timeout: float = 120) -> str:
    """SVG through Graphviz's `dot`; ViewError when it is not installed or fails."""
    exe = shutil.which("dot")
    if exe is None:
        raise ViewError("SVG needs Graphviz's `dot`, which is not installed (apt-get install graphviz); "
                        "--format dot writes the DOT text instead")
    try:
        p = subprocess.run([exe, "-Tsvg"], input=dot_text.encode(), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ViewError(f"Graphviz took more than {timeout:.0f} s; try --layer N or --around NAME") from None
    if p.returncode != 0:
        msg = " ".join(p.stderr.decode(errors="replace").split())[:300]
        raise ViewError(f"Graphviz dot failed: {msg}")
    return p.stdout.decode()
