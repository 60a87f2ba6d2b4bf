"""One compute buffer for all of a session's graph kinds: a larger graph grows (moves) it, the
other kinds' graphs lose their places and are placed again when next used. Every output must be
what a session that builds every graph afresh gives, and nothing may keep a pointer into the
freed buffer.

The runs happen in a worker process started with MALLOC_PERTURB_ set, so memory the buffer held
is overwritten when freed: a tensor left pointing there is read as garbage (a segfault in the
scheduler) instead of by luck as what it held. A worker that dies fails its case alone.
"""

import numpy as np
import pytest

from compute_buffer import DRAFTS
from workers import Isolated

VARIANTS = tuple(DRAFTS)


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory):
    iso = Isolated(tmp_path_factory.mktemp("perturbed") / "graphgen.err", env={"MALLOC_PERTURB_": "165"})
    yield iso
    iso.close()


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, perturbed):
    d = tmp_path_factory.mktemp("drafts")
    return {name: perturbed.call("compute_buffer:make_draft", name=name, path=str(d / f"{name}.gguf"))
            for name in VARIANTS}


BLOCK = 4  # make_model's default block size


@pytest.mark.parametrize("flash_attn,type_kv,record", [(False, "f32", True), (True, "f16", True),
                                                       (False, "f16", False), (True, "f32", False)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_block_after_a_larger_inject(variant, flash_attn, type_kv, record, drafts, perturbed):
    """An inject of one row, a block after it, an inject of 64 rows (which grows the buffer when
    it is the largest graph), the same block again, whose graph is reused."""
    bs = BLOCK
    steps = [["inject", 0, 1, 0], ["block", [[0, bs, 1]]], ["inject", 0, 64, 1], ["block", [[0, bs, 65]]]]
    got = perturbed.call("compute_buffer:same_outputs", model=drafts[variant], steps=steps, flash_attn=flash_attn,
                         type_kv=type_kv, record=record)
    assert got["diffs"] == []
    assert got["stats"]["reuses"] >= 1  # the last block reused its graph (placed again if it had moved)


def _random_steps(rng, bs: int, n_seq: int, n_steps: int, encode: bool) -> list:
    nxt = [0] * n_seq
    steps = []
    for k in range(n_steps):
        r = rng.random()
        if r < 0.45 or not any(nxt):
            seq = int(rng.integers(0, n_seq))
            # a few sizes, so graphs are reused across the buffer's growth; the cache stays within
            # its first 256 cells (n_kv, part of a graph's shape, stays the same)
            # the large sizes come later on, so graphs grow past ones built before them
            n = int(rng.choice([1, 1, 2, 1 + (63 * k) // n_steps]))
            n = min(n, 250 // n_seq - nxt[seq] - bs - 1)
            if n < 1:
                continue
            steps.append(["inject", seq, n, nxt[seq]])
            nxt[seq] += n
        elif r < 0.9:
            # some of the sequences that have a context draft, one block length for all (DFlash2
            # needs that)
            live = [s for s in range(n_seq) if nxt[s]]
            seqs = [s for s in live if rng.random() < 0.6] or live[-1:]
            n = bs if rng.random() < 0.8 else 2
            steps.append(["block", [[s, n, nxt[s]] for s in seqs]])
        elif encode:
            seq = int(rng.integers(0, n_seq))  # the encoder writes no cache: the position stays
            steps.append(["encode", seq, int(rng.choice([3, 64])), nxt[seq]])
    return steps


@pytest.mark.parametrize("variant", VARIANTS)
def test_random_orders_of_graph_kinds_and_sizes(variant, drafts, perturbed):
    """Eight random runs of inject, block and encoder graphs whose sizes grow over the run; not
    every run moves a graph that is used again, but together they must, or nothing was tested."""
    replaced = []
    for seed in range(8):
        rng = np.random.default_rng(400 + seed)
        n_seq = int(rng.integers(1, 4))
        steps = _random_steps(rng, BLOCK, n_seq, 24, encode=variant == "dflash")
        got = perturbed.call("compute_buffer:same_outputs", model=drafts[variant], steps=steps,
                             flash_attn=bool(rng.random() < 0.5), type_kv=str(rng.choice(["f16", "f32"])),
                             n_seq=n_seq, record=bool(seed % 2))
        assert got["diffs"] == [], f"seed {seed}: {steps}"
        replaced.append(got["stats"]["replaced"])
    assert sum(r > 0 for r in replaced) >= 3, f"graphs placed again per run: {replaced}"
