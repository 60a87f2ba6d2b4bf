"""graphgen.synth.dspark_backbones: DSpark drafts on the DeepSeek-V4, V4.1 and Mistral Large 4
backbones: the keys their loaders read, the layers they declare (hc_head on DSV4 alone, MLA on
Mistral Large 4), the options each backbone takes and the ones it refuses."""

import numpy as np
import pytest
from gguf import GGUFValueType
from synth_read import read

from graphgen.runtime.model import load
from graphgen.synth import make_model

DSV4_LAYER = ("attn_norm.weight", "attn_sinks.weight", "attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight",
              "attn_kv.weight", "attn_kv_a_norm.weight", "attn_output_a.weight", "attn_output_b.weight",
              "hc_attn_fn.weight", "hc_attn_base.weight", "hc_attn_scale.weight", "hc_ffn_fn.weight",
              "hc_ffn_base.weight", "hc_ffn_scale.weight", "ffn_gate_inp.weight", "exp_probs_b.bias",
              "ffn_norm.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight",
              "ffn_gate_shexp.weight", "ffn_down_shexp.weight", "ffn_up_shexp.weight")
ML4_LAYER = ("attn_norm.weight", "attn_q.weight", "attn_kv_a_mqa.weight", "attn_kv_a_norm.weight", "attn_k_b.weight",
             "attn_v_b.weight", "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_down.weight",
             "ffn_up.weight")
GLOBALS = ("token_embd.weight", "fc.weight", "enc.output_norm.weight", "output_norm.weight", "output.weight",
           "markov_w1.weight", "markov_w2.weight")


