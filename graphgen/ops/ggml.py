"""The one place where graphgen touches ggml-python.

Re-exports the ggml functions the builders call under their C names, so a builder reads like
upstream's C++ (`ggml_reshape_3d(ctx0, cur, ...)`), and fixes the ggml-python bindings whose
pointer return types are declared as integers (ctypes would truncate the pointer).
"""

from __future__ import annotations

import ctypes
import os

from .runtime import activate

# ggml-vulkan skips CPU-type devices (lavapipe) unless they are listed here; it reads this at its
# first initialisation, and a process without a visible device aborts on some Vulkan calls
os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")

RUNTIME = activate()

import ggml as _g  # noqa: E402
from ggml import *  # noqa: F401,F403,E402  the C API under its own names

lib = _g.lib

# Bindings declared with a NewType(int) restype: ctypes truncates the returned pointer to 32 bits.
_POINTER_RESTYPE = (
    "ggml_backend_sched_get_tensor_backend", "ggml_backend_alloc_buffer",
    "ggml_backend_cpu_buffer_from_ptr", "ggml_backend_cpu_buffer_type",
    "ggml_backend_reg_init_backend_from_str", "ggml_backend_reg_init_backend",
    "ggml_backend_reg_get_default_buffer_type", "ggml_backend_reg_alloc_buffer",
    "ggml_backend_vk_buffer_type", "ggml_backend_vk_host_buffer_type",
    "ggml_backend_cpu_init", "ggml_backend_sched_new", "ggml_backend_alloc_ctx_tensors",
    "ggml_backend_get_default_buffer_type", "ggml_backend_buffer_get_base",
    "ggml_backend_dev_by_type", "ggml_backend_dev_init", "ggml_backend_dev_get",
    "ggml_backend_init_by_type", "ggml_backend_init_best", "ggml_backend_reg_get",
    "ggml_backend_reg_by_name", "ggml_backend_dev_buffer_type", "ggml_backend_get_device",
    "ggml_backend_init_by_name",
)
for _name in _POINTER_RESTYPE:
    _fn = getattr(lib, _name, None)
    if _fn is not None:
        _fn.restype = ctypes.c_void_p

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_I32 = 26
GGML_TYPE_I64 = 27
GGML_PREC_F32 = 10
GGML_ROPE_TYPE_NEOX = 2
GGML_ROPE_TYPE_MROPE = 8
GGML_ROPE_TYPE_IMROPE = 40

_ctx_p = ctypes.c_void_p
_tensor_p = ctypes.POINTER(_g.ggml_tensor)


def _declare(name: str, argtypes: list, restype):
    """A ggml function ggml-python does not bind, declared here (runtime.py checked it exists)."""
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


# upstream's fused ops (ggml >= 0.26.0), with their C signatures
ggml_dsv4_hc_pre = _declare("ggml_dsv4_hc_pre", [_ctx_p, _tensor_p, _tensor_p], _tensor_p)
ggml_dsv4_hc_pre_gated = _declare("ggml_dsv4_hc_pre_gated", [_ctx_p, _tensor_p, _tensor_p, ctypes.c_float],
                                  _tensor_p)
ggml_dsv4_hc_comb = _declare("ggml_dsv4_hc_comb", [_ctx_p, _tensor_p, _tensor_p, _tensor_p, ctypes.c_float,
                                                   ctypes.c_int32], _tensor_p)
ggml_dsv4_hc_post = _declare("ggml_dsv4_hc_post", [_ctx_p, _tensor_p, _tensor_p, _tensor_p, _tensor_p], _tensor_p)
ggml_swiglu_clamp = _declare("ggml_swiglu_clamp", [_ctx_p, _tensor_p, _tensor_p, ctypes.c_float], _tensor_p)
ggml_rope_set_offset = _declare("ggml_rope_set_offset", [_tensor_p, ctypes.c_int], _tensor_p)
ggml_prec_set_acc_c = _declare("ggml_prec_set_acc", [_tensor_p, ctypes.c_int], ctypes.c_bool)
# what a matmul's first operand is, for backends that take a faster path (the Hadamard rotations)
ggml_mul_mat_set_hint = _declare("ggml_mul_mat_set_hint", [_tensor_p, ctypes.c_int], None)


