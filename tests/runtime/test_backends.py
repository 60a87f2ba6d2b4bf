"""Backends: selection and clear errors, RPC through a local server, GPU backends vs CPU.

The test process computes on the reference's ggml (CPU and RPC). A GPU backend needs a ggml built
with it (tools/build_ggml.sh vulkan|cuda|metal), so those tests run `graphgen --ggml DIR xdiff`
in a child process. tools/setup.sh exports GRAPHGEN_<KIND>_GGML_DIR for the build it made; CI
builds Vulkan (lavapipe) and sets GRAPHGEN_REQUIRE_VULKAN=1, so there a missing build fails.
"""

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.ops.runtime import cache_root
from graphgen.compare.pairing import diff_paths
from graphgen.play.engine import run_scenario
from graphgen.runtime.backends import BackendUnavailable, has_backend
from graphgen.runtime.session import Session
from graphgen.play.scenario import load_scenario
from graphgen.synth import make_model
from graphgen.compare.xdiff import xdiff
from make_references import build_model

GPU_CASES = ["dflash-fa-off", "dflash-fa-on", "dflash2-fa-off", "dspark-conf-fa-on", "lilicorr-fa-off",
             "dsv4-fa-off", "dsv4-fa-on"]


def need(kind):
    if not has_backend(kind):
        pytest.fail(f"the reference's ggml has no {kind} backend")


def gpu_build(kind):
    """The folder of a ggml built with `kind`, or skip (fail where it is required) naming what is missing."""
    required = os.environ.get(f"GRAPHGEN_REQUIRE_{kind.upper()}") == "1"
    d = os.environ.get(f"GRAPHGEN_{kind.upper()}_GGML_DIR")
    if not d:
        cached = cache_root() / "ggml" / kind
        d = str(cached.resolve()) if cached.exists() else None
    if d is None:
        msg = f"no {kind} device build here: {_HARDWARE[kind]} and tools/build_ggml.sh {kind} are needed"
        if required:
            pytest.fail(msg)
        pytest.skip(msg)
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "--ggml", d, "devices"], capture_output=True,
                       text=True)
    # the device lines follow the header "devices (llama.cpp's names, ...):"
    devs = p.stdout.split("\ndevices", 1)[-1].splitlines()[1:]
    if p.returncode != 0 or not any(ln.strip().lower().startswith(_PREFIX[kind]) for ln in devs):
        msg = f"the {kind} build in {d} sees no {kind} device (no such hardware here): {p.stdout}{p.stderr}"
        if required:
            pytest.fail(msg)
        pytest.skip(msg)
    return d


_HARDWARE = {"vulkan": "a Vulkan driver (lavapipe will do)", "cuda": "an NVIDIA GPU with the CUDA toolkit",
             "metal": "an Apple GPU (macOS)"}
# how ggml names the devices and backends of each kind
_PREFIX = {"vulkan": ("vulkan",), "cuda": ("cuda",), "metal": ("metal", "mtl")}


def gpu_xdiff(kind, case, tmp_path):
    d = gpu_build(kind)
    case_dir = REF_DIR / case
    model = build_model(case_dir, tmp_path)
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "--ggml", d, "xdiff", str(model), "--scenario",
                        str(case_dir / "scenario.json"), "--backends", f"cpu,{kind}", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"xdiff cpu vs {kind}: PASS" in p.stdout and "structure identical" in p.stdout, p.stdout
    assert "DIFFERS" not in p.stdout
    gdir = [x for x in (tmp_path / "x").iterdir() if x.name.startswith(kind)][0]
    nodes = json.loads(sorted(gdir.glob("*-block.json"))[0].read_text())["nodes"]
    # the dump says where each node ran: the GPU ran most of the block
    assert sum(1 for n in nodes if (n.get("backend") or "").lower().startswith(_PREFIX[kind])) > len(nodes) // 2
    return p.stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("be") / "tiny.gguf"
    make_model(p, "dflash", seed=4)
    return p


def test_unknown_backend(tiny):
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'"):
        Session(tiny, backend="tpu")


