"""What make_model accepts: the variant and backbone names, the options with their defaults, the
presets and weight types, and the checks that turn a call's options into a draft's settings.

Kept apart from the writers: the command line builds its flags from these names before it chooses
which ggml to load, so nothing here loads ggml; the model files, which hold the heads' own
options, are imported on first use.
"""

from __future__ import annotations

import numpy as np


# the heads of models/arch.HEADS (tests/synth/test_options.py keeps them equal), spelt here because the model
# files load ggml, and the command line, which builds its options from this module, must be free
# to choose which ggml (--ggml) after importing it
VARIANTS = ("dflash", "dflash2", "dspark", "lilicorr")
BACKBONES = ("base", "dsv4", "dsv41", "mistral-large4")
# accepted spellings of the backbone names
BACKBONE_ALIASES = {"mistral_large4": "mistral-large4", "ml4": "mistral-large4"}
HIDDEN_ACTS = ("silu", "gelu", "gelu_pytorch_tanh")

ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
WTYPES = ("f32", "f16", "q8_0")

PRESETS = {
    "tiny": {},
    # the shape of published DFlash drafts for 4B-8B targets
    "realistic": {"n_embd": 2048, "n_layer": 5, "n_head": 32, "n_head_kv": 8, "n_ff": 6144,
                  "n_vocab": 32000, "block_size": 16, "target_layers": [1, 9, 17, 25, 33]},
}

# option -> default, with the variant it belongs to (None: any variant)
OPTIONS: dict[str, tuple[object, str | None]] = {
    "head_dim": (None, None),
    "n_rot": (None, None),
    "swa_window": (None, None),
    "swa_pattern": (None, None),
    "mrope_sections": (None, None),
    "shared_kv": (False, None),
    "sinks": (False, None),
    "weight_scales": (False, None),
    "post_norms": (False, None),
    "out_scale": (False, None),
    "rope_freqs": (False, None),
    # rope scaling (llama_model_base::load_hparams): type, factor, original context, attention factor
    "rope_scaling": (None, None),
    "rope_scaling_factor": (None, None),
    "rope_orig_ctx": (None, None),
    "rope_attn_factor": (None, None),
    "attention_scale": (None, None),
    "value_scale": (None, None),
    "embedding_scale": (None, None),
    "logit_scale": (None, None),
    "final_softcap": (None, None),
    "causal": (None, None),
    "hidden_act": (None, None),
    "d2t_vocab": (None, None),
}

# option -> (default, backbones it applies to)
BACKBONE_OPTIONS: dict[str, tuple[object, str]] = {
    "swa_window": (16, "dsv4|dsv41|mistral-large4"),
    "head_dim": (None, "dsv4|dsv41"),
    "n_rot": (16, "dsv4|dsv41|mistral-large4"),
    "q_lora_rank": (32, "dsv4|dsv41"),
    "o_groups": (2, "dsv4|dsv41"),
    "o_lora_rank": (16, "dsv4|dsv41"),
    "n_expert": (4, "dsv4|dsv41"),
    "n_expert_used": (2, "dsv4|dsv41"),
    "n_ff_exp": (32, "dsv4|dsv41"),
    "n_expert_shared": (1, "dsv4|dsv41"),
    "hc_mult": (4, "dsv4|dsv41"),
    "hc_sinkhorn_iters": (3, "dsv4|dsv41"),
    "hc_eps": (1e-6, "dsv4|dsv41"),
    "swiglu_clamp": (2.0, "dsv4|dsv41"),
    "expert_weights_scale": (1.5, "dsv4|dsv41"),
    "expert_weights_norm": (True, "dsv4|dsv41"),
    "expert_gating_func": (4, "dsv4|dsv41"),
    "compress_ratio": (0, "dsv4|dsv41"),
    "kv_lora_rank": (32, "mistral-large4"),
    "k_head_dim_mla": (32, "mistral-large4"),
    "v_head_dim_mla": (32, "mistral-large4"),
    "rope_scaling_factor": (4.0, "mistral-large4"),
    "yarn_log_mul": (0.1, "mistral-large4"),
    "final_softcap": (30.0, "mistral-large4"),
    "markov_rank": (16, "dsv4|dsv41|mistral-large4"),
    "joint": (False, "mistral-large4"),
}


class _Models:
    """The model files (tensor declarations, head entries), imported on first use: they load ggml."""

    def __getattr__(self, name):
        import importlib
        mod = importlib.import_module(f"..models.{name}", __package__)
        setattr(self, name, mod)
        return mod


models = _Models()
_ALL_OPTIONS: dict = {}


def all_options() -> dict:
    """OPTIONS and each head's own options, from its registry entry (models/*.py HEAD.synth_options):
    name -> (default, the heads it applies to, "a|b")."""
    if not _ALL_OPTIONS:
        opts = dict(OPTIONS)
        for head in models.arch.HEADS.values():
            for name, default in head.synth_options.items():
                owners = opts[name][1] + "|" if name in opts else ""
                opts[name] = (default, owners + head.name)
        _ALL_OPTIONS.update(opts)
    return _ALL_OPTIONS


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def positive_int(name: str, value) -> int:
    check(isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0,
          f"{name} must be a positive integer, got {value!r}")
    return int(value)


def owners_of(option: str) -> str:
    return " or ".join(all_options()[option][1].split("|"))


def resolve_options(variant: str, options: dict) -> dict:
    known = all_options()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; known: {', '.join(known)}")
    opts = {}
    for name, (default, owner) in known.items():
        if options.get(name) is not None:
            if owner is not None and variant not in owner.split("|"):
                raise ValueError(f"option {name} applies to variant {owner.replace('|', ' or ')} only, "
                                 f"not {variant}")
            opts[name] = options[name]
        else:
            opts[name] = default
    head = models.arch.HEADS.get(variant)
    for name, flag in (head.synth_needs.items() if head is not None else ()):
        check(options.get(name) is None or opts[flag], f"option {name} needs {flag}=True on a {variant} draft")
    return opts


def resolve_backbone_options(backbone: str, options: dict) -> dict:
    """BACKBONE_OPTIONS' defaults for `backbone`, overridden by the options given; ValueError for an
    option no backbone takes, or one given for another backbone."""
    opts = {}
    for name, value in options.items():
        if name not in BACKBONE_OPTIONS:
            raise ValueError(f"unknown option {name!r} for the {backbone} backbone; known: {', '.join(BACKBONE_OPTIONS)}")
        if value is not None and value is not False and backbone not in BACKBONE_OPTIONS[name][1].split("|"):
            raise ValueError(f"option {name} does not apply to the {backbone} backbone")
    for name, (default, owners) in BACKBONE_OPTIONS.items():
        if backbone in owners.split("|"):
            opts[name] = options[name] if options.get(name) is not None else default
    return opts
