"""Progress on stderr for slow work (forced with --progress, silenced with --quiet, never on stdout),
the streamed writing of big drafts, and the reference's stderr kept beside its dumps."""

import io
import json
import subprocess
import sys
import time

import pytest
from conftest import REF_DIR

from graphgen import progress
from graphgen.synth import make_model

CLI = [sys.executable, "-m", "graphgen.cli"]
SCENARIO = REF_DIR / "dflash-fa-off" / "scenario.json"


def run(args, **kw):
    return subprocess.run(CLI + args, capture_output=True, text=True, **kw)


class Terminal(io.StringIO):
    def isatty(self):
        return True


# -- the helper -------------------------------------------------------------------------------

def test_always_prints_each_stage_and_the_time():
    out = io.StringIO()
    with progress.Task("job", out, mode="always") as t:
        t.update("loading the model")
        t.update("loading the model")      # the same message: no second line
        t.update("computing step 1 of 2")  # a new stage: at once
        t.update("computing step 2 of 2")  # same stage within a second: held back...
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["graphgen: job: loading the model", "graphgen: job: computing step 1 of 2",
                         "graphgen: job: computing step 2 of 2"]  # ...and printed when the task ends
    assert lines[3].startswith("graphgen: job: done in ") and len(lines) == 4


def test_never_and_auto_off_a_terminal_print_nothing(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.05)
    for mode, stream in (("never", Terminal()), ("never", io.StringIO()), ("auto", io.StringIO())):
        with progress.Task("job", stream, mode=mode) as t:
            t.update("writing")
            time.sleep(0.2)
        assert stream.getvalue() == "", mode


def test_auto_on_a_terminal_shows_slow_work_only(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.1)
    monkeypatch.setattr(progress, "REDRAW", 0.02)
    quick = Terminal()
    with progress.Task("job", quick, mode="auto") as t:
        t.update("writing a")
    assert quick.getvalue() == ""
    slow = Terminal()
    with progress.Task("job", slow, mode="auto") as t:
        t.update("writing a")
        time.sleep(0.3)
        t.update("writing b")
        time.sleep(0.1)
    text = slow.getvalue()
    # redrawn in place, then left as one finished line
    assert "\r\x1b[Kgraphgen: job: writing a (" in text and "\r\x1b[Kgraphgen: job: writing b (" in text
    assert text.endswith("s\n") and "graphgen: job: done in " in text.rsplit("\r", 1)[-1]


def test_mode_flags():
    assert progress.mode_from_flags() == "auto"
    assert progress.mode_from_flags(force=True) == "always"
    assert progress.mode_from_flags(quiet=True, force=True) == "never"
    with pytest.raises(ValueError, match="progress mode"):
        progress.set_mode("loud")


# -- the commands -----------------------------------------------------------------------------

def test_make_model_progress(tmp_path):
    out = tmp_path / "m.gguf"
    args = ["make-model", str(out), "--n-embd", "128", "--vocab", "2000"]
    p = run(args + ["--progress"])
    assert p.returncode == 0, p.stderr
    assert "graphgen: make-model" not in p.stdout and p.stdout.startswith("wrote ")
    err = p.stderr.splitlines()
    total = out.stat().st_size / 1e6
    assert err[0].startswith(f"graphgen: make-model {out}: writing token_embd.weight, ")
    # the MB total is the tensor data: the file less its header
    said = float(err[0].split(" of ")[1].split()[0])
    assert 0.9 * total < said <= total
    assert any("checking that graphgen loads it" in ln for ln in err)
    assert err[-1].startswith(f"graphgen: make-model {out}: done in ")
    # before the command name too; --quiet wins; and without a terminal nothing unless forced
    assert run(["--progress"] + args).stderr.startswith("graphgen: make-model")
    for extra in (["--quiet", "--progress"], ["--progress", "--quiet"], []):
        p = run(args + extra)
        assert p.returncode == 0 and p.stderr == "", (extra, p.stderr)


