"""The DFlash2 block-local dynamic convolution (build_dflash2_conv in the seed's dflash2.cpp) and
its tensors (load_tensors_dflash2_conv).

It has a module of its own because two model files use it: the base decoder layers of dflash.py
run it in every head whose GGUF sets the conv keys (as b11739 does), and dflash2.py and
lilicorr.py load its tensors; here neither imports the other.
"""

from __future__ import annotations

import numpy as np

from ..ops import ggml as G
from ..ops.ggml import (ggml_add, ggml_cont, ggml_cont_2d, ggml_is_contiguous, ggml_mul, ggml_pad_ext,
                        ggml_repeat_4d, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d, ggml_view_1d,
                        ggml_view_3d, ggml_view_4d)
from .tensors import T, shapes_of


def _projected(hp) -> int:
    return 2 * hp.conv_kernel_size * (hp.n_embd // hp.conv_group_size)


# per layer, for attention and FFN: base taps {n_embd, kernel, 2} and the tap projection
CONV_LAYER_TENSORS = [
    T(f"dflash_{part}_conv_base", f"blk.{{il}}.{part}_conv_base", lambda hp, x: (hp.n_embd, hp.conv_kernel_size, 2))
    for part in ("attn", "ffn")
] + [
    T(f"dflash_{part}_conv_proj", f"blk.{{il}}.{part}_conv_proj.weight", lambda hp, x: (hp.n_embd, _projected(hp)))
    for part in ("attn", "ffn")
]


def load_tensors_dflash2_conv(hp) -> dict:
    """The conv tensors, only when the conv keys are set; the names are required then."""
    if not (hp.conv_kernel_size > 0 and hp.conv_group_size > 0):
        return {}
    return shapes_of(CONV_LAYER_TENSORS, hp)[0]


def n_seqs_unq(ubatch) -> int:
    """ubatch.n_seqs_unq: the distinct sequences of the batch, one draft block each."""
    return len(np.unique(ubatch.seq))


def build_dflash2_conv(g, hidden, dynamic, base, side: int):
    """Block-local causal conv with per-token dynamic taps added to the layer's base taps."""
    hparams = g.hparams
    hidden_size = G.ne(hidden, 0)
    n_tokens = G.ne(hidden, 1)
    n_blocks = n_seqs_unq(g.ubatch)
    kernel_size = hparams.conv_kernel_size
    group_size = hparams.conv_group_size
    n_groups = hidden_size // group_size

    if not (n_blocks > 0 and n_tokens % n_blocks == 0):
        raise ValueError("the DFlash2 conv needs equal-size blocks")
    if dynamic is None or base is None or not 0 <= side < 2:
        raise ValueError("the DFlash2 conv needs its projection, its base taps and a side of 0 or 1")

    block_size = n_tokens // n_blocks
    ctx0 = g.ctx0
    # ggml_cont would add a copy node even for a fitting layout, so it only runs where needed
    if not ggml_is_contiguous(hidden) or G.ne(hidden, 1) != n_tokens:
        hidden = ggml_cont_2d(ctx0, hidden, hidden_size, n_tokens)
    if not ggml_is_contiguous(dynamic) or G.ne(dynamic, 1) != n_tokens:
        dynamic = ggml_cont_2d(ctx0, dynamic, G.ne(dynamic, 0), n_tokens)
    blocks = ggml_reshape_3d(ctx0, hidden, hidden_size, block_size, n_blocks)
    coeffs = ggml_reshape_4d(ctx0, dynamic, n_groups, kernel_size, 2, n_tokens)
    coeffs_side = ggml_view_3d(ctx0, coeffs, n_groups, kernel_size, n_tokens,
                               G.nb(coeffs, 1), G.nb(coeffs, 3), side * G.nb(coeffs, 2))

    coeff_all = ggml_cont(ctx0, coeffs_side)
    coeff_all = ggml_reshape_4d(ctx0, coeff_all, 1, n_groups, kernel_size, n_tokens)
    coeff_all = ggml_repeat_4d(ctx0, coeff_all, group_size, n_groups, kernel_size, n_tokens)

    base_side = ggml_reshape_4d(ctx0,
                                ggml_view_1d(ctx0, base, hidden_size * kernel_size, side * G.nb(base, 2)),
                                group_size, n_groups, kernel_size, 1)

    weight_all = ggml_add(ctx0, coeff_all, base_side)

    # a tap that reaches back a whole block or more sees only zero padding, so it is dropped
    n_taps = min(kernel_size, block_size)

    result = None
    for tap in range(n_taps):
        values = blocks
        if tap > 0:
            previous = ggml_view_3d(ctx0, blocks, hidden_size, block_size - tap, n_blocks,
                                    G.nb(blocks, 1), G.nb(blocks, 2), 0)
            values = ggml_pad_ext(ctx0, previous, 0, 0, tap, 0, 0, 0, 0, 0)
        values = ggml_reshape_2d(ctx0, values, hidden_size, n_tokens)

        weight = ggml_reshape_2d(ctx0,
                                 ggml_cont(ctx0, ggml_view_4d(ctx0, weight_all, group_size, n_groups, 1, n_tokens,
                                                              G.nb(weight_all, 1), G.nb(weight_all, 2),
                                                              G.nb(weight_all, 3), tap * G.nb(weight_all, 2))),
                                 hidden_size, n_tokens)

        term = ggml_mul(ctx0, weight, values)
        result = ggml_add(ctx0, result, term) if result is not None else term
    return result
