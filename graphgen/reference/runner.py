"""Run a scenario in the reference llama.cpp and dump every graph it evaluates.

This module runs in a child process (`python -m graphgen.reference.runner`): a GGML_ASSERT
in llama.cpp aborts the whole process, and the parent then reports "no reference" instead of
dying with it. The parent side is `run_reference()`.

Long because the child process and its parent share the log capture, the error text and the context
class across the three ways a child serves (one case, --serve, and the session child, child.py).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..play.player import Engine, play
from .logcapture import ENV_ERROR_LOG, _LogCapture  # noqa: F401  (the runner's names)
from .protocol import error_text, write_reply, write_start
from ..dump.record import NodeRecorder, cpu_features, n_kv_from_nodes
from ..cachetypes import KV_TYPE_IDS
from ..play.scenario import Scenario, load_scenario
from ..runtime.mmapfile import llama_model_params
from ..libload import (REFERENCE_BUILD, REFERENCE_VERSION, ReferenceUnavailable, custom_llama_dir, lib_file, load_llama,
                      reference_label)

GGML_TYPE_IDS = KV_TYPE_IDS
LLAMA_TOKEN_NULL = -1
# the child appends llama.cpp's warnings and errors here (one JSON object a line), so that the
# parent has them even when the child dies in an assertion


class ReferenceFailed(RuntimeError):
    """llama.cpp could not run the scenario (load failure, abort, decode error).

    The first line of the message summarises the failure; the lines after it hold llama.cpp's
    whole error (every error it logged, a failed assertion's own line, the runner's step).
    `reason` holds that error text alone and `stderr` the child's whole standard error."""

    def __init__(self, message: str, reason: str = "", stderr: str = "", returncode: int | None = None):
        super().__init__(message)
        self.reason = reason
        self.stderr = stderr
        self.returncode = returncode


def model_meta(path: Path) -> dict:
    from ..ggufile import field_value, open_reader

    r = open_reader(path)

    def get(key, default=None):
        v = field_value(r, key)
        return default if v is None else v

    return {
        "n_embd": int(get("dflash.embedding_length")),
        "target_layers": get("dflash.target_layers", []),
        "causal": bool(get("dflash.attention.causal", False)),
        "mrope": get("dflash.rope.dimension_sections") is not None,
        "lilicorr": get("dflash.lilicorr.hidden_size", get("lilicorr.hidden_size")) is not None,
    }


