#!/usr/bin/env python3
"""Peak memory and wall time of graphgen's commands, graphgen's engine against llama.cpp's.

Each command (dump, draft, bench) runs as a child process once per engine and repetition, the
engines taking turns. Memory is counted over the child's whole process tree, as top would show
it: the llama.cpp engine computes in a grandchild (b11739 in its own process), so its figure is
that process plus graphgen's parent. A sampler reads every process of the tree every 20
milliseconds and keeps the largest sum of their resident memory, each page shared between them
(a weight mapped by both bench processes) counted once: the sum of their Pss, which for one
process is its RSS. Each process's VmHWM (the kernel's own peak RSS) is kept too, and the tree's
peak is the larger of the sampled sum and the largest single VmHWM, so a peak between two samples
is still seen when one process holds it. A run that exits non-zero or where nothing could be
sampled is an error, never a row.

    python tools/memory.py                                  # realistic f16 and q8_0, and a 4 GB draft
    python tools/memory.py --repeat 3 --markdown BENCHMARKS.md
    python tools/memory.py --drafts q8_0 --commands dump --json

Drafts are made in --work (a temporary folder by default, removed afterwards); the 4 GB one
(the realistic preset with --layers 39, f16) is made only when the disk has room for it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("graphgen", "llama.cpp")
COMMANDS = ("dump", "draft", "bench")
DRAFTS = {  # name -> make-model flags
    "f16": ["--preset", "realistic", "--wtype", "f16"],
    "q8_0": ["--preset", "realistic", "--wtype", "q8_0"],
    "4gb": ["--preset", "realistic", "--wtype", "f16", "--layers", "39"],
}
BIG_BYTES = 4_100_000_000     # what the 4 GB draft takes on disk, for the room check
MARK_START, MARK_END = "<!-- memory.py:start -->", "<!-- memory.py:end -->"


class MeasureError(RuntimeError):
    pass


def graphgen_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("graphgen")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "graphgen.cli"]


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (status) and Pss (smaps_rollup) of a process, KiB."""
    out = {}
    for name, keys in (("status", ("VmRSS:", "VmHWM:")), ("smaps_rollup", ("Pss:",))):
        try:
            with open(f"/proc/{pid}/{name}") as f:
                for line in f:
                    if line.startswith(keys):
                        out[line.split(":")[0]] = int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return out


def _tree(pid: int) -> list[int]:
    """pid and its descendants, from /proc/<pid>/task/*/children."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return seen


def run_measured(argv: list[str], period: float = 0.02) -> dict:
    """Run argv; return wall seconds, the tree's peak RSS (KiB) and how it was seen."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    peak_pss, peak_rss, hwm, samples, pids = 0, 0, {}, 0, set()
    done = threading.Event()

    def sample():
        nonlocal peak_pss, peak_rss, samples
        while not done.is_set():
            pss = rss = 0
            for p in _tree(proc.pid):
                st = _status(p)
                if "VmRSS" in st and "Pss" in st:
                    pss += st["Pss"]
                    rss += st["VmRSS"]
                    hwm[p] = max(hwm.get(p, 0), st.get("VmHWM", 0))
                    pids.add(p)
            if pss:
                samples += 1
                peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
            done.wait(period)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise MeasureError(f"{' '.join(argv)} exited {proc.returncode}: {' / '.join(tail)}")
    if not samples:
        raise MeasureError(f"{' '.join(argv)}: no memory sample was taken (it ran {wall:.3f} s)")
    return {"wall_s": wall, "peak_rss_kib": max(peak_pss, max(hwm.values())), "sampled_pss_sum_kib": peak_pss,
            "sampled_rss_sum_kib": peak_rss, "max_process_hwm_kib": max(hwm.values()), "processes": len(pids),
            "samples": samples}


