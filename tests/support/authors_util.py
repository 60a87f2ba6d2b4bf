"""Shared pieces of the authors' model tests: the extra's check, and one case run three ways."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

EXTRA = "graphgen[torch]"


def require_extra():
    """Skip when the authors' packages are absent, naming the extra; CI (GRAPHGEN_REQUIRE_TORCH=1)
    fails instead, since it installs the extra."""
    from graphgen.authors import AuthorsError, require_torch
    try:
        require_torch()
    except AuthorsError as e:
        if os.environ.get("GRAPHGEN_REQUIRE_TORCH") == "1":
            pytest.fail(f"GRAPHGEN_REQUIRE_TORCH=1 but {e}")
        pytest.skip(f"needs the {EXTRA} extra (tools/setup.sh torch): {e}", allow_module_level=True)


def session_scenario(block: int, mask: int, f16: bool, seed: int = 1) -> dict:
    """Two inject chunks, a second sequence, one batch holding both sequences' blocks, the blocks
    removed, accepted rows injected, a second round for one sequence."""
    b = [7] + [mask] * (block - 1)
    return {"n_ctx": 128, "n_ubatch": 32, "flash_attn": "off", "type_kv": "f16" if f16 else "f32",
            "seed": seed, "n_seq": 2,
            "steps": [{"inject": {"n_tokens": 3, "pos0": 0, "seq": 0}},
                      {"inject": {"n_tokens": 2, "pos0": 3, "seq": 0}},
                      {"inject": {"n_tokens": 4, "pos0": 0, "seq": 1}},
                      {"block": {"seqs": [{"seq": 0, "tokens": b, "pos0": 5},
                                          {"seq": 1, "tokens": [9] + b[1:], "pos0": 4}]}},
                      {"seq_rm": {"seq": 0, "p0": 5, "p1": -1}},
                      {"seq_rm": {"seq": 1, "p0": 4, "p1": -1}},
                      {"inject": {"n_tokens": 3, "pos0": 5, "seq": 0}},
                      {"block": {"tokens": [11] + b[1:], "pos0": 8, "seq": 0}}]}


def run_three(hf_dir: Path, gguf: Path, scenario: dict, work: Path, name: str):
    """The scenario in the authors' model, llama.cpp b11739 and graphgen; returns the folders."""
    from graphgen.authors.forward import run_scenario_torch
    from graphgen.play.engine import run_scenario
    from graphgen.reference.runner import run_reference
    from graphgen.play.scenario import parse_scenario
    sc_path = work / f"{name}.scenario.json"
    sc_path.write_text(json.dumps(scenario))
    sc = parse_scenario(scenario)
    dirs = {k: work / f"{name}-{k}" for k in ("torch", "llama.cpp", "graphgen")}
    run_scenario_torch(hf_dir, sc, dirs["torch"], scenario_path=sc_path)
    run_reference(gguf, sc_path, dirs["llama.cpp"], 262144, stderr_log=None)
    run_scenario(gguf, sc, dirs["graphgen"], scenario_path=sc_path)
    return dirs
