"""`graphgen accept -m TARGET -md DRAFT`: one draft's acceptance in each engine's speculative loop.

The target runs in b11739 for the draft in b11739 beside it (llama.cpp) and in graphgen; the
authors' own loop (--engines ...,authors) runs it in transformers, with z-lab's dflash_generate for
a z-lab DFlash or DFlash2 checkpoint and graphgen.accept.speculators_loop for a speculators
DSpark. Prints a table per engine (the field's mean acceptance length, 1 + accepted / drafts; the
acceptance per draft position; prompt and generation tokens/s apart) and whether b11739's and graphgen's
drafting agreed round for round; exit 1 when they did not, naming the first prompt, round and draft
position where they part. With llama.cpp and authors among the engines (greedy), it also says which
stage makes the authors' loop differ (graphgen.accept.attribute) and exits 1 when more than the
quantized target's numerics do, or the authors' mean acceptance length is outside its band.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import GraphgenError
from ..speculative.drafters import draw_seed
from .generate import plural as _plural
from .llamaflags import count_arg


def _engines(text: str) -> list[str]:
    from ..accept.compare import AUTHORS, ENGINES, LLAMA_LOOP
    known = ENGINES + (LLAMA_LOOP, AUTHORS)
    names = [t for t in text.replace(" ", "").split(",") if t]
    if not names:
        raise GraphgenError("--engines: no engine given")
    for n in names:
        if n not in known:
            raise GraphgenError(f"--engines {text}: unknown engine {n!r} (the engines are {', '.join(known)})")
    if len(set(names)) != len(names):
        raise GraphgenError(f"--engines {text}: an engine is named twice")
    return names


def _prompts(args) -> list[str] | None:
    from .llamaflags import read_prompt_file
    texts = list(args.prompt_text or [])
    if args.file:
        # one prompt a line, as llama.cpp's parallel example reads its -f: a held-out set is many short texts
        lines = [line for line in read_prompt_file(args.file).splitlines() if line.strip()]
        if not lines:
            raise GraphgenError(f"{args.file}: the prompt file holds no text")
        texts += lines
    return texts or None


def _context_flags(args):
    """llama.cpp's context flags as the engines take them (accept.compare.ContextFlags)."""
    from ..accept.compare import ContextFlags
    from ..cachetypes import KV_QUANTIZED
    fa = args.flash_attn or "auto"
    types = {"type_k": args.type_k or "f16", "type_v": args.type_v or "f16",
             "type_k_draft": args.type_k_draft or "f16", "type_v_draft": args.type_v_draft or "f16"}
    if fa == "off":
        for k, flag in (("type_v", "-ctv"), ("type_v_draft", "-ctvd")):
            if types[k] in KV_QUANTIZED:
                raise GraphgenError(f"{flag} {types[k]}: a quantized V cache requires flash attention (-fa on)")
    return ContextFlags(flash_attn=fa, n_ctx=args.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_ubatch, **types)


