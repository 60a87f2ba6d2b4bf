"""`graphgen bench`: graphgen and llama.cpp on the same draft and scenario, in one run.

Each repetition replays the whole scenario from an empty KV cache in every engine, the engines
taking turns (graphgen, llama.cpp, graphgen, ...), so both see the same machine state. A step's
time covers what a driver pays per batch: setting the inputs, computing, reading the outputs.
llama.cpp runs in a child process (graphgen.reference.bench_worker) fed one line per repetition.

Each step's wall time is split into compute (inside ggml's scheduler, timed the same way on both
sides: see graphgen.reference.compute_timer) and host overhead (the rest: batch checks, KV-cache
bookkeeping, inputs, outputs); graphgen's overhead is further split by phase (Session.timings).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .models.arch import build_arch_graph
from .runtime.session import Session
from .play.player import SessionEngine, draw_features, walk
from .play.scenario import Scenario, parse_scenario


PHASES = ("validate", "kv", "graph", "inputs", "outputs")  # graphgen's host overhead, by phase


@dataclass
class StepStats:
    label: str
    times: dict = field(default_factory=dict)    # engine -> [seconds], wall time of the step
    compute: dict = field(default_factory=dict)  # engine -> [seconds] inside the scheduler's compute
    phases: dict = field(default_factory=dict)   # graphgen's phase -> [seconds]
    n_tokens: int = 0                            # tokens the step's batch holds

    def tokens_per_s(self, engine):
        """Tokens through the step per second of its median wall time, as llama-bench reports."""
        m = self.median(engine)
        return self.n_tokens / m if m and self.n_tokens else None

    def median(self, engine):
        t = self.times.get(engine)
        return statistics.median(t) if t else None

    def compute_median(self, engine):
        t = self.compute.get(engine)
        return statistics.median(t) if t else None

    def overhead_median(self, engine):
        """Median over repetitions of (wall - compute): the host's share of the step."""
        t, c = self.times.get(engine), self.compute.get(engine)
        return statistics.median(a - b for a, b in zip(t, c)) if t and c else None

    def phase_median(self, phase):
        t = self.phases.get(phase)
        return statistics.median(t) if t else None

    def best(self, engine):
        t = self.times.get(engine)
        return min(t) if t else None

    def spread(self, engine):
        t = self.times.get(engine)
        if not t or len(t) < 2:
            return 0.0
        q = np.percentile(t, [25, 75])
        return float(q[1] - q[0])


