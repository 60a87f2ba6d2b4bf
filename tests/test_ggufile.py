"""graphgen/ggufile.py: the one GGUF entry point. check_layout refuses what ggml's gguf reader refuses,
bounding every count by the file's size; open_reader names the file and the first tensor past a
truncated end; field_value reads a key as a Python value. The files are written byte by byte here
(the layout of ggml's gguf.cpp), or with gguf-py's writer."""

import struct

import gguf
import numpy as np
import pytest

from graphgen.errors import GGUFModelError
from graphgen.ggufile import check_layout, field_value, open_reader, try_open

U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10


def _s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def _kv(key, vtype, payload):
    return _s(key) + struct.pack("<I", vtype) + payload


def _tinfo(name, ne, ttype=0, offset=0):
    return _s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}q", *ne) + struct.pack("<iQ", ttype, offset)


def _gguf(kvs=(), tinfos=(), data=b"", version=3, n_t=None, n_kv=None, align=32):
    """A GGUF's bytes: header, key/values, tensor infos, padding to `align`, then `data`."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tinfos) if n_t is None else n_t,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tinfos)
    return body + b"\0" * (-len(body) % align) + data


def _write(tmp_path, raw, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(raw)
    return p


ARCH = _kv("general.architecture", STR, _s("dflash"))


def test_a_well_formed_file_passes(tmp_path):
    raw = _gguf([ARCH, _kv("a.n", U32, struct.pack("<I", 7)),
                 _kv("a.list", ARR, struct.pack("<IQ", STR, 2) + _s("x") + _s("yz"))],
                [_tinfo("w", [4, 2]), _tinfo("q", [32], ttype=8, offset=32)],
                data=b"\0" * 32 + b"\0" * 34)
    check_layout(_write(tmp_path, raw))


@pytest.mark.parametrize("raw, words", [
    (b"GGML" + b"\0" * 40, "not a GGUF file (magic b'GGML')"),
    (b"GGUF\3\0\0", "truncated GGUF (7 bytes, the header alone takes 24)"),
    (_gguf(version=1), "unsupported GGUF version 1"),
    (_gguf(n_kv=10 ** 6), "header claims 1000000 keys and 0 tensors, more than a 32-byte file can hold"),
    (_gguf([_kv("", U32, b"\0\0\0\0")]), "metadata key 0 is empty"),
    (_gguf([ARCH, ARCH]), "duplicate key 'general.architecture'"),
    (_gguf([_kv("a.x", 13, b"\0" * 8)]), "key 'a.x' has unknown GGUF type 13"),
    (_gguf([_kv("a.x", ARR, struct.pack("<IQ", ARR, 1) + b"\0" * 12)]), "key 'a.x' is an array of unsupported type 9"),
    (_gguf([_kv("a.x", ARR, struct.pack("<IQ", STR, 2 ** 40))]), "key 'a.x' claims 1099511627776 strings"),
    (_gguf([_kv("a.x", ARR, struct.pack("<IQ", U64, 2 ** 40))]), "key 'a.x' (1099511627776 elements) runs past "
                                                                  "the end of the file"),
    (_gguf([_kv("a.x", STR, struct.pack("<Q", 1000) + b"ab")]), "key 'a.x' runs past the end of the file"),
    (_gguf([_kv("general.alignment", U64, struct.pack("<Q", 32))]),
     "key 'general.alignment' must be of type u32 but is u64"),
    (_gguf([_kv("general.alignment", U32, struct.pack("<I", 24))]), "'general.alignment' = 24 is not a power of 2"),
    (_gguf([_kv("general.alignment", U32, struct.pack("<I", 0))]), "'general.alignment' = 0 is not a power of 2"),
])
def test_layouts_ggml_refuses(tmp_path, raw, words):
    with pytest.raises(GGUFModelError) as e:
        check_layout(_write(tmp_path, raw))
    assert words in str(e.value) and str(e.value).startswith(str(tmp_path / "m.gguf"))


@pytest.mark.parametrize("tinfos, words", [
    ([_tinfo("n" * 64, [4])], f"tensor name '{'n' * 64}' is too long: 64 >= 64"),
    ([_tinfo("w", [4]), _tinfo("w", [4], offset=32)], "duplicated tensor 'w'"),
    ([_tinfo("w", [1, 1, 1, 1, 1])], "tensor 'w' has 5 dimensions (ggml has at most 4)"),
    ([_tinfo("w", [4, -2])], "tensor 'w' has shape [4, -2]: a negative number of elements"),
    ([_tinfo("w", [2 ** 40, 2 ** 30])], "more elements than int64 holds"),
    ([_tinfo("w", [4], ttype=43)], "tensor 'w' has invalid ggml type 43"),
    ([_tinfo("w", [4], ttype=4)], "tensor 'w' of ggml type 4 has 4 elements per row, not a multiple of its block "
                                  "size (0)"),
    ([_tinfo("w", [30], ttype=8)], "tensor 'w' of ggml type 8 has 30 elements per row, not a multiple of its block "
                                   "size (32)"),
    ([_tinfo("w", [4]), _tinfo("v", [4], offset=16)], "tensor 'v' has data offset 16, expected 32"),
    ([_tinfo("w", [4], offset=32)], "tensor 'w' has data offset 32, expected 0"),
])
def test_tensor_infos_ggml_refuses(tmp_path, tinfos, words):
    with pytest.raises(GGUFModelError) as e:
        check_layout(_write(tmp_path, _gguf([ARCH], tinfos, data=b"\0" * 128)))
    assert words in str(e.value)


def test_tensor_data_off_ggmls_alignment_is_refused(tmp_path):
    # an alignment of 8: the tensor's data starts 8 bytes off a multiple of 32
    kvs = [_kv("general.alignment", U32, struct.pack("<I", 8)), _kv("a.pad", U32, b"\0" * 4)]
    raw = _gguf(kvs, [_tinfo("w", [4])], data=b"\0" * 16, align=8)
    body = len(raw) - 16
    if body % 32 == 0:  # make the data start misaligned for ggml whatever the header's length
        kvs.append(_kv("a.b", BOOL, b"\1"))
        raw = _gguf(kvs, [_tinfo("w", [4])], data=b"\0" * 16, align=8)
    with pytest.raises(GGUFModelError, match=r"tensor 'w' data lies at file offset \d+, not a multiple of 32 "
                                             r"\(key 'general.alignment' = 8\)"):
        check_layout(_write(tmp_path, raw))


def _real(path, **fields):
    w = gguf.GGUFWriter(str(path), "dflash")
    for k, v in fields.items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_array(k, v)
    w.add_tensor("w", np.arange(64, dtype=np.float32).reshape(8, 8))
    w.add_tensor("v", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_field_values_as_python_values(tmp_path):
    r = open_reader(_real(tmp_path / "r.gguf", **{"a.name": "héllo", "a.n": 7, "a.x": 0.5, "a.on": True,
                                                  "a.ints": [3, 1, 2], "a.words": ["x", "yz", ""]}))
    assert field_value(r, "a.name") == "héllo" and field_value(r, "general.architecture") == "dflash"
    assert field_value(r, "a.n") == 7 and type(field_value(r, "a.n")) is int
    assert field_value(r, "a.x") == 0.5 and field_value(r, "a.on") is True
    assert field_value(r, "a.ints") == [3, 1, 2] and field_value(r, "a.words") == ["x", "yz", ""]
    assert field_value(r, "a.none") is None
    assert [t.name for t in r.tensors] == ["w", "v"]
    np.testing.assert_array_equal(np.asarray(r.tensors[0].data).ravel(), np.arange(64, dtype=np.float32))


def test_a_truncated_file_names_the_tensor_past_its_end(tmp_path):
    p = _real(tmp_path / "r.gguf")
    raw = p.read_bytes()
    p.write_bytes(raw[:-100])  # v's 256 bytes are cut short
    check_layout(p)  # the layout itself is whole
    with pytest.raises(GGUFModelError, match=rf"^{p}: tensor 'v' \(256 bytes at offset \d+\) runs past the end of "
                                             rf"the file \({len(raw) - 100} bytes\)"):
        open_reader(p)
    assert try_open(p) is None


def test_try_open_finds_nothing_in_what_is_no_gguf(tmp_path):
    (tmp_path / "t.txt").write_text("hello")
    assert try_open(tmp_path / "t.txt") is None and try_open(tmp_path / "none.gguf") is None
    assert try_open(tmp_path) is None
    assert field_value(try_open(_real(tmp_path / "r.gguf", **{"a.n": 3})), "a.n") == 3
