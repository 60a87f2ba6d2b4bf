"""One draft's acceptance in several speculative loops, round by round.

`run_engines` runs the same prompts through the loop once per engine, the target always b11739
(ReferenceTarget): "llama.cpp" drafts in b11739's own draft context beside the target, "graphgen"
in graphgen's Session. Each engine gets a target of its own (b11739 allows one draft context per
target child), the same settings and the prompts in the same batches of n_seq, so with greedy
sampling the two must draft, accept and generate the same tokens round for round;
`first_divergence` finds where they do not. "authors" runs the authors' own loop instead
(graphgen.accept.authors_loop: the target in transformers, the draft from its checkpoint; z-lab's
dflash_generate for DFlash and DFlash2, graphgen.accept.speculators_loop for speculators' DSpark),
whose rounds are recorded as graphgen's but not compared token by token. `acceptance_svg` plots the acceptance per draft
position, one line per engine.

Rounds are numbered per prompt from 0; draft positions from 1, as the plot's x axis has them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import GraphgenError
from ..speculative.drafters import DraftParams
from ..speculative.loop import open_drafter
from ..speculative.targets import draft_label, resolve_draft  # noqa: F401  (re-exported)

ENGINES = ("llama.cpp", "graphgen")
# the authors' own loop (graphgen.accept.authors_loop): the target in transformers, the draft from its
# checkpoint; needs the graphgen[torch] extra
AUTHORS = "authors"
# llama.cpp's own loop (graphgen.speculative.llamaloop): b11549's common/speculative.cpp, common_sampler and
# loop, tools/build_llama.sh's graphgen-spec-loop; the other engines' target then runs on b11549 too
LLAMA_LOOP = "llama.cpp-loop"
ROOT = Path(__file__).resolve().parents[2]

# held-out text: none is a training prompt, none is made by graphgen/training/prompts.py's templates or
# word lists, and none is its HELD_OUT_PROMPTS (the card's measurement), so the two measure apart
DEFAULT_PROMPTS = [
    "The quickest way to get from London to Paris is",
    "My grandmother always told me that",
    "Our team meeting on Monday will cover",
    "To keep a houseplant healthy, you should",
    "The most popular sport in Brazil is",
    "When the train finally arrived at the station,",
]


@dataclass
class EngineRun:
    """One engine's loop over every prompt. rounds[p]: prompt p's rounds, each a dict with
    n_drafted and n_accepted, and (where the engine exposes them) pos0, id_last, the draft and
    the target's bonus token."""
    engine: str
    n_max: int
    prompts: list
    rounds: list
    tokens: list = field(default_factory=list)     # per prompt: the generated tokens
    text: list = field(default_factory=list)       # per prompt: the generated text
    seconds: float = 0.0                           # the loops' wall time, target included
    prompt_tokens: list = field(default_factory=list)  # per prompt: its tokens, as the target split it
    layers: list = field(default_factory=list)     # the target layer inputs the draft reads (il's input)
    # of `seconds`, the prefills: the prompts decoded by the target (and their features injected
    # into the draft), up to the first generated token
    prefill_seconds: float = 0.0

    @property
    def blocks(self) -> list:
        return [r for rs in self.rounds for r in rs]

    @property
    def generated_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def drafts(self) -> int:
        """Rounds that drafted at least one token: a round that drafted nothing is no draft."""
        return sum(1 for r in self.blocks if r["n_drafted"] > 0)

    @property
    def mean_acceptance_length(self) -> float:
        """The field's figure (vLLM, z-lab's dflash_generate, llama.cpp): 1 + accepted / drafts,
        the target's own token counted, so a draft that never hits has 1.0."""
        n = self.drafts
        return 1.0 + sum(r["n_accepted"] for r in self.blocks) / n if n else 1.0

    @property
    def acceptance_per_position(self) -> list:
        """Per draft position i (1..n_max): of the blocks drafted at least i tokens long, the share
        whose token i was accepted."""
        out = []
        for i in range(1, self.n_max + 1):
            drafted = [r for r in self.blocks if r["n_drafted"] >= i]
            out.append(sum(1 for r in drafted if r["n_accepted"] >= i) / len(drafted) if drafted else 0.0)
        return out

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over the whole loops' time, prefills included."""
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def n_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompt_tokens)

    @property
    def n_eval_tokens(self) -> int:
        """Generated tokens after each prompt's first, which its prefill samples: the tokens the
        generation phase made, as llama.cpp counts eval apart from prompt eval."""
        return sum(max(len(t) - 1, 0) for t in self.tokens)

    @property
    def prompt_tokens_per_s(self) -> float:
        """Prompt processing: the prompts' tokens over the prefills' time (llama.cpp's prompt eval)."""
        return self.n_prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def eval_tokens_per_s(self) -> float:
        """Generation: n_eval_tokens over the loops' time after the prefills (llama.cpp's eval)."""
        t = self.seconds - self.prefill_seconds
        return self.n_eval_tokens / t if t > 0 and self.prefill_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(blocks=len(self.blocks), drafts=self.drafts,
                 drafted_tokens=sum(r["n_drafted"] for r in self.blocks),
                 accepted_tokens=sum(r["n_accepted"] for r in self.blocks), generated_tokens=self.generated_tokens,
                 mean_acceptance_length=self.mean_acceptance_length,
                 acceptance_per_position=self.acceptance_per_position, tokens_per_s=self.tokens_per_s,
                 prompt_eval={"tokens": self.n_prompt_tokens, "seconds": self.prefill_seconds,
                              "tokens_per_s": self.prompt_tokens_per_s},
                 eval={"tokens": self.n_eval_tokens, "seconds": self.seconds - self.prefill_seconds,
                       "tokens_per_s": self.eval_tokens_per_s})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EngineRun":
        return cls(**{k: d[k] for k in ("engine", "n_max", "prompts", "rounds", "tokens", "text", "seconds")},
                   **{k: d[k] for k in ("prompt_tokens", "layers", "prefill_seconds") if k in d})


