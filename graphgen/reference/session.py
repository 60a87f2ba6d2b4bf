"""The llama.cpp engine for graphgen's drivers: a Session-like object whose batches run in b11739.

`ReferenceSession` offers what the drivers of graphgen.runtime.drafters use of a Session
(inject, block_multi, seq_rm, seq_pos_max, n_batch, the model's metadata) and runs each call in a
child process holding one b11739 context (`python -m graphgen.reference.runner --session`): the
same drivers, the same steps, the reference's graphs. An abort in llama.cpp ends the child, and
the call raises ReferenceFailed with llama.cpp's error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


from ..errors import BatchError
from ..runtime.model import load
from ..scenario import KV_TYPES
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


class ReferenceSession:
    def __init__(self, model, *, n_ctx: int = 256, n_ubatch: int = 64, flash_attn: bool = False,
                 type_kv: str = "f16", n_seq: int = 1, n_threads: int = 1, type_k: str | None = None,
                 type_v: str | None = None, backend: str = "cpu"):
        if backend != "cpu":
            raise ValueError("the llama.cpp reference runs on the CPU; drop --backend or use --engine graphgen")
        type_k = type_kv if type_k is None else type_k
        type_v = type_kv if type_v is None else type_v
        for key, name in (("type_k", type_k), ("type_v", type_v)):
            if name not in KV_TYPES:
                raise ValueError(f"{key} must be one of {', '.join(KV_TYPES)}, got {name!r}")
        self.proc, self._log, self.model = None, None, None
        self.model = load(model)  # the metadata the drivers read; the weights stay in b11739
        self.hparams = self.model.hparams
        self.n_ctx, self.n_ubatch, self.n_seq = n_ctx, n_ubatch, n_seq
        fd, name = tempfile.mkstemp(prefix="graphgen-refsession-", suffix=".log")
        os.close(fd)
        self._log = Path(name)
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "graphgen.reference.runner", "--session"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     bufsize=1, env=dict(os.environ, **{ENV_ERROR_LOG: name}))
        hello = self._ask({"model": str(Path(model).resolve()), "settings": {
            "n_ctx": n_ctx, "n_ubatch": n_ubatch, "flash_attn": bool(flash_attn), "type_k": type_k,
            "type_v": type_v, "n_seq": n_seq, "n_threads": n_threads}})
        if not hello["ok"]:
            self.close()
            raise ReferenceFailed(hello["error"])
        self.n_batch = hello["n_batch"]
        self.n_vocab = hello["n_vocab"]
        self.n_embd = hello["n_embd"]

    def _ask(self, req: dict) -> dict:
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
        end_child(self.proc)
        self.proc = None
        if getattr(self, "model", None) is not None:
            self.model.close()
            self.model = None
        if self._log is not None:
            self._log.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
