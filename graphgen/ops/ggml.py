"""The one place where graphgen touches ggml-python.

Re-exports the ggml functions the builders call under their C names, so a builder reads like
upstream's C++ (`ggml_reshape_3d(ctx0, cur, ...)`), and fixes the ggml-python bindings whose
pointer return types are declared as integers (ctypes would truncate the pointer).
"""

from __future__ import annotations

import ctypes
import os

# ggml-vulkan skips CPU-type devices (lavapipe) unless they are listed here; it reads this at its
# first initialisation, and a process without a visible device aborts on some Vulkan calls
os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")

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
    """Upstream's ggml_prec_set_acc: ggml 0.15.3 spells it per op, with the same op_params."""
    if t.contents.op == _g.GGML_OP_FLASH_ATTN_EXT:
        _g.ggml_flash_attn_ext_set_prec(t, prec)
    else:
        _g.ggml_mul_mat_set_prec(t, prec)


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
