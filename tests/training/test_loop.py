"""The training loop (graphgen/training/loop.py) on tiny authors' models: the batch lays
out what the authors' loop asks of a block, the training forward of many blocks equals the authors'
inference forward of each block alone, and a few steps learn a pattern the data holds."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("dflash.model")
pytest.importorskip("speculators")

from graphgen import training as T  # noqa: E402

MASK = 255
VOCAB = 256
BLOCK = 4


def _shape(variant: str) -> T.DraftShape:
    return T.DraftShape(variant=variant, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=96, n_layer=1,
                        block_size=BLOCK, n_vocab=VOCAB, n_target_layers=4, target_layer_ids=[0, 2],
                        mask_token_id=MASK, rope_theta=10000.0, rms_eps=1e-6, conv_kernel=2, conv_group=16,
                        selector_rank=4, selector_top_k=4, markov_rank=8, draft_vocab=64)


def _corpus(seqs, seed=0, width=128, top=True) -> T.Corpus:
    """A corpus of the given (tokens, start) pairs with random features and, at every decoded row,
    a top list whose best entry is the next token."""
    rng = np.random.default_rng(seed)
    toks = [np.array(t, dtype=np.int32) for t, _ in seqs]
    feats = [rng.standard_normal((len(t) - 1, width)).astype(np.float16) for t in toks]
    top_ids, top_logits = [], []
    if top:
        for t in toks:
            ids = np.stack([np.r_[t[r + 1], (t[r + 1] + 1 + np.arange(T.TOP_KEPT - 1)) % 200]
                            for r in range(len(t) - 1)]).astype(np.int32)
            top_ids.append(ids)
            top_logits.append(np.tile(-np.arange(T.TOP_KEPT, dtype=np.float16), (len(t) - 1, 1)))
    return T.Corpus([1, 3], toks, [s for _, s in seqs], feats, top_ids=top_ids, top_logits=top_logits)


@pytest.mark.parametrize("offset", [0, 1])
def test_a_batch_asks_each_block_row_for_the_token_the_authors_loop_drafts_there(offset):
    toks = [10, 11, 12, 13, 14, 15, 16, 17]
    c = _corpus([(toks, 3)])
    # four anchors on generated tokens 3..6: all of them are drawn
    b = T.make_batch(c, [0], 4, BLOCK, MASK, np.random.default_rng(0), offset=offset)
    ctx = len(toks) - 1
    labels = b.labels.view(4, BLOCK).numpy()
    noise = b.noise.view(4, BLOCK).numpy()
    index = b.draft_index.view(4, BLOCK).numpy()
    prev = b.prev.view(4, BLOCK).numpy()
    visible = b.visible.view(4, BLOCK, ctx + 4 * BLOCK).numpy()
    pos = b.pos[0].numpy()
    for j, a in enumerate([3, 4, 5, 6]):
        assert list(noise[j]) == [toks[a]] + [MASK] * (BLOCK - 1)
        for r in range(BLOCK):
            p = a + r + offset
            if r + offset == 0 or p >= len(toks):
                assert labels[j, r] == -100 and index[j, r] == -1
                continue
            assert labels[j, r] == toks[p]
            assert index[j, r] == r + offset - 1          # 0: the first drafted token
            assert prev[j, r] == toks[p - 1]
            # the soft label of the token at p is the target's top at the row before it
            assert b.soft_ids[0, j * BLOCK + r, 0] == toks[p]
        # context rows strictly before the anchor, and the block's own rows, nothing else
        assert visible[j, :, :ctx].sum(-1).tolist() == [a] * BLOCK
        assert visible[j, :, :a].all()
        own = np.zeros(4 * BLOCK, dtype=bool)
        own[j * BLOCK:(j + 1) * BLOCK] = True
        assert (visible[j, :, ctx:] == own).all()
        assert list(pos[ctx + j * BLOCK: ctx + (j + 1) * BLOCK]) == [a + i for i in range(BLOCK)]
    assert list(pos[:ctx]) == list(range(ctx))


def _draft(variant, tmp_path, c):
    from graphgen.authors import checkpoint as C
    shape = _shape(variant)
    embed = np.random.default_rng(1).standard_normal((VOCAB, 64)).astype(np.float32)
    folder = None
    vocab = None
    if shape.authors == "speculators":
        folder = tmp_path / "target"
        C._write_target(folder, shape.spec())
        vocab = T.draft_vocabulary(c, shape.draft_vocab, VOCAB)
    torch.manual_seed(0)
    model = T.new_draft(shape, embed, folder, vocab)
    # away from the identity init, so a row seeing a wrong row or a wrong block shows
    C._reinit(model, 3, 1.0)
    if shape.authors == "speculators":
        with torch.no_grad():
            model.embed_tokens.weight.copy_(torch.from_numpy(embed))
    return shape, model.eval(), torch.from_numpy(embed)


def _authors_block(model, shape, embed, feats, block_tokens, a):
    """One block at anchor `a` as the authors' inference computes it: the context features of rows
    before the anchor, the block, no mask (full attention over both)."""
    pos = torch.arange(a + BLOCK)[None]
    noise = embed[torch.tensor(block_tokens)][None]
    ctx = feats[:a][None]
    if shape.authors == "zlab":
        return model(position_ids=pos, noise_embedding=noise, target_hidden=ctx)[0]
    m = model
    target = m.hidden_norm(m.fc(ctx))
    h = m.embed_tokens(torch.tensor(block_tokens)[None])
    pos_emb = m.rotary_emb(h, pos)
    for layer in m.layers:
        h = layer(target_hidden=target, hidden_states=h, position_ids=pos, attention_mask=None, use_cache=False,
                  position_embeddings=pos_emb)
    return m.norm(h)[0]


@pytest.mark.parametrize("variant", ["dflash", "dflash2", "dspark"])
def test_many_blocks_in_one_forward_equal_each_block_alone(variant, tmp_path):
    toks = [int(x) for x in np.random.default_rng(2).integers(0, 200, 20)]
    c = _corpus([(toks, 6)])
    shape, model, embed = _draft(variant, tmp_path, c)
    b = T.make_batch(c, [0], 5, BLOCK, MASK, np.random.default_rng(4), offset=shape.offset)
    with torch.no_grad():
        hidden = T.block_hidden(model, shape, embed, b, bf16=False)[0]
        feats = b.feats[0]
        noise = b.noise[0]
        pos = b.pos[0]
        ctx = feats.shape[0]
        for j in range(5):
            a = int(pos[ctx + j * BLOCK])
            alone = _authors_block(model, shape, embed, feats, noise[j * BLOCK:(j + 1) * BLOCK].tolist(), a)
            torch.testing.assert_close(hidden[j * BLOCK:(j + 1) * BLOCK], alone, rtol=1e-4, atol=1e-4)


def test_a_row_whose_whole_top_lies_outside_the_draft_vocabulary_leaves_the_loss_finite(tmp_path):
    toks = [int(x) for x in np.random.default_rng(5).integers(0, 60, 24)]
    c = _corpus([(toks, 4)])
    shape, model, embed = _draft("dspark", tmp_path, c)
    b = T.make_batch(c, [0], 4, BLOCK, MASK, np.random.default_rng(0), offset=shape.offset)
    b.soft_ids[:] = 250                  # no draft-vocabulary token in any top
    cols = T.Columns.of(T.draft_vocabulary(c, shape.draft_vocab, VOCAB), VOCAB)
    loss, _ = T.block_loss(model.train(), shape, embed, b, T.TrainSettings(), cols)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("variant", ["dflash", "dflash2", "dspark"])
def test_training_learns_what_the_data_holds(variant, tmp_path):
    # every sequence runs round one cycle of three tokens from a random phase: each next token
    # follows from the one before
    rng = np.random.default_rng(6)
    cycle = [20, 40, 60]
    seqs = []
    for _ in range(40):
        s0 = int(rng.integers(0, 3))
        seqs.append(([cycle[(s0 + i) % 3] for i in range(24)], 4))
    c = _corpus(seqs)
    shape = _shape(variant)
    embed = np.random.default_rng(1).standard_normal((VOCAB, 64)).astype(np.float32)
    folder = None
    if shape.authors == "speculators":
        from graphgen.authors import checkpoint as C
        folder = tmp_path / "target"
        C._write_target(folder, shape.spec())
    st = T.TrainSettings(steps=80, seqs_per_step=4, anchors_per_seq=4, lr=1e-2, warmup=5, val_seqs=8,
                         negatives=16, threads=1)
    model, history, _ = T.train(c, embed, shape, st, target_folder=folder)
    rows = [r for r in history if "step" in r]
    assert rows[-1]["step"] == 80
    best = min(r["val_ce"] for r in rows)
    assert rows[-1]["val_acc1"] > 0.5, rows
    assert best < 2.0, rows


def test_training_is_deterministic_in_its_seed(tmp_path):
    rng = np.random.default_rng(7)
    c = _corpus([([int(x) for x in rng.integers(0, 200, 20)], 4) for _ in range(12)])
    shape = _shape("dflash2")
    embed = np.random.default_rng(1).standard_normal((VOCAB, 64)).astype(np.float32)

    def weights(seed):
        st = T.TrainSettings(steps=6, seqs_per_step=2, anchors_per_seq=3, warmup=2, val_seqs=2, negatives=16,
                             seed=seed, threads=1)
        model, _, _ = T.train(c, embed, shape, st)
        return {k: v.clone() for k, v in model.state_dict().items()}
    a, b, other = weights(0), weights(0), weights(1)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], other[k]) for k in a)
