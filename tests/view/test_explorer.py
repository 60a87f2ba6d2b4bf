"""graphgen.view.explorer: a dump as a Model Explorer graph collection (nodes by evaluation index,
layers as namespaces, edges by input slot), the per-node overlays of a diff (NMSE, max abs error,
backend), and the export's files."""

import json
from pathlib import Path

import numpy as np
import pytest

from graphgen.compare.diff import diff_dumps
from graphgen.dump.format import FORMAT, Dump, Node, load_dump, write_dump
from graphgen.view import explorer as E
from graphgen.view.diffmap import STATUS_COLOURS
from graphgen.view.dot import op_colour

EPS = 0x3727C5AC   # 1e-5
HEADER = {"source": {"engine": "graphgen", "version": "1"}, "model": "m",
          "settings": {"flash_attn": False, "type_k": "f16", "type_v": "f16", "n_ctx": 8, "n_ubatch": 8, "n_kv": 8,
                       "causal": True}, "cpu_features": {}}
NODES = [
    Node(0, "inp_embd", "GET_ROWS", "f32", [4, 2, 1, 1], ["token_embd.weight", "inp_tokens"]),
    Node(1, "norm-0", "RMS_NORM", "f32", [4, 2, 1, 1], ["inp_embd"], op_params=[EPS] + [0] * 15, backend="Vulkan0"),
    Node(2, " ", "VIEW", "f32", [4, 1, 1, 1], ["norm-0"], view_src="cache_k_l0", view_offs=16),
    Node(3, "out-0", "ADD", "f32", [4, 2, 1, 1], ["norm-0", "inp_embd"]),
]


def dump(nodes=NODES, source=None):
    return Dump(path=Path("01-block.json"), format=FORMAT, source=source or HEADER["source"], model="m",
                graph="block", settings={}, cpu_features={}, nodes=nodes)


def by_id(doc):
    [g] = doc["graphs"]
    return {n["id"]: n for n in g["nodes"]}


def attrs(node):
    return {a["key"]: a["value"] for a in node["attrs"]}


def test_graph_json():
    doc = E.graph_json(dump(), label="mine")
    assert doc["label"] == "mine" and [g["id"] for g in doc["graphs"]] == ["block"]
    nodes = by_id(doc)
    assert set(nodes) == {"0", "1", "2", "3", "leaf:token_embd.weight", "leaf:inp_tokens", "leaf:cache_k_l0"}
    norm = nodes["1"]
    assert norm["label"] == "norm-0" and norm["namespace"] == "layer_0"
    assert attrs(norm) == {"name": "norm-0", "op": "RMS_NORM", "type": "f32", "ne": "[4, 2, 1, 1]", "index": "1",
                           "backend": "Vulkan0", "op_params": "eps=1e-05", "op_params_raw": f"[{EPS}]"}
    assert norm["incomingEdges"] == [{"sourceNodeId": "0", "sourceNodeOutputId": "0", "targetNodeInputId": "0"}]
    assert norm["style"]["backgroundColor"] == op_colour("RMS_NORM")
    assert norm["outputsMetadata"][0]["attrs"][0] == {"key": "tensor_shape", "value": "f32[4, 2, 1, 1]"}
    # a blank name shows the op; a view's source is an input after its src slots
    view = nodes["2"]
    assert view["label"] == "VIEW" and attrs(view)["view_src"] == "cache_k_l0"
    assert [e["targetNodeInputId"] for e in view["incomingEdges"]] == ["0", "1"]
    assert [e["sourceNodeId"] for e in view["incomingEdges"]] == ["1", "leaf:cache_k_l0"]
    out = nodes["3"]
    assert [(e["sourceNodeId"], e["targetNodeInputId"]) for e in out["incomingEdges"]] == [("1", "0"), ("0", "1")]
    assert nodes["0"]["namespace"] == "" and attrs(nodes["0"])["backend"] == "CPU"
    leaf = nodes["leaf:token_embd.weight"]
    assert attrs(leaf) == {"kind": "leaf"} and leaf["incomingEdges"] == []
    assert E.graph_json(dump())["label"] == "01-block.json"


def test_backends_given_imported_or_cpu():
    imported = dump(source={"engine": "llama.cpp", "version": "?", "import": {"backends": {"3": "CUDA0"}}})
    nodes = by_id(E.graph_json(imported, backends={0: "Metal"}))
    assert [attrs(nodes[k])["backend"] for k in "0123"] == ["Metal", "Vulkan0", "CPU", "CUDA0"]


def test_diff_status_colours_the_nodes():
    nodes = by_id(E.graph_json(dump(), status={3: "value"}))
    assert attrs(nodes["3"])["diff"] == "value" and attrs(nodes["0"])["diff"] == "matched"
    assert nodes["3"]["style"]["backgroundColor"] == STATUS_COLOURS["value"]
    assert nodes["0"]["style"]["backgroundColor"] == STATUS_COLOURS["matched"]


@pytest.fixture
def pair(tmp_path):
    values = {k: np.arange(n.nelements, dtype=np.float32) + k for k, n in enumerate(NODES)}
    ref = load_dump(write_dump(tmp_path / "ref", 1, "block", HEADER, NODES, values))
    values[3] = values[3] * np.float32(1.5)
    ours = load_dump(write_dump(tmp_path / "ours", 1, "block", HEADER, NODES, values))
    return ref, ours, diff_dumps(ref, ours)


def test_node_data_overlays(pair):
    ref, ours, res = pair
    data = E.node_data(res, ref, ours)
    assert set(data) == {"nmse", "max_abs", "backend"} and all(set(v) == {"block"} for v in data.values())
    nmse = data["nmse"]["block"]
    assert nmse["results"]["0"] == {"value": 0.0} and nmse["results"]["3"]["value"] > 0.1
    assert nmse["thresholds"][0]["value"] == 1e-7
    assert data["max_abs"]["block"]["results"]["3"]["value"] == pytest.approx(0.5 * (3 + 7))
    be = data["backend"]["block"]
    assert be["name"] == "backend (0=CPU, 1=Vulkan0)"
    assert be["results"]["1"]["value"] == 1 and be["results"]["0"]["value"] == 0
    assert be["results"]["1"]["bgColor"] == E.BACKEND_COLOURS[1]


def test_export_writes_the_graph_and_its_overlays(pair, tmp_path):
    ref, ours, res = pair
    assert list(E.export_docs(ref)) == ["01-block.graph.json"]
    docs = E.export_docs(ref, ours)
    assert sorted(docs) == ["01-block.backend.json", "01-block.graph.json", "01-block.max_abs.json",
                            "01-block.nmse.json"]
    assert attrs(by_id(docs["01-block.graph.json"])["3"])["diff"] == "value"
    paths = E.export(tmp_path / "ex", ref, ours, res)
    assert sorted(p.name for p in paths) == sorted(docs)
    for p in paths:
        assert json.loads(p.read_text()) == json.loads(json.dumps(docs[p.name])) and E.is_export_file(p)
    other = tmp_path / "other.json"
    for text in ("{}", "[1]", '{"a": 1}', "not json"):
        other.write_text(text)
        assert not E.is_export_file(other)
    assert not E.is_export_file(tmp_path / "absent.json")
