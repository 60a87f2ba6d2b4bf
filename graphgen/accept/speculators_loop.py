"""The speculators equivalent of z-lab's `dflash_generate`, for speculators' DSpark (and DFlash) drafts.

speculators ships the draft classes and their training, no generation loop (its inference lives in
vLLM). `generate` runs dflash_generate's loop through the loop every engine shares
(graphgen.speculative.loop.run_speculative, edges "authors"), with the draft's own speculators
modules behind llama.cpp's drivers:

- the target is transformers' model of the GGUF (features.transformers_model, float32) verifying
  through speculative/transformers_target.py: prefilled on the prompt, its greedy token after the
  prompt the first anchor;
- each round the draft sees the target features of the positions committed since its last round
  (the inputs of the layers `aux_hidden_state_layer_ids` names: transformers' hidden_states[id])
  and a block [anchor, mask, ...] at the anchor's position, through speculative/torch_draft.py:
  fc, hidden_norm, rotary, each layer with its DynamicCache, norm, then lm_head over the draft
  vocabulary and d2t to the target's ids; the block's rows are dropped from the cache after, the
  context rows kept, as dflash_generate crops its draft cache;
- DSpark's Markov head is chained greedily slot by slot (slot k's bias from the token drafted at
  slot k - 1, the first drafting slot's from the anchor) and its confidence head scored per slot,
  by graphgen.authors.forward.dspark_heads, what llama.cpp's graph computes;
- with `sample_from_anchor` every row of the block drafts (the anchor's row the token after it):
  block_size tokens a block, else block_size - 1 from the mask rows;
- the confidence: llama.cpp's dspark drafter reads it only with --spec-draft-p-min above 0, and
  then ends the draft before the first slot scored below p_min; `p_min` 0 keeps every drafted
  token, and the scores are recorded per round;
- verification is dflash_generate's greedy rule: the target over [anchor, drafted...] in one
  batch, the longest prefix of drafted tokens equal to its argmax at the row before, then its own
  token; the round appends at most what n_predict leaves, a stop token ends the sequence;
- blocks shrink to what n_predict leaves, as dflash_generate's do (the last rounds draft fewer).

The rounds come back as authors_loop reads dflash_generate's: the generated tokens, the tokens
each round appended (dflash_generate's acceptance_lengths), and per round (anchor, drafted tokens,
the target's argmax per verified row, agreed drafted tokens), so authors_loop records both loops'
rounds alike. `draft_block` drafts one block from scratch, the yardstick of the loop's cache.

The shipped DSpark's config names its verifier by a hub name, unreachable offline: `load_draft`
hands speculators' loader a folder holding the target's own embeddings, taken from the GGUF as
transformers dequantized them, instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path


def _error(msg: str):
    from ..errors import AuthorsLoopError
    return AuthorsLoopError(msg)


def load_draft(target, draft_dir):
    """The speculators checkpoint `draft_dir` as graphgen.authors.forward.AuthorsDraft (float32), its
    verifier's embeddings (and head, when the draft has no vocabulary of its own) the target's:
    `target` is transformers' model of the GGUF."""
    from ..authors import AuthorsError
    from ..authors.forward import AuthorsDraft
    from safetensors.torch import save_file
    src = Path(draft_dir)
    cfg = json.loads((src / "config.json").read_text())
    ver = (cfg.get("speculators_config") or {}).get("verifier")
    if not isinstance(ver, dict):
        raise _error(f"draft {src}/config.json: missing key 'speculators_config.verifier' (speculators reads "
                     "the target's embeddings through it)")
    with tempfile.TemporaryDirectory(prefix="graphgen-speculators-") as tmp:
        tdir, ddir = Path(tmp) / "target", Path(tmp) / "draft"
        tdir.mkdir()
        ddir.mkdir()
        target.config.save_pretrained(str(tdir))
        # what speculators reads of its verifier: the embeddings, the head (tied here) and the final norm
        tensors = {"model.embed_tokens.weight": target.get_input_embeddings().weight}
        norm = getattr(getattr(target, "model", None), "norm", None)
        if norm is not None:
            tensors["model.norm.weight"] = norm.weight
        save_file({k: v.detach().float().clone().contiguous() for k, v in tensors.items()},
                  str(tdir / "model.safetensors"))
        # the same checkpoint, its verifier named by the folder written above
        ver["name_or_path"] = str(tdir)
        (ddir / "config.json").write_text(json.dumps(cfg, indent=1))
        for f in src.iterdir():
            if f.name != "config.json" and f.is_file():
                os.symlink(f.resolve(), ddir / f.name)
        try:
            with contextlib.redirect_stderr(open(os.devnull, "w")):
                draft = AuthorsDraft(ddir, tdir)
        except AuthorsError as e:
            raise _error(str(e).replace(str(ddir), str(src))) from None
    draft.hf_dir = src
    return draft


