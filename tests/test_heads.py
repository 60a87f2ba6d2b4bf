"""The heads: metadata upstream rejects, equal blocks, and the seed-only DSpark RNN joint head."""

import ctypes

import gguf
import numpy as np
import pytest

from gguf_edit import rewrite
from graphgen.errors import BatchError, GGUFModelError
from graphgen.models.dflash import GraphBase
from graphgen.models.dspark import build_dspark_markov_head
from graphgen.ops import ggml as G
from graphgen.record import NodeRecorder
from graphgen.runtime import session as session_mod
from graphgen.runtime.model import load
from graphgen.runtime.session import Session
from graphgen.synth import make_model

U32 = gguf.GGUFValueType.UINT32


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    d = tmp_path_factory.mktemp("heads")
    out = {}
    for v in ("dflash2", "dspark", "lilicorr"):
        out[v] = d / f"{v}.gguf"
        make_model(out[v], v, seed=2)
    return out


def test_selector_without_conv_keys(drafts, tmp_path):
    p = rewrite(drafts["dflash2"], tmp_path / "a.gguf", drop_keys={"dflash.conv_kernel_size"})
    with pytest.raises(GGUFModelError, match="DFlash2 model is missing conv/selector metadata"):
        load(p)


def test_selector_lattice_too_wide(drafts, tmp_path):
    p = rewrite(drafts["dflash2"], tmp_path / "a.gguf", drop_keys={"dflash.selector_top_k"},
                set_keys={"dflash.selector_top_k": (U32, 8)})  # 8 * 9 > n_embd 64
    with pytest.raises(GGUFModelError, match="too small for the selector lattice"):
        load(p)


def test_dflash2_missing_block_size(drafts, tmp_path):
    p = rewrite(drafts["dflash2"], tmp_path / "a.gguf", drop_keys={"dflash.block_size"})
    with pytest.raises(GGUFModelError, match="block_size"):
        load(p)


def test_dspark_missing_block_size(drafts, tmp_path):
    p = rewrite(drafts["dspark"], tmp_path / "a.gguf", drop_keys={"dflash.block_size"})
    with pytest.raises(GGUFModelError, match="block_size"):
        load(p)


def test_lilicorr_hidden_not_divisible_by_heads(drafts, tmp_path):
    p = rewrite(drafts["lilicorr"], tmp_path / "a.gguf", drop_keys={"lilicorr.num_heads"},
                set_keys={"lilicorr.num_heads": (U32, 3)})
    with pytest.raises(GGUFModelError, match="invalid LiLiCorr DFlash metadata"):
        load(p)


def test_lilicorr_with_a_selector(drafts, tmp_path):
    p = rewrite(drafts["lilicorr"], tmp_path / "a.gguf", set_keys={"dflash.selector_top_k": (U32, 2)})
    with pytest.raises(GGUFModelError, match="invalid LiLiCorr DFlash metadata"):
        load(p)


def test_unequal_blocks_are_refused(drafts):
    with Session(drafts["dspark"], n_seq=2) as s:
        x = np.zeros((3, s.hparams.n_embd_inp_enc), np.float32)
        s.inject(x, 0, 0)
        s.inject(x, 0, 1)
        with pytest.raises(BatchError, match="equal blocks"):
            s.block_multi([(0, [7, 255, 255, 255], 3), (1, [7, 255, 255], 3)])
        r = s.block_multi([(0, [7, 255, 255, 255], 3), (1, [9, 255, 255, 255], 3)])
        assert r.logits.shape == (8, 256)


def test_joint_head_refused_on_the_base_backbone(tmp_path):
    p = tmp_path / "joint.gguf"
    make_model(p, "dspark", joint=True)
    with pytest.raises(GGUFModelError, match="joint_proj"):
        load(p)


# -- the RNN joint head (seed only: b11739 has none), fed the normed hidden state as ML4 does --

class _Weights:
    """Extra f32 tensors on the model's backend, for a head the loader does not attach here."""

    def __init__(self, backend, arrays: dict):
        n = len(arrays)
        self.ctx = G.ggml_init(G.ggml_init_params(mem_size=G.ggml_tensor_overhead() * (n + 1),
                                                  mem_buffer=None, no_alloc=True))
        self.t = {}
        for name, a in arrays.items():
            ne = list(reversed(a.shape)) + [1] * (4 - a.ndim)
            t = G.ggml_new_tensor(self.ctx, G.GGML_TYPE_F32, a.ndim, (ctypes.c_int64 * 4)(*ne))
            G.set_name(t, name)
            self.t[name] = t
        self.buf = G.ggml_backend_alloc_ctx_tensors(self.ctx, backend)
        for name, a in arrays.items():
            a = np.ascontiguousarray(a, dtype=np.float32)
            G.ggml_backend_tensor_set(self.t[name], a.ctypes.data_as(ctypes.c_void_p), 0, a.nbytes)


