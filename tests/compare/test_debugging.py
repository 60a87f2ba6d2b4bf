"""Finding where two graphs part: `diff --at`, the first structural change apart from the first
value failure, the per-layer strip, -o / --name filters and per-op threshold files (diff and
xdiff); llama.cpp's flags on the commands that run a draft; devices' memory, trace's decoded
op_params, bench's tokens/s, and every flag's default in the help.

Expectations come from the committed b11739 dumps and numpy, never from the code under test: a
test plants a known error at a known element and checks the report finds that element."""

import json
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import REF_DIR

CLI = [sys.executable, "-m", "graphgen.cli"]
CASE = REF_DIR / "dflash-fa-off"


def run(*args):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True)


def _nodes(folder, graph="01-block"):
    return json.loads((folder / f"{graph}.json").read_text())["nodes"]


def _plant(folder, graph, index, flat, delta):
    """Add delta to element `flat` of node `index`; return (ref value, ours value)."""
    npz = folder / f"{graph}.npz"
    arrays = dict(np.load(npz))
    a = arrays[f"n{index}"].copy()
    before = float(a.flat[flat])
    a.flat[flat] = np.float32(before + delta)
    arrays[f"n{index}"] = a
    np.savez(npz, **arrays)
    return before, float(a.flat[flat])


@pytest.fixture
def pair(tmp_path):
    ref, ours = tmp_path / "ref", tmp_path / "ours"
    shutil.copytree(CASE, ref)
    shutil.copytree(CASE, ours)
    return ref, ours


def _index(nodes, name):
    return next(n["index"] for n in nodes if n["name"] == name)


def _ggml_coord(flat, ne):
    # numpy's unravel over the reversed shape, read back in ggml's order
    return list(reversed([int(x) for x in np.unravel_index(flat, tuple(reversed(ne)))]))


# ---- diff --at --------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["name", "index", "ours-index"])
def test_at_finds_the_planted_element(pair, how):
    ref, ours = pair
    nodes = _nodes(ours)
    k = _index(nodes, "ffn_out-1")
    ne = nodes[k]["ne"]
    flat = ne[0] + 5  # second row: i1 = 1
    rv, ov = _plant(ours, "01-block", k, flat, 0.25)
    _plant(ours, "01-block", k, 3, 0.01)  # a smaller error elsewhere ranks second
    at = {"name": "ffn_out-1", "index": f"#{k}", "ours-index": f"ours#{k}"}[how]
    p = run("diff", ref / "01-block.json", ours / "01-block.json", "--at", at, "--json")
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    probes = [pr for r in doc["results"] for pr in r["probes"]]
    assert len(probes) == 1
    pr = probes[0]
    assert (pr["ref_index"], pr["ours_index"], pr["name"]) == (k, k, "ffn_out-1")
    top, second = pr["largest"][:2]
    assert top["index"] == flat and top["coord"] == _ggml_coord(flat, ne)
    assert top["ref"] == pytest.approx(rv, abs=0) and top["ours"] == pytest.approx(ov, abs=0)
    assert second["index"] == 3 and second["coord"] == [3, 0, 0, 0]
    assert pr["differing"] == 2
    # the window around the worst element holds both sides' values there
    w = pr["window"]
    assert w["at"] == top["coord"]
    c0, r0 = w["ref"]["i0"][0], w["ref"]["i1"][0]
    ref_vals = np.load(ref / "01-block.npz")[f"n{k}"].reshape(-1, ne[0])
    assert np.array_equal(np.array(w["ref"]["values"]), ref_vals[r0:w["ref"]["i1"][1], c0:w["ref"]["i0"][1]])
    assert w["ours"]["values"][1 - r0][5 - c0] == pytest.approx(ov, abs=0)
    # stats of each side, from its own values
    assert pr["stats"]["ours"]["sum"] - pr["stats"]["ref"]["sum"] == pytest.approx(0.26, abs=1e-5)


