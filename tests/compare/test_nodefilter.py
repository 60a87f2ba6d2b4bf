"""graphgen.compare.nodefilter: `-o OP` / `--name REGEX` node filters and threshold files."""

import json
import math

import pytest

from graphgen.dump.format import Node
from graphgen.compare.nodefilter import FilterError, NodeFilter, known_ops, load_thresholds, parse_thresholds


def node(name, op):
    return Node(index=0, name=name, op=op, type="f32", ne=[4, 1, 1, 1])


NODES = [node("ffn_out-1", "ADD"), node("Qcur-0", "MUL_MAT"), node("kq-0", "MUL_MAT"),
         node("kq_soft_max-0", "SOFT_MAX"), node("node_7", "SILU")]


def picked(f):
    return [n.name for n in NODES if f(n)]


def test_an_empty_filter_selects_every_node():
    """No -o and no --name: inactive, every node selected, nothing spelled."""
    f = NodeFilter.build()
    assert not f.active
    assert picked(f) == [n.name for n in NODES]
    assert str(f) == ""
    assert not NodeFilter.build([], []).active


def test_ops_are_comma_separated_case_blind_and_any_of():
    """-o takes ops separated by commas, spaces around them and case aside; a node with any of them is kept."""
    f = NodeFilter.build(ops=["mul_mat, Soft_Max"])
    assert f.active
    assert f.ops == frozenset({"MUL_MAT", "SOFT_MAX"})
    assert picked(f) == ["Qcur-0", "kq-0", "kq_soft_max-0"]


def test_several_o_flags_add_up():
    """Each -o adds its ops to the others'."""
    f = NodeFilter.build(ops=["ADD", "silu"])
    assert picked(f) == ["ffn_out-1", "node_7"]
    assert str(f) == "-o ADD,SILU"


@pytest.mark.parametrize("text, bad", [("MUL-MAT", "MUL-MAT"), ("ADD,", ""), ("1ADD", "1ADD"),
                                       ("ADD,SOFT MAX", "SOFT MAX")])
def test_a_malformed_op_is_refused_naming_the_flag(text, bad):
    """An op that is not an identifier (an empty one after a comma too) is refused, naming -o and the op."""
    with pytest.raises(FilterError) as e:
        NodeFilter.build(ops=[text])
    assert str(e.value).startswith(f"-o {text}: '{bad}' is not an op name")


def test_names_are_searched_anywhere_and_any_of():
    """--name patterns are searched anywhere in the name; a node matching any of them is kept."""
    f = NodeFilter.build(names=["soft", r"^ffn"])
    assert picked(f) == ["ffn_out-1", "kq_soft_max-0"]
    assert picked(NodeFilter.build(names=[r"-0$"])) == ["Qcur-0", "kq-0", "kq_soft_max-0"]


def test_ops_and_names_must_both_hold():
    """With -o and --name, a node is kept when its op is listed and its name matches."""
    f = NodeFilter.build(ops=["MUL_MAT"], names=["^kq"])
    assert picked(f) == ["kq-0"]
    assert str(f) == "-o MUL_MAT --name ^kq"


def test_spelled_lists_ops_sorted_and_deduplicated():
    """The filter reads back as flags: ops sorted once each, then each --name."""
    f = NodeFilter.build(ops=["soft_max,ADD", "add"], names=["a", "b"])
    assert f.spelled == ["-o ADD,SOFT_MAX", "--name a", "--name b"]


def test_a_bad_regular_expression_is_refused_naming_the_flag():
    """An invalid --name pattern is a FilterError naming --name and the pattern."""
    with pytest.raises(FilterError) as e:
        NodeFilter.build(names=["ok", "ffn_(out"])
    assert str(e.value).startswith("--name 'ffn_(out': not a regular expression")


