"""Run a scenario in graphgen's own engine and write `graphgen-dump/1` files.

The same scenario drives `graphgen.reference.runner` in llama.cpp, so the two dump folders
pair up graph by graph.
"""

from __future__ import annotations

from pathlib import Path

from .. import __version__
from ..dump.format import provenance, write_dump
from ..ops import ggml as G
from ..ops.runtime import describe as runtime_source
from .player import SessionEngine, play
from ..dump.record import NodeRecorder, cpu_features, n_kv_from_nodes
from ..runtime.session import Session
from .scenario import Scenario


def engine_header(model_name: str, model_path=None, scenario: Scenario | None = None,
                  scenario_path=None) -> dict:
    """A dump header; with the model's path and the scenario it also says what ran (`provenance`)."""
    return {"source": {"engine": "graphgen", "version": __version__, **runtime_source()},
            "model": model_name, "cpu_features": cpu_features(G.cpu_lib()),
            **provenance(model_path, scenario, scenario_path)}


def run_scenario(model_path, scenario: Scenario, out=None, max_data: int = 262144, progress=None,
                 backend: str = "cpu", scenario_path=None):
    """Run every step; write dumps into `out` when given. Returns [(step, Result, dump path)].
    `scenario_path`, when the scenario came from a file, is recorded in the dumps."""
    model_path = Path(model_path)
    sess = Session(model_path, n_ctx=scenario.n_ctx, n_ubatch=scenario.n_ubatch,
                   flash_attn=scenario.flash_attn, type_k=scenario.type_k, type_v=scenario.type_v, n_seq=scenario.n_seq,
                   n_threads=scenario.n_threads, backend=backend, target=scenario.target_path)
    engine = SessionEngine(sess)
    header = engine_header(model_path.name, model_path, scenario, scenario_path) if out is not None else None
    rec = NodeRecorder(G.op_desc, G.type_name, max_data, G.read_tensor_bytes) if out is not None else None
    results = []

    def before(index, step):
        if rec is not None:
            rec.reset()
            engine.recorder = rec

    def after(index, step, r):
        path = None
        if out is not None:
            settings = dict(sess.settings(step.kind), n_kv=n_kv_from_nodes(rec.nodes))
            path = write_dump(out, index, step.kind, dict(header, settings=settings), rec.nodes, rec.values, inputs=rec.inputs, qrows=rec.qrows)
        results.append((step, r, path))

    try:
        play(scenario, engine, progress=progress, before=before, after=after)
    finally:
        sess.close()
    return results