def _cmd_accept(args) -> int:
    from ..accept.compare import AUTHORS, LLAMA_LOOP, acceptance_svg, first_divergence, run_engines
    from ..speculative.pair import draft_info
    from ..staging import check_output, is_svg
    from ..speculative.targets import draft_label, resolve, resolve_draft

    from .llamaflags import check_spec_flags, model_path
    model_path(args)
    if args.model_draft is None:
        raise GraphgenError("no draft: give the draft GGUF with -md FILE")
    engines = _engines(args.engines)
    check_spec_flags(args)
    if args.svg is not None:
        check_output("--svg", args.svg, is_svg, "an SVG file", args.force)  # before the run, not after it
    seed = draw_seed(args.seed)  # -1 (check_spec_flags made it LLAMA_DEFAULT_SEED): a fresh one
    flags = _context_flags(args)
    if args.n_predict == -1 and AUTHORS in engines:
        raise GraphgenError("-n -1 (until the text ends) is for the llama.cpp and graphgen engines: the authors' "
                            "loop takes a count, give -n N")
    texts = _prompts(args)
    target = resolve(args.model)
    if not Path(target).is_file():
        raise FileNotFoundError(f"{target}: no such target model file")
    draft = resolve_draft(args.model_draft)
    label = draft_label(args.model_draft)
    if LLAMA_LOOP in engines:
        from ..speculative import llamaloop
        from .. import progress
        from ..models.arch import HEADS
        head = HEADS[draft_info(draft).head]
        if not head.llama_loop:
            raise GraphgenError(f"--engines {LLAMA_LOOP}: llama.cpp {llamaloop.BUILD} has no {head.title} driver")
        # every engine's target on the loop's build, before any of them loads a libllama
        llamaloop.share_build(llamaloop.ensure_build(progress.note), f"--engines {LLAMA_LOOP}")
    runs = run_engines(target, draft, texts, n_predict=args.n_predict, engines=engines, temp=args.temp,
                       seed=seed, n_seq=args.n_parallel, threads=args.threads, authors_draft=args.authors_draft,
                       flags=flags, label=label)
    div = None
    # graphgen's port against llama.cpp's own loop where it ran, else against its drivers on b11739's graphs
    ref = LLAMA_LOOP if LLAMA_LOOP in runs else "llama.cpp"
    compared = ref in runs and "graphgen" in runs
    if compared:
        div = first_divergence(runs[ref], runs["graphgen"])
    attr = None
    if "llama.cpp" in runs and AUTHORS in runs and args.temp == 0:
        import torch
        from ..accept.attribute import attribute
        from ..accept.compare import authors_checkpoint
        before = torch.get_num_threads()
        torch.set_num_threads(args.threads)  # as the loops ran
        try:
            attr = attribute(target, runs, authors_checkpoint(draft, args.authors_draft), n_threads=args.threads)
        finally:
            torch.set_num_threads(before)
    n_prompts = len(runs[engines[0]].prompts)
    if args.svg:
        from ..staging import staged_file
        with staged_file(args.svg) as tmp:
            tmp.write_text(acceptance_svg(runs, f"{label} on {Path(target).name}: acceptance per draft position "
                                                f"(-n {args.n_predict}, {_plural(n_prompts, 'prompt')})"))
    if args.json:
        doc = {"target": str(target), "draft": str(draft), "draft_name": label, "n_predict": args.n_predict,
               "temp": args.temp, "seed": seed, "n_seq": args.n_parallel, "context": flags.__dict__,
               "engines": {e: r.to_dict() for e, r in runs.items()}}
        if compared:
            doc["identical"] = div is None
            doc["first_divergence"] = None if div is None else {"prompt": div.prompt, "round": div.round,
                                                                "position": div.position, "what": div.what}
        if attr is not None:
            doc["attribution"] = attr.to_dict()
            doc["authors_within_band"] = _within(runs, attr)
        print(json.dumps(doc, indent=1))
    else:
        _print(runs, div, compared and ref, args.verbose, flags)
        if attr is not None:
            _print_attribution(runs, attr)
    return 1 if div is not None or (attr is not None and _faulty(runs, attr)) else 0


def _within(runs, attr) -> bool:
    from ..accept.compare import AUTHORS
    return abs(runs[AUTHORS].mean_acceptance_length - runs["llama.cpp"].mean_acceptance_length) <= attr.mean_band


def _faulty(runs, attr) -> bool:
    """The authors' loop differs from llama.cpp by more than the quantized target's numerics
    explain: a stage besides in-band features blamed, or its mean outside the band."""
    from ..accept.attribute import FEATURES
    return any(b != FEATURES for b in attr.blamed) or not attr.features_in_band or not _within(runs, attr)


def _print_attribution(runs, attr) -> None:
    from ..accept.compare import AUTHORS
    d = runs[AUTHORS].mean_acceptance_length - runs["llama.cpp"].mean_acceptance_length
    print("\n".join(attr.lines()))
    print(f"authors' mean acceptance length {'within' if _within(runs, attr) else 'OUTSIDE'} the band: "
          f"{d:+.3f} against +-{attr.mean_band:.3f}")


def _print(runs: dict, div, compared: bool, verbose: bool, flags) -> None:
    first = next(iter(runs.values()))
    n_max = max(r.n_max for r in runs.values())
    given = flags.given()
    print(f"{_plural(len(first.prompts), 'prompt')}; -fa {flags.flash_attn}"
          + (f", {', '.join(g for g in given if not g.startswith('-fa'))}" if any(not g.startswith("-fa") for g in given)
             else ""))
    # the field's mean acceptance length (1 + accepted / drafts), then generation apart from the prompt
    head = "engine         mean acc. len  drafts  drafted  accepted  prompt t/s  eval t/s  " + \
        " ".join(f"{'p' + str(i):>5}" for i in range(1, n_max + 1))
    print(head)
    for e, r in runs.items():
        d = r.to_dict()
        rates = " ".join(f"{v:5.2f}" for v in r.acceptance_per_position)
        pe = f"{r.prompt_tokens_per_s:10.1f}" if r.prefill_seconds > 0 else f"{'-':>10}"
        ev = f"{r.eval_tokens_per_s:8.2f}" if r.prefill_seconds > 0 else f"{r.tokens_per_s:8.2f}"
        print(f"{e:<14} {r.mean_acceptance_length:13.3f}  {d['drafts']:6d}  {d['drafted_tokens']:7d}  "
              f"{d['accepted_tokens']:8d}  {pe}  {ev}  {rates}")
    if compared:
        what = "llama.cpp's own loop and graphgen's" if compared != "llama.cpp" else "llama.cpp and graphgen drafting"
        if div is None:
            print(f"{what}: identical in every round (drafts, acceptance, target tokens)")
        else:
            print(f"{what} DIFFER, first at {div.describe()}")
    if verbose:
        for e, r in runs.items():
            for p, (prompt, text) in enumerate(zip(r.prompts, r.text)):
                print(f"--- {e}, prompt {p}: {prompt}\n{text}")


