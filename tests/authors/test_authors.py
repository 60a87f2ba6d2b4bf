"""The authors' own PyTorch models against llama.cpp b11739 and graphgen, node by mapped node.

Every authors' class (z-lab DFlash and DFlash2; speculators DFlash, DFlash2 and DSpark with and
without the confidence head, with d2t, anchor-first and bonus-anchor) is written by its authors'
own classes, converted by llama.cpp's own converter (the draft as it writes it, beside its target's
GGUF, which lends the embeddings and head the draft has none of) and run over a drafting session
(two inject chunks, two sequences in one batch, the blocks removed, a second round) in three engines. Bands
are the issue's: relative L2 < 1e-5 on every mapped node with an f32 cache, < 1e-3 with f16, the
argmax and the DFlash2 selector path equal. Controls break one thing on the authors' side and
must name the first mapped node it reaches.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from authors_util import require_extra, run_three, session_scenario

require_extra()

from graphgen.authors.checkpoint import HFSpec, make_hf  # noqa: E402
from graphgen.authors.compare import compare_paths, lattice_path  # noqa: E402
from graphgen.authors.convert import convert  # noqa: E402
from graphgen.compare.pairing import diff_paths  # noqa: E402
from graphgen.compare.report import exit_code  # noqa: E402

CASES = {
    "zlab-dflash": HFSpec(variant="dflash", authors="zlab"),
    "zlab-dflash2": HFSpec(variant="dflash2", authors="zlab"),
    "spec-dflash": HFSpec(variant="dflash", authors="speculators"),
    "spec-dflash2": HFSpec(variant="dflash2", authors="speculators"),
    "spec-dspark-conf-anchor": HFSpec(variant="dspark", d2t_vocab=192, conf=True, sample_from_anchor=True),
    "spec-dspark-bonus": HFSpec(variant="dspark", d2t_vocab=160, conf=True, sample_from_anchor=False, seed=3),
    "spec-dspark-noconf": HFSpec(variant="dspark", d2t_vocab=200, conf=False, sample_from_anchor=True, seed=4),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("authors")


@pytest.fixture(scope="module")
def converted(work):
    """Each case's checkpoint, its GGUF from llama.cpp's converter, and its target's GGUF."""
    out = {}
    for name, spec in CASES.items():
        hf = make_hf(work / name, spec)
        gguf = work / f"{name}.gguf"
        res = convert(hf, gguf, target_gguf=work / f"{name}-target.gguf", warn=lambda line: None)
        out[name] = (hf, gguf, res)
    return out


def beside(scenario: dict, res) -> dict:
    """The scenario run beside the converted target, which lends what the draft lacks."""
    assert res.borrows and res.target_out is not None
    return {**scenario, "target": str(res.target_out)}


def _spec(name):
    return CASES[name].resolved()


@pytest.fixture(scope="module")
def runs(work, converted):
    out = {}
    for name, (hf, gguf, res) in converted.items():
        s = _spec(name)
        for f16 in (False, True):
            key = f"{name}-{'f16' if f16 else 'f32'}"
            out[(name, f16)] = run_three(hf, gguf, beside(session_scenario(s.block_size, s.mask_token_id, f16), res),
                                         work, key)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_authors_agree_f32(runs, name):
    dirs = runs[(name, False)]
    for other in ("llama.cpp", "graphgen"):
        res = compare_paths(dirs["torch"], dirs[other])
        assert res.band == 1e-5
        assert res.agree, res.format_text()
        assert not res.lone
        # every mapped node of every graph was found and compared: nothing missing, nothing skipped
        assert all(n.status == "ok" for n in res.nodes), res.format_text()
        n_layer = _spec(name).n_layer
        n_block = sum(1 for n in res.nodes if "block" in n.graph)
        # 2 block graphs; per graph the 9 tensors of each layer, 3 globals, and the head's own
        per_block = 9 * n_layer + 3 + {"dflash": 0, "dflash2": 4 * n_layer + 1,
                                       "dspark": 1 + int(_spec(name).conf)}[_spec(name).variant]
        assert n_block == 2 * per_block, (n_block, per_block)
        # 4 inject graphs: fc output, and K and V of every layer
        assert sum(1 for n in res.nodes if "inject" in n.graph) == 4 * (1 + 2 * n_layer)
        # the argmax over every row of both blocks (3 sequences' blocks of 8)
        assert sum(t for _, _, t in res.argmax) == 3 * 8
        if _spec(name).variant == "dflash2":
            assert sum(t for _, _, t in res.paths) == 3 * 7
    # and graphgen is llama.cpp, bit for bit
    assert exit_code(diff_paths(dirs["llama.cpp"], dirs["graphgen"])) == 0


