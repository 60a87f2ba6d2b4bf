"""Each node's own error (graphgen.compare.local, `diff/xdiff/view --local`).

The yardstick first: graphgen and llama.cpp b11739 compute on the same ggml, so every node of
graphgen's dump re-run alone on b11739's values must give b11739's output exactly, and on its own
values its own output; a node that cannot be re-run must say why. Then faults planted by the
mutation tool (tools/mutate.py FAULTS) in a copy of the package: the report must name the planted
node (or input) first, where the total error names a later node. Expected nodes are found in the
dumps' own structure (the RMS_NORM reading ffn_inp-0, the ROPE nodes), never from the report."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.synth import make_model

CLI = [sys.executable, "-m", "graphgen.cli"]
SCENARIO = REF_DIR / "dflash-fa-on" / "scenario.json"
VIEWS = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}


def run(*args, env=None, cwd=None):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd)


def dump(model, out, *extra, env=None):
    # run outside the checkout: `python -m` puts the working folder first on sys.path, before a
    # planted copy on PYTHONPATH
    p = run("dump", model, "--scenario", SCENARIO, "--out", out, *extra, env=env, cwd=out.parent)
    assert p.returncode == 0, p.stderr
    return out


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A 2-layer DFlash draft, its b11739 dumps and graphgen's."""
    d = tmp_path_factory.mktemp("local")
    model = d / "draft.gguf"
    make_model(model, "dflash", n_layer=2, seed=0)
    dump(model, d / "ref", "--engine", "llama.cpp")
    dump(model, d / "ours")
    return d


def planted(fault, tmp_path):
    """The environment that runs graphgen with `fault` planted (a copy of the package)."""
    from mutate import plant
    tree = plant(fault, tmp_path / "tree")
    return dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def local_report(ref, ours, *extra):
    p = run("diff", ref, ours, "--local", "--json", *extra)
    assert p.returncode in (0, 1), p.stderr
    return {r["graph"]: r for r in json.loads(p.stdout)["results"]}


def test_every_node_rerun_alone_gives_the_reference_output(case):
    """b11739 and graphgen on one ggml: no node has an error of its own, every replay is exact,
    and every node that computes something was re-run (the dumps record every input)."""
    res = local_report(case / "ref", case / "ours")
    for graph, r in res.items():
        nodes = json.loads(next((case / "ours").glob(f"*-{graph}.json")).read_text())["nodes"]
        computing = sum(n["op"] not in VIEWS for n in nodes)
        loc = r["local"]
        assert loc["rerun"] == computing and loc["views"] == len(nodes) - computing, graph
        assert loc["skipped"] == 0 and loc["not_rerun"] == []
        assert loc["own"] == [] and loc["first_own_past_bound"] is None
        assert loc["n_replay_exact"] == computing and loc["n_replay_inexact"] == 0
        assert loc["inputs_differ"] == []
        assert r["summary"]["inputs_compared"] >= 4  # positions, KV indices, mask (and token ids)


def test_the_dumps_record_the_graph_inputs_both_engines_read(case):
    """The same inputs on both sides, by name, with the positions the scenario gives."""
    sc = json.loads(SCENARIO.read_text())
    block = next(s["block"] for s in sc["steps"] if "block" in s)
    want_pos = list(range(block["seqs"][0]["pos0"], block["seqs"][0]["pos0"] + len(block["seqs"][0]["tokens"])))
    for side in ("ref", "ours"):
        doc = json.loads(next((case / side).glob("*-block.json")).read_text())
        names = [i["name"] for i in doc["inputs"]]
        assert {"inp_pos", "attn_inp_kq_mask"} <= set(names), names
        k = names.index("inp_pos")
        pos = np.load(next((case / side).glob("*-block.npz")))[f"i{k}"]
        assert pos.dtype == np.int32 and pos.ravel().tolist() == want_pos


def _planted_norm(nodes):
    """The RMS_NORM that reads layer 0's ffn_inp: where fault_ffn_norm_eps is planted."""
    return next(n for n in nodes if n["op"] == "RMS_NORM" and n["src"] == ["ffn_inp-0"])


