"""The authors' side: `make-model --format hf`, `dump --engine torch` and `graphgen check`."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

# GGUF-only make-model flags: the authors' configs have no field for them
_GGUF_ONLY = ("backbone", "joint", "wtype", "preset", "head_dim_given", "n_rot", "mrope_sections", "shared_kv",
              "sinks", "weight_scales", "post_norms", "out_scale", "rope_freqs", "rope_attn_factor", "attention_scale", "value_scale",
              "embedding_scale", "logit_scale", "final_softcap", "hidden_act", "lilicorr_hidden",
              "lilicorr_top_k", "lilicorr_heads", "lilicorr_layers", "lilicorr_eps", "lilicorr_logit_scale",
              "lilicorr_factor", "lilicorr_mlp", "lilicorr_conv")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def make_hf_from_args(args: argparse.Namespace) -> int:
    from ..authors.checkpoint import HFSpec, make_hf
    given = [d for d in _GGUF_ONLY if getattr(args, d, None) not in (None, False)
             and not (d == "backbone" and args.backbone == "base") and not (d == "wtype" and args.wtype == "f32")]
    if given:
        raise ValueError(f"{_flag(given[0])} has no counterpart in the authors' checkpoint formats "
                         "(--format hf takes the size, attention, DFlash2 and DSpark flags)")
    if args.variant not in ("dflash", "dflash2", "dspark"):
        raise ValueError(f"--variant {args.variant}: the authors' packages have DFlash, DFlash2 and DSpark "
                         "(no LiliCorr on PyPI)")
    spec = HFSpec(variant=args.variant, authors=args.authors, seed=args.seed, rope_theta=args.rope_freq_base,
                  rms_eps=args.rms_eps, conf=args.conf)
    for dest, field in (("n_embd", "n_embd"), ("layers", "n_layer"), ("heads", "n_head"), ("heads_kv", "n_head_kv"),
                        ("head_dim", "head_dim"), ("n_ff", "n_ff"), ("vocab", "n_vocab"),
                        ("block_size", "block_size"), ("target_layers", "target_layers"),
                        ("swa_window", "swa_window"), ("swa_pattern", "swa_pattern"), ("d2t_vocab", "d2t_vocab"),
                        ("selector_rank", "selector_rank"), ("selector_top_k", "selector_top_k"),
                        ("conv_kernel", "conv_kernel"), ("conv_group", "conv_group"), ("markov_rank", "markov_rank")):
        v = getattr(args, dest, None)
        if v is not None:
            setattr(spec, field, v)
    if args.variant == "dspark" and args.d2t_vocab is None:
        # llama.cpp's converter drops a full-vocabulary DSpark's head (graphgen convert refuses it):
        # a draft vocabulary, as speculators trains them, is what converts
        spec.d2t_vocab = spec.n_vocab * 3 // 4
    if args.heads is not None and args.heads_kv is None:
        spec.n_head_kv = args.heads
    if args.head_dim is None and (args.n_embd is not None or args.heads is not None):
        spec.head_dim = spec.n_embd // spec.n_head
    if args.causal:
        spec.causal = True
    if args.rope_scaling not in (None, "none"):
        if args.rope_scaling == "longrope":
            raise ValueError("--rope-scaling longrope: its factors are no field of the authors' configs here")
        spec.rope_scaling = {"rope_type": args.rope_scaling, "factor": args.rope_scaling_factor or 2.0}
        if args.rope_scaling == "yarn":
            spec.rope_scaling["original_max_position_embeddings"] = args.rope_orig_ctx or 1024
    if args.sample_from_anchor is not None:
        spec.sample_from_anchor = args.sample_from_anchor == "true"
    out = make_hf(args.out, spec, force=args.force)
    s = spec.resolved()
    print(f"wrote {out}: {s.authors} {s.class_name} ({s.variant}), target in {out / 'target'}")
    return 0


def _cmd_dump_torch(args, sc) -> int:
    from ..authors.forward import AuthorsDraft, run_scenario_torch
    from ..dump import dump_files
    from ..staging import staged_dump_dir
    hf = Path(args.model)
    if not hf.is_dir():
        raise ValueError(f"{hf}: --engine torch takes a checkpoint folder (config.json and safetensors)")
    draft = AuthorsDraft(hf, args.target)
    out = Path(args.out)
    with staged_dump_dir(out) as tmp:
        run_scenario_torch(hf, sc, tmp, scenario_path=args.scenario, draft=draft)
        names = [p.name for p in dump_files(tmp)]
    for p in (out / n for n in names):
        doc = json.loads(p.read_text())
        print(f"{p}: {doc['graph']}, {len(doc['nodes'])} mapped nodes (torch)")
    return 0


def stamp_converter(folders, info: dict) -> None:
    """Record in each dump's source which converter made the GGUF they ran (and from what)."""
    from ..dump import dump_files
    for folder in folders:
        for path in dump_files(folder):
            doc = json.loads(path.read_text())
            doc["source"]["converter"] = info
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(doc))
            tmp.replace(path)


