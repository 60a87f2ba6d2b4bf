"""graphgen.compare.rules: automatic names normalized, rule files parsed (each error one line
naming the file and the rule), patterns matched, and the fields a rule forgives."""

import json

import pytest

from graphgen.compare.rules import (
    N_OP_PARAMS,
    RulesError,
    load_rules,
    normalize_name,
    parse_rules,
)
from graphgen.dump.format import Node


def node(name, op, params=None):
    return Node(0, name, op, "f32", [4, 1, 1, 1], op_params=params or [0] * N_OP_PARAMS)


@pytest.mark.parametrize("name, want", [
    ("node_12", "node_#"), ("leaf_3", "leaf_#"), ("node_12 (view)", "node_# (view)"),
    ("node_7 (reshaped) (permuted)", "node_# (reshaped) (permuted)"),
    ("cache_k_l0 (view) node_40", "cache_k_l0 (view) node_#"),
    # not automatic names: a word that ends in node, digits that run into letters, a plain name
    ("mynode_12", "mynode_12"), ("node_12x", "node_12x"), ("Qcur-0", "Qcur-0"), ("node_", "node_"),
])
def test_normalize_name(name, want):
    assert normalize_name(name) == want


def rule(**kw):
    return dict({"name": "r", "reason": "why", "ref": ["SWIGLU_CLAMP"], "ours": ["CLAMP", "SWIGLU"]}, **kw)


def test_a_rule_parsed_with_its_patterns():
    [r] = parse_rules({"rules": [rule(ref=[{"op": "SWIGLU_CLAMP", "name": r"ffn_swiglu-\d+"}],
                                      ours=["CLAMP", {"op": "SWIGLU"}])]})
    assert (r.name, r.reason) == ("r", "why")
    assert [p.op for p in r.ref] == ["SWIGLU_CLAMP"] and [p.op for p in r.ours] == ["CLAMP", "SWIGLU"]
    assert r.ours[1].name is None and r.fields == frozenset() and r.op_params_slots == frozenset()
    # the name regex must match the whole name, and the op must be the pattern's
    assert r.ref[0].matches(node("ffn_swiglu-3", "SWIGLU_CLAMP"))
    assert not r.ref[0].matches(node("ffn_swiglu-3 (copy)", "SWIGLU_CLAMP"))
    assert not r.ref[0].matches(node("ffn_swiglu-3", "SWIGLU"))
    assert r.ours[0].matches(node("anything", "CLAMP"))


def test_one_sided_rules_have_an_empty_side():
    [r] = parse_rules({"rules": [rule(ref=[], ours=["CONT"])]})
    assert r.ref == () and [p.op for p in r.ours] == ["CONT"]


@pytest.mark.parametrize("explains, fields, slots", [
    (["src", "type"], {"src", "type"}, set()),
    (["op_params[2]"], set(), {2}),
    (["op_params[1:4]"], set(), {1, 2, 3}),
    (["op_params"], set(), set(range(N_OP_PARAMS))),
    (["ne", "op_params[0]", "op_params[15:16]"], {"ne"}, {0, 15}),
])
def test_explains(explains, fields, slots):
    [r] = parse_rules({"rules": [rule(explains=explains)]})
    assert r.fields == frozenset(fields) and r.op_params_slots == frozenset(slots)


