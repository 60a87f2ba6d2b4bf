"""Outputs that appear only when complete, and interrupts that end a command cleanly.

A run that is interrupted or fails leaves nothing that looks complete and never touches what
the user had: files are written under a temporary name beside their target and renamed at the
end (`staged_file`); a dump folder's files are written into a temporary folder beside it and
moved in, replacing earlier graphgen dumps, only when the run completes (`staged_dump_dir`); a
run refused part way keeps the graphs written before it apart, in OUT.incomplete/ marked
INCOMPLETE; files that belong together are renamed together (`staged_files`).

SIGINT and SIGTERM raise `KeyboardInterrupt` / `Terminated` wherever Python runs next, except while
ggml computes: ggml calls Python back (the eval callback) and ctypes prints and drops an exception
raised there, so around a compute (`deferred()`) a signal is only noted, the callback stops the
compute when it sees one, and `raise_pending()` raises it once ggml returns: the command ends with
exit 130 (143) all the same.

The command's entry point imports this module first thing, so it imports only what the handlers
need; the rest is imported where it is used.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


class NotAFolder(ValueError):
    """An output path whose parent is a file."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, ended like Ctrl-C but with exit 143."""


_pending: BaseException | None = None
_deferred = 0


def _in_callback(frame) -> bool:
    """Whether the signal landed in a callback whose exceptions Python prints and drops (the
    import system's weakref callbacks): raised there, it would be lost."""
    code = frame.f_code if frame is not None else None
    return code is not None and code.co_filename.startswith("<frozen importlib") and code.co_name == "cb"


def _on_signal(signum, frame):
    global _pending
    exc = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    _pending = exc
    if _deferred:
        return  # inside ggml: raised by raise_pending() once it returns
    if _in_callback(frame):
        # raised a moment later instead, once the callback (a few instructions) has returned,
        # where the exception unwinds the command as it should
        _raise_soon()
        return
    raise exc


def _raise_soon() -> None:
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.005)


def _on_alarm(signum, frame):
    """A signal that landed in a callback (see _on_signal), raised now."""
    if _pending is None or _deferred:
        return  # raised already, or raise_pending() will once ggml returns
    if _in_callback(frame):
        _raise_soon()
        return
    # left pending until the command ends: should this land in a callback too, the unraisable
    # hook knows it for the signal's and tries again
    raise _pending


_unraisable_before = None


def _on_unraisable(u) -> None:
    """The signal's exception raised in code whose exceptions Python prints and drops (a weakref
    callback such as WeakKeyDictionary's, a __del__): not lost, raised again a moment later."""
    if _pending is not None and u.exc_value is _pending:
        _raise_soon()
        return
    (_unraisable_before or sys.__unraisablehook__)(u)


def pending_signal() -> KeyboardInterrupt | None:
    """The interrupt of a signal that arrived and has not ended the command yet (C code may have
    turned the exception raised for it into another error, or dropped it)."""
    return _pending


def pending() -> bool:
    """Whether a signal waits to be raised (an eval callback then stops the compute)."""
    return _pending is not None


@contextlib.contextmanager
def deferred():
    """While ggml computes (and calls Python back), a signal is only noted: an exception raised in
    a C callback would be printed and dropped by ctypes. The caller raises it with raise_pending()."""
    global _deferred
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1


def install_handlers() -> None:
    """SIGINT and SIGTERM raise (the command-line entry point installs them)."""
    global _unraisable_before
    try:
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGTERM, _on_signal)
    except ValueError:  # not the main thread: signals stay as they are
        return
    if sys.unraisablehook is not _on_unraisable:
        _unraisable_before, sys.unraisablehook = sys.unraisablehook, _on_unraisable


def raise_pending() -> None:
    """Raise a signal that arrived while Python could not (inside a C callback)."""
    global _pending
    exc, _pending = _pending, None
    if exc is not None:
        raise exc


def _stop_if_interrupted() -> None:
    """Before outputs are moved into place: a signal whose exception C code swallowed (an
    optional import that failed with it, caught as an ImportError) still stops the run here."""
    if _pending is not None and not _deferred:
        raise _pending


def clear_pending() -> None:
    global _pending
    _pending = None


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT and SIGTERM while a few renames finish, so that they all land or none."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    except (AttributeError, ValueError, OSError):  # not the main thread, or no such call
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _made_parents(path) -> list:
    """Create path's missing parent folders; the ones made, innermost first (to undo)."""
    missing = []
    p = path.parent
    while not p.exists():
        missing.append(p)
        p = p.parent
    if not p.is_dir():
        raise NotAFolder(f"{path}: {p} is a file, not a folder")
    for d in reversed(missing):
        d.mkdir()
    return missing


def _undo_parents(made: list) -> None:
    for d in made:
        try:
            d.rmdir()
        except OSError:
            break


@contextlib.contextmanager
def staged_file(path: str | os.PathLike):
    """Yield a temporary path beside `path`; when the block completes, rename it onto `path`.
    On failure or interrupt the temporary file goes and `path` is as it was."""
    with staged_files([path]) as tmps:
        yield tmps[0]


