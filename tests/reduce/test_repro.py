"""`graphgen reduce` end to end, on a fault the mutation tool plants (tools/mutate.py FAULTS):
found on a 4-layer draft and a 3-sequence scenario against llama.cpp b11739, it comes down to
the smallest draft and scenario the edits reach, and the repro folder fails the same way when
run from its own files in fresh processes, with the fault, and passes without it."""

import json

import pytest

from reduce.cases import THREE_SEQUENCES, planted, run

SCENARIO = THREE_SEQUENCES
SETTINGS = {"variant": "dflash", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_ff": 128, "n_vocab": 256,
            "block_size": 4, "target_layers": [1, 2], "seed": 0}


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    d = tmp_path_factory.mktemp("reduce")
    env = planted(d)
    (d / "settings.json").write_text(json.dumps(SETTINGS))
    (d / "scenario.json").write_text(json.dumps(SCENARIO))
    p = run("reduce", "--settings", "settings.json", "--scenario", "scenario.json", "--out", "repro", "--json",
            env=env, cwd=d)
    assert p.returncode == 0, p.stderr
    return d, env, json.loads(p.stdout), p.stderr


def test_the_fault_is_reduced_to_the_smallest_case(reduced):
    d, _, s, _ = reduced
    f = s["failure"]
    assert (f["kind"], f["graph"], f["op"], f["how"]) == ("parting", "block", "RMS_NORM", "changed op_params")
    assert s["before"]["n_layer"] == 4 and s["before"]["sequences"] == 3 and s["before"]["steps"] == 4
    a = s["after"]
    assert (a["n_layer"], a["sequences"], a["steps"], a["target_layers"]) == (1, 1, 1, 1)
    assert (a["n_head"], a["head_dim"], a["n_vocab"], a["block_size"], a["n_ctx"]) == (1, 8, 8, 2, 16)
    assert s["complete"] and s["rerun"]["reproduced"]
    assert s["draft_bytes"] == (d / "repro" / "draft.gguf").stat().st_size < 1 << 20


def test_progress_goes_to_stderr_a_line_a_try(reduced):
    _, _, s, err = reduced
    tries = [ln for ln in err.splitlines() if ln.startswith("graphgen: [")]
    assert len(tries) == s["tries"] and sum("kept" in ln and "not kept" not in ln for ln in tries) == len(s["edits_kept"])


def test_the_folder_holds_what_an_issue_needs(reduced):
    d, _, s, _ = reduced
    repro = d / "repro"
    names = {p.name for p in repro.iterdir()}
    assert names == {"README.md", "draft.gguf", "settings.json", "scenario.json", "failure.json", "printed"}
    assert json.loads((repro / "failure.json").read_text()) == s
    readme = (repro / "README.md").read_text()
    assert all(c in readme for c in s["commands"])
    assert (repro / "printed" / "report.txt").read_text().count("op_params: eps=1e-06 -> eps=0.0006") >= 1
    # the settings write the same draft again
    from graphgen.synth import make_model
    make_model(d / "again.gguf", **json.loads((repro / "settings.json").read_text()))
    assert (d / "again.gguf").read_bytes() == (repro / "draft.gguf").read_bytes()


def test_the_repro_fails_with_the_fault_and_passes_without(reduced, tmp_path):
    d, env, s, _ = reduced
    import shutil
    for planted, want in ((env, 1), (None, 0)):
        work = tmp_path / ("with" if planted else "without")
        shutil.copytree(d / "repro", work)
        for cmd in s["commands"]:
            argv = cmd.split()
            assert argv[0] == "graphgen"
            p = run(*argv[1:], env=planted, cwd=work)
            code = p.returncode
        assert code == want, p.stdout + p.stderr
        if planted:
            assert "RMS_NORM" in p.stdout and "eps=0.0006" in p.stdout
