"""Ops llama.cpp's ggml has and ggml 0.15.3 lacks, built from the ops it has.

Each function stands for one upstream op (named in its docstring) and gives the same values with
the fewest nodes. A fused upstream node reads its sources depth-first and then computes; each
emulation first expands those sources in the same order, so the unfused chain that replaces the
node is one contiguous run in the graph. graph-diff pairs the run with the upstream node through a
named equivalence rule (graphgen/rules/dsv4.json).
"""

from __future__ import annotations

import math

from . import ggml as G
from .ggml import (ggml_add, ggml_build_forward_expand, ggml_clamp, ggml_concat, ggml_cont, ggml_div,
                   ggml_fill, ggml_mul, ggml_new_tensor_1d, ggml_permute, ggml_reshape_3d, ggml_rope_ext,
                   ggml_rope_ext_back, ggml_soft_max, ggml_sum_rows, ggml_swiglu_split, ggml_view_1d,
                   ggml_view_2d, ggml_view_4d)


def _expand(gf, *srcs):
    """Visit a fused op's sources in its order, so the chain standing for it stays contiguous."""
    for s in srcs:
        if s is not None:
            ggml_build_forward_expand(gf, s)


def _offset_views(ctx, t, n_offs: int):
    """[0, n_offs) and [n_offs, ne0) of every row of t, sharing t's strides."""
    ne = [G.ne(t, i) for i in range(4)]
    nb = [G.nb(t, i) for i in range(4)]
    head = ggml_view_4d(ctx, t, n_offs, ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], 0)
    tail = ggml_view_4d(ctx, t, ne[0] - n_offs, ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], n_offs * nb[0])
    return head, tail


def rope_ext_offset(ctx, a, pos, freqs, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                    attn_factor, beta_fast, beta_slow, n_offs: int, back: bool = False):
    """ggml_rope_ext (or ggml_rope_ext_back) followed by upstream's ggml_rope_set_offset(t, n_offs).

    Upstream rotates dims [n_offs, n_offs + n_dims) of each row and copies the others (op param
    slot 15). Here: the rope runs on a view of the rotated part with the same n_dims, so theta and
    the YaRN corrections are the same, and the untouched head is concatenated back in front:
    VIEW, VIEW, ROPE (or ROPE_BACK), CONCAT; the caller's cb name lands on the CONCAT.
    """
    if n_offs == 0:
        fn = ggml_rope_ext_back if back else ggml_rope_ext
        return fn(ctx, a, pos, freqs, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                  attn_factor, beta_fast, beta_slow)
    if G.ne(a, 0) != n_offs + n_dims:
        raise ValueError(f"rope_set_offset: rows of {G.ne(a, 0)} do not split into {n_offs} + {n_dims}")
    head, tail = _offset_views(ctx, a, n_offs)
    fn = ggml_rope_ext_back if back else ggml_rope_ext
    tail = fn(ctx, tail, pos, freqs, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
              attn_factor, beta_fast, beta_slow)
    return ggml_concat(ctx, head, tail, 0)


def swiglu_clamp(ctx, gf, gate, up, limit: float):
    """ggml_swiglu_clamp(gate, up, limit) = silu(min(gate, limit)) * clamp(up, -limit, limit).

    CLAMP, CLAMP, SWIGLU (swiglu_split) after the sources are expanded in the fused op's order.
    """
    _expand(gf, gate, up)
    g = ggml_clamp(ctx, gate, -math.inf, limit)
    u = ggml_clamp(ctx, up, -limit, limit)
    return ggml_swiglu_split(ctx, g, u)


def dsv4_hc_pre(ctx, gf, x, weights, n_embd: int):
    """ggml_dsv4_hc_pre(x, weights): sum over the hc streams of x[:, h, t] * weights[h, t].

    Upstream's own unfused form (llama_model_deepseek4::graph::build_hc_pre with il < 0).
    """
    _expand(gf, x, weights)
    return dsv4_hc_pre_unfused(ctx, x, weights, n_embd)


def dsv4_hc_pre_unfused(ctx, x, weights, n_embd: int):
    hc, nt = G.ne(x, 1), G.ne(x, 2)
    result = None
    for ih in range(hc):
        xh = ggml_view_2d(ctx, x, n_embd, nt, G.nb(x, 2), ih * G.nb(x, 1))
        wh = ggml_view_2d(ctx, weights, 1, nt, G.nb(weights, 1), ih * G.nb(weights, 0))
        cur = ggml_mul(ctx, xh, wh)
        result = ggml_add(ctx, result, cur) if result is not None else cur
    return result


