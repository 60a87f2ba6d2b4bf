"""DFlash2's ties at its candidate set's edge (attribute.edge_gap), on rows measured where b11739 and
the authors' selector part on the shipped smollm2-dflash2 (`graphgen accept -m smollm2 -md
smollm2-dflash2 -n 64`, the authors' float draft on b11739's features, first draft position): the
selector scores only the top 8 tokens by unary logit, and where the 8th and 9th lie closer than
the drafts' numerics move them, b11739's set and the authors' hold different tokens."""

from __future__ import annotations

import numpy as np

from graphgen.accept.attribute import TIE_BAND, edge_gap

TOP_K = 8


def _row(unary: dict, scores: dict):
    """unary and score rows over the measured tokens (id order), other tokens far below; a token
    whose score was not measured (never a candidate of either set) scores 3 below its unary logit."""
    ids = sorted(unary)
    u = np.array([unary[t] for t in ids] + [-30.0])
    s = np.array([scores.get(t, unary[t] - 3.0) for t in ids] + [-30.0])
    return ids, u, s


# prompt 5, round 21: b11739 drafted 1151, the authors' 9th by unary logit (0.031 below the 8th, 28),
# which the selector's bilinear term puts ahead of the authors' pick 1108
ROUND_5_21 = _row({29: 10.573, 284: 10.244, 1108: 9.273, 1725: 9.172, 940: 9.035, 2821: 8.894, 288: 8.704,
                   28: 8.659, 1151: 8.628, 2966: 8.547, 1380: 8.354, 281: 8.325},
                  {28: 2.593, 29: 6.673, 284: 4.804, 288: 1.392, 940: 7.896, 1108: 8.114, 1151: 9.282,
                   1725: 7.909, 2821: 7.98})
# prompt 2, round 17: b11739 drafted 2727, in both sets but 2.19 below the authors' pick 5339, their
# 8th by unary logit, 0.010 above the 9th (9380): b11739's set lacks 5339
ROUND_2_17 = _row({2299: 10.063, 284: 9.435, 2342: 8.875, 2729: 8.572, 6721: 8.532, 2727: 8.46, 1329: 8.43,
                   5339: 8.428, 9380: 8.418, 1151: 8.373, 1835: 8.359, 940: 8.028},
                  {284: 3.21, 1329: 7.698, 2299: 7.472, 2342: 7.994, 2727: 8.595, 2729: 6.96, 5339: 10.787,
                   6721: 6.951, 9380: 8.492})


def test_a_token_that_enters_the_set_at_its_edge_is_a_tie():
    ids, u, s = ROUND_5_21
    t = ids.index(1151)
    assert edge_gap(u, s, t, TOP_K, 0.0) == float("inf")  # not among the replay's own 8
    assert edge_gap(u, s, t, TOP_K) == 0.0                 # the best of a set with 1151 instead of 28
    # the authors' own pick stays the best of its own set
    assert edge_gap(u, s, ids.index(1108), TOP_K, 0.0) == 0.0


def test_a_pick_that_leaves_the_set_at_its_edge_makes_the_next_best_a_tie():
    ids, u, s = ROUND_2_17
    t = ids.index(2727)
    assert abs(edge_gap(u, s, t, TOP_K, 0.0) - 2.192) < 1e-9
    assert edge_gap(u, s, t, TOP_K) <= TIE_BAND


def test_a_set_edge_clear_of_the_band_ties_nothing():
    ids, u, s = ROUND_5_21
    u = u.copy()
    u[ids.index(1151)] = u[ids.index(28)] - 2 * TIE_BAND  # the 9th now clearly out
    assert edge_gap(u, s, ids.index(1151), TOP_K) == float("inf")
    ids, u, s = ROUND_2_17
    u = u.copy()
    u[ids.index(5339)] = u[ids.index(9380)] + 2 * TIE_BAND  # the 8th now clearly in
    t = ids.index(2727)
    assert edge_gap(u, s, t, TOP_K) == edge_gap(u, s, t, TOP_K, 0.0) > TIE_BAND


def test_without_a_close_edge_the_gap_is_the_score_gap_in_the_set():
    rng = np.random.default_rng(0)
    u = np.concatenate([np.arange(TOP_K, 0, -1) * 2.0 + 10, rng.normal(0, 1, 40)])
    s = u + rng.normal(0, 3, u.size)
    best = max(range(TOP_K), key=lambda i: s[i])
    for i in range(TOP_K):
        assert abs(edge_gap(u, s, i, TOP_K) - (s[best] - s[i])) < 1e-9
    assert edge_gap(u, s, TOP_K + 1, TOP_K) == float("inf")
