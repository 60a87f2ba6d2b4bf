"""A self-contained HTML viewer: one file, no network, the graph drawn.

The graph is laid out in layers along the data flow (a node's depth is its longest path from its
layer's inputs) and drawn as SVG with pan (drag) and zoom (wheel). Every layer starts as one box;
a box opens on click and only then is its layout computed, and only the nodes in view are put in
the page, so a 100,000-node graph stays usable. Nodes are coloured by op kind, or with a diff by
status with an NMSE strip; clicking one shows its name, op, shape, type, decoded op_params,
sources, users, value statistics, first values and backend. A diff page also plots NMSE along the
graph, by layer. The URL fragment `#search=TEXT` runs a search on load, `#node=K` selects row K
and `#open=all` opens every layer, so a page can be linked (and tested headless) at a given place.
"""

from __future__ import annotations

import functools
import html
import json
import math
from pathlib import Path

import numpy as np

from graphgen.compare.report import DiffResult
from graphgen.dump.format import Dump
from graphgen.compare.opparams import format_op_params

from . import graph as V
from .diffmap import STATUS_COLOURS, STATUS_LABELS, diff_map
from .dot import OP_KINDS, OTHER_COLOUR, op_kind

# row fields, in the order the page's JS reads them; stats are [min, max, mean, nan, inf, count]
# (changes: [field, ref text, ours text] of a changed node; worst: the element furthest apart)
FIELDS = ("name", "op", "type", "ne", "layer", "src", "status", "nmse", "max_abs", "detail", "ref", "ours",
          "params", "backend", "stats", "vals", "ostats", "ovals", "obackend", "changes", "worst", "own", "own_why")
N_FIRST_VALUES = 8
STATIC = Path(__file__).with_name("static")


def _f(v):
    return v if v is None or (isinstance(v, float) and math.isfinite(v)) or isinstance(v, int) else None


def _num(x: float):
    """A value for JSON: NaN and infinities as strings, which JSON has no literal for."""
    x = float(x)
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def _values_info(d: Dump, i: int) -> tuple[list | None, list | None]:
    """([min, max, mean, nan, inf, count], first values) of node i, from its recorded stats or
    its stored values; (None, None) when the dump has neither."""
    n = d.nodes[i]
    arr = d.values(i) if d.has_values else None
    first = None
    if arr is not None:
        first = [_num(x) for x in np.asarray(arr, dtype=np.float64).ravel()[:N_FIRST_VALUES]]
    st = n.stats
    if st:
        count = st.get("count") or 0
        finite = count - (st.get("nan") or 0) - (st.get("inf") or 0)
        mean = st["sum"] / finite if finite and st.get("sum") is not None else None
        return [st.get("min"), st.get("max"), _f(mean), st.get("nan"), st.get("inf"), count], first
    if arr is None:
        return None, None
    v = np.asarray(arr, dtype=np.float64).ravel()
    fin = v[np.isfinite(v)]
    stats = [float(fin.min()) if fin.size else None, float(fin.max()) if fin.size else None,
             float(fin.mean()) if fin.size else None, int(np.isnan(v).sum()), int(np.isinf(v).sum()), int(v.size)]
    return stats, first


def _backend(d: Dump, i: int) -> str | None:
    """The backend that computed node i: the node's own record, an import's, else the one the
    dump's source names for the whole graph (the llama.cpp runner records the device it ran on)."""
    n = d.nodes[i]
    if n.backend:
        return n.backend
    src = d.source or {}
    imported = (src.get("import") or {}).get("backends") or {}
    return imported.get(str(i)) or src.get("backend")


def _side_text(field: str, value, op: str, ne: list[int]) -> str:
    if field == "op_params":
        return format_op_params(op, list(value), list(ne)) or "(none)"
    if field == "ne":
        return "[" + ", ".join(map(str, value)) + "]"
    if field == "src":
        return ", ".join(s or '""' for s in value) or "(none)"
    return "-" if value is None else str(value)


