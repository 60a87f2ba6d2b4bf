"""graphgen/cli/model.py: `graphgen make-model` (flags to make_model's options, OUT written only when
complete and loadable, never over a file that is no GGUF) and `graphgen info` (a draft, a target, a
pair, a checkpoint folder)."""

import json
from types import SimpleNamespace

import gguf
import pytest

import graphgen.cli.model as M
from graphgen.cli.parser import build_parser


def _tensor_names(path):
    return sorted(t.name for t in gguf.GGUFReader(str(path)).tensors)


# ---- make-model -------------------------------------------------------------------------------

def test_make_model_writes_a_draft_and_says_what(cli, tmp_path):
    out = tmp_path / "d.gguf"
    r = cli("make-model", out, "--variant", "dspark", "--layers", 1)
    assert r.code == 0, r.err
    n = len(_tensor_names(out))
    assert r.out == f"wrote {out}: variant dspark, backbone base, {n} tensors\n"
    assert "markov_w1.weight" in _tensor_names(out)
    assert [p.name for p in tmp_path.iterdir()] == ["d.gguf"]  # nothing staged left beside it


def test_make_model_never_replaces_what_is_no_gguf(cli, tmp_path):
    notes = tmp_path / "notes.gguf"
    notes.write_text("mine")
    r = cli("make-model", notes)
    assert r.code == 2 and r.err == f"graphgen: error: {notes}: exists and is not a GGUF file; pass --force to " \
                                    "replace it\n"
    assert notes.read_text() == "mine"
    r = cli("make-model", tmp_path)
    assert r.code == 2 and "is a folder; make-model writes a GGUF file" in r.err
    # an earlier draft is replaced; a file that is no GGUF only with --force
    assert cli("make-model", notes, "--force").code == 0 and notes.read_bytes()[:4] == b"GGUF"
    assert cli("make-model", notes, "--layers", 3).code == 0
    assert "blk.2.attn_q.weight" in _tensor_names(notes)


def test_a_draft_graphgen_would_refuse_is_not_written(cli, tmp_path):
    out = tmp_path / "bad.gguf"
    r = cli("make-model", out, "--n-embd", 60)  # 4 heads of 15: no even rope dimension
    assert r.code == 2 and r.err.startswith("graphgen: error: these options make a draft graphgen refuses, "
                                            "nothing written: ")
    assert str(out) in r.err and ".tmp" not in r.err and not list(tmp_path.iterdir())


@pytest.mark.parametrize("flag", [["--yarn-beta-fast", "16"], ["--conf-markov", "false"], ["--attention-bias"]])
def test_settings_of_the_authors_formats_only_are_refused_for_a_gguf(flag, cli, tmp_path):
    r = cli("make-model", tmp_path / "d.gguf", *flag)
    assert r.code == 2 and f"{flag[0]} is a setting of the authors' formats (--format hf)" in r.err
    assert not list(tmp_path.iterdir())


def test_a_target_shapes_a_gguf_draft_only(cli, tmp_path):
    r = cli("make-model", tmp_path / "ck", "--format", "hf", "--target", "t.gguf")
    assert r.code == 2 and "--target shapes a GGUF draft" in r.err


def _captured(monkeypatch, *argv):
    """make_model's arguments for a make-model command line."""
    seen = {}
    monkeypatch.setattr(M, "make_model", lambda path, variant, backbone, **kw: seen.update(
        path=path, variant=variant, backbone=backbone, **kw) or {})
    M.make_model_from_args(build_parser().parse_args(["make-model", "o.gguf", *argv]))
    return seen


def test_flags_become_make_models_options(monkeypatch):
    kw = _captured(monkeypatch, "--variant", "dflash2", "--backbone", "dsv4", "--swa-pattern", "1,0,1",
                   "--sample-from-anchor", "false", "--conv-kernel", "3", "--conv-group", "2", "--wtype", "q8_0")
    assert (kw["path"], kw["variant"], kw["backbone"], kw["wtype"]) == ("o.gguf", "dflash2", "dsv4", "q8_0")
    assert kw["swa_pattern"] == [True, False, True] and kw["sample_from_anchor"] is False
    assert (kw["conv_kernel_size"], kw["conv_group_size"]) == (3, 2)
    assert kw["sample_from_anchor"] is False
    # untouched switches and unset values are left to make_model's defaults
    assert not {"shared_kv", "sinks", "swa_window", "head_dim", "target"} & set(kw)
    assert _captured(monkeypatch, "--sample-from-anchor", "true")["sample_from_anchor"] is True


def test_the_tiny_dimensions_then_a_preset_then_the_flags(monkeypatch):
    kw = _captured(monkeypatch)
    assert {k: kw[k] for k in M.DIM_DEFAULTS} == dict(n_embd=64, n_layer=2, n_head=4, n_head_kv=None, n_ff=128,
                                                       n_vocab=256, block_size=4, target_layers=[1, 2])
    kw = _captured(monkeypatch, "--preset", "realistic", "--layers", "1", "--vocab", "512", "--target-layers", "0")
    assert (kw["n_embd"], kw["n_head"], kw["n_ff"], kw["block_size"]) == (2048, 32, 6144, 16)  # the preset's
    assert (kw["n_layer"], kw["n_vocab"], kw["target_layers"]) == (1, 512, [0])                # the flags'


