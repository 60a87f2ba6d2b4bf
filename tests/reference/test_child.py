"""The session child (graphgen/reference/child.py): b11739 contexts driven call by call over the
runner's protocol. What its first line opens, each call's reply, the calls a context it does not
hold refuses, a first line it cannot open, and the target's best logits as a greedy sampler reads
them. Driven here line by line, as ReferenceSession and ReferenceTarget drive it."""

from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest

from graphgen.dump.format import load_dump_dir
from graphgen.play.player import draw_features
from graphgen.play.scenario import parse_scenario
from graphgen.reference.child import TOP_LOGITS, _top_logits
from graphgen.reference.protocol import LineWorker, decode_rows, encode_rows
from graphgen.reference.runner import ENV_ERROR_LOG, run_reference
from graphgen.synth import make_model

SETTINGS = {"n_ctx": 64, "n_ubatch": 16, "flash_attn": False, "type_k": "f16", "type_v": "f16", "n_seq": 2,
            "n_threads": 1}
SCENARIO = {"n_ctx": 64, "n_ubatch": 16, "flash_attn": "off", "type_kv": "f16", "n_seq": 2, "seed": 5,
            "steps": [{"inject": {"n_tokens": 5, "pos0": 0, "seq": 1}},
                      {"block": {"tokens": [7, 255, 255, 255], "pos0": 5, "seq": 1}}]}


# -- the target's best logits --------------------------------------------------------------------------

def test_the_best_logits_come_best_first_ties_in_id_order():
    logits = np.array([[1.0, 5.0, 2.0, 5.0, 5.0, 0.0],
                       [3.0, 2.0, 1.0, 0.0, 9.0, 8.0]], dtype=np.float32)
    ids, top = _top_logits(logits, 2)
    assert ids.dtype == np.int32 and ids.tolist() == [[1, 3], [4, 5]]
    assert top.tolist() == [[5.0, 5.0], [9.0, 8.0]]
    ids, top = _top_logits(logits, 4)
    assert ids.tolist() == [[1, 3, 4, 2], [4, 5, 0, 1]]
    # more asked than the vocabulary holds: every id, best first
    ids, _ = _top_logits(logits, 10)
    assert ids.tolist() == [[1, 3, 4, 2, 0, 5], [4, 5, 0, 1, 2, 3]]


def test_the_best_logits_of_a_wide_row_match_a_full_sort():
    rng = np.random.default_rng(0)
    logits = rng.integers(-20, 20, (5, 1000)).astype(np.float32)  # many ties
    ids, top = _top_logits(logits, TOP_LOGITS)
    for row, got, vals in zip(logits, ids, top):
        want = sorted(range(len(row)), key=lambda i: (-row[i], i))[:TOP_LOGITS]
        assert got.tolist() == want and vals.tolist() == row[want].tolist()


# -- the child, line by line ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    d = tmp_path_factory.mktemp("child")
    make_model(d / "draft.gguf", "dflash", n_embd=64, n_layer=1, target_layers=[1, 3], seed=6)
    return d / "draft.gguf"


def _child(tmp_path, first: dict):
    w = LineWorker([sys.executable, "-m", "graphgen.reference.child"], tmp_path / "child.err", timeout=120,
                   env={ENV_ERROR_LOG: str(tmp_path / "errors.log")})
    hello, err = w.ask(first)
    assert err == "", w.tail()
    return w, hello


@pytest.mark.reference
def test_a_draft_context_answers_call_by_call_as_the_runner_computes(draft, tmp_path):
    w, hello = _child(tmp_path, {"model": str(draft), "settings": SETTINGS})
    try:
        assert hello == {"ok": True, "n_batch": 16, "n_vocab": 256, "n_embd": 64}
        sc = parse_scenario(SCENARIO)
        x = draw_features(sc, 2 * 64)[0]
        r, _ = w.ask({"op": "inject", "seq": 1, "pos0": 0, "x": encode_rows(x)})
        assert r["ok"] and r["logits"] is None and decode_rows(r["h_nextn"], 64).shape == (5, 64)
        assert w.ask({"op": "seq_pos_max", "seq": 1})[0] == {"ok": True, "value": 4}
        assert w.ask({"op": "seq_pos_max", "seq": 0})[0]["value"] == -1
        r, _ = w.ask({"op": "block", "blocks": [[1, [7, 255, 255, 255], 5]], "states": None})
        logits = decode_rows(r["logits"], 256)
        # the block's logits are the runner's result_output for the same steps, bit for bit
        (path := tmp_path / "s.json").write_text(json.dumps(SCENARIO))
        run_reference(draft, path, tmp_path / "ref", stderr_log=None)
        block = [d for d in load_dump_dir(tmp_path / "ref") if d.graph == "block"][0]
        node = [n for n in block.nodes if n.name == "result_output"][-1]
        assert logits.tobytes() == block.values(node.index).astype(np.float32).tobytes()
        assert w.ask({"op": "seq_rm", "seq": 1, "p0": 5, "p1": -1})[0] == {"ok": True}
        assert w.ask({"op": "seq_pos_max", "seq": 1})[0]["value"] == 4
        # what this child does not hold
        assert w.ask({"op": "t_decode", "rows": [[0, 1, 0]]})[0] == {"ok": False, "error": "no target model is open"}
        assert w.ask({"op": "open_draft", "model": str(draft), "settings": SETTINGS})[0] == \
            {"ok": False, "error": "a draft context is open already"}
    finally:
        w.close()
    assert w.restarts == 0


