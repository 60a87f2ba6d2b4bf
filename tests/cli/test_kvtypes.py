"""graphgen/cli/kvtypes.py: -ctk / -ctv / --type-kv laid over a command's cache types, with
llama.cpp's rule that a quantized V cache needs flash attention checked before anything loads."""

import argparse
from types import SimpleNamespace

import pytest

from graphgen.cli.kvtypes import FA_FLAG, add_kv_type_flags, apply_to_scenario, kv_types


def _parse(*argv, default=None, fa_hint=FA_FLAG):
    p = argparse.ArgumentParser(exit_on_error=False)
    add_kv_type_flags(p, default, fa_hint)
    return p, p.parse_args(list(argv))


def test_the_spellings_of_each_flag_set_one_destination():
    for k, v in (("-ctk", "-ctv"), ("--cache-type-k", "--cache-type-v"), ("--type-k", "--type-v")):
        _, a = _parse(k, "q8_0", v, "q4_0")
        assert (a.type_k, a.type_v, a.type_kv) == ("q8_0", "q4_0", None)


def test_unset_flags_leave_the_given_types():
    _, a = _parse()
    assert kv_types(a, "f32", "f16", flash_attn=False) == ("f32", "f16")


def test_type_kv_sets_both_and_type_k_or_v_win_over_it():
    _, a = _parse("--type-kv", "q8_0")
    assert kv_types(a, "f16", "f16", flash_attn=True) == ("q8_0", "q8_0")
    _, a = _parse("--type-kv", "q8_0", "-ctk", "f32")
    assert kv_types(a, "f16", "f16", flash_attn=True) == ("f32", "q8_0")
    _, a = _parse("--type-kv", "f32", "-ctv", "q4_1")
    assert kv_types(a, "f16", "f16", flash_attn=True) == ("f32", "q4_1")


def test_the_default_stands_for_type_kv():
    p, a = _parse(default="f16")
    assert a.type_kv == "f16" and kv_types(a, "f32", "f32", flash_attn=False) == ("f16", "f16")
    assert "(default f16)" in p.format_help()
    p, _ = _parse()
    assert "(default: the scenario's)" in p.format_help()


def test_a_type_the_caches_do_not_take_is_a_usage_error():
    p = argparse.ArgumentParser(exit_on_error=False)
    add_kv_type_flags(p)
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'q3_k'"):
        p.parse_args(["-ctk", "q3_k"])


@pytest.mark.parametrize("v", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
def test_a_quantized_v_needs_flash_attention_naming_how_to_turn_it_on(v):
    _, a = _parse("-ctv", v)
    with pytest.raises(ValueError, match=rf"--type-v {v}: a quantized V cache requires flash attention \(-fa on\)"):
        kv_types(a, "f16", "f16", flash_attn=False)
    assert kv_types(a, "f16", "f16", flash_attn=True) == ("f16", v)
    _, a = _parse()
    with pytest.raises(ValueError, match=r"flash attention \(MY HINT\)"):
        kv_types(a, "f16", v, flash_attn=False, fa_hint="MY HINT")


def test_a_quantized_k_alone_needs_no_flash_attention():
    _, a = _parse("-ctk", "q8_0")
    assert kv_types(a, "f16", "f16", flash_attn=False) == ("q8_0", "f16")


def test_apply_to_scenario_says_whether_the_flags_changed_it():
    sc = SimpleNamespace(type_k="f16", type_v="f16", flash_attn=False)
    _, a = _parse()
    assert apply_to_scenario(a, sc) is False and (sc.type_k, sc.type_v) == ("f16", "f16")
    _, a = _parse("-ctk", "f16")  # given, but what the scenario has already
    assert apply_to_scenario(a, sc) is False
    _, a = _parse("--type-kv", "f32")
    assert apply_to_scenario(a, sc) is True and (sc.type_k, sc.type_v) == ("f32", "f32")
    # the scenario's own flash attention lets a quantized V through; the hint names the scenario's field
    sc = SimpleNamespace(type_k="f16", type_v="f16", flash_attn=True)
    _, a = _parse("-ctv", "q8_0")
    assert apply_to_scenario(a, sc) is True and sc.type_v == "q8_0"
    sc.flash_attn = False
    with pytest.raises(ValueError, match='"flash_attn": "on" in the scenario'):
        apply_to_scenario(a, sc)
