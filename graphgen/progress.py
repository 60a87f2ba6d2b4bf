"""Progress of slow work (writing a big draft, loading it, the reference's run), on stderr only.

One mode for the whole process, set once by the command line:

- `auto` (the default): a task that is still running after `DELAY` seconds shows one line on
  stderr, redrawn in place with what it is doing and the time so far, and only when stderr is a
  terminal; quick work and redirected stderr see nothing.
- `always` (`--progress`): every stage (loading, computing, writing) is printed at once as its
  own line, terminal or not, then at most one line a second while it goes on, and a last line
  with the time it took; so a log or a test sees it.
- `never` (`--quiet`): nothing.

stdout is never written: it carries the commands' results.
"""

from __future__ import annotations

import sys
import threading
import time

MODES = ("auto", "always", "never")
DELAY = 2.0       # seconds before `auto` shows a task at all
REDRAW = 0.25     # seconds between redraws of the terminal line
LINE_GAP = 1.0    # seconds between lines of `always` while the message keeps changing

_mode = "auto"


def set_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {mode!r}")
    global _mode
    _mode = mode


def mode_from_flags(quiet: bool = False, force: bool = False) -> str:
    """--quiet wins over --progress: asking for silence is the stronger wish."""
    return "never" if quiet else "always" if force else "auto"


def lines_wanted(stream=None) -> bool:
    """Whether per-step lines (a drafting round each) should print: with --progress, or on a
    terminal unless --quiet."""
    stream = stream if stream is not None else sys.stderr
    return _mode == "always" or (_mode == "auto" and _is_terminal(stream))


def note(message: str) -> None:
    """A one-line remark about the work (where a log went), shown unless the mode is `never`."""
    if _mode != "never":
        print(f"graphgen: {message}", file=sys.stderr, flush=True)


class Task:
    """One piece of slow work: `update()` says what it is doing now, `close()` (or leaving the
    `with` block) ends it. Cheap to update often: printing is throttled here."""

    def __init__(self, what: str, stream=None, mode: str | None = None, every_step: bool = False):
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.mode = mode or _mode
        # work of few, long steps (check-batch's cases): each is a line, terminal or not
        self.every_step = every_step
        if every_step and self.mode == "auto":
            self.mode = "always"
        self.t0 = time.monotonic()
        self.message = ""
        self._printed = ""          # the last message printed as a line (`always`)
        self._t_line = -LINE_GAP
        self._shown = False         # anything written at all
        self._closed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if self.mode == "auto" and _is_terminal(self.stream):
            self._thread = threading.Thread(target=self._redraw_loop, name="graphgen-progress", daemon=True)
            self._thread.start()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(ok=exc_type is None)

    def update(self, message: str) -> None:
        with self._lock:
            self.message = message
            if self.mode != "always":
                return
            now = time.monotonic() - self.t0
            # a new stage (its first word: loading, computing, writing) always prints; the same
            # stage with new numbers at most once a LINE_GAP
            if message == self._printed or not self.every_step and _stage(message) == _stage(self._printed) \
                    and now - self._t_line < LINE_GAP:
                return
            self._write_line(f"graphgen: {self.what}: {message}")
            self._printed, self._t_line = message, now

    def close(self, ok: bool = True, final: str | None = None) -> None:
        """End the task (again: nothing)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            elapsed = time.monotonic() - self.t0
            if self.mode == "auto" and self._shown:
                # leave the terminal line as a record of what took the time
                end = final or ("done" if ok else "stopped")
                self._write(f"\r\x1b[Kgraphgen: {self.what}: {end} in {elapsed:.1f} s\n")
            elif self.mode == "always" and ok:
                if self.message and self.message != self._printed:
                    self._write_line(f"graphgen: {self.what}: {self.message}")
                self._write_line(f"graphgen: {self.what}: {final or 'done'} in {elapsed:.1f} s")
            self._shown = False

    # -- output -----------------------------------------------------------------------------
    def _redraw_loop(self) -> None:
        if self._stop.wait(DELAY):
            return
        while True:
            with self._lock:
                elapsed = time.monotonic() - self.t0
                text = f"graphgen: {self.what}: {self.message}" if self.message else f"graphgen: {self.what}"
                self._write(f"\r\x1b[K{text} ({elapsed:.0f} s)")
                self._shown = True
            if self._stop.wait(REDRAW):
                return

    def _write_line(self, text: str) -> None:
        self._write(text + "\n")
        self._shown = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not stop the work
            pass


def _stage(message: str) -> str:
    return message.split(" ", 1)[0]


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def task(what: str, stream=None, every_step: bool = False) -> Task:
    """A Task in the process's mode: `with progress.task("make-model") as p: p.update("...")`.
    every_step: each update is a line on stderr, terminal or not, unless --quiet."""
    return Task(what, stream, every_step=every_step)
