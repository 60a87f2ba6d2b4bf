"""graphgen.models.dspark: the DSpark Markov (and confidence) head and the DeepSeek-V4 backbone
node for node against llama.cpp b11739's dumps; the DeepSeek-V4.1 and Mistral Large 4 backbones
against the seed's node sequence (tests/support/seedref); the backbones' loaders and tensors."""

import gguf
import pytest
from gguf_edit import rewrite

from graphgen.dump.format import load_dump
from graphgen.errors import GGUFModelError
from graphgen.models.arch import HParams, TensorInfo
from graphgen.models.dspark import (
    HEAD,
    load_hparams_dspark,
    load_tensors_dspark,
    load_tensors_layers_dsv4,
    load_tensors_layers_mistral_large4,
)
from graphgen.play.engine import run_scenario
from graphgen.play.scenario import parse_scenario
from graphgen.runtime.model import load
from graphgen.synth import make_model

from .graphs import built, structure

U32 = gguf.GGUFValueType.UINT32


def head(nodes):
    """The Markov head: everything after the lm head's "result_output"."""
    return nodes[[n.name for n in nodes].index("result_output") + 1:]


@pytest.mark.parametrize("case", ["dspark-fa-off", "dspark-fa-on", "dspark-conf-fa-off", "dspark-conf-fa-on",
                                  "dspark-d2t", "dspark-bonus-anchor"])
def test_the_markov_head_is_b11739s(case, tmp_path, models_dir):
    for name, (ours, ref) in built(case, tmp_path, models_dir).items():
        if name.endswith("-block.json"):
            assert structure(head(ours)) == structure(head(ref))
            # the greedy chain: an argmax for every slot but the last; a confidence per slot
            assert sum(n.op == "ARGMAX" for n in head(ours)) == sum(n.op == "ARGMAX" for n in head(ref)) > 0
        assert structure(ours) == structure(ref), name


def test_confidences_only_with_a_confidence_head(tmp_path, models_dir):
    plain = built("dspark-fa-off", tmp_path / "a", models_dir)["01-block.json"][0]
    conf, ref = built("dspark-conf-fa-off", tmp_path / "b", models_dir)["01-block.json"]
    assert not any(n.op == "SIGMOID" for n in head(plain))
    # one sigmoid per drafted slot (3 of a block of 4), as in b11739's graph
    sig = [n for n in head(conf) if n.op == "SIGMOID"]
    assert len(sig) == sum(n.op == "SIGMOID" for n in head(ref)) == 3 and all(n.ne[:2] == [1, 1] for n in sig)
    assert any("conf_proj.weight" in n.src for n in head(conf))


@pytest.mark.parametrize("case", ["dsv4-fa-off", "dsv4-fa-on", "dsv4-q8-fa-on"])
def test_the_deepseek_v4_backbone_is_b11739s(case, tmp_path, models_dir):
    for name, (ours, ref) in built(case, tmp_path, models_dir).items():
        assert structure(ours) == structure(ref), name


@pytest.mark.parametrize("backbone", ["dsv41", "mistral-large4"])
def test_the_seed_only_backbones_follow_the_seeds_node_sequence(tmp_path, backbone):
    from seedref.opseq import SeedGraphs, UBatch
    path = make_model(tmp_path / "m.gguf", "dspark", backbone, n_layer=2)["path"]
    doc = {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "off", "type_kv": "f16", "seed": 1,
           "steps": [{"inject": {"n_tokens": 6, "pos0": 0}}, {"block": {"tokens": [7, 255, 255, 255], "pos0": 6}}]}
    run_scenario(path, parse_scenario(doc), tmp_path / "out")
    graphs = SeedGraphs(path, flash_attn=False, type_kv="f16", n_kv=256, kv_size=256)
    for kind, ub in (("inject", UBatch(6, 1, embd=True)), ("block", UBatch(4, 1))):
        want = [(t.name, t.op, t.ne) for t in graphs.build(ub)]
        got = [(n.name, n.op, tuple(n.ne)) for n in load_dump(next((tmp_path / "out").glob(f"*-{kind}.json"))).nodes]
        assert got == want, kind


@pytest.mark.parametrize("backbone, edit, match", [
    ("dsv4", {"dflash.attention.output_group_count": (U32, 3)}, "is not a multiple of"),
    ("dsv4", {"dflash.expert_used_count": (U32, 99)}, "'dflash.expert_used_count' = 99 exceeds"),
    ("dsv4", {"dflash.attention.sliding_window": (U32, 0)}, "must be positive for a DSV4 draft"),
    ("dsv4", {"dflash.attention.head_count_kv": (U32, 2)}, "one KV head"),
    ("mistral-large4", {"dflash.attention.head_count_kv": (U32, 2)}, "an MLA draft has one KV head"),
])
def test_backbone_loaders_refuse_what_the_seed_asserts(tmp_path, backbone, edit, match):
    src = make_model(tmp_path / "a.gguf", "dspark", backbone)["path"]
    with pytest.raises(GGUFModelError, match=match):
        load(rewrite(src, tmp_path / "b.gguf", drop_keys=list(edit), set_keys=edit))


def test_the_head_needs_a_block_size():
    with pytest.raises(GGUFModelError, match="p.gguf: DSpark draft requires 'dflash.block_size'"):
        load_hparams_dspark(HParams(block_size=0), "p.gguf")
    load_hparams_dspark(HParams(block_size=4), "p.gguf")
    assert HEAD.detects({"markov_w1.weight"}, set()) and HEAD.on_backbones


def test_tensor_declarations():
    hp = HParams(n_embd=64, n_layer=1, n_head=4, n_vocab=256, n_embd_head_k=32, hc_mult=4, n_lora_q=24,
                 n_expert=4, n_ff_exp=16, n_expert_shared=1, dsv4_o_group_count=2, dsv4_o_lora_rank=8, block_size=4,
                 n_lora_kv=16, n_rot=8, n_embd_head_k_mla=40, n_embd_head_v_mla=24, n_ff=128)
    shapes, required = load_tensors_dspark(hp, TensorInfo(dspark_rank=12, n_vocab_draft=200))
    assert shapes["markov_w1.weight"] == (12, 256) and shapes["markov_w2.weight"] == (12, 200)
    assert shapes["conf_proj.weight"] == (64 + 12, 1) and shapes["joint_proj.weight"] == (64 + 24, 36)
    assert required == ["markov_w1.weight", "markov_w2.weight"]
    shapes, _ = load_tensors_layers_dsv4(hp, with_hc_head=True)
    # mHC: hc streams of n_embd, (2 + hc) * hc mixes
    assert shapes["blk.0.hc_attn_fn.weight"] == (256, 24) and shapes["output_hc_fn.weight"] == (256, 4)
    assert shapes["blk.0.attn_q_b.weight"] == (24, 128) and shapes["blk.0.attn_output_b.weight"] == (16, 64)
    assert shapes["blk.0.ffn_gate_exps.weight"] == (64, 16, 4)
    assert "output_hc_fn.weight" not in load_tensors_layers_dsv4(hp, with_hc_head=False)[0]
    shapes, _ = load_tensors_layers_mistral_large4(hp)
    assert shapes["blk.0.attn_kv_a_mqa.weight"] == (64, 24) and shapes["blk.0.attn_k_b.weight"] == (32, 16, 4)
    assert shapes["mask_embd.weight"] == (64, 3)
