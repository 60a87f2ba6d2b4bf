"""The greedy loop: try every smaller case, keep one when it fails the same way, to a fixpoint.

Edits come biggest cut first (`Case.edits`), so the first kept ones remove most of the work of
those after them. After a kept edit the list starts again from the smaller case; an edit that
did not keep the failure is not tried again in the same words. The loop ends when no edit keeps
the failure, or after `max_tries` runs (the result then says it stopped short).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import GraphgenError
from .case import Case
from .failure import Failure, Mode, Outcome, preflight, run_case


class ReduceError(GraphgenError, ValueError):
    """A case that cannot be reduced: it does not fail, or its first run cannot be made."""


@dataclass
class Reduced:
    original: Case
    reduced: Case
    failure: Failure
    outcome: Outcome            # the reduced case's run
    original_outcome: Outcome
    tries: int = 0
    kept: list[str] = field(default_factory=list)
    not_kept: list[tuple[str, str]] = field(default_factory=list)  # (edit, what its run gave)
    seconds: float = 0.0
    complete: bool = True       # False: stopped at max_tries before a fixpoint


def _valid(case: Case) -> bool:
    """Whether the scenario parses and the settings are ones make_model takes, checked without
    running anything (a refused edit is no smaller failure)."""
    from ..play.scenario import ScenarioError, parse_scenario
    try:
        parse_scenario(case.scenario)
    except ScenarioError:
        return False
    return True


def reduce(case: Case, mode: Mode, progress: Callable[[str], None] | None = None, max_tries: int = 300,
           timeout: float = 600, work: Path | None = None) -> Reduced:
    """Shrink `case` while `mode`'s failure persists; `progress(line)` hears of every try."""
    say = progress or (lambda line: None)
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="graphgen-reduce-", dir=work))
    try:
        preflight(timeout)
        say(f"running the case as given ({mode.label})")
        first = run_case(case, mode, root / "given", timeout)
        if first.failure.kind == "none":
            raise ReduceError(f"the case does not fail ({mode.label} agree): nothing to reduce")
        say(f"failure: {first.failure.describe()}")
        res = Reduced(case, case, first.failure, first, first)
        tried: set[str] = set()
        current, best = case, first
        progress_made = True
        while progress_made and res.tries < max_tries:
            progress_made = False
            for what, make in current.edits():
                if what in tried:
                    continue
                tried.add(what)
                try:
                    cand = make()
                except (ValueError, KeyError, IndexError):
                    cand = None
                if cand is None or not _valid(cand):
                    continue
                res.tries += 1
                folder = root / f"try-{res.tries}"
                try:
                    out = run_case(cand, mode, folder, timeout)
                except (GraphgenError, ValueError, OSError) as e:
                    # the smaller draft could not even be written: not this failure
                    out = Outcome(Failure("refused", "reduce", how="case", detail=" ".join(str(e).split())), {})
                same = out.failure == first.failure
                say(f"[{res.tries}] {what}: " + ("kept, the failure persists" if same else
                                                  f"not kept ({out.failure.describe()[:120]})"))
                if same:
                    cand.history = current.history + [what]
                    current, best = cand, out
                    res.kept.append(what)
                    progress_made = True
                    break
                res.not_kept.append((what, out.failure.describe()))
                shutil.rmtree(folder, ignore_errors=True)
                if res.tries >= max_tries:
                    break
        res.reduced, res.outcome = current, best
        res.complete = res.tries < max_tries
        res.seconds = time.monotonic() - t0
        return res
    finally:
        shutil.rmtree(root, ignore_errors=True)
