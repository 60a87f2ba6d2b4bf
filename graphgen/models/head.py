"""A draft head as one unit: what the rest of graphgen asks of a head, declared once beside its
graph (the `HEAD` of dflash.py, dflash2.py, dspark.py, lilicorr.py) and collected in arch.HEADS.
The engine, validation, the drivers, the loader and the authors' side (their checkpoints, forward
and loops, training) consult the entry; none of them tests a head's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class BlockRules:
    """What a head's graph asks of a block batch. equal_blocks: the batch reshapes to [tokens per
    block, n_blocks], so it must divide evenly; max_block: a block no longer than this (0: any),
    as a lattice holding that many rows per block asks."""
    head: str
    equal_blocks: bool = False
    max_block: int = 0


@dataclass(frozen=True)
class Head:
    name: str                   # the variant, as llama_model_dflash_variant names it
    spec_type: str              # the seed's speculative type whose driver runs it
    graph: type                 # its graph on the base backbone
    # how the seed tells it from the GGUF: a tensor it alone has, or a key it alone has
    marker_tensor: str | None = None
    marker_keys: tuple = ()
    load_hparams: Callable | None = None   # (m, hp, path): its keys and checks
    load_tensors: Callable | None = None   # (hp, info) -> ({name: shape}, [required names])
    tensors: list = field(default_factory=list)   # its own tensors' declarations (models/tensors.T)
    bind: Callable | None = None           # (model, tensors or {}): attributes beyond `tensors`
    loads_conv: bool = False    # its loader creates the DFlash2 conv tensors (else the base layers do)
    equal_blocks: bool = False
    lattice_per_row: bool = False   # reads one lattice row per block token (blocks <= block_size)
    context_rows: bool = False      # its blocks carry the injected features of the row before them
    on_backbones: bool = False      # the DeepSeek-V4 and Mistral Large 4 backbones run it too
    # synth.make_model's options for it (name -> default), and options that another must enable
    synth_options: dict = field(default_factory=dict)
    synth_needs: dict = field(default_factory=dict)
    # the authors' side: the formats whose packages hold its reference model, the default first
    # ("zlab": z-lab's dflash, "speculators"; none: no authors' code on PyPI), and what their
    # forward, loops and training do for it
    authors: tuple = ()
    llama_loop: bool = True     # b11549's common/speculative.cpp has its driver
    selector: bool = False      # drafts by a candidate selector's walk over a lattice (grouped convolutions)
    markov: bool = False        # a Markov head chains the drafted logits slot by slot from the anchor
    confidence: bool = False    # a confidence head may score each drafted slot
    draft_vocab: bool = False   # may draft over a vocabulary of its own (d2t maps it to the target's)
    anchor_row: bool = False    # its anchor's row may draft too (dflash.sample_from_anchor)
    title: str = ""             # how people write its name: DFlash, DFlash2, DSpark, LiliCorr

    def detects(self, tensor_names, keys) -> bool:
        if self.marker_tensor is not None:
            return self.marker_tensor in tensor_names
        return any(k in keys for k in self.marker_keys)

    def block_rules(self, hp) -> BlockRules:
        return BlockRules(self.name, self.equal_blocks, hp.block_size if self.lattice_per_row else 0)
