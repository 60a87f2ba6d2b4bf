import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

REF_DIR = ROOT / "tests" / "reference"


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def isolated():
    """graphgen in a worker process: a case that aborts ggml fails alone (workers.Isolated),
    the one parity_check's live cases use too."""
    from parity_check import worker
    return worker()


@pytest.fixture(scope="session")
def reference_worker(tmp_path_factory):
    """llama.cpp b11739 serving many scenarios in one process (`runner --serve`)."""
    from workers import Worker
    w = Worker([sys.executable, "-m", "graphgen.reference.runner", "--serve"],
               tmp_path_factory.mktemp("workers") / "reference.err", timeout=600)
    yield w
    w.close()
