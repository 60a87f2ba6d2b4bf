"""src/models/lilicorr.cpp: LiliCorr = DFlash + a correlation scorer over the block's top-k candidates.

The scorer runs a small transformer over the (slot, candidate) nodes of each block and packs the
candidates and their anchor/transition scores into h_nextn for the CPU-side lattice walk. The
injection graph exposes the fused context features as h_nextn; the driver feeds the anchor's row
back as the block's embd_state.

The head's loader sits here as in the seed: load_hparams_lilicorr (its keys carry no arch
prefix) and load_tensors_lilicorr, which also takes the DFlash2 conv tensors when their keys are set.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np

from ..errors import GGUFModelError
from ..graph import GraphParams
from ..ops import ggml as G
from ..ops.cmath import inv_sqrtf
from ..ops.ggml import (ggml_add, ggml_arange, ggml_argsort, ggml_build_forward_expand, ggml_cast, ggml_concat,
                        ggml_cont, ggml_cont_2d, ggml_get_rows, ggml_l2_norm, ggml_log, ggml_mul, ggml_mul_mat,
                        ggml_new_tensor_2d, ggml_norm, ggml_out_prod, ggml_pad, ggml_pad_ext, ggml_permute,
                        ggml_repeat, ggml_repeat_4d, ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d,
                        ggml_reshape_4d, ggml_rms_norm, ggml_scale, ggml_scale_bias, ggml_set_input, ggml_silu,
                        ggml_soft_max, ggml_soft_max_ext, ggml_step, ggml_sub, ggml_top_k, ggml_transpose,
                        ggml_view_3d, ggml_view_4d)
from .conv import load_tensors_dflash2_conv, n_seqs_unq
from .dflash import GraphBase, get_tok_embd
from .head import Head
from .tensors import T, bind, shapes_of


# --- loader ------------------------------------------------------------------------------------

def _hidden(hp):
    return hp.lilicorr_hidden_size


def _slots(hp):
    return hp.block_size - 1


# the scorer's projections, embeddings and heads (a scorer as wide as the draft may do without
# the token projection)
LILICORR_TENSORS = [
    T("lilicorr_token_proj", "lilicorr.token_proj.weight", lambda hp, x: (hp.n_embd, _hidden(hp)),
      required=lambda hp: _hidden(hp) != hp.n_embd),
    T("lilicorr_token_proj_b", "lilicorr.token_proj.bias", lambda hp, x: (_hidden(hp),),
      required=lambda hp: _hidden(hp) != hp.n_embd),
    T("lilicorr_token_proj_s", "lilicorr.token_proj.scale", lambda hp, x: (1,), required=False),
    T("lilicorr_pass_hidden_proj", "lilicorr.pass_hidden_proj.weight", lambda hp, x: (hp.n_embd, _hidden(hp))),
    T("lilicorr_pass_hidden_proj_b", "lilicorr.pass_hidden_proj.bias", lambda hp, x: (_hidden(hp),)),
    T("lilicorr_pass_hidden_proj_s", "lilicorr.pass_hidden_proj.scale", lambda hp, x: (1,), required=False),
    T("lilicorr_slot_embedding", "lilicorr.slot_embedding.weight", lambda hp, x: (_hidden(hp), _slots(hp))),
    T("lilicorr_rank_embedding", "lilicorr.rank_embedding.weight",
      lambda hp, x: (_hidden(hp), hp.lilicorr_candidate_topk)),
    T("lilicorr_attention_bias", "lilicorr.attention_bias.bias",
      lambda hp, x: (_slots(hp) * hp.lilicorr_candidate_topk, _slots(hp) * hp.lilicorr_candidate_topk,
                     hp.lilicorr_num_heads)),
    T("lilicorr_context_proj", "lilicorr.context_proj.weight", lambda hp, x: (hp.n_embd, _hidden(hp))),
    T("lilicorr_context_proj_b", "lilicorr.context_proj.bias", lambda hp, x: (_hidden(hp),)),
    T("lilicorr_context_proj_s", "lilicorr.context_proj.scale", lambda hp, x: (1,), required=False),
    T("lilicorr_output_norm", "lilicorr.output_norm.weight", lambda hp, x: (_hidden(hp),)),
    T("lilicorr_anchor_norm", "lilicorr.anchor_norm.weight", lambda hp, x: (_hidden(hp),)),
    T("lilicorr_factor_input_proj", "lilicorr.factor_input_proj.weight", lambda hp, x: (3 * _hidden(hp), _hidden(hp))),
    T("lilicorr_factor_input_proj_b", "lilicorr.factor_input_proj.bias", lambda hp, x: (_hidden(hp),)),
] + [t for head in ("out_head", "in_head", "anchor_out_head") for t in (
    T(f"lilicorr_{head}", f"lilicorr.{head}.weight", lambda hp, x: (_hidden(hp), hp.lilicorr_factor_dim)),
    T(f"lilicorr_{head}_b", f"lilicorr.{head}.bias", lambda hp, x: (hp.lilicorr_factor_dim,)))]
# per scorer layer i, on block id n_layer + i; the in-projection is named by i itself
LILICORR_LAYER_TENSORS = [
    T("lilicorr_attn_norm", "blk.{bid}.attn_norm.weight", lambda hp, x: (_hidden(hp),)),
    T("lilicorr_mlp_norm", "blk.{bid}.ffn_norm.weight", lambda hp, x: (_hidden(hp),)),
    T("lilicorr_attn_in_proj", "lilicorr.layers.{i}.attn.in_proj.weight", lambda hp, x: (_hidden(hp), 3 * _hidden(hp))),
    T("lilicorr_attn_in_proj_b", "lilicorr.layers.{i}.attn.in_proj.bias", lambda hp, x: (3 * _hidden(hp),)),
    T("lilicorr_attn_out_proj", "blk.{bid}.attn_output.weight", lambda hp, x: (_hidden(hp), _hidden(hp))),
    T("lilicorr_attn_out_proj_b", "blk.{bid}.attn_output.bias", lambda hp, x: (_hidden(hp),)),
    T("lilicorr_attn_out_proj_s", "blk.{bid}.attn_output.scale", lambda hp, x: (1,), required=False),
    T("lilicorr_mlp_0", "blk.{bid}.ffn_up.weight", lambda hp, x: (_hidden(hp), hp.lilicorr_mlp_hidden_size)),
    T("lilicorr_mlp_0_b", "blk.{bid}.ffn_up.bias", lambda hp, x: (hp.lilicorr_mlp_hidden_size,)),
    T("lilicorr_mlp_0_s", "blk.{bid}.ffn_up.scale", lambda hp, x: (1,), required=False),
    T("lilicorr_mlp_2", "blk.{bid}.ffn_down.weight", lambda hp, x: (hp.lilicorr_mlp_hidden_size, _hidden(hp))),
    T("lilicorr_mlp_2_b", "blk.{bid}.ffn_down.bias", lambda hp, x: (_hidden(hp),)),
    T("lilicorr_mlp_2_s", "blk.{bid}.ffn_down.scale", lambda hp, x: (1,), required=False),
]
# the 5 per-candidate scalar features, on the block id after the scorer's layers
LILICORR_FEATURE_TENSORS = [
    T("lilicorr_feature_norm", "blk.{fb}.ffn_norm.weight", lambda hp, x: (5,)),
    T("lilicorr_feature_norm_b", "blk.{fb}.ffn_norm.bias", lambda hp, x: (5,)),
    T("lilicorr_feature_mlp_1", "blk.{fb}.ffn_up.weight", lambda hp, x: (5, _hidden(hp))),
    T("lilicorr_feature_mlp_1_b", "blk.{fb}.ffn_up.bias", lambda hp, x: (_hidden(hp),)),
    T("lilicorr_feature_mlp_3", "blk.{fb}.ffn_down.weight", lambda hp, x: (_hidden(hp), _hidden(hp))),
    T("lilicorr_feature_mlp_3_b", "blk.{fb}.ffn_down.bias", lambda hp, x: (_hidden(hp),)),
]


@dataclass
class LiliCorrHParams:
    """The scorer's dimensions (lilicorr.* keys)."""
    lilicorr_hidden_size: int = 0
    lilicorr_candidate_topk: int = 0
    lilicorr_num_heads: int = 0
    lilicorr_layers: int = 0
    lilicorr_vector_eps: float = 0.0
    lilicorr_logit_scale: float = 0.0
    lilicorr_factor_dim: int = 0
    lilicorr_mlp_hidden_size: int = 0


