"""Graphs as networkx.DiGraph: dumps, recorded nodes and built ggml graphs.

Graph nodes are keyed by their evaluation index (int) and carry name, op, type, ne, shape and
layer. Sources that no node produces (weights, inputs, KV caches) become leaves keyed
"leaf:<name>" with kind "leaf"; edges run source -> consumer with the source slot as `slot`
(-1 for view_src when it is not also a src).
"""

from __future__ import annotations

import re
from typing import Iterable

import networkx as nx

from graphgen.dump.format import Dump, Node
from graphgen.compare.layers import is_auto_name, name_layer, node_layers, resolve_sources  # noqa: F401

def leaf_key(name: str) -> str:
    return f"leaf:{name}"


def from_nodes(nodes: list[Node], leaves: bool = True, graph_attrs: dict | None = None,
               leaf_shapes: dict[str, list[int]] | None = None) -> nx.DiGraph:
    """DiGraph of a node list in dump form; `leaf_shapes` adds ne to leaves when known."""
    g = nx.DiGraph(**(graph_attrs or {}))
    sources = resolve_sources(nodes)
    layers = node_layers(nodes, sources)
    for node, il in zip(nodes, layers):
        g.add_node(node.index, kind="node", name=node.name, op=node.op, type=node.type,
                   ne=list(node.ne), shape=node.shape, layer=il, src=list(node.src),
                   view_src=node.view_src, op_params=list(node.op_params))
    for node, srcs in zip(nodes, sources):
        for slot, name, k in srcs:
            if k is None:
                if not leaves:
                    continue
                key = leaf_key(name)
                if key not in g:
                    ne = (leaf_shapes or {}).get(name)
                    g.add_node(key, kind="leaf", name=name, op="NONE", type="", ne=ne,
                               shape=tuple(reversed(ne)) if ne else None,
                               layer=name_layer(name) if name_layer(name) is not None else layers[node.index])
                k = key
            if g.has_edge(k, node.index):
                continue  # a node reading one tensor twice (x * x) keeps one edge
            g.add_edge(k, node.index, slot=slot)
    return g


def from_dump(dump: Dump, leaves: bool = True) -> nx.DiGraph:
    return from_nodes(dump.nodes, leaves, {"graph": dump.graph, "model": dump.model,
                                           "engine": (dump.source or {}).get("engine", "?")})


def from_cgraph(gf, leaves: bool = True) -> nx.DiGraph:
    """DiGraph of a built (not necessarily computed) ggml graph, leaves with their shapes."""
    import ctypes

    from graphgen.ops import ggml as G
    from graphgen.dump.record import TensorStruct, src_names

    nodes, leaf_shapes = [], {}
    n = G.ggml_graph_n_nodes(gf)
    for i in range(n):
        addr = ctypes.cast(G.ggml_graph_node(gf, i), ctypes.c_void_p).value
        t = TensorStruct.from_address(addr)
        for k in range(len(t.src)):
            s = t.src[k]
            if s:
                leaf_shapes.setdefault(s.contents.name.decode(errors="replace"), [int(x) for x in s.contents.ne])
        vs = t.view_src
        nodes.append(Node(i, t.name.decode(errors="replace"), G.op_desc(addr), G.type_name(t.type),
                          [int(x) for x in t.ne], src_names(t),
                          vs.contents.name.decode(errors="replace") if vs else None, int(t.view_offs),
                          [int(x) for x in t.op_params]))
    return from_nodes(nodes, leaves, {"graph": "built"}, leaf_shapes)


# ---- queries ----------------------------------------------------------------------------------

def graph_nodes(g: nx.DiGraph) -> list[int]:
    """Graph nodes (not leaves) in evaluation order."""
    return sorted(k for k, d in g.nodes(data=True) if d["kind"] == "node")


def find(g: nx.DiGraph, name: str, last: bool = False) -> int:
    """Index of the first (or last) node named `name`; `#12` or `12` names index 12."""
    m = re.fullmatch(r"#?(\d+)", name)
    if m and int(m.group(1)) in g:
        return int(m.group(1))
    hits = [k for k in graph_nodes(g) if g.nodes[k]["name"] == name]
    if not hits:
        key = leaf_key(name)
        if key in g:
            return key  # type: ignore[return-value]
        raise KeyError(f"no node named {name!r}")
    return hits[-1] if last else hits[0]


def layer_subgraph(g: nx.DiGraph, layer: int | None, leaves: bool = True) -> nx.DiGraph:
    """Nodes of one layer (None: the nodes outside any layer), with their leaves if asked."""
    keep = [k for k, d in g.nodes(data=True)
            if d["layer"] == layer and (d["kind"] == "node" or leaves)]
    return g.subgraph(keep).copy()


def layers(g: nx.DiGraph) -> list[int | None]:
    """Layers present, in order of first appearance (None for nodes outside any layer)."""
    seen: dict[int | None, None] = {}
    for k in graph_nodes(g):
        seen.setdefault(g.nodes[k]["layer"], None)
    return list(seen)


def path_between(g: nx.DiGraph, a: str | int, b: str | int) -> list:
    """Shortest data path from node a to node b (names resolve to their first node)."""
    ka = a if isinstance(a, int) else find(g, a)
    kb = b if isinstance(b, int) else find(g, b, last=True)
    return nx.shortest_path(g, ka, kb)


def ancestors_of(g: nx.DiGraph, node: str | int, nodes_only: bool = True) -> list:
    """Everything `node` depends on, in evaluation order (leaves last)."""
    k = node if isinstance(node, int) else find(g, node)
    anc = nx.ancestors(g, k)
    ordered = sorted(x for x in anc if isinstance(x, int))
    if not nodes_only:
        ordered += sorted(x for x in anc if not isinstance(x, int))
    return ordered


def around(g: nx.DiGraph, node: str | int, depth: int = 3) -> nx.DiGraph:
    """The neighbourhood of `node` up to `depth` edges either way."""
    k = node if isinstance(node, int) else find(g, node)
    keep = set(nx.single_source_shortest_path_length(g, k, cutoff=depth))
    keep |= set(nx.single_source_shortest_path_length(g.reverse(copy=False), k, cutoff=depth))
    return g.subgraph(keep).copy()


def layer_label(layer: int | None) -> str:
    return "global" if layer is None else f"layer {layer}"


def layer_overview(g: nx.DiGraph) -> nx.DiGraph:
    """One node per layer, keyed by layer_label (node count, op histogram), edges where data
    crosses layers."""
    ov = nx.DiGraph()
    for il in layers(g):
        ov.add_node(layer_label(il), layer=il, count=0, ops={})
    for k in graph_nodes(g):
        d = g.nodes[k]
        info = ov.nodes[layer_label(d["layer"])]
        info["count"] += 1
        info["ops"][d["op"]] = info["ops"].get(d["op"], 0) + 1
    for u, v in g.edges():
        lu, lv = g.nodes[u]["layer"], g.nodes[v]["layer"]
        if isinstance(u, int) and lu != lv:
            ov.add_edge(layer_label(lu), layer_label(lv))
    return ov


def iter_layer_nodes(g: nx.DiGraph) -> Iterable[tuple[int | None, list[int]]]:
    groups: dict[int | None, list[int]] = {}
    for k in graph_nodes(g):
        groups.setdefault(g.nodes[k]["layer"], []).append(k)
    return groups.items()
