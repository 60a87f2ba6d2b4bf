"""`graphgen draft`: speculative rounds of a DFlash family draft against a simulated verifier."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from ..errors import GraphgenError
from ..cachetypes import KV_TYPES
from .kvtypes import add_kv_type_flags, kv_types


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise GraphgenError(f"expected comma-separated integers, got {text!r}") from None


def _tokens_arg(text: str, what: str) -> list[int]:
    """Comma-separated token ids, or @FILE holding them (commas or whitespace)."""
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such {what} file")
        text = ",".join(path.read_text().split())
    toks = _int_list(text)
    if not toks:
        raise GraphgenError(f"{what}: no tokens given")
    return toks


def _features(args, n_rows: int, width: int, seq: int = 0):
    import numpy as np
    if args.features is None:
        return np.random.default_rng((args.features_seed or 0) + seq).standard_normal((n_rows, width), dtype=np.float32)
    path = Path(args.features)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such features file")
    try:
        feats = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise GraphgenError(f"{path}: not a numpy .npy array ({e})") from None
    if feats.ndim != 2 or feats.shape[1] != width:
        raise GraphgenError(f"{path}: features must be [n_positions, {width}] (len(target_layers) * n_embd), "
                            f"got shape {list(feats.shape)}")
    if not np.isfinite(feats).all():
        raise GraphgenError(f"{path}: the features contain NaN or Inf")
    return feats.astype(np.float32, copy=False)


def _cmd_draft(args) -> int:
    from ..speculative.drafters import LLAMA_DEFAULT_SEED, DraftParams
    from ..speculative.loop import SimulatedVerifier, open_drafter, run_speculative

    # --verbose: the drivers' info log (upstream's LOG_INF lines), with a target or without
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    lg = logging.getLogger("graphgen.drafters")
    lg.addHandler(handler)
    lg.setLevel(logging.INFO if args.verbose else logging.WARNING)
    try:
        if args.model_draft is not None:
            from .generate import run_target
            return run_target(args)
        return _run(args, DraftParams, SimulatedVerifier, open_drafter, run_speculative, LLAMA_DEFAULT_SEED)
    finally:
        lg.removeHandler(handler)


def _run(args, DraftParams, SimulatedVerifier, open_drafter, run_speculative, default_seed) -> int:
    from ..speculative.loop import check_block_fits
    from .llamaflags import backend_of, check_spec_flags, model_path, resolve_fa
    model_path(args)
    args.backend = backend_of(args.backend)
    if not Path(args.model).is_file():
        raise FileNotFoundError(f"{args.model}: no such model file")
    if args.prompt_text or args.file:
        raise GraphgenError("-p / -f take text, which needs a target's vocabulary: give the target with -m and the "
                            "draft with -md; without a target, give --prompt-tokens")
    if args.prompt_tokens is None:
        raise GraphgenError("no prompt: give --prompt-tokens (a draft alone), or -m TARGET -md DRAFT with -p TEXT")
    for flag, on in (("--no-baseline", args.no_baseline), ("--llama-loop", args.llama_loop),
                     ("--loop-edges simple", args.loop_edges == "simple")):
        if on:
            raise GraphgenError(f"{flag} applies to a run with a target (-m TARGET -md DRAFT)")
    for flag, v in (("-ctkd", args.type_k_draft), ("-ctvd", args.type_v_draft), ("-devd", args.device_draft)):
        if v is not None:
            raise GraphgenError(f"{flag} applies to a run with a target (-m TARGET -md DRAFT); with a draft alone, "
                                "-ctk, -ctv and -dev set its cache types and device")
    prompt = _tokens_arg(args.prompt_tokens, "--prompt-tokens")
    check_spec_flags(args)
    n_seq = args.n_parallel or 1
    flash_attn = bool(resolve_fa(args.flash_attn or "auto"))
    n_ubatch = args.n_ubatch or 64
    if args.n_batch is not None:
        n_ubatch = min(n_ubatch, args.n_batch)  # llama.cpp caps the micro-batch at the batch
    target = _tokens_arg(args.target_tokens, "--target-tokens") if args.target_tokens else None
    params = DraftParams(n_max=args.spec_draft_n_max, n_min=args.spec_draft_n_min, p_min=args.spec_draft_p_min,
                         probabilistic=args.spec_draft_sampling == "probabilistic")
    if args.n_ctx == 0:
        raise GraphgenError("-c 0 takes the target's trained context, and a simulated run has no target: give -c N")
    if args.n_predict == -1 and not target:
        raise GraphgenError("-n -1 generates until the text ends, which a simulated verifier never does: give "
                            "-n N, or --target-tokens (the run then ends with them)")
    n_predict = args.n_predict if args.n_predict > 0 else len(target)
    # every sequence keeps its own rows in the one cache
    n_ctx = args.n_ctx or n_seq * max(256, len(prompt) + n_predict + 2 * max(args.spec_draft_n_max or 0, 64) + 16)
    from .. import progress
    with progress.task(f"draft {Path(args.model).name}") as task:
        task.update("loading the draft's weights")
        drafter = open_drafter(args.model, args.spec_type, params, n_ctx=n_ctx, n_ubatch=n_ubatch,
                               flash_attn=flash_attn, n_threads=args.threads or 1, n_seq=n_seq,
                               **dict(zip(("type_k", "type_v"), kv_types(args, "f16", "f16", flash_attn))),
                               backend=args.backend, engine=args.engine)
    engine_detail = _engine_detail(args.engine, drafter.session)
    try:
        check_block_fits(drafter, args.n_batch)
        hp = drafter.session.hparams
        need = len(prompt) + n_predict + drafter.n_max - 1
        # one prompt for every sequence (-np), each with features of its own unless a file gives them
        seqs = [(prompt, _features(args, need, hp.n_embd_inp_enc, s)) for s in range(n_seq)]
        accept = _int_list("-1" if args.accept is None else args.accept)
        if not accept or any(a < -1 for a in accept):
            raise GraphgenError(f"--accept takes counts >= 0, or -1 for the whole draft; got {args.accept!r}")
        verifier = SimulatedVerifier(accept=accept, target_tokens=target, n_vocab=hp.n_vocab,
                                     mask_token=drafter.mask_token_id, seed=args.verifier_seed or 0)
        from .. import progress as prog
        show = prog.lines_wanted()
        if show:
            print(f"draft {args.model}: {drafter.type} (head {drafter.model.variant}), block_size "
                  f"{drafter.block_size}, n_max {drafter.n_max}, n_min {drafter.params.n_min}, p_min "
                  f"{drafter.params.p_min:g}" + (", probabilistic" if params.probabilistic else ""), file=sys.stderr)

        def progress(r):
            if not show:
                return
            extra = ""
            if r.q is not None:
                extra = " q=[" + ", ".join(f"{max(p for _, _, p in row):.2f}" for row in r.q) + "]"
            print(f"[round {r.round + 1}] seq {r.seq} pos {r.pos0}: id_last {r.id_last}, drafted {len(r.draft)} "
                  f"{r.draft}, accepted {r.n_accepted}, next {r.bonus if r.bonus >= 0 else '-'} "
                  f"({1e3 * (r.t_draft + r.t_process):.1f} ms){extra}", file=sys.stderr)

        seed = default_seed if args.seed is None else args.seed
        res = run_speculative(drafter, seqs, n_predict=n_predict, verifier=verifier,
                              temp=1.0 if args.temp is None else args.temp, seed=seed, progress=progress)
    finally:
        drafter.session.close()
    s = res.summary()
    s["engine"] = args.engine
    s["engine_detail"] = engine_detail
    s["verifier"] = {"simulated": True, "accepts": _verifier_accepts(args, accept)}
    stop = res.stop_reasons.get(0)
    generated = len(res.tokens[0]) - res.n_prompt[0]
    if stop == "target_tokens":
        why = f"--target-tokens ran out after {generated} of --n-predict {n_predict} tokens"
    else:
        why = f"--n-predict {n_predict} reached"
    if args.json:
        s["tokens"] = res.tokens[0]
        if n_seq > 1:
            s["tokens_per_sequence"] = [res.tokens[q] for q in range(n_seq)]
        print(json.dumps(s, indent=1))
        return 0
    print(f"engine           {engine_detail}")
    print(f"verifier         simulated (no target model runs): {s['verifier']['accepts']}")
    print(f"spec type        {s['spec_type']} (draft head {s['variant']}, n_max {s['n_max']})")
    print(f"blocks           {s['blocks']}")
    print(f"drafted tokens   {s['drafted_tokens']} ({s['drafted_tokens_per_s']:.1f} tokens/s of drafting wall time)")
    print(f"accepted tokens  {s['accepted_tokens']} ({100 * s['acceptance_rate']:.1f}% of drafted, by the "
          "simulated verifier)")
    print(f"mean acceptance  {s['mean_acceptance_length']:.2f} tokens per round (1 + accepted / drafts, over "
          f"{s['drafts']} drafts)")
    print(f"generated        {s['generated_tokens']} tokens")
    print(f"time per round   {s['ms_per_round']:.2f} ms (draft {s['ms_draft_per_round']:.2f} ms, "
          f"inject {s['ms_process_per_round']:.2f} ms); prefill {s['ms_prefill']:.2f} ms, total {s['ms_total']:.1f} ms")
    print(f"stopped          {why}")
    for q in range(n_seq):
        label = "tokens" if n_seq == 1 else f"tokens seq {q}"
        print(f"{label:<17}{','.join(str(t) for t in res.tokens[q])}")
    return 0


def _engine_detail(engine: str, session) -> str:
    """Which engine ran the drafter's batches, and on what."""
    if engine == "llama.cpp":
        from ..libload import reference_label
        return f"{reference_label()} (CPU, in a child process)"
    from .. import __version__
    return f"graphgen {__version__} ({session.backend_name})"


