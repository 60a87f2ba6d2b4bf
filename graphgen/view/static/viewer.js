(function () {
"use strict";
var D = JSON.parse(document.getElementById("data").textContent);
var F = {}; D.fields.forEach(function (f, i) { F[f] = i; });
var rows = D.rows, diff = D.mode === "diff", N = rows.length;
var SVGNS = "http://www.w3.org/2000/svg";
var NODE_W = 190, NODE_H = 40, GAP_X = 26, GAP_Y = 34, BOX_W = 380, BOX_H = 54, GROUP_GAP = 34,
    PAD = 18, HEAD = 28, PER_LINE = 16;  // a depth with more nodes than PER_LINE wraps onto more lines
// below DETAIL_S the two 11-unit text lines of a node would be under 8 px: one label, sized to its
// box; a box under LABEL_BOX_PX tall on screen has no room for any glyph and is left plain
var DETAIL_S = 0.73, READ_S = 1, LABEL_PAD = 5, LABEL_MAX = 30, LABEL_MIN_PX = 5, LABEL_BOX_PX = 4, STRIP_W = 9,
    LABEL_FONT = "ui-monospace, monospace";

function esc(s) { return String(s).replace(/[&<>"]/g, function (c) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]; }); }
function layerKey(l) { return l === null ? "global" : "layer " + l; }
function kindOf(r) { return diff ? r[F.status] : D.opKinds[r[F.op]]; }
function colour(r) { return diff ? D.statusColours[r[F.status]] : D.opColours[D.opKinds[r[F.op]]]; }
function ne(r) { return "[" + r[F.ne].join(", ") + "]"; }
function fmt(x) { return x === null || x === undefined ? "-" : Number(x).toExponential(2); }
function num(x) { return x === null || x === undefined ? "-" : typeof x === "string" ? x : Number(x).toPrecision(6).replace(/\.?0+(e|$)/, "$1"); }
function nmseColour(v) {
  if (v === null || v === undefined) return null;
  if (v <= 0) return "#2e7d32";
  var t = Math.min(1, Math.max(0, (Math.log10(v) + 14) / 12));
  return "hsl(" + Math.round(120 * (1 - t)) + ",75%,45%)";
}

// ---- groups: one per layer; nodes outside any layer start a new group each time they recur
// after a layer, so a graph's inputs and its outputs are boxes of their own -------------------
var groups = [], rowGroup = new Int32Array(N), layerGroup = {}, nGlobal = 0;
function newGroup(l) {
  var label = l === null ? (nGlobal++ ? "global " + nGlobal : "global") : layerKey(l);
  groups.push({i: groups.length, layer: l, label: label, rows: [], open: false, lay: null, y: 0, w: BOX_W, h: BOX_H, counts: {}});
  return groups.length - 1;
}
// once the layers are done, a node of an earlier layer (a view of l_out-1, an automatic name
// that took its source's layer) is part of what follows, the output head, not of that layer's box
var cur = -1;
for (var k = 0; k < N; k++) {
  var l = rows[k][F.layer], gi;
  if (l !== null && cur >= 0 && groups[cur].layer === null && layerGroup[l] !== undefined) l = null;
  if (l === null) gi = cur >= 0 && groups[cur].layer === null ? cur : newGroup(null);
  else { gi = layerGroup[l]; if (gi === undefined) { gi = newGroup(l); layerGroup[l] = gi; } }
  var g0 = groups[gi], kd = kindOf(rows[k]);
  g0.rows.push(k); g0.counts[kd] = (g0.counts[kd] || 0) + 1; rowGroup[k] = gi; cur = gi;
}
// edges that cross groups, kept flat: [p0, k0, p1, k1, ...]
var cross = [];
for (k = 0; k < N; k++) {
  var srcs = rows[k][F.src];
  for (var j = 0; j < srcs.length; j++) { var p = srcs[j][1]; if (p >= 0 && rowGroup[p] !== rowGroup[k]) cross.push(p, k); }
}

// ---- layered layout of one group, computed when it is first opened ---------------------------
function layoutGroup(g) {
  if (g.lay) return g.lay;
  var rank = {}, maxr = 0;
  g.rows.forEach(function (k) {
    var d = 0, srcs = rows[k][F.src];
    for (var j = 0; j < srcs.length; j++) {
      var p = srcs[j][1];
      if (p >= 0 && rowGroup[p] === g.i && rank[p] !== undefined && rank[p] + 1 > d) d = rank[p] + 1;
    }
    rank[k] = d; if (d > maxr) maxr = d;
  });
  var levels = [];
  for (var r = 0; r <= maxr; r++) levels.push([]);
  g.rows.forEach(function (k) { levels[rank[k]].push(k); });
  var place = {}, lines = [];
  levels.forEach(function (lv, r) {
    if (r > 0) {
      // barycentre of the parents' places, to keep edges short and crossings few
      var bary = {};
      lv.forEach(function (k) {
        var sum = 0, n = 0;
        rows[k][F.src].forEach(function (s) { if (s[1] >= 0 && place[s[1]] !== undefined) { sum += place[s[1]]; n++; } });
        bary[k] = n ? sum / n : 0.5;
      });
      lv.sort(function (a, b) { return bary[a] - bary[b] || a - b; });
    }
    lv.forEach(function (k, i) { place[k] = lv.length > 1 ? i / (lv.length - 1) : 0.5; });
    for (var a = 0; a < lv.length; a += PER_LINE) lines.push(lv.slice(a, a + PER_LINE));
  });
  var pos = {}, w = BOX_W;
  lines.forEach(function (line, li) {
    var lw = line.length * (NODE_W + GAP_X) - GAP_X, x0 = -lw / 2;
    if (lw > w) w = lw;
    line.forEach(function (k, i) { pos[k] = [x0 + i * (NODE_W + GAP_X), HEAD + PAD + li * (NODE_H + GAP_Y)]; });
  });
  g.lay = {pos: pos, w: w + 2 * PAD, h: HEAD + 2 * PAD + lines.length * (NODE_H + GAP_Y) - GAP_Y};
  return g.lay;
}
var world = {w: BOX_W, h: BOX_H};
function placeGroups() {
  var y = 0, w = 0;
  groups.forEach(function (g) {
    if (g.open) { var L = layoutGroup(g); g.w = L.w; g.h = L.h; } else { g.w = BOX_W; g.h = BOX_H; }
    g.y = y; y += g.h + GROUP_GAP; if (g.w > w) w = g.w;
  });
  world = {w: w, h: Math.max(y - GROUP_GAP, 1)};
}
function nodeXY(k) { var g = groups[rowGroup[k]], p = g.lay.pos[k]; return [p[0], g.y + p[1]]; }
function outAnchor(p) {  // where an edge leaves row p: its node, or its group's box when collapsed
  var g = groups[rowGroup[p]];
  if (g.open) { var xy = nodeXY(p); return [xy[0] + NODE_W / 2, xy[1] + NODE_H, "n" + p]; }
  return [0, g.y + g.h, "g" + g.i];
}
function inAnchor(k) {
  var g = groups[rowGroup[k]];
  if (g.open) { var xy = nodeXY(k); return [xy[0] + NODE_W / 2, xy[1], "n" + k]; }
  return [0, g.y, "g" + g.i];
}

// ---- drawing -----------------------------------------------------------------------------------
var svg = document.getElementById("canvas"), vp = document.getElementById("vp");
var boxesG = document.getElementById("boxes"), nodesG = document.getElementById("nodes"), edgesG = document.getElementById("edges");
var s = 1, tx = 0, ty = 0, selected = -1, hitSet = {}, hitGroups = {};
function el(tag, attrs, text) {
  var e = document.createElementNS(SVGNS, tag);
  for (var a in attrs) e.setAttribute(a, attrs[a]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function viewSize() { var r = svg.getBoundingClientRect(); return [r.width || 800, r.height || 600]; }
function drawBoxes() {
  boxesG.textContent = "";
  var frag = document.createDocumentFragment();
  groups.forEach(function (g) {
    var b = el("g", {"class": "glayer " + (g.open ? "open" : "collapsed") + (hitGroups[g.i] ? " hit" : ""),
                     "data-group": g.i, "data-layer": g.label});
    b.appendChild(el("rect", {"class": "frame", x: -g.w / 2, y: g.y, width: g.w, height: g.h, rx: 7}));
    var title = g.label + " \u00b7 " + g.rows.length + " node" + (g.rows.length === 1 ? "" : "s");
    if (g.open) {
      b.appendChild(el("rect", {"class": "head", x: -g.w / 2, y: g.y, width: g.w, height: HEAD, rx: 7}));
      b.appendChild(el("text", {x: -g.w / 2 + 10, y: g.y + 18}, "\u25be " + title + " (click to collapse)"));
    } else {
      b.appendChild(el("text", {x: -BOX_W / 2 + 10, y: g.y + 20}, "\u25b8 " + title));
      // the group's make-up as one stacked bar: op kinds, or diff statuses
      var x = -BOX_W / 2 + 10, bw = BOX_W - 20;
      Object.keys(g.counts).forEach(function (kd) {
        var w = bw * g.counts[kd] / g.rows.length;
        var seg = el("rect", {x: x, y: g.y + 30, width: Math.max(w, 0.5), height: 14,
                              fill: diff ? D.statusColours[kd] : D.opColours[kd], stroke: "#90a4ae", "stroke-width": 0.5});
        seg.appendChild(el("title", {}, kd + " " + g.counts[kd]));
        b.appendChild(seg); x += w;
      });
    }
    frag.appendChild(b);
  });
  boxesG.appendChild(frag);
}
// text widths at font size 1, measured once per text: labels are sized to fit their box
var measure = document.createElement("canvas").getContext("2d"), widths = {};
function textWidth(t) {
  var w = widths[t];
  if (w === undefined) { measure.font = "100px " + LABEL_FONT; w = widths[t] = measure.measureText(t).width / 100; }
  return w;
}
// a zoomed-out node's label: its name when the name fits the box at a readable size, else its op
// (short, so it fits where a name cannot), each as large as the box allows
function shortLabel(r) {
  // a glyph's box is about 1.17 em tall, and the browser rounds ascent and descent to whole
  // pixels: keep a pixel spare
  var room = NODE_W - 2 * LABEL_PAD - (diff ? STRIP_W : 0), tall = Math.min(LABEL_MAX, (NODE_H * s - 1.2) / (1.2 * s));
  function size(t) { return Math.min(tall, room / Math.max(textWidth(t), 1e-6)); }
  var name = r[F.name];
  if (name) { var fs = size(name); if (fs * s >= LABEL_MIN_PX) return [name, fs]; }
  return [r[F.op], size(r[F.op])];
}
function nodeEl(k, x, y, detail) {
  var r = rows[k], cls = "gnode";
  if (k === selected) cls += " selected";
  if (k === D.first) cls += " first-divergence";
  if (hitSet[k]) cls += " hit";
  var g = el("g", {"class": cls, "data-row": k, transform: "translate(" + x + "," + y + ")"});
  g.appendChild(el("rect", {"class": "body", width: NODE_W, height: NODE_H, rx: 5, fill: colour(r)}));
  var nc = diff ? nmseColour(r[F.nmse]) : null;
  if (nc) g.appendChild(el("rect", {"class": "nmse", x: NODE_W - STRIP_W, y: 1, width: STRIP_W - 1, height: NODE_H - 2, fill: nc}));
  // the node's own error (diff --local), in the same scale, on the left edge
  var oc = diff ? nmseColour(r[F.own]) : null;
  if (oc) g.appendChild(el("rect", {"class": "own", x: 1, y: 1, width: 4, height: NODE_H - 2, fill: oc}));
  if (detail === null) {
    g.appendChild(el("title", {}, (r[F.name] || "(unnamed)") + "\n" + r[F.op]));
  } else if (!detail) {
    var lb = shortLabel(r);
    g.appendChild(el("text", {x: LABEL_PAD, y: NODE_H / 2, "class": "lbl", "dominant-baseline": "central",
                              style: "font-size:" + lb[1].toFixed(2) + "px"}, lb[0]));
    g.appendChild(el("title", {}, (r[F.name] || "(unnamed)") + "\n" + r[F.op]));
  } else {
    var idx = diff ? (r[F.ref] !== null ? "#" + r[F.ref] : "+" + r[F.ours]) : "#" + r[F.ref];
    var name = r[F.name] || "(unnamed)";
    if (name.length > 24) name = name.slice(0, 23) + "\u2026";
    g.appendChild(el("text", {x: 6, y: 16, "class": "nm"}, idx + " " + name));
    g.appendChild(el("text", {x: 6, y: 32, "class": "sub"}, r[F.op] + " " + r[F.type] + " " + ne(r)));
    g.appendChild(el("title", {}, (r[F.name] || "(unnamed)") + "\n" + r[F.op] + (r[F.params] ? " " + r[F.params] : "") +
                     (diff && r[F.nmse] !== null ? "\nnmse " + fmt(r[F.nmse]) : "") +
                     (diff && r[F.own] !== null ? "\nown error " + fmt(r[F.own]) : "")));
  }
  return g;
}
function curve(a, b) {
  var dy = b[1] - a[1];
  if (dy > 0) return "M" + a[0] + " " + a[1] + "C" + a[0] + " " + (a[1] + dy / 2) + " " + b[0] + " " + (b[1] - dy / 2) + " " + b[0] + " " + b[1];
  // an edge back up the page (a box drawn above its producer) swings out to the right
  var out = Math.max(BOX_W / 2 + 60, Math.abs(a[0] - b[0]) / 2 + 60);
  return "M" + a[0] + " " + a[1] + "C" + (a[0] + out) + " " + (a[1] + 80) + " " + (b[0] + out) + " " + (b[1] - 80) + " " + b[0] + " " + b[1];
}
var drawnCount = 0;
function render() {
  vp.setAttribute("transform", "translate(" + tx + "," + ty + ") scale(" + s + ")");
  nodesG.textContent = ""; edgesG.textContent = "";
  var vs = viewSize(), x0 = -tx / s, y0 = -ty / s, x1 = (vs[0] - tx) / s, y1 = (vs[1] - ty) / s;
  var detail = s >= DETAIL_S ? true : NODE_H * s >= LABEL_BOX_PX ? false : null, frag = document.createDocumentFragment(), inner = [], boxes = [], n = 0;
  function inView(ax, ay, bx, by) { return Math.max(ax, bx) >= x0 && Math.min(ax, bx) <= x1 && Math.max(ay, by) >= y0 && Math.min(ay, by) <= y1; }
  groups.forEach(function (g) {
    if (!g.open || g.y > y1 || g.y + g.h < y0) return;
    var pos = g.lay.pos;
    g.rows.forEach(function (k) {
      var p = pos[k], x = p[0], y = g.y + p[1];
      if (x + NODE_W >= x0 && x <= x1 && y + NODE_H >= y0 && y <= y1) { frag.appendChild(nodeEl(k, x, y, detail)); n++; }
      var srcs = rows[k][F.src];
      for (var j = 0; j < srcs.length; j++) {
        var q = srcs[j][1];
        if (q < 0 || rowGroup[q] !== g.i) continue;
        var a = pos[q], ax = a[0] + NODE_W / 2, ay = g.y + a[1] + NODE_H, bx = x + NODE_W / 2;
        if (inView(ax, ay, bx, y)) inner.push(curve([ax, ay], [bx, y]));
      }
    });
  });
  var seen = {};
  for (var c = 0; c < cross.length; c += 2) {
    var a = outAnchor(cross[c]), b = inAnchor(cross[c + 1]), key = a[2] + ">" + b[2];
    if (seen[key]) continue;
    seen[key] = 1;
    var both = a[2][0] === "g" && b[2][0] === "g";
    if (both || inView(a[0], a[1], b[0], b[1])) (both ? boxes : inner).push(curve(a, b));
  }
  if (boxes.length) edgesG.appendChild(el("path", {"class": "edge box", d: boxes.join("")}));
  if (inner.length) edgesG.appendChild(el("path", {"class": "edge", d: inner.join("")}));
  nodesG.appendChild(frag);
  drawnCount = n;
  document.getElementById("zoom-info").textContent = "zoom " + s.toFixed(2) + " \u00b7 " + n + " of " + N + " nodes drawn";
}

// ---- view: pan, zoom, fit, centre ------------------------------------------------------------
function topView() { var vs = viewSize(); s = Math.min(1, (vs[0] - 20) / (world.w + 40)); tx = vs[0] / 2; ty = 16; render(); }
function fit() {
  var vs = viewSize();
  s = Math.max(0.001, Math.min(2, (vs[0] - 20) / (world.w + 40), (vs[1] - 20) / (world.h + 40)));
  tx = vs[0] / 2; ty = Math.max(10, (vs[1] - world.h * s) / 2); render();
}
function centreOn(x, y) { var vs = viewSize(); if (s < READ_S) s = READ_S; tx = vs[0] / 2 - x * s; ty = vs[1] / 2 - y * s; render(); }
// the whole of a group in view, as large as fits (never past 1:1)
function zoomToGroup(g) {
  var vs = viewSize();
  s = Math.max(0.001, Math.min(1, (vs[0] - 20) / (g.w + 20), (vs[1] - 20) / (g.h + 20)));
  tx = vs[0] / 2; ty = vs[1] / 2 - (g.y + g.h / 2) * s; render();
}
svg.addEventListener("wheel", function (e) {
  e.preventDefault();
  var r = svg.getBoundingClientRect(), mx = e.clientX - r.left, my = e.clientY - r.top;
  var ns = Math.min(4, Math.max(0.001, s * Math.exp(-e.deltaY * 0.0015)));
  tx = mx - (mx - tx) * ns / s; ty = my - (my - ty) * ns / s; s = ns; render();
}, {passive: false});
var drag = null, moved = false;
svg.addEventListener("pointerdown", function (e) {
  if (e.button !== 0) return;
  drag = {x: e.clientX, y: e.clientY, tx: tx, ty: ty, id: e.pointerId}; moved = false;
});
svg.addEventListener("pointermove", function (e) {
  if (!drag) return;
  var dx = e.clientX - drag.x, dy = e.clientY - drag.y;
  if (!moved && Math.abs(dx) + Math.abs(dy) > 4) { moved = true; svg.classList.add("dragging"); }
  if (moved) { tx = drag.tx + dx; ty = drag.ty + dy; render(); }
});
function endDrag() { drag = null; svg.classList.remove("dragging"); }
svg.addEventListener("pointerup", endDrag);
svg.addEventListener("pointerleave", endDrag);
svg.addEventListener("click", function (e) {
  if (moved) { moved = false; return; }
  var t = e.target, node = t.closest ? t.closest(".gnode") : null;
  if (node) { select(+node.getAttribute("data-row"), false); return; }
  var box = t.closest ? t.closest(".glayer") : null;
  if (box) toggle(groups[+box.getAttribute("data-group")]);
});

// ---- opening, selecting, details ---------------------------------------------------------------
function setOpen(list, open) {
  list.forEach(function (g) { g.open = open; });
  placeGroups(); drawBoxes();
}
function toggle(g) {
  var wasOpen = g.open;
  setOpen([g], !wasOpen);
  if (!wasOpen) zoomToGroup(g); else render();
}
function select(k, centre) {
  var g = groups[rowGroup[k]];
  if (!g.open) setOpen([g], true);
  selected = k;
  if (centre !== false) { var xy = nodeXY(k); centreOn(xy[0] + NODE_W / 2, xy[1] + NODE_H / 2); } else render();
  showDetails(k);
}
function statsRows(t, st, vals, side) {
  var sfx = side ? " (" + side + ")" : "";
  if (st) {
    t.push(["min / max / mean" + sfx, num(st[0]) + " / " + num(st[1]) + " / " + num(st[2])]);
    t.push(["NaN / Inf" + sfx, '<span class="naninf">' + st[3] + " / " + st[4] + "</span> of " + st[5]]);
  }
  if (vals) t.push(["first values" + sfx, '<span class="values">' + vals.map(num).join(", ") + "</span>"]);
  if (!st && !vals) t.push(["values" + sfx, "not stored"]);
}
function jump(k, label) { return '<a class="jump" data-row="' + k + '">' + esc(label) + "</a>"; }
function showDetails(k) {
  var r = rows[k], t = [["row", k], ["name", esc(r[F.name])], ["op", esc(r[F.op])], ["type", esc(r[F.type])],
    ["ne", ne(r)], ["layer", esc(layerKey(r[F.layer]))], ["op_params", '<span class="params">' + esc(r[F.params] || "-") + "</span>"],
    ];
  function be(v) { return esc(v || "not recorded"); }
  if (!diff) t.push(["backend", '<span class="backend">' + be(r[F.backend]) + "</span>"]);
  else {
    if (r[F.ref] !== null) t.push(["backend (ref)", '<span class="backend ref">' + be(r[F.backend]) + "</span>"]);
    if (r[F.ours] !== null) t.push(["backend (ours)", '<span class="backend ours">' + be(r[F.obackend]) + "</span>"]);
  }
  if (diff) t.push(["status", esc(D.statusLabels[r[F.status]] || r[F.status])], ["ref index", r[F.ref] === null ? "-" : r[F.ref]],
    ["ours index", r[F.ours] === null ? "-" : r[F.ours]], ["nmse", fmt(r[F.nmse])], ["max abs", fmt(r[F.max_abs])]);
  if (diff && (r[F.own] !== null || r[F.own_why])) t.push(["own error", '<span class="own">' +
    (r[F.own] !== null ? fmt(r[F.own]) + (r[F.own_why] ? " (" + esc(r[F.own_why]) + ")" : "") : esc(r[F.own_why])) + "</span>"]);
  if (!diff || r[F.ref] !== null) statsRows(t, r[F.stats], r[F.vals], diff ? "ref" : "");
  if (diff && r[F.ours] !== null) statsRows(t, r[F.ostats], r[F.ovals], "ours");
  var srcs = r[F.src].map(function (s) { return s[1] >= 0 ? jump(s[1], s[0]) : esc(s[0]) + " (leaf)"; }).join("<br>");
  t.push(["sources", srcs || "-"]);
  var users = [];
  for (var j = k + 1; j < N && users.length < 50; j++)
    if (rows[j][F.src].some(function (s) { return s[1] === k; })) users.push(jump(j, rows[j][F.name] || "#" + j));
  t.push(["used by", users.join("<br>") || "-"]);
  if (r[F.detail]) t.push(["detail", esc(r[F.detail])]);
  var det = document.getElementById("details"), extra = "";
  var ch = diff ? r[F.changes] : null;
  if (ch && ch.length) {
    extra += '<h4>what changed</h4><table class="changes"><tr><th>field</th><th>ref</th><th>ours</th></tr>' +
      ch.map(function (c) {
        return '<tr data-field="' + esc(c[0]) + '"><td>' + esc(c[0]) + '</td><td class="ref">' + esc(c[1]) +
               '</td><td class="ours">' + esc(c[2]) + "</td></tr>";
      }).join("") + "</table>";
  }
  var w = diff ? r[F.worst] : null;
  if (w) {
    extra += '<h4>largest error</h4><table class="worst">' + [
      ["flat index", '<span class="w-index">' + w.index + "</span>"],
      ["coordinates (ne0 first)", '<span class="w-coord">[' + w.coord.join(", ") + "]</span>"],
      ["ref", '<span class="w-ref">' + num(w.ref) + "</span>"], ["ours", '<span class="w-ours">' + num(w.ours) + "</span>"],
      ["|ref - ours|", '<span class="w-abs">' + num(w.abs) + "</span>"]
    ].map(function (x) { return "<tr><td>" + x[0] + "</td><td>" + x[1] + "</td></tr>"; }).join("") + "</table>";
  }
  var marks = [];
  if (k === D.firstStructural) marks.push("first structural change");
  if (k === D.firstValue) marks.push("first value failure");
  if (!marks.length && k === D.first) marks.push("first divergence");
  det.innerHTML = '<h3 data-row="' + k + '">' + esc(r[F.name] || "(unnamed)") + (marks.length ? " &mdash; " + marks.join(", ") : "") +
    "</h3><table>" + t.map(function (x) { return "<tr><td>" + x[0] + "</td><td>" + x[1] + "</td></tr>"; }).join("") + "</table>" + extra;
  det.querySelectorAll("a.jump").forEach(function (a) { a.addEventListener("click", function () { select(+a.dataset.row, true); }); });
}

// ---- search ------------------------------------------------------------------------------------
var hits = [], hitPos = -1;
function search(q) {
  q = q.trim().toLowerCase(); hits = []; hitPos = -1; hitSet = {}; hitGroups = {};
  var res = document.getElementById("results");
  if (!q) { res.innerHTML = ""; drawBoxes(); render(); return; }
  for (var k = 0; k < N; k++) if (String(rows[k][F.name]).toLowerCase().indexOf(q) >= 0) { hits.push(k); hitSet[k] = 1; hitGroups[rowGroup[k]] = 1; }
  res.innerHTML = "<p>" + hits.length + " match" + (hits.length === 1 ? "" : "es") + "</p>" + hits.slice(0, 200).map(function (k) {
    return '<div class="result" data-row="' + k + '">' + jump(k, rows[k][F.name]) + " " +
      esc(rows[k][F.op]) + " &middot; " + esc(layerKey(rows[k][F.layer])) + "</div>";
  }).join("");
  res.querySelectorAll("a.jump").forEach(function (a) { a.addEventListener("click", function () { select(+a.dataset.row, true); }); });
  drawBoxes();
  if (hits.length) nextHit(); else render();
}
function nextHit() { if (!hits.length) return; hitPos = (hitPos + 1) % hits.length; select(hits[hitPos], true); }
var box = document.getElementById("search"), timer = null;
box.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(function () { search(box.value); }, 200); });
box.addEventListener("keydown", function (e) { if (e.key === "Enter") { if (!hits.length) search(box.value); else nextHit(); } });
document.getElementById("expand").addEventListener("click", function () { setOpen(groups, true); fit(); });
document.getElementById("collapse").addEventListener("click", function () { setOpen(groups, false); topView(); });
document.getElementById("fit").addEventListener("click", fit);
document.querySelectorAll("#plot .pt").forEach(function (c) {
  c.addEventListener("click", function () { select(+c.getAttribute("data-row"), true); });
});

// the legend: every colour the nodes can take, from the table they are drawn with, and how many
// nodes have it; then the NMSE strip and the outlines
var counts = {};
for (k = 0; k < N; k++) { var kk = kindOf(rows[k]); counts[kk] = (counts[kk] || 0) + 1; }
var cols = diff ? D.statusColours : D.opColours;
var legendHtml = Object.keys(cols).map(function (key) {
  var label = diff ? D.statusLabels[key] || key : key;
  return '<span class="item" data-key="' + esc(key) + '"><i class="sw" style="background:' + cols[key] + '"></i>' +
    esc(label) + ' <span class="n">' + (counts[key] || 0) + "</span></span>";
}).join("");
if (diff) legendHtml += '<span class="item strip"><i class="sw grad"></i>NMSE strip: 0 green to \u22651e-2 red, log scale</span>';
if (diff && rows.some(function (r) { return r[F.own] !== null; }))
  legendHtml += '<span class="item strip own"><i class="sw grad"></i>left strip: the node\'s own error (re-run alone on ref\'s values), same scale</span>';
legendHtml += '<span class="item"><i class="sw ring sel"></i>selected</span>' +
  (diff ? '<span class="item"><i class="sw ring first"></i>first divergence</span>' : "") +
  '<span class="item"><i class="sw ring hit"></i>search hit</span>';
document.getElementById("legend").innerHTML = legendHtml;
[["first-structural", D.firstStructural], ["first-value", D.firstValue]].forEach(function (b) {
  var btn = document.getElementById(b[0]);
  if (b[1] === null || b[1] === undefined) return;
  btn.hidden = false;
  btn.title = rows[b[1]][F.name] || "(unnamed)";
  btn.textContent += ": " + (rows[b[1]][F.name] || "(unnamed)");
  btn.addEventListener("click", function () { select(b[1], true); });
});

// ---- URL fragment: #node=K, #search=TEXT, #open=all or #open=layer 1,global ---------------------
function fromHash() {
  var h = {};
  location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
    var p = kv.split("="); if (p[0]) h[decodeURIComponent(p[0])] = decodeURIComponent(p[1] || "");
  });
  if (h.open !== undefined) {
    var want = h.open === "all" ? groups : groups.filter(function (g) { return h.open.split(",").indexOf(g.label) >= 0; });
    setOpen(want, true); fit();
  }
  if (h.node !== undefined && rows[+h.node]) select(+h.node, h.open === undefined);
  if (h.search) { box.value = h.search; search(h.search); }
}
placeGroups(); drawBoxes(); topView();
if (D.first !== null) select(D.first, true);
fromHash();
window.addEventListener("hashchange", fromHash);
window.addEventListener("resize", render);
window.__viewer = {drawn: function () { return drawnCount; }, groups: groups.length, select: select, fit: fit,
                   view: function () { return {s: s, tx: tx, ty: ty}; }};
document.body.dataset.loadMs = String(Math.round(performance.now()));
document.body.dataset.ready = "1";
})();
