"""`graphgen bench`: graphgen and llama.cpp on the same draft and scenario, in one run.

Each repetition replays the whole scenario from an empty KV cache in every engine, the engines
taking turns (graphgen, llama.cpp, graphgen, ...), so both see the same machine state. A step's
time covers what a driver pays per batch: setting the inputs, computing, reading the outputs.
llama.cpp runs in a child process (graphgen.reference.bench_worker) fed one line per repetition.
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

from .graph import GraphParams, MemSlot
from .models.arch import build_arch_graph
from .runtime.session import Session
from .scenario import Scenario, parse_scenario


@dataclass
class StepStats:
    label: str
    times: dict = field(default_factory=dict)   # engine -> [seconds]

    def median(self, engine):
        t = self.times.get(engine)
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

    def rows(self):
        for st in self.steps:
            g, l_ = st.median("graphgen"), st.median("llama.cpp")
            yield st, g, l_, (g / l_ if g and l_ else None)

    def format_text(self) -> str:
        out = [f"bench {self.model} on {self.backend}, {self.repeat} repetitions (median±IQR; ratio of medians, and of minimums)"]
        out.append(f"  {'step':<22} {'graphgen ms':>16} {'llama.cpp ms':>16} {'ratio':>7} {'min ratio':>9} {'build ms':>9}")
        for st, g, l_, r in self.rows():
            gs = f"{g * 1e3:.3f}±{st.spread('graphgen') * 1e3:.3f}" if g else "-"
            ls = f"{l_ * 1e3:.3f}±{st.spread('llama.cpp') * 1e3:.3f}" if l_ else "-"
            b = self.build_ms.get(st.label)
            mg, ml = st.best("graphgen"), st.best("llama.cpp")
            mr = f"{mg / ml:.3f}" if mg and ml else "-"
            out.append(f"  {st.label:<22} {gs:>16} {ls:>16} {f'{r:.3f}' if r else '-':>7} {mr:>9} "
                       f"{f'{b:.2f}' if b is not None else '-':>9}")
        for e in self.engines:
            cb = self.compute_buffer_mib.get(e)
            rss = self.peak_rss_mib.get(e)
            out.append(f"  {e}: compute buffer {f'{cb:.2f} MiB' if cb is not None else '-'}, "
                       f"peak RSS {f'{rss:.0f} MiB' if rss is not None else '-'}")
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {"model": self.model, "backend": self.backend, "repeat": self.repeat,
                "steps": [{"step": st.label, "median_s": {e: st.median(e) for e in st.times},
                           "min_s": {e: st.best(e) for e in st.times},
                           "iqr_s": {e: st.spread(e) for e in st.times}, "ratio": r,
                           "build_ms": self.build_ms.get(st.label)} for st, _, _, r in self.rows()],
                "compute_buffer_mib": self.compute_buffer_mib, "peak_rss_mib": self.peak_rss_mib}


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


def _replay(sess: Session, sc: Scenario, feats: dict) -> list[float]:
    for c in sess.caches.values():
        c.clear()
    times = []
    for st in sc.steps:
        if st.kind == "seq_rm":
            sess.seq_rm(st.seq, st.pos0, st.p1)
            continue
        t0 = time.perf_counter()
        if st.kind == "inject":
            sess.inject(feats[st.index], st.pos0, st.seq)
        elif st.kind == "encoder":
            sess.encode(feats[st.index], st.pos0, st.seq)
        else:
            sess.block_multi([(b.seq, b.tokens, b.pos0) for b in st.blocks])
        times.append(time.perf_counter() - t0)
    return times


def _fresh_build_ms(sess: Session, sc: Scenario, feats: dict, reps: int = 5) -> dict:
    """Time to build each step's graph from nothing (no allocation, no compute)."""
    out = {}
    for c in sess.caches.values():
        c.clear()
    labels = iter(_labels(sc))
    for st in sc.steps:
        if st.kind == "seq_rm":
            sess.seq_rm(st.seq, st.pos0, st.p1)
            continue
        if st.kind == "inject":
            ub = sess.make_inject(feats[st.index], st.pos0, st.seq)
        elif st.kind == "encoder":
            ub = sess.make_inject(feats[st.index], st.pos0, st.seq)
        else:
            ub = sess.make_block([(b.seq, b.tokens, b.pos0) for b in st.blocks])
        mem = {}
        snaps = {k: c.snapshot() for k, c in sess.caches.items()}
        if st.kind != "encoder":
            for k, c in sess.caches.items():
                idxs = c.find_slot(ub)
                c.apply_ubatch(idxs, ub)
                mem[k] = MemSlot(c, idxs, c.get_n_kv())
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            g = build_arch_graph(GraphParams(model=sess.model, ubatch=ub, mem=mem, flash_attn=sess.flash_attn,
                                             causal_attn=sess.hparams.causal_attn,
                                             graph_type="encoder" if st.kind == "encoder" else "decoder"))
            best = min(best, time.perf_counter() - t0)
            g.free()
        for k, c in sess.caches.items():
            c.restore(snaps[k])
        # keep the cache as the step leaves it, for the steps after
        if st.kind == "inject":
            sess.inject(feats[st.index], st.pos0, st.seq)
        elif st.kind == "block":
            sess.block_multi([(b.seq, b.tokens, b.pos0) for b in st.blocks])
        out[next(labels)] = best * 1e3
    return out


def run_bench(model, scenario: Scenario, *, repeat: int = 20, backend: str = "cpu",
              engines=("graphgen", "llama.cpp"), warmup: int = 2, progress=None) -> BenchResult:
    import tempfile
    model = Path(model)
    engines = tuple(engines)
    sess = Session(model, n_ctx=scenario.n_ctx, n_ubatch=scenario.n_ubatch, flash_attn=scenario.flash_attn,
                   type_kv=scenario.type_kv, n_seq=scenario.n_seq, n_threads=scenario.n_threads, backend=backend)
    feats = {st.index: scenario.features(st, sess.hparams.n_embd_inp_enc)
             for st in scenario.steps if st.kind in ("inject", "encoder")}
    labels = _labels(scenario)
    steps = [StepStats(lbl) for lbl in labels]
    worker = None
    tmp = None
    try:
        if "llama.cpp" in engines:
            if backend != "cpu":
                raise ValueError("the llama.cpp engine runs on the CPU; bench another backend with --engines graphgen")
            tmp = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
            json.dump(scenario.to_dict(), tmp)
            tmp.close()
            worker = _LlamaWorker(model, tmp.name)
        for rep in range(warmup + repeat):
            for engine in engines:
                if engine == "graphgen":
                    times = _replay(sess, scenario, feats)
                else:
                    times = worker.ask("rep")["times"]
                if rep >= warmup:
                    for st, t in zip(steps, times):
                        st.times.setdefault(engine, []).append(t)
            if progress and rep >= warmup:
                progress(rep - warmup + 1, repeat)
        res = BenchResult(model.name, scenario.to_dict(), backend, repeat, steps, engines=engines)
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
