"""`graphgen view`, `graphgen trace` and `graphgen import`, and the loading of eval-callback text,
ggml dot files and GGML_SCHED_DEBUG logs (structure, and eval-callback's printed values) that
`view` and `diff` share."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..dump.format import Dump, DumpError, load_dump, load_dump_dir

VIEW_FORMATS = ("dot", "svg", "html", "explorer")


def is_dump_file(path: Path) -> bool:
    """A graphgen dump, told from other JSON by its "format" key near the top (no full parse)."""
    if path.suffix != ".json":
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(200)
    except OSError:
        return False
    return '"format"' in head


def load_any(path: str | Path) -> list[Dump]:
    """Dumps from a dump file, a dump folder, or an importable log / dot file."""
    from ..compare.importers import import_file
    path = Path(path)
    if not path.exists():
        raise DumpError(f"{path}: no such file or folder")
    if path.is_dir():
        return load_dump_dir(path)
    if is_dump_file(path):
        return [load_dump(path)]
    if path.suffix == ".json":  # no importer reads JSON: this is some other JSON file
        raise DumpError(f"{path}: not a graphgen dump (no \"format\": \"graphgen-dump/1\" key)")
    return import_file(path)


def _pick(dumps: list[Dump], graph: str | None) -> list[Dump]:
    if graph is None:
        return dumps
    hits = [d for k, d in enumerate(dumps)
            if graph in (str(k), f"{k:02d}", d.graph, d.path.stem) or (d.seq is not None and graph == str(d.seq))]
    if not hits:
        raise DumpError(f"no graph {graph!r} (have {', '.join(d.path.stem for d in dumps)})")
    return hits


# ---- view -------------------------------------------------------------------------------------

def _render_one(args, ref: Dump, ours: Dump | None) -> tuple[str, str | bytes | None]:
    """(extension, content) for dot/svg/html; explorer writes files itself and returns None."""
    from ..view import dot as D
    from ..view import graph as V
    from ..view.html import page_title
    fmt = args.format
    res = _diff(args, ref, ours)
    if fmt == "html":
        from ..view.html import to_html
        return "html", to_html(ref, ours, res)
    if fmt in ("dot", "svg"):
        title = page_title(ref, ours)
        whole = args.layer is None and args.around is None
        if whole and (args.overview or len(ref.nodes) > D.FULL_LIMIT):
            text = D.overview_dot(ref.nodes, title)
        else:
            g = V.from_dump(ref, leaves=not args.no_leaves)
            status, first = None, None
            if res is not None:
                from ..view.diffmap import diff_map
                dm = diff_map(res, ref, ours)
                status = {i: (r.status, r.nmse) for i, r in dm.ref_status.items()}
                first = dm.first.ref if dm.first is not None else None
            if args.layer is not None:
                il = None if args.layer == "global" else int(args.layer)
                if il not in V.layers(g):
                    raise DumpError(f"no layer {args.layer} in {ref.path.name} (layers: "
                                    f"{', '.join(V.layer_label(x) for x in V.layers(g))})")
                g = V.layer_subgraph(g, il)
            if args.around is not None:
                try:
                    g = V.around(g, args.around, args.depth)
                except KeyError as e:
                    raise DumpError(f"{ref.path.name}: {e.args[0]}") from None
            text = D.to_dot(g, title, status, first)
        if fmt == "svg":
            try:
                return "svg", D.render_svg(text)
            except D.ViewError as e:
                raise RuntimeError(str(e)) from None
        return "dot", text
    raise ValueError(f"unknown format {fmt!r}")


def _diff(args, ref: Dump, ours: Dump | None):
    """The diff a two-dump view shows, with the equivalence rules of --rules as `diff` applies them."""
    if ours is None:
        return None
    from ..compare.diff import diff_dumps
    if not getattr(args, "local", False):
        return diff_dumps(ref, ours, rules=args.rules_list)
    from ..compare.pairing import local_model
    return diff_dumps(ref, ours, rules=args.rules_list, local=True,
                      model=local_model(ours, getattr(args, "weights", None)))


def _cmd_view(args) -> int:
    from ..compare.rules import RulesError, load_rules
    if args.rules and not args.ours:
        raise ValueError("--rules needs two dumps (view REF OURS): rules explain differences between them")
    if (args.local or args.weights) and not args.ours:
        raise ValueError("--local needs two dumps (view REF OURS): a node's own error is against the other's values")
    if args.weights and not args.local:
        raise ValueError("--weights is read only with --local")
    try:
        args.rules_list = load_rules(args.rules) if args.rules else []
    except RulesError as e:
        raise ValueError(" ".join(str(e).split())) from None
    refs = _pick(load_any(args.dump), args.graph)
    ours_list = _pick(load_any(args.ours), args.graph) if args.ours else None
    if ours_list is not None:
        refs, ours_list = align_imports(refs, ours_list)
        if len(ours_list) != len(refs):
            raise DumpError(f"{args.dump} has {len(refs)} graphs, {args.ours} has {len(ours_list)}; "
                            "pick one with --graph")
    pairs = list(zip(refs, ours_list or [None] * len(refs)))
    from ..staging import refuse_to_replace, staged_files
    if args.format == "explorer":
        from ..view.explorer import export_docs, is_export_file
        out = Path(args.out or "model-explorer")
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: exists and is not a folder (explorer writes a folder of JSON files)")
        docs = {name: doc for r, o in pairs for name, doc in export_docs(r, o, _diff(args, r, o)).items()}
        for name in docs:
            refuse_to_replace(out / name, is_export_file, "a Model Explorer file graphgen view wrote", args.force)
        _write_all({out / name: json.dumps(doc) for name, doc in docs.items()}, staged_files)
        return 0
    if args.out is None and len(pairs) == 1 and args.format in ("dot", "svg"):
        _, content = _render_one(args, *pairs[0])
        sys.stdout.write(content)
        return 0
    if args.out is None:
        raise ValueError(f"--out is needed for --format {args.format}"
                         + (" with several graphs" if len(pairs) > 1 else ""))
    out = Path(args.out)
    ext = args.format
    index = None
    if len(pairs) == 1 and not out.is_dir():
        targets = [out]
    elif out.suffix == f".{ext}" and not out.is_dir():
        if ext != "html":
            raise ValueError(f"--out {out} names one .{ext} file and there are {len(pairs)} graphs: give a "
                             "folder, or pick one with --graph")
        # --out diff.html with several graphs: diff.html links diff-00-inject.html, diff-01-block.html
        targets = [out.with_name(f"{out.stem}-{r.path.stem}.{ext}") for r, _ in pairs]
        index = out
    else:
        targets = [out / f"{r.path.stem}.{ext}" for r, _ in pairs]
    for t in targets + ([index] if index else []):
        refuse_to_replace(t, _view_wrote, "a page graphgen view wrote", args.force)
    pages = {t: _marked(ext, _render_one(args, r, o)[1]) for t, (r, o) in zip(targets, pairs)}
    if index is not None:
        pages[index] = _marked("html", _index_page(out.stem, [(t.name, _title(r, o)) for t, (r, o) in
                                                               zip(targets, pairs)]))
    _write_all(pages, staged_files)
    return 0


# what marks a file as view's own, so that a later view may replace it without --force
_MARK = "graphgen view"


def _marked(ext: str, content: str) -> str:
    if ext == "dot":
        return f"// {_MARK}\n{content}"
    first, nl, rest = content.partition("\n")
    if first.startswith(("<?xml", "<!DOCTYPE", "<!doctype")):  # a comment may only follow these
        return f"{first}\n<!-- {_MARK} -->\n{rest}"
    return f"<!-- {_MARK} -->\n{content}"


def _view_wrote(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return _MARK in f.read(512)
    except OSError:
        return False


def _title(ref: Dump, ours: Dump | None) -> str:
    from ..view.html import page_title
    return page_title(ref, ours)


def _index_page(title: str, entries: list[tuple[str, str]]) -> str:
    """A page linking the per-graph pages (file name, title)."""
    from html import escape
    from urllib.parse import quote
    items = "\n".join(f'<li><a href="{quote(name)}">{escape(name)}</a>: {escape(text)}</li>' for name, text in entries)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title></head>\n'
            f"<body><h1>{escape(title)}</h1><p>{len(entries)} graphs, one page each:</p>\n<ul>\n{items}\n</ul>"
            "</body></html>\n")


def _write_all(files: dict, staged_files) -> None:
    """Every file, or none: they appear together once all are written; then their names."""
    paths = list(files)
    with staged_files(paths) as tmps:
        for tmp, content in zip(tmps, files.values()):
            tmp.write_text(content)
    for p in paths:
        print(p)


def align_imports(refs: list[Dump], ours: list[Dump]) -> tuple[list[Dump], list[Dump]]:
    """Project a full side onto what an imported side knows, so the two compare like for like."""
    from ..compare.importers import import_format, project
    fr = import_format(refs[0]) if refs else None
    fo = import_format(ours[0]) if ours else None
    if fo and not fr:
        refs = [project(d, fo) for d in refs]
    elif fr and not fo:
        ours = [project(d, fr) for d in ours]
    elif fr and fo and fr != fo:
        raise DumpError(f"cannot compare a {fr} import with a {fo} import")
    return refs, ours


# ---- trace / import ---------------------------------------------------------------------------

def _cmd_trace(args) -> int:
    import re

    from ..view.trace import run_trace
    from .kvtypes import apply_to_scenario
    from .llamaflags import backend_of, model_path, scenario_from_args
    for p in args.filter or []:
        try:
            re.compile(p)
        except re.error as e:
            raise ValueError(f"bad --filter regex {p!r}: {e}") from None
    from ..speculative.targets import resolve_draft
    # a file, a folder holding draft.gguf, or a shipped draft's name
    model = args.model = str(resolve_draft(model_path(args)))
    args.backend = backend_of(args.backend)
    sc = scenario_from_args(args, model)
    apply_to_scenario(args, sc)
    if args.dump is None:
        return run_trace(args.model, sc, sys.stdout, args.filter, args.abort_on_nan, None, args.backend,
                         as_json=args.json)
    from ..staging import abandon, staged_dump_dir
    with staged_dump_dir(args.dump) as tmp:
        rc = run_trace(args.model, sc, sys.stdout, args.filter, args.abort_on_nan, tmp, args.backend,
                       as_json=args.json)
        if rc != 0:  # stopped at a NaN: the graphs after it were never dumped
            abandon(tmp)
    return rc


def _cmd_import(args) -> int:
    from ..compare.importers import import_file, write_imported
    from ..staging import staged_dump_dir
    dumps = import_file(args.file, args.format, args.graph)
    with staged_dump_dir(args.out) as tmp:
        paths = [Path(args.out) / p.name for p in write_imported(dumps, tmp)]
    for p, d in zip(paths, dumps):
        imp = d.source["import"]
        fields = ", ".join(f for f in imp["fields"] if f != "backend")
        values = ("printed values of " + str(len(imp["printed"])) + " nodes" if imp.get("printed")
                  else "no values")
        print(f"{p}: {d.graph}, {len(d.nodes)} nodes ({imp['format']}: {fields}; {values})")
    return 0


def register(sub) -> None:
    from ..compare.importers import FORMATS
    p = sub.add_parser("view", help="draw a dump (DOT, SVG, HTML, Model Explorer); two dumps: their diff")
    p.add_argument("dump", help="dump file or folder (or an eval-callback / dot / sched-debug file)")
    p.add_argument("ours", nargs="?", help="a second dump: show the diff of DUMP (ref) and this")
    p.add_argument("--format", choices=VIEW_FORMATS, default="html")
    p.add_argument("--local", action="store_true",
                   help="with two dumps: also each node's own error (a strip on its left edge and a row of its "
                        "details), every node of OURS re-run alone on DUMP's values, as diff --local")
    p.add_argument("--weights", metavar="GGUF", default=None,
                   help="with --local: the model OURS ran (default: found by name and sha256 beside the dumps)")
    p.add_argument("--rules", metavar="FILE", default=None,
                   help="with two dumps: equivalence rules (JSON) that explain known structural differences, "
                        "as for diff")
    p.add_argument("--out", help="output file (dot/svg/html) or folder (several graphs, explorer) (default: "
                                 "stdout for one dot or svg graph, model-explorer/ for explorer)")
    p.add_argument("--graph", help="only this graph of a folder: NN, kind (inject/block/encoder) or file stem")
    p.add_argument("--layer", help="dot/svg: only this layer (N, or 'global' for nodes outside layers)")
    p.add_argument("--around", metavar="NAME", help="dot/svg: only nodes within --depth edges of NAME (or #index)")
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--overview", action="store_true", help="dot/svg: one box per layer")
    p.add_argument("--no-leaves", action="store_true", help="dot/svg: leave out weights and inputs")
    p.add_argument("--force", action="store_true",
                   help="replace files at --out that graphgen view did not write (default: refused)")
    p.set_defaults(fn=_cmd_view)

    from .kvtypes import add_kv_type_flags
    from .llamaflags import add_context_flags, add_device, add_model
    p = sub.add_parser("trace", help="run a scenario, printing every node as llama.cpp's eval-callback does")
    add_model(p)
    add_context_flags(p)
    add_kv_type_flags(p)
    p.add_argument("--filter", action="append", metavar="REGEX",
                   help="only nodes whose name matches (anchored at the start, as upstream); repeatable "
                        "(default: every node)")
    p.add_argument("--abort-on-nan", action="store_true", help="stop (exit 1) at the first node whose sum is NaN")
    p.add_argument("--dump", metavar="DIR", help="also write the graphs as dumps (default: none)")
    add_device(p)
    p.add_argument("--json", action="store_true",
                   help="one JSON object a node (JSON Lines: graph, name, op, type, ne, src, op_params, digest, "
                        "stats, first values) instead of the eval-callback text")
    p.set_defaults(fn=_cmd_trace)
    from .mmapflag import add_mmap_flag
    add_mmap_flag(p)  # --no-mmap

    p = sub.add_parser("import", help="convert eval-callback text, a ggml dot file or a GGML_SCHED_DEBUG log "
                                      "to a dump folder (structure; eval-callback text also its printed values)")
    p.add_argument("file", help="what to import: eval-callback text (llama-eval-callback's output), a "
                                "ggml_graph_dump_dot file or a GGML_SCHED_DEBUG=2 log")
    p.add_argument("--out", required=True, help="the dump folder to write (required)")
    p.add_argument("--format", choices=FORMATS, help="default: detected from the content")
    p.add_argument("--graph", choices=("inject", "block", "encoder"),
                   help="graph kind when the file does not say (default: guessed from node names)")
    p.set_defaults(fn=_cmd_import)
