"""The DSpark backbones: DeepSeek-V4 against llama.cpp b11739, DeepSeek-V4.1 and Mistral Large 4
(seed only) against the seed's op order and a numpy re-implementation of a stage."""

import json
import math
import re

import gguf
import numpy as np
import pytest

from conftest import REF_DIR
from gguf_edit import rewrite
from graphgen.diff import diff_paths
from graphgen.dump import load_dump
from graphgen.engine import run_scenario
from graphgen.errors import GGUFModelError
from graphgen.runtime.kvcache import KVCache, UBatch
from graphgen.runtime.model import load
from graphgen.scenario import parse_scenario
from graphgen.synth import make_model
from make_references import build_model
from parity_check import assert_parity

AUTO = re.compile(r"\b(node|leaf)_\d+\b|^ ")


def named(nodes):
    """The cb-named nodes: not ggml's automatic names, nor derived ones (" (view)", " (reshaped)")."""
    return [n for n in nodes if not AUTO.search(n.name) and "(" not in n.name]


def scenario(flash_attn=False, type_kv="f16", block=(7, 255, 255, 255)):
    return parse_scenario({"n_ctx": 256, "n_ubatch": 64, "flash_attn": "on" if flash_attn else "off",
                           "type_kv": type_kv, "seed": 1,
                           "steps": [{"inject": {"n_tokens": 6, "pos0": 0}},
                                     {"block": {"tokens": list(block), "pos0": 6}}]})


# --- DeepSeek-V4 against b11739 ---------------------------------------------------------------

def test_dsv4_reference_as_documented():
    """reference-llama-cpp.md: inject 17, block 270 / 260; 12 fused HC nodes, 4 SWIGLU_CLAMP."""
    for case, block in (("dsv4-fa-off", 270), ("dsv4-fa-on", 260)):
        inj = json.loads(next((REF_DIR / case).glob("*-inject.json")).read_text())
        blk = json.loads(next((REF_DIR / case).glob("*-block.json")).read_text())
        assert blk["source"]["version"] == "b11739"
        assert (len(inj["nodes"]), len(blk["nodes"])) == (17, block)
        ops = [n["op"] for n in blk["nodes"]]
        assert sum(op.startswith("DSV4_HC_") for op in ops) == 12
        assert ops.count("SWIGLU_CLAMP") == 4
        fused = {n["name"] for n in blk["nodes"] if n["op"] in ("DSV4_HC_PRE", "DSV4_HC_POST")}
        assert fused == {f"{k}-{il}" for k in ("hc_attn_pre", "hc_attn_post", "hc_ffn_pre", "l_out") for il in (0, 1)}


@pytest.mark.parametrize("case", ["dsv4-fa-off", "dsv4-fa-on"])
def test_dsv4_matches_llama_cpp(case, tmp_path, models_dir):
    """No equivalence rule: the fused ops are built as upstream builds them, node for node."""
    case_dir = REF_DIR / case
    model = build_model(case_dir, models_dir)
    run_scenario(model, parse_scenario(json.loads((case_dir / "scenario.json").read_text())), tmp_path)
    results = diff_paths(case_dir, tmp_path)
    assert [r.graph for r in results] == ["inject", "block"]
    assert_parity(results, case)
    with load_dump(results[1].ours_path) as ours:
        ops = [n.op for n in ours.nodes]
        assert sum(op.startswith("DSV4_HC_") for op in ops) == 12 and ops.count("SWIGLU_CLAMP") == 4
        # every node's values were compared, not only the named ones
        assert len(results[1].numeric) == len(ours.nodes)


