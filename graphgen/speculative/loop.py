"""The speculative loop over the seed's drivers, a real target or a simulated verifier verifying.

`open_drafter` opens a draft in either engine (graphgen's Session, or b11739's context driven call
by call in a child process, alone or beside a target) and creates the driver of its head
(drafters.py, the seed's common/speculative.cpp); `run_speculative` prefills the sequences, then
drafts round after round while the verifier (verifier.TargetVerifier, or `SimulatedVerifier`,
which accepts a given prefix of each draft) checks them, and records what each round did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import GraphgenError
from ..ggufile import field_value, try_open
from .drafters import (LLAMA_DEFAULT_SEED, DFlashDrafter, DraftParams, DraftRequest, SpecTypeError,
                       check_types, create_drafter, types_from_gguf, types_from_names)


ENGINES = ("graphgen", "llama.cpp", "torch")


def open_drafter(model_path, spec_types=None, params: DraftParams | None = None, engine: str = "graphgen", *,
                 target=None, tg=None, wrap=None, authors_draft=None, **session_kw) -> DFlashDrafter:
    """The one way to open a draft for any engine: check the spec types against the GGUF (a
    non-DFlash draft is refused with upstream's message), open the draft's session and create the
    driver of its head. engine "graphgen": graphgen's Session (`target`: the target GGUF a draft
    borrows its embeddings and lm head from; `backend` picks the device). engine "llama.cpp":
    b11739's context in a child process, beside the open target `tg` (reference.session.
    ReferenceTarget, whose child then holds both, as ctx_other) or alone. engine "torch": the
    authors' speculators checkpoint folder `model_path` (or its loaded `authors_draft`) in PyTorch
    (torch_draft.TorchDraftSession). `wrap(session)`: a session around it (loop.RecordingSession).
    The caller closes drafter.session."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "torch":
        from .torch_draft import TorchDraftSession
        if authors_draft is None:
            from ..authors.forward import AuthorsDraft
            authors_draft = AuthorsDraft(model_path, target)
        session = TorchDraftSession(authors_draft, **session_kw)
        return create_drafter(wrap(session) if wrap else session, spec_types or None, params)
    types = types_from_gguf(model_path) if not spec_types else types_from_names(spec_types)
    fam = check_types(types)
    if fam is not None:
        reader = try_open(model_path)   # not a readable GGUF: Session reports it
        arch = field_value(reader, "general.architecture") if reader is not None else None
        if arch is not None and arch != "dflash":
            raise SpecTypeError(f"--spec-type {fam} requires a DFlash draft model")
    if engine == "graphgen":
        from ..runtime.session import Session
        session = Session(model_path, target=target, **session_kw) if target is not None else \
            Session(model_path, **session_kw)
    else:
        if session_kw.pop("backend", "cpu") not in (None, "cpu", "CPU"):
            raise GraphgenError("the llama.cpp draft engine runs on the CPU")
        if tg is not None:
            session = tg.open_draft(model_path, **session_kw)
        else:
            from ..reference.session import ReferenceSession
            session = ReferenceSession(model_path, **session_kw)
    try:
        return create_drafter(wrap(session) if wrap else session, types or spec_types, params)
    except BaseException:
        session.close()
        raise


@dataclass
class RoundRecord:
    """One drafting round of one sequence."""
    round: int
    seq: int
    pos0: int
    id_last: int
    draft: list
    n_accepted: int
    bonus: int                 # the token the (simulated) target samples after the accepted prefix
    t_draft: float             # seconds of the round's draft() (shared by the sequences drafted together)
    t_process: float           # seconds injecting the verified positions' features
    q: list | None = None      # DFlash2 probabilistic drafting: the candidate distribution per token
    t_verify: float = 0.0      # seconds of the round's target decode (shared by the sequences verified together)


