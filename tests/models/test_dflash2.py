"""graphgen.models.dflash2: the DFlash2 head's graph (the conv backbone, its logits, the candidate
selector and its lattice) node for node against llama.cpp b11739's dumps, and its metadata checks
and tensors."""

import gguf
import pytest
from gguf_edit import rewrite

from graphgen.errors import GGUFModelError
from graphgen.models.arch import HParams
from graphgen.models.dflash2 import HEAD, load_hparams_dflash2, load_tensors_dflash2
from graphgen.runtime.model import load
from graphgen.synth import make_model

from .graphs import block, structure

U32 = gguf.GGUFValueType.UINT32


def selector(nodes):
    """The head's own nodes: after the lm head, up to the lattice."""
    names = [n.name for n in nodes]
    return nodes[names.index("result_output") + 1:names.index("dflash2_lattice") + 1]


@pytest.mark.parametrize("case", ["dflash2-fa-off", "dflash2-fa-on", "dflash2-top1-block2"])
def test_the_selector_is_b11739s(case, tmp_path, models_dir):
    ours, ref = block(case, tmp_path, models_dir)
    assert structure(selector(ours)) == structure(selector(ref))
    # and the whole graph too: the conv layers and the lm head the selector reads
    assert structure(ours) == structure(ref)


@pytest.mark.parametrize("case, top_k, block_size", [("dflash2-fa-off", 2, 4), ("dflash2-top1-block2", 1, 2)])
def test_the_lattice_has_a_row_per_block_position(case, top_k, block_size, tmp_path, models_dir):
    ours, _ = block(case, tmp_path, models_dir)
    head = selector(ours)
    lattice = head[-1]
    assert (lattice.name, lattice.op, lattice.ne[:2]) == ("dflash2_lattice", "RESHAPE", [64, block_size])
    top = [n for n in head if n.op == "TOP_K"]
    assert len(top) == 1 and top[0].ne[:2] == [top_k, block_size] and top[0].src == ["result_output"]
    # position 1 is scored against the anchor, positions from 2 against the candidates before them
    runs = [n for n in head if n.op == "GET_ROWS" and n.src[0] == "selector_predecessor.weight"]
    assert len(runs) == min(block_size - 1, 2)


def test_metadata_checks(tmp_path):
    src = make_model(tmp_path / "a.gguf", "dflash2")["path"]
    hp = load(src).hparams
    assert (hp.selector_rank, hp.selector_top_k, hp.conv_kernel_size, hp.conv_group_size) == (8, 2, 3, 16)
    for key in ("dflash.selector_rank", "dflash.selector_top_k", "dflash.conv_kernel_size",
                "dflash.conv_group_size"):
        with pytest.raises(GGUFModelError, match=f"DFlash2 model is missing conv/selector metadata .*'{key}'"):
            load(rewrite(src, tmp_path / "b.gguf", drop_keys=[key]))
    # 7 * (7 + 1) = 56 fits a hidden size of 64; 8 * 9 = 72 does not
    assert load(rewrite(src, tmp_path / "c.gguf", drop_keys=["dflash.selector_top_k"],
                        set_keys={"dflash.selector_top_k": (U32, 7)})).hparams.selector_top_k == 7
    hp = HParams(n_embd=64, selector_rank=8, selector_top_k=8, conv_kernel_size=3, conv_group_size=16, block_size=4)
    with pytest.raises(GGUFModelError, match=r"p.gguf: DFlash2 hidden size is too small .* = 8\)"):
        load_hparams_dflash2(hp, "p.gguf")
    hp.selector_top_k, hp.block_size = 2, 0
    with pytest.raises(GGUFModelError, match="'dflash.block_size'"):
        load_hparams_dflash2(hp, "p.gguf")


def test_tensors_and_the_head_entry():
    hp = HParams(n_embd=64, n_layer=1, n_vocab=256, selector_rank=8, conv_kernel_size=3, conv_group_size=16)
    shapes, required = load_tensors_dflash2(hp)
    assert shapes["selector_predecessor.weight"] == shapes["selector_successor.weight"] == (8, 256)
    assert shapes["selector_hidden.weight"] == (64, 8) and shapes["blk.0.ffn_conv_proj.weight"] == (64, 24)
    assert set(required) == set(shapes)
    assert HEAD.detects({"selector_hidden.weight"}, set()) and not HEAD.detects({"markov_w1.weight"}, set())
    assert HEAD.block_rules(hp).equal_blocks
