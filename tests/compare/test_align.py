"""graphgen.compare.align: two node sequences lined up on (name, op) with automatic names equal,
unmatched regions resolved by the edit-distance search (a changed node paired, the rest inserted
or deleted, rules explaining runs), and the name-only fallback for regions too large to search."""

import pytest

import graphgen.compare.align as A
from graphgen.compare.align import align_nodes
from graphgen.compare.rules import parse_rules
from graphgen.dump.format import Node


def nodes(*spec):
    """Nodes from (name, op) pairs, indexed in order."""
    return [Node(k, name, op, "f32", [4, 1, 1, 1]) for k, (name, op) in enumerate(spec)]


BASE = [("inp", "GET_ROWS"), ("norm-0", "RMS_NORM"), ("node_2", "MUL"), ("Qcur-0", "MUL_MAT"),
        ("Kcur-0", "MUL_MAT"), ("kq-0", "MUL_MAT"), ("out", "ADD")]


def test_identical_sequences_pair_one_for_one():
    R, O = nodes(*BASE), nodes(*BASE)
    assert align_nodes(R, O, []) == [("pair", k, k) for k in range(len(BASE))]


def test_an_inserted_node_renumbers_automatic_names_and_they_still_pair():
    ours = BASE[:2] + [("extra", "CONT"), ("node_3", "MUL")] + BASE[3:]
    steps = align_nodes(nodes(*BASE), nodes(*ours), [])
    assert ("ins", 2, 2) in steps
    # node_2 in ref is node_3 in ours: the same node once automatic names are set aside
    assert ("pair", 2, 3) in steps
    assert [s for s in steps if s[0] != "pair"] == [("ins", 2, 2)]
    assert ("pair", 6, 7) in steps


def test_a_deleted_node_is_named_at_its_ref_position():
    ours = BASE[:4] + BASE[5:]
    steps = align_nodes(nodes(*BASE), nodes(*ours), [])
    assert [s for s in steps if s[0] != "pair"] == [("del", 4, 4)]
    assert ("pair", 5, 4) in steps and ("pair", 6, 5) in steps


def test_a_node_whose_op_changed_is_paired_as_changed_not_deleted_and_inserted():
    ours = list(BASE)
    ours[3] = ("Qcur-0", "MUL_MAT_ID")
    assert align_nodes(nodes(*BASE), nodes(*ours), []) == [("pair", k, k) for k in range(len(BASE))]


def test_a_node_renamed_with_the_same_op_is_paired_too():
    ours = list(BASE)
    ours[1] = ("attn_norm-0", "RMS_NORM")
    assert align_nodes(nodes(*BASE), nodes(*ours), []) == [("pair", k, k) for k in range(len(BASE))]


def test_a_node_with_another_name_and_op_is_deleted_and_inserted():
    ours = list(BASE)
    ours[1] = ("softcap", "TANH")
    steps = align_nodes(nodes(*BASE), nodes(*ours), [])
    # deleted at ref #1 (ours #1 follows), then inserted at ours #1 (ref #2 follows)
    assert steps == [("pair", 0, 0), ("del", 1, 1), ("ins", 2, 1)] + [("pair", k, k) for k in range(2, len(BASE))]


def test_a_rule_explains_a_fused_op_against_its_chain():
    ref = BASE[:5] + [("ffn_swiglu-0", "SWIGLU_CLAMP")] + BASE[5:]
    ours = BASE[:5] + [("node_5", "CLAMP"), ("node_6", "CLAMP"), ("ffn_swiglu-0", "SWIGLU")] + BASE[5:]
    [rule] = parse_rules({"rules": [{"name": "clamp", "reason": "fused", "ref": ["SWIGLU_CLAMP"],
                                     "ours": ["CLAMP", "CLAMP", "SWIGLU"]}]})
    steps = align_nodes(nodes(*ref), nodes(*ours), [rule])
    assert ("rule", rule, 5, 6, 5, 8) in steps
    assert [s for s in steps if s[0] not in ("pair", "rule")] == []
    assert ("pair", 6, 8) in steps and ("pair", 7, 9) in steps
    # without the rule the fused op pairs with the chain's last node (same name) and the CLAMPs are extra
    plain = align_nodes(nodes(*ref), nodes(*ours), [])
    assert ("pair", 5, 7) in plain and ("ins", 5, 5) in plain and ("ins", 5, 6) in plain


def test_a_one_sided_rule_takes_the_pass_through_nodes():
    ours = BASE[:3] + [("node_3", "CONT")] + BASE[3:]
    [rule] = parse_rules({"rules": [{"name": "cont", "reason": "extra copy", "ref": [], "ours": ["CONT"]}]})
    steps = align_nodes(nodes(*BASE), nodes(*ours), [rule])
    assert ("rule", rule, 3, 3, 3, 4) in steps
    assert [s for s in steps if s[0] not in ("pair", "rule")] == []


def test_a_one_for_one_rule_takes_a_matched_pair_to_the_search():
    # the same name and op on both sides, but a rule pairs them explicitly (it forgives a field)
    [rule] = parse_rules({"rules": [{"name": "view", "reason": "a view in one ggml", "ref": ["MUL"],
                                     "ours": ["MUL"], "explains": ["view_src"]}]})
    steps = align_nodes(nodes(*BASE), nodes(*BASE), [rule])
    assert ("rule", rule, 2, 3, 2, 3) in steps
    assert sum(s[0] == "pair" for s in steps) == len(BASE) - 1


def test_a_region_too_large_to_search_pairs_equal_names_only(monkeypatch):
    ref = [("a", "ADD"), ("b", "MUL"), ("c", "SUB"), ("d", "DIV")]
    ours = [("a", "ADD"), ("x", "MUL"), ("c", "NEG"), ("d", "DIV")]
    searched = align_nodes(nodes(*ref), nodes(*ours), [])
    assert searched == [("pair", k, k) for k in range(4)]   # b/x share the op, c the name: paired
    monkeypatch.setattr(A, "MAX_DP_CELLS", 1)
    fallback = align_nodes(nodes(*ref), nodes(*ours), [])
    # by name alone: c pairs (its op differs), b and x do not
    assert fallback == [("pair", 0, 0), ("del", 1, 1), ("ins", 2, 1), ("pair", 2, 2), ("pair", 3, 3)]


@pytest.mark.parametrize("ref_len, ours_len", [(0, 3), (3, 0)])
def test_an_empty_side_is_all_inserted_or_deleted(ref_len, ours_len):
    steps = align_nodes(nodes(*BASE[:ref_len]), nodes(*BASE[:ours_len]), [])
    assert [s[0] for s in steps] == (["ins"] * ours_len if ours_len else ["del"] * ref_len)
