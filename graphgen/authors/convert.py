"""A HuggingFace draft checkpoint to GGUF with llama.cpp's own converter.

graphgen writes no converter of its own: it runs upstream's `convert_hf_to_gguf.py`, taken once
from llama-cpp-python's sdist (which vendors llama.cpp at CONVERTER_COMMIT). Where that converter
cannot read what the authors publish, the gap is bridged in a staging folder (links to the
checkpoint's files plus changed copies; the user's folder is never touched) with one warning
line naming the gap, or refused in one line; nothing is changed silently:

- speculators' DFlash / DFlash2 configs nest the layer config (`transformer_layer_config`), which
  only the converter's DSpark class flattens: converted through a flattened copy.

Drafts without their own embeddings / lm head (z-lab and speculators keep the target's, and the
converter drops a full-vocabulary DSpark's head) are written as the converter writes them, without
token_embd / output: they run beside their target GGUF, which lends its tables (b11739's
ctx_other, graphgen's runtime/lender.py). `target_gguf` converts the target's folder too, with the
same converter, so the pair is at hand.

Long because every setting of the authors' configs that the converter would drop or misread is
refused here by name, before the converter runs: one table of gaps, read in one place.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import cache
from . import EXTRA_HINT, AuthorsError
from .folder import inspect, safetensors_header, weight_files


CONVERTER_PACKAGE = "llama-cpp-python"
CONVERTER_VERSION = "0.3.36"
# the sdist records its llama.cpp submodule's commit in .git/modules/vendor/llama.cpp/HEAD
# (0c1e57098bba43ac29e6e3b677cdceebdd22334f); converter_tree() checks it against this
CONVERTER_COMMIT = "0c1e57098"
OUTTYPES = ("f32", "f16", "bf16", "q8_0")

_SDIST_ROOT = f"llama_cpp_python-{CONVERTER_VERSION}/"
_VENDOR = _SDIST_ROOT + "vendor/llama.cpp/"
_HEAD_MEMBER = _SDIST_ROOT + ".git/modules/vendor/llama.cpp/HEAD"
# the converter script, its model classes, its own gguf package, and the chat templates some
# targets' vocab handlers read beside them
_TREE_PARTS = ("convert_hf_to_gguf.py", "LICENSE", "conversion/", "gguf-py/gguf/", "models/templates/")

# architectures the converter's DFlashModel / DSparkModel (conversion/qwen.py) handle
_DFLASH_ARCHS = ("DFlashDraftModel", "DFlash2DraftModel")
_DSPARK_ARCHS = ("Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator", "Lfm2DSparkDraftModel",
                 "LingDSparkModel")
_SPECULATORS_FLATTEN = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}
# speculators' class names, for a config that does not say speculators_model_type
_SPECULATORS_ARCHS = {"DFlashSpeculator": "dflash", "DFlash2Speculator": "dflash2"}
_DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json")
_BORROWED = {"token_embd.weight": "token embeddings", "output.weight": "lm head"}


class ConvertError(AuthorsError):
    """A checkpoint the converter cannot take, or its failure; one line naming the file and key.
    A failed run's whole output is in `log` ("" for refusals before it)."""

    log: str = ""


@dataclass
class ConvertResult:
    out: Path
    commit: str
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    log: str = ""  # the converter's stdout and stderr, interleaved
    # what the GGUF lacks and borrows from its target at run time (token_embd.weight, output.weight)
    borrows: list[str] = field(default_factory=list)
    target_out: Path | None = None  # the target's GGUF, when asked for
    target_arch: str | None = None
    target_log: str = ""

    def beside_line(self) -> str | None:
        """One line saying that the draft runs beside its target, or None when it has its own tables."""
        if not self.borrows:
            return None
        what = " or ".join(_BORROWED[n] for n in self.borrows)
        target = self.target_out if self.target_out is not None else "TARGET.gguf"
        return (f"{self.out} has no {what} of its own: it runs beside its target, which lends them "
                f"(graphgen draft -m {target} -md {self.out})")


