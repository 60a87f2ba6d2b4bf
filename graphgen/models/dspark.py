"""src/models/dspark.cpp: DSpark = DFlash + a semi-autoregressive Markov head and Confidence head.

graph_dspark runs the head on the DFlash backbone; graph_dsv4 (DeepSeek-V4, in b11739),
graph_dsv41 (DeepSeek-V4.1) and graph_mistral_large4 (both seed only) run it on their own
backbones, with the DeepSeek-V4 machinery of deepseek4.py.

The loaders of the head and of both backbone families sit here as in the seed:
load_hparams_dsv4, load_hparams_mistral_large4, load_tensors_dspark, load_tensors_layers_dsv4
and load_tensors_layers_mistral_large4.

Long because the seed's dspark.cpp holds the DSpark head and the DeepSeek-V4, V4.1 and Mistral
Large 4 backbones it runs on, and this file follows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


import numpy as np

from ..errors import GGUFModelError
from ..graph import GraphContext, GraphParams, mul_mat_hadamard
from ..ops import ggml as G
from ..ops.cmath import inv_sqrtf, recipf
from ..ops.ggml import (ggml_add, ggml_argmax, ggml_build_forward_expand, ggml_cast, ggml_concat, ggml_cont,
                        ggml_cont_1d, ggml_cont_2d, ggml_fill, ggml_get_rows, ggml_mul, ggml_mul_mat,
                        ggml_new_tensor_1d, ggml_new_tensor_2d, ggml_new_tensor_3d, ggml_permute, ggml_repeat,
                        ggml_repeat_4d, ggml_reshape_2d, ggml_reshape_3d, ggml_rope_ext, ggml_scale,
                        ggml_set_input, ggml_set_rows, ggml_sigmoid, ggml_sub, ggml_tanh, ggml_view_2d,
                        ggml_view_3d)
from .dflash import GraphBase, build_inject_inp, get_lm_head, get_tok_embd, kv
from .head import Head
from .tensors import T, shapes_of



# --- loader ------------------------------------------------------------------------------------

# head tensors: Model attribute -> GGUF name
# the Markov head (rank from markov_w1), the optional confidence head and the seed's RNN joint head
DSPARK_TENSORS = [
    T("dspark_markov_w1", "markov_w1.weight", lambda hp, x: (x.dspark_rank, hp.n_vocab or None)),
    T("dspark_markov_w2", "markov_w2.weight", lambda hp, x: (x.dspark_rank, x.n_vocab_draft or None)),
    T("dspark_markov_w2_s", "markov_w2.scale", lambda hp, x: (1,), required=False),
    T("dspark_conf_proj", "conf_proj.weight", lambda hp, x: (hp.n_embd + x.dspark_rank, 1), required=False),
    T("dspark_conf_proj_b", "conf_proj.bias", lambda hp, x: (1,), required=False),
    T("dspark_joint_proj", "joint_proj.weight", lambda hp, x: (hp.n_embd + 2 * x.dspark_rank, 3 * x.dspark_rank),
      required=False),
    T("dspark_joint_proj_b", "joint_proj.bias", lambda hp, x: (3 * x.dspark_rank,), required=False),
]


@dataclass
class BackboneHParams:
    """The DSpark backbones' fields (seed: load_hparams_dsv4, load_hparams_mistral_large4)."""
    n_lora_q: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_expert_shared: int = 0
    expert_weights_scale: float = 0.0
    expert_weights_norm: bool = False
    expert_gating_func: int = 0
    swiglu_clamp_exp: list = field(default_factory=list)
    swiglu_clamp_shexp: list = field(default_factory=list)
    dsv4_o_group_count: int = 0
    dsv4_o_lora_rank: int = 0
    dsv4_hc_sinkhorn_iters: int = 0
    dsv4_hc_eps: float = 0.0
    dsv4_compress_ratios: list = field(default_factory=list)
    dsv4_hc_single_pass: bool = False
    n_embd_head_k_mla: int = 0
    n_embd_head_v_mla: int = 0


def load_hparams_dspark(hp, path) -> None:
    """The Markov head drafts a whole block: it cannot run without the trained block size."""
    if hp.block_size <= 0:
        raise GGUFModelError(f"{path}: DSpark draft requires '{kv('block_size')}' in GGUF metadata")


