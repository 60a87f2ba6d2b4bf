"""The authors' draft as a draft session (graphgen/speculative/torch_draft.py), on the shipped
speculators DSpark: its cache (injected rows through the next block, the block cropped after)
drafts what a block from scratch drafts, a tail removal drops waiting rows, and llama.cpp's DSpark
driver reads its drafts and confidences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="the authors' draft needs the torch extra (graphgen[torch])")
pytest.importorskip("speculators.models.dspark.core", reason="a speculators draft needs the torch extra")

from graphgen.accept import authors_loop as AL  # noqa: E402
from graphgen.accept import speculators_loop as SL  # noqa: E402
from graphgen.errors import GraphgenError  # noqa: E402
from graphgen.speculative.drafters import DraftParams, DraftRequest, create_drafter  # noqa: E402
from graphgen.speculative.torch_draft import TorchDraftSession  # noqa: E402

DRAFT_DIR = Path(__file__).resolve().parents[2] / "drafts" / "smollm2-dspark"
TOKENS = [504, 3575, 282, 4649, 314, 253, 3175, 282, 2458, 3416, 28, 1285, 805, 359]


@pytest.fixture(scope="module")
def loaded():
    from graphgen.accept.features import transformers_run
    from graphgen.speculative.targets import resolve
    torch.set_num_threads(1)
    target = resolve("smollm2")
    _, draft, _ = AL.load(target, DRAFT_DIR)
    feats = transformers_run(target, draft.target_layers, TOKENS)[0].reshape(len(TOKENS), -1)
    return draft, feats


def test_the_sessions_cache_drafts_what_a_block_from_scratch_drafts(loaded):
    draft, feats = loaded
    s = TorchDraftSession(draft)
    d = create_drafter(s, None, DraftParams(n_max=None))
    assert d.type == "draft-dspark" and d.n_max == draft.block_size and d.sample_from_anchor
    # the prompt's rows, a round, then the verified rows of the next positions with a tail removed
    assert d.process(feats[:5], 0)
    for pos0, upto in ((5, 9), (9, 12)):
        out = d.draft({0: DraftRequest(id_last=TOKENS[pos0], pos0=pos0)})[0]
        want, _, conf = SL.draft_block(draft, feats[:pos0], TOKENS[pos0], pos0, draft.block_size)
        assert out == want
        np.testing.assert_allclose(s.confidences[0], conf, rtol=1e-5)
        assert d.process(feats[pos0:pos0 + 6], pos0)   # a verify batch's rows
        d.seq_rm(0, upto, -1)                          # the rejected ones leave
        assert d.seq_pos_max(0) == upto - 1
    assert s.seqs[0].cached == list(range(9))         # the rows of pos 9.. wait for the next block


def test_p_min_ends_the_draft_at_the_first_slot_the_confidence_head_scores_below_it(loaded):
    draft, feats = loaded
    _, _, conf = SL.draft_block(draft, feats[:7], TOKENS[7], 7, draft.block_size)
    p_min = float(np.sort(conf)[len(conf) // 2])
    s = TorchDraftSession(draft)
    d = create_drafter(s, None, DraftParams(n_max=None, p_min=p_min))
    d.process(feats[:7], 0)
    out = d.draft({0: DraftRequest(id_last=TOKENS[7], pos0=7)})[0]
    cut = next(i for i, c in enumerate(conf) if c < p_min)
    assert len(out) == cut and all(c >= p_min for c in conf[:cut])


def test_only_a_tail_leaves_and_the_inputs_are_checked(loaded):
    draft, feats = loaded
    s = TorchDraftSession(draft)
    s.inject(feats[:6], 0)
    s.seq_rm(0, 4, -1)
    assert s.seq_pos_max(0) == 3 and s.seqs[0].pending[0][0].shape == (4, draft.n_embd_inp)
    with pytest.raises(GraphgenError, match="drops only a tail"):
        s.seq_rm(0, 1, 2)
    with pytest.raises(GraphgenError, match=r"must be \[n_tokens, %d\]" % draft.n_embd_inp):
        s.inject(feats[:2, :10], 4)
    with pytest.raises(GraphgenError, match="sequence 1 is outside"):
        s.inject(feats[:2], 0, seq=1)
    with pytest.raises(GraphgenError, match="carries no context state"):
        s.block_multi([(0, [1, 2], 4)], embd_state=np.zeros((2, draft.n_embd), np.float32))
