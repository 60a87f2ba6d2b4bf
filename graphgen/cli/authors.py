"""The authors' side: `make-model --format hf`, `dump --engine torch` and `graphgen check`."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
from pathlib import Path

# GGUF-only make-model flags: the authors' configs have no field for them
_GGUF_ONLY = ("backbone", "joint", "wtype", "preset", "head_dim_given", "n_rot", "mrope_sections", "shared_kv",
              "sinks", "weight_scales", "post_norms", "out_scale", "rope_freqs", "rope_attn_factor", "attention_scale", "value_scale",
              "lilicorr_hidden",
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
    from ..authors.checkpoint import HF_VARIANTS
    from ..models.arch import HEADS
    if args.variant not in HF_VARIANTS:
        raise ValueError(f"--variant {args.variant}: the authors' packages have {', '.join(HF_VARIANTS)} "
                         "(no other head on PyPI)")
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
    if HEADS[args.variant].draft_vocab and args.d2t_vocab is None:
        # a draft vocabulary, as speculators trains them, so that the default DSpark carries its own
        # head and d2t (--d2t-vocab VOCAB: a full-vocabulary one, which borrows the target's head)
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
    yarn = {"beta_fast": args.yarn_beta_fast, "beta_slow": args.yarn_beta_slow,
            "attention_factor": args.yarn_attn_factor}
    if any(v is not None for v in yarn.values()):
        if args.rope_scaling != "yarn":
            raise ValueError("--yarn-beta-fast / --yarn-beta-slow / --yarn-attn-factor need --rope-scaling yarn")
        spec.rope_scaling.update({k: v for k, v in yarn.items() if v is not None})
    # the authors' names for the output and embedding settings (z-lab's dflash_config)
    for dest, field in (("logit_scale", "output_multiplier"), ("final_softcap", "final_logit_softcapping"),
                        ("embedding_scale", "input_embedding_scale")):
        if getattr(args, dest, None) is not None:
            setattr(spec, field, getattr(args, dest))
    if args.conf_markov is not None:
        spec.conf_with_markov = args.conf_markov == "true"
    if args.attention_bias:
        spec.attention_bias = True
    if args.hidden_act is not None:
        spec.hidden_act = args.hidden_act
    out = make_hf(args.out, spec, force=args.force)
    s = spec.resolved()
    from ..authors.checkpoint import label
    print(f"wrote {out}: {label(s.authors, s.variant)}, target in {out / 'target'}")
    return 0


def _cmd_dump_torch(args, sc) -> int:
    from ..authors.forward import AuthorsDraft, run_scenario_torch
    from ..dump.format import dump_files
    from ..staging import staged_dump_dir
    hf = Path(args.model)
    draft = AuthorsDraft(hf, args.target)   # checks the folder as every command does
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
    from ..dump.format import dump_files
    for folder in folders:
        for path in dump_files(folder):
            doc = json.loads(path.read_text())
            doc["source"]["converter"] = info
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(doc))
            tmp.replace(path)


def _cache_of(sc) -> str:
    """f32 or f16: the unit the arbiter's bands use for what the ggml side cached."""
    types = {sc.type_k, sc.type_v}
    if types == {"f32"}:
        return "f32"
    if types <= {"f32", "f16"}:
        return "f16"
    raise ValueError(f"the scenario caches {'/'.join(sorted(types))}: graphgen check arbitrates f32 and f16 "
                     "caches (compare quantized ones with graphgen diff --nmse)")


def _pair_problems(target: Path, draft: Path) -> list[str]:
    """check_pair's problems with the pair, but for the target's layer inputs: check hands the draft
    its features, and the target only lends its tables (as convert says of such targets)."""
    from ..speculative.pair import check_pair, target_info
    problems = check_pair(target, draft)
    try:
        lends_only = not target_info(target).publishes_layer_inputs
    except Exception:  # noqa: BLE001 - check_pair has named what is wrong with the file
        lends_only = False
    return [p for p in problems if not (lends_only and "publishes no layer inputs" in p)]


def _width_problem(ck, target: Path) -> str | None:
    """A draft made for another target, told from its config before anything is converted: the
    width of the embeddings it borrows."""
    from ..speculative.pair import target_info
    t = target_info(target)
    key = "transformer_layer_config.hidden_size" if ck.authors == "speculators" else "hidden_size"
    width = (ck.config.get("transformer_layer_config") or {}) if ck.authors == "speculators" else ck.config
    n_embd = width.get("hidden_size")
    if isinstance(n_embd, int) and n_embd != t.n_embd:
        return (f"{ck.path / 'config.json'}: key '{key}' = {n_embd}, the target {target.name} is {t.n_embd} wide "
                f"('{t.arch}.embedding_length'): the draft is not made for this target")
    return None


