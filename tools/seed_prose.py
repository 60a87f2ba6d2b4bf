#!/usr/bin/env python3
"""List Python comments that repeat the upstream seed's comment prose word for word.

graphgen keeps llama.cpp's structure but writes its own comments. This script gathers
the text of every C++ comment in the seed diff (added, removed and context lines alike),
joins it into one space-separated string so that a sentence wrapped over several
upstream lines is still whole, and then flags each Python comment or docstring line of
30+ characters whose text occurs in that string (ignoring case and spacing).

    python tools/seed_prose.py                     # the graphgen/ tree
    python tools/seed_prose.py graphgen/runtime    # some files or folders
    python tools/seed_prose.py --seed other.diff graphgen/models/dspark.py

Prints path:line: comment for each hit. Exit status: 0 clean, 1 hits found,
2 seed diff missing.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SEED = ROOT.parent / "shared" / "seed" / "llama.cpp-32bdc3a89-dflash-refactor.diff"
MIN_CHARS = 30


def normalize(text: str) -> str:
    return " ".join(text.split()).casefold()


def cpp_comments(diff: str) -> str:
    """Return the text of all C++ comments in the diff, joined by single spaces."""
    pieces: list[str] = []
    in_block = False
    for line in diff.splitlines():
        if line[:1] in "+- ":
            line = line[1:]
        i, n = 0, len(line)
        quote = None
        while i < n:
            if in_block:
                end = line.find("*/", i)
                text = line[i:] if end < 0 else line[i:end]
                pieces.append(text.lstrip().lstrip("*"))  # drop a " * " gutter
                if end < 0:
                    break
                in_block, i = False, end + 2
            elif quote:
                if line[i] == "\\":
                    i += 1
                elif line[i] == quote:
                    quote = None
                i += 1
            elif line.startswith("//", i):
                pieces.append(line[i:].lstrip("/!"))
                break
            elif line.startswith("/*", i):
                in_block, i = True, i + 2
            else:
                if line[i] in "\"'":
                    quote = line[i]
                i += 1
    return normalize(" ".join(pieces))


def python_comments(source: str):
    """Yield (line, text) for each # comment and each line of a string statement."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string.lstrip("#").strip()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            for lineno in range(node.lineno, node.end_lineno + 1):
                text = lines[lineno - 1]
                if lineno == node.end_lineno:
                    text = text[:node.end_col_offset]
                if lineno == node.lineno:
                    text = text[node.col_offset:]
                text = re.sub(r"^[rRuU]?(\"\"\"|'''|\"|')", "", text.strip())
                yield lineno, re.sub(r"(\"\"\"|'''|\"|')$", "", text).strip()


def python_files(paths: list[Path]):
    for path in paths:
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=Path, default=DEFAULT_SEED, help="upstream diff to compare with")
    parser.add_argument("paths", nargs="*", type=Path, default=[ROOT / "graphgen"],
                        help="Python files or folders (default: graphgen/)")
    args = parser.parse_args(argv)

    if not args.seed.is_file():
        print(f"seed_prose: seed diff not found: {args.seed}", file=sys.stderr)
        return 2
    upstream = cpp_comments(args.seed.read_text(encoding="utf-8", errors="replace"))

    found = 0
    for path in python_files(args.paths):
        shown = path.resolve().relative_to(Path.cwd()) if path.resolve().is_relative_to(Path.cwd()) else path
        try:
            comments = sorted(python_comments(path.read_text(encoding="utf-8")))
        except (SyntaxError, tokenize.TokenError) as e:
            print(f"seed_prose: skipping {shown}: {e}", file=sys.stderr)
            continue
        for lineno, text in comments:
            words = normalize(text)
            if len(words) >= MIN_CHARS and words in upstream:
                print(f"{shown}:{lineno}: {text}")
                found += 1
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
