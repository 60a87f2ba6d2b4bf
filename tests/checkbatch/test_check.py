"""graphgen check-batch: a sequence's block batched with others against the same block alone.

The command on a tiny DFlash draft in both engines (exit code, JSON, the two engines bit for bit,
b11739's own batch dependence pinned), its defaults, flags and progress lines, and planted batch
dependences in graphgen's mask that it must report.
"""

import json

import pytest

from graphgen.checkbatch import CheckBatchError, check_batch
from graphgen.checkbatch.check import DEFAULT_N_SEQ, THOROUGH_N_SEQ
from graphgen.cli import main
from graphgen.runtime import kvcache


def _graphs_per_case(n_seq: int) -> int:
    # the batched block, then per sequence: alone, batched again, own cache, batched again
    return 1 + 4 * n_seq


@pytest.mark.reference
def test_cli_both_engines_json(draft, capsys):
    rc = main(["check-batch", str(draft), "--n-seq", "1,4", "--json", "--quiet", "--fail-on", "parity"])
    out = json.loads(capsys.readouterr().out)
    # --fail-on parity: a batch dependence the engines share passes
    assert rc == 0 == out["exit_code"]
    assert out["engines"] == ["graphgen", "llama.cpp"]
    # the two engines bit for bit on every block graph of every case
    ran = [(1, "equal"), (4, "equal"), (4, "unequal")]
    assert out["parity"]["identical"] is True
    assert out["parity"]["graphs"] == sum(_graphs_per_case(n) for n, _ in ran)
    assert [(c["n_seq"], c["blocks"]) for c in out["cases"]] == [(1, "equal"), (1, "unequal"), (4, "equal"), (4, "unequal")]
    assert out["cases"][1]["note"] == "one sequence: no unequal blocks"
    by_engine = {e: [c["engines"][e] for c in out["cases"] if "engines" in c] for e in out["engines"]}
    assert by_engine["graphgen"] == by_engine["llama.cpp"]
    # b11739 on the tiny draft (measured, FA off, seed 0): equal blocks come out bit-identical
    # alone and batched; unequal blocks change the last bits of some sequences (matmuls over
    # another number of rows), outputs NMSE 4e-14 measured, pinned below 1e-12
    for (n, kind), c in zip(ran, by_engine["llama.cpp"]):
        assert c["reproducible"] is True
        assert len(c["sequences"]) == n
        for s in c["sequences"]:
            assert s["nodes_compared"] >= 70, s  # every node with a token axis, of 84
            assert s["outputs_nmse"] < 1e-12 and s["own_cache_outputs_nmse"] < 1e-12
            if kind == "equal":
                assert s["identical"], (n, kind, s)
    unequal4 = by_engine["llama.cpp"][-1]["sequences"]
    # the sequences that differ are those whose block is one token: alone, a one-row batch
    assert {s["n_tokens"] for s in unequal4 if not s["identical"]} == {1}
    assert all(s["worst_node"] for s in unequal4 if not s["identical"])
    assert out["batch_dependent"] == {"graphgen": True, "llama.cpp": True}
    # by default the exit code says whether anything depends on the batch: here it does
    assert main(["check-batch", str(draft), "--n-seq", "4", "--quiet"]) == 1
    text = capsys.readouterr().out
    assert "exit 1: results depend on the batch in graphgen and llama.cpp b11739" in text


def _run(draft, n_seq, fa=False):
    return check_batch(draft, n_seqs=[n_seq], flash_attn=fa, engines=("graphgen",))


def test_flash_attention_tiles_from_64_rows(draft):
    """The CPU's flash-attention kernel takes its tiled path from 64 query rows: 8 blocks of 4
    (32 rows) stay bit-identical to each block alone, 16 (64 rows) change every sequence's last
    bits and no more (b11739 measured the same, bit for bit; docs/check-batch.md)."""
    eight = _run(draft, 8, fa=True).cases[0].seqs["graphgen"]
    assert all(s.identical for s in eight)
    sixteen = _run(draft, 16, fa=True).cases[0].seqs["graphgen"]
    assert not any(s.outputs_identical for s in sixteen)
    assert all(0 < s.outputs_nmse < 1e-6 for s in sixteen)


def test_graphgen_alone_is_independent_of_the_batch(draft):
    rep = _run(draft, 2)
    eq = rep.cases[0]
    assert [s.identical for s in eq.seqs["graphgen"]] == [True, True]
    assert rep.exit_code() == 0 and not rep.dependent("graphgen")


def _plant_first_seq_mask(monkeypatch):
    """Every row of a batch gets the first sequence's mask."""
    real = kvcache.KVCache.kq_mask_values

    def first_seq_mask(self, ub, n_kv, causal, dtype, block_uniform=False, out=None):
        full = real(self, ub, n_kv, causal, dtype, block_uniform)
        full[:] = full[0]
        if out is None:
            return full
        out[...] = full
        return out
    monkeypatch.setattr(kvcache.KVCache, "kq_mask_values", first_seq_mask)