def load_hparams_lilicorr(m, hp, path) -> None:
    """load_hparams_lilicorr + the head dimensions of load_tensors_lilicorr (keys carry no arch prefix)."""
    hp.lilicorr_hidden_size = m.get("lilicorr.hidden_size", 0, kind="int")
    hp.lilicorr_candidate_topk = m.get("lilicorr.candidate_topk", required=True, kind="int")
    hp.lilicorr_num_heads = m.get("lilicorr.num_heads", required=True, kind="int")
    hp.lilicorr_layers = m.get("lilicorr.num_layers", required=True, kind="int")
    hp.lilicorr_vector_eps = m.get("lilicorr.vector_eps", required=True, kind="float")
    if not (math.isfinite(hp.lilicorr_vector_eps) and hp.lilicorr_vector_eps >= 0.0):
        # ggml's l2_norm asserts eps >= 0
        raise GGUFModelError(f"{path}: key 'lilicorr.vector_eps' = {hp.lilicorr_vector_eps} must be a finite number >= 0")
    hp.lilicorr_logit_scale = m.get("lilicorr.logit_scale", required=True, kind="float")
    hp.lilicorr_factor_dim = m.get("lilicorr.factor_dim", required=True, kind="int")
    hp.lilicorr_mlp_hidden_size = m.get("lilicorr.mlp_hidden_size", required=True, kind="int")
    top_k = hp.lilicorr_candidate_topk
    if (hp.block_size < 2 or hp.lilicorr_hidden_size <= 0 or hp.lilicorr_num_heads <= 0
            or hp.lilicorr_hidden_size % hp.lilicorr_num_heads or top_k <= 0 or hp.lilicorr_layers <= 0
            or hp.selector_top_k > 0 or top_k * (top_k + 1) > hp.n_embd):
        raise GGUFModelError(f"{path}: invalid LiLiCorr DFlash metadata (keys 'dflash.block_size', "
                             "'lilicorr.hidden_size', 'lilicorr.num_heads', 'lilicorr.candidate_topk', "
                             "'lilicorr.num_layers', 'dflash.selector_top_k')")
    if hp.lilicorr_factor_dim <= 0 or hp.lilicorr_mlp_hidden_size <= 0 or hp.lilicorr_layers > hp.n_layer:
        raise GGUFModelError(f"{path}: invalid LiLiCorr head dimensions (keys 'lilicorr.factor_dim', "
                             "'lilicorr.mlp_hidden_size', 'lilicorr.num_layers')")


