"""src/models/dflash.cpp: the DFlash decoder (graph_base, graph_dflash) and the encoder.

graph_base creates the inputs every head shares and provides the stages: build_inject (the
injection batch: target features fused by the encoder, K/V written into the cache),
build_inp_tokens, build_layers (the noise block through the decoder layers) and build_logits.
The heads (dflash2.py, dspark.py, lilicorr.py) assemble them and add their own part.

As in the seed, the loader half of the base backbone sits here too: its sliding-window keys
(load_hparams_base), the tensors every draft has and the base layers' tensors
(load_tensors_layers_base). The dispatch over heads and backbones is models/arch.py.
"""

from __future__ import annotations

import math

from ..errors import GGUFModelError
from ..graph import GraphContext, GraphParams, mul_mat_hadamard
from ..ops import ggml as G
from ..ops.cmath import inv_sqrtf, recipf
from ..ops.ggml import (ggml_add, ggml_build_forward_expand, ggml_fill, ggml_get_rows, ggml_mul,
                        ggml_new_tensor_1d, ggml_new_tensor_2d, ggml_new_tensor_3d, ggml_reshape_2d,
                        ggml_reshape_3d, ggml_rms_norm, ggml_rope_ext, ggml_rope_multi, ggml_scale,
                        ggml_set_input, ggml_set_output, ggml_set_rows, ggml_tanh)
from .conv import build_dflash2_conv
from .head import Head
from .loader import ARCH as LLM_ARCH
from .tensors import T, shapes_of


def kv(name: str) -> str:
    """The GGUF key of an architecture hparam (upstream's LLM_KV_* names under the arch prefix)."""
    return f"{LLM_ARCH}.{name}"


# --- loader ------------------------------------------------------------------------------------

def load_hparams_base(m, hp, path) -> None:
    """The base backbone's iSWA keys: a window needs a per-layer pattern naming a sliding layer
    (upstream asserts is_swa_any() otherwise, which would end the process)."""
    n_swa = m.get(kv("attention.sliding_window"), 0, kind="int")
    if n_swa < 0:
        raise GGUFModelError(f"{path}: key '{kv('attention.sliding_window')}' must be >= 0")
    if n_swa == 0:
        return
    pattern = m.get(kv("attention.sliding_window_pattern"), None, kind="array")
    if pattern is None:
        raise GGUFModelError(f"{path}: missing key '{kv('attention.sliding_window_pattern')}' "
                             "(required with a sliding window)")
    if len(pattern) != hp.n_layer:
        raise GGUFModelError(f"{path}: key '{kv('attention.sliding_window_pattern')}' has "
                             f"{len(pattern)} entries for {hp.n_layer} layers")
    if not any(pattern):
        raise GGUFModelError(f"{path}: key '{kv('attention.sliding_window_pattern')}' marks no "
                             "layer as sliding-window although a window is set")
    hp.n_swa = n_swa
    hp.swa_layers = [bool(p) for p in pattern]


# every draft's own tensors: the feature projection, norms, embeddings and lm head (b11739 takes
# a draft without embeddings or lm head only with the target's context, which graphgen refuses
# by name in the loader)
COMMON_TENSORS = [
    T("fc", "fc.weight", lambda hp, x: (hp.n_embd_inp_enc, hp.n_embd)),
    T("output_norm_enc", "enc.output_norm.weight", lambda hp, x: (hp.n_embd,)),
    T("output_norm", "output_norm.weight", lambda hp, x: (hp.n_embd,)),
    T("tok_embd", "token_embd.weight", lambda hp, x: (hp.n_embd, hp.n_vocab or None), required=False),
    T("output", "output.weight", lambda hp, x: (hp.n_embd, x.n_vocab_draft), required=False),
    T("fc_s", "fc.scale", lambda hp, x: (1,), required=False),
    T("output_s", "output.scale", lambda hp, x: (1,), required=False),
    # a draft vocabulary smaller than the target's: draft row -> target token id (i64); the lm
    # head then has that many rows
    T("d2t", "d2t", lambda hp, x: (x.n_vocab_draft,), required=False),
]

