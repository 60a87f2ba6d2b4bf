"""graphgen/cli/parser.py: every command module's verbs in one parser, usage errors in one line,
no abbreviated flags, every flag's help ending with its default, and the options taken before or
after the command's name."""

import argparse

import pytest

from graphgen import __version__
from graphgen.cli.parser import COMMAND_MODULES, build_parser, default_text


def _commands():
    return build_parser()._subparsers._group_actions[0].choices


def _help_of(cmd, flag):
    """The help line argparse prints for one flag of a command (its text as the formatter makes it)."""
    p = _commands()[cmd]
    action = p._option_string_actions[flag]
    return p._get_formatter()._expand_help(action) if action.help else ""


def test_every_command_module_adds_its_verbs():
    assert list(_commands()) == ["make-model", "info", "dump", "diff", "draft", "accept", "devices", "xdiff",
                                 "rpc-server", "view", "trace", "import", "bench", "check-batch", "demo", "convert",
                                 "check", "reduce"]
    assert len(COMMAND_MODULES) == 12 and all(m.startswith("graphgen.cli.") for m in COMMAND_MODULES)


@pytest.mark.parametrize("kw, text", [
    (dict(action="store_true"), "off"),
    (dict(action="store_false"), "on"),
    (dict(default=None), "not set"),
    (dict(default=[], action="append"), "not set"),
    (dict(default=[1, 4, 16]), "1,4,16"),
    (dict(default=("graphgen", "llama.cpp")), "graphgen,llama.cpp"),
    (dict(default=20, type=int), "20"),
    (dict(default=0.5, type=float), "0.5"),
])
def test_default_text_of_a_flag(kw, text):
    p = argparse.ArgumentParser()
    assert default_text(p.add_argument("--x", **kw)) == text


def test_no_default_text_where_the_help_says_it_or_there_is_none():
    p = argparse.ArgumentParser()
    assert default_text(p.add_argument("--a", default=3, help="three (default 3)")) is None
    assert default_text(p.add_argument("--b", default=3, required=True)) is None
    assert default_text(p.add_argument("--c", default=3, help="the file (required)")) is None
    assert default_text(p.add_argument("--d", default=3, help=argparse.SUPPRESS)) is None
    assert default_text(p.add_argument("--e", default=argparse.SUPPRESS)) is None
    assert default_text(p.add_argument("pos", default=3)) is None
    assert default_text(p._option_string_actions["-h"]) is None


def test_every_flags_help_ends_with_its_default():
    assert _help_of("draft", "--verbose").endswith("(default: off)")
    assert _help_of("make-model", "--variant") == "(default: dflash)"            # no help text of its own
    assert _help_of("make-model", "--lilicorr-hidden") == "(default: not set)"
    assert _help_of("make-model", "--wtype") == "type of the matmul weights (default: f32)"
    assert _help_of("dump", "--out") == "the folder the dumps go to (required)"  # says it already: once
    assert _help_of("import", "--out").count("(required)") == 1
    assert _help_of("bench", "--repeat").count("default") == 1
    # a required flag without help still says so
    assert "(required)" in _commands()["dump"].format_help()


def test_a_usage_error_is_one_line_pointing_at_the_commands_help(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", "m.gguf", "--repeat", "x"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == ("graphgen: error: argument --repeat: expected a whole number, got 'x' "
                   "(see 'graphgen bench --help')\n")
    with pytest.raises(SystemExit):
        build_parser().parse_args([])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("graphgen: error: ") and "(see 'graphgen --help')" in err


@pytest.mark.parametrize("argv, unknown", [
    (["bench", "m.gguf", "--rep", "3"], "--rep"),               # a long flag's prefix
    (["draft", "m.gguf", "-n", "2", "--prompt-tok", "1"], "--prompt-tok"),
    (["make-model", "o.gguf", "--targ", "t"], "--targ"),
    (["dump", "m.gguf", "--out", "o", "-c1"], "-c1"),            # a value run into a single-dash flag
    (["dump", "m.gguf", "--out", "o", "-ctkq8_0"], "-ctkq8_0"),
])
def test_no_flag_is_taken_for_a_prefix_or_with_its_value_run_in(argv, unknown, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert f"unrecognized arguments: {unknown}" in capsys.readouterr().err


def test_the_shared_options_before_or_after_the_command():
    ap = build_parser()
    for argv in (["--quiet", "devices"], ["devices", "--quiet"]):
        a = ap.parse_args(argv)
        assert (a.quiet, a.progress) == (True, False)
    a = ap.parse_args(["devices"])
    assert (a.quiet, a.progress, a.ggml, a.llama) == (False, False, None, None)
    a = ap.parse_args(["--ggml", "/g", "devices", "--progress"])
    assert (a.ggml, a.progress) == ("/g", True)
    a = ap.parse_args(["devices", "--llama", "/l"])
    assert a.llama == "/l"


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"graphgen {__version__}\n"
