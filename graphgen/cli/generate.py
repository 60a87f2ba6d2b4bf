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


def _prompts(args) -> list[str]:
    texts = list(args.prompt_text or [])
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such prompt file")
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    if not texts:
        raise GraphgenError("no prompt: give -p TEXT or -f FILE")
    return texts


def open_pair(args, target: Path, draft: Path, n_seq: int, **target_kw):
    """The pair checked, the target opened in b11739 with the draft's target layers, the prompts
    tokenized by it and the context checked to hold them: (target, prompts, the draft's block size).
    The caller closes the target."""
    from ..pair import check_pair
    from ..reference.session import ReferenceTarget
    from ..runtime.model import load

    problems = check_pair(target, draft)
    if problems:
        raise PairError(problems)
    meta = load(draft, target=target)
    layers, block = list(meta.hparams.target_layers), meta.hparams.block_size or 16
    meta.close()
    texts = _prompts(args)
    tg = ReferenceTarget(target, layers, n_ctx=args.n_ctx or 4096, n_seq=n_seq, n_threads=args.threads or 1,
                         **target_kw)
    try:
        prompts = [tg.tokenize(texts[s % len(texts)]) for s in range(n_seq)]
        # the context must hold every sequence: prompt, generated tokens and one draft block past them
        longest = max(len(p) for p in prompts)
        need = n_seq * (longest + args.n_predict + block + 1)
        if need > tg.n_ctx:
            raise GraphgenError(f"the prompt has {longest} tokens: with -n {args.n_predict}, a draft block of "
                                f"{block} and -np {n_seq}, the context needs {need} cells; -c is {tg.n_ctx}")
    except BaseException:
        tg.close()
        raise
    return tg, prompts, block


def run_target(args) -> int:
    from .. import progress
    from ..runtime.drafters import LLAMA_DEFAULT_SEED, DraftParams, create_drafter
    from ..speculate import run_speculative
    from ..targets import resolve
    from ..verifier import TargetVerifier, generate_alone
    from ..scenario import KV_QUANTIZED
    from .kvtypes import kv_types
    from .llamaflags import backend_of, model_path, resolve_fa

    model_path(args)
    from ..accept.compare import resolve_draft
    target = resolve(args.model)
    if not target.is_file():
        raise FileNotFoundError(f"{target}: no such target model file")
    draft = resolve_draft(args.model_draft)
    if args.spec_draft_sampling == "probabilistic":
        raise GraphgenError("--spec-draft-sampling probabilistic needs rejection-sampling verification (q), which "
                            "the real-target loop does not run; use greedy drafting")
    if args.n_predict < 1:
        raise GraphgenError(f"--n-predict must be at least 1, got {args.n_predict}")
    if args.seed is not None and not 0 <= args.seed <= 0xFFFFFFFF:
        raise GraphgenError(f"--seed must be in [0, 2^32-1], got {args.seed}")
    temp = LLAMA_DEFAULT_TEMP if args.temp is None else args.temp
    seed = args.seed if args.seed is not None else LLAMA_DEFAULT_SEED
    if seed == LLAMA_DEFAULT_SEED:
        import random
        seed = random.SystemRandom().getrandbits(32)  # as llama.cpp draws a fresh seed
    n_seq = args.n_parallel or 1
    flash_attn = bool(resolve_fa(args.flash_attn))
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

    with progress.task(f"draft {draft.name} on {target.name}") as task:
        task.update("loading the target")
        tg = None
        try:
            tg, prompts, _ = open_pair(args, target, draft, n_seq, n_batch=args.n_batch or 256,
                                       flash_attn=args.flash_attn or "auto", type_k=tgt_k, type_v=tgt_v)
            task.update("loading the draft")
            settings = dict(n_ctx=tg.n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn, n_seq=n_seq,
                            n_threads=args.threads or 1, type_k=type_k, type_v=type_v)
            if args.engine == "llama.cpp":
                session = tg.open_draft(draft, **settings)
            else:
                from ..runtime.session import Session
                session = Session(draft, target=target, backend=backend, **settings)
            try:
                drafter = create_drafter(session, args.spec_type or None, params)
                task.update("generating")
                stream = StreamPrinter(tg, prompts[0], enabled=not args.json and n_seq == 1)
                res = run_speculative(drafter, [(p, None) for p in prompts], n_predict=args.n_predict,
                                      verifier=TargetVerifier(tg, temp=temp, seed=seed), temp=temp, seed=seed,
                                      progress=stream.round)
                stream.finish(res.tokens[0])
            finally:
                session.close()
            alone, t_alone = None, None
            if not args.no_baseline:
                task.update("the target alone")
                for s in range(n_seq):
                    tg.seq_rm(s, -1, -1)
                alone, t_alone = generate_alone(tg, dict(enumerate(prompts)), args.n_predict, temp=temp, seed=seed)
            texts_out = {s: b"".join(tg.pieces(res.tokens[s][res.n_prompt[s]:])[0]).decode(errors="replace")
                         for s in range(n_seq)}
        finally:
            if tg is not None:
                tg.close()
    summary = _summary(res, alone, t_alone, args, temp, seed, target, draft, session)
    summary["text"] = [texts_out[s] for s in range(n_seq)]
    if args.json:
        summary["tokens"] = [res.tokens[s] for s in range(n_seq)]
        print(json.dumps(summary, indent=1))
        return 0
    if n_seq > 1:
        for s in range(n_seq):
            print(f"--- sequence {s}\n{texts_out[s]}")
    _print_summary(summary)
    return 0


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


