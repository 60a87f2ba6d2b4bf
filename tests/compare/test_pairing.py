"""graphgen.compare.pairing: the two sides of a diff loaded (folders, dump files, imported logs),
their graphs paired by kind and step, graphs without a partner reported, and each pair diffed."""

import json
import shutil

import pytest
from conftest import REF_DIR

from graphgen.compare.importers import ImportFormatError
from graphgen.compare.nodefilter import FilterError, NodeFilter
from graphgen.compare.pairing import diff_paths, load_side, pair_graphs
from graphgen.compare.probe import ProbeError, parse_target
from graphgen.compare.report import exit_code
from graphgen.dump.format import DumpError, load_dump

ENC = REF_DIR / "dflash-encoder"     # 00-encoder, 01-inject, 02-block
PLAIN = REF_DIR / "dflash-fa-off"    # 00-inject, 01-block


def folder(tmp_path, name, files):
    """A dump folder holding `files` ({new name: (case folder, old name)}), values and all."""
    d = tmp_path / name
    d.mkdir()
    for new, (case, old) in files.items():
        for ext in (".json", ".npz"):
            shutil.copy(case / (old + ext), d / (new + ext))
    return d


def test_load_side_reads_folders_dump_files_and_imports(tmp_path):
    assert [d.graph for d in load_side(ENC)] == ["encoder", "inject", "block"]
    assert [d.graph for d in load_side(ENC / "02-block.json")] == ["block"]
    log = tmp_path / "cb.txt"
    log.write_text("common_debug_cb_eval:                        x = (f32)        ADD(a{4, 1, 1, 1}, "
                   "b{4, 1, 1, 1}}) = {4, 1, 1, 1}\n")
    [imp] = load_side(log)
    assert imp.source["import"]["format"] == "eval-callback"
    other = tmp_path / "rules.json"
    other.write_text(json.dumps({"rules": []}))
    with pytest.raises(DumpError, match="rules.json: not a graphgen dump"):
        load_side(other)
    with pytest.raises(DumpError, match="absent: no such file or folder"):
        load_side(tmp_path / "absent")
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(ImportFormatError):
        load_side(tmp_path / "notes.txt")


def test_graphs_pair_by_kind_and_step():
    refs, ours = load_side(ENC), load_side(PLAIN)
    pairs, lone_ref, lone_ours = pair_graphs(refs, ours)
    # inject #0 and block #0 pair across the two folders, whatever their places; the encoder has none
    assert [(r.path.name, o.path.name) for r, o in pairs] == [("01-inject.json", "00-inject.json"),
                                                            ("02-block.json", "01-block.json")]
    assert [d.path.name for d in lone_ref] == ["00-encoder.json"] and lone_ours == []
    # the second block of one side goes with the second of the other
    blocks = [load_dump(PLAIN / "01-block.json"), load_dump(ENC / "02-block.json")]
    pairs, lone_ref, lone_ours = pair_graphs(blocks, [blocks[1]])
    assert [(r.path.parent.name, o.path.parent.name) for r, o in pairs] == [("dflash-fa-off", "dflash-encoder")]
    assert [d.path.parent.name for d in lone_ref] == ["dflash-encoder"]


def test_two_single_graphs_pair_whatever_their_kinds():
    a, b = load_dump(ENC / "00-encoder.json"), load_dump(PLAIN / "01-block.json")
    assert pair_graphs([a], [b]) == ([], [a], [b])
    assert pair_graphs([a], [b], single=True) == ([(a, b)], [], [])


def test_identical_folders(tmp_path):
    results = diff_paths(PLAIN, folder(tmp_path, "ours", {"00-inject": (PLAIN, "00-inject"),
                                                         "01-block": (PLAIN, "01-block")}))
    assert [r.graph for r in results] == ["inject", "block"] and exit_code(results) == 0
    assert all(r.status == "IDENTICAL" and r.numeric for r in results)


def test_a_graph_without_a_partner_fails_where_it_would_have_been_compared(tmp_path):
    ours = folder(tmp_path, "ours", {"00-inject": (ENC, "01-inject"), "01-block": (ENC, "02-block")})
    results = diff_paths(ENC, ours)
    assert [(r.graph, r.status) for r in results] == [("encoder", "NO PARTNER"), ("inject", "IDENTICAL"),
                                                       ("block", "IDENTICAL")]
    lone = results[0]
    assert lone.unpaired == "ref" and lone.ours_path is None and exit_code(results) == 1
    assert "ref 00-encoder.json (encoder #0) has no partner in" in lone.notes[0]
    # the other way round: ours's encoder is the lone one, placed after ref's graphs
    back = diff_paths(ours, ENC)
    assert [(r.graph, r.unpaired) for r in back] == [("inject", None), ("block", None), ("encoder", "ours")]


def test_one_file_against_a_folder_names_the_rest_in_a_note():
    results = diff_paths(ENC / "02-block.json", ENC)
    assert [(r.graph, r.status) for r in results] == [("block", "IDENTICAL")]
    assert exit_code(results) == 0
    assert ("not compared, the other side being one graph: ours 00-encoder.json (encoder #0), "
            "ours 01-inject.json (inject #0)") in results[0].notes


def test_two_files_of_other_kinds_pair_as_the_user_asked():
    [r] = diff_paths(ENC / "00-encoder.json", PLAIN / "01-block.json")
    assert r.unpaired is None and r.status == "DIVERGED" and r.structural


def test_progress_says_which_pair_and_how_far():
    seen = []
    diff_paths(PLAIN, PLAIN, progress=lambda k, n, name, detail: seen.append((k, n, name, detail)))
    assert (1, 2, "00-inject.json / 00-inject.json", "") in seen
    assert (2, 2, "01-block.json / 01-block.json", "") in seen
    assert any(k == 2 and d.startswith("values ") for k, _, _, d in seen)


def test_at_and_a_filter_must_find_something(tmp_path):
    results = diff_paths(PLAIN, PLAIN, at=[parse_target("kq-0")])
    assert any(p["name"] == "kq-0" for r in results for p in r.probes)
    with pytest.raises(ProbeError, match="--at no_such_node: no such node in either side"):
        diff_paths(PLAIN, PLAIN, at=[parse_target("no_such_node")])
    with pytest.raises(ProbeError, match="--at ours#9999: no such node in ours"):
        diff_paths(PLAIN, PLAIN, at=[parse_target("ours#9999")])
    with pytest.raises(FilterError, match="selects no node of any graph compared"):
        diff_paths(PLAIN, PLAIN, select=NodeFilter.build(ops=["CONV_3D"]))
    results = diff_paths(PLAIN, PLAIN, select=NodeFilter.build(ops=["SOFT_MAX"]))
    assert all(n.op == "SOFT_MAX" for r in results for n in [load_dump(r.ref_path).nodes[x.ref_index]
                                                              for x in r.numeric])


def test_rules_and_thresholds_reach_the_diff(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text("{")
    from graphgen.compare.rules import RulesError
    with pytest.raises(RulesError, match="invalid JSON"):
        diff_paths(PLAIN, PLAIN, rules_path=rules)
    with pytest.raises(DumpError, match="no such file or folder"):
        diff_paths(PLAIN, tmp_path / "absent")
    # a loose bound changes nothing between equal sides, and show_layers is carried to the result
    results = diff_paths(PLAIN, PLAIN, nmse=1.0, show_layers=True)
    assert all(r.show_layers and r.identical for r in results)
