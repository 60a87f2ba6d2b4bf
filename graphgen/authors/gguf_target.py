"""A target GGUF on the authors' side of `graphgen check -m TARGET.gguf`.

check's folder form converts the target's HuggingFace folder to an f32 GGUF for b11739 and graphgen
to borrow the draft's tables from. With `-m` the target's own GGUF serves as it is: b11739 and
graphgen borrow its `token_embd.weight` and `output.weight` (the embeddings where it ties its head),
and the authors' model reads the same two tensors, dequantized to float32 by gguf-py's
`dequantize`, as transformers' GGUF loader reads them (features.transformers_model, accept's
target). Only these tables are read, never the whole target: for an 8B target, two matrices rather
than 32 GB of float32 weights.

- `tables_folder(gguf, out)`: a HuggingFace folder holding the target's config (transformers' GGUF
  reader) and `model.safetensors` with `model.embed_tokens.weight`, `lm_head.weight` (when the
  GGUF has an `output.weight`) and `model.norm.weight`: what z-lab's drafts read off their target,
  and what speculators loads from its verifier;
- `vocab_folder(gguf, out)`: the target's config and tokenizer rebuilt by transformers' GGUF reader,
  for llama.cpp's converter, which takes a draft's vocabulary from its target's folder;
- `staged_checkpoint(hf, out, verifier)`: a speculators checkpoint whose verifier is `verifier`
  (links to the checkpoint's files, its config.json changed), so that speculators' loader reads the
  GGUF's tables, never a Hub name.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import numpy as np

from . import AuthorsError

EMBD, HEAD, NORM = "token_embd.weight", "output.weight", "output_norm.weight"


def _reader(path: Path):
    import gguf
    try:
        return gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise AuthorsError(f"{path}: not a readable GGUF ({' '.join(str(e).split())})") from None


def read_tables(path) -> dict[str, np.ndarray]:
    """{'embed', 'head', 'norm'}: the target's float32 tables as transformers' GGUF loader
    dequantizes them; 'head' is the embeddings where the GGUF has no output.weight, 'norm' absent
    where it has no output_norm.weight."""
    import gguf
    path = Path(path)
    tensors = {t.name: t for t in _reader(path).tensors}
    if EMBD not in tensors:
        raise AuthorsError(f"{path}: no tensor '{EMBD}' to lend the draft")

    def table(name):
        t = tensors[name]
        try:
            return np.array(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32)  # a copy: the file closes
        except NotImplementedError as e:
            raise AuthorsError(f"{path}: tensor '{name}' is {t.tensor_type.name}, which gguf-py cannot "
                               f"dequantize ({e})") from None

    out = {"embed": table(EMBD)}
    out["head"] = table(HEAD) if HEAD in tensors else out["embed"]
    if NORM in tensors:
        out["norm"] = table(NORM)
    return out


def _hf_config(path: Path):
    """transformers' config of the GGUF (its GGUF reader), with `architectures` set."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, OSError, KeyError) as e:
        raise AuthorsError(f"{path}: transformers' GGUF reader refused it ({' '.join(str(e).split())[:200]}); "
                           "the authors' side reads the target through it") from None
    if not cfg.architectures:
        name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cfg.model_type)
        if name is None:
            raise AuthorsError(f"{path}: transformers has no causal LM class for model_type '{cfg.model_type}'")
        cfg.architectures = [name]
    return cfg


def tables_folder(path, out) -> Path:
    """Write `out`: the target's config and tables (read_tables) as a HuggingFace folder."""
    import torch
    from safetensors.torch import save_file
    path, out = Path(path), Path(out)
    tables = read_tables(path)
    cfg = _hf_config(path)
    tied = tables["head"] is tables["embed"]
    cfg.tie_word_embeddings = tied
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(out))
    state = {"model.embed_tokens.weight": torch.from_numpy(tables["embed"])}
    if not tied:
        state["lm_head.weight"] = torch.from_numpy(tables["head"])
    if "norm" in tables:
        state["model.norm.weight"] = torch.from_numpy(tables["norm"])
    save_file(state, str(out / "model.safetensors"))
    return out


def vocab_folder(path, out) -> Path:
    """Write `out`: the target's config and tokenizer, rebuilt from the GGUF by transformers, for
    llama.cpp's converter (which reads a draft's vocabulary from its target's folder, no weights)."""
    from transformers import AutoTokenizer
    path, out = Path(path), Path(out)
    cfg = _hf_config(path)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(out))
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, OSError, KeyError, TypeError) as e:
        raise AuthorsError(f"{path}: transformers could not rebuild its tokenizer ({' '.join(str(e).split())[:200]}), "
                           "from which llama.cpp's converter writes the draft's vocabulary; give the target's "
                           "folder with --target DIR (its config and tokenizer are read, not its weights)") from None
    tok.save_pretrained(str(out))
    return out


def staged_checkpoint(hf_dir, out, verifier) -> Path:
    """`out`: links to the speculators checkpoint's files, its config naming `verifier` as the
    verifier (speculators loads the embeddings and head from there)."""
    src, out = Path(hf_dir), Path(out)
    cfg_path = src / "config.json"
    cfg = json.loads(cfg_path.read_text())
    ver = (cfg.get("speculators_config") or {}).get("verifier")
    if not isinstance(ver, dict):
        raise AuthorsError(f"{cfg_path}: missing key 'speculators_config.verifier' (speculators reads the target's "
                           "embeddings through it)")
    ver["name_or_path"] = str(Path(verifier).resolve())
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in src.iterdir():
        if f.name != "config.json":
            os.symlink(f.resolve(), out / f.name)
    return out


def head_type(path) -> str:
    """The type of the output head a target GGUF lends (its output.weight, else the tied
    token_embd.weight), lowercased: f32, f16, q8_0, q6_k, ..."""
    tensors = {t.name: t for t in _reader(Path(path)).tensors}
    t = tensors.get(HEAD) or tensors.get(EMBD)
    if t is None:
        raise AuthorsError(f"{path}: no tensor '{HEAD}' nor '{EMBD}' to lend the draft")
    return t.tensor_type.name.lower()
