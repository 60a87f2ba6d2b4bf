"""The llama.cpp engine for graphgen's drivers (graphgen/reference/session.py): `ReferenceSession`, a
Session-like draft whose batches run in b11739 in a child process, `ReferenceTarget`, the real target
there, and `Child`, which says how the child ended when it dies."""

from __future__ import annotations

import numpy as np
import pytest

from graphgen.errors import BatchError
from graphgen.reference.runner import ReferenceFailed
from graphgen.reference.session import ReferenceSession, ReferenceTarget, TargetError, draft_settings, end_child
from graphgen.runtime.session import Session
from graphgen.synth import make_model

pytestmark = pytest.mark.reference

N_EMBD = 64


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    path = tmp_path_factory.mktemp("refsession") / "draft.gguf"
    make_model(path, "dflash", n_embd=N_EMBD, n_layer=1, target_layers=[1, 3], seed=7)
    return path


def _features(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 2 * N_EMBD), dtype=np.float32)


def test_settings_are_checked_before_any_child_starts():
    assert draft_settings(64, 16, 1, "f16", "q8_0", 2, 1) == {
        "n_ctx": 64, "n_ubatch": 16, "flash_attn": True, "type_k": "f16", "type_v": "q8_0", "n_seq": 2,
        "n_threads": 1}
    with pytest.raises(ValueError, match="^type_v must be one of .*, got 'q3_k'$"):
        draft_settings(64, 16, False, "f16", "q3_k", 1, 1)
    with pytest.raises(ValueError, match="runs on the CPU"):
        ReferenceSession("never-opened.gguf", backend="Vulkan0")
    end_child(None)  # nothing to end


def test_a_draft_runs_in_b11739_as_in_graphgen(draft):
    kw = dict(n_ctx=64, n_ubatch=16, n_seq=2, type_kv="f16")
    with ReferenceSession(draft, **kw) as ref, Session(draft, **kw) as ours:
        assert (ref.n_batch, ref.n_vocab, ref.n_embd, ref.n_seq) == (16, 256, N_EMBD, 2)
        assert ref.hparams.block_size == ours.hparams.block_size
        # sequence 1 only: the sequence travels with the rows
        a = ref.inject(_features(5), 0, seq=1)
        ours.inject(_features(5), 0, seq=1)
        assert a.logits is None and a.h_nextn.shape == (5, N_EMBD)
        assert ref.seq_pos_max(1) == 4 and ref.seq_pos_max(0) == -1
        r = ref.block([7, 255, 255, 255], 5, seq=1)
        o = ours.block([7, 255, 255, 255], 5, seq=1)
        assert r.logits.shape == (4, 256) and r.logits.dtype == np.float32
        # graphgen's graphs are b11739's: the same logits, bit for bit
        assert r.logits.tobytes() == np.asarray(o.logits, dtype=np.float32).tobytes()
        assert ref.seq_rm(1, 5, -1) is True and ref.seq_pos_max(1) == 4
        # two sequences in one batch: each block's rows in the order given
        ref.inject(_features(3, seed=1), 0, seq=0)
        both = ref.block_multi([(0, [9, 255, 255, 255], 3), (1, [7, 255, 255, 255], 5)])
        ref.seq_rm(0, 3, -1)
        ref.seq_rm(1, 5, -1)
        alone = ref.block([7, 255, 255, 255], 5, seq=1)
        assert both.logits.shape == (8, 256)
        np.testing.assert_allclose(both.logits[4:], alone.logits, rtol=1e-5, atol=1e-5)


def test_a_batch_b11739_refuses_is_a_batch_error(draft):
    with ReferenceSession(draft, n_ctx=64, n_ubatch=16) as ref:
        with pytest.raises(BatchError, match=r"^llama.cpp: llama_batch_ext refused row 16 \(error -1: the batch is "
                                             "full at its n_batch rows\\)$"):
            ref.inject(_features(20), 0)
        # the session goes on
        assert ref.inject(_features(3), 0).h_nextn.shape == (3, N_EMBD)


