"""Fuzz graphgen's inputs; every case runs in a child process (see fuzz_runner).

GRAPHGEN_FUZZ_N cases per family (default 500), drawn with GRAPHGEN_FUZZ_SEED (default 0);
`make fuzz` runs more. A failing case is saved under tests/fuzz/crashes/ (or
$GRAPHGEN_FUZZ_CRASHES) with its case.json; `python tests/fuzz/fuzz_main.py --replay DIR` reruns it.
"""

import os

import pytest

from fuzz_gen import make_cases
from fuzz_runner import run_cases

N = int(os.environ.get("GRAPHGEN_FUZZ_N", "500"))
SEED = int(os.environ.get("GRAPHGEN_FUZZ_SEED", "0"))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.mark.parametrize("family", ["gguf", "batch", "scenario", "dump"])
def test_fuzz_family(family, work, monkeypatch):
    monkeypatch.setenv("GRAPHGEN_FUZZ_CRASHES", os.environ.get("GRAPHGEN_FUZZ_CRASHES", str(work / "crashes")))
    cases = make_cases(family, N, SEED, work / "bases")
    # a case that hangs still fails, after a bound generous enough for a loaded machine
    report = run_cases(family, cases, work / family, timeout=3600)
    print(report.summary())
    assert report.n == len(cases) >= N
    assert not report.failures, report.summary() + "\n" + "\n".join(
        f"case {k}: {why.splitlines()[0] if why else ''} -> {saved}" for k, why, saved in report.failures[:20])