def test_at_by_index_when_the_graphs_do_not_line_up(tmp_path):
    """ours has a node inserted early, so every later node's index is one more than ref's:
    `--at ours#K` is ours' node K and its ref partner K-1, `--at #K-1` (ref's) the same pair,
    and the planted element is found in either."""
    import dataclasses

    from graphgen.dump.format import load_dump, write_dump
    ref_dir, ours_dir = tmp_path / "ref", tmp_path / "ours"
    shutil.copytree(CASE, ref_dir)
    ref = load_dump(ref_dir / "01-block.json")
    at = 5
    extra = dataclasses.replace(ref.nodes[at - 1], name="extra_scale", op="SCALE", src=[ref.nodes[at - 1].name],
                                view_src=None, digest=None, stats=None)
    order = ref.nodes[:at] + [extra] + ref.nodes[at:]
    nodes, values = [], {}
    for k, n in enumerate(order):
        nodes.append(dataclasses.replace(n, index=k))
        v = ref.values(n.index) if n is not extra else None
        if v is not None:
            values[k] = v.copy()
    k_ref = _index(_nodes(ref_dir), "ffn_out-1")
    k_ours = k_ref + 1
    assert nodes[k_ours].name == "ffn_out-1" and nodes[k_ref].name != "ffn_out-1"
    values[k_ours].flat[9] += np.float32(0.5)
    header = {"source": ref.source, "model": ref.model, "settings": ref.settings, "cpu_features": ref.cpu_features}
    write_dump(ours_dir, 1, "block", header, nodes, values)
    for target in (f"ours#{k_ours}", f"#{k_ref}", f"ref#{k_ref}"):
        p = run("diff", ref_dir / "01-block.json", ours_dir / "01-block.json", "--at", target, "--json")
        assert p.returncode == 1, p.stderr
        probes = [pr for r in json.loads(p.stdout)["results"] for pr in r["probes"]]
        assert len(probes) == 1, target
        pr = probes[0]
        assert (pr["ref_index"], pr["ours_index"], pr["name"]) == (k_ref, k_ours, "ffn_out-1"), target
        assert pr["largest"][0]["index"] == 9 and pr["differing"] == 1, target
    # ours' inserted node has no partner in ref
    p = run("diff", ref_dir / "01-block.json", ours_dir / "01-block.json", "--at", f"ours#{at}", "--json")
    pr = [pr for r in json.loads(p.stdout)["results"] for pr in r["probes"]][0]
    assert (pr["ref_index"], pr["ours_index"], pr["name"]) == (None, at, "extra_scale")


def test_at_text_report(pair):
    ref, ours = pair
    k = _index(_nodes(ours), "ffn_out-1")
    _plant(ours, "01-block", k, 70, -0.5)
    p = run("diff", ref, ours, "--at", "ffn_out-1")
    assert p.returncode == 1
    assert "largest errors (flat index, [i0, i1, i2, i3], ref, ours, |ours - ref|):" in p.stdout
    assert "[6, 1, 0, 0]" in p.stdout and "ref around [6, 1, 0, 0]" in p.stdout and "ours around" in p.stdout
    assert "1 of 256 elements differ" in p.stdout


def test_at_prints_the_node_not_the_whole_report_and_quiet_the_verdict(pair):
    """--at answers what was asked: the node's detail, then the verdict line, not the whole
    report before it; --quiet prints the verdict line alone."""
    ref, ours = pair
    k = _index(_nodes(ours), "ffn_out-1")
    _plant(ours, "01-block", k, 70, -0.5)
    p = run("diff", ref, ours, "--at", "ffn_out-1")
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 1 and lines[0].startswith("graph-diff [block]")
    assert lines[1].startswith("node ref #") and "'ffn_out-1'" in lines[1]
    assert lines[-1] == "2 graphs compared, 1 diverged" and "summary:" not in p.stdout
    p = run("diff", ref, ours, "--quiet")
    assert p.returncode == 1 and p.stdout == "2 graphs compared, 1 diverged\n" and p.stderr == ""
    p = run("diff", ref / "00-inject.json", ours / "00-inject.json", "--quiet")
    assert p.returncode == 0 and p.stdout == "1 graph compared (inject): IDENTICAL\n"
    p = run("--quiet", "diff", ref, ours, "--at", "ffn_out-1")
    assert p.returncode == 1 and p.stdout == "2 graphs compared, 1 diverged\n"


