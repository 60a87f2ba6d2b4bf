"""The plan: which batches run, and the steps that compute each sequence's block batched and alone.

"Alone" is run two ways, each in a fresh context with the batch's settings:

- same cache: the batched run, then the sequence's block removed (seq_rm) and computed again
  alone. The block lands in the cells it had (the cache's head moves back to the freed cells)
  and the cache holds what it held in the batch, cell for cell, so the batch is the only
  difference: every node with a token (or block) axis is compared on the sequence's rows, and
  the nodes that hold the whole cache are compared whole.
- own cache: the sequence's prompt and block in the same cells, the others' cells filled by
  another sequence with other values (fillers). What the sequence may see is the same and what
  it may not see differs, so a sequence that sees another's cells shows here; only the outputs
  are compared (the raw attention scores of hidden cells differ by design).

The cells matter: masked cells contribute exact zeros, but where a sequence's cells sit along
the n_kv axis decides the lanes its sums run in, so a sequence moved to other cells may change
its last bits for reasons that have nothing to do with the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..play.scenario import SeqBlock, Scenario, Step

KINDS = ("equal", "unequal")


# raised by the plan, the measurement and check_batch alike: here, since the other two import the plan
class CheckBatchError(ValueError):
    """Bad input, or a comparison that could not measure; the message names the flag or node."""


@dataclass
class Case:
    """One batch: n_seq sequences, each with its own prompt (length, hence positions) and block."""
    n_seq: int
    kind: str                       # "equal" or "unequal"
    prompts: list[int] = field(default_factory=list)    # prompt length of each sequence
    blocks: list[list[int]] = field(default_factory=list)  # block tokens of each sequence
    note: str | None = None         # why the case does not run

    @property
    def offsets(self) -> list[int]:
        """Each block's first row in the batch."""
        return [int(x) for x in np.cumsum([0] + [len(b) for b in self.blocks])[:-1]]

    @property
    def n_tokens(self) -> int:
        return sum(len(b) for b in self.blocks)

    @property
    def n_cells(self) -> int:
        return sum(self.prompts) + self.n_tokens


def block_lengths(n_seq: int, block: int, kind: str) -> list[int]:
    """Equal: every block `block` long. Unequal: block, block-1, ..., 1, block, ... so that
    neighbours always differ."""
    if kind == "equal":
        return [block] * n_seq
    return [block - k % block for k in range(n_seq)]


def plan_cases(rules, n_vocab: int, mask_token: int, n_seqs, block: int, prompt: int, seed: int) -> list[Case]:
    """The cases to run; rules: the head's BlockRules (equal blocks, longest block)."""
    rng = np.random.default_rng(seed)
    cases = []
    for n in n_seqs:
        for kind in KINDS:
            case = Case(n, kind)
            if kind == "unequal":
                if n == 1:
                    case.note = "one sequence: no unequal blocks"
                elif rules.equal_blocks:
                    case.note = f"unequal blocks: not allowed by this head ({rules.head} reshapes a batch to equal blocks)"
                elif block == 1:
                    case.note = "unequal blocks: --block 1 leaves no shorter block"
                if case.note:
                    cases.append(case)
                    continue
            # different lengths, so different positions, and different features per sequence
            case.prompts = [prompt + (3 * k) % 5 for k in range(n)]
            for length in block_lengths(n, block, kind):
                first = int(rng.integers(0, n_vocab))
                case.blocks.append([first] + [mask_token] * (length - 1))
            cases.append(case)
    return cases


@dataclass
class Settings:
    n_ctx: int
    n_ubatch: int
    flash_attn: bool
    type_k: str
    type_v: str
    seed: int
    cells: int = 0          # the cells the largest case takes (every prompt and block)
    longest: int = 0        # the most tokens one step sends (the largest batched block, or a prompt)
    n_threads: int = 1
    flash_attn_asked: str | None = None   # "auto" when -fa auto decided flash_attn


