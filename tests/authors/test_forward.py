"""The authors' forward over a scenario (graphgen/authors/forward.py), on tiny checkpoints made by the
authors' own classes: what a drafting session's cache keeps and drops, each graph's tensors under
llama.cpp's node names and in its layout, a block's output equal to the authors' model run once on
the whole context without a cache, DSpark's Markov chain slot by slot, the dumps, and the refusals.
No llama.cpp here: test_authors.py puts the three engines side by side."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from authors_util import require_extra

require_extra()

import torch  # noqa: E402

from graphgen.authors import AuthorsError  # noqa: E402
from graphgen.authors import forward as FW  # noqa: E402
from graphgen.authors.checkpoint import HFSpec, make_hf  # noqa: E402
from graphgen.authors.tensormap import entries  # noqa: E402
from graphgen.dump.format import load_dump_dir  # noqa: E402
from graphgen.play.player import draw_features  # noqa: E402
from graphgen.play.scenario import parse_scenario  # noqa: E402

MASK = 255
# two inject chunks, a block, the block removed, the accepted rows injected, a second block
SESSION = {"n_ctx": 64, "n_ubatch": 16, "seed": 2,
           "steps": [{"inject": {"n_tokens": 3, "pos0": 0}},
                     {"inject": {"n_tokens": 2, "pos0": 3}},
                     {"block": {"tokens": [7, MASK, MASK, MASK], "pos0": 5}},
                     {"seq_rm": {"seq": 0, "p0": 5, "p1": -1}},
                     {"inject": {"n_tokens": 3, "pos0": 5}},
                     {"block": {"tokens": [11, MASK, MASK, MASK], "pos0": 8}}]}


@pytest.fixture(scope="module")
def zlab(tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp("fw") / "zlab",
                   HFSpec(variant="dflash", n_layer=2, block_size=4, target_layers=[1, 3], seed=3))


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp("fw") / "spark",
                   HFSpec(variant="dspark", n_layer=1, block_size=4, target_layers=[1, 3], d2t_vocab=120, seed=5))


def _target_tables(hf_dir):
    from safetensors.numpy import load_file
    t = load_file(str(hf_dir / "target" / "model.safetensors"))
    return t["model.embed_tokens.weight"], t["lm_head.weight"]


# -- pieces without a model -------------------------------------------------------------------------

def test_mapped_names_come_in_the_order_the_graph_computes_them():
    per_layer = ["noise_norm", "Qcur", "Kcur", "Vcur", "kqv_out", "ffn_inp", "ffn_norm", "ffn_out", "l_out"]
    assert FW.graph_order(entries("dflash", "block"), 2) == (
        ["inp_noise_embd"] + [f"{n}-0" for n in per_layer] + [f"{n}-1" for n in per_layer]
        + ["result_norm", "result_output"])
    assert FW.graph_order(entries("dspark", "inject"), 1) == ["inp_g_embeddings", "Kcur_injected-0", "Vcur_injected-0"]
    assert FW.graph_order(entries("dflash2", "block"), 1)[-1] == "[selector path]"


def test_values_are_laid_out_as_llama_cpp_counts_them():
    assert FW._ne(np.zeros((2, 3))) == [3, 2, 1, 1]
    assert FW._ne(np.zeros(5)) == [5, 1, 1, 1]
    assert FW._ne(np.zeros((2, 3, 4, 5))) == [5, 4, 3, 2]


def test_a_scenario_is_cut_before_a_removal_a_sliding_cache_cannot_make():
    doc = {"n_ctx": 64, "steps": SESSION["steps"]}
    assert FW.croppable(doc, SimpleNamespace(sliding_layers=0)) == (doc, None)
    cut, note = FW.croppable(doc, SimpleNamespace(sliding_layers=2))
    assert cut == {"n_ctx": 64, "steps": SESSION["steps"][:3]} and doc["steps"] == SESSION["steps"]
    assert note.startswith("scenario cut before step 3 (seq_rm) and the 2 after it: the authors' 2 sliding-window "
                           "layer(s) keep a transformers sliding cache")
    no_rm = {"steps": SESSION["steps"][:3]}
    assert FW.croppable(no_rm, SimpleNamespace(sliding_layers=1)) == (no_rm, None)


# -- the checkpoint loaded ------------------------------------------------------------------------------

def test_a_checkpoint_loads_with_its_authors_class_and_its_targets_tables(zlab, spark):
    d = FW.AuthorsDraft(zlab)
    assert (d.authors, d.variant, d.class_name, d.package) == ("zlab", "dflash", "DFlashDraftModel", "dflash")
    assert d.label == "z-lab DFlash (DFlashDraftModel)"
    # 1-based target layers, as the GGUF counts them, from z-lab's 0-based ids
    assert (d.target_layers, d.mask_token_id, d.block_size) == ([1, 3], MASK, 4)
    assert (d.n_layer, d.n_embd, d.n_embd_inp, d.n_vocab, d.sliding_layers) == (2, 64, 128, 256, 0)
    embed, head = _target_tables(zlab)
    assert np.array_equal(d.embed.numpy(), embed) and np.array_equal(d.head_module.weight.detach().numpy(), head)
    assert d.d2t is None and d.dtype == torch.float32
    assert FW.AuthorsDraft(zlab, dtype="float64").model.fc.weight.dtype == torch.float64
    with pytest.raises(AuthorsError, match="^dtype 'float16': float32 or float64$"):
        FW.AuthorsDraft(zlab, dtype="float16")
    s = FW.AuthorsDraft(spark)
    assert (s.authors, s.variant, s.target_layers, s.sample_from_anchor) == ("speculators", "dspark", [1, 3], True)
    # the draft vocabulary scattered to the target's ids
    assert len(s.d2t) == 120 and (np.diff(s.d2t) > 0).all() and s.d2t.max() < 256
    full, raw = s.logits(torch.ones(1, 2, 64))
    assert raw.shape == (1, 2, 120) and full.shape == (1, 2, 256)
    assert torch.equal(full[..., torch.as_tensor(s.d2t)], raw)
    outside = np.setdiff1d(np.arange(256), s.d2t)
    assert torch.isinf(full[..., torch.as_tensor(outside)]).all()


def test_a_moved_speculators_checkpoint_loads_beside_the_target_named(spark, tmp_path, caplog):
    """speculators' config names its verifier by the path the checkpoint was made at; moved (as a
    repro folder is), the target given wins over it, silently."""
    import shutil
    moved = tmp_path / "moved"
    shutil.copytree(spark, moved)
    cfg = json.loads((moved / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str((spark / "target").resolve())
    # where it was made, gone since
    cfg["speculators_config"]["verifier"]["name_or_path"] = str(tmp_path / "gone" / "target")
    (moved / "config.json").write_text(json.dumps(cfg))
    shutil.rmtree(moved / "target")
    shutil.copytree(spark / "target", tmp_path / "elsewhere")
    with caplog.at_level("WARNING"):
        d = FW.AuthorsDraft(moved, tmp_path / "elsewhere")
    assert "Could not resolve" not in caplog.text
    embed, _ = _target_tables(spark)
    assert np.array_equal(d.embed.numpy(), embed)
    assert d.model.config.speculators_config.verifier.name_or_path == str((tmp_path / "elsewhere").resolve())


def test_a_format_without_an_authors_class_is_refused(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"architectures": ["Qwen3DSparkModel"]}))
    (ck / "model.safetensors").write_bytes(b"\x02\0\0\0\0\0\0\0{}")
    with pytest.raises(AuthorsError, match=r"key 'architectures' = \['Qwen3DSparkModel'\] has no authors' class on "
                                           "PyPI: graphgen convert converts it"):
        FW.detect_format(ck)


# -- a drafting session ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zlab_run(zlab, tmp_path_factory):
    out = tmp_path_factory.mktemp("fw") / "torch"
    sc = parse_scenario(SESSION)
    graphs = FW.run_scenario_torch(zlab, sc, out)
    return sc, graphs, out


def test_a_block_after_a_removal_equals_the_whole_context_run_at_once(zlab, zlab_run):
    """The cache as drafting leaves it (chunks injected, a block dropped, rows added): the second
    block computes what the authors' model computes from all eight context rows in one call."""
    sc, graphs, _ = zlab_run
    d = FW.AuthorsDraft(zlab)
    feats = draw_features(sc, d.n_embd_inp)
    ctx = np.concatenate([feats[0], feats[1], feats[4]])           # by step: positions 0..7
    embed, head = _target_tables(zlab)
    tokens = [11, MASK, MASK, MASK]
    with torch.no_grad():
        hidden = d.model(position_ids=torch.arange(12)[None], noise_embedding=torch.from_numpy(embed[tokens])[None],
                         target_hidden=torch.from_numpy(ctx)[None], past_key_values=None, use_cache=False)[0].numpy()
    # graphs are numbered as the dumps are, the seq_rm step computing none
    got = graphs[4]["values"]
    assert graphs[4]["graph"] == "block"
    np.testing.assert_allclose(got["result_norm"], hidden, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["result_output"], hidden @ head.T, rtol=1e-4, atol=1e-4)
    assert np.array_equal(got["inp_noise_embd"], embed[tokens])
    # the first block, before the removal, saw the five rows injected in two chunks
    with torch.no_grad():
        first = d.model(position_ids=torch.arange(9)[None],
                        noise_embedding=torch.from_numpy(embed[[7, MASK, MASK, MASK]])[None],
                        target_hidden=torch.from_numpy(ctx[:5])[None], past_key_values=None, use_cache=False)[0].numpy()
    np.testing.assert_allclose(graphs[2]["values"]["result_norm"], first, rtol=1e-5, atol=1e-5)


