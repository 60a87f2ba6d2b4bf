"""Weights used in place: a GGUF mapped read-only, and the process's mmap default.

Nothing here imports ggml, so the command line can set the default (--no-mmap) before --ggml has
chosen which ggml loads, and the llama.cpp engine's parent process stays free of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from pathlib import Path

from ..errors import GGUFModelError

# set (to "1") while a command runs with --no-mmap; child processes see it too
ENV_NO_MMAP = "GRAPHGEN_NO_MMAP"


def mmap_default() -> bool:
    """Whether a model loaded without an explicit use_mmap maps its weights (llama.cpp's default)."""
    return os.environ.get(ENV_NO_MMAP, "") != "1"


@contextlib.contextmanager
def no_mmap(enabled: bool = True):
    """Within the block, models load their weights by copying (--no-mmap)."""
    before = os.environ.get(ENV_NO_MMAP)
    if enabled:
        os.environ[ENV_NO_MMAP] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_NO_MMAP, None)
        else:
            os.environ[ENV_NO_MMAP] = before


_PROT_READ, _MAP_SHARED = 1, 1


@functools.lru_cache(maxsize=None)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


class MappedFile:
    """A GGUF mapped read-only, shared with the page cache (several processes loading one draft
    hold its weights once), with the size and mtime it had when mapped.

    The file descriptor stays open so that the checks look at the mapped file itself: a file
    written in place would be read half old, half new (and a truncated one faults), while one
    replaced by a rename leaves the mapping on the old, whole contents."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(self.fd)
        self.size = st.st_size
        self.stamp = (st.st_size, st.st_mtime_ns)
        addr = _libc().mmap(None, self.size, _PROT_READ, _MAP_SHARED, self.fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise GGUFModelError(f"{path}: cannot map the file ({os.strerror(err)}); try --no-mmap")
        self.addr = addr

    def changed(self) -> str | None:
        """What changed since the file was mapped (None when nothing did)."""
        st = os.fstat(self.fd)
        if st.st_size != self.stamp[0]:
            return f"its size went from {self.stamp[0]} to {st.st_size} bytes"
        if st.st_mtime_ns != self.stamp[1]:
            return "it was modified"
        return None

    def close(self):
        if self.addr is not None:
            _libc().munmap(self.addr, self.size)
            self.addr = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def llama_model_params(lib):
    """llama.cpp's default model parameters, with use_mmap as this process's default: the
    llama.cpp engine's child processes honour --no-mmap too."""
    params = lib.llama_model_default_params()
    if not mmap_default():
        # b11739 names its loading by mode; LLAMA_LOAD_MODE_NONE reads into buffers (the older
        # --no-mmap, now --load-mode none); the default, AUTO, maps where the devices allow
        params.load_mode = 0
    return params
