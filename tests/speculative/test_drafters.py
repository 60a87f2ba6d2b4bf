"""The DFlash family drivers (issue 6): drafts against independent numpy readings of llama.cpp's
dumped outputs, every branch, the libstdc++ generator, the LiliCorr ring, several sequences, the
spec-type rules and `graphgen draft` (the loop itself: test_loop.py)."""

import json
import logging
import re
import shutil
import subprocess

import gguf
import numpy as np
import pytest
from conftest import REF_DIR
from make_references import build_model

from graphgen.cli import main as cli_main
from graphgen.speculative.drafters import (
    LLAMA_DEFAULT_SEED,
    DFlash2Drafter,
    DFlashDrafter,
    DraftParams,
    DraftRequest,
    DSparkDrafter,
    LiliCorrDrafter,
    SpecTypeError,
    create_drafter,
    types_from_gguf,
    types_from_names,
)
from graphgen.speculative.loop import open_drafter
from graphgen.errors import GraphgenError
from graphgen.runtime.mt19937 import MT19937, uniform_real
from graphgen.runtime.session import Session
from graphgen.synth import make_model

ID_LAST, POS0, N_PROMPT = 7, 6, 6


# -- independent readings (float64 numpy, no driver code) ------------------------------------

def ref_case(name):
    d = REF_DIR / name
    doc = json.loads((d / "01-block.json").read_text())
    z = np.load(d / "01-block.npz")
    nodes = doc["nodes"]
    return d, doc, nodes, z


def node_values(nodes, z, pred):
    n = [n for n in nodes if pred(n)][-1]
    v = z[f"n{n['index']}"]
    return v.reshape(-1, v.shape[-1])


def np_top10_p(row):
    top = np.sort(row.astype(np.float64))[::-1][:10]
    e = np.exp(top - top[0])
    return int(np.argmax(row)), float(e[0] / e.sum())


def np_lattice_walk(lattice, top_k, n_steps, p_min=0.0):
    out, pred, probs = [], 0, []
    for i in range(1, n_steps + 1):
        row = lattice[i].astype(np.float64)
        sc = row[top_k + pred * top_k: top_k + (pred + 1) * top_k]
        pred = int(np.argmax(sc))
        p = 1.0 / np.exp(sc - sc[pred]).sum()
        probs.append(p)
        if p_min > 0 and p < p_min:
            break
        out.append(int(row[pred]))
    return out, probs


# -- helpers ----------------------------------------------------------------------------------

def scenario_session(case_dir, model_path, n_seq=1, **kw):
    sc = json.loads((case_dir / "scenario.json").read_text())
    return Session(model_path, n_ctx=sc["n_ctx"], n_ubatch=kw.get("n_ubatch", sc["n_ubatch"]),
                   flash_attn=sc["flash_attn"] == "on", type_kv=sc["type_kv"], n_seq=n_seq)


def prompt_features(session, n=N_PROMPT, seed=1):
    return np.random.default_rng(seed).standard_normal((n, session.hparams.n_embd_inp_enc), dtype=np.float32)


def drafter_for(case, models_dir, params, n_seq=1, **kw):
    case_dir = REF_DIR / case
    model = build_model(case_dir, models_dir)
    s = scenario_session(case_dir, model, n_seq=n_seq, **kw)
    d = create_drafter(s, "draft-dflash", params)
    return d


def one_round(d, n_prompt=N_PROMPT, seed=1, req=None):
    d.process(prompt_features(d.session, n_prompt, seed), 0, 0)
    d.begin(0, list(range(n_prompt)))
    req = req or DraftRequest(ID_LAST, n_prompt)
    d.draft({0: req})
    return req


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("drafters")
    out = {}
    for name, v, kw in (("dflash", "dflash", {}), ("dflash2", "dflash2", {"selector_top_k": 4}),
                        ("dspark", "dspark", {"conf": True}), ("lilicorr", "lilicorr", {"lilicorr_top_k": 3})):
        out[name] = d / f"{name}.gguf"
        make_model(out[name], v, seed=3, block_size=5, **kw)
    return out


# -- drafts equal a numpy reading of llama.cpp's dumped outputs ---------------------------------