@pytest.mark.parametrize("name", list(CASES))
def test_authors_agree_f16_cache(runs, name):
    dirs = runs[(name, True)]
    res = compare_paths(dirs["torch"], dirs["llama.cpp"])
    assert res.band == 1e-3 and res.node_band == 4 * 2.0 ** -11
    assert res.agree, res.format_text()
    logits = [n for n in res.compared if n.name in ("result_output", "[drafted logits]")]
    assert logits and all(n.rel_l2 < 1e-3 for n in logits)
    worst = max(n.rel_l2 for n in res.compared)
    # an f16 cache is visible: the f32 band would not hold
    assert worst > 1e-5, worst


def test_dflash2_selector_leaves_the_argmax(runs):
    """The selector is exercised: its path is not the plain argmax of the logits."""
    from graphgen.dump.format import load_dump_dir
    for name in ("zlab-dflash2", "spec-dflash2"):
        dumps = load_dump_dir(runs[(name, False)]["torch"])
        block = [d for d in dumps if d.graph == "block"][0]
        by = {n.name: n for n in block.nodes}
        path = block.values(by["[selector path]"].index).ravel()
        logits = block.values(by["result_output"].index).reshape(-1, 256)
        argmax = np.concatenate([logits[b * 8 + 1:(b + 1) * 8].argmax(-1) for b in range(2)])
        assert (path != argmax).any(), name


def test_dspark_bonus_anchor_slot_has_no_authors_confidence(runs):
    from graphgen.dump.format import load_dump_dir
    dumps = load_dump_dir(runs[("spec-dspark-bonus", False)]["torch"])
    block = [d for d in dumps if d.graph == "block"][0]
    conf = block.values([n for n in block.nodes if n.name == "[confidences]"][0].index).reshape(-1, 64)
    assert np.isnan(conf[[0, 8]]).all() and not np.isnan(conf[[1, 2, 9]]).any()


def test_d2t_rows_are_minus_inf_where_the_draft_vocab_has_no_token(runs):
    from graphgen.dump.format import load_dump_dir
    dumps = load_dump_dir(runs[("spec-dspark-conf-anchor", False)]["llama.cpp"])
    block = [d for d in dumps if d.graph == "block"][0]
    logits = block.values(block.nodes[-1].index).reshape(-1, 256)
    assert (np.isinf(logits).sum(-1) == 256 - 192).all()


# ---- controls: break the authors' side, the comparison must fail at the first node reached ----

def _control(work, converted, runs, edit, first):
    from graphgen.authors.forward import run_scenario_torch
    from graphgen.play.scenario import parse_scenario
    hf, _, _ = converted["zlab-dflash"]
    copy = work / f"control-{first}"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(hf, copy)
    edit(copy)
    s = _spec("zlab-dflash")
    sc = parse_scenario(session_scenario(s.block_size, s.mask_token_id, False))
    out = work / f"control-{first}-torch"
    run_scenario_torch(copy, sc, out)
    res = compare_paths(out, runs[("zlab-dflash", False)]["llama.cpp"])
    assert not res.agree
    assert res.first_bad is not None and res.first_bad.name == first, res.format_text()
    assert res.first_bad.rel_l2 > 1e-2
    assert f"first mapped node out of band: {first}" in res.format_text()
    # no check-nmse name ("very good match") beside a failure
    assert not [line for line in res.format_text().splitlines() if "match" in line and "out of band" in line]
    assert not [line for line in res.format_text().splitlines() if first in line and "match" in line]
    # graphgen check's float64 arbiter (the edited authors' model in double) blames llama.cpp's side
    # and names the node
    from graphgen.authors.arbiter import arbitrate
    from graphgen.authors.forward import AuthorsDraft
    from graphgen.cli.authors import verdict
    from graphgen.compare.pairing import load_side
    arb_dir = work / f"control-{first}-arbiter"
    run_scenario_torch(copy, sc, arb_dir, draft=AuthorsDraft(copy, dtype="float64"))
    ref = runs[("zlab-dflash", False)]
    arb = arbitrate(load_side(arb_dir), load_side(out), compare_paths(arb_dir, ref["llama.cpp"], band=1.0),
                    compare_paths(arb_dir, ref["graphgen"], band=1.0), s.n_layer, "f32")
    assert arb.first_departure.name == first and not arb.drifts
    code, line = verdict({"arbiter": arb, "graphgen_identical": True})
    assert code == 1 and line.startswith("DISAGREE: llama.cpp b11739") and f"first at {first} in " in line


def _edit_config(key_path, value):
    def edit(folder):
        cfg = json.loads((folder / "config.json").read_text())
        node = cfg
        for k in key_path[:-1]:
            node = node[k]
        node[key_path[-1]] = value
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


