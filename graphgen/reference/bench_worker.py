"""llama.cpp's side of `graphgen bench`: a child process that replays a scenario on command.

The parent writes one line per repetition ("rep") and reads back one JSON line with the wall
time of every step (batch setup + llama_process + reading the outputs) and the part of it spent
in ggml's scheduler compute (see compute_timer), so both engines run interleaved in one bench run. "info" returns the compute buffer sizes llama.cpp logged and the
process's peak RSS; "quit" ends it.
"""

from __future__ import annotations

import json
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

from ..play.player import Engine, draw_features, walk
from ..play.scenario import load_scenario
from ..runtime.mmapfile import llama_model_params
from .compute_timer import ComputeTimer
from ..libload import load_llama
from .runner import GGML_TYPE_IDS, model_meta


class _Replay(Engine):
    """b11739's context as the player's engine, timed per graph: filling the batch, llama_process,
    reading the outputs. Positions and feature rows are laid out once, beforehand, as a C driver
    holds them in its own arrays, and the player takes the features drawn beforehand: the timed
    part is what every step pays. Blocks carry no context rows, as in graphgen's timed engine."""

    def __init__(self, ffi, lib, ctx, timer, sc, feats: dict, n_embd_inp: int, n_vocab: int, meta: dict):
        self.ffi, self.lib, self.ctx, self.timer = ffi, lib, ctx, timer
        self.mem = lib.llama_get_memory(ctx)
        self.n_embd_inp, self.n_vocab, self.causal = n_embd_inp, n_vocab, meta["causal"]
        self.times: list[float] = []
        self.computes: list[float] = []
        self.prepared: dict = {}
        mrope = meta["mrope"]
        for step in sc.steps:
            if step.kind == "inject":
                p = np.arange(step.pos0, step.pos0 + step.n_tokens, dtype=np.int32)
                pos = np.stack([p, p, p, np.zeros_like(p)] if mrope else [p] + [np.zeros_like(p)] * 3, axis=1)
                x = feats[step.index]
                rows = [{"data": ffi.cast("float *", x[i:].ctypes.data), "n_rows": 1, "n_embd": n_embd_inp}
                        for i in range(step.n_tokens)]
                self.prepared[step.index] = (ffi.new("llama_pos[]", pos.ravel().tolist()), rows)
            elif step.kind == "block":
                toks = [(b.seq, tok) for b in step.blocks for tok in b.tokens]
                p = np.concatenate([np.arange(b.pos0, b.pos0 + len(b.tokens), dtype=np.int32) for b in step.blocks])
                pos = np.stack([p] + [np.zeros_like(p)] * 3, axis=1)
                self.prepared[step.index] = (ffi.new("llama_pos[]", pos.ravel().tolist()), toks)

    def encoder(self, step, features) -> None:
        raise RuntimeError("the llama.cpp bench engine replays inject, block and seq_rm steps, not an encoder's")

    def seq_rm(self, step, inputs) -> None:
        self.lib.llama_memory_seq_rm(self.mem, step.seq, step.pos0, step.p1)

    def _process(self, fill) -> None:
        lib = self.lib
        c0 = self.timer.ns()
        t0 = time.perf_counter()
        batch = lib.llama_batch_ext_init(self.ctx)
        n_out = fill(batch)
        ret = lib.llama_process(self.ctx, lib.LLAMA_PROCESS_TYPE_DECODE, batch)
        lib.llama_batch_ext_free(batch)
        if ret != 0:
            raise RuntimeError(f"llama_process returned {ret}")
        if n_out:  # read the outputs, as a driver does
            ptr = lib.llama_get_logits(self.ctx)
            np.frombuffer(self.ffi.buffer(ptr, 4 * n_out * self.n_vocab), dtype=np.float32).copy()
        self.times.append(time.perf_counter() - t0)
        self.computes.append((self.timer.ns() - c0) * 1e-9)

    def inject(self, step, features) -> None:
        pos, rows = self.prepared[step.index]
        lib = self.lib

        def fill(batch):
            for i, row in enumerate(rows):
                idx = lib.llama_batch_ext_add_embd(batch, step.seq, row)
                lib.llama_batch_ext_set_pos(batch, idx, pos + 4 * i)
            lib.llama_set_causal_attn(self.ctx, True)
            return 0
        self._process(fill)

    def block(self, step, states) -> None:
        pos, toks = self.prepared[step.index]
        lib = self.lib

        def fill(batch):
            for i, (seq, tok) in enumerate(toks):
                idx = lib.llama_batch_ext_add_token(batch, seq, tok)
                lib.llama_batch_ext_set_pos(batch, idx, pos + 4 * i)
                lib.llama_batch_ext_set_output_logits(batch, idx, True)
            lib.llama_set_causal_attn(self.ctx, self.causal)
            return len(toks)
        self._process(fill)


def main(argv) -> int:
    model, scen_path = Path(argv[0]), argv[1]
    sc = load_scenario(scen_path)
    timer = ComputeTimer()  # before libllama, so that libllama binds to it
    ffi, lib, _ = load_llama()
    logs: list[str] = []

    @ffi.callback("void(enum ggml_log_level, const char *, void *)")
    def on_log(level, text, ud):
        logs.append(ffi.string(text).decode(errors="replace"))
    lib.llama_log_set(on_log, ffi.NULL)
    lib.llama_backend_init()
    mdl = lib.llama_model_load_from_file(str(model).encode(), llama_model_params(lib))
    if mdl == ffi.NULL:
        print(json.dumps({"error": f"llama.cpp could not load {model}"}), flush=True)
        return 4
    meta = model_meta(model)
    n_embd_inp = meta["n_embd"] * len(meta["target_layers"])
    cp = lib.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = sc.n_ctx, sc.n_ubatch, sc.n_ubatch
    cp.n_seq_max, cp.kv_unified = sc.n_seq, True
    cp.n_threads = cp.n_threads_batch = sc.n_threads
    cp.flash_attn_type = -1 if sc.flash_attn_auto else 1 if sc.flash_attn else 0
    cp.type_k, cp.type_v = GGML_TYPE_IDS[sc.type_k], GGML_TYPE_IDS[sc.type_v]
    ctx = lib.llama_init_from_model(mdl, cp)
    if ctx == ffi.NULL:
        print(json.dumps({"error": "llama.cpp could not create a context"}), flush=True)
        return 4
    mem = lib.llama_get_memory(ctx)
    n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(mdl))
    feats = draw_features(sc, n_embd_inp)
    engine = _Replay(ffi, lib, ctx, timer, sc, feats, n_embd_inp, n_vocab, meta)

    def replay() -> tuple[list[float], list[float]]:
        lib.llama_memory_clear(mem, True)
        engine.times, engine.computes = [], []
        for _ in walk(sc, engine, features=feats):
            pass
        return engine.times, engine.computes

    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "rep":
            times, computes = replay()
            print(json.dumps({"times": times, "compute": computes}), flush=True)
        elif cmd == "info":
            sizes = [float(m.group(1)) for ln in logs for m in [re.search(r"compute buffer size =\s*([\d.]+) MiB", ln)] if m]
            print(json.dumps({"compute_buffer_mib": sizes[-1] if sizes else None,
                              "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}), flush=True)
        elif cmd == "quit":
            break
    lib.llama_free(ctx)
    lib.llama_model_free(mdl)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