GREEDY_CASES = {
    # case: (driver class, n_max that gives the scenario's block)
    "dflash-fa-off": (DFlashDrafter, 3), "dflash-fa-on": (DFlashDrafter, 3),
    "dflash2-fa-off": (DFlash2Drafter, 3), "dflash2-fa-on": (DFlash2Drafter, 3),
    "dflash2-top1-block2": (DFlash2Drafter, 1),
    "dspark-fa-off": (DSparkDrafter, 4), "dspark-conf-fa-off": (DSparkDrafter, 4),
    "dspark-conf-fa-on": (DSparkDrafter, 4), "dspark-d2t": (DSparkDrafter, 4),
    "dspark-bonus-anchor": (DSparkDrafter, 3),
    "lilicorr-fa-off": (LiliCorrDrafter, 3), "lilicorr-fa-on": (LiliCorrDrafter, 3),
    "lilicorr-1slot": (LiliCorrDrafter, 1),
}


@pytest.mark.parametrize("case", sorted(GREEDY_CASES))
def test_greedy_draft_equals_reference_reading(case, models_dir):
    cls, n_max = GREEDY_CASES[case]
    d = drafter_for(case, models_dir, DraftParams(n_max=n_max))
    assert type(d) is cls and d.n_max == n_max
    req = one_round(d)
    case_dir, _, nodes, z = ref_case(case)
    sc = json.loads((case_dir / "scenario.json").read_text())
    assert sc["steps"][1]["block"]["seqs"][0]["tokens"][0] == ID_LAST
    if cls is DFlash2Drafter or cls is LiliCorrDrafter:
        name = "dflash2_lattice" if cls is DFlash2Drafter else "lilicorr_lattice"
        lat = node_values(nodes, z, lambda n: n["name"] == name)
        top_k = d.selector_top_k if cls is DFlash2Drafter else d.top_k
        want, _ = np_lattice_walk(lat, top_k, n_max)
    else:
        logits = node_values(nodes, z, lambda n: n["ne"][0] == 256 and n["ne"][1] == 4)
        beg = 0 if cls is DSparkDrafter and d.sample_from_anchor else 1
        want = [np_top10_p(logits[i])[0] for i in range(beg, logits.shape[0])]
    assert req.result == want
    # the block is gone from the draft's KV cache: the prompt is all it holds
    assert d.seq_pos_max(0) == POS0 - 1
    d.session.close()


def test_dflash_p_min_truncates(models_dir):
    _, _, nodes, z = ref_case("dflash-fa-off")
    logits = node_values(nodes, z, lambda n: n["name"] == "result_output")
    ps = [np_top10_p(logits[i])[1] for i in range(1, 4)]
    # a threshold just above the smallest p of the block cuts there
    k = int(np.argmin(ps))
    d = drafter_for("dflash-fa-off", models_dir, DraftParams(n_max=3, p_min=ps[k] + 1e-4))
    req = one_round(d)
    want = [np_top10_p(logits[i])[0] for i in range(1, 4)]
    first_below = next(i for i, p in enumerate(ps) if p < ps[k] + 1e-4)
    assert req.result == want[:first_below]
    d.session.close()


def test_dflash_p_min_keeps_a_slot_at_exactly_p_min(models_dir):
    """upstream stops when p < p_min: a slot whose probability equals p_min is kept, one a float32
    step above it is not. The float32 probability is the driver's own (top10); that it is the
    sampler's probability is checked against float64 numpy above."""
    from graphgen.speculative.drafters import top10
    _, _, nodes, z = ref_case("dflash-fa-off")
    logits = node_values(nodes, z, lambda n: n["name"] == "result_output")
    p32 = [top10(logits[i])[2][0] for i in range(1, 4)]
    k = int(np.argmin(p32))
    want = [np_top10_p(logits[i])[0] for i in range(1, 4)]
    # at exactly the smallest probability nothing is cut; one float32 step above, the draft stops there
    for p_min, expect in ((p32[k], want), (np.nextafter(p32[k], np.float32(1)), want[:k])):
        d = drafter_for("dflash-fa-off", models_dir, DraftParams(n_max=3, p_min=float(p_min)))
        assert one_round(d).result == expect, (p_min, p32)
        d.session.close()


def test_dspark_confidence_cutoff(models_dir):
    _, _, nodes, z = ref_case("dspark-conf-fa-off")
    conf = node_values(nodes, z, lambda n: n["op"] == "REPEAT" and n["ne"][:2] == [64, 4])[:, 0]
    logits = node_values(nodes, z, lambda n: n["ne"][:2] == [256, 4])
    greedy = [int(np.argmax(logits[i])) for i in range(4)]
    for thr in sorted({float(c) for c in conf}):
        for p_min in (thr, np.nextafter(np.float32(thr), np.float32(1))):
            d = drafter_for("dspark-conf-fa-off", models_dir, DraftParams(n_max=4, p_min=float(p_min)))
            req = one_round(d)
            cut = next((i for i, c in enumerate(conf) if c < np.float32(p_min)), 4)
            assert req.result == greedy[:cut], (p_min, conf)
            d.session.close()


