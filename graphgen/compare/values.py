"""Values of two aligned nodes compared: the NMSE of llama.cpp's test-backend-ops,
sum((a-b)^2) / sum(a^2) with a = ref, NaN and Inf positions required to agree; and the bound
each node's type and op take (thresholds)."""

from __future__ import annotations

import numpy as np



DEFAULT_NMSE = {"f32": 1e-7, "f16": 1e-7, "bf16": 1e-7, "i32": 0, "i64": 0}
EXACT_TYPES = frozenset({"i8", "i16", "i32", "i64"})  # integers always compare exactly
# ops whose output order is the kernel's choice (the CPU's partial sort is one order among many):
# across backends they are compared as sorted rows
ORDER_FREE = frozenset({"TOP_K", "ARGSORT"})


def thresholds(nmse: float | dict[str, float] | None, per_op: dict[str, float] | None = None):
    table = dict(DEFAULT_NMSE)
    fallback = DEFAULT_NMSE["f32"]
    if isinstance(nmse, (int, float)) and not isinstance(nmse, bool):
        fallback = float(nmse)
        table = {t: (v if t in EXACT_TYPES else fallback) for t, v in table.items()}
    elif isinstance(nmse, dict):
        table.update(nmse)
        fallback = table.get("f32", fallback)
    elif nmse is not None:
        raise TypeError(f"nmse must be a float or a dict of type -> float, got {nmse!r}")

    per_op = dict(per_op or {})
    if "default" in per_op:
        fallback = per_op["default"]
        table = {t: (v if t in EXACT_TYPES else fallback) for t, v in table.items()}

    def threshold(typ: str, op: str = "") -> float:
        # an integer node (indices, positions, argmax) is right or wrong: no threshold loosens it
        if typ in EXACT_TYPES:
            return 0.0
        if op in per_op:
            return per_op[op]
        if typ in per_op:
            return per_op[typ]
        return float(table[typ]) if typ in table else fallback
    return threshold


def compare_values(a: np.ndarray, b: np.ndarray) -> tuple[float, float, str | None]:
    """(nmse, max abs error, reason) with a = ref; reason is set when NaN/Inf positions disagree.

    NMSE is taken over the positions finite on both sides, as test-backend-ops does after its
    NaN/Inf check.
    """
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    reason = None
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    bad = (nan_a != nan_b) | (inf_a != inf_b) | (inf_a & inf_b & (np.signbit(a) != np.signbit(b)))
    if bad.any():
        k = int(np.argmax(bad))
        reason = f"NaN/Inf positions differ ({int(bad.sum())} elements, first at {k}: {a[k]} vs {b[k]})"
    fin = np.isfinite(a) & np.isfinite(b)
    d = a[fin] - b[fin]
    err = float(np.dot(d, d))
    ref = float(np.dot(a[fin], a[fin]))
    nmse = err / ref if ref > 0 else err
    max_abs = float(np.abs(d).max()) if d.size else 0.0
    return nmse, max_abs, reason

