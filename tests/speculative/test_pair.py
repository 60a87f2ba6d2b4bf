"""A draft and its real target: `make-model --target`, `info -m TARGET -md DRAFT` and graphgen.speculative.pair's
refusals, each naming both files and the key or tensor at fault.

The target is SmolLM2-135M-Instruct (llama, 30 layers, n_embd 576, 49152 tokens). Bad pairs are
drafts made for it and then edited, drafts made for a fake target that differs in one thing, and
fake targets written with gguf-py."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from graphgen.cli import main
from graphgen.ggufile import field_value, open_reader
from graphgen.speculative.pair import check_pair, target_info
from graphgen.synth import make_model
from graphgen.speculative.targets import resolve

A = gguf.GGUFValueType


@pytest.fixture(scope="session")
def target():
    return resolve("smollm2")


@pytest.fixture(scope="session")
def vocab(target):
    r = open_reader(target)
    return field_value(r, "tokenizer.ggml.tokens"), field_value(r, "tokenizer.ggml.token_type")


@pytest.fixture(scope="session")
def good(target, tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("good") / "good.gguf", target=target, n_layer=1)["path"]


def edit(src, dst, keys):
    """Copy a GGUF with some keys replaced ({name: (type, value)}): graphgen's reader, which reads a
    49152-token vocabulary ten times faster than gguf-py's, and gguf-py's writer."""
    r = open_reader(src)
    w = gguf.GGUFWriter(str(dst), field_value(r, "general.architecture"))
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in keys:
            continue
        vtype = A(int(f.types[0]))
        w.add_key_value(name, field_value(r, name), vtype, sub_type=A(int(f.types[1])) if vtype == A.ARRAY else None)
    for name, (vtype, value) in keys.items():
        w.add_key_value(name, value, vtype, sub_type=A.INT32 if vtype == A.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def fake_target(path, arch, n_embd, n_layer, tokens, types, embd=False, **ids):
    """A target GGUF holding what a draft is checked against: width, depth, tokenizer and (with
    `embd`) a zero token_embd.weight in Q4_0, the smallest a 49152 x 576 table gets."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.embedding_length", n_embd)
    w.add_uint32(f"{arch}.block_count", n_layer)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    for key, value in dict(bos_token_id=1, eos_token_id=2, **ids).items():
        w.add_uint32(f"tokenizer.ggml.{key}", value)
    if embd:
        w.add_tensor("token_embd.weight", np.zeros((len(tokens), n_embd // 32 * 18), np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def draft_for(tmp_path, vocab, name="other", n_embd=576, n_layer=30, tokens=None):
    """A draft made for a fake target differing from SmolLM2 in width, depth or vocabulary."""
    toks, types = vocab
    tokens = toks if tokens is None else tokens
    t = fake_target(tmp_path / f"{name}-target.gguf", "llama", n_embd, n_layer, tokens, types[:len(tokens)])
    return make_model(tmp_path / f"{name}.gguf", target=t, n_layer=1)["path"]


def one_problem(target, draft, *words):
    """The pair's only problem, checked to name both files and each of `words`."""
    problems = check_pair(target, draft)
    assert len(problems) == 1, problems
    p = problems[0]
    assert Path(target).name in p and Path(draft).name in p, p
    for w in words:
        assert w in p, p
    return p


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# --- graphgen.speculative.pair: a good pair and each refusal

def test_a_draft_made_for_the_target_fits(target, good, vocab):
    assert check_pair(target, good) == []
    r = open_reader(good)
    names = {t.name for t in r.tensors}
    assert "token_embd.weight" not in names and "output.weight" not in names
    assert field_value(r, "tokenizer.ggml.tokens") == vocab[0]
    # the authors' default spread over 30 layers (1, 14, 27), as layer-input indices
    assert field_value(r, "dflash.target_layers") == [2, 15, 28]
    assert [int(x) for x in next(t for t in r.tensors if t.name == "fc.weight").shape] == [3 * 576, 576]


def test_a_target_that_is_no_gguf(target, good, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    one_problem(text, good, "not a GGUF file")
    head = tmp_path / "head.gguf"
    head.write_bytes(target.read_bytes()[:5000])
    one_problem(head, good, "the target", "more than a 5000-byte file can hold")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(target.read_bytes()[:2_000_000])
    one_problem(cut, good, "tensor 'token_embd.weight'", "truncated")
    one_problem(tmp_path / "missing.gguf", good, "no such target model file")


def test_a_draft_given_as_the_target(target, good, tmp_path):
    one_problem(good, good, "is a DFlash draft", "general.architecture = 'dflash'", "not a target model")
    # the two the wrong way round: said so, with the flags that take each
    one_problem(good, target, "swapped", "general.architecture", "-m", "-md")
    one_problem(target, target, "the draft", "general.architecture is 'llama'", "not a DFlash family draft")
    one_problem(target, tmp_path / "missing.gguf", "no such draft model file")


def test_a_target_without_layer_inputs(good, vocab, tmp_path):
    g3 = fake_target(tmp_path / "gemma3.gguf", "gemma3", 576, 30, *vocab, embd=True)
    assert not target_info(g3).publishes_layer_inputs
    one_problem(g3, good, "general.architecture = 'gemma3'", "publishes no layer inputs", "layer input tensor is null")


def test_a_target_layer_past_the_last_layer_input(target, good, tmp_path):
    bad = edit(good, tmp_path / "l30.gguf", {"dflash.target_layers": (A.ARRAY, [2, 15, 30])})
    p = one_problem(target, bad, "key 'dflash.target_layers'", "target layer 30", "layers 0..29",
                    "layer-input index 30 is the final output", "does not publish", "shifted by one")
    assert "authors' target_layer_ids + 1" in p
    # 29, the last layer's input, is in range
    ok = edit(good, tmp_path / "l29.gguf", {"dflash.target_layers": (A.ARRAY, [2, 15, 29])})
    assert check_pair(target, ok) == []
    neg = edit(good, tmp_path / "lneg.gguf", {"dflash.target_layers": (A.ARRAY, [-1, 15, 28])})
    one_problem(target, neg, "target layer -1", "authors' id -1 (the embeddings) is layer-input index 0")


def test_an_fc_width_other_than_the_target_layers_times_n_embd(target, good, tmp_path):
    bad = edit(good, tmp_path / "two.gguf", {"dflash.target_layers": (A.ARRAY, [2, 15])})
    one_problem(target, bad, "'fc.weight' takes 1728 inputs", "2 target layers", "'dflash.target_layers'",
                "'llama.embedding_length'", "= 1152")


def test_vocabularies_that_differ(target, vocab, tmp_path):
    short = draft_for(tmp_path, vocab, "short", tokens=vocab[0][:49000])
    one_problem(target, short, "vocabulary sizes differ", "'tokenizer.ggml.tokens'", "target 49152", "draft 49000")
    toks = list(vocab[0])
    toks[100] = "<renamed>"
    renamed = draft_for(tmp_path, vocab, "renamed", tokens=toks)
    one_problem(target, renamed, "differ from token 100", "'tokenizer.ggml.tokens'", "'<renamed>'")


def test_a_mask_token_outside_the_vocabulary(target, good, tmp_path):
    bad = edit(good, tmp_path / "mask.gguf", {"tokenizer.ggml.mask_token_id": (A.UINT32, 49152)})
    one_problem(target, bad, "mask token 49152", "'tokenizer.ggml.mask_token_id'", "ids 0..49151")
    last = edit(good, tmp_path / "mask-last.gguf", {"tokenizer.ggml.mask_token_id": (A.UINT32, 49151)})
    assert check_pair(target, last) == []


def test_a_draft_narrower_than_the_embeddings_it_borrows(target, vocab, tmp_path):
    narrow = draft_for(tmp_path, vocab, "narrow", n_embd=64)
    problems = check_pair(target, narrow)
    assert all(target.name in p and "narrow.gguf" in p for p in problems), problems
    fc, *lent = problems
    assert "'fc.weight' takes 192 inputs" in fc and "= 1728" in fc
    assert ["the draft has no 'token_embd.weight' and" in lent[0], "the draft has no 'output.weight' and" in lent[1]] \
        == [True, True], lent
    for p in lent:
        # SmolLM2 ties its lm head to its embeddings: both come from token_embd.weight
        assert "borrows the target's 'token_embd.weight', which is 576 wide" in p
        assert "n_embd is 64 (key 'dflash.embedding_length')" in p


# --- graphgen info -m TARGET [-md DRAFT]

def test_info_on_a_good_pair(capsys, good):
    code, out, err = run(capsys, "info", "-m", "smollm2", "-md", good)
    assert code == 0 and err == ""
    assert out.rstrip().endswith("pair: OK")
    assert "arch llama, n_layer 30, n_embd 576, vocab 49152" in out
    assert "head dflash, n_layer 1, n_embd 576" in out
    assert "target layers 2,15,28 (layer-input indices" in out and "the authors' ids 1,14,27" in out
    assert "fc width 1728" in out and "borrows token_embd.weight, output.weight from the target" in out
    code, out, _ = run(capsys, "info", "-m", "smollm2", good, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True and doc["problems"] == []
    assert doc["target"]["n_layer"] == 30 and doc["target"]["publishes_layer_inputs"] is True
    d = doc["draft"]
    assert (d["head"], d["target_layers"], d["target_layer_ids"], d["fc_width"]) == ("dflash", [2, 15, 28],
                                                                                      [1, 14, 27], 1728)
    assert d["borrows"] == ["token_embd.weight", "output.weight"]


def test_info_on_a_bad_pair(capsys, target, good, tmp_path):
    bad = edit(good, tmp_path / "l30.gguf", {"dflash.target_layers": (A.ARRAY, [2, 15, 30])})
    code, out, err = run(capsys, "info", "-m", target, "-md", bad)
    assert code == 2 and "pair: OK" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphgen: error: "), err
    assert target.name in lines[0] and "l30.gguf" in lines[0] and "'dflash.target_layers'" in lines[0]
    code, out, _ = run(capsys, "info", "-m", target, "-md", bad, "--json")
    doc = json.loads(out)
    assert code == 2 and doc["ok"] is False and len(doc["problems"]) == 1 and "target layer 30" in doc["problems"][0]
    # a target that is none: one error line, exit 2
    code, out, err = run(capsys, "info", "-m", good, "-md", target)
    assert code == 2 and err.startswith("graphgen: error: ") and "swapped" in err and len(err.splitlines()) == 1


def test_info_on_a_target_alone(capsys, vocab, tmp_path):
    code, out, err = run(capsys, "info", "-m", "smollm2")
    assert code == 0 and "arch llama, n_layer 30, n_embd 576, vocab 49152" in out
    assert "publishes layer inputs 0..29" in out
    g3 = fake_target(tmp_path / "gemma3.gguf", "gemma3", 576, 30, *vocab)
    code, out, _ = run(capsys, "info", "-m", g3, "--json")
    assert code == 0 and json.loads(out)["target"]["publishes_layer_inputs"] is False
    code, _, err = run(capsys, "info", "-m", tmp_path / "none.gguf")
    assert code == 2 and err.startswith("graphgen: error: ") and "no such target model file" in err


def test_info_on_a_draft_alone_as_before(capsys, tmp_path):
    plain = make_model(tmp_path / "plain.gguf", n_layer=1)["path"]
    code, out, _ = run(capsys, "info", plain)
    assert code == 0 and "variant   dflash" in out and "token_embd.weight" in out
    code, _, err = run(capsys, "info")
    assert code == 2 and "give a draft" in err


# --- graphgen make-model --target

@pytest.mark.parametrize("variant, flags", [
    ("dflash", []), ("dflash2", []), ("dspark", ["--conf"]), ("lilicorr", []), ("dspark", ["--d2t-vocab", "1000"]),
], ids=["dflash", "dflash2", "dspark-conf", "lilicorr", "dspark-d2t"])
def test_make_model_for_a_target_runs_on_it(capsys, target, vocab, tmp_path, variant, flags):
    from graphgen.runtime.session import Session
    out = tmp_path / f"{variant}.gguf"
    code, text, err = run(capsys, "make-model", out, "--target", "smollm2", "--variant", variant, "--layers", "1",
                          *flags)
    assert code == 0, err
    assert "target layers 2,15,28" in text
    r = open_reader(out)
    names = {t.name for t in r.tensors}
    d2t = bool(flags) and flags[0] == "--d2t-vocab"
    # a d2t draft keeps its own reduced lm head; the embeddings always come from the target
    assert "token_embd.weight" not in names and ("output.weight" in names) == d2t
    assert field_value(r, "tokenizer.ggml.tokens") == vocab[0]
    assert field_value(r, "dflash.embedding_length") == 576 and field_value(r, "dflash.block_size") == 4
    assert check_pair(target, out) == []
    with Session(out, target=target) as s:
        hp = s.hparams
        feats = np.random.default_rng(0).standard_normal((3, 3 * 576)).astype(np.float32)
        s.inject(feats, 0, 0)
        logits = s.block([7] * hp.block_size, 3, 0).logits
    assert logits.shape == (4, 49152)
    # a d2t head scatters its 1000 rows into the target's vocabulary
    assert (np.isfinite(logits).sum(axis=1) == (1000 if d2t else 49152)).all()


def test_make_model_target_layers(capsys, tmp_path):
    out = tmp_path / "d.gguf"
    code, _, err = run(capsys, "make-model", out, "--target", "smollm2", "--layers", "1", "--target-layers", "0,29",
                       "--n-embd", "576", "--vocab", "49152")
    assert code == 0, err
    assert field_value(open_reader(out), "dflash.target_layers") == [0, 29]


@pytest.mark.parametrize("flags, words", [
    (["--n-embd", "64"], ["--n-embd 64", "llama.embedding_length", "576"]),
    (["--vocab", "1000"], ["--vocab 1000", "tokenizer.ggml.tokens", "49152"]),
    (["--target-layers", "2,15,30"], ["--target-layers", "target layer 30", "final output", "shifted by one"]),
    (["--format", "hf"], ["--target shapes a GGUF draft"]),
])
def test_make_model_flags_that_conflict_with_the_target(capsys, tmp_path, flags, words):
    out = tmp_path / "d.gguf"
    code, _, err = run(capsys, "make-model", out, "--target", "smollm2", "--layers", "1", *flags)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("graphgen: error: "), err
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()


def test_make_model_target_that_is_none(capsys, good, tmp_path):
    out = tmp_path / "d.gguf"
    code, _, err = run(capsys, "make-model", out, "--target", good)
    assert code == 2 and "is a DFlash draft" in err and "general.architecture" in err and not out.exists()


# --- shallow targets, and a shipped draft named as the user gave it

def shallow_target(path, n_layer, n_vocab=256, n_embd=64):
    """A loadable target of n_layer layers: a small BPE vocabulary and an f32 token_embd.weight."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.embedding_length", n_embd)
    w.add_uint32("llama.block_count", n_layer)
    w.add_uint32("llama.attention.head_count", 4)
    w.add_uint32("llama.feed_forward_length", 128)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(n_vocab)])
    w.add_array("tokenizer.ggml.token_type", [1] * (n_vocab - 1) + [3])
    w.add_array("tokenizer.ggml.merges", ["t 0"])
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_tensor("token_embd.weight", np.random.default_rng(0).standard_normal((n_vocab, n_embd)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("n_layer, spread", [(2, "2,1,0"), (3, "2,1,1"), (4, "2,2,2"), (5, "2,3,3")])
def test_make_model_for_a_shallow_target_asks_for_its_layers(capsys, tmp_path, n_layer, spread):
    """The authors' spread over 1 .. n_layer - 3 repeats a layer (or leaves the range) on a target of
    five layers or fewer: refused naming the layer count and --target-layers, the user's file kept."""
    t = shallow_target(tmp_path / f"t{n_layer}.gguf", n_layer)
    out = tmp_path / "d.gguf"
    out.write_bytes(b"GGUF earlier draft")
    code, text, err = run(capsys, "make-model", out, "--target", t, "--layers", "1")
    lines = err.strip().splitlines()
    assert code == 2 and text == "" and len(lines) == 1, err
    for w in (f"the target {t.name} has {n_layer} layers", f"({spread})", f"0..{n_layer - 1}", "--target-layers"):
        assert w in lines[0], lines[0]
    assert out.read_bytes() == b"GGUF earlier draft"
    # given, the layers are the user's, a repeated one included
    for layers in ("1", "0,1") + (("2,2", "1,2,3") if n_layer >= 4 else ()):
        code, text, err = run(capsys, "make-model", out, "--target", t, "--layers", "1", "--target-layers", layers)
        assert code == 0 and f"target layers {layers}," in text, err
        assert field_value(open_reader(out), "dflash.target_layers") == [int(x) for x in layers.split(",")]


def test_make_model_for_a_target_of_six_layers_spreads_them(capsys, tmp_path):
    t = shallow_target(tmp_path / "t6.gguf", 6)
    code, text, err = run(capsys, "make-model", tmp_path / "d.gguf", "--target", t, "--layers", "1")
    assert code == 0 and "target layers 2,3,4," in text, err


SHIPPED = Path(__file__).resolve().parents[2] / "drafts"


@pytest.mark.parametrize("given", ["smollm2-dflash", "folder"])
def test_the_pair_check_names_a_shipped_draft_as_given(capsys, tmp_path, given):
    """Its file is draft.gguf, which names none of the shipped drafts: info's and dump's lines name the
    draft by its name (a shipped one) or its folder's."""
    t = shallow_target(tmp_path / "t4.gguf", 4)
    if given == "folder":
        folder = tmp_path / "mine"
        folder.mkdir()
        (folder / "draft.gguf").write_bytes((SHIPPED / "smollm2-dflash" / "draft.gguf").read_bytes())
        given, name = folder, "mine"
    else:
        name = given
    for args in (["info", "-m", t, "-md", given], ["dump", "-m", t, "-md", given, "-p", "x", "--out", tmp_path / "o"]):
        code, _, err = run(capsys, *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) >= 3, err
        assert all(ln.startswith(f"graphgen: error: target t4.gguf + draft {name}: ") for ln in lines), err
        assert "draft.gguf" not in err and any("target layer 15" in ln for ln in lines), err
    assert not (tmp_path / "o").exists()
