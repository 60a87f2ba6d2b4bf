"""A self-contained HTML viewer: one file, no network.

The graph is shown collapsed by layer (a layer's nodes are only put in the page when it is
opened, so a 100,000-node graph stays usable), with search by name, node details and source
links. With a diff it colours matched / changed / value / missing / extra nodes, shows NMSE and
opens at the first divergence. The URL fragment `#search=TEXT` runs a search on load and `#node=K`
selects row K, so a page can be linked (and tested headless) at a given place.
"""

from __future__ import annotations

import html
import json
import math

from graphgen.diff import DiffResult
from graphgen.dump import Dump

from . import graph as V
from .diffmap import STATUS_COLOURS, diff_map
from .dot import OP_KINDS, OTHER_COLOUR, op_kind

# row fields, in the order the page's JS reads them
FIELDS = ("name", "op", "type", "ne", "layer", "src", "status", "nmse", "max_abs", "detail", "ref", "ours")


def _f(v):
    return v if v is None or (isinstance(v, float) and math.isfinite(v)) or isinstance(v, int) else None


def _single_rows(d: Dump) -> list[list]:
    sources = V.resolve_sources(d.nodes)
    layers = V.node_layers(d.nodes, sources)
    return [[n.name, n.op, n.type, n.ne, il, [[s, -1 if k is None else k] for _, s, k in srcs],
             "", None, None, "", n.index, None]
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
        else:
            n, srcs, il, to_row = ours.nodes[r.ours], osrc[r.ours], olay[r.ours], row_of_ours
        rows.append([n.name, n.op, n.type, n.ne, il,
                     [[s, -1 if k is None else to_row.get(k, -1)] for _, s, k in srcs],
                     r.status, _f(r.nmse), _f(r.max_abs), r.detail, r.ref, r.ours])
    first = dm.rows.index(dm.first) if dm.first is not None else None
    return rows, first


def to_html(ref: Dump, ours: Dump | None = None, res: DiffResult | None = None,
            title: str | None = None) -> str:
    """The page for one dump, or for a diff of two (res is computed when not given)."""
    if ours is None:
        rows, first, mode = _single_rows(ref), None, "single"
        summary = f"{len(ref.nodes)} nodes, {ref.graph} graph, {ref.model}"
        title = title or f"{ref.path.name} ({ref.graph})"
    else:
        if res is None:
            from graphgen.diff import diff_dumps
            res = diff_dumps(ref, ours)
        rows, first, mode = *_diff_rows(res, ref, ours), "diff"
        s = res.summary
        summary = (f"{'IDENTICAL' if res.identical else 'DIVERGED'}: ref {s.get('nodes_ref')} nodes, "
                   f"ours {s.get('nodes_ours')}; {s.get('matched')} matched, {s.get('changed')} changed, "
                   f"{s.get('deleted')} missing, {s.get('inserted')} extra, "
                   f"{s.get('numeric_failed')} value failures")
        if res.first_divergence:
            summary += f" | first divergence: {res.first_divergence['detail']}"
        title = title or f"{ref.path.name} vs {ours.path.name}"
    data = {"mode": mode, "fields": list(FIELDS), "rows": rows, "first": first,
            "statusColours": STATUS_COLOURS,
            "opColours": {k: c for k, (_, c) in OP_KINDS.items()} | {"other": OTHER_COLOUR},
            "opKinds": {r[1]: op_kind(r[1]) for r in rows}}
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return (_TEMPLATE.replace("%%TITLE%%", html.escape(title))
            .replace("%%SUMMARY%%", html.escape(summary))
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
body { font: 13px/1.35 system-ui, sans-serif; margin: 0; display: flex; flex-direction: column; height: 100vh; }
header { padding: 6px 10px; border-bottom: 1px solid #ccc; background: #fafafa; }
header h1 { font-size: 15px; margin: 0 0 4px 0; }
#summary { color: #444; margin-bottom: 4px; }
#bar { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; }
#search { width: 260px; padding: 3px; }
.legend span { display: inline-block; padding: 0 6px; border-radius: 3px; margin-right: 3px; font-size: 11px; }
main { flex: 1; display: flex; min-height: 0; }
#graph { flex: 3; overflow: auto; padding: 6px 10px; }
#side { flex: 2; overflow: auto; border-left: 1px solid #ccc; padding: 6px 10px; background: #fcfcfc; }
.layer { border: 1px solid #bbb; border-radius: 5px; margin: 6px 0; }
.layer > .lhead { cursor: pointer; padding: 4px 8px; background: #eef3f8; border-radius: 5px; user-select: none; }
.layer.open > .lhead { border-radius: 5px 5px 0 0; }
.layer > .lbody { padding: 2px 6px; }
.layer:not(.open) > .lbody { display: none; }
.badge { display: inline-block; padding: 0 5px; border-radius: 3px; margin-left: 4px; font-size: 11px; }
.node { display: flex; gap: 8px; padding: 2px 4px; margin: 2px 0; border-radius: 3px; cursor: pointer; border: 2px solid transparent; font-family: ui-monospace, monospace; font-size: 12px; }
.node .idx { color: #666; width: 4.5em; text-align: right; flex: none; }
.node .nm { flex: 2; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.node .op { flex: 1; }
.node .sh { flex: 1; color: #333; }
.node .nmse { width: 8em; text-align: right; }
.node.selected { border-color: #1565c0; }
.node.first-divergence { border-color: #d50000; box-shadow: 0 0 0 2px #ff8a80; }
.node.hit { outline: 2px dashed #ff6f00; }
#details table { border-collapse: collapse; }
#details td { padding: 1px 6px; vertical-align: top; font-family: ui-monospace, monospace; font-size: 12px; }
#details td:first-child { color: #666; font-family: system-ui, sans-serif; }
a.jump { color: #1565c0; cursor: pointer; text-decoration: underline; }
#errors { color: #b71c1c; white-space: pre; }
#results div { padding: 1px 0; }
</style></head>
<body>
<header>
<h1>%%TITLE%%</h1>
<div id="summary">%%SUMMARY%%</div>
<div id="bar">
<input id="search" type="search" placeholder="search node name (Enter: next)" autocomplete="off">
<button id="expand">expand all</button> <button id="collapse">collapse all</button>
<button id="first-btn" hidden>jump to first divergence</button>
<span class="legend" id="legend"></span>
</div>
<div id="errors" hidden></div>
</header>
<main><div id="graph"></div>
<div id="side"><div id="details"><p>Click a node for its details.</p></div><h3>Search</h3><div id="results"></div></div></main>
<script id="data" type="application/json">%%DATA%%</script>
<script>
(function () {
"use strict";
var D = JSON.parse(document.getElementById("data").textContent);
var F = {}; D.fields.forEach(function (f, i) { F[f] = i; });
var rows = D.rows, diff = D.mode === "diff";
var MAX_RENDER = 3000;  // rows put in the page per opened layer before "show more"

function layerKey(l) { return l === null ? "global" : "layer " + l; }
var layers = [], byLayer = {}, rowLayer = new Array(rows.length);
rows.forEach(function (r, k) {
  var key = layerKey(r[F.layer]);
  if (!(key in byLayer)) { byLayer[key] = []; layers.push(key); }
  byLayer[key].push(k); rowLayer[k] = key;
});
function colour(r) { return diff ? D.statusColours[r[F.status]] : D.opColours[D.opKinds[r[F.op]]]; }
function ne(r) { return "[" + r[F.ne].join(", ") + "]"; }
function fmt(x) { return x === null || x === undefined ? "-" : Number(x).toExponential(2); }
function esc(s) { return String(s).replace(/[&<>"]/g, function (c) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]; }); }

var graph = document.getElementById("graph"), layerEl = {}, rendered = {}, rowEl = {};
layers.forEach(function (key) {
  var ks = byLayer[key], counts = {};
  ks.forEach(function (k) { var s = diff ? rows[k][F.status] : D.opKinds[rows[k][F.op]]; counts[s] = (counts[s] || 0) + 1; });
  var div = document.createElement("div"); div.className = "layer"; div.dataset.layer = key;
  var head = document.createElement("div"); head.className = "lhead";
  var badges = Object.keys(counts).map(function (s) {
    var c = diff ? D.statusColours[s] : D.opColours[s];
    return '<span class="badge" style="background:' + c + '">' + esc(s) + " " + counts[s] + "</span>";
  }).join("");
  head.innerHTML = "<b>" + esc(key) + "</b> &middot; " + ks.length + " nodes " + badges;
  head.addEventListener("click", function () { toggle(key); });
  var body = document.createElement("div"); body.className = "lbody";
  div.appendChild(head); div.appendChild(body); graph.appendChild(div);
  layerEl[key] = div;
});

function renderLayer(key, upto) {
  var ks = byLayer[key], body = layerEl[key].querySelector(".lbody");
  var from = rendered[key] || 0, to = Math.min(ks.length, Math.max(upto || 0, from + MAX_RENDER));
  var more = body.querySelector(".more"); if (more) more.remove();
  var frag = document.createDocumentFragment();
  for (var p = from; p < to; p++) {
    var k = ks[p], r = rows[k], el = document.createElement("div");
    el.className = "node"; el.dataset.row = k; el.style.background = colour(r);
    var idx = diff ? (r[F.ref] !== null ? "#" + r[F.ref] : "+" + r[F.ours]) : "#" + r[F.ref];
    el.innerHTML = '<span class="idx">' + idx + '</span><span class="nm">' + esc(r[F.name] || "(unnamed)") +
      '</span><span class="op">' + esc(r[F.op]) + " " + esc(r[F.type]) + '</span><span class="sh">' + ne(r) + "</span>" +
      (diff ? '<span class="nmse">' + (r[F.nmse] === null ? esc(r[F.status]) : "nmse " + fmt(r[F.nmse])) + "</span>" : "");
    el.addEventListener("click", onRowClick);
    rowEl[k] = el; frag.appendChild(el);
    if (k === D.first) el.classList.add("first-divergence");
    if (k === selected) el.classList.add("selected");
  }
  body.appendChild(frag); rendered[key] = to;
  if (to < ks.length) {
    var m = document.createElement("button"); m.className = "more"; m.textContent = "show " + (ks.length - to) + " more";
    m.addEventListener("click", function () { renderLayer(key); }); body.appendChild(m);
  }
}
function onRowClick(e) { select(+e.currentTarget.dataset.row, false); }
function open(key) { if (!rendered[key]) renderLayer(key); layerEl[key].classList.add("open"); }
function toggle(key) { if (layerEl[key].classList.contains("open")) layerEl[key].classList.remove("open"); else open(key); }

var selected = -1;
function select(k, scroll) {
  var key = rowLayer[k], pos = byLayer[key].indexOf(k);
  open(key);
  if (pos >= (rendered[key] || 0)) renderLayer(key, pos + 1);
  if (selected >= 0 && rowEl[selected]) rowEl[selected].classList.remove("selected");
  selected = k; rowEl[k].classList.add("selected");
  if (scroll) rowEl[k].scrollIntoView({block: "center"});
  showDetails(k);
}
function showDetails(k) {
  var r = rows[k], t = [["row", k], ["name", esc(r[F.name])], ["op", esc(r[F.op])], ["type", esc(r[F.type])],
    ["ne", ne(r)], ["layer", esc(layerKey(r[F.layer]))]];
  if (diff) t.push(["status", esc(r[F.status])], ["ref index", r[F.ref] === null ? "-" : r[F.ref]],
    ["ours index", r[F.ours] === null ? "-" : r[F.ours]], ["nmse", fmt(r[F.nmse])], ["max abs", fmt(r[F.max_abs])]);
  var srcs = r[F.src].map(function (s) {
    return s[1] >= 0 ? '<a class="jump" data-row="' + s[1] + '">' + esc(s[0]) + "</a>" : esc(s[0]) + " (leaf)";
  }).join("<br>");
  t.push(["sources", srcs || "-"]);
  var users = [];
  for (var j = k + 1; j < rows.length && users.length < 50; j++)
    if (rows[j][F.src].some(function (s) { return s[1] === k; })) users.push('<a class="jump" data-row="' + j + '">' + esc(rows[j][F.name] || "#" + j) + "</a>");
  t.push(["used by", users.join("<br>") || "-"]);
  if (r[F.detail]) t.push(["detail", esc(r[F.detail])]);
  var det = document.getElementById("details");
  det.innerHTML = "<h3>" + esc(r[F.name] || "(unnamed)") + (k === D.first ? " &mdash; first divergence" : "") + "</h3><table>" +
    t.map(function (x) { return "<tr><td>" + x[0] + "</td><td>" + x[1] + "</td></tr>"; }).join("") + "</table>";
  det.querySelectorAll("a.jump").forEach(function (a) { a.addEventListener("click", function () { select(+a.dataset.row, true); }); });
}

var hits = [], hitPos = -1;
function search(q) {
  document.querySelectorAll(".node.hit").forEach(function (e) { e.classList.remove("hit"); });
  q = q.trim().toLowerCase(); hits = []; hitPos = -1;
  var res = document.getElementById("results");
  if (!q) { res.innerHTML = ""; return; }
  for (var k = 0; k < rows.length; k++) if (String(rows[k][F.name]).toLowerCase().indexOf(q) >= 0) hits.push(k);
  res.innerHTML = "<p>" + hits.length + " match" + (hits.length === 1 ? "" : "es") + "</p>" + hits.slice(0, 200).map(function (k) {
    return '<div class="result" data-row="' + k + '"><a class="jump" data-row="' + k + '">' + esc(rows[k][F.name]) + "</a> " +
      esc(rows[k][F.op]) + " &middot; " + esc(layerKey(rows[k][F.layer])) + "</div>";
  }).join("");
  res.querySelectorAll("a.jump").forEach(function (a) { a.addEventListener("click", function () { select(+a.dataset.row, true); }); });
  if (hits.length) nextHit();
}
function nextHit() {
  if (!hits.length) return;
  hitPos = (hitPos + 1) % hits.length; select(hits[hitPos], true); rowEl[hits[hitPos]].classList.add("hit");
}
var box = document.getElementById("search"), timer = null;
box.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(function () { search(box.value); }, 200); });
box.addEventListener("keydown", function (e) { if (e.key === "Enter") { if (!hits.length) search(box.value); else nextHit(); } });
document.getElementById("expand").addEventListener("click", function () { layers.forEach(open); });
document.getElementById("collapse").addEventListener("click", function () { layers.forEach(function (k) { layerEl[k].classList.remove("open"); }); });

var legend = document.getElementById("legend"), cols = diff ? D.statusColours : D.opColours;
legend.innerHTML = Object.keys(cols).map(function (s) { return '<span style="background:' + cols[s] + '">' + esc(s) + "</span>"; }).join("");
var fb = document.getElementById("first-btn");
if (D.first !== null) { fb.hidden = false; fb.addEventListener("click", function () { select(D.first, true); }); }

var h = {};
location.hash.replace(/^#/, "").split("&").forEach(function (kv) { var p = kv.split("="); if (p[0]) h[decodeURIComponent(p[0])] = decodeURIComponent(p[1] || ""); });
if (D.first !== null) select(D.first, true);
if (h.node !== undefined && rows[+h.node]) select(+h.node, true);
if (h.search) { box.value = h.search; search(h.search); }
document.body.dataset.ready = "1";
})();
</script>
</body></html>
"""
