"""RoPE keys against llama.cpp b11739, live: the global rope_freqs tensor, rope scaling (linear,
none, YaRN with its factor and original context, the attention factor) and M-RoPE sections on a
partial rotary dimension.

Marked `reference`: every case runs the real llama.cpp b11739 in a child process and graphgen on
the same ggml, and must be structurally identical and bit-exact (NMSE 0 on every node). Each case
also checks, on the reference's own dump, that the key it draws reached the ROPE nodes (a source,
or op_params other than the unscaled defaults), so a graphgen that ignored the key could not pass.
"""

import json
import struct

import numpy as np
import pytest

from graphgen.compare.pairing import diff_paths
from graphgen.errors import GGUFModelError
from graphgen.synth import make_model
from parity_check import assert_parity, run_ours

pytestmark = [pytest.mark.reference]

MASK = 255  # the tiny draft's mask token (vocab 256)
STEPS = [{"inject": {"n_tokens": 7, "pos0": 0}},
         {"block": {"tokens": [7] + [MASK] * 3, "pos0": 7}},
         {"seq_rm": {"seq": 0, "p0": 7, "p1": -1}},
         {"inject": {"n_tokens": 3, "pos0": 7}},
         {"block": {"tokens": [3] + [MASK] * 3, "pos0": 10}}]


def _f32(word: int) -> float:
    return struct.unpack("<f", struct.pack("<i", word))[0]


def rope_nodes(ref_dir):
    """(name, sources, params) of every ROPE node in the reference's dumps; params decoded from
    op_params as ggml_rope_impl stores them."""
    out = []
    for path in sorted(ref_dir.glob("[0-9][0-9]-*.json")):
        for n in json.loads(path.read_text())["nodes"]:
            if n["op"] != "ROPE":
                continue
            p = n["op_params"]
            params = {"n_dims": p[1], "mode": p[2], "n_ctx_orig": p[4], "freq_base": _f32(p[5]),
                      "freq_scale": _f32(p[6]), "ext_factor": _f32(p[7]), "attn_factor": _f32(p[8]),
                      "beta_fast": _f32(p[9]), "beta_slow": _f32(p[10]), "sections": p[11:15]}
            out.append((n["name"], n["src"], params))
    assert out, f"no ROPE node in {ref_dir}"
    return out


def run_both(tmp_path, kw, sc, variant="dflash"):
    """Make the draft, run the scenario in b11739 and in graphgen, assert strict parity; return the
    reference's ROPE nodes."""
    from graphgen.reference.runner import run_reference

    model = tmp_path / "draft.gguf"
    make_model(model, variant, **kw)
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(sc))
    run_reference(model, scen, tmp_path / "ref")  # these drafts are valid: a failure is a failure
    run_ours(model, sc, tmp_path / "ours")
    results = diff_paths(tmp_path / "ref", tmp_path / "ours")
    assert len(results) == sum(1 for s in sc["steps"] if "seq_rm" not in s)
    assert_parity(results, f"config {kw} {sc}")
    return rope_nodes(tmp_path / "ref")


def scenario(fa="off", type_kv="f16", steps=STEPS, n_ctx=256):
    return {"n_ctx": n_ctx, "n_ubatch": 64, "flash_attn": fa, "type_kv": type_kv, "seed": 3, "steps": steps}


# --- rope_freqs.weight: one tensor for every layer

@pytest.mark.parametrize("fa", ["off", "on"])
def test_rope_freqs(tmp_path, fa):
    nodes = run_both(tmp_path, {"rope_freqs": True, "n_layer": 3}, scenario(fa))
    assert all("rope_freqs.weight" in src for _, src, _ in nodes), nodes[0]


# --- rope scaling

@pytest.mark.parametrize("fa", ["off", "on"])
def test_yarn_factor_and_original_context(tmp_path, fa):
    kw = {"rope_scaling": "yarn", "rope_scaling_factor": 4.0, "rope_orig_ctx": 1024}
    for _, _, p in run_both(tmp_path, kw, scenario(fa)):
        assert (p["ext_factor"], p["freq_scale"], p["n_ctx_orig"]) == (1.0, 0.25, 1024), p


