"""Named graph-diff equivalence rules for ops graphgen emulates (graphgen/ops/emulate.py).

`dsv4.json` pairs each llama.cpp-only op of the DeepSeek-V4 drafts with the chain that stands
for it: ROPE / ROPE_BACK with rope_set_offset, SWIGLU_CLAMP, and the fused hyper-connection ops
DSV4_HC_PRE, DSV4_HC_POST and DSV4_HC_COMB (one rule per Sinkhorn iteration count, as the chain's
length depends on it). `python -c "import graphgen.rules as r; r.write()"` rewrites the file from `dsv4_rules()`.
"""

from __future__ import annotations

import json
from pathlib import Path

RULES_DIR = Path(__file__).resolve().parent
DSV4_RULES = RULES_DIR / "dsv4.json"
SINKHORN_ITERS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 16, 20)
HC = 4  # upstream's fused HC kernels are written for 4 streams


def _rope(op: str) -> list:
    # two views of each row (the copied head, the rotated tail), the rope on the tail, the concat
    return ["VIEW", "VIEW", op, "CONCAT"]


def _hc_pre() -> list:
    out = ["VIEW", "VIEW", "MUL"]
    for _ in range(1, HC):
        out += ["VIEW", "VIEW", "MUL", "ADD"]
    return out


def _hc_post() -> list:
    out = []
    for dst in range(HC):
        out += ["VIEW", "MUL"]
        for _ in range(HC):
            out += ["VIEW", "VIEW", "MUL", "ADD"]
        out += ["RESHAPE"]
        if dst:
            out += ["CONCAT"]
    return out


def _hc_comb(n_iter: int) -> list:
    cols = ["PERMUTE", "CONT", "SUM_ROWS", "ADD", "PERMUTE", "DIV"]
    rows = ["SUM_ROWS", "ADD", "DIV"]
    out = ["VIEW", "VIEW", "MUL", "VIEW", "ADD", "RESHAPE", "SOFT_MAX", "FILL", "ADD"] + cols
    for _ in range(1, n_iter):
        out += rows + cols
    return out


def dsv4_rules() -> dict:
    rules = [
        {"name": "rope_set_offset",
         "reason": "ggml_rope_ext + ggml_rope_set_offset (absent in ggml 0.15.3): the rope runs on a "
                   "view of the rotated tail of each row and the head is concatenated back",
         "ref": [{"op": "ROPE"}], "ours": _rope("ROPE")},
        {"name": "rope_back_set_offset",
         "reason": "ggml_rope_ext_back + ggml_rope_set_offset, emulated as rope_set_offset",
         "ref": [{"op": "ROPE_BACK"}], "ours": _rope("ROPE_BACK")},
        {"name": "swiglu_clamp",
         "reason": "ggml_swiglu_clamp (llama.cpp only) = silu(min(gate, L)) * clamp(up, -L, L): "
                   "CLAMP, CLAMP, SWIGLU",
         "ref": [{"op": "SWIGLU_CLAMP"}], "ours": ["CLAMP", "CLAMP", "SWIGLU"]},
        {"name": "dsv4_hc_pre",
         "reason": "ggml_dsv4_hc_pre (llama.cpp only): upstream's unfused weighted sum of the 4 streams",
         "ref": [{"op": "DSV4_HC_PRE"}], "ours": _hc_pre()},
        {"name": "dsv4_hc_post",
         "reason": "ggml_dsv4_hc_post (llama.cpp only): upstream's unfused post/comb mix of the 4 streams",
         "ref": [{"op": "DSV4_HC_POST"}], "ours": _hc_post()},
        {"name": "clamp_in_place",
         "reason": "ggml 0.15.3's ggml_clamp returns a view of its source (computed in place); "
                   "llama.cpp's ggml writes a new tensor: same values, view_src differs",
         "ref": [{"op": "CLAMP"}], "ours": [{"op": "CLAMP"}]},
    ]
    for n in SINKHORN_ITERS:
        rules.append({"name": f"dsv4_hc_comb_sinkhorn{n}",
                      "reason": f"ggml_dsv4_hc_comb (llama.cpp only) with {n} Sinkhorn iteration(s): upstream's "
                                "unfused affine + build_hc_sinkhorn",
                      "ref": [{"op": "DSV4_HC_COMB"}], "ours": _hc_comb(n)})
    return {"rules": rules}


def write(path: Path = DSV4_RULES) -> None:
    path.write_text(json.dumps(dsv4_rules(), indent=1) + "\n")


if __name__ == "__main__":
    write()