def load_hparams_dsv4(m, hp, path) -> None:
    """The seed's load_hparams_dsv4: stages are full DSV4 blocks with a uniform sliding window."""
    if hp.hc_mult != 4:
        # upstream asserts hc == 4 in build_hc_pre (and its fused HC kernels), killing the process
        raise GGUFModelError(f"{path}: key '{kv('hyper_connection.count')}' = {hp.hc_mult}: "
                             "the DeepSeek-V4 hyper-connections need exactly 4 streams")
    hp.n_lora_q = m.get(kv("attention.q_lora_rank"), required=True, kind="int")
    n_swa = m.get(kv("attention.sliding_window"), required=True, kind="int")
    hp.n_ff_exp = m.get_key_or_arr(kv("expert_feed_forward_length"), hp.n_layer, kind="int")[0]
    hp.n_expert_shared = m.get(kv("expert_shared_count"), required=True, kind="int")
    hp.expert_weights_scale = m.get(kv("expert_weights_scale"), required=True, kind="float")
    hp.expert_weights_norm = bool(m.get(kv("expert_weights_norm"), required=True))
    hp.expert_gating_func = m.get(kv("expert_gating_func"), required=True, kind="int")
    hp.swiglu_clamp_exp = m.get_key_or_arr(kv("swiglu_clamp_exp"), hp.n_layer)
    if m.has(kv("swiglu_clamp_shexp")):
        hp.swiglu_clamp_shexp = m.get_key_or_arr(kv("swiglu_clamp_shexp"), hp.n_layer)
    else:
        hp.swiglu_clamp_shexp = list(hp.swiglu_clamp_exp)
    hp.dsv4_o_group_count = m.get(kv("attention.output_group_count"), required=True, kind="int")
    hp.dsv4_o_lora_rank = m.get(kv("attention.output_lora_rank"), required=True, kind="int")
    hp.dsv4_hc_sinkhorn_iters = m.get(kv("hyper_connection.sinkhorn_iterations"), required=True, kind="int")
    hp.dsv4_hc_eps = m.get(kv("hyper_connection.epsilon"), required=True, kind="float")
    ratios = m.get(kv("attention.compress_ratios"), None, kind="array")
    hp.dsv4_compress_ratios = list(ratios) if ratios is not None else [0] * hp.n_layer
    hp.dsv4_hc_single_pass = bool(m.get(kv("hyper_connection.single_pass"), False))
    hp.n_expert = m.get(kv("expert_count"), 0, kind="int")
    hp.n_expert_used = m.get(kv("expert_used_count"), 0, kind="int")

    if hp.dsv4_o_group_count <= 0:  # upstream: GGML_ASSERT (a division by zero otherwise)
        raise GGUFModelError(f"{path}: key '{kv('attention.output_group_count')}' must be positive")
    if hp.expert_gating_func != 4:
        raise GGUFModelError(f"{path}: DSpark DSV4 draft expects sqrtsoftplus MoE scoring "
                             f"(key '{kv('expert_gating_func')}' = {hp.expert_gating_func})")
    if any(int(r) != 0 for r in (hp.dsv4_compress_ratios + [0] * hp.n_layer)[:hp.n_layer]):
        raise GGUFModelError(f"{path}: DSpark DSV4 draft expects uncompressed attention on all stages "
                             f"(key '{kv('attention.compress_ratios')}')")
    if n_swa <= 0:  # upstream: GGML_ASSERT(hparams.n_swa > 0)
        raise GGUFModelError(f"{path}: key '{kv('attention.sliding_window')}' must be positive for a DSV4 draft")
    for key, val in ((kv("expert_count"), hp.n_expert), (kv("expert_used_count"), hp.n_expert_used),
                     (kv("attention.q_lora_rank"), hp.n_lora_q), (kv("expert_feed_forward_length"), hp.n_ff_exp),
                     (kv("expert_shared_count"), hp.n_expert_shared),
                     (kv("attention.output_lora_rank"), hp.dsv4_o_lora_rank),
                     (kv("hyper_connection.sinkhorn_iterations"), hp.dsv4_hc_sinkhorn_iters)):
        if val <= 0:
            raise GGUFModelError(f"{path}: key '{key}' must be positive for a DSV4 draft, got {val}")
    if hp.n_expert_used > hp.n_expert:
        raise GGUFModelError(f"{path}: key '{kv('expert_used_count')}' = {hp.n_expert_used} exceeds "
                             f"'{kv('expert_count')}' = {hp.n_expert}")
    if hp.n_head % hp.dsv4_o_group_count:
        raise GGUFModelError(f"{path}: key '{kv('attention.head_count')}' = {hp.n_head} is not a multiple of "
                             f"'{kv('attention.output_group_count')}' = {hp.dsv4_o_group_count}")
    if hp.n_embd_head_k != hp.n_embd_head_v or hp.n_head_kv != 1:
        raise GGUFModelError(f"{path}: a DSV4 draft needs key_length == value_length and one KV head "
                             f"(keys '{kv('attention.key_length')}', '{kv('attention.head_count_kv')}')")
    if hp.dsv4_hc_single_pass:
        # DeepSeek-V4.1: the block's window is the anchor's, which must reach window_size positions back
        n_swa += 1
    hp.set_swa_uniform(n_swa)


def load_hparams_mistral_large4(m, hp, path) -> None:
    """The seed's load_hparams_mistral_large4: dense MLA stages, one sliding window, plain YaRN."""
    hp.n_embd_head_k_mla = m.get(kv("attention.key_length_mla"), required=True, kind="int")
    hp.n_embd_head_v_mla = m.get(kv("attention.value_length_mla"), required=True, kind="int")
    hp.rope_yarn_log_mul = m.get(kv("rope.scaling.yarn_log_multiplier"), 0.0, kind="float")
    n_swa = m.get(kv("attention.sliding_window"), 0, kind="int")
    if n_swa <= 0:
        raise GGUFModelError(f"{path}: DSpark Mistral Large 4 draft expects a sliding window "
                             f"(key '{kv('attention.sliding_window')}')")
    if hp.n_embd_head_k != hp.n_lora_kv + hp.n_rot:
        raise GGUFModelError(f"{path}: DSpark Mistral Large 4 draft expects key_length == kv_lora_rank + rope dim "
                             f"({hp.n_embd_head_k} != {hp.n_lora_kv} + {hp.n_rot})")
    if hp.n_embd_head_k_mla <= hp.n_rot or hp.n_embd_head_v_mla <= 0:
        raise GGUFModelError(f"{path}: key '{kv('attention.key_length_mla')}' must exceed the rope dim {hp.n_rot}")
    if hp.n_head_kv != 1:
        raise GGUFModelError(f"{path}: an MLA draft has one KV head (key '{kv('attention.head_count_kv')}')")
    # the block uses the window of its anchor, as DSV4.1
    hp.set_swa_uniform(n_swa + 1)


def load_tensors_dspark(hp, info) -> tuple[dict, list]:
    """load_tensors_dspark: the Markov head, the optional confidence head and the RNN joint head."""
    return shapes_of(DSPARK_TENSORS, hp, info)


