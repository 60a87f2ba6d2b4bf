"""The `graphgen` command line: make-model, info, dump, diff, demo."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

from . import __version__

# modules that add their own subcommands: each has register(subparsers)
COMMAND_MODULES: tuple[str, ...] = ("graphgen.draftcli", "graphgen.backendcli", "graphgen.viewcli", "graphgen.benchcli")


def _cmd_make_model(args) -> int:
    from .synth import make_model_from_args
    info = make_model_from_args(args)
    print(f"wrote {info.get('path', args.out)}: variant {info.get('variant')}, backbone {info.get('backbone')}, "
          f"{info.get('n_tensors', '?')} tensors")
    return 0


def _cmd_info(args) -> int:
    from .ops.runtime import activate
    from .runtime.model import load
    m = load(args.model)
    hp = m.hparams
    rt = activate()
    print(f"model     {m.path}")
    print(f"ggml      {rt.version} ({rt.lib_dir}, {rt.origin})")
    print(f"variant   {m.variant}")
    print(f"backbone  {m.backbone}")
    print("hparams")
    for k, v in vars(hp).items():
        if v not in (0, 0.0, [], {}, None) or k in ("causal_attn",):
            print(f"  {k:26s} {v}")
    print(f"  {'rope_type':26s} {'mrope' if hp.rope_type == 8 else 'neox'}")
    print(f"tensors ({len(m.tensor_table())}, {m.weight_bytes / 1e6:.2f} MB)")
    for name, typ, shape in m.tensor_table():
        print(f"  {name:40s} {typ:5s} {shape}")
    return 0


def _cmd_dump(args) -> int:
    from .scenario import load_scenario
    sc = load_scenario(args.scenario)
    if not Path(args.model).is_file():
        raise FileNotFoundError(f"{args.model}: no such model file")
    out = Path(args.out)
    if args.engine == "llama.cpp":
        from .reference.runner import run_reference
        if args.backend != "cpu":
            raise ValueError("the llama.cpp reference runs on the CPU; drop --backend or use --engine graphgen")
        paths = run_reference(args.model, args.scenario, out, args.max_data)
    else:
        from .engine import run_scenario
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("[0-9][0-9]-*.json"):
            old.unlink()
            old.with_suffix(".npz").unlink(missing_ok=True)
        n = len([s for s in sc.steps if s.kind != "seq_rm"])
        done = [0]

        def progress(step):
            if step.kind != "seq_rm":
                done[0] += 1
                print(f"[{done[0]}/{n}] {step.kind} (step {step.index})", file=sys.stderr)
        paths = [p for _, _, p in run_scenario(args.model, sc, out, args.max_data, progress, backend=args.backend)]
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        print(f"{p}: {doc['graph']}, {len(doc['nodes'])} nodes")
    return 0


def _cmd_diff(args) -> int:
    from .diff import run_diff
    return run_diff(args)


def _cmd_demo(args) -> int:
    import numpy as np

    from .engine import run_scenario
    from .scenario import default_scenario
    from .synth import make_model

    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="graphgen-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny-dflash.gguf"
    make_model(model, "dflash", seed=0)
    sc = default_scenario(block_size=4, mask_token=255)
    scen_path = work / "scenario.json"
    scen_path.write_text(json.dumps(sc.to_dict(), indent=1))
    print(f"made a tiny DFlash draft: {model}")
    print("scenario: inject 6 target-feature rows at pos 0..5, then the block [7, <mask> x3] at pos 6")
    results = run_scenario(model, sc, work / "graphgen")
    for step, r, path in results:
        print(f"  {step.kind:6s} graph: {r.n_nodes} nodes -> {path}")
    block = results[-1][1]
    print("drafted block (positions 1..3), top-3 tokens per position:")
    for i in range(1, block.logits.shape[0]):
        row = block.logits[i]
        top = np.argsort(-row)[:3]
        p = np.exp(row - row.max())
        p /= p.sum()
        print("  pos %d: " % i + ", ".join(f"{int(t)} (p={p[t]:.3f})" for t in top))
    try:
        from .reference.libload import package_dir
        package_dir()
    except Exception as e:
        print(f"reference llama.cpp not installed ({e}); skipping the graph-diff")
        return 0
    from .diff import diff_paths
    from .reference.runner import run_reference
    print("running the same scenario in llama.cpp b11739 ...")
    run_reference(model, scen_path, work / "llama.cpp")
    ok = True
    for res in diff_paths(work / "llama.cpp", work / "graphgen"):
        print(res.format_text())
        ok &= res.identical
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    from .diff import add_diff_args
    from .synth import add_make_model_args

    ap = argparse.ArgumentParser(prog="graphgen", description="DFlash-family draft graphs, node for node with llama.cpp")
    ap.add_argument("--version", action="version", version=f"graphgen {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("make-model", help="write a tiny random-weight draft GGUF")
    add_make_model_args(p)
    p.set_defaults(fn=_cmd_make_model)

    p = sub.add_parser("info", help="print variant, backbone, hparams and tensors of a draft")
    p.add_argument("model")
    p.set_defaults(fn=_cmd_info)

    p = sub.add_parser("dump", help="run a scenario and dump every graph evaluation")
    p.add_argument("model")
    p.add_argument("--scenario", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--engine", choices=("graphgen", "llama.cpp"), default="graphgen")
    p.add_argument("--max-data", type=int, default=262144, help="store values of nodes up to this many elements")
    p.add_argument("--backend", default="cpu", help="cpu, vulkan[:N], cuda[:N], metal, rpc://HOST:PORT or auto")
    p.set_defaults(fn=_cmd_dump)

    p = sub.add_parser("diff", help="graph-diff two dumps (files or folders)")
    add_diff_args(p)
    p.set_defaults(fn=_cmd_diff)

    for modname in COMMAND_MODULES:
        importlib.import_module(modname).register(sub)

    p = sub.add_parser("demo", help="make a tiny draft, run inject + one block, diff against llama.cpp if present")
    p.add_argument("--out", help="folder for the draft, scenario and dumps (default: a temp folder)")
    p.set_defaults(fn=_cmd_demo)

    # accepted before or after the command name
    for parser, default in [(ap, None)] + [(p, argparse.SUPPRESS) for p in sub.choices.values()]:
        parser.add_argument("--ggml", metavar="DIR", default=default,
                            help="compute on the libggml*.so in DIR (any llama.cpp build) instead of the "
                                 "reference's ggml; also $GRAPHGEN_GGML_DIR")
        parser.add_argument("--llama", metavar="DIR", default=default,
                            help="run the reference engine on the libllama.so in DIR (a build with b11739's "
                                 "C API); also $GRAPHGEN_LLAMA_DIR. Alone, graphgen also computes on its ggml")
    return ap


def apply_library_options(args) -> None:
    """--ggml / --llama: chosen before anything loads ggml, and passed on to child processes."""
    import os

    from .ops.runtime import ENV_GGML_DIR, choose
    from .reference.libload import ENV_LLAMA_DIR
    if args.llama:
        os.environ[ENV_LLAMA_DIR] = str(Path(args.llama).expanduser().resolve())
    if args.ggml:
        choose(args.ggml)
        os.environ[ENV_GGML_DIR] = str(Path(args.ggml).expanduser().resolve())


def main(argv=None) -> int:
    from .dump import DumpError
    from .errors import GraphgenError
    from .scenario import ScenarioError

    args = build_parser().parse_args(argv)
    try:
        apply_library_options(args)
        return args.fn(args)
    except KeyboardInterrupt:
        print("graphgen: interrupted", file=sys.stderr)
        return 130
    except (GraphgenError, ScenarioError, DumpError, FileNotFoundError, ValueError, NotImplementedError,
            OSError, RuntimeError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"graphgen: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
