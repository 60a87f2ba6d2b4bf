"""The llama.cpp engine for graphgen's drivers: a Session-like object whose batches run in b11739.

`ReferenceSession` offers what the drivers of graphgen.speculative.drafters use of a Session
(inject, block_multi, seq_rm, seq_pos_max, n_batch, the model's metadata) and runs each call in a
child process holding one b11739 context (`python -m graphgen.reference.child`): the
same drivers, the same steps, the reference's graphs. An abort in llama.cpp ends the child, and
the call raises ReferenceFailed with llama.cpp's error.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


import numpy as np

from ..errors import BatchError
from ..runtime.model import load
from ..cachetypes import KV_TYPES
from .child import TOP_LOGITS
from .protocol import decode_rows, encode_rows, error_text
from .runner import ENV_ERROR_LOG, ReferenceFailed


class ReferenceResult:
    """The rows a driver reads from one batch: logits (blocks) and h_nextn, or None."""

    def __init__(self, logits, h_nextn):
        self.logits, self.h_nextn, self.embd = logits, h_nextn, None


def end_child(proc) -> None:
    """End a `runner --serve` child: closing its input ends its loop; one that does not end within
    a minute is killed. None: nothing to end."""
    if proc is None:
        return
    try:
        proc.stdin.close()
        proc.wait(timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


class Child:
    """The session child process (graphgen/reference/child.py): opened with its first request,
    then asked one call at a time. An abort in llama.cpp ends it, and the call raises
    ReferenceFailed with llama.cpp's error."""

    def __init__(self, first: dict):
        self.proc = None
        fd, name = tempfile.mkstemp(prefix="graphgen-refsession-", suffix=".log")
        os.close(fd)
        self._log = Path(name)
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "graphgen.reference.child"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     bufsize=1, env=dict(os.environ, **{ENV_ERROR_LOG: name}))
        try:
            self.hello = self.ask(first)
        except BaseException:
            self.close()
            raise
        if not self.hello["ok"]:
            self.close()
            raise ReferenceFailed(self.hello["error"])

    def ask(self, req: dict) -> dict:
        if self.proc is None:
            raise ReferenceFailed("the llama.cpp session is closed")
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            for line in self.proc.stdout:
                if line.startswith("R "):
                    return json.loads(line[2:])
        except BrokenPipeError:
            pass
        rc = self.proc.wait()
        self._err.seek(0)
        headline, whole = error_text(self._log, self._err.read().decode(errors="replace"))
        self.proc = None
        how = f"signal {-rc}" if rc < 0 else f"exit {rc}"
        raise ReferenceFailed(f"llama.cpp b11739 ended ({how}): {headline}", reason=whole, returncode=rc)

    def close(self) -> None:
        end_child(self.proc)
        self.proc = None
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None
        if self._err is not None:
            self._err.close()
            self._err = None


def draft_settings(n_ctx: int, n_ubatch: int, flash_attn: bool, type_k: str, type_v: str, n_seq: int,
                   n_threads: int) -> dict:
    for key, name in (("type_k", type_k), ("type_v", type_v)):
        if name not in KV_TYPES:
            raise ValueError(f"{key} must be one of {', '.join(KV_TYPES)}, got {name!r}")
    return {"n_ctx": n_ctx, "n_ubatch": n_ubatch, "flash_attn": bool(flash_attn), "type_k": type_k,
            "type_v": type_v, "n_seq": n_seq, "n_threads": n_threads}


class ReferenceSession:
    """A b11739 draft context in its own child, or (`child`) in the child that holds the target,
    whose context it then borrows embeddings and lm head from."""

    def __init__(self, model, *, n_ctx: int = 256, n_ubatch: int = 64, flash_attn: bool = False,
                 type_kv: str = "f16", n_seq: int = 1, n_threads: int = 1, type_k: str | None = None,
                 type_v: str | None = None, backend: str = "cpu", child: Child | None = None, target=None):
        if backend != "cpu":
            raise ValueError("the llama.cpp reference runs on the CPU; drop --backend or use --engine graphgen")
        settings = draft_settings(n_ctx, n_ubatch, flash_attn, type_kv if type_k is None else type_k,
                                  type_kv if type_v is None else type_v, n_seq, n_threads)
        self.child, self._own_child, self.model = None, child is None, None
        self.model = load(model, target=target)  # the metadata the drivers read; the weights stay in b11739
        self.hparams = self.model.hparams
        self.n_ctx, self.n_ubatch, self.n_seq = n_ctx, n_ubatch, n_seq
        try:
            if child is None:
                self.child = Child({"model": str(Path(model).resolve()), "settings": settings})
                hello = self.child.hello
            else:
                self.child = child
                hello = child.ask({"op": "open_draft", "model": str(Path(model).resolve()), "settings": settings})
                if not hello["ok"]:
                    raise ReferenceFailed(hello["error"])
        except BaseException:
            self.close()
            raise
        self.n_batch = hello["n_batch"]
        self.n_vocab = hello["n_vocab"]
        self.n_embd = hello["n_embd"]

    def _ask(self, req: dict) -> dict:
        if self.child is None:
            raise ReferenceFailed("the llama.cpp session is closed")
        return self.child.ask(req)

    def _batch(self, req: dict) -> ReferenceResult:
        res = self._ask(req)
        if not res["ok"]:
            # what the drivers see from graphgen's engine when a batch cannot run
            raise BatchError(f"llama.cpp: {res['error']}")
        return ReferenceResult(decode_rows(res["logits"], self.n_vocab), decode_rows(res["h_nextn"], self.n_embd))

    def inject(self, features, pos0: int, seq: int = 0) -> ReferenceResult:
        return self._batch({"op": "inject", "seq": int(seq), "pos0": int(pos0), "x": encode_rows(features)})

    def block_multi(self, blocks, embd_state=None) -> ReferenceResult:
        return self._batch({"op": "block", "blocks": [[int(s), [int(t) for t in toks], int(p)] for s, toks, p in blocks],
                            "states": encode_rows(embd_state)})

    def block(self, tokens, pos0: int, seq: int = 0, embd_state=None) -> ReferenceResult:
        return self.block_multi([(seq, tokens, pos0)], embd_state)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1):
        return self._ask({"op": "seq_rm", "seq": int(seq), "p0": int(p0), "p1": int(p1)})["ok"]

    def seq_pos_max(self, seq: int) -> int:
        return int(self._ask({"op": "seq_pos_max", "seq": int(seq)})["value"])

    def close(self):
        if self.child is not None and self._own_child:
            self.child.close()
        self.child = None
        if getattr(self, "model", None) is not None:
            self.model.close()
            self.model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TargetError(BatchError):
    """The target could not run a batch (llama.cpp's return code or error in the message)."""


