"""The GGUF metadata reader every draft shares, below the model files: `HParams` (every field
a draft's graphs read, with llama.cpp's defaults), the key types b11739 reads each key with
(`GGUFMeta`), and the keys every architecture has (`read_base_hparams`, rope scaling and
sections, the vocab). Each head's and backbone's own keys are read beside its graph
(models/dflash2.py, dspark.py, lilicorr.py), through `models/arch.py`.

Long because of the key table: every key b11739 reads, with the C++ type it is read into.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import GGUFModelError
from ..ggufile import field_value
from ..ops import ggml as G

ARCH = "dflash"


@dataclass
class BaseHParams:
    """The fields every draft's graphs read; each head and backbone adds its own beside its loader
    (models/dflash2.py, dspark.py, lilicorr.py), and models/arch.py composes them into HParams."""

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
    ctx_causal: bool = True
    ffn_op: str = "silu"
    target_layers: list = field(default_factory=list)
    block_size: int = 0
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    mask_token_id: int = -1
    sample_from_anchor: bool = True
    hc_mult: int = 0
    n_lora_kv: int = 0
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


# GGUF value types (gguf_type), and how llama.cpp b11739 reads each key a draft may hold. The C++
# target of a read decides which GGUF types it takes (llama_model_loader's get_key, get_arr and
# get_key_or_arr; llama_vocab's own checks): graphgen reads every key the same way, so it refuses
# exactly the types llama.cpp refuses, with llama.cpp's reason, and reads a key only where
# llama.cpp reads it (a key of the wrong type that llama.cpp never reads is not an error).
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
TYPE_NAMES = {U8: "u8", I8: "i8", U16: "u16", I16: "i16", U32: "u32", I32: "i32", F32: "f32", BOOL: "bool",
              STR: "str", ARR: "arr", U64: "u64", I64: "i64", F64: "f64"}

# read kinds
KEY = "key"                # get_key<T>: a scalar of exactly T's type
KEY_OR_ARR = "key_or_arr"  # get_key_or_arr into std::array<T, N>: a T, or an array of exactly n elements
ARR_VEC = "arr"            # get_arr into std::vector<T>: an array (a scalar reads as absent)
ARR_FIXED = "arr_fixed"    # get_arr into std::array<T, 512>: an array of at most 512 (a scalar: absent)
VOCAB_ARR = "vocab_arr"    # llama_vocab's arrays: an array of one of the listed element types
KV_STR = "kv_str"          # read through the model's string map of scalar keys (arrays are not in it)

LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024

# arch-prefixed keys ("dflash." + key): (read kind, type); the type is T, or VOCAB_ARR's element types
KEY_TYPES = {
    # llama_model_base::load_hparams, for every architecture
    "context_length": (KEY, U32), "embedding_length": (KEY, U32), "embedding_length_out": (KEY, U32),
    "attention.causal": (KEY, BOOL), "pooling_type": (KEY, U32), "classifier.pooling_type": (KEY, U32),
    "classifier.activation": (KEY, STR), "block_count": (KEY, U32), "nextn_predict_layers": (KEY, U32),
    "expert_count": (KEY, U32), "expert_used_count": (KEY_OR_ARR, U32), "expert_group_count": (KEY, U32),
    "expert_group_used_count": (KEY, U32), "feed_forward_length": (KEY_OR_ARR, U32),
    "attention.head_count": (KEY_OR_ARR, U32), "attention.head_count_kv": (KEY_OR_ARR, U32),
    "rope.scaling.finetuned": (KEY, BOOL), "rope.scaling.original_context_length": (KEY, U32),
    "rope.freq_base": (KEY, F32), "rope.scaling.type": (KEY, STR), "rope.scaling.factor": (KEY, F32),
    "rope.scale_linear": (KEY, F32), "rope.scaling.attn_factor": (KEY, F32), "rope.scaling.alpha": (KEY, F32),
    "attention.key_length": (KEY, U32), "attention.value_length": (KEY, U32),
    "rope.dimension_count": (KEY, U32), "attention.key_length_swa": (KEY, U32),
    "attention.value_length_swa": (KEY, U32), "rope.dimension_count_swa": (KEY, U32),
    "classifier.output_labels": (ARR_VEC, STR),
    "vocab_size": (KEY, U32),  # llama_vocab::load, for a tokenizer without tokens
    # llama_model_dflash::load_arch_hparams
    "embedding_scale": (KEY, F32), "attention.scale": (KEY, F32), "attention.value_scale": (KEY, F32),
    "hidden_activation": (KEY, STR), "attention.layer_norm_rms_epsilon": (KEY, F32), "logit_scale": (KEY, F32),
    "final_logit_softcapping": (KEY, F32), "rope.dimension_sections": (KEY_OR_ARR, I32),
    "block_size": (KEY, U32), "conv_kernel_size": (KEY, U32), "conv_group_size": (KEY, U32),
    "selector_rank": (KEY, U32), "selector_top_k": (KEY, U32), "target_layers": (ARR_VEC, I32),
    "hyper_connection.count": (KEY, U32), "attention.sliding_window": (KEY, U32),
    "attention.sliding_window_pattern": (ARR_FIXED, U32),
    # the DeepSeek-V4 DSpark backbone (hyper_connection.count > 0)
    "attention.q_lora_rank": (KEY, U32), "expert_feed_forward_length": (KEY_OR_ARR, U32),
    "expert_shared_count": (KEY, U32), "expert_weights_scale": (KEY, F32), "expert_weights_norm": (KEY, BOOL),
    "expert_gating_func": (KEY, U32), "swiglu_clamp_exp": (KEY_OR_ARR, F32), "swiglu_clamp_shexp": (KEY_OR_ARR, F32),
    "attention.output_group_count": (KEY, U32), "attention.output_lora_rank": (KEY, U32),
    "hyper_connection.sinkhorn_iterations": (KEY, U32), "hyper_connection.epsilon": (KEY, F32),
    "attention.compress_ratios": (ARR_FIXED, U32),
    # seed only (b11739 has no DeepSeek-V4.1, Mistral Large 4 or bonus anchor): the seed's reads
    "hyper_connection.single_pass": (KEY, BOOL), "attention.kv_lora_rank": (KEY, U32),
    "attention.key_length_mla": (KEY, U32), "attention.value_length_mla": (KEY, U32),
    "rope.scaling.yarn_log_multiplier": (KEY, F32), "sample_from_anchor": (KV_STR, None),
}
# keys without the arch prefix
OTHER_KEY_TYPES = {
    # llama_model_loader and gguf itself
    "general.architecture": (KEY, STR), "general.name": (KEY, STR), "general.file_type": (KEY, U32),
    "general.alignment": (KEY, U32), "split.count": (KEY, U16), "split.no": (KEY, U16),
    # the LiliCorr head (b11739 reads its keys unprefixed)
    "lilicorr.hidden_size": (KEY, U32), "lilicorr.candidate_topk": (KEY, U32), "lilicorr.num_heads": (KEY, U32),
    "lilicorr.num_layers": (KEY, U32), "lilicorr.vector_eps": (KEY, F32), "lilicorr.logit_scale": (KEY, F32),
    "lilicorr.factor_dim": (KEY, U32), "lilicorr.mlp_hidden_size": (KEY, U32),
    # llama_vocab::load
    "tokenizer.ggml.model": (KEY, STR), "tokenizer.ggml.pre": (KEY, STR),
    "tokenizer.ggml.token_type_count": (KEY, U32), "tokenizer.ggml.add_space_prefix": (KEY, BOOL),
    "tokenizer.ggml.remove_extra_whitespaces": (KEY, BOOL), "tokenizer.ggml.tokens": (VOCAB_ARR, (STR,)),
    "tokenizer.ggml.scores": (VOCAB_ARR, (F32, I32)), "tokenizer.ggml.token_type": (VOCAB_ARR, (I32,)),
    "tokenizer.ggml.merges": (VOCAB_ARR, (STR,)), "tokenizer.ggml.suppress_tokens": (VOCAB_ARR, (I32,)),
    "tokenizer.ggml.add_bos_token": (KEY, BOOL), "tokenizer.ggml.add_eos_token": (KEY, BOOL),
    "tokenizer.ggml.add_sep_token": (KEY, BOOL), "tokenizer.ggml.normalizer.lowercase": (KEY, BOOL),
    "tokenizer.ggml.normalizer.strip_accents": (KEY, BOOL),
}
SPECIAL_TOKEN_KEYS = ["bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "fim_pre", "fim_suf",
                      "fim_mid", "fim_pad", "fim_rep", "fim_sep", "prefix", "suffix", "middle"]
OTHER_KEY_TYPES.update({f"tokenizer.ggml.{k}_token_id": (KEY, U32) for k in SPECIAL_TOKEN_KEYS})
# the tokenizer models llama_vocab::load knows, and those that need BPE merges
TOKENIZER_MODELS = ("no_vocab", "none", "llama", "bert", "gpt2", "hybriddna", "whitespace", "t5", "rwkv", "test",
                    "plamo2", "plamo3", "gemma4")
BPE_TOKENIZERS = ("gpt2", "hybriddna", "whitespace")


def key_spec(key: str):
    """(read kind, type) of a key llama.cpp reads, None for a key it never reads."""
    if key.startswith(ARCH + "."):
        return KEY_TYPES.get(key[len(ARCH) + 1:])
    return OTHER_KEY_TYPES.get(key)


def _type_name(t) -> str:
    return TYPE_NAMES.get(t, f"type {t}")


def _arr_elem_ok(target: int, elem: int, fixed: bool) -> bool | None:
    """get_arr's element rule: True (takes it), False (wrong element type), None (not a
    string/float32/uint32/int32/uint64 array: an element type it never takes)."""
    ints = (U32, I32, BOOL) if fixed else (U32, I32)  # the fixed-size read also takes bools
    if elem in ints:
        return target in (U32, I32)
    if elem == U64:
        return target == U64
    if elem == F32:
        return target == F32
    if elem == STR:
        return target == STR
    return None


class GGUFMeta:
    """Typed access to GGUF metadata, read as llama.cpp reads it (key_spec), with errors that
    name the key and give llama.cpp's reason."""

    def __init__(self, reader, path, n_layer: int = 0):
        self.r = reader
        self.path = path
        self.n_layer = n_layer  # the n of the per-layer get_key_or_arr reads, once known

    def has(self, key):
        return key in self.r.fields

    def _fail(self, msg):
        raise GGUFModelError(f"{self.path}: {msg}")

    def gguf_type(self, key) -> tuple[int, int | None]:
        """(value type, element type or None) of a present key."""
        f = self.r.fields[key]
        try:
            t = int(f.types[0])
            return (t, int(f.types[1]) if t == ARR else None)
        except (IndexError, ValueError, TypeError):
            self._fail(f"key '{key}' is malformed")

    def _raw(self, key):
        try:
            return field_value(self.r, key)
        except GGUFModelError as e:
            self._fail(str(e))

    def _checked(self, key, n=None):
        """The value of a present key as llama.cpp takes it, None when llama.cpp reads it as absent."""
        spec = key_spec(key)
        if spec is None:
            return self._raw(key)
        how, want = spec
        t, elem = self.gguf_type(key)
        if how == KV_STR:
            # the model's string map skips arrays; a bool reads "true"/"false", a number its digits
            if t == ARR:
                return None
            v = self._raw(key)
            return ("true" if v else "false") if t == BOOL else str(v)
        if how == VOCAB_ARR:
            if t != ARR or elem not in want:
                self._fail(f"key '{key}': invalid gguf type for {key} ({_type_name(t)}"
                           + (f" of {_type_name(elem)}" if t == ARR else "") + "); llama.cpp expects an array of "
                           + " or ".join(_type_name(w) for w in want))
            return self._raw(key)
        if how == KEY or (how == KEY_OR_ARR and t != ARR):
            if t != want:
                self._fail(f"key '{key}' has wrong type {_type_name(t)} but expected type {_type_name(want)}")
            return self._raw(key)
        if how == KEY_OR_ARR:
            vals = self._raw(key)
            if n is not None and len(vals) != n:
                self._fail(f"key '{key}' has wrong array length; expected {n}, got {len(vals)}")
            ok = _arr_elem_ok(want, elem, fixed=True)
            if ok is None:
                self._fail(f"key '{key}' is not a string/float32/uint32/int32/uint64 array ({_type_name(elem)}[])")
            if not ok:
                self._fail(f"key '{key}' has wrong array element type {_type_name(elem)}")
            return [int(bool(v)) if elem == BOOL else v for v in vals]
        # ARR_VEC / ARR_FIXED: a scalar is read as absent
        if t != ARR:
            return None
        ok = _arr_elem_ok(want, elem, fixed=how == ARR_FIXED)
        if ok is None:
            self._fail(f"key '{key}' is not a string/float32/uint32/int32/uint64 array ({_type_name(elem)}[])")
        if not ok:
            self._fail(f"key '{key}' has wrong array element type {_type_name(elem)}")
        vals = self._raw(key)
        if how == ARR_FIXED and len(vals) > LLAMA_MAX_LAYERS:
            self._fail(f"array length {len(vals)} for key '{key}' exceeds max {LLAMA_MAX_LAYERS}")
        return [int(bool(v)) if elem == BOOL else v for v in vals]

    def read(self, key, required: bool = False, n=None):
        """A key as llama.cpp reads it: its value, or None when absent (or read as absent)."""
        v = self._checked(key, n) if key in self.r.fields else None
        if v is None and required:
            how = (key_spec(key) or (KEY, None))[0]
            self._fail(f"missing key '{key}' (llama.cpp: {'array key' if how in (ARR_VEC, ARR_FIXED) else 'key'} "
                       f"not found in model: {key})")
        return v

    def get(self, key, default=None, required=False, kind=None):
        spec = key_spec(key)
        n = None
        if spec is not None and spec[0] == KEY_OR_ARR:
            n = 4 if key.endswith("rope.dimension_sections") else (self.n_layer or None)
        out = self.read(key, required, n)
        if out is None:
            return default
        if kind == "int":
            if isinstance(out, list):
                # a per-layer array: graphgen builds one value for every layer
                if out and all(x == out[0] for x in out) and isinstance(out[0], int):
                    return int(out[0])
                self._fail(f"key '{key}' holds per-layer values {out}; graphgen builds drafts with one value "
                           "for every layer")
            if isinstance(out, (float, str)):
                self._fail(f"key '{key}' must be an integer, got {out!r}")
            out = int(out)
        elif kind == "float":
            if isinstance(out, (list, str)):
                self._fail(f"key '{key}' must be a number, got {out!r}")
            out = float(out)
        elif kind == "array":
            if not isinstance(out, list):
                out = [out]
        return out

    def get_key_or_arr(self, key, n_layer, kind="float", default=None) -> list:
        """One value for every layer, or an array of n_layer values (upstream's get_key_or_arr)."""
        v = self.read(key, required=default is None, n=n_layer)
        if v is None:
            v = default
        vals = v if isinstance(v, list) else [v] * n_layer
        if len(vals) != n_layer:
            self._fail(f"key '{key}' has wrong array length; expected {n_layer}, got {len(vals)}")
        try:
            return [float(x) if kind == "float" else int(x) for x in vals]
        except (TypeError, ValueError):
            self._fail(f"key '{key}' must hold numbers")


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
    m.read(k("rope.scaling.finetuned"))
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
    m.read(k("rope.scaling.alpha"))
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


