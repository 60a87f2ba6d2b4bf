"""graphgen.compare.importers: llama.cpp's debug outputs (eval-callback text, ggml_graph_dump_dot
files, GGML_SCHED_DEBUG logs) read as structure-only dumps, the printed values located, and full
dumps cut down to the fields a format shows (`project`, `common_fields`)."""

import dataclasses

import pytest

from graphgen.compare.importers import (
    SCHED_UNSEEN_WHY,
    ImportFormatError,
    common_fields,
    detect,
    import_file,
    import_format,
    import_text,
    printed_positions,
    project,
    read_printed,
    write_imported,
)
from graphgen.dump.format import Node, load_dump_dir

CB = "common_debug_cb_eval: "


def cb_head(name, typ, op, s0, s1, ne):
    """A node's head line as common/debug.cpp prints it (%24s name, %10s op)."""
    args = (f"{s0[0]}{{{', '.join(map(str, s0[1]))}}}" if s0 else "") + ", " + (
        f"{s1[0]}{{{', '.join(map(str, s1[1]))}}}" if s1 else "")
    return f"{CB}{name:>24} = ({typ}) {op:>10}({args}}}) = {{{', '.join(map(str, ne))}}}"


VALUES_2 = ["    [", "        [", "            [      1.0000,       2.0000  ],", "        ],", "    ]",
            "    sum = 3.000000"]

# ggml_graph_dump_dot's output for mul_mat(w, inp) -> silu -> reshape_3d, as ggml 0.27.0 writes it
DOT = """digraph G {
  newrank = true;
  rankdir = TB;
  "0x1200" [ style = filled; fillcolor = white; shape = record; label="mm (f32)|0 [4, 2] | <x>X*Y"; ]
  "0x1370" [ style = filled; fillcolor = white; shape = record; label="act (f32)|1 [4, 2] | <x>unary(x)"; ]
  "0x14e0" [ style = filled; fillcolor = white; shape = record; label="act (reshaped) (f32)|2 [2, 2, 2] | <x>reshape(x)"; ]
  "0x1090" [ style = filled; fillcolor = pink; shape = record; label="<x>w.weight (f32)|CONST 0 [8, 4]"; ]
  "0x0f20" [ style = filled; fillcolor = pink; shape = record; label="<x>inp (f32)|CONST 1 [8, 2]"; ]
  "0x1090" -> "0x1200" [ arrowhead = vee; style = solid; label = "src 0"; ]
  "0x0f20" -> "0x1200" [ arrowhead = vee; style = solid; label = "src 1"; ]
  "0x1200" -> "0x1370" [ arrowhead = vee; style = solid; label = "src 0"; ]
  "0x1370" -> "0x14e0" [ arrowhead = vee; style = solid; label = "src 0"; ]
}
"""


def sched_line(idx, op, name, srcs, backend="CPU"):
    """One node of a GGML_SCHED_DEBUG=2 assignment print (ggml-backend.cpp's widths)."""
    s = "".join(f" {x[:20]:>20} (  0 K) [{backend:>5}     node]" for x in srcs)
    return f"node #{idx:3d} ({op[:10]:>10.10}): {name[:20]:>20.20} (  1 K) [{backend:>5}     node] use=1,c=1:{s}"


def test_detect_each_format():
    assert detect(DOT) == "dot"
    assert detect("## SPLIT #0: CPU # 0 inputs\n" + sched_line(0, "ADD", "x", ["a", "b"]) + "\n") == "sched-debug"
    assert detect(cb_head("x", "f32", "ADD", ("a", [4, 1, 1, 1]), ("b", [4, 1, 1, 1]), [4, 1, 1, 1])) == "eval-callback"
    assert detect("llama_decode: nothing here\n") is None
    with pytest.raises(ImportFormatError, match=r"^f\.txt: not an eval-callback log"):
        import_text("hello\n", "f.txt")
    with pytest.raises(ImportFormatError, match="unknown import format 'json'"):
        import_text("x", fmt="json")