def test_yarn_factor_below_one(tmp_path):
    """factor < 1: mscale is 1, the attention factor is 1 / (1 + 0.1 ln factor) > 1."""
    kw = {"rope_scaling": "yarn", "rope_scaling_factor": 0.5}
    for _, _, p in run_both(tmp_path, kw, scenario(type_kv="f32")):
        assert p["ext_factor"] == 1.0 and p["freq_scale"] == 2.0 and p["attn_factor"] > 1.05, p


def test_attn_factor_alone(tmp_path):
    for _, _, p in run_both(tmp_path, {"rope_attn_factor": 1.3}, scenario()):
        assert p["attn_factor"] == np.float32(1.3) and p["ext_factor"] == 0.0, p


@pytest.mark.parametrize("fa", ["off", "on"])
def test_attn_factor_with_yarn(tmp_path, fa):
    kw = {"rope_scaling": "yarn", "rope_scaling_factor": 2.5, "rope_orig_ctx": 640, "rope_attn_factor": 0.8}
    for _, _, p in run_both(tmp_path, kw, scenario(fa)):
        # the YaRN magnitude terms cancel to about 1, leaving the key's factor
        assert p["ext_factor"] == 1.0 and p["n_ctx_orig"] == 640 and abs(p["attn_factor"] - 0.8) < 1e-6, p


@pytest.mark.parametrize("orig_ctx", [None, 1024])
def test_linear_scaling(tmp_path, orig_ctx):
    kw = {"rope_scaling": "linear", "rope_scaling_factor": 4.0, "rope_orig_ctx": orig_ctx}
    for _, _, p in run_both(tmp_path, kw, scenario()):
        assert p["freq_scale"] == 0.25 and p["ext_factor"] == 0.0, p
        assert p["n_ctx_orig"] == (orig_ctx or 4096), p


def test_scaling_type_none_ignores_the_factor(tmp_path):
    for _, _, p in run_both(tmp_path, {"rope_scaling": "none", "rope_scaling_factor": 4.0}, scenario()):
        assert p["freq_scale"] == 1.0, p


def test_longrope_with_rope_freqs(tmp_path):
    kw = {"rope_scaling": "longrope", "rope_scaling_factor": 3.0, "rope_attn_factor": 1.1, "rope_freqs": True}
    for _, src, p in run_both(tmp_path, kw, scenario("on")):
        assert "rope_freqs.weight" in src and p["ext_factor"] == 0.0, p
        assert p["freq_scale"] == np.float32(1 / np.float32(3.0)) and p["attn_factor"] == np.float32(1.1), p


# --- M-RoPE sections on a partial rotary dimension

@pytest.mark.parametrize("sections", [[3, 2, 1, 0], [3, 2, 1, 2], [6, 4, 4, 2]])
@pytest.mark.parametrize("fa", ["off", "on"])
def test_mrope_sections_past_half_the_rotary_dims(tmp_path, sections, fa):
    """head 16, n_rot 8: sections summing past n_rot/2 = 4 (up to the head dimension) run in b11739."""
    nodes = run_both(tmp_path, {"n_rot": 8, "mrope_sections": sections}, scenario(fa))
    for _, _, p in nodes:
        assert p["n_dims"] == 8 and p["mode"] == 8 and p["sections"] == sections, p


def test_mrope_partial_rotary_with_yarn(tmp_path):
    kw = {"n_rot": 8, "mrope_sections": [2, 3, 1, 1], "rope_scaling": "yarn", "rope_scaling_factor": 4.0,
          "rope_orig_ctx": 512, "rope_attn_factor": 1.2}
    for _, _, p in run_both(tmp_path, kw, scenario(type_kv="f32")):
        assert p["mode"] == 8 and p["ext_factor"] == 1.0 and p["n_ctx_orig"] == 512, p