def _hc(hp):
    return hp.hc_mult * hp.n_embd, (2 + hp.hc_mult) * hp.hc_mult


# DSV4 collapses the streams with its own hc_head weights (DSV4.1 with the last pre-mix)
DSV4_TENSORS = [
    T("hc_head_fn", "output_hc_fn.weight", lambda hp, x: (_hc(hp)[0], hp.hc_mult)),
    T("hc_head_base", "output_hc_base.weight", lambda hp, x: (hp.hc_mult,)),
    T("hc_head_scale", "output_hc_scale.weight", lambda hp, x: (1,)),
]
# DeepSeek-V4 stages: low-rank Q, one shared K=V row, grouped low-rank output (attn_output_a, a
# reshapable tensor the loader checks apart), hyper-connection mixes, sqrt-softplus MoE with
# shared experts
DSV4_LAYER_TENSORS = [
    T("attn_norm", "blk.{il}.attn_norm.weight", lambda hp, x: (hp.n_embd,)),
    T("attn_sinks", "blk.{il}.attn_sinks.weight", lambda hp, x: (hp.n_head,)),
    T("wq_a", "blk.{il}.attn_q_a.weight", lambda hp, x: (hp.n_embd, hp.n_lora_q)),
    T("attn_q_a_norm", "blk.{il}.attn_q_a_norm.weight", lambda hp, x: (hp.n_lora_q,)),
    T("wq_b", "blk.{il}.attn_q_b.weight", lambda hp, x: (hp.n_lora_q, hp.n_head * hp.n_embd_head_k)),
    T("wkv", "blk.{il}.attn_kv.weight", lambda hp, x: (hp.n_embd, hp.n_embd_head_k)),
    T("attn_kv_norm", "blk.{il}.attn_kv_a_norm.weight", lambda hp, x: (hp.n_embd_head_k,)),
    T("wo_b", "blk.{il}.attn_output_b.weight", lambda hp, x: (hp.dsv4_o_group_count * hp.dsv4_o_lora_rank, hp.n_embd)),
    T("hc_attn_fn", "blk.{il}.hc_attn_fn.weight", lambda hp, x: _hc(hp)),
    T("hc_attn_base", "blk.{il}.hc_attn_base.weight", lambda hp, x: (_hc(hp)[1],)),
    T("hc_attn_scale", "blk.{il}.hc_attn_scale.weight", lambda hp, x: (3,)),
    T("hc_ffn_fn", "blk.{il}.hc_ffn_fn.weight", lambda hp, x: _hc(hp)),
    T("hc_ffn_base", "blk.{il}.hc_ffn_base.weight", lambda hp, x: (_hc(hp)[1],)),
    T("hc_ffn_scale", "blk.{il}.hc_ffn_scale.weight", lambda hp, x: (3,)),
    T("ffn_gate_inp", "blk.{il}.ffn_gate_inp.weight", lambda hp, x: (hp.n_embd, hp.n_expert)),
    T("ffn_exp_probs_b", "blk.{il}.exp_probs_b.bias", lambda hp, x: (hp.n_expert,)),
    T("ffn_norm", "blk.{il}.ffn_norm.weight", lambda hp, x: (hp.n_embd,)),
    T("ffn_gate_exps", "blk.{il}.ffn_gate_exps.weight", lambda hp, x: (hp.n_embd, hp.n_ff_exp, hp.n_expert)),
    T("ffn_down_exps", "blk.{il}.ffn_down_exps.weight", lambda hp, x: (hp.n_ff_exp, hp.n_embd, hp.n_expert)),
    T("ffn_up_exps", "blk.{il}.ffn_up_exps.weight", lambda hp, x: (hp.n_embd, hp.n_ff_exp, hp.n_expert)),
    T("ffn_gate_shexp", "blk.{il}.ffn_gate_shexp.weight", lambda hp, x: (hp.n_embd, hp.n_ff_exp * hp.n_expert_shared)),
    T("ffn_down_shexp", "blk.{il}.ffn_down_shexp.weight", lambda hp, x: (hp.n_ff_exp * hp.n_expert_shared, hp.n_embd)),
    T("ffn_up_shexp", "blk.{il}.ffn_up_shexp.weight", lambda hp, x: (hp.n_embd, hp.n_ff_exp * hp.n_expert_shared)),
]
DSV4_WO_A = T("wo_a", "blk.{il}.attn_output_a.weight", lambda hp, x: (None,))


def load_tensors_layers_dsv4(hp, with_hc_head: bool) -> tuple[dict, list]:
    """load_tensors_layers_dsv4; hc_head only without single-pass mHC, i.e. not on DSV4.1."""
    return shapes_of(DSV4_LAYER_TENSORS + (DSV4_TENSORS if with_hc_head else []), hp)


# Mistral Large 4: dense MLA stages and the block's mask embeddings
ML4_TENSORS = [T("dspark_mask_embd", "mask_embd.weight", lambda hp, x: (hp.n_embd, max(hp.block_size - 1, 1)))]
ML4_LAYER_TENSORS = [
    T("attn_norm", "blk.{il}.attn_norm.weight", lambda hp, x: (hp.n_embd,)),
    T("wq", "blk.{il}.attn_q.weight", lambda hp, x: (hp.n_embd, hp.n_head * hp.n_embd_head_k_mla)),
    T("wkv_a_mqa", "blk.{il}.attn_kv_a_mqa.weight", lambda hp, x: (hp.n_embd, hp.n_lora_kv + hp.n_rot)),
    T("attn_kv_a_norm", "blk.{il}.attn_kv_a_norm.weight", lambda hp, x: (hp.n_lora_kv,)),
    T("wk_b", "blk.{il}.attn_k_b.weight", lambda hp, x: (hp.n_embd_head_k_mla - hp.n_rot, hp.n_lora_kv, hp.n_head)),
    T("wv_b", "blk.{il}.attn_v_b.weight", lambda hp, x: (hp.n_lora_kv, hp.n_embd_head_v_mla, hp.n_head)),
    T("wo", "blk.{il}.attn_output.weight", lambda hp, x: (hp.n_head * hp.n_embd_head_v_mla, hp.n_embd)),
    T("wo_s", "blk.{il}.attn_output.scale", lambda hp, x: (1,), required=False),
    T("ffn_norm", "blk.{il}.ffn_norm.weight", lambda hp, x: (hp.n_embd,)),
    T("ffn_gate", "blk.{il}.ffn_gate.weight", lambda hp, x: (hp.n_embd, hp.n_ff)),
    T("ffn_down", "blk.{il}.ffn_down.weight", lambda hp, x: (hp.n_ff, hp.n_embd)),
    T("ffn_up", "blk.{il}.ffn_up.weight", lambda hp, x: (hp.n_embd, hp.n_ff)),
]