def _verifier_accepts(args, accept: list[int]) -> str:
    """What the simulated verifier accepts, in words."""
    if args.target_tokens:
        return "the longest draft prefix matching --target-tokens"
    if accept == [-1]:
        return "every drafted token (--accept -1)"
    return f"{','.join(map(str, accept))} drafted tokens per round, cycled (--accept; -1: all)"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "draft", help="speculative decoding with a DFlash family draft: a real target verifying (-m TARGET -md DRAFT), "
                      "or a simulated verifier (-m DRAFT)",
        description="With -m TARGET -md DRAFT: the target (llama.cpp b11739) prefills the prompt and hands the draft "
                    "its layer inputs; per round the draft drafts a block, the target verifies it in one batch and "
                    "the accepted text streams to stdout. With -m DRAFT alone: a simulated verifier accepts a given "
                    "prefix of each draft, on random or given target features.")
    from .llamaflags import add_context_flags, add_device, add_model, add_pair_flags, add_spec_flags
    add_model(p, "the target GGUF with -md (a known name: smollm2), else the draft GGUF")
    add_pair_flags(p, draft_help="the draft GGUF (a folder holding draft.gguf, or a shipped draft's name such as "
                   "smollm2-dspark); -m is then the target, which verifies every draft",
                   prompt_help="prompt text, tokenized by the target (with -md); repeated: sequences of -np take them "
                               "in turn",
                   file_help="read the prompt text from FILE (with -md)")
    p.add_argument("--no-baseline", action="store_true",
                   help="with -md: skip the run of the target alone (the speed ratio and the greedy check)")
    p.add_argument("--loop-edges", choices=("server", "simple"), default="server",
                   help="with -md: whose loop edges to run: llama-server's (the first round drafts from the target's "
                        "first token, drafts are cut to the tokens left, -n is exact) or llama-speculative-simple's "
                        "(the prompt's last token drafts the first round, a run stops once past -n) (default server)")
    p.add_argument("--llama-loop", action="store_true",
                   help="with -md: also run llama.cpp's own loop (b11549's common/speculative.cpp and common_sampler, "
                        "tools/build_llama.sh, built once) with the same settings, the target of both on b11549's "
                        "libllama, and compare them round for round; exit 1 where they part")
    p.add_argument("--spec-type", default=None,
                   help="draft-dflash (any DFlash family head), draft-dflash2, draft-dspark or draft-lilicorr "
                        "(comma-separated list as upstream; default: detected from the GGUF)")
    p.add_argument("--prompt-tokens", help="without a target: prompt token ids, comma-separated, or @FILE")
    p.add_argument("--features", help="a .npy of [n_positions, len(target_layers) * n_embd] target features, "
                                      "one row per position (default: random, --features-seed)")
    p.add_argument("--features-seed", type=int, default=None,
                   help="seed of the random features; sequence s of -np uses seed + s (default 0)")
    p.add_argument("-n", "--n-predict", "--predict", dest="n_predict", type=int, default=32, metavar="N",
                   help="tokens to generate, as llama.cpp's -n (default 32)")
    p.add_argument("--accept", default=None,
                   help="draft tokens the verifier accepts per round, comma-separated values cycle; -1 accepts "
                        "the whole draft (default)")
    p.add_argument("--target-tokens", help="instead of --accept: the target's continuation (ids or @FILE); the "
                                           "verifier accepts the longest matching draft prefix")
    p.add_argument("--verifier-seed", type=int, default=None,
                   help="seed of the simulated target's own tokens (default 0)")
    add_spec_flags(p)
    p.add_argument("--spec-draft-sampling", choices=("greedy", "probabilistic"), default="greedy",
                   help="probabilistic: DFlash2 samples its lattice walk at --temp and keeps q (default greedy)")
    p.add_argument("--temp", type=float, default=None,
                   help="the target's temperature: with a target, its sampling (0: greedy; default 0.8, as llama.cpp); "
                        "without, DFlash2's probabilistic drafting (default 1.0)")
    p.add_argument("--seed", type=int, default=None,
                   help="the target's seed; -1 draws one, as llama.cpp's LLAMA_DEFAULT_SEED (default -1)")
    add_context_flags(p, scenario=False, threads_default="1", fa_default="auto",
                      ctx_help="default: with a target 4096, as llama.cpp, 0 taking the target's trained context; "
                               "without, what the run needs")
    add_kv_type_flags(p, default="f16", fa_hint="-fa on")
    add_device(p)
    g = p.add_argument_group("with a target (-md), as llama.cpp's speculative flags: -ctk/-ctv are then the target's "
                             "cache types, these the draft's")
    g.add_argument("-ctkd", "--cache-type-k-draft", dest="type_k_draft", choices=KV_TYPES, default=None, metavar="TYPE",
                   help="the draft's K cache type (default f16)")
    g.add_argument("-ctvd", "--cache-type-v-draft", dest="type_v_draft", choices=KV_TYPES, default=None, metavar="TYPE",
                   help="the draft's V cache type; a quantized V needs -fa on (default f16)")
    g.add_argument("-devd", "--device-draft", dest="device_draft", metavar="DEV", default=None,
                   help="where graphgen computes the draft (CPU, Vulkan0, CUDA0, ...; default CPU); the target runs "
                        "on b11739's CPU build")
    p.add_argument("--engine", choices=("graphgen", "llama.cpp"), default="graphgen",
                   help="where the drivers' batches run: graphgen's graphs, or llama.cpp b11739 (CPU, in a child "
                        "process) for the same drivers on the reference's graphs (default graphgen)")
    p.add_argument("--json", action="store_true",
                   help="print the summary, the tokens and (with a target) every round and the target alone's "
                        "tokens as JSON")
    p.add_argument("--verbose", action="store_true",
                   help="every round on stderr (position, drafted tokens, the target's tokens, accepted count) and "
                        "the drivers' info log (upstream's LOG_INF lines)")
    p.set_defaults(fn=_cmd_draft)
    from .mmapflag import add_mmap_flag
    add_mmap_flag(p)  # --no-mmap
