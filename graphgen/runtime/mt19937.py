"""std::mt19937 and std::uniform_real_distribution<double>, bit for bit as libstdc++ runs them.

The DFlash2 driver samples its lattice walk with these, so a seed drafts upstream's tokens.
libstdc++'s uniform_real_distribution<double>(a, b) is generate_canonical<double, 53>: two 32-bit
draws g1, g2 summed in double as g1 + g2 * 2^32, divided by 2^64 (a result of 1.0 becomes the
largest double below 1), then scaled to [a, b).
"""

from __future__ import annotations

import math

_N, _M = 624, 397
_MATRIX_A = 0x9908B0DF
_UPPER, _LOWER = 0x80000000, 0x7FFFFFFF
_MASK32 = 0xFFFFFFFF
_TWO32 = 4294967296.0
_BELOW_ONE = math.nextafter(1.0, 0.0)


class MT19937:
    """std::mt19937 (32-bit Mersenne Twister); default-constructed with seed 5489, as in C++."""

    default_seed = 5489
    min = 0
    max = _MASK32

    def __init__(self, seed: int = default_seed):
        self.seed(seed)

    def seed(self, value: int = default_seed) -> None:
        """std::mersenne_twister_engine::seed(result_type): the value is taken modulo 2^32."""
        mt = [0] * _N
        mt[0] = int(value) & _MASK32
        for i in range(1, _N):
            prev = mt[i - 1]
            mt[i] = (1812433253 * (prev ^ (prev >> 30)) + i) & _MASK32
        self._mt = mt
        self._i = _N

    def _twist(self) -> None:
        mt = self._mt
        for k in range(_N):
            y = (mt[k] & _UPPER) | (mt[(k + 1) % _N] & _LOWER)
            mt[k] = mt[(k + _M) % _N] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)
        self._i = 0

    def __call__(self) -> int:
        if self._i >= _N:
            self._twist()
        y = self._mt[self._i]
        self._i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y & _MASK32

    def discard(self, n: int) -> None:
        for _ in range(n):
            self()


def generate_canonical(gen: MT19937) -> float:
    """std::generate_canonical<double, 53>(gen) for a 32-bit generator (libstdc++)."""
    s = float(gen() - gen.min)
    s += float(gen() - gen.min) * _TWO32
    ret = s / (_TWO32 * _TWO32)
    if ret >= 1.0:
        ret = _BELOW_ONE
    return ret


def uniform_real(gen: MT19937, a: float = 0.0, b: float = 1.0) -> float:
    """std::uniform_real_distribution<double>(a, b)(gen) in libstdc++."""
    return generate_canonical(gen) * (b - a) + a
