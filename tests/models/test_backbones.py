"""The DSpark backbones: DeepSeek-V4 against llama.cpp b11739, DeepSeek-V4.1 and Mistral Large 4
(seed only) against the node sequence traced from the seed's builders (tests/support/seedref; their values
are checked in test_seed_reference.py)."""

import json

import gguf
import numpy as np
import pytest

from conftest import REF_DIR
from gguf_edit import rewrite
from graphgen.compare.pairing import diff_paths
from graphgen.dump.format import load_dump
from graphgen.play.engine import run_scenario
from graphgen.errors import GGUFModelError
from graphgen.runtime.kvcache import KVCache, UBatch
from graphgen.runtime.model import load
from graphgen.play.scenario import parse_scenario
from graphgen.synth import make_model
from make_references import build_model
from parity_check import assert_parity

def scenario(flash_attn=False, type_kv="f16", block=(7, 255, 255, 255)):
    return parse_scenario({"n_ctx": 256, "n_ubatch": 64, "flash_attn": "on" if flash_attn else "off",
                           "type_kv": type_kv, "seed": 1,
                           "steps": [{"inject": {"n_tokens": 6, "pos0": 0}},
                                     {"block": {"tokens": list(block), "pos0": 6}}]})


# --- DeepSeek-V4 against b11739 ---------------------------------------------------------------

def test_dsv4_reference_as_documented():
    """reference-llama-cpp.md: inject 17, block 270 / 260; 12 fused HC nodes, 4 SWIGLU_CLAMP."""
    for case, block in (("dsv4-fa-off", 270), ("dsv4-fa-on", 260)):
        inj = json.loads(next((REF_DIR / case).glob("*-inject.json")).read_text())
        blk = json.loads(next((REF_DIR / case).glob("*-block.json")).read_text())
        assert blk["source"]["version"] == "b11739"
        assert (len(inj["nodes"]), len(blk["nodes"])) == (17, block)
        ops = [n["op"] for n in blk["nodes"]]
        assert sum(op.startswith("DSV4_HC_") for op in ops) == 12
        assert ops.count("SWIGLU_CLAMP") == 4
        fused = {n["name"] for n in blk["nodes"] if n["op"] in ("DSV4_HC_PRE", "DSV4_HC_POST")}
        assert fused == {f"{k}-{il}" for k in ("hc_attn_pre", "hc_attn_post", "hc_ffn_pre", "l_out") for il in (0, 1)}


@pytest.mark.parametrize("case", ["dsv4-fa-off", "dsv4-fa-on"])
def test_dsv4_matches_llama_cpp(case, tmp_path, models_dir):
    """No equivalence rule: the fused ops are built as upstream builds them, node for node."""
    case_dir = REF_DIR / case
    model = build_model(case_dir, models_dir)
    run_scenario(model, parse_scenario(json.loads((case_dir / "scenario.json").read_text())), tmp_path)
    results = diff_paths(case_dir, tmp_path)
    assert [r.graph for r in results] == ["inject", "block"]
    assert_parity(results, case)
    with load_dump(results[1].ours_path) as ours:
        ops = [n.op for n in ours.nodes]
        assert sum(op.startswith("DSV4_HC_") for op in ops) == 12 and ops.count("SWIGLU_CLAMP") == 4
        # every node's values were compared, not only the named ones
        assert len(results[1].numeric) == len(ours.nodes)


# --- loader ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backbone, edit, match", [
    ("dsv4", {"dflash.expert_gating_func": (gguf.GGUFValueType.UINT32, 1)}, "expects sqrtsoftplus MoE scoring"),
    ("dsv4", {"dflash.attention.compress_ratios": (gguf.GGUFValueType.ARRAY, [0, 4])},
     "expects uncompressed attention on all stages"),
    ("dsv4", {"dflash.hyper_connection.count": (gguf.GGUFValueType.UINT32, 2)}, "exactly 4 streams"),
    ("mistral-large4", {"dflash.attention.sliding_window": (gguf.GGUFValueType.UINT32, 0)},
     "DSpark Mistral Large 4 draft expects a sliding window"),
    ("mistral-large4", {"dflash.attention.key_length": (gguf.GGUFValueType.UINT32, 40)},
     r"expects key_length == kv_lora_rank \+ rope dim"),
])
def test_loader_errors(tmp_path, backbone, edit, match):
    src = make_model(tmp_path / "a.gguf", "dspark", backbone)["path"]
    dst = tmp_path / "b.gguf"
    rewrite(src, dst, drop_keys=list(edit), set_keys=edit)
    with pytest.raises(GGUFModelError, match=match):
        load(dst)


def test_backbones_load(tmp_path):
    for backbone, n_swa in (("dsv4", 16), ("dsv41", 17), ("mistral-large4", 17)):
        m = load(make_model(tmp_path / f"{backbone}.gguf", "dspark", backbone)["path"])
        assert m.backbone == backbone and m.variant == "dspark"
        # n_swa + 1 on DSV4.1 and ML4: the block's window is its anchor's
        assert m.hparams.n_swa == n_swa and m.hparams.swa_layers == [True, True]


# --- block-uniform mask ------------------------------------------------------------------------