@pytest.mark.parametrize("doc, fragment", [
    ([], "expected an object with a list 'rules'"),
    ({"rules": {}}, "expected an object with a list 'rules'"),
    ({"rules": ["x"]}, "rules[0]: expected an object"),
    ({"rules": [rule(name="")]}, "rules[0]: 'name' must be a non-empty string"),
    ({"rules": [rule(extra=1)]}, "rule 'r': unknown key(s) extra"),
    ({"rules": [rule(reason=None)]}, "rule 'r': 'reason' must be a string"),
    ({"rules": [rule(ref="ADD")]}, "rule 'r': 'ref' must be a list of patterns"),
    ({"rules": [rule(ref=[], ours=[])]}, "rule 'r': 'ref' and 'ours' are both empty"),
    ({"rules": [rule(), rule()]}, "rule 'r': duplicate rule name"),
    ({"rules": [rule(ours=[""])]}, "rule 'r': ours[0]: expected an op name"),
    ({"rules": [rule(ours=[{"op": "ADD", "nom": "x"}])]}, "rule 'r': ours[0]: unknown key(s) nom"),
    ({"rules": [rule(ours=[{"name": "x"}])]}, "rule 'r': ours[0]: 'op' must be a non-empty string"),
    ({"rules": [rule(ref=[{"op": "ADD", "name": 3}])]}, "rule 'r': ref[0]: 'name' must be a regular expression"),
    ({"rules": [rule(ref=[{"op": "ADD", "name": "("}])]}, "rule 'r': ref[0]: bad 'name' regex '('"),
    ({"rules": [rule(ref=[], ours=["CONT"], explains=["src"])]}, "'explains' needs nodes on both sides"),
    ({"rules": [rule(explains="src")]}, "'explains' must be a list of field names"),
    ({"rules": [rule(explains=["colour"])]}, "explains[0] 'colour': expected one of name, op"),
    ({"rules": [rule(explains=["src", "op_params[16]"])]}, "explains[1] 'op_params[16]': op_params slots run from 0 to 15"),
    ({"rules": [rule(explains=["op_params[3:3]"])]}, "a range [a:b] needs a < b"),
    ({"rules": [rule(explains=["op_params[2:17]"])]}, "op_params slots run from 0 to 15"),
])
def test_malformed_rules_are_refused_in_one_line(doc, fragment):
    with pytest.raises(RulesError) as e:
        parse_rules(doc, "my.json")
    msg = str(e.value)
    assert msg.startswith("my.json: ") and fragment in msg and "\n" not in msg


def test_unexplained_forgives_what_the_rule_declares():
    [r] = parse_rules({"rules": [rule(explains=["type", "op_params[0]"])]})
    a, b = node("x", "SWIGLU_CLAMP", [7] + [1] + [0] * 14), node("y", "SWIGLU", [9] + [1] + [0] * 14)
    fields = {"op": ("SWIGLU_CLAMP", "SWIGLU"), "type": ("f32", "f16"), "ne": ([4], [8]), "name": ("x", "y"),
              "op_params": (a.op_params, b.op_params)}
    # op is part of any rule; type and slot 0 are declared; ne is not, nor the name (no regexes)
    assert r.unexplained(fields, a, b) == {"ne": ([4], [8]), "name": ("x", "y")}
    # a slot the rule does not declare still counts
    c = node("y", "SWIGLU", [9] + [2] + [0] * 14)
    assert set(r.unexplained({"op_params": (a.op_params, c.op_params)}, a, c)) == {"op_params"}


def test_a_name_difference_is_forgiven_when_both_outputs_name_a_pattern():
    named = rule(ref=[{"op": "ADD", "name": "a-.*"}], ours=[{"op": "ADD", "name": "b-.*"}])
    half = rule(name="h", ref=[{"op": "ADD", "name": "a-.*"}], ours=["ADD"])
    r, h = parse_rules({"rules": [named, half]})
    a, b = node("a-1", "ADD"), node("b-1", "ADD")
    assert r.unexplained({"name": ("a-1", "b-1")}, a, b) == {}
    assert h.unexplained({"name": ("a-1", "b-1")}, a, b) == {"name": ("a-1", "b-1")}


def test_load_rules_reads_a_file_and_names_it_in_errors(tmp_path):
    p = tmp_path / "rules.json"
    p.write_text(json.dumps({"rules": [rule()]}))
    assert [r.name for r in load_rules(p)] == ["r"]
    p.write_text('{"rules": [\n  {"name": }]}')
    with pytest.raises(RulesError, match=r"rules.json: invalid JSON at line 2, column 12"):
        load_rules(p)
    with pytest.raises(RulesError, match="absent.json: no such file"):
        load_rules(tmp_path / "absent.json")
    p.write_text(json.dumps({"rules": [rule(name="bad", ref=[], ours=[])]}))
    with pytest.raises(RulesError, match=f"^{p}: rule 'bad': "):
        load_rules(p)