def test_a_planted_builder_fault_is_named_by_its_own_error(case, tmp_path):
    """fault_ffn_norm_eps changes one norm's eps a little: its own error stays under the diff's
    bound, the values part past the bound only later, and the own error names the norm alone."""
    ours = dump(case / "draft.gguf", tmp_path / "faulty", env=planted("fault_ffn_norm_eps", tmp_path))
    res = local_report(case / "ref", ours)
    block = res["block"]
    nodes = json.loads(next(ours.glob("*-block.json")).read_text())["nodes"]
    norm = _planted_norm(nodes)
    # the total error is largest, and first past the bound if anywhere, at later nodes
    totals = {r["ours_index"]: r["nmse"] for r in block["numeric"]}
    worst = max(totals, key=totals.get)
    assert worst > norm["index"] and totals[worst] > totals[norm["index"]]
    first_value = block["first_value"]
    assert first_value is None or first_value["ref_index"] > norm["index"]
    own = block["local"]["own"]
    assert own and own[0]["ours_index"] == norm["index"] and own[0]["op"] == "RMS_NORM"
    # nothing else adds error: every later node only inherits it
    assert [r["ours_index"] for r in own] == [norm["index"]]
    assert own[0]["own_nmse"] == pytest.approx(totals[norm["index"]], rel=1e-12)
    # the inject graph has no such norm: nothing of its own there
    assert res["inject"]["local"]["own"] == []


def test_a_planted_input_fault_names_the_input(case, tmp_path):
    """fault_positions_shifted feeds every position one too far: the report names the input
    inp_pos, and the RoPE nodes that read it, re-run on b11739's positions, add nothing."""
    ours = dump(case / "draft.gguf", tmp_path / "faulty", env=planted("fault_positions_shifted", tmp_path))
    res = local_report(case / "ref", ours)
    for graph, r in res.items():
        loc = r["local"]
        assert [d["name"] for d in loc["inputs_differ"]] == ["inp_pos"], graph
        ropes = [n for n in r["numeric"] if n["op"] == "ROPE"]
        assert ropes and all(n["nmse"] > 1e-3 for n in ropes)  # their totals are far off
        assert all(n["local"]["kind"] == "rerun" and n["local"]["nmse"] == 0.0 for n in ropes)
        assert loc["own"] == []


def test_a_node_whose_source_ref_does_not_keep_says_why(case, tmp_path):
    ref = tmp_path / "ref"
    shutil.copytree(case / "ref", ref)
    doc = json.loads((ref / "01-block.json").read_text())
    k = next(n["index"] for n in doc["nodes"] if n["name"] == "ffn_inp-0")
    npz = ref / "01-block.npz"
    arrays = {key: v for key, v in np.load(npz).items() if key != f"n{k}"}
    np.savez(npz, **arrays)
    loc = local_report(ref, case / "ours")["block"]["local"]
    why = {g["why"]: g for g in loc["not_rerun"]}
    # ffn_inp-0 itself (nothing to compare with) and the nodes reading it
    assert any("ref keeps no values" in w for w in why)
    readers = [n["index"] for n in doc["nodes"] if "ffn_inp-0" in n["src"]]
    named = " ".join(" ".join(g["nodes"]) for g in loc["not_rerun"])
    assert all(f"#{j} " in named for j in readers), named


def test_weights_are_found_or_their_absence_is_said(case, tmp_path):
    """Without the model, a node reading a weight says it needs one; another model is refused."""
    ours = tmp_path / "ours"
    shutil.copytree(case / "ours", ours)
    far = tmp_path / "elsewhere"
    far.mkdir()
    p = run("diff", case / "ref", ours, "--local", "--json", cwd=far)
    doc = json.loads(p.stdout)
    whys = [g["why"] for r in doc["results"] for g in r["local"]["not_rerun"]]
    assert any("a weight needs the model (--weights)" in w for w in whys), whys
    other = tmp_path / "other.gguf"
    make_model(other, "dflash", n_layer=2, seed=4)
    p = run("diff", case / "ref", ours, "--local", "--weights", other)
    assert p.returncode == 2 and "is not the model ours ran" in p.stderr


def test_local_that_reruns_nothing_fails_loudly(case, tmp_path):
    """Every node recorded as computed on a backend this ggml lacks: nothing can be re-run, and
    the command says so and exits 2 rather than reporting no own error."""
    ours = tmp_path / "ours"
    shutil.copytree(case / "ours", ours)
    for f in ours.glob("*.json"):
        doc = json.loads(f.read_text())
        for n in doc["nodes"]:
            n["backend"] = "Vulkan0"
        f.write_text(json.dumps(doc))
    p = run("diff", case / "ref", ours, "--local")
    assert p.returncode == 2
    assert "no node could be re-run alone" in p.stderr and "vulkan" in p.stderr.lower()