def test_dspark_bonus_anchor_reads_mask_slots(models_dir):
    d = drafter_for("dspark-bonus-anchor", models_dir, DraftParams(n_max=10))
    assert not d.sample_from_anchor and d.n_max == 3  # clamped to block_size - 1
    assert d.block_tokens(DraftRequest(ID_LAST, POS0)) == 4
    d.session.close()
    d = drafter_for("dspark-conf-fa-off", models_dir, DraftParams(n_max=10))
    assert d.sample_from_anchor and d.n_max == 4  # anchor-first: a full block
    assert d.block_tokens(DraftRequest(ID_LAST, POS0)) == 4
    d.session.close()


def test_dspark_without_confidence_head_refuses_p_min(models_dir):
    with pytest.raises(SpecTypeError, match="^DSpark draft has no confidence head: please set --spec-draft-p-min 0$"):
        drafter_for("dspark-fa-off", models_dir, DraftParams(p_min=0.5))
    drafter_for("dspark-fa-off", models_dir, DraftParams(p_min=0.0)).session.close()


@pytest.mark.parametrize("case,top", [("dflash2-fa-off", "selector"), ("lilicorr-fa-off", "scorer")])
def test_lattice_p_min_and_n_min(case, top, models_dir):
    _, _, nodes, z = ref_case(case)
    lat = node_values(nodes, z, lambda n: n["name"].endswith("_lattice"))
    top_k = 2
    full, probs = np_lattice_walk(lat, top_k, 3)
    # cut at the step with the smallest probability
    k = int(np.argmin(probs))
    p_min = probs[k] + 1e-4
    want, _ = np_lattice_walk(lat, top_k, 3, p_min=p_min)
    assert len(want) < len(full)
    d = drafter_for(case, models_dir, DraftParams(n_max=3, p_min=p_min))
    assert one_round(d).result == want
    d.session.close()
    # n_min: a draft shorter than n_min is dropped, one as long is kept
    d = drafter_for(case, models_dir, DraftParams(n_max=3, p_min=p_min, n_min=len(want) + 1))
    assert one_round(d).result == []
    d.session.close()
    d = drafter_for(case, models_dir, DraftParams(n_max=3, p_min=p_min, n_min=len(want)))
    assert one_round(d).result == want
    d.session.close()


def test_dflash_n_min(models_dir):
    d = drafter_for("dflash-fa-off", models_dir, DraftParams(n_max=2, n_min=3))
    assert d.n_max == 2 and one_round(d).result == []
    d.session.close()
    d = drafter_for("dflash-fa-off", models_dir, DraftParams(n_max=2, n_min=2))
    assert len(one_round(d).result) == 2
    d.session.close()


@pytest.mark.parametrize("variant,n_draft_max", [("dflash", 4), ("dflash2", 4), ("dspark", 5), ("lilicorr", 4)])
def test_n_max_clamped_with_upstream_warning(variant, n_draft_max, tiny, caplog):
    with Session(tiny[variant]) as s, caplog.at_level(logging.WARNING, logger="graphgen.drafters"):
        d = create_drafter(s, None, DraftParams(n_max=50, n_min=9))
        assert d.n_max == d.params.n_max == n_draft_max and d.params.n_min == n_draft_max
        assert (f"init: requested draft size (n_max=50, n_min=9) exceeds the trained block size 5 -- clamping to "
                f"{n_draft_max}") in caplog.text
        caplog.clear()
        d = create_drafter(s, None, DraftParams(n_max=2))
        assert d.n_max == 2 and "clamping" not in caplog.text
        d = create_drafter(s, None, DraftParams(n_max=None))
        assert d.n_max == n_draft_max and "clamping" not in caplog.text


# the block each head sends for a given n_max below its trained block (5 here), and the rows it reads
BLOCK_RULES = {
    "dflash": lambda n_max: n_max + 1,    # id_last, then n_max masks
    "dflash2": lambda n_max: n_max + 1,
    "dspark": lambda n_max: n_max,        # the anchor slot predicts too
    "lilicorr": lambda n_max: 5,          # the scorer reads every slot of the trained block
}


