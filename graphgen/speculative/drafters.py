"""The DFlash family drivers of the seed's common/speculative.cpp, on a graphgen Session.

`DFlashDrafter` is common_speculative_impl_draft_dflash: it injects target features into the
draft's KV cache in chunks of n_batch (`process`), runs a single decode over the noise blocks
[id_last, <mask> x n_max] of all sequences that draft (`draft`), takes the draft greedily and then
drops the blocks from the KV cache. `DSparkDrafter`, `DFlash2Drafter` and `LiliCorrDrafter`
derive from it and override what the seed's classes override: the init options, `begin`,
`store_context_features` and `draft`. `create_drafter` applies the spec-type rules of
common_speculative_init.

Upstream reads a draft's candidates through common_sampler (top-k 10, then dist): the greedy token
is the top logit and its p is the softmax over the 10 best logits; graphgen reads them the same way
(`top10`), in float32 with the C library's expf.

Long because it follows one seed file whole (common/speculative.cpp's DFlash family: the base
driver, the three that derive from it, the spec-type rules), so that it reads beside the seed. The
loop that runs the drivers against a simulated verifier is graphgen/speculative/loop.py.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import numpy as np

from ..errors import GraphgenError
from ..ggufile import field_value, try_open
from ..ops.cmath import expf, softmaxf
from ..runtime.mt19937 import MT19937, uniform_real
from ..runtime.sampler import best_ids

log = logging.getLogger("graphgen.drafters")

# common_speculative_type, in upstream's order
SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "draft-dflash2",
              "draft-lilicorr", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DFLASH_FAMILY = ("draft-dflash", "draft-dspark", "draft-dflash2", "draft-lilicorr")

LLAMA_DEFAULT_SEED = 0xFFFFFFFF


def draw_seed(seed: int) -> int:
    """llama.cpp's LLAMA_DEFAULT_SEED (-1 on the command line) asks for a fresh seed; any other is itself."""
    return random.SystemRandom().getrandbits(32) if seed == LLAMA_DEFAULT_SEED else seed


DFLASH2_SEED_MIX = 0x85EBCA6B
SAMPLER_TOP_K = 10  # the drafters' common_sampler: top_k 10, then dist


class SpecTypeError(GraphgenError, RuntimeError):
    """A spec type that does not fit the draft, or types that cannot run together (upstream's message)."""


# -- float32 helpers, as the C++ computes them ------------------------------------------------

F32 = np.float32


def top10(logits_row: np.ndarray):
    """common_sampler with top_k 10 then dist, read as the drivers read it: the candidates sorted
    by p (token ids, logits, p), p being softmax over the kept logits in float32."""
    row = np.asarray(logits_row, dtype=np.float32)
    idx = best_ids(row, min(SAMPLER_TOP_K, row.shape[0]))
    lg = row[idx]
    probs = softmaxf(lg)
    order = np.argsort(-probs, kind="stable")
    return idx[order], lg[order], probs[order]


# -- parameters --------------------------------------------------------------------------------

@dataclass
class DraftParams:
    """common_params_speculative_draft: what the drivers read."""
    n_max: int | None = 3     # longest draft, clamped to what a block yields (None: what a block yields)
    n_min: int = 0            # shorter drafts are dropped
    p_min: float = 0.0        # truncate below this probability (DSpark: confidence)
    probabilistic: bool = False   # --spec-draft-sampling probabilistic (DFlash2 samples its walk)
    backend_sampling: bool = True


@dataclass
class DraftRequest:
    """common_speculative_draft_params for one sequence: what to draft from, and the draft."""
    id_last: int
    pos0: int
    drafting: bool = True
    temp: float = 1.0                 # the target's temperature (probabilistic drafting only)
    seed: int = LLAMA_DEFAULT_SEED    # the target's seed (probabilistic drafting only)
    want_q: bool = False              # result_q set: the verifier takes q for rejection sampling
    # the caller's cap on this draft (-1: none): the server's room left in the context and in -n;
    # the block is still the driver's n_max, its draft cut to this afterwards
    n_max: int = -1
    # dflash_generate's edges instead: the block itself shrinks to the cap
    shrink_block: bool = False
    result: list = field(default_factory=list)
    # per drafted token: [(token, score, p), ...] over the candidates (DFlash2 sampling)
    result_q: list | None = None


