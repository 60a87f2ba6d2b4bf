"""What the report says: the first differing node by what it does and reads, never as ggml's
`node_<i>`; and the exit code, with the reason for it, under each --fail-on."""

import pytest

from graphgen.checkbatch import ENGINES, check_batch
from graphgen.checkbatch.plan import Settings
from graphgen.checkbatch.results import CaseResult, Report, SeqResult


def test_report_names_the_first_differing_node(draft):
    """The tiny draft's one-token block differs from its first matmul on; the report names that
    node by op and sources, never as ggml's `node_<i>`."""
    rep = check_batch(draft, n_seqs=[4], flash_attn=False, engines=("graphgen",))
    bad = [s for s in rep.cases[1].seqs["graphgen"] if not s.identical]
    assert len(bad) == 1 and bad[0].n_tokens == 1
    assert bad[0].first_node == "MUL_MAT of blk.0.attn_q.weight and noise_norm-0 (#3)"
    text = rep.format_text()
    assert "node_" not in text and "first differing node MUL_MAT of blk.0.attn_q.weight" in text


def _report(graphgen_differs=False, reproducible=True, engines_identical=True, fail_on="batch"):
    bad = SeqResult(0, 4, 6)
    bad.nodes_differ = int(graphgen_differs)
    case = CaseResult(1, "equal", seqs={"graphgen": [bad], "llama.cpp": [SeqResult(0, 4, 6)]},
                      reproducible={"graphgen": reproducible, "llama.cpp": True}, prompts=[6])
    parity = {"graphs": 5, "nodes": 10, "identical": engines_identical, "first": None if engines_identical else "x"}
    return Report("d.gguf", Settings(256, 64, False, "f16", "f16", 0), 4, 6, ENGINES, [case], parity, fail_on)


@pytest.mark.parametrize("kw, code, reason", [
    ({}, 0, "exit 0: no result depends on the batch"),
    ({"graphgen_differs": True}, 1, "exit 1: results depend on the batch in graphgen"),
    # the batched block computed twice and differing is a dependence too
    ({"reproducible": False}, 1, "exit 1: results depend on the batch in graphgen"),
    ({"engines_identical": False}, 1, "exit 1: the engines' graphs differ"),
    # --fail-on parity: a dependence alone passes, the engines differing fails
    ({"graphgen_differs": True, "fail_on": "parity"}, 0, "exit 0: the engines' graphs are bit-identical"),
    ({"engines_identical": False, "fail_on": "parity"}, 1, "exit 1: the engines' graphs differ"),
])
def test_exit_code_and_its_reason(kw, code, reason):
    """Made-up results, no engine run: what exits 1 under each --fail-on, said in the last line."""
    rep = _report(**kw)
    assert rep.exit_code() == code == rep.to_dict()["exit_code"]
    assert rep.exit_reason().startswith(reason) and rep.format_text().splitlines()[-1] == rep.exit_reason()