@dataclass
class BenchResult:
    model: str
    scenario: dict
    backend: str
    repeat: int
    steps: list
    build_ms: dict = field(default_factory=dict)        # step label -> fresh graph build time
    compute_buffer_mib: dict = field(default_factory=dict)
    peak_rss_mib: dict = field(default_factory=dict)
    engines: tuple = ("graphgen", "llama.cpp")
    pinned: dict | None = None   # engine -> the CPU it ran on, for one-thread runs

    def rows(self):
        for st in self.steps:
            g, l_ = st.median("graphgen"), st.median("llama.cpp")
            yield st, g, l_, (g / l_ if g and l_ else None)

    def format_text(self) -> str:
        def ms(v):
            return f"{v * 1e3:.3f}" if v is not None else "-"
        out = [f"bench {self.model} on {self.backend}, {self.repeat} repetitions "
               "(median±IQR; ratio of medians, and of minimums; compute and host overhead are medians)"]
        out.append(f"  {'step':<22} {'graphgen ms':>16} {'llama.cpp ms':>16} {'ratio':>7} {'min ratio':>9} "
                   f"{'graphgen t/s':>12} {'llama.cpp t/s':>13} "
                   f"{'compute g/l ms':>15} {'overhead g/l ms':>15} {'build ms':>9}")
        for st, g, l_, r in self.rows():
            gs = f"{g * 1e3:.3f}±{st.spread('graphgen') * 1e3:.3f}" if g else "-"
            ls = f"{l_ * 1e3:.3f}±{st.spread('llama.cpp') * 1e3:.3f}" if l_ else "-"
            b = self.build_ms.get(st.label)
            mg, ml = st.best("graphgen"), st.best("llama.cpp")
            mr = f"{mg / ml:.3f}" if mg and ml else "-"
            comp = f"{ms(st.compute_median('graphgen'))}/{ms(st.compute_median('llama.cpp'))}"
            over = f"{ms(st.overhead_median('graphgen'))}/{ms(st.overhead_median('llama.cpp'))}"
            tg, tl = st.tokens_per_s("graphgen"), st.tokens_per_s("llama.cpp")
            out.append(f"  {st.label:<22} {gs:>16} {ls:>16} {f'{r:.3f}' if r else '-':>7} {mr:>9} "
                       f"{f'{tg:.1f}' if tg else '-':>12} {f'{tl:.1f}' if tl else '-':>13} "
                       f"{comp:>15} {over:>15} {f'{b:.2f}' if b is not None else '-':>9}")
        if any(st.phases for st in self.steps):
            out.append("  graphgen's host overhead by phase, us (median): "
                       + "; ".join(st.label + ": " + ", ".join(f"{ph} {st.phase_median(ph) * 1e6:.0f}"
                                                                for ph in PHASES if st.phases.get(ph))
                                   for st in self.steps))
        if self.pinned:
            out.append(f"  one core each, swapped every repetition: CPUs {self.pinned['graphgen']} and {self.pinned['llama.cpp']}")
        for e in self.engines:
            cb = self.compute_buffer_mib.get(e)
            rss = self.peak_rss_mib.get(e)
            out.append(f"  {e}: compute buffer {f'{cb:.2f} MiB' if cb is not None else '-'}, "
                       f"peak RSS {f'{rss:.0f} MiB' if rss is not None else '-'}")
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {"model": self.model, "backend": self.backend, "repeat": self.repeat,
                "steps": [{"step": st.label, "n_tokens": st.n_tokens,
                           "tokens_per_s": {e: st.tokens_per_s(e) for e in st.times},
                           "median_s": {e: st.median(e) for e in st.times},
                           "min_s": {e: st.best(e) for e in st.times},
                           "iqr_s": {e: st.spread(e) for e in st.times}, "ratio": r,
                           "compute_median_s": {e: st.compute_median(e) for e in st.compute},
                           "overhead_median_s": {e: st.overhead_median(e) for e in st.compute},
                           "graphgen_phases_median_s": {ph: st.phase_median(ph) for ph in PHASES if st.phases.get(ph)},
                           "build_ms": self.build_ms.get(st.label)} for st, _, _, r in self.rows()],
                "compute_buffer_mib": self.compute_buffer_mib, "peak_rss_mib": self.peak_rss_mib,
                "pinned_cpus": self.pinned}


def multi_seq_scenario(base: Scenario, n_seq: int) -> Scenario:
    """The scenario with every inject repeated per sequence and one block batch of all of them."""
    doc = base.to_dict()
    steps = []
    for st in doc["steps"]:
        if "inject" in st:
            steps += [{"inject": dict(st["inject"], seq=s)} for s in range(n_seq)]
        elif "block" in st:
            b = st["block"]["seqs"][0]
            steps.append({"block": {"seqs": [dict(b, seq=s) for s in range(n_seq)]}})
        else:
            steps.append(st)
    n_tok = max(sum(len(s["block"]["seqs"][0]["tokens"]) * n_seq for s in steps if "block" in s), 1)
    # every sequence keeps its prompt in the cache: make room for all of them and the block
    cells = sum(s["inject"]["n_tokens"] for s in steps if "inject" in s) + n_tok
    doc.update(steps=steps, n_seq=n_seq, n_ubatch=max(doc["n_ubatch"], n_tok), n_ctx=max(doc["n_ctx"], cells))
    return parse_scenario(doc)


def _step_tokens(sc: Scenario) -> list[int]:
    """Tokens of each timed step (the steps _labels names), in the same order."""
    return [st.n_tokens if st.kind in ("inject", "encoder") else sum(len(b.tokens) for b in st.blocks)
            for st in sc.steps if st.kind != "seq_rm"]


def _labels(sc: Scenario) -> list[str]:
    out = []
    for st in sc.steps:
        if st.kind == "inject":
            out.append(f"inject {st.n_tokens}" + (f" seq{st.seq}" if sc.n_seq > 1 else ""))
        elif st.kind == "block":
            out.append(f"block {sum(len(b.tokens) for b in st.blocks)}" + (f" x{len(st.blocks)}seq" if len(st.blocks) > 1 else ""))
        elif st.kind == "encoder":
            out.append(f"encode {st.n_tokens}")
    return out