def test_at_names_no_such_node(pair):
    ref, ours = pair
    p = run("diff", ref, ours, "--at", "no_such_node")
    assert p.returncode == 2 and "--at no_such_node: no such node" in p.stderr
    p = run("diff", ref, ours, "--at", "#99999")
    assert p.returncode == 2 and "no such node in ref" in p.stderr


def test_at_on_identical_node_says_so(pair):
    ref, ours = pair
    p = run("diff", ref, ours, "--at", "ffn_out-1", "--json")
    assert p.returncode == 0
    pr = json.loads(p.stdout)["results"][1]["probes"][0]
    assert pr["largest"] == [] and pr["differing"] == 0


# ---- first structural change and first value failure ----------------------------------------

def test_first_value_failure_apart_from_a_later_type_change(pair):
    ref, ours = pair
    nodes = _nodes(ours)
    kv = _index(nodes, "ffn_out-0")
    ks = _index(nodes, "ffn_out-1")
    assert kv < ks
    _plant(ours, "01-block", kv, 0, 1.0)
    doc = json.loads((ours / "01-block.json").read_text())
    doc["nodes"][ks]["op_params"][0] = 7  # a structural change later in the graph
    (ours / "01-block.json").write_text(json.dumps(doc))
    p = run("diff", ref / "01-block.json", ours / "01-block.json", "--json")
    r = json.loads(p.stdout)["results"][0]
    assert r["first_value"]["ref_index"] == kv and r["first_value"]["kind"] == "numeric"
    assert r["first_structural"]["ref_index"] == ks and r["first_structural"]["kind"] == "changed"
    assert r["first_divergence"]["ref_index"] == kv
    text = run("diff", ref / "01-block.json", ours / "01-block.json").stdout
    assert text.index("first structural change:") < text.index("first value failure:")
    assert "'ffn_out-1'" in text.split("first structural change:")[1].splitlines()[0]
    assert "'ffn_out-0'" in text.split("first value failure:")[1].splitlines()[0]
    # the worst element is named on the failure's line
    worst = [n for n in r["numeric"] if n["ref_index"] == kv][0]["worst"]
    assert worst["index"] == 0 and worst["coord"] == [0, 0, 0, 0]


# ---- per-layer strip --------------------------------------------------------------------------

def test_layer_strip_points_at_the_layer(pair):
    ref, ours = pair
    nodes = _nodes(ours)
    k = _index(nodes, "ffn_out-1")
    _plant(ours, "01-block", k, 9, 0.5)
    p = run("diff", ref / "01-block.json", ours / "01-block.json", "--json")
    layers = {row["layer"]: row for row in json.loads(p.stdout)["results"][0]["layers"]}
    # the layers the names state, counted independently
    # (a node ggml named automatically, node_12 or ' (reshaped)', belongs to its first source's layer)
    def stated(name):
        for pat in (r"-(\d+)(?: \([a-z ]+\))*$", r"^cache_[kv]_l(\d+)\b", r"^blk\.(\d+)\."):
            m = re.search(pat, name)
            if m:
                return int(m.group(1))
        return None
    want, layer_at = {}, {}
    for n in nodes:
        base = n["name"].split(" (")[0]
        key = stated(n["name"])
        if key is None and (base == "" or base.startswith("node_")):
            for s in n["src"]:
                key = layer_at.get(s, stated(s))
                if key is not None:
                    break
        layer_at[n["name"]] = key
        want[key] = want.get(key, 0) + 1
    assert layers[0]["nodes"] == want[0] and layers[1]["nodes"] == want[1]
    assert layers[1]["failed"] == 1 and layers[1]["worst"] == {"ref_index": k, "name": "ffn_out-1"}
    assert layers[0]["failed"] == 0 and layers[0]["max_nmse"] == 0
    text = run("diff", ref / "01-block.json", ours / "01-block.json").stdout
    strip = text.split("per layer (where the error grows):")[1].split("\n\n")[0].strip().splitlines()
    assert len(strip) == len(layers)
    assert [ln for ln in strip if ln.strip().startswith("layer 1")][0].endswith("at #%d 'ffn_out-1'" % k)
    # identical dumps print no strip unless asked; --layers prints it
    assert "per layer" not in run("diff", ref, ref).stdout
    assert "per layer" in run("diff", ref, ref, "--layers").stdout


# ---- filters and thresholds -------------------------------------------------------------------