def test_control_target_layers_swapped(work, converted, runs):
    def edit(folder):
        from safetensors.torch import load_file, save_file
        t = load_file(folder / "model.safetensors")
        w = t["fc.weight"]
        half = w.shape[1] // 2
        t["fc.weight"] = w[:, list(range(half, 2 * half)) + list(range(half))].contiguous()
        save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
    _control(work, converted, runs, edit, "inp_g_embeddings")


def test_control_rope_base(work, converted, runs):
    _control(work, converted, runs, _edit_config(["rope_parameters", "rope_theta"], 50000.0), "Kcur_injected-0")


def test_control_causal_attention(work, converted, runs):
    _control(work, converted, runs, _edit_config(["is_causal"], True), "kqv_out-0")


def test_lattice_walk_follows_the_best_transition():
    # top_k 2, two blocks of 3 rows: ids then 2x2 transition scores
    rows = np.zeros((6, 8), np.float32)
    rows[1] = [10, 11, 0.1, 0.9, 0, 0, 0, 0]     # from the anchor (pred 0): candidate 1 wins
    rows[2] = [20, 21, 0, 0, 0.7, 0.2, 0, 0]     # from pred 1: candidate 0 wins
    rows[4] = [30, 31, 0.8, 0.1, 0, 0, 0, 0]
    rows[5] = [40, 41, 0.1, 0.6, 0.9, 0.0, 0, 0]  # from pred 0: candidate 1
    assert lattice_path(rows, 2, 2).tolist() == [11, 20, 30, 41]


