"""The shipped SmolLM2 draft behind the Q4_1 target and behind f16 and f32 copies of its weights
(graphgen.accept.quantized, tools/quantized_target.py).

- The copies are the file itself and its dequantized f16 and f32 copies; the layers measured are
  the ones the draft GGUF reads.
- Each copy's loops generate the target's own greedy text (features.greedy, outside the loop,
  says what it is), b11739's and graphgen's drafting agree round for round, and tau, the
  acceptance per position, the text comparison and the same-text rounds follow from the rounds.
- The feature NMSE is what b11739 gives for the same tokens, recomputed here from
  features.llama_features; Q4_1 against f32 is of the order of one 8-bit rounding of the
  features (what Q4_1's matmuls do to their inputs), f16 against f32 of one f16 rounding, and
  far smaller.
- A copy with one layer's weights zeroed is caught: identical to f32 before that layer, flagged
  after it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import gguf
from graphgen.speculative import targets
from graphgen.accept import features as F
from graphgen.accept import quantized as Q
from graphgen.accept.compare import DEFAULT_PROMPTS, EngineRun
from graphgen.errors import GGUFModelError

pytestmark = pytest.mark.reference

ROOT = Path(__file__).resolve().parents[2]
DRAFT = ROOT / "drafts" / "smollm2-dflash" / "draft.gguf"
# the first continues alike behind every copy; behind Q4_1 the second parts from the float text at its
# 16th generated token
PROMPTS = [DEFAULT_PROMPTS[0], DEFAULT_PROMPTS[5]]
N = 20
ENGINES = ("llama.cpp", "graphgen")


@pytest.fixture(scope="module")
def q4():
    return targets.resolve("smollm2")


@pytest.fixture(scope="module")
def copies(q4):
    return Q.target_copies(q4)


@pytest.fixture(scope="module")
def result(copies):
    return Q.measure(DRAFT, copies, PROMPTS, n_predict=N, engines=ENGINES)


@pytest.fixture(scope="module")
def greedy(copies):
    """Each copy's greedy continuation of each prompt, from b11739 without any draft."""
    return {label: [F.greedy(path, p, N) for p in PROMPTS] for label, path in copies.items()}


def _draft_key_layers() -> list[int]:
    r = gguf.GGUFReader(str(DRAFT))
    return [int(v) for v in r.fields["dflash.target_layers"].contents()]


def _rounded_q8(x):
    """x rounded as ggml's Q8 activations are: blocks of 32 along a row, scale max|x| / 127."""
    b = x.reshape(-1, 32)
    d = np.abs(b).max(axis=1, keepdims=True) / 127
    d[d == 0] = 1
    return (np.round(b / d) * d).reshape(x.shape)


def _zeroed_layer(src: Path, dst: Path, layer: int) -> Path:
    """A copy of `src` whose layer `layer` has every matrix zeroed: the layer adds nothing to the
    residual, every later layer input changes, every earlier one stays."""
    shutil.copy(src, dst)
    r = gguf.GGUFReader(str(dst), "r+")
    hit = [t.name for t in r.tensors if t.name.startswith(f"blk.{layer}.") and len(t.shape) == 2]
    for t in r.tensors:
        if t.name in hit:
            t.data[...] = 0
    r.data.flush()
    assert hit, f"{src}: no matrices in layer {layer}"
    return dst


def test_the_copies_are_the_file_and_its_dequantized_weights(q4, copies):
    assert list(copies) == ["q4_1", "f16", "f32"]
    assert copies["q4_1"] == q4 and Q.file_type(q4) == "q4_1"
    assert Q.file_type(copies["f16"]) == "f16" and Q.file_type(copies["f32"]) == "f32"
    assert copies["f32"] == F.dequantized(q4, "f32")
    # the draft's own key, read with gguf-py: the card's layer inputs [2, 15, 28]
    assert Q.draft_layers(DRAFT) == _draft_key_layers() == [2, 15, 28]


