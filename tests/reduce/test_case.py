"""The reducer's cases (graphgen.reduce.case): each edit gives a smaller case of the same kind,
and a scenario the edits change still runs (parse_scenario reads it)."""

import json

import pytest

from graphgen.play.scenario import parse_scenario
from graphgen.reduce.case import Case, _down, load_case
from reduce.cases import THREE_SEQUENCES

SCENARIO = THREE_SEQUENCES
CONFIG = {"variant": "dflash", "n_layer": 4, "n_head": 4, "n_embd": 64, "seed": 0, "sinks": True}


def case():
    return Case(json.loads(json.dumps(SCENARIO)), dict(CONFIG))


def edit(c, prefix):
    what, make = next((w, m) for w, m in c.edits() if w.startswith(prefix))
    return what, make()


def test_down_tries_the_floor_then_halves_then_one_less():
    assert _down(16, 1) == [1, 8, 15]
    assert _down(2, 1) == [1]
    assert _down(1, 1) == []
    assert _down(9, 8) == [8]


def test_sizes_fill_in_make_models_defaults():
    s = case().sizes()
    assert (s["n_layer"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"], s["n_vocab"]) == (4, 4, 4, 16, 128, 256)
    assert (s["steps"], s["sequences"], s["tokens"], s["options"]) == (4, 3, 6 + 5 + 7 + 12, ["sinks"])


def test_the_first_edit_cuts_layers_to_one():
    what, c = edit(case(), "n_layer")
    assert what == "n_layer 4 -> 1" and c.config["n_layer"] == 1
    assert case().config["n_layer"] == 4  # the case edited is left as it was


def test_one_sequence_keeps_sequence_zero_and_runs():
    _, c = edit(case(), "one sequence")
    assert c.scenario["n_seq"] == 1
    assert [next(iter(s)) for s in c.scenario["steps"]] == ["inject", "block"]
    assert c.scenario["steps"][1]["block"]["seqs"] == [{"seq": 0, "tokens": [7, 255, 255, 255], "pos0": 6}]
    parse_scenario(c.scenario)


def test_a_sequence_is_dropped_from_every_step():
    _, c = edit(case(), "drop sequence 1")
    seqs = [s.get("inject", {}).get("seq") for s in c.scenario["steps"] if "inject" in s]
    assert seqs == [0, 2]
    assert [b["seq"] for b in c.scenario["steps"][-1]["block"]["seqs"]] == [0, 2]
    parse_scenario(c.scenario)
    assert [w for w, _ in case().edits() if w.startswith("drop sequence")] == \
        ["drop sequence 2", "drop sequence 1", "drop sequence 0"]


def test_a_smaller_vocabulary_moves_the_mask_token():
    _, c = edit(case(), "n_vocab 256 -> 8")
    toks = [b["tokens"] for s in c.scenario["steps"] if "block" in s for b in s["block"]["seqs"]]
    assert toks == [[7, 7, 7, 7], [7, 7, 7, 7], [7, 7, 7, 7]]  # 7 is the new last id: the mask
    _, c = edit(case(), "n_vocab 256 -> 128")
    assert [b["tokens"] for b in c.scenario["steps"][3]["block"]["seqs"]][0] == [7, 127, 127, 127]


def test_fewer_heads_keep_the_head_size():
    _, c = edit(case(), "n_head 4 -> 1")
    assert (c.config["n_head"], c.config["n_head_kv"], c.config["head_dim"]) == (1, 1, 16)


def test_a_smaller_block_cuts_every_sequences_rows():
    _, c = edit(case(), "block size 4 -> 2")
    assert c.config["block_size"] == 2
    assert all(len(b["tokens"]) == 2 for b in c.scenario["steps"][3]["block"]["seqs"])
    parse_scenario(c.scenario)


def test_fewer_inject_rows_move_the_sequences_later_steps_down():
    _, c = edit(case(), "step 0 inject tokens 6 -> 1")
    assert c.scenario["steps"][0]["inject"]["n_tokens"] == 1
    seqs = c.scenario["steps"][3]["block"]["seqs"]
    assert [b["pos0"] for b in seqs] == [1, 5, 7]  # sequence 0 only
    parse_scenario(c.scenario)


def test_an_option_is_turned_off_by_dropping_it():
    _, c = edit(case(), "option sinks off")
    assert "sinks" not in c.config and c.config["variant"] == "dflash"


def test_a_gguf_case_edits_only_the_scenario(tmp_path):
    g = tmp_path / "d.gguf"
    g.write_bytes(b"x")
    c = Case(json.loads(json.dumps(SCENARIO)), draft=g)
    whats = [w for w, _ in c.edits()]
    assert whats and not any(w.startswith(("n_layer", "n_vocab", "n_head", "option")) for w in whats)
    assert "one sequence" in whats


def test_load_case_reads_a_case_json(tmp_path):
    f = tmp_path / "case.json"
    f.write_text(json.dumps({"make_model": CONFIG, "scenario": SCENARIO}))
    c = load_case(f)
    assert c.config == CONFIG and c.scenario == SCENARIO
    with pytest.raises(ValueError, match="needs a scenario"):
        (tmp_path / "s.json").write_text(json.dumps(CONFIG))
        load_case(tmp_path / "s.json")
    with pytest.raises(ValueError, match="either settings or a draft kept whole"):
        Case(SCENARIO)


# ---- an authors' checkpoint, as make_hf's settings -------------------------------------------------

HF = {"variant": "dspark", "n_layer": 3, "swa_window": 4, "swa_pattern": [1, 0, 1], "d2t_vocab": 200,
      "mask_token_id": 255, "conf": False, "seed": 2}


def hf_case(**kw):
    return Case(json.loads(json.dumps(SCENARIO)), dict(HF, **kw), format="hf")


def test_an_hf_case_fills_in_hfspecs_defaults_not_make_models():
    s = hf_case().sizes()
    # HFSpec's: 2 KV heads, head size 16 whatever the width, block size 8, two target layers
    assert (s["n_layer"], s["n_head"], s["n_head_kv"], s["head_dim"], s["block_size"], s["target_layers"]) == \
        (3, 4, 2, 16, 8, 2)
    assert "wtype" not in s and s["options"] == ["conf", "d2t_vocab", "swa_pattern", "swa_window"]
    assert hf_case().draft_name == "checkpoint" and case().draft_name == "draft.gguf"


def test_an_hf_cases_edits_keep_its_settings_consistent():
    what, c = edit(hf_case(), "n_layer")
    assert what == "n_layer 3 -> 1" and c.config["n_layer"] == 1 and c.config["swa_pattern"] == [1]
    assert c.format == "hf"
    # a smaller vocabulary moves the mask token and the draft vocabulary inside it
    what, c = edit(hf_case(), "n_vocab")
    assert what == "n_vocab 256 -> 8" and (c.config["mask_token_id"], c.config["d2t_vocab"]) == (7, 6)
    assert {t for st in c.scenario["steps"] if "block" in st for b in st["block"]["seqs"] for t in b["tokens"]} <= \
        set(range(8))
    what, c = edit(hf_case(), "option conf")
    assert what == "option conf to its default" and "conf" not in c.config
    assert not any(w.startswith("weights") for w, _ in hf_case(wtype="q8_0").edits())


def test_load_case_reads_hf_settings_and_names_an_unknown_field(tmp_path):
    f = tmp_path / "hf.json"
    f.write_text(json.dumps({"make_hf": HF}))
    c = load_case(f, format="hf")
    assert c.format == "hf" and c.config == HF
    # no scenario: graphgen check's default one, at the settings' block size and mask token
    blocks = [st["block"] for st in c.scenario["steps"] if "block" in st]
    assert len(blocks) == 2 and blocks[0]["tokens"] == [7] + [255] * 7
    parse_scenario(c.scenario)
    f.write_text(json.dumps(dict(HF, n_layers=2)))
    with pytest.raises(ValueError, match="n_layers: no field of make_hf's settings"):
        load_case(f, format="hf")
    with pytest.raises(ValueError, match="format is one of gguf, hf"):
        Case(SCENARIO, HF, format="safetensors")