def register(sub) -> None:
    from .llamaflags import add_model, add_pair_flags
    p = sub.add_parser(
        "accept", help="a draft's acceptance in each engine's speculative loop, on a real target",
        description="Run held-out prompts through the speculative loop with the target in llama.cpp b11739 "
                    "and the draft in b11739 (llama.cpp) and in graphgen; print each engine's mean acceptance "
                    "length (1 + accepted / drafts), acceptance per draft position and tokens/s, and whether the two engines drafted "
                    "and accepted the same tokens in every round. Exit 0 when they did, 1 when they did not "
                    "(naming the first prompt, round and draft position where they part), 2 on bad input.")
    add_model(p, "the target GGUF (a known name: smollm2)")
    add_pair_flags(p, draft_help="the draft GGUF, a folder holding draft.gguf, or a shipped draft's name "
                                 "(smollm2-dflash)",
                   prompt_help="a prompt's text; repeat for more (default: six held-out prompts)",
                   file_help="prompts from FILE, one a line")
    p.add_argument("-n", "--n-predict", dest="n_predict", type=int, default=64, metavar="N",
                   help="tokens to generate per prompt; -1 until the text ends or the context is full, as "
                        "llama.cpp (default 64)")
    p.add_argument("-np", "--parallel", dest="n_parallel", type=count_arg(1), default=1, metavar="N",
                   help="prompts drafted and verified together in one batch (default 1)")
    p.add_argument("-t", "--threads", type=count_arg(1), default=1, metavar="N",
                   help="threads of the target and the draft (default 1)")
    p.add_argument("--temp", type=float, default=0.0,
                   help="the target's sampling temperature; 0 is greedy (default 0)")
    p.add_argument("--seed", type=int, default=0,
                   help="the target's sampling seed, with --temp above 0; -1 draws one, as llama.cpp (default 0)")
    p.add_argument("-fa", "--flash-attn", dest="flash_attn", choices=("on", "off", "auto"), default=None,
                   help="flash attention of the target's and the draft's contexts, as llama.cpp (default auto)")
    p.add_argument("-c", "--ctx-size", dest="n_ctx", type=count_arg(0), default=None, metavar="N",
                   help="each context's cells; 0 takes the target's trained context (default: what the prompts, "
                        "-n and -np need, at least 256; with -n -1, 4096)")
    p.add_argument("-b", "--batch-size", dest="n_batch", type=count_arg(1), default=None, metavar="N",
                   help="the target's logical batch; it caps the draft's micro-batch, as llama.cpp caps -ub "
                        "(default 256)")
    p.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=count_arg(1), default=None, metavar="N",
                   help="the draft's micro-batch; a draft block must fit it (default 64)")
    from ..cachetypes import KV_TYPES
    for flags, dest, what in ((("-ctk", "--cache-type-k"), "type_k", "the target's K cache"),
                              (("-ctv", "--cache-type-v"), "type_v", "the target's V cache"),
                              (("-ctkd", "--cache-type-k-draft"), "type_k_draft", "the draft's K cache"),
                              (("-ctvd", "--cache-type-v-draft"), "type_v_draft", "the draft's V cache")):
        p.add_argument(*flags, dest=dest, choices=KV_TYPES, default=None, metavar="TYPE",
                       help=f"{what} type, for the llama.cpp and graphgen engines (default f16)")
    p.add_argument("--engines", default="llama.cpp,graphgen", metavar="E,E",
                   help="the engines, comma-separated: llama.cpp, graphgen, llama.cpp-loop (llama.cpp b11549's "
                        "own loop and drivers, tools/build_llama.sh, built once; every engine's target then runs on "
                        "b11549's libllama, and graphgen's rounds are compared with it), and authors (the authors' own loop, "
                        "the target in transformers: z-lab's dflash_generate for DFlash and DFlash2, the "
                        "speculators equivalent for DSpark; needs the graphgen[torch] extra and the draft's "
                        "checkpoint) "
                        "(default llama.cpp,graphgen)")
    p.add_argument("--authors-draft", metavar="DIR", default=None,
                   help="the authors' checkpoint of the draft (config.json + model.safetensors), for --engines "
                        "authors (default: the folder of the -md GGUF)")
    p.add_argument("--svg", metavar="F", help="write the acceptance per draft position, one line per engine (SVG); "
                                              "a file that is not an SVG is kept unless --force")
    p.add_argument("--force", action="store_true", help="let --svg replace a file that is not an SVG")
    p.add_argument("--json", action="store_true", help="print everything, rounds and text included, as JSON")
    p.add_argument("--verbose", action="store_true", help="print each prompt's generated text")
    p.set_defaults(fn=_cmd_accept)
