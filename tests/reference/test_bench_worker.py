"""llama.cpp's side of `graphgen bench` (graphgen/reference/bench_worker.py): a child process that
replays a scenario on command, one line a repetition, and says each graph's wall time and the part
of it in ggml's scheduler compute; "info" gives the compute buffer llama.cpp logged and the peak
RSS, "quit" ends it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from graphgen.reference.runner import STDERR_LOG, run_reference
from graphgen.synth import make_model

pytestmark = pytest.mark.reference

STEPS = [{"inject": {"n_tokens": 5}},
         {"block": {"tokens": [7, 255, 255, 255], "pos0": 5}},
         {"seq_rm": {"seq": 0, "p0": 5, "p1": -1}},
         {"inject": {"n_tokens": 2, "pos0": 5}},
         {"block": {"tokens": [9, 255, 255, 255], "pos0": 7}}]


def _worker(tmp_path, model, commands: list[str], steps=STEPS):
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps({"n_ctx": 64, "n_ubatch": 16, "steps": steps}))
    p = subprocess.run([sys.executable, "-m", "graphgen.reference.bench_worker", str(model), str(sc)],
                       input="".join(c + "\n" for c in commands), capture_output=True, text=True, timeout=300)
    return p.returncode, [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()], p.stderr


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench_worker") / "draft.gguf"
    make_model(path, "dflash", n_embd=64, n_layer=1, target_layers=[1, 3], seed=2)
    return path


def test_each_repetition_times_every_graph_and_its_compute(draft, tmp_path):
    rc, lines, err = _worker(tmp_path, draft, ["rep", "rep", "rep", "quit", "rep"])
    # nothing is read after quit
    assert rc == 0 and len(lines) == 3, err[-2000:]
    for rep in lines:
        # the four graphs (seq_rm computes none), in order; the memory cleared before each repetition,
        # or the second would find the first's cells taken
        assert len(rep["times"]) == len(rep["compute"]) == 4
        assert all(0 < c <= t for t, c in zip(rep["times"], rep["compute"]))


def test_info_says_the_compute_buffer_and_the_peak_rss(draft, tmp_path):
    rc, (rep, info), err = _worker(tmp_path, draft, ["rep", "info"])
    assert rc == 0, err[-2000:]
    # the size llama.cpp logs for a context of these settings: as the runner's child logs it
    run_reference(draft, tmp_path / "s.json", tmp_path / "ref")
    logged = [float(m.group(1)) for ln in (tmp_path / "ref" / STDERR_LOG).read_text().splitlines()
              for m in [re.search(r"compute buffer size = +([\d.]+) MiB", ln)] if m]
    assert logged and info["compute_buffer_mib"] == logged[-1] > 0
    assert info["max_rss_kib"] > 10_000


def test_a_model_llama_cpp_refuses_is_one_json_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    rc, lines, _ = _worker(tmp_path, bad, ["rep"])
    assert rc == 4 and lines == [{"error": f"llama.cpp could not load {bad}"}]