@dataclass
class LoopResult:
    spec_type: str             # the driver's (concrete) type
    variant: str
    n_max: int
    rounds: list
    tokens: dict               # seq -> prompt + generated tokens
    n_prompt: dict             # seq -> prompt length
    t_prefill: float
    t_total: float
    # seq -> why it stopped: "n_predict" (that many tokens generated), "eog" (the target ended the
    # text) or "target_tokens" (the simulated verifier's given continuation ran out first)
    stop_reasons: dict = field(default_factory=dict)
    t_target: float = 0.0      # seconds in target decodes (prefill and verification; 0 when simulated)

    def per_position(self) -> list:
        return _per_position(self.rounds)

    def summary(self) -> dict:
        n_rounds = len({r.round for r in self.rounds})
        blocks = len(self.rounds)
        drafted = sum(len(r.draft) for r in self.rounds)
        accepted = sum(r.n_accepted for r in self.rounds)
        n_drafts = sum(1 for r in self.rounds if r.draft)
        t_draft = sum({r.round: r.t_draft for r in self.rounds}.values())
        t_proc = sum(r.t_process for r in self.rounds)
        return {
            "spec_type": self.spec_type, "variant": self.variant, "n_max": self.n_max,
            "rounds": n_rounds, "blocks": blocks, "drafted_tokens": drafted, "accepted_tokens": accepted,
            # the field's figure (vLLM, z-lab, llama.cpp): 1 + accepted / drafts, the target's own
            # token counted, so a draft that never hits scores 1.0; a round that drafted nothing
            # (n_min, p_min) is no draft
            "mean_acceptance_length": 1.0 + accepted / n_drafts if n_drafts else 1.0,
            "drafts": n_drafts,
            # one drafting batch serves every sequence: the tokens over the drafting wall time
            "drafted_tokens_per_s": drafted / t_draft if t_draft > 0 else 0.0,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "generated_tokens": sum(len(t) - self.n_prompt[s] for s, t in self.tokens.items()),
            "ms_per_round": 1e3 * (t_draft + t_proc) / n_rounds if n_rounds else 0.0,
            "ms_draft_per_round": 1e3 * t_draft / n_rounds if n_rounds else 0.0,
            "ms_process_per_round": 1e3 * t_proc / n_rounds if n_rounds else 0.0,
            "ms_prefill": 1e3 * self.t_prefill, "ms_total": 1e3 * self.t_total,
            "ms_target": 1e3 * self.t_target,
            "acceptance_per_position": self.per_position(),
            "stop_reasons": [self.stop_reasons.get(s) for s in sorted(self.tokens)],
        }


def _per_position(rounds) -> list:
    """Per draft position i: the fraction of blocks drafted at least i + 1 tokens long whose token i was accepted."""
    n = max((len(r.draft) for r in rounds), default=0)
    out = []
    for i in range(n):
        drafted = [r for r in rounds if len(r.draft) > i]
        out.append(sum(1 for r in drafted if r.n_accepted > i) / len(drafted) if drafted else 0.0)
    return out


