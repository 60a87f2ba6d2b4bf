"""Random configurations, made with make-model, compared live against llama.cpp b11739.

Marked `reference`: it runs the real llama.cpp b11739 in a child process. Each configuration runs in
both engines and must be structurally identical and bit-exact (graphgen computes on the reference's ggml).
"""


import numpy as np
import pytest

import draws

from kv_draw import draw_kv_types
from parity_check import assert_parity, run_both_engines

pytestmark = [pytest.mark.reference]

N_CONFIGS = 30


def random_config(seed: int):
    rng = np.random.default_rng(1000 + seed)
    n_head_kv = int(rng.choice([1, 2, 4]))
    n_head = n_head_kv * int(rng.choice([1, 2, 4]))
    # every tenth configuration takes a head size where a double-worked scale is one ulp off
    head_dim = int(rng.choice(draws.ULP_HEAD_SIZES)) if seed % 10 == 0 else draws.head_size(rng)
    n_layer = int(rng.integers(1, 4))
    kw = {"n_embd": n_head * head_dim if rng.random() < 0.7 else int(rng.choice([64, 96, 128])),
          "n_layer": n_layer, "n_head": n_head, "n_head_kv": n_head_kv,
          "n_ff": int(rng.choice([64, 128, 192])), "n_vocab": int(rng.choice([64, 256, 300])),
          "block_size": int(rng.integers(2, 9)), "target_layers": list(range(int(rng.integers(1, 4)))),
          "seed": seed, "rms_eps": draws.rms_eps(rng), "rope_freq_base": draws.rope_base(rng)}
    if kw["n_embd"] != n_head * head_dim:
        kw["head_dim"] = head_dim
    n_rot = head_dim if rng.random() < 0.7 else 2 * int(rng.integers(1, head_dim // 2 + 1))
    if n_rot != head_dim:
        kw["n_rot"] = n_rot
    r = rng.random()
    if r < 0.25 and n_layer >= 1:
        pattern = [bool(x) for x in rng.integers(0, 2, n_layer)]
        pattern[int(rng.integers(0, n_layer))] = True
        kw["swa_window"] = int(rng.integers(2, 12))
        kw["swa_pattern"] = pattern
    elif r < 0.4:
        a = int(rng.integers(1, n_rot // 4 + 1))
        b = int(rng.integers(0, (n_rot // 2 - a) + 1))
        c = int(rng.integers(0, (n_rot // 2 - a - b) + 1))
        kw["mrope_sections"] = [a, b, c, 0]
    if rng.random() < 0.3:
        kw["shared_kv"] = True
    if rng.random() < 0.3:
        kw["sinks"] = True
    if rng.random() < 0.3:
        kw["attention_scale"] = draws.scale(rng, 0.01, 1.0)
    if rng.random() < 0.3:
        kw["embedding_scale"] = draws.scale(rng, 0.1, 50.0)
    if rng.random() < 0.2:
        kw["weight_scales"] = True
    if rng.random() < 0.2:
        kw["causal"] = True
    # the remaining options b11739 reads for a DFlash decoder, each drawn on its own
    if rng.random() < 0.3:
        kw["value_scale"] = draws.scale(rng, 0.1, 10.0)
    if rng.random() < 0.3:
        kw["logit_scale"] = draws.scale(rng, 0.05, 10.0)
    if rng.random() < 0.3:
        kw["final_softcap"] = draws.softcap(rng)
    if rng.random() < 0.3:
        kw["post_norms"] = True
    if rng.random() < 0.3:
        kw["out_scale"] = True
    if rng.random() < 0.3:
        kw["hidden_act"] = "gelu"
    n_prompt = int(rng.integers(1, 21))
    mask = kw["n_vocab"] - 1
    steps = [{"inject": {"n_tokens": n_prompt, "pos0": 0}},
             {"block": {"tokens": [int(rng.integers(0, mask))] + [mask] * (kw["block_size"] - 1), "pos0": n_prompt}}]
    if rng.random() < 0.5:  # a second round, as the driver runs it: drop the block, inject, draft again
        n2 = int(rng.integers(1, 5))
        steps += [{"seq_rm": {"seq": 0, "p0": n_prompt, "p1": -1}},
                  {"inject": {"n_tokens": n2, "pos0": n_prompt}},
                  {"block": {"tokens": [3] + [mask] * (kw["block_size"] - 1), "pos0": n_prompt + n2}}]
    n_ctx = int(rng.choice([256, 512]))
    fa = "on" if rng.random() < 0.5 else "off"
    sc = {"n_ctx": n_ctx, "n_ubatch": 64, "flash_attn": fa, **draw_kv_types(rng, fa, head_dim), "seed": seed,
          "steps": steps}
    return kw, sc


@pytest.mark.parametrize("seed", range(N_CONFIGS))
def test_random_config_matches_llama_cpp(seed, tmp_path):
    kw, sc = random_config(seed)
    results = run_both_engines(tmp_path, "dflash", "base", kw, sc)
    assert len(results) == sum(1 for s in sc["steps"] if "seq_rm" not in s)
    assert_parity(results, f"config {kw} {sc}")