def load_tensors_layers_mistral_large4(hp) -> tuple[dict, list]:
    """load_tensors_layers_mistral_large4: dense MLA stages and the block's mask embeddings."""
    return shapes_of(ML4_LAYER_TENSORS + ML4_TENSORS, hp)


def build_dspark_markov_head(g, model, tokens, hidden=None):
    """Markov bias on the draft logits, chained per block position (greedy, in-graph)."""
    ctx0 = g.ctx0
    res = g.res

    w1 = model.dspark_markov_w1
    w2 = model.dspark_markov_w2
    if w1 is None or w2 is None:
        raise ValueError("DSpark markov weights not loaded")

    # confidence head is optional
    has_conf = model.dspark_conf_proj is not None

    # the RNN joint head: a gated state runs along the block's positions
    is_rnn = model.dspark_joint_proj is not None
    if is_rnn and hidden is None:
        raise ValueError("the DSpark RNN head (joint_proj) needs the backbone hidden state")

    base = res.t_logits  # [n_vocab, n_tokens]
    n_vocab = G.ne(base, 0)
    n_tok = G.ne(base, 1)

    block_size = g.hparams.block_size
    if block_size <= 0:
        raise ValueError("DSpark draft requires 'dflash.block_size' in GGUF metadata")

    # sample_from_anchor false: slot 0 holds a bonus token the verifier already has, nothing to predict
    sample_from_anchor = g.hparams.sample_from_anchor
    i_draft_beg = 0 if sample_from_anchor else 1

    n_blocks = len(np.unique(g.ubatch.seq))
    if not (n_blocks > 0 and n_tok % n_blocks == 0):
        raise ValueError("DSpark markov head requires equal-size blocks")
    # block length of this batch (the anchor and its drafted slots); never more than the trained block_size
    block_drafts = n_tok // n_blocks
    if block_drafts > block_size:
        return

    # each block's anchor (the last accepted token) is its first token: a view with a block-size stride
    token_stride = block_drafts * G.nb(tokens, 0)
    base_stride = block_drafts * G.nb(base, 1)

    prev = ggml_view_2d(ctx0, tokens, 1, n_blocks, token_stride, 0)
    prev = ggml_cont_1d(ctx0, prev, n_blocks)

    cat = None
    cat_conf = None

    if not sample_from_anchor:
        # slot 0 of a bonus-anchor draft: logits as they are, a filler confidence the driver never reads
        cat = ggml_cont(ctx0, ggml_view_2d(ctx0, base, n_vocab, n_blocks, base_stride, 0))
        if has_conf:
            cat_conf = ggml_sigmoid(ctx0, ggml_view_2d(ctx0, base, 1, n_blocks, base_stride, 0))

    state = None  # [R, n_blocks]

    # the Markov chain conditions on argmax tokens whatever the sampler does later: sampling
    # changes the token the driver picks, never the bias the next slot gets
    for i in range(i_draft_beg, block_drafts):
        w1_prev = ggml_get_rows(ctx0, w1, prev)  # [R, n_blocks]
        markov = w1_prev

        if is_rnn:
            rank = G.ne(w1_prev, 0)
            if state is None:
                state = ggml_fill(ctx0, ggml_new_tensor_2d(ctx0, G.GGML_TYPE_F32, rank, n_blocks), 0.0)

            hidden_i = ggml_view_2d(ctx0, hidden, G.ne(hidden, 0), n_blocks,
                                    block_drafts * G.nb(hidden, 1), i * G.nb(hidden, 1))
            joint = ggml_concat(ctx0, ggml_concat(ctx0, state, w1_prev, 0), ggml_cont(ctx0, hidden_i), 0)
            joint = ggml_add(ctx0, ggml_mul_mat(ctx0, model.dspark_joint_proj, joint),
                             model.dspark_joint_proj_b)  # [3R, n_blocks]

            def chunk(k, joint=joint, rank=rank):
                return ggml_cont(ctx0, ggml_view_2d(ctx0, joint, rank, n_blocks, G.nb(joint, 1),
                                                    k * rank * G.ggml_element_size(joint)))
            gate = ggml_sigmoid(ctx0, chunk(0))
            cand = ggml_tanh(ctx0, chunk(1))

            # convex mix: keep gate of the old state, take the rest from the candidate
            state = ggml_add(ctx0, cand, ggml_mul(ctx0, gate, ggml_sub(ctx0, state, cand)))
            markov = ggml_tanh(ctx0, chunk(2))

        bias = g.build_lora_mm(w2, markov, model.dspark_markov_w2_s)  # [n_vocab_draft, n_blocks]
        if model.d2t is not None:
            # with d2t the draft vocabulary is smaller: the bias lands on the mapped target rows, the rest stay -inf
            n_draft_vocab = G.ne(bias, 0)
            full = ggml_fill(ctx0, ggml_new_tensor_3d(ctx0, G.GGML_TYPE_F32, 1, n_vocab, n_blocks), 0.0)
            bias = ggml_set_rows(ctx0, full,
                                 ggml_reshape_3d(ctx0, bias, 1, n_draft_vocab, n_blocks),
                                 ggml_reshape_3d(ctx0, model.d2t, n_draft_vocab, 1, 1))
            bias = ggml_reshape_2d(ctx0, bias, n_vocab, n_blocks)

        # slot i of all blocks at once: [n_vocab, n_blocks] through a strided view
        base_i = ggml_view_2d(ctx0, base, n_vocab, n_blocks, base_stride, i * G.nb(base, 1))
        col = ggml_add(ctx0, base_i, bias)

        cat = ggml_concat(ctx0, cat, col, 1) if cat is not None else col

        if has_conf:
            # the confidence head estimates, per slot, whether the verifier will accept it
            conf_inp = res.t_embd  # [n_embd, n_tok]
            # one logit per block: conf_proj over the hidden row and the previous token's Markov row, then sigmoid
            conf_inp_i = ggml_view_2d(ctx0, conf_inp, G.ne(conf_inp, 0), n_blocks,
                                      block_drafts * G.nb(conf_inp, 1), i * G.nb(conf_inp, 1))
            feat = ggml_concat(ctx0, ggml_cont(ctx0, conf_inp_i), markov, 0)
            conf = ggml_mul_mat(ctx0, model.dspark_conf_proj, feat)
            if model.dspark_conf_proj_b is not None:
                conf = ggml_add(ctx0, conf, model.dspark_conf_proj_b)
            conf = ggml_sigmoid(ctx0, conf)

            cat_conf = ggml_concat(ctx0, cat_conf, conf, 1) if cat_conf is not None else conf

        if i + 1 < block_drafts:
            prev = ggml_argmax(ctx0, col)

    # the slots were concatenated slot by slot; the batch orders tokens block by block
    out = ggml_reshape_3d(ctx0, cat, n_vocab, n_blocks, block_drafts)
    out = ggml_cont(ctx0, ggml_permute(ctx0, out, 0, 2, 1, 3))  # -> n_vocab x slots x blocks
    out = ggml_reshape_2d(ctx0, out, n_vocab, n_tok)

    if has_conf:
        conf = ggml_reshape_3d(ctx0, cat_conf, 1, n_blocks, block_drafts)
        conf = ggml_cont(ctx0, ggml_permute(ctx0, conf, 0, 2, 1, 3))
        conf = ggml_reshape_2d(ctx0, conf, 1, n_tok)

        # broadcast the [1, n_tok] confidences to n_embd-wide rows so the driver reads them as h_nextn
        conf = ggml_repeat(ctx0, conf, res.t_embd)
        res.t_h_nextn = conf
        ggml_build_forward_expand(g.gf, conf)

    res.t_logits = out
    ggml_build_forward_expand(g.gf, out)


