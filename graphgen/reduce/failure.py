"""Running a case, each side in a fresh process, and the signature of what went wrong.

A side runs as `graphgen dump` (or `graphgen xdiff`, or for an authors' checkpoint `graphgen
check`) in a child process, so a crash (a GGML_ASSERT, a signal) is a failure the reducer can
keep, not the end of the reducer. The
signature keeps what identifies a failure and drops what a smaller case changes anyway: node
indices, layer numbers in names, sizes and numbers in messages.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .case import Case


@dataclass(frozen=True)
class Failure:
    """kind: parting (the first node where the sides part), departs (check: the first node where
    llama.cpp, and graphgen with it, leaves the authors' model beyond rounding), refused (a side
    ended with an error), crash (a side died) or none (the sides agree)."""
    kind: str
    side: str = ""    # refused / crash: which side
    graph: str = ""   # parting / departs: inject, block or encoder
    how: str = ""     # parting: structural change kind and fields, or "value"; departs: the node's name,
    #                   layer numbers out; refused: the message, numbers out
    op: str = ""      # parting: the op of the node where they part
    detail: str = field(default="", compare=False)  # the full line, for people

    def describe(self) -> str:
        if self.kind == "none":
            return "no failure: the two sides agree"
        if self.kind == "parting":
            return f"the sides part at a {self.op} node of the {self.graph} graph ({self.how}): {self.detail}"
        if self.kind == "departs":
            return f"llama.cpp departs from the authors' model at {self.how} in the {self.graph} graph: {self.detail}"
        if self.kind == "crash":
            return f"{self.side} crashed: {self.detail}"
        return f"{self.side} refused: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Mode:
    """What fails: graphgen against llama.cpp (`llama_dir`: any build, None for b11739's),
    backend against backend (`backends`), or (`check`) an authors' checkpoint against llama.cpp's
    conversion of it and graphgen, as `graphgen check` runs them."""
    backends: tuple[str, str] | None = None
    llama_dir: str | None = None
    nmse: float | None = None
    check: bool = False

    @property
    def label(self) -> str:
        if self.backends:
            return f"{self.backends[0]} against {self.backends[1]}"
        llama = f"llama.cpp at {self.llama_dir}" if self.llama_dir else "llama.cpp b11739"
        if self.check:
            return f"the authors' model against {llama} and graphgen (graphgen check)"
        return "graphgen against " + llama

    def commands(self, draft: str, scenario: str, target: str | None = None) -> dict[str, list[str]]:
        """Each side's command line, as run and as the repro folder gives it (`target`: check's
        --target, the checkpoint's target folder)."""
        nmse = [] if self.nmse is None else ["--nmse", repr(self.nmse)]
        if self.check:
            llama = [] if self.llama_dir is None else ["--llama", self.llama_dir]
            tgt = [] if target is None else ["--target", target]
            return {"check": ["graphgen", *llama, "check", draft, *tgt, "--scenario", scenario, "--keep", "check",
                              "--json"]}
        if self.backends:
            return {"xdiff": ["graphgen", "xdiff", draft, "--scenario", scenario, "-dev", ",".join(self.backends),
                              "--json", "--out", "xdiff", *nmse]}
        llama = [] if self.llama_dir is None else ["--llama", self.llama_dir]
        return {"graphgen": ["graphgen", "dump", draft, "--scenario", scenario, "--out", "ours"],
                "llama.cpp": ["graphgen", *llama, "dump", draft, "--engine", "llama.cpp", "--scenario", scenario,
                              "--out", "ref"],
                "diff": ["graphgen", "diff", "ref", "ours", "--local", *nmse]}


@dataclass
class Outcome:
    failure: Failure
    printed: dict[str, str]   # what each command printed (stdout and stderr)
    report: str = ""          # the comparison's report


_NUMBERS = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")
_PATHS = re.compile(r"(/[^\s:'\"]+)+")


def _normalized(message: str) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = first.removeprefix("graphgen: error: ")
    return _NUMBERS.sub("N", _PATHS.sub("PATH", first))[:160]


def _run(argv: list[str], cwd: Path, timeout: float) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a graphgen command line run in a fresh interpreter."""
    cmd = [sys.executable, "-m", "graphgen.cli", *argv[1:]]
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return -999, "", f"timed out after {timeout:g} s"
    return p.returncode, p.stdout, p.stderr


def _last_error(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("graphgen: error:")]
    if lines:
        return lines[-1]
    rest = [ln for ln in text.splitlines() if ln.strip()]
    return rest[-1] if rest else "(nothing printed)"


def _side_failure(side: str, rc: int, text: str) -> Failure:
    if rc == -999:
        return Failure("crash", side, how="timeout", detail=text)
    if rc < 0 or rc >= 128 or "GGML_ASSERT" in text or "Fatal Python error" in text:
        why = next((ln for ln in text.splitlines() if "GGML_ASSERT" in ln), f"exit status {rc}")
        return Failure("crash", side, how=_normalized(why), detail=why.strip())
    err = _last_error(text)
    return Failure("refused", side, how=_normalized(err), detail=err.removeprefix("graphgen: error: "))


def preflight(timeout: float = 120) -> None:
    """The child processes the reducer runs must be this graphgen: one that cannot even start
    would fail every case alike, and be reduced as if that were the failure."""
    rc, out, err = _run(["graphgen", "--version"], Path.cwd(), timeout)
    if rc != 0:
        raise RuntimeError(f"cannot run graphgen in a child process ({sys.executable} -m graphgen.cli): "
                           + " ".join((err or out).split())[:300])


def target_of(case: Case, draft_arg: str) -> str | None:
    """A checkpoint written from settings runs beside its own target folder, named, so that the
    folder still runs where it is moved (a speculators config names where it was made)."""
    return f"{draft_arg}/target" if case.format == "hf" and case.config is not None else None


def run_case(case: Case, mode: Mode, work: Path, timeout: float = 600, target: str | None = None) -> Outcome:
    """Write the case into `work`, run both sides there, and say how it fails (`target`: check's
    --target, where it is not the written checkpoint's own)."""
    draft, sc = case.write(work)
    draft_arg = str(Path(draft).resolve()) if case.config is None else draft.name
    cmds = mode.commands(draft_arg, sc.name, target=target or target_of(case, draft_arg))
    printed: dict[str, str] = {}
    if mode.check:
        rc, out, err = _run(cmds["check"], work, timeout)
        printed["check"] = out + err
        if rc not in (0, 1) or not out.lstrip().startswith("{"):
            return Outcome(_side_failure("check", rc, out + err), printed)
        return _check_outcome(json.loads(out), work / "check", mode, printed)
    if mode.backends:
        rc, out, err = _run(cmds["xdiff"], work, timeout)
        printed["xdiff"] = out + err
        if rc not in (0, 1):
            return Outcome(_side_failure("xdiff", rc, out + err), printed)
        return Outcome(_xdiff_failure(out), printed, report=out)
    for side in ("graphgen", "llama.cpp"):
        rc, out, err = _run(cmds[side], work, timeout)
        printed[side] = out + err
        if rc != 0:
            return Outcome(_side_failure(side, rc, out + err), printed)
    from ..compare.pairing import diff_paths
    results = diff_paths(work / "ref", work / "ours", nmse=mode.nmse)
    report = "\n\n".join(r.format_text() for r in results)
    return Outcome(_diff_failure(results), printed, report=report)


def _diff_failure(results) -> Failure:
    for r in results:
        if r.identical:
            continue
        if r.unpaired:
            return Failure("parting", graph=r.graph, how=f"no partner ({r.unpaired})", detail=r.notes[0] if r.notes else "")
        fd = r.first_divergence
        if fd is None:
            # not identical yet no divergence: settings, unseen or uncompared nodes
            why = r.settings_differ[:1] or [n for _, _, n, _ in r.not_compared[:1]] or [r.status]
            return Failure("parting", graph=r.graph, how=r.status.lower(), detail=str(why[0]))
        side, idx = ("ref", fd["ref_index"]) if fd["ref_index"] is not None else ("ours", fd["ours_index"])
        rows = fd["context"][side]
        op = next((row["op"] for row in rows if row["index"] == idx), "")
        how = fd["kind"]
        if how == "changed":
            d = next((d for d in r.structural if d.ref_index == fd["ref_index"] and d.ours_index == fd["ours_index"]), None)
            how = "changed " + ",".join(sorted(d.fields)) if d is not None else how
        return Failure("parting", graph=r.graph, how=how, op=op, detail=fd["detail"])
    return Failure("none")


_LAYER = re.compile(r"-\d+\b")


def _graph_kind(name) -> str:
    """'01-block.json' (a dump file, as check names graphs) -> 'block'."""
    from ..dump.format import DUMP_NAME_RE
    m = DUMP_NAME_RE.match(Path(str(name)).name)
    return m.group(2) if m else str(name)


def _check_outcome(doc: dict, kept: Path, mode: Mode, printed: dict[str, str]) -> Outcome:
    """The signature of a `graphgen check` run, in its verdict's order: nothing compared, then
    graphgen's graph against llama.cpp's (its first parting node, from the kept dumps), then the
    first node where llama.cpp leaves the authors' model, then argmax or selector paths."""
    report = json.dumps({k: doc.get(k) for k in ("verdict", "exit", "class")}, indent=1)
    if doc.get("exit") == 0:
        return Outcome(Failure("none"), printed, report=report)
    arb = doc.get("arbiter") or {}
    verdict = str(doc.get("verdict", ""))
    if not any(n.get("llama.cpp") is not None for n in arb.get("nodes", [])):
        return Outcome(Failure("refused", "check", how="not compared", detail=verdict), printed, report=report)
    if not doc.get("graphgen_identical_to_llama.cpp", True):
        from ..compare.pairing import diff_paths
        results = diff_paths(kept / "llama.cpp", kept / "graphgen", nmse=mode.nmse)
        text = "\n\n".join(r.format_text() for r in results)
        return Outcome(_diff_failure(results), printed, report=text)
    bad = arb.get("first_departure")
    if bad:
        f = Failure("departs", "llama.cpp", graph=_graph_kind(bad["graph"]), how=_LAYER.sub("-N", bad["name"]),
                    detail=verdict)
        return Outcome(f, printed, report=report)
    for kind, rows, n_key in (("argmax", arb.get("argmax", []), "rows"),
                              ("selector path", arb.get("selector_path", []), "steps")):
        for r in rows:
            if r[n_key] - r["equal"] - r["near_ties"] > 0:
                f = Failure("departs", "llama.cpp", graph=_graph_kind(r["graph"]), how=kind, detail=verdict)
                return Outcome(f, printed, report=report)
    return Outcome(Failure("refused", "check", how=_normalized(verdict), detail=verdict), printed, report=report)


def _xdiff_failure(text: str) -> Failure:
    try:
        doc = json.loads(text)
    except ValueError:
        return Failure("refused", "xdiff", how="unreadable report", detail=text.strip()[:200])
    for g in doc.get("graphs", []):
        if g.get("structural"):
            return Failure("parting", graph=g["graph"], how="structure", detail=str(g["structural"][0]))
        b = g.get("first_bad")
        if b:
            return Failure("parting", graph=g["graph"], how="value", op=b["op"],
                           detail=f"#{b['index']} {b['name']} ({b['op']}) nmse {b['nmse']:.3g} > {b['threshold']:g}")
        if g.get("not_compared"):
            return Failure("parting", graph=g["graph"], how="not compared", detail=str(g["not_compared"][0]))
    return Failure("none")