def load_tensors_lilicorr(hp) -> tuple[dict, list]:
    """load_tensors_lilicorr: the scorer's projections, embeddings and heads, its transformer
    layers (block ids n_layer..), the feature MLP (the block id after them), and the conv tensors."""
    fb = hp.n_layer + hp.lilicorr_layers
    shapes, required = shapes_of(LILICORR_TENSORS, hp)
    parts = [shapes_of(LILICORR_FEATURE_TENSORS, hp, layers=[], fb=fb)]
    parts += [shapes_of(LILICORR_LAYER_TENSORS, hp, layers=[], bid=hp.n_layer + i, i=i)
              for i in range(hp.lilicorr_layers)]
    for part_shapes, part_required in parts:
        shapes.update(part_shapes)
        required += part_required
    conv = load_tensors_dflash2_conv(hp)
    shapes.update(conv)
    return shapes, required + list(conv)


def build_lilicorr_scores(g, model, tok_embd, anchors):
    ctx0 = g.ctx0
    res = g.res

    hparams = g.hparams
    n_tokens = g.n_tokens
    n_embd = g.n_embd

    hidden = hparams.lilicorr_hidden_size
    top_k = hparams.lilicorr_candidate_topk
    heads = hparams.lilicorr_num_heads
    n_blocks = n_seqs_unq(g.ubatch)
    if not (n_blocks > 0 and n_tokens % n_blocks == 0):
        raise ValueError("the LiliCorr scorer needs equal-size blocks")
    if G.ne(res.t_logits, 1) != n_tokens:
        raise ValueError("the LiliCorr scorer needs logits for every token")
    if anchors is None or tok_embd is None:
        raise ValueError("the LiliCorr scorer needs the anchors and the token embeddings")

    tokens_per_block = n_tokens // n_blocks
    block_size = hparams.block_size
    row_used = top_k + top_k * top_k
    slots = block_size - 1
    nodes = slots * top_k
    factor_dim = G.ne(model.lilicorr_out_head, 1)
    if tokens_per_block != block_size:
        raise ValueError("the LiliCorr scorer needs full blocks")

    candidates = ggml_top_k(ctx0, res.t_logits, top_k)
    logits_rows = ggml_reshape_3d(ctx0, res.t_logits, 1, G.ne(res.t_logits, 0), n_tokens)
    candidate_logits = ggml_reshape_2d(ctx0, ggml_get_rows(ctx0, logits_rows, candidates), top_k, n_tokens)
    # the rank embedding and features assume the candidates are sorted, best logit first
    order = ggml_argsort(ctx0, candidate_logits, G.GGML_SORT_ORDER_DESC)
    candidate_rows = ggml_reshape_3d(ctx0, candidates, 1, top_k, n_tokens)
    candidates = ggml_reshape_2d(ctx0, ggml_get_rows(ctx0, candidate_rows, order), top_k, n_tokens)
    prob_rows = ggml_reshape_3d(ctx0, ggml_soft_max(ctx0, res.t_logits), 1, G.ne(res.t_logits, 0), n_tokens)
    probs = ggml_reshape_2d(ctx0, ggml_get_rows(ctx0, prob_rows, candidates), top_k, n_tokens)

    cand_run = ggml_reshape_3d(ctx0, candidates, top_k, n_tokens // n_blocks, n_blocks)
    probs_run = ggml_reshape_3d(ctx0, probs, top_k, n_tokens // n_blocks, n_blocks)
    cand_run = ggml_cont(ctx0, ggml_view_3d(ctx0, cand_run, top_k, slots, n_blocks,
                                            G.nb(cand_run, 1), G.nb(cand_run, 2), G.nb(cand_run, 1)))
    probs_run = ggml_cont(ctx0, ggml_view_3d(ctx0, probs_run, top_k, slots, n_blocks,
                                             G.nb(probs_run, 1), G.nb(probs_run, 2), G.nb(probs_run, 1)))

    lp = ggml_log(ctx0, probs_run)
    lp_blk = ggml_reshape_3d(ctx0, lp, top_k, slots, n_blocks)
    top_lp = ggml_view_3d(ctx0, lp_blk, 1, slots, n_blocks, G.nb(lp_blk, 1), G.nb(lp_blk, 2), 0)
    relative = ggml_sub(ctx0, lp_blk, top_lp)
    feature = ggml_reshape_4d(ctx0, lp_blk, 1, top_k, slots, n_blocks)

    rank = ggml_arange(ctx0, 0, top_k, 1)
    rank = ggml_repeat(ctx0, ggml_reshape_3d(ctx0, rank, top_k, 1, 1), lp_blk)
    first = ggml_scale_bias(ctx0, ggml_step(ctx0, rank), -1.0, 1.0)

    # the scale is a float division in C
    rank_scale = 0.0 if top_k == 1 else float(np.float32(1.0) / np.float32(top_k - 1))
    for item in (probs_run, relative, ggml_scale(ctx0, rank, rank_scale), first):
        feature = ggml_concat(ctx0, feature, ggml_reshape_4d(ctx0, item, 1, top_k, slots, n_blocks), 0)
    feature = ggml_reshape_2d(ctx0, feature, 5, nodes * n_blocks)

    embeds = ggml_get_rows(ctx0, tok_embd, ggml_reshape_1d(ctx0, cand_run, nodes * n_blocks))
    token_states = embeds if n_embd == hidden else ggml_add(
        ctx0, g.build_lora_mm(model.lilicorr_token_proj, embeds, model.lilicorr_token_proj_s),
        model.lilicorr_token_proj_b)

    pass_blk = ggml_reshape_3d(ctx0, res.t_embd, n_embd, block_size, n_blocks)
    passes = ggml_reshape_2d(ctx0, ggml_cont(ctx0, ggml_view_3d(ctx0, pass_blk, n_embd, slots, n_blocks,
                                                                G.nb(pass_blk, 1), G.nb(pass_blk, 2),
                                                                G.nb(pass_blk, 1))),
                             n_embd, slots * n_blocks)

    pass_states = ggml_add(ctx0, g.build_lora_mm(model.lilicorr_pass_hidden_proj, passes,
                                                 model.lilicorr_pass_hidden_proj_s),
                           model.lilicorr_pass_hidden_proj_b)

    pass_states = ggml_reshape_4d(ctx0, pass_states, hidden, 1, slots, n_blocks)
    pass_states = ggml_reshape_2d(ctx0, ggml_repeat_4d(ctx0, pass_states, hidden, top_k, slots, n_blocks),
                                  hidden, nodes * n_blocks)

    feature_states = ggml_norm(ctx0, feature, 1.0e-5)
    feature_states = ggml_add(ctx0, ggml_mul(ctx0, feature_states, model.lilicorr_feature_norm),
                              model.lilicorr_feature_norm_b)
    feature_states = ggml_silu(ctx0, ggml_add(ctx0, g.build_lora_mm(model.lilicorr_feature_mlp_1, feature_states),
                                              model.lilicorr_feature_mlp_1_b))
    feature_states = ggml_add(ctx0, g.build_lora_mm(model.lilicorr_feature_mlp_3, feature_states),
                              model.lilicorr_feature_mlp_3_b)

    slot = ggml_reshape_4d(ctx0, model.lilicorr_slot_embedding, hidden, 1, slots, 1)
    rank_embd = ggml_reshape_4d(ctx0, model.lilicorr_rank_embedding, hidden, top_k, 1, 1)
    pos = ggml_add(ctx0, ggml_repeat_4d(ctx0, slot, hidden, top_k, slots, n_blocks),
                   ggml_repeat_4d(ctx0, rank_embd, hidden, top_k, slots, n_blocks))
    pos = ggml_reshape_2d(ctx0, pos, hidden, nodes * n_blocks)

    x = ggml_add(ctx0, ggml_add(ctx0, token_states, pass_states), feature_states)
    x = ggml_add(ctx0, x, pos)
    anchor_blk = ggml_reshape_3d(ctx0, anchors, n_embd, block_size, n_blocks)
    anchor = ggml_reshape_2d(ctx0,
                             ggml_cont(ctx0, ggml_view_3d(ctx0, anchor_blk, n_embd, 1, n_blocks,
                                                          G.nb(anchor_blk, 1), G.nb(anchor_blk, 2), 0)),
                             n_embd, n_blocks)
    anchor_state = ggml_add(ctx0, g.build_lora_mm(model.lilicorr_context_proj, anchor, model.lilicorr_context_proj_s),
                            model.lilicorr_context_proj_b)

    head_dim = hidden // heads
    # 1.0f / std::sqrt(float(head_dim)), in float
    kq_scale = inv_sqrtf(head_dim)
    for layer in range(hparams.lilicorr_layers):
        weights = model.layers[layer]
        attn_input = ggml_mul(ctx0, ggml_rms_norm(ctx0, x, hparams.f_norm_rms_eps), weights.lilicorr_attn_norm)
        qkv = ggml_add(ctx0, g.build_lora_mm(weights.lilicorr_attn_in_proj, attn_input),
                       weights.lilicorr_attn_in_proj_b)
        qkv = ggml_reshape_3d(ctx0, qkv, 3 * hidden, nodes, n_blocks)
        q = ggml_cont(ctx0, ggml_view_4d(ctx0, qkv, head_dim, nodes, heads, n_blocks,
                                         G.nb(qkv, 1), head_dim * G.nb(qkv, 0), G.nb(qkv, 2), 0))
        k = ggml_cont(ctx0, ggml_view_4d(ctx0, qkv, head_dim, nodes, heads, n_blocks,
                                         G.nb(qkv, 1), head_dim * G.nb(qkv, 0), G.nb(qkv, 2), hidden * G.nb(qkv, 0)))
        v = ggml_view_4d(ctx0, qkv, head_dim, nodes, heads, n_blocks,
                         G.nb(qkv, 1), head_dim * G.nb(qkv, 0), G.nb(qkv, 2), 2 * hidden * G.nb(qkv, 0))
        attn = ggml_soft_max_ext(ctx0, ggml_mul_mat(ctx0, k, q), model.lilicorr_attention_bias, kq_scale, 0.0)
        joined = ggml_out_prod(ctx0, v, ggml_transpose(ctx0, attn))
        joined = ggml_permute(ctx0, joined, 0, 2, 1, 3)
        attn_output = ggml_cont_2d(ctx0, joined, hidden, nodes * n_blocks)
        attn_output = ggml_add(ctx0, g.build_lora_mm(weights.lilicorr_attn_out_proj, attn_output,
                                                     weights.lilicorr_attn_out_proj_s),
                               weights.lilicorr_attn_out_proj_b)
        x = ggml_add(ctx0, x, attn_output)
        mlp = ggml_mul(ctx0, ggml_rms_norm(ctx0, x, hparams.f_norm_rms_eps), weights.lilicorr_mlp_norm)
        mlp = ggml_silu(ctx0, ggml_add(ctx0, g.build_lora_mm(weights.lilicorr_mlp_0, mlp, weights.lilicorr_mlp_0_s),
                                       weights.lilicorr_mlp_0_b))
        mlp = ggml_add(ctx0, g.build_lora_mm(weights.lilicorr_mlp_2, mlp, weights.lilicorr_mlp_2_s),
                       weights.lilicorr_mlp_2_b)
        x = ggml_add(ctx0, x, mlp)

    x = ggml_mul(ctx0, ggml_rms_norm(ctx0, x, hparams.f_norm_rms_eps), model.lilicorr_output_norm)
    anchor_state = ggml_mul(ctx0, ggml_rms_norm(ctx0, anchor_state, hparams.f_norm_rms_eps), model.lilicorr_anchor_norm)
    anchor_nodes = ggml_reshape_3d(ctx0, anchor_state, hidden, 1, n_blocks)
    anchor_nodes = ggml_reshape_2d(ctx0, ggml_repeat_4d(ctx0, anchor_nodes, hidden, nodes, n_blocks, 1),
                                   hidden, nodes * n_blocks)
    factor_in = ggml_concat(ctx0, x, anchor_nodes, 0)
    factor_in = ggml_concat(ctx0, factor_in, ggml_mul(ctx0, x, anchor_nodes), 0)
    factors = ggml_add(ctx0, g.build_lora_mm(model.lilicorr_factor_input_proj, factor_in),
                       model.lilicorr_factor_input_proj_b)
    factors = ggml_silu(ctx0, factors)

    out = ggml_add(ctx0, g.build_lora_mm(model.lilicorr_out_head, factors), model.lilicorr_out_head_b)
    out = ggml_reshape_4d(ctx0, ggml_l2_norm(ctx0, out, hparams.lilicorr_vector_eps), factor_dim, top_k, slots, n_blocks)

    in_ = ggml_add(ctx0, g.build_lora_mm(model.lilicorr_in_head, factors), model.lilicorr_in_head_b)
    in_ = ggml_reshape_4d(ctx0, ggml_l2_norm(ctx0, in_, hparams.lilicorr_vector_eps), factor_dim, top_k, slots, n_blocks)

    anchor_out = ggml_add(ctx0, g.build_lora_mm(model.lilicorr_anchor_out_head, anchor_state),
                          model.lilicorr_anchor_out_head_b)
    anchor_out = ggml_l2_norm(ctx0, anchor_out, hparams.lilicorr_vector_eps)
    anchor_out = ggml_reshape_3d(ctx0, anchor_out, factor_dim, 1, n_blocks)

    first_in = ggml_cont(ctx0, ggml_view_4d(ctx0, in_, factor_dim, top_k, 1, n_blocks,
                                            G.nb(in_, 1), G.nb(in_, 2), G.nb(in_, 3), 0))
    first_score = ggml_scale(ctx0,
                             ggml_mul_mat(ctx0, first_in, ggml_reshape_4d(ctx0, anchor_out, factor_dim, 1, 1, n_blocks)),
                             hparams.lilicorr_logit_scale)
    scores = ggml_pad(ctx0, ggml_reshape_3d(ctx0, first_score, top_k, 1, n_blocks), top_k * top_k - top_k, 0, 0, 0)
    if slots > 1:
        next_ = ggml_cont(ctx0, ggml_view_4d(ctx0, in_, factor_dim, top_k, slots - 1, n_blocks,
                                             G.nb(in_, 1), G.nb(in_, 2), G.nb(in_, 3), G.nb(in_, 2)))
        previous = ggml_cont(ctx0, ggml_view_4d(ctx0, out, factor_dim, top_k, slots - 1, n_blocks,
                                                G.nb(out, 1), G.nb(out, 2), G.nb(out, 3), 0))
        score = ggml_scale(ctx0, ggml_mul_mat(ctx0, next_, previous), hparams.lilicorr_logit_scale)
        scores = ggml_concat(ctx0, scores, ggml_reshape_3d(ctx0, score, top_k * top_k, slots - 1, n_blocks), 1)

    row = ggml_concat(ctx0, ggml_cast(ctx0, ggml_reshape_3d(ctx0, cand_run, top_k, slots, n_blocks), G.GGML_TYPE_F32),
                      scores, 0)
    packed = ggml_pad_ext(ctx0, row, 0, n_embd - row_used, 1, 0, 0, 0, 0, 0)
    packed = ggml_reshape_2d(ctx0, packed, n_embd, n_tokens)
    g.cb(packed, "lilicorr_lattice", -1)
    res.t_h_nextn = packed
    ggml_build_forward_expand(g.gf, packed)


class GraphLiliCorr(GraphBase):
    """graph_lilicorr: the DFlash backbone and lm head, then the scorer on full blocks."""

    def __init__(self, params: GraphParams):
        super().__init__(params)
        ub = self.ubatch
        if ub.is_embd:
            # expose the context features for retrieval by LiliCorr
            self.res.t_h_nextn = self.build_inject()
            return

        # the scorer needs one complete block per sequence; anything else is a plain DFlash batch
        is_block = ub.embd_state is not None and self.n_tokens == self.hparams.block_size * n_seqs_unq(ub)

        inp_anchor = None
        if is_block:
            inp_tokens = self.inp_tokens
            self.add_input(inp_tokens, lambda p: p.ubatch.tokens)

            # the embd_state rows (context features) reach the scorer through inp_anchor
            inp_anchor = ggml_new_tensor_2d(self.ctx0, G.GGML_TYPE_F32, self.n_embd, self.n_tokens)
            ggml_set_input(inp_anchor)
            self.add_input(inp_anchor, lambda p: p.ubatch.embd_state)
        else:
            inp_tokens = self.build_inp_tokens()

        cur = self.build_layers(inp_tokens)

        cur = self.build_logits(cur)

        if is_block:
            build_lilicorr_scores(self, self.model, get_tok_embd(self, self.model), inp_anchor)
        else:
            ggml_build_forward_expand(self.gf, cur)


def bind_lilicorr(model, t: dict) -> None:
    """The scorer's feature MLP and transformer layers (None on another head's draft)."""
    hp = model.hparams
    bind(model, LILICORR_FEATURE_TENSORS, t, fb=hp.n_layer + hp.lilicorr_layers)
    for i, layer in enumerate(model.layers):
        bind(layer, LILICORR_LAYER_TENSORS, t if i < hp.lilicorr_layers else {}, bid=hp.n_layer + i, i=i)


HEAD = Head("lilicorr", "draft-lilicorr", GraphLiliCorr, marker_keys=("lilicorr.hidden_size",),
            load_hparams=load_hparams_lilicorr, load_tensors=lambda hp, info: load_tensors_lilicorr(hp),
            tensors=LILICORR_TENSORS, bind=bind_lilicorr, loads_conv=True,
            # a block's scorer is conditioned on the context features of the row before it
            context_rows=True,
            synth_options={"lilicorr_hidden": None, "lilicorr_top_k": 2, "lilicorr_heads": 2, "lilicorr_layers": 1,
                           "lilicorr_eps": 1e-6, "lilicorr_logit_scale": 1.0, "lilicorr_factor": 16,
                           "lilicorr_mlp": None, "lilicorr_conv": False, "conv_kernel_size": 3,
                           "conv_group_size": 16},
            # the conv keys configure its conv only when lilicorr_conv asks for one
            synth_needs={"conv_kernel_size": "lilicorr_conv", "conv_group_size": "lilicorr_conv"},
            # no authors' code on PyPI, and b11549's common/speculative.cpp has no LiliCorr driver
            llama_loop=False, title="LiliCorr")
