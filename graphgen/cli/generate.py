"""`graphgen draft -m TARGET -md DRAFT`: speculative decoding with a real target verifying every draft.

The target runs in b11739's libllama (a child process), publishing the inputs of the draft's target
layers; the draft runs in graphgen (default) or in b11739 beside the target (`--engine llama.cpp`,
borrowing its embeddings and lm head through ctx_other). Text is tokenized and detokenized by the
target's vocabulary and streamed to stdout as it is accepted; a summary goes to stderr (or all of it
to stdout with --json). Unless --no-baseline, the target then generates alone from the same prompts,
which gives the speed ratio and, with greedy sampling (--temp 0), checks that drafting changed no
token.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import GraphgenError, PairError

LLAMA_DEFAULT_TEMP = 0.8  # common_params_sampling's default temperature
LLAMA_DEFAULT_N_CTX = 4096  # common_params' default context (-c); 0 takes the model's trained one


def _prompts(args) -> list[str]:
    from .llamaflags import read_prompt_file
    texts = list(args.prompt_text or [])
    if args.file:
        texts.append(read_prompt_file(args.file))
    if not texts:
        raise GraphgenError("no prompt: give -p TEXT or -f FILE")
    return texts


def trained_context(target: Path) -> int | None:
    """The target's trained context (its GGUF's {arch}.context_length), None when it has none."""
    from ..ggufile import field_value, open_reader
    r = open_reader(target)
    arch = field_value(r, "general.architecture")
    n = field_value(r, f"{arch}.context_length") if arch else None
    return int(n) if n is not None else None


def open_pair(args, target: Path, draft: Path, n_seq: int, n_predict: int | None = None, **target_kw):
    """The pair checked, the target opened in b11739 with the draft's target layers, the prompts
    tokenized by it and the context checked to hold them: (target, prompts, the draft's block size,
    n_predict). -c defaults to llama.cpp's 4096, -c 0 takes the target's trained context; -n -1
    generates what the context holds (until the text ends). The caller closes the target."""
    from .. import progress
    from ..speculative.pair import check_pair
    from ..reference.session import ReferenceTarget
    from ..runtime.model import load

    n_predict = args.n_predict if n_predict is None else n_predict
    problems = check_pair(target, draft)
    if problems:
        raise PairError(problems)
    meta = load(draft, target=target)
    layers, block = list(meta.hparams.target_layers), meta.hparams.block_size or 16
    meta.close()
    texts = _prompts(args)
    n_ctx = LLAMA_DEFAULT_N_CTX if args.n_ctx is None else args.n_ctx
    tg = ReferenceTarget(target, layers, n_ctx=n_ctx, n_seq=n_seq, n_threads=args.threads or 1, **target_kw)
    try:
        trained = trained_context(target)
        if trained is not None and tg.n_ctx > trained:
            # llama.cpp's warning: positions past the trained context are outside what the model learnt
            progress.note(f"warning: the context of {tg.n_ctx} (-c) is above the target's trained context of "
                          f"{trained}: positions past {trained} are outside its training")
        prompts = [tg.tokenize(texts[s % len(texts)]) for s in range(n_seq)]
        for s, p in enumerate(prompts):
            if not p:
                raise GraphgenError(f"prompt {s % len(texts)}: the text gives no tokens")
        # the context must hold every sequence: prompt, generated tokens and one draft block past them
        longest = max(len(p) for p in prompts)
        c_flag = f"-c is {tg.n_ctx}" + ("" if args.n_ctx is not None else " (llama.cpp's default; give -c N, "
                                                                          "or -c 0 for the trained context)")
        if n_predict == -1:
            n_predict = tg.n_ctx // n_seq - longest - block - 1
            if n_predict < 1:
                raise GraphgenError(f"the prompt has {longest} tokens: with a draft block of {block} and -np {n_seq} "
                                    f"the context leaves nothing to generate; {c_flag}")
        need = n_seq * (longest + n_predict + block + 1)
        if need > tg.n_ctx:
            raise GraphgenError(f"the prompt has {longest} tokens: with -n {n_predict}, a draft block of "
                                f"{block} and -np {n_seq}, the context needs {need} cells; {c_flag}")
    except BaseException:
        tg.close()
        raise
    return tg, prompts, block, n_predict


# the simulated verifier's flags: with a real target they have nothing to act on
SIMULATED_ONLY = (("--prompt-tokens", "prompt_tokens", "give the prompt as text with -p or -f"),
                  ("--features", "features", "the target computes the features"),
                  ("--features-seed", "features_seed", "the target computes the features"),
                  ("--accept", "accept", "the target decides what it accepts"),
                  ("--target-tokens", "target_tokens", "the target generates its own tokens"),
                  ("--verifier-seed", "verifier_seed", "the target samples with --seed"))


def run_target(args) -> int:
    from .. import progress
    from ..speculative.drafters import LLAMA_DEFAULT_SEED, DraftParams, draw_seed
    from ..speculative.loop import check_block_fits, open_drafter, run_speculative
    from ..speculative.targets import draft_label, resolve, resolve_draft
    from ..speculative.verifier import TargetVerifier, first_partings, generate_alone
    from ..cachetypes import KV_QUANTIZED
    from .kvtypes import kv_types
    from .llamaflags import backend_of, check_spec_flags, model_path, resolve_fa

    model_path(args)
    for flag, dest, why in SIMULATED_ONLY:
        if getattr(args, dest, None) is not None:
            raise GraphgenError(f"{flag} is the simulated verifier's (a draft alone, -m DRAFT); with a target "
                                f"(-md) {why}")
    check_spec_flags(args)
    target = resolve(args.model)
    if not target.is_file():
        raise FileNotFoundError(f"{target}: no such target model file")
    draft = resolve_draft(args.model_draft)
    if args.spec_draft_sampling == "probabilistic":
        raise GraphgenError("--spec-draft-sampling probabilistic needs rejection-sampling verification (q), which "
                            "the real-target loop does not run; use greedy drafting")
    temp = LLAMA_DEFAULT_TEMP if args.temp is None else args.temp
    seed = draw_seed(args.seed if args.seed is not None else LLAMA_DEFAULT_SEED)
    n_seq = args.n_parallel or 1
    fa = args.flash_attn or "auto"  # llama.cpp's default, for the draft's context as for the target's
    flash_attn = bool(resolve_fa(fa))
    # llama.cpp's speculative flags: -ctk/-ctv the target's caches, -ctkd/-ctvd the draft's
    tgt_k, tgt_v = kv_types(args, "f16", "f16", flash_attn)
    type_k, type_v = args.type_k_draft or "f16", args.type_v_draft or "f16"
    if type_v in KV_QUANTIZED and not flash_attn:
        raise GraphgenError(f"-ctvd {type_v}: a quantized V cache requires flash attention (-fa on)")
    n_ubatch = args.n_ubatch or 64
    if args.n_batch is not None:
        n_ubatch = min(n_ubatch, args.n_batch)
    if backend_of(args.backend) != "cpu":
        raise GraphgenError(f"-dev {args.backend}: the target runs on llama.cpp b11739's CPU build; -devd sets the "
                            "draft's device")
    backend = backend_of(args.device_draft or "cpu")
    if args.engine == "llama.cpp" and backend != "cpu":
        raise GraphgenError(f"-devd {args.device_draft}: the llama.cpp draft engine runs on the CPU; use --engine "
                            "graphgen")
    params = DraftParams(n_max=args.spec_draft_n_max, n_min=args.spec_draft_n_min, p_min=args.spec_draft_p_min)
    label = draft_label(args.model_draft)
    loop_build = _llama_loop_build(args, draft) if args.llama_loop else None

    with progress.task(f"draft {label} on {target.name}") as task:
        task.update("loading the target")
        tg = None
        try:
            tg, prompts, _, n_predict = open_pair(args, target, draft, n_seq, n_batch=args.n_batch or 256,
                                                  flash_attn=fa, type_k=tgt_k, type_v=tgt_v)
            task.update("loading the draft")
            settings = dict(n_ctx=tg.n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn, n_seq=n_seq,
                            n_threads=args.threads or 1, type_k=type_k, type_v=type_v)
            drafter = open_drafter(draft, args.spec_type or None, params, engine=args.engine, tg=tg, target=target,
                                   backend=backend, **settings)
            session = drafter.session
            try:
                check_block_fits(drafter, args.n_batch)
                task.update("generating")
                stream = StreamPrinter(tg, prompts[0], enabled=not args.json and n_seq == 1)
                rounds_out = RoundPrinter(verbose=args.verbose and not args.json)

                def on_round(rec):
                    rounds_out.round(rec)
                    stream.round(rec)
                verifier = TargetVerifier(tg, temp=temp, seed=seed)
                res = run_speculative(drafter, [(p, None) for p in prompts], n_predict=n_predict,
                                      verifier=verifier, temp=temp, seed=seed, progress=on_round,
                                      n_ctx=tg.n_ctx, edges=args.loop_edges)
                stream.finish(res.tokens[0])
            finally:
                session.close()
            alone, t_alone, timing_alone, trace_alone = None, None, {}, {}
            if not args.no_baseline:
                task.update("the target alone")
                for s in range(n_seq):
                    tg.seq_rm(s, -1, -1)
                # speculative-simple's edges end a sequence past -n: the target alone generates as far
                n_alone = max(len(res.tokens[s]) - res.n_prompt[s] for s in range(n_seq)) \
                    if args.loop_edges == "simple" else n_predict
                alone, t_alone = generate_alone(tg, dict(enumerate(prompts)), n_alone, temp=temp, seed=seed,
                                                timing=timing_alone, trace=trace_alone)
                if args.loop_edges == "simple":
                    alone = {s: t[:len(res.tokens[s])] for s, t in alone.items()}
            texts_out = {s: b"".join(tg.pieces(res.tokens[s][res.n_prompt[s]:])[0]).decode(errors="replace")
                         for s in range(n_seq)}
            partings = []
            if alone is not None and temp <= 0:
                partings = first_partings(res.tokens, alone, res.n_prompt, verifier.trace, trace_alone)
            piece = (lambda t: b"".join(tg.pieces([t])[0]).decode(errors="replace"))
            parting_lines = [p.describe(piece) for p in partings]
        finally:
            if tg is not None:
                tg.close()
    ctx = {"n_ctx": settings["n_ctx"], "flash_attn": f"{fa} ({'on' if flash_attn else 'off'})",
           "type_k": tgt_k, "type_v": tgt_v, "type_k_draft": type_k, "type_v_draft": type_v,
           "n_batch": args.n_batch or 256, "n_ubatch": n_ubatch, "n_seq": n_seq}
    summary = _summary(res, alone, t_alone, timing_alone, args, temp, seed, target, draft, label, ctx, n_predict)
    summary["text"] = [texts_out[s] for s in range(n_seq)]
    if alone is not None and temp <= 0:
        summary["partings"] = [p.to_dict() for p in partings]
    bad = [line for p, line in zip(partings, parting_lines) if not p.near_tie]
    loop_cmp = None
    if loop_build is not None:
        from ..speculative import llamaloop
        st = llamaloop.LoopSettings(
            n_predict=n_predict, n_seq=n_seq, n_ctx=settings["n_ctx"], n_batch=args.n_batch or 256,
            n_ubatch_draft=n_ubatch, flash_attn=flash_attn, type_k=tgt_k, type_v=tgt_v, type_k_draft=type_k,
            type_v_draft=type_v, n_max=res.n_max, n_min=params.n_min, p_min=params.p_min, temp=temp, seed=seed,
            threads=args.threads or 1, edges=args.loop_edges)
        with progress.task("llama.cpp's loop") as task:
            task.update(f"{llamaloop.BUILD} {llamaloop.PROGRAM}")
            theirs = llamaloop.run(loop_build, target, draft, prompts, st)
        loop_cmp = llamaloop.compare(summary["rounds_detail"], theirs, res.tokens)
        summary["llama_loop"] = {
            "build": str(loop_build), "rounds_compared": loop_cmp.compared, "rounds_identical": loop_cmp.identical,
            "tokens_identical": loop_cmp.tokens_identical,
            "first_parting": None if loop_cmp.first is None else loop_cmp.first.describe(),
            "rounds_detail": theirs.rounds, "tokens": [theirs.tokens.get(s) for s in range(n_seq)],
            "seconds": theirs.timing}
    if args.json:
        summary["tokens"] = [res.tokens[s] for s in range(n_seq)]
        if alone is not None:
            summary["target_alone"]["tokens"] = [alone[s] for s in range(n_seq)]
        print(json.dumps(summary, indent=1))
    else:
        if n_seq > 1:
            for s in range(n_seq):
                print(f"--- sequence {s}\n{texts_out[s]}")
        _print_summary(summary, parting_lines)
        if loop_cmp is not None:
            print(_loop_line(loop_cmp))
    if loop_cmp is not None and not loop_cmp.ok:
        print(f"error: graphgen's loop parts from llama.cpp's: {_loop_line(loop_cmp)}", file=sys.stderr)
        return 1
    if bad:
        # a near tie is the target's batch numerics; anything wider is drafting changing the text
        print(f"error: drafting changed the target's greedy text beyond a near tie: {bad[0]}", file=sys.stderr)
        return 1
    return 0


def _llama_loop_build(args, draft: Path):
    """--llama-loop: llama.cpp's loop program (built once), and both targets on its libllama."""
    from ..speculative import llamaloop
    from .. import progress
    from ..models.arch import HEADS
    from ..speculative.pair import draft_info
    asked = [h for h in HEADS.values() if args.spec_type and h.spec_type in args.spec_type]
    head = asked[0] if asked else HEADS[draft_info(draft).head]
    if not head.llama_loop:
        has = ", ".join(h.title for h in sorted(HEADS.values(), key=lambda h: h.name) if h.llama_loop)
        raise GraphgenError(f"--llama-loop: llama.cpp {llamaloop.BUILD} has no {head.title} driver to compare with "
                            f"(its common/speculative.cpp has {has}); {head.title}'s driver is checked against "
                            "the seed's")
    build = llamaloop.ensure_build(progress.note)
    llamaloop.share_build(build, "--llama-loop")
    return build


