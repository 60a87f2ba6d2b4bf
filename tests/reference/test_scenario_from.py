"""Every dump records the whole scenario it ran, and `--scenario-from DUMP` reruns it exactly.

The scenario the flags describe is written out by hand here (the drafting loop of
graphgen/cli/llamaflags.py's docstring); what ran is read back from the graphs themselves (the
token rows the block looked up, the features the inject multiplied), never from the code that
records it."""

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REF_DIR

CLI = [sys.executable, "-m", "graphgen.cli"]
# the command: two sequences, a 40-row prompt in chunks of 32, two rounds, a q8_0 K cache
FLAGS = ["-fa", "on", "-c", 512, "-ub", 32, "-np", 2, "-ctk", "q8_0", "--prompt", 40, "--steps", 2]
MASK = 255  # make-model's mask token: the last id of its 256-token vocabulary


def _block(pos0):
    return {"block": {"seqs": [{"seq": 0, "pos0": pos0, "tokens": [7, MASK, MASK, MASK], "embd_state": "context"},
                               {"seq": 1, "pos0": pos0, "tokens": [8, MASK, MASK, MASK], "embd_state": "context"}]}}


EXPECTED = {"n_ctx": 512, "n_ubatch": 32, "flash_attn": "on", "type_k": "q8_0", "type_v": "f16", "seed": 1,
            "n_seq": 2, "n_threads": 1, "steps": [
                {"inject": {"n_tokens": 32, "pos0": 0, "seq": 0}}, {"inject": {"n_tokens": 8, "pos0": 32, "seq": 0}},
                {"inject": {"n_tokens": 32, "pos0": 0, "seq": 1}}, {"inject": {"n_tokens": 8, "pos0": 32, "seq": 1}},
                _block(40),
                {"seq_rm": {"seq": -1, "p0": 40, "p1": -1}},
                {"inject": {"n_tokens": 4, "pos0": 40, "seq": 0}}, {"inject": {"n_tokens": 4, "pos0": 40, "seq": 1}},
                _block(44)]}


def run(*args, cwd=None):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, cwd=cwd)


def ok(*args, cwd=None):
    p = run(*args, cwd=cwd)
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # head size 32: q8_0's blocks of 32 values must divide it
    path = tmp_path_factory.mktemp("model") / "d.gguf"
    ok("make-model", path, "--head-dim", 32, "--block-size", 4)
    return path


@pytest.fixture(scope="module")
def dumped(model, tmp_path_factory):
    """A dump from the flags (A) and its rerun from A (B), in graphgen's engine."""
    tmp = tmp_path_factory.mktemp("graphgen")
    ok("dump", "-m", model, *FLAGS, "--out", tmp / "A")
    ok("dump", "-m", model, "--scenario-from", tmp / "A", "--out", tmp / "B")
    return tmp


def _docs(folder):
    return [json.loads(p.read_text()) for p in sorted(folder.glob("[0-9][0-9]-*.json"))]


def assert_bit_identical(a, b, graphs=("inject",) * 4 + ("block",) + ("inject",) * 2 + ("block",)):
    """graphgen diff says IDENTICAL, and every node's digest and stored values agree byte for byte."""
    p = run("diff", a, b)
    assert p.returncode == 0, p.stdout[-2000:]
    assert f"{len(graphs)} graphs compared, 0 diverged" in p.stdout
    da, db = _docs(a), _docs(b)
    assert [d["graph"] for d in da] == [d["graph"] for d in db] == list(graphs)
    for x, y in zip(da, db):
        assert [(n["name"], n["op"], n["digest"]) for n in x["nodes"]] == \
               [(n["name"], n["op"], n["digest"]) for n in y["nodes"]]
    for fa in sorted(a.glob("*.npz")):
        with np.load(fa) as va, np.load(b / fa.name) as vb:
            assert sorted(va.files) == sorted(vb.files) and va.files
            for k in va.files:
                assert va[k].dtype == vb[k].dtype and va[k].tobytes() == vb[k].tobytes(), (fa.name, k)


