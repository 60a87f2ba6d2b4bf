"""graphgen check-batch: a sequence's block batched with others against the same block alone.

The command on a tiny DFlash draft in both engines (exit code, JSON, the two engines bit for bit,
b11739's own batch dependence pinned), the comparison on hand-made graphs whose differences are
planted with numpy, and planted batch dependences in graphgen's mask that it must report.
"""

import hashlib
import json

import numpy as np
import pytest

from graphgen import checkbatch as cb
from graphgen.cli import main
from graphgen.dump.format import Node
from graphgen.runtime import kvcache
from graphgen.synth import make_model


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    path = tmp_path_factory.mktemp("checkbatch") / "dflash.gguf"
    make_model(path, "dflash", "base")
    return path


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


def _node(i, name, ne, src=()):
    return Node(index=i, name=name, op="MUL_MAT", type="f32", ne=list(ne) + [1] * (4 - len(ne)), src=list(src))


def _graph(nodes, values):
    return cb.Graph(nodes, dict(enumerate(values)))


def test_comparison_cuts_each_sequence_rows():
    # two sequences of 3 and 2 tokens; a per-token node [8, T] and an output [5, T] reading it
    case = cb.Case(2, "unequal", prompts=[4, 6], blocks=[[1, 9, 9], [2, 9]])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8), dtype=np.float32)       # numpy order: [T, 8]
    y = rng.standard_normal((5, 5), dtype=np.float32)
    batched = _graph([_node(0, "x", (8, 5)), _node(1, "out", (5, 5), ["x"])], [x[None, None], y[None, None]])
    alone0 = _graph([_node(0, "x", (8, 3)), _node(1, "out", (5, 3), ["x"])], [x[None, None, :3], y[None, None, :3]])
    y1 = y[3:].copy()
    y1[1, 2] += 1e-3   # sequence 1's last row, one value
    alone1 = _graph([_node(0, "x", (8, 2)), _node(1, "out", (5, 2), ["x"])], [x[None, None, 3:], y1[None, None]])
    got0, skipped0 = cb.compare_sequence(batched, alone0, case, 0)
    assert skipped0 == 0 and [(n, s) for n, _, s, _ in got0] == [("x", True), ("out", True)]
    got1, _ = cb.compare_sequence(batched, alone1, case, 1)
    assert [(n, s, o) for n, _, s, o in got1] == [("x", True, False), ("out", False, True)]
    want = float(np.sum((y1 - y[3:]).astype(np.float64) ** 2) / np.sum(y1.astype(np.float64) ** 2))
    assert got1[1][1] == pytest.approx(want, rel=1e-9)
    # one unit in the last place is a difference: bits, not closeness
    y2 = y[3:].copy()
    y2[0, 0] = np.nextafter(y2[0, 0], np.float32(np.inf))
    alone2 = _graph([_node(0, "x", (8, 2)), _node(1, "out", (5, 2), ["x"])], [x[None, None, 3:], y2[None, None]])
    got2, _ = cb.compare_sequence(batched, alone2, case, 1)
    assert [s for _, _, s, _ in got2] == [True, False] and 0 < got2[1][1] < 1e-12
    res = cb.SeqResult(1, 2, 6)
    cb.summarize(res, got1, 0)
    assert (res.identical, res.worst_node, res.first_node, res.nodes_differ) == (False, "out", "out", 1)
    assert res.outputs_nmse == pytest.approx(want, rel=1e-9)


def test_case_graphs_compared_as_they_come():
    """A case's graphs arrive one at a time: each is compared with the first batched block and
    its values let go (16 sequences of a realistic draft would not fit in memory otherwise); a
    wrong number of graphs is refused."""
    case = cb.Case(1, "equal", prompts=[4], blocks=[[1, 9]])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8), dtype=np.float32)
    y = rng.standard_normal((2, 5), dtype=np.float32)
    nodes = [_node(0, "x", (8, 2)), _node(1, "out", (5, 2), ["x"])]
    for n, v in zip(nodes, (x, y)):
        n.digest = hashlib.sha256(v.tobytes()).hexdigest()
    roles = [("batched", -1), ("alone", 0), ("batched", -1), ("own", 0), ("batched", -1)]
    made = []

    def graphs(n):
        for _ in range(n):
            made.append(_graph(nodes, [x[None, None].copy(), y[None, None].copy()]))
            yield made[-1]
    seqs, reproducible, kept = cb.compare_case(case, graphs(5), roles)
    assert reproducible and seqs[0].identical and seqs[0].own_outputs_identical
    assert kept[0] is made[0] and kept[0].values
    assert all(k.values == {} and k.nodes is g.nodes for k, g in zip(kept[1:], made[1:]))
    for n in (4, 6):
        with pytest.raises(cb.CheckBatchError, match="block graphs"):
            cb.compare_case(case, graphs(n), roles, "graphgen")


