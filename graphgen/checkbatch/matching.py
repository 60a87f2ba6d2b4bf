"""Lining up two graphs of one block, batched and alone: which nodes are the graph's outputs,
which node of one is which of the other, which rows of a batched node are one sequence's, and
a name worth reading for the nodes ggml named itself.
"""

from __future__ import annotations


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
    from ..compare.layers import is_auto_name

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
