"""The authors' comparison (graphgen/authors/compare.py) on hand-made dumps, without torch: which
side divides the relative L2, the bands a ggml side's cache types give, and the count of the ggml
nodes the map does not cover."""

from __future__ import annotations

import numpy as np
import pytest

from graphgen.authors.compare import BAND_F16, BAND_F16_NODES, BAND_F32, compare_paths, compare_values
from graphgen.dump.format import DumpError, Node, write_dump


def _header(engine: str, type_k="f32", type_v="f32") -> dict:
    return {"source": {"engine": engine, "version": "test"}, "model": "m", "cpu_features": {},
            "settings": {"flash_attn": False, "type_k": type_k, "type_v": type_v, "n_ctx": 64, "n_ubatch": 32,
                         "n_kv": None, "causal": False}}


def _write(folder, engine, nodes, values, **types):
    ns = [Node(i, name, op, "f32", [values[i].size, 1, 1, 1]) for i, (name, op) in enumerate(nodes)]
    write_dump(folder, 0, "block", _header(engine, **types), ns, {i: v.astype(np.float32) for i, v in values.items()})


def _pair(tmp_path, torch_vals, ggml_vals, extra_ggml=0, **types):
    t = {0: torch_vals}
    names = [("result_norm", "TORCH")]
    _write(tmp_path / "torch", "torch", names, t)
    g_nodes = [(f"node_{k}", "ADD") for k in range(extra_ggml)] + [("result_norm", "MUL")]
    g_vals = {k: np.ones(3) for k in range(extra_ggml)}
    g_vals[extra_ggml] = ggml_vals
    _write(tmp_path / "ggml", "graphgen", g_nodes, g_vals, **types)
    return compare_paths(tmp_path / "torch", tmp_path / "ggml")


def test_relative_l2_divides_by_the_authors_side(tmp_path):
    a = np.array([3.0, 4.0, 0.0, 0.0])
    b = np.array([3.0, 4.0, 5.0, 0.0])
    # ||b - a|| / ||a|| = 5 / 5; divided by ||b|| it would be 5 / sqrt(50)
    assert compare_values(a, b)[0] == pytest.approx(1.0)
    res = _pair(tmp_path, a, b)
    node = next(n for n in res.nodes if n.name == "result_norm")
    assert node.rel_l2 == pytest.approx(1.0) and node.nmse == pytest.approx(1.0)


@pytest.mark.parametrize("type_k, type_v, band, node_band", [
    ("f32", "f32", BAND_F32, BAND_F32),
    ("f32", "f16", BAND_F16, BAND_F16_NODES),   # one f16 side is enough for the f16 bands
    ("f16", "f32", BAND_F16, BAND_F16_NODES),
    ("f16", "f16", BAND_F16, BAND_F16_NODES),
])
def test_bands_follow_the_cached_types(tmp_path, type_k, type_v, band, node_band):
    res = _pair(tmp_path, np.ones(4), np.ones(4), type_k=type_k, type_v=type_v)
    assert (res.band, res.node_band) == (band, node_band)
    # a node just inside and just outside its band
    v = np.ones(10000)
    for scale, ok in ((0.9, True), (1.1, False)):
        b = v.copy()
        b[0] += scale * node_band * np.linalg.norm(v)
        res = _pair(tmp_path / f"{scale}", v, b, type_k=type_k, type_v=type_v)
        assert (next(n for n in res.nodes if n.name == "result_norm").status == "ok") == ok


def test_quantized_caches_have_no_band(tmp_path):
    with pytest.raises(DumpError, match="this dump cached f32/q8_0: give one with --nmse"):
        _pair(tmp_path, np.ones(4), np.ones(4), type_k="q8_0", type_v="f32")


def test_unmapped_ggml_nodes_are_counted_not_compared(tmp_path):
    res = _pair(tmp_path, np.ones(4), np.ones(4), extra_ggml=5)
    assert res.unmapped == 5
    assert [n.name for n in res.compared] == ["result_norm"]
    assert "unmapped on the graphgen side: 5 nodes" in res.format_text()
