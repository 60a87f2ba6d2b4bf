"""The session child: b11739 contexts driven call by call (`python -m graphgen.reference.child`).

The first line opens what the parent asks for: a draft context (`model`, `settings`), a real
target (`target`), or both, the draft then borrowing the target's token embeddings and lm head
through `ctx_other` as b11739's server sets it up. Each later line is one call answered by
`R <json>`: the draft's inject / block / seq_rm / seq_pos_max, the target's t_decode / t_seq_rm /
t_pos_max, tokenize and pieces. Arrays travel as base64 float32 rows (protocol.py). An abort
inside llama.cpp ends the process; the parent explains it from the log (ReferenceSession).
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np

from ..libload import ReferenceUnavailable, load_llama
from ..cachetypes import KV_TYPE_IDS
from ..play.scenario import Scenario, SeqBlock, Step
from .protocol import decode_rows, encode_rows, write_reply
from .logcapture import _LogCapture
from .runner import ReferenceContext, ReferenceFailed
from .target import TargetContext, TargetFailed

# rows of target logits the parent gets per decoded row: the best ones, enough for greedy reading
# and for the sampler chain's top-k
TOP_LOGITS = 64


def _open(first: dict):
    """(draft ReferenceContext or None, TargetContext or None, the log) as the first line asks."""
    target, log = None, None
    t = first.get("target")
    if t is not None:
        ffi, lib, _ = load_llama()
        log = _LogCapture(ffi, lib)  # the target's load errors reach the parent's log too
        fa = {"auto": -1, "on": 1, "off": 0}[t.get("flash_attn", "auto")]
        target = TargetContext(Path(t["path"]), t["layers"], n_ctx=t["n_ctx"], n_batch=t["n_batch"],
                               n_seq=t["n_seq"], n_threads=t["n_threads"], flash_attn=fa,
                               type_k=KV_TYPE_IDS[t.get("type_k", "f16")], type_v=KV_TYPE_IDS[t.get("type_v", "f16")],
                               log=log)
    draft = None
    if first.get("model") is not None:
        try:
            draft = _open_draft(first, target)
        except BaseException:
            if target is not None:
                target.close()
            raise
        log = draft.log
    return draft, target, log


def _open_draft(req: dict, target) -> ReferenceContext:
    st = req["settings"]
    sc = Scenario(n_ctx=st["n_ctx"], n_ubatch=st["n_ubatch"], flash_attn=st["flash_attn"], type_k=st["type_k"],
                  type_v=st["type_v"], n_seq=st["n_seq"], n_threads=st["n_threads"])
    return ReferenceContext(Path(req["model"]), sc, ctx_other=None if target is None else target.ctx)


def _top_logits(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k best (ids, logits), best first, ties to the lower id as a greedy sampler takes them."""
    k = min(k, logits.shape[1])
    part = np.argpartition(logits, logits.shape[1] - k, axis=1)[:, -k:]
    ids = np.empty_like(part)
    for i in range(logits.shape[0]):
        cand = part[i]
        # every id whose logit equals the k-th best is a candidate too, so ties stay in id order
        kth = logits[i, cand].min()
        cand = np.flatnonzero(logits[i] >= kth)
        order = np.lexsort((cand, -logits[i, cand]))
        ids[i] = cand[order][:k]
    return ids.astype(np.int32), np.take_along_axis(logits, ids, axis=1)


def _draft_call(rc: ReferenceContext, k: int, req: dict, reply) -> None:
    op = req["op"]
    if op == "seq_rm":
        reply(ok=rc.seq_rm(req["seq"], req["p0"], req["p1"]))
        return
    if op == "seq_pos_max":
        reply(ok=True, value=rc.seq_pos_max(req["seq"]))
        return
    if op == "inject":
        x = decode_rows(req["x"], rc.n_embd_inp)
        step = Step("inject", k, seq=req["seq"], n_tokens=x.shape[0], pos0=req["pos0"])
        n, states = x.shape[0], None
    else:
        step = Step("block", k, blocks=[SeqBlock(seq, list(toks), pos0) for seq, toks, pos0 in req["blocks"]])
        n, x = sum(len(b.tokens) for b in step.blocks), None
        states = None
        if req.get("states") is not None:
            rows = decode_rows(req["states"], rc.meta["n_embd"])
            cut = np.cumsum([len(b.tokens) for b in step.blocks])[:-1]
            states = list(np.split(rows, cut))
    try:
        ret = rc.process(step, x, states)
    except ReferenceFailed as e:
        reply(ok=False, error=str(e))
        return
    if ret != 0:
        reply(ok=False, error=f"llama_process returned {ret}")
        return
    nextn = [rc.nextn_row(i) for i in range(n)]
    nextn = None if any(r is None for r in nextn) else np.stack(nextn)
    logits = np.stack([rc.logits_row(i) for i in range(n)]) if op == "block" else None
    reply(ok=True, logits=encode_rows(logits), h_nextn=encode_rows(nextn))


