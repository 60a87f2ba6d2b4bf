"""Case generators: hypothesis strategies for structured inputs and a byte-level mutator for files.

Hypothesis only draws the cases here (no shrinking: the cases run in child processes, see
fuzz_runner); each case is a JSON-able dict that fuzz_inputs turns back into files.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed
from hypothesis import strategies as st

from fuzz_inputs import BASES, REF_DUMPS, base_model, layout

U64 = 1 << 64
INTERESTING = [0, 1, 2, 3, 4, 5, 7, 8, 16, 63, 64, 65, 255, 256, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**40,
               2**63 - 1, 2**63, 2**64 - 1, -1, -2, -2**31, -2**63]
INT_TYPES = {"UINT8": (0, 255), "INT8": (-128, 127), "UINT16": (0, 65535), "INT16": (-32768, 32767),
             "UINT32": (0, 2**32 - 1), "INT32": (-2**31, 2**31 - 1), "UINT64": (0, 2**64 - 1),
             "INT64": (-2**63, 2**63 - 1)}
# keys every head and backbone reads, including ones a base may lack
HEAD_KEYS = [
    "dflash.embedding_length", "dflash.block_count", "dflash.feed_forward_length", "dflash.attention.head_count",
    "dflash.attention.head_count_kv", "dflash.context_length", "dflash.attention.key_length",
    "dflash.attention.value_length", "dflash.rope.dimension_count", "dflash.attention.layer_norm_rms_epsilon",
    "dflash.rope.freq_base", "dflash.rope.scaling.factor", "dflash.rope.dimension_sections",
    "dflash.target_layers", "dflash.block_size", "dflash.conv_kernel_size", "dflash.conv_group_size",
    "dflash.selector_rank", "dflash.selector_top_k", "tokenizer.ggml.mask_token_id", "tokenizer.ggml.tokens",
    "dflash.sample_from_anchor", "dflash.hyper_connection.count", "dflash.attention.kv_lora_rank",
    "dflash.attention.sliding_window", "dflash.attention.sliding_window_pattern", "dflash.attention.causal",
    "dflash.hidden_activation", "lilicorr.hidden_size", "lilicorr.candidate_topk", "lilicorr.num_heads",
    "lilicorr.num_layers", "lilicorr.vector_eps", "lilicorr.logit_scale", "lilicorr.factor_dim",
    "lilicorr.mlp_hidden_size", "dflash.expert_count", "dflash.expert_used_count", "dflash.attention.q_lora_rank",
    "dflash.attention.output_group_count", "dflash.attention.output_lora_rank",
    "dflash.hyper_connection.sinkhorn_iterations", "dflash.attention.compress_ratios",
    "dflash.expert_gating_func", "dflash.attention.key_length_mla", "dflash.attention.value_length_mla",
    "dflash.expert_feed_forward_length", "dflash.expert_shared_count",
]


def collect(strategy, n: int, seed: int) -> list:
    """n values drawn from `strategy` (hypothesis as a generator)."""
    out: list = []

    @hseed(seed)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(x):
        out.append(x)

    k = 0
    while len(out) < n and k < 20:  # hypothesis may stop early on a small space: draw again
        draw()
        draw = hseed(seed + 1000 * (k + 1))(draw)
        k += 1
    return out[:n]


def ints():
    return st.one_of(st.sampled_from(INTERESTING), st.integers(-10, 300))


@st.composite
def key_value(draw):
    """[gguf value type, value, array sub-type] for any type, the value fitting its type."""
    kind = draw(st.sampled_from(["int", "int", "int", "float", "bool", "str", "arr"]))
    if kind == "int":
        v = draw(ints())
        fits = [t for t, (lo, hi) in INT_TYPES.items() if lo <= v <= hi]
        return [draw(st.sampled_from(fits)), v, None]
    if kind == "float":
        v = draw(st.one_of(st.sampled_from([0.0, -1.0, 1e-6, 1e30, float("nan"), float("inf"), -float("inf")]),
                           st.floats(-1e6, 1e6)))
        return [draw(st.sampled_from(["FLOAT32", "FLOAT64"])), v, None]
    if kind == "bool":
        return ["BOOL", draw(st.booleans()), None]
    if kind == "str":
        return ["STRING", draw(st.sampled_from(["", "silu", "gelu", "yarn", "true", "false", "x" * 300])), None]
    sub = draw(st.sampled_from(["INT32", "UINT32", "BOOL", "STRING"]))
    if sub == "STRING":
        vals = draw(st.lists(st.sampled_from(["", "a", "<mask>"]), min_size=1, max_size=6))
    elif sub == "BOOL":
        vals = draw(st.lists(st.booleans(), min_size=1, max_size=6))
    else:
        lo, hi = INT_TYPES[sub]
        vals = draw(st.lists(ints().filter(lambda x: lo <= x <= hi), min_size=1, max_size=6))
    return ["ARRAY", vals, sub]


class GGUFSpace:
    """What the GGUF strategies need to know about the base drafts (built once, in the parent)."""

    def __init__(self, cache: Path):
        import gguf
        self.info = {}
        for name in BASES:
            p = base_model(name, cache)
            data = p.read_bytes()
            kvs, infos, hdr_end = layout(data)
            r = gguf.GGUFReader(str(p))
            self.info[name] = {"size": len(data), "hdr": hdr_end, "keys": [k.key for k in kvs],
                               "tensors": [(t.name, [int(x) for x in t.shape]) for t in r.tensors],
                               "n_t": len(infos)}

    def strategy(self):
        return st.one_of(self.bytes_case(), self.raw_case(), self.struct_case(), self.struct_case(), self.mixed())

    @st.composite
    def _base(draw, self):
        return draw(st.sampled_from(sorted(self.info)))

    def bytes_case(self):
        @st.composite
        def s(draw):
            b = draw(self._base())
            info = self.info[b]
            hdr, size = info["hdr"], info["size"]
            off = st.integers(0, hdr - 1)
            mut = st.one_of(
                st.tuples(st.just("truncate"), st.integers(0, size - 1)),
                st.tuples(st.just("flip"), off, st.integers(0, 7)),
                st.tuples(st.just("poke64"), off, st.sampled_from(INTERESTING)),
                st.tuples(st.just("poke32"), off, st.sampled_from(INTERESTING)),
                st.tuples(st.just("set"), off, st.binary(min_size=1, max_size=8).map(bytes.hex)),
                st.tuples(st.just("delete"), off, st.integers(1, 16)),
                st.tuples(st.just("insert"), off, st.binary(min_size=1, max_size=16).map(bytes.hex)),
                st.tuples(st.just("dup"), off, st.integers(1, 64)),
            )
            muts = draw(st.lists(mut.map(list), min_size=1, max_size=4))
            return {"family": "gguf", "kind": "bytes", "base": b, "bytes": muts, "fa": draw(st.booleans())}
        return s()

    def raw_case(self):
        @st.composite
        def s(draw):
            b = draw(self._base())
            info = self.info[b]
            size = info["size"]
            big = st.sampled_from([size, size - 1, size + 32, 2**32, 2**40, 2**63, 2**64 - 1, 0, 1, 31])
            edit = st.one_of(
                st.tuples(st.just("offset"), st.integers(0, 999), st.one_of(big, st.integers(0, size))),
                st.tuples(st.just("dim"), st.integers(0, 999), st.integers(0, 3),
                          st.sampled_from([0, 1, 2, 3, 5, 63, 65, 2**31, 2**40, 2**62, 2**63, 2**64 - 1])),
                st.tuples(st.just("ndims"), st.integers(0, 999), st.sampled_from([0, 3, 4, 5, 8, 2**31])),
                st.tuples(st.just("type"), st.integers(0, 999), st.one_of(st.integers(0, 42),
                                                                          st.sampled_from([2**31, 2**32 - 1]))),
                st.tuples(st.just("dupname"), st.integers(0, 999), st.integers(0, 99)),
                st.tuples(st.just("kvtype"), st.sampled_from(info["keys"]),
                          st.one_of(st.integers(0, 13), st.sampled_from([14, 255, 2**31]))),
                st.tuples(st.just("kvpoke"), st.sampled_from(info["keys"]), st.sampled_from(INTERESTING)),
            )
            raw = draw(st.lists(edit.map(list), min_size=1, max_size=3))
            return {"family": "gguf", "kind": "raw", "base": b, "raw": raw, "fa": draw(st.booleans())}
        return s()

    def _edits(self, draw, b):
        info = self.info[b]
        edits = {}
        keys = st.sampled_from(sorted(set(info["keys"]) | set(HEAD_KEYS)))
        if draw(st.booleans()):
            edits["set_keys"] = draw(st.dictionaries(keys, key_value(), min_size=1, max_size=3))
        if draw(st.integers(0, 3)) == 0:
            edits["drop_keys"] = draw(st.lists(st.sampled_from(info["keys"]), min_size=1, max_size=2))
        names = [n for n, _ in info["tensors"]]
        dim = st.sampled_from([1, 2, 3, 4, 5, 8, 63, 64, 65, 128, 256, 257])
        if draw(st.integers(0, 2)) == 0:
            edits["reshape"] = draw(st.dictionaries(st.sampled_from(names), st.lists(dim, min_size=1, max_size=3),
                                                    min_size=1, max_size=2))
        if draw(st.integers(0, 4)) == 0:
            edits["drop_tensors"] = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2))
        if draw(st.integers(0, 4)) == 0:
            edits["retype"] = {draw(st.sampled_from(names)): draw(st.sampled_from(["float16", "int32", "int8",
                                                                                   "float64"]))}
        if draw(st.integers(0, 5)) == 0:
            # another head's tensors in this file: the variant detection must stay consistent
            others = ["markov_w1.weight", "selector_hidden.weight", "joint_proj.weight", "d2t",
                      "conf_proj.weight", "mask_embd.weight", "blk.9.attn_q.weight"]
            edits["add_tensors"] = {draw(st.sampled_from(others)): draw(st.lists(dim, min_size=1, max_size=2))}
        if not edits:
            edits["set_keys"] = draw(st.dictionaries(keys, key_value(), min_size=1, max_size=2))
        return edits

    def struct_case(self):
        @st.composite
        def s(draw):
            b = draw(self._base())
            return {"family": "gguf", "kind": "struct", "base": b, "edits": self._edits(draw, b),
                    "fa": draw(st.booleans())}
        return s()

    def mixed(self):
        @st.composite
        def s(draw):
            c = draw(self.struct_case())
            r = draw(self.raw_case())
            if r["base"] == c["base"] and draw(st.booleans()):
                c["raw"] = r["raw"]
            c["kind"] = "mixed"
            return c
        return s()


# ---- batches ------------------------------------------------------------------------------------

BATCH_BASES = ["dflash", "dflash-iswa", "dflash2", "dspark", "lilicorr", "dspark-dsv4", "dspark-ml4"]


def batch_strategy():
    pos = st.one_of(st.integers(-3, 70), st.sampled_from([2**31 - 8, -2**31]))
    seq = st.one_of(st.integers(0, 2), st.sampled_from([-1, 3, 2**31 - 1]))
    tok = st.one_of(st.sampled_from([1, 7, 255]), st.sampled_from([-1, 256, 2**31 - 1]))
    inject = st.tuples(st.sampled_from(["inject", "inject", "encode"]), st.integers(0, 20),
                       st.sampled_from([0, 0, 0, 0, -1, 1, -10**6]), pos, seq,
                       st.sampled_from([None, None, None, None, "nan", "3d"]))
    block = st.tuples(st.just("block"),
                      st.lists(st.tuples(seq, st.one_of(st.lists(st.just(255), min_size=4, max_size=4).map(
                          lambda t: [7] + t[1:]), st.lists(tok, max_size=10)), pos).map(list),
                          min_size=1, max_size=3),
                      st.one_of(st.none(), st.none(), st.tuples(st.integers(-2, 2), st.integers(-2, 2)).map(list)))
    seq_rm = st.tuples(st.just("seq_rm"), st.integers(-2, 4), st.integers(-2, 40), st.integers(-2, 40))
    op = st.one_of(inject, inject, block, block, block, seq_rm).map(list)
    return st.fixed_dictionaries({
        "family": st.just("batch"), "base": st.sampled_from(BATCH_BASES),
        "n_ctx": st.sampled_from([4, 8, 16, 32, 64]), "n_ubatch": st.sampled_from([1, 2, 4, 8, 16]),
        "n_seq": st.integers(1, 3), "fa": st.booleans(), "ops": st.lists(op, min_size=1, max_size=6)})


# ---- scenarios ----------------------------------------------------------------------------------

def _maybe(v, other):
    return st.one_of(v, v, v, other)


def scenario_strategy():
    junk = st.one_of(st.none(), st.booleans(), st.text(max_size=4), st.floats(allow_nan=True),
                     st.sampled_from([-1, 0, 2**31, 2**63, [], {}]))
    small = st.integers(0, 12)
    pos = _maybe(st.integers(0, 40), st.integers(-3, -1))
    seq = _maybe(st.integers(0, 2), st.sampled_from([-1, 5]))
    tokens = _maybe(st.one_of(st.just([7, 255, 255, 255]), st.lists(st.sampled_from([1, 7, 255]), min_size=1,
                                                                     max_size=9)),
                    st.one_of(st.lists(st.sampled_from([-1, 256, True, "a", 2**40]), max_size=3), junk))
    body_inject = st.fixed_dictionaries({"n_tokens": _maybe(st.integers(1, 20), junk)},
                                        optional={"pos0": pos, "seq": seq, "extra": junk})
    seq_entry = st.fixed_dictionaries({"tokens": tokens, "pos0": pos},
                                      optional={"seq": seq, "embd_state": _maybe(st.sampled_from(["context",
                                                                                                  "random"]), junk)})
    body_block = st.one_of(seq_entry, st.fixed_dictionaries({"seqs": _maybe(st.lists(seq_entry, min_size=1,
                                                                                      max_size=3), junk)}))
    body_rm = st.fixed_dictionaries({}, optional={"seq": st.integers(-2, 3), "p0": st.integers(-2, 30),
                                                  "p1": st.integers(-2, 30)})
    step = st.one_of(
        st.fixed_dictionaries({"inject": body_inject}), st.fixed_dictionaries({"inject": body_inject}),
        st.fixed_dictionaries({"encode": body_inject}), st.fixed_dictionaries({"block": body_block}),
        st.fixed_dictionaries({"block": body_block}), st.fixed_dictionaries({"seq_rm": body_rm}),
        st.dictionaries(st.sampled_from(["teleport", "inject", "block"]), junk, max_size=2), junk)
    doc = st.fixed_dictionaries(
        {"steps": _maybe(st.lists(step, min_size=1, max_size=5), st.one_of(st.just([]), junk))},
        optional={"n_ctx": _maybe(st.sampled_from([8, 16, 32, 64, 256]), st.sampled_from([0, -1, 1, 2, 1 << 20,
                                                                                           (1 << 20) + 1, "8"])),
                  "n_ubatch": _maybe(st.sampled_from([1, 4, 8, 16, 64]), st.sampled_from([0, 8193, 2.5, None])),
                  "flash_attn": _maybe(st.sampled_from(["on", "off", True, False]), junk),
                  "type_kv": _maybe(st.sampled_from(["f16", "f32", "q8_0", "q4_0"]),
                                    st.sampled_from(["q4_k", "", None, 16])),
                  "type_k": _maybe(st.sampled_from(["f16", "q8_0", "q5_1", "iq4_nl"]), st.sampled_from(["bf16", 8])),
                  "type_v": _maybe(st.sampled_from(["f32", "q4_1", "q5_0"]), st.sampled_from(["Q8_0", None])),
                  "seed": _maybe(small, st.sampled_from([-1, 2**70, 1.5])),
                  "n_seq": _maybe(st.integers(1, 3), st.sampled_from([0, 257, -4])),
                  "n_threads": _maybe(st.integers(1, 2), st.sampled_from([0, 10**6])),
                  "bogus": junk})
    raw = st.tuples(doc, st.lists(st.tuples(st.sampled_from(["truncate", "flip", "delete"]), st.integers(0, 200),
                                            st.integers(0, 7)).map(list), min_size=1, max_size=3))

    def as_text(t):
        from fuzz_inputs import apply_bytes
        text = json.dumps(t[0]).encode()
        return apply_bytes(text, t[1]).decode("latin-1")

    return st.fixed_dictionaries({
        "family": st.just("scenario"), "base": st.sampled_from(["dflash", "dflash2", "dspark", "lilicorr",
                                                                "dflash-iswa"]),
        "doc": st.one_of(doc, doc, doc, raw.map(as_text)), "dump": st.booleans(),
        "trace": st.sampled_from([False, False, False, True])})


# ---- dumps and rules ----------------------------------------------------------------------------

NODE_FIELDS = ["index", "name", "op", "type", "ne", "src", "view_src", "view_offs", "op_params", "backend"]
TOP_FIELDS = [["format"], ["source"], ["source", "engine"], ["source", "version"], ["model"], ["graph"],
              ["settings"], ["settings", "n_ctx"], ["settings", "flash_attn"], ["settings", "n_kv"],
              ["settings", "causal"], ["cpu_features"], ["cpu_features", "AVX2"], ["nodes"]]


def json_values():
    return st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                        max_leaves=6)


def rules_strategy():
    pat = st.one_of(st.sampled_from(["MUL_MAT", "ADD", "VIEW", "RESHAPE", "", 3, None]),
                    st.fixed_dictionaries({"op": st.sampled_from(["MUL_MAT", "ADD", "", 5])},
                                          optional={"name": st.sampled_from(["attn.*", "(", "(a+)+$", "(.*)*x",
                                                                             "[", 7, "ffn_.*-1"])}))
    rule = st.fixed_dictionaries({"name": st.sampled_from(["r1", "r2", "", 4]),
                                  "reason": st.sampled_from(["why", 1]),
                                  "ref": st.one_of(st.lists(pat, max_size=3), st.none()),
                                  "ours": st.one_of(st.lists(pat, max_size=3), st.none())},
                                 optional={"extra": st.just(1)})
    return st.one_of(st.none(), st.none(), st.fixed_dictionaries({"rules": st.lists(rule, max_size=3)}),
                     json_values(), st.just("{\"rules\": [")) 


def dump_strategy():
    cases = sorted(p.name for p in REF_DUMPS.iterdir() if p.is_dir() and any(p.glob("*.json")))
    path = st.one_of(st.sampled_from(TOP_FIELDS),
                     st.tuples(st.just("nodes"), st.integers(0, 400), st.sampled_from(NODE_FIELDS)).map(list),
                     st.tuples(st.just("nodes"), st.integers(0, 400)).map(list))
    edit = st.one_of(
        st.tuples(st.just("set"), path, json_values()),
        st.tuples(st.just("set"), path, st.sampled_from(["graphgen-dump/2", "", "block", [0, 0, 0, 0], [2**40] * 4,
                                                         -1, 2**31, "node_0"])),
        st.tuples(st.just("del"), path),
        st.tuples(st.just("cycle"), st.integers(0, 400), st.integers(0, 400)),
        st.tuples(st.just("grow"), st.sampled_from([300, 2100, 6000])),
        st.tuples(st.just("ne"), st.integers(0, 400), st.lists(st.sampled_from([0, 1, 4, -1, 2**31, 2**40, 2**62]),
                                                               min_size=3, max_size=5)),
    ).map(list)
    tb = st.tuples(st.sampled_from(["truncate", "flip", "delete", "insert"]), st.integers(0, 5000),
                   st.integers(0, 7)).map(lambda t: [t[0], t[1], t[2]] if t[0] != "insert" else [t[0], t[1], "7b5d22"])
    nb = st.tuples(st.sampled_from(["truncate", "flip", "poke32"]), st.integers(0, 3000),
                   st.integers(0, 7)).map(list)
    return st.fixed_dictionaries({
        "family": st.just("dump"), "ref_case": st.sampled_from(cases), "values": st.booleans(),
        "file": st.integers(0, 1),
        "doc_edits": st.lists(edit, max_size=3),
        "text_bytes": st.one_of(st.just([]), st.just([]), st.just([]), st.lists(tb, min_size=1, max_size=2)),
        "npz_bytes": st.one_of(st.just([]), st.just([]), st.lists(nb, min_size=1, max_size=2)),
        "rules": rules_strategy()})


def make_cases(family: str, n: int, seed: int, cache: Path) -> list:
    if family == "gguf":
        strat = GGUFSpace(cache).strategy()
    elif family == "batch":
        for b in BATCH_BASES:
            base_model(b, cache)
        strat = batch_strategy()
    elif family == "scenario":
        for b in BASES:
            base_model(b, cache)
        strat = scenario_strategy()
    elif family == "dump":
        strat = dump_strategy()
    else:
        raise ValueError(family)
    cases = collect(strat, n, seed)
    for i, c in enumerate(cases):
        c["id"] = f"s{seed}-{i}"
    return cases
