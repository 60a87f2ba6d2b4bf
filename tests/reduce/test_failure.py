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


def _check_doc(exit=1, nodes=(), identical=True, argmax=(), verdict="DISAGREE: ..."):
    """A `graphgen check --json` report, as much of it as a signature reads."""
    return {"verdict": verdict, "exit": exit, "class": "z-lab DFlash (DFlashDraftModel)",
            "graphgen_identical_to_llama.cpp": identical,
            "arbiter": {"nodes": [{"graph": g, "name": n, "llama.cpp": e, "llama.cpp_departs": d}
                                  for g, n, e, d in nodes],
                        "argmax": [{"graph": g, "rows": r, "equal": q, "near_ties": t} for g, r, q, t in argmax],
                        "selector_path": [],
                        "first_departure": next(({"graph": g, "name": n} for g, n, _, d in nodes if d), None)}}


def test_a_checks_verdict_is_its_signature(tmp_path):
    from graphgen.reduce.failure import _check_outcome
    sig = lambda doc: _check_outcome(doc, tmp_path, Mode(check=True), {}).failure
    ok = [("00-inject.json", "l_out-0", 1e-7, False), ("01-block.json", "attn_norm-0", 2e-7, False)]
    assert sig(_check_doc(exit=0, nodes=ok)) == Failure("none")
    # the first node where llama.cpp leaves the authors' model, its layer left out
    far = ok + [("01-block.json", "ffn_out-3", 0.5, True), ("01-block.json", "result_norm", 0.9, True)]
    f = sig(_check_doc(nodes=far))
    assert (f.kind, f.side, f.graph, f.how) == ("departs", "llama.cpp", "block", "ffn_out-N")
    assert f == sig(_check_doc(nodes=ok[:1] + [("03-block.json", "ffn_out-0", 0.2, True)]))
    assert f != sig(_check_doc(nodes=ok[:1] + [("01-block.json", "attn_out-0", 0.2, True)]))
    # argmax rows the near ties do not explain
    a = sig(_check_doc(nodes=ok, argmax=[("01-block.json", 8, 6, 1)]))
    assert (a.kind, a.graph, a.how) == ("departs", "block", "argmax")
    assert sig(_check_doc(nodes=ok, argmax=[("01-block.json", 8, 6, 2)])).kind == "refused"
    # nothing compared is no agreement
    n = sig(_check_doc(nodes=[("01-block.json", "l_out-0", None, True)], verdict="NOT COMPARED: ..."))
    assert (n.kind, n.side, n.how) == ("refused", "check", "not compared")