def dsv4_hc_comb(ctx, mixes, scale, base, eps: float, n_iter: int, hc: int):
    """ggml_dsv4_hc_comb(mixes, scale, base, eps, n_iter): the comb mix, affine, then Sinkhorn.

    Upstream's unfused form: view mixes [2hc, 2hc + hc*hc) * scale[2] + base[2hc, ...), reshaped to
    [hc, hc, T], then build_hc_sinkhorn.
    """
    # Not expanded here: the comb is first read by hc_post, after the post weights, which already
    # visit mixes (scale and base are weights), so the chain is contiguous where the fused node sat.
    # Expanding mixes now would pull it ahead of the sub-layer on DSV4.1, where the attention mix
    # is built before the stage's input.
    nt = G.ne(mixes, 1)
    scale_comb = ggml_view_1d(ctx, scale, 1, 2 * G.nb(scale, 0))
    base_comb = ggml_view_1d(ctx, base, hc * hc, 2 * hc * G.nb(base, 0))
    comb = ggml_view_2d(ctx, mixes, hc * hc, nt, G.nb(mixes, 1), 2 * hc * G.nb(mixes, 0))
    comb = ggml_add(ctx, ggml_mul(ctx, comb, scale_comb), base_comb)
    comb = ggml_reshape_3d(ctx, comb, hc, hc, nt)
    return sinkhorn(ctx, comb, eps, n_iter)


def sinkhorn(ctx, comb, eps: float, n_iter: int):
    """build_hc_sinkhorn: comb is [dst, src, T]; softmax over dst, one column pass, then
    (n_iter - 1) x (row pass, column pass), every sum offset by eps."""
    comb = ggml_soft_max(ctx, comb)
    e = ggml_fill(ctx, ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 1), eps)
    comb = ggml_add(ctx, comb, e)

    def norm_cols(comb):
        comb_src_dst = ggml_cont(ctx, ggml_permute(ctx, comb, 1, 0, 2, 3))
        col_sum = ggml_add(ctx, ggml_sum_rows(ctx, comb_src_dst), e)
        col_sum = ggml_permute(ctx, col_sum, 1, 0, 2, 3)
        return ggml_div(ctx, comb, col_sum)

    def norm_rows(comb):
        row_sum = ggml_add(ctx, ggml_sum_rows(ctx, comb), e)
        return ggml_div(ctx, comb, row_sum)

    comb = norm_cols(comb)
    for _ in range(1, n_iter):
        comb = norm_rows(comb)
        comb = norm_cols(comb)
    return comb


def dsv4_hc_post(ctx, gf, x, residual, post, comb, n_embd: int):
    """ggml_dsv4_hc_post(x, residual, post, comb): stream dst = x * post[dst] +
    sum_src residual[src] * comb[dst, src], the streams concatenated on dim 1.

    Upstream's unfused form of build_hc_post.
    """
    _expand(gf, x, residual, post, comb)
    hc, nt = G.ne(residual, 1), G.ne(x, 1)
    out = None
    for dst in range(hc):
        post_dst = ggml_view_2d(ctx, post, 1, nt, G.nb(post, 1), dst * G.nb(post, 0))
        cur = ggml_mul(ctx, x, post_dst)
        for src in range(hc):
            res_src = ggml_view_2d(ctx, residual, n_embd, nt, G.nb(residual, 2), src * G.nb(residual, 1))
            comb_sd = ggml_view_2d(ctx, comb, 1, nt, G.nb(comb, 2), dst * G.nb(comb, 0) + src * G.nb(comb, 1))
            cur = ggml_add(ctx, cur, ggml_mul(ctx, res_src, comb_sd))
        cur = ggml_reshape_3d(ctx, cur, n_embd, 1, nt)
        out = ggml_concat(ctx, out, cur, 1) if out is not None else cur
    return out


__all__ = ["rope_ext_offset", "swiglu_clamp", "dsv4_hc_pre", "dsv4_hc_pre_unfused", "dsv4_hc_comb",
           "sinkhorn", "dsv4_hc_post"]
