import hashlib
import json
import os
import re

import numpy as np
import pytest

import graphgen.dump.format as D
from graphgen.dump.format import FORMAT, DumpError, Node, load_dump, load_dump_dir, write_dump
from graphgen.play.scenario import parse_scenario

HEADER = {
    "source": {"engine": "graphgen", "version": "0.1"},
    "model": "tiny.gguf",
    "settings": {"flash_attn": False, "type_k": "f16", "type_v": "f16", "n_ctx": 256,
                 "n_ubatch": 8, "n_kv": None, "causal": True},
    "cpu_features": {"AVX": True, "AVX2": True, "AVX512": False, "F16C": True, "FMA": True},
}


def make_nodes():
    return [
        Node(0, "inp_embd", "GET_ROWS", "f32", [8, 3, 1, 1], ["token_embd.weight", "inp_tokens"]),
        Node(1, "norm-0", "RMS_NORM", "f32", [8, 3, 1, 1], ["inp_embd"],
             op_params=[0x3727C5AC] + [0] * 15),
        Node(2, "node_2", "VIEW", "f32", [8, 1, 1, 1], ["norm-0"], view_src="norm-0", view_offs=32),
        Node(3, "pos", "ARANGE", "i32", [3, 1, 1, 1], []),
    ]


def write_sample(tmp_path, seq=0, graph="block"):
    nodes = make_nodes()
    rng = np.random.default_rng(0)
    values = {0: rng.standard_normal((1, 1, 3, 8)), 1: rng.standard_normal(24),
              3: np.arange(3, dtype=np.int32)}
    return write_dump(tmp_path, seq, graph, HEADER, nodes, values), nodes, values


def test_round_trip(tmp_path):
    path, nodes, values = write_sample(tmp_path)
    assert path.name == "00-block.json"
    d = load_dump(path)
    assert d.format == FORMAT and d.graph == "block" and d.model == "tiny.gguf" and d.seq == 0
    assert d.settings == HEADER["settings"] and d.cpu_features == HEADER["cpu_features"]
    assert d.source == HEADER["source"]
    assert d.nodes == nodes
    assert d.has_values
    v0 = d.values(0)
    assert v0.dtype == np.float32 and v0.shape == (1, 1, 3, 8)
    np.testing.assert_array_equal(v0, values[0].astype(np.float32))
    assert d.values(1).shape == (1, 1, 3, 8)  # stored flat, read back in numpy shape
    np.testing.assert_array_equal(d.values(3).ravel(), [0, 1, 2])
    assert d.values(2) is None  # not stored
    d.close()


def test_write_is_stable_and_skips_big_values(tmp_path):
    path, nodes, _ = write_sample(tmp_path)
    first = path.read_text()
    write_dump(tmp_path, 0, "block", HEADER, nodes, {0: np.zeros(24)}, max_data=10)
    assert path.read_text() == first
    assert not path.with_suffix(".npz").exists()  # nothing small enough: no stale values left
    assert not load_dump(path).has_values