@dataclass
class DFlashOptions:
    """dflash_options: the per-head settings each driver's constructor hands to init()."""
    n_draft_max: int          # prediction slots in one block: the cap init() puts on n_max and n_min
    backend_sampling: bool    # the head emits plain logits, so the top-k/dist chain may run on the backend
    dev_features: bool        # injection may take the features straight from the target's GPU memory
    nextn_masked: bool        # h_nextn is needed at output rows only (lattice heads read every row)


def _meta_value(model, key: str):
    """A GGUF metadata value as llama_model_meta_val_str sees it (None when absent); a draft with no
    GGUF (the authors' checkpoint, speculative/torch_draft.py) gives its values in `meta`."""
    if isinstance(getattr(model, "meta", None), dict):
        return model.meta.get(key)
    reader = getattr(model, "_reader", None)
    if reader is None:
        return None
    fld = reader.fields.get(key)
    if fld is None:
        return None
    try:
        v = fld.contents()
    except (AttributeError, ValueError, IndexError):  # older gguf-py
        v = fld.parts[fld.data[0]].tolist()
        v = v[0] if len(v) == 1 else v
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _c_slot(pos: int, rows: int) -> int:
    """(size_t) pos % rows, as C computes it for a llama_pos (a negative pos wraps to 2^64 - |pos|)."""
    return (pos % (1 << 64)) % rows


# -- the base driver ---------------------------------------------------------------------------

