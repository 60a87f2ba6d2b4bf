"""The two engines computing a case: graphgen in a Session of its own, llama.cpp b11739 in a
child process serving scenarios. Each yields the case's block graphs one at a time (a realistic
draft's graphs of 16 sequences would not all fit in memory), every node with its name, shape and
digest, and its values in float32 for the comparison to cut a sequence's rows from.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..play.scenario import Scenario

# values of every node are kept: the comparison slices them
MAX_DATA = 1 << 26


@dataclass
class Graph:
    """One computed block graph: its nodes (dump.Node) and their values (float32, numpy order)."""
    nodes: list
    values: dict


@functools.lru_cache(maxsize=None)  # built on first use: it subclasses the ggml-bound recorder
def _recorder_class():
    from ..dump.format import Node
    from ..dump.record import NodeRecorder, TensorStruct, as_float32, read_array, read_quantized_rows, src_names

    class Recorder(NodeRecorder):
        """Names, shapes, values and digests only: the statistics a dump keeps are not needed here,
        and cost more than the graph's compute."""

        def record(self, addr: int, backend=None):
            t = TensorStruct.from_address(addr)
            node = Node(index=len(self.nodes), name=t.name.decode(errors="replace"), op=self.op_desc(addr),
                        type=self.type_name(t.type), ne=[int(x) for x in t.ne], src=src_names(t))
            self.nodes.append(node)
            self.addrs.append(addr)
            arr = read_array(t, self.read_bytes, addr)
            if arr is None:
                arr = read_quantized_rows(t, self.read_bytes, addr)
                if arr is not None:
                    node.digest = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
                return
            arr = np.ascontiguousarray(arr)
            node.digest = hashlib.sha256(arr.tobytes()).hexdigest()
            self.values[node.index] = as_float32(arr, t.type)
    return Recorder


def _Recorder(*args):
    return _recorder_class()(*args)


def run_graphgen(model, sc: Scenario, backend: str = "cpu"):
    """The scenario in graphgen's engine, in a fresh Session; yields the block graphs, recorded,
    one at a time (a realistic draft's graphs of 16 sequences would not all fit in memory)."""
    from ..play.player import SessionEngine, walk
    from ..ops import ggml as G
    from ..runtime.session import Session

    sess = Session(model, n_ctx=sc.n_ctx, n_ubatch=sc.n_ubatch, flash_attn=sc.flash_attn, type_k=sc.type_k,
                   type_v=sc.type_v, n_seq=sc.n_seq, n_threads=sc.n_threads, backend=backend)
    engine = SessionEngine(sess)

    def before(index, step):
        # block graphs alone are recorded, each into a recorder of its own
        engine.recorder = _Recorder(G.op_desc, G.type_name, MAX_DATA, G.read_tensor_bytes) \
            if step.kind == "block" else None

    try:
        for _, step, _ in walk(sc, engine, before=before):
            if step.kind == "block":
                yield Graph(engine.recorder.nodes, engine.recorder.values)
    finally:
        sess.close()


class ReferenceWorker:
    """b11739 serving scenarios in one child process (`runner --serve`), each in a fresh context,
    through the runner protocol's client."""

    def __init__(self, workdir: Path):
        from ..reference.protocol import LineWorker
        self.dir = Path(workdir)
        self.log = self.dir / "errors.jsonl"
        self.worker = LineWorker([sys.executable, "-m", "graphgen.reference.runner", "--serve"],
                                 self.dir / "llama.cpp.log", None)
        self.n = 0

    def run(self, model, sc: Scenario):
        """The scenario in b11739; yields the block graphs one at a time, as run_graphgen."""
        from ..dump.format import load_dump_dir
        from ..reference.protocol import error_text
        from ..reference.runner import ReferenceFailed

        self.n += 1
        path = self.dir / f"s{self.n}.json"
        out = self.dir / f"d{self.n}"
        path.write_text(json.dumps(sc.to_dict(copy=True)))
        self.log.write_text("")
        res, how = self.worker.ask({"id": self.n, "model": str(Path(model).resolve()), "scenario": str(path),
                                    "out": str(out), "max_data": MAX_DATA, "log": str(self.log)})
        if res is None:
            headline, _ = error_text(self.log, (self.dir / "llama.cpp.log").read_text(errors="replace"))
            raise ReferenceFailed(f"llama.cpp b11739 ended ({how.removeprefix('abort (').rstrip(')')}): {headline}")
        if not res["ok"]:
            raise ReferenceFailed(f"llama.cpp b11739: {res['error']}")
        try:
            for d in load_dump_dir(out):
                if d.graph == "block":
                    with d:
                        values = {k: d.values(k) for k in range(len(d.nodes))}
                    yield Graph(d.nodes, {k: v for k, v in values.items() if v is not None})
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def close(self):
        self.worker.close()
