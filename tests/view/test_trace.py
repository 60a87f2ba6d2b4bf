"""graphgen.view.trace: every computed node printed as common/debug.cpp's eval callback prints it
(the header line, the first and last 3 values of each dimension, the float32 sum), graphs marked
for the importer, JSON Lines, a name filter, and dumps of the same run."""

import io
import json

import numpy as np
from conftest import REF_DIR

from graphgen.compare.importers import import_text
from graphgen.compare.pairing import diff_paths
from graphgen.dump.format import load_dump
from graphgen.play.scenario import load_scenario
from graphgen.view.trace import header_line, ne_string, run_trace, value_lines

CASE = REF_DIR / "dflash-fa-off"


def test_header_line():
    assert ne_string([4, 1, 1, 1]) == "4, 1, 1, 1"
    # %24s name, %10s op, each source with its ne, the second closed by "}" as upstream prints it
    assert header_line("norm-0", "f32", "RMS_NORM", ("inp", [8, 2, 1, 1]), None, [8, 2, 1, 1]) == \
        "common_debug_cb_eval:                   norm-0 = (f32)   RMS_NORM(inp{8, 2, 1, 1}, }) = {8, 2, 1, 1}"
    assert header_line("a", "i32", "ARANGE", None, None, [3, 1, 1, 1]) == \
        "common_debug_cb_eval:                        a = (i32)     ARANGE((null){}, }) = {3, 1, 1, 1}"
    assert header_line("x", "f32", "ADD", ("p", [1, 1, 1, 1]), ("q", [2, 1, 1, 1]), [1, 1, 1, 1], func="f") == \
        "f:                        x = (f32)        ADD(p{1, 1, 1, 1}, q{2, 1, 1, 1}}) = {1, 1, 1, 1}"
    # the second source is printed into char[128]: 127 characters at most
    long = header_line("x", "f32", "ADD", ("p", [1, 1, 1, 1]), ("s" * 200, [1, 1, 1, 1]), [1, 1, 1, 1])
    assert ", " + "s" * 127 + "}) = {1, 1, 1, 1}" in long


def test_value_lines_elide_the_middle_of_long_dimensions():
    assert value_lines(np.arange(8, dtype=np.float32).reshape(1, 1, 1, 8)) == [
        "    [", "        [",
        "            [      0.0000,       1.0000,       2.0000,    ...,       5.0000,       6.0000,       7.0000  ],",
        "        ],", "    ]", "    sum = 28.000000"]
    lines = value_lines(np.arange(14, dtype=np.float32).reshape(1, 1, 7, 2))
    assert lines[2:9] == ["            [      0.0000,       1.0000  ],", "            [      2.0000,       3.0000  ],",
                          "            [      4.0000,       5.0000  ],", "            ..., ",
                          "            [      8.0000,       9.0000  ],", "            [     10.0000,      11.0000  ],",
                          "            [     12.0000,      13.0000  ],"]
    # six rows: no more than 2 * 3, all of them
    assert "..." not in "".join(value_lines(np.zeros((1, 1, 6, 6), np.float32)))


def test_value_lines_print_every_ne3_slice_with_its_running_sum():
    lines = value_lines(np.ones((2, 1, 1, 2), np.float32))
    assert [ln for ln in lines if "sum" in ln] == ["    sum = 4.000000", "    sum = 4.000000"]
    assert lines.count("    [") == 2


def test_the_sum_is_a_float32_running_sum():
    # 1e8 + 1 is 1e8 in float32: the sum is 0, not the exact 1
    assert value_lines(np.array([1e8, 1.0, -1e8], np.float32))[-1] == "    sum = 0.000000"
    assert value_lines(np.array([1.0, np.nan], np.float32))[-1] == "    sum = nan"
    # glibc prints a NaN with its sign bit set as -nan
    assert "        -nan" in value_lines(np.copysign(np.full(1, np.nan, np.float32), np.float32(-1)))[2]


def test_trace_prints_every_node_of_the_run_and_dumps_it(tmp_path, models_dir):
    from make_references import build_model
    model = build_model(CASE, models_dir)
    out = io.StringIO()
    assert run_trace(model, load_scenario(CASE / "scenario.json"), out, dump_dir=tmp_path / "d") == 0
    text = out.getvalue()
    assert text.startswith("graphgen trace: graph 00-inject\ncommon_debug_cb_eval: ")
    # the text reads back as the reference's graphs: names, ops, types and shapes, node for node
    dumps = import_text(text)
    assert [d.graph for d in dumps] == ["inject", "block"] and dumps[0].source["engine"] == "graphgen"
    for d, f in zip(dumps, ["00-inject", "01-block"]):
        ref = load_dump(CASE / f"{f}.json")
        assert [(n.name.strip(), n.op, n.type, n.ne) for n in d.nodes] == \
            [(n.name.strip(), n.op, n.type, n.ne) for n in ref.nodes]
        assert len(d.source["import"]["printed"]) == len(ref.nodes)
    # and the dumps written alongside are the reference's, bit for bit
    assert all(r.identical for r in diff_paths(CASE, tmp_path / "d"))


def test_trace_filter_and_json_lines(models_dir):
    from make_references import build_model
    model = build_model(CASE, models_dir)
    out = io.StringIO()
    assert run_trace(model, load_scenario(CASE / "scenario.json"), out, filter_patterns=["kq", "ffn_out"],
                     as_json=True) == 0
    nodes = [json.loads(ln) for ln in out.getvalue().splitlines()]
    ref = load_dump(CASE / "01-block.json")
    want = [n.name for n in ref.nodes if n.name.startswith(("kq", "ffn_out"))]
    assert [n["name"] for n in nodes] == want and all(n["graph"] == "01-block" for n in nodes)
    soft = next(n for n in nodes if n["op"] == "SOFT_MAX")
    assert set(soft["params"]) >= {"scale", "max_bias"} and len(soft["first"]) == 8
    ffn = next(n for n in nodes if n["name"] == "ffn_out-0")
    np.testing.assert_allclose(ffn["first"], ref.values(ffn["index"]).ravel()[:8], rtol=0, atol=0)
