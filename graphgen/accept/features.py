"""A target's layer inputs from two engines, and float copies of a quantized target.

A draft is trained on the features its authors' loop reads (a target in transformers) and run on
the ones llama.cpp reads (b11739's layer inputs). Both are taken here for the same GGUF and the
same tokens, in one numbering: layer `il`'s input, the output of layer il - 1, layer 0's being the
token embeddings, as `dflash.target_layers` counts them.

- `llama_features` / `llama_run`: b11739 in a child process (ReferenceTarget), one sequence, the
  tokens at positions 0.. in chunks of its batch, with the loop's own context settings;
- `transformers_features` / `transformers_run`: transformers' llama built from the GGUF's config,
  its weights dequantized by transformers' own GGUF loader (float activations throughout);
- `dequantize_gguf` / `dequantized`: a copy of a GGUF with every quantized tensor in f32 or f16,
  metadata kept, for b11739 to run the same weights without quantized matmuls;
- `nmse`: sum((a - b)^2) / sum(b^2) per layer, in float64.

Input is checked before anything runs; a bad file, layer or token list raises naming it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

from .. import cache
from ..errors import GraphgenError

# the loop's target context (tests/support/real_target.py, graphgen draft): f16 K/V, flash
# attention left to llama.cpp
LLAMA_DEFAULTS = {"type_k": "f16", "type_v": "f16", "flash_attn": "auto"}
DEQUANT_TYPES = ("f32", "f16")


class FeaturesError(GraphgenError, ValueError):
    """A target, layer list or token list the feature extraction cannot take; the message names it."""


# -- input --------------------------------------------------------------------------------------

def _target_path(target) -> Path:
    from ..speculative.targets import resolve
    path = resolve(target) if isinstance(target, str) else Path(target)
    if not path.is_file():
        raise FileNotFoundError(f"target {path}: no such file")
    return path


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _read_keys(f) -> dict:
    """A GGUF's keys, scalars and strings as values, arrays as their lengths: only what checking
    input needs, without decoding the tokenizer's hundred thousand strings as gguf-py's reader does."""
    def get(fmt):
        raw = f.read(struct.calcsize(fmt))
        if len(raw) != struct.calcsize(fmt):
            raise ValueError("ends inside its header")
        return struct.unpack(fmt, raw)[0]

    def string():
        n = get("<Q")
        raw = f.read(n)
        if len(raw) != n:
            raise ValueError("ends inside its header")
        return raw.decode("utf-8", errors="replace")

    def value(vtype):
        if vtype == 8:
            return string()
        if vtype == 9:
            sub, n = get("<I"), get("<Q")
            for _ in range(n) if sub in (8, 9) else ():
                value(sub)
            if sub not in (8, 9):
                f.seek(n * struct.calcsize(_SCALARS[sub]), 1)
            return n
        if vtype not in _SCALARS:
            raise ValueError(f"unknown value type {vtype}")
        return get(_SCALARS[vtype])

    if f.read(4) != b"GGUF":
        raise ValueError("no GGUF magic")
    version, _, n_kv = get("<I"), get("<Q"), get("<Q")
    if version not in (2, 3):
        raise ValueError(f"version {version}")
    keys = {}
    for _ in range(n_kv):
        key = string()
        keys[key] = value(get("<I"))
    return keys


@functools.lru_cache(maxsize=8)
def _gguf_shape(path: str, mtime: float) -> tuple[str, int, int, int]:
    try:
        with open(path, "rb") as f:
            keys = _read_keys(f)
    except (ValueError, KeyError, OverflowError, MemoryError) as e:
        raise FeaturesError(f"target {path}: not a GGUF ({e})") from None

    def field(key):
        if key not in keys:
            raise FeaturesError(f"target {path}: no key {key!r}")
        return keys[key]

    arch = field("general.architecture")
    return arch, int(field(f"{arch}.block_count")), int(field(f"{arch}.embedding_length")), \
        int(keys.get("tokenizer.ggml.tokens", 0))


def target_shape(target) -> tuple[Path, str, int, int, int]:
    """(path, architecture, n_layer, n_embd, n_vocab) of a target GGUF, or a name graphgen knows."""
    path = _target_path(target)
    return (path,) + _gguf_shape(str(path.resolve()), path.stat().st_mtime)


def _check(target, layers, tokens) -> tuple[Path, list[int], list[int], int]:
    path, _, n_layer, n_embd, n_vocab = target_shape(target)
    layers = [int(il) for il in layers]
    if not layers:
        raise FeaturesError("layers: empty; name at least one layer input")
    for il in layers:
        if not 0 <= il < n_layer:
            raise FeaturesError(f"layer {il}: out of range 0..{n_layer - 1} of the target {path.name}")
    tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
    if not tokens:
        raise FeaturesError("tokens: empty; give at least one token id")
    bad = [t for t in tokens if not 0 <= t < n_vocab]
    if bad:
        raise FeaturesError(f"tokens: id {bad[0]} out of range 0..{n_vocab - 1} of the target {path.name}")
    return path, layers, tokens, n_embd


# -- llama.cpp b11739 ---------------------------------------------------------------------------

def llama_run(target, layers, tokens, *, logits: bool = False, n_batch: int = 256, n_threads: int = 1,
              **settings) -> tuple[np.ndarray, np.ndarray | None]:
    """b11739's inputs of `layers` for `tokens` (one sequence from position 0): features float32
    [n_tokens, len(layers), n_embd], and with `logits` every row's logits [n_tokens, n_vocab].
    `settings` overrides LLAMA_DEFAULTS (type_k, type_v, flash_attn)."""
    from ..reference.session import ReferenceTarget
    path, layers, tokens, n_embd = _check(target, layers, tokens)
    opts = dict(LLAMA_DEFAULTS, **settings)
    n = len(tokens)
    n_ctx = -(-n // 256) * 256  # llama.cpp rounds the context up to 256 cells anyway
    feats = np.empty((n, len(layers) * n_embd), dtype=np.float32)
    out_logits = None
    with ReferenceTarget(path, layers, n_ctx=n_ctx, n_batch=n_batch, n_seq=1, n_threads=n_threads, **opts) as t:
        step = t.n_batch
        for p0 in range(0, n, step):
            rows = [(0, tok, p0 + k) for k, tok in enumerate(tokens[p0:p0 + step])]
            _, lg, f = t.decode(rows, full_logits=logits)
            feats[p0:p0 + len(rows)] = f
            if logits:
                if out_logits is None:
                    out_logits = np.empty((n, lg.shape[1]), dtype=np.float32)
                out_logits[p0:p0 + len(rows)] = lg
    return feats.reshape(n, len(layers), n_embd), out_logits


def llama_features(target, layers, tokens, **kw) -> np.ndarray:
    """b11739's inputs of `layers`: float32 [n_tokens, len(layers), n_embd] (llama_run)."""
    return llama_run(target, layers, tokens, **kw)[0]


