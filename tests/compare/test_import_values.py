"""Imports compared by printed values; GGML_SCHED_DEBUG imports that say what they cannot see; the
build lines of imports.

The yardstick for the eval-callback format is upstream's own printing: common/debug.cpp from the
llama.cpp tree in the xllamacpp sdist (the one tools/build_ggml.sh fetches), compiled at test time
against that tree's ggml headers with stand-ins for common.h and log.h, and installed as the eval
callback of the b11739 reference runner, so the text is what llama-eval-callback prints for the
tensors b11739 computed.
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.cli import main as cli_main
from graphgen.compare.diff import diff_dumps
from graphgen.compare.pairing import diff_paths
from graphgen.compare.report import describe_build, exit_code
from graphgen.dump.format import load_dump
from graphgen.compare.importers import VIEW_OPS, import_file, import_text, printed_positions, read_printed

CASE = REF_DIR / "dflash-fa-off"
SDIST = "xllamacpp-2026.10.11549.tar.gz"
TREE = "xllamacpp-2026.10.11549/thirdparty/llama.cpp"

# stand-ins for llama.cpp's common.h and log.h: just what debug.cpp uses of them
COMMON_H = """#pragma once
#include "ggml.h"
#include "ggml-backend.h"
struct common_params { ggml_backend_sched_eval_callback cb_eval; void * cb_eval_user_data; };
"""
LOG_H = """#pragma once
#include <cstdio>
extern FILE * gg_out;
#define LOG(...) fprintf(gg_out, __VA_ARGS__)
"""
# the entry points the test process calls through ctypes
ENTRY_CPP = r"""
#include "debug.h"
#include <cstdio>
FILE * gg_out = stdout;
extern "C" void * gg_open(const char * path) { gg_out = fopen(path, "w"); return new common_debug_cb_user_data(); }
extern "C" int gg_eval(void * t, void * ud) { return common_debug_cb_eval((ggml_tensor *) t, false, ud); }
extern "C" void gg_text(const char * s) { fputs(s, gg_out); fflush(gg_out); }
extern "C" void gg_close(void) { fclose(gg_out); }
"""
# runs the reference for a scenario with upstream's callback printing every node it computes
CHILD = r"""
import ctypes, sys
from pathlib import Path
from graphgen.libload import lib_file
from graphgen.dump.record import NodeRecorder
from graphgen.reference import runner
from graphgen.play.scenario import load_scenario

shim_path, model, scenario, out, text = sys.argv[1:6]
_, _, libdir = runner.load_llama()
# the shim leaves ggml's symbols to the libraries already loaded: make them visible to it
ctypes.CDLL(str(lib_file(libdir, "ggml-base") or "libggml-base.so.0"), mode=ctypes.RTLD_GLOBAL)
shim = ctypes.CDLL(shim_path)
shim.gg_open.restype = ctypes.c_void_p
ud = ctypes.c_void_p(shim.gg_open(text.encode()))


class Printing(NodeRecorder):
    def reset(self):
        shim.gg_text(b"llama_decode: next graph\n")  # a log line between graphs, as in a real log
        super().reset()

    def record(self, addr, backend=None):
        shim.gg_eval(ctypes.c_void_p(addr), ud)
        super().record(addr, backend)


runner.NodeRecorder = Printing
runner.run_child(Path(model), load_scenario(scenario), Path(out), 1 << 30, scenario)
shim.gg_close()
"""


def _sdist() -> Path | None:
    for d in (Path(os.environ.get("GRAPHGEN_CACHE", Path.home() / ".cache" / "graphgen")) / "src", Path("/tmp/src")):
        if (d / SDIST).is_file():
            return d / SDIST
    return None


@pytest.fixture(scope="module")
def upstream_printer(tmp_path_factory):
    """libupstream_debug.so: upstream's common/debug.cpp behind gg_open / gg_eval / gg_close."""
    sdist = _sdist()
    if sdist is None or shutil.which("g++") is None:
        pytest.skip(f"needs {SDIST} (tools/build_ggml.sh fetches it) and g++")
    d = tmp_path_factory.mktemp("upstream_debug")
    with tarfile.open(sdist) as tf:
        for m in tf.getmembers():
            name = m.name
            if name in (f"{TREE}/common/debug.cpp", f"{TREE}/common/debug.h") or (
                    name.startswith(f"{TREE}/ggml/include/") and name.endswith(".h")):
                m.name = Path(name).name if "/common/" in name else "include/" + Path(name).name
                # tarfile's extraction filters came with Python 3.11.4; Debian's 3.11.2 has none
                tf.extract(m, d, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    assert (d / "debug.cpp").is_file() and (d / "include" / "ggml.h").is_file()
    (d / "common.h").write_text(COMMON_H)
    (d / "log.h").write_text(LOG_H)
    (d / "entry.cpp").write_text(ENTRY_CPP)
    so = d / "libupstream_debug.so"
    subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", "-O1", "-I", str(d), "-I", str(d / "include"),
                    str(d / "debug.cpp"), str(d / "entry.cpp"), "-o", str(so)], check=True, capture_output=True)
    return so


