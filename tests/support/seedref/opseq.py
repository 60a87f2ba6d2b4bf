"""The node sequence the seed's builders emit, traced with a symbolic stand-in for ggml.

`Trace` records what each ggml call the builders make would create (op, shape, sources, the name
ggml gives it) and orders nodes as ggml_build_forward_expand does: a depth-first walk from each
expanded tensor over its sources left to right, a node entering the graph after its sources,
unnamed nodes named "node_<index>" and unnamed leaves "leaf_<index>" as they enter. Views,
reshapes, permutes, transposes, conts and casts take their source's name at creation with ggml's
suffixes; `cb` renames a tensor as llama.cpp's graph callback does ("name-il", or "name").

The builders below follow, call by call, the seed commit's src/models/dspark.cpp
(llama.cpp-32bdc3a89-dflash-refactor.diff):
  graph_dsv41              diff lines 3686-3883 (the seed's inline DSV4.1 attention included)
  graph_mistral_large4     diff lines 3889-4072
  build_dspark_markov_head diff lines 3380-3521
  build_inject_inp         diff lines 1675-1752 (added lines; get_tok_embd 1779-1823, get_lm_head 1842-1850)
  graph_dsv4               diff lines 3542-3680 (traced only to check the helpers against b11739)
and the helpers they call, from the llama.cpp tree vendored in the `xllamacpp==2026.10.11549`
sdist (b11549), the newest upstream source at hand:
  build_norm, build_lora_mm, build_ffn, build_moe_ffn, build_attn (k_iswa), build_attn_mha,
  build_attn_inp_kq_mask      src/llama-graph.cpp
  cpy_k, get_k                src/llama-kv-cache.cpp
  build_hc_pre (both forms), build_hc_post, the fused DSV4_HC_* ops   src/models/deepseek4.cpp
  set_rows, views, cast naming, the graph walk                       ggml/src/ggml.c

What the seed hides, and what is inferred here:
- build_hc_mixes (the seed's DSV4.1 calls it; neither the seed diff nor b11549 has its body): taken
  as deepseek4.cpp's five-argument build_hc_pre up to its "hc_comb" (mixes, pre, post, comb with
  the fused DSV4_HC_COMB), without the final weighted sum.
- build_inp_target_features (unchanged context in the seed, body not shown): an F32 input
  [n_embd_inp, n_tokens] that the seed names "inp_target_features".
- the block_uniform mask flag changes the mask's values only, never the graph.
- b11549's build_moe_ffn reads an optional MoE expert cache (slots); the drafts here have none.
- the Hadamard k_rot input is null for f16/f32 caches, so llama_mul_mat_hadamard adds nothing.
- the rope modes come from b11549's llama_model_rope_type (the seed does not touch it): NEOX for
  Mistral Large 4 (a DFlash draft without M-RoPE sections or hyper-connections), NORM for DSV4.1.
  The mode is an op parameter, not part of the sequence; forward.py's values depend on it.

Check on the helpers: graph_dsv4, which b11739 has, traced with these same helpers gives llama.cpp
b11739's own dumps node for node (tests/data/reference/dsv4-*: inject 17, block 270 / 260 nodes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .gguf_draft import Draft


@dataclass(eq=False)
class T:
    op: str
    ne: tuple
    src: list = field(default_factory=list)
    name: str = ""

    def __post_init__(self):
        self.ne = tuple(int(n) for n in self.ne) + (1,) * (4 - len(self.ne))


class Trace:
    def __init__(self):
        self.nodes: list[T] = []
        self.leafs: list[T] = []
        self._seen: set[int] = set()

    # --- the graph walk (ggml_visit_parents) ---
    def expand(self, t: T):
        if id(t) in self._seen:
            return
        self._seen.add(id(t))
        for s in t.src:
            if s is not None:
                self.expand(s)
        if t.op == "NONE":
            if not t.name:
                t.name = f"leaf_{len(self.leafs)}"
            self.leafs.append(t)
        else:
            if not t.name:
                t.name = f"node_{len(self.nodes)}"
            self.nodes.append(t)

    # --- tensors ---
    @staticmethod
    def leaf(name, ne):
        return T("NONE", ne, [], name)

    @staticmethod
    def op(op, ne, *src):
        return T(op, ne, list(src))

    @staticmethod
    def _derived(op, a, ne, suffix):
        return T(op, ne, [a], f"{a.name} ({suffix})")

    def view(self, a, *ne):
        return self._derived("VIEW", a, ne, "view")

    def reshape(self, a, *ne):
        return self._derived("RESHAPE", a, ne, "reshaped")

    def permute(self, a, *axes):
        ne = [0] * 4
        for i, ax in enumerate(axes):
            ne[ax] = a.ne[i]
        return self._derived("PERMUTE", a, ne, "permuted")

    def transpose(self, a):
        return self._derived("TRANSPOSE", a, (a.ne[1], a.ne[0], a.ne[2], a.ne[3]), "transposed")

    def cont(self, a, *ne):
        return self._derived("CONT", a, ne or a.ne, "cont")

    def cast(self, a):
        t = T("CPY", a.ne, [a], f"{a.name} (copy)")
        t.src.append(t)  # ggml_cast keeps its result as the copy's destination
        return t

    def set_rows(self, a, b, c):
        return T("SET_ROWS", a.ne, [b, c, a], f"{a.name} (view)")

    @staticmethod
    def mul_mat(a, b):
        return T("MUL_MAT", (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), [a, b])

    @staticmethod
    def mul_mat_id(a, b, ids):
        return T("MUL_MAT_ID", (a.ne[1], ids.ne[0], b.ne[2], 1), [a, b, ids])

    @staticmethod
    def get_rows(a, b):
        return T("GET_ROWS", (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), [a, b])

    @staticmethod
    def concat(a, b, dim):
        ne = list(a.ne)
        ne[dim] += b.ne[dim]
        return T("CONCAT", ne, [a, b])

    @staticmethod
    def same(op, a, *rest):
        return T(op, a.ne, [a, *rest])


@dataclass
class UBatch:
    n_tokens: int
    n_blocks: int          # distinct sequences in the batch (n_seqs_unq)
    embd: bool = False


class SeedGraphs:
    """The seed's graph_dsv41 / graph_mistral_large4 for one ubatch, traced."""

    def __init__(self, path, *, flash_attn: bool, type_kv: str, n_kv: int, kv_size: int):
        self.d = d = Draft(path)
        self.backbone = d.backbone
        self.fa, self.type_kv, self.n_kv, self.kv_size = flash_attn, type_kv, n_kv, kv_size
        self.n_embd = int(d["embedding_length"])
        self.n_layer = int(d["block_count"])
        self.n_head = int(d["attention.head_count"])
        self.n_rot = int(d["rope.dimension_count"])
        self.n_vocab = d.w["token_embd.weight"].shape[0]
        self.block_size = int(d["block_size"])
        self.n_embd_inp = len(d["target_layers"]) * self.n_embd
        self.sample_from_anchor = str(d.get("sample_from_anchor", "true")) == "true"
        self.hd = int(d["attention.key_length"])   # the cache row: head dim, or kv_lora_rank + rope dims
        self.wt = {name: Trace.leaf(name, tuple(reversed(a.shape))) for name, a in d.w.items()}
        if self.backbone in ("dsv4", "dsv41"):
            self.hc = int(d["hyper_connection.count"])
            self.n_groups = int(d["attention.output_group_count"])
            self.o_rank = int(d["attention.output_lora_rank"])
            self.n_expert = int(d["expert_count"])
            self.n_used = int(d["expert_used_count"])
            self.w_norm = bool(d["expert_weights_norm"])
            self.w_scale = float(d["expert_weights_scale"])
            clamp = d["swiglu_clamp_exp"]
            self.clamp = float(clamp[0] if isinstance(clamp, list) else clamp)
            sh = d.get("swiglu_clamp_shexp", None)
            self.clamp_sh = float(sh[0] if isinstance(sh, list) else sh) if sh is not None else self.clamp
        elif self.backbone == "mistral-large4":
            self.rank = int(d["attention.kv_lora_rank"])
            self.k_mla = int(d["attention.key_length_mla"])
            self.v_mla = int(d["attention.value_length_mla"])
            self.softcap = float(d.get("final_logit_softcapping", 0.0) or 0.0)
        else:
            raise ValueError(f"{path}: not a DeepSeek-V4, DeepSeek-V4.1 or Mistral Large 4 draft")

    def w(self, name):
        return self.wt.get(name)

    # --- llama-graph.cpp ------------------------------------------------------------------------

    def cb(self, t, name, il):
        t.name = f"{name}-{il}" if il >= 0 else name

    def lora_mm(self, w, x, w_s=None):
        res = self.g.mul_mat(w, x)
        if w_s is not None:
            res = self.g.same("MUL", res, w_s)
        return res

    def norm(self, x, w, il):
        cur = self.g.same("RMS_NORM", x)
        self.cb(cur, "norm", il)
        return self.g.same("MUL", cur, w)

    def ffn(self, cur, up, gate, down, il, clamp):
        g = self.g
        tmp = self.lora_mm(up, cur)
        self.cb(tmp, "ffn_up", il)
        cur = self.lora_mm(gate, cur)
        self.cb(cur, "ffn_gate", il)
        # DFLASH with hyper-connections takes the fused clamp; a zero limit means no clamp
        if clamp > 1e-6:
            cur = g.same("SWIGLU_CLAMP", cur, tmp)
            self.cb(cur, "ffn_swiglu_limited", il)
        else:
            cur = g.same("SWIGLU", cur, tmp)
            self.cb(cur, "ffn_swiglu", il)
        return self.lora_mm(down, cur)

    def moe(self, cur, il):
        g, b = self.g, f"blk.{il}."
        n_tok = cur.ne[1]
        logits = self.lora_mm(self.w(b + "ffn_gate_inp.weight"), cur)
        self.cb(logits, "ffn_moe_logits", il)
        probs = g.same("SQRT", g.same("SOFTPLUS", logits))
        self.cb(probs, "ffn_moe_probs", il)
        sel_probs = g.same("ADD", probs, self.w(b + "exp_probs_b.bias"))
        self.cb(sel_probs, "ffn_moe_probs_biased", il)
        argsort = g.same("ARGSORT", sel_probs)
        selected = g.view(argsort, self.n_used, n_tok)
        self.cb(argsort, "ffn_moe_argsort", il)
        self.cb(selected, "ffn_moe_topk", il)
        probs = g.reshape(probs, 1, self.n_expert, n_tok)
        weights = g.get_rows(probs, selected)
        self.cb(weights, "ffn_moe_weights", il)
        if self.w_norm:
            weights = g.reshape(weights, self.n_used, n_tok)
            s = g.op("SUM_ROWS", (1, n_tok), weights)
            self.cb(s, "ffn_moe_weights_sum", il)
            s = g.same("CLAMP", s)
            self.cb(s, "ffn_moe_weights_sum_clamped", il)
            weights = g.same("DIV", weights, s)
            self.cb(weights, "ffn_moe_weights_norm", il)
            weights = g.reshape(weights, 1, self.n_used, n_tok)
        if self.w_scale not in (0.0, 1.0):
            weights = g.same("SCALE", weights)
            self.cb(weights, "ffn_moe_weights_scaled", il)
        g.expand(weights)
        cur = g.reshape(cur, self.n_embd, 1, n_tok)
        up = g.mul_mat_id(self.w(b + "ffn_up_exps.weight"), cur, selected)
        self.cb(up, "ffn_moe_up", il)
        cur = g.mul_mat_id(self.w(b + "ffn_gate_exps.weight"), cur, selected)
        self.cb(cur, "ffn_moe_gate", il)
        if self.clamp > 1e-6:
            cur = g.same("SWIGLU_CLAMP", cur, up)
            self.cb(cur, "ffn_moe_swiglu_limited", il)
        else:
            cur = g.same("SWIGLU", cur, up)
            self.cb(cur, "ffn_moe_swiglu", il)
        experts = g.mul_mat_id(self.w(b + "ffn_down_exps.weight"), cur, selected)
        self.cb(experts, "ffn_moe_down", il)
        experts = g.same("MUL", experts, weights)
        self.cb(experts, "ffn_moe_weighted", il)
        g.expand(experts)
        views = []
        for _ in range(self.n_used):
            views.append(g.view(experts, self.n_embd, n_tok))
            g.expand(views[-1])
        out = views[0]
        for v in views[1:]:
            out = g.same("ADD", out, v)
            g.expand(out)
        if self.n_used == 1:
            out = g.cont(out)
        self.cb(out, "ffn_moe_out", il)
        return out

    def attn_k(self, q_cur, k_cur, v_dim, sinks, il):
        """build_attn on the k_iswa input (every stage is SWA): expand q and k, write K, attend with V
        a view of the cached K, name the result "kqv_out"."""
        g = self.g
        g.expand(q_cur)
        g.expand(k_cur)
        n_tok = k_cur.ne[2]
        k2 = g.view(k_cur, k_cur.ne[0] * k_cur.ne[1], n_tok)
        g.expand(g.set_rows(self.cache[il], k2, self.k_idxs))
        k = g.view(self.cache[il], self.hd, 1, self.n_kv, 1)
        v = g.view(k, v_dim, 1, self.n_kv, 1)
        cur = self.attn_mha(q_cur, k, v, sinks, il)
        self.cb(cur, "kqv_out", il)
        return cur

    def attn_mha(self, q, k, v, sinks, il):
        g = self.g
        q = g.view(q, *q.ne)
        q = g.permute(q, 0, 2, 1, 3)
        k = g.permute(k, 0, 2, 1, 3)
        v = g.permute(v, 0, 2, 1, 3)
        if self.fa:
            if self.type_kv == "f32":
                k = g.cast(k)
                v = g.cast(v)
            srcs = [q, k, v, self.kq_mask] + ([sinks] if sinks is not None else [])
            cur = g.op("FLASH_ATTN_EXT", (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), *srcs)
            cur = g.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = g.mul_mat(k, q)
            self.cb(kq, "kq", il)
            srcs = [kq, self.kq_mask] + ([sinks] if sinks is not None else [])
            kq = g.op("SOFT_MAX", kq.ne, *srcs)
            self.cb(kq, "kq_soft_max", il)
            v = g.cont(g.transpose(v))
            self.cb(v, "v_cont", il)
            kqv = g.mul_mat(v, kq)
            self.cb(kqv, "kqv", il)
            cur = g.permute(kqv, 0, 2, 1, 3)
            cur = g.cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        g.expand(cur)
        return cur

    # --- the seed's dflash.cpp pieces -----------------------------------------------------------

    def inject_inp(self, n_tok):
        inp = Trace.leaf("", (self.n_embd_inp, n_tok))
        self.cb(inp, "inp_target_features", -1)
        x = self.lora_mm(self.w("fc.weight"), inp, self.w("fc.scale"))
        return self.norm(x, self.w("enc.output_norm.weight"), -1)

    # --- DeepSeek-V4 helpers (deepseek4.cpp) ------------------------------------------------------

    def hc_mixes(self, x, fn, scale, base, il):
        g, hc = self.g, self.hc
        nt = x.ne[2]
        flat = g.reshape(x, hc * self.n_embd, nt)
        mixes = g.mul_mat(fn, g.same("RMS_NORM", flat))
        self.cb(mixes, "hc_mixes", il)
        scale_pre, scale_post = g.view(scale, 1), g.view(scale, 1)
        base_pre, base_post = g.view(base, hc), g.view(base, hc)
        pre = g.view(mixes, hc, nt)
        pre = g.same("ADD", g.same("MUL", pre, scale_pre), base_pre)
        pre = g.same("SCALE", g.same("SIGMOID", pre))            # scale_bias(1, eps)
        self.cb(pre, "hc_pre", il)
        post = g.view(mixes, hc, nt)
        post = g.same("ADD", g.same("MUL", post, scale_post), base_post)
        post = g.same("SCALE", g.same("SIGMOID", post))          # x 2
        self.cb(post, "hc_post", il)
        comb = g.op("DSV4_HC_COMB", (hc, hc, nt), mixes, scale, base)
        self.cb(comb, "hc_comb", il)
        return pre, post, comb

    def hc_pre_weighted(self, x, w, il):
        g = self.g
        if il >= 0:
            return g.op("DSV4_HC_PRE", (x.ne[0], x.ne[2]), x, w)
        res = None
        for _ in range(x.ne[1]):
            cur = g.same("MUL", g.view(x, self.n_embd, x.ne[2]), g.view(w, 1, x.ne[2]))
            res = cur if res is None else g.same("ADD", res, cur)
        return res

    def hc_post(self, x, residual, post, comb):
        return self.g.op("DSV4_HC_POST", (x.ne[0], residual.ne[1], x.ne[1]), x, residual, post, comb)

    # --- graphs ---------------------------------------------------------------------------------

    def build(self, ub: UBatch) -> list[T]:
        self.g = Trace()
        self.n_tokens = ub.n_tokens
        self.ub = ub
        self.inp_pos = Trace.leaf("inp_pos", (ub.n_tokens,))
        self.k_idxs = Trace.leaf("attn_inp_k_idxs", (ub.n_tokens,))
        self.kq_mask = Trace.leaf("attn_inp_kq_mask", (self.n_kv, ub.n_tokens, 1, 1))
        self.cache = [Trace.leaf(f"cache_k_l{il}", (self.hd, self.kv_size)) for il in range(self.n_layer)]
        if self.backbone == "dsv41":
            self.graph_dsv41(ub)
        elif self.backbone == "dsv4":
            self.graph_dsv4(ub)
        else:
            self.graph_mistral_large4(ub)
        return self.g.nodes

    def _inject(self, build_kv):
        g, n = self.g, self.n_tokens
        inp_g = self.inject_inp(n)
        self.cb(inp_g, "main_x", -1)
        for il in range(self.n_layer):
            kv = build_kv(inp_g, il)
            self.cb(kv, "kv_injected", il)
            g.expand(g.set_rows(self.cache[il], g.view(kv, kv.ne[0] * kv.ne[1], n), self.k_idxs))
        g.expand(inp_g)

    def graph_dsv41(self, ub):
        g, n, E, H, hd = self.g, self.n_tokens, self.n_embd, self.n_head, self.hd
        w = self.w

        def rope(t):
            return g.same("ROPE", t, self.inp_pos)

        def kv_of(x, il):
            b = f"blk.{il}."
            kv = self.lora_mm(w(b + "attn_kv.weight"), x)
            kv = self.norm(kv, w(b + "attn_kv_a_norm.weight"), il)
            return rope(g.reshape(kv, hd, 1, n))

        if ub.embd:
            self._inject(kv_of)
            return
        tokens = Trace.leaf("", (n,))
        self.tokens = tokens
        inpL = g.get_rows(w("token_embd.weight"), tokens)
        self.cb(inpL, "inp_noise_embd", -1)
        inpL = g.reshape(inpL, E, 1, n)
        inpL = g.op("REPEAT", (E, self.hc, n), inpL)
        self.cb(inpL, "hc_init", -1)
        pre_prev = None
        for il in range(self.n_layer):
            b = f"blk.{il}."
            residual = inpL
            a_pre, a_post, a_comb = self.hc_mixes(inpL, w(b + "hc_attn_fn.weight"), w(b + "hc_attn_scale.weight"),
                                                  w(b + "hc_attn_base.weight"), il)
            if pre_prev is None:
                cur = g.cont(g.view(inpL, E, n))
            else:
                cur = self.hc_pre_weighted(inpL, pre_prev, il)
            self.cb(cur, "hc_attn_pre", il)
            cur = self.norm(cur, w(b + "attn_norm.weight"), il)
            self.cb(cur, "attn_norm", il)
            qr = self.lora_mm(w(b + "attn_q_a.weight"), cur)
            qr = self.norm(qr, w(b + "attn_q_a_norm.weight"), il)
            self.cb(qr, "qr_norm", il)
            q = self.lora_mm(w(b + "attn_q_b.weight"), qr)
            q = rope(g.reshape(q, hd, H, n))
            self.cb(q, "q", il)
            kv = kv_of(cur, il)
            self.cb(kv, "kv", il)
            out = self.attn_k(q, kv, hd, w(b + "attn_sinks.weight"), il)
            self.cb(out, "attn_raw", il)
            out = g.reshape(out, hd, H, n)
            out = g.same("ROPE_BACK", out, self.inp_pos)
            self.cb(out, "attn_derope", il)
            G_ = self.n_groups
            out = g.reshape(out, H // G_ * hd, G_, n)
            out = g.permute(out, 0, 2, 1, 3)
            oa = g.mul_mat(w(b + "attn_output_a.weight"), out)
            self.cb(oa, "attn_wo_a", il)
            oa = g.permute(oa, 0, 2, 1, 3)
            oa = g.cont(oa, self.o_rank * G_, n)
            cur = self.lora_mm(w(b + "attn_output_b.weight"), oa)
            self.cb(cur, "attn_out", il)
            inpL = self.hc_post(cur, residual, a_post, a_comb)
            self.cb(inpL, "hc_attn_post", il)
            residual = inpL
            f_pre, f_post, f_comb = self.hc_mixes(inpL, w(b + "hc_ffn_fn.weight"), w(b + "hc_ffn_scale.weight"),
                                                  w(b + "hc_ffn_base.weight"), il)
            pre_prev = f_pre
            cur = self.hc_pre_weighted(inpL, a_pre, il)
            self.cb(cur, "hc_ffn_pre", il)
            cur = self.norm(cur, w(b + "ffn_norm.weight"), il)
            self.cb(cur, "ffn_norm", il)
            moe = self.moe(cur, il)
            sh = self.ffn(cur, w(b + "ffn_up_shexp.weight"), w(b + "ffn_gate_shexp.weight"),
                          w(b + "ffn_down_shexp.weight"), il, self.clamp_sh)
            self.cb(sh, "ffn_shexp", il)
            cur = g.same("ADD", moe, sh)
            self.cb(cur, "ffn_out", il)
            inpL = self.hc_post(cur, residual, f_post, f_comb)
            l_out = g.reshape(inpL, E * self.hc, n)
            self.cb(l_out, "l_out", il)
            g.expand(l_out)
        cur = self.hc_pre_weighted(inpL, pre_prev, -1)
        self.cb(cur, "hc_out", -1)
        self.t_embd = cur
        cur = self.norm(cur, w("output_norm.weight"), -1)
        self.cb(cur, "result_norm", -1)
        cur = self.lora_mm(w("output.weight"), cur, w("output.scale"))
        self.cb(cur, "result_output", -1)
        self.logits = cur
        if w("markov_w1.weight") is not None:
            self.markov_head(tokens, None)

    def graph_dsv4(self, ub):
        """The seed's graph_dsv4 with deepseek4.cpp's build_attention_impl
        (ratio 0, the k_iswa input) and build_hc_head: b11739 has this graph, so tracing it checks
        the helpers above against llama.cpp's own dumps (tests/data/reference/dsv4-*)."""
        g, n, E, H, hd = self.g, self.n_tokens, self.n_embd, self.n_head, self.hd
        w = self.w

        def rope(t, op="ROPE"):
            return g.same(op, t, self.inp_pos)

        def kv_of(x, il, name):
            b = f"blk.{il}."
            kv = self.lora_mm(w(b + "attn_kv.weight"), x)
            kv = self.norm(kv, w(b + "attn_kv_a_norm.weight"), il)
            kv = g.reshape(kv, hd, 1, n)
            if name:
                self.cb(kv, name, il)
            return rope(kv)

        if ub.embd:
            inp_g = self.inject_inp(n)
            self.cb(inp_g, "inp_g_embeddings", -1)
            for il in range(self.n_layer):
                kv = kv_of(inp_g, il, None)
                self.cb(kv, "kv_injected", il)
                g.expand(g.set_rows(self.cache[il], g.view(kv, hd, n), self.k_idxs))
            g.expand(inp_g)
            return
        tokens = Trace.leaf("", (n,))
        inpL = g.get_rows(w("token_embd.weight"), tokens)
        self.cb(inpL, "inp_noise_embd", -1)
        inpL = g.op("REPEAT", (E, self.hc, n), g.reshape(inpL, E, 1, n))
        self.cb(inpL, "hc_init", -1)
        for il in range(self.n_layer):
            b = f"blk.{il}."
            residual = inpL
            pre, post, comb = self.hc_mixes(inpL, w(b + "hc_attn_fn.weight"), w(b + "hc_attn_scale.weight"),
                                            w(b + "hc_attn_base.weight"), il)
            cur = self.hc_pre_weighted(inpL, pre, il)
            self.cb(cur, "hc_attn_pre", il)
            cur = self.norm(cur, w(b + "attn_norm.weight"), il)
            self.cb(cur, "attn_norm", il)
            qr = self.lora_mm(w(b + "attn_q_a.weight"), cur)
            self.cb(qr, "qr", il)
            qr = self.norm(qr, w(b + "attn_q_a_norm.weight"), il)
            self.cb(qr, "qr_norm", il)
            q = g.reshape(self.lora_mm(w(b + "attn_q_b.weight"), qr), hd, H, n)
            q = g.same("RMS_NORM", q)
            self.cb(q, "q_norm", il)
            q = rope(q)
            self.cb(q, "q", il)
            kv = kv_of(cur, il, "kv_norm")
            self.cb(kv, "kv", il)
            out = self.attn_k(q, kv, hd, w(b + "attn_sinks.weight"), il)
            self.cb(out, "attn_raw", il)
            out = rope(g.reshape(out, hd, H, n), "ROPE_BACK")
            self.cb(out, "attn_derope", il)
            G_ = self.n_groups
            out = g.permute(g.reshape(out, H // G_ * hd, G_, n), 0, 2, 1, 3)
            oa = g.mul_mat(w(b + "attn_output_a.weight"), out)
            self.cb(oa, "attn_wo_a", il)
            oa = g.cont(g.permute(oa, 0, 2, 1, 3), self.o_rank * G_, n)
            cur = self.lora_mm(w(b + "attn_output_b.weight"), oa)
            self.cb(cur, "attn_out", il)
            inpL = self.hc_post(cur, residual, post, comb)
            self.cb(inpL, "hc_attn_post", il)
            residual = inpL
            pre, post, comb = self.hc_mixes(inpL, w(b + "hc_ffn_fn.weight"), w(b + "hc_ffn_scale.weight"),
                                            w(b + "hc_ffn_base.weight"), il)
            cur = self.hc_pre_weighted(inpL, pre, il)
            self.cb(cur, "hc_ffn_pre", il)
            cur = self.norm(cur, w(b + "ffn_norm.weight"), il)
            self.cb(cur, "ffn_norm", il)
            moe = self.moe(cur, il)
            self.cb(moe, "ffn_moe_out", il)
            sh = self.ffn(cur, w(b + "ffn_up_shexp.weight"), w(b + "ffn_gate_shexp.weight"),
                          w(b + "ffn_down_shexp.weight"), il, self.clamp_sh)
            self.cb(sh, "ffn_shexp", il)
            cur = g.same("ADD", moe, sh)
            self.cb(cur, "ffn_out", il)
            inpL = self.hc_post(cur, residual, post, comb)
            self.cb(inpL, "l_out", il)
        flat = g.reshape(inpL, self.hc * E, n)
        mixes = g.mul_mat(w("output_hc_fn.weight"), g.same("RMS_NORM", flat))
        self.cb(mixes, "hc_head_mixes", -1)
        pre = g.same("ADD", g.same("MUL", mixes, w("output_hc_scale.weight")), w("output_hc_base.weight"))
        pre = g.same("SCALE", g.same("SIGMOID", pre))
        self.cb(pre, "hc_head_pre", -1)
        cur = self.hc_pre_weighted(inpL, pre, -1)
        self.cb(cur, "hc_head", -1)
        self.t_embd = cur
        cur = self.norm(cur, w("output_norm.weight"), -1)
        self.cb(cur, "result_norm", -1)
        cur = self.lora_mm(w("output.weight"), cur, w("output.scale"))
        self.cb(cur, "result_output", -1)
        self.logits = cur
        if w("markov_w1.weight") is not None:
            self.markov_head(tokens, None)

    def graph_mistral_large4(self, ub):
        g, n, E, H = self.g, self.n_tokens, self.n_embd, self.n_head
        w, r, nr = self.w, self.rank, self.n_rot
        nope = self.k_mla - nr

        def rope(t):
            return g.same("ROPE", t, self.inp_pos)

        def build_kv(x, il):
            b = f"blk.{il}."
            kv_cmpr_pe = g.mul_mat(w(b + "attn_kv_a_mqa.weight"), x)
            self.cb(kv_cmpr_pe, "kv_cmpr_pe", il)
            kv_cmpr = g.view(kv_cmpr_pe, r, n)
            kv_cmpr = self.norm(kv_cmpr, w(b + "attn_kv_a_norm.weight"), il)
            kv_cmpr = g.reshape(kv_cmpr, r, 1, n)
            self.cb(kv_cmpr, "kv_cmpr", il)
            k_pe = g.view(kv_cmpr_pe, nr, 1, n)
            k_pe = rope(k_pe)
            self.cb(k_pe, "k_pe", il)
            return g.concat(kv_cmpr, k_pe, 0), kv_cmpr

        if ub.embd:
            self._inject(lambda x, il: build_kv(x, il)[0])
            return
        tokens = Trace.leaf("", (n,))
        n_blocks = ub.n_blocks
        bd = n // n_blocks if n_blocks > 0 else 0
        tok_embd = w("token_embd.weight")
        if bd > 0 and n % n_blocks == 0 and bd <= self.block_size:
            anchors = g.view(tokens, 1, n_blocks)
            anchors = g.get_rows(tok_embd, g.cont(anchors, n_blocks))
            inpL = g.reshape(anchors, E, 1, n_blocks)
            if bd > 1:
                masks = g.view(w("mask_embd.weight"), E, bd - 1, 1)
                masks = g.op("REPEAT", (E, bd - 1, n_blocks), g.cast(masks))
                inpL = g.concat(inpL, masks, 1)
            inpL = g.reshape(inpL, E, n)
        else:
            inpL = g.get_rows(tok_embd, tokens)
        self.cb(inpL, "inp_noise_embd", -1)
        cur = None
        for il in range(self.n_layer):
            b = f"blk.{il}."
            cur = self.norm(inpL, w(b + "attn_norm.weight"), il)
            self.cb(cur, "attn_norm", il)
            q = g.mul_mat(w(b + "attn_q.weight"), cur)
            self.cb(q, "q", il)
            q_nope = g.permute(g.view(q, nope, H, n), 0, 2, 1, 3)
            q_abs = g.permute(g.mul_mat(w(b + "attn_k_b.weight"), q_nope), 0, 2, 1, 3)
            self.cb(q_abs, "q_nope_absorbed", il)
            q_pe = rope(g.view(q, nr, H, n))
            self.cb(q_pe, "q_pe", il)
            qcur = g.concat(q_abs, q_pe, 0)
            self.cb(qcur, "Qcur", il)
            kcur, vcur = build_kv(cur, il)
            self.cb(kcur, "Kcur", il)
            out = self.attn_k(qcur, kcur, vcur.ne[0], None, il)
            self.cb(out, "attn_latent", il)
            out = g.reshape(out, r, H, n)
            out = g.mul_mat(w(b + "attn_v_b.weight"), g.permute(out, 0, 2, 1, 3))
            out = g.cont(g.permute(out, 0, 2, 1, 3), self.v_mla * H, n)
            cur = self.lora_mm(w(b + "attn_output.weight"), out, w(b + "attn_output.scale"))
            self.cb(cur, "attn_out", il)
            ffn_inp = g.same("ADD", cur, inpL)
            self.cb(ffn_inp, "ffn_inp", il)
            cur = self.norm(ffn_inp, w(b + "ffn_norm.weight"), il)
            self.cb(cur, "ffn_norm", il)
            cur = self.ffn(cur, w(b + "ffn_up.weight"), w(b + "ffn_gate.weight"), w(b + "ffn_down.weight"), il, 0.0)
            self.cb(cur, "ffn_out", il)
            inpL = g.same("ADD", cur, ffn_inp)
            self.cb(inpL, "l_out", il)
        cur = self.norm(inpL, w("output_norm.weight"), -1)
        self.cb(cur, "result_norm", -1)
        logits = self.lora_mm(w("output.weight"), cur, w("output.scale"))
        if self.softcap:
            logits = g.same("SCALE", g.same("TANH", g.same("SCALE", logits)))
        self.cb(logits, "result_output", -1)
        self.logits, self.t_embd = logits, cur
        if w("markov_w1.weight") is not None:
            self.markov_head(tokens, cur)

    # --- build_dspark_markov_head -----------------------------------------------------------------

    def markov_head(self, tokens, hidden):
        g, w = self.g, self.w
        w1, w2, w2_s = w("markov_w1.weight"), w("markov_w2.weight"), w("markov_w2.scale")
        has_conf = w("conf_proj.weight") is not None
        is_rnn = w("joint_proj.weight") is not None
        assert not is_rnn or hidden is not None, "the seed asserts: the RNN head needs the hidden state"
        base = self.logits
        n_vocab, n_tok = base.ne[0], base.ne[1]
        n_blocks = self.ub.n_blocks
        bd = n_tok // n_blocks
        if bd > self.block_size:
            return
        beg = 0 if self.sample_from_anchor else 1
        prev = g.cont(g.view(tokens, 1, n_blocks), n_blocks)
        cat = cat_conf = None
        if not self.sample_from_anchor:
            cat = g.cont(g.view(base, n_vocab, n_blocks))
            if has_conf:
                cat_conf = g.same("SIGMOID", g.view(base, 1, n_blocks))
        state = None
        markov = None
        for i in range(beg, bd):
            w1_prev = g.get_rows(w1, prev)
            markov = w1_prev
            if is_rnn:
                rank = w1_prev.ne[0]
                if state is None:
                    state = g.same("FILL", Trace.leaf("", (rank, n_blocks)))
                hidden_i = g.view(hidden, hidden.ne[0], n_blocks)
                joint = g.concat(g.concat(state, w1_prev, 0), g.cont(hidden_i), 0)
                joint = g.same("ADD", g.mul_mat(w("joint_proj.weight"), joint), w("joint_proj.bias"))

                def chunk(joint=joint, rank=rank):
                    return g.cont(g.view(joint, rank, n_blocks))
                gate = g.same("SIGMOID", chunk())
                cand = g.same("TANH", chunk())
                state = g.same("ADD", cand, g.same("MUL", gate, g.same("SUB", state, cand)))
                markov = g.same("TANH", chunk())
            bias = self.lora_mm(w2, markov, w2_s)
            base_i = g.view(base, n_vocab, n_blocks)
            col = g.same("ADD", base_i, bias)
            cat = col if cat is None else g.concat(cat, col, 1)
            if has_conf:
                conf_inp = self.t_embd
                feat = g.concat(g.cont(g.view(conf_inp, conf_inp.ne[0], n_blocks)), markov, 0)
                conf = g.mul_mat(w("conf_proj.weight"), feat)
                if w("conf_proj.bias") is not None:
                    conf = g.same("ADD", conf, w("conf_proj.bias"))
                conf = g.same("SIGMOID", conf)
                cat_conf = conf if cat_conf is None else g.concat(cat_conf, conf, 1)
            if i + 1 < bd:
                prev = g.op("ARGMAX", (col.ne[1],), col)
        out = g.reshape(cat, n_vocab, n_blocks, bd)
        out = g.cont(g.permute(out, 0, 2, 1, 3))
        out = g.reshape(out, n_vocab, n_tok)
        if has_conf:
            conf = g.reshape(cat_conf, 1, n_blocks, bd)
            conf = g.cont(g.permute(conf, 0, 2, 1, 3))
            conf = g.reshape(conf, 1, n_tok)
            conf = g.op("REPEAT", self.t_embd.ne, conf)
            g.expand(conf)
        g.expand(out)
