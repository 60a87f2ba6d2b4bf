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


def sqrtf(x) -> np.float32:
    """IEEE sqrt is correctly rounded in any precision, so numpy's float32 sqrt is sqrtf."""
    return np.sqrt(np.float32(x))


def inv_sqrtf(n) -> float:
    """1.0f/sqrtf(float(n)): the attention scales. Worked in double, 1/sqrt(n) lands one float
    ulp away for many head sizes (24, 72, 96, 112, 136...), which a graph-diff sees in op_params."""
    return float(np.float32(1.0) / sqrtf(n))


def recipf(x) -> float:
    """1.0f / x with x a float (softcaps)."""
    return float(np.float32(1.0) / np.float32(x))


def softmaxf(logits) -> np.ndarray:
    """Softmax as the samplers' host code runs it, in float32 with expf: shifted by the first (best)
    logit, summed in order, each term divided by the sum."""
    lg = np.asarray(logits, dtype=np.float32)
    mx = lg[0] if len(lg) else np.float32(0)
    ex = [expf(np.float32(v - mx)) for v in lg]
    s = np.float32(0)
    for e in ex:
        s = np.float32(s + e)
    return np.array([np.float32(e / s) for e in ex], dtype=np.float32)