def _changes(fields: dict, r, o) -> list[list[str]]:
    """[field, ref, ours] for each field of a changed pair; op_params decoded by each side's op,
    with the raw slots when the decoding reads the same on both sides (a slot outside the op's
    layout changed)."""
    out = []
    for f, (a, b) in fields.items():
        ta, tb = _side_text(f, a, r.op, r.ne), _side_text(f, b, o.op, o.ne)
        if ta == tb:
            ta, tb = str(list(a) if isinstance(a, (list, tuple)) else a), str(list(b) if isinstance(b, (list, tuple)) else b)
        out.append([f, ta, tb])
    return out


@functools.lru_cache(maxsize=4096)
def _params_text(op: str, params: tuple, ne0: int) -> str:
    # a graph repeats a handful of (op, params) pairs: decode each once
    return format_op_params(op, list(params), [ne0, 1, 1, 1])


def _node_fields(d: Dump, i: int) -> list:
    n = d.nodes[i]
    stats, first = _values_info(d, i)
    return [_params_text(n.op, tuple(n.op_params), n.ne[0]), _backend(d, i), stats, first]


def _single_rows(d: Dump) -> list[list]:
    sources = V.resolve_sources(d.nodes)
    layers = V.node_layers(d.nodes, sources)
    return [[n.name, n.op, n.type, n.ne, il, [[s, -1 if k is None else k] for _, s, k in srcs],
             "", None, None, "", n.index, None, *_node_fields(d, n.index), None, None, None, None, None, None, None]
            for n, il, srcs in zip(d.nodes, layers, sources)]


def _diff_rows(res: DiffResult, ref: Dump, ours: Dump) -> tuple[list[list], int | None]:
    dm = diff_map(res, ref, ours)
    rsrc, osrc = V.resolve_sources(ref.nodes), V.resolve_sources(ours.nodes)
    rlay, olay = V.node_layers(ref.nodes, rsrc), V.node_layers(ours.nodes, osrc)
    row_of_ref = {r.ref: k for k, r in enumerate(dm.rows) if r.ref is not None}
    row_of_ours = {r.ours: k for k, r in enumerate(dm.rows) if r.ours is not None}
    rows = []
    for r in dm.rows:
        if r.ref is not None:
            n, srcs, il, to_row = ref.nodes[r.ref], rsrc[r.ref], rlay[r.ref], row_of_ref
            params, backend, stats, vals = _node_fields(ref, r.ref)
        else:
            n, srcs, il, to_row = ours.nodes[r.ours], osrc[r.ours], olay[r.ours], row_of_ours
            params, backend, stats, vals = _node_fields(ours, r.ours)
        ostats, ovals = _values_info(ours, r.ours) if r.ours is not None and r.ref is not None else (None, None)
        obackend = _backend(ours, r.ours) if r.ours is not None else None
        if r.ref is None:
            stats, vals, ostats, ovals, backend = None, None, stats, vals, None
        changes = _changes(r.fields, ref.nodes[r.ref], ours.nodes[r.ours]) if r.fields else None
        rows.append([n.name, n.op, n.type, n.ne, il,
                     [[s, -1 if k is None else to_row.get(k, -1)] for _, s, k in srcs],
                     r.status, _f(r.nmse), _f(r.max_abs), r.detail, r.ref, r.ours,
                     params, backend, stats, vals, ostats, ovals, obackend, changes, r.worst, _f(r.own), r.own_why])
    at = {id(r): k for k, r in enumerate(dm.rows)}
    firsts = {key: None if row is None else at[id(row)] for key, row in
              (("first", dm.first), ("firstStructural", dm.first_structural), ("firstValue", dm.first_value))}
    return rows, firsts


def side_label(d: Dump) -> str:
    """`llama.cpp b11739` / `graphgen 0.1.0`: which engine made a dump (an import says so)."""
    src = d.source or {}
    label = f"{src.get('engine', '?')} {src.get('version', '')}".strip()
    imported = (src.get("import") or {}).get("format")
    return f"{label} ({imported} import)" if imported else label


def page_title(ref: Dump, ours: Dump | None = None) -> str:
    """The engines and models a page shows, not its file names."""
    if ours is None:
        return f"{ref.graph} graph of {ref.model}, {side_label(ref)}"
    if ref.model == ours.model:
        return f"{ref.graph} graph of {ref.model}: {side_label(ref)} vs {side_label(ours)}"
    return f"{ref.graph} graph: {side_label(ref)} on {ref.model} vs {side_label(ours)} on {ours.model}"


