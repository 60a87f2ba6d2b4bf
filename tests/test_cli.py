"""The command line's manners: usage errors in one line, and a dump folder's other files left alone."""

import json
import subprocess
import sys

import pytest

from conftest import REF_DIR

CLI = [sys.executable, "-m", "graphgen.cli"]


@pytest.mark.parametrize("args, what", [
    (["make-model"], "required: OUT"),
    (["bench", "m.gguf", "--repeat", "abc"], "--repeat: invalid int value"),
    (["nosuch"], "invalid choice: 'nosuch'"),
])
def test_usage_errors_are_one_line(args, what):
    p = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphgen: error:") and what in lines[0], p.stderr
    assert "--help" in lines[0] and "usage:" not in p.stderr


def test_dump_keeps_files_it_did_not_write(tmp_path):
    model = tmp_path / "m.gguf"
    assert subprocess.run(CLI + ["make-model", str(model)], capture_output=True).returncode == 0
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    scen = str(REF_DIR / "dflash-fa-off" / "scenario.json")
    run = lambda: subprocess.run(CLI + ["dump", str(model), "--scenario", scen, "--out", str(out)],  # noqa: E731
                                 capture_output=True, text=True, timeout=300)
    assert run().returncode == 0
    assert (out / "notes.txt").read_text() == "mine"
    # a second run replaces graphgen's own dumps
    first = json.loads((out / "01-block.json").read_text())
    assert run().returncode == 0 and json.loads((out / "01-block.json").read_text())["nodes"] == first["nodes"]
    # a file with a dump's name that is not a dump is never overwritten: the run is refused
    (out / "07-results.json").write_text('{"accuracy": 0.9}')
    p = run()
    assert p.returncode == 2 and "07-results.json is not a graphgen dump" in p.stderr
    assert json.loads((out / "07-results.json").read_text()) == {"accuracy": 0.9}
