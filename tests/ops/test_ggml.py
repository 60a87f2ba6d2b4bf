"""graphgen.ops.ggml: the ggml-python layer: op ids read off the library itself, upstream's fused
ops bound with their C signatures, pointer return types that keep 64 bits, and the small helpers
the builders, recorders and backends use."""

import ctypes

import numpy as np
import pytest

from graphgen.ops import ggml as G


@pytest.fixture
def ctx():
    c = G.ggml_init(G.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=False))
    yield c
    G.ggml_free(c)


def test_op_ids_name_the_librarys_ops():
    for name, op in G.OP_IDS.items():
        if name.startswith("GGML_OP_") and name != "GGML_OP_COUNT":
            assert G._g.ggml_op_name(op).decode() == name[len("GGML_OP_"):]
        elif name.startswith("GGML_GLU_OP_") and name != "GGML_GLU_OP_COUNT":
            assert G._g.ggml_glu_op_name(op).decode().upper() == name[len("GGML_GLU_OP_"):]
    assert G.GGML_OP_COUNT == G.GGML_OP_GLU + 1 and G.GGML_GLU_OP_COUNT == G.GGML_GLU_OP_SWIGLU_CLAMP + 1
    # the module's own constants are the library's, not ggml-python's vendored numbering
    assert G.GGML_OP_MUL_MAT == G.OP_IDS["GGML_OP_MUL_MAT"] and "GGML_OP_DSV4_HC_COMB" in G.OP_IDS


def test_fused_ops(ctx):
    x = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 4, 3)
    w = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
    assert G.op_desc(G.ggml_dsv4_hc_pre(ctx, x, w)) == "DSV4_HC_PRE"
    a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 3)
    clamp = G.ggml_swiglu_clamp(ctx, a, a, 7.0)
    assert G.op_desc(clamp) == "SWIGLU_CLAMP" and clamp.contents.op == G.GGML_OP_GLU
    assert clamp.contents.op_params[0] == G.GGML_GLU_OP_SWIGLU_CLAMP
    pos = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 3)
    rope = G.ggml_rope_ext(ctx, x, pos, None, 4, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    assert G.addr(G.ggml_rope_set_offset(rope, 4)) == G.addr(rope) and rope.contents.op_params[15] == 4


def test_accumulation_precision_only_where_an_op_takes_it(ctx):
    a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 4)
    mm = G.ggml_mul_mat(ctx, a, a)
    G.ggml_prec_set_acc(mm)
    add = G.set_name(G.ggml_add(ctx, a, a), "sum")
    with pytest.raises(ValueError, match="ggml_prec_set_acc: ADD 'sum' takes no accumulation precision"):
        G.ggml_prec_set_acc(add)


def test_tensor_helpers(ctx):
    t = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 5, 3, 2)
    assert [G.ne(t, i) for i in range(4)] == [5, 3, 2, 1] and [G.nb(t, i) for i in range(3)] == [4, 20, 60]
    assert G.nelements(t) == 30 and G.ttype(t) == G.GGML_TYPE_F32 and G.type_name(G.ttype(t)) == "f32"
    assert G.type_name(G.GGML_TYPE_I32) == "i32" and G.type_name(G.GGML_TYPE_F16) == "f16"
    # ggml keeps 63 bytes of a name
    G.set_name(t, "x" * 70)
    assert G.tname(t) == "x" * 63
    assert G.addr(t) == ctypes.cast(t, ctypes.c_void_p).value and G.op_desc(G.addr(t)) == "NONE"


def test_read_tensor_bytes_reads_a_backend_buffer():
    c = G.ggml_init(G.ggml_init_params(mem_size=4 * G.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
    backend = G.lib.ggml_backend_cpu_init()
    try:
        t = G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 4)
        buf = G.lib.ggml_backend_alloc_ctx_tensors(c, backend)
        assert buf
        vals = np.array([1.5, -2.0, 3.0, 0.25], np.float32)
        G.ggml_backend_tensor_set(t, vals.ctypes.data, 0, 16)
        raw = G.read_tensor_bytes(G.addr(t), 16)
        assert np.frombuffer(bytes(raw), np.float32).tolist() == vals.tolist()
        assert np.frombuffer(bytes(G.read_tensor_bytes(G.addr(t), 8)), np.float32).tolist() == [1.5, -2.0]
        G.ggml_backend_buffer_free(buf)
    finally:
        G.ggml_backend_free(backend)
        G.ggml_free(c)


def test_pointer_return_types_keep_64_bits():
    for name in G._POINTER_RESTYPE:
        fn = getattr(G.lib, name, None)
        if fn is not None:
            assert fn.restype is ctypes.c_void_p, name
    backend = G.lib.ggml_backend_cpu_init()
    try:
        assert isinstance(backend, int) and backend != 0
        assert G._g.ggml_backend_name(backend).decode() == "CPU"
    finally:
        G.ggml_backend_free(backend)


def test_rope_sections_and_the_cpu_library():
    s = G.rope_sections([1, 2, 3, 4])
    assert list(s) == [1, 2, 3, 4] and len(s) == 4
    assert hasattr(G.cpu_lib(), "ggml_cpu_has_avx")
    assert (G.GGML_ROPE_TYPE_NEOX, G.GGML_ROPE_TYPE_MROPE, G.GGML_TYPE_I32) == (2, 8, 26)
