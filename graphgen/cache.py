"""graphgen's cache folder, resolved in one place.

The cache holds what graphgen fetches or builds once: ggml-python's bindings, loadable copies of
the reference's libraries, a small C shim, llama.cpp's converter, model digests. It is
`$GRAPHGEN_CACHE`, else `$XDG_CACHE_HOME/graphgen`, else `~/.cache/graphgen`. Entries are built
in a temporary folder and published complete and readable by everyone (folders 0755, files 0644,
executables 0755), so a cache one user filled serves any user who can read it. A user who cannot
write it keeps new entries in a cache of their own beside it (`graphgen-<uid>`, or under the
system's temporary folder when even that cannot be made), and still reads what the shared one has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def configured_root() -> Path:
    base = os.environ.get("GRAPHGEN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "graphgen")
    return Path(base)


def _writable(path: Path) -> bool:
    """Whether `path` can be written, or made and then written."""
    p = path
    try:
        while not p.exists():
            if p.parent == p:
                return False
            p = p.parent
        return p.is_dir() and os.access(p, os.W_OK | os.X_OK)
    except OSError:  # a folder on the way this user may not enter
        return False


def root() -> Path:
    """Where new entries go: the configured cache, or this user's own when it is not writable."""
    cfg = configured_root()
    if _writable(cfg):
        return cfg
    beside = cfg.with_name(f"{cfg.name}-{os.getuid()}")
    if _writable(beside):
        return beside
    return Path(tempfile.gettempdir()) / f"graphgen-cache-{os.getuid()}"


def roots() -> list[Path]:
    """Where entries are looked for: the configured cache first, then this user's own."""
    cfg, own = configured_root(), root()
    return [cfg] if own == cfg else [cfg, own]


def find(name: str, marker: str = ".complete") -> Path | None:
    """The entry `name` whose `marker` file exists and can be read, in any of `roots()`."""
    for r in roots():
        p = r / name
        try:
            if (p / marker).is_file() and os.access(p / marker, os.R_OK):
                return p
        except OSError:  # a folder this user may not enter
            continue
    return None


def entry(name: str, marker: str = ".complete") -> Path:
    """The entry `name`: where it is, or where to make it."""
    return find(name, marker) or root() / name


def publish(folder: Path) -> None:
    """Make a freshly built entry readable by every user before it is renamed into place."""
    for dirpath, dirnames, filenames in os.walk(folder):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if os.path.islink(p):
                continue
            os.chmod(p, 0o755 if os.access(p, os.X_OK) else 0o644)


def fetch_sdist(package: str, version: str, filename: str, what: str, error=RuntimeError) -> Path:
    """A package's sdist in the cache's src/, fetched with pip the first time; `error` is raised
    (one line) when pip cannot fetch it."""
    from . import progress
    src_dir = root() / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    sdist = src_dir / filename
    if not sdist.exists():
        progress.note(f"fetching {what} (once)...")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", package,
                               "-d", str(src_dir), f"{package}=={version}"], capture_output=True, text=True)
        if proc.returncode != 0 or not sdist.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise error(f"could not fetch the {package}=={version} sdist with pip ({tail[0]}); place it at {sdist}")
    return sdist


def install(tmp: Path, dest: Path) -> None:
    """Mark a freshly built entry complete, publish it and rename it into place (a process that
    finished first keeps its own)."""
    (tmp / ".complete").write_text("ok\n")
    publish(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    try:
        tmp.rename(dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
