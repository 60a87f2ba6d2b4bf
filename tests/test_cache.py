"""A cache one user filled serves every user who can read it; one they cannot write gets a cache
of their own beside it; never a traceback. The other user is `nobody`, run through setpriv (the
test runs as root, as CI does)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from graphgen import cache

ROOT = Path(__file__).resolve().parents[1]
SITE = next(Path(sys.prefix).glob("lib/python3*/site-packages"))


def _as_nobody(args, env_extra):
    """graphgen as uid 65534, on the distribution's python3 over this environment's packages
    (the virtual environment's own interpreter may live in root's home)."""
    py = shutil.which("python3", path="/usr/bin:/bin")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONPATH": f"{SITE}:{ROOT}", **env_extra}
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", py, "-m", "graphgen.cli",
                           *args], capture_output=True, text=True, env=env)


@pytest.fixture
def shared():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("running as another user needs root and setpriv (CI runs as root)")
    # a folder the other user can reach (pytest's own tmp folders are private to root)
    tmp_path = Path(tempfile.mkdtemp(prefix="graphgen-cache-test-", dir="/tmp"))
    tmp_path.chmod(0o755)
    from graphgen.synth import make_model
    model = tmp_path / "d.gguf"
    make_model(model, "dflash")
    model.chmod(0o644)
    cache_dir = tmp_path / "cache"
    env = dict(os.environ, GRAPHGEN_CACHE=str(cache_dir))
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "info", str(model)], capture_output=True, text=True,
                       env=env)
    assert p.returncode == 0, p.stderr
    yield tmp_path, model, cache_dir
    shutil.rmtree(tmp_path, ignore_errors=True)
    shutil.rmtree(Path(tempfile.gettempdir()) / "graphgen-cache-65534", ignore_errors=True)


def test_entries_are_published_readable_by_all(shared):
    _, _, cache_dir = shared
    entries = [p for p in cache_dir.iterdir() if p.is_dir() and p.name != "src"]
    assert entries
    for p in [*entries, *(q for e in entries for q in e.rglob("*"))]:
        if p.is_symlink():
            continue
        mode = stat.S_IMODE(p.stat().st_mode)
        want = 0o755 if p.is_dir() else 0o644
        assert mode & want == want, (p, oct(mode))


def test_another_user_reads_a_cache_they_cannot_write(shared):
    tmp, model, cache_dir = shared
    p = _as_nobody(["info", str(model)], {"GRAPHGEN_CACHE": str(cache_dir)})
    assert p.returncode == 0, p.stderr
    assert f"({cache_dir}/llama-" in p.stdout  # the shared entry, not a copy of their own
    # a dump writes a model digest: it lands in a cache of their own, the shared one untouched
    before = sorted(x.name for x in cache_dir.iterdir())
    out = tmp / "out"
    out.mkdir()
    out.chmod(0o777)
    p = _as_nobody(["dump", str(model), "--scenario", str(ROOT / "tests/data/reference/dflash-fa-off/scenario.json"),
                    "--out", str(out / "d")], {"GRAPHGEN_CACHE": str(cache_dir)})
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert sorted(x.name for x in cache_dir.iterdir()) == before


def test_an_unreadable_cache_is_no_traceback(shared):
    """Entries an older graphgen made private (0700): the other user works around them."""
    _, model, cache_dir = shared
    for e in cache_dir.iterdir():
        e.chmod(0o700)
    p = _as_nobody(["info", str(model)], {"GRAPHGEN_CACHE": str(cache_dir)})
    assert "Traceback" not in p.stderr and "Permission denied" not in p.stderr, p.stderr
    assert p.returncode == 0 or len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_find_skips_entries_this_user_cannot_enter(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHGEN_CACHE", str(tmp_path / "c"))
    (tmp_path / "c" / "e").mkdir(parents=True)
    assert cache.find("e") is None           # no marker: not complete
    (tmp_path / "c" / "e" / ".complete").write_text("ok\n")
    assert cache.find("e") == tmp_path / "c" / "e"
    assert cache.entry("missing") == tmp_path / "c" / "missing"
