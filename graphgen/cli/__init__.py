"""The `graphgen` command line.

Each module here adds one group of verbs with register(subparsers); the library modules know
nothing of argparse, so they stay usable from Python without dragging the parser along. This
module imports nothing heavy itself: the entry point has the signal handlers in place before the
parser (graphgen.cli.parser) and the command modules are imported.
"""

from __future__ import annotations

import sys


def build_parser():
    from .parser import build_parser
    return build_parser()


def apply_library_options(args) -> None:
    """--ggml / --llama: chosen before anything loads ggml, and passed on to child processes."""
    import os
    from pathlib import Path

    from ..ops.runtime import ENV_GGML_DIR, choose
    from ..libload import ENV_LLAMA_DIR
    if args.llama:
        os.environ[ENV_LLAMA_DIR] = str(Path(args.llama).expanduser().resolve())
    if args.ggml:
        choose(args.ggml)
        os.environ[ENV_GGML_DIR] = str(Path(args.ggml).expanduser().resolve())


def _closed_pipe() -> int:
    """The reader went away (`graphgen info X | head`): end quietly, as a SIGPIPE'd tool does.
    stdout goes to /dev/null so the interpreter's final flush does not fail again."""
    import os
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass
    return 141


def main(argv=None) -> int:
    # everything inside the try, the handlers' own import included: an interrupt before they are
    # in place is Python's KeyboardInterrupt, and ends the command the same way
    try:
        from ..staging import install_handlers, pending_signal
        install_handlers()
        code = _main(argv)
        # a signal whose exception C code swallowed: the command still ends as interrupted
        intr = pending_signal()
        return code if intr is None else _interrupted(intr)
    except KeyboardInterrupt as e:
        return _interrupted(e)
    except Exception as e:
        intr = _interrupt_behind(e)
        if intr is None:
            raise
        return _interrupted(intr)


def _interrupt_behind(e: BaseException) -> KeyboardInterrupt | None:
    """The interrupt an error stands for: one raised while an interrupt unwound (a zip file that
    cannot close half-written), or one C code made of the interrupt (an extension's import that
    fails with it, a __set_name__ error caused by it), whether or not it kept it as the cause."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    from ..staging import pending_signal
    return pending_signal()


def _interrupted(e: KeyboardInterrupt) -> int:
    from ..staging import Terminated, clear_pending
    clear_pending()
    # A KeyboardInterrupt raised inside code that exec() ran from a string (dataclasses builds
    # its methods so) marks the interpreter as ending by an unhandled interrupt, caught or not,
    # and at exit it would kill itself with SIGINT; an exec() of a string that completes clears
    # the mark.
    exec("pass")
    term = isinstance(e, Terminated)
    print("graphgen: terminated" if term else "graphgen: interrupted", file=sys.stderr)
    return 143 if term else 130


def _main(argv) -> int:
    from .. import progress
    from ..dump.format import DumpError
    from ..errors import GraphgenError
    from ..play.scenario import ScenarioError

    args = build_parser().parse_args(argv)
    progress.set_mode(progress.mode_from_flags(args.quiet, args.progress))
    try:
        apply_library_options(args)
        return args.fn(args)
    except BrokenPipeError:
        return _closed_pipe()
    except (GraphgenError, ScenarioError, DumpError, FileNotFoundError, ValueError, NotImplementedError,
            OSError, RuntimeError) as e:
        # the interrupt's consequence: end as the interrupt
        intr = _interrupt_behind(e)
        if intr is not None:
            raise intr from None
        for msg in getattr(e, "problems", None) or [str(e).strip().splitlines()[0] if str(e).strip()
                                                    else type(e).__name__]:
            print(f"graphgen: error: {msg}", file=sys.stderr)
        return 2
