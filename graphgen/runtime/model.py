"""GGUF -> hparams + weights on a backend: the loading every draft shares.

`load(path)` reads the metadata with gguf-py (memory-mapped), checks key types, reads the keys
every draft has, detects the head (variant, from tensors) and the backbone (from keys) as the
seed's load_arch_hparams does, and leaves the rest to the model files through
graphgen/models/arch.py: each head's and backbone's hparams, tensor shapes and checks sit beside
its graph (load_hparams_dsv4 in models/dspark.py, load_tensors_lilicorr in models/lilicorr.py...).
Every key and shape is validated before ggml sees it; the weights go into one backend buffer.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import validate as V
from ..errors import GGUFModelError
from ..models import arch, dflash2, dspark, lilicorr
from ..models.arch import (BACKBONE_BASE, BACKBONE_DSV4, BACKBONE_DSV41, BACKBONE_MISTRAL_LARGE4, VARIANT_DFLASH,
                           VARIANT_DFLASH2, VARIANT_DSPARK, VARIANT_LILICORR)
from ..models.dflash import LLM_ARCH as ARCH
from ..ops import ggml as G
from ..validate import check_memory, check_tensor_data, check_tensor_types

# gguf-py GGMLQuantizationType values graphgen can hold as weights
SUPPORTED_WEIGHT_TYPES = {0: "f32", 1: "f16", 8: "q8_0", 30: "bf16", 26: "i32", 27: "i64"}


@dataclass
class HParams:
    n_embd: int = 0
    n_layer: int = 0
    n_ff: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    n_embd_head_k: int = 0
    n_embd_head_v: int = 0
    n_rot: int = 0
    n_vocab: int = 0
    n_ctx_train: int = 0
    f_norm_rms_eps: float = 1e-6
    rope_freq_base: float = 10000.0
    # rope_freq_scale_train (1 / rope.scaling.factor, in float32 as upstream divides it)
    rope_freq_scale: float = 1.0
    # rope.scaling.type ("none", "linear", "yarn", "longrope"; absent: linear) and the two keys the
    # context folds into YaRN's parameters (rope.scaling.attn_factor, original_context_length)
    rope_scaling_type: str = "linear"
    rope_attn_factor: float = 1.0
    rope_sections: list = field(default_factory=lambda: [0, 0, 0, 0])
    n_swa: int = 0
    swa_layers: list = field(default_factory=list)
    f_attention_scale: float = 0.0
    f_embedding_scale: float = 0.0
    f_attn_value_scale: float = 0.0
    f_logit_scale: float = 0.0
    f_final_logit_softcapping: float = 0.0
    causal_attn: bool = False
    ffn_op: str = "silu"
    target_layers: list = field(default_factory=list)
    block_size: int = 0
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    mask_token_id: int = -1
    sample_from_anchor: bool = True
    lilicorr_hidden_size: int = 0
    lilicorr_candidate_topk: int = 0
    lilicorr_num_heads: int = 0
    lilicorr_layers: int = 0
    lilicorr_vector_eps: float = 0.0
    lilicorr_logit_scale: float = 0.0
    lilicorr_factor_dim: int = 0
    lilicorr_mlp_hidden_size: int = 0
    lilicorr: dict = field(default_factory=dict)
    hc_mult: int = 0
    n_lora_kv: int = 0
    # the DSpark backbones (seed: load_hparams_dsv4, load_hparams_mistral_large4)
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
    rope_yarn_log_mul: float = 0.0
    n_ctx_orig_yarn: int = 0
    # llama_hparams' defaults: no key of a DFlash draft sets them
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0

    @property
    def n_embd_inp_enc(self) -> int:
        return len(self.target_layers) * self.n_embd

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv

    @property
    def use_iswa(self) -> bool:
        return self.n_swa > 0

    def is_swa(self, il: int) -> bool:
        return self.use_iswa and il < len(self.swa_layers) and bool(self.swa_layers[il])

    @property
    def rope_type(self) -> int:
        if any(self.rope_sections):
            return G.GGML_ROPE_TYPE_MROPE
        # llama_model_rope_type: NORM for the DSV4 backbones
        if self.hc_mult > 0:
            return 0
        return G.GGML_ROPE_TYPE_NEOX

    @property
    def n_pos_per_embd(self) -> int:
        return 4 if self.rope_type == G.GGML_ROPE_TYPE_MROPE else 1

    def set_swa_uniform(self, n_swa: int) -> None:
        """One sliding window on every stage (upstream: set_swa_pattern(0), every layer is_swa)."""
        self.n_swa = n_swa
        self.swa_layers = [True] * self.n_layer


ROPE_FREQS = "rope_freqs.weight"


class Layer:
    """The per-layer tensors, under upstream's llama_layer field names (None when absent)."""

    FIELDS = {
        "attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
        "wv": "attn_v.weight", "wo": "attn_output.weight", "wq_s": "attn_q.scale",
        "wk_s": "attn_k.scale", "wv_s": "attn_v.scale", "wo_s": "attn_output.scale",
        "attn_q_norm": "attn_q_norm.weight", "attn_k_norm": "attn_k_norm.weight",
        "attn_post_norm": "post_attention_norm.weight", "ffn_post_norm": "post_ffw_norm.weight",
        "out_scale": "layer_output_scale.weight",
        "attn_sinks": "attn_sinks.weight", "ffn_norm": "ffn_norm.weight",
        "ffn_gate": "ffn_gate.weight", "ffn_down": "ffn_down.weight", "ffn_up": "ffn_up.weight",
        "ffn_gate_s": "ffn_gate.scale", "ffn_down_s": "ffn_down.scale", "ffn_up_s": "ffn_up.scale",
        "dflash_attn_conv_base": "attn_conv_base", "dflash_attn_conv_proj": "attn_conv_proj.weight",
        "dflash_ffn_conv_base": "ffn_conv_base", "dflash_ffn_conv_proj": "ffn_conv_proj.weight",
        # DeepSeek-V4 stages (load_tensors_layers_dsv4)
        "wq_a": "attn_q_a.weight", "attn_q_a_norm": "attn_q_a_norm.weight", "wq_b": "attn_q_b.weight",
        "wkv": "attn_kv.weight", "attn_kv_norm": "attn_kv_a_norm.weight", "wo_a": "attn_output_a.weight",
        "wo_b": "attn_output_b.weight", "hc_attn_fn": "hc_attn_fn.weight", "hc_attn_base": "hc_attn_base.weight",
        "hc_attn_scale": "hc_attn_scale.weight", "hc_ffn_fn": "hc_ffn_fn.weight",
        "hc_ffn_base": "hc_ffn_base.weight", "hc_ffn_scale": "hc_ffn_scale.weight",
        "ffn_gate_inp": "ffn_gate_inp.weight", "ffn_exp_probs_b": "exp_probs_b.bias",
        "ffn_gate_exps": "ffn_gate_exps.weight", "ffn_down_exps": "ffn_down_exps.weight",
        "ffn_up_exps": "ffn_up_exps.weight", "ffn_gate_shexp": "ffn_gate_shexp.weight",
        "ffn_down_shexp": "ffn_down_shexp.weight", "ffn_up_shexp": "ffn_up_shexp.weight",
        # Mistral Large 4 MLA stages (load_tensors_layers_mistral_large4)
        "wkv_a_mqa": "attn_kv_a_mqa.weight", "attn_kv_a_norm": "attn_kv_a_norm.weight",
        "wk_b": "attn_k_b.weight", "wv_b": "attn_v_b.weight",
    }

    def __init__(self, il: int, tensors: dict):
        self.il = il
        for attr, suffix in self.FIELDS.items():
            setattr(self, attr, tensors.get(f"blk.{il}.{suffix}"))
        # the rope frequency factors are one tensor without a layer index; upstream's loader
        # creates it for layer 0 and shares it with the other layers (TENSOR_DUPLICATED)
        self.rope_freqs = tensors.get(ROPE_FREQS)


