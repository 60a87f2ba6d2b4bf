"""A target GGUF on the authors' side of `graphgen check -m TARGET.gguf` (graphgen/authors/gguf_target.py):
the tables it lends (embeddings, head, final norm) dequantized as transformers' GGUF loader reads
them, the type of the head it lends, a speculators checkpoint staged to read them, and the folders
written for the authors' classes and llama.cpp's converter. Hand-made GGUFs first (no torch), then
the SmolLM2 target."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from graphgen.authors import AuthorsError
from graphgen.authors import gguf_target as G
from gguf_edit import write_tensors

Q8_0 = gguf.GGMLQuantizationType.Q8_0


def _rows(n, width, seed):
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


# -- the tables --------------------------------------------------------------------------------------

def test_a_target_with_its_own_head_lends_three_tables(tmp_path):
    embed, head, norm = _rows(6, 32, 0), _rows(6, 32, 1).astype(np.float16), _rows(1, 32, 2)[0]
    path = write_tensors(tmp_path / "t.gguf", {"token_embd.weight": (embed, None), "output.weight": (head, None),
                                       "output_norm.weight": (norm, None)})
    t = G.read_tables(path)
    assert sorted(t) == ["embed", "head", "norm"]
    assert all(v.dtype == np.float32 for v in t.values())
    assert np.array_equal(t["embed"], embed) and np.array_equal(t["norm"], norm)
    assert np.array_equal(t["head"], head.astype(np.float32))
    assert G.head_type(path) == "f16"


def test_a_tied_target_lends_its_embeddings_as_its_head(tmp_path):
    embed = _rows(4, 64, 3)
    path = write_tensors(tmp_path / "tied.gguf", {"token_embd.weight": (embed, Q8_0)})
    t = G.read_tables(path)
    assert sorted(t) == ["embed", "head"] and t["head"] is t["embed"]
    assert t["embed"].shape == (4, 64)
    # q8_0: blocks of 32 rounded to 8 bits of the block's largest magnitude
    step = np.abs(embed.reshape(4, 2, 32)).max(-1, keepdims=True) / 127
    # (the block's scale itself is stored as f16)
    assert (np.abs(t["embed"] - embed).reshape(4, 2, 32) <= 0.6 * step).all()
    assert not np.array_equal(t["embed"], embed)
    # the head it lends is the tied embeddings', in their type
    assert G.head_type(path) == "q8_0"


def test_a_file_that_lends_nothing_is_refused_naming_it(tmp_path):
    path = write_tensors(tmp_path / "bare.gguf", {"output_norm.weight": (_rows(1, 32, 0)[0], None)})
    with pytest.raises(AuthorsError, match=r"bare.gguf: no tensor 'token_embd.weight' to lend the draft$"):
        G.read_tables(path)
    with pytest.raises(AuthorsError, match=r"bare.gguf: no tensor 'output.weight' nor 'token_embd.weight' to lend "
                                           r"the draft$"):
        G.head_type(path)
    (tmp_path / "text.gguf").write_text("not a gguf at all")
    with pytest.raises(AuthorsError, match=r"text.gguf: not a readable GGUF \("):
        G.read_tables(tmp_path / "text.gguf")


# -- a speculators checkpoint staged on the target's tables -------------------------------------------

def test_a_staged_checkpoint_names_the_verifier_and_links_the_rest(tmp_path):
    src = tmp_path / "ck"
    src.mkdir()
    cfg = {"speculators_model_type": "dspark",
           "speculators_config": {"verifier": {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "x": 1}}}
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "tables").mkdir()
    out = G.staged_checkpoint(src, tmp_path / "staged", tmp_path / "tables")
    staged = json.loads((out / "config.json").read_text())
    assert staged["speculators_config"]["verifier"] == {"name_or_path": str((tmp_path / "tables").resolve()), "x": 1}
    assert (out / "model.safetensors").is_symlink() and (out / "model.safetensors").resolve() == \
        (src / "model.safetensors").resolve()
    assert json.loads((src / "config.json").read_text()) == cfg  # the checkpoint itself is left as it was
    (src / "config.json").write_text(json.dumps({"speculators_model_type": "dspark"}))
    with pytest.raises(AuthorsError, match=r"ck/config.json: missing key 'speculators_config.verifier'"):
        G.staged_checkpoint(src, tmp_path / "again", tmp_path / "tables")


# -- the SmolLM2 target ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    from authors_util import require_extra
    require_extra()
    from graphgen.speculative.targets import resolve
    return resolve("smollm2")


def test_the_tables_folder_holds_what_the_authors_read_off_the_target(smollm2, tmp_path):
    from safetensors.numpy import load_file
    out = G.tables_folder(smollm2, tmp_path / "tables")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (576, 30, 49152)
    st = load_file(str(out / "model.safetensors"))
    # SmolLM2 ties its head: only the embeddings and the final norm are written, as read_tables reads them
    assert sorted(st) == ["model.embed_tokens.weight", "model.norm.weight"]
    assert st["model.embed_tokens.weight"].shape == (49152, 576)
    # the rows as gguf-py dequantizes them (a few: the whole table is read once above)
    r = gguf.GGUFReader(str(smollm2))
    tensors = {t.name: t for t in r.tensors}
    embd, norm = tensors["token_embd.weight"], tensors["output_norm.weight"]
    assert embd.tensor_type == Q8_0 and G.head_type(smollm2) == "q8_0"
    for rows in (slice(0, 8), slice(49150, 49152)):
        assert np.array_equal(st["model.embed_tokens.weight"][rows], gguf.quants.dequantize(embd.data[rows], Q8_0))
    assert np.array_equal(st["model.norm.weight"], np.asarray(norm.data, dtype=np.float32))


@pytest.mark.reference
def test_the_vocab_folder_tokenizes_as_the_target_does(smollm2, tmp_path):
    from transformers import AutoTokenizer
    from graphgen.reference.session import ReferenceTarget
    out = G.vocab_folder(smollm2, tmp_path / "vocab")
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 49152
    assert not list(out.glob("*.safetensors"))  # no weights: the converter reads the vocabulary only
    tok = AutoTokenizer.from_pretrained(str(out))
    text = "Speculative decoding keeps the target's distribution, doesn't it?"
    with ReferenceTarget(smollm2, [1], n_ctx=256, n_batch=64) as tg:
        assert tok(text, add_special_tokens=False)["input_ids"] == tg.tokenize(text, add_special=False)


def test_a_gguf_transformers_cannot_read_is_refused_naming_the_reader(tmp_path):
    from authors_util import require_extra
    require_extra()
    path = write_tensors(tmp_path / "t.gguf", {"token_embd.weight": (_rows(4, 32, 0), None)}, arch="dflash")
    with pytest.raises(AuthorsError, match=r"t.gguf: transformers' GGUF reader refused it \(GGUF model with "
                                           r"architecture dflash is not supported yet.\); the authors' side reads the "
                                           r"target through it$"):
        G.tables_folder(path, tmp_path / "tables")
    assert not (tmp_path / "tables").exists()