class ReferenceContext:
    """A b11739 model and context with the scenario's settings, fed one batch at a time as the
    scenario's steps (and the drivers) feed it; `recorder`, when given, sees every node the
    context computes. The model and context are freed by close(), on every way out."""

    def __init__(self, model: Path, scenario: Scenario, recorder=None, ctx_other=None):
        ffi, lib, libdir = load_llama()
        self.ffi, self.lib, self.libdir = ffi, lib, libdir
        self.log = _LogCapture(ffi, lib)
        # libllama is loaded, so its ggml is too: by file in the build folder, else by soname
        self.cpu_lib = ctypes.CDLL(str(lib_file(libdir, "ggml-cpu") or "libggml-cpu.so.0"))
        base_lib = self.base_lib = ctypes.CDLL(str(lib_file(libdir, "ggml-base") or "libggml-base.so.0"))
        base_lib.ggml_version.restype = ctypes.c_char_p
        base_lib.ggml_op_desc.restype = ctypes.c_char_p
        base_lib.ggml_op_desc.argtypes = [ctypes.c_void_p]
        base_lib.ggml_type_name.restype = ctypes.c_char_p
        base_lib.ggml_type_name.argtypes = [ctypes.c_int]
        llama_dl = ctypes.CDLL(str(lib_file(libdir, "llama")))
        set_nextn = llama_dl._Z26llama_set_embeddings_nextnP13llama_contextbb
        set_nextn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
        self._nextn_ith = llama_dl._Z30llama_get_embeddings_nextn_ithP13llama_contexti
        self._nextn_ith.restype = ctypes.POINTER(ctypes.c_float)
        self._nextn_ith.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.scenario = scenario
        self.cb_eval = ffi.NULL
        if recorder is not None:
            @ffi.callback("bool(struct ggml_tensor *, bool, void *)")
            def cb_eval(t, ask, ud):
                if not ask:
                    recorder.record(int(ffi.cast("uintptr_t", t)))
                return True
            self.cb_eval = cb_eval

        lib.llama_backend_init()
        mparams = llama_model_params(lib)
        self.log.mark()
        self.mdl = lib.llama_model_load_from_file(str(model).encode(), mparams)
        if self.mdl == ffi.NULL:
            raise ReferenceFailed(self.log.explain(f"{reference_label()} could not load {model}"))
        self.ctx = ffi.NULL
        try:
            # read after llama.cpp accepted the file: a file it refuses is its to refuse
            self.meta = meta = model_meta(model)
            self.n_embd_inp = meta["n_embd"] * len(meta["target_layers"])
            self.log.enter("context")
            cparams = lib.llama_context_default_params()
            cparams.n_ctx = scenario.n_ctx
            cparams.n_batch = scenario.n_batch or scenario.n_ubatch
            cparams.n_ubatch = scenario.n_ubatch
            cparams.n_seq_max = scenario.n_seq
            cparams.kv_unified = True  # one stream: graphgen keeps a unified cache
            cparams.n_threads = scenario.n_threads
            cparams.n_threads_batch = scenario.n_threads
            # LLAMA_FLASH_ATTN_TYPE_AUTO (-1): b11739 decides, and the diff shows what it chose
            cparams.flash_attn_type = -1 if scenario.flash_attn_auto else 1 if scenario.flash_attn else 0
            cparams.type_k = GGML_TYPE_IDS[scenario.type_k]
            cparams.type_v = GGML_TYPE_IDS[scenario.type_v]
            cparams.cb_eval = self.cb_eval
            cparams.cb_eval_user_data = ffi.NULL
            if ctx_other is not None:
                # a draft without token embeddings or lm head borrows the target's (dflash.cpp)
                cparams.ctx_other = ctx_other
            self.log.mark()
            self.ctx = lib.llama_init_from_model(self.mdl, cparams)
            if self.ctx == ffi.NULL:
                raise ReferenceFailed(self.log.explain(f"{reference_label()} could not create a context for {model}"))
            # h_nextn is what the drivers read (LiliCorr's context features, DFlash2/DSpark lattices)
            set_nextn(int(ffi.cast("uintptr_t", self.ctx)), True, False)
            self.mem = lib.llama_get_memory(self.ctx)
            self.n_batch = int(lib.llama_n_batch(self.ctx))
            self.n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.mdl)))
        except BaseException:
            self.close()
            raise

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        return bool(self.lib.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_pos_max(self, seq: int) -> int:
        return int(self.lib.llama_memory_seq_pos_max(self.mem, seq))

    def process(self, step, features=None, states=None) -> int:
        """Run one step (an inject or encoder chunk of `features`, or a block whose sequences
        take `states`, one array per block or None); llama_process's return value."""
        ffi, lib = self.ffi, self.lib
        keep = []  # host buffers must outlive llama_process
        batch = lib.llama_batch_ext_init(self.ctx)
        try:
            if step.kind in ("inject", "encoder"):
                x = np.ascontiguousarray(features, dtype=np.float32)
                keep.append(x)
                for i in range(step.n_tokens):
                    row = ffi.cast("float *", x[i:].ctypes.data)
                    idx = _added(lib.llama_batch_ext_add_embd(batch, step.seq, {"data": row, "n_rows": 1,
                                                                                "n_embd": self.n_embd_inp}), step, i)
                    p = step.pos0 + i
                    pos = ffi.new("llama_pos[4]", [p, p, p, 0] if self.meta["mrope"] else [p, 0, 0, 0])
                    lib.llama_batch_ext_set_pos(batch, idx, pos)
                    lib.llama_batch_ext_set_output_embd(batch, idx, True)
                lib.llama_set_causal_attn(self.ctx, True)
            else:
                states = states or [None] * len(step.blocks)
                for b, state in zip(step.blocks, states):
                    if state is not None:
                        state = np.ascontiguousarray(state, dtype=np.float32)
                        keep.append(state)
                    for i, tok in enumerate(b.tokens):
                        idx = _added(lib.llama_batch_ext_add_token(batch, b.seq, tok), step, i)
                        pos = ffi.new("llama_pos[4]", [b.pos0 + i, 0, 0, 0])
                        lib.llama_batch_ext_set_pos(batch, idx, pos)
                        lib.llama_batch_ext_set_output_logits(batch, idx, True)
                        if state is not None:
                            lib.llama_batch_ext_set_embd_state(
                                batch, idx, {"data": ffi.cast("float *", state[i:].ctypes.data),
                                             "n_rows": 1, "n_embd": self.meta["n_embd"]})
                lib.llama_set_causal_attn(self.ctx, self.meta["causal"])
            ptype = lib.LLAMA_PROCESS_TYPE_ENCODE if step.kind == "encoder" else lib.LLAMA_PROCESS_TYPE_DECODE
            return lib.llama_process(self.ctx, ptype, batch)
        finally:
            lib.llama_batch_ext_free(batch)

    def nextn_row(self, i: int):
        """Row i of h_nextn (n_embd floats, a copy), or None when the context has none."""
        p = self._nextn_ith(int(self.ffi.cast("uintptr_t", self.ctx)), i)
        return np.ctypeslib.as_array(p, shape=(self.meta["n_embd"],)).copy() if p else None

    def logits_row(self, i: int) -> np.ndarray:
        p = self.lib.llama_get_logits_ith(self.ctx, i)
        if p == self.ffi.NULL:
            raise ReferenceFailed(f"llama.cpp has no logits for batch row {i}")
        return np.frombuffer(self.ffi.buffer(p, 4 * self.n_vocab), dtype=np.float32).copy()

    def close(self) -> None:
        if getattr(self, "ctx", self.ffi.NULL) != self.ffi.NULL:
            self.lib.llama_free(self.ctx)
            self.ctx = self.ffi.NULL
        if getattr(self, "mdl", self.ffi.NULL) != self.ffi.NULL:
            self.lib.llama_model_free(self.mdl)
            self.mdl = self.ffi.NULL


def compute_device(libdir: Path) -> str:
    """The device llama.cpp computes on with the runner's default model parameters, which offload
    every layer to the build's GPUs when it registered any: "CPU" for the b11739 wheel (CPU and
    RPC only, no RPC server given), the GPUs' names (`CUDA0`) otherwise."""
    g = ctypes.CDLL(str(lib_file(libdir, "ggml") or "libggml.so.0"))
    g.ggml_backend_dev_count.restype = ctypes.c_size_t
    g.ggml_backend_dev_get.restype = ctypes.c_void_p
    g.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    g.ggml_backend_dev_name.restype = ctypes.c_char_p
    g.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    g.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    devs = [g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count())]
    for kind in (1, 2):  # ggml_backend_dev_type: discrete GPUs first, then integrated ones
        names = [g.ggml_backend_dev_name(d).decode() for d in devs if g.ggml_backend_dev_type(d) == kind]
        if names:
            return ",".join(names)
    return "CPU"