def assert_records(folder, expected):
    for d in _docs(folder):
        sc = d["scenario"]
        # the document's own digest, as the canonical JSON of what it says
        canon = json.dumps(sc["doc"], sort_keys=True, separators=(",", ":")).encode()
        assert sc["digest"] == hashlib.sha256(canon).hexdigest()
        assert sc["doc"] == expected


def test_rerun_is_bit_identical(dumped):
    assert_bit_identical(dumped / "A", dumped / "B")


def test_the_recorded_scenario_is_what_the_flags_ran(dumped, model):
    assert_records(dumped / "A", EXPECTED)
    assert_records(dumped / "B", EXPECTED)
    # the rerun names the dump it came from; the run from flags had no file to name
    a, b = _docs(dumped / "A")[0]["scenario"], _docs(dumped / "B")[0]["scenario"]
    assert "name" not in a and "path" not in a and a["seed"] == 1
    assert b["name"] == "A" and b["path"] == str((dumped / "A").resolve())
    # what ran, read from the graphs: each block looked up its recorded tokens' embedding rows, and
    # each inject multiplied the features drawn from seed + its step index
    import gguf
    weights = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(model)).tensors}
    emb = weights["token_embd.weight"].reshape(-1, 64)
    steps = [s for s in EXPECTED["steps"] if "seq_rm" not in s]
    index = [i for i, s in enumerate(EXPECTED["steps"]) if "seq_rm" not in s]
    for k, (step, i) in enumerate(zip(steps, index)):
        name = f"{k:02d}-{'block' if 'block' in step else 'inject'}"
        nodes = json.loads((dumped / "A" / f"{name}.json").read_text())["nodes"]
        with np.load(dumped / "A" / f"{name}.npz") as v:
            if "block" in step:
                j = next(n["index"] for n in nodes if n["name"] == "inp_noise_embd")
                tokens = [t for s in step["block"]["seqs"] for t in s["tokens"]]
                assert np.array_equal(v[f"n{j}"].reshape(-1, 64), emb[tokens])
            else:
                n = step["inject"]["n_tokens"]
                fc = weights["fc.weight"]
                x = np.random.default_rng(EXPECTED["seed"] + i).standard_normal((n, fc.shape[-1]), dtype=np.float32)
                got = v["n0"].reshape(n, -1)
                np.testing.assert_allclose(got, x @ fc.reshape(-1, fc.shape[-1]).T, rtol=1e-4, atol=1e-4)


def test_the_hand_written_scenario_runs_the_same_graphs(dumped, model, tmp_path):
    sf = tmp_path / "s.json"
    sf.write_text(json.dumps(EXPECTED))
    ok("dump", "-m", model, "--scenario", sf, "--out", tmp_path / "F")
    assert_bit_identical(dumped / "A", tmp_path / "F")


def test_from_one_dump_file_and_with_flags_over_it(dumped, model, tmp_path):
    ok("dump", model, "--scenario-from", dumped / "A" / "07-block.json", "--out", tmp_path / "C")
    assert_bit_identical(dumped / "A", tmp_path / "C")
    # a flag overrides the recorded field, as over a --scenario file
    ok("dump", model, "--scenario-from", dumped / "B", "-ctk", "f16", "--seed", 4, "--out", tmp_path / "D")
    assert_records(tmp_path / "D", dict({k: v for k, v in EXPECTED.items() if k not in ("type_k", "type_v")},
                                        type_kv="f16", seed=4))


