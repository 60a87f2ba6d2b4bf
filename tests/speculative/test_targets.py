"""A shipped draft given by its name (smollm2-dflash) or its folder (drafts/smollm2-dflash2) works in
every command that takes a draft, with `-md` (info, dump, diff) or as the draft argument (info,
dump, trace, bench, check-batch), and is named so; a wrong name is refused naming it. And the
files `diff -m -md` names exist once it ends: its dumps and llama.cpp's log with --keep DIR, no log
without."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from graphgen.cli import main

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "graphgen.cli"]
PROMPT = "The capital of France is"
# a shipped draft by its name, and one by its folder as a user in the project's tree types it
GIVEN = [("smollm2-dflash", "smollm2-dflash"), ("drafts/smollm2-dflash2", "smollm2-dflash2")]


@pytest.fixture(scope="module", autouse=True)
def target():
    from graphgen.speculative.targets import resolve
    return resolve("smollm2")  # fetched once, before the commands run


def run(*args):
    """The command in the project's tree, where drafts/ lies."""
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, cwd=ROOT)


def run_here(capsys, monkeypatch, *args):
    monkeypatch.chdir(ROOT)
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("given, name", GIVEN)
def test_info_checks_a_shipped_draft_on_the_target(capsys, monkeypatch, given, name):
    code, out, err = run_here(capsys, monkeypatch, "info", "-m", "smollm2", "-md", given)
    assert code == 0 and err == "" and out.rstrip().endswith("pair: OK"), err
    assert f"draft     {Path(given if '/' in given else ROOT / 'drafts' / given) / 'draft.gguf'}" in out, out
    code, out, _ = run_here(capsys, monkeypatch, "info", "-m", "smollm2", "-md", given, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and Path(doc["draft"]["path"]).resolve() == ROOT / "drafts" / name / "draft.gguf"
    # alone, by -md or as MODEL: the GGUF, its hint naming the draft as it can be given
    for args in (["-md", given], [name]):
        code, out, err = run_here(capsys, monkeypatch, "info", *args)
        assert code == 0, err
        assert f"variant   {name.split('-')[1]}" in out
        assert out.rstrip().endswith(f"run it as -m TARGET.gguf -md {name}"), out[-300:]
    # the folder given as MODEL is the authors' checkpoint it also holds
    code, out, _ = run_here(capsys, monkeypatch, "info", f"drafts/{name}")
    assert code == 0 and out.startswith(f"checkpoint drafts/{name}\n")
    # the same draft twice is one draft
    code, out, err = run_here(capsys, monkeypatch, "info", f"drafts/{name}/draft.gguf", "-md", name)
    assert code == 0 and out.startswith(f"model     drafts/{name}/draft.gguf\n"), err


@pytest.mark.parametrize("engine", ["graphgen", "llama.cpp"])
def test_dump_on_the_target_by_name_and_folder(tmp_path, engine):
    given, name = GIVEN[engine == "llama.cpp"]
    out = tmp_path / "out"
    p = run("dump", "-m", "smollm2", "-md", given, "-p", PROMPT, "-n", 3, "--out", out, "--engine", engine)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith(f"{out}: ") and f"graphs of {name} on the features of SmolLM2" in p.stdout, p.stdout
    graphs = sorted(f.name for f in out.glob("[0-9][0-9]-*.json"))
    assert graphs[:2] == ["00-inject.json", "01-block.json"] and (out / "target-run.json").is_file()
    n = int(re.search(r": (\d+) graphs of", p.stdout).group(1))
    assert n == len(graphs)
    if engine == "llama.cpp":
        assert f"llama.cpp's stderr is in {out / 'llama.cpp.log'}" in p.stderr and (out / "llama.cpp.log").is_file()


def test_dump_takes_a_shipped_draft_as_its_argument(tmp_path):
    out = tmp_path / "out"
    p = run("dump", "smollm2-dflash", "--target", "smollm2", "--out", out)
    assert p.returncode == 0, p.stderr[-2000:]
    assert sorted(f.name for f in out.glob("*.json")) == ["00-inject.json", "01-block.json"]
    assert json.loads((out / "01-block.json").read_text())["graph"] == "block"


def test_diff_on_the_target_names_no_log_it_deletes(tmp_path):
    """Without --keep the dumps and llama.cpp's log go with the temporary folder: no line names it."""
    given, _ = GIVEN[0]
    p = run("diff", "-m", "smollm2", "-md", given, "-p", PROMPT, "-n", 3)
    assert p.returncode == 0 and p.stdout.rstrip().endswith("graphs compared, 0 diverged"), p.stderr[-2000:]
    assert "llama.cpp.log" not in p.stdout + p.stderr, p.stderr


def test_diff_on_the_target_keeps_dumps_and_log_where_it_says(tmp_path):
    given, _ = GIVEN[1]
    keep = tmp_path / "keep"
    p = run("diff", "-m", "smollm2", "-md", given, "-p", PROMPT, "-n", 3, "--keep", keep)
    assert p.returncode == 0 and p.stdout.rstrip().endswith("graphs compared, 0 diverged"), p.stderr[-2000:]
    log = keep / "ref" / "llama.cpp.log"
    assert re.findall(r"llama.cpp's stderr is in (\S+)", p.stderr) == [str(log)], p.stderr
    assert log.is_file() and "llama" in log.read_text()
    ref = sorted(f.name for f in (keep / "ref").glob("[0-9][0-9]-*.json"))
    ours = sorted(f.name for f in (keep / "ours").glob("[0-9][0-9]-*.json"))
    assert ref == ours and ref[:2] == ["00-inject.json", "01-block.json"] and (keep / "ours" / "target-run.json").is_file()
    # the report names the kept dumps, and nothing else is left beside them
    named = re.findall(r"(?:ref|ours): (\S+\.json)", p.stdout)
    assert len(named) == 2 * len(ref) and all(Path(f).is_file() and Path(f).parent.parent == keep for f in named)
    assert sorted(f.name for f in keep.iterdir()) == ["ours", "ref"]
    # again into the same folder, a shorter run: graphgen's dumps replaced, a file of the user's kept
    (keep / "ref" / "notes.txt").write_text("mine")
    p = run("diff", "-m", "smollm2", "-md", given, "-p", PROMPT, "-n", 1, "--keep", keep, "--quiet")
    assert p.returncode == 0, p.stderr[-2000:]
    assert (keep / "ref" / "notes.txt").read_text() == "mine"
    n = int(re.match(r"(\d+) graphs? compared", p.stdout).group(1))
    assert n < len(ref) and len(list((keep / "ref").glob("[0-9][0-9]-*.json"))) == n, p.stdout


@pytest.mark.parametrize("case", ["file", "foreign"])
def test_diff_keep_is_refused_before_the_run(tmp_path, case):
    keep = tmp_path / "keep"
    if case == "file":
        keep.write_text("mine")
        want = f"{keep}/ref: {keep} is a file, not a folder"
    else:
        (keep / "ref").mkdir(parents=True)
        (keep / "ref" / "00-notes.json").write_text('{"mine": 1}')
        want = "00-notes.json"
    before = {f: f.read_bytes() for f in tmp_path.rglob("*") if f.is_file()}
    p = run("diff", "-m", "smollm2", "-md", "smollm2-dflash", "-p", PROMPT, "-n", 2, "--keep", keep)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("graphgen: error: ") and want in lines[0], \
        p.stderr
    assert p.stdout == "" and {f: f.read_bytes() for f in tmp_path.rglob("*") if f.is_file()} == before
    assert not (keep / "ours").exists() if case == "foreign" else keep.is_file()


@pytest.mark.parametrize("args", [
    ["info", "-m", "smollm2", "-md", "{}"], ["info", "-md", "{}"], ["info", "{}"],
    ["dump", "-m", "smollm2", "-md", "{}", "-p", PROMPT, "--out", "{out}"], ["dump", "{}", "--out", "{out}"],
    ["diff", "-m", "smollm2", "-md", "{}", "-p", PROMPT],
    ["trace", "{}"], ["bench", "{}"], ["check-batch", "{}"],
], ids=lambda a: " ".join(x for x in a if x[0] == "-" or x.isalpha())[:40])
def test_a_wrong_name_is_refused_naming_it(tmp_path, args):
    out = tmp_path / "out"
    p = run(*[a.format("smollm2-dflsh", out=out) if "{" in a else a for a in args])
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("graphgen: error: "), p.stderr
    assert "smollm2-dflsh" in lines[0] and ("no such draft model file" in lines[0] or "no such file" in lines[0])
    assert not out.exists()


def test_the_draft_argument_takes_a_folder_holding_draft_gguf(tmp_path):
    """trace, bench and check-batch read the folder's draft.gguf, and bench names it by the folder."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    assert run("make-model", folder / "draft.gguf").returncode == 0
    p = run("trace", folder, "--prompt", 2, "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert {json.loads(ln)["graph"] for ln in p.stdout.splitlines()} == {"00-inject", "01-block"}
    p = run("bench", folder, "--repeat", 1, "--engine", "graphgen", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["runs"][0]["model"] == "tiny"
    p = run("check-batch", folder, "--engine", "graphgen", "--n-seq", 2)
    assert p.returncode == 0 and p.stdout.startswith("check-batch tiny: "), p.stderr[-2000:]
