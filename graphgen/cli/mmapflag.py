"""--no-mmap, llama.cpp's flag, for the commands that load a draft's weights."""

from __future__ import annotations

import functools


def add_mmap_flag(p) -> None:
    """Add --no-mmap to a command's parser; call it after the parser's set_defaults(fn=...).

    The choice reaches the loader through the environment for the command's duration
    (graphgen.runtime.mmapfile.no_mmap), so the llama.cpp engine's child processes see it too,
    and nothing of ggml is imported before --ggml has chosen which ggml loads."""
    p.add_argument("--no-mmap", action="store_true",
                   help="copy the weights into a buffer instead of computing on the mapped file "
                        "(default: mapped, as llama.cpp)")
    fn = p.get_default("fn")
    if fn is None:
        raise ValueError(f"{p.prog}: add_mmap_flag needs the parser's fn default set first")

    @functools.wraps(fn)
    def run(args):
        if not getattr(args, "no_mmap", False):
            return fn(args)
        from ..runtime.mmapfile import no_mmap
        with no_mmap():
            return fn(args)
    p.set_defaults(fn=run)
