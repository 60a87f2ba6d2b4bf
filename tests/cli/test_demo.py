"""graphgen/cli/demo.py: `graphgen demo` works in a folder of its own, which becomes --out only when
it is done (a failed demo leaves nothing, an --out with files in it is refused), says where its files
are, and diffs against llama.cpp when the reference is installed."""

import re
from pathlib import Path

import pytest

import graphgen.libload as libload
import graphgen.play.engine as engine


def _no_reference(monkeypatch):
    def missing():
        raise FileNotFoundError("no wheel here")
    monkeypatch.setattr(libload, "package_dir", missing)


def test_the_demo_into_out_without_the_reference(cli, tmp_path, monkeypatch):
    _no_reference(monkeypatch)
    out = tmp_path / "d"
    r = cli("demo", "--out", out)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == f"made a tiny DFlash draft: {out / 'tiny-dflash.gguf'}"
    assert re.fullmatch(rf"  inject graph: \d+ nodes -> {re.escape(str(out / 'graphgen' / '00-inject.json'))}",
                        lines[2])
    assert lines[3].endswith(f"-> {out / 'graphgen' / '01-block.json'}")
    # the block's three drafted positions, three tokens each with their probabilities, best first
    tops = [ln for ln in lines if ln.startswith("  pos ")]
    assert [t.split(":")[0] for t in tops] == ["  pos 1", "  pos 2", "  pos 3"]
    for t in tops:
        ps = [float(p) for p in re.findall(r"\(p=([0-9.]+)\)", t)]
        assert len(ps) == 3 and ps == sorted(ps, reverse=True) and 0 < ps[0] <= 1
    assert lines[-1] == "reference llama.cpp not installed (no wheel here); skipping the graph-diff"
    assert sorted(p.name for p in out.iterdir()) == ["graphgen", "scenario.json", "tiny-dflash.gguf"]
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # its working folder became --out


def test_an_empty_out_is_taken_and_one_with_files_refused(cli, tmp_path, monkeypatch):
    _no_reference(monkeypatch)
    out = tmp_path / "d"
    out.mkdir()
    assert cli("demo", "--out", out).code == 0 and (out / "tiny-dflash.gguf").is_file()
    before = sorted(p.name for p in out.iterdir())
    r = cli("demo", "--out", out)
    assert r.code == 2 and f"--out {out}: exists and is not an empty folder" in r.err
    assert sorted(p.name for p in out.iterdir()) == before
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    r = cli("demo", "--out", notes)
    assert r.code == 2 and "exists and is not an empty folder" in r.err and notes.read_text() == "mine"


def test_a_failed_demo_leaves_nothing(cli, tmp_path, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("the engine broke")
    monkeypatch.setattr(engine, "run_scenario", broken)
    out = tmp_path / "sub" / "d"
    r = cli("demo", "--out", out)
    assert r.code == 2 and "the engine broke" in r.err
    assert list((tmp_path / "sub").iterdir()) == []  # neither --out nor the working folder beside it


def test_without_out_the_temporary_folder_is_kept_and_named(cli, tmp_path, monkeypatch):
    import tempfile
    _no_reference(monkeypatch)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = cli("demo")
    assert r.code == 0, r.err
    (work,) = tmp_path.iterdir()
    assert work.name.startswith("graphgen-demo-") and (work / "tiny-dflash.gguf").is_file()
    assert r.out.splitlines()[0] == f"made a tiny DFlash draft: {work / 'tiny-dflash.gguf'}"
    assert r.out.splitlines()[-1] == (f"the draft, scenario and dumps are in {work} (a temporary folder, kept: "
                                      "remove it when done, or give --out DIR)")


@pytest.mark.reference
def test_the_demo_diffs_against_llama_cpp(cli, tmp_path):
    out = tmp_path / "d"
    r = cli("demo", "--out", out)
    assert r.code == 0, r.err
    assert "running the same scenario in llama.cpp b11739 ..." in r.out
    assert r.out.count("result: IDENTICAL") == 2
    assert sorted(p.name for p in (out / "llama.cpp").glob("*.json")) == ["00-inject.json", "01-block.json"]
    # every file the output names exists once the demo is done: the reports name --out, not the
    # temporary folder the demo worked in
    named = re.findall(r"(/\S+\.(?:json|gguf|npz))", r.out)
    assert any("llama.cpp" in n for n in named) and any("graphgen" in n for n in named), r.out
    assert all(Path(n.rstrip(",:)")).exists() for n in named), [n for n in named if not Path(n).exists()]
    assert ".graphgen-demo-" not in r.out
