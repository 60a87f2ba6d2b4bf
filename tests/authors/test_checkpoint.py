"""Random-weight checkpoints in the draft authors' own formats (graphgen/authors/checkpoint.py): the
spec and its defaults and refusals (no torch), then `make_hf`'s folders as the authors' classes save
them, the target beside them, the target layers as each format counts them, the seed, and where a
checkpoint may be written."""

from __future__ import annotations

import json
import stat

import numpy as np
import pytest

from graphgen.authors import AuthorsError
from graphgen.authors import checkpoint as C
from graphgen.authors.checkpoint import HFSpec, label, make_hf, read_marker


# -- the spec (no torch) ------------------------------------------------------------------------------

def test_every_command_names_a_class_alike():
    assert label("speculators", "dspark") == "speculators DSpark (DSparkDraftModel)"
    assert label("zlab", "dflash2") == "z-lab DFlash2 (DFlash2DraftModel)"
    assert label("speculators", "dflash") == "speculators DFlash (DFlashDraftModel)"


def test_the_defaults_a_spec_resolves_to():
    spec = HFSpec(variant="dspark", n_vocab=100, target_layers=[3, 7])
    s = spec.resolved()
    # the head's default authors, the last token as the mask, one target layer beyond the deepest
    assert (s.authors, s.mask_token_id, s.n_target_layers, s.class_name) == ("speculators", 99, 8, "DSparkDraftModel")
    assert (spec.authors, spec.mask_token_id, spec.n_target_layers) == (None, None, None)  # a copy was resolved
    z = HFSpec(variant="dflash", mask_token_id=5, n_target_layers=12).resolved()
    assert (z.authors, z.mask_token_id, z.n_target_layers, z.class_name) == ("zlab", 5, 12, "DFlashDraftModel")
    assert HFSpec(variant="dflash2", authors="speculators").resolved().authors == "speculators"


@pytest.mark.parametrize("change,message", [
    ({"variant": "lilicorr"}, "--variant lilicorr: the authors' formats have dflash, dflash2, dspark"),
    ({"authors": "vllm"}, "--authors vllm: expected one of zlab, speculators"),
    ({"variant": "dspark", "authors": "zlab"}, "--authors zlab has no dspark model"),
    ({"target_layers": []}, r"--target-layers \[\]: 1-based target layers, at least one"),
    ({"target_layers": [0, 3]}, r"--target-layers \[0, 3\]: 1-based target layers"),
    ({"target_layers": [2, 9], "n_target_layers": 8}, r"--target-layers \[2, 9\]: the target has 8 layers"),
    ({"n_head": 6, "n_head_kv": 4}, "--heads 6 is not a multiple of --heads-kv 4"),
    ({"variant": "dflash2", "conv_group": 24}, "--conv-group 24 does not divide --n-embd 64"),
    ({"d2t_vocab": 50}, "--d2t-vocab: only the speculators DSpark format carries a draft vocabulary here"),
    ({"variant": "dspark", "d2t_vocab": 300}, "--d2t-vocab 300 must be in 1..256"),
    ({"swa_pattern": [1, 0, 1]}, "--swa-pattern has 3 entries for 2 layers"),
    ({"swa_pattern": [1, 0]}, "--swa-pattern needs --swa-window"),
    ({"conf_with_markov": False}, "--conf-markov: only the speculators DSpark format has a confidence head"),
])
def test_specs_the_authors_formats_cannot_hold_are_refused(change, message):
    with pytest.raises(AuthorsError, match=f"^{message}"):
        HFSpec(**change).resolved()


def test_read_marker_knows_graphgens_checkpoints_only(tmp_path):
    assert read_marker(tmp_path) is None
    (tmp_path / "graphgen-hf.json").write_text("{not json")
    assert read_marker(tmp_path) is None
    (tmp_path / "graphgen-hf.json").write_text('{"class": "DFlashDraftModel"}')
    assert read_marker(tmp_path) == {"class": "DFlashDraftModel"}


# -- make_hf --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def extra():
    from authors_util import require_extra
    require_extra()


