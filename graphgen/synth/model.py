"""make_model: a call's sizes and options checked, then the draft's keys and tensors created in the
loader's order (base, head_writers, dspark_backbones) and written (writer).

The order of those calls fixes the random stream, hence the bytes of every committed draft: one
moved changes every tensor drawn after it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .base import base_layers, common_tensors, hparam_options, target_tokenizer_keys, tokenizer_keys
from .dspark_backbones import make_backbone_model
from .head_writers import HEAD_WRITERS
from .options import (BACKBONE_ALIASES, BACKBONE_OPTIONS, BACKBONES, VARIANTS, WTYPES, all_options, check, models,
                      owners_of, positive_int, resolve_options)
from .writer import Draft, Output, kv, write


def make_model(path, variant="dflash", backbone="base", *, wtype="f32", progress=None, **kwargs) -> dict:
    """Write a random-weight `dflash` draft GGUF; `wtype` (f32, f16, q8_0) sets its matmul weights.

    The weights are drawn and written one tensor at a time, so memory stays near the largest
    tensor whatever the file's size; `progress`, a callable, is told which tensor is being
    written and how many MB of the total are done."""
    if wtype not in WTYPES:
        raise ValueError(f"wtype must be one of {', '.join(WTYPES)}, got {wtype!r}")
    return _make_model(path, variant, backbone, output=Output(wtype, progress), **kwargs)


def _make_model(path, variant="dflash", backbone="base", *, output: Output, n_embd=64, n_layer=2, n_head=None,
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
        from ..speculative.pair import default_target_layers, target_info, tokenizer_fields
        check(backbone == "base", "a draft for a target (--target) is made on the base backbone only")
        info = target_info(target)
        n_embd, n_vocab = info.n_embd, info.n_vocab
        if target_layers is None:
            target_layers = default_target_layers(info.n_layer)
            # the spread over 1 .. n_layer - 3 repeats a layer (or leaves the range) on a target of
            # five layers or fewer: a draft reading one layer twice is no default, so say so
            check(len(set(target_layers)) == len(target_layers) and
                  all(0 <= il < info.n_layer for il in target_layers),
                  f"the target {Path(target).name} has {info.n_layer} layers, too few for the authors' default "
                  f"spread of {len(target_layers)} target layers ({','.join(map(str, target_layers))}): give "
                  f"distinct layer-input indices in 0..{info.n_layer - 1} (--target-layers)")
        bad = [il for il in target_layers if not 0 <= int(il) < info.n_layer]
        check(not bad, f"target layer {bad[0] if bad else 0} is outside the target's layer inputs 0..{info.n_layer - 1}")
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
    backbone = BACKBONE_ALIASES.get(backbone, backbone)
    if backbone not in BACKBONES:
        raise ValueError(f"backbone must be one of {', '.join(BACKBONES)}, got {backbone!r}")
    if backbone != "base":
        return make_backbone_model(path, variant, backbone, output=output, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                                   n_ff=n_ff, n_vocab=n_vocab, block_size=block_size,
                                   target_layers=target_layers, seed=seed, context_length=context_length,
                                   rope_freq_base=rope_freq_base, rms_eps=rms_eps, conf=conf, **options)
    unknown_bb = sorted(k for k in options if k in BACKBONE_OPTIONS and k not in all_options())
    if unknown_bb:
        raise ValueError(f"option {unknown_bb[0]!r} applies to the dsv4, dsv41 and mistral-large4 backbones only")
    opts = resolve_options(variant, options)
    check(not conf or "conf" in models.arch.HEADS[variant].synth_options,
          f"conf (the confidence head) applies to variant {owners_of('conf')} only, not {variant}")

    n_embd = positive_int("n_embd", n_embd)
    n_layer = positive_int("n_layer", n_layer)
    n_head = positive_int("n_head", n_head)
    n_head_kv = n_head if n_head_kv is None else positive_int("n_head_kv", n_head_kv)
    n_ff = positive_int("n_ff", n_ff)
    n_vocab = positive_int("n_vocab", n_vocab)
    block_size = positive_int("block_size", block_size)
    context_length = positive_int("context_length", context_length)
    check(n_vocab >= 4, f"n_vocab must be at least 4 (unk, bos, eos and the mask token), got {n_vocab}")
    check(n_head % n_head_kv == 0, f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
    if opts["head_dim"] is None:
        check(n_embd % n_head == 0, f"n_embd ({n_embd}) must be divisible by n_head ({n_head}); "
                                    "or give head_dim")
        head_dim = n_embd // n_head
    else:
        head_dim = positive_int("head_dim", opts["head_dim"])
    target_layers = list(target_layers)
    check(len(target_layers) > 0, "target_layers must not be empty")
    check(all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0 for t in target_layers),
          f"target_layers must be non-negative integers, got {target_layers!r}")
    check(rms_eps > 0, f"rms_eps must be positive, got {rms_eps}")
    check(rope_freq_base > 0, f"rope_freq_base must be positive, got {rope_freq_base}")

    n_rot = opts["n_rot"]
    if n_rot is not None:
        n_rot = positive_int("n_rot", n_rot)
        check(n_rot % 2 == 0 and n_rot <= head_dim, f"n_rot ({n_rot}) must be even and at most "
                                                    f"head_dim ({head_dim})")
    n_vocab_draft = n_vocab
    if opts["d2t_vocab"] is not None:
        n_vocab_draft = positive_int("d2t_vocab", opts["d2t_vocab"])
        check(n_vocab_draft < n_vocab, f"d2t_vocab ({n_vocab_draft}) must be smaller than n_vocab ({n_vocab})")

    d = Draft(seed, bool(opts["weight_scales"]))

    # --- hparams read by llama_model_base::load_hparams and load_arch_hparams
    d.key(kv("context_length"), "u32", context_length)
    d.key(kv("embedding_length"), "u32", n_embd)
    d.key(kv("block_count"), "u32", n_layer)
    d.key(kv("feed_forward_length"), "u32", n_ff)
    d.key(kv("attention.head_count"), "u32", n_head)
    d.key(kv("attention.head_count_kv"), "u32", n_head_kv)
    d.key(kv("attention.layer_norm_rms_epsilon"), "f32", float(rms_eps))
    d.key(kv("rope.freq_base"), "f32", float(rope_freq_base))
    if opts["head_dim"] is not None:
        d.key(kv("attention.key_length"), "u32", head_dim)
        d.key(kv("attention.value_length"), "u32", head_dim)
    if n_rot is not None:
        d.key(kv("rope.dimension_count"), "u32", n_rot)
    # the loader throws without target_layers; DSpark asserts block_size, DFlash2/LiliCorr need it
    d.key(kv("target_layers"), "i32[]", [int(t) for t in target_layers])
    d.key(kv("block_size"), "u32", block_size)
    hparam_options(d, opts, n_layer, head_dim)

    # --- head hparams, then the tokenizer
    w = SimpleNamespace(n_embd=n_embd, n_layer=n_layer, n_vocab=n_vocab, n_vocab_draft=n_vocab_draft,
                        block_size=block_size, conf=conf)
    head_keys, head_tensors = HEAD_WRITERS.get(variant, (None, None))
    if head_keys is not None:
        head_keys(d, opts, w)
    if lend is None:
        tokenizer_keys(d, n_vocab)
    else:
        target_tokenizer_keys(d, *lend)

    # --- tensors, in load_arch_tensors order
    dims = SimpleNamespace(n_embd=n_embd, n_vocab=n_vocab, n_vocab_draft=n_vocab_draft,
                           n_embd_inp_enc=len(target_layers) * n_embd)
    C0 = common_tensors()
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
    base_layers(d, opts, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff)

    write(Path(path), d, output)
    return {
        "variant": variant,
        "backbone": backbone,
        "path": str(path),
        "n_tensors": len(d.tensors),
        "keys": {name: value for name, (_, value) in d.keys.items()},
        "tensors": {name: tuple(reversed(t.shape)) for name, t in d.tensors.items()},
    }


def _target_layer_shape(target, arch: str):
    """(n_head, n_head_kv, n_ff) of the target's layers; None where a key is absent or not one integer."""
    from ..ggufile import field_value, open_reader
    r = open_reader(Path(target))
    vals = [field_value(r, f"{arch}.{k}") for k in ("attention.head_count", "attention.head_count_kv",
                                                     "feed_forward_length")]
    return tuple(v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None for v in vals)
