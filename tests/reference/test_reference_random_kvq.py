"""Random configurations with quantized KV caches, compared live against llama.cpp b11739.

The draft generators of the other random suites (DFlash, the three heads, DeepSeek-V4), with heads
of 64 or 128 so llama.cpp's Hadamard rotations apply, and quantized K (and V, with flash
attention) types drawn for every configuration: node-identical and bit-exact, with no rule.
"""

import json

import numpy as np
import pytest

from graphgen.cachetypes import KV_QUANTIZED
from kv_draw import draw_kv_types
from parity_check import assert_parity, run_both_engines
from .test_reference_dsv4 import random_dsv4_config
from .test_reference_random import random_config
from .test_reference_random_heads import random_head_config

pytestmark = [pytest.mark.reference]

N_CONFIGS = 30
KINDS = ("dflash", "dflash2", "dspark", "lilicorr", "dsv4")


def quantized_config(seed: int):
    kind = KINDS[seed % len(KINDS)]
    if kind == "dflash":
        kw, sc = random_config(500 + seed)
        variant, backbone = "dflash", "base"
    elif kind == "dsv4":
        kw, sc = random_dsv4_config(500 + seed)
        variant, backbone = "dspark", "dsv4"
    else:
        kw, sc = random_head_config(kind, 500 + seed)
        variant, backbone = kind, "base"
    rng = np.random.default_rng(9000 + seed)
    # the rotations need a power of two; the head still holds the drawn rotary dims (other
    # quantized head sizes are drawn by the suites above)
    need = max(kw.get("n_rot", 0), sum(kw.get("mrope_sections", [0])))
    kw["head_dim"] = int(rng.choice([d for d in (64, 128, 256) if d >= need][:2]))
    if kind == "dsv4":
        sc["flash_attn"] = "on"  # V is read from the quantized K cache
    for key in ("type_kv", "type_k", "type_v"):
        sc.pop(key, None)
    sc.update(draw_kv_types(rng, sc["flash_attn"], kw["head_dim"], k_only=kind == "dsv4", quantized_only=True))
    return variant, backbone, kw, sc


def test_every_configuration_is_quantized():
    for seed in range(N_CONFIGS):
        _, _, kw, sc = quantized_config(seed)
        assert sc["type_k"] in KV_QUANTIZED, sc
        if sc["flash_attn"] == "off":
            assert sc["type_v"] in ("f16", "f32"), sc


@pytest.mark.parametrize("seed", range(N_CONFIGS))
def test_quantized_cache_matches_llama_cpp(seed, tmp_path):
    variant, backbone, kw, sc = quantized_config(seed)
    results = run_both_engines(tmp_path, variant, backbone, kw, sc)
    assert len(results) == sum(1 for s in sc["steps"] if "seq_rm" not in s)
    assert_parity(results, f"{variant}/{backbone} {kw} {sc}")
    # every graph that writes the quantized K cache rotates it (a matmul by attn_inp_k_rot with
    # the Hadamard hint), as b11739 does
    for path in sorted((tmp_path / "ours").glob("[0-9][0-9]-*.json")):
        nodes = json.loads(path.read_text())["nodes"]
        if any(n["op"] == "SET_ROWS" and n["type"] == sc["type_k"] for n in nodes):
            assert any(n["op"] == "MUL_MAT" and n["src"][0] == "attn_inp_k_rot" and n["op_params"][1] == 1
                       for n in nodes), path.name
