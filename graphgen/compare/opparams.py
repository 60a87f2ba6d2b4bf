"""op_params decoded per op, by ggml 0.27.0's layouts.

A node's op_params are 16 int32 slots whose meaning depends on the op: floats stored bit for bit
(an eps of 1e-6 reads 897988541 as an int), enums, a 64-bit offset over two slots. Ops are named
as `ggml_op_desc` prints them, so a unary op arrives as its own name (`SILU`) and a GLU op as
its GLU name (`SWIGLU`). An op without a layout here keeps its raw ints.
"""

from __future__ import annotations

import math
import struct

N_SLOTS = 16

UNARY_OPS = ("ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "GELU", "GELU_QUICK", "SILU",
             "HARDSWISH", "HARDSIGMOID", "EXP", "EXPM1", "SOFTPLUS", "GELU_ERF", "XIELU", "FLOOR", "CEIL",
             "ROUND", "TRUNC")
GLU_OPS = ("REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK", "SWIGLU_CLAMP")
ROPE_MODES = {0: "NORMAL", 2: "NEOX", 8: "MROPE", 24: "VISION", 40: "IMROPE"}
ROPE_MROPE_BIT = 8
PRECISIONS = {0: "DEFAULT", 10: "F32", 15: "BF16", 20: "F16", 30: "Q8", 40: "Q4"}
SORT_ORDERS = {0: "ASC", 1: "DESC"}
OP_HINTS = {0: "NONE", 1: "SRC0_IS_HADAMARD"}
TRI_TYPES = {0: "UPPER_DIAG", 1: "UPPER", 2: "LOWER_DIAG", 3: "LOWER"}

# ops that carry no op_params (their operands say everything)
NO_PARAMS = frozenset({
    "NONE", "DUP", "ADD", "ADD1", "ADD_ID", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SIN", "COS", "SUM",
    "SUM_ROWS", "MEAN", "ARGMAX", "COUNT_EQUAL", "REPEAT", "REPEAT_BACK", "CPY", "CONT", "RESHAPE",
    "TRANSPOSE", "GET_ROWS", "GET_ROWS_BACK", "SET_ROWS", "DIAG", "OUT_PROD", "TOP_K", "CUMSUM",
    "DSV4_HC_POST", "SOLVE_TRI",
})


def _f32(x: int) -> float:
    return struct.unpack("<f", struct.pack("<i", x))[0]


def _enum(table: dict[int, str], x: int) -> str | int:
    return table.get(x, x)


def _i32(slot):
    return lambda p: p[slot]


def _f(slot):
    return lambda p: _f32(p[slot])


def _e(slot, table):
    return lambda p: _enum(table, p[slot])


def _bool(slot):
    return lambda p: bool(p[slot])


_EPS = {"eps": _f(0)}
_ROPE = {"n_dims": _i32(1), "mode": lambda p: _enum(ROPE_MODES, p[2]), "n_ctx_orig": _i32(4),
         "freq_base": _f(5), "freq_scale": _f(6), "ext_factor": _f(7), "attn_factor": _f(8),
         "beta_fast": _f(9), "beta_slow": _f(10), "sections": lambda p: list(p[11:15]),
         "n_offs": _i32(15)}
_ACC = {"nb1": _i32(0), "nb2": _i32(1), "nb3": _i32(2), "offset": _i32(3), "inplace": _bool(4)}
_UNARY = {"unary": _e(0, dict(enumerate(UNARY_OPS)))}
_GLU = {"glu": _e(0, dict(enumerate(GLU_OPS))), "swapped": _bool(1)}
_MUL_MAT = {"prec": _e(0, PRECISIONS), "hint": _e(1, OP_HINTS), "prec_src1": _e(3, PRECISIONS)}