def _tensors(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


@pytest.fixture(scope="module")
def zlab(extra, tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp("zlab") / "ck",
                   HFSpec(variant="dflash2", n_layer=1, block_size=4, target_layers=[1, 3], seed=4))


def test_a_zlab_checkpoint_counts_target_layers_from_zero(zlab):
    assert sorted(p.name for p in zlab.iterdir()) == ["config.json", "graphgen-hf.json", "model.safetensors", "target"]
    cfg = json.loads((zlab / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["num_target_layers"] == 4
    dc = cfg["dflash_config"]
    # the GGUF's 1-based layers 1 and 3, as z-lab stores them
    assert dc["target_layer_ids"] == [0, 2] and dc["mask_token_id"] == 255 and dc["block_size"] == 4
    assert (dc["conv_kernel_size"], dc["conv_group_size"], dc["selector_rank"], dc["selector_top_k"]) == (2, 16, 16, 4)
    marker = read_marker(zlab)
    assert marker["class"] == "DFlash2DraftModel"
    assert marker["spec"]["authors"] == "zlab" and marker["spec"]["n_target_layers"] == 4
    # everyone may read what was written
    for p in [zlab, *zlab.rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) == (0o755 if p.is_dir() else 0o644), p


def test_the_target_beside_it_lends_the_tables_and_a_tokenizer(zlab):
    tgt = zlab / "target"
    assert {"config.json", "model.safetensors", "tokenizer.model"} <= {p.name for p in tgt.iterdir()}
    cfg = json.loads((tgt / "config.json").read_text())
    # a layer beyond the deepest target layer, the draft's width and vocabulary
    assert cfg["num_hidden_layers"] == 4 and cfg["hidden_size"] == 64 and cfg["vocab_size"] == 256
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["tie_word_embeddings"]) == (1, 2, False)
    t = _tensors(tgt / "model.safetensors")
    assert t["model.embed_tokens.weight"].shape == t["lm_head.weight"].shape == (256, 64)
    assert not np.array_equal(t["model.embed_tokens.weight"], t["lm_head.weight"])


def test_every_weight_is_drawn_from_the_seed(zlab, tmp_path):
    t = _tensors(zlab / "model.safetensors")
    # norms and codebooks away from their identity and zero inits
    assert not np.allclose(t["norm.weight"], 1.0) and abs(float(t["norm.weight"].mean()) - 1.0) < 0.1
    assert t["candidate_selector.predecessor_codebook.weight"].std() > 1.0
    again = make_hf(tmp_path / "again", HFSpec(variant="dflash2", n_layer=1, block_size=4, target_layers=[1, 3], seed=4))
    other = make_hf(tmp_path / "other", HFSpec(variant="dflash2", n_layer=1, block_size=4, target_layers=[1, 3], seed=5))
    u, v = _tensors(again / "model.safetensors"), _tensors(other / "model.safetensors")
    assert t.keys() == u.keys() and all(np.array_equal(t[k], u[k]) for k in t)
    assert all(not np.array_equal(t[k], v[k]) for k in t if t[k].size > 1)


def test_a_speculators_checkpoint_names_its_verifier_by_its_final_place(extra, tmp_path):
    ck = make_hf(tmp_path / "ck", HFSpec(variant="dspark", n_layer=1, block_size=4, target_layers=[1, 3], d2t_vocab=100,
                                         output_multiplier=0.5))
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and cfg["architectures"] == ["DSparkDraftModel"]
    # speculators keeps the GGUF's numbering
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3] and cfg["draft_vocab_size"] == 100
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str((ck / "target").resolve())
    # a setting speculators' classes have no field for, written as a hand-edited config carries it
    assert cfg["output_multiplier"] == 0.5
    t = _tensors(ck / "model.safetensors")
    ids = np.flatnonzero(t["t2d"])
    # a sorted draft vocabulary of 100 target ids; d2t holds each one's offset
    assert len(ids) == 100 and np.array_equal(t["d2t"] + np.arange(100), ids)
    assert t["lm_head.weight"].shape == (100, 64)


def test_a_folder_is_written_only_where_nothing_else_is(extra, tmp_path):
    spec = HFSpec(n_layer=1, block_size=4, target_layers=[1])
    (tmp_path / "file").write_text("x")
    with pytest.raises(AuthorsError, match="file: exists and is not a folder$"):
        make_hf(tmp_path / "file", spec)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    with pytest.raises(AuthorsError, match="theirs: folder is not empty and holds no graphgen checkpoint; pick a new "
                                           "folder$"):
        make_hf(tmp_path / "theirs", spec, force=True)
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "mine"
    ck = make_hf(tmp_path / "ck", spec)
    with pytest.raises(AuthorsError, match="ck: folder is not empty; pick a new folder or pass --force$"):
        make_hf(tmp_path / "ck", HFSpec(n_layer=1, block_size=4, target_layers=[1], seed=9))
    make_hf(tmp_path / "ck", HFSpec(n_layer=1, block_size=4, target_layers=[1], seed=9), force=True)
    assert read_marker(ck)["spec"]["seed"] == 9
    (tmp_path / "empty").mkdir()
    make_hf(tmp_path / "empty", spec)  # an empty folder is taken
    assert read_marker(tmp_path / "empty") is not None


def test_an_interrupted_write_leaves_nothing_behind(extra, tmp_path, monkeypatch):
    def broken(folder, s):
        folder.mkdir(parents=True)
        (folder / "half.bin").write_bytes(b"x")
        raise KeyboardInterrupt
    monkeypatch.setattr(C, "_write_target", broken)
    with pytest.raises(KeyboardInterrupt):
        make_hf(tmp_path / "ck", HFSpec(n_layer=1, block_size=4, target_layers=[1]))
    assert list(tmp_path.iterdir()) == []