@pytest.mark.parametrize("variant", sorted(BLOCK_RULES))
def test_n_max_below_the_block(variant, tiny):
    """Every n_max from 1 to the head's largest: the block the head sends, and a draft of
    exactly n_max tokens (no p_min, no n_min); LiliCorr's block never changes, so its shorter
    drafts are prefixes of its longest."""
    with Session(tiny[variant]) as s:
        largest = create_drafter(s, None, DraftParams(n_max=None)).n_max
        drafts = {}
        for n_max in range(1, largest + 1):
            d = create_drafter(s, None, DraftParams(n_max=n_max))
            sent = []
            orig = s.block_multi

            def spy(blocks, **kw):
                sent.append([len(b[1]) for b in blocks])
                return orig(blocks, **kw)
            s.block_multi = spy
            try:
                if n_max == 1:
                    d.process(prompt_features(s), 0, 0)
                req = DraftRequest(ID_LAST, N_PROMPT)
                d.draft({0: req})
            finally:
                s.block_multi = orig
            assert sent == [[BLOCK_RULES[variant](n_max)]], n_max
            assert len(req.result) == n_max, (n_max, req.result)
            assert s.seq_pos_max(0) == N_PROMPT - 1  # the block left the cache
            drafts[n_max] = req.result
        if variant == "lilicorr":
            for n_max, draft in drafts.items():
                assert draft == drafts[largest][:n_max]


def test_injection_is_chunked_by_n_ubatch(tiny):
    with Session(tiny["dflash"], n_ubatch=4) as s:
        d = create_drafter(s, "draft-dflash")
        calls = []
        orig = s.inject

        def spy(f, pos0, seq=0, **kw):
            calls.append((f.shape[0], pos0, seq))
            return orig(f, pos0, seq, **kw)
        s.inject = spy
        assert d.process(prompt_features(s, 10), 0, 0)
        assert calls == [(4, 0, 0), (4, 4, 0), (2, 8, 0)]
        assert d.seq_pos_max(0) == 9


# -- DFlash2 probabilistic drafting -------------------------------------------------------------

def prob_draft(d, seed, temp=4.0, begin=True):
    if begin:
        d.begin(0, list(range(N_PROMPT)))
    req = DraftRequest(ID_LAST, N_PROMPT, temp=temp, seed=seed, want_q=True)
    d.draft({0: req})
    return req


def np_sampled_walk(lat, top_k, rng, temp):
    """The sampled lattice walk in float64 numpy, drawing from `rng` (an MT19937)."""
    pred, out = 0, []
    for i in range(1, lat.shape[0]):
        row = lat[i].astype(np.float64)
        sc = row[top_k + pred * top_k: top_k + (pred + 1) * top_k]
        pred = int(np.argmax(sc))
        p = np.exp((sc - sc[pred]) / temp)
        p /= p.sum()
        u = uniform_real(rng)
        for k in np.argsort(row[:top_k]):
            u -= p[k]
            if u < 0:
                pred = int(k)
                break
        out.append(int(row[pred]))
    return out


def test_dflash2_each_sequence_samples_from_its_own_generator(tiny):
    """Two sequences drafted in one decode with the same seed: each walk draws from a generator
    of its own, seeded afresh for its request."""
    with Session(tiny["dflash2"], n_seq=2) as s:
        d = create_drafter(s, "draft-dflash2", DraftParams(n_max=None, probabilistic=True))
        for seq in (0, 1):
            d.process(prompt_features(s, seed=10 + seq), 0, seq)
            d.begin(seq, list(range(N_PROMPT)))
        reqs = {seq: DraftRequest(ID_LAST, N_PROMPT, temp=3.0, seed=9, want_q=True) for seq in (0, 1)}
        d.draft(reqs)
        lat = d.last_block.h_nextn
        n = lat.shape[0] // 2
        for seq in (0, 1):
            rng = MT19937((9 ^ 0x85EBCA6B) & 0xFFFFFFFF)
            assert reqs[seq].result == np_sampled_walk(lat[seq * n:(seq + 1) * n], 4, rng, 3.0), seq


