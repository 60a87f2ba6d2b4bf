#!/usr/bin/env python3
"""Soak: many drafting rounds in one Session, watching memory, descriptors, buffers and results.

Each round picks some of the session's sequences and, for each, does what a DFlash driver does:
a noise block [id_last, mask x (B-1)] after the sequence's last position, the block removed from
the cache (seq_rm), the accepted rows injected; now and then a sequence is reseeded (all of it
removed, a new prompt injected) or cut back (seq_rm from an earlier position). Every round's
drafted tokens (the argmax of the block's rows) are recorded.

Checks, at the end (exit 1 when one fails, with the numbers):
- RSS growth after warm-up (the first 10% of rounds) under 1% (--rss-limit);
- open file descriptors as they were after warm-up, and a compute buffer that grows only on a
  round that built a graph of a new shape;
- sampled rounds (--check-every) bit-identical to the same round in a fresh session that runs
  the same rounds from the start (the rounds are drawn from the seed, so a second run draws them
  again; a session whose state drifted over thousands of rounds would part from it);
- with --against BACKEND, every round's drafted tokens equal to a second session on that
  backend running the same rounds (an RPC endpoint against the CPU, say);
- with --rpc-server, a local `graphgen rpc-server` is started for the run and its RSS is watched
  too (the session then runs on it).

    python tools/soak.py --rounds 10000                       # tiny draft, made on the fly
    python tools/soak.py --rounds 200 --rpc-server --against cpu
    python tools/soak.py --model draft.gguf --rounds 2000 --type-kv q8_0 --flash-attn on --json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def n_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass
class SeqState:
    pos: int = 0                                      # the next position
    id_last: int = 1


class Soak:
    """The rounds, drawn from one seed: running them twice draws the same ops, and a correct
    session gives the same outputs, so a second run in a fresh session checks the first."""

    def __init__(self, sessions, args):
        self.sessions = sessions
        self.args = args
        self.hp = sessions[0].hparams
        self.B = min(self.hp.block_size or 4, 16)
        self.reseeds = 0

    def features(self, n: int, key: int) -> np.ndarray:
        return np.random.default_rng((self.args.seed, key)).standard_normal((n, self.hp.n_embd_inp_enc),
                                                                           dtype=np.float32)

    def run(self, rounds: int, on_block=None, on_round=None) -> None:
        args, hp, B = self.args, self.hp, self.B
        rng = np.random.default_rng(args.seed)
        mask = hp.mask_token_id
        seqs = [SeqState() for _ in range(args.n_seq)]
        n_op = 0

        def inject(n, pos, s):
            nonlocal n_op
            feats = self.features(n, n_op)
            n_op += 1
            for sess in self.sessions:
                sess.inject(feats, pos, s)

        def rm(s, p0):
            for sess in self.sessions:
                sess.seq_rm(s, p0, -1)

        for rnd in range(rounds):
            live = [s for s in range(args.n_seq) if rng.random() < 0.7] or [int(rng.integers(args.n_seq))]
            for s in live:
                st = seqs[s]
                # each sequence keeps to its share of the cache; now and then a new request
                if st.pos == 0 or st.pos + 2 * B + 2 > args.n_ctx // args.n_seq or rng.random() < 0.01:
                    n_prompt = int(rng.integers(1, 2 * B))
                    rm(s, 0)
                    inject(n_prompt, 0, s)
                    st.pos, st.id_last = n_prompt, int(rng.integers(hp.n_vocab))
                    self.reseeds += 1
                tokens = [st.id_last] + [mask] * (B - 1)
                outs = [sess.block(tokens, pos0=st.pos, seq=s).logits for sess in self.sessions]
                drafted = outs[0][1:].argmax(-1).tolist()
                if on_block is not None:
                    on_block(rnd, s, s == live[0], outs, drafted)
                # the verifier accepts a prefix: the block goes, the accepted rows come in
                n_acc = int(rng.integers(0, B))
                rm(s, st.pos)
                inject(n_acc + 1, st.pos, s)
                st.pos += n_acc + 1
                st.id_last = drafted[n_acc] if n_acc < len(drafted) else int(rng.integers(hp.n_vocab))
                if rng.random() < 0.02 and st.pos > B:
                    # cut back further than the block: an earlier guess rejected
                    cut = int(rng.integers(1, st.pos))
                    rm(s, cut)
                    st.pos = cut
            if on_round is not None:
                on_round(rnd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a draft GGUF (default: a tiny DFlash draft made for the run)")
    ap.add_argument("--rounds", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-seq", type=int, default=4)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--n-ubatch", type=int, default=64)
    ap.add_argument("--type-kv", default=None, help="cache type (default: drawn from the seed among f16, f32, q8_0)")
    ap.add_argument("--flash-attn", choices=("on", "off"), default=None, help="default: on for a quantized cache")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--against", metavar="BACKEND", help="run the same rounds on this backend too, compare tokens")
    ap.add_argument("--rpc-server", action="store_true", help="start a local graphgen rpc-server and run on it")
    ap.add_argument("--check-every", type=int, default=500, help="replay every Nth round in a fresh session")
    ap.add_argument("--rss-limit", type=float, default=0.01, help="allowed RSS growth after warm-up (0.01 = 1%%)")
    ap.add_argument("--warmup", type=float, default=0.1,
                    help="the share of rounds before memory is measured (default 0.1; an RPC server caches up "
                         "to 1024 graphs before it starts over, so runs on one want more)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.type_kv is None:
        args.type_kv = ["f16", "f32", "q8_0"][args.seed % 3]
    if args.flash_attn is None:
        args.flash_attn = "on" if args.type_kv not in ("f16", "f32") else "off"

    from graphgen.runtime.session import Session
    from graphgen.synth import make_model
    tmp = tempfile.TemporaryDirectory(prefix="graphgen-soak-")
    model = args.model
    if model is None:
        model = str(Path(tmp.name) / "draft.gguf")
        make_model(model, "dflash", n_embd=128, n_head=4, head_dim=32, block_size=8)
    server = None
    backend = args.backend
    if args.rpc_server:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "graphgen.cli", "--quiet", "rpc-server", "--port", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        backend = f"rpc://127.0.0.1:{port}"
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
    failures, report = [], {}
    kw = dict(n_ctx=args.n_ctx, n_ubatch=args.n_ubatch, flash_attn=args.flash_attn == "on",
              type_k=args.type_kv, type_v=args.type_kv, n_seq=args.n_seq)
    try:
        main_sess = Session(model, backend=backend, **kw)
        sessions = [main_sess] + ([Session(model, backend=args.against, **kw)] if args.against else [])
        soak = Soak(sessions, args)
        warm = max(1, int(args.rounds * args.warmup))
        base = {}
        t0 = time.time()
        sampled: dict[tuple[int, int], np.ndarray] = {}

        def watch():
            return {"rss": rss_kib(), "fds": n_fds(), "server_rss": rss_kib(server.pid) if server else None,
                    "sched": main_sess._sched_size(next(iter(main_sess._scheds.values())).sched)}

        def on_block(rnd, s, first, outs, drafted):
            if len(outs) > 1 and outs[1][1:].argmax(-1).tolist() != drafted:
                failures.append(f"round {rnd} seq {s}: {args.against} drafted {outs[1][1:].argmax(-1).tolist()}, "
                                f"{backend} {drafted}")
            if args.check_every and rnd % args.check_every == args.check_every - 1 and first:
                sampled[(rnd, s)] = outs[0].copy()

        # a compute buffer may grow while graphs of new shapes (more rows, a longer n_kv) still
        # appear; growing on a round that built no new shape is a leak
        shapes: set = set()
        signature = main_sess._signature

        def recording(ub, mem, graph_type):
            sig = signature(ub, mem, graph_type)
            shapes.add(sig)
            return sig
        main_sess._signature = recording
        last = {"sched": None, "shapes": 0}

        def on_round(rnd):
            size = main_sess._sched_size(next(iter(main_sess._scheds.values())).sched)
            if last["sched"] is not None and size > last["sched"] and len(shapes) == last["shapes"]:
                failures.append(f"round {rnd}: the compute buffer grew {last['sched']} -> {size} bytes with no new "
                                "graph shape")
            last.update(sched=size, shapes=len(shapes))
            if rnd + 1 == warm:
                base.update(watch())
        soak.run(args.rounds, on_block, on_round)
        seconds = time.time() - t0
        end = watch()
        growth = (end["rss"] - base["rss"]) / base["rss"]
        if growth > args.rss_limit:
            failures.append(f"RSS grew {100 * growth:.2f}% after warm-up ({base['rss']} -> {end['rss']} KiB)")
        if server is not None:
            sg = (end["server_rss"] - base["server_rss"]) / base["server_rss"]
            if sg > args.rss_limit:
                failures.append(f"the RPC server's RSS grew {100 * sg:.2f}% after warm-up")
        if end["fds"] > base["fds"]:
            failures.append(f"file descriptors {base['fds']} -> {end['fds']}")

        # the sampled rounds again: the same rounds from the start in a fresh session
        fresh = Session(model, backend=backend, **kw)
        n_bad = 0

        def compare(rnd, s, first, outs, drafted):
            nonlocal n_bad
            if (rnd, s) in sampled:
                n_bad += not np.array_equal(outs[0], sampled[(rnd, s)])
        try:
            last = max((r for r, _ in sampled), default=-1)
            Soak([fresh], args).run(last + 1, compare)
        finally:
            fresh.close()
        n_checked = len(sampled)
        if n_bad:
            failures.append(f"{n_bad} of {n_checked} sampled rounds differ from the same round in a fresh session")
        report = {"rounds": args.rounds, "seed": args.seed, "backend": backend, "against": args.against,
                  "type_kv": args.type_kv, "flash_attn": args.flash_attn, "n_seq": args.n_seq,
                  "reseeds": soak.reseeds, "checked_rounds": n_checked, "differing_rounds": n_bad,
                  "rss_kib": [base["rss"], end["rss"]], "rss_growth": growth, "fds": [base["fds"], end["fds"]],
                  "graph_shapes": len(shapes), "compute_buffer": [base["sched"], end["sched"]],
                  "server_rss_kib": [base["server_rss"], end["server_rss"]] if server else None,
                  "stats": dict(main_sess.stats), "seconds": round(seconds, 1), "failures": failures}
        for sess in sessions:
            sess.close()
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        tmp.cleanup()
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{report['rounds']} rounds on {report['backend']} ({report['type_kv']}, FA {report['flash_attn']}, "
              f"{report['n_seq']} sequences, {report['reseeds']} reseeds) in {report['seconds']} s")
        print(f"RSS {report['rss_kib'][0]} -> {report['rss_kib'][1]} KiB after warm-up "
              f"({100 * report['rss_growth']:+.2f}%), fds {report['fds'][0]} -> {report['fds'][1]}"
              + (f", server RSS {report['server_rss_kib'][0]} -> {report['server_rss_kib'][1]} KiB"
                 if report['server_rss_kib'] else ""))
        print(f"{report['checked_rounds']} sampled rounds against a fresh session replaying the log: "
              f"{report['checked_rounds'] - report['differing_rounds']} bit-identical"
              + (f"; every round's tokens compared with {args.against}" if args.against else ""))
        print("FAIL:\n  " + "\n  ".join(failures) if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
