"""Long-lived child processes for cases that can end a process: a ggml abort or a segfault in one
case fails that case, and a fresh worker takes the next.

`Worker` speaks one JSON request a line: `S <id>` before a case, `R <json>` after it. Two servers
answer it: b11739's (`python -m graphgen.reference.runner --serve`) and graphgen's (this file,
`--serve`), which calls `module:function` with keyword arguments (tests/ and tests/fuzz are on its
path) and answers with the function's JSON value, or the exception it raised.

`Isolated` is graphgen's server seen from a test: `call("module:function", **kwargs)` returns the
value or raises `Raised` (the function's exception, by type name and text); a worker that dies
raises `ChildDied`, naming the signal and the tail of what it wrote on stderr.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Worker:
    """A long-lived child serving one JSON request a line; restarted after it dies or hangs."""

    def __init__(self, cmd: list[str], err_path: Path, timeout: float, env: dict | None = None):
        self.cmd, self.err_path, self.timeout = cmd, Path(err_path), timeout
        self.env = None if env is None else dict(os.environ, **env)
        self.proc = None
        self.restarts = 0

    def _start(self):
        self.err = open(self.err_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, bufsize=1, cwd=HERE.parent, env=self.env)
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
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
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


class ChildDied(AssertionError):
    """The worker ended (an abort, a segfault) or hung while running a case."""


class Raised(Exception):
    """The called function raised; `kind` is its exception's type name."""

    def __init__(self, kind: str, message: str, tb: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.tb = kind, message, tb


class Isolated:
    """graphgen's server: functions called in a child process that an abort cannot take the
    test run down with."""

    def __init__(self, err_path: Path, timeout: float = 600, env: dict | None = None):
        self.worker = Worker([sys.executable, str(Path(__file__).resolve()), "--serve"], err_path, timeout, env)
        self._n = 0

    def call(self, target: str, **kwargs):
        self._n += 1
        before = self.worker.err_path.stat().st_size if self.worker.err_path.exists() else 0
        res, how = self.worker.ask({"id": self._n, "call": target, "kwargs": kwargs})
        if res is None:
            with open(self.worker.err_path, "rb") as f:
                f.seek(before)
                err = f.read()[-3000:].decode(errors="replace")
            raise ChildDied(f"graphgen's worker died running {target}({_short(kwargs)}): {how}\n{err}")
        if res["error"] is not None:
            raise Raised(res["error"]["type"], res["error"]["message"], res["error"]["traceback"])
        return res["value"]

    def close(self):
        self.worker.close()


def _short(kwargs: dict) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return text if len(text) < 300 else text[:300] + "..."


def serve() -> int:
    sys.path[:0] = [str(HERE), str(HERE / "fuzz")]
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        print(f"S {req['id']}", flush=True)
        try:
            mod, fn = req["call"].split(":")
            value = getattr(importlib.import_module(mod), fn)(**req["kwargs"])
            res = {"id": req["id"], "value": value, "error": None}
        except Exception as e:  # noqa: BLE001 - reported to the caller, who decides
            res = {"id": req["id"], "value": None,
                   "error": {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}}
        print("R " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        sys.exit(serve())
    sys.exit("usage: workers.py --serve")