def test_comparison_refuses_when_no_output_can_be_cut():
    case = cb.Case(2, "equal", prompts=[4, 4], blocks=[[1, 9], [2, 9]])
    v = np.zeros((1, 1, 3, 3), dtype=np.float32)
    batched = _graph([_node(0, "out", (3, 3))], [v])   # no axis of 4 tokens: cannot be cut
    alone = _graph([_node(0, "out", (3, 2))], [v[:, :, :2]])
    with pytest.raises(cb.CheckBatchError, match="no output"):
        cb.compare_sequence(batched, alone, case, 0)


def test_rows_of_token_and_block_axes():
    # [64, T] with T = 7 (blocks 4 and 3): sequence 1 is rows 4..7
    assert cb.rows_of([64, 7, 1, 1], [64, 3, 1, 1], 7, 3, 4, 2, 1) == (2, 4, 7)
    # [1, 64 T] token-major: 64 values a token
    assert cb.rows_of([1, 448, 1, 1], [1, 192, 1, 1], 7, 3, 4, 2, 1) == (2, 256, 448)
    # [4, n_blocks] per block: block 1 of 2
    assert cb.rows_of([4, 2, 1, 1], [4, 1, 1, 1], 8, 4, 4, 2, 1) == (2, 1, 2)
    assert cb.rows_of([64, 7, 2, 1], [64, 3, 1, 1], 7, 3, 4, 2, 1) is None
    assert cb.rows_of([64, 256, 1, 1], [64, 256, 1, 1], 7, 3, 4, 2, 1) == "whole"


def _run(draft, n_seq, fa=False):
    return cb.check_batch(draft, n_seqs=[n_seq], flash_attn=fa, engines=("graphgen",))


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


def test_lattice_head_refuses_unequal_blocks_by_name(tmp_path):
    path = tmp_path / "dflash2.gguf"
    make_model(path, "dflash2", "base")
    rep = cb.check_batch(path, n_seqs=[2], engines=("graphgen",))
    unequal = rep.cases[1]
    assert unequal.kind == "unequal" and unequal.note.startswith("unequal blocks: not allowed by this head")
    assert "not allowed by this head" in rep.format_text()
    with pytest.raises(cb.CheckBatchError, match="--block 5"):
        cb.check_batch(path, n_seqs=[2], block=5, engines=("graphgen",))


def test_an_output_missing_in_the_batch_is_a_difference(tmp_path):
    # LiliCorr builds its lattice only for a batch of full blocks: batched with a shorter block,
    # a full block gets logits alone; by itself it gets its lattice
    path = tmp_path / "lilicorr.gguf"
    make_model(path, "lilicorr", "base")
    rep = cb.check_batch(path, n_seqs=[2], engines=("graphgen",))
    full, short = rep.cases[1].seqs["graphgen"]
    assert (full.n_tokens, short.n_tokens) == (4, 3)
    assert full.outputs_nmse == np.inf and full.first_node.endswith("(absent batched)")
    assert short.identical


def test_default_run_is_small_and_exit_says_dependence(draft, capsys):
    """Without --n-seq one batch size runs (seconds on a tiny draft, not the whole sweep); the
    exit code is 1 when some sequence's results depend on the batch (a one-token block alone
    is a one-row matmul: its last bits differ), 0 when none does."""
    assert cb.DEFAULT_N_SEQ == (4,) and cb.THOROUGH_N_SEQ == (1, 2, 4, 8, 16)
    rc = main(["check-batch", "-m", str(draft), "--engine", "graphgen", "--json", "--quiet"])
    out = json.loads(capsys.readouterr().out)
    assert [(c["n_seq"], c["blocks"]) for c in out["cases"]] == [(4, "equal"), (4, "unequal")]
    assert out["batch_dependent"] == {"graphgen": True}
    assert rc == 1 == out["exit_code"]
    # equal blocks of two sequences: nothing depends on the batch, exit 0
    assert main(["check-batch", str(draft), "--engine", "graphgen", "--n-seq", "2", "--quiet"]) == 0
    assert "exit 0: no result depends on the batch" in capsys.readouterr().out
    with pytest.raises(cb.CheckBatchError, match="--fail-on parity"):
        cb.check_batch(draft, n_seqs=[2], engines=("graphgen",), fail_on="parity")


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


