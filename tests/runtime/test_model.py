"""graphgen.runtime.model: a draft GGUF loaded: its hparams read as b11739 reads them (the head
from its tensors, the backbone from its keys), every tensor checked (types, shapes, the set the
loader creates, data inside the file) before ggml sees it, the weights placed on a backend and
bound under upstream's field names, a draft without embeddings refused without its target."""

import gguf
import numpy as np
import pytest
from gguf_edit import rewrite

from graphgen.errors import GGUFModelError
from graphgen.ggufile import open_reader
from graphgen.ops import ggml as G
from graphgen.runtime import model as M
from graphgen.runtime.mmapfile import no_mmap
from graphgen.synth import make_model

VT = gguf.GGUFValueType


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model") / "tiny.gguf", "dflash", seed=3)["path"]


@pytest.fixture
def cpu():
    b = G.lib.ggml_backend_cpu_init()
    yield b
    G.ggml_backend_free(b)


def test_hparams_variant_and_backbone(tmp_path, tiny):
    hp, variant, backbone = M.read_hparams(open_reader(tiny), tiny)
    assert (variant, backbone) == ("dflash", "base")
    assert (hp.n_embd, hp.n_layer, hp.n_head, hp.n_vocab, hp.target_layers) == (64, 2, 4, 256, [1, 2])
    assert hp.n_embd_head_k == hp.n_rot == 16 and hp.ffn_op == "silu" and hp.sample_from_anchor
    for v, b, want in (("dspark", "dsv4", "dsv4"), ("dspark", "dsv41", "dsv41"), ("dspark", "mistral-large4",
                                                                                  "mistral-large4")):
        path = make_model(tmp_path / f"{b}.gguf", v, b)["path"]
        assert M.read_hparams(open_reader(path), path)[1:] == (v, want)


@pytest.mark.parametrize("edit, check", [
    ({"dflash.hidden_activation": (VT.STRING, "gelu_pytorch_tanh")}, lambda hp: hp.ffn_op == "gelu"),
    ({"dflash.sample_from_anchor": (VT.BOOL, False)}, lambda hp: not hp.sample_from_anchor),
    # a group size without a kernel configures no conv
    ({"dflash.conv_group_size": (VT.UINT32, 24)}, lambda hp: hp.conv_group_size == 0),
    ({"dflash.attention.key_length": (VT.UINT32, 32), "dflash.attention.value_length": (VT.UINT32, 32)},
     lambda hp: hp.n_embd_head_k == 32 and hp.n_rot == 32),
])
def test_keys_read(tmp_path, tiny, edit, check):
    path = rewrite(tiny, tmp_path / "b.gguf", drop_keys=list(edit), set_keys=edit)
    assert check(M.read_hparams(open_reader(path), path)[0])


@pytest.mark.parametrize("edit, fragment", [
    ({"dflash.hidden_activation": (VT.STRING, "relu")}, "unsupported DFlash hidden activation 'relu'"),
    ({"dflash.rope.dimension_count": (VT.UINT32, 7)}, "'dflash.rope.dimension_count' = 7 must be even"),
    ({"dflash.rope.dimension_count": (VT.UINT32, 32)}, "must be even and <= the head dimension 16"),
    ({"dflash.attention.key_length": (VT.UINT32, 0)}, "head dimension must be positive"),
    ({"lilicorr.num_layers": (VT.UINT32, 1)}, "missing key 'lilicorr.factor_dim'"),
    ({"dflash.attention.layer_norm_rms_epsilon": (VT.FLOAT32, -1.0)}, "must be a finite number >= 0"),
])
def test_keys_refused(tmp_path, tiny, edit, fragment):
    path = rewrite(tiny, tmp_path / "b.gguf", drop_keys=list(edit), set_keys=edit)
    with pytest.raises(GGUFModelError, match=None) as e:
        M.load(path)
    assert str(e.value).startswith(str(path)) and fragment in str(e.value), str(e.value)


