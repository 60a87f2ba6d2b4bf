"""graphgen/cli/dump.py: `graphgen dump` (a scenario's graphs into --out, the flags a run on a target
takes refused without one, the reference kept on the CPU) and `graphgen diff` (the report, the
verdict line, JSON, exit codes, its refusals). The runs on a real target (-m TARGET -md DRAFT):
tests/cli/test_generate.py."""

import json
import shutil
from types import SimpleNamespace

import pytest

from conftest import REF_DIR
from graphgen.cli.dump import _nmse_arg, _torch_side, _verdict

CASE = REF_DIR / "dflash-fa-off"


# ---- dump -------------------------------------------------------------------------------------

def test_dump_writes_each_graph_and_names_it(cli, tiny, tmp_path):
    out = tmp_path / "out"
    r = cli("dump", tiny, "--prompt", 5, "--steps", 2, "--out", out)
    assert r.code == 0, r.err
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == ["00-inject.json", "01-block.json", "02-inject.json", "03-block.json"]  # the seq_rm is no graph
    lines = r.out.splitlines()
    assert len(lines) == 4
    for line, name in zip(lines, files):
        doc = json.loads((out / name).read_text())
        assert line == f"{out / name}: {doc['graph']}, {len(doc['nodes'])} nodes"
    assert [json.loads((out / f).read_text())["graph"] for f in files] == ["inject", "block", "inject", "block"]


def test_dump_takes_the_draft_with_m_and_a_scenario_file(cli, tiny, tmp_path):
    out = tmp_path / "out"
    r = cli("dump", "-m", tiny, "--scenario", CASE / "scenario.json", "--out", out)
    assert r.code == 0, r.err
    ref = json.loads((CASE / "01-block.json").read_text())["nodes"]
    assert len(json.loads((out / "01-block.json").read_text())["nodes"]) == len(ref)


@pytest.mark.parametrize("flag", [["-p", "hello"], ["-f", "p.txt"], ["-n", "4"], ["--temp", "0.5"],
                                  ["--target-seed", "3"]])
def test_the_flags_of_a_run_on_a_target_need_one(flag, cli, tiny, tmp_path):
    r = cli("dump", tiny, *flag, "--out", tmp_path / "o")
    assert r.code == 2 and r.err == (f"graphgen: error: {flag[0]} applies to a run on a real target: give -m TARGET "
                                     "-md DRAFT\n")
    assert not (tmp_path / "o").exists()


def test_dump_refusals_before_any_graph(cli, tiny, tmp_path):
    out = tmp_path / "o"
    r = cli("dump", tiny, "--engine", "llama.cpp", "-dev", "Vulkan0", "--out", out)
    assert r.code == 2 and "the llama.cpp reference runs on the CPU; drop -dev/--backend" in r.err
    r = cli("dump", tiny, "--engine", "torch", "--out", out)
    assert r.code == 2 and "--engine torch runs a --scenario file (or --scenario-from a dump)" in r.err
    r = cli("dump", "-m", "t.gguf", "-md", tiny, "--target", "t.gguf", "--out", out)
    assert r.code == 2 and "-m names the target with -md; drop --target" in r.err
    r = cli("dump", "-m", "t.gguf", "-md", tiny, "--scenario", CASE / "scenario.json", "--out", out)
    assert r.code == 2 and "-md records its own scenario on the target; drop --scenario" in r.err
    r = cli("dump", "-m", tmp_path / "t.gguf", "-md", tiny, "--out", out)
    assert r.code == 2 and f"{tmp_path / 't.gguf'}: no such target model file" in r.err
    r = cli("dump", tiny, "--target", tmp_path / "lender.gguf", "--out", out)
    assert r.code == 2 and f"{tmp_path / 'lender.gguf'}: no such target model file (--target)" in r.err
    r = cli("dump", tmp_path / "none.gguf", "--out", out)
    assert r.code == 2 and "none.gguf: no such draft model file" in r.err
    assert not out.exists()


# ---- diff -------------------------------------------------------------------------------------

def test_diff_of_a_folder_with_itself(cli):
    r = cli("diff", CASE, CASE)
    assert r.code == 0, r.err
    assert r.out.count("graph-diff") == 2 and r.out.rstrip().endswith("2 graphs compared, 0 diverged")
    r = cli("diff", CASE, CASE, "--json")
    doc = json.loads(r.out)
    assert doc["identical"] is True and doc["unpaired"] == [] and len(doc["results"]) == 2


