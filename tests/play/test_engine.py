"""graphgen.play.engine: a scenario run in graphgen's engine: one dump per graph step, named by
evaluation index and kind, with the header that says what ran (engine, ggml, CPU features, the
model's sha256, the scenario) and the settings of each graph; values kept up to max_data."""

import hashlib
import json

import numpy as np
from conftest import REF_DIR
from make_references import build_model

from graphgen import __version__
from graphgen.compare.pairing import diff_paths
from graphgen.dump.format import dump_files, load_dump, scenario_digest
from graphgen.play.engine import engine_header, run_scenario
from graphgen.play.scenario import load_scenario, parse_scenario
from graphgen.synth import make_model

CASE = REF_DIR / "dflash-fa-off"


def test_dumps_of_every_graph_with_what_ran(tmp_path, models_dir):
    model = build_model(CASE, models_dir)
    sc = load_scenario(CASE / "scenario.json")
    results = run_scenario(model, sc, tmp_path, scenario_path=CASE / "scenario.json")
    assert [(step.kind, path.name) for step, _, path in results] == [("inject", "00-inject.json"),
                                                                     ("block", "01-block.json")]
    assert [p.name for p in dump_files(tmp_path)] == ["00-inject.json", "01-block.json"]
    d = load_dump(tmp_path / "01-block.json")
    assert d.source["engine"] == "graphgen" and d.source["version"] == __version__
    assert {"ggml", "ggml_dir", "ggml_origin"} <= set(d.source) and d.cpu_features
    assert d.model == model.name and d.model_sha256 == hashlib.sha256(model.read_bytes()).hexdigest()
    assert d.scenario["digest"] == scenario_digest(sc.to_dict()) and d.scenario["name"] == "scenario.json"
    assert d.scenario["path"] == str((CASE / "scenario.json").resolve()) and d.scenario["seed"] == 1
    assert d.scenario_doc == sc.to_dict()
    # each graph's settings, n_kv read off the graph it ran
    assert d.settings["n_ctx"] == 256 and d.settings["flash_attn"] is False and d.settings["n_kv"] == 256
    assert d.settings["type_k"] == "f16" and load_dump(tmp_path / "00-inject.json").graph == "inject"
    # and the graphs are b11739's, value for value
    assert all(r.identical for r in diff_paths(CASE, tmp_path))


def test_without_a_folder_nothing_is_written(tmp_path, models_dir):
    model = build_model(CASE, models_dir)
    results = run_scenario(model, load_scenario(CASE / "scenario.json"))
    assert [path for _, _, path in results] == [None, None]
    block = results[1][1]
    assert block.logits.shape == (4, 256) and np.isfinite(block.logits).all()


def test_steps_without_a_graph_and_max_data(tmp_path):
    model = make_model(tmp_path / "m.gguf", "dflash")["path"]
    sc = parse_scenario({"steps": [{"inject": {"n_tokens": 6}}, {"block": {"tokens": [7, 255, 255, 255], "pos0": 6}},
                                   {"seq_rm": {"seq": 0, "p0": 6, "p1": -1}},
                                   {"block": {"tokens": [8, 255, 255, 255], "pos0": 6}}]})
    results = run_scenario(model, sc, tmp_path / "d", max_data=64)
    # the seq_rm step evaluates no graph: no result, no dump; dumps number the graphs evaluated
    assert [p.name for p in dump_files(tmp_path / "d")] == ["00-inject.json", "01-block.json", "02-block.json"]
    assert [(s.kind, s.index, p.name) for s, _, p in results] == [("inject", 0, "00-inject.json"),
                                                                  ("block", 1, "01-block.json"),
                                                                  ("block", 3, "02-block.json")]
    d = load_dump(tmp_path / "d" / "02-block.json")
    kept = [n for n in d.nodes if d.values(n.index) is not None]
    # nodes over 64 elements keep their digest only, but the outputs (embeddings, logits) are kept whole
    assert {n.name for n in kept if n.nelements > 64} == {"result_norm", "result_output"}
    assert "l_out-0" not in {n.name for n in kept} and all(n.nelements <= 64 for n in kept if n.name[:7] != "result_")
    assert all(n.digest for n in d.nodes if n.type == "f32")


def test_engine_header(tmp_path):
    h = engine_header("m.gguf")
    assert h["model"] == "m.gguf" and h["source"]["engine"] == "graphgen" and "model_sha256" not in h
    model = tmp_path / "m.gguf"
    model.write_bytes(b"abc")
    sc = parse_scenario({"seed": 7, "steps": [{"inject": {"n_tokens": 1}}]})
    h = engine_header("m.gguf", model, sc)
    assert h["model_sha256"] == hashlib.sha256(b"abc").hexdigest()
    assert h["scenario"]["seed"] == 7 and "name" not in h["scenario"]
    assert json.loads(json.dumps(h)) == h
