"""The repro folder: what a llama.cpp issue can carry, written whole or not at all, then rerun.

    draft.gguf        the reduced draft (or, for a draft kept whole, its path in failure.json)
    checkpoint/       instead, for an authors' checkpoint: the reduced checkpoint and its target
    settings.json     the settings that write the draft again (make_model's, or make_hf's HFSpec)
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
from .failure import Mode, run_case, target_of
from .shrink import ReduceError, Reduced

MAX_COPIED = 64 << 20  # a draft kept whole is copied into the folder up to this size


def _commands(mode: Mode, case: Case, draft: str) -> list[str]:
    return [shlex.join(c) for c in mode.commands(draft, "scenario.json", target=target_of(case, draft)).values()]


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


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
            draft_arg = case.draft_name
            if case.format == "hf":
                _name_verifier(draft / "config.json", out.resolve() / draft_arg / "target")
        else:
            (tmp / "scenario.json").write_text(json.dumps(case.scenario, indent=1) + "\n")
            src = Path(case.draft)
            if _size(src) > MAX_COPIED:
                draft_arg = str(src.resolve())
            elif src.is_dir():
                shutil.copytree(src, tmp / case.draft_name)
                draft_arg = case.draft_name
            else:
                shutil.copyfile(src, tmp / case.draft_name)
                draft_arg = case.draft_name
        printed = tmp / "printed"
        printed.mkdir()
        for side, text in res.outcome.printed.items():
            (printed / f"{side}.txt").write_text(text)
        if res.outcome.report:
            (printed / "report.txt").write_text(res.outcome.report + "\n")

        say("rerunning the repro from its folder, in fresh processes")
        t0 = time.monotonic()
        local = draft_arg == case.draft_name
        rerun_case = Case(json.loads((tmp / "scenario.json").read_text()),
                          draft=(tmp / draft_arg) if local else Path(draft_arg), format=case.format)
        work = tmp / ".rerun"
        again = run_case(rerun_case, mode, work, timeout, target=target_of(case, str(tmp / draft_arg)))
        shutil.rmtree(work, ignore_errors=True)
        reproduced = again.failure == res.failure
        if not reproduced:
            raise ReduceError(f"the repro does not reproduce from its folder: it gave {again.failure.describe()} "
                              f"where the reduction kept {res.failure.describe()}; nothing was written to {out}")
        draft_bytes = _size(tmp / draft_arg) if local else None
        summary = {
            "mode": mode.label, "failure": res.failure.to_dict(), "described": res.failure.describe(),
            "before": res.original.sizes(), "after": case.sizes(), "draft_bytes": draft_bytes,
            "edits_kept": res.kept, "tries": res.tries, "seconds": round(res.seconds, 1),
            "complete": res.complete, "rerun": {"reproduced": True, "seconds": round(time.monotonic() - t0, 1)},
            "commands": _commands(mode, case, draft_arg), "draft": draft_arg, "format": case.format,
            "settings": case.config is not None,
        }
        (tmp / "failure.json").write_text(json.dumps(summary, indent=1) + "\n")
        (tmp / "README.md").write_text(_readme(summary, out))
    return summary


def _name_verifier(config: Path, target: Path) -> None:
    from ..authors.checkpoint import name_verifier
    cfg = json.loads(config.read_text())
    name_verifier(cfg, target)
    config.write_text(json.dumps(cfg, indent=2) + "\n")


def _readme(s: dict, out: Path) -> str:
    rows = "\n".join(f"| {k} | {s['before'].get(k, '-')} | {v} |" for k, v in s["after"].items())
    cmds = "\n".join(s["commands"])
    stop = "" if s["complete"] else ("\nThe reduction stopped at its limit of tries before every edit was tried: "
                                     "a smaller case may still fail the same way.\n")
    hf = s["format"] == "hf"
    if not s["draft_bytes"]:
        draft = f"kept whole at `{s['draft']}` (too big to copy here)"
    else:
        draft = f"`{s['draft']}` ({s['draft_bytes'] / 1024:.0f} KiB" + (", its target in `checkpoint/target`)" if hf else ")")
        if s["settings"]:
            draft += (", written from settings.json by `graphgen.authors.checkpoint.make_hf(path, HFSpec(**settings))`"
                      if hf else ", written from settings.json by `graphgen.synth.make_model(path, **settings)`")
        else:
            draft += ", as it was given"
    how = ("`graphgen check` converts the checkpoint with llama.cpp's converter and runs the authors' model "
           "(float32, and float64 as the arbiter), llama.cpp and graphgen on the scenario; `--keep check` keeps "
           "the converted GGUFs and every side's dumps in `check/`" if hf else
           "`graphgen dump --engine llama.cpp` drives llama.cpp's libllama on the same scenario")
    return f"""# {s['described']}

Found comparing {s['mode']}, and reduced by `graphgen reduce` in {s['tries']} tries
({s['seconds']} s). This folder was rerun from its own files before it was written, and failed
the same way.
{stop}
The draft: {draft}.

| size | before | after |
|---|---|---|
{rows}

## Reproduce

Run in this folder ({how}; `--llama DIR` picks the llama.cpp build):

```sh
{cmds}
```

`printed/` holds what each side printed when the repro was made; `failure.json` the failure's
signature, the edits that kept it ({', '.join(s['edits_kept']) or 'none'}), and the sizes.
"""
