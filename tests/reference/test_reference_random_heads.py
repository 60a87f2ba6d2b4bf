"""20 random configurations per head, 1-3 blocks in one batch, compared live against llama.cpp."""

import json

import numpy as np
import pytest

import draws

from graphgen.compare.pairing import diff_paths
from graphgen.dump.format import load_dump
from graphgen.play.engine import run_scenario
from graphgen.play.scenario import parse_scenario
from graphgen.synth import make_model
from kv_draw import draw_kv_types
from parity_check import assert_parity, run_ours

pytestmark = [pytest.mark.reference]

N_PER_HEAD = 30


def random_head_config(variant: str, seed: int):
    rng = np.random.default_rng(5000 + 97 * seed + len(variant))
    n_head = int(rng.choice([2, 4]))
    n_embd = n_head * (int(rng.choice(draws.ULP_HEAD_SIZES)) if seed % 10 == 0 else draws.head_size(rng, 8, 128, 8))
    kw = {"n_embd": n_embd, "n_layer": int(rng.integers(1, 3)), "n_head": n_head,
          "n_head_kv": int(rng.choice([1, n_head])), "n_ff": int(rng.choice([64, 128])),
          "n_vocab": int(rng.choice([128, 256])), "block_size": int(rng.integers(2, 7)),
          "target_layers": list(range(int(rng.integers(1, 3)))), "seed": seed,
          "rms_eps": draws.rms_eps(rng), "rope_freq_base": draws.rope_base(rng)}
    full_block = True
    if variant == "dflash2":
        top_k = int(rng.integers(1, 4))
        kw.update(selector_top_k=top_k, selector_rank=int(rng.choice([4, 8, 16])),
                  conv_kernel_size=int(rng.integers(1, 4)),
                  conv_group_size=int(rng.choice([g for g in (8, 16, 32) if n_embd % g == 0])))
        full_block = rng.random() < 0.7
    elif variant == "dspark":
        kw.update(markov_rank=int(rng.choice([4, 8, 16])), conf=bool(rng.random() < 0.5))
        if rng.random() < 0.3:
            kw["d2t_vocab"] = kw["n_vocab"] - 40
        if rng.random() < 0.3:
            kw["sample_from_anchor"] = False
        full_block = rng.random() < 0.7
    elif variant == "lilicorr":
        heads = int(rng.choice([1, 2, 4]))
        hidden = int(rng.choice([n_embd, 32, 64]))
        kw.update(lilicorr_top_k=int(rng.integers(1, 4)), lilicorr_heads=heads,
                  lilicorr_hidden=hidden - hidden % heads,
                  lilicorr_layers=int(rng.integers(1, kw["n_layer"] + 1)),
                  lilicorr_factor=int(rng.choice([8, 16])), lilicorr_mlp=int(rng.choice([32, 64])))
        if rng.random() < 0.4:
            kw.update(lilicorr_conv=True, conv_kernel_size=int(rng.integers(1, 3)), conv_group_size=16)
    # output transforms: the DFlash2 selector reads the scaled, soft-capped logits; the other
    # heads must leave them alone, as b11739 does
    if rng.random() < 0.4:
        kw["logit_scale"] = draws.scale(rng, 0.05, 10.0)
    if rng.random() < 0.4:
        kw["final_softcap"] = draws.softcap(rng)
    n_blocks = int(rng.integers(1, 4))
    mask = kw["n_vocab"] - 1
    bs = kw["block_size"] if full_block else int(rng.integers(2, kw["block_size"] + 1))
    steps, seqs = [], []
    for s in range(n_blocks):
        n = int(rng.integers(1, 12))
        steps.append({"inject": {"n_tokens": n, "pos0": 0, "seq": s}})
        seqs.append({"seq": s, "tokens": [int(rng.integers(0, mask))] + [mask] * (bs - 1), "pos0": n})
    steps.append({"block": {"seqs": seqs}})
    fa = "on" if rng.random() < 0.5 else "off"
    sc = {"n_ctx": 256, "n_ubatch": 64, "n_seq": n_blocks, "flash_attn": fa,
          **draw_kv_types(rng, fa, kw.get("head_dim", n_embd // n_head)), "seed": seed, "steps": steps}
    return kw, sc


@pytest.mark.parametrize("variant", ["dflash2", "dspark", "lilicorr"])
@pytest.mark.parametrize("seed", range(N_PER_HEAD))
def test_random_head_matches_llama_cpp(variant, seed, tmp_path):
    from graphgen.reference.runner import run_reference

    kw, sc = random_head_config(variant, seed)
    model = tmp_path / "draft.gguf"
    make_model(model, variant, **kw)  # the generator draws only drafts b11739 loads
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(sc))
    run_reference(model, scen, tmp_path / "ref")  # a failure here is a failed test, not a skip
    run_ours(model, sc, tmp_path / "ours")
    results = diff_paths(tmp_path / "ref", tmp_path / "ours")
    assert len(results) == len(sc["steps"])
    assert_parity(results, f"{variant} {kw} {sc}")


def test_lilicorr_context_row_is_the_injected_feature(tmp_path):
    """A one-token prompt with shared K/V: the block's embd_state must be the injection's context
    feature (an output of the inject graph, so its memory is not reused before it is read)."""
    from graphgen.reference.runner import run_reference
    kw = {"n_embd": 32, "n_layer": 2, "n_head": 1, "n_head_kv": 1, "n_ff": 64, "n_vocab": 128,
          "block_size": 4, "target_layers": [0], "seed": 3, "shared_kv": True}
    model = tmp_path / "draft.gguf"
    make_model(model, "lilicorr", **kw)
    sc = {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "off", "type_kv": "f32", "seed": 3,
          "steps": [{"inject": {"n_tokens": 1, "pos0": 0}}, {"block": {"tokens": [5, 127, 127, 127], "pos0": 1}}]}
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(sc))
    run_reference(model, scen, tmp_path / "ref")
    results = run_scenario(model, parse_scenario(sc), tmp_path / "ours")
    assert_parity(diff_paths(tmp_path / "ref", tmp_path / "ours"), "lilicorr one-token prompt")
    # the row the block was fed is the inject's context feature, bit for bit
    inject = results[0][1]
    with load_dump(results[1][2]) as d:
        state = next(d.values(i) for i, n in enumerate(d.nodes) if n.op == "RESHAPE" and n.src[:1]
                     and n.src[0].startswith("leaf") and n.ne[:2] == [32, 4])
    assert np.array_equal(state.reshape(4, 32)[0], inject.h_nextn[0])


@pytest.mark.parametrize("conf", [False, True])
def test_dspark_block_longer_than_trained_matches_llama_cpp(conf, tmp_path):
    """A block longer than dflash.block_size: the Markov head steps aside and the backbone's own
    logits are the output, computed as llama.cpp computes them (the rest of the last layer, the
    output norm, the lm head)."""
    from graphgen.reference.runner import run_reference
    kw = {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_head_kv": 1, "n_ff": 64, "n_vocab": 96,
          "block_size": 3, "target_layers": [0, 1], "seed": 5, "conf": conf}
    model = tmp_path / "draft.gguf"
    make_model(model, "dspark", **kw)
    sc = {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "off", "seed": 5,
          "steps": [{"inject": {"n_tokens": 5, "pos0": 0}}, {"block": {"tokens": [4] + [95] * 5, "pos0": 5}}]}
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(sc))
    run_reference(model, scen, tmp_path / "ref")
    results = run_scenario(model, parse_scenario(sc), tmp_path / "ours")
    assert_parity(diff_paths(tmp_path / "ref", tmp_path / "ours"), f"dspark block of 6, trained 3, conf {conf}")
    assert results[1][1].logits.shape == (6, 96)