class _Played(Engine):
    """b11739's context as the scenario player drives it (graphgen/play/player.py): the player names
    the step in every refusal."""

    def __init__(self, rc: ReferenceContext):
        self.rc = rc
        self.n_embd_inp, self.n_embd = rc.n_embd_inp, rc.meta["n_embd"]
        # LiliCorr's blocks carry the context features of the row before them
        self.carries_context = bool(rc.meta["lilicorr"])

    def seq_rm(self, step, inputs) -> None:
        self.rc.seq_rm(step.seq, step.pos0, step.p1)

    def _process(self, step, features=None, states=None) -> None:
        ret = self.rc.process(step, features, states)
        if ret != 0:
            raise ReferenceFailed(f"llama_process returned {ret}")

    def encoder(self, step, features):
        self._process(step, features)

    def inject(self, step, features):
        self._process(step, features)

    def block(self, step, states):
        self._process(step, None, states)

    def context_rows(self, step, result):
        # the injected chunk's context features are h_nextn of each row
        return [self.rc.nextn_row(i) for i in range(step.n_tokens)]


def run_child(model: Path, scenario: Scenario, out: Path, max_data: int, scenario_path=None) -> list[Path]:
    from ..dump.format import provenance, write_dump

    rec = NodeRecorder(None, None, max_data)
    lender = None
    if scenario.target is None:
        # b11739 would refuse the context in words about its own internals
        from ..ggufile import open_reader
        names = {t.name for t in open_reader(model).tensors}
        lacks = [n for n in ("token_embd.weight", "output.weight") if n not in names]
        if lacks:
            raise ReferenceFailed(f"{model.name}: the draft has no '{lacks[0]}': it borrows the target model's "
                                  "(ctx_other); give the target (-m TARGET -md DRAFT, or \"target\" in the scenario)")
    if scenario.target is not None:
        # a context of the target only lends the draft its embeddings and lm head (ctx_other)
        from .target import TargetContext, TargetFailed
        try:
            lender = TargetContext(Path(scenario.target_path), [], n_ctx=256, n_batch=64, n_seq=1,
                                   n_threads=scenario.n_threads)
        except TargetFailed as e:
            raise ReferenceFailed(str(e)) from None  # said as the runner's one line, not a traceback
    try:
        rc = ReferenceContext(model, scenario, recorder=rec, ctx_other=None if lender is None else lender.ctx)
    except BaseException:
        if lender is not None:
            lender.close()
        raise
    base_lib = rc.base_lib
    rec.op_desc = lambda p: base_lib.ggml_op_desc(p).decode()
    rec.type_name = lambda t: base_lib.ggml_type_name(t).decode()
    # freed on every way out: a worker that serves many cases must not keep a refused one's
    try:
        meta = rc.meta
        custom = custom_llama_dir()
        source = {"engine": "llama.cpp", "ggml": base_lib.ggml_version().decode(), "llama_dir": str(rc.libdir),
                  "backend": compute_device(rc.libdir)}
        if custom is None:
            source.update(version=REFERENCE_BUILD, package=f"llama-cpp-py-sync=={REFERENCE_VERSION}")
        else:
            source.update(version="custom")
        header = {
            "source": source,
            "model": model.name,
            "cpu_features": cpu_features(rc.cpu_lib),
            **provenance(model, scenario, scenario_path),
        }
        written = []
        engine = _Played(rc)

        def after(index, step, result):
            settings = {"flash_attn": scenario.flash_attn, "type_k": scenario.type_k,
                        "type_v": scenario.type_v, "n_ctx": scenario.n_ctx, "n_ubatch": scenario.n_ubatch,
                        "n_kv": n_kv_from_nodes(rec.nodes), "causal": meta["causal"] if step.kind == "block" else True}
            written.append(write_dump(out, index, step.kind, dict(header, settings=settings), rec.nodes, rec.values, inputs=rec.inputs, qrows=rec.qrows))

        play(scenario, engine, progress=lambda step: rc.log.enter(f"step {step.index}"),
             before=lambda index, step: rec.reset(), after=after)
    finally:
        rc.close()
        if lender is not None:
            lender.close()
    return written


