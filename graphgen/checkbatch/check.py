"""Batch invariance: does a sequence's block come out the same whatever else is in its batch?

For each number of sequences and each block layout, every sequence's block is computed twice
in each engine: once in the batch with all the others, once alone, and the two are compared
node by node on the sequence's rows. "Alone" is run two ways, each in a fresh context with
the batch's settings:

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

Long because planning the runs, running them in both engines and comparing their nodes are one
measurement: the plan's offsets and cells are what the comparison slices by.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .compare.values import compare_values
from .cachetypes import KV_QUANTIZED, KV_TYPES
from .play.scenario import SeqBlock, Scenario, Step

ENGINES = ("graphgen", "llama.cpp")
# 4 sequences hold equal blocks and unequal ones down to a one-token block: seconds on a tiny
# draft. The whole sweep (--thorough) takes minutes there, most of it in b11739's runs.
DEFAULT_N_SEQ = (4,)
THOROUGH_N_SEQ = (1, 2, 4, 8, 16)
FAIL_ON = ("batch", "parity")
KINDS = ("equal", "unequal")
# values of every node are kept: the comparison slices them
MAX_DATA = 1 << 26
CACHE_PREFIX = "cache_"


class CheckBatchError(ValueError):
    """Bad input, or a comparison that could not measure; the message names the flag or node."""


# ---- the plan ---------------------------------------------------------------------------------

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


# ---- running ----------------------------------------------------------------------------------

@dataclass
class Graph:
    """One computed block graph: its nodes (dump.Node) and their values (float32, numpy order)."""
    nodes: list
    values: dict


@functools.lru_cache(maxsize=None)  # built on first use: it subclasses the ggml-bound recorder
def _recorder_class():
    from .dump.format import Node
    from .dump.record import NodeRecorder, TensorStruct, as_float32, read_array, read_quantized_rows, src_names

    class Recorder(NodeRecorder):
        """Names, shapes, values and digests only: the statistics a dump keeps are not needed here,
        and cost more than the graph's compute."""

        def record(self, addr: int, backend=None):
            t = TensorStruct.from_address(addr)
            node = Node(index=len(self.nodes), name=t.name.decode(errors="replace"), op=self.op_desc(addr),
                        type=self.type_name(t.type), ne=[int(x) for x in t.ne], src=src_names(t))
            self.nodes.append(node)
            self.addrs.append(addr)
            arr = read_array(t, self.read_bytes, addr)
            if arr is None:
                arr = read_quantized_rows(t, self.read_bytes, addr)
                if arr is not None:
                    node.digest = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
                return
            arr = np.ascontiguousarray(arr)
            node.digest = hashlib.sha256(arr.tobytes()).hexdigest()
            self.values[node.index] = as_float32(arr, t.type)
    return Recorder


def _Recorder(*args):
    return _recorder_class()(*args)


def run_graphgen(model, sc: Scenario, backend: str = "cpu"):
    """The scenario in graphgen's engine, in a fresh Session; yields the block graphs, recorded,
    one at a time (a realistic draft's graphs of 16 sequences would not all fit in memory)."""
    from .play.player import SessionEngine, walk
    from .ops import ggml as G
    from .runtime.session import Session

    sess = Session(model, n_ctx=sc.n_ctx, n_ubatch=sc.n_ubatch, flash_attn=sc.flash_attn, type_k=sc.type_k,
                   type_v=sc.type_v, n_seq=sc.n_seq, n_threads=sc.n_threads, backend=backend)
    engine = SessionEngine(sess)

    def before(index, step):
        # block graphs alone are recorded, each into a recorder of its own
        engine.recorder = _Recorder(G.op_desc, G.type_name, MAX_DATA, G.read_tensor_bytes) \
            if step.kind == "block" else None

    try:
        for _, step, _ in walk(sc, engine, before=before):
            if step.kind == "block":
                yield Graph(engine.recorder.nodes, engine.recorder.values)
    finally:
        sess.close()


