"""Which ggml graphgen computes on, and how ggml-python's bindings are laid over it.

graphgen computes on the same ggml as the llama.cpp it is compared with, so that any difference
a diff shows is in the graph and not in the kernels. ggml-python is pure ctypes over a folder of
`libggml*.so`; graphgen takes its Python files (from the ggml-python sdist, never compiled) and
puts them in a package folder whose `lib/` links to the chosen libraries:

- by default, the reference wheel's own ggml (llama-cpp-py-sync b11739, ggml 0.27.0), through
  the glibc-compatible copies the reference loader prepares;
- `--ggml DIR` or `$GRAPHGEN_GGML_DIR`: the libggml*.so of any llama.cpp build (a developer's
  tree, a CUDA or Vulkan build from tools/build_ggml.sh).

Before the bindings are imported, every function they bind and every function graphgen calls
is looked up in the libraries, so an older or partial ggml is refused with one line naming the
missing function, never with an AttributeError half-way through an import.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import cache
from ..errors import GraphgenError
from ..libload import lib_file

ENV_GGML_DIR = "GRAPHGEN_GGML_DIR"
BINDINGS_PACKAGE = "ggml-python"
BINDINGS_VERSION = "0.0.45"
BINDINGS_FILES = ("__init__.py", "ggml.py", "utils.py", "py.typed")

# ggml-python binds a backend's functions when the library has that backend (enabled=...); a
# backend newer than the bindings may lack some of them (b11549's ggml-cuda has no split buffer
# type, and declares ggml_backend_cuda_allreduce_tensor without defining it), which would fail the
# import: the laid-out copy leaves such a function unbound, as it leaves every function of a
# backend that is not built in
CONDITIONAL_BINDING = ("            if enabled:\n                func = getattr(lib, name)\n",
                       "            if enabled and hasattr(lib, name):\n                func = getattr(lib, name)\n")

# the libraries ggml-python's loader preloads by name, in its order; libggml itself comes last
LIBRARIES = ("ggml-base", "ggml-cpu", "ggml-blas", "ggml-cuda", "ggml-metal", "ggml-rpc", "ggml-vulkan", "ggml")
REQUIRED_LIBRARIES = ("ggml-base", "ggml-cpu", "ggml")

# graphgen's own calls beyond ggml-python's bindings: the fused ops of the DeepSeek-V4 graphs
FUSED_FUNCTIONS = ("ggml_dsv4_hc_pre", "ggml_dsv4_hc_pre_gated", "ggml_dsv4_hc_comb", "ggml_dsv4_hc_post",
                   "ggml_swiglu_clamp", "ggml_rope_set_offset", "ggml_prec_set_acc", "ggml_mul_mat_set_hint",
                   "ggml_version")


class GGMLRuntimeError(GraphgenError, RuntimeError):
    """The ggml libraries or ggml-python's bindings cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Runtime:
    lib_dir: Path          # the folder the user chose (or the reference wheel's prepared copy)
    package_dir: Path      # the folder holding the `ggml` package graphgen imports
    origin: str            # "reference" (llama-cpp-py-sync's ggml), "--ggml" or "$GRAPHGEN_GGML_DIR"
    version: str = "?"     # ggml_version() of the loaded library, once loaded


_chosen: tuple[Path, str] | None = None
_active: Runtime | None = None


def cache_root() -> Path:
    """Where graphgen's cache entries go (graphgen.cache)."""
    return cache.root()


def choose(lib_dir: str | os.PathLike | None) -> None:
    """Point graphgen at a folder of libggml*.so (the command line's --ggml); before first use only."""
    global _chosen
    if lib_dir is None:
        return
    path = Path(lib_dir).expanduser().resolve()
    if _active is not None and _active.lib_dir != path:
        raise GGMLRuntimeError(f"ggml is already loaded from {_active.lib_dir}; --ggml {path} must be given "
                               "before anything runs (one process holds one ggml)")
    _chosen = (path, "--ggml")