def test_a_node_whose_own_output_its_inputs_do_not_give_is_flagged(case, tmp_path):
    """ours's ffn_out-1 changed after the fact: re-run on ref's values it gives ref's output (no own
    error), but re-run on ours's own values it does not give ours's recorded output, and the
    report says its own error cannot be trusted."""
    ours = tmp_path / "ours"
    shutil.copytree(case / "ours", ours)
    doc = json.loads((ours / "01-block.json").read_text())
    k = next(n["index"] for n in doc["nodes"] if n["name"] == "ffn_out-1")
    npz = ours / "01-block.npz"
    arrays = dict(np.load(npz))
    arrays[f"n{k}"] = arrays[f"n{k}"] + np.float32(0.25)
    np.savez(npz, **arrays)
    weights = ("--weights", case / "draft.gguf")
    p = run("diff", case / "ref", ours, "--local", *weights)
    assert "2 nodes re-run on ours's own values do not give ours's own output exactly" in p.stdout, p.stdout
    loc = local_report(case / "ref", ours, *weights)["block"]["local"]
    # the changed node, and the node reading it (ours's recorded sum was of the unchanged values)
    assert loc["n_replay_inexact"] == 2 and [r["ours_index"] for r in loc["replay_inexact"]] == [k, k + 1]
    assert doc["nodes"][k + 1]["src"][0] == "ffn_out-1" or doc["nodes"][k + 1]["src"][1] == "ffn_out-1"
    assert loc["own"] == []


def test_the_summary_ranks_own_error_and_groups_what_was_not_rerun():
    from graphgen.compare.local import Local
    from graphgen.compare.report import NumericResult, summarize_local
    rows = []
    for k, (own, total, kind, why) in enumerate([(1e-9, 1e-9, "rerun", None), (0.0, 1e-6, "rerun", None),
                                                  (5e-7, 2e-6, "rerun", None), (None, 0.0, "skipped", "no model"),
                                                  (0.0, 0.0, "view", None), (3e-7, 2e-6, "rerun", None),
                                                  (None, 1e-6, "skipped", "no model")]):
        r = NumericResult(k, k, f"n{k}", "f32", 4, total, 0.0, 1e-7, total <= 1e-7, op="MUL_MAT")
        r.local = Local(k, k, f"n{k}", "MUL_MAT", kind, nmse=own, why=why, replay_exact=kind == "rerun" or None)
        rows.append(r)
    s = summarize_local(rows)
    assert [r["ours_index"] for r in s["own"]] == [2, 5, 0]  # largest own error first, none of the nil ones
    assert s["first_own_past_bound"]["ours_index"] == 2  # 2 and 5 pass the bound: the earlier one
    assert (s["rerun"], s["views"], s["skipped"]) == (4, 1, 2)
    assert s["not_rerun"] == [{"why": "no model", "count": 2, "nodes": ["#3 n3 (MUL_MAT)", "#6 n6 (MUL_MAT)"]}]
    assert s["own"][1]["own_share"] == pytest.approx(0.15)


def test_encode_rounds_as_ggml_does():
    """Values fed to a re-run are rounded to the source's type as ggml's converters round."""
    import ctypes

    import graphgen.ops.ggml as ggml  # the C API under its own names
    from graphgen.compare.local import _decode, _encode
    x = np.array([1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, -65519.0, 1e-8, 3.3e-5, np.inf, 1 + 2 ** -8 + 2 ** -20],
                 dtype=np.float32)
    f16 = np.zeros(x.size, dtype=np.uint16)
    ggml.ggml_fp32_to_fp16_row(x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                               f16.ctypes.data_as(ctypes.POINTER(ctypes.c_ushort)), x.size)
    assert np.array_equal(_encode(x, "f16").view(np.uint16), f16)
    bf16 = np.zeros(x.size, dtype=np.uint16)
    ggml.ggml_fp32_to_bf16_row(x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                               ctypes.cast(bf16.ctypes.data, ggml.ggml_fp32_to_bf16_row.argtypes[1]), x.size)
    assert np.array_equal(_encode(x, "bf16"), bf16)
    assert np.array_equal(_decode(_encode(x, "f32").view(np.uint8), "f32"), x)