class DFlashDrafter:
    """common_speculative_impl_draft_dflash: plain DFlash, greedy read of the block's positions 1.."""

    type = "draft-dflash"
    # whether the head's graph takes a noise block longer than the trained block size at all
    long_blocks = True

    def __init__(self, session, params: DraftParams | None = None, *, _subclass: bool = False):
        self.session = session
        self.params = p = DraftParams(**vars(params)) if params is not None else DraftParams()
        model = session.model
        hp = session.hparams
        self.model = model
        self.n_seq = session.n_seq
        self.n_vocab = hp.n_vocab
        self.n_embd_dec = hp.n_embd
        self.n_embd_enc = hp.n_embd_inp_enc
        self.target_layer_ids = list(hp.target_layers)
        if not self.target_layer_ids:
            raise GraphgenError("DFlash model has no target_layer_ids")
        # the trained block size from dflash.block_size, 16 when the key is absent
        bs = _meta_value(model, "dflash.block_size")
        self.block_size = int(bs) if bs is not None else (hp.block_size or 16)
        causal = _meta_value(model, "dflash.attention.causal")
        self.causal_attn = causal == "true" if causal is not None else False
        self.mask_token_id = hp.mask_token_id
        if self.mask_token_id < 0:
            raise GraphgenError("the draft has no mask token (key 'tokenizer.ggml.mask_token_id'), "
                                "which the DFlash noise block needs")
        self.options: DFlashOptions | None = None
        self.n_max = p.n_max
        self._warned_long_block = False
        log.info("adding speculative implementation '%s'", self.type)
        log.info("- block_size=%d, mask_token_id=%d, n_extract=%d", self.block_size, self.mask_token_id,
                 len(self.target_layer_ids))
        if not _subclass:
            # slot 0 carries id_last and only the block_size-1 masks behind it are predictions, which
            # caps the draft (common_speculative_impl_draft_dflash's public constructor)
            self.init(DFlashOptions(self.block_size - 1, True, True, True))

    # init(): clamp n_max / n_min to what a block yields, with upstream's warning
    def init(self, opt: DFlashOptions) -> None:
        p = self.params
        n_draft_max = opt.n_draft_max
        if p.n_max is None:
            p.n_max = n_draft_max
        if p.n_max > n_draft_max or p.n_min > n_draft_max:
            log.warning("init: requested draft size (n_max=%d, n_min=%d) exceeds the trained block size %d "
                        "-- clamping to %d", p.n_max, p.n_min, self.block_size, n_draft_max)
            p.n_max = min(p.n_max, n_draft_max)
            p.n_min = min(p.n_min, n_draft_max)
        self.n_max = p.n_max
        self.options = opt
        # once resolved: the sizes the drafts are cut to, not the unset request
        log.info("- n_max=%d, n_min=%d, p_min=%.2f", p.n_max, p.n_min, p.p_min)

    # hook for a head that needs more than the KV cache to draft: process_multi() passes it the
    # h_nextn of every injected chunk (LiliCorrDrafter overrides it)
    def store_context_features(self, seq: int, pos: np.ndarray, h_nextn) -> None:
        pass

    def begin(self, seq: int, prompt) -> None:
        if seq < 0 or seq >= self.n_seq:
            return
        n = len(prompt)
        if n <= 0:
            return
        pos_max = self.seq_pos_max(seq)
        if pos_max < n - 1:
            log.warning("begin: ctx_dft pos_max=%d < N-1=%d - process() did not run on every prefill ubatch. "
                        "Drafts may degrade.", pos_max, n - 1)

    def seq_pos_max(self, seq: int) -> int:
        return self.session.seq_pos_max(seq)

    def process(self, features, pos0: int, seq: int = 0) -> bool:
        """Inject the target features of one sequence's positions pos0.. (a target batch)."""
        return self.process_multi([(seq, features, pos0)])

    def process_multi(self, entries) -> bool:
        """entries: [(seq, features [n, len(target_layers) * n_embd], pos0), ...], one per sequence,
        as one target batch; each sequence is injected in chunks of the context's batch size, in sequence order."""
        by_seq = {}
        for seq, feats, pos0 in entries:
            if seq in by_seq:
                raise GraphgenError(f"sequence {seq} appears twice in one target batch")
            by_seq[seq] = (np.asarray(feats, dtype=np.float32), int(pos0))
        n_batch = self.session.n_batch
        for seq in range(self.n_seq):
            if seq not in by_seq:
                continue
            feats, pos0 = by_seq[seq]
            if feats.ndim != 2 or feats.shape[1] != self.n_embd_enc:
                raise GraphgenError(f"target features must be [n_tokens, {self.n_embd_enc}] "
                                    f"(len(target_layers) * n_embd), got shape {list(feats.shape)}")
            n_rows = feats.shape[0]
            for offset in range(0, n_rows, n_batch):
                n_chunk = min(n_batch, n_rows - offset)
                try:
                    r = self.session.inject(feats[offset:offset + n_chunk], pos0 + offset, seq)
                except GraphgenError as e:
                    log.error("process: llama_process(ctx_dft) failed (%s) (n_tokens=%d, offset=%d)", e, n_chunk, offset)
                    return False
                pos = np.arange(pos0 + offset, pos0 + offset + n_chunk)
                self.store_context_features(seq, pos, r.h_nextn)
        return True

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """Remove positions [p0, p1) of a sequence from the draft's KV cache (llama_memory_seq_rm)."""
        self.session.seq_rm(seq, p0, p1)

    def accept(self, seq: int, n_accepted: int, is_other: bool = False) -> None:
        pass  # noop, as upstream

    # -- drafting ---------------------------------------------------------------------------
    def _requests(self, requests) -> dict:
        if isinstance(requests, DraftRequest):
            requests = {0: requests}
        elif not isinstance(requests, dict):
            requests = dict(enumerate(requests))
        for seq, dp in requests.items():
            if not 0 <= seq < self.n_seq:
                raise GraphgenError(f"sequence id {seq} is outside [0, {self.n_seq})")
            dp.result = []
            if dp.result_q is not None or dp.want_q:
                dp.result_q = []
        return {s: requests[s] for s in sorted(requests) if requests[s].drafting}

    def block_tokens(self, dp: DraftRequest) -> int:
        """How many tokens this sequence's noise block has."""
        return self.block_n_max(dp) + 1

    def block_n_max(self, dp: DraftRequest) -> int:
        """The predictions a block holds: the driver's n_max, or the request's cap where the block
        shrinks to it (dflash_generate's edges)."""
        if dp.shrink_block and 0 < dp.n_max < self.params.n_max:
            return dp.n_max
        return self.params.n_max

    def embd_state(self, seq: int, dp: DraftRequest, n: int):
        return None

    def _decode(self, reqs: dict) -> tuple[dict, dict] | None:
        """Run one decode over the noise blocks of all drafting sequences (cut between blocks where
        they exceed n_ubatch); return the {seq: (logits, h_nextn)} rows of each block.
        The blocks are removed from the KV cache afterwards."""
        blocks, states = [], []
        for seq, dp in reqs.items():
            n = self.block_tokens(dp)
            if n > self.block_size and not self.long_blocks:
                raise GraphgenError(f"draft: a noise block of {n} tokens is longer than the draft's trained block "
                                    f"size {self.block_size}, which the {self.type} head's lattice cannot read "
                                    f"(llama.cpp aborts); keep n_max at most {self.options.n_draft_max}")
            if n > self.block_size and not self._warned_long_block:
                # upstream runs such a block without a word (DSpark's graph then drops its Markov head):
                # say it once per driver
                self._warned_long_block = True
                log.warning("draft: a noise block of %d tokens is longer than the draft's trained block size %d "
                            "(n_max %d was raised after init); the slots past it were never trained",
                            n, self.block_size, self.params.n_max)
            toks = [dp.id_last] + [self.mask_token_id] * (n - 1)
            blocks.append((seq, toks, dp.pos0))
            states.append(self.embd_state(seq, dp, n))
        if not blocks:
            return None
        groups, cur, cur_n = [], [], 0
        for b, st in zip(blocks, states):
            if cur and cur_n + len(b[1]) > self.session.n_batch:
                groups.append(cur)
                cur, cur_n = [], 0
            cur.append((b, st))
            cur_n += len(b[1])
        groups.append(cur)
        out = {}
        try:
            for grp in groups:
                st = None
                if grp[0][1] is not None:
                    st = np.concatenate([s for _, s in grp], axis=0)
                r = self.session.block_multi([b for b, _ in grp], embd_state=st)
                self.last_block = r
                beg = 0
                for (seq, toks, _), _s in grp:
                    n = len(toks)
                    out[seq] = (r.logits[beg:beg + n] if r.logits is not None else None,
                                r.h_nextn[beg:beg + n] if r.h_nextn is not None else None)
                    beg += n
        except GraphgenError as e:
            log.warning("draft: llama_process returned an error: %s", e)
            out = None
        finally:
            # the noise block is no part of the context: drop it from the draft's KV cache
            for seq, dp in reqs.items():
                self.session.seq_rm(seq, dp.pos0, -1)
        return out

    def draft(self, requests) -> dict:
        """Draft every sequence of `requests` ({seq: DraftRequest}, a list indexed by seq, or one
        request for sequence 0) in one decode; return {seq: draft tokens} (also in request.result)."""
        reqs = self._requests(requests)
        outs = self._decode(reqs)
        if outs is not None:
            for seq, dp in reqs.items():
                logits, h_nextn = outs[seq]
                self.read_draft(seq, dp, logits, h_nextn)
                # common_speculative_draft's cut to the request's own cap
                if 0 < dp.n_max < len(dp.result):
                    del dp.result[dp.n_max:]
                    if dp.result_q:
                        del dp.result_q[dp.n_max:]
        return {seq: list(dp.result) for seq, dp in reqs.items()}

    def read_draft(self, seq: int, dp: DraftRequest, logits, h_nextn) -> None:
        # rows 1.. are the mask slots: keep each row's top token until one falls below p_min
        # (the read of common_speculative_impl_draft_dflash::draft)
        p = self.params
        for i in range(1, logits.shape[0]):
            ids, _lg, probs = top10(logits[i])
            if probs[0] < F32(p.p_min):
                break
            dp.result.append(int(ids[0]))
        if len(dp.result) < p.n_min:
            dp.result.clear()