class GraphDSpark(GraphBase):
    """graph_dspark: the DFlash backbone and lm head, then the Markov (and confidence) head."""

    def __init__(self, params: GraphParams):
        super().__init__(params)
        if self.ubatch.is_embd:
            self.build_inject()
            return

        inp_tokens = self.build_inp_tokens()
        cur = self.build_layers(inp_tokens)

        self.build_logits(cur)

        # the Markov head adds its bias to the backbone's logits
        build_dspark_markov_head(self, self.model, inp_tokens)


# --- the DSpark backbones: DeepSeek-V4, DeepSeek-V4.1, Mistral Large 4 ---------------------------

class _GraphBackbone(GraphContext):
    """The inputs every DSpark backbone graph starts with: positions and the K-only iSWA cache."""

    def __init__(self, params: GraphParams):
        super().__init__(params)
        self.inp_pos = self.build_inp_pos()
        self.inp_attn = self.build_attn_inp_k_iswa()

    def build_inp_tokens(self):
        inp_tokens = ggml_new_tensor_1d(self.ctx0, G.GGML_TYPE_I32, self.n_tokens)
        ggml_set_input(inp_tokens)
        self.add_input(inp_tokens, lambda p: p.ubatch.tokens)
        return inp_tokens

    def write_injected(self, kv, il: int):
        """Write an injected K into the sliding-window cache, rotated when the cache is quantized."""
        swa = self.inp_attn.swa
        k_rot = self.inp_attn.get_k_rot(True)
        if k_rot is not None:
            kv = mul_mat_hadamard(self.ctx0, kv, k_rot)
        ggml_build_forward_expand(self.gf, swa.cache.cpy_k(self.ctx0, kv, self.inp_attn.get_k_idxs(True), il))

    def build_dsv4_ffn(self, cur, il: int):
        """The MoE with its shared expert: "ffn_moe_out" + "ffn_shexp" = "ffn_out"."""
        hp, layer = self.hparams, self.model.layers[il]
        moe_out = self.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                     layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used,
                                     hp.expert_weights_norm, hp.expert_weights_scale, hp.expert_gating_func,
                                     hp.swiglu_clamp_exp[il], il)
        self.cb(moe_out, "ffn_moe_out", il)
        ffn_shexp = self.build_ffn_limited(cur, layer.ffn_up_shexp, layer.ffn_gate_shexp, layer.ffn_down_shexp,
                                           hp.swiglu_clamp_shexp[il], il)
        self.cb(ffn_shexp, "ffn_shexp", il)
        cur = ggml_add(self.ctx0, moe_out, ffn_shexp)
        self.cb(cur, "ffn_out", il)
        return cur

    def build_dsv4_inject(self, name: str):
        """Injection batch: every stage's kv_norm(wkv(main_x)), roped, into its window ring."""
        from .deepseek4 import dsv4_rope
        ctx, model = self.ctx0, self.model
        inp_g = build_inject_inp(self, model)
        self.cb(inp_g, name, -1)
        for il in range(self.n_layer):
            layer = model.layers[il]
            kv = self.build_lora_mm(layer.wkv, inp_g)
            kv = self.build_norm(kv, layer.attn_kv_norm, None, il)
            kv = ggml_reshape_3d(ctx, kv, self.hparams.n_embd_head_k, 1, self.n_tokens)
            kv = dsv4_rope(self, kv, self.inp_pos)
            self.cb(kv, "kv_injected", il)
            self.write_injected(kv, il)
        self.res.t_embd = inp_g
        ggml_build_forward_expand(self.gf, inp_g)

    def build_hc_init(self, inp_tokens):
        ctx = self.ctx0
        inpL = ggml_get_rows(ctx, get_tok_embd(self, self.model), inp_tokens)
        self.cb(inpL, "inp_noise_embd", -1)
        hc = self.hparams.hc_mult
        inpL = ggml_reshape_3d(ctx, inpL, self.n_embd, 1, self.n_tokens)
        inpL = ggml_repeat_4d(ctx, inpL, self.n_embd, hc, self.n_tokens, 1)
        self.cb(inpL, "hc_init", -1)
        return inpL

    def build_output(self, cur, inp_tokens):
        """result_norm -> lm head "result_output", then the Markov head on the logits."""
        cur = self.build_norm(cur, self.model.output_norm, None, -1)
        self.cb(cur, "result_norm", -1)
        output, output_s = get_lm_head(self, self.model)
        cur = self.build_lora_mm(output, cur, output_s)
        self.cb(cur, "result_output", -1)
        self.res.t_logits = cur
        if self.model.dspark_markov_w1 is not None:
            build_dspark_markov_head(self, self.model, inp_tokens)
        else:
            ggml_build_forward_expand(self.gf, cur)


