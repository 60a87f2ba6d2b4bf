"""graphgen.dump.record: a computed ggml node read into the dump format, from `struct ggml_tensor`
itself: its fields and sources, its values through its strides (bf16, quantized rows), the digest
and statistics of its bytes, and the recorder's graph order.

The tensors here are ctypes structs laid over numpy buffers, so what is read is known exactly."""

import ctypes
import hashlib
import math
from types import SimpleNamespace

import numpy as np
import pytest

from graphgen.dump.format import Node
from graphgen.dump.record import (
    GGML_TENSOR_FLAG_OUTPUT,
    NodeRecorder,
    TensorStruct,
    as_float32,
    cpu_features,
    n_kv_from_nodes,
    read_array,
    read_quantized_rows,
    read_values,
    src_names,
    summarize,
)

F32, F16, Q8_0, I32, BF16 = 0, 1, 8, 26, 30
KEEP = []   # the buffers and structs the tests' tensors point into, alive until the process ends


def tensor(name, buf, type_id, ne, nb=None, src=(), view_src=None, op_params=(), flags=0):
    """A TensorStruct over `buf` (a numpy array whose bytes it reads) with ggml's ne and nb."""
    t = TensorStruct()
    t.type = type_id
    t.ne[:] = list(ne) + [1] * (4 - len(ne))
    if nb is None:
        item = buf.dtype.itemsize if buf is not None else 4
        nb = [item, item * t.ne[0], item * t.ne[0] * t.ne[1], item * t.ne[0] * t.ne[1] * t.ne[2]]
    t.nb[:] = nb
    t.data = buf.ctypes.data if buf is not None else None
    t.name = name.encode()
    for k, s in enumerate(src):
        t.src[k] = ctypes.pointer(s) if s is not None else None
    if view_src is not None:
        t.view_src = ctypes.pointer(view_src)
        t.view_offs = 16
    for k, p in enumerate(op_params):
        t.op_params[k] = p
    t.flags = flags
    KEEP.extend([t, buf])
    return t


def test_contiguous_values_in_numpy_order():
    x = np.arange(24, dtype=np.float32)
    got = read_array(tensor("x", x, F32, [4, 3, 2]))
    assert got.shape == (1, 2, 3, 4) and np.array_equal(got.ravel(), x)


def test_a_view_is_read_through_its_strides():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)     # ggml ne [4, 3]
    # its transpose: ne [3, 4], nb [row stride, element stride]
    t = tensor("xt", x, F32, [3, 4], nb=[16, 4, 48, 48])
    assert np.array_equal(read_array(t)[0, 0], x.T)
    # every other element of each row
    t = tensor("xs", x, F32, [2, 3], nb=[8, 16, 48, 48])
    assert np.array_equal(read_array(t)[0, 0], x[:, ::2])


def test_each_plain_type_and_bf16():
    h = np.array([1.5, -2.0], np.float16)
    assert read_array(tensor("h", h, F16, [2])).dtype == np.float16
    i = np.array([7, -3, 5], np.int32)
    assert np.array_equal(read_values(tensor("i", i, I32, [3]), 100).ravel(), [7.0, -3.0, 5.0])
    b = np.array([0x3F80, 0xC040, 0x7FC0], np.uint16)   # 1.0, -3.0, NaN in bfloat16
    t = tensor("b", b, BF16, [3])
    assert read_array(t).dtype == np.uint16
    v = read_values(t, 100).ravel()
    assert v[0] == 1.0 and v[1] == -3.0 and math.isnan(v[2]) and v.dtype == np.float32
    assert as_float32(np.array([0x4000], np.uint16), BF16)[0] == 2.0


def test_nothing_to_read():
    x = np.zeros(4, np.float32)
    assert read_array(tensor("empty", x, F32, [0, 4])) is None
    assert read_array(tensor("nodata", None, F32, [4])) is None
    assert read_values(tensor("big", x, F32, [4]), max_data=3) is None
    assert read_values(tensor("fits", x, F32, [4]), max_data=4) is not None


def test_quantized_rows_are_whole_blocks_of_bytes():
    # q8_0: 32 values in 34 bytes; two rows of 64 values
    raw = np.arange(2 * 68, dtype=np.uint8)
    t = tensor("cache_k_l0", raw, Q8_0, [64, 2], nb=[34, 68, 136, 136])
    assert read_array(t) is None and read_values(t, 1 << 20) is None
    rows = read_quantized_rows(t)
    assert rows.shape == (1, 1, 2, 68) and np.array_equal(rows.ravel(), raw)
    assert read_quantized_rows(tensor("f", np.zeros(4, np.float32), F32, [4])) is None
    assert read_quantized_rows(tensor("odd", raw, Q8_0, [48, 2], nb=[34, 68, 136, 136])) is None


def test_read_bytes_fetches_device_memory_by_address():
    x = np.arange(6, dtype=np.float32)
    asked = []

    def read_bytes(addr, n):
        asked.append((addr, n))
        return x.tobytes()[:n]
    t = tensor("dev", None, F32, [3, 2])
    assert np.array_equal(read_array(t, read_bytes, addr=1234).ravel(), x) and asked == [(1234, 24)]


