"""The reducer's loop and its command (graphgen.reduce.shrink, `graphgen reduce`): a case that
does not fail is refused; the tries stop at --max-tries and the repro says so; an interrupt leaves
neither the folder nor its temporary files; a folder the user has is never written into."""

import json
import os
import signal
import subprocess
import time

import pytest

from reduce.cases import CLI, planted

SCENARIO = {"n_ctx": 64, "n_ubatch": 32, "flash_attn": "off", "type_kv": "f16", "seed": 1,
            "steps": [{"inject": {"n_tokens": 4, "pos0": 0}}, {"block": {"tokens": [7, 255, 255, 255], "pos0": 4}}]}
SETTINGS = {"variant": "dflash", "n_layer": 3, "seed": 0}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps(SETTINGS))
    (tmp_path / "scenario.json").write_text(json.dumps(SCENARIO))
    (tmp_path / "tmp").mkdir()
    return tmp_path


def planted_env(tmp_path):
    return dict(planted(tmp_path), TMPDIR=str(tmp_path / "tmp"))


def reduce(cwd, *extra, env=None):
    return subprocess.run(CLI + ["reduce", "--settings", "settings.json", "--scenario", "scenario.json", *extra],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_a_case_that_does_not_fail_is_refused(files):
    p = reduce(files, "--out", "repro", env=dict(os.environ, TMPDIR=str(files / "tmp")))
    assert p.returncode == 2 and "does not fail" in p.stderr and "nothing to reduce" in p.stderr
    assert not (files / "repro").exists() and list((files / "tmp").iterdir()) == []


def test_max_tries_stops_short_and_says_so(files):
    env = planted_env(files)
    p = reduce(files, "--out", "repro", "--max-tries", "2", "--json", env=env)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["tries"] == 2 and s["complete"] is False
    assert "stopped at its limit of tries" in (files / "repro" / "README.md").read_text()


def test_a_folder_the_user_has_is_refused_before_anything_runs(files):
    (files / "repro").mkdir()
    (files / "repro" / "notes.txt").write_text("mine")
    p = reduce(files, "--out", "repro", env=planted_env(files))
    assert p.returncode == 2 and "not an empty folder" in p.stderr
    assert [x.name for x in (files / "repro").iterdir()] == ["notes.txt"]
    assert "running the case" not in p.stderr


def test_an_interrupt_leaves_nothing_behind(files):
    env = planted_env(files)
    proc = subprocess.Popen(CLI + ["reduce", "--settings", "settings.json", "--scenario", "scenario.json",
                                   "--out", "repro"], cwd=files, env=env, stderr=subprocess.PIPE, text=True)
    # interrupted while it tries smaller cases
    for line in proc.stderr:
        if line.startswith("graphgen: [1]"):
            break
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, err
    assert not (files / "repro").exists()
    assert [p.name for p in files.iterdir() if p.name.startswith(".repro")] == []
    time.sleep(0.2)
    assert list((files / "tmp").iterdir()) == []


def test_a_repro_that_does_not_reproduce_is_never_written(tmp_path):
    """The folder is rerun before it is moved into place: a case said to fail that agrees when run
    from the folder is refused, and nothing is left."""
    from graphgen.reduce.case import Case
    from graphgen.reduce.failure import Failure, Mode, Outcome
    from graphgen.reduce.repro import write_repro
    from graphgen.reduce.shrink import ReduceError, Reduced
    case = Case(json.loads(json.dumps(SCENARIO)), dict(SETTINGS, n_layer=1))
    claimed = Failure("parting", graph="block", how="value", op="MUL_MAT", detail="said so")
    res = Reduced(case, case, claimed, Outcome(claimed, {}), Outcome(claimed, {}))
    with pytest.raises(ReduceError, match="does not reproduce"):
        write_repro(tmp_path / "repro", res, Mode())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, says", [
    (["--settings", "settings.json", "-m", "settings.json"], "got --settings and -m"),
    ([], "reduce takes the draft one way"),
    (["--checkpoint", "tmp"], "tmp: no config.json: not a checkpoint folder"),
    (["--hf-settings", "nothing.json"], "--hf-settings nothing.json: no such file"),
])
def test_the_draft_is_given_one_way_and_must_be_there(files, args, says):
    p = subprocess.run(CLI + ["reduce", *args, "--scenario", "scenario.json", "--out", "repro"],
                       capture_output=True, text=True, cwd=files)
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert not (files / "repro").exists()


def test_an_authors_checkpoint_is_reduced_against_check_not_two_backends(files):
    (files / "hf.json").write_text(json.dumps({"variant": "dflash"}))
    p = subprocess.run(CLI + ["reduce", "--hf-settings", "hf.json", "-dev", "CPU,Vulkan0", "--out", "repro"],
                       capture_output=True, text=True, cwd=files)
    assert p.returncode == 2 and "an authors' checkpoint is reduced against graphgen check" in p.stderr
    # without the extra: refused at once, naming it
    p = subprocess.run(CLI + ["reduce", "--hf-settings", "hf.json", "--out", "repro"], capture_output=True,
                       text=True, cwd=files, env=dict(os.environ, GRAPHGEN_HIDE_TORCH="1"))
    assert p.returncode == 2 and "graphgen[torch] extra" in p.stderr and "running the case" not in p.stderr
    assert not (files / "repro").exists()
