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


def run(*args, timeout=300):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def ok(*args):
    p = run(*args)
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


def assert_bit_identical(a, b):
    """graphgen diff says IDENTICAL, and every node's digest and stored values agree byte for byte."""
    p = run("diff", a, b)
    assert p.returncode == 0, p.stdout[-2000:]
    assert "8 graphs compared, 0 diverged" in p.stdout
    da, db = _docs(a), _docs(b)
    assert [d["graph"] for d in da] == [d["graph"] for d in db] == ["inject"] * 4 + ["block"] + ["inject"] * 2 + ["block"]
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