def test_backend_names_map_to_what_open_backend_takes():
    from graphgen.compare.local import backend_spec
    assert [backend_spec(n) for n in (None, "CPU", "Vulkan0", "Vulkan1", "CUDA0", "Metal", "RPC[127.0.0.1:50052]")] == \
        ["cpu", "cpu", "vulkan:0", "vulkan:1", "cuda:0", "metal", "rpc://127.0.0.1:50052"]


@pytest.mark.parametrize("case_name", ["dflash-fa-on", "lilicorr-fa-off"])
def test_cpu_against_vulkan_tells_own_error_from_inherited(case_name, tmp_path):
    """Through lavapipe: the attention's kernels carry error of their own, the nodes after them
    mostly inherit it, and every node replays exactly on the backend that ran it (LiliCorr's
    OUT_PROD runs on the CPU, on the scheduler's copies of its Vulkan-computed sources)."""
    from make_references import build_model
    from runtime.test_backends import gpu_build
    d = gpu_build("vulkan")
    model = build_model(REF_DIR / case_name, tmp_path)
    p = run("--ggml", d, "xdiff", model, "--scenario", REF_DIR / case_name / "scenario.json", "-dev", "CPU,Vulkan0",
            "--local", "--json")
    assert p.returncode in (0, 1), p.stderr
    graphs = {g["graph"]: g for g in json.loads(p.stdout)["graphs"]}
    for g in graphs.values():
        assert g["local"]["skipped"] == 0 and g["local"]["n_replay_inexact"] == 0, g["local"]
    loc = graphs["block"]["local"]
    assert loc["rerun"] > 0 and loc["n_replay_inexact"] == 0 and loc["n_replay_exact"] == loc["rerun"]
    own = loc["own"]
    assert own, "the Vulkan kernels add no error of their own: lavapipe should differ in the last bits"
    carriers = [r for r in own if r["own_share"] is not None and r["own_share"] > 0.5]
    inheritors = [r for r in own if r["own_share"] is not None and r["own_share"] < 0.1]
    assert carriers and inheritors


@pytest.mark.parametrize("case_name", ["dflash-iswa-kq5v8-fa-on", "dflash-q8-fa-on", "dflash-sharedkv-fa-off",
                                       "dflash2-fa-off", "dspark-d2t", "lilicorr-fa-on", "dsv4-q8-fa-on",
                                       "dflash-encoder"])
def test_every_node_of_the_reference_cases_reruns_exactly(case_name, tmp_path):
    """The yardstick over the options the committed cases draw: quantized and iSWA caches (two
    masks of one name, q5_1 / q8_0 blocks), shared K/V, the heads and a backbone, the encoder.
    Every node that computes is re-run, replays its own output bit for bit, adds nothing."""
    from make_references import build_model
    case_dir = REF_DIR / case_name
    model = build_model(case_dir, tmp_path)
    sc = case_dir / "scenario.json"
    for side, extra in (("ref", ["--engine", "llama.cpp"]), ("ours", [])):
        p = run("dump", model, "--scenario", sc, "--out", tmp_path / side, *extra, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
    res = local_report(tmp_path / "ref", tmp_path / "ours")
    for graph, r in res.items():
        loc = r["local"]
        assert loc["skipped"] == 0, (graph, loc["not_rerun"])
        assert loc["n_replay_exact"] == loc["rerun"] > 0 and loc["own"] == [], graph


def test_the_html_view_carries_each_nodes_own_error(case, tmp_path):
    """view --local: every row of the page's data has the node's own error (0 where nothing is
    added) or why it has none (a view computes nothing)."""
    import re
    out = tmp_path / "block.html"
    p = run("view", case / "ref", case / "ours", "--local", "--graph", "block", "--out", out)
    assert p.returncode == 0, p.stderr
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', out.read_text(), re.S).group(1)
    data = json.loads(blob.replace("<\\/", "</"))
    f = {name: k for k, name in enumerate(data["fields"])}
    rows = data["rows"]
    views = [r for r in rows if r[f["op"]] in VIEWS]
    computing = [r for r in rows if r[f["op"]] not in VIEWS]
    assert views and all(r[f["own_why"]] == "a view: computes nothing" for r in views)
    assert computing and all(r[f["own"]] == 0.0 and r[f["own_why"]] is None for r in computing)
