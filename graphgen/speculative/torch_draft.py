"""The authors' PyTorch draft as a draft session: what the drivers (drafters.py) ask of graphgen's
Session and of b11739's context (inject, block_multi, seq_rm, the draft's metadata), over a
speculators checkpoint loaded as graphgen.authors.forward.AuthorsDraft. With it the authors' draft
drafts through llama.cpp's drivers and `run_speculative`, the loop every engine shares.

The draft's cache follows the authors' loop: injected rows wait until the next block, which runs
with them in one forward (context rows, then the block's), and the block's rows are cropped after
while the context's stay. A block's logits are what llama.cpp's graph hands the driver: for DSpark
the base logits plus the Markov bias chained slot by slot from the anchor, and the confidence head's
score in column 0 of h_nextn.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from ..errors import GraphgenError


@dataclass
class _Result:
    logits: np.ndarray | None = None
    h_nextn: np.ndarray | None = None


class _Seq:
    def __init__(self, cache):
        self.cache = cache
        self.cached: list[int] = []           # positions in the cache
        self.pending: list[tuple[np.ndarray, list[int]]] = []   # injected rows not yet through a forward


class TorchDraftSession:
    """`draft`: AuthorsDraft of a speculators checkpoint. `confidences[seq]`: the last block's
    confidence per row (NaN without a confidence head)."""

    def __init__(self, draft, n_seq: int = 1):
        if draft.authors != "speculators":
            raise GraphgenError(f"{draft.hf_dir}: the torch draft session runs speculators checkpoints; "
                                "z-lab's run in their own dflash_generate")
        self.draft = draft
        self.n_seq = n_seq
        self.n_batch = self.n_ubatch = 1 << 30   # a forward takes any rows
        meta = {"dflash.block_size": str(draft.block_size),
                "dflash.sample_from_anchor": "true" if draft.sample_from_anchor else "false"}
        if draft.head.confidence:
            meta["dflash.has_confidence_head"] = "true" if draft.model.confidence_head is not None else "false"
        self.model = SimpleNamespace(variant=draft.variant, path=draft.hf_dir, meta=meta,
                                     spec_types=[f"draft-{draft.variant}"])
        self.hparams = SimpleNamespace(n_vocab=draft.n_vocab, n_embd=draft.n_embd, n_embd_inp_enc=draft.n_embd_inp,
                                       target_layers=list(draft.target_layers), block_size=draft.block_size,
                                       mask_token_id=draft.mask_token_id)
        self.seqs = [_Seq(draft.new_cache()) for _ in range(n_seq)]
        self.confidences: dict[int, np.ndarray] = {}

    def _seq(self, seq: int) -> _Seq:
        if not 0 <= seq < self.n_seq:
            raise GraphgenError(f"sequence {seq} is outside the draft session's {self.n_seq}")
        return self.seqs[seq]

    def seq_pos_max(self, seq: int) -> int:
        st = self._seq(seq)
        pos = st.cached + [p for _, ps in st.pending for p in ps]
        return max(pos) if pos else -1

    def inject(self, features, pos0: int, seq: int = 0) -> _Result:
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.draft.n_embd_inp:
            raise GraphgenError(f"target features must be [n_tokens, {self.draft.n_embd_inp}], got {list(x.shape)}")
        self._seq(seq).pending.append((x, list(range(pos0, pos0 + x.shape[0]))))
        return _Result()

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        st = self._seq(seq)
        p0 = max(p0, 0)
        if p1 >= 0 and p1 <= max(st.cached + [p for _, ps in st.pending for p in ps], default=-1):
            raise GraphgenError(f"seq_rm seq {seq} [{p0}, {p1}): the authors' cache drops only a tail")
        st.pending = [(x[[p < p0 for p in ps]], [p for p in ps if p < p0]) for x, ps in st.pending]
        st.pending = [(x, ps) for x, ps in st.pending if ps]
        keep = sum(1 for p in st.cached if p < p0)
        if keep < len(st.cached):
            st.cache.crop(keep)
            del st.cached[keep:]

    def block_multi(self, blocks, embd_state=None) -> _Result:
        """blocks: [(seq, tokens, pos0), ...]; each runs in its own forward with its sequence's waiting
        context rows. -> the blocks' rows' logits (over the target's ids) and confidences, stacked."""
        if embd_state is not None:
            raise GraphgenError("the torch draft session carries no context state")
        torch = self.draft.torch
        from ..authors.forward import drafted_logits
        logits, conf = [], []
        for seq, toks, pos0 in blocks:
            st = self._seq(seq)
            feats = np.concatenate([x for x, _ in st.pending]) if st.pending else \
                np.zeros((0, self.draft.n_embd_inp), np.float32)
            ctx_pos = [p for _, ps in st.pending for p in ps]
            positions = ctx_pos + list(range(pos0, pos0 + len(toks)))
            with torch.inference_mode():
                hidden = self.draft.backbone(st.cache, torch.from_numpy(feats)[None].to(self.draft.dtype),
                                             self.draft.embed_tokens([int(t) for t in toks]),
                                             torch.tensor([positions]), st.cached + positions)
                st.cached += ctx_pos
                st.pending = []
                st.cache.crop(len(st.cached))   # the block's rows go, the context's stay
                lg, cf = drafted_logits(self.draft, hidden, int(toks[0]))
            self.confidences[seq] = cf
            logits.append(lg)
            conf.append(cf)
        return _Result(np.concatenate(logits), np.concatenate(conf)[:, None])

    def close(self) -> None:
        self.seqs = []
