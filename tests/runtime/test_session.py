"""Session behaviour: several sequences in one batch, graph reuse across rounds, results."""

import numpy as np
import pytest

from graphgen.errors import BatchError
from graphgen.runtime.session import Session
from graphgen.synth import make_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("sess") / "tiny.gguf"
    make_model(p, "dflash", seed=5)
    return p


@pytest.mark.parametrize("flash_attn", [False, True])
def test_several_sequences_in_one_block_equal_one_at_a_time(tiny, flash_attn):
    rng = np.random.default_rng(7)
    prompts = [rng.standard_normal((n, 128), dtype=np.float32) for n in (5, 9, 3)]
    blocks = [[7, 255, 255, 255], [11, 255, 255, 255], [2, 255, 255, 255]]

    with Session(tiny, n_ctx=256, n_seq=3, flash_attn=flash_attn) as s:
        for seq, x in enumerate(prompts):
            s.inject(x, 0, seq)
        together = s.block_multi([(seq, blocks[seq], len(prompts[seq])) for seq in range(3)]).logits

    for seq, x in enumerate(prompts):
        with Session(tiny, n_ctx=256, flash_attn=flash_attn) as s:
            s.inject(x, 0)
            alone = s.block(blocks[seq], len(x)).logits
        got = together[4 * seq:4 * seq + 4]
        np.testing.assert_allclose(got, alone, rtol=2e-4, atol=2e-4)
        assert (got.argmax(-1) == alone.argmax(-1)).all()


def test_block_removal_restores_the_same_draft(tiny):
    x = np.random.default_rng(1).standard_normal((6, 128), dtype=np.float32)
    with Session(tiny) as s:
        s.inject(x, 0)
        a = s.block([7, 255, 255, 255], 6).logits
        s.seq_rm(0, 6, -1)
        b = s.block([7, 255, 255, 255], 6).logits
    np.testing.assert_array_equal(a, b)


def test_other_sequences_are_masked(tiny):
    x = np.random.default_rng(2).standard_normal((6, 128), dtype=np.float32)
    y = np.random.default_rng(3).standard_normal((6, 128), dtype=np.float32)
    with Session(tiny, n_seq=2) as s:
        s.inject(x, 0, 0)
        a = s.block([7, 255, 255, 255], 6, seq=0).logits
        s.seq_rm(0, 6, -1)
        s.inject(y, 0, 1)  # another sequence's context must not leak into sequence 0
        b = s.block([7, 255, 255, 255], 6, seq=0).logits
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_inject_returns_fused_features(tiny):
    x = np.random.default_rng(4).standard_normal((3, 128), dtype=np.float32)
    with Session(tiny) as s:
        r = s.inject(x, 0)
    assert r.embd.shape == (3, 64) and r.logits is None
    # RMS-normed rows times a weight near 1: row norms near sqrt(n_embd)
    assert np.all(np.abs(np.linalg.norm(r.embd, axis=1) / 8.0 - 1) < 0.5)


def test_graph_reuse_builds_and_allocates_nothing(tiny):
    x = np.random.default_rng(9).standard_normal((6, 128), dtype=np.float32)
    y = np.random.default_rng(10).standard_normal((6, 128), dtype=np.float32)
    with Session(tiny) as s:
        s.inject(x, 0)
        a1 = s.block([7, 255, 255, 255], 6).logits
        s.seq_rm(0, 6, -1)
        before = dict(s.stats)
        a2 = s.block([7, 255, 255, 255], 6).logits   # same shapes: the block graph is reused
        assert s.stats["builds"] == before["builds"] and s.stats["allocs"] == before["allocs"]
        assert s.stats["reuses"] == before["reuses"] + 1
        np.testing.assert_array_equal(a1, a2)
        s.seq_rm(0, 6, -1)
        s.inject(y, 6)                                 # inject of the same shape: reused too
        b_reused = s.block([9, 255, 255, 255], 12).logits
        assert s.stats["builds"] == before["builds"]
    with Session(tiny, reuse_graphs=False) as fresh:  # the same steps, every graph built afresh
        fresh.inject(x, 0)
        fresh.inject(y, 6)
        b_fresh = fresh.block([9, 255, 255, 255], 12).logits
        assert fresh.stats["reuses"] == 0
    np.testing.assert_array_equal(b_reused, b_fresh)