def test_tensors_checked_before_ggml(tmp_path, tiny):
    with pytest.raises(GGUFModelError, match="missing tensor 'blk.1.ffn_up.weight'"):
        M.load(rewrite(tiny, tmp_path / "a.gguf", drop_tensors={"blk.1.ffn_up.weight"}))
    with pytest.raises(GGUFModelError, match=r"tensor 'blk.0.attn_q.weight' has shape \[64, 32\], expected \[64, 64\]"):
        M.load(rewrite(tiny, tmp_path / "b.gguf", reshape={"blk.0.attn_q.weight": (32, 64)}))
    # a tensor the loader does not create: llama.cpp's wrong number of tensors
    src = gguf.GGUFReader(str(tiny))
    w = gguf.GGUFWriter(str(tmp_path / "c.gguf"), "dflash")
    for name, f in src.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            vt = VT(int(f.types[0]))
            if vt == VT.ARRAY:
                sub = VT(int(f.types[1]))
                w.add_key_value(name, [bytes(f.parts[i]).decode() if sub == VT.STRING else f.parts[i][0].item()
                                       for i in f.data], vt, sub_type=sub)
            else:
                w.add_key_value(name, bytes(f.parts[f.data[0]]).decode() if vt == VT.STRING
                                else f.parts[f.data[0]][0].item(), vt)
    for t in src.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.add_tensor("blk.0.extra.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFModelError, match="tensor 'blk.0.extra.weight' is not one this dflash draft .base backbone. "
                                             "loads; .*wrong number of tensors"):
        M.load(tmp_path / "c.gguf")
    with pytest.raises(GGUFModelError, match="is a folder, not a GGUF file"):
        M.load(tmp_path)
    with pytest.raises(GGUFModelError, match="absent.gguf: no such file"):
        M.load(tmp_path / "absent.gguf")


def test_tensor_type_checks(tmp_path):
    class Ti:
        def __init__(self, name, tt, shape):
            self.name, self.tensor_type, self.shape = name, gguf.GGMLQuantizationType(tt), shape
    R = type("R", (), {})
    for tensors, fragment in (([Ti("blk.0.attn_q.weight", 26, [64, 64])], "has integer type i32"),
                              ([Ti("output_norm.weight", 1, [64])], "(1-D: a norm, bias or scale) has type F16"),
                              ([Ti("blk.0.attn_conv_base", 1, [64, 3, 2])], "is used elementwise"),
                              ([Ti("blk.0.ffn_up.weight", 8, [48, 64])], "48 values per row, not a multiple")):
        r = R()
        r.tensors = tensors
        with pytest.raises(GGUFModelError, match=None) as e:
            M.check_tensor_types(r, "p")
        assert fragment in str(e.value)
    r = R()
    r.tensors = [Ti("d2t", 27, [200]), Ti("blk.0.ffn_up.weight", 8, [64, 64]), Ti("output.weight", 1, [64, 256])]
    M.check_tensor_types(r, "p")


def test_memory_is_checked_before_allocating(monkeypatch):
    monkeypatch.setattr(M, "available_memory", lambda: 2**30)
    M.check_memory(2**29, "p")
    with pytest.raises(GGUFModelError, match=r"p: the weights need 2.00 GiB \(2147483648 bytes\), only 1.00 GiB"):
        M.check_memory(2**31, "p", "the weights")
    monkeypatch.setattr(M, "available_memory", lambda: None)
    M.check_memory(2**60, "p")
    assert M._gib(3 * 2**20) == "3.0 MiB"


def test_weights_placed_and_bound(tiny, cpu):
    m = M.load(tiny, backend=cpu, use_mmap=True)
    try:
        r = gguf.GGUFReader(str(tiny))
        assert set(m.tensors) == {t.name for t in r.tensors} and m.n_mapped == len(r.tensors)
        assert m.weight_bytes == sum(int(t.n_bytes) for t in r.tensors)
        assert m.mapping is not None and m.buffer
        # bound under upstream's field names, layer by layer
        assert G.tname(m.layers[1].wq) == "blk.1.attn_q.weight" and G.tname(m.tok_embd) == "token_embd.weight"
        assert m.layers[0].dflash_attn_conv_proj is None and m.dspark_markov_w1 is None
        assert [name for name, _, _ in m.tensor_table()] == [t.name for t in r.tensors]
        m.check_file()
    finally:
        m.close()
    assert m.buffer is None and m.mapping is None
    with no_mmap():
        m = M.load(tiny, backend=cpu)
        assert not m.use_mmap and m.n_mapped == 0 and m.mapping is None
        m.close()


def test_a_draft_without_embeddings_needs_its_target(tmp_path, tiny, cpu):
    path = rewrite(tiny, tmp_path / "b.gguf", drop_tensors={"token_embd.weight", "output.weight"})
    m = M.load(path)
    assert m.borrows == ["token_embd.weight", "output.weight"] and m.lender is None
    with pytest.raises(GGUFModelError, match="the draft has no 'token_embd.weight': it borrows the target model's"):
        m.upload(cpu)
    m.close()


def test_a_joint_head_needs_the_mistral_large_4_backbone(tmp_path):
    with pytest.raises(GGUFModelError, match="'joint_proj.weight' .* needs the Mistral Large 4 backbone's hidden state"):
        M.load(make_model(tmp_path / "j.gguf", "dspark", joint=True)["path"])
    assert M.load(make_model(tmp_path / "k.gguf", "dspark", "mistral-large4", joint=True)["path"]).backbone == \
        "mistral-large4"
