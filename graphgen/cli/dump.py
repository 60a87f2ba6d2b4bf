"""`graphgen dump` and `graphgen diff`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..compare.pairing import diff_paths
from ..compare.report import exit_code
from ..compare.rules import RulesError
from ..compare.nodefilter import FilterError
from ..compare.probe import ProbeError
from ..dump.format import DumpError
from .kvtypes import add_kv_type_flags, apply_to_scenario


def _cmd_dump(args) -> int:
    from .. import progress
    from ..staging import staged_dump_dir
    from .llamaflags import backend_of, model_path, scenario_from_args
    model = model_path(args)
    args.backend = backend_of(args.backend)
    if args.engine == "torch":
        from ..play.scenario import load_scenario
        from .authors import _cmd_dump_torch
        if not args.scenario:
            raise ValueError("--engine torch runs a --scenario file (or --scenario-from a dump)")
        sc = load_scenario(args.scenario)
        apply_to_scenario(args, sc)
        return _cmd_dump_torch(args, sc)
    if args.model_draft is not None:
        if args.target is not None:
            raise ValueError("-m names the target with -md; drop --target")
        return _dump_on_target(args)
    given = [f for f, v in (("-p", args.prompt_text), ("-f", args.file), ("-n", args.n_predict), ("--temp", args.temp),
                            ("--target-seed", args.target_seed)) if v is not None]
    if given:
        raise ValueError(f"{given[0]} applies to a run on a real target: give -m TARGET -md DRAFT")
    # a file, a folder holding draft.gguf, or a shipped draft's name
    from ..speculative.targets import draft_label, resolve_draft
    label = draft_label(model)
    model = args.model = str(resolve_draft(model))
    sc = scenario_from_args(args, model)
    if args.scenario:
        # the document was read again: its relative paths are still the scenario's folder's, not the cwd's
        from ..play.scenario import scenario_folder
        sc.features_base = scenario_folder(args.scenario)
    apply_to_scenario(args, sc)
    if args.target is not None:
        # the target GGUF lending a draft without them its embeddings and lm head (ctx_other)
        from ..speculative.targets import resolve
        lender = resolve(args.target)
        if not lender.is_file():
            raise FileNotFoundError(f"{lender}: no such target model file (--target)")
        sc.target = str(lender.resolve())
    from ..play.scenario import load_scenario
    if args.engine == "llama.cpp" and args.backend != "cpu":
        raise ValueError("the llama.cpp reference runs on the CPU; drop -dev/--backend or use --engine graphgen")
    out = Path(args.out)
    # the dumps land in OUT only when every graph is done: a failed or interrupted run leaves
    # OUT as it was
    with staged_dump_dir(out) as tmp:
        # OUT keeps a copy of the recorded features the dumps' scenario names, to rerun from anywhere
        sc.keep_in(tmp)
        if args.engine == "llama.cpp":
            from ..reference.runner import run_reference
            scenario_path = args.scenario
            # the reference reads a scenario file: given the file unchanged, that one; else the one
            # the flags made, beside the features copy it names
            if not args.scenario or sc.to_dict() != load_scenario(args.scenario).to_dict():
                scenario_path = tmp / ".scenario.json"
                scenario_path.write_text(json.dumps(sc.to_dict()))
            # the dumps name the user's file (or dump), as graphgen's engine does, not this copy
            paths = run_reference(model, scenario_path, tmp, args.max_data, announce_dir=out,
                                  recorded_as=args.scenario)
            if scenario_path != args.scenario:
                scenario_path.unlink()
        else:
            from ..play.engine import run_scenario
            n = len([s for s in sc.steps if s.kind != "seq_rm"])
            done = [0]
            with progress.task(f"dump {label}") as task:
                def on_step(step):
                    if step.kind != "seq_rm":
                        done[0] += 1
                        task.update(f"graph {done[0]} of {n}: {step.kind} (step {step.index})")
                paths = [p for _, _, p in run_scenario(model, sc, tmp, args.max_data, on_step,
                                                       backend=args.backend, scenario_path=args.scenario)]
    for p in paths:
        p = out / Path(p).name
        with open(p) as f:
            doc = json.load(f)
        print(f"{p}: {doc['graph']}, {len(doc['nodes'])} nodes")
    return 0


def _dump_on_target(args) -> int:
    """-m TARGET -md DRAFT: the speculative loop on the real target is recorded as a scenario (with
    the target's features), then replayed by the chosen engine, dumping every draft graph."""
    from ..staging import staged_dump_dir
    from ..speculative.targets import draft_label, resolve, resolve_draft
    from .llamaflags import backend_of
    if args.scenario:
        raise ValueError("-md records its own scenario on the target; drop --scenario")
    if args.n_predict is None:
        args.n_predict = 16
    target = resolve(args.model)
    if not target.is_file():
        raise FileNotFoundError(f"{target}: no such target model file")
    draft, label = resolve_draft(args.model_draft), draft_label(args.model_draft)
    out = Path(args.out)
    with staged_dump_dir(out) as tmp:
        from .. import progress
        with progress.task(f"dump {label} on {target.name}") as task:
            task.update("drafting on the target")
            scenario_path = _record(args, target, draft, label, tmp)
            task.update("replaying the draft's graphs")
            from ..play.scenario import load_scenario
            sc = load_scenario(scenario_path)
            if args.engine == "llama.cpp":
                from ..reference.runner import run_reference
                paths = run_reference(draft, scenario_path, tmp, args.max_data, announce_dir=out,
                                      recorded_as=None)
            else:
                from ..play.engine import run_scenario
                paths = [p for _, _, p in run_scenario(draft, sc, tmp, args.max_data, backend=backend_of(args.backend),
                                                       scenario_path=None)]
    n = len(paths)
    print(f"{out}: {n} graphs of {label} on the features of {target.name} (the scenario: "
          f"{out / scenario_path.name}; rerun it: graphgen dump {draft} --scenario {out} --engine ENGINE --out DIR)")
    return 0


def _record(args, target, draft, label, folder):
    """record_run, with the pair check's lines naming the draft as the user gave it."""
    from ..errors import PairError
    from .generate import record_run
    from .model import relabel_pair
    try:
        return record_run(args, target, draft, folder)
    except PairError as e:
        raise PairError(relabel_pair(e.problems, target, draft, label)) from None


# ---- diff -------------------------------------------------------------------------------------

def _nmse_arg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number, got {text}")
    return v


def add_diff_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("ref", nargs="?", default=None, help="reference dump file or folder (usually llama.cpp's)")
    parser.add_argument("ours", nargs="?", default=None, help="dump file or folder to check (usually graphgen's)")
    parser.add_argument("--nmse", type=_nmse_arg, default=None,
                        help="NMSE threshold for float nodes (default: per type, f32 1e-7); "
                             "integer nodes always compare exactly")
    parser.add_argument("--rules", metavar="FILE", default=None,
                        help="equivalence rules (JSON) that explain known structural differences")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_filter_args(parser)
    parser.add_argument("--at", metavar="NODE", action="append", default=[],
                        help="show where NODE's values differ: its largest errors (flat index, "
                             "[i0, i1, i2, i3], both values), both sides around the worst one, and "
                             "stats; NODE is a name, a ref index (12 or #12) or ours#12; repeatable "
                             "(default: none)")
    parser.add_argument("--layers", action="store_true",
                        help="print the per-layer strip even when every value agrees (default: only "
                             "when some value differs; --json always has it)")
    add_local_args(parser)
    return parser


def add_local_args(parser: argparse.ArgumentParser) -> None:
    """--local / --weights, shared by diff and xdiff."""
    parser.add_argument("--local", action="store_true",
                        help="also each node's own error: every node of OURS re-run alone on REF's values of "
                             "its sources, on the backend that computed it, against REF's output (default: off)")
    parser.add_argument("--weights", metavar="GGUF", default=None,
                        help="with --local: the model OURS ran, for the weights its nodes read (default: the "
                             "dump's model file, found by name and sha256 beside the dumps or here)")


def add_filter_args(parser: argparse.ArgumentParser) -> None:
    """-o / --name / --thresholds, shared by diff and xdiff."""
    parser.add_argument("-o", "--op", dest="ops", metavar="OP", action="append", default=[],
                        help="compare only nodes of this op (e.g. MUL_MAT; comma-separated or "
                             "repeated; default: every op)")
    parser.add_argument("--name", dest="names", metavar="REGEX", action="append", default=[],
                        help="compare only nodes whose name matches (repeatable: any of them; "
                             "default: every node)")
    parser.add_argument("--thresholds", metavar="FILE", default=None,
                        help="NMSE bound per op or type, JSON like {\"MUL_MAT\": 5e-4, \"f16\": 1e-5, "
                             "\"default\": 1e-7}: op first, then type, then default (default: none, "
                             "--nmse or the per-type bounds)")


def filter_options(args) -> dict:
    """The filter flags as diff_paths / xdiff take them."""
    from ..compare.nodefilter import NodeFilter, load_thresholds
    return {"select": NodeFilter.build(args.ops, args.names),
            "per_op": load_thresholds(args.thresholds) if args.thresholds else None}


def run_diff(args: argparse.Namespace) -> int:
    """Diff two sides (dump folders, dump files, or eval-callback / ggml dot / GGML_SCHED_DEBUG
    files, compared on the fields they show) and print the report; 0 identical, 1 diverged or a
    graph without a partner, 2 bad input (one line on stderr)."""
    from .. import progress
    # graph k of n on stderr once a diff runs past a couple of seconds (the realistic draft's
    # takes about 9 s); --quiet turns it off, and stdout keeps only the report
    with progress.task("diff") as task:
        def report(k, n, name, detail):
            task.update(f"graph {k} of {n}: {name}" + (f", {detail}" if detail else ""))
        try:
            if _torch_side(args.ref) or _torch_side(args.ours):
                return _authors_diff(args)
            from ..compare.probe import parse_target
            if args.weights is not None and not args.local:
                raise DumpError("--weights is read only with --local")
            results = diff_paths(args.ref, args.ours, nmse=args.nmse, rules_path=args.rules, progress=report,
                                 at=[parse_target(a) for a in args.at], show_layers=args.layers,
                                 local=args.local, model=args.weights, **filter_options(args))
        except (DumpError, RulesError, ProbeError, FilterError) as e:
            print(f"graphgen: error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
    code = exit_code(results)
    from ..compare.report import local_unmeasured
    unmeasured = local_unmeasured([r.local for r in results if r.local is not None]) if args.local else None
    if unmeasured:
        code = 2
    if args.json:
        print(json.dumps({"identical": code == 0, "results": [r.to_dict() for r in results],
                          "warnings": sorted({w for r in results for w in r.warnings}),
                          "unpaired": [{"side": r.unpaired, "graph": r.graph,
                                        "path": r.ref_path if r.unpaired == "ref" else r.ours_path}
                                       for r in results if r.unpaired]}, indent=1))
    elif getattr(args, "quiet", False):
        # the verdict alone; the report's warnings still reach stderr
        for w in sorted({w for r in results for w in r.warnings}):
            print(f"graphgen: warning: {w}", file=sys.stderr)
        print(_verdict(results))
    elif args.at:
        # what was asked for, not under the whole report: each graph's probes, then the verdict
        from ..compare.probe import format_probe
        for r in results:
            if r.probes:
                print(f"graph-diff [{r.graph}]  ref: {r.ref_path or '-'}  ours: {r.ours_path or '-'}")
                for pr in r.probes:
                    print("\n".join(format_probe(pr)) + "\n")
        print(_verdict(results))
    else:
        print("\n\n".join(r.format_text() for r in results))
        if len(results) > 1:
            print("\n" + _verdict(results))
    if unmeasured:
        print(f"graphgen: error: {unmeasured}", file=sys.stderr)
    return code


def _verdict(results) -> str:
    """One line: how many graphs were compared and how many diverged (one graph: its result)."""
    paired = [r for r in results if not r.unpaired]
    lone = [r for r in results if r.unpaired]
    if len(results) == 1 and paired:
        r = paired[0]
        return f"1 graph compared ({r.graph}): {r.status}" + (f" (only the nodes {r.selection})" if r.selection else "")
    n_bad = sum(not r.identical for r in paired)
    line = f"{len(paired)} graphs compared, {n_bad} diverged"
    if lone:
        line += ", no partner for " + ", ".join(
            f"{r.unpaired} {Path(r.ref_path if r.unpaired == 'ref' else r.ours_path).name}" for r in lone)
    return line


def _torch_side(path) -> bool:
    """Whether a diff side holds the authors' model's dumps (compared by relative error, not node
    for node)."""
    from ..dump.format import dump_files
    p = Path(path)
    files = dump_files(p) if p.is_dir() else [p] if p.suffix == ".json" and p.is_file() else []
    for f in files[:1]:
        try:
            return json.loads(f.read_text()).get("source", {}).get("engine") == "torch"
        except (OSError, ValueError, AttributeError):
            return False
    return False


def _authors_diff(args) -> int:
    from ..authors.compare import compare_paths
    if args.rules:
        raise DumpError("--rules: the authors' comparison pairs mapped nodes by the tensor map, not by rules")
    band = None if args.nmse is None else args.nmse ** 0.5
    res = compare_paths(args.ref, args.ours, band=band)
    if args.json:
        print(json.dumps(res.to_dict(), indent=1))
    else:
        print(res.format_text())
    return 0 if res.agree else 1


def _cmd_diff(args) -> int:
    if args.model_draft is not None or args.target_model is not None:
        return _diff_on_target(args)
    if args.ref is None or args.ours is None:
        raise ValueError("diff takes two dumps (REF OURS), or -m TARGET -md DRAFT -p TEXT to run both engines")
    return run_diff(args)


def _diff_on_target(args) -> int:
    """-m TARGET -md DRAFT: record the loop on the target once, replay its draft graphs in b11739 and in
    graphgen, and diff them (the dumps go to --keep DIR, else a temporary folder)."""
    import contextlib
    import shutil
    import tempfile

    from ..play.engine import run_scenario
    from ..reference.runner import STDERR_LOG, run_reference
    from ..play.scenario import load_scenario
    from ..staging import staged_dump_dir
    from ..speculative.targets import draft_label, resolve, resolve_draft
    if args.target_model is None or args.model_draft is None:
        raise ValueError("a diff on a target takes both -m TARGET and -md DRAFT")
    if args.ref is not None or args.ours is not None:
        raise ValueError("-m/-md make both dumps; give no REF/OURS")
    target = resolve(args.target_model)
    if not target.is_file():
        raise FileNotFoundError(f"{target}: no such target model file")
    draft = resolve_draft(args.model_draft)
    for k, v in (("n_parallel", None), ("n_ubatch", None), ("n_ctx", None), ("threads", None),
                 ("flash_attn", None), ("type_k", None), ("type_v", None), ("type_kv", None)):
        setattr(args, k, getattr(args, k, v))
    keep = Path(args.keep) if args.keep else None
    with contextlib.ExitStack() as stack:
        # --keep DIR: DIR/ref and DIR/ours are checked before anything runs (a file, or a folder of
        # other NN-*.json, is refused) and filled only once both engines are done, as dump --out
        staged = [Path(stack.enter_context(staged_dump_dir(keep / side))) for side in ("ref", "ours")] \
            if keep is not None else None
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="graphgen-diff-")))
        (root / "ours").mkdir()
        scenario_path = _record(args, target, draft, draft_label(args.model_draft), root / "ours")
        sc = load_scenario(scenario_path)
        run_scenario(draft, sc, root / "ours", args.max_data)
        # llama.cpp's stderr is kept beside kept dumps, and named there; without --keep it would
        # go with the temporary folder (a failure's error carries it all the same)
        run_reference(draft, scenario_path, root / "ref", args.max_data, recorded_as=None,
                      stderr_log=STDERR_LOG if keep is not None else None,
                      announce_dir=keep / "ref" if keep is not None else None)
        if keep is None:
            args.ref, args.ours = str(root / "ref"), str(root / "ours")
            code = run_diff(args)
            if code != 0:
                # the report names files of the temporary folder, which goes with this command
                print(f"the dumps named above were in {root}, removed now: --keep DIR keeps them", file=sys.stderr)
            return code
        for side, dest in zip(("ref", "ours"), staged):
            for f in (root / side).iterdir():
                shutil.move(f, dest / f.name)
    args.ref, args.ours = str(keep / "ref"), str(keep / "ours")
    return run_diff(args)


