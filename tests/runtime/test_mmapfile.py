"""Weights used in place from the mapped GGUF (llama.cpp's mmap), --no-mmap's copies, a file
changed while mapped, and the mapping's lifetime.

Where a tensor lives is read from the kernel's own account (/proc/self/maps), and its bytes are
compared with the file's bytes read with plain file reads at the offset the GGUF gives."""

import ctypes
import os
import shutil

import gguf
import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.cli import build_parser, main
from graphgen.errors import GGUFModelError
from graphgen.ops import ggml as G
from graphgen.runtime import model as M
from graphgen.runtime.mmapfile import ENV_NO_MMAP
from graphgen.runtime.session import Session
from graphgen.synth import make_model

ALIGN = 32  # ggml's TENSOR_ALIGNMENT, the CPU buffer type's alignment


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("mmap") / "tiny.gguf"
    make_model(p, "dflash", seed=11)
    return p


def file_maps(path) -> list[tuple[int, int, int]]:
    """(start, end, file offset) of every mapping of `path` in this process."""
    real = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi, int(parts[2], 16)))
    return out


def offsets(path) -> dict[str, tuple[int, int]]:
    """name -> (absolute data offset, bytes), as the GGUF's tensor infos give them."""
    r = gguf.GGUFReader(str(path))
    return {t.name: (int(t.data_offset), int(t.n_bytes)) for t in r.tensors}


def data_addr(gt) -> int:
    return gt.contents.data


def assert_bytes_are_the_files(model, path):
    """Every weight as ggml holds it equals the file's bytes at its offset."""
    offs = offsets(path)
    assert set(offs) == set(model.tensors) and offs
    with open(path, "rb") as f:
        for name, gt in model.tensors.items():
            off, n = offs[name]
            f.seek(off)
            want = f.read(n)
            got = (ctypes.c_char * n)()
            G.ggml_backend_tensor_get(gt, got, 0, n)
            assert bytes(got) == want, name


def logits(model_or_path, **kw):
    with Session(model_or_path, **kw) as s:
        w = s.hparams.n_embd_inp_enc
        s.inject(np.random.default_rng(3).standard_normal((6, w), dtype=np.float32), 0)
        return s.block([7, 255, 255, 255], 6).logits.copy()


def test_cpu_weights_are_the_mapped_file(tiny):
    m = M.load(tiny, use_mmap=True)
    with Session(m) as s:
        maps = file_maps(tiny)
        offs = offsets(tiny)
        # ggml's buffer starts at a mapping of the file, at its first byte
        base = G.ggml_backend_buffer_get_base(m.buffer)
        assert any(lo == base and fo == 0 for lo, hi, fo in maps)
        assert m.n_mapped == len(offs)
        for name, gt in m.tensors.items():
            a = data_addr(gt)
            off, n = offs[name]
            # where the kernel says the file's byte `off` is mapped
            assert any(lo <= a and a + n <= hi and a - lo + fo == off for lo, hi, fo in maps), name
        assert_bytes_are_the_files(m, tiny)
        assert s.model is m


def test_no_mmap_copies_every_weight(tiny):
    m = M.load(tiny, use_mmap=False)
    with Session(m):
        maps = file_maps(tiny)
        assert m.mapping is None and m.n_mapped == 0
        for name, gt in m.tensors.items():
            a = data_addr(gt)
            assert not any(lo <= a < hi for lo, hi, _ in maps), name
        assert_bytes_are_the_files(m, tiny)


def test_values_identical_mapped_and_copied(tiny):
    mapped = logits(M.load(tiny, use_mmap=True))
    copied = logits(M.load(tiny, use_mmap=False))
    assert np.isfinite(mapped).all() and mapped.shape[0] == 4
    assert np.array_equal(mapped.view(np.uint32), copied.view(np.uint32))


def test_file_changed_in_place_is_refused(tiny, tmp_path):
    p = tmp_path / "draft.gguf"
    shutil.copy(tiny, p)
    off, n = offsets(p)["output.weight"]
    s = Session(M.load(p, use_mmap=True))
    try:
        w = s.hparams.n_embd_inp_enc
        s.inject(np.zeros((2, w), np.float32), 0)
        st = p.stat()
        with open(p, "r+b") as f:  # same size, new bytes: the mapping would read them half-new
            f.seek(off)
            f.write(bytes(n))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # coarse clocks: a later mtime
        with pytest.raises(GGUFModelError, match=rf"{p}: the file changed on disk while its weights were mapped "
                                                 r"\(it was modified\)"):
            s.block([7, 255, 255, 255], 2)
        with open(p, "ab") as f:
            f.write(b"\0" * 64)
        with pytest.raises(GGUFModelError, match=rf"its size went from {st.st_size} to {st.st_size + 64} bytes"):
            s.inject(np.zeros((1, w), np.float32), 2)
    finally:
        s.close()