@pytest.fixture(scope="module")
def upstream_text(upstream_printer, tmp_path_factory):
    """(text upstream's callback printed for b11739's run of the dflash-fa-off case, the dumps of
    that run, graphgen's dumps of the same scenario)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from make_references import build_model

    from graphgen.play.engine import run_scenario
    from graphgen.play.scenario import load_scenario
    d = tmp_path_factory.mktemp("upstream_run")
    model = build_model(CASE, d)
    (d / "child.py").write_text(CHILD)
    p = subprocess.run([sys.executable, str(d / "child.py"), str(upstream_printer), str(model),
                        str(CASE / "scenario.json"), str(d / "ref"), str(d / "cb.txt")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    run_scenario(model, load_scenario(CASE / "scenario.json"), d / "ours")
    return (d / "cb.txt").read_text(), d / "ref", d / "ours"


def test_upstream_text_reads_and_all_printed_values_agree(upstream_text):
    text, ref_dir, ours_dir = upstream_text
    assert text.count("common_debug_cb_eval: ") == 29 + 84 and "sum = " in text
    dumps = import_text(text)
    assert [d.graph for d in dumps] == ["inject", "block"]
    for d, f in zip(dumps, ["00-inject", "01-block"]):
        printed = d.source["import"]["printed"]
        assert len(printed) == len(d.nodes) and not any("unreadable" in p for p in printed.values())
        for ours_side in (ours_dir, ref_dir):  # graphgen's run, and the very run that printed
            full = load_dump(ours_side / f"{f}.json")
            for imp_first in (True, False):
                res = diff_dumps(d, full) if imp_first else diff_dumps(full, d)
                assert res.status == "IDENTICAL", res.format_text()
                assert res.summary["from_printed"] == len(d.nodes) == res.summary["numeric_compared"]
                n_el = sum(r.n for r in res.numeric)
                assert n_el >= 6 * len(d.nodes)
                assert any(f"values compared from printed values: {n_el} printed elements and {len(d.nodes)} "
                           "printed sums" in n for n in res.notes)
        # the printed values are the dump's values at the positions read_printed maps them to,
        # checked here without the comparison code: numpy's own rounding to 4 decimals
        full = load_dump(ref_dir / f"{f}.json")
        for k, p in printed.items():
            v = full.values(int(k)).astype(np.float32).ravel()
            want = [f"{x:.4f}" for x in v[p["at"]].astype(np.float64)]
            assert p["values"] == want, (k, d.nodes[int(k)].name)
            # the float32 sum in index order, printed with 6 decimals
            assert p["sum"] == f"{float(np.cumsum(v, dtype=np.float32)[-1]):.6f}"


def _perturbed_dump(src_dir: Path, f: str, dest: Path, index: int, change) -> Path:
    """A copy of dump `f` with node `index`'s values changed by `change(values)`."""
    dest.mkdir(parents=True, exist_ok=True)
    doc = json.loads((src_dir / f"{f}.json").read_text())
    vals = dict(np.load(src_dir / f"{f}.npz"))
    vals[f"n{index}"] = change(vals[f"n{index}"].copy())
    np.savez(dest / f"{f}.npz", **vals)
    (dest / f"{f}.json").write_text(json.dumps(doc))
    return dest / f"{f}.json"


