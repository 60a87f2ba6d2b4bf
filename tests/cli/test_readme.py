"""The README's and the docs' commands run as written, and their links lead somewhere.

Every `sh` block of README.md and of docs/*.md is run, line by line, in a folder of its own
holding what the docs themselves define: `s.json` is the scenario of docs/formats.md's "Scenario
format" section. Synopsis lines are run as their shortest form: optional `[...]` groups and
continuation lines dropped, `a|b` taking `a`. A line is left out, and the reason counted, only
when it names a placeholder (DUMP, REF, FILE, <head>, ...), a developer's own build (`~/...`), a
GPU backend this machine lacks, a server that runs until stopped, or a job of its own (setup, the
test suite, mutation, fuzz and soak runs, which CI runs anyway or which take minutes). Each line
that runs must exit 0. A line that needs the graphgen[torch] extra is skipped where it is missing
(or hidden by GRAPHGEN_HIDE_TORCH=1), and so is every later line of its block that uses a file or
folder such a skipped line would have made; the block is then reported skipped, naming those
lines, once the rest of it has run. A `graphgen` line's need is what graphgen.cli.extras.torch_need
says of it as graphgen's own parser reads it; another line needs the extra when it runs a tool of
TORCH_TOOLS or names the authors' engine in --engines; a block preceded by `<!-- needs: torch -->`
needs it on every line. A block with no `graphgen` line (setup, test and tool runs) has nothing to
run here.

Every `python` block runs whole, in a folder holding the tiny default draft `draft.gguf` and that
`s.json`, and must exit 0. Every relative link of README.md and docs/*.md must name a file that
exists and, with a `#fragment` into a Markdown page, a heading that page has; every docs page must
be linked from the README.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from graphgen.cli.extras import AUTHORS_ENGINE, engine_names, torch_need
from graphgen.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
# the pages whose blocks run and whose links are checked: the README, then docs/ by name
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
TEXT = {page: (ROOT / page).read_text() for page in PAGES}
PLACEHOLDERS = re.compile(r"\b(DUMP|REF|OURS|FILE|DIR|HOST|PORT|IDS|F\.npy|NAME|WORD)\b|<")
OWN_JOBS = ("tools/setup.sh", "python tools/mutate.py", "python -m pytest", "make fuzz", "make sessions", "fuzz_main.py",
            "tools/soak.py")
# graphgen's backend names and llama.cpp's device names (Vulkan0, CUDA0, Metal)
GPU = re.compile(r"\b(vulkan|cuda|metal)(\b|\d)", re.I)
# tools that run or train the authors' models whatever their flags
TORCH_TOOLS = ("tools/train_draft.py", "tools/authors_agreement.py", "tools/target_numerics.py")
# what a block may declare on the line before its fence, `<!-- needs: torch -->`
KNOWN_NEEDS = {"torch"}
SH_BLOCK = re.compile(r"(?:^<!--\s*needs:\s*([^>]*?)\s*-->\n)?^```sh\n(.*?)^```", re.S | re.M)


def _scenario() -> str:
    section = TEXT["docs/formats.md"].split("## Scenario format", 1)[1]
    return re.search(r"```json\n(.*?)```", section, re.S).group(1)


def _blocks(text: str) -> list[tuple[int, list[str], frozenset[str]]]:
    """Each `sh` block: its index, its lines, and what its `<!-- needs: ... -->` declares."""
    out = []
    for k, (needs, block) in enumerate(SH_BLOCK.findall(text)):
        lines = []
        for raw in block.splitlines():
            if not raw.strip() or raw.startswith((" ", "\t")):
                continue  # continuation lines of a synopsis hold optional flags only
            lines.append(raw.split("  #")[0].strip())
        out.append((k, lines, frozenset(n.strip() for n in needs.split(",") if n.strip())))
    return out


def _shortest(line: str) -> str:
    prev = None
    while prev != line:
        prev, line = line, re.sub(r"\s*\[[^\[\]]*\]", "", line)
    return re.sub(r"(\S+?)\|\S+", r"\1", line)


def _why_not(line: str) -> str | None:
    if line.startswith(OWN_JOBS) or any(j in line for j in OWN_JOBS):
        return "a job of its own"
    if "~/" in line:
        return "a developer's own build"
    if PLACEHOLDERS.search(line):
        return "a placeholder"
    if "rpc-server" in line:
        return "a server that runs until stopped"
    if GPU.search(line):
        return "a GPU backend"
    return None


def _torch_available() -> bool:
    try:
        from graphgen.authors import require_torch
        require_torch()
        return True
    except Exception:  # noqa: BLE001
        return False


NO_TORCH = "the graphgen[torch] extra is missing"
_PARSER = build_parser()


def _torch_need(cmd: str) -> str | None:
    """What in a line needs the graphgen[torch] extra, or None. A `graphgen` line is read by
    graphgen's own parser and judged by graphgen's own declaration; one it refuses needs nothing
    here, and fails when run, naming why."""
    args = shlex.split(cmd)
    if args[:1] == ["graphgen"]:
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                parsed = _PARSER.parse_args(args[1:])
        except SystemExit:
            return None
        return torch_need(parsed)
    for i, a in enumerate(args):
        if a in TORCH_TOOLS:
            return a
        value = a.partition("=")[2] if a.startswith("--engines=") else \
            args[i + 1] if a == "--engines" and i + 1 < len(args) else None
        if value is not None and AUTHORS_ENGINE in engine_names(value):
            return f"--engines {value}"
    return None


def _makes(cmd: str) -> list[str]:
    """The files and folders a line writes: its --out, make-model's model, convert's output."""
    args = shlex.split(cmd)[1:]
    made = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--out"]
    if args[:1] == ["make-model"] and len(args) > 1:
        made.append(args[1])
    if args[:1] == ["convert"] and len(args) > 2:
        made.append(args[2])
    return [m.rstrip("/") for m in made]


def _why_skipped(cmd: str, have_torch: bool, unmade: dict[str, str], folder: Path,
                 needs: frozenset[str] = frozenset()) -> tuple[str, str] | None:
    """Why a line that is not left out (_why_not) is not run, and the cause at the root: it needs
    the torch extra (by its command, or by its block's declared `needs`), or it uses what an
    earlier skipped line would have made (`unmade`: path -> the cause that line was skipped for)
    and nothing has made since."""
    need = "the block's <!-- needs: torch -->" if "torch" in needs else _torch_need(cmd)
    if need is not None and not have_torch:
        return f"{NO_TORCH} (needed for {need})", NO_TORCH
    for arg in shlex.split(cmd)[1:]:
        path = arg.rstrip("/")
        if path in unmade and not (folder / path).exists():
            return f"it uses {arg}, which a line skipped before it makes: {unmade[path]}", unmade[path]
    return None


def _skip(cmd: str, why: tuple[str, str], unmade: dict[str, str], folder: Path) -> str:
    """Note what the skipped line would have made; its reason, to report."""
    for m in _makes(cmd):
        if not (folder / m).exists():
            unmade[m] = why[1]
    return f"`{cmd}`: {why[0]}"


ALL_BLOCKS = [(page, k, lines, needs) for page in PAGES for k, lines, needs in _blocks(TEXT[page])]
BLOCKS = [b for b in ALL_BLOCKS if any(l.startswith("graphgen") for l in b[2])]


def test_the_readme_has_blocks_to_run():
    runnable = {page: [l for p, _, lines, _ in BLOCKS if p == page for l in lines if _why_not(_shortest(l)) is None]
                for page in PAGES}
    assert sum(map(len, runnable.values())) >= 30, runnable
    assert len(runnable["README.md"]) >= 15, runnable["README.md"]


def test_a_line_using_what_a_skipped_line_makes_is_skipped_for_the_same_reason(tmp_path):
    """Without the torch extra, the torch section's `diff torch/ ref/` is skipped, naming the
    missing extra, not run on a folder that was never made."""
    lines = next(lines for _, _, lines, _ in BLOCKS if "graphgen diff torch/ ref/" in lines)
    unmade: dict[str, str] = {}
    reasons = {}
    for line in lines:
        cmd = _shortest(line)
        if _why_not(cmd) is not None:
            continue
        why = _why_skipped(cmd, False, unmade, tmp_path)
        assert why is not None, f"`{cmd}` would run with the torch extra missing"
        reasons[cmd] = _skip(cmd, why, unmade, tmp_path)
    diff = reasons["graphgen diff torch/ ref/"]
    assert "torch/" in diff and NO_TORCH in diff, diff


TORCH_NEEDS = [
    # the authors' engine, anywhere in the list, in either spelling
    ("graphgen accept -m smollm2 -md smollm2-dflash --engines llama.cpp,graphgen,authors", True),
    ("graphgen accept -m smollm2 -md smollm2-dflash --engines authors,graphgen -n 8", True),
    ("graphgen accept -m smollm2 -md smollm2-dflash --engines=llama.cpp,authors", True),
    ("graphgen --quiet accept -m smollm2 -md smollm2-dflash --engines 'graphgen, authors'", True),
    ("graphgen accept -m smollm2 -md smollm2-dflash --authors-draft ck/", True),
    ("graphgen accept -m smollm2 -md smollm2-dflash --engines llama.cpp,graphgen", False),
    ("graphgen accept -m smollm2 -md smollm2-dflash -n 16", False),
    ("graphgen dump ck/ --engine torch --scenario s.json --out torch/", True),
    ("graphgen dump draft.gguf --scenario s.json --out ref/ --engine llama.cpp", False),
    ("graphgen make-model ck/ --format hf --variant dspark", True),
    ("graphgen make-model draft.gguf --format gguf", False),
    ("graphgen view ours/ --format dot", False),
    ("graphgen convert ck/ draft.gguf", True),
    ("graphgen check ck/", True),
    ("graphgen check-batch draft.gguf --fail-on parity", False),
    ("graphgen diff torch/ ref/", False),
    ("graphgen draft -m smollm2 -md smol.gguf -p hi -n 4 --engine llama.cpp", False),
    # other lines: a tool of the authors' models, or the authors' engine among a tool's
    (".venv/bin/python tools/train_draft.py --variant dflash --steps 3000", True),
    ("python tools/quantized_target.py smollm2-dflash --engines llama.cpp,authors", True),
    ("python tools/quantized_target.py smollm2-dflash --engines=authors", True),
    ("python tools/quantized_target.py smollm2-dflash -n 64 --engines llama.cpp,graphgen", False),
]


@pytest.mark.parametrize("line,needs", TORCH_NEEDS, ids=[l for l, _ in TORCH_NEEDS])
def test_a_lines_need_for_the_torch_extra_is_derived_from_its_command(line, needs, tmp_path):
    assert (_torch_need(line) is not None) == needs
    why = _why_skipped(line, False, {}, tmp_path)
    assert (why is not None and NO_TORCH in why[0]) == needs, why
    assert _why_skipped(line, True, {}, tmp_path) is None


def test_the_docs_authors_engine_lines_are_skipped_without_the_extra(tmp_path):
    """The acceptance and trained-draft pages' authors' loop runs, each named by the reason."""
    lines = [c for _, _, ls, _ in BLOCKS for c in map(_shortest, ls) if f",{AUTHORS_ENGINE}" in c]
    assert len(lines) >= 3, lines
    for cmd in lines:
        why = _why_skipped(cmd, False, {}, tmp_path)
        assert why is not None and "--engines" in why[0] and NO_TORCH in why[0], (cmd, why)


def test_a_block_may_declare_that_it_needs_the_extra(tmp_path):
    text = ("```sh\ngraphgen info draft.gguf\n```\n\n<!-- needs: torch -->\n"
            "```sh\ngraphgen info draft.gguf\n```\n")
    (k0, lines0, needs0), (k1, lines1, needs1) = _blocks(text)
    assert (k0, lines0, needs0) == (0, ["graphgen info draft.gguf"], frozenset())
    assert (k1, lines1, needs1) == (1, ["graphgen info draft.gguf"], frozenset({"torch"}))
    assert _why_skipped(lines0[0], False, {}, tmp_path, needs0) is None
    why = _why_skipped(lines1[0], False, {}, tmp_path, needs1)
    assert why is not None and NO_TORCH in why[0] and "needs: torch" in why[0], why
    assert _why_skipped(lines1[0], True, {}, tmp_path, needs1) is None


def test_every_declared_need_is_known():
    assert {(page, k, n) for page, k, _, needs in ALL_BLOCKS for n in needs if n not in KNOWN_NEEDS} == set()


def test_hiding_the_extra_makes_require_torch_refuse_naming_it(monkeypatch, tmp_path):
    from graphgen.authors import AuthorsError, require_torch
    monkeypatch.setenv("GRAPHGEN_HIDE_TORCH", "1")
    with pytest.raises(AuthorsError, match=r"need the graphgen\[torch\] extra: hidden by GRAPHGEN_HIDE_TORCH=1"):
        require_torch()
    assert not _torch_available()
    # and in a command run under it, as the docs' lines are
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "make-model", "ck/", "--format", "hf"], cwd=tmp_path,
                       capture_output=True, text=True, env=_env())
    assert p.returncode == 2 and "graphgen[torch] extra: hidden by GRAPHGEN_HIDE_TORCH=1" in p.stderr, p.stderr
    assert not (tmp_path / "ck").exists()
    monkeypatch.setenv("GRAPHGEN_HIDE_TORCH", "0")
    try:
        require_torch()
    except AuthorsError as e:
        assert "hidden" not in str(e) and "missing" in str(e)


def _env() -> dict:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _tiny_draft(folder: Path) -> None:
    """The tiny default draft, `draft.gguf`, for a block that uses it without making it."""
    subprocess.run([sys.executable, "-m", "graphgen.cli", "make-model", "draft.gguf"], cwd=folder,
                   check=True, capture_output=True)


@pytest.mark.parametrize("page,k,lines,needs", BLOCKS, ids=[f"{page}-block{k}" for page, k, _, _ in BLOCKS])
def test_readme_block_runs(tmp_path, page, k, lines, needs):
    (tmp_path / "s.json").write_text(_scenario())
    json.loads((tmp_path / "s.json").read_text())
    env = _env()
    have_torch = _torch_available()
    ran = 0
    unmade: dict[str, str] = {}  # what skipped lines would have made, and why they were skipped
    skipped = []
    for line in lines:
        cmd = _shortest(line)
        if _why_not(cmd) is not None:
            continue
        why = _why_skipped(cmd, have_torch, unmade, tmp_path, needs)
        if why is not None:
            if os.environ.get("GRAPHGEN_REQUIRE_TORCH") == "1":
                pytest.fail(f"GRAPHGEN_REQUIRE_TORCH=1 but `{cmd}` is skipped: {why[0]}")
            skipped.append(_skip(cmd, why, unmade, tmp_path))
            continue
        args = shlex.split(cmd)
        if args[0] == "graphgen" and "draft.gguf" in args and args[1:2] != ["convert"] \
                and not (tmp_path / "draft.gguf").exists():
            _tiny_draft(tmp_path)  # a block that uses the draft without making it: the tiny default
        args = [sys.executable, "-m", "graphgen.cli"] + args[1:] if args[0] == "graphgen" else args
        if args[3:4] == ["bench"]:
            args += ["--repeat", "2"]  # the README's default of 20 repetitions is for measuring
        p = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=env)
        assert p.returncode == 0, f"{page} block {k}: `{cmd}` exited {p.returncode}: {p.stderr[-1500:]}"
        ran += 1
    if skipped:
        pytest.skip(f"{page} block {k}: {len(skipped)} line(s) skipped, {ran} ran: " + "; ".join(skipped))
    assert ran or all(_why_not(_shortest(l)) for l in lines if l.startswith("graphgen")), lines

# -- python blocks ------------------------------------------------------------------------------

PY_BLOCKS = [(page, k, block) for page in PAGES
             for k, block in enumerate(re.findall(r"^```python\n(.*?)^```", TEXT[page], re.S | re.M))]


def test_the_readme_has_python_to_run():
    assert any(page == "README.md" for page, _, _ in PY_BLOCKS), "the README shows no Python API"


@pytest.mark.parametrize("page,k,code", PY_BLOCKS, ids=[f"{page}-python{k}" for page, k, _ in PY_BLOCKS])
def test_python_block_runs(tmp_path, page, k, code):
    (tmp_path / "s.json").write_text(_scenario())
    _tiny_draft(tmp_path)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=_env())
    assert p.returncode == 0, f"{page} python block {k} exited {p.returncode}: {p.stderr[-1500:]}"


# -- links --------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _prose(text: str) -> str:
    """The page without its fenced blocks and inline code, where a link is not a link."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", text), re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _broken_links(page: str, text: str) -> list[str]:
    broken = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto: ...: not a file of this tree
        path, _, fragment = target.partition("#")
        dest = (ROOT / page).parent / path if path else ROOT / page
        if not dest.exists():
            broken.append(f"{page}: {target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest.read_text()):
            broken.append(f"{page}: {target}: {dest.name} has no heading #{fragment}")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_lead_somewhere(page):
    assert _broken_links(page, TEXT[page]) == []


def test_a_broken_link_is_caught():
    text = ("[ok](docs/formats.md#scenario-format) [gone](docs/nothing.md) "
            "[anchor](docs/formats.md#no-such-heading) [here](#read-next) [there](#nowhere) "
            "[web](https://example.org/x) `[code](not/a/link.md)`")
    assert _broken_links("README.md", text) == [
        "README.md: docs/nothing.md: no such file",
        "README.md: docs/formats.md#no-such-heading: formats.md has no heading #no-such-heading",
        "README.md: #nowhere: README.md has no heading #nowhere"]
    assert _slug("Dump format `graphgen-dump/1`") == "dump-format-graphgen-dump1"
    assert _slug("Progress, and llama.cpp's log") == "progress-and-llamacpps-log"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {os.path.normpath(t.partition("#")[0]) for t in LINK.findall(_prose(README))}
    assert [p for p in PAGES[1:] if p not in linked] == []
