"""graphgen/staging.py: outputs that appear only when complete (a file, files that belong together, a
dump folder), what is refused before a run, and the signal bookkeeping that lets a command end
cleanly (the whole commands under real signals: tests/cli/test_interrupts.py)."""

import os
import shutil
import signal
import stat
import types

import pytest

import graphgen.staging as S
from conftest import REF_DIR
from graphgen.dump.format import DumpError

CASE = REF_DIR / "dflash-fa-off"


@pytest.fixture(autouse=True)
def no_pending():
    S.clear_pending()
    yield
    S.clear_pending()


# ---- files ------------------------------------------------------------------------------------

def test_a_staged_file_appears_when_the_block_completes(tmp_path):
    out = tmp_path / "a" / "b" / "f.txt"
    with S.staged_file(out) as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(".f.txt.") and not out.exists()
        tmp.write_text("new")
    assert out.read_text() == "new" and os.listdir(out.parent) == ["f.txt"]
    # the mode a plain open() gives
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~S._umask()


def test_a_failed_block_leaves_the_file_and_folders_as_they_were(tmp_path):
    old = tmp_path / "f.txt"
    old.write_text("mine")
    with pytest.raises(RuntimeError):
        with S.staged_file(old) as tmp:
            tmp.write_text("half")
            raise RuntimeError("stop")
    assert old.read_text() == "mine" and os.listdir(tmp_path) == ["f.txt"]
    with pytest.raises(RuntimeError):
        with S.staged_file(tmp_path / "new" / "deeper" / "g.txt") as tmp:
            raise RuntimeError("stop")
    assert os.listdir(tmp_path) == ["f.txt"]  # the folders it made went with it


def test_a_replaced_file_keeps_its_mode(tmp_path):
    old = tmp_path / "f.txt"
    old.write_text("mine")
    old.chmod(0o600)
    with S.staged_file(old) as tmp:
        tmp.write_text("new")
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and old.read_text() == "new"


def test_a_place_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(S.NotAFolder, match=f"{tmp_path / 'f'} is a file, not a folder"):
        with S.staged_file(tmp_path / "f" / "g" / "h.txt"):
            pass
    assert os.listdir(tmp_path) == ["f"]


def test_files_that_belong_together_appear_together_or_not_at_all(tmp_path):
    a, b = tmp_path / "a.html", tmp_path / "sub" / "b.html"
    with pytest.raises(KeyError):
        with S.staged_files([a, b]) as (ta, tb):
            ta.write_text("A")
            raise KeyError("the second page failed")
    assert os.listdir(tmp_path) == []
    with S.staged_files([a, b]) as (ta, tb):
        ta.write_text("A")
        tb.write_text("B")
    assert (a.read_text(), b.read_text()) == ("A", "B") and sorted(os.listdir(tmp_path)) == ["a.html", "sub"]


def test_a_signal_c_code_swallowed_stops_the_files_before_they_land(tmp_path, monkeypatch):
    out = tmp_path / "f.txt"
    out.write_text("mine")
    monkeypatch.setattr(S, "_pending", S.Terminated())
    with pytest.raises(S.Terminated):
        with S.staged_file(out) as tmp:
            tmp.write_text("new")
    assert out.read_text() == "mine" and os.listdir(tmp_path) == ["f.txt"]


# ---- refused before the run -------------------------------------------------------------------

def test_refuse_to_replace(tmp_path):
    mine = tmp_path / "mine.svg"
    mine.write_text("notes")
    with pytest.raises(ValueError, match="mine.svg: exists and is not an SVG file; pass --force to replace it"):
        S.refuse_to_replace(mine, S.is_svg, "an SVG file")
    S.refuse_to_replace(mine, S.is_svg, "an SVG file", force=True)
    S.refuse_to_replace(tmp_path / "new.svg", S.is_svg, "an SVG file")
    mine.write_text("<svg/>")
    S.refuse_to_replace(mine, S.is_svg, "an SVG file")
    with pytest.raises(ValueError, match="is a folder; give a file name"):
        S.refuse_to_replace(tmp_path, S.is_svg, "an SVG file", force=True)


@pytest.mark.parametrize("text, svg", [("<svg xmlns='x'/>", True), ('\n  <?xml version="1.0"?><svg/>', True),
                                       ("<html></html>", False), ("", False), ("\xff\xfe<svg", False)])
def test_is_svg(tmp_path, text, svg):
    f = tmp_path / "f"
    f.write_text(text, encoding="latin-1")
    assert S.is_svg(f) is svg


def test_is_svg_of_nothing(tmp_path):
    assert S.is_svg(tmp_path / "none") is False and S.is_svg(tmp_path) is False


def test_check_output(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=f"--svg {tmp_path}: is a folder; give a file name"):
        S.check_output("--svg", tmp_path)
    with pytest.raises(ValueError, match=f"--svg {tmp_path}/notes.txt/a/p.svg: {tmp_path}/notes.txt is a file, "
                                         "not a folder"):
        S.check_output("--svg", tmp_path / "notes.txt" / "a" / "p.svg")
    S.check_output("--svg", tmp_path / "new" / "p.svg")  # staging makes the folder
    with pytest.raises(ValueError, match=f"--markdown {tmp_path}/new/b.md: no such folder {tmp_path}/new"):
        S.check_output("--markdown", tmp_path / "new" / "b.md", new_folder=False)
    S.check_output("--markdown", tmp_path / "b.md", new_folder=False)
    with pytest.raises(ValueError, match="notes.txt: exists and is not an SVG file"):
        S.check_output("--svg", tmp_path / "notes.txt", S.is_svg, "an SVG file")
    S.check_output("--svg", tmp_path / "notes.txt", S.is_svg, "an SVG file", force=True)
    S.check_output("--markdown", tmp_path / "notes.txt")  # appended to: no `ours`
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing made by a check


