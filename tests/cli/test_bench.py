"""graphgen/cli/bench.py: `graphgen bench`'s flags (--n-seq, --n-kv, --engine), the runs it makes
of them, its JSON and the BENCHMARKS.md section it appends. The timing itself: tests/test_bench.py."""

import argparse
import json

import pytest

from conftest import REF_DIR
from graphgen.cli.bench import DEFAULT_PROMPT, _engines, _n_kv, _n_seq


def _bench(cli, tiny, *flags):
    r = cli("bench", tiny, "--repeat", 1, "--engine", "graphgen", "--quiet", *flags)
    assert r.code == 0, r.err
    return r


def test_list_flags():
    assert _n_seq("1, 4,16") == [1, 4, 16]
    with pytest.raises(argparse.ArgumentTypeError, match="must be at least 1, got 0"):
        _n_seq("1,0")
    assert _n_kv("256,8192") == [256, 8192]
    with pytest.raises(argparse.ArgumentTypeError, match="n_kv is padded to multiples of 256 cells; got 300"):
        _n_kv("256,300")
    assert _engines("both") == ("graphgen", "llama.cpp") and _engines(" llama.cpp , graphgen") == (
        "llama.cpp", "graphgen")
    for bad in ("", "graphgen,torch", " , "):
        with pytest.raises(argparse.ArgumentTypeError, match="expected graphgen and/or llama.cpp"):
            _engines(bad)


def test_one_run_per_n_seq_then_per_n_kv_in_json(cli, tiny):
    doc = json.loads(_bench(cli, tiny, "--prompt", 6, "-np", "1,2", "--n-kv", "256", "--json").out)
    assert isinstance(doc["machine"], str) and doc["machine"]
    runs = doc["runs"]
    assert [(r.get("n_seq"), r.get("n_kv")) for r in runs] == [(1, None), (2, None), (None, 256)]
    assert [s["step"] for s in runs[0]["steps"]] == ["inject 6", "block 4"]
    assert [s["step"] for s in runs[1]["steps"]] == ["inject 6 seq0", "inject 6 seq1", "block 8 x2seq"]
    # the prompt filling the cache to 256 cells: the block attends to all of them
    assert sum(s["n_tokens"] for s in runs[2]["steps"] if s["step"].startswith("inject")) + 4 + 1 == 256
    assert all(r["model"] == tiny.name and r["repeat"] == 1 for r in runs)


def test_without_a_scenario_the_prompt_is_64_rows(cli, tiny):
    assert DEFAULT_PROMPT == 64
    doc = json.loads(_bench(cli, tiny, "--json").out)
    assert [s["step"] for s in doc["runs"][0]["steps"]] == ["inject 64", "block 4"]
    doc = json.loads(_bench(cli, tiny, "--scenario", REF_DIR / "dflash-fa-off" / "scenario.json", "--json").out)
    assert [s["step"] for s in doc["runs"][0]["steps"]] == ["inject 6", "block 4"]


def test_the_markdown_section(cli, tiny, tmp_path):
    md = tmp_path / "B.md"
    r = _bench(cli, tiny, "--prompt", 6, "-np", "1,5", "--n-kv", "256", "--type-kv", "f32", "-fa", "on",
               "--markdown", md)
    assert r.out.count("bench tiny.gguf on cpu, 1 repetitions") == 3  # the tables on stdout as well
    text = md.read_text()
    assert text.startswith("### tiny.gguf, KV cache f32\n\n"
                           "`graphgen bench tiny.gguf --repeat 1 --n-seq 1,5 --n-kv 256 --flash-attn on "
                           "--type-kv f32`\n")
    sections = text.split("\n\nBlock step against")[0].split("\n\nn_")
    assert [s.split(":", 1)[0] for s in sections[1:]] == ["seq 1", "seq 5", "kv 256"]
    rows = [[ln.split(" | ")[0].lstrip("| ") for ln in s.splitlines() if ln.startswith("| ") and " ms" not in ln]
            for s in sections[1:]]
    # more than 4 sequences: one prompt's row stands for the rest; n_kv: the block alone
    assert rows == [["inject 6", "block 4"], ["inject 6 seq0", "block 20 x5seq"], ["block 4"]]
    assert "Block step against context length" in text and "Block step against sequences" in text
    _bench(cli, tiny, "--prompt", 6, "--markdown", md)  # appended, a section a run
    assert md.read_text().startswith(text) and md.read_text().count("### tiny.gguf") == 2
    assert "Block step against" not in md.read_text()[len(text):]  # one run: no scale tables


@pytest.mark.parametrize("flags, words", [
    (["--n-kv", "256", "--scenario", str(REF_DIR / "dflash-fa-off" / "scenario.json")],
     ["--n-kv builds its own prompts; it cannot be combined with --scenario"]),
    (["-ctv", "q8_0"], ["--type-v q8_0: a quantized V cache requires flash attention",
                        '-fa on or "flash_attn": "on" in the scenario']),
    (["--n-kv", "100"], ["--n-kv: n_kv is padded to multiples of 256 cells; got 100"]),
    (["--engine", "torch"], ["--engine: expected graphgen and/or llama.cpp"]),
])
def test_refusals_before_any_run(flags, words, cli, tiny):
    r = cli("bench", tiny, "--repeat", 1, *flags)
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1, r.err
    for w in words:
        assert w in r.err


def test_the_old_engines_spelling_still_works_and_says_so(cli, tiny):
    r = cli("bench", tiny, "--repeat", 1, "--engines", "graphgen", "--prompt", 6, "--json", "--quiet")
    assert r.code == 0 and r.err == "graphgen: --engines is deprecated: use --engine (the same comma list)\n"
    assert set(json.loads(r.out)["runs"][0]["steps"][0]["median_s"]) == {"graphgen"}
