#!/usr/bin/env python3
"""The fuzz's long mode against llama.cpp b11739 (not in CI): thousands of fuzzed GGUFs and
thousands of fuzzed batch scenarios, each run by graphgen and by b11739, which must accept or
refuse alike (a batch refusal at the same step).

Both sides run in long-lived worker processes, many cases each: b11739 in
`python -m graphgen.reference.runner --serve`, graphgen in this file's `--serve-graphgen`. A worker
that dies (an abort, a segfault) or hangs has that case counted as such and a fresh worker takes
the rest. graphgen must never abort and never raise anything but its own one-line errors; an
abort of b11739's is a refusal (llama.cpp refusing by dying).

    python tests/fuzz/fuzz_long.py --ggufs 10000 --batches 10000 [--seed 11] [--json]

The GGUF cases are fuzz_gen's `gguf` family (byte mutations, metadata and tensor-info edits, ...),
run as inject + one block (fuzz_agree.gguf_doc); the batch cases are fuzz_agree's batch scenarios
on the drafts b11739 runs. Cases with the seed's own features (Mistral Large 4, DeepSeek-V4.1, the
bonus anchor) are left out: b11739 predates them.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent / "support"))

from workers import Worker  # noqa: E402

_STEP = re.compile(r"\bstep (\d+)\b")


def serve_graphgen() -> int:
    """graphgen's side as a worker: {"id", "model", "doc"} -> {"ok", "step", "error", "traceback"}."""
    from fuzz_agree import ours
    for line in sys.stdin:
        req = json.loads(line)
        print(f"S {req['id']}", flush=True)
        try:
            v = ours(Path(req["model"]), req["doc"])
            res = {"id": req["id"], "ok": v.ok, "step": v.step, "error": v.message, "traceback": ""}
        except Exception:  # noqa: BLE001 - anything but graphgen's own errors is a finding
            res = {"id": req["id"], "ok": False, "step": None, "error": "", "traceback": traceback.format_exc()}
        print("R " + json.dumps(res), flush=True)
    return 0


def _tail(path: Path, n: int = 4000) -> str:
    try:
        data = path.read_bytes()[-n:]
    except OSError:
        return ""
    return data.decode(errors="replace")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve-graphgen", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ggufs", type=int, default=10000)
    ap.add_argument("--batches", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--work", help="work here (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep every case's draft, scenario and dumps")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.serve_graphgen:
        return serve_graphgen()

    from fuzz_agree import agree_model, batch_cases, gguf_doc, make_gguf
    from fuzz_gen import make_cases
    from graphgen.reference.protocol import error_text
    from graphgen.play.scenario import ScenarioError, parse_scenario

    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="graphgen-fuzz-long-")
    work = Path(args.work or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    bases = work / "bases"
    ours_w = Worker([sys.executable, str(Path(__file__).resolve()), "--serve-graphgen"], work / "graphgen.err",
                    args.timeout)
    ref_w = Worker([sys.executable, "-m", "graphgen.reference.runner", "--serve"], work / "reference.err",
                   args.timeout)
    t0 = time.time()
    report = {}
    seed_only_keys = ("dflash.attention.kv_lora_rank", "dflash.hyper_connection.single_pass",
                      "dflash.sample_from_anchor")

    def seed_only(case):
        return case.get("base") == "dspark-ml4" or any(
            k in seed_only_keys for k in case.get("edits", {}).get("set_keys", {}))

    def run_family(name, items, same_step, n):
        counts, disagree = Counter(), []
        def one(case_id, model, doc, case, d):
            try:
                parse_scenario(doc)
            except ScenarioError:
                # both sides read scenarios with graphgen's parser: no verdict of b11739's to compare
                counts["scenario refused before either engine"] += 1
                return
            d.mkdir(parents=True, exist_ok=True)
            res, how = ours_w.ask({"id": case_id, "model": str(model), "doc": doc})
            if res is None:
                counts["graphgen " + how.split(" ")[0]] += 1
                disagree.append((case_id, f"graphgen {how}: {_tail(ours_w.err_path, 600)}", case))
                return
            if res["traceback"]:
                counts["graphgen traceback"] += 1
                disagree.append((case_id, "graphgen traceback: " + res["traceback"][-600:], case))
                return
            sc = d / "scenario.json"
            sc.write_text(json.dumps(doc))
            log = d / "ref.log"
            log.unlink(missing_ok=True)
            ref, how = ref_w.ask({"id": case_id, "model": str(model), "scenario": str(sc), "out": str(d / "ref"),
                                  "max_data": 0, "log": str(log)})
            if ref is None:
                counts["b11739 " + how.split(" ")[0]] += 1
                headline, _ = error_text(log, _tail(ref_w.err_path))
                ref = {"ok": False, "error": headline}
            m = _STEP.search((ref.get("error") or "").splitlines()[0] if ref.get("error") else "")
            ref_step = int(m.group(1)) if m else None
            same = res["ok"] == ref["ok"] and (res["ok"] or not same_step or res["step"] == ref_step)
            counts["accepted by both" if res["ok"] and ref["ok"] else "refused by both" if same
                   else "disagree"] += 1
            if not same:
                disagree.append((case_id, f"graphgen {'accepts' if res['ok'] else 'refuses'} (step {res['step']}: "
                                          f"{res['error'][:200]}), b11739 {'accepts' if ref['ok'] else 'refuses'} "
                                          f"(step {ref_step}: {(ref.get('error') or '')[:200]})", case))

        for k, (case_id, model, doc, case) in enumerate(items):
            d = work / name / case_id
            try:
                one(case_id, model, doc, case, d)
            finally:
                if not args.keep:
                    shutil.rmtree(d, ignore_errors=True)
            if (k + 1) % 500 == 0:
                print(f"{name}: {k + 1}/{n} {dict(counts)} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        report[name] = {"cases": n, "counts": dict(counts), "disagreements": len(disagree),
                        "first": [{"id": i, "why": w, "case": c} for i, w, c in disagree[:20]]}

    try:
        if args.ggufs:
            cases = [c for c in make_cases("gguf", args.ggufs, args.seed, bases) if not seed_only(c)]

            def gguf_items():
                # made one at a time and dropped once compared: 10,000 drafts would fill a disk
                for c in cases:
                    d = work / "gguf" / c["id"]
                    model = make_gguf(c, d, bases)
                    yield c["id"], model, gguf_doc(c, model, bases), c
            run_family("gguf", gguf_items(), same_step=False, n=len(cases))
        if args.batches:
            items = [(c["id"], agree_model(c["base"], bases), c["doc"], c) for c in batch_cases(args.batches, args.seed)]
            run_family("batch", items, same_step=True, n=len(items))
    finally:
        ours_w.close()
        ref_w.close()
    report["seconds"] = round(time.time() - t0, 1)
    report["worker_restarts"] = {"graphgen": ours_w.restarts, "b11739": ref_w.restarts}
    if tmp is not None:
        tmp.cleanup()
    bad = any(r["disagreements"] for k, r in report.items() if isinstance(r, dict) and "disagreements" in r)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for fam in ("gguf", "batch"):
            if fam in report:
                r = report[fam]
                print(f"{fam}: {r['cases']} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(r["counts"].items())))
                for x in r["first"]:
                    print(f"  {x['id']}: {x['why']}")
        print(f"{report['seconds']} s; worker restarts {report['worker_restarts']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
