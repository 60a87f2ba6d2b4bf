"""Load the reference llama.cpp (PyPI llama-cpp-py-sync, build b11739) on any glibc.

The wheel's shared objects ask for symbol version GLIBC_2.38, but only for four C23 parsing
entry points (__isoc23_strtol & co). On an older glibc we copy the libraries into a cache
folder, mark that version requirement weak in each copy's .gnu.version_r table, and load a
tiny shim that defines the four names first (RTLD_GLOBAL), so the copies bind to it.
site-packages is never modified.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path

from . import cache

ENV_LLAMA_DIR = "GRAPHGEN_LLAMA_DIR"
REFERENCE_PACKAGE = "llama-cpp-py-sync"
REFERENCE_VERSION = "0.11739"
REFERENCE_BUILD = "b11739"
LIB_NAMES = ("libggml-base.so.0", "libggml-cpu.so.0", "libggml-rpc.so.0", "libggml.so.0", "libllama.so.0")

SHT_GNU_VERNEED = 0x6FFFFFFE
VER_FLG_WEAK = 0x2

SHIM_SOURCE = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
long __isoc23_strtol(const char *s, char **e, int b) { return strtol(s, e, b); }
unsigned long __isoc23_strtoul(const char *s, char **e, int b) { return strtoul(s, e, b); }
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return strtoull(s, e, b); }
int __isoc23_sscanf(const char *s, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt); int r = vsscanf(s, fmt, ap); va_end(ap); return r;
}
"""


class ReferenceUnavailable(RuntimeError):
    """The reference llama.cpp cannot be loaded on this machine; the message says why."""


def glibc_version() -> tuple[int, int] | None:
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    if not name.startswith("glibc "):
        return None
    major, minor = name.split()[1].split(".")[:2]
    return int(major), int(minor)


def package_dir() -> Path:
    try:
        import llama_cpp_py_sync
    except ImportError as e:
        raise ReferenceUnavailable(
            f"the reference engine needs {REFERENCE_PACKAGE}=={REFERENCE_VERSION}: "
            "it is one of graphgen's dependencies: pip install -e .") from e
    from importlib.metadata import version
    have = version(REFERENCE_PACKAGE)
    if have != REFERENCE_VERSION:
        raise ReferenceUnavailable(
            f"{REFERENCE_PACKAGE} {have} is installed, the reference is {REFERENCE_VERSION} "
            f"(build {REFERENCE_BUILD}): pip install {REFERENCE_PACKAGE}=={REFERENCE_VERSION}")
    return Path(llama_cpp_py_sync.__file__).parent


def lib_file(folder: Path, base: str) -> Path | None:
    """lib<base>.so in folder, or its versioned name (lib<base>.so.0) as wheels and installs ship it."""
    plain = folder / f"lib{base}.so"
    if plain.exists():
        return plain
    versioned = sorted(folder.glob(f"lib{base}.so.*"), key=lambda p: len(p.name))
    if versioned:
        return versioned[0]
    dylib = folder / f"lib{base}.dylib"
    return dylib if dylib.exists() else None


def custom_llama_dir() -> Path | None:
    """The llama.cpp build chosen with --llama / $GRAPHGEN_LLAMA_DIR, or None for b11739's wheel."""
    d = os.environ.get(ENV_LLAMA_DIR)
    return Path(d).expanduser().resolve() if d else None


def reference_label() -> str:
    d = custom_llama_dir()
    return f"llama.cpp at {d}" if d is not None else f"llama.cpp {REFERENCE_BUILD}"


def cache_root() -> Path:
    """Where graphgen's cache entries go (graphgen.cache)."""
    return cache.root()


def weaken_version_need(path: Path, version_name: bytes) -> int:
    """Set VER_FLG_WEAK on every Vernaux entry called `version_name`; return how many."""
    data = bytearray(path.read_bytes())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ReferenceUnavailable(f"{path.name}: not a little-endian ELF64 file")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        sh_type, = struct.unpack_from("<I", data, off + 4)
        sh_offset, sh_size = struct.unpack_from("<QQ", data, off + 0x18)
        sh_link, = struct.unpack_from("<I", data, off + 0x28)
        sections.append((sh_type, sh_offset, sh_size, sh_link))
    patched = 0
    for sh_type, sh_offset, _, sh_link in sections:
        if sh_type != SHT_GNU_VERNEED:
            continue
        strtab = sections[sh_link][1]
        need = sh_offset
        while True:
            _, vn_cnt, _, vn_aux, vn_next = struct.unpack_from("<HHIII", data, need)
            aux = need + vn_aux
            for _ in range(vn_cnt):
                _, flags, _, name_off, vna_next = struct.unpack_from("<IHHII", data, aux)
                end = data.index(b"\0", strtab + name_off)
                if bytes(data[strtab + name_off:end]) == version_name:
                    struct.pack_into("<H", data, aux + 4, flags | VER_FLG_WEAK)
                    patched += 1
                if not vna_next:
                    break
                aux += vna_next
            if not vn_next:
                break
            need += vn_next
    path.write_bytes(bytes(data))
    return patched


