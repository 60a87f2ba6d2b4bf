"""`python tests/fuzz/fuzz_main.py [--n N] [--seed S] [--family F ...]`: the long fuzz run;
`--replay CRASH_DIR` reruns one saved case in this process (a crash then shows its traceback)."""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "support")]

from fuzz_gen import make_cases  # noqa: E402
from fuzz_runner import run_cases  # noqa: E402

FAMILIES = ["gguf", "batch", "scenario", "dump"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2500, help="cases per family")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--family", action="append", choices=FAMILIES)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--replay", type=Path)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="graphgen-fuzz-") as tmp:
        work = Path(tmp)
        if a.replay:
            from fuzz_cases import RUNNERS
            case = json.loads((a.replay / "case.json").read_text())
            if case["family"] != "dump":
                make_cases(case["family"], 1, 0, work / "bases")  # the base drafts
            print(RUNNERS[case["family"]](case, work / "case", work / "bases"))
            return 0
        total, failed = 0, 0
        print(f"seed {a.seed}")
        for fam in a.family or FAMILIES:
            cases = make_cases(fam, a.n, a.seed, work / "bases")
            rep = run_cases(fam, cases, work / fam, workers=a.workers)
            print(rep.summary(), flush=True)
            for k, why, saved in rep.failures:
                print(f"  case {k}: {why.splitlines()[0] if why else ''} -> {saved}")
            total += rep.n
            failed += len(rep.failures)
        print(f"{total} cases, {failed} failures")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
