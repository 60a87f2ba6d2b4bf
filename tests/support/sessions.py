"""Whole drafting sessions, the same on graphgen and on llama.cpp b11739.

`random_session(variant, seed)` draws a draft (the random drafts of the live parity tests) and a
scenario of 6-60 steps that works a KV cache as drafting does: several sequences in one cache,
target features injected in chunks, blocks for one or several sequences in one batch, drafting
rounds (a block, its removal with seq_rm, the accepted rows injected where it stood), removals of
every shape (open and closed ranges, p0 = 0, p1 = 0, p1 = -1, all sequences at once), caches small
enough to fill, so that removed cells are found again, batches capped by a small n_ctx, sliding
windows that move on, quantized caches. The generator keeps track of what the cache holds only to
draw positions a driver would use; it never predicts a result.

`compare_session` runs the scenario on both engines, each in its own worker process (an abort
fails the case, not the run), and returns what a test asserts: the step each side stopped at and
the graph-diff of every graph both computed.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kv_draw import draw_kv_types

VARIANTS = ("dflash", "dflash2", "dspark", "lilicorr", "dsv4")


def session_draft(variant: str, seed: int) -> tuple[str, str, dict, int, bool]:
    """(variant, backbone, make_model options, head size, K-only cache) of a random draft."""
    if variant == "dsv4":
        from tests.reference.test_reference_dsv4 import random_dsv4_config
        kw, _ = random_dsv4_config(seed)
        return "dspark", "dsv4", kw, kw["head_dim"], True
    if variant == "dflash":
        from tests.reference.test_reference_random import random_config
        kw, _ = random_config(seed)
        rng = np.random.default_rng(3000 + seed)
        if "swa_window" not in kw and "mrope_sections" not in kw and rng.random() < 0.4:
            # sliding windows are what moves the most in a long session: drawn more often here
            pattern = [bool(x) for x in rng.integers(0, 2, kw["n_layer"])]
            pattern[int(rng.integers(0, kw["n_layer"]))] = True
            kw.update(swa_window=int(rng.integers(2, 12)), swa_pattern=pattern)
        head = kw.get("head_dim", kw["n_embd"] // kw["n_head"])
        return "dflash", "base", kw, head, False
    from tests.reference.test_reference_random_heads import random_head_config
    kw, _ = random_head_config(variant, seed)
    return variant, "base", kw, kw["n_embd"] // kw["n_head"], False


@dataclass
class _Track:
    """What the cache holds, as far as drawing the next positions needs: per sequence, the set
    of positions it holds (a removal in the middle leaves a hole) and where it goes on."""
    n_seq: int
    pos: list = field(default_factory=list)

    def __post_init__(self):
        self.pos = [set() for _ in range(self.n_seq)]

    def next(self, s: int) -> int:
        return max(self.pos[s]) + 1 if self.pos[s] else 0

    def used(self) -> int:
        return sum(len(p) for p in self.pos)

    def add(self, s: int, p0: int, n: int):
        self.pos[s].update(range(p0, p0 + n))

    def rm(self, s: int, p0: int, p1: int):
        lo = max(p0, 0)
        hi = p1 if p1 >= 0 else 1 << 40
        for q in (range(self.n_seq) if s < 0 else [s]):
            self.pos[q] = {p for p in self.pos[q] if not lo <= p < hi}


def random_session(variant: str, seed: int) -> tuple[tuple, dict]:
    """((variant, backbone, options), scenario document)."""
    var, backbone, kw, head, k_only = session_draft(variant, seed)
    rng = np.random.default_rng(90_000 + 131 * seed + VARIANTS.index(variant))
    fa = "on" if rng.random() < 0.5 else "off"
    kv = draw_kv_types(rng, fa, head, k_only=k_only)
    n_seq = int(rng.choice([1, 1, 2, 3]))
    bs = kw.get("block_size", 4)
    # a third of the sessions inject whole prompt chunks often: their cache fills, cells are freed
    # and found again (and some run into a full cache and stop there)
    filling = rng.random() < 0.4
    overflow_ok = filling and rng.random() < 0.3
    n_ubatch = 64 if filling else int(rng.choice([16, 32, 64]))
    # a small n_ctx caps the batch below n_ubatch (the cache still takes 256 cells)
    if filling or rng.random() < 0.75:
        n_ctx = int(rng.choice([256, 256, 512]))
    else:
        n_ctx = int(rng.integers(max(bs, n_seq), 64))
    n_batch = min(n_ctx, n_ubatch)
    cells = -(-n_ctx // 256) * 256
    mask = kw["n_vocab"] - 1
    short_blocks = variant in ("dflash", "dflash2", "dspark") and rng.random() < 0.3
    track = _Track(n_seq)
    steps: list[dict] = []
    n_steps = int(rng.integers(30 if filling else 6, 61))

    def block_len():
        return int(rng.integers(2, bs + 1)) if short_blocks and bs > 2 else bs

    def inject(s, n):
        steps.append({"inject": {"n_tokens": n, "pos0": track.next(s), "seq": s}})
        track.add(s, track.next(s), n)

    def chunk():
        # mostly a few rows, as a driver injects the accepted ones; sometimes a whole prompt chunk
        if rng.random() < (0.6 if filling else 0.15):
            return int(rng.integers(n_batch // 2, n_batch + 1))
        return int(rng.integers(1, min(8, n_batch) + 1))

    def make_room(n):
        # free cells the way a server frees them: a finished sequence, or an old part of one
        if overflow_ok or track.used() + n <= cells:
            return
        s = max(range(n_seq), key=lambda q: len(track.pos[q]))
        if rng.random() < 0.5:
            steps.append({"seq_rm": {"seq": s, "p0": 0, "p1": -1}})
            track.rm(s, 0, -1)
        else:
            cut = track.next(s) // 2
            steps.append({"seq_rm": {"seq": s, "p0": 0, "p1": cut}})
            track.rm(s, 0, cut)
            if track.used() + n > cells:
                steps.append({"seq_rm": {"seq": -1, "p0": 0, "p1": -1}})
                track.rm(-1, 0, -1)

    while len(steps) < n_steps:
        r = rng.random()
        live = [s for s in range(n_seq) if track.pos[s]]
        if not live or r < 0.25:
            s = int(rng.integers(0, n_seq))
            n = chunk()
            make_room(n)
            inject(s, n)
        elif r < 0.65:
            # a drafting round: one batch with a block per drafting sequence, the blocks removed,
            # the accepted rows injected where each block stood
            drafting = [s for s in live if rng.random() < 0.7] or live[:1]
            lens = {s: block_len() for s in drafting}
            while sum(lens.values()) > n_batch and len(lens) > 1:
                lens.pop(next(iter(lens)))
            if sum(lens.values()) > n_batch:
                continue
            make_room(sum(lens.values()))
            seqs = [{"seq": s, "tokens": [int(rng.integers(0, mask))] + [mask] * (n - 1), "pos0": track.next(s)}
                    for s, n in lens.items()]
            steps.append({"block": {"seqs": seqs}})
            for s, n in lens.items():
                p = track.next(s)
                steps.append({"seq_rm": {"seq": s, "p0": p, "p1": -1}})
                acc = int(rng.integers(1, lens[s] + 1))
                make_room(acc)
                inject(s, min(acc, n_batch))
        elif r < 0.75:
            # a block left in the cache: what follows goes on after it
            s = int(rng.choice(live))
            n = block_len()
            if n > n_batch:
                continue
            make_room(n)
            steps.append({"block": {"seqs": [{"seq": s, "tokens": [int(rng.integers(0, mask))] + [mask] * (n - 1),
                                              "pos0": track.next(s)}]}})
            track.add(s, track.next(s), n)
        else:
            # removals at the edges of what a sequence holds
            s = int(rng.choice(live))
            top = track.next(s)
            p0, p1 = [(0, -1), (0, 0), (top - 1, -1), (top, -1), (int(rng.integers(0, top)), -1),
                      (0, int(rng.integers(1, top + 1))), (int(rng.integers(0, top)), int(rng.integers(0, top + 2))),
                      (-1, -1), (top + 5, -1)][int(rng.integers(0, 9))]
            who = -1 if rng.random() < 0.1 else s
            steps.append({"seq_rm": {"seq": who, "p0": p0, "p1": p1}})
            track.rm(who, p0, p1)
    doc = {"n_ctx": n_ctx, "n_ubatch": n_ubatch, "flash_attn": fa, **kv, "seed": seed, "n_seq": n_seq,
           "steps": steps}
    return (var, backbone, kw), doc


# -- the two engines ----------------------------------------------------------------------------

def run_ours(model: str, doc: dict, out: str, max_data: int = 0) -> dict:
    """graphgen's side, in the worker: every graph dumped (digests, and the values of nodes up to
    max_data elements and of the outputs), and the step it stopped at when it refused one."""
    from graphgen.play.engine import run_scenario
    from graphgen.errors import GraphgenError
    from graphgen.play.scenario import parse_scenario
    seen: list[int] = []
    try:
        run_scenario(model, parse_scenario(doc), out, max_data=max_data, progress=lambda s: seen.append(s.index))
    except GraphgenError as e:
        return {"ok": False, "step": seen[-1] if seen else None, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, "step": None, "error": ""}


_STEP = re.compile(r"\bstep (\d+)\b")


@dataclass
class SessionResult:
    ours: dict
    ref: dict
    results: list          # graph-diffs of the graphs both computed
    n_graphs: int          # graphs the scenario has up to the step where both stopped

    def describe(self) -> str:
        return (f"graphgen: {'ran' if self.ours['ok'] else 'refused at step ' + str(self.ours['step'])} "
                f"{self.ours['error']}\nb11739: {'ran' if self.ref['ok'] else 'refused at step ' + str(self.ref['step'])}"
                f" {self.ref['error']}")


def compare_session(model: Path, doc: dict, work: Path, ours_worker, ref_worker) -> SessionResult:
    from graphgen.compare.pairing import diff_paths
    from graphgen.reference.protocol import error_text
    work.mkdir(parents=True, exist_ok=True)
    for d in ("ref", "ours"):
        shutil.rmtree(work / d, ignore_errors=True)
    sc = work / "scenario.json"
    sc.write_text(json.dumps(doc))
    log = work / "ref.log"
    log.unlink(missing_ok=True)
    ref, how = ref_worker.ask({"id": str(work), "model": str(model), "scenario": str(sc), "out": str(work / "ref"),
                               "max_data": 0, "log": str(log)})
    if ref is None:  # b11739 ended its process: it refuses by aborting, at the step it was in
        headline, _ = error_text(log, ref_worker.tail())
        ref = {"ok": False, "error": f"{how}: {headline}"}
    if not ref["ok"]:
        m = _STEP.search(ref["error"])
        ref["step"] = int(m.group(1)) if m else None
    else:
        ref["step"] = None
    ours = ours_worker.call("sessions:run_ours", model=str(model), doc=doc, out=str(work / "ours"))
    stop = len(doc["steps"]) if ref["ok"] else (ref["step"] or 0)
    n_graphs = sum(1 for s in doc["steps"][:stop] if "seq_rm" not in s)
    results = diff_paths(work / "ref", work / "ours") if n_graphs and (work / "ours").exists() else []
    return SessionResult(ours, ref, results, n_graphs)


# -- the long sweep ---------------------------------------------------------------------------

def main(argv=None) -> int:
    """`make sessions`: many sessions per variant through both engines, with a tally."""
    import argparse
    import sys
    import tempfile
    import time
    from collections import Counter

    from workers import Isolated, Worker
    ap = argparse.ArgumentParser(description="whole sessions against llama.cpp b11739")
    ap.add_argument("--per-variant", type=int, default=100)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from graphgen.synth import make_model
    from parity_check import assert_parity
    t0 = time.time()
    counts: Counter = Counter()
    bad = []
    with tempfile.TemporaryDirectory(prefix="graphgen-sessions-") as tmp:
        work = Path(tmp)
        ours = Isolated(work / "graphgen.err")
        ref = Worker([sys.executable, "-m", "graphgen.reference.runner", "--serve"], work / "reference.err", 600)
        try:
            for variant in VARIANTS:
                for seed in range(args.first_seed, args.first_seed + args.per_variant):
                    d = work / f"{variant}-{seed}"
                    (var, backbone, kw), doc = random_session(variant, seed)
                    model = d / "draft.gguf"
                    d.mkdir(parents=True)
                    make_model(model, var, backbone, **kw)
                    try:
                        res = compare_session(model, doc, d, ours, ref)
                        counts["sessions"] += 1
                        counts["steps"] += len(doc["steps"])
                        assert (res.ours["ok"], res.ours["step"]) == (res.ref["ok"], res.ref["step"]), res.describe()
                        assert len(res.results) == res.n_graphs, res.describe()
                        if res.n_graphs:
                            assert_parity(res.results, res.describe())
                        counts["graphs compared"] += res.n_graphs
                        counts["nodes compared"] += sum(len(r.numeric) for r in res.results)
                        counts["ran to the end" if res.ref["ok"] else "refused by both at the same step"] += 1
                        if not res.ref["ok"] and "abort" in res.ref["error"]:
                            counts["of which b11739 aborted"] += 1
                    except AssertionError as e:
                        counts["disagreements"] += 1
                        bad.append(f"{variant} session {seed}: {str(e).splitlines()[0][:300]}")
                    shutil.rmtree(d, ignore_errors=True)
                print(f"{variant}: {dict(counts)} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        finally:
            ours.close()
            ref.close()
    counts["worker restarts (graphgen)"] = ours.worker.restarts
    counts["worker restarts (b11739)"] = ref.restarts
    report = {"counts": dict(counts), "seconds": round(time.time() - t0, 1), "disagreements": bad[:20]}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for k, v in counts.items():
            print(f"{k:36s} {v}")
        print(f"{report['seconds']} s")
        for line in bad[:20]:
            print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    import sys
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "fuzz"), str(here.parent / "reference")]
    sys.exit(main())