# ---- dump folders -----------------------------------------------------------------------------

def _graphs(folder, names=("00-inject", "01-block")):
    for n in names:
        shutil.copy(CASE / f"{n}.json", folder / f"{n}.json")


def test_a_dump_folder_replaces_earlier_dumps_and_keeps_other_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _graphs(out, ("00-inject", "01-block"))
    shutil.copy(CASE / "01-block.npz", out / "01-block.npz")
    with S.staged_dump_dir(out) as tmp:
        assert tmp.parent == tmp_path and tmp != out
        _graphs(tmp, ("00-inject",))
        assert sorted(os.listdir(out)) == ["00-inject.json", "01-block.json", "01-block.npz", "notes.txt"]
    assert sorted(os.listdir(out)) == ["00-inject.json", "notes.txt"]  # the stale block went with its values
    assert os.listdir(tmp_path) == ["out"]


def test_a_dump_folder_that_holds_what_is_no_dump_is_refused_before_the_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "03-results.json").write_text('{"accuracy": 0.9}')
    with pytest.raises(DumpError, match="03-results.json is not a graphgen dump"):
        with S.staged_dump_dir(out):
            pytest.fail("ran")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DumpError, match="file: exists and is not a folder"):
        with S.staged_dump_dir(tmp_path / "file"):
            pytest.fail("ran")
    assert sorted(os.listdir(tmp_path)) == ["file", "out"]


def test_a_failure_before_the_first_graph_leaves_nothing(tmp_path):
    out = tmp_path / "a" / "out"
    with pytest.raises(ValueError, match="^bad step$"):
        with S.staged_dump_dir(out):
            raise ValueError("bad step")
    assert os.listdir(tmp_path) == []


def test_a_run_refused_part_way_keeps_its_graphs_apart(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _graphs(out)
    before = {p: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError) as e:
        with S.staged_dump_dir(out) as tmp:
            _graphs(tmp, ("00-inject",))
            raise ValueError("step 1 (block): too long\nmore detail")
    inc = tmp_path / "out.incomplete"
    assert e.value.args[0] == (f"step 1 (block): too long; the 1 graph(s) before it are in {inc}/ (marked "
                               "INCOMPLETE)\nmore detail")
    assert {p: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(os.listdir(inc)) == ["00-inject.json", "INCOMPLETE"]
    assert (inc / "INCOMPLETE").read_text().startswith("This run did not complete: step 1 (block): too long\n")
    # the next such run replaces its own earlier folder, never a folder of that name it did not make
    with pytest.raises(ValueError):
        with S.staged_dump_dir(out) as tmp:
            _graphs(tmp)
            raise ValueError("again")
    assert sorted(os.listdir(inc)) == ["00-inject.json", "01-block.json", "INCOMPLETE"]
    (inc / "INCOMPLETE").unlink()
    with pytest.raises(ValueError, match="^third$"):
        with S.staged_dump_dir(out) as tmp:
            _graphs(tmp)
            raise ValueError("third")
    assert sorted(os.listdir(inc)) == ["00-inject.json", "01-block.json"]
    assert sorted(os.listdir(tmp_path)) == ["out", "out.incomplete"]


def test_an_interrupt_keeps_no_graphs(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with S.staged_dump_dir(out) as tmp:
            _graphs(tmp, ("00-inject",))
            raise KeyboardInterrupt
    with pytest.raises(RuntimeError):  # an error raised while an interrupt unwound
        with S.staged_dump_dir(out) as tmp:
            _graphs(tmp, ("00-inject",))
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise RuntimeError("the zip could not close")
    assert os.listdir(tmp_path) == []


def test_an_abandoned_run_leaves_the_folder_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _graphs(out, ("00-inject",))
    with S.staged_dump_dir(out) as tmp:
        _graphs(tmp, ("00-inject", "01-block"))
        S.abandon(tmp)
    assert os.listdir(out) == ["00-inject.json"] and os.listdir(tmp_path) == ["out"]


# ---- signals ----------------------------------------------------------------------------------

def test_a_signal_raises_at_once_outside_ggml(monkeypatch):
    with pytest.raises(KeyboardInterrupt) as e:
        S._on_signal(signal.SIGINT, None)
    assert type(e.value) is KeyboardInterrupt and S.pending_signal() is e.value
    S.clear_pending()
    with pytest.raises(S.Terminated):
        S._on_signal(signal.SIGTERM, None)


def test_inside_ggml_a_signal_is_noted_and_raised_once_it_returns():
    with S.deferred():
        with S.deferred():  # nested computes
            S._on_signal(signal.SIGTERM, None)
        assert S.pending()
        S._stop_if_interrupted()  # still inside: nothing raised
    assert isinstance(S.pending_signal(), S.Terminated)
    with pytest.raises(S.Terminated):
        S.raise_pending()
    assert not S.pending() and S.pending_signal() is None
    S.raise_pending()  # nothing pending: nothing raised


def test_callbacks_whose_exceptions_python_drops_are_recognised():
    frame = lambda f, n: types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename=f, co_name=n))  # noqa: E731
    assert S._in_callback(frame("<frozen importlib._bootstrap>", "cb"))
    assert not S._in_callback(frame("<frozen importlib._bootstrap>", "_find_and_load"))
    assert not S._in_callback(frame("/x/weakref.py", "cb"))
    assert not S._in_callback(None)


def test_signals_are_held_while_renames_finish():
    def blocked():
        return signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.SIGINT not in blocked()
    with S.signals_deferred():
        assert {signal.SIGINT, signal.SIGTERM} <= blocked()
    assert signal.SIGINT not in blocked() and signal.SIGTERM not in blocked()
