"""src/models/dspark.cpp: DSpark = DFlash + a semi-autoregressive Markov head and Confidence head.

graphgen ports the base-backbone head (graph_dspark); the DeepSeek-V4 and Mistral Large 4
backbones are refused by the loader.
"""

from __future__ import annotations

import numpy as np

from ..graph import GraphParams
from ..ops import ggml as G
from ..ops.ggml import (ggml_add, ggml_argmax, ggml_build_forward_expand, ggml_concat, ggml_cont,
                        ggml_cont_1d, ggml_fill, ggml_get_rows, ggml_mul, ggml_mul_mat, ggml_new_tensor_2d,
                        ggml_new_tensor_3d, ggml_permute, ggml_repeat, ggml_reshape_2d, ggml_reshape_3d,
                        ggml_set_rows, ggml_sigmoid, ggml_sub, ggml_tanh, ggml_view_2d)
from .dflash import GraphBase


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

    # rnn head: gated state carried across block positions
    is_rnn = model.dspark_joint_proj is not None
    if is_rnn and hidden is None:
        raise ValueError("the DSpark RNN head (joint_proj) needs the backbone hidden state")

    base = res.t_logits  # [n_vocab, n_tokens]
    n_vocab = G.ne(base, 0)
    n_tok = G.ne(base, 1)

    block_size = g.hparams.block_size
    if block_size <= 0:
        raise ValueError("DSpark draft requires 'dflash.block_size' in GGUF metadata")

    # bonus anchor (SpecForge exports): slot 0 is a bonus token, not a prediction slot
    sample_from_anchor = g.hparams.sample_from_anchor
    i_draft_beg = 0 if sample_from_anchor else 1

    n_blocks = len(np.unique(g.ubatch.seq))
    if not (n_blocks > 0 and n_tok % n_blocks == 0):
        raise ValueError("DSpark markov head requires equal-size blocks")
    # runtime tokens per block in this ubatch (anchor + drafted positions), bounded by training block_size
    block_drafts = n_tok // n_blocks
    if block_drafts > block_size:
        return

    # anchor (committed last) token of every block: token 0 of each block, i.e. a strided view
    token_stride = block_drafts * G.nb(tokens, 0)
    base_stride = block_drafts * G.nb(base, 1)

    prev = ggml_view_2d(ctx0, tokens, 1, n_blocks, token_stride, 0)
    prev = ggml_cont_1d(ctx0, prev, n_blocks)

    cat = None
    cat_conf = None

    if not sample_from_anchor:
        # bonus anchor slot: pass the logits through unbiased, pad the (unread) confidence column
        cat = ggml_cont(ctx0, ggml_view_2d(ctx0, base, n_vocab, n_blocks, base_stride, 0))
        if has_conf:
            cat_conf = ggml_sigmoid(ctx0, ggml_view_2d(ctx0, base, 1, n_blocks, base_stride, 0))

    state = None  # [R, n_blocks]

    # the in-graph chain is greedy (argmax); sampling params affect only the final
    # token pick, not the Markov conditioning path
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

            # state = gate * state + (1 - gate) * cand
            state = ggml_add(ctx0, cand, ggml_mul(ctx0, gate, ggml_sub(ctx0, state, cand)))
            markov = ggml_tanh(ctx0, chunk(2))

        bias = g.build_lora_mm(w2, markov, model.dspark_markov_w2_s)  # [n_vocab_draft, n_blocks]
        if model.d2t is not None:
            # reduced draft vocab: scatter the bias to the target rows (base is -inf on the others)
            n_draft_vocab = G.ne(bias, 0)
            full = ggml_fill(ctx0, ggml_new_tensor_3d(ctx0, G.GGML_TYPE_F32, 1, n_vocab, n_blocks), 0.0)
            bias = ggml_set_rows(ctx0, full,
                                 ggml_reshape_3d(ctx0, bias, 1, n_draft_vocab, n_blocks),
                                 ggml_reshape_3d(ctx0, model.d2t, n_draft_vocab, 1, 1))
            bias = ggml_reshape_2d(ctx0, bias, n_vocab, n_blocks)

        # position i of every block: strided view [n_vocab, n_blocks]
        base_i = ggml_view_2d(ctx0, base, n_vocab, n_blocks, base_stride, i * G.nb(base, 1))
        col = ggml_add(ctx0, base_i, bias)

        cat = ggml_concat(ctx0, cat, col, 1) if cat is not None else col

        if has_conf:
            # confidence head input: predicts per-position acceptance
            conf_inp = res.t_embd  # [n_embd, n_tok]
            # conf(i) = sigmoid(conf_proj . [conf_inp(i); markov_w1[prev(i)]] + b) -- [1, n_blocks]
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

    # cat is position-major; restore ubatch block-major order
    out = ggml_reshape_3d(ctx0, cat, n_vocab, n_blocks, block_drafts)
    out = ggml_cont(ctx0, ggml_permute(ctx0, out, 0, 2, 1, 3))  # [n_vocab, block_drafts, n_blocks]
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

        # bias the draft logits with the Markov head
        build_dspark_markov_head(self, self.model, inp_tokens)