# speculators' classes cannot resolve a verifier named by its Hub id offline, and say so in a
# warning; with -m the target's GGUF stands in for the verifier
SPECULATORS_LOG = "speculators.models.utils"


@contextlib.contextmanager
def _quiet_logger(name: str):
    import logging
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _beside_gguf(ck, target_gguf: Path, target_dir, work: Path, say):
    """check -m: the draft converted alone (its vocabulary from the target's folder when there is
    one, else rebuilt from the GGUF), the pair checked, then the authors' model loaded with the
    GGUF's tables. Returns (the conversion, the authors' model in float32, in float64)."""
    from ..authors import AuthorsError
    from ..authors.convert import convert
    from ..authors.forward import AuthorsDraft
    from ..authors.gguf_target import staged_checkpoint, tables_folder, vocab_folder
    from ..errors import PairError
    hf = ck.path
    side = work / "from-target"  # what the authors' side reads of the GGUF: removed once read
    try:
        folder = Path(target_dir) if target_dir is not None else hf / "target"
        if target_dir is None and not folder.is_dir():
            say(f"rebuilding the vocabulary of {target_gguf.name} for llama.cpp's converter")
            folder = vocab_folder(target_gguf, side / "vocab")
        say(f"converting {hf} with llama.cpp's converter (the target {target_gguf.name} is used as it is)")
        with _quiet_logger(SPECULATORS_LOG):
            conv = convert(hf, work / "draft.gguf", target_dir=folder, force=True, warn=None)  # warnings: in the report
        problems = _pair_problems(target_gguf, work / "draft.gguf")
        if problems:
            raise PairError(problems)
        say(f"reading the target's embeddings and head from {target_gguf.name}")
        tables = tables_folder(target_gguf, side / "tables")
        # speculators reads its verifier's tables from the folder its config names: this one
        staged = staged_checkpoint(hf, side / "checkpoint", tables) if ck.authors == "speculators" else hf
        drafts = []
        for dtype in ("float32", "float64"):
            try:
                d = AuthorsDraft(staged, tables, dtype=dtype)
            except AuthorsError as e:  # named as the user gave them
                named = str(e).replace(str(staged), str(hf)).replace(str(tables), str(target_gguf))
                raise AuthorsError(named) from None
            d.hf_dir = hf
            drafts.append(d)
    finally:
        shutil.rmtree(side, ignore_errors=True)
    return conv, drafts[0], drafts[1]