class DSparkDrafter(DFlashDrafter):
    """common_speculative_impl_draft_dspark: a block with a Markov head, optionally a confidence
    head, whose predictions normally start at the anchor slot."""

    type = "draft-dspark"

    def __init__(self, session, params: DraftParams | None = None):
        super().__init__(session, params, _subclass=True)
        # false on SpecForge exports, whose slot 0 holds a bonus token and predicts nothing
        sfa = _meta_value(self.model, "dflash.sample_from_anchor")
        self.sample_from_anchor = True if sfa is None else sfa == "true"
        if self.params.p_min > 0.0:
            hc = _meta_value(self.model, "dflash.has_confidence_head")
            if not (hc is None or hc == "true"):
                raise SpecTypeError("DSpark draft has no confidence head: please set --spec-draft-p-min 0")
        log.info("- sample_from_anchor=%s", "true" if self.sample_from_anchor else "false")
        # when the anchor slot predicts too, every one of the block_size slots is a draft token
        self.init(DFlashOptions(self.block_size if self.sample_from_anchor else self.block_size - 1,
                                True, True, True))

    def block_tokens(self, dp):
        return self.block_n_max(dp) + (0 if self.sample_from_anchor else 1)

    def read_draft(self, seq, dp, logits, h_nextn):
        p = self.params
        # with p_min set, column 0 of h_nextn (the confidence head) ends the draft early
        conf = h_nextn if p.p_min > 0.0 else None
        # a SpecForge export's slot 0 predicts nothing, so it starts at row 1 as plain DFlash does
        i_beg = 0 if self.sample_from_anchor else 1
        for i in range(i_beg, logits.shape[0]):
            if conf is not None and conf[i, 0] < F32(p.p_min):
                break
            ids, _lg, _probs = top10(logits[i])
            dp.result.append(int(ids[0]))
        if len(dp.result) < p.n_min:
            dp.result.clear()


