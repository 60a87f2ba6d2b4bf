"""graphgen.models.head: a head as one unit: how it is detected from a GGUF (a marker tensor, else
marker keys) and what it asks of a block batch."""

import pytest

from graphgen.models.arch import HEADS, HParams
from graphgen.models.head import BlockRules, Head


def head(**kw):
    return Head("h", "draft-h", object, **kw)


def test_a_marker_tensor_decides_alone():
    h = head(marker_tensor="markov_w1.weight", marker_keys=("dspark.key",))
    assert h.detects(["fc.weight", "markov_w1.weight"], {})
    # with a marker tensor, its keys are not asked
    assert not h.detects(["fc.weight"], {"dspark.key": 1})


def test_marker_keys_any_of_them():
    h = head(marker_keys=("a.key", "b.key"))
    assert h.detects([], {"b.key": 2}) and h.detects(["x"], ["a.key"])
    assert not h.detects(["a.key"], {"c.key": 1})
    # no marker at all: never detected (the plain head is the fallback, not a match)
    assert not head().detects(["markov_w1.weight"], {"a.key": 1})


@pytest.mark.parametrize("kw, block_size, want", [
    ({}, 4, BlockRules("h", False, 0)),
    ({"equal_blocks": True}, 4, BlockRules("h", True, 0)),
    ({"lattice_per_row": True}, 4, BlockRules("h", False, 4)),
    ({"equal_blocks": True, "lattice_per_row": True}, 16, BlockRules("h", True, 16)),
])
def test_block_rules(kw, block_size, want):
    assert head(**kw).block_rules(HParams(block_size=block_size)) == want


def test_what_each_shipped_head_asks_of_a_block():
    hp = HParams(block_size=4)
    rules = {name: h.block_rules(hp) for name, h in HEADS.items()}
    assert rules["dflash"] == BlockRules("dflash", False, 0)
    assert rules["dflash2"] == BlockRules("dflash2", True, 4)
    assert rules["dspark"].equal_blocks and rules["dspark"].max_block == 0
    assert rules["lilicorr"].max_block == 0
