"""A draft's acceptance behind a quantized target and behind float copies of the same weights.

z-lab/dflash#152 reports drafts whose acceptance collapses behind a quantized target. Here one
draft runs behind copies of one target GGUF that differ only in the type the weights are stored
in: the file itself (Q4_1 for `smollm2`) and its f16 and f32 copies (`features.dequantized`:
the same dequantized values, so what differs is how b11739 multiplies, not the weights). Per copy:

- the acceptance in the speculative loop (`compare.run_engines`: b11739's drafting, graphgen's
  too if asked; greedy, the held-out prompts), whose own text the target generates;
- the inputs of the draft's target layers (the draft GGUF's `dflash.target_layers`), for every
  prompt followed by the reference copy's generated tokens (the same tokens for every copy), and
  their NMSE against the reference copy's (f32) per layer.

The mean acceptance length `tau` is the field's (`EngineRun.mean_acceptance_length`): 1 + accepted
drafted tokens per draft, the target's own token counted, so a draft that never hits is 1.0.
Everything but the timings is deterministic: greedy loops, one sequence per feature run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import GraphgenError
from . import features as F

REFERENCE = "f32"
DEFAULT_TYPES = ("q4_1", "f16", "f32")
# A copy whose features at a draft layer are farther than this from the f32 copy's (NMSE over
# positions 1..) is no copy of the same weights: the Q4_1 file is 1e-4 to 4e-4 from it and the
# f16 copy 4e-7 (docs/acceptance.md), while one layer's matrices zeroed gives 0.1 at the draft
# layers past it and a layer off by one ~1. The bound is a 10% relative RMS error.
MAX_NMSE = 1e-2


class QuantizedError(GraphgenError, ValueError):
    """A target type, copy list or draft the measurement cannot take; the message names it."""


def file_type(path) -> str:
    """The GGUF's weight type as a short name (general.file_type): q4_1, f16, f32, q8_0, ..."""
    import gguf
    from ..ggufile import field_value, open_reader
    value = field_value(open_reader(Path(path)), "general.file_type")
    if value is None:
        raise QuantizedError(f"{path}: no key 'general.file_type'; name its copies explicitly")
    try:
        name = gguf.LlamaFileType(int(value)).name
    except ValueError:
        raise QuantizedError(f"{path}: key 'general.file_type' = {value} is no llama.cpp file type") from None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()


def target_copies(target, types=DEFAULT_TYPES) -> dict[str, Path]:
    """{type: GGUF} for `types`: the target's own type is the file itself, f16 and f32 its
    dequantized copies in graphgen's cache (made once)."""
    path = F.target_shape(target)[0]
    own = file_type(path)
    out = {}
    for t in types:
        if t in out:
            raise QuantizedError(f"types: {t!r} is named twice")
        if t == own:
            out[t] = path
        elif t in F.DEQUANT_TYPES:
            out[t] = F.dequantized(path, t)
        else:
            raise QuantizedError(f"type {t!r}: {path.name} is {own}; the types are {own} (the file itself) and "
                                 f"the copies {', '.join(F.DEQUANT_TYPES)}")
    if not out:
        raise QuantizedError("types: empty; name at least the reference f32")
    return out


def draft_layers(draft) -> list[int]:
    """The target layer inputs the draft GGUF reads (dflash.target_layers)."""
    from ..speculative.pair import LAYERS_KEY, draft_info
    layers = draft_info(Path(draft)).target_layers
    if not layers:
        raise QuantizedError(f"{draft}: no key {LAYERS_KEY!r}; not a DFlash-family draft")
    return [int(il) for il in layers]


