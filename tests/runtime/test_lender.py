"""graphgen.runtime.lender: a target's token embeddings and lm head lent to a draft without them:
the target checked against the draft's shapes, a tied head (no output.weight) lent from the
embeddings, the tensors computed on in place in the mapped target or copied, and a target
changed on disk refused."""

import ctypes
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from graphgen.errors import GGUFModelError
from graphgen.ops import ggml as G
from graphgen.runtime.lender import EMBD, OUTPUT, Lender
from graphgen.synth import make_model

N_EMBD, N_VOCAB = 64, 96


def target(path, head=True, arch="llama", embd_shape=(N_VOCAB, N_EMBD), head_rows=N_VOCAB):
    """A target GGUF holding token embeddings (and an lm head): numpy shape [rows, n_embd]."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tensor(EMBD, rng.standard_normal(embd_shape).astype(np.float32))
    if head:
        w.add_tensor(OUTPUT, rng.standard_normal((head_rows, N_EMBD)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def file_bytes(path, name):
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == name)
    with open(path, "rb") as f:
        f.seek(int(t.data_offset))
        return f.read(int(t.n_bytes))


def tensor_bytes(gt):
    n = G.ggml_nbytes(gt)
    out = (ctypes.c_char * n)()
    G.ggml_backend_tensor_get(gt, out, 0, n)
    return bytes(out)


@pytest.fixture
def cpu():
    b = G.lib.ggml_backend_cpu_init()
    yield b
    G.ggml_backend_free(b)


DRAFT = Path("draft.gguf")


def test_the_lent_tensors_are_the_targets_bytes_in_place(tmp_path, cpu):
    path = target(tmp_path / "t.gguf")
    lender = Lender(path, DRAFT, N_EMBD, [EMBD, OUTPUT], N_VOCAB)
    assert lender.n_vocab == N_VOCAB and set(lender.picks) == {"tok_embd", "output"}
    lender.upload(cpu, use_mmap=True)
    try:
        assert tensor_bytes(lender.tok_embd) == file_bytes(path, EMBD)
        assert tensor_bytes(lender.output) == file_bytes(path, OUTPUT)
        assert G.ggml_backend_buffer_is_host(lender.tok_embd.contents.buffer)
        # in place: the data lies inside the mapping of the target file
        m = lender._map
        assert m.addr <= lender.tok_embd.contents.data < m.addr + m.size
        assert lender.weight_bytes == N_VOCAB * N_EMBD * 4 + N_VOCAB * N_EMBD * 2
        lender.check_file()
    finally:
        lender.close()
    assert lender.tok_embd is None and lender._map is None


def test_copied_without_mmap(tmp_path, cpu):
    path = target(tmp_path / "t.gguf")
    lender = Lender(path, DRAFT, N_EMBD, [OUTPUT], None)
    lender.upload(cpu, use_mmap=False)
    try:
        assert lender.tok_embd is None and lender._map is None
        assert tensor_bytes(lender.output) == file_bytes(path, OUTPUT)
    finally:
        lender.close()


def test_a_tied_head_is_the_embeddings(tmp_path, cpu):
    path = target(tmp_path / "t.gguf", head=False)
    lender = Lender(path, DRAFT, N_EMBD, [EMBD, OUTPUT], N_VOCAB)
    assert lender.picks["output"].name == EMBD
    # one tensor serves both, and its bytes count once
    assert lender.weight_bytes == N_VOCAB * N_EMBD * 4
    lender.upload(cpu, use_mmap=True)
    try:
        assert G.addr(lender.output) == G.addr(lender.tok_embd)
    finally:
        lender.close()


def test_a_target_changed_while_mapped_is_refused(tmp_path, cpu):
    path = target(tmp_path / "t.gguf")
    lender = Lender(path, DRAFT, N_EMBD, [EMBD], None)
    lender.upload(cpu, use_mmap=True)
    try:
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with pytest.raises(GGUFModelError, match="the target changed on disk while its tensors were mapped"):
            lender.check_file()
    finally:
        lender.close()
    # changed between its metadata and the upload
    lender = Lender(path, DRAFT, N_EMBD, [EMBD], None)
    with open(path, "ab") as f:
        f.write(b"\0" * 64)
    with pytest.raises(GGUFModelError, match="the target changed on disk since its metadata was read"):
        lender.upload(cpu, use_mmap=True)
    lender.close()


def test_refusals(tmp_path):
    with pytest.raises(GGUFModelError, match="absent.gguf: no such target model file"):
        Lender(tmp_path / "absent.gguf", DRAFT, N_EMBD, [EMBD], None)
    draft = make_model(tmp_path / "d.gguf", "dflash")["path"]
    with pytest.raises(GGUFModelError, match="is a DFlash draft, not a target model; give the target with -m"):
        Lender(draft, DRAFT, N_EMBD, [EMBD], None)
    no_embd = tmp_path / "n.gguf"
    w = gguf.GGUFWriter(str(no_embd), "llama")
    w.add_tensor(OUTPUT, np.zeros((N_VOCAB, N_EMBD), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFModelError, match="the target has no 'token_embd.weight' to lend the draft draft.gguf"):
        Lender(no_embd, DRAFT, N_EMBD, [OUTPUT], None)
    wide = target(tmp_path / "w.gguf", embd_shape=(N_VOCAB, 32))
    with pytest.raises(GGUFModelError, match=r"'token_embd.weight' has shape \[32, 96\]; the draft draft.gguf has "
                                             r"n_embd 64 and needs \[64, n_vocab\]"):
        Lender(wide, DRAFT, N_EMBD, [EMBD], None)
    rows = target(tmp_path / "r.gguf", head_rows=80)
    with pytest.raises(GGUFModelError, match="lm head 'output.weight' has 80 rows; the draft draft.gguf predicts "
                                             "over 96 tokens"):
        Lender(rows, DRAFT, N_EMBD, [OUTPUT], N_VOCAB)
    # what the draft has, it does not borrow: the head's rows are not checked then
    assert set(Lender(rows, DRAFT, N_EMBD, [EMBD], N_VOCAB).picks) == {"tok_embd"}
