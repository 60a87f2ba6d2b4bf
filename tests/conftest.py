import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

REF_DIR = ROOT / "tests" / "reference"


def reference_available() -> bool:
    try:
        from graphgen.reference.libload import package_dir
        package_dir()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")
