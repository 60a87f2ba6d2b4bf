"""graphgen.synth: the random draft GGUFs read back with the keys and tensors upstream loads."""

import argparse

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from graphgen.cli.model import add_make_model_args, make_model_from_args
from graphgen.synth import make_model


def read(path):
    r = GGUFReader(str(path))
    keys = {name: f.contents() for name, f in r.fields.items() if not name.startswith("GGUF.")}
    types = {name: f.types for name, f in r.fields.items()}
    tensors = {t.name: tuple(int(n) for n in t.shape) for t in r.tensors}
    data = {t.name: np.array(t.data) for t in r.tensors}
    return keys, types, tensors, data


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


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    for variant in ("dflash", "dflash2", "dspark", "lilicorr"):
        a, b, c = (tmp_path / f"{variant}{i}.gguf" for i in range(3))
        make_model(a, variant, seed=3)
        make_model(b, variant, seed=3)
        make_model(c, variant, seed=4)
        assert a.read_bytes() == b.read_bytes(), variant
        assert a.read_bytes() != c.read_bytes(), variant
        assert len(a.read_bytes()) == len(c.read_bytes()), variant


def test_weights_are_f32_and_tame(tmp_path):
    make_model(tmp_path / "d.gguf")
    _, _, _, data = read(tmp_path / "d.gguf")
    for name, t in data.items():
        assert t.dtype == np.float32, name
        assert np.isfinite(t).all() and np.abs(t).max() < 10, name
    assert abs(data["output_norm.weight"].mean() - 1.0) < 0.1


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


def test_d2t(tmp_path):
    make_model(tmp_path / "d.gguf", d2t_vocab=100)
    _, _, tensors, data = read(tmp_path / "d.gguf")
    assert tensors["d2t"] == (100,)
    ids = data["d2t"]
    assert ids.dtype == np.int64
    assert (np.diff(ids) > 0).all() and ids.min() >= 0 and ids.max() < 256
    assert tensors["output.weight"] == (64, 100)
    assert tensors["token_embd.weight"] == (64, 256)


def test_dflash2(tmp_path):
    make_model(tmp_path / "d.gguf", "dflash2", selector_rank=8, selector_top_k=3, conv_kernel_size=3,
               conv_group_size=16)
    keys, _, tensors, _ = read(tmp_path / "d.gguf")
    assert keys["dflash.selector_rank"] == 8
    assert keys["dflash.selector_top_k"] == 3
    assert keys["dflash.conv_kernel_size"] == 3
    assert keys["dflash.conv_group_size"] == 16
    assert tensors["selector_predecessor.weight"] == (8, 256)
    assert tensors["selector_successor.weight"] == (8, 256)
    assert tensors["selector_hidden.weight"] == (64, 8)
    for il in range(2):
        for part in ("attn", "ffn"):
            assert tensors[f"blk.{il}.{part}_conv_base"] == (64, 3, 2)
            assert tensors[f"blk.{il}.{part}_conv_proj.weight"] == (64, 2 * 3 * 4)


def test_dspark(tmp_path):
    make_model(tmp_path / "a.gguf", "dspark", markov_rank=8)
    keys, _, tensors, _ = read(tmp_path / "a.gguf")
    assert tensors["markov_w1.weight"] == (8, 256)
    assert tensors["markov_w2.weight"] == (8, 256)
    assert "conf_proj.weight" not in tensors
    assert keys["dflash.has_confidence_head"] is False
    assert "dflash.sample_from_anchor" not in keys

    make_model(tmp_path / "b.gguf", "dspark", conf=True, markov_rank=8, d2t_vocab=100, joint=True,
               sample_from_anchor=False, weight_scales=True)
    keys, _, tensors, _ = read(tmp_path / "b.gguf")
    assert keys["dflash.has_confidence_head"] is True
    assert keys["dflash.sample_from_anchor"] is False
    assert tensors["markov_w1.weight"] == (8, 256)
    assert tensors["markov_w2.weight"] == (8, 100)
    assert tensors["markov_w2.scale"] == (1,)
    assert tensors["conf_proj.weight"] == (72, 1)
    assert tensors["conf_proj.bias"] == (1,)
    assert tensors["joint_proj.weight"] == (80, 24)
    assert tensors["joint_proj.bias"] == (24,)


