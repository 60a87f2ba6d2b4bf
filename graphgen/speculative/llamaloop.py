"""llama.cpp's own speculative loop, the yardstick of graphgen's.

graphgen's loop (speculate.run_speculative, verifier.TargetVerifier) is a port of
common/speculative.cpp's drivers and of llama-server's loop around them. This module runs the
original: graphgen-spec-loop, a small program over b11549's libllama and libllama-common
(tools/spec_loop/spec_loop.cpp, built by tools/build_llama.sh), which drives the same target and
draft with llama.cpp's own drivers and common_sampler and writes each round as a JSON line.
`compare` sets the two runs side by side round for round: the same position, id_last, draft,
target tokens and accepted count, or the first round where they part.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import cache
from ..errors import GraphgenError

PROGRAM = "graphgen-spec-loop"
ENV_DIR = "GRAPHGEN_LLAMA_LOOP"   # a folder holding graphgen-spec-loop and its libraries
BUILD = "b11549"
ROUND_KEYS = ("pos0", "id_last", "draft", "target", "n_accepted")


class LoopUnavailable(GraphgenError):
    """llama.cpp's loop is not built and cannot be built here."""


def _tools() -> Path:
    return Path(__file__).resolve().parents[2] / "tools"


def _source_hash() -> str | None:
    src = _tools() / "spec_loop" / "spec_loop.cpp"
    return hashlib.sha256(src.read_bytes()).hexdigest()[:12] if src.is_file() else None


def find_build() -> Path | None:
    """The folder of a finished build of the current spec_loop.cpp ($GRAPHGEN_LLAMA_LOOP first), or None."""
    env = os.environ.get(ENV_DIR)
    if env:
        d = Path(env).expanduser().resolve()
        if not (d / PROGRAM).is_file():
            raise LoopUnavailable(f"${ENV_DIR}={env}: no {PROGRAM} in that folder")
        return d
    h = _source_hash()
    root = cache.root() / "llama"
    if h is None or not root.is_dir():
        return None
    found = [d for d in root.glob(f"{BUILD}-cpu-*-loop-{h}") if (d / ".complete").is_file()]
    return max(found, key=lambda d: d.stat().st_mtime) if found else None


def ensure_build(note=None) -> Path:
    """The build folder, building it first (tools/build_llama.sh, minutes) when there is none."""
    d = find_build()
    if d is not None:
        return d
    script = _tools() / "build_llama.sh"
    if not script.is_file():
        raise LoopUnavailable(f"llama.cpp's loop is not built and {script} is missing (it ships with a clone of "
                              f"graphgen); build it there with `bash tools/build_llama.sh` and set ${ENV_DIR} to "
                              "the folder it prints")
    if note is not None:
        note(f"building llama.cpp {BUILD} and {PROGRAM} once (bash tools/build_llama.sh; minutes, cached)")
    # the sdist is fetched with pip: this interpreter's, which has it (a system python3 may not)
    r = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True,
                       env=dict(os.environ, PYTHON=os.environ.get("PYTHON", sys.executable)))
    if r.returncode != 0:
        raise LoopUnavailable(f"tools/build_llama.sh failed (exit {r.returncode}); its errors are above")
    d = Path(r.stdout.strip().splitlines()[-1])
    if not (d / PROGRAM).is_file():
        raise LoopUnavailable(f"tools/build_llama.sh printed {d}, which holds no {PROGRAM}")
    return d


def share_build(build: Path, what: str) -> None:
    """Run graphgen's targets on the build's libllama too (and, unless --ggml says otherwise, its
    ggml), so both loops compute on the same kernels; refused when --llama chose another build."""
    from ..libload import ENV_LLAMA_DIR, custom_llama_dir
    chosen = custom_llama_dir()
    if chosen is None:
        os.environ[ENV_LLAMA_DIR] = str(build)
    elif chosen != Path(build).resolve():
        raise GraphgenError(f"{what} compares on llama.cpp {BUILD}'s libllama ({build}); --llama {chosen} would run "
                            "graphgen's target on another: drop --llama")


@dataclass
class LoopSettings:
    """One run's settings, in llama.cpp's terms; graphgen's side resolves its flags to these."""
    n_predict: int
    n_seq: int = 1
    n_ctx: int = 4096
    n_batch: int = 256
    n_ubatch_draft: int = 64
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    type_k_draft: str = "f16"
    type_v_draft: str = "f16"
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    temp: float = 0.0
    seed: int = 0
    threads: int = 1
    spec_type: str | None = None
    edges: str = "server"

    def argv(self) -> list[str]:
        a = ["-n", str(self.n_predict), "-np", str(self.n_seq), "-c", str(self.n_ctx),
             # graphgen's target decodes a batch as one micro-batch, in one KV stream
             "-b", str(self.n_batch), "-ub", str(self.n_batch), "--gg-kv-unified",
             "--gg-ubatch-draft", str(self.n_ubatch_draft), "-fa", "on" if self.flash_attn else "off",
             "-ctk", self.type_k, "-ctv", self.type_v, "-ctkd", self.type_k_draft, "-ctvd", self.type_v_draft,
             "--spec-draft-n-max", str(self.n_max), "--spec-draft-n-min", str(self.n_min),
             "--spec-draft-p-min", repr(float(self.p_min)), "--temp", repr(float(self.temp)),
             "--seed", str(self.seed), "-t", str(self.threads), "-tb", str(self.threads),
             "--gg-edges", self.edges]
        if self.spec_type:
            a += ["--spec-type", self.spec_type]
        return a