def build_c_library(name: str, source: str, why: str) -> Path:
    """Compile `source` into a shared object once, cached by its digest; `why` names the need."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    so = f"lib{name.replace('-', '_')}.so"
    found = cache.find(f"{name}-{digest}", marker=so)
    if found is not None:
        return found / so
    lib = cache_root() / f"{name}-{digest}" / so
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise ReferenceUnavailable(f"{why}: a C compiler (cc or gcc) is required to build {lib.name}")
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.parent / f"build.{os.getpid()}"
    (tmp.with_suffix(".c")).write_text(source)
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(tmp.with_suffix(".c")), "-ldl"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReferenceUnavailable(f"building {lib.name} failed: {proc.stderr.strip()}")
    os.chmod(tmp, 0o755)
    os.chmod(lib.parent, 0o755)
    os.replace(tmp, lib)
    return lib


def glibc_shim() -> Path | None:
    """The shim defining the four C23 names, built once into the cache; None on glibc >= 2.38."""
    glibc = glibc_version()
    if glibc is None or glibc >= (2, 38):
        return None
    return build_c_library("glibc-shim", SHIM_SOURCE,
                           f"glibc {glibc[0]}.{glibc[1]} is older than 2.38, which the reference wheel needs")


def prepare_libraries() -> tuple[Path, Path | None]:
    """Return (folder holding loadable libraries, shim path or None)."""
    src = package_dir()
    missing = [n for n in LIB_NAMES if not (src / n).is_file()]
    if missing:
        raise ReferenceUnavailable(f"{REFERENCE_PACKAGE} is missing {', '.join(missing)} in {src}")
    shim = glibc_shim()
    if shim is None:
        return src, None
    digest = hashlib.sha256()
    for n in LIB_NAMES:
        st = (src / n).stat()
        digest.update(f"{n}:{st.st_size}:{st.st_mtime_ns}".encode())
    name = f"llama-{REFERENCE_BUILD}-{digest.hexdigest()[:12]}"
    found = cache.find(name)
    if found is not None:
        return found, shim
    dest = cache_root() / name
    if not (dest / ".complete").exists():
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for n in LIB_NAMES:
            shutil.copy2(src / n, tmp / n)
            weaken_version_need(tmp / n, b"GLIBC_2.38")
        (tmp / ".complete").write_text("ok\n")
        cache.publish(tmp)
        try:
            tmp.rename(dest)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return dest, shim


_LOADED: dict = {}


def load_llama():
    """Load libllama through the wheel's CFFI declarations; returns (ffi, lib, libdir).

    With --llama DIR that libllama must speak b11739's C API (llama_batch_ext, llama_process):
    the declarations are the wheel's."""
    if "lib" in _LOADED:
        return _LOADED["ffi"], _LOADED["lib"], _LOADED["dir"]
    custom = custom_llama_dir()
    if custom is not None:
        # a developer's own build: its libllama and the ggml it was linked with, as they are
        libdir, shim = custom, None
        path = lib_file(libdir, "llama")
        if path is None:
            raise ReferenceUnavailable(f"{libdir} (${ENV_LLAMA_DIR} / --llama) holds no libllama.so")
    else:
        libdir, shim = prepare_libraries()
        path = libdir / "libllama.so.0"
    if shim is not None:
        ctypes.CDLL(str(shim), mode=ctypes.RTLD_GLOBAL)
    try:
        from llama_cpp_py_sync._cffi_bindings import ffi
    except ImportError as e:
        raise ReferenceUnavailable(f"the reference engine declares llama.h through {REFERENCE_PACKAGE}=={REFERENCE_VERSION}: "
                                   "pip install it") from e
    try:
        lib = ffi.dlopen(str(path))
    except OSError as e:
        raise ReferenceUnavailable(f"cannot load {path}: {e}") from e
    _LOADED.update(ffi=ffi, lib=lib, dir=libdir)
    return ffi, lib, libdir