# load_tensors_layers_base: the decoder layers of the base backbone (attn_v is optional: without
# it V is the normed K, shared K/V); the *.scale tensors are the loader's per-layer pass
LAYER_TENSORS = [
    T("attn_norm", "blk.{il}.attn_norm.weight", lambda hp, x: (hp.n_embd,)),
    T("wq", "blk.{il}.attn_q.weight", lambda hp, x: (hp.n_embd, hp.n_embd_head_k * hp.n_head)),
    T("wk", "blk.{il}.attn_k.weight", lambda hp, x: (hp.n_embd, hp.n_embd_k_gqa)),
    T("wv", "blk.{il}.attn_v.weight", lambda hp, x: (hp.n_embd, hp.n_embd_v_gqa), required=False),
    T("wo", "blk.{il}.attn_output.weight", lambda hp, x: (hp.n_embd_head_k * hp.n_head, hp.n_embd)),
    T("attn_q_norm", "blk.{il}.attn_q_norm.weight", lambda hp, x: (hp.n_embd_head_k,)),
    T("attn_k_norm", "blk.{il}.attn_k_norm.weight", lambda hp, x: (hp.n_embd_head_k,)),
    T("attn_post_norm", "blk.{il}.post_attention_norm.weight", lambda hp, x: (hp.n_embd,), required=False),
    T("ffn_post_norm", "blk.{il}.post_ffw_norm.weight", lambda hp, x: (hp.n_embd,), required=False),
    T("out_scale", "blk.{il}.layer_output_scale.weight", lambda hp, x: (1,), required=False),
    T("attn_sinks", "blk.{il}.attn_sinks.weight", lambda hp, x: (hp.n_head,), required=False),
    T("ffn_norm", "blk.{il}.ffn_norm.weight", lambda hp, x: (hp.n_embd,)),
    T("ffn_gate", "blk.{il}.ffn_gate.weight", lambda hp, x: (hp.n_embd, hp.n_ff)),
    T("ffn_down", "blk.{il}.ffn_down.weight", lambda hp, x: (hp.n_ff, hp.n_embd)),
    T("ffn_up", "blk.{il}.ffn_up.weight", lambda hp, x: (hp.n_embd, hp.n_ff)),
] + [T(f"{attr}_s", f"blk.{{il}}.{name}.scale", lambda hp, x: (1,), required=False)
     for attr, name in (("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"), ("wo", "attn_output"),
                        ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down"), ("ffn_up", "ffn_up"))]

# rope_freqs has no layer index: layer 0 creates it, the others share it (TENSOR_DUPLICATED)
ROPE_FREQS = T("rope_freqs", "rope_freqs.weight", lambda hp, x: (hp.n_embd_head_k // 2,), required=False)


def load_tensors_common(hp, info) -> tuple[dict, list]:
    """Every draft's own tensors. Returns (shape per tensor name, ggml order with None for any
    size; required names)."""
    return shapes_of(COMMON_TENSORS, hp, info)


def load_tensors_layers_base(hp, info) -> tuple[dict, list]:
    """load_tensors_layers_base: the decoder layers of the base backbone."""
    return shapes_of(LAYER_TENSORS + [ROPE_FREQS], hp, info)


def build_inp_target_features(g: GraphContext, n_embd_inp: int):
    """The host-copy path of upstream's build_inp_target_features: an F32 [n_embd_inp, T] input."""
    embd = ggml_new_tensor_2d(g.ctx0, G.GGML_TYPE_F32, n_embd_inp, g.n_tokens)
    ggml_set_input(embd)
    g.add_input(embd, lambda p: p.ubatch.embd)
    return embd


def build_inject_inp(g: GraphContext, model):
    """Injection batch: the target features fused through the encoder (fc + encoder norm)."""
    inp_target = build_inp_target_features(g, g.hparams.n_embd_inp_enc)
    g.cb(inp_target, "inp_target_features", -1)
    inp_g = g.build_lora_mm(model.fc, inp_target, model.fc_s)
    return g.build_norm(inp_g, model.output_norm_enc, None, -1)


def get_tok_embd(g: GraphContext, model):
    # graphgen runs drafts that carry their own embeddings; the loader refuses the others
    return model.tok_embd


def get_lm_head(g: GraphContext, model):
    return model.output, model.output_s


class GraphBase(GraphContext):
    """Inputs and stages shared by the decoder graphs of the heads."""

    def __init__(self, params: GraphParams):
        super().__init__(params)
        hp = self.hparams
        self.n_embd_head = hp.n_embd_head_v
        self.inp_pos = self.build_inp_pos()
        self.use_iswa = hp.use_iswa
        self.inp_attn = self.build_attn_inp_kv_iswa() if self.use_iswa else self.build_attn_inp_kv()
        self.sections = G.rope_sections(hp.rope_sections)
        self.inp_tokens = None
        if not self.ubatch.is_embd:
            self.inp_tokens = ggml_new_tensor_1d(self.ctx0, G.GGML_TYPE_I32, self.n_tokens)
            ggml_set_input(self.inp_tokens)

    def build_rope(self, cur, pos):
        if self.rope_type == G.GGML_ROPE_TYPE_MROPE:
            return ggml_rope_multi(self.ctx0, cur, pos, None, self.n_rot, self.sections, self.rope_type,
                                   self.n_ctx_orig, self.freq_base, self.freq_scale, self.ext_factor,
                                   self.attn_factor, self.beta_fast, self.beta_slow)
        return ggml_rope_ext(self.ctx0, cur, pos, self.model.layers[0].rope_freqs, self.n_rot, self.rope_type,
                             self.n_ctx_orig, self.freq_base, self.freq_scale, self.ext_factor,
                             self.attn_factor, self.beta_fast, self.beta_slow)

    # KV cache injection
    def build_inject(self):
        ctx, hp, model = self.ctx0, self.hparams, self.model
        inp_g = build_inject_inp(self, model)
        self.cb(inp_g, "inp_g_embeddings", -1)
        for il in range(self.n_layer):
            layer = model.layers[il]
            Kcur = self.build_lora_mm(layer.wk, inp_g, layer.wk_s)
            shared_kv = layer.wv is None
            Vcur = Kcur if shared_kv else self.build_lora_mm(layer.wv, inp_g, layer.wv_s)
            Kcur = ggml_reshape_3d(ctx, Kcur, self.n_embd_head, self.n_head_kv, self.n_tokens)
            Vcur = ggml_reshape_3d(ctx, Vcur, self.n_embd_head, self.n_head_kv, self.n_tokens)
            Kcur = self.build_norm(Kcur, layer.attn_k_norm, None, il)
            if shared_kv:
                Vcur = ggml_rms_norm(ctx, Vcur, hp.f_norm_rms_eps)
            Kcur = self.build_rope(Kcur, self.inp_pos)
            self.cb(Kcur, "Kcur_injected", il)
            self.cb(Vcur, "Vcur_injected", il)
            # route each layer's K/V to its sub-cache: SWA layers to the sliding cache
            is_swa = self.use_iswa and hp.is_swa(il)
            slot = self.inp_attn.slot(is_swa)
            # a quantized cache holds rotated rows, as build_attn writes them
            k_rot, v_rot = self.inp_attn.get_k_rot(is_swa), self.inp_attn.get_v_rot(is_swa)
            if k_rot is not None:
                Kcur = mul_mat_hadamard(ctx, Kcur, k_rot)
            if v_rot is not None:
                Vcur = mul_mat_hadamard(ctx, Vcur, v_rot)
            ggml_build_forward_expand(self.gf, slot.cache.cpy_k(ctx, Kcur, self.inp_attn.get_k_idxs(is_swa), il))
            ggml_build_forward_expand(self.gf, slot.cache.cpy_v(ctx, Vcur, self.inp_attn.get_v_idxs(is_swa), il))
        self.res.t_embd = inp_g
        ggml_build_forward_expand(self.gf, inp_g)
        return inp_g

    def build_inp_tokens(self):
        self.add_input(self.inp_tokens, lambda p: p.ubatch.tokens)
        return self.inp_tokens

    def build_layers(self, inp_tokens):
        ctx, hp, model = self.ctx0, self.hparams, self.model
        kq_scale = hp.f_attention_scale if hp.f_attention_scale != 0.0 else inv_sqrtf(self.n_embd_head)
        inpL = ggml_get_rows(ctx, get_tok_embd(self, model), inp_tokens)
        if hp.f_embedding_scale != 0.0:
            inpL = ggml_scale(ctx, inpL, hp.f_embedding_scale)
        self.cb(inpL, "inp_noise_embd", -1)
        for il in range(self.n_layer):
            layer = model.layers[il]
            noise_norm = self.build_norm(inpL, layer.attn_norm, None, il)
            self.cb(noise_norm, "noise_norm", il)
            attn_dynamic = None
            if layer.dflash_attn_conv_proj is not None:
                attn_dynamic = self.build_lora_mm(layer.dflash_attn_conv_proj, noise_norm)
                noise_norm = build_dflash2_conv(self, noise_norm, attn_dynamic, layer.dflash_attn_conv_base, 0)
                self.cb(noise_norm, "attn_conv_in", il)
            Qcur = self.build_lora_mm(layer.wq, noise_norm, layer.wq_s)
            Kcur = self.build_lora_mm(layer.wk, noise_norm, layer.wk_s)
            shared_kv = layer.wv is None
            Vcur = Kcur if shared_kv else self.build_lora_mm(layer.wv, noise_norm, layer.wv_s)
            Qcur = ggml_reshape_3d(ctx, Qcur, self.n_embd_head, self.n_head, self.n_tokens)
            Kcur = ggml_reshape_3d(ctx, Kcur, self.n_embd_head, self.n_head_kv, self.n_tokens)
            Vcur = ggml_reshape_3d(ctx, Vcur, self.n_embd_head, self.n_head_kv, self.n_tokens)
            Qcur = self.build_norm(Qcur, layer.attn_q_norm, None, il)
            Kcur = self.build_norm(Kcur, layer.attn_k_norm, None, il)
            if shared_kv:
                Vcur = ggml_rms_norm(ctx, Vcur, hp.f_norm_rms_eps)
            Qcur = self.build_rope(Qcur, self.inp_pos)
            Kcur = self.build_rope(Kcur, self.inp_pos)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)
            # cache-aware attention, non-causal unless the draft says otherwise
            cur = self.build_attn(self.inp_attn, layer.wo, None, layer.wo_s, Qcur, Kcur, Vcur,
                                  layer.attn_sinks, kq_scale, il)
            if hp.f_attn_value_scale != 0.0:
                cur = ggml_scale(ctx, cur, hp.f_attn_value_scale)
                self.cb(cur, "attn_out_scaled", il)
            if attn_dynamic is not None:
                cur = build_dflash2_conv(self, cur, attn_dynamic, layer.dflash_attn_conv_base, 1)
                self.cb(cur, "attn_conv_out", il)
            if layer.attn_post_norm is not None:
                cur = self.build_norm(cur, layer.attn_post_norm, None, il)
                self.cb(cur, "attn_post_norm", il)
            ffn_inp = ggml_add(ctx, cur, inpL)
            self.cb(ffn_inp, "ffn_inp", il)
            cur = self.build_norm(ffn_inp, layer.ffn_norm, None, il)
            self.cb(cur, "ffn_norm", il)
            ffn_dynamic = None
            if layer.dflash_ffn_conv_proj is not None:
                ffn_dynamic = self.build_lora_mm(layer.dflash_ffn_conv_proj, cur)
                cur = build_dflash2_conv(self, cur, ffn_dynamic, layer.dflash_ffn_conv_base, 0)
                self.cb(cur, "ffn_conv_in", il)
            cur = self.build_ffn(cur, layer.ffn_up, layer.ffn_up_s, layer.ffn_gate, layer.ffn_gate_s,
                                 layer.ffn_down, layer.ffn_down_s, il)
            self.cb(cur, "ffn_out", il)
            if ffn_dynamic is not None:
                cur = build_dflash2_conv(self, cur, ffn_dynamic, layer.dflash_ffn_conv_base, 1)
                self.cb(cur, "ffn_conv_out", il)
            if layer.ffn_post_norm is not None:
                cur = self.build_norm(cur, layer.ffn_post_norm, None, il)
                self.cb(cur, "ffn_post_norm", il)
            cur = ggml_add(ctx, cur, ffn_inp)
            if layer.out_scale is not None:
                cur = ggml_mul(ctx, cur, layer.out_scale)
            self.cb(cur, "l_out", il)
            inpL = cur
        cur = self.build_norm(inpL, model.output_norm, None, -1)
        self.cb(cur, "result_norm", -1)
        self.res.t_embd = cur
        return cur

    def build_logits(self, cur):
        ctx, hp, model = self.ctx0, self.hparams, self.model
        output, output_s = get_lm_head(self, model)
        cur = self.build_lora_mm(output, cur, output_s)
        # DFlash2 feeds these logits to its selector, so they take the target's output transforms
        if model.variant == "dflash2":
            if hp.f_logit_scale != 0.0:
                cur = ggml_scale(ctx, cur, hp.f_logit_scale)
            if hp.f_final_logit_softcapping > 0.0:
                cur = ggml_scale(ctx, cur, recipf(hp.f_final_logit_softcapping))
                cur = ggml_tanh(ctx, cur)
                cur = ggml_scale(ctx, cur, hp.f_final_logit_softcapping)
        # reduced-draft-vocab exports: scatter the draft logits to the target vocabulary via d2t
        if model.d2t is not None:
            n_draft_vocab, n_outputs = G.ne(cur, 0), G.ne(cur, 1)
            n_vocab = hp.n_vocab
            logits = ggml_fill(ctx, ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 1, n_vocab, n_outputs), -math.inf)
            cur = ggml_set_rows(ctx, logits, ggml_reshape_3d(ctx, cur, 1, n_draft_vocab, n_outputs),
                                ggml_reshape_3d(ctx, model.d2t, n_draft_vocab, 1, 1))
            cur = ggml_reshape_2d(ctx, cur, n_vocab, n_outputs)
        self.cb(cur, "result_output", -1)
        self.res.t_logits = cur
        # not expanded here: the heads expand their outputs first (DSpark's confidences lead the graph)
        return cur


class GraphDFlash(GraphBase):
    """Plain DFlash: the backbone and the lm head, read greedily by the driver."""

    def __init__(self, params: GraphParams):
        super().__init__(params)
        if self.ubatch.is_embd:
            self.build_inject()
            return
        inp_tokens = self.build_inp_tokens()
        cur = self.build_layers(inp_tokens)
        cur = self.build_logits(cur)
        ggml_build_forward_expand(self.gf, cur)


class GraphEncoder(GraphContext):
    """The DFlash encoder (graph<true>): target features through fc and the encoder norm."""

    def __init__(self, params: GraphParams):
        super().__init__(params)
        model = self.model
        cur = ggml_new_tensor_2d(self.ctx0, G.GGML_TYPE_F32, self.hparams.n_embd_inp_enc, self.n_tokens)
        ggml_set_input(cur)
        self.add_input(cur, lambda p: p.ubatch.embd)
        self.cb(cur, "inp_embd", -1)
        cur = self.build_lora_mm(model.fc, cur, model.fc_s)
        self.cb(cur, "fc_out", -1)
        cur = self.build_norm(cur, model.output_norm_enc, None, -1)
        self.cb(cur, "enc_norm_out", -1)
        ggml_set_output(cur)
        self.res.t_h_nextn = cur
        ggml_build_forward_expand(self.gf, cur)


# the plain head: what a draft is when no other head's marker is there
HEAD = Head("dflash", "draft-dflash", GraphDFlash, on_backbones=True, authors=("zlab", "speculators"), title="DFlash")