def print_to_stderr(line: str) -> None:
    print(f"graphgen: {line}", file=sys.stderr, flush=True)


# --- the converter itself ----------------------------------------------------------------------

def converter_tree() -> Path:
    """The folder holding upstream's convert_hf_to_gguf.py (fetched with pip once, then cached)."""
    found = cache.find(f"llama-converter-{CONVERTER_COMMIT}")
    if found is not None:
        return found
    dest = cache.root() / f"llama-converter-{CONVERTER_COMMIT}"
    sdist = cache.fetch_sdist(CONVERTER_PACKAGE, CONVERTER_VERSION, f"llama_cpp_python-{CONVERTER_VERSION}.tar.gz",
                              f"llama.cpp's converter ({CONVERTER_PACKAGE} {CONVERTER_VERSION} sdist)", ConvertError)
    src_dir = sdist.parent
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=src_dir))
    try:
        head = _extract_tree(sdist, tmp)
    except (tarfile.TarError, OSError, ValueError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConvertError(f"{sdist}: not a usable {CONVERTER_PACKAGE} sdist ({e}); delete it to fetch again") from e
    if not head.startswith(CONVERTER_COMMIT):
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConvertError(f"{sdist}: vendors llama.cpp {head[:9] or '(unrecorded)'}, graphgen expects "
                           f"{CONVERTER_COMMIT}; delete it to fetch again")
    (tmp / "COMMIT").write_text(head + "\n")
    # compiled now, so that runs from a shared, read-only cache need not write bytecode
    import compileall
    compileall.compile_dir(str(tmp), quiet=2, workers=1)
    cache.install(tmp, dest)
    if not (dest / ".complete").exists():
        raise ConvertError(f"could not lay out llama.cpp's converter in {dest}")
    return dest


def _extract_tree(sdist: Path, tmp: Path) -> str:
    """Writes the converter's files under tmp; returns the commit the sdist records."""
    head = ""
    found = set()
    with tarfile.open(sdist) as tar:
        for member in tar:
            if member.name == _HEAD_MEMBER and member.isfile():
                with tar.extractfile(member) as f:
                    head = f.read().decode("ascii", "replace").strip()
                continue
            if not member.name.startswith(_VENDOR) or not member.isfile():
                continue
            rel = member.name[len(_VENDOR):]
            part = next((p for p in _TREE_PARTS if rel == p or (p.endswith("/") and rel.startswith(p))), None)
            if part is None or "__pycache__" in rel:
                continue
            if rel.startswith("/") or ".." in rel.split("/"):
                raise ValueError(f"unsafe member name {member.name!r}")
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as f:
                path.write_bytes(f.read())
            found.add(part)
    missing = [p for p in ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/") if p not in found]
    if missing:
        raise ValueError(f"no vendor/llama.cpp/{missing[0]}")
    return head


# --- reading checkpoints without loading them ---------------------------------------------------

def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ConvertError(f"{path}: no such file ({what})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: not readable JSON ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: not a JSON object ({what})")
    return data


# the folder checker's readers (graphgen/authors/folder.py), their refusals as the converter's
def _weight_files(folder: Path) -> list[Path]:
    try:
        return weight_files(folder)
    except AuthorsError as e:
        raise ConvertError(str(e)) from None


def _safetensors_header(path: Path) -> dict:
    try:
        return safetensors_header(path)
    except AuthorsError as e:
        raise ConvertError(str(e)) from None


def _tensor_names(folder: Path) -> set[str]:
    names: set[str] = set()
    for part in _weight_files(folder):
        if part.suffix == ".safetensors":
            names.update(_safetensors_header(part))
        else:
            import torch
            names.update(torch.load(part, map_location="cpu", mmap=True, weights_only=True).keys())
    return names


def _merged(cfg: dict) -> dict:
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else cfg


# --- what to stage ------------------------------------------------------------------------------

@dataclass
class _Plan:
    config: dict | None = None   # a replacement config.json, or None to link the original
    warnings: list[str] = field(default_factory=list)


def _gap(text: str) -> str:
    return f"llama.cpp's converter ({CONVERTER_COMMIT}) {text}"


def _plan(hf_dir: Path, cfg: dict) -> _Plan:
    plan = _Plan()
    cfg_path = hf_dir / "config.json"
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    spec_type = cfg.get("speculators_model_type") or _SPECULATORS_ARCHS.get(arch)

    if spec_type is not None and spec_type in _SPECULATORS_FLATTEN:
        hp = _flatten_speculators(cfg_path, cfg, spec_type)
        plan.config = hp
        gap = _gap("does not read speculators' " + spec_type + " configs")
        plan.warnings.append(
            f"warning: {gap} (only its DSpark class flattens transformer_layer_config); converting through a "
            f"flattened copy (architectures {hp['architectures']}, dflash_config.target_layer_ids = "
            "aux_hidden_state_layer_ids - 1)")
        family = "dflash"
    elif spec_type is not None and spec_type != "dspark":
        raise ConvertError(f"{cfg_path}: key 'speculators_model_type' = {spec_type!r} is not a DFlash-family "
                           "draft (dflash, dflash2, dspark)")
    elif arch in _DFLASH_ARCHS:
        hp, family = cfg, "dflash"
    elif arch in _DSPARK_ARCHS:
        # the converter's DSpark class flattens the speculators layout itself
        tlc = cfg.get("transformer_layer_config")
        hp, family = ({**cfg, **tlc} if isinstance(tlc, dict) else cfg), "dspark"
    elif archs is None:
        raise ConvertError(f"{cfg_path}: no key 'architectures'; not a DFlash-family draft checkpoint")
    else:
        raise ConvertError(f"{cfg_path}: key 'architectures' = {archs!r} is not a DFlash-family draft llama.cpp's "
                           f"converter ({CONVERTER_COMMIT}) converts (known: "
                           f"{', '.join(_DFLASH_ARCHS + _DSPARK_ARCHS)}, or speculators' dflash / dflash2)")

    vocab = hp.get("vocab_size")
    draft_vocab = hp.get("draft_vocab_size") or vocab
    raw_names = _tensor_names(hf_dir)
    if not raw_names:
        raise ConvertError(f"{hf_dir}: no model*.safetensors (nor pytorch_model*.bin) to convert")
    names = {n.removeprefix("model.") for n in raw_names}
    if family == "dflash" and (draft_vocab != vocab or "d2t" in names):
        raise ConvertError(f"{cfg_path}: key 'draft_vocab_size' = {draft_vocab} (vocab_size {vocab}), a d2t "
                           "draft vocabulary: " + _gap("writes d2t only for DSpark drafts, not for DFlash / DFlash2"))
    if spec_type in _SPECULATORS_FLATTEN and cfg.get("sample_from_anchor"):
        raise ConvertError(f"{cfg_path}: key 'sample_from_anchor' is true: " + _gap(
            "writes no sample_from_anchor for DFlash / DFlash2, whose drafters treat slot 0 as the bonus token"))

    rope = hp.get("rope_parameters") or hp.get("rope_scaling") or {}
    rope_type = str(rope.get("rope_type", rope.get("type", "default"))).lower() if isinstance(rope, dict) else "default"
    if rope_type in ("llama3", "longrope", "su"):
        # the converter writes these frequency factors (rope_freqs / long and short factors) only in
        # its Llama and Phi-3 classes: the draft's GGUF would run without them, silently
        key = "rope_parameters" if "rope_parameters" in hp else "rope_scaling"
        raise ConvertError(f"{cfg_path}: key '{key}.rope_type' = {rope_type!r}: "
                           + _gap(f"writes {rope_type} rope factors only for its Llama / Phi-3 models, not for "
                                  "DFlash-family drafts, which would lose them"))
    _refuse_departures(cfg_path, cfg, hp, rope if rope_type == "yarn" else None, arch, spec_type, family)
    layer_types = hp.get("layer_types") or []
    if "sliding_attention" in layer_types:
        # not a converter gap but llama.cpp's: its graph masks these layers otherwise (docs/authors.md)
        plan.warnings.append(
            f"warning: {layer_types.count('sliding_attention')} sliding-window layer(s) (window "
            f"{hp.get('sliding_window')}): their authors mask them otherwise than llama.cpp b11739 does (z-lab: "
            "causal, a window per query; speculators: a window before the anchor, the block causal unless "
            "sliding_window_non_causal; b11739: a window per query, the whole block visible), so llama.cpp's "
            "drafts differ from the authors' there")

    dflash_config = hp.get("dflash_config") if isinstance(hp.get("dflash_config"), dict) else {}
    if family == "dspark":
        mask_key = "dflash_config.mask_token_id" if "mask_token_id" in dflash_config else "mask_token_id"
        mask_id = dflash_config.get("mask_token_id", hp.get("mask_token_id"))
    else:
        mask_key = "mask_token_id" if plan.config is not None else "dflash_config.mask_token_id"
        mask_id = dflash_config.get("mask_token_id")
    if not isinstance(mask_id, int) or not (vocab is None or 0 <= mask_id < vocab):
        # every drafted block is filled with it (tokenizer.ggml.mask_token_id)
        raise ConvertError(f"{cfg_path}: key '{mask_key}' = {mask_id!r} is no token of the {vocab}-token "
                           "vocabulary; a draft fills its blocks with the mask token")
    # what the converter leaves out (embeddings and heads the authors did not save; a
    # full-vocabulary DSpark's head, which it drops: speculators' is the target's own, frozen) is
    # read off the written GGUF: the draft borrows it from its target at run time
    return plan


def _yarn_mscale(factor: float, m: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _refuse_departures(cfg_path: Path, cfg: dict, hp: dict, yarn: dict | None, arch, spec_type, family: str) -> None:
    """Settings the authors' model reads that the GGUF cannot carry to b11739: its drafts would
    compute something else, silently. One line each, naming the key and the side that departs."""
    def refuse(key: str, value, why: str):
        raise ConvertError(f"{cfg_path}: key '{key}' = {value!r}: {why}")

    if yarn is not None:
        key = "rope_parameters" if "rope_parameters" in hp else "rope_scaling"
        factor = float(yarn.get("factor") or 1.0)
        ignored = "; b11739 does not read it for DFlash-family drafts (it runs YaRN with beta_fast 32, beta_slow 1 " \
                  "and the attention factor 0.1 ln(factor) + 1)"
        for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
            v = yarn.get(name)
            if v and float(v) != default:   # transformers takes a missing or zero beta as the default
                refuse(f"{key}.{name}", v, "the converter writes it" + ignored)
        if yarn.get("attention_factor") is not None and \
                abs(float(yarn["attention_factor"]) - _yarn_mscale(factor)) > 1e-7:
            refuse(f"{key}.attention_factor", yarn["attention_factor"], "the converter writes it" + ignored)
        if yarn.get("attention_factor") is None and yarn.get("mscale") and yarn.get("mscale_all_dim"):
            refuse(f"{key}.mscale", yarn["mscale"], "with mscale_all_dim it sets the authors' YaRN attention factor; "
                   "the converter writes neither" + ignored)
        if yarn.get("truncate") is False:
            refuse(f"{key}.truncate", False, "the authors' YaRN ramp then uses unrounded correction dims; ggml's "
                   "rounds them (as truncate true does)")
    if hp.get("attention_bias"):
        refuse("attention_bias", hp["attention_bias"], "b11739's DFlash-family layers have no attention biases "
               "(the converter writes blk.N.attn_*.bias, which b11739 refuses to load)")
    act = hp.get("hidden_act", "silu")
    if act != "silu":
        refuse("hidden_act", act, "the converter writes no activation for DFlash-family drafts; b11739 runs SiLU "
               "(SwiGLU)")
    dc = hp.get("dflash_config") if isinstance(hp.get("dflash_config"), dict) else {}
    outputs = {k: dc.get(k, hp.get(k, cfg.get(k))) for k in ("output_multiplier", "final_logit_softcapping",
                                                         "input_embedding_scale")}
    set_ = {k: v for k, v in outputs.items() if v is not None and
            not (k in ("output_multiplier", "input_embedding_scale") and float(v) == 1.0) and
            not (k == "final_logit_softcapping" and float(v) <= 0)}
    for k, v in set_.items():
        k = f"dflash_config.{k}" if k in dc else k
        if spec_type is not None and (k.endswith("input_embedding_scale") or spec_type == "dflash2"):
            refuse(k, v, "speculators' classes do not read it; the converter writes it and b11739 applies it")
        if spec_type is None and not k.endswith("input_embedding_scale") and arch == "DFlashDraftModel":
            refuse(k, v, "z-lab's compute_logits applies it; the converter writes it, but b11739 applies the "
                   "output scale and softcap to DFlash2 logits only, so a DFlash draft's logits (and their "
                   "probabilities, though not their argmax) would leave it out")
    if family == "dspark" and hp.get("enable_confidence_head") and hp.get("confidence_head_with_markov") is False:
        refuse("confidence_head_with_markov", False, "b11739's DSpark confidence head reads the hidden state with the "
               "Markov head's previous-token embedding; the converter writes a conf_proj over the hidden state "
               "alone, which b11739 refuses to load (wrong shape)")


def _flatten_speculators(cfg_path: Path, cfg: dict, spec_type: str) -> dict:
    tlc = cfg.get("transformer_layer_config")
    if not isinstance(tlc, dict):
        raise ConvertError(f"{cfg_path}: no key 'transformer_layer_config' (a speculators {spec_type} config)")
    aux = cfg.get("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux or not all(isinstance(i, int) for i in aux):
        raise ConvertError(f"{cfg_path}: key 'aux_hidden_state_layer_ids' is missing or not a list of layer ids")
    # upstream adds one to each target_layer_ids entry, as its DSpark class undoes for speculators
    dflash_config = {"mask_token_id": cfg.get("mask_token_id"), "block_size": cfg.get("block_size", 8),
                     "target_layer_ids": [i - 1 for i in aux]}
    if spec_type == "dflash2":
        for key in _DFLASH2_FIELDS:
            if key not in cfg:
                raise ConvertError(f"{cfg_path}: no key '{key}' (a speculators dflash2 config)")
            dflash_config[key] = cfg[key]
    flat = {k: v for k, v in tlc.items()}
    if "draft_vocab_size" in cfg:
        flat["draft_vocab_size"] = cfg["draft_vocab_size"]
    flat["architectures"] = [_SPECULATORS_FLATTEN[spec_type]]
    flat["dflash_config"] = dflash_config
    return flat


def _check_target(target_dir: Path) -> dict:
    if not target_dir.is_dir():
        raise ConvertError(f"{target_dir}: the target model folder (--target-model-dir) does not exist")
    cfg = _read_json(target_dir / "config.json", "the target's config, which the converter reads")
    if not any((target_dir / f).is_file() for f in _TOKENIZER_FILES):
        raise ConvertError(f"{target_dir}: no {' or '.join(_TOKENIZER_FILES)}; the converter takes the draft's "
                           "vocabulary from the target's tokenizer")
    return cfg


def _check_out(out: Path, force: bool) -> None:
    if out.is_dir():
        raise ConvertError(f"{out}: is a folder, not a GGUF file to write")
    if not out.parent.is_dir():
        raise ConvertError(f"{out.parent}: no such folder to write {out.name} in")
    if out.exists() and not force:
        try:
            with open(out, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise ConvertError(f"{out}: exists and cannot be read ({e.strerror}); pass --force to replace it") from None
        if magic != b"GGUF":
            raise ConvertError(f"{out}: exists and is not a GGUF file; pass --force (force=True) to replace it")


def _require_modules() -> None:
    # what the converter and the staging import; found, not imported (torch alone takes seconds)
    from . import HIDE_ENV, torch_hidden
    missing = [m for m in ("torch", "transformers", "safetensors", "sentencepiece")
               if importlib.util.find_spec(m) is None]
    if torch_hidden():
        missing = [f"torch (hidden by {HIDE_ENV}=1)"]
    if missing:
        raise ConvertError(f"converting needs the graphgen[torch] extra: missing {', '.join(missing)}; {EXTRA_HINT}")


_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt))(:.*)?$")


def _failure_line(log: str, rc: int) -> str:
    """The converter's last meaningful error line: the exception a traceback ends with, else
    its last ERROR log line, else its last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _ERROR_LINE.match(ln):
            return ln
    for ln in reversed(lines):
        if ln.startswith("ERROR:"):
            return ln.split(":", 2)[-1].strip()
    return lines[-1] if lines else f"exit status {rc}, no output"


# --- convert ------------------------------------------------------------------------------------

def convert(hf_dir, out, *, target_dir=None, target_gguf=None, outtype: str = "f32", force: bool = False,
            warn: Callable[[str], None] | None = print_to_stderr) -> ConvertResult:
    """Run llama.cpp's converter on a DFlash-family draft folder; writes OUT atomically. With
    `target_gguf`, the target's folder is converted too (in parallel), into that file."""
    t0 = time.perf_counter()
    warn = warn or (lambda line: None)
    # messages name the folder as the user gave it; the converter is handed absolute paths
    hf_dir = Path(hf_dir).expanduser()
    out = Path(out).expanduser()
    if outtype not in OUTTYPES:
        raise ConvertError(f"outtype {outtype!r}: expected one of {', '.join(OUTTYPES)}")
    _require_modules()
    try:
        cfg = inspect(hf_dir).config
    except AuthorsError as e:
        raise ConvertError(str(e)) from None
    if target_dir is None:
        if not (hf_dir / "target").is_dir():
            raise ConvertError(f"{hf_dir}: the converter needs the target model's folder (--target-model-dir; "
                               f"graphgen convert --target DIR), and {hf_dir / 'target'} does not exist")
        target_dir = hf_dir / "target"
    target_dir = Path(target_dir).expanduser()
    _check_target(target_dir)
    _check_out(out, force)
    if target_gguf is not None:
        target_gguf = Path(target_gguf).expanduser()
        if target_gguf.resolve() == out.resolve():
            raise ConvertError(f"{target_gguf}: the target's GGUF and the draft's are one file; name two")
        _check_out(target_gguf, force)

    plan = _plan(hf_dir, cfg)
    tree = converter_tree()
    for line in plan.warnings:
        warn(line)

    from .. import progress
    stage_root = Path(tempfile.mkdtemp(prefix="graphgen-convert."))
    runs: list[_Run] = []
    try:
        # named as the checkpoint, since the converter names the model after its folder
        stage = stage_root / hf_dir.name
        _stage(stage, hf_dir, plan)
        runs.append(_Run(hf_dir, out, [str(stage), "--target-model-dir", str(target_dir.resolve())], outtype))
        if target_gguf is not None:
            runs.append(_Run(target_dir, target_gguf, [str(target_dir.resolve())], outtype, "the target"))
        with progress.task(f"convert {hf_dir.name}") as p:
            p.update(f"running llama.cpp's converter ({CONVERTER_COMMIT})"
                     + (" on the draft and its target" if target_gguf is not None else ""))
            for run in runs:
                run.start(tree)
            for run in runs:
                run.wait()
        for run in runs:
            run.check()
        names = _gguf_tensor_names(runs[0].tmp)
        target_arch = _target_arch(runs[1].tmp, target_dir) if target_gguf is not None else None
        for run in runs:
            run.commit()
    finally:
        for run in runs:
            run.discard()
        shutil.rmtree(stage_root, ignore_errors=True)
    warnings = list(plan.warnings)
    if target_arch is not None and target_arch not in _layer_input_archs():
        line = (f"warning: the target's architecture {target_arch!r}: b11739 publishes no layer inputs for it, so it "
                "lends the draft its tables (graphgen check, dump, diff with given features) but cannot drive a "
                "speculative loop (graphgen draft)")
        warn(line)
        warnings.append(line)
    return ConvertResult(out=out, commit=CONVERTER_COMMIT, warnings=warnings,
                         seconds=time.perf_counter() - t0, log=runs[0].log,
                         borrows=[n for n in _BORROWED if n not in names],
                         target_out=target_gguf, target_arch=target_arch,
                         target_log=runs[1].log if target_gguf is not None else "")


class _Run:
    """One run of the converter into a temporary file beside its output, renamed only when complete."""

    def __init__(self, src: Path, out: Path, args: list[str], outtype: str, what: str = ""):
        self.src, self.out, self.args, self.outtype, self.what = src, out, args, outtype, what
        self.tmp: Path | None = None
        self.proc = None
        self.log = ""

    def start(self, tree: Path) -> None:
        try:
            fd, name = tempfile.mkstemp(prefix=f".{self.out.name}.", suffix=".tmp", dir=self.out.parent)
        except OSError as e:
            raise ConvertError(f"{self.out}: cannot write here ({e.strerror or e})") from None
        os.close(fd)
        self.tmp = Path(name)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "gguf-py")] + (
            [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("NO_LOCAL_GGUF", None)
        env.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: nothing to look up on the Hub
        cmd = [sys.executable, str(tree / "convert_hf_to_gguf.py"), *self.args, "--outfile",
               str(self.tmp.resolve()), "--outtype", self.outtype]
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")

    def wait(self) -> None:
        if self.proc is not None:
            self.log = self.proc.communicate()[0] or ""

    def check(self) -> None:
        on = f" on {self.what}" if self.what else ""
        if self.proc.returncode != 0:
            err = ConvertError(f"{self.src}: llama.cpp's converter ({CONVERTER_COMMIT}) failed{on}: "
                               f"{_failure_line(self.log, self.proc.returncode)}")
            err.log = self.log  # the whole story, for callers that keep it
            raise err
        with open(self.tmp, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ConvertError(f"{self.src}: llama.cpp's converter ({CONVERTER_COMMIT}) exited 0{on} but wrote "
                                   f"no GGUF ({_failure_line(self.log, 0)})")

    def commit(self) -> None:
        os.chmod(self.tmp, 0o666 & ~_umask())  # as a new file gets
        os.replace(self.tmp, self.out)
        self.tmp = None

    def discard(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def _gguf_tensor_names(path: Path) -> set[str]:
    from gguf import GGUFReader
    return {t.name for t in GGUFReader(path).tensors}


def _layer_input_archs() -> frozenset:
    from ..reference.target import LAYER_INPUT_ARCHS
    return LAYER_INPUT_ARCHS


def _target_arch(path: Path, target_dir: Path) -> str:
    """The converted target's architecture; refused when it has no embeddings to lend."""
    from gguf import GGUFReader
    reader = GGUFReader(path)
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode("utf-8", "replace") if field is not None else "?"
    if arch in ("dflash", "dspark"):
        raise ConvertError(f"{target_dir}: converted to a {arch} draft, not a target model")
    if "token_embd.weight" not in {t.name for t in reader.tensors}:
        raise ConvertError(f"{target_dir}: its GGUF ({arch}) has no token_embd.weight to lend the draft")
    return arch


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _stage(stage: Path, hf_dir: Path, plan: _Plan) -> None:
    """Links to the checkpoint's files, with the changed copies in place of theirs."""
    stage.mkdir(parents=True)
    replaced = set()
    if plan.config is not None:
        (stage / "config.json").write_text(json.dumps(plan.config, indent=2) + "\n", encoding="utf-8")
        replaced.add("config.json")
    for entry in hf_dir.iterdir():
        if entry.name not in replaced:
            os.symlink(entry.resolve(), stage / entry.name)