@dataclass
class Divergence:
    prompt: int          # the prompt's index
    round: int           # the prompt's round, from 0
    position: int | None  # the draft position, from 1 (None: one engine ran a round the other did not)
    what: str
    kind: str = ""        # what parts: "round", "anchor", "draft", "accepted" or "target"

    def describe(self) -> str:
        where = f"prompt {self.prompt}, round {self.round}"
        if self.position is not None:
            where += f", draft position {self.position}"
        return f"{where}: {self.what}"


def first_divergence(a, b, verified=None) -> Divergence | None:
    """The first (prompt, round, position) where two engines' runs (EngineRun or its dict) start a
    round elsewhere, draft a different token, accept a different count or see a different target
    token; None if every round agrees. `verified(x, y)`: how many drafted positions of two rounds to
    compare (attribute's: the positions both targets verified, so that a block the authors' loop
    shrank to what -n leaves is compared on its common length); by default every one, a token one
    side lacks a difference."""
    a = a if isinstance(a, EngineRun) else EngineRun.from_dict(a)
    b = b if isinstance(b, EngineRun) else EngineRun.from_dict(b)
    for p in range(max(len(a.rounds), len(b.rounds))):
        ra = a.rounds[p] if p < len(a.rounds) else []
        rb = b.rounds[p] if p < len(b.rounds) else []
        for k in range(max(len(ra), len(rb))):
            if k >= len(ra) or k >= len(rb):
                longer = a.engine if k < len(ra) else b.engine
                return Divergence(p, k, None, f"only {longer} ran this round", "round")
            x, y = ra[k], rb[k]
            if _differ(x, y, "id_last") or _differ(x, y, "pos0"):
                return Divergence(p, k, None, f"the round starts from token {x.get('id_last')} at {x.get('pos0')} in "
                                              f"{a.engine}, {y.get('id_last')} at {y.get('pos0')} in {b.engine}", "anchor")
            dx, dy = x.get("draft"), y.get("draft")
            if dx is not None and dy is not None:
                for i in range(verified(x, y) if verified else max(len(dx), len(dy))):
                    tx = dx[i] if i < len(dx) else None
                    ty = dy[i] if i < len(dy) else None
                    if tx != ty:
                        return Divergence(p, k, i + 1, f"{a.engine} drafted {_tok(tx)}, {b.engine} {_tok(ty)}", "draft")
            elif x["n_drafted"] != y["n_drafted"]:
                n = min(x["n_drafted"], y["n_drafted"]) + 1
                return Divergence(p, k, n, f"{a.engine} drafted {x['n_drafted']} tokens, {b.engine} {y['n_drafted']}",
                                  "draft")
            if x["n_accepted"] != y["n_accepted"]:
                return Divergence(p, k, min(x["n_accepted"], y["n_accepted"]) + 1,
                                  f"{a.engine} accepted {x['n_accepted']}, {b.engine} {y['n_accepted']}", "accepted")
            if _differ(x, y, "bonus"):
                return Divergence(p, k, x["n_accepted"] + 1,
                                  f"the target's token is {x['bonus']} in {a.engine}, {y['bonus']} in {b.engine}",
                                  "target")
    return None


