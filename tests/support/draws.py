"""What the random live configurations draw for sizes and scalars: everything b11739 accepts, not
the convenient values.

Head sizes run over the even sizes 8..256 (ggml's rope rotates pairs), half the time one that real
models use, most of them not powers of two; a scale worked out in double rather than float is one
ulp off for many of them (24, 72, 96, 112, 136...). Scalars are drawn over their real ranges,
log-uniform where they span decades, so that whatever graphgen derives from them (1/x, 1/sqrtf,
logf) is exercised on arbitrary float bits.
"""

from __future__ import annotations

# head sizes of published models, powers of two and not
REAL_HEAD_SIZES = (24, 40, 48, 64, 72, 80, 96, 112, 120, 128, 136, 160, 192, 256)
# sizes a test must draw somewhere: the ones where 1/sqrt(d) in double and in float part
ULP_HEAD_SIZES = (24, 72, 96, 112, 136)


def head_size(rng, lo: int = 8, hi: int = 256, multiple: int = 2) -> int:
    if rng.random() < 0.5:
        real = [d for d in REAL_HEAD_SIZES if lo <= d <= hi and d % multiple == 0]
        if real:
            return int(rng.choice(real))
    return int(rng.integers(-(-lo // multiple), hi // multiple + 1)) * multiple


def log_uniform(rng, lo: float, hi: float) -> float:
    return float(lo * (hi / lo) ** rng.random())


def rms_eps(rng) -> float:
    return log_uniform(rng, 1e-12, 1e-2)


def rope_base(rng) -> float:
    return log_uniform(rng, 1e2, 1e8)


def scale(rng, lo: float = 0.01, hi: float = 10.0) -> float:
    """A multiplier (attention, embedding, value and logit scales)."""
    return log_uniform(rng, lo, hi)


def softcap(rng) -> float:
    return log_uniform(rng, 1.0, 100.0)