def test_rows_projected_before_a_removal_leave_no_row_of_their_own(zlab):
    """A removal flushes the injected rows waiting for a block through a forward of one mask token;
    that token's row leaves the cache again, so the next block sees the injected rows alone."""
    d = FW.AuthorsDraft(zlab)
    steps = [{"inject": {"n_tokens": 3, "pos0": 0}},
             {"seq_rm": {"seq": 0, "p0": 10, "p1": -1}},       # removes nothing, but flushes the three rows
             {"inject": {"n_tokens": 2, "pos0": 3}},
             {"block": {"tokens": [7, MASK, MASK, MASK], "pos0": 5}}]
    sc = parse_scenario({"seed": 4, "steps": steps})
    got = FW.run_scenario_torch(zlab, sc, draft=d)[2]["values"]["result_norm"]
    feats = draw_features(sc, d.n_embd_inp)
    embed, _ = _target_tables(zlab)
    with torch.no_grad():
        want = d.model(position_ids=torch.arange(9)[None],
                       noise_embedding=torch.from_numpy(embed[[7, MASK, MASK, MASK]])[None],
                       target_hidden=torch.from_numpy(np.concatenate([feats[0], feats[2]]))[None],
                       past_key_values=None, use_cache=False)[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_each_graph_holds_its_mapped_tensors_in_llama_cpps_layout(zlab, zlab_run):
    _, graphs, _ = zlab_run
    assert sorted(graphs) == [0, 1, 2, 3, 4] and [graphs[i]["graph"] for i in (0, 1, 3)] == ["inject"] * 3
    # an inject graph's rows are its own chunk's, taken from the block's forward
    for i, n in ((0, 3), (1, 2), (3, 3)):
        v = graphs[i]["values"]
        assert sorted(v) == ["Kcur_injected-0", "Kcur_injected-1", "Vcur_injected-0", "Vcur_injected-1",
                             "inp_g_embeddings"]
        assert v["inp_g_embeddings"].shape == (n, 64)
        assert v["Kcur_injected-1"].shape == v["Vcur_injected-1"].shape == (n, 2, 16)   # rows, kv heads, head dim
    b = graphs[4]["values"]
    assert b["Qcur-0"].shape == (4, 4, 16) and b["Kcur-1"].shape == (4, 2, 16) and b["Vcur-0"].shape == (4, 2, 16)
    assert b["l_out-1"].shape == b["ffn_out-0"].shape == (4, 64) and b["result_output"].shape == (4, 256)
    # the last layer's output is what the final norm reads
    from safetensors.numpy import load_file
    w = load_file(str(zlab / "model.safetensors"))["norm.weight"].astype(np.float64)
    ln = b["l_out-1"].astype(np.float64)
    np.testing.assert_allclose(b["result_norm"], ln / np.sqrt((ln ** 2).mean(-1, keepdims=True) + 1e-6) * w,
                               rtol=1e-5, atol=1e-5)


def test_the_dumps_are_the_torch_engines(zlab_run):
    _, graphs, out = zlab_run
    dumps = load_dump_dir(out)
    assert [(d.seq, d.graph) for d in dumps] == [(0, "inject"), (1, "inject"), (2, "block"), (3, "inject"),
                                                 (4, "block")]
    block = dumps[-1]
    assert block.source["engine"] == "torch" and block.source["authors"].startswith("dflash ")
    assert block.source["authors"].endswith(" DFlashDraftModel") and block.source["dtype"] == "float32"
    assert [n.name for n in block.nodes] == FW.graph_order(entries("dflash", "block"), 2)
    assert all(n.op == "TORCH" and n.type == "f32" for n in block.nodes)
    node = block.nodes[-1]
    assert node.name == "result_output" and node.ne == [256, 4, 1, 1]
    assert np.array_equal(block.values(node.index).reshape(4, 256), graphs[4]["values"]["result_output"])


def test_what_the_authors_cache_cannot_do_is_refused(zlab, tmp_path):
    d = FW.AuthorsDraft(zlab)
    eng = FW.TorchEngine(d, parse_scenario(SESSION))
    with pytest.raises(AuthorsError, match="^target features are 64 wide; the draft's fc takes 128$"):
        eng.inject(0, 0, np.zeros((2, 64), np.float32), 0)
    steps = [{"inject": {"n_tokens": 4}}, {"block": {"tokens": [7, MASK, MASK, MASK], "pos0": 4}},
             {"seq_rm": {"seq": 0, "p0": 1, "p1": 3}}]
    with pytest.raises(AuthorsError, match=r"seq_rm seq 0 \[1, 3\): the authors' cache \(DynamicCache\) drops only a "
                                           "tail of a sequence's rows"):
        FW.run_scenario_torch(zlab, parse_scenario({"steps": steps}), draft=d)
    with pytest.raises(AuthorsError, match="token 300 is outside the vocabulary of 256"):
        FW.run_scenario_torch(zlab, parse_scenario({"steps": [{"inject": {"n_tokens": 2}},
                                                              {"block": {"tokens": [300, MASK], "pos0": 2}}]}), draft=d)


# -- DSpark: the Markov chain and the confidences ------------------------------------------------------------

def test_dspark_chains_each_slot_on_the_argmax_before_it(spark):
    d = FW.AuthorsDraft(spark)
    anchor = 9
    steps = [{"inject": {"n_tokens": 4}}, {"block": {"tokens": [anchor, MASK, MASK, MASK], "pos0": 4}}]
    v = FW.run_scenario_torch(spark, parse_scenario({"seed": 1, "steps": steps}), draft=d)[1]["values"]
    drafted, base, conf = v["[drafted logits]"], v["result_output"], v["[confidences]"]
    m = d.model
    prev = anchor
    with torch.no_grad():
        for k in range(4):   # DSpark samples from the anchor: every slot drafts
            h = torch.from_numpy(v["result_norm"][k])[None, None]
            ids = torch.tensor([[prev]])
            bias = m.markov_head.block_bias(prev_token_ids=ids, hidden_states=h,
                                            prev_emb=m.markov_head.prev_embeddings(ids))[0, 0].numpy()
            np.testing.assert_allclose(drafted[k, d.d2t], base[k, d.d2t] + bias, rtol=1e-5, atol=1e-5)
            assert np.isinf(np.delete(drafted[k], d.d2t)).all()
            feats = torch.cat([h[0, 0], m.markov_head.prev_embeddings(ids)[0, 0]])
            want = torch.sigmoid(m.confidence_head(feats[None, None]))[0, 0].item()
            # one confidence per slot, as wide as the hidden state, as llama.cpp hands it to the driver
            assert np.allclose(conf[k], want, rtol=1e-5) and conf.shape == (4, 64)
            prev = int(np.argmax(drafted[k]))
    with pytest.raises(AuthorsError, match="the dspark heads need equal-size blocks"):
        FW.run_scenario_torch(spark, parse_scenario({"n_seq": 2, "steps": [
            {"inject": {"n_tokens": 2, "seq": 0}}, {"inject": {"n_tokens": 2, "seq": 1}},
            {"block": {"seqs": [{"seq": 0, "tokens": [1, MASK, MASK], "pos0": 2},
                                {"seq": 1, "tokens": [1, MASK], "pos0": 2}]}}]}), draft=d)