class SimulatedVerifier:
    """Stands in for the target: accepts a given prefix of each draft.

    accept: draft tokens to accept per round (a list is cycled; -1 accepts the whole draft).
    target_tokens: alternatively, the target's continuation per sequence ({seq: tokens} or one list for
    all); the verifier accepts the longest draft prefix that matches it and samples its next token.
    Without target_tokens, the target's own tokens come from a generator seeded with `seed`, never the
    mask token and never the rejected draft token.
    """

    simulated = True
    t_target = 0.0

    def __init__(self, accept=(-1,), target_tokens=None, n_vocab: int = 256, mask_token: int = -1, seed: int = 0):
        self.accept = [int(a) for a in (accept if isinstance(accept, (list, tuple)) else [accept])] or [-1]
        self.target = target_tokens
        self.n_vocab, self.mask = n_vocab, mask_token
        self.rng = np.random.default_rng(seed)
        self.n_gen = {}
        self.feats: dict = {}

    # the loop's interface, shared with verifier.TargetVerifier
    def attach(self, seq: int, prompt: list, features) -> None:
        if features is None:
            raise GraphgenError(f"sequence {seq}: a simulated verifier needs the target features given")
        self.feats[seq] = (np.asarray(features, dtype=np.float32), len(prompt))

    def is_eog(self, token: int) -> bool:
        return False

    def prefill(self, seqs) -> dict:
        return {seq: (self.feats[seq][0][:self.feats[seq][1]], self.first_token(seq)) for seq in seqs}

    def verify(self, round_idx: int, drafts: dict) -> dict:
        out = {}
        for seq, (_id_last, pos0, draft) in drafts.items():
            n_acc, nxt = self.verify_one(seq, round_idx, draft)
            # the target's verify batch [id_last, draft...] at pos0.. gives these positions' features
            out[seq] = (n_acc, nxt, self.feats[seq][0][pos0:pos0 + len(draft) + 1], False)
        return out

    def _target_list(self, seq):
        if self.target is None:
            return None
        return self.target.get(seq) if isinstance(self.target, dict) else self.target

    def _random_token(self, avoid=()):
        while True:
            t = int(self.rng.integers(0, self.n_vocab))
            if t != self.mask and t not in avoid:
                return t

    def first_token(self, seq: int) -> int | None:
        """The target's first sampled token after the prompt (id_last of round 0); None: nothing left."""
        self.n_gen[seq] = 1
        tl = self._target_list(seq)
        if tl is not None:
            return int(tl[0]) if len(tl) else None
        return self._random_token()

    def verify_one(self, seq: int, round_idx: int, draft: list):
        """-> (n_accepted, next token or None when the given continuation is used up)."""
        tl = self._target_list(seq)
        j = self.n_gen[seq]
        if tl is not None:
            n = 0
            while n < len(draft) and j + n < len(tl) and int(tl[j + n]) == draft[n]:
                n += 1
            self.n_gen[seq] = j + n + 1
            return n, (int(tl[j + n]) if j + n < len(tl) else None)
        a = self.accept[round_idx % len(self.accept)]
        n = len(draft) if a < 0 else min(a, len(draft))
        self.n_gen[seq] = j + n + 1
        return n, self._random_token(avoid=(draft[n],) if n < len(draft) else ())


def check_block_fits(drafter, n_batch: int | None = None) -> None:
    """A draft block is one non-causal batch, which llama_decode cannot split: a micro-batch smaller
    than the block would fail every round. Refused before the first one, naming the block and the
    draft session's micro-batch (and -b, `n_batch` as given, where it is what capped it)."""
    micro = drafter.session.n_ubatch
    n = drafter.block_tokens(DraftRequest(id_last=0, pos0=1))
    if n > micro:
        capped = f" (-b {n_batch} caps it)" if n_batch == micro else ""
        raise GraphgenError(f"a draft block of {n} tokens (n_max {drafter.n_max}) does not fit the draft's "
                            f"micro-batch of {micro}{capped}: a block is one non-causal batch; give -ub and -b "
                            f"of at least {n}, or a smaller --spec-draft-n-max")