# GGUF value types as llama.cpp's loader reads these keys: it requires the exact type (a u16 where
# a u32 belongs is "wrong type"), so graphgen refuses what it refuses. Arrays give (ARRAY, element).
U32, I32, F32, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9
KEY_TYPES = {
    "context_length": (U32,), "embedding_length": (U32,), "block_count": (U32,),
    "feed_forward_length": (U32, (ARR, U32), (ARR, I32)), "attention.head_count": (U32, (ARR, U32), (ARR, I32)),
    "attention.head_count_kv": (U32, (ARR, U32), (ARR, I32)), "attention.key_length": (U32,),
    "attention.value_length": (U32,), "rope.dimension_count": (U32,),
    "attention.layer_norm_rms_epsilon": (F32,), "rope.freq_base": (F32,), "rope.scaling.factor": (F32,),
    # the rope scaling keys llama_model_base::load_hparams reads for every architecture
    "rope.scale_linear": (F32,), "rope.scaling.type": (STR,), "rope.scaling.attn_factor": (F32,),
    "rope.scaling.original_context_length": (U32,), "rope.scaling.finetuned": (BOOL,),
    "rope.scaling.alpha": (F32,),
    "embedding_scale": (F32,), "attention.scale": (F32,), "attention.value_scale": (F32,),
    "logit_scale": (F32,), "final_logit_softcapping": (F32,), "attention.causal": (BOOL,),
    "hidden_activation": (STR,), "rope.dimension_sections": ((ARR, I32), (ARR, U32), I32),
    "block_size": (U32,), "conv_kernel_size": (U32,), "conv_group_size": (U32,),
    "selector_rank": (U32,), "selector_top_k": (U32,), "target_layers": ((ARR, I32), (ARR, U32)),
    "attention.sliding_window": (U32,), "attention.sliding_window_pattern": ((ARR, BOOL),),
    "hyper_connection.count": (U32,), "attention.kv_lora_rank": (U32,),
}
TOKENIZER_TYPES = {"tokenizer.ggml.model": (STR,), "tokenizer.ggml.tokens": ((ARR, STR),),
                   "tokenizer.ggml.scores": ((ARR, F32),), "tokenizer.ggml.token_type": ((ARR, I32),),
                   "tokenizer.ggml.mask_token_id": (U32,)}