def test_eval_callback_nodes_sources_and_printed_values():
    text = "\n".join([
        cb_head("inp_noise_embd", "f32", "GET_ROWS", ("token_embd.weight", [2, 16, 1, 1]), ("inp_tokens", [1, 1, 1, 1]),
                [2, 1, 1, 1]),
        *VALUES_2,
        # a backend copy of a source is named by the scheduler "<backend>#<name>#<n>"
        cb_head("norm-0", "f32", "RMS_NORM", ("CUDA0#inp_noise_embd#0", [2, 1, 1, 1]), None, [2, 1, 1, 1]),
        cb_head("pos", "i32", "ARANGE", None, None, [3, 1, 1, 1]),
        cb_head("a_name_longer_than_24_characters", "f32", "ADD", ("norm-0", [2, 1, 1, 1]), ("norm-0", [2, 1, 1, 1]),
                [2, 1, 1, 1]),
    ]) + "\n"
    (d,) = import_text(text, "cb.txt")
    assert [(n.index, n.name, n.op, n.type, n.ne, n.src) for n in d.nodes] == [
        (0, "inp_noise_embd", "GET_ROWS", "f32", [2, 1, 1, 1], ["token_embd.weight", "inp_tokens"]),
        (1, "norm-0", "RMS_NORM", "f32", [2, 1, 1, 1], ["inp_noise_embd"]),
        (2, "pos", "ARANGE", "i32", [3, 1, 1, 1], []),
        (3, "a_name_longer_than_24_characters", "ADD", "f32", [2, 1, 1, 1], ["norm-0", "norm-0"]),
    ]
    assert d.graph == "block"          # inp_noise_embd: a block's graph
    assert d.source["engine"] == "llama.cpp" and d.source["version"] == "unknown (imported)"
    imp = d.source["import"]
    assert imp["format"] == "eval-callback" and imp["file"] == "cb.txt"
    assert imp["printed"] == {"0": {"edge": None, "at": [0, 1], "values": ["1.0000", "2.0000"], "sum": "3.000000"}}
    assert import_format(d) == "eval-callback" and d.values_path is None and not d.settings["flash_attn"]


def test_eval_callback_graphs_split_at_trace_marks_and_at_other_log_text():
    node = cb_head("x", "f32", "ADD", ("a", [4, 1, 1, 1]), ("b", [4, 1, 1, 1]), [4, 1, 1, 1])
    enc = cb_head("enc_norm_out", "f32", "MUL", ("a", [4, 1, 1, 1]), ("b", [4, 1, 1, 1]), [4, 1, 1, 1])
    traced = import_text(f"graphgen trace: graph 00-inject\n{node}\n{node}\ngraphgen trace: graph 01-block\n{node}\n")
    assert [(d.graph, len(d.nodes)) for d in traced] == [("inject", 2), ("block", 1)]
    assert {d.source["engine"] for d in traced} == {"graphgen"}
    plain = import_text(f"{node}\n{node}\nllama_decode: next batch\n{enc}\n{node}\n")
    # kinds guessed from the names: enc_norm_out makes an encoder graph, nothing known an inject
    assert [(d.graph, len(d.nodes)) for d in plain] == [("inject", 2), ("encoder", 2)]
    assert [d.path.name for d in plain] == ["00-inject.json", "01-encoder.json"]
    assert [d.graph for d in import_text(f"{node}\n", graph="block")] == ["block"]


def test_eval_callback_sources_that_cannot_be_read_are_refused():
    with pytest.raises(ImportFormatError, match="cannot read the sources"):
        import_text(f"{CB}{'x':>24} = (f32)        ADD(a{{4, 1, 1, 1}} b{{4, 1, 1, 1}}) = {{4, 1, 1, 1}}\n",
                    fmt="eval-callback")


@pytest.mark.parametrize("ne, edge, want", [
    ([2, 1, 1, 1], None, [0, 1]),
    ([9, 1, 1, 1], 3, [0, 1, 2, 6, 7, 8]),
    ([6, 1, 1, 1], 3, [0, 1, 2, 3, 4, 5]),          # no longer than 2 * edge: all of it
    ([2, 7, 1, 1], 3, [0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13]),
    ([1, 1, 7, 1], 3, [0, 1, 2, 4, 5, 6]),            # planes: ne2, stride ne1 * ne0
    ([1, 2, 1, 2], 3, [0, 1, 2, 3]),                  # every ne3 slice
    ([2, 1, 1, 2], 1, [0, 1, 2, 3]),
])
def test_printed_positions(ne, edge, want):
    assert printed_positions(ne, edge) == want


