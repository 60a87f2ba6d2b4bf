"""Who is right when the authors' model and llama.cpp part: the authors' model run in float64.

Two float32 implementations of the same draft never agree bit for bit, and a fixed band between
them cannot say which one drifted: on deeper drafts the authors' own float32 forward is often the
farther from the exact result. `graphgen check` therefore runs the authors' model a second time in
float64 on the same weights and inputs (the arbiter) and measures each side's distance to it on
every mapped node (relative L2, ||side - arbiter|| / ||arbiter||):

    e_authors    the authors' float32 forward
    e_llama      llama.cpp b11739 (and graphgen, identical to it)

llama.cpp departs at a node when e_llama exceeds that node's band:

    band = max(floor(cache type, depth), RATIO * e_authors)

- floor: the rounding a float32 forward may gather by that depth: UNIT[type] * GROWTH * (1 + depth),
  UNIT the unit roundoff of what llama.cpp cached (2^-24 for f32, 2^-11 for f16), depth 0 for the
  injected rows and the block's embeddings, il + 1 inside layer il, n_layer + 1 for the outputs;
- RATIO * e_authors: where the computation is ill-conditioned, the authors' own float32 forward
  shows how far any float32 implementation lands from exact; llama.cpp may land RATIO times
  farther (another summation order, its f16 conversions) before it is blamed.

A draft that borrows its target's output head (b11739's ctx_other) multiplies by the target's
tensor as the target stores it; `check -m TARGET.gguf` lends a quantized or f16 one. ggml rounds a
matmul's input to the weight's dot-product type first (8-bit blocks for a quantized weight, f16 or
bf16 for those), while the authors' model multiplies float32 by the same dequantized values. On
the nodes that head computes (`result_output`, DSpark's `[drafted logits]`) the band then admits
that rounding too: RATIO times e_head, the relative L2 by which rounding the arbiter's own head
input (`result_norm`) so moves it (`head_rounding`).

The arbiter's values are kept in float32 once computed (a relative rounding of 6e-8, below every
floor), and transformers builds its rotary tables in float32 whatever the model's type. A node
where the authors' float32 forward is farther from exact than llama.cpp's rounding explains is
reported as the authors' drift, never as llama.cpp's departure. Argmax rows and DFlash2 selector
paths: llama.cpp's must equal the arbiter's, except where the authors' float32 forward parts from
the arbiter too (a near tie, which rounding decides).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..dump.format import Dump
from .compare import AuthorsDiff, _entry_for, argmax_agree, compare_values

UNIT = {"f32": 2.0 ** -24, "f16": 2.0 ** -11}
GROWTH = 64.0
RATIO = 4.0


# the nodes a borrowed output head computes, and the node that is its input
HEAD_NODES = ("result_output", "[drafted logits]")
HEAD_INPUT = "result_norm"
# ggml's CPU dot-product type of a quantized weight: 8-bit blocks of 32 (q8_0, q8_1) for these,
# of 256 (q8_K) for the k- and i-quants
BLOCK32 = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "iq4_nl", "mxfp4")


def head_rounding(x: np.ndarray, head_type: str | None) -> float:
    """Relative L2 by which ggml's rounding of a matmul's input, for a weight of `head_type`,
    moves the rows `x` (their last axis the one multiplied): 0 for f32, f16 / bf16 rounding for
    those, else 8 bits per block (scale: the block's largest magnitude / 127)."""
    t = (head_type or "f32").lower()
    x = np.asarray(x, dtype=np.float64)
    x = x.reshape(-1, x.shape[-1])
    if t == "f32":
        return 0.0
    if t == "f16":
        r = x.astype(np.float16).astype(np.float64)
    elif t == "bf16":
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000   # to nearest, ties to even
        r = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    else:
        block = 32 if t in BLOCK32 else 256
        if x.shape[1] % block:   # no such weight in ggml: a row is one block
            block = x.shape[1]
        xb = x.reshape(-1, block)
        step = np.abs(xb).max(axis=1, keepdims=True) / 127.0
        r = (np.round(xb / np.where(step == 0, 1.0, step)) * step).reshape(x.shape)
    den = float(np.sqrt(np.sum(x * x)))
    return float(np.sqrt(np.sum((r - x) ** 2))) / den if den else 0.0


def node_depth(name: str, n_layer: int) -> int:
    stem, _, tail = name.rpartition("-")
    if stem and tail.isdigit():
        return int(tail) + 1
    if name in ("inp_g_embeddings", "inp_noise_embd"):
        return 0
    return n_layer + 1


def floor_band(cache: str, depth: int) -> float:
    if cache not in UNIT:
        raise ValueError(f"no band for a {cache} cache (f32 and f16 are arbitrated)")
    return UNIT[cache] * GROWTH * (1 + depth)


@dataclass
class Judged:
    graph: str
    name: str
    depth: int
    floor: float
    e_authors: float | None
    e_llama: float | None
    e_graphgen: float | None
    e_head: float | None = None   # a borrowed head's rounding of its input (HEAD_NODES only)

    @property
    def band(self) -> float:
        if self.e_head:
            return max(self.floor, RATIO * (self.e_authors or 0.0), RATIO * self.e_head)
        return max(self.floor, RATIO * (self.e_authors or 0.0))

    @property
    def llama_departs(self) -> bool:
        return self.e_llama is None or self.e_llama > self.band

    @property
    def authors_drift(self) -> bool:
        """The authors' float32 forward is farther from exact than llama.cpp's rounding explains."""
        if self.e_authors is None or self.e_llama is None:
            return False
        return self.e_authors > max(UNIT["f32"] * GROWTH * (1 + self.depth), RATIO * self.e_llama)

    def to_dict(self) -> dict:
        return {"graph": self.graph, "name": self.name, "depth": self.depth, "floor": self.floor,
                "band": self.band, "head_rounding": self.e_head, "authors_f32": self.e_authors,
                "llama.cpp": self.e_llama,
                "graphgen": self.e_graphgen, "llama.cpp_departs": self.llama_departs,
                "authors_f32_drifts": self.authors_drift}


@dataclass
class Arbitration:
    cache: str
    nodes: list[Judged] = field(default_factory=list)
    # (graph, rows, llama.cpp's rows equal to the arbiter's, of those not, the ones the authors'
    # float32 also misses)
    argmax: list[tuple[str, int, int, int]] = field(default_factory=list)
    paths: list[tuple[str, int, int, int]] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)   # arbiter nodes no side had
    head_type: str | None = None   # the type of a borrowed output head, when not f32

    @property
    def compared(self) -> list[Judged]:
        return [n for n in self.nodes if n.e_llama is not None]

    @property
    def first_departure(self) -> Judged | None:
        return next((n for n in self.nodes if n.llama_departs), None)

    @property
    def drifts(self) -> list[Judged]:
        return [n for n in self.nodes if n.authors_drift]

    def choices_depart(self) -> list[str]:
        """Argmax rows and selector steps where llama.cpp alone parts from the arbiter."""
        out = []
        for kind, rows in (("argmax", self.argmax), ("selector path", self.paths)):
            for g, n, eq, excused in rows:
                if n - eq - excused > 0:
                    out.append(f"{kind} {eq}/{n} in {g} ({n - eq - excused} not explained by a near tie)")
        return out

    @property
    def agree(self) -> bool:
        return bool(self.compared) and self.first_departure is None and not self.choices_depart() \
            and not self.unmatched

    def worst(self, side: str) -> Judged | None:
        key = {"authors": "e_authors", "llama.cpp": "e_llama", "graphgen": "e_graphgen"}[side]
        have = [n for n in self.nodes if getattr(n, key) is not None]
        return max(have, key=lambda n: getattr(n, key), default=None)

    def lines(self) -> list[str]:
        out = [f"  distance to the float64 arbiter (relative L2; band per node: max({UNIT[self.cache]:.3g} x "
               f"{GROWTH:g} x (1 + depth), {RATIO:g} x the authors' f32 distance), {self.cache} cache):"]
        for side, key in (("authors' f32", "authors"), ("llama.cpp", "llama.cpp"), ("graphgen", "graphgen")):
            w = self.worst(key)
            attr = {"authors": "e_authors", "llama.cpp": "e_llama", "graphgen": "e_graphgen"}[key]
            out.append(f"    {side:13s} worst {getattr(w, attr):.2e} ({w.name}, {w.graph})" if w else
                       f"    {side:13s} -")
        for g, n, eq, excused in self.argmax:
            out.append(f"    argmax in {g}: llama.cpp {eq}/{n} rows as the arbiter"
                       + (f" ({excused} near ties the authors' f32 misses too)" if excused else ""))
        for g, n, eq, excused in self.paths:
            out.append(f"    selector path in {g}: llama.cpp {eq}/{n} steps as the arbiter"
                       + (f" ({excused} near ties the authors' f32 misses too)" if excused else ""))
        heads = [n for n in self.nodes if n.e_head]
        if heads:
            w = max(heads, key=lambda n: n.e_head)
            names = ", ".join(sorted({n.name for n in heads}))
            out.append(f"    the borrowed output head is {self.head_type}: llama.cpp rounds its input for it (moving "
                       f"{HEAD_INPUT} by up to {w.e_head:.2e}), which the band of {names} allows {RATIO:g} times")
        drifts = self.drifts
        if drifts:
            w = max(drifts, key=lambda n: n.e_authors)
            out.append(f"    the authors' f32 forward drifts: on {len(drifts)} node(s) it is farther from exact "
                       f"than llama.cpp's rounding explains (worst {w.name}: {w.e_authors:.2e} vs llama.cpp "
                       f"{w.e_llama:.2e})")
        for u in self.unmatched:
            out.append(f"    NOT COMPARED: {u}")
        return out

    def to_dict(self) -> dict:
        return {"agree": self.agree, "cache": self.cache, "unit": UNIT[self.cache], "growth": GROWTH,
                "ratio": RATIO, "head_type": self.head_type, "nodes": [n.to_dict() for n in self.nodes],
                "argmax": [{"graph": g, "rows": n, "equal": e, "near_ties": x} for g, n, e, x in self.argmax],
                "selector_path": [{"graph": g, "steps": n, "equal": e, "near_ties": x} for g, n, e, x in self.paths],
                "first_departure": None if self.first_departure is None else self.first_departure.to_dict(),
                "authors_f32_drifts": [n.name for n in self.drifts], "not_compared": self.unmatched}


