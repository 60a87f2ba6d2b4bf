"""graphgen.models.deepseek4: the DeepSeek-V4 pieces of the DSpark backbones (hyper-connection
mixes, pre, post and head collapse, the ratio-0 attention, its rope on the trailing dims) node for
node against the DeepSeek-V4 graphs llama.cpp b11739 dumped."""

import struct

import pytest

from .graphs import built, structure

HC = ("hc_mixes", "hc_pre", "hc_post", "hc_comb", "hc_attn_pre", "hc_ffn_pre", "hc_attn_post", "hc_ffn_post",
      "hc_head_mixes", "hc_head_pre")
ATTN = ("qr", "qr_norm", "q_norm", "q", "kv_norm", "kv", "attn_raw", "attn_derope", "attn_wo_a", "attn_out")


def base(name):
    return name.split(" ")[0].rsplit("-", 1)[0]


def named(nodes, names):
    return [n for n in nodes if base(n.name) in names]


def section(nodes, first, last):
    """From the first node named `first` to the first named `last` after it, both included."""
    names = [n.name for n in nodes]
    a = names.index(first)
    return nodes[a:names.index(last, a) + 1]


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    return built("dsv4-fa-off", tmp_path_factory.mktemp("dsv4"), models)["01-block.json"]


def test_hyper_connection_nodes(block):
    ours, ref = block
    assert len(named(ref, HC)) >= 20
    assert structure(named(ours, HC)) == structure(named(ref, HC))
    # inside the layers the fused ops, as upstream builds them by default
    fused = [(n.name, n.op) for n in ours if n.op.startswith("DSV4_HC_")]
    assert fused == [(n.name, n.op) for n in ref if n.op.startswith("DSV4_HC_")]
    assert {op for _, op in fused} == {"DSV4_HC_PRE", "DSV4_HC_COMB", "DSV4_HC_POST"}


@pytest.mark.parametrize("il", [0, 1])
def test_a_layers_mixes_pre_and_post(block, il):
    ours, ref = block
    for first, last in ((f"hc_mixes-{il}", f"hc_attn_pre-{il}"), (f"hc_attn_pre-{il}", f"hc_attn_post-{il}"),
                        (f"hc_attn_post-{il}", f"hc_ffn_pre-{il}")):
        assert structure(section(ours, first, last)) == structure(section(ref, first, last)), (first, last)


def test_the_head_collapse_is_the_unfused_chain(block):
    ours, ref = block
    got, want = section(ours, "hc_head_mixes", "result_norm"), section(ref, "hc_head_mixes", "result_norm")
    assert structure(got) == structure(want)
    assert not any(n.op.startswith("DSV4_HC_") for n in got)
    assert sum(n.op == "MUL" for n in got) >= 4      # one weighted stream per hyper-connection


def test_the_attention(block):
    ours, ref = block
    assert structure(named(ours, ATTN)) == structure(named(ref, ATTN))
    for il in (0, 1):
        got = section(ours, f"qr-{il}", f"attn_out-{il}")
        assert structure(got) == structure(section(ref, f"qr-{il}", f"attn_out-{il}"))
        # the softmax carries the attention sinks and a 1/sqrt(head) scale worked in float
        soft = next(n for n in got if n.op == "SOFT_MAX")
        assert soft.src[2] == f"blk.{il}.attn_sinks.weight"
        q = next(n for n in got if base(n.name) == "q" and n.op == "ROPE")
        head = q.ne[0]
        assert struct.unpack("<f", struct.pack("<i", soft.op_params[0]))[0] == \
            struct.unpack("<f", struct.pack("<f", 1.0 / head ** 0.5))[0]


def test_rope_on_the_trailing_dims_and_its_inverse(block):
    ours, ref = block
    ropes = [(n.name, n.op, n.op_params) for n in ours if n.op in ("ROPE", "ROPE_BACK")]
    assert ropes == [(n.name, n.op, n.op_params) for n in ref if n.op in ("ROPE", "ROPE_BACK")]
    assert {n for n, op, _ in ropes if op == "ROPE_BACK"} == {"attn_derope-0", "attn_derope-1"}
    # the offset slot (15) places the rotation on the last n_rot dims of each head
    q = next(n for n in ours if n.name == "q-0")
    assert q.op_params[15] == q.ne[0] - q.op_params[1]


def test_the_injection_writes_each_stages_roped_kv(tmp_path, models_dir):
    ours, ref = built("dsv4-fa-on", tmp_path, models_dir)["00-inject.json"]
    assert structure(ours) == structure(ref)
    assert [n.name for n in ours if n.op == "ROPE"] == ["kv_injected-0", "kv_injected-1"]