@pytest.mark.parametrize("shift_s", [-5, 5], ids=["earlier", "later"])
def test_same_size_rewrite_with_only_the_mtime_moved_is_refused(tiny, tmp_path, shift_s):
    """Rewritten in place with its own bytes and size: only the mtime moved, whichever way (a
    tool that keeps or restores times sets it back), and the next compute is refused."""
    p = tmp_path / "draft.gguf"
    shutil.copy(tiny, p)
    s = Session(M.load(p, use_mmap=True))
    try:
        w = s.hparams.n_embd_inp_enc
        s.inject(np.zeros((2, w), np.float32), 0)
        st = p.stat()
        data = p.read_bytes()
        with open(p, "r+b") as f:
            f.write(data)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + shift_s * 10**9))
        assert p.stat().st_size == st.st_size and p.read_bytes() == data
        with pytest.raises(GGUFModelError, match=r"the file changed on disk while its weights were mapped "
                                                 r"\(it was modified\)"):
            s.block([7, 255, 255, 255], 2)
    finally:
        s.close()


def test_file_replaced_keeps_the_mapped_contents(tiny, tmp_path):
    """A file replaced by a rename (as make-model and most tools write) leaves the mapping on the
    old contents, whole: nothing is read half-new, so nothing is refused."""
    p = tmp_path / "draft.gguf"
    shutil.copy(tiny, p)
    want = logits(M.load(p, use_mmap=True))
    m = M.load(p, use_mmap=True)
    s = Session(m)
    try:
        other = tmp_path / "other.gguf"
        make_model(other, "dflash", seed=12)
        os.replace(other, p)
        w = s.hparams.n_embd_inp_enc
        s.inject(np.random.default_rng(3).standard_normal((6, w), dtype=np.float32), 0)
        got = s.block([7, 255, 255, 255], 6).logits
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    finally:
        s.close()


def test_file_changed_between_metadata_and_weights(tiny, tmp_path):
    for use_mmap in (True, False):
        p = tmp_path / f"draft-{use_mmap}.gguf"
        shutil.copy(tiny, p)
        m = M.load(p, use_mmap=use_mmap)   # metadata only
        with open(p, "ab") as f:
            f.write(b"\0" * 32)
        with pytest.raises(GGUFModelError, match=rf"{p}: the file changed on disk since its metadata was read"):
            Session(m)


@pytest.mark.parametrize("shift_s", [-5, 5], ids=["earlier", "later"])
@pytest.mark.parametrize("use_mmap", [False, True], ids=["no-mmap", "mmap"])
def test_same_size_rewrite_between_metadata_and_weights_is_refused(tiny, tmp_path, use_mmap, shift_s):
    """New weights written in place at the same size between reading the metadata and opening the
    session: only the mtime says so, and the weights are not loaded from the changed file."""
    p = tmp_path / "draft.gguf"
    shutil.copy(tiny, p)
    m = M.load(p, use_mmap=use_mmap)   # metadata only
    off, n = offsets(p)["output.weight"]
    st = p.stat()
    with open(p, "r+b") as f:
        f.seek(off)
        old = f.read(n)
        f.seek(off)
        f.write(bytes(b ^ 0x55 for b in old))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + shift_s * 10**9))
    assert p.stat().st_size == st.st_size and p.stat().st_ino == st.st_ino
    with pytest.raises(GGUFModelError, match=rf"{p}: the file changed on disk since its metadata was read; "
                                             "load it again"):
        Session(m)
    # loaded again, it holds the new weights
    again = M.load(p, use_mmap=use_mmap)
    with Session(again):
        assert_bytes_are_the_files(again, p)
        got = (ctypes.c_char * n)()
        G.ggml_backend_tensor_get(again.tensors["output.weight"], got, 0, n)
        assert bytes(got) != old


def test_no_mmap_ignores_later_changes(tiny, tmp_path):
    p = tmp_path / "draft.gguf"
    shutil.copy(tiny, p)
    want = logits(M.load(p, use_mmap=False))
    s = Session(M.load(p, use_mmap=False))
    try:
        with open(p, "ab") as f:
            f.write(b"\0" * 64)
        w = s.hparams.n_embd_inp_enc
        s.inject(np.random.default_rng(3).standard_normal((6, w), dtype=np.float32), 0)
        assert np.array_equal(s.block([7, 255, 255, 255], 6).logits, want)
    finally:
        s.close()


def open_fds_to(path) -> int:
    real = os.path.realpath(path)
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == real
        except OSError:
            pass
    return n


def test_mapping_lives_with_the_model(tiny):
    s = Session(tiny)   # the process default: mapped
    addr = s.model.mapping[0]
    assert any(lo == addr for lo, _, _ in file_maps(tiny))
    fds = open_fds_to(tiny)
    s.close()           # the session closes the model it loaded, and the model its mapping
    assert not any(lo == addr for lo, _, _ in file_maps(tiny))
    assert s.model.mapping is None and s.model.buffer is None
    assert open_fds_to(tiny) == fds - 1   # the mapping's own descriptor (gguf-py keeps its own)


