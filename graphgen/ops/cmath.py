"""The C library's float32 math, as the C++ host code calls it (expf, logf): numpy's float32
functions may round the last bit otherwise. Loaded once; numpy's stand in without a libm."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np


def _load(name: str, fallback):
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = getattr(libm, name)
    except (OSError, AttributeError):
        return lambda x: fallback(np.float32(x))
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda x: np.float32(fn(float(x)))


expf = _load("expf", np.exp)
logf = _load("logf", np.log)
