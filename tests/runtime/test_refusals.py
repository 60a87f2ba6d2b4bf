"""graphgen refuses what llama.cpp b11739 refuses, with b11739's reason, and accepts what it accepts.

Each case states graphgen's verdict (without llama.cpp) and, in the `reference`-marked twin,
b11739's verdict on the same input: GGUF keys of the wrong GGUF type, a missing tokenizer model,
and batches whose positions break llama.cpp's batch rules.
"""

import json

import gguf
import numpy as np
import pytest

from graphgen.errors import BatchError, GGUFModelError
from graphgen.runtime.model import load
from graphgen.runtime.session import Session
from graphgen.synth import make_model
from gguf_edit import rewrite
from raw_reference import run_raw

VT = gguf.GGUFValueType


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    d = tmp_path_factory.mktemp("refusals")
    out = {}
    for name, variant, backbone, kw in (("dflash", "dflash", "base", {}), ("dflash2", "dflash2", "base", {}),
                                        ("dspark", "dspark", "base", {}), ("lilicorr", "lilicorr", "base", {}),
                                        ("dsv4", "dspark", "dsv4", {}),
                                        ("mrope", "dflash", "base", {"mrope_sections": [8, 0, 0, 0]})):
        out[name] = d / f"{name}.gguf"
        make_model(out[name], variant, backbone, seed=2, **kw)
    return out


def _reference(model, steps, tmp_path, n_seq=1):
    """b11739 on a scenario: (ran, the exception)."""
    from graphgen.reference.runner import ReferenceFailed, run_reference
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps({"n_ctx": 256, "n_ubatch": 16, "n_seq": n_seq, "steps": steps}))
    try:
        run_reference(model, sc, tmp_path / "ref", max_data=0, timeout=3600)  # a hang guard, generous under load
    except ReferenceFailed as e:
        return False, e
    return True, None


STD = [{"inject": {"n_tokens": 3, "pos0": 0}},
       {"block": {"seqs": [{"seq": 0, "tokens": [1, 255, 255, 255], "pos0": 3}]}}]

# -- GGUF keys -----------------------------------------------------------------------------------

