"""Accept/refuse agreement between graphgen and llama.cpp b11739 on fuzzed inputs.

Each input runs as one scenario on both engines: graphgen's engine in this process and the
reference in its child process (graphgen.reference.runner). An engine refuses an input when it
raises (graphgen: one of its documented exceptions; the reference: ReferenceFailed, which covers
a load error, a failed llama_process and an abort); both stop at the first step that fails, so
agreement is also checked on that step.

Three kinds of input: fuzzed GGUFs (the gguf family of fuzz_gen, run as inject + one block), GGUFs
that give one key llama.cpp reads another GGUF type (key_type_cases), and fuzzed batches:
scenarios whose steps put injects, encodes, blocks (several sequences, a sequence twice, blocks
of other lengths) and seq_rm calls at positions drawn around what the cache holds: the next
position, a gap, an overlap, a repeat.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from fuzz_gen import collect
from fuzz_inputs import base_model, make_gguf

# the batch family's drafts: fuzz_inputs' bases that llama.cpp b11739 can run (its Mistral Large 4
# base is seed only), and one with M-RoPE sections, whose position rules differ
EXTRA_BASES = {"dflash-mrope": ("dflash", "base", {"mrope_sections": [8, 0, 0, 0]})}
AGREE_BASES = ["dflash", "dflash-iswa", "dflash2", "dspark", "lilicorr", "dspark-dsv4", "dflash-mrope"]


def agree_model(name: str, cache: Path) -> Path:
    if name not in EXTRA_BASES:
        return base_model(name, cache)
    from graphgen.synth import make_model
    p = cache / f"{name}-agree.gguf"
    if not p.exists():
        cache.mkdir(parents=True, exist_ok=True)
        variant, backbone, kw = EXTRA_BASES[name]
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        make_model(tmp, variant, backbone, **kw)
        tmp.replace(p)
    return p


@dataclass
class Verdict:
    ok: bool
    step: int | None  # the step that failed (None: the model itself, or accepted)
    message: str


def ours(model: Path, doc: dict) -> Verdict:
    """graphgen's verdict on a scenario: accepted, or the documented error and its step."""
    from graphgen.play.engine import run_scenario
    from graphgen.errors import GraphgenError
    from graphgen.play.scenario import ScenarioError, parse_scenario
    seen: list[int] = []
    try:
        run_scenario(model, parse_scenario(doc), progress=lambda s: seen.append(s.index))
    except (GraphgenError, ScenarioError) as e:
        return Verdict(False, seen[-1] if seen else None, f"{type(e).__name__}: {e}")
    return Verdict(True, None, "")


_STEP = re.compile(r"\bstep (\d+)\b")


def reference(model: Path, doc: dict, work: Path) -> Verdict:
    """b11739's verdict on the same scenario (its child process reports the failing step)."""
    from graphgen.reference.runner import ReferenceFailed, run_reference
    work.mkdir(parents=True, exist_ok=True)
    sc = work / "scenario.json"
    sc.write_text(json.dumps(doc))
    try:
        run_reference(model, sc, work / "ref", max_data=0, timeout=3600)  # a hang guard, generous under load
    except ReferenceFailed as e:
        m = _STEP.search(str(e).splitlines()[0])
        return Verdict(False, int(m.group(1)) if m else None, str(e))
    return Verdict(True, None, "")


def agrees(a: Verdict, b: Verdict, same_step: bool = False) -> bool:
    """The same verdict; with same_step, a refusal must come at the same step on both sides."""
    if a.ok != b.ok:
        return False
    return a.ok or not same_step or a.step == b.step


# ---- GGUFs ------------------------------------------------------------------------------------

def gguf_doc(case: dict, model: Path, cache: Path) -> dict:
    """inject 3 + one block, as the fuzz's GGUF runner does; the block from the draft's own
    block size and mask token when graphgen reads them, else from its base draft's."""
    from graphgen.errors import GraphgenError
    from graphgen.runtime.model import load
    try:
        m = load(model)
    except GraphgenError:
        m = load(base_model(case["base"], cache))
    hp = m.hparams
    m.close()
    bs = max(1, min(hp.block_size or 4, 8))
    mask = hp.mask_token_id if 0 <= hp.mask_token_id < hp.n_vocab else hp.n_vocab - 1
    return {"n_ctx": 256, "n_ubatch": 16, "flash_attn": "on" if case.get("fa") else "off",
            "steps": [{"inject": {"n_tokens": 3, "pos0": 0}},
                      {"block": {"tokens": [min(1, hp.n_vocab - 1)] + [mask] * (bs - 1), "pos0": 3}}]}


