"""The tiny DFlash draft every check-batch test runs on, made once."""

import pytest

from graphgen.synth import make_model


@pytest.fixture(scope="session")
def draft(tmp_path_factory):
    path = tmp_path_factory.mktemp("checkbatch") / "dflash.gguf"
    make_model(path, "dflash", "base")
    return path
