"""A case: the draft and the scenario it runs.

The draft is a GGUF (`format` "gguf") or a checkpoint in its authors' format (`format` "hf"),
each either as the settings that write it (make_model's, or make_hf's HFSpec) or kept whole as
given (a GGUF file, a checkpoint folder). Settings are reduced; a draft kept whole is not.

Every edit the reducer tries is a method here that returns a smaller case, or None when the edit
does not apply; `edits()` lists them, the biggest cuts first. An edit may give a case the draft
writer or the scenario parser refuses: the reducer then counts it as not failing the same way,
never as the failure.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

# make_model's defaults for the sizes the reducer shrinks (graphgen/synth/model.py)
DEFAULTS = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_ff": 128, "n_vocab": 256, "block_size": 4,
            "target_layers": [1, 2]}
MIN_HEAD_DIM = 8       # the smallest head size b11739 is drawn with in graphgen's random suites
MIN_VOCAB = 8          # unk, bos, eos, the mask token and a few others
FORMATS = ("gguf", "hf")


@dataclass
class Case:
    scenario: dict[str, Any]
    config: dict[str, Any] | None = None   # make_model settings, or make_hf's HFSpec fields
    draft: Path | None = None              # a GGUF file or checkpoint folder used as it is
    history: list[str] = field(default_factory=list)
    format: str = "gguf"                   # gguf: a GGUF draft; hf: an authors' checkpoint

    def __post_init__(self):
        if (self.config is None) == (self.draft is None):
            raise ValueError("a case has either settings or a draft kept whole")
        if self.format not in FORMATS:
            raise ValueError(f"a case's draft format is one of {', '.join(FORMATS)}, not {self.format!r}")

    # ---- what it is ---------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """The draft's settings with their writer's defaults filled in (head size and KV heads included)."""
        if self.format == "hf":
            return {**_hf_defaults(), **(self.config or {})}
        c = dict(DEFAULTS, **(self.config or {}))
        c["n_head"] = c.get("n_head") or DEFAULTS["n_head"]
        c["n_head_kv"] = c.get("n_head_kv") or c["n_head"]
        c["head_dim"] = c.get("head_dim") or c["n_embd"] // c["n_head"]
        return c

    def sizes(self) -> dict[str, Any]:
        """What a reader of a repro asks first: how big the draft and the scenario are."""
        steps = self.scenario["steps"]
        seqs = {b.get("seq", 0) for s in steps if "block" in s for b in _blocks(s)}
        seqs |= {s[k].get("seq", 0) for s in steps for k in ("inject", "encode") if k in s}
        tokens = sum(len(b["tokens"]) for s in steps if "block" in s for b in _blocks(s))
        tokens += sum(s[k]["n_tokens"] for s in steps for k in ("inject", "encode") if k in s)
        out: dict[str, Any] = {"steps": len(steps), "sequences": len(seqs), "tokens": tokens,
                               "n_ctx": self.scenario.get("n_ctx", 256)}
        if self.config is not None:
            c = self.settings()
            draft = {"n_layer": c["n_layer"], "n_head": c["n_head"], "n_head_kv": c["n_head_kv"],
                     "head_dim": c["head_dim"], "n_embd": c["n_embd"], "n_ff": c["n_ff"], "n_vocab": c["n_vocab"],
                     "block_size": c["block_size"], "target_layers": len(c["target_layers"]),
                     "options": self._options()}
            if self.format == "gguf":
                draft["wtype"] = c.get("wtype", "f32")
            out = {**draft, **out}
        return out

    def _options(self) -> list[str]:
        kept = _HF_KEPT if self.format == "hf" else _KEPT
        return sorted(k for k in self.config if k not in _SIZE_KEYS and k not in kept)

    @property
    def draft_name(self) -> str:
        """What the written draft is called in its folder."""
        return "checkpoint" if self.format == "hf" else "draft.gguf"

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "config": self.config,
                "draft": None if self.draft is None else str(self.draft), "scenario": self.scenario}

    def write(self, folder: Path, progress: Callable[[str], None] | None = None) -> tuple[Path, Path]:
        """The draft (a GGUF, or a checkpoint folder) and scenario.json in `folder`; returns their paths."""
        folder.mkdir(parents=True, exist_ok=True)
        sc = folder / "scenario.json"
        sc.write_text(json.dumps(self.scenario, indent=1) + "\n")
        if self.config is None:
            return self.draft, sc
        path = folder / self.draft_name
        if self.format == "hf":
            from ..authors.checkpoint import HFSpec, make_hf
            make_hf(path, HFSpec(**self.config))
        else:
            from ..synth import make_model
            make_model(path, **self.config)
        return path, sc

    # ---- the edits ----------------------------------------------------------------------------
    def edits(self) -> Iterator[tuple[str, Callable[[], Case | None]]]:
        """(what it does, how) for every edit, the biggest cuts first."""
        if self.config is not None:
            c = self.settings()
            for v in _down(c["n_layer"], 1):
                yield f"n_layer {c['n_layer']} -> {v}", lambda v=v: self._layers(v)
        n_steps = len(self.scenario["steps"])
        for k in reversed(range(n_steps)):
            yield f"drop step {k}", lambda k=k: self._drop_step(k)
        yield "one sequence", self._one_sequence
        seqs = sorted({b.get("seq", 0) for st in self.scenario["steps"] if "block" in st for b in _blocks(st)})
        for q in reversed(seqs) if len(seqs) > 1 else ():
            yield f"drop sequence {q}", lambda q=q: self._drop_sequence(q)
        if self.config is not None:
            c = self.settings()
            for v in _down(len(c["target_layers"]), 1):
                yield f"target layers {len(c['target_layers'])} -> {v}", \
                    lambda v=v: self._set(target_layers=list(c["target_layers"][:v]))
            for v in _down(c["n_vocab"], MIN_VOCAB):
                yield f"n_vocab {c['n_vocab']} -> {v}", lambda v=v: self._vocab(v)
            for v in _down(c["n_head"], 1):
                yield f"n_head {c['n_head']} -> {v}", lambda v=v: self._heads(v)
            for v in _down(c["n_head_kv"], 1):
                yield f"n_head_kv {c['n_head_kv']} -> {v}", lambda v=v: self._set(n_head_kv=v) \
                    if c["n_head"] % v == 0 else None
            for v in _down(c["head_dim"], MIN_HEAD_DIM):
                yield f"head size {c['head_dim']} -> {v}", lambda v=v: self._head_dim(v)
            for v in _down(c["n_embd"], MIN_HEAD_DIM):
                yield f"n_embd {c['n_embd']} -> {v}", lambda v=v: self._set(n_embd=v, head_dim=c["head_dim"])
            for v in _down(c["n_ff"], 8):
                yield f"n_ff {c['n_ff']} -> {v}", lambda v=v: self._set(n_ff=v)
            for v in _down(c["block_size"], 2):
                yield f"block size {c['block_size']} -> {v}", lambda v=v: self._block(v)
            for key in self._options():
                yield f"option {key} {'to its default' if self.format == 'hf' else 'off'}", \
                    lambda key=key: self._drop_option(key)
            if self.format == "gguf" and self.config.get("wtype", "f32") != "f32":
                yield f"weights {self.config['wtype']} -> f32", lambda: self._set(wtype="f32")
        for k, s in enumerate(self.scenario["steps"]):
            for kind in ("inject", "encode"):
                if kind in s:
                    n = s[kind]["n_tokens"]
                    for v in _down(n, 1):
                        yield f"step {k} {kind} tokens {n} -> {v}", lambda k=k, v=v, kind=kind: self._tokens(k, kind, v)
        n_ctx = self.scenario.get("n_ctx", 256)
        for v in _down(n_ctx, 16):
            yield f"n_ctx {n_ctx} -> {v}", lambda v=v: self._scenario(n_ctx=v)

    def _derive(self, config=None, scenario=None) -> Case:
        # the reducer appends the edit's words to `history` once it keeps the case
        return Case(scenario if scenario is not None else copy.deepcopy(self.scenario),
                    config if config is not None else copy.deepcopy(self.config), self.draft,
                    list(self.history), self.format)

    def _set(self, **kw) -> Case:
        cfg = dict(self.config)
        cfg.update(kw)
        return self._derive(config=cfg)

    def _scenario(self, **kw) -> Case:
        sc = copy.deepcopy(self.scenario)
        sc.update(kw)
        return self._derive(scenario=sc)

    def _drop_step(self, k: int) -> Case | None:
        steps = self.scenario["steps"]
        if len(steps) < 2:
            return None
        sc = copy.deepcopy(self.scenario)
        del sc["steps"][k]
        return self._derive(scenario=sc)

    def _one_sequence(self) -> Case | None:
        """Every step on sequence 0 alone: block steps keep their first sequence's rows."""
        sc = copy.deepcopy(self.scenario)
        changed = sc.get("n_seq", 1) != 1
        steps = []
        first = None
        for s in sc["steps"]:
            if "block" in s:
                blocks = _blocks(s)
                first = blocks[0].get("seq", 0) if first is None else first
                keep = [b for b in blocks if b.get("seq", 0) == first] or blocks[:1]
                changed |= len(keep) != len(blocks)
                for b in keep:
                    b["seq"] = 0
                steps.append({"block": {"seqs": keep}})
                continue
            kind = next(iter(s))
            body = s[kind]
            seq = body.get("seq", 0)
            first = seq if first is None else first
            if seq != first:
                changed = True
                continue
            body["seq"] = 0
            steps.append(s)
        if not changed or not steps:
            return None
        sc["steps"], sc["n_seq"] = steps, 1
        return self._derive(scenario=sc)

    def _drop_sequence(self, q: int) -> Case | None:
        """Sequence q's rows gone from every step (the others keep their ids)."""
        sc = copy.deepcopy(self.scenario)
        steps = []
        for st in sc["steps"]:
            if "block" in st:
                keep = [b for b in _blocks(st) if b.get("seq", 0) != q]
                if keep:
                    steps.append({"block": {"seqs": keep}})
                continue
            if st[next(iter(st))].get("seq", 0) != q:
                steps.append(st)
        if not steps:
            return None
        sc["steps"] = steps
        return self._derive(scenario=sc)

    def _layers(self, v: int) -> Case:
        kw: dict[str, Any] = {"n_layer": v}
        if self.format == "hf" and self.config.get("swa_pattern") is not None:
            kw["swa_pattern"] = list(self.config["swa_pattern"][:v])   # one entry per layer
        return self._set(**kw)

    def _vocab(self, v: int) -> Case:
        """A smaller vocabulary; token ids past it become the new mask token, the last id."""
        c = self.settings()
        old_mask = _hf_resolved(self.config).mask_token_id if self.format == "hf" else c["n_vocab"] - 1
        sc = copy.deepcopy(self.scenario)
        for s in sc["steps"]:
            if "block" in s:
                for b in _blocks(s):
                    b["tokens"] = [v - 1 if t == old_mask or t >= v - 1 else t for t in b["tokens"]]
        kw: dict[str, Any] = {"n_vocab": v}
        if self.format == "hf":
            if c.get("mask_token_id") is not None:
                kw["mask_token_id"] = v - 1
            if c.get("d2t_vocab") is not None and c["d2t_vocab"] > v:
                kw["d2t_vocab"] = max(1, v * 3 // 4)
        case = self._set(**kw)
        case.scenario = sc
        return case

    def _heads(self, v: int) -> Case | None:
        c = self.settings()
        kv = c["n_head_kv"] if v % c["n_head_kv"] == 0 else 1
        # the head size is kept: fewer heads make a narrower attention, not wider heads
        return self._set(n_head=v, n_head_kv=kv, head_dim=c["head_dim"])

    def _head_dim(self, v: int) -> Case | None:
        n_rot = (self.config or {}).get("n_rot")
        if n_rot is not None and n_rot > v:
            return self._set(head_dim=v, n_rot=v)
        return self._set(head_dim=v)

    def _block(self, v: int) -> Case:
        sc = copy.deepcopy(self.scenario)
        for s in sc["steps"]:
            if "block" in s:
                for b in _blocks(s):
                    b["tokens"] = b["tokens"][:v]
        case = self._set(block_size=v)
        case.scenario = sc
        return case

    def _drop_option(self, key: str) -> Case:
        cfg = dict(self.config)
        del cfg[key]
        return self._derive(config=cfg)

    def _tokens(self, k: int, kind: str, v: int) -> Case:
        """Fewer rows in an inject step; the later steps of its sequence move down with it."""
        sc = copy.deepcopy(self.scenario)
        body = sc["steps"][k][kind]
        cut, seq = body["n_tokens"] - v, body.get("seq", 0)
        body["n_tokens"] = v
        for s in sc["steps"][k + 1:]:
            if "block" in s:
                for b in _blocks(s):
                    if b.get("seq", 0) == seq:
                        b["pos0"] = max(0, b["pos0"] - cut)
            else:
                kind2 = next(iter(s))
                if s[kind2].get("seq", 0) == seq and "pos0" in s[kind2]:
                    s[kind2]["pos0"] = max(0, s[kind2]["pos0"] - cut)
        return self._derive(scenario=sc)


_SIZE_KEYS = {"n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_vocab", "block_size", "target_layers",
              "head_dim", "n_rot", "wtype"}
# what names the draft rather than sizes it: kept as given
_KEPT = {"variant", "backbone", "seed", "conf", "target", "context_length", "rope_freq_base", "rms_eps"}
_HF_KEPT = {"variant", "authors", "seed", "mask_token_id", "rope_theta", "rms_eps"}


def _hf_defaults() -> dict[str, Any]:
    from dataclasses import asdict

    from ..authors.checkpoint import HFSpec
    return asdict(HFSpec())


def _hf_resolved(config: dict[str, Any]):
    """make_hf's settings as it reads them: its defaults filled in (the mask token, the last id)."""
    from ..authors.checkpoint import HFSpec
    return HFSpec(**config).resolved()


def _blocks(step: dict) -> list[dict]:
    body = step["block"]
    if "seqs" in body:
        return body["seqs"]
    # the one-sequence spelling ({"tokens": ..., "pos0": ...}) is the block itself
    return [body]


def _down(n: int, lo: int) -> list[int]:
    """Smaller values to try for a size n >= lo: the floor first, then halves, then one less."""
    out = []
    for v in (lo, n // 2, n - 1):
        if lo <= v < n and v not in out:
            out.append(v)
    return out


def load_case(config_path=None, draft=None, scenario_path=None, scenario_doc=None, format: str = "gguf") -> Case:
    """A case from a settings file (make-model's: a case.json's "make_model" or the settings
    alone; with format "hf", HFSpec's fields, alone or under "make_hf") or a draft kept whole (a
    GGUF, or with format "hf" a checkpoint folder), and a scenario file or document. An authors'
    checkpoint without a scenario runs `graphgen check`'s default one."""
    config = None
    if config_path is not None:
        try:
            doc = json.loads(Path(config_path).read_text())
        except ValueError as e:
            raise ValueError(f"{config_path}: not JSON ({e})") from None
        what = "make_hf settings (HFSpec's fields)" if format == "hf" else "make-model settings"
        if not isinstance(doc, dict):
            raise ValueError(f"{config_path}: expected a JSON object of {what}")
        config = doc.get("make_hf" if format == "hf" else "make_model", doc)
        if format == "hf":
            known = set(_hf_defaults())
            bad = sorted(k for k in config if k not in known)
            if bad:
                raise ValueError(f"{config_path}: {', '.join(bad)}: no field of make_hf's settings "
                                 f"(HFSpec: {', '.join(sorted(known))})")
        if scenario_doc is None and scenario_path is None and isinstance(doc.get("scenario"), dict):
            scenario_doc = doc["scenario"]
    if scenario_doc is None and scenario_path is not None:
        from ..play.scenario import read_scenario_doc
        scenario_doc = read_scenario_doc(scenario_path)
    if scenario_doc is None:
        if format != "hf":
            raise ValueError("reduce needs a scenario (--scenario FILE)")
        scenario_doc = _check_scenario(config, None if draft is None else Path(draft))
    return Case(copy.deepcopy(scenario_doc), config, None if draft is None else Path(draft), format=format)


def _check_scenario(config: dict[str, Any] | None, checkpoint: Path | None) -> dict[str, Any]:
    """`graphgen check`'s default scenario for the draft's block size and mask token."""
    from ..authors.forward import AuthorsDraft, default_check_scenario
    d = _hf_resolved(config) if config is not None else AuthorsDraft(checkpoint)
    return default_check_scenario(d.block_size, d.mask_token_id)