def _layer_runs(layers: list) -> list[tuple[int, int, object]]:
    """(first row, end row, layer) for each run of rows in one layer."""
    runs = []
    for k, il in enumerate(layers):
        if runs and runs[-1][2] == il:
            runs[-1][1] = k + 1
        else:
            runs.append([k, k + 1, il])
    return [tuple(r) for r in runs]


def nmse_plot(rows: list[list], threshold: float | None = None, width: int = 900, height: int = 190) -> str:
    """Inline SVG of NMSE along the graph (rows in alignment order), log scale, layers as bands.

    Nodes with NMSE 0 sit on the bottom line; with more rows than pixels each column keeps its
    worst node. Each point carries data-row, so the page can select it on click."""
    fi = {f: i for i, f in enumerate(FIELDS)}
    n = len(rows)
    left, right, top, bottom = 52, 8, 10, 34
    pw, ph = width - left - right, height - top - bottom
    vals = [r[fi["nmse"]] for r in rows]
    pos = [v for v in vals if v is not None and v > 0]
    lo = math.floor(math.log10(min(pos))) if pos else -12
    hi = math.ceil(math.log10(max(pos))) if pos else 0
    if threshold and threshold > 0:
        lo, hi = min(lo, math.floor(math.log10(threshold))), max(hi, math.ceil(math.log10(threshold)))
    lo, hi = min(lo, hi - 1), hi
    zero_y = top + ph  # NMSE 0: the bottom line, below the lowest decade

    def y_of(v):
        if v <= 0:
            return zero_y
        return top + (hi - math.log10(v)) / (hi - lo + 0.5) * ph

    def x_of(k):
        return left + (k + 0.5) / max(n, 1) * pw

    out = [f'<svg id="nmse-svg" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="NMSE along the graph">']
    for j, (a, b, il) in enumerate(_layer_runs([r[fi["layer"]] for r in rows])):
        x0, x1 = left + a / max(n, 1) * pw, left + b / max(n, 1) * pw
        fill = "#f3f6fa" if j % 2 == 0 else "#e6edf5"
        label = html.escape(V.layer_label(il))
        out.append(f'<rect class="band" x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 0.5):.1f}" height="{ph}" '
                   f'fill="{fill}"><title>{label}: rows {a}-{b - 1}</title></rect>')
        if x1 - x0 > 30:
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{height - 20}" font-size="10" text-anchor="middle" '
                       f'fill="#555">{label}</text>')
    for e in range(lo, hi + 1):
        y = y_of(10.0 ** e)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ccc" stroke-width="0.5"/>'
                   f'<text x="{left - 4}" y="{y + 3:.1f}" font-size="10" text-anchor="end" fill="#555">1e{e}</text>')
    out.append(f'<text x="{left - 4}" y="{zero_y + 3:.1f}" font-size="10" text-anchor="end" fill="#555">0</text>')
    if threshold and threshold > 0:
        y = y_of(threshold)
        out.append(f'<line class="threshold" x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d50000" '
                   f'stroke-dasharray="4 3"><title>threshold {threshold:.1e}</title></line>')
    cols: dict[int, int] = {}
    for k, v in enumerate(vals):
        if v is None:
            continue
        c = int((k + 0.5) / max(n, 1) * pw)
        if c not in cols or v > vals[cols[c]]:
            cols[c] = k
    for c, k in sorted(cols.items()):
        v = vals[k]
        colour = STATUS_COLOURS.get(rows[k][fi["status"]], "#888")
        stroke = "#b71c1c" if rows[k][fi["status"]] == "value" else "#455a64"
        name = html.escape(rows[k][fi["name"]] or "(unnamed)")
        out.append(f'<circle class="pt" data-row="{k}" cx="{x_of(k):.1f}" cy="{y_of(v):.1f}" r="2.6" fill="{colour}" '
                   f'stroke="{stroke}" stroke-width="0.8"><title>#{k} {name}: nmse {v:.2e}</title></circle>')
    out.append(f'<text x="{left + pw / 2:.0f}" y="{height - 4}" font-size="10" text-anchor="middle" fill="#333">'
               f'nodes in graph order (log NMSE; {len(cols)} of {sum(v is not None for v in vals)} compared nodes '
               f'shown)</text>')
    out.append("</svg>")
    return "".join(out)


