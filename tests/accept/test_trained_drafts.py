"""The shipped trained drafts (drafts/) draft for their target: each (z-lab DFlash, z-lab DFlash2,
speculators DSpark) accepts well above chance on prompts its training never saw, in graphgen beside
b11739's target, and the same draft with one layer's weights shuffled does not. None needs torch:
the GGUFs run in graphgen and the target in b11739."""

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
DRAFTS = ["smollm2-dflash", "smollm2-dflash2", "smollm2-dspark"]
CLI = [sys.executable, "-m", "graphgen.cli"]
N_PREDICT = 32
# the yardstick: the field's mean acceptance length, a draft's accepted run with the target's
# own token (1 + accepted / drafts), so a draft that never hits has 1.0
TRAINED_MIN_LENGTH = 1.3
# a shuffled layer leaves a draft that hits by chance only: far under what a trained one gets
SHUFFLED_MAX_LENGTH = 1.1
SHIPPED_MAX_BYTES = 40_000_000


def _prompts():
    # none of them is a training prompt: train.py writes its prompts from templates apart from these
    from graphgen.training import HELD_OUT_PROMPTS
    return HELD_OUT_PROMPTS


@pytest.fixture(scope="module")
def target():
    from graphgen.speculative.targets import resolve
    return resolve("smollm2")


def _accepted(target, draft) -> dict:
    prompts = _prompts()
    cmd = CLI + ["draft", "-m", str(target), "-md", str(draft), "-n", str(N_PREDICT), "--temp", "0", "--json",
                 "--no-baseline", "-np", str(len(prompts)), "-t", "2"]
    for p in prompts:
        cmd += ["-p", p]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["blocks"] > 0 and out["drafted_tokens"] > 0, out  # nothing drafted measures nothing
    return out


def _length(run: dict) -> float:
    # the field's mean acceptance length, 1 + accepted / drafts (the target's own token counted, so a
    # draft that never hits has 1.0), recomputed from the rounds and checked against the summary's
    drafts = [r for r in run["rounds_detail"] if r["draft"]]
    length = 1.0 + sum(r["n_accepted"] for r in drafts) / len(drafts)
    assert run["drafts"] == len(drafts) and run["mean_acceptance_length"] == pytest.approx(length), run
    return length


def _shuffled_layer(src: Path, dst: Path, layer: int = 0, seed: int = 0) -> Path:
    """A copy of `src` whose layer `layer` has every matrix's elements permuted (seeded; a quantized
    matrix's blocks, scale and values together), in place through gguf-py's writable mapping: same
    shapes and types, the layer's learning gone."""
    import gguf
    shutil.copy(src, dst)
    r = gguf.GGUFReader(str(dst), "r+")
    rng = np.random.default_rng(seed)
    hit = 0
    for t in r.tensors:
        if t.name.startswith(f"blk.{layer}.") and len(t.shape) == 2:
            _, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
            flat = t.data.reshape(-1)
            units = flat.view(np.uint8).reshape(-1, type_size) if t.tensor_type not in (
                gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16) else flat
            units[:] = units[rng.permutation(len(units))]
            hit += 1
    r.data.flush()
    assert hit, f"{src}: no matrices in layer {layer}"
    return dst


def test_the_shipped_drafts_are_small_and_pair_with_their_target(target):
    from graphgen.speculative.pair import check_pair
    total = 0
    for name in DRAFTS:
        folder = ROOT / "drafts" / name
        for f in ("config.json", "model.safetensors", "draft.gguf", "card.md", "train.json"):
            assert (folder / f).is_file(), f"{folder}: no {f}"
        total += sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        assert check_pair(target, folder / "draft.gguf") == [], name
    assert total <= SHIPPED_MAX_BYTES, total


@pytest.mark.parametrize("name", DRAFTS)
def test_trained_draft_accepts_and_a_shuffled_layer_does_not(target, tmp_path, name):
    draft = ROOT / "drafts" / name / "draft.gguf"
    trained = _accepted(target, draft)
    assert _length(trained) > TRAINED_MIN_LENGTH, (name, trained)
    shuffled = _accepted(target, _shuffled_layer(draft, tmp_path / "shuffled.gguf"))
    assert _length(shuffled) < SHUFFLED_MAX_LENGTH, (name, shuffled)
    # drafting never changes a greedy target's tokens, however good the draft
    assert trained["tokens"] == shuffled["tokens"]
