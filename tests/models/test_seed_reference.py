"""The seed-only DSpark graphs (DeepSeek-V4.1, Mistral Large 4, the RNN joint head) checked against
the seed itself: graphgen's dumps, node by node, against the float64 reference in tests/support/seedref
(written from the seed's dspark.cpp, sharing no code with graphgen's builders), and every node's
op and name against the sequence tests/support/seedref/opseq.py derives from the seed's builder code.

Tolerances (relative L2 error of a node, ||ours - ref|| / ||ref||; TOL, TOL_AFTER_ATTN):
- 1e-4 for every node up to the first attention output. The reference models what the seed's
  types imply: K rows are stored in the cache's type, ggml's CPU mul_mat brings src1 to an f16
  src0's type (with an f16 cache the queries for kq and the probabilities for kqv are rounded to
  f16), and flash attention reads f16 K and queries.
- from the first attention output on: 1e-4 with an f32 cache and FA off; 5e-4 with an f16 cache
  (a last-bit difference before an f16 rounding is a whole f16 ulp, 4.9e-4); 3e-3 with FA on
  (ggml's CPU flash-attention kernel sums V in f16, which the reference does not model).
- integer nodes (ffn_moe_argsort, ffn_moe_topk): equal.
Names that repeat (build_norm's "norm-il", the two mixes of a DSV4 stage) are matched each to the
closest unused reference tensor of that name.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from graphgen.dump.format import load_dump
from graphgen.play.engine import run_scenario
from graphgen.play.scenario import parse_scenario
from graphgen.synth import make_model
from seedref.forward import KVAxis, SeedReference
from seedref.opseq import SeedGraphs, UBatch

TOL = 1e-4
# from the first attention output on: the f16 cache's rounding step (a last-bit difference in a
# probability or a K row is a whole f16 ulp, 4.9e-4 relative), or the flash kernel's f16 sums
TOL_AFTER_ATTN = {("f32", False): 1e-4, ("f16", False): 5e-4, ("f32", True): 3e-3, ("f16", True): 3e-3}
# names that another cb call renames before the graph is built (build_attn's "kqv_out" becomes the
# caller's "attn_raw" / "attn_latent")
RENAMED = {"kqv_out"}


def _rel(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / nb) if nb else float(np.linalg.norm(a))


def _features(seed, index, n, n_embd_inp):
    # the scenario format's features: step i draws from default_rng(seed + i)
    return np.random.default_rng(seed + index).standard_normal((n, n_embd_inp), dtype=np.float32)


def _scenario(rounds, flash_attn, type_kv, seed=1):
    """rounds: [[(seq, n_inject, tokens), ...], ...]; each round injects per sequence, drafts one
    block per sequence in one batch, then removes the blocks (seq_rm) as the driver does."""
    steps, pos = [], {}
    for r in rounds:
        for seq, n_inj, _ in r:
            steps.append({"inject": {"n_tokens": n_inj, "pos0": pos.get(seq, 0), "seq": seq}})
            pos[seq] = pos.get(seq, 0) + n_inj
        steps.append({"block": {"seqs": [{"seq": seq, "tokens": list(toks), "pos0": pos[seq]} for seq, _, toks in r]}})
        for seq, _, _ in r:
            steps.append({"seq_rm": {"seq": seq, "p0": pos[seq], "p1": -1}})
    n_seq = 1 + max(seq for r in rounds for seq, _, _ in r)
    return {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "on" if flash_attn else "off", "type_kv": type_kv,
            "seed": seed, "n_seq": n_seq, "steps": steps}


def _node_values(d, i):
    v = d.values(i)
    assert v is not None, f"{d.path}: node {i} ({d.nodes[i].name}) has no values"
    return np.asarray(v, dtype=np.float64)


def _cache_cells(d, il):
    """The K cache of layer il after this graph's write: [n_cells, row]."""
    for i, n in enumerate(d.nodes):
        if n.op == "SET_ROWS" and n.name == f"cache_k_l{il} (view)":
            v = _node_values(d, i)
            return v.reshape(-1, v.shape[-1])
    raise AssertionError(f"{d.path}: no K cache write for layer {il}")


def _holders(cells, rows):
    """cell index -> the reference rows (keys) whose content it holds. Rows of equal content (a mask
    token's first-layer K at one position, in two sequences or two rounds) share their cells."""
    out = {}
    for key, row in rows.items():
        err = np.max(np.abs(cells - row[None, :]), axis=1)
        for j in np.nonzero(err <= 1e-3 * max(1.0, float(np.max(np.abs(row)))))[0]:
            out.setdefault(int(j), []).append(key)
    return out