class DFlash2Drafter(DFlashDrafter):
    """common_speculative_impl_draft_dflash2: follows the selector's lattice (dflash2_lattice in
    h_nextn) through the block, greedily, or sampled at the target's temperature with q kept for
    the verifier."""

    type = "draft-dflash2"
    long_blocks = False  # one lattice row per block slot: upstream asserts on more

    def __init__(self, session, params: DraftParams | None = None):
        super().__init__(session, params, _subclass=True)
        self.selector_top_k = session.hparams.selector_top_k
        # sampled walks draw from a per-sequence MT19937; rng_seed remembers what each one got, -1 forcing
        # a reseed at the next sampled draft
        self.rng = [MT19937() for _ in range(self.n_seq)]
        self.rng_seed = [-1] * self.n_seq
        # the walk reads the lattice from h_nextn at every block row: nothing to sample on the backend,
        # and h_nextn must not be masked
        self.init(DFlashOptions(self.block_size - 1, False, True, False))

    def begin(self, seq, prompt):
        if 0 <= seq < self.n_seq:
            # a new request restarts its generator, so its draft depends on its seed alone and not on
            # the rounds that came before it
            self.rng_seed[seq] = -1
        super().begin(seq, prompt)

    def read_draft(self, seq, dp, logits, lattice):
        p = self.params
        if lattice is None:
            raise GraphgenError("DFlash2 selector produced no lattice")
        sample = p.probabilistic and dp.result_q is not None
        temp = F32(dp.temp if sample else 1.0)
        if sample and not temp > 0:
            raise GraphgenError(f"probabilistic DFlash2 drafting needs a temperature > 0, got {dp.temp}")
        if sample and self.rng_seed[seq] != dp.seed:
            self.rng_seed[seq] = dp.seed
            # LLAMA_DEFAULT_SEED asks for fresh entropy; any other seed is xor-mixed so the draft's stream
            # does not replay the target's (spec_retune does the same)
            s = draw_seed(dp.seed) if dp.seed == LLAMA_DEFAULT_SEED else (dp.seed ^ DFLASH2_SEED_MIX) & 0xFFFFFFFF
            self.rng[seq].seed(s)
        top_k = self.selector_top_k
        pred = 0
        for i in range(1, lattice.shape[0]):
            row = lattice[i]
            scores = row[top_k + pred * top_k: top_k + pred * top_k + top_k]
            pred = int(np.argmax(scores))
            probs = None
            if p.p_min > 0.0 or sample:
                # q of the best candidate under the tempered softmax is 1 / sum_k exp((s_k - s_max) / temp)
                ex = [expf(F32(F32(scores[k] - scores[pred]) / temp)) for k in range(top_k)]
                s = F32(0.0)
                for e in ex:
                    s = F32(s + e)
                if F32(F32(1.0) / s) < F32(p.p_min):
                    break
                probs = [F32(e / s) for e in ex]
            if sample:
                # ggml_top_k returns the candidates in no fixed order; visiting them by ascending token id
                # lets one seed reproduce one draft
                order = sorted(range(top_k), key=lambda k: row[k])
                # should rounding leave u >= 0 after the last candidate, pred stays the argmax (q > 0 there)
                u = uniform_real(self.rng[seq], 0.0, 1.0)
                for k in order:
                    u -= float(probs[k])
                    if u < 0.0:
                        pred = k
                        break
                dp.result_q.append([(int(row[k]), float(scores[k]), float(probs[k])) for k in range(top_k)])
            dp.result.append(int(row[pred]))
        if len(dp.result) < p.n_min:
            dp.result.clear()
            if sample:
                dp.result_q.clear()