@contextlib.contextmanager
def staged_files(paths):
    """staged_file for outputs that belong together (pages and the index linking them): a
    temporary path beside each, all renamed at the end under one signals_deferred, or none."""
    import tempfile
    from pathlib import Path
    paths = [Path(p) for p in paths]
    made: list = []
    tmps: list = []
    ok = False
    try:
        for path in paths:
            made = _made_parents(path) + made  # innermost first, as _undo_parents takes them
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
            os.close(fd)
            tmp = Path(name)
            tmps.append(tmp)
            # the mode a plain open() would give (mkstemp's is private), or the replaced file's
            tmp.chmod(path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        yield tmps
        _stop_if_interrupted()
        with signals_deferred():
            for tmp, path in zip(tmps, paths):
                os.replace(tmp, path)
        ok = True
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        if not ok:
            _undo_parents(made)


def refuse_to_replace(path, ours, what: str, force: bool = False) -> None:
    """An output path that holds a file the command did not write (`ours(path)` says whether it
    did) is refused unless --force: what the user had is never replaced unasked."""
    from pathlib import Path
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a folder; give a file name")
    if path.exists() and not force and not ours(path):
        raise ValueError(f"{path}: exists and is not {what}; pass --force to replace it")


def is_svg(path) -> bool:
    """Whether a file starts as an SVG does (what graphgen's --svg outputs write)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(256).lstrip().startswith(("<svg", "<?xml"))
    except OSError:
        return False


def check_output(flag: str, path, ours=None, what: str = "", force: bool = False, new_folder: bool = True) -> None:
    """An output file refused before the run (minutes), not after it: a folder, a place under a
    file, a missing folder (unless `new_folder`: staging makes it), and, with `ours`, a file the
    command would replace that it did not write (unless --force)."""
    from pathlib import Path
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a folder; give a file name")
    up = path.parent
    while not up.exists():
        up = up.parent
    if not up.is_dir():
        raise ValueError(f"{flag} {path}: {up} is a file, not a folder")
    if not new_folder and up != path.parent:
        raise ValueError(f"{flag} {path}: no such folder {path.parent}")
    if ours is not None:
        refuse_to_replace(path, ours, what, force)


_ABANDON = ".abandon"
INCOMPLETE = "INCOMPLETE"


def _keep_incomplete(tmp, out, e: Exception) -> None:
    """A run refused part way (a scenario's step the session would not run): the graphs written
    before it go to OUT.incomplete/, with a file INCOMPLETE saying why, never into OUT as if the
    run were whole; the error then says where they are. An earlier OUT.incomplete/ of graphgen's
    is replaced; anything else of that name is left alone (and the graphs go)."""
    import shutil

    from .dump.format import DumpError, dump_files
    ctx = e
    while ctx is not None:
        if isinstance(ctx, KeyboardInterrupt) or _pending is not None:
            return  # the consequence of an interrupt: the run ends as interrupted, leaving nothing
        ctx = ctx.__context__
    try:
        graphs = dump_files(tmp)
    except DumpError:
        return  # refused before its first graph: nothing to keep, and the refusal is the error
    dest = out.with_name(out.name + ".incomplete")
    if dest.exists() or dest.is_symlink():
        if not (dest.is_dir() and not dest.is_symlink() and (dest / INCOMPLETE).is_file()):
            return
        shutil.rmtree(dest)
    why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    (tmp / INCOMPLETE).write_text(
        f"This run did not complete: {why}\n"
        f"The {len(graphs)} graph(s) here are those written before it stopped; {out} was left as it was.\n")
    with signals_deferred():
        os.replace(tmp, dest)
    if e.args and isinstance(e.args[0], str):
        # on the first line, which is what the command prints
        first, nl, rest = e.args[0].partition("\n")
        e.args = (f"{first}; the {len(graphs)} graph(s) before it are in {dest}/ (marked {INCOMPLETE}){nl}{rest}",) \
            + e.args[1:]


def abandon(staged) -> None:
    """Leave the dump folder as it was although the block ends normally (a run that stopped
    short on purpose, as trace --abort-on-nan does)."""
    from pathlib import Path
    (Path(staged) / _ABANDON).touch()


@contextlib.contextmanager
def staged_dump_dir(out: str | os.PathLike):
    """Yield a temporary folder beside `out` to write dumps into; when the block completes, the
    earlier graphgen dumps in `out` are removed and the new files moved in (other files stay).
    A folder that holds an `NN-*.json` that is no graphgen dump is refused before anything runs."""
    import shutil
    import tempfile
    from pathlib import Path

    from .dump.format import DumpError, check_dump_dir, prepare_dump_dir
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DumpError(f"{out}: exists and is not a folder")
    if out.is_dir():
        check_dump_dir(out)
    made = _made_parents(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    tmp.chmod(0o777 & ~_umask())
    ok = False
    try:
        try:
            yield tmp
        except Exception as e:
            _keep_incomplete(tmp, out, e)
            raise
        if (tmp / _ABANDON).exists():
            return
        _stop_if_interrupted()
        with signals_deferred():
            created = not out.exists()
            prepare_dump_dir(out)
            try:
                for f in sorted(tmp.iterdir()):
                    os.replace(f, out / f.name)
            except OSError:
                if created:
                    shutil.rmtree(out, ignore_errors=True)
                raise
        ok = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not ok:
            _undo_parents(made)


@contextlib.contextmanager
def staged_new_folder(out: str | os.PathLike):
    """Yield a temporary folder beside `out`, a folder that must not exist yet (or be empty); when
    the block completes it becomes `out` in one rename. On failure or interrupt it goes, and `out`
    is as it was: a folder appears whole or not at all."""
    import shutil
    import tempfile
    from pathlib import Path
    out = Path(out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise NotAFolder(f"{out}: exists and is not an empty folder; give a new folder")
    made = _made_parents(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    tmp.chmod(0o777 & ~_umask())
    ok = False
    try:
        yield tmp
        _stop_if_interrupted()
        with signals_deferred():
            if out.is_dir():
                out.rmdir()
            os.replace(tmp, out)
        ok = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not ok:
            _undo_parents(made)