def _target_call(tc: TargetContext, req: dict, reply) -> None:
    op = req["op"]
    if op == "t_generate":
        # the target alone, the whole loop here: a decode per token without a round trip to the parent
        from ..runtime.sampler import run_alone

        def decode(rows):
            ids, top = [], []
            for b in range(0, len(rows), tc.n_batch):
                ret, logits, _ = tc.decode(rows[b:b + tc.n_batch], features=False)
                if ret != 0:
                    raise TargetFailed(f"llama_process(ctx_tgt) returned {ret}")
                i, t = _top_logits(logits, TOP_LOGITS)
                ids.append(i)
                top.append(t)
            return np.concatenate(ids), np.concatenate(top)
        prompts = {int(s): [int(t) for t in p] for s, p in req["prompts"]}
        try:
            toks, times, trace = run_alone(decode, tc.is_eog, prompts, int(req["n_predict"]),
                                           temp=float(req["temp"]), seed=int(req["seed"]))
        except TargetFailed as e:
            reply(ok=False, error=str(e))
            return
        reply(ok=True, tokens=[[s, t] for s, t in toks.items()], times=times,
              trace=[[s, [[i.tolist(), encode_rows(lg)] for i, lg in tr]] for s, tr in trace.items()])
        return
    if op == "t_decode":
        rows = req["rows"]
        try:
            ret, logits, feats = tc.decode(rows)
        except TargetFailed as e:
            reply(ok=False, error=str(e))
            return
        if ret != 0:
            reply(ok=False, error=f"llama_process(ctx_tgt) returned {ret}")
            return
        out = {"ok": True, "features": encode_rows(feats)}
        if req.get("full_logits"):
            out["logits"] = encode_rows(logits)
        else:
            ids, top = _top_logits(logits, int(req.get("top", TOP_LOGITS)))
            out["top_ids"] = base64.b64encode(ids.tobytes()).decode()
            out["top_logits"] = encode_rows(top)
        reply(**out)
    elif op == "t_seq_rm":
        reply(ok=tc.seq_rm(req["seq"], req["p0"], req["p1"]))
    elif op == "t_pos_max":
        reply(ok=True, value=tc.seq_pos_max(req["seq"]))
    elif op == "tokenize":
        reply(ok=True, tokens=tc.tokenize(req["text"], req.get("add_special", True), req.get("parse_special", True)))
    elif op == "pieces":
        reply(ok=True, pieces=[base64.b64encode(tc.piece(t)).decode() for t in req["tokens"]],
              eog=[tc.is_eog(t) for t in req["tokens"]])
    else:
        reply(ok=False, error=f"unknown call {op!r}")


def serve_session(stdin=None, stdout=None) -> int:
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout

    def reply(**kw):
        write_reply(stdout, kw)

    first = json.loads(stdin.readline())
    try:
        draft, target, log = _open(first)
    except (ReferenceFailed, ReferenceUnavailable, TargetFailed) as e:
        reply(ok=False, error=str(e))
        return 1
    try:
        hello = {"ok": True}
        if draft is not None:
            hello.update(n_batch=draft.n_batch, n_vocab=draft.n_vocab, n_embd=draft.meta["n_embd"])
        if target is not None:
            hello["target"] = target.vocab_info()
        reply(**hello)
        for k, line in enumerate(stdin):
            req = json.loads(line)
            log.enter(f"step {k}")
            if req["op"] == "open_draft":
                if draft is not None:
                    reply(ok=False, error="a draft context is open already")
                    continue
                try:
                    draft = _open_draft(req, target)
                except (ReferenceFailed, ReferenceUnavailable) as e:
                    reply(ok=False, error=str(e))
                    continue
                reply(ok=True, n_batch=draft.n_batch, n_vocab=draft.n_vocab, n_embd=draft.meta["n_embd"])
            elif req["op"] in ("inject", "block", "seq_rm", "seq_pos_max"):
                if draft is None:
                    reply(ok=False, error="no draft context is open")
                    continue
                _draft_call(draft, k, req, reply)
            elif target is None:
                reply(ok=False, error="no target model is open")
            else:
                _target_call(target, req, reply)
    finally:
        if draft is not None:
            draft.close()  # before the target it borrows from
        if target is not None:
            target.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve_session())
