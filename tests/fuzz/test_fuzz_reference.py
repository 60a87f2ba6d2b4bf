"""Fuzzed GGUFs graphgen accepts, run through llama.cpp b11739 too: where both run them the
graphs must be structurally identical; where llama.cpp rejects or crashes, that is recorded
(upstream crashing where graphgen raises is expected)."""

import json
import os

import pytest

from fuzz_gen import make_cases
from fuzz_inputs import make_gguf
from fuzz_runner import run_cases

N_SAMPLE = int(os.environ.get("GRAPHGEN_FUZZ_REF_SAMPLE", "6"))


@pytest.mark.reference
def test_accepted_fuzzed_ggufs_match_llama_cpp(tmp_path):
    from graphgen.diff import diff_paths
    from graphgen.engine import run_scenario
    from graphgen.reference.runner import ReferenceFailed, run_reference
    from graphgen.runtime.model import load
    from graphgen.scenario import load_scenario

    # backbones other than base need rules (DSV4) or are not in b11739 (ML4)
    cases = [c for c in make_cases("gguf", 300, 11, tmp_path / "bases") if "-" not in c["base"]
             or c["base"] == "dflash-iswa"]
    report = run_cases("gguf", cases, tmp_path / "run")
    accepted = [cases[k] for k, o in sorted(report.results.items()) if o == "accepted"][:N_SAMPLE]
    assert accepted, report.summary()
    log = []
    for case in accepted:
        d = tmp_path / case["id"]
        model = make_gguf(case, d, tmp_path / "bases")
        hp = load(model).hparams
        bs = max(1, min(hp.block_size or 4, 8))
        mask = hp.mask_token_id if 0 <= hp.mask_token_id < hp.n_vocab else hp.n_vocab - 1
        sc = d / "scenario.json"
        sc.write_text(json.dumps({"n_ctx": 256, "n_ubatch": 16, "flash_attn": "on" if case.get("fa") else "off",
                                  "steps": [{"inject": {"n_tokens": 3, "pos0": 0}},
                                            {"block": {"tokens": [1] + [mask] * (bs - 1), "pos0": 3}}]}))
        try:
            run_reference(model, sc, d / "ref", timeout=120)
        except ReferenceFailed as e:
            log.append(f"{case['id']}: llama.cpp rejects ({str(e)[:400]})")
            continue
        run_scenario(model, load_scenario(sc), out=d / "ours")
        for r in diff_paths(d / "ref", d / "ours"):
            assert not r.structural, f"{case['id']}: {json.dumps(case)}\n{r.format_text()}"
        log.append(f"{case['id']}: identical structure")
    print("\n".join(log))
