"""graphgen's speculative loop and target path against llama.cpp's own, on the same b11549 kernels.

    python tools/bench_loop.py [--target smollm2] [--draft smollm2-dflash] [-n 64] [--repeat 3]
                               [--threads 1] [--spec-draft-n-max 3]

One process takes turns, `--repeat` times, on the same prompt with greedy sampling, every side on
b11549 (tools/build_llama.sh; graphgen's target through --llama on the same build):

  target alone   llama-completion's wall time per generated token after the first (its perf
                 report's total time at -n N less that at -n 1; its eval time too, the decodes alone)
                 against graphgen's target generating alone (verifier.generate_alone), per generated
                 token after the first;
  loop           graphgen-spec-loop (llama.cpp's loop over common/speculative.cpp) against
                 graphgen's loop (speculate.run_speculative with verifier.TargetVerifier and the
                 graphgen draft engine), per round after the prefill, split into target decode,
                 draft, injection, sampling and host (the rest).

Prints a markdown section for BENCHMARKS.md: medians, and ratio = graphgen / llama.cpp (lower is
better). Both loops must run the same rounds (it says so when they do not: then the times per
round are not comparable).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphgen.speculative import llamaloop  # noqa: E402

PROMPT = "The capital of France is"


def completion_ms_per_token(build: Path, target: Path, n: int, threads: int) -> tuple[float, float]:
    """llama-completion's (wall ms per generated token after the first, eval ms per token): the wall
    time from its perf report's total time at -n N less that at -n 1, over N - 1 tokens (its decode,
    sampling and host loop, as graphgen's figure counts them), and its eval time alone."""
    def once(k):
        cmd = [str(build / "llama-completion"), "-m", str(target), "-p", PROMPT, "-n", str(k), "--temp", "0",
               "-t", str(threads), "-tb", str(threads), "-c", "4096", "-b", "256", "-ub", "256", "-fa", "on",
               "-no-cnv", "--no-warmup"]
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"llama-completion failed: {r.stderr[-2000:]}")
        total = re.search(r"total time =\s*([\d.]+) ms /\s*(\d+) tokens", r.stderr)
        ev = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", r.stderr)
        if not total or not ev:
            raise SystemExit("llama-completion printed no perf report")
        return float(total.group(1)), float(ev.group(1)) / max(int(ev.group(2)), 1)
    t_n, eval_ms = once(n)
    t_1, _ = once(1)
    return (t_n - t_1) / (n - 1), eval_ms


def graphgen_alone_ms_per_token(target: Path, layers, n: int, threads: int) -> float:
    from graphgen.reference.session import ReferenceTarget
    from graphgen.speculative.verifier import generate_alone
    with ReferenceTarget(target, layers, n_ctx=4096, n_batch=256, n_threads=threads, flash_attn="on") as tg:
        prompt = tg.tokenize(PROMPT)
        timing = {}
        toks, _ = generate_alone(tg, {0: prompt}, n, temp=0.0, timing=timing)
        return 1e3 * timing["generation"] / max(len(toks[0]) - len(prompt) - 1, 1)


def graphgen_loop(target: Path, draft: Path, layers, n: int, n_max: int, threads: int):
    """(per-round ms split, rounds as llamaloop.compare reads them, tokens)."""
    from graphgen.reference.session import ReferenceTarget
    from graphgen.speculative.drafters import DraftParams
    from graphgen.speculative.loop import open_drafter, run_speculative
    from graphgen.speculative.verifier import TargetVerifier
    with ReferenceTarget(target, layers, n_ctx=4096, n_batch=256, n_threads=threads, flash_attn="on") as tg:
        prompt = tg.tokenize(PROMPT)
        d = open_drafter(draft, None, DraftParams(n_max=n_max), target=target, n_ctx=tg.n_ctx, n_ubatch=64,
                         flash_attn=True, n_threads=threads)
        try:
            ver = TargetVerifier(tg, temp=0.0, seed=0)
            res = run_speculative(d, [(prompt, None)], n_predict=n, verifier=ver, temp=0.0, n_ctx=tg.n_ctx)
        finally:
            d.session.close()
    n_rounds = len(res.rounds)
    t_draft = sum({r.round: r.t_draft for r in res.rounds}.values())
    t_inject = sum(r.t_process for r in res.rounds)
    t_loop = res.t_total - res.t_prefill
    t_target = res.t_target - ver.t_prefill
    t_sample = ver.t_sample
    split = {"round": t_loop, "target": t_target, "draft": t_draft, "inject": t_inject, "sample": t_sample,
             "host": t_loop - t_target - t_draft - t_inject - t_sample}
    rounds = [{"round": r.round, "seq": r.seq, "pos0": r.pos0, "id_last": r.id_last, "draft": list(r.draft),
               "target": list(r.draft[:r.n_accepted]) + ([r.bonus] if r.bonus >= 0 else []),
               "n_accepted": r.n_accepted} for r in res.rounds]
    return {k: 1e3 * v / n_rounds for k, v in split.items()}, rounds, res.tokens, prompt


