#!/usr/bin/env python3
"""How far apart the engines' target features are, per layer, as a markdown table.

For one target GGUF (SmolLM2-135M Q4_1 by default) and a fixed English text, the inputs of the
given layers are taken from five runs: llama.cpp b11739 on the Q4_1 file, on its f32 and f16
dequantized copies (made once into graphgen's cache), on the f32 copy again with f32 K/V and
flash attention off, and transformers on the Q4_1 file (its weights dequantized, activations
float32). Printed: each layer's NMSE for five pairs, over every
position and again without position 0 (from layer 12 on, SmolLM2's first token carries a massive
activation holding ~99% of the layer's squared norm, so the first table mostly measures that one
row), then the top-1 agreement of the final logits for the same pairs; timings go to stderr.

    python tools/target_numerics.py [--layers 1,15,28] [--target smollm2] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time

from graphgen.accept import features as F

# written for this table: plain prose, no markup, a few hundred tokens in one sequence
TEXT = (
    "The old bridge at the edge of town was built of grey stone more than two hundred years ago. "
    "Every morning the baker crosses it with a cart of warm bread, and every evening the children "
    "lean over its wall to watch the river carry leaves and sticks toward the mill. In spring the "
    "water rises almost to the arches, and the town council meets to argue about whether the bridge "
    "should be repaired, replaced, or simply left alone. Nobody has ever agreed, so it stands as it "
    "always has.\n\n"
    "To make a simple loaf, mix flour, water, salt and a little yeast in a large bowl until no dry "
    "flour remains. Cover the bowl and leave it somewhere warm for a few hours, until the dough has "
    "doubled in size and is full of small bubbles. Shape it gently on a floured table, let it rest "
    "again, and bake it in a hot oven until the crust is deep brown and the bottom sounds hollow "
    "when you tap it. Let it cool before cutting, or the inside will be sticky.\n\n"
    "Weather forecasts are built from measurements taken all over the world: temperature, pressure, "
    "wind and humidity, collected by stations on land, by ships, by balloons and by satellites. "
    "Computers divide the atmosphere into a grid of boxes and step the equations of motion forward "
    "in time, one small interval after another. Because small errors grow as the steps add up, a "
    "forecast for tomorrow is usually reliable, while one for two weeks ahead is little better than "
    "a guess based on the season."
)

# (label, run a, run b): b is the reference the NMSE divides by
PAIRS = (
    ("(a)", "llama.cpp Q4_1 vs transformers Q4_1", "llama-q", "hf-q"),
    ("(b)", "llama.cpp Q4_1 vs llama.cpp f32", "llama-q", "llama-f32"),
    ("(c)", "llama.cpp f16 vs llama.cpp f32", "llama-f16", "llama-f32"),
    ("(d)", "transformers Q4_1 vs llama.cpp f32", "hf-q", "llama-f32"),
    ("(e)", "transformers Q4_1 vs llama.cpp f32 with f32 K/V and flash attention off", "hf-q", "llama-f32-exact"),
)
# the llama.cpp runs use the loop's target context (f16 K/V, flash attention auto, which is on for
# the CPU); (e) runs without the two roundings to f16 they add to attention
EXACT = {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}


def _layers(value: str, n_layer: int) -> list[int]:
    if value == "all":
        return list(range(n_layer))
    try:
        layers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise F.FeaturesError(f"--layers {value!r}: comma-separated integers, or all") from None
    bad = [il for il in layers if not 0 <= il < n_layer]
    if bad or not layers:
        raise F.FeaturesError(f"--layers {value!r}: layer inputs 0..{n_layer - 1}")
    return layers


def measure(target, layers, n_threads: int = 1, log=sys.stderr):
    """{run: (features, logits)} for the four runs, and the tokens; each run timed on `log`."""
    path = F.target_shape(target)[0]
    t0 = time.perf_counter()
    f32, f16 = F.dequantized(path, "f32"), F.dequantized(path, "f16")
    tokens = F.tokenize(path, TEXT)
    print(f"dequantized copies and tokens: {time.perf_counter() - t0:.1f} s", file=log)
    runs = {}
    for name, fn in (("llama-q", lambda: F.llama_run(path, layers, tokens, logits=True, n_threads=n_threads)),
                     ("llama-f32", lambda: F.llama_run(f32, layers, tokens, logits=True, n_threads=n_threads)),
                     ("llama-f32-exact", lambda: F.llama_run(f32, layers, tokens, logits=True, n_threads=n_threads,
                                                             **EXACT)),
                     ("llama-f16", lambda: F.llama_run(f16, layers, tokens, logits=True, n_threads=n_threads)),
                     ("hf-q", lambda: F.transformers_run(path, layers, tokens, logits=True))):
        t = time.perf_counter()
        runs[name] = fn()
        print(f"{name}: {time.perf_counter() - t:.1f} s", file=log)
    return runs, tokens


def table(runs, layers) -> str:
    """The pairs, the NMSE table over every row, the same without position 0, then the logits'
    top-1 agreement."""
    lines = [f"{key} {label}" for key, label, _, _ in PAIRS] + [""]
    for title, rows in (("every position", slice(None)), ("positions 1.. (without the first token)", slice(1, None))):
        lines += [f"NMSE per layer input, {title}:", "",
                  "| layer | " + " | ".join(p[0] for p in PAIRS) + " |", "|---:|" + "---:|" * len(PAIRS)]
        errs = [F.nmse(runs[a][0][rows], runs[b][0][rows]) for _, _, a, b in PAIRS]
        for k, il in enumerate(layers):
            lines.append(f"| {il} | " + " | ".join(f"{e[k]:.2e}" for e in errs) + " |")
        lines.append("")
    n = len(runs["hf-q"][1])
    lines += ["top-1 agreement of the final logits:", "", "| " + " | ".join(p[0] for p in PAIRS) + " |",
              "|" + "---:|" * len(PAIRS),
              "| " + " | ".join(f"{round(F.top1_agreement(runs[a][1], runs[b][1]) * n)} / {n}"
                               for _, _, a, b in PAIRS) + " |"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2", help="a target GGUF, or a name graphgen knows (default: smollm2)")
    ap.add_argument("--layers", default="all", help="comma-separated layer inputs, or all (default: all)")
    ap.add_argument("--threads", type=int, default=1,
                    help="llama.cpp's threads (default: 1; the values do not depend on it)")
    args = ap.parse_args(argv)
    try:
        path, _, n_layer, _, _ = F.target_shape(args.target)
        layers = _layers(args.layers, n_layer)
        t = time.perf_counter()
        runs, tokens = measure(path, layers, args.threads)
    except (FileNotFoundError, F.FeaturesError) as e:
        print(f"target_numerics: {e}", file=sys.stderr)
        return 2
    print(f"{len(tokens)} tokens, {len(layers)} layers, {path.name}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
    print(table(runs, layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