@pytest.mark.parametrize("kind", ["vulkan", "cuda", "metal"])
def test_missing_gpu_backend_says_how_to_get_it(tiny, kind):
    assert not has_backend(kind)  # the reference's ggml is a CPU build
    with pytest.raises(BackendUnavailable, match=f"tools/build_ggml.sh {kind}"):
        Session(tiny, backend=kind)


@pytest.mark.parametrize("case", GPU_CASES)
@pytest.mark.parametrize("kind", ["cuda", "metal"])
def test_gpu_backend_matches_cpu(kind, case, tmp_path):
    gpu_xdiff(kind, case, tmp_path)


def test_auto_falls_back_to_something_that_runs(tiny):
    with Session(tiny, backend="auto") as s:
        r = s.block([7, 255], 0)
        assert np.isfinite(r.logits).all()


def test_unreachable_rpc_server(tiny):
    need("rpc")
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]  # a port nothing listens on
    with pytest.raises(BackendUnavailable, match="cannot reach the ggml RPC server"):
        Session(tiny, backend=f"rpc://127.0.0.1:{port}")


def test_rpc_matches_cpu(rpc_server, tmp_path):
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, tmp_path)
    sc = load_scenario(case / "scenario.json")
    res = xdiff(model, sc, ["cpu", rpc_server], tmp_path / "x")
    assert res.ok, res.format_text()
    rpc_dump = sorted((tmp_path / "x").glob("rpc*"))[0]
    results = diff_paths(case, rpc_dump)
    assert all(not r.structural for r in results)


@pytest.mark.parametrize("case", GPU_CASES)
def test_vulkan_matches_cpu(case, tmp_path):
    gpu_xdiff("vulkan", case, tmp_path)


def test_xdiff_cli(tiny, tmp_path):
    sc = REF_DIR / "dflash-fa-off" / "scenario.json"
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "xdiff", str(tiny), "--scenario", str(sc),
                        "--backends", "cpu,cpu", "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "PASS" in p.stdout and "worst nmse 0" in p.stdout


def _perturbed_copy(src, dst, pick, change):
    """A copy of a dump folder whose block node `pick(nodes)` has its values changed by `change`."""
    shutil.copytree(src, dst)
    block = sorted(dst.glob("*-block.json"))[0]
    nodes = json.loads(block.read_text())["nodes"]
    idx = pick(nodes)
    npz = block.with_suffix(".npz")
    vals = dict(np.load(npz))
    vals[f"n{idx}"] = change(vals[f"n{idx}"])
    np.savez(npz, **vals)
    return nodes[idx]


def test_xdiff_bounds_catch_a_value_difference(tmp_path):
    """The yardstick itself: within a matmul's bound passes, past it fails at that node, and a
    top-k in another order with the same candidates passes."""
    from graphgen.compare.xdiff import compare_dirs
    case = REF_DIR / "dflash2-fa-off"
    model = build_model(case, tmp_path)
    cpu = tmp_path / "cpu"
    run_scenario(model, load_scenario(case / "scenario.json"), cpu)
    first_matmul = lambda nodes: next(i for i, n in enumerate(nodes) if n["op"] == "MUL_MAT")  # noqa: E731
    rng = np.random.default_rng(0)

    _perturbed_copy(cpu, tmp_path / "small", first_matmul,
                    lambda v: v * (1 + 1e-4 * rng.standard_normal(v.shape)).astype(v.dtype))
    assert compare_dirs(cpu, tmp_path / "small", ["cpu", "small"]).ok

    node = _perturbed_copy(cpu, tmp_path / "large", first_matmul,
                           lambda v: v * (1 + 1e-1 * rng.standard_normal(v.shape)).astype(v.dtype))
    res = compare_dirs(cpu, tmp_path / "large", ["cpu", "large"])
    assert not res.ok
    bad = [g["first_bad"] for g in res.graphs if g["first_bad"]]
    assert bad and bad[0]["name"] == node["name"] and bad[0]["op"] == "MUL_MAT"

    top_k = lambda nodes: next(i for i, n in enumerate(nodes) if n["op"] == "TOP_K")  # noqa: E731
    _perturbed_copy(cpu, tmp_path / "order", top_k, lambda v: v[..., ::-1].copy())
    res = compare_dirs(cpu, tmp_path / "order", ["cpu", "order"])
    assert res.ok and any(g["order_dependent"] for g in res.graphs)
