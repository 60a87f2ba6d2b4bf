"""Random configurations of every authors' class, against llama.cpp b11739 and graphgen.

Each draw picks what the authors' configs can express and b11739 reads: layers, heads and GQA,
head size, hidden and FFN sizes, vocabulary and mask token, rope base and scaling (none, linear,
yarn, dynamic), norm eps, block size,
target layers, the DFlash2 conv and selector, the DSpark Markov rank, confidence head, anchor
mode and draft vocabulary. The case runs two drafting rounds with an f32 cache and must agree
within the f32 band on every mapped node, with argmax and selector path equal.

GRAPHGEN_AUTHORS_N sets the draws per class (default 3; the sweep in the README used 20),
GRAPHGEN_AUTHORS_SEED the first seed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from authors_util import require_extra, run_three

require_extra()

from graphgen.authors.checkpoint import HFSpec, make_hf  # noqa: E402
from graphgen.authors.compare import compare_paths  # noqa: E402
from graphgen.authors.convert import convert  # noqa: E402
from graphgen.diff import diff_paths, exit_code  # noqa: E402

N = int(os.environ.get("GRAPHGEN_AUTHORS_N", "3"))
SEED0 = int(os.environ.get("GRAPHGEN_AUTHORS_SEED", "1000"))
CLASSES = (("zlab", "dflash"), ("zlab", "dflash2"), ("speculators", "dflash"), ("speculators", "dflash2"),
           ("speculators", "dspark"))


def draw(authors: str, variant: str, seed: int) -> tuple[HFSpec, dict]:
    rng = np.random.default_rng(seed)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    n_head = pick([1, 2, 4, 8])
    n_head_kv = pick([d for d in (1, 2, 4, 8) if n_head % d == 0])
    n_embd = pick([32, 48, 64, 96, 128])
    n_vocab = pick([96, 128, 200, 256])
    block = int(rng.integers(2, 13))
    n_targets = int(rng.integers(1, 4))
    targets = sorted(rng.choice(np.arange(1, 7), n_targets, replace=False).tolist())
    spec = HFSpec(variant=variant, authors=authors, n_embd=n_embd, n_layer=int(rng.integers(1, 4)),
                  n_head=n_head, n_head_kv=n_head_kv, head_dim=pick([8, 16, 32]), n_ff=pick([32, 64, 160, 256]),
                  n_vocab=n_vocab, block_size=block, target_layers=targets,
                  mask_token_id=int(rng.integers(n_vocab)), rope_theta=pick([1e4, 1e5, 1e6]),
                  rms_eps=pick([1e-6, 1e-5]), seed=seed,
                  rope_scaling=pick([None, None, {"rope_type": "linear", "factor": float(pick([2, 4]))},
                                     {"rope_type": "yarn", "factor": float(pick([2, 4, 8])),
                                      "original_max_position_embeddings": pick([64, 1024])},
                                     {"rope_type": "dynamic", "factor": 2.0}]))
    if variant == "dflash2":
        spec.conv_group = pick([g for g in (4, 8, 16) if n_embd % g == 0])
        spec.conv_kernel = int(rng.integers(1, min(block, 4) + 1))
        spec.selector_rank = pick([4, 8, 32])
        # b11739 packs a position's candidates and transitions in one hidden-size row
        spec.selector_top_k = pick([k for k in range(1, 7) if k + k * k <= n_embd])
    if variant == "dspark":
        spec.markov_rank = pick([4, 16, 32])
        spec.conf = bool(rng.integers(2))
        spec.sample_from_anchor = bool(rng.integers(2))
        spec.d2t_vocab = int(rng.integers(n_vocab // 2, n_vocab))
    n1, n2 = int(rng.integers(1, 10)), int(rng.integers(1, block + 1))
    toks = lambda: [int(rng.integers(n_vocab))] + [spec.mask_token_id] * (block - 1)  # noqa: E731
    scenario = {"n_ctx": 128, "n_ubatch": 32, "flash_attn": "off", "type_kv": "f32", "seed": seed,
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
    gguf = tmp_path / "draft.gguf"
    convert(hf, gguf, warn=None)
    dirs = run_three(hf, gguf, scenario, tmp_path, "case")
    for other in ("llama.cpp", "graphgen"):
        res = compare_paths(dirs["torch"], dirs[other])
        assert res.agree, f"{spec}\n{scenario}\n{res.format_text()}"
        assert all(n.status == "ok" for n in res.nodes)
        assert sum(t for _, _, t in res.argmax) > 0
    assert exit_code(diff_paths(dirs["llama.cpp"], dirs["graphgen"])) == 0
