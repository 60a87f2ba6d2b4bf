"""The authors' forward against a ggml graph: mapped nodes by relative error, in model-conversion bands.

A torch dump (`graphgen dump HF_DIR --engine torch`) holds only the tensors of
`tensormap.TENSOR_MAP`. Each is found on the other side (a llama.cpp or graphgen dump) by the
map's rule and compared by relative L2 error, ||ggml - torch|| / ||torch||, and NMSE (its square,
the measure of llama.cpp's model-conversion `check-nmse.py`, whose bands name the result). The
pass band depends on what the ggml side cached: f32 caches must agree to a relative L2 of 1e-5,
f16 or quantized ones to 1e-3. The report names the first mapped node that leaves its band (in
graph order: where the error starts), the argmax agreement of the logits and, for DFlash2, the
selector path's. Nodes the map does not cover are counted as unmapped, never as compared, and a
comparison that compared nothing fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
import numpy as np

from ..dump.format import Dump, DumpError
from .tensormap import TENSOR_MAP, UNMAPPED_NOTE, MapEntry

BAND_F32 = 1e-5   # relative L2 with an f32 cache, every mapped node
BAND_F16 = 1e-3   # with an f16 cache, on the logits
# ...and on the other mapped nodes: four f16 rounding units (2^-11 each), the cached K/V being
# rounded once and the error carried through a few layers
BAND_F16_NODES = 4 * 2.0 ** -11
LOGITS = ("result_output", "[drafted logits]")

# llama.cpp's examples/model-conversion check-nmse.py names NMSE by these bands
NMSE_BANDS = ((0.0, "perfect match"), (1e-6, "essentially identical"), (1e-4, "excellent match"),
              (1e-3, "very good match"), (1e-2, "good match"), (0.1, "acceptable match"),
              (1.0, "poor match"))


def nmse_band(nmse: float) -> str:
    if nmse == 0:
        return NMSE_BANDS[0][1]
    for bound, name in NMSE_BANDS[1:]:
        if nmse < bound:
            return name
    return "very poor match (worse than noise)"


@dataclass
class MappedNode:
    graph: str          # the ggml side's file name
    name: str           # the torch side's node name (llama.cpp's, or [..] for outputs found by rule)
    found: str | None   # the ggml node it was compared with ("name #index")
    status: str         # ok | out of band | missing | shape | not compared
    rel_l2: float | None = None
    nmse: float | None = None
    detail: str = ""

    @property
    def kind(self) -> str:
        base = self.name.rsplit("-", 1)
        return base[0] if len(base) == 2 and base[1].isdigit() else self.name

    def to_dict(self) -> dict:
        return {"graph": self.graph, "name": self.name, "found": self.found, "status": self.status,
                "rel_l2": self.rel_l2, "nmse": self.nmse,
                "band": None if self.nmse is None else nmse_band(self.nmse), "detail": self.detail}


@dataclass
class AuthorsDiff:
    torch_side: str
    other_side: str
    other_engine: str
    band: float                      # on the logits
    nodes: list[MappedNode] = field(default_factory=list)
    argmax: list[tuple[str, int, int]] = field(default_factory=list)   # (graph, equal, rows)
    paths: list[tuple[str, int, int]] = field(default_factory=list)    # (graph, equal positions, positions)
    unmapped: int = 0
    notes: list[str] = field(default_factory=list)
    lone: list[str] = field(default_factory=list)
    node_band: float | None = None   # on the other nodes (the logits' band when None)
    # per graph, which argmax rows / selector steps agree (the arbiter excuses near ties row by row)
    agree_rows: dict[str, np.ndarray] = field(default_factory=dict)
    agree_steps: dict[str, np.ndarray] = field(default_factory=dict)

    def band_of(self, name: str) -> float:
        return self.band if name in LOGITS or self.node_band is None else self.node_band

    @property
    def compared(self) -> list[MappedNode]:
        return [n for n in self.nodes if n.status in ("ok", "out of band")]

    @property
    def first_bad(self) -> MappedNode | None:
        return next((n for n in self.nodes if n.status != "ok"), None)

    @property
    def agree(self) -> bool:
        return (bool(self.compared) and self.first_bad is None and not self.lone
                and all(e == n for _, e, n in self.argmax) and all(e == n for _, e, n in self.paths))

    def worst_by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n in self.compared:
            out[n.kind] = max(out.get(n.kind, 0.0), n.rel_l2)
        return out

    def to_dict(self) -> dict:
        return {"agree": self.agree, "torch": self.torch_side, "other": self.other_side,
                "other_engine": self.other_engine, "band_rel_l2": self.band,
                "band_rel_l2_nodes": self.node_band if self.node_band is not None else self.band,
                "compared": len(self.compared), "unmapped": self.unmapped,
                "first_out_of_band": None if self.first_bad is None else self.first_bad.to_dict(),
                "worst_rel_l2_by_kind": self.worst_by_kind(),
                "argmax": [{"graph": g, "equal": e, "rows": n} for g, e, n in self.argmax],
                "selector_path": [{"graph": g, "equal": e, "positions": n} for g, e, n in self.paths],
                "nodes": [n.to_dict() for n in self.nodes], "notes": self.notes, "no_partner": self.lone}

    def summary(self) -> dict:
        """One row of `graphgen check`'s table."""
        worst = max(self.compared, key=lambda n: n.rel_l2, default=None)
        eq = lambda xs: (sum(e for _, e, _ in xs), sum(t for _, _, t in xs)) if xs else None
        return {"mapped": len(self.compared), "worst": worst, "argmax": eq(self.argmax), "path": eq(self.paths),
                "verdict": "AGREE" if self.agree else "NOT COMPARED" if not self.compared else "DISAGREE"}

    def format_text(self) -> str:
        lines = [f"authors' model ({self.torch_side}) vs {self.other_engine} ({self.other_side})",
                 f"band: relative L2 < {self.band:g} (NMSE < {self.band ** 2:g})"
                 + ("" if self.node_band in (None, self.band) else
                    f" on the logits, < {self.node_band:.3g} on the other nodes")]
        graphs = []
        for n in self.nodes:
            if n.graph not in graphs:
                graphs.append(n.graph)
        for g in graphs:
            mine = [n for n in self.nodes if n.graph == g]
            ok = [n for n in mine if n.status in ("ok", "out of band")]
            worst = max(ok, key=lambda n: n.rel_l2, default=None)
            line = f"  {g}: {len(ok)} of {len(mine)} mapped nodes compared"
            if worst is not None:
                # check-nmse's names ("very good match") only beside a node that passes
                line += (f", worst relative L2 {worst.rel_l2:.2e} ({worst.name}, "
                         + (f"{nmse_band(worst.nmse)})" if worst.status == "ok" else "out of band)"))
            for gg, e, t in self.argmax:
                if gg == g:
                    line += f"; argmax {e}/{t}"
            for gg, e, t in self.paths:
                if gg == g:
                    line += f"; selector path {e}/{t}"
            lines.append(line)
        kinds = self.worst_by_kind()
        if kinds:
            lines.append("  worst relative L2 by node kind: " +
                         ", ".join(f"{k} {v:.1e}" for k, v in kinds.items()))
        lines.append(f"  unmapped on the {self.other_engine} side: {self.unmapped} nodes ({UNMAPPED_NOTE})")
        for note in self.notes:
            lines.append(f"  note: {note}")
        for lone in self.lone:
            lines.append(f"  NO PARTNER: {lone}")
        bad = self.first_bad
        if not self.compared:
            lines.append("NOT COMPARED: no mapped node was found with values on both sides")
        elif bad is not None:
            # no check-nmse band name here: beside a failure a name such as "very good match" misleads
            what = (f"relative L2 {bad.rel_l2:.3g}, NMSE {bad.nmse:.3g}, above the band"
                    if bad.rel_l2 is not None else bad.status)
            lines.append(f"DISAGREE: first mapped node out of band: {bad.name} in {bad.graph}: {what}"
                         + (f"; {bad.detail}" if bad.detail else ""))
        elif not self.agree:
            lines.append("DISAGREE: " + "; ".join(
                [f"argmax {e}/{t} in {g}" for g, e, t in self.argmax if e != t] +
                [f"selector path {e}/{t} in {g}" for g, e, t in self.paths if e != t] +
                [f"no partner for {x}" for x in self.lone]))
        else:
            lines.append(f"AGREE: {len(self.compared)} mapped nodes within the band")
        return "\n".join(lines)


