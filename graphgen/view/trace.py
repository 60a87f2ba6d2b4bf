"""`graphgen trace`: print every computed node as llama.cpp's eval callback does.

The format is common/debug.cpp's common_debug_cb_eval (what llama-eval-callback prints): a header
line `common_debug_cb_eval: <name:24> = (<type>) <op:10>(<src0>{ne}, <src1>{ne}}) = {ne}`, then
the values with the first and last 3 entries of each dimension (`%12.4f`) and the float32 sum,
once per ne[3] slice. Graphs are separated by a line `graphgen trace: graph NN-<kind>`, which
the eval-callback importer reads as a graph boundary.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import TextIO

import numpy as np

FUNC = "common_debug_cb_eval"
INDENT = "    "
N_EDGE = 3
GRAPH_MARK = "graphgen trace: graph"


def ne_string(ne) -> str:
    return ", ".join(str(int(x)) for x in ne)


def header_line(name: str, type_: str, op: str, src0: tuple[str, list[int]] | None,
                src1: tuple[str, list[int]] | None, ne, func: str = FUNC) -> str:
    """The callback's first line for a node; sources are (name, ne)."""
    s0 = f"{src0[0]}{{{ne_string(src0[1])}}}" if src0 else "(null){}"
    s1 = ""
    if src1:
        # snprintf into char[128]
        s1 = f"{src1[0]}{{{ne_string(src1[1])}}}".encode()[:127].decode(errors="ignore")
    return "%s: %24s = (%s) %10s(%s, %s}) = {%s}" % (func, name, type_, op, s0, s1, ne_string(ne))


def _f(v: float, spec: str) -> str:
    # glibc prints a NaN with its sign bit set as "-nan"
    if math.isnan(v):
        s = "-nan" if math.copysign(1.0, v) < 0 else "nan"
        width = int(re.match(r"%(\d*)", spec).group(1) or 0)
        return s.rjust(width)
    return spec % v


def value_lines(values: np.ndarray, n: int = N_EDGE) -> list[str]:
    """common_debug_print_tensor for values in numpy order (ne3, ne2, ne1, ne0)."""
    a = np.asarray(values, dtype=np.float32).reshape(values.shape if values.ndim == 4 else (1,) * (4 - values.ndim) + values.shape)
    ne3, ne2, ne1, ne0 = a.shape
    # float sum += v, in index order: a sequential float32 accumulation
    total = float(np.cumsum(a.ravel(), dtype=np.float32)[-1]) if a.size else 0.0
    out = []
    for i3 in range(ne3):
        out.append(INDENT + "[")
        i2 = 0
        while i2 < ne2:
            if i2 == n and ne2 > 2 * n:
                out.append(INDENT * 2 + "..., ")
                i2 = ne2 - n
            out.append(INDENT * 2 + "[")
            i1 = 0
            while i1 < ne1:
                if i1 == n and ne1 > 2 * n:
                    out.append(INDENT * 3 + "..., ")
                    i1 = ne1 - n
                line = INDENT * 3 + "["
                i0 = 0
                while i0 < ne0:
                    if i0 == n and ne0 > 2 * n:
                        line += "   ..., "
                        i0 = ne0 - n
                    line += _f(float(a[i3, i2, i1, i0]), "%12.4f")
                    if i0 < ne0 - 1:
                        line += ", "
                    i0 += 1
                out.append(line + "  ],")
                i1 += 1
            out.append(INDENT * 2 + "],")
            i2 += 1
        out.append(INDENT + "]")
        out.append(INDENT + "sum = " + _f(total, "%f"))
    return out