def test_dflash2_probabilistic(tiny):
    with Session(tiny["dflash2"]) as s:
        d = create_drafter(s, "draft-dflash2", DraftParams(n_max=None, probabilistic=True))
        d.process(prompt_features(s), 0, 0)
        a, b = prob_draft(d, 42), prob_draft(d, 42)
        assert a.result == b.result and a.result_q == b.result_q and len(a.result) == 4
        # per request, not per round: the same seed without begin() runs the generator on from
        # where the last draft left it, one uniform draw per token
        c = prob_draft(d, 42, begin=False)
        rng = MT19937((42 ^ 0x85EBCA6B) & 0xFFFFFFFF)
        for _ in b.result:
            uniform_real(rng)
        assert c.result == np_sampled_walk(d.last_block.h_nextn, 4, rng, 4.0)
        drafts = {tuple(prob_draft(d, sd).result) for sd in range(12)}
        assert len(drafts) > 1, "different seeds give different drafts"
        for row in a.result_q:
            assert len(row) == 4
            assert abs(sum(p for _, _, p in row) - 1.0) < 1e-5
        for tok, row in zip(a.result, a.result_q):
            assert tok in [t for t, _, _ in row]
        # greedy when the request carries no q
        g = DraftRequest(ID_LAST, N_PROMPT, temp=4.0, seed=42)
        d.draft({0: g})
        assert g.result_q is None and len(g.result) == 4
        # the default seed means random: still a full draft with q
        assert len(prob_draft(d, LLAMA_DEFAULT_SEED).result_q) == 4


def test_dflash2_probabilistic_walk_equals_numpy(tiny):
    """The sampled walk equals a float64 numpy walk with the same uniform draws (seed ^ 0x85ebca6b)."""
    with Session(tiny["dflash2"]) as s:
        d = create_drafter(s, "draft-dflash2", DraftParams(n_max=None, probabilistic=True))
        d.process(prompt_features(s), 0, 0)
        for seed, temp in ((7, 4.0), (123, 0.7), (2**31 + 5, 2.0)):
            req = prob_draft(d, seed, temp)
            lat = d.last_block.h_nextn
            rng = MT19937((seed ^ 0x85EBCA6B) & 0xFFFFFFFF)
            pred, want, qs = 0, [], []
            for i in range(1, lat.shape[0]):
                row = lat[i].astype(np.float64)
                sc = row[4 + pred * 4: 8 + pred * 4]
                pred = int(np.argmax(sc))
                p = np.exp((sc - sc[pred]) / temp)
                p /= p.sum()
                u = uniform_real(rng)
                for k in np.argsort(row[:4]):
                    u -= p[k]
                    if u < 0:
                        pred = int(k)
                        break
                want.append(int(row[pred]))
                qs.append(p)
            assert req.result == want
            assert np.allclose([[q for _, _, q in r] for r in req.result_q], qs, atol=1e-6)


def test_dflash2_temperature_must_be_positive(tiny):
    with Session(tiny["dflash2"]) as s:
        d = create_drafter(s, None, DraftParams(probabilistic=True))
        d.process(prompt_features(s), 0, 0)
        with pytest.raises(Exception, match="temperature > 0"):
            d.draft({0: DraftRequest(ID_LAST, N_PROMPT, temp=0.0, seed=1, want_q=True)})


# -- std::mt19937 + uniform_real_distribution<double> ------------------------------------------