def _added(idx: int, step, i: int) -> int:
    # a batch holds the context's n_batch tokens; a row it refuses would leave a shorter batch
    # that still runs and looks complete
    if idx < 0:
        raise ReferenceFailed(f"llama_batch_ext refused row {i} (error {idx}: the batch is full at its "
                              "n_batch rows)")
    return idx


# the file in the dump folder that keeps the reference's standard error: llama.cpp's log and what
# GGML_SCHED_DEBUG prints (`graphgen import` reads the latter)
STDERR_LOG = "llama.cpp.log"


def run_reference(model, scenario_path, out, max_data: int = 262144, timeout: float = 600,
                  stderr_log: str | None = STDERR_LOG, announce_dir=None, recorded_as="") -> list[Path]:
    """Run the reference in a child process; raise ReferenceFailed/ReferenceUnavailable on failure.

    The dumps record `scenario_path` as their scenario's file, or `recorded_as` when it is not
    "": None where the file is only this run's copy (a scenario built from flags), which would
    name a file that is gone.

    ReferenceFailed's first line summarises llama.cpp's error, the lines after it (and its
    `reason`) hold the whole of it. The child's standard error is written, as it comes, to
    `out/stderr_log` (None: kept only in ReferenceFailed.stderr), and one line on stderr says so
    (naming `announce_dir` instead of `out` when the caller moves the files there afterwards)."""
    from .. import progress

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("[0-9][0-9]-*.json"):
        old.unlink()
        old.with_suffix(".npz").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "graphgen.reference.runner", str(model), str(scenario_path), str(out),
           "--max-data", str(max_data)]
    if recorded_as != "":
        cmd += ["--recorded-as", "" if recorded_as is None else str(recorded_as)]
    fd, log_name = tempfile.mkstemp(prefix="graphgen-ref-", suffix=".log")
    os.close(fd)
    log_path = Path(log_name)
    try:
        n_steps = len(load_scenario(scenario_path).steps)
    except Exception:  # noqa: BLE001 -- the child reports a bad scenario in its own words
        n_steps = None
    keep = open(out / stderr_log, "wb") if stderr_log else None
    try:
        with progress.task(f"llama.cpp on {Path(model).name}") as task:
            task.update("loading the model")
            rc, stdout, stderr = _run_child(cmd, dict(os.environ, PYTHONUNBUFFERED="1", **{ENV_ERROR_LOG: log_name}),
                                            keep, timeout, lambda: task.update(_phase(log_path, n_steps)))
            # the last phase the child reached, even when it ran between two polls
            task.update(_phase(log_path, n_steps))
        if keep is not None:
            keep.close()
        if rc is None:
            _, text = error_text(log_path, stderr)
            raise ReferenceFailed(f"{reference_label()} did not finish within {timeout:.0f} s"
                                  + (f"\n{text}" if text else ""), text, stderr)
        if rc == 3:
            # the child's own one-line error, without its prefix (the caller adds one)
            raise ReferenceUnavailable(stderr.strip().splitlines()[-1].removeprefix("graphgen: error: "))
        if rc != 0:
            how = f"signal {-rc}" if rc < 0 else f"exit {rc}"
            headline, text = error_text(log_path, stderr)
            headline = headline.removeprefix("graphgen: error: ")  # the child's own refusal, said once
            label = reference_label()
            # a refusal of the child's that names llama.cpp already ("... could not load X: reason") stands alone
            first = headline if headline.startswith(f"{label} ") else f"{label} failed ({how}): {headline}"
            raise ReferenceFailed(f"{first}\n{text}", text, stderr, rc)
        if keep is not None:
            progress.note(f"llama.cpp's stderr is in {Path(announce_dir or out) / stderr_log}")
    finally:
        if keep is not None:
            keep.close()
        log_path.unlink(missing_ok=True)
    return [Path(p) for p in json.loads(stdout.strip().splitlines()[-1])]