class TraceRecorder:
    """A recorder for Session: prints each node as the callback would, and keeps it as a dump Node."""

    def __init__(self, out: TextIO = sys.stdout, filter_patterns: list[str] | None = None,
                 abort_on_nan: bool = False, max_data: int = 262144, as_json: bool = False):
        from graphgen.ops import ggml as G
        from graphgen.dump.record import NodeRecorder
        self._read_bytes = getattr(G, "read_tensor_bytes", None)  # device memory, where a backend has it
        self._rec = NodeRecorder(G.op_desc, G.type_name, max_data, self._read_bytes)
        self.out = out
        # as_json: one JSON object a node (JSON Lines) instead of the eval-callback text
        self.as_json = as_json
        self.graph = None
        # upstream anchors each pattern at the start and then regex_searches
        self.filters = [re.compile("^" + p) for p in (filter_patterns or [])]
        self.abort_on_nan = abort_on_nan
        self.aborted = False
        self.pipe_closed = False  # the reader of `out` went away (trace ... | head)

    @property
    def nodes(self):
        return self._rec.nodes

    @property
    def values(self):
        return self._rec.values

    @property
    def inputs(self):
        return self._rec.inputs

    @property
    def qrows(self):
        return self._rec.qrows

    @property
    def input_names(self):
        return self._rec.input_names

    @input_names.setter
    def input_names(self, names):
        # the session names its inputs on the recorder it is given: this one's inner recorder
        self._rec.input_names = names

    def reset(self):
        self._rec.reset()

    def record(self, addr: int, backend: str | None = None):
        # an exception cannot cross the C callback: a closed pipe stops the printing here, and
        # run_trace raises it once the graph is done
        try:
            self._record(addr, backend)
        except BrokenPipeError:
            self.pipe_closed = self.aborted = True

    def _record(self, addr: int, backend: str | None = None):
        from graphgen.ops import ggml as G
        from graphgen.dump.record import TensorStruct, read_values
        if self.aborted:
            return
        self._rec.record(addr, backend)
        t = TensorStruct.from_address(addr)
        name = t.name.decode(errors="replace")
        if self.filters and not any(f.search(name) for f in self.filters):
            return

        def src(k):
            s = t.src[k]
            return (s.contents.name.decode(errors="replace"), [int(x) for x in s.contents.ne]) if s else None
        rb = self._read_bytes
        vals = read_values(t, 1 << 62, rb, addr) if rb else read_values(t, 1 << 62)
        if self.as_json:
            node = dict(self._rec.nodes[-1].to_dict(), graph=self.graph)
            node["params"] = _decoded(node["op"], node["op_params"], node["ne"])
            if vals is not None and vals.size:
                node["first"] = [float(v) if np.isfinite(v) else str(v) for v in vals.ravel()[:8]]
            print(json.dumps(node), file=self.out)
        else:
            print(header_line(name, G.type_name(t.type), G.op_desc(addr), src(0), src(1), list(t.ne)), file=self.out)
        if vals is None or vals.size == 0:
            return  # quantized types are not printed
        if not self.as_json:
            print("\n".join(value_lines(vals)), file=self.out)
        if self.abort_on_nan and math.isnan(float(np.cumsum(vals.ravel(), dtype=np.float32)[-1])):
            # upstream exits here; an exception cannot cross the C callback, so later nodes
            # are ignored and run_trace stops after this graph
            print("encountered NaN - aborting", file=self.out)
            self.aborted = True


def _decoded(op: str, params: list[int], ne: list[int]) -> dict:
    """op_params by name (eps, modes, scales, offsets), in JSON's terms: a float JSON cannot
    spell (NaN, Inf) as its string."""
    from graphgen.compare.opparams import decode_op_params

    def plain(v):
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
    return {k: plain(v) for k, v in decode_op_params(op, params, ne).items()}


def run_trace(model, scenario, out: TextIO = sys.stdout, filter_patterns=None, abort_on_nan: bool = False,
              dump_dir=None, backend: str = "cpu", as_json: bool = False) -> int:
    """Run the scenario, printing every node; 0 when done, 1 when --abort-on-nan stopped it."""
    from graphgen.dump.format import write_dump
    from graphgen.play.engine import engine_header
    from graphgen.play.player import SessionEngine, play
    from graphgen.dump.record import n_kv_from_nodes
    from graphgen.runtime.session import Session

    model = Path(model)
    kw = {} if backend == "cpu" else {"backend": backend}
    sess = Session(model, n_ctx=scenario.n_ctx, n_ubatch=scenario.n_ubatch, flash_attn=scenario.flash_attn,
                   type_k=scenario.type_k, type_v=scenario.type_v, n_seq=scenario.n_seq,
                   n_threads=scenario.n_threads, **kw)
    rec = TraceRecorder(out, filter_patterns, abort_on_nan, as_json=as_json)
    engine = SessionEngine(sess)
    engine.recorder = rec

    def before(index, step):
        rec.graph = f"{index:02d}-{step.kind}"
        if not as_json:
            print(f"{GRAPH_MARK} {rec.graph}", file=out)
        rec.reset()

    def after(index, step, result):
        if rec.pipe_closed:
            raise BrokenPipeError("the trace's reader closed its end")
        if rec.aborted:
            return True
        if dump_dir is not None:
            settings = dict(sess.settings(step.kind), n_kv=n_kv_from_nodes(rec.nodes))
            write_dump(dump_dir, index, step.kind, dict(engine_header(model.name, model, scenario), settings=settings),
                       rec.nodes, rec.values, inputs=rec.inputs, qrows=rec.qrows)
        return False

    try:
        if not play(scenario, engine, before=before, after=after):
            return 1
    finally:
        sess.close()
    return 0