def gguf_pair(case: dict, work: Path, cache: Path) -> tuple[Verdict, Verdict]:
    d = work / case["id"]
    model = make_gguf(case, d, cache)
    doc = gguf_doc(case, model, cache)
    return ours(model, doc), reference(model, doc, d)


# ---- batches ----------------------------------------------------------------------------------

MASK = 255


@st.composite
def batch_doc(draw):
    """A scenario over one draft whose positions are drawn around the cache's contents, which
    the strategy tracks (a scenario stops at its first failing step, so the track only needs to
    hold up to there)."""
    base = draw(st.sampled_from(AGREE_BASES))
    n_seq = draw(st.integers(1, 3))
    held: dict[int, set] = {s: set() for s in range(n_seq)}

    def pos_for(s: int, n: int) -> int:
        top = max(held[s]) if held[s] else -1
        how = draw(st.sampled_from(["next", "next", "next", "next", "gap", "overlap", "repeat", "zero"]))
        if how == "next" or top < 0 and how in ("overlap", "repeat"):
            return top + 1
        if how == "gap":
            return top + draw(st.integers(2, 5))
        if how == "overlap":
            return max(0, top - draw(st.integers(0, 2)))
        if how == "repeat":
            return max(0, top - n + 1)
        return 0

    steps = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["inject", "inject", "block", "block", "block", "seq_rm", "encode"]))
        if kind in ("inject", "encode"):
            s = draw(st.integers(0, n_seq - 1))
            n = draw(st.integers(1, 6))
            p0 = pos_for(s, n)
            steps.append({kind: {"n_tokens": n, "pos0": p0, "seq": s}})
            if kind == "inject":
                held[s] |= set(range(p0, p0 + n))
        elif kind == "block":
            entries, n_tok = [], 0
            seqs = draw(st.lists(st.integers(0, n_seq - 1), min_size=1, max_size=n_seq, unique=True))
            if draw(st.integers(0, 11)) == 0:
                seqs = seqs + [seqs[0]]  # a sequence twice (scenarios refuse it: both sides alike)
            for s in seqs:
                n = draw(st.sampled_from([4, 4, 4, 4, 3, 5, 2, 1, 6]))
                p0 = pos_for(s, n)
                entries.append({"seq": s, "tokens": [7] + [MASK] * (n - 1), "pos0": p0})
                held[s] |= set(range(p0, p0 + n))
                n_tok += n
            steps.append({"block": {"seqs": entries}})
        else:
            s = draw(st.integers(-1, n_seq - 1))
            top = max((max(h) for h in held.values() if h), default=0)
            p0 = draw(st.sampled_from([0, max(0, top - 3), top, top + 1]))
            p1 = draw(st.sampled_from([-1, -1, p0 + 1, p0 + 3]))
            steps.append({"seq_rm": {"seq": s, "p0": p0, "p1": p1}})
            for q in ([s] if s >= 0 else list(held)):
                held[q] = {p for p in held[q] if not (p >= p0 and (p1 < 0 or p < p1))}
    return {"base": base, "doc": {"n_ctx": 256, "n_ubatch": 16, "n_seq": n_seq,
                                  "flash_attn": draw(st.sampled_from(["off", "on"])), "steps": steps}}


def batch_cases(n: int, seed: int) -> list:
    cases = collect(batch_doc(), n, seed)
    for i, c in enumerate(cases):
        c["id"] = f"b{seed}-{i}"
    return cases


def batch_pair(case: dict, work: Path, cache: Path) -> tuple[Verdict, Verdict]:
    model = agree_model(case["base"], cache)
    return ours(model, case["doc"]), reference(model, case["doc"], work / case["id"])


