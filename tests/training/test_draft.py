"""The draft to train (graphgen/training/draft.py): its shape in training's terms and as the
authors' spec, the draft vocabulary, the fresh authors' model and DFlash2's convolutions run one
block at a time."""

from __future__ import annotations

import numpy as np
import pytest

from graphgen import training as T
from graphgen.training.draft import _BlockwiseConvs

VOCAB = 256
BLOCK = 4


def _shape(variant: str) -> T.DraftShape:
    return T.DraftShape(variant=variant, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=96, n_layer=1,
                        block_size=BLOCK, n_vocab=VOCAB, n_target_layers=4, target_layer_ids=[0, 2],
                        mask_token_id=255, rope_theta=10000.0, rms_eps=1e-6, conv_kernel=2, conv_group=16,
                        selector_rank=4, selector_top_k=4, markov_rank=8, draft_vocab=64)


def _tokens_corpus(*seqs) -> T.Corpus:
    toks = [np.array(t, dtype=np.int32) for t in seqs]
    feats = [np.zeros((len(t) - 1, 8), dtype=np.float16) for t in toks]
    return T.Corpus([1, 3], toks, [1] * len(toks), feats)


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("dflash.model")
    pytest.importorskip("speculators")
    return torch


# -- the draft vocabulary -----------------------------------------------------------------------

def test_the_draft_vocabulary_is_the_most_frequent_tokens_sorted():
    c = _tokens_corpus([5, 5, 5, 9, 9, 8, 7, 3, 3, 3, 3])
    assert list(T.draft_vocabulary(c, 2, VOCAB)) == [3, 5]
    assert list(T.draft_vocabulary(c, 3, VOCAB)) == [3, 5, 9]
    # 7 and 8 are seen once each: the tie goes to the lower id
    assert list(T.draft_vocabulary(c, 4, VOCAB)) == [3, 5, 7, 9]


def test_the_draft_vocabulary_counts_every_sequence():
    # 4 is the most frequent only over both sequences together
    c = _tokens_corpus([1, 1, 4], [4, 4, 2])
    assert list(T.draft_vocabulary(c, 1, VOCAB)) == [4]
    assert list(T.draft_vocabulary(c, 3, VOCAB)) == [1, 2, 4]


# -- the shape -------------------------------------------------------------------------------

def test_each_trained_variant_is_its_authors_class():
    assert T.VARIANT_AUTHORS == {"dflash": "zlab", "dflash2": "zlab", "dspark": "speculators"}
    assert [_shape(v).authors for v in ("dflash", "dflash2", "dspark")] == ["zlab", "zlab", "speculators"]


def test_only_dspark_rows_start_one_past_the_anchor():
    # z-lab's block row 0 is the anchor and predicts nothing; speculators' DSpark samples from the anchor
    assert [_shape(v).offset for v in ("dflash", "dflash2", "dspark")] == [0, 0, 1]


def test_the_spec_counts_target_layers_as_the_gguf_does():
    s = _shape("dflash").spec()
    # training numbers target layers as the authors do (the output of layer i); the spec as the GGUF (+1)
    assert s.target_layers == [1, 3] and s.n_target_layers == 4
    assert (s.authors, s.variant, s.block_size, s.mask_token_id) == ("zlab", "dflash", BLOCK, 255)
    assert (s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, s.n_vocab) == (64, 4, 2, 16, 96, VOCAB)
    assert s.d2t_vocab is None
    d2 = _shape("dflash2").spec()
    assert (d2.conv_kernel, d2.conv_group, d2.selector_rank, d2.selector_top_k) == (2, 16, 4, 4)
    assert d2.d2t_vocab is None


def test_dspark_carries_its_draft_vocabulary_into_the_spec():
    s = _shape("dspark").spec()
    assert (s.authors, s.d2t_vocab, s.markov_rank, s.conf, s.sample_from_anchor) == ("speculators", 64, 8, True, True)


def test_an_untrained_variant_is_refused():
    shape = _shape("dflash")
    shape.variant = "lilicorr"
    with pytest.raises(T.TrainError, match="^--variant lilicorr: trained variants are dflash, dflash2, dspark$"):
        shape.spec()