class ReferenceWorker:
    """b11739 serving scenarios in one child process (`runner --serve`), each in a fresh context,
    through the runner protocol's client."""

    def __init__(self, workdir: Path):
        from .reference.protocol import LineWorker
        self.dir = Path(workdir)
        self.log = self.dir / "errors.jsonl"
        self.worker = LineWorker([sys.executable, "-m", "graphgen.reference.runner", "--serve"],
                                 self.dir / "llama.cpp.log", None)
        self.n = 0

    def run(self, model, sc: Scenario):
        """The scenario in b11739; yields the block graphs one at a time, as run_graphgen."""
        from .dump.format import load_dump_dir
        from .reference.protocol import error_text
        from .reference.runner import ReferenceFailed

        self.n += 1
        path = self.dir / f"s{self.n}.json"
        out = self.dir / f"d{self.n}"
        path.write_text(json.dumps(sc.to_dict(copy=True)))
        self.log.write_text("")
        res, how = self.worker.ask({"id": self.n, "model": str(Path(model).resolve()), "scenario": str(path),
                                    "out": str(out), "max_data": MAX_DATA, "log": str(self.log)})
        if res is None:
            headline, _ = error_text(self.log, (self.dir / "llama.cpp.log").read_text(errors="replace"))
            raise ReferenceFailed(f"llama.cpp b11739 ended ({how.removeprefix('abort (').rstrip(')')}): {headline}")
        if not res["ok"]:
            raise ReferenceFailed(f"llama.cpp b11739: {res['error']}")
        try:
            for d in load_dump_dir(out):
                if d.graph == "block":
                    with d:
                        values = {k: d.values(k) for k in range(len(d.nodes))}
                    yield Graph(d.nodes, {k: v for k, v in values.items() if v is not None})
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def close(self):
        self.worker.close()


# ---- comparing --------------------------------------------------------------------------------

def output_indices(nodes) -> list[int]:
    """The graph's outputs: nodes no later node reads, cache writes aside (a node's source is
    the latest earlier node of that name)."""
    last: dict[str, int] = {}
    used = set()
    for n in nodes:
        for s in n.src:
            if s in last:
                used.add(last[s])
        last[n.name] = n.index
    return [n.index for n in nodes if n.index not in used and n.op not in ("SET_ROWS", "CPY")]


def node_label(nodes, k: int) -> str:
    """A node's name, or for one ggml named itself (`node_3`, `node_3 (reshaped)`, which say
    nothing and shift with the graph) its op, the named node it reads and its index:
    `VIEW of Kcur-0 (#3)`."""
    from .compare.layers import is_auto_name

    node = nodes[k]
    if not is_auto_name(node.name):
        return node.name
    named = [s for s in node.src if s and not is_auto_name(s)]
    latest = {n.name: n.index for n in nodes[:k]}
    srcs, seen = [s for s in node.src if s], set()
    # else through sources that are themselves unnamed, to the nearest named one
    while srcs and not named:
        s = srcs.pop(0)
        if not is_auto_name(s):
            named.append(s)
        elif latest.get(s) is not None and latest[s] not in seen:
            seen.add(latest[s])
            srcs += [x for x in nodes[latest[s]].src if x]
    return f"{node.op} of {' and '.join(named[:2])} (#{k})" if named else f"{node.op} (#{k})"


def pair_nodes(a_nodes, b_nodes) -> list[tuple[int, int]]:
    """(index in a, index in b) of nodes with the same name, k-th occurrence with k-th."""
    seen: dict[str, list[int]] = {}
    for n in b_nodes:
        seen.setdefault(n.name, []).append(n.index)
    taken: dict[str, int] = {}
    pairs = []
    for n in a_nodes:
        k = taken.get(n.name, 0)
        js = seen.get(n.name, [])
        if k < len(js) and b_nodes[js[k]].op == n.op:
            pairs.append((n.index, js[k]))
        taken[n.name] = k + 1
    return pairs