def test_device_backend_uploads_then_unmaps(tiny, rpc_server):  # noqa: F811
    """A backend whose memory is not the host's gets the weights uploaded from the mapping, which
    is then released (upstream uploads likewise)."""
    for use_mmap in (True, False):
        m = M.load(tiny, use_mmap=use_mmap)
        before = {lo for lo, _, _ in file_maps(tiny)}
        with Session(m, backend=rpc_server):
            assert m.mapping is None and m.n_mapped == 0
            assert {lo for lo, _, _ in file_maps(tiny)} <= before
            assert not G.ggml_backend_buffer_is_host(m.buffer)
            assert_bytes_are_the_files(m, tiny)


@pytest.fixture
def uploads(monkeypatch):
    """(use_mmap, tensors used in place) of every model a command loads weights for."""
    seen = []
    upload = M.Model.upload

    def spy(self, backend):
        upload(self, backend)
        seen.append((self.use_mmap, self.n_mapped))
    monkeypatch.setattr(M.Model, "upload", spy)
    return seen


SCENARIO = REF_DIR / "dflash-fa-off" / "scenario.json"
COMMANDS = {
    "dump": ["dump", "{m}", "--scenario", str(SCENARIO), "--out", "{t}/o"],
    "draft": ["draft", "{m}", "--prompt-tokens", "1,2,3,4,5,6", "--n-predict", "2"],
    "bench": ["bench", "{m}", "--engine", "graphgen", "--repeat", "1", "--n-seq", "1"],
    "trace": ["trace", "{m}", "--scenario", str(SCENARIO)],
    "xdiff": ["xdiff", "{m}", "--scenario", str(SCENARIO), "--backends", "cpu,cpu"],
}


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_commands_take_no_mmap(cmd, tiny, tmp_path, uploads, capsys):
    argv = [a.format(m=tiny, t=tmp_path) for a in COMMANDS[cmd]]
    assert build_parser().parse_args(argv).no_mmap is False
    assert main(["--quiet"] + argv + ["--no-mmap"]) == 0, capsys.readouterr().err
    assert uploads and all(u == (False, 0) for u in uploads), uploads
    assert ENV_NO_MMAP not in os.environ   # the choice ends with the command


def test_dump_no_mmap_loads_copies_and_dumps_the_same(tiny, tmp_path, uploads):
    outs = {}
    for flag in ([], ["--no-mmap"]):
        out = tmp_path / ("copy" if flag else "mapped")
        assert main(["--quiet", "dump", str(tiny), "--scenario", str(SCENARIO), "--out", str(out)] + flag) == 0
        outs[bool(flag)] = out
        assert ENV_NO_MMAP not in os.environ
    n = len(offsets(tiny))
    assert uploads == [(True, n), (False, 0)]
    for a in sorted(outs[False].glob("*.npz")):
        x, y = np.load(a), np.load(outs[True] / a.name)
        assert sorted(x.files) == sorted(y.files) and x.files
        for k in x.files:
            assert np.array_equal(x[k], y[k]), k


def test_llama_cpp_engine_takes_no_mmap(tiny, tmp_path):
    """--no-mmap reaches b11739 in its child process (its load_mode none, the older --no-mmap);
    its own log says how it loaded."""
    for flag, mode, buffer in (([], "mmap", "CPU_Mapped model buffer"), (["--no-mmap"], "none", " CPU model buffer")):
        out = tmp_path / (mode + "-ref")
        assert main(["--quiet", "dump", str(tiny), "--scenario", str(SCENARIO), "--out", str(out),
                     "--engine", "llama.cpp"] + flag) == 0
        log = (out / "llama.cpp.log").read_text()
        assert f"(load_mode = {mode})" in log and buffer in log, log[-2000:]


def test_reader_reads_what_gguf_py_reads(tiny):
    """The loader's faster reader gives every field's parts, data indices, types and contents,
    and every tensor's placement, exactly as gguf-py's own reader."""
    from graphgen.ggufile import _bounded_reader_class
    ours, theirs = _bounded_reader_class()(str(tiny), "r"), gguf.GGUFReader(str(tiny))
    kinds = {tuple(f.types) for f in theirs.fields.values()}
    # string and number arrays, the two the reader reads its own way
    assert (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING) in kinds
    assert (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32) in kinds
    assert list(ours.fields) == list(theirs.fields)
    for name, want in theirs.fields.items():
        got = ours.fields[name]
        assert (got.offset, got.data, got.types) == (want.offset, want.data, want.types), name
        assert len(got.parts) == len(want.parts), name
        for a, b in zip(got.parts, want.parts):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
        assert got.contents() == want.contents(), name
    assert [(t.name, int(t.data_offset), int(t.n_bytes), t.data.shape) for t in ours.tensors] == \
        [(t.name, int(t.data_offset), int(t.n_bytes), t.data.shape) for t in theirs.tensors]
