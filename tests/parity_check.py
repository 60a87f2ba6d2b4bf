"""Shared parity assertions: identical structure, and values bit-identical on the reference's build
except where a named ggml kernel change between ggml 0.15.3 and 0.27.0 explains a difference."""

import json
from pathlib import Path

from graphgen.ops import ggml as G
from graphgen.record import cpu_features

NMSE_KERNEL_CHANGE = 1e-7


def _short_k_matmul(node, ref_nodes, weights):
    """F32 MUL_MAT whose inner dimension is not a multiple of 8: the llamafile tinyBLAS path of
    ggml 0.27.0 takes such shapes while 0.15.3 falls back to ggml_vec_dot_f32 (see README)."""
    if node.op != "MUL_MAT" or not node.src:
        return False
    src0 = node.src[0]
    k = weights.get(src0)
    if k is None:
        k = next((n.ne[0] for n in ref_nodes if n.name == src0), None)
    return k is not None and k % 8 != 0


KERNEL_CHANGES = {"tinyblas-short-k": _short_k_matmul}


def weight_inner_dims(model_path) -> dict:
    from gguf import GGUFReader
    return {t.name: int(t.shape[0]) for t in GGUFReader(str(model_path)).tensors}


def same_build_as_reference(dump_dir) -> bool:
    first = sorted(Path(dump_dir).glob("[0-9][0-9]-*.json"))[0]
    ref = json.loads(first.read_text())["cpu_features"]
    ours = cpu_features(G.cpu_lib())
    return all(ours.get(k) == v for k, v in ref.items() if k in ours)


def assert_parity(results, ref_dir, model_path, context=""):
    from graphgen.dump import load_dump

    same_build = same_build_as_reference(ref_dir)
    weights = weight_inner_dims(model_path)
    for res in results:
        assert not res.structural, context + "\n" + res.format_text()
        assert not res.numeric_failures, context + "\n" + res.format_text()
        nonzero = [n for n in res.numeric if n.nmse and n.nmse > 0]
        if not nonzero:
            continue
        if not same_build:
            assert all(n.nmse <= 1e-6 for n in nonzero), context + "\n" + res.format_text()
            continue
        # the first differing node must be one a named kernel change explains; the rest follow it
        ref_nodes = load_dump(res.ref_path).nodes
        first = ref_nodes[min(n.ref_index for n in nonzero)]
        assert any(rule(first, ref_nodes, weights) for rule in KERNEL_CHANGES.values()), (
            f"{context}\nfirst value difference at #{first.index} {first.name} ({first.op}) is not "
            f"explained by a known ggml kernel change\n" + res.format_text())
        assert all(n.nmse <= NMSE_KERNEL_CHANGE for n in nonzero), context + "\n" + res.format_text()
