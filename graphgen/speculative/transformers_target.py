"""The target in transformers as a verifier's target: what `verifier.TargetVerifier` asks of a
target (batched decodes of (seq, token, pos) rows returning each row's best logits and the draft's
target-layer inputs, `seq_rm`, end-of-generation tokens), over a transformers model with one
DynamicCache per sequence. The authors' loops verify on it, so their drafts run through the same
`run_speculative` as graphgen's and b11739's.

Each sequence's rows go through the model in one forward, batch 1, at their positions, as
dflash_generate's target runs; a row's best candidates are its logits sorted best first, ties in id
order (torch's argmax takes the first of equal maxima, so the greedy token is the same).
"""

from __future__ import annotations

import numpy as np

from ..errors import GraphgenError
from ..runtime.sampler import best_ids

TOP_CANDIDATES = 64   # per row: more than the default sampler's top-k 40


class TransformersTarget:
    """`model`: transformers' causal LM (features.transformers_model); `layers`: the draft's target
    layers in graphgen's numbering (layer il's input: hidden_states[il]); `stop_tokens`: the tokens
    that end generation. `best[seq]`: the argmax of every row of the sequence's last decode."""

    def __init__(self, model, layers, stop_tokens=(), n_seq: int = 1):
        import torch
        from transformers import DynamicCache
        self.torch, self.model = torch, model
        self.layers = [int(il) for il in layers]
        self.stops = {int(t) for t in stop_tokens}
        self.n_vocab = int(model.config.vocab_size)
        self.n_embd = int(model.config.hidden_size)
        self.width = len(self.layers) * self.n_embd
        self.n_batch = 1 << 30    # a decode takes any rows: each sequence's in one forward
        self.n_seq = n_seq
        self.caches = [DynamicCache(config=model.config) for _ in range(n_seq)]
        self.best: dict[int, list[int]] = {}

    def pieces(self, tokens) -> tuple[None, list[bool]]:
        return None, [int(t) in self.stops for t in tokens]

    def decode(self, rows):
        """rows: [(seq, token, pos), ...], each sequence's rows at the positions after its cache's.
        -> (top ids [n, k] best first, their logits [n, k], features [n, width]), in row order."""
        torch = self.torch
        by_seq: dict[int, list[int]] = {}
        for i, (seq, _, _) in enumerate(rows):
            by_seq.setdefault(int(seq), []).append(i)
        k = min(TOP_CANDIDATES, self.n_vocab)
        ids = np.zeros((len(rows), k), np.int32)
        top = np.zeros((len(rows), k), np.float32)
        feats = np.zeros((len(rows), self.width), np.float32)
        for seq, idx in by_seq.items():
            if not 0 <= seq < self.n_seq:
                raise GraphgenError(f"sequence {seq} is outside the target's {self.n_seq}")
            toks = [int(rows[i][1]) for i in idx]
            pos = [int(rows[i][2]) for i in idx]
            cache = self.caches[seq]
            if pos != list(range(cache.get_seq_length(), cache.get_seq_length() + len(idx))):
                raise GraphgenError(f"sequence {seq}: rows at positions {pos[0]}..{pos[-1]} do not follow the "
                                    f"target's cache of {cache.get_seq_length()}")
            with torch.inference_mode():
                out = self.model(torch.tensor([toks]), position_ids=torch.tensor([pos]), past_key_values=cache,
                                 use_cache=True, output_hidden_states=True)
            logits = out.logits[0].float().numpy()
            self.best[seq] = [int(t) for t in out.logits[0].argmax(dim=-1)]
            for i, row in zip(idx, logits):
                ids[i] = best_ids(row, k)
                top[i] = row[ids[i]]
            f = torch.cat([out.hidden_states[il] for il in self.layers], dim=-1)[0]
            feats[idx] = f.float().numpy()
        return ids, top, feats

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Only a sequence's tail leaves a DynamicCache: [p0, end)."""
        cache = self.caches[seq]
        if p1 >= 0 and p1 < cache.get_seq_length():
            raise GraphgenError(f"seq_rm seq {seq} [{p0}, {p1}): transformers' cache drops only a tail")
        cache.crop(max(p0, 0))
        return True

    def close(self) -> None:
        self.caches = []