# --- loader ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backbone, edit, match", [
    ("dsv4", {"dflash.expert_gating_func": (gguf.GGUFValueType.UINT32, 1)}, "expects sqrtsoftplus MoE scoring"),
    ("dsv4", {"dflash.attention.compress_ratios": (gguf.GGUFValueType.ARRAY, [0, 4])},
     "expects uncompressed attention on all stages"),
    ("dsv4", {"dflash.hyper_connection.count": (gguf.GGUFValueType.UINT32, 2)}, "exactly 4 streams"),
    ("mistral-large4", {"dflash.attention.sliding_window": (gguf.GGUFValueType.UINT32, 0)},
     "DSpark Mistral Large 4 draft expects a sliding window"),
    ("mistral-large4", {"dflash.attention.key_length": (gguf.GGUFValueType.UINT32, 40)},
     r"expects key_length == kv_lora_rank \+ rope dim"),
])
def test_loader_errors(tmp_path, backbone, edit, match):
    src = make_model(tmp_path / "a.gguf", "dspark", backbone)["path"]
    dst = tmp_path / "b.gguf"
    rewrite(src, dst, drop_keys=list(edit), set_keys=edit)
    with pytest.raises(GGUFModelError, match=match):
        load(dst)


def test_backbones_load(tmp_path):
    for backbone, n_swa in (("dsv4", 16), ("dsv41", 17), ("mistral-large4", 17)):
        m = load(make_model(tmp_path / f"{backbone}.gguf", "dspark", backbone)["path"])
        assert m.backbone == backbone and m.variant == "dspark"
        # n_swa + 1 on DSV4.1 and ML4: the block's window is its anchor's
        assert m.hparams.n_swa == n_swa and m.hparams.swa_layers == [True, True]


# --- block-uniform mask ------------------------------------------------------------------------

def test_block_uniform_mask():
    class HP:
        n_embd_k_gqa = n_embd_v_gqa = 8
    c = KVCache(HP(), [], 32, 1, 1, False, n_swa=5)
    c.apply_ubatch(list(range(8)), UBatch(pos=np.arange(8, dtype=np.int32), seq=np.zeros(8, np.int32)))
    blocks = UBatch(pos=np.array([8, 9, 10, 11, 4, 5, 6, 7], np.int32), seq=np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32))
    c.apply_ubatch(list(range(8, 12)), UBatch(pos=blocks.pos[:4], seq=blocks.seq[:4]))
    c.apply_ubatch(list(range(12, 16)), UBatch(pos=blocks.pos[4:], seq=blocks.seq[4:]))
    plain = c.kq_mask_values(blocks, 32, False, np.float32)
    uni = c.kq_mask_values(blocks, 32, False, np.float32, block_uniform=True)
    for rows in (range(0, 4), range(4, 8)):
        for i in rows:
            assert np.array_equal(uni[i], plain[rows[0]])  # every query row is the anchor's row
    # the window of a later query would hide keys the anchor sees
    assert not np.array_equal(plain[3], plain[0])
    # the anchor (pos 8) sees pos 4..7 (window 5) and every key of its block, nothing of seq 1
    seen = {int(c.pos[j]) for j in np.nonzero(uni[0] == 0)[0]}
    assert seen == {4, 5, 6, 7, 8, 9, 10, 11}


# --- DeepSeek-V4.1 and Mistral Large 4: the seed's op order --------------------------------------

