"""src/models/dflash2.cpp: DFlash2 = DFlash + a block-local dynamic conv in the layers and a
candidate selector that packs top-k candidates and their transition scores into h_nextn.

The head's loader sits here as in the seed: its metadata checks (load_hparams_dflash2) and the
selector tensors (load_tensors_dflash2). The conv itself (build_dflash2_conv and its tensors) is
in conv.py: the base layers run it too, and LiliCorr loads its tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGUFModelError
from ..graph import GraphParams
from ..ops import ggml as G
from ..ops.ggml import (ggml_add, ggml_build_forward_expand, ggml_cast, ggml_concat, ggml_cont, ggml_cont_1d,
                        ggml_fill, ggml_get_rows, ggml_mul, ggml_mul_mat, ggml_new_tensor_3d, ggml_pad,
                        ggml_repeat, ggml_repeat_4d, ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d,
                        ggml_reshape_4d, ggml_top_k, ggml_view_2d, ggml_view_3d)
from .conv import load_tensors_dflash2_conv, n_seqs_unq
from .dflash import GraphBase, kv
from .head import Head
from .tensors import T, shapes_of


# the selector's token tables and hidden projection
DFLASH2_TENSORS = [
    T("dflash_selector_prev", "selector_predecessor.weight", lambda hp, x: (hp.selector_rank, hp.n_vocab or None)),
    T("dflash_selector_next", "selector_successor.weight", lambda hp, x: (hp.selector_rank, hp.n_vocab or None)),
    T("dflash_selector_hidden", "selector_hidden.weight", lambda hp, x: (hp.n_embd, hp.selector_rank)),
]


@dataclass
class DFlash2HParams:
    """The candidate selector's rank and top-k (dflash.selector_* keys, read for every draft)."""
    selector_rank: int = 0
    selector_top_k: int = 0


def load_hparams_dflash2(hp, path) -> None:
    """The selector and conv keys a DFlash2 draft cannot run without, and the lattice's room in
    h_nextn: top_k candidates plus top_k x top_k transitions per row."""
    if not (hp.selector_rank > 0 and hp.selector_top_k > 0 and hp.conv_kernel_size > 0 and hp.conv_group_size > 0):
        raise GGUFModelError(f"{path}: DFlash2 model is missing conv/selector metadata "
                             f"(keys '{kv('selector_rank')}', '{kv('selector_top_k')}', "
                             f"'{kv('conv_kernel_size')}', '{kv('conv_group_size')}')")
    if hp.block_size <= 0:
        raise GGUFModelError(f"{path}: DFlash2 model is missing conv/selector metadata (key '{kv('block_size')}')")
    if hp.n_embd < hp.selector_top_k * (hp.selector_top_k + 1):
        raise GGUFModelError(f"{path}: DFlash2 hidden size is too small for the selector lattice "
                             f"(key '{kv('selector_top_k')}' = {hp.selector_top_k})")


def load_tensors_dflash2(hp) -> tuple[dict, list]:
    """The selector's tensors, then the conv tensors."""
    shapes, required = shapes_of(DFLASH2_TENSORS, hp)
    conv = load_tensors_dflash2_conv(hp)
    return {**shapes, **conv}, required + list(conv)


