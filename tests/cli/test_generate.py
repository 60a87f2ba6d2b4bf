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
    from graphgen.speculative.targets import resolve
    return resolve("smollm2")


@pytest.fixture(scope="module")
def draft(target, tmp_path_factory):
    from graphgen.synth import make_model
    path = tmp_path_factory.mktemp("draft") / "draft.gguf"
    make_model(path, "dflash", target=target, n_layer=1, block_size=6, seed=3)
    return path


def run(args):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True)


def test_greedy_run_reports_the_loop_and_equals_the_target_alone(target, draft):
    p = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 10, "--temp", 0, "--json",
             "--spec-draft-n-max", 5])
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(p.stdout)
    assert s["greedy"] and s["generated_tokens"] == 10 and s["n_max"] == 5
    assert s["same_tokens_as_target_alone"] is True
    # as llama-server: a full block each round, but the last rounds draft at most the tokens left - 1
    n_prompt = len(s["tokens"][0]) - 10
    # before a round at pos0 the target has generated pos0 - n_prompt + 1 tokens (id_last among them)
    caps = [min(5, 10 - (r["pos0"] - n_prompt + 1) - 1) for r in s["rounds_detail"]]
    assert [len(r["draft"]) for r in s["rounds_detail"]] == [max(c, 0) for c in caps]
    assert s["blocks"] >= 1 and s["drafted_tokens"] == sum(max(c, 0) for c in caps)
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
    assert "mean acceptance" in q.stderr and "per position" in q.stderr and "target alone" not in q.stderr


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
    p = run(args)
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
    # mid-generation: once the target's child runs and a few seconds of rounds have passed; the
    # bounds below only stop a run that lost the signal, generous for a loaded machine
    deadline = time.time() + 3600
    while not _children(proc.pid) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(4)
    children = _children(proc.pid)
    assert children and proc.poll() is None, "the target's child process should be running"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=3600)
    assert proc.returncode == 130 and err.strip().endswith("graphgen: interrupted"), err[-2000:]
    assert out == ""  # --json: nothing that looks like a result
    deadline = time.time() + 3600
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


# -- llama.cpp's flags, refused before the run where they cannot work ---------------------------

REFUSED = {
    # a block is one non-causal batch: a micro-batch below it would fail every round
    "ubatch_below_block": (["-ub", 4, "--spec-draft-n-max", 5], ["block of 6 tokens", "micro-batch of 4"]),
    "batch_caps_ubatch": (["-b", 5, "--spec-draft-n-max", 5], ["block of 6 tokens", "micro-batch of 5", "-b 5"]),
    "n_max_negative": (["--spec-draft-n-max", -1], ["--spec-draft-n-max must be >= 0"]),
    "n_max_zero": (["--spec-draft-n-max", 0], ["--spec-draft-n-max 0 drafts nothing"]),
    "p_min_above_one": (["--spec-draft-p-min", 2], ["--spec-draft-p-min must be in [0, 1]"]),
    "p_min_negative": (["--spec-draft-p-min", -1], ["--spec-draft-p-min must be in [0, 1]"]),
    "n_min_above_n_max": (["--spec-draft-n-min", 3, "--spec-draft-n-max", 2], ["above --spec-draft-n-max 2"]),
    "n_zero": (["-n", 0], ["-n must be at least 1, or -1"]),
    "seed_out_of_range": (["--seed", 2 ** 32], ["--seed must be in [0, 2^32-1]"]),
    "removed_draft_max": (["--draft-max", 3], ["--draft-max", "removed", "--spec-draft-n-max"]),
    "removed_draft_min": (["--draft-min", 1], ["--draft-min", "removed", "--spec-draft-n-min"]),
    "features_with_a_target": (["--features", "f.npy"], ["--features", "the target computes the features"]),
    "accept_with_a_target": (["--accept", "1"], ["--accept", "the target decides"]),
    "target_tokens_with_a_target": (["--target-tokens", "1,2"], ["--target-tokens"]),
    "verifier_seed_with_a_target": (["--verifier-seed", 3], ["--verifier-seed"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_flags_that_cannot_work_are_refused_before_any_round(case, target, draft):
    extra, want = REFUSED[case]
    p = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 4, "--temp", 0] + extra)
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-2000:])
    assert all(w in p.stderr for w in want), p.stderr
    # refused before the loop: nothing generated, streamed or summarised
    assert p.stdout == "" and "drafted" not in p.stderr and "[round" not in p.stderr


