"""The reference runner (graphgen/reference/runner.py): a scenario run in llama.cpp b11739 in a child
process, every graph it evaluates dumped; the parent's refusals and progress lines, the child's
exit codes, the many-case server, and the metadata it reads off a draft."""

from __future__ import annotations

import json

import pytest

from gguf_edit import rewrite
from graphgen.dump.format import load_dump_dir
from graphgen.libload import REFERENCE_BUILD
from graphgen.reference import runner as R
from graphgen.synth import make_model

SCENARIO = {"n_ctx": 64, "n_ubatch": 16, "flash_attn": "off", "type_kv": "f16", "seed": 3,
            "steps": [{"inject": {"n_tokens": 5, "pos0": 0}},
                      {"block": {"tokens": [7, 255, 255, 255], "pos0": 5}},
                      {"seq_rm": {"seq": 0, "p0": 5, "p1": -1}},
                      {"inject": {"n_tokens": 2, "pos0": 5}}]}


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    d = tmp_path_factory.mktemp("runner")
    make_model(d / "draft.gguf", "dflash", n_embd=64, n_layer=1, target_layers=[1, 3], seed=4)
    (d / "s.json").write_text(json.dumps(SCENARIO))
    return d / "draft.gguf", d / "s.json"


# -- what the runner reads off a draft ---------------------------------------------------------------

def test_the_metadata_the_runner_reads_off_a_draft(tmp_path):
    make_model(tmp_path / "a.gguf", "dflash", n_embd=32, n_layer=1, target_layers=[2, 5, 9])
    assert R.model_meta(tmp_path / "a.gguf") == {"n_embd": 32, "target_layers": [2, 5, 9], "causal": False,
                                                 "mrope": False, "lilicorr": False}
    make_model(tmp_path / "b.gguf", "lilicorr", n_embd=32, n_layer=1)
    assert R.model_meta(tmp_path / "b.gguf")["lilicorr"] is True


def test_a_batch_row_the_context_refuses_stops_the_step():
    assert R._added(0, None, 0) == 0 and R._added(17, None, 17) == 17
    with pytest.raises(R.ReferenceFailed, match=r"^llama_batch_ext refused row 3 \(error -1: the batch is full"):
        R._added(-1, None, 3)


def test_the_progress_line_follows_the_childs_last_phase(tmp_path):
    log = tmp_path / "errors.log"
    assert R._phase(log, 4) == "loading the model"  # no log yet
    lines = []

    def enter(phase):
        lines.append(json.dumps({"phase": phase, "level": "phase", "text": ""}))
        log.write_text("\n".join(lines + ["not json \"phase\""]) + "\n")
    enter("load")
    assert R._phase(log, 4) == "loading the model"
    enter("context")
    assert R._phase(log, 4) == "creating the context"
    enter("step 2")
    assert R._phase(log, 4) == "computing step 3 of 4"
    assert R._phase(log, None) == "computing step 3"
    enter("encoder")
    assert R._phase(log, 4) == "computing encoder"


# -- a scenario run in b11739 -------------------------------------------------------------------------

@pytest.mark.reference
def test_each_graph_of_the_scenario_is_dumped_as_b11739_ran_it(draft, tmp_path):
    model, sc = draft
    out = tmp_path / "ref"
    out.mkdir()
    # a dump of an earlier run in the folder is not taken for this run's
    (out / "07-block.json").write_text("{}")
    (out / "07-block.npz").write_bytes(b"")
    paths = R.run_reference(model, sc, out)
    # numbered by graph: the seq_rm step computes none
    assert [p.name for p in paths] == ["00-inject.json", "01-block.json", "02-inject.json"]
    assert sorted(p.name for p in out.glob("*.json")) == [p.name for p in paths]
    assert not (out / "07-block.npz").exists()
    dumps = load_dump_dir(out)
    assert [d.graph for d in dumps] == ["inject", "block", "inject"]
    for d in dumps:
        src = d.source
        assert (src["engine"], src["version"], src["backend"]) == ("llama.cpp", REFERENCE_BUILD, "CPU")
        assert d.model == "draft.gguf" and d.scenario["name"] == "s.json" and d.scenario_doc["seed"] == 3
        assert d.nodes and d.has_values
    settings = [d.settings for d in dumps]
    # inject graphs are causal, a DFlash block is not
    assert [s["causal"] for s in settings] == [True, False, True]
    assert all((s["n_ctx"], s["n_ubatch"], s["type_k"], s["flash_attn"]) == (64, 16, "f16", False) for s in settings)
    # llama.cpp's own log is kept beside the dumps
    assert "llama_model_loader" in (out / R.STDERR_LOG).read_text()


