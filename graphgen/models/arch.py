"""The seed's dispatch: the head and the backbone are detected once, then hparams, tensors and
the graph dispatch on the backbone, then on the head (llama_model_dflash's load_arch_hparams,
load_arch_tensors and build_arch_graph in dflash.cpp).

The seed keeps this in dflash.cpp; here it has a module of its own because the heads build on
dflash.py's GraphBase, and dflash.py importing them back would make the model files a circle.
This module imports every model file and none of them imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGUFModelError
from ..graph import GraphContext, GraphParams
from ..ops.ggml import ggml_build_forward_expand
from . import dflash, dflash2, dspark, lilicorr
from .conv import CONV_LAYER_TENSORS, load_tensors_dflash2_conv
from .head import Head
from .loader import BaseHParams

VARIANT_DFLASH, VARIANT_DFLASH2, VARIANT_DSPARK, VARIANT_LILICORR = "dflash", "dflash2", "dspark", "lilicorr"
BACKBONE_BASE, BACKBONE_DSV4, BACKBONE_DSV41, BACKBONE_MISTRAL_LARGE4 = "base", "dsv4", "dsv41", "mistral-large4"


@dataclass
class HParams(BaseHParams, dflash2.DFlash2HParams, lilicorr.LiliCorrHParams, dspark.BackboneHParams):
    """Every field a draft's graphs read: the base fields and those each head and backbone
    declares beside its loader."""


# the tensors outside the heads, as the loaders of every backbone declare them: a layer's
# attributes are the union of theirs (each draft has the ones of its backbone, None elsewhere)
MODEL_TENSORS = dflash.COMMON_TENSORS + dspark.DSV4_TENSORS + dspark.ML4_TENSORS
LAYER_TENSORS = (dflash.LAYER_TENSORS + CONV_LAYER_TENSORS + dspark.DSV4_LAYER_TENSORS + [dspark.DSV4_WO_A]
                 + dspark.ML4_LAYER_TENSORS)
ROPE_FREQS = dflash.ROPE_FREQS

# every head, in the order the seed tests their markers; the plain DFlash head, which has none, last
HEADS = {h.name: h for h in (dspark.HEAD, dflash2.HEAD, lilicorr.HEAD, dflash.HEAD)}


def detect_head(tensor_names, keys) -> Head:
    """llama_model_dflash_variant: the first head whose marker tensor or key the GGUF holds."""
    return next((h for h in HEADS.values() if h.detects(tensor_names, keys)), dflash.HEAD)


def load_hparams(m, hp, variant: str, backbone: str, path) -> None:
    """The head's keys and checks, then the backbone's; `m` reads the GGUF's metadata."""
    head = HEADS[variant]
    if head.load_hparams is not None:
        head.load_hparams(m, hp, path)
    # the conv keys are read for every head: their groups must tile the hidden size
    if hp.conv_group_size > 0 and hp.n_embd % hp.conv_group_size:
        raise GGUFModelError(f"{path}: DFlash hidden size must be divisible by conv_group_size "
                             f"({hp.n_embd} % {hp.conv_group_size}, key '{dflash.kv('conv_group_size')}')")
    if backbone in (BACKBONE_DSV4, BACKBONE_DSV41):
        dspark.load_hparams_dsv4(m, hp, path)
    elif backbone == BACKBONE_MISTRAL_LARGE4:
        dspark.load_hparams_mistral_large4(m, hp, path)
    else:
        dflash.load_hparams_base(m, hp, path)
    if backbone != BACKBONE_BASE and not head.on_backbones:
        runs = " or ".join(sorted(h.name for h in HEADS.values() if h.on_backbones))
        raise GGUFModelError(f"{path}: the {backbone} backbone runs the {runs} head, not {variant}")


@dataclass(frozen=True)
class TensorInfo:
    """What the tensors themselves say before their shapes can be checked: the Markov head's rank
    (from markov_w1) and the draft vocabulary (from d2t)."""
    dspark_rank: int
    n_vocab_draft: int


def load_tensors(hp, variant: str, backbone: str, dspark_rank: int, n_vocab_draft: int) -> tuple[dict, list]:
    """Every tensor a draft may hold with its shape (ggml order, None = any), and those it must hold."""
    info = TensorInfo(dspark_rank, n_vocab_draft)
    parts = [dflash.load_tensors_common(hp, info)]
    if backbone in (BACKBONE_DSV4, BACKBONE_DSV41):
        parts.append(dspark.load_tensors_layers_dsv4(hp, with_hc_head=backbone == BACKBONE_DSV4))
    elif backbone == BACKBONE_MISTRAL_LARGE4:
        parts.append(dspark.load_tensors_layers_mistral_large4(hp))
    else:
        parts.append(dflash.load_tensors_layers_base(hp, info))
    head = HEADS[variant]
    if head.load_tensors is not None:
        parts.append(head.load_tensors(hp, info))
    if backbone == BACKBONE_BASE and not head.loads_conv:
        # b11739 creates the conv tensors in its base layer loop whenever the conv keys are set,
        # for every head (the seed moved them to the DFlash2 and LiliCorr loaders)
        conv = load_tensors_dflash2_conv(hp)
        parts.append((conv, list(conv)))
    shapes, required = {}, []
    for part_shapes, part_required in parts:
        shapes.update(part_shapes)
        required += part_required
    return shapes, required


BACKBONE_GRAPHS = {BACKBONE_DSV4: dspark.GraphDSV4, BACKBONE_DSV41: dspark.GraphDSV41,
                   BACKBONE_MISTRAL_LARGE4: dspark.GraphMistralLarge4}


def build_arch_graph(params: GraphParams) -> GraphContext:
    """The encoder, else the backbone's own graph, else the head's graph on the base backbone."""
    model = params.model
    if params.graph_type == "encoder":
        return dflash.GraphEncoder(params)
    if model.backbone != BACKBONE_BASE:
        if model.backbone not in BACKBONE_GRAPHS:
            raise NotImplementedError(f"the {model.backbone} backbone is not supported by this graphgen build")
        return BACKBONE_GRAPHS[model.backbone](params)
    if model.variant not in HEADS:
        raise NotImplementedError(f"the {model.variant} head is not supported by this graphgen build")
    return _expand_outputs(HEADS[model.variant].graph(params))


def _expand_outputs(g: GraphContext) -> GraphContext:
    """The outputs are in the graph even when a head leaves them out: DSpark's Markov head
    returns early on a block longer than the trained one, and llama.cpp still computes the
    backbone's logits (the rest of the last layer, the output norm, the lm head) after it."""
    for t in (g.res.t_logits, g.res.t_embd):
        if t is not None:
            ggml_build_forward_expand(g.gf, t)
    return g
