"""Two sides of a graph-diff (dump folders, dump files, or llama.cpp's debug outputs read by the
importers) loaded, their graphs paired by kind and step, and each pair diffed (`diff_paths`)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Sequence

from ..dump.format import Dump, DumpError, dump_files, load_dump
from .importers import import_file
from .nodefilter import FilterError, NodeFilter
from .probe import ProbeError, Target
from .diff import diff_dumps
from .report import DiffResult
from .rules import load_rules


def _unpaired(dump: Dump, side: str, why: str) -> DiffResult:
    path = str(dump.path)
    return DiffResult(ref_path=path if side == "ref" else None, ours_path=path if side == "ours" else None,
                      graph=dump.graph, identical=False, unpaired=side, notes=[why])


def _is_dump_json(path: Path) -> bool:
    # told from other JSON by its "format" key near the top, without parsing the whole file
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return '"format"' in f.read(200)
    except OSError:
        return False


def load_side(path: str | os.PathLike) -> list[Dump]:
    """The graphs of one side of a diff: a dump folder, a dump file, or a file the importers read
    (eval-callback text, a ggml dot file, a GGML_SCHED_DEBUG log; structure only)."""
    path = Path(path)
    if not path.exists():
        raise DumpError(f"{path}: no such file or folder")
    if path.is_dir():
        return [load_dump(p) for p in dump_files(path)]
    if path.suffix == ".json":
        if not _is_dump_json(path):  # no importer reads JSON
            raise DumpError(f"{path}: not a graphgen dump (no \"format\": \"graphgen-dump/1\" key)")
        return [load_dump(path)]
    return import_file(path)


def _step_label(dumps: list[Dump]) -> list[tuple[str, int]]:
    """(kind, step) of each graph: its kind and its place among the graphs of that kind."""
    seen: Counter = Counter()
    out = []
    for d in dumps:
        out.append((d.graph, seen[d.graph]))
        seen[d.graph] += 1
    return out


def _describe_graph(d: Dump, kind_step: tuple[str, int]) -> str:
    return f"{d.path.name} ({kind_step[0]} #{kind_step[1]})"


def pair_graphs(refs: list[Dump], ours: list[Dump], single: bool = False
                ) -> tuple[list[tuple[Dump, Dump]], list[Dump], list[Dump]]:
    """Pair the graphs of two sides by kind (inject, block, encoder) and step (their order within
    that kind): the second block of ref goes with the second block of ours, whatever the
    evaluations around them. Returns (pairs in ref's order, ref graphs without a partner, ours
    graphs without a partner). With `single`, two one-graph sides pair whatever their kinds (the
    user picked both)."""
    if single and len(refs) == 1 and len(ours) == 1:
        return [(refs[0], ours[0])], [], []
    ours_at = {key: d for key, d in zip(_step_label(ours), ours)}
    pairs, lone_ref, used = [], [], set()
    for key, d in zip(_step_label(refs), refs):
        o = ours_at.get(key)
        if o is None:
            lone_ref.append(d)
        else:
            pairs.append((d, o))
            used.add(key)
    lone_ours = [d for key, d in zip(_step_label(ours), ours) if key not in used]
    return pairs, lone_ref, lone_ours


def local_model(ours: Dump, given: str | os.PathLike | None) -> Path | None:
    """The GGUF whose weights ours's nodes read: `given`, else a file of the dump's model name
    beside the dump folder, in it, or in the current folder whose sha256 is the one the dump
    recorded; None when none is found (nodes that read a weight then say so)."""
    if given is not None:
        return Path(given)
    if not ours.model or not ours.model_sha256:
        return None
    from ..dump.format import model_sha256
    name = Path(ours.model).name
    for folder in (ours.path.parent, ours.path.parent.parent, Path.cwd()):
        cand = folder / name
        if cand.is_file() and model_sha256(cand) == ours.model_sha256:
            return cand
    return None


def local_lenders(ours: Dump) -> list[Path]:
    """The target a scenario named (it lends a draft its embeddings and head): as written, beside
    the dump folder, in it, or here."""
    target = (ours.scenario_doc or {}).get("target")
    if not target:
        return []
    p = Path(target)
    for cand in ([p] if p.is_absolute() else [ours.path.parent / p, ours.path.parent.parent / p, Path.cwd() / p]):
        if cand.is_file():
            return [cand]
    return []


def diff_paths(ref_path: str | os.PathLike, ours_path: str | os.PathLike,
               nmse: float | dict[str, float] | None = None,
               rules_path: str | os.PathLike | None = None, progress=None,
               select: NodeFilter | None = None, per_op: dict[str, float] | None = None,
               at: Sequence[Target] = (), show_layers: bool = False, local: bool = False,
               model: str | os.PathLike | None = None) -> list[DiffResult]:
    """Diff two sides, each a dump folder, a dump file or an importable file (see `load_side`).

    Graphs are paired by kind and step (`pair_graphs`); a graph without a partner gives a result
    that says so and fails, except that when one side is a single file the other side's remaining
    graphs are only named in a note (one graph was asked for). An imported side is compared on
    the fields its format shows (`graphgen.compare.importers.common_fields`). `progress(k, n, name,
    detail)` is called as the work goes on: graph k of n, the files' names, how far its values are.
    `local` adds each node's own error (graphgen.compare.local), reading weights from `model`
    (ours's GGUF; default: `local_model`'s search)."""
    ref_path, ours_path = Path(ref_path), Path(ours_path)
    for p in (ref_path, ours_path):
        if not p.exists():
            raise DumpError(f"{p}: no such file or folder")
    rules = load_rules(rules_path) if rules_path is not None else []
    refs, ours = load_side(ref_path), load_side(ours_path)
    # a side that is one file holding one graph: the user asked about that graph alone
    single_ref = not ref_path.is_dir() and len(refs) == 1
    single_ours = not ours_path.is_dir() and len(ours) == 1
    pairs, lone_ref, lone_ours = pair_graphs(refs, ours, single=single_ref and single_ours)
    ref_keys = dict(zip(map(id, refs), _step_label(refs)))
    ours_keys = dict(zip(map(id, ours), _step_label(ours)))

    # results in ref's order, a graph without a partner where it would have been compared
    place = {id(d): k for k, d in enumerate(refs)}
    place.update({id(d): len(refs) + k for k, d in enumerate(ours)})
    placed: list[tuple[int, DiffResult]] = []
    skipped = []  # graphs of a folder left out because the other side is one file
    for side, lone, keys, other_single, other in (("ref", lone_ref, ref_keys, single_ours, ours_path),
                                                  ("ours", lone_ours, ours_keys, single_ref, ref_path)):
        for d in lone:
            label = _describe_graph(d, keys[id(d)])
            if other_single and pairs:
                skipped.append(f"{side} {label}")
            else:
                placed.append((place[id(d)], _unpaired(d, side, f"{side} {label} has no partner in {other} "
                                                               "(graphs pair by kind and step)")))
    n = len(pairs)
    for k, (r, o) in enumerate(pairs):
        if progress is not None:
            progress(k + 1, n, f"{r.path.name} / {o.path.name}", "")

        def on_values(done, total, k=k, r=r, o=o):
            progress(k + 1, n, f"{r.path.name} / {o.path.name}", f"values {done}/{total}")

        def on_local(done, total, k=k, r=r, o=o):
            progress(k + 1, n, f"{r.path.name} / {o.path.name}", f"own error {done}/{total}")
        try:
            res = diff_dumps(r, o, nmse, rules, on_values=on_values if progress is not None else None,
                             select=select, per_op=per_op, at=at, local=local,
                             model=local_model(o, model) if local else None,
                             lenders=local_lenders(o) if local else (),
                             on_local=on_local if progress is not None else None)
        finally:
            r.close()
            o.close()
        res.show_layers = show_layers
        if skipped:
            res.notes.append(f"not compared, the other side being one graph: {', '.join(skipped)}")
        placed.append((place[id(r)], res))
    results = [res for _, res in sorted(placed, key=lambda x: x[0])]
    for target in at:
        if not any(p["name"] == target.name if target.name is not None else
                   p[f"{target.side}_index"] == target.index for res in results for p in res.probes):
            raise ProbeError(f"--at {target.text}: no such node in "
                             + ("either side" if target.name is not None else target.side))
    if select is not None and select.active and results and all(r.nothing_selected or r.unpaired for r in results):
        raise FilterError(f"{select}: selects no node of any graph compared")
    return results

