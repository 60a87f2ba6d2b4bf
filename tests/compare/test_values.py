"""graphgen.compare.values: test-backend-ops' NMSE over the positions finite on both sides, NaN and
Inf positions that must agree, and the bound each node's type and op take."""

import numpy as np
import pytest

from graphgen.compare.values import DEFAULT_NMSE, compare_values, thresholds


def test_nmse_is_the_squared_error_over_the_references_energy():
    # err = 0^2 + 0^2 + 1^2 = 1, ref = 1 + 4 + 4 = 9
    nmse, max_abs, reason = compare_values(np.array([1.0, 2.0, 2.0]), np.array([1.0, 2.0, 3.0]))
    assert nmse == pytest.approx(1 / 9) and max_abs == 1.0 and reason is None
    # a = ref: the other way round the energy is ours's (1 + 4 + 9)
    assert compare_values(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 2.0]))[0] == pytest.approx(1 / 14)


def test_equal_values_give_zero_and_shapes_are_flattened():
    a = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    assert compare_values(a, a.ravel()) == (0.0, 0.0, None)


def test_a_zero_reference_gives_the_plain_squared_error():
    nmse, max_abs, reason = compare_values(np.zeros(3), np.array([0.0, 0.5, -0.5]))
    assert nmse == pytest.approx(0.5) and max_abs == 0.5 and reason is None


def test_nan_positions_must_agree():
    a = np.array([1.0, np.nan, 3.0, np.nan])
    nmse, _, reason = compare_values(a, np.array([1.0, np.nan, 3.0, np.nan]))
    assert nmse == 0.0 and reason is None          # NaN where the reference has NaN: fine
    nmse, _, reason = compare_values(a, np.array([1.0, np.nan, np.nan, 7.0]))
    assert reason is not None and "2 elements" in reason and "first at 2" in reason
    # the error is taken over the positions finite on both sides alone (0 and nothing else)
    assert nmse == 0.0


def test_inf_must_agree_in_sign_too():
    same = compare_values(np.array([np.inf, -np.inf, 1.0]), np.array([np.inf, -np.inf, 1.0]))
    assert same == (0.0, 0.0, None)
    _, _, reason = compare_values(np.array([np.inf, 1.0]), np.array([-np.inf, 1.0]))
    assert reason is not None and "first at 0" in reason
    _, _, reason = compare_values(np.array([2.0, np.inf]), np.array([2.0, 5.0]))
    assert reason is not None and "1 elements" in reason and "first at 1" in reason


def test_default_thresholds():
    thr = thresholds(None)
    assert thr("f32") == thr("f16") == thr("bf16") == DEFAULT_NMSE["f32"] == 1e-7
    assert thr("i32") == 0.0 and thr("i64") == 0.0
    assert thr("q8_0") == 1e-7          # a type the table lacks takes the f32 bound


def test_a_single_nmse_loosens_every_float_type_but_no_integer():
    thr = thresholds(1e-3)
    assert thr("f32") == thr("f16") == thr("q4_0") == 1e-3
    assert thr("i32") == 0.0 and thr("i8") == 0.0 and thr("i16", "ARGMAX") == 0.0


def test_a_table_of_types_replaces_only_the_types_it_names():
    thr = thresholds({"f16": 1e-4})
    assert thr("f16") == 1e-4 and thr("f32") == 1e-7 and thr("bf16") == 1e-7


@pytest.mark.parametrize("per_op", [{"MUL_MAT": 1.0}, {"i32": 1.0}, {"default": 1.0},
                                    {"MUL_MAT": 1.0, "i32": 1.0, "default": 1.0}])
def test_integer_nodes_stay_exact_whatever_the_per_op_bounds(per_op):
    assert thresholds(1.0, per_op)("i32", "MUL_MAT") == 0.0


def test_per_op_bounds_the_op_first_then_the_type_then_default():
    thr = thresholds(1e-6, {"MUL_MAT": 5e-4, "f16": 1e-5, "default": 2e-6})
    assert thr("f16", "MUL_MAT") == 5e-4   # the op wins over the type
    assert thr("f16", "ADD") == 1e-5
    assert thr("f32", "ADD") == 2e-6       # "default" replaces the nmse given
    assert thr("bf16") == 2e-6
    assert thresholds(None, {"ROPE": 3e-3})("f32", "ADD") == 1e-7


@pytest.mark.parametrize("bad", ["1e-7", [1e-7], True])
def test_a_threshold_that_is_neither_number_nor_table_is_refused(bad):
    # a bool is an int to Python, but not an NMSE
    with pytest.raises(TypeError, match="nmse must be a float or a dict"):
        thresholds(bad)

