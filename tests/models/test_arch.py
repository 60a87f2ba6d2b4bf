"""graphgen.models.arch: the seed's dispatch: the head detected by its marker (in the seed's
order), hparams and tensors by backbone then head, the graph by encoder, backbone, head; the
outputs always in the graph."""

from types import SimpleNamespace

import gguf
import pytest
from gguf_edit import rewrite

from graphgen.dump.format import dump_files, load_dump
from graphgen.errors import GGUFModelError
from graphgen.models import arch, dflash, dspark
from graphgen.play.engine import run_scenario
from graphgen.play.scenario import parse_scenario
from graphgen.runtime.model import load
from graphgen.synth import make_model

U32 = gguf.GGUFValueType.UINT32


def test_heads_in_the_seeds_order_the_plain_head_last():
    assert list(arch.HEADS) == ["dspark", "dflash2", "lilicorr", "dflash"]
    assert all(name == h.name for name, h in arch.HEADS.items())


@pytest.mark.parametrize("tensors, keys, head", [
    ({"markov_w1.weight", "selector_hidden.weight"}, {"lilicorr.hidden_size"}, "dspark"),
    ({"selector_hidden.weight"}, {"lilicorr.hidden_size"}, "dflash2"),
    ({"fc.weight"}, {"lilicorr.hidden_size"}, "lilicorr"),
    ({"fc.weight", "output.weight"}, {"dflash.block_size"}, "dflash"),
    (set(), set(), "dflash"),
])
def test_detect_head(tensors, keys, head):
    assert arch.detect_head(tensors, keys).name == head


@pytest.mark.parametrize("variant, backbone", [("dflash", "base"), ("dflash2", "base"), ("dspark", "base"),
                                               ("lilicorr", "base"), ("dspark", "dsv4"), ("dflash", "dsv41"),
                                               ("dspark", "mistral-large4")])
def test_a_draft_loads_as_its_head_and_backbone(tmp_path, variant, backbone):
    m = load(make_model(tmp_path / "m.gguf", variant, backbone)["path"])
    assert (m.variant, m.backbone) == (variant, backbone)


def test_a_head_the_backbone_does_not_run_is_refused(tmp_path):
    from graphgen.ggufile import open_reader
    from graphgen.models.loader import GGUFMeta
    path = make_model(tmp_path / "m.gguf", "dspark", "dsv4")["path"]
    hp = load(path).hparams
    m = GGUFMeta(open_reader(path), path, hp.n_layer)
    arch.load_hparams(m, hp, "dspark", "dsv4", path)
    arch.load_hparams(m, hp, "dflash", "dsv4", path)
    # a DFlash2 head with every key it needs: still not one the DeepSeek-V4 backbones run
    hp.selector_rank, hp.selector_top_k, hp.conv_kernel_size, hp.conv_group_size = 8, 2, 3, 16
    with pytest.raises(GGUFModelError, match=f"{path}: the dsv4 backbone runs the dflash or dspark head, not dflash2"):
        arch.load_hparams(m, hp, "dflash2", "dsv4", path)


def test_conv_groups_must_tile_the_hidden_size(tmp_path):
    src = make_model(tmp_path / "a.gguf", "dflash2")["path"]
    with pytest.raises(GGUFModelError, match=r"must be divisible by conv_group_size \(64 % 24, key 'dflash.conv_group_size'\)"):
        load(rewrite(src, tmp_path / "b.gguf", drop_keys=["dflash.conv_group_size"],
                     set_keys={"dflash.conv_group_size": (U32, 24)}))


def test_tensors_by_backbone_then_head():
    hp = arch.HParams(n_embd=64, n_layer=1, n_head=4, n_head_kv=4, n_ff=128, n_vocab=256, n_embd_head_k=16,
                      n_embd_head_v=16, block_size=4, hc_mult=4, n_lora_q=8, n_expert=2, n_ff_exp=16,
                      n_expert_shared=1, dsv4_o_group_count=2, dsv4_o_lora_rank=8)
    hp.target_layers = [1, 2]
    base, req = arch.load_tensors(hp, "dflash", "base", 0, 256)
    assert "blk.0.attn_q.weight" in req and "fc.weight" in req and "markov_w1.weight" not in base
    assert not any("conv" in k for k in base)
    # b11739 makes the conv tensors of every base-backbone head whose GGUF sets the conv keys
    hp.conv_kernel_size, hp.conv_group_size = 3, 16
    base, req = arch.load_tensors(hp, "dflash", "base", 0, 256)
    assert "blk.0.attn_conv_proj.weight" in req
    spark, req = arch.load_tensors(hp, "dspark", "dsv4", 12, 256)
    assert spark["markov_w1.weight"] == (12, 256) and "output_hc_fn.weight" in req
    assert "blk.0.attn_q.weight" not in spark and "blk.0.attn_conv_proj.weight" not in spark
    assert "output_hc_fn.weight" not in arch.load_tensors(hp, "dspark", "dsv41", 12, 256)[0]


def test_graph_dispatch():
    def params(graph_type="block", backbone="base", variant="dflash"):
        return SimpleNamespace(graph_type=graph_type, model=SimpleNamespace(backbone=backbone, variant=variant))
    with pytest.raises(NotImplementedError, match="the gemma backbone is not supported"):
        arch.build_arch_graph(params(backbone="gemma"))
    with pytest.raises(NotImplementedError, match="the medusa head is not supported"):
        arch.build_arch_graph(params(variant="medusa"))
    assert arch.BACKBONE_GRAPHS == {"dsv4": dspark.GraphDSV4, "dsv41": dspark.GraphDSV41,
                                    "mistral-large4": dspark.GraphMistralLarge4}
    assert arch.HEADS["dflash"].graph is dflash.GraphDFlash


def test_the_logits_stay_in_the_graph_when_the_head_leaves_them_out(tmp_path):
    """DSpark's Markov head returns early on a block longer than the trained one; the backbone's
    logits are still computed, as llama.cpp computes them."""
    path = make_model(tmp_path / "m.gguf", "dspark")["path"]
    sc = parse_scenario({"n_ctx": 256, "steps": [{"inject": {"n_tokens": 6}},
                                                 {"block": {"tokens": [7, 255, 255, 255, 255, 255], "pos0": 6}},
                                                 {"seq_rm": {"seq": 0, "p0": 6, "p1": -1}},
                                                 {"block": {"tokens": [7, 255, 255, 255], "pos0": 6}}]})
    run_scenario(path, sc, tmp_path / "d")
    long, trained = (load_dump(p).nodes for p in dump_files(tmp_path / "d")[1:])
    assert long[-1].name == "result_output" and not any(n.op == "ARGMAX" for n in long)
    assert any(n.op == "ARGMAX" for n in trained)
