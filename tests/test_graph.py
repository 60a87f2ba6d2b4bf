"""graphgen/graph.py: GraphContext's shared builders computed on ggml's CPU backend and checked against
numpy (RMS norm, the gated FFNs, attention, the mixture of experts, the Hadamard rotation), with the
node names llama.cpp gives them; the rope parameters worked out by hand; the node budget. Whole
graphs node for node against llama.cpp: tests/reference/; the budget in a session:
tests/runtime/test_graph_budget.py."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from graphgen.graph import (AttnInput, GraphContext, GraphParams, graph_capacity, graph_max_nodes, hadamard,
                            mul_mat_hadamard, rope_params)
from graphgen.ops import ggml as G
from graphgen.ops.runtime import activate

EPS = 1e-6


def _hp(**kw):
    base = dict(n_layer=1, n_embd=8, n_head=2, n_head_kv=2, n_rot=4, rope_type=2, n_pos_per_embd=1,
                rope_scaling_type="linear", rope_freq_scale=1.0, rope_yarn_log_mul=0.0, rope_attn_factor=1.0,
                n_ctx_orig_yarn=0, n_ctx_train=4096, rope_freq_base=10000.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0,
                f_norm_rms_eps=EPS, ffn_op="silu", hc_mult=0, selector_rank=0)
    return SimpleNamespace(**dict(base, **kw))


class Graph:
    """A GraphContext over a fake draft: tensors made in its context, the builders called, then the
    graph computed on the CPU backend with the given values."""

    def __init__(self, n_tokens=3, pos=None, **hp):
        activate()
        self.g = GraphContext(GraphParams(model=SimpleNamespace(hparams=_hp(**hp)),
                                          ubatch=SimpleNamespace(n_tokens=n_tokens, pos=pos or list(range(n_tokens))),
                                          mem={}))
        self.values = []

    def tensor(self, values, ttype=None):
        """A tensor holding `values` (numpy's row-major shape, so ggml's ne is the shape reversed)."""
        values = np.ascontiguousarray(values, dtype=np.int32 if ttype == G.GGML_TYPE_I32 else np.float32)
        ne = list(reversed(values.shape))
        t = getattr(G, f"ggml_new_tensor_{len(ne)}d")(self.g.ctx0, ttype or G.GGML_TYPE_F32, *ne)
        self.values.append((t, values))
        return t

    def names(self):
        return [G.tname(G.ggml_graph_node(self.g.gf, i)) for i in range(G.ggml_graph_n_nodes(self.g.gf))]

    def compute(self, out):
        G.ggml_build_forward_expand(self.g.gf, out)
        backend = G.ggml_backend_cpu_init()
        buf = G.ggml_backend_alloc_ctx_tensors(self.g.ctx0, backend)
        try:
            for t, v in self.values:
                G.ggml_backend_tensor_set(t, v.ctypes.data, 0, v.nbytes)
            assert G.ggml_backend_graph_compute(backend, self.g.gf) == 0
            shape = [G.ne(out, i) for i in range(4)]
            res = np.empty(shape[::-1], np.float32)
            G.ggml_backend_tensor_get(out, res.ctypes.data, 0, res.nbytes)
            return res.reshape([n for n in shape[::-1] if n != 1] or [1])
        finally:
            G.ggml_backend_buffer_free(buf)
            G.ggml_backend_free(backend)

    def close(self):
        self.g.free()


@pytest.fixture
def graph():
    made = []

    def make(**kw):
        made.append(Graph(**kw))
        return made[-1]
    yield make
    for g in made:
        g.close()


rng = np.random.default_rng(7)


def _rms(x):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)


def _silu(x):
    return x / (1 + np.exp(-x))


# ---- the budget ---------------------------------------------------------------------------------

def test_the_node_budget():
    hp = _hp()
    assert graph_max_nodes(hp, 100, 64) == 1024 and graph_max_nodes(hp, 129, 64) == 1032
    assert graph_max_nodes(_hp(selector_rank=8), 80, 64) == 1024
    assert graph_max_nodes(_hp(selector_rank=8), 90, 64) == 1080
    # the hyper-connections: 40 a token or 32 a tensor, with no floor of 1024
    assert graph_max_nodes(_hp(hc_mult=4), 10, 5) == 320 and graph_max_nodes(_hp(hc_mult=4), 10, 9) == 360
    assert graph_capacity(1024) == 2 * 1024 + 4096


# ---- rope ---------------------------------------------------------------------------------------

def test_rope_params_linear_and_none():
    r = rope_params(_hp(rope_freq_scale=0.25, rope_attn_factor=1.5, n_ctx_train=2048))
    assert (r.freq_scale, r.ext_factor, r.attn_factor, r.n_ctx_orig) == (0.25, 0.0, 1.5, 2048)
    assert (r.freq_base, r.beta_fast, r.beta_slow) == (10000.0, 32.0, 1.0)
    # "none" turns the trained scale off
    assert rope_params(_hp(rope_scaling_type="none", rope_freq_scale=0.25)).freq_scale == 1.0


def test_rope_params_yarn():
    # factor 4: mscale = 1 + 0.1 ln 4, divided again by ggml's own correction 1 + 0.1 ln 4
    r = rope_params(_hp(rope_scaling_type="yarn", rope_freq_scale=0.25, n_ctx_orig_yarn=1024))
    assert (r.ext_factor, r.n_ctx_orig) == (1.0, 1024)
    assert r.attn_factor == pytest.approx(1.0, rel=1e-6)
    r = rope_params(_hp(rope_scaling_type="yarn", rope_freq_scale=0.25, rope_attn_factor=2.0))
    assert r.attn_factor == pytest.approx(2.0, rel=1e-6) and r.n_ctx_orig == 4096
    # Mistral Large 4's log multiplier: mscale(4, 1) / mscale(4, 0.5), then the correction
    r = rope_params(_hp(rope_scaling_type="yarn", rope_freq_scale=0.25, rope_yarn_log_mul=0.5))
    assert r.attn_factor == pytest.approx(1 / (1 + 0.05 * math.log(4)), rel=1e-6)
    # no scaling below a factor of 1
    r = rope_params(_hp(rope_scaling_type="yarn", rope_freq_scale=2.0))
    assert r.attn_factor == pytest.approx(1 / (1 + 0.1 * math.log(0.5)), rel=1e-6)


def test_rope_context_past_int_max_wraps_as_a_c_int():
    assert rope_params(_hp(n_ctx_orig_yarn=2 ** 31 + 5)).n_ctx_orig == -(2 ** 31) + 5
    assert rope_params(_hp(n_ctx_orig_yarn=2 ** 31 - 1)).n_ctx_orig == 2 ** 31 - 1


# ---- Hadamard -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 4, 64, 128])
def test_hadamard_is_the_orthonormal_sylvester_matrix(n):
    h = hadamard(n)
    assert h.shape == (n, n) and h.dtype == np.float32 and not h.flags.writeable
    signs = np.array([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)])
    np.testing.assert_array_equal(h, signs * np.float32(1 / np.sqrt(np.float32(n))))
    np.testing.assert_allclose(h.astype(np.float64) @ h.T, np.eye(n), atol=1e-6)
    assert hadamard(n) is h


def test_mul_mat_hadamard_rotates_each_block_of_values(graph):
    gr = graph()
    x = rng.standard_normal((3, 8)).astype(np.float32)
    h = hadamard(4)
    out = gr.compute(mul_mat_hadamard(gr.g.ctx0, gr.tensor(x), gr.tensor(h)))
    want = (x.reshape(3, 2, 4).astype(np.float64) @ h.T).reshape(3, 8)
    assert out.shape == (3, 8)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


# ---- norm, matmul, FFN --------------------------------------------------------------------------

def test_build_norm_rms_weight_and_bias(graph):
    gr = graph()
    x, w, b = rng.standard_normal((3, 8)), rng.standard_normal(8), rng.standard_normal(8)
    out = gr.compute(gr.g.build_norm(gr.tensor(x), gr.tensor(w), gr.tensor(b), 2))
    np.testing.assert_allclose(out, _rms(x.astype(np.float32)) * w.astype(np.float32) + b.astype(np.float32),
                               rtol=1e-5, atol=1e-5)
    assert gr.names()[:2] == ["norm-2", "norm_w-2"]


def test_build_norm_alone_and_with_weight_only(graph):
    gr = graph()
    x = rng.standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(gr.compute(gr.g.build_norm(gr.tensor(x), None, None, 0)), _rms(x), rtol=1e-5)
    assert gr.names() == ["node_0"]  # unnamed: the caller names it
    gr = graph()
    w = rng.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(gr.compute(gr.g.build_norm(gr.tensor(x), gr.tensor(w), None, 1)), _rms(x) * w,
                               rtol=1e-5, atol=1e-6)
    assert gr.names()[0] == "norm-1" and "norm_w-1" not in gr.names()


def test_build_lora_mm_with_and_without_a_scale(graph):
    gr = graph()
    w, x, s = rng.standard_normal((5, 8)), rng.standard_normal((3, 8)), rng.standard_normal(5)
    np.testing.assert_allclose(gr.compute(gr.g.build_lora_mm(gr.tensor(w), gr.tensor(x), gr.tensor(s))),
                               (x @ w.T) * s, rtol=1e-5, atol=1e-5)
    gr = graph()
    np.testing.assert_allclose(gr.compute(gr.g.build_lora_mm(gr.tensor(w), gr.tensor(x))), x @ w.T,
                               rtol=1e-5, atol=1e-5)


def _ffn_weights():
    return rng.standard_normal((6, 8)), rng.standard_normal((6, 8)), rng.standard_normal((8, 6))


def test_build_ffn_swiglu(graph):
    gr = graph()
    x = rng.standard_normal((3, 8))
    up, gate, down = _ffn_weights()
    out = gr.compute(gr.g.build_ffn(gr.tensor(x), gr.tensor(up), None, gr.tensor(gate), None, gr.tensor(down),
                                    None, 0))
    np.testing.assert_allclose(out, (_silu(x @ gate.T) * (x @ up.T)) @ down.T, rtol=1e-4, atol=1e-4)
    assert {"ffn_up-0", "ffn_gate-0", "ffn_swiglu-0"} <= set(gr.names())


def test_build_ffn_geglu_with_scales(graph):
    gr = graph(ffn_op="gelu")
    x = rng.standard_normal((3, 8))
    up, gate, down = _ffn_weights()
    su, sg, sd = rng.uniform(0.5, 2, 6), rng.uniform(0.5, 2, 6), rng.uniform(0.5, 2, 8)
    out = gr.compute(gr.g.build_ffn(gr.tensor(x), gr.tensor(up), gr.tensor(su), gr.tensor(gate), gr.tensor(sg),
                                    gr.tensor(down), gr.tensor(sd), 4))
    a = (x @ gate.T) * sg
    gelu = 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
    np.testing.assert_allclose(out, ((gelu * ((x @ up.T) * su)) @ down.T) * sd, rtol=2e-3, atol=2e-3)
    assert {"ffn_up-4", "ffn_up_s-4", "ffn_gate-4", "ffn_gate_s-4", "ffn_geglu-4", "ffn_down_s-4"} <= set(gr.names())


@pytest.mark.parametrize("il, limit, name", [(0, 7.0, "ffn_swiglu_limited-0"), (0, 0.0, "ffn_swiglu-0"),
                                             (-1, 7.0, "ffn_swiglu")])
def test_build_ffn_limited_clamps_only_where_asked(graph, il, limit, name):
    gr = graph()
    x = rng.standard_normal((3, 8))
    up, gate, down = _ffn_weights()
    out = gr.compute(gr.g.build_ffn_limited(gr.tensor(x), gr.tensor(up), gr.tensor(gate), gr.tensor(down), limit, il))
    assert name in gr.names()
    if name.endswith("limited-0"):
        return
    np.testing.assert_allclose(out, (_silu(x @ gate.T) * (x @ up.T)) @ down.T, rtol=1e-4, atol=1e-4)


# ---- attention ----------------------------------------------------------------------------------

def test_build_attn_mha_masked_softmax_attention(graph):
    n_head, hd, n_tok, n_kv = 2, 4, 3, 5
    gr = graph(n_tokens=n_tok)
    q = rng.standard_normal((n_tok, n_head, hd))
    k = rng.standard_normal((n_kv, n_head, hd))
    v = rng.standard_normal((n_kv, n_head, hd))
    mask = np.zeros((n_tok, n_kv))
    mask[0, 3:] = mask[1, 4:] = -np.inf  # token t sees cells 0..t+2
    scale = 0.5
    out = gr.compute(gr.g.build_attn_mha(gr.tensor(q), gr.tensor(k[None]), gr.tensor(v[None]), gr.tensor(mask),
                                         None, scale, 1))
    want = np.empty((n_tok, n_head, hd))
    for h in range(n_head):
        s = scale * q[:, h] @ k[:, h].T + mask
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        want[:, h] = p @ v[:, h]
    np.testing.assert_allclose(out, want.reshape(n_tok, n_head * hd), rtol=1e-4, atol=1e-5)
    assert sorted(n for n in gr.names() if n.endswith("-1")) == ["kq-1", "kq_soft_max-1", "kqv-1", "v_cont-1"]


# ---- the mixture of experts ---------------------------------------------------------------------

def _softplus(x):
    return np.log1p(np.exp(x))


@pytest.mark.parametrize("gating, bias, norm_w, w_scale", [(1, False, False, 1.0), (1, False, True, 2.5),
                                                            (2, True, True, 1.0), (3, False, False, 1.0),
                                                            (4, True, False, 0.5)])
def test_build_moe_ffn(graph, gating, bias, norm_w, w_scale):
    n_embd, n_ff, n_exp, n_used, n_tok = 8, 6, 4, 2, 3
    gr = graph(n_tokens=n_tok)
    x = rng.standard_normal((n_tok, n_embd))
    gate_inp = rng.standard_normal((n_exp, n_embd))
    up, gate, down = (rng.standard_normal((n_exp, n_ff, n_embd)), rng.standard_normal((n_exp, n_ff, n_embd)),
                      rng.standard_normal((n_exp, n_embd, n_ff)))
    b = rng.standard_normal(n_exp) * 3 if bias else None
    out = gr.compute(gr.g.build_moe_ffn(gr.tensor(x), gr.tensor(gate_inp), gr.tensor(up), gr.tensor(gate),
                                        gr.tensor(down), gr.tensor(b) if bias else None, n_exp, n_used, norm_w,
                                        w_scale, gating, 0.0, 0))
    logits = x @ gate_inp.T
    probs = {1: lambda z: np.exp(z) / np.exp(z).sum(1, keepdims=True), 2: lambda z: 1 / (1 + np.exp(-z)),
             3: lambda z: z, 4: lambda z: np.sqrt(_softplus(z))}[gating](logits)
    want = np.zeros((n_tok, n_embd))
    for t in range(n_tok):
        sel = np.argsort(-(probs[t] + (b if bias else 0)), kind="stable")[:n_used]
        w = probs[t, sel]
        if gating == 3:
            w = np.exp(w - w.max()) / np.exp(w - w.max()).sum()
        if norm_w:
            w = w / w.sum()
        w = w * w_scale
        for e, we in zip(sel, w):
            want[t] += we * (down[e] @ (_silu(gate[e] @ x[t]) * (up[e] @ x[t])))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    names = gr.names()
    assert {"ffn_moe_probs-0", "ffn_moe_topk-0", "ffn_moe_weights-0", "ffn_moe_up-0", "ffn_moe_gate-0",
            "ffn_moe_swiglu-0", "ffn_moe_down-0", "ffn_moe_weighted-0", "ffn_moe_out-0"} <= set(names)
    assert ("ffn_moe_logits-0" in names) == (gating != 3)  # the identity gating's probabilities are its logits
    assert ("ffn_moe_probs_biased-0" in names) == bias and ("ffn_moe_weights_norm-0" in names) == norm_w
    assert ("ffn_moe_weights_scaled-0" in names) == (w_scale != 1.0)
    assert ("ffn_moe_weights_softmax-0" in names) == (gating == 3)


def test_an_unknown_gating_is_refused(graph):
    gr = graph()
    with pytest.raises(ValueError, match="unsupported expert gating function 5"):
        gr.g.build_moe_ffn(gr.tensor(np.zeros((3, 8))), gr.tensor(np.zeros((4, 8))), None, None, None, None, 4, 2,
                           False, 1.0, 5, 0.0, 0)


# ---- inputs -------------------------------------------------------------------------------------

def test_positions_input_one_row_or_four_for_m_rope(graph):
    gr = graph(pos=[5, 6, 7])
    t = gr.g.build_inp_pos()
    (inp, values), = gr.g.res.inputs
    assert inp is t and G.tname(t) == "inp_pos" and G.ne(t, 0) == 3
    np.testing.assert_array_equal(values(gr.g.params), [5, 6, 7])
    gr = graph(pos=[5, 6, 7], n_pos_per_embd=4)
    t = gr.g.build_inp_pos()
    assert G.ne(t, 0) == 12
    np.testing.assert_array_equal(gr.g.res.inputs[0][1](gr.g.params), [5, 6, 7] * 3 + [0, 0, 0])


def test_attention_inputs_pick_the_sliding_windows_own():
    base, swa = SimpleNamespace(name="base"), SimpleNamespace(name="swa")
    inp = AttnInput(base=base, self_k_idxs="k", self_v_idxs="v", self_kq_mask="m", swa=swa, self_k_idxs_swa="ks",
                    self_v_idxs_swa="vs", self_kq_mask_swa="ms", self_k_rot="kr", self_v_rot="vr",
                    self_k_rot_swa="krs", self_v_rot_swa="vrs")
    assert [inp.slot(False), inp.get_k_idxs(), inp.get_v_idxs(), inp.get_kq_mask(), inp.get_k_rot(), inp.get_v_rot()] \
        == [base, "k", "v", "m", "kr", "vr"]
    assert [inp.slot(True), inp.get_k_idxs(True), inp.get_v_idxs(True), inp.get_kq_mask(True), inp.get_k_rot(True),
            inp.get_v_rot(True)] == [swa, "ks", "vs", "ms", "krs", "vrs"]
