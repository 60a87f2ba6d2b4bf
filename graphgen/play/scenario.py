"""Scenarios: what to run, the same for graphgen and the reference llama.cpp.

A scenario is a small JSON document::

    {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "off", "type_kv": "f16", "seed": 1,
     "steps": [{"inject": {"n_tokens": 6, "pos0": 0}},
               {"block": {"tokens": [7, 255, 255, 255], "pos0": 6}}]}

Each inject or block step is one graph evaluation. Target features of inject step i are
``default_rng(seed + i).standard_normal((n_tokens, n_embd_inp), dtype=float32)``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..cachetypes import KV_QUANTIZED, KV_TYPES

FLASH_ATTN = ("off", "on", "auto")
# the names a dump folder's graphs take (NN-<graph>.json and .npz)
_DUMP_FILE = re.compile(r"\d{2,}-")


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the step and field."""


@dataclass
class SeqBlock:
    seq: int
    tokens: list[int]
    pos0: int
    embd_state: str = "context"  # "context" (features of pos0-1 from the inject) or "random"


@dataclass
class Step:
    kind: str  # "inject" | "block" | "encoder" | "seq_rm"
    index: int
    seq: int = 0
    n_tokens: int = 0
    pos0: int = 0
    p1: int = -1
    blocks: list[SeqBlock] = field(default_factory=list)

    @property
    def graph(self) -> str:
        return self.kind


@dataclass
class Scenario:
    n_ctx: int = 256
    n_ubatch: int = 64
    flash_attn: bool = False
    # "auto" asked: llama.cpp turns flash attention on where the device runs its kernels, which the
    # CPU and every backend graphgen computes on do for these drafts; the reference decides itself
    flash_attn_auto: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    seed: int = 1
    n_seq: int = 1
    n_threads: int = 1
    steps: list[Step] = field(default_factory=list)
    n_batch: int | None = None  # llama.cpp's logical batch (-b); None: the micro-batch's size
    # a run recorded on a real target: the target GGUF (lending a draft without them its embeddings
    # and lm head) and an .npz of the features it produced, one array per inject step ("step<i>")
    target: str | None = None
    features_file: str | None = None    # as the document gives it: relative to the folder it was read from
    features_base: str | None = field(default=None, repr=False, compare=False)
    _features: dict | None = field(default=None, repr=False, compare=False)

    def _resolved(self, value: str | None) -> str | None:
        """A relative path as the folder it was read from names it: the scenario file's folder, and for
        a dump folder (whose graphs sit one level below the run that made them) its parent too."""
        if value is None or Path(value).is_absolute() or self.features_base is None:
            return value
        base = Path(self.features_base)
        for folder in (base, base.parent):
            if (folder / value).exists():
                return str(folder / value)
        return str(base / value)

    @property
    def features_path(self) -> str | None:
        return self._resolved(self.features_file)

    @property
    def target_path(self) -> str | None:
        return self._resolved(self.target)

    @property
    def type_kv(self) -> str:
        """One name for both caches ("q8_0"), or "K/V" ("q8_0/f16") when they differ."""
        return self.type_k if self.type_k == self.type_v else f"{self.type_k}/{self.type_v}"

    def features(self, step: Step, n_embd_inp: int) -> np.ndarray:
        if self.features_file is not None:
            return self._recorded(step, n_embd_inp)
        rng = np.random.default_rng(self.seed + step.index)
        return rng.standard_normal((step.n_tokens, n_embd_inp), dtype=np.float32)

    def _recorded(self, step: Step, n_embd_inp: int) -> np.ndarray:
        if self._features is None:
            try:
                with np.load(self.features_path, allow_pickle=False) as z:
                    self._features = {k: z[k] for k in z.files}
            except (OSError, ValueError) as e:
                raise ScenarioError(f"{self.features_path}: cannot read the recorded features ({e})") from None
        key = f"step{step.index}"
        x = self._features.get(key)
        if x is None:
            raise ScenarioError(f"{self.features_file}: no features for step {step.index} (array '{key}')")
        if x.shape != (step.n_tokens, n_embd_inp) or x.dtype != np.float32:
            raise ScenarioError(f"{self.features_file}: array '{key}' is {x.dtype} {list(x.shape)}; step "
                                f"{step.index} takes float32 [{step.n_tokens}, {n_embd_inp}]")
        return x

    def keep_in(self, folder) -> None:
        """Read the recorded features from a copy in `folder` (the dump folder being written), named
        there by its file name, and name the target by its absolute path: the dumps record this
        document, so the folder reruns wherever it is moved (the target GGUF is too large to copy)."""
        if self.target is not None:
            self.target = os.path.abspath(self.target_path)
        if self.features_file is None:
            return
        src = Path(self.features_path)
        name = src.name
        if _DUMP_FILE.match(name) or name.startswith("."):
            name = "features.npz"  # not to be taken for, or replaced by, a graph's values
        try:
            shutil.copyfile(src, Path(folder) / name)
        except OSError as e:
            raise ScenarioError(f"{src}: cannot read the recorded features ({e})") from None
        self.features_file, self.features_base, self._features = name, str(folder), None

    def random_state(self, step: Step, n_tokens: int, n_embd: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed + step.index)
        return rng.standard_normal((n_tokens, n_embd), dtype=np.float32)

    def to_dict(self, copy: bool = False) -> dict:
        """The scenario's document; `copy`: for a file written elsewhere, with the features' path absolute."""
        steps = []
        for s in self.steps:
            if s.kind in ("inject", "encoder"):
                steps.append({"inject" if s.kind == "inject" else "encode":
                              {"n_tokens": s.n_tokens, "pos0": s.pos0, "seq": s.seq}})
            elif s.kind == "seq_rm":
                steps.append({"seq_rm": {"seq": s.seq, "p0": s.pos0, "p1": s.p1}})
            else:
                steps.append({"block": {"seqs": [
                    {"seq": b.seq, "tokens": b.tokens, "pos0": b.pos0, "embd_state": b.embd_state}
                    for b in s.blocks]}})
        types = ({"type_kv": self.type_k} if self.type_k == self.type_v
                 else {"type_k": self.type_k, "type_v": self.type_v})
        batch = {} if self.n_batch is None else {"n_batch": self.n_batch}
        if self.target is not None:
            batch["target"] = self.target_path if copy else self.target
        if self.features_file is not None:
            batch["features"] = self.features_path if copy else self.features_file
        return {"n_ctx": self.n_ctx, **batch, "n_ubatch": self.n_ubatch,
                "flash_attn": "auto" if self.flash_attn_auto else "on" if self.flash_attn else "off", **types,
                "seed": self.seed, "n_seq": self.n_seq, "n_threads": self.n_threads, "steps": steps}