def llama_loop(build: Path, target: Path, draft: Path, prompt, n: int, n_max: int, threads: int):
    st = llamaloop.LoopSettings(n_predict=n, n_max=n_max, threads=threads, flash_attn=True)
    run = llamaloop.run(build, target, draft, [prompt], st)
    t = run.timing
    n_rounds = len(run.rounds)
    t_loop = t["t_total"] - t["t_prefill"]
    t_target = sum(r["t_target"] for r in run.rounds)
    t_inject = sum(r["t_inject"] for r in run.rounds)
    t_draft = sum(r["t_draft"] for r in run.rounds)
    t_sample = t.get("t_sample", 0.0)
    split = {"round": t_loop, "target": t_target, "draft": t_draft, "inject": t_inject, "sample": t_sample,
             "host": t_loop - t_target - t_draft - t_inject - t_sample}
    return {k: 1e3 * v / n_rounds for k, v in split.items()}, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--draft", default="smollm2-dflash")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--spec-draft-n-max", type=int, default=3)
    args = ap.parse_args()

    build = llamaloop.ensure_build(lambda m: print(m, file=sys.stderr))
    llamaloop.share_build(build, "tools/bench_loop.py")
    from graphgen.speculative.pair import draft_info
    from graphgen.speculative.targets import resolve, resolve_draft
    target, draft = resolve(args.target), resolve_draft(args.draft)
    layers = draft_info(draft).target_layers

    alone = {"llama.cpp": [], "graphgen": [], "eval": []}
    loops = {"llama.cpp": [], "graphgen": []}
    same = True
    for rep in range(args.repeat):
        print(f"repetition {rep + 1}/{args.repeat}", file=sys.stderr)
        wall, eval_ms = completion_ms_per_token(build, target, args.n, args.threads)
        alone["llama.cpp"].append(wall)
        alone["eval"].append(eval_ms)
        alone["graphgen"].append(graphgen_alone_ms_per_token(target, layers, args.n, args.threads))
        ours, rounds, tokens, prompt = graphgen_loop(target, draft, layers, args.n, args.spec_draft_n_max,
                                                      args.threads)
        theirs, run = llama_loop(build, target, draft, prompt, args.n, args.spec_draft_n_max, args.threads)
        same = same and llamaloop.compare(rounds, run, tokens).ok
        loops["graphgen"].append(ours)
        loops["llama.cpp"].append(theirs)

    def med(xs, k=None):
        return statistics.median(x[k] for x in xs) if k else statistics.median(xs)

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print("### The loop against llama.cpp's own (b11549)\n")
    print(f"`python tools/bench_loop.py --target {args.target} --draft {args.draft} -n {args.n} --repeat "
          f"{args.repeat} --threads {args.threads} --spec-draft-n-max {args.spec_draft_n_max}` on "
          f"{time.strftime('%Y-%m-%d')}: {cpu}, {os.cpu_count()} cores\n")
    a_l, a_g = med(alone["llama.cpp"]), med(alone["graphgen"])
    print("| work | llama.cpp ms | graphgen ms | ratio |\n|---|---|---|---|")
    print(f"| target alone, per token (llama-completion's wall time) | {a_l:.2f} | {a_g:.2f} | {a_g / a_l:.3f} |")
    a_e = med(alone["eval"])
    print(f"| target alone, per token (llama-completion's eval time) | {a_e:.2f} | {a_g:.2f} | {a_g / a_e:.3f} |")
    for k in ("round", "target", "draft", "inject", "sample", "host"):
        l_, g_ = med(loops["llama.cpp"], k), med(loops["graphgen"], k)
        ratio = f"{g_ / l_:.3f}" if l_ > 0 else "-"
        name = "loop, per round" if k == "round" else f"  of it: {k}"
        print(f"| {name} | {l_:.2f} | {g_:.2f} | {ratio} |")
    print(f"\nrounds identical in both loops: {'yes' if same else 'NO (the per-round times compare different work)'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
