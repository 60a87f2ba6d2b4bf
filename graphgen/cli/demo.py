"""`graphgen demo`: the shortest path from a fresh install to a graph-diff against llama.cpp."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path


def _cmd_demo(args) -> int:
    final = Path(args.out) if args.out else None
    if final is not None and final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise ValueError(f"--out {final}: exists and is not an empty folder")
    if final is not None:
        final.parent.mkdir(parents=True, exist_ok=True)
    # the demo works in a folder of its own, which becomes --out only when it is done; an
    # interrupted or failed demo leaves nothing behind
    work = Path(tempfile.mkdtemp(prefix=".graphgen-demo-" if final else "graphgen-demo-",
                                 dir=final.parent if final else None))
    try:
        code = _demo(work, final or work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if final is not None:
        if final.exists():
            final.rmdir()
        os.replace(work, final)
    else:
        # the paths printed above point into it: kept, and said so
        print(f"the draft, scenario and dumps are in {work} (a temporary folder, kept: remove it when "
              "done, or give --out DIR)")
    return code


def _demo(work: Path, shown: Path) -> int:
    import numpy as np

    from ..play.engine import run_scenario
    from ..play.scenario import default_scenario
    from ..synth import make_model

    model = work / "tiny-dflash.gguf"
    make_model(model, "dflash", seed=0)
    sc = default_scenario(block_size=4, mask_token=255)
    scen_path = work / "scenario.json"
    scen_path.write_text(json.dumps(sc.to_dict(), indent=1))
    print(f"made a tiny DFlash draft: {shown / model.name}")
    print("scenario: inject 6 target-feature rows at pos 0..5, then the block [7, <mask> x3] at pos 6")
    results = run_scenario(model, sc, work / "graphgen")
    for step, r, path in results:
        print(f"  {step.kind:6s} graph: {r.n_nodes} nodes -> {shown / path.relative_to(work)}")
    block = results[-1][1]
    print("drafted block (positions 1..3), top-3 tokens per position:")
    for i in range(1, block.logits.shape[0]):
        row = block.logits[i]
        top = np.argsort(-row)[:3]
        p = np.exp(row - row.max())
        p /= p.sum()
        print("  pos %d: " % i + ", ".join(f"{int(t)} (p={p[t]:.3f})" for t in top))
    try:
        from ..libload import package_dir
        package_dir()
    except Exception as e:
        print(f"reference llama.cpp not installed ({e}); skipping the graph-diff")
        return 0
    from ..compare.pairing import diff_paths
    from ..reference.runner import run_reference
    print("running the same scenario in llama.cpp b11739 ...")
    run_reference(model, scen_path, work / "llama.cpp", announce_dir=shown / "llama.cpp")
    ok = True
    for res in diff_paths(work / "llama.cpp", work / "graphgen"):
        # the report names the files where they will be once the demo is done (--out)
        print(res.format_text().replace(str(work), str(shown)))
        ok &= res.identical
    return 0 if ok else 1


def register(sub) -> None:
    p = sub.add_parser("demo", help="make a tiny draft, run inject + one block, diff against llama.cpp if present")
    p.add_argument("--out", help="folder for the draft, scenario and dumps (default: a temp folder)")
    p.set_defaults(fn=_cmd_demo)
