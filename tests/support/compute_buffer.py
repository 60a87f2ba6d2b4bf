"""Runs for tests/runtime/test_compute_buffer.py, called in a worker process (an invalid read there ends
that process, not the test run): a session whose graph kinds share one compute buffer, against
sessions where every graph is built and placed afresh."""

from __future__ import annotations

import numpy as np

DRAFTS = {"dflash": ("dflash", "base", {}), "dflash2": ("dflash2", "base", {}),
          "dspark": ("dspark", "base", {"conf": True}), "lilicorr": ("lilicorr", "base", {}),
          "dsv4": ("dspark", "dsv4", {})}


def make_draft(name: str, path: str) -> str:
    from graphgen.synth import make_model
    variant, backbone, kw = DRAFTS[name]
    make_model(path, variant, backbone, **kw)
    return path


def _outputs(res) -> list:
    return [None if a is None else np.asarray(a) for a in (res.logits, res.embd, res.h_nextn)]


def run_steps(model: str, steps: list, *, flash_attn: bool, type_kv: str, n_seq: int, record: bool,
              reuse: bool) -> tuple[list, dict]:
    """Every step's outputs, and the session's counters. A step: ["inject", seq, n, pos0] or
    ["block", [[seq, n, pos0], ...]] (the block is removed from the cache afterwards, as a driver
    removes its noise block) or ["encode", seq, n, pos0]."""
    from graphgen.dump.record import NodeRecorder
    from graphgen.ops import ggml as G
    from graphgen.runtime.session import Session
    outs = []
    with Session(model, n_ctx=512, n_ubatch=64, flash_attn=flash_attn, type_kv=type_kv, n_seq=n_seq,
                 reuse_graphs=reuse) as s:
        hp = s.hparams
        rec = NodeRecorder(G.op_desc, G.type_name, 0, G.read_tensor_bytes) if record else None
        for k, st in enumerate(steps):
            rng = np.random.default_rng(k)
            if st[0] == "inject":
                _, seq, n, pos0 = st
                x = rng.standard_normal((n, hp.n_embd_inp_enc), dtype=np.float32)
                r = s.inject(x, pos0, seq, recorder=rec)
            elif st[0] == "encode":
                _, seq, n, pos0 = st
                r = s.encode(rng.standard_normal((n, hp.n_embd_inp_enc), dtype=np.float32), pos0, seq, recorder=rec)
            else:
                blocks = [(seq, [int(t) for t in rng.integers(0, hp.n_vocab - 1, 1)] + [hp.mask_token_id] * (n - 1),
                           pos0) for seq, n, pos0 in st[1]]
                state = None
                if s.model.variant == "lilicorr":
                    state = rng.standard_normal((sum(len(b[1]) for b in blocks), hp.n_embd), dtype=np.float32)
                r = s.block_multi(blocks, recorder=rec, embd_state=state)
                for seq, _, pos0 in st[1]:
                    s.seq_rm(seq, pos0, -1)
            outs.append(_outputs(r))
        return outs, dict(s.stats)


def same_outputs(model: str, steps: list, flash_attn: bool, type_kv: str, n_seq: int = 1, record: bool = False) -> dict:
    """Run the steps with graphs kept and re-placed (as a drafting loop runs) and with every graph
    built afresh; say whether every output is bit-identical, and how often graphs were placed
    again after the buffer moved."""
    kept, stats = run_steps(model, steps, flash_attn=flash_attn, type_kv=type_kv, n_seq=n_seq, record=record,
                            reuse=True)
    fresh, _ = run_steps(model, steps, flash_attn=flash_attn, type_kv=type_kv, n_seq=n_seq, record=False,
                         reuse=False)
    diffs = []
    for k, (a, b) in enumerate(zip(kept, fresh)):
        for name, x, y in zip(("logits", "embd", "h_nextn"), a, b):
            if (x is None) != (y is None) or (x is not None and not np.array_equal(x, y)):
                diffs.append(f"step {k} {name}")
    return {"diffs": diffs, "stats": stats}
