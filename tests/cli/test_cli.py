"""The command line's manners: usage errors in one line, and a dump folder's other files left alone."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REF_DIR

CLI = [sys.executable, "-m", "graphgen.cli"]


@pytest.mark.parametrize("args, what", [
    (["make-model"], "required: OUT"),
    (["bench", "m.gguf", "--repeat", "abc"], "--repeat: expected a whole number"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["bench", "m.gguf", "--engines", "foo"], "--engines: expected graphgen and/or llama.cpp"),
    (["bench", "m.gguf", "--n-seq", "0"], "--n-seq: must be at least 1"),
    (["bench", "m.gguf", "--n-seq", "a"], "--n-seq: expected a whole number"),
    (["bench", "m.gguf", "--repeat", "0"], "--repeat: must be at least 1"),
])
def test_usage_errors_are_one_line(args, what):
    p = subprocess.run(CLI + args, capture_output=True, text=True)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphgen: error:") and what in lines[0], p.stderr
    assert "--help" in lines[0] and "usage:" not in p.stderr


def test_dump_keeps_files_it_did_not_write(tmp_path):
    model = tmp_path / "m.gguf"
    assert subprocess.run(CLI + ["make-model", str(model)], capture_output=True).returncode == 0
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    scen = str(REF_DIR / "dflash-fa-off" / "scenario.json")
    run = lambda: subprocess.run(CLI + ["dump", str(model), "--scenario", scen, "--out", str(out)],  # noqa: E731
                                 capture_output=True, text=True)
    assert run().returncode == 0
    assert (out / "notes.txt").read_text() == "mine"
    # a second run replaces graphgen's own dumps
    first = json.loads((out / "01-block.json").read_text())
    assert run().returncode == 0 and json.loads((out / "01-block.json").read_text())["nodes"] == first["nodes"]
    # a file with a dump's name that is not a dump is never overwritten: the run is refused
    (out / "07-results.json").write_text('{"accuracy": 0.9}')
    p = run()
    assert p.returncode == 2 and "07-results.json is not a graphgen dump" in p.stderr
    assert json.loads((out / "07-results.json").read_text()) == {"accuracy": 0.9}


def test_make_model_flags_win_over_the_preset(tmp_path):
    from graphgen.runtime.model import load
    out = tmp_path / "p.gguf"
    p = subprocess.run(CLI + ["make-model", str(out), "--preset", "realistic", "--layers", "1", "--vocab", "512",
                              "--wtype", "q8_0"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    hp = load(out).hparams
    assert (hp.n_layer, hp.n_vocab, hp.n_embd, hp.n_head) == (1, 512, 2048, 32)  # the rest from the preset


def test_make_model_refuses_a_draft_graphgen_would_refuse(tmp_path):
    out = tmp_path / "bad.gguf"
    p = subprocess.run(CLI + ["make-model", str(out), "--n-embd", "60"], capture_output=True, text=True)
    assert p.returncode == 2 and "rope.dimension_count" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_draft_takes_a_backend(tmp_path):
    model = tmp_path / "m.gguf"
    assert subprocess.run(CLI + ["make-model", str(model)], capture_output=True).returncode == 0
    base = CLI + ["draft", str(model), "--prompt-tokens", "1,2,3,4,5,6", "--n-predict", "4", "--quiet"]
    p = subprocess.run(base + ["--backend", "cpu"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # --quiet: no header, no progress
    p = subprocess.run(base + ["--backend", "tpu"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown backend 'tpu'" in p.stderr
    p = subprocess.run(base + ["--accept", "2,-3"], capture_output=True, text=True)
    assert p.returncode == 2 and "--accept takes counts >= 0, or -1" in p.stderr


@pytest.mark.parametrize("cmd", ["trace", "info"])
def test_a_closed_pipe_ends_quietly(tmp_path, cmd):
    model = tmp_path / "m.gguf"
    assert subprocess.run(CLI + ["make-model", str(model)], capture_output=True).returncode == 0
    args = [cmd, str(model)] + (["--scenario", str(REF_DIR / "dflash-fa-off" / "scenario.json")]
                                if cmd == "trace" else [])
    p = subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    p.stdout.read(16)
    p.stdout.close()  # the reader goes away, as `| head -c 16` does
    err = p.stderr.read().decode()
    rc = p.wait()
    assert rc in (0, 141), err
    assert "Traceback" not in err and "Exception ignored" not in err and "error" not in err, err


def test_rpc_server_refuses_a_busy_port_before_announcing():
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # one that failed to refuse would serve until stopped: bounded, generously for a loaded machine
        p = subprocess.run(CLI + ["rpc-server", "--port", str(port)], capture_output=True, text=True, timeout=3600)
    assert p.returncode == 2 and "Address already in use" in p.stderr and "RPC server on" not in p.stderr
    p = subprocess.run(CLI + ["rpc-server", "--backend", "vulkan"], capture_output=True, text=True, timeout=3600)
    assert p.returncode == 2 and "no vulkan device" in p.stderr and "RPC server on" not in p.stderr


def test_view_names_what_it_was_given(tmp_path):
    other = tmp_path / "s.json"
    other.write_text('{"accuracy": 0.9}')
    p = subprocess.run(CLI + ["view", str(other), "--format", "dot"], capture_output=True, text=True)
    assert p.returncode == 2 and "not a graphgen dump" in p.stderr
    # several graphs into --out diff.html: pages beside it, not a folder called diff.html, and
    # diff.html the index linking them
    case = str(REF_DIR / "dflash-fa-off")
    out = tmp_path / "v" / "diff.html"
    p = subprocess.run(CLI + ["view", case, case, "--format", "html", "--out", str(out)], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    assert out.is_file() and sorted(x.name for x in out.parent.iterdir()) == [
        "diff-00-inject.html", "diff-01-block.html", "diff.html"]


def test_xdiff_same_backend_twice_and_a_missing_one(tmp_path):
    model = tmp_path / "m.gguf"
    assert subprocess.run(CLI + ["make-model", str(model)], capture_output=True).returncode == 0
    scen = str(REF_DIR / "dflash-fa-off" / "scenario.json")
    tmp_env = dict(os.environ, TMPDIR=str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    p = subprocess.run(CLI + ["xdiff", str(model), "--scenario", scen, "--backends", "cpu,cpu", "--keep"],
                       capture_output=True, text=True, env=tmp_env)
    assert p.returncode == 0 and "PASS" in p.stdout, p.stderr
    where = p.stderr.strip().splitlines()[-1].split(" are in ")[-1]
    assert sorted(x.name for x in __import__("pathlib").Path(where).iterdir()) == ["cpu", "cpu-2"]
    # without --keep (or --out) the temporary dumps go once compared
    shutil.rmtree(where)
    p = subprocess.run(CLI + ["xdiff", str(model), "--scenario", scen, "--backends", "cpu,cpu"],
                       capture_output=True, text=True, env=tmp_env)
    assert p.returncode == 0 and "PASS" in p.stdout and not list((tmp_path / "t").iterdir()), p.stderr
    # a backend the loaded ggml lacks is refused before the other side runs
    p = subprocess.run(CLI + ["xdiff", str(model), "--scenario", scen, "--backends", "cpu,vulkan",
                              "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert p.returncode == 2 and "no vulkan backend" in p.stderr and not (tmp_path / "x").exists()


def test_reporting_commands_print_json(tmp_path):
    model = tmp_path / "m.gguf"
    assert subprocess.run(CLI + ["make-model", str(model), "--layers", "3"], capture_output=True).returncode == 0
    run = lambda *a: json.loads(subprocess.run(CLI + list(a), capture_output=True, text=True).stdout)  # noqa: E731
    info = run("info", str(model), "--json")
    assert info["variant"] == "dflash" and info["hparams"]["n_layer"] == 3 and info["ggml"]["version"] == "0.27.0"
    assert any(t["name"] == "token_embd.weight" for t in info["tensors"])
    dev = run("devices", "--json")
    assert dev["backends"]["cpu"] and any(d["kind"] == "cpu" for d in dev["devices"])
    xd = run("xdiff", str(model), "--scenario", str(REF_DIR / "dflash-fa-off" / "scenario.json"),
             "--backends", "cpu,cpu", "--json")
    assert xd["ok"] and [g["graph"] for g in xd["graphs"]] == ["inject", "block"]


def test_draft_stops_at_n_predict_and_says_why(tmp_path):
    model = tmp_path / "d.gguf"
    assert subprocess.run(CLI + ["make-model", str(model)], capture_output=True).returncode == 0
    base = CLI + ["draft", str(model), "--prompt-tokens", "1,2,3,4,5,6", "--quiet"]
    # whole drafts of 3 plus the target's token: 1 + 4 * 8 would be 33 tokens, cut at 32
    p = subprocess.run(base + ["--n-predict", "32", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["generated_tokens"] == 32 == len(doc["tokens"]) - 6 and doc["stop_reasons"] == ["n_predict"]
    p = subprocess.run(base + ["--n-predict", "32"], capture_output=True, text=True)
    assert "generated        32 tokens" in p.stdout and "stopped          --n-predict 32 reached" in p.stdout
    # a continuation shorter than --n-predict: the run ends with it, and says so
    p = subprocess.run(base + ["--n-predict", "32", "--target-tokens", "9,8,7"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == ""
    assert "stopped          --target-tokens ran out after 3 of --n-predict 32 tokens" in p.stdout
    assert p.stdout.rstrip().endswith("tokens           1,2,3,4,5,6,9,8,7")


# ---- llama.cpp's short flags, and no abbreviations -------------------------------------------

# what each llama.cpp short flag means there (common/arg.cpp; rpc-server's own for -H and -p),
# as the dest graphgen stores it under
LLAMA_SHORT = {"-m": {"model_flag", "target_model"}, "-fa": {"flash_attn"}, "-c": {"n_ctx"}, "-b": {"n_batch"},
               "-ub": {"n_ubatch"}, "-t": {"threads"}, "-np": {"n_parallel", "n_seq"},
               "-dev": {"backend", "backends"}, "-ctk": {"type_k"}, "-ctv": {"type_v"}, "-n": {"n_predict"},
               # the speculative ones: the draft model, its caches and device; the prompt text and its file
               "-md": {"model_draft"}, "-ctkd": {"type_k_draft"}, "-ctvd": {"type_v_draft"}, "-devd": {"device_draft"},
               "-p": {"prompt_text"}, "-f": {"file"}}
RPC_SERVER_SHORT = {"-H": {"host"}, "-p": {"port"}}
# graphgen's own, on commands llama.cpp does not have: diff's and xdiff's op filter
OWN_SHORT = {("diff", "-o"), ("xdiff", "-o")}


def _subcommands():
    from graphgen.cli import build_parser
    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(getattr(a, "choices", None), dict))
    return ap, sub.choices


def test_every_llama_cpp_short_flag_means_what_it_means_in_llama_cpp():
    _, cmds = _subcommands()
    seen = set()
    for name, p in cmds.items():
        for a in p._actions:
            for o in a.option_strings:
                if o.startswith("--") or o == "-h" or (name, o) in OWN_SHORT:
                    continue
                meaning = RPC_SERVER_SHORT.get(o) if name == "rpc-server" and o in RPC_SERVER_SHORT else LLAMA_SHORT.get(o)
                assert meaning is not None, f"{name} {o}: a short flag llama.cpp does not have"
                assert a.dest in meaning, f"{name} {o} sets {a.dest}, where llama.cpp's {o} is {meaning}"
                seen.add(o)
    assert {"-m", "-fa", "-c", "-b", "-ub", "-t", "-np", "-dev", "-ctk", "-ctv", "-n", "-md", "-p"} <= seen


def test_n_is_n_predict_on_draft_and_refused_where_there_is_none():
    ap, cmds = _subcommands()
    a = ap.parse_args(["draft", "m.gguf", "--prompt-tokens", "1,2,3", "-n", "8"])
    assert (a.n_predict, a.n_parallel) == (8, None)
    # dump's -n is the run on a target's n_predict
    assert cmds["dump"]._option_string_actions["-n"].dest == "n_predict"
    for cmd in [["bench", "m.gguf"], ["trace", "m.gguf"], ["check-batch", "m.gguf"]]:
        with pytest.raises(SystemExit):
            ap.parse_args(cmd + ["-n", "2"])


def _abbreviations(p):
    """Each flag of p shortened by a character, where that is no flag of its own."""
    for o in p._option_string_actions:
        for k in range(2 if not o.startswith("--") else 3, len(o)):
            if o[:k] not in p._option_string_actions:
                yield o, o[:k]


def test_no_subcommand_takes_an_abbreviated_flag():
    """A shortened or mistyped flag is unknown, never read as the flag it begins (`--target` as
    make-model's --target-layers, `-n` as -np)."""
    _, cmds = _subcommands()
    for name, p in cmds.items():
        for a in p._actions:
            a.required = False  # only the flag under test matters
        for whole, short in _abbreviations(p):
            try:
                _, extra = p.parse_known_args([short, "1"])
            except SystemExit:
                pytest.fail(f"{name}: {short} was taken for a flag (ambiguous abbreviation)")
            assert short in extra, f"{name}: {short} was read as {whole}"


def test_abbreviated_and_n_flags_refused_on_the_command_line(tmp_path):
    model = tmp_path / "m.gguf"
    p = subprocess.run(CLI + ["make-model", str(model), "--targ", "T.gguf"], capture_output=True, text=True)
    assert p.returncode == 2 and "unrecognized arguments: --targ" in p.stderr and not model.exists()
    assert subprocess.run(CLI + ["make-model", str(model)], capture_output=True).returncode == 0
    # -n is n_predict of a run on a target: without -md it is refused, not ignored
    p = subprocess.run(CLI + ["dump", "-m", str(model), "-n", "2", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "-n applies to a run on a real target" in p.stderr and not (tmp_path / "o").exists()
    p = subprocess.run(CLI + ["draft", str(model), "--prompt-tokens", "1,2,3,4,5,6", "-n", "8", "--json", "--quiet"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["generated_tokens"] == 8 and "tokens_per_sequence" not in s


def _positionals():
    _, cmds = _subcommands()
    return [(name, a.dest, a.help) for name, p in cmds.items() for a in p._actions if not a.option_strings]


@pytest.mark.parametrize("name,dest,text", _positionals(), ids=[f"{n}-{d}" for n, d, _ in _positionals()])
def test_every_positional_says_what_it_is(name, dest, text):
    assert text, f"graphgen {name}: the positional {dest} has no help text"


def test_demo_says_where_its_files_are(tmp_path):
    """Without --out the demo's folder is a temporary one it keeps: it says where; with --out
    the folder is the user's and nothing is left in the temporary folder."""
    tmp = tmp_path / "t"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    p = subprocess.run(CLI + ["demo"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    (work,) = tmp.iterdir()
    last = p.stdout.strip().splitlines()[-1]
    assert f"are in {work} (a temporary folder, kept" in last and (work / "tiny-dflash.gguf").is_file()
    out = tmp_path / "mine"
    p = subprocess.run(CLI + ["demo", "--out", str(out)], capture_output=True, text=True, env=env,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "temporary folder" not in p.stdout and (out / "tiny-dflash.gguf").is_file()
    assert list(tmp.iterdir()) == [work]


@pytest.mark.parametrize("flags, words", [
    (["--svg", "{dir}"], ["--svg", "is a folder"]),
    (["--markdown", "{dir}"], ["--markdown", "is a folder"]),
    (["--svg", "{notes}/plot.svg"], ["notes.txt is a file, not a folder"]),
    (["--markdown", "{tmp}/none/b.md"], ["no such folder", "none"]),
    (["--svg", "{notes}"], ["notes.txt: exists and is not an SVG file", "--force"]),
])
def test_bench_refuses_its_outputs_before_the_runs(tmp_path, flags, words):
    """An --svg or --markdown that cannot be written is refused at once, not after minutes of runs;
    an --svg that would replace a file that is no SVG needs --force."""
    model = tmp_path / "m.gguf"
    assert subprocess.run(CLI + ["make-model", str(model)], capture_output=True).returncode == 0
    (tmp_path / "d").mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    args = [f.format(dir=tmp_path / "d", notes=notes, tmp=tmp_path) for f in flags]
    p = subprocess.run(CLI + ["bench", str(model), "--repeat", "1", "--engine", "graphgen"] + args,
                       capture_output=True, text=True)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and p.stdout == "" and len(lines) == 1 and lines[0].startswith("graphgen: error: "), \
        p.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert notes.read_text() == "mine" and sorted(f.name for f in tmp_path.iterdir()) == ["d", "m.gguf", "notes.txt"]
    assert not any((tmp_path / "d").iterdir())


def test_bench_writes_its_svg_and_replaces_one_it_wrote(tmp_path):
    model = tmp_path / "m.gguf"
    assert subprocess.run(CLI + ["make-model", str(model)], capture_output=True).returncode == 0
    svg, md = tmp_path / "new" / "plot.svg", tmp_path / "b.md"
    base = CLI + ["bench", str(model), "--repeat", "1", "--engine", "graphgen", "--svg", str(svg)]
    for _ in range(2):  # the second replaces the first's SVG without --force
        p = subprocess.run(base + ["--markdown", str(md)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert svg.read_text().startswith("<svg") and "m.gguf: block step time" in svg.read_text()
    assert md.read_text().count("### m.gguf") == 2
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    p = subprocess.run(base[:-1] + [str(notes), "--force"], capture_output=True, text=True)
    assert p.returncode == 0 and notes.read_text().startswith("<svg"), p.stderr
