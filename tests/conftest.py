import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the tools the tests drive, the tests' shared helpers (tests/support), this file's names (tests are
# packages, so that a test file is named by its folder as the module it mirrors: tests/accept/
# test_compare.py and tests/authors/test_compare.py) and the fuzzer's modules, which run as scripts too
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "tests" / "support"), str(ROOT / "tests"), str(ROOT / "tests" / "fuzz")]

REF_DIR = ROOT / "tests" / "data" / "reference"


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
    from workers import HANG, Worker
    w = Worker([sys.executable, "-m", "graphgen.reference.runner", "--serve"],
               tmp_path_factory.mktemp("workers") / "reference.err", timeout=HANG)
    yield w
    w.close()


def pytest_collection_modifyitems(items):
    """What a test needs beyond the CPU, as markers (`-m "not torch"` and so on): the authors'
    models need the graphgen[torch] extra, the viewer's browser tests Chromium, the GPU backends'
    tests a ggml built with one (tools/build_ggml.sh)."""
    for item in items:
        path = Path(str(item.fspath))
        if "authors" in path.parts:
            item.add_marker(pytest.mark.torch)
        if path.name == "test_viewer_browser.py":
            item.add_marker(pytest.mark.browser)
        if path.name == "test_backends.py" and any(k in item.name for k in ("gpu_backend_matches", "vulkan")):
            item.add_marker(pytest.mark.gpu)
