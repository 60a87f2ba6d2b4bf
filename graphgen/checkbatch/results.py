"""What a check found: each sequence's, each case's and the whole run's results, told as the
command's table, its JSON, and an exit code with the reason for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .plan import Settings


@dataclass
class SeqResult:
    seq: int
    n_tokens: int
    pos0: int
    outputs_nmse: float = 0.0        # the largest over the outputs, batched against alone (same cache)
    outputs_identical: bool = True
    nodes_compared: int = 0
    nodes_differ: int = 0
    nodes_skipped: int = 0           # no single axis tells the sequence's rows
    worst_node: str | None = None
    worst_nmse: float = 0.0
    first_node: str | None = None    # the first node in graph order that differs
    own_outputs_nmse: float = 0.0    # outputs, batched against the own-cache run
    own_outputs_identical: bool = True

    @property
    def identical(self) -> bool:
        return self.nodes_differ == 0 and self.outputs_identical and self.own_outputs_identical

    def to_dict(self) -> dict:
        return {"seq": self.seq, "n_tokens": self.n_tokens, "pos0": self.pos0, "identical": self.identical,
                "outputs_nmse": self.outputs_nmse, "outputs_identical": self.outputs_identical,
                "nodes_compared": self.nodes_compared, "nodes_differ": self.nodes_differ,
                "nodes_skipped": self.nodes_skipped, "worst_node": self.worst_node, "worst_nmse": self.worst_nmse,
                "first_node": self.first_node, "own_cache_outputs_nmse": self.own_outputs_nmse,
                "own_cache_outputs_identical": self.own_outputs_identical}




@dataclass
class CaseResult:
    n_seq: int
    kind: str
    note: str | None = None
    seqs: dict = field(default_factory=dict)   # engine -> [SeqResult]
    reproducible: dict = field(default_factory=dict)  # engine -> the batched block was the same in every run
    prompts: list = field(default_factory=list)        # each sequence's prompt length

    def to_dict(self) -> dict:
        d = {"n_seq": self.n_seq, "blocks": self.kind}
        if self.note:
            d["note"] = self.note
            return d
        d["engines"] = {e: {"reproducible": self.reproducible[e], "sequences": [s.to_dict() for s in seqs]}
                        for e, seqs in self.seqs.items()}
        return d


@dataclass
class Report:
    model: str
    settings: Settings
    block: int
    prompt: int
    engines: tuple
    cases: list = field(default_factory=list)
    parity: dict | None = None   # graphs, nodes, first difference (both engines)
    fail_on: str = "batch"       # what exit 1 says: "batch" (a dependence, or the engines differ), "parity"

    def dependent(self, engine: str) -> bool:
        return any(not s.identical for c in self.cases if not c.note for s in c.seqs[engine]) or \
            any(not c.reproducible[engine] for c in self.cases if not c.note)

    def engines_differ(self) -> bool:
        return self.parity is not None and not self.parity["identical"]

    def exit_code(self) -> int:
        if self.fail_on == "parity":
            return 1 if self.engines_differ() else 0
        return 1 if self.engines_differ() or any(self.dependent(e) for e in self.engines) else 0

    def exit_reason(self) -> str:
        """Why the command exits as it does, in words."""
        if self.fail_on == "parity":
            return ("exit 1: the engines' graphs differ" if self.engines_differ() else
                    "exit 0: the engines' graphs are bit-identical (--fail-on parity: a batch dependence both share "
                    "does not fail)")
        if self.engines_differ():
            return "exit 1: the engines' graphs differ"
        dep = [label(e) for e in self.engines if self.dependent(e)]
        if dep:
            return f"exit 1: results depend on the batch in {' and '.join(dep)}"
        return "exit 0: no result depends on the batch"

    def verdict(self, engine: str) -> str:
        ran = [c for c in self.cases if not c.note]
        seqs = [s for c in ran for s in c.seqs[engine]]
        if not self.dependent(engine):
            return (f"{label(engine)}: results do not depend on the batch: {len(seqs)} sequences in {len(ran)} batches, "
                    "every compared node bit-identical batched and alone, and every output the same in a cache of its own")
        bad = [s for s in seqs if not s.identical]
        where = ", ".join(f"{sum(not s.identical for s in c.seqs[engine])} of {c.n_seq} at n_seq {c.n_seq} {c.kind} blocks"
                          for c in ran if any(not s.identical for s in c.seqs[engine]))
        worst = max(bad, key=lambda s: max(s.outputs_nmse, s.own_outputs_nmse), default=None)
        text = (f"{label(engine)}: results DEPEND on the batch: {len(bad)} of the {len(seqs)} sequences checked "
                f"{'differs' if len(bad) == 1 else 'differ'} batched from alone ({where})")
        if worst is not None:
            text += (f"; outputs NMSE up to {max(worst.outputs_nmse, worst.own_outputs_nmse):.3g}, "
                     f"first differing node {worst.first_node or '(an output)'}")
        if any(not c.reproducible[engine] for c in ran):
            text += "; the same batched block computed twice differs"
        return text

    def to_dict(self) -> dict:
        st = self.settings
        return {"model": self.model, "settings": {"n_ctx": st.n_ctx, "n_ubatch": st.n_ubatch,
                                                  "flash_attn": st.flash_attn, "type_k": st.type_k,
                                                  "type_v": st.type_v, "seed": st.seed, "block": self.block,
                                                  "prompt": self.prompt},
                "engines": list(self.engines),
                "batch_dependent": {e: self.dependent(e) for e in self.engines},
                "verdict": {e: self.verdict(e) for e in self.engines},
                "cases": [c.to_dict() for c in self.cases], "parity": self.parity, "fail_on": self.fail_on,
                "exit_code": self.exit_code()}

    def format_text(self) -> str:
        st = self.settings
        prompts = sorted({p for c in self.cases for p in c.prompts} or {self.prompt})
        fa = "on" if st.flash_attn else "off"
        if st.flash_attn_asked == "auto":
            fa += " (-fa auto)"
        lines = [f"check-batch {self.model}: flash attention {fa}, KV cache {st.type_k}/{st.type_v}, block {self.block}, "
                 f"prompts of {prompts[0]}" + (f" to {prompts[-1]}" if len(prompts) > 1 else "") + f" rows, seed {st.seed}",
                 f"  context -c {st.n_ctx}: the largest case's prompts and blocks take {st.cells} cells; micro-batch "
                 f"-ub {st.n_ubatch}: the longest step sends {st.longest} tokens, computed as one graph"]
        for e in self.engines:
            lines += ["", f"{label(e)} (each sequence batched against alone, same cache; own: outputs against "
                          "a cache of its own)",
                      f"{'n_seq':>5}  {'blocks':<8} {'identical':>9}  {'max NMSE outputs':>16}  {'own':>9}  "
                      f"{'nodes':>6}  worst node"]
            for c in self.cases:
                if c.note:
                    lines.append(f"{c.n_seq:>5}  {c.kind:<8} {c.note}")
                    continue
                seqs = c.seqs[e]
                ok = sum(s.identical for s in seqs)
                worst = max(seqs, key=lambda s: s.worst_nmse)
                wn = f"{worst.worst_node} ({worst.worst_nmse:.3g})" if worst.worst_node else "-"
                if not c.reproducible[e]:
                    wn += "; batched block not reproducible"
                lines.append(f"{c.n_seq:>5}  {c.kind:<8} {f'{ok}/{len(seqs)}':>9}  "
                             f"{max(s.outputs_nmse for s in seqs):>16.3g}  {max(s.own_outputs_nmse for s in seqs):>9.3g}  "
                             f"{min(s.nodes_compared for s in seqs):>6}  {wn}")
        lines.append("")
        lines += [self.verdict(e) for e in self.engines]
        if self.parity is not None:
            p = self.parity
            lines.append(f"graphgen vs {label('llama.cpp')}: {p['graphs']} block graphs, {p['nodes']} nodes: "
                         + ("bit-identical" if p["identical"] else f"DIFFER ({p['first']})"))
        lines.append(self.exit_reason())
        return "\n".join(lines)


def label(engine: str) -> str:
    return "llama.cpp b11739" if engine == "llama.cpp" else engine
