#!/usr/bin/env python3
"""Train a DFlash-family draft for SmolLM2 on the target's own greedy continuations, on the CPU.

    .venv/bin/python tools/train_draft.py --variant dflash    # z-lab DFlash   -> drafts/smollm2-dflash
    .venv/bin/python tools/train_draft.py --variant dflash2   # z-lab DFlash2  -> drafts/smollm2-dflash2
    .venv/bin/python tools/train_draft.py --variant dspark    # speculators DSpark -> drafts/smollm2-dspark

1. data: the target (b11739) continues prompts written by graphgen/training/prompts.py's templates,
   keeping every row's draft-layer inputs (cached in --work, keyed by the data settings);
2. training: the authors' class (z-lab DFlashDraftModel / DFlash2DraftModel, speculators
   DSparkDraftModel) on those features, the target's dequantized embeddings as its frozen block
   embeddings (and z-lab's tied head; DSpark trains its own head over a draft vocabulary)
   (graphgen/training/);
3. OUT: the authors' save_pretrained checkpoint (bf16), draft.gguf from llama.cpp's own converter
   (f16; a HF folder for the target is written from its GGUF for the converter to read), train.json
   (settings, loss history) and card.md; with --measure, the acceptance of `graphgen draft` on the
   held-out prompts in both engines goes into the card.

Progress goes to stderr. Everything is deterministic in --seed except wall-clock times.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphgen import training as T  # noqa: E402


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2", help="the target GGUF or a known name (default smollm2)")
    p.add_argument("--variant", default="dflash", choices=sorted(T.VARIANT_AUTHORS),
                   help="z-lab dflash / dflash2, speculators dspark (default dflash)")
    p.add_argument("--out", help="where the shipped draft goes (default drafts/smollm2-VARIANT)")
    p.add_argument("--work", default=str(ROOT / "build" / "train_draft"), help="cache of generated data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="the target's threads while generating (default 2)")
    p.add_argument("--train-threads", type=int, default=1,
                   help="torch's threads (default 1: on a shared 2-core machine faster than 2)")
    g = p.add_argument_group("data")
    g.add_argument("--prompts", type=int, default=768, help="training prompts (default 768)")
    g.add_argument("--n-predict", type=int, default=96, help="tokens the target generates per prompt (default 96)")
    g.add_argument("--n-seq", type=int, default=32,
                   help="sequences per target batch (default 32: the unified cache's attention grows with it)")
    g = p.add_argument_group("draft")
    d = T.DraftShape()
    g.add_argument("--layers", type=int, default=d.n_layer, help=f"draft layers (default {d.n_layer})")
    g.add_argument("--ff", type=int, default=d.n_ff, help=f"draft FFN width (default {d.n_ff})")
    g.add_argument("--block-size", type=int, default=d.block_size, help=f"trained block size (default {d.block_size})")
    g.add_argument("--features", type=int, default=3,
                   help="target layers read, spread as the authors' build_target_layer_ids spreads them (default 3)")
    g.add_argument("--conv-kernel", type=int, default=d.conv_kernel, help=f"DFlash2 (default {d.conv_kernel})")
    g.add_argument("--conv-group", type=int, default=d.conv_group, help=f"DFlash2 (default {d.conv_group})")
    g.add_argument("--selector-rank", type=int, default=d.selector_rank, help=f"DFlash2 (default {d.selector_rank})")
    g.add_argument("--selector-top-k", type=int, default=d.selector_top_k,
                   help=f"DFlash2 (default {d.selector_top_k})")
    g.add_argument("--markov-rank", type=int, default=d.markov_rank, help=f"DSpark (default {d.markov_rank})")
    g.add_argument("--draft-vocab", type=int, default=d.draft_vocab,
                   help=f"DSpark: the draft vocabulary, the data's most frequent tokens (default {d.draft_vocab})")
    g = p.add_argument_group("training")
    t = T.TrainSettings()
    g.add_argument("--steps", type=int, default=t.steps, help=f"(default {t.steps})")
    g.add_argument("--seqs-per-step", type=int, default=t.seqs_per_step)
    g.add_argument("--anchors", type=int, default=t.anchors_per_seq,
                   help=f"anchors per sequence and step (default {t.anchors_per_seq})")
    g.add_argument("--lr", type=float, default=t.lr)
    g.add_argument("--weight-decay", type=float, default=t.weight_decay)
    g.add_argument("--feature-dropout", type=float, default=t.feature_dropout,
                   help=f"dropout on the target features (default {t.feature_dropout})")
    g.add_argument("--distill", type=float, default=t.distill,
                   help=f"share of the loss on the target's top-{T.TOP_KEPT} distribution (default {t.distill})")
    p.add_argument("--outtype", default="q8_0", choices=("f32", "f16", "bf16", "q8_0"),
                   help="the converter's --outtype for draft.gguf (default q8_0: the shipped drafts stay small)")
    p.add_argument("--measure", action="store_true",
                   help="run graphgen draft on the held-out prompts in both engines and put the result in the card")
    p.add_argument("--data-only", action="store_true", help="only generate (and cache) the data")
    p.add_argument("--measure-only", action="store_true", help="only measure OUT/draft.gguf and rewrite the card")
    return p.parse_args(argv)


def _target_layers(gguf_path) -> int:
    import gguf
    r = gguf.GGUFReader(str(gguf_path))
    arch = r.fields["general.architecture"].contents()
    return int(r.fields[f"{arch}.block_count"].contents())


def _data(args, target, layers, log) -> T.Corpus:
    prompts = T.training_prompts(args.prompts, args.seed)
    key = hashlib.sha256(json.dumps({"target": str(target.resolve()), "layers": layers, "prompts": prompts,
                                     "n_predict": args.n_predict, "top": T.TOP_KEPT}).encode()).hexdigest()[:16]
    work = Path(args.work)
    path = work / f"corpus-{key}.npz"
    if path.is_file():
        log(f"data: {path} (cached)")
        return T.Corpus.load(path)
    work.mkdir(parents=True, exist_ok=True)
    corpus = T.generate_corpus(target, layers, prompts, n_predict=args.n_predict, n_seq=args.n_seq,
                               n_threads=args.threads, log=log)
    corpus.meta = {"prompts": len(prompts), "n_predict": args.n_predict, "n_seq": args.n_seq, "threads": args.threads}
    tmp = path.with_suffix(".tmp.npz")
    corpus.save(tmp)
    tmp.replace(path)
    return corpus


def _convert(out: Path, folder: Path, outtype: str, log) -> Path:
    from graphgen.authors.convert import convert
    res = convert(out, out / "draft.gguf", target_dir=folder, outtype=outtype, force=True, warn=log)
    log(f"convert: {res.out} ({res.out.stat().st_size / 1e6:.1f} MB, llama.cpp converter {res.commit}, "
        f"{res.seconds:.0f} s)")
    return res.out


def measure(draft: Path, target: str, prompts, n_predict: int = 64, threads: int = 2) -> dict:
    """`graphgen draft` on `prompts` (one sequence each, batched) in both engines: the JSON summaries."""
    out = {}
    for engine in ("graphgen", "llama.cpp"):
        cmd = [sys.executable, "-m", "graphgen.cli", "draft", "-m", target, "-md", str(draft), "-n", str(n_predict),
               "--temp", "0", "--json", "--no-baseline", "-np", str(len(prompts)), "-t", str(threads),
               "--engine", engine]
        for p in prompts:
            cmd += ["-p", p]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            raise T.TrainError(f"graphgen draft ({engine}) failed: {r.stderr.strip().splitlines()[-1:]}")
        out[engine] = json.loads(r.stdout)
    return out


_TITLES = {
    "dflash": ("a z-lab DFlash draft", "z-lab `DFlashDraftModel`"),
    "dflash2": ("a z-lab DFlash2 draft", "z-lab `DFlash2DraftModel`"),
    "dspark": ("a speculators DSpark draft", "speculators `DSparkDraftModel`"),
}


def _shape_lines(s: dict) -> list[str]:
    v = s.get("variant", "dflash")
    lines = [
        f"- hidden {s['n_embd']}, {s['n_layer']} layer(s), heads {s['n_head']} / {s['n_head_kv']}, head_dim "
        f"{s['head_dim']}, FFN {s['n_ff']}, rope theta {s['rope_theta']:g}, rms eps {s['rms_eps']:g}",
        f"- block size {s['block_size']}, mask token {s['mask_token_id']} (`<empty_output>`, a control token "
        "the target does not emit in text)",
        (f"- aux_hidden_state_layer_ids {[i + 1 for i in s['target_layer_ids']]} (speculators' numbering: "
         "the target's hidden_states indices, the inputs of those layers, as the GGUF's dflash.target_layers)"
         if v == "dspark" else
         f"- target_layer_ids {s['target_layer_ids']} (z-lab's numbering: outputs of those layers; the GGUF "
         f"reads layer inputs {[i + 1 for i in s['target_layer_ids']]})")
        + f", spread as dflash's `build_target_layer_ids({s['n_target_layers']}, {len(s['target_layer_ids'])})`",
    ]
    if v == "dflash2":
        lines.append(f"- grouped dynamic convolutions around attention and FFN (kernel {s['conv_kernel']}, groups of "
                     f"{s['conv_group']}); the candidate selector re-ranks the top {s['selector_top_k']} of each row "
                     f"with rank-{s['selector_rank']} predecessor / successor codebooks")
    if v == "dspark":
        lines.append(f"- a draft vocabulary of the data's {s['draft_vocab']} most frequent tokens (`d2t`), with its "
                     f"own head started from the target's rows; a vanilla Markov head of rank {s['markov_rank']}; a "
                     "confidence head over the hidden state and the Markov embedding; block rows sample from the "
                     f"anchor (`sample_from_anchor`): {s['block_size']} drafted tokens a block")
    else:
        lines.append("- no embeddings or head of its own: it borrows the target's, as llama.cpp's converter "
                     "writes such drafts")
    return lines


def _cpu_minutes(history) -> float:
    return max((r.get("cpu_seconds", 0.0) for r in history), default=0.0) / 60


def _card(out: Path, summary: dict, command: str, measured: dict | None) -> str:
    d, s, t, h = summary["data"], summary["shape"], summary["train"], summary["history"]
    variant = s.get("variant", "dflash")
    title, cls = _TITLES[variant]
    kept = next((r["kept_step"] for r in h if "kept_step" in r), None)
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file() and p.name != "card.md"}
    outtype = summary.get("outtype", "f16")
    lines = [
        f"# smollm2-{variant}: {title} trained for SmolLM2-135M-Instruct",
        "",
        f"A one-layer {cls} trained on CPU to draft for SmolLM2-135M-Instruct (Q4_1, the `smollm2`",
        "target). Small and briefly trained: a working draft for tests and benchmarks of the",
        "speculative loop and of acceptance across engines, not a production draft.",
        "",
        "## Files",
        "",
        "| file | bytes | what |",
        "|---|---|---|",
    ]
    what = {"config.json": "the authors' config, as their save_pretrained writes it",
            "config.py": "speculators' config class, as its save_pretrained copies it",
            "model.safetensors": "the weights, bf16, from the authors' save_pretrained",
            "draft.gguf": f"llama.cpp's converter ({outtype})",
            "train.json": "settings and the loss history of the run"}
    lines += [f"| `{n}` | {b:,} | {what.get(n, '')} |" for n, b in sizes.items()]
    lines += ["", "## Draft", "", *_shape_lines(s), "", "## Data", "",
              f"- {d['sequences']} prompts written by `graphgen/training/prompts.py` from templates and word lists "
              "(about a fifth in SmolLM2's chat format), no downloads; seeded",
              f"- the target's greedy continuations in llama.cpp b11739, {d.get('n_predict')} tokens each, "
              f"{d.get('n_seq')} sequences per batch, {d.get('threads')} threads: {d['generated_tokens']} tokens "
              f"in {d['seconds']:.0f} s, with the inputs of target layers {d['layers']} and the target's best "
              "16 logits at every row",
              "- the held-out prompts of the measurements are none of these (`HELD_OUT_PROMPTS`, and "
              "`graphgen accept`'s own)",
              "", "## Training", "",
              f"- {t['steps']} steps of {t['seqs_per_step']} sequences x {t['anchors_per_seq']} anchors (blocks), "
              f"AdamW lr {t['lr']:g} (warmup {t['warmup']}, cosine to a tenth), weight decay {t['weight_decay']}, "
              f"bf16 autocast, {t['threads']} torch thread(s), seed {t['seed']}; {t['val_seqs']} of the sequences "
              "held out of training to watch overfitting",
              f"- dropout {t.get('feature_dropout', 0)} on the target features; the weights kept are those of the "
              f"logged step with the lowest held-out CE (step {kept or t['steps']})",
              f"- loss: per block row, {1 - t['distill']:g} x cross-entropy against the target's greedy token + "
              f"{t['distill']:g} x cross-entropy against its top-16 distribution, weighted exp(-d / {t['decay']:g}) "
              "for drafted token d (0 = the first)"
              + {"dflash2": f"; plus {t['selector_alpha']:g} x the selector's cross-entropy over the unary top-k "
                            "(the target's token put in at rank k when missing, as speculators trains it)",
                 "dspark": f"; the Markov bias added to the logits; plus {t['confidence_alpha']:g} x the confidence "
                           "head's binary cross-entropy against the row's teacher-forced hit"}.get(variant, ""),
              f"- {_cpu_minutes(h):.1f} minutes of one core's CPU time ({summary['seconds'] / 60:.1f} minutes of wall "
              "time on 2 CPU cores shared with other jobs)",
              "",
              "| step | wall minutes | loss | CE | first-token top-1 | all-rows top-1 | held-out CE | held-out first-token top-1 |",
              "|---|---|---|---|---|---|---|---|"]
    h = [r for r in h if "step" in r]
    pick = h if len(h) <= 10 else [h[round(i * (len(h) - 1) / 9)] for i in range(10)]
    lines += [f"| {r['step']} | {r['seconds'] / 60:.1f} | {r['loss']:.3f} | {r['ce']:.3f} | {r['acc1']:.3f} | "
              f"{r['acc']:.3f} | {r.get('val_ce', float('nan')):.3f} | {r.get('val_acc1', float('nan')):.3f} |"
              for r in pick]
    lines += ["", "(top-1: how often the draft's first drafted token, or any row, is the target's, teacher-forced; "
              "training columns average the batches since the row before, held-out ones are one fixed batch)", ""]
    if measured:
        lines += ["## Acceptance", "",
                  f"`graphgen draft -m smollm2 -md draft.gguf -n {measured['n_predict']} --temp 0` on the held-out "
                  "prompts, one sequence each, batched (mean acceptance length, as vLLM, z-lab's "
                  "`dflash_generate` and llama.cpp count it: 1 + accepted / drafts, a draft's accepted tokens "
                  "and the target's own, so a draft that never hits has 1.0):", ""]
        lines += [f"- {json.dumps(p)}" for p in measured["prompts"]]
        lines += ["", "| engine | mean acceptance length | drafts | drafted | accepted | per position |",
                  "|---|---|---|---|---|---|"]
        for engine, r in measured["engines"].items():
            per = ", ".join(f"{x:.2f}" for x in r["acceptance_per_position"] or [])
            lines.append(f"| {engine} | {r['mean_acceptance_length']:.3f} | {r['drafts']} | {r['drafted_tokens']} | "
                         f"{r['accepted_tokens']} | {per} |")
        lines += ["", measured["same"], ""]
    lines += ["## Remaking it", "", "```sh", command, "```", "",
              "The data is cached under `build/train_draft/`; bit-identical weights need the same torch build.",
              ""]
    return "\n".join(lines)


def _measured(draft: Path, target: str, threads: int) -> dict:
    runs = measure(draft, target, T.HELD_OUT_PROMPTS, 64, threads)
    engines = {}
    for engine, r in runs.items():
        engines[engine] = {k: r.get(k) for k in ("mean_acceptance_length", "drafts", "drafted_tokens",
                                                 "accepted_tokens", "blocks", "acceptance_per_position")}
    same = ("Both engines accepted the same tokens." if runs["graphgen"].get("tokens") == runs["llama.cpp"].get("tokens")
            and engines["graphgen"] == engines["llama.cpp"] else "The engines DIFFER.")
    return {"n_predict": 64, "prompts": T.HELD_OUT_PROMPTS, "engines": engines, "same": same}


def main(argv=None) -> int:
    args = _args(argv)
    log = T.stderr_log
    from graphgen.speculative.targets import resolve
    target = resolve(args.target)
    out = Path(args.out or ROOT / "drafts" / f"smollm2-{args.variant}")
    command = ".venv/bin/python tools/train_draft.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    if args.measure_only:
        summary = json.loads((out / "train.json").read_text())
        m = _measured(out / "draft.gguf", args.target, args.threads)
        (out / "card.md").write_text(_card(out, summary, summary.get("command", command), m))
        log(json.dumps(m, indent=1))
        return 0
    n_layer = _target_layers(target)
    ids = T.authors_layer_ids(n_layer, args.features)
    shape = T.DraftShape(variant=args.variant, n_ff=args.ff, n_layer=args.layers, block_size=args.block_size,
                         n_target_layers=n_layer, target_layer_ids=ids, conv_kernel=args.conv_kernel,
                         conv_group=args.conv_group, selector_rank=args.selector_rank,
                         selector_top_k=args.selector_top_k, markov_rank=args.markov_rank,
                         draft_vocab=args.draft_vocab)
    shape.spec()  # refuses a shape the authors' classes cannot take before the data is made
    t0 = time.perf_counter()
    corpus = _data(args, target, [i + 1 for i in ids], log)
    if args.data_only:
        return 0
    embed = T.embedding_table(target)
    st = T.TrainSettings(steps=args.steps, seqs_per_step=args.seqs_per_step, anchors_per_seq=args.anchors,
                         lr=args.lr, seed=args.seed, weight_decay=args.weight_decay,
                         feature_dropout=args.feature_dropout, distill=args.distill, threads=args.train_threads)
    # everything is written into a staging folder beside OUT and moved in place at the end: an
    # interrupted run leaves the shipped draft as it was
    stage = out.parent / f".{out.name}.partial"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="train-draft-target.") as tmp:
        # the target as a HF folder (config and tokenizer): speculators' config names its verifier,
        # and llama.cpp's converter reads the target's tokenizer from it
        folder = T.write_target_folder(target, Path(tmp) / "target")
        model, history, seconds = T.train(corpus, embed, shape, st, log, target_folder=folder)
        T.save_checkpoint(model, stage, verifier=T.SMOLLM2_VERIFIER if shape.authors == "speculators" else None)
        summary = T.summary_dict(corpus, shape, st, history, seconds)
        summary["command"] = command
        summary["outtype"] = args.outtype
        (stage / "train.json").write_text(json.dumps(summary, indent=1) + "\n")
        _convert(stage, folder, args.outtype, log)
    m = _measured(stage / "draft.gguf", args.target, args.threads) if args.measure else None
    (stage / "card.md").write_text(_card(stage, summary, command, m))
    for f in stage.iterdir():
        f.chmod(0o644)
    if out.exists():
        shutil.rmtree(out)
    stage.rename(out)
    log(f"done in {(time.perf_counter() - t0) / 60:.1f} minutes: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
