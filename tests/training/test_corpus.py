"""The target's side of training (graphgen/training/corpus.py): the corpus kept on disk, the
authors' spread of target layers, the embedding table the draft borrows, the rows the recorder
keeps while the target generates, the target's greedy continuations in b11739, and the target
folder written for llama.cpp's converter."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from graphgen.training import corpus as C
from graphgen.training.common import TOP_KEPT, TrainError
from gguf_edit import write_tensors

N_EMBD = 576  # SmolLM2-135M's


def _corpus(with_top: bool) -> C.Corpus:
    rng = np.random.default_rng(0)
    toks = [np.array([1, 5, 6, 7, 8], dtype=np.int32), np.array([1, 9, 10], dtype=np.int32)]
    feats = [rng.standard_normal((len(t) - 1, 6)).astype(np.float16) for t in toks]
    top_ids = [rng.integers(0, 50, (len(t) - 1, TOP_KEPT)).astype(np.int32) for t in toks] if with_top else []
    top_logits = [rng.standard_normal((len(t) - 1, TOP_KEPT)).astype(np.float16) for t in toks] if with_top else []
    return C.Corpus([2, 4], toks, [2, 1], feats, 12.5, {"target": "t.gguf"}, top_ids, top_logits)


@pytest.mark.parametrize("with_top", [True, False])
def test_a_saved_corpus_loads_as_it_was(tmp_path, with_top):
    c = _corpus(with_top)
    c.save(tmp_path / "corpus.npz")
    d = C.Corpus.load(tmp_path / "corpus.npz")
    assert d.layers == [2, 4] and d.starts == [2, 1]
    assert [t.tolist() for t in d.tokens] == [[1, 5, 6, 7, 8], [1, 9, 10]]
    for name in ("features", "top_ids", "top_logits"):
        got, want = getattr(d, name), getattr(c, name)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w)
    # the seconds travel inside the meta
    assert d.seconds == 12.5 and d.meta == {"target": "t.gguf", "seconds": 12.5}


def test_the_generated_tokens_are_those_after_each_start():
    assert _corpus(False).n_generated == (5 - 2) + (3 - 1)


def test_the_authors_spread_of_target_layers():
    pytest.importorskip("dflash.model")
    # dflash's build_target_layer_ids: from layer 1 to the fourth-last, evenly; one feature: the middle
    assert C.authors_layer_ids(30, 3) == [1, 14, 27]
    assert C.authors_layer_ids(30, 1) == [15]
    assert C.authors_layer_ids(36, 5) == [1, 9, 17, 25, 33]


# -- the embedding table ----------------------------------------------------------------------

def test_the_embedding_table_is_n_vocab_rows_of_n_embd(tmp_path):
    table = np.random.default_rng(1).standard_normal((7, 32)).astype(np.float32)
    got = C.embedding_table(write_tensors(tmp_path / "f32.gguf", {"token_embd.weight": (table, None)}))
    assert got.dtype == np.float32 and got.shape == (7, 32) and np.array_equal(got, table)
    got = C.embedding_table(write_tensors(tmp_path / "f16.gguf", {"token_embd.weight": (table.astype(np.float16), None)}))
    assert got.dtype == np.float32 and np.array_equal(got, table.astype(np.float16).astype(np.float32))


def test_a_quantized_embedding_table_is_dequantized(tmp_path):
    table = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    got = C.embedding_table(write_tensors(tmp_path / "q8.gguf", {"token_embd.weight": (table, gguf.GGMLQuantizationType.Q8_0)}))
    assert got.shape == (4, 64)
    # q8_0: blocks of 32 rounded to 8 bits of the block's largest magnitude
    step = np.abs(table.reshape(4, 2, 32)).max(-1, keepdims=True) / 127
    assert (np.abs(got - table).reshape(4, 2, 32) <= step * 0.6).all()  # the scale itself is an f16


def test_tables_the_draft_cannot_borrow_are_refused(tmp_path):
    x = np.zeros((4, 32), dtype=np.float32)
    path = write_tensors(tmp_path / "none.gguf", {"output_norm.weight": (x[0], None)})
    with pytest.raises(TrainError, match="none.gguf: no token_embd.weight$"):
        C.embedding_table(path)
    path = write_tensors(tmp_path / "head.gguf", {"token_embd.weight": (x, None), "output.weight": (x, None)})
    with pytest.raises(TrainError, match="head.gguf: has its own output.weight"):
        C.embedding_table(path)


# -- the recorder ------------------------------------------------------------------------------

class _FakeTarget:
    n_batch = 3
    width = 4

    def decode(self, rows, full_logits=False):
        n = len(rows)
        ids = np.array([[100 * s + p + k for k in range(TOP_KEPT + 4)] for s, _t, p in rows], dtype=np.int64)
        top = -np.arange(TOP_KEPT + 4, dtype=np.float32)[None].repeat(n, 0) - np.arange(n)[:, None]
        feats = np.array([[s, t, p, 0.5] for s, t, p in rows], dtype=np.float32)
        return ids, top, feats


def test_the_recorder_keeps_each_decoded_rows_features_and_best_tokens():
    tg = _FakeTarget()
    rec = C._Recorder(tg)
    assert rec.n_batch == 3 and rec.width == 4  # the target's own attributes pass through
    out = rec.decode([(0, 11, 0), (1, 12, 0)])
    assert out[2].shape == (2, 4)  # what the target returned, returned as it is
    rec.decode([(1, 13, 1)])
    assert sorted(rec.rows) == [(0, 0), (1, 0), (1, 1)]
    f, ids, logits = rec.rows[(1, 1)]
    assert f.dtype == np.float16 and f.tolist() == [1, 13, 1, 0.5]
    assert ids.dtype == np.int32 and ids.tolist() == [101 + k for k in range(TOP_KEPT)]
    assert logits.dtype == np.float16 and logits.tolist() == [-float(k) for k in range(TOP_KEPT)]


# -- b11739: the target's continuations and its folder ---------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    from graphgen.speculative.targets import resolve
    return resolve("smollm2")


@pytest.mark.reference
def test_the_corpus_is_the_targets_greedy_text_with_its_rows(smollm2):
    from graphgen.reference.session import ReferenceTarget
    prompts = ["The capital of France is", "Once upon a time", "def add(a, b):"]
    lines = []
    c = C.generate_corpus(smollm2, [1, 5], prompts, n_predict=5, n_seq=2, n_threads=1, log=lines.append)
    assert c.layers == [1, 5] and len(c.tokens) == 3 and c.n_generated == 15
    # a line per batch of n_seq prompts
    assert len(lines) == 2 and lines[-1].startswith("data: 3/3 prompts, 15 tokens generated")
    with ReferenceTarget(smollm2, [1, 5], n_ctx=256, n_batch=64) as tg:
        for p, toks, start, feats, ids in zip(prompts, c.tokens, c.starts, c.features, c.top_ids):
            assert toks[:start].tolist() == tg.tokenize(p) and len(toks) == start + 5
            assert feats.shape == (len(toks) - 1, 2 * N_EMBD) and feats.dtype == np.float16
            # greedy: each generated token is the target's best at the row before it
            assert [int(ids[r, 0]) for r in range(start - 1, len(toks) - 1)] == toks[start:].tolist()
            # the rows are the target's features of the text, position by position
            _, _, again = tg.decode([(0, int(t), i) for i, t in enumerate(toks[:-1])])
            tg.seq_rm(0, -1, -1)
            np.testing.assert_allclose(feats.astype(np.float32), again, rtol=2e-2, atol=2e-2)
    with pytest.raises(TrainError, match="longer than the 256 cells a sequence has"):
        C.generate_corpus(smollm2, [1], ["word " * 250], n_predict=10, n_seq=1, n_threads=1)


@pytest.mark.reference
def test_the_target_folder_holds_the_targets_config_and_tokenizer(smollm2, tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer
    from graphgen.reference.session import ReferenceTarget
    out = C.write_target_folder(smollm2, tmp_path / "target")
    cfg = json.loads((out / "config.json").read_text())
    # SmolLM2-135M's own shape
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (576, 1536, 30)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["rope_theta"] == 100000.0 and cfg["max_position_embeddings"] == 8192
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5) and cfg["vocab_size"] == 49152
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["tie_word_embeddings"]) == (1, 2, True)
    tok = AutoTokenizer.from_pretrained(str(out))
    text = "The capital of France is Paris, isn't it?"
    with ReferenceTarget(smollm2, [1], n_ctx=256, n_batch=64) as tg:
        assert tok(text, add_special_tokens=False)["input_ids"] == tg.tokenize(text, add_special=False)


def test_a_target_folder_is_written_for_llama_only(tmp_path):
    path = write_tensors(tmp_path / "q.gguf", {"token_embd.weight": (np.zeros((4, 32), np.float32), None)}, arch="qwen3")
    with pytest.raises(TrainError, match="architecture 'qwen3'; the target folder is written for llama only"):
        C.write_target_folder(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
