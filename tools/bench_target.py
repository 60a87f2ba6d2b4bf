"""Speculative decoding on a real target, timed: the target alone, with a graphgen draft, with a b11739 draft.

    python tools/bench_target.py [--target smollm2] [--draft DRAFT.gguf] [-n 48] [--repeat 3] [--threads 1]

One process runs the three, taking turns, `--repeat` times, on the same prompts with greedy
sampling; the target is llama.cpp b11739 (a child process) in all three. Prints a markdown section for
BENCHMARKS.md: tokens/s of each and the ratios to the target alone (medians), the time split
(target decodes, draft graphs, feature injection, host loop), the mean acceptance length (1 +
accepted / drafts, as the field counts it), and the memory of the pair: each process's resident
memory and the target file's pages resident in each (PSS counts a page shared by the two
processes half in each, so the file's PSS summed over both is what the pair holds of it). Without
--draft, a random DFlash draft shaped for the target is made (it accepts about nothing, a mean
acceptance length about 1.00, so this times the machinery, not a trained draft's gain); the last
row runs the graphgen draft with each draft replaced by the target's own next tokens, every one
accepted: the most drafting gives here.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphgen.speculative.pair import check_pair  # noqa: E402
from graphgen.reference.session import ReferenceTarget  # noqa: E402
from graphgen.speculative.drafters import DraftParams  # noqa: E402
from graphgen.runtime.model import load  # noqa: E402
from graphgen.speculative.loop import open_drafter, run_speculative  # noqa: E402
from graphgen.speculative.targets import resolve  # noqa: E402
from graphgen.speculative.verifier import TargetVerifier, generate_alone  # noqa: E402

PROMPTS = ["The capital of France is", "Write a short poem about the sea.\n"]


def file_memory(pid: int, path: Path) -> tuple[int, int, int]:
    """(process RSS, the file's resident pages, the file's PSS), bytes, from /proc/PID/smaps."""
    rss = file_rss = file_pss = 0
    current = None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 5 and "-" in parts[0] and ":" in parts[3]:
                    current = parts[5] if len(parts) > 5 else None
                elif parts and parts[0] in ("Rss:", "Pss:"):
                    kb = int(parts[1]) * 1024
                    if parts[0] == "Rss:":
                        rss += kb
                    if current == str(path):
                        if parts[0] == "Rss:":
                            file_rss += kb
                        else:
                            file_pss += kb
    except OSError:
        pass
    return rss, file_rss, file_pss


def _right_tokens(drafter, alone: dict) -> None:
    """The draft graphs still run, but each draft is replaced by the target's own next tokens (known
    from its run alone): every drafted token is accepted, the most drafting can give on this machine."""
    real = drafter.draft

    def draft(reqs):
        out = real(reqs)
        for seq, dp in reqs.items():
            dp.result = alone[seq][dp.pos0 + 1:dp.pos0 + 1 + len(out[seq])]
            out[seq] = list(dp.result)
        return out
    drafter.draft = draft


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--draft", default=None)
    ap.add_argument("-n", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("-np", type=int, default=1)
    a = ap.parse_args()
    target = resolve(a.target)
    tmp = tempfile.mkdtemp(prefix="graphgen-bench-target-")
    if a.draft is None:
        from graphgen.synth import make_model
        a.draft = str(Path(tmp) / "draft.gguf")
        make_model(a.draft, "dflash", target=target, n_layer=1, block_size=8, seed=1)
    draft = Path(a.draft)
    problems = check_pair(target, draft)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    m = load(draft, target=target)
    layers = list(m.hparams.target_layers)
    m.close()
    settings = dict(n_ctx=1024, n_ubatch=64, n_seq=a.np, n_threads=a.threads)
    tg = ReferenceTarget(target, layers, n_ctx=1024, n_batch=256, n_seq=a.np, n_threads=a.threads)
    prompts = {s: tg.tokenize(PROMPTS[s % len(PROMPTS)]) for s in range(a.np)}
    runs = {"target alone": [], "graphgen draft": [], "b11739 draft": [], "graphgen draft, right tokens": []}
    splits = {k: [] for k in runs}
    accept = {}
    same = {}
    mem = {}
    try:
        for r in range(a.repeat):
            for name in runs:
                for s in range(a.np):
                    tg.seq_rm(s, -1, -1)
                if name == "target alone":
                    toks, t = generate_alone(tg, prompts, a.n)
                    n = sum(len(toks[s]) - len(prompts[s]) for s in toks)
                    runs[name].append(n / t)
                    alone = toks
                    continue
                engine = "llama.cpp" if name == "b11739 draft" else "graphgen"
                drafter = open_drafter(draft, None, DraftParams(n_max=None), engine=engine, target=target, tg=tg,
                                       **settings)
                sess = drafter.session
                if name.endswith("right tokens"):
                    _right_tokens(drafter, alone)
                t0 = time.perf_counter()
                res = run_speculative(drafter, [(prompts[s], None) for s in range(a.np)], n_predict=a.n,
                                      verifier=TargetVerifier(tg))
                t = time.perf_counter() - t0
                sm = res.summary()
                runs[name].append(sm["generated_tokens"] / t)
                t_draft = sm["ms_draft_per_round"] * sm["rounds"] / 1e3
                t_inj = sm["ms_process_per_round"] * sm["rounds"] / 1e3
                splits[name].append((res.t_target, t_draft, t_inj, t - res.t_target - t_draft - t_inj, t))
                # the field's mean acceptance length: 1 + accepted / drafts (a draft that never hits: 1.00)
                accept[name] = (sm["mean_acceptance_length"], sm["acceptance_rate"])
                same[name] = all(res.tokens[s] == alone[s] for s in range(a.np))
                if name == "graphgen draft":
                    mem["graphgen"] = (file_memory(os.getpid(), target.resolve()),
                                       file_memory(tg.child.proc.pid, target.resolve()))
                if engine == "llama.cpp":
                    mem["b11739"] = file_memory(tg.child.proc.pid, target.resolve())
                sess.close()
    finally:
        tg.close()
    med = {k: statistics.median(v) for k, v in runs.items()}
    base = med["target alone"]
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print("## Speculative decoding on a real target\n")
    print(f"`python tools/bench_target.py --target {a.target} -n {a.n} --repeat {a.repeat} --threads {a.threads} "
          f"-np {a.np}` on {time.strftime('%Y-%m-%d')}: {cpu}, {os.cpu_count()} cores\n")
    made = a.draft.startswith(tmp)
    print(f"Target {target.name} (llama.cpp b11739, CPU); draft "
          f"{'a random DFlash draft made for the target (1 layer, block 8)' if made else draft.name}; greedy; "
          f"{a.n} tokens per sequence; medians of {a.repeat} runs taking turns.\n")
    print("| run | tokens/s | ratio to the target alone | mean acceptance length | same tokens as the target alone |")
    print("|---|---|---|---|---|")
    for k in runs:
        acc = f"{accept[k][0]:.2f}" if k in accept else "-"
        sm = ("yes" if same[k] else "NO") if k in same else "-"
        print(f"| {k} | {med[k]:.1f} | {med[k] / base:.3f} | {acc} | {sm} |")
    print("\nTime split of a run, seconds (median):\n")
    print("| run | target decodes | draft graphs | injection | host loop | total |")
    print("|---|---|---|---|---|---|")
    for k, v in splits.items():
        if v:
            cols = [statistics.median(x[i] for x in v) for i in range(5)]
            print(f"| {k} | " + " | ".join(f"{c:.2f}" for c in cols) + " |")
    if "graphgen" in mem:
        (p_rss, p_file, p_pss), (c_rss, c_file, c_pss) = mem["graphgen"]
        mb = 1 / 2**20
        print(f"\nMemory with the graphgen draft: graphgen's process {p_rss * mb:.0f} MiB resident, of which "
              f"{p_file * mb:.0f} MiB are pages of the target file (its embeddings, lent to the draft in place); "
              f"the target's process {c_rss * mb:.0f} MiB, {c_file * mb:.0f} MiB of the file. The file's PSS over both: "
              f"{(p_pss + c_pss) * mb:.0f} MiB of a {target.stat().st_size * mb:.0f} MiB file: its pages are held once.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
