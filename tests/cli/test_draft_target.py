"""`graphgen draft / dump / diff -m TARGET -md DRAFT`: the command line of the real-target loop, its
summary, its refusals and its interrupt."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

CLI = [sys.executable, "-m", "graphgen.cli"]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def target():
    from graphgen.targets import resolve
    return resolve("smollm2")


@pytest.fixture(scope="module")
def draft(target, tmp_path_factory):
    from graphgen.synth import make_model
    path = tmp_path_factory.mktemp("draft") / "draft.gguf"
    make_model(path, "dflash", target=target, n_layer=1, block_size=6, seed=3)
    return path


def run(args, timeout=600):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def test_greedy_run_reports_the_loop_and_equals_the_target_alone(target, draft):
    p = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 10, "--temp", 0, "--json"])
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(p.stdout)
    assert s["greedy"] and s["generated_tokens"] == 10 and s["n_max"] == 5
    assert s["same_tokens_as_target_alone"] is True
    assert s["blocks"] >= 1 and s["drafted_tokens"] == 5 * s["blocks"]
    assert len(s["acceptance_per_position"]) == 5
    assert s["seconds"]["target"] > 0 and s["seconds"]["draft"] > 0
    assert s["target_alone"]["generated_tokens"] == 10
    # the text is the target's own detokenization of the generated tokens
    from graphgen.reference.session import ReferenceTarget
    with ReferenceTarget(target, [1], n_ctx=256, n_batch=64) as tg:
        prompt = tg.tokenize(PROMPT)
        assert s["tokens"][0][:len(prompt)] == prompt and len(s["tokens"][0]) == len(prompt) + 10
        text = b"".join(tg.pieces(s["tokens"][0][len(prompt):])[0]).decode()
    assert s["text"] == [text] and "Paris" in text
    # streamed: the same text on stdout, the summary on stderr
    q = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 10, "--temp", 0, "--no-baseline"])
    assert q.returncode == 0, q.stderr[-2000:]
    assert q.stdout == text + "\n"
    assert "mean accepted" in q.stderr and "per position" in q.stderr and "target alone" not in q.stderr


def test_sampled_runs_repeat_with_a_seed_and_both_engines_agree(target, draft):
    outs = []
    for engine in ("graphgen", "llama.cpp", "graphgen"):
        p = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 8, "--temp", 0.9, "--seed", 7,
                 "--engine", engine, "--no-baseline", "--json"])
        assert p.returncode == 0, p.stderr[-2000:]
        outs.append(json.loads(p.stdout)["tokens"])
    assert outs[0] == outs[1] == outs[2]
    other = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 8, "--temp", 0.9, "--seed", 8,
                 "--no-baseline", "--json"])
    assert json.loads(other.stdout)["tokens"] != outs[0]


@pytest.mark.parametrize("case", ["not_gguf", "draft_as_target", "no_target_file", "long_prompt", "no_prompt",
                                  "probabilistic"])
def test_bad_input_is_refused_in_lines_naming_it(case, target, draft, tmp_path):
    args = ["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 4]
    want = []
    if case == "not_gguf":
        bad = tmp_path / "notes.gguf"
        bad.write_text("not a model\n")
        args[2], want = bad, ["notes.gguf"]
    elif case == "draft_as_target":
        args[2], want = draft, ["draft.gguf", "not a target"]
    elif case == "no_target_file":
        args[2], want = tmp_path / "missing.gguf", ["missing.gguf", "no such"]
    elif case == "long_prompt":
        # llama.cpp rounds the context up to 256 cells
        args = ["draft", "-m", target, "-md", draft, "-p", "word " * 300, "-n", 4, "-c", 256]
        want = ["context needs", "-c is 256"]
    elif case == "no_prompt":
        args = ["draft", "-m", target, "-md", draft, "-n", 4]
        want = ["no prompt"]
    else:
        args += ["--spec-draft-sampling", "probabilistic"]
        want = ["probabilistic"]
    p = run(args, timeout=300)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert lines and all(line.startswith("graphgen: error: ") for line in lines), p.stderr
    assert all(w in p.stderr for w in want), p.stderr
    assert p.stdout == ""


def test_a_draft_without_embeddings_needs_its_target(draft):
    p = run(["draft", draft, "--prompt-tokens", "1,2,3", "-n", 2])
    assert p.returncode == 2 and "token_embd.weight" in p.stderr and "-md" in p.stderr, p.stderr


def test_interrupt_mid_generation_ends_with_130_and_no_child(target, draft):
    proc = subprocess.Popen(CLI + ["draft", "-m", str(target), "-md", str(draft), "-p", PROMPT, "-n", "2000",
                                   "-c", "4096", "--temp", "0", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # mid-generation: once the target's child runs and a few seconds of rounds have passed
    deadline = time.time() + 120
    while not _children(proc.pid) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(4)
    children = _children(proc.pid)
    assert children and proc.poll() is None, "the target's child process should be running"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().endswith("graphgen: interrupted"), err[-2000:]
    assert out == ""  # --json: nothing that looks like a result
    deadline = time.time() + 30
    while time.time() < deadline and any(os.path.exists(f"/proc/{c}") and _alive(c) for c in children):
        time.sleep(0.2)
    assert not [c for c in children if _alive(c)]


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_dump_and_diff_on_the_target_compare_the_draft_graphs(target, draft, tmp_path):
    ours = tmp_path / "ours"
    p = run(["dump", "-m", target, "-md", draft, "-p", PROMPT, "-n", 4, "--out", ours])
    assert p.returncode == 0, p.stderr[-2000:]
    sc = json.loads((ours / "target-run.json").read_text())
    kinds = [next(iter(s)) for s in sc["steps"]]
    assert kinds[0] == "inject" and "block" in kinds and "seq_rm" in kinds
    import numpy as np
    with np.load(ours / "target-features.npz") as z:
        first = z["step0"]
    assert first.shape[1] == 3 * 576 and np.isfinite(first).all() and first.std() > 0
    ref = tmp_path / "ref"
    p = run(["dump", draft, "--scenario-from", ours, "--engine", "llama.cpp", "--out", ref])
    assert p.returncode == 0, p.stderr[-2000:]
    d = run(["diff", ref, ours, "--json"])
    res = json.loads(d.stdout)
    assert d.returncode == 0 and res["identical"] and len(res["results"]) == len(
        [k for k in kinds if k != "seq_rm"]), d.stdout[-2000:]
    both = run(["diff", "-m", target, "-md", draft, "-p", PROMPT, "-n", 3, "--quiet"])
    assert both.returncode == 0 and "0 diverged" in both.stdout, both.stdout + both.stderr[-2000:]


def test_dump_with_a_lending_target_on_any_scenario(target, draft, tmp_path):
    """--target lends a borrowing draft its tables on a scenario of random features, both engines."""
    sides = {}
    for engine in ("llama.cpp", "graphgen"):
        sides[engine] = tmp_path / engine
        p = run(["dump", draft, "--target", target, "--engine", engine, "--steps", 2, "--out", sides[engine]])
        assert p.returncode == 0, p.stderr[-2000:]
    d = run(["diff", sides["llama.cpp"], sides["graphgen"], "--quiet"])
    assert d.returncode == 0 and "4 graphs compared, 0 diverged" in d.stdout, d.stdout + d.stderr
    p = run(["dump", draft, "--engine", "llama.cpp", "--out", tmp_path / "none"])
    assert p.returncode == 2 and "token_embd.weight" in p.stderr and "borrows" in p.stderr, p.stderr