# --- what b11739 cannot run, graphgen refuses, naming the key

@pytest.mark.parametrize("key,value,reason", [
    ("dflash.rope.dimension_sections", [6, 4, 4, 3], "more than the head dimension"),   # ggml asserts
    ("dflash.rope.dimension_sections", [0, 0, 0, 3], "none of the first"),              # ggml asserts
    ("dflash.rope.dimension_sections", [3, -3, 0, 0], "sums to 0"),                     # SIGFPE
    ("dflash.rope.dimension_sections", [2, 1, 1], "wrong array length"),                # loader throws
    ("dflash.rope.scaling.type", "foo", "not a rope scaling type"),                     # loader asserts
])
def test_refused_where_llama_cpp_fails(tmp_path, key, value, reason):
    import gguf
    from gguf_edit import rewrite
    from graphgen.reference.runner import ReferenceFailed, run_reference
    from graphgen.runtime.model import load

    make_model(tmp_path / "base.gguf", "dflash", n_rot=8)
    vtype = gguf.GGUFValueType.ARRAY if isinstance(value, list) else gguf.GGUFValueType.STRING
    model = rewrite(tmp_path / "base.gguf", tmp_path / "draft.gguf", set_keys={key: (vtype, value)})
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(scenario(steps=STEPS[:2])))
    with pytest.raises(ReferenceFailed):
        run_reference(model, scen, tmp_path / "ref")
    with pytest.raises(GGUFModelError, match=reason) as e:
        load(model)
    assert key in str(e.value)


def test_scalar_sections_accepted(tmp_path):
    """A single i32 for rope.dimension_sections stands for all four sections (get_key_or_arr)."""
    import gguf
    from gguf_edit import rewrite
    from graphgen.reference.runner import run_reference

    make_model(tmp_path / "base.gguf", "dflash", n_rot=8)
    model = rewrite(tmp_path / "base.gguf", tmp_path / "draft.gguf",
                    set_keys={"dflash.rope.dimension_sections": (gguf.GGUFValueType.INT32, 3)})
    sc = scenario("on")
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(sc))
    run_reference(model, scen, tmp_path / "ref")
    run_ours(model, sc, tmp_path / "ours")
    assert_parity(diff_paths(tmp_path / "ref", tmp_path / "ours"), "scalar sections")
    assert all(p["sections"] == [3, 3, 3, 3] for _, _, p in rope_nodes(tmp_path / "ref"))


# --- random configurations drawing the keys together

N_CONFIGS = 12


