"""The draft to train: its shape, vocabulary and the authors' model built from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..models.arch import HEADS
from .common import SMOLLM2_MASK_TOKEN, TrainError
from .corpus import Corpus


# the trained variants and whose class each is (graphgen.authors.checkpoint builds them): the head
# registry's default authors' format
VARIANT_AUTHORS = {h.name: h.authors[0] for h in sorted(HEADS.values(), key=lambda h: h.name) if h.authors}


@dataclass
class DraftShape:
    """The draft to train, in training's terms (the authors' layer numbering, a draft vocabulary's
    size), as the training summaries record it; `spec()` maps it onto the authors' spec
    (authors.checkpoint.HFSpec), the one place the two meet. What a head has (a draft vocabulary,
    an anchor row that drafts, a selector) is the head registry's answer."""
    variant: str = "dflash"
    n_embd: int = 576
    n_head: int = 9
    n_head_kv: int = 3
    head_dim: int = 64
    n_ff: int = 320
    n_layer: int = 1
    block_size: int = 8
    n_vocab: int = 49152
    n_target_layers: int = 30
    target_layer_ids: list[int] = field(default_factory=lambda: [1, 14, 27])  # the authors' numbering
    mask_token_id: int = SMOLLM2_MASK_TOKEN
    rope_theta: float = 100000.0
    rms_eps: float = 1e-5
    # DFlash2: the block's grouped dynamic convolutions and the candidate selector
    conv_kernel: int = 3
    conv_group: int = 64
    selector_rank: int = 8
    selector_top_k: int = 8
    # DSpark: the Markov head's rank and the draft vocabulary (the corpus's most frequent tokens)
    markov_rank: int = 8
    draft_vocab: int = 3072

    @property
    def authors(self) -> str:
        return VARIANT_AUTHORS[self.variant]

    @property
    def offset(self) -> int:
        """Block row i predicts the token at anchor + i + offset: z-lab's rows start at the anchor
        (row 0 predicts nothing), speculators' DSpark samples from the anchor (sample_from_anchor)."""
        return 1 if HEADS[self.variant].anchor_row else 0

    def spec(self):
        """The same draft as graphgen.authors.checkpoint's HFSpec, which builds the authors' classes."""
        from ..authors.checkpoint import HFSpec
        if self.variant not in VARIANT_AUTHORS:
            raise TrainError(f"--variant {self.variant}: trained variants are {', '.join(VARIANT_AUTHORS)}")
        return HFSpec(variant=self.variant, authors=self.authors, n_embd=self.n_embd, n_layer=self.n_layer,
                      n_head=self.n_head, n_head_kv=self.n_head_kv, head_dim=self.head_dim, n_ff=self.n_ff,
                      n_vocab=self.n_vocab, block_size=self.block_size,
                      target_layers=[i + 1 for i in self.target_layer_ids], n_target_layers=self.n_target_layers,
                      mask_token_id=self.mask_token_id, rope_theta=self.rope_theta, rms_eps=self.rms_eps,
                      conv_kernel=self.conv_kernel, conv_group=self.conv_group, selector_rank=self.selector_rank,
                      selector_top_k=self.selector_top_k, markov_rank=self.markov_rank, conf=True,
                      sample_from_anchor=True,
                      d2t_vocab=self.draft_vocab if HEADS[self.variant].draft_vocab else None).resolved()


def draft_vocabulary(corpus: "Corpus", size: int, n_vocab: int) -> np.ndarray:
    """The `size` tokens the corpus holds most often (ties to the lower id), sorted: a DSpark draft
    vocabulary, as speculators builds one from its training data's token counts."""
    counts = np.bincount(np.concatenate(corpus.tokens).astype(np.int64), minlength=n_vocab)
    order = np.lexsort((np.arange(n_vocab), -counts))
    return np.sort(order[:size])


def new_draft(shape: DraftShape, embed_np: np.ndarray, target_folder: Path | None = None, vocab=None):
    """A fresh authors' draft of `shape`: z-lab's DFlashDraftModel / DFlash2DraftModel, or
    speculators' DSparkDraftModel (its verifier config read from `target_folder`, its draft
    vocabulary `vocab`, its embeddings the target's, its own head started from the target's rows)."""
    import torch
    from ..authors import checkpoint as C
    s = shape.spec()
    if shape.authors == "zlab":
        model = C._zlab_model(s)
        for layer in model.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                if conv is not None:
                    # z-lab leaves the kernels uninitialized (torch.empty): start both as the identity,
                    # as speculators' reset_parameters does
                    with torch.no_grad():
                        conv.base_kernel.zero_()
                        conv.base_kernel[:, 0].fill_(1.0)
                        conv.kernel_projection.weight.zero_()
        return model
    if target_folder is None or vocab is None:
        raise TrainError("a speculators draft needs its target's folder and a draft vocabulary")
    model = C._speculators_model(s, Path(target_folder))
    ids = torch.as_tensor(np.asarray(vocab), dtype=torch.long)
    if len(ids) != shape.draft_vocab:
        raise TrainError(f"draft vocabulary of {len(ids)} tokens; the shape says {shape.draft_vocab}")
    t2d = torch.zeros(shape.n_vocab, dtype=torch.bool)
    t2d[ids] = True
    model.load_vocab_mappings(t2d, ids - torch.arange(len(ids)))
    embed = torch.from_numpy(embed_np)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(embed[ids])
        if getattr(model, "verifier_lm_head", None) is not None:
            model.verifier_lm_head.weight.copy_(embed[ids])
    for name in ("embed_tokens", "verifier_lm_head", "verifier_norm"):
        mod = getattr(model, name, None)
        if mod is not None:
            mod.requires_grad_(False)
    return model


class _BlockwiseConvs:
    """DFlash2's convolutions run along a block's rows; a training forward lays many blocks end to
    end, so while it runs each convolution sees one block at a time (as in the authors' loop, where
    a forward holds one block)."""

    def __init__(self, model, block: int):
        self.convs = [c for layer in model.layers for c in (getattr(layer, "attention_conv", None),
                                                          getattr(layer, "mlp_conv", None)) if c is not None]
        self.block = block

    def __enter__(self):
        b = self.block
        for conv in self.convs:
            prepare, finish = type(conv).prepare.__get__(conv), type(conv).finish.__get__(conv)

            def p(h, prepare=prepare):
                n, rows, width = h.shape
                out, dyn = prepare(h.reshape(n * rows // b, b, width))
                return out.reshape(n, rows, width), dyn.reshape(n, rows, *dyn.shape[2:])

            def f(h, dyn, finish=finish):
                n, rows, width = h.shape
                return finish(h.reshape(-1, b, width), dyn.reshape(-1, b, *dyn.shape[2:])).reshape(n, rows, width)
            conv.prepare, conv.finish = p, f
        return self

    def __exit__(self, *exc):
        for conv in self.convs:
            del conv.prepare, conv.finish