def _int(d: dict, key: str, where: str, default=None, lo=None, hi=None) -> int:
    if key not in d:
        if default is None:
            raise ScenarioError(f"{where}: missing '{key}'")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ScenarioError(f"{where}: '{key}' must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise ScenarioError(f"{where}: '{key}' = {v} is below {lo}")
    if hi is not None and v > hi:
        raise ScenarioError(f"{where}: '{key}' = {v} is above {hi}")
    return v


# the fields each step takes: a misspelt one is named, not read as a missing one
_STEP_KEYS = {"inject": {"n_tokens", "pos0", "seq"}, "encode": {"n_tokens", "pos0", "seq"},
              "seq_rm": {"seq", "p0", "p1"}}
_BLOCK_KEYS = {"tokens", "pos0", "seq", "embd_state"}


def _known(body: dict, keys: set, where: str) -> None:
    unknown = sorted(set(body) - keys)
    if unknown:
        raise ScenarioError(f"{where}: unknown field '{unknown[0]}' (expected {', '.join(sorted(keys))})")


def parse_scenario(doc: dict, where: str = "scenario") -> Scenario:
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: expected a JSON object")
    known = {"n_ctx", "n_batch", "n_ubatch", "flash_attn", "type_kv", "type_k", "type_v", "seed", "n_seq", "n_threads",
             "steps", "target", "features"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ScenarioError(f"{where}: unknown field '{unknown[0]}'")
    sc = Scenario()
    sc.n_ctx = _int(doc, "n_ctx", where, 256, lo=1, hi=1 << 20)
    sc.n_ubatch = _int(doc, "n_ubatch", where, 64, lo=1, hi=8192)
    if "n_batch" in doc:
        # llama.cpp caps the micro-batch at the logical batch; each graph holds one micro-batch
        sc.n_batch = _int(doc, "n_batch", where, lo=1, hi=1 << 20)
        sc.n_ubatch = min(sc.n_ubatch, sc.n_batch)
    sc.seed = _int(doc, "seed", where, 1, lo=0)
    for key, attr in (("target", "target"), ("features", "features_file")):
        if key in doc:
            if not isinstance(doc[key], str) or not doc[key]:
                raise ScenarioError(f"{where}: '{key}' must be a file path")
            setattr(sc, attr, doc[key])
    sc.n_seq = _int(doc, "n_seq", where, 1, lo=1, hi=256)
    sc.n_threads = _int(doc, "n_threads", where, 1, lo=1, hi=256)
    fa = doc.get("flash_attn", "off")
    if fa not in FLASH_ATTN and not isinstance(fa, bool):
        raise ScenarioError(f"{where}: 'flash_attn' must be 'on', 'off' or 'auto', got {fa!r}")
    sc.flash_attn = fa is True or fa in ("on", "auto")
    sc.flash_attn_auto = fa == "auto"
    both = doc.get("type_kv", "f16")
    for key in ("type_kv", "type_k", "type_v"):
        v = doc.get(key, both)
        if v not in KV_TYPES:
            raise ScenarioError(f"{where}: '{key}' must be one of {', '.join(KV_TYPES)}, got {v!r}")
    sc.type_k, sc.type_v = doc.get("type_k", both), doc.get("type_v", both)
    if sc.type_v in KV_QUANTIZED and not sc.flash_attn:
        raise ScenarioError(f"{where}: 'type_v' {sc.type_v} is quantized, which needs 'flash_attn' on")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ScenarioError(f"{where}: 'steps' must be a non-empty list")
    for i, raw in enumerate(steps):
        sw = f"{where}: step {i}"
        if not isinstance(raw, dict) or len(raw) != 1:
            raise ScenarioError(f"{sw}: expected an object with one key (inject, block, encode or seq_rm)")
        (kind, body), = raw.items()
        if not isinstance(body, dict):
            raise ScenarioError(f"{sw}: '{kind}' must be an object")
        if kind in _STEP_KEYS:
            _known(body, _STEP_KEYS[kind], f"{sw} {kind}")
        if kind == "inject":
            n = _int(body, "n_tokens", f"{sw} inject", lo=1)
            if n > sc.n_ubatch:
                raise ScenarioError(f"{sw} inject: n_tokens {n} is longer than n_ubatch {sc.n_ubatch}")
            st = Step("inject", i, seq=_int(body, "seq", sw, 0, lo=0, hi=sc.n_seq - 1),
                      n_tokens=n, pos0=_int(body, "pos0", f"{sw} inject", 0, lo=0))
        elif kind == "encode":
            n = _int(body, "n_tokens", f"{sw} encode", lo=1)
            if n > sc.n_ubatch:
                raise ScenarioError(f"{sw} encode: n_tokens {n} is longer than n_ubatch {sc.n_ubatch}")
            st = Step("encoder", i, seq=_int(body, "seq", sw, 0, lo=0, hi=sc.n_seq - 1),
                      n_tokens=n, pos0=_int(body, "pos0", f"{sw} encode", 0, lo=0))
        elif kind == "block":
            if "seqs" in body:
                _known(body, {"seqs"}, f"{sw} block")
            entries = body.get("seqs", [body]) if "seqs" in body else [body]
            if not isinstance(entries, list) or not entries:
                raise ScenarioError(f"{sw} block: 'seqs' must be a non-empty list")
            blocks = []
            for j, e in enumerate(entries):
                bw = f"{sw} block seq entry {j}"
                if not isinstance(e, dict):
                    raise ScenarioError(f"{bw}: expected an object")
                _known(e, _BLOCK_KEYS, bw)
                toks = e.get("tokens")
                if not isinstance(toks, list) or not toks or not all(
                        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in toks):
                    raise ScenarioError(f"{bw}: 'tokens' must be a non-empty list of token ids >= 0")
                es = e.get("embd_state", "context")
                if es not in ("context", "random"):
                    raise ScenarioError(f"{bw}: 'embd_state' must be 'context' or 'random'")
                blocks.append(SeqBlock(_int(e, "seq", bw, 0, lo=0, hi=sc.n_seq - 1), list(toks),
                                       _int(e, "pos0", bw, lo=0), es))
            if len({b.seq for b in blocks}) != len(blocks):
                raise ScenarioError(f"{sw} block: a sequence appears twice")
            total = sum(len(b.tokens) for b in blocks)
            if total > sc.n_ubatch:
                raise ScenarioError(f"{sw} block: {total} tokens are longer than n_ubatch {sc.n_ubatch}")
            st = Step("block", i, blocks=blocks)
        elif kind == "seq_rm":
            st = Step("seq_rm", i, seq=_int(body, "seq", sw, 0, lo=-1, hi=sc.n_seq - 1),
                      pos0=_int(body, "p0", sw, 0, lo=-1), p1=_int(body, "p1", sw, -1, lo=-1))
        else:
            raise ScenarioError(f"{sw}: unknown step '{kind}' (expected inject, block, encode or seq_rm)")
        sc.steps.append(st)
    return sc


def read_scenario_doc(path) -> dict:
    """A scenario file's JSON, unchecked (parse_scenario checks it); given a dump folder or dump
    file, the scenario it recorded (`recorded_scenario_doc`)."""
    return _read(path)[0]


def _read(path) -> tuple[dict, str]:
    """(the document, where it came from, for errors)."""
    p = Path(path)
    if p.is_dir():
        return recorded_scenario_doc(p)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"{p}: no such scenario file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{p}: not valid JSON ({e})") from None
    if isinstance(doc, dict) and "format" in doc:  # a dump, not a scenario: the one it ran
        return recorded_scenario_doc(p)
    return doc, str(p)


def recorded_scenario_doc(path) -> tuple[dict, str]:
    """(the scenario document a dump folder or dump file recorded, where it was read: the file);
    a dump that records none is refused in one line naming the file."""
    from ..dump.format import DumpError, recorded_scenario
    try:
        doc, file = recorded_scenario(path)
    except DumpError as e:
        raise ScenarioError(str(e)) from None
    return doc, f"{file} (its recorded scenario)"


def load_scenario(path) -> Scenario:
    """A scenario file, or the scenario a dump folder or dump file recorded. Relative target and
    features paths are read from the folder of the scenario (or of the dump, or the dump's parent)
    that names them."""
    sc = parse_scenario(*_read(path))
    sc.features_base = scenario_folder(path)
    return sc


def scenario_folder(path) -> str:
    """The folder a scenario's relative target and features paths are read from: the scenario
    file's, or the dump folder's (and its parent, `Scenario._resolved`) for a recorded one."""
    p = Path(path)
    return str(p if p.is_dir() else p.parent)


def default_scenario(block_size: int = 4, mask_token: int = 255, n_prompt: int = 6,
                     flash_attn: bool = False, type_kv: str = "f16", type_k: str | None = None,
                     type_v: str | None = None) -> Scenario:
    """The scenario `graphgen demo` and the committed references use: a prompt, then one block."""
    return parse_scenario({
        "n_ctx": 256, "n_ubatch": 64, "flash_attn": "on" if flash_attn else "off",
        "type_k": type_k or type_kv, "type_v": type_v or type_kv, "seed": 1,
        "steps": [{"inject": {"n_tokens": n_prompt, "pos0": 0}},
                  {"block": {"tokens": [7] + [mask_token] * (block_size - 1), "pos0": n_prompt}}]})


def resolve_fa(value: str | None) -> bool | None:
    """-fa auto as llama.cpp resolves it: on when the device runs the attention kernels, which
    every ggml backend graphgen computes on does for these drafts."""
    if value is None:
        return None
    return value != "off"
