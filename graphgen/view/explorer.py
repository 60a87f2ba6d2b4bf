"""Model Explorer export: its graph JSON (a GraphCollection, layers as namespaces) and node-data
overlay files (NMSE, max abs error, backend) keyed by the same node ids.

Graph nodes get the id of their evaluation index ("12"); leaves "leaf:<name>". Model Explorer
opens the graph JSON as a model and each overlay through "add per-node data"
(`model-explorer graph.json --node_data_paths=nmse.json,...`).
"""

from __future__ import annotations

import json
from pathlib import Path

from graphgen.compare.report import DiffResult
from graphgen.dump.format import Dump
from graphgen.compare.opparams import format_op_params, raw_params

from . import graph as V
from .diffmap import STATUS_COLOURS, diff_map
from .dot import op_colour

BACKEND_COLOURS = ["#90caf9", "#a5d6a7", "#ffcc80", "#ce93d8", "#ef9a9a"]


def namespace(layer: int | None) -> str:
    return "" if layer is None else f"layer_{layer}"


def graph_json(dump: Dump, label: str | None = None, backends: dict[int, str] | None = None,
               status: dict[int, str] | None = None) -> dict:
    """The dump as a Model Explorer GraphCollection (dict, ready for json.dump)."""
    g = V.from_dump(dump)
    nodes = []
    for k, d in g.nodes(data=True):
        if d["kind"] == "leaf":
            attrs = [{"key": "kind", "value": "leaf"}]
            if d["ne"]:
                attrs.append({"key": "ne", "value": str(d["ne"])})
            nodes.append({"id": V.leaf_key(d["name"]), "label": d["name"], "namespace": namespace(d["layer"]),
                          "attrs": attrs, "incomingEdges": [], "outputsMetadata": [], "inputsMetadata": []})
            continue
        n = dump.nodes[k]
        attrs = [{"key": "name", "value": n.name}, {"key": "op", "value": n.op},
                 {"key": "type", "value": n.type}, {"key": "ne", "value": str(n.ne)},
                 {"key": "index", "value": str(n.index)},
                 {"key": "backend", "value": _backend(dump, k, backends)}]
        if n.view_src:
            attrs.append({"key": "view_src", "value": n.view_src})
        params = format_op_params(n.op, n.op_params, n.ne)
        if params:
            attrs.append({"key": "op_params", "value": params})
        if any(n.op_params):
            attrs.append({"key": "op_params_raw", "value": str(raw_params(n.op_params))})
        if status is not None:
            attrs.append({"key": "diff", "value": status.get(k, "matched")})
        edges = []
        for u, _, ed in sorted(g.in_edges(k, data=True), key=lambda e: e[2]["slot"] % 100):
            slot = ed["slot"]
            edges.append({"sourceNodeId": str(u), "sourceNodeOutputId": "0",
                          "targetNodeInputId": str(slot if slot >= 0 else len(n.src))})
        fill = STATUS_COLOURS.get(status.get(k, "matched")) if status is not None else op_colour(n.op)
        nodes.append({"id": str(k), "label": n.name if n.name.strip() else n.op, "namespace": namespace(d["layer"]),
                      "attrs": attrs, "incomingEdges": edges,
                      "outputsMetadata": [{"id": "0", "attrs": [{"key": "tensor_shape", "value": f"{n.type}{n.ne}"},
                                                                 {"key": "__tensor_tag", "value": n.name}]}],
                      "inputsMetadata": [],
                      "style": {"backgroundColor": fill, "borderColor": "", "hoveredBorderColor": ""}})
    name = label or dump.path.name
    return {"label": name, "graphs": [{"id": f"{dump.graph}", "nodes": nodes}]}


def _backend(dump: Dump, k: int, backends: dict[int, str] | None = None) -> str:
    """The node's backend: given, recorded in the dump, from a sched-debug import, else CPU
    (dumps without one were computed on the CPU backend)."""
    if backends and k in backends:
        return backends[k]
    b = getattr(dump.nodes[k], "backend", None)
    if b:
        return b
    imported = ((dump.source or {}).get("import") or {}).get("backends") or {}
    return imported.get(str(k), "CPU")


def _results(values: dict[str, float]) -> dict:
    return {k: {"value": v} for k, v in values.items()}


def node_data(res: DiffResult, ref: Dump, ours: Dump, backends: dict[int, str] | None = None) -> dict[str, dict]:
    """Overlays on the ref graph: {"nmse": GraphNodeData, "max_abs": ..., "backend": ...}."""
    dm = diff_map(res, ref, ours)
    nmse, max_abs = {}, {}
    for i, row in dm.ref_status.items():
        if row.nmse is not None:
            nmse[str(i)] = row.nmse
        if row.max_abs is not None:
            max_abs[str(i)] = row.max_abs
    be_names = {i: _backend(ref, i, backends) for i in range(len(ref.nodes))}
    be_list = sorted(set(be_names.values()))
    thr = min((r.threshold for r in res.numeric), default=1e-7)
    thr = thr if thr > 0 else 1e-7
    out = {
        "nmse": {"name": "NMSE", "results": _results(nmse),
                 "thresholds": [{"value": thr, "bgColor": "#c8e6c9"},
                                {"value": 1e30, "bgColor": "#f48fb1"}]},
        "max_abs": {"name": "max abs error", "results": _results(max_abs),
                    "gradient": [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#e53935"}]},
        "backend": {"name": "backend (" + ", ".join(f"{k}={b}" for k, b in enumerate(be_list)) + ")",
                    "results": {str(i): {"value": be_list.index(b),
                                         "bgColor": BACKEND_COLOURS[be_list.index(b) % len(BACKEND_COLOURS)]}
                                for i, b in be_names.items()}},
    }
    # the model's graph id keys each overlay, so Model Explorer applies it to that graph
    return {k: {ref.graph: v} for k, v in out.items()}


def export_docs(ref: Dump, ours: Dump | None = None, res: DiffResult | None = None) -> dict[str, dict]:
    """{file name: JSON document}: `<stem>.graph.json` and, with two dumps, `<stem>.<nmse|max_abs|backend>.json`."""
    stem = ref.path.stem
    status = None
    if ours is not None:
        if res is None:
            from graphgen.compare.diff import diff_dumps
            res = diff_dumps(ref, ours)
        status = {i: r.status for i, r in diff_map(res, ref, ours).ref_status.items()}
    docs = {f"{stem}.graph.json": graph_json(ref, status=status)}
    if ours is not None:
        docs.update({f"{stem}.{key}.json": doc for key, doc in node_data(res, ref, ours).items()})
    return docs


def is_export_file(path: Path) -> bool:
    """Whether a JSON file is one export_docs wrote (a graph collection or a node-data overlay)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict) or not doc:
        return False
    return "graphs" in doc or all(isinstance(v, dict) and "results" in v for v in doc.values())


def export(out_dir: str | Path, ref: Dump, ours: Dump | None = None, res: DiffResult | None = None) -> list[Path]:
    """Write export_docs' files into out_dir, all of them or none."""
    from graphgen.staging import staged_files
    out_dir = Path(out_dir)
    docs = export_docs(ref, ours, res)
    paths = [out_dir / name for name in docs]
    with staged_files(paths) as tmps:
        for tmp, doc in zip(tmps, docs.values()):
            tmp.write_text(json.dumps(doc))
    return paths
