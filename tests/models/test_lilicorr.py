"""graphgen.models.lilicorr: the LiliCorr head's graph (the DFlash backbone, then the correlation
scorer on full blocks, its lattice in h_nextn) node for node against llama.cpp b11739's dumps; a
batch that is no full block; its metadata checks and tensors."""

import json

import gguf
import pytest
from conftest import REF_DIR
from gguf_edit import rewrite
from make_references import build_model

from graphgen.dump.format import dump_files, load_dump
from graphgen.errors import GGUFModelError
from graphgen.models.arch import HParams
from graphgen.models.lilicorr import HEAD, load_tensors_lilicorr
from graphgen.play.engine import run_scenario
from graphgen.play.scenario import load_scenario, parse_scenario
from graphgen.runtime.model import load
from graphgen.synth import make_model

F32 = gguf.GGUFValueType.FLOAT32
U32 = gguf.GGUFValueType.UINT32


def structure(nodes):
    return [(n.name, n.op, n.type, n.ne, n.src, n.view_src, n.op_params) for n in nodes]


def built(case, tmp_path, models_dir, doc=None):
    case_dir = REF_DIR / case
    sc = parse_scenario(doc) if doc else load_scenario(case_dir / "scenario.json")
    run_scenario(build_model(case_dir, models_dir), sc, tmp_path)
    return {p.name: load_dump(p).nodes for p in dump_files(tmp_path)}


def scorer(nodes):
    names = [n.name for n in nodes]
    return nodes[names.index("result_output") + 1:names.index("lilicorr_lattice") + 1]


@pytest.mark.parametrize("case", ["lilicorr-fa-off", "lilicorr-fa-on", "lilicorr-1slot"])
def test_the_scorer_is_b11739s(case, tmp_path, models_dir):
    graphs = built(case, tmp_path, models_dir)
    for name, ours in graphs.items():
        ref = load_dump(REF_DIR / case / name).nodes
        if name.endswith("-block.json"):
            assert len(scorer(ours)) > 50
            assert structure(scorer(ours)) == structure(scorer(ref))
        assert structure(ours) == structure(ref), name


def test_the_lattice_row_per_token(tmp_path, models_dir):
    block = built("lilicorr-fa-off", tmp_path, models_dir)["01-block.json"]
    lattice = scorer(block)[-1]
    assert (lattice.op, lattice.ne[:2]) == ("RESHAPE", [64, 4])
    # the scorer reads the block's context rows and the draft's own token embeddings
    srcs = {s for n in scorer(block) for s in n.src}
    assert "token_embd.weight" in srcs and "lilicorr.output_norm.weight" in srcs
    assert sum(n.op == "TOP_K" for n in scorer(block)) == 1


def test_a_batch_that_is_no_full_block_is_a_plain_dflash_graph(tmp_path, models_dir):
    doc = json.loads((REF_DIR / "lilicorr-fa-off" / "scenario.json").read_text())
    doc["steps"][1] = {"block": {"tokens": [7, 255, 255], "pos0": 6}}
    ours = built("lilicorr-fa-off", tmp_path, models_dir, doc)["01-block.json"]
    assert ours[-1].name == "result_output" and not any(n.name.startswith("lilicorr") for n in ours)
    plain = load_dump(REF_DIR / "lilicorr-fa-off" / "01-block.json").nodes
    names = [n.name for n in plain]
    # the backbone's nodes up to the lm head, as in the full block's graph
    assert [(n.name, n.op) for n in ours] == [(n.name, n.op) for n in plain[:names.index("result_output") + 1]]


def test_a_full_block_without_its_context_row_is_a_plain_dflash_graph(tmp_path, models_dir):
    # no inject before it: no context row for the block to carry, so the scorer cannot run
    doc = {"n_ctx": 256, "steps": [{"block": {"tokens": [7, 255, 255, 255], "pos0": 0}}]}
    [ours] = built("lilicorr-fa-off", tmp_path, models_dir, doc).values()
    assert ours[-1].name == "result_output" and not any(n.name.startswith("lilicorr") for n in ours)


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("lilicorr") / "l.gguf", "lilicorr")["path"]


@pytest.mark.parametrize("edit, match", [
    ({"lilicorr.vector_eps": (F32, -1.0)}, "'lilicorr.vector_eps' = -1.0 must be a finite number >= 0"),
    ({"lilicorr.num_layers": (U32, 3)}, "invalid LiLiCorr head dimensions"),
    ({"lilicorr.factor_dim": (U32, 0)}, "invalid LiLiCorr head dimensions"),
    ({"lilicorr.candidate_topk": (U32, 8)}, "invalid LiLiCorr DFlash metadata"),   # 8 * 9 > 64
    ({"dflash.block_size": (U32, 1)}, "invalid LiLiCorr DFlash metadata"),
])
def test_metadata_checks(draft, tmp_path, edit, match):
    with pytest.raises(GGUFModelError, match=match):
        load(rewrite(draft, tmp_path / "b.gguf", drop_keys=list(edit), set_keys=edit))


def test_required_keys(draft, tmp_path):
    with pytest.raises(GGUFModelError, match="lilicorr.logit_scale"):
        load(rewrite(draft, tmp_path / "b.gguf", drop_keys=["lilicorr.logit_scale"]))
    hp = load(draft).hparams
    assert (hp.lilicorr_candidate_topk, hp.lilicorr_num_heads, hp.lilicorr_layers) == (2, 2, 1)
    assert HEAD.detects(set(), {"lilicorr.hidden_size"}) and HEAD.context_rows


def test_tensor_block_ids():
    hp = HParams(n_embd=64, n_layer=2, block_size=4, lilicorr_hidden_size=32, lilicorr_candidate_topk=2,
                 lilicorr_num_heads=2, lilicorr_layers=2, lilicorr_factor_dim=16, lilicorr_mlp_hidden_size=48)
    shapes, required = load_tensors_lilicorr(hp)
    # scorer layer i on block n_layer + i (its in-projection named by i), features after them
    assert shapes["blk.2.attn_output.weight"] == shapes["blk.3.attn_output.weight"] == (32, 32)
    assert shapes["lilicorr.layers.1.attn.in_proj.weight"] == (32, 96)
    assert shapes["blk.4.ffn_up.weight"] == (5, 32) and shapes["blk.3.ffn_up.weight"] == (32, 48)
    assert shapes["lilicorr.slot_embedding.weight"] == (32, 3)
    assert shapes["lilicorr.attention_bias.bias"] == (6, 6, 2)
    # a scorer narrower than the draft projects its tokens; one as wide may not
    assert "lilicorr.token_proj.weight" in required
    hp.lilicorr_hidden_size = 64
    assert "lilicorr.token_proj.weight" not in load_tensors_lilicorr(hp)[1]
    assert not any("conv" in k for k in shapes)
    hp.conv_kernel_size, hp.conv_group_size = 3, 16
    assert "blk.1.ffn_conv_proj.weight" in load_tensors_lilicorr(hp)[1]