@pytest.mark.reference
def test_a_first_line_the_child_cannot_open_is_its_one_reply(tmp_path):
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    w = LineWorker([sys.executable, "-m", "graphgen.reference.child"], tmp_path / "child.err", timeout=120,
                   env={ENV_ERROR_LOG: str(tmp_path / "errors.log")})
    try:
        r, err = w.ask({"model": str(bad), "settings": SETTINGS})
        assert err == "" and r["ok"] is False and r["error"].startswith(f"llama.cpp b11739 could not load {bad}")
        assert w.proc.wait(timeout=30) == 1  # and then it ends
    finally:
        w.close()


@pytest.fixture(scope="module")
def smollm2():
    from graphgen.speculative.targets import resolve
    return resolve("smollm2")


@pytest.mark.reference
def test_a_target_answers_its_calls_and_lends_a_draft_opened_later(smollm2, tmp_path):
    target = {"path": str(smollm2), "layers": [1, 4], "n_ctx": 256, "n_batch": 32, "n_seq": 1, "n_threads": 1}
    w, hello = _child(tmp_path, {"target": target})
    try:
        info = hello["target"]
        assert hello["ok"] and (info["n_vocab"], info["n_embd"], info["n_layer"]) == (49152, 576, 30)
        assert (info["n_ctx"], info["n_batch"], info["bos"], info["add_bos"]) == (256, 32, 1, False)
        assert 2 in info["eog"]
        toks = w.ask({"op": "tokenize", "text": "The capital of France is"})[0]["tokens"]
        r, _ = w.ask({"op": "pieces", "tokens": toks + [2]})
        assert b"".join(base64.b64decode(p) for p in r["pieces"][:-1]) == b"The capital of France is"
        assert r["eog"] == [False] * len(toks) + [True]
        rows = [[0, t, i] for i, t in enumerate(toks)]
        r, _ = w.ask({"op": "t_decode", "rows": rows, "top": 5})
        ids = np.frombuffer(base64.b64decode(r["top_ids"]), dtype=np.int32).reshape(len(toks), 5)
        assert decode_rows(r["features"], 2 * 576).shape == (len(toks), 2 * 576)
        assert w.ask({"op": "t_pos_max", "seq": 0})[0]["value"] == len(toks) - 1
        assert w.ask({"op": "t_seq_rm", "seq": 0, "p0": 0, "p1": -1})[0]["ok"]
        # the full logits of the same rows: the best five are the ones the top list gave
        r, _ = w.ask({"op": "t_decode", "rows": rows, "full_logits": True})
        full = decode_rows(r["logits"], 49152)
        assert ids.tolist() == _top_logits(full, 5)[0].tolist()
        w.ask({"op": "t_seq_rm", "seq": 0, "p0": 0, "p1": -1})
        # the target alone, greedy, in the child: each token the best of the one before's logits
        r, _ = w.ask({"op": "t_generate", "prompts": [[0, toks]], "n_predict": 3, "temp": 0.0, "seed": 1})
        gen = r["tokens"][0][1]
        assert gen[:len(toks)] == toks and len(gen) == len(toks) + 3 and gen[len(toks)] == ids[-1, 0]
        assert w.ask({"op": "inject", "seq": 0, "pos0": 0, "x": None})[0] == \
            {"ok": False, "error": "no draft context is open"}
        assert w.ask({"op": "t_frobnicate"})[0] == {"ok": False, "error": "unknown call 't_frobnicate'"}
        # a draft shaped for the target, without tables of its own, borrows the target's
        make_model(tmp_path / "d.gguf", "dflash", target=smollm2, n_layer=1, target_layers=[1, 4], seed=2)
        r, _ = w.ask({"op": "open_draft", "model": str(tmp_path / "d.gguf"), "settings": dict(SETTINGS, n_seq=1)})
        assert r == {"ok": True, "n_batch": 16, "n_vocab": 49152, "n_embd": 576}
    finally:
        w.close()