def test_drafting_rounds_keep_positions_consecutive(tiny):
    """A drafting loop as llama.cpp runs it: a chunk of features, a block after it, the block
    removed, the next chunk where the last one ended. Every batch starts right after the last
    position the cache holds, so none is refused."""
    rng = np.random.default_rng(11)
    with Session(tiny, n_seq=2) as s:
        ends = {0: 0, 1: 0}
        for n in (5, 3, 4):
            for seq in (0, 1):
                s.inject(rng.standard_normal((n, 128), dtype=np.float32), ends[seq], seq)
                ends[seq] += n
                assert s.seq_pos_max(seq) == ends[seq] - 1
            s.block_multi([(seq, [7, 255, 255, 255], ends[seq]) for seq in (0, 1)])
            assert s.seq_pos_max(0) == ends[0] + 3
            for seq in (0, 1):
                s.seq_rm(seq, ends[seq], -1)
        assert s.seq_pos_max(0) == 11 and s.seq_pos_max(1) == 11
        with pytest.raises(BatchError, match="sequence 1: .*X = 11 .*Y = 13"):
            s.block([7, 255, 255, 255], 13, seq=1)


def test_results_keep_their_values_after_later_batches(tmp_path):
    """Outputs are read lazily; a Result read only after its graph computed again (and after the
    session closed) still holds its own batch's values."""
    from graphgen.synth import make_model
    from graphgen.runtime.session import Session
    path = tmp_path / "d.gguf"
    make_model(path, variant="dflash", block_size=4)
    with Session(path, n_ctx=256, n_ubatch=64) as s:
        rng = np.random.default_rng(1)
        x = rng.standard_normal((6, s.hparams.n_embd_inp_enc)).astype(np.float32)
        s.inject(x, 0)
        first = s.block([1, 2, 3, 4], 6)           # not read yet
        s.seq_rm(0, 6, -1)
        eager = s.block([1, 2, 3, 4], 6).logits.copy()  # the same cache state: same values
        s.seq_rm(0, 6, -1)
        s.block([5, 6, 7, 8], 6)
        np.testing.assert_array_equal(first.logits, eager)
        s.seq_rm(0, 6, -1)
        later = s.block([5, 6, 7, 8], 6)
    assert later.logits is not None and later.embd is not None
    assert not np.array_equal(later.logits, eager)


def test_shared_compute_buffer_gives_the_schedulers_values(tiny):
    """On one backend the graph kinds share one compute buffer and compute without the
    scheduler; steps whose graphs grow the buffer (and move the other kinds' graphs) must give
    exactly what separate schedulers give."""
    rng = np.random.default_rng(12)
    steps = []
    pos = 0
    for n_inj, n_blk in ((3, 4), (2, 4), (9, 4), (1, 4), (30, 4), (2, 4)):
        steps.append(("inject", rng.standard_normal((n_inj, 128), dtype=np.float32), pos))
        pos += n_inj
        steps.append(("block", [int(t) for t in rng.integers(0, 256, n_blk)], pos))
    outs = {}
    for shared in (True, False):
        with Session(tiny, n_ctx=256, n_ubatch=64) as s:
            s._share_sched = shared
            got = []
            for kind, data, p in steps:
                if kind == "inject":
                    got.append(s.inject(data, p))
                else:
                    r = s.block(data, p)
                    s.seq_rm(0, p, -1)
                    got.append(r)
            outs[shared] = [(r.embd, r.logits) for r in got]
            if shared:
                assert len({slot.sched for slot in s._scheds.values()}) == 1
                shared_size = s.compute_buffer_size()
            else:
                assert len({slot.sched for slot in s._scheds.values()}) == 2
                separate_size = s.compute_buffer_size()
    for (e1, l1), (e2, l2) in zip(outs[True], outs[False]):
        for a, b in ((e1, e2), (l1, l2)):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(a, b)
    assert shared_size < separate_size