def _loop_line(c) -> str:
    head = (f"llama.cpp's loop {c.compared} rounds compared, {c.identical} identical; "
            f"{'the same tokens' if c.tokens_identical else 'the tokens differ'}")
    return head if c.first is None else f"{head}; first parting: {c.first.describe()}"


class RoundPrinter:
    """--verbose: each round of each sequence on stderr, as accept --json records them: its position,
    the last accepted token, the drafted tokens, the target's tokens and the accepted count."""

    def __init__(self, verbose: bool):
        self.verbose = verbose

    def round(self, rec) -> None:
        if not self.verbose:
            return
        print(f"[round {rec.round + 1}] seq {rec.seq} pos {rec.pos0}: id_last {rec.id_last}, drafted "
              f"{len(rec.draft)} {rec.draft}, target {_target_tokens(rec)}, accepted {rec.n_accepted} "
              f"({1e3 * (rec.t_draft + rec.t_process + rec.t_verify):.1f} ms)", file=sys.stderr)


def _target_tokens(rec) -> list[int]:
    """The target's tokens in a round: the drafted ones it accepted, then its own (none when the
    run ended on the accepted run)."""
    return list(rec.draft[:rec.n_accepted]) + ([rec.bonus] if rec.bonus >= 0 else [])


class StreamPrinter:
    """Writes the accepted text of sequence 0 to stdout as rounds end (whole UTF-8 characters only)."""

    def __init__(self, target, prompt, enabled: bool):
        self.target, self.enabled = target, enabled
        self.n_prompt = len(prompt)
        self.pending = b""
        self.done = 0

    def round(self, rec) -> None:
        if not self.enabled or rec.seq != 0:
            return
        new = [rec.id_last] + rec.draft[:rec.n_accepted]
        self._write(new)

    def _write(self, tokens) -> None:
        if not tokens:
            return
        self.pending += b"".join(self.target.pieces(tokens)[0])
        self.done += len(tokens)
        # hold back an incomplete UTF-8 sequence until its last bytes come
        cut = len(self.pending)
        for back in range(1, min(4, len(self.pending)) + 1):
            b = self.pending[-back]
            if b & 0xC0 == 0xC0:        # a lead byte: is its sequence complete?
                need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4
                if back < need:
                    cut = len(self.pending) - back
                break
            if b & 0x80 == 0:
                break
        sys.stdout.write(self.pending[:cut].decode(errors="replace"))
        sys.stdout.flush()
        self.pending = self.pending[cut:]

    def finish(self, tokens) -> None:
        if not self.enabled:
            return
        # what the last round added after its accepted run (the target's own next token)
        rest = tokens[self.n_prompt + self.done:]
        self._write(list(rest))
        if self.pending:
            sys.stdout.write(self.pending.decode(errors="replace"))
        sys.stdout.write("\n")
        sys.stdout.flush()