TYPE_NAMES = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool", 8: "string",
              9: "array", 10: "u64", 11: "i64", 12: "f64"}


def _type_name(t) -> str:
    return f"{TYPE_NAMES.get(t[1], '?')}[]" if isinstance(t, tuple) else TYPE_NAMES.get(t, "?")


def expected_types(key: str):
    if key.startswith(ARCH + "."):
        return KEY_TYPES.get(key[len(ARCH) + 1:])
    return TOKENIZER_TYPES.get(key)


class GGUFMeta:
    """Typed access to GGUF metadata with errors that name the key (llama_model_loader's get_key)."""

    def check_types(self):
        """Every known key has the GGUF type llama.cpp's loader insists on."""
        for key, f in self.r.fields.items():
            want = expected_types(key)
            if want is None:
                continue
            try:
                have = int(f.types[0]) if int(f.types[0]) != ARR else (ARR, int(f.types[1]) if len(f.types) > 1 else -1)
            except (IndexError, ValueError, TypeError):
                raise GGUFModelError(f"{self.path}: key '{key}' is malformed") from None
            if have not in want:
                raise GGUFModelError(f"{self.path}: key '{key}' has type {_type_name(have)}, llama.cpp expects "
                                     + " or ".join(_type_name(w) for w in want))

    def __init__(self, reader, path):
        self.r = reader
        self.path = path

    def has(self, key):
        return key in self.r.fields

    def get(self, key, default=None, required=False, kind=None):
        f = self.r.fields.get(key)
        if f is None:
            if required:
                raise GGUFModelError(f"{self.path}: missing key '{key}'")
            return default
        try:
            vals = [f.parts[i] for i in f.data]
            is_array = int(f.types[0]) == 9
            if not is_array:
                v = vals[0]
                # a string goes through the kind checks too: a string where a number belongs is an error
                out = v.tobytes().decode() if int(f.types[0]) == 8 else v[0].item()
            elif len(f.types) > 1 and int(f.types[1]) == 8:
                out = [v.tobytes().decode() for v in vals]
            else:
                out = [v[0].item() for v in vals]
        except Exception as e:  # malformed field data
            raise GGUFModelError(f"{self.path}: key '{key}' is malformed ({e})") from None
        if kind == "int":
            if isinstance(out, list) or isinstance(out, float) or isinstance(out, str):
                raise GGUFModelError(f"{self.path}: key '{key}' must be an integer, got {out!r}")
            out = int(out)
        elif kind == "float":
            if isinstance(out, (list, str)):
                raise GGUFModelError(f"{self.path}: key '{key}' must be a number, got {out!r}")
            out = float(out)
        elif kind == "array":
            if not isinstance(out, list):
                out = [out]
        return out

    def get_key_or_arr(self, key, n_layer, kind="float", default=None) -> list:
        """One value for every layer, or an array of n_layer values (upstream's get_key_or_arr)."""
        v = self.get(key, default, required=default is None)
        vals = v if isinstance(v, list) else [v] * n_layer
        if len(vals) != n_layer:
            raise GGUFModelError(f"{self.path}: key '{key}' has {len(vals)} entries for {n_layer} layers")
        try:
            return [float(x) if kind == "float" else int(x) for x in vals]
        except (TypeError, ValueError):
            raise GGUFModelError(f"{self.path}: key '{key}' must hold numbers") from None


ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")


