"""`graphgen make-model` and `graphgen info`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..synth import BACKBONES, HIDDEN_ACTS, PRESETS, VARIANTS, WTYPES, make_model


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_make_model_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of `make_model`; read them back with `make_model_from_args`."""
    parser.add_argument("out", metavar="OUT", help="GGUF file to write (a folder with --format hf)")
    parser.add_argument("--format", choices=("gguf", "hf"), default="gguf",
                        help="gguf: a draft GGUF (default); hf: a checkpoint in the draft authors' own format "
                             "with a small target folder beside it (needs graphgen[torch])")
    parser.add_argument("--authors", choices=("zlab", "speculators"), default=None,
                        help="with --format hf: z-lab's dflash package (DFlash, DFlash2; the default for them) "
                             "or vLLM's speculators (DFlash, DFlash2, DSpark; the default for DSpark)")
    parser.add_argument("--force", action="store_true",
                        help="replace OUT even when it is not a GGUF (with --format hf: when it holds an "
                             "earlier graphgen checkpoint)")
    parser.add_argument("--variant", choices=VARIANTS, default="dflash")
    parser.add_argument("--backbone", choices=BACKBONES, default="base")
    parser.add_argument("--conf", action="store_true", help="DSpark confidence head")
    # the size flags default to None so that, given, they win over --preset (DIM_DEFAULTS otherwise)
    parser.add_argument("--n-embd", type=int, help="default 64")
    parser.add_argument("--layers", type=int, help="default 2")
    parser.add_argument("--heads", type=int, help="default 4")
    parser.add_argument("--heads-kv", type=int, default=None)
    parser.add_argument("--head-dim", type=int, default=None)
    parser.add_argument("--n-rot", type=int, default=None, help="rope.dimension_count (default: the head size)")
    parser.add_argument("--n-ff", type=int, help="default 128")
    parser.add_argument("--vocab", type=int, help="default 256")
    parser.add_argument("--block-size", type=int, help="default 4")
    parser.add_argument("--target-layers", type=_int_list, metavar="1,2", help="default 1,2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wtype", choices=WTYPES, default="f32", help="type of the matmul weights")
    parser.add_argument("--preset", choices=tuple(PRESETS), default=None,
                        help="realistic: n_embd 2048, 5 layers, 32/8 heads of 64, n_ff 6144, vocab 32000, block 16 "
                             "(default: none, the tiny draft)")
    parser.add_argument("--context-length", type=int, default=4096)
    parser.add_argument("--rope-freq-base", type=float, default=10000.0)
    parser.add_argument("--rms-eps", type=float, default=1e-6)
    g = parser.add_argument_group("layer options")
    g.add_argument("--swa-window", type=int)
    g.add_argument("--swa-pattern", type=_int_list, metavar="1,0,1", help="1 = sliding layer")
    g.add_argument("--mrope-sections", type=_int_list, metavar="8,0,0,0")
    g.add_argument("--shared-kv", action="store_true", help="no attn_v: V is the RMS-normed K")
    g.add_argument("--sinks", action="store_true", help="per-head attention sinks")
    g.add_argument("--weight-scales", action="store_true", help="per-tensor *.scale tensors")
    g.add_argument("--post-norms", action="store_true")
    g.add_argument("--out-scale", action="store_true", help="blk.N.layer_output_scale")
    g.add_argument("--rope-freqs", action="store_true", help="rope_freqs.weight")
    g.add_argument("--rope-scaling", choices=("none", "linear", "yarn", "longrope"),
                   help="dflash.rope.scaling.type")
    g.add_argument("--rope-scaling-factor", type=float, help="dflash.rope.scaling.factor")
    g.add_argument("--rope-orig-ctx", type=int, help="dflash.rope.scaling.original_context_length")
    g.add_argument("--rope-attn-factor", type=float, help="dflash.rope.scaling.attn_factor")
    g.add_argument("--attention-scale", type=float)
    g.add_argument("--value-scale", type=float)
    g.add_argument("--embedding-scale", type=float)
    g.add_argument("--logit-scale", type=float)
    g.add_argument("--final-softcap", type=float)
    g.add_argument("--causal", action="store_true", help="dflash.attention.causal = true")
    g.add_argument("--hidden-act", choices=HIDDEN_ACTS)
    g.add_argument("--d2t-vocab", type=int, help="reduced draft vocab with a d2t map (--format hf DSpark: "
                   "default 3/4 of --vocab, as llama.cpp's converter drops a full-vocabulary DSpark's head)")
    g = parser.add_argument_group("DFlash2 (conv also for LiliCorr with --lilicorr-conv)")
    g.add_argument("--selector-rank", type=int)
    g.add_argument("--selector-top-k", type=int)
    g.add_argument("--conv-kernel", type=int)
    g.add_argument("--conv-group", type=int)
    g = parser.add_argument_group("DSpark")
    g.add_argument("--markov-rank", type=int)
    g.add_argument("--joint", action="store_true", help="RNN joint head (seed only)")
    g.add_argument("--sample-from-anchor", choices=("true", "false"),
                   help="dflash.sample_from_anchor (absent means true)")
    g = parser.add_argument_group("authors' formats only (--format hf): settings b11739 cannot honour, "
                                  "which the converter refuses")
    g.add_argument("--yarn-beta-fast", type=float, help="rope_parameters.beta_fast (default: unset, 32)")
    g.add_argument("--yarn-beta-slow", type=float, help="rope_parameters.beta_slow (default: unset, 1)")
    g.add_argument("--yarn-attn-factor", type=float, help="rope_parameters.attention_factor (default: unset)")
    g.add_argument("--conf-markov", choices=("true", "false"), default=None,
                   help="DSpark confidence_head_with_markov (default true)")
    g.add_argument("--attention-bias", action="store_true", help="attention_bias: q/k/v/o biases (default off)")
    g = parser.add_argument_group("LiliCorr")
    g.add_argument("--lilicorr-hidden", type=int)
    g.add_argument("--lilicorr-top-k", type=int)
    g.add_argument("--lilicorr-heads", type=int)
    g.add_argument("--lilicorr-layers", type=int)
    g.add_argument("--lilicorr-eps", type=float)
    g.add_argument("--lilicorr-logit-scale", type=float)
    g.add_argument("--lilicorr-factor", type=int)
    g.add_argument("--lilicorr-mlp", type=int)
    g.add_argument("--lilicorr-conv", action="store_true")


