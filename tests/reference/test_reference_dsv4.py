"""DeepSeek-V4 DSpark drafts of random shape, compared live against llama.cpp b11739.

graphgen builds upstream's fused hyper-connection, SwiGLU-clamp and rope-offset ops and computes
on b11739's own ggml, so every graph must be node-identical and bit-exact, with no rule.
"""

import json

import numpy as np
import pytest

import draws

from graphgen.compare.pairing import diff_paths
from graphgen.dump.format import load_dump
from graphgen.synth import make_model
from kv_draw import draw_kv_types
from parity_check import assert_parity, run_ours

pytestmark = [pytest.mark.reference]

N_CONFIGS = 30


def random_dsv4_config(seed: int):
    rng = np.random.default_rng(7000 + seed)
    n_layer = int(rng.integers(1, 4))
    head_dim = int(rng.choice(draws.ULP_HEAD_SIZES)) if seed % 10 == 0 else draws.head_size(rng, 16, 128)
    o_groups = int(rng.choice([1, 2]))
    n_head = o_groups * int(rng.choice([1, 2, 4]))
    n_expert = int(rng.integers(2, 7))
    kw = {"n_embd": int(rng.choice([32, 64, 96])), "n_layer": n_layer, "n_head": n_head,
          "n_vocab": int(rng.choice([64, 256])), "block_size": int(rng.integers(2, 9)),
          "target_layers": list(range(1, int(rng.integers(1, 4)) + 1)), "seed": seed,
          "head_dim": head_dim, "n_rot": 2 * int(rng.integers(1, min(head_dim, 32) // 2 + 1)),
          "q_lora_rank": int(rng.choice([16, 32])), "o_groups": o_groups, "o_lora_rank": int(rng.choice([8, 16])),
          "n_expert": n_expert, "n_expert_used": int(rng.integers(1, n_expert + 1)),
          "n_ff_exp": int(rng.choice([16, 32])), "swa_window": int(rng.integers(3, 33)),
          "hc_sinkhorn_iters": int(rng.integers(1, 6)), "hc_eps": draws.log_uniform(rng, 1e-8, 1e-2),
          "swiglu_clamp": float(rng.choice([0.0, draws.log_uniform(rng, 0.1, 20.0)])),
          "rms_eps": draws.rms_eps(rng), "rope_freq_base": draws.rope_base(rng),
          "expert_weights_scale": float(rng.choice([1.0, draws.scale(rng, 0.1, 10.0)])),
          "expert_weights_norm": bool(rng.random() < 0.5), "conf": bool(rng.random() < 0.5)}
    n_prompt = int(rng.integers(1, 21))
    mask = kw["n_vocab"] - 1
    steps = [{"inject": {"n_tokens": n_prompt, "pos0": 0}},
             {"block": {"tokens": [int(rng.integers(0, mask))] + [mask] * (kw["block_size"] - 1), "pos0": n_prompt}}]
    if rng.random() < 0.5:  # a second round after the driver drops the block
        n2 = int(rng.integers(1, 5))
        steps += [{"seq_rm": {"seq": 0, "p0": n_prompt, "p1": -1}},
                  {"inject": {"n_tokens": n2, "pos0": n_prompt}},
                  {"block": {"tokens": [3] + [mask] * (kw["block_size"] - 1), "pos0": n_prompt + n2}}]
    fa = "on" if rng.random() < 0.5 else "off"
    sc = {"n_ctx": 256, "n_ubatch": 64, "flash_attn": fa, **draw_kv_types(rng, fa, head_dim, k_only=True),
          "seed": seed, "steps": steps}
    return kw, sc


def _compare(kw, sc, tmp_path):
    from graphgen.reference.runner import run_reference

    model = tmp_path / "draft.gguf"
    make_model(model, "dspark", "dsv4", **kw)
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(sc))
    run_reference(model, scen, tmp_path / "ref")  # b11739 runs every configuration drawn here
    run_ours(model, sc, tmp_path / "ours")
    results = diff_paths(tmp_path / "ref", tmp_path / "ours")
    assert len(results) == sum(1 for s in sc["steps"] if "seq_rm" not in s)
    assert_parity(results, f"dsv4 {kw} {sc}")
    return results


@pytest.mark.parametrize("flash_attn", ["off", "on"])
def test_three_layer_dsv4_matches_llama_cpp(flash_attn, tmp_path):
    sc = {"n_ctx": 256, "n_ubatch": 64, "flash_attn": flash_attn, "type_kv": "f16", "seed": 3,
          "steps": [{"inject": {"n_tokens": 6, "pos0": 0}}, {"block": {"tokens": [7, 255, 255, 255], "pos0": 6}}]}
    results = _compare({"n_layer": 3, "target_layers": [1, 2, 3]}, sc, tmp_path)
    with load_dump(results[1].ref_path) as ref:
        ops = [n.op for n in ref.nodes]
        # six hyper-connection stages, each a fused pre, comb and post
        assert sum(op.startswith("DSV4_HC_") for op in ops) == 18
        assert len(results[0].numeric) == len(load_dump(results[0].ref_path).nodes)
        assert len(results[1].numeric) == len(ref.nodes)


@pytest.mark.parametrize("seed", range(N_CONFIGS))
def test_random_dsv4_matches_llama_cpp(seed, tmp_path):
    kw, sc = random_dsv4_config(seed)
    _compare(kw, sc, tmp_path)