@pytest.mark.reference
def test_a_run_from_a_copy_of_the_scenario_records_no_file(draft, tmp_path):
    model, sc = draft
    R.run_reference(model, sc, tmp_path / "ref", stderr_log=None, recorded_as=None)
    (d,) = [d for d in load_dump_dir(tmp_path / "ref") if d.graph == "block"]
    assert "name" not in d.scenario and d.scenario_doc["seed"] == 3
    assert not (tmp_path / "ref" / R.STDERR_LOG).exists()


@pytest.mark.reference
def test_a_draft_without_its_tables_is_refused_before_b11739_sees_it(draft, tmp_path):
    model, sc = draft
    bare = rewrite(model, tmp_path / "bare.gguf", drop_tensors={"token_embd.weight"})
    with pytest.raises(R.ReferenceFailed) as e:
        R.run_reference(bare, sc, tmp_path / "ref", stderr_log=None)
    assert str(e.value).splitlines()[0] == (
        f"llama.cpp {REFERENCE_BUILD} failed (exit 4): bare.gguf: the draft has no 'token_embd.weight': it borrows "
        "the target model's (ctx_other); give the target (-m TARGET -md DRAFT, or \"target\" in the scenario)")
    assert e.value.returncode == 4 and e.value.stderr.startswith("graphgen: error: bare.gguf:")


@pytest.mark.reference
def test_a_step_b11739_refuses_names_the_step(draft, tmp_path):
    model, _ = draft
    sc = tmp_path / "s.json"
    # a causal context caps its batch at n_ctx: 47 rows do not fit 46
    sc.write_text(json.dumps({"n_ctx": 46, "n_ubatch": 64, "steps": [{"inject": {"n_tokens": 3}},
                                                                       {"inject": {"n_tokens": 47, "pos0": 3}}]}))
    with pytest.raises(R.ReferenceFailed) as e:
        R.run_reference(model, sc, tmp_path / "ref", stderr_log=None)
    assert str(e.value).splitlines()[0] == (f"llama.cpp {REFERENCE_BUILD} failed (exit 4): step 1 (inject): "
                                            "llama_batch_ext refused row 46 (error -1: the batch is full at its "
                                            "n_batch rows)")
    # the step that ran before the refusal was dumped
    assert [p.name for p in (tmp_path / "ref").glob("*.json")] == ["00-inject.json"]


@pytest.mark.reference
def test_the_server_runs_case_after_case(draft, tmp_path, reference_worker):
    model, sc = draft
    bare = rewrite(model, tmp_path / "bare.gguf", drop_tensors={"token_embd.weight"})
    for i, (m, ok) in enumerate(((model, True), (bare, False), (model, True))):
        req = {"id": f"c{i}", "model": str(m), "scenario": str(sc), "out": str(tmp_path / f"out{i}"),
               "max_data": 1024, "log": str(tmp_path / f"c{i}.log")}
        res, err = reference_worker.ask(req)
        assert err == "" and res["id"] == f"c{i}" and res["ok"] is ok, res
        if ok:
            assert res["error"] == "" and len(list((tmp_path / f"out{i}").glob("*.json"))) == 3
        else:
            assert res["error"].startswith("graphgen: error: bare.gguf: the draft has no 'token_embd.weight'")
