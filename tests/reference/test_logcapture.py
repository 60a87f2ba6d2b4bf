"""llama.cpp's log inside a reference process (graphgen/reference/logcapture.py): every line echoed
to stderr, warnings and errors appended to the parent's file tagged with their phase, continuation
lines joined to the line they continue, and the errors since `mark()` explaining a refusal.

The capture is driven here as libllama drives it, through its C callback, with the wheel's own
declarations of llama.h; no libllama is loaded."""

from __future__ import annotations

import json

import pytest

from graphgen.reference.logcapture import ENV_ERROR_LOG, LOG_CONT, LOG_ERROR, LOG_WARN, _LogCapture
from graphgen.reference.protocol import error_text

LOG_INFO = 2


@pytest.fixture
def ffi():
    return pytest.importorskip("llama_cpp_py_sync._cffi_bindings").ffi


class _Lib:
    """libllama as far as the capture uses it: it installs its callback."""

    def __init__(self):
        self.installed = []

    def llama_log_set(self, cb, ud):
        self.installed.append((cb, ud))


@pytest.fixture
def capture(ffi, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_ERROR_LOG, str(tmp_path / "errors.log"))
    monkeypatch.setattr(_LogCapture, "installed", None)
    lib = _Lib()
    cap = _LogCapture(ffi, lib)
    yield cap, lib
    cap.file.close()


def _say(ffi, cap, level, text):
    cap.cb(level, ffi.new("char[]", text.encode()), ffi.NULL)


def _entries(tmp_path):
    return [json.loads(ln) for ln in (tmp_path / "errors.log").read_text().splitlines()]


def test_the_capture_is_what_libllama_calls(ffi, capture):
    cap, lib = capture
    assert lib.installed == [(cap.cb, ffi.NULL)] and _LogCapture.installed is cap


def test_every_line_is_echoed_to_stderr(ffi, capture, capfd):
    cap, _ = capture
    for level, text in ((LOG_INFO, "loading\n"), (LOG_WARN, "a warning\n"), (LOG_ERROR, "an error\n")):
        _say(ffi, cap, level, text)
    assert capfd.readouterr().err == "loading\na warning\nan error\n"


def test_warnings_and_errors_reach_the_file_tagged_with_their_phase(ffi, capture, tmp_path):
    cap, _ = capture
    _say(ffi, cap, LOG_INFO, "info is not kept\n")
    _say(ffi, cap, LOG_WARN, "a load warning\n")
    cap.enter("step 3")
    _say(ffi, cap, LOG_ERROR, "a step error\n")
    assert _entries(tmp_path) == [{"phase": "load", "level": "warn", "text": "a load warning\n"},
                                  {"phase": "step 3", "level": "phase", "text": ""},
                                  {"phase": "step 3", "level": "error", "text": "a step error\n"}]


def test_a_continuation_keeps_the_level_of_the_line_it_continues(ffi, capture, tmp_path):
    cap, _ = capture
    _say(ffi, cap, LOG_ERROR, "llama_model_load: error loading model: key x has")
    _say(ffi, cap, LOG_CONT, " wrong type\n")
    _say(ffi, cap, LOG_INFO, "info")
    _say(ffi, cap, LOG_CONT, " continued\n")          # an info line's continuation: not kept
    assert [e["level"] for e in _entries(tmp_path)] == ["error", "error"]
    assert cap.errors == ["llama_model_load: error loading model: key x has wrong type\n"]
    assert cap.explain("could not load m.gguf") == "could not load m.gguf: key x has wrong type"


def test_a_refusal_is_explained_by_the_errors_since_the_mark(ffi, capture):
    cap, _ = capture
    _say(ffi, cap, LOG_ERROR, "llama_model_load: error loading model: an older failure\n")
    cap.mark()
    assert cap.explain("could not create a context") == "could not create a context"
    _say(ffi, cap, LOG_ERROR, "llama_init_from_model: n_ctx_per_seq (8) > n_ctx_train\n")
    assert cap.explain("could not create a context") == \
        "could not create a context: llama_init_from_model: n_ctx_per_seq (8) > n_ctx_train"


def test_only_the_latest_errors_are_kept(ffi, capture):
    cap, _ = capture
    for i in range(_LogCapture.KEEP + 6):
        _say(ffi, cap, LOG_ERROR, f"error {i}\n")
    assert len(cap.errors) == _LogCapture.KEEP
    assert cap.errors[0] == "error 6\n" and cap.errors[-1] == f"error {_LogCapture.KEEP + 5}\n"


def test_the_parent_reads_the_file_as_the_childs_error(ffi, capture, tmp_path):
    cap, _ = capture
    _say(ffi, cap, LOG_WARN, "a load warning\n")
    cap.enter("step 1")
    _say(ffi, cap, LOG_ERROR, "llama_model_load: error loading model: check_tensor_dims: tensor 'x' not found\n")
    headline, whole = error_text(tmp_path / "errors.log", "")
    assert headline == "step 1: llama_model_load: error loading model: check_tensor_dims: tensor 'x' not found"
    assert "a load warning" not in whole  # a warning of another phase than the one that failed


def test_without_a_parents_file_nothing_is_written(ffi, monkeypatch, capfd):
    monkeypatch.delenv(ENV_ERROR_LOG, raising=False)
    monkeypatch.setattr(_LogCapture, "installed", None)
    cap = _LogCapture(ffi, _Lib())
    assert cap.file is None
    _say(ffi, cap, LOG_ERROR, "llama_model_load: error loading model: bad\n")
    cap.enter("context")
    assert capfd.readouterr().err == "llama_model_load: error loading model: bad\n"
    assert cap.explain("refused") == "refused: bad" and cap.phase == "context"
