"""The target in transformers as a verifier's target (graphgen/speculative/transformers_target.py):
decodes in pieces against one forward over the whole text, the tail removal, the stop tokens, and
TargetVerifier's prefill and verification on it."""

from __future__ import annotations

import numpy as np
import pytest

TOKENS = [504, 3575, 282, 4649, 314, 253, 3175, 282, 2458, 3416]
LAYERS = [2, 15, 28]


torch_only = pytest.mark.torch


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("torch", reason="the transformers target needs the torch extra (graphgen[torch])")
    pytest.importorskip("transformers", reason="the transformers target needs the torch extra (graphgen[torch])")
    import torch
    from graphgen.accept.features import transformers_model
    from graphgen.speculative.targets import resolve
    torch.set_num_threads(1)
    path = resolve("smollm2")
    return path, transformers_model(path)


@torch_only
def test_decodes_in_pieces_give_one_forwards_features_and_tokens(model):
    from graphgen.accept.features import transformers_run
    from graphgen.speculative.transformers_target import TransformersTarget
    path, tm = model
    feats, logits = transformers_run(path, LAYERS, TOKENS, logits=True)
    tg = TransformersTarget(tm, LAYERS, n_seq=2)
    got_ids, got_f = [], []
    for a, b in ((0, 5), (5, 8), (8, 10)):
        ids, top, f = tg.decode([(1, t, a + i) for i, t in enumerate(TOKENS[a:b])])
        got_ids.append(ids[:, 0])
        got_f.append(f)
        # each row's candidates: its logits, best first
        assert np.all(np.diff(top, axis=1) <= 0)
        assert tg.best[1] == ids[:, 0].tolist()
    np.testing.assert_allclose(np.concatenate(got_f), feats.reshape(len(TOKENS), -1), atol=2e-4)
    assert np.concatenate(got_ids).tolist() == logits.argmax(axis=1).tolist()
    assert tg.width == 3 * tm.config.hidden_size and got_f[0].shape == (5, tg.width)


@torch_only
def test_a_tail_leaves_the_cache_and_rows_must_follow_it(model):
    from graphgen.errors import GraphgenError
    from graphgen.speculative.transformers_target import TransformersTarget
    _, tm = model
    tg = TransformersTarget(tm, LAYERS, stop_tokens=[2, 28])
    first = tg.decode([(0, t, i) for i, t in enumerate(TOKENS)])[2]
    with pytest.raises(GraphgenError, match="positions 3..3 do not follow the target's cache of 10"):
        tg.decode([(0, 9, 3)])
    tg.seq_rm(0, 6, -1)
    again = tg.decode([(0, t, 6 + i) for i, t in enumerate(TOKENS[6:])])[2]
    np.testing.assert_allclose(again, first[6:], atol=2e-4)
    with pytest.raises(GraphgenError, match="drops only a tail"):
        tg.seq_rm(0, 2, 4)
    assert tg.pieces([2, 3, 28])[1] == [True, False, True]


@torch_only
def test_the_verifier_accepts_the_targets_own_tokens_on_it(model):
    from graphgen.speculative.transformers_target import TransformersTarget
    from graphgen.speculative.verifier import TargetVerifier
    _, tm = model
    tg = TransformersTarget(tm, LAYERS)
    ver = TargetVerifier(tg)
    ver.attach(0, TOKENS[:5], None)
    feats, first = ver.prefill([0])[0]
    assert feats.shape == (5, tg.width)
    # the target's own greedy continuation, drafted: all of it accepted, then its next token
    with __import__("torch").inference_mode():
        alone = tm.generate(__import__("torch").tensor([TOKENS[:5]]), max_new_tokens=5, do_sample=False)[0].tolist()[5:]
    assert first == alone[0]
    n_acc, nxt, rows, eog = ver.verify(0, {0: (first, 5, alone[1:4])})[0]
    assert (n_acc, nxt, eog) == (3, alone[4], False) and rows.shape == (4, tg.width)
    # the rejected rows left the target's cache
    assert tg.caches[0].get_seq_length() == 5 + 3 + 1
    n_acc, nxt, _, _ = ver.verify(1, {0: (nxt, 9, [alone[0], alone[0]])})[0]
    assert n_acc in (0, 1) and tg.caches[0].get_seq_length() == 9 + n_acc + 1
