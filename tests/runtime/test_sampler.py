"""llama.cpp's default sampler chain against a float64 reading of its rules, and the target's loop
without a draft (graphgen/runtime/sampler.py) on a decode whose answers are known."""

import numpy as np

from graphgen.runtime.mt19937 import MT19937, uniform_real
from graphgen.runtime.sampler import MIN_P, TOP_K, TOP_P, TargetSampler, best_ids, run_alone


def _chain_reference(ids, logits, temp, rng):
    """llama.cpp's default chain read from its rules, in float64: top-k, top-p at temperature 1,
    min-p relative to the best probability, the temperature, a draw."""
    lg = np.asarray(logits[:TOP_K], dtype=np.float64)
    p = np.exp(lg - lg.max())
    p /= p.sum()
    keep = int(np.searchsorted(np.cumsum(p), TOP_P - 1e-7) + 1)
    lg = lg[:keep]
    p = np.exp(lg - lg.max())
    p /= p.sum()
    n = max(1, int(np.sum(p >= MIN_P * p.max() * (1 - 1e-6))))
    lg = lg[:n]
    q = np.exp((lg - lg.max()) / temp)
    q /= q.sum()
    u = uniform_real(rng, 0.0, 1.0)
    return int(ids[int(np.searchsorted(np.cumsum(q), u, side="right"))]) if u < q.sum() else int(ids[n - 1]), n


def test_the_sampler_chain_follows_its_rules():
    gen = np.random.default_rng(0)
    counts = []
    for trial in range(300):
        ids = gen.permutation(1000)[:64].astype(np.int32)
        logits = np.sort(gen.standard_normal(64).astype(np.float32) * gen.uniform(0.3, 6))[::-1].copy()
        temp = float(gen.uniform(0.1, 2.0))
        s = TargetSampler(temp, trial)
        want, n = _chain_reference(ids, logits, temp, MT19937(trial))
        got = s.sample(ids, logits)
        counts.append(n)
        assert got == want, (trial, temp, n)
    # the draws covered one candidate left and many
    assert min(counts) == 1 and max(counts) >= 10
    # temperature 0 is greedy: the first of the best
    assert TargetSampler(0.0, 1).sample(np.array([5, 3, 9]), np.array([2.0, 2.0, 1.0], dtype=np.float32)) == 5


def _counting_decode(n_vocab, calls):
    """A target whose best token after t is t + 1 (mod n_vocab), the next best t + 2: rows are
    (seq, token, pos); every call is recorded."""
    def decode(rows):
        calls.append([(s, t, p) for s, t, p in rows])
        ids = np.array([[(t + 1) % n_vocab, (t + 2) % n_vocab] for _, t, _ in rows], dtype=np.int32)
        top = np.tile(np.array([2.0, 1.0], dtype=np.float32), (len(rows), 1))
        return ids, top
    return decode


def test_the_target_alone_decodes_the_prompts_at_once_then_one_row_per_sequence():
    calls = []
    prompts = {0: [3, 4, 5], 2: [7]}
    toks, times, trace = run_alone(_counting_decode(50, calls), lambda t: False, prompts, 4, temp=0.0, seed=0)
    assert toks == {0: [3, 4, 5, 6, 7, 8, 9], 2: [7, 8, 9, 10, 11]}
    # one prompt decode of every row, at their positions; then one row per sequence per token
    assert calls[0] == [(0, 3, 0), (0, 4, 1), (0, 5, 2), (2, 7, 0)]
    assert calls[1] == [(0, 6, 3), (2, 8, 1)]
    assert len(calls) == 4   # n_predict 4: the prompt's token, then three decodes
    assert set(times) == {"prompt", "generation"} and min(times.values()) >= 0
    assert [len(v) for v in trace.values()] == [4, 4]


def test_the_target_alone_stops_a_sequence_at_its_end_of_generation_token():
    calls = []
    toks, _, _ = run_alone(_counting_decode(50, calls), lambda t: t == 9, {0: [6], 1: [20]}, 10, temp=0.0, seed=0)
    assert toks[0] == [6, 7, 8, 9]                  # the end token is kept, nothing after it
    assert toks[1] == list(range(20, 31))
    assert all(s != 0 for call in calls[4:] for s, _, _ in call)


def test_the_best_candidates_come_best_first_ties_in_id_order():
    row = np.array([0.5, 2.0, -1.0, 2.0, 1.0, 2.0, np.float32(-np.inf)], dtype=np.float32)
    assert best_ids(row, 4).tolist() == [1, 3, 5, 4]
    assert best_ids(row, 2).tolist() == [1, 3]
    assert best_ids(row, 7).tolist() == [1, 3, 5, 4, 0, 2, 6]
    nan = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    assert best_ids(nan, 2).tolist() == np.argsort(-nan, kind="stable")[:2].tolist()