# -- the fresh authors' model ----------------------------------------------------------------

def _embed():
    return np.random.default_rng(1).standard_normal((VOCAB, 64)).astype(np.float32)


def test_a_zlab_dflash2_draft_starts_with_identity_convolutions(torch):
    model = T.new_draft(_shape("dflash2"), _embed())
    assert type(model).__name__ == "DFlash2DraftModel"
    h = torch.randn(1, 2 * BLOCK, 64)
    convs = [c for layer in model.layers for c in (layer.attention_conv, layer.mlp_conv)]
    assert len(convs) == 2
    with torch.no_grad():
        for conv in convs:
            out, dyn = conv.prepare(h)
            assert torch.equal(out, h) and not dyn.any()
            assert torch.equal(conv.finish(h, dyn), h)


def test_a_speculators_draft_needs_its_target_folder_and_vocabulary(torch, tmp_path):
    shape = _shape("dspark")
    with pytest.raises(T.TrainError, match="needs its target's folder and a draft vocabulary"):
        T.new_draft(shape, _embed(), None, np.arange(64))
    from graphgen.authors import checkpoint as C
    folder = tmp_path / "target"
    C._write_target(folder, shape.spec())
    with pytest.raises(T.TrainError, match="^draft vocabulary of 63 tokens; the shape says 64$"):
        T.new_draft(shape, _embed(), folder, np.arange(63))


def test_a_speculators_draft_borrows_the_targets_rows_frozen(torch, tmp_path):
    shape = _shape("dspark")
    from graphgen.authors import checkpoint as C
    folder = tmp_path / "target"
    C._write_target(folder, shape.spec())
    embed = _embed()
    vocab = np.sort(np.random.default_rng(2).choice(VOCAB, 64, replace=False))
    model = T.new_draft(shape, embed, folder, vocab)
    assert type(model).__name__ == "DSparkDraftModel"
    assert torch.equal(model.embed_tokens.weight, torch.from_numpy(embed))
    # its own head starts from the target's rows of the draft vocabulary, in the vocabulary's order
    assert torch.equal(model.lm_head.weight, torch.from_numpy(embed[vocab]))
    # the draft vocabulary maps draft id i to target id vocab[i]
    assert (model.d2t.long() + torch.arange(64)).tolist() == vocab.tolist()
    assert model.t2d.sum() == 64 and model.t2d[torch.as_tensor(vocab)].all()
    # the borrowed embeddings stay as the target has them; the rest of the draft trains
    assert not model.embed_tokens.weight.requires_grad
    assert model.fc.weight.requires_grad and model.markov_head.markov_w1.weight.requires_grad


def test_blockwise_convolutions_see_one_block_at_a_time(torch):
    from graphgen.authors import checkpoint as C
    model = T.new_draft(_shape("dflash2"), _embed())
    C._reinit(model, 3, 1.0)  # kernels away from the identity, so a row reading the block before shows
    conv = model.layers[0].attention_conv
    h = torch.randn(2, 3 * BLOCK, 64)
    with torch.no_grad():
        whole, _ = conv.prepare(h)
        per_block = [conv.prepare(h[:, i:i + BLOCK]) for i in range(0, 3 * BLOCK, BLOCK)]
        with _BlockwiseConvs(model, BLOCK):
            out, dyn = conv.prepare(h)
            fin = conv.finish(h, dyn)
        assert out.shape == h.shape and dyn.shape[:2] == h.shape[:2]
        torch.testing.assert_close(out, torch.cat([p[0] for p in per_block], 1), rtol=0, atol=0)
        torch.testing.assert_close(fin, torch.cat([conv.finish(h[:, i:i + BLOCK], p[1])
                                                   for i, p in zip(range(0, 3 * BLOCK, BLOCK), per_block)], 1),
                                   rtol=0, atol=0)
        # without it the causal convolution reads across the blocks' edges
        assert not torch.equal(whole, out)
        # and afterwards the authors' own methods are back
        assert "prepare" not in vars(conv) and "finish" not in vars(conv)
        assert torch.equal(conv.prepare(h)[0], whole)
