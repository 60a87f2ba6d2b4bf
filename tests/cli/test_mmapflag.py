"""graphgen/cli/mmapflag.py: --no-mmap wraps a command so that its whole run (and the child
processes it starts) loads weights by copying, and only that run."""

import argparse
import os

import pytest

from graphgen.cli.mmapflag import add_mmap_flag
from graphgen.runtime.mmapfile import ENV_NO_MMAP, mmap_default


def _parser(seen):
    p = argparse.ArgumentParser(prog="graphgen cmd")

    def fn(args):
        """the command"""
        seen.append((os.environ.get(ENV_NO_MMAP), mmap_default()))
        return 7
    p.set_defaults(fn=fn)
    add_mmap_flag(p)
    return p


def test_no_mmap_holds_for_the_commands_run_only(monkeypatch):
    monkeypatch.delenv(ENV_NO_MMAP, raising=False)
    seen = []
    p = _parser(seen)
    args = p.parse_args(["--no-mmap"])
    assert args.fn(args) == 7
    assert seen == [("1", False)]
    assert ENV_NO_MMAP not in os.environ  # put back once the command returns
    args = p.parse_args([])
    assert args.no_mmap is False and args.fn(args) == 7
    assert seen[-1] == (None, True)
    assert args.fn.__doc__ == "the command"  # the wrapper keeps the command's own name and text


def test_a_value_set_before_the_command_is_put_back(monkeypatch):
    monkeypatch.setenv(ENV_NO_MMAP, "0")
    seen = []
    p = _parser(seen)
    args = p.parse_args(["--no-mmap"])
    args.fn(args)
    assert seen == [("1", False)] and os.environ[ENV_NO_MMAP] == "0"


def test_the_command_must_be_set_first():
    p = argparse.ArgumentParser(prog="graphgen early")
    with pytest.raises(ValueError, match="graphgen early: add_mmap_flag needs the parser's fn default set first"):
        add_mmap_flag(p)


@pytest.mark.parametrize("cmd", ["dump", "trace", "xdiff", "bench", "draft"])
def test_the_commands_that_load_a_draft_take_it(cmd):
    from graphgen.cli.parser import build_parser
    sub = build_parser()._subparsers._group_actions[0].choices[cmd]
    assert "--no-mmap" in sub._option_string_actions