class GraphDSparkRNN(GraphBase):
    def __init__(self, params):
        super().__init__(params)
        if self.ubatch.is_embd:
            self.build_inject()
            return
        inp_tokens = self.build_inp_tokens()
        cur = self.build_layers(inp_tokens)
        self.build_logits(cur)
        build_dspark_markov_head(self, self.model, inp_tokens, hidden=cur)


# the seed's build_dspark_markov_head for one block of 2 with the RNN head and no confidence head,
# in ggml's depth-first order from the final expand (written from the seed's code, after
# result_output): position 0 biases with chunk 2 of the first joint projection; position 1 needs
# the updated state (chunks 0 and 1 of position 0), the argmax of position 0 and a second projection
SEED_RNN_OPS_BLOCK2 = [
    "VIEW",                                   # base_i, i = 0
    "FILL",                                   # zero state
    "VIEW", "CONT", "GET_ROWS",               # anchor token -> markov_w1 row
    "CONCAT",                                 # [state; w1_prev]
    "VIEW", "CONT", "CONCAT",                 # ... ; hidden_0
    "MUL_MAT", "ADD",                         # joint_proj . joint + b
    "VIEW", "CONT", "TANH",                   # markov = tanh(chunk 2)
    "MUL_MAT", "ADD",                         # bias = w2 . markov; col 0
    "VIEW",                                   # base_i, i = 1
    "VIEW", "CONT", "TANH",                   # cand = tanh(chunk 1)
    "VIEW", "CONT", "SIGMOID",                # gate = sigmoid(chunk 0)
    "SUB", "MUL", "ADD",                      # state = cand + gate * (state - cand)
    "ARGMAX", "GET_ROWS", "CONCAT",           # prev = argmax(col 0); [state; w1_prev]
    "VIEW", "CONT", "CONCAT",                 # ... ; hidden_1
    "MUL_MAT", "ADD", "VIEW", "CONT", "TANH",
    "MUL_MAT", "ADD",                         # col 1
    "CONCAT",                                 # cat
    "RESHAPE", "PERMUTE", "CONT", "RESHAPE",  # back to block-major order
]


def test_rnn_joint_head_against_the_seed(drafts, monkeypatch):
    rng = np.random.default_rng(11)
    model = load(drafts["dspark"])
    hp = model.hparams
    with Session(model) as s:
        rank = G.ne(s.model.dspark_markov_w1, 0)
        wj = (rng.standard_normal((3 * rank, hp.n_embd + 2 * rank)) * 0.2).astype(np.float32)
        bj = (rng.standard_normal(3 * rank) * 0.1).astype(np.float32)
        extra = _Weights(s.backend, {"joint_proj.weight": wj, "joint_proj.bias": bj})
        s.model.dspark_joint_proj = extra.t["joint_proj.weight"]
        s.model.dspark_joint_proj_b = extra.t["joint_proj.bias"]
        monkeypatch.setattr(session_mod, "build_arch_graph", lambda p: GraphDSparkRNN(p))

        s.inject(rng.standard_normal((5, hp.n_embd_inp_enc), dtype=np.float32), 0)
        rec = NodeRecorder(G.op_desc, G.type_name)
        out = s.block([7, 255], 5, recorder=rec).logits

    names = [n.name for n in rec.nodes]
    i_out = names.index("result_output")
    assert [n.op for n in rec.nodes[i_out + 1:]] == SEED_RNN_OPS_BLOCK2

    # the same formula in numpy from the graph's own logits and hidden state
    base = rec.values[i_out].reshape(2, -1)
    hidden = rec.values[names.index("result_norm")].reshape(2, -1)
    r = gguf.GGUFReader(str(drafts["dspark"]))
    t = {x.name: np.array(x.data) for x in r.tensors}
    w1, w2 = t["markov_w1.weight"], t["markov_w2.weight"]
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    state = np.zeros(rank, np.float32)
    prev, cols = 7, []
    for i in range(2):
        joint = wj @ np.concatenate([state, w1[prev], hidden[i]]) + bj
        gate, cand, mk = sig(joint[:rank]), np.tanh(joint[rank:2 * rank]), np.tanh(joint[2 * rank:])
        state = cand + gate * (state - cand)
        col = base[i] + w2 @ mk
        cols.append(col)
        prev = int(np.argmax(col))
    np.testing.assert_allclose(out, np.stack(cols), rtol=1e-4, atol=1e-4)