def _phases(n_prompt: int, t_prompt: float, n_eval: int, t_eval: float) -> dict:
    """Prompt processing and generation apart, as llama.cpp's timings report them."""
    return {"prompt_eval": {"tokens": n_prompt, "seconds": t_prompt,
                            "tokens_per_s": n_prompt / t_prompt if t_prompt > 0 else 0.0},
            "eval": {"tokens": n_eval, "seconds": t_eval, "tokens_per_s": n_eval / t_eval if t_eval > 0 else 0.0}}


def _summary(res, alone, t_alone, timing_alone, args, temp, seed, target, draft, label, ctx, n_predict) -> dict:
    s = res.summary()
    n_gen = s["generated_tokens"]
    n_seq = len(res.tokens)
    t_total = res.t_total
    t_draft = 1e-3 * s["ms_draft_per_round"] * s["rounds"]
    t_inject = 1e-3 * s["ms_process_per_round"] * s["rounds"]
    n_prompt = sum(res.n_prompt.values())
    # each sequence's first token comes with its prompt's decode; the rest are generation
    n_eval = sum(max(len(res.tokens[q]) - res.n_prompt[q] - 1, 0) for q in res.tokens)
    stops = ["context" if r == "n_predict" and args.n_predict == -1 else r for r in s["stop_reasons"]]
    out = {
        "target": str(target), "draft": str(draft), "draft_name": label, "engine": args.engine,
        "spec_type": s["spec_type"], "variant": s["variant"], "n_max": s["n_max"], "n_seq": n_seq,
        "n_predict": n_predict, "context": ctx,
        "temp": temp, "seed": seed, "greedy": temp <= 0,
        "generated_tokens": n_gen, "rounds": s["rounds"], "blocks": s["blocks"], "drafts": s["drafts"],
        "drafted_tokens": s["drafted_tokens"], "accepted_tokens": s["accepted_tokens"],
        "mean_acceptance_length": s["mean_acceptance_length"], "acceptance_rate": s["acceptance_rate"],
        "acceptance_per_position": s["acceptance_per_position"],
        "tokens_per_s": n_gen / t_total if t_total > 0 else 0.0,
        **_phases(n_prompt, res.t_prefill, n_eval, t_total - res.t_prefill),
        "seconds": {"total": t_total, "target": res.t_target, "draft": t_draft, "inject": t_inject,
                    "host": max(0.0, t_total - res.t_target - t_draft - t_inject)},
        "stop_reasons": stops,
        "rounds_detail": [{"round": r.round, "seq": r.seq, "pos0": r.pos0, "id_last": r.id_last,
                           "draft": list(r.draft), "target": _target_tokens(r), "n_accepted": r.n_accepted}
                          for r in res.rounds],
    }
    if alone is not None:
        n_alone = sum(len(alone[q]) - res.n_prompt[q] for q in alone)
        n_alone_eval = sum(max(len(alone[q]) - res.n_prompt[q] - 1, 0) for q in alone)
        out["target_alone"] = {"generated_tokens": n_alone, "seconds": t_alone,
                               "tokens_per_s": n_alone / t_alone if t_alone else 0.0,
                               **_phases(n_prompt, timing_alone.get("prompt", 0.0), n_alone_eval,
                                         timing_alone.get("generation", 0.0))}
        # the generation phases compared: the prompt's decode is the same work in both runs
        alone_tps = out["target_alone"]["eval"]["tokens_per_s"]
        out["speedup"] = out["eval"]["tokens_per_s"] / alone_tps if alone_tps else 0.0
        out["same_tokens_as_target_alone"] = all(res.tokens[q] == alone[q] for q in alone)
    return out


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _print_summary(s: dict, parting_lines=()) -> None:
    err = sys.stderr
    c = s["context"]
    print(f"engine           {s['engine']} draft {s['draft_name']} ({s['spec_type']}, n_max {s['n_max']}), "
          f"target {Path(s['target']).name} in llama.cpp b11739", file=err)
    print(f"context          -c {c['n_ctx']}, -fa {c['flash_attn']}, -b {c['n_batch']}, -ub {c['n_ubatch']}, "
          f"-np {c['n_seq']}; K/V cache: target {c['type_k']}/{c['type_v']}, draft "
          f"{c['type_k_draft']}/{c['type_v_draft']}", file=err)
    print(f"sampling         {'greedy' if s['greedy'] else 'temp %g, seed %d' % (s['temp'], s['seed'])}", file=err)
    pe, ev = s["prompt_eval"], s["eval"]
    print(f"prompt eval      {plural(pe['tokens'], 'token')} in {pe['seconds']:.2f} s: "
          f"{pe['tokens_per_s']:.1f} tokens/s", file=err)
    print(f"eval             {plural(ev['tokens'], 'token')} in {ev['seconds']:.2f} s: {ev['tokens_per_s']:.1f} "
          f"tokens/s with drafting ({plural(s['generated_tokens'], 'token')} generated)", file=err)
    if "target_alone" in s:
        ta = s["target_alone"]
        same = ""
        if s["greedy"]:
            same = ("; the same tokens" if s["same_tokens_as_target_alone"]
                    else "; TOKENS DIFFER from the target alone")
        print(f"target alone     prompt eval {ta['prompt_eval']['tokens_per_s']:.1f} tokens/s, eval "
              f"{ta['eval']['tokens_per_s']:.1f} tokens/s (drafting: x{s['speedup']:.2f}{same})", file=err)
        for line in parting_lines:
            print(f"parting          {line}", file=err)
    print(f"drafted          {plural(s['drafted_tokens'], 'token')} in {plural(s['drafts'], 'draft')}, accepted "
          f"{s['accepted_tokens']} ({100 * s['acceptance_rate']:.1f}%)", file=err)
    print(f"mean acceptance  {s['mean_acceptance_length']:.2f} tokens per round (1 + accepted / drafts)", file=err)
    pp = " ".join(f"{100 * p:.0f}%" for p in s["acceptance_per_position"])
    print(f"per position     {pp}", file=err)
    sec = s["seconds"]
    print(f"time             target {sec['target']:.2f} s, draft {sec['draft']:.2f} s, inject {sec['inject']:.2f} s, "
          f"host {sec['host']:.2f} s", file=err)
    stops = sorted(set(s["stop_reasons"]))
    if stops != ["n_predict"]:
        words = {"n_predict": f"-n {s['n_predict']} reached", "eog": "the target ended the text",
                 "context": "the context is full (-n -1)"}
        print("stopped          " + "; ".join(
            f"sequence {q}: {words.get(r, r)}" for q, r in enumerate(s["stop_reasons"])), file=err)