def read_loader_keys(m: GGUFMeta, path) -> None:
    """llama_model_loader's own reads: the architecture, the file type and the split count."""
    arch_name = m.read("general.architecture")
    if arch_name != ARCH:
        raise GGUFModelError(f"{path}: general.architecture is {arch_name!r}, graphgen drafts are '{ARCH}'"
                             + (" (llama.cpp: unknown model architecture: '')" if arch_name is None else ""))
    m.read("general.file_type")
    n_split = m.read("split.count") or 0
    if n_split > 1:
        m.read("split.no", required=True)
        raise GGUFModelError(f"{path}: key 'split.count' = {n_split}: a model split over several files, which "
                             "graphgen does not read (llama.cpp looks for the other splits by file name)")


def read_base_hparams(m: GGUFMeta, hp: BaseHParams, path) -> None:
    """llama_model_base::load_hparams: the keys llama.cpp reads for every architecture, in its
    order, with the checks it asserts (an assertion ends its process: graphgen refuses instead)."""
    k = lambda s: f"{ARCH}.{s}"  # noqa: E731
    m.read("general.name")
    hp.n_ctx_train = m.get(k("context_length"), required=True, kind="int")
    hp.n_embd = m.get(k("embedding_length"), required=True, kind="int")
    m.read(k("embedding_length_out"))
    causal = m.read(k("attention.causal"))
    hp.causal_attn = bool(causal)
    # llama.cpp's own default when the key is absent: what its context starts with, and what
    # caps the context's batch at n_ctx
    hp.ctx_causal = True if causal is None else bool(causal)
    m.read(k("pooling_type"))
    m.read(k("classifier.pooling_type"))
    act = m.read(k("classifier.activation"))
    if act is not None and act not in ("gelu", "silu", "tanh"):
        raise GGUFModelError(f"{path}: key '{k('classifier.activation')}' = {act!r}: unsupported classifier "
                             "activation (llama.cpp asserts it is gelu, silu or tanh)")
    hp.n_layer = m.get(k("block_count"), required=True, kind="int")
    if not 0 < hp.n_layer <= LLAMA_MAX_LAYERS:
        raise GGUFModelError(f"{path}: key '{k('block_count')}' = {hp.n_layer} is out of range [1, {LLAMA_MAX_LAYERS}] "
                             "(llama.cpp asserts 0 < n_layer <= LLAMA_MAX_LAYERS)")
    m.n_layer = hp.n_layer
    n_nextn = m.read(k("nextn_predict_layers")) or 0
    if n_nextn > hp.n_layer:
        raise GGUFModelError(f"{path}: key '{k('nextn_predict_layers')}' = {n_nextn} exceeds "
                             f"'{k('block_count')}' = {hp.n_layer} (llama.cpp asserts it)")
    if n_nextn > 0:
        # llama.cpp builds the model from the first n_layer - n_nextn layers and does not load the
        # others, so it refuses a file that holds their tensors
        raise GGUFModelError(f"{path}: key '{k('nextn_predict_layers')}' = {n_nextn}: llama.cpp loads only the "
                             f"first {hp.n_layer - n_nextn} of the {hp.n_layer} layers and refuses the tensors of "
                             "the others (wrong number of tensors); graphgen runs drafts without nextn layers")
    n_expert = m.read(k("expert_count")) or 0
    used = m.read(k("expert_used_count"), n=hp.n_layer)
    used_max = (max(used) if used else 0) if isinstance(used, list) else (used or 0)
    groups = m.read(k("expert_group_count")) or 0
    group_used = m.read(k("expert_group_used_count")) or 0
    why = None
    if n_expert > LLAMA_MAX_EXPERTS:
        why = f"'{k('expert_count')}' = {n_expert} exceeds LLAMA_MAX_EXPERTS = {LLAMA_MAX_EXPERTS}"
    elif used_max > n_expert:
        why = f"'{k('expert_used_count')}' = {used_max} exceeds '{k('expert_count')}' = {n_expert}"
    elif n_expert > 0:
        if used_max == 0:
            why = f"'{k('expert_count')}' = {n_expert} with no '{k('expert_used_count')}'"
        elif groups >= n_expert:
            why = f"'{k('expert_group_count')}' = {groups} is not below '{k('expert_count')}' = {n_expert}"
        elif groups > 1 and (n_expert % groups or group_used == 0 or group_used >= groups):
            why = (f"'{k('expert_group_count')}' = {groups} does not divide the experts into groups of which "
                   f"'{k('expert_group_used_count')}' = {group_used} are used")
    elif groups != 0:
        why = f"'{k('expert_group_count')}' = {groups} without experts"
    if why:
        raise GGUFModelError(f"{path}: key {why} (llama.cpp asserts on its expert counts)")
    hp.n_ff = m.get(k("feed_forward_length"), 0, kind="int")
    hp.n_head = m.get(k("attention.head_count"), required=True, kind="int")
    hp.n_head_kv = m.get(k("attention.head_count_kv"), hp.n_head, kind="int")
    for key, val, lo, hi in ((k("embedding_length"), hp.n_embd, 1, 1 << 20),
                             (k("attention.head_count"), hp.n_head, 1, 1 << 16),
                             (k("attention.head_count_kv"), hp.n_head_kv, 1, 1 << 16),
                             (k("context_length"), hp.n_ctx_train, 1, 1 << 31),
                             (k("feed_forward_length"), hp.n_ff, 0, 1 << 24)):
        if not lo <= val <= hi:
            raise GGUFModelError(f"{path}: key '{key}' = {val} is out of range [{lo}, {hi}]")
    if hp.n_head % hp.n_head_kv:
        raise GGUFModelError(f"{path}: key '{k('attention.head_count')}' = {hp.n_head} is not a multiple "
                             f"of '{k('attention.head_count_kv')}' = {hp.n_head_kv}")