def test_planted_batch_mask_is_reported(draft, monkeypatch):
    """Every row of a batch takes the first sequence's mask: a dependence on the batch's make-up."""
    _plant_first_seq_mask(monkeypatch)
    rep = _run(draft, 2)
    seqs = rep.cases[0].seqs["graphgen"]
    assert seqs[0].identical                     # the first sequence's own mask: unchanged
    assert not seqs[1].identical and seqs[1].outputs_nmse > 1e-3
    assert seqs[1].first_node == "kq_soft_max-0"  # the mask enters at the first softmax
    assert rep.dependent("graphgen") and rep.exit_code() == 1
    assert "DEPEND" in rep.format_text()


def test_planted_cross_sequence_leak_is_reported(draft, monkeypatch):
    """A sequence that sees every sequence's cells: the same in the same cache, but not in a
    cache of its own, where the others' cells hold other values."""
    real = kvcache.KVCache.kq_mask_values

    def leak(self, ub, n_kv, causal, dtype, block_uniform=False, out=None):
        saved = self.seq_mask.copy()
        self.seq_mask[:] = saved.any(axis=0)
        try:
            return real(self, ub, n_kv, causal, dtype, block_uniform, out)
        finally:
            self.seq_mask[:] = saved
    monkeypatch.setattr(kvcache.KVCache, "kq_mask_values", leak)
    rep = _run(draft, 2)
    seqs = rep.cases[0].seqs["graphgen"]
    assert all(s.nodes_differ == 0 for s in seqs)
    assert all(not s.own_outputs_identical and s.own_outputs_nmse > 1e-3 for s in seqs)
    assert rep.exit_code() == 1


@pytest.mark.reference
def test_planted_dependence_breaks_parity(draft, monkeypatch, capsys):
    _plant_first_seq_mask(monkeypatch)
    assert main(["check-batch", str(draft), "--n-seq", "2", "--quiet"]) == 1
    text = capsys.readouterr().out
    assert "graphgen vs llama.cpp b11739" in text and "DIFFER" in text


@pytest.mark.parametrize("argv, needle", [
    (["--n-seq", "0"], "--n-seq"),
    (["--n-seq", "a,b"], "--n-seq"),
    (["--block", "0"], "--block"),
    (["--prompt", "0"], "--prompt"),
    (["--type-v", "q8_0"], "--type-v"),
])
def test_bad_input_one_line(draft, capsys, argv, needle):
    assert main(["check-batch", str(draft), "--engine", "graphgen", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphgen: error:") and needle in err[0]


def test_default_run_is_small_and_exit_says_dependence(draft, capsys):
    """Without --n-seq one batch size runs (seconds on a tiny draft, not the whole sweep); the
    exit code is 1 when some sequence's results depend on the batch (a one-token block alone
    is a one-row matmul: its last bits differ), 0 when none does."""
    assert DEFAULT_N_SEQ == (4,) and THOROUGH_N_SEQ == (1, 2, 4, 8, 16)
    rc = main(["check-batch", "-m", str(draft), "--engine", "graphgen", "--json", "--quiet"])
    out = json.loads(capsys.readouterr().out)
    assert [(c["n_seq"], c["blocks"]) for c in out["cases"]] == [(4, "equal"), (4, "unequal")]
    assert out["batch_dependent"] == {"graphgen": True}
    assert rc == 1 == out["exit_code"]
    # equal blocks of two sequences: nothing depends on the batch, exit 0
    assert main(["check-batch", str(draft), "--engine", "graphgen", "--n-seq", "2", "--quiet"]) == 0
    assert "exit 0: no result depends on the batch" in capsys.readouterr().out
    with pytest.raises(CheckBatchError, match="--fail-on parity"):
        check_batch(draft, n_seqs=[2], engines=("graphgen",), fail_on="parity")


def test_progress_lines_when_stderr_is_not_a_terminal(draft, capsys):
    """Each run is a line on stderr as it starts, whether or not stderr is a terminal (capsys'
    is not); --quiet prints none."""
    from graphgen import progress
    assert not __import__("sys").stderr.isatty()
    progress.set_mode("auto")
    assert main(["check-batch", str(draft), "--engine", "graphgen", "--n-seq", "1,2"]) == 0
    err = capsys.readouterr().err.splitlines()
    # every run, however quick the one before it
    assert [e.split(": ", 2)[2] for e in err[:3]] == [
        "run 1 of 3: n_seq 1, equal blocks, graphgen (5 block graphs)",
        "run 2 of 3: n_seq 2, equal blocks, graphgen (9 block graphs)",
        "run 3 of 3: n_seq 2, unequal blocks, graphgen (9 block graphs)"]
    assert len(err) == 4 and err[3].startswith("graphgen: check-batch ") and " done in " in err[3]
    assert main(["check-batch", str(draft), "--engine", "graphgen", "--n-seq", "2", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