# (draft, key, (gguf type, value) or None to drop it, what graphgen's message must say, b11739's reason)
KEY_CASES = [
    ("dflash", "dflash.expert_count", (VT.UINT16, 4),
     "key 'dflash.expert_count' has wrong type u16 but expected type u32",
     "key dflash.expert_count has wrong type u16 but expected type u32"),
    ("dflash", "dflash.block_size", (VT.INT32, 4), "key 'dflash.block_size' has wrong type i32",
     "key dflash.block_size has wrong type i32 but expected type u32"),
    ("dflash", "dflash.attention.causal", (VT.UINT8, 1), "key 'dflash.attention.causal' has wrong type u8 but "
     "expected type bool", "key dflash.attention.causal has wrong type u8 but expected type bool"),
    ("dflash", "dflash.rope.freq_base", (VT.FLOAT64, 10000.0), "key 'dflash.rope.freq_base' has wrong type f64",
     "key dflash.rope.freq_base has wrong type f64 but expected type f32"),
    ("dflash", "dflash.nextn_predict_layers", (VT.INT32, 0), "key 'dflash.nextn_predict_layers' has wrong type i32",
     "key dflash.nextn_predict_layers has wrong type i32 but expected type u32"),
    ("dflash", "dflash.feed_forward_length", (VT.ARRAY, [128, 128, 128]),
     "key 'dflash.feed_forward_length' has wrong array length; expected 2, got 3",
     "key dflash.feed_forward_length has wrong array length; expected 2, got 3"),
    ("dflash", "dflash.rope.dimension_sections", (VT.UINT32, 8),
     "key 'dflash.rope.dimension_sections' has wrong type u32 but expected type i32",
     "key dflash.rope.dimension_sections has wrong type u32 but expected type i32"),
    ("dflash", "dflash.target_layers", (VT.ARRAY, [True, False]),
     "key 'dflash.target_layers' is not a string/float32/uint32/int32/uint64 array",
     "dflash.target_layers is not a string/float32/uint32/int32/uint64 array"),
    ("dflash", "tokenizer.ggml.bos_token_id", (VT.INT32, 1),
     "key 'tokenizer.ggml.bos_token_id' has wrong type i32 but expected type u32",
     "key tokenizer.ggml.bos_token_id has wrong type i32 but expected type u32"),
    ("dflash", "tokenizer.ggml.model", (VT.UINT32, 1), "key 'tokenizer.ggml.model' has wrong type u32",
     "key tokenizer.ggml.model has wrong type u32 but expected type str"),
    ("dflash", "tokenizer.ggml.model", None, "missing key 'tokenizer.ggml.model'",
     "key not found in model: tokenizer.ggml.model"),
    ("dflash", "tokenizer.ggml.model", (VT.STRING, "silu"), "'tokenizer.ggml.model' = 'silu': unknown tokenizer",
     "unknown tokenizer: 'silu'"),
    ("dflash", "tokenizer.ggml.tokens", None, "missing key 'tokenizer.ggml.tokens'",
     "cannot find tokenizer vocab in model file"),
    ("dflash2", "dflash.selector_top_k", (VT.UINT64, 2), "key 'dflash.selector_top_k' has wrong type u64",
     "key dflash.selector_top_k has wrong type u64 but expected type u32"),
    ("lilicorr", "lilicorr.hidden_size", (VT.INT32, 64), "key 'lilicorr.hidden_size' has wrong type i32",
     "key lilicorr.hidden_size has wrong type i32 but expected type u32"),
    ("lilicorr", "lilicorr.vector_eps", (VT.FLOAT64, 1e-6), "key 'lilicorr.vector_eps' has wrong type f64",
     "key lilicorr.vector_eps has wrong type f64 but expected type f32"),
    ("dspark", "lilicorr.logit_scale", (VT.ARRAY, [1, 2]),
     "key 'lilicorr.logit_scale' has wrong type arr but expected type f32",
     "key lilicorr.logit_scale has wrong type arr but expected type f32"),
    ("dsv4", "dflash.expert_weights_norm", (VT.UINT8, 1), "key 'dflash.expert_weights_norm' has wrong type u8",
     "key dflash.expert_weights_norm has wrong type u8 but expected type bool"),
    ("dsv4", "dflash.hyper_connection.epsilon", (VT.FLOAT64, 1e-6),
     "key 'dflash.hyper_connection.epsilon' has wrong type f64",
     "key dflash.hyper_connection.epsilon has wrong type f64 but expected type f32"),
    ("dsv4", "dflash.swiglu_clamp_exp", (VT.ARRAY, [1, 1]),
     "key 'dflash.swiglu_clamp_exp' has wrong array element type i32",
     "dflash.swiglu_clamp_exp has wrong array element type i32"),
    ("dsv4", "dflash.expert_count", (VT.UINT16, 4), "key 'dflash.expert_count' has wrong type u16",
     "key dflash.expert_count has wrong type u16 but expected type u32"),
]

# keys of a wrong type that b11739 never reads for that draft: both accept
ACCEPTED_KEY_CASES = [
    ("dflash", "dflash.expert_shared_count", (VT.FLOAT32, 1.0)),        # a DeepSeek-V4 key on the base backbone
    ("dflash", "dflash.attention.sliding_window_pattern", (VT.UINT16, 1)),  # read only with a sliding window
    ("dflash", "dflash.hyper_connection.sinkhorn_iterations", (VT.FLOAT32, 3.0)),  # DeepSeek-V4 only
    ("dflash", "dflash.attention.compress_ratios", (VT.FLOAT32, 1.0)),  # a DeepSeek-V4 key on the base backbone
    ("dflash", "tokenizer.ggml.mask_token_id", (VT.UINT32, 4096)),      # out of the vocabulary: ignored
    ("dflash", "dflash.feed_forward_length", (VT.ARRAY, [128, 128])),   # a per-layer array of one value
    ("lilicorr", "dflash.conv_group_size", (VT.UINT32, 7)),             # no conv without a kernel size
]


def _edited(drafts, tmp_path, draft, key, kv):
    dst = tmp_path / "edited.gguf"
    if kv is None:
        return rewrite(drafts[draft], dst, drop_keys={key})
    return rewrite(drafts[draft], dst, drop_keys={key}, set_keys={key: kv})


def _case_id(c):
    return f"{c[0]}-{c[1]}-{'dropped' if c[2] is None else c[2][0].name.lower()}"


@pytest.mark.parametrize("case", KEY_CASES, ids=_case_id)
def test_key_refused_with_llama_cpp_reason(case, drafts, tmp_path):
    draft, key, kv, ours, _ = case
    p = _edited(drafts, tmp_path, draft, key, kv)
    with pytest.raises(GGUFModelError) as e:
        load(p)
    assert ours in str(e.value) and key in str(e.value)


