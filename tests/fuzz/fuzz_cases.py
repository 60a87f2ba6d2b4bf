"""The child side of the fuzz harness: run cases [start, end) of a JSONL file, one line per result.

`python fuzz_cases.py CASES.jsonl START END WORKDIR` prints `S i` before case i and
`R i {"outcome": ..., "fail": ...}` after it. `fail` is set when graphgen raised something other
than its documented exceptions, gave a vague message, or a failed batch changed later results.
A crash or hang shows as a missing `R` line; the parent handles that.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import traceback
from pathlib import Path

import numpy as np

from graphgen.compare.rules import RulesError
from graphgen.dump.format import DumpError
from graphgen.errors import GraphgenError
from graphgen.runtime.backends import BackendUnavailable
from graphgen.play.scenario import ScenarioError

DOCUMENTED = (GraphgenError, ScenarioError, DumpError, RulesError, BackendUnavailable)
# a rejection names what is wrong: a quoted key/tensor/field, a shape, or the thing by kind
NAMES_SOMETHING = re.compile(r"'[^']+'|\"[^\"]+\"|\[[-\d, *]*\]|\b(key|tensor|field|shape|step|token|sequence|"
                             r"position|batch|cache|rows?|n_ubatch|n_ctx|embd_state|features|GGUF|JSON|"
                             r"rule|regex|nodes?|file|folder|format)\b", re.I)


class Unexpected(Exception):
    pass


def _rejection(e: BaseException) -> str | None:
    """None when `e` is an acceptable rejection, else why it is not."""
    if not isinstance(e, DOCUMENTED):
        return f"undocumented {type(e).__name__}: {e}\n{''.join(traceback.format_exception(e))[-3000:]}"
    msg = str(e)
    if not msg.strip() or not NAMES_SOMETHING.search(msg):
        return f"vague {type(e).__name__} message: {msg!r}"
    return None


# ---- GGUF files -------------------------------------------------------------------------------

def run_gguf(case: dict, work: Path, cache: Path) -> tuple[str, str | None]:
    from fuzz_inputs import make_gguf
    from graphgen.runtime.model import load
    from graphgen.runtime.session import Session
    path = make_gguf(case, work, cache)
    try:
        m = load(path)
    except BaseException as e:  # noqa: BLE001 - classify everything short of a crash
        return "rejected", _rejection(e)
    hp, variant = m.hparams, m.variant
    m.close()
    # accepted: the graphs must build and run without a ggml assert
    try:
        with Session(path, n_ctx=32, n_ubatch=16, flash_attn=bool(case.get("fa"))) as s:
            n = 3
            x = np.random.default_rng(0).standard_normal((n, hp.n_embd_inp_enc), dtype=np.float32)
            s.inject(x, 0)
            bs = max(1, min(hp.block_size or 4, 8))
            mask = hp.mask_token_id if 0 <= hp.mask_token_id < hp.n_vocab else hp.n_vocab - 1
            state = None
            if variant == "lilicorr":
                state = np.zeros((bs, hp.n_embd), np.float32)
            s.block([min(1, hp.n_vocab - 1)] + [mask] * (bs - 1), n, embd_state=state)
    except BaseException as e:  # noqa: BLE001
        why = _rejection(e)
        return "run-rejected", why
    return "accepted", None


# ---- batches ----------------------------------------------------------------------------------

def _batch_op(s, op: list, k: int, hp, variant: str):
    kind = op[0]
    rng = np.random.default_rng(k)
    if kind in ("inject", "encode"):
        _, n, dw, pos0, seq, special = op
        w = max(0, hp.n_embd_inp_enc + dw)
        x = rng.standard_normal((n, w), dtype=np.float32)
        if special == "nan" and x.size:
            x.flat[0] = np.nan
        elif special == "3d":
            x = x.reshape(1, n, w)
        return (s.inject if kind == "inject" else s.encode)(x, pos0, seq)
    if kind == "block":
        _, blocks, embd = op
        state = None
        n = sum(len(b[1]) for b in blocks)
        if embd is not None:
            state = rng.standard_normal((max(0, n + embd[0]), max(0, hp.n_embd + embd[1])), dtype=np.float32)
        elif variant == "lilicorr":
            state = rng.standard_normal((n, hp.n_embd), dtype=np.float32)
        return s.block_multi([tuple(b) for b in blocks], embd_state=state)
    if kind == "seq_rm":
        s.seq_rm(op[1], op[2], op[3])
        return None
    raise ValueError(kind)


def _outputs(r) -> list:
    if r is None:
        return []
    return [a for a in (r.logits, r.embd, r.h_nextn) if a is not None]


def run_batch(case: dict, work: Path, cache: Path) -> tuple[str, str | None]:
    """Run the ops on one session, then only the accepted ones on a fresh session: a failed
    batch must leave no trace, so both give the same outputs bit for bit."""
    from fuzz_inputs import base_model
    from graphgen.runtime.session import Session
    path = base_model(case["base"], cache)
    kw = dict(n_ctx=case["n_ctx"], n_ubatch=case["n_ubatch"], n_seq=case["n_seq"], flash_attn=case["fa"])
    ok_ops, results, rejected = [], [], 0
    try:
        sess = Session(path, **kw)
    except BaseException as e:  # noqa: BLE001
        return "rejected", _rejection(e)
    with sess as s:
        for k, op in enumerate(case["ops"]):
            try:
                r = _batch_op(s, op, k, s.hparams, s.model.variant)
            except BaseException as e:  # noqa: BLE001
                why = _rejection(e)
                if why:
                    return "rejected", f"op {k} {op!r}: {why}"
                rejected += 1
                continue
            ok_ops.append(k)
            results.append(_outputs(r))
    if rejected:
        with Session(path, **kw) as s:
            for k, want in zip(ok_ops, results):
                got = _outputs(_batch_op(s, case["ops"][k], k, s.hparams, s.model.variant))
                if len(got) != len(want) or any(not np.array_equal(a, b, equal_nan=True) for a, b in zip(got, want)):
                    return "mismatch", (f"op {k} gives other outputs after {rejected} failed batches than "
                                        "in a session that never saw them")
    return ("accepted" if not rejected else "partly-rejected"), None


# ---- scenarios --------------------------------------------------------------------------------

def run_scenario_case(case: dict, work: Path, cache: Path) -> tuple[str, str | None]:
    from fuzz_inputs import base_model
    from graphgen.play.engine import run_scenario
    from graphgen.play.scenario import load_scenario
    path = base_model(case["base"], cache)
    work.mkdir(parents=True, exist_ok=True)
    sp = work / "scenario.json"
    doc = case["doc"]
    sp.write_bytes(doc.encode() if isinstance(doc, str) else json.dumps(doc).encode())
    try:
        sc = load_scenario(sp)
        if case.get("trace"):
            from graphgen.view.trace import run_trace
            run_trace(path, sc, io.StringIO(), None, False, work / "dump")
        else:
            run_scenario(path, sc, out=work / "dump" if case.get("dump") else None)
    except BaseException as e:  # noqa: BLE001
        return "rejected", _rejection(e)
    return "accepted", None


# ---- dumps and rules --------------------------------------------------------------------------

def run_dump(case: dict, work: Path, cache: Path) -> tuple[str, str | None]:
    from fuzz_inputs import make_dump_case
    from graphgen.compare.diff import diff_dumps
    from graphgen.compare.pairing import diff_paths
    from graphgen.dump.format import load_dump
    from graphgen.view import dot as D
    from graphgen.view import graph as V
    from graphgen.view.diffmap import diff_map
    from graphgen.view.explorer import graph_json
    from graphgen.view.html import to_html
    files = make_dump_case(case, work)
    rejected = 0
    steps = []

    def step(fn):
        nonlocal rejected
        try:
            return fn()
        except BaseException as e:  # noqa: BLE001
            why = _rejection(e)
            if why:
                raise Unexpected(why) from None
            rejected += 1
            return None

    try:
        res = step(lambda: diff_paths(files["ref"], files["ours"], rules_path=files["rules"]))
        if res is not None:
            for r in res:
                r.format_text()
                json.dumps(r.to_dict())
        d = step(lambda: load_dump(files["target"]))
        ref = step(lambda: load_dump(files["ref"] / files["target"].name))
        if d is not None:
            for i in range(min(len(d.nodes), 40)):
                step(lambda: d.values(i))
            step(lambda: to_html(d))
            step(lambda: D.overview_dot(d.nodes, "g"))
            if len(d.nodes) <= D.FULL_LIMIT:
                step(lambda: D.to_dot(V.from_dump(d), "g"))
            step(lambda: graph_json(d))
            if ref is not None:
                r = step(lambda: diff_dumps(ref, d))
                if r is not None:
                    step(lambda: diff_map(r, ref, d))
                    step(lambda: to_html(ref, d, r))
            d.close()
        steps.append("done")
    except Unexpected as e:
        return "rejected", str(e)
    return ("accepted" if not rejected else "rejected"), None


RUNNERS = {"gguf": run_gguf, "batch": run_batch, "scenario": run_scenario_case, "dump": run_dump}


def main(argv):
    case_file, start, end, work = Path(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3])
    cache = work / "bases"
    lines = case_file.read_text().splitlines()
    for i in range(start, min(end, len(lines))):
        case = json.loads(lines[i])
        print(f"S {i}", flush=True)
        d = work / f"case{i}"
        try:
            outcome, fail = RUNNERS[case["family"]](case, d, cache)
        except BaseException as e:  # noqa: BLE001 - a bug in the harness itself is a failure too
            outcome, fail = "harness-error", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        if fail is None:
            shutil.rmtree(d, ignore_errors=True)
        print(f"R {i} " + json.dumps({"outcome": outcome, "fail": fail}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