# the cb-named nodes of a one-layer draft's graphs, in evaluation order, read off the seed's
# graph_dsv41 / graph_mistral_large4 and the helpers they call (FA off)
DSV41_INJECT = [("norm", "RMS_NORM"), ("main_x", "MUL"), ("norm-0", "RMS_NORM"), ("kv_injected-0", "ROPE")]
DSV41_BLOCK = [
    ("inp_noise_embd", "GET_ROWS"), ("hc_init", "REPEAT"), ("hc_attn_pre-0", "CONT"), ("norm-0", "RMS_NORM"),
    ("attn_norm-0", "MUL"), ("norm-0", "RMS_NORM"), ("qr_norm-0", "MUL"), ("q-0", "ROPE"),
    ("norm-0", "RMS_NORM"), ("kv-0", "ROPE"), ("v_cont-0", "CONT"), ("kq-0", "MUL_MAT"),
    ("kq_soft_max-0", "SOFT_MAX"), ("kqv-0", "MUL_MAT"), ("attn_raw-0", "CONT"), ("attn_derope-0", "ROPE_BACK"),
    ("attn_wo_a-0", "MUL_MAT"), ("attn_out-0", "MUL_MAT"), ("hc_mixes-0", "MUL_MAT"), ("hc_post-0", "SCALE"),
    ("hc_comb-0", "DSV4_HC_COMB"), ("hc_attn_post-0", "DSV4_HC_POST"), ("hc_pre-0", "SCALE"), ("hc_ffn_pre-0", "DSV4_HC_PRE"),
    ("norm-0", "RMS_NORM"), ("ffn_norm-0", "MUL"), ("ffn_moe_logits-0", "MUL_MAT"), ("ffn_moe_probs-0", "SQRT"),
    ("ffn_moe_probs_biased-0", "ADD"), ("ffn_moe_argsort-0", "ARGSORT"), ("ffn_moe_topk-0", "VIEW"),
    ("ffn_moe_weights-0", "GET_ROWS"), ("ffn_moe_weights_sum-0", "SUM_ROWS"),
    ("ffn_moe_weights_sum_clamped-0", "CLAMP"), ("ffn_moe_weights_norm-0", "DIV"),
    ("ffn_moe_weights_scaled-0", "SCALE"), ("ffn_moe_gate-0", "MUL_MAT_ID"), ("ffn_moe_up-0", "MUL_MAT_ID"),
    ("ffn_moe_swiglu_limited-0", "SWIGLU_CLAMP"), ("ffn_moe_down-0", "MUL_MAT_ID"), ("ffn_moe_weighted-0", "MUL"),
    ("ffn_moe_out-0", "ADD"), ("ffn_gate-0", "MUL_MAT"), ("ffn_up-0", "MUL_MAT"),
    ("ffn_swiglu_limited-0", "SWIGLU_CLAMP"), ("ffn_shexp-0", "MUL_MAT"), ("ffn_out-0", "ADD"),
    ("hc_mixes-0", "MUL_MAT"), ("hc_post-0", "SCALE"), ("hc_comb-0", "DSV4_HC_COMB"), ("l_out-0", "RESHAPE"),
    ("hc_pre-0", "SCALE"), ("hc_out", "ADD"), ("norm", "RMS_NORM"), ("result_norm", "MUL"),
    ("result_output", "MUL_MAT"),
]
ML4_INJECT = [("norm", "RMS_NORM"), ("main_x", "MUL"), ("kv_cmpr_pe-0", "MUL_MAT"), ("norm-0", "RMS_NORM"),
              ("kv_cmpr-0", "RESHAPE"), ("k_pe-0", "ROPE"), ("kv_injected-0", "CONCAT")]
ML4_BLOCK = [
    ("inp_noise_embd", "RESHAPE"), ("norm-0", "RMS_NORM"), ("attn_norm-0", "MUL"), ("q-0", "MUL_MAT"),
    ("q_nope_absorbed-0", "PERMUTE"), ("q_pe-0", "ROPE"), ("Qcur-0", "CONCAT"), ("kv_cmpr_pe-0", "MUL_MAT"),
    ("norm-0", "RMS_NORM"), ("kv_cmpr-0", "RESHAPE"), ("k_pe-0", "ROPE"), ("Kcur-0", "CONCAT"),
    ("v_cont-0", "CONT"), ("kq-0", "MUL_MAT"), ("kq_soft_max-0", "SOFT_MAX"), ("kqv-0", "MUL_MAT"),
    ("attn_latent-0", "CONT"), ("attn_out-0", "MUL_MAT"), ("ffn_inp-0", "ADD"), ("norm-0", "RMS_NORM"),
    ("ffn_norm-0", "MUL"), ("ffn_gate-0", "MUL_MAT"), ("ffn_up-0", "MUL_MAT"), ("ffn_swiglu-0", "SWIGLU"),
    ("ffn_out-0", "MUL_MAT"), ("l_out-0", "ADD"), ("norm", "RMS_NORM"), ("result_norm", "MUL"),
    ("result_output", "SCALE"),
]


