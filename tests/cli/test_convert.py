"""graphgen/cli/convert.py: `graphgen convert`'s flags as llama.cpp's converter is run with them, and
what it prints of the result (the GGUF's tensors counted from the file; the target converted beside
it; the line saying a draft without tables runs beside its target). The conversion itself:
tests/authors/test_convert.py."""

from pathlib import Path

import gguf
import pytest

import graphgen.authors.convert as C
from graphgen.authors.convert import ConvertResult


@pytest.fixture
def converted(monkeypatch):
    """The converter replaced by one that returns `result`; its arguments recorded."""
    state = {"calls": []}

    def fake(hf_dir, out, **kw):
        state["calls"].append(dict(kw, hf_dir=hf_dir, out=out))
        return state["result"]
    monkeypatch.setattr(C, "convert", fake)
    return state


def test_the_flags_reach_the_converter(cli, converted, tiny, tmp_path):
    converted["result"] = ConvertResult(out=tiny, commit="abc123", seconds=2.25)
    r = cli("convert", tmp_path / "ck", tmp_path / "d.gguf", "--target", tmp_path / "tgt", "--target-gguf",
            tmp_path / "t.gguf", "--outtype", "q8_0", "--force")
    assert r.code == 0, r.err
    (kw,) = converted["calls"]
    assert kw == {"hf_dir": tmp_path / "ck", "out": tmp_path / "d.gguf", "target_dir": tmp_path / "tgt",
                  "target_gguf": tmp_path / "t.gguf", "outtype": "q8_0", "force": True}
    cli("convert", "ck", "d.gguf")
    assert converted["calls"][-1] == {"hf_dir": Path("ck"), "out": Path("d.gguf"), "target_dir": None,
                                      "target_gguf": None, "outtype": "f32", "force": False}


def test_what_it_prints(cli, converted, tiny):
    n = len(gguf.GGUFReader(str(tiny)).tensors)
    converted["result"] = ConvertResult(out=tiny, commit="abc123", seconds=2.25)
    r = cli("convert", "ck", "d.gguf")
    assert r.out == f"converted ck -> d.gguf (llama.cpp converter abc123, {n} tensors, 2.2 s)\n"
    converted["result"] = ConvertResult(out=Path("d.gguf"), commit="abc123", seconds=1.0,
                                        borrows=["token_embd.weight", "output.weight"],
                                        target_out=Path("t.gguf"), target_arch="llama")
    r = cli("convert", "ck", "d.gguf", "--target-gguf", "t.gguf")
    # a GGUF it cannot read: its tensors are not counted, never a traceback
    assert r.out.splitlines() == [
        "converted ck -> d.gguf (llama.cpp converter abc123, ? tensors, 1.0 s)",
        "converted its target -> t.gguf (llama)",
        "d.gguf has no token embeddings or lm head of its own: it runs beside its target, which lends them "
        "(graphgen draft -m t.gguf -md d.gguf)"]


def test_an_outtype_the_converter_does_not_write_is_a_usage_error(cli, converted):
    r = cli("convert", "ck", "d.gguf", "--outtype", "q4_0")
    assert r.code == 2 and "argument --outtype: invalid choice: 'q4_0'" in r.err and converted["calls"] == []


def test_the_converters_refusal_is_one_line(cli, monkeypatch):
    def refuse(hf_dir, out, **kw):
        raise C.ConvertError(f"{hf_dir}: no config.json")
    monkeypatch.setattr(C, "convert", refuse)
    r = cli("convert", "ck", "d.gguf")
    assert (r.code, r.out, r.err) == (2, "", "graphgen: error: ck: no config.json\n")
