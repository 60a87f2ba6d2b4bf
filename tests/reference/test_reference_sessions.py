"""Whole drafting sessions against llama.cpp b11739 (tests/support/sessions.py draws them).

Every graph of every step must be node-identical and bit-exact, and a step one engine refuses
must be the step the other refuses. GRAPHGEN_SESSIONS sets the sessions per variant (30 by
default; `make sessions` runs the long sweep).
"""

import os

import pytest

from graphgen.synth import make_model
from parity_check import assert_parity
from sessions import VARIANTS, compare_session, random_session

pytestmark = [pytest.mark.reference]

N_SESSIONS = int(os.environ.get("GRAPHGEN_SESSIONS", "30"))


@pytest.mark.parametrize("seed", range(N_SESSIONS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_session_matches_llama_cpp(variant, seed, tmp_path, isolated, reference_worker):
    (var, backbone, kw), doc = random_session(variant, seed)
    model = tmp_path / "draft.gguf"
    make_model(model, var, backbone, **kw)
    res = compare_session(model, doc, tmp_path, isolated, reference_worker)
    context = f"{variant} session {seed}: {kw}\n{doc}\n{res.describe()}"
    assert res.ours["ok"] == res.ref["ok"], context
    assert res.ours["step"] == res.ref["step"], context
    assert len(res.results) == res.n_graphs, context
    if res.n_graphs:
        assert_parity(res.results, context)


@pytest.mark.parametrize("n_ctx,n_ubatch,steps,step", [
    # a causal context caps its batch at the n_ctx asked for (before padding): 46 rows fit, 47 do not
    (46, 64, [{"inject": {"n_tokens": 46}}], None),
    (46, 64, [{"inject": {"n_tokens": 47}}], 0),
    (46, 64, [{"inject": {"n_tokens": 20}}, {"block": {"tokens": [1] + [255] * 46, "pos0": 20}}], 1),
    (8, 64, [{"inject": {"n_tokens": 8}}, {"block": {"tokens": [1, 255, 255, 255], "pos0": 8}},
             {"seq_rm": {"seq": 0, "p0": 8, "p1": -1}}, {"inject": {"n_tokens": 9, "pos0": 8}}], 3),
    (300, 16, [{"inject": {"n_tokens": 16}}], None),
])
def test_batch_limit_of_a_small_context(n_ctx, n_ubatch, steps, step, tmp_path, isolated, reference_worker):
    model = tmp_path / "draft.gguf"
    make_model(model, "dflash", "base")
    doc = {"n_ctx": n_ctx, "n_ubatch": n_ubatch, "steps": steps}
    res = compare_session(model, doc, tmp_path, isolated, reference_worker)
    assert (res.ref["ok"], res.ref["step"]) == (step is None, step), res.describe()
    assert (res.ours["ok"], res.ours["step"]) == (step is None, step), res.describe()
    if step is not None:
        assert "capped at n_ctx" in res.ours["error"]
    assert len(res.results) == res.n_graphs
    if res.n_graphs:
        assert_parity(res.results, res.describe())


@pytest.mark.parametrize("n_ctx,n_ubatch,n_seq", [(2, 64, 3), (64, 2, 3)])
def test_more_sequences_than_a_batch_holds(n_ctx, n_ubatch, n_seq, tmp_path, isolated, reference_worker):
    """b11739 aborts creating such a context (its output buffer holds one batch); graphgen refuses
    it in one line, before any step."""
    model = tmp_path / "draft.gguf"
    make_model(model, "dflash", "base")
    doc = {"n_ctx": n_ctx, "n_ubatch": n_ubatch, "n_seq": n_seq, "steps": [{"inject": {"n_tokens": 1}}]}
    res = compare_session(model, doc, tmp_path, isolated, reference_worker)
    assert not res.ref["ok"] and res.ref["step"] is None and "abort" in res.ref["error"], res.describe()
    assert not res.ours["ok"] and res.ours["step"] is None, res.describe()
    assert res.ours["error"].startswith("ContextError: n_seq 3 is more than a batch holds (2")
