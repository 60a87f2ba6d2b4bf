#!/usr/bin/env python3
"""The agreement tables of docs/authors.md: every authors' class, `graphgen check`'s
triangle over two drafting rounds, f32 and f16 caches; worst relative L2 per kind of mapped node.
With --random N, the random configurations of tests/authors/test_authors_random.py instead (N per class):
agree/n per class, each side's worst distance to the float64 arbiter, and the arbiter's verdict on
every case that does not agree.

    python tools/authors_agreement.py [--json]
    python tools/authors_agreement.py --random 20 [--seed 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

CLASSES = {
    "z-lab DFlash": dict(variant="dflash", authors="zlab"),
    "z-lab DFlash2": dict(variant="dflash2", authors="zlab"),
    "speculators DFlash": dict(variant="dflash", authors="speculators"),
    "speculators DFlash2": dict(variant="dflash2", authors="speculators"),
    "speculators DSpark + conf, anchor-first, d2t": dict(variant="dspark", d2t_vocab=192, conf=True),
    "speculators DSpark + conf, bonus anchor, d2t": dict(variant="dspark", d2t_vocab=192, conf=True,
                                                         sample_from_anchor=False),
    "speculators DSpark, no conf, d2t": dict(variant="dspark", d2t_vocab=192, conf=False),
}
KINDS = ("inp_g_embeddings", "Kcur_injected", "Qcur", "Kcur", "kqv_out", "ffn_out", "l_out", "result_output",
         "[drafted logits]", "[confidences]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--random", type=int, default=0, metavar="N", help="N random configurations per class")
    ap.add_argument("--seed", type=int, default=1000, help="first seed of --random (default 1000)")
    args = ap.parse_args(argv)
    if args.random:
        return random_table(args.random, args.seed, args.json)
    from graphgen.authors.checkpoint import HFSpec, make_hf
    from graphgen.cli.authors import run_check, verdict
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphgen-agreement-") as tmp:
        for name, kw in CLASSES.items():
            hf = make_hf(Path(tmp) / name.replace(" ", "_").replace(",", ""), HFSpec(**kw))
            for f16 in (False, True):
                t0 = time.time()
                r = run_check(hf, f16=f16)
                ref = r["authors_vs_llama.cpp"]
                s = ref.summary()
                rows.append({"class": name, "cache": "f16" if f16 else "f32", "verdict": verdict(r)[1].split(":")[0],
                             "worst": ref.worst_by_kind(), "argmax": s["argmax"], "path": s["path"],
                             "mapped": s["mapped"], "identical": r["graphgen_identical"],
                             "seconds": round(time.time() - t0, 1)})
                print(f"{name} {rows[-1]['cache']}: {rows[-1]['verdict']} in {rows[-1]['seconds']} s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| authors' class | cache | " + " | ".join(f"`{k}`" for k in KINDS) + " | argmax | path | verdict |")
    print("|---|---|" + "---|" * len(KINDS) + "---|---|---|")
    for r in rows:
        cells = [f"{r['worst'][k]:.1e}" if k in r["worst"] else "" for k in KINDS]
        frac = lambda x: f"{x[0]}/{x[1]}" if x else ""  # noqa: E731
        print(f"| {r['class']} | {r['cache']} | " + " | ".join(cells)
              + f" | {frac(r['argmax'])} | {frac(r['path'])} | {r['verdict']} |")
    return 0


def random_table(n: int, seed0: int, as_json: bool) -> int:
    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path[:0] = [str(tests / "authors"), str(tests / "support")]
    from test_authors_random import CLASSES as RANDOM_CLASSES, draw
    from graphgen.authors.checkpoint import label, make_hf
    from graphgen.cli.authors import run_check, verdict
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphgen-agreement-") as tmp:
        for authors, variant in RANDOM_CLASSES:
            for seed in range(seed0, seed0 + n):
                spec, scenario = draw(authors, variant, seed)
                case = Path(tmp) / f"{authors}-{variant}-{seed}"
                hf = make_hf(case / "hf", spec)
                sc = case / "scenario.json"
                sc.write_text(json.dumps(scenario))
                t0 = time.time()
                r = run_check(hf, sc)
                code, line = verdict(r)
                arb = r["arbiter"]
                wa, wl = arb.worst("authors"), arb.worst("llama.cpp")
                rows.append({"class": label(authors, variant), "seed": seed, "agree": code == 0, "verdict": line,
                             "layers": spec.n_layer, "head_dim": spec.head_dim, "cache": scenario["type_kv"],
                             "worst_authors_f32": wa.e_authors if wa else None,
                             "worst_llama.cpp": wl.e_llama if wl else None,
                             "authors_drift_nodes": len(arb.drifts), "identical": r["graphgen_identical"],
                             "seconds": round(time.time() - t0, 1)})
                print(f"{rows[-1]['class']} {seed}: {line.split(':')[0]} ({rows[-1]['seconds']} s)", file=sys.stderr)
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| authors' class | agree | worst f32 authors / llama.cpp to the arbiter (f32 caches) | "
          "(f16 caches) | authors' f32 drifts | graphgen identical |")
    print("|---|---|---|---|---|---|")
    for cls in dict.fromkeys(r["class"] for r in rows):
        mine = [r for r in rows if r["class"] == cls]
        def worst(cache):
            sel = [r for r in mine if r["cache"] == cache]
            if not sel:
                return "-"
            return (f"{max(r['worst_authors_f32'] or 0 for r in sel):.1e} / "
                    f"{max(r['worst_llama.cpp'] or 0 for r in sel):.1e}")
        print(f"| {cls} | {sum(r['agree'] for r in mine)}/{len(mine)} | {worst('f32')} | {worst('f16')} | "
              f"{sum(r['authors_drift_nodes'] > 0 for r in mine)} | {sum(r['identical'] for r in mine)}/{len(mine)} |")
    for r in rows:
        if not r["agree"]:
            print(f"\n{r['class']} seed {r['seed']}: {r['verdict']}")
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
