"""The drafting loop end to end on both engines: graphgen's drivers run the same rounds once on
graphgen's graphs and once on llama.cpp b11739's (graphgen.reference.session), for every head.

The two runs must agree on everything a driver reads and decides: each block's logits and h_nextn
rows (bit-identical, as both compute on the reference's ggml), each round's draft, its candidate
probabilities (DFlash2's probabilistic walk), its acceptance, and the tokens generated.
"""

import numpy as np
import pytest

from graphgen.speculative.drafters import DraftParams
from graphgen.speculative.loop import SimulatedVerifier, open_drafter, run_speculative
from graphgen.synth import make_model
from real_target import Recording

pytestmark = [pytest.mark.reference]

HEADS = {
    "dflash": ("dflash", "base", {}, {}),
    "dflash-iswa": ("dflash", "base", {"swa_window": 5, "swa_pattern": [True, False]}, {}),
    "dflash2": ("dflash2", "base", {}, {}),
    "dflash2-probabilistic": ("dflash2", "base", {}, {"probabilistic": True}),
    "dspark-conf": ("dspark", "base", {"conf": True}, {"p_min": 0.02}),
    "dspark-d2t": ("dspark", "base", {"d2t_vocab": 200}, {}),
    "lilicorr": ("lilicorr", "base", {}, {}),
    "dspark-dsv4": ("dspark", "dsv4", {}, {}),
}
N_ROUNDS = 100


def _run(model, engine, params, n_predict, feats, prompts):
    drafter = open_drafter(model, None, DraftParams(**params), engine=engine, n_ctx=1024, n_ubatch=64,
                           n_seq=len(prompts))
    rec = drafter.session = Recording(drafter.session)
    try:
        verifier = SimulatedVerifier(accept=[0, 1, 3, -1, 2], n_vocab=drafter.n_vocab,
                                     mask_token=drafter.mask_token_id, seed=5)
        res = run_speculative(drafter, [(p, f) for p, f in zip(prompts, feats)], n_predict=n_predict,
                              verifier=verifier, seed=11)
    finally:
        rec.session.close()
    return res, rec.blocks


@pytest.mark.parametrize("head", list(HEADS))
def test_drafting_loop_is_the_same_on_both_engines(head, tmp_path):
    variant, backbone, kw, params = HEADS[head]
    model = tmp_path / "draft.gguf"
    make_model(model, variant, backbone, **kw)
    rng = np.random.default_rng(3)
    from graphgen.runtime.model import load
    m = load(model)
    width = m.hparams.n_embd_inp_enc
    m.close()
    n_predict = 300
    prompts = [[int(t) for t in rng.integers(0, 200, 9)], [int(t) for t in rng.integers(0, 200, 4)]]
    feats = [rng.standard_normal((len(p) + n_predict + 16, width), dtype=np.float32) for p in prompts]
    ours, ours_blocks = _run(model, "graphgen", params, n_predict, feats, prompts)
    ref, ref_blocks = _run(model, "llama.cpp", params, n_predict, feats, prompts)

    assert len({r.round for r in ours.rounds}) >= N_ROUNDS
    assert len(ours_blocks) == len(ref_blocks)
    for k, ((lo, ho), (lr, hr)) in enumerate(zip(ours_blocks, ref_blocks)):
        np.testing.assert_array_equal(lo, lr, err_msg=f"block {k}: logits")
        if ho is not None:  # a head that reads h_nextn in its blocks
            assert hr is not None, f"block {k}: llama.cpp gave no h_nextn"
            np.testing.assert_array_equal(ho, hr, err_msg=f"block {k}: h_nextn")
    assert len(ours.rounds) == len(ref.rounds)
    for a, b in zip(ours.rounds, ref.rounds):
        where = f"round {a.round} seq {a.seq}"
        assert (a.seq, a.pos0, a.id_last) == (b.seq, b.pos0, b.id_last), where
        assert a.draft == b.draft, where
        assert a.n_accepted == b.n_accepted and a.bonus == b.bonus, where
        assert a.q == b.q, where
    assert ours.tokens == ref.tokens
    drafted = sum(len(r.draft) for r in ours.rounds)
    assert drafted > N_ROUNDS  # the drafts were not empty rounds
    if params.get("probabilistic"):
        assert all(r.q for r in ours.rounds if r.draft)