def _differ(x: dict, y: dict, key: str) -> bool:
    """Both rounds record `key` and disagree on it (an engine that records none is not compared)."""
    return x.get(key) is not None and y.get(key) is not None and x[key] != y[key]


def _tok(t) -> str:
    return "nothing" if t is None else f"token {t}"


@dataclass
class ContextFlags:
    """llama.cpp's context flags as accept takes them for the llama.cpp and graphgen engines, with
    llama.cpp's speculative meanings: -fa both contexts, -ctk/-ctv the target's caches and
    -ctkd/-ctvd the draft's, -b the target's batch (capping the draft's micro-batch, as llama.cpp
    caps -ub at -b), -ub the draft's micro-batch, -c each context's cells (None: what the run needs)."""
    flash_attn: str = "auto"
    n_ctx: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    type_k_draft: str = "f16"
    type_v_draft: str = "f16"

    def given(self) -> list[str]:
        """The flags set away from accept's defaults, as llama.cpp spells them."""
        d = ContextFlags()
        names = {"flash_attn": "-fa", "n_ctx": "-c", "n_batch": "-b", "n_ubatch": "-ub", "type_k": "-ctk",
                 "type_v": "-ctv", "type_k_draft": "-ctkd", "type_v_draft": "-ctvd"}
        return [f"{flag} {getattr(self, k)}" for k, flag in names.items() if getattr(self, k) != getattr(d, k)]

    @property
    def micro_batch(self) -> int:
        return min(self.n_ubatch or 64, self.n_batch) if self.n_batch is not None else self.n_ubatch or 64


