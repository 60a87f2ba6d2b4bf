"""`graphgen check --local`: each mapped node of llama.cpp's graph re-run alone on the authors'
values (graphgen.authors.compare.own_errors), and graphgen's nodes on llama.cpp's.

A node can be re-run on the authors' values only where the tensor map covers every one of its
sources; the others must say which source has no partner. The weights a node reads come from the
converted draft and the target that lends it its embeddings and head."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from authors_util import require_extra

CLI = [sys.executable, "-m", "graphgen.cli"]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    require_extra()
    d = tmp_path_factory.mktemp("own")
    p = subprocess.run(CLI + ["make-model", str(d / "ck"), "--format", "hf", "--variant", "dflash"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(CLI + ["check", str(d / "ck"), "--local", "--json", "--keep", str(d / "kept")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return d, json.loads(p.stdout)


def test_mapped_nodes_whose_sources_are_mapped_are_rerun_on_the_authors_values(checked):
    d, doc = checked
    own = doc["own_errors"]["authors_vs_llama.cpp"]
    rerun = [r for r in own["rows"] if r["kind"] == "rerun"]
    block = [r for r in rerun if r["graph"].endswith("-block.json")]
    # l_out from ffn_out and ffn_inp, the head from result_norm (its weight lent by the target),
    # the block's embeddings from the target's table: in each block graph
    names = {r["name"] for r in block}
    assert {"l_out-0", "l_out-1", "result_output", "inp_noise_embd"} <= names, names
    # an f32 cache: the authors' f32 values through ggml's f32 kernels, to rounding
    assert all(r["own_nmse"] < 1e-10 for r in rerun)
    # every other mapped node says which source has no partner
    skipped = [r for r in own["rows"] if r["kind"] == "skipped"]
    assert skipped and all(r["why"] == "it has no counterpart in ref" and r["source"] for r in skipped)
    assert own["rerun"] + own["views"] + own["skipped"] == len(own["rows"])


def test_graphgens_nodes_on_llama_cpps_values_add_nothing(checked):
    _, doc = checked
    graphs = doc["own_errors"]["graphgen_on_llama.cpp"]
    assert len(graphs) == 4  # two rounds of inject and block
    for loc in graphs:
        assert loc["rerun"] > 0 and loc["skipped"] == 0 and loc["own"] == []
        assert loc["n_replay_exact"] == loc["rerun"]