def settings_for(cases: list[Case], flash_attn: bool, type_k: str, type_v: str, seed: int,
                 n_ctx: int | None = None, n_ubatch: int | None = None, n_threads: int = 1) -> Settings:
    """One context size for every run: the largest case's cells, and a micro-batch that holds
    the longest step in one graph (a batch split in micro-batches would not be one batch).
    The fillers of the own-cache runs are shorter than the batched block they replace."""
    ran = [c for c in cases if c.note is None]
    cells = max([c.n_cells for c in ran] + [1])
    longest = max([max([c.n_tokens] + c.prompts) for c in ran] + [1])
    if n_ubatch is not None and n_ubatch < longest:
        raise CheckBatchError(f"-ub {n_ubatch}: the largest step sends {longest} tokens, which must be one graph; "
                              f"give -ub {longest} or more")
    if n_ctx is not None and n_ctx < cells:
        raise CheckBatchError(f"-c {n_ctx}: the largest case takes {cells} cells (its prompts and blocks); give "
                              f"-c {cells} or more")
    ub = n_ubatch if n_ubatch is not None else max(64, longest)
    ctx = n_ctx if n_ctx is not None else -(-cells // 256) * 256
    return Settings(ctx, ub, flash_attn, type_k, type_v, seed, cells, longest, n_threads)


def _scenario(st: Settings, n_seq: int, steps: list[tuple]) -> Scenario:
    sc = Scenario(n_ctx=st.n_ctx, n_ubatch=st.n_ubatch, flash_attn=st.flash_attn, type_k=st.type_k,
                  type_v=st.type_v, seed=st.seed, n_seq=n_seq, n_threads=st.n_threads)
    for k, (kind, arg) in enumerate(steps):
        if kind == "inject":
            seq, n, pos0 = arg
            sc.steps.append(Step("inject", k, seq=seq, n_tokens=n, pos0=pos0))
        elif kind == "seq_rm":
            seq, p0 = arg
            sc.steps.append(Step("seq_rm", k, seq=seq, pos0=p0, p1=-1))
        else:
            sc.steps.append(Step("block", k, blocks=[SeqBlock(s, list(t), p) for s, t, p in arg]))
    return sc


def case_scenario(case: Case, st: Settings) -> tuple[Scenario, list[tuple[str, int]]]:
    """The whole case in one context, and the role of each block graph it computes:
    ("batched", -1), ("alone", i) (same cache) or ("own", i) (own cache).

    After every prompt and the batched block, for each sequence i:
    - same cache: i's block removed and computed alone; it takes back its cells (the cache's
      head returns to the first freed cell), beside the others' blocks as the batch left them.
    - own cache: the others' blocks removed and their cells taken by a filler (an inject of
      another sequence, other values), then i's block computed alone in its cells.
    Each is followed by the batched block again, in the same cells (every block removed first):
    the cache is back to the batch's state, and that the batched block comes out the same
    every time is checked too. A step's features come from its index, so the prompts are
    injected once."""
    n = case.n_seq
    steps = [("inject", (s, p, 0)) for s, p in enumerate(case.prompts)]
    roles = []
    batch = [(s, b, case.prompts[s]) for s, b in enumerate(case.blocks)]

    def batched():
        for s in range(n):
            steps.append(("seq_rm", (s, case.prompts[s])))
        steps.append(("block", batch))
        roles.append(("batched", -1))
    batched()
    for i in range(n):
        steps.append(("seq_rm", (i, case.prompts[i])))
        steps.append(("block", [batch[i]]))
        roles.append(("alone", i))
        batched()
    for i in range(n):
        others = sum(len(b) for s, b in enumerate(case.blocks) if s != i)
        f = 1 if i == 0 else 0
        if others:
            for s in range(n):
                if s != i:
                    steps.append(("seq_rm", (s, case.prompts[s])))
            # the cells just freed are the first free ones from the head: the filler takes them all
            steps.append(("inject", (f, others, case.prompts[f])))
        steps.append(("seq_rm", (i, case.prompts[i])))
        steps.append(("block", [batch[i]]))
        roles.append(("own", i))
        batched()
    return _scenario(st, n, steps), roles
