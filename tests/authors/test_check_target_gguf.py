"""`graphgen check -m TARGET.gguf`: the authors' model, b11739 and graphgen beside the target's own GGUF.

- The rounding a borrowed head's matmul gives its input (ggml's dot-product type of the weight),
  on hand-made rows: no torch.
- On checkpoints with a target folder (z-lab and speculators), -m on that folder's f32 GGUF gives
  the folder form's verdict and every one of its distances, while only the draft is converted: no
  target GGUF is written.
- The shipped SmolLM2 drafts with the SmolLM2 target: z-lab's DFlash, whose borrowed head (the
  target's tied q8_0 embeddings) agrees within the 8-bit rounding of its input, and speculators'
  DSpark, whose verifier is named by a Hub id, its logits over the whole vocabulary compared.
- The authors' side reads the GGUF's tables as transformers' GGUF loader does.
- A draft made for another target is refused before it is converted; a pair problem only the
  converted draft shows, before anything runs; a target b11739 refuses, in one line with its reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from authors_util import require_extra
from graphgen.authors.arbiter import RATIO, Judged, floor_band, head_rounding

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "drafts"


@pytest.fixture(scope="module")
def extra():
    require_extra()


# ---- the head's rounding ----------------------------------------------------------------------

def test_an_f32_head_rounds_nothing():
    x = np.random.default_rng(0).standard_normal((3, 64))
    assert head_rounding(x, "f32") == 0.0 and head_rounding(x, None) == 0.0


def test_a_q8_0_head_rounds_blocks_of_32_to_8_bits():
    # the block's largest magnitude 127 makes the step 1: every k + 0.25 moves by 0.25
    row = np.array([127.0] + [k + 0.25 for k in range(31)])
    want = np.sqrt(31 * 0.25 ** 2) / np.linalg.norm(row)
    assert head_rounding(row[None], "q8_0") == pytest.approx(want, rel=1e-12)
    assert head_rounding(row[None], "Q4_1") == pytest.approx(want, rel=1e-12)


def test_a_k_quant_head_rounds_blocks_of_256():
    # in one block of 256 the step is 1 and the 255 entries of 0.25 round to 0; blocks of 32
    # would give the last seven their own step and round them exactly
    row = np.array([127.0] + [0.25] * 255)
    want = np.sqrt(255 * 0.25 ** 2) / np.linalg.norm(row)
    assert head_rounding(row[None], "q6_k") == pytest.approx(want, rel=1e-12)
    assert head_rounding(row[None], "q8_0") == pytest.approx(np.sqrt(31 * 0.25 ** 2) / np.linalg.norm(row),
                                                            rel=1e-12)


def test_f16_and_bf16_heads_round_to_their_type():
    # 1 + 2^-12 is half an f16 step above 1: to even, 1
    row = np.array([[1.0, 1.0 + 2.0 ** -12]])
    assert head_rounding(row, "f16") == pytest.approx(2.0 ** -12 / np.linalg.norm(row), rel=1e-12)
    # bf16 keeps 7 mantissa bits: 1 + 2^-9 rounds to 1; 1 + 3 x 2^-8 is halfway, to the even 1 + 2^-6
    row = np.array([[1.0 + 2.0 ** -9, 1.0 + 3 * 2.0 ** -8]])
    want = np.hypot(2.0 ** -9, 2.0 ** -8) / np.linalg.norm(row)
    assert head_rounding(row, "bf16") == pytest.approx(want, rel=1e-12)


def test_the_heads_rounding_widens_the_band():
    floor = floor_band("f32", 3)
    j = Judged("01-block.json", "result_output", 3, floor, 1e-7, 5e-3, 5e-3, 2e-3)
    assert j.band == RATIO * 2e-3 and not j.llama_departs
    j = Judged("01-block.json", "result_output", 3, floor, 1e-7, 5e-3, 5e-3)
    assert j.band == floor and j.llama_departs


# ---- live ---------------------------------------------------------------------------------------

CASES = {"zlab-dflash": dict(variant="dflash", authors="zlab"),
         "spec-dflash": dict(variant="dflash", authors="speculators")}


@pytest.fixture(scope="module")
def made(extra, tmp_path_factory):
    """Each case's checkpoint and its target folder's f32 GGUF, as a llama.cpp user holds it."""
    from graphgen.authors.checkpoint import HFSpec, make_hf
    from graphgen.authors.convert import convert
    work = tmp_path_factory.mktemp("check-m")
    out = {}
    for name, kw in CASES.items():
        hf = make_hf(work / name, HFSpec(**kw))
        res = convert(hf, work / f"{name}-draft.gguf", target_gguf=work / f"{name}-target.gguf", warn=None)
        out[name] = (hf, res.target_out)
    return out


@pytest.fixture
def converts(monkeypatch):
    """Every call of llama.cpp's converter, as (checkpoint, target_gguf): still run, only watched."""
    import graphgen.authors.convert as conv
    calls, real = [], conv.convert

    def watched(hf_dir, out, **kw):
        calls.append((Path(hf_dir), kw.get("target_gguf")))
        return real(hf_dir, out, **kw)
    monkeypatch.setattr(conv, "convert", watched)
    return calls


