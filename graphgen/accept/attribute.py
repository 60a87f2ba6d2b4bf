"""Which stage makes the authors' loop accept differently from b11739's.

The authors' loop (graphgen.accept.authors_loop: the target in transformers, the authors' draft) and
b11739's ("llama.cpp": the target and the draft in b11739) run the same target GGUF and the same
trained draft, and can still draft or accept differently. Four stages can explain it:

- the target's features: what each loop's target hands the draft (b11739's Q4_1 matmuls against
  transformers' float ones; or other layers than the draft's GGUF names);
- the draft forward: what the draft computes from identical features;
- the sampling: which token each engine takes from its logits (greedy: the argmax);
- the verification: how many drafted tokens each loop accepts against its target's tokens.

`attribute(target, runs)` tests each on the rounds both loops ran, with fresh passes of the two
targets over each engine's text (b11739 in a child process, transformers in float32) and the
authors' draft replayed one block at a time (authors_loop.replay: z-lab's forward, DFlash2's
selector walk, or speculators' modules with DSpark's Markov chain, as the loop drafts):

- features: per draft layer, the NMSE of transformers' input of the layer the authors' loop reads
  against b11739's input of the layer the GGUF names, over llama.cpp's texts (positions 1..: the
  first carries SmolLM2's massive activation, docs/acceptance.md); within FEATURE_NMSE_BAND it is
  the quantized target's numerics;
- draft forward: the authors' draft on b11739's features of each llama.cpp round must draft what
  llama.cpp drafted, at every position the round verified;
- sampling: each engine's target token must be the argmax of its own target's logits, and each
  authors' draft the argmax of its draft's logits on its own features;
- verification: the authors' acceptance rule (authors_loop.authors_rule) on llama.cpp's drafts and
  target tokens must give llama.cpp's accepted count, and on the authors' drafts and the fresh
  transformers target's tokens the authors' count.

Where the two loops part first (`first_parting`: an anchor, a drafted token at a verified position,
an accepted count or a target token), the stage that explains that round is named, with the
tokens each engine and each replay gave there. Drafted tokens past the first rejected one are
never verified, and are not compared.

Rounds are numbered per prompt from 0, draft positions from 1, as in compare.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import GraphgenError
from .compare import AUTHORS, Divergence, EngineRun, first_divergence

FEATURES, DRAFT, SAMPLING, VERIFICATION = "target features", "draft forward", "sampling", "verification"
STAGES = (FEATURES, DRAFT, SAMPLING, VERIFICATION)
REFERENCE = "llama.cpp"
# b11739 on the Q4_1 SmolLM2 against transformers on the same file: 9e-5 to 4e-4 per layer
# (docs/acceptance.md); 1e-3 leaves 2.5x for other targets' numerics, while an input one layer off
# is 1e-2 or more away
FEATURE_NMSE_BAND = 1e-3
# A token within this many logits of the best one is a tie that the engines' numerics decide, not a
# stage's fault: rounding the shipped drafts' weights to the GGUF's q8_0 moves their logits by up to
# 0.12 (DFlash; 0.09 and 0.07 at DSpark's and DFlash2's unchained rows, docs/acceptance.md), and
# ggml's q8_0 matmul rounds the activations too; a wrong mask token or layer moves whole logits
TIE_BAND = 0.25
# where a parting is such a tie, in the draft or in b11739's target (not STAGES: nothing is blamed)
DRAFT_TIE, TARGET_TIE = "draft numerics", "b11739's batch numerics"


class AttributionError(GraphgenError, ValueError):
    """Runs the attribution cannot compare; the message names what is missing."""


@dataclass
class Stage:
    name: str
    blamed: bool
    checked: int             # rounds (or layers) checked
    failed: int              # of those, where the stage makes the engines differ
    evidence: str
    first: dict | None = None  # the first failing round: prompt, round, position and the tokens


@dataclass
class Attribution:
    parting: Divergence | None       # the first round where the two loops part
    explained_by: str | None         # the stage that explains it
    explanation: str                 # in words, with the tokens
    stages: list = field(default_factory=list)
    nmse: list = field(default_factory=list)       # per draft layer: (llama.cpp layer, authors' layer, NMSE)
    feature_changed_rounds: int = 0  # llama.cpp rounds whose verified draft changes on transformers' features
    rounds: int = 0
    # on llama.cpp's rounds, what its target accepts of the authors' draft on transformers' features
    # and on b11739's: the features' own effect on acceptance, the texts held the same
    counterfactual_mean: float = 0.0
    counterfactual_llama: float = 0.0
    mean_band: float = 0.0           # how far the authors' mean acceptance length may be from llama.cpp's

    @property
    def blamed(self) -> list[str]:
        return [s.name for s in self.stages if s.blamed]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    @property
    def features_in_band(self) -> bool:
        return all(v <= FEATURE_NMSE_BAND for _, _, v in self.nmse)

    def to_dict(self) -> dict:
        return {"parting": None if self.parting is None else asdict(self.parting),
                "explained_by": self.explained_by, "explanation": self.explanation,
                "blamed": self.blamed, "stages": [asdict(s) for s in self.stages],
                "nmse": [{"llama_layer": a, "authors_layer": b, "nmse": v} for a, b, v in self.nmse],
                "features_in_band": self.features_in_band, "feature_nmse_band": FEATURE_NMSE_BAND,
                "feature_changed_rounds": self.feature_changed_rounds, "rounds": self.rounds,
                "counterfactual_mean": self.counterfactual_mean,
                "counterfactual_llama": self.counterfactual_llama, "mean_band": self.mean_band}

    def lines(self) -> list[str]:
        out = []
        if self.parting is None:
            out.append("llama.cpp and the authors' loop: the same anchors, verified drafts, accepted counts "
                       "and target tokens in every round")
        else:
            out.append(f"llama.cpp and the authors' loop part first at {self.parting.describe()}")
            out.append(f"  explained by: {self.explained_by or 'nothing checked here'}: {self.explanation}")
        nm = ", ".join(f"{a}{'' if a == b else f'(authors {b})'} {v:.2e}" for a, b, v in self.nmse)
        out.append(f"feature NMSE per draft layer, llama.cpp vs transformers: {nm} "
                   f"({'within' if self.features_in_band else 'BEYOND'} the quantized target's band "
                   f"{FEATURE_NMSE_BAND:.0e})")
        out.append(f"on llama.cpp's {self.rounds} rounds, the authors' draft on transformers' features would get "
                   f"{self.counterfactual_mean:.3f} accepted per round ({self.counterfactual_llama:.3f} on "
                   f"b11739's); the authors' mean may lie within "
                   f"{self.mean_band:.3f} of llama.cpp's")
        for s in self.stages:
            out.append(f"  {s.name:<16} {'BLAMED' if s.blamed else 'ok':<7} {s.evidence}")
        return out


# -- where the loops part -----------------------------------------------------------------------

def _verified(r: dict, o: dict) -> int:
    """Draft positions both rounds verified: up to the first one either rejected."""
    return min(len(r["draft"]), len(o["draft"]), min(r["n_accepted"], o["n_accepted"]) + 1)


def first_parting(a: EngineRun, c: EngineRun) -> Divergence | None:
    """The first (prompt, round, position) where two loops' rounds part (compare.first_divergence),
    a drafted token compared only at a position both verified."""
    return first_divergence(a, c, verified=_verified)


# -- the passes ---------------------------------------------------------------------------------

def _llama_pass(target, layers, seqs, n_threads: int = 1):
    """b11739 over each token list from position 0: [(features [n, L, n_embd], top-1 [n], top ids
    [n, k], their logits [n, k])]."""
    from ..reference.session import ReferenceTarget
    from . import features as F
    checked = [F._check(target, layers, s) for s in seqs]
    # and per row its best ids and their logits, best first
    path, layers, _, n_embd = checked[0]
    n_ctx = -(-max(len(c[2]) for c in checked) // 256) * 256
    out = []
    with ReferenceTarget(path, layers, n_ctx=n_ctx, n_batch=256, n_seq=1, n_threads=n_threads,
                         **F.LLAMA_DEFAULTS) as t:
        for _, _, tokens, _ in checked:
            t.seq_rm(0, -1, -1)  # each text alone
            feats, top, logit = [], [], []
            for p0 in range(0, len(tokens), t.n_batch):
                ids, lg, f = t.decode([(0, tok, p0 + k) for k, tok in enumerate(tokens[p0:p0 + t.n_batch])])
                feats.append(f)
                top.append(ids)
                logit.append(lg)
            top = np.concatenate(top)
            out.append((np.concatenate(feats).reshape(len(tokens), len(layers), n_embd),
                        [int(x) for x in top[:, 0]], top, np.concatenate(logit)))
    return out


def _torch_pass(target, layers, seqs):
    """transformers over each token list: [(features [n, L, n_embd], argmax [n])]."""
    from .features import transformers_run
    out = []
    for s in seqs:
        f, lg = transformers_run(target, layers, s, logits=True)
        out.append((f, [int(x) for x in lg.argmax(axis=1)]))
    return out


def _lcp(draft, tokens) -> int:
    n = 0
    for d, t in zip(draft, tokens):
        if d != t:
            break
        n += 1
    return n


# -- the attribution ----------------------------------------------------------------------------

def attribute(target, runs: dict, authors_draft, n_threads: int = 1) -> Attribution:
    """The stages that make runs["authors"] differ from runs["llama.cpp"] (greedy runs of
    compare.run_engines on the same prompts), and the one that explains where they part first.
    authors_draft: the authors' checkpoint folder, loaded as the authors' loop loads it."""
    from . import authors_loop as AL
    for e in (REFERENCE, AUTHORS):
        if e not in runs:
            raise AttributionError(f"runs: no {e!r} run; the attribution compares llama.cpp and the authors' loop")
    a = runs[REFERENCE] if isinstance(runs[REFERENCE], EngineRun) else EngineRun.from_dict(runs[REFERENCE])
    c = runs[AUTHORS] if isinstance(runs[AUTHORS], EngineRun) else EngineRun.from_dict(runs[AUTHORS])
    for r in (a, c):
        if len(r.prompt_tokens) != len(r.rounds) or not r.layers:
            raise AttributionError(f"{r.engine}: its run has no prompt tokens or draft layers (run_engines' runs)")
        if any("draft" not in b for b in r.blocks):
            raise AttributionError(f"{r.engine}: its rounds hold no drafts")
    if a.prompt_tokens != c.prompt_tokens:
        raise AttributionError("llama.cpp and the authors' loop ran different prompts")
    if len(a.layers) != len(c.layers):
        raise AttributionError(f"llama.cpp's draft reads {len(a.layers)} layers, the authors' {len(c.layers)}")
    seq_a = [list(p) + list(t) for p, t in zip(a.prompt_tokens, a.tokens)]
    seq_c = [list(p) + list(t) for p, t in zip(c.prompt_tokens, c.tokens)]
    L = _llama_pass(target, a.layers, seq_a, n_threads)
    T = _torch_pass(target, c.layers, seq_a)
    Tc = _torch_pass(target, c.layers, seq_c)
    tmodel, draft, _ = AL.load(target, authors_draft)

    from .features import nmse
    rows = [np.arange(1 if len(s) > 1 else 0, len(s)) for s in seq_a]
    fl = np.concatenate([x[0][r] for x, r in zip(L, rows)])
    ft = np.concatenate([f[r] for (f, _), r in zip(T, rows)])
    nm = [(int(x), int(y), float(v)) for x, y, v in zip(a.layers, c.layers, nmse(ft, fl))]

    # replays: the authors' draft on b11739's and on transformers' features of every llama.cpp
    # round's context, and on transformers' features of every authors' round's
    # (with how far below the replay's best each token llama.cpp drafted lies, in logits, and for
    # DFlash2 whether only another top-k candidate set than the replay's own makes it a tie)
    rep_l, rep_t, rep_c, gap_l, edge_l = [], [], [], [], []
    # llama.cpp drafts a whole block of its n_max and cuts the draft near -n (as llama-server): the
    # replay runs the same block, its first tokens compared
    nb = a.n_max
    for p, rs in enumerate(a.rounds):
        rep_l.append([])
        gap_l.append([])
        edge_l.append([])
        for r in rs:
            if hasattr(draft, "propose"):
                # DFlash2: each token's selector score over every candidate set the numerics could pick
                toks = AL.replay(tmodel, draft, L[p][0][:r["pos0"]], r["id_last"], r["pos0"], nb)
                un, sc, top_k = AL.selector_rows(tmodel, draft, L[p][0][:r["pos0"]], r["id_last"], r["pos0"],
                                                 nb, toks)
                gaps = [edge_gap(un[i], sc[i], t, top_k) for i, t in enumerate(r["draft"])]
                # a tie only another candidate set gives: the token outside the replay's own top-k, or
                # beyond the band of that set's best
                edge = [g <= TIE_BAND < edge_gap(un[i], sc[i], t, top_k, 0.0) for i, (g, t) in enumerate(zip(gaps, r["draft"]))]
            else:
                toks, lg = AL.replay(tmodel, draft, L[p][0][:r["pos0"]], r["id_last"], r["pos0"], nb, logits=True)
                gaps = [float(lg[i].max() - lg[i][t]) for i, t in enumerate(r["draft"])]
                edge = [False] * len(gaps)
            rep_l[-1].append(list(toks)[:len(r["draft"])])
            gap_l[-1].append(gaps)
            edge_l[-1].append(edge)
        rep_t.append([list(AL.replay(tmodel, draft, T[p][0][:r["pos0"]], r["id_last"], r["pos0"], nb))[:len(r["draft"])]
                      for r in rs])
    for p, rs in enumerate(c.rounds):
        rep_c.append([AL.replay(tmodel, draft, Tc[p][0][:r["pos0"]], r["id_last"], r["pos0"], len(r["draft"]))
                      for r in rs])

    def where(p, k, i=None, **tokens):
        return dict(prompt=p, round=k, position=i, **tokens)

    # draft forward: the authors' draft on llama.cpp's features drafts what llama.cpp drafted
    # (a token llama.cpp drafted within TIE_BAND of the replay's best is a tie of the numerics)
    fail_d, ties_d, changed, cf, cf_l = {}, {}, 0, [], []
    for p, rs in enumerate(a.rounds):
        for k, r in enumerate(rs):
            n = min(len(r["draft"]), r["n_accepted"] + 1)
            dl, dt = rep_l[p][k], rep_t[p][k]
            i = _lcp(dl[:n], r["draft"][:n])
            if i < n:
                (ties_d if gap_l[p][k][i] <= TIE_BAND else fail_d)[(p, k)] = \
                    where(p, k, i + 1, authors=dl[i], llama=r["draft"][i], gap=gap_l[p][k][i],
                          edge=edge_l[p][k][i])
            # what llama.cpp's target would accept of the authors' draft on transformers' features
            text = seq_a[p][r["pos0"] + 1:]
            cap = r["n_accepted"] if r["bonus"] == -1 else len(dt)
            acc = min(_lcp(dt, text), cap)
            cf.append(acc)
            cf_l.append(min(_lcp(dl, text), cap))
            changed += int(acc != cf_l[-1] or _lcp(dt[:n], dl[:n]) < n)
    n_a = sum(len(rs) for rs in a.rounds)
    stages = []

    # sampling: each target token the argmax of its own target; each authors' draft its draft's argmax
    # (b11739's token within TIE_BAND of the best of its fresh pass, whose batches are shaped otherwise,
    # is a tie of its numerics)
    fail_s, ties_s, checked_s = {}, {}, 0
    for eng, run, passes in ((REFERENCE, a, L), (AUTHORS, c, Tc)):
        for p, rs in enumerate(run.rounds):
            top = passes[p][1]
            for k, r in enumerate(rs):
                checked_s += 1
                row = r["pos0"] + r["n_accepted"]
                best = top[row]
                if r["bonus"] != -1 and r["bonus"] != best:
                    gap = float("inf")
                    if eng == REFERENCE and r["bonus"] in passes[p][2][row]:
                        lg = passes[p][3][row]
                        gap = float(lg[0] - lg[list(passes[p][2][row]).index(r["bonus"])])
                    (ties_s if gap <= TIE_BAND else fail_s).setdefault(
                        (p, k), where(p, k, r["n_accepted"] + 1, engine=eng, token=r["bonus"], argmax=best,
                                      what="target token", gap=gap))
    for p, rs in enumerate(c.rounds):
        for k, r in enumerate(rs):
            checked_s += 1
            i = _lcp(rep_c[p][k], r["draft"])
            if i < len(r["draft"]):
                fail_s.setdefault((p, k), where(p, k, i + 1, engine=AUTHORS, token=r["draft"][i],
                                                argmax=rep_c[p][k][i], what="drafted token"))

    # verification: the authors' rule on llama.cpp's tokens, and on the fresh float target's
    fail_v = {}
    for eng, run, seqs, passes in ((REFERENCE, a, seq_a, None), (AUTHORS, c, seq_c, Tc)):
        for p, rs in enumerate(run.rounds):
            for k, r in enumerate(rs):
                pos0, n = r["pos0"], r["n_accepted"]
                if passes is None:
                    # llama.cpp's own target tokens: the accepted ones, then its token
                    tokens = seqs[p][pos0 + 1:pos0 + 2 + n]
                else:
                    tokens = passes[p][1][pos0:pos0 + len(r["draft"]) + 1]
                got = min(AL.authors_rule(r["draft"], tokens), n if r["bonus"] == -1 else len(r["draft"]))
                if got != n:
                    fail_v.setdefault((p, k), where(p, k, min(got, n) + 1, engine=eng, accepted=n, rule=got))
    n_c = sum(len(rs) for rs in c.rounds)

    # where they part first, and what explains it
    part = first_parting(a, c)
    by, why = None, ""
    if part is not None:
        p, k, i = part.prompt, part.round, part.position
        ra, rc = a.rounds[p][k], c.rounds[p][k]
        if part.kind == "draft":
            dl, dt = rep_l[p][k], rep_t[p][k]
            j = _lcp(dl[:i], ra["draft"][:i])
            tie = j < i and gap_l[p][k][j] <= TIE_BAND
            if j < i and not tie:
                by = DRAFT
                why = (f"the authors' draft on llama.cpp's features drafts token {dl[j]}, llama.cpp drafted "
                       f"{ra['draft'][j]}: the draft forward differs on identical features")
            elif dt[:i] == rc["draft"][:i] and dt[:i] != dl[:i]:
                by = FEATURES
                as_llama = "as llama.cpp did" if not tie else \
                    f"llama.cpp's draft a token within {TIE_BAND} logits of it ({ra['draft'][j]})"
                why = (f"the authors' draft drafts token {dl[i - 1]} on llama.cpp's features, {as_llama}, "
                       f"and token {dt[i - 1]} on transformers' features, as the authors' loop did: the target's "
                       f"features explain it (NMSE {_nm(nm)})")
            elif tie:
                by = DRAFT_TIE
                set_ = (" in a candidate set b11739's top-k may take (the unary logits at its edge lie within the "
                        "band)") if edge_l[p][k][j] else ""
                why = (f"llama.cpp drafted token {ra['draft'][j]} at position {j + 1}, {gap_l[p][k][j]:.3f} logits "
                       f"below the authors' draft's best ({dl[j]}) on the same features{set_}: a tie within "
                       f"{TIE_BAND} that the drafts' weights (the GGUF's q8_0, the checkpoint's) decide")
            else:
                by = SAMPLING
                why = (f"the authors' loop drafted token {rc['draft'][i - 1]} where its draft's argmax on its own "
                       f"features is {dt[i - 1]}")
        elif part.kind in ("accepted", "target"):
            row = ra["pos0"] + i - 1
            if (p, k) in fail_v:
                f = fail_v[(p, k)]
                by = VERIFICATION
                why = (f"{f['engine']} accepted {f['accepted']} drafted tokens, the authors' rule on its target's "
                       f"tokens accepts {f['rule']}")
            elif (p, k) in fail_s:
                f = fail_s[(p, k)]
                by = SAMPLING
                why = f"{f['engine']} took {f['what']} {f['token']} where the argmax is {f['argmax']}"
            elif (p, k) in ties_s and L[p][1][row] == T[p][1][row]:
                f = ties_s[(p, k)]
                by = TARGET_TIE
                why = (f"llama.cpp's target token {f['token']} lies {f['gap']:.3f} logits below the best of b11739's "
                       f"fresh pass ({f['argmax']}): a tie within {TIE_BAND} of its numerics")
            elif L[p][1][row] != T[p][1][row]:
                by = FEATURES
                why = (f"the target's token after the same {row + 1} tokens is {L[p][1][row]} in llama.cpp, "
                       f"{T[p][1][row]} in transformers: the target's numerics (feature NMSE {_nm(nm)})")
            else:
                why = part.what + "; no stage reproduces it"
        else:
            why = part.what + "; no stage reproduces it"

    def first(fails):
        return fails[min(fails)] if fails else None

    tie_d = _ties(ties_d, "llama.cpp drafted a token within")
    tie_s = _ties(ties_s, "b11739's target token lies within")
    in_band = all(v <= FEATURE_NMSE_BAND for _, _, v in nm)
    stages.append(Stage(FEATURES, by == FEATURES or not in_band, len(nm), sum(v > FEATURE_NMSE_BAND for _, _, v in nm),
                        f"NMSE up to {max(v for _, _, v in nm):.2e}; on llama.cpp's {n_a} rounds, transformers' "
                        f"features change the authors' draft's verified tokens or acceptance in {changed}",
                        None))
    stages.append(Stage(DRAFT, by == DRAFT or bool(fail_d), n_a, len(fail_d),
                        f"the authors' draft on llama.cpp's features drafts llama.cpp's verified tokens in "
                        f"{n_a - len(fail_d) - len(ties_d)} of {n_a} rounds{tie_d}",
                        first(fail_d)))
    stages.append(Stage(SAMPLING, by == SAMPLING or bool(fail_s), checked_s, len(fail_s),
                        f"rounds where a target token or an authors' drafted token is not its logits' argmax: "
                        f"{len(fail_s)} of {checked_s}{tie_s}",
                        first(fail_s)))
    stages.append(Stage(VERIFICATION, by == VERIFICATION or bool(fail_v), n_a + n_c, len(fail_v),
                        f"rounds whose accepted count the authors' rule does not give: {len(fail_v)} of {n_a + n_c}",
                        first(fail_v)))
    cf_t, cf_ll = (sum(cf) / len(cf), sum(cf_l) / len(cf_l)) if cf else (0.0, 0.0)
    return Attribution(part, by, why, stages, nm, changed, n_a, cf_t, cf_ll, mean_band(a, abs(cf_t - cf_ll)))


def edge_gap(unary, scores, token: int, top_k: int, band: float = TIE_BAND) -> float:
    """How far below the best of its candidate set DFlash2's selector scores `token`, over every
    top-k set the two drafts' numerics could take (inf if none holds it).

    The selector scores only the top_k tokens by unary logit, and a token's score (its unary logit
    plus the bilinear term after the previous token) can put the set's last member far ahead of the
    rest; where the k-th and (k+1)-th unary logits lie within `band`, q8_0 and bf16 weights rank
    them either way. As for the ties of the argmax, each logit may lie up to band / 2 off: a set S
    of top_k tokens can be picked when min(unary over S) >= max(unary outside S) - band. For each
    lowest member m of S, the tokens above m + band must be in S, the rest is filled from those
    within [m, m + band] that score lowest; the gap is the least over those sets."""
    unary = np.asarray(unary, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    token = int(token)
    # a set's tokens all lie within band of its top_k-th unary logit or above it
    pool = np.argsort(-unary, kind="stable")[:top_k]
    pool = np.flatnonzero(unary >= unary[pool[-1]] - band)
    if token not in set(pool.tolist()):
        return float("inf")
    u, s = unary[pool], scores[pool]
    t = int(np.flatnonzero(pool == token)[0])
    others = np.arange(len(pool)) != t
    best = float("inf")
    for m in np.unique(u[u <= u[t]])[::-1]:
        forced = others & (u > m + band)
        if forced.sum() > top_k - 1:
            break
        free = np.flatnonzero(others & ~forced & (u >= m))
        need = top_k - 1 - int(forced.sum())
        if len(free) < need:
            continue
        rest = np.concatenate([s[forced], np.sort(s[free])[:need]])
        best = min(best, max(0.0, float(rest.max() - s[t])) if len(rest) else 0.0)
    return best


def mean_band(a: EngineRun, shift: float) -> float:
    """How far the authors' mean acceptance length may lie from llama.cpp's (docs/acceptance.md): the
    features' own shift on llama.cpp's rounds (`shift`: the counterfactual means' difference), plus two standard errors of
    a difference of two means of its rounds' accepted counts, as if every round ran on other text:
    the float target's greedy token differs from the quantized one's at a few percent of positions,
    and from there the two loops continue different texts. The band bounds a difference of two
    means, which the + 1 of the field's figure (1 + accepted / drafts) leaves unchanged."""
    n = [r["n_accepted"] for r in a.blocks]
    if len(n) < 2:
        return float("inf")
    m = sum(n) / len(n)
    sd = (sum((x - m) ** 2 for x in n) / (len(n) - 1)) ** 0.5
    return shift + 2 * sd * (2 / len(n)) ** 0.5


def _ties(ties: dict, what: str) -> str:
    if not ties:
        return ""
    edge = sum(bool(t.get("edge")) for t in ties.values())
    at_edge = f"; {edge} of them DFlash2 candidate sets that the unary logits' top-k edge decides" if edge else ""
    return (f"; in {len(ties)} more, {what} {TIE_BAND} logits of the best (ties the numerics decide, up to "
            f"{max(t['gap'] for t in ties.values()):.3f} below{at_edge})")


def _nm(nm) -> str:
    return ", ".join(f"layer {x} {v:.1e}" for x, _, v in nm)
