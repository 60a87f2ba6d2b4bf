"""graphgen/cli/view.py: `graphgen view` (which graphs, where the pages go, never over a file it did
not write), `graphgen trace --dump` and `graphgen import` from the command line, and the helpers
view and diff share (telling a dump from other JSON, picking a graph, marking view's own files)."""

import json

import pytest

from conftest import REF_DIR
from graphgen.cli.view import _index_page, _marked, _pick, _view_wrote, is_dump_file, load_any
from graphgen.dump.format import DumpError

CASE = REF_DIR / "dflash-fa-off"


def test_a_dump_is_told_from_other_json_by_its_format_key(tmp_path):
    assert is_dump_file(CASE / "01-block.json")
    other = tmp_path / "r.json"
    other.write_text('{"accuracy": 0.9}')
    assert not is_dump_file(other)
    assert not is_dump_file(CASE / "01-block.npz") and not is_dump_file(tmp_path / "none.json")
    with pytest.raises(DumpError, match=r'r.json: not a graphgen dump \(no "format": "graphgen-dump/1" key\)'):
        load_any(other)
    with pytest.raises(DumpError, match="none: no such file or folder"):
        load_any(tmp_path / "none")
    assert [d.graph for d in load_any(CASE)] == ["inject", "block"]
    assert [d.graph for d in load_any(CASE / "00-inject.json")] == ["inject"]


@pytest.mark.parametrize("graph, stems", [(None, ["00-inject", "01-block"]), ("1", ["01-block"]),
                                          ("01", ["01-block"]), ("block", ["01-block"]),
                                          ("00-inject", ["00-inject"]), ("0", ["00-inject"])])
def test_pick_a_graph_by_index_kind_or_file(graph, stems):
    assert [d.path.stem for d in _pick(load_any(CASE), graph)] == stems


def test_pick_names_the_graphs_there_are():
    with pytest.raises(DumpError, match=r"no graph 'encoder' \(have 00-inject, 01-block\)"):
        _pick(load_any(CASE), "encoder")


def test_view_marks_its_files():
    assert _marked("dot", "digraph {}") == "// graphgen view\ndigraph {}"
    assert _marked("svg", '<?xml version="1.0"?>\n<svg/>') == '<?xml version="1.0"?>\n<!-- graphgen view -->\n<svg/>'
    assert _marked("html", "<!DOCTYPE html>\n<html/>") == "<!DOCTYPE html>\n<!-- graphgen view -->\n<html/>"
    assert _marked("html", "<html/>") == "<!-- graphgen view -->\n<html/>"


def test_index_page_links_each_page_escaped():
    page = _index_page("a<b", [("x 1.html", "inject & co"), ("y.html", "block")])
    assert "<title>a&lt;b</title>" in page and "<p>2 graphs, one page each:</p>" in page
    assert '<li><a href="x%201.html">x 1.html</a>: inject &amp; co</li>' in page


def test_one_dot_graph_goes_to_stdout(cli):
    r = cli("view", CASE, "--format", "dot", "--graph", "block")
    assert r.code == 0 and r.out.startswith("digraph") and "graphgen view" not in r.out


def test_pages_into_a_folder_replaced_only_where_view_wrote_them(cli, tmp_path):
    out = tmp_path / "v"
    out.mkdir()
    r = cli("view", CASE, "--format", "dot", "--out", out)
    assert r.code == 0, r.err
    pages = [out / "00-inject.dot", out / "01-block.dot"]
    assert r.out.splitlines() == [str(p) for p in pages]
    assert all(_view_wrote(p) and p.read_text().startswith("// graphgen view\ndigraph") for p in pages)
    assert cli("view", CASE, "--format", "dot", "--out", out).code == 0  # its own: replaced
    pages[1].write_text("mine")
    r = cli("view", CASE, "--format", "dot", "--out", out)
    assert r.code == 2 and "01-block.dot" in r.err and pages[1].read_text() == "mine"
    assert "digraph" in pages[0].read_text()
    assert cli("view", CASE, "--format", "dot", "--out", out, "--force").code == 0
    assert _view_wrote(pages[1])


def test_one_graph_to_a_named_file(cli, tmp_path):
    out = tmp_path / "b.svg"
    r = cli("view", CASE, "--format", "svg", "--graph", "01", "--out", out)
    assert r.code == 0, r.err
    text = out.read_text()
    assert text.startswith("<?xml") and "<!-- graphgen view -->" in text.splitlines()[1] and "<svg" in text


@pytest.mark.parametrize("argv, words", [
    (["--format", "dot"], "--out is needed for --format dot with several graphs"),
    (["--format", "html"], "--out is needed for --format html with several graphs"),
    (["--format", "html", "--graph", "block"], "--out is needed for --format html"),
    (["--format", "dot", "--out", "{tmp}/g.dot"], "names one .dot file and there are 2 graphs: give a folder"),
    (["--format", "explorer", "--out", "{notes}"], "exists and is not a folder (explorer writes a folder"),
    (["--rules", "r.json"], "--rules needs two dumps (view REF OURS)"),
    (["--format", "dot", "--graph", "1", "--layer", "7"], "no layer 7 in 01-block.json"),
    (["--format", "dot", "--graph", "1", "--around", "nosuch"], "01-block.json: no node named 'nosuch'"),
])
def test_view_refusals(argv, words, cli, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    r = cli("view", CASE, *[a.format(tmp=tmp_path, notes=notes) for a in argv])
    assert r.code == 2 and words in r.err and r.err.count("\n") == 1, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"] and notes.read_text() == "mine"


def test_two_sides_of_different_lengths_need_a_graph(cli):
    r = cli("view", CASE, REF_DIR / "dflash-encoder", "--format", "dot")
    assert r.code == 2 and "has 2 graphs" in r.err and "has 3; pick one with --graph" in r.err
    r = cli("view", CASE, REF_DIR / "dflash-encoder", "--format", "dot", "--graph", "block")
    assert r.code == 0 and r.out.startswith("digraph")


def test_trace_dumps_what_it_printed_and_import_reads_it_back(cli, tiny, tmp_path):
    r = cli("trace", tiny, "--dump", tmp_path / "d")
    assert r.code == 0, r.err
    assert r.out.count("graphgen trace: graph ") == 2
    (tmp_path / "t.txt").write_text(r.out)
    r = cli("import", tmp_path / "t.txt", "--out", tmp_path / "imp")
    assert r.code == 0, r.err
    n = [len(json.loads((tmp_path / "d" / f).read_text())["nodes"]) for f in ("00-inject.json", "01-block.json")]
    assert r.out.splitlines() == [
        f"{tmp_path / 'imp' / '00-inject.json'}: inject, {n[0]} nodes (eval-callback: name, op, type, ne, src[:2]; "
        f"printed values of {n[0]} nodes)",
        f"{tmp_path / 'imp' / '01-block.json'}: block, {n[1]} nodes (eval-callback: name, op, type, ne, src[:2]; "
        f"printed values of {n[1]} nodes)"]
    r = cli("diff", tmp_path / "imp", tmp_path / "d", "--quiet")
    assert (r.code, r.out) == (0, "2 graphs compared, 0 diverged\n")


def test_trace_refuses_a_bad_filter_before_running(cli, tiny, tmp_path):
    r = cli("trace", tiny, "--filter", "attn(", "--dump", tmp_path / "d")
    assert r.code == 2 and "bad --filter regex 'attn('" in r.err and r.out == ""
    assert not (tmp_path / "d").exists()
