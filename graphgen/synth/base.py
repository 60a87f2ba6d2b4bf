"""The base backbone's part of a draft: the keys its options set, the tokenizer keys (a vocabulary
of its own, or its target's), its layers, and the tensors every draft holds (token embeddings, fc,
norms, lm head), which the DSpark backbones write too.
"""

from __future__ import annotations

from types import SimpleNamespace

from .options import HIDDEN_ACTS, ROPE_SCALING_TYPES, check, models, positive_int
from .writer import Draft, by_attr, kv


# GGUF token types (llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL = 1, 2, 3
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0


def common_tensors() -> dict:
    return by_attr(models.dflash.COMMON_TENSORS)


def hparam_options(d: Draft, opts: dict, n_layer: int, head_dim: int) -> None:
    if opts["swa_pattern"] is not None and opts["swa_window"] is None:
        raise ValueError("swa_pattern needs swa_window")
    if opts["swa_window"] is not None:
        window = positive_int("swa_window", opts["swa_window"])
        # upstream reads the pattern as required once a window is set; default: even layers slide
        pattern = opts["swa_pattern"]
        pattern = [il % 2 == 0 for il in range(n_layer)] if pattern is None else [bool(p) for p in pattern]
        check(len(pattern) == n_layer, f"swa_pattern has {len(pattern)} entries, n_layer is {n_layer}")
        # a window with no sliding layer aborts upstream (GGML_ASSERT(hparams.is_swa_any()))
        check(any(pattern), "swa_pattern marks no layer as sliding; upstream aborts on such a window")
        d.key(kv("attention.sliding_window"), "u32", window)
        d.key(kv("attention.sliding_window_pattern"), "bool[]", pattern)
    if opts["mrope_sections"] is not None:
        sections = [int(s) for s in opts["mrope_sections"]]
        check(len(sections) == 4 and all(s >= 0 for s in sections) and sum(sections[:3]) > 0,
              f"mrope_sections must be 4 non-negative ints, one of the first three positive, "
              f"got {opts['mrope_sections']!r}")
        # ggml's rope builds its sin/cos cache over the head and rotates the first n_rot dims: the
        # sections may reach past n_rot/2, not past the head
        check(sum(sections) <= head_dim, f"mrope_sections sum to {sum(sections)}, more than the head "
                                         f"dimension ({head_dim})")
        d.key(kv("rope.dimension_sections"), "i32[]", sections)
    if opts["rope_scaling"] is not None:
        check(opts["rope_scaling"] in ROPE_SCALING_TYPES,
              f"rope_scaling must be one of {', '.join(ROPE_SCALING_TYPES)}, got {opts['rope_scaling']!r}")
        d.key(kv("rope.scaling.type"), "str", opts["rope_scaling"])
    if opts["rope_scaling_factor"] is not None:
        d.key(kv("rope.scaling.factor"), "f32", float(opts["rope_scaling_factor"]))
    if opts["rope_orig_ctx"] is not None:
        d.key(kv("rope.scaling.original_context_length"), "u32", positive_int("rope_orig_ctx", opts["rope_orig_ctx"]))
    if opts["rope_attn_factor"] is not None:
        d.key(kv("rope.scaling.attn_factor"), "f32", float(opts["rope_attn_factor"]))
    if opts["final_softcap"] is not None:
        check(opts["final_softcap"] > 0, f"final_softcap must be positive, got {opts['final_softcap']}")
    for opt, key in (("attention_scale", "attention.scale"), ("value_scale", "attention.value_scale"),
                     ("embedding_scale", "embedding_scale"), ("logit_scale", "logit_scale"),
                     ("final_softcap", "final_logit_softcapping")):
        if opts[opt] is not None:
            d.key(kv(key), "f32", float(opts[opt]))
    if opts["causal"] is not None:
        d.key(kv("attention.causal"), "bool", bool(opts["causal"]))
    if opts["hidden_act"] is not None:
        check(opts["hidden_act"] in HIDDEN_ACTS,
              f"hidden_act must be one of {', '.join(HIDDEN_ACTS)}, got {opts['hidden_act']!r}")
        d.key(kv("hidden_activation"), "str", opts["hidden_act"])