def test_lilicorr(tmp_path):
    make_model(tmp_path / "a.gguf", "lilicorr", lilicorr_top_k=2, lilicorr_heads=2, lilicorr_layers=2,
               lilicorr_factor=16, lilicorr_mlp=96)
    keys, types, tensors, _ = read(tmp_path / "a.gguf")
    assert keys["lilicorr.hidden_size"] == 64
    assert keys["lilicorr.candidate_topk"] == 2
    assert keys["lilicorr.num_heads"] == 2
    assert keys["lilicorr.num_layers"] == 2
    assert keys["lilicorr.factor_dim"] == 16
    assert keys["lilicorr.mlp_hidden_size"] == 96
    assert types["lilicorr.vector_eps"] == [GGUFValueType.FLOAT32]
    assert types["lilicorr.logit_scale"] == [GGUFValueType.FLOAT32]
    assert not any(k.startswith("dflash.lilicorr") for k in keys)
    assert "lilicorr.token_proj.weight" not in tensors  # hidden == n_embd
    assert tensors["lilicorr.pass_hidden_proj.weight"] == (64, 64)
    # feature block after the base stack and the head layers: 2 + 2
    assert tensors["blk.4.ffn_norm.weight"] == (5,)
    assert tensors["blk.4.ffn_norm.bias"] == (5,)
    assert tensors["blk.4.ffn_up.weight"] == (5, 64)
    assert tensors["blk.4.ffn_down.weight"] == (64, 64)
    assert tensors["lilicorr.slot_embedding.weight"] == (64, 3)
    assert tensors["lilicorr.rank_embedding.weight"] == (64, 2)
    assert tensors["lilicorr.attention_bias.bias"] == (6, 6, 2)
    for i in range(2):
        bid = 2 + i
        assert tensors[f"lilicorr.layers.{i}.attn.in_proj.weight"] == (64, 192)
        assert tensors[f"lilicorr.layers.{i}.attn.in_proj.bias"] == (192,)
        assert tensors[f"blk.{bid}.attn_norm.weight"] == (64,)
        assert tensors[f"blk.{bid}.attn_output.weight"] == (64, 64)
        assert tensors[f"blk.{bid}.ffn_up.weight"] == (64, 96)
        assert tensors[f"blk.{bid}.ffn_down.bias"] == (64,)
    assert tensors["lilicorr.factor_input_proj.weight"] == (192, 64)
    for head in ("out_head", "in_head", "anchor_out_head"):
        assert tensors[f"lilicorr.{head}.weight"] == (64, 16)
        assert tensors[f"lilicorr.{head}.bias"] == (16,)
    assert not any("conv" in n for n in tensors)

    make_model(tmp_path / "b.gguf", "lilicorr", lilicorr_hidden=32, lilicorr_conv=True, weight_scales=True)
    keys, _, tensors, _ = read(tmp_path / "b.gguf")
    assert keys["dflash.conv_kernel_size"] == 3
    assert tensors["lilicorr.token_proj.weight"] == (64, 32)
    assert tensors["lilicorr.token_proj.bias"] == (32,)
    assert tensors["lilicorr.token_proj.scale"] == (1,)
    assert tensors["blk.2.attn_output.scale"] == (1,)
    assert tensors["blk.0.attn_conv_base"] == (64, 3, 2)
    assert tensors["blk.1.ffn_conv_proj.weight"] == (64, 24)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_embd=60, n_head=8), "n_embd"),
    (dict(n_head=4, n_head_kv=3), "n_head_kv"),
    (dict(target_layers=()), "target_layers"),
    (dict(n_vocab=3), "n_vocab"),
    (dict(swa_window=8, swa_pattern=[0, 0]), "sliding"),
    (dict(swa_window=8, swa_pattern=[1]), "swa_pattern"),
    (dict(swa_pattern=[1, 0]), "swa_window"),
    (dict(mrope_sections=[8, 0, 0]), "mrope_sections"),
    (dict(d2t_vocab=256), "d2t_vocab"),
    (dict(n_rot=7), "n_rot"),
    (dict(no_such_option=1), "no_such_option"),
    (dict(variant="dflash", selector_top_k=2), "selector_top_k"),
    (dict(variant="dflash", conf=True), "conf"),
    (dict(variant="dflash2", n_embd=16, n_head=2, selector_top_k=4, conv_group_size=8), "top_k"),
    (dict(variant="dflash2", conv_group_size=24), "conv_group_size"),
    (dict(variant="lilicorr", lilicorr_layers=3), "lilicorr_layers"),
    (dict(variant="lilicorr", block_size=1), "block_size"),
    (dict(variant="lilicorr", lilicorr_heads=3), "lilicorr_heads"),
    (dict(variant="lilicorr", conv_kernel_size=3), "lilicorr_conv"),
    (dict(variant="nope"), "variant"),
])
def test_bad_options(tmp_path, kwargs, match):
    kwargs = dict(kwargs)
    variant = kwargs.pop("variant", "dflash")
    with pytest.raises(ValueError, match=match):
        make_model(tmp_path / "x.gguf", variant, **kwargs)
    assert not (tmp_path / "x.gguf").exists()