def run_check(hf_dir, scenario_path=None, target=None, keep=None, f16=False, say=None, target_gguf=None,
              local=False) -> dict:
    """The triangle: llama.cpp's converter (the draft as it writes it, and its target folder), then
    the scenario in the authors' model (float32, and float64 as the arbiter), in llama.cpp b11739 and
    in graphgen, both beside the target's GGUF; each side's distance to the arbiter, and graphgen
    against llama.cpp.

    `target_gguf` (check -m: a GGUF path or a known target's name): the target's own GGUF, which
    b11739 and graphgen borrow from as it is and the authors' model reads its tables from; the target
    folder is then not converted (only the draft is; `target`, or HF_DIR/target where it exists,
    gives the converter the target's vocabulary, else it is rebuilt from the GGUF)."""
    from ..authors.arbiter import arbitrate
    from ..authors.compare import compare_paths
    from ..authors.convert import convert
    from ..authors.forward import AuthorsDraft, croppable, default_check_scenario, run_scenario_torch
    from ..authors.gguf_target import head_type
    from ..compare.pairing import diff_paths, load_side
    from ..compare.report import exit_code
    from ..play.engine import run_scenario
    from ..reference.runner import run_reference
    from ..play.scenario import parse_scenario, read_scenario_doc

    say = say or (lambda msg: None)
    hf = Path(hf_dir)
    if keep and Path(keep).exists() and (not Path(keep).is_dir() or any(Path(keep).iterdir())):
        raise ValueError(f"--keep {keep}: exists and is not an empty folder")
    if target_gguf is not None:
        from ..authors import AuthorsError, require_torch
        from ..authors.folder import inspect
        from ..authors.forward import _require_authors
        require_torch()
        with _quiet_logger(SPECULATORS_LOG):
            ck = inspect(hf)                # the folder, as every command checks it
        _require_authors(ck)
        tpath = _checked_target(target_gguf).resolve()
        bad = _width_problem(ck, tpath)
        if bad:
            raise AuthorsError(bad)
        draft = None
    else:
        draft = AuthorsDraft(hf, target)
    # the work folder becomes --keep DIR only once everything ran
    work = Path(tempfile.mkdtemp(prefix="graphgen-check-"))
    try:
        gguf, target_out = work / "draft.gguf", work / "target.gguf"
        lender = target_out if target_gguf is None else tpath   # the GGUF that lends the draft its tables
        if target_gguf is not None:
            conv, draft, arbiter = _beside_gguf(ck, tpath, target, work, say)
            target_arch = _target_arch(tpath)
        doc = (default_check_scenario(draft.block_size, draft.mask_token_id, f16) if scenario_path is None
               else read_scenario_doc(scenario_path))
        where = str(scenario_path) if scenario_path else "the default scenario"
        parse_scenario(doc, where=where)
        doc, cut = croppable(doc, draft)
        sc = parse_scenario(doc, where=where)
        cache = _cache_of(sc)
        scenario_path = work / "scenario.json"
        if target_gguf is None:
            say(f"converting {hf} and its target with llama.cpp's converter")
            # the draft as converted: what it lacks, b11739 and graphgen borrow from the target's GGUF
            conv = convert(hf, gguf, target_dir=target, target_gguf=target_out, force=True,
                           warn=None)  # warnings go in the report
            target_arch = conv.target_arch
        if conv.borrows:
            # a converted target named relative to the run's folder, so that kept dumps still find it
            doc = {**doc, "target": target_out.name if target_gguf is None else str(tpath)}
            sc = parse_scenario(doc, where=where)
            sc.features_base = str(work)
        scenario_path.write_text(json.dumps(doc, indent=1) + "\n")
        dirs = {k: work / k for k in ("torch", "arbiter", "llama.cpp", "graphgen")}
        max_data = _max_data(sc, draft.n_vocab)
        say("running llama.cpp b11739")
        # first: a draft or target it refuses is said before the authors' model runs. Its log goes
        # with the dumps when they are kept, else only into a failure's message
        run_reference(gguf, scenario_path, dirs["llama.cpp"], max_data,
                      **({"announce_dir": Path(keep) / "llama.cpp"} if keep else {"stderr_log": None}))
        say("running the authors' model")
        run_scenario_torch(hf, sc, dirs["torch"], scenario_path=scenario_path, draft=draft)
        say("running the authors' model in float64 (the arbiter)")
        run_scenario_torch(hf, sc, dirs["arbiter"], scenario_path=scenario_path,
                           draft=AuthorsDraft(hf, target, dtype="float64") if target_gguf is None else arbiter)
        say("running graphgen")
        run_scenario(gguf, sc, dirs["graphgen"], max_data=max_data, scenario_path=scenario_path)
        stamp_converter(dirs.values(), {"commit": conv.commit, "checkpoint": str(hf.resolve()),
                                        "warnings": conv.warnings,
                                        **({"target": str(tpath)} if target_gguf is not None else {})})
        vs_ref = compare_paths(dirs["torch"], dirs["llama.cpp"], band=1.0)
        vs_ours = compare_paths(dirs["torch"], dirs["graphgen"], band=1.0)
        # a borrowed head multiplies as the target stores it (check -m: quantized, perhaps)
        head = head_type(lender) if "output.weight" in conv.borrows else None
        arb = arbitrate(load_side(dirs["arbiter"]), load_side(dirs["torch"]),
                        compare_paths(dirs["arbiter"], dirs["llama.cpp"], band=1.0),
                        compare_paths(dirs["arbiter"], dirs["graphgen"], band=1.0), draft.n_layer, cache, head)
        graph = diff_paths(dirs["llama.cpp"], dirs["graphgen"], local=local, model=gguf if local else None)
        identical = exit_code(graph) == 0
        own = None
        if local:
            # each mapped node of llama.cpp's graph re-run alone on the authors' values
            from ..authors.compare import own_errors
            say("re-running llama.cpp's mapped nodes on the authors' values")
            own = own_errors(dirs["torch"], dirs["llama.cpp"], gguf, lenders=[lender] if lender.is_file() else [])
        if keep:
            Path(keep).parent.mkdir(parents=True, exist_ok=True)
            if Path(keep).is_dir():
                Path(keep).rmdir()
            shutil.move(str(work), str(keep))
        return {"hf_dir": str(hf), "class": draft.label, "converter": conv.commit,
                "converter_warnings": conv.warnings, "borrows": conv.borrows, "target_arch": target_arch,
                "target": str(tpath) if target_gguf is not None else None,
                "target_converted": target_gguf is None,
                "work": str(keep or work), "kept": bool(keep),
                "authors_vs_llama.cpp": vs_ref, "authors_vs_graphgen": vs_ours, "arbiter": arb,
                "graphgen_identical": identical, "graph_diff": graph, "scenario_cut": cut, "own_errors": own,
                "block_size": draft.block_size}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _max_data(sc, n_vocab: int) -> int:
    """Values a dump keeps per node: enough for the logits of the largest block over a real
    target's vocabulary (a DSpark's result_output is no graph output, kept only by size)."""
    rows = max((sum(len(b.tokens) for b in st.blocks) for st in sc.steps if st.kind == "block"), default=0)
    return max(262144, rows * n_vocab)