def test_trace_xdiff_and_bench_take_it(dumped, model):
    a = ok("trace", "-m", model, "--scenario-from", dumped / "A")
    b = ok("trace", "-m", model, *FLAGS)
    assert a.stdout == b.stdout and a.stdout.count("inp_noise_embd") >= 2
    p = ok("xdiff", "-m", model, "--scenario-from", dumped / "A", "-dev", "CPU,cpu", "--json")
    assert json.loads(p.stdout)["backends"] == ["cpu", "cpu"]
    p = ok("bench", "-m", model, "--scenario-from", dumped / "A", "--engine", "graphgen", "--repeat", 1, "--json")
    (res,) = json.loads(p.stdout)["runs"]
    # one timed step per graph of the recorded scenario, of its sizes
    assert [s["n_tokens"] for s in res["steps"]] == [32, 8, 32, 8, 8, 4, 4, 8]


def one_line_error(p, *fragments):
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphgen: error: "), p.stderr
    for f in fragments:
        assert str(f) in lines[0], lines[0]


def test_refusals(dumped, model, tmp_path):
    out = tmp_path / "o"
    # a dump made before dumps recorded their scenario: the committed references
    old = REF_DIR / "dflash-fa-off"
    one_line_error(run("dump", model, "--scenario-from", old, "--out", out), old / "00-inject.json",
                   "records no scenario")
    # an imported eval-callback log, and the log itself
    log = tmp_path / "trace.txt"
    log.write_text(ok("trace", "-m", model, "--scenario-from", dumped / "A").stdout)
    ok("import", log, "--out", tmp_path / "imp")
    one_line_error(run("dump", model, "--scenario-from", tmp_path / "imp", "--out", out),
                   tmp_path / "imp" / "00-inject.json", "records no scenario", "imported")
    one_line_error(run("dump", model, "--scenario-from", log, "--out", out), log, "not a graphgen-dump/1 dump")
    # a plain scenario file is no dump
    sf = tmp_path / "s.json"
    sf.write_text(json.dumps(EXPECTED))
    one_line_error(run("dump", model, "--scenario-from", sf, "--out", out), sf, "not a graphgen-dump/1 dump")
    # an edited document no longer is what ran
    edited = tmp_path / "edited"
    edited.mkdir()
    doc = json.loads((dumped / "A" / "04-block.json").read_text())
    doc["scenario"]["doc"]["steps"][4]["block"]["seqs"][0]["tokens"][0] = 9
    (edited / "04-block.json").write_text(json.dumps(doc))
    one_line_error(run("dump", model, "--scenario-from", edited, "--out", out), edited / "04-block.json",
                   "'scenario.doc'", "digest")
    # the two ways of giving a scenario, and building one over a recorded one
    p = run("dump", model, "--scenario-from", dumped / "A", "--scenario", sf, "--out", out)
    assert p.returncode == 2 and "not allowed with argument" in p.stderr
    one_line_error(run("dump", model, "--scenario-from", dumped / "A", "--steps", 3, "--out", out),
                   "--steps", f"--scenario-from {dumped / 'A'}")
    one_line_error(run("dump", model, "--scenario-from", tmp_path / "nowhere", "--out", out), tmp_path / "nowhere")
    assert not out.exists()


def test_a_refusal_before_the_first_graph_is_the_error(tmp_path):
    # the q8_0 cache does not fit make-model's default head size of 16: nothing was written, and
    # the refusal itself is what the command says
    model = tmp_path / "d.gguf"
    ok("make-model", model)
    one_line_error(run("dump", "-m", model, *FLAGS, "--out", tmp_path / "o"), "q8_0", "n_embd_head_k=16")
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.incomplete").exists()


@pytest.mark.reference
def test_rerun_in_llama_cpp(model, tmp_path):
    ok("dump", "-m", model, *FLAGS, "--engine", "llama.cpp", "--out", tmp_path / "A")
    ok("dump", "-m", model, "--scenario-from", tmp_path / "A", "--engine", "llama.cpp", "--out", tmp_path / "B")
    assert_bit_identical(tmp_path / "A", tmp_path / "B")
    assert_records(tmp_path / "A", EXPECTED)
    assert_records(tmp_path / "B", EXPECTED)
    # the reference read a copy of the built scenario, which is gone: the dumps name no file
    a = _docs(tmp_path / "A")[0]["scenario"]
    assert "name" not in a and "path" not in a
    # and graphgen's engine, rerunning llama.cpp's dump, computes the same graphs
    ok("dump", "-m", model, "--scenario-from", tmp_path / "A", "--out", tmp_path / "G")
    assert_bit_identical(tmp_path / "A", tmp_path / "G")


