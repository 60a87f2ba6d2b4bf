"""Run fuzz cases in child processes, many per child, so an abort, a segfault or a hang is a
reported failure rather than the end of the test run.

The parent writes the cases as JSON lines; a child (fuzz_cases.py) runs them from a start index
and prints `S <i>` before and `R <i> <json>` after each case. When a child dies or a case runs
past its time limit, the parent records that case as a crash, saves its input for replay, and
starts a fresh child on the remaining cases.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CRASH_DIR = HERE / "crashes"


@dataclass
class Report:
    family: str
    n: int = 0
    outcomes: dict = field(default_factory=dict)   # outcome -> count
    failures: list = field(default_factory=list)   # (index, why, saved path)
    results: dict = field(default_factory=dict)    # index -> outcome
    seconds: float = 0.0

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        return f"{self.family}: {self.n} cases in {self.seconds:.1f} s ({kinds}); {len(self.failures)} failures"


def _child(case_file: Path, start: int, work: Path, end: int):
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), str(ROOT / "tests"),
                                           os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(HERE / "fuzz_cases.py"), str(case_file), str(start), str(end),
                             str(work)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)


def _save(family: str, index: int, case: dict, why: str, work: Path, stderr: str) -> Path:
    """Copy a failing case (its JSON, the files it made, the child's stderr) for replay."""
    dest_root = Path(os.environ.get("GRAPHGEN_FUZZ_CRASHES", CRASH_DIR))
    dest = dest_root / f"{family}-{case.get('id', index)}"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "case.json").write_text(json.dumps(case, indent=1))
    (dest / "why.txt").write_text(why + "\n\n" + stderr[-20000:])
    made = work / f"case{index}"
    if made.exists():
        shutil.copytree(made, dest / "files", dirs_exist_ok=True)
    return dest


def _run_range(family: str, cases: list, case_file: Path, lo: int, hi: int, work: Path, timeout: float,
               report: Report) -> None:
    i = lo
    while i < hi:
        proc = _child(case_file, i, work, hi)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        current, deadline, buf = None, time.monotonic() + timeout + 10, b""  # +10: the child's imports
        died = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                died = f"hang: no result within {timeout:.0f} s"
                os.killpg(proc.pid, 9)
                break
            if not sel.select(timeout=min(left, 1.0)):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.wait()
                died = None if current is None and i >= hi else f"child died ({_how(proc.returncode)})"
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                tag, _, rest = line.decode(errors="replace").partition(" ")
                if tag == "S":
                    current = int(rest)
                    deadline = time.monotonic() + timeout
                elif tag == "R":
                    k, _, payload = rest.partition(" ")
                    res = json.loads(payload)
                    report.n += 1
                    report.outcomes[res["outcome"]] = report.outcomes.get(res["outcome"], 0) + 1
                    report.results[int(k)] = res["outcome"]
                    if res.get("fail"):
                        report.failures.append((int(k), res["fail"],
                                                str(_save(family, int(k), cases[int(k)], res["fail"], work, ""))))
                    current, i = None, int(k) + 1
        sel.close()
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.poll() is None:
            proc.wait()
        if died is None:
            continue
        bad = current if current is not None else i
        if bad >= hi:
            break
        report.n += 1
        report.outcomes["crash"] = report.outcomes.get("crash", 0) + 1
        report.results[bad] = "crash"
        report.failures.append((bad, died, str(_save(family, bad, cases[bad], died, work, stderr))))
        i = bad + 1


def _how(rc: int) -> str:
    return f"signal {-rc}" if rc < 0 else f"exit {rc}"


def run_cases(family: str, cases: list, work: Path, timeout: float = 30.0, workers: int = 2) -> Report:
    """Run `cases` (JSON-able dicts with a 'family' key) in child processes, `workers` at once."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    case_file = work / f"{family}.jsonl"
    case_file.write_text("".join(json.dumps(c) + "\n" for c in cases))
    report = Report(family)
    t0 = time.monotonic()
    n = len(cases)
    workers = max(1, min(workers, n))
    bounds = [(n * w // workers, n * (w + 1) // workers) for w in range(workers)]
    if workers == 1:
        _run_range(family, cases, case_file, 0, n, work, timeout, report)
    else:
        import threading
        parts = [Report(family) for _ in bounds]
        threads = [threading.Thread(target=_run_range, args=(family, cases, case_file, lo, hi, work, timeout, part))
                   for (lo, hi), part in zip(bounds, parts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for part in parts:
            report.n += part.n
            for k, v in part.outcomes.items():
                report.outcomes[k] = report.outcomes.get(k, 0) + v
            report.failures += part.failures
            report.results.update(part.results)
    report.seconds = time.monotonic() - t0
    return report
