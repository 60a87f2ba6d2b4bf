#!/usr/bin/env python3
"""Regenerate tests/data/reference/<case>/ from llama.cpp b11739.

Each case folder holds case.json (the make-model arguments and the GGUF's sha256),
scenario.json and the reference dumps (NN-<graph>.json + .npz). The GGUF itself is not
committed: make-model rebuilds it bit for bit from case.json.

    python tools/make_references.py            # all cases
    python tools/make_references.py dflash-fa  # cases whose name contains the word
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphgen.play.scenario import default_scenario, parse_scenario  # noqa: E402
from graphgen.synth import make_model  # noqa: E402

REF_DIR = ROOT / "tests" / "data" / "reference"

BASE = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_ff": 128, "n_vocab": 256, "block_size": 4,
        "target_layers": [1, 2], "seed": 0}

# name: (make_model kwargs, scenario kwargs)
CASES = {
    "dflash-fa-off": ({"variant": "dflash"}, {}),
    "dflash-fa-on": ({"variant": "dflash"}, {"flash_attn": True}),
    "dflash-kvf32-fa-off": ({"variant": "dflash"}, {"type_kv": "f32"}),
    "dflash-kvf32-fa-on": ({"variant": "dflash"}, {"type_kv": "f32", "flash_attn": True}),
    "dflash-iswa-fa-off": ({"variant": "dflash", "n_layer": 3, "swa_window": 4,
                            "swa_pattern": [True, False, True]}, {}),
    "dflash-iswa-fa-on": ({"variant": "dflash", "n_layer": 3, "swa_window": 4,
                           "swa_pattern": [True, False, True]}, {"flash_attn": True}),
    "dflash-sharedkv-fa-off": ({"variant": "dflash", "shared_kv": True}, {}),
    "dflash-sharedkv-fa-on": ({"variant": "dflash", "shared_kv": True}, {"flash_attn": True}),
    "dflash-encoder": ({"variant": "dflash"}, {"encode": 5}),
    "dflash2-fa-off": ({"variant": "dflash2"}, {}),
    "dflash2-fa-on": ({"variant": "dflash2"}, {"flash_attn": True}),
    "dspark-fa-off": ({"variant": "dspark"}, {}),
    "dspark-fa-on": ({"variant": "dspark"}, {"flash_attn": True}),
    "dspark-conf-fa-off": ({"variant": "dspark", "conf": True}, {}),
    "dspark-conf-fa-on": ({"variant": "dspark", "conf": True}, {"flash_attn": True}),
    "dflash2-top1-block2": ({"variant": "dflash2", "block_size": 2, "selector_top_k": 1}, {}),
    "dspark-d2t": ({"variant": "dspark", "conf": True, "d2t_vocab": 200}, {}),
    "dspark-bonus-anchor": ({"variant": "dspark", "conf": True, "sample_from_anchor": False}, {}),
    "lilicorr-1slot": ({"variant": "lilicorr", "block_size": 2, "lilicorr_top_k": 1}, {}),
    "lilicorr-fa-off": ({"variant": "lilicorr"}, {}),
    "lilicorr-fa-on": ({"variant": "lilicorr"}, {"flash_attn": True}),
    # quantized KV caches: heads of 64, so the Hadamard rotations apply (a quantized V needs FA)
    "dflash-q8-fa-on": ({"variant": "dflash", "n_embd": 128, "n_head": 2}, {"type_kv": "q8_0", "flash_attn": True}),
    "dflash-q4k-fa-off": ({"variant": "dflash", "n_embd": 128, "n_head": 2}, {"type_k": "q4_0"}),
    "dflash-iswa-kq5v8-fa-on": ({"variant": "dflash", "n_embd": 128, "n_head": 2, "n_layer": 3, "swa_window": 4,
                                 "swa_pattern": [True, False, True]},
                                {"type_k": "q5_1", "type_v": "q8_0", "flash_attn": True}),
    "dsv4-q8-fa-on": ({"variant": "dspark", "backbone": "dsv4", "head_dim": 64, "n_rot": 16},
                      {"type_kv": "q8_0", "flash_attn": True}),
    # the DeepSeek-V4 DSpark backbone (graph_dsv4)
    "dsv4-fa-off": ({"variant": "dspark", "backbone": "dsv4"}, {}),
    "dsv4-fa-on": ({"variant": "dspark", "backbone": "dsv4"}, {"flash_attn": True}),
}


def model_kwargs(case: dict) -> dict:
    return {**BASE, **case}


def build_model(case_dir: Path, dest: Path) -> Path:
    """Rebuild a case's GGUF from case.json and check it is the one the references were made with."""
    spec = json.loads((case_dir / "case.json").read_text())
    kw = dict(spec["make_model"])
    variant = kw.pop("variant")
    path = dest / f"{case_dir.name}.gguf"
    make_model(path, variant, **kw)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != spec["sha256"]:
        raise RuntimeError(f"{case_dir.name}: make-model wrote a different GGUF than the reference's "
                           f"({digest[:12]} != {spec['sha256'][:12]}); regenerate the references")
    return path


def make_case(name: str, tmp: Path) -> str:
    from graphgen.reference.runner import run_reference

    mk, sc_kw = CASES[name]
    kw = model_kwargs(mk)
    variant = kw.pop("variant")
    gguf = tmp / f"{name}.gguf"
    make_model(gguf, variant, **kw)
    sc_kw = dict(sc_kw)
    n_encode = sc_kw.pop("encode", 0)
    sc = default_scenario(block_size=kw["block_size"], mask_token=kw["n_vocab"] - 1, **sc_kw)
    if n_encode:  # the encoder graph (LLAMA_PROCESS_TYPE_ENCODE) before the usual inject + block
        doc = sc.to_dict()
        doc["steps"].insert(0, {"encode": {"n_tokens": n_encode, "pos0": 0}})
        sc = parse_scenario(doc)
    out = REF_DIR / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "case.json").write_text(json.dumps({
        "make_model": {"variant": variant, **kw},
        "command": "graphgen make-model MODEL.gguf " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in {"variant": variant, **mk}.items() if k != "variant"),
        "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
    }, indent=1) + "\n")
    (out / "scenario.json").write_text(json.dumps(sc.to_dict(), indent=1) + "\n")
    paths = run_reference(gguf, out / "scenario.json", out, stderr_log=None)
    counts = []
    for p in paths:
        doc = json.loads(Path(p).read_text())
        counts.append(f"{doc['graph']} {len(doc['nodes'])}")
    return ", ".join(counts)


def main(argv) -> int:
    names = [n for n in CASES if not argv or any(a in n for a in argv)]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                print(f"{name}: {make_case(name, Path(tmp))}", flush=True)
            except Exception as e:  # a reference crash is "no reference", reported per case
                print(f"{name}: FAILED: {e}", flush=True)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
