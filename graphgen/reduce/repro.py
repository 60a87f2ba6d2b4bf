"""The repro folder: what a llama.cpp issue can carry, written whole or not at all, then rerun.

    draft.gguf        the reduced draft (or, for a draft kept whole, its path in failure.json)
    settings.json     the make-model settings that write draft.gguf again
    scenario.json     the reduced scenario
    README.md         the failure, the sizes before and after, the exact commands
    printed/          what each side printed, and the comparison's report
    failure.json      the signature, the edits kept, sizes, times, and the rerun's verdict

The folder is rerun once, from its own files, in fresh processes, before it is moved into place:
a repro that does not reproduce is refused, never written as if it did.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path
from typing import Callable

from ..staging import staged_new_folder
from .case import Case
from .failure import Mode, run_case
from .shrink import ReduceError, Reduced

MAX_COPIED = 64 << 20  # a draft kept whole is copied into the folder up to this size


def _commands(mode: Mode, draft: str) -> list[str]:
    return [shlex.join(c) for c in mode.commands(draft, "scenario.json").values()]


def write_repro(out: Path, res: Reduced, mode: Mode, progress: Callable[[str], None] | None = None,
                timeout: float = 600) -> dict:
    """Write the folder for `res` at `out` (a new folder), after rerunning it from there."""
    say = progress or (lambda line: None)
    case = res.reduced
    with staged_new_folder(out) as tmp:
        tmp = Path(tmp).resolve()
        if case.config is not None:
            draft, _ = case.write(tmp)
            (tmp / "settings.json").write_text(json.dumps(case.config, indent=1) + "\n")
            draft_arg = "draft.gguf"
        else:
            (tmp / "scenario.json").write_text(json.dumps(case.scenario, indent=1) + "\n")
            src = Path(case.draft)
            if src.stat().st_size <= MAX_COPIED:
                shutil.copyfile(src, tmp / "draft.gguf")
                draft_arg = "draft.gguf"
            else:
                draft_arg = str(src.resolve())
        printed = tmp / "printed"
        printed.mkdir()
        for side, text in res.outcome.printed.items():
            (printed / f"{side}.txt").write_text(text)
        if res.outcome.report:
            (printed / "report.txt").write_text(res.outcome.report + "\n")

        say("rerunning the repro from its folder, in fresh processes")
        t0 = time.monotonic()
        rerun_case = Case(json.loads((tmp / "scenario.json").read_text()),
                          draft=(tmp / draft_arg) if draft_arg == "draft.gguf" else Path(draft_arg))
        work = tmp / ".rerun"
        again = run_case(rerun_case, mode, work, timeout)
        shutil.rmtree(work, ignore_errors=True)
        reproduced = again.failure == res.failure
        if not reproduced:
            raise ReduceError(f"the repro does not reproduce from its folder: it gave {again.failure.describe()} "
                              f"where the reduction kept {res.failure.describe()}; nothing was written to {out}")
        draft_bytes = (tmp / "draft.gguf").stat().st_size if (tmp / "draft.gguf").exists() else None
        summary = {
            "mode": mode.label, "failure": res.failure.to_dict(), "described": res.failure.describe(),
            "before": res.original.sizes(), "after": case.sizes(), "draft_bytes": draft_bytes,
            "edits_kept": res.kept, "tries": res.tries, "seconds": round(res.seconds, 1),
            "complete": res.complete, "rerun": {"reproduced": True, "seconds": round(time.monotonic() - t0, 1)},
            "commands": _commands(mode, draft_arg),
        }
        (tmp / "failure.json").write_text(json.dumps(summary, indent=1) + "\n")
        (tmp / "README.md").write_text(_readme(summary, out))
    return summary


def _readme(s: dict, out: Path) -> str:
    rows = "\n".join(f"| {k} | {s['before'].get(k, '-')} | {v} |" for k, v in s["after"].items())
    size = f"{s['draft_bytes'] / 1024:.0f} KiB" if s["draft_bytes"] else "kept whole (see failure.json)"
    cmds = "\n".join(s["commands"])
    stop = "" if s["complete"] else ("\nThe reduction stopped at its limit of tries before every edit was tried: "
                                     "a smaller case may still fail the same way.\n")
    return f"""# {s['described']}

Found comparing {s['mode']}, and reduced by `graphgen reduce` in {s['tries']} tries
({s['seconds']} s). This folder was rerun from its own files before it was written, and failed
the same way.
{stop}
The draft: `draft.gguf` ({size}){', written by `graphgen make-model` from settings.json' if s['draft_bytes'] else ''}.

| size | before | after |
|---|---|---|
{rows}

## Reproduce

Run in this folder (`graphgen dump --engine llama.cpp` drives llama.cpp's libllama on the same
scenario; `--llama DIR` picks the build):

```sh
{cmds}
```

`printed/` holds what each side printed when the repro was made; `failure.json` the failure's
signature, the edits that kept it ({', '.join(s['edits_kept']) or 'none'}), and the sizes.
"""
