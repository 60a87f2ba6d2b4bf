"""A real target in b11739's libllama (graphgen/reference/target.py), SmolLM2-135M: the inputs of the
draft's target layers, layer after layer within a row, batched decodes of several sequences whose
rows come back in batch order, removals from its cache, its tokenizer with special tokens, and a
batch larger than the context holds. TargetContext runs in the session child; it is reached here
through ReferenceTarget (graphgen/reference/session.py)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from graphgen.reference.session import ReferenceTarget, TargetError
from graphgen.reference.target import LAYER_INPUT_ARCHS

pytestmark = pytest.mark.reference

N_EMBD = 576
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2():
    from graphgen.speculative.targets import resolve
    return resolve("smollm2")


@pytest.fixture(scope="module")
def table(smollm2):
    """The target's token embeddings, dequantized by gguf-py."""
    r = gguf.GGUFReader(str(smollm2))
    t = next(x for x in r.tensors if x.name == "token_embd.weight")
    assert r.fields["general.architecture"].contents() in LAYER_INPUT_ARCHS
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)


def test_features_are_the_layer_inputs_layer_after_layer(smollm2, table):
    """Layer 0's input is the token embedding: llama.cpp's rows for it must be the Q8_0 table's rows
    dequantized, in the slot of each row the layer has in the list, for every sequence of a batch."""
    with ReferenceTarget(smollm2, [0, 7], n_ctx=256, n_batch=64, n_seq=2) as tg:
        a, b = tg.tokenize(PROMPT), tg.tokenize("Once upon a time")
        rows = [(0, tok, i) for i, tok in enumerate(a)] + [(1, tok, i) for i, tok in enumerate(b)]
        _, _, feats = tg.decode(rows)
    emb = table[[tok for _, tok, _ in rows]]
    assert feats.shape == (len(rows), 2 * N_EMBD)
    assert np.array_equal(feats[:, :N_EMBD], emb)
    # layer 7's input is no embedding row
    assert not np.allclose(feats[:, N_EMBD:], emb)
    # the layers in the order asked: layer 0 second
    with ReferenceTarget(smollm2, [7, 0], n_ctx=256, n_batch=64, n_seq=2) as tg:
        _, _, swapped = tg.decode(rows)
    assert np.array_equal(swapped[:, N_EMBD:], emb) and np.array_equal(swapped[:, :N_EMBD], feats[:, N_EMBD:])


def test_interleaved_sequences_come_back_in_batch_order(smollm2, table):
    with ReferenceTarget(smollm2, [0], n_ctx=256, n_batch=64, n_seq=2) as tg:
        a, b = tg.tokenize(PROMPT), tg.tokenize("def fib(n):")
        n = min(len(a), len(b))
        rows = [r for i in range(n) for r in ((0, a[i], i), (1, b[i], i))]
        ids, _, feats = tg.decode(rows)
        assert np.array_equal(feats, table[[tok for _, tok, _ in rows]])
        # each row's logits are its own sequence's: the same best tokens as that sequence decoded alone
        for seq, toks in ((0, a), (1, b)):
            tg.seq_rm(0, -1, -1)
            tg.seq_rm(1, -1, -1)
            alone, _, _ = tg.decode([(seq, t, i) for i, t in enumerate(toks[:n])])
            assert ids[seq::2, 0].tolist() == alone[:, 0].tolist()
        assert tg.seq_pos_max(1) == n - 1 and tg.seq_pos_max(0) == -1


def test_removed_positions_are_decoded_again_as_before(smollm2):
    with ReferenceTarget(smollm2, [3], n_ctx=256, n_batch=64) as tg:
        toks = tg.tokenize(PROMPT)
        rows = [(0, t, i) for i, t in enumerate(toks)]
        _, whole, feats = tg.decode(rows, full_logits=True)
        assert tg.seq_pos_max(0) == len(toks) - 1
        assert tg.seq_rm(0, 2, -1) and tg.seq_pos_max(0) == 1
        _, tail, again = tg.decode(rows[2:], full_logits=True)
        assert tg.seq_pos_max(0) == len(toks) - 1
        np.testing.assert_allclose(tail, whole[2:], rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(again, feats[2:], rtol=1e-3, atol=1e-3)
        assert (tail.argmax(1) == whole[2:].argmax(1)).all()


def test_the_tokenizer_reads_special_tokens_and_prints_them(smollm2):
    with ReferenceTarget(smollm2, [0], n_ctx=256, n_batch=64) as tg:
        assert not tg.add_bos and tg.bos == 1
        # SmolLM2 adds no BOS: add_special changes nothing here
        assert tg.tokenize(PROMPT) == tg.tokenize(PROMPT, add_special=False)
        chat = tg.tokenize("<|im_start|>user\nHi<|im_end|>")
        assert chat[0] == 1 and chat[-1] == 2  # each special token one token
        pieces, eog = tg.pieces(chat)
        assert b"".join(pieces) == b"<|im_start|>user\nHi<|im_end|>"
        assert eog[-1] and not any(eog[:-1])


def test_a_batch_larger_than_the_context_takes_is_refused_naming_it(smollm2):
    with ReferenceTarget(smollm2, [0], n_ctx=256, n_batch=16) as tg:
        assert tg.n_batch == 16
        with pytest.raises(TargetError, match=r"llama_batch_ext refused row 16 \(error -1: the batch is full at 16 "
                                              r"rows\)$"):
            tg.decode([(0, 1, i) for i in range(17)])
        # the target goes on
        ids, _, _ = tg.decode([(0, 1, 0)])
        assert ids.shape == (1, 64)
