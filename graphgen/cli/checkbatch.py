"""`graphgen check-batch`: does a sequence's block depend on what else is in its batch?"""

from __future__ import annotations

import json
import sys

from .kvtypes import add_kv_type_flags, kv_types


def _cmd_check_batch(args) -> int:
    from ..checkbatch import DEFAULT_N_SEQ, ENGINES, check_batch, parse_n_seq
    from ..progress import task as progress_task

    n_seqs = parse_n_seq(args.n_seq) if args.n_seq is not None else list(DEFAULT_N_SEQ)
    fa = args.flash_attn == "on"
    type_k, type_v = kv_types(args, "f16", "f16", fa, "-fa on")
    engines = ENGINES if args.engine == "both" else (args.engine,)
    with progress_task(f"check-batch {args.model}") as task:
        report = check_batch(args.model, n_seqs=n_seqs, block=args.block, prompt=args.prompt, flash_attn=fa,
                             type_k=type_k, type_v=type_v, engines=engines, seed=args.seed, progress=task.update)
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
    p = sub.add_parser(
        "check-batch", help="does a sequence's block depend on the batch? (graphgen and llama.cpp b11739)",
        description="For each number of sequences, with equal and unequal blocks and a prompt of its own per "
                    "sequence, compute every sequence's block batched with the others and alone (same cache, "
                    "and a cache of its own), compare its rows node by node, in graphgen and in llama.cpp "
                    "b11739, and compare the two engines bit for bit. Exit 0 when graphgen's results equal "
                    "b11739's bit for bit (with one engine: when its results do not depend on the batch), "
                    "1 otherwise, 2 on bad input.")
    p.add_argument("model", help="the draft GGUF")
    p.add_argument("--n-seq", default=None, metavar="N,N,...",
                   help="numbers of sequences in one batch (default 1,2,4,8,16)")
    p.add_argument("--block", type=int, default=None, metavar="N",
                   help="block length of the equal blocks, and the longest unequal one (default: the draft's "
                        "block_size, 4 when it has none)")
    p.add_argument("--prompt", type=int, default=6, metavar="N",
                   help="prompt length of sequence 0; sequence k's is N + (3k mod 5) (default 6)")
    p.add_argument("-fa", "--flash-attn", choices=("on", "off"), default="off",
                   help="flash attention (default off)")
    add_kv_type_flags(p, "f16", fa_hint="-fa on")
    p.add_argument("--engine", choices=("graphgen", "llama.cpp", "both"), default="both",
                   help="which engines to measure (default both; both also compares them)")
    p.add_argument("--seed", type=_nonneg, default=0, help="seed of the block tokens and features (default 0)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON on stdout")
    p.set_defaults(fn=_cmd_check_batch)