def greedy(target, text: str, n: int, *, n_threads: int = 1) -> tuple[list[int], list[int]]:
    """(prompt tokens, the first `n` tokens b11739 generates after them at temperature 0)."""
    from ..reference.session import ReferenceTarget
    path = _target_path(target)
    if not text:
        raise FeaturesError("text: empty; greedy needs a prompt")
    with ReferenceTarget(path, [0], n_ctx=256, n_batch=64, n_seq=1, n_threads=n_threads) as t:
        prompt = t.tokenize(text)
        ids, _, _ = t.decode([(0, tok, k) for k, tok in enumerate(prompt)])
        out = [int(ids[-1, 0])]
        while len(out) < n:
            ids, _, _ = t.decode([(0, out[-1], len(prompt) + len(out) - 1)])
            out.append(int(ids[-1, 0]))
    return prompt, out


def tokenize(target, text: str) -> list[int]:
    """`text` as b11739's tokenizer of the target splits it (its own BOS rule)."""
    from ..reference.session import ReferenceTarget
    with ReferenceTarget(_target_path(target), [0], n_ctx=256, n_batch=64, n_seq=1) as t:
        return t.tokenize(text)


# -- the GGUF's own rows ------------------------------------------------------------------------

def embedding_rows(target, tokens) -> np.ndarray:
    """The rows of `token_embd.weight` for `tokens`, dequantized by gguf-py: float32 [n, n_embd]."""
    import gguf
    path, _, _, n_embd = _check(target, [0], tokens)
    r = gguf.GGUFReader(str(path))
    t = next((t for t in r.tensors if t.name == "token_embd.weight"), None)
    if t is None:
        raise FeaturesError(f"target {path}: no tensor 'token_embd.weight'")
    rows = np.asarray(t.data)[np.asarray(tokens, dtype=np.int64).reshape(-1)]
    return gguf.quants.dequantize(rows, t.tensor_type).astype(np.float32).reshape(-1, n_embd)


