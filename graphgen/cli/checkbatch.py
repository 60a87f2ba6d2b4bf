"""`graphgen check-batch`: does a sequence's block depend on what else is in its batch?"""

from __future__ import annotations

import json
import sys

from .kvtypes import add_kv_type_flags, kv_types


def _cmd_check_batch(args) -> int:
    from ..checkbatch import DEFAULT_N_SEQ, ENGINES, THOROUGH_N_SEQ, check_batch, parse_n_seq
    from ..errors import GraphgenError
    from ..progress import task as progress_task
    from ..speculative.targets import draft_label, resolve_draft
    from .llamaflags import model_path, resolve_fa

    given = model_path(args)
    args.model = str(resolve_draft(given))  # a file, a folder holding draft.gguf, or a shipped draft's name
    if args.n_seq is not None and args.thorough:
        raise GraphgenError("--thorough is --n-seq " + ",".join(map(str, THOROUGH_N_SEQ)) + ": give one of them")
    n_seqs = (parse_n_seq(args.n_seq) if args.n_seq is not None else
              list(THOROUGH_N_SEQ) if args.thorough else list(DEFAULT_N_SEQ))
    fa = args.flash_attn or "off"
    type_k, type_v = kv_types(args, "f16", "f16", bool(resolve_fa(fa)), "-fa on")
    engines = ENGINES if args.engine == "both" else (args.engine,)
    from .llamaflags import backend_of
    backend = backend_of(args.backend or "cpu")
    if backend != "cpu" and "llama.cpp" in engines:
        # b11739's wheel computes on its CPU: a parity across devices would not be one
        raise GraphgenError(f"-dev {args.backend}: llama.cpp b11739 runs on the CPU here; give --engine graphgen "
                            "to measure graphgen's batches on that device")
    # llama.cpp caps the micro-batch at the logical batch
    n_ubatch = args.n_ubatch if args.n_batch is None else min(args.n_batch, args.n_ubatch or args.n_batch)
    with progress_task(f"check-batch {given}", every_step=True) as task:
        report = check_batch(args.model, n_seqs=n_seqs, block=args.block, prompt=args.prompt, flash_attn=fa,
                             type_k=type_k, type_v=type_v, engines=engines, seed=args.seed, progress=task.update,
                             n_ctx=args.n_ctx, n_ubatch=n_ubatch, n_threads=args.threads or 1, fail_on=args.fail_on,
                             backend=backend)
    report.model = draft_label(given)  # draft.gguf, a shipped draft's file, names none of them
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=1)
        print()
    else:
        print(report.format_text())
    return report.exit_code()


def _nonneg(text: str) -> int:
    from .llamaflags import count_arg
    return count_arg(0)(text)


def register(sub) -> None:
    from ..checkbatch import DEFAULT_N_SEQ, THOROUGH_N_SEQ
    from .llamaflags import add_context_flags, add_device, add_model

    p = sub.add_parser(
        "check-batch", help="does a sequence's block depend on the batch? (graphgen and llama.cpp b11739)",
        description="For each number of sequences, with equal and unequal blocks and a prompt of its own per "
                    "sequence, compute every sequence's block batched with the others and alone (same cache, "
                    "and a cache of its own), compare its rows node by node, in graphgen and in llama.cpp "
                    "b11739, and compare the two engines bit for bit. Exit 0 when no sequence's results depend "
                    "on the batch (and, with both engines, the engines are bit-identical), 1 otherwise "
                    "(--fail-on parity: 1 only when the engines differ), 2 on bad input.")
    add_model(p)
    p.add_argument("--n-seq", default=None, metavar="N,N,...",
                   help="numbers of sequences in one batch (default " + ",".join(map(str, DEFAULT_N_SEQ))
                        + ": seconds on a tiny draft)")
    p.add_argument("--thorough", action="store_true",
                   help="the whole sweep, --n-seq " + ",".join(map(str, THOROUGH_N_SEQ))
                        + " (minutes on a tiny draft, most of it in llama.cpp b11739)")
    p.add_argument("--block", type=int, default=None, metavar="N",
                   help="block length of the equal blocks, and the longest unequal one (default: the draft's "
                        "block_size, 4 when it has none)")
    p.add_argument("--prompt", type=int, default=6, metavar="N",
                   help="N injected prompt rows for sequence 0, N + (3k mod 5) for sequence k, a count (not "
                        "llama.cpp's -p prompt text) (default 6)")
    add_context_flags(p, scenario=False, parallel=False, threads_default="1")
    add_kv_type_flags(p, "f16", fa_hint="-fa on")
    add_device(p)
    p.add_argument("--engine", choices=("graphgen", "llama.cpp", "both"), default="both",
                   help="which engines to measure (default both; both also compares them)")
    p.add_argument("--fail-on", choices=("batch", "parity"), default="batch",
                   help="what exit 1 says: batch, some sequence's results depend on the batch or the engines "
                        "differ (default); parity, the engines' graphs differ (a dependence b11739 shares passes)")
    p.add_argument("--seed", type=_nonneg, default=0, help="seed of the block tokens and features (default 0)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON on stdout")
    p.set_defaults(fn=_cmd_check_batch)
