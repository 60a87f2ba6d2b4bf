"""What the reducer's tests share: the scenario they start from (three sequences, each injected,
then one block step holding all three: 30 tokens, 256 cells), a graphgen command run in a fresh
interpreter, and the environment that runs a copy of graphgen with a fault planted."""

import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "graphgen.cli"]

THREE_SEQUENCES = {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "on", "type_kv": "f16", "seed": 1, "n_seq": 3,
                   "steps": [{"inject": {"n_tokens": 6, "pos0": 0, "seq": 0}},
                             {"inject": {"n_tokens": 5, "pos0": 0, "seq": 1}},
                             {"inject": {"n_tokens": 7, "pos0": 0, "seq": 2}},
                             {"block": {"seqs": [{"seq": 0, "tokens": [7, 255, 255, 255], "pos0": 6},
                                                 {"seq": 1, "tokens": [9, 255, 255, 255], "pos0": 5},
                                                 {"seq": 2, "tokens": [11, 255, 255, 255], "pos0": 7}]}}]}


def run(*args, env=None, cwd) -> subprocess.CompletedProcess:
    """`graphgen ARGS` in `cwd`: outside the checkout, since `python -m` puts the working folder
    first on sys.path, before a planted copy on PYTHONPATH."""
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd)


def planted(folder: Path, fault: str = "fault_ffn_norm_eps") -> dict[str, str]:
    """The environment that runs a copy of graphgen written under `folder` with `fault` planted
    (tools/mutate.py FAULTS)."""
    from mutate import plant
    tree = plant(fault, folder / "tree")
    return dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