def _int32(v: int) -> int:
    """A GGUF integer as the C int it is stored in upstream (u32 values past 2^31 wrap)."""
    return (int(v) + (1 << 31)) % (1 << 32) - (1 << 31)


def read_rope_scaling(m, hp, path) -> None:
    """The rope scaling keys of llama_model_base::load_hparams, read for every backbone.

    The scaling type defaults to linear and must be a name upstream knows (it asserts otherwise,
    ending the process); the factor falls back to the old `rope.scale_linear` key and is kept as
    its float32 reciprocal; original_context_length defaults to the training context. The
    finetuned and alpha keys are read (and type-checked) but change nothing in a DFlash graph."""
    k = lambda s: f"{ARCH}.{s}"  # noqa: E731
    scaling = m.get(k("rope.scaling.type"), "linear")
    if scaling not in ROPE_SCALING_TYPES:
        raise GGUFModelError(f"{path}: key '{k('rope.scaling.type')}' = {scaling!r} is not a rope scaling type "
                             f"llama.cpp knows ({', '.join(ROPE_SCALING_TYPES)}); llama.cpp aborts on it")
    hp.rope_scaling_type = scaling
    factor = m.get(k("rope.scaling.factor"), None, kind="float")
    if factor is None:
        factor = m.get(k("rope.scale_linear"), 0.0, kind="float")
    with np.errstate(all="ignore"):
        hp.rope_freq_scale = 1.0 if factor == 0.0 else float(np.float32(1.0) / np.float32(factor))
    hp.rope_attn_factor = m.get(k("rope.scaling.attn_factor"), 1.0, kind="float")
    hp.n_ctx_orig_yarn = m.get(k("rope.scaling.original_context_length"), hp.n_ctx_train, kind="int")


def read_rope_sections(m, hp, path) -> None:
    """rope.dimension_sections as upstream's get_key_or_arr reads it: exactly 4 ints, or one int
    for all four. Any non-zero section makes the rope M-RoPE; graphgen then refuses what would
    stop ggml's CPU rope kernel (asserts, or a division by zero), which only runs the graph:
    sections must give the first three a positive one and sum to 1..head dimension (the rows the
    kernel builds its sin/cos cache over; rotation stops at n_rot, so sections may reach past
    n_rot/2). Entries are C ints: a u32 past 2^31 reads as negative, as it does upstream."""
    key = f"{ARCH}.rope.dimension_sections"
    sections = m.get(key, None)
    if sections is None:
        return
    if not isinstance(sections, list):
        sections = [sections] * 4
    if len(sections) != 4:
        raise GGUFModelError(f"{path}: key '{key}' has wrong array length; expected 4, got {len(sections)}")
    if any(not isinstance(s, int) or isinstance(s, bool) for s in sections):
        raise GGUFModelError(f"{path}: key '{key}' must hold 4 integers")
    sections = [_int32(s) for s in sections]
    hp.rope_sections = sections
    if not any(sections):
        return
    if not (sections[0] > 0 or sections[1] > 0 or sections[2] > 0):
        raise GGUFModelError(f"{path}: key '{key}' = {sections} makes the rope M-RoPE but gives none of the first "
                             "three sections a positive size (ggml's rope asserts on it)")
    total = _int32(sum(sections))
    if total == 0:
        raise GGUFModelError(f"{path}: key '{key}' = {sections} sums to 0 (ggml's rope divides by the sum)")
    if total > hp.n_embd_head_k:
        raise GGUFModelError(f"{path}: key '{key}' = {sections} sums to {total}, more than the head dimension "
                             f"{hp.n_embd_head_k} (ggml's rope asserts on it)")


