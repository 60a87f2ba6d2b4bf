"""graphgen/cli/draft.py: `graphgen draft` with a simulated verifier (a draft alone): its inputs
(prompt tokens, @FILE, features), the flags that need a target refused without one, what the summary
says the verifier accepted, and every sequence's tokens. With a real target: tests/cli/test_generate.py."""

import json

import numpy as np
import pytest

from graphgen import __version__
from graphgen.cli.draft import _features, _int_list, _tokens_arg
from graphgen.errors import GraphgenError

WIDTH = 128  # the tiny draft's features: 2 target layers x n_embd 64


def _json(cli, *argv):
    r = cli("draft", *argv, "--json", "--quiet")
    assert r.code == 0, r.err
    return json.loads(r.out)


def test_token_lists_and_files(tmp_path):
    assert _int_list("1, 2,,3") == [1, 2, 3]
    with pytest.raises(GraphgenError, match="expected comma-separated integers, got '1,x'"):
        _int_list("1,x")
    f = tmp_path / "p.txt"
    f.write_text("4 5\n6,7\n")
    assert _tokens_arg(f"@{f}", "--prompt-tokens") == [4, 5, 6, 7]
    with pytest.raises(FileNotFoundError, match="none.txt: no such --target-tokens file"):
        _tokens_arg(f"@{tmp_path / 'none.txt'}", "--target-tokens")
    with pytest.raises(GraphgenError, match="--prompt-tokens: no tokens given"):
        _tokens_arg(" , ", "--prompt-tokens")


def _fargs(features=None, seed=None):
    return type("A", (), {"features": features, "features_seed": seed})()


def test_random_features_take_the_seed_plus_the_sequence():
    a = _features(_fargs(seed=4), 5, WIDTH, seq=1)
    assert a.shape == (5, WIDTH) and a.dtype == np.float32
    np.testing.assert_array_equal(a, _features(_fargs(seed=5), 5, WIDTH, seq=0))
    assert not np.array_equal(a, _features(_fargs(seed=4), 5, WIDTH, seq=0))
    np.testing.assert_array_equal(_features(_fargs(), 3, WIDTH), _features(_fargs(seed=0), 3, WIDTH))


def test_a_features_file_is_checked(tmp_path):
    good = tmp_path / "f.npy"
    np.save(good, np.ones((9, WIDTH), np.float64))
    f = _features(_fargs(str(good)), 4, WIDTH)
    assert f.dtype == np.float32 and f.shape == (9, WIDTH) and (f == 1).all()
    np.save(good, np.ones((9, 64), np.float32))
    with pytest.raises(GraphgenError, match=r"features must be \[n_positions, 128\] .*got shape \[9, 64\]"):
        _features(_fargs(str(good)), 4, WIDTH)
    bad = np.ones((9, WIDTH), np.float32)
    bad[3, 7] = np.nan
    np.save(good, bad)
    with pytest.raises(GraphgenError, match="the features contain NaN or Inf"):
        _features(_fargs(str(good)), 4, WIDTH)
    (tmp_path / "t.npy").write_text("not numpy")
    with pytest.raises(GraphgenError, match="t.npy: not a numpy .npy array"):
        _features(_fargs(str(tmp_path / "t.npy")), 4, WIDTH)
    with pytest.raises(FileNotFoundError, match="none.npy: no such features file"):
        _features(_fargs(str(tmp_path / "none.npy")), 4, WIDTH)


def test_the_run_says_what_the_verifier_accepted(cli, tiny):
    s = _json(cli, tiny, "--prompt-tokens", "1,2,3", "-n", 6)
    assert s["tokens"][:3] == [1, 2, 3] and len(s["tokens"]) == 9 and s["generated_tokens"] == 6
    assert s["verifier"] == {"simulated": True, "accepts": "every drafted token (--accept -1)"}
    assert s["engine"] == "graphgen" and s["engine_detail"] == f"graphgen {__version__} (CPU)"
    assert "tokens_per_sequence" not in s
    s = _json(cli, tiny, "--prompt-tokens", "1,2,3", "-n", 6, "--accept", "0")
    assert s["accepted_tokens"] == 0 and s["mean_acceptance_length"] == 1.0 and s["drafts"] >= 1
    assert s["verifier"]["accepts"] == "0 drafted tokens per round, cycled (--accept; -1: all)"