def _summary(res, alone, t_alone, args, temp, seed, target, draft, session) -> dict:
    s = res.summary()
    n_gen = s["generated_tokens"]
    t_total = res.t_total
    t_draft = 1e-3 * s["ms_draft_per_round"] * s["rounds"]
    t_inject = 1e-3 * s["ms_process_per_round"] * s["rounds"]
    out = {
        "target": str(target), "draft": str(draft), "engine": args.engine,
        "spec_type": s["spec_type"], "variant": s["variant"], "n_max": s["n_max"], "n_seq": len(res.tokens),
        "temp": temp, "seed": seed, "greedy": temp <= 0,
        "generated_tokens": n_gen, "rounds": s["rounds"], "blocks": s["blocks"],
        "drafted_tokens": s["drafted_tokens"], "accepted_tokens": s["accepted_tokens"],
        "mean_accepted_length": s["mean_accepted_length"], "acceptance_rate": s["acceptance_rate"],
        "acceptance_per_position": s["acceptance_per_position"],
        "tokens_per_s": n_gen / t_total if t_total > 0 else 0.0,
        "seconds": {"total": t_total, "target": res.t_target, "draft": t_draft, "inject": t_inject,
                    "host": max(0.0, t_total - res.t_target - t_draft - t_inject)},
        "stop_reasons": s["stop_reasons"],
    }
    if alone is not None:
        n_alone = sum(len(alone[q]) - res.n_prompt[q] for q in alone)
        out["target_alone"] = {"generated_tokens": n_alone, "seconds": t_alone,
                               "tokens_per_s": n_alone / t_alone if t_alone else 0.0}
        out["speedup"] = out["tokens_per_s"] / out["target_alone"]["tokens_per_s"] \
            if out["target_alone"]["tokens_per_s"] else 0.0
        out["same_tokens_as_target_alone"] = all(res.tokens[q] == alone[q] for q in alone)
    return out


def _print_summary(s: dict) -> None:
    err = sys.stderr
    print(f"engine           {s['engine']} draft {Path(s['draft']).name} ({s['spec_type']}, n_max {s['n_max']}), "
          f"target {Path(s['target']).name} in llama.cpp b11739", file=err)
    print(f"sampling         {'greedy' if s['greedy'] else 'temp %g, seed %d' % (s['temp'], s['seed'])}", file=err)
    print(f"generated        {s['generated_tokens']} tokens in {s['seconds']['total']:.2f} s: "
          f"{s['tokens_per_s']:.1f} tokens/s with drafting", file=err)
    if "target_alone" in s:
        ta = s["target_alone"]
        same = ""
        if s["greedy"]:
            same = ("; the same tokens" if s["same_tokens_as_target_alone"]
                    else "; TOKENS DIFFER from the target alone")
        print(f"target alone     {ta['tokens_per_s']:.1f} tokens/s (drafting: x{s['speedup']:.2f}{same})", file=err)
    print(f"drafted          {s['drafted_tokens']} tokens in {s['blocks']} blocks, accepted {s['accepted_tokens']} "
          f"({100 * s['acceptance_rate']:.1f}%)", file=err)
    print(f"mean accepted    {s['mean_accepted_length']:.2f} tokens per block", file=err)
    pp = " ".join(f"{100 * p:.0f}%" for p in s["acceptance_per_position"])
    print(f"per position     {pp}", file=err)
    sec = s["seconds"]
    print(f"time             target {sec['target']:.2f} s, draft {sec['draft']:.2f} s, inject {sec['inject']:.2f} s, "
          f"host {sec['host']:.2f} s", file=err)


RUN_SCENARIO, RUN_FEATURES = "target-run.json", "target-features.npz"


def record_run(args, target: Path, draft: Path, folder: Path) -> Path:
    """Run the speculative loop on the real target (graphgen drafting, greedy unless --temp) and
    write what the draft was given as a scenario in `folder`: every inject with the target's
    features (an .npz beside it), every block and seq_rm. Returns the scenario file."""
    import numpy as np

    from ..runtime.drafters import DraftParams, create_drafter
    from ..runtime.session import Session
    from ..speculate import RecordingSession, run_speculative
    from ..verifier import TargetVerifier

    n_seq = args.n_parallel or 1
    n_ubatch = args.n_ubatch or 64
    n_predict = args.n_predict
    temp = 0.0 if args.temp is None else args.temp
    seed = 0 if args.target_seed is None else args.target_seed
    tg, prompts, _ = open_pair(args, target, draft, n_seq, n_batch=256)
    with tg:
        from .llamaflags import resolve_fa
        fa = bool(resolve_fa(args.flash_attn))
        settings = {"n_ctx": tg.n_ctx, "n_ubatch": n_ubatch, "flash_attn": fa, "n_seq": n_seq,
                    "n_threads": args.threads or 1, "type_k": args.type_k or args.type_kv or "f16",
                    "type_v": args.type_v or args.type_kv or "f16"}
        sess = RecordingSession(Session(draft, target=target, **settings))
        try:
            drafter = create_drafter(sess, None, DraftParams(n_max=None))
            run_speculative(drafter, [(p, None) for p in prompts], n_predict=n_predict,
                            verifier=TargetVerifier(tg, temp=temp, seed=seed))
        finally:
            sess._s.close()
    doc = sess.scenario(n_ctx=settings["n_ctx"], n_ubatch=n_ubatch, flash_attn="on" if fa else "off",
                        type_k=settings["type_k"], type_v=settings["type_v"], n_seq=n_seq,
                        n_threads=settings["n_threads"], target=str(target.resolve()), features=RUN_FEATURES)
    np.savez(folder / RUN_FEATURES, **sess.features)
    path = folder / RUN_SCENARIO
    path.write_text(json.dumps(doc))
    return path
