#!/usr/bin/env python3
"""Train a z-lab DFlash draft for SmolLM2 on the target's own greedy continuations, on the CPU.

    .venv/bin/python tools/train_draft.py --out drafts/smollm2-dflash

1. data: the target (b11739) continues prompts written by graphgen/accept/train.py's templates,
   keeping every row's draft-layer inputs (cached in --work, keyed by the data settings);
2. training: the authors' DFlashDraftModel on those features, the target's dequantized embeddings
   as its frozen block embeddings and tied head (graphgen/accept/train.py);
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphgen.accept import train as T  # noqa: E402


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2", help="the target GGUF or a known name (default smollm2)")
    p.add_argument("--out", default=str(ROOT / "drafts" / "smollm2-dflash"), help="where the shipped draft goes")
    p.add_argument("--work", default=str(ROOT / "build" / "train_draft"), help="cache of generated data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="the target's threads while generating (default 2)")
    p.add_argument("--train-threads", type=int, default=1,
                   help="torch's threads (default 1: on a shared 2-core machine faster than 2)")
    g = p.add_argument_group("data")
    g.add_argument("--prompts", type=int, default=256, help="training prompts (default 256)")
    g.add_argument("--n-predict", type=int, default=48, help="tokens the target generates per prompt (default 48)")
    g.add_argument("--n-seq", type=int, default=64, help="sequences per target batch (default 64)")
    g = p.add_argument_group("draft")
    g.add_argument("--layers", type=int, default=1, help="draft layers (default 1)")
    g.add_argument("--ff", type=int, default=320, help="draft FFN width (default 320)")
    g.add_argument("--block-size", type=int, default=8, help="trained block size (default 8)")
    g.add_argument("--features", type=int, default=3,
                   help="target layers read, spread as the authors' build_target_layer_ids spreads them (default 3)")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=600)
    g.add_argument("--seqs-per-step", type=int, default=8)
    g.add_argument("--anchors", type=int, default=12, help="anchors per sequence and step (default 12)")
    g.add_argument("--lr", type=float, default=2e-3)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--feature-dropout", type=float, default=0.1, help="dropout on the target features (default 0.1)")
    g.add_argument("--negatives", type=int, default=0,
                   help="softmax over the data's tokens plus this many random others per step (default 0: all)")
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
                                     "n_predict": args.n_predict}).encode()).hexdigest()[:16]
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


def _convert(out: Path, target, log) -> Path:
    from graphgen.authors.convert import convert
    with tempfile.TemporaryDirectory(prefix="train-draft-target.") as tmp:
        folder = T.write_target_folder(target, Path(tmp) / "target")
        res = convert(out, out / "draft.gguf", target_dir=folder, outtype="f16", force=True, warn=log)
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


def _card(out: Path, summary: dict, command: str, measured: dict | None) -> str:
    d, s, t, h = summary["data"], summary["shape"], summary["train"], summary["history"]
    kept = next((r["kept_step"] for r in h if "kept_step" in r), None)
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file() and p.name != "card.md"}
    lines = [
        "# smollm2-dflash: a z-lab DFlash draft trained for SmolLM2-135M-Instruct",
        "",
        "A one-layer z-lab `DFlashDraftModel` trained on CPU to draft for SmolLM2-135M-Instruct (Q4_1, the",
        "`smollm2` target). It has no embeddings or lm head of its own: it borrows the target's, as",
        "llama.cpp's converter writes such drafts. Small and briefly trained: a working draft for tests",
        "and benchmarks of the speculative loop, not a production draft.",
        "",
        "## Files",
        "",
        "| file | bytes | what |",
        "|---|---|---|",
    ]
    what = {"config.json": "the authors' config (Qwen3Config with z-lab's dflash_config)",
            "model.safetensors": "the weights, bf16, from the authors' save_pretrained",
            "draft.gguf": "llama.cpp's converter (f16), `dflash.target_layers` = ids + 1",
            "train.json": "settings and the loss history of the run"}
    lines += [f"| `{n}` | {b:,} | {what.get(n, '')} |" for n, b in sizes.items()]
    lines += [
        "",
        "## Draft",
        "",
        f"- hidden {s['n_embd']}, {s['n_layer']} layer(s), heads {s['n_head']} / {s['n_head_kv']}, head_dim "
        f"{s['head_dim']}, FFN {s['n_ff']}, rope theta {s['rope_theta']:g}, rms eps {s['rms_eps']:g}",
        f"- block size {s['block_size']}, mask token {s['mask_token_id']} (`<empty_output>`, a control token "
        "the target does not emit in text)",
        f"- target_layer_ids {s['target_layer_ids']} (the authors' numbering: outputs of those layers; the GGUF "
        f"reads layer inputs {[i + 1 for i in s['target_layer_ids']]}), spread as dflash's "
        f"`build_target_layer_ids({s['n_target_layers']}, {len(s['target_layer_ids'])})`",
        "",
        "## Data",
        "",
        f"- {d['sequences']} prompts written by `graphgen/accept/train.py` from templates and word lists "
        "(about a fifth in SmolLM2's chat format), no downloads; seeded",
        f"- the target's greedy continuations in llama.cpp b11739, {d.get('n_predict')} tokens each, "
        f"{d.get('n_seq')} sequences per batch, {d.get('threads')} threads: {d['generated_tokens']} tokens "
        f"in {d['seconds']:.0f} s, with the inputs of target layers {d['layers']} at every row",
        "- the held-out prompts of the measurement are none of these (`HELD_OUT_PROMPTS`)",
        "",
        "## Training",
        "",
        f"- {t['steps']} steps of {t['seqs_per_step']} sequences x {t['anchors_per_seq']} anchors (blocks), "
        f"AdamW lr {t['lr']:g} (warmup {t['warmup']}, cosine to a tenth), weight decay {t['weight_decay']}, "
        f"bf16 autocast, {t['threads']} torch thread(s), seed {t['seed']}; {t['val_seqs']} of the sequences "
        "held out of training to watch overfitting",
        f"- dropout {t.get('feature_dropout', 0)} on the target features; the weights kept are those of the logged "
        f"step with the lowest held-out CE (step {kept or t['steps']})",
        "- softmax over the whole vocabulary" if not t.get("negatives") else
        f"- softmax over the data's tokens plus {t['negatives']} random others per step",
        f"- loss: cross-entropy of block row i against the target's token, weighted exp(-(i - 1) / {t['decay']:g})",
        f"- {summary['seconds'] / 60:.1f} minutes of training on 2 shared CPU cores",
        "",
        "| step | minutes | loss | CE | row-1 top-1 | all-rows top-1 | held-out CE | held-out row-1 top-1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    h = [r for r in h if "step" in r]
    pick = h if len(h) <= 10 else [h[round(i * (len(h) - 1) / 9)] for i in range(10)]
    lines += [f"| {r['step']} | {r['seconds'] / 60:.1f} | {r['loss']:.3f} | {r['ce']:.3f} | {r['acc1']:.3f} | "
              f"{r['acc']:.3f} | {r.get('val_ce', float('nan')):.3f} | {r.get('val_acc1', float('nan')):.3f} |"
              for r in pick]
    lines += ["", "(top-1: how often the draft's first drafted token, or any of its rows, is the target's; training "
              "columns average the batches since the row before, held-out ones are one fixed batch)", ""]
    if measured:
        lines += ["## Acceptance", "",
                  f"`graphgen draft -m smollm2 -md draft.gguf -n {measured['n_predict']} --temp 0` on the held-out "
                  "prompts, one sequence each, batched:", ""]
        lines += [f"- {json.dumps(p)}" for p in measured["prompts"]]
        lines += ["", "| engine | mean accepted length | blocks | drafted | accepted | per position |",
                  "|---|---|---|---|---|---|"]
        for engine, r in measured["engines"].items():
            per = ", ".join(f"{x:.2f}" for x in r["acceptance_per_position"] or [])
            lines.append(f"| {engine} | {r['mean_accepted_length']:.3f} | {r['blocks']} | {r['drafted_tokens']} | "
                         f"{r['accepted_tokens']} | {per} |")
        lines += ["", measured["same"], ""]
    if h:
        best = min(h, key=lambda r: r.get("val_ce", float("inf")))
        last = h[-1]
        lines += ["## Assessment", "",
                  f"Held-out CE is lowest at step {best['step']} ({best.get('val_ce', float('nan')):.2f}) and rises "
                  f"after it while the training CE keeps falling (to {last['ce']:.2f} at step {last['step']}; "
                  f"row-1 top-1 {last['acc1']:.2f} on training batches against {last.get('val_acc1', float('nan')):.2f} "
                  f"held out): the draft memorizes its {d['generated_tokens']} generated tokens. Data, not steps, "
                  "limits it: the held-out first-row top-1 stays near a quarter, and the acceptance above follows it "
                  "(almost all accepted tokens are first drafted tokens). More of the target's continuations are the "
                  "next lever; b11739 generated them at about "
                  f"{d['generated_tokens'] / max(d['seconds'], 1):.0f} tokens/s on these cores.", ""]
    lines += ["## Remaking it", "", "```sh", command, "```", "",
              "The data is cached under `build/train_draft/`; bit-identical weights need the same torch build.",
              ""]
    return "\n".join(lines)


def _measured(draft: Path, target: str, threads: int) -> dict:
    runs = measure(draft, target, T.HELD_OUT_PROMPTS[:4], 64, threads)
    engines = {}
    for engine, r in runs.items():
        engines[engine] = {k: r.get(k) for k in ("mean_accepted_length", "drafted_tokens", "accepted_tokens", "blocks",
                                                 "acceptance_per_position")}
    same = ("Both engines accepted the same tokens." if runs["graphgen"].get("tokens") == runs["llama.cpp"].get("tokens")
            and engines["graphgen"] == engines["llama.cpp"] else "The engines DIFFER.")
    return {"n_predict": 64, "prompts": T.HELD_OUT_PROMPTS[:4], "engines": engines, "same": same}


def main(argv=None) -> int:
    args = _args(argv)
    log = T.stderr_log
    from graphgen.targets import resolve
    target = resolve(args.target)
    out = Path(args.out)
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
    shape = T.DraftShape(n_ff=args.ff, n_layer=args.layers, block_size=args.block_size, n_target_layers=n_layer,
                         target_layer_ids=ids)
    t0 = time.perf_counter()
    corpus = _data(args, target, [i + 1 for i in ids], log)
    if args.data_only:
        return 0
    embed = T.embedding_table(target)
    st = T.TrainSettings(steps=args.steps, seqs_per_step=args.seqs_per_step, anchors_per_seq=args.anchors,
                         lr=args.lr, negatives=args.negatives, seed=args.seed,
                         weight_decay=args.weight_decay, feature_dropout=args.feature_dropout,
                         threads=args.train_threads)
    model, history, seconds = T.train(corpus, embed, shape, st, log)
    T.save_checkpoint(model, out)
    summary = T.summary_dict(corpus, shape, st, history, seconds)
    summary["command"] = command
    (out / "train.json").write_text(json.dumps(summary, indent=1) + "\n")
    _convert(out, target, log)
    m = _measured(out / "draft.gguf", args.target, args.threads) if args.measure else None
    (out / "card.md").write_text(_card(out, summary, command, m))
    for f in out.iterdir():
        f.chmod(0o644)
    log(f"done in {(time.perf_counter() - t0) / 60:.1f} minutes: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
