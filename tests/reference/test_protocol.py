"""The reference runner's wire protocol (graphgen/reference/protocol.py): the start and reply lines,
arrays as base64 float32 rows, llama.cpp's reason among the lines it logged, a failed child's
headline and whole error from its phase-tagged log and its standard error, and `LineWorker`, the
one client of a long-lived child, restarted after it dies or hangs."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from graphgen.reference.protocol import (LineWorker, decode_rows, encode_rows, error_text, logged_reason,
                                         write_reply, write_start)


# -- the lines and the rows -------------------------------------------------------------------------

def test_a_case_is_framed_by_its_start_and_reply_lines():
    out = io.StringIO()
    write_start(out, "case-7")
    write_reply(out, {"id": "case-7", "ok": False, "error": "a\nb"})
    lines = out.getvalue().splitlines()
    assert lines[0] == "S case-7"
    # the reply is one line however its text breaks
    assert len(lines) == 2 and lines[1].startswith("R ")
    assert json.loads(lines[1][2:]) == {"id": "case-7", "ok": False, "error": "a\nb"}


def test_rows_travel_as_base64_float32_bit_for_bit():
    a = np.random.default_rng(0).standard_normal((3, 5))  # float64 in, float32 out
    a[1, 2] = np.float32(-0.0)
    a[2, 4] = np.nan
    back = decode_rows(encode_rows(a), 5)
    assert back.dtype == np.float32 and back.shape == (3, 5)
    assert back.tobytes() == a.astype(np.float32).tobytes()
    # a column count reshapes the same bytes
    assert decode_rows(encode_rows(a), 15).shape == (1, 15)
    # a Fortran-ordered array goes row by row all the same
    f = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert decode_rows(encode_rows(f), 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert encode_rows(None) is None and decode_rows(None, 5) is None


# -- the reason, from the lines llama.cpp logged -----------------------------------------------------

def test_the_reason_is_what_follows_error_loading_model():
    lines = ["llama_model_load: error loading model: check_tensor_dims: tensor 'blk.0.attn_norm.weight' not found\n",
             "llama_model_load_from_file_impl: failed to load model\n"]
    assert logged_reason(lines) == "check_tensor_dims: tensor 'blk.0.attn_norm.weight' not found"


def test_without_a_load_line_the_first_error_is_the_reason():
    assert logged_reason(["", "llama_init_from_model: n_ctx_per_seq (8) > n_ctx_train\n", "second\n"]) == \
        "llama_init_from_model: n_ctx_per_seq (8) > n_ctx_train"
    assert logged_reason([]) == ""


def test_a_line_continued_over_two_log_calls_is_one_reason():
    # b11739 logs some messages in pieces; the capture joins a continuation to its line
    assert logged_reason(["llama_model_load: error loading model: key x has\n  wrong type"]) == "key x has wrong type"


def _log(tmp_path, entries) -> Path:
    p = tmp_path / "errors.log"
    p.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return p


LOAD_ERRORS = [{"phase": "load", "level": "error",
                "text": "llama_model_load: error loading model: check_tensor_dims: tensor 'output.weight' not found\n"},
               {"phase": "load", "level": "error", "text": "llama_model_load_from_file_impl: failed to load model\n"}]


def test_the_childs_line_is_the_headline_when_it_carries_the_reason(tmp_path):
    line = ("graphgen: error: llama.cpp b11739 could not load the target /x/t.gguf: check_tensor_dims: tensor "
            "'output.weight' not found")
    headline, whole = error_text(_log(tmp_path, LOAD_ERRORS), f"some log\n{line}\n")
    assert headline == line and "failed to load model" in whole


def test_llamas_first_error_is_the_headline_when_the_childs_line_lacks_it(tmp_path):
    stderr = "graphgen: error: step 1 (block): llama_process returned -1\n"
    headline, _ = error_text(_log(tmp_path, LOAD_ERRORS), stderr)
    # the step the child says it failed in comes first, then llama.cpp's own line
    assert headline == ("step 1 (block): llama_model_load: error loading model: check_tensor_dims: tensor "
                        "'output.weight' not found")


def test_warnings_count_only_from_the_phase_that_failed(tmp_path):
    log = _log(tmp_path, [{"phase": "load", "level": "warn", "text": "an early warning\n"},
                          {"phase": "step 2", "level": "phase", "text": ""},
                          {"phase": "step 2", "level": "warn", "text": "the failing step's warning\n"}])
    headline, whole = error_text(log, "")
    # no error logged: the failing phase's warning is the headline, said with the step
    assert headline == "step 2: the failing step's warning"
    assert "an early warning" not in whole and "the failing step's warning" in whole


def test_an_assertion_in_ggml_is_the_headline(tmp_path):
    stderr = ("some output\n/src/ggml.c:1234: GGML_ASSERT(ne0 % 32 == 0) failed\n"
              "ls: cannot access x: No such file or directory\n")
    headline, whole = error_text(_log(tmp_path, []), stderr)
    assert headline == "/src/ggml.c:1234: GGML_ASSERT(ne0 % 32 == 0) failed"
    assert "No such file" not in whole and "some output" not in whole


def test_a_child_that_died_in_a_step_names_the_step(tmp_path):
    log = _log(tmp_path, [{"phase": "step 4", "level": "phase", "text": ""}])
    headline, _ = error_text(log, "terminate called after throwing an instance of 'std::bad_alloc'\n")
    assert headline == "step 4: terminate called after throwing an instance of 'std::bad_alloc'"


def test_a_python_error_in_the_child_is_its_last_lines(tmp_path):
    stderr = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n    boom()\n"
              "NameError: name 'boom' is not defined\n")
    headline, whole = error_text(tmp_path / "no-such.log", stderr)
    assert headline == 'File "x.py", line 1'
    assert whole.splitlines() == ['File "x.py", line 1', "boom()", "NameError: name 'boom' is not defined"]
    assert error_text(tmp_path / "no-such.log", "") == ("no error message", "")


def test_a_log_line_that_is_no_json_is_skipped(tmp_path):
    p = tmp_path / "errors.log"
    p.write_text('not json\n{"phase": "load", "level": "error", "text": "llama_model_load: error loading model: bad\\n"}\n')
    assert error_text(p, "")[0] == "llama_model_load: error loading model: bad"


# -- LineWorker: the long-lived child ------------------------------------------------------------------

CHILD = r"""
import json, os, sys, time
for line in sys.stdin:
    req = json.loads(line)
    if req.get("say"):
        print(req["say"], file=sys.stderr, flush=True)
    if req.get("exit"):
        os._exit(req["exit"])
    if req.get("signal"):
        os.kill(os.getpid(), req["signal"])
    if req.get("hang"):
        time.sleep(60)
    print("S " + str(req.get("x")))    # anything but a reply line is read past
    print("R " + json.dumps({"x": req.get("x"), "pid": os.getpid()}), flush=True)