def register(sub) -> None:
    from .llamaflags import add_context_flags, add_device, add_model, add_pair_flags, count_arg
    p = sub.add_parser("dump", help="run a scenario and dump every graph evaluation")
    add_model(p, "a draft GGUF; with --engine torch a checkpoint folder in its authors' format; with -md the "
                 "target GGUF (or smollm2)")
    add_context_flags(p)
    add_pair_flags(p, draft_help="the draft (a GGUF, a folder holding draft.gguf, or a shipped draft's name: "
                                 "smollm2-dflash), run on the real target -m: the speculative loop is recorded (the "
                                 "target's features, every block) and its draft graphs dumped",
                   prompt_help="with -md: prompt text, tokenized by the target (repeat for the sequences of -np)",
                   file_help="with -md: read the prompt text from FILE")
    p.add_argument("-n", "--n-predict", dest="n_predict", type=count_arg(1), default=None, metavar="N",
                   help="with -md: tokens to generate (default 16)")
    p.add_argument("--temp", type=float, default=None, help="with -md: the target's temperature (default 0: greedy)")
    p.add_argument("--target-seed", type=int, default=None, help="with -md: the target sampler's seed (default 0)")
    p.add_argument("--out", required=True, help="the folder the dumps go to (required)")
    p.add_argument("--engine", choices=("graphgen", "llama.cpp", "torch"), default="graphgen",
                   help="graphgen (default), llama.cpp b11739, or torch: the draft authors' own model "
                        "(needs graphgen[torch])")
    p.add_argument("--target", metavar="PATH", default=None,
                   help="with --engine torch: the target's folder (default: MODEL/target); else the target GGUF (or "
                        "smollm2) lending a draft without them its embeddings and lm head, as a scenario's \"target\"")
    p.add_argument("--max-data", type=int, default=262144,
                   help="store values of nodes up to this many elements (default 262144; larger ones keep a digest)")
    add_kv_type_flags(p)
    add_device(p)
    p.set_defaults(fn=_cmd_dump)
    from .mmapflag import add_mmap_flag
    add_mmap_flag(p)  # --no-mmap

    p = sub.add_parser("diff", help="graph-diff two dumps (files or folders), or a draft's graphs on a real target "
                                     "in both engines (-m TARGET -md DRAFT -p TEXT)")
    add_diff_args(p)
    g = p.add_argument_group("a draft on a real target (instead of REF OURS)")
    g.add_argument("-m", "--model", dest="target_model", metavar="TARGET", help="the target GGUF (or smollm2)")
    add_pair_flags(g, draft_help="the draft GGUF (or a folder holding draft.gguf, or a shipped draft's name: "
                                 "smollm2-dflash)", prompt_help="prompt text",
                   file_help="read the prompt text from FILE")
    g.add_argument("-n", "--n-predict", dest="n_predict", type=count_arg(1), default=16, metavar="N",
                   help="tokens to generate (default 16)")
    g.add_argument("--temp", type=float, default=None, help="the target's temperature (default 0: greedy)")
    g.add_argument("--target-seed", type=int, default=None, help="the target sampler's seed (default 0)")
    g.add_argument("--max-data", type=int, default=262144, help="store values of nodes up to this many elements")
    g.add_argument("--keep", metavar="DIR", help="keep the two dumps in DIR/ref and DIR/ours, with llama.cpp's stderr "
                                                 "in DIR/ref/llama.cpp.log (default: discarded)")
    p.set_defaults(fn=_cmd_diff)