def run_speculative(drafter: DFlashDrafter, sequences, *, n_predict: int = 32, verifier=None,
                    temp: float = 1.0, seed: int = LLAMA_DEFAULT_SEED, progress=None,
                    n_ctx: int | None = None, edges: str = "server") -> LoopResult:
    """Speculative decoding rounds on an open driver.

    sequences: [(prompt_tokens, features), ...], sequence i on seq id i. With a SimulatedVerifier
    (the default) features holds one row per position (prompt and generated), [n_rows,
    len(target_layers) * n_embd], as the target's extracted layers would give them; with a
    verifier.TargetVerifier it is None and the real target computes them. Per sequence: the prompt's
    features are injected, then each round drafts from (id_last, pos0) -- every sequence in one
    decode --, the verifier checks the drafts (a real target: one batched decode), the features of
    the verified positions pos0..pos0+len(draft) are injected and the rejected ones removed again,
    as the server does. As llama-server, a round drafts at most the tokens left to n_predict minus
    one (the target adds its own), and with `n_ctx` (the target's context per sequence) at most what
    leaves two cells free; a sequence with no room left decodes id_last alone. Stops once n_predict
    tokens are generated per sequence, at an end-of-generation token, or when a simulated
    verifier's given continuation runs out; `stop_reasons` says which.

    edges "simple" runs llama-speculative-simple's edges instead (a real target only): each prompt
    but its last token is prefilled, that token drafts the first round, every round keeps its whole
    accepted run, and a sequence stops once past n_predict tokens. edges "authors" runs
    dflash_generate's: a round drafts up to all the tokens left, its block shrunk to them.
    """
    t_start = time.perf_counter()
    hp = drafter.session.hparams
    verifier = verifier or SimulatedVerifier(n_vocab=hp.n_vocab, mask_token=drafter.mask_token_id)
    if len(sequences) > drafter.n_seq:
        raise GraphgenError(f"{len(sequences)} sequences for a session of n_seq {drafter.n_seq}")
    if n_predict < 1:
        raise GraphgenError(f"n_predict must be at least 1, got {n_predict}")
    state = {}
    for seq, (prompt, feats) in enumerate(sequences):
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise GraphgenError(f"sequence {seq}: the prompt is empty")
        if feats is not None:
            feats = np.asarray(feats, dtype=np.float32)
            if feats.ndim != 2:
                raise GraphgenError(f"sequence {seq}: features must be a 2-D array [n_positions, "
                                    f"{drafter.n_embd_enc}], got shape {list(feats.shape)}")
            need = len(prompt) + n_predict + drafter.n_max - 1
            if feats.shape[0] < need:
                raise GraphgenError(f"sequence {seq}: the features hold {feats.shape[0]} positions; {len(prompt)} "
                                    f"prompt tokens, n_predict {n_predict} and n_max {drafter.n_max} need {need}")
        verifier.attach(seq, prompt, feats)
        state[seq] = {"tokens": list(prompt), "n_prompt": len(prompt)}
    if edges not in ("server", "simple", "authors"):
        raise GraphgenError(f"edges must be server, simple or authors, got {edges!r}")
    simple = edges == "simple"
    if simple and getattr(verifier, "simulated", True):
        raise GraphgenError("llama-speculative-simple's edges need a real target verifying (-m TARGET -md DRAFT)")
    t0 = time.perf_counter()
    first = verifier.prefill(list(state), hold_last=True) if simple else verifier.prefill(list(state))
    if not drafter.process_multi([(seq, first[seq][0], 0) for seq in state if len(first[seq][0])]):
        raise GraphgenError("injecting the prompt features failed")
    for seq, st in state.items():
        if simple:
            # the prompt's last token is not in the caches yet: it is the first round's id_last
            st["id_last"] = st["tokens"].pop()
            st["generated"] = 0
            st["done"] = False
            drafter.begin(seq, st["tokens"])
            continue
        drafter.begin(seq, st["tokens"])
        st["id_last"] = first[seq][1]
        st["generated"] = 1
        st["done"] = st["id_last"] is None or n_predict <= 1 or verifier.is_eog(st["id_last"])
        if st["id_last"] is None:
            st["stop"] = "target_tokens"
        elif st["done"]:
            st["stop"] = "eog" if verifier.is_eog(st["id_last"]) else "n_predict"
            st["tokens"].append(st["id_last"])
    t_prefill = time.perf_counter() - t0

    rounds = []
    r_idx = 0
    while True:
        active = [seq for seq, st in state.items() if not st["done"]]
        if not active:
            break
        reqs = {}
        for seq in active:
            st = state[seq]
            # server_slot::get_n_draft_max: room for the draft, the target's token and one cell spare;
            # dflash_generate drafts up to all the tokens left
            cap = n_predict - st["generated"] - (0 if edges == "authors" else 1)
            if n_ctx is not None:
                cap = min(cap, n_ctx - len(st["tokens"]) - 2)
            reqs[seq] = DraftRequest(id_last=st["id_last"], pos0=len(st["tokens"]), temp=temp, seed=seed,
                                     want_q=drafter.params.probabilistic, n_max=max(cap, 0),
                                     drafting=cap > 0, shrink_block=edges == "authors")
        t0 = time.perf_counter()
        drafts = drafter.draft(reqs) if any(dp.drafting for dp in reqs.values()) else {}
        t_draft = time.perf_counter() - t0
        t_tgt0 = verifier.t_target
        verdicts = verifier.verify(r_idx, {seq: (state[seq]["id_last"], reqs[seq].pos0, drafts.get(seq, []))
                                           for seq in active})
        t_verify = verifier.t_target - t_tgt0
        # the verified rows of every sequence go into the draft as the one target batch they were,
        # before any sequence's rejected rows leave it (the server's order: common_speculative_process
        # on the batch, then acceptance per slot); the draft's cells, and so its numerics, follow it
        t0 = time.perf_counter()
        if not drafter.process_multi([(seq, verdicts[seq][2], reqs[seq].pos0) for seq in active]):
            raise GraphgenError("injecting the verified features failed")
        t_inject = (time.perf_counter() - t0) / len(active)
        for seq in active:
            st, dp = state[seq], reqs[seq]
            draft = drafts.get(seq, [])
            n_acc, nxt, rows, eog = verdicts[seq]
            # tokens this round may still add after id_last: an accepted run that reaches n_predict is
            # cut there and the target's next token dropped, as a server stops at n_predict
            room = n_predict - st["generated"]
            if simple:
                pass   # speculative-simple keeps the whole run and stops once past n_predict
            elif n_acc >= room:
                n_acc, nxt, st["stop"] = room, None, "n_predict"
            elif nxt is None:
                st["stop"] = "target_tokens"
            elif eog:
                st["stop"] = "eog"
            pos0 = dp.pos0
            t0 = time.perf_counter()
            drafter.seq_rm(seq, pos0 + n_acc + 1, -1)
            drafter.accept(seq, n_acc)
            t_proc = t_inject + time.perf_counter() - t0
            rec = RoundRecord(r_idx, seq, pos0, st["id_last"], list(draft), n_acc,
                              -1 if nxt is None else nxt, t_draft, t_proc, dp.result_q, t_verify)
            rounds.append(rec)
            st["tokens"] += [st["id_last"]] + draft[:n_acc]
            st["generated"] += n_acc + (1 if nxt is not None else 0)
            st["id_last"] = nxt
            if nxt is None or (st["generated"] > n_predict if simple else st["generated"] >= n_predict) or eog:
                st["done"] = True
                st.setdefault("stop", "n_predict")
                if nxt is not None:
                    st["tokens"].append(nxt)
            if progress is not None:
                progress(rec)
        r_idx += 1
    return LoopResult(spec_type=drafter.type, variant=drafter.model.variant, n_max=drafter.n_max, rounds=rounds,
                      tokens={seq: st["tokens"] for seq, st in state.items()},
                      n_prompt={seq: st["n_prompt"] for seq, st in state.items()}, t_prefill=t_prefill,
                      t_total=time.perf_counter() - t_start,
                      stop_reasons={seq: st.get("stop") for seq, st in state.items()},
                      t_target=verifier.t_target)