class ReferenceTarget:
    """A real target in b11739's libllama, in a child process (reference/target.py runs it there):
    batched decodes returning each row's best logits and the draft's target-layer inputs,
    `seq_rm`, and the target's tokenizer. `open_draft` opens a b11739 draft context in the same
    child, borrowing this target's embeddings and lm head as b11739's ctx_other does."""

    def __init__(self, path, layers, *, n_ctx: int, n_batch: int, n_seq: int = 1, n_threads: int = 1,
                 flash_attn: str = "auto", type_k: str = "f16", type_v: str = "f16"):
        self.path = Path(path)
        self.layers = [int(il) for il in layers]
        self.child = Child({"target": {"path": str(self.path.resolve()), "layers": self.layers, "n_ctx": n_ctx,
                                       "n_batch": n_batch, "n_seq": n_seq, "n_threads": n_threads,
                                       "flash_attn": flash_attn, "type_k": type_k, "type_v": type_v}})
        info = self.child.hello["target"]
        self.n_vocab, self.n_embd, self.n_layer = info["n_vocab"], info["n_embd"], info["n_layer"]
        self.n_ctx, self.n_batch = info["n_ctx"], info["n_batch"]
        self.bos, self.add_bos = info["bos"], info["add_bos"]
        self.n_seq = n_seq
        self.width = len(self.layers) * self.n_embd

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.child.ask({"op": "tokenize", "text": text, "add_special": add_special})["tokens"]

    def pieces(self, tokens) -> tuple[list[bytes], list[bool]]:
        """Each token's bytes, and whether it ends generation."""
        r = self.child.ask({"op": "pieces", "tokens": [int(t) for t in tokens]})
        return [base64.b64decode(p) for p in r["pieces"]], r["eog"]

    def decode(self, rows, full_logits: bool = False):
        """rows: [(seq, token, pos), ...] (at most n_batch). -> (top ids [n, k] best first, their logits
        [n, k]; or with full_logits (None, logits [n, n_vocab])), and features [n, width]."""
        r = self.child.ask({"op": "t_decode", "rows": [[int(s), int(t), int(p)] for s, t, p in rows],
                            "full_logits": full_logits})
        if not r["ok"]:
            raise TargetError(f"the target ({self.path.name}): {r['error']}")
        feats = decode_rows(r["features"], self.width)
        if full_logits:
            return None, decode_rows(r["logits"], self.n_vocab), feats
        top = decode_rows(r["top_logits"], TOP_LOGITS)
        ids = np.frombuffer(base64.b64decode(r["top_ids"]), dtype=np.int32).reshape(top.shape)
        return ids, top, feats

    def generate(self, prompts: dict, n_predict: int, *, temp: float, seed: int):
        """verifier.run_alone in the child: ({seq: prompt + generated}, {"prompt", "generation"}
        seconds, {seq: [(best ids, their logits) per sampled token]})."""
        r = self.child.ask({"op": "t_generate", "prompts": [[int(s), [int(t) for t in p]] for s, p in prompts.items()],
                            "n_predict": int(n_predict), "temp": float(temp), "seed": int(seed)})
        if not r["ok"]:
            raise TargetError(f"the target ({self.path.name}): {r['error']}")
        toks = {int(s): t for s, t in r["tokens"]}
        trace = {int(s): [(np.asarray(i, dtype=np.int32), decode_rows(lg, len(i))[0]) for i, lg in tr]
                 for s, tr in r["trace"]}
        return toks, r["times"], trace

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(self.child.ask({"op": "t_seq_rm", "seq": int(seq), "p0": int(p0), "p1": int(p1)})["ok"])

    def seq_pos_max(self, seq: int) -> int:
        return int(self.child.ask({"op": "t_pos_max", "seq": int(seq)})["value"])

    def open_draft(self, model, **settings) -> ReferenceSession:
        return ReferenceSession(model, child=self.child, target=self.path, **settings)

    def close(self) -> None:
        if self.child is not None:
            self.child.close()
            self.child = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