def test_summarize():
    v = np.array([[1.0, -2.0, np.nan], [np.inf, 0.5, 3.0]], np.float32)
    digest, stats = summarize(v.T, F32)     # a non-contiguous array is hashed as its contiguous bytes
    assert digest == hashlib.sha256(np.ascontiguousarray(v.T).tobytes()).hexdigest()
    assert stats == {"count": 6, "sum": 2.5, "sumsq": 1 + 4 + 0.25 + 9, "min": -2.0, "max": 3.0, "nan": 1, "inf": 1}
    _, none = summarize(np.array([np.nan, np.inf], np.float32), F32)
    assert none["min"] is None and none["max"] is None and none["sum"] == 0.0 and none["count"] == 2
    bf = np.array([0x3F80, 0x4000], np.uint16)
    digest, stats = summarize(bf, BF16)
    assert digest == hashlib.sha256(bf.tobytes()).hexdigest() and stats["sum"] == 3.0 and stats["sumsq"] == 5.0


def test_source_names_read_through_scheduler_copies():
    a, b = tensor("a", np.zeros(1, np.float32), F32, [1]), tensor("CUDA0#kq-0#1", np.zeros(1, np.float32), F32, [1])
    t = tensor("x", np.zeros(1, np.float32), F32, [1], src=[a, None, b])
    assert src_names(t) == ["a", "", "kq-0"]
    assert src_names(tensor("y", np.zeros(1, np.float32), F32, [1], src=[a, None])) == ["a"]
    assert src_names(tensor("leaf", np.zeros(1, np.float32), F32, [1])) == []


def recorder(max_data=262144):
    return NodeRecorder(lambda addr: "OP" + TensorStruct.from_address(addr).name.decode()[-1],
                        lambda t: {F32: "f32", Q8_0: "q8_0", I32: "i32"}[t], max_data)


def test_record_reads_every_field():
    src = tensor("src", np.zeros(8, np.float32), F32, [8])
    x = np.arange(8, dtype=np.float32)
    t = tensor("nodeA", x, F32, [4, 2], src=[src, src], view_src=src, op_params=[5, -1])
    rec = recorder()
    rec.record(ctypes.addressof(t), backend="CPU")
    [n] = rec.nodes
    assert (n.index, n.name, n.op, n.type, n.ne, n.src, n.view_src, n.view_offs, n.backend) == \
        (0, "nodeA", "OPA", "f32", [4, 2, 1, 1], ["src", "src"], "src", 16, "CPU")
    assert n.op_params == [5, -1] + [0] * 14
    assert np.array_equal(rec.values[0].ravel(), x) and rec.backends == {0: "CPU"}
    assert n.digest == hashlib.sha256(x.tobytes()).hexdigest() and n.stats["sum"] == 28.0


def test_values_over_max_data_are_not_kept_unless_the_node_is_an_output():
    x = np.ones(8, np.float32)
    rec = recorder(max_data=4)
    rec.record(ctypes.addressof(tensor("big", x, F32, [8])))
    rec.record(ctypes.addressof(tensor("result_output", x, F32, [8], flags=GGML_TENSOR_FLAG_OUTPUT)))
    assert list(rec.values) == [1] and all(n.digest for n in rec.nodes)
    assert rec.nodes[0].stats["count"] == 8


def test_quantized_nodes_keep_a_digest_of_their_bytes():
    raw = np.arange(68, dtype=np.uint8)
    rec = recorder()
    rec.record(ctypes.addressof(tensor("cache_k_l0", raw, Q8_0, [64, 1], nb=[34, 68, 68, 68])))
    [n] = rec.nodes
    assert n.digest == hashlib.sha256(raw.tobytes()).hexdigest() and n.stats == {"count": 64}
    assert rec.values == {}


def test_reorder_puts_nodes_in_the_graphs_order():
    ts = [tensor(f"n{k}", np.full(2, k, np.float32), F32, [2]) for k in range(3)]
    rec = recorder()
    for t, be in zip([ts[2], ts[0], ts[1]], ["Vulkan0", None, "CPU"]):
        rec.record(ctypes.addressof(t), backend=be)
    rec.reorder({ctypes.addressof(t): k for k, t in enumerate(ts)})
    assert [(n.index, n.name) for n in rec.nodes] == [(0, "n0"), (1, "n1"), (2, "n2")]
    assert [float(rec.values[k].ravel()[0]) for k in range(3)] == [0.0, 1.0, 2.0]
    assert rec.backends == {1: "CPU", 2: "Vulkan0"}
    rec.reset()
    assert (rec.nodes, rec.values, rec.backends, rec.addrs) == ([], {}, {}, [])


def test_n_kv_is_the_first_k_cache_view():
    nodes = [Node(0, "x", "VIEW", "f16", [16, 4, 99, 1], view_src="cache_v_l0"),
             Node(1, "k", "VIEW", "f16", [16, 4, 256, 1], view_src="cache_k_l0"),
             Node(2, "k1", "VIEW", "f16", [16, 4, 512, 1], view_src="cache_k_l1")]
    assert n_kv_from_nodes(nodes) == 256 and n_kv_from_nodes(nodes[:1]) is None


def test_cpu_features_as_the_library_says():
    def has(v):
        return lambda: v
    lib = SimpleNamespace(ggml_cpu_has_avx=has(1), ggml_cpu_has_avx2=has(0), ggml_cpu_has_llamafile=has(1))
    assert cpu_features(lib) == {"AVX": True, "AVX2": False, "LLAMAFILE": True}


@pytest.mark.parametrize("t_type", [F32, I32])
def test_as_float32(t_type):
    assert as_float32(np.array([1, 2], np.int32 if t_type == I32 else np.float32), t_type).dtype == np.float32