def command_argv(cmd: str, engine: str, model: Path, work: Path, args) -> list[str]:
    g = graphgen_cmd() + ["--quiet"]
    if cmd == "dump":
        out = work / f"dump-{engine}"
        shutil.rmtree(out, ignore_errors=True)
        return g + ["dump", str(model), "--scenario", str(work / "scenario.json"), "--out", str(out),
                    "--engine", engine]
    if cmd == "draft":
        return g + ["draft", str(model), "--prompt-tokens", "1,2,3,4,5,6,7,8", "--n-predict", str(args.n_predict),
                    "--engine", engine, "--threads", str(args.threads)]
    return g + ["bench", str(model), "--engine", engine, "--repeat", str(args.bench_repeat), "--prompt", "64",
                "--threads", str(args.threads)]


def write_scenario(path: Path, threads: int) -> None:
    # inject 5 target rows, then one noise block of the realistic draft's 16
    path.write_text(json.dumps({
        "n_ctx": 256, "n_ubatch": 64, "flash_attn": "off", "type_kv": "f16", "seed": 1, "n_threads": threads,
        "steps": [{"inject": {"n_tokens": 5, "pos0": 0}},
                  {"block": {"tokens": [7] + [255] * 15, "pos0": 5}}]}, indent=1))


def make_draft(name: str, work: Path) -> Path:
    path = work / f"realistic-{name}.gguf"
    if not path.exists():
        subprocess.run(graphgen_cmd() + ["--quiet", "make-model", str(path), "--variant", "dflash"] + DRAFTS[name],
                       check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return path


def measure(args) -> list[dict]:
    own_work = args.work is None
    work = Path(args.work or tempfile.mkdtemp(prefix="graphgen-memory."))
    work.mkdir(parents=True, exist_ok=True)
    write_scenario(work / "scenario.json", args.threads)
    rows = []
    try:
        for name in args.drafts:
            if name == "4gb" and shutil.disk_usage(work).free < BIG_BYTES + (1 << 30):
                raise MeasureError(f"{work}: not enough free disk for the 4 GB draft "
                                   f"({shutil.disk_usage(work).free / 1e9:.1f} GB free); leave it out with --drafts")
            model = make_draft(name, work)
            size = model.stat().st_size
            with open(model, "rb") as f:  # into the page cache: no engine pays for reading the disk
                while f.read(64 << 20):
                    pass
            for cmd in args.commands:
                runs = {e: [] for e in ENGINES}
                for rep in range(args.repeat):
                    order = ENGINES if rep % 2 == 0 else ENGINES[::-1]
                    for engine in order:
                        r = run_measured(command_argv(cmd, engine, model, work, args))
                        runs[engine].append(r)
                        print(f"{name} {cmd} {engine} #{rep + 1}: {r['wall_s']:.2f} s, "
                              f"{r['peak_rss_kib'] / 1024:.0f} MiB ({r['processes']} processes, "
                              f"{r['samples']} samples)", file=sys.stderr)
                rows.append({"draft": model.name, "file_mb": size / 1e6, "command": cmd, "runs": runs})
            if name == "4gb":
                model.unlink()
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def summary(row: dict) -> dict:
    out = {}
    for e in ENGINES:
        runs = row["runs"][e]
        out[e] = {"rss_mib": max(r["peak_rss_kib"] for r in runs) / 1024,
                  "wall_s": statistics.median(r["wall_s"] for r in runs),
                  "wall_min_s": min(r["wall_s"] for r in runs),
                  "wall_max_s": max(r["wall_s"] for r in runs)}
    g, ll = out["graphgen"], out["llama.cpp"]
    out["rss_ratio"] = g["rss_mib"] / ll["rss_mib"]
    out["wall_ratio"] = g["wall_s"] / ll["wall_s"]
    return out


def machine() -> str:
    sys.path.insert(0, str(ROOT))
    from graphgen.bench import machine_description
    return machine_description()


def markdown(rows: list[dict], args) -> str:
    lines = [MARK_START, "## Memory: peak RSS and wall time per command", "", machine(), "",
             f"Generated by `python tools/memory.py` on {time.strftime('%Y-%m-%d')}; "
             "each command run as a child process, once per engine and repetition, the engines taking turns. "
             "Peak RSS is the whole process tree's (llama.cpp computes in a child of graphgen's process, both "
             "counted, a page both map once: the sum of their Pss), the largest over the repetitions; wall time is the median (min-max) of the whole "
             "command, start-up and loading included, each draft read into the page cache first. "
             "Ratio = graphgen / llama.cpp. Weights are mapped in "
             "both engines (llama.cpp's default and graphgen's; `--no-mmap` copies them in either). "
             f"dump: inject 5 + block 16; draft: `--n-predict {args.n_predict}`; bench: "
             f"`--repeat {args.bench_repeat} --prompt 64`; `--threads {args.threads}`. `bench --engine llama.cpp` "
             "keeps graphgen's session in its own process (it times graphgen's graph building), so that tree holds "
             "both engines.", "",
             "| draft | file MB | command | runs | graphgen peak RSS MiB | llama.cpp peak RSS MiB | RSS ratio "
             "| graphgen wall s | llama.cpp wall s | wall ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        s = summary(row)
        g, ll = s["graphgen"], s["llama.cpp"]
        lines.append(f"| {row['draft']} | {row['file_mb']:.0f} | {row['command']} | {len(row['runs']['graphgen'])} "
                     f"| {g['rss_mib']:.0f} "
                     f"| {ll['rss_mib']:.0f} | {s['rss_ratio']:.3f} "
                     f"| {g['wall_s']:.2f} ({g['wall_min_s']:.2f}-{g['wall_max_s']:.2f}) "
                     f"| {ll['wall_s']:.2f} ({ll['wall_min_s']:.2f}-{ll['wall_max_s']:.2f}) | {s['wall_ratio']:.3f} |")
    lines.append(MARK_END)
    return "\n".join(lines) + "\n"


def put_section(path: Path, section: str) -> None:
    """Replace the tool's section of the file (or append it), through a temporary file."""
    sys.path.insert(0, str(ROOT))
    from graphgen.staging import staged_file
    text = path.read_text() if path.exists() else ""
    if MARK_START in text and MARK_END in text:
        a, b = text.index(MARK_START), text.index(MARK_END) + len(MARK_END)
        text = text[:a] + section.rstrip("\n") + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with staged_file(path) as tmp:
        tmp.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafts", default="f16,q8_0,4gb", help="f16, q8_0, 4gb, comma-separated (default: all three)")
    ap.add_argument("--commands", default=",".join(COMMANDS), help="dump, draft, bench (default: all three)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per engine and command (default 3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="compute threads (default: all cores)")
    ap.add_argument("--n-predict", type=int, default=32, help="draft: tokens to generate (default 32)")
    ap.add_argument("--bench-repeat", type=int, default=3, help="bench: its --repeat (default 3)")
    ap.add_argument("--work", help="folder for the drafts and dumps (default: a temporary one, removed after)")
    ap.add_argument("--markdown", help="put the table into this file (its memory section replaced)")
    ap.add_argument("--json", action="store_true", help="print every run as JSON on stdout")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="measure nothing: make the table from earlier --json outputs, their rows in order")
    args = ap.parse_args(argv)
    if args.from_json:
        rows = [r for f in args.from_json for r in json.loads(Path(f).read_text())]
        if not rows:
            print("memory.py: error: no rows in " + ", ".join(args.from_json), file=sys.stderr)
            return 1
        print(markdown(rows, args))
        if args.markdown:
            put_section(Path(args.markdown), markdown(rows, args))
        return 0
    args.drafts = [d for d in args.drafts.split(",") if d]
    args.commands = [c for c in args.commands.split(",") if c]
    bad = [d for d in args.drafts if d not in DRAFTS] + [c for c in args.commands if c not in COMMANDS]
    if bad or args.repeat < 1:
        print(f"memory.py: error: unknown draft or command {bad[0]!r}" if bad else
              "memory.py: error: --repeat must be at least 1", file=sys.stderr)
        return 2
    try:
        rows = measure(args)
    except (MeasureError, subprocess.CalledProcessError) as e:
        print(f"memory.py: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([dict(r, summary=summary(r)) for r in rows], indent=1))
    else:
        print(markdown(rows, args))
    if args.markdown:
        put_section(Path(args.markdown), markdown(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
