"""The argument parser of the `graphgen` command: every command module's verbs, usage errors in one
line, every flag's help with its default."""

from __future__ import annotations

import argparse
import importlib

from .. import __version__

# the modules that add subcommands, in the order `graphgen --help` lists them
COMMAND_MODULES: tuple[str, ...] = (
    "graphgen.cli.model",    # make-model, info
    "graphgen.cli.dump",     # dump, diff
    "graphgen.cli.draft",    # draft
    "graphgen.cli.accept",   # accept
    "graphgen.cli.backend",  # devices, xdiff, rpc-server
    "graphgen.cli.view",     # view, trace, import
    "graphgen.cli.bench",    # bench
    "graphgen.cli.checkbatch",  # check-batch
    "graphgen.cli.demo",     # demo
    "graphgen.cli.convert",  # convert
    "graphgen.cli.authors",  # check (the draft authors' models; make-model --format hf, dump --engine torch)
    "graphgen.cli.reduce",   # reduce
)


def default_text(action: argparse.Action) -> str | None:
    """What a flag's help says of its default when the help text does not already: "off" for a
    switch, the value, or "not set" for an option that does nothing unless given."""
    if not action.option_strings or action.help == argparse.SUPPRESS:
        return None
    if action.default is argparse.SUPPRESS or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return None
    text = action.help or ""
    if "default" in text or "(required)" in text or action.required:
        return None
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if isinstance(action, argparse._StoreFalseAction):
        return "on"
    if action.default is None or action.default == []:
        return "not set"
    if isinstance(action.default, (list, tuple)):
        return ",".join(map(str, action.default))
    return str(action.default)


class _Help(argparse.HelpFormatter):
    """Every flag's help ends with its default (`default_text`)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required and action.option_strings and "required" not in text:
            return f"{text} (required)".lstrip()
        d = default_text(action)
        return text if d is None else f"{text} (default: {d})".lstrip()


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, pointing at --help, as every other graphgen error reads; every
    flag's help gives its default."""

    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", _Help)
        # no abbreviations: a shortened or mistyped flag must not be read as another one
        # (`--target` as --target-layers); add_parser makes the subcommands with this class
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def _get_option_tuples(self, option_string):
        found = super()._get_option_tuples(option_string)
        if self.allow_abbrev:
            return found
        # argparse still reads a single-dash flag's prefix (`-n` as -np) or a flag with a value
        # run into it (`-ct` as -c t) without allow_abbrev; llama.cpp takes neither
        return []

    def error(self, message):
        self.exit(2, f"graphgen: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="graphgen", description="DFlash-family draft graphs, node for node with llama.cpp")
    ap.add_argument("--version", action="version", version=f"graphgen {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    for modname in COMMAND_MODULES:
        importlib.import_module(modname).register(sub)

    # accepted before or after the command name
    for parser, default in [(ap, None)] + [(p, argparse.SUPPRESS) for p in sub.choices.values()]:
        parser.add_argument("--ggml", metavar="DIR", default=default,
                            help="compute on the libggml*.so in DIR (any llama.cpp build) instead of the "
                                 "reference's ggml; also $GRAPHGEN_GGML_DIR (default: the reference wheel's ggml)")
        parser.add_argument("--llama", metavar="DIR", default=default,
                            help="run the reference engine on the libllama.so in DIR (a build with b11739's "
                                 "C API); also $GRAPHGEN_LLAMA_DIR. Alone, graphgen also computes on its ggml "
                                 "(default: the reference wheel's libllama, b11739)")
    for parser, default in [(ap, False)] + [(p, argparse.SUPPRESS) for p in sub.choices.values()]:
        for flag, text in (("--quiet", "nothing on stderr but warnings and errors (no progress, no per-round "
                                       "lines) (default: off)"),
                           ("--progress", "print progress lines on stderr even when it is not a terminal and the "
                                          "work is quick (by default, only work past 2 s on a terminal shows them)")):
            own = parser._option_string_actions.get(flag)
            if own is not None:
                # a command's own flag of that name: the value given before the command name still counts
                own.default = default
                continue
            parser.add_argument(flag, action="store_true", default=default, help=text)
    # a flag given without help still says its default (argparse prints nothing for help=None)
    for parser in (ap, *sub.choices.values()):
        for action in parser._actions:
            if action.help is None and action.option_strings and action.required:
                action.help = "(required)"
            elif action.help is None and default_text(action) is not None:
                action.help = f"(default: {default_text(action)})"
    return ap
