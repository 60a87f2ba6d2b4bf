"""op_params decoding over the whole range of each field: a 64-bit view offset in two slots, floats
stored bit for bit (negative, infinite, NaN), signed int32 fields, unknown enum values.

Each expectation is written from ggml's own layouts (the packing below is struct's, not graphgen's)."""

import math
import struct

import numpy as np
import pytest

from graphgen.compare.opparams import decode_op_params, format_op_params


def slots(fmt, *values):
    """Values packed little-endian as ggml writes them into op_params, read back as int32 slots."""
    raw = struct.pack("<" + fmt, *values)
    raw += b"\0" * (-len(raw) % 4)
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


@pytest.mark.parametrize("offset", [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 2**31, 5 * 2**32 + 12,
                                    2**40 + 2**31 + 7, 2**63 - 1, 2**64 - 1])
def test_view_offset_over_the_size_t_range(offset):
    # ggml_view_impl stores the size_t offset in the first two int32 slots
    assert decode_op_params("VIEW", slots("Q", offset)) == {"offset": offset}


FLOATS = [0.0, -0.0, 1e-6, -1.5, 3.4028235e38, -3.4028235e38, 1e-45, math.inf, -math.inf]


@pytest.mark.parametrize("x", FLOATS)
def test_float_fields_bit_for_bit(x):
    want = float(np.float32(x))
    assert decode_op_params("RMS_NORM", slots("f", x))["eps"] == want
    scale = decode_op_params("SCALE", slots("ff", x, -x))
    assert (scale["s"], scale["b"]) == (want, -want)
    clamp = decode_op_params("CLAMP", slots("ff", -x, x))
    assert (clamp["min"], clamp["max"]) == (-want, want)
    # ggml_rope_ext: n_past, n_dims, mode, n_ctx, n_ctx_orig, then freq_base ... beta_slow as floats
    rope = decode_op_params("ROPE", slots("iiiiiffffff", 0, 64, 2, 0, 4096, x, 1.0, 0.0, 1.0, 32.0, 1.0))
    assert rope["freq_base"] == want and rope["n_dims"] == 64 and rope["mode"] == "NEOX"


def test_nan_is_kept():
    assert math.isnan(decode_op_params("SOFT_MAX", slots("ff", math.nan, 0.0))["scale"])
    assert "nan" in format_op_params("SOFT_MAX", slots("ff", math.nan, 0.0))


@pytest.mark.parametrize("v", [0, 1, -1, 2**31 - 1, -(2**31)])
def test_int32_fields_keep_their_sign(v):
    assert decode_op_params("ROLL", slots("iiii", v, -v if v != -(2**31) else 0, 0, 3))["shift0"] == v
    assert decode_op_params("PAD", slots("iiiiiiii", v, 0, 0, 0, 0, 0, 0, 0))["lp0"] == v
    assert decode_op_params("FLASH_ATTN_EXT", slots("fffii", 0.125, 0.0, 0.0, 10, v))["n_kv_max"] == v
    assert decode_op_params("CONCAT", [v])["dim"] == v


def test_unknown_enum_values_stay_numbers():
    assert decode_op_params("ARGSORT", [7])["order"] == 7
    assert decode_op_params("MUL_MAT", [99, 5, 0, 20]) == {"prec": 99, "hint": 5, "prec_src1": "F16"}
    assert decode_op_params("ROPE", slots("iii", 0, 8, 3))["mode"] == 3


@pytest.mark.parametrize("bad", [[2**31], [-(2**31) - 1], [0] * 17, [1.5], [True], "0"])
def test_slots_outside_int32_are_refused(bad):
    with pytest.raises(ValueError, match="op_params"):
        decode_op_params("VIEW", bad)