def _static(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def to_html(ref: Dump, ours: Dump | None = None, res: DiffResult | None = None,
            title: str | None = None) -> str:
    """The page for one dump, or for a diff of two (res is computed when not given)."""
    plot = ""
    firsts: dict = {"first": None, "firstStructural": None, "firstValue": None}
    if ours is None:
        rows, mode = _single_rows(ref), "single"
        summary = f"{len(ref.nodes)} nodes, {ref.graph} graph, {ref.model}, {side_label(ref)}"
    else:
        if res is None:
            from graphgen.compare.diff import diff_dumps
            res = diff_dumps(ref, ours)
        (rows, firsts), mode = _diff_rows(res, ref, ours), "diff"
        s = res.summary
        summary = (f"{'IDENTICAL' if res.identical else 'DIVERGED'}: ref {s.get('nodes_ref')} nodes, "
                   f"ours {s.get('nodes_ours')}; {s.get('matched')} matched, {s.get('changed')} changed, "
                   f"{s.get('deleted')} deleted, {s.get('inserted')} inserted, "
                   f"{s.get('numeric_failed')} value failures")
        for what, event in (("first structural change", res.first_structural),
                            ("first value failure", res.first_value)):
            if event:
                summary += f" | {what}: {event['detail']}"
        if res.local and res.local.get("own"):
            top = res.local["own"][0]
            summary += (f" | largest own error: #{top['ref_index']} '{top['name']}' ({top['op']}) "
                        f"{top['own_nmse']:.3g}")
        thr = min((r.threshold for r in res.numeric), default=None)
        plot = nmse_plot(rows, thr)
    title = title or page_title(ref, ours)
    data = {"mode": mode, "fields": list(FIELDS), "rows": rows, **firsts,
            "statusColours": STATUS_COLOURS, "statusLabels": STATUS_LABELS,
            "opColours": {k: c for k, (_, c) in OP_KINDS.items()} | {"other": OTHER_COLOUR},
            "opKinds": {r[1]: op_kind(r[1]) for r in rows}}
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    # str.replace in this order: the data goes last so nothing in it is taken for a placeholder
    return (_TEMPLATE.replace("%%CSS%%", _static("viewer.css"))
            .replace("%%JS%%", _static("viewer.js"))
            .replace("%%TITLE%%", html.escape(title))
            .replace("%%SUMMARY%%", html.escape(summary))
            .replace("%%PLOT%%", plot)
            .replace("%%DATA%%", blob))


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%%TITLE%%</title>
<script>
window.__errors = [];
window.addEventListener("error", function (e) {
  window.__errors.push(String(e.message || e));
  var el = document.getElementById("errors");
  if (el) { el.textContent = window.__errors.join("\n"); el.hidden = false; }
});
</script>
<style>
%%CSS%%
</style></head>
<body>
<header>
<h1>%%TITLE%%</h1>
<div id="summary">%%SUMMARY%%</div>
<div id="bar">
<input id="search" type="search" placeholder="search node name (Enter: next)" autocomplete="off">
<button id="expand">expand all</button> <button id="collapse">collapse all</button> <button id="fit">fit</button>
<button id="first-structural" hidden>first structural change</button>
<button id="first-value" hidden>first value failure</button>
</div>
<div class="legend" id="legend"></div>
<div id="errors" hidden></div>
</header>
<main><div id="graph"><svg id="canvas" xmlns="http://www.w3.org/2000/svg"><g id="vp"><g id="edges"></g><g id="boxes"></g><g id="nodes"></g></g></svg>
<div id="zoom-info"></div></div>
<div id="side"><div id="plot">%%PLOT%%</div><div id="details"><p>Click a node for its details; drag to pan, wheel to zoom, click a layer box to open it.</p></div><h3>Search</h3><div id="results"></div></div></main>
<script id="data" type="application/json">%%DATA%%</script>
<script>
%%JS%%
</script>
</body></html>
"""
