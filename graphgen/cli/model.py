"""`graphgen make-model` and `graphgen info`."""

from __future__ import annotations

import argparse
import json
import sys
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
    parser.add_argument("--target-layers", type=_int_list, metavar="1,2",
                        help="layer-input indices, the authors' target_layer_ids + 1 (default 1,2; with --target, "
                             "the authors' default spread over its layers)")
    parser.add_argument("--target", metavar="TARGET",
                        help="shape the draft for this target GGUF (or a known target: smollm2): its n_embd, "
                             "vocabulary and tokenizer, no token embeddings or lm head of its own (it borrows the "
                             "target's, as a converted draft does) (default: none, a self-contained draft)")
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
                   "default 3/4 of --vocab, as speculators' DSpark drafts ship a reduced head; equal to --vocab: a "
                   "full-vocabulary DSpark, which borrows the target's head)")
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
    target = getattr(args, "target", None)
    if target is not None:
        # the target decides width, vocabulary and (unless given) the layers: a preset's do not apply
        target = _check_target_args(args, target)
        for k in ("n_embd", "n_vocab", "target_layers"):
            dims.pop(k, None)
        options["target"] = target
    dims.update({k: v for k, v in given.items() if v is not None and not (target and k in ("n_embd", "n_vocab"))})
    return make_model(
        path if path is not None else args.out, args.variant, args.backbone, wtype=args.wtype, seed=args.seed,
        context_length=args.context_length, rope_freq_base=args.rope_freq_base, rms_eps=args.rms_eps,
        conf=args.conf, progress=progress, **dims, **options)


def _check_target_args(args, target) -> Path:
    """The target's path, once the flags that size the draft agree with it (ValueError otherwise)."""
    from ..speculative.pair import layers_problem, target_info
    from ..speculative.targets import resolve
    path = resolve(target)
    info = target_info(path)
    for flag, given, own, key in (("--n-embd", args.n_embd, info.n_embd, f"{info.arch}.embedding_length"),
                                  ("--vocab", args.vocab, info.n_vocab, "tokenizer.ggml.tokens")):
        if given is not None and given != own:
            raise ValueError(f"{flag} {given} conflicts with the target {path.name}, whose {key} gives {own}; a "
                             f"draft for a target takes it from the target: leave {flag} out")
    if args.target_layers is not None:
        why = layers_problem(args.target_layers, info.n_layer)
        if why:
            raise ValueError(f"--target-layers for the target {path.name}: {why}")
    return path


def _cmd_make_model(args) -> int:
    if args.target is not None and args.format == "hf":
        raise ValueError("--target shapes a GGUF draft; --format hf writes the authors' checkpoint with a small "
                         "target folder of its own")
    if args.format == "hf":
        from .authors import make_hf_from_args
        return make_hf_from_args(args)
    from .. import progress
    from ..errors import GGUFModelError
    from ..runtime.model import load
    from ..staging import staged_file
    from ..speculative.targets import resolve
    # the draft borrows the target's embeddings and lm head: graphgen loads it with them
    target = resolve(args.target) if args.target is not None else None
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
            load(tmp, target=target).close()
        except GGUFModelError as e:
            raise ValueError("these options make a draft graphgen refuses, nothing written: "
                             + str(e).replace(str(tmp), str(out))) from None
    extra = ""
    if target is not None:
        from ..speculative.pair import LENT
        lent = [n for n in LENT if n not in info["tensors"]]
        extra = (f"; for the target {Path(target).name}: target layers "
                 f"{','.join(map(str, info['keys']['dflash.target_layers']))}, borrows "
                 f"{', '.join(lent) or 'nothing'}")
    print(f"wrote {out}: variant {info.get('variant')}, backbone {info.get('backbone')}, "
          f"{info.get('n_tensors', '?')} tensors{extra}")
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
    from ..speculative.targets import draft_label, resolve_draft
    if args.model is not None and args.model_draft is not None and \
            _draft_or_given(args.model).resolve() != _draft_or_given(args.model_draft).resolve():
        raise ValueError(f"two drafts given ({args.model} and -md {args.model_draft}): give one")
    given = args.model if args.model is not None else args.model_draft
    if args.model_flag is not None:
        return _info_target(args) if given is None else _info_pair(args, given)
    if given is None:
        raise ValueError("nothing to show: give a draft (MODEL or -md DRAFT), a target (-m TARGET), or both")
    folder = Path(given)
    # MODEL may be the authors' checkpoint folder (a shipped draft's folder is one too); -md is
    # llama.cpp's draft GGUF, as is a folder holding only draft.gguf
    if folder.is_dir() and args.model_draft is None and \
            ((folder / "config.json").exists() or not (folder / "draft.gguf").is_file()):
        args.model = given
        return _info_checkpoint(args)
    if args.model_draft is None and not folder.exists() and _draft_or_given(given) == folder:
        raise ValueError(f"{given}: no such file or folder")  # as convert and dump say of a checkpoint
    m = load(resolve_draft(given))
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
                          "weight_bytes": m.weight_bytes, "borrows": list(m.borrows),
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
    if m.borrows:
        print(f"borrows   {', '.join(m.borrows)} from its target (llama.cpp's ctx_other): run it as "
              f"-m TARGET.gguf -md {draft_label(given)}")
    return 0


def _draft_or_given(value) -> Path:
    """-md's value as the draft GGUF it names (a file, a folder holding draft.gguf, a shipped draft's
    name); one that names none as the path it is, for the check that reads it to name."""
    from ..speculative.targets import resolve_draft
    try:
        return resolve_draft(value)
    except FileNotFoundError:
        return Path(value)


