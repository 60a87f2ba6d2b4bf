"""Cross-backend diff: one scenario on several ggml backends, compared node by node.

Structure must be identical (the same graph runs everywhere; only where a node ran may differ).
Values are compared per node with NMSE thresholds per op, in the spirit of test-backend-ops: the
ops whose GPU kernels accumulate differently (matmul, attention in f16) get looser bounds, and
every node downstream inherits its inputs' error, so graph-level bounds sit above single-op ones.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .pairing import diff_paths
from .report import _json_row, format_local, summarize_local
from .values import EXACT_TYPES, ORDER_FREE
from ..staging import staged_dump_dir
from ..ops import ggml as G
from ..play.engine import run_scenario

# per-op NMSE bounds for a node of a full graph (inputs already carry upstream differences)
OP_NMSE = {
    "MUL_MAT": 5e-4, "MUL_MAT_ID": 5e-4, "FLASH_ATTN_EXT": 5e-3, "SOFT_MAX": 5e-4,
    "ROPE": 5e-4, "RMS_NORM": 5e-4, "NORM": 5e-4, "L2_NORM": 5e-4, "SWIGLU": 5e-4, "GEGLU": 5e-4,
}
DEFAULT_NMSE = 5e-4
# data movement and integer results must agree exactly
EXACT_OPS = {"ARGMAX", "ARGSORT", "TOP_K", "GET_ROWS_BACK"}


@dataclass
class XDiffResult:
    backends: list
    graphs: list = field(default_factory=list)   # per graph: dict(graph, nodes, structural, worst, first_bad)
    ok: bool = True
    nmse: float | None = None   # one bound for every inexact node instead of the per-op table
    selection: str | None = None  # the -o / --name filter, when one narrowed the comparison

    def to_dict(self) -> dict:
        return {"backends": list(self.backends), "ok": self.ok, "nmse": self.nmse, "selection": self.selection,
                "graphs": [_json_row(g) for g in self.graphs]}

    def format_text(self) -> str:
        ref, other = self.backends
        bound = f" (nmse bound {self.nmse:g} for every inexact node)" if self.nmse is not None else ""
        only = f" (only the nodes {self.selection})" if self.selection else ""
        out = [f"xdiff {ref} vs {other}: {'PASS' if self.ok else 'FAIL'}{bound}{only}"]
        for g in self.graphs:
            line = (f"  [{g['graph']}] {g['nodes']} nodes, structure {'identical' if not g['structural'] else 'DIFFERS'}, "
                    f"worst nmse {g['worst_nmse']:.3g} at {g['worst_name']}")
            if g.get("order_dependent"):
                line += f", {g['order_dependent']} nodes follow a top-k in another order (compared as multisets)"
            out.append(line)
            if g["first_bad"]:
                b = g["first_bad"]
                out.append(f"    first node past its threshold: #{b['index']} {b['name']} ({b['op']}) "
                           f"nmse {b['nmse']:.3g} > {b['threshold']:.1g}")
            for d in g["structural"][:5]:
                out.append(f"    {d}")
            if g.get("local"):
                out += [f"    {line}" for line in format_local(g["local"])]
            if g.get("not_compared"):
                out.append(f"    {len(g['not_compared'])} nodes not compared (no values on a side), first "
                           f"{g['not_compared'][0]}")
        return "\n".join(out)


def xdiff(model, scenario, backends, out=None, progress=None, nmse: float | None = None,
          select=None, per_op: dict[str, float] | None = None, local: bool = False) -> XDiffResult:
    """Run `scenario` on both `backends` and compare them (see `compare_dirs`; `nmse` overrides the
    per-op bounds, `per_op` (op or type -> bound) overrides both where it names the node's op or
    type; `select` (graphgen.compare.nodefilter.NodeFilter) keeps the comparison to the nodes it selects;
    `local` adds each node's own error: the second backend's node re-run on the first's values)."""
    if len(backends) != 2:
        raise ValueError("xdiff compares two backends, e.g. --backends cpu,vulkan")
    # both backends must open before either side runs: a missing one is reported at once
    from ..runtime.backends import open_backend
    for b in backends:
        handle, _ = open_backend(b)
        G.ggml_backend_free(handle)
    work = Path(out) if out else Path(tempfile.mkdtemp(prefix="graphgen-xdiff-"))
    # both folders appear in `out` only once both runs and the comparison are done
    with contextlib.ExitStack() as stack:
        dirs = []
        for k, b in enumerate(backends):
            name = b.replace("://", "_").replace(":", "_").replace("/", "_")
            if k == 1 and b == backends[0]:
                name += "-2"  # the same backend twice (a determinism check): two folders still
            d = stack.enter_context(staged_dump_dir(work / name))
            # every value is kept: backends differ in the last bits, which a digest cannot weigh
            run_scenario(model, scenario, d, backend=b, progress=progress, max_data=1 << 62)
            dirs.append(d)
        return compare_dirs(dirs[0], dirs[1], backends, nmse, select=select, per_op=per_op,
                            local=local, model=model if local else None)


def compare_dirs(dir_a, dir_b, backends, nmse: float | None = None, select=None,
                 per_op: dict[str, float] | None = None, local: bool = False, model=None) -> XDiffResult:
    """The comparison half of xdiff: two dump folders of one scenario, node by node, per-op bounds;
    `nmse` replaces them with one bound (as diff's --nmse), integer results staying exact."""
    if nmse is not None and not (isinstance(nmse, (int, float)) and not isinstance(nmse, bool) and nmse >= 0):
        raise ValueError(f"nmse must be a non-negative number, got {nmse!r}")
    bound = None if nmse is None else float(nmse)
    res = XDiffResult(list(backends), nmse=bound)
    from .values import compare_values
    from ..dump.format import load_dump
    from .nodefilter import NodeFilter
    select = select or NodeFilter()
    per_op = dict(per_op or {})
    res.selection = str(select) if select.active else None
    n_selected = 0
    for r in diff_paths(dir_a, dir_b, nmse=1.0, select=select if select.active else None, local=local,
                        model=model):
        if r.unpaired:  # one run evaluated a graph the other did not
            res.graphs.append({"graph": r.graph, "nodes": None, "structural": list(r.notes), "worst_nmse": 0.0,
                               "worst_name": "-", "first_bad": None, "order_dependent": 0, "not_compared": []})
            res.ok = False
            continue
        ref, ours = load_dump(r.ref_path), load_dump(r.ours_path)
        nodes = {n.index: n for n in ref.nodes}
        # a top-k's order is the backend's (the CPU kernel's partial sort is one order among many):
        # equal candidate sets in another order make every node that reads them order-dependent,
        # compared as multisets of values
        reordered: set[str] = set()
        worst, worst_name, first_bad, n_perm = 0.0, "-", None, 0
        selected_here = sum(map(select, ref.nodes)) if select.active else len(ref.nodes)
        n_selected += selected_here
        for n in sorted(r.numeric, key=lambda x: x.ref_index):
            node = nodes[n.ref_index]
            op, nmse, reason = node.op, n.nmse, n.reason
            a, b = ref.values(n.ref_index), ours.values(n.ours_index)
            if op in ORDER_FREE and a is not None and b is not None and nmse > 0:
                if np.array_equal(np.sort(a, axis=-1), np.sort(b, axis=-1)):
                    reordered.add(node.name)
                    n_perm += 1
                    continue
            elif any(s in reordered for s in node.src) and a is not None and b is not None:
                reordered.add(node.name)
                n_perm += 1
                nmse, _, reason = compare_values(np.sort(a, axis=None), np.sort(b, axis=None))
            exact = op in EXACT_OPS or node.type in EXACT_TYPES
            if exact:
                thr = 0.0
            elif op in per_op or node.type in per_op or "default" in per_op:
                thr = per_op.get(op, per_op.get(node.type, per_op.get("default")))
            else:
                thr = OP_NMSE.get(op, DEFAULT_NMSE) if bound is None else bound
            n.threshold = thr  # xdiff's bound, which the own-error summary measures against
            bad = (reason is not None) or nmse > thr
            if nmse > worst:
                worst, worst_name = nmse, n.name
            if bad and first_bad is None:
                first_bad = {"index": n.ref_index, "name": n.name, "op": op, "nmse": nmse, "threshold": thr}
        structural = [d.describe() for d in r.structural] + [f"settings differ: {d}" for d in r.settings_differ]
        # a node neither side kept values of was not compared: only a quantized cache's writes and
        # views (no float values to read) may go without
        unseen = [n for _, _, n, _ in r.not_compared if not n.startswith("cache_")]
        res.graphs.append({"graph": r.graph, "nodes": r.summary.get("nodes_ref"), "structural": structural,
                           "worst_nmse": worst, "worst_name": worst_name, "first_bad": first_bad,
                           "order_dependent": n_perm, "not_compared": unseen,
                           "local": summarize_local(r.numeric) if local else None})
        # a graph compared on no node fails, unless the filter left none of its nodes to compare
        idle_ok = select.active and not selected_here
        res.ok &= not structural and first_bad is None and not unseen and (bool(r.numeric) or idle_ok)
    if select.active and not n_selected:
        from .nodefilter import FilterError
        raise FilterError(f"{select}: selects no node of any graph compared")
    return res
