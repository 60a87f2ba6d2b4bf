"""`graphgen bench`: graphgen against llama.cpp on the same draft, interleaved in one run."""

from __future__ import annotations

import argparse
import json
import sys

from .kvtypes import FA_FLAG, FA_SCENARIO, add_kv_type_flags, apply_to_scenario
from .llamaflags import count_arg


def _cmd_bench(args) -> int:
    from ..bench import ScalePoint, context_scenario, machine_description, multi_seq_scenario, run_bench
    from ..progress import task as progress_task
    from ..speculative.targets import draft_label, resolve_draft
    from .llamaflags import backend_of, model_path, scenario_from_args

    model_path(args)
    # a file, a folder holding draft.gguf, or a shipped draft's name; shown by its name
    args.draft_label = draft_label(args.model)
    args.model = str(resolve_draft(args.model))
    _check_outputs(args)
    args.backend = backend_of(args.backend)
    if args.n_kv and args.scenario:
        raise ValueError("--n-kv builds its own prompts; it cannot be combined with --scenario")
    if not args.scenario and args.n_prompt is None:
        args.n_prompt = DEFAULT_PROMPT
    base = scenario_from_args(args, args.model)
    apply_to_scenario(args, base, FA_FLAG + " or " + FA_SCENARIO)
    # each run: (label, axis, value, scenario); the n_seq runs come first, as the command lists them
    runs = [(f"n_seq {n}", "n_seq", n, base if n == 1 else multi_seq_scenario(base, n)) for n in args.n_seq]
    runs += [(f"n_kv {n}", "n_kv", n, context_scenario(base, n)) for n in args.n_kv or ()]
    results = []
    for label, axis, value, sc in runs:
        # loading both engines, building the graphs and the warm-up runs come before the first repetition
        with progress_task(f"bench {label}") as task:
            task.update("loading the draft, warming up, first repetition")

            def progress(done, total, task=task):
                task.update(f"repetitions {done}/{total}")
            res = run_bench(args.model, sc, repeat=args.repeat, backend=args.backend, engines=args.engines,
                            progress=progress)
        res.model = args.draft_label  # a shipped draft's file, draft.gguf, names none of them
        results.append(ScalePoint(axis, value, res))
        if not args.json:
            print(f"[{label}] " + res.format_text())
    if args.json:
        json.dump({"machine": machine_description(),
                   "runs": [dict(p.result.to_dict(), **{p.axis: p.value}) for p in results]}, sys.stdout, indent=1)
        print()
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(markdown_section(args, results))
    if args.svg:
        from ..bench import scale_svg
        from ..staging import staged_file
        with staged_file(args.svg) as tmp:
            tmp.write_text(scale_svg(results, f"{args.draft_label}: block step time against context "
                                              "length and sequences"))
    return 0


def _check_outputs(args) -> None:
    """--svg and --markdown refused before the runs (minutes), not after them: a folder, a place
    under a file, a --markdown folder that is missing (the tables are appended to a file), and an
    --svg that would replace a file that is no SVG (unless --force)."""
    from ..staging import check_output, is_svg
    if args.svg is not None:
        check_output("--svg", args.svg, is_svg, "an SVG file", args.force)
    if args.markdown is not None:
        check_output("--markdown", args.markdown, new_folder=False)


