"""Backends: selection and clear errors, RPC through a local server, Vulkan (lavapipe) vs CPU.

CI builds ggml-python with Vulkan and RPC (tools/build_ggml.sh vulkan --rpc) and sets
GRAPHGEN_REQUIRE_VULKAN=1, so the Vulkan and RPC tests run there instead of skipping.
"""

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.diff import diff_paths
from graphgen.runtime.backends import BackendUnavailable, has_backend, open_backend
from graphgen.runtime.session import Session
from graphgen.scenario import load_scenario
from graphgen.synth import make_model
from graphgen.xdiff import xdiff
from make_references import build_model

REQUIRE = os.environ.get("GRAPHGEN_REQUIRE_VULKAN") == "1"


def need(kind):
    if not has_backend(kind):
        if REQUIRE and kind in ("vulkan", "rpc"):
            pytest.fail(f"GRAPHGEN_REQUIRE_VULKAN=1 but ggml-python has no {kind} backend")
        pytest.skip(f"ggml-python built without {kind}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("be") / "tiny.gguf"
    make_model(p, "dflash", seed=4)
    return p


def test_unknown_backend(tiny):
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'"):
        Session(tiny, backend="tpu")


@pytest.mark.parametrize("kind", ["cuda", "metal"])
def test_missing_gpu_backend_says_how_to_get_it(tiny, kind):
    if has_backend(kind):
        pytest.skip(f"{kind} is built in: exercised by test_gpu_backend_matches_cpu")
    with pytest.raises(BackendUnavailable, match=f"tools/build_ggml.sh {kind}"):
        Session(tiny, backend=kind)


@pytest.mark.parametrize("kind", ["cuda", "metal"])
def test_gpu_backend_matches_cpu(tiny, kind, tmp_path):
    need(kind)
    try:
        open_backend(kind)
    except BackendUnavailable as e:
        pytest.skip(str(e))
    case = REF_DIR / "dflash-fa-off"
    sc = load_scenario(case / "scenario.json")
    res = xdiff(build_model(case, tmp_path), sc, ["cpu", kind], tmp_path / "x")
    assert res.ok, res.format_text()


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


@pytest.fixture
def rpc_server():
    need("rpc")
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "graphgen.cli", "rpc-server", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("rpc-server exited: " + proc.stderr.read().decode()[-500:])
            time.sleep(0.2)
    yield f"rpc://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_rpc_matches_cpu(rpc_server, tmp_path):
    case = REF_DIR / "dflash-fa-off"
    model = build_model(case, tmp_path)
    sc = load_scenario(case / "scenario.json")
    res = xdiff(model, sc, ["cpu", rpc_server], tmp_path / "x")
    assert res.ok, res.format_text()
    rpc_dump = sorted((tmp_path / "x").glob("rpc*"))[0]
    results = diff_paths(case, rpc_dump)
    assert all(not r.structural for r in results)


@pytest.mark.parametrize("case", ["dflash-fa-off", "dflash-fa-on", "dflash2-fa-off"])
def test_vulkan_matches_cpu(case, tmp_path):
    need("vulkan")
    try:
        open_backend("vulkan")
    except BackendUnavailable as e:
        if REQUIRE:
            pytest.fail(str(e))
        pytest.skip(str(e))
    case_dir = REF_DIR / case
    model = build_model(case_dir, tmp_path)
    sc = load_scenario(case_dir / "scenario.json")
    res = xdiff(model, sc, ["cpu", "vulkan"], tmp_path / "x")
    assert res.ok, res.format_text()
    # the dump says where each node ran
    vk = [d for d in (tmp_path / "x").iterdir() if d.name.startswith("vulkan")][0]
    import json
    nodes = json.loads(sorted(vk.glob("*-block.json"))[0].read_text())["nodes"]
    assert any((n.get("backend") or "").startswith("Vulkan") for n in nodes)


def test_xdiff_cli(tiny, tmp_path):
    sc = REF_DIR / "dflash-fa-off" / "scenario.json"
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "xdiff", str(tiny), "--scenario", str(sc),
                        "--backends", "cpu,cpu", "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "PASS" in p.stdout and "worst nmse 0" in p.stdout