def test_each_copy_generates_its_greedy_text_and_the_engines_agree(result, greedy):
    assert list(result.copies) == ["q4_1", "f16", "f32"] and result.layers == [2, 15, 28]
    assert result.problems() == []
    ref_text = [g[1] for g in greedy["f32"]]
    for label, c in result.copies.items():
        a, b = c.runs["llama.cpp"], c.runs["graphgen"]
        assert c.divergence is None and a.rounds == b.rounds and a.tokens == b.tokens
        # speculative decoding at temperature 0 never changes what the target generates
        assert a.tokens == [g[1] for g in greedy[label]], label
        assert c.same_text == [t == r for t, r in zip(a.tokens, ref_text)]
        blocks = [r for rs in a.rounds for r in rs]
        assert blocks and all(r["n_drafted"] == len(r["draft"]) for r in blocks)
        drafted = [r for r in blocks if r["n_drafted"] > 0]  # a round with no room to draft is no draft
        assert c.tau == pytest.approx(1 + sum(r["n_accepted"] for r in drafted) / len(drafted))
        rates = [sum(r["n_accepted"] > i for r in blocks if r["n_drafted"] > i)
                 / max(1, sum(r["n_drafted"] > i for r in blocks)) for i in range(a.n_max)]
        assert a.acceptance_per_position == pytest.approx(rates)
        # on the prompts whose text is f32's, the rounds starting at the same position, paired
        ref = result.copies["f32"].runs["llama.cpp"]
        pairs = [(x, y) for p, alike in enumerate(c.same_text) if alike
                 for x in a.rounds[p] for y in ref.rounds[p] if x["pos0"] == y["pos0"]]
        assert c.same_text_rounds == {"prompts": sum(c.same_text), "rounds": len(pairs),
                                      "drafts_apart": sum(x["draft"] != y["draft"] for x, y in pairs),
                                      "accepted": sum(x["n_accepted"] for x, _ in pairs),
                                      "accepted_ref": sum(y["n_accepted"] for _, y in pairs)}
    assert result.copies["f32"].same_text == [True] * len(PROMPTS)
    f32 = result.copies["f32"].same_text_rounds
    assert f32["drafts_apart"] == 0 and f32["rounds"] == len(result.copies["f32"].first.blocks)
    # the same text, other features: the Q4_1 target's move some of the draft's tokens
    assert result.copies["q4_1"].same_text_rounds["drafts_apart"] > 0
    # the Q4_1 target's greedy text parts from the float one's on one of these prompts: the
    # copies are measured on different texts, and the features below on the same one
    assert result.copies["q4_1"].same_text != [True] * len(PROMPTS)


def test_the_feature_nmse_is_b11739s_on_the_f32_texts_tokens(copies, result, greedy):
    # the tokens: each prompt, then the f32 target's greedy continuation
    seqs = [prompt + out for prompt, out in greedy["f32"]]
    layers = _draft_key_layers()
    feats = {label: [F.llama_features(copies[label], layers, s) for s in seqs] for label in ("q4_1", "f32")}
    for label in ("q4_1", "f32"):
        x = np.concatenate([f[1:] for f in feats[label]]).astype(np.float64)
        ref = np.concatenate([f[1:] for f in feats["f32"]]).astype(np.float64)
        mine = ((x - ref) ** 2).sum(axis=(0, 2)) / (ref ** 2).sum(axis=(0, 2))
        np.testing.assert_allclose(result.copies[label].nmse, mine, rtol=1e-9, atol=0)
        x, ref = np.concatenate(feats[label]).astype(np.float64), np.concatenate(feats["f32"]).astype(np.float64)
        mine = ((x - ref) ** 2).sum(axis=(0, 2)) / (ref ** 2).sum(axis=(0, 2))
        np.testing.assert_allclose(result.copies[label].nmse_all, mine, rtol=1e-9, atol=0)
    assert result.copies["f32"].nmse == [0.0, 0.0, 0.0]


def test_q4_1_is_one_8_bit_rounding_away_and_f16_far_less(copies, result, greedy):
    seqs = [prompt + out for prompt, out in greedy["f32"]]
    f32 = np.concatenate([F.llama_features(copies["f32"], result.layers, s)[1:] for s in seqs]).astype(np.float64)
    q4, f16 = result.copies["q4_1"].nmse, result.copies["f16"].nmse
    for k, il in enumerate(result.layers):
        x = f32[:, k]
        # what rounding the features once does: ggml's Q4_1 dot product rounds every matmul's input
        # to 8-bit blocks (Q8_1), its f16 one to f16. The layers before il accumulate such errors and
        # the residual stream damps them, so the features' NMSE is of that order: measured 0.8x, 3.3x
        # and 4.6x one 8-bit rounding at layers 2, 15, 28, and 5x to 25x one f16 rounding
        r8 = F.nmse(_rounded_q8(x), x)
        r16 = F.nmse(x.astype(np.float16).astype(np.float64), x)
        assert r8 / 10 < q4[k] < 30 * r8, (il, q4[k], r8)
        assert r16 < f16[k] < 100 * r16, (il, f16[k], r16)
        assert f16[k] < q4[k] / 100, (il, f16[k], q4[k])
        assert q4[k] < Q.MAX_NMSE


