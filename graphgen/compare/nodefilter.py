"""Which nodes a comparison looks at (`-o OP`, `--name REGEX`) and what error each may carry
(`--thresholds FILE`), for `graphgen diff` and `graphgen xdiff`.

The threshold file is test-backend-ops' idea of a bound per op, as JSON::

    {"MUL_MAT": 5e-4, "SOFT_MAX": 1e-6, "f16": 1e-5, "default": 1e-7}

A key is an op as dumps spell it (upper case), a tensor type (f32, f16, bf16, ...) or "default";
the bound of a node is its op's, else its type's, else the default. Integer nodes compare exactly
whatever the file says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

FLOAT_TYPES = ("f32", "f16", "bf16")
EXACT_TYPES = frozenset({"i8", "i16", "i32", "i64"})
_OP = re.compile(r"[A-Z][A-Z0-9_]*")


class FilterError(ValueError):
    """A bad -o / --name / --thresholds; the message names the flag and the value."""


@dataclass
class NodeFilter:
    """Nodes whose op is one of `ops` (when given) and whose name matches one of `names` (when
    given). An empty filter selects every node."""
    ops: frozenset[str] = frozenset()
    names: tuple[re.Pattern, ...] = ()
    spelled: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, ops=None, names=None) -> NodeFilter:
        got: set[str] = set()
        for text in ops or ():
            for op in (t.strip() for t in text.split(",")):
                if not _OP.fullmatch(op.upper()):
                    raise FilterError(f"-o {text}: '{op}' is not an op name (e.g. MUL_MAT, SOFT_MAX)")
                got.add(op.upper())
        pats = []
        for text in names or ():
            try:
                pats.append(re.compile(text))
            except re.error as e:
                raise FilterError(f"--name {text!r}: not a regular expression ({e})") from None
        spelled = ([f"-o {','.join(sorted(got))}"] if got else []) + [f"--name {p.pattern}" for p in pats]
        return cls(frozenset(got), tuple(pats), spelled)

    @property
    def active(self) -> bool:
        return bool(self.ops or self.names)

    def __call__(self, node) -> bool:
        if self.ops and node.op not in self.ops:
            return False
        return not self.names or any(p.search(node.name) for p in self.names)

    def __str__(self) -> str:
        return " ".join(self.spelled)


def known_ops() -> frozenset[str]:
    """The op names a dump can carry: ggml's ops as ggml_op_desc prints them, a unary or GLU op
    by its own name (SILU, SWIGLU)."""
    from ..ops import ggml as G
    names = set()
    for prefix, source in (("GGML_OP_", G.OP_IDS), ("GGML_GLU_OP_", G.OP_IDS), ("GGML_UNARY_OP_", dir(G))):
        names |= {k[len(prefix):] for k in source if k.startswith(prefix) and not k.endswith("_COUNT")}
    return frozenset(names - {"UNARY", "GLU"})


def _nearest(key: str, valid) -> str | None:
    """The valid key closest to a mistyped one, case aside (MULMAT, mul_mat: MUL_MAT; F16: f16)."""
    import difflib
    by_upper = {v.upper(): v for v in valid}
    hit = difflib.get_close_matches(key.upper().replace(" ", "_"), list(by_upper), n=1, cutoff=0.6)
    return by_upper[hit[0]] if hit else None


def parse_thresholds(doc, where: str) -> dict[str, float]:
    if not isinstance(doc, dict) or not doc:
        raise FilterError(f"{where}: expected a JSON object of op or type -> NMSE bound")
    types = {"default", *FLOAT_TYPES, *EXACT_TYPES}
    ops = None
    out = {}
    for key, v in doc.items():
        if key not in types:
            ops = known_ops() if ops is None else ops
            if key not in ops:
                # a typo would otherwise bound nothing, silently
                near = _nearest(key, ops | types)
                raise FilterError(f"{where}: key '{key}' is neither a ggml op (e.g. MUL_MAT), a type "
                                  f"({', '.join(FLOAT_TYPES)}) nor 'default'"
                                  + (f"; did you mean '{near}'?" if near else ""))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise FilterError(f"{where}: '{key}' must be a non-negative number, got {v!r}")
        out[key] = float(v)
    return out


def load_thresholds(path) -> dict[str, float]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise FilterError(f"--thresholds {p}: no such file") from None
    except (OSError, ValueError) as e:
        raise FilterError(f"--thresholds {p}: not valid JSON ({' '.join(str(e).split())})") from None
    return parse_thresholds(doc, f"--thresholds {p}")