def sequence_features(target, layers, seqs, n_threads: int = 1) -> list[np.ndarray]:
    """b11739's inputs of `layers` for each token list of `seqs`, each its own sequence from
    position 0 in one child process: [float32 [n_i, len(layers), n_embd]] (features.llama_run's
    context settings)."""
    from ..reference.session import ReferenceTarget
    checked = [F._check(target, layers, s) for s in seqs]
    if not checked:
        raise QuantizedError("seqs: empty; give at least one token list")
    path, layers, _, n_embd = checked[0]
    n_ctx = -(-max(len(c[2]) for c in checked) // 256) * 256
    out = []
    with ReferenceTarget(path, layers, n_ctx=n_ctx, n_batch=256, n_seq=1, n_threads=n_threads,
                         **F.LLAMA_DEFAULTS) as t:
        for _, _, tokens, _ in checked:
            t.seq_rm(0, -1, -1)  # each list alone: none attends to the one before
            rows = []
            for p0 in range(0, len(tokens), t.n_batch):
                rows.append(t.decode([(0, tok, p0 + k) for k, tok in enumerate(tokens[p0:p0 + t.n_batch])])[2])
            out.append(np.concatenate(rows).reshape(len(tokens), len(layers), n_embd))
    return out


def _tokenize(target, texts) -> list[list[int]]:
    from ..reference.session import ReferenceTarget
    with ReferenceTarget(target, [0], n_ctx=256, n_batch=64, n_seq=1) as t:
        return [t.tokenize(x) for x in texts]


def feature_nmse(feats, ref) -> tuple[list[float], list[float]]:
    """Per layer, the NMSE of `feats` against `ref` (lists of per-sequence arrays as
    sequence_features returns) over positions 1.. of every sequence, and over every position.
    SmolLM2 gives each sequence's first token a massive activation from layer 12 on (99% of the
    layer's squared norm); with it, the NMSE would mostly measure that one row."""
    if len(feats) != len(ref):
        raise QuantizedError(f"feature_nmse: {len(feats)} sequences against {len(ref)}")
    rest = F.nmse(np.concatenate([f[1:] for f in feats]), np.concatenate([r[1:] for r in ref]))
    every = F.nmse(np.concatenate(feats), np.concatenate(ref))
    return [float(v) for v in rest], [float(v) for v in every]


def divergence(runs: dict) -> str | None:
    """Where b11739's and graphgen's drafting part in one copy's runs ({engine: EngineRun}), as
    compare.first_divergence describes it; None where they agree or only one engine ran."""
    from .compare import first_divergence
    if "llama.cpp" not in runs or "graphgen" not in runs:
        return None
    d = first_divergence(runs["llama.cpp"], runs["graphgen"])
    return None if d is None else d.describe()


def same_text_rounds(run, ref, same) -> dict:
    """Over the prompts whose generated text is the reference copy's (`same`, per prompt): the
    rounds of `run` and `ref` (EngineRun, one copy's and the reference's) that start at the same
    position, how many of them drafted other tokens, and what each accepted in them. The draft
    is asked the same question there; what differs is what it is fed (the target's features and
    its borrowed embeddings and head in the copy's type)."""
    out = {"prompts": 0, "rounds": 0, "drafts_apart": 0, "accepted": 0, "accepted_ref": 0}
    for p, alike in enumerate(same):
        if not alike:
            continue
        out["prompts"] += 1
        theirs = {r["pos0"]: r for r in ref.rounds[p]}
        for r in run.rounds[p]:
            o = theirs.get(r["pos0"])
            if o is None:
                continue
            out["rounds"] += 1
            out["drafts_apart"] += r["draft"] != o["draft"]
            out["accepted"] += r["n_accepted"]
            out["accepted_ref"] += o["n_accepted"]
    return out


@dataclass
class CopyRun:
    """One target copy behind the draft: its loops and its features' distance to the reference."""
    label: str
    path: Path
    runs: dict                 # engine -> compare.EngineRun
    nmse: list                 # per draft layer, positions 1.. of every sequence, against the reference copy
    nmse_all: list             # the same over every position
    same_text: list            # per prompt: whether its generated tokens are the reference copy's
    divergence: str | None = None   # where b11739's and graphgen's drafting part (both engines run)
    same_text_rounds: dict = field(default_factory=dict)   # against the reference, same_text_rounds()

    @property
    def first(self):
        return next(iter(self.runs.values()))

    @property
    def tau(self) -> float:
        """Mean acceptance length, the target's own token counted: 1 + accepted / drafts."""
        return self.first.mean_acceptance_length

    def to_dict(self) -> dict:
        return {"label": self.label, "path": str(self.path), "tau": self.tau, "nmse": self.nmse,
                "nmse_all": self.nmse_all, "same_text": self.same_text, "divergence": self.divergence,
                "same_text_rounds": self.same_text_rounds,
                "engines": {e: r.to_dict() for e, r in self.runs.items()}}


@dataclass
class QuantizedResult:
    draft: Path
    layers: list
    prompts: list
    n_predict: int
    reference: str
    copies: dict = field(default_factory=dict)   # label -> CopyRun, in the order asked

    def problems(self, max_nmse: float = MAX_NMSE) -> list[str]:
        """What makes the measurement no comparison of one model's numerics: a copy whose features
        are farther from the reference than quantization explains, engines that drafted apart."""
        out = []
        for c in self.copies.values():
            # the first layer past the bound: a fault sits between it and the draft layer before
            far = next((k for k, v in enumerate(c.nmse) if v > max_nmse), None)
            if far is not None:
                out.append(f"{c.label} ({c.path.name}): feature NMSE {c.nmse[far]:.3g} against {self.reference} "
                           f"at layer {self.layers[far]}, above {max_nmse:g}: not the same weights")
            if c.divergence is not None:
                out.append(f"{c.label}: llama.cpp and graphgen drafting differ, first at {c.divergence}")
        return out

    def to_dict(self) -> dict:
        return {"draft": str(self.draft), "layers": self.layers, "prompts": self.prompts,
                "n_predict": self.n_predict, "reference": self.reference,
                "copies": {k: c.to_dict() for k, c in self.copies.items()}}


def measure(draft, copies: dict, prompts=None, n_predict: int = 64, engines=("llama.cpp",),
            reference: str = REFERENCE, threads: int = 1, log=None) -> QuantizedResult:
    """`draft`'s acceptance behind each of `copies` ({label: target GGUF}, as target_copies gives
    them) and the copies' feature NMSE against the copy labelled `reference`. `prompts`: default
    compare.DEFAULT_PROMPTS. `log`: a callable given a line per stage."""
    from .compare import DEFAULT_PROMPTS, run_engines
    say = log or (lambda _: None)
    draft = Path(draft)
    if not draft.is_file():
        raise FileNotFoundError(f"{draft}: no such draft model file")
    copies = {str(k): Path(v) for k, v in dict(copies).items()}
    if reference not in copies:
        raise QuantizedError(f"reference {reference!r}: not among the copies ({', '.join(copies) or 'none'})")
    engines = tuple(engines)
    if not engines:
        raise QuantizedError("engines: empty; name llama.cpp, graphgen or both")
    layers = draft_layers(draft)
    prompts = list(DEFAULT_PROMPTS if prompts is None else prompts)
    res = QuantizedResult(draft, layers, prompts, n_predict, reference)

    runs = {}
    for label, path in copies.items():
        say(f"{draft.parent.name}: acceptance behind {label} ({path.name}), {len(prompts)} prompts, "
            f"-n {n_predict}, {', '.join(engines)}")
        runs[label] = run_engines(path, draft, prompts, n_predict=n_predict, engines=engines, threads=threads)
    ref_run = next(iter(runs[reference].values()))
    prompt_tokens = _tokenize(copies[reference], prompts)
    seqs = [p + list(g) for p, g in zip(prompt_tokens, ref_run.tokens)]
    feats = {}
    for label, path in copies.items():
        say(f"{draft.parent.name}: layers {layers} of {label} on {sum(map(len, seqs))} tokens")
        feats[label] = sequence_features(path, layers, seqs, threads)
    for label, path in copies.items():
        rest, every = feature_nmse(feats[label], feats[reference])
        first = next(iter(runs[label].values()))
        same = [list(a) == list(b) for a, b in zip(first.tokens, ref_run.tokens)]
        res.copies[label] = CopyRun(label, path, runs[label], rest, every, same, divergence(runs[label]),
                                    same_text_rounds(first, ref_run, same))
    return res


def table(results) -> str:
    """A markdown table, a row per draft and copy: tau, accepted per block (and the two counts, for
    the reader to judge the sample), acceptance per draft position, tokens/s per engine, the
    feature NMSE per draft layer against the reference, how many prompts' text is the reference
    copy's, and on those prompts the rounds drafted apart and the tokens accepted
    (same_text_rounds)."""
    results = list(results)
    if not results:
        raise QuantizedError("table: no results")
    n_max = max(c.first.n_max for r in results for c in r.copies.values())
    engines = list(dict.fromkeys(e for r in results for c in r.copies.values() for e in c.runs))
    layer_cols = sorted({il for r in results for il in r.layers})
    head = (["draft", "target", "tau", "accepted / block", "accepted", "blocks"]
            + [f"p{i}" for i in range(1, n_max + 1)]
            + [f"tok/s {e}" for e in engines] + [f"NMSE L{il}" for il in layer_cols]
            + ["text as ref", "same text: drafts apart", "same text: accepted (ref)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in results:
        for c in r.copies.values():
            rates = c.first.acceptance_per_position + [None] * (n_max - c.first.n_max)
            nm = dict(zip(r.layers, c.nmse))
            cells = ([r.draft.parent.name, c.label + (" (ref)" if c.label == r.reference else ""), f"{c.tau:.3f}",
                      f"{sum(b['n_accepted'] for b in c.first.blocks) / max(len(c.first.blocks), 1):.3f}", str(sum(b["n_accepted"] for b in c.first.blocks)),
                      str(len(c.first.blocks))]
                     + ["" if v is None else f"{v:.3f}" for v in rates]
                     + [f"{c.runs[e].tokens_per_s:.1f}" if e in c.runs else "" for e in engines]
                     + [("0" if nm[il] == 0 else f"{nm[il]:.2e}") if il in nm else "" for il in layer_cols]
                     + [f"{sum(c.same_text)} / {len(c.same_text)}",
                        f"{c.same_text_rounds['drafts_apart']} / {c.same_text_rounds['rounds']}",
                        f"{c.same_text_rounds['accepted']} ({c.same_text_rounds['accepted_ref']})"])
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