def read_hparams(reader, path) -> tuple[HParams, str, str]:
    m = GGUFMeta(reader, path)
    m.check_types()
    arch_name = m.get("general.architecture", required=True)
    if arch_name != ARCH:
        raise GGUFModelError(f"{path}: general.architecture is '{arch_name}', graphgen drafts are '{ARCH}'")
    k = lambda s: f"{ARCH}.{s}"  # noqa: E731
    hp = HParams()
    hp.n_embd = m.get(k("embedding_length"), required=True, kind="int")
    hp.n_layer = m.get(k("block_count"), required=True, kind="int")
    hp.n_ff = m.get(k("feed_forward_length"), 0, kind="int")
    hp.n_head = m.get(k("attention.head_count"), required=True, kind="int")
    hp.n_head_kv = m.get(k("attention.head_count_kv"), hp.n_head, kind="int")
    hp.n_ctx_train = m.get(k("context_length"), required=True, kind="int")
    for key, val, lo, hi in ((k("embedding_length"), hp.n_embd, 1, 1 << 20),
                             (k("block_count"), hp.n_layer, 1, 4096),
                             (k("attention.head_count"), hp.n_head, 1, 1 << 16),
                             (k("attention.head_count_kv"), hp.n_head_kv, 1, 1 << 16),
                             (k("context_length"), hp.n_ctx_train, 1, 1 << 31),
                             (k("feed_forward_length"), hp.n_ff, 0, 1 << 24)):
        if not lo <= val <= hi:
            raise GGUFModelError(f"{path}: key '{key}' = {val} is out of range [{lo}, {hi}]")
    if hp.n_head % hp.n_head_kv:
        raise GGUFModelError(f"{path}: key '{k('attention.head_count')}' = {hp.n_head} is not a multiple "
                             f"of '{k('attention.head_count_kv')}' = {hp.n_head_kv}")
    default_head = hp.n_embd // hp.n_head
    hp.n_embd_head_k = m.get(k("attention.key_length"), default_head, kind="int")
    hp.n_embd_head_v = m.get(k("attention.value_length"), default_head, kind="int")
    if hp.n_embd_head_k <= 0 or hp.n_embd_head_v <= 0:
        raise GGUFModelError(f"{path}: head dimension must be positive (key '{k('attention.key_length')}')")
    hp.n_rot = m.get(k("rope.dimension_count"), hp.n_embd_head_k, kind="int")
    if hp.n_rot <= 0 or hp.n_rot > hp.n_embd_head_k or hp.n_rot % 2:
        raise GGUFModelError(f"{path}: key '{k('rope.dimension_count')}' = {hp.n_rot} must be even and "
                             f"<= the head dimension {hp.n_embd_head_k}")
    hp.f_norm_rms_eps = m.get(k("attention.layer_norm_rms_epsilon"), required=True, kind="float")
    # ggml's norms assert eps >= 0: a negative or NaN epsilon would abort the interpreter
    if not (math.isfinite(hp.f_norm_rms_eps) and hp.f_norm_rms_eps >= 0.0):
        raise GGUFModelError(f"{path}: key '{k('attention.layer_norm_rms_epsilon')}' = {hp.f_norm_rms_eps} "
                             "must be a finite number >= 0")
    hp.rope_freq_base = m.get(k("rope.freq_base"), 10000.0, kind="float")
    read_rope_scaling(m, hp, path)
    hp.f_embedding_scale = m.get(k("embedding_scale"), 0.0, kind="float")
    hp.f_attention_scale = m.get(k("attention.scale"), 0.0, kind="float")
    hp.f_attn_value_scale = m.get(k("attention.value_scale"), 0.0, kind="float")
    hp.f_logit_scale = m.get(k("logit_scale"), 0.0, kind="float")
    hp.f_final_logit_softcapping = m.get(k("final_logit_softcapping"), 0.0, kind="float")
    hp.causal_attn = bool(m.get(k("attention.causal"), False))
    act = m.get(k("hidden_activation"), "silu")
    if act in ("gelu", "gelu_pytorch_tanh"):
        hp.ffn_op = "gelu"
    elif act != "silu":
        raise GGUFModelError(f"{path}: unsupported DFlash hidden activation '{act}' (key '{k('hidden_activation')}')")
    read_rope_sections(m, hp, path)
    hp.block_size = m.get(k("block_size"), 0, kind="int")
    hp.conv_kernel_size = m.get(k("conv_kernel_size"), 0, kind="int")
    hp.conv_group_size = m.get(k("conv_group_size"), 0, kind="int")
    hp.selector_rank = m.get(k("selector_rank"), 0, kind="int")
    hp.selector_top_k = m.get(k("selector_top_k"), 0, kind="int")
    tl = m.get(k("target_layers"), None, kind="array")
    if tl is None:
        raise GGUFModelError(f"{path}: DFlash model requires 'target_layers' in GGUF metadata (key '{k('target_layers')}')")
    if not tl or any(not isinstance(x, int) for x in tl):
        raise GGUFModelError(f"{path}: key '{k('target_layers')}' must be a non-empty integer array")
    hp.target_layers = list(tl)
    tokens = m.get("tokenizer.ggml.tokens", None)
    hp.n_vocab = len(tokens) if isinstance(tokens, list) else 0
    hp.mask_token_id = m.get("tokenizer.ggml.mask_token_id", -1, kind="int")
    hp.hc_mult = m.get(k("hyper_connection.count"), 0, kind="int")
    # the DSpark graph reads the key as a string: absent or "true" means slot 0 is a prediction slot
    hp.sample_from_anchor = bool(m.get(k("sample_from_anchor"), True))
    hp.n_lora_kv = m.get(k("attention.kv_lora_rank"), 0, kind="int")

    # head: read from tensors, as the seed does
    names = {t.name for t in reader.tensors}
    has_lilicorr = m.has(k("lilicorr.hidden_size")) or m.has("lilicorr.hidden_size")
    if "markov_w1.weight" in names:
        variant = VARIANT_DSPARK
    elif "selector_hidden.weight" in names:
        variant = VARIANT_DFLASH2
    elif has_lilicorr:
        variant = VARIANT_LILICORR
    else:
        variant = VARIANT_DFLASH
    # backbone: read from keys, as the seed does
    if hp.hc_mult > 0:
        single_pass = bool(m.get(k("hyper_connection.single_pass"), False))
        backbone = BACKBONE_DSV41 if single_pass else BACKBONE_DSV4
    elif hp.n_lora_kv > 0:
        backbone = BACKBONE_MISTRAL_LARGE4
    else:
        backbone = BACKBONE_BASE
    arch.load_hparams(m, hp, variant, backbone, path)
    return hp, variant, backbone