def build_dflash2_selector(g, model, tokens):
    """The selector (build_dflash2_selector): for each block position its top-k candidate ids and
    the candidate-to-candidate transition scores, laid out in h_nextn rows for the driver's lattice walk."""
    ctx0 = g.ctx0
    res = g.res

    hparams = g.hparams
    n_tokens = g.n_tokens
    n_embd = g.n_embd

    top_k = hparams.selector_top_k
    rank = hparams.selector_rank
    n_blocks = n_seqs_unq(g.ubatch)
    if not (n_blocks > 0 and n_tokens % n_blocks == 0):
        raise ValueError("the DFlash2 selector needs equal-size blocks")
    if G.ne(res.t_logits, 1) != n_tokens:
        raise ValueError("the DFlash2 selector needs logits for every token")
    if tokens is None:
        return

    tokens_per_block = n_tokens // n_blocks
    block_size = min(tokens_per_block, hparams.block_size)
    row_used = top_k + top_k * top_k

    candidates = ggml_top_k(ctx0, res.t_logits, top_k)
    logits_rows = ggml_reshape_3d(ctx0, res.t_logits, 1, G.ne(res.t_logits, 0), n_tokens)
    unary = ggml_reshape_2d(ctx0, ggml_get_rows(ctx0, logits_rows, candidates), top_k, n_tokens)
    gate = g.build_lora_mm(model.dflash_selector_hidden, res.t_embd)

    # shapes below are [.., tokens_per_block, n_blocks]: positions inside a block are the inner
    # axis, one block (one sequence) per outer index
    cand_blk = ggml_reshape_3d(ctx0, candidates, top_k, tokens_per_block, n_blocks)
    unary_blk = ggml_reshape_3d(ctx0, unary, top_k, tokens_per_block, n_blocks)
    gate_blk = ggml_reshape_3d(ctx0, gate, rank, tokens_per_block, n_blocks)

    # scoring position p needs the candidates of p-1 and p only, so every position of a run
    # is scored by the same batched matmul
    def score_run(beg_pos, n_pos, pred_ids):
        cand_run = ggml_cont(ctx0, ggml_view_3d(ctx0, cand_blk, top_k, n_pos, n_blocks,
                                                G.nb(cand_blk, 1), G.nb(cand_blk, 2), beg_pos * G.nb(cand_blk, 1)))
        unary_run = ggml_cont(ctx0, ggml_view_3d(ctx0, unary_blk, top_k, n_pos, n_blocks,
                                                 G.nb(unary_blk, 1), G.nb(unary_blk, 2), beg_pos * G.nb(unary_blk, 1)))
        gate_run = ggml_cont(ctx0, ggml_view_3d(ctx0, gate_blk, rank, n_pos, n_blocks,
                                                G.nb(gate_blk, 1), G.nb(gate_blk, 2), beg_pos * G.nb(gate_blk, 1)))

        n_pred = G.ne(pred_ids, 0) // (n_pos * n_blocks)

        successor = ggml_reshape_4d(ctx0,
                                    ggml_get_rows(ctx0, model.dflash_selector_next,
                                                  ggml_reshape_1d(ctx0, cand_run, top_k * n_pos * n_blocks)),
                                    rank, top_k, n_pos, n_blocks)
        predecessor = ggml_reshape_4d(ctx0, ggml_get_rows(ctx0, model.dflash_selector_prev, pred_ids),
                                      rank, n_pred, n_pos, n_blocks)

        gate_bcast = ggml_reshape_4d(ctx0, gate_run, rank, 1, n_pos, n_blocks)
        cond = ggml_mul(ctx0, predecessor, ggml_repeat(ctx0, gate_bcast, predecessor))
        score = ggml_mul_mat(ctx0, successor, cond)
        if n_pred == 1:
            score = ggml_repeat_4d(ctx0, score, top_k, top_k, n_pos, n_blocks)
        unary_bcast = ggml_reshape_4d(ctx0, unary_run, top_k, 1, n_pos, n_blocks)
        score = ggml_add(ctx0, score, ggml_repeat(ctx0, unary_bcast, score))

        row = ggml_concat(ctx0,
                          ggml_cast(ctx0, cand_run, G.GGML_TYPE_F32),
                          ggml_reshape_3d(ctx0, score, top_k * top_k, n_pos, n_blocks), 0)
        return ggml_pad(ctx0, row, n_embd - row_used, 0, 0, 0)

    packed = ggml_fill(ctx0, ggml_new_tensor_3d(ctx0, G.GGML_TYPE_F32, n_embd, 1, n_blocks), 0.0)

    if block_size > 1:
        # position 1 is scored apart: what precedes it is the block's anchor, a single known
        # token per sequence, not a set of candidates
        anchor_ids = ggml_cont_1d(ctx0,
                                  ggml_view_2d(ctx0, tokens, 1, n_blocks, tokens_per_block * G.nb(tokens, 0), 0),
                                  n_blocks)
        packed = ggml_concat(ctx0, packed, score_run(1, 1, anchor_ids), 1)
    if block_size > 2:
        prev_ids = ggml_reshape_1d(ctx0,
                                   ggml_cont(ctx0, ggml_view_3d(ctx0, cand_blk, top_k, block_size - 2, n_blocks,
                                                                G.nb(cand_blk, 1), G.nb(cand_blk, 2),
                                                                G.nb(cand_blk, 1))),
                                   top_k * (block_size - 2) * n_blocks)
        packed = ggml_concat(ctx0, packed, score_run(2, block_size - 2, prev_ids), 1)

    packed = ggml_reshape_2d(ctx0, packed, n_embd, block_size * n_blocks)
    g.cb(packed, "dflash2_lattice", -1)
    res.t_h_nextn = packed
    ggml_build_forward_expand(g.gf, packed)


class GraphDFlash2(GraphBase):
    """graph_dflash2: the conv backbone and lm head, then the selector lattice."""

    def __init__(self, params: GraphParams):
        super().__init__(params)
        if self.ubatch.is_embd:
            self.build_inject()
            return

        inp_tokens = self.build_inp_tokens()
        cur = self.build_layers(inp_tokens)

        self.build_logits(cur)

        build_dflash2_selector(self, self.model, inp_tokens)


HEAD = Head("dflash2", "draft-dflash2", GraphDFlash2, marker_tensor="selector_hidden.weight",
            load_hparams=lambda m, hp, path: load_hparams_dflash2(hp, path),
            load_tensors=lambda hp, info: load_tensors_dflash2(hp), tensors=DFLASH2_TENSORS, loads_conv=True,
            # the selector reshapes the batch into blocks and keeps block_size lattice rows per block
            equal_blocks=True, lattice_per_row=True,
            synth_options={"selector_rank": 8, "selector_top_k": 2, "conv_kernel_size": 3, "conv_group_size": 16},
            authors=("zlab", "speculators"), selector=True, title="DFlash2")
