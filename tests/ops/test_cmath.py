"""graphgen.ops.cmath: float32 math as the C++ host code works it (expf, logf from the C library,
1.0f/sqrtf(n), 1.0f/x, the samplers' float32 softmax)."""

import math

import numpy as np
import pytest

from graphgen.ops.cmath import expf, inv_sqrtf, logf, recipf, softmaxf, sqrtf


@pytest.mark.parametrize("x", [0.0, 1.0, -1.5, 3.25, -20.0, 0.1])
def test_expf_and_logf_are_float32_and_within_an_ulp_of_the_exact_value(x):
    e = expf(x)
    assert isinstance(e, np.float32)
    assert abs(float(e) - math.exp(np.float32(x))) <= float(np.spacing(np.float32(math.exp(np.float32(x)))))
    if x > 0:
        lg = logf(x)
        assert isinstance(lg, np.float32)
        assert abs(float(lg) - math.log(np.float32(x))) <= float(np.spacing(np.float32(abs(math.log(x)) or 1)))
    assert expf(0.0) == 1.0 and logf(1.0) == 0.0


@pytest.mark.parametrize("n", [16, 24, 64, 72, 96, 112, 128, 136])
def test_inv_sqrtf_is_worked_in_float(n):
    want = np.float32(1.0) / np.sqrt(np.float32(n))
    assert inv_sqrtf(n) == float(want) and isinstance(inv_sqrtf(n), float)
    assert sqrtf(n) == np.sqrt(np.float32(n)) and isinstance(sqrtf(n), np.float32)


def test_inv_sqrtf_parts_from_the_double_value_where_it_should():
    # for these head sizes 1/sqrt(n) in double rounds to another float than 1.0f/sqrtf(n)
    assert inv_sqrtf(24) != float(np.float32(1.0 / math.sqrt(24)))
    assert inv_sqrtf(16) == 0.25


def test_recipf():
    assert recipf(3.0) == float(np.float32(1.0) / np.float32(3.0))
    assert recipf(30.0) != 1 / 30.0 and recipf(0.5) == 2.0


def test_softmaxf():
    assert softmaxf([0.0, 0.0]).tolist() == [0.5, 0.5]
    assert softmaxf([5.0]).tolist() == [1.0]
    p = softmaxf([2.0, 1.0, -1.0])
    assert p.dtype == np.float32 and p[0] > p[1] > p[2]
    ex = np.exp(np.array([0.0, -1.0, -3.0]))
    np.testing.assert_allclose(p, ex / ex.sum(), rtol=1e-6)
    # shifted by the first logit: large logits stay finite
    big = softmaxf([1000.0, 999.0])
    assert np.isfinite(big).all() and big[0] == pytest.approx(1 / (1 + math.exp(-1)), rel=1e-6)
    assert softmaxf([]).tolist() == []