def random_rope_config(seed: int):
    rng = np.random.default_rng(7000 + seed)
    n_head_kv = int(rng.choice([1, 2, 4]))
    n_head = n_head_kv * int(rng.choice([1, 2]))
    head_dim = int(rng.choice([16, 32]))
    n_layer = int(rng.integers(1, 4))
    block = int(rng.integers(2, 9))
    n_vocab = int(rng.choice([64, 256]))
    kw = {"n_embd": n_head * head_dim, "n_layer": n_layer, "n_head": n_head, "n_head_kv": n_head_kv,
          "n_ff": int(rng.choice([64, 128])), "n_vocab": n_vocab, "block_size": block,
          "target_layers": list(range(int(rng.integers(1, 3)))), "seed": seed,
          "context_length": int(rng.choice([2048, 4096, 8192]))}
    n_rot = int(rng.choice([head_dim, head_dim // 2, head_dim // 4]))
    if n_rot != head_dim:
        kw["n_rot"] = n_rot
    # every configuration sets a scaling key; the kinds take turns, YaRN in a third of them
    scaling = ("yarn", "linear", "attn", "yarn", "none", "longrope")[seed % 6]
    if scaling == "attn":
        kw["rope_attn_factor"] = float(np.round(rng.uniform(0.6, 1.6), 3))
    else:
        kw["rope_scaling"] = scaling
        kw["rope_scaling_factor"] = float(rng.choice([0.5, 2.0, 3.0, 4.0, 8.0, 16.0]))
        if rng.random() < 0.7:
            kw["rope_orig_ctx"] = int(rng.choice([256, 1000, 2048, 4096]))
        if rng.random() < 0.5:
            kw["rope_attn_factor"] = float(np.round(rng.uniform(0.6, 1.6), 3))
    if rng.random() < 0.6:
        kw["rope_freqs"] = True
    if rng.random() < 0.4:  # M-RoPE, the sections free to reach past n_rot/2 (up to the head)
        total = int(rng.integers(1, head_dim + 1))
        cuts = sorted(int(c) for c in rng.integers(0, total + 1, 3))
        sections = [cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1], total - cuts[2]]
        if sum(sections[:3]) == 0:
            sections = [total, 0, 0, 0]
        kw["mrope_sections"] = sections
    if rng.random() < 0.2:
        pattern = [bool(x) for x in rng.integers(0, 2, n_layer)]
        pattern[int(rng.integers(0, n_layer))] = True
        kw["swa_window"] = int(rng.integers(2, 12))
        kw["swa_pattern"] = pattern
    mask = n_vocab - 1
    n_prompt = int(rng.choice(range(1, 21, 2)))
    steps = [{"inject": {"n_tokens": n_prompt, "pos0": 0}},
             {"block": {"tokens": [int(rng.integers(0, mask))] + [mask] * (block - 1), "pos0": n_prompt}}]
    if rng.random() < 0.6:  # a second round, as the driver runs it: drop the block, inject, draft again
        n2 = int(rng.integers(1, 6))
        steps += [{"seq_rm": {"seq": 0, "p0": n_prompt, "p1": -1}},
                  {"inject": {"n_tokens": n2, "pos0": n_prompt}},
                  {"block": {"tokens": [3] + [mask] * (block - 1), "pos0": n_prompt + n2}}]
    # flash attention and the cache type take turns: each pairing three times
    sc = scenario(("off", "on")[seed % 2], ("f16", "f32")[seed // 2 % 2], steps,
                  n_ctx=int(rng.choice([256, 512])))
    sc["seed"] = seed
    return kw, sc


def test_random_configs_draw_every_key():
    kws = [random_rope_config(s)[0] for s in range(N_CONFIGS)]
    for key in ("rope_freqs", "rope_orig_ctx", "rope_attn_factor", "mrope_sections"):
        assert any(key in kw for kw in kws), key
    assert {kw.get("rope_scaling") for kw in kws} >= {"yarn", "linear"}
    assert any("mrope_sections" in kw and sum(kw["mrope_sections"]) * 2 > kw.get("n_rot", 10 ** 6) for kw in kws)


@pytest.mark.parametrize("seed", range(N_CONFIGS))
def test_random_rope_config_matches_llama_cpp(seed, tmp_path):
    kw, sc = random_rope_config(seed)
    run_both(tmp_path, kw, sc)


@pytest.mark.parametrize("variant,backbone", [("dflash", "base"), ("dspark", "dsv4")])
def test_rope_base_missing_from_the_gguf(tmp_path, variant, backbone):
    """Without `dflash.rope.freq_base` llama.cpp rotates with its default base, 10000: a draft made
    with another base and the key then dropped must run as b11739 runs it, at base 10000."""
    from gguf_edit import rewrite
    from graphgen.reference.runner import run_reference
    made = tmp_path / "made.gguf"
    make_model(made, variant, backbone, rope_freq_base=500000.0)
    model = tmp_path / "draft.gguf"
    rewrite(made, model, drop_keys=("dflash.rope.freq_base",))
    sc = scenario()
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(sc))
    run_reference(model, scen, tmp_path / "ref")
    run_ours(model, sc, tmp_path / "ours")
    results = diff_paths(tmp_path / "ref", tmp_path / "ours")
    assert len(results) == 4
    assert_parity(results, variant)
    bases = {p["freq_base"] for _, _, p in rope_nodes(tmp_path / "ours")}
    assert bases == {10000.0}