class GraphDSV4(_GraphBackbone):
    """graph_dsv4: DSV4 DSpark decoder, dual-mode by batch type.

    embd batch: project main_x through each stage's wkv and inject K into the ring cache;
    token batch: the noise block through full DSV4 stages (hc + attention + MoE), Markov head.
    """

    def __init__(self, params: GraphParams):
        super().__init__(params)
        from .deepseek4 import build_attention, build_hc_head, build_hc_post, build_hc_pre
        if self.ubatch.is_embd:
            self.build_dsv4_inject("inp_g_embeddings")
            return
        model = self.model
        inp_tokens = self.build_inp_tokens()
        inpL = self.build_hc_init(inp_tokens)
        for il in range(self.n_layer):
            layer = model.layers[il]
            residual = inpL
            attn_hc = build_hc_pre(self, inpL, layer.hc_attn_fn, layer.hc_attn_scale, layer.hc_attn_base, il)
            cur = attn_hc.cur
            self.cb(cur, "hc_attn_pre", il)
            cur = self.build_norm(cur, layer.attn_norm, None, il)
            self.cb(cur, "attn_norm", il)
            cur = build_attention(self, self.inp_attn, cur, self.inp_pos, il)
            inpL = build_hc_post(self, cur, residual, attn_hc.post, attn_hc.comb, il)
            self.cb(inpL, "hc_attn_post", il)

            residual = inpL
            ffn_hc = build_hc_pre(self, inpL, layer.hc_ffn_fn, layer.hc_ffn_scale, layer.hc_ffn_base, il)
            cur = ffn_hc.cur
            self.cb(cur, "hc_ffn_pre", il)
            cur = self.build_norm(cur, layer.ffn_norm, None, il)
            self.cb(cur, "ffn_norm", il)
            cur = self.build_dsv4_ffn(cur, il)
            inpL = build_hc_post(self, cur, residual, ffn_hc.post, ffn_hc.comb, il)
            self.cb(inpL, "l_out", il)

        cur = build_hc_head(self, inpL, model.hc_head_fn, model.hc_head_scale, model.hc_head_base)
        self.cb(cur, "hc_head", -1)
        # the confidence head reads the collapsed streams before the output norm, as the trained head did
        self.res.t_embd = cur
        self.build_output(cur, inp_tokens)