def test_perturbed_value_and_sum_fail_naming_the_node(upstream_text, tmp_path):
    text, _, ours_dir = upstream_text
    block = import_text(text)[1]
    full = load_dump(ours_dir / "01-block.json")
    k = next(i for i, n in enumerate(full.nodes) if n.name == "ffn_inp-0")
    p = block.source["import"]["printed"][str(k)]
    flat = p["at"][4]  # the fifth printed element
    ne = full.nodes[k].ne
    coord = [flat % ne[0], flat // ne[0] % ne[1], flat // (ne[0] * ne[1]) % ne[2], flat // (ne[0] * ne[1] * ne[2])]

    printed = float(p["values"][4])

    def put(at, value):
        def change(v):
            v.reshape(-1)[at] = value
            return v
        return change
    # beyond the print precision: 0.6e-4 from the printed value > half of its last digit
    res = diff_dumps(block, load_dump(_perturbed_dump(ours_dir, "01-block", tmp_path / "a", k,
                                                      put(flat, printed + 0.6e-4))))
    assert res.status == "DIVERGED" and exit_code([res]) == 1
    (bad,) = res.numeric_failures
    assert (bad.ref_index, bad.name) == (k, "ffn_inp-0")
    assert f"at [{coord[0]}, {coord[1]}, {coord[2]}, {coord[3]}] (flat {flat})" in bad.reason
    assert f"ref {printed:.6g}" in bad.reason and "ffn_inp-0" in res.format_text()
    # within it (0.4e-4 away, on either side), the sum moving by less than its bound: agrees
    for by in (0.4e-4, -0.4e-4):
        res = diff_dumps(block, load_dump(_perturbed_dump(ours_dir, "01-block", tmp_path / "b", k,
                                                          put(flat, printed + by))))
        assert res.status == "IDENTICAL", res.format_text()
    # an element the text does not print, moved by 1: seen through the sum only
    unprinted = next(x for x in range(full.nodes[k].nelements) if x not in set(p["at"]))
    old = float(full.values(k).ravel()[unprinted])
    res = diff_dumps(block, load_dump(_perturbed_dump(ours_dir, "01-block", tmp_path / "c", k,
                                                      put(unprinted, old + 1.0))))
    assert res.status == "DIVERGED"
    (bad,) = res.numeric_failures
    assert bad.name == "ffn_inp-0" and "printed sum differs" in bad.reason and "elements differ" not in bad.reason
    # a changed printed sum in the text
    lines = text.splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.startswith("common_debug_cb_eval: ")]
    at = heads[29 + k]
    assert "ffn_inp-0" in lines[at]
    s_line = next(i for i in range(at, len(lines)) if lines[i].strip().startswith("sum = "))
    s_val = float(lines[s_line].split("=")[1])
    lines[s_line] = f"    sum = {s_val + 0.01:f}"
    block2 = import_text("\n".join(lines) + "\n")[1]
    res = diff_dumps(full, block2)
    assert res.status == "DIVERGED"
    (bad,) = res.numeric_failures
    assert bad.name == "ffn_inp-0" and f"printed sum differs: ref {float(np.cumsum(full.values(k).ravel(), dtype=np.float32)[-1]):.6f}, ours {s_val + 0.01:.6f}" in bad.reason


def test_node_without_values_is_not_compared(upstream_text, tmp_path):
    text, _, ours_dir = upstream_text
    block = import_text(text)[1]
    doc = json.loads((ours_dir / "01-block.json").read_text())
    k = 5
    for key in ("digest", "stats"):
        doc["nodes"][k].pop(key, None)
    vals = {n: v for n, v in np.load(ours_dir / "01-block.npz").items() if n != f"n{k}"}
    (tmp_path / "d").mkdir()
    np.savez(tmp_path / "d" / "01-block.npz", **vals)
    (tmp_path / "d" / "01-block.json").write_text(json.dumps(doc))
    res = diff_dumps(load_dump(tmp_path / "d" / "01-block.json"), block)
    assert res.status == "NOT COMPARED" and not res.identical and exit_code([res]) == 1
    assert [(i, j) for i, j, _, _ in res.not_compared] == [(k, k)]
    assert "neither its values nor their statistics" in res.not_compared[0][3]
    # statistics only (values over --max-data): the printed sum is still checked, elements are not
    doc = json.loads((ours_dir / "01-block.json").read_text())
    (tmp_path / "s").mkdir()
    np.savez(tmp_path / "s" / "01-block.npz", **vals)
    (tmp_path / "s" / "01-block.json").write_text(json.dumps(doc))
    res = diff_dumps(load_dump(tmp_path / "s" / "01-block.json"), block)
    assert res.status == "IDENTICAL", res.format_text()
    r = next(r for r in res.numeric if r.ref_index == k)
    assert r.n == 0 and r.ok
    doc["nodes"][k]["stats"]["sum"] += 1.0
    (tmp_path / "s" / "01-block.json").write_text(json.dumps(doc))
    res = diff_dumps(load_dump(tmp_path / "s" / "01-block.json"), block)
    assert res.status == "DIVERGED" and [r.ref_index for r in res.numeric_failures] == [k]