def test_diff_verdicts_and_exit_codes(cli):
    r = cli("diff", CASE, REF_DIR / "dflash-fa-on", "--quiet")
    assert (r.code, r.out) == (1, "2 graphs compared, 2 diverged\n")
    assert r.err.startswith("graphgen: warning: the two sides ran different scenarios")
    r = cli("diff", CASE, CASE / "01-block.json", "--quiet")
    assert (r.code, r.out) == (0, "1 graph compared (block): IDENTICAL\n")
    r = cli("diff", CASE / "01-block.json", CASE / "01-block.json", "-o", "MUL_MAT", "--quiet")
    assert r.code == 0 and r.out.startswith("1 graph compared (block): IDENTICAL (only the nodes -o MUL_MAT: ")


def test_a_graph_without_a_partner_is_named_and_fails(cli):
    enc = REF_DIR / "dflash-encoder"
    r = cli("diff", CASE, enc, "--quiet")
    assert r.code == 1 and r.out == "2 graphs compared, 2 diverged, no partner for ours 00-encoder.json\n"
    doc = json.loads(cli("diff", CASE, enc, "--json").out)
    assert doc["identical"] is False
    assert doc["unpaired"] == [{"side": "ours", "graph": "encoder", "path": str(enc / "00-encoder.json")}]


def test_diff_refusals(cli, tmp_path):
    r = cli("diff", CASE)
    assert r.code == 2 and "diff takes two dumps (REF OURS), or -m TARGET -md DRAFT -p TEXT" in r.err
    r = cli("diff", "-md", "d.gguf")
    assert r.code == 2 and "a diff on a target takes both -m TARGET and -md DRAFT" in r.err
    r = cli("diff", "-m", "t.gguf")
    assert r.code == 2 and "a diff on a target takes both -m TARGET and -md DRAFT" in r.err
    r = cli("diff", CASE, CASE, "-m", "t.gguf", "-md", "d.gguf")
    assert r.code == 2 and "-m/-md make both dumps; give no REF/OURS" in r.err
    r = cli("diff", CASE, tmp_path / "none")
    assert (r.code, r.out) == (2, "") and r.err == f"graphgen: error: {tmp_path / 'none'}: no such file or folder\n"


@pytest.mark.parametrize("text, ok", [("1e-5", 1e-5), ("0", 0.0), ("-1e-7", None), ("nan", None), ("x", None)])
def test_nmse_is_a_non_negative_number(text, ok, cli):
    if ok is not None:
        assert _nmse_arg(text) == ok
        return
    r = cli("diff", CASE, CASE, f"--nmse={text}")
    assert r.code == 2 and r.err.startswith("graphgen: error: argument --nmse: ")
    assert ("not a number" if text == "x" else "must be a non-negative number") in r.err


def test_verdict_lines():
    def res(graph, identical=True, unpaired=None, status="IDENTICAL", selection=None, ref_path=None, ours_path=None):
        return SimpleNamespace(graph=graph, identical=identical, unpaired=unpaired, status=status,
                               selection=selection, ref_path=ref_path, ours_path=ours_path)
    assert _verdict([res("block", status="DIVERGED", identical=False)]) == "1 graph compared (block): DIVERGED"
    assert _verdict([res("block", selection="--name attn")]) == \
        "1 graph compared (block): IDENTICAL (only the nodes --name attn)"
    assert _verdict([res("inject"), res("block", identical=False), res("block", identical=False)]) == \
        "3 graphs compared, 2 diverged"
    assert _verdict([res("inject"), res("x", unpaired="ref", ref_path="/a/02-block.json"),
                     res("y", unpaired="ours", ours_path="/b/00-encoder.json")]) == \
        "1 graphs compared, 0 diverged, no partner for ref 02-block.json, ours 00-encoder.json"
    # one graph alone, without a partner, is no comparison of one graph
    assert _verdict([res("x", unpaired="ours", ours_path="/b/00-encoder.json")]) == \
        "0 graphs compared, 0 diverged, no partner for ours 00-encoder.json"


def test_a_side_of_the_authors_models_dumps_is_told_by_its_engine(tmp_path):
    torch = tmp_path / "torch"
    torch.mkdir()
    doc = json.loads((CASE / "00-inject.json").read_text())
    doc["source"] = {"engine": "torch"}
    (torch / "00-inject.json").write_text(json.dumps(doc))
    assert _torch_side(torch) and _torch_side(torch / "00-inject.json")
    assert not _torch_side(CASE) and not _torch_side(CASE / "00-inject.json")
    assert not _torch_side(tmp_path / "none") and not _torch_side(CASE / "00-inject.npz")
    shutil.copy(CASE / "00-inject.json", tmp_path / "plain.json")
    assert not _torch_side(tmp_path / "plain.json")
