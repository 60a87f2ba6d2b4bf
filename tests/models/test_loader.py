"""graphgen.models.loader: GGUF keys read as llama.cpp b11739 reads them (each key's C++ type: a
scalar of exactly that type, a per-layer value or array, arrays of the element types get_arr
takes, the string map, the vocabulary's arrays), the base hyperparameters' properties, rope
scaling and sections, the loader's own keys."""

import gguf
import numpy as np
import pytest

from graphgen.errors import GGUFModelError
from graphgen.ggufile import open_reader
from graphgen.models import loader as L
from graphgen.models.arch import HParams
from graphgen.ops import ggml as G

VT = gguf.GGUFValueType


def meta(tmp_path, keys, n_layer=0, arch="dflash"):
    """GGUFMeta over a GGUF holding `keys` ({name: (value, type[, element type])}) and no tensors."""
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    for name, spec in keys.items():
        value, vtype, *sub = spec
        w.add_key_value(name, value, vtype, sub_type=sub[0] if sub else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return L.GGUFMeta(open_reader(path), path, n_layer)


def fails(m, fragment, fn, *args, **kw):
    with pytest.raises(GGUFModelError) as e:
        fn(*args, **kw)
    assert str(e.value).startswith(f"{m.path}: ") and fragment in str(e.value), str(e.value)


def test_key_spec():
    assert L.key_spec("dflash.block_size") == (L.KEY, L.U32)
    assert L.key_spec("dflash.target_layers") == (L.ARR_VEC, L.I32)
    assert L.key_spec("tokenizer.ggml.bos_token_id") == (L.KEY, L.U32)
    assert L.key_spec("lilicorr.vector_eps") == (L.KEY, L.F32)
    assert L.key_spec("dflash.no_such_key") is None and L.key_spec("block_size") is None


def test_a_scalar_must_be_of_exactly_its_type(tmp_path):
    m = meta(tmp_path, {"dflash.block_size": (4, VT.UINT32), "dflash.conv_kernel_size": (3, VT.INT32),
                        "dflash.attention.scale": (0.5, VT.FLOAT32), "dflash.unknown": (7, VT.INT64)})
    assert m.get("dflash.block_size", kind="int") == 4
    fails(m, "key 'dflash.conv_kernel_size' has wrong type i32 but expected type u32", m.get, "dflash.conv_kernel_size")
    assert m.get("dflash.attention.scale", kind="float") == 0.5
    # a key llama.cpp never reads is read as it is
    assert m.get("dflash.unknown") == 7
    assert m.get("dflash.selector_rank", 9) == 9 and m.read("dflash.selector_rank") is None
    fails(m, "missing key 'dflash.selector_rank' (llama.cpp: key not found in model: dflash.selector_rank)",
          m.read, "dflash.selector_rank", required=True)
    fails(m, "missing key 'dflash.target_layers' (llama.cpp: array key not found", m.read, "dflash.target_layers",
          required=True)


def test_kinds(tmp_path):
    m = meta(tmp_path, {"dflash.attention.scale": (0.5, VT.FLOAT32), "dflash.hidden_activation": ("silu", VT.STRING),
                        "dflash.block_size": (4, VT.UINT32)})
    fails(m, "key 'dflash.attention.scale' must be an integer, got 0.5", m.get, "dflash.attention.scale", kind="int")
    fails(m, "must be a number, got 'silu'", m.get, "dflash.hidden_activation", kind="float")
    assert m.get("dflash.block_size", kind="float") == 4.0 and isinstance(m.get("dflash.block_size", kind="float"), float)
    assert m.get("dflash.block_size", kind="array") == [4]


def test_per_layer_keys(tmp_path):
    m = meta(tmp_path, {"dflash.attention.head_count": ([4, 4], VT.ARRAY, VT.UINT32),
                        "dflash.feed_forward_length": ([64, 128], VT.ARRAY, VT.UINT32),
                        "dflash.expert_used_count": ([1, 2, 3], VT.ARRAY, VT.UINT32),
                        "dflash.attention.head_count_kv": ([1.0, 1.0], VT.ARRAY, VT.FLOAT32),
                        "dflash.swiglu_clamp_exp": (7.0, VT.FLOAT32)}, n_layer=2)
    assert m.get("dflash.attention.head_count", kind="int") == 4
    fails(m, "holds per-layer values [64, 128]; graphgen builds drafts with one value", m.get,
          "dflash.feed_forward_length", kind="int")
    fails(m, "key 'dflash.expert_used_count' has wrong array length; expected 2, got 3", m.get,
          "dflash.expert_used_count")
    fails(m, "key 'dflash.attention.head_count_kv' has wrong array element type f32", m.get,
          "dflash.attention.head_count_kv")
    assert m.get_key_or_arr("dflash.swiglu_clamp_exp", 2) == [7.0, 7.0]
    assert m.get_key_or_arr("dflash.attention.head_count", 2, kind="int") == [4, 4]
    assert m.get_key_or_arr("dflash.swiglu_clamp_shexp", 2, default=0.0) == [0.0, 0.0]
    fails(m, "missing key 'dflash.swiglu_clamp_shexp'", m.get_key_or_arr, "dflash.swiglu_clamp_shexp", 2)


def test_arrays(tmp_path):
    m = meta(tmp_path, {"dflash.target_layers": ([1, 2], VT.ARRAY, VT.INT32),
                        "dflash.attention.sliding_window_pattern": ([True, False], VT.ARRAY, VT.BOOL),
                        "dflash.attention.compress_ratios": (list(range(513)), VT.ARRAY, VT.UINT32),
                        "dflash.classifier.output_labels": ([1.0], VT.ARRAY, VT.FLOAT32),
                        "tokenizer.ggml.scores": ([0.0, 1.0], VT.ARRAY, VT.FLOAT32),
                        "tokenizer.ggml.token_type": ([1, 1], VT.ARRAY, VT.UINT32)})
    assert m.get("dflash.target_layers") == [1, 2]
    # the fixed-size read takes bools, as ints
    assert m.get("dflash.attention.sliding_window_pattern") == [1, 0]
    fails(m, "array length 513 for key 'dflash.attention.compress_ratios' exceeds max 512", m.get,
          "dflash.attention.compress_ratios")
    fails(m, "key 'dflash.classifier.output_labels' has wrong array element type f32", m.get,
          "dflash.classifier.output_labels")
    assert m.get("tokenizer.ggml.scores") == [0.0, 1.0]
    fails(m, "invalid gguf type for tokenizer.ggml.token_type (arr of u32); llama.cpp expects an array of i32",
          m.get, "tokenizer.ggml.token_type")


def test_a_scalar_where_an_array_is_read_is_absent_and_the_string_map(tmp_path):
    m = meta(tmp_path, {"dflash.target_layers": (3, VT.INT32), "dflash.sample_from_anchor": (False, VT.BOOL)})
    assert m.get("dflash.target_layers", "none") == "none"
    assert m.get("dflash.sample_from_anchor") == "false"
    m = meta(tmp_path, {"dflash.sample_from_anchor": ([1], VT.ARRAY, VT.INT32)})
    assert m.get("dflash.sample_from_anchor", "absent") == "absent"


def test_hparams_properties():
    hp = HParams(n_embd=64, n_head=4, n_head_kv=2, n_embd_head_k=16, n_embd_head_v=8, n_layer=3)
    hp.target_layers = [1, 2, 3]
    assert hp.n_embd_inp_enc == 192 and hp.n_embd_k_gqa == 32 and hp.n_embd_v_gqa == 16
    assert not hp.use_iswa and not hp.is_swa(0)
    hp.n_swa, hp.swa_layers = 4, [True, False]
    assert hp.is_swa(0) and not hp.is_swa(1) and not hp.is_swa(2)
    hp.set_swa_uniform(9)
    assert hp.n_swa == 9 and hp.swa_layers == [True] * 3
    assert hp.rope_type == G.GGML_ROPE_TYPE_NEOX and hp.n_pos_per_embd == 1
    hp.hc_mult = 4
    assert hp.rope_type == 0
    hp.rope_sections = [2, 2, 0, 0]
    assert hp.rope_type == G.GGML_ROPE_TYPE_MROPE and hp.n_pos_per_embd == 4


def test_rope_scaling(tmp_path):
    hp = HParams(n_ctx_train=4096)
    L.read_rope_scaling(meta(tmp_path, {}), hp, "p")
    assert (hp.rope_scaling_type, hp.rope_freq_scale, hp.rope_attn_factor, hp.n_ctx_orig_yarn) == ("linear", 1.0, 1.0, 4096)
    m = meta(tmp_path, {"dflash.rope.scaling.type": ("yarn", VT.STRING), "dflash.rope.scaling.factor": (3.0, VT.FLOAT32),
                        "dflash.rope.scaling.attn_factor": (1.5, VT.FLOAT32),
                        "dflash.rope.scaling.original_context_length": (1024, VT.UINT32)})
    L.read_rope_scaling(m, hp, "p")
    assert hp.rope_scaling_type == "yarn" and hp.rope_freq_scale == float(np.float32(1) / np.float32(3))
    assert hp.rope_freq_scale != 1 / 3 and (hp.rope_attn_factor, hp.n_ctx_orig_yarn) == (1.5, 1024)
    L.read_rope_scaling(meta(tmp_path, {"dflash.rope.scale_linear": (2.0, VT.FLOAT32)}), hp, "p")
    assert hp.rope_freq_scale == 0.5
    with pytest.raises(GGUFModelError, match="'magic' is not a rope scaling type llama.cpp knows"):
        L.read_rope_scaling(meta(tmp_path, {"dflash.rope.scaling.type": ("magic", VT.STRING)}), hp, "p")


@pytest.mark.parametrize("value, vtype, want, error", [
    ([4, 4, 0, 0], VT.ARRAY, [4, 4, 0, 0], None),
    (2, VT.INT32, [2, 2, 2, 2], None),
    ([0, 0, 0, 0], VT.ARRAY, [0, 0, 0, 0], None),
    ([0, 0, 0, 4], VT.ARRAY, None, "gives none of the first three sections a positive size"),
    ([8, 8, 8, 0], VT.ARRAY, None, "sums to 24, more than the head dimension 16"),
    ([4, 4, 0], VT.ARRAY, None, "wrong array length; expected 4, got 3"),
    ([4, -4, 0, 0], VT.ARRAY, None, "sums to 0"),
])
def test_rope_sections(tmp_path, value, vtype, want, error):
    keys = {"dflash.rope.dimension_sections": (value, vtype, VT.INT32) if vtype == VT.ARRAY else (value, vtype)}
    hp = HParams(n_embd_head_k=16)
    if error:
        with pytest.raises(GGUFModelError, match=error):
            L.read_rope_sections(meta(tmp_path, keys), hp, "p")
    else:
        L.read_rope_sections(meta(tmp_path, keys), hp, "p")
        assert hp.rope_sections == want


def test_rope_sections_are_c_ints(tmp_path):
    # a u32 past 2^31 reads as the negative int it is stored in upstream
    keys = {"dflash.rope.dimension_sections": ([2**32 - 4, 8, 0, 0], VT.ARRAY, VT.UINT32)}
    hp = HParams(n_embd_head_k=16)
    L.read_rope_sections(meta(tmp_path, keys), hp, "p")
    assert hp.rope_sections == [-4, 8, 0, 0]


def test_the_loaders_own_keys(tmp_path):
    L.read_loader_keys(meta(tmp_path, {}), "p")
    with pytest.raises(GGUFModelError, match="general.architecture is 'llama', graphgen drafts are 'dflash'"):
        L.read_loader_keys(meta(tmp_path, {}, arch="llama"), "p")
    with pytest.raises(GGUFModelError, match="'split.count' = 2: a model split over several files"):
        L.read_loader_keys(meta(tmp_path, {"split.count": (2, VT.UINT16), "split.no": (0, VT.UINT16)}), "p")


BASE = {"dflash.context_length": (256, VT.UINT32), "dflash.embedding_length": (64, VT.UINT32),
        "dflash.block_count": (2, VT.UINT32), "dflash.attention.head_count": (4, VT.UINT32)}


@pytest.mark.parametrize("edit, error", [
    ({}, None),
    ({"dflash.attention.head_count_kv": (3, VT.UINT32)}, "is not a multiple of 'dflash.attention.head_count_kv' = 3"),
    ({"dflash.block_count": (0, VT.UINT32)}, "'dflash.block_count' = 0 is out of range [1, 512]"),
    ({"dflash.nextn_predict_layers": (1, VT.UINT32)}, "loads only the first 1 of the 2 layers"),
    ({"dflash.expert_count": (4, VT.UINT32)}, "'dflash.expert_count' = 4 with no 'dflash.expert_used_count'"),
    ({"dflash.classifier.activation": ("relu", VT.STRING)}, "unsupported classifier activation"),
])
def test_base_hparams(tmp_path, edit, error):
    hp = HParams()
    m = meta(tmp_path, {**BASE, **edit})
    if error:
        with pytest.raises(GGUFModelError, match=error.replace("[", r"\[").replace("]", r"\]")):
            L.read_base_hparams(m, hp, "p")
        return
    L.read_base_hparams(m, hp, "p")
    assert (hp.n_ctx_train, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_ff) == (256, 64, 2, 4, 4, 0)
    assert hp.ctx_causal and not hp.causal_attn and m.n_layer == 2


TOKENS = {"tokenizer.ggml.model": ("llama", VT.STRING),
          "tokenizer.ggml.tokens": (["a", "b", "c"], VT.ARRAY, VT.STRING)}


@pytest.mark.parametrize("edit, error", [
    ({}, None),
    ({"tokenizer.ggml.tokens": (["a", "b", "a"], VT.ARRAY, VT.STRING)}, "holds token 'a' twice (ids 0 and 2)"),
    ({"tokenizer.ggml.model": ("gpt2", VT.STRING)}, "needs key 'tokenizer.ggml.merges'"),
    ({"tokenizer.ggml.model": ("sentencepiece", VT.STRING)}, "unknown tokenizer"),
    ({"tokenizer.ggml.scores": ([0.0, 0.0], VT.ARRAY, VT.FLOAT32)}, "has 2 entries for 3 tokens"),
    ({"tokenizer.ggml.model": ("none", VT.STRING)}, "a draft without a vocabulary"),
])
def test_vocab(tmp_path, edit, error):
    hp = HParams()
    m = meta(tmp_path, {**TOKENS, **edit})
    if error:
        with pytest.raises(GGUFModelError, match=error.replace("(", r"\(").replace(")", r"\)")):
            L.read_vocab(m, hp, "p")
        return
    L.read_vocab(m, hp, "p")
    assert hp.n_vocab == 3 and hp.mask_token_id == -1


def test_mask_token_inside_the_vocabulary_only(tmp_path):
    hp = HParams()
    L.read_vocab(meta(tmp_path, {**TOKENS, "tokenizer.ggml.mask_token_id": (2, VT.UINT32)}), hp, "p")
    assert hp.mask_token_id == 2
    hp = HParams()
    L.read_vocab(meta(tmp_path, {**TOKENS, "tokenizer.ggml.mask_token_id": (3, VT.UINT32)}), hp, "p")
    assert hp.mask_token_id == -1