def _compare_kv(d, i, name, ref: KVAxis, il):
    """kq / kq_soft_max / v_cont, whose last axis is the cache's cells: each cell holding a known
    row against that row's column; for the probabilities, the rows the mask lets a query see are
    placed on the cells holding their content (trying every placement among equal rows) and every
    other cell must carry nothing."""
    holders = _holders(_cache_cells(d, il), ref.rows)
    v = _node_values(d, i)
    n_kv = d.nodes[i].ne[0]
    got = v.reshape(-1, n_kv)           # [H*T, n_kv], or [Dv, n_kv] for v_cont
    visible = [k for k, vis in ref.visible.items() if vis.any()]
    placed = {k for keys in holders.values() for k in keys}
    lost = [k for k in visible if k not in placed]
    assert not lost, f"{name}: the K rows (seq, pos, round) {lost} are not in the cache"
    if ref.kind in ("kq", "v"):
        cols = sorted(holders)
        exp = np.stack([np.ravel(ref.cols[holders[j][0]]) for j in cols], axis=1)
        return _rel(got[:, cols], exp)
    groups: dict[tuple, list] = {}
    for j, keys in holders.items():
        groups.setdefault(tuple(sorted(keys)), []).append(j)
    exp = np.zeros_like(got)
    for keys, cells in groups.items():
        vis = [k for k in keys if k in visible]
        assert len(vis) <= len(cells), f"{name}: {len(vis)} visible rows {vis} share {len(cells)} cells"
        best = None
        for perm in itertools.permutations(cells, len(vis)):
            trial = np.zeros((got.shape[0], len(cells)))
            for k, j in zip(vis, perm):
                trial[:, cells.index(j)] = np.ravel(ref.cols[k])
            e = np.linalg.norm(got[:, cells] - trial)
            if best is None or e < best[0]:
                best = (e, trial)
        exp[:, cells] = best[1]
    return _rel(got, exp)


def compare_graph(dump_path, ref_list, final, type_kv, flash_attn):
    """Every cb-named node of the dump against the reference; returns {name: worst error}."""
    by_name: dict[str, list] = {}
    for name, val in ref_list:
        by_name.setdefault(name, []).append(val)
    used: dict[str, set] = {}
    worst: dict[str, float] = {}
    seen = set()
    with load_dump(dump_path) as d:
        tol = TOL
        for i, n in enumerate(d.nodes):
            if n.op == "FLASH_ATTN_EXT" or n.name.startswith("kqv-"):
                tol = TOL_AFTER_ATTN[(type_kv, flash_attn)]
            if n.name not in by_name:
                continue
            seen.add(n.name)
            cands = by_name[n.name]
            errs = []
            for k, ref in enumerate(cands):
                if k in used.get(n.name, set()):
                    continue
                if isinstance(ref, KVAxis):
                    il = int(n.name.rsplit("-", 1)[1])
                    errs.append((_compare_kv(d, i, n.name, ref, il), k))
                    continue
                v = _node_values(d, i)
                if v.size != np.size(ref):
                    continue
                errs.append((_rel(v, ref), k))
            assert errs, f"{dump_path}: node {i} {n.name} ({n.op}, ne {n.ne}) has no reference of its size"
            err, k = min(errs)
            used.setdefault(n.name, set()).add(k)
            if n.type.startswith("i"):
                assert err == 0.0, f"{dump_path}: node {i} {n.name} differs from the reference"
            assert err <= tol, f"{dump_path}: node {i} {n.name} ({n.op}): relative error {err:.3g} > {tol:g}"
            worst[n.name] = max(worst.get(n.name, 0.0), err)
        missing = {m for m in set(by_name) - seen if m.rsplit("-", 1)[0] not in RENAMED}
        assert not missing, f"{dump_path}: the seed names {sorted(missing)} but the graph has no such node"
        if final is not None:
            last = _node_values(d, len(d.nodes) - 1).reshape(final.shape)
            err = _rel(last, final)
            assert err <= tol, f"{dump_path}: the drafted logits differ ({err:.3g})"
            worst["<drafted logits>"] = err
    return worst