@dataclass
class LoopRun:
    rounds: list                 # dicts: round, seq, pos0, id_last, draft, target, n_accepted, ...
    tokens: dict                 # seq -> prompt + generated tokens
    generated: dict              # seq -> generated tokens
    stops: dict                  # seq -> "n_predict" / "eog"
    timing: dict = field(default_factory=dict)
    texts: dict = field(default_factory=dict)


def run(build: Path, target: Path, draft: Path, prompts: list[list[int]], settings: LoopSettings) -> LoopRun:
    """Run llama.cpp's loop. With at most n_seq prompts, sequence s starts from prompts[s % len(prompts)];
    with more, they run n_seq at a time from empty caches, as accept runs them. Results are keyed by
    prompt index (chunk * n_seq + seq; the sequence itself with one chunk), each round carrying its
    "prompt" too."""
    exe = Path(build) / PROGRAM
    with tempfile.TemporaryDirectory(prefix="graphgen-loop-") as tmp:
        tok = Path(tmp) / "prompts.txt"
        tok.write_text("".join(" ".join(str(int(t)) for t in p) + "\n" for p in prompts))
        cmd = [str(exe), "-m", str(target), "-md", str(draft), "--gg-tokens", str(tok)] + settings.argv()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if " E " in ln or "error" in ln.lower()] or r.stderr.splitlines()
        raise GraphgenError(f"llama.cpp's loop ({exe.name}, {BUILD}) failed with exit {r.returncode}: "
                            + " | ".join(lines[-3:]))
    out = LoopRun(rounds=[], tokens={}, generated={}, stops={})
    for line in r.stdout.splitlines():
        if not line.startswith("{"):
            continue
        ev = json.loads(line)
        kind = ev.pop("event")
        if "chunk" in ev:
            ev["prompt"] = ev["chunk"] * settings.n_seq + ev["seq"]
        if kind == "round":
            out.rounds.append(ev)
        elif kind == "end":
            out.tokens[ev["prompt"]] = ev["tokens"]
            out.generated[ev["prompt"]] = ev["generated"]
            out.stops[ev["prompt"]] = ev["stop"]
            out.texts[ev["prompt"]] = ev["text"]
        elif kind == "timing":
            out.timing = ev
    if not out.tokens:
        raise GraphgenError(f"llama.cpp's loop ({exe.name}) ended without its results (exit 0, no end lines)")
    return out


@dataclass
class Parting:
    seq: int
    index: int                   # the sequence's round, counted from 0
    ours: dict | None
    theirs: dict | None

    def describe(self) -> str:
        def side(r):
            if r is None:
                return "no such round"
            return (f"pos0 {r['pos0']}, id_last {r['id_last']}, draft {r['draft']}, target {r['target']}, "
                    f"accepted {r['n_accepted']}")
        return (f"sequence {self.seq}, round {self.index}: graphgen {side(self.ours)}; "
                f"llama.cpp {side(self.theirs)}")


@dataclass
class Comparison:
    compared: int                # rounds present on both sides
    identical: int
    first: Parting | None        # the earliest round (over all sequences) that differs
    tokens_identical: bool

    @property
    def ok(self) -> bool:
        return self.first is None and self.tokens_identical


def compare(ours_rounds, theirs: LoopRun, ours_tokens: dict) -> Comparison:
    """Round for round, per sequence in order; a round missing on one side is a parting too.
    Refuses to report on nothing: no round on either side is an error, not a match."""
    by_seq: dict = {}
    for side, rounds in (("ours", ours_rounds), ("theirs", theirs.rounds)):
        for r in rounds:
            by_seq.setdefault(int(r["seq"]), {"ours": [], "theirs": []})[side].append(r)
    compared = identical = 0
    first = None
    for seq in sorted(by_seq):
        a, b = by_seq[seq]["ours"], by_seq[seq]["theirs"]
        for i in range(max(len(a), len(b))):
            ra = a[i] if i < len(a) else None
            rb = b[i] if i < len(b) else None
            same = ra is not None and rb is not None and all(
                [int(x) for x in ra[k]] == [int(x) for x in rb[k]] if isinstance(ra[k], list) else int(ra[k]) == int(rb[k])
                for k in ROUND_KEYS)
            if ra is not None and rb is not None:
                compared += 1
                identical += same
            if not same and (first is None or (ra or rb)["round"] < (first.ours or first.theirs)["round"]):
                first = Parting(seq, i, ra, rb)
    if compared == 0:
        raise GraphgenError("nothing to compare: neither loop ran a round (every sequence ended at its first token)")
    tokens_identical = all([int(t) for t in ours_tokens.get(s, [])] == [int(t) for t in theirs.tokens.get(s, [])]
                           for s in set(ours_tokens) | set(theirs.tokens))
    return Comparison(compared, identical, first, tokens_identical)
