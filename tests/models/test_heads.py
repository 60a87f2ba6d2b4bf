"""The heads: metadata upstream rejects, equal blocks, and where the seed allows the DSpark RNN joint head."""

import gguf
import numpy as np
import pytest

from gguf_edit import rewrite
from graphgen.errors import BatchError, GGUFModelError
from graphgen.runtime.model import load
from graphgen.runtime.session import Session
from graphgen.synth import make_model

U32 = gguf.GGUFValueType.UINT32


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    d = tmp_path_factory.mktemp("heads")
    out = {}
    for v in ("dflash2", "dspark", "lilicorr"):
        out[v] = d / f"{v}.gguf"
        make_model(out[v], v, seed=2)
    return out


def test_selector_without_conv_keys(drafts, tmp_path):
    p = rewrite(drafts["dflash2"], tmp_path / "a.gguf", drop_keys={"dflash.conv_kernel_size"})
    with pytest.raises(GGUFModelError, match="DFlash2 model is missing conv/selector metadata"):
        load(p)


def test_selector_lattice_too_wide(drafts, tmp_path):
    p = rewrite(drafts["dflash2"], tmp_path / "a.gguf", drop_keys={"dflash.selector_top_k"},
                set_keys={"dflash.selector_top_k": (U32, 8)})  # 8 * 9 > n_embd 64
    with pytest.raises(GGUFModelError, match="too small for the selector lattice"):
        load(p)


def test_dflash2_missing_block_size(drafts, tmp_path):
    p = rewrite(drafts["dflash2"], tmp_path / "a.gguf", drop_keys={"dflash.block_size"})
    with pytest.raises(GGUFModelError, match="block_size"):
        load(p)


def test_dspark_missing_block_size(drafts, tmp_path):
    p = rewrite(drafts["dspark"], tmp_path / "a.gguf", drop_keys={"dflash.block_size"})
    with pytest.raises(GGUFModelError, match="block_size"):
        load(p)


def test_lilicorr_hidden_not_divisible_by_heads(drafts, tmp_path):
    p = rewrite(drafts["lilicorr"], tmp_path / "a.gguf", drop_keys={"lilicorr.num_heads"},
                set_keys={"lilicorr.num_heads": (U32, 3)})
    with pytest.raises(GGUFModelError, match="invalid LiLiCorr DFlash metadata"):
        load(p)


def test_lilicorr_with_a_selector(drafts, tmp_path):
    p = rewrite(drafts["lilicorr"], tmp_path / "a.gguf", set_keys={"dflash.selector_top_k": (U32, 2)})
    with pytest.raises(GGUFModelError, match="invalid LiLiCorr DFlash metadata"):
        load(p)


def test_unequal_blocks_are_refused(drafts):
    with Session(drafts["dspark"], n_seq=2) as s:
        x = np.zeros((3, s.hparams.n_embd_inp_enc), np.float32)
        s.inject(x, 0, 0)
        s.inject(x, 0, 1)
        with pytest.raises(BatchError, match="equal blocks"):
            s.block_multi([(0, [7, 255, 255, 255], 3), (1, [7, 255, 255], 3)])
        r = s.block_multi([(0, [7, 255, 255, 255], 3), (1, [9, 255, 255, 255], 3)])
        assert r.logits.shape == (8, 256)


def test_joint_head_refused_on_the_base_backbone(tmp_path):
    p = tmp_path / "joint.gguf"
    make_model(p, "dspark", joint=True)
    with pytest.raises(GGUFModelError, match="joint_proj"):
        load(p)


# The RNN joint head (seed only: b11739 has none) exists in the seed on the Mistral Large 4 backbone
# alone (the other backbones give the head no hidden state, and the seed asserts on that); its graph
# and values are checked node by node in test_seed_reference.py against tests/support/seedref.
