"""graphgen check's float64 arbiter: who is blamed when the authors' model and llama.cpp part.

The rules on hand-made distances (a side is blamed only when it is farther from exact than the
other's rounding explains; bands from depth and cache type, the coarser of the two caches setting
the unit; near ties in argmax excused only where the authors' f32 misses too), which need no
torch, then live checks (the graphgen[torch] extra): a deep draft where the authors' own f32
forward is the one that drifts, a sliding-window checkpoint that gets a verdict from its default
scenario, and output settings b11739 applies to DFlash2 as the authors do.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from authors_util import require_extra
from graphgen.authors.arbiter import GROWTH, RATIO, UNIT, Arbitration, Judged, floor_band, node_depth
from graphgen.authors.checkpoint import HFSpec, make_hf
from graphgen.cli.authors import _cache_of
from graphgen.play.scenario import parse_scenario


@pytest.fixture
def extra():
    require_extra()


def test_depth_of_a_node():
    assert node_depth("inp_g_embeddings", 3) == 0 and node_depth("inp_noise_embd", 3) == 0
    assert node_depth("Kcur_injected-0", 3) == 1 and node_depth("ffn_out-2", 3) == 3
    assert node_depth("result_output", 3) == 4 and node_depth("[drafted logits]", 3) == 4


def test_floor_grows_with_depth_and_the_cache_unit():
    assert floor_band("f32", 0) == 2.0 ** -24 * 64
    assert floor_band("f32", 3) == 4 * floor_band("f32", 0)
    assert floor_band("f16", 1) == 2.0 ** -11 * 64 * 2
    with pytest.raises(ValueError, match="q8_0 cache"):
        floor_band("q8_0", 1)


def _scenario(type_k, type_v):
    return parse_scenario({"type_k": type_k, "type_v": type_v, "flash_attn": "on",
                           "steps": [{"inject": {"n_tokens": 2}}]})


# the unit follows the coarser rounding of the two caches: f32's only when both hold f32
@pytest.mark.parametrize("type_k, type_v, unit", [("f32", "f32", "f32"), ("f32", "f16", "f16"),
                                                  ("f16", "f32", "f16"), ("f16", "f16", "f16")])
def test_the_coarser_cache_sets_the_unit(type_k, type_v, unit):
    assert _cache_of(_scenario(type_k, type_v)) == unit
    # an f16 unit is 2^13 times the f32 one: a mixed cache judged with f32's would blame f16 rounding
    assert floor_band(_cache_of(_scenario(type_k, type_v)), 1) == {"f32": 2.0 ** -24, "f16": 2.0 ** -11}[unit] * 64 * 2


@pytest.mark.parametrize("type_k, type_v", [("q8_0", "f16"), ("f32", "q8_0"), ("q4_0", "q4_0")])
def test_a_quantized_cache_is_not_arbitrated(type_k, type_v):
    with pytest.raises(ValueError, match="q[48]_0.*arbitrates f32 and f16 caches"):
        _cache_of(_scenario(type_k, type_v))


def judged(e_a, e_l, depth=1, cache="f32"):
    return Judged("01-block.json", f"ffn_out-{depth - 1}", depth, floor_band(cache, depth), e_a, e_l, e_l)


def test_llama_is_blamed_only_beyond_the_authors_own_rounding():
    floor = floor_band("f32", 1)
    # the authors' f32 is close to exact: llama.cpp gets the floor
    assert not judged(1e-7, floor * 0.99).llama_departs
    assert judged(1e-7, floor * 1.01).llama_departs
    # an ill-conditioned node: the authors' own f32 lands 1e-4 away, llama.cpp may land RATIO times farther
    assert judged(1e-4, RATIO * 1e-4 * 0.99).band == RATIO * 1e-4
    assert not judged(1e-4, RATIO * 1e-4 * 0.99).llama_departs
    assert judged(1e-4, RATIO * 1e-4 * 1.01).llama_departs
    # a node llama.cpp did not compute is a departure, never a pass
    assert judged(1e-7, None).llama_departs


def test_the_authors_drift_is_named_and_not_blamed_on_llama():
    j = judged(7.3e-5, 2.1e-5, depth=4)
    assert not j.llama_departs and not j.authors_drift   # 7.3e-5 < 4 x 2.1e-5
    j = judged(7.3e-4, 2.1e-5, depth=4)
    assert not j.llama_departs and j.authors_drift
    arb = Arbitration("f32", [j])
    assert arb.agree and arb.drifts == [j]
    assert any("the authors' f32 forward drifts" in line for line in arb.lines())


def test_argmax_near_ties_are_excused_only_where_the_authors_miss_too():
    arb = Arbitration("f32", [judged(1e-7, 1e-7)])
    # 8 rows: llama.cpp misses 2 of the arbiter's picks; the authors' f32 misses one of those two
    arb.argmax.append(("01-block.json", 8, 6, 1))
    assert not arb.agree and arb.choices_depart() == ["argmax 6/8 in 01-block.json (1 not explained by a near tie)"]
    arb.argmax[0] = ("01-block.json", 8, 6, 2)
    assert arb.agree


def test_nothing_compared_is_no_agreement():
    assert not Arbitration("f32").agree
    arb = Arbitration("f32", [judged(1e-7, 1e-7)], unmatched=["kqv_out-0 in 01-block.json: not found"])
    assert not arb.agree


def test_bands_are_said_in_the_report():
    text = "\n".join(Arbitration("f16", [judged(1e-7, 1e-7, cache="f16")]).lines())
    assert f"max({UNIT['f16']:.3g} x {GROWTH:g} x (1 + depth), {RATIO:g} x the authors' f32 distance), f16 cache" in text


# ---- live -------------------------------------------------------------------------------------

def _check(hf, capsys, *extra):
    from graphgen.cli import main
    code = main(["--quiet", "check", str(hf), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.usefixtures("extra")
def test_sliding_window_checkpoint_gets_a_verdict(tmp_path, capsys):
    """The default scenario's second round needs a crop the authors' sliding cache cannot make:
    check runs the first round in all three engines, says so, and reports the known departure."""
    hf = make_hf(tmp_path / "swa", HFSpec(variant="dflash", authors="zlab", swa_window=3, swa_pattern=[1, 0]))
    code, doc = _check(hf, capsys)
    assert code == 1 and doc["verdict"].startswith("DISAGREE: llama.cpp b11739")
    assert "cut before step 2 (seq_rm)" in doc["scenario_cut"] and "cannot crop" in doc["scenario_cut"]
    assert doc["graphgen_identical_to_llama.cpp"]
    first = doc["arbiter"]["first_departure"]
    assert first["name"] == "kqv_out-0" and first["llama.cpp"] > 0.1 and first["authors_f32"] < 1e-5
    # a window wider than the context: the same cut, and agreement
    hf = make_hf(tmp_path / "swa-wide", HFSpec(variant="dflash2", authors="speculators", swa_window=64,
                                               swa_pattern=[1, 0]))
    code, doc = _check(hf, capsys)
    assert code == 0 and doc["scenario_cut"] and doc["arbiter"]["agree"], doc["verdict"]


@pytest.mark.usefixtures("extra")
def test_dflash2_output_settings_agree(tmp_path, capsys):
    """z-lab's compute_logits scales and soft-caps the logits the selector reads; b11739 does the
    same for DFlash2, and scales the block's embeddings for every head."""
    spec = HFSpec(variant="dflash2", authors="zlab", output_multiplier=1.7, final_logit_softcapping=3.0,
                  input_embedding_scale=1.3, seed=5)
    code, doc = _check(make_hf(tmp_path / "out", spec), capsys)
    assert code == 0 and doc["arbiter"]["agree"], doc["verdict"]
    # the settings reached the logits: the authors' result_output is capped at 3
    nodes = {n["name"] for n in doc["arbiter"]["nodes"]}
    assert "result_output" in nodes and "inp_noise_embd" in nodes


@pytest.mark.usefixtures("extra")
def test_deep_draft_where_the_authors_f32_is_farther(tmp_path, capsys):
    """A four-layer DFlash2 with wide activations: both f32 forwards land well away from exact;
    the verdict follows the distances to the arbiter, not a fixed band between the two."""
    spec = HFSpec(variant="dflash2", authors="zlab", n_layer=4, n_embd=128, n_head=8, n_head_kv=2, head_dim=24,
                  n_ff=256, block_size=16, codebook_std=4.0, seed=11)
    code, doc = _check(make_hf(tmp_path / "deep", spec), capsys)
    arb = doc["arbiter"]
    assert code == 0 and arb["agree"], doc["verdict"]
    # the blocks ran at the trained size: 16 rows of logits per block graph
    assert doc["block_size"] == 16 and [a["rows"] for a in arb["argmax"]] == [16, 16]
    worst_l = max(n["llama.cpp"] for n in arb["nodes"])
    worst_a = max(n["authors_f32"] for n in arb["nodes"])
    assert 0 < worst_l < worst_a
    assert all(n["llama.cpp"] <= n["band"] for n in arb["nodes"])
    assert np.isfinite([n["band"] for n in arb["nodes"]]).all()