def test_printed_against_printed(upstream_text, tmp_path, capsys):
    text, _, _ = upstream_text
    (tmp_path / "a.txt").write_text(text)
    res = diff_paths(tmp_path / "a.txt", tmp_path / "a.txt")
    assert [r.status for r in res] == ["IDENTICAL", "IDENTICAL"]
    assert sum(r.n for r in res[1].numeric) > 0 and res[1].summary["from_printed"] == 84
    # one printed element changed by one unit of its last digit beyond both precisions
    lines = text.splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.startswith("common_debug_cb_eval: ") and "ffn_out-1" in ln)
    row = next(i for i in range(row, len(lines)) if re.match(r"^\s+\[\s*-?\d", lines[i]))
    first = re.search(r"-?\d+\.\d{4}", lines[row]).group(0)
    changed = f"{float(first) + 0.0002:.4f}"
    lines[row] = lines[row].replace(first.rjust(12), changed.rjust(12), 1)
    (tmp_path / "b.txt").write_text("\n".join(lines) + "\n")
    res = diff_paths(tmp_path / "a.txt", tmp_path / "b.txt")
    assert res[0].status == "IDENTICAL" and res[1].status == "DIVERGED"
    (bad,) = res[1].numeric_failures
    assert bad.name == "ffn_out-1" and f"ref {float(first):.6g}, ours {float(changed):.6g}" in bad.reason
    # the CLI reports it as a value failure, exit 1; an import folder gives the same answer
    assert cli_main(["diff", str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]) == 1
    out = capsys.readouterr().out
    assert "numeric failures:" in out and "ffn_out-1" in out and "from printed values" in out
    assert cli_main(["import", str(tmp_path / "b.txt"), "--out", str(tmp_path / "imp")]) == 0
    capsys.readouterr()
    res2 = diff_paths(tmp_path / "a.txt", tmp_path / "imp")
    assert [r.status for r in res2] == ["IDENTICAL", "DIVERGED"]
    assert res2[1].numeric_failures[0].reason == bad.reason


# ---- reading the printed text, against positions computed here ----------------------------------

def _print_like_upstream(v: np.ndarray, edge: int) -> list[str]:
    """The value lines for values in numpy order (ne3, ne2, ne1, ne0), written from the loop
    structure of common_debug_print_tensor: each of ne3, then of ne2, ne1, ne0 the first and last
    `edge` (all when no longer than 2*edge)."""
    ne3, ne2, ne1, ne0 = v.shape

    def idx(n):
        return list(range(n)) if n <= 2 * edge else list(range(edge)) + [None] + list(range(n - edge, n))
    out = []
    total = np.cumsum(v.ravel(), dtype=np.float32)[-1]
    for i3 in range(ne3):
        out.append("    [")
        for i2 in idx(ne2):
            if i2 is None:
                out.append("        ..., ")
                continue
            out.append("        [")
            for i1 in idx(ne1):
                if i1 is None:
                    out.append("            ..., ")
                    continue
                cells = ["   ..." if i0 is None else f"{v[i3, i2, i1, i0]:12.4f}" for i0 in idx(ne0)]
                out.append("            [" + ", ".join(cells) + "  ],")
            out.append("        ],")
        out.append("    ]")
        out.append(f"    sum = {total:f}")
    return out


@pytest.mark.parametrize("shape,edge", [((1, 1, 2, 9), 3), ((2, 8, 7, 4), 3), ((1, 3, 1, 5), 3),
                                        ((1, 1, 4, 10), 4), ((1, 2, 3, 4), 100)])
