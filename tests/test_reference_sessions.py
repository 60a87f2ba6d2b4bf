"""Whole drafting sessions against llama.cpp b11739 (tests/sessions.py draws them).

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