def _probe_ids() -> dict[str, int]:
    """Op and GLU ids as the loaded library numbers them.

    ggml-python's enum constants describe its own vendored ggml: newer ggml inserts ops (the
    DeepSeek-V4 ones sit before UNARY), so every id is read off tensors the library itself builds.
    """
    params = _g.ggml_init_params(mem_size=16 * _g.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True)
    ctx = _g.ggml_init(params)
    try:
        a = _g.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 4)
        w = _g.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 4)
        x = _g.ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 8, 4, 4)
        clamp = ggml_swiglu_clamp(ctx, a, a, 1.0)
        swiglu = _g.ggml_swiglu_split(ctx, a, a)
        ids = {"GGML_OP_GLU": clamp.contents.op,
               "GGML_OP_DSV4_HC_PRE": ggml_dsv4_hc_pre(ctx, x, w).contents.op,
               "GGML_GLU_OP_SWIGLU_CLAMP": clamp.contents.op_params[0],
               "GGML_GLU_OP_SWIGLU": swiglu.contents.op_params[0]}
    finally:
        _g.ggml_free(ctx)
    # GLU is the last op and SWIGLU_CLAMP the last GLU op, so every id below them has a name
    for i in range(ids["GGML_OP_GLU"] + 1):
        ids["GGML_OP_" + _g.ggml_op_name(i).decode()] = i
    for i in range(ids["GGML_GLU_OP_SWIGLU_CLAMP"] + 1):
        ids["GGML_GLU_OP_" + _g.ggml_glu_op_name(i).decode().upper()] = i
    ids["GGML_OP_COUNT"] = ids["GGML_OP_GLU"] + 1
    ids["GGML_GLU_OP_COUNT"] = ids["GGML_GLU_OP_SWIGLU_CLAMP"] + 1
    return ids


OP_IDS = _probe_ids()
globals().update(OP_IDS)  # shadows ggml-python's stale constants of the same names


def ne(t, i: int) -> int:
    return t.contents.ne[i]


def nb(t, i: int) -> int:
    return t.contents.nb[i]


def ttype(t) -> int:
    return t.contents.type


def nelements(t) -> int:
    c = t.contents
    return c.ne[0] * c.ne[1] * c.ne[2] * c.ne[3]


def tname(t) -> str:
    return t.contents.name.decode(errors="replace")


def set_name(t, name: str):
    # ggml truncates names to 63 bytes, as upstream's ggml_format_name does
    _g.ggml_set_name(t, name.encode()[:63])
    return t


def addr(t) -> int:
    return ctypes.cast(t, ctypes.c_void_p).value


def op_desc(p) -> str:
    return _g.ggml_op_desc(ctypes.cast(p, ctypes.POINTER(_g.ggml_tensor))).decode()


def type_name(t: int) -> str:
    return _g.ggml_type_name(t).decode()


def ggml_prec_set_acc(t, prec: int = GGML_PREC_F32):
    """Upstream's ggml_prec_set_acc (F32 accumulation on a matmul or flash attention)."""
    if not ggml_prec_set_acc_c(t, prec):
        raise ValueError(f"ggml_prec_set_acc: {op_desc(t)} {tname(t)!r} takes no accumulation precision")


def read_tensor_bytes(addr: int, nbytes: int):
    """A computed tensor's bytes from any backend (host buffers are read in place)."""
    t = ctypes.cast(addr, ctypes.POINTER(_g.ggml_tensor))
    buf = t.contents.buffer
    if buf and _g.ggml_backend_buffer_is_host(buf):
        return (ctypes.c_char * nbytes).from_address(t.contents.data)
    out = (ctypes.c_char * nbytes)()
    _g.ggml_backend_tensor_get(t, out, 0, nbytes)
    return out


def rope_sections(sections) -> ctypes.Array:
    return (ctypes.c_int * 4)(*[int(s) for s in sections])


def cpu_lib() -> ctypes.CDLL:
    import os
    return ctypes.CDLL(os.path.join(os.path.dirname(_g.__file__), "lib", "libggml-cpu.so"))