def test_read_printed_maps_positions(shape, edge):
    rng = np.random.default_rng(1)
    v = rng.standard_normal(shape).astype(np.float32)
    ne = list(reversed(shape))
    got = read_printed(_print_like_upstream(v, edge), ne)
    # expected positions, from numpy's own indexing of the printed corners
    sel = [list(range(n)) if n <= 2 * edge else list(range(edge)) + list(range(n - edge, n)) for n in shape[1:]]
    flat = np.arange(v.size).reshape(shape)[:, sel[0]][:, :, sel[1]][:, :, :, sel[2]].ravel().tolist()
    assert got["at"] == flat == printed_positions(ne, None if edge >= max(shape) else edge)
    assert [float(x) for x in got["values"]] == pytest.approx(v.ravel()[flat], abs=0.5e-4 + 1e-7)
    assert got["sum"] == f"{np.cumsum(v.ravel(), dtype=np.float32)[-1]:f}"


def test_read_printed_refuses_text_that_does_not_fit():
    v = np.zeros((1, 1, 2, 9), np.float32)
    lines = _print_like_upstream(v, 3)
    assert "unreadable" in read_printed(lines, [9, 3, 1, 1])   # one row short
    assert "unreadable" in read_printed([ln.replace("0.0000", "zero", 1) for ln in lines], [9, 2, 1, 1])
    text = ("common_debug_cb_eval:                        x = (f32)        ADD(a{9, 2, 1, 1}, b{9, 2, 1, 1}}) = {9, 3, 1, 1}\n"
            + "\n".join(lines) + "\n")
    (d,) = import_text(text)
    res = diff_dumps(d, d)
    assert res.status == "NOT COMPARED" and "cannot be read" in res.not_compared[0][3]


def test_nan_and_inf_must_agree():
    v = np.array([[[[1.0, np.nan, np.inf, -2.0]]]], np.float32)
    head = "common_debug_cb_eval:                        x = (f32)        ADD(a{4, 1, 1, 1}, b{4, 1, 1, 1}}) = {4, 1, 1, 1}\n"
    text = head + "\n".join(_print_like_upstream(v, 3)) + "\n"
    assert "nan" in text and "inf" in text
    (a,) = import_text(text)
    assert diff_dumps(a, a).status == "IDENTICAL"
    (b,) = import_text(text.replace("         inf", "        -inf"))
    res = diff_dumps(a, b)
    assert res.status == "DIVERGED" and "[2, 0, 0, 0]" in res.numeric_failures[0].reason


# ---- GGML_SCHED_DEBUG: what it cannot see ------------------------------------------------------

def _sched_log(nodes) -> str:
    """A GGML_SCHED_DEBUG=2 print of `nodes` as ggml-backend.cpp writes it: views skipped, the
    graph index kept."""
    out = ["", "## SPLIT #0: CPU # 0 inputs"]
    for i, n in enumerate(nodes):
        if n.op in VIEW_OPS:
            continue
        srcs = "".join(f" {s[:20]:>20} (  0 K) [  CPU     node]" for s in n.src if s)
        out.append(f"node #{i:3d} ({n.op[:10]:>10.10}): {n.name[:20]:>20.20} (  1 K) [  CPU     node] use=1,c=1:{srcs}")
    return "\n".join(out) + "\n"


def test_sched_debug_is_partial_naming_the_views(tmp_path, capsys):
    full = load_dump(CASE / "01-block.json")
    views = [(k, n.name) for k, n in enumerate(full.nodes) if n.op in VIEW_OPS]
    assert views
    (tmp_path / "s.log").write_text(_sched_log(full.nodes))
    (imp,) = import_file(tmp_path / "s.log")
    # the log's numbering skips exactly the views' indices (those before the last listed node)
    last = max(k for k, n in enumerate(full.nodes) if n.op not in VIEW_OPS)
    assert imp.source["import"]["unseen"]["indices"] == [k for k, _ in views if k < last]
    res = diff_dumps(full, imp)
    assert res.status == "PARTIAL" and not res.identical and exit_code([res]) == 1
    assert not res.structural and not res.numeric
    assert [(u["side"], u["index"], u["name"]) for u in res.unseen] == [("ref", k, n) for k, n in views]
    note = next(n for n in res.notes if "not shown" in n)
    assert f"compared on the {len(full.nodes) - len(views)} nodes the log shows; {len(views)} not shown" in note
    assert "view" in note and "GGML_SCHED_DEBUG" in note
    assert "IDENTICAL" not in res.format_text() and "result: PARTIAL" in res.format_text()
    assert res.to_dict()["status"] == "PARTIAL" and len(res.to_dict()["unseen"]) == len(views)
    assert cli_main(["diff", str(CASE / "01-block.json"), str(tmp_path / "s.log")]) == 1
    assert "result: PARTIAL" in capsys.readouterr().out
    # a real difference still shows as one
    (tmp_path / "bad.log").write_text(_sched_log(full.nodes).replace("        ffn_inp-1 (", "        ffn_XXX-1 ("))
    res = diff_dumps(full, import_file(tmp_path / "bad.log")[0])
    assert res.status == "DIVERGED"
    # two logs: only the gaps in their numbering say what is missing
    res = diff_dumps(imp, imp)
    assert res.status == "PARTIAL" and len(res.unseen) == 2 * len([k for k, _ in views if k < last])


