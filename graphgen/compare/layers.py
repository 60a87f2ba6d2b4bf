"""Which layer a node belongs to, read from the names llama.cpp's graph callback gives
(`ffn_out-1`, `cache_k_l1`, `blk.1.ffn_up.weight`); used by graph-diff's per-layer strip and the
viewer's layer boxes alike."""

from __future__ import annotations

import re

from graphgen.dump.format import Node

_LAYER_SUFFIX = re.compile(r"-(\d+)((?: \([a-z ]+\))*)$")
_LAYER_CACHE = re.compile(r"^cache_[kv]_l(\d+)\b")
_LAYER_WEIGHT = re.compile(r"^blk\.(\d+)\.")
_AUTO = re.compile(r"^(?:node_\d+|leaf_\d+)?(?: \([a-z ]+\))*$")


def name_layer(name: str) -> int | None:
    """The layer a name states: `ffn_out-1`, `Kcur-0 (view)`, `cache_k_l1`, `blk.1.ffn_up.weight`."""
    m = _LAYER_SUFFIX.search(name) or _LAYER_CACHE.match(name) or _LAYER_WEIGHT.match(name)
    return int(m.group(1)) if m else None


def is_auto_name(name: str) -> bool:
    """ggml's automatic names (`node_12`, `leaf_3`, ` (reshaped)`) say nothing about the layer."""
    return _AUTO.fullmatch(name) is not None


def resolve_sources(nodes: list[Node]) -> list[list[tuple[int, str, int | None]]]:
    """Per node: (slot, name, producer index or None) for each non-empty src, then view_src.

    A name resolves to the latest earlier node carrying it, as graph-diff does (names repeat).
    """
    latest: dict[str, int] = {}
    out = []
    for node in nodes:
        row = [(k, s, latest.get(s)) for k, s in enumerate(node.src) if s]
        if node.view_src and node.view_src not in node.src:
            row.append((-1, node.view_src, latest.get(node.view_src)))
        out.append(row)
        latest[node.name] = node.index
    return out


def node_layers(nodes: list[Node], sources=None) -> list[int | None]:
    """Layer per node: from the name, else (automatic names) from the first source with a layer."""
    sources = sources if sources is not None else resolve_sources(nodes)
    layers: list[int | None] = []
    for node, srcs in zip(nodes, sources):
        il = name_layer(node.name)
        if il is None and is_auto_name(node.name):
            for _, s, k in srcs:
                il = layers[k] if k is not None else name_layer(s)
                if il is not None:
                    break
        layers.append(il)
    return layers
