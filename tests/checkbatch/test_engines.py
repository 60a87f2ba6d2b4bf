"""The engines running a case: each yields one recorded graph per block the plan computes, every
node with its digest and its values in float32 (numpy order); b11739's the same as graphgen's,
its dumps removed once read."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from graphgen.checkbatch.engines import ReferenceWorker, run_graphgen
from graphgen.checkbatch.plan import case_scenario, plan_cases, settings_for
from graphgen.runtime.model import load


def _scenario(draft, n_seq):
    m = load(draft)
    try:
        hp, rules = m.hparams, m.head.block_rules(m.hparams)
    finally:
        m.close()
    cases = plan_cases(rules, hp.n_vocab, max(hp.mask_token_id, 0), [n_seq], 4, 6, 0)
    return case_scenario(cases[0], settings_for(cases, False, "f16", "f16", 0))


def test_graphgen_records_every_block_graph(draft):
    sc, roles = _scenario(draft, 2)
    graphs = list(run_graphgen(draft, sc))
    # the batched block, then per sequence: alone, batched again, own cache, batched again
    assert len(graphs) == len(roles) == 1 + 4 * 2
    for g in graphs:
        assert g.nodes and all(n.digest for n in g.nodes) and set(g.values) == {n.index for n in g.nodes}
        for n in g.nodes:
            v = g.values[n.index]
            assert v.dtype == np.float32 and v.shape == tuple(reversed(n.ne)), n.name
            if n.type == "f32":  # a digest is of the bytes as computed: f32 ones are the values'
                assert hashlib.sha256(v.tobytes()).hexdigest() == n.digest, n.name


@pytest.mark.reference
def test_reference_graphs_are_graphgens_and_its_dumps_go(draft, tmp_path):
    sc, roles = _scenario(draft, 2)
    ours = list(run_graphgen(draft, sc))
    worker = ReferenceWorker(tmp_path)
    try:
        theirs = list(worker.run(draft, sc))
    finally:
        worker.close()
    assert len(theirs) == len(roles)
    for x, y in zip(ours, theirs):
        assert [(n.name, n.op, n.ne, n.digest) for n in x.nodes] == [(n.name, n.op, n.ne, n.digest) for n in y.nodes]
        assert set(x.values) == set(y.values)
    # the scenario and the logs stay for a failure's message; each run's dump is read and removed
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["errors.jsonl", "llama.cpp.log", "s1.json"]