class GraphDSV41(_GraphBackbone):
    """graph_dsv41: DeepSeek-V4.1 DSpark decoder (seed only), dual-mode like graph_dsv4.

    embd batch: every stage's kv_norm(wkv(main_x)) into its window ring ("main_x");
    token batch: [anchor, noise...] through the stages with single-pass mHC (the FFN pre-mix of a
    stage is the attention mix, and the next stage's attention takes the previous FFN mix), no
    per-head q norm, no hc_head. The whole block shares the anchor's mask row.
    """

    def __init__(self, params: GraphParams):
        super().__init__(params)
        from .deepseek4 import build_attention, build_hc_mixes, build_hc_post, build_hc_pre_weighted
        if not self.hparams.dsv4_hc_single_pass:
            raise ValueError("graph_dsv41 needs the single-pass mHC of DeepSeek-V4.1")
        if self.ubatch.is_embd:
            self.build_dsv4_inject("main_x")
            return
        ctx, model = self.ctx0, self.model
        inp_tokens = self.build_inp_tokens()
        inpL = self.build_hc_init(inp_tokens)
        # every query of a block attends like its anchor does (block-uniform mask)
        self.inp_attn.block_uniform = True
        pre_prev = None
        for il in range(self.n_layer):
            layer = model.layers[il]
            residual = inpL
            attn_mix = build_hc_mixes(self, inpL, layer.hc_attn_fn, layer.hc_attn_scale, layer.hc_attn_base, il)
            if pre_prev is None:
                # before any mix exists, the first stage reads stream 0 as it is
                cur = ggml_cont(ctx, ggml_view_2d(ctx, inpL, self.n_embd, self.n_tokens, G.nb(inpL, 2), 0))
            else:
                cur = build_hc_pre_weighted(self, inpL, pre_prev, il)
            self.cb(cur, "hc_attn_pre", il)
            cur = self.build_norm(cur, layer.attn_norm, None, il)
            self.cb(cur, "attn_norm", il)
            # non-causal: a block's queries read the window of injected context and all keys of their block
            cur = build_attention(self, self.inp_attn, cur, self.inp_pos, il, q_norm=False, name_qr=False)
            inpL = build_hc_post(self, cur, residual, attn_mix.post, attn_mix.comb, il)
            self.cb(inpL, "hc_attn_post", il)

            residual = inpL
            ffn_mix = build_hc_mixes(self, inpL, layer.hc_ffn_fn, layer.hc_ffn_scale, layer.hc_ffn_base, il)
            pre_prev = ffn_mix.pre
            cur = build_hc_pre_weighted(self, inpL, attn_mix.pre, il)
            self.cb(cur, "hc_ffn_pre", il)
            cur = self.build_norm(cur, layer.ffn_norm, None, il)
            self.cb(cur, "ffn_norm", il)
            cur = self.build_dsv4_ffn(cur, il)
            inpL = build_hc_post(self, cur, residual, ffn_mix.post, ffn_mix.comb, il)
            l_out = ggml_reshape_2d(ctx, inpL, self.n_embd * self.hparams.hc_mult, self.n_tokens)
            self.cb(l_out, "l_out", il)
            ggml_build_forward_expand(self.gf, l_out)

        # DSV4.1 has no hc_head weights: the streams collapse through the last FFN stage's pre-mix
        cur = build_hc_pre_weighted(self, inpL, pre_prev, -1)
        self.cb(cur, "hc_out", -1)
        # the confidence head reads the collapsed state before the output norm
        self.res.t_embd = cur
        self.build_output(cur, inp_tokens)


