"""Each head's keys and tensors beside the base stack: DFlash2's candidate selector and local
convolutions, DSpark's Markov head (with its confidence and joint heads), LiliCorr's correlation
scorer. `HEAD_WRITERS` gives a head's two writers; the plain DFlash head has none.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from .options import check, models, positive_int
from .writer import Draft, by_attr, kv


# --- DFlash2: local conv in the layers + candidate selector on the block

def _dflash2_keys(d: Draft, opts: dict, n_embd: int) -> None:
    rank = positive_int("selector_rank", opts["selector_rank"])
    top_k = positive_int("selector_top_k", opts["selector_top_k"])
    check(n_embd >= top_k * (top_k + 1),
          f"DFlash2 needs n_embd >= selector_top_k*(selector_top_k+1) for the selector lattice: "
          f"n_embd {n_embd} < {top_k * (top_k + 1)}")
    d.key(kv("selector_rank"), "u32", rank)
    d.key(kv("selector_top_k"), "u32", top_k)
    _conv_keys(d, opts, n_embd)


def _conv_keys(d: Draft, opts: dict, n_embd: int) -> None:
    kernel = positive_int("conv_kernel_size", opts["conv_kernel_size"])
    group = positive_int("conv_group_size", opts["conv_group_size"])
    check(n_embd % group == 0, f"n_embd ({n_embd}) must be divisible by conv_group_size ({group})")
    d.key(kv("conv_kernel_size"), "u32", kernel)
    d.key(kv("conv_group_size"), "u32", group)


def _dflash2_tensors(d: Draft, opts: dict, n_embd: int, n_vocab: int, n_layer: int) -> None:
    S, rank = by_attr(models.dflash2.DFLASH2_TENSORS), opts["selector_rank"]
    dims = SimpleNamespace(selector_rank=rank, n_vocab=n_vocab, n_embd=n_embd)
    d.normal_t(S["dflash_selector_prev"], dims, 1.0 / np.sqrt(rank))
    d.normal_t(S["dflash_selector_next"], dims, 1.0 / np.sqrt(rank))
    d.normal_t(S["dflash_selector_hidden"], dims, 1.0 / np.sqrt(n_embd))
    _conv_tensors(d, opts, n_embd, n_layer)


def _conv_tensors(d: Draft, opts: dict, n_embd: int, n_layer: int) -> None:
    """load_tensors_dflash2_conv: per-layer base taps {n_embd, kernel, 2} plus a projection to
    2*kernel coefficients per channel group (side 0: attention input, side 1: FFN input)."""
    C, kernel = by_attr(models.conv.CONV_LAYER_TENSORS), opts["conv_kernel_size"]
    dims = SimpleNamespace(n_embd=n_embd, conv_kernel_size=kernel, conv_group_size=opts["conv_group_size"])
    for il in range(n_layer):
        for part in ("attn", "ffn"):
            # the taps sum kernel terms: weights ~1/kernel keep the output O(1)
            d.normal_t(C[f"dflash_{part}_conv_base"], dims, 0.5 / kernel, il=il)
            d.normal_t(C[f"dflash_{part}_conv_proj"], dims, 0.1 / np.sqrt(n_embd), il=il)


# --- DSpark: Markov head (+ confidence head, + RNN joint head in the seed)

def _dspark_keys(d: Draft, opts: dict, conf: bool) -> None:
    positive_int("markov_rank", opts["markov_rank"])
    # the driver reads a missing key as "has a confidence head", so say so either way
    d.key(kv("has_confidence_head"), "bool", bool(conf))
    if opts["sample_from_anchor"] is not None:
        d.key(kv("sample_from_anchor"), "bool", bool(opts["sample_from_anchor"]))


def _dspark_tensors(d: Draft, opts: dict, n_embd: int, n_vocab: int, n_vocab_draft: int, conf: bool) -> None:
    D, rank = by_attr(models.dspark.DSPARK_TENSORS), opts["markov_rank"]
    dims = SimpleNamespace(n_embd=n_embd, n_vocab=n_vocab, n_vocab_draft=n_vocab_draft, dspark_rank=rank)
    # w1 is a previous-token embedding over the full vocab, w2 projects it to draft-vocab bias
    d.normal_t(D["dspark_markov_w1"], dims, 1.0)
    d.linear_t(D["dspark_markov_w2"], D["dspark_markov_w2_s"], dims)
    if conf:
        d.normal_t(D["dspark_conf_proj"], dims, 1.0 / np.sqrt(n_embd + rank))
        d.bias_t(D["dspark_conf_proj_b"], dims)
    if opts["joint"]:  # seed only: b11739 does not load joint_proj
        d.normal_t(D["dspark_joint_proj"], dims, 1.0 / np.sqrt(n_embd + 2 * rank))
        d.bias_t(D["dspark_joint_proj_b"], dims)


# --- LiliCorr: correlation scorer over the block's top-k candidates

def _lilicorr_keys(d: Draft, opts: dict, n_embd: int, n_layer: int, block_size: int) -> None:
    # fill in the defaults that depend on n_embd, for _lilicorr_tensors
    hidden = opts["lilicorr_hidden"] = n_embd if opts["lilicorr_hidden"] is None else positive_int(
        "lilicorr_hidden", opts["lilicorr_hidden"])
    heads = positive_int("lilicorr_heads", opts["lilicorr_heads"])
    top_k = positive_int("lilicorr_top_k", opts["lilicorr_top_k"])
    layers = positive_int("lilicorr_layers", opts["lilicorr_layers"])
    factor = positive_int("lilicorr_factor", opts["lilicorr_factor"])
    opts["lilicorr_mlp"] = mlp = 2 * hidden if opts["lilicorr_mlp"] is None else positive_int(
        "lilicorr_mlp", opts["lilicorr_mlp"])
    check(block_size >= 2, f"LiliCorr needs block_size >= 2 (one anchor and at least one slot), got {block_size}")
    check(hidden % heads == 0, f"lilicorr_hidden ({hidden}) must be divisible by lilicorr_heads ({heads})")
    check(top_k * (top_k + 1) <= n_embd, f"LiliCorr needs n_embd >= lilicorr_top_k*(lilicorr_top_k+1): "
                                         f"n_embd {n_embd} < {top_k * (top_k + 1)}")
    # its head layers live on layers[0..num_layers) of the base stack
    check(layers <= n_layer, f"lilicorr_layers ({layers}) must not exceed n_layer ({n_layer})")
    check(opts["lilicorr_eps"] > 0, f"lilicorr_eps must be positive, got {opts['lilicorr_eps']}")
    # LiliCorr keys carry no arch prefix
    d.key("lilicorr.hidden_size", "u32", hidden)
    d.key("lilicorr.candidate_topk", "u32", top_k)
    d.key("lilicorr.num_heads", "u32", heads)
    d.key("lilicorr.num_layers", "u32", layers)
    d.key("lilicorr.vector_eps", "f32", float(opts["lilicorr_eps"]))
    d.key("lilicorr.logit_scale", "f32", float(opts["lilicorr_logit_scale"]))
    d.key("lilicorr.factor_dim", "u32", factor)
    d.key("lilicorr.mlp_hidden_size", "u32", mlp)
    if opts["lilicorr_conv"]:
        _conv_keys(d, opts, n_embd)


def _lilicorr_tensors(d: Draft, opts: dict, n_embd: int, n_layer: int, block_size: int) -> None:
    L, F, Y = (by_attr(models.lilicorr.LILICORR_TENSORS), by_attr(models.lilicorr.LILICORR_FEATURE_TENSORS),
               by_attr(models.lilicorr.LILICORR_LAYER_TENSORS))
    hidden = opts["lilicorr_hidden"]
    dims = SimpleNamespace(n_embd=n_embd, block_size=block_size, lilicorr_hidden_size=hidden,
                           lilicorr_candidate_topk=opts["lilicorr_top_k"], lilicorr_num_heads=opts["lilicorr_heads"],
                           lilicorr_factor_dim=opts["lilicorr_factor"], lilicorr_mlp_hidden_size=opts["lilicorr_mlp"])
    fb = n_layer + opts["lilicorr_layers"]  # head layers sit after the base stack
    if hidden != n_embd:
        d.linear_t(L["lilicorr_token_proj"], L["lilicorr_token_proj_s"], dims)
        d.bias_t(L["lilicorr_token_proj_b"], dims)
    d.linear_t(L["lilicorr_pass_hidden_proj"], L["lilicorr_pass_hidden_proj_s"], dims)
    d.bias_t(L["lilicorr_pass_hidden_proj_b"], dims)
    # the 5 per-candidate scalar features: norm, then a 2-layer MLP
    d.norm_t(F["lilicorr_feature_norm"], dims, fb=fb)
    d.bias_t(F["lilicorr_feature_norm_b"], dims, fb=fb)
    d.linear_t(F["lilicorr_feature_mlp_1"], None, dims, fb=fb)
    d.bias_t(F["lilicorr_feature_mlp_1_b"], dims, fb=fb)
    d.linear_t(F["lilicorr_feature_mlp_3"], None, dims, fb=fb)
    d.bias_t(F["lilicorr_feature_mlp_3_b"], dims, fb=fb)
    d.normal_t(L["lilicorr_slot_embedding"], dims, 0.5)
    d.normal_t(L["lilicorr_rank_embedding"], dims, 0.5)
    d.normal_t(L["lilicorr_attention_bias"], dims, 0.1)
    d.linear_t(L["lilicorr_context_proj"], L["lilicorr_context_proj_s"], dims)
    d.bias_t(L["lilicorr_context_proj_b"], dims)
    for i in range(opts["lilicorr_layers"]):
        at = {"bid": n_layer + i, "i": i}  # the in-projection is named by head layer i, the rest by block id
        d.norm_t(Y["lilicorr_attn_norm"], dims, **at)
        d.norm_t(Y["lilicorr_mlp_norm"], dims, **at)
        d.linear_t(Y["lilicorr_attn_in_proj"], None, dims, **at)
        d.bias_t(Y["lilicorr_attn_in_proj_b"], dims, **at)
        d.linear_t(Y["lilicorr_attn_out_proj"], Y["lilicorr_attn_out_proj_s"], dims, **at)
        d.bias_t(Y["lilicorr_attn_out_proj_b"], dims, **at)
        d.linear_t(Y["lilicorr_mlp_0"], Y["lilicorr_mlp_0_s"], dims, **at)
        d.bias_t(Y["lilicorr_mlp_0_b"], dims, **at)
        d.linear_t(Y["lilicorr_mlp_2"], Y["lilicorr_mlp_2_s"], dims, **at)
        d.bias_t(Y["lilicorr_mlp_2_b"], dims, **at)
    d.norm_t(L["lilicorr_output_norm"], dims)
    d.norm_t(L["lilicorr_anchor_norm"], dims)
    d.linear_t(L["lilicorr_factor_input_proj"], None, dims)
    d.bias_t(L["lilicorr_factor_input_proj_b"], dims)
    for head in ("out_head", "in_head", "anchor_out_head"):
        d.linear_t(L[f"lilicorr_{head}"], None, dims)
        d.bias_t(L[f"lilicorr_{head}_b"], dims)
    if opts["lilicorr_conv"]:
        _conv_tensors(d, opts, n_embd, n_layer)


# each head's keys and tensors, (d, options, dimensions) -> None; the plain DFlash head has none
HEAD_WRITERS = {
    "dflash2": (lambda d, o, w: _dflash2_keys(d, o, w.n_embd),
                lambda d, o, w: _dflash2_tensors(d, o, w.n_embd, w.n_vocab, w.n_layer)),
    "dspark": (lambda d, o, w: _dspark_keys(d, o, w.conf),
               lambda d, o, w: _dspark_tensors(d, o, w.n_embd, w.n_vocab, w.n_vocab_draft, w.conf)),
    "lilicorr": (lambda d, o, w: _lilicorr_keys(d, o, w.n_embd, w.n_layer, w.block_size),
                 lambda d, o, w: _lilicorr_tensors(d, o, w.n_embd, w.n_layer, w.block_size)),
}