LAYOUTS: dict[str, dict] = {
    "RMS_NORM": _EPS, "NORM": _EPS, "L2_NORM": _EPS, "RMS_NORM_BACK": _EPS,
    "GROUP_NORM": {"n_groups": _i32(0), "eps": _f(1)},
    "ROPE": _ROPE, "ROPE_BACK": _ROPE, "ROPE_MULTI": _ROPE,
    "SOFT_MAX": {"scale": _f(0), "max_bias": _f(1)},
    "SOFT_MAX_BACK": {"scale": _f(0), "max_bias": _f(1)},
    "FLASH_ATTN_EXT": {"scale": _f(0), "max_bias": _f(1), "logit_softcap": _f(2),
                       "precision": _e(3, PRECISIONS), "n_kv_max": _i32(4)},
    "SCALE": {"s": _f(0), "b": _f(1)},
    "CLAMP": {"min": _f(0), "max": _f(1)},
    "FILL": {"c": _f(0)},
    "ARANGE": {"start": _f(0), "stop": _f(1), "step": _f(2)},
    "LEAKY_RELU": {"negative_slope": _f(0)},
    "VIEW": {"offset": lambda p: (p[0] & 0xFFFFFFFF) | ((p[1] & 0xFFFFFFFF) << 32)},
    "PERMUTE": {"axes": lambda p: list(p[:4])},
    "CONCAT": {"dim": _i32(0)},
    "ARGSORT": {"order": _e(0, SORT_ORDERS)},
    "PAD": {"lp0": _i32(0), "rp0": _i32(1), "lp1": _i32(2), "rp1": _i32(3), "lp2": _i32(4), "rp2": _i32(5),
            "lp3": _i32(6), "rp3": _i32(7), "circular": _bool(8)},
    "ACC": _ACC, "SET": _ACC,
    "MUL_MAT": _MUL_MAT, "MUL_MAT_ID": _MUL_MAT,
    "DIAG_MASK_INF": {"n_past": _i32(0)}, "DIAG_MASK_ZERO": {"n_past": _i32(0)},
    "TRI": {"type": _e(0, TRI_TYPES)},
    "ROLL": {"shift0": _i32(0), "shift1": _i32(1), "shift2": _i32(2), "shift3": _i32(3)},
    "TIMESTEP_EMBEDDING": {"dim": _i32(0), "max_period": _i32(1)},
    "DSV4_HC_COMB": {"eps": _f(0), "n_iter": _i32(1)},
    "DSV4_HC_PRE": {"scale": _f(0), "gated": _bool(1)},
    "UNARY": _UNARY, "GLU": _GLU,
}
for _name in UNARY_OPS:
    LAYOUTS.setdefault(_name, _UNARY)
for _name in GLU_OPS:
    LAYOUTS.setdefault(_name, _GLU)
LAYOUTS["SWIGLU_OAI"] = {**_GLU, "alpha": _f(2), "limit": _f(3)}
LAYOUTS["SWIGLU_CLAMP"] = {**_GLU, "limit": _f(3)}


def _checked(op: str, params) -> list[int]:
    if not isinstance(op, str) or not op:
        raise ValueError(f"op must be an op name, got {op!r}")
    if not isinstance(params, (list, tuple)) or len(params) > N_SLOTS:
        raise ValueError(f"op_params of {op}: expected a list of at most {N_SLOTS} int32 values, got {params!r}")
    for k, x in enumerate(params):
        if not isinstance(x, int) or isinstance(x, bool) or not -(2**31) <= x < 2**31:
            raise ValueError(f"op_params[{k}] of {op}: expected an int32, got {x!r}")
    return list(params) + [0] * (N_SLOTS - len(params))


def raw_params(params: list[int]) -> list[int]:
    """The ints up to the last non-zero one."""
    p = list(params)
    while p and p[-1] == 0:
        p.pop()
    return p


def decode_op_params(op: str, params: list[int], ne: list[int] | None = None) -> dict[str, object]:
    """Names -> decoded values for `op`'s op_params; {"raw": [...]} for an op without a layout.

    `ne` (the node's shape) adds what an op keeps in its shape rather than its params: TOP_K's k.
    """
    p = _checked(op, params)
    layout = LAYOUTS.get(op)
    if layout is None:
        if op in NO_PARAMS:
            out: dict[str, object] = {}
            if op == "TOP_K" and ne:
                out["k"] = int(ne[0])
            # a param-less op with params set is worth seeing rather than hiding
            if raw_params(p):
                out["raw"] = raw_params(p)
            return out
        return {"raw": raw_params(p)}
    return {name: get(p) for name, get in layout.items()}


def _fmt_value(v) -> str:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.7g}"
    if isinstance(v, list):
        return "[" + ",".join(_fmt_value(x) for x in v) + "]"
    return str(v)


def _omit(op: str, name: str, value, d: dict) -> bool:
    """Fields left out of the short text when they hold their construction default."""
    if name in ("sections",):
        return not (isinstance(d.get("mode"), int) and d["mode"] & ROPE_MROPE_BIT
                    or d.get("mode") in ("MROPE", "VISION", "IMROPE"))
    if name in ("n_offs", "n_kv_max", "swapped", "circular", "inplace") and not value:
        return True
    if name in ("prec", "precision", "prec_src1") and value == "DEFAULT" or name == "hint" and value == "NONE":
        return True
    if op == "PAD" and name != "circular" and value == 0:
        return True
    if name == "raw" and not value:
        return True
    return False


def format_op_params(op: str, params: list[int], ne: list[int] | None = None) -> str:
    """Short text such as `eps=1e-06` or `n_dims=64 mode=NEOX freq_base=10000 ...`; "" when the op
    carries nothing."""
    d = decode_op_params(op, params, ne)
    if set(d) == {"raw"}:
        return f"op_params={_fmt_value(d['raw'])}" if d["raw"] else ""
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in d.items() if not _omit(op, k, v, d))
