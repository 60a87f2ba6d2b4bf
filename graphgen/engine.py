"""Run a scenario in graphgen's own engine and write `graphgen-dump/1` files.

The same scenario drives `graphgen.reference.runner` in llama.cpp, so the two dump folders
pair up graph by graph.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from . import __version__
from .dump import provenance, write_dump
from .ops import ggml as G
from .ops.runtime import describe as runtime_source
from .record import NodeRecorder, cpu_features, n_kv_from_nodes
from .runtime.session import Session
from .scenario import Scenario


def engine_header(model_name: str, model_path=None, scenario: Scenario | None = None,
                  scenario_path=None) -> dict:
    """A dump header; with the model's path and the scenario it also says what ran (`provenance`)."""
    return {"source": {"engine": "graphgen", "version": __version__, **runtime_source()},
            "model": model_name, "cpu_features": cpu_features(G.cpu_lib()),
            **provenance(model_path, scenario, scenario_path)}


@contextlib.contextmanager
def naming_step(step):
    """A refusal raised while a scenario's step runs (a batch too large, a KV cache full) says
    which step, its index and kind, first; `e.step` holds it."""
    try:
        yield
    except Exception as e:
        if getattr(e, "step", None) is None and e.args and isinstance(e.args[0], str):
            e.args = (f"step {step.index} ({step.kind}): {e.args[0]}",) + e.args[1:]
            e.step = step
        raise


def block_states(sess, scenario: Scenario, step, context_rows: dict):
    """The per-token state rows of a block step, for a head whose blocks carry the context
    features of the row before them (LiliCorr): each block's row from its injected context
    (`embd_state` "context") or drawn from the scenario's generator ("random"). A block without
    its row leaves the whole batch without states, as llama.cpp refuses a batch where only some
    tokens carry one. None for the other heads."""
    if not sess.model.head.context_rows:
        return None
    rows = []
    for b in step.blocks:
        if b.embd_state == "random":
            rows.append(scenario.random_state(step, len(b.tokens), sess.hparams.n_embd))
        else:
            row = context_rows.get((b.seq, b.pos0 - 1))
            rows.append(None if row is None else np.tile(row, (len(b.tokens), 1)))
    return None if any(r is None for r in rows) else np.concatenate(rows)


def run_scenario(model_path, scenario: Scenario, out=None, max_data: int = 262144, progress=None,
                 backend: str = "cpu", scenario_path=None):
    """Run every step; write dumps into `out` when given. Returns [(step, Result, dump path)].
    `scenario_path`, when the scenario came from a file, is recorded in the dumps."""
    model_path = Path(model_path)
    sess = Session(model_path, n_ctx=scenario.n_ctx, n_ubatch=scenario.n_ubatch,
                   flash_attn=scenario.flash_attn, type_k=scenario.type_k, type_v=scenario.type_v, n_seq=scenario.n_seq,
                   n_threads=scenario.n_threads, backend=backend)
    hp = sess.hparams
    header = engine_header(model_path.name, model_path, scenario, scenario_path) if out is not None else None
    rec = NodeRecorder(G.op_desc, G.type_name, max_data, G.read_tensor_bytes) if out is not None else None
    context_rows: dict[tuple[int, int], np.ndarray] = {}
    results, seq_no = [], 0
    try:
        for step in scenario.steps:
            if progress:
                progress(step)
            with naming_step(step):
                if step.kind == "seq_rm":
                    sess.seq_rm(step.seq, step.pos0, step.p1)
                    continue
                if rec is not None:
                    rec.reset()
                if step.kind == "encoder":
                    r = sess.encode(scenario.features(step, hp.n_embd_inp_enc), step.pos0, step.seq, recorder=rec)
                elif step.kind == "inject":
                    x = scenario.features(step, hp.n_embd_inp_enc)
                    r = sess.inject(x, step.pos0, step.seq, recorder=rec)
                    if r.h_nextn is not None:
                        for i in range(step.n_tokens):
                            context_rows[(step.seq, step.pos0 + i)] = r.h_nextn[i]
                else:
                    state = block_states(sess, scenario, step, context_rows)
                    r = sess.block_multi([(b.seq, b.tokens, b.pos0) for b in step.blocks], recorder=rec,
                                         embd_state=state)
            path = None
            if out is not None:
                settings = dict(sess.settings(step.kind), n_kv=n_kv_from_nodes(rec.nodes))
                path = write_dump(out, seq_no, step.kind, dict(header, settings=settings),
                                  rec.nodes, rec.values)
            results.append((step, r, path))
            seq_no += 1
    finally:
        sess.close()
    return results
