"""The README's and the docs' commands run as written, and their links lead somewhere.

Every `sh` block of README.md and of docs/*.md is run, line by line, in a folder of its own
holding what the docs themselves define: `s.json` is the scenario of docs/formats.md's "Scenario
format" section. Synopsis lines are run as their shortest form: optional `[...]` groups and
continuation lines dropped, `a|b` taking `a`. A line is left out, and the reason counted, only
when it names a placeholder (DUMP, REF, FILE, <head>, ...), a developer's own build (`~/...`), a
GPU backend this machine lacks, a server that runs until stopped, or a job of its own (setup, the
test suite, mutation, fuzz and soak runs, which CI runs anyway or which take minutes). Each line
that runs must exit 0. A line that needs the graphgen[torch] extra is skipped where it is missing,
and so is every later line of its block that uses a file or folder such a skipped line would have
made; the block is then reported skipped, naming those lines, once the rest of it has run. A
block with no `graphgen` line (setup, test and tool runs) has nothing to run here.

Every `python` block runs whole, in a folder holding the tiny default draft `draft.gguf` and that
`s.json`, and must exit 0. Every relative link of README.md and docs/*.md must name a file that
exists and, with a `#fragment` into a Markdown page, a heading that page has; every docs page must
be linked from the README.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

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


def _scenario() -> str:
    section = TEXT["docs/formats.md"].split("## Scenario format", 1)[1]
    return re.search(r"```json\n(.*?)```", section, re.S).group(1)


def _blocks(page: str) -> list[tuple[int, list[str]]]:
    out = []
    for k, block in enumerate(re.findall(r"^```sh\n(.*?)^```", TEXT[page], re.S | re.M)):
        lines = []
        for raw in block.splitlines():
            if not raw.strip() or raw.startswith((" ", "\t")):
                continue  # continuation lines of a synopsis hold optional flags only
            lines.append(raw.split("  #")[0].strip())
        out.append((k, lines))
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


def _needs_torch(cmd: str) -> bool:
    return "--format hf" in cmd or "--engine torch" in cmd or cmd.split()[1:2] in (["convert"], ["check"])


def _makes(cmd: str) -> list[str]:
    """The files and folders a line writes: its --out, make-model's model, convert's output."""
    args = shlex.split(cmd)[1:]
    made = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--out"]
    if args[:1] == ["make-model"] and len(args) > 1:
        made.append(args[1])
    if args[:1] == ["convert"] and len(args) > 2:
        made.append(args[2])
    return [m.rstrip("/") for m in made]


def _why_skipped(cmd: str, have_torch: bool, unmade: dict[str, str], folder: Path) -> tuple[str, str] | None:
    """Why a line that is not left out (_why_not) is not run, and the cause at the root: it needs
    the torch extra, or it uses what an earlier skipped line would have made (`unmade`: path ->
    the cause that line was skipped for) and nothing has made since."""
    if _needs_torch(cmd) and not have_torch:
        return NO_TORCH, NO_TORCH
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


BLOCKS = [(page, k, lines) for page in PAGES for k, lines in _blocks(page)
          if any(l.startswith("graphgen") for l in lines)]


def test_the_readme_has_blocks_to_run():
    runnable = {page: [l for p, _, lines in BLOCKS if p == page for l in lines if _why_not(_shortest(l)) is None]
                for page in PAGES}
    assert sum(map(len, runnable.values())) >= 30, runnable
    assert len(runnable["README.md"]) >= 15, runnable["README.md"]


def test_a_line_using_what_a_skipped_line_makes_is_skipped_for_the_same_reason(tmp_path):
    """Without the torch extra, the torch section's `diff torch/ ref/` is skipped, naming the
    missing extra, not run on a folder that was never made."""
    lines = next(lines for _, _, lines in BLOCKS if "graphgen diff torch/ ref/" in lines)
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


def _env() -> dict:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _tiny_draft(folder: Path) -> None:
    """The tiny default draft, `draft.gguf`, for a block that uses it without making it."""
    subprocess.run([sys.executable, "-m", "graphgen.cli", "make-model", "draft.gguf"], cwd=folder,
                   check=True, capture_output=True)


@pytest.mark.parametrize("page,k,lines", BLOCKS, ids=[f"{page}-block{k}" for page, k, _ in BLOCKS])
def test_readme_block_runs(tmp_path, page, k, lines):
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
        why = _why_skipped(cmd, have_torch, unmade, tmp_path)
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
        p = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
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
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                       env=_env())
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
