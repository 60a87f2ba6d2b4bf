"""Which `graphgen` commands need the graphgen[torch] extra (the draft authors' models).

One declaration, read from the parsed arguments, so that whatever asks (the command line, to
refuse before any work; the documentation's test, to skip a line where the extra is missing)
gets the same answer as the code that ends in graphgen.authors.require_torch.
"""

from __future__ import annotations

import argparse

# the accept engine that runs the authors' own loop (graphgen.accept.compare.AUTHORS); not
# imported from there, which would load the acceptance code for a question about flags
AUTHORS_ENGINE = "authors"


def engine_names(text: str) -> list[str]:
    """An --engines value as `graphgen accept` reads it: comma-separated, spaces ignored."""
    return [t for t in text.replace(" ", "").split(",") if t]


def torch_need(args: argparse.Namespace) -> str | None:
    """What in a parsed `graphgen` command needs the graphgen[torch] extra, as the flag a user
    gave; None when nothing does."""
    cmd = getattr(args, "cmd", None)
    if cmd in ("check", "convert"):  # the authors' model vs llama.cpp; llama.cpp's converter
        return cmd
    if cmd == "make-model" and getattr(args, "format", None) == "hf":
        return "--format hf"
    if cmd == "reduce":  # an authors' checkpoint is reduced against graphgen check
        for dest, flag in (("hf_settings", "--hf-settings"), ("checkpoint", "--checkpoint")):
            if getattr(args, dest, None) is not None:
                return flag
    if getattr(args, "engine", None) == "torch":
        return "--engine torch"
    engines = getattr(args, "engines", None)
    if isinstance(engines, str) and AUTHORS_ENGINE in engine_names(engines):
        return f"--engines {engines}"
    # the authors' checkpoint is read for the authors' engine only; named, it asks for that loop
    if getattr(args, "authors_draft", None) is not None:
        return "--authors-draft"
    return None