def _op_sequence(dump_path, graphs: SeedGraphs, ub: UBatch):
    """Every node's name, op and shape against the sequence traced from the seed's builders."""
    expected = [(t.name, t.op, t.ne) for t in graphs.build(ub)]
    with load_dump(dump_path) as d:
        got = [(n.name, n.op, tuple(n.ne)) for n in d.nodes]
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{dump_path}: node {i} is {g}, the seed's builder gives {e}"
    assert len(got) == len(expected), f"{dump_path}: {len(got)} nodes, the seed's builder gives {len(expected)}"
    return len(got)


def _compare_conf(dump_path, conf, n_embd):
    """The confidence head's output (t_h_nextn: each slot's estimate broadcast over n_embd)."""
    with load_dump(dump_path) as d:
        reps = [i for i, n in enumerate(d.nodes) if n.op == "REPEAT" and tuple(n.ne[:2]) == (n_embd, len(conf))]
        assert reps, f"{dump_path}: no confidence output"
        got = _node_values(d, reps[-1]).reshape(len(conf), n_embd)
    assert np.array_equal(got, np.repeat(got[:, :1], n_embd, axis=1))
    return _rel(got[:, 0], conf)


def run_case(tmp_path, backbone, rounds, *, n_layer=1, flash_attn=False, type_kv="f16", block_size=4,
             swa_window=4, joint=None, conf=False, seed=0, **opts):
    """Run the scenario through graphgen and the seed reference side by side; every inject and
    block dump is checked node by node (values and op sequence). Returns {node name: worst error}
    and the configuration's counters."""
    kw = dict(n_layer=n_layer, block_size=block_size, swa_window=swa_window, seed=seed, conf=conf, **opts)
    if backbone == "mistral-large4":
        kw["joint"] = joint
    path = make_model(tmp_path / f"{backbone}.gguf", "dspark", backbone, **kw)["path"]
    doc = _scenario(rounds, flash_attn, type_kv)
    out = tmp_path / "out"
    run_scenario(path, parse_scenario(doc), out)
    ref = SeedReference(path, type_kv=type_kv, flash_attn=flash_attn)
    # n_ctx 256: the window cache holds 256 cells and every graph sees all of them
    graphs = SeedGraphs(path, flash_attn=flash_attn, type_kv=type_kv, n_kv=256, kv_size=256)
    n_inp = int(len(ref.d["target_layers"]) * ref.n_embd)
    dumps = sorted(p for p in out.glob("*.json"))
    report, nodes = {}, 0
    k = 0
    for index, step in enumerate(doc["steps"]):
        if "seq_rm" in step:
            s = step["seq_rm"]
            ref.seq_rm(s["seq"], s["p0"], s["p1"])
            continue
        dump = dumps[k]
        k += 1
        if "inject" in step:
            s = step["inject"]
            cb = ref.inject(_features(doc["seed"], index, s["n_tokens"], n_inp), s["pos0"], s["seq"])
            final = None
            nodes += _op_sequence(dump, graphs, UBatch(s["n_tokens"], 1, embd=True))
        else:
            blocks = [(b["seq"], b["tokens"], b["pos0"]) for b in step["block"]["seqs"]]
            cb, final = ref.block(blocks)
            nodes += _op_sequence(dump, graphs, UBatch(sum(len(b[1]) for b in blocks), len(blocks)))
            if ref.conf is not None:
                err = _compare_conf(dump, ref.conf, ref.n_embd)
                assert err <= TOL_AFTER_ATTN[(type_kv, flash_attn)], f"{dump}: confidences differ ({err:.3g})"
                report["<confidence>"] = max(report.get("<confidence>", 0.0), err)
        worst = compare_graph(dump, cb, final, type_kv, flash_attn)
        for name, err in worst.items():
            report[name] = max(report.get(name, 0.0), err)
    return report, {"nodes": nodes, "hidden_by_window": ref.hidden_by_window,
                    "seen_through_anchor": ref.seen_through_anchor}


def _rounds(n_seq, block, tok0=7):
    """Two drafting rounds: 6 (and 5) positions injected, a block per sequence; then two accepted
    positions injected and a second block after seq_rm."""
    r1 = [(s, 6 - s, [tok0 + s] + [255] * (block - 1)) for s in range(n_seq)]
    r2 = [(s, 2, [tok0 + 20 + s] + [255] * (block - 1)) for s in range(n_seq)]
    return [r1, r2]


