"""src/models/deepseek4.cpp (and deepseek41.cpp): the DeepSeek-V4 pieces the DSpark backbones use.

Hyper-connections (mHC): the residual stream is hc parallel streams [n_embd, hc, T]. Each
sub-layer mixes them into its input (`hc_pre`), and writes its output back into every stream
(`hc_post`) through a Sinkhorn-normalised stream mix (`hc_comb`). Inside the layers these are
ggml's fused ops (DSV4_HC_PRE, DSV4_HC_COMB, DSV4_HC_POST), as upstream builds them by default;
the collapse before the output norm (`hc_head`, il = -1) keeps the plain chain of views, muls
and adds, as upstream does.

The attention is the uncompressed (ratio 0) sliding-window path: low-rank Q with a per-head
RMS norm, a single shared K (= V) row per token in a K-only cache, rope on the trailing n_rot
dims (rope_set_offset), attention sinks, de-rope of the output and a grouped low-rank output.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ops import ggml as G
from ..ops.cmath import inv_sqrtf
from ..ops.ggml import (ggml_add, ggml_cont_2d, ggml_dsv4_hc_comb, ggml_dsv4_hc_post, ggml_dsv4_hc_pre,
                        ggml_mul, ggml_mul_mat, ggml_permute, ggml_reshape_2d, ggml_reshape_3d, ggml_rms_norm,
                        ggml_rope_ext, ggml_rope_ext_back, ggml_rope_set_offset, ggml_scale, ggml_scale_bias,
                        ggml_sigmoid, ggml_view_1d, ggml_view_2d)


@dataclass
class HCMixes:
    """build_hc_mixes: the pre weights [hc, T], post weights [hc, T] and comb [hc, hc, T]."""
    pre: object
    post: object
    comb: object


@dataclass
class HCPre:
    """build_hc_pre (five-argument form): the mixed sub-layer input and the mixes for hc_post."""
    cur: object
    post: object
    comb: object


def _affine(ctx, x, scale, base):
    return ggml_add(ctx, ggml_mul(ctx, x, scale), base)


def _view_1d(ctx, t, n: int, off: int):
    return ggml_view_1d(ctx, t, n, off * G.nb(t, 0))


def _view_2d(ctx, t, n: int, nt: int, off: int):
    return ggml_view_2d(ctx, t, n, nt, G.nb(t, 1), off * G.nb(t, 0))


def build_hc_mixes(g, x, hc_fn, hc_scale, hc_base, il: int) -> HCMixes:
    """RMS-normed flat streams -> hc_fn -> pre (sigmoid + eps), post (2 sigmoid), comb (Sinkhorn)."""
    ctx, hp = g.ctx0, g.hparams
    hc = hp.hc_mult
    if hc != 4:
        raise ValueError("the DeepSeek-V4 hyper-connections need exactly 4 streams")
    nt = G.ne(x, 2)
    flat = ggml_reshape_2d(ctx, x, hc * g.n_embd, nt)
    flat_norm = ggml_rms_norm(ctx, flat, hp.f_norm_rms_eps)
    mixes = ggml_mul_mat(ctx, hc_fn, flat_norm)
    g.cb(mixes, "hc_mixes", il)

    scale_pre = _view_1d(ctx, hc_scale, 1, 0)
    scale_post = _view_1d(ctx, hc_scale, 1, 1)
    base_pre = _view_1d(ctx, hc_base, hc, 0)
    base_post = _view_1d(ctx, hc_base, hc, hc)

    pre = _affine(ctx, _view_2d(ctx, mixes, hc, nt, 0), scale_pre, base_pre)
    pre = ggml_sigmoid(ctx, pre)
    pre = ggml_scale_bias(ctx, pre, 1.0, hp.dsv4_hc_eps)
    g.cb(pre, "hc_pre", il)

    post = _affine(ctx, _view_2d(ctx, mixes, hc, nt, hc), scale_post, base_post)
    post = ggml_sigmoid(ctx, post)
    post = ggml_scale(ctx, post, 2.0)
    g.cb(post, "hc_post", il)

    # one fused node: the comb slice's affine map, then the Sinkhorn iterations
    comb = ggml_dsv4_hc_comb(ctx, mixes, hc_scale, hc_base, hp.dsv4_hc_eps, hp.dsv4_hc_sinkhorn_iters)
    g.cb(comb, "hc_comb", il)
    return HCMixes(pre, post, comb)


def build_hc_pre_weighted(g, x, weights, il: int):
    """build_hc_pre(x, weights, il): the weighted sum of the streams; one fused node inside the
    layers, the per-stream chain for the collapse (il < 0)."""
    ctx = g.ctx0
    if il >= 0:
        return ggml_dsv4_hc_pre(ctx, x, weights)
    nt = G.ne(x, 2)
    result = None
    for ih in range(G.ne(x, 1)):
        xh = ggml_view_2d(ctx, x, g.n_embd, nt, G.nb(x, 2), ih * G.nb(x, 1))
        wh = ggml_view_2d(ctx, weights, 1, nt, G.nb(weights, 1), ih * G.nb(weights, 0))
        cur = ggml_mul(ctx, xh, wh)
        result = ggml_add(ctx, result, cur) if result is not None else cur
    return result


def build_hc_pre(g, x, hc_fn, hc_scale, hc_base, il: int) -> HCPre:
    """build_hc_pre(x, fn, scale, base, il): the mixes, then the weighted sum with the pre weights."""
    mix = build_hc_mixes(g, x, hc_fn, hc_scale, hc_base, il)
    return HCPre(build_hc_pre_weighted(g, x, mix.pre, il), mix.post, mix.comb)


def build_hc_post(g, x, residual, post, comb, il: int):
    """build_hc_post: the sub-layer output written back into every stream (one fused node)."""
    return ggml_dsv4_hc_post(g.ctx0, x, residual, post, comb)


def build_hc_head(g, x, hc_fn, hc_scale, hc_base):
    """build_hc_head: collapse the streams before the output norm (never fused upstream)."""
    ctx, hp = g.ctx0, g.hparams
    nt = G.ne(x, 2)
    flat = ggml_reshape_2d(ctx, x, hp.hc_mult * g.n_embd, nt)
    flat_norm = ggml_rms_norm(ctx, flat, hp.f_norm_rms_eps)
    mixes = ggml_mul_mat(ctx, hc_fn, flat_norm)
    g.cb(mixes, "hc_head_mixes", -1)
    pre = _affine(ctx, mixes, hc_scale, hc_base)
    pre = ggml_sigmoid(ctx, pre)
    pre = ggml_scale_bias(ctx, pre, 1.0, hp.dsv4_hc_eps)
    g.cb(pre, "hc_head_pre", -1)
    return build_hc_pre_weighted(g, x, pre, -1)


def dsv4_rope(g, t, pos, back: bool = False):
    """Ratio-0 stages: plain rope at rope_theta on the trailing n_rot dims of each row (NORM
    mode, n_ctx_orig 0, no YaRN), i.e. ggml_rope_ext + ggml_rope_set_offset(n_embd_head - n_rot)."""
    hp = g.hparams
    n_rot = hp.n_rot
    fn = ggml_rope_ext_back if back else ggml_rope_ext
    t = fn(g.ctx0, t, pos, None, n_rot, g.rope_type, 0, g.freq_base, 1.0, 0.0, 1.0, 0.0, 0.0)
    return ggml_rope_set_offset(t, hp.n_embd_head_k - n_rot)


def build_attention(g, inp_attn, cur, inp_pos, il: int, q_norm: bool = True, name_qr: bool = True):
    """build_attention_impl for ratio-0 stages over the K-only sliding-window cache.

    DSV4.1 (the seed's inline attention) drops the "qr" name and the per-head q RMS norm.
    """
    ctx, hp = g.ctx0, g.hparams
    layer = g.model.layers[il]
    n_embd_head = hp.n_embd_head_k
    n_groups = hp.dsv4_o_group_count
    n_heads_group = g.n_head // n_groups
    o_lora_rank = hp.dsv4_o_lora_rank
    o_group_dim = n_heads_group * n_embd_head
    nt = G.ne(cur, 1)

    qr = g.build_lora_mm(layer.wq_a, cur)
    if name_qr:
        g.cb(qr, "qr", il)
    qr = g.build_norm(qr, layer.attn_q_a_norm, None, il)
    g.cb(qr, "qr_norm", il)

    q = g.build_lora_mm(layer.wq_b, qr)
    q = ggml_reshape_3d(ctx, q, n_embd_head, g.n_head, nt)
    if q_norm:
        q = ggml_rms_norm(ctx, q, hp.f_norm_rms_eps)
        g.cb(q, "q_norm", il)
    q = dsv4_rope(g, q, inp_pos)
    g.cb(q, "q", il)

    kv = g.build_lora_mm(layer.wkv, cur)
    kv = g.build_norm(kv, layer.attn_kv_norm, None, il)
    kv = ggml_reshape_3d(ctx, kv, n_embd_head, 1, nt)
    if name_qr:
        g.cb(kv, "kv_norm", il)
    kv = dsv4_rope(g, kv, inp_pos)
    g.cb(kv, "kv", il)

    out = g.build_attn_k(inp_attn, None, None, None, q, kv, kv, layer.attn_sinks,
                         inv_sqrtf(n_embd_head), il)
    g.cb(out, "attn_raw", il)

    out = ggml_reshape_3d(ctx, out, n_embd_head, g.n_head, nt)
    out = dsv4_rope(g, out, inp_pos, back=True)
    g.cb(out, "attn_derope", il)

    out = ggml_reshape_3d(ctx, out, o_group_dim, n_groups, nt)
    out = ggml_permute(ctx, out, 0, 2, 1, 3)
    oa = ggml_mul_mat(ctx, layer.wo_a, out)
    g.cb(oa, "attn_wo_a", il)
    oa = ggml_permute(ctx, oa, 0, 2, 1, 3)
    oa = ggml_cont_2d(ctx, oa, o_lora_rank * n_groups, nt)

    out = g.build_lora_mm(layer.wo_b, oa)
    g.cb(out, "attn_out", il)
    return out
