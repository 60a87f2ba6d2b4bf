"""graphgen.synth.head_writers: each head's keys and tensors, with the shapes upstream loads."""

from gguf import GGUFValueType
from synth_read import read

from graphgen.synth import make_model


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
