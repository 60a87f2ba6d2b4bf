"""Read what llama.cpp users already have as structure-only dumps, so graph-diff works on them.

Formats (detected from the content):
- `eval-callback`: llama-eval-callback / llama-debug / common_debug_cb_eval text (and `graphgen
  trace` output). It shows name, type, op, the first two sources and ne, and for every type but
  the quantized ones some values: the first and last few per dimension (`%12.4f`) and the float32
  sum of all of them (`%f`), kept in `source.import.printed` (see `read_printed`) so that
  graph-diff compares them (graphgen.compare.printed). Graphs are split at `graphgen trace: graph
  NN-<kind>` lines or, in plain logs, at any other text between node blocks.
- `dot`: a `ggml_graph_dump_dot` file: name, type, op symbol (unary and GLU ops only as UNARY /
  GLU), ne with 2 or 3 dimensions, and every source.
- `sched-debug`: a `GGML_SCHED_DEBUG=2` log: node index, op (10 characters), name and sources
  (20 characters each) and the backend. View ops are not listed (the scheduler's print skips
  them: a view computes nothing and takes its source's backend); their graph indices, the gaps in
  the numbering, are kept in `source.import.unseen`. A new graph starts at a split
  #0 header or where the node index goes back. The graphs a context reserves its buffers with
  (announced by `graph_reserve:` lines) are never computed and are left out, as long as the log
  holds a computed one.

Every imported dump records in `source.import` which fields it knows; `project` cuts a full dump
down to the same fields, the same way, and `common_fields` cuts two sides to what both show, so
that they compare like for like.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from graphgen.dump.format import FORMAT, N_OP_PARAMS, Dump, DumpError, Node, write_dump

FORMATS = ("eval-callback", "dot", "sched-debug")
VIEW_OPS = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
UNARY_OPS = {"ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "GELU", "GELU_QUICK", "SILU",
             "HARDSWISH", "HARDSIGMOID", "EXP", "EXPM1", "SOFTPLUS", "GELU_ERF", "XIELU", "FLOOR", "CEIL",
             "ROUND", "TRUNC"}
GLU_OPS = {"REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK", "SWIGLU_CLAMP"}
# ggml_op_symbol -> op name (ggml.c GGML_OP_SYMBOL); "x+y" and "X*Y" also stand for ADD1 / OUT_PROD
OP_SYMBOLS = {
    "none": "NONE", "x": "DUP", "x+y": "ADD", "x[i]+y": "ADD_ID", "view(x,nb,offset)+=y->x": "ACC",
    "x-y": "SUB", "x*y": "MUL", "x/y": "DIV", "x^2": "SQR", "√x": "SQRT", "log(x)": "LOG",
    "sin(x)": "SIN", "cos(x)": "COS", "Σx": "SUM", "Σx_k": "SUM_ROWS", "cumsum(x)": "CUMSUM",
    "Σx/n": "MEAN", "argmax(x)": "ARGMAX", "count_equal(x)": "COUNT_EQUAL", "repeat(x)": "REPEAT",
    "repeat_back(x)": "REPEAT_BACK", "concat(x, y)": "CONCAT", "silu_back(x)": "SILU_BACK",
    "norm(x)": "NORM", "rms_norm(x)": "RMS_NORM", "rms_norm_back(x)": "RMS_NORM_BACK",
    "group_norm(x)": "GROUP_NORM", "l2_norm(x)": "L2_NORM", "X*Y": "MUL_MAT", "X[i]*Y": "MUL_MAT_ID",
    "x*v": "SCALE", "y-\\>view(x)": "SET", "x-\\>y": "CPY", "cont(x)": "CONT", "reshape(x)": "RESHAPE",
    "view(x)": "VIEW", "permute(x)": "PERMUTE", "transpose(x)": "TRANSPOSE", "get_rows(x)": "GET_ROWS",
    "get_rows_back(x)": "GET_ROWS_BACK", "set_rows(x)": "SET_ROWS", "diag(x)": "DIAG",
    "diag_mask_inf(x)": "DIAG_MASK_INF", "diag_mask_zero(x)": "DIAG_MASK_ZERO", "soft_max(x)": "SOFT_MAX",
    "soft_max_back(x)": "SOFT_MAX_BACK", "rope(x)": "ROPE", "rope_back(x)": "ROPE_BACK",
    "clamp(x)": "CLAMP", "conv_transpose_1d(x)": "CONV_TRANSPOSE_1D", "im2col(x)": "IM2COL",
    "im2col_back(x)": "IM2COL_BACK", "im2col_3d(x)": "IM2COL_3D", "col2im_1d(x)": "COL2IM_1D",
    "conv_2d(x)": "CONV_2D", "conv_3d(x)": "CONV_3D", "conv_2d_dw(x)": "CONV_2D_DW",
    "conv_transpose_2d(x)": "CONV_TRANSPOSE_2D", "pool_1d(x)": "POOL_1D", "pool_2d(x)": "POOL_2D",
    "pool_2d_back(x)": "POOL_2D_BACK", "upscale(x)": "UPSCALE", "pad(x)": "PAD",
    "pad_reflect_1d(x)": "PAD_REFLECT_1D", "roll(x)": "ROLL", "arange(start, stop, step)": "ARANGE",
    "timestep_embedding(timesteps, dim, max_period)": "TIMESTEP_EMBEDDING", "argsort(x)": "ARGSORT",
    "top_k(x)": "TOP_K", "leaky_relu(x)": "LEAKY_RELU", "tri(x)": "TRI", "fill(x, c)": "FILL",
    "flash_attn_ext(x)": "FLASH_ATTN_EXT", "flash_attn_back(x)": "FLASH_ATTN_BACK",
    "ssm_conv(x)": "SSM_CONV", "ssm_scan(x)": "SSM_SCAN", "win_part(x)": "WIN_PART",
    "win_unpart(x)": "WIN_UNPART", "get_rel_pos(x)": "GET_REL_POS", "add_rel_pos(x)": "ADD_REL_POS",
    "unary(x)": "UNARY", "map_custom(x)": "MAP_CUSTOM1", "map_custom(x,y)": "MAP_CUSTOM2",
    "map_custom(x,y,z)": "MAP_CUSTOM3", "custom(x)": "CUSTOM", "glu(x)": "GLU",
}
_SYMBOL_ALIASES = {"ADD1": "ADD", "OUT_PROD": "MUL_MAT"}

_NE = r"-?\d+, -?\d+, -?\d+, -?\d+"
_CB_HEAD = re.compile(r"^(?P<func>[A-Za-z_]\w*): (?P<name>.*) = \((?P<type>[A-Za-z0-9_]+)\) +"
                      r"(?P<op>\S+)\((?P<args>.*)\) = \{(?P<ne>" + _NE + r")\}\s*$")
_CB_ARGS = re.compile(r"^(?:(?P<s0>.*?)\{(?P<n0>" + _NE + r")\})?, (?:(?P<s1>.*)\{(?P<n1>" + _NE + r")\})?\}$")
_CB_VALUE = re.compile(r"^\s+(?:\[|\]|\.\.\.|sum = )|^encountered NaN - aborting")
_CB_MARK = re.compile(r"^graphgen trace: graph (\d+)-(\w+)")
_BACKEND_COPY = re.compile(r"^[A-Za-z0-9_.\-]+#(.+)#\d+$")

_DOT_NODE = re.compile(r'^\s*"(?P<id>[^"]+)" \[ style = filled; fillcolor = \w+; shape = record; label="(?P<label>.*)"; \]\s*$')
_DOT_EDGE = re.compile(r'^\s*"(?P<src>[^"]+)" -> "(?P<dst>[^"]+)" \[.*label = "src (?P<slot>\d+)"; \]\s*$')
_DOT_NAME = re.compile(r"^(?P<name>.*?) ?\((?P<type>[A-Za-z0-9_]+)\)$")

_SCHED_NODE = re.compile(r"node #\s*(?P<idx>\d+) \((?P<op>.{10})\): (?P<name>.{20}) \((?P<size>.{5})\) "
                         r"\[(?P<backend>.{5}) (?P<cause>.{8})\] use=\d+,c=\d+:(?P<rest>.*)$")
_SCHED_SPLIT0 = re.compile(r"^## SPLIT #0: ")
_SCHED_SRC = re.compile(r" (?P<name>.{20}) \((?P<size>.{5})\) \[(?P<backend>.{5}) (?P<cause>.{8})\]")

CB_NAME_WIDTH = 24
SCHED_NAME_WIDTH = 20
SCHED_OP_WIDTH = 10


class ImportFormatError(DumpError):
    """A file that is none of the importable formats (one line)."""


def _strip_copy(name: str) -> str:
    # the scheduler names a backend copy of a tensor "<backend>#<name>#<n>"
    m = _BACKEND_COPY.match(name)
    return m.group(1) if m else name


def _ne4(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def detect(text: str) -> str | None:
    head = text[:200_000]
    if re.search(r"^digraph G \{", head, re.M) and "shape = record" in head:
        return "dot"
    if any(_SCHED_NODE.search(line) for line in head.splitlines() if "node #" in line):
        return "sched-debug"
    if any(_CB_HEAD.match(line) for line in head.splitlines()):
        return "eval-callback"
    return None


def _empty_node(index: int, name: str, op: str, type_: str, ne, src) -> Node:
    return Node(index, name, op, type_, list(ne), list(src), None, 0, [0] * N_OP_PARAMS)


def _guess_kind(nodes: list[Node]) -> str:
    names = {n.name for n in nodes}
    if "result_output" in names or "inp_noise_embd" in names:
        return "block"
    if "enc_norm_out" in names:
        return "encoder"
    return "inject"


# ---- parsers: text -> [(kind or None, [Node])] ------------------------------------------------

def parse_eval_callback(text: str) -> list[tuple[str | None, list[Node], dict[str, Any]]]:
    """Graphs as (kind, nodes, printed): `printed` maps a node's index (as text) to what
    `read_printed` made of its value lines."""
    graphs: list[tuple[str | None, list[Node], dict[str, Any]]] = []
    cur: list[Node] = []
    printed: dict[str, Any] = {}
    lines: list[str] = []  # the value lines of the last node
    kind: str | None = None
    pending_break = False

    def end_node():
        if cur and lines:
            printed[str(len(cur) - 1)] = read_printed(lines, cur[-1].ne)
        lines.clear()

    def close():
        nonlocal cur, printed
        end_node()
        if cur:
            graphs.append((kind, cur, printed))
        cur, printed = [], {}

    for line in text.splitlines():
        mark = _CB_MARK.match(line)
        if mark:
            close()
            kind, pending_break = mark.group(2), False
            continue
        m = _CB_HEAD.match(line)
        if m:
            end_node()
            if pending_break:
                close()
                kind, pending_break = None, False
            args = _CB_ARGS.match(m.group("args"))
            if not args:
                raise ImportFormatError(f"cannot read the sources in: {line.strip()[:120]}")
            # newer trees print a node without sources (ggml_arange) as "(, })"
            src = [_strip_copy(args.group("s0") or "")]
            if args.group("s1") is not None:
                src.append(_strip_copy(args.group("s1")))
            while src and src[-1] == "":
                src.pop()
            name = m.group("name")
            # %24s pads on the left: a shorter name's leading spaces cannot be told from padding
            name = name.lstrip(" ") if len(name) <= CB_NAME_WIDTH else name
            cur.append(_empty_node(len(cur), name, m.group("op"), m.group("type"), _ne4(m.group("ne")), src))
            continue
        if _CB_VALUE.match(line):
            if cur and not pending_break:
                lines.append(line)
            continue
        if not line.strip():
            continue
        if cur:
            end_node()
            pending_break = True  # other log text after a node block: the next node opens a graph
    close()
    return graphs


def _shown(n: int, edge: int | None) -> list[int]:
    # the callback prints indices 0..edge-1 and n-edge..n-1 of a dimension longer than 2*edge
    if edge is None or n <= 2 * edge:
        return list(range(n))
    return list(range(edge)) + list(range(n - edge, n))


def printed_positions(ne: list[int], edge: int | None) -> list[int]:
    """Flat indices (numpy order: ne3, ne2, ne1, ne0) of the elements the callback prints, in
    the order it prints them: every ne[3] slice, and of ne[2], ne[1], ne[0] the first and last
    `edge` (all of a dimension no longer than 2*edge; all of every one when edge is None)."""
    ne0, ne1, ne2, ne3 = (int(x) for x in ne)
    return [((i3 * ne2 + i2) * ne1 + i1) * ne0 + i0
            for i3 in range(ne3) for i2 in _shown(ne2, edge) for i1 in _shown(ne1, edge) for i0 in _shown(ne0, edge)]


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def read_printed(lines: list[str], ne: list[int]) -> dict[str, Any]:
    """What a node's value lines say: {"edge", "at" (flat indices), "values" (the printed text of
    each element), "sum" (its printed text)}, or {"unreadable": why} when the lines do not fit
    the node's shape under any edge width.

    The edge width (3 in common/debug.cpp) is read from the text: the count of elements before
    the first "..." of a row; a text without "..." printed everything (a callback with a larger
    width, or a small node)."""
    rows: list[list[str]] = []
    sums: list[str] = []
    for line in lines:
        s = line.strip()
        if s.startswith("sum = "):
            sums.append(s[len("sum = "):].strip())
        elif s.startswith("[") and s.rstrip(",").rstrip().endswith("]") and len(s) > 2:
            body = s.rstrip(",").rstrip()[1:-1]
            rows.append([t.strip() for t in body.split(",") if t.strip()])
    n_shown = sum(len(r) for r in rows)
    if not rows and not sums:
        return {"unreadable": "no values printed"}
    bad = next((t for r in rows for t in r if t != "..." and not _is_number(t)), None)
    if bad is not None:
        return {"unreadable": f"cannot read the printed element {bad!r}"}
    cuts = [r.index("...") for r in rows if "..." in r]
    candidates: list[int | None] = [cuts[0]] if cuts else [None, 3]
    for edge in candidates:
        if edge is not None and edge < 1:
            continue
        at = printed_positions(ne, edge)
        values = [t for r in rows for t in r if t != "..."]
        n_rows = int(ne[3]) * len(_shown(int(ne[2]), edge)) * len(_shown(int(ne[1]), edge))
        if len(values) == len(at) and len(rows) == n_rows:
            return {"edge": edge, "at": at, "values": values, "sum": sums[0] if sums else None}
    return {"unreadable": f"{n_shown} printed elements in {len(rows)} rows do not fit ne {list(ne)}"}


def parse_dot(text: str) -> list[tuple[str | None, list[Node]]]:
    nodes: dict[str, dict] = {}
    leaves: dict[str, str] = {}
    edges: list[tuple[str, str, int]] = []
    for line in text.splitlines():
        m = _DOT_NODE.match(line)
        if m:
            label = m.group("label")
            if label.startswith("<x>"):  # a leaf: "<x>NAME (TYPE)|CONST i [ne0, ne1]"
                nm = _DOT_NAME.match(label[3:].split("|")[0])
                leaves[m.group("id")] = nm.group("name") if nm else label[3:]
                continue
            parts = label.split("|")
            nm = _DOT_NAME.match(parts[0])
            dims = re.match(r"\s*(\d+) \[([-\d, ]+)\]", parts[1]) if len(parts) > 1 else None
            sym = parts[2].strip() if len(parts) > 2 else ""
            sym = sym[3:] if sym.startswith("<x>") else sym
            if not nm or not dims:
                raise ImportFormatError(f"cannot read the dot node label: {label[:120]}")
            ne = [int(x) for x in dims.group(2).split(",")]
            ne += [1] * (4 - len(ne))
            nodes[m.group("id")] = {"index": int(dims.group(1)), "name": nm.group("name"), "type": nm.group("type"),
                                    "op": OP_SYMBOLS.get(sym, sym), "ne": ne, "src": {}}
            continue
        m = _DOT_EDGE.match(line)
        if m:
            edges.append((m.group("src"), m.group("dst"), int(m.group("slot"))))
    for s, d, slot in edges:
        if d in nodes:
            nodes[d]["src"][slot] = nodes[s]["name"] if s in nodes else leaves.get(s, "")
    out = []
    for k, n in enumerate(sorted(nodes.values(), key=lambda n: n["index"])):
        src = [""] * (max(n["src"], default=-1) + 1)
        for slot, name in n["src"].items():
            src[slot] = name
        out.append(_empty_node(k, n["name"], n["op"], n["type"], n["ne"], src))
    return [(None, out)] if out else []


def parse_sched_debug(text: str) -> tuple[list[tuple[str | None, list[Node]]], list[dict[int, str]], list[list[int]]]:
    """Graphs, per graph the backend of each node, and per graph the indices its numbering skips
    (the view ops, which the scheduler's print leaves out)."""
    graphs, backends, reserved, skipped = [], [], [], []
    cur: list[Node] = []
    be: dict[int, str] = {}
    seen: list[int] = []  # the graph indices the log prints
    last = -1
    reserving = cur_reserved = False

    def close():
        nonlocal cur, be, seen
        if cur:
            graphs.append((None, cur))
            backends.append(be)
            reserved.append(cur_reserved)
            shown = set(seen)
            skipped.append([k for k in range(max(seen) + 1) if k not in shown])
        cur, be, seen = [], {}, []

    for line in text.splitlines():
        if line.startswith("graph_reserve:"):
            close()
            reserving = True  # the next graph only sizes buffers; llama.cpp never computes it
            continue
        if _SCHED_SPLIT0.match(line):
            close()
            continue
        m = _SCHED_NODE.search(line)
        if not m:
            continue
        idx = int(m.group("idx"))
        if idx <= last and cur:
            close()
        if not cur:
            cur_reserved, reserving = reserving, False
        last = idx
        seen.append(idx)
        src = [_strip_copy(s.group("name").lstrip(" ")) for s in _SCHED_SRC.finditer(m.group("rest"))]
        be[len(cur)] = m.group("backend").strip()
        cur.append(_empty_node(len(cur), m.group("name").lstrip(" "), m.group("op").lstrip(" "), "?",
                               [0, 0, 0, 0], src))
    close()
    if not all(reserved):
        graphs = [g for g, r in zip(graphs, reserved) if not r]
        backends = [b for b, r in zip(backends, reserved) if not r]
        skipped = [k for k, r in zip(skipped, reserved) if not r]
    return graphs, backends, skipped


# why a sched-debug log cannot show a node; the diff repeats it for every node it could not pair
SCHED_UNSEEN_WHY = ("GGML_SCHED_DEBUG lists no view ops (VIEW, RESHAPE, PERMUTE, TRANSPOSE): a view computes "
                    "nothing and takes its source's backend, so the scheduler's assignment print skips it")
IMPORT_VERSION = "unknown (imported)"
FORMAT_LABELS = {"eval-callback": "eval-callback text", "dot": "ggml_graph_dump_dot file",
                 "sched-debug": "GGML_SCHED_DEBUG log"}

FIELDS = {"eval-callback": ["name", "op", "type", "ne", "src[:2]"],
          "dot": ["name", "op", "type", "ne[:3]", "src"],
          "sched-debug": ["name[:20]", "op[:10]", "src[:20]", "backend"]}


def import_text(text: str, path: str | Path = "<text>", fmt: str | None = None,
                graph: str | None = None) -> list[Dump]:
    """Parse a log or dot file into structure-only Dump objects (not written)."""
    fmt = fmt or detect(text)
    if fmt is None:
        raise ImportFormatError(f"{path}: not an eval-callback log, ggml_graph_dump_dot file or GGML_SCHED_DEBUG log")
    backends: list[dict[int, str]] = []
    skipped: list[list[int]] = []
    printed: list[dict[str, Any]] = []
    engine = "llama.cpp"
    if fmt == "eval-callback":
        parsed = parse_eval_callback(text)
        graphs = [(k, n) for k, n, _ in parsed]
        printed = [p for _, _, p in parsed]
        if re.search(r"^graphgen trace: graph ", text, re.M):
            engine = "graphgen"  # `graphgen trace` marks its graphs; llama.cpp's tools do not
    elif fmt == "dot":
        graphs = parse_dot(text)
    elif fmt == "sched-debug":
        graphs, backends, skipped = parse_sched_debug(text)
    else:
        raise ImportFormatError(f"unknown import format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if not graphs:
        raise ImportFormatError(f"{path}: no graph nodes found in this {fmt} file")
    dumps = []
    for k, (kind, nodes) in enumerate(graphs):
        kind = graph or kind or _guess_kind(nodes)
        # no ggml or CPU features, and the version (the dump format wants one) unknown: the formats
        # do not print them
        source = {"engine": engine, "version": IMPORT_VERSION,
                  "import": {"format": fmt, "file": str(path), "fields": FIELDS[fmt]}}
        if backends:
            source["import"]["backends"] = {str(i): b for i, b in backends[k].items()}
        if fmt == "sched-debug":
            # graph indices the numbering skips; views after the last listed node leave no gap
            source["import"]["unseen"] = {"indices": skipped[k], "why": SCHED_UNSEEN_WHY}
        if printed:
            source["import"]["printed"] = printed[k]
        flash = any(n.op == "FLASH_ATTN_EXT" for n in nodes)
        dumps.append(Dump(path=Path(f"{k:02d}-{kind}.json"), format=FORMAT, source=source, model="?", graph=kind,
                          settings={"flash_attn": flash, "type_k": "?", "type_v": "?", "n_ctx": 0,
                                    "n_ubatch": 0, "n_kv": None, "causal": False},
                          cpu_features={}, nodes=nodes))
    return dumps


def import_file(path: str | Path, fmt: str | None = None, graph: str | None = None) -> list[Dump]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ImportFormatError(f"{path}: no such file") from None
    except OSError as e:
        raise ImportFormatError(f"{path}: cannot read: {e.strerror or e}") from None
    return import_text(text, path, fmt, graph)


def write_imported(dumps: list[Dump], out_dir: str | Path) -> list[Path]:
    """Write imported dumps as a dump folder (`NN-<graph>.json`, no values)."""
    out = []
    for k, d in enumerate(dumps):
        header = {"source": d.source, "model": d.model, "settings": d.settings, "cpu_features": d.cpu_features}
        out.append(write_dump(out_dir, k, d.graph, header, d.nodes))
    return out


def import_format(d: Dump) -> str | None:
    """The import format of a dump made by this module, None for a full dump."""
    imp = (d.source or {}).get("import")
    return imp.get("format") if isinstance(imp, dict) else None


# cut order: sched-debug's name cut (first 20 characters, then the padding) must come before
# eval-callback's (padding only), and dot's shape folding after sched-debug's blank shapes
_CUT_ORDER = ("sched-debug", "eval-callback", "dot")


def common_fields(a: Dump, b: Dump) -> tuple[Dump, Dump, str | None]:
    """Two dumps cut down to the fields both show: every import format involved (either side's)
    is applied to both sides, in a fixed order, so a full dump against an import and two imports
    of different formats compare like for like. Returns the cut dumps and a note saying what was
    compared, or the dumps unchanged and None when neither is an import. The cuts keep losses
    idempotent, so a side already cut (or imported) in that format is unchanged by it."""
    fmts = {f for f in (import_format(a), import_format(b)) if f}
    if not fmts:
        return a, b, None
    for fmt in _CUT_ORDER:
        if fmt in fmts:
            a, b = project(a, fmt), project(b, fmt)
    order = [f for f in _CUT_ORDER if f in fmts]
    shown = {f: ", ".join(x for x in FIELDS[f] if x != "backend") for f in order}
    what = (f"the fields {order[0]} shows ({shown[order[0]]})" if len(order) == 1 else
            "the fields both " + " and ".join(order) + " show (" + "; ".join(f"{f}: {v}" for f, v in shown.items()) + ")")
    return a, b, (f"compared on {what}; both sides cut to them, so view_src, view_offs and op_params "
                  "are not compared")


def project(d: Dump, fmt: str) -> Dump:
    """A full dump cut down to what `fmt` shows, with the same losses as the parser; an
    eval-callback cut keeps the values and statistics, since that text prints values too."""
    nodes: list[Node] = []
    for n in d.nodes:
        if fmt == "eval-callback":
            name = n.name.lstrip(" ") if len(n.name) <= CB_NAME_WIDTH else n.name
            src = list(n.src[:2])
            while src and src[-1] == "":
                src.pop()  # a NULL src1 prints as nothing
            # the text prints values: keep ours (indices unchanged) to compare them with
            nodes.append(replace(_empty_node(len(nodes), name, n.op, n.type, n.ne, src), digest=n.digest,
                                 stats=n.stats))
        elif fmt == "dot":
            op = "UNARY" if n.op in UNARY_OPS else "GLU" if n.op in GLU_OPS else _SYMBOL_ALIASES.get(n.op, n.op)
            ne = list(n.ne[:2]) + ([1, 1] if n.ne[2] == 1 and n.ne[3] == 1 else [n.ne[2], 1])
            nodes.append(_empty_node(len(nodes), n.name, op, n.type, ne, n.src))
        elif fmt == "sched-debug":
            if n.op in VIEW_OPS:
                continue
            nodes.append(_empty_node(len(nodes), n.name[:SCHED_NAME_WIDTH].lstrip(" "),
                                     n.op[:SCHED_OP_WIDTH].lstrip(" "), "?", [0, 0, 0, 0],
                                     [s[:SCHED_NAME_WIDTH].lstrip(" ") for s in n.src if s]))
        else:
            raise ValueError(f"unknown import format {fmt!r}")
    return replace(d, nodes=nodes, values_path=d.values_path if fmt == "eval-callback" else None)