CPP = r"""
#include <random>
#include <cstdio>
#include <cstdlib>
int main(int argc, char ** argv) {
    std::mt19937 g((unsigned) std::strtoul(argv[1], nullptr, 10));
    std::mt19937 raw((unsigned) std::strtoul(argv[1], nullptr, 10));
    int n = std::atoi(argv[2]);
    for (int i = 0; i < n; ++i) {
        std::printf("%a %u\n", std::uniform_real_distribution<double>(0.0, 1.0)(g), (unsigned) raw());
    }
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.parametrize("seed", [0, 1, 42, 2**32 - 1])
def test_mt19937_uniform_real_equals_libstdcxx(seed, tmp_path):
    src = tmp_path / "mt.cpp"
    src.write_text(CPP)
    exe = tmp_path / "mt"
    subprocess.run(["g++", "-O2", "-o", str(exe), str(src)], check=True)
    n = 1500  # past two twists of the 624-word state
    out = subprocess.run([str(exe), str(seed), str(n)], check=True, capture_output=True, text=True).stdout.split("\n")
    g, raw = MT19937(seed), MT19937(seed)
    for line in out[:n]:
        u, r = line.split()
        assert uniform_real(g) == float.fromhex(u)
        assert raw() == int(r)


# -- LiliCorr's ring of context features --------------------------------------------------------

def test_lilicorr_ring_chunks_and_removals(tiny):
    with Session(tiny["lilicorr"], n_ubatch=5, n_seq=2) as s, Session(tiny["lilicorr"], n_ubatch=64) as whole:
        d = create_drafter(s, "draft-lilicorr", DraftParams(n_max=None))
        assert d.rows == 6  # block_size + 1
        feats = prompt_features(s, 16, seed=5)
        ctx = whole.inject(feats, 0).h_nextn  # every position's context features in one graph
        assert d.process(feats[:12], 0, 0)     # chunks 0-4, 5-9, 10-11
        held = d.context_positions(0)
        # each chunk keeps its last block_size + 1 positions; the ring keeps the newest per slot
        assert sorted(held) == [6, 7, 8, 9, 10, 11]
        for p, row in held.items():
            assert np.allclose(row, ctx[p], rtol=1e-5, atol=1e-6)
        assert d.context_positions(1) == {}
        # a second sequence has its own rows
        d.process(feats[:3] * 2, 0, 1)
        assert sorted(d.context_positions(1)) == [0, 1, 2]
        with Session(tiny["lilicorr"], n_ubatch=64) as fresh:  # positions 0.. are taken in `whole`
            want = fresh.inject(feats[:3] * 2, 0, 0).h_nextn[2]
        assert np.allclose(d.context_positions(1)[2], want, rtol=1e-5, atol=1e-6)
        assert sorted(d.context_positions(0)) == [6, 7, 8, 9, 10, 11]
        # removing positions forgets them; injecting them again refills the ring
        d.seq_rm(0, 10, -1)
        assert sorted(d.context_positions(0)) == [6, 7, 8, 9]
        assert d.seq_pos_max(0) == 9
        d.process(feats[10:14], 10, 0)
        held = d.context_positions(0)
        assert sorted(held) == [8, 9, 10, 11, 12, 13]
        for p in held:
            assert np.allclose(held[p], ctx[p], rtol=1e-5, atol=1e-6)
        # the block reads the row of pos0 - 1 for every token
        st = d.embd_state(0, DraftRequest(ID_LAST, 14), 5)
        assert st.shape == (5, s.hparams.n_embd) and np.array_equal(st, np.repeat(held[13][None], 5, 0))
        req = DraftRequest(ID_LAST, 14)
        d.draft({0: req})
        assert d.seq_pos_max(0) == 13
        # the same block with that row, by hand, walked in numpy
        r = s.block([ID_LAST] + [d.mask_token_id] * 4, 14, 0, embd_state=st)
        want, _ = np_lattice_walk(r.h_nextn, 3, 4)
        assert req.result == want and len(want) == 4


# -- several sequences in one decode -------------------------------------------------------------

@pytest.mark.parametrize("variant", ["dflash", "dflash2", "dspark", "lilicorr"])
def test_multi_sequence_drafts_equal_single(variant, tiny):
    lens = [5, 9, 13]
    feats = [np.random.default_rng(10 + i).standard_normal((n, 1), dtype=np.float32) for i, n in enumerate(lens)]
    with Session(tiny[variant], n_seq=3, n_ctx=128) as s:
        w = s.hparams.n_embd_inp_enc
        feats = [np.random.default_rng(10 + i).standard_normal((n, w), dtype=np.float32) for i, n in enumerate(lens)]
        d = create_drafter(s, "draft-dflash", DraftParams(n_max=None))
        assert d.process_multi([(i, f, 0) for i, f in enumerate(feats)])
        reqs = {i: DraftRequest(100 + i, n) for i, n in enumerate(lens)}
        together = d.draft(reqs)
        for i, n in enumerate(lens):
            assert d.seq_pos_max(i) == n - 1
    for i, n in enumerate(lens):
        with Session(tiny[variant]) as s1:
            d1 = create_drafter(s1, "draft-dflash", DraftParams(n_max=None))
            d1.process(feats[i], 0, 0)
            alone = d1.draft({0: DraftRequest(100 + i, n)})
        assert together[i] == alone[0] and len(alone[0]) == d.n_max, (variant, i)


# -- spec types ---------------------------------------------------------------------------------

HEAD_TYPE = {"dflash": "draft-dflash", "dflash2": "draft-dflash2", "dspark": "draft-dspark", "lilicorr": "draft-lilicorr"}
DRIVER = {"dflash": DFlashDrafter, "dflash2": DFlash2Drafter, "dspark": DSparkDrafter, "lilicorr": LiliCorrDrafter}


@pytest.mark.parametrize("variant", sorted(HEAD_TYPE))
def test_spec_type_rules(variant, tiny):
    assert types_from_gguf(tiny[variant]) == [HEAD_TYPE[variant]]  # the concrete type
    with Session(tiny[variant]) as s:
        for spec in ("draft-dflash", None, HEAD_TYPE[variant], [HEAD_TYPE[variant], HEAD_TYPE[variant]]):
            d = create_drafter(s, spec)
            assert type(d) is DRIVER[variant] and d.type == HEAD_TYPE[variant]
        for other in ("draft-dflash2", "draft-dspark", "draft-lilicorr"):
            if other == HEAD_TYPE[variant]:
                continue
            with pytest.raises(SpecTypeError, match=f"^--spec-type {other} does not match the draft model: "
                                                    f"use {HEAD_TYPE[variant]}$"):
                create_drafter(s, other)
        for combo in (["draft-dflash", "draft-dspark"], "draft-dflash2,draft-lilicorr", ["draft-dspark", "draft-dflash"]):
            with pytest.raises(SpecTypeError, match="^draft-dflash, draft-dflash2, draft-dspark and draft-lilicorr "
                                                    "cannot be combined$"):
                create_drafter(s, combo)


def test_spec_type_names_and_non_dflash_model(tmp_path):
    assert types_from_names("draft-dflash,none") == ["none"]
    with pytest.raises(SpecTypeError, match="^unknown speculative type: draft-foo$"):
        types_from_names(["draft-dflash", "draft-foo"])
    p = tmp_path / "llama.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(2)
    w.add_tensor("blk.1.nextn.eh_proj.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert types_from_gguf(p) == ["draft-mtp"]
    for t in ("draft-dflash", "draft-dspark", "draft-dflash2", "draft-lilicorr"):
        with pytest.raises(SpecTypeError, match=f"^--spec-type {t} requires a DFlash draft model$"):
            open_drafter(p, t)
    assert cli_main(["draft", str(p), "--spec-type", "draft-dflash", "--prompt-tokens", "1"]) == 2


# -- `graphgen draft` ----------------------------------------------------------------

def test_draft_cli(tiny, tmp_path, capsys):
    f = tmp_path / "f.npy"
    with Session(tiny["dspark"]) as s:
        np.save(f, prompt_features(s, 40, seed=4))
    args = ["draft", str(tiny["dspark"]), "--spec-type", "draft-dspark", "--features", str(f),
            "--prompt-tokens", "1,2,3,4,5", "--n-predict", "10", "--accept", "1,3"]
    # the per-round lines are progress: on a terminal or with --progress, not in a pipe or a log
    rc = cli_main(args)
    out, err = capsys.readouterr()
    assert rc == 0 and "[round" not in err
    rc = cli_main(["--progress"] + args)
    out, err = capsys.readouterr()
    assert rc == 0
    assert "[round 1] seq 0 pos 5:" in err and "accepted 1" in err and "[round 2]" in err
    for key in ("blocks", "drafted tokens", "accepted tokens", "mean acceptance", "time per round"):
        assert key in out
    assert "mean accepted" not in out
    # the printed figure is the field's, from the printed counts: 1 + accepted / drafts (each block
    # drafted but, at most, the last: one token from -n it has no room to draft)
    blocks = int(re.search(r"^blocks +(\d+)$", out, re.M).group(1))
    accepted = int(re.search(r"^accepted tokens +(\d+) ", out, re.M).group(1))
    m = re.search(r"^mean acceptance +([\d.]+) tokens per round \(1 \+ accepted / drafts, over (\d+) drafts\)$",
                  out, re.M)
    drafts = int(m.group(2)) if m else -1
    assert drafts in (blocks, blocks - 1) and float(m.group(1)) == pytest.approx(1 + accepted / drafts, abs=0.005)
    rc = cli_main(["draft", str(tiny["dspark"]), "--features", str(f), "--prompt-tokens", "1,2,3", "--n-predict", "4",
                   "--json", "--quiet"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert rc == 0 and doc["spec_type"] == "draft-dspark" and doc["blocks"] >= 1 and "[round" not in err
    # errors: one line, exit code 2
    for argv, msg in (
            (["--spec-type", "draft-lilicorr"], "--spec-type draft-lilicorr does not match the draft model: use draft-dspark"),
            (["--spec-type", "draft-dflash,draft-dspark"], "cannot be combined"),
            (["--spec-draft-p-min", "0.5"], None),
            (["--features", str(tmp_path / "nope.npy")], "no such features file"),
            (["--n-predict", "500"], "the features hold 40 positions")):
        rc = cli_main(["draft", str(tiny["dspark"]), "--prompt-tokens", "1,2,3", "--features", str(f)] + argv)
        out, err = capsys.readouterr()
        if msg is None:
            assert rc == 0
            continue
        assert rc == 2 and msg in err and err.count("graphgen: error:") == 1, err
    rc = cli_main(["draft", str(tiny["dspark"]).replace("dspark", "dflash"), "--prompt-tokens", "1", "--spec-draft-p-min",
                   "0.5", "--quiet"])
    assert rc == 0


def test_draft_output_says_what_ran_and_what_was_simulated(tiny, capsys):
    """The verifier is named simulated, with what it accepts; the drafting rate is given; the
    engine is named, in the text and in --json; --verbose gives the n_max the drafts use."""
    base = ["draft", str(tiny["dflash"]), "--prompt-tokens", "1,2,3,4,5,6", "-n", "12"]
    assert cli_main(base + ["--verbose"]) == 0
    out, err = capsys.readouterr()
    assert "n_max=3," in err and "None" not in err  # llama.cpp's default --spec-draft-n-max
    assert cli_main(base + ["--verbose", "--spec-draft-n-max", "9", "--quiet"]) == 0
    assert "n_max=4," in capsys.readouterr().err  # clamped: block size 5, 4 predictions
    out = out
    assert out.startswith("engine           graphgen ")
    assert "verifier         simulated (no target model runs): every drafted token (--accept -1)" in out
    assert "% of drafted, by the simulated verifier)" in out
    rate = float(out.split("drafted tokens")[1].split("(")[1].split(" tokens/s of drafting wall time")[0])
    assert rate > 0, out
    for argv, engine, accepts in ((["--accept", "1,2"], "graphgen", "1,2 drafted tokens per round"),
                                  (["--engine", "llama.cpp"], "llama.cpp", "every drafted token"),
                                  (["--target-tokens", "9,8,7"], "graphgen", "matching --target-tokens")):
        assert cli_main(base + argv + ["--json", "--quiet"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["engine"] == engine and doc["engine_detail"].startswith(
            "llama.cpp b11739" if engine == "llama.cpp" else "graphgen")
        assert doc["verifier"]["simulated"] is True and accepts in doc["verifier"]["accepts"]
        t_draft = doc["ms_draft_per_round"] * doc["rounds"] / 1e3
        assert doc["drafted_tokens_per_s"] == pytest.approx(doc["drafted_tokens"] / t_draft, rel=1e-6)


# -- blocks past the trained size -------------------------------------------------------------------

def test_a_block_past_the_trained_size_is_warned_once(tiny, caplog):
    with Session(tiny["dflash"], n_ctx=128) as s, caplog.at_level(logging.WARNING, logger="graphgen.drafters"):
        d = create_drafter(s, None, DraftParams(n_max=None))
        d.process(prompt_features(s, 6), 0, 0)
        d.draft({0: DraftRequest(ID_LAST, 6)})
        assert "longer than" not in caplog.text  # the longest block init allows is within the trained size
        d.params.n_max += 1
        n_block = d.block_tokens(DraftRequest(ID_LAST, 6))
        assert n_block == 6
        d.draft({0: DraftRequest(ID_LAST, 6)})
        d.draft({0: DraftRequest(ID_LAST, 6)})
        msgs = [r.getMessage() for r in caplog.records if "longer than" in r.getMessage()]
        assert msgs == [f"draft: a noise block of 6 tokens is longer than the draft's trained block size 5 "
                        f"(n_max {d.params.n_max} was raised after init); the slots past it were never trained"]


def test_a_block_past_the_trained_size_is_refused_where_upstream_aborts(tiny):
    """DFlash2's lattice has one row per trained slot (llama.cpp asserts on a longer block): refused before
    anything runs, the KV cache untouched."""
    with Session(tiny["dflash2"], n_ctx=128) as s:
        d = create_drafter(s, None, DraftParams(n_max=None))
        d.process(prompt_features(s, 6), 0, 0)
        d.params.n_max += 1
        with pytest.raises(GraphgenError, match="a noise block of 6 tokens is longer than the draft's trained "
                                                "block size 5, which the draft-dflash2 head's lattice cannot read "
                                                r"\(llama.cpp aborts\); keep n_max at most 4"):
            d.draft({0: DraftRequest(ID_LAST, 6)})
        assert d.seq_pos_max(0) == 5