def test_a_child_that_dies_is_said_and_the_session_is_closed(draft):
    ref = ReferenceSession(draft, n_ctx=64, n_ubatch=16)
    try:
        proc = ref.child.proc
        # rows of the wrong width: the child cannot read them and dies with a Python error
        with pytest.raises(ReferenceFailed) as e:
            ref._batch({"op": "inject", "seq": 0, "pos0": 0, "x": "AAAA"})
        assert str(e.value).startswith("llama.cpp b11739 ended (exit 1): ") and "reshape" in str(e.value)
        assert e.value.returncode == 1 and proc.poll() == 1
        with pytest.raises(ReferenceFailed, match="^the llama.cpp session is closed$"):
            ref.seq_pos_max(0)
    finally:
        ref.close()
    with pytest.raises(ReferenceFailed, match="^the llama.cpp session is closed$"):
        ref.inject(_features(1), 0)


def test_closing_a_session_ends_its_child(draft):
    ref = ReferenceSession(draft, n_ctx=64, n_ubatch=16)
    proc = ref.child.proc
    ref.close()
    assert proc.wait(timeout=60) == 0 and ref.child is None and ref.model is None
    ref.close()  # twice is nothing


@pytest.fixture(scope="module")
def smollm2():
    from graphgen.speculative.targets import resolve
    return resolve("smollm2")


def test_a_target_answers_in_numpy_and_lends_a_draft_its_child(smollm2, tmp_path):
    make_model(tmp_path / "d.gguf", "dflash", target=smollm2, n_layer=1, target_layers=[1, 4], seed=2)
    with ReferenceTarget(smollm2, [1, 4], n_ctx=256, n_batch=32) as tg:
        assert (tg.n_vocab, tg.n_embd, tg.n_layer, tg.width) == (49152, 576, 30, 2 * 576)
        toks = tg.tokenize("Once upon a time")
        pieces, eog = tg.pieces(toks + [2])
        assert b"".join(pieces[:-1]) == b"Once upon a time" and eog == [False] * len(toks) + [True]
        rows = [(0, t, i) for i, t in enumerate(toks)]
        ids, top, feats = tg.decode(rows)
        assert ids.dtype == np.int32 and ids.shape == top.shape == (len(toks), 64)
        assert feats.shape == (len(toks), 2 * 576) and (np.diff(top, axis=1) <= 0).all()
        tg.seq_rm(0, -1, -1)
        none, full, again = tg.decode(rows, full_logits=True)
        assert none is None and full.shape == (len(toks), 49152)
        assert (ids[:, 0] == full.argmax(1)).all() and np.array_equal(top[:, 0], full.max(1))
        assert np.array_equal(feats, again)
        tg.seq_rm(0, -1, -1)
        with pytest.raises(TargetError, match=r"^the target \(SmolLM2-135M-Instruct.Q4_1.gguf\): llama_batch_ext "
                                              r"refused row 32 \(error -1: the batch is full at 32 rows\)$"):
            tg.decode([(0, 1, i) for i in range(33)])
        tg.seq_rm(0, -1, -1)
        got, times, trace = tg.generate({0: toks}, 3, temp=0.0, seed=1)
        assert got[0][:len(toks)] == toks and len(got[0]) == len(toks) + 3 and got[0][len(toks)] == ids[-1, 0]
        assert set(times) == {"prompt", "generation"} and len(trace[0]) == 3
        # a draft opened beside the target runs in the target's child, and closing it leaves the target
        with tg.open_draft(tmp_path / "d.gguf", n_ctx=64, n_ubatch=16) as d:
            assert d.child is tg.child and (d.n_vocab, d.n_embd) == (49152, 576)
            r = d.block([1, 16, 16], 0)
            assert r.logits.shape == (3, 49152)
        # the target's cache as generate left it: the prompt and every generated token but the last,
        # sampled and never decoded
        assert tg.child.proc.poll() is None and tg.seq_pos_max(0) == len(toks) + 1