def test_op_filter_selects_nodes(pair):
    ref, ours = pair
    nodes = _nodes(ours)
    k = _index(nodes, "ffn_out-1")
    assert nodes[k]["op"] == "MUL_MAT"
    _plant(ours, "01-block", k, 0, 0.5)
    # the error sits in a matmul, so a filter on other ops sees none and one on MUL_MAT sees it
    p = run("diff", ref, ours, "-o", "RMS_NORM,SOFT_MAX")
    assert p.returncode == 0 and "only the nodes -o RMS_NORM,SOFT_MAX" in p.stdout
    p = run("diff", ref, ours, "-o", "mul_mat", "--json")
    assert p.returncode == 1
    r = json.loads(p.stdout)["results"][1]
    n_mm = sum(n["op"] == "MUL_MAT" for n in nodes)
    assert {n["op"] for n in r["numeric"]} == {"MUL_MAT"} and len(r["numeric"]) == n_mm
    assert r["selection"] == f"-o MUL_MAT: {n_mm} of {len(nodes)} ref nodes"
    # --name narrows by name; two filters both apply
    p = run("diff", ref, ours, "--name", "^ffn_out", "--json")
    r = json.loads(p.stdout)["results"][1]
    assert {n["name"] for n in r["numeric"]} == {n["name"] for n in nodes if n["name"].startswith("ffn_out")}
    p = run("diff", ref, ours, "-o", "MUL_MAT", "--name", "^ffn_up")
    assert p.returncode == 0
    # the inject graph has no ffn_up of its own: said so, not called identical
    assert "result: NOTHING SELECTED" in p.stdout.split("graph-diff [block]")[0]
    assert run("diff", ref, ours, "-o", "MUL_MAT", "--name", "^ffn_out").returncode == 1


def test_filter_that_selects_nothing_fails_loudly(pair):
    ref, ours = pair
    p = run("diff", ref, ours, "-o", "NO_SUCH_OP")
    assert p.returncode == 2 and "-o NO_SUCH_OP: selects no node" in p.stderr
    p = run("diff", ref, ours, "--name", "(")
    assert p.returncode == 2 and "--name '(': not a regular expression" in p.stderr


def test_threshold_file(pair, tmp_path):
    ref, ours = pair
    nodes = _nodes(ours)
    k = _index(nodes, "ffn_out-1")
    a = np.load(ref / "01-block.npz")[f"n{k}"].astype(np.float64)
    _plant(ours, "01-block", k, 0, 0.01)
    b = np.load(ours / "01-block.npz")[f"n{k}"].astype(np.float64)
    nmse = float(np.sum((a - b) ** 2) / np.sum(a ** 2))
    assert 1e-7 < nmse < 1e-4
    f = tmp_path / "t.json"

    def diff_with(doc):
        f.write_text(json.dumps(doc))
        return run("diff", ref / "01-block.json", ours / "01-block.json", "--thresholds", f, "--json")
    assert diff_with({"MUL_MAT": nmse * 2}).returncode == 0
    assert diff_with({"MUL_MAT": nmse / 2}).returncode == 1
    # the op's bound wins over the type's, the type's over the default
    assert diff_with({"f32": nmse * 2}).returncode == 0
    assert diff_with({"MUL_MAT": nmse / 2, "f32": nmse * 2}).returncode == 1
    assert diff_with({"default": nmse * 2}).returncode == 0
    r = json.loads(diff_with({"MUL_MAT": 0.5}).stdout)["results"][0]
    assert all(n["threshold"] == 0.5 for n in r["numeric"] if n["op"] == "MUL_MAT")
    assert all(n["threshold"] == 1e-7 for n in r["numeric"] if n["op"] != "MUL_MAT" and n["type"] == "f32")
    # bad files name the key
    for doc, what in (({"mul mat": 1}, "key 'mul mat'"), ({"MUL_MAT": -1}, "'MUL_MAT' must be a non-negative"),
                      ([], "expected a JSON object")):
        p = diff_with(doc)
        assert p.returncode == 2 and what in p.stderr, p.stderr


