"""The DSpark backbones: DeepSeek-V4 (dsv4), DeepSeek-V4.1 (dsv41) and Mistral Large 4
(mistral-large4). Their drafts hold the global tensors and the head of a base draft, with hparams
and layers of their own.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .base import common_tensors, tokenizer_keys
from .head_writers import HEAD_WRITERS
from .options import check, models, owners_of, positive_int, resolve_backbone_options
from .writer import Draft, Output, by_attr, kv, write


def make_backbone_model(path, variant, backbone, *, output: Output, n_embd, n_layer, n_head, n_ff, n_vocab, block_size,
                        target_layers, seed, context_length, rope_freq_base, rms_eps, conf, **options) -> dict:
    """load_hparams_dsv4 / load_hparams_mistral_large4 and their load_tensors_layers_* (seed's dspark.cpp)."""
    runs = sorted(h.name for h in models.arch.HEADS.values() if h.on_backbones)
    check(variant in runs, f"the {backbone} backbone takes variant {' or '.join(runs)}, not {variant}")
    check(not conf or "conf" in models.arch.HEADS[variant].synth_options,
          f"conf (the confidence head) applies to variant {owners_of('conf')} only")
    opts = resolve_backbone_options(backbone, options)
    n_embd, n_layer, n_head = (positive_int(k, v) for k, v in (("n_embd", n_embd), ("n_layer", n_layer),
                                                               ("n_head", n_head)))
    n_vocab, block_size = positive_int("n_vocab", n_vocab), positive_int("block_size", block_size)
    check(n_vocab >= 4, f"n_vocab must be at least 4, got {n_vocab}")
    n_rot = positive_int("n_rot", opts["n_rot"])
    check(n_rot % 2 == 0, f"n_rot ({n_rot}) must be even")
    window = positive_int("swa_window", opts["swa_window"])
    if opts.get("joint"):
        check("joint" in models.arch.HEADS[variant].synth_options,
              f"joint (the RNN joint head) needs variant {owners_of('joint')}")

    d = Draft(seed, False)
    d.key(kv("context_length"), "u32", positive_int("context_length", context_length))
    d.key(kv("embedding_length"), "u32", n_embd)
    d.key(kv("block_count"), "u32", n_layer)
    d.key(kv("feed_forward_length"), "u32", positive_int("n_ff", n_ff))
    d.key(kv("attention.head_count"), "u32", n_head)
    d.key(kv("attention.head_count_kv"), "u32", 1)
    d.key(kv("attention.layer_norm_rms_epsilon"), "f32", float(rms_eps))
    d.key(kv("rope.freq_base"), "f32", float(rope_freq_base))
    d.key(kv("target_layers"), "i32[]", [int(t) for t in target_layers])
    d.key(kv("block_size"), "u32", block_size)
    d.key(kv("attention.sliding_window"), "u32", window)

    if backbone in ("dsv4", "dsv41"):
        head_dim = opts["head_dim"] if opts["head_dim"] is not None else 32
        head_dim = positive_int("head_dim", head_dim)
        check(n_rot <= head_dim, f"n_rot ({n_rot}) must be at most head_dim ({head_dim})")
        hc = positive_int("hc_mult", opts["hc_mult"])
        groups = positive_int("o_groups", opts["o_groups"])
        check(n_head % groups == 0, f"n_head ({n_head}) must be a multiple of o_groups ({groups})")
        n_expert = positive_int("n_expert", opts["n_expert"])
        n_used = positive_int("n_expert_used", opts["n_expert_used"])
        check(n_used <= n_expert, f"n_expert_used ({n_used}) must not exceed n_expert ({n_expert})")
        d.key(kv("attention.key_length"), "u32", head_dim)
        d.key(kv("attention.value_length"), "u32", head_dim)
        d.key(kv("rope.dimension_count"), "u32", n_rot)
        d.key(kv("attention.q_lora_rank"), "u32", positive_int("q_lora_rank", opts["q_lora_rank"]))
        d.key(kv("attention.output_group_count"), "u32", groups)
        d.key(kv("attention.output_lora_rank"), "u32", positive_int("o_lora_rank", opts["o_lora_rank"]))
        d.key(kv("attention.compress_ratios"), "i32[]", [int(opts["compress_ratio"])] * n_layer)
        d.key(kv("expert_count"), "u32", n_expert)
        d.key(kv("expert_used_count"), "u32", n_used)
        d.key(kv("expert_feed_forward_length"), "u32", positive_int("n_ff_exp", opts["n_ff_exp"]))
        d.key(kv("expert_shared_count"), "u32", positive_int("n_expert_shared", opts["n_expert_shared"]))
        d.key(kv("expert_weights_scale"), "f32", float(opts["expert_weights_scale"]))
        d.key(kv("expert_weights_norm"), "bool", bool(opts["expert_weights_norm"]))
        d.key(kv("expert_gating_func"), "u32", int(opts["expert_gating_func"]))
        d.key(kv("swiglu_clamp_exp"), "f32", float(opts["swiglu_clamp"]))
        d.key(kv("hyper_connection.count"), "u32", hc)
        d.key(kv("hyper_connection.sinkhorn_iterations"), "u32",
              positive_int("hc_sinkhorn_iters", opts["hc_sinkhorn_iters"]))
        d.key(kv("hyper_connection.epsilon"), "f32", float(opts["hc_eps"]))
        if backbone == "dsv41":
            d.key(kv("hyper_connection.single_pass"), "bool", True)
    else:
        rank = positive_int("kv_lora_rank", opts["kv_lora_rank"])
        k_mla = positive_int("k_head_dim_mla", opts["k_head_dim_mla"])
        v_mla = positive_int("v_head_dim_mla", opts["v_head_dim_mla"])
        check(n_rot < k_mla, f"n_rot ({n_rot}) must be smaller than k_head_dim_mla ({k_mla})")
        d.key(kv("attention.key_length"), "u32", rank + n_rot)
        d.key(kv("attention.value_length"), "u32", rank)
        d.key(kv("attention.key_length_mla"), "u32", k_mla)
        d.key(kv("attention.value_length_mla"), "u32", v_mla)
        d.key(kv("attention.kv_lora_rank"), "u32", rank)
        d.key(kv("rope.dimension_count"), "u32", n_rot)
        factor = float(opts["rope_scaling_factor"])
        if factor and factor != 1.0:
            d.key(kv("rope.scaling.type"), "str", "yarn")
            d.key(kv("rope.scaling.factor"), "f32", factor)
            d.key(kv("rope.scaling.original_context_length"), "u32", max(1, context_length // int(factor)))
            d.key(kv("rope.scaling.yarn_log_multiplier"), "f32", float(opts["yarn_log_mul"]))
        if opts["final_softcap"]:
            d.key(kv("final_logit_softcapping"), "f32", float(opts["final_softcap"]))
    head_keys, head_tensors = HEAD_WRITERS.get(variant, (None, None))
    w = SimpleNamespace(n_embd=n_embd, n_layer=n_layer, n_vocab=n_vocab, n_vocab_draft=n_vocab, block_size=block_size,
                        conf=conf)
    head_opts = {"markov_rank": opts.get("markov_rank"), "joint": bool(opts.get("joint")), "sample_from_anchor": None}
    if head_keys is not None:
        head_keys(d, head_opts, w)
    tokenizer_keys(d, n_vocab)

    dims = SimpleNamespace(n_embd=n_embd, n_vocab=n_vocab, n_vocab_draft=n_vocab,
                           n_embd_inp_enc=len(target_layers) * n_embd)
    C0 = common_tensors()
    d.normal_t(C0["tok_embd"], dims, 1.0)
    if head_tensors is not None:
        head_tensors(d, head_opts, w)
    d.linear_t(C0["fc"], C0["fc_s"], dims)
    d.norm_t(C0["output_norm_enc"], dims)
    d.norm_t(C0["output_norm"], dims)
    d.linear_t(C0["output"], None, dims)
    if backbone in ("dsv4", "dsv41"):
        _dsv4_layers(d, opts, backbone, n_layer, n_embd, n_head, head_dim)
    else:
        _ml4_layers(d, opts, n_layer, n_embd, n_head, n_ff, n_rot, block_size)

    write(Path(path), d, output)
    return {
        "variant": variant, "backbone": backbone, "path": str(path), "n_tensors": len(d.tensors),
        "keys": {name: value for name, (_, value) in d.keys.items()},
        "tensors": {name: tuple(reversed(t.shape)) for name, t in d.tensors.items()},
    }


def _dsv4_layers(d: Draft, opts: dict, backbone: str, n_layer, n_embd, n_head, head_dim) -> None:
    """load_tensors_layers_dsv4 (hc_head only without single-pass mHC, i.e. not on DSV4.1)."""
    X, H = by_attr(models.dspark.DSV4_LAYER_TENSORS), by_attr(models.dspark.DSV4_TENSORS)
    hc = opts["hc_mult"]
    hc_dim = hc * n_embd
    q_rank, groups, o_rank = opts["q_lora_rank"], opts["o_groups"], opts["o_lora_rank"]
    n_ff_exp = opts["n_ff_exp"]
    dims = SimpleNamespace(n_embd=n_embd, n_head=n_head, n_embd_head_k=head_dim, n_lora_q=q_rank, hc_mult=hc,
                           dsv4_o_group_count=groups, dsv4_o_lora_rank=o_rank, n_expert=opts["n_expert"],
                           n_ff_exp=n_ff_exp, n_expert_shared=opts["n_expert_shared"])
    if backbone == "dsv4":
        d.normal_t(H["hc_head_fn"], dims, 1.0 / np.sqrt(hc_dim))
        d.normal_t(H["hc_head_base"], dims, 0.1)
        d.normal_t(H["hc_head_scale"], dims, 0.1, 1.0)
    for il in range(n_layer):
        d.norm_t(X["attn_norm"], dims, il=il)
        d.normal_t(X["attn_sinks"], dims, 0.5, il=il)
        d.linear_t(X["wq_a"], None, dims, il=il)
        d.norm_t(X["attn_q_a_norm"], dims, il=il)
        d.linear_t(X["wq_b"], None, dims, il=il)
        d.linear_t(X["wkv"], None, dims, il=il)
        d.norm_t(X["attn_kv_norm"], dims, il=il)
        # {H*D/G, R, G}: the loader checks this reshapable tensor apart from the declared shapes
        d.normal(models.dspark.DSV4_WO_A.name.format(il=il), (n_head * head_dim // groups, o_rank, groups),
                 1.0 / np.sqrt(n_head * head_dim // groups))
        d.linear_t(X["wo_b"], None, dims, il=il)
        for part in ("attn", "ffn"):
            d.normal_t(X[f"hc_{part}_fn"], dims, 1.0 / np.sqrt(hc_dim), il=il)
            d.normal_t(X[f"hc_{part}_base"], dims, 0.1, il=il)
            d.normal_t(X[f"hc_{part}_scale"], dims, 0.1, 1.0, il=il)
        d.linear_t(X["ffn_gate_inp"], None, dims, il=il)
        d.normal_t(X["ffn_exp_probs_b"], dims, 0.1, il=il)
        d.norm_t(X["ffn_norm"], dims, il=il)
        d.normal_t(X["ffn_gate_exps"], dims, 1.0 / np.sqrt(n_embd), il=il)
        d.normal_t(X["ffn_down_exps"], dims, 1.0 / np.sqrt(n_ff_exp), il=il)
        d.normal_t(X["ffn_up_exps"], dims, 1.0 / np.sqrt(n_embd), il=il)
        d.linear_t(X["ffn_gate_shexp"], None, dims, il=il)
        d.linear_t(X["ffn_down_shexp"], None, dims, il=il)
        d.linear_t(X["ffn_up_shexp"], None, dims, il=il)


def _ml4_layers(d: Draft, opts: dict, n_layer, n_embd, n_head, n_ff, n_rot, block_size) -> None:
    """load_tensors_layers_mistral_large4: MLA attention (wk_b/wv_b per head), dense SwiGLU FFN."""
    X, M = by_attr(models.dspark.ML4_LAYER_TENSORS), by_attr(models.dspark.ML4_TENSORS)
    rank, k_mla, v_mla = opts["kv_lora_rank"], opts["k_head_dim_mla"], opts["v_head_dim_mla"]
    dims = SimpleNamespace(n_embd=n_embd, n_head=n_head, n_ff=n_ff, n_rot=n_rot, block_size=block_size,
                           n_lora_kv=rank, n_embd_head_k_mla=k_mla, n_embd_head_v_mla=v_mla)
    d.normal_t(M["dspark_mask_embd"], dims, 1.0)
    for il in range(n_layer):
        d.norm_t(X["attn_norm"], dims, il=il)
        d.linear_t(X["wq"], None, dims, il=il)
        d.linear_t(X["wkv_a_mqa"], None, dims, il=il)
        d.norm_t(X["attn_kv_a_norm"], dims, il=il)
        d.normal_t(X["wk_b"], dims, 1.0 / np.sqrt(k_mla - n_rot), il=il)
        d.normal_t(X["wv_b"], dims, 1.0 / np.sqrt(rank), il=il)
        d.linear_t(X["wo"], None, dims, il=il)
        d.norm_t(X["ffn_norm"], dims, il=il)
        d.linear_t(X["ffn_gate"], None, dims, il=il)
        d.linear_t(X["ffn_down"], None, dims, il=il)
        d.linear_t(X["ffn_up"], None, dims, il=il)