def _distances(r) -> dict:
    return {(n.graph, n.name): (n.e_authors, n.e_llama, n.e_graphgen) for n in r["arbiter"].nodes}


@pytest.mark.reference
@pytest.mark.parametrize("name", list(CASES))
def test_beside_the_targets_gguf_as_the_folder_form(made, name, converts, tmp_path, monkeypatch):
    import tempfile
    from graphgen.cli.authors import run_check, verdict
    hf, target = made[name]
    folder = run_check(hf)
    assert [c[1] is not None for c in converts] == [True]   # the folder form converts the target too
    converts.clear()
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    keep = tmp_path / "kept"
    beside = run_check(hf, target_gguf=str(target), keep=keep)
    # only the draft was converted, and no target GGUF is anywhere in what the run wrote
    assert converts == [(hf, None)]
    assert sorted(p.name for p in keep.rglob("*.gguf")) == ["draft.gguf"]
    assert not list(temp.rglob("*.gguf")) and not list(temp.iterdir())
    assert beside["target"] == str(target.resolve()) and not beside["target_converted"] and folder["target_converted"]
    assert json.loads((keep / "scenario.json").read_text())["target"] == str(target.resolve())
    # the same weights on every side: the same verdict, node for node the same distances
    assert verdict(beside) == verdict(folder) and verdict(beside)[0] == 0
    assert _distances(beside) == _distances(folder) and len(_distances(folder)) > 20
    assert beside["arbiter"].argmax == folder["arbiter"].argmax
    assert beside["arbiter"].head_type is None   # an f32 head rounds nothing


