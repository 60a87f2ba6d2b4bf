#!/usr/bin/env python3
"""The agreement table of README's authors' section: every authors' class, `graphgen check`'s
triangle over two drafting rounds, f32 and f16 caches; worst relative L2 per kind of mapped node.

    python tools/authors_agreement.py [--markdown] [--json]
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
    args = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
