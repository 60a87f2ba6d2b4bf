"""graphgen/cli/llamaflags.py: llama.cpp's flags for the commands that run a draft, with llama.cpp's
ranges and device names, and the scenario they describe without a scenario file (the drafting loop
of the module's docstring, written out by hand here). Recording and rerunning a dump's scenario
(--scenario-from) end to end: tests/reference/test_scenario_from.py."""

import argparse
import math
from types import SimpleNamespace

import pytest

from conftest import REF_DIR
from graphgen.cli.llamaflags import (_draft_shape, _flag_names, backend_of, build_scenario_doc, check_spec_flags,
                                     count_arg, model_path, read_prompt_file, scenario_flag, scenario_from_args)
from graphgen.cli.parser import build_parser
from graphgen.errors import GraphgenError

SCENARIO = REF_DIR / "dflash-fa-off" / "scenario.json"


def _dump_args(model, *flags):
    return build_parser().parse_args(["dump", str(model), "--out", "o", *map(str, flags)])


# ---- single flags ---------------------------------------------------------------------------

def test_count_arg_takes_whole_numbers_from_its_floor():
    assert count_arg(1)("3") == 3 and count_arg(0)("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match="must be at least 1, got 0"):
        count_arg(1)("0")
    with pytest.raises(argparse.ArgumentTypeError, match="expected a whole number, got '2.5'"):
        count_arg(1)("2.5")


@pytest.mark.parametrize("dev, spec", [
    ("CPU", "cpu"), ("cpu", "cpu"), ("none", "cpu"), ("Vulkan0", "vulkan:0"), ("vulkan12", "vulkan:12"),
    ("CUDA1", "cuda:1"), ("Metal", "metal"), ("MTL0", "metal"), ("RPC[10.0.0.2:50052]", "rpc://10.0.0.2:50052"),
    # graphgen's own specs pass through, trimmed
    (" vulkan:0 ", "vulkan:0"), ("rpc://h:1", "rpc://h:1"), ("auto", "auto"), ("Vulkan", "Vulkan"),
])
def test_llama_cpp_device_names_as_graphgen_backends(dev, spec):
    assert backend_of(dev) == spec


def test_model_path_from_the_argument_or_m():
    a = SimpleNamespace(model=None, model_flag="d.gguf")
    assert model_path(a) == "d.gguf" and a.model == "d.gguf"
    assert model_path(SimpleNamespace(model="d.gguf", model_flag="d.gguf")) == "d.gguf"
    assert model_path(SimpleNamespace(model="d.gguf")) == "d.gguf"  # a command without -m
    with pytest.raises(GraphgenError, match="no model: give the draft GGUF as an argument or with -m FILE"):
        model_path(SimpleNamespace(model=None, model_flag=None))
    with pytest.raises(GraphgenError, match=r"two models given \(a.gguf and -m b.gguf\): give one"):
        model_path(SimpleNamespace(model="a.gguf", model_flag="b.gguf"))


def test_a_prompt_file_is_utf8_text(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes("Été, déjà\nsecond line\n".encode())
    assert read_prompt_file(f) == "Été, déjà\nsecond line\n"
    f.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(GraphgenError, match=r"p.txt: not a text file \(a NUL byte at offset 5\)"):
        read_prompt_file(f)
    f.write_bytes(b"caf\xe9 au lait")
    with pytest.raises(GraphgenError, match=r"p.txt: not UTF-8 text \(byte 3: 0xe9\)"):
        read_prompt_file(f)
    with pytest.raises(FileNotFoundError, match="none.txt: no such prompt file"):
        read_prompt_file(tmp_path / "none.txt")


@pytest.mark.parametrize("old, new", [("--draft-max", "--spec-draft-n-max"), ("--draft", "--spec-draft-n-max"),
                                      ("--draft-min", "--spec-draft-n-min"), ("--draft-n-min", "--spec-draft-n-min")])
def test_removed_draft_flags_name_their_replacement(old, new, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["draft", "d.gguf", old, "3"])
    assert f"{old}: the argument has been removed. use {new}" in capsys.readouterr().err


def test_the_spec_flags_defaults_are_llama_cpps():
    a = build_parser().parse_args(["draft", "d.gguf", "--draft-p-min", "0.25"])
    assert (a.spec_draft_n_max, a.spec_draft_n_min, a.spec_draft_p_min) == (3, 0, 0.25)


def _spec(**kw):
    return SimpleNamespace(**dict(dict(n_predict=8, spec_draft_n_max=3, spec_draft_n_min=0, spec_draft_p_min=0.0,
                                       seed=None), **kw))


@pytest.mark.parametrize("kw", [dict(n_predict=-1), dict(n_predict=1), dict(spec_draft_n_max=None),
                                dict(spec_draft_n_min=3), dict(spec_draft_p_min=0.0), dict(spec_draft_p_min=1.0),
                                dict(seed=0), dict(seed=0xFFFFFFFF)])
def test_spec_flags_within_llama_cpps_ranges(kw):
    check_spec_flags(_spec(**kw))


@pytest.mark.parametrize("kw, msg", [
    (dict(n_predict=0), "-n must be at least 1, or -1"),
    (dict(n_predict=-2), "-n must be at least 1, or -1"),
    (dict(spec_draft_n_max=-1), "--spec-draft-n-max must be >= 0, got -1"),
    (dict(spec_draft_n_max=0), "--spec-draft-n-max 0 drafts nothing"),
    (dict(spec_draft_n_min=-1), "--spec-draft-n-min must be >= 0, got -1"),
    (dict(spec_draft_n_min=4), "--spec-draft-n-min 4 is above --spec-draft-n-max 3"),
    (dict(spec_draft_p_min=1.5), r"--spec-draft-p-min must be in \[0, 1\], got 1.5"),
    (dict(spec_draft_p_min=-0.1), r"--spec-draft-p-min must be in \[0, 1\]"),
    (dict(spec_draft_p_min=math.nan), r"--spec-draft-p-min must be in \[0, 1\], got nan"),
    (dict(seed=2 ** 32), r"--seed must be in \[0, 2\^32-1\], or -1"),
    (dict(seed=-2), r"--seed must be in \[0, 2\^32-1\]"),
])
def test_spec_flags_outside_them_are_refused(kw, msg):
    with pytest.raises(GraphgenError, match=msg):
        check_spec_flags(_spec(**kw))


def test_seed_minus_one_is_llama_cpps_random_seed():
    a = _spec(seed=-1)
    check_spec_flags(a)
    assert a.seed == 0xFFFFFFFF


# ---- the scenario the flags describe ----------------------------------------------------------

def _inject(n, p0, seq):
    return {"inject": {"n_tokens": n, "pos0": p0, "seq": seq}}


def test_the_drafting_loop_written_out():
    """Two sequences, a 70-row prompt in micro-batches of 64, two rounds of blocks of 4 (mask 255)."""
    doc = build_scenario_doc(n_prompt=70, block=4, steps=2, n_seq=2, mask_token=255, n_ubatch=None, n_ctx=None, seed=5)
    block = lambda pos: {"block": {"seqs": [{"seq": 0, "pos0": pos, "tokens": [7, 255, 255, 255]},  # noqa: E731
                                            {"seq": 1, "pos0": pos, "tokens": [8, 255, 255, 255]}]}}
    assert doc == {"n_ctx": 256, "n_ubatch": 64, "seed": 5, "n_seq": 2, "steps": [
        _inject(64, 0, 0), _inject(6, 64, 0), _inject(64, 0, 1), _inject(6, 64, 1),
        block(70),
        {"seq_rm": {"seq": -1, "p0": 70, "p1": -1}}, _inject(4, 70, 0), _inject(4, 70, 1),
        block(74)]}


def test_the_flag_scenarios_micro_batch_and_context():
    # the micro-batch given; one round: no seq_rm after the last block
    doc = build_scenario_doc(n_prompt=5, block=3, steps=1, n_seq=1, mask_token=9, n_ubatch=2, n_ctx=None, seed=1)
    assert doc["n_ubatch"] == 2 and doc["steps"] == [
        _inject(2, 0, 0), _inject(2, 2, 0), _inject(1, 4, 0),
        {"block": {"seqs": [{"seq": 0, "pos0": 5, "tokens": [7, 9, 9]}]}}]
    # unset, the micro-batch holds one block of every sequence
    assert build_scenario_doc(6, 16, 1, 8, 0, None, None, 1)["n_ubatch"] == 128
    # the context: every sequence's last block, in whole 256-cell pages, unless -c gives it
    assert build_scenario_doc(6, 4, 3, 1, 0, None, None, 1)["n_ctx"] == 256
    assert build_scenario_doc(300, 4, 1, 1, 0, None, None, 1)["n_ctx"] == 512   # 304 cells
    assert build_scenario_doc(250, 4, 2, 2, 0, None, None, 1)["n_ctx"] == 768   # 2 x 258 cells
    assert build_scenario_doc(300, 4, 1, 1, 0, None, 100, 1)["n_ctx"] == 100


def test_the_drafts_block_and_mask_are_read_from_its_keys(tiny):
    assert _draft_shape(str(tiny)) == (4, 255)


def test_scenario_from_the_flags(tiny):
    sc = scenario_from_args(_dump_args(tiny, "--prompt", 5, "--steps", 2, "-np", 2, "-t", 3, "-fa", "on",
                                       "--seed", 9), str(tiny))
    d = sc.to_dict()
    assert (d["n_seq"], d["n_threads"], d["flash_attn"], d["seed"], d["n_ubatch"]) == (2, 3, "on", 9, 64)
    assert [next(iter(s)) for s in d["steps"]] == ["inject", "inject", "block", "seq_rm", "inject", "inject",
                                                  "block"]
    assert d["steps"][2]["block"]["seqs"][1]["tokens"] == [8, 255, 255, 255]
    # the defaults: a 6-row prompt, one round, the draft's own block
    d = scenario_from_args(_dump_args(tiny), str(tiny)).to_dict()
    assert d["steps"] == [{"inject": {"n_tokens": 6, "pos0": 0, "seq": 0}},
                          {"block": {"seqs": [{"seq": 0, "tokens": [7, 255, 255, 255], "pos0": 6,
                                               "embd_state": "context"}]}}]
    assert (d["seed"], d["n_seq"], d["n_ctx"]) == (1, 1, 256)


def test_the_batch_caps_the_micro_batch_as_in_llama_cpp(tiny):
    d = scenario_from_args(_dump_args(tiny, "--prompt", 40, "-b", 16, "-ub", 32), str(tiny)).to_dict()
    assert (d["n_batch"], d["n_ubatch"]) == (16, 16)
    assert [s["inject"]["n_tokens"] for s in d["steps"] if "inject" in s] == [16, 16, 8]
    d = scenario_from_args(_dump_args(tiny, "--scenario", SCENARIO, "-b", 32), str(tiny)).to_dict()
    assert (d["n_batch"], d["n_ubatch"]) == (32, 32)


def test_flags_laid_over_a_scenario_file(tiny):
    args = _dump_args(tiny, "--scenario", SCENARIO, "-c", 512, "-ub", 16, "-fa", "auto", "--seed", 4)
    sc = scenario_from_args(args, str(tiny))
    d = sc.to_dict()
    assert (d["n_ctx"], d["n_ubatch"], d["flash_attn"], d["seed"]) == (512, 16, "auto", 4)
    assert d["steps"] == __import__("json").loads(SCENARIO.read_text())["steps"]
    # the file's relative paths are its folder's
    assert sc.features_base == str(SCENARIO.parent)
    for flag in ("--prompt", "--block", "--steps"):
        with pytest.raises(GraphgenError, match=f"{flag} builds a scenario; it cannot change --scenario "):
            scenario_from_args(_dump_args(tiny, "--scenario", SCENARIO, flag, 3), str(tiny))


def test_scenario_from_takes_a_dump_only(tiny):
    args = _dump_args(tiny, "--scenario-from", SCENARIO)
    assert scenario_flag(args) == "--scenario-from" and args.scenario == str(SCENARIO)
    assert scenario_flag(_dump_args(tiny, "--scenario", SCENARIO)) == "--scenario"
    with pytest.raises(ValueError, match="not a graphgen-dump/1 dump, so it records no scenario"):
        scenario_from_args(args, str(tiny))
    with pytest.raises(GraphgenError, match="--prompt builds a scenario; it cannot change --scenario-from "):
        scenario_from_args(_dump_args(tiny, "--scenario-from", SCENARIO, "--prompt", 3), str(tiny))
    with pytest.raises(SystemExit):  # one or the other
        _dump_args(tiny, "--scenario-from", SCENARIO, "--scenario", SCENARIO)


def test_a_scenario_error_names_the_flag_that_set_the_field(tiny):
    with pytest.raises(GraphgenError, match=r"4 tokens are longer than n_ubatch 2 \(-ub sets n_ubatch\)$"):
        scenario_from_args(_dump_args(tiny, "-ub", 2), str(tiny))
    with pytest.raises(GraphgenError, match=r"'n_seq' = 300 is above 256 \(-np sets n_seq\)$"):
        scenario_from_args(_dump_args(tiny, "-np", 300), str(tiny))


@pytest.mark.parametrize("msg, out", [
    ("x: 'n_ctx' = 0 is below 1", "x: 'n_ctx' = 0 is below 1 (-c sets n_ctx)"),
    ("x: 'n_threads' must be an integer", "x: 'n_threads' must be an integer (-t sets n_threads)"),
    ("x: 'flash_attn' must be 'on'", "x: 'flash_attn' must be 'on' (-fa sets flash_attn)"),
    ("x: 'n_batch' = 0 is below 1", "x: 'n_batch' = 0 is below 1 (-b sets n_batch)"),
    ("x: 'steps' must be a non-empty list", "x: 'steps' must be a non-empty list"),
])
def test_flag_names_in_scenario_errors(msg, out):
    assert _flag_names(msg) == out