def test_sched_debug_graph_without_views_can_be_identical(tmp_path):
    full = load_dump(CASE / "01-block.json")
    keep = [k for k, n in enumerate(full.nodes) if n.op not in VIEW_OPS]
    nodes = [full.nodes[k] for k in keep]
    import dataclasses
    nodes = [dataclasses.replace(n, index=i) for i, n in enumerate(nodes)]
    no_views = dataclasses.replace(full, nodes=nodes, values_path=None)
    (tmp_path / "s.log").write_text(_sched_log(nodes))
    (imp,) = import_file(tmp_path / "s.log")
    assert imp.source["import"]["unseen"]["indices"] == []
    res = diff_dumps(no_views, imp)
    assert res.status == "IDENTICAL" and not res.unseen, res.format_text()


# ---- build lines --------------------------------------------------------------------------------

def test_build_lines_of_imports(tmp_path):
    full = load_dump(CASE / "01-block.json")
    (tmp_path / "s.log").write_text(_sched_log(full.nodes))
    (sched,) = import_file(tmp_path / "s.log")
    cb = import_text("common_debug_cb_eval:                        x = (f32)        ADD(a{4, 1, 1, 1}, b{4, 1, 1, 1}}) = {4, 1, 1, 1}\n")[0]
    trace = import_text("graphgen trace: graph 00-block\n"
                        "common_debug_cb_eval:                        x = (f32)        ADD(a{4, 1, 1, 1}, b{4, 1, 1, 1}}) = {4, 1, 1, 1}\n")[0]
    assert describe_build(sched) == "llama.cpp GGML_SCHED_DEBUG log (imported; build, ggml and CPU features not recorded)"
    assert describe_build(cb) == "llama.cpp eval-callback text (imported; build, ggml and CPU features not recorded)"
    assert describe_build(trace) == "graphgen eval-callback text (imported; build, ggml and CPU features not recorded)"
    res = diff_dumps(full, sched)
    for line in res.format_text().splitlines():
        if "build:" in line and "ours" in line:
            assert "?" not in line and "SIMD" not in line
    assert not any("cpu_features" in n for n in res.notes)
    # the full side's line is unchanged
    assert describe_build(full).startswith("llama.cpp b11739 on ggml ")
    assert sched.source["version"] == cb.source["version"] == "unknown (imported)"


@pytest.mark.parametrize("printed", ["0.500000", "1000.000000", "-250000.000000"])
def test_printed_sum_against_printed_sum_at_the_tolerance(printed):
    """Printed against printed, a sum agrees when within half a unit of each side's last printed
    digit (%f: 5e-7 each) plus 2 float32 ulps of the larger: just inside agrees, just outside
    differs, for a sum where the digits dominate (0.5) and where the rounding does (1000)."""
    from graphgen.compare.printed import Side, compare_node, parse_printed
    a = float(printed)
    eps32 = 2.0 ** -23

    def outcome(b: float):
        ref = Side(printed=parse_printed({"at": [], "values": [], "sum": printed}))
        ours = Side(printed=parse_printed({"at": [], "values": [], "sum": f"{b:.6f}"}))
        return compare_node(ref, ours, [1, 1, 1, 1])

    tol = 5e-7 + 5e-7 + 2 * eps32 * abs(a)
    inside = math.floor(tol * 1e6) / 1e6   # the largest difference on the printed grid within it
    for d, ok in ((inside, True), (inside + 1e-6, False)):
        b = a + d
        want_tol = 1e-6 + 2 * eps32 * max(abs(a), abs(b))
        assert (abs(b - a) <= want_tol) == ok, (a, b, want_tol)
        out = outcome(b)
        assert out.sum_checked and (not out.failures) == ok, (a, b, out.failures)
        if not ok:
            assert out.failures[0].startswith("printed sum differs: ref ")