RUN_SCENARIO, RUN_FEATURES = "target-run.json", "target-features.npz"


def record_run(args, target: Path, draft: Path, folder: Path) -> Path:
    """Run the speculative loop on the real target (graphgen drafting, greedy unless --temp) and
    write what the draft was given as a scenario in `folder`: every inject with the target's
    features (an .npz beside it), every block and seq_rm. Returns the scenario file."""
    import numpy as np

    from ..speculative.drafters import DraftParams
    from ..speculative.loop import RecordingSession, open_drafter, run_speculative
    from ..speculative.verifier import TargetVerifier

    n_seq = args.n_parallel or 1
    n_ubatch = args.n_ubatch or 64
    n_predict = args.n_predict
    temp = 0.0 if args.temp is None else args.temp
    seed = 0 if args.target_seed is None else args.target_seed
    tg, prompts, _, n_predict = open_pair(args, target, draft, n_seq, n_batch=256)
    with tg:
        from .llamaflags import resolve_fa
        fa = bool(resolve_fa(args.flash_attn))
        settings = {"n_ctx": tg.n_ctx, "n_ubatch": n_ubatch, "flash_attn": fa, "n_seq": n_seq,
                    "n_threads": args.threads or 1, "type_k": args.type_k or args.type_kv or "f16",
                    "type_v": args.type_v or args.type_kv or "f16"}
        drafter = open_drafter(draft, None, DraftParams(n_max=None), target=target, wrap=RecordingSession, **settings)
        sess = drafter.session
        try:
            from ..speculative.loop import check_block_fits
            check_block_fits(drafter)
            run_speculative(drafter, [(p, None) for p in prompts], n_predict=n_predict,
                            verifier=TargetVerifier(tg, temp=temp, seed=seed), n_ctx=tg.n_ctx)
        finally:
            sess.close()
    doc = sess.scenario(n_ctx=settings["n_ctx"], n_ubatch=n_ubatch, flash_attn="on" if fa else "off",
                        type_k=settings["type_k"], type_v=settings["type_v"], n_seq=n_seq,
                        n_threads=settings["n_threads"], target=str(target.resolve()), features=RUN_FEATURES)
    np.savez(folder / RUN_FEATURES, **sess.features)
    path = folder / RUN_SCENARIO
    path.write_text(json.dumps(doc))
    return path