def _context_cells(flags: ContextFlags, prompts_text, n_predict: int, n_seq: int, block: int) -> int:
    """-c as given, else what the run needs: every sequence of a batch holds its prompt, n_predict
    tokens and one block past them (4096, llama.cpp's default, for -n -1, which fills it)."""
    if flags.n_ctx is not None:
        return flags.n_ctx                       # 0: the target's trained context
    if n_predict == -1:
        return 4096
    # a byte-level BPE gives at most a token per byte (and a BOS): a context bound before tokenizing
    longest = max(len(t.encode()) for t in prompts_text) + 2
    return max(256, -(-n_seq * (longest + n_predict + block + 1) // 256) * 256)


def _fit_n_predict(prompts, n_predict: int, n_seq: int, block: int, n_ctx: int) -> int:
    """n_predict (-1: until the text ends or each sequence's share of the context is full),
    refused, naming the sizes, where the tokenized prompts leave it no room."""
    for i, p in enumerate(prompts):
        if not p:
            raise GraphgenError(f"prompt {i}: the text gives no tokens")
    longest_tokens = max(len(p) for p in prompts)
    if n_predict == -1:
        n_predict = n_ctx // n_seq - longest_tokens - block - 1
        if n_predict < 1:
            raise GraphgenError(f"the longest prompt has {longest_tokens} tokens: with a draft block of "
                                f"{block} and -np {n_seq} the context of {n_ctx} (-c) leaves nothing "
                                "to generate")
    need = n_seq * (longest_tokens + n_predict + block + 1)
    if need > n_ctx:
        raise GraphgenError(f"the longest prompt has {longest_tokens} tokens: with -n {n_predict}, a draft "
                            f"block of {block} and -np {n_seq}, the context needs {need} cells; -c is "
                            f"{n_ctx}")
    return n_predict


def _run_engine(engine, target, draft, prompts_text, n_predict, temp, seed, n_seq, threads, layers, block,
                task=None, flags: ContextFlags | None = None) -> EngineRun:
    from ..reference.session import ReferenceTarget
    from ..speculative.loop import check_block_fits, run_speculative
    from ..speculative.verifier import TargetVerifier

    flags = flags or ContextFlags()
    n_ctx = _context_cells(flags, prompts_text, n_predict, n_seq, block)
    n_ubatch = flags.micro_batch
    runs = []
    with ReferenceTarget(target, layers, n_ctx=n_ctx, n_batch=flags.n_batch or 256, n_seq=n_seq, n_threads=threads,
                         flash_attn=flags.flash_attn, type_k=flags.type_k, type_v=flags.type_v) as tg:
        # the draft's whole trained block, as accept drafts
        drafter = open_drafter(draft, None, DraftParams(n_max=None), engine=engine, tg=tg, target=target,
                               n_ctx=n_ctx, n_ubatch=n_ubatch, flash_attn=flags.flash_attn != "off", n_seq=n_seq,
                               n_threads=threads, type_k=flags.type_k_draft, type_v=flags.type_v_draft)
        session = drafter.session
        try:
            prompts = [tg.tokenize(t) for t in prompts_text]
            check_block_fits(drafter, flags.n_batch)  # before any round
            n_predict = _fit_n_predict(prompts, n_predict, n_seq, block, tg.n_ctx)
            for c in range(0, len(prompts), n_seq):
                chunk = prompts[c:c + n_seq]
                if task is not None:
                    task.update(f"{engine}: prompts {c + 1}-{c + len(chunk)} of {len(prompts)}")
                # a fresh start for every batch: neither cache keeps the previous batch's cells
                for s in range(n_seq):
                    tg.seq_rm(s, -1, -1)
                    drafter.seq_rm(s, -1, -1)
                res = run_speculative(drafter, [(p, None) for p in chunk], n_predict=n_predict,
                                      verifier=TargetVerifier(tg, temp=temp, seed=seed), temp=temp, seed=seed,
                                      n_ctx=tg.n_ctx)
                texts = {s: b"".join(tg.pieces(res.tokens[s][res.n_prompt[s]:])[0]).decode(errors="replace")
                         for s in res.tokens}
                runs.append((res, texts))
            n_max = drafter.n_max
        finally:
            session.close()
    out = EngineRun(engine, n_max, list(prompts_text), [], prompt_tokens=prompts, layers=list(layers))
    for res, texts in runs:
        for s in sorted(res.tokens):
            out.rounds.append([{"pos0": r.pos0, "id_last": r.id_last, "draft": list(r.draft),
                                "n_drafted": len(r.draft), "n_accepted": r.n_accepted, "bonus": r.bonus}
                               for r in res.rounds if r.seq == s])
            out.tokens.append(list(res.tokens[s][res.n_prompt[s]:]))
            out.text.append(texts[s])
        out.seconds += res.t_total
        out.prefill_seconds += res.t_prefill
    return out


def trained_n_max(draft: Path) -> int:
    """What one block of the draft drafts: its block size, less the anchor slot unless a head whose
    anchor row may draft (DSpark) predicts from it (the cap the drivers put on n_max)."""
    from ..ggufile import field_value, open_reader
    from ..speculative.pair import draft_info
    from ..models.arch import HEADS
    info = draft_info(draft)
    block = info.block_size or 16
    if HEADS[info.head].anchor_row:
        sfa = field_value(open_reader(draft), "dflash.sample_from_anchor")
        if sfa is None or str(sfa).lower() == "true":   # a GGUF bool, or the string upstream compares
            return block
    return block - 1


def _run_llama_loop(target, draft, prompts_text, n_predict, temp, seed, n_seq, threads, layers, block, task=None,
                    flags: ContextFlags | None = None, build=None) -> EngineRun:
    """llama.cpp's own loop over the prompts, n_seq at a time, with the settings _run_engine gives
    the other engines (the draft's whole block drafted, as accept drafts)."""
    from ..speculative import llamaloop
    from .. import progress
    from ..reference.session import ReferenceTarget
    flags = flags or ContextFlags()
    build = build or llamaloop.ensure_build(progress.note)
    n_ctx = _context_cells(flags, prompts_text, n_predict, n_seq, block)
    with ReferenceTarget(target, layers, n_ctx=n_ctx, n_batch=64, n_threads=threads) as tg:
        prompts = [tg.tokenize(t) for t in prompts_text]
        n_ctx = tg.n_ctx
    n_predict = _fit_n_predict(prompts, n_predict, n_seq, block, n_ctx)
    fa = flags.flash_attn != "off"   # llama.cpp resolves auto to on: the CPU runs these drafts' kernels
    st = llamaloop.LoopSettings(n_predict=n_predict, n_seq=n_seq, n_ctx=n_ctx, n_batch=flags.n_batch or 256,
                                n_ubatch_draft=flags.micro_batch, flash_attn=fa, type_k=flags.type_k,
                                type_v=flags.type_v, type_k_draft=flags.type_k_draft,
                                type_v_draft=flags.type_v_draft, n_max=trained_n_max(draft), temp=temp, seed=seed,
                                threads=threads)
    out = EngineRun(LLAMA_LOOP, st.n_max, list(prompts_text), [], prompt_tokens=prompts, layers=list(layers))
    if task is not None:
        task.update(f"{LLAMA_LOOP}: {len(prompts)} prompts, {n_seq} at a time")
    # one process, the prompts n_seq at a time from empty caches, as _run_engine runs them
    st.n_seq = min(n_seq, len(prompts))
    run = llamaloop.run(build, target, draft, prompts, st)
    for p in range(len(prompts)):
        out.rounds.append([{"pos0": r["pos0"], "id_last": r["id_last"], "draft": list(r["draft"]),
                            "n_drafted": len(r["draft"]), "n_accepted": r["n_kept"], "bonus": r["bonus"]}
                           for r in run.rounds if r.get("prompt", r["seq"]) == p])
        out.tokens.append(list(run.generated[p]))
        out.text.append(run.texts[p])
    out.seconds = run.timing.get("t_total", 0.0)
    out.prefill_seconds = run.timing.get("t_prefill", 0.0)
    return out


def authors_checkpoint(draft: Path, given=None) -> Path:
    """The authors' checkpoint folder of a draft: `given`, else the GGUF's own folder; it must hold
    config.json and model.safetensors."""
    folder = Path(given) if given is not None else Path(draft).parent
    missing = [f for f in ("config.json", "model.safetensors") if not (folder / f).is_file()]
    if missing:
        how = "" if given is not None else "; give the checkpoint folder with --authors-draft DIR"
        raise GraphgenError(f"{folder}: no authors' checkpoint there ({' and '.join(missing)} missing){how}")
    return folder


def _stop_tokens(target: Path) -> list[int]:
    # the target's end-of-generation ids, where graphgen's loop ends a sequence too
    from ..ggufile import field_value, open_reader
    r = open_reader(target)
    ids = [field_value(r, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    return sorted({int(i) for i in ids if i is not None})


def _run_authors(target, draft, prompts_text, n_predict, temp, seed, layers, authors_draft, task=None,
                 threads: int = 1) -> EngineRun:
    import torch
    from ..reference.session import ReferenceTarget
    from .authors_loop import authors_accept

    folder = authors_checkpoint(draft, authors_draft)
    longest = max(len(t.encode()) for t in prompts_text) + 2
    with ReferenceTarget(target, layers, n_ctx=max(256, longest), n_batch=256, n_seq=1, n_threads=1) as tg:
        # b11739's tokenizer, as the other engines' prompts have it
        prompts = [tg.tokenize(t) for t in prompts_text]
        if task is not None:
            task.update(f"{AUTHORS}: {len(prompts)} prompts in transformers")
        # torch's threads as many as the other engines' (-t): more than the free cores spin idle
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            res = authors_accept(target, folder, prompts, n_predict, temp=temp, seed=seed,
                                 stop_token_ids=_stop_tokens(target))
        finally:
            torch.set_num_threads(before)
        out = EngineRun(AUTHORS, 0, list(prompts_text), [], prompt_tokens=prompts,
                        layers=res[0]["layers"] if res else [])
        for p, r in zip(prompts, res):
            gen = [int(t) for t in r["tokens"][len(p):]]
            out.rounds.append([dict(b) for b in r["blocks"]])
            out.tokens.append(gen)
            out.text.append(b"".join(tg.pieces(gen)[0]).decode(errors="replace"))
            out.seconds += float(r["seconds"])
    out.n_max = max((rd["n_drafted"] for rd in out.blocks), default=0)
    return out


def run_engines(target, draft, prompts_text=None, n_predict: int = 64, engines=ENGINES, temp: float = 0.0,
                seed: int = 0, n_seq: int = 1, threads: int = 1, authors_draft=None,
                flags: ContextFlags | None = None, label: str | None = None) -> dict:
    """Every prompt (default DEFAULT_PROMPTS) through the speculative loop once per engine:
    {engine: EngineRun}. The pair is checked first (graphgen.speculative.pair.check_pair, PairError).
    Engine "authors" runs the authors' loop on the checkpoint beside the GGUF (or `authors_draft`),
    one prompt at a time whatever n_seq."""
    from .. import progress
    from ..errors import PairError
    from ..speculative.pair import check_pair
    from ..runtime.model import load

    target, draft = Path(target), Path(draft)
    for what, p in (("target", target), ("draft", draft)):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such {what} model file")
    problems = check_pair(target, draft)
    if problems:
        raise PairError(problems)
    prompts_text = list(DEFAULT_PROMPTS if prompts_text is None else prompts_text)
    if not prompts_text:
        raise GraphgenError("no prompts")
    if n_predict < 1 and n_predict != -1:
        raise GraphgenError(f"n_predict must be at least 1, or -1 (until the text ends), got {n_predict}")
    if n_predict == -1 and AUTHORS in engines:
        raise GraphgenError("n_predict -1 is for the llama.cpp and graphgen engines: the authors' loop takes a count")
    if n_seq < 1:
        raise GraphgenError(f"n_seq must be at least 1, got {n_seq}")
    for e in engines:
        if e not in ENGINES + (LLAMA_LOOP, AUTHORS):
            raise GraphgenError(f"unknown engine {e!r}: the engines are {', '.join(ENGINES + (LLAMA_LOOP, AUTHORS))}")
    if AUTHORS in engines:
        authors_checkpoint(draft, authors_draft)  # before any engine runs
        from ..authors import require_torch
        require_torch()
    meta = load(draft, target=target)
    layers, block = list(meta.hparams.target_layers), meta.hparams.block_size or 16
    meta.close()
    n_seq = min(n_seq, len(prompts_text))
    out = {}
    with progress.task(f"accept {label or draft.name} on {target.name}") as task:
        for e in engines:
            if e == AUTHORS:
                out[e] = _run_authors(target, draft, prompts_text, n_predict, temp, seed, layers, authors_draft, task,
                                      threads)
                continue
            if e == LLAMA_LOOP:
                out[e] = _run_llama_loop(target, draft, prompts_text, n_predict, temp, seed, n_seq, threads, layers,
                                         block, task, flags)
                continue
            out[e] = _run_engine(e, target, draft, prompts_text, n_predict, temp, seed, n_seq, threads, layers,
                                 block, task, flags)
    return out


# -- the plot -----------------------------------------------------------------------------------

COLOURS = {"graphgen": "#1f77b4", "llama.cpp": "#d62728", "authors": "#2ca02c", LLAMA_LOOP: "#9467bd"}


def acceptance_svg(runs: dict, title: str = "") -> str:
    """Acceptance per draft position (x: 1..n_max, y: 0..1), one polyline per engine; engines that
    agree exactly draw over each other, so each later line is dashed."""
    from ..bench import html_escape
    W, H, L, R, T, B = 520, 320, 50, 20, 40, 40
    n_max = max((r.n_max for r in runs.values()), default=1) or 1

    def px(i):
        return L + (i - 1) / max(n_max - 1, 1) * (W - L - R)

    def py(v):
        return T + (1 - v) * (H - T - B)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
             'font-size="11">',
             f'<text x="10" y="16" font-size="13">{html_escape(title)}</text>',
             f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#999"/>']
    for k in range(0, 11, 2):
        y = py(k / 10)
        parts.append(f'<line x1="{L}" x2="{W - R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{k / 10:.1f}</text>')
    for i in range(1, n_max + 1):
        parts.append(f'<text x="{px(i):.1f}" y="{H - B + 14}" text-anchor="middle">{i}</text>')
    parts.append(f'<text x="{(L + W - R) / 2}" y="{H - 8}" text-anchor="middle">draft position</text>')
    parts.append(f'<text x="12" y="{(T + H - B) / 2}" transform="rotate(-90 12 {(T + H - B) / 2})" '
                 'text-anchor="middle">acceptance rate</text>')
    for j, (e, run) in enumerate(runs.items()):
        colour = COLOURS.get(e, "#555")
        dash = f' stroke-dasharray="{6 + 2 * j},{3 + 2 * j}"' if j else ""
        pts = [(px(i + 1), py(v)) for i, v in enumerate(run.acceptance_per_position)]
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="'
                     + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>' for x, y in pts]
        ly = T + 14 + 14 * j
        # the legend's longest line, "llama.cpp (mean acceptance length 1.31)", is about 231 px at 11 px
        parts.append(f'<line x1="{W - R - 265}" x2="{W - R - 245}" y1="{ly}" y2="{ly}" stroke="{colour}" '
                     f'stroke-width="2"{dash}/><text x="{W - R - 240}" y="{ly + 4}">{html_escape(e)} '
                     f'(mean acceptance length {run.mean_acceptance_length:.2f})</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
