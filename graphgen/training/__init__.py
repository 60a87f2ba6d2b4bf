"""Training a z-lab DFlash draft for a real target on the target's own greedy continuations.

The target (a GGUF in llama.cpp b11739, ReferenceTarget) continues a few hundred prompts that are
written here from templates and word lists, and every decoded row's draft-layer inputs are kept:
the features b11739 will hand the draft at run time, so training runs no target in torch. The
draft is the authors' own `DFlashDraftModel`; the target's embedding table, dequantized from the
GGUF, is both its block embeddings and its tied lm head, frozen, as the draft borrows both at run
time.

Objective, as the authors' loop uses the model (dflash_generate): for an anchor position a, the
draft sees the target features of positions < a and the block [token a, mask x (B - 1)] at
positions a .. a + B - 1 (attention non-causal inside the block), and block row i predicts the
token at a + i. Many anchors of one sequence share a forward: each block's rows see only the
context before their anchor and their own block, by an explicit attention mask. Only anchors on
generated tokens are drawn, so every label is the target's own greedy choice.

Split by idea: common.py, prompts.py, corpus.py (the target's side), draft.py, loop.py; the
public names are all here."""

from .common import SMOLLM2_MASK_TOKEN, SMOLLM2_VERIFIER, TOP_KEPT, TrainError
from .corpus import Corpus, authors_layer_ids, embedding_table, generate_corpus, write_target_folder
from .draft import VARIANT_AUTHORS, DraftShape, draft_vocabulary, new_draft
from .loop import (Batch, Columns, TrainSettings, block_hidden, block_loss, make_batch, save_checkpoint,
                   stderr_log, summary_dict, train)
from .prompts import HELD_OUT_PROMPTS, training_prompts

__all__ = ["SMOLLM2_MASK_TOKEN", "SMOLLM2_VERIFIER", "TOP_KEPT", "TrainError", "Corpus", "authors_layer_ids",
           "embedding_table", "generate_corpus", "write_target_folder", "VARIANT_AUTHORS", "DraftShape",
           "draft_vocabulary", "new_draft", "Batch", "Columns", "TrainSettings", "block_hidden", "block_loss",
           "make_batch", "save_checkpoint", "stderr_log", "summary_dict", "train", "HELD_OUT_PROMPTS",
           "training_prompts"]
