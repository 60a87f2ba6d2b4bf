"""Random configurations of every authors' class, through graphgen check's triangle and arbiter.

Each draw picks what the authors' configs can express and b11739 honours: layers, heads and GQA,
head sizes over 8..64 (those where a double-worked scale is one float ulp off among them), hidden
and FFN sizes, vocabulary and mask token, rope base over its range and rope scaling (none, linear,
yarn with transformers' default betas written out or not, dynamic), norm eps over its range, block
size 2..16 (run at that size), causal attention, z-lab's embedding scale and DFlash2 output scale
and softcap, speculators DFlash2 sliding layers wider than the context, target layers, the DFlash2
conv and selector (codebook spread), the DSpark Markov rank, confidence head, anchor mode and draft
vocabulary. The case runs two drafting rounds (random lengths) with an f32 or f16 cache through
`run_check`: graphgen identical to b11739, and b11739 within its rounding of the float64 arbiter
on every mapped node, argmax and selector path. Settings b11739 cannot honour are refused by the
converter and tested in test_convert.py.

GRAPHGEN_AUTHORS_N sets the draws per class (default 3; the sweep in docs/authors.md used 20),
GRAPHGEN_AUTHORS_SEED the first seed.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import draws
from authors_util import require_extra

require_extra()

from graphgen.authors.checkpoint import HFSpec, make_hf  # noqa: E402
from graphgen.cli.authors import run_check, verdict  # noqa: E402

N = int(os.environ.get("GRAPHGEN_AUTHORS_N", "3"))
SEED0 = int(os.environ.get("GRAPHGEN_AUTHORS_SEED", "1000"))
CLASSES = (("zlab", "dflash"), ("zlab", "dflash2"), ("speculators", "dflash"), ("speculators", "dflash2"),
           ("speculators", "dspark"))


def draw(authors: str, variant: str, seed: int) -> tuple[HFSpec, dict]:
    rng = np.random.default_rng(seed)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    n_head = pick([1, 2, 3, 4, 8])
    n_head_kv = pick([d for d in (1, 2, 3, 4, 8) if n_head % d == 0])
    head_dim = 24 if seed % 5 == 0 else draws.head_size(rng, 8, 64)  # 24: one ulp off in double
    n_embd = int(rng.integers(4, 33)) * 8
    n_vocab = pick([96, 128, 200, 256])
    block = int(rng.integers(2, 17))
    n_targets = int(rng.integers(1, 4))
    targets = sorted(rng.choice(np.arange(1, 7), n_targets, replace=False).tolist())
    yarn = {"rope_type": "yarn", "factor": float(pick([2, 4, 8, 16])),
            "original_max_position_embeddings": pick([64, 1024, 4096])}
    if rng.random() < 0.5:
        yarn.update(beta_fast=32.0, beta_slow=1.0)  # transformers' defaults, written out
    spec = HFSpec(variant=variant, authors=authors, n_embd=n_embd, n_layer=int(rng.integers(1, 5)),
                  n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, n_ff=int(rng.integers(2, 33)) * 8,
                  n_vocab=n_vocab, block_size=block, target_layers=targets,
                  mask_token_id=int(rng.integers(n_vocab)), rope_theta=draws.log_uniform(rng, 1e3, 1e7),
                  rms_eps=draws.log_uniform(rng, 1e-8, 1e-4), seed=seed,
                  rope_scaling=pick([None, None, {"rope_type": "linear", "factor": float(pick([2, 4]))}, yarn,
                                     {"rope_type": "dynamic", "factor": 2.0}]))
    if authors == "zlab":
        if rng.random() < 0.3:
            spec.causal = True
        if rng.random() < 0.3:
            spec.input_embedding_scale = draws.scale(rng, 0.25, 4.0)
        if variant == "dflash2" and rng.random() < 0.4:
            spec.output_multiplier = draws.scale(rng, 0.25, 4.0)
        if variant == "dflash2" and rng.random() < 0.4:
            spec.final_logit_softcapping = draws.softcap(rng)
    if variant == "dflash2":
        spec.conv_group = pick([g for g in (4, 8, 16, 32) if n_embd % g == 0])
        spec.conv_kernel = int(rng.integers(1, min(block, 4) + 1))
        spec.selector_rank = pick([4, 8, 32])
        # b11739 packs a position's candidates and transitions in one hidden-size row
        spec.selector_top_k = pick([k for k in range(1, 7) if k + k * k <= n_embd])
        spec.codebook_std = pick([1.0, 2.0, 4.0])
        if authors == "speculators" and rng.random() < 0.3:
            # wider than any context here: speculators' non-causal sliding block then agrees
            spec.swa_window = 512
            spec.swa_pattern = [int(rng.integers(2)) for _ in range(spec.n_layer)]
            spec.swa_pattern[0] = 1
    if variant == "dspark":
        spec.markov_rank = pick([4, 16, 32])
        spec.conf = bool(rng.integers(2))
        spec.sample_from_anchor = bool(rng.integers(2))
        spec.d2t_vocab = int(rng.integers(n_vocab // 2, n_vocab))
    n1, n2 = int(rng.integers(1, 10)), int(rng.integers(1, block + 1))
    toks = lambda: [int(rng.integers(n_vocab))] + [spec.mask_token_id] * (block - 1)  # noqa: E731
    scenario = {"n_ctx": 128, "n_ubatch": 32, "flash_attn": "off", "type_kv": pick(["f32", "f32", "f16"]),
                "seed": seed,
                "steps": [{"inject": {"n_tokens": n1, "pos0": 0}},
                          {"block": {"tokens": toks(), "pos0": n1}},
                          {"seq_rm": {"seq": 0, "p0": n1, "p1": -1}},
                          {"inject": {"n_tokens": n2, "pos0": n1}},
                          {"block": {"tokens": toks(), "pos0": n1 + n2}}]}
    return spec, scenario


CASES = [(a, v, SEED0 + k) for a, v in CLASSES for k in range(N)]


@pytest.mark.parametrize("authors,variant,seed", CASES,
                         ids=[f"{a}-{v}-{s}" for a, v, s in CASES])
def test_random_configuration_agrees(tmp_path, authors, variant, seed):
    spec, scenario = draw(authors, variant, seed)
    hf = make_hf(tmp_path / "hf", spec)
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps(scenario))
    r = run_check(hf, sc)
    code, line = verdict(r)
    arb = r["arbiter"]
    context = f"{spec}\n{scenario}\n" + "\n".join(arb.lines()) + "\n" + line
    assert r["graphgen_identical"], context
    assert code == 0 and arb.agree, context
    assert arb.argmax and all(n.e_llama is not None for n in arb.nodes), context
