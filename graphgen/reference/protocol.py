"""The reference runner's wire protocol, public in one place: what its child processes and their
clients say to each other.

A server (`python -m graphgen.reference.runner --serve`, one scenario a request, or
`python -m graphgen.reference.child`, one context driven call by call; tests/support/workers.py's
graphgen server speaks it too) reads one JSON request a line and writes `S <id>` before a case and `R <json>` after it (`write_start`, `write_reply`).
Arrays travel as base64 float32 rows (`encode_rows`, `decode_rows`). A child that fails, or dies
inside llama.cpp, is explained by `error_text` from its phase-tagged log and its standard error.
`LineWorker` is the one client: a long-lived child, restarted after it dies or hangs.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np


def write_start(stream, case_id) -> None:
    print(f"S {case_id}", file=stream, flush=True)


def write_reply(stream, reply: dict) -> None:
    print("R " + json.dumps(reply), file=stream, flush=True)


def encode_rows(a) -> str | None:
    return None if a is None else base64.b64encode(np.ascontiguousarray(a, dtype=np.float32).tobytes()).decode()


def decode_rows(text, cols: int) -> np.ndarray | None:
    return None if text is None else np.frombuffer(base64.b64decode(text), dtype=np.float32).reshape(-1, cols)


# llama_model_load's line for a file it refuses: its reason follows this (the line after it, "failed
# to load model", says nothing more)
LOAD_ERROR = "error loading model: "


def logged_reason(errors) -> str:
    """llama.cpp's own reason among the error lines it logged for one failure: what follows
    "error loading model: " (`check_tensor_dims: tensor 'blk.0.attn_norm.weight' not found`), else
    its first error line; "" when it logged none."""
    lines = [" ".join(e.split()) for e in errors if e and e.strip()]
    for ln in lines:
        if LOAD_ERROR in ln:
            return ln.split(LOAD_ERROR, 1)[1]
    return lines[0] if lines else ""


ABORT_LINE = re.compile(r"GGML_ASSERT|GGML_ABORT|terminate called|what\(\)|Segmentation fault|"
                         r"^\S+:\d+: .*(fatal|error|failed)", re.I)


def error_text(log_path: Path, stderr: str) -> tuple[str, str]:
    """(headline, whole error) of a failed child: llama.cpp's logged errors from every phase and
    its warnings from the phase that failed, an assertion's own line, and the runner's line. The
    headline is llama.cpp's first error, or the runner's line where that carries it (a refused file:
    its name and llama.cpp's reason)."""
    entries = []
    try:
        for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    except OSError:
        pass
    last_phase = entries[-1]["phase"] if entries else None
    kept = [e for e in entries if e.get("text", "").strip() and (
        e.get("level") == "error" or e.get("level") == "warn" and e.get("phase") == last_phase)]
    errors = [e["text"].rstrip() for e in kept if e["level"] == "error"]
    warns = [e["text"].rstrip() for e in kept if e["level"] == "warn"]
    lines = [ln.rstrip() for ln in stderr.splitlines()]
    aborts = [ln.strip() for ln in lines if ABORT_LINE.search(ln) and "No such file or directory" not in ln]
    runner = [ln.strip() for ln in lines if ln.startswith("graphgen: error:")]
    tail = []
    if not (errors or warns or aborts or runner):
        # a Python error in the child: its last lines say what
        tail = [ln.strip() for ln in lines if ln.strip()][-3:]
    text = "\n".join([e["text"].rstrip() for e in kept] + aborts + runner + tail)
    first = (errors or aborts or warns or runner or tail or ["no error message"])[0]
    reason = logged_reason(errors)
    if reason and runner and reason in runner[0]:
        # the child's own line already carries llama.cpp's reason, and names the file it refused
        first = runner[0]
    # a message that continues over several lines is one reason: keep all of it
    headline = " ".join(ln.strip() for ln in first.splitlines() if ln.strip())
    # the player names the step first in a refusal: "graphgen: error: step 3 (block): ..."
    step = next((m.group(1) for ln in runner for m in [re.search(r"error: (step \d+ \(\w+\)): ", ln)] if m), None)
    if step is None and last_phase and last_phase.startswith("step "):
        step = last_phase  # the child died in that step, before saying so
    if step and first not in runner:
        headline = f"{step}: {headline}"
    return headline, text


class LineWorker:
    """A long-lived child serving one JSON request a line; restarted after it dies or hangs."""

    def __init__(self, cmd: list[str], err_path: Path, timeout: float | None, env: dict | None = None, cwd=None):
        self.cmd, self.err_path, self.timeout, self.cwd = cmd, Path(err_path), timeout, cwd
        self.env = None if env is None else dict(os.environ, **env)
        self.proc = None
        self.restarts = 0

    def _start(self):
        self.err = open(self.err_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, bufsize=1, cwd=self.cwd, env=self.env)
        # a reader thread: select() on a buffered pipe misses lines already read into the buffer
        self.lines = queue.Queue()
        proc, lines = self.proc, self.lines
        threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout] + [lines.put(None)],
                         daemon=True).start()

    def ask(self, req: dict) -> tuple[dict | None, str]:
        """(the result, "") or (None, "abort (signal N)" / "abort (exit N)" / "hang")."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            try:
                line = self.lines.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                self.restarts += 1
                return None, "hang"
            if line is None:
                rc = self.proc.wait()
                self.proc = None
                self.restarts += 1
                return None, f"abort (signal {-rc})" if rc < 0 else f"abort (exit {rc})"
            if line.startswith("R "):
                return json.loads(line[2:]), ""

    def tail(self, n: int = 2000) -> str:
        try:
            return self.err_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