def test_known_ops_hold_ops_unary_and_glu_names():
    """ggml's ops, unary ops and GLU ops by their own names; not the UNARY/GLU wrappers nor counts."""
    ops = known_ops()
    assert {"MUL_MAT", "SOFT_MAX", "ADD", "ROPE", "FLASH_ATTN_EXT", "SILU", "GELU", "SWIGLU", "GEGLU"} <= ops
    assert not {"UNARY", "GLU", "COUNT"} & ops
    assert not any(k.endswith("_COUNT") or k.startswith("GGML_") for k in ops)


def test_thresholds_by_op_type_and_default():
    """Op, type and default keys map to floats; an int or zero or infinity is a bound too."""
    got = parse_thresholds({"MUL_MAT": 5e-4, "SWIGLU": 1, "f16": 1e-5, "i32": 0, "default": 1e-7,
                            "SOFT_MAX": math.inf}, "here")
    assert got == {"MUL_MAT": 5e-4, "SWIGLU": 1.0, "f16": 1e-5, "i32": 0.0, "default": 1e-7,
                   "SOFT_MAX": math.inf}
    assert all(type(v) is float for v in got.values())


@pytest.mark.parametrize("key, near", [("MULMAT", "MUL_MAT"), ("mul_mat", "MUL_MAT"), ("F16", "f16"),
                                       ("SOFTMAX", "SOFT_MAX"), ("Default", "default"),
                                       ("soft max", "SOFT_MAX"), ("BF16", "bf16")])
def test_an_unknown_key_is_refused_naming_the_nearest(key, near):
    """A key that is no op, type or 'default' is refused; the message names it and the nearest valid key."""
    with pytest.raises(FilterError) as e:
        parse_thresholds({"ADD": 1e-6, key: 1e-4}, "--thresholds t.json")
    msg = str(e.value)
    assert msg.startswith(f"--thresholds t.json: key '{key}' is neither a ggml op")
    assert msg.endswith(f"; did you mean '{near}'?")


def test_an_unknown_key_far_from_any_is_refused_without_a_guess():
    """An unknown key like nothing valid is refused with no suggestion."""
    with pytest.raises(FilterError) as e:
        parse_thresholds({"QQQQQQQQQQQQ": 1e-4}, "w")
    assert "key 'QQQQQQQQQQQQ'" in str(e.value)
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize("value", [-1e-9, True, False, "1e-4", None, math.nan, [1e-4]])
def test_a_bound_must_be_a_non_negative_number(value):
    """Negative, NaN, boolean, string, null and list bounds are refused, naming the key."""
    with pytest.raises(FilterError) as e:
        parse_thresholds({"MUL_MAT": value}, "w")
    assert str(e.value).startswith("w: 'MUL_MAT' must be a non-negative number")


@pytest.mark.parametrize("doc", [{}, [], ["MUL_MAT"], 1e-4, None])
def test_a_threshold_document_must_be_a_non_empty_object(doc):
    """Anything but a non-empty JSON object is refused."""
    with pytest.raises(FilterError, match="^w: expected a JSON object"):
        parse_thresholds(doc, "w")


def test_load_thresholds_reads_a_file(tmp_path):
    """A JSON file is read and checked like a document, errors naming the flag and the file."""
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"MUL_MAT": 5e-4, "default": 1e-7}))
    assert load_thresholds(p) == {"MUL_MAT": 5e-4, "default": 1e-7}
    p.write_text(json.dumps({"MULMA": 5e-4}))
    with pytest.raises(FilterError, match=rf"^--thresholds {p}: key 'MULMA'.*did you mean 'MUL_MAT'"):
        load_thresholds(p)


def test_load_thresholds_refuses_a_missing_or_invalid_file(tmp_path):
    """A missing file and a file that is not JSON are FilterErrors, one line each."""
    with pytest.raises(FilterError, match="no such file"):
        load_thresholds(tmp_path / "absent.json")
    p = tmp_path / "bad.json"
    p.write_text('{"MUL_MAT": 5e-4,\n')
    with pytest.raises(FilterError, match="not valid JSON") as e:
        load_thresholds(p)
    assert "\n" not in str(e.value)