def test_a_mistyped_threshold_key_is_refused_with_the_nearest(pair, tmp_path):
    """A key that is no ggml op, no type and not 'default' would bound nothing: refused, naming
    the key and the valid one nearest to it. Unary and GLU ops count under their own names."""
    ref, ours = pair
    f = tmp_path / "t.json"
    for doc, near in (({"MULMAT": 5e-3}, "MUL_MAT"), ({"F16": 1e-5}, "f16"), ({"soft_max": 1e-6}, "SOFT_MAX"),
                      ({"MUL_MAT": 1e-3, "defualt": 1e-7}, "default")):
        f.write_text(json.dumps(doc))
        p = run("diff", ref, ours, "--thresholds", f)
        key = next(k for k in doc if k != "MUL_MAT")
        assert p.returncode == 2 and f"key '{key}'" in p.stderr and f"did you mean '{near}'?" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    f.write_text(json.dumps({"SILU": 1e-6, "SWIGLU": 1e-6, "FLASH_ATTN_EXT": 1e-5, "i32": 0, "bf16": 1e-4}))
    assert run("diff", ref, ours, "--thresholds", f).returncode == 0


def test_integer_nodes_stay_exact_under_any_threshold(tmp_path):
    from graphgen.compare.values import thresholds
    thr = thresholds(1.0, {"GET_ROWS": 1.0, "i32": 1.0, "default": 1.0})
    assert thr("i32", "GET_ROWS") == 0.0 and thr("f32", "GET_ROWS") == 1.0


def test_xdiff_filters_and_thresholds(tmp_path):
    model = tmp_path / "d.gguf"
    assert run("make-model", model).returncode == 0
    p = run("xdiff", "-m", model, "-dev", "CPU,cpu", "-o", "SOFT_MAX", "--json", "--prompt", 5)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["backends"] == ["cpu", "cpu"] and doc["selection"] == "-o SOFT_MAX"
    p = run("xdiff", "-m", model, "-dev", "CPU,CPU", "-o", "NO_SUCH_OP")
    assert p.returncode == 2 and "selects no node" in p.stderr
    p = run("xdiff", "-m", model)
    assert p.returncode == 2 and "-dev A,B" in p.stderr


# ---- llama.cpp's flags ------------------------------------------------------------------------

def test_flags_build_the_scenario_a_file_would(tmp_path):
    """A run from flags and a run from the scenario file they describe give the same graphs."""
    model = tmp_path / "d.gguf"
    assert run("make-model", model, "--block-size", 4).returncode == 0
    scen = {"n_ctx": 512, "n_ubatch": 32, "flash_attn": "on", "type_k": "f32", "type_v": "f16", "seed": 3,
            "n_seq": 2, "n_threads": 2, "steps": [
                {"inject": {"n_tokens": 32, "pos0": 0, "seq": 0}}, {"inject": {"n_tokens": 8, "pos0": 32, "seq": 0}},
                {"inject": {"n_tokens": 32, "pos0": 0, "seq": 1}}, {"inject": {"n_tokens": 8, "pos0": 32, "seq": 1}},
                {"block": {"seqs": [{"seq": 0, "pos0": 40, "tokens": [7, 255, 255, 255]},
                                    {"seq": 1, "pos0": 40, "tokens": [8, 255, 255, 255]}]}},
                {"seq_rm": {"seq": -1, "p0": 40, "p1": -1}},
                {"inject": {"n_tokens": 4, "pos0": 40, "seq": 0}}, {"inject": {"n_tokens": 4, "pos0": 40, "seq": 1}},
                {"block": {"seqs": [{"seq": 0, "pos0": 44, "tokens": [7, 255, 255, 255]},
                                    {"seq": 1, "pos0": 44, "tokens": [8, 255, 255, 255]}]}}]}
    sf = tmp_path / "s.json"
    sf.write_text(json.dumps(scen))
    a = run("dump", model, "--scenario", sf, "--out", tmp_path / "a")
    b = run("dump", "-m", model, "-fa", "on", "-c", 512, "-ub", 32, "-t", 2, "-np", 2, "--prompt", 40,
            "--steps", 2, "--seed", 3, "-ctk", "f32", "-ctv", "f16", "-dev", "CPU", "--out", tmp_path / "b")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout.replace("/a/", "/X/") == b.stdout.replace("/b/", "/X/")
    d = run("diff", tmp_path / "a", tmp_path / "b")
    assert d.returncode == 0 and "9 graphs compared, 0 diverged" not in d.stdout  # 8 graphs: seq_rm runs none
    assert "8 graphs compared, 0 diverged" in d.stdout