def draft_tokens(draft, hidden, anchor: int):
    """The block's drafted tokens, their logits over the target's vocabulary and their confidences
    (NaN where the draft has no confidence head), from the draft's final hidden rows [1, rows, n_embd]
    of a block starting with `anchor`."""
    from ..authors.forward import drafted_logits
    logits, conf = drafted_logits(draft, hidden, anchor)
    first = 0 if draft.sample_from_anchor else 1
    logits, conf = logits[first:], conf[first:]
    return [int(t) for t in logits.argmax(axis=-1)], logits, conf


def _rows(draft, n_draft: int) -> int:
    return n_draft if draft.sample_from_anchor else n_draft + 1


def draft_block(draft, features, anchor: int, pos0: int, n_draft: int):
    """The draft's block from scratch: context features [pos0, n_layers * n_embd] of positions
    0..pos0-1, a block drafting n_draft tokens after `anchor` at pos0 -> (drafted tokens [n_draft],
    their logits [n_draft, n_vocab], confidences [n_draft]). `generate` feeds the same rows in
    pieces through the draft's cache; its attention over them is the same."""
    import numpy as np
    import torch
    if n_draft < 1:
        raise _error(f"draft_block: n_draft {n_draft}; a block drafts at least one token")
    feats = torch.as_tensor(np.ascontiguousarray(features, dtype=np.float32)).reshape(1, int(pos0), -1)
    rows = _rows(draft, n_draft)
    block = [int(anchor)] + [int(draft.mask_token_id)] * (rows - 1)
    positions = list(range(int(pos0) + rows))
    with torch.inference_mode():
        hidden = draft.backbone(draft.new_cache(), feats.to(draft.dtype), draft.embed_tokens(block),
                                torch.tensor([positions]), positions)
        return draft_tokens(draft, hidden, anchor)


def generate(target, draft, prompt: list[int], n_predict: int, stop_token_ids=None, p_min: float = 0.0):
    """One prompt through the loop (batch 1, greedy): (tokens: prompt + generated, per round the
    tokens it appended, per round (anchor, drafted, the target's argmax per verified row, agreed),
    per round the drafted tokens' confidences, seconds)."""
    from ..speculative.drafters import DraftParams
    from ..speculative.loop import open_drafter, run_speculative
    from ..speculative.transformers_target import TransformersTarget
    from ..speculative.verifier import TargetVerifier
    tgt = TransformersTarget(target, draft.target_layers, stop_token_ids or ())
    # the trained block (n_max None), every drafted token kept unless p_min cuts the draft
    drafter = open_drafter(draft.hf_dir, None, DraftParams(n_max=None, p_min=float(p_min)), engine="torch",
                           authors_draft=draft)
    session = drafter.session
    first = 0 if draft.head.anchor_row and draft.sample_from_anchor else 1
    observed, confidences = [], []

    def heard(rec):
        observed.append((rec.id_last, list(rec.draft), tgt.best[rec.seq], rec.n_accepted))
        confidences.append([float(c) for c in session.confidences[rec.seq][first:first + len(rec.draft)]])
    t0 = time.perf_counter()
    res = run_speculative(drafter, [(prompt, None)], n_predict=int(n_predict), verifier=TargetVerifier(tgt),
                          temp=0.0, progress=heard, edges="authors")
    seconds = time.perf_counter() - t0
    tokens = res.tokens[0]
    # the tokens each round appended, as dflash_generate's acceptance_lengths counts them
    lengths = [r.n_accepted + (r.bonus != -1) for r in res.rounds]
    return tokens, lengths, observed, confidences, seconds
