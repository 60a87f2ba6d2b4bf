"""Time inside ggml's scheduler compute, measured in a libllama process
(graphgen/reference/compute_timer.py): the timer loaded before libllama is the scheduler libllama
calls, forwarding each call to libggml-base and counting it. Each case runs in a child process,
which the timer's library is loaded into (RTLD_GLOBAL) before libllama."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from graphgen.synth import make_model

pytestmark = pytest.mark.reference

SCRIPT = r"""
import json, sys
from pathlib import Path
from graphgen.reference.compute_timer import ComputeTimer
from graphgen.play.scenario import load_scenario
from graphgen.reference.runner import run_child

timer = ComputeTimer()
out = {"before": [timer.ns(), timer.calls()]}
model, scenario, dumps = Path(sys.argv[1]), load_scenario(sys.argv[2]), Path(sys.argv[3])
out["graphs"] = len(run_child(model, scenario, dumps / "a", 0))
out["after_one"] = [timer.ns(), timer.calls()]
run_child(model, scenario, dumps / "b", 0)
out["after_two"] = [timer.ns(), timer.calls()]
# a second timer is the same library: the same counters
out["second"] = [ComputeTimer().ns(), ComputeTimer().calls()]
print(json.dumps(out))
"""


def test_the_timer_counts_every_graph_libllama_computes(tmp_path):
    make_model(tmp_path / "draft.gguf", "dflash", n_embd=64, n_layer=1, target_layers=[1, 3], seed=1)
    (tmp_path / "s.json").write_text(json.dumps({
        "n_ctx": 64, "n_ubatch": 16, "steps": [{"inject": {"n_tokens": 5}},
                                               {"block": {"tokens": [7, 255, 255, 255], "pos0": 5}},
                                               {"seq_rm": {"seq": 0, "p0": 5, "p1": -1}},
                                               {"inject": {"n_tokens": 2, "pos0": 5}}]}))
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "draft.gguf"), str(tmp_path / "s.json"),
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    # nothing computed before libllama is loaded
    assert r["before"] == [0, 0] and r["graphs"] == 3
    ns1, calls1 = r["after_one"]
    ns2, calls2 = r["after_two"]
    # every graph the scenario computes is one call of the scheduler, timed
    assert calls1 == r["graphs"] and ns1 > 0
    # the second run counts as many calls again, and more time
    assert calls2 == 2 * calls1 and ns2 > ns1
    assert r["second"] == [ns2, calls2]
