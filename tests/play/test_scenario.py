"""graphgen.play.scenario: scenario documents parsed and checked (each error naming the step and
field), their defaults, their round trip through to_dict, the features each step draws, and where
a scenario is read from (a file, or the one a dump recorded)."""

import json

import numpy as np
import pytest
from conftest import REF_DIR

from graphgen.play.scenario import (
    ScenarioError,
    default_scenario,
    load_scenario,
    parse_scenario,
    read_scenario_doc,
    resolve_fa,
)

STEPS = [{"inject": {"n_tokens": 6}}, {"block": {"tokens": [7, 255, 255, 255], "pos0": 6}}]


def test_defaults_and_steps():
    sc = parse_scenario({"steps": STEPS})
    assert (sc.n_ctx, sc.n_ubatch, sc.flash_attn, sc.type_k, sc.type_v, sc.seed, sc.n_seq, sc.n_threads,
            sc.n_batch) == (256, 64, False, "f16", "f16", 1, 1, 1, None)
    inj, blk = sc.steps
    assert (inj.kind, inj.index, inj.n_tokens, inj.pos0, inj.seq, inj.graph) == ("inject", 0, 6, 0, 0, "inject")
    assert blk.kind == "block" and [(b.seq, b.tokens, b.pos0, b.embd_state) for b in blk.blocks] == \
        [(0, [7, 255, 255, 255], 6, "context")]


def test_several_sequences_encode_and_seq_rm():
    sc = parse_scenario({"n_seq": 2, "steps": [
        {"encode": {"n_tokens": 3, "seq": 1}}, {"seq_rm": {"seq": -1, "p0": 2}},
        {"block": {"seqs": [{"seq": 0, "tokens": [1], "pos0": 0}, {"seq": 1, "tokens": [2, 3], "pos0": 4,
                                                                   "embd_state": "random"}]}}]})
    enc, rm, blk = sc.steps
    assert (enc.kind, enc.graph, enc.seq) == ("encoder", "encoder", 1)
    assert (rm.kind, rm.seq, rm.pos0, rm.p1) == ("seq_rm", -1, 2, -1)
    assert [(b.seq, b.embd_state) for b in blk.blocks] == [(0, "context"), (1, "random")]


@pytest.mark.parametrize("fa, on, auto", [("off", False, False), ("on", True, False), ("auto", True, True),
                                          (True, True, False), (False, False, False)])
def test_flash_attn(fa, on, auto):
    sc = parse_scenario({"flash_attn": fa, "steps": STEPS})
    assert (sc.flash_attn, sc.flash_attn_auto) == (on, auto)


def test_cache_types_and_the_batch():
    sc = parse_scenario({"type_kv": "q8_0", "type_v": "f16", "steps": STEPS})
    assert (sc.type_k, sc.type_v, sc.type_kv) == ("q8_0", "f16", "q8_0/f16")
    assert parse_scenario({"type_kv": "f32", "steps": STEPS}).type_kv == "f32"
    # llama.cpp caps the micro-batch at the logical batch
    assert parse_scenario({"n_ubatch": 64, "n_batch": 8, "steps": [{"inject": {"n_tokens": 6}}]}).n_ubatch == 8
    assert parse_scenario({"n_ubatch": 4, "n_batch": 8, "steps": [{"inject": {"n_tokens": 4}}]}).n_ubatch == 4


@pytest.mark.parametrize("doc, fragment", [
    ([], "s.json: expected a JSON object"),
    ({"steps": STEPS, "ctx": 1}, "unknown field 'ctx'"),
    ({"steps": []}, "'steps' must be a non-empty list"),
    ({"n_ctx": 0, "steps": STEPS}, "'n_ctx' = 0 is below 1"),
    ({"n_ctx": True, "steps": STEPS}, "'n_ctx' must be an integer, got True"),
    ({"n_ubatch": 9000, "steps": STEPS}, "'n_ubatch' = 9000 is above 8192"),
    ({"flash_attn": "yes", "steps": STEPS}, "'flash_attn' must be 'on', 'off' or 'auto'"),
    ({"type_kv": "q3", "steps": STEPS}, "'type_kv' must be one of"),
    ({"type_v": "q8_0", "steps": STEPS}, "'type_v' q8_0 is quantized, which needs 'flash_attn' on"),
    ({"target": "", "steps": STEPS}, "'target' must be a file path"),
    ({"steps": [{"inject": {"n_tokens": 6}, "block": {}}]}, "step 0: expected an object with one key"),
    ({"steps": [{"inject": 6}]}, "step 0: 'inject' must be an object"),
    ({"steps": [{"inject": {"n_tokens": 6, "pos": 0}}]}, "step 0 inject: unknown field 'pos'"),
    ({"steps": [{"inject": {"pos0": 0}}]}, "step 0 inject: missing 'n_tokens'"),
    ({"n_ubatch": 4, "steps": [{"inject": {"n_tokens": 6}}]}, "n_tokens 6 is longer than n_ubatch 4"),
    ({"steps": [{"inject": {"n_tokens": 1, "seq": 1}}]}, "'seq' = 1 is above 0"),
    ({"steps": [{"block": {"tokens": [], "pos0": 0}}]}, "'tokens' must be a non-empty list of token ids >= 0"),
    ({"steps": [{"block": {"tokens": [-1], "pos0": 0}}]}, "'tokens' must be a non-empty list"),
    ({"steps": [{"block": {"tokens": [1]}}]}, "step 0 block seq entry 0: missing 'pos0'"),
    ({"steps": [{"block": {"tokens": [1], "pos0": 0, "embd_state": "zero"}}]}, "'embd_state' must be 'context'"),
    ({"n_seq": 2, "steps": [{"block": {"seqs": [{"tokens": [1], "pos0": 0}, {"tokens": [2], "pos0": 0}]}}]},
     "a sequence appears twice"),
    ({"n_ubatch": 2, "steps": [{"block": {"tokens": [1, 2, 3], "pos0": 0}}]}, "3 tokens are longer than n_ubatch 2"),
    ({"steps": [{"decode": {}}]}, "step 0: unknown step 'decode'"),
])
def test_refusals_name_the_step_and_field(doc, fragment):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(doc, "s.json")
    assert str(e.value).startswith("s.json") and fragment in str(e.value), str(e.value)