def read_vocab(m: GGUFMeta, hp: BaseHParams, path) -> None:
    """llama_vocab::load, as far as a draft's graph depends on it: the tokenizer model must be one
    llama.cpp knows, the tokens a string array (their count is the vocabulary), the scores and
    token types arrays at least as long, no token twice (llama.cpp asserts it); the special token
    ids are read, and one outside the vocabulary is ignored, as llama.cpp ignores it (warning)."""
    model = m.read("tokenizer.ggml.model", required=True)
    m.read("tokenizer.ggml.pre")
    m.read("tokenizer.ggml.token_type_count")
    if model in ("no_vocab", "none"):
        n = m.read(f"{ARCH}.vocab_size") or 0
        raise GGUFModelError(f"{path}: key 'tokenizer.ggml.model' = {model!r}: a draft without a vocabulary "
                             f"({n} placeholder tokens); graphgen runs drafts that carry their own tokens")
    if model not in TOKENIZER_MODELS:
        raise GGUFModelError(f"{path}: key 'tokenizer.ggml.model' = {model!r}: unknown tokenizer (llama.cpp knows "
                             f"{', '.join(TOKENIZER_MODELS)})")
    if model in BPE_TOKENIZERS and m.read("tokenizer.ggml.merges") is None:
        raise GGUFModelError(f"{path}: the {model!r} tokenizer needs key 'tokenizer.ggml.merges' "
                             "(llama.cpp: cannot find tokenizer merges in model file)")
    m.read("tokenizer.ggml.add_space_prefix")
    m.read("tokenizer.ggml.remove_extra_whitespaces")
    if not m.has("tokenizer.ggml.tokens"):
        raise GGUFModelError(f"{path}: missing key 'tokenizer.ggml.tokens' (llama.cpp: cannot find tokenizer vocab "
                             "in model file)")
    m.read("tokenizer.ggml.tokens")
    f = m.r.fields["tokenizer.ggml.tokens"]
    words = [bytes(f.parts[i]) for i in f.data]
    n = len(words)
    if n == 0:
        raise GGUFModelError(f"{path}: key 'tokenizer.ggml.tokens' holds no tokens; llama.cpp builds an empty "
                             "vocabulary that token_embd.weight cannot match")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        v = m.read(key)
        if v is not None and len(v) < n:
            raise GGUFModelError(f"{path}: key '{key}' has {len(v)} entries for {n} tokens (llama.cpp: index out "
                                 "of array bounds)")
    # an empty token is renamed [EMPTY_<id>]; a name that repeats makes the vocabulary's two maps
    # differ in size, which llama.cpp asserts against
    seen: dict[bytes, int] = {}
    for i, w in enumerate(words):
        w = w or f"[EMPTY_{i}]".encode()
        if w in seen:
            raise GGUFModelError(f"{path}: key 'tokenizer.ggml.tokens' holds token {w.decode(errors='replace')!r} "
                                 f"twice (ids {seen[w]} and {i}); llama.cpp asserts every token is distinct")
        seen[w] = i
    hp.n_vocab = n
    hp.mask_token_id = 103 if model == "bert" and n > 103 else -1
    for name in SPECIAL_TOKEN_KEYS:
        v = m.read(f"tokenizer.ggml.{name}_token_id")
        if name == "mask" and v is not None and v < n:
            hp.mask_token_id = v
    for key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token",
                "tokenizer.ggml.normalizer.lowercase", "tokenizer.ggml.normalizer.strip_accents",
                "tokenizer.ggml.suppress_tokens"):
        m.read(key)


