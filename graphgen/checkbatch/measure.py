"""The measurement: a sequence's block batched against the same block alone, node by node and
bit for bit, on the rows the plan's offsets give it; and two graphs compared whole (the batched
block run again, the two engines). A case's graphs are compared as they come and let go, the
first batched block's aside, which every other graph is compared with.
"""

from __future__ import annotations

import math

import numpy as np

from ..compare.values import compare_values
from .engines import Graph
from .matching import node_label, output_indices, pair_nodes, rows_of
from .plan import Case, CheckBatchError
from .results import SeqResult, label

CACHE_PREFIX = "cache_"  # the KV cache's own tensors, and views of them


def _cut(arr: np.ndarray, how) -> np.ndarray:
    if how == "whole":
        return arr
    axis, a, b = how
    return np.take(arr, range(a, b), axis=axis)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


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
