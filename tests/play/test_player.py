"""The player (graphgen/play/player.py) on an engine that records what it is handed: one method per
step kind with one signature, the step's inputs drawn from the scenario's seed or beforehand, the
context rows a head's blocks carry, refusals named by their step, and the callbacks' order."""

import numpy as np
import pytest

from graphgen.play.player import Engine, draw_features, play, walk
from graphgen.play.scenario import parse_scenario

N_EMBD_INP, N_EMBD = 6, 4


def _scenario(embd_state=None):
    block = {"seq": 0, "tokens": [1, 2, 3], "pos0": 3}
    if embd_state:
        block["embd_state"] = embd_state
    return parse_scenario({
        "n_ctx": 32, "n_ubatch": 8, "n_seq": 2, "seed": 11,
        "steps": [
            {"inject": {"seq": 0, "pos0": 0, "n_tokens": 3}},
            {"inject": {"seq": 1, "pos0": 0, "n_tokens": 2}},
            {"block": {"seqs": [block, {"seq": 1, "tokens": [4, 5], "pos0": 2}]}},
            {"seq_rm": {"seq": 0, "p0": 3, "p1": -1}},
            {"block": {"seq": 0, "tokens": [6], "pos0": 3}},
        ]})


class Recording(Engine):
    """Every call as (kind, step index, inputs); an inject's context rows are its features' first
    N_EMBD columns, so the blocks' states can be checked against them."""

    n_embd_inp, n_embd = N_EMBD_INP, N_EMBD

    def __init__(self, carries_context=False, drop_row=None):
        self.carries_context = carries_context
        self.drop_row = drop_row
        self.calls = []

    def seq_rm(self, step, inputs):
        self.calls.append(("seq_rm", step.index, inputs))

    def encoder(self, step, inputs):
        self.calls.append(("encoder", step.index, inputs))
        return "encoded"

    def inject(self, step, inputs):
        self.calls.append(("inject", step.index, inputs))
        return inputs[:, :N_EMBD]

    def block(self, step, inputs):
        self.calls.append(("block", step.index, inputs))
        return f"block{step.index}"

    def context_rows(self, step, result):
        rows = list(result)
        if self.drop_row is not None and step.seq == 0:
            rows[self.drop_row] = None
        return rows


def test_each_step_goes_to_the_method_of_its_kind_with_its_inputs():
    sc = _scenario()
    eng = Recording()
    out = list(walk(sc, eng))
    assert [(k, i) for k, i, _ in eng.calls] == [("inject", 0), ("inject", 1), ("block", 2), ("seq_rm", 3), ("block", 4)]
    # graphs are numbered apart from steps: seq_rm builds none and yields nothing
    assert [(i, s.index, r is not None) for i, s, r in out] == [(0, 0, True), (1, 1, True), (2, 2, True), (3, 4, True)]
    for kind, index, inputs in eng.calls:
        if kind == "inject":
            np.testing.assert_array_equal(inputs, sc.features(sc.steps[index], N_EMBD_INP))
            assert inputs.shape == (sc.steps[index].n_tokens, N_EMBD_INP)
        else:
            assert inputs is None   # seq_rm, and blocks of an engine that carries no context


def test_features_drawn_beforehand_are_the_ones_the_player_would_draw():
    sc = _scenario()
    feats = draw_features(sc, N_EMBD_INP)
    assert sorted(feats) == [0, 1]
    a, b = Recording(), Recording()
    list(walk(sc, a))
    # a planted change shows that the drawn dict is what the engine gets
    feats[1] = feats[1] + 1
    list(walk(sc, b, features=feats))
    np.testing.assert_array_equal(a.calls[0][2], b.calls[0][2])
    np.testing.assert_array_equal(a.calls[1][2] + 1, b.calls[1][2])


def test_blocks_carry_the_row_before_them_when_the_engine_takes_context():
    sc = _scenario()
    eng = Recording(carries_context=True)
    list(walk(sc, eng))
    states = eng.calls[2][2]
    f0 = sc.features(sc.steps[0], N_EMBD_INP)[:, :N_EMBD]
    f1 = sc.features(sc.steps[1], N_EMBD_INP)[:, :N_EMBD]
    # seq 0's block at pos0 3 takes the row of pos 2, tiled over its 3 tokens; seq 1's (pos0 2) pos 1's
    np.testing.assert_array_equal(states[0], np.tile(f0[2], (3, 1)))
    np.testing.assert_array_equal(states[1], np.tile(f1[1], (2, 1)))
    # the second block (seq 0 at pos0 3 again) takes the same row: seq_rm does not drop context rows
    np.testing.assert_array_equal(eng.calls[4][2][0], np.tile(f0[2], (1, 1)))


def test_a_missing_row_leaves_the_whole_batch_without_states():
    eng = Recording(carries_context=True, drop_row=2)
    list(walk(_scenario(), eng))
    assert eng.calls[2][2] is None


def test_random_states_come_from_the_scenario_seed():
    sc = _scenario(embd_state="random")
    eng = Recording(carries_context=True)
    list(walk(sc, eng))
    np.testing.assert_array_equal(eng.calls[2][2][0], sc.random_state(sc.steps[2], 3, N_EMBD))


def test_a_refusal_names_its_step_once():
    class Refusing(Recording):
        def block(self, step, inputs):
            raise ValueError("the KV cache is full")
    with pytest.raises(ValueError) as e:
        list(walk(_scenario(), Refusing()))
    assert str(e.value) == "step 2 (block): the KV cache is full"
    assert e.value.step.index == 2


def test_callbacks_hear_of_every_step_and_after_stops_the_play():
    heard = []
    eng = Recording()
    done = play(_scenario(), eng, progress=lambda s: heard.append(("progress", s.index)),
                before=lambda i, s: heard.append(("before", i, s.index)),
                after=lambda i, s, r: heard.append(("after", i, r)) or i == 2)
    assert done is False
    assert heard == [("progress", 0), ("before", 0, 0), ("after", 0, heard[2][2]),
                     ("progress", 1), ("before", 1, 1), ("after", 1, heard[5][2]),
                     ("progress", 2), ("before", 2, 2), ("after", 2, "block2")]
    assert len(eng.calls) == 3   # stopped before the seq_rm and the last block
    assert play(_scenario(), Recording()) is True
