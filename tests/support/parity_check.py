"""Shared parity assertions: graphgen computes on the reference's own ggml, so a graph is at parity
only when its structure is identical and every compared node is bit-identical (NMSE exactly 0)."""


def assert_parity(results, context=""):
    assert results, f"{context}: nothing was compared"
    for res in results:
        text = context + "\n" + res.format_text()
        assert not res.structural, text
        assert not res.settings_differ, text
        assert not res.rules_fired, text
        assert res.numeric, f"{text}\nno node values were compared"
        # only a quantized KV cache's nodes (its writes and views) carry neither values nor a digest;
        # every float node must have been compared
        uncompared = [n for _, _, n, _ in res.not_compared if not n.startswith("cache_")]
        assert not uncompared, f"{text}\nfloat nodes not compared: {uncompared[:5]}"
        assert not res.numeric_failures, text
        differing = [n for n in res.numeric if n.nmse != 0]
        assert not differing, f"{text}\n{len(differing)} nodes are not bit-exact, first #{differing[0].ref_index}"


def run_both_engines(tmp_path, variant, backbone, kw, sc):
    """Make the draft, run the scenario in llama.cpp b11739 (tmp_path/ref) and in graphgen
    (tmp_path/ours), and return the graph-diffs of the two folders."""
    import json

    from graphgen.compare.pairing import diff_paths
    from graphgen.reference.runner import run_reference
    from graphgen.synth import make_model

    model = tmp_path / "draft.gguf"
    make_model(model, variant, backbone, **kw)  # the generators draw only drafts b11739 loads
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(sc))
    run_reference(model, scen, tmp_path / "ref")  # a failure here is a failed test, not a skip
    run_ours(model, sc, tmp_path / "ours")
    return diff_paths(tmp_path / "ref", tmp_path / "ours")


_WORKER = None


def worker():
    """This test process's graphgen worker (tests/support/workers.py), started on first use: the live
    cases here and the `isolated` fixture share it."""
    global _WORKER
    if _WORKER is None:
        import atexit
        import tempfile
        from pathlib import Path

        from workers import Isolated
        _WORKER = Isolated(Path(tempfile.mkdtemp(prefix="graphgen-worker-")) / "graphgen.err")
        atexit.register(_WORKER.close)
    return _WORKER


def run_ours(model, sc: dict, out, max_data: int = 262144) -> None:
    """graphgen's side of a live case, run in the worker process: a ggml abort on a drawn
    configuration fails that case, not the whole test run. A refusal fails it too: these drafts
    and scenarios are ones b11739 runs."""
    res = worker().call("sessions:run_ours", model=str(model), doc=sc, out=str(out), max_data=max_data)
    assert res["ok"], f"graphgen refused step {res['step']}: {res['error']}"
