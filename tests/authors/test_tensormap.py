"""The tensor map (graphgen/authors/tensormap.py): which llama.cpp node stands for which tensor of
the authors' forward, per variant and graph, its per-layer names, and the table docs/authors.md
shows. No torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphgen.authors.tensormap import ALL, TENSOR_MAP, MapEntry, entries, markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "authors.md"


def test_a_per_layer_node_is_named_once_per_layer():
    e = MapEntry("ffn_out-{il}", "layers.{il}.mlp", "block")
    assert e.names(3) == ["ffn_out-0", "ffn_out-1", "ffn_out-2"]
    assert e.names(0) == []
    assert MapEntry("result_norm", "norm", "block").names(5) == ["result_norm"]


def test_every_entry_is_found_as_the_comparison_can_find_it():
    assert ALL == ("dflash", "dflash2", "dspark")
    for e in TENSOR_MAP:
        assert e.graph in ("inject", "block") and set(e.variants) <= set(ALL), e
        assert e.select in ("name", "last", "last REPEAT", "lattice path") and e.kind in ("values", "tokens"), e
        # a node found by rule is said in brackets: llama.cpp leaves it unnamed
        assert (e.select == "name") == (not e.node.startswith("[")), e
    assert len({e.node for e in TENSOR_MAP}) == len(TENSOR_MAP)


def test_a_variant_has_its_heads_nodes_and_no_others():
    dflash = [e.node for e in entries("dflash")]
    dflash2 = [e.node for e in entries("dflash2")]
    dspark = [e.node for e in entries("dspark")]
    conv = ["attn_conv_in-{il}", "attn_conv_out-{il}", "ffn_conv_in-{il}", "ffn_conv_out-{il}"]
    assert all(n in dflash2 for n in conv + ["[selector path]"])
    assert not set(conv + ["[selector path]", "[drafted logits]", "[confidences]"]) & set(dflash)
    assert "[drafted logits]" in dspark and "[confidences]" in dspark and "[selector path]" not in dspark
    # the map's order is kept: the order the graph computes the nodes in
    assert dflash == [e.node for e in TENSOR_MAP if "dflash" in e.variants]
    assert dflash[:3] == ["inp_g_embeddings", "Kcur_injected-{il}", "Vcur_injected-{il}"]
    assert dflash[-2:] == ["result_norm", "result_output"]
    assert entries("lilicorr") == []


def test_a_graph_has_its_own_nodes():
    inject = entries("dspark", "inject")
    block = entries("dspark", "block")
    assert [e.node for e in inject] == ["inp_g_embeddings", "Kcur_injected-{il}", "Vcur_injected-{il}"]
    assert all(e.graph == "block" for e in block) and len(inject) + len(block) == len(entries("dspark"))
    assert [e.node for e in block][0] == "inp_noise_embd"
    assert [e for e in entries("dflash2", "block") if e.kind == "tokens"] == \
        [e for e in TENSOR_MAP if e.node == "[selector path]"]


def test_the_table_is_the_one_docs_authors_shows():
    table = markdown_table()
    rows = table.splitlines()
    assert rows[:2] == ["| llama.cpp node | authors' tensor | graph | variants |", "|---|---|---|---|"]
    assert len(rows) == 2 + len(TENSOR_MAP)
    assert rows[2] == ("| `inp_g_embeddings` | hidden_norm(fc(target_hidden)), the injected rows | inject | "
                       "dflash, dflash2, dspark |")
    assert rows[-1].startswith("| `[selector path]` |") and rows[-1].endswith("| block | dflash2 |")
    assert table in DOC.read_text()


@pytest.mark.parametrize("n_layer", [1, 2])
def test_per_layer_names_cover_each_layer_once(n_layer):
    names = [n for e in entries("dflash2", "block") for n in e.names(n_layer)]
    assert len(names) == len(set(names))
    assert sum(n.endswith(f"-{n_layer - 1}") for n in names) == sum("{il}" in e.node for e in entries("dflash2", "block"))
