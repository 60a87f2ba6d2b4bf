"""The bench runs both engines in one run and reports ratios; the table is generated, not typed."""

import subprocess
import sys

import pytest

from graphgen.bench import multi_seq_scenario, run_bench
from graphgen.scenario import default_scenario
from graphgen.synth import make_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    make_model(p, "dflash", seed=1)
    return p


def test_bench_graphgen_only(tiny):
    res = run_bench(tiny, default_scenario(), repeat=3, engines=("graphgen",), warmup=1)
    labels = [st.label for st in res.steps]
    assert labels == ["inject 6", "block 4"]
    for st in res.steps:
        assert len(st.times["graphgen"]) == 3 and all(t > 0 for t in st.times["graphgen"])
    assert res.build_ms["block 4"] > 0 and res.compute_buffer_mib["graphgen"] > 0


def test_multi_seq_scenario():
    sc = multi_seq_scenario(default_scenario(), 4)
    assert sc.n_seq == 4
    assert [s.kind for s in sc.steps] == ["inject"] * 4 + ["block"]
    assert len(sc.steps[-1].blocks) == 4 and {b.seq for b in sc.steps[-1].blocks} == {0, 1, 2, 3}


@pytest.mark.reference
def test_bench_cli_against_llama_cpp(tiny, tmp_path):
    md = tmp_path / "B.md"
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "bench", str(tiny), "--repeat", "3", "--prompt", "6",
                        "--n-seq", "1,4", "--markdown", str(md)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "ratio" in p.stdout and "llama.cpp" in p.stdout
    text = md.read_text()
    assert "| block 4 |" in text and "| block 16 x4seq |" in text and "compute buffer MiB" in text
