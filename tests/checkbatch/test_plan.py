"""The plan: the cases a head allows, and one context and micro-batch sized to the largest case
(the header says what each holds; -c and -ub too small are refused naming the size needed)."""

from types import SimpleNamespace

import pytest

from graphgen.checkbatch import CheckBatchError, check_batch
from graphgen.checkbatch.plan import plan_cases, settings_for
from graphgen.cli import main
from graphgen.synth import make_model


def test_lattice_head_refuses_unequal_blocks_by_name(tmp_path):
    path = tmp_path / "dflash2.gguf"
    make_model(path, "dflash2", "base")
    rep = check_batch(path, n_seqs=[2], engines=("graphgen",))
    unequal = rep.cases[1]
    assert unequal.kind == "unequal" and unequal.note.startswith("unequal blocks: not allowed by this head")
    assert "not allowed by this head" in rep.format_text()
    with pytest.raises(CheckBatchError, match="--block 5"):
        check_batch(path, n_seqs=[2], block=5, engines=("graphgen",))


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
    rules = SimpleNamespace(equal_blocks=False, max_block=0, head="dflash")
    st = settings_for(plan_cases(rules, 100, 99, [8], 4, 6, 0), False, "f16", "f16", 0)
    assert (st.cells, st.longest, st.n_ubatch, st.n_ctx) == (94, 32, 64, 256)
    for argv, needle in ((["-ub", "15"], "-ub 15: the largest step sends 16 tokens"),
                         (["-c", "47"], "-c 47: the largest case takes 48 cells"),
                         (["-b", "8"], "-ub 8:")):
        assert main(["check-batch", str(draft), "--engine", "graphgen", "--n-seq", "4", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("graphgen: error:") and needle in err[0], err
