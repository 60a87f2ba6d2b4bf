"""graphgen.models.conv: the DFlash2 block-local dynamic convolution, node for node against
llama.cpp b11739's dumps (its four uses per layer, taps dropped where a block is shorter than the
kernel), and its tensors."""

from types import SimpleNamespace

import numpy as np
import pytest

from graphgen.models.arch import HParams
from graphgen.models.conv import (
    CONV_LAYER_TENSORS,
    build_dflash2_conv,
    load_tensors_dflash2_conv,
    n_seqs_unq,
)
from graphgen.ops import ggml as G

from .graphs import block, structure


def sections(nodes, il):
    """The nodes of layer il's four convs: from the tap projection's matmul to the conv's named
    output (attn_conv_in, attn_conv_out, ffn_conv_in, ffn_conv_out)."""
    out = {}
    names = [n.name for n in nodes]
    for end, after in (("attn_conv_in", f"noise_norm-{il}"), ("ffn_conv_in", f"ffn_norm-{il}"),
                       ("attn_conv_out", f"kqv_out-{il}"), ("ffn_conv_out", f"ffn_out-{il}")):
        stop = names.index(f"{end}-{il}")
        start = max(k for k in range(stop) if names[k] == after) + 1
        out[end] = nodes[start:stop + 1]
    return out


@pytest.mark.parametrize("case", ["dflash2-fa-off", "dflash2-fa-on", "dflash2-top1-block2"])
def test_every_conv_is_b11739s(case, tmp_path, models_dir):
    ours, ref = block(case, tmp_path, models_dir)
    for il in (0, 1):
        got, want = sections(ours, il), sections(ref, il)
        for part in want:
            assert structure(got[part]) == structure(want[part]), (case, il, part)


@pytest.mark.parametrize("case, taps", [("dflash2-fa-off", 3), ("dflash2-top1-block2", 2)])
def test_a_tap_past_the_block_is_dropped(case, taps, tmp_path, models_dir):
    # kernel 3: blocks of 4 take every tap, blocks of 2 two (the third sees only padding)
    ours, ref = block(case, tmp_path, models_dir)
    for nodes in (ours, ref):
        conv = sections(nodes, 0)["attn_conv_in"]
        assert sum(n.op == "PAD" for n in conv) == taps - 1
        assert sum(n.op == "MUL" for n in conv) == taps


def hparams(**kw):
    hp = HParams(n_embd=64, n_layer=2, n_head=4, n_ff=128, n_vocab=256)
    for k, v in kw.items():
        setattr(hp, k, v)
    return hp


def test_tensors_only_with_the_conv_keys():
    assert load_tensors_dflash2_conv(hparams()) == {}
    assert load_tensors_dflash2_conv(hparams(conv_kernel_size=3)) == {}
    shapes = load_tensors_dflash2_conv(hparams(conv_kernel_size=3, conv_group_size=16))
    # base taps {n_embd, kernel, 2}; projection to 2 * kernel * (n_embd / group) taps per token
    assert shapes == {f"blk.{il}.{part}": shape for il in (0, 1) for part, shape in (
        ("attn_conv_base", (64, 3, 2)), ("ffn_conv_base", (64, 3, 2)),
        ("attn_conv_proj.weight", (64, 24)), ("ffn_conv_proj.weight", (64, 24)))}
    assert [t.attr for t in CONV_LAYER_TENSORS] == ["dflash_attn_conv_base", "dflash_ffn_conv_base",
                                                    "dflash_attn_conv_proj", "dflash_ffn_conv_proj"]


def test_blocks_are_the_batches_distinct_sequences():
    assert n_seqs_unq(SimpleNamespace(seq=np.array([0, 0, 0, 0]))) == 1
    assert n_seqs_unq(SimpleNamespace(seq=np.array([3, 3, 1, 1, 0, 0]))) == 3


def test_unequal_blocks_and_missing_taps_are_refused():
    ctx = G.ggml_init(G.ggml_init_params(mem_size=16 * G.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
    try:
        hidden = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 64, 5)
        dyn = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 24, 5)
        base = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 64, 3, 2)
        g = SimpleNamespace(hparams=hparams(conv_kernel_size=3, conv_group_size=16), ctx0=ctx,
                            ubatch=SimpleNamespace(seq=np.array([0, 0, 0, 1, 1])))
        with pytest.raises(ValueError, match="equal-size blocks"):
            build_dflash2_conv(g, hidden, dyn, base, 0)
        g.ubatch = SimpleNamespace(seq=np.zeros(5, np.int32))
        with pytest.raises(ValueError, match="a side of 0 or 1"):
            build_dflash2_conv(g, hidden, dyn, base, 2)
        with pytest.raises(ValueError, match="its base taps"):
            build_dflash2_conv(g, hidden, dyn, None, 0)
    finally:
        G.ggml_free(ctx)