def _target_arch(path: Path) -> str:
    from ..speculative.pair import target_info
    return target_info(path).arch


def verdict(r: dict) -> tuple[int, str]:
    arb, same = r["arbiter"], r["graphgen_identical"]
    if not arb.compared:
        return 1, "NOT COMPARED: no mapped node had values on every side"
    if not same:
        return 1, "graphgen's graph departs from llama.cpp's (graph-diff not identical): graphgen is wrong"
    if arb.agree:
        return 0, ("AGREE: the authors' model, llama.cpp b11739 and graphgen compute the same draft "
                   "(each within its rounding of the float64 arbiter)")
    bad = arb.first_departure
    if bad is not None:
        where = (f"first at {bad.name} in {bad.graph}: " +
                 (f"{bad.e_llama:.3g} from exact, band {bad.band:.3g} (the authors' f32: "
                  f"{bad.e_authors:.3g})" if bad.e_llama is not None else "not compared"))
    else:
        where = "; ".join(arb.choices_depart() + arb.unmatched)
    return 1, ("DISAGREE: llama.cpp b11739 (and graphgen, identical to it) depart from the authors' model "
               f"beyond rounding: the converter's GGUF or llama.cpp's graph; {where}")


def _row(label: str, d) -> str:
    s = d.summary()
    w = s["worst"]
    worst = f"{w.rel_l2:.1e} ({w.name}, {w.graph.split(' / ')[0]})" if w is not None else "-"
    frac = lambda x: f"{x[0]}/{x[1]}" if x else "-"
    return f"  {label:22s} {s['mapped']:6d}  {worst:44s} {frac(s['argmax']):>7s}  {frac(s['path']):>7s}"


def _distances(d) -> dict:
    """An authors' comparison without its fixed-band verdict: in check, the arbiter judges."""
    return {k: v for k, v in d.to_dict().items()
            if k not in ("agree", "band_rel_l2", "band_rel_l2_nodes", "first_out_of_band")}


def _cmd_check(args) -> int:
    from .. import progress
    with progress.task(f"check {args.hf_dir}") as task:
        r = run_check(args.hf_dir, args.scenario, args.target, args.keep, f16=args.type_kv == "f16", say=task.update,
                      target_gguf=args.target_model, local=args.local)
    code, line = verdict(r)
    ref, ours, arb = r["authors_vs_llama.cpp"], r["authors_vs_graphgen"], r["arbiter"]
    if args.json:
        print(json.dumps({"verdict": line, "exit": code, "class": r["class"], "converter": r["converter"],
                          "converter_warnings": r["converter_warnings"], "borrows": r["borrows"],
                          "target_arch": r["target_arch"], "target": r["target"],
                          "target_converted": r["target_converted"], "scenario_cut": r["scenario_cut"],
                          "block_size": r["block_size"], "arbiter": arb.to_dict(),
                          "authors_vs_llama.cpp": _distances(ref), "authors_vs_graphgen": _distances(ours),
                          "graphgen_identical_to_llama.cpp": r["graphgen_identical"],
                          **({"own_errors": _own_json(r)} if args.local else {}),
                          "work": r["work"] if r["kept"] else None}, indent=1))
        return code
    print(f"{r['hf_dir']}: {r['class']}, converted by llama.cpp's converter {r['converter']}")
    for w in r["converter_warnings"]:
        print(f"  converter {w}")
    if r["borrows"]:
        beside = (f"{r['target_arch']} GGUF, converted too" if r["target_converted"] else
                  f"{r['target']}, {r['target_arch']}, as it is")
        print(f"  runs beside its target ({beside}), which lends {' and '.join(r['borrows'])}")
    if r["scenario_cut"]:
        print(f"  note: {r['scenario_cut']}")
    print(f"  {'':22s} {'mapped':>6s}  {'worst relative L2 to the authors f32':44s} {'argmax':>7s}  {'path':>7s}")
    print(_row("authors vs llama.cpp", ref))
    print(_row("authors vs graphgen", ours))
    n = len([g for g in r["graph_diff"] if not g.unpaired])
    print(f"  {'graphgen vs llama.cpp':22s} graph-diff over {n} graphs: "
          + ("IDENTICAL" if r["graphgen_identical"] else "DIFFERS"))
    for text in arb.lines():
        print(text)
    bad = arb.first_departure
    if bad is not None:
        print(f"  first node where llama.cpp departs: {bad.name} in {bad.graph}")
    if args.local:
        for line in _own_lines(r):
            print(line)
    if r["kept"]:
        print(f"  dumps and GGUFs kept in {r['work']}")
    print(line)
    return code