def _selected() -> tuple[Path, str, Path | None]:
    """(library folder, where the choice came from, glibc shim to preload or None)."""
    from ..libload import ReferenceUnavailable, custom_llama_dir, glibc_shim, prepare_libraries
    try:
        # a copy of the reference's libraries elsewhere needs the same shim; others ignore it
        shim = glibc_shim()
    except ReferenceUnavailable:
        shim = None
    if _chosen is not None:
        return _chosen[0], _chosen[1], shim
    env = os.environ.get(ENV_GGML_DIR)
    if env:
        return Path(env).expanduser().resolve(), f"${ENV_GGML_DIR}", shim
    llama_dir = custom_llama_dir()
    if llama_dir is not None:  # --llama DIR alone: compute on the ggml that build was linked with
        return llama_dir, "--llama", shim
    try:
        folder, shim = prepare_libraries()
    except ReferenceUnavailable as e:
        raise GGMLRuntimeError(f"graphgen computes on the reference's ggml by default, and it is not usable: {e} "
                               f"(or point --ggml / ${ENV_GGML_DIR} at a folder of libggml*.so)") from e
    return folder, "reference", shim


def _bindings_source() -> Path:
    """ggml-python's Python files, taken from its sdist (cached; fetched with pip on first use)."""
    found = cache.find(f"ggml-python-{BINDINGS_VERSION}")
    if found is not None:
        return found
    dest = cache_root() / f"ggml-python-{BINDINGS_VERSION}"
    sdist = cache.fetch_sdist(BINDINGS_PACKAGE, BINDINGS_VERSION, f"ggml_python-{BINDINGS_VERSION}.tar.gz",
                              f"{BINDINGS_PACKAGE} {BINDINGS_VERSION}'s Python bindings", GGMLRuntimeError)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=sdist.parent))
    prefix = f"ggml_python-{BINDINGS_VERSION}/ggml/"
    try:
        with tarfile.open(sdist) as tar:
            for name in BINDINGS_FILES:
                member = tar.getmember(prefix + name)
                with tar.extractfile(member) as f:
                    (tmp / name).write_bytes(f.read())
    except (tarfile.TarError, KeyError, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise GGMLRuntimeError(f"{sdist}: not a usable {BINDINGS_PACKAGE} sdist ({e}); delete it to fetch again") from e
    cache.install(tmp, dest)
    return dest


def bound_functions(bindings_py: Path) -> list[str]:
    """The functions ggml-python binds unconditionally (a missing one fails its import)."""
    text = bindings_py.read_text()
    names = []
    for m in re.finditer(r'@ggml_function\(\s*"(\w+)"(.*?)\)\s*\ndef ', text, re.S):
        if "enabled=" not in m.group(2):
            names.append(m.group(1))
    return names


def _package_for(lib_dir: Path, bindings: Path) -> Path:
    """A folder holding a `ggml` package: the bindings, and lib/ linking to lib_dir's libraries."""
    key = hashlib.sha256(f"{lib_dir}\n{BINDINGS_VERSION}\n{CONDITIONAL_BINDING[1]}".encode()).hexdigest()[:16]
    links = {base: lib_file(lib_dir, base) for base in LIBRARIES}
    found = cache.find(f"ggml-runtime/{key}")
    if found is not None and all((found / "ggml" / "lib" / f"lib{b}.so").resolve() == p.resolve()
                                 for b, p in links.items() if p is not None):
        return found
    root = cache_root() / "ggml-runtime" / key
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=key + ".", dir=root.parent))
    (tmp / "ggml" / "lib").mkdir(parents=True)
    for name in BINDINGS_FILES:
        shutil.copy2(bindings / name, tmp / "ggml" / name)
    text = (tmp / "ggml" / "ggml.py").read_text()
    (tmp / "ggml" / "ggml.py").write_text(text.replace(*CONDITIONAL_BINDING))
    for base, path in links.items():
        if path is not None:
            os.symlink(path.resolve(), tmp / "ggml" / "lib" / f"lib{base}.so")
    (tmp / ".complete").write_text(str(lib_dir) + "\n")
    cache.publish(tmp)
    shutil.rmtree(root, ignore_errors=True)
    try:
        tmp.rename(root)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    if not (root / ".complete").exists():
        raise GGMLRuntimeError(f"could not lay out the ggml package in {root}")
    return root