def test_flags_against_b11739(tmp_path):
    """The same flags on both engines: bit-identical graphs."""
    model = tmp_path / "d.gguf"
    assert run("make-model", model).returncode == 0
    flags = ["-fa", "auto", "-np", 3, "--steps", 2, "--prompt", 9, "-ub", 16, "-b", 64, "-c", 300]
    a = run("dump", "-m", model, *flags, "--out", tmp_path / "ours")
    b = run("dump", model, *flags, "--engine", "llama.cpp", "--out", tmp_path / "ref")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    d = run("diff", tmp_path / "ref", tmp_path / "ours")
    assert d.returncode == 0, d.stdout[-2000:]
    blocks = [json.loads(f.read_text()) for f in sorted((tmp_path / "ours").glob("*-block.json"))]
    assert len(blocks) == 2 and all(doc["settings"]["flash_attn"] for doc in blocks)


def test_batch_flag_caps_the_micro_batch(tmp_path):
    from graphgen.cli.llamaflags import build_scenario_doc
    from graphgen.play.scenario import parse_scenario
    sc = parse_scenario(dict(build_scenario_doc(16, 4, 1, 1, 255, 64, None, 1), n_batch=16))
    assert sc.n_ubatch == 16 and sc.n_batch == 16
    assert parse_scenario(dict(build_scenario_doc(16, 4, 1, 1, 255, 8, None, 1), n_batch=16)).n_ubatch == 8
    model = tmp_path / "d.gguf"
    assert run("make-model", model).returncode == 0
    # a 40-row prompt with -b 16: chunks of at most 16 rows
    p = run("dump", model, "-b", 16, "-ub", 64, "--prompt", 40, "--out", tmp_path / "o")
    assert p.returncode == 0, p.stderr
    sizes = [json.loads(f.read_text())["nodes"][0]["ne"][1] for f in sorted((tmp_path / "o").glob("*-inject.json"))]
    assert sizes == [16, 16, 8]


@pytest.mark.parametrize("dev, backend", [("CPU", "cpu"), ("none", "cpu"), ("Vulkan0", "vulkan:0"), ("vulkan1", "vulkan:1"),
                                          ("CUDA0", "cuda:0"), ("CUDA3", "cuda:3"), ("Metal", "metal"), ("MTL0", "metal"),
                                          ("RPC[10.0.0.2:50052]", "rpc://10.0.0.2:50052"),
                                          ("rpc://h:1", "rpc://h:1"), ("vulkan:2", "vulkan:2"), ("auto", "auto")])
def test_device_names(dev, backend):
    from graphgen.cli.llamaflags import backend_of
    assert backend_of(dev) == backend


def test_model_given_twice_or_not_at_all(tmp_path):
    p = run("dump", "--out", tmp_path / "o")
    assert p.returncode == 2 and "no model" in p.stderr
    p = run("dump", "a.gguf", "-m", "b.gguf", "--out", tmp_path / "o")
    assert p.returncode == 2 and "two models given" in p.stderr
    p = run("dump", "-m", "a.gguf", "--out", tmp_path / "o", "--prompt", 4, "--scenario", "x.json")
    assert p.returncode == 2


def test_flag_errors_name_the_flag(tmp_path):
    model = tmp_path / "d.gguf"
    assert run("make-model", model).returncode == 0
    p = run("dump", model, "-ub", 2, "-np", 1, "--block", 4, "--out", tmp_path / "o")
    assert p.returncode == 2 and "-ub" in p.stderr, p.stderr
    p = run("dump", model, "-fa", "maybe", "--out", tmp_path / "o")
    assert p.returncode == 2 and "-fa" in p.stderr
    p = run("dump", model, "-ctv", "q8_0", "-fa", "off", "--out", tmp_path / "o")
    assert p.returncode == 2 and "flash attention" in p.stderr


