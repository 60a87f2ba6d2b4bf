"""Ctrl-C (SIGINT) or SIGTERM at any moment: exit 130 (143), one line, no traceback, nothing left
that looks complete, the user's earlier files byte for byte as they were.

Each case starts a command on a draft deep enough to keep it busy for several seconds and sends
the signal after a delay, so it lands in model loading, in graph building, inside ggml's compute,
inside the eval callback that records a dump (where ctypes would swallow it), or while files are
written. 20 moments over dump (both engines), trace, xdiff, make-model, draft and bench.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REF_DIR

CLI = [sys.executable, "-m", "graphgen.cli"]
# seconds to wait for a child that should end: one that lost the signal would run on (or loop
# forever); generous, so that a loaded machine's slowness is never taken for that
HANG = 3600
SCENARIO = REF_DIR / "dflash-fa-off" / "scenario.json"


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A 400-layer draft: each command on it runs for seconds, not milliseconds."""
    from graphgen.synth import make_model
    path = tmp_path_factory.mktemp("deep") / "deep.gguf"
    make_model(path, "dflash", n_layer=400, n_embd=128, n_ff=256)
    return path


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under folder (hidden ones included) with its digest."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _earlier_dump(folder: Path) -> None:
    """What a user had in the output folder: an earlier run's dumps and a note of their own."""
    folder.mkdir(parents=True)
    (folder / "00-block.json").write_text(json.dumps({"format": "graphgen-dump/1", "earlier": True}))
    (folder / "notes.txt").write_text("my notes\n")


def _run_and_signal(cmd, delay: float, sig, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(CLI + cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    if proc.poll() is not None:
        pytest.fail(f"{cmd[0]} finished before the signal at {delay} s: the workload is too small "
                    f"(exit {proc.returncode}): {proc.stderr.read()[-300:]}")
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{cmd[0]} did not end within {HANG} s of {sig.name}")
    return subprocess.CompletedProcess(cmd, proc.returncode, "", err)


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".partial") or ".partial" in p.name]


CASES = [
    # (command, delay in s, signal): the output folder or file is named OUT
    (["dump", "{model}", "--scenario", str(SCENARIO), "--out", "OUT"], 0.3, signal.SIGINT),
    (["dump", "{model}", "--scenario", str(SCENARIO), "--out", "OUT"], 1.5, signal.SIGINT),
    (["dump", "{model}", "--scenario", str(SCENARIO), "--out", "OUT"], 3.0, signal.SIGINT),
    (["dump", "{model}", "--scenario", str(SCENARIO), "--out", "OUT"], 4.5, signal.SIGTERM),
    (["dump", "{model}", "--scenario", str(SCENARIO), "--out", "OUT", "--engine", "llama.cpp"], 1.0, signal.SIGINT),
    (["dump", "{model}", "--scenario", str(SCENARIO), "--out", "OUT", "--engine", "llama.cpp"], 2.5, signal.SIGTERM),
    (["trace", "{model}", "--scenario", str(SCENARIO), "--dump", "OUT"], 1.5, signal.SIGINT),
    (["trace", "{model}", "--scenario", str(SCENARIO), "--dump", "OUT", "--json"], 3.5, signal.SIGINT),
    (["xdiff", "{model}", "--scenario", str(SCENARIO), "--backends", "cpu,cpu", "--out", "OUT"], 1.5, signal.SIGINT),
    (["xdiff", "{model}", "--scenario", str(SCENARIO), "--backends", "cpu,cpu", "--out", "OUT"], 5.0, signal.SIGINT),
    (["xdiff", "{model}", "--scenario", str(SCENARIO), "--backends", "cpu,cpu", "--out", "OUT"], 9.0, signal.SIGTERM),
    (["make-model", "OUT", "--layers", "900", "--n-embd", "128", "--n-ff", "256"], 0.5, signal.SIGINT),
    (["make-model", "OUT", "--layers", "900", "--n-embd", "128", "--n-ff", "256"], 1.5, signal.SIGINT),
    (["make-model", "OUT", "--layers", "900", "--n-embd", "128", "--n-ff", "256"], 2.5, signal.SIGTERM),
    (["draft", "{model}", "--prompt-tokens", "1,2,3,4", "--n-predict", "400"], 1.5, signal.SIGINT),
    (["draft", "{model}", "--prompt-tokens", "1,2,3,4", "--n-predict", "400", "--json"], 3.5, signal.SIGINT),
    (["draft", "{model}", "--prompt-tokens", "1,2,3,4", "--n-predict", "400"], 5.0, signal.SIGTERM),
    (["bench", "{model}", "--repeat", "50", "--engines", "graphgen", "--svg", "OUT"], 1.5, signal.SIGINT),
    (["bench", "{model}", "--repeat", "50", "--engines", "graphgen", "--svg", "OUT"], 4.0, signal.SIGINT),
    (["bench", "{model}", "--repeat", "50", "--engines", "graphgen,llama.cpp", "--svg", "OUT"], 3.0, signal.SIGTERM),
]


