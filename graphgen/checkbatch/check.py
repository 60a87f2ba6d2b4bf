"""check_batch, the command's work: its inputs checked, the cases planned, each run in each
engine and measured as it comes, and with both engines their graphs compared bit for bit.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..cachetypes import KV_QUANTIZED, KV_TYPES
from .engines import ReferenceWorker, run_graphgen
from .measure import compare_case, graphs_equal
from .plan import CheckBatchError, case_scenario, plan_cases, settings_for
from .results import CaseResult, Report, label

ENGINES = ("graphgen", "llama.cpp")
# 4 sequences hold equal blocks and unequal ones down to a one-token block: seconds on a tiny
# draft. The whole sweep (--thorough) takes minutes there, most of it in b11739's runs.
DEFAULT_N_SEQ = (4,)
THOROUGH_N_SEQ = (1, 2, 4, 8, 16)
FAIL_ON = ("batch", "parity")


def parse_n_seq(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CheckBatchError(f"--n-seq must be a comma-separated list of integers, got {text!r}") from None
    if not vals or any(v < 1 or v > 256 for v in vals):
        raise CheckBatchError(f"--n-seq values must be between 1 and 256, got {text!r}")
    return sorted(set(vals))


def check_batch(model, n_seqs=DEFAULT_N_SEQ, block: int | None = None, prompt: int = 6, flash_attn: bool | str = False,
                type_k: str = "f16", type_v: str = "f16", engines=ENGINES, seed: int = 0, progress=None,
                n_ctx: int | None = None, n_ubatch: int | None = None, n_threads: int = 1,
                fail_on: str = "batch", backend: str = "cpu") -> Report:
    """Run every case in each engine and compare; `progress(text)` is told what runs.
    flash_attn: a bool, or -fa's "on", "off" or "auto" (b11739 then decides itself, graphgen as
    scenario.resolve_fa does; the engines' parity shows a disagreement)."""
    from ..play.scenario import resolve_fa
    from ..runtime.model import load
    from ..runtime.kvcache import check_kv_types

    engines = tuple(engines)
    if not engines or any(e not in ENGINES for e in engines):
        raise CheckBatchError(f"--engine must name graphgen, llama.cpp or both, got {', '.join(engines) or 'none'}")
    if fail_on not in FAIL_ON:
        raise CheckBatchError(f"--fail-on must be one of {', '.join(FAIL_ON)}, got {fail_on!r}")
    if fail_on == "parity" and len(engines) != 2:
        raise CheckBatchError("--fail-on parity compares the two engines: it needs --engine both")
    asked = flash_attn if isinstance(flash_attn, str) else None
    if asked is not None:
        if asked not in ("on", "off", "auto"):
            raise CheckBatchError(f"-fa must be on, off or auto, got {asked!r}")
        flash_attn = bool(resolve_fa(asked))
    for flag, v in (("--type-k", type_k), ("--type-v", type_v)):
        if v not in KV_TYPES:
            raise CheckBatchError(f"{flag} must be one of {', '.join(KV_TYPES)}, got {v!r}")
    if type_v in KV_QUANTIZED and not flash_attn:
        raise CheckBatchError(f"--type-v {type_v}: a quantized V cache requires flash attention (-fa on or auto)")
    if prompt < 1:
        raise CheckBatchError(f"--prompt must be at least 1, got {prompt}")
    m = load(model)
    try:
        hp = m.hparams
        rules = m.head.block_rules(hp)
        check_kv_types(hp, type_k, type_v, flash_attn, k_only=m.backbone != "base")
        mask = max(hp.mask_token_id, 0)
        n_vocab = hp.n_vocab
    finally:
        m.close()
    block = block if block is not None else (hp.block_size or 4)
    if block < 1:
        raise CheckBatchError(f"--block must be at least 1, got {block}")
    if rules.max_block and block > rules.max_block:
        raise CheckBatchError(f"--block {block} is longer than this head's lattice holds ({rules.max_block} rows, "
                              "the draft's block_size)")
    cases = plan_cases(rules, n_vocab, mask, n_seqs, block, prompt, seed)
    st = settings_for(cases, flash_attn, type_k, type_v, seed, n_ctx, n_ubatch, n_threads)
    st.flash_attn_asked = asked
    report = Report(Path(model).name, st, block, prompt, engines, fail_on=fail_on)
    tmp = tempfile.TemporaryDirectory(prefix="graphgen-checkbatch-")
    worker = ReferenceWorker(Path(tmp.name)) if "llama.cpp" in engines else None
    parity = {"graphs": 0, "nodes": 0, "identical": True, "first": None} if len(engines) == 2 else None
    try:
        n_runs, run = sum(1 for c in cases if not c.note) * len(engines), 0
        for case in cases:
            cr = CaseResult(case.n_seq, case.kind, case.note, prompts=list(case.prompts))
            report.cases.append(cr)
            if case.note:
                continue
            sc, roles = case_scenario(case, st)
            sc.flash_attn_auto = asked == "auto"
            runs = {}
            for e in engines:
                run += 1
                if progress:
                    progress(f"run {run} of {n_runs}: n_seq {case.n_seq}, {case.kind} blocks, {label(e)} "
                             f"({len(roles)} block graphs)")
                graphs = run_graphgen(model, sc, backend) if e == "graphgen" else worker.run(model, sc)
                cr.seqs[e], cr.reproducible[e], runs[e] = compare_case(case, graphs, roles, e)
            if parity is not None:
                for k, (x, y) in enumerate(zip(runs["graphgen"], runs["llama.cpp"])):
                    parity["graphs"] += 1
                    parity["nodes"] += len(x.nodes)
                    why = graphs_equal(x, y)
                    if why is not None and parity["identical"]:
                        parity["identical"] = False
                        role, i = roles[k]
                        parity["first"] = (f"n_seq {case.n_seq} {case.kind} blocks, {role} block"
                                           + (f" of sequence {i}" if i >= 0 else "") + f": {why}")
        if parity is not None and parity["graphs"] == 0:
            raise CheckBatchError("no case ran: nothing was compared between the engines")
        report.parity = parity
    finally:
        if worker is not None:
            worker.close()
        tmp.cleanup()
    if not any(not c.note for c in report.cases):
        raise CheckBatchError("no case ran (every --n-seq case was refused): nothing was compared")
    return report