@pytest.mark.parametrize("backbone, inject, block, n_nodes", [
    ("dsv41", DSV41_INJECT, DSV41_BLOCK, (10, 157)),
    ("mistral-large4", ML4_INJECT, ML4_BLOCK, (13, 154)),
])
def test_seed_op_order(tmp_path, backbone, inject, block, n_nodes):
    path = make_model(tmp_path / "m.gguf", "dspark", backbone, n_layer=1, joint=backbone == "mistral-large4")["path"]
    run_scenario(path, scenario(), tmp_path / "out")
    with load_dump(next((tmp_path / "out").glob("*-inject.json"))) as d:
        assert [(n.name, n.op) for n in named(d.nodes)] == inject
        assert len(d.nodes) == n_nodes[0]
    with load_dump(next((tmp_path / "out").glob("*-block.json"))) as d:
        assert [(n.name, n.op) for n in named(d.nodes)] == block
        assert len(d.nodes) == n_nodes[1]
        # the Markov head (greedy chain over the block) follows result_output
        assert d.nodes[-1].op == "RESHAPE"


# --- numpy re-implementations of one stage -------------------------------------------------------

def _weights(path):
    return {t.name: np.array(t.data, dtype=np.float32) for t in gguf.GGUFReader(str(path)).tensors}


def _values(path):
    out = {}
    with load_dump(path) as d:
        for i, n in enumerate(d.nodes):
            v = d.values(i)
            if v is not None:
                out[n.name] = np.asarray(v, dtype=np.float64)
    return out


