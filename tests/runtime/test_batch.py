"""graphgen.runtime.batch: a batch checked before its graph is built: positions, sequence ids,
the position rules llama.cpp's batch allocator applies against the KV cache, features, block
batches and a head's block rules, each refusal a BatchError naming the field."""

import numpy as np
import pytest

from graphgen.errors import BatchError
from graphgen.models.head import BlockRules
from graphgen.runtime import batch as B

I32 = np.int32
DFLASH2 = BlockRules("dflash2", equal_blocks=True, max_block=4)
DSPARK = BlockRules("dspark", equal_blocks=True)


def refused(fragment, fn, *args):
    with pytest.raises(BatchError) as e:
        fn(*args)
    assert fragment in str(e.value), str(e.value)


def test_positions_and_sequence_ids():
    assert B.check_positions(5, 3) == 5 and B.check_positions(np.int64(0), 1) == 0
    assert B.check_positions(B.POS_MAX - 2, 3) == B.POS_MAX - 2
    refused(f"block 2: position {B.POS_MAX + 1} is past the largest position {B.POS_MAX}",
            B.check_positions, B.POS_MAX - 1, 3, "block 2")
    refused("negative position -1", B.check_positions, -1, 2)
    refused("batch: position pos0 must be an integer, got True", B.check_positions, True, 1)
    refused("must be an integer, got 1.0", B.check_positions, 1.0, 1)
    assert B.check_seq(3, 4) == 3
    refused("sequence id 4 is outside [0, 4)", B.check_seq, 4, 4)
    refused("sequence id must be an integer", B.check_seq, "0", 4)


def test_check_batch():
    B.check_batch(np.arange(4), np.zeros(4, I32), 4, 1)
    refused("a batch needs at least one token", B.check_batch, np.zeros(0, I32), np.zeros(0, I32), 4, 1)
    refused("batch of 5 tokens is larger than n_ubatch 4", B.check_batch, np.arange(5), np.zeros(5, I32), 4, 1)
    refused("batch of 5 tokens is larger than n_batch 4 (-b)", B.check_batch, np.arange(5), np.zeros(5, I32), 4, 1,
            "n_batch 4 (-b)")
    refused("negative position -3", B.check_batch, np.array([0, -3]), np.zeros(2, I32), 4, 1)
    refused("sequence id 2 is outside [0, 2)", B.check_batch, np.arange(2), np.array([0, 2]), 4, 2)


def cache(last):
    return lambda s: last.get(s, -1)


@pytest.mark.parametrize("pos, seq, last, mrope, embd, fragment", [
    ([6, 7, 8], [0, 0, 0], {0: 5}, False, False, None),
    ([6, 6, 7], [0, 0, 0], {0: 5}, False, False, None),                      # a repeated position is fine
    ([0, 1, 0, 1], [0, 0, 1, 1], {}, False, False, None),
    ([7, 8], [0, 0], {0: 5}, False, False, "is X = 5 and the batch starts at position Y = 7"),
    ([3, 4], [0, 0], {0: 5}, False, False, "Y = X + 1 (remove the cache's later positions with seq_rm first)"),
    ([6, 8], [0, 0], {0: 5}, False, False, "sequence 0 positions are not continuous: the batch holds 2 distinct"),
    ([6, 7, 6], [0, 0, 0], {0: 5}, False, False, "batch row 2 has position 6 after position 7"),
    ([0, 1, 5, 4], [0, 0, 1, 1], {1: 3}, False, False, "sequence 1 positions are decreasing"),
    ([9, 20], [0, 0], {0: 5}, True, False, None),                            # M-RoPE may jump forward
    ([5], [0], {0: 5}, True, False, "with M-RoPE llama.cpp requires X < Y for a token batch"),
    ([5], [0], {0: 5}, True, True, None),
    ([4], [0], {0: 5}, True, True, "X <= Y for an embedding batch"),
    # an embedding batch may start at the cache's last position; what is wrong here is the order
    ([6, 5], [0, 0], {0: 5}, True, True, "sequence 0 positions are decreasing"),
])
def test_sequence_positions(pos, seq, last, mrope, embd, fragment):
    args = (np.array(pos), np.array(seq), cache(last), mrope, embd)
    if fragment is None:
        B.check_seq_positions(*args)
    else:
        refused(fragment, B.check_seq_positions, *args)