def _find(entry: MapEntry, name: str, dump: Dump):
    nodes = dump.nodes
    if entry.select == "name":
        return next((n for n in nodes if n.name == name), None)
    if entry.select == "last":
        return nodes[-1] if nodes else None
    if entry.select == "last REPEAT":
        return next((n for n in reversed(nodes) if n.op == "REPEAT"), None)
    if entry.select == "lattice path":
        return next((n for n in nodes if n.name == "dflash2_lattice"), None)
    raise ValueError(entry.select)


def lattice_path(lattice: np.ndarray, top_k: int, n_blocks: int) -> np.ndarray:
    """The greedy walk of llama.cpp's DFlash2 driver through `dflash2_lattice` rows ([ids of the
    top-k candidates, then top_k x top_k transition scores] per block position), block by block."""
    rows = lattice.reshape(-1, lattice.shape[-1])
    per = rows.shape[0] // n_blocks
    path = []
    for b in range(n_blocks):
        pred = 0
        for i in range(1, per):
            row = rows[b * per + i]
            scores = row[top_k + pred * top_k: top_k + (pred + 1) * top_k]
            pred = int(np.argmax(scores))
            path.append(int(row[pred]))
    return np.array(path, np.int64)


def compare_values(a: np.ndarray, b: np.ndarray) -> tuple[float | None, str]:
    """Relative L2 of b against a over a's finite positions (a's NaN: no counterpart); infinities
    must sit at the same places with the same sign."""
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    keep = ~np.isnan(a)
    a, b = a[keep], b[keep]
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    if (inf_a != inf_b).any() or (np.sign(a[inf_a]) != np.sign(b[inf_b])).any():
        return None, f"infinities differ at {int((inf_a != inf_b).sum())} positions"
    if np.isnan(b).any():
        return None, f"{int(np.isnan(b).sum())} NaN where the authors' model has values"
    a, b = a[~inf_a], b[~inf_b]
    den = float(np.sqrt(np.sum(a * a)))
    num = float(np.sqrt(np.sum((b - a) ** 2)))
    if den == 0:
        return (0.0 if num == 0 else math.inf), ""
    return num / den, ""


