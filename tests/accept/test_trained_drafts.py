"""The shipped trained drafts (drafts/) draft for their target: a trained DFlash head on SmolLM2
accepts well above chance on prompts its training never saw, in graphgen beside b11739's target,
and the same head with one layer's weights shuffled does not. Neither needs torch: the GGUFs run in
graphgen and the target in b11739."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.reference

ROOT = Path(__file__).resolve().parents[2]
DRAFT = ROOT / "drafts" / "smollm2-dflash" / "draft.gguf"
CLI = [sys.executable, "-m", "graphgen.cli"]
# none of them is a training prompt (graphgen/accept/train.py's HELD_OUT_PROMPTS)
PROMPTS = ["The capital of France is",
           "My favourite season of the year is autumn, because",
           "A good breakfast should include",
           "The three primary colors are"]
N_PREDICT = 32
# measured over 32 tokens of these prompts (greedy, so the same every run): the trained head accepted
# 24 tokens in 101 blocks (0.24 per block; card.md has 0.23 over 64 tokens, graphgen and b11739 alike),
# its shuffled copy 0 in 124. The bounds leave half the trained figure as margin for other thread counts'
# numerics and sit well above what a head that learned nothing gets.
TRAINED_MIN = 0.12
SHUFFLED_MAX = 0.05


@pytest.fixture(scope="module")
def target():
    from graphgen.targets import resolve
    return resolve("smollm2")


def _accepted(target, draft) -> dict:
    cmd = CLI + ["draft", "-m", str(target), "-md", str(draft), "-n", str(N_PREDICT), "--temp", "0", "--json",
                 "--no-baseline", "-np", str(len(PROMPTS)), "-t", "2"]
    for p in PROMPTS:
        cmd += ["-p", p]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def _shuffled_layer(src: Path, dst: Path, layer: int = 0, seed: int = 0) -> Path:
    """A copy of `src` whose layer `layer` has every matrix's elements permuted (seeded), in place
    through gguf-py's writable mapping: same shapes and types, the layer's learning gone."""
    import gguf
    shutil.copy(src, dst)
    r = gguf.GGUFReader(str(dst), "r+")
    rng = np.random.default_rng(seed)
    hit = 0
    for t in r.tensors:
        if t.name.startswith(f"blk.{layer}.") and len(t.shape) == 2:
            flat = t.data.reshape(-1)
            flat[:] = flat[rng.permutation(flat.size)]
            hit += 1
    r.data.flush()
    assert hit, f"{src}: no matrices in layer {layer}"
    return dst


def test_the_shipped_draft_is_small_and_pairs_with_its_target(target):
    assert DRAFT.is_file()
    total = sum(p.stat().st_size for p in DRAFT.parent.iterdir())
    assert total <= 12_000_000
    from graphgen.pair import check_pair
    assert check_pair(target, DRAFT) == []


def test_trained_draft_accepts_and_a_shuffled_layer_does_not(target, tmp_path):
    trained = _accepted(target, DRAFT)
    assert trained["mean_accepted_length"] > TRAINED_MIN, trained
    shuffled = _accepted(target, _shuffled_layer(DRAFT, tmp_path / "shuffled.gguf"))
    assert shuffled["mean_accepted_length"] < SHUFFLED_MAX, shuffled
    # drafting never changes a greedy target's tokens, however good the draft
    assert trained["tokens"] == shuffled["tokens"]