def test_block_uniform_mask():
    class HP:
        n_embd_k_gqa = n_embd_v_gqa = 8
    c = KVCache(HP(), [], 32, 1, 1, False, n_swa=5)
    c.apply_ubatch(list(range(8)), UBatch(pos=np.arange(8, dtype=np.int32), seq=np.zeros(8, np.int32)))
    blocks = UBatch(pos=np.array([8, 9, 10, 11, 4, 5, 6, 7], np.int32), seq=np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32))
    c.apply_ubatch(list(range(8, 12)), UBatch(pos=blocks.pos[:4], seq=blocks.seq[:4]))
    c.apply_ubatch(list(range(12, 16)), UBatch(pos=blocks.pos[4:], seq=blocks.seq[4:]))
    plain = c.kq_mask_values(blocks, 32, False, np.float32)
    uni = c.kq_mask_values(blocks, 32, False, np.float32, block_uniform=True)
    for rows in (range(0, 4), range(4, 8)):
        for i in rows:
            assert np.array_equal(uni[i], plain[rows[0]])  # every query row is the anchor's row
    # the window of a later query would hide keys the anchor sees
    assert not np.array_equal(plain[3], plain[0])
    # the anchor (pos 8) sees pos 4..7 (window 5) and every key of its block, nothing of seq 1
    seen = {int(c.pos[j]) for j in np.nonzero(uni[0] == 0)[0]}
    assert seen == {4, 5, 6, 7, 8, 9, 10, 11}


# --- DeepSeek-V4.1 and Mistral Large 4: the seed's op order --------------------------------------
# Every node (name, op, shape) against the sequence tests/support/seedref/opseq.py traces from the seed's
# graph_dsv41 / graph_mistral_large4 and the upstream helpers they call; the values of every named
# node are checked against the float64 reference in tests/models/test_seed_reference.py.

@pytest.mark.parametrize("backbone, n_nodes", [("dsv41", (10, 157)), ("mistral-large4", (13, 154))])
def test_seed_op_order(tmp_path, backbone, n_nodes):
    from seedref.opseq import SeedGraphs, UBatch
    path = make_model(tmp_path / "m.gguf", "dspark", backbone, n_layer=1, joint=backbone == "mistral-large4")["path"]
    run_scenario(path, scenario(), tmp_path / "out")
    graphs = SeedGraphs(path, flash_attn=False, type_kv="f16", n_kv=256, kv_size=256)
    for kind, ub, n in (("inject", UBatch(6, 1, embd=True), n_nodes[0]), ("block", UBatch(4, 1), n_nodes[1])):
        expected = [(t.name, t.op, t.ne) for t in graphs.build(ub)]
        with load_dump(next((tmp_path / "out").glob(f"*-{kind}.json"))) as d:
            assert [(x.name, x.op, tuple(x.ne)) for x in d.nodes] == expected
            assert len(d.nodes) == n
    # the Markov head (greedy chain over the block) ends the block graph
    assert expected[-1][1] == "RESHAPE" and sum(op == "ARGMAX" for _, op, _ in expected) == 3


@pytest.mark.parametrize("backbone", ["dsv4", "dsv41", "mistral-large4"])
def test_two_blocks_in_one_batch(tmp_path, backbone):
    """Two sequences' blocks in one batch give each block the logits it gets alone (the
    block-uniform mask and the ML4 [anchor, masks] input are per block)."""
    import graphgen.runtime.session as s
    path = make_model(tmp_path / "m.gguf", "dspark", backbone)["path"]
    f = np.random.default_rng(0).standard_normal((6, 128), dtype=np.float32)
    with s.Session(path, n_ctx=256, n_seq=2, type_kv="f32") as sess:
        sess.inject(f, 0, seq=0)
        sess.inject(f[::-1].copy(), 0, seq=1)
        both = sess.block_multi([(0, [7, 255, 255, 255], 6), (1, [9, 255, 255, 255], 6)]).logits
        for seq, tok in ((0, 7), (1, 9)):
            sess.seq_rm(0, 6, -1)
            sess.seq_rm(1, 6, -1)
            alone = sess.block([tok, 255, 255, 255], 6, seq=seq).logits
            np.testing.assert_allclose(both[4 * seq:4 * seq + 4], alone, rtol=0, atol=1e-4)


@pytest.mark.parametrize("backbone, key, head", [("dsv41", "head_dim", 24), ("dsv41", "head_dim", 136),
                                                 ("mistral-large4", "k_head_dim_mla", 72),
                                                 ("mistral-large4", "k_head_dim_mla", 112)])
@pytest.mark.parametrize("fa", [False, True])
def test_seed_attention_scale_is_worked_in_float(tmp_path, backbone, key, head, fa):
    """The seed's graph_dsv41 / graph_mistral_large4 scale attention by 1.0f/sqrtf(head) worked in
    float: for these head sizes the double-worked value is another float. No llama.cpp runs these
    backbones, so the softmax's op_params are checked against the seed's expression here."""
    import struct
    kw = {key: head, "n_rot": 8, "n_layer": 1, "joint": backbone == "mistral-large4"}
    path = make_model(tmp_path / "m.gguf", "dspark", backbone, **kw)["path"]
    run_scenario(path, scenario(flash_attn=fa), tmp_path / "out")
    want = np.float32(1.0) / np.sqrt(np.float32(head))
    assert float(want) != float(np.float32(1.0 / np.sqrt(float(head))))  # the case is one that parts
    with load_dump(next((tmp_path / "out").glob("*-block.json"))) as d:
        attn = [n for n in d.nodes if n.op == ("FLASH_ATTN_EXT" if fa else "SOFT_MAX")]
        assert attn, [n.op for n in d.nodes]
        for n in attn:
            got = struct.unpack("<f", struct.pack("<i", n.op_params[0]))[0]
            assert got == float(want), f"{n.name}: scale {got!r}, the seed's {float(want)!r}"
