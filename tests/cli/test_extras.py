"""graphgen/cli/extras.py: which parsed commands need the graphgen[torch] extra, named by the flag
the user gave, and --engines read as `graphgen accept` reads it."""

import pytest

from graphgen.cli.extras import AUTHORS_ENGINE, engine_names, torch_need
from graphgen.cli.parser import build_parser


def _need(*argv):
    return torch_need(build_parser().parse_args(list(argv)))


def test_engine_names_split_on_commas_and_ignore_spaces_and_empty_names():
    assert engine_names("llama.cpp, graphgen,,authors ") == ["llama.cpp", "graphgen", "authors"]
    assert engine_names(" , ") == []
    assert AUTHORS_ENGINE == "authors"


@pytest.mark.parametrize("argv, need", [
    (["check", "ck/"], "check"),
    (["convert", "ck/", "d.gguf"], "convert"),
    (["make-model", "ck/", "--format", "hf"], "--format hf"),
    (["dump", "ck/", "--engine", "torch", "--out", "o"], "--engine torch"),
    (["accept", "-m", "t", "-md", "d", "--engines", "llama.cpp, authors"], "--engines llama.cpp, authors"),
    (["accept", "-m", "t", "-md", "d", "--authors-draft", "ck/"], "--authors-draft"),
    (["reduce", "--hf-settings", "hf.json", "--out", "r"], "--hf-settings"),
    (["reduce", "--checkpoint", "ck/", "--scenario", "s.json", "--out", "r"], "--checkpoint"),
])
def test_what_needs_torch_is_named_by_the_flag_given(argv, need):
    assert _need(*argv) == need


@pytest.mark.parametrize("argv", [
    ["make-model", "d.gguf"],
    ["make-model", "d.gguf", "--format", "gguf"],
    ["dump", "d.gguf", "--engine", "llama.cpp", "--out", "o"],
    ["accept", "-m", "t", "-md", "d"],
    # a name that only contains the authors' engine's name is not it
    ["accept", "-m", "t", "-md", "d", "--engines", "graphgen,authorsX"],
    ["info", "d.gguf"],
    ["reduce", "--settings", "settings.json", "--scenario", "s.json", "--out", "r"],
])
def test_commands_without_the_authors_models_need_nothing(argv):
    assert _need(*argv) is None
