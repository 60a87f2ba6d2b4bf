"""-fa auto decided as llama.cpp decides it: `draft` (and check-batch) resolve it with
llamaflags.resolve_fa before they open a session; b11739, given auto, decides itself. The
decision is read from b11739's own graph (a FLASH_ATTN_EXT node, or none)."""

import json

import pytest

from graphgen.cli.llamaflags import resolve_fa
from graphgen.play.engine import run_scenario
from graphgen.reference.runner import run_reference
from graphgen.play.scenario import parse_scenario
from graphgen.synth import make_model


def _fa_in(folder) -> bool:
    nodes = json.loads(next(folder.glob("*-block.json")).read_text())["nodes"]
    return any(n["op"] == "FLASH_ATTN_EXT" for n in nodes)


@pytest.mark.reference
@pytest.mark.parametrize("type_k, type_v", [("f16", "f16"), ("f32", "f16")])
def test_fa_auto_as_b11739_decides_on_the_cpu(tmp_path, type_k, type_v):
    gguf = tmp_path / "d.gguf"
    make_model(gguf, "dflash", "base")
    doc = {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "auto", "type_k": type_k, "type_v": type_v, "seed": 1,
           "steps": [{"inject": {"n_tokens": 6, "pos0": 0}}, {"block": {"tokens": [7, 255, 255, 255], "pos0": 6}}]}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    run_reference(gguf, tmp_path / "s.json", tmp_path / "ref", stderr_log=None)
    decided = _fa_in(tmp_path / "ref")
    assert resolve_fa("auto") is decided
    # graphgen's session opened as draft opens it, with the resolved value: the same graph kind
    ours = dict(doc, flash_attn="on" if resolve_fa("auto") else "off")
    run_scenario(gguf, parse_scenario(ours), tmp_path / "ours")
    assert _fa_in(tmp_path / "ours") is decided
    assert resolve_fa("on") is True and resolve_fa("off") is False and resolve_fa(None) is None