def test_draft_takes_llama_flags(tmp_path):
    model = tmp_path / "d.gguf"
    assert run("make-model", model).returncode == 0
    p = run("draft", "-m", model, "--prompt-tokens", "1,2,3", "-np", 2, "-fa", "on", "-c", 512, "-ub", 32, "-t", 1,
            "-dev", "CPU", "--n-predict", 6, "--json", "--quiet")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert len(doc["tokens_per_sequence"]) == 2
    assert all(len(t) == 3 + 6 and t[:3] == [1, 2, 3] for t in doc["tokens_per_sequence"])
    # the same run on b11739 drafts the same tokens
    q = run("draft", "-m", model, "--prompt-tokens", "1,2,3", "-np", 2, "-fa", "on", "-c", 512, "-ub", 32,
            "--n-predict", 6, "--json", "--quiet", "--engine", "llama.cpp")
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout)["tokens_per_sequence"] == doc["tokens_per_sequence"]


def test_bench_tokens_per_second(tmp_path):
    model = tmp_path / "d.gguf"
    assert run("make-model", model, "--block-size", 8).returncode == 0
    p = run("bench", "-m", model, "--repeat", 2, "--engine", "graphgen", "-np", 3, "--prompt", 20, "--json",
            "--quiet")
    assert p.returncode == 0, p.stderr
    steps = json.loads(p.stdout)["runs"][0]["steps"]
    assert [s["n_tokens"] for s in steps] == [20, 20, 20, 24]
    for s in steps:
        assert s["tokens_per_s"]["graphgen"] == pytest.approx(s["n_tokens"] / s["median_s"]["graphgen"], rel=1e-12)
    text = run("bench", model, "--repeat", 2, "--engine", "graphgen", "--quiet").stdout
    assert "graphgen t/s" in text and "llama.cpp t/s" in text


# ---- devices, trace --json, help --------------------------------------------------------------

def test_devices_report_memory():
    p = run("devices", "--json")
    doc = json.loads(p.stdout)
    cpu = [d for d in doc["devices"] if d["kind"] == "cpu"][0]
    with open("/proc/meminfo") as f:
        total_kb = int(next(ln for ln in f if ln.startswith("MemTotal:")).split()[1])
    # the CPU device reports the host's memory (within what cgroups or ggml's rounding change)
    assert 0 < cpu["memory_total"] <= total_kb * 1024 * 1.01 and 0 < cpu["memory_free"] <= cpu["memory_total"]
    assert "MiB free of" in run("devices").stdout


def _meminfo_kb(field: str) -> int:
    with open("/proc/meminfo") as f:
        return int(next(ln for ln in f if ln.startswith(field + ":")).split()[1])


def test_devices_cpu_free_memory_is_what_is_available():
    """ggml's CPU device reports its total as free; devices prints the host's MemAvailable (free
    pages and what the kernel can reclaim, as `free` shows it) and names that source."""
    used_kb = _meminfo_kb("MemTotal") - _meminfo_kb("MemAvailable")
    if used_kb < 64 * 1024:
        pytest.skip("the machine uses under 64 MiB: free and total cannot be told apart")
    before = _meminfo_kb("MemAvailable") / 1024
    out = run("devices").stdout
    after = _meminfo_kb("MemAvailable") / 1024
    line = next(ln for ln in out.splitlines() if ln.split()[:2] == ["CPU", "cpu"])
    free_mib, total_mib = (float(x.replace(",", "")) for x in re.search(r"([\d,]+) MiB free of ([\d,]+) MiB", line).groups())
    assert free_mib < total_mib - 32, line
    # MemAvailable moves while the command runs: within the readings around it, give or take 256 MiB
    assert min(before, after) - 256 <= free_mib <= max(before, after) + 256, (line, before, after)
    assert "(CPU's free memory: MemAvailable in /proc/meminfo)" in out
    doc = json.loads(run("devices", "--json").stdout)
    cpu = next(d for d in doc["devices"] if d["kind"] == "cpu")
    assert cpu["memory_free"] < cpu["memory_total"] and cpu["memory_free_source"] == "MemAvailable in /proc/meminfo"


def test_host_available_reads_memavailable(tmp_path):
    from graphgen.runtime.backends import host_available
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24683584 kB\nMemFree:        20099024 kB\nMemAvailable:   14515200 kB\n")
    assert host_available(str(f)) == 14515200 * 1024
    f.write_text("MemTotal:       24683584 kB\n")
    assert host_available(str(f)) is None and host_available(str(tmp_path / "none")) is None


