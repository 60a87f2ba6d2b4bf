#!/usr/bin/env python3
"""Each draft's acceptance behind the Q4_1 target and behind f16 and f32 copies of its weights.

For every draft named (default: every drafts/*/draft.gguf) and the target (SmolLM2-135M Q4_1 by
default), runs graphgen.accept.quantized.measure: the held-out prompts through the speculative
loop, greedy, behind the file itself and its f16 and f32 copies (dequantized by gguf-py, cached),
and the NMSE of the draft's target-layer inputs against the f32 copy's on the same tokens (each
prompt followed by the f32 target's own continuation). Prints one markdown table, a row per draft
and copy: tau (the mean acceptance length counting the target's own token: 1.0 for a draft that
never hits), accepted drafted tokens per block, acceptance per draft position, tokens/s, the
feature NMSE per draft layer, how many prompts' text equals the f32 target's, and on those
prompts how many rounds drafted other tokens than behind f32 and the tokens accepted (behind f32
in brackets): the same text, other features. Progress on stderr; exit 1 when a copy's features
are farther from f32 than quantization explains or the engines drafted apart, 2 on bad input.

    python tools/quantized_target.py [DRAFT ...] [--target smollm2] [--types q4_1,f16,f32]
                                     [-n 64] [--engines llama.cpp,graphgen] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from graphgen.accept import quantized as Q
from graphgen.errors import GraphgenError

ROOT = Path(__file__).resolve().parent.parent


def shipped_drafts() -> list[Path]:
    return sorted((ROOT / "drafts").glob("*/draft.gguf"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("drafts", nargs="*", help="draft GGUFs, folders holding draft.gguf, or shipped drafts' names "
                                              "(default: every drafts/*/draft.gguf)")
    ap.add_argument("--target", default="smollm2", help="a target GGUF, or a name graphgen knows (default: smollm2)")
    ap.add_argument("--types", default=",".join(Q.DEFAULT_TYPES),
                    help="the target's own type and the dequantized copies, comma-separated; f32 is the reference "
                         f"(default: {','.join(Q.DEFAULT_TYPES)})")
    ap.add_argument("-n", "--n-predict", type=int, default=64, help="tokens generated per prompt (default 64)")
    ap.add_argument("-p", "--prompt-text", action="append", help="a prompt; repeat for more "
                                                                 "(default: compare.py's six held-out prompts)")
    ap.add_argument("--engines", default="llama.cpp",
                    help="llama.cpp, graphgen or both, comma-separated (default llama.cpp)")
    ap.add_argument("--threads", type=int, default=1, help="threads of the target and the draft (default 1)")
    ap.add_argument("--json", metavar="FILE", help="also write every result, rounds included, as JSON")
    args = ap.parse_args(argv)

    def log(line):
        print(f"[{time.perf_counter() - t0:6.1f} s] {line}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        from graphgen.speculative.targets import resolve_draft
        drafts = [resolve_draft(d) for d in args.drafts] or shipped_drafts()
        if not drafts:
            raise GraphgenError(f"no drafts named and none in {ROOT / 'drafts'}")
        if args.n_predict < 1:
            raise GraphgenError(f"-n {args.n_predict}: at least 1")
        engines = [e for e in args.engines.replace(" ", "").split(",") if e]
        bad = [e for e in engines if e not in ("llama.cpp", "graphgen")]
        if bad or not engines:
            raise GraphgenError(f"--engines {args.engines}: the engines are llama.cpp and graphgen")
        log(f"copies of {args.target}: {args.types}")
        copies = Q.target_copies(args.target, [t for t in args.types.replace(" ", "").split(",") if t])
        results = []
        for k, d in enumerate(drafts, 1):
            log(f"draft {k} of {len(drafts)}: {d}")
            results.append(Q.measure(d, copies, args.prompt_text, n_predict=args.n_predict, engines=engines,
                                     threads=args.threads, log=log))
    except (FileNotFoundError, GraphgenError) as e:
        print(f"quantized_target: {e}", file=sys.stderr)
        return 2
    log("done")
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in results], indent=1))
    r0 = results[0]
    print(f"{len(r0.prompts)} prompts, -n {r0.n_predict}, greedy; NMSE against {r0.reference} over positions 1.. "
          "of every prompt + the f32 target's continuation\n")
    print(Q.table(results))
    problems = [p for r in results for p in r.problems()]
    for p in problems:
        print(f"quantized_target: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