def _by_name(diff: AuthorsDiff) -> dict[tuple[str, str], float | None]:
    """(arbiter graph file, node name) -> relative L2 against the arbiter, None when not compared."""
    return {(n.graph.split(" / ")[0], n.name): n.rel_l2 if n.status in ("ok", "out of band") else None
            for n in diff.nodes}


def arbitrate(arbiter: list[Dump], authors: list[Dump], vs_llama: AuthorsDiff, vs_graphgen: AuthorsDiff,
              n_layer: int, cache: str, head_type: str | None = None) -> Arbitration:
    """`arbiter` and `authors`: the float64 and float32 torch dumps of one scenario, in the same
    order; `vs_llama` / `vs_graphgen`: compare_paths(arbiter folder, that side's folder);
    `head_type`: the type of the output head the draft borrows from its target (None: its own, or f32)."""
    head_type = None if (head_type or "f32").lower() == "f32" else head_type.lower()
    res = Arbitration(cache, head_type=head_type)
    e_l, e_g = _by_name(vs_llama), _by_name(vs_graphgen)
    if len(arbiter) != len(authors):
        res.unmatched.append(f"the float64 run made {len(arbiter)} graphs, the float32 run {len(authors)}")
    for arb, a32 in zip(arbiter, authors):
        g = arb.path.name if arb.path else arb.graph
        a_nodes = {n.name: n for n in a32.nodes}
        argmax_of = "[drafted logits]" if "[drafted logits]" in a_nodes else "result_output"
        # the cache's rounding reaches the block from the first attention output on
        unit = "f32"
        head_in = next((n for n in arb.nodes if n.name == HEAD_INPUT), None) if head_type else None
        x_head = arb.values(head_in.index) if head_in is not None else None
        for node in arb.nodes:
            if node.name.startswith("kqv_out-") and arb.graph == "block":
                unit = cache
            entry = _entry_for(node.name)
            x = arb.values(node.index)
            an = a_nodes.get(node.name)
            y = a32.values(an.index) if an is not None else None
            if (g, node.name) not in e_l:
                res.unmatched.append(f"{node.name} in {g}: not found on the llama.cpp side")
                continue
            if x is None or y is None:
                res.unmatched.append(f"{node.name} in {g}: no values in the authors' f32 or float64 run")
                continue
            if entry is not None and entry.kind == "tokens":
                steps = vs_llama.agree_steps.get(g)
                if steps is not None:
                    a_ok = x.astype(np.int64).ravel() == y.astype(np.int64).ravel()
                    res.paths.append((g, int(steps.size), int(steps.sum()), int((~steps & ~a_ok).sum())))
                continue
            e_a, _ = compare_values(x, y)
            depth = node_depth(node.name, n_layer)
            e_h = head_rounding(x_head, head_type) if node.name in HEAD_NODES and x_head is not None else None
            res.nodes.append(Judged(g, node.name, depth, floor_band(unit, depth), e_a, e_l[(g, node.name)],
                                    e_g.get((g, node.name)), e_h))
            rows = vs_llama.agree_rows.get(g)
            if node.name == argmax_of and rows is not None:
                a_ok = argmax_agree(x, y)
                res.argmax.append((g, int(rows.size), int(rows.sum()), int((~rows & ~a_ok).sum())))
    return res