def relabel_pair(problems: list[str], target, draft, label: str) -> list[str]:
    """The pair check's lines naming the draft as the user knows it: a shipped draft's file is
    draft.gguf, which names none of them."""
    from ..speculative.pair import pair_label
    said, shown = pair_label(target, draft), pair_label(target, Path(label))
    return [shown + p[len(said):] if p.startswith(said) else p for p in problems]


def _target_fields(t) -> dict:
    return {"path": str(t.path), "arch": t.arch, "n_layer": t.n_layer, "n_embd": t.n_embd, "n_vocab": t.n_vocab,
            "publishes_layer_inputs": t.publishes_layer_inputs}


def _print_target(t) -> None:
    print(f"target    {t.path}")
    print(f"  arch {t.arch}, n_layer {t.n_layer}, n_embd {t.n_embd}, vocab {t.n_vocab}")
    if t.publishes_layer_inputs:
        print(f"  publishes layer inputs 0..{t.n_layer - 1} in b11739 (a draft's target layers, the authors' "
              f"ids -1..{t.n_layer - 2})")
    else:
        print("  publishes no layer inputs in b11739: a draft's first decode on it aborts (\"layer input tensor "
              "is null\")")


def _info_target(args) -> int:
    """-m alone: what a draft needs of the target."""
    from ..speculative.pair import target_info
    from ..speculative.targets import resolve
    t = target_info(resolve(args.model_flag))
    if args.json:
        print(json.dumps({"target": _target_fields(t)}, indent=1))
    else:
        _print_target(t)
    return 0


def _info_pair(args, given) -> int:
    """-m TARGET -md DRAFT: what the pair is, then `pair: OK` or each problem as an error line (exit 2)."""
    from ..errors import GGUFModelError
    from ..speculative.pair import check_pair, draft_info, pair_label, target_info
    from ..runtime.model import load
    from ..speculative.targets import draft_label, resolve
    target, draft = resolve(args.model_flag), _draft_or_given(given)
    label = draft_label(given) if draft.is_file() else str(given)
    problems = check_pair(target, draft)
    t = d = None
    try:
        t = target_info(target)
        d = draft_info(draft)
    except GGUFModelError:
        pass  # check_pair has said why
    if not problems:
        # the pair fits; the draft itself must still be one graphgen's loader (hence b11739's) accepts
        try:
            load(draft, target=target).close()
        except GGUFModelError as e:
            problems.append(f"{pair_label(target, draft)}: the draft: {e}")
    problems = relabel_pair(problems, target, draft, label)
    if args.json:
        out = {"ok": not problems, "problems": problems, "target": _target_fields(t) if t else None, "draft": None}
        if d is not None:
            out["draft"] = {"path": str(d.path), "head": d.head, "n_embd": d.n_embd, "n_layer": d.n_layer,
                            "block_size": d.block_size, "target_layers": d.target_layers,
                            "target_layer_ids": [il - 1 for il in d.target_layers], "fc_width": d.fc_width,
                            "n_vocab": d.n_vocab, "n_vocab_head": d.n_vocab_head, "borrows": d.borrows}
        print(json.dumps(out, indent=1))
    else:
        if t is not None:
            _print_target(t)
        if d is not None:
            print(f"draft     {d.path}")
            print(f"  head {d.head}, n_layer {d.n_layer}, n_embd {d.n_embd}, block size {d.block_size}, vocab "
                  f"{d.n_vocab}" + (f" (a reduced lm head of {d.n_vocab_head} rows, d2t)" if d.n_vocab_head else ""))
            print(f"  target layers {','.join(map(str, d.target_layers))} (layer-input indices, dflash.target_layers); "
                  f"the authors' ids {','.join(str(il - 1) for il in d.target_layers)}")
            n_embd = t.n_embd if t is not None else "n_embd"
            print(f"  fc width {d.fc_width} (takes {len(d.target_layers)} target layers × {n_embd})")
            print(f"  borrows {', '.join(d.borrows)} from the target (llama.cpp's ctx_other)" if d.borrows else
                  "  borrows nothing: has its own token embeddings and lm head")
        if not problems:
            print("pair: OK")
    for line in problems:
        print(f"graphgen: error: {line}", file=sys.stderr)
    return 0 if not problems else 2


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

    p = sub.add_parser("info", help="print variant, backbone, hparams and tensors of a draft; with -m TARGET "
                                    "-md DRAFT, check that the two run together")
    p.add_argument("model", metavar="MODEL", nargs="?", default=None,
                   help="a draft GGUF file, a shipped draft's name (smollm2-dflash), or a checkpoint folder in its "
                        "authors' format (or -md)")
    p.add_argument("-m", "--model", dest="model_flag", metavar="TARGET", default=None,
                   help="the target model GGUF, as llama.cpp's -m (or a known target: smollm2); alone, what a "
                        "draft needs of it; with -md, check the pair: exit 0 and 'pair: OK', or exit 2 and one "
                        "error line per problem")
    p.add_argument("-md", "--model-draft", dest="model_draft", metavar="DRAFT", default=None,
                   help="the draft GGUF, as llama.cpp's -md (instead of MODEL): a file, a folder holding draft.gguf, "
                        "or a shipped draft's name (smollm2-dflash)")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p.set_defaults(fn=_cmd_info)
