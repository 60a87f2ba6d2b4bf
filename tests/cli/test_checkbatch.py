"""graphgen/cli/checkbatch.py: `graphgen check-batch`'s flags as check_batch takes them (the sweep,
the engines, llama.cpp's micro-batch cap, the cache types), the report on stdout as text or JSON,
and its exit code. The check itself: tests/checkbatch/."""

import json

import pytest

import graphgen.checkbatch as CB


class _Report:
    def __init__(self, code):
        self.code, self.model = code, None

    def to_dict(self):
        return {"model": self.model, "fake": True}

    def format_text(self):
        return f"report of {self.model}"

    def exit_code(self):
        return self.code


@pytest.fixture
def calls(monkeypatch):
    """check_batch's arguments, one dict a call; it reports exit code 1."""
    seen = []

    def fake(model, **kw):
        seen.append(dict(kw, model=model))
        return _Report(1)
    monkeypatch.setattr(CB, "check_batch", fake)
    return seen


def test_the_defaults(cli, tiny, calls):
    r = cli("check-batch", tiny, "--quiet")
    assert r.code == 1 and r.out == "report of tiny.gguf\n"  # the report's exit code; the draft as given
    (kw,) = calls
    assert kw["model"] == str(tiny) and kw["n_seqs"] == [4] and kw["engines"] == ("graphgen", "llama.cpp")
    assert (kw["flash_attn"], kw["type_k"], kw["type_v"], kw["n_threads"], kw["seed"]) == ("off", "f16", "f16", 1, 0)
    assert (kw["block"], kw["prompt"], kw["n_ctx"], kw["n_ubatch"], kw["fail_on"]) == (None, 6, None, None, "batch")


def test_the_flags_reach_the_check(cli, tiny, calls):
    assert cli("check-batch", "-m", tiny, "--n-seq", "2,8", "--engine", "llama.cpp", "-fa", "on", "-ctv", "q8_0",
               "--block", 3, "--prompt", 9, "-c", 512, "-ub", 32, "-t", 2, "--seed", 5, "--fail-on", "parity",
               "--quiet").code == 1
    kw = calls[-1]
    assert kw["n_seqs"] == [2, 8] and kw["engines"] == ("llama.cpp",)
    assert (kw["flash_attn"], kw["type_k"], kw["type_v"]) == ("on", "f16", "q8_0")
    assert (kw["block"], kw["prompt"], kw["n_ctx"], kw["n_ubatch"], kw["n_threads"], kw["seed"], kw["fail_on"]) == \
        (3, 9, 512, 32, 2, 5, "parity")
    cli("check-batch", tiny, "--thorough", "--type-kv", "f32", "--quiet")
    assert calls[-1]["n_seqs"] == [1, 2, 4, 8, 16] and (calls[-1]["type_k"], calls[-1]["type_v"]) == ("f32", "f32")


@pytest.mark.parametrize("flags, n_ubatch", [(["-b", "16"], 16), (["-b", "16", "-ub", "32"], 16),
                                             (["-b", "64", "-ub", "32"], 32), (["-ub", "8"], 8)])
def test_the_batch_caps_the_micro_batch(flags, n_ubatch, cli, tiny, calls):
    assert cli("check-batch", tiny, *flags, "--quiet").code == 1
    assert calls[-1]["n_ubatch"] == n_ubatch


def test_json_report(cli, tiny, calls):
    r = cli("check-batch", tiny, "--json", "--quiet")
    assert json.loads(r.out) == {"model": "tiny.gguf", "fake": True}


@pytest.mark.parametrize("flags, words", [
    (["--thorough", "--n-seq", "4"], "--thorough is --n-seq 1,2,4,8,16: give one of them"),
    (["-ctv", "q8_0"], "--type-v q8_0: a quantized V cache requires flash attention (-fa on)"),
    (["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
    (["--seed", "x"], "argument --seed: expected a whole number"),
])
def test_refusals_before_the_check(flags, words, cli, tiny, calls):
    r = cli("check-batch", tiny, *flags)
    assert r.code == 2 and words in r.err and r.out == ""
    assert calls == []


def test_a_missing_draft_is_refused(cli, tmp_path, calls):
    r = cli("check-batch", tmp_path / "none.gguf")
    assert r.code == 2 and "none.gguf: no such draft model file" in r.err and calls == []


def test_a_real_check_of_two_sequences(cli, tiny):
    r = cli("check-batch", tiny, "--engine", "graphgen", "--n-seq", "2", "--json", "--quiet")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["model"] == "tiny.gguf" and doc["engines"] == ["graphgen"] and doc["batch_dependent"] == {
        "graphgen": False}
    assert [(c["n_seq"], c["blocks"]) for c in doc["cases"]] == [(2, "equal"), (2, "unequal")]
    assert doc["settings"]["block"] == 4 and doc["settings"]["flash_attn"] is False

def test_a_device_takes_graphgens_engine_alone(tmp_path):
    """-dev puts graphgen's runs on a device; b11739 runs on its CPU, so a parity across devices
    is refused, naming the flag, before anything runs."""
    import subprocess
    import sys
    from graphgen.synth import make_model
    make_model(tmp_path / "d.gguf", "dflash", seed=1)
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "check-batch", "-m", str(tmp_path / "d.gguf"),
                        "-dev", "CUDA0"], capture_output=True, text=True)
    assert p.returncode == 2 and "-dev CUDA0" in p.stderr and "--engine graphgen" in p.stderr
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "check-batch", "-m", str(tmp_path / "d.gguf"),
                        "-dev", "CPU", "--engine", "graphgen", "--json"], capture_output=True, text=True)
    # 1 is a batch dependence found (b11739 shares it), not a refusal
    assert p.returncode in (0, 1), p.stderr
    assert json.loads(p.stdout)["engines"] == ["graphgen"]