# ---- a recorded run: injects read the target's features from an .npz the scenario names ---------

RECORDED = {"n_ctx": 64, "n_ubatch": 16, "features": "data/feats.npz", "steps": [
    {"inject": {"n_tokens": 6, "pos0": 0}}, {"block": {"tokens": [7, MASK, MASK, MASK], "pos0": 6}},
    {"seq_rm": {"seq": -1, "p0": 6, "p1": -1}},
    {"inject": {"n_tokens": 4, "pos0": 6}}, {"block": {"tokens": [8, MASK, MASK, MASK], "pos0": 10}}]}
RECORDED_GRAPHS = ("inject", "block", "inject", "block")


def write_features(model, path, seed=11):
    import gguf
    fc = next(np.asarray(t.data) for t in gguf.GGUFReader(str(model)).tensors if t.name == "fc.weight")
    rng = np.random.default_rng(seed)
    feats = {f"step{i}": rng.standard_normal((s["inject"]["n_tokens"], fc.shape[-1]), dtype=np.float32)
             for i, s in enumerate(RECORDED["steps"]) if "inject" in s}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **feats)
    return feats, fc.reshape(-1, fc.shape[-1])


@pytest.fixture(scope="module")
def recorded(model, tmp_path_factory):
    """The recorded scenario in rec/ (its features in rec/data/), dumped by graphgen from rec/
    itself (the one folder a relative features path was always found from) into orig/."""
    tmp = tmp_path_factory.mktemp("recorded")
    feats, fc = write_features(model, tmp / "rec" / "data" / "feats.npz")
    (tmp / "rec" / "s.json").write_text(json.dumps(RECORDED))
    ok("dump", "-m", model, "--scenario", "s.json", "--out", tmp / "orig", cwd=tmp / "rec")
    # the injects multiplied the recorded rows, not the ones drawn from the seed
    for name, key in (("00-inject", "step0"), ("02-inject", "step3")):
        with np.load(tmp / "orig" / f"{name}.npz") as v:
            np.testing.assert_allclose(v["n0"].reshape(len(feats[key]), -1), feats[key] @ fc.T, rtol=1e-4, atol=1e-4)
    return tmp


def relative(p, cwd):
    import os
    return os.path.relpath(p, cwd)


@pytest.mark.parametrize("engine", ["graphgen", pytest.param("llama.cpp", marks=pytest.mark.reference)])
def test_a_recorded_run_replays_from_any_folder(recorded, model, engine, tmp_path):
    import shutil
    # the dump folder holds a copy of the features its scenario names: moved, it still replays
    moved = tmp_path / "moved"
    shutil.copytree(recorded / "orig", moved)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def replay(out, *how):
        ok("dump", "-m", relative(model, elsewhere), *how, "--engine", engine, "--out", out, cwd=elsewhere)
        assert_bit_identical(recorded / "orig", elsewhere / out, RECORDED_GRAPHS)
        # the new folder names the copy it holds beside its graphs
        assert all(d["scenario"]["doc"]["features"] == "feats.npz" for d in _docs(elsewhere / out))
        assert (elsewhere / out / "feats.npz").read_bytes() == (recorded / "rec" / "data" / "feats.npz").read_bytes()

    replay("file", "--scenario", relative(recorded / "rec" / "s.json", elsewhere))
    replay("from-dir", "--scenario-from", relative(moved, elsewhere))
    replay("from-file", "--scenario-from", relative(moved / "03-block.json", elsewhere))
    replay("dir-as-scenario", "--scenario", relative(moved, elsewhere))  # what `dump -m -md` says to rerun
    # a flag over the recorded scenario: llama.cpp reads the scenario the flags made (the seed
    # draws no feature here: every inject's are recorded)
    replay("seeded", "--scenario-from", relative(moved, elsewhere), "--seed", 5)
    # a folder written by a replay replays in turn, moved too
    shutil.move(elsewhere / "from-dir", tmp_path / "again")
    replay("chained", "--scenario-from", relative(tmp_path / "again", elsewhere))