def _own_json(r: dict) -> dict:
    from ..compare.report import _json_row
    return {"authors_vs_llama.cpp": _json_row(r["own_errors"]),
            "graphgen_on_llama.cpp": [_json_row(g.local) for g in r["graph_diff"] if g.local is not None]}


def _own_lines(r: dict) -> list[str]:
    """check --local: the own errors, after the verdict's lines."""
    from ..compare.report import format_local
    own = r["own_errors"]
    out = [f"  own error of llama.cpp's mapped nodes on the authors' values: {own['rerun']} re-run, "
           f"{own['views']} views (nil), {own['skipped']} not re-run alone"]
    for row in sorted((x for x in own["rows"] if x["kind"] == "rerun"), key=lambda x: -(x["own_nmse"] or 0))[:8]:
        out.append(f"    {row['name']:28s} {row['op']:14s} own nmse {row['own_nmse']:.3g}  ({row['graph']})")
    for g in own["not_rerun"]:
        out.append(f"    not re-run alone ({g['count']}): {g['why']}: {', '.join(g['nodes'])}")
    for g in r["graph_diff"]:
        if g.local is not None:
            out += [f"  graphgen's {Path(g.ours_path).name} on llama.cpp's values:"] + [f"  {x}" for x in format_local(g.local)]
    return out


def register(sub) -> None:
    p = sub.add_parser("check", help="the authors' model vs llama.cpp vs graphgen on one checkpoint (needs graphgen[torch])")
    p.add_argument("hf_dir", metavar="HF_DIR", help="a draft checkpoint in its authors' format")
    p.add_argument("--scenario", default=None,
                   help="default: two drafting rounds at the draft's block size with an f32 cache (one round "
                        "for drafts with sliding-window layers, whose authors' cache cannot crop)")
    p.add_argument("-m", "--model", dest="target_model", metavar="TARGET", default=None,
                   help="the target's GGUF (or a known target: smollm2), used as it is by llama.cpp and graphgen, "
                        "its embeddings and head read by the authors' model: the target folder is not converted")
    p.add_argument("--target", default=None,
                   help="the target model's folder (default: HF_DIR/target); with -m, only its config and "
                        "tokenizer are read, for the draft's vocabulary (default with -m: HF_DIR/target where it "
                        "exists, else rebuilt from the GGUF)")
    p.add_argument("--type-kv", choices=("f32", "f16"), default="f32",
                   help="cache type of the default scenario (default f32)")
    p.add_argument("--keep", metavar="DIR", default=None,
                   help="keep the GGUFs (draft and target; with -m, the draft) and the dump folders in DIR")
    p.add_argument("--local", action="store_true",
                   help="also each node's own error: llama.cpp's mapped nodes re-run alone on the authors' values, "
                        "and graphgen's nodes on llama.cpp's (diff --local)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=_cmd_check)


def _checked_target(value) -> Path:
    """The target GGUF -m names (a file, or a known target such as smollm2, fetched once), checked as
    a target model GGUF with a token embedding to lend the draft."""
    from ..authors import AuthorsError
    from ..authors.gguf_target import EMBD
    from ..errors import GGUFModelError
    from ..speculative.pair import target_info
    from ..speculative.targets import resolve
    path = resolve(str(value))
    if not path.exists():
        raise AuthorsError(f"-m {value}: no such target GGUF file")
    if path.is_dir():
        raise AuthorsError(f"-m {value}: is a folder, not a target GGUF file (the folder form is --target DIR)")
    try:
        info = target_info(path)
    except GGUFModelError as e:
        raise AuthorsError(str(e)) from None
    if EMBD not in info.tensors:
        raise AuthorsError(f"{path}: no tensor '{EMBD}' to lend the draft")
    return path