def test_target_tokens_end_the_run_and_say_so(cli, tiny, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("9 8 7")
    s = _json(cli, tiny, "--prompt-tokens", "1,2,3", "-n", 6, "--target-tokens", f"@{f}")
    assert s["tokens"] == [1, 2, 3, 9, 8, 7] and s["stop_reasons"] == ["target_tokens"]
    assert s["verifier"]["accepts"] == "the longest draft prefix matching --target-tokens"
    # -n -1 runs until they end
    s = _json(cli, tiny, "--prompt-tokens", "1,2,3", "-n", -1, "--target-tokens", "9,8,7,6")
    assert s["tokens"] == [1, 2, 3, 9, 8, 7, 6]


def test_several_sequences_each_print_their_tokens(cli, tiny):
    s = _json(cli, tiny, "--prompt-tokens", "1,2,3", "-n", 5, "-np", 2, "--accept", "1,0")
    seqs = s["tokens_per_sequence"]
    assert len(seqs) == 2 and seqs[0] == s["tokens"] and all(q[:3] == [1, 2, 3] and len(q) == 8 for q in seqs)
    r = cli("draft", tiny, "--prompt-tokens", "1,2,3", "-n", 5, "-np", 2, "--accept", "1,0", "--quiet")
    lines = r.out.splitlines()
    assert f"tokens seq 0     {','.join(map(str, seqs[0]))}" in lines
    assert f"tokens seq 1     {','.join(map(str, seqs[1]))}" in lines
    assert "verifier         simulated (no target model runs): 1,0 drafted tokens per round, cycled " \
           "(--accept; -1: all)" in lines
    assert "stopped          --n-predict 5 reached" in lines
    assert "spec type        draft-dflash (draft head dflash, n_max 3)" in lines


def test_the_header_and_rounds_go_to_stderr_with_progress(cli, tiny):
    r = cli("draft", tiny, "--prompt-tokens", "1,2,3", "-n", 4, "--progress", "--spec-draft-n-max", 2)
    assert r.code == 0, r.err
    assert f"draft {tiny}: draft-dflash (head dflash), block_size 4, n_max 2, n_min 0, p_min 0\n" in r.err
    assert "[round 1] seq 0 pos 3: id_last " in r.err and "[round" not in r.out


@pytest.mark.parametrize("flags, words", [
    (["-p", "hello"], ["-p / -f take text, which needs a target's vocabulary"]),
    ([], ["no prompt: give --prompt-tokens"]),
    (["--no-baseline"], ["--no-baseline applies to a run with a target"]),
    (["--llama-loop"], ["--llama-loop applies to a run with a target"]),
    (["--loop-edges", "simple"], ["--loop-edges simple applies to a run with a target"]),
    (["-ctkd", "q8_0"], ["-ctkd applies to a run with a target", "-ctk, -ctv and -dev set its cache types"]),
    (["-devd", "CPU"], ["-devd applies to a run with a target"]),
    (["-c", "0"], ["-c 0 takes the target's trained context, and a simulated run has no target"]),
    (["-n", "-1"], ["-n -1 generates until the text ends, which a simulated verifier never does"]),
    (["--accept", "1,-2"], ["--accept takes counts >= 0, or -1 for the whole draft; got '1,-2'"]),
    (["-ctv", "q8_0", "-fa", "off"], ["--type-v q8_0: a quantized V cache requires flash attention (-fa on)"]),
    (["--spec-draft-n-max", "0"], ["--spec-draft-n-max 0 drafts nothing"]),
])
def test_refused_in_one_line_before_any_round(flags, words, cli, tiny):
    prompt = [] if flags == [] or flags[0] == "-p" else ["--prompt-tokens", "1,2,3"]
    r = cli("draft", tiny, *prompt, *flags)
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1 and r.err.startswith("graphgen: error: "), r.err
    for w in words:
        assert w in r.err


def test_a_missing_draft_is_named(cli, tmp_path):
    r = cli("draft", tmp_path / "none.gguf", "--prompt-tokens", "1,2")
    assert r.code == 2 and f"{tmp_path / 'none.gguf'}: no such model file" in r.err
