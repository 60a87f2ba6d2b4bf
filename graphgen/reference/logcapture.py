"""llama.cpp's log inside a reference process: echoed to stderr, its warnings and errors kept for
the parent (a file) and for this process's own refusals (`explain`)."""

from __future__ import annotations

import json
import os

from .protocol import logged_reason

ENV_ERROR_LOG = "GRAPHGEN_REFERENCE_ERROR_LOG"
LOG_WARN, LOG_ERROR, LOG_CONT = 3, 4, 5


class _LogCapture:
    """llama.cpp's log, written to stderr as its default logger does, with the warnings and
    errors also appended to the file named by $GRAPHGEN_REFERENCE_ERROR_LOG, tagged with the
    phase (load, context, step N) they were logged in. The error lines since `mark()` are kept
    here too, so that a refusal raised in this process can say llama.cpp's reason (`explain`)."""

    # the capture libllama calls now, kept alive while it may still call it
    installed = None
    KEEP = 64  # error lines kept between marks

    def __init__(self, ffi, lib):
        self.phase = "load"
        self.level = None
        self.errors: list[str] = []
        path = os.environ.get(ENV_ERROR_LOG)
        self.file = open(path, "a", encoding="utf-8") if path else None

        @ffi.callback("void(enum ggml_log_level, const char *, void *)")
        def cb(level, text, _ud):
            try:
                raw = ffi.string(text)
                os.write(2, raw)
                level = int(level)
                cont = level == LOG_CONT
                if cont:
                    level = self.level
                else:
                    self.level = level
                if level == LOG_ERROR:
                    line = raw.decode(errors="replace")
                    if cont and self.errors:
                        self.errors[-1] += line
                    else:
                        self.errors.append(line)
                        del self.errors[:-self.KEEP]
                if self.file is not None and level in (LOG_WARN, LOG_ERROR):
                    self.file.write(json.dumps({"phase": self.phase, "level": "error" if level == LOG_ERROR else "warn",
                                                "text": raw.decode(errors="replace")}) + "\n")
                    self.file.flush()
            except Exception:  # noqa: BLE001 - a logging failure must not unwind into C
                pass

        self.cb = cb
        lib.llama_log_set(cb, ffi.NULL)
        _LogCapture.installed = self

    def mark(self) -> None:
        """Forget the error lines so far: what is logged next explains the next call."""
        self.errors = []

    def explain(self, message: str) -> str:
        """`message`, then llama.cpp's own reason for the failure logged since `mark()`, if it gave one."""
        reason = logged_reason(self.errors)
        return f"{message}: {reason}" if reason else message

    def enter(self, phase: str) -> None:
        """A new phase: the parent keeps only the warnings of the phase that failed."""
        self.phase = phase
        if self.file is not None:
            self.file.write(json.dumps({"phase": phase, "level": "phase", "text": ""}) + "\n")
            self.file.flush()