@pytest.mark.parametrize("cmd,delay,sig", CASES,
                         ids=[f"{c[0]}-{d}s-{s.name}" for c, d, s in CASES])
def test_signal_ends_the_command_cleanly(tmp_path, deep, cmd, delay, sig):
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    if cmd[0] in ("dump", "trace", "xdiff"):
        _earlier_dump(out)
    elif cmd[0] == "bench":
        # an earlier plot, which bench may replace once done (another kind of file it refuses at once)
        out.write_text('<svg xmlns="http://www.w3.org/2000/svg"><!-- earlier plot the user had --></svg>\n')
    else:
        out.write_bytes(b"GGUF earlier file the user had")
    before = _snapshot(work)
    args = [a.replace("{model}", str(deep)).replace("OUT", str(out)) if isinstance(a, str) else a for a in cmd]
    p = _run_and_signal(args, delay, sig, work)
    want = 143 if sig == signal.SIGTERM else 130
    assert p.returncode == want, (p.returncode, p.stderr[-2000:])
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr[-2000:]
    assert lines and lines[-1] == ("graphgen: terminated" if sig == signal.SIGTERM else "graphgen: interrupted")
    # what the user had is untouched, and nothing new that looks complete (or half-written) remains
    assert _snapshot(work) == before, (sorted(_snapshot(work)), sorted(before))
    assert not _leftovers(work)
    if out.is_dir():
        assert not _leftovers(out)


def _handlers_in_place(pid: int) -> bool:
    """Whether graphgen's handlers are installed: the kernel lists the signals a process catches
    (SigCgt); Python catches SIGINT from its start, SIGTERM only once graphgen's entry point runs."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    m = re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M)
    return bool(m and int(m.group(1), 16) >> (signal.SIGTERM - 1) & 1)


@pytest.fixture
def busy_cpu():
    """Every core busy, as on a loaded CI machine: the signal lands at other moments than on an
    idle one (in imports, in the parser, in the middle of class creation)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    yield
    for p in procs:
        p.kill()
        p.wait()