def _run_child(cmd, env, keep, timeout: float, poll) -> tuple[int | None, str, str]:
    """Run the child, copying its stderr into `keep` as it comes and calling `poll` while it runs;
    (return code or None on timeout, stdout, stderr)."""
    import threading
    import time

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    got = {"out": [], "err": []}

    def pump(src, chunks, copy):
        for data in iter(lambda: src.read1(1 << 16), b""):
            chunks.append(data)
            if copy is not None:
                copy.write(data)
                copy.flush()

    pumps = [threading.Thread(target=pump, args=(proc.stdout, got["out"], None), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, got["err"], keep), daemon=True)]
    for t in pumps:
        t.start()
    deadline = time.monotonic() + timeout
    rc = None
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    break
                poll()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        for t in pumps:
            t.join()
        proc.stdout.close()
        proc.stderr.close()
    return rc, b"".join(got["out"]).decode(errors="replace"), b"".join(got["err"]).decode(errors="replace")


def _phase(log_path: Path, n_steps: int | None) -> str:
    """What the child is doing, from the last phase it logged."""
    phase = "load"
    try:
        for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            if '"phase"' in line:
                try:
                    phase = json.loads(line).get("phase", phase)
                except json.JSONDecodeError:
                    continue
    except OSError:
        pass
    if phase == "load":
        return "loading the model"
    if phase == "context":
        return "creating the context"
    step = phase[5:] if phase.startswith("step ") else ""
    if step.isdigit():
        return f"computing step {int(step) + 1}" + (f" of {n_steps}" if n_steps else "")
    return f"computing {phase}"


def serve(stdin=None, stdout=None) -> int:
    """Many cases in one process, for sweeps of thousands (the fuzz's long mode): one JSON request
    a line on stdin, {"id", "model", "scenario" (a file), "out", "max_data", "log"}; `S <id>` on
    stdout before each case and `R <json>` ({"id", "ok", "error"}) after it. An abort inside
    llama.cpp ends the process mid-case: the parent counts that case from its log and starts
    another worker for the rest."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    for line in stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        os.environ[ENV_ERROR_LOG] = req["log"]  # each case's phases and errors apart
        write_start(stdout, req["id"])
        try:
            run_child(Path(req["model"]), load_scenario(req["scenario"]), Path(req["out"]),
                      int(req.get("max_data", 0)), req["scenario"])
            res = {"id": req["id"], "ok": True, "error": ""}
        except (ReferenceFailed, ReferenceUnavailable, ValueError) as e:
            headline, _ = error_text(Path(req["log"]), f"graphgen: error: {e}")
            res = {"id": req["id"], "ok": False, "error": headline}
        write_reply(stdout, res)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve()
    ap = argparse.ArgumentParser(prog="python -m graphgen.reference.runner", allow_abbrev=False)
    ap.add_argument("model")
    ap.add_argument("scenario")
    ap.add_argument("out")
    ap.add_argument("--max-data", type=int, default=262144)
    ap.add_argument("--recorded-as", default=None, help="the scenario file the dumps name (\"\": none)")
    a = ap.parse_args(argv)
    recorded = a.scenario if a.recorded_as is None else a.recorded_as or None
    try:
        paths = run_child(Path(a.model), load_scenario(a.scenario), Path(a.out), a.max_data, recorded)
    except ReferenceUnavailable as e:
        print(f"graphgen: error: {e}", file=sys.stderr)
        return 3
    except ReferenceFailed as e:
        print(f"graphgen: error: {e}", file=sys.stderr)
        return 4
    print(json.dumps([str(p) for p in paths]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