def test_int_lists():
    assert M._int_list("1, 2,,3") == [1, 2, 3]
    with pytest.raises(Exception, match="expected comma-separated integers, got '1,x'"):
        M._int_list("1,x")


def _fake_target(monkeypatch):
    import graphgen.speculative.pair as pair
    monkeypatch.setattr(pair, "target_info", lambda path: SimpleNamespace(n_embd=576, n_vocab=49152, n_layer=30,
                                                                          arch="llama"))


def test_a_draft_for_a_target_takes_its_width_and_vocabulary(monkeypatch, tmp_path):
    _fake_target(monkeypatch)
    args = build_parser().parse_args(["make-model", "o.gguf", "--target", str(tmp_path / "t.gguf"),
                                      "--n-embd", "64"])
    with pytest.raises(ValueError, match="--n-embd 64 conflicts with the target t.gguf, whose llama.embedding_length "
                                         "gives 576; a draft for a target takes it from the target"):
        M._check_target_args(args, args.target)
    args = build_parser().parse_args(["make-model", "o.gguf", "--target", "t.gguf", "--vocab", "256"])
    with pytest.raises(ValueError, match="--vocab 256 conflicts with the target t.gguf, whose tokenizer.ggml.tokens "
                                         "gives 49152"):
        M._check_target_args(args, args.target)
    args = build_parser().parse_args(["make-model", "o.gguf", "--target", "t.gguf", "--n-embd", "576",
                                      "--target-layers", "1,30"])
    with pytest.raises(ValueError, match="--target-layers for the target t.gguf: target layer 30 of"):
        M._check_target_args(args, args.target)
    args = build_parser().parse_args(["make-model", "o.gguf", "--target", "t.gguf", "--target-layers", "1,29"])
    assert M._check_target_args(args, args.target).name == "t.gguf"


def test_a_draft_for_a_target_leaves_width_and_vocabulary_to_it(monkeypatch, tmp_path):
    _fake_target(monkeypatch)
    kw = _captured(monkeypatch, "--target", str(tmp_path / "t.gguf"), "--preset", "realistic", "--layers", "1")
    assert kw["target"] == tmp_path / "t.gguf" and kw["n_layer"] == 1
    assert not {"n_embd", "n_vocab", "target_layers"} & set(kw)


# ---- info -------------------------------------------------------------------------------------

def test_info_prints_the_draft(cli, tiny):
    r = cli("info", tiny)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == f"model     {tiny}" and "variant   dflash" in lines and "backbone  base" in lines
    names = _tensor_names(tiny)
    assert f"tensors ({len(names)}, " in r.out
    listed = sorted(ln.split()[0] for ln in lines[lines.index(next(x for x in lines if x.startswith("tensors"))) + 1:])
    assert listed == names
    assert "  block_size                 4" in lines and "  mask_token_id              255" in lines
    assert "borrows" not in r.out


def test_info_json(cli, tiny):
    r = cli("info", "-md", tiny, "--json")
    doc = json.loads(r.out)
    assert doc["model"] == str(tiny) and (doc["variant"], doc["backbone"]) == ("dflash", "base")
    assert sorted(t["name"] for t in doc["tensors"]) == _tensor_names(tiny) and doc["borrows"] == []
    assert doc["hparams"]["n_embd"] == 64 and doc["hparams"]["target_layers"] == [1, 2]
    assert doc["rope_type"] == "neox"
    tok = next(t for t in doc["tensors"] if t["name"] == "token_embd.weight")
    assert tok["shape"] == [64, 256]


def test_info_takes_a_folder_holding_draft_gguf(cli, tiny, tmp_path):
    (tmp_path / "draft.gguf").write_bytes(tiny.read_bytes())
    r = cli("info", tmp_path, "--json")
    assert r.code == 0 and json.loads(r.out)["model"] == str(tmp_path / "draft.gguf")


def test_info_refusals(cli, tiny, tmp_path):
    r = cli("info")
    assert r.code == 2 and "nothing to show: give a draft (MODEL or -md DRAFT), a target (-m TARGET)" in r.err
    r = cli("info", tmp_path / "none.gguf")
    assert r.code == 2 and r.err == f"graphgen: error: {tmp_path / 'none.gguf'}: no such file or folder\n"
    other = tmp_path / "other.gguf"
    other.write_bytes(tiny.read_bytes())
    r = cli("info", tiny, "-md", other)
    assert r.code == 2 and f"two drafts given ({tiny} and -md {other}): give one" in r.err
    assert cli("info", tiny, "-md", tiny).code == 0  # the same draft twice is one


def test_relabel_pair_names_the_draft_as_given():
    lines = ["target t.gguf + draft draft.gguf: the widths differ", "something else"]
    assert M.relabel_pair(lines, "/m/t.gguf", "/d/smollm2-dflash/draft.gguf", "smollm2-dflash") == [
        "target t.gguf + draft smollm2-dflash: the widths differ", "something else"]