def _compile_bindings(package: Path) -> None:
    """Bytecode for the bindings, written beside them once: ggml.py is 15,000 lines, and compiling
    it at every import (as a process that may not write bytecode does: PYTHONDONTWRITEBYTECODE,
    or a cache it cannot write) leaves about 15 MB of the compiler's memory in the process, where
    loading the bytecode takes under 2 MB. Hash-checked, so a copied or touched source is
    recompiled rather than trusted; a cache another user owns is left as it is."""
    import importlib.util
    import py_compile
    for name in BINDINGS_FILES:
        src = package / name
        if src.suffix != ".py" or Path(importlib.util.cache_from_source(str(src))).exists():
            continue
        try:
            py_compile.compile(str(src), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        except (OSError, py_compile.PyCompileError):
            return
        try:
            cache.publish(package / "__pycache__")  # readable by every user, as the entry is
        except OSError:
            pass


def _check_libraries(lib_dir: Path, origin: str, shim: Path | None, wanted: list[str]) -> str:
    """Load the libraries as ggml-python will and look up every wanted function; returns the version."""
    where = f"{lib_dir} ({origin})"
    if not lib_dir.is_dir():
        raise GGMLRuntimeError(f"ggml library folder {where} does not exist")
    missing_libs = [f"lib{b}.so" for b in REQUIRED_LIBRARIES if lib_file(lib_dir, b) is None]
    if missing_libs:
        raise GGMLRuntimeError(f"ggml library folder {where} has no {', '.join(missing_libs)}")
    if shim is not None:
        ctypes.CDLL(str(shim), mode=ctypes.RTLD_GLOBAL)
    handles = []
    for base in LIBRARIES:
        path = lib_file(lib_dir, base)
        if path is None:
            continue
        try:
            handles.append(ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL))
        except OSError as e:
            raise GGMLRuntimeError(f"cannot load {path}: {e}") from e
    version = "unknown"
    for h in handles:
        fn = getattr(h, "ggml_version", None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            version = fn().decode()
            break
    for name in wanted:
        if not any(hasattr(h, name) for h in handles):
            raise GGMLRuntimeError(f"the ggml in {where} (ggml {version}) lacks {name}, which graphgen needs; "
                                   "use a llama.cpp build with ggml >= 0.26.0")
    return version


def activate() -> Runtime:
    """Prepare and import the ggml graphgen computes on (once per process); returns what was loaded."""
    global _active
    if _active is not None:
        return _active
    lib_dir, origin, shim = _selected()
    loaded = sys.modules.get("ggml")
    if loaded is not None:
        raise GGMLRuntimeError(f"a ggml module is already imported from {getattr(loaded, '__file__', '?')}; "
                               "graphgen must load its own (one ggml per process)")
    bindings = _bindings_source()
    version = _check_libraries(lib_dir, origin, shim, bound_functions(bindings / "ggml.py") + list(FUSED_FUNCTIONS))
    root = _package_for(lib_dir, bindings)
    _compile_bindings(root / "ggml")
    sys.path.insert(0, str(root))
    _active = Runtime(lib_dir=lib_dir, package_dir=root / "ggml", origin=origin, version=version)
    return _active


def active() -> Runtime | None:
    return _active


def describe() -> dict:
    """What a dump's `source` records about the ggml that computed it."""
    rt = activate()
    return {"ggml": rt.version, "ggml_dir": str(rt.lib_dir), "ggml_origin": rt.origin}


def main() -> int:
    """`python -m graphgen.ops.runtime`: prepare the runtime once, import it, say what it is."""
    try:
        rt = activate()
        import ggml  # noqa: F401  the import itself is the check
    except (GraphgenError, ImportError, OSError) as e:
        print(f"graphgen: error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}",
              file=sys.stderr)
        return 2
    print(f"ggml {rt.version} from {rt.lib_dir} ({rt.origin})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