def test_draft_progress_and_quiet(tmp_path):
    model = tmp_path / "d.gguf"
    make_model(model, "dflash", block_size=4)
    base = ["draft", str(model), "--prompt-tokens", "1,2,3,4", "--n-predict", "6"]
    p = run(base + ["--progress"])
    assert p.returncode == 0, p.stderr
    assert f"graphgen: draft {model.name}: loading the draft's weights" in p.stderr
    assert "graphgen:" not in p.stdout and "[round 1]" in p.stderr
    p = run(base + ["--quiet", "--progress"])
    assert p.returncode == 0 and p.stderr == "" and "generated        6 tokens" in p.stdout


@pytest.mark.reference
def test_dump_llama_cpp_progress_and_stderr_log(tmp_path):
    model = tmp_path / "d.gguf"
    make_model(model, "dflash")
    out = tmp_path / "ref"
    args = ["dump", str(model), "--scenario", str(SCENARIO), "--out", str(out), "--engine", "llama.cpp"]
    p = run(args + ["--progress"], env=dict(__import__("os").environ, GGML_SCHED_DEBUG="2"))
    assert p.returncode == 0, p.stderr
    err = p.stderr.splitlines()
    assert err[0] == f"graphgen: llama.cpp on {model.name}: loading the model"
    assert f"graphgen: llama.cpp on {model.name}: computing step 2 of 2" in err
    assert err[-1] == f"graphgen: llama.cpp's stderr is in {out / 'llama.cpp.log'}"
    assert "graphgen:" not in p.stdout
    log = (out / "llama.cpp.log").read_text()
    # llama.cpp's own loader log and the scheduler's debug output, which used to be dropped
    assert "llama_model_loader" in log and "## SPLIT #0" in log
    p = run(args + ["--quiet"])
    assert p.returncode == 0 and p.stderr == ""
    log = (out / "llama.cpp.log").read_text()
    assert "llama_model_loader" in log and "## SPLIT" not in log  # this run's log, not the last one's


@pytest.mark.reference
def test_reference_failure_keeps_its_stderr(tmp_path):
    import gguf
    from gguf_edit import rewrite

    from graphgen.reference.runner import ReferenceFailed, run_reference
    make_model(tmp_path / "base.gguf", "dflash", n_rot=8)
    # llama.cpp's loader throws on a sections array of the wrong length
    model = rewrite(tmp_path / "base.gguf", tmp_path / "draft.gguf",
                    set_keys={"dflash.rope.dimension_sections": (gguf.GGUFValueType.ARRAY, [2, 1, 1])})
    with pytest.raises(ReferenceFailed) as e:
        run_reference(model, SCENARIO, tmp_path / "ref")
    log = (tmp_path / "ref" / "llama.cpp.log").read_text()
    assert "wrong array length" in e.value.stderr and e.value.stderr == log
    with pytest.raises(ReferenceFailed) as e:
        run_reference(model, SCENARIO, tmp_path / "ref2", stderr_log=None)
    assert "wrong array length" in e.value.stderr and not (tmp_path / "ref2" / "llama.cpp.log").exists()


# -- streaming: memory follows the largest tensor, not the file ----------------------------------

PEAK_CHILD = """
import json, resource, sys
import numpy, gguf
from graphgen.synth import make_model
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
make_model(sys.argv[1], "dflash", n_embd=512, n_layer=16, n_head=8, n_ff=2048, n_vocab=2000,
           target_layers=[1, 2], wtype=sys.argv[2])
print(json.dumps({"base_kib": base, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


@pytest.mark.parametrize("wtype, min_mib, share", [("f32", 250, 4), ("q8_0", 65, 3)])
def test_making_a_model_holds_one_tensor_at_a_time(tmp_path, wtype, min_mib, share):
    out = tmp_path / "mid.gguf"
    p = subprocess.run([sys.executable, "-c", PEAK_CHILD, str(out), wtype], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    size_mib = out.stat().st_size / 2**20
    grown_mib = (r["peak_kib"] - r["base_kib"]) / 1024
    # the largest tensor is 4 MiB in f32 (ffn 512 x 2048); holding every weight would take the file's size
    assert size_mib > min_mib
    assert grown_mib < size_mib / share, (grown_mib, size_mib)