@pytest.mark.reference
@pytest.mark.parametrize("case", KEY_CASES, ids=_case_id)
def test_key_refused_by_b11739(case, drafts, tmp_path):
    draft, key, kv, _, upstream = case
    p = _edited(drafts, tmp_path, draft, key, kv)
    ran, e = _reference(p, STD, tmp_path)
    assert not ran and upstream in str(e), str(e)


@pytest.mark.parametrize("case", ACCEPTED_KEY_CASES, ids=_case_id)
def test_key_b11739_never_reads_is_accepted(case, drafts, tmp_path):
    p = _edited(drafts, tmp_path, *case)
    m = load(p)
    m.close()


@pytest.mark.reference
@pytest.mark.parametrize("case", ACCEPTED_KEY_CASES, ids=_case_id)
def test_key_b11739_never_reads_is_accepted_by_b11739(case, drafts, tmp_path):
    p = _edited(drafts, tmp_path, *case)
    ran, e = _reference(p, STD, tmp_path)
    assert ran, str(e)


def test_mask_token_outside_the_vocabulary_is_ignored(drafts, tmp_path):
    """llama.cpp warns about a special token id outside the vocabulary and keeps its default."""
    p = _edited(drafts, tmp_path, "dflash", "tokenizer.ggml.mask_token_id", (VT.UINT32, 4096))
    assert load(p).hparams.mask_token_id == -1


def test_every_key_graphgen_reads_has_a_type():
    """Every key graphgen's loaders read goes through KEY_TYPES (a key without an entry would be
    read without llama.cpp's type rule)."""
    import re
    from pathlib import Path

    import graphgen
    from graphgen.models.loader import key_spec
    root = Path(graphgen.__file__).parent
    keys = set()
    for f in [root / "runtime" / "model.py", *(root / "models").glob("*.py")]:
        text = f.read_text()
        keys |= {"dflash." + k for k in re.findall(r'\b(?:k|kv)\("([a-z_.]+)"\)', text)}
        keys |= set(re.findall(r'"((?:lilicorr|tokenizer\.ggml|general)\.[a-z_.]+)"', text))
    keys = {k for k in keys if not k.endswith((".weight", ".bias", ".scale")) and "layers." not in k
            and "{" not in k and not re.search(r"lilicorr\.(token_proj|pass_hidden_proj|slot_embedding|rank_embedding|"
                                               r"attention_bias|context_proj|output_norm|anchor_norm|"
                                               r"factor_input_proj|out_head|in_head|anchor_out_head)$", k)}
    missing = sorted(k for k in keys if key_spec(k) is None)
    assert not missing, missing


# -- batches -------------------------------------------------------------------------------------

def _feat(s, n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, s.hparams.n_embd_inp_enc), dtype=np.float32)


def test_gap_within_a_sequence_of_one_batch(drafts):
    with Session(drafts["dflash"], n_ctx=256) as s:
        s.inject(_feat(s, 3), 0)
        with pytest.raises(BatchError, match=r"sequence 0 positions are not continuous.* between 3 and 9"):
            s.block_multi([(0, [1, 255], 3), (0, [1, 255], 8)])
        # consecutive entries of one sequence are one block to llama.cpp, and to graphgen
        r = s.block_multi([(0, [1, 255], 3), (0, [1, 255], 5)])
        assert r.logits.shape == (4, 256)


def test_decreasing_positions_within_a_sequence(drafts):
    with Session(drafts["dflash"], n_ctx=256) as s:
        s.inject(_feat(s, 3), 0)
        with pytest.raises(BatchError, match=r"sequence 0 positions are decreasing \(not allowed\): batch row 4 has "
                                             r"position 3 after position 6"):
            s.block_multi([(0, [1, 255, 255, 255], 3), (0, [1, 255], 3)])


def test_second_inject_over_used_positions(drafts):
    with Session(drafts["dflash"], n_ctx=256) as s:
        s.inject(_feat(s, 6), 0)
        with pytest.raises(BatchError, match=r"sequence 0: inconsistent sequence positions: the KV cache's last "
                                             r"position for sequence 0 is X = 5 and the batch starts at position "
                                             r"Y = 2; .*Y = X \+ 1"):
            s.inject(_feat(s, 3), 2)
        # the refusal left the cache as it was: the next chunk follows on
        s.inject(_feat(s, 3), 6)
        assert s.seq_pos_max(0) == 8