def test_read_printed_finds_the_edge_and_the_positions():
    lines = ["    [", "        [",
             "            [      0.0000,       1.0000,       2.0000, ...,       6.0000,       7.0000,       8.0000],",
             "            [      9.0000,      10.0000,      11.0000, ...,      15.0000,      16.0000,      17.0000],",
             "        ],", "    ]", "    sum = 153.000000"]
    got = read_printed(lines, [9, 2, 1, 1])
    assert got["edge"] == 3 and got["at"] == [0, 1, 2, 6, 7, 8, 9, 10, 11, 15, 16, 17]
    assert got["values"] == ["0.0000", "1.0000", "2.0000", "6.0000", "7.0000", "8.0000",
                             "9.0000", "10.0000", "11.0000", "15.0000", "16.0000", "17.0000"]
    assert got["sum"] == "153.000000"
    # the same rows against another shape do not fit
    assert "do not fit ne [9, 3, 1, 1]" in read_printed(lines, [9, 3, 1, 1])["unreadable"]
    assert read_printed(["    [", "    ]"], [1, 1, 1, 1]) == {"unreadable": "no values printed"}
    assert "'abc'" in read_printed(["            [ abc ],"], [1, 1, 1, 1])["unreadable"]


def test_dot_file():
    (d,) = import_text(DOT, "g.dot")
    assert import_format(d) == "dot" and d.graph == "inject"
    assert [(n.index, n.name, n.op, n.type, n.ne, n.src) for n in d.nodes] == [
        (0, "mm", "MUL_MAT", "f32", [4, 2, 1, 1], ["w.weight", "inp"]),
        (1, "act", "UNARY", "f32", [4, 2, 1, 1], ["mm"]),
        (2, "act (reshaped)", "RESHAPE", "f32", [2, 2, 2, 1], ["act"]),
    ]
    with pytest.raises(ImportFormatError, match="cannot read the dot node label"):
        import_text(DOT.replace("|1 [4, 2] |", "|one|"))


def test_sched_debug_log():
    text = "\n".join([
        "graph_reserve: reserving a graph for ubatch with n_tokens = 4",
        "## SPLIT #0: CPU # 0 inputs",
        sched_line(0, "MUL_MAT", "reserved", ["w", "x"]),
        "## SPLIT #0: CPU # 0 inputs",
        sched_line(0, "GET_ROWS", "inp_embd", ["token_embd.weight", "inp_tokens"]),
        # index 1 (a view) is not printed
        sched_line(2, "RMS_NORM", "a_name_longer_than_twenty", ["CPU#inp_embd#0"]),
        sched_line(3, "MUL", "result_output", ["a_name_longer_than_twenty", "output_norm.weight"], backend="CUDA0"),
        # the index going back starts another graph
        sched_line(0, "ADD", "x", ["a", "b"]),
    ]) + "\n"
    first, second = import_text(text, "s.log")
    # the reserved graph is never computed: left out
    assert [(n.name, n.op, n.type, n.src) for n in first.nodes] == [
        ("inp_embd", "GET_ROWS", "?", ["token_embd.weight", "inp_tokens"]),
        ("a_name_longer_than_t", "RMS_NORM", "?", ["inp_embd"]),
        ("result_output", "MUL", "?", ["a_name_longer_than_t", "output_norm.weight"]),
    ]
    assert first.graph == "block" and second.graph == "inject"
    imp = first.source["import"]
    assert imp["backends"] == {"0": "CPU", "1": "CPU", "2": "CUDA0"}
    assert imp["unseen"] == {"indices": [1], "why": SCHED_UNSEEN_WHY}
    assert second.source["import"]["unseen"]["indices"] == []


def test_a_log_of_reserved_graphs_alone_keeps_them():
    text = "graph_reserve: x\n" + sched_line(0, "ADD", "x", ["a", "b"]) + "\n"
    (d,) = import_text(text)
    assert [n.name for n in d.nodes] == ["x"]