def rows_of(ne_batch, ne_alone, n_tokens: int, n_alone: int, offset: int, n_seq: int, i: int):
    """How to cut sequence i's part out of a batched node: (numpy axis, start, stop), "whole"
    when the node has the same shape alone, or None when no single axis tells the sequence's
    rows. The axis that changed must hold k values per token (rows offset.. of n_tokens) or k
    per block (block i of n_seq)."""
    if list(ne_batch) == list(ne_alone):
        return "whole"
    axes = [d for d in range(4) if ne_batch[d] != ne_alone[d]]
    if len(axes) != 1:
        return None
    d = axes[0]
    nb, na = ne_batch[d], ne_alone[d]
    for units, alone_units, start in ((n_tokens, n_alone, offset), (n_seq, 1, i)):
        if nb % units == 0 and na % alone_units == 0 and nb // units == na // alone_units:
            k = nb // units
            return 3 - d, start * k, (start + alone_units) * k
    return None


def _cut(arr: np.ndarray, how) -> np.ndarray:
    if how == "whole":
        return arr
    axis, a, b = how
    return np.take(arr, range(a, b), axis=axis)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@dataclass
class SeqResult:
    seq: int
    n_tokens: int
    pos0: int
    outputs_nmse: float = 0.0        # the largest over the outputs, batched against alone (same cache)
    outputs_identical: bool = True
    nodes_compared: int = 0
    nodes_differ: int = 0
    nodes_skipped: int = 0           # no single axis tells the sequence's rows
    worst_node: str | None = None
    worst_nmse: float = 0.0
    first_node: str | None = None    # the first node in graph order that differs
    own_outputs_nmse: float = 0.0    # outputs, batched against the own-cache run
    own_outputs_identical: bool = True

    @property
    def identical(self) -> bool:
        return self.nodes_differ == 0 and self.outputs_identical and self.own_outputs_identical

    def to_dict(self) -> dict:
        return {"seq": self.seq, "n_tokens": self.n_tokens, "pos0": self.pos0, "identical": self.identical,
                "outputs_nmse": self.outputs_nmse, "outputs_identical": self.outputs_identical,
                "nodes_compared": self.nodes_compared, "nodes_differ": self.nodes_differ,
                "nodes_skipped": self.nodes_skipped, "worst_node": self.worst_node, "worst_nmse": self.worst_nmse,
                "first_node": self.first_node, "own_cache_outputs_nmse": self.own_outputs_nmse,
                "own_cache_outputs_identical": self.own_outputs_identical}


def _nmse(alone: np.ndarray, batched: np.ndarray) -> float:
    nmse, _, reason = compare_values(alone, batched)
    return math.inf if reason else nmse


def compare_sequence(batched: Graph, alone: Graph, case: Case, i: int, outputs_only: bool = False):
    """Sequence i's rows of the batched graph against its graph alone: [(node name, nmse, bits
    equal, is output)] for every node compared, and the count of nodes that could not be cut."""
    offset, n_alone = case.offsets[i], len(case.blocks[i])
    outs, outs_b = set(output_indices(alone.nodes)), set(output_indices(batched.nodes))
    pairs = pair_nodes(alone.nodes, batched.nodes)
    got, skipped = [], 0
    # an output one graph has and the other lacks (a head that builds its lattice only for some
    # batches) is a difference in what the caller reads
    for k in sorted(outs - {ia for ia, _ in pairs}):
        got.append((f"{node_label(alone.nodes, k)} (absent batched)", math.inf, False, True))
    for k in sorted(outs_b - {ib for _, ib in pairs}):
        got.append((f"{node_label(batched.nodes, k)} (absent alone)", math.inf, False, True))
    for ia, ib in pairs:
        is_out = ia in outs or ib in outs_b
        if outputs_only and not is_out:
            continue
        na, nb = alone.nodes[ia], batched.nodes[ib]
        how = rows_of(nb.ne, na.ne, case.n_tokens, n_alone, offset, case.n_seq, i)
        va, vb = alone.values.get(ia), batched.values.get(ib)
        if how == "whole" and nb.name.startswith(CACHE_PREFIX) and nb.op != "SET_ROWS":
            # a view of the cache as it was before the batch wrote to it: the cells the batch
            # takes hold what they held, which the two runs need not share
            skipped += 1
            continue
        if how == "whole" and (va is None or vb is None):
            if na.digest is None or nb.digest is None:
                skipped += 1
                continue
            got.append((node_label(alone.nodes, ia), 0.0 if na.digest == nb.digest else math.inf,
                        na.digest == nb.digest, is_out))
            continue
        if how is None or va is None or vb is None:
            skipped += 1
            continue
        part = _cut(vb, how)
        if part.shape != va.shape:
            skipped += 1
            continue
        same = _same_bits(va, part)
        got.append((node_label(alone.nodes, ia), 0.0 if same else _nmse(va, part), same, is_out))
    if not any(is_out for *_, is_out in got):
        raise CheckBatchError(f"n_seq {case.n_seq} {case.kind} blocks, sequence {i}: no output of the block graph "
                              "could be cut to the sequence's rows; nothing to compare")
    return got, skipped