def default_check_scenario(block_size: int, mask_token_id: int, f16: bool = False) -> dict:
    """Two drafting rounds: inject 5 rows, a block, drop it, inject 3 accepted rows, a block again."""
    block = [7] + [mask_token_id] * (block_size - 1)
    return {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "off", "type_kv": "f16" if f16 else "f32", "seed": 1,
            "steps": [{"inject": {"n_tokens": 5, "pos0": 0}},
                      {"block": {"tokens": block, "pos0": 5}},
                      {"seq_rm": {"seq": 0, "p0": 5, "p1": -1}},
                      {"inject": {"n_tokens": 3, "pos0": 5}},
                      {"block": {"tokens": [11] + block[1:], "pos0": 8}}]}


def run_check(hf_dir, scenario_path=None, target=None, keep=None, f16=False, say=None) -> dict:
    """The triangle: llama.cpp's converter, then the scenario in the authors' model, in llama.cpp
    b11739 and in graphgen; the authors' model against each, and graphgen against llama.cpp."""
    from ..authors.compare import compare_paths
    from ..authors.convert import convert
    from ..authors.forward import AuthorsDraft, run_scenario_torch
    from ..diff import diff_paths, exit_code
    from ..engine import run_scenario
    from ..reference.runner import run_reference
    from ..scenario import load_scenario, parse_scenario

    say = say or (lambda msg: None)
    hf = Path(hf_dir)
    if keep and Path(keep).exists() and (not Path(keep).is_dir() or any(Path(keep).iterdir())):
        raise ValueError(f"--keep {keep}: exists and is not an empty folder")
    draft = AuthorsDraft(hf, target)
    # the work folder becomes --keep DIR only once everything ran
    work = Path(tempfile.mkdtemp(prefix="graphgen-check-"))
    try:
        if scenario_path is None:
            doc = default_check_scenario(min(draft.block_size, 8), draft.mask_token_id, f16)
            scenario_path = work / "scenario.json"
            scenario_path.write_text(json.dumps(doc, indent=1) + "\n")
            sc = parse_scenario(doc)
        else:
            sc = load_scenario(scenario_path)
        gguf = work / "draft.gguf"
        say(f"converting {hf} with llama.cpp's converter")
        conv = convert(hf, gguf, target_dir=target, force=True, warn=None)  # warnings go in the report
        dirs = {k: work / k for k in ("torch", "llama.cpp", "graphgen")}
        say("running the authors' model")
        run_scenario_torch(hf, sc, dirs["torch"], scenario_path=scenario_path, draft=draft)
        say("running llama.cpp b11739")
        # llama.cpp's log goes with the dumps when they are kept, else only into a failure's message
        run_reference(gguf, scenario_path, dirs["llama.cpp"], 262144,
                      **({"announce_dir": Path(keep) / "llama.cpp"} if keep else {"stderr_log": None}))
        say("running graphgen")
        run_scenario(gguf, sc, dirs["graphgen"], scenario_path=scenario_path)
        stamp_converter(dirs.values(), {"commit": conv.commit, "checkpoint": str(hf.resolve()),
                                        "warnings": conv.warnings})
        vs_ref = compare_paths(dirs["torch"], dirs["llama.cpp"])
        vs_ours = compare_paths(dirs["torch"], dirs["graphgen"])
        graph = diff_paths(dirs["llama.cpp"], dirs["graphgen"])
        identical = exit_code(graph) == 0
        if keep:
            Path(keep).parent.mkdir(parents=True, exist_ok=True)
            if Path(keep).is_dir():
                Path(keep).rmdir()
            shutil.move(str(work), str(keep))
        return {"hf_dir": str(hf), "class": f"{draft.package} {draft.class_name}", "converter": conv.commit,
                "converter_warnings": conv.warnings, "work": str(keep or work), "kept": bool(keep),
                "authors_vs_llama.cpp": vs_ref, "authors_vs_graphgen": vs_ours, "graphgen_identical": identical,
                "graph_diff": graph}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def verdict(r: dict) -> tuple[int, str]:
    ref, ours, same = r["authors_vs_llama.cpp"], r["authors_vs_graphgen"], r["graphgen_identical"]
    if not ref.compared or not ours.compared:
        return 1, "NOT COMPARED: no mapped node had values on both sides"
    if not same:
        return 1, "graphgen's graph departs from llama.cpp's (graph-diff not identical): graphgen is wrong"
    if ref.agree and ours.agree:
        return 0, "AGREE: the authors' model, llama.cpp b11739 and graphgen compute the same draft"
    bad = ref.first_bad
    where = (f"first mapped node out of band: {bad.name} in {bad.graph}"
             + (f" (relative L2 {bad.rel_l2:.3g})" if bad and bad.rel_l2 is not None else "")) if bad else \
        "argmax or selector path differs"
    return 1, ("DISAGREE: llama.cpp b11739 (and graphgen, identical to it) depart from the authors' model: "
               f"the converter's GGUF or llama.cpp's graph; {where}")