def test_the_lowest_sequence_is_named_first():
    with pytest.raises(BatchError, match="^sequence 1: "):
        B.check_seq_positions(np.array([9, 9]), np.array([2, 1]), cache({1: 3, 2: 3}), False, False)


def test_features():
    x = B.check_features([[1, 2], [3, 4]], 2)
    assert x.dtype == np.float32 and x.flags.c_contiguous and x.tolist() == [[1, 2], [3, 4]]
    refused("target features must be [n_tokens, 3] (len(target_layers) * n_embd), got shape [2, 2]",
            B.check_features, x, 3)
    refused("target features contain NaN or Inf", B.check_features, [[1.0, np.inf]], 2)
    refused("target features are not a numeric array", B.check_features, [["a", "b"]], 2)
    assert B.check_embd_state(None, 4, 2) is None
    assert B.check_embd_state(np.zeros((4, 2)), 4, 2).dtype == np.float32
    refused("embd_state must be [4, 2], got [3, 2]", B.check_embd_state, np.zeros((3, 2)), 4, 2)


def test_block_arrays():
    toks, pos, seq = B.block_arrays([(1, [7, 9], 6), (0, [3], 2)], None, 10)
    assert toks.tolist() == [7, 9, 3] and pos.tolist() == [6, 7, 2] and seq.tolist() == [1, 1, 0]
    assert toks.dtype == pos.dtype == seq.dtype == np.int32
    # a sequence may come twice
    assert B.block_arrays([(0, [1], 0), (0, [2], 1)], None, 10)[2].tolist() == [0, 0]
    refused("a block batch needs at least one", B.block_arrays, [], None, 10)
    refused("block 0 must be (seq, tokens, pos0)", B.block_arrays, [(0, [1])], None, 10)
    refused("token id 10 is outside the vocabulary [0, 10)", B.block_arrays, [(0, [1, 10], 0)], None, 10)
    refused("block 1: token must be an integer, got 1.5", B.block_arrays, [(0, [1], 0), (1, [1.5], 0)], None, 10)
    refused("block 0: negative position -1", B.block_arrays, [(0, [1], -1)], None, 10)


def test_a_heads_block_rules():
    even = [(0, [1, 2, 3, 4], 6), (1, [5, 6, 7, 8], 6)]
    assert B.block_arrays(even, DFLASH2, 10)[0].size == 8
    refused("a block batch of 7 tokens over 2 sequences (tokens per sequence [4, 3]) does not divide into equal "
            "blocks, which the dspark head needs", B.block_arrays, [(0, [1, 2, 3, 4], 6), (1, [5, 6, 7], 6)],
            DSPARK, 10)
    refused("blocks of 5 tokens are longer than the trained block size 4", B.block_arrays, [(0, [1] * 5, 6)],
            DFLASH2, 10)
    # a head without rules takes any split, any length
    assert B.block_arrays([(0, [1] * 5, 6), (1, [2], 6)], None, 10)[0].size == 6


def test_quick_blocks_takes_only_plainly_valid_batches():
    toks, pos, seq, runs = B.quick_blocks([(0, [7, 1], 6), (2, [3], 0)], None, 10, 8, 3)
    assert toks.tolist() == [7, 1, 3] and pos.tolist() == [6, 7, 0] and seq.tolist() == [0, 0, 2]
    assert runs == [(0, 6, 2), (2, 0, 1)]
    for blocks, rules, n_ubatch in (([(0, [7], 6), (0, [1], 7)], None, 8),    # a sequence twice
                                    ([(0, [10], 6)], None, 8),               # outside the vocabulary
                                    ([(3, [1], 6)], None, 8),                # outside n_seq
                                    ([(0, [1] * 9, 6)], None, 8),            # over n_ubatch
                                    ([(0, [1] * 3, 6), (1, [1] * 2, 6)], DSPARK, 8),
                                    ([(0, np.array([1]), 6)], None, 8), ([], None, 8)):
        assert B.quick_blocks(blocks, rules, 10, n_ubatch, 3) is None


def test_runs_follow_the_cache():
    assert B.runs_follow_cache([(0, 6, 4), (1, 0, 2)], cache({0: 5}), False, False)
    assert not B.runs_follow_cache([(0, 7, 4)], cache({0: 5}), False, False)
    assert B.runs_follow_cache([(0, 9, 1)], cache({0: 5}), True, False)
    assert not B.runs_follow_cache([(0, 5, 1)], cache({0: 5}), True, False)
    assert B.runs_follow_cache([(0, 5, 1)], cache({0: 5}), True, True)