# -- transformers -------------------------------------------------------------------------------

def _require_transformers():
    try:
        import torch
        __import__("transformers")
    except ImportError as e:
        raise FeaturesError(f"transformers_features needs torch and transformers (graphgen[torch]): "
                            f"missing {e.name or e}") from None
    return torch


@contextlib.contextmanager
def _one_name_map():
    """gguf-py's tensor name map built once per architecture while transformers loads: its loader
    builds the same (read-only) map anew for every one of the model's ~400 modules, half the load."""
    import gguf
    built = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(built)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = built


@functools.lru_cache(maxsize=2)
def _hf_model(path: str, mtime: float, dtype_name: str):
    """transformers' model of a GGUF: its config from the GGUF's keys, its weights dequantized by
    transformers' GGUF loader. from_pretrained(gguf_file=) does the same two steps but requires
    accelerate, which graphgen[torch] does not install."""
    torch = _require_transformers()
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from ..authors import quiet_transformers
    quiet_transformers()
    p = Path(path)
    dtype = getattr(torch, dtype_name)
    cfg = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
    with no_init_weights():  # every weight is loaded below: a random init would only cost seconds
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.tie_weights()  # which post_init would have done: a tied head shares the embeddings
    with contextlib.redirect_stderr(io.StringIO()), _one_name_map():  # its tqdm bar ignores the verbosity
        tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    state = {k: torch.as_tensor(np.ascontiguousarray(v)) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(cfg, "tie_word_embeddings", False) and \
        model.get_output_embeddings().weight is model.get_input_embeddings().weight
    left = [k for k in missing if not (tied and k == "lm_head.weight")]
    if left or unexpected:
        raise FeaturesError(f"target {path}: transformers' GGUF loader left {left[:3]} unset, "
                            f"gave {list(unexpected)[:3]} no place")
    return model.eval()


def transformers_model(target, dtype=None):
    """The target in transformers (kept for the next call: loading takes seconds)."""
    torch = _require_transformers()
    path = _target_path(target)
    dtype = torch.float32 if dtype is None else dtype
    return _hf_model(str(path.resolve()), path.stat().st_mtime, str(dtype).removeprefix("torch."))


def transformers_run(target, layers, tokens, dtype=None, *, logits: bool = False
                     ) -> tuple[np.ndarray, np.ndarray | None]:
    """transformers' inputs of `layers` for `tokens`: features float32 [n_tokens, len(layers), n_embd]
    (hidden_states[il] of output_hidden_states, which is layer il's input: hidden_states[0] the
    embeddings), and with `logits` every row's logits float32 [n_tokens, n_vocab]."""
    path, layers, tokens, n_embd = _check(target, layers, tokens)
    torch = _require_transformers()
    model = transformers_model(path, dtype)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
    feats = np.stack([out.hidden_states[il][0].float().numpy() for il in layers], axis=1)
    lg = out.logits[0].float().numpy() if logits else None
    return np.ascontiguousarray(feats, dtype=np.float32), lg


def transformers_features(target, layers, tokens, dtype=None) -> np.ndarray:
    """transformers' inputs of `layers`: float32 [n_tokens, len(layers), n_embd] (transformers_run);
    `dtype` the model's torch dtype, float32 by default."""
    return transformers_run(target, layers, tokens, dtype)[0]


# -- float copies of a GGUF ---------------------------------------------------------------------

def dequantize_gguf(src, dst, to: str = "f32") -> Path:
    """Write `dst`: `src` with every quantized tensor dequantized to `to` (f32 or f16); float
    tensors (the norms) as they are; every key kept, general.file_type set to ALL_F32 / MOSTLY_F16
    as llama.cpp's converter labels such files."""
    import gguf
    if to not in DEQUANT_TYPES:
        raise FeaturesError(f"to: {to!r} is not one of {', '.join(DEQUANT_TYPES)}")
    src = _target_path(src)
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    file_type = gguf.LlamaFileType.ALL_F32 if to == "f32" else gguf.LlamaFileType.MOSTLY_F16
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes the header and the architecture itself
        vtype = gguf.GGUFValueType(int(f.types[0]))
        value = f.contents()
        if name == "general.file_type":
            value = int(file_type)
        sub = gguf.GGUFValueType(int(f.types[1])) if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, value, vtype, sub_type=sub)
    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    out_type = np.float32 if to == "f32" else np.float16
    for t in r.tensors:
        if t.tensor_type in floats:
            data = np.asarray(t.data)
            if t.tensor_type == gguf.GGMLQuantizationType.BF16:
                data = gguf.quants.dequantize(data, t.tensor_type).astype(out_type)
        else:
            data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(out_type)
        w.add_tensor(t.name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def dequantized(src, to: str = "f32") -> Path:
    """`src` dequantized to `to` in graphgen's cache, made once per source file (its sha256)."""
    if to not in DEQUANT_TYPES:
        raise FeaturesError(f"to: {to!r} is not one of {', '.join(DEQUANT_TYPES)}")
    src = _target_path(src)
    name = f"{src.stem}.{to.upper()}.gguf"
    entry = f"dequant-{_sha256(src)[:12]}-{to}"
    found = cache.find(entry)
    if found is not None and (found / name).is_file():
        return found / name
    dest = cache.root() / entry
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry}-", dir=dest.parent))
    try:
        dequantize_gguf(src, tmp / name, to)
        cache.install(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / name


# -- comparison ---------------------------------------------------------------------------------

def nmse(a, b) -> np.ndarray:
    """sum((a - b)^2) / sum(b^2) in float64, per layer: [n_tokens, n_layers, n_embd] -> [n_layers]
    (b the reference); [n_tokens, n_embd] -> a 0-d array."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise FeaturesError(f"nmse: shapes {a.shape} and {b.shape} differ")
    if a.ndim not in (2, 3):
        raise FeaturesError(f"nmse: shape {a.shape}: [n_tokens, n_layers, n_embd] or [n_tokens, n_embd]")
    den = (b * b).sum(axis=(0, -1))
    if np.any(den == 0):
        raise FeaturesError("nmse: the reference is all zeros" + (" at a layer" if a.ndim == 3 else ""))
    return ((a - b) ** 2).sum(axis=(0, -1)) / den


def top1_agreement(a, b) -> float:
    """The share of rows whose best token is the same in two logits arrays [n, n_vocab]."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 2:
        raise FeaturesError(f"top1_agreement: shapes {a.shape} and {b.shape}: two equal [n, n_vocab]")
    return float((a.argmax(axis=1) == b.argmax(axis=1)).mean())