# argparse dest -> make_model option, for the options passed only when given
_ARG_OPTIONS = {
    "head_dim": "head_dim", "n_rot": "n_rot", "swa_window": "swa_window", "swa_pattern": "swa_pattern",
    "mrope_sections": "mrope_sections", "shared_kv": "shared_kv", "sinks": "sinks",
    "weight_scales": "weight_scales", "post_norms": "post_norms", "out_scale": "out_scale",
    "rope_freqs": "rope_freqs", "rope_scaling": "rope_scaling", "rope_scaling_factor": "rope_scaling_factor",
    "rope_orig_ctx": "rope_orig_ctx", "rope_attn_factor": "rope_attn_factor",
    "attention_scale": "attention_scale", "value_scale": "value_scale",
    "embedding_scale": "embedding_scale", "logit_scale": "logit_scale", "final_softcap": "final_softcap",
    "causal": "causal", "hidden_act": "hidden_act", "d2t_vocab": "d2t_vocab",
    "selector_rank": "selector_rank", "selector_top_k": "selector_top_k",
    "conv_kernel": "conv_kernel_size", "conv_group": "conv_group_size",
    "markov_rank": "markov_rank", "joint": "joint", "sample_from_anchor": "sample_from_anchor",
    "lilicorr_hidden": "lilicorr_hidden", "lilicorr_top_k": "lilicorr_top_k",
    "lilicorr_heads": "lilicorr_heads", "lilicorr_layers": "lilicorr_layers",
    "lilicorr_eps": "lilicorr_eps", "lilicorr_logit_scale": "lilicorr_logit_scale",
    "lilicorr_factor": "lilicorr_factor", "lilicorr_mlp": "lilicorr_mlp", "lilicorr_conv": "lilicorr_conv",
}


_HF_ONLY = ("yarn_beta_fast", "yarn_beta_slow", "yarn_attn_factor", "conf_markov", "attention_bias")


DIM_DEFAULTS = dict(n_embd=64, n_layer=2, n_head=4, n_head_kv=None, n_ff=128, n_vocab=256, block_size=4,
                    target_layers=[1, 2])


def make_model_from_args(args: argparse.Namespace, progress=None, path=None) -> dict:
    options = {}
    for dest, opt in _ARG_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is None or value is False:  # not given: keep make_model's default
            continue
        if opt == "swa_pattern":
            value = [bool(v) for v in value]
        elif opt == "sample_from_anchor":
            value = value == "true"
        options[opt] = value
    dims = dict(DIM_DEFAULTS, **(PRESETS[args.preset] if args.preset else {}))
    given = dict(n_embd=args.n_embd, n_layer=args.layers, n_head=args.heads, n_head_kv=args.heads_kv,
                 n_ff=args.n_ff, n_vocab=args.vocab, block_size=args.block_size, target_layers=args.target_layers)
    dims.update({k: v for k, v in given.items() if v is not None})
    return make_model(
        path if path is not None else args.out, args.variant, args.backbone, wtype=args.wtype, seed=args.seed,
        context_length=args.context_length, rope_freq_base=args.rope_freq_base, rms_eps=args.rms_eps,
        conf=args.conf, progress=progress, **dims, **options)