def full_nodes():
    return [Node(0, "inp_embd", "GET_ROWS", "f32", [8, 2, 1, 1], ["token_embd.weight", "inp_tokens"]),
            Node(1, "   padded", "SILU", "f32", [8, 2, 1, 1], ["inp_embd"]),
            Node(2, "node_2", "VIEW", "f32", [8, 1, 1, 1], ["   padded"], "   padded", 32),
            Node(3, "a_name_longer_than_twenty-0", "SWIGLU", "f32", [4, 2, 3, 1], ["node_2", "", "inp_embd"]),
            Node(4, "mm", "OUT_PROD", "f32", [8, 2, 1, 1], ["inp_embd", ""])]


def full_dump():
    from pathlib import Path

    from graphgen.dump.format import FORMAT, Dump
    return Dump(path=Path("00-block.json"), format=FORMAT, source={"engine": "graphgen", "version": "1"}, model="m",
                graph="block", settings={}, cpu_features={}, nodes=full_nodes())


def test_project_cuts_a_full_dump_as_each_format_shows_it():
    d = full_dump()
    cb = project(d, "eval-callback")
    assert [(n.name, n.src, n.view_src, n.view_offs) for n in cb.nodes] == [
        ("inp_embd", ["token_embd.weight", "inp_tokens"], None, 0), ("padded", ["inp_embd"], None, 0),
        ("node_2", ["   padded"], None, 0), ("a_name_longer_than_twenty-0", ["node_2"], None, 0),
        ("mm", ["inp_embd"], None, 0)]
    dot = project(d, "dot")
    assert [(n.op, n.ne) for n in dot.nodes] == [("GET_ROWS", [8, 2, 1, 1]), ("UNARY", [8, 2, 1, 1]),
                                                 ("VIEW", [8, 1, 1, 1]), ("GLU", [4, 2, 3, 1]), ("MUL_MAT", [8, 2, 1, 1])]
    sched = project(d, "sched-debug")
    assert [(n.index, n.name, n.op, n.src, n.type) for n in sched.nodes] == [
        (0, "inp_embd", "GET_ROWS", ["token_embd.weight", "inp_tokens"], "?"), (1, "padded", "SILU", ["inp_embd"], "?"),
        (2, "a_name_longer_than_t", "SWIGLU", ["node_2", "inp_embd"], "?"), (3, "mm", "OUT_PROD", ["inp_embd"], "?")]
    with pytest.raises(ValueError, match="unknown import format"):
        project(d, "csv")


def test_common_fields_cuts_both_sides_to_what_both_show():
    full = full_dump()
    assert common_fields(full, full) == (full, full, None)
    (imp,) = import_text(DOT)
    a, b, note = common_fields(full, imp)
    assert b.nodes == imp.nodes and [n.op for n in a.nodes][1] == "UNARY"
    assert note.startswith("compared on the fields dot shows (name, op, type, ne[:3], src)")
    sched = import_text(sched_line(0, "ADD", "x", ["a", "b"]) + "\n")[0]
    a, b, note = common_fields(imp, sched)
    assert "the fields both sched-debug and dot show" in note and "backend" not in note.split("(")[1]
    # sched-debug's cut first: the dot side's view (the reshape) gone, its types and shapes unknown
    assert [(n.name, n.op, n.type, n.ne[:3]) for n in a.nodes] == [("mm", "MUL_MAT", "?", [0, 0, 0]),
                                                                   ("act", "UNARY", "?", [0, 0, 0])]
    assert [n.name for n in b.nodes] == ["x"]


def test_import_file_and_write_imported(tmp_path):
    (tmp_path / "g.dot").write_text(DOT)
    dumps = import_file(tmp_path / "g.dot", graph="block")
    written = write_imported(dumps, tmp_path / "out")
    assert [p.name for p in written] == ["00-block.json"]
    (back,) = load_dump_dir(tmp_path / "out")
    assert [dataclasses.astuple(n) for n in back.nodes] == [dataclasses.astuple(n) for n in dumps[0].nodes]
    assert back.source["import"]["format"] == "dot" and back.source["import"]["file"] == str(tmp_path / "g.dot")
    with pytest.raises(ImportFormatError, match="absent.log: no such file"):
        import_file(tmp_path / "absent.log")