@pytest.mark.parametrize("flag", [["--spec-draft-n-max", -1], ["--spec-draft-p-min", 2], ["-n", 0]])
def test_the_draft_flags_have_one_range_with_a_target_and_without(flag, target, draft, tmp_path):
    from graphgen.synth import make_model
    alone = tmp_path / "alone.gguf"
    make_model(alone, "dflash", seed=1)
    with_target = run(["draft", "-m", target, "-md", draft, "-p", PROMPT] + flag)
    without = run(["draft", alone, "--prompt-tokens", "1,2,3"] + flag)
    assert with_target.returncode == without.returncode == 2
    last = [q.stderr.strip().splitlines()[-1] for q in (with_target, without)]
    assert last[0] == last[1], last


def test_llama_cpp_meanings_of_seed_n_and_c(target, draft):
    """--seed -1 draws a seed, -n -1 generates until the text ends or the context is full, -c 0
    is the target's trained context (8192 for SmolLM2), and a -c above it is warned of."""
    from graphgen.cli.generate import trained_context
    trained = trained_context(target)
    assert trained == 8192
    p = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 3, "--seed", -1, "--temp", 0.8,
             "--no-baseline", "--json"])
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(p.stdout)
    assert s["generated_tokens"] == 3 and 0 <= s["seed"] <= 0xFFFFFFFF and s["seed"] != 0xFFFFFFFF
    # -n -1 on a context of 256: the sequence ends with the text or with the context
    p = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", -1, "-c", 256, "--temp", 0, "--no-baseline",
             "--json"])
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(p.stdout)
    n_prompt = len(s["tokens"][0]) - s["generated_tokens"]
    room = 256 - n_prompt - 6 - 1   # the prompt, a block of 6 past the last token
    assert s["n_predict"] == room
    assert (s["stop_reasons"] == ["context"] and s["generated_tokens"] == room) or \
        (s["stop_reasons"] == ["eog"] and s["generated_tokens"] <= room), (s["stop_reasons"], s["generated_tokens"])
    # -c 0: the trained context; above it, llama.cpp's warning
    p = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 2, "-c", 0, "--temp", 0, "--no-baseline",
             "--json"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["context"]["n_ctx"] == trained and "trained context" not in p.stderr
    p = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 2, "-c", trained + 256, "--temp", 0,
             "--no-baseline", "--json"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["context"]["n_ctx"] == trained + 256
    assert f"above the target's trained context of {trained}" in p.stderr, p.stderr


