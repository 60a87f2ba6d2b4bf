"""float64 forward passes of the seed's graph_dsv41, graph_mistral_large4 and the Markov / RNN joint
head (build_dspark_markov_head), written from the seed commit's src/models/dspark.cpp and the
upstream helpers it calls (llama-graph.cpp's build_norm / build_ffn / build_moe_ffn / build_attn,
deepseek4.cpp's hyper-connection helpers, ggml-cpu's DSV4_HC_* kernels).

Rope: NORM on the trailing rope dims for DeepSeek-V4.1 (theta base only), NEOX with YaRN from the
context for Mistral Large 4 (llama_model_rope_type of b11549; the seed does not change it).
The same code run on DeepSeek-V4, which b11739 has, gives llama.cpp's own dumps' values
(test_seed_reference.py::test_reference_matches_llama_cpp_on_dsv4).

`SeedReference` keeps what the seed's K-only sliding-window cache holds, per layer, as rows keyed
by (seq, pos), rounded to the cache type. Every step returns the tensors the seed names with `cb`,
in the order its code names them, as (name, value) with values in ggml's numpy order
(ne3, ne2, ne1, ne0). Nodes whose last axis runs over cache cells (kq, kq_soft_max, v_cont) come
as `KVAxis`: the columns of the cache rows the reference knows, keyed by (seq, pos, round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .gguf_draft import Draft


@dataclass
class KVAxis:
    """A node whose last axis is the cache's cells: `cols[key]` is the column of cache row `key`;
    `visible[key]` says whether the mask lets the query rows see it (per query row)."""
    rows: dict           # key -> cached K row (float64, as stored)
    cols: dict           # key -> array [..., ] the node's values for that cell
    visible: dict = field(default_factory=dict)  # key -> bool array over query rows
    kind: str = "kq"     # kq | softmax | v


def _rms(x, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _silu(x):
    return x * _sigmoid(x)


def _softplus(x):
    return np.logaddexp(0.0, x)


def _store(x, type_kv):
    """What the cache gives back: f16 rows are rounded on the way in."""
    return x.astype(np.float16).astype(np.float64) if type_kv == "f16" else x.astype(np.float32).astype(np.float64)


def rope_norm(x, pos, n_dims, base):
    """ggml NORM rope (adjacent pairs) over the whole last axis; pos [T] broadcast on axis 0."""
    i = np.arange(n_dims // 2)
    theta = pos[:, None] * base ** (-2.0 * i / n_dims)
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (n_dims // 2,)
    c, s = np.cos(theta).reshape(shape), np.sin(theta).reshape(shape)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return out


def rope_norm_back(x, pos, n_dims, base):
    """ROPE_BACK: the inverse rotation (sin negated)."""
    return rope_norm(x, -pos, n_dims, base)


@dataclass
class Yarn:
    base: float
    freq_scale: float
    n_ctx_orig: int
    ext_factor: float
    attn_factor: float
    beta_fast: float = 32.0
    beta_slow: float = 1.0


def rope_neox_yarn(x, pos, n_dims, y: Yarn):
    """ggml NEOX rope (pairs i, i + n_dims/2) with YaRN's ramp and magnitude correction."""
    def corr(beta):
        return n_dims * math.log(y.n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(y.base))
    lo = max(0.0, math.floor(corr(y.beta_fast)))
    hi = min(n_dims - 1.0, math.ceil(corr(y.beta_slow)))
    i = np.arange(n_dims // 2)
    theta_extrap = pos[:, None] * y.base ** (-2.0 * i / n_dims)
    theta_interp = y.freq_scale * theta_extrap
    mscale = y.attn_factor
    if y.ext_factor != 0.0:
        ramp = (1 - np.minimum(1, np.maximum(0, (i - lo) / max(0.001, hi - lo)))) * y.ext_factor
        theta = theta_interp * (1 - ramp) + theta_extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / y.freq_scale)
    else:
        theta = theta_interp
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (n_dims // 2,)
    c, s = (np.cos(theta) * mscale).reshape(shape), (np.sin(theta) * mscale).reshape(shape)
    h = n_dims // 2
    return np.concatenate([x[..., :h] * c - x[..., h:] * s, x[..., :h] * s + x[..., h:] * c], axis=-1)


class SeedReference:
    """The seed's DSV4.1 / Mistral Large 4 DSpark draft, step by step, in float64."""

    def __init__(self, path, type_kv="f16", flash_attn=False):
        self.d = d = Draft(path)
        self.backbone = d.backbone
        if self.backbone not in ("dsv4", "dsv41", "mistral-large4"):
            raise ValueError(f"{path}: the seed reference covers dsv4, dsv41 and mistral-large4, not {self.backbone}")
        self.type_kv, self.flash_attn = type_kv, flash_attn
        self.w = d.w
        self.n_embd = int(d["embedding_length"])
        self.n_layer = int(d["block_count"])
        self.n_head = int(d["attention.head_count"])
        self.eps = float(d["attention.layer_norm_rms_epsilon"])
        self.n_rot = int(d["rope.dimension_count"])
        self.base = float(d["rope.freq_base"])
        self.block_size = int(d["block_size"])
        # load_hparams_*: the block reads the window of its anchor, one position wider than trained
        self.n_swa = int(d["attention.sliding_window"]) + 1
        self.causal = bool(d.get("attention.causal", False))
        self.sample_from_anchor = str(d.get("sample_from_anchor", "true")) == "true"
        # per layer: (seq, pos) -> K row as the cache holds it; `written` keeps every row ever
        # stored (a removed cell keeps its bytes until reused), keyed (seq, pos, round)
        self.cells = [dict() for _ in range(self.n_layer)]
        self.written = [dict() for _ in range(self.n_layer)]
        self.round = 0
        self.hidden_by_window = self.seen_through_anchor = 0
        if self.backbone == "mistral-large4":
            self.rank = int(d["attention.kv_lora_rank"])
            self.k_mla = int(d["attention.key_length_mla"])
            self.v_mla = int(d["attention.value_length_mla"])
            factor = float(d.get("rope.scaling.factor", 0.0) or 0.0)
            yarn = d.get("rope.scaling.type", "none") == "yarn"
            log_mul = float(d.get("rope.scaling.yarn_log_multiplier", 0.0))
            n_ctx_train = int(d["context_length"])
            if yarn:
                def mscale(f, m):
                    return 1.0 if f <= 1.0 else 0.1 * m * math.log(f) + 1.0
                attn = mscale(factor, 1.0) / mscale(factor, log_mul) if log_mul != 0.0 else mscale(factor, 1.0)
                # ggml's YaRN kernel multiplies 1 + 0.1 ln(factor) back in
                attn /= 1.0 + 0.1 * math.log(factor)
                self.yarn = Yarn(self.base, 1.0 / factor, int(d.get("rope.scaling.original_context_length",
                                                                     n_ctx_train)), 1.0, attn)
            else:
                self.yarn = Yarn(self.base, 1.0, n_ctx_train, 0.0, 1.0)
            self.softcap = float(d.get("final_logit_softcapping", 0.0) or 0.0)
        else:
            self.hd = int(d["attention.key_length"])
            self.hc = int(d["hyper_connection.count"])
            self.hc_eps = float(d["hyper_connection.epsilon"])
            self.hc_iters = int(d["hyper_connection.sinkhorn_iterations"])
            self.n_groups = int(d["attention.output_group_count"])
            self.o_rank = int(d["attention.output_lora_rank"])
            self.n_used = int(d["expert_used_count"])
            self.w_norm = bool(d["expert_weights_norm"])
            self.w_scale = float(d["expert_weights_scale"])
            clamp = d["swiglu_clamp_exp"]
            self.clamp_exp = [float(c) for c in (clamp if isinstance(clamp, list) else [clamp] * self.n_layer)]
            sh = d.get("swiglu_clamp_shexp", None)
            self.clamp_shexp = ([float(c) for c in (sh if isinstance(sh, list) else [sh] * self.n_layer)]
                                if sh is not None else list(self.clamp_exp))

    # --- shared helpers (llama-graph.cpp) ---------------------------------------------------------

    def _mm(self, name, x):
        """build_lora_mm: x @ W^T, times the tensor's optional scale."""
        y = x @ self.w[name + ".weight"].T
        if name + ".scale" in self.w:
            y = y * self.w[name + ".scale"].reshape(())
        return y

    def _norm(self, out, x, weight, il):
        """build_norm (RMS): "norm" is the unweighted rms_norm; the caller names the product."""
        n = _rms(x, self.eps)
        out.append((_n("norm", il), n))
        return n * self.w[weight]

    def _features(self, out, feats):
        """build_inject_inp: fc over the target features, then the encoder's RMS norm."""
        x = self._mm("fc", np.asarray(feats, dtype=np.float64))
        return self._norm(out, x, "enc.output_norm.weight", -1)

    def seq_rm(self, seq, p0, p1):
        p1 = math.inf if p1 < 0 else p1
        for cells in self.cells:
            for key in [k for k in cells if k[0] == seq and p0 <= k[1] < p1]:
                del cells[key]

    # --- the injection batch ------------------------------------------------------------------

    def inject(self, feats, pos0, seq=0):
        out = []
        x = self._features(out, feats)
        out.append(("inp_g_embeddings" if self.backbone == "dsv4" else "main_x", x))
        T = x.shape[0]
        pos = np.arange(pos0, pos0 + T, dtype=np.float64)
        for il in range(self.n_layer):
            if self.backbone in ("dsv4", "dsv41"):
                kv = self._dsv4_kv(out, x, pos, il)
                k = kv.reshape(T, 1, self.hd)
            else:
                k, _ = self._ml4_kv(out, x, pos, il)
            out.append((_n("kv_injected", il), k))
            self._write(il, seq, pos, k.reshape(T, -1))
        self.round += 1
        return out

    # --- attention over the K-only window cache ------------------------------------------------

    def _attend(self, out, il, q, blocks, scale, dv, sinks=None):
        """build_attn on the k_iswa input: V is the first dv values of each cached K row; the mask
        is the anchor's sliding-window row for the whole block (block_uniform), non-causal.

        q [T, H, Dk] in the batch's token order; returns the attention output [T, H, dv]."""
        T, H, _ = q.shape
        keys = list(self.written[il])
        rows = {k: self.written[il][k] for k in keys}
        live = {(s, p): r for (s, p), r in self.cells[il].items()}
        vis = {}
        tok_seq, tok_anchor = [], []
        for seq, toks, pos0 in blocks:
            tok_seq += [seq] * len(toks)
            tok_anchor += [pos0] * len(toks)
        tok_pos = np.concatenate([np.arange(p0, p0 + len(t)) for _, t, p0 in blocks])
        for k in keys:
            s, p, rnd = k
            if live.get((s, p)) is not rows[k]:
                vis[k] = np.zeros(T, bool)  # a cell that was removed or written again since
                continue
            v = np.array([ts == s and (pa - p) < self.n_swa for ts, pa in zip(tok_seq, tok_anchor)])
            own = np.array([ts == s for ts in tok_seq])
            # what the configuration exercises: keys the window hides from a whole block, and keys
            # a later query sees only because its block reads the anchor's row
            self.hidden_by_window += int(np.sum(own & ~v))
            self.seen_through_anchor += int(np.sum(v & ((tok_pos - p) >= self.n_swa)))
            if self.causal:
                v &= p <= tok_pos
            vis[k] = v
        K = np.stack([rows[k] for k in keys])                 # [N, Dk]
        if self.flash_attn:
            # build_attn_mha casts an f32 cache to f16 for flash attention
            K = _store(K, "f16")
        f16 = self.type_kv == "f16" and not self.flash_attn
        if f16:
            # ggml's CPU mul_mat brings src1 to src0's vec_dot type: an f16 K rounds the queries
            q = _store(q, "f16")
        kq = np.einsum("thd,nd->htn", q, K)                   # [H, T, N]
        mask = np.stack([vis[k] for k in keys], axis=-1)      # [T, N]
        s_ = kq * scale + np.where(mask, 0.0, -np.inf)[None]
        m = s_.max(axis=-1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[:, None, None])
        e = np.exp(s_ - m)
        den = e.sum(axis=-1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(sinks[:, None, None] - m)
        p_ = e / den                                          # [H, T, N]
        V = K[:, :dv]
        # ... and an f16 V rounds the probabilities it weighs
        kqv = np.einsum("htn,nd->htd", _store(p_, "f16") if f16 else p_, V)   # [H, T, dv]
        if not self.flash_attn:
            out.append((_n("v_cont", il), KVAxis(rows, {k: V[i] for i, k in enumerate(keys)}, vis, "v")))
            out.append((_n("kq", il), KVAxis(rows, {k: kq[..., i] for i, k in enumerate(keys)}, vis, "kq")))
            out.append((_n("kq_soft_max", il), KVAxis(rows, {k: p_[..., i] for i, k in enumerate(keys)}, vis,
                                                       "softmax")))
            out.append((_n("kqv", il), kqv))
        res = np.transpose(kqv, (1, 0, 2))                    # [T, H, dv]
        out.append((_n("kqv_out", il), res.reshape(T, H * dv)))
        return res

    # --- DeepSeek-V4.1 (graph_dsv41) --------------------------------------------------------------

    def _dsv4_rope(self, t, pos, back=False):
        """ratio-0 rope: NORM mode on the trailing n_rot dims (rope_set_offset), theta base only."""
        nope = self.hd - self.n_rot
        out = t.copy()
        f = rope_norm_back if back else rope_norm
        out[..., nope:] = f(t[..., nope:], pos, self.n_rot, self.base)
        return out

    def _dsv4_kv(self, out, x, pos, il):
        b = f"blk.{il}."
        kv = self._norm(out, self._mm(b + "attn_kv", x), b + "attn_kv_a_norm.weight", il)
        return self._dsv4_rope(kv.reshape(x.shape[0], 1, self.hd), pos)

    def _hc_mixes(self, out, x, part, il):
        """build_hc_mixes + the DSV4_HC_COMB kernel: x [T, hc, E] -> pre [T, hc], post [T, hc],
        comb [T, src, dst]."""
        b = f"blk.{il}.hc_{part}_"
        fn, scale, base = self.w[b + "fn.weight"], self.w[b + "scale.weight"], self.w[b + "base.weight"]
        T, hc = x.shape[0], self.hc
        mixes = _rms(x.reshape(T, hc * self.n_embd), self.eps) @ fn.T
        out.append((_n("hc_mixes", il), mixes))
        pre = _sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + self.hc_eps
        out.append((_n("hc_pre", il), pre))
        post = 2.0 * _sigmoid(mixes[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
        out.append((_n("hc_post", il), post))
        comb = (mixes[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(T, hc, hc)   # [T, src, dst]
        comb = np.exp(comb - comb.max(-1, keepdims=True))
        comb = comb / comb.sum(-1, keepdims=True) + self.hc_eps
        comb = comb / (comb.sum(1, keepdims=True) + self.hc_eps)                 # each dst over its sources
        for _ in range(1, self.hc_iters):
            comb = comb / (comb.sum(-1, keepdims=True) + self.hc_eps)
            comb = comb / (comb.sum(1, keepdims=True) + self.hc_eps)
        out.append((_n("hc_comb", il), comb))
        return pre, post, comb

    @staticmethod
    def _hc_pre(x, w):
        return np.einsum("the,th->te", x, w)

    @staticmethod
    def _hc_post(x, residual, post, comb):
        return x[:, None, :] * post[:, :, None] + np.einsum("tse,tsd->tde", residual, comb)

    def _moe(self, out, x, il):
        """build_moe_ffn with sqrt-softplus scoring, biased top-k selection, normalised and scaled
        weights, clamped SwiGLU experts; then the shared expert (build_ffn, clamped)."""
        b = f"blk.{il}."
        T = x.shape[0]
        logits = x @ self.w[b + "ffn_gate_inp.weight"].T
        out.append((_n("ffn_moe_logits", il), logits))
        probs = np.sqrt(_softplus(logits))
        out.append((_n("ffn_moe_probs", il), probs))
        biased = probs + self.w[b + "exp_probs_b.bias"]
        out.append((_n("ffn_moe_probs_biased", il), biased))
        order = np.argsort(-biased, axis=-1, kind="stable")
        out.append((_n("ffn_moe_argsort", il), order.astype(np.float64)))
        sel = order[:, :self.n_used]
        out.append((_n("ffn_moe_topk", il), sel.astype(np.float64)))
        wts = np.take_along_axis(probs, sel, axis=-1)
        out.append((_n("ffn_moe_weights", il), wts))
        if self.w_norm:
            s = wts.sum(-1, keepdims=True)
            out.append((_n("ffn_moe_weights_sum", il), s))
            s = np.maximum(s, 6.103515625e-5)
            out.append((_n("ffn_moe_weights_sum_clamped", il), s))
            wts = wts / s
            out.append((_n("ffn_moe_weights_norm", il), wts))
        if self.w_scale not in (0.0, 1.0):
            wts = wts * self.w_scale
            out.append((_n("ffn_moe_weights_scaled", il), wts))
        lim = self.clamp_exp[il]
        gate = np.einsum("tkfe,te->tkf", self.w[b + "ffn_gate_exps.weight"][sel], x)
        up = np.einsum("tkfe,te->tkf", self.w[b + "ffn_up_exps.weight"][sel], x)
        out.append((_n("ffn_moe_gate", il), gate))
        out.append((_n("ffn_moe_up", il), up))
        act = _silu(np.minimum(gate, lim)) * np.clip(up, -lim, lim) if lim > 1e-6 else _silu(gate) * up
        out.append((_n("ffn_moe_swiglu_limited" if lim > 1e-6 else "ffn_moe_swiglu", il), act))
        down = np.einsum("tkef,tkf->tke", self.w[b + "ffn_down_exps.weight"][sel], act)
        out.append((_n("ffn_moe_down", il), down))
        weighted = down * wts[..., None]
        out.append((_n("ffn_moe_weighted", il), weighted))
        moe = weighted.sum(axis=1)
        out.append((_n("ffn_moe_out", il), moe))
        lim = self.clamp_shexp[il]
        up = self._mm(b + "ffn_up_shexp", x)
        out.append((_n("ffn_up", il), up))
        gate = self._mm(b + "ffn_gate_shexp", x)
        out.append((_n("ffn_gate", il), gate))
        act = _silu(np.minimum(gate, lim)) * np.clip(up, -lim, lim) if lim > 1e-6 else _silu(gate) * up
        out.append((_n("ffn_swiglu_limited" if lim > 1e-6 else "ffn_swiglu", il), act))
        sh = self._mm(b + "ffn_down_shexp", act)
        out.append((_n("ffn_shexp", il), sh))
        assert T == moe.shape[0]
        return moe + sh

    def _dsv4_block(self, out, tokens, pos, blocks):
        """graph_dsv4 (in b11739 too): two-pass mHC, the per-head q RMS norm, hc_head's collapse.
        It shares every helper with DSV4.1, so llama.cpp's own dumps check those helpers' numerics."""
        w, T, E, hd, H = self.w, len(tokens), self.n_embd, self.hd, self.n_head
        x = w["token_embd.weight"][tokens]
        out.append(("inp_noise_embd", x))
        inpL = np.repeat(x[:, None, :], self.hc, axis=1)
        out.append(("hc_init", inpL))
        for il in range(self.n_layer):
            b = f"blk.{il}."
            residual = inpL
            pre, post, comb = self._hc_mixes(out, inpL, "attn", il)
            cur = self._hc_pre(inpL, pre)
            out.append((_n("hc_attn_pre", il), cur))
            cur = self._norm(out, cur, b + "attn_norm.weight", il)
            out.append((_n("attn_norm", il), cur))
            qr = self._mm(b + "attn_q_a", cur)
            out.append((_n("qr", il), qr))
            qr = self._norm(out, qr, b + "attn_q_a_norm.weight", il)
            out.append((_n("qr_norm", il), qr))
            q = _rms(self._mm(b + "attn_q_b", qr).reshape(T, H, hd), self.eps)
            out.append((_n("q_norm", il), q))
            q = self._dsv4_rope(q, pos)
            out.append((_n("q", il), q))
            kv = self._norm(out, self._mm(b + "attn_kv", cur), b + "attn_kv_a_norm.weight", il).reshape(T, 1, hd)
            out.append((_n("kv_norm", il), kv))
            kv = self._dsv4_rope(kv, pos)
            out.append((_n("kv", il), kv))
            self._write_blocks(il, blocks, kv.reshape(T, hd))
            att = self._attend(out, il, q, blocks, 1.0 / math.sqrt(hd), hd, w[b + "attn_sinks.weight"])
            out.append((_n("attn_raw", il), att.reshape(T, H * hd)))
            att = self._dsv4_rope(att, pos, back=True)
            out.append((_n("attn_derope", il), att))
            G, R = self.n_groups, self.o_rank
            oa = np.einsum("grk,tgk->gtr", w[b + "attn_output_a.weight"], att.reshape(T, G, H // G * hd))
            out.append((_n("attn_wo_a", il), oa))
            cur = self._mm(b + "attn_output_b", np.transpose(oa, (1, 0, 2)).reshape(T, G * R))
            out.append((_n("attn_out", il), cur))
            inpL = self._hc_post(cur, residual, post, comb)
            out.append((_n("hc_attn_post", il), inpL))
            residual = inpL
            pre, post, comb = self._hc_mixes(out, inpL, "ffn", il)
            cur = self._hc_pre(inpL, pre)
            out.append((_n("hc_ffn_pre", il), cur))
            cur = self._norm(out, cur, b + "ffn_norm.weight", il)
            out.append((_n("ffn_norm", il), cur))
            cur = self._moe(out, cur, il)
            out.append((_n("ffn_out", il), cur))
            inpL = self._hc_post(cur, residual, post, comb)
            out.append((_n("l_out", il), inpL))
        mixes = _rms(inpL.reshape(T, self.hc * E), self.eps) @ w["output_hc_fn.weight"].T
        out.append(("hc_head_mixes", mixes))
        pre = _sigmoid(mixes * w["output_hc_scale.weight"][0] + w["output_hc_base.weight"]) + self.hc_eps
        out.append(("hc_head_pre", pre))
        cur = self._hc_pre(inpL, pre)
        out.append(("hc_head", cur))
        t_embd = cur
        cur = self._norm(out, cur, "output_norm.weight", -1)
        out.append(("result_norm", cur))
        logits = self._mm("output", cur)
        out.append(("result_output", logits))
        return logits, cur, t_embd

    def _dsv41_block(self, out, tokens, pos, blocks):
        w, T, E, hd, H = self.w, len(tokens), self.n_embd, self.hd, self.n_head
        x = w["token_embd.weight"][tokens]
        out.append(("inp_noise_embd", x))
        inpL = np.repeat(x[:, None, :], self.hc, axis=1)          # [T, hc, E]
        out.append(("hc_init", inpL))
        pre_prev = None
        for il in range(self.n_layer):
            b = f"blk.{il}."
            residual = inpL
            a_pre, a_post, a_comb = self._hc_mixes(out, inpL, "attn", il)
            # stage 0 has no earlier mix: stream 0 as it is
            cur = inpL[:, 0, :].copy() if pre_prev is None else self._hc_pre(inpL, pre_prev)
            out.append((_n("hc_attn_pre", il), cur))
            cur = self._norm(out, cur, b + "attn_norm.weight", il)
            out.append((_n("attn_norm", il), cur))
            qr = self._norm(out, self._mm(b + "attn_q_a", cur), b + "attn_q_a_norm.weight", il)
            out.append((_n("qr_norm", il), qr))
            q = self._dsv4_rope(self._mm(b + "attn_q_b", qr).reshape(T, H, hd), pos)
            out.append((_n("q", il), q))
            kv = self._dsv4_kv(out, cur, pos, il)
            out.append((_n("kv", il), kv))
            self._write_blocks(il, blocks, kv.reshape(T, hd))
            if self.flash_attn:
                q = q.astype(np.float16).astype(np.float64)
            att = self._attend(out, il, q, blocks, 1.0 / math.sqrt(hd), hd, w[b + "attn_sinks.weight"])
            out.append((_n("attn_raw", il), att.reshape(T, H * hd)))
            att = self._dsv4_rope(att, pos, back=True)
            out.append((_n("attn_derope", il), att))
            G, R = self.n_groups, self.o_rank
            grouped = att.reshape(T, G, H // G * hd)
            oa = np.einsum("grk,tgk->gtr", w[b + "attn_output_a.weight"], grouped)     # ne [R, T, G]
            out.append((_n("attn_wo_a", il), oa))
            oa = np.transpose(oa, (1, 0, 2)).reshape(T, G * R)
            cur = self._mm(b + "attn_output_b", oa)
            out.append((_n("attn_out", il), cur))
            inpL = self._hc_post(cur, residual, a_post, a_comb)
            out.append((_n("hc_attn_post", il), inpL))
            residual = inpL
            f_pre, f_post, f_comb = self._hc_mixes(out, inpL, "ffn", il)
            pre_prev = f_pre
            # single pass: the FFN reads the streams through the attention's pre weights
            cur = self._hc_pre(inpL, a_pre)
            out.append((_n("hc_ffn_pre", il), cur))
            cur = self._norm(out, cur, b + "ffn_norm.weight", il)
            out.append((_n("ffn_norm", il), cur))
            cur = self._moe(out, cur, il)
            out.append((_n("ffn_out", il), cur))
            inpL = self._hc_post(cur, residual, f_post, f_comb)
            out.append((_n("l_out", il), inpL.reshape(T, self.hc * E)))
        cur = self._hc_pre(inpL, pre_prev)
        out.append(("hc_out", cur))
        t_embd = cur
        cur = self._norm(out, cur, "output_norm.weight", -1)
        out.append(("result_norm", cur))
        logits = self._mm("output", cur)
        out.append(("result_output", logits))
        return logits, cur, t_embd

    # --- Mistral Large 4 (graph_mistral_large4) ---------------------------------------------------

    def _ml4_kv(self, out, x, pos, il):
        b = f"blk.{il}."
        T, r, nr = x.shape[0], self.rank, self.n_rot
        kv_cmpr_pe = x @ self.w[b + "attn_kv_a_mqa.weight"].T
        out.append((_n("kv_cmpr_pe", il), kv_cmpr_pe))
        kv_cmpr = self._norm(out, kv_cmpr_pe[:, :r], b + "attn_kv_a_norm.weight", il).reshape(T, 1, r)
        out.append((_n("kv_cmpr", il), kv_cmpr))
        k_pe = rope_neox_yarn(kv_cmpr_pe[:, r:].reshape(T, 1, nr), pos, nr, self.yarn)
        out.append((_n("k_pe", il), k_pe))
        return np.concatenate([kv_cmpr, k_pe], axis=-1), kv_cmpr

    def _ml4_inp(self, tokens, blocks):
        w, T = self.w, len(tokens)
        n_blocks = len(blocks)
        bd = T // n_blocks
        if bd > 0 and T % n_blocks == 0 and bd <= self.block_size:
            rows = []
            for _, toks, _ in blocks:
                rows.append(w["token_embd.weight"][toks[0]][None])
                rows.append(w["mask_embd.weight"][:bd - 1])
            return np.concatenate(rows)
        return w["token_embd.weight"][tokens]

    def _ml4_block(self, out, tokens, pos, blocks):
        w, T, H = self.w, len(tokens), self.n_head
        r, nr, k_mla, v_mla = self.rank, self.n_rot, self.k_mla, self.v_mla
        nope = k_mla - nr
        inpL = self._ml4_inp(tokens, blocks)
        out.append(("inp_noise_embd", inpL))
        for il in range(self.n_layer):
            b = f"blk.{il}."
            cur = self._norm(out, inpL, b + "attn_norm.weight", il)
            out.append((_n("attn_norm", il), cur))
            q = cur @ w[b + "attn_q.weight"].T
            out.append((_n("q", il), q))
            q = q.reshape(T, H, k_mla)
            q_abs = np.einsum("hrn,thn->thr", w[b + "attn_k_b.weight"], q[..., :nope])
            out.append((_n("q_nope_absorbed", il), q_abs))
            q_pe = rope_neox_yarn(q[..., nope:], pos, nr, self.yarn)
            out.append((_n("q_pe", il), q_pe))
            qcur = np.concatenate([q_abs, q_pe], axis=-1)
            out.append((_n("Qcur", il), qcur))
            kcur, _ = self._ml4_kv(out, cur, pos, il)
            out.append((_n("Kcur", il), kcur))
            self._write_blocks(il, blocks, kcur.reshape(T, r + nr))
            if self.flash_attn:
                qcur = qcur.astype(np.float16).astype(np.float64)
            lat = self._attend(out, il, qcur, blocks, 1.0 / math.sqrt(k_mla), r)
            out.append((_n("attn_latent", il), lat.reshape(T, H * r)))
            o = np.einsum("hvr,thr->thv", w[b + "attn_v_b.weight"], lat).reshape(T, H * v_mla)
            cur = self._mm(b + "attn_output", o)
            out.append((_n("attn_out", il), cur))
            ffn_inp = cur + inpL
            out.append((_n("ffn_inp", il), ffn_inp))
            cur = self._norm(out, ffn_inp, b + "ffn_norm.weight", il)
            out.append((_n("ffn_norm", il), cur))
            up = self._mm(b + "ffn_up", cur)
            out.append((_n("ffn_up", il), up))
            gate = self._mm(b + "ffn_gate", cur)
            out.append((_n("ffn_gate", il), gate))
            act = _silu(gate) * up
            out.append((_n("ffn_swiglu", il), act))
            cur = self._mm(b + "ffn_down", act)
            out.append((_n("ffn_out", il), cur))
            inpL = cur + ffn_inp
            out.append((_n("l_out", il), inpL))
        cur = self._norm(out, inpL, "output_norm.weight", -1)
        out.append(("result_norm", cur))
        logits = self._mm("output", cur)
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        out.append(("result_output", logits))
        return logits, cur

    # --- the Markov head and its RNN joint variant (build_dspark_markov_head) ------------------------

    def markov_head(self, base, tokens, n_blocks, hidden=None, conf_inp=None):
        """base [T, V] block-major; returns the biased logits [T, V] the driver reads and, with a
        confidence head, each slot's acceptance estimate [T] (computed from conf_inp, the state
        the graph leaves in t_embd)."""
        w = self.w
        w1, w2 = w["markov_w1.weight"], w["markov_w2.weight"]
        w2_s = w["markov_w2.scale"].reshape(()) if "markov_w2.scale" in w else 1.0
        is_rnn = "joint_proj.weight" in w
        T, V = base.shape
        bd = T // n_blocks
        has_conf = "conf_proj.weight" in w
        conf = np.zeros(T) if has_conf else None
        if bd > self.block_size:
            return base, None
        beg = 0 if self.sample_from_anchor else 1
        res = base.copy()
        for blk in range(n_blocks):
            prev = int(tokens[blk * bd])
            state = np.zeros(w1.shape[1])
            for i in range(beg, bd):
                markov = w1[prev]
                if is_rnn:
                    rank = w1.shape[1]
                    joint = w["joint_proj.weight"] @ np.concatenate([state, w1[prev], hidden[blk * bd + i]])
                    joint = joint + w["joint_proj.bias"]
                    gate, cand = _sigmoid(joint[:rank]), np.tanh(joint[rank:2 * rank])
                    state = gate * state + (1.0 - gate) * cand
                    markov = np.tanh(joint[2 * rank:])
                col = base[blk * bd + i] + (w2 @ markov) * w2_s
                res[blk * bd + i] = col
                if has_conf:
                    z = w["conf_proj.weight"] @ np.concatenate([conf_inp[blk * bd + i], markov])
                    conf[blk * bd + i] = _sigmoid(z + w.get("conf_proj.bias", np.zeros(1)))[0]
                prev = int(np.argmax(col))
            if has_conf and not self.sample_from_anchor:
                # the bonus slot's filler: the sigmoid of its first logit
                conf[blk * bd] = _sigmoid(base[blk * bd, 0])
        return res, conf

    # --- the token batch ----------------------------------------------------------------------------

    def block(self, blocks):
        """blocks: [(seq, tokens, pos0)], equal lengths; returns (cb list, final logits [T, V])."""
        out = []
        tokens = np.concatenate([np.asarray(t, dtype=np.int64) for _, t, _ in blocks])
        pos = np.concatenate([np.arange(p0, p0 + len(t), dtype=np.float64) for _, t, p0 in blocks])
        if self.backbone in ("dsv4", "dsv41"):
            # the confidence head reads the collapsed streams before the output norm
            build = self._dsv41_block if self.backbone == "dsv41" else self._dsv4_block
            logits, hidden, t_embd = build(out, tokens, pos, blocks)
            rnn_in = None
        else:
            logits, hidden = self._ml4_block(out, tokens, pos, blocks)
            rnn_in = t_embd = hidden
        final, conf = logits, None
        if "markov_w1.weight" in self.w:
            final, conf = self.markov_head(logits, tokens, len(blocks), rnn_in, t_embd)
        self.round += 1
        self.conf = conf
        return out, final

    def _write(self, il, seq, positions, k_rows):
        for p, row in zip(positions, k_rows):
            stored = _store(row, self.type_kv)
            self.cells[il][(seq, int(p))] = stored
            self.written[il][(seq, int(p), self.round)] = stored

    def _write_blocks(self, il, blocks, k):
        """A block batch writes its K rows (token order: block by block) before attending."""
        i = 0
        for seq, toks, p0 in blocks:
            self._write(il, seq, np.arange(p0, p0 + len(toks)), k[i:i + len(toks)])
            i += len(toks)


def _n(name, il):
    return f"{name}-{il}" if il >= 0 else name