class LiliCorrDrafter(DFlashDrafter):
    """common_speculative_impl_draft_lilicorr: follows the scorer's lattice (lilicorr_lattice). The
    scorer is conditioned on the anchor's context features; injection fills them into a ring of
    block_size + 1 rows per sequence."""

    type = "draft-lilicorr"
    long_blocks = False  # the scorer asserts a block of exactly block_size tokens

    def __init__(self, session, params: DraftParams | None = None):
        super().__init__(session, params, _subclass=True)
        tk = _meta_value(self.model, "lilicorr.candidate_topk")
        self.top_k = int(tk) if tk is not None else 0
        self.rows = self.block_size + 1
        slots = self.n_seq * self.rows
        self.ring = np.zeros((slots, self.n_embd_dec), dtype=np.float32)
        self.ring_pos = np.full(slots, -1, dtype=np.int64)
        # the ring is filled from h_nextn after a host-copy injection, at every injected row: hence no
        # device features and no output mask
        self.init(DFlashOptions(self.block_size - 1, False, False, False))

    def store_context_features(self, seq, pos, projected):
        if projected is None:
            return
        off = seq * self.rows
        pos_min = max(0, int(pos[-1]) - self.block_size)
        for i, ps in enumerate(pos):
            ps = int(ps)
            if ps < pos_min:
                continue
            slot = off + ps % self.rows
            self.ring[slot] = projected[i]
            self.ring_pos[slot] = ps

    def seq_rm(self, seq, p0=-1, p1=-1):
        super().seq_rm(seq, p0, p1)
        # the rows stay (upstream keeps them, a later injection overwrites them); forget their positions
        lo = max(p0, 0)
        hi = np.iinfo(np.int64).max if p1 < 0 else p1
        sl = slice(seq * self.rows, (seq + 1) * self.rows)
        held = self.ring_pos[sl]
        held[(held >= lo) & (held < hi)] = -1

    def context_positions(self, seq: int) -> dict:
        """{position: ring row} of the context features held for a sequence."""
        sl = slice(seq * self.rows, (seq + 1) * self.rows)
        return {int(ps): self.ring[sl][i] for i, ps in enumerate(self.ring_pos[sl]) if ps >= 0}

    def block_tokens(self, dp):
        return self.block_size  # the scorer looks at every slot of the block, whatever n_max is

    def embd_state(self, seq, dp, n):
        slot = seq * self.rows + _c_slot(dp.pos0 - 1, self.rows)
        if self.ring_pos[slot] != dp.pos0 - 1:
            log.debug("draft: seq %d holds no context features for pos %d", seq, dp.pos0 - 1)
        return np.repeat(self.ring[slot:slot + 1], n, axis=0)

    def read_draft(self, seq, dp, logits, lattice):
        p = self.params
        if lattice is None:
            raise GraphgenError("LiliCorr scorer produced no lattice")
        top_k = self.top_k
        pred = 0
        for i in range(1, p.n_max + 1):
            row = lattice[i]
            scores = row[top_k + pred * top_k: top_k + pred * top_k + top_k]
            pred = int(np.argmax(scores))
            if p.p_min > 0.0:
                # q of the best candidate at temperature 1 is 1 / sum_k exp(s_k - s_max)
                s = F32(0.0)
                for k in range(top_k):
                    s = F32(s + expf(F32(scores[k] - scores[pred])))
                if F32(F32(1.0) / s) < F32(p.p_min):
                    break
            dp.result.append(int(row[pred]))
        if len(dp.result) < p.n_min:
            dp.result.clear()