class _LlamaWorker:
    def __init__(self, model, scen_path):
        self.proc = subprocess.Popen([sys.executable, "-m", "graphgen.reference.bench_worker", str(model), str(scen_path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def ask(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp bench worker exited (status {self.proc.poll()})")
        out = json.loads(line)
        if "error" in out:
            raise RuntimeError(out["error"])
        return out

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


class _Timed(SessionEngine):
    """graphgen's engine, each graph timed around the session's call: wall time, compute time and
    the phases of graphgen's overhead. The player takes the features drawn beforehand, so the
    draws stay out of the timings, as in b11739's worker (reference/bench_worker.py). Blocks run
    without context rows, as the worker's do: both engines do the same work."""

    carries_context = False

    def __init__(self, sess: Session):
        super().__init__(sess)
        self.times, self.computes, self.phases = [], [], []

    def _timed(self, call, *args):
        t0 = time.perf_counter()
        result = call(*args)
        self.times.append(time.perf_counter() - t0)
        self.computes.append(self.sess.timings.get("compute", 0.0))
        self.phases.append(dict(self.sess.timings))
        return result

    def encoder(self, step, features):
        return self._timed(super().encoder, step, features)

    def inject(self, step, features):
        return self._timed(super().inject, step, features)

    def block(self, step, states):
        return self._timed(super().block, step, states)


def _replay(sess: Session, sc: Scenario, feats: dict) -> tuple[list[float], list[float], list[dict]]:
    """One repetition of the scenario from an empty cache: per graph, wall time, compute time and
    the overhead's phases."""
    sess.clear()
    engine = _Timed(sess)
    for _ in walk(sc, engine, features=feats):
        pass
    return engine.times, engine.computes, engine.phases


class _BuildTimer(SessionEngine):
    """Times each step's graph built from nothing (no allocation, no compute), best of `reps`, then
    runs the step itself so that the cache is as the step leaves it for the steps after."""

    carries_context = False

    def __init__(self, sess: Session, reps: int):
        super().__init__(sess)
        self.reps, self.best = reps, []

    def _built(self, ub, kind: str) -> None:
        best = float("inf")
        with self.sess.trial_params(ub, kind) as params:
            for _ in range(self.reps):
                t0 = time.perf_counter()
                g = build_arch_graph(params)
                best = min(best, time.perf_counter() - t0)
                g.free()
        self.best.append(best)

    def encoder(self, step, features):
        self._built(self.sess.make_inject(features, step.pos0, step.seq), "encoder")

    def inject(self, step, features):
        self._built(self.sess.make_inject(features, step.pos0, step.seq), "decoder")
        return super().inject(step, features)

    def block(self, step, states):
        self._built(self.sess.make_block([(b.seq, b.tokens, b.pos0) for b in step.blocks]), "decoder")
        return super().block(step, states)


def _fresh_build_ms(sess: Session, sc: Scenario, feats: dict, reps: int = 5) -> dict:
    """Milliseconds to build each step's graph from nothing, by step label."""
    sess.clear()
    engine = _BuildTimer(sess, reps)
    for _ in walk(sc, engine, features=feats):
        pass
    return {label: best * 1e3 for label, best in zip(_labels(sc), engine.best)}


def run_bench(model, scenario: Scenario, *, repeat: int = 20, backend: str = "cpu",
              engines=("graphgen", "llama.cpp"), warmup: int = 2, progress=None) -> BenchResult:
    import tempfile
    model = Path(model)
    engines = tuple(engines)
    sess = Session(model, n_ctx=scenario.n_ctx, n_ubatch=scenario.n_ubatch, flash_attn=scenario.flash_attn,
                   type_k=scenario.type_k, type_v=scenario.type_v, n_seq=scenario.n_seq, n_threads=scenario.n_threads,
                   backend=backend)
    feats = draw_features(scenario, sess.hparams.n_embd_inp_enc)
    labels = _labels(scenario)
    steps = [StepStats(lbl, n_tokens=n) for lbl, n in zip(labels, _step_tokens(scenario))]
    worker = None
    tmp = None
    try:
        if "llama.cpp" in engines:
            if backend != "cpu":
                raise ValueError("the llama.cpp engine runs on the CPU; bench another backend with --engine graphgen")
            tmp = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
            json.dump(scenario.to_dict(copy=True), tmp)
            tmp.close()
            worker = _LlamaWorker(model, tmp.name)
        pinned = _pin(worker, scenario.n_threads)
        for rep in range(warmup + repeat):
            if pinned:
                _swap(worker, pinned, rep)
            for engine in engines:
                if engine == "graphgen":
                    times, computes, phases = _replay(sess, scenario, feats)
                else:
                    out = worker.ask("rep")
                    times, computes, phases = out["times"], out["compute"], None
                if rep >= warmup:
                    for k, (st, t, c) in enumerate(zip(steps, times, computes)):
                        st.times.setdefault(engine, []).append(t)
                        st.compute.setdefault(engine, []).append(c)
                        for ph in PHASES if phases else ():
                            st.phases.setdefault(ph, []).append(phases[k].get(ph, 0.0))
            if progress and rep >= warmup:
                progress(rep - warmup + 1, repeat)
        if "llama.cpp" in engines and not any(c for st in steps for c in st.compute.get("llama.cpp", ())):
            # the split into compute and overhead would be meaningless: say so rather than print it
            raise RuntimeError("the compute timer saw no graph compute in the llama.cpp engine "
                               "(libllama did not bind to graphgen's ggml_backend_sched_graph_compute_async)")
        res = BenchResult(model.name, scenario.to_dict(), backend, repeat, steps, engines=engines)
        res.pinned = pinned
        res.build_ms = _fresh_build_ms(sess, scenario, feats)
        res.compute_buffer_mib["graphgen"] = sess.compute_buffer_size() / 2**20
        res.peak_rss_mib["graphgen"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if worker is not None:
            info = worker.ask("info")
            res.compute_buffer_mib["llama.cpp"] = info["compute_buffer_mib"]
            res.peak_rss_mib["llama.cpp"] = info["max_rss_kib"] / 1024
        return res
    finally:
        if worker is not None:
            worker.close()
        if tmp is not None:
            os.unlink(tmp.name)
        sess.close()
        _unpin()


_AFFINITY: list = []


def _pin(worker, n_threads: int) -> dict | None:
    """One core each for a one-thread run, when the machine has two: the engines take turns, and
    a process woken on the core the other just used finds its caches holding the other's weights
    (measured: graphgen's kernels then ran 1.5-2x slower than the same kernels in llama.cpp, and
    as fast when each had a core). The cores swap every repetition (_swap), so that a core that
    is busier than the other slows both engines alike. Threaded runs keep the whole machine."""
    if worker is None or n_threads != 1 or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    _AFFINITY.append(set(cpus))
    os.sched_setaffinity(0, {cpus[0]})
    os.sched_setaffinity(worker.proc.pid, {cpus[1]})
    return {"graphgen": cpus[0], "llama.cpp": cpus[1]}


def _swap(worker, pinned: dict, rep: int) -> None:
    a, b = pinned["graphgen"], pinned["llama.cpp"]
    mine, theirs = (a, b) if rep % 2 == 0 else (b, a)
    os.sched_setaffinity(0, {mine})
    os.sched_setaffinity(worker.proc.pid, {theirs})


def _unpin() -> None:
    while _AFFINITY:
        os.sched_setaffinity(0, _AFFINITY.pop())


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def context_scenario(base: Scenario, n_kv: int, chunk: int = 512) -> Scenario:
    """The scenario's block after a prompt that fills the KV cache to n_kv cells (a multiple of
    256, the padding of n_kv), injected in batches of at most `chunk` rows as a driver would."""
    if n_kv < 256 or n_kv % 256:
        raise ValueError(f"n_kv must be a multiple of 256, got {n_kv}")
    doc = base.to_dict()
    block = next(st["block"] for st in doc["steps"] if "block" in st)
    n_block = len(block["seqs"][0]["tokens"]) if "seqs" in block else len(block["tokens"])
    n_prompt = n_kv - n_block - 1   # prompt + block end one cell short of n_kv: n_kv pads to it
    if n_prompt < 1:
        raise ValueError(f"n_kv {n_kv} leaves no room for a prompt before a block of {n_block}")
    steps = [{"inject": {"n_tokens": min(chunk, n_prompt - p0), "pos0": p0}} for p0 in range(0, n_prompt, chunk)]
    tokens = block["seqs"][0]["tokens"] if "seqs" in block else block["tokens"]
    steps.append({"block": {"tokens": tokens, "pos0": n_prompt}})
    doc.update(steps=steps, n_ctx=n_kv, n_ubatch=max(doc["n_ubatch"], min(chunk, n_prompt), n_block))
    return parse_scenario(doc)


@dataclass
class ScalePoint:
    """One block step of a scale sweep: its size and both engines' figures."""
    axis: str            # "n_kv" or "n_seq"
    value: int
    result: BenchResult

    def block(self) -> StepStats:
        return [st for st in self.result.steps if st.label.startswith("block")][-1]


def scale_markdown(points: list[ScalePoint]) -> str:
    out = []
    for axis, title in (("n_kv", "context length (cells the block attends to), n_seq 1"),
                        ("n_seq", "sequences in one block batch")):
        pts = [p for p in points if p.axis == axis]
        if not pts:
            continue
        out += [f"Block step against {title}:", "",
                f"| {axis} | graphgen ms | llama.cpp ms | ratio | graphgen overhead ms | llama.cpp overhead ms "
                "| graphgen buffer MiB | llama.cpp buffer MiB | graphgen RSS MiB | llama.cpp RSS MiB |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for p in pts:
            st, r = p.block(), p.result

            def f(v, k=1e3, fmt="{:.3f}"):
                return fmt.format(v * k) if v is not None else "-"
            g, l_ = st.median("graphgen"), st.median("llama.cpp")
            out.append(f"| {p.value} | {f(g)} | {f(l_)} | {f(g / l_ if g and l_ else None, 1)} "
                       f"| {f(st.overhead_median('graphgen'))} | {f(st.overhead_median('llama.cpp'))} "
                       f"| {f(r.compute_buffer_mib.get('graphgen'), 1, '{:.2f}')} "
                       f"| {f(r.compute_buffer_mib.get('llama.cpp'), 1, '{:.2f}')} "
                       f"| {f(r.peak_rss_mib.get('graphgen'), 1, '{:.0f}')} "
                       f"| {f(r.peak_rss_mib.get('llama.cpp'), 1, '{:.0f}')} |")
        out.append("")
    return "\n".join(out) + "\n"


def scale_svg(points: list[ScalePoint], title: str = "") -> str:
    """Two panels (block step ms against n_kv, and against n_seq), log-log, one line per engine
    for the whole step (solid) and for its host overhead (dashed)."""
    import math
    panels = [(axis, [p for p in points if p.axis == axis]) for axis in ("n_kv", "n_seq")]
    panels = [(a, pts) for a, pts in panels if pts]
    W, H, M = 420, 300, 50
    colours = {"graphgen": "#1f77b4", "llama.cpp": "#d62728"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(panels)}" height="{H + 30}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="10" y="16" font-size="13">{html_escape(title)}</text>']
    for k, (axis, pts) in enumerate(panels):
        x0 = k * W
        series = {}
        for e in ("graphgen", "llama.cpp"):
            series[(e, "step")] = [(p.value, p.block().median(e)) for p in pts]
            series[(e, "overhead")] = [(p.value, p.block().overhead_median(e)) for p in pts]
        ys = [v for s in series.values() for _, v in s if v]
        if not ys:
            continue
        xs = [p.value for p in pts]
        lx0, lx1 = math.log2(min(xs)), math.log2(max(xs)) if max(xs) > min(xs) else math.log2(min(xs)) + 1
        ly0, ly1 = math.floor(math.log10(min(ys) * 1e3)), math.ceil(math.log10(max(ys) * 1e3))
        ly1 = ly1 if ly1 > ly0 else ly0 + 1

        def px(v):
            return x0 + M + (math.log2(v) - lx0) / (lx1 - lx0) * (W - 2 * M)

        def py(v):
            return 30 + (H - M) - (math.log10(v * 1e3) - ly0) / (ly1 - ly0) * (H - M - 20)
        parts.append(f'<rect x="{x0 + M}" y="40" width="{W - 2 * M}" height="{H - M - 20}" fill="none" stroke="#999"/>')
        for d in range(ly0, ly1 + 1):
            y = py(10 ** d / 1e3)
            parts.append(f'<line x1="{x0 + M}" x2="{x0 + W - M}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                         f'<text x="{x0 + M - 6}" y="{y + 4:.1f}" text-anchor="end">{10 ** d:g} ms</text>')
        for v in xs:
            parts.append(f'<text x="{px(v):.1f}" y="{H + 2}" text-anchor="middle">{v}</text>')
        parts.append(f'<text x="{x0 + W / 2}" y="{H + 18}" text-anchor="middle">{axis} (log scale)</text>')
        for (e, kind), s in series.items():
            pts_xy = [(px(x), py(v)) for x, v in s if v]
            if len(pts_xy) < 1:
                continue
            dash = ' stroke-dasharray="5,3"' if kind == "overhead" else ""
            parts.append(f'<polyline fill="none" stroke="{colours[e]}" stroke-width="2"{dash} points="'
                         + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts_xy) + '"/>')
            parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colours[e]}"/>' for x, y in pts_xy]
        for j, e in enumerate(("graphgen", "llama.cpp")):
            ly = 52 + 14 * j
            parts.append(f'<line x1="{x0 + M + 8}" x2="{x0 + M + 28}" y1="{ly}" y2="{ly}" stroke="{colours[e]}" stroke-width="2"/>'
                         f'<text x="{x0 + M + 32}" y="{ly + 4}">{e} (dashed: host overhead)</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def html_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