CASES = [
    # backbone, layers, FA, block, sequences, cache type, block_size, heads, draft options
    ("dsv41", 1, False, 4, 1, "f16", 4, "", {}),
    ("dsv41", 2, True, 4, 2, "f16", 4, "conf", {}),
    ("dsv41", 3, False, 8, 2, "f16", 8, "", {}),
    ("dsv41", 2, False, 2, 3, "f32", 4, "conf", {}),
    ("dsv41", 1, True, 3, 2, "f32", 4, "", {}),
    ("mistral-large4", 1, False, 4, 1, "f16", 4, "rnn", {}),
    ("mistral-large4", 2, True, 4, 2, "f16", 4, "rnn", {}),
    ("mistral-large4", 3, False, 8, 2, "f16", 8, "rnn", {}),
    # a cap near the logits' size, where the softcap's tanh bends them
    ("mistral-large4", 2, False, 2, 3, "f32", 4, "rnn+conf", {"final_softcap": 1.5}),
    ("mistral-large4", 1, True, 5, 2, "f32", 6, "conf", {}),
    ("mistral-large4", 2, False, 4, 2, "f32", 4, "", {"final_softcap": 1.5}),
]


def _case_id(c):
    return (f"{c[0]}-L{c[1]}-fa{'on' if c[2] else 'off'}-b{c[3]}-s{c[4]}-{c[5]}" + (f"-{c[7]}" if c[7] else "")
            + "".join(f"-{k}{v}" for k, v in c[8].items()))


@pytest.mark.parametrize("backbone, n_layer, fa, block, n_seq, type_kv, block_size, heads, opts", CASES,
                         ids=[_case_id(c) for c in CASES])
def test_against_the_seed_reference(tmp_path, backbone, n_layer, fa, block, n_seq, type_kv, block_size, heads,
                                    opts):
    report, seen = run_case(tmp_path, backbone, _rounds(n_seq, block), n_layer=n_layer, flash_attn=fa,
                            type_kv=type_kv, block_size=block_size, joint=True if "rnn" in heads else None,
                            conf="conf" in heads, **opts)
    # the configuration exercises the window and the block-uniform mask, and every node was checked
    assert seen["hidden_by_window"] > 0
    assert block < 3 or seen["seen_through_anchor"] > 0
    assert "<drafted logits>" in report and ("conf" not in heads or "<confidence>" in report)


# --- the reference's helpers against llama.cpp b11739 itself -------------------------------------
# DeepSeek-V4 is in b11739 and shares every helper with DeepSeek-V4.1 (norms, the K-only window
# attention with sinks, rope and de-rope, grouped wo_a, the hyper-connection mixes and the fused
# HC ops, the MoE with its shared expert, the Markov head): the same reference and the same trace
# must reproduce llama.cpp's own dumps, values and every node.

@pytest.mark.parametrize("case", ["dsv4-fa-off", "dsv4-fa-on"])
def test_reference_matches_llama_cpp_on_dsv4(case, models_dir):
    from conftest import REF_DIR
    from make_references import build_model
    case_dir = REF_DIR / case
    doc = json.loads((case_dir / "scenario.json").read_text())
    path = build_model(case_dir, models_dir)
    fa = doc["flash_attn"] == "on"
    ref = SeedReference(path, type_kv=doc["type_kv"], flash_attn=fa)
    graphs = SeedGraphs(path, flash_attn=fa, type_kv=doc["type_kv"], n_kv=256, kv_size=256)
    n_inp = int(len(ref.d["target_layers"]) * ref.n_embd)
    (inj, blk) = doc["steps"]
    cb = ref.inject(_features(doc["seed"], 0, inj["inject"]["n_tokens"], n_inp), inj["inject"]["pos0"])
    assert _op_sequence(case_dir / "00-inject.json", graphs, UBatch(inj["inject"]["n_tokens"], 1, embd=True)) == 17
    compare_graph(case_dir / "00-inject.json", cb, None, doc["type_kv"], fa)
    blocks = [(b["seq"], b["tokens"], b["pos0"]) for b in blk["block"]["seqs"]]
    cb, final = ref.block(blocks)
    n = _op_sequence(case_dir / "01-block.json", graphs, UBatch(sum(len(b[1]) for b in blocks), len(blocks)))
    assert n == (260 if fa else 270)
    worst = compare_graph(case_dir / "01-block.json", cb, final, doc["type_kv"], fa)
    assert len(worst) > 60