def tokenizer_keys(d: Draft, n_vocab: int) -> None:
    mask_id = n_vocab - 1
    tokens = [f"<t{i}>" for i in range(n_vocab)]
    types = [TOKEN_NORMAL] * n_vocab
    for tid, text, kind in ((UNK_ID, "<unk>", TOKEN_UNKNOWN), (BOS_ID, "<s>", TOKEN_CONTROL),
                            (EOS_ID, "</s>", TOKEN_CONTROL), (mask_id, "<mask>", TOKEN_CONTROL)):
        tokens[tid], types[tid] = text, kind
    d.key("tokenizer.ggml.model", "str", "llama")
    d.key("tokenizer.ggml.tokens", "str[]", tokens)
    d.key("tokenizer.ggml.scores", "f32[]", [-float(i) for i in range(n_vocab)])
    d.key("tokenizer.ggml.token_type", "i32[]", types)
    d.key("tokenizer.ggml.bos_token_id", "u32", BOS_ID)
    d.key("tokenizer.ggml.eos_token_id", "u32", EOS_ID)
    d.key("tokenizer.ggml.unknown_token_id", "u32", UNK_ID)
    d.key("tokenizer.ggml.mask_token_id", "u32", mask_id)


_KIND_OF = {str: "str", bool: "bool", int: "u32", float: "f32"}


def target_tokenizer_keys(d: Draft, info, fields) -> None:
    """The target's tokenizer keys as they are, plus a mask token: the target's own, else its last
    control token that is not bos, eos, unk or padding (the noise block's filler)."""
    types = None
    for key, value in fields:
        if isinstance(value, list):
            if not value:
                continue
            kind = {str: "str[]", int: "i32[]", float: "f32[]", bool: "bool[]"}[type(value[0])]
            if key == "tokenizer.ggml.token_type":
                types = value
        else:
            kind = _KIND_OF[type(value)]
        d.key(key, kind, value)
    if "mask" not in info.special:
        taken = set(info.special.values())
        control = [i for i, t in enumerate(types or []) if t == TOKEN_CONTROL and i not in taken]
        d.key("tokenizer.ggml.mask_token_id", "u32", control[-1] if control else info.n_vocab - 1)


def base_layers(d: Draft, opts: dict, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff) -> None:
    """load_tensors_layers_base, in its order, from its declarations (models/dflash.py)."""
    B = by_attr(models.dflash.LAYER_TENSORS)
    dims = SimpleNamespace(n_embd=n_embd, n_head=n_head, n_embd_head_k=head_dim, n_embd_k_gqa=head_dim * n_head_kv,
                           n_embd_v_gqa=head_dim * n_head_kv, n_ff=n_ff)
    for il in range(n_layer):
        d.norm_t(B["attn_norm"], dims, il=il)
        d.linear_t(B["wq"], B["wq_s"], dims, il=il)
        d.linear_t(B["wk"], B["wk_s"], dims, il=il)
        if not opts["shared_kv"]:  # without attn_v, V is the RMS-normed K
            d.linear_t(B["wv"], B["wv_s"], dims, il=il)
        d.linear_t(B["wo"], B["wo_s"], dims, il=il)
        d.norm_t(B["attn_q_norm"], dims, il=il)
        d.norm_t(B["attn_k_norm"], dims, il=il)
        if opts["post_norms"]:
            d.norm_t(B["attn_post_norm"], dims, il=il)
            d.norm_t(B["ffn_post_norm"], dims, il=il)
        if opts["out_scale"]:
            d.normal_t(B["out_scale"], dims, 0.1, 1.0, il=il)
        if opts["rope_freqs"] and il == 0:
            # one tensor without a layer index; upstream duplicates it into every layer
            d.normal_t(models.dflash.ROPE_FREQS, dims, 0.1, 1.0)
        if opts["sinks"]:
            d.normal_t(B["attn_sinks"], dims, 0.5, il=il)
        d.norm_t(B["ffn_norm"], dims, il=il)
        d.linear_t(B["ffn_gate"], B["ffn_gate_s"], dims, il=il)
        d.linear_t(B["ffn_down"], B["ffn_down_s"], dims, il=il)
        d.linear_t(B["ffn_up"], B["ffn_up_s"], dims, il=il)
