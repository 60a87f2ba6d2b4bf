"""graphgen.models.tensors: one declaration per tensor: the loader's shapes and required names
(`shapes_of`, layer by layer then the tensors without one) and the attributes the graphs read
(`bind`)."""

from types import SimpleNamespace

from graphgen.models.arch import HParams
from graphgen.models.tensors import T, bind, shapes_of

DECLS = [
    T("norm", "output_norm.weight", lambda hp, x: (hp.n_embd,)),
    T("wq", "blk.{il}.attn_q.weight", lambda hp, x: (hp.n_embd, 2 * hp.n_embd)),
    T("sinks", "blk.{il}.attn_sinks.weight", lambda hp, x: (hp.n_head,), required=False),
    T("head", "output.weight", lambda hp, x: (hp.n_embd, x.n_vocab_draft), required=lambda hp: hp.n_vocab > 0),
]


def test_per_layer_is_the_il_placeholder():
    assert [d.per_layer for d in DECLS] == [False, True, True, False]


def test_shapes_layer_by_layer_then_the_rest():
    hp = HParams(n_embd=8, n_layer=2, n_head=2, n_vocab=0)
    shapes, required = shapes_of(DECLS, hp, SimpleNamespace(n_vocab_draft=100))
    assert list(shapes) == ["blk.0.attn_q.weight", "blk.0.attn_sinks.weight", "blk.1.attn_q.weight",
                            "blk.1.attn_sinks.weight", "output_norm.weight", "output.weight"]
    assert shapes["blk.1.attn_q.weight"] == (8, 16) and shapes["output.weight"] == (8, 100)
    # optional ones and those a callable says are not needed for these hparams are left out
    assert required == ["blk.0.attn_q.weight", "blk.1.attn_q.weight", "output_norm.weight"]
    hp.n_vocab = 256
    assert "output.weight" in shapes_of(DECLS, hp, SimpleNamespace(n_vocab_draft=100))[1]


def test_other_placeholders_and_chosen_layers():
    decls = [T("up", "blk.{bid}.ffn_up.weight", lambda hp, x: (hp.n_embd,)),
             T("proj", "scorer.layers.{i}.proj.weight", lambda hp, x: (2,))]
    shapes, required = shapes_of(decls, HParams(n_embd=4, n_layer=2), layers=[], bid=5, i=1)
    assert shapes == {"blk.5.ffn_up.weight": (4,), "scorer.layers.1.proj.weight": (2,)}
    assert required == list(shapes)
    shapes, _ = shapes_of(DECLS[1:2], HParams(n_embd=4, n_layer=5), layers=[3])
    assert list(shapes) == ["blk.3.attn_q.weight"]


def test_bind_sets_each_attribute_to_its_tensor_or_none():
    tensors = {"output_norm.weight": "N", "blk.1.attn_q.weight": "Q1", "blk.0.attn_q.weight": "Q0"}
    model, layer = SimpleNamespace(), SimpleNamespace()
    bind(model, DECLS, tensors)
    assert (model.norm, model.head) == ("N", None) and not hasattr(model, "wq")
    bind(layer, DECLS, tensors, il=1)
    assert (layer.wq, layer.sinks) == ("Q1", None) and not hasattr(layer, "norm")
    other = SimpleNamespace()
    bind(other, [T("up", "blk.{bid}.ffn_up.weight", lambda hp, x: ())], {"blk.7.ffn_up.weight": "U"}, bid=7)
    assert other.up == "U"
