"""Long-lived child processes for cases that can end a process: a ggml abort or a segfault in one
case fails that case, and a fresh worker takes the next.

`Worker` (graphgen/reference/protocol.py's client) speaks one JSON request a line: `S <id>` before a case, `R <json>` after it. Two servers
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
import sys
import traceback
from pathlib import Path

from graphgen.reference.protocol import LineWorker, write_reply, write_start

HERE = Path(__file__).resolve().parent
# seconds a case may take before its worker counts as hung: the worker waits on a pipe that a
# deadlocked child never writes; generous, so that a loaded machine's slowness is never a hang
HANG = 3600


def Worker(cmd: list[str], err_path: Path, timeout: float, env: dict | None = None) -> LineWorker:
    """The protocol's client (graphgen/reference/protocol.py), run from the project's root."""
    return LineWorker(cmd, err_path, timeout, env, cwd=HERE.parents[1])


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

    def __init__(self, err_path: Path, timeout: float = HANG, env: dict | None = None):
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
    sys.path[:0] = [str(HERE), str(HERE.parent / "fuzz"), str(HERE.parent / "reference")]
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        write_start(sys.stdout, req["id"])
        try:
            mod, fn = req["call"].split(":")
            value = getattr(importlib.import_module(mod), fn)(**req["kwargs"])
            res = {"id": req["id"], "value": value, "error": None}
        except Exception as e:  # noqa: BLE001 - reported to the caller, who decides
            res = {"id": req["id"], "value": None,
                   "error": {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}}
        write_reply(sys.stdout, res)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        sys.exit(serve())
    sys.exit("usage: workers.py --serve")