def summarize(res: SeqResult, got, skipped: int) -> None:
    res.nodes_compared, res.nodes_skipped = len(got), skipped
    for name, nmse, same, is_out in got:
        if is_out:
            res.outputs_nmse = max(res.outputs_nmse, nmse)
            res.outputs_identical &= same
        if not same:
            res.nodes_differ += 1
            res.first_node = res.first_node or name
            if res.worst_node is None or nmse > res.worst_nmse:
                res.worst_node, res.worst_nmse = name, nmse


def graphs_equal(a: Graph, b: Graph, cache_state: bool = True) -> str | None:
    """None when two graphs have the same nodes (name, op, shape) and bytes; else the first
    difference. cache_state False: views of the cache as it was before the write are left out."""
    if len(a.nodes) != len(b.nodes):
        return f"{len(a.nodes)} nodes against {len(b.nodes)}"
    for x, y in zip(a.nodes, b.nodes):
        if (x.name, x.op, list(x.ne)) != (y.name, y.op, list(y.ne)):
            return f"node {x.index}: {x.name} {x.op} {x.ne} against {y.name} {y.op} {y.ne}"
        if not cache_state and x.name.startswith(CACHE_PREFIX) and x.op != "SET_ROWS":
            continue
        if x.digest is None or y.digest is None:
            return f"node {x.index} ({x.name}) has no digest: not compared"
        if x.digest != y.digest:
            return f"node {x.index} ({x.name}) differs"
    return None


def compare_case(case: Case, graphs, roles: list, engine: str = "") -> tuple[list, bool, list]:
    """Every sequence's results (SeqResult) from one case's graphs, whether every batched block
    came out the same, and the graphs with their nodes and digests (the engines' parity needs no
    more). `graphs` may be an iterator: each graph is compared as it comes and its values let go,
    the first batched block's aside, which every other graph is compared with."""
    seqs = [SeqResult(i, len(case.blocks[i]), case.prompts[i]) for i in range(case.n_seq)]
    first, reproducible, kept = None, True, []
    for g in graphs:
        if len(kept) == len(roles):
            raise CheckBatchError(f"{label(engine)} computed more block graphs than the case's {len(roles)}")
        role, i = roles[len(kept)]
        if role == "batched":
            if first is None:
                first = g
            else:
                reproducible &= graphs_equal(first, g, cache_state=False) is None
        elif first is None:
            raise CheckBatchError(f"the case's first block graph must be the batched one, not {role}")
        elif role == "alone":
            got, skipped = compare_sequence(first, g, case, i)
            summarize(seqs[i], got, skipped)
        else:
            res = seqs[i]
            for _name, nmse, same_bits, _ in compare_sequence(first, g, case, i, outputs_only=True)[0]:
                res.own_outputs_nmse = max(res.own_outputs_nmse, nmse)
                res.own_outputs_identical &= same_bits
        kept.append(g if g is first else Graph(g.nodes, {}))
    if len(kept) != len(roles):
        raise CheckBatchError(f"{label(engine)} computed {len(kept)} block graphs where the case has {len(roles)}")
    return seqs, reproducible, kept