def test_backbone_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="backbone must be one of"):
        make_model(tmp_path / "x.gguf", backbone="dsv5")
    with pytest.raises(ValueError, match="q_lora_rank"):
        make_model(tmp_path / "x.gguf", q_lora_rank=8)
    with pytest.raises(ValueError, match="does not apply"):
        make_model(tmp_path / "x.gguf", "dspark", backbone="mistral-large4", q_lora_rank=8)


def test_command_line(tmp_path):
    parser = argparse.ArgumentParser()
    add_make_model_args(parser)
    out = tmp_path / "c.gguf"
    args = parser.parse_args([str(out), "--variant", "dspark", "--conf", "--layers", "3",
                              "--target-layers", "0,2,4", "--swa-window", "16", "--swa-pattern", "1,0,1",
                              "--shared-kv", "--sample-from-anchor", "false", "--markov-rank", "4"])
    s = make_model_from_args(args)
    assert s["variant"] == "dspark"
    keys, _, tensors, _ = read(out)
    assert keys["dflash.target_layers"] == [0, 2, 4]
    assert keys["dflash.attention.sliding_window_pattern"] == [True, False, True]
    assert keys["dflash.sample_from_anchor"] is False
    assert tensors["fc.weight"] == (192, 64)
    assert tensors["markov_w1.weight"] == (4, 256)
    assert "conf_proj.weight" in tensors and "blk.0.attn_v.weight" not in tensors

    args = parser.parse_args([str(out), "--variant", "dflash", "--conv-kernel", "3"])
    with pytest.raises(ValueError, match="conv_kernel_size"):
        make_model_from_args(args)


def test_variants_are_the_registered_heads():
    """synth spells the head names for the command line (which must not load ggml to build its
    options); they must be the registry's heads, and every head option must come from an entry."""
    from graphgen.models.arch import HEADS
    from graphgen.synth import VARIANTS, _options
    assert set(VARIANTS) == set(HEADS)
    owned = {name for h in HEADS.values() for name in h.synth_options}
    assert owned and all(_options()[name][1] for name in owned)


def _target_keys(path, n_layer):
    """A target as make_model reads it (keys only): width, depth, a small vocabulary."""
    from gguf import GGUFWriter
    w = GGUFWriter(str(path), "llama")
    w.add_uint32("llama.embedding_length", 64)
    w.add_uint32("llama.block_count", n_layer)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(256)])
    w.add_array("tokenizer.ggml.token_type", [1] * 255 + [3])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_target_too_shallow_for_the_default_layers_needs_them_given(tmp_path):
    """The authors' spread of three layers repeats one on a target of five layers or fewer: a draft
    reading one layer twice is no default, so make_model asks for target_layers; given, they stand."""
    for n_layer, spread in ((3, "2,1,1"), (4, "2,2,2"), (5, "2,3,3")):
        t = _target_keys(tmp_path / f"t{n_layer}.gguf", n_layer)
        with pytest.raises(ValueError, match=rf"t{n_layer}\.gguf has {n_layer} layers.*\({spread}\).*"
                                             rf"0\.\.{n_layer - 1} \(--target-layers\)"):
            make_model(tmp_path / "x.gguf", target=t, n_layer=1)
        assert not (tmp_path / "x.gguf").exists()
    s = make_model(tmp_path / "x.gguf", target=_target_keys(tmp_path / "t4.gguf", 4), n_layer=1, target_layers=[3, 3])
    assert s["keys"]["dflash.target_layers"] == [3, 3]
    s = make_model(tmp_path / "y.gguf", target=_target_keys(tmp_path / "t6.gguf", 6), n_layer=1)
    assert s["keys"]["dflash.target_layers"] == [2, 3, 4]