class Model:
    """A loaded draft: hparams, variant, backbone and its weights in a backend buffer."""

    def __init__(self, path, backend=None):
        from gguf import GGUFReader

        self.path = Path(path)
        if not self.path.is_file():
            raise GGUFModelError(f"{self.path}: no such file")
        # the magic, then every count bounded by the file's size: gguf-py trusts the counts and can
        # loop for hours
        V.check_gguf_layout(self.path)
        try:
            reader = GGUFReader(str(self.path), "r")
        except Exception as e:  # gguf-py raises ValueError/IndexError/struct.error on truncation
            raise GGUFModelError(f"{self.path}: malformed or truncated GGUF ({type(e).__name__}: {e})") from None
        self.hparams, self.variant, self.backbone = read_hparams(reader, self.path)
        self._reader = reader
        self._check_tensors(reader)
        self.backend = backend
        self.tensors: dict = {}
        self._ctx = None
        self._buf = None
        if backend is not None:
            self.upload(backend)

    # -- validation -------------------------------------------------------------------------
    def _check_tensors(self, reader):
        hp = self.hparams
        seen = {}
        for t in reader.tensors:
            if t.name in seen:
                raise GGUFModelError(f"{self.path}: duplicated tensor '{t.name}'")
            seen[t.name] = t
            if int(t.tensor_type) not in SUPPORTED_WEIGHT_TYPES:
                raise GGUFModelError(f"{self.path}: tensor '{t.name}' has unsupported type {t.tensor_type.name}")
        check_tensor_types(reader, self.path)
        w1 = seen.get("markov_w1.weight")
        self._dspark_rank = int(w1.shape[0]) if w1 is not None else 0
        d2t = seen.get("d2t")
        self._n_vocab_draft = int(d2t.shape[0]) if d2t is not None else hp.n_vocab
        if d2t is not None and int(d2t.tensor_type) != 27:
            raise GGUFModelError(f"{self.path}: tensor 'd2t' must be i64")
        want, required = arch.load_tensors(hp, self.variant, self.backbone, self._dspark_rank, self._n_vocab_draft)
        for name in required:
            if name not in seen:
                raise GGUFModelError(f"{self.path}: missing tensor '{name}'")
        for name, t in seen.items():
            shape = tuple(int(x) for x in t.shape)
            if name.endswith(".attn_output_a.weight") and self.backbone in (BACKBONE_DSV4, BACKBONE_DSV41):
                # TENSOR_ALLOW_RESHAPE: {H*D/G, R, G}, or written 2-D as {H*D/G, R*G}
                G_, R = hp.dsv4_o_group_count, hp.dsv4_o_lora_rank
                exp3 = (hp.n_head * hp.n_embd_head_k // G_, R, G_)
                if shape not in (exp3, (exp3[0], R * G_)):
                    raise GGUFModelError(f"{self.path}: tensor '{name}' has shape {list(shape)}, expected "
                                         f"{list(exp3)}")
                continue
            exp = want.get(name)
            if exp is None:
                continue
            if len(shape) != len(exp) or any(w is not None and w != s for w, s in zip(exp, shape)):
                raise GGUFModelError(f"{self.path}: tensor '{name}' has shape {list(shape)}, expected "
                                     f"{[w if w is not None else '*' for w in exp]}")
        if "token_embd.weight" not in seen or ("output.weight" not in seen and d2t is not None):
            raise GGUFModelError(f"{self.path}: the draft has no 'token_embd.weight'/'output.weight'; "
                                 "graphgen runs drafts that carry their own embeddings and lm head")
        if hp.n_vocab == 0:
            hp.n_vocab = int(seen["token_embd.weight"].shape[1])
        if hp.mask_token_id >= hp.n_vocab:
            raise GGUFModelError(f"{self.path}: key 'tokenizer.ggml.mask_token_id' = {hp.mask_token_id} "
                                 f"is outside the vocabulary ({hp.n_vocab})")
        self._weight_bytes = check_tensor_data(reader, self.path, self.path.stat().st_size)
        # graph_dspark calls the Markov head without a hidden state, so upstream asserts on an RNN
        # head there; only the Mistral Large 4 backbone feeds it
        if "joint_proj.weight" in seen and self.backbone != BACKBONE_MISTRAL_LARGE4:
            raise GGUFModelError(f"{self.path}: tensor 'joint_proj.weight' (the DSpark RNN joint head) needs "
                                 f"the Mistral Large 4 backbone's hidden state; this draft's backbone is {self.backbone}")

    # -- upload -----------------------------------------------------------------------------
    def upload(self, backend):
        reader = self._reader
        n = len(reader.tensors)
        if G.ggml_backend_is_cpu(backend):
            # a refusal beats the OOM killer; device memory is the device backend's to refuse
            check_memory(self._weight_bytes, self.path, f"the {n} weight tensors")
        params = G.ggml_init_params(mem_size=G.ggml_tensor_overhead() * (n + 8), mem_buffer=None, no_alloc=True)
        ctx = G.ggml_init(params)
        created = []
        for t in reader.tensors:
            shape = [int(x) for x in t.shape] + [1] * (4 - len(t.shape))
            n_dims = len(t.shape)
            if t.name.endswith(".attn_output_a.weight") and n_dims == 2 and self.hparams.dsv4_o_group_count:
                # a 2-D wo_a is the 3-D one with its last two dims merged
                g_ = self.hparams.dsv4_o_group_count
                shape, n_dims = [shape[0], shape[1] // g_, g_, 1], 3
            gt = G.ggml_new_tensor(ctx, int(t.tensor_type), n_dims,
                                   (ctypes.c_int64 * 4)(*shape))
            G.set_name(gt, t.name)
            created.append((gt, t))
        output_alias = "output.weight" not in {t.name for t in reader.tensors}
        buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
        if not buf:
            raise GGUFModelError(f"{self.path}: could not allocate the weights on the backend")
        for gt, t in created:
            data = np.ascontiguousarray(t.data)
            G.ggml_backend_tensor_set(gt, data.ctypes.data_as(ctypes.c_void_p), 0, data.nbytes)
            self.tensors[t.name] = gt
        self._ctx, self._buf = ctx, buf
        self.backend = backend
        # a draft without its own lm head reuses the token embeddings (TENSOR_DUPLICATED upstream)
        if output_alias:
            self.tensors["output.weight"] = self.tensors["token_embd.weight"]
        t = self.tensors
        self.tok_embd = t.get("token_embd.weight")
        self.output = t.get("output.weight")
        self.output_s = t.get("output.scale")
        self.fc = t.get("fc.weight")
        self.fc_s = t.get("fc.scale")
        self.output_norm_enc = t.get("enc.output_norm.weight")
        self.output_norm = t.get("output_norm.weight")
        self.d2t = t.get("d2t")
        self.hc_head_fn = t.get("output_hc_fn.weight")
        self.hc_head_base = t.get("output_hc_base.weight")
        self.hc_head_scale = t.get("output_hc_scale.weight")
        self.dspark_mask_embd = t.get("mask_embd.weight")
        self.layers = [Layer(il, t) for il in range(self.hparams.n_layer)]
        # the heads' tensors; those of another head stay None
        hp, v = self.hparams, self.variant
        for heads, variant in ((dspark.DSPARK_TENSORS, VARIANT_DSPARK), (dflash2.DFLASH2_TENSORS, VARIANT_DFLASH2),
                               (lilicorr.LILICORR_TENSORS, VARIANT_LILICORR),
                               (lilicorr.LILICORR_FEATURE_TENSORS, VARIANT_LILICORR)):
            fb = hp.n_layer + hp.lilicorr_layers
            for attr, name in heads.items():
                setattr(self, attr, t.get(name.format(fb=fb)) if v == variant else None)
        for i, layer in enumerate(self.layers):
            for attr, name in lilicorr.LILICORR_LAYER_TENSORS.items():
                use = v == VARIANT_LILICORR and i < hp.lilicorr_layers
                setattr(layer, attr, t.get(name.format(bid=hp.n_layer + i, i=i)) if use else None)

    @property
    def weight_bytes(self) -> int:
        return sum(int(t.n_bytes) for t in self._reader.tensors)

    def tensor_table(self) -> list[tuple[str, str, list]]:
        return [(t.name, t.tensor_type.name, [int(x) for x in t.shape]) for t in self._reader.tensors]

    def close(self):
        if self._buf:
            G.ggml_backend_buffer_free(self._buf)
            self._buf = None
        if self._ctx:
            G.ggml_free(self._ctx)
            self._ctx = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def load(path, backend=None) -> Model:
    """Read a draft GGUF; with a backend the weights are uploaded to it."""
    return Model(path, backend)
