"""GraphContext: graphgen's llm_graph_context.

Naming (`cb`), inputs, and the shared builders (build_norm, build_lora_mm, build_ffn,
build_attn with its KV cache and masks) live here once, so model files hold no ctypes. Each
helper issues the same ggml calls in the same order as upstream's, because node order is
ggml's depth-first visit from each ggml_build_forward_expand and auto names (`node_<i>`,
` (reshaped)`) come from that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .ops import ggml as G
from .ops.ggml import (ggml_add, ggml_build_forward_expand, ggml_cast, ggml_cont, ggml_cont_2d,
                       ggml_flash_attn_ext, ggml_flash_attn_ext_add_sinks, ggml_geglu_split, ggml_mul,
                       ggml_mul_mat, ggml_permute, ggml_prec_set_acc, ggml_reshape_2d, ggml_rms_norm,
                       ggml_soft_max_add_sinks, ggml_soft_max_ext, ggml_swiglu_split, ggml_transpose, ggml_view_4d)

GRAPH_MAX_NODES = 16384


@dataclass
class MemSlot:
    """One (sub-)cache as a graph sees it: the cache, the batch's cells and n_kv."""
    cache: object
    idxs: list
    n_kv: int


@dataclass
class AttnInput:
    """llm_graph_input_attn_kv(_iswa): index inputs and masks of the base and SWA caches."""
    base: MemSlot
    self_k_idxs: object = None
    self_v_idxs: object = None
    self_kq_mask: object = None
    swa: MemSlot | None = None
    self_k_idxs_swa: object = None
    self_v_idxs_swa: object = None
    self_kq_mask_swa: object = None
    # Hadamard rotations are null for f16/f32 caches, the only cache types graphgen builds
    self_k_rot: object = None
    self_v_rot: object = None

    def slot(self, is_swa: bool) -> MemSlot:
        return self.swa if is_swa else self.base

    def get_k_idxs(self, is_swa=False):
        return self.self_k_idxs_swa if is_swa else self.self_k_idxs

    def get_v_idxs(self, is_swa=False):
        return self.self_v_idxs_swa if is_swa else self.self_v_idxs

    def get_kq_mask(self, is_swa=False):
        return self.self_kq_mask_swa if is_swa else self.self_kq_mask


@dataclass
class GraphParams:
    model: object
    ubatch: object
    mem: dict                      # {"base": MemSlot, "swa": MemSlot?}
    flash_attn: bool = False
    causal_attn: bool = False
    graph_type: str = "decoder"    # or "encoder"


@dataclass
class GraphResult:
    gf: object = None
    t_logits: object = None
    t_embd: object = None
    t_h_nextn: object = None
    inputs: list = field(default_factory=list)  # (tensor, callable -> ndarray)