def argmax_agree(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row of a that has values: whether a's and b's argmax agree."""
    a = a.reshape(-1, a.shape[-1])
    b = b.reshape(-1, b.shape[-1])
    rows = [i for i in range(a.shape[0]) if not np.isnan(a[i]).all()]
    return np.array([np.nanargmax(np.where(np.isnan(a[i]), -np.inf, a[i])) == np.argmax(b[i]) for i in rows], bool)


def _band_for(other: Dump) -> tuple[float, float]:
    """(logits band, other nodes' band) for what the ggml side cached."""
    types = {other.settings.get("type_k"), other.settings.get("type_v")}
    if types == {"f32"}:
        return BAND_F32, BAND_F32
    if types <= {"f32", "f16"}:
        return BAND_F16, BAND_F16_NODES
    raise DumpError(f"{other.path}: the bands are set for f32 and f16 caches, this dump cached "
                    f"{'/'.join(sorted(t or '?' for t in types))}: give one with --nmse")


def _describe(d: Dump) -> str:
    s = d.source
    if s.get("engine") == "torch":
        return f"{s.get('authors', '?')}, torch {s.get('torch', '?')}"
    if s.get("engine") == "llama.cpp":
        return f"llama.cpp {s.get('version', '?')}, ggml {s.get('ggml', '?')}, cache {d.settings.get('type_k')}/{d.settings.get('type_v')}"
    return f"graphgen {s.get('version', '?')}, ggml {s.get('ggml', '?')}, cache {d.settings.get('type_k')}/{d.settings.get('type_v')}"


def _entry_for(name: str) -> MapEntry | None:
    for e in TENSOR_MAP:
        if e.node == name:
            return e
        if "{il}" in e.node:
            stem = e.node.split("{il}")[0]
            rest = name[len(stem):] if name.startswith(stem) else ""
            if rest.isdigit():
                return e
    return None


def _compare_into(res: AuthorsDiff, t: Dump, o: Dump) -> None:
    gname = f"{t.path.name if t.path else t.graph} / {o.path.name if o.path else o.graph}"
    matched: set[int] = set()
    # the argmax is read from what a driver drafts with: DSpark's biased logits when there are some
    argmax_of = "[drafted logits]" if any(n.name == "[drafted logits]" for n in t.nodes) else "result_output"
    for tn in t.nodes:
        entry = _entry_for(tn.name)
        if entry is None:
            res.nodes.append(MappedNode(gname, tn.name, None, "missing", detail="not in the tensor map"))
            continue
        a = t.values(tn.index)
        on = _find(entry, tn.name, o)
        if on is None:
            res.nodes.append(MappedNode(gname, tn.name, None, "missing",
                                        detail=f"no node {entry.select == 'name' and repr(tn.name) or entry.select} "
                                               f"in the {res.other_engine} graph"))
            continue
        matched.add(on.index)
        found = f"{on.name} #{on.index}"
        b = o.values(on.index)
        if a is None or b is None:
            res.nodes.append(MappedNode(gname, tn.name, found, "not compared",
                                        detail="values not kept in the " + ("torch" if a is None else res.other_engine) + " dump"))
            continue
        if entry.kind == "tokens":
            top_k = int(t.source.get("selector_top_k", 0))
            n_rows = int(np.prod(b.shape[:-1]))
            n_blocks = n_rows - a.size
            if top_k <= 0 or n_blocks <= 0 or n_rows % n_blocks:
                res.nodes.append(MappedNode(gname, tn.name, found, "not compared",
                                            detail="cannot walk the lattice (top_k or block count unknown)"))
                continue
            path = lattice_path(b, top_k, n_blocks)
            steps = path == a.astype(np.int64).ravel() if path.size == a.size else np.zeros(a.size, bool)
            res.agree_steps[gname.split(" / ")[0]] = steps
            eq = int(steps.sum())
            res.paths.append((gname, eq, int(a.size)))
            status = "ok" if eq == a.size else "out of band"
            res.nodes.append(MappedNode(gname, tn.name, found, status, 0.0 if eq == a.size else 1.0,
                                        0.0 if eq == a.size else 1.0,
                                        detail=f"path {a.astype(int).tolist()} vs {path.tolist()}" if status != "ok" else ""))
            continue
        if list(on.ne) != list(tn.ne):
            res.nodes.append(MappedNode(gname, tn.name, found, "shape",
                                        detail=f"ne {tn.ne} (torch) vs {on.ne} ({res.other_engine})"))
            continue
        rel, why = compare_values(a, b)
        if rel is None:
            res.nodes.append(MappedNode(gname, tn.name, found, "out of band", None, None, why))
            continue
        status = "ok" if rel < res.band_of(tn.name) else "out of band"
        res.nodes.append(MappedNode(gname, tn.name, found, status, rel, rel * rel))
        if tn.name == argmax_of:
            ok = argmax_agree(a, b)
            res.agree_rows[gname.split(" / ")[0]] = ok
            res.argmax.append((gname, int(ok.sum()), int(ok.size)))
    res.unmapped += len(o.nodes) - len(matched)


def is_torch_side(dumps: list[Dump]) -> bool:
    return any(d.source.get("engine") == "torch" for d in dumps)


def compare_paths(a_path, b_path, band: float | None = None) -> AuthorsDiff:
    """Either side may be the torch one; graphs pair by kind and step as graph-diff pairs them."""
    from ..compare.pairing import load_side, pair_graphs
    a_side, b_side = load_side(a_path), load_side(b_path)
    a_torch, b_torch = is_torch_side(a_side), is_torch_side(b_side)
    if a_torch == b_torch:
        raise DumpError(f"{a_path} / {b_path}: an authors' comparison takes one torch dump and one ggml dump "
                        f"({'both are' if a_torch else 'neither is'} torch)")
    t_side, o_side, t_path, o_path = (a_side, b_side, a_path, b_path) if a_torch else (b_side, a_side, b_path, a_path)
    if any(d.source.get("engine") not in ("llama.cpp", "graphgen") for d in o_side):
        raise DumpError(f"{o_path}: the other side must be llama.cpp or graphgen dumps")
    if not o_side:
        raise DumpError(f"{o_path}: no dumps")
    pairs, lone_t, lone_o = pair_graphs(t_side, o_side)
    res = AuthorsDiff(_describe(t_side[0]) if t_side else "?", _describe(o_side[0]),
                      o_side[0].source.get("engine", "?"), 0.0)
    res.band, res.node_band = (band, band) if band is not None else _band_for(o_side[0])
    for t, o in pairs:
        _compare_into(res, t, o)
    res.lone = [f"torch {d.path.name}" for d in lone_t] + [f"{res.other_engine} {d.path.name}" for d in lone_o]
    t0 = t_side[0] if t_side else None
    if t0 is not None and o_side[0].scenario and t0.scenario and \
            o_side[0].scenario.get("digest") != t0.scenario.get("digest"):
        res.notes.append("the two sides ran different scenarios (digests differ)")
    return res


def own_errors(torch_path, ggml_path, model, lenders=()) -> dict:
    """Each mapped node's own error on the authors' values (graphgen.compare.local): the ggml node
    re-run alone with its sources set to the authors' values of their mapped partners. Only nodes
    whose every source the tensor map covers can be (l_out from ffn_out and ffn_inp, the output
    head from result_norm); the rest say which source has no authors' counterpart."""
    from ..compare.local import local_errors
    from ..compare.pairing import load_side, pair_graphs
    from ..compare.report import source_indices
    t_side, o_side = load_side(torch_path), load_side(ggml_path)
    rows, reasons = [], {}
    for t, o in pair_graphs(t_side, o_side)[0]:
        t_at = {n.name: n.index for n in t.nodes}
        ref_of: dict[int, int] = {}
        for tn in t.nodes:
            entry = _entry_for(tn.name)
            on = _find(entry, tn.name, o) if entry is not None and entry.kind != "tokens" else None
            if on is not None and list(on.ne) == list(tn.ne):
                ref_of[on.index] = t_at[tn.name]
        by_name = source_indices(o.nodes)

        def slots(j, o=o, by_name=by_name):
            n = o.nodes[j]
            at = n.src_at or [None] * len(n.src)
            return [(s, k if k is not None else by_name[j][i]) for i, (s, k) in enumerate(zip(n.src, at))]
        pairs = [(i, j) for j, i in sorted(ref_of.items())]
        for j, loc in sorted(local_errors(t, o, pairs, ref_of, slots, model=model, lenders=list(lenders)).items()):
            row = {"graph": o.path.name, "name": o.nodes[j].name, "op": o.nodes[j].op, "kind": loc.kind,
                   "own_nmse": loc.nmse, "why": loc.why, "source": loc.source}
            rows.append(row)
            if loc.kind == "skipped":
                reasons.setdefault(loc.why, []).append(f"{row['name']} ({loc.source or ''})".replace(" ()", ""))
    return {"rows": rows, "rerun": sum(r["kind"] == "rerun" for r in rows),
            "views": sum(r["kind"] == "view" for r in rows), "skipped": sum(r["kind"] == "skipped" for r in rows),
            "not_rerun": [{"why": w, "count": len(v), "nodes": v[:6]} for w, v in reasons.items()]}
