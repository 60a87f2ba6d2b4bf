"""`graphgen bench`: graphgen against llama.cpp on the same draft, interleaved in one run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cmd_bench(args) -> int:
    from ..bench import machine_description, multi_seq_scenario, run_bench
    from ..scenario import default_scenario, load_scenario
    from ..runtime.model import load

    if args.scenario:
        base = load_scenario(args.scenario)
    else:
        hp = load(args.model).hparams
        base = default_scenario(block_size=hp.block_size or 4, mask_token=max(hp.mask_token_id, 0),
                                n_prompt=args.prompt)
    if args.threads:
        base.n_threads = args.threads
    engines = args.engines
    results = []
    for n_seq in args.n_seq:
        sc = base if n_seq == 1 else multi_seq_scenario(base, n_seq)

        def progress(done, total, n_seq=n_seq):
            if done == total or done % max(1, total // 5) == 0:
                print(f"  n_seq {n_seq}: {done}/{total} repetitions", file=sys.stderr)
        res = run_bench(args.model, sc, repeat=args.repeat, backend=args.backend, engines=engines, progress=progress)
        results.append((n_seq, res))
        print(res.format_text() if n_seq == 1 else res.format_text().split("\n", 1)[1])
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_description(),
                                               "runs": [dict(r.to_dict(), n_seq=n) for n, r in results]}, indent=1))
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(markdown_section(args, results))
    return 0


def markdown_section(args, results) -> str:
    """A BENCHMARKS.md section for one draft: the command, then one table per n_seq."""
    out = [f"### {Path(args.model).name}", "",
           f"`graphgen bench {Path(args.model).name} --repeat {args.repeat} --n-seq {','.join(map(str, args.n_seq))}"
           + (f" --threads {args.threads}" if args.threads else "") + "`", ""]
    for n_seq, res in results:
        out += [f"n_seq {n_seq}:", "",
                "| step | graphgen ms (median ± IQR) | llama.cpp ms (median ± IQR) | ratio (medians) | ratio (minimums) | fresh build ms |",
                "|---|---|---|---|---|---|"]
        for st, g, l_, r in res.rows():
            gs = f"{g * 1e3:.3f} ± {st.spread('graphgen') * 1e3:.3f}" if g else "-"
            ls = f"{l_ * 1e3:.3f} ± {st.spread('llama.cpp') * 1e3:.3f}" if l_ else "-"
            b = res.build_ms.get(st.label)
            mg, ml = st.best("graphgen"), st.best("llama.cpp")
            mr = f"{mg / ml:.3f}" if mg and ml else "-"
            out.append(f"| {st.label} | {gs} | {ls} | {f'{r:.3f}' if r else '-'} | {mr} | {f'{b:.2f}' if b is not None else '-'} |")
        cb, rss = res.compute_buffer_mib, res.peak_rss_mib
        out += ["", "compute buffer MiB: " + ", ".join(f"{e} {v:.2f}" for e, v in cb.items() if v is not None)
                + "; peak RSS MiB: " + ", ".join(f"{e} {v:.0f}" for e, v in rss.items() if v is not None), ""]
    return "\n".join(out) + "\n"


ENGINES = ("graphgen", "llama.cpp")


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _n_seq(text: str) -> list[int]:
    return [_positive(x.strip()) for x in text.split(",")]


def _engines(text: str) -> tuple[str, ...]:
    engines = tuple(e.strip() for e in text.split(",") if e.strip())
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise argparse.ArgumentTypeError(f"expected graphgen and/or llama.cpp, got {text!r}")
    return engines


def register(sub) -> None:
    p = sub.add_parser("bench", help="time graphgen against llama.cpp on the same draft and scenario")
    p.add_argument("model")
    p.add_argument("--scenario", help="scenario JSON (default: inject --prompt rows, then one block)")
    p.add_argument("--prompt", type=int, default=64, help="inject length of the default scenario")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--repeat", type=_positive, default=20)
    p.add_argument("--threads", type=_positive, default=None, help="override the scenario's n_threads")
    p.add_argument("--engines", type=_engines, default=("graphgen", "llama.cpp"),
                   help="graphgen, llama.cpp or both (default both)")
    p.add_argument("--n-seq", type=_n_seq, default=[1], help="block batches of this many sequences, e.g. 1,4,16")
    p.add_argument("--json", help="write the figures as JSON")
    p.add_argument("--markdown", help="append a table to this Markdown file")
    p.set_defaults(fn=_cmd_bench)