def markdown_section(args, results) -> str:
    """A BENCHMARKS.md section for one draft: the command, one table per run, then the scale
    tables when the command swept n_seq or n_kv."""
    from ..bench import PHASES, scale_markdown
    cmd = (f"graphgen bench {args.draft_label} --repeat {args.repeat} --n-seq {','.join(map(str, args.n_seq))}"
           + (f" --n-kv {','.join(map(str, args.n_kv))}" if args.n_kv else "")
           + (f" --threads {args.threads}" if args.threads else "")
           + "".join(f" --{k.replace('_', '-')} {getattr(args, k)}"
                     for k in ("flash_attn", "type_kv", "type_k", "type_v") if getattr(args, k, None)))
    out = [f"### {args.draft_label}" + (f", KV cache {args.type_kv}" if args.type_kv else ""), "", f"`{cmd}`", ""]

    def ms(v):
        return f"{v * 1e3:.3f}" if v is not None else "-"
    for pt in results:
        res = pt.result
        out += [f"{pt.axis} {pt.value}:", "",
                "| step | graphgen ms (median ± IQR) | llama.cpp ms (median ± IQR) | ratio (medians) | ratio (minimums) "
                "| graphgen compute / overhead ms | llama.cpp compute / overhead ms | fresh build ms |",
                "|---|---|---|---|---|---|---|---|"]
        for st, g, l_, r in res.rows():
            if pt.axis == "n_kv" and not st.label.startswith("block"):
                continue  # the prompt's chunks are there to fill the cache
            if pt.axis == "n_seq" and pt.value > 4 and st.label.startswith("inject") and not st.label.endswith(" seq0"):
                continue  # one prompt per sequence: the first stands for the rest
            gs = f"{g * 1e3:.3f} ± {st.spread('graphgen') * 1e3:.3f}" if g else "-"
            ls = f"{l_ * 1e3:.3f} ± {st.spread('llama.cpp') * 1e3:.3f}" if l_ else "-"
            b = res.build_ms.get(st.label)
            mg, ml = st.best("graphgen"), st.best("llama.cpp")
            mr = f"{mg / ml:.3f}" if mg and ml else "-"
            out.append(f"| {st.label} | {gs} | {ls} | {f'{r:.3f}' if r else '-'} | {mr} "
                       f"| {ms(st.compute_median('graphgen'))} / {ms(st.overhead_median('graphgen'))} "
                       f"| {ms(st.compute_median('llama.cpp'))} / {ms(st.overhead_median('llama.cpp'))} "
                       f"| {f'{b:.2f}' if b is not None else '-'} |")
        phases = [st for st in res.steps if st.phases and (pt.axis != "n_kv" or st.label.startswith("block"))
                  and not (pt.axis == "n_seq" and pt.value > 4 and st.label.startswith("inject")
                           and not st.label.endswith(" seq0"))]
        if phases:
            out += ["", "graphgen's host overhead by phase, us (median): " + "; ".join(
                st.label + ": " + ", ".join(f"{ph} {st.phase_median(ph) * 1e6:.0f}" for ph in PHASES if st.phases.get(ph))
                for st in phases)]
        cb, rss = res.compute_buffer_mib, res.peak_rss_mib
        out += ["", "compute buffer MiB: " + ", ".join(f"{e} {v:.2f}" for e, v in cb.items() if v is not None)
                + "; peak RSS MiB: " + ", ".join(f"{e} {v:.0f}" for e, v in rss.items() if v is not None), ""]
    if len(results) > 1:
        out.append(scale_markdown(results))
    return "\n".join(out) + "\n"


ENGINES = ("graphgen", "llama.cpp")


_positive = count_arg(1)


def _n_seq(text: str) -> list[int]:
    return [_positive(x.strip()) for x in text.split(",")]


def _n_kv(text: str) -> list[int]:
    out = [_positive(x.strip()) for x in text.split(",")]
    bad = [n for n in out if n % 256]
    if bad:
        raise argparse.ArgumentTypeError(f"n_kv is padded to multiples of 256 cells; got {bad[0]}")
    return out


def _engines(text: str) -> tuple[str, ...]:
    if text.strip() == "both":
        return tuple(ENGINES)
    engines = tuple(e.strip() for e in text.split(",") if e.strip())
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise argparse.ArgumentTypeError(f"expected graphgen and/or llama.cpp (a comma list), or both, got {text!r}")
    return engines


class _Deprecated(argparse.Action):
    """--engines, bench's old spelling: still taken, with one line saying the new one."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"graphgen: {option_string} is deprecated: use --engine (the same comma list)", file=sys.stderr)
        setattr(namespace, self.dest, values)


DEFAULT_PROMPT = 64  # the inject bench times without --scenario


def register(sub) -> None:
    from .llamaflags import add_context_flags, add_device, add_model
    p = sub.add_parser("bench", help="time graphgen against llama.cpp on the same draft and scenario")
    add_model(p)
    add_context_flags(p, parallel=False, default_prompt=DEFAULT_PROMPT)
    add_device(p)
    p.add_argument("--repeat", type=_positive, default=20, help="timed repetitions of each step (default 20)")
    p.add_argument("--engine", dest="engines", type=_engines, default=("graphgen", "llama.cpp"), metavar="E[,E]",
                   help="the engines to time: graphgen, llama.cpp, or both (graphgen,llama.cpp) (default both)")
    p.add_argument("--engines", dest="engines", type=_engines, action=_Deprecated, help=argparse.SUPPRESS)
    p.add_argument("-np", "--n-seq", dest="n_seq", type=_n_seq, default=[1],
                   help="block batches of this many sequences, e.g. 1,4,16 (default 1)")
    add_kv_type_flags(p, fa_hint=FA_FLAG)
    p.add_argument("--n-kv", type=_n_kv, default=None, metavar="N,...",
                   help="also time the block after a prompt filling the cache to N cells (multiples of 256), "
                        "e.g. 256,1024,4096,8192: how a step grows with context")
    p.add_argument("--json", action="store_true", help="print the figures as JSON on stdout instead of tables")
    p.add_argument("--markdown", help="append the tables to this Markdown file")
    p.add_argument("--svg", help="write a plot of the block step against n_seq and n_kv (SVG)")
    p.add_argument("--force", action="store_true", help="replace --svg even when it is not an SVG file "
                                                        "(default: refused)")
    p.set_defaults(fn=_cmd_bench)
    from .mmapflag import add_mmap_flag
    add_mmap_flag(p)  # --no-mmap