def test_the_summary_reports_the_fields_figures_and_every_round(target, draft):
    p = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 12, "--temp", 0, "--json"])
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(p.stdout)
    rounds = s["rounds_detail"]
    drafts = [r for r in rounds if r["draft"]]
    accepted = sum(r["n_accepted"] for r in rounds)
    assert s["drafts"] == len(drafts) and s["accepted_tokens"] == accepted
    # vLLM's, z-lab's and llama.cpp's mean acceptance length: the target's own token counted
    assert s["mean_acceptance_length"] == pytest.approx(1 + accepted / len(drafts))
    tokens = s["tokens"][0]
    n_prompt = len(tokens) - 12
    assert s["prompt_eval"]["tokens"] == n_prompt and s["eval"]["tokens"] == 11
    assert s["prompt_eval"]["seconds"] > 0 and s["eval"]["seconds"] > 0
    assert s["target_alone"]["prompt_eval"]["tokens"] == n_prompt and s["target_alone"]["eval"]["tokens"] == 11
    assert s["target_alone"]["tokens"] == s["tokens"]
    # the rounds rebuild the text: each round adds its last token and the drafted tokens the target
    # took, and the target's tokens are those, then its own
    rebuilt = tokens[:n_prompt]
    for r in rounds:
        assert r["pos0"] == len(rebuilt) and r["id_last"] == tokens[len(rebuilt)]
        assert r["target"][:r["n_accepted"]] == r["draft"][:r["n_accepted"]]
        if len(r["target"]) > r["n_accepted"] and r["n_accepted"] < len(r["draft"]):
            assert r["target"][r["n_accepted"]] != r["draft"][r["n_accepted"]]
        rebuilt += [r["id_last"]] + r["draft"][:r["n_accepted"]]
    assert tokens[:len(rebuilt)] == rebuilt and len(tokens) - len(rebuilt) <= 1
    # --verbose: the same rounds on stderr, one line each
    v = run(["draft", "-m", target, "-md", draft, "-p", PROMPT, "-n", 12, "--temp", 0, "--verbose",
             "--no-baseline"])
    assert v.returncode == 0, v.stderr[-2000:]
    lines = [line for line in v.stderr.splitlines() if line.startswith("[round ")]
    assert len(lines) == len(rounds)
    for line, r in zip(lines, rounds):
        assert f"pos {r['pos0']}: id_last {r['id_last']}, drafted {len(r['draft'])} {r['draft']}, target " \
               f"{r['target']}, accepted {r['n_accepted']}" in line, line
    assert "-c 4096, -fa auto (on)" in v.stderr and "K/V cache: target f16/f16, draft f16/f16" in v.stderr


def test_a_parting_from_the_target_alone_is_named_with_its_margins(target):
    """Four sequences in one batch, -fa off, part from the target alone at near ties (measured: three
    partings, each within 0.35 logits of margins summed): the run names the sequence, the token, both
    tokens and margins, calls it a near tie and exits 0; the same parting judged with no band exits 1
    naming it."""
    args = ["draft", "-m", "smollm2", "-md", "smollm2-dflash", "-n", 64, "--temp", 0, "-np", 4, "-fa", "off"]
    for text in (PROMPT, "Once upon a time", "My grandmother always told me that",
                 "To keep a houseplant healthy, you should"):
        args += ["-p", text]
    p = run(args + ["--json"])
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(p.stdout)
    alone = s["target_alone"]["tokens"]
    partings = s["partings"]
    assert s["same_tokens_as_target_alone"] is False and partings, partings
    assert len({pt["seq"] for pt in partings}) == len(partings)  # one, the first, per sequence
    for pt in partings:
        seq, k = pt["seq"], pt["index"]
        n_prompt = len(s["tokens"][seq]) - 64
        # the named parting is the first generated token where the two runs differ
        assert s["tokens"][seq][n_prompt:n_prompt + k] == alone[seq][n_prompt:n_prompt + k]
        assert (pt["drafted"], pt["alone"]) == (s["tokens"][seq][n_prompt + k], alone[seq][n_prompt + k])
        assert pt["near_tie"] and 0 <= pt["margin_alone"] and 0 <= pt["margin_drafted"]
    pt = partings[0]
    seq, k = pt["seq"], pt["index"]
    from graphgen.speculative.verifier import TIE_BAND
    assert pt["margin_alone"] + pt["margin_drafted"] <= TIE_BAND
    q = run(args)
    assert q.returncode == 0
    line = next(line for line in q.stderr.splitlines() if line.startswith("parting"))
    assert f"sequence {seq}, generated token {k}" in line and "a near tie" in line, line
    assert f"drafting gave {pt['drafted']} " in line and f"the target alone {pt['alone']} " in line, line
    # with no band, the same parting fails the run, naming it
    code = subprocess.run([sys.executable, "-c", "import sys, graphgen.speculative.verifier as v; v.TIE_BAND = 0.0; "
                           "from graphgen.cli import main; sys.exit(main(sys.argv[1:]))"] + [str(a) for a in args],
                          capture_output=True, text=True)
    assert code.returncode == 1, code.stderr[-2000:]
    assert "error: drafting changed the target's greedy text beyond a near tie" in code.stderr
    assert f"sequence {seq}, generated token {k}" in code.stderr.splitlines()[-1]
