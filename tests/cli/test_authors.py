"""graphgen/cli/authors.py: the authors' side of the command line. `make-model --format hf`'s flags as
the authors' config fields (and the GGUF-only ones refused), `graphgen check`'s default scenario, cache
unit, value budget, verdict and target check, and the converter's stamp on the dumps. The authors'
models themselves (graphgen[torch]): tests/authors/."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import graphgen.authors.checkpoint as CK
from conftest import REF_DIR
from graphgen.authors import AuthorsError
from graphgen.authors.forward import default_check_scenario
from graphgen.cli.authors import (_cache_of, _checked_target, _max_data, stamp_converter,
                                  verdict)
from graphgen.play.scenario import parse_scenario


@pytest.fixture
def spec_of(monkeypatch, cli, tmp_path):
    """The HFSpec a make-model --format hf command line makes (the checkpoint is not written)."""
    seen = []
    monkeypatch.setattr(CK, "make_hf", lambda out, spec, force=False: seen.append((spec, force)) or Path(out))

    def run(*flags):
        r = cli("make-model", tmp_path / "ck", "--format", "hf", *flags)
        assert r.code == 0, r.err
        return seen[-1][0], r
    return run


def test_the_size_flags_become_the_authors_fields(spec_of, tmp_path):
    spec, r = spec_of("--n-embd", 128, "--layers", 3, "--heads", 8, "--vocab", 512, "--block-size", 6,
                      "--target-layers", "1,4", "--seed", 3)
    assert (spec.n_embd, spec.n_layer, spec.n_head, spec.n_vocab, spec.block_size, spec.seed) == (
        128, 3, 8, 512, 6, 3)
    assert spec.target_layers == [1, 4]
    # heads given alone: as many K/V heads, each of the width's share
    assert (spec.n_head_kv, spec.head_dim) == (8, 16)
    assert r.out == (f"wrote {tmp_path / 'ck'}: z-lab DFlash (DFlashDraftModel), target in "
                     f"{tmp_path / 'ck' / 'target'}\n")
    spec, _ = spec_of("--heads", 8, "--heads-kv", 2, "--head-dim", 32)
    assert (spec.n_head, spec.n_head_kv, spec.head_dim) == (8, 2, 32)


def test_a_dspark_carries_a_reduced_vocabulary_unless_given(spec_of):
    spec, r = spec_of("--variant", "dspark", "--vocab", 400)
    assert spec.d2t_vocab == 300 and "speculators DSpark" in r.out
    assert spec_of("--variant", "dspark", "--vocab", 400, "--d2t-vocab", 400)[0].d2t_vocab == 400
    assert spec_of("--variant", "dflash2")[0].d2t_vocab is None


def test_rope_output_and_head_settings(spec_of):
    spec, _ = spec_of("--rope-scaling", "yarn", "--yarn-beta-fast", 16, "--yarn-attn-factor", 1.5)
    assert spec.rope_scaling == {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024,
                                 "beta_fast": 16.0, "attention_factor": 1.5}
    spec, _ = spec_of("--rope-scaling", "linear", "--rope-scaling-factor", 4)
    assert spec.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert spec_of("--rope-scaling", "none")[0].rope_scaling is None
    spec, _ = spec_of("--logit-scale", 0.5, "--final-softcap", 30, "--embedding-scale", 2, "--variant", "dspark",
                      "--conf", "--conf-markov", "false", "--attention-bias", "--hidden-act", "gelu",
                      "--sample-from-anchor", "false", "--causal", "--swa-window", 4, "--swa-pattern", "1,0")
    assert (spec.output_multiplier, spec.final_logit_softcapping, spec.input_embedding_scale) == (0.5, 30.0, 2.0)
    assert (spec.conf_with_markov, spec.attention_bias, spec.hidden_act, spec.sample_from_anchor, spec.causal) == (
        False, True, "gelu", False, True)
    assert (spec.swa_window, spec.swa_pattern) == (4, [1, 0])


@pytest.mark.parametrize("flags, words", [
    (["--wtype", "q8_0"], "--wtype has no counterpart in the authors' checkpoint formats"),
    (["--backbone", "dsv4"], "--backbone has no counterpart"),
    (["--sinks"], "--sinks has no counterpart"),
    (["--lilicorr-conv"], "--lilicorr-conv has no counterpart"),
    (["--variant", "lilicorr"], "--variant lilicorr: the authors' packages have dflash, dflash2, dspark"),
    (["--rope-scaling", "longrope"], "--rope-scaling longrope: its factors are no field of the authors' configs"),
    (["--yarn-beta-slow", "2"], "--yarn-beta-fast / --yarn-beta-slow / --yarn-attn-factor need --rope-scaling yarn"),
])
def test_gguf_only_settings_are_refused(flags, words, cli, monkeypatch, tmp_path):
    monkeypatch.setattr(CK, "make_hf", lambda *a, **kw: pytest.fail("written"))
    r = cli("make-model", tmp_path / "ck", "--format", "hf", *flags)
    assert r.code == 2 and words in r.err and r.err.count("\n") == 1


def test_the_default_gguf_settings_are_not_taken_for_given_ones(spec_of):
    assert spec_of("--backbone", "base", "--wtype", "f32")[0].variant == "dflash"


def test_default_check_scenario_is_two_rounds():
    doc = default_check_scenario(block_size=4, mask_token_id=9)
    assert doc == {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "off", "type_kv": "f32", "seed": 1, "steps": [
        {"inject": {"n_tokens": 5, "pos0": 0}}, {"block": {"tokens": [7, 9, 9, 9], "pos0": 5}},
        {"seq_rm": {"seq": 0, "p0": 5, "p1": -1}}, {"inject": {"n_tokens": 3, "pos0": 5}},
        {"block": {"tokens": [11, 9, 9, 9], "pos0": 8}}]}
    big = default_check_scenario(block_size=200, mask_token_id=1, f16=True)
    assert (big["n_ctx"], big["n_ubatch"], big["type_kv"]) == (416, 200, "f16")
    parse_scenario(big)  # a scenario graphgen runs


@pytest.mark.parametrize("k, v, unit", [("f32", "f32", "f32"), ("f16", "f32", "f16"), ("f16", "f16", "f16")])
def test_the_cache_unit_of_the_arbiter(k, v, unit):
    assert _cache_of(SimpleNamespace(type_k=k, type_v=v)) == unit


def test_a_quantized_cache_is_no_unit():
    with pytest.raises(ValueError, match="the scenario caches f16/q8_0: graphgen check arbitrates f32 and f16"):
        _cache_of(SimpleNamespace(type_k="q8_0", type_v="f16"))


def test_the_dumps_keep_a_blocks_logits():
    sc = parse_scenario(default_check_scenario(block_size=16, mask_token_id=1))
    assert _max_data(sc, 256) == 262144
    assert _max_data(sc, 49152) == 16 * 49152
    two = parse_scenario({"n_seq": 2, "steps": [{"block": {"seqs": [{"seq": 0, "pos0": 0, "tokens": [1] * 16},
                                                                   {"seq": 1, "pos0": 0, "tokens": [1] * 16}]}}]})
    assert _max_data(two, 49152) == 32 * 49152


def _arbiter(compared=True, agree=False, first=None, departs=(), unmatched=()):
    return SimpleNamespace(compared=compared, agree=agree, first_departure=first,
                           choices_depart=lambda: list(departs), unmatched=list(unmatched))


def test_the_verdicts():
    assert verdict({"arbiter": _arbiter(compared=False), "graphgen_identical": True}) == (
        1, "NOT COMPARED: no mapped node had values on every side")
    code, line = verdict({"arbiter": _arbiter(agree=True), "graphgen_identical": False})
    assert code == 1 and line.startswith("graphgen's graph departs from llama.cpp's") and "graphgen is wrong" in line
    code, line = verdict({"arbiter": _arbiter(agree=True), "graphgen_identical": True})
    assert code == 0 and line.startswith("AGREE: the authors' model, llama.cpp b11739 and graphgen")
    bad = SimpleNamespace(name="ffn_out-1", graph="block 1", e_llama=3e-3, band=1e-4, e_authors=2e-7)
    code, line = verdict({"arbiter": _arbiter(first=bad), "graphgen_identical": True})
    assert code == 1 and line.startswith("DISAGREE: ") and line.endswith(
        "first at ffn_out-1 in block 1: 0.003 from exact, band 0.0001 (the authors' f32: 2e-07)")
    bad.e_llama = None
    assert verdict({"arbiter": _arbiter(first=bad), "graphgen_identical": True})[1].endswith(
        "first at ffn_out-1 in block 1: not compared")
    code, line = verdict({"arbiter": _arbiter(departs=["argmax at 3"], unmatched=["no node x"]),
                          "graphgen_identical": True})
    assert code == 1 and line.endswith("; argmax at 3; no node x")


def test_the_target_of_check_is_a_target_gguf(tiny, tmp_path):
    with pytest.raises(AuthorsError, match="-m .*none.gguf: no such target GGUF file"):
        _checked_target(tmp_path / "none.gguf")
    with pytest.raises(AuthorsError, match="is a folder, not a target GGUF file"):
        _checked_target(tmp_path)
    with pytest.raises(AuthorsError, match="is a DFlash draft .*not a target model"):
        _checked_target(tiny)


def test_the_converter_is_stamped_on_every_dump(tmp_path):
    shutil.copytree(REF_DIR / "dflash-fa-off", tmp_path / "a")
    info = {"commit": "abc", "from": "ck/"}
    stamp_converter([tmp_path / "a"], info)
    for name in ("00-inject.json", "01-block.json"):
        doc = json.loads((tmp_path / "a" / name).read_text())
        before = json.loads((REF_DIR / "dflash-fa-off" / name).read_text())
        assert doc["source"] == dict(before["source"], converter=info)
        assert doc["nodes"] == before["nodes"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(
        p.name for p in (REF_DIR / "dflash-fa-off").iterdir())  # nothing half-written left


@pytest.mark.torch
def test_check_names_a_missing_checkpoint(cli, tmp_path):
    from authors_util import require_extra
    require_extra()  # without it, check refuses first for the missing extra (test_extras.py)
    r = cli("check", tmp_path / "none")
    assert r.code == 2 and r.err == f"graphgen: error: {tmp_path / 'none'}: no such file or folder\n"
