"""What the fuzz harness cannot see from outside: memory refusal, failed batches leaving no
trace, sessions in threads, and the validation layer's own checks."""

import threading

import numpy as np
import pytest

import graphgen.runtime.batch as V
from graphgen.runtime.model import available_memory
from graphgen.errors import BatchError, GGUFModelError, KVCacheFullError
from graphgen.models.head import BlockRules
from graphgen.runtime.model import load
from graphgen.runtime.session import Session
from graphgen.synth import make_model


DSPARK_RULES = BlockRules("dspark", equal_blocks=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("rel") / "tiny.gguf"
    make_model(p, "dflash", seed=5)
    return p


def test_refuses_weights_that_do_not_fit(tiny, monkeypatch):
    import graphgen.runtime.model as M
    monkeypatch.setattr(M, "available_memory", lambda: 1000)
    m = load(tiny)  # reading the metadata allocates nothing
    with pytest.raises(GGUFModelError, match=r"weight tensors need .*only"):
        Session(m)
    monkeypatch.undo()
    with Session(m) as s:  # and the refusal left nothing half-built
        assert s.model.tok_embd is not None


def test_available_memory_is_known():
    have = available_memory()
    assert have is None or have > 0


def _feat(n, w, seed):
    return np.random.default_rng(seed).standard_normal((n, w), dtype=np.float32)


def test_failed_batches_leave_no_trace(tiny):
    """After a cache-full and bad-shape batches, the next valid batch equals a clean session's."""
    outs = []
    for hostile in (False, True):
        # 256 cells (n_ctx is padded to 256 as llama.cpp does): 64 + 2 x 64 + 62 fill all but 2
        with Session(tiny, n_ctx=256, n_ubatch=64) as s:
            w = s.hparams.n_embd_inp_enc
            s.inject(_feat(64, w, 1), 0)
            if hostile:
                for k in range(1, 3):
                    s.inject(_feat(64, w, 1 + k), 64 * k)
                s.inject(_feat(62, w, 9), 192)
                with pytest.raises(KVCacheFullError):
                    s.block([7, 255, 255, 255], 254)
                s.seq_rm(0, 64, -1)
                for bad in (lambda: s.inject(_feat(3, w + 1, 3), 64), lambda: s.block([7, 256], 64),
                            lambda: s.block([7, 255], -1), lambda: s.block([7] * 65, 64)):
                    with pytest.raises(BatchError):
                        bad()
            outs.append(s.block([7, 255, 255, 255], 64).logits)
    assert np.array_equal(outs[0], outs[1])


def _run(path, seed, out, k):
    with Session(path, n_ctx=64, n_ubatch=16) as s:
        w = s.hparams.n_embd_inp_enc
        res = []
        for r in range(4):
            s.inject(_feat(6, w, seed + r), 6 * r)
            res.append(s.block([7, 255, 255, 255], 6 * r + 6).logits.copy())
            s.seq_rm(0, 6 * r + 6, -1)
        out[k] = res


def test_one_session_per_thread(tiny, tmp_path):
    other = tmp_path / "other.gguf"
    make_model(other, "dspark", seed=2)
    jobs = [(tiny, 10), (other, 20), (tiny, 30), (other, 40)]
    want = {}
    for k, (p, seed) in enumerate(jobs):
        _run(p, seed, want, k)
    got = {}
    threads = [threading.Thread(target=_run, args=(p, seed, got, k)) for k, (p, seed) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(want)
    for k in want:
        assert all(np.array_equal(a, b) for a, b in zip(want[k], got[k]))


def test_positions_past_int32_are_refused():
    with pytest.raises(BatchError, match="largest position"):
        V.block_arrays([(0, [1, 2, 3], 2**31 - 2)], None, 256)
    with pytest.raises(BatchError, match="negative position"):
        V.check_positions(-1, 3)
    with pytest.raises(BatchError, match="sequence id"):
        V.block_arrays([(True, [1], 0)], None, 256)
    with pytest.raises(BatchError, match="equal blocks"):
        V.block_arrays([(0, [1, 2], 0), (1, [1], 0)], DSPARK_RULES, 256)
    toks, pos, seq = V.block_arrays([(0, [1, 2], 5), (1, [3, 4], 9)], DSPARK_RULES, 256)
    assert pos.tolist() == [5, 6, 9, 10] and seq.tolist() == [0, 0, 1, 1] and toks.dtype == np.int32


def test_embd_state_and_features():
    with pytest.raises(BatchError, match=r"embd_state must be \[4, 64\]"):
        V.check_embd_state(np.zeros((3, 64)), 4, 64)
    with pytest.raises(BatchError, match=r"\[n_tokens, 128\]"):
        V.check_features(np.zeros((1, 2, 128)), 128)
    with pytest.raises(BatchError, match="NaN"):
        V.check_features(np.full((1, 128), np.nan), 128)


def test_sequence_ids_checked_before_the_cast():
    with pytest.raises(BatchError, match=r"sequence id 1099511627776 is outside \[0, 2\)"):
        V.check_seq(2**40, 2)
    assert V.check_seq(1, 2) == 1