"""


@pytest.fixture
def worker(tmp_path):
    w = LineWorker([sys.executable, "-c", CHILD], tmp_path / "child.err", timeout=5.0)
    yield w
    w.close()


def test_a_worker_answers_each_request_from_one_process(worker):
    a, err = worker.ask({"x": 1})
    b, _ = worker.ask({"x": 2})
    assert err == "" and (a["x"], b["x"]) == (1, 2) and a["pid"] == b["pid"] and worker.restarts == 0


def test_a_worker_that_dies_is_said_and_restarted(worker):
    first, _ = worker.ask({"x": 1})
    assert worker.ask({"exit": 7}) == (None, "abort (exit 7)")
    assert worker.ask({"signal": 9}) == (None, "abort (signal 9)")
    assert worker.restarts == 2
    again, err = worker.ask({"x": 3})
    assert err == "" and again["x"] == 3 and again["pid"] != first["pid"]


def test_a_worker_that_hangs_is_killed_after_its_timeout(tmp_path):
    w = LineWorker([sys.executable, "-c", CHILD], tmp_path / "child.err", timeout=1.0)
    try:
        w.ask({"x": 0})
        proc = w.proc
        assert w.ask({"hang": True}) == (None, "hang")
        assert proc.poll() is not None and w.restarts == 1
        assert w.ask({"x": 1})[0]["x"] == 1
    finally:
        w.close()


def test_a_workers_standard_error_is_kept_across_restarts(worker):
    worker.ask({"say": "first life"})
    worker.ask({"say": "dying now", "exit": 3})
    worker.ask({"say": "second life"})
    tail = worker.tail()
    assert tail.index("first life") < tail.index("dying now") < tail.index("second life")
    assert worker.tail(6) == " life\n"


def test_closing_a_worker_ends_its_child(worker):
    worker.ask({"x": 1})
    proc = worker.proc
    worker.close()
    assert proc.poll() == 0 and worker.proc is None
    worker.close()  # twice is nothing