EARLY = [
    ["make-model", "OUT", "--layers", "900", "--n-embd", "128", "--n-ff", "256"],
    ["dump", "{model}", "--scenario", str(SCENARIO), "--out", "OUT"],
]
# seconds after graphgen's handlers are in place: at once (imports, the parser), then onwards
EARLY_DELAYS = (0.0, 0.002, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to see the handlers installed")
@pytest.mark.parametrize("load", ["idle", "busy"])
@pytest.mark.parametrize("cmd", EARLY, ids=[c[0] for c in EARLY])
def test_a_signal_early_ends_the_command_the_same_way(tmp_path, deep, request, cmd, load):
    """From the moment graphgen's entry point runs (before that it is the interpreter's own
    start), SIGINT ends the command with exit 130 and one line, at whatever moment it lands; on
    an idle machine and on a busy one."""
    if load == "busy":
        request.getfixturevalue("busy_cpu")
    for k, delay in enumerate(EARLY_DELAYS):
        work = tmp_path / f"w{k}"
        work.mkdir()
        out = work / "out"
        args = [a.replace("{model}", str(deep)).replace("OUT", str(out)) for a in cmd]
        proc = subprocess.Popen(CLI + args, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        while not _handlers_in_place(proc.pid):
            if proc.poll() is not None or time.monotonic() - t0 > HANG:
                proc.kill()
                pytest.fail(f"{cmd[0]} never installed its handlers: {proc.communicate()[1][-500:]}")
        t1 = time.monotonic()
        while time.monotonic() - t1 < delay:
            pass
        assert proc.poll() is None, f"{cmd[0]} finished before the signal at {delay} s"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG)
        assert proc.returncode == 130, (delay, proc.returncode, err[-2000:])
        assert err.strip().splitlines() == ["graphgen: interrupted"], (delay, err[-2000:])
        assert sorted(p.name for p in work.iterdir()) == [], (delay, sorted(work.iterdir()))


def test_an_interrupt_inside_exec_code_ends_as_any_other(tmp_path):
    """A KeyboardInterrupt raised in code that exec() runs from a string (as dataclasses build
    their methods, at import) leaves the interpreter set to kill itself with SIGINT at exit,
    although graphgen caught it: the command, run as `python -m`, still ends with 130 and its
    one line."""
    (tmp_path / "exec_interrupt.py").write_text(
        "import sys\n"
        "import graphgen.cli as cli\n"
        "real = cli._main\n"
        "def _main(argv):\n"
        "    exec('import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nwhile True: pass', {})\n"
        "    return real(argv)\n"
        "cli._main = _main\n"
        "sys.exit(cli.main(['--version']))\n")
    p = subprocess.run([sys.executable, "-m", "exec_interrupt"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=HANG)
    assert (p.returncode, p.stderr) == (130, "graphgen: interrupted\n"), (p.returncode, p.stderr[-2000:])


def test_a_signal_in_a_weakref_callback_is_not_lost(tmp_path):
    """Python prints and drops an exception raised in a weakref callback (WeakKeyDictionary's,
    which the imports and ctypes run): the interrupt landing there still ends the command, with
    its one line and nothing printed about the callback."""
    (tmp_path / "weakref_interrupt.py").write_text(
        "import sys, time, weakref, os, signal\n"
        "import graphgen.cli as cli\n"
        "real = cli._main\n"
        "class C: pass\n"
        "def cb(_):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    for _ in range(100000): pass\n"
        "def _main(argv):\n"
        "    c = C(); r = weakref.ref(c, cb); del c\n"
        "    t = time.monotonic()\n"
        "    while time.monotonic() - t < 5: pass\n"
        "    return real(argv)\n"
        "cli._main = _main\n"
        "sys.exit(cli.main(['--version']))\n")
    p = subprocess.run([sys.executable, "-m", "weakref_interrupt"], cwd=tmp_path, capture_output=True, text=True)
    assert (p.returncode, p.stderr) == (130, "graphgen: interrupted\n"), (p.returncode, p.stderr[-2000:])


@pytest.mark.parametrize("swallowed", [False, True], ids=["converted", "swallowed"])
def test_an_interrupt_c_code_turns_into_another_error_still_ends_the_command(tmp_path, swallowed):
    """C code may turn the interrupt into another error (an extension's import failing with
    ImportError, a class's __set_name__ failing with RuntimeError), and a caller may swallow
    that error as an optional feature's probe does: the command still ends as interrupted."""
    (tmp_path / "c_interrupt.py").write_text(
        "import os, signal, sys\n"
        "import graphgen.cli as cli\n"
        "real = cli._main\n"
        "class D:\n"
        "    def __set_name__(self, owner, name):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        for _ in range(100000): pass\n"
        "def land():\n"
        "    class C:\n"
        "        d = D()\n"
        "    raise RuntimeError('the interrupt, turned into another error')\n"
        "def _main(argv):\n"
        + ("    try:\n        land()\n    except Exception:\n        pass\n" if swallowed else "    land()\n")
        + "    return real(argv)\n"
        "cli._main = _main\n"
        "sys.exit(cli.main(['devices']))\n")
    p = subprocess.run([sys.executable, "-m", "c_interrupt"], cwd=tmp_path, capture_output=True, text=True)
    assert (p.returncode, p.stderr) == (130, "graphgen: interrupted\n"), (p.returncode, p.stderr[-2000:])


def test_a_signal_in_an_import_callback_is_raised_once_it_returns():
    """Python prints and drops an exception raised in the import system's weakref callbacks: a
    signal landing there is raised a moment later instead, not lost and not printed."""
    import signal
    import time
    import types

    import graphgen.staging as S
    old = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGALRM)
    S.install_handlers()
    cb = types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename="<frozen importlib._bootstrap>", co_name="cb"))
    try:
        S._on_signal(signal.SIGINT, cb)  # returns: nothing raised inside the callback
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            while time.monotonic() - t0 < 2:
                pass
        assert time.monotonic() - t0 < 1
    finally:
        S.clear_pending()
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGALRM, old[1])