def test_torch_dump_cli_and_diff_exit_codes(work, converted, runs, capsys):
    from graphgen.cli import main
    dirs = runs[("zlab-dflash", False)]
    assert main(["diff", str(dirs["torch"]), str(dirs["llama.cpp"])]) == 0
    assert "AGREE" in capsys.readouterr().out
    # either side may hold the torch dump; --json carries the per-kind table
    assert main(["diff", str(dirs["llama.cpp"]), str(dirs["torch"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["agree"] and doc["worst_rel_l2_by_kind"]["Qcur"] < 1e-5
    # a band no float computation meets makes the same dumps disagree
    assert main(["diff", str(dirs["torch"]), str(dirs["llama.cpp"]), "--nmse", "1e-30"]) == 1
    assert "DISAGREE" in capsys.readouterr().out


# ---- a disagreement pinned: sliding-window layers ---------------------------------------------

SWA_CASES = {
    # z-lab: a sliding layer is causal, with a window per query
    "zlab-swa3": (HFSpec(variant="dflash", authors="zlab", swa_window=3, swa_pattern=[1, 0]), False),
    # speculators: the window counts back from the anchor; DFlash2's block is bidirectional
    "spec-dflash2-swa3": (HFSpec(variant="dflash2", authors="speculators", swa_window=3, swa_pattern=[1, 0]), False),
    # ...and a window wider than the whole context changes nothing there: llama.cpp agrees
    "spec-dflash2-swa64": (HFSpec(variant="dflash2", authors="speculators", swa_window=64, swa_pattern=[1, 0]), True),
    # speculators DFlash: its sliding block is causal, llama.cpp's is not
    "spec-dflash-swa64": (HFSpec(variant="dflash", authors="speculators", swa_window=64, swa_pattern=[1, 0]), False),
}


@pytest.mark.parametrize("name", list(SWA_CASES))
def test_sliding_window_layers_depart_from_the_authors(work, name):
    """b11739 masks a sliding layer with a window per query and the whole block visible; neither
    author does (docs/authors.md, 'Where llama.cpp departs from the authors'). graphgen follows b11739."""
    spec, agrees = SWA_CASES[name]
    hf = make_hf(work / name, spec)
    gguf = work / f"{name}.gguf"
    warned = []
    res = convert(hf, gguf, target_gguf=work / f"{name}-target.gguf", warn=warned.append)
    assert any("sliding-window layer(s) (window" in w for w in warned)
    scenario = {"n_ctx": 64, "n_ubatch": 32, "flash_attn": "off", "type_kv": "f32", "seed": 1,
                "steps": [{"inject": {"n_tokens": 6, "pos0": 0}}, {"block": {"tokens": [7] + [255] * 7, "pos0": 6}}]}
    dirs = run_three(hf, gguf, beside(scenario, res), work, name)
    assert exit_code(diff_paths(dirs["llama.cpp"], dirs["graphgen"])) == 0
    res = compare_paths(dirs["torch"], dirs["llama.cpp"])
    if agrees:
        assert res.agree, res.format_text()
        return
    assert not res.agree
    # the sliding layer (layer 0) is where they part: everything before its attention output agrees
    assert res.first_bad.name == "kqv_out-0" and res.first_bad.rel_l2 > 0.1, res.format_text()
    assert all(n.status == "ok" for n in res.nodes[:res.nodes.index(res.first_bad)])


# ---- the commands: check, bad input ----------------------------------------------------------

def test_check_runs_the_triangle(converted, capsys, tmp_path):
    from graphgen.cli import main
    hf, _, _ = converted["zlab-dflash2"]
    keep = tmp_path / "kept"
    assert main(["--quiet", "check", str(hf), "--json", "--keep", str(keep)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"].startswith("AGREE") and doc["graphgen_identical_to_llama.cpp"]
    assert doc["converter"] == "0c1e57098" and doc["authors_vs_llama.cpp"]["compared"] > 0
    assert doc["authors_vs_llama.cpp"]["selector_path"] and doc["arbiter"]["agree"]
    # the fixed-band verdicts are not the check's: only the arbiter's distances judge
    assert "agree" not in doc["authors_vs_llama.cpp"] and "first_out_of_band" not in doc["authors_vs_graphgen"]
    arb = doc["arbiter"]
    assert arb["cache"] == "f32" and arb["selector_path"] and arb["argmax"]
    assert all(n["llama.cpp"] <= n["band"] and n["llama.cpp"] == n["graphgen"] for n in arb["nodes"])
    # the trained block size runs, not a shorter one
    assert doc["block_size"] == 8 and json.loads((keep / "scenario.json").read_text())["steps"][1]["block"]["tokens"][1:] == [255] * 7
    assert sorted(p.name for p in keep.iterdir()) == ["arbiter", "draft.gguf", "graphgen", "llama.cpp", "scenario.json",
                                                      "target.gguf", "torch"]
    # the draft as the converter wrote it, beside its target's GGUF (the kept scenario names the kept one)
    assert doc["borrows"] == ["token_embd.weight", "output.weight"] and doc["target_arch"] == "qwen3"
    assert not doc["converter_warnings"]
    assert json.loads((keep / "scenario.json").read_text())["target"] == "target.gguf"
    # the kept dumps replay: their recorded scenario finds the kept target beside them
    from graphgen.play.scenario import load_scenario
    for side in ("llama.cpp", "graphgen"):
        assert load_scenario(keep / side).target_path == str(keep / "target.gguf")
    from graphgen.dump.format import load_dump_dir
    assert {d.source["dtype"] for d in load_dump_dir(keep / "arbiter")} == {"float64"}
    for side in ("torch", "arbiter", "llama.cpp", "graphgen"):
        for d in load_dump_dir(keep / side):
            assert d.source["converter"]["commit"] == "0c1e57098"
            assert d.source["converter"]["checkpoint"] == str(hf.resolve())


def test_full_vocab_dspark_agrees_beside_a_tied_target(work, capsys):
    """The converter drops a full-vocabulary DSpark's head; speculators' is the target's own (frozen,
    never saved), so the target lends it, here as its embeddings, to which it ties the head."""
    from graphgen.cli import main
    hf = make_hf(work / "spec-dspark-full", HFSpec(variant="dspark", d2t_vocab=256, tie_target=True, seed=5))
    assert main(["--quiet", "check", str(hf), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"].startswith("AGREE") and doc["graphgen_identical_to_llama.cpp"]
    assert doc["borrows"] == ["token_embd.weight", "output.weight"]
    assert doc["arbiter"]["argmax"] and doc["authors_vs_llama.cpp"]["compared"] > 0


@pytest.mark.parametrize("edit,message", [
    (lambda d: (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}'),
     "key 'architectures' = ['LlamaForCausalLM'] is not a DFlash-family draft"),
    (lambda d: (d / "config.json").unlink(), "no config.json"),
    (lambda d: (d / "config.json").write_text(json.dumps(
        {k: v for k, v in json.loads((d / "config.json").read_text()).items() if k != "dflash_config"})),
     "missing key 'dflash_config'"),
    (lambda d: (d / "config.json").write_text(json.dumps(
        dict(json.loads((d / "config.json").read_text()), intermediate_size=96))),
     "tensor 'layers.0.mlp.down_proj.weight' has shape [64, 128]"),
])
def test_bad_checkpoints_are_refused_in_one_line(converted, tmp_path, capsys, edit, message):
    from graphgen.cli import main
    hf, _, _ = converted["zlab-dflash"]
    bad = tmp_path / "bad"
    shutil.copytree(hf, bad)
    edit(bad)
    out = tmp_path / "out"
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps(session_scenario(8, 255, False)))
    assert main(["dump", str(bad), "--engine", "torch", "--scenario", str(sc), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_make_model_hf_refuses_gguf_only_flags(tmp_path, capsys):
    from graphgen.cli import main
    assert main(["make-model", str(tmp_path / "x"), "--format", "hf", "--sinks"]) == 2
    assert "--sinks has no counterpart" in capsys.readouterr().err
    assert main(["make-model", str(tmp_path / "x"), "--format", "hf", "--variant", "lilicorr"]) == 2
    assert not (tmp_path / "x").exists()