@pytest.mark.reference
def test_the_shipped_draft_beside_the_smollm2_target(extra, capsys):
    from graphgen.cli import main
    code = main(["--quiet", "check", str(SHIPPED / "smollm2-dflash"), "-m", "smollm2", "--json"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err[-2000:]   # a verdict, not an error
    doc = json.loads(out.out)
    assert code == 0 and doc["arbiter"]["agree"], doc["verdict"]
    assert not doc["target_converted"] and doc["target"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert doc["borrows"] == ["token_embd.weight", "output.weight"]
    arb = doc["arbiter"]
    assert arb["head_type"] == "q8_0"   # its tied head: token_embd.weight
    heads = [n for n in arb["nodes"] if n["name"] == "result_output"]
    rest = [n for n in arb["nodes"] if n["name"] != "result_output"]
    assert len(heads) == 2 and len(rest) > 20
    for n in heads:
        # beyond what float32 rounding explains, within what rounding the head's input to 8 bits does
        assert n["floor"] < 1e-4 < n["head_rounding"] and n["floor"] < n["llama.cpp"] <= RATIO * n["head_rounding"]
        assert n["band"] == RATIO * n["head_rounding"]
    assert all(n["head_rounding"] is None and n["llama.cpp"] <= n["floor"] for n in rest)


@pytest.mark.reference
def test_the_shipped_dspark_beside_the_smollm2_target(extra, capsys):
    """speculators' checkpoint names its verifier by a Hub id: the GGUF's tables stand in for it.
    Its own head over a draft vocabulary: it borrows the embeddings alone, and its logits over the
    target's 49152 tokens (no graph output: kept by size) are compared too."""
    from graphgen.cli import main
    code = main(["--quiet", "check", str(SHIPPED / "smollm2-dspark"), "-m", "smollm2", "--json"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err[-2000:]   # a verdict, not an error
    doc = json.loads(out.out)
    assert code == 0 and doc["arbiter"]["agree"], doc["verdict"]
    assert doc["borrows"] == ["token_embd.weight"] and doc["arbiter"]["head_type"] is None
    nodes = doc["arbiter"]["nodes"]
    assert {"result_output", "[drafted logits]", "[confidences]"} <= {n["name"] for n in nodes}
    assert all(n["llama.cpp"] is not None and n["llama.cpp"] <= n["band"] for n in nodes)


@pytest.mark.usefixtures("extra")
def test_the_tables_are_what_transformers_reads():
    import torch
    from graphgen.accept.features import transformers_model
    from graphgen.authors.gguf_target import read_tables
    from graphgen.speculative.targets import resolve
    target = resolve("smollm2")
    tables = read_tables(target)
    model = transformers_model(target, torch.float32)
    assert np.array_equal(tables["embed"], model.get_input_embeddings().weight.detach().numpy())
    assert np.array_equal(tables["head"], model.get_output_embeddings().weight.detach().numpy())
    assert np.array_equal(tables["norm"], model.model.norm.weight.detach().numpy())


@pytest.mark.parametrize("name, key", [("zlab-dflash", "hidden_size"),
                                       ("spec-dflash", "transformer_layer_config.hidden_size")])
def test_a_draft_for_another_target_is_refused_before_it_is_converted(made, converts, name, key):
    from graphgen.authors import AuthorsError
    from graphgen.cli.authors import run_check
    hf, _ = made[name]
    with pytest.raises(AuthorsError) as e:
        run_check(hf, target_gguf="smollm2")
    assert str(e.value) == (f"{hf / 'config.json'}: key '{key}' = 64, the target SmolLM2-135M-Instruct.Q4_1.gguf is "
                            "576 wide ('llama.embedding_length'): the draft is not made for this target")
    assert converts == []


@pytest.mark.reference
def test_a_pair_problem_of_the_converted_draft_is_said_before_anything_runs(extra, tmp_path, converts,
                                                                            monkeypatch):
    import graphgen.authors.forward as fwd
    import graphgen.reference.runner as runner
    from graphgen.authors.checkpoint import HFSpec, make_hf
    from graphgen.cli.authors import run_check
    from graphgen.errors import PairError
    ran = []
    monkeypatch.setattr(runner, "run_reference", lambda *a, **k: ran.append("llama.cpp"))
    monkeypatch.setattr(fwd, "AuthorsDraft", lambda *a, **k: ran.append("authors"))
    # as wide as SmolLM2, with its own small vocabulary: only the converted draft shows it
    hf = make_hf(tmp_path / "ck", HFSpec(variant="dflash", n_embd=576, n_head=9, n_head_kv=3, head_dim=64))
    with pytest.raises(PairError) as e:
        run_check(hf, target_gguf="smollm2")
    assert converts == [(hf, None)] and ran == []
    assert any(p.startswith("target SmolLM2-135M-Instruct.Q4_1.gguf + draft draft.gguf: vocabulary sizes differ "
                            "(key 'tokenizer.ggml.tokens'): target 49152 tokens, draft 256")
               for p in e.value.problems), e.value.problems


def as_gpt2(src: Path, dst: Path, **ints) -> Path:
    """The target GGUF under an architecture whose b11739 graph publishes no layer inputs (gpt2),
    its `gpt2.*` keys the `qwen3.*` ones, those named in `ints` (block_count=4) set to another value."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "gpt2")
    for key, f in r.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            vtype = gguf.GGUFValueType(int(f.types[0]))
            sub = gguf.GGUFValueType(int(f.types[1])) if vtype == gguf.GGUFValueType.ARRAY else None
            key = key.replace("qwen3.", "gpt2.", 1)
            w.add_key_value(key, ints.get(key[5:], f.contents()), vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_target_without_layer_inputs_still_lends_its_tables(made, tmp_path):
    """check hands the draft its features: a target architecture whose b11739 graph publishes no
    layer inputs (speculative decoding's problem) is no problem here; every other problem still is."""
    from graphgen.cli.authors import _pair_problems
    from graphgen.speculative.pair import check_pair
    hf, target = made["zlab-dflash"]
    draft = hf.parent / "zlab-dflash-draft.gguf"
    assert check_pair(target, draft) == []
    lending = as_gpt2(target, tmp_path / "gpt2.gguf")
    said = check_pair(lending, draft)
    assert len(said) == 1 and "publishes no layer inputs" in said[0] and _pair_problems(lending, draft) == []
    shallow = as_gpt2(target, tmp_path / "gpt2-4.gguf", block_count=4)   # the draft reads layer 5
    said = check_pair(shallow, draft)
    assert len(said) == 2 and _pair_problems(shallow, draft) == said[1:] and "target layer 5" in said[1]


def without(src: Path, dst: Path, name: str) -> Path:
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            vtype = gguf.GGUFValueType(int(f.types[0]))
            sub = gguf.GGUFValueType(int(f.types[1])) if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        if t.name != name:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.reference
def test_a_target_b11739_refuses_is_one_line_naming_the_tensor(made, tmp_path, capsys):
    from graphgen.cli import main
    hf, target = made["zlab-dflash"]
    broken = without(target, tmp_path / "target.gguf", "blk.0.attn_norm.weight")
    code = main(["--quiet", "check", str(hf), "-m", str(broken)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"graphgen: error: llama.cpp b11739 could not load the target {broken}: "
                                 "check_tensor_dims: tensor 'blk.0.attn_norm.weight' not found"], err
