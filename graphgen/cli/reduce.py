"""reduce: a failure shrunk to the smallest draft and scenario that keep it, as a repro folder."""

from __future__ import annotations

import json
from pathlib import Path


def _cmd_reduce(args) -> int:
    from .. import progress
    from ..libload import custom_llama_dir
    from ..reduce import Mode, write_repro
    from ..reduce import reduce as run_reduce
    from ..reduce.case import load_case
    from ..staging import check_output
    given = [f for f, v in (("--settings", args.settings), ("-m", args.model_flag),
                            ("--hf-settings", args.hf_settings), ("--checkpoint", args.checkpoint)) if v is not None]
    if len(given) != 1:
        raise ValueError("reduce takes the draft one way: make-model settings (--settings FILE), a GGUF (-m FILE), "
                         "an authors' checkpoint's settings (--hf-settings FILE) or an authors' checkpoint "
                         "(--checkpoint DIR)" + (f"; got {' and '.join(given)}" if given else ""))
    if args.model_flag is not None and not Path(args.model_flag).is_file():
        raise FileNotFoundError(f"{args.model_flag}: no such draft file")
    if args.checkpoint is not None and not (Path(args.checkpoint) / "config.json").is_file():
        raise FileNotFoundError(f"{args.checkpoint}: no config.json: not a checkpoint folder")
    for flag, path in (("--settings", args.settings), ("--hf-settings", args.hf_settings), ("--scenario", args.scenario)):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {path}: no such file")
    hf = args.hf_settings is not None or args.checkpoint is not None
    if hf and args.backends:
        raise ValueError("-dev compares two backends on a GGUF draft; an authors' checkpoint is reduced against "
                         "graphgen check (the authors' model, llama.cpp and graphgen)")
    from .extras import torch_need
    if torch_need(args):
        from ..authors import require_torch
        require_torch()
    out = Path(args.out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise ValueError(f"--out {out}: exists and is not an empty folder; give a new folder")
    check_output("--out", out / "failure.json")
    case = load_case(args.hf_settings if hf else args.settings, args.checkpoint if hf else args.model_flag,
                     args.scenario, format="hf" if hf else "gguf")
    backends = None
    if args.backends:
        from .llamaflags import backend_of
        names = [backend_of(b) for b in args.backends.split(",") if b.strip()]
        if len(names) != 2:
            raise ValueError("-dev takes the two backends to compare, e.g. -dev CPU,Vulkan0")
        backends = (names[0], names[1])
    llama = custom_llama_dir()
    mode = Mode(backends=backends, llama_dir=None if llama is None else str(llama), nmse=args.nmse, check=hf)
    if args.max_tries < 1:
        raise ValueError(f"--max-tries must be at least 1, got {args.max_tries}")
    res = run_reduce(case, mode, progress=progress.note, max_tries=args.max_tries, timeout=args.timeout)
    summary = write_repro(out, res, mode, progress=progress.note, timeout=args.timeout)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{summary['described']}\n")
        print(f"reduced in {summary['tries']} tries, {summary['seconds']} s"
              + ("" if summary["complete"] else f" (stopped at --max-tries {args.max_tries})"))
        for k, after in summary["after"].items():
            before = summary["before"].get(k, "-")
            print(f"  {k:14s} {before!s:>12} -> {after}")
        if summary["draft_bytes"]:
            print(f"  {summary['draft']:14s} {summary['draft_bytes']} bytes")
        print(f"\nrepro in {out}/ (rerun from there: it fails the same way); its commands:")
        for c in summary["commands"]:
            print(f"  {c}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("reduce", help="shrink a failure (graphgen against llama.cpp, two backends, or an authors' "
                                      "checkpoint in graphgen check) to the smallest draft and scenario that keep "
                                      "it, and write a repro folder")
    p.add_argument("--settings", metavar="FILE", default=None,
                   help="the draft as make-model settings: JSON of make_model's arguments, or a case.json "
                        "holding them under \"make_model\" (these drafts are reduced: layers, heads, sizes, "
                        "vocabulary, block, target layers, options, weight type)")
    p.add_argument("-m", "--model", dest="model_flag", metavar="GGUF", default=None,
                   help="the draft as a GGUF, kept whole (only its scenario is reduced)")
    p.add_argument("--hf-settings", metavar="FILE", default=None,
                   help="an authors' checkpoint as make_hf's settings (HFSpec's fields, alone or under \"make_hf\"), "
                        "reduced as --settings is; the failure is graphgen check's (needs graphgen[torch])")
    p.add_argument("--checkpoint", metavar="DIR", default=None,
                   help="an authors' checkpoint folder, kept whole (only its scenario is reduced); the failure is "
                        "graphgen check's (needs graphgen[torch])")
    p.add_argument("--scenario", metavar="FILE", default=None,
                   help="the scenario that fails (default: the settings file's \"scenario\", when it has one; for "
                        "an authors' checkpoint, graphgen check's default scenario)")
    p.add_argument("-dev", "--device", "--backends", dest="backends", metavar="A,B", default=None,
                   help="compare these two backends (xdiff) instead of graphgen against llama.cpp "
                        "(--llama DIR picks the llama.cpp build)")
    p.add_argument("--nmse", type=float, default=None,
                   help="the NMSE bound the comparison uses (default: diff's per-type bounds, xdiff's per-op ones)")
    p.add_argument("--out", required=True, help="the repro folder to write (a new or empty folder)")
    p.add_argument("--max-tries", type=int, default=300, help="stop after this many smaller cases (default 300)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one side's run may take (default 600)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(fn=_cmd_reduce)