# ---- key types --------------------------------------------------------------------------------

# every key llama.cpp reads, on a draft where it is read: (base draft, key)
def _key_type_pairs() -> list:
    from graphgen.models.loader import KEY_TYPES, OTHER_KEY_TYPES
    seed_only = {"hyper_connection.single_pass", "attention.kv_lora_rank", "attention.key_length_mla",
                 "attention.value_length_mla", "rope.scaling.yarn_log_multiplier", "sample_from_anchor"}
    dsv4 = {"attention.q_lora_rank", "expert_feed_forward_length", "expert_shared_count", "expert_weights_scale",
            "expert_weights_norm", "expert_gating_func", "swiglu_clamp_exp", "swiglu_clamp_shexp",
            "attention.output_group_count", "attention.output_lora_rank", "hyper_connection.sinkhorn_iterations",
            "hyper_connection.epsilon", "attention.compress_ratios"}
    dflash2 = {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"}
    pairs = []
    for key in KEY_TYPES:
        if key in seed_only:
            continue
        base = ("dspark-dsv4" if key in dsv4 else "dflash2" if key in dflash2 else
                "dflash-iswa" if key.startswith("attention.sliding_window") else "dflash")
        pairs.append((base, f"dflash.{key}"))
    for key in OTHER_KEY_TYPES:
        pairs.append(("lilicorr" if key.startswith("lilicorr.") else "dflash", key))
    return pairs


KEY_TYPE_VARIANTS = ["UINT8", "UINT16", "INT32", "UINT32", "UINT64", "FLOAT32", "FLOAT64", "BOOL", "STRING",
                     "ARRAY:INT32", "ARRAY:UINT32", "ARRAY:BOOL", "ARRAY:FLOAT32", "ARRAY:STRING"]


def _value_of(base: Path, key: str):
    import gguf
    f = gguf.GGUFReader(str(base)).fields.get(key)
    if f is None:
        return None
    t = int(f.types[0])
    if t == 9:
        sub = int(f.types[1])
        return [bytes(f.parts[i]).decode() if sub == 8 else f.parts[i][0].item() for i in f.data]
    return bytes(f.parts[f.data[0]]).decode() if t == 8 else f.parts[f.data[0]][0].item()


def _as_type(v, tname: str, n_arr: int) -> list:
    """[gguf type, value, array element type]: the key's own value (or 2) in another GGUF type."""
    first = v[0] if isinstance(v, list) and v else v
    num = 2 if first is None or isinstance(first, str) else first
    if tname.startswith("ARRAY:"):
        sub = tname[6:]
        src = v if isinstance(v, list) else [num] * n_arr
        conv = {"STRING": str, "BOOL": lambda x: bool(x) if not isinstance(x, str) else True,
                "FLOAT32": lambda x: float(x) if not isinstance(x, str) else 1.0}.get(
            sub, lambda x: max(0, int(x)) if not isinstance(x, str) else 1)
        return ["ARRAY", [conv(x) for x in src], sub]
    if tname == "STRING":
        return ["STRING", first if isinstance(first, str) else str(num).lower(), None]
    if tname == "BOOL":
        return ["BOOL", bool(num), None]
    if tname.startswith("FLOAT"):
        return [tname, float(num), None]
    n = int(num)
    return [tname, min(max(0, n), 255) if tname == "UINT8" else max(0, n) if tname[0] == "U" else n, None]


def key_type_cases(cache: Path, step: int = 1) -> list:
    """GGUF cases that give one key another GGUF type: every key llama.cpp reads (KEY_TYPES), on
    a draft where it is read, in every type of KEY_TYPE_VARIANTS; every `step`-th of them."""
    cases = []
    for base, key in _key_type_pairs():
        v = _value_of(base_model(base, cache), key)
        n_arr = 4 if key.endswith("dimension_sections") else 3 if base == "dflash-iswa" else 2
        for tname in KEY_TYPE_VARIANTS:
            cases.append({"family": "gguf", "kind": "struct", "base": base, "fa": False,
                          "edits": {"set_keys": {key: _as_type(v, tname, n_arr)}},
                          "id": f"kt{len(cases)}"})
    return cases[::step]
