"""Tiny random-weight DFlash-family drafts, written as GGUF files llama.cpp's loader accepts.

`make_model` writes arch "dflash" drafts for the four heads (DFlash, DFlash2, DSpark, LiliCorr)
on the base backbone. Every key and tensor below is one that upstream reads
(`llama_model_dflash::load_arch_hparams` / `load_arch_tensors` and the seed's
`load_tensors_dflash2`, `load_tensors_dflash2_conv`, `load_tensors_dspark`,
`load_tensors_lilicorr`), or a key the speculative driver reads; nothing else is written, because
the loader rejects a file holding a tensor it never creates ("wrong number of tensors"). The one
seed-only tensor, DSpark's RNN `joint_proj` (option joint), is rejected that way by build b11739.

Shapes are given here in ggml order (ne0 first), as in the loader's create_tensor calls; numpy
stores them reversed. The same seed always gives the same bytes.

Long because it writes every head's and backbone's keys and tensors in one creation order: that
order fixes the random stream, hence the bytes of every committed draft.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np


ARCH = "dflash"
# the heads of models/arch.HEADS (tests/models/test_synth.py keeps them equal), spelt here because the model
# files load ggml, and the command line, which builds its options from this module, must be free
# to choose which ggml (--ggml) after importing it
VARIANTS = ("dflash", "dflash2", "dspark", "lilicorr")
BACKBONES = ("base", "dsv4", "dsv41", "mistral-large4")
# accepted spellings of the backbone names
_BACKBONE_ALIASES = {"mistral_large4": "mistral-large4", "ml4": "mistral-large4"}
HIDDEN_ACTS = ("silu", "gelu", "gelu_pytorch_tanh")

# GGUF token types (llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL = 1, 2, 3
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0

# option -> default, with the variant it belongs to (None: any variant)
OPTIONS: dict[str, tuple[object, str | None]] = {
    "head_dim": (None, None),
    "n_rot": (None, None),
    "swa_window": (None, None),
    "swa_pattern": (None, None),
    "mrope_sections": (None, None),
    "shared_kv": (False, None),
    "sinks": (False, None),
    "weight_scales": (False, None),
    "post_norms": (False, None),
    "out_scale": (False, None),
    "rope_freqs": (False, None),
    # rope scaling (llama_model_base::load_hparams): type, factor, original context, attention factor
    "rope_scaling": (None, None),
    "rope_scaling_factor": (None, None),
    "rope_orig_ctx": (None, None),
    "rope_attn_factor": (None, None),
    "attention_scale": (None, None),
    "value_scale": (None, None),
    "embedding_scale": (None, None),
    "logit_scale": (None, None),
    "final_softcap": (None, None),
    "causal": (None, None),
    "hidden_act": (None, None),
    "d2t_vocab": (None, None),
}
class _Models:
    """The model files (tensor declarations, head entries), imported on first use: they load ggml."""

    def __getattr__(self, name):
        import importlib
        mod = importlib.import_module(f".models.{name}", __package__)
        setattr(self, name, mod)
        return mod


_m = _Models()
_ALL_OPTIONS: dict = {}


def _options() -> dict:
    """OPTIONS and each head's own options, from its registry entry (models/*.py HEAD.synth_options):
    name -> (default, the heads it applies to, "a|b")."""
    if not _ALL_OPTIONS:
        opts = dict(OPTIONS)
        for head in _m.arch.HEADS.values():
            for name, default in head.synth_options.items():
                owners = opts[name][1] + "|" if name in opts else ""
                opts[name] = (default, owners + head.name)
        _ALL_OPTIONS.update(opts)
    return _ALL_OPTIONS


# rows of a tensor drawn at a time: a big draft is written without ever holding a whole tensor in float64
_CHUNK_ELEMENTS = 1 << 18


class _Tensor:
    """A tensor of the draft: its numpy shape and dtype now, its values only when it is written.

    `rows(rng)` yields it in blocks of whole rows (last numpy axis), drawn from the draft's one
    generator; the tensors are drawn in creation order, so the bytes equal drawing them all up front."""

    def __init__(self, shape: tuple, dtype, rows):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.rows = rows

    @property
    def ndim(self) -> int:
        return len(self.shape)


class _Draft:
    """Keys and tensors of one draft, in creation order, drawn from one generator when written."""

    def __init__(self, seed: int, weight_scales: bool):
        self.rng = np.random.default_rng(seed)
        self.weight_scales = weight_scales
        self.keys: dict[str, tuple[str, object]] = {}
        self.tensors: dict[str, _Tensor] = {}

    def key(self, name: str, kind: str, value) -> None:
        self.keys[name] = (kind, value)

    def add(self, name: str, shape, dtype, rows) -> None:
        if name in self.tensors:
            raise AssertionError(f"tensor {name} written twice")
        self.tensors[name] = _Tensor(shape, dtype, rows)

    def normal(self, name: str, ne, std: float, mean: float = 0.0) -> None:
        shape = tuple(reversed(ne))
        row = shape[-1]
        n_rows = int(np.prod(shape[:-1], dtype=np.int64))
        step = max(1, _CHUNK_ELEMENTS // max(row, 1))

        def rows(rng):
            # chunks of a standard_normal draw continue one another, so this equals one draw of `shape`
            for r0 in range(0, n_rows, step):
                n = min(step, n_rows - r0)
                yield (mean + std * rng.standard_normal((n, row))).astype(np.float32)
        self.add(name, shape, np.float32, rows)

    # a tensor the loader declares (models/tensors.T): its name and shape come from the
    # declaration, `dims` standing in for the hparams its shape reads and `at` filling the
    # name's placeholders (il, or LiliCorr's bid, i, fb)
    def normal_t(self, decl, dims, std: float = 0.1, mean: float = 0.0, **at) -> None:
        self.normal(decl.name.format(**at), decl.shape(dims, dims), std, mean)

    def norm_t(self, decl, dims, **at) -> None:
        self.normal_t(decl, dims, 0.1, 1.0, **at)

    def bias_t(self, decl, dims, **at) -> None:
        self.normal_t(decl, dims, 0.02, **at)

    def linear_t(self, decl, scale_decl, dims, **at) -> None:
        """A matmul weight {n_in, n_out} (1/sqrt(n_in) keeps activations O(1)); with weight_scales
        also its optional scale {1}, where upstream loads one (scale_decl; None where it does not)."""
        n_in, n_out = decl.shape(dims, dims)
        self.normal(decl.name.format(**at), (n_in, n_out), 1.0 / np.sqrt(n_in))
        if scale_decl is not None and self.weight_scales:
            self.normal_t(scale_decl, dims, 0.1, 1.0, **at)


def _by_attr(decls) -> dict:
    return {t.attr: t for t in decls}


def _common() -> dict:
    return _by_attr(_m.dflash.COMMON_TENSORS)


def _kv(name: str) -> str:
    return f"{ARCH}.{name}"


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _positive_int(name: str, value) -> int:
    _check(isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0,
           f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _owners_of(option: str) -> str:
    return " or ".join(_options()[option][1].split("|"))


def _resolve_options(variant: str, options: dict) -> dict:
    known = _options()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; known: {', '.join(known)}")
    opts = {}
    for name, (default, owner) in known.items():
        if options.get(name) is not None:
            if owner is not None and variant not in owner.split("|"):
                raise ValueError(f"option {name} applies to variant {owner.replace('|', ' or ')} only, "
                                 f"not {variant}")
            opts[name] = options[name]
        else:
            opts[name] = default
    head = _m.arch.HEADS.get(variant)
    for name, flag in (head.synth_needs.items() if head is not None else ()):
        _check(options.get(name) is None or opts[flag], f"option {name} needs {flag}=True on a {variant} draft")
    return opts


WTYPES = ("f32", "f16", "q8_0")
# the matmul weights a real draft ships in f16/bf16 or quantized; norms, biases and scales stay f32
_QUANTIZABLE = re.compile(r"^(token_embd|output|fc|blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down))\.weight$")

PRESETS = {
    "tiny": {},
    # the shape of published DFlash drafts for 4B-8B targets
    "realistic": {"n_embd": 2048, "n_layer": 5, "n_head": 32, "n_head_kv": 8, "n_ff": 6144,
                  "n_vocab": 32000, "block_size": 16, "target_layers": [1, 9, 17, 25, 33]},
}


def make_model(path, variant="dflash", backbone="base", *, wtype="f32", progress=None, **kwargs) -> dict:
    """Write a random-weight `dflash` draft GGUF; `wtype` (f32, f16, q8_0) sets its matmul weights.

    The weights are drawn and written one tensor at a time, so memory stays near the largest
    tensor whatever the file's size; `progress`, a callable, is told which tensor is being
    written and how many MB of the total are done."""
    if wtype not in WTYPES:
        raise ValueError(f"wtype must be one of {', '.join(WTYPES)}, got {wtype!r}")
    return _make_model(path, variant, backbone, output=_Output(wtype, progress), **kwargs)


@dataclass(frozen=True)
class _Output:
    """How a draft's tensors are written: the matmul weights' type, and who hears of progress."""
    wtype: str = "f32"
    progress: Callable[[str], None] | None = None


def _make_model(path, variant="dflash", backbone="base", *, output: _Output, n_embd=64, n_layer=2, n_head=None,
                n_head_kv=None, n_ff=None, n_vocab=256, block_size=4, target_layers=None, seed=0,
                context_length=4096, rope_freq_base=10000.0, rms_eps=1e-6, conf=False, target=None,
                **options) -> dict:
    """Write a random-weight `dflash` draft GGUF to `path`; return a summary of what was written.

    `target`: a target GGUF the draft is shaped for, as llama.cpp's converter shapes a real one:
    n_embd and vocabulary (its tokenizer keys) from the target, target layers in its range (the
    authors' default spread unless given), and no token embeddings or lm head of its own (it
    borrows the target's; a d2t draft keeps its own reduced lm head).

    The summary has variant, backbone, path, n_tensors, keys (name -> value) and tensors
    (name -> ggml shape, ne0 first).
    """
    lend = None
    if target is not None:
        from .speculative.pair import default_target_layers, target_info, tokenizer_fields
        _check(backbone == "base", "a draft for a target (--target) is made on the base backbone only")
        info = target_info(target)
        n_embd, n_vocab = info.n_embd, info.n_vocab
        if target_layers is None:
            target_layers = default_target_layers(info.n_layer)
            # the spread over 1 .. n_layer - 3 repeats a layer (or leaves the range) on a target of
            # five layers or fewer: a draft reading one layer twice is no default, so say so
            _check(len(set(target_layers)) == len(target_layers) and
                   all(0 <= il < info.n_layer for il in target_layers),
                   f"the target {Path(target).name} has {info.n_layer} layers, too few for the authors' default "
                   f"spread of {len(target_layers)} target layers ({','.join(map(str, target_layers))}): give "
                   f"distinct layer-input indices in 0..{info.n_layer - 1} (--target-layers)")
        bad = [il for il in target_layers if not 0 <= int(il) < info.n_layer]
        _check(not bad, f"target layer {bad[0] if bad else 0} is outside the target's layer inputs 0..{info.n_layer - 1}")
        lend = (info, tokenizer_fields(target))
        # a draft layer shaped as the target's layers, as the authors build theirs
        if n_head is None and n_head_kv is None and n_ff is None:
            n_head, n_head_kv, n_ff = _target_layer_shape(target, info.arch)
    if target_layers is None:
        target_layers = (1, 2)
    n_head = 4 if n_head is None else n_head
    n_ff = 128 if n_ff is None else n_ff
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    backbone = _BACKBONE_ALIASES.get(backbone, backbone)
    if backbone not in BACKBONES:
        raise ValueError(f"backbone must be one of {', '.join(BACKBONES)}, got {backbone!r}")
    if backbone != "base":
        return _make_backbone_model(path, variant, backbone, output=output, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                                    n_ff=n_ff, n_vocab=n_vocab, block_size=block_size,
                                    target_layers=target_layers, seed=seed, context_length=context_length,
                                    rope_freq_base=rope_freq_base, rms_eps=rms_eps, conf=conf, **options)
    unknown_bb = sorted(k for k in options if k in BACKBONE_OPTIONS and k not in _options())
    if unknown_bb:
        raise ValueError(f"option {unknown_bb[0]!r} applies to the dsv4, dsv41 and mistral-large4 backbones only")
    opts = _resolve_options(variant, options)
    _check(not conf or "conf" in _m.arch.HEADS[variant].synth_options,
           f"conf (the confidence head) applies to variant {_owners_of('conf')} only, not {variant}")

    n_embd = _positive_int("n_embd", n_embd)
    n_layer = _positive_int("n_layer", n_layer)
    n_head = _positive_int("n_head", n_head)
    n_head_kv = n_head if n_head_kv is None else _positive_int("n_head_kv", n_head_kv)
    n_ff = _positive_int("n_ff", n_ff)
    n_vocab = _positive_int("n_vocab", n_vocab)
    block_size = _positive_int("block_size", block_size)
    context_length = _positive_int("context_length", context_length)
    _check(n_vocab >= 4, f"n_vocab must be at least 4 (unk, bos, eos and the mask token), got {n_vocab}")
    _check(n_head % n_head_kv == 0, f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
    if opts["head_dim"] is None:
        _check(n_embd % n_head == 0, f"n_embd ({n_embd}) must be divisible by n_head ({n_head}); "
                                     "or give head_dim")
        head_dim = n_embd // n_head
    else:
        head_dim = _positive_int("head_dim", opts["head_dim"])
    target_layers = list(target_layers)
    _check(len(target_layers) > 0, "target_layers must not be empty")
    _check(all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0 for t in target_layers),
           f"target_layers must be non-negative integers, got {target_layers!r}")
    _check(rms_eps > 0, f"rms_eps must be positive, got {rms_eps}")
    _check(rope_freq_base > 0, f"rope_freq_base must be positive, got {rope_freq_base}")

    n_rot = opts["n_rot"]
    if n_rot is not None:
        n_rot = _positive_int("n_rot", n_rot)
        _check(n_rot % 2 == 0 and n_rot <= head_dim, f"n_rot ({n_rot}) must be even and at most "
                                                     f"head_dim ({head_dim})")
    n_vocab_draft = n_vocab
    if opts["d2t_vocab"] is not None:
        n_vocab_draft = _positive_int("d2t_vocab", opts["d2t_vocab"])
        _check(n_vocab_draft < n_vocab, f"d2t_vocab ({n_vocab_draft}) must be smaller than n_vocab ({n_vocab})")

    d = _Draft(seed, bool(opts["weight_scales"]))

    # --- hparams read by llama_model_base::load_hparams and load_arch_hparams
    d.key(_kv("context_length"), "u32", context_length)
    d.key(_kv("embedding_length"), "u32", n_embd)
    d.key(_kv("block_count"), "u32", n_layer)
    d.key(_kv("feed_forward_length"), "u32", n_ff)
    d.key(_kv("attention.head_count"), "u32", n_head)
    d.key(_kv("attention.head_count_kv"), "u32", n_head_kv)
    d.key(_kv("attention.layer_norm_rms_epsilon"), "f32", float(rms_eps))
    d.key(_kv("rope.freq_base"), "f32", float(rope_freq_base))
    if opts["head_dim"] is not None:
        d.key(_kv("attention.key_length"), "u32", head_dim)
        d.key(_kv("attention.value_length"), "u32", head_dim)
    if n_rot is not None:
        d.key(_kv("rope.dimension_count"), "u32", n_rot)
    # the loader throws without target_layers; DSpark asserts block_size, DFlash2/LiliCorr need it
    d.key(_kv("target_layers"), "i32[]", [int(t) for t in target_layers])
    d.key(_kv("block_size"), "u32", block_size)
    _hparam_options(d, opts, n_layer, head_dim)

    # --- head hparams, then the tokenizer
    w = SimpleNamespace(n_embd=n_embd, n_layer=n_layer, n_vocab=n_vocab, n_vocab_draft=n_vocab_draft,
                        block_size=block_size, conf=conf)
    head_keys, head_tensors = _HEAD_WRITERS.get(variant, (None, None))
    if head_keys is not None:
        head_keys(d, opts, w)
    if lend is None:
        _tokenizer_keys(d, n_vocab)
    else:
        _target_tokenizer_keys(d, *lend)

    # --- tensors, in load_arch_tensors order
    dims = SimpleNamespace(n_embd=n_embd, n_vocab=n_vocab, n_vocab_draft=n_vocab_draft,
                           n_embd_inp_enc=len(target_layers) * n_embd)
    C0 = _common()
    if lend is None:
        d.normal_t(C0["tok_embd"], dims, 1.0)
    if n_vocab_draft != n_vocab:
        # d2t maps draft rows to target token ids: the logits are scattered to these rows
        d.add(C0["d2t"].name, (n_vocab_draft,), np.int64,
              lambda rng: iter([np.sort(rng.choice(n_vocab, size=n_vocab_draft, replace=False)).astype(np.int64)]))
    if head_tensors is not None:
        head_tensors(d, opts, w)
    d.linear_t(C0["fc"], C0["fc_s"], dims)
    d.norm_t(C0["output_norm_enc"], dims)  # encoder hidden_norm, after fc
    d.norm_t(C0["output_norm"], dims)      # decoder final norm
    # output.scale is loaded only for an NVFP4 lm head, so an f32 draft carries none
    if lend is None or n_vocab_draft != n_vocab:
        d.linear_t(C0["output"], None, dims)
    _base_layers(d, opts, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff)

    _write(Path(path), d, output)
    return {
        "variant": variant,
        "backbone": backbone,
        "path": str(path),
        "n_tensors": len(d.tensors),
        "keys": {name: value for name, (_, value) in d.keys.items()},
        "tensors": {name: tuple(reversed(t.shape)) for name, t in d.tensors.items()},
    }


ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")


def _hparam_options(d: _Draft, opts: dict, n_layer: int, head_dim: int) -> None:
    if opts["swa_pattern"] is not None and opts["swa_window"] is None:
        raise ValueError("swa_pattern needs swa_window")
    if opts["swa_window"] is not None:
        window = _positive_int("swa_window", opts["swa_window"])
        # upstream reads the pattern as required once a window is set; default: even layers slide
        pattern = opts["swa_pattern"]
        pattern = [il % 2 == 0 for il in range(n_layer)] if pattern is None else [bool(p) for p in pattern]
        _check(len(pattern) == n_layer, f"swa_pattern has {len(pattern)} entries, n_layer is {n_layer}")
        # a window with no sliding layer aborts upstream (GGML_ASSERT(hparams.is_swa_any()))
        _check(any(pattern), "swa_pattern marks no layer as sliding; upstream aborts on such a window")
        d.key(_kv("attention.sliding_window"), "u32", window)
        d.key(_kv("attention.sliding_window_pattern"), "bool[]", pattern)
    if opts["mrope_sections"] is not None:
        sections = [int(s) for s in opts["mrope_sections"]]
        _check(len(sections) == 4 and all(s >= 0 for s in sections) and sum(sections[:3]) > 0,
               f"mrope_sections must be 4 non-negative ints, one of the first three positive, "
               f"got {opts['mrope_sections']!r}")
        # ggml's rope builds its sin/cos cache over the head and rotates the first n_rot dims: the
        # sections may reach past n_rot/2, not past the head
        _check(sum(sections) <= head_dim, f"mrope_sections sum to {sum(sections)}, more than the head "
                                          f"dimension ({head_dim})")
        d.key(_kv("rope.dimension_sections"), "i32[]", sections)
    if opts["rope_scaling"] is not None:
        _check(opts["rope_scaling"] in ROPE_SCALING_TYPES,
               f"rope_scaling must be one of {', '.join(ROPE_SCALING_TYPES)}, got {opts['rope_scaling']!r}")
        d.key(_kv("rope.scaling.type"), "str", opts["rope_scaling"])
    if opts["rope_scaling_factor"] is not None:
        d.key(_kv("rope.scaling.factor"), "f32", float(opts["rope_scaling_factor"]))
    if opts["rope_orig_ctx"] is not None:
        d.key(_kv("rope.scaling.original_context_length"), "u32", _positive_int("rope_orig_ctx", opts["rope_orig_ctx"]))
    if opts["rope_attn_factor"] is not None:
        d.key(_kv("rope.scaling.attn_factor"), "f32", float(opts["rope_attn_factor"]))
    if opts["final_softcap"] is not None:
        _check(opts["final_softcap"] > 0, f"final_softcap must be positive, got {opts['final_softcap']}")
    for opt, key in (("attention_scale", "attention.scale"), ("value_scale", "attention.value_scale"),
                     ("embedding_scale", "embedding_scale"), ("logit_scale", "logit_scale"),
                     ("final_softcap", "final_logit_softcapping")):
        if opts[opt] is not None:
            d.key(_kv(key), "f32", float(opts[opt]))
    if opts["causal"] is not None:
        d.key(_kv("attention.causal"), "bool", bool(opts["causal"]))
    if opts["hidden_act"] is not None:
        _check(opts["hidden_act"] in HIDDEN_ACTS,
               f"hidden_act must be one of {', '.join(HIDDEN_ACTS)}, got {opts['hidden_act']!r}")
        d.key(_kv("hidden_activation"), "str", opts["hidden_act"])


def _tokenizer_keys(d: _Draft, n_vocab: int) -> None:
    mask_id = n_vocab - 1
    tokens = [f"<t{i}>" for i in range(n_vocab)]
    types = [TOKEN_NORMAL] * n_vocab
    for tid, text, kind in ((UNK_ID, "<unk>", TOKEN_UNKNOWN), (BOS_ID, "<s>", TOKEN_CONTROL),
                            (EOS_ID, "</s>", TOKEN_CONTROL), (mask_id, "<mask>", TOKEN_CONTROL)):
        tokens[tid], types[tid] = text, kind
    d.key("tokenizer.ggml.model", "str", "llama")
    d.key("tokenizer.ggml.tokens", "str[]", tokens)
    d.key("tokenizer.ggml.scores", "f32[]", [-float(i) for i in range(n_vocab)])
    d.key("tokenizer.ggml.token_type", "i32[]", types)
    d.key("tokenizer.ggml.bos_token_id", "u32", BOS_ID)
    d.key("tokenizer.ggml.eos_token_id", "u32", EOS_ID)
    d.key("tokenizer.ggml.unknown_token_id", "u32", UNK_ID)
    d.key("tokenizer.ggml.mask_token_id", "u32", mask_id)


_KIND_OF = {str: "str", bool: "bool", int: "u32", float: "f32"}


def _target_layer_shape(target, arch: str):
    """(n_head, n_head_kv, n_ff) of the target's layers; None where a key is absent or not one integer."""
    from .ggufile import field_value, open_reader
    r = open_reader(Path(target))
    vals = [field_value(r, f"{arch}.{k}") for k in ("attention.head_count", "attention.head_count_kv",
                                                     "feed_forward_length")]
    return tuple(v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None for v in vals)


def _target_tokenizer_keys(d: _Draft, info, fields) -> None:
    """The target's tokenizer keys as they are, plus a mask token: the target's own, else its last
    control token that is not bos, eos, unk or padding (the noise block's filler)."""
    types = None
    for key, value in fields:
        if isinstance(value, list):
            if not value:
                continue
            kind = {str: "str[]", int: "i32[]", float: "f32[]", bool: "bool[]"}[type(value[0])]
            if key == "tokenizer.ggml.token_type":
                types = value
        else:
            kind = _KIND_OF[type(value)]
        d.key(key, kind, value)
    if "mask" not in info.special:
        taken = set(info.special.values())
        control = [i for i, t in enumerate(types or []) if t == TOKEN_CONTROL and i not in taken]
        d.key("tokenizer.ggml.mask_token_id", "u32", control[-1] if control else info.n_vocab - 1)


def _base_layers(d: _Draft, opts: dict, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff) -> None:
    """load_tensors_layers_base, in its order, from its declarations (models/dflash.py)."""
    B = _by_attr(_m.dflash.LAYER_TENSORS)
    dims = SimpleNamespace(n_embd=n_embd, n_head=n_head, n_embd_head_k=head_dim, n_embd_k_gqa=head_dim * n_head_kv,
                           n_embd_v_gqa=head_dim * n_head_kv, n_ff=n_ff)
    for il in range(n_layer):
        d.norm_t(B["attn_norm"], dims, il=il)
        d.linear_t(B["wq"], B["wq_s"], dims, il=il)
        d.linear_t(B["wk"], B["wk_s"], dims, il=il)
        if not opts["shared_kv"]:  # without attn_v, V is the RMS-normed K
            d.linear_t(B["wv"], B["wv_s"], dims, il=il)
        d.linear_t(B["wo"], B["wo_s"], dims, il=il)
        d.norm_t(B["attn_q_norm"], dims, il=il)
        d.norm_t(B["attn_k_norm"], dims, il=il)
        if opts["post_norms"]:
            d.norm_t(B["attn_post_norm"], dims, il=il)
            d.norm_t(B["ffn_post_norm"], dims, il=il)
        if opts["out_scale"]:
            d.normal_t(B["out_scale"], dims, 0.1, 1.0, il=il)
        if opts["rope_freqs"] and il == 0:
            # one tensor without a layer index; upstream duplicates it into every layer
            d.normal_t(_m.dflash.ROPE_FREQS, dims, 0.1, 1.0)
        if opts["sinks"]:
            d.normal_t(B["attn_sinks"], dims, 0.5, il=il)
        d.norm_t(B["ffn_norm"], dims, il=il)
        d.linear_t(B["ffn_gate"], B["ffn_gate_s"], dims, il=il)
        d.linear_t(B["ffn_down"], B["ffn_down_s"], dims, il=il)
        d.linear_t(B["ffn_up"], B["ffn_up_s"], dims, il=il)


# --- DFlash2: local conv in the layers + candidate selector on the block

def _dflash2_keys(d: _Draft, opts: dict, n_embd: int) -> None:
    rank = _positive_int("selector_rank", opts["selector_rank"])
    top_k = _positive_int("selector_top_k", opts["selector_top_k"])
    _check(n_embd >= top_k * (top_k + 1),
           f"DFlash2 needs n_embd >= selector_top_k*(selector_top_k+1) for the selector lattice: "
           f"n_embd {n_embd} < {top_k * (top_k + 1)}")
    d.key(_kv("selector_rank"), "u32", rank)
    d.key(_kv("selector_top_k"), "u32", top_k)
    _conv_keys(d, opts, n_embd)


def _conv_keys(d: _Draft, opts: dict, n_embd: int) -> None:
    kernel = _positive_int("conv_kernel_size", opts["conv_kernel_size"])
    group = _positive_int("conv_group_size", opts["conv_group_size"])
    _check(n_embd % group == 0, f"n_embd ({n_embd}) must be divisible by conv_group_size ({group})")
    d.key(_kv("conv_kernel_size"), "u32", kernel)
    d.key(_kv("conv_group_size"), "u32", group)


def _dflash2_tensors(d: _Draft, opts: dict, n_embd: int, n_vocab: int, n_layer: int) -> None:
    S, rank = _by_attr(_m.dflash2.DFLASH2_TENSORS), opts["selector_rank"]
    dims = SimpleNamespace(selector_rank=rank, n_vocab=n_vocab, n_embd=n_embd)
    d.normal_t(S["dflash_selector_prev"], dims, 1.0 / np.sqrt(rank))
    d.normal_t(S["dflash_selector_next"], dims, 1.0 / np.sqrt(rank))
    d.normal_t(S["dflash_selector_hidden"], dims, 1.0 / np.sqrt(n_embd))
    _conv_tensors(d, opts, n_embd, n_layer)


def _conv_tensors(d: _Draft, opts: dict, n_embd: int, n_layer: int) -> None:
    """load_tensors_dflash2_conv: per-layer base taps {n_embd, kernel, 2} plus a projection to
    2*kernel coefficients per channel group (side 0: attention input, side 1: FFN input)."""
    C, kernel = _by_attr(_m.conv.CONV_LAYER_TENSORS), opts["conv_kernel_size"]
    dims = SimpleNamespace(n_embd=n_embd, conv_kernel_size=kernel, conv_group_size=opts["conv_group_size"])
    for il in range(n_layer):
        for part in ("attn", "ffn"):
            # the taps sum kernel terms: weights ~1/kernel keep the output O(1)
            d.normal_t(C[f"dflash_{part}_conv_base"], dims, 0.5 / kernel, il=il)
            d.normal_t(C[f"dflash_{part}_conv_proj"], dims, 0.1 / np.sqrt(n_embd), il=il)


# --- DSpark: Markov head (+ confidence head, + RNN joint head in the seed)

def _dspark_keys(d: _Draft, opts: dict, conf: bool) -> None:
    _positive_int("markov_rank", opts["markov_rank"])
    # the driver reads a missing key as "has a confidence head", so say so either way
    d.key(_kv("has_confidence_head"), "bool", bool(conf))
    if opts["sample_from_anchor"] is not None:
        d.key(_kv("sample_from_anchor"), "bool", bool(opts["sample_from_anchor"]))


def _dspark_tensors(d: _Draft, opts: dict, n_embd: int, n_vocab: int, n_vocab_draft: int, conf: bool) -> None:
    D, rank = _by_attr(_m.dspark.DSPARK_TENSORS), opts["markov_rank"]
    dims = SimpleNamespace(n_embd=n_embd, n_vocab=n_vocab, n_vocab_draft=n_vocab_draft, dspark_rank=rank)
    # w1 is a previous-token embedding over the full vocab, w2 projects it to draft-vocab bias
    d.normal_t(D["dspark_markov_w1"], dims, 1.0)
    d.linear_t(D["dspark_markov_w2"], D["dspark_markov_w2_s"], dims)
    if conf:
        d.normal_t(D["dspark_conf_proj"], dims, 1.0 / np.sqrt(n_embd + rank))
        d.bias_t(D["dspark_conf_proj_b"], dims)
    if opts["joint"]:  # seed only: b11739 does not load joint_proj
        d.normal_t(D["dspark_joint_proj"], dims, 1.0 / np.sqrt(n_embd + 2 * rank))
        d.bias_t(D["dspark_joint_proj_b"], dims)


# --- LiliCorr: correlation scorer over the block's top-k candidates

def _lilicorr_keys(d: _Draft, opts: dict, n_embd: int, n_layer: int, block_size: int) -> None:
    # fill in the defaults that depend on n_embd, for _lilicorr_tensors
    hidden = opts["lilicorr_hidden"] = n_embd if opts["lilicorr_hidden"] is None else _positive_int(
        "lilicorr_hidden", opts["lilicorr_hidden"])
    heads = _positive_int("lilicorr_heads", opts["lilicorr_heads"])
    top_k = _positive_int("lilicorr_top_k", opts["lilicorr_top_k"])
    layers = _positive_int("lilicorr_layers", opts["lilicorr_layers"])
    factor = _positive_int("lilicorr_factor", opts["lilicorr_factor"])
    opts["lilicorr_mlp"] = mlp = 2 * hidden if opts["lilicorr_mlp"] is None else _positive_int(
        "lilicorr_mlp", opts["lilicorr_mlp"])
    _check(block_size >= 2, f"LiliCorr needs block_size >= 2 (one anchor and at least one slot), got {block_size}")
    _check(hidden % heads == 0, f"lilicorr_hidden ({hidden}) must be divisible by lilicorr_heads ({heads})")
    _check(top_k * (top_k + 1) <= n_embd, f"LiliCorr needs n_embd >= lilicorr_top_k*(lilicorr_top_k+1): "
                                          f"n_embd {n_embd} < {top_k * (top_k + 1)}")
    # its head layers live on layers[0..num_layers) of the base stack
    _check(layers <= n_layer, f"lilicorr_layers ({layers}) must not exceed n_layer ({n_layer})")
    _check(opts["lilicorr_eps"] > 0, f"lilicorr_eps must be positive, got {opts['lilicorr_eps']}")
    # LiliCorr keys carry no arch prefix
    d.key("lilicorr.hidden_size", "u32", hidden)
    d.key("lilicorr.candidate_topk", "u32", top_k)
    d.key("lilicorr.num_heads", "u32", heads)
    d.key("lilicorr.num_layers", "u32", layers)
    d.key("lilicorr.vector_eps", "f32", float(opts["lilicorr_eps"]))
    d.key("lilicorr.logit_scale", "f32", float(opts["lilicorr_logit_scale"]))
    d.key("lilicorr.factor_dim", "u32", factor)
    d.key("lilicorr.mlp_hidden_size", "u32", mlp)
    if opts["lilicorr_conv"]:
        _conv_keys(d, opts, n_embd)


def _lilicorr_tensors(d: _Draft, opts: dict, n_embd: int, n_layer: int, block_size: int) -> None:
    L, F, Y = (_by_attr(_m.lilicorr.LILICORR_TENSORS), _by_attr(_m.lilicorr.LILICORR_FEATURE_TENSORS),
               _by_attr(_m.lilicorr.LILICORR_LAYER_TENSORS))
    hidden = opts["lilicorr_hidden"]
    dims = SimpleNamespace(n_embd=n_embd, block_size=block_size, lilicorr_hidden_size=hidden,
                           lilicorr_candidate_topk=opts["lilicorr_top_k"], lilicorr_num_heads=opts["lilicorr_heads"],
                           lilicorr_factor_dim=opts["lilicorr_factor"], lilicorr_mlp_hidden_size=opts["lilicorr_mlp"])
    fb = n_layer + opts["lilicorr_layers"]  # head layers sit after the base stack
    if hidden != n_embd:
        d.linear_t(L["lilicorr_token_proj"], L["lilicorr_token_proj_s"], dims)
        d.bias_t(L["lilicorr_token_proj_b"], dims)
    d.linear_t(L["lilicorr_pass_hidden_proj"], L["lilicorr_pass_hidden_proj_s"], dims)
    d.bias_t(L["lilicorr_pass_hidden_proj_b"], dims)
    # the 5 per-candidate scalar features: norm, then a 2-layer MLP
    d.norm_t(F["lilicorr_feature_norm"], dims, fb=fb)
    d.bias_t(F["lilicorr_feature_norm_b"], dims, fb=fb)
    d.linear_t(F["lilicorr_feature_mlp_1"], None, dims, fb=fb)
    d.bias_t(F["lilicorr_feature_mlp_1_b"], dims, fb=fb)
    d.linear_t(F["lilicorr_feature_mlp_3"], None, dims, fb=fb)
    d.bias_t(F["lilicorr_feature_mlp_3_b"], dims, fb=fb)
    d.normal_t(L["lilicorr_slot_embedding"], dims, 0.5)
    d.normal_t(L["lilicorr_rank_embedding"], dims, 0.5)
    d.normal_t(L["lilicorr_attention_bias"], dims, 0.1)
    d.linear_t(L["lilicorr_context_proj"], L["lilicorr_context_proj_s"], dims)
    d.bias_t(L["lilicorr_context_proj_b"], dims)
    for i in range(opts["lilicorr_layers"]):
        at = {"bid": n_layer + i, "i": i}  # the in-projection is named by head layer i, the rest by block id
        d.norm_t(Y["lilicorr_attn_norm"], dims, **at)
        d.norm_t(Y["lilicorr_mlp_norm"], dims, **at)
        d.linear_t(Y["lilicorr_attn_in_proj"], None, dims, **at)
        d.bias_t(Y["lilicorr_attn_in_proj_b"], dims, **at)
        d.linear_t(Y["lilicorr_attn_out_proj"], Y["lilicorr_attn_out_proj_s"], dims, **at)
        d.bias_t(Y["lilicorr_attn_out_proj_b"], dims, **at)
        d.linear_t(Y["lilicorr_mlp_0"], Y["lilicorr_mlp_0_s"], dims, **at)
        d.bias_t(Y["lilicorr_mlp_0_b"], dims, **at)
        d.linear_t(Y["lilicorr_mlp_2"], Y["lilicorr_mlp_2_s"], dims, **at)
        d.bias_t(Y["lilicorr_mlp_2_b"], dims, **at)
    d.norm_t(L["lilicorr_output_norm"], dims)
    d.norm_t(L["lilicorr_anchor_norm"], dims)
    d.linear_t(L["lilicorr_factor_input_proj"], None, dims)
    d.bias_t(L["lilicorr_factor_input_proj_b"], dims)
    for head in ("out_head", "in_head", "anchor_out_head"):
        d.linear_t(L[f"lilicorr_{head}"], None, dims)
        d.bias_t(L[f"lilicorr_{head}_b"], dims)
    if opts["lilicorr_conv"]:
        _conv_tensors(d, opts, n_embd, n_layer)


# --- the DSpark backbones: DeepSeek-V4 (dsv4), DeepSeek-V4.1 (dsv41), Mistral Large 4 (mistral-large4)

# option -> (default, backbones it applies to)
BACKBONE_OPTIONS: dict[str, tuple[object, str]] = {
    "swa_window": (16, "dsv4|dsv41|mistral-large4"),
    "head_dim": (None, "dsv4|dsv41"),
    "n_rot": (16, "dsv4|dsv41|mistral-large4"),
    "q_lora_rank": (32, "dsv4|dsv41"),
    "o_groups": (2, "dsv4|dsv41"),
    "o_lora_rank": (16, "dsv4|dsv41"),
    "n_expert": (4, "dsv4|dsv41"),
    "n_expert_used": (2, "dsv4|dsv41"),
    "n_ff_exp": (32, "dsv4|dsv41"),
    "n_expert_shared": (1, "dsv4|dsv41"),
    "hc_mult": (4, "dsv4|dsv41"),
    "hc_sinkhorn_iters": (3, "dsv4|dsv41"),
    "hc_eps": (1e-6, "dsv4|dsv41"),
    "swiglu_clamp": (2.0, "dsv4|dsv41"),
    "expert_weights_scale": (1.5, "dsv4|dsv41"),
    "expert_weights_norm": (True, "dsv4|dsv41"),
    "expert_gating_func": (4, "dsv4|dsv41"),
    "compress_ratio": (0, "dsv4|dsv41"),
    "kv_lora_rank": (32, "mistral-large4"),
    "k_head_dim_mla": (32, "mistral-large4"),
    "v_head_dim_mla": (32, "mistral-large4"),
    "rope_scaling_factor": (4.0, "mistral-large4"),
    "yarn_log_mul": (0.1, "mistral-large4"),
    "final_softcap": (30.0, "mistral-large4"),
    "markov_rank": (16, "dsv4|dsv41|mistral-large4"),
    "joint": (False, "mistral-large4"),
}


def _make_backbone_model(path, variant, backbone, *, output: _Output, n_embd, n_layer, n_head, n_ff, n_vocab, block_size,
                         target_layers, seed, context_length, rope_freq_base, rms_eps, conf, **options) -> dict:
    """load_hparams_dsv4 / load_hparams_mistral_large4 and their load_tensors_layers_* (seed's dspark.cpp)."""
    runs = sorted(h.name for h in _m.arch.HEADS.values() if h.on_backbones)
    _check(variant in runs, f"the {backbone} backbone takes variant {' or '.join(runs)}, not {variant}")
    _check(not conf or "conf" in _m.arch.HEADS[variant].synth_options,
           f"conf (the confidence head) applies to variant {_owners_of('conf')} only")
    opts = {}
    for name, value in options.items():
        if name not in BACKBONE_OPTIONS:
            raise ValueError(f"unknown option {name!r} for the {backbone} backbone; known: {', '.join(BACKBONE_OPTIONS)}")
        if value is not None and value is not False and backbone not in BACKBONE_OPTIONS[name][1].split("|"):
            raise ValueError(f"option {name} does not apply to the {backbone} backbone")
    for name, (default, owners) in BACKBONE_OPTIONS.items():
        if backbone in owners.split("|"):
            opts[name] = options[name] if options.get(name) is not None else default
    n_embd, n_layer, n_head = (_positive_int(k, v) for k, v in (("n_embd", n_embd), ("n_layer", n_layer),
                                                                 ("n_head", n_head)))
    n_vocab, block_size = _positive_int("n_vocab", n_vocab), _positive_int("block_size", block_size)
    _check(n_vocab >= 4, f"n_vocab must be at least 4, got {n_vocab}")
    n_rot = _positive_int("n_rot", opts["n_rot"])
    _check(n_rot % 2 == 0, f"n_rot ({n_rot}) must be even")
    window = _positive_int("swa_window", opts["swa_window"])
    if opts.get("joint"):
        _check("joint" in _m.arch.HEADS[variant].synth_options, f"joint (the RNN joint head) needs variant {_owners_of('joint')}")

    d = _Draft(seed, False)
    d.key(_kv("context_length"), "u32", _positive_int("context_length", context_length))
    d.key(_kv("embedding_length"), "u32", n_embd)
    d.key(_kv("block_count"), "u32", n_layer)
    d.key(_kv("feed_forward_length"), "u32", _positive_int("n_ff", n_ff))
    d.key(_kv("attention.head_count"), "u32", n_head)
    d.key(_kv("attention.head_count_kv"), "u32", 1)
    d.key(_kv("attention.layer_norm_rms_epsilon"), "f32", float(rms_eps))
    d.key(_kv("rope.freq_base"), "f32", float(rope_freq_base))
    d.key(_kv("target_layers"), "i32[]", [int(t) for t in target_layers])
    d.key(_kv("block_size"), "u32", block_size)
    d.key(_kv("attention.sliding_window"), "u32", window)

    if backbone in ("dsv4", "dsv41"):
        head_dim = opts["head_dim"] if opts["head_dim"] is not None else 32
        head_dim = _positive_int("head_dim", head_dim)
        _check(n_rot <= head_dim, f"n_rot ({n_rot}) must be at most head_dim ({head_dim})")
        hc = _positive_int("hc_mult", opts["hc_mult"])
        groups = _positive_int("o_groups", opts["o_groups"])
        _check(n_head % groups == 0, f"n_head ({n_head}) must be a multiple of o_groups ({groups})")
        n_expert = _positive_int("n_expert", opts["n_expert"])
        n_used = _positive_int("n_expert_used", opts["n_expert_used"])
        _check(n_used <= n_expert, f"n_expert_used ({n_used}) must not exceed n_expert ({n_expert})")
        d.key(_kv("attention.key_length"), "u32", head_dim)
        d.key(_kv("attention.value_length"), "u32", head_dim)
        d.key(_kv("rope.dimension_count"), "u32", n_rot)
        d.key(_kv("attention.q_lora_rank"), "u32", _positive_int("q_lora_rank", opts["q_lora_rank"]))
        d.key(_kv("attention.output_group_count"), "u32", groups)
        d.key(_kv("attention.output_lora_rank"), "u32", _positive_int("o_lora_rank", opts["o_lora_rank"]))
        d.key(_kv("attention.compress_ratios"), "i32[]", [int(opts["compress_ratio"])] * n_layer)
        d.key(_kv("expert_count"), "u32", n_expert)
        d.key(_kv("expert_used_count"), "u32", n_used)
        d.key(_kv("expert_feed_forward_length"), "u32", _positive_int("n_ff_exp", opts["n_ff_exp"]))
        d.key(_kv("expert_shared_count"), "u32", _positive_int("n_expert_shared", opts["n_expert_shared"]))
        d.key(_kv("expert_weights_scale"), "f32", float(opts["expert_weights_scale"]))
        d.key(_kv("expert_weights_norm"), "bool", bool(opts["expert_weights_norm"]))
        d.key(_kv("expert_gating_func"), "u32", int(opts["expert_gating_func"]))
        d.key(_kv("swiglu_clamp_exp"), "f32", float(opts["swiglu_clamp"]))
        d.key(_kv("hyper_connection.count"), "u32", hc)
        d.key(_kv("hyper_connection.sinkhorn_iterations"), "u32",
              _positive_int("hc_sinkhorn_iters", opts["hc_sinkhorn_iters"]))
        d.key(_kv("hyper_connection.epsilon"), "f32", float(opts["hc_eps"]))
        if backbone == "dsv41":
            d.key(_kv("hyper_connection.single_pass"), "bool", True)
    else:
        rank = _positive_int("kv_lora_rank", opts["kv_lora_rank"])
        k_mla = _positive_int("k_head_dim_mla", opts["k_head_dim_mla"])
        v_mla = _positive_int("v_head_dim_mla", opts["v_head_dim_mla"])
        _check(n_rot < k_mla, f"n_rot ({n_rot}) must be smaller than k_head_dim_mla ({k_mla})")
        d.key(_kv("attention.key_length"), "u32", rank + n_rot)
        d.key(_kv("attention.value_length"), "u32", rank)
        d.key(_kv("attention.key_length_mla"), "u32", k_mla)
        d.key(_kv("attention.value_length_mla"), "u32", v_mla)
        d.key(_kv("attention.kv_lora_rank"), "u32", rank)
        d.key(_kv("rope.dimension_count"), "u32", n_rot)
        factor = float(opts["rope_scaling_factor"])
        if factor and factor != 1.0:
            d.key(_kv("rope.scaling.type"), "str", "yarn")
            d.key(_kv("rope.scaling.factor"), "f32", factor)
            d.key(_kv("rope.scaling.original_context_length"), "u32", max(1, context_length // int(factor)))
            d.key(_kv("rope.scaling.yarn_log_multiplier"), "f32", float(opts["yarn_log_mul"]))
        if opts["final_softcap"]:
            d.key(_kv("final_logit_softcapping"), "f32", float(opts["final_softcap"]))
    head_keys, head_tensors = _HEAD_WRITERS.get(variant, (None, None))
    w = SimpleNamespace(n_embd=n_embd, n_layer=n_layer, n_vocab=n_vocab, n_vocab_draft=n_vocab, block_size=block_size,
                        conf=conf)
    head_opts = {"markov_rank": opts.get("markov_rank"), "joint": bool(opts.get("joint")), "sample_from_anchor": None}
    if head_keys is not None:
        head_keys(d, head_opts, w)
    _tokenizer_keys(d, n_vocab)

    dims = SimpleNamespace(n_embd=n_embd, n_vocab=n_vocab, n_vocab_draft=n_vocab,
                           n_embd_inp_enc=len(target_layers) * n_embd)
    C0 = _common()
    d.normal_t(C0["tok_embd"], dims, 1.0)
    if head_tensors is not None:
        head_tensors(d, head_opts, w)
    d.linear_t(C0["fc"], C0["fc_s"], dims)
    d.norm_t(C0["output_norm_enc"], dims)
    d.norm_t(C0["output_norm"], dims)
    d.linear_t(C0["output"], None, dims)
    if backbone in ("dsv4", "dsv41"):
        _dsv4_layers(d, opts, backbone, n_layer, n_embd, n_head, head_dim)
    else:
        _ml4_layers(d, opts, n_layer, n_embd, n_head, n_ff, n_rot, block_size)

    _write(Path(path), d, output)
    return {
        "variant": variant, "backbone": backbone, "path": str(path), "n_tensors": len(d.tensors),
        "keys": {name: value for name, (_, value) in d.keys.items()},
        "tensors": {name: tuple(reversed(t.shape)) for name, t in d.tensors.items()},
    }


def _dsv4_layers(d: _Draft, opts: dict, backbone: str, n_layer, n_embd, n_head, head_dim) -> None:
    """load_tensors_layers_dsv4 (hc_head only without single-pass mHC, i.e. not on DSV4.1)."""
    X, H = _by_attr(_m.dspark.DSV4_LAYER_TENSORS), _by_attr(_m.dspark.DSV4_TENSORS)
    hc = opts["hc_mult"]
    hc_dim = hc * n_embd
    q_rank, groups, o_rank = opts["q_lora_rank"], opts["o_groups"], opts["o_lora_rank"]
    n_ff_exp = opts["n_ff_exp"]
    dims = SimpleNamespace(n_embd=n_embd, n_head=n_head, n_embd_head_k=head_dim, n_lora_q=q_rank, hc_mult=hc,
                           dsv4_o_group_count=groups, dsv4_o_lora_rank=o_rank, n_expert=opts["n_expert"],
                           n_ff_exp=n_ff_exp, n_expert_shared=opts["n_expert_shared"])
    if backbone == "dsv4":
        d.normal_t(H["hc_head_fn"], dims, 1.0 / np.sqrt(hc_dim))
        d.normal_t(H["hc_head_base"], dims, 0.1)
        d.normal_t(H["hc_head_scale"], dims, 0.1, 1.0)
    for il in range(n_layer):
        d.norm_t(X["attn_norm"], dims, il=il)
        d.normal_t(X["attn_sinks"], dims, 0.5, il=il)
        d.linear_t(X["wq_a"], None, dims, il=il)
        d.norm_t(X["attn_q_a_norm"], dims, il=il)
        d.linear_t(X["wq_b"], None, dims, il=il)
        d.linear_t(X["wkv"], None, dims, il=il)
        d.norm_t(X["attn_kv_norm"], dims, il=il)
        # {H*D/G, R, G}: the loader checks this reshapable tensor apart from the declared shapes
        d.normal(_m.dspark.DSV4_WO_A.name.format(il=il), (n_head * head_dim // groups, o_rank, groups),
                 1.0 / np.sqrt(n_head * head_dim // groups))
        d.linear_t(X["wo_b"], None, dims, il=il)
        for part in ("attn", "ffn"):
            d.normal_t(X[f"hc_{part}_fn"], dims, 1.0 / np.sqrt(hc_dim), il=il)
            d.normal_t(X[f"hc_{part}_base"], dims, 0.1, il=il)
            d.normal_t(X[f"hc_{part}_scale"], dims, 0.1, 1.0, il=il)
        d.linear_t(X["ffn_gate_inp"], None, dims, il=il)
        d.normal_t(X["ffn_exp_probs_b"], dims, 0.1, il=il)
        d.norm_t(X["ffn_norm"], dims, il=il)
        d.normal_t(X["ffn_gate_exps"], dims, 1.0 / np.sqrt(n_embd), il=il)
        d.normal_t(X["ffn_down_exps"], dims, 1.0 / np.sqrt(n_ff_exp), il=il)
        d.normal_t(X["ffn_up_exps"], dims, 1.0 / np.sqrt(n_embd), il=il)
        d.linear_t(X["ffn_gate_shexp"], None, dims, il=il)
        d.linear_t(X["ffn_down_shexp"], None, dims, il=il)
        d.linear_t(X["ffn_up_shexp"], None, dims, il=il)


def _ml4_layers(d: _Draft, opts: dict, n_layer, n_embd, n_head, n_ff, n_rot, block_size) -> None:
    """load_tensors_layers_mistral_large4: MLA attention (wk_b/wv_b per head), dense SwiGLU FFN."""
    X, M = _by_attr(_m.dspark.ML4_LAYER_TENSORS), _by_attr(_m.dspark.ML4_TENSORS)
    rank, k_mla, v_mla = opts["kv_lora_rank"], opts["k_head_dim_mla"], opts["v_head_dim_mla"]
    dims = SimpleNamespace(n_embd=n_embd, n_head=n_head, n_ff=n_ff, n_rot=n_rot, block_size=block_size,
                           n_lora_kv=rank, n_embd_head_k_mla=k_mla, n_embd_head_v_mla=v_mla)
    d.normal_t(M["dspark_mask_embd"], dims, 1.0)
    for il in range(n_layer):
        d.norm_t(X["attn_norm"], dims, il=il)
        d.linear_t(X["wq"], None, dims, il=il)
        d.linear_t(X["wkv_a_mqa"], None, dims, il=il)
        d.norm_t(X["attn_kv_a_norm"], dims, il=il)
        d.normal_t(X["wk_b"], dims, 1.0 / np.sqrt(k_mla - n_rot), il=il)
        d.normal_t(X["wv_b"], dims, 1.0 / np.sqrt(rank), il=il)
        d.linear_t(X["wo"], None, dims, il=il)
        d.norm_t(X["ffn_norm"], dims, il=il)
        d.linear_t(X["ffn_gate"], None, dims, il=il)
        d.linear_t(X["ffn_down"], None, dims, il=il)
        d.linear_t(X["ffn_up"], None, dims, il=il)


# each head's keys and tensors, (d, options, dimensions) -> None; the plain DFlash head has none
_HEAD_WRITERS = {
    "dflash2": (lambda d, o, w: _dflash2_keys(d, o, w.n_embd),
                lambda d, o, w: _dflash2_tensors(d, o, w.n_embd, w.n_vocab, w.n_layer)),
    "dspark": (lambda d, o, w: _dspark_keys(d, o, w.conf),
               lambda d, o, w: _dspark_tensors(d, o, w.n_embd, w.n_vocab, w.n_vocab_draft, w.conf)),
    "lilicorr": (lambda d, o, w: _lilicorr_keys(d, o, w.n_embd, w.n_layer, w.block_size),
                 lambda d, o, w: _lilicorr_tensors(d, o, w.n_embd, w.n_layer, w.block_size)),
}


def _write(path: Path, d: _Draft, output: _Output) -> None:
    import gguf

    # gguf logs its endianness on every writer at INFO
    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)
    w = gguf.GGUFWriter(str(path), ARCH)
    scalar = {"u32": w.add_uint32, "f32": w.add_float32, "bool": w.add_bool, "str": w.add_string}
    array_type = {"i32[]": gguf.GGUFValueType.INT32, "f32[]": gguf.GGUFValueType.FLOAT32,
                  "bool[]": gguf.GGUFValueType.BOOL, "str[]": gguf.GGUFValueType.STRING}
    for name, (kind, value) in d.keys.items():
        if kind in scalar:
            scalar[kind](name, value)
        else:
            w.add_key_value(name, list(value), gguf.GGUFValueType.ARRAY, sub_type=array_type[kind])
    # every tensor's info goes first, so the header is written before any value is drawn
    plan = []
    for name, t in d.tensors.items():
        kind = t.dtype.name
        if output.wtype != "f32" and t.dtype == np.float32 and t.ndim == 2 and _QUANTIZABLE.match(name):
            if output.wtype == "f16":
                kind = "f16"
            elif t.shape[-1] % 32 == 0:  # q8_0 blocks hold 32 values of a row
                kind = "q8_0"
        if kind == "f16":
            shape, dtype = t.shape, np.dtype(np.float16)
        elif kind == "q8_0":
            q8 = gguf.GGMLQuantizationType.Q8_0
            block, type_size = gguf.GGML_QUANT_SIZES[q8]
            shape, dtype = (*t.shape[:-1], t.shape[-1] // block * type_size), np.dtype(np.uint8)
        else:
            shape, dtype = t.shape, t.dtype
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        w.add_tensor_info(name, shape, dtype, nbytes, raw_dtype=q8 if kind == "q8_0" else None)
        plan.append((name, t, kind, shape, dtype))
    total = sum(int(np.prod(sh, dtype=np.int64)) * dt.itemsize for _, _, _, sh, dt in plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        done = 0
        for name, t, kind, shape, dtype in plan:
            # one tensor at a time, in its file type: the largest tensor bounds the memory, not the file
            out = np.empty(shape, dtype=dtype)
            flat = out.reshape(-1, shape[-1]) if out.ndim > 1 else out.reshape(1, -1)
            r0 = 0
            for block in t.rows(d.rng):
                block = block.reshape(-1, t.shape[-1])
                if kind == "q8_0":
                    block = gguf.quants.quantize(block, gguf.GGMLQuantizationType.Q8_0)
                flat[r0:r0 + block.shape[0]] = block
                r0 += block.shape[0]
                if output.progress is not None:
                    digits = 0 if total >= 100e6 else 2
                    output.progress(f"writing {name}, {(done + r0 * flat.shape[1] * dtype.itemsize) / 1e6:.{digits}f} of "
                              f"{total / 1e6:.{digits}f} MB")
            w.write_tensor_data(out)
            done += out.nbytes
            del out, flat
    finally:
        w.close()