def test_dsv4_keys_and_tensors(tmp_path):
    s = make_model(tmp_path / "d.gguf", "dspark", "dsv4")
    keys, types, tensors, data = read(tmp_path / "d.gguf")
    assert s["backbone"] == "dsv4" and tensors == s["tensors"]
    assert (keys["dflash.attention.head_count_kv"], keys["dflash.attention.key_length"],
            keys["dflash.attention.value_length"], keys["dflash.rope.dimension_count"]) == (1, 32, 32, 16)
    assert (keys["dflash.hyper_connection.count"], keys["dflash.expert_count"], keys["dflash.expert_used_count"],
            keys["dflash.expert_gating_func"], keys["dflash.attention.sliding_window"]) == (4, 4, 2, 4, 16)
    assert keys["dflash.attention.compress_ratios"] == [0, 0]
    assert types["dflash.expert_weights_norm"] == [GGUFValueType.BOOL]
    assert "dflash.hyper_connection.single_pass" not in keys
    want = set(GLOBALS) | {"output_hc_fn.weight", "output_hc_base.weight", "output_hc_scale.weight"} | \
        {f"blk.{il}.{n}" for il in range(2) for n in DSV4_LAYER}
    assert set(tensors) == want and s["n_tensors"] == len(want)
    # hc: 4 streams of n_embd 64, (2 + 4) * 4 mixes; the grouped output {H*D/G, R, G}
    assert tensors["blk.0.hc_attn_fn.weight"] == (256, 24) and tensors["output_hc_fn.weight"] == (256, 4)
    assert tensors["blk.1.attn_output_a.weight"] == (4 * 32 // 2, 16, 2)
    assert tensors["blk.0.ffn_gate_exps.weight"] == (64, 32, 4)
    assert all(t.dtype == np.float32 and np.isfinite(t).all() for t in data.values())


def test_dsv41_is_single_pass_without_the_hc_head(tmp_path):
    make_model(tmp_path / "d.gguf", "dflash", "dsv41")
    keys, _, tensors, _ = read(tmp_path / "d.gguf")
    assert keys["dflash.hyper_connection.single_pass"] is True
    assert not any(n.startswith("output_hc_") for n in tensors)
    assert "markov_w1.weight" not in tensors and "blk.1.hc_ffn_fn.weight" in tensors
    assert load(tmp_path / "d.gguf").backbone == "dsv41"


def test_mistral_large_4_keys_and_tensors(tmp_path):
    s = make_model(tmp_path / "m.gguf", "dspark", "mistral-large4", kv_lora_rank=24, n_rot=8, k_head_dim_mla=40,
                   v_head_dim_mla=20, joint=True)
    keys, _, tensors, _ = read(tmp_path / "m.gguf")
    # key_length is the latent rank plus the rope dims; value_length the rank
    assert (keys["dflash.attention.key_length"], keys["dflash.attention.value_length"],
            keys["dflash.attention.kv_lora_rank"], keys["dflash.attention.key_length_mla"],
            keys["dflash.attention.value_length_mla"]) == (32, 24, 24, 40, 20)
    assert keys["dflash.rope.scaling.type"] == "yarn" and keys["dflash.rope.scaling.factor"] == 4.0
    assert keys["dflash.rope.scaling.original_context_length"] == keys["dflash.context_length"] // 4
    assert keys["dflash.final_logit_softcapping"] == 30.0 and "dflash.hyper_connection.count" not in keys
    want = set(GLOBALS) | {"mask_embd.weight", "joint_proj.weight", "joint_proj.bias"} | \
        {f"blk.{il}.{n}" for il in range(2) for n in ML4_LAYER}
    assert set(tensors) == want and s["n_tensors"] == len(want)
    assert tensors["blk.0.attn_kv_a_mqa.weight"] == (64, 32) and tensors["blk.0.attn_k_b.weight"] == (32, 24, 4)
    assert tensors["blk.0.attn_v_b.weight"] == (24, 20, 4) and tensors["mask_embd.weight"] == (64, 3)
    m = load(tmp_path / "m.gguf")
    assert m.backbone == "mistral-large4" and m.hparams.n_swa == 17


def test_no_yarn_without_a_scaling_factor(tmp_path):
    make_model(tmp_path / "m.gguf", "dspark", "mistral-large4", rope_scaling_factor=1.0, final_softcap=0.0)
    keys, _, _, _ = read(tmp_path / "m.gguf")
    assert "dflash.rope.scaling.type" not in keys and "dflash.final_logit_softcapping" not in keys


@pytest.mark.parametrize("variant, backbone, kw, fragment", [
    ("dflash2", "dsv4", {}, "the dsv4 backbone takes variant dflash or dspark, not dflash2"),
    ("dflash", "dsv4", {"conf": True}, "conf (the confidence head) applies to variant"),
    ("dspark", "dsv4", {"joint": True}, "option joint does not apply to the dsv4 backbone"),
    ("dspark", "dsv4", {"kv_lora_rank": 8}, "option kv_lora_rank does not apply to the dsv4 backbone"),
    ("dspark", "dsv4", {"n_rot": 7}, "n_rot (7) must be even"),
    ("dspark", "dsv4", {"n_rot": 48, "head_dim": 32}, "n_rot (48) must be at most head_dim (32)"),
    ("dspark", "dsv41", {"o_groups": 3}, "n_head (4) must be a multiple of o_groups (3)"),
    ("dspark", "dsv4", {"n_expert_used": 5}, "n_expert_used (5) must not exceed n_expert (4)"),
    ("dspark", "mistral-large4", {"n_rot": 32, "k_head_dim_mla": 32}, "n_rot (32) must be smaller than k_head_dim_mla"),
    ("dflash", "mistral-large4", {"joint": True}, "joint (the RNN joint head) needs variant"),
    ("dspark", "dsv4", {"n_vocab": 3}, "n_vocab must be at least 4"),
])
def test_refusals(tmp_path, variant, backbone, kw, fragment):
    with pytest.raises(ValueError) as e:
        make_model(tmp_path / "x.gguf", variant, backbone, **kw)
    assert fragment in str(e.value), str(e.value)
    assert not (tmp_path / "x.gguf").exists()