def _cmd_make_model(args) -> int:
    if args.format == "hf":
        from .authors import make_hf_from_args
        return make_hf_from_args(args)
    from .. import progress
    from ..errors import GGUFModelError
    from ..runtime.model import load
    from ..staging import staged_file
    hf_only = [d for d in _HF_ONLY if getattr(args, d, None) not in (None, False)]
    if hf_only:
        raise ValueError(f"--{hf_only[0].replace('_', '-')} is a setting of the authors' formats (--format hf); "
                         "a GGUF draft has no such key b11739 reads")
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"{out}: is a folder; make-model writes a GGUF file (or a checkpoint folder with --format hf)")
    if out.exists() and not args.force and not _is_gguf(out):
        raise ValueError(f"{out}: exists and is not a GGUF file; pass --force to replace it")
    # written under a temporary name and renamed once complete and loadable: an interrupted or
    # refused run leaves OUT as it was
    with progress.task(f"make-model {args.out}") as p, staged_file(out) as tmp:
        info = make_model_from_args(args, progress=p.update, path=tmp)
        # a file graphgen itself would refuse is no draft: say why, and leave nothing behind
        p.update("checking that graphgen loads it")
        try:
            load(tmp).close()
        except GGUFModelError as e:
            raise ValueError("these options make a draft graphgen refuses, nothing written: "
                             + str(e).replace(str(tmp), str(out))) from None
    print(f"wrote {out}: variant {info.get('variant')}, backbone {info.get('backbone')}, "
          f"{info.get('n_tensors', '?')} tensors")
    return 0


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _cmd_info(args) -> int:
    import dataclasses

    from ..models.loader import BaseHParams
    from ..ops.runtime import activate
    from ..runtime.model import load
    if Path(args.model).is_dir():
        return _info_checkpoint(args)
    if not Path(args.model).exists():
        raise ValueError(f"{args.model}: no such file or folder")
    m = load(args.model)
    hp = m.hparams
    rt = activate()
    # the fields every draft has first, then those its heads and backbones declare
    base = [f.name for f in dataclasses.fields(BaseHParams)]
    fields = {k: getattr(hp, k) for k in base + [k for k in vars(hp) if k not in base]}
    if args.json:
        print(json.dumps({"model": str(m.path), "ggml": {"version": rt.version, "dir": str(rt.lib_dir),
                                                          "origin": rt.origin},
                          "variant": m.variant, "backbone": m.backbone, "hparams": fields,
                          "rope_type": "mrope" if hp.rope_type == 8 else "neox",
                          "weight_bytes": m.weight_bytes,
                          "tensors": [{"name": n, "type": t, "shape": sh} for n, t, sh in m.tensor_table()]},
                         indent=1))
        return 0
    print(f"model     {m.path}")
    print(f"ggml      {rt.version} ({rt.lib_dir}, {rt.origin})")
    print(f"variant   {m.variant}")
    print(f"backbone  {m.backbone}")
    print("hparams")
    for k, v in fields.items():
        if v not in (0, 0.0, [], {}, None) or k in ("causal_attn",):
            print(f"  {k:26s} {v}")
    print(f"  {'rope_type':26s} {'mrope' if hp.rope_type == 8 else 'neox'}")
    print(f"tensors ({len(m.tensor_table())}, {m.weight_bytes / 1e6:.2f} MB)")
    for name, typ, shape in m.tensor_table():
        print(f"  {name:40s} {typ:5s} {shape}")
    return 0


def _info_checkpoint(args) -> int:
    """A draft checkpoint in its authors' format: what the folder holds, read from its headers."""
    from ..authors.checkpoint import CLASSES, label
    from ..authors.folder import inspect
    ck = inspect(args.model)
    what = label(ck.authors, ck.variant) if (ck.authors, ck.variant) in CLASSES else \
        f"{ck.config.get('architectures', ['?'])[0]} (DSpark; llama.cpp's converter reads it, no authors' class on PyPI)"
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "block_size", "draft_vocab_size", "mask_token_id")
    layer = ck.config.get("transformer_layer_config") or {}
    dc = ck.config.get("dflash_config") or {}
    config = {k: v for k in keys for v in [dc.get(k, ck.config.get(k, layer.get(k)))] if v is not None}
    if args.json:
        print(json.dumps({"checkpoint": str(ck.path), "format": what, "authors": ck.authors, "variant": ck.variant,
                          "config": config, "weights": [str(f) for f in ck.weights],
                          "tensors": [{"name": n, "shape": sh} for n, sh in ck.tensors.items()]}, indent=1))
        return 0
    print(f"checkpoint {ck.path}")
    print(f"format     {what}")
    print("config")
    for k, v in config.items():
        print(f"  {k:26s} {v}")
    print(f"tensors ({len(ck.tensors)}, in {', '.join(f.name for f in ck.weights)})")
    for name, shape in ck.tensors.items():
        print(f"  {name:40s} {shape}")
    print(f"graphgen convert {ck.path} DRAFT.gguf makes the GGUF llama.cpp runs")
    return 0


def register(sub) -> None:
    p = sub.add_parser("make-model", help="write a tiny random-weight draft GGUF")
    add_make_model_args(p)
    p.set_defaults(fn=_cmd_make_model)

    p = sub.add_parser("info", help="print variant, backbone, hparams and tensors of a draft")
    p.add_argument("model", metavar="MODEL", help="a draft GGUF file, or a checkpoint folder in its authors' format")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p.set_defaults(fn=_cmd_info)
