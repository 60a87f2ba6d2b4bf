"""Tiny random-weight DFlash-family drafts, written as GGUF files llama.cpp's loader accepts.

`make_model` writes arch "dflash" drafts for the four heads (DFlash, DFlash2, DSpark, LiliCorr)
on the base backbone, and DSpark's on the DeepSeek-V4 and Mistral Large 4 backbones. Every key and
tensor written is one that upstream reads (`llama_model_dflash::load_arch_hparams` /
`load_arch_tensors` and the seed's `load_tensors_dflash2`, `load_tensors_dflash2_conv`,
`load_tensors_dspark`, `load_tensors_lilicorr`), or a key the speculative driver reads; nothing
else is written, because the loader rejects a file holding a tensor it never creates ("wrong
number of tensors"). The one seed-only tensor, DSpark's RNN `joint_proj` (option joint), is
rejected that way by build b11739.

Shapes are given in ggml order (ne0 first), as in the loader's create_tensor calls; numpy stores
them reversed. The same seed always gives the same bytes.

    options           what make_model accepts: names, option catalogues, presets, their checks
    writer            a draft's keys and tensors in creation order, drawn and written as GGUF
    base              the base backbone's keys and layers, the tokenizer keys, the global tensors
    head_writers      each head's keys and tensors (DFlash2, DSpark, LiliCorr)
    dspark_backbones  the DeepSeek-V4 (dsv4, dsv41) and Mistral Large 4 drafts
    model             make_model: the checks, then every writer in the loader's order

Importing this package loads no ggml: the command line builds its flags from it first.
"""

from .base import BOS_ID, EOS_ID, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, UNK_ID
from .model import make_model
from .options import (BACKBONE_OPTIONS, BACKBONES, HIDDEN_ACTS, OPTIONS, PRESETS, ROPE_SCALING_TYPES, VARIANTS,
                      WTYPES)
from .writer import ARCH

__all__ = ["ARCH", "BACKBONES", "BACKBONE_OPTIONS", "BOS_ID", "EOS_ID", "HIDDEN_ACTS", "OPTIONS", "PRESETS",
           "ROPE_SCALING_TYPES", "TOKEN_CONTROL", "TOKEN_NORMAL", "TOKEN_UNKNOWN", "UNK_ID", "VARIANTS", "WTYPES",
           "make_model"]