def test_two_blocks_at_one_position_need_seq_rm(drafts):
    with Session(drafts["dflash"], n_ctx=256) as s:
        s.inject(_feat(s, 3), 0)
        s.block([1, 255, 255, 255], 3)
        with pytest.raises(BatchError, match=r"sequence 0: .*X = 6 .*Y = 3"):
            s.block([1, 255, 255, 255], 3)
        s.seq_rm(0, 3, -1)
        s.block([1, 255, 255, 255], 3)


def test_gap_after_the_cache(drafts):
    with Session(drafts["dflash"], n_ctx=256) as s:
        s.inject(_feat(s, 3), 0)
        with pytest.raises(BatchError, match=r"X = 2 .*Y = 5"):
            s.block([1, 255, 255, 255], 5)
        # a sequence the cache does not hold may start anywhere
        s.seq_rm(0, -1, -1)
        s.block([1, 255, 255, 255], 5)


def test_encoder_positions_are_checked_against_the_cache(drafts):
    with Session(drafts["dflash"], n_ctx=256) as s:
        s.inject(_feat(s, 3), 0)
        with pytest.raises(BatchError, match=r"X = 2 .*Y = 0"):
            s.encode(_feat(s, 3), 0)
        s.encode(_feat(s, 3), 3)


def test_mrope_positions_may_jump_forward(drafts):
    with Session(drafts["mrope"], n_ctx=256) as s:
        s.inject(_feat(s, 3), 0)
        s.inject(_feat(s, 2), 2)   # an embedding batch may start at the last position
        with pytest.raises(BatchError, match=r"X = 3 .*Y = 1; with M-RoPE llama.cpp requires X <= Y"):
            s.inject(_feat(s, 2), 1)
        with pytest.raises(BatchError, match=r"X = 3 .*Y = 3; with M-RoPE llama.cpp requires X < Y"):
            s.block([1, 255, 255, 255], 3)
        s.block([1, 255, 255, 255], 9)


def test_head_blocks_must_divide_evenly(drafts):
    with Session(drafts["dspark"], n_ctx=256, n_seq=2) as s:
        s.inject(_feat(s, 3), 0, 0)
        s.inject(_feat(s, 3), 0, 1)
        with pytest.raises(BatchError, match=r"5 tokens over 2 sequences .* equal blocks"):
            s.block_multi([(0, [1, 255, 255], 3), (1, [1, 255], 3)])
        s.block_multi([(0, [1, 255, 255], 3), (1, [1], 3)])  # 4 tokens, 2 sequences: llama.cpp runs it


def test_dflash2_block_longer_than_trained(drafts):
    with Session(drafts["dflash2"], n_ctx=256) as s:
        s.inject(_feat(s, 3), 0)
        with pytest.raises(BatchError, match=r"blocks of 6 tokens are longer than the trained block size 4"):
            s.block([1] + [255] * 5, 3)


