"""Graphs are sized as llama.cpp sizes them (llama_context::graph_max_nodes), with no fixed limit:
a 500-layer draft builds and is identical to b11739; a graph over the budget is refused in one
line where llama.cpp aborts."""

from __future__ import annotations

import json

import pytest

from graphgen.compare.pairing import diff_paths
from graphgen.compare.report import exit_code
from graphgen.play.engine import run_scenario
from graphgen.errors import GraphgenError
from graphgen.graph import graph_max_nodes
from graphgen.reference.runner import ReferenceFailed, run_reference
from graphgen.runtime.model import load
from graphgen.play.scenario import parse_scenario
from graphgen.synth import make_model

SCENARIO = {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "off", "type_kv": "f16", "seed": 1,
            "steps": [{"inject": {"n_tokens": 6, "pos0": 0}}, {"block": {"tokens": [7, 255, 255, 255], "pos0": 6}}]}


def _hp(**kw):
    return type("HP", (), {"hc_mult": 0, "selector_rank": 0, **kw})()


def test_budget_rule():
    assert graph_max_nodes(_hp(), 20, 64) == 1024
    assert graph_max_nodes(_hp(), 5006, 64) == 8 * 5006
    assert graph_max_nodes(_hp(selector_rank=16), 100, 64) == 1200
    assert graph_max_nodes(_hp(hc_mult=4), 10, 64) == 64 * 40
    assert graph_max_nodes(_hp(hc_mult=4), 1000, 64) == 32 * 1000


@pytest.mark.reference
def test_500_layer_draft_is_identical_to_b11739(tmp_path):
    gguf = tmp_path / "deep.gguf"
    make_model(gguf, "dflash", n_layer=500)
    sc_path = tmp_path / "s.json"
    sc_path.write_text(json.dumps(SCENARIO))
    run_scenario(gguf, parse_scenario(SCENARIO), tmp_path / "ours")
    run_reference(gguf, sc_path, tmp_path / "ref", stderr_log=None)
    res = diff_paths(tmp_path / "ref", tmp_path / "ours")
    assert exit_code(res) == 0
    n_block = json.loads((tmp_path / "ref" / "01-block.json").read_text())["nodes"]
    assert len(n_block) > 16384  # past the fixed limit graphgen once had


@pytest.mark.reference
def test_over_budget_graph_is_refused_where_llama_cpp_aborts(tmp_path):
    # a DSpark head over a block of 128: the Markov chain's nodes outgrow a 1-layer draft's 1024
    gguf = tmp_path / "long.gguf"
    make_model(gguf, "dspark", n_layer=1, block_size=128, conf=True)
    m = load(gguf)
    n_tensors = len(m.tensor_table())
    m.close()
    sc = {"n_ctx": 512, "n_ubatch": 256, "steps": [{"inject": {"n_tokens": 4, "pos0": 0}},
                                                    {"block": {"tokens": [7] + [255] * 127, "pos0": 4}}]}
    with pytest.raises(GraphgenError, match=rf"the block graph has \d+ nodes, more than llama.cpp's budget "
                                            rf"for this draft \(1024: graph_max_nodes of {n_tensors} tensors\)"):
        run_scenario(gguf, parse_scenario(sc), tmp_path / "ours")
    sc_path = tmp_path / "s.json"
    sc_path.write_text(json.dumps(sc))
    with pytest.raises(ReferenceFailed, match="GGML_ASSERT"):
        run_reference(gguf, sc_path, tmp_path / "ref", stderr_log=None)



def test_graph_exactly_at_the_budget_is_built(tmp_path):
    """ggml's graph holds `size` nodes (ggml_visit_parents asserts n_nodes < size before it adds
    one), so llama.cpp builds a graph of exactly graph_max_nodes nodes: graphgen refuses one node
    more, never the graph at the budget itself."""
    import numpy as np

    from graphgen.runtime.session import Session
    gguf = tmp_path / "d.gguf"
    make_model(gguf, "dflash", "base")

    def block_with_budget(budget):
        s = Session(gguf, n_ctx=256)
        try:
            if budget is not None:
                s.max_nodes = budget  # before the first graph is built
            s.inject(np.zeros((6, s.hparams.n_embd_inp_enc), np.float32), 0)
            return s.block([7, 255, 255, 255], 6).n_nodes
        finally:
            s.close()
    n_block = block_with_budget(None)
    assert 17 < n_block < 1024  # the inject graph is smaller: only the block meets the budget
    assert block_with_budget(n_block) == n_block
    with pytest.raises(GraphgenError, match=rf"the block graph has {n_block} nodes, more than llama.cpp's budget "
                                            rf"for this draft \({n_block - 1}:"):
        block_with_budget(n_block - 1)
