"""graphgen.models.dflash: the base backbone's graphs (injection, noise block through the decoder
layers, logits) and the encoder, node for node against llama.cpp b11739's dumps; its iSWA keys;
its tensor declarations."""

import gguf
import pytest
from conftest import REF_DIR
from gguf_edit import rewrite
from make_references import build_model

from graphgen.dump.format import dump_files, load_dump
from graphgen.errors import GGUFModelError
from graphgen.models import dflash
from graphgen.models.arch import HParams, TensorInfo
from graphgen.play.engine import run_scenario
from graphgen.play.scenario import load_scenario
from graphgen.runtime.model import load
from graphgen.synth import make_model

U32 = gguf.GGUFValueType.UINT32
ARR = gguf.GGUFValueType.ARRAY


def structure(dump):
    return [(n.name, n.op, n.type, n.ne, n.src, n.view_src, n.op_params) for n in dump.nodes]


def built(case, tmp_path, models_dir):
    """{file name: (graphgen's graph, b11739's)} for a reference case's scenario."""
    case_dir = REF_DIR / case
    run_scenario(build_model(case_dir, models_dir), load_scenario(case_dir / "scenario.json"), tmp_path)
    return {p.name: (load_dump(p), load_dump(case_dir / p.name)) for p in dump_files(tmp_path)}


@pytest.mark.parametrize("case", ["dflash-fa-off", "dflash-fa-on", "dflash-iswa-fa-off", "dflash-iswa-fa-on",
                                  "dflash-sharedkv-fa-off", "dflash-kvf32-fa-on", "dflash-q8-fa-on", "dflash-encoder"])
def test_graphs_are_b11739s_node_for_node(case, tmp_path, models_dir):
    graphs = built(case, tmp_path, models_dir)
    assert sorted(graphs) == sorted(p.name for p in dump_files(REF_DIR / case))
    for name, (ours, ref) in graphs.items():
        assert structure(ours) == structure(ref), f"{case} {name}"


def named(dump):
    return [(n.name, n.op) for n in dump.nodes if n.name and not n.name.startswith(("node_", " ", "leaf_"))
            and "(" not in n.name]


def test_injection_writes_every_layers_k_and_v(tmp_path, models_dir):
    ours, ref = built("dflash-fa-off", tmp_path, models_dir)["00-inject.json"]
    assert named(ours) == named(ref)
    assert [x for x in named(ours) if "injected" in x[0]] == [
        ("Kcur_injected-0", "ROPE"), ("Vcur_injected-0", "RESHAPE"),
        ("Kcur_injected-1", "ROPE"), ("Vcur_injected-1", "RESHAPE")]
    assert sorted(n.src[2] for n in ours.nodes if n.op == "SET_ROWS") == \
        ["cache_k_l0", "cache_k_l1", "cache_v_l0 (reshaped)", "cache_v_l1 (reshaped)"]


def test_shared_kv_reads_v_as_the_normed_k(tmp_path, models_dir):
    ours, _ = built("dflash-sharedkv-fa-off", tmp_path, models_dir)["01-block.json"]
    v = next(n for n in ours.nodes if n.name == "Vcur-0")
    assert v.op == "RMS_NORM"
    assert not any(s.startswith("blk.0.attn_v") for n in ours.nodes for s in n.src)


def test_the_encoder_graph(tmp_path, models_dir):
    ours, ref = built("dflash-encoder", tmp_path, models_dir)["00-encoder.json"]
    assert [(n.name, n.op, n.src) for n in ours.nodes] == [
        ("fc_out", "MUL_MAT", ["fc.weight", "inp_embd"]), ("norm", "RMS_NORM", ["fc_out"]),
        ("enc_norm_out", "MUL", ["norm", "enc.output_norm.weight"])]
    assert structure(ours) == structure(ref)


def test_iswa_keys(tmp_path):
    src = make_model(tmp_path / "a.gguf", "dflash", n_layer=3, swa_window=4, swa_pattern=[True, False, True])["path"]
    hp = load(src).hparams
    assert hp.n_swa == 4 and hp.swa_layers == [True, False, True]
    assert load(make_model(tmp_path / "b.gguf", "dflash")["path"]).hparams.n_swa == 0
    window, pattern = dflash.kv("attention.sliding_window"), dflash.kv("attention.sliding_window_pattern")
    assert (window, pattern) == ("dflash.attention.sliding_window", "dflash.attention.sliding_window_pattern")
    for edit, match in (({"drop_keys": [pattern]}, f"missing key '{pattern}'"),
                        ({"drop_keys": [pattern], "set_keys": {pattern: (ARR, [True, False])}}, "has 2 entries for 3"),
                        ({"drop_keys": [pattern], "set_keys": {pattern: (ARR, [False, False, False])}},
                         "marks no layer as sliding-window")):
        with pytest.raises(GGUFModelError, match=match):
            load(rewrite(src, tmp_path / "bad.gguf", **edit))
    # no window: no pattern needed
    hp = load(rewrite(src, tmp_path / "c.gguf", drop_keys=[window, pattern], set_keys={window: (U32, 0)})).hparams
    assert hp.n_swa == 0 and not hp.use_iswa


def test_tensor_declarations():
    hp = HParams(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, n_vocab=256, n_embd_head_k=16,
                 n_embd_head_v=16)
    hp.target_layers = [1, 2]
    shapes, required = dflash.load_tensors_common(hp, TensorInfo(0, 200))
    assert shapes["fc.weight"] == (2 * 64, 64) and shapes["output.weight"] == (64, 200)
    assert shapes["token_embd.weight"] == (64, 256) and shapes["d2t"] == (200,)
    assert required == ["fc.weight", "enc.output_norm.weight", "output_norm.weight"]
    shapes, required = dflash.load_tensors_layers_base(hp, TensorInfo(0, 256))
    assert shapes["blk.1.attn_q.weight"] == (64, 64) and shapes["blk.1.attn_k.weight"] == (64, 32)
    assert shapes["blk.0.ffn_down.weight"] == (128, 64) and shapes["rope_freqs.weight"] == (8,)
    assert "blk.0.attn_v.weight" not in required and "blk.1.attn_k_norm.weight" in required
    # layer by layer, as the loader creates them
    names = list(shapes)
    assert names.index("blk.0.ffn_up.weight") < names.index("blk.1.attn_norm.weight")