def test_to_dict_round_trips():
    doc = {"n_ctx": 512, "n_batch": 32, "n_ubatch": 16, "flash_attn": "auto", "type_k": "q8_0", "type_v": "f16",
           "seed": 3, "n_seq": 2, "n_threads": 2, "steps": [
               {"inject": {"n_tokens": 6, "pos0": 0, "seq": 1}}, {"encode": {"n_tokens": 2, "pos0": 0, "seq": 0}},
               {"seq_rm": {"seq": 0, "p0": 1, "p1": -1}},
               {"block": {"seqs": [{"seq": 0, "tokens": [7, 9], "pos0": 6, "embd_state": "random"}]}}]}
    out = parse_scenario(doc).to_dict()
    assert out == doc
    assert parse_scenario(out).to_dict() == out
    # defaults spelled out
    assert parse_scenario({"steps": STEPS}).to_dict()["steps"][1] == \
        {"block": {"seqs": [{"seq": 0, "tokens": [7, 255, 255, 255], "pos0": 6, "embd_state": "context"}]}}


def test_features_are_drawn_per_step_from_the_seed():
    sc = parse_scenario({"seed": 5, "steps": [{"inject": {"n_tokens": 3}}, {"inject": {"n_tokens": 2, "pos0": 3}}]})
    a, b = (sc.features(s, 8) for s in sc.steps)
    np.testing.assert_array_equal(a, np.random.default_rng(5).standard_normal((3, 8), dtype=np.float32))
    np.testing.assert_array_equal(b, np.random.default_rng(6).standard_normal((2, 8), dtype=np.float32))
    assert a.dtype == np.float32


def test_recorded_features(tmp_path):
    np.savez(tmp_path / "f.npz", step0=np.ones((3, 4), np.float32), step1=np.ones((2, 4), np.float64))
    (tmp_path / "s.json").write_text(json.dumps({"features": "f.npz", "steps": [
        {"inject": {"n_tokens": 3}}, {"inject": {"n_tokens": 2}}, {"inject": {"n_tokens": 1}}]}))
    sc = load_scenario(tmp_path / "s.json")
    assert sc.features_path == str(tmp_path / "f.npz")
    assert sc.features(sc.steps[0], 4).sum() == 12
    with pytest.raises(ScenarioError, match=r"array 'step1' is float64 \[2, 4\]; step 1 takes float32 \[2, 4\]"):
        sc.features(sc.steps[1], 4)
    with pytest.raises(ScenarioError, match=r"no features for step 2 \(array 'step2'\)"):
        sc.features(sc.steps[2], 4)
    # kept in the dump folder under its own name, the document naming the copy
    (tmp_path / "out").mkdir()
    sc.keep_in(tmp_path / "out")
    assert (tmp_path / "out" / "f.npz").is_file() and sc.to_dict()["features"] == "f.npz"
    assert sc.features_path == str(tmp_path / "out" / "f.npz")


def test_reading_scenarios(tmp_path):
    case = REF_DIR / "dflash-fa-off"
    sc = load_scenario(case / "scenario.json")
    assert [s.kind for s in sc.steps] == ["inject", "block"]
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenario(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_scenario(tmp_path / "bad.json")
    # a dump recording no scenario is refused naming it
    with pytest.raises(ScenarioError, match="records no scenario"):
        read_scenario_doc(case)


def test_default_scenario_and_resolve_fa():
    sc = default_scenario(block_size=3, mask_token=99, n_prompt=5, flash_attn=True, type_kv="q8_0", type_v="f16")
    assert sc.to_dict()["steps"] == [{"inject": {"n_tokens": 5, "pos0": 0, "seq": 0}},
                                     {"block": {"seqs": [{"seq": 0, "tokens": [7, 99, 99], "pos0": 5,
                                                          "embd_state": "context"}]}}]
    assert (sc.flash_attn, sc.type_k, sc.type_v) == (True, "q8_0", "f16")
    assert (resolve_fa(None), resolve_fa("off"), resolve_fa("on"), resolve_fa("auto")) == (None, False, True, True)