class GraphContext:
    def __init__(self, params: GraphParams):
        self.params = params
        self.model = params.model
        self.hparams = hp = params.model.hparams
        self.ubatch = params.ubatch
        self.n_tokens = params.ubatch.n_tokens
        self.n_layer = hp.n_layer
        self.n_embd = hp.n_embd
        self.n_head = hp.n_head
        self.n_head_kv = hp.n_head_kv
        self.n_rot = hp.n_rot
        self.rope_type = hp.rope_type
        self.n_ctx_orig = hp.n_ctx_train
        self.freq_base = hp.rope_freq_base
        self.freq_scale = hp.rope_freq_scale
        self.ext_factor = 0.0
        self.attn_factor = 1.0
        self.beta_fast = 32.0
        self.beta_slow = 1.0
        self.flash_attn = params.flash_attn
        self.res = GraphResult()
        mem_size = G.ggml_tensor_overhead() * GRAPH_MAX_NODES + G.ggml_graph_overhead_custom(GRAPH_MAX_NODES, False)
        self.ctx0 = G.ggml_init(G.ggml_init_params(mem_size=mem_size, mem_buffer=None, no_alloc=True))
        self.gf = G.ggml_new_graph_custom(self.ctx0, GRAPH_MAX_NODES, False)
        self.res.gf = self.gf

    def free(self):
        if self.ctx0:
            G.ggml_free(self.ctx0)
            self.ctx0 = None

    # -- naming and inputs ------------------------------------------------------------------
    def cb(self, t, name: str, il: int):
        G.set_name(t, f"{name}-{il}" if il >= 0 else name)

    def add_input(self, t, values):
        self.res.inputs.append((t, values))

    def build_inp_pos(self):
        n = self.n_tokens * self.hparams.n_pos_per_embd
        cur = G.ggml_new_tensor_1d(self.ctx0, G.GGML_TYPE_I32, n)
        G.ggml_set_input(cur)
        self.cb(cur, "inp_pos", -1)
        ub, npe = self.ubatch, self.hparams.n_pos_per_embd

        def values():
            p = ub.pos.astype(np.int32)
            if npe == 1:
                return p
            # M-RoPE: section-major rows; text positions fill 3 rows and the 4th is 0
            return np.concatenate([p, p, p, np.zeros_like(p)])
        self.add_input(cur, values)
        return cur

    def _build_attn_inp_kq_mask(self, slot: MemSlot, name: str):
        dtype = G.GGML_TYPE_F16 if self.flash_attn else G.GGML_TYPE_F32
        t = G.ggml_new_tensor_4d(self.ctx0, dtype, slot.n_kv, self.n_tokens, 1, 1)
        G.ggml_set_input(t)
        G.set_name(t, name)
        causal = self.params.causal_attn
        npdt = np.float16 if self.flash_attn else np.float32
        ub = self.ubatch
        self.add_input(t, lambda: slot.cache.kq_mask_values(ub, slot.n_kv, causal, npdt))
        return t

    def _build_idxs(self, slot: MemSlot):
        k = slot.cache.build_input_k_idxs(self.ctx0, self.n_tokens)
        v = slot.cache.build_input_v_idxs(self.ctx0, self.n_tokens)
        self.add_input(k, lambda: slot.cache.k_idxs_values(slot.idxs))
        self.add_input(v, lambda: slot.cache.v_idxs_values(slot.idxs))
        return k, v

    def build_attn_inp_kv(self) -> AttnInput:
        inp = AttnInput(base=self.params.mem["base"])
        inp.self_k_idxs, inp.self_v_idxs = self._build_idxs(inp.base)
        inp.self_kq_mask = self._build_attn_inp_kq_mask(inp.base, "attn_inp_kq_mask")
        return inp

    def build_attn_inp_kv_iswa(self) -> AttnInput:
        inp = AttnInput(base=self.params.mem["base"], swa=self.params.mem["swa"])
        inp.self_k_idxs, inp.self_v_idxs = self._build_idxs(inp.base)
        inp.self_kq_mask = self._build_attn_inp_kq_mask(inp.base, "attn_inp_kq_mask")
        inp.self_k_idxs_swa, inp.self_v_idxs_swa = self._build_idxs(inp.swa)
        inp.self_kq_mask_swa = self._build_attn_inp_kq_mask(inp.swa, "attn_inp_kq_mask")
        return inp

    # -- shared builders --------------------------------------------------------------------
    def build_lora_mm(self, w, cur, w_s=None):
        res = ggml_mul_mat(self.ctx0, w, cur)
        if w_s is not None:
            res = ggml_mul(self.ctx0, res, w_s)
        return res

    def build_norm(self, cur, mw, mb, il: int):
        """LLM_NORM_RMS, the only norm the DFlash family uses."""
        cur = ggml_rms_norm(self.ctx0, cur, self.hparams.f_norm_rms_eps)
        if mw is not None or mb is not None:
            self.cb(cur, "norm", il)
        if mw is not None:
            cur = ggml_mul(self.ctx0, cur, mw)
            if mb is not None:
                self.cb(cur, "norm_w", il)
        if mb is not None:
            cur = ggml_add(self.ctx0, cur, mb)
        return cur

    def build_ffn(self, cur, up, up_s, gate, gate_s, down, down_s, il: int):
        """LLM_FFN_PAR with SiLU (SwiGLU) or GELU (GeGLU), no biases."""
        ctx = self.ctx0
        tmp = self.build_lora_mm(up, cur)
        self.cb(tmp, "ffn_up", il)
        if up_s is not None:
            tmp = ggml_mul(ctx, tmp, up_s)
            self.cb(tmp, "ffn_up_s", il)
        cur = self.build_lora_mm(gate, cur)
        self.cb(cur, "ffn_gate", il)
        if gate_s is not None:
            cur = ggml_mul(ctx, cur, gate_s)
            self.cb(cur, "ffn_gate_s", il)
        if self.hparams.ffn_op == "gelu":
            cur = ggml_geglu_split(ctx, cur, tmp)
            self.cb(cur, "ffn_geglu", il)
        else:
            cur = ggml_swiglu_split(ctx, cur, tmp)
            self.cb(cur, "ffn_swiglu", il)
        cur = self.build_lora_mm(down, cur)
        if down_s is not None:
            cur = ggml_mul(ctx, cur, down_s)
            self.cb(cur, "ffn_down_s", il)
        return cur

    def build_attn_mha(self, q, k, v, kq_mask, sinks, kq_scale: float, il: int):
        ctx = self.ctx0
        v_trans = G.nb(v, 1) > G.nb(v, 2)
        n_stream = G.ne(k, 3)
        q = ggml_view_4d(ctx, q, G.ne(q, 0), G.ne(q, 1), G.ne(q, 2) // n_stream, n_stream,
                         G.nb(q, 1), G.nb(q, 2), G.nb(q, 2) * (G.ne(q, 2) // n_stream), 0)
        q = ggml_permute(ctx, q, 0, 2, 1, 3)
        k = ggml_permute(ctx, k, 0, 2, 1, 3)
        v = ggml_permute(ctx, v, 0, 2, 1, 3)
        if self.flash_attn:
            if v_trans:
                v = ggml_transpose(ctx, v)
            if G.ttype(k) == G.GGML_TYPE_F32:
                k = ggml_cast(ctx, k, G.GGML_TYPE_F16)
            if G.ttype(v) == G.GGML_TYPE_F32:
                v = ggml_cast(ctx, v, G.GGML_TYPE_F16)
            cur = ggml_flash_attn_ext(ctx, q, k, v, kq_mask, kq_scale, 0.0, 0.0)
            ggml_flash_attn_ext_add_sinks(cur, sinks)
            ggml_prec_set_acc(cur)
            cur = ggml_reshape_2d(ctx, cur, G.ne(cur, 0) * G.ne(cur, 1), G.ne(cur, 2) * G.ne(cur, 3))
        else:
            kq = ggml_mul_mat(ctx, k, q)
            self.cb(kq, "kq", il)
            ggml_prec_set_acc(kq)
            kq = ggml_soft_max_ext(ctx, kq, kq_mask, kq_scale, 0.0)
            ggml_soft_max_add_sinks(kq, sinks)
            self.cb(kq, "kq_soft_max", il)
            if not v_trans:
                v = ggml_cont(ctx, ggml_transpose(ctx, v))
                self.cb(v, "v_cont", il)
            kqv = ggml_mul_mat(ctx, v, kq)
            self.cb(kqv, "kqv", il)
            cur = ggml_permute(ctx, kqv, 0, 2, 1, 3)
            cur = ggml_cont_2d(ctx, cur, G.ne(cur, 0) * G.ne(cur, 1), G.ne(cur, 2) * G.ne(cur, 3))
        ggml_build_forward_expand(self.gf, cur)
        return cur

    def build_attn(self, inp: AttnInput, wo, wo_b, wo_s, q_cur, k_cur, v_cur, sinks, kq_scale, il):
        """build_attn over the unified cache (inp.swa is None) or the iSWA pair."""
        ctx, gf = self.ctx0, self.gf
        iswa = inp.swa is not None
        is_swa = iswa and self.hparams.is_swa(il)
        # upstream expands q, v, k for the unified cache and q, k, v for iSWA
        ggml_build_forward_expand(gf, q_cur)
        if iswa:
            ggml_build_forward_expand(gf, k_cur)
            ggml_build_forward_expand(gf, v_cur)
        else:
            ggml_build_forward_expand(gf, v_cur)
            ggml_build_forward_expand(gf, k_cur)
        slot = inp.slot(is_swa)
        ggml_build_forward_expand(gf, slot.cache.cpy_k(ctx, k_cur, inp.get_k_idxs(is_swa), il))
        ggml_build_forward_expand(gf, slot.cache.cpy_v(ctx, v_cur, inp.get_v_idxs(is_swa), il))
        k = slot.cache.get_k(ctx, il, slot.n_kv)
        v = slot.cache.get_v(ctx, il, slot.n_kv)
        cur = self.build_attn_mha(q_cur, k, v, inp.get_kq_mask(is_swa), sinks, kq_scale, il)
        self.cb(cur, "kqv_out", il)
        if wo is not None:
            cur = self.build_lora_mm(wo, cur, wo_s)
        if wo_b is not None:
            cur = ggml_add(ctx, cur, wo_b)
        return cur
