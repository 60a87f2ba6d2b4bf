"""Quantized KV caches: the types, llama.cpp's Hadamard rotations and refusals, and the commands
that take them (draft, bench, dump, xdiff). Graph-level parity with b11739 is in test_parity.py
(the committed quantized cases) and the random live configurations."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from graphgen.graph import hadamard
from graphgen.runtime.kvcache import KVCache
from graphgen.runtime.session import Session
from graphgen.cachetypes import KV_QUANTIZED
from graphgen.play.scenario import ScenarioError, parse_scenario
from graphgen.synth import make_model

# ggml type ids and their block layout (bytes per block of 32 values), from ggml's type traits
F16, Q8_0, Q4_0 = 1, 8, 2
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18}

STEPS = [{"inject": {"n_tokens": 6, "pos0": 0}}, {"block": {"tokens": [7, 255, 255, 255], "pos0": 6}}]


def run(*args):
    return subprocess.run([sys.executable, "-m", "graphgen.cli", *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def d128(tmp_path_factory):
    """n_embd 128, 2 heads of 64: heads a rotation applies to."""
    p = tmp_path_factory.mktemp("kvq") / "d128.gguf"
    make_model(p, "dflash", n_embd=128, n_head=2)
    return p


@pytest.fixture(scope="module")
def d16(tmp_path_factory):
    """The tiny default: 4 heads of 16, not a whole q8_0 block."""
    p = tmp_path_factory.mktemp("kvq") / "d16.gguf"
    make_model(p, "dflash")
    return p


def scenario_file(tmp_path, fa="on", **types):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"n_ctx": 256, "n_ubatch": 64, "flash_attn": fa, "seed": 1, "steps": STEPS, **types}))
    return p


# -- the rotation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [64, 128, 256])
def test_hadamard_is_the_orthonormal_sylvester_matrix(n):
    h = hadamard(n)
    assert h.dtype == np.float32 and h.shape == (n, n)
    # Sylvester's construction: the sign of entry (i, j) is the parity of the bits i and j share
    i, j = np.indices((n, n))
    signs = np.vectorize(lambda a: -1.0 if bin(a).count("1") % 2 else 1.0)(i & j)
    scale = np.float32(1.0 / float(np.float32(math.sqrt(n))))  # llama.cpp: 1.0 / sqrtf(n), stored as float
    assert np.array_equal(h, (signs * scale).astype(np.float32))
    np.testing.assert_allclose(h.astype(np.float64) @ h.T.astype(np.float64), np.eye(n), atol=1e-6)


class _HP:
    def __init__(self, head_k, head_v=None):
        self.n_embd_head_k = head_k
        self.n_embd_head_v = head_k if head_v is None else head_v


@pytest.mark.parametrize("head,type_k,type_v,k_only,expect", [
    (64, Q8_0, Q8_0, False, (64, 64)),
    (128, Q8_0, Q8_0, False, (128, 64)),     # K: the largest power of two >= 64 dividing the head
    (192, Q4_0, Q4_0, False, (64, 64)),
    (256, Q8_0, F16, False, (256, 0)),       # only the quantized side is rotated
    (128, F16, Q4_0, False, (0, 64)),
    (96, Q8_0, Q8_0, False, (0, 0)),          # heads that are not a multiple of 64 are not rotated
    (32, Q8_0, Q8_0, False, (0, 0)),
    (128, F16, F16, False, (0, 0)),
    (128, Q8_0, Q8_0, True, (128, 0)),       # a K-only cache has no V rows to rotate
])
def test_rotation_orders(head, type_k, type_v, k_only, expect):
    c = KVCache(_HP(head), [0, 1], 256, type_k, type_v, False, k_only=k_only)
    assert (c.n_rot_k, c.n_rot_v) == expect


def test_rotation_needs_layers_and_can_be_disabled(monkeypatch):
    assert (KVCache(_HP(128), [], 256, Q8_0, Q8_0, False).n_rot_k, 0) == (0, 0)
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    c = KVCache(_HP(128), [0], 256, Q8_0, Q8_0, False)
    assert (c.n_rot_k, c.n_rot_v) == (0, 0)


# -- scenarios and sessions -----------------------------------------------------------------------
def test_scenario_types():
    sc = parse_scenario({"type_kv": "q8_0", "flash_attn": "on", "steps": STEPS})
    assert (sc.type_k, sc.type_v) == ("q8_0", "q8_0")
    sc = parse_scenario({"type_kv": "q4_0", "type_v": "f16", "steps": STEPS})
    assert (sc.type_k, sc.type_v) == ("q4_0", "f16")
    again = parse_scenario(sc.to_dict())
    assert (again.type_k, again.type_v) == ("q4_0", "f16")
    assert parse_scenario({"steps": STEPS}).type_v == "f16"
    with pytest.raises(ScenarioError, match="'type_v' q5_1 is quantized, which needs 'flash_attn' on"):
        parse_scenario({"type_v": "q5_1", "steps": STEPS})
    with pytest.raises(ScenarioError, match="'type_k' must be one of"):
        parse_scenario({"type_k": "q4_k", "steps": STEPS})


def test_session_refusals(d128, d16, tmp_path):
    with pytest.raises(ValueError, match="type_v q8_0: a quantized V cache requires flash attention"):
        Session(d128, type_kv="q8_0")
    for fa in (True, False):  # llama.cpp checks this with FA only; without, it reads misaligned K blocks
        with pytest.raises(ValueError, match="type_k q4_0: its block size 32 does not divide n_embd_head_k=16"):
            Session(d16, type_k="q4_0", flash_attn=fa)
    with pytest.raises(ValueError, match="type_v iq4_nl: its block size 32 does not divide n_embd_head_v=16"):
        Session(d16, type_v="iq4_nl", flash_attn=True)
    with pytest.raises(ValueError, match="type_k must be one of"):
        Session(d128, type_k="q4_k")
    dsv4 = tmp_path / "dsv4.gguf"
    make_model(dsv4, "dspark", backbone="dsv4", head_dim=64, n_rot=16)
    with pytest.raises(ValueError, match="reads V from the K cache, so a quantized K cache requires flash"):
        Session(dsv4, type_k="q8_0")
    with Session(dsv4, type_k="q8_0", flash_attn=True) as s:
        assert s.caches["swa"].n_rot_k == 64 and s.caches["swa"].n_rot_v == 0


# b11739's node counts for this draft (2 layers, 2 heads of 64), FA on / off
@pytest.mark.parametrize("type_k,type_v,fa,counts", [
    ("f16", "f16", True, (25, 74)),
    ("q8_0", "q8_0", True, (37, 98)),
    ("q4_0", "f16", False, (35, 96)),
    ("f16", "q5_0", True, (31, 86)),
])
def test_node_counts(d128, type_k, type_v, fa, counts):
    with Session(d128, type_k=type_k, type_v=type_v, flash_attn=fa) as s:
        inj = s.inject(np.random.default_rng(0).standard_normal((6, 256), dtype=np.float32), 0)
        blk = s.block([7, 255, 255, 255], 6)
        assert (inj.n_nodes, blk.n_nodes) == counts
        assert s.settings("block")["type_k"] == type_k and s.settings("block")["type_v"] == type_v


def test_rotated_quantized_cache_tracks_f16(d128, monkeypatch):
    """The rotations are undone after attention: a q8_0 cache gives logits within quantization
    noise of an f16 cache, and different from an unrotated q8_0 cache."""
    feats = np.random.default_rng(0).standard_normal((6, 256), dtype=np.float32)

    def logits(**kw):
        with Session(d128, flash_attn=True, **kw) as s:
            s.inject(feats, 0)
            return s.block([7, 255, 255, 255], 6).logits.astype(np.float64)
    ref = logits(type_kv="f16")
    nmse = lambda x: float(((x - ref) ** 2).sum() / (ref ** 2).sum())  # noqa: E731
    q8 = logits(type_kv="q8_0")
    assert 0 < nmse(q8) < 1e-3
    assert nmse(logits(type_kv="q4_0")) < 2e-2
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    plain = logits(type_kv="q8_0")
    assert 0 < nmse(plain) < 1e-3 and not np.array_equal(plain, q8)


@pytest.mark.parametrize("name", KV_QUANTIZED)
def test_cache_memory(d128, name):
    """A quantized cache holds whole blocks: bytes = cells x rows x block bytes / 32 per layer."""
    with Session(d128, type_kv=name, flash_attn=True) as s, Session(d128, flash_attn=True) as f16:
        n_layer, n_embd_gqa, cells = 2, 128, 256
        assert f16.caches["base"].nbytes == n_layer * 2 * n_embd_gqa * cells * 2
        assert s.caches["base"].nbytes == n_layer * 2 * n_embd_gqa * cells * BLOCK_BYTES[name] // 32


# -- the commands ---------------------------------------------------------------------------------
def test_cli_refuses_in_one_line(d128, d16, tmp_path):
    r = run("draft", d128, "--prompt-tokens", "1,2,3", "--type-kv", "q8_0", "-fa", "off")
    assert r.returncode == 2
    assert r.stderr.strip() == ("graphgen: error: --type-v q8_0: a quantized V cache requires flash attention "
                                "(-fa on)")
    r = run("dump", d16, "--scenario", scenario_file(tmp_path), "--type-k", "q4_1", "--out", tmp_path / "o")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "graphgen: error: type_k q4_1: its block size 32 does not divide n_embd_head_k=16"]
    r = run("dump", d128, "--scenario", scenario_file(tmp_path), "--type-kv", "q3_k", "--out", tmp_path / "o")
    assert r.returncode == 2 and "--type-kv: invalid choice: 'q3_k'" in r.stderr


def test_draft_with_quantized_cache(d128):
    r = run("draft", d128, "--prompt-tokens", "1,2,3,4,5,6", "--n-predict", "8", "--flash-attn", "on",
            "--type-k", "q8_0", "--type-v", "q4_0", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["blocks"] >= 1 and s["generated_tokens"] == 8 and len(s["tokens"]) == 6 + 8
    assert all(0 <= t < 256 for t in s["tokens"])


def test_drafter_session_keeps_its_cache_types(d128):
    from graphgen.speculative.drafters import DraftParams
    from graphgen.speculative.loop import SimulatedVerifier, open_drafter, run_speculative
    drafter = open_drafter(d128, None, DraftParams(), flash_attn=True, type_k="q4_1", type_v="q8_0")
    try:
        cache = drafter.session.caches["base"]
        assert (cache.type_k, cache.type_v, cache.n_rot_k, cache.n_rot_v) == (3, Q8_0, 64, 64)
        feats = np.random.default_rng(0).standard_normal((32, 256), dtype=np.float32)
        res = run_speculative(drafter, [([1, 2, 3, 4, 5, 6], feats)], n_predict=6, verifier=SimulatedVerifier())
        assert len(res.tokens[0]) == 12
    finally:
        drafter.session.close()


def test_dump_flags_reach_both_engines(d128, tmp_path):
    from graphgen.compare.pairing import diff_paths
    from parity_check import assert_parity
    sc = scenario_file(tmp_path, type_kv="f16")
    for engine, out in (("llama.cpp", "ref"), ("graphgen", "ours")):
        r = run("dump", d128, "--scenario", sc, "--type-k", "iq4_nl", "--type-v", "q5_1", "--engine", engine,
                "--out", tmp_path / out)
        assert r.returncode == 0, r.stderr
        doc = json.loads((tmp_path / out / "01-block.json").read_text())
        assert (doc["settings"]["type_k"], doc["settings"]["type_v"]) == ("iq4_nl", "q5_1")
        assert {n["type"] for n in doc["nodes"] if n["op"] == "SET_ROWS"} == {"iq4_nl", "q5_1"}
    assert_parity(diff_paths(tmp_path / "ref", tmp_path / "ours"), "iq4_nl / q5_1")


def test_bench_with_quantized_cache(d128, tmp_path):
    md = tmp_path / "bench.md"
    r = run("bench", d128, "--scenario", scenario_file(tmp_path, fa="off"), "--flash-attn", "on", "--type-kv", "q8_0",
            "--repeat", "2", "--json", "--markdown", md)
    assert r.returncode == 0, r.stderr
    assert "--flash-attn on --type-kv q8_0`" in md.read_text()
    steps = json.loads(r.stdout)["runs"][0]["steps"]
    assert [s["step"] for s in steps] == ["inject 6", "block 4"]
    assert all(s["median_s"]["graphgen"] > 0 and s["median_s"]["llama.cpp"] > 0 for s in steps)
    # the flags reach the scenario: a quantized V on this FA-off one is refused
    r = run("bench", d128, "--scenario", scenario_file(tmp_path, fa="off"), "--type-v", "q8_0")
    assert r.returncode == 2 and "--type-v q8_0: a quantized V cache requires flash attention" in r.stderr


def test_run_bench_uses_the_scenario_types(d128):
    from graphgen.bench import run_bench
    sc = parse_scenario({"flash_attn": "on", "type_k": "q8_0", "type_v": "q4_0", "steps": STEPS})
    res = run_bench(d128, sc, repeat=1, engines=("graphgen",))
    assert (res.scenario.get("type_k"), res.scenario.get("type_v")) == ("q8_0", "q4_0")


def test_xdiff_with_quantized_cache(d128, tmp_path, rpc_server):  # noqa: F811
    from graphgen.compare.xdiff import xdiff
    sc = parse_scenario({"flash_attn": "on", "type_k": "q8_0", "type_v": "q4_1", "steps": STEPS})
    res = xdiff(d128, sc, ["cpu", rpc_server], tmp_path / "x")
    assert res.ok, res.format_text()
    assert [g["nodes"] for g in res.graphs] == [37, 98]


def test_mla_draft_takes_one_cache_type(tmp_path):
    ml4 = tmp_path / "ml4.gguf"
    make_model(ml4, "dspark", "mistral-large4")
    with pytest.raises(ValueError, match="type_k q8_0 / type_v f16: an MLA draft does not support different K and V"):
        Session(ml4, type_k="q8_0", type_v="f16", flash_attn=True)


@pytest.mark.parametrize("backbone", ["dsv4", "dsv41"])
def test_k_only_cache_rotation_is_undone(backbone, tmp_path):
    """The DSpark backbones rotate q and the K-only cache and rotate the attention output back:
    a q8_0 cache stays within quantization noise of f16 (DeepSeek-V4.1 is not in b11739, so this
    is its check)."""
    p = tmp_path / f"{backbone}.gguf"
    make_model(p, "dspark", backbone, head_dim=64, n_rot=16)

    def logits(t):
        with Session(p, type_kv=t, flash_attn=True) as s:
            assert s.caches["swa"].n_rot_k == (64 if t == "q8_0" else 0)
            s.inject(np.random.default_rng(1).standard_normal((6, s.hparams.n_embd_inp_enc), dtype=np.float32), 0)
            return s.block([7, 255, 255, 255], 6).logits.astype(np.float64)
    ref, q8 = logits("f16"), logits("q8_0")
    nmse = float(((q8 - ref) ** 2).sum() / (ref ** 2).sum())
    assert 0 < nmse < 1e-3
