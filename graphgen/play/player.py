"""One scenario, every engine: the step dispatch, written once.

A scenario is a list of steps: inject and encoder (target features into the draft's cache), block
(one noise block per sequence, in one batch) and seq_rm. `walk` plays it on any `Engine` as
torch.fx's Interpreter runs a graph: each step goes to the engine's method of the step's kind, all
of one signature, `method(step, inputs)`. The player draws each step's inputs from the scenario's
seed (or takes them drawn beforehand, so a timed loop pays no draw), names the step in any refusal,
keeps the context rows a head's blocks carry as their state (LiliCorr: h_nextn of the row before
the block, or rows drawn from the seed) and tells the caller before and after each graph.

The engines: graphgen's Session (`SessionEngine`, below: dumps, trace, check-batch and bench drive
it), b11739's context in the reference runner's child process (`reference/runner.py`) and in the
bench's worker (`reference/bench_worker.py`), and the authors' PyTorch model (`authors/forward.py`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np

from .scenario import Scenario


@contextlib.contextmanager
def naming_step(step):
    """A refusal raised while a scenario's step runs (a batch too large, a KV cache full) says
    which step, its index and kind, first; `e.step` holds it."""
    try:
        yield
    except Exception as e:
        if getattr(e, "step", None) is None and e.args and isinstance(e.args[0], str):
            e.args = (f"step {step.index} ({step.kind}): {e.args[0]}",) + e.args[1:]
            e.step = step
        raise


class Engine:
    """What `walk` drives: one method per step kind, each `(step, inputs)`. `inputs`: the step's
    features ([tokens, n_embd_inp]) for inject and encoder, one [tokens, n_embd] state per block
    or None for block (a head that carries none, or a block whose row is missing: the batch then
    goes without, as llama.cpp refuses a batch where only some tokens carry one), None for seq_rm.
    `n_embd_inp`: the width of injected features; `n_embd`: the width of a context row;
    `carries_context`: whether the draft's blocks take the context row before them as their state."""

    n_embd_inp: int
    n_embd: int
    carries_context: bool = False

    def seq_rm(self, step, inputs: None) -> None:
        raise NotImplementedError

    def encoder(self, step, inputs: np.ndarray) -> Any:
        raise NotImplementedError

    def inject(self, step, inputs: np.ndarray) -> Any:
        raise NotImplementedError

    def block(self, step, inputs: list[np.ndarray] | None) -> Any:
        raise NotImplementedError

    def context_rows(self, step, result) -> list | np.ndarray | None:
        """The context rows an inject step left (one per token, a row may be None), or None."""
        return None


def draw_features(scenario: Scenario, n_embd_inp: int) -> dict[int, np.ndarray]:
    """Every inject and encoder step's features, drawn beforehand (step index -> rows)."""
    return {s.index: np.ascontiguousarray(scenario.features(s, n_embd_inp))
            for s in scenario.steps if s.kind in ("inject", "encoder")}


def block_states(scenario: Scenario, step, context: dict, engine: Engine) -> list[np.ndarray] | None:
    if not engine.carries_context:
        return None
    rows = []
    for b in step.blocks:
        if b.embd_state == "random":
            rows.append(scenario.random_state(step, len(b.tokens), engine.n_embd))
        else:
            row = context.get((b.seq, b.pos0 - 1))
            rows.append(None if row is None else np.tile(row, (len(b.tokens), 1)))
    return None if any(r is None for r in rows) else rows


def walk(scenario: Scenario, engine: Engine, *, features: dict | None = None, progress: Callable | None = None,
         before: Callable | None = None) -> Iterator[tuple[int, Any, Any]]:
    """Run the steps one graph at a time: yields (index, step, result) after each graph (every
    step but seq_rm), numbered from 0. `features`: draw_features' rows, else drawn step by step;
    `progress(step)` hears of every step, `before(index, step)` of each graph before it runs."""
    context: dict[tuple[int, int], np.ndarray] = {}
    index = 0
    for step in scenario.steps:
        if progress:
            progress(step)
        graph = step.kind != "seq_rm"
        if graph and before:
            before(index, step)
        with naming_step(step):
            if not graph:
                inputs = None
            elif step.kind == "block":
                inputs = block_states(scenario, step, context, engine)
            elif features is not None:
                inputs = features[step.index]
            else:
                inputs = scenario.features(step, engine.n_embd_inp)
            result = getattr(engine, step.kind)(step, inputs)
        if not graph:
            continue
        if step.kind == "inject" and engine.carries_context:
            rows = engine.context_rows(step, result)
            for i, row in enumerate(rows if rows is not None else ()):
                if row is not None:
                    context[(step.seq, step.pos0 + i)] = row
        yield index, step, result
        index += 1


def play(scenario: Scenario, engine: Engine, *, progress: Callable | None = None,
         before: Callable | None = None, after: Callable | None = None) -> bool:
    """Run every step on `engine` (`walk`); `after(index, step, result)` hears of each graph once
    it ran, and returning True stops the walk. Returns False when stopped so, True when every
    step ran."""
    for index, step, result in walk(scenario, engine, progress=progress, before=before):
        if after and after(index, step, result):
            return False
    return True


class SessionEngine(Engine):
    """graphgen's engine: a Session; `recorder`, when set, records the next graph's nodes."""

    def __init__(self, sess):
        self.sess = sess
        hp = sess.hparams
        self.n_embd_inp, self.n_embd = hp.n_embd_inp_enc, hp.n_embd
        self.carries_context = bool(sess.model.head.context_rows)
        self.recorder = None

    def seq_rm(self, step, inputs) -> None:
        self.sess.seq_rm(step.seq, step.pos0, step.p1)

    def encoder(self, step, features):
        return self.sess.encode(features, step.pos0, step.seq, recorder=self.recorder)

    def inject(self, step, features):
        return self.sess.inject(features, step.pos0, step.seq, recorder=self.recorder)

    def block(self, step, states):
        return self.sess.block_multi([(b.seq, b.tokens, b.pos0) for b in step.blocks], recorder=self.recorder,
                                     embd_state=None if states is None else np.concatenate(states))

    def context_rows(self, step, result):
        return result.h_nextn