# the same batches in b11739: (draft, steps, n_seq, refused?, what llama.cpp says)
RAW_CASES = {
    "gap-in-batch": ("dflash", [{"inject": {"n_tokens": 3, "pos0": 0}},
                                {"block": {"seqs": [{"seq": 0, "tokens": [1, 255], "pos0": 3},
                                                    {"seq": 0, "tokens": [1, 255], "pos0": 8}]}}], 1, True,
                     "sequence 0 positions are not continuous"),
    "consecutive-in-batch": ("dflash", [{"inject": {"n_tokens": 3, "pos0": 0}},
                                        {"block": {"seqs": [{"seq": 0, "tokens": [1, 255], "pos0": 3},
                                                            {"seq": 0, "tokens": [1, 255], "pos0": 5}]}}],
                             1, False, ""),
    "decreasing-in-batch": ("dflash", [{"inject": {"n_tokens": 3, "pos0": 0}},
                                       {"block": {"seqs": [{"seq": 0, "tokens": [1, 255, 255, 255], "pos0": 3},
                                                           {"seq": 0, "tokens": [1, 255], "pos0": 3}]}}], 1, True,
                            "sequence 0 positions are decreasing (not allowed)"),
    "second-inject": ("dflash", [{"inject": {"n_tokens": 6, "pos0": 0}}, {"inject": {"n_tokens": 3, "pos0": 2}}], 1,
                      True, "it is required that the sequence positions remain consecutive: Y = X + 1"),
    "two-blocks": ("dflash", STD + [{"block": {"seqs": [{"seq": 0, "tokens": [1, 255, 255, 255], "pos0": 3}]}}], 1,
                   True, "for sequence 0 is X = 6"),
    "two-blocks-seq-rm": ("dflash", STD + [{"seq_rm": {"seq": 0, "p0": 3, "p1": -1}},
                                           {"block": {"seqs": [{"seq": 0, "tokens": [1, 255, 255, 255], "pos0": 3}]}}],
                          1, False, ""),
    "encode-over-cache": ("dflash", [{"inject": {"n_tokens": 3, "pos0": 0}}, {"encode": {"n_tokens": 3, "pos0": 0}}],
                          1, True, "Y = X + 1"),
    "mrope-embd-at-last": ("mrope", [{"inject": {"n_tokens": 3, "pos0": 0}}, {"inject": {"n_tokens": 2, "pos0": 2}}],
                           1, False, ""),
    "mrope-block-at-last": ("mrope", [{"inject": {"n_tokens": 3, "pos0": 0}},
                                      {"block": {"seqs": [{"seq": 0, "tokens": [1, 255, 255, 255], "pos0": 2}]}}], 1,
                            True, "for M-RoPE, it is required that the position satisfies: X < Y"),
    "dspark-3+1": ("dspark", [{"inject": {"n_tokens": 3, "pos0": 0}}, {"inject": {"n_tokens": 3, "pos0": 0, "seq": 1}},
                              {"block": {"seqs": [{"seq": 0, "tokens": [1, 255, 255], "pos0": 3},
                                                  {"seq": 1, "tokens": [1], "pos0": 3}]}}], 2, False, ""),
    "dspark-3+2": ("dspark", [{"inject": {"n_tokens": 3, "pos0": 0}}, {"inject": {"n_tokens": 3, "pos0": 0, "seq": 1}},
                              {"block": {"seqs": [{"seq": 0, "tokens": [1, 255, 255], "pos0": 3},
                                                  {"seq": 1, "tokens": [1, 255], "pos0": 3}]}}], 2, True,
                   "equal-size blocks"),
    "dflash2-long-block": ("dflash2", [{"inject": {"n_tokens": 3, "pos0": 0}},
                                       {"block": {"seqs": [{"seq": 0, "tokens": [1] + [255] * 5, "pos0": 3}]}}], 1,
                           True, "tensor read out of bounds"),
}


def _ours_raw(model, steps, n_seq):
    """graphgen on the same steps (features as the scenario's: seed 1 + step index)."""
    with Session(model, n_ctx=256, n_ubatch=16, n_seq=n_seq) as s:
        for i, step in enumerate(steps):
            (kind, b), = step.items()
            if kind in ("inject", "encode"):
                x = np.random.default_rng(1 + i).standard_normal((b["n_tokens"], s.hparams.n_embd_inp_enc),
                                                                 dtype=np.float32)
                (s.inject if kind == "inject" else s.encode)(x, b["pos0"], b.get("seq", 0))
            elif kind == "seq_rm":
                s.seq_rm(b["seq"], b["p0"], b["p1"])
            else:
                s.block_multi([(e["seq"], e["tokens"], e["pos0"]) for e in b["seqs"]])


@pytest.mark.parametrize("name", sorted(RAW_CASES))
def test_batch_verdict(name, drafts):
    draft, steps, n_seq, refused, _ = RAW_CASES[name]
    if refused:
        with pytest.raises(BatchError, match=r"sequence|block"):
            _ours_raw(drafts[draft], steps, n_seq)
    else:
        _ours_raw(drafts[draft], steps, n_seq)


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(RAW_CASES))
def test_batch_verdict_of_b11739(name, drafts, tmp_path):
    draft, steps, n_seq, refused, why = RAW_CASES[name]
    ran, text = run_raw(drafts[draft], steps, tmp_path, n_seq)
    assert ran != refused, text
    assert why in text, text


# -- the reference's error, whole ----------------------------------------------------------------

@pytest.mark.reference
def test_reference_failure_keeps_llama_cpp_whole_error(drafts, tmp_path):
    steps = STD + [{"block": {"seqs": [{"seq": 0, "tokens": [1, 255, 255, 255], "pos0": 3}]}}]
    ran, e = _reference(drafts["dflash"], steps, tmp_path)
    assert not ran
    first, *rest = str(e).splitlines()
    # the first line summarises: the step and llama.cpp's reason, on one line
    assert "step 2 (block)" in first and "inconsistent sequence positions" in first and "Y = X + 1" in first
    # the lines after it, and `reason`, hold every line of llama.cpp's message
    for line in ("the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 "
                 "is X = 6", "the tokens for sequence 0 in the input batch have a starting position of Y = 3",
                 "decode: failed to initialize batch"):
        assert line in e.reason and any(line in r for r in rest)
    assert "llama_model_loader" in e.stderr  # the child's whole stderr is kept too