# ---- the whole check --------------------------------------------------------------------------

@dataclass
class CaseResult:
    n_seq: int
    kind: str
    note: str | None = None
    seqs: dict = field(default_factory=dict)   # engine -> [SeqResult]
    reproducible: dict = field(default_factory=dict)  # engine -> the batched block was the same in every run
    prompts: list = field(default_factory=list)        # each sequence's prompt length

    def to_dict(self) -> dict:
        d = {"n_seq": self.n_seq, "blocks": self.kind}
        if self.note:
            d["note"] = self.note
            return d
        d["engines"] = {e: {"reproducible": self.reproducible[e], "sequences": [s.to_dict() for s in seqs]}
                        for e, seqs in self.seqs.items()}
        return d


@dataclass
class Report:
    model: str
    settings: Settings
    block: int
    prompt: int
    engines: tuple
    cases: list = field(default_factory=list)
    parity: dict | None = None   # graphs, nodes, first difference (both engines)
    fail_on: str = "batch"       # what exit 1 says: "batch" (a dependence, or the engines differ), "parity"

    def dependent(self, engine: str) -> bool:
        return any(not s.identical for c in self.cases if not c.note for s in c.seqs[engine]) or \
            any(not c.reproducible[engine] for c in self.cases if not c.note)

    def engines_differ(self) -> bool:
        return self.parity is not None and not self.parity["identical"]

    def exit_code(self) -> int:
        if self.fail_on == "parity":
            return 1 if self.engines_differ() else 0
        return 1 if self.engines_differ() or any(self.dependent(e) for e in self.engines) else 0

    def exit_reason(self) -> str:
        """Why the command exits as it does, in words."""
        if self.fail_on == "parity":
            return ("exit 1: the engines' graphs differ" if self.engines_differ() else
                    "exit 0: the engines' graphs are bit-identical (--fail-on parity: a batch dependence both share "
                    "does not fail)")
        if self.engines_differ():
            return "exit 1: the engines' graphs differ"
        dep = [label(e) for e in self.engines if self.dependent(e)]
        if dep:
            return f"exit 1: results depend on the batch in {' and '.join(dep)}"
        return "exit 0: no result depends on the batch"

    def verdict(self, engine: str) -> str:
        ran = [c for c in self.cases if not c.note]
        seqs = [s for c in ran for s in c.seqs[engine]]
        if not self.dependent(engine):
            return (f"{label(engine)}: results do not depend on the batch: {len(seqs)} sequences in {len(ran)} batches, "
                    "every compared node bit-identical batched and alone, and every output the same in a cache of its own")
        bad = [s for s in seqs if not s.identical]
        where = ", ".join(f"{sum(not s.identical for s in c.seqs[engine])} of {c.n_seq} at n_seq {c.n_seq} {c.kind} blocks"
                          for c in ran if any(not s.identical for s in c.seqs[engine]))
        worst = max(bad, key=lambda s: max(s.outputs_nmse, s.own_outputs_nmse), default=None)
        text = (f"{label(engine)}: results DEPEND on the batch: {len(bad)} of the {len(seqs)} sequences checked "
                f"{'differs' if len(bad) == 1 else 'differ'} batched from alone ({where})")
        if worst is not None:
            text += (f"; outputs NMSE up to {max(worst.outputs_nmse, worst.own_outputs_nmse):.3g}, "
                     f"first differing node {worst.first_node or '(an output)'}")
        if any(not c.reproducible[engine] for c in ran):
            text += "; the same batched block computed twice differs"
        return text

    def to_dict(self) -> dict:
        st = self.settings
        return {"model": self.model, "settings": {"n_ctx": st.n_ctx, "n_ubatch": st.n_ubatch,
                                                  "flash_attn": st.flash_attn, "type_k": st.type_k,
                                                  "type_v": st.type_v, "seed": st.seed, "block": self.block,
                                                  "prompt": self.prompt},
                "engines": list(self.engines),
                "batch_dependent": {e: self.dependent(e) for e in self.engines},
                "verdict": {e: self.verdict(e) for e in self.engines},
                "cases": [c.to_dict() for c in self.cases], "parity": self.parity, "fail_on": self.fail_on,
                "exit_code": self.exit_code()}

    def format_text(self) -> str:
        st = self.settings
        prompts = sorted({p for c in self.cases for p in c.prompts} or {self.prompt})
        fa = "on" if st.flash_attn else "off"
        if st.flash_attn_asked == "auto":
            fa += " (-fa auto)"
        lines = [f"check-batch {self.model}: flash attention {fa}, KV cache {st.type_k}/{st.type_v}, block {self.block}, "
                 f"prompts of {prompts[0]}" + (f" to {prompts[-1]}" if len(prompts) > 1 else "") + f" rows, seed {st.seed}",
                 f"  context -c {st.n_ctx}: the largest case's prompts and blocks take {st.cells} cells; micro-batch "
                 f"-ub {st.n_ubatch}: the longest step sends {st.longest} tokens, computed as one graph"]
        for e in self.engines:
            lines += ["", f"{label(e)} (each sequence batched against alone, same cache; own: outputs against "
                          "a cache of its own)",
                      f"{'n_seq':>5}  {'blocks':<8} {'identical':>9}  {'max NMSE outputs':>16}  {'own':>9}  "
                      f"{'nodes':>6}  worst node"]
            for c in self.cases:
                if c.note:
                    lines.append(f"{c.n_seq:>5}  {c.kind:<8} {c.note}")
                    continue
                seqs = c.seqs[e]
                ok = sum(s.identical for s in seqs)
                worst = max(seqs, key=lambda s: s.worst_nmse)
                wn = f"{worst.worst_node} ({worst.worst_nmse:.3g})" if worst.worst_node else "-"
                if not c.reproducible[e]:
                    wn += "; batched block not reproducible"
                lines.append(f"{c.n_seq:>5}  {c.kind:<8} {f'{ok}/{len(seqs)}':>9}  "
                             f"{max(s.outputs_nmse for s in seqs):>16.3g}  {max(s.own_outputs_nmse for s in seqs):>9.3g}  "
                             f"{min(s.nodes_compared for s in seqs):>6}  {wn}")
        lines.append("")
        lines += [self.verdict(e) for e in self.engines]
        if self.parity is not None:
            p = self.parity
            lines.append(f"graphgen vs {label('llama.cpp')}: {p['graphs']} block graphs, {p['nodes']} nodes: "
                         + ("bit-identical" if p["identical"] else f"DIFFER ({p['first']})"))
        lines.append(self.exit_reason())
        return "\n".join(lines)