def test_trace_json_decodes_op_params(tmp_path):
    model = tmp_path / "d.gguf"
    assert run("make-model", model, "--rms-eps", "1e-5", "--rope-freq-base", "5000").returncode == 0
    p = run("trace", "-m", model, "--json", "--prompt", 3, "-fa", "on")
    assert p.returncode == 0, p.stderr
    nodes = [json.loads(ln) for ln in p.stdout.splitlines()]
    norm = next(n for n in nodes if n["op"] == "RMS_NORM")
    eps = struct.unpack("<f", struct.pack("<i", norm["op_params"][0]))[0]
    assert norm["params"]["eps"] == eps == pytest.approx(1e-5, rel=1e-6)
    rope = next(n for n in nodes if n["op"] == "ROPE")
    assert rope["params"]["freq_base"] == 5000.0
    assert rope["params"]["n_dims"] == rope["op_params"][1]
    fa = next(n for n in nodes if n["op"] == "FLASH_ATTN_EXT")
    assert fa["params"]["scale"] == struct.unpack("<f", struct.pack("<i", fa["op_params"][0]))[0]


def _subparsers():
    from graphgen.cli import build_parser
    ap = build_parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices.items()


@pytest.mark.parametrize("name, parser", list(_subparsers()), ids=[n for n, _ in _subparsers()])
def test_help_gives_every_default(name, parser):
    text = parser.format_help()
    for action in parser._actions:
        if not action.option_strings or action.option_strings == ["-h", "--help"] or action.help == "==SUPPRESS==":
            continue  # a hidden alias (bench's --engines) has no help line
        fmt = parser._get_formatter()
        entry = fmt._format_action(action)
        assert "default" in entry or "required" in entry, f"{name} {action.option_strings}: {entry}"
    assert text


def test_rpc_server_help_shows_host_and_port():
    text = run("rpc-server", "--help").stdout
    assert "--host" in text and "127.0.0.1" in text and "--port" in text and "50052" in text


def test_worst_error_is_the_largest_in_its_layer(pair):
    """Two errors in one layer: the strip names the larger, wherever it comes."""
    ref, ours = pair
    nodes = _nodes(ours)
    early, late = _index(nodes, "kq_soft_max-1"), _index(nodes, "ffn_out-1")
    assert early < late
    _plant(ours, "01-block", early, 0, 1e-2)
    _plant(ours, "01-block", late, 0, 1.0)
    p = run("diff", ref / "01-block.json", ours / "01-block.json", "--json")
    row = [r for r in json.loads(p.stdout)["results"][0]["layers"] if r["layer"] == 1][0]
    assert row["failed"] == 2 and row["worst"] == {"ref_index": late, "name": "ffn_out-1"}


def test_first_value_failure_after_a_structural_change(pair):
    """A structural change first, a value failure later: each first names its own node."""
    ref, ours = pair
    nodes = _nodes(ours)
    ks, kv = _index(nodes, "ffn_out-0"), _index(nodes, "ffn_out-1")
    _plant(ours, "01-block", kv, 0, 1.0)
    doc = json.loads((ours / "01-block.json").read_text())
    doc["nodes"][ks]["op_params"][0] = 7
    (ours / "01-block.json").write_text(json.dumps(doc))
    r = json.loads(run("diff", ref / "01-block.json", ours / "01-block.json", "--json").stdout)["results"][0]
    assert r["first_divergence"]["ref_index"] == ks
    assert r["first_structural"]["ref_index"] == ks and r["first_value"]["ref_index"] == kv


def test_at_ranks_a_nan_first(pair):
    ref, ours = pair
    nodes = _nodes(ours)
    k = _index(nodes, "ffn_out-1")
    _plant(ours, "01-block", k, 3, 5.0)
    _plant(ours, "01-block", k, 11, float("nan"))
    out = run("diff", ref, ours, "--at", "ffn_out-1", "--json").stdout
    # strict JSON: NaN and Inf spelt as strings
    pr = json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))["results"][1]["probes"][0]
    first, second = pr["largest"][:2]
    assert first["index"] == 11 and first["ours"] == "nan" and first["abs"] == "inf"
    assert second["index"] == 3