class RecordingSession:
    """A draft session that writes down every call the driver makes as a scenario step, with the
    features it injected: a run on a real target, replayable by `graphgen dump` in either engine."""

    def __init__(self, session):
        self._s = session
        self.steps: list[dict] = []
        self.features: dict[str, np.ndarray] = {}

    def __getattr__(self, name):
        return getattr(self._s, name)

    def inject(self, features, pos0: int, seq: int = 0):
        x = np.ascontiguousarray(features, dtype=np.float32)
        self.features[f"step{len(self.steps)}"] = x.copy()
        self.steps.append({"inject": {"n_tokens": int(x.shape[0]), "pos0": int(pos0), "seq": int(seq)}})
        return self._s.inject(x, pos0, seq)

    def block_multi(self, blocks, embd_state=None):
        self.steps.append({"block": {"seqs": [{"seq": int(s), "tokens": [int(t) for t in toks], "pos0": int(p)}
                                              for s, toks, p in blocks]}})
        return self._s.block_multi(blocks, embd_state=embd_state)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1):
        self.steps.append({"seq_rm": {"seq": int(seq), "p0": int(p0), "p1": int(p1)}})
        return self._s.seq_rm(seq, p0, p1)

    def scenario(self, **settings) -> dict:
        return dict(settings, steps=list(self.steps))