def label(engine: str) -> str:
    return "llama.cpp b11739" if engine == "llama.cpp" else engine


def parse_n_seq(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CheckBatchError(f"--n-seq must be a comma-separated list of integers, got {text!r}") from None
    if not vals or any(v < 1 or v > 256 for v in vals):
        raise CheckBatchError(f"--n-seq values must be between 1 and 256, got {text!r}")
    return sorted(set(vals))


def check_batch(model, n_seqs=DEFAULT_N_SEQ, block: int | None = None, prompt: int = 6, flash_attn: bool | str = False,
                type_k: str = "f16", type_v: str = "f16", engines=ENGINES, seed: int = 0, progress=None,
                n_ctx: int | None = None, n_ubatch: int | None = None, n_threads: int = 1,
                fail_on: str = "batch") -> Report:
    """Run every case in each engine and compare; `progress(text)` is told what runs.
    flash_attn: a bool, or -fa's "on", "off" or "auto" (b11739 then decides itself, graphgen as
    scenario.resolve_fa does; the engines' parity shows a disagreement)."""
    from .play.scenario import resolve_fa
    from .runtime.model import load
    from .runtime.kvcache import check_kv_types

    engines = tuple(engines)
    if not engines or any(e not in ENGINES for e in engines):
        raise CheckBatchError(f"--engine must name graphgen, llama.cpp or both, got {', '.join(engines) or 'none'}")
    if fail_on not in FAIL_ON:
        raise CheckBatchError(f"--fail-on must be one of {', '.join(FAIL_ON)}, got {fail_on!r}")
    if fail_on == "parity" and len(engines) != 2:
        raise CheckBatchError("--fail-on parity compares the two engines: it needs --engine both")
    asked = flash_attn if isinstance(flash_attn, str) else None
    if asked is not None:
        if asked not in ("on", "off", "auto"):
            raise CheckBatchError(f"-fa must be on, off or auto, got {asked!r}")
        flash_attn = bool(resolve_fa(asked))
    for flag, v in (("--type-k", type_k), ("--type-v", type_v)):
        if v not in KV_TYPES:
            raise CheckBatchError(f"{flag} must be one of {', '.join(KV_TYPES)}, got {v!r}")
    if type_v in KV_QUANTIZED and not flash_attn:
        raise CheckBatchError(f"--type-v {type_v}: a quantized V cache requires flash attention (-fa on or auto)")
    if prompt < 1:
        raise CheckBatchError(f"--prompt must be at least 1, got {prompt}")
    m = load(model)
    try:
        hp = m.hparams
        rules = m.head.block_rules(hp)
        check_kv_types(hp, type_k, type_v, flash_attn, k_only=m.backbone != "base")
        mask = max(hp.mask_token_id, 0)
        n_vocab = hp.n_vocab
    finally:
        m.close()
    block = block if block is not None else (hp.block_size or 4)
    if block < 1:
        raise CheckBatchError(f"--block must be at least 1, got {block}")
    if rules.max_block and block > rules.max_block:
        raise CheckBatchError(f"--block {block} is longer than this head's lattice holds ({rules.max_block} rows, "
                              "the draft's block_size)")
    cases = plan_cases(rules, n_vocab, mask, n_seqs, block, prompt, seed)
    st = settings_for(cases, flash_attn, type_k, type_v, seed, n_ctx, n_ubatch, n_threads)
    st.flash_attn_asked = asked
    report = Report(Path(model).name, st, block, prompt, engines, fail_on=fail_on)
    tmp = tempfile.TemporaryDirectory(prefix="graphgen-checkbatch-")
    worker = ReferenceWorker(Path(tmp.name)) if "llama.cpp" in engines else None
    parity = {"graphs": 0, "nodes": 0, "identical": True, "first": None} if len(engines) == 2 else None
    try:
        n_runs, run = sum(1 for c in cases if not c.note) * len(engines), 0
        for case in cases:
            cr = CaseResult(case.n_seq, case.kind, case.note, prompts=list(case.prompts))
            report.cases.append(cr)
            if case.note:
                continue
            sc, roles = case_scenario(case, st)
            sc.flash_attn_auto = asked == "auto"
            runs = {}
            for e in engines:
                run += 1
                if progress:
                    progress(f"run {run} of {n_runs}: n_seq {case.n_seq}, {case.kind} blocks, {label(e)} "
                             f"({len(roles)} block graphs)")
                graphs = run_graphgen(model, sc) if e == "graphgen" else worker.run(model, sc)
                cr.seqs[e], cr.reproducible[e], runs[e] = compare_case(case, graphs, roles, e)
            if parity is not None:
                for k, (x, y) in enumerate(zip(runs["graphgen"], runs["llama.cpp"])):
                    parity["graphs"] += 1
                    parity["nodes"] += len(x.nodes)
                    why = graphs_equal(x, y)
                    if why is not None and parity["identical"]:
                        parity["identical"] = False
                        role, i = roles[k]
                        parity["first"] = (f"n_seq {case.n_seq} {case.kind} blocks, {role} block"
                                           + (f" of sequence {i}" if i >= 0 else "") + f": {why}")
        if parity is not None and parity["graphs"] == 0:
            raise CheckBatchError("no case ran: nothing was compared between the engines")
        report.parity = parity
    finally:
        if worker is not None:
            worker.close()
        tmp.cleanup()
    if not any(not c.note for c in report.cases):
        raise CheckBatchError("no case ran (every --n-seq case was refused): nothing was compared")
    return report