def _row(label: str, d) -> str:
    s = d.summary()
    w = s["worst"]
    worst = f"{w.rel_l2:.1e} ({w.name}, {w.graph.split(' / ')[0]})" if w is not None else "-"
    frac = lambda x: f"{x[0]}/{x[1]}" if x else "-"
    return f"  {label:22s} {s['mapped']:6d}  {worst:44s} {frac(s['argmax']):>7s}  {frac(s['path']):>7s}  {s['verdict']}"


def _cmd_check(args) -> int:
    from .. import progress
    with progress.task(f"check {args.hf_dir}") as task:
        r = run_check(args.hf_dir, args.scenario, args.target, args.keep, f16=args.type_kv == "f16", say=task.update)
    code, line = verdict(r)
    ref, ours = r["authors_vs_llama.cpp"], r["authors_vs_graphgen"]
    if args.json:
        print(json.dumps({"verdict": line, "exit": code, "class": r["class"], "converter": r["converter"],
                          "converter_warnings": r["converter_warnings"],
                          "authors_vs_llama.cpp": ref.to_dict(), "authors_vs_graphgen": ours.to_dict(),
                          "graphgen_identical_to_llama.cpp": r["graphgen_identical"],
                          "work": r["work"] if r["kept"] else None}, indent=1))
        return code
    print(f"{r['hf_dir']}: {r['class']}, converted by llama.cpp's converter {r['converter']}")
    for w in r["converter_warnings"]:
        print(f"  converter {w}")
    print(f"  band: relative L2 < {ref.band:g} on the logits, < {ref.node_band:.3g} on the other mapped nodes")
    print(f"  {'':22s} {'mapped':>6s}  {'worst relative L2':44s} {'argmax':>7s}  {'path':>7s}  verdict")
    print(_row("authors vs llama.cpp", ref))
    print(_row("authors vs graphgen", ours))
    n = len([g for g in r["graph_diff"] if not g.unpaired])
    print(f"  {'graphgen vs llama.cpp':22s} graph-diff over {n} graphs: "
          + ("IDENTICAL" if r["graphgen_identical"] else "DIFFERS"))
    kinds = ref.worst_by_kind()
    if kinds:
        print("  worst relative L2 by node (authors vs llama.cpp): "
              + ", ".join(f"{k} {v:.1e}" for k, v in kinds.items()))
    bad = ref.first_bad or ours.first_bad
    if bad is not None:
        print(f"  first mapped node out of band: {bad.name} in {bad.graph}"
              + (f": relative L2 {bad.rel_l2:.3g}" if bad.rel_l2 is not None else f": {bad.status}")
              + (f" ({bad.detail})" if bad.detail else ""))
    if r["kept"]:
        print(f"  dumps and GGUF kept in {r['work']}")
    print(line)
    return code


def register(sub) -> None:
    p = sub.add_parser("check", help="the authors' model vs llama.cpp vs graphgen on one checkpoint (needs graphgen[torch])")
    p.add_argument("hf_dir", metavar="HF_DIR", help="a draft checkpoint in its authors' format")
    p.add_argument("--scenario", default=None, help="default: two drafting rounds with an f32 cache")
    p.add_argument("--target", default=None, help="the target model's folder (default: HF_DIR/target)")
    p.add_argument("--type-kv", choices=("f32", "f16"), default="f32",
                   help="cache type of the default scenario (default f32)")
    p.add_argument("--keep", metavar="DIR", default=None, help="keep the GGUF and the three dump folders in DIR")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=_cmd_check)
