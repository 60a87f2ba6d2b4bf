"""The command-line tests' shared fixtures: graphgen's entry point run in this process, and a tiny
draft made once."""

from types import SimpleNamespace

import pytest


@pytest.fixture
def cli(capsys):
    """`graphgen ARGS...` in this process: (code, out, err). A usage error (argparse's exit 2) is a
    code as any other; the progress mode a command set is put back afterwards."""
    from graphgen import progress
    from graphgen.cli import main

    def run(*args):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return SimpleNamespace(code=code, out=out, err=err)
    yield run
    progress.set_mode("auto")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny random DFlash draft (block size 4, vocabulary 256, mask token 255)."""
    from graphgen.synth import make_model
    path = tmp_path_factory.mktemp("cli-draft") / "tiny.gguf"
    make_model(path, "dflash", seed=0)
    return path