def test_features_named_like_a_graph_are_kept_apart(model, tmp_path):
    """A copy named 00-inject.npz would be taken for (and overwritten by) the first graph's values."""
    write_features(model, tmp_path / "rec" / "00-inject.npz")
    (tmp_path / "rec" / "s.json").write_text(json.dumps(dict(RECORDED, features="00-inject.npz")))
    ok("dump", "-m", model, "--scenario", tmp_path / "rec" / "s.json", "--out", tmp_path / "a")
    assert {d["scenario"]["doc"]["features"] for d in _docs(tmp_path / "a")} == {"features.npz"}
    assert (tmp_path / "a" / "features.npz").read_bytes() == (tmp_path / "rec" / "00-inject.npz").read_bytes()
    ok("dump", "-m", model, "--scenario-from", tmp_path / "a", "--out", tmp_path / "b")
    assert_bit_identical(tmp_path / "a", tmp_path / "b", RECORDED_GRAPHS)


def test_missing_recorded_features_are_named_where_they_were_looked_for(model, tmp_path):
    (tmp_path / "rec").mkdir()
    sf = tmp_path / "rec" / "s.json"
    sf.write_text(json.dumps(dict(RECORDED, features="gone.npz")))
    one_line_error(run("dump", model, "--scenario", sf, "--out", tmp_path / "o", cwd=tmp_path),
                   tmp_path / "rec" / "gone.npz", "cannot read the recorded features")
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.incomplete").exists()


@pytest.fixture(scope="module")
def borrowing(tmp_path_factory):
    """A draft without embeddings or lm head, and its target (SmolLM2) as rec/target.gguf."""
    from graphgen.synth import make_model
    from graphgen.speculative.targets import resolve
    tmp = tmp_path_factory.mktemp("borrowing")
    make_model(tmp / "d.gguf", "dflash", target=resolve("smollm2"), n_layer=1, block_size=4, seed=3)
    (tmp / "rec").mkdir()
    (tmp / "rec" / "target.gguf").symlink_to(resolve("smollm2"))
    (tmp / "rec" / "s.json").write_text(json.dumps({"n_ctx": 64, "n_ubatch": 16, "target": "target.gguf", "steps": [
        {"inject": {"n_tokens": 6, "pos0": 0}}, {"block": {"tokens": [7, 9, 9, 9], "pos0": 6}}]}))
    return tmp


@pytest.mark.parametrize("engine", ["graphgen", pytest.param("llama.cpp", marks=pytest.mark.reference)])
def test_a_relative_target_is_found_and_recorded_by_its_path(borrowing, engine, tmp_path):
    """The target lending the draft its tables is too large to copy: the dumps name it by its
    absolute path, so a moved dump folder still finds it."""
    import shutil
    ok("dump", "-m", borrowing / "d.gguf", "--scenario", relative(borrowing / "rec" / "s.json", tmp_path),
       "--engine", engine, "--out", "a", cwd=tmp_path)
    assert {d["scenario"]["doc"]["target"] for d in _docs(tmp_path / "a")} == {str(borrowing / "rec" / "target.gguf")}
    shutil.move(tmp_path / "a", tmp_path / "moved")
    ok("dump", "-m", borrowing / "d.gguf", "--scenario-from", "moved", "--engine", engine, "--out", "b", cwd=tmp_path)
    assert_bit_identical(tmp_path / "moved", tmp_path / "b", ("inject", "block"))
