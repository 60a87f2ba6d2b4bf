"""Bad input raises an exception naming the problem; nothing aborts the interpreter."""

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from graphgen.errors import BatchError, GGUFModelError, KVCacheFullError
from graphgen.runtime.model import load
from graphgen.runtime.session import Session
from graphgen.synth import make_model
from gguf_edit import rewrite


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("err") / "tiny.gguf"
    make_model(p, "dflash", seed=3)
    return p


def test_missing_file(tmp_path):
    with pytest.raises(GGUFModelError, match="no such file"):
        load(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"hello world, not a gguf at all")
    with pytest.raises(GGUFModelError, match="not a GGUF"):
        load(p)


def test_truncated(tiny, tmp_path):
    data = tiny.read_bytes()
    for cut in (24, 200, len(data) // 2, len(data) - 10):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(GGUFModelError):
            load(p)


def test_missing_target_layers(tiny, tmp_path):
    p = rewrite(tiny, tmp_path / "a.gguf", drop_keys={"dflash.target_layers"})
    with pytest.raises(GGUFModelError, match="target_layers"):
        load(p)


def test_missing_required_key(tiny, tmp_path):
    p = rewrite(tiny, tmp_path / "a.gguf", drop_keys={"dflash.attention.layer_norm_rms_epsilon"})
    with pytest.raises(GGUFModelError, match="layer_norm_rms_epsilon"):
        load(p)


def test_conv_group_size_divisibility(tiny, tmp_path):
    p = rewrite(tiny, tmp_path / "a.gguf", set_keys={"dflash.conv_group_size": (gguf.GGUFValueType.UINT32, 7),
                                                     "dflash.conv_kernel_size": (gguf.GGUFValueType.UINT32, 3)})
    with pytest.raises(GGUFModelError, match="divisible by conv_group_size"):
        load(p)
    # without a kernel size the group size configures no conv, and llama.cpp does not check it
    p = rewrite(tiny, tmp_path / "b.gguf", set_keys={"dflash.conv_group_size": (gguf.GGUFValueType.UINT32, 7)})
    load(p).close()


def test_dflash2_missing_metadata(tmp_path):
    src = tmp_path / "d2.gguf"
    make_model(src, "dflash2", seed=1)
    p = rewrite(src, tmp_path / "a.gguf", drop_keys={"dflash.selector_rank"})
    with pytest.raises(GGUFModelError, match="DFlash2 model is missing conv/selector metadata"):
        load(p)


def test_swa_without_sliding_layer(tiny, tmp_path):
    p = rewrite(tiny, tmp_path / "a.gguf", set_keys={
        "dflash.attention.sliding_window": (gguf.GGUFValueType.UINT32, 4),
        "dflash.attention.sliding_window_pattern": (gguf.GGUFValueType.ARRAY, [False, False])})
    with pytest.raises(GGUFModelError, match="marks no layer"):
        load(p)


def test_wrong_tensor_shape(tiny, tmp_path):
    p = rewrite(tiny, tmp_path / "a.gguf", reshape={"blk.0.attn_q.weight": (64, 32)})
    with pytest.raises(GGUFModelError, match=r"blk\.0\.attn_q\.weight.*shape"):
        load(p)


def test_missing_tensor(tiny, tmp_path):
    p = rewrite(tiny, tmp_path / "a.gguf", drop_tensors={"blk.1.ffn_down.weight"})
    with pytest.raises(GGUFModelError, match=r"missing tensor 'blk\.1\.ffn_down\.weight'"):
        load(p)


def test_absurd_dims(tiny, tmp_path):
    p = rewrite(tiny, tmp_path / "a.gguf", drop_keys={"dflash.embedding_length"},
                set_keys={"dflash.embedding_length": (gguf.GGUFValueType.UINT64, 1 << 40)})
    with pytest.raises(GGUFModelError, match="embedding_length"):
        load(p)


def test_bad_batches(tiny):
    with Session(tiny, n_ctx=32, n_ubatch=8) as s:
        w = s.hparams.n_embd_inp_enc
        with pytest.raises(BatchError, match="n_ubatch"):
            s.inject(np.zeros((9, w), np.float32), 0)
        with pytest.raises(BatchError, match=r"\[n_tokens, 128\]"):
            s.inject(np.zeros((3, w - 1), np.float32), 0)
        with pytest.raises(BatchError, match="negative position"):
            s.block([1, 2], -1)
        with pytest.raises(BatchError, match="sequence id 1"):
            s.block([1, 2], 0, seq=1)
        with pytest.raises(BatchError, match="token id 256"):
            s.block([1, 256], 0)
        with pytest.raises(BatchError, match="at least one token"):
            s.block([], 0)
        # the session still works after every refusal
        r = s.block([1, 255], 0)
        assert r.logits.shape == (2, 256) and np.isfinite(r.logits).all()


def test_kv_cache_exhaustion_keeps_the_cache(tiny):
    # the cache holds 256 cells (llama.cpp pads n_ctx to 256): four chunks of 64 fill it
    with Session(tiny, n_ctx=256, n_ubatch=64) as s:
        w = s.hparams.n_embd_inp_enc
        x = np.random.default_rng(0).standard_normal((64, w), dtype=np.float32)
        for k in range(4):
            s.inject(x, 64 * k)
        before = s.caches["base"].snapshot()
        with pytest.raises(KVCacheFullError, match="no room"):
            s.block([1, 255, 255], 256)
        after = s.caches["base"].snapshot()
        assert all(np.array_equal(a, b) for a, b in zip(before, after))
        s.seq_rm(0, 192, -1)
        r = s.block([1, 255, 255], 192)
        assert np.isfinite(r.logits).all()


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "graphgen.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_errors_are_one_line(tiny, tmp_path):
    sc = tmp_path / "s.json"
    cases = []
    cases.append(run_cli("info", str(tmp_path / "missing.gguf")))
    junk = tmp_path / "junk.gguf"
    junk.write_text("not gguf")
    cases.append(run_cli("info", str(junk)))
    sc.write_text(json.dumps({"steps": [{"teleport": {}}]}))
    cases.append(run_cli("dump", str(tiny), "--scenario", str(sc), "--out", str(tmp_path / "o")))
    sc.write_text(json.dumps({"n_ubatch": 4, "steps": [{"block": {"tokens": [1, 2, 3, 4, 5], "pos0": 0}}]}))
    cases.append(run_cli("dump", str(tiny), "--scenario", str(sc), "--out", str(tmp_path / "o")))
    bad_dump = tmp_path / "00-block.json"
    bad_dump.write_text(json.dumps({"format": "other/9", "nodes": []}))
    cases.append(run_cli("diff", str(bad_dump), str(bad_dump)))
    for p, want in zip(cases, ["no such file", "not a GGUF", "unknown step 'teleport'", "longer than n_ubatch",
                              "format"]):
        assert p.returncode == 2, p.stderr
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("graphgen: error:"), p.stderr
        assert want in lines[0], lines[0]
        assert "Traceback" not in p.stderr


def test_info_prints_variant_and_tensors(tiny):
    p = run_cli("info", str(tiny))
    assert p.returncode == 0, p.stderr
    assert "variant   dflash" in p.stdout and "backbone  base" in p.stdout
    assert "blk.1.ffn_up.weight" in p.stdout and "target_layers" in p.stdout


def test_absurd_array_count_is_refused_quickly(tiny, tmp_path):
    """An array claiming 2^62 elements: gguf-py would loop on it; the layout walk refuses it at once."""
    import struct
    import time
    data = bytearray(tiny.read_bytes())
    key = b"tokenizer.ggml.tokens"
    at = data.index(key) + len(key) + 4 + 4  # past the key, its type (array) and the element type
    struct.pack_into("<Q", data, at, 1 << 62)
    p = tmp_path / "huge.gguf"
    p.write_bytes(bytes(data))
    t0 = time.perf_counter()
    with pytest.raises(GGUFModelError, match="tokenizer.ggml.tokens"):
        load(p)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("eps", [-1.0, float("nan")])
def test_negative_or_nan_epsilon(tiny, tmp_path, eps):
    # ggml's rms_norm asserts eps >= 0: graphgen refuses the file instead (found by the fuzzer)
    p = rewrite(tiny, tmp_path / "a.gguf", drop_keys={"dflash.attention.layer_norm_rms_epsilon"},
                set_keys={"dflash.attention.layer_norm_rms_epsilon": (gguf.GGUFValueType.FLOAT32, eps)})
    with pytest.raises(GGUFModelError, match="layer_norm_rms_epsilon"):
        load(p)