def _rms(x, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _rel(a, b):
    return float(np.linalg.norm(np.ravel(a) - np.ravel(b)) / np.linalg.norm(np.ravel(b)))


def _rope_norm(x, pos, n_dims, base, inverse=False):
    """NORM mode (adjacent pairs) on the whole last axis, x [T, ..., n_dims]."""
    i = np.arange(n_dims // 2)
    theta = pos[:, None] * base ** (-2.0 * i / n_dims)
    if inverse:
        theta = -theta
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (n_dims // 2,)
    c, s = np.cos(theta).reshape(shape), np.sin(theta).reshape(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def _rope_neox_yarn(x, pos, n_dims, base, freq_scale, n_ctx_orig, ext_factor, attn_factor, beta_fast, beta_slow):
    """ggml's rope_yarn, NEOX mode (pairs i, i + n_dims/2)."""
    def corr(beta):
        return n_dims * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = max(0.0, math.floor(corr(beta_fast))), min(n_dims - 1.0, math.ceil(corr(beta_slow)))
    i = np.arange(n_dims // 2)
    theta_extrap = pos[:, None] * base ** (-2.0 * i / n_dims)
    theta_interp = freq_scale * theta_extrap
    mscale = attn_factor
    if ext_factor != 0.0:
        y = (i - lo) / max(0.001, hi - lo)
        ramp = (1 - np.minimum(1, np.maximum(0, y))) * ext_factor
        theta = theta_interp * (1 - ramp) + theta_extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    else:
        theta = theta_interp
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (n_dims // 2,)
    c, s = (np.cos(theta) * mscale).reshape(shape), (np.sin(theta) * mscale).reshape(shape)
    h = n_dims // 2
    x0, x1 = x[..., :h], x[..., h:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def _block_uniform_mask(pos_keys, pos_q, n_swa):
    """Non-causal, the anchor's (first query's) sliding-window row for every query."""
    keep = ~((pos_q[0] - pos_keys) >= n_swa)
    return np.where(np.broadcast_to(keep, (len(pos_q), len(pos_keys))), 0.0, -np.inf)


def _attend(q, k, v, mask, scale, sinks=None):
    """q [T, H, D], k [N, Dk], v [N, Dv] -> [T, H, Dv]; softmax with optional per-head sinks."""
    s = np.einsum("thd,nd->thn", q, k) * scale + mask[:, None, :]
    m = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, sinks[None, :, None])
    e = np.exp(s - m)
    den = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        den = den + np.exp(sinks[None, :, None] - m)
    return np.einsum("thn,nd->thd", e / den, v)


def _hc_mixes(x, fn, scale, base, eps, n_iter):
    T, hc, E = x.shape
    mixes = _rms(x.reshape(T, hc * E)) @ fn.T
    pre = 1 / (1 + np.exp(-(mixes[:, :hc] * scale[0] + base[:hc]))) + eps
    post = 2 / (1 + np.exp(-(mixes[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])))
    comb = (mixes[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(T, hc, hc)  # [T, src, dst]
    comb = np.exp(comb - comb.max(-1, keepdims=True))
    comb = comb / comb.sum(-1, keepdims=True) + eps
    comb = comb / (comb.sum(1, keepdims=True) + eps)  # columns: each dst over its sources
    for _ in range(1, n_iter):
        comb = comb / (comb.sum(-1, keepdims=True) + eps)
        comb = comb / (comb.sum(1, keepdims=True) + eps)
    return pre, post, comb


def _hc_post(x, residual, post, comb):
    return x[:, None, :] * post[:, :, None] + np.einsum("tse,tsd->tde", residual, comb)


def _moe(x, w, blk, n_used, limit, limit_sh, w_scale):
    logits = x @ w[blk + "ffn_gate_inp.weight"].T
    probs = np.sqrt(np.log1p(np.exp(logits)))
    sel = np.argsort(-(probs + w[blk + "exp_probs_b.bias"]), axis=-1, kind="stable")[:, :n_used]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        wts = probs[t, sel[t]]
        wts = wts / max(wts.sum(), 6.103515625e-5) * w_scale
        for e, we in zip(sel[t], wts):
            g = w[blk + "ffn_gate_exps.weight"][e] @ x[t]
            u = w[blk + "ffn_up_exps.weight"][e] @ x[t]
            out[t] += we * (w[blk + "ffn_down_exps.weight"][e] @ (_silu(np.minimum(g, limit)) * np.clip(u, -limit, limit)))
    g, u = x @ w[blk + "ffn_gate_shexp.weight"].T, x @ w[blk + "ffn_up_shexp.weight"].T
    sh = (_silu(np.minimum(g, limit_sh)) * np.clip(u, -limit_sh, limit_sh)) @ w[blk + "ffn_down_shexp.weight"].T
    return out + sh


def _run_one_layer(tmp_path, backbone, **kw):
    path = make_model(tmp_path / "m.gguf", "dspark", backbone, n_layer=1, **kw)["path"]
    run_scenario(path, scenario(type_kv="f32"), tmp_path / "out")
    inj = _values(next((tmp_path / "out").glob("*-inject.json")))
    blk = _values(next((tmp_path / "out").glob("*-block.json")))
    return load(path).hparams, _weights(path), inj, blk


def test_dsv41_stage_numpy(tmp_path):
    """Stage 0 of DSV4.1 (attention with sinks and grouped output, MoE + shared expert, single-pass
    mHC with Sinkhorn) in numpy, against the graph's values; a window of 4 makes the block-uniform
    mask matter."""
    hp, w, inj, blk = _run_one_layer(tmp_path, "dsv41", swa_window=4)
    b = "blk.0."
    D, H, R, nr = hp.n_embd_head_k, hp.n_head, hp.dsv4_o_lora_rank, hp.n_rot
    G_ = hp.dsv4_o_group_count
    pos_q, pos_k = np.arange(6, 10, dtype=np.float64), np.arange(0, 10, dtype=np.float64)

    def rope(t, pos, inverse=False):
        out = t.copy()
        out[..., D - nr:] = _rope_norm(t[..., D - nr:], pos, nr, hp.rope_freq_base, inverse)
        return out

    x = blk["hc_init"][0]                                        # [T, hc, E]
    T = x.shape[0]
    # stage 0: identity pre-mix, then attention
    attn_norm = _rms(x[:, 0, :]) * w[b + "attn_norm.weight"]
    qr = _rms(attn_norm @ w[b + "attn_q_a.weight"].T) * w[b + "attn_q_a_norm.weight"]
    q = rope((qr @ w[b + "attn_q_b.weight"].T).reshape(T, H, D), pos_q)
    kv = rope(_rms(attn_norm @ w[b + "attn_kv.weight"].T) * w[b + "attn_kv_a_norm.weight"], pos_q)
    k = np.concatenate([inj["kv_injected-0"].reshape(6, D), kv])
    mask = _block_uniform_mask(pos_k, pos_q, hp.n_swa)
    assert np.isinf(mask).any()  # the window hides the oldest injected positions
    out = _attend(q, k, k, mask, 1 / math.sqrt(D), w[b + "attn_sinks.weight"])
    out = rope(out, pos_q, inverse=True).reshape(T, G_, H // G_ * D)
    oa = np.einsum("grk,tgk->tgr", w[b + "attn_output_a.weight"], out).reshape(T, G_ * R)
    attn_out = oa @ w[b + "attn_output_b.weight"].T
    assert _rel(attn_out, blk["attn_out-0"][0, 0]) < 1e-5

    eps, it = hp.dsv4_hc_eps, hp.dsv4_hc_sinkhorn_iters
    a_pre, a_post, a_comb = _hc_mixes(x, w[b + "hc_attn_fn.weight"], w[b + "hc_attn_scale.weight"],
                                      w[b + "hc_attn_base.weight"], eps, it)
    hc_attn_post = _hc_post(attn_out, x, a_post, a_comb)
    assert _rel(hc_attn_post, blk["hc_attn_post-0"][0]) < 1e-5
    # single pass: the FFN input mixes with the attention's pre weights
    ffn_in = np.einsum("the,th->te", hc_attn_post, a_pre)
    ffn_norm = _rms(ffn_in) * w[b + "ffn_norm.weight"]
    ffn_out = _moe(ffn_norm, w, b, hp.n_expert_used, hp.swiglu_clamp_exp[0], hp.swiglu_clamp_shexp[0],
                   hp.expert_weights_scale)
    assert _rel(ffn_out, blk["ffn_out-0"][0, 0]) < 1e-5
    _, f_post, f_comb = _hc_mixes(hc_attn_post, w[b + "hc_ffn_fn.weight"], w[b + "hc_ffn_scale.weight"],
                                  w[b + "hc_ffn_base.weight"], eps, it)
    l_out = _hc_post(ffn_out, hc_attn_post, f_post, f_comb)
    assert _rel(l_out.reshape(T, -1), blk["l_out-0"][0, 0]) < 1e-5


def test_mistral_large4_stage_numpy(tmp_path):
    """Stage 0 of Mistral Large 4 (MLA: absorbed q_nope, latent attention over [kv_cmpr, k_pe],
    wv_b after attention; dense SwiGLU FFN; YaRN rope) in numpy, against the graph's values."""
    hp, w, inj, blk = _run_one_layer(tmp_path, "mistral-large4", swa_window=4)
    b = "blk.0."
    H, r, nr = hp.n_head, hp.n_lora_kv, hp.n_rot
    k_mla, v_mla = hp.n_embd_head_k_mla, hp.n_embd_head_v_mla
    nope = k_mla - nr
    pos_q, pos_k = np.arange(6, 10, dtype=np.float64), np.arange(0, 10, dtype=np.float64)
    from graphgen.models.dspark import _yarn_attn_factor
    yarn = dict(base=hp.rope_freq_base, freq_scale=hp.rope_freq_scale, n_ctx_orig=hp.n_ctx_orig_yarn,
                ext_factor=1.0, attn_factor=_yarn_attn_factor(hp), beta_fast=hp.yarn_beta_fast,
                beta_slow=hp.yarn_beta_slow)

    x = blk["inp_noise_embd"][0, 0]                                # [T, E]: anchor + mask rows
    T = x.shape[0]
    assert np.allclose(x[1:], w["mask_embd.weight"][:T - 1])
    attn_norm = _rms(x) * w[b + "attn_norm.weight"]
    q = (attn_norm @ w[b + "attn_q.weight"].T).reshape(T, H, k_mla)
    q_abs = np.einsum("hrn,thn->thr", w[b + "attn_k_b.weight"], q[..., :nope])
    q_pe = _rope_neox_yarn(q[..., nope:], pos_q, nr, **yarn)
    qcur = np.concatenate([q_abs, q_pe], axis=-1)
    kv = attn_norm @ w[b + "attn_kv_a_mqa.weight"].T
    kcur = np.concatenate([_rms(kv[:, :r]) * w[b + "attn_kv_a_norm.weight"],
                           _rope_neox_yarn(kv[:, r:], pos_q, nr, **yarn)], axis=-1)
    assert _rel(kcur, blk["Kcur-0"][0, :, 0]) < 1e-5
    k = np.concatenate([inj["kv_injected-0"].reshape(6, r + nr), kcur])
    lat = _attend(qcur, k, k[:, :r], _block_uniform_mask(pos_k, pos_q, hp.n_swa), 1 / math.sqrt(k_mla))
    out = np.einsum("hvr,thr->thv", w[b + "attn_v_b.weight"], lat).reshape(T, H * v_mla)
    attn_out = out @ w[b + "attn_output.weight"].T
    assert _rel(attn_out, blk["attn_out-0"][0, 0]) < 1e-5
    ffn_inp = attn_out + x
    h = _rms(ffn_inp) * w[b + "ffn_norm.weight"]
    ffn = (_silu(h @ w[b + "ffn_gate.weight"].T) * (h @ w[b + "ffn_up.weight"].T)) @ w[b + "ffn_down.weight"].T
    assert _rel(ffn + ffn_inp, blk["l_out-0"][0, 0]) < 1e-5


@pytest.mark.parametrize("backbone", ["dsv4", "dsv41", "mistral-large4"])
def test_two_blocks_in_one_batch(tmp_path, backbone):
    """Two sequences' blocks in one batch give each block the logits it gets alone (the
    block-uniform mask and the ML4 [anchor, masks] input are per block)."""
    import graphgen.runtime.session as s
    path = make_model(tmp_path / "m.gguf", "dspark", backbone)["path"]
    f = np.random.default_rng(0).standard_normal((6, 128), dtype=np.float32)
    with s.Session(path, n_ctx=256, n_seq=2, type_kv="f32") as sess:
        sess.inject(f, 0, seq=0)
        sess.inject(f[::-1].copy(), 0, seq=1)
        both = sess.block_multi([(0, [7, 255, 255, 255], 6), (1, [9, 255, 255, 255], 6)]).logits
        for seq, tok in ((0, 7), (1, 9)):
            sess.seq_rm(0, 6, -1)
            sess.seq_rm(1, 6, -1)
            alone = sess.block([tok, 255, 255, 255], 6, seq=seq).logits
            np.testing.assert_allclose(both[4 * seq:4 * seq + 4], alone, rtol=0, atol=1e-4)


def test_ml4_output_and_rnn_head_numpy(tmp_path):
    """Mistral Large 4's tail in float64 numpy from the last layer's output: the output norm, the
    soft-capped logits, then the seed's RNN joint head fed the normed hidden state, slot by slot
    from the anchor, its Markov bias added after the cap."""
    path = make_model(tmp_path / "m.gguf", "dspark", "mistral-large4", n_layer=1, joint=True)["path"]
    run_scenario(path, scenario(type_kv="f32"), tmp_path / "out")
    hp, w = load(path).hparams, _weights(path)
    blk_path = next((tmp_path / "out").glob("*-block.json"))
    blk = _values(blk_path)
    with load_dump(blk_path) as d:
        final = d.values(len(d.nodes) - 1).astype(np.float64)       # what the driver reads

    l_out = blk["l_out-0"].reshape(4, -1)
    hidden = _rms(l_out, hp.f_norm_rms_eps) * w["output_norm.weight"]
    np.testing.assert_allclose(blk["result_norm"].reshape(4, -1), hidden, rtol=1e-4, atol=1e-5)
    cap = hp.f_final_logit_softcapping
    assert cap > 0
    base = cap * np.tanh(hidden @ w["output.weight"].astype(np.float64).T / cap)
    np.testing.assert_allclose(blk["result_output"].reshape(4, -1), base, rtol=1e-4, atol=1e-4)

    w1, w2 = w["markov_w1.weight"].astype(np.float64), w["markov_w2.weight"].astype(np.float64)
    wj, bj = w["joint_proj.weight"].astype(np.float64), w["joint_proj.bias"].astype(np.float64)
    rank = w1.shape[1]
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    state, prev, cols = np.zeros(rank), 7, []
    for i in range(4):
        joint = wj @ np.concatenate([state, w1[prev], hidden[i]]) + bj
        gate, cand, mk = sig(joint[:rank]), np.tanh(joint[rank:2 * rank]), np.tanh(joint[2 * rank:])
        state = cand + gate * (state - cand)
        cols.append(base[i] + w2 @ mk)
        prev = int(np.argmax(cols[-1]))
    np.testing.assert_allclose(final.reshape(4, -1), np.stack(cols), rtol=1e-4, atol=1e-4)
