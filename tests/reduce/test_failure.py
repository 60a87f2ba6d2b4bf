"""What a failure is (graphgen.reduce.failure): the signature keeps what identifies it and drops
what a smaller case changes anyway; each side's end (a refusal, a crash) is told apart."""

import json
import shutil

from conftest import REF_DIR
from graphgen.compare.pairing import diff_paths
from graphgen.reduce.case import Case
from graphgen.reduce.failure import Failure, Mode, _diff_failure, _normalized, _side_failure, _xdiff_failure, run_case


def test_the_signature_ignores_the_detail_and_numbers():
    a = Failure("parting", graph="block", how="value", op="MUL_MAT", detail="#12 node_12 nmse 1e-3")
    b = Failure("parting", graph="block", how="value", op="MUL_MAT", detail="#3 node_3 nmse 4e-2")
    assert a == b and a != Failure("parting", graph="block", how="value", op="ADD")
    assert _normalized("graphgen: error: /tmp/x/draft.gguf: tensor 'blk.3.w' has 12 rows, 4096 needed") == \
        _normalized("graphgen: error: /home/u/d.gguf: tensor 'blk.0.w' has 7 rows, 64 needed")


def test_a_sides_end_is_a_refusal_or_a_crash():
    r = _side_failure("graphgen", 1, "progress\ngraphgen: error: n_embd 12 is not a multiple of 5\n")
    assert (r.kind, r.side, r.detail) == ("refused", "graphgen", "n_embd 12 is not a multiple of 5")
    assert _side_failure("llama.cpp", -6, "boom").kind == "crash"
    c = _side_failure("graphgen", 134, "ggml.c:1234: GGML_ASSERT(ne0 % 32 == 0) failed\n")
    assert c.kind == "crash" and "GGML_ASSERT" in c.how and c == _side_failure(
        "graphgen", -6, "ggml.c:99: GGML_ASSERT(ne0 % 32 == 0) failed")
    assert _side_failure("graphgen", -999, "timed out").how == "timeout"


def test_a_diff_parts_where_its_first_divergence_is(tmp_path):
    ref, ours = tmp_path / "ref", tmp_path / "ours"
    shutil.copytree(REF_DIR / "dflash-fa-off", ref)
    shutil.copytree(REF_DIR / "dflash-fa-off", ours)
    assert _diff_failure(diff_paths(ref, ours)) == Failure("none")
    doc = json.loads((ours / "01-block.json").read_text())
    k = next(n["index"] for n in doc["nodes"] if n["op"] == "RMS_NORM")
    doc["nodes"][k]["op_params"][0] += 1  # eps one ulp up
    (ours / "01-block.json").write_text(json.dumps(doc))
    f = _diff_failure(diff_paths(ref, ours))
    assert (f.kind, f.graph, f.how, f.op) == ("parting", "block", "changed op_params", "RMS_NORM")


def test_an_xdiff_report_parts_at_its_first_bad_node():
    doc = {"graphs": [{"graph": "inject", "structural": [], "first_bad": None},
                      {"graph": "block", "structural": [], "first_bad": {"index": 25, "name": "node_25",
                       "op": "FLASH_ATTN_EXT", "nmse": 3e-7, "threshold": 1e-7}}]}
    f = _xdiff_failure(json.dumps(doc))
    assert (f.kind, f.graph, f.how, f.op) == ("parting", "block", "value", "FLASH_ATTN_EXT")
    assert _xdiff_failure(json.dumps({"graphs": [{"graph": "block", "structural": []}]})).kind == "none"
    assert _xdiff_failure("not json").kind == "refused"


def test_a_case_that_agrees_has_no_failure(tmp_path):
    sc = json.loads((REF_DIR / "dflash-fa-off" / "scenario.json").read_text())
    out = run_case(Case(sc, {"variant": "dflash", "n_layer": 1, "seed": 2}), Mode(), tmp_path)
    assert out.failure == Failure("none"), out.printed
    assert set(out.printed) == {"graphgen", "llama.cpp"} and "IDENTICAL" in out.report
