"""GraphContext: graphgen's llm_graph_context.

Naming (`cb`), inputs, and the shared builders (build_norm, build_lora_mm, build_ffn,
build_attn with its KV cache and masks) live here once, so model files hold no ctypes. Each
helper issues the same ggml calls in the same order as upstream's, because node order is
ggml's depth-first visit from each ggml_build_forward_expand and auto names (`node_<i>`,
` (reshaped)`) come from that order.

Long because it follows llama-graph.cpp's llm_graph_context: the inputs, the attention with its
masks and caches, the FFN and MoE builders every model file calls.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .ops import ggml as G
from .ops.cmath import inv_sqrtf, logf
from .ops.ggml import (ggml_add, ggml_build_forward_expand, ggml_cast, ggml_cont, ggml_cont_2d,
                       ggml_flash_attn_ext, ggml_flash_attn_ext_add_sinks, ggml_geglu_split, ggml_mul,
                       ggml_mul_mat, ggml_permute, ggml_prec_set_acc, ggml_reshape_2d, ggml_rms_norm,
                       ggml_soft_max_add_sinks, ggml_soft_max_ext, ggml_swiglu_split, ggml_transpose, ggml_view_4d)


def graph_max_nodes(hparams, n_tensors: int, n_tokens: int) -> int:
    """llama_context::graph_max_nodes for a DFlash draft: the node budget of every graph of a
    context (b11549's rule, which b11739 keeps): the DeepSeek-V4 backbones' hyper-connections get
    40 per token or 32 per tensor, DFlash2's shape-heavy convolutions and selector 12 per tensor,
    the rest 8 per tensor, never under 1024."""
    if hparams.hc_mult > 0:
        return max(n_tokens * 40, 32 * n_tensors)
    if hparams.selector_rank > 0:
        return max(1024, 12 * n_tensors)
    return max(1024, 8 * n_tensors)


def graph_capacity(max_nodes: int) -> int:
    """What a graph is built in: room past the budget, so that an over-budget graph is counted and
    refused (as the budget's breach would abort llama.cpp) instead of aborting graphgen in ggml."""
    return 2 * max_nodes + 4096


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
    # Hadamard rotations of quantized caches (None for f16/f32 caches and head sizes that are not
    # a multiple of 64): one per (sub-)cache, shared by its layers
    self_k_rot: object = None
    self_v_rot: object = None
    self_k_rot_swa: object = None
    self_v_rot_swa: object = None

    def slot(self, is_swa: bool) -> MemSlot:
        return self.swa if is_swa else self.base

    def get_k_idxs(self, is_swa=False):
        return self.self_k_idxs_swa if is_swa else self.self_k_idxs

    def get_v_idxs(self, is_swa=False):
        return self.self_v_idxs_swa if is_swa else self.self_v_idxs

    def get_kq_mask(self, is_swa=False):
        return self.self_kq_mask_swa if is_swa else self.self_kq_mask

    def get_k_rot(self, is_swa=False):
        return self.self_k_rot_swa if is_swa else self.self_k_rot

    def get_v_rot(self, is_swa=False):
        return self.self_v_rot_swa if is_swa else self.self_v_rot


@dataclass
class GraphParams:
    model: object
    ubatch: object
    mem: dict                      # {"base": MemSlot, "swa": MemSlot?}
    flash_attn: bool = False
    causal_attn: bool = False
    graph_type: str = "decoder"    # or "encoder"
    max_nodes: int = 16384         # the context's node budget (graph_max_nodes)


@dataclass
class GraphResult:
    gf: object = None
    t_logits: object = None
    t_embd: object = None
    t_h_nextn: object = None
    inputs: list = field(default_factory=list)  # (tensor, callable -> ndarray)

    def set_outputs(self):
        """llm_graph_result::set_outputs: what is read back after compute keeps its memory (the
        allocator may otherwise hand an intermediate's buffer to a later node)."""
        for t in (self.t_logits, self.t_embd, self.t_h_nextn):
            if t is not None:
                G.ggml_set_output(t)



GGML_HINT_SRC0_IS_HADAMARD = 1


def mul_mat_hadamard(ctx, cur, rot):
    """llama_mul_mat_hadamard: rotate every rot->ne[0] consecutive values of cur by the orthonormal
    Hadamard matrix rot, keeping cur's shape."""
    n = G.ne(rot, 0)
    if not G.ggml_is_contiguous(cur):
        res = ggml_cont_2d(ctx, cur, n, G.nelements(cur) // n)
    else:
        res = ggml_reshape_2d(ctx, cur, n, G.nelements(cur) // n)
    res = ggml_mul_mat(ctx, rot, res)
    G.ggml_mul_mat_set_hint(res, GGML_HINT_SRC0_IS_HADAMARD)
    return G.ggml_reshape_4d(ctx, res, G.ne(cur, 0), G.ne(cur, 1), G.ne(cur, 2), G.ne(cur, 3))


@dataclass(frozen=True)
class RopeParams:
    """The rope parameters a graph passes to every ggml_rope_ext / ggml_rope_multi."""
    n_ctx_orig: int
    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float
    beta_slow: float


def rope_params(hp) -> RopeParams:
    """llama_context's rope cparams for a context made with the default context params (what the
    reference runner and the drivers create), worked in float32 as upstream does.

    The scaling type "none" turns the trained frequency scale off; YaRN sets ext_factor 1 and an
    attention factor of mscale(factor) (over mscale(factor, yarn_log_multiplier) when that key is
    read, i.e. on the Mistral Large 4 backbone), which is then divided by 1 + 0.1 ln(factor) again
    because ggml's YaRN kernel applies that magnitude correction itself; rope.scaling.attn_factor
    multiplies in last, whatever the type. original_context_length (0: the training context) is the
    rope's n_ctx_orig."""
    f32 = np.float32
    with np.errstate(all="ignore"):
        freq_scale = f32(1.0) if hp.rope_scaling_type == "none" else f32(hp.rope_freq_scale)
        yarn = hp.rope_scaling_type == "yarn"
        attn = f32(1.0)
        if yarn:
            factor = f32(1.0) / freq_scale

            def mscale(scale, m):
                return f32(1.0) if scale <= f32(1.0) else f32(f32(0.1) * f32(m)) * logf(scale) + f32(1.0)
            if hp.rope_yarn_log_mul != 0.0:
                attn = mscale(factor, 1.0) / mscale(factor, hp.rope_yarn_log_mul)
            else:
                attn = mscale(factor, 1.0)
            attn = attn * (f32(1.0) / (f32(1.0) + f32(0.1) * logf(factor)))
        attn = f32(attn * f32(hp.rope_attn_factor))
    n_ctx_orig = hp.n_ctx_orig_yarn if hp.n_ctx_orig_yarn != 0 else hp.n_ctx_train
    # a C int in the op's parameters: a u32 past 2^31 wraps as it does upstream
    n_ctx_orig = (int(n_ctx_orig) + (1 << 31)) % (1 << 32) - (1 << 31)
    return RopeParams(n_ctx_orig=n_ctx_orig, freq_base=hp.rope_freq_base, freq_scale=float(freq_scale),
                      ext_factor=1.0 if yarn else 0.0, attn_factor=float(attn),
                      beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow)


@functools.lru_cache(maxsize=None)
def hadamard(n: int) -> np.ndarray:
    """The orthonormal Sylvester-Hadamard matrix of order n (a power of two), float32 as
    llama.cpp fills it: every entry is +-(1 / sqrtf(n)) rounded once. Read-only: it is shared by
    every graph that sets a rotation input."""
    h = np.ones((1, 1), dtype=np.float32) * np.float32(inv_sqrtf(n))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    h = np.ascontiguousarray(h, dtype=np.float32)
    h.flags.writeable = False
    return h


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
        rope = rope_params(hp)
        self.n_ctx_orig = rope.n_ctx_orig
        self.freq_base = rope.freq_base
        self.freq_scale = rope.freq_scale
        self.ext_factor = rope.ext_factor
        self.attn_factor = rope.attn_factor
        self.beta_fast = rope.beta_fast
        self.beta_slow = rope.beta_slow
        self.flash_attn = params.flash_attn
        self.res = GraphResult()
        cap = graph_capacity(params.max_nodes)
        mem_size = G.ggml_tensor_overhead() * cap + G.ggml_graph_overhead_custom(cap, False)
        self.ctx0 = G.ggml_init(G.ggml_init_params(mem_size=mem_size, mem_buffer=None, no_alloc=True))
        self.gf = G.ggml_new_graph_custom(self.ctx0, cap, False)
        self.res.gf = self.gf

    def free(self):
        if self.ctx0:
            G.ggml_free(self.ctx0)
            self.ctx0 = None

    # -- naming and inputs ------------------------------------------------------------------
    def cb(self, t, name: str, il: int):
        G.set_name(t, f"{name}-{il}" if il >= 0 else name)

    def add_input(self, t, values):
        """values(params) gives the input's data for the batch in `params` (graphs are reused)."""
        self.res.inputs.append((t, values))

    def build_inp_pos(self):
        n = self.n_tokens * self.hparams.n_pos_per_embd
        cur = G.ggml_new_tensor_1d(self.ctx0, G.GGML_TYPE_I32, n)
        G.ggml_set_input(cur)
        self.cb(cur, "inp_pos", -1)
        npe = self.hparams.n_pos_per_embd

        def values(params):
            p = np.asarray(params.ubatch.pos, dtype=np.int32)
            if npe == 1:
                return p
            # M-RoPE: section-major rows; text positions fill 3 rows and the 4th is 0
            return np.concatenate([p, p, p, np.zeros_like(p)])
        self.add_input(cur, values)
        return cur

    def _build_attn_inp_kq_mask(self, key: str, name: str):
        dtype = G.GGML_TYPE_F16 if self.flash_attn else G.GGML_TYPE_F32
        t = G.ggml_new_tensor_4d(self.ctx0, dtype, self.params.mem[key].n_kv, self.n_tokens, 1, 1)
        G.ggml_set_input(t)
        G.set_name(t, name)
        npdt = np.float16 if self.flash_attn else np.float32

        def into(p, out=None):
            slot = p.mem[key]
            return slot.cache.kq_mask_values(p.ubatch, slot.n_kv, p.causal_attn, npdt, out=out)

        def values(p):
            return into(p)
        # the largest input: on a host backend it is written in place, not built and copied
        values.into = into
        self.add_input(t, values)
        return t

    def _build_idxs(self, key: str):
        slot = self.params.mem[key]
        k = slot.cache.build_input_k_idxs(self.ctx0, self.n_tokens)
        v = slot.cache.build_input_v_idxs(self.ctx0, self.n_tokens)
        self.add_input(k, lambda p: p.mem[key].cache.k_idxs_values(p.mem[key].idxs))
        self.add_input(v, lambda p: p.mem[key].cache.v_idxs_values(p.mem[key].idxs))
        return k, v

    def _build_rot(self, key: str, which: str):
        """The cache's Hadamard matrix input ("attn_inp_k_rot" / "attn_inp_v_rot"), or None."""
        cache = self.params.mem[key].cache
        n = cache.n_rot_k if which == "k" else cache.n_rot_v
        if not n:
            return None
        t = G.ggml_new_tensor_2d(self.ctx0, G.GGML_TYPE_F32, n, n)
        G.ggml_set_input(t)
        G.set_name(t, f"attn_inp_{which}_rot")
        self.add_input(t, lambda p: hadamard(n))
        return t

    def build_attn_inp_kv(self) -> AttnInput:
        inp = AttnInput(base=self.params.mem["base"])
        inp.self_k_idxs, inp.self_v_idxs = self._build_idxs("base")
        inp.self_kq_mask = self._build_attn_inp_kq_mask("base", "attn_inp_kq_mask")
        inp.self_k_rot, inp.self_v_rot = self._build_rot("base", "k"), self._build_rot("base", "v")
        return inp

    def build_attn_inp_kv_iswa(self) -> AttnInput:
        inp = AttnInput(base=self.params.mem["base"], swa=self.params.mem["swa"])
        inp.self_k_idxs, inp.self_v_idxs = self._build_idxs("base")
        inp.self_kq_mask = self._build_attn_inp_kq_mask("base", "attn_inp_kq_mask")
        inp.self_k_idxs_swa, inp.self_v_idxs_swa = self._build_idxs("swa")
        inp.self_kq_mask_swa = self._build_attn_inp_kq_mask("swa", "attn_inp_kq_mask")
        inp.self_k_rot, inp.self_v_rot = self._build_rot("base", "k"), self._build_rot("base", "v")
        inp.self_k_rot_swa, inp.self_v_rot_swa = self._build_rot("swa", "k"), self._build_rot("swa", "v")
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
        k_rot, v_rot = inp.get_k_rot(is_swa), inp.get_v_rot(is_swa)
        # quantized caches store rotated K and V; a rotated q scores the same, and the output is
        # rotated back (the matrices are their own inverse)
        if k_rot is not None:
            q_cur = mul_mat_hadamard(ctx, q_cur, k_rot)
            k_cur = mul_mat_hadamard(ctx, k_cur, k_rot)
        if v_rot is not None:
            v_cur = mul_mat_hadamard(ctx, v_cur, v_rot)
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
        if v_rot is not None:
            cur = mul_mat_hadamard(ctx, cur, v_rot)
        if wo is not None:
            cur = self.build_lora_mm(wo, cur, wo_s)
        if wo_b is not None:
            cur = ggml_add(ctx, cur, wo_b)
        return cur

    # -- the DSpark backbones (DeepSeek-V4, DeepSeek-V4.1, Mistral Large 4) --------------------
    def build_attn_inp_k_iswa(self) -> AttnInput:
        """llm_graph_input_attn_k_iswa: K-only caches (V is a view of the cached K), so K index
        inputs only. `inp.block_uniform` (set by DSV4.1 and ML4 after building) gives every query
        row of a block the mask row of the block's first query, the anchor."""
        inp = AttnInput(base=self.params.mem["base"], swa=self.params.mem["swa"])
        inp.block_uniform = False
        for key in ("base", "swa"):
            k = self.params.mem[key].cache.build_input_k_idxs(self.ctx0, self.n_tokens)
            self.add_input(k, lambda p, key=key: p.mem[key].cache.k_idxs_values(p.mem[key].idxs))
            dtype = G.GGML_TYPE_F16 if self.flash_attn else G.GGML_TYPE_F32
            mask = G.ggml_new_tensor_4d(self.ctx0, dtype, self.params.mem[key].n_kv, self.n_tokens, 1, 1)
            G.ggml_set_input(mask)
            G.set_name(mask, "attn_inp_kq_mask")
            npdt = np.float16 if self.flash_attn else np.float32

            def values(p, key=key, npdt=npdt):
                slot = p.mem[key]
                # only the sliding-window mask is block-uniform
                uniform = key == "swa" and inp.block_uniform
                return slot.cache.kq_mask_values(p.ubatch, slot.n_kv, p.causal_attn, npdt, block_uniform=uniform)
            self.add_input(mask, values)
            if key == "base":
                inp.self_k_idxs, inp.self_kq_mask = k, mask
            else:
                inp.self_k_idxs_swa, inp.self_kq_mask_swa = k, mask
        inp.self_k_rot, inp.self_k_rot_swa = self._build_rot("base", "k"), self._build_rot("swa", "k")
        return inp

    def build_attn_k(self, inp: AttnInput, wo, wo_b, wo_s, q_cur, k_cur, v_cur, sinks, kq_scale, il):
        """build_attn(llm_graph_input_attn_k_iswa *): write K only; V is the cached K's first
        v_cur->ne[0] elements (MLA style), so attention reads the latent or the K itself."""
        ctx, gf = self.ctx0, self.gf
        is_swa = self.hparams.is_swa(il)
        # V is read from the rotated K cache, so one rotation serves q, k and the output
        k_rot = inp.get_k_rot(is_swa)
        if k_rot is not None:
            q_cur = mul_mat_hadamard(ctx, q_cur, k_rot)
            if k_cur is not None:
                k_cur = mul_mat_hadamard(ctx, k_cur, k_rot)
        ggml_build_forward_expand(gf, q_cur)
        if k_cur is not None:
            ggml_build_forward_expand(gf, k_cur)
        slot = inp.slot(is_swa)
        if k_cur is not None:
            ggml_build_forward_expand(gf, slot.cache.cpy_k(ctx, k_cur, inp.get_k_idxs(is_swa), il))
        k = slot.cache.get_k(ctx, il, slot.n_kv)
        v = ggml_view_4d(ctx, k, G.ne(v_cur, 0), G.ne(k, 1), G.ne(k, 2), G.ne(k, 3),
                         G.nb(k, 1), G.nb(k, 2), G.nb(k, 3), 0)
        cur = self.build_attn_mha(q_cur, k, v, inp.get_kq_mask(is_swa), sinks, kq_scale, il)
        self.cb(cur, "kqv_out", il)
        if k_rot is not None:
            cur = mul_mat_hadamard(ctx, cur, k_rot)
        if wo is not None:
            cur = self.build_lora_mm(wo, cur, wo_s)
        if wo_b is not None:
            cur = ggml_add(ctx, cur, wo_b)
        return cur

    def build_ffn_limited(self, cur, up, gate, down, limit: float, il: int):
        """build_ffn (LLM_FFN_SILU, LLM_FFN_PAR, no biases or scales) with the per-layer SwiGLU
        clamp of DSV4 drafts: upstream's fused ggml_swiglu_clamp, "ffn_swiglu_limited";
        without a clamp, the plain "ffn_swiglu"."""
        tmp = self.build_lora_mm(up, cur)
        self.cb(tmp, "ffn_up", il)
        cur = self.build_lora_mm(gate, cur)
        self.cb(cur, "ffn_gate", il)
        if il >= 0 and limit > 1e-6:
            cur = G.ggml_swiglu_clamp(self.ctx0, cur, tmp, limit)
            self.cb(cur, "ffn_swiglu_limited", il)
        else:
            cur = ggml_swiglu_split(self.ctx0, cur, tmp)
            self.cb(cur, "ffn_swiglu", il)
        return self.build_lora_mm(down, cur)

    def build_moe_ffn(self, cur, gate_inp, up_exps, gate_exps, down_exps, exp_probs_b, n_expert: int,
                      n_expert_used: int, norm_w: bool, w_scale: float, gating: int, limit: float, il: int):
        """llm_graph_context::build_moe_ffn for the DSV4 drafts: SiLU experts with separate up and
        gate, optional selection bias, softmax / sigmoid / sqrt-softplus gating."""
        ctx, gf = self.ctx0, self.gf
        n_embd, n_tokens = G.ne(cur, 0), G.ne(cur, 1)
        logits = self.build_lora_mm(gate_inp, cur)
        if gating == 4:  # sqrt-softplus: F32 accumulation
            ggml_prec_set_acc(logits)
        self.cb(logits, "ffn_moe_logits", il)
        if gating == 1:
            probs = G.ggml_soft_max(ctx, logits)
        elif gating == 2:
            probs = G.ggml_sigmoid(ctx, logits)
        elif gating == 3:
            probs = logits
        elif gating == 4:
            probs = G.ggml_sqrt(ctx, G.ggml_softplus(ctx, logits))
        else:
            raise ValueError(f"unsupported expert gating function {gating}")
        self.cb(probs, "ffn_moe_probs", il)
        selection_probs = probs
        if exp_probs_b is not None:
            selection_probs = ggml_add(ctx, probs, exp_probs_b)
            self.cb(selection_probs, "ffn_moe_probs_biased", il)
        selected = G.ggml_argsort_top_k(ctx, selection_probs, n_expert_used)
        self.cb(selected.contents.src[0], "ffn_moe_argsort", il)
        self.cb(selected, "ffn_moe_topk", il)
        probs = G.ggml_reshape_3d(ctx, probs, 1, n_expert, n_tokens)
        weights = G.ggml_get_rows(ctx, probs, selected)
        self.cb(weights, "ffn_moe_weights", il)
        if gating == 3:
            weights = G.ggml_reshape_2d(ctx, weights, n_expert_used, n_tokens)
            weights = G.ggml_soft_max(ctx, weights)
            weights = G.ggml_reshape_3d(ctx, weights, 1, n_expert_used, n_tokens)
            self.cb(weights, "ffn_moe_weights_softmax", il)
        if norm_w:
            weights = G.ggml_reshape_2d(ctx, weights, n_expert_used, n_tokens)
            weights_sum = G.ggml_sum_rows(ctx, weights)
            self.cb(weights_sum, "ffn_moe_weights_sum", il)
            # avoid a division by zero: the smallest normal f16
            weights_sum = G.ggml_clamp(ctx, weights_sum, 6.103515625e-5, float("inf"))
            self.cb(weights_sum, "ffn_moe_weights_sum_clamped", il)
            weights = G.ggml_div(ctx, weights, weights_sum)
            self.cb(weights, "ffn_moe_weights_norm", il)
            weights = G.ggml_reshape_3d(ctx, weights, 1, n_expert_used, n_tokens)
        if w_scale != 0.0 and w_scale != 1.0:
            weights = G.ggml_scale(ctx, weights, w_scale)
            self.cb(weights, "ffn_moe_weights_scaled", il)
        # expanded early upstream, so that topk-moe fusion can see it
        ggml_build_forward_expand(gf, weights)
        cur = G.ggml_reshape_3d(ctx, cur, n_embd, 1, n_tokens)
        up = G.ggml_mul_mat_id(ctx, up_exps, cur, selected)
        self.cb(up, "ffn_moe_up", il)
        cur = G.ggml_mul_mat_id(ctx, gate_exps, cur, selected)
        self.cb(cur, "ffn_moe_gate", il)
        if il >= 0 and limit > 1e-6:
            cur = G.ggml_swiglu_clamp(ctx, cur, up, limit)
            self.cb(cur, "ffn_moe_swiglu_limited", il)
        else:
            cur = ggml_swiglu_split(ctx, cur, up)
            self.cb(cur, "ffn_moe_swiglu", il)
        experts = G.ggml_mul_mat_id(ctx, down_exps, cur, selected)
        self.cb(experts, "ffn_moe_down", il)
        experts = ggml_mul(ctx, experts, weights)
        self.cb(experts, "ffn_moe_weighted", il)
        ggml_build_forward_expand(gf, experts)
        # order the views before the adds
        cur_experts = []
        for i in range(n_expert_used):
            e = G.ggml_view_2d(ctx, experts, n_embd, n_tokens, G.nb(experts, 2), i * G.nb(experts, 1))
            cur_experts.append(e)
            ggml_build_forward_expand(gf, e)
        moe_out = cur_experts[0]
        for e in cur_experts[1:]:
            moe_out = ggml_add(ctx, moe_out, e)
            ggml_build_forward_expand(gf, moe_out)
        if n_expert_used == 1:
            # avoid returning a non-contiguous tensor
            moe_out = ggml_cont(ctx, moe_out)
        self.cb(moe_out, "ffn_moe_out", il)
        return moe_out
