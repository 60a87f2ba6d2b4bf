"""`graphgen reduce` on an authors' checkpoint (--hf-settings): the failure is `graphgen check`'s,
here graphgen's graph parting from llama.cpp's on a planted fault, found through a speculators
DSpark checkpoint. The first edits shrink the checkpoint and its scenario while the fault stays;
the repro folder holds the checkpoint with its target, and its command fails with the fault and
passes without it wherever the folder is moved (speculators' config names its verifier by path).
Bounded by --max-tries: each try converts, runs the authors' model twice, b11739 and graphgen."""

import json
import shlex
import shutil

import pytest

from authors_util import require_extra
from reduce.cases import planted, run

require_extra()

SETTINGS = {"variant": "dspark", "n_layer": 2, "block_size": 4, "target_layers": [1, 2], "seed": 0}
SCENARIO = {"n_ctx": 64, "n_ubatch": 16, "flash_attn": "off", "type_kv": "f32", "seed": 1,
            "steps": [{"inject": {"n_tokens": 3, "pos0": 0}}, {"block": {"tokens": [7, 255, 255, 255], "pos0": 3}}]}
TRIES = 4


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    d = tmp_path_factory.mktemp("reduce-hf")
    env = planted(d)
    (d / "hf.json").write_text(json.dumps({"make_hf": SETTINGS}))
    (d / "scenario.json").write_text(json.dumps(SCENARIO))
    p = run("reduce", "--hf-settings", "hf.json", "--scenario", "scenario.json", "--out", "repro",
            "--max-tries", TRIES, "--json", env=env, cwd=d)
    assert p.returncode == 0, p.stderr
    return d, env, json.loads(p.stdout)


def test_checks_failure_is_kept_while_the_checkpoint_shrinks(reduced):
    _, _, s = reduced
    f = s["failure"]
    assert (f["kind"], f["graph"], f["op"], f["how"]) == ("parting", "block", "RMS_NORM", "changed op_params")
    assert s["mode"].startswith("the authors' model against llama.cpp b11739 and graphgen")
    # n_layer kept, dropping the block step loses the fault, dropping the inject step keeps it, then
    # one target layer
    assert s["edits_kept"] == ["n_layer 2 -> 1", "drop step 0", "target layers 2 -> 1"]
    assert s["tries"] == TRIES and not s["complete"] and s["rerun"]["reproduced"]
    b, a = s["before"], s["after"]
    assert (b["n_layer"], b["steps"], b["target_layers"]) == (2, 2, 2)
    assert (a["n_layer"], a["steps"], a["target_layers"], a["n_head_kv"], a["head_dim"]) == (1, 1, 1, 2, 16)


def test_the_folder_holds_the_checkpoint_its_target_and_settings(reduced):
    d, _, s = reduced
    repro = d / "repro"
    assert {p.name for p in repro.iterdir()} == {"README.md", "checkpoint", "settings.json", "scenario.json",
                                                 "failure.json", "printed"}
    assert (repro / "checkpoint" / "target" / "model.safetensors").is_file()
    size = sum(p.stat().st_size for p in (repro / "checkpoint").rglob("*") if p.is_file())
    assert s["draft_bytes"] == size < 1 << 20
    assert json.loads((repro / "settings.json").read_text()) == dict(SETTINGS, n_layer=1, target_layers=[1])
    cfg = json.loads((repro / "checkpoint" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(repro.resolve() / "checkpoint" / "target")
    readme = (repro / "README.md").read_text()
    assert s["commands"] == ["graphgen check checkpoint --target checkpoint/target --scenario scenario.json "
                             "--keep check --json"]
    assert s["commands"][0] in readme and "HFSpec(**settings)" in readme
    assert "eps=0.0006" in (repro / "printed" / "report.txt").read_text()


def test_the_moved_repro_fails_with_the_fault_and_passes_without(reduced, tmp_path):
    d, env, s = reduced
    for planted, want in ((env, 1), (None, 0)):
        work = tmp_path / ("with" if planted else "without")
        shutil.copytree(d / "repro", work)
        argv = shlex.split(s["commands"][0])
        p = run(*argv[1:], env=planted, cwd=work)
        assert p.returncode == want, p.stdout[-2000:] + p.stderr[-2000:]
        doc = json.loads(p.stdout)
        assert doc["graphgen_identical_to_llama.cpp"] is (not planted)
        assert (work / "check" / "graphgen").is_dir()


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """A checkpoint kept whole whose setting the converter refuses (z-lab's output multiplier on a
    DFlash draft, which b11739 would leave out), on check's default scenario: a refusal is a failure
    to keep too, and only the scenario is reduced."""
    from graphgen.authors.checkpoint import HFSpec, make_hf
    d = tmp_path_factory.mktemp("reduce-ck")
    make_hf(d / "ck", HFSpec(variant="dflash", n_layer=1, block_size=4, target_layers=[1, 2], output_multiplier=1.7))
    p = run("reduce", "--checkpoint", "ck", "--out", "repro", "--json", cwd=d)
    assert p.returncode == 0, p.stderr
    return d, json.loads(p.stdout)


def test_a_refusal_is_kept_while_the_scenario_shrinks(refused):
    d, s = refused
    f = s["failure"]
    assert (f["kind"], f["side"]) == ("refused", "check") and "output_multiplier" in f["detail"]
    assert s["complete"] and s["rerun"]["reproduced"] and s["format"] == "hf" and not s["settings"]
    # check's default scenario: two rounds of inject and block, 5 steps
    b, a = s["before"], s["after"]
    assert (b["steps"], b["n_ctx"]) == (5, 256) and "n_layer" not in b
    assert a["steps"] == 1 and a["tokens"] < b["tokens"] and a["n_ctx"] < 256
    repro = d / "repro"
    assert {p.name for p in repro.iterdir()} == {"README.md", "checkpoint", "scenario.json", "failure.json", "printed"}
    # the folder as given, copied whole
    assert sorted(p.relative_to(repro / "checkpoint") for p in (repro / "checkpoint").rglob("*")) == \
        sorted(p.relative_to(d / "ck") for p in (d / "ck").rglob("*"))
    assert s["commands"] == ["graphgen check checkpoint --scenario scenario.json --keep check --json"]
    assert "as it was given" in (repro / "README.md").read_text()