class GraphMistralLarge4(_GraphBackbone):
    """graph_mistral_large4: Mistral Large 4 DSpark (seed only), dual-mode like graph_dsv41.

    embd batch: the latent K of main_x (no attention norm) into the cache;
    token batch: [anchor, mask_1, ...] blocks through dense MLA stages (absorbed q_nope, latent
    attention, wv_b after attention), non-causal; softcap on the logits only; the Markov head's
    RNN gets the normed hidden state.
    """

    def __init__(self, params: GraphParams):
        super().__init__(params)
        # YaRN's parameters come from the context, as for every graph (graph.rope_params)
        if self.ubatch.is_embd:
            self._inject()
            return
        self._block()

    def rope(self, t):
        # no LeRoPE in the draft
        return ggml_rope_ext(self.ctx0, t, self.inp_pos, None, self.n_rot, self.rope_type, self.n_ctx_orig,
                             self.freq_base, self.freq_scale, self.ext_factor, self.attn_factor,
                             self.beta_fast, self.beta_slow)

    def build_kv(self, x, il: int):
        """Latent K = [rms(kv_cmpr), rope(k_pe)] of one token row; also the normed latent."""
        ctx, hp = self.ctx0, self.hparams
        layer = self.model.layers[il]
        rank, n_rot, n_tokens = hp.n_lora_kv, self.n_rot, self.n_tokens
        kv_cmpr_pe = ggml_mul_mat(ctx, layer.wkv_a_mqa, x)
        self.cb(kv_cmpr_pe, "kv_cmpr_pe", il)
        row = G.ggml_row_size(G.ttype(kv_cmpr_pe), rank + n_rot)
        kv_cmpr = ggml_view_2d(ctx, kv_cmpr_pe, rank, n_tokens, row, 0)
        kv_cmpr = self.build_norm(kv_cmpr, layer.attn_kv_a_norm, None, il)
        kv_cmpr = ggml_reshape_3d(ctx, kv_cmpr, rank, 1, n_tokens)
        self.cb(kv_cmpr, "kv_cmpr", il)
        k_pe = ggml_view_3d(ctx, kv_cmpr_pe, n_rot, 1, n_tokens, row, row,
                            G.ggml_row_size(G.ttype(kv_cmpr_pe), rank))
        k_pe = self.rope(k_pe)
        self.cb(k_pe, "k_pe", il)
        return ggml_concat(ctx, kv_cmpr, k_pe, 0), kv_cmpr

    def _inject(self):
        inp_g = build_inject_inp(self, self.model)
        self.cb(inp_g, "main_x", -1)
        for il in range(self.n_layer):
            kv = self.build_kv(inp_g, il)[0]
            self.cb(kv, "kv_injected", il)
            self.write_injected(kv, il)
        self.res.t_embd = inp_g
        ggml_build_forward_expand(self.gf, inp_g)

    def build_inp_noise(self, inp_tokens):
        """[anchor, mask_1, ..., mask_{k-1}] per block: slot k > 0 uses mask row k - 1."""
        ctx, hp, model = self.ctx0, self.hparams, self.model
        tok_embd = get_tok_embd(self, model)
        n_tokens, n_embd = self.n_tokens, self.n_embd
        n_blocks = len(np.unique(self.ubatch.seq))
        block_drafts = n_tokens // n_blocks if n_blocks > 0 else 0
        if block_drafts > 0 and n_tokens % n_blocks == 0 and block_drafts <= hp.block_size:
            anchors = ggml_view_2d(ctx, inp_tokens, 1, n_blocks, block_drafts * G.nb(inp_tokens, 0), 0)
            anchors = ggml_get_rows(ctx, tok_embd, ggml_cont_1d(ctx, anchors, n_blocks))
            inpL = ggml_reshape_3d(ctx, anchors, n_embd, 1, n_blocks)
            if block_drafts > 1:
                mask = model.dspark_mask_embd
                masks = ggml_view_3d(ctx, mask, n_embd, block_drafts - 1, 1, G.nb(mask, 1), G.nb(mask, 2), 0)
                masks = ggml_repeat_4d(ctx, ggml_cast(ctx, masks, G.GGML_TYPE_F32), n_embd, block_drafts - 1,
                                       n_blocks, 1)
                inpL = ggml_concat(ctx, inpL, masks, 1)
            inpL = ggml_reshape_2d(ctx, inpL, n_embd, n_tokens)
        else:
            # a batch that is not a draft block gets no mask embeddings
            inpL = ggml_get_rows(ctx, tok_embd, inp_tokens)
        self.cb(inpL, "inp_noise_embd", -1)
        return inpL

    def _block(self):
        ctx, hp, model = self.ctx0, self.hparams, self.model
        rank, n_rot, n_head, n_tokens = hp.n_lora_kv, self.n_rot, self.n_head, self.n_tokens
        k_mla, v_mla = hp.n_embd_head_k_mla, hp.n_embd_head_v_mla
        nope = k_mla - n_rot
        kq_scale = inv_sqrtf(k_mla)
        inp_tokens = self.build_inp_tokens()
        inpL = self.build_inp_noise(inp_tokens)
        # every query of a block attends like its anchor does (block-uniform mask)
        self.inp_attn.block_uniform = True
        for il in range(self.n_layer):
            layer = model.layers[il]
            cur = self.build_norm(inpL, layer.attn_norm, None, il)
            self.cb(cur, "attn_norm", il)

            q = ggml_mul_mat(ctx, layer.wq, cur)
            self.cb(q, "q", il)
            rs = G.ggml_row_size(G.ttype(q), k_mla)
            # shape: nope dims x tokens x heads
            q_nope = ggml_view_3d(ctx, q, nope, n_head, n_tokens, rs, rs * n_head, 0)
            q_nope = ggml_permute(ctx, q_nope, 0, 2, 1, 3)
            # shape: latent rank x heads x tokens
            q_nope_absorbed = ggml_mul_mat(ctx, layer.wk_b, q_nope)
            q_nope_absorbed = ggml_permute(ctx, q_nope_absorbed, 0, 2, 1, 3)
            self.cb(q_nope_absorbed, "q_nope_absorbed", il)
            q_pe = ggml_view_3d(ctx, q, n_rot, n_head, n_tokens, rs, rs * n_head,
                                G.ggml_row_size(G.ttype(q), nope))
            q_pe = self.rope(q_pe)
            self.cb(q_pe, "q_pe", il)
            Qcur = ggml_concat(ctx, q_nope_absorbed, q_pe, 0)
            self.cb(Qcur, "Qcur", il)

            Kcur, Vcur = self.build_kv(cur, il)
            self.cb(Kcur, "Kcur", il)

            # apply wv_b after attention, so the K rotation is already undone
            out = self.build_attn_k(self.inp_attn, None, None, None, Qcur, Kcur, Vcur, None, kq_scale, il)
            self.cb(out, "attn_latent", il)
            # latent rank x tokens x heads, decompressed to v dims x tokens x heads
            out = ggml_reshape_3d(ctx, out, rank, n_head, n_tokens)
            out = ggml_mul_mat(ctx, layer.wv_b, ggml_permute(ctx, out, 0, 2, 1, 3))
            out = ggml_cont_2d(ctx, ggml_permute(ctx, out, 0, 2, 1, 3), v_mla * n_head, n_tokens)
            cur = self.build_lora_mm(layer.wo, out, layer.wo_s)
            self.cb(cur, "attn_out", il)

            ffn_inp = ggml_add(ctx, cur, inpL)
            self.cb(ffn_inp, "ffn_inp", il)
            cur = self.build_norm(ffn_inp, layer.ffn_norm, None, il)
            self.cb(cur, "ffn_norm", il)
            cur = self.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, il)
            self.cb(cur, "ffn_out", il)
            inpL = ggml_add(ctx, cur, ffn_inp)
            self.cb(inpL, "l_out", il)

        cur = self.build_norm(inpL, model.output_norm, None, -1)
        self.cb(cur, "result_norm", -1)
        self.res.t_embd = cur
        output, output_s = get_lm_head(self, model)
        logits = self.build_lora_mm(output, cur, output_s)
        # the Markov bias is added after the softcap, not squashed by it
        cap = hp.f_final_logit_softcapping
        if cap:
            logits = ggml_scale(ctx, logits, recipf(cap))
            logits = ggml_tanh(ctx, logits)
            logits = ggml_scale(ctx, logits, cap)
        self.cb(logits, "result_output", -1)
        self.res.t_logits = logits
        if model.dspark_markov_w1 is not None:
            build_dspark_markov_head(self, model, inp_tokens, cur)
        else:
            ggml_build_forward_expand(self.gf, logits)


HEAD = Head("dspark", "draft-dspark", GraphDSpark, marker_tensor="markov_w1.weight",
            load_hparams=lambda m, hp, path: load_hparams_dspark(hp, path),
            load_tensors=load_tensors_dspark, tensors=DSPARK_TENSORS, equal_blocks=True, on_backbones=True,
            # conf: the confidence head; joint: the seed's RNN joint head
            synth_options={"markov_rank": 16, "joint": False, "sample_from_anchor": None, "conf": False},
            authors=("speculators",), markov=True, confidence=True, draft_vocab=True, anchor_row=True,
            title="DSpark")