@pytest.mark.parametrize("where", ["member", "close"])
def test_an_interrupted_write_leaves_nothing_behind(tmp_path, monkeypatch, where):
    """Ctrl-C while the values are written: the earlier dump stays whole, no temporary file is
    left, and no half-written archive later writes to the closed file from its finalizer."""
    import gc
    import sys
    import zipfile
    path, nodes, values = write_sample(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    if where == "close":
        real_close = zipfile.ZipFile.close
        calls = []

        def close(self):
            calls.append(1)
            if len(calls) == 1:
                raise KeyboardInterrupt  # the signal lands as the archive's close begins
            return real_close(self)
        monkeypatch.setattr(zipfile.ZipFile, "close", close)
    else:
        def write_array(*a, **k):
            raise KeyboardInterrupt
        monkeypatch.setattr(np.lib.format, "write_array", write_array)
    with pytest.raises(KeyboardInterrupt):
        write_dump(tmp_path, 0, "block", HEADER, nodes, {0: np.ones(24), 1: np.zeros(24)})
    gc.collect()
    assert unraisable == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_load_dump_dir_orders_by_index(tmp_path):
    write_sample(tmp_path, 1, "block")
    write_sample(tmp_path, 0, "inject")
    write_sample(tmp_path, 10, "block")
    (tmp_path / "notes.json").write_text("{}")
    assert [(d.seq, d.graph) for d in load_dump_dir(tmp_path)] == [(0, "inject"), (1, "block"), (10, "block")]


def test_load_dump_dir_empty(tmp_path):
    with pytest.raises(DumpError, match="no dump files"):
        load_dump_dir(tmp_path)


def corrupt(tmp_path, edit):
    path, _, _ = write_sample(tmp_path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return path


def check_error(path, *fragments):
    with pytest.raises(DumpError) as info:
        load_dump(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg
    for f in fragments:
        assert f in msg
    return msg


def test_bad_json(tmp_path):
    path = tmp_path / "00-block.json"
    path.write_text('{"format": "graphgen-dump/1",\n "nodes": [')
    check_error(path, "invalid JSON", "line 2")


def test_missing_file(tmp_path):
    check_error(tmp_path / "00-block.json", "no such file")


def test_wrong_format_tag(tmp_path):
    path = corrupt(tmp_path, lambda d: d.update(format="graphgen-dump/2"))
    check_error(path, "'format'", "graphgen-dump/2")


def test_missing_format(tmp_path):
    path = corrupt(tmp_path, lambda d: d.pop("format"))
    check_error(path, "missing field 'format'")


def test_missing_field(tmp_path):
    path = corrupt(tmp_path, lambda d: d["settings"].pop("n_ubatch"))
    check_error(path, "missing field 'settings.n_ubatch'")


def test_missing_node_field(tmp_path):
    path = corrupt(tmp_path, lambda d: d["nodes"][2].pop("view_offs"))
    check_error(path, "missing field", "nodes[2]", "node_2", "view_offs")


def test_ne_of_three(tmp_path):
    path = corrupt(tmp_path, lambda d: d["nodes"][1].update(ne=[8, 3, 1]))
    check_error(path, "nodes[1]", "norm-0", ".ne", "4 non-negative ints", "[8, 3, 1]")


def test_duplicate_index(tmp_path):
    path = corrupt(tmp_path, lambda d: d["nodes"][2].update(index=1))
    check_error(path, "nodes[2].index", "duplicate index 1")


def test_index_gap(tmp_path):
    path = corrupt(tmp_path, lambda d: d["nodes"][2].update(index=5))
    check_error(path, "nodes[2].index", "expected 2")


def test_src_not_list(tmp_path):
    path = corrupt(tmp_path, lambda d: d["nodes"][1].update(src="inp_embd"))
    check_error(path, "nodes[1]", ".src", "list of source names")


def test_src_not_strings(tmp_path):
    path = corrupt(tmp_path, lambda d: d["nodes"][1].update(src=[None]))
    check_error(path, ".src", "list of strings")


def test_op_params_length(tmp_path):
    path = corrupt(tmp_path, lambda d: d["nodes"][1].update(op_params=[0] * 15))
    check_error(path, ".op_params", "16 int32")


def test_bool_is_not_int(tmp_path):
    path = corrupt(tmp_path, lambda d: d["settings"].update(n_ctx=True))
    check_error(path, "settings.n_ctx", "an int")


def test_graph_must_match_file_name(tmp_path):
    path = corrupt(tmp_path, lambda d: d.update(graph="inject"))
    check_error(path, "'graph'", "file name")


def test_too_many_nodes(tmp_path, monkeypatch):
    import graphgen.dump.format as dump
    path, _, _ = write_sample(tmp_path)
    monkeypatch.setattr(dump, "MAX_NODES", 3)
    check_error(path, "'nodes'", "limit")


def test_values_shape_mismatch(tmp_path):
    path, nodes, _ = write_sample(tmp_path)
    np.savez_compressed(path.with_suffix(".npz"), n0=np.zeros(5, dtype=np.float32))
    with pytest.raises(DumpError, match="'n0' has 5 elements"):
        load_dump(path).values(0)


def test_write_validates(tmp_path):
    bad = make_nodes()
    bad[1].ne = [8, 3, 1]
    with pytest.raises(DumpError, match=r"nodes\[1\]"):
        write_dump(tmp_path, 0, "block", HEADER, bad, {})
    with pytest.raises(DumpError, match="have 5 elements"):
        write_dump(tmp_path, 0, "block", HEADER, make_nodes(), {0: np.zeros(5)})
    assert not list(tmp_path.iterdir())


# ---- provenance: the model's sha256, the scenario, its seed ------------------------------------

SCENARIO = {"n_ctx": 64, "n_ubatch": 8, "seed": 5,
            "steps": [{"inject": {"n_tokens": 2, "pos0": 0}}, {"block": {"tokens": [1, 2], "pos0": 2}}]}


def canonical_digest(sc) -> str:
    return hashlib.sha256(json.dumps(sc.to_dict(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(D, "_sha_memo", {})
    return tmp_path / "cache"


def test_provenance_round_trip(tmp_path, cache):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 50)
    (tmp_path / "s.json").write_text(json.dumps(SCENARIO))
    sc = parse_scenario(SCENARIO)
    header = dict(HEADER, **D.provenance(model, sc, tmp_path / "s.json"))
    p = write_dump(tmp_path / "d", 0, "block", header, make_nodes())
    d = load_dump(p)
    assert d.model_sha256 == hashlib.sha256(model.read_bytes()).hexdigest()
    assert d.scenario == {"digest": canonical_digest(sc), "name": "s.json", "path": str(tmp_path / "s.json"),
                          "seed": 5}
    # the whole document, defaults spelled out, beside the digest in the file; apart from
    # `scenario` once read, so what reports show of it stays short
    whole = {"n_ctx": 64, "n_ubatch": 8, "flash_attn": "off", "type_kv": "f16", "seed": 5, "n_seq": 1,
             "n_threads": 1, "steps": [{"inject": {"n_tokens": 2, "pos0": 0, "seq": 0}},
                                       {"block": {"seqs": [{"seq": 0, "tokens": [1, 2], "pos0": 2,
                                                            "embd_state": "context"}]}}]}
    assert json.loads(p.read_text())["scenario"]["doc"] == whole
    assert d.scenario_doc == whole
    assert D.recorded_scenario(tmp_path / "d") == (whole, p)
    assert parse_scenario(d.scenario_doc) == sc


def test_dump_without_provenance_still_loads(tmp_path):
    p, _, _ = write_sample(tmp_path)
    doc = json.loads(p.read_text())
    assert "model_sha256" not in doc and "scenario" not in doc
    d = load_dump(p)
    assert d.model_sha256 is None and d.scenario is None


@pytest.mark.parametrize("key,value,fragment", [
    ("model_sha256", "abc", "'model_sha256'"),
    ("scenario", [1], "'scenario'"),
    ("scenario", {"digest": "zz"}, "'scenario.digest'"),
    ("scenario", {"seed": "1"}, "'scenario.seed'"),
    ("scenario", {"name": 3}, "'scenario.name'"),
    ("scenario", {"doc": [1]}, "'scenario.doc'"),
])
def test_bad_provenance_field(tmp_path, key, value, fragment):
    p, _, _ = write_sample(tmp_path)
    doc = json.loads(p.read_text())
    doc[key] = value
    p.write_text(json.dumps(doc))
    with pytest.raises(DumpError) as e:
        load_dump(p)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_scenario_digest_is_canonical():
    a = parse_scenario(SCENARIO)
    # other key order, a default spelled out: the same run
    b = parse_scenario({"steps": SCENARIO["steps"], "seed": 5, "n_ubatch": 8, "n_ctx": 64, "n_seq": 1})
    c = parse_scenario(dict(SCENARIO, seed=6))
    da, db, dc = (D.provenance(scenario=x)["scenario"]["digest"] for x in (a, b, c))
    assert da == db == canonical_digest(a) and dc != da


def test_model_sha256_hashed_once_per_path_mtime_size(tmp_path, cache):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 1000)
    st = model.stat()
    first = D.model_sha256(model)
    assert first == hashlib.sha256(b"x" * 1000).hexdigest()
    assert (cache / "model-sha256.json").is_file()
    # same size and mtime: neither this process nor another (empty memo) reads the file again
    model.write_bytes(b"y" * 1000)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert D.model_sha256(model) == first
    D._sha_memo.clear()
    assert D.model_sha256(model) == first
    # a new mtime is a new file
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert D.model_sha256(model) == hashlib.sha256(b"y" * 1000).hexdigest()
    # and a new size
    model.write_bytes(b"y" * 999)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert D.model_sha256(model) == hashlib.sha256(b"y" * 999).hexdigest()


@pytest.mark.reference
def test_both_engines_record_provenance(tmp_path, models_dir, cache, capsys):
    from conftest import REF_DIR
    from make_references import build_model

    from graphgen.cli import main as cli_main
    from graphgen.play.scenario import load_scenario
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, models_dir)
    scen = case / "scenario.json"
    for engine in ("graphgen", "llama.cpp"):
        assert cli_main(["dump", str(model), "--scenario", str(scen), "--out", str(tmp_path / engine),
                         "--engine", engine]) == 0
    want_sha = hashlib.sha256(model.read_bytes()).hexdigest()
    sc = load_scenario(scen)
    for engine in ("graphgen", "llama.cpp"):
        for d in load_dump_dir(tmp_path / engine):
            assert d.source["engine"] == engine
            assert d.model_sha256 == want_sha
            assert d.scenario == {"digest": canonical_digest(sc), "name": "scenario.json",
                                  "path": str(scen.resolve()), "seed": sc.seed}
    capsys.readouterr()
    assert cli_main(["diff", str(tmp_path / "llama.cpp"), str(tmp_path / "graphgen")]) == 0
    assert "warning:" not in capsys.readouterr().out
    # another seed: another scenario, said plainly, values still compared
    other = tmp_path / "seed2.json"
    other.write_text(json.dumps(dict(json.loads(scen.read_text()), seed=sc.seed + 1)))
    assert cli_main(["dump", str(model), "--scenario", str(other), "--out", str(tmp_path / "g2")]) == 0
    capsys.readouterr()
    assert cli_main(["diff", str(tmp_path / "llama.cpp"), str(tmp_path / "g2")]) == 1
    out = capsys.readouterr().out
    assert out.count("warning: the two sides ran different scenarios") == 2
    assert f"seed {sc.seed + 1}" in out and "numeric failures:" in out


@pytest.mark.parametrize("engine", ["graphgen", "llama.cpp"])
def test_every_node_carries_its_statistics_and_digest(tmp_path, engine):
    """A dump that keeps no values (max_data 0) still carries, for every node with readable values,
    a digest of its bytes and the statistics the diff uses to locate a change; both must describe
    the values the same run keeps when asked to."""
    import json as _json

    from graphgen.play.engine import run_scenario
    from graphgen.reference.runner import run_reference
    from graphgen.synth import make_model
    model = tmp_path / "d.gguf"
    make_model(model, "dflash2", "base")
    doc = {"n_ctx": 256, "n_ubatch": 16, "flash_attn": "off", "type_kv": "f16", "seed": 2,
           "steps": [{"inject": {"n_tokens": 5}}, {"block": {"tokens": [3, 255, 255, 255], "pos0": 5}}]}
    sc = tmp_path / "s.json"
    sc.write_text(_json.dumps(doc))
    for name, max_data in (("lean", 0), ("full", 1 << 40)):
        if engine == "graphgen":
            run_scenario(model, parse_scenario(doc), tmp_path / name, max_data=max_data)
        else:
            run_reference(model, sc, tmp_path / name, max_data=max_data)
    checked = 0
    for lean, full in zip(load_dump_dir(tmp_path / "lean"), load_dump_dir(tmp_path / "full")):
        dtypes = {"f32": np.float32, "f16": np.float16, "i32": np.int32}
        for node in lean.nodes:
            v = full.values(node.index)
            if v is None or node.type not in dtypes:
                continue  # a quantized cache's rows: no float values to describe
            x = v.astype(np.float64).ravel()
            fin = x[np.isfinite(x)]
            want = {"count": x.size, "sum": fin.sum(), "sumsq": float(np.dot(fin, fin)),
                    "min": fin.min() if fin.size else None, "max": fin.max() if fin.size else None,
                    "nan": int(np.isnan(x).sum()), "inf": int(np.isinf(x).sum())}
            assert node.stats is not None, node.name
            for k, w in want.items():
                assert node.stats[k] == pytest.approx(w, rel=1e-12, abs=0), (node.name, k)
            raw = np.ascontiguousarray(v.astype(dtypes[node.type])).tobytes()
            assert node.digest == hashlib.sha256(raw).hexdigest(), node.name
            checked += 1
    assert checked > 40


# ---- a scenario refused part way ----------------------------------------------------------------

@pytest.mark.parametrize("engine", ["graphgen", "llama.cpp"])
def test_a_step_refused_part_way_is_named_and_its_graphs_kept_apart(tmp_path, engine):
    """The KV cache fills at step 46 (a block): the refusal names the step, OUT stays as it was,
    and the 32 graphs before it are in OUT.incomplete/ with a file INCOMPLETE saying why; a
    second run replaces that folder, one of the user's own of that name is left alone."""
    import subprocess
    import sys
    from graphgen.synth import make_model
    model = tmp_path / "m.gguf"
    make_model(model, "dflash")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "graphgen.cli", "dump", str(model), "--prompt", "200", "-c", "256", "--steps", "20",
           "--out", str(out), "--engine", engine]
    for _ in range(2):
        p = subprocess.run(cmd, capture_output=True, text=True)
        (line,) = [x for x in p.stderr.splitlines() if x.startswith("graphgen: error:")]
        assert p.returncode == 2 and "step 46 (block): " in line, p.stderr
        assert line.endswith(f"the 32 graph(s) before it are in {out}.incomplete/ (marked INCOMPLETE)"), line
        kept = tmp_path / "out.incomplete"
        assert not out.exists() and len(D.dump_files(kept)) == 32
        why = (kept / "INCOMPLETE").read_text()
        assert "step 46 (block)" in why and "32 graph(s)" in why
    # a folder of that name that graphgen did not make: untouched, and not offered as the graphs'
    (kept / "INCOMPLETE").unlink()
    before = sorted(p.name for p in kept.iterdir())
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 2 and "step 46 (block)" in p.stderr and ".incomplete" not in p.stderr
    assert sorted(p.name for p in kept.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out.incomplete"]


def test_run_scenario_names_the_refused_step(tmp_path):
    from graphgen.play.engine import run_scenario
    from graphgen.errors import BatchError
    from graphgen.synth import make_model
    model = tmp_path / "m.gguf"
    make_model(model, "dflash")
    sc = parse_scenario({"n_ctx": 256, "n_ubatch": 8, "steps": [
        {"inject": {"n_tokens": 6, "pos0": 0}}, {"seq_rm": {"seq": 0, "p0": 6, "p1": -1}},
        {"block": {"pos0": 2, "tokens": [7, 255, 255, 255]}}]})
    with pytest.raises(BatchError, match=r"^step 2 \(block\): sequence 0") as e:
        run_scenario(model, sc, tmp_path / "d")
    assert e.value.step.index == 2 and e.value.step.kind == "block"


# ---- what a node is re-run alone from: inputs, source indices, strides, quantized blocks --------

def _rerunnable(tmp_path):
    from graphgen.dump.format import Input
    nodes = make_nodes()
    nodes[1].src_at, nodes[1].nb = [0], [4, 32, 96, 96]
    nodes[0].src_input = [None, 1]
    nodes.append(Node(4, "cache_k (view)", "SET_ROWS", "q8_0", [32, 2, 1, 1], ["inp_embd", "idx", "cache_k"],
                      src_at=[0, None, None]))
    inputs = [(Input("mask", "f16", [4, 3, 1, 1]), np.zeros((3, 4), np.float32)),
              (Input("inp_tokens", "i32", [3, 1, 1, 1]), np.array([5, 6, 7], np.int32)),
              (Input("mask", "f16", [4, 3, 1, 1]), np.full((3, 4), -np.inf, np.float32))]
    rows = np.arange(2 * 34, dtype=np.uint8).reshape(1, 1, 2, 34)
    return nodes, inputs, rows


def test_inputs_source_indices_strides_and_blocks_round_trip(tmp_path):
    nodes, inputs, rows = _rerunnable(tmp_path)
    path = write_dump(tmp_path, 0, "block", HEADER, nodes, {}, inputs=inputs, qrows={4: rows})
    d = load_dump(path)
    assert d.nodes == nodes
    assert [i.name for i in d.inputs] == ["mask", "inp_tokens", "mask"]  # a name may repeat
    assert d.input_values(1).ravel().tolist() == [5, 6, 7] and d.input_values(1).dtype == np.int32
    assert np.isneginf(d.input_values(2)).all() and not np.isneginf(d.input_values("mask")).any()
    assert np.array_equal(d.qrows(4), rows) and d.qrows(1) is None


@pytest.mark.parametrize("field, value, says", [
    ("src_at", [1], "nodes[1] ('norm-0').src_at"),          # a source after its reader
    ("src_at", [0, 0], "nodes[1] ('norm-0').src_at"),       # one index per source
    ("nb", [4, 32], "nodes[1] ('norm-0').nb"),
    ("src_input", [7], "nodes[1] ('norm-0').src_input"),  # no such input
])
def test_a_malformed_rerun_field_names_itself(tmp_path, field, value, says):
    nodes, inputs, rows = _rerunnable(tmp_path)
    path = write_dump(tmp_path, 0, "block", HEADER, nodes, {}, inputs=inputs)
    doc = json.loads(path.read_text())
    doc["nodes"][1][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(DumpError, match=f"field '{re.escape(says)}'"):
        load_dump(path)


def test_quantized_rows_of_the_wrong_shape_are_refused(tmp_path):
    nodes, inputs, rows = _rerunnable(tmp_path)
    with pytest.raises(DumpError, match=r"quantized rows of node 4 \('cache_k \(view\)'\)"):
        write_dump(tmp_path, 0, "block", HEADER, nodes, {}, inputs=inputs, qrows={4: rows.reshape(1, 2, 1, 34)})