def test_a_copy_with_a_layer_zeroed_is_caught(copies, tmp_path):
    broken = _zeroed_layer(copies["f32"], tmp_path / "broken.gguf", layer=8)
    res = Q.measure(DRAFT, {"f32": copies["f32"], "broken": broken}, PROMPTS[:1], n_predict=8)
    nm = dict(zip(res.layers, res.copies["broken"].nmse))
    # layer 2's input is computed before layer 8: the same weights, the same numbers
    assert nm[2] == 0.0
    assert nm[15] > Q.MAX_NMSE and nm[28] > Q.MAX_NMSE, nm
    problems = res.problems()
    assert len(problems) == 1 and problems[0].startswith("broken") and "at layer 15" in problems[0], problems
    assert res.copies["broken"].tau >= 1.0 and len(res.copies["broken"].runs["llama.cpp"].tokens[0]) == 8


def test_feature_nmse_leaves_each_sequences_first_row_out_of_the_first_figure():
    rng = np.random.default_rng(0)
    ref = [rng.normal(size=(n, 2, 8)).astype(np.float32) for n in (3, 5)]
    feats = [r.copy() for r in ref]
    feats[0][0] += 100  # a first row far off: only the every-position figure sees it
    feats[1][2, 1] *= 2  # a later row of layer 1, seen by both
    rest, every = Q.feature_nmse(feats, ref)
    assert rest[0] == 0.0 and every[0] > 1
    later = np.concatenate([r[1:, 1] for r in ref]).astype(np.float64)
    assert rest[1] == pytest.approx((ref[1][2, 1].astype(np.float64) ** 2).sum() / (later ** 2).sum())
    with pytest.raises(Q.QuantizedError, match="2 sequences against 1"):
        Q.feature_nmse(feats, ref[:1])


def test_the_tool_prints_a_row_per_copy(capsys, q4):
    import quantized_target
    rc = quantized_target.main(["smollm2-dflash", "--types", "q4_1,f32", "-n", "8", "-p", PROMPTS[0]])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rows = [line for line in out.splitlines() if line.startswith("| smollm2-dflash |")]
    head = next(line for line in out.splitlines() if line.startswith("| draft |"))
    assert "| NMSE L2 | NMSE L15 | NMSE L28 |" in head and "| p1 |" in head
    assert [r.split("|")[2].strip() for r in rows] == ["q4_1", "f32 (ref)"]
    assert "acceptance behind q4_1" in err and "acceptance behind f32" in err
    assert quantized_target.main(["smollm2-dflash", "--types", "q4_1,q8_0"]) == 2
    assert "type 'q8_0'" in capsys.readouterr().err


def test_bad_input_is_named(q4, copies):
    with pytest.raises(Q.QuantizedError, match="type 'q8_0': .* is q4_1"):
        Q.target_copies(q4, ["q8_0"])
    with pytest.raises(Q.QuantizedError, match="'f16' is named twice"):
        Q.target_copies(q4, ["f16", "f16"])
    with pytest.raises(Q.QuantizedError, match="reference 'f32': not among the copies"):
        Q.measure(DRAFT, {"q4_1": q4}, PROMPTS, n_predict=4)
    with pytest.raises(FileNotFoundError, match="no such draft"):
        Q.measure(ROOT / "drafts" / "none.gguf", copies, PROMPTS)
    with pytest.raises(GGUFModelError, match="not a DFlash family draft"):
        Q.draft_layers(q4)


def test_the_engines_parting_is_a_problem(q4):
    rounds = [[{"n_drafted": 2, "n_accepted": 1, "draft": [5, 6]}]]
    a = EngineRun("llama.cpp", 2, ["x"], rounds, [[5, 6]])
    b = EngineRun("graphgen", 2, ["x"], [[dict(rounds[0][0], draft=[5, 7])]], [[5, 6]])
    assert Q.divergence({"llama.cpp": a, "graphgen": b}) == "prompt 0, round 0, draft position 2: " \
        "llama.cpp drafted token 6, graphgen token 7"
    assert Q.divergence({"llama.cpp": a, "graphgen": a}) is None and Q.divergence({"llama.cpp": a}) is None
    runs = {"llama.cpp": a, "graphgen": b}
    c = Q.CopyRun("f32", q4, runs, [0.0], [0.0], [True], Q.divergence(runs))
    assert Q.QuantizedResult(DRAFT, [2], ["x"], 2, "f32", {"f32": c}).problems() == [
        "f32: llama.cpp and graphgen drafting differ, first at prompt 0, round 0, draft position 2: "
        "llama.cpp drafted token 6, graphgen token 7"]