def test_unnamed_nodes_reported_by_op_source_and_index():
    """ggml names an unnamed node `node_<i>`: the report names its op, the named node it reads
    (through unnamed ones) and its index instead."""
    nodes = [Node(index=0, name="Kcur-0", op="MUL_MAT", type="f32", ne=[8, 4, 1, 1], src=["w", "x"]),
             Node(index=1, name="node_1", op="VIEW", type="f32", ne=[8, 2, 1, 1], src=["Kcur-0"]),
             Node(index=2, name="node_2 (reshaped)", op="RESHAPE", type="f32", ne=[16, 1, 1, 1], src=["node_1"]),
             Node(index=3, name="node_3", op="MUL_MAT", type="f32", ne=[1, 1, 1, 1], src=["w2", "node_2 (reshaped)"]),
             Node(index=4, name="node_4", op="SCALE", type="f32", ne=[1, 1, 1, 1], src=["node_3"]),
             Node(index=5, name="kq-0", op="SCALE", type="f32", ne=[1, 1, 1, 1], src=["node_4"])]
    assert [cb.node_label(nodes, k) for k in range(6)] == [
        "Kcur-0", "VIEW of Kcur-0 (#1)", "RESHAPE of Kcur-0 (#2)", "MUL_MAT of w2 (#3)", "SCALE of w2 (#4)", "kq-0"]


def test_report_names_the_first_differing_node(draft):
    """The tiny draft's one-token block differs from its first matmul on; the report names that
    node by op and sources, never as ggml's `node_<i>`."""
    rep = _run(draft, 4)
    bad = [s for s in rep.cases[1].seqs["graphgen"] if not s.identical]
    assert len(bad) == 1 and bad[0].n_tokens == 1
    assert bad[0].first_node == "MUL_MAT of blk.0.attn_q.weight and noise_norm-0 (#3)"
    text = rep.format_text()
    assert "node_" not in text and "first differing node MUL_MAT of blk.0.attn_q.weight" in text


def test_context_flags_and_what_the_header_says(draft, capsys):
    """-c and -ub as llama.cpp's: the header says what each holds; sizes too small are refused
    naming the flag and the size needed; -fa auto turns flash attention on as b11739 does on
    the CPU."""
    rc = main(["check-batch", str(draft), "--engine", "graphgen", "--n-seq", "4", "-c", "512", "-ub", "100",
               "-fa", "auto", "--quiet"])
    text = capsys.readouterr().out
    head = text.splitlines()[:2]
    assert rc == 1
    assert head[0].startswith("check-batch dflash.gguf: flash attention on (-fa auto), KV cache f16/f16, block 4, "
                              "prompts of 6 to 10 rows")
    # 4 sequences: prompts 6, 9, 7, 10 and blocks 4+4 (equal) = 48 cells; 16 tokens in the batch
    assert head[1] == ("  context -c 512: the largest case's prompts and blocks take 48 cells; micro-batch -ub 100: "
                       "the longest step sends 16 tokens, computed as one graph")
    # 8 sequences: 94 cells, but the longest step is the batch's 32 tokens: -ub 64, not 94
    from types import SimpleNamespace
    rules = SimpleNamespace(equal_blocks=False, max_block=0, head="dflash")
    st = cb.settings_for(cb.plan_cases(rules, 100, 99, [8], 4, 6, 0), False, "f16", "f16", 0)
    assert (st.cells, st.longest, st.n_ubatch, st.n_ctx) == (94, 32, 64, 256)
    for argv, needle in ((["-ub", "15"], "-ub 15: the largest step sends 16 tokens"),
                         (["-c", "47"], "-c 47: the largest case takes 48 cells"),
                         (["-b", "8"], "-ub 8:")):
        assert main(["check-batch", str(draft), "--engine", "graphgen", "--n-seq", "4", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("graphgen: error:") and needle in err[0], err
