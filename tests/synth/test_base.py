"""graphgen.synth.base: a base draft's keys, tokenizer and layers, as upstream loads them."""

import pytest
from gguf import GGUFValueType
from synth_read import read

from graphgen.synth import make_model


BASE_LAYER = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
              "attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight", "ffn_gate.weight",
              "ffn_down.weight", "ffn_up.weight")
GLOBALS = ("token_embd.weight", "fc.weight", "enc.output_norm.weight", "output_norm.weight", "output.weight")


def test_dflash_keys_and_tensors(tmp_path):
    s = make_model(tmp_path / "d.gguf")
    keys, types, tensors, _ = read(tmp_path / "d.gguf")
    assert keys["general.architecture"] == "dflash"
    assert keys["dflash.embedding_length"] == 64
    assert keys["dflash.block_count"] == 2
    assert keys["dflash.attention.head_count"] == 4
    assert keys["dflash.attention.head_count_kv"] == 4
    assert keys["dflash.feed_forward_length"] == 128
    assert keys["dflash.block_size"] == 4
    assert keys["dflash.target_layers"] == [1, 2]
    assert types["dflash.target_layers"] == [GGUFValueType.ARRAY, GGUFValueType.INT32]
    assert types["dflash.block_size"] == [GGUFValueType.UINT32]
    assert types["dflash.attention.layer_norm_rms_epsilon"] == [GGUFValueType.FLOAT32]
    assert keys["tokenizer.ggml.model"] == "llama"
    assert len(keys["tokenizer.ggml.tokens"]) == 256
    assert len(keys["tokenizer.ggml.scores"]) == 256
    assert len(keys["tokenizer.ggml.token_type"]) == 256
    assert keys["tokenizer.ggml.mask_token_id"] == 255
    expected = set(GLOBALS) | {f"blk.{il}.{n}" for il in range(2) for n in BASE_LAYER}
    assert set(tensors) == expected
    assert s["n_tensors"] == len(expected)
    assert tensors == s["tensors"]
    assert tensors["fc.weight"] == (128, 64)
    assert tensors["token_embd.weight"] == (64, 256)
    assert tensors["output.weight"] == (64, 256)
    assert tensors["blk.0.attn_q_norm.weight"] == (16,)
    assert tensors["blk.1.ffn_down.weight"] == (128, 64)


def test_gqa_head_dim_and_rot(tmp_path):
    make_model(tmp_path / "d.gguf", n_head_kv=2, head_dim=32, n_rot=16)
    keys, _, tensors, _ = read(tmp_path / "d.gguf")
    assert keys["dflash.attention.key_length"] == 32
    assert keys["dflash.attention.value_length"] == 32
    assert keys["dflash.rope.dimension_count"] == 16
    assert tensors["blk.0.attn_q.weight"] == (64, 128)
    assert tensors["blk.0.attn_k.weight"] == (64, 64)
    assert tensors["blk.0.attn_output.weight"] == (128, 64)
    assert tensors["blk.0.attn_k_norm.weight"] == (32,)


def test_layer_options(tmp_path):
    make_model(tmp_path / "d.gguf", n_layer=3, swa_window=8, swa_pattern=[1, 0, 1], shared_kv=True,
               sinks=True, post_norms=True, out_scale=True, rope_freqs=True, mrope_sections=[8, 0, 0, 0],
               attention_scale=0.25, value_scale=0.5, embedding_scale=2.0, logit_scale=0.5,
               final_softcap=30.0, causal=True, hidden_act="gelu")
    keys, types, tensors, _ = read(tmp_path / "d.gguf")
    assert keys["dflash.attention.sliding_window"] == 8
    assert keys["dflash.attention.sliding_window_pattern"] == [True, False, True]
    assert types["dflash.attention.sliding_window_pattern"] == [GGUFValueType.ARRAY, GGUFValueType.BOOL]
    assert keys["dflash.rope.dimension_sections"] == [8, 0, 0, 0]
    assert types["dflash.rope.dimension_sections"] == [GGUFValueType.ARRAY, GGUFValueType.INT32]
    assert keys["dflash.attention.scale"] == pytest.approx(0.25)
    assert keys["dflash.attention.value_scale"] == pytest.approx(0.5)
    assert keys["dflash.embedding_scale"] == pytest.approx(2.0)
    assert keys["dflash.logit_scale"] == pytest.approx(0.5)
    assert keys["dflash.final_logit_softcapping"] == pytest.approx(30.0)
    assert keys["dflash.attention.causal"] is True
    assert keys["dflash.hidden_activation"] == "gelu"
    assert not any(n.endswith("attn_v.weight") for n in tensors)
    assert tensors["blk.2.attn_sinks.weight"] == (4,)
    assert tensors["blk.0.post_attention_norm.weight"] == (64,)
    assert tensors["blk.0.post_ffw_norm.weight"] == (64,)
    assert tensors["blk.1.layer_output_scale.weight"] == (1,)
    assert tensors["rope_freqs.weight"] == (8,)


def test_weight_scales_only_where_upstream_loads_them(tmp_path):
    make_model(tmp_path / "d.gguf", weight_scales=True, shared_kv=True)
    _, _, tensors, _ = read(tmp_path / "d.gguf")
    scales = {n for n in tensors if n.endswith(".scale")}
    per_layer = ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_down", "ffn_up")
    assert scales == {"fc.scale"} | {f"blk.{il}.{n}.scale" for il in range(2) for n in per_layer}
    assert all(tensors[n] == (1,) for n in scales)
