"""graphgen.runtime.mt19937: std::mt19937 and libstdc++'s uniform_real_distribution<double>, bit
for bit. The raw draws are checked against numpy's RandomState (the same Mersenne Twister, seeded
the same way for an integer seed) and the C++ standard's own check value."""

import math

import numpy as np
import pytest

from graphgen.runtime.mt19937 import MT19937, generate_canonical, uniform_real


def numpy_draws(seed, n):
    return np.random.RandomState(seed).randint(0, 2**32, size=n, dtype=np.uint64).tolist()


@pytest.mark.parametrize("seed", [5489, 0, 1, 42, 2**32 - 1])
def test_raw_draws_are_the_mersenne_twisters(seed):
    g = MT19937(seed)
    # past one twist of the 624-word state too
    assert [g() for _ in range(1300)] == numpy_draws(seed, 1300)


def test_the_standards_check_value():
    # [rand.predef]: the 10000th consecutive invocation of a default-constructed std::mt19937 is 4123659995
    g = MT19937()
    g.discard(9999)
    assert g() == 4123659995


def test_seed_is_taken_modulo_2_32_and_reseeding_restarts():
    a, b = MT19937(2**32 + 7), MT19937(7)
    assert [a() for _ in range(5)] == [b() for _ in range(5)]
    a.seed(7)
    assert a() == numpy_draws(7, 1)[0]
    a.seed()
    assert a() == 3499211612 and MT19937.min == 0 and MT19937.max == 2**32 - 1


def test_generate_canonical_is_two_draws_in_double():
    g, draws = MT19937(11), numpy_draws(11, 6)
    for k in range(3):
        lo, hi = draws[2 * k], draws[2 * k + 1]
        assert generate_canonical(g) == (float(lo) + float(hi) * 2.0**32) / 2.0**64


def test_a_canonical_of_one_becomes_the_largest_double_below_it():
    class Top:
        min = 0

        def __call__(self):
            return 2**32 - 1
    assert generate_canonical(Top()) == math.nextafter(1.0, 0.0) < 1.0


def test_uniform_real_scales_the_canonical():
    g1, g2 = MT19937(3), MT19937(3)
    for _ in range(4):
        c = generate_canonical(g2)
        assert uniform_real(g1, -2.0, 6.0) == c * 8.0 - 2.0
    g = MT19937(9)
    xs = [uniform_real(g) for _ in range(2000)]
    assert 0.0 <= min(xs) and max(xs) < 1.0 and abs(sum(xs) / len(xs) - 0.5) < 0.05