DRIVERS = {"draft-dflash": DFlashDrafter, "draft-dspark": DSparkDrafter, "draft-dflash2": DFlash2Drafter,
           "draft-lilicorr": LiliCorrDrafter}


# -- spec types --------------------------------------------------------------------------------

def types_from_names(names) -> list[str]:
    """common_speculative_types_from_names: 'none' alone wins; an unknown name is an error."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    out = []
    for name in names:
        if name in SPEC_TYPES:
            if name == "none":
                return ["none"]
            out.append(name)
            continue
        raise SpecTypeError(f"unknown speculative type: {name}")
    return out


def types_from_gguf(path) -> list[str]:
    """common_speculative_types_from_gguf: a `dflash` draft gives the concrete type of its head
    (draft-dflash, -dspark, -dflash2 or -lilicorr), another architecture with a nextn head
    draft-mtp, anything else nothing."""
    reader = try_open(path)
    if reader is None:  # upstream finds no type in a file it cannot read
        return []
    arch = field_value(reader, "general.architecture")
    if arch is None:
        return []
    if arch != "dflash":
        n = field_value(reader, f"{arch}.block_count")
        if n is not None and any(t.name == f"blk.{int(n) - 1}.nextn.eh_proj.weight" for t in reader.tensors):
            return ["draft-mtp"]
        return []
    # the concrete type of the draft's head, detected as the loader detects it
    from ..models.arch import detect_head
    spec = detect_head({t.name for t in reader.tensors}, set(reader.fields)).spec_type
    log.info("auto-detected speculative type '%s' from the draft model metadata", spec)
    return [spec]


def check_types(types) -> str | None:
    """Return the single DFlash family type in `types` (or None): they all drive the one draft
    context, so enabling two is an error, as in common_speculative_init."""
    fam = {t for t in types if t in DFLASH_FAMILY}
    if len(fam) > 1:
        raise SpecTypeError("draft-dflash, draft-dflash2, draft-dspark and draft-lilicorr cannot be combined")
    return next(iter(fam), None)


def resolve_type(spec_type: str, variant: str | None) -> str:
    """The driver's type for a DFlash family spec type and the draft's head (llama_model_dflash_variant)."""
    from ..models.arch import HEADS
    type_model = HEADS[variant].spec_type if variant in HEADS else None
    if type_model is None:
        raise SpecTypeError(f"--spec-type {spec_type} requires a DFlash draft model")
    # draft-dflash is the generic choice and takes any head; a head-specific type must name the
    # head the draft really has
    if spec_type != "draft-dflash" and spec_type != type_model:
        raise SpecTypeError(f"--spec-type {spec_type} does not match the draft model: use {type_model}")
    return type_model


def create_drafter(session, spec_types=None, params: DraftParams | None = None) -> DFlashDrafter:
    """common_speculative_init for the DFlash family on an open Session: spec_types (names, a
    comma-separated string, or None to detect them from the draft's GGUF) -> the driver of the
    draft's head."""
    model = session.model
    if spec_types is None or spec_types == [] or spec_types == "":
        # a draft without a GGUF (speculative/torch_draft.py) names its own
        types = getattr(model, "spec_types", None) or types_from_gguf(model.path)
    else:
        types = types_from_names(spec_types)
    fam = check_types(types)
    if fam is None:
        other = [t for t in types if t != "none"]
        if other:
            raise SpecTypeError(f"--spec-type {other[0]} is not a DFlash family type; graphgen runs "
                                f"{', '.join(DFLASH_FAMILY)}")
        raise SpecTypeError("no speculative type to run: give a DFlash family --spec-type "
                            f"({', '.join(DFLASH_FAMILY)})")
    concrete = resolve_type(fam, getattr(model, "variant", None))
    return DRIVERS[concrete](session, params)
