"""graphgen/cli/backend.py: `graphgen devices` (the ggml in use, its backends and devices), `graphgen
xdiff` (one scenario on two devices, compared; where the dumps go) and `graphgen rpc-server`'s
announcement and warning."""

import json
import signal
import tempfile

import pytest

from graphgen.runtime.backends import devices, has_backend

KINDS = ("cpu", "vulkan", "cuda", "metal", "rpc")


def test_devices_json_lists_the_backends_and_devices(cli):
    r = cli("devices", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["backends"] == {k: has_backend(k) for k in KINDS} and doc["backends"]["cpu"] is True
    assert [d["name"] for d in doc["devices"]] == [d.name for d in devices()]
    assert {"version", "dir", "origin"} <= set(doc["ggml"])


def test_devices_text(cli):
    r = cli("devices")
    lines = r.out.splitlines()
    assert lines[0].startswith("ggml ") and lines[1] == "backends in this ggml build:"
    for k in KINDS:
        line = next(ln for ln in lines if ln.startswith(f"  {k} "))
        assert line.split()[1] == ("yes" if has_backend(k) else "no")
        if not has_backend(k) and k in ("vulkan", "cuda", "metal"):
            assert f"tools/build_ggml.sh {k}" in line  # how to get it
    cpu = next(ln for ln in lines[lines.index("devices (llama.cpp's names, as -dev takes them):"):]
               if ln.split()[:2] == ["CPU", "cpu"])
    assert "MiB free of" in cpu


@pytest.fixture
def tmp_dir(tmp_path, monkeypatch):
    """The system's temporary folder, for xdiff's own."""
    t = tmp_path / "tmp"
    t.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(t))
    return t


def test_xdiff_the_same_device_twice_passes(cli, tiny, tmp_dir):
    r = cli("xdiff", tiny, "-dev", "CPU,cpu", "--json", "--quiet")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["ok"] is True and [g["graph"] for g in doc["graphs"]] == ["inject", "block"]
    assert list(tmp_dir.iterdir()) == []  # the temporary dumps went once compared
    r = cli("xdiff", tiny, "-dev", "CPU,CPU", "--quiet")
    assert r.code == 0 and r.out.startswith("xdiff cpu vs cpu: PASS")


def test_xdiff_keeps_its_dumps_where_asked(cli, tiny, tmp_dir, tmp_path):
    r = cli("xdiff", tiny, "-dev", "CPU,CPU", "--keep")
    assert r.code == 0, r.err
    (kept,) = tmp_dir.iterdir()
    assert r.err.strip().splitlines()[-1] == f"graphgen: the dumps of both runs are in {kept}"
    assert sorted(p.name for p in kept.iterdir()) == ["cpu", "cpu-2"]
    out = tmp_path / "x"
    r = cli("xdiff", tiny, "-dev", "CPU,CPU", "--out", out, "--prompt", 5, "--steps", 2)
    assert r.code == 0 and "dumps of both runs" not in r.err
    assert sorted(p.name for p in (out / "cpu").glob("*.json")) == ["00-inject.json", "01-block.json",
                                                                  "02-inject.json", "03-block.json"]


def test_xdiff_refusals(cli, tiny, tmp_dir, tmp_path):
    r = cli("xdiff", tiny)
    assert r.code == 2 and "xdiff compares two devices: give them with -dev A,B (e.g. -dev CPU,Vulkan0)" in r.err
    for bad in ("-1", "x"):
        r = cli("xdiff", tiny, "-dev", "CPU,CPU", f"--nmse={bad}")
        assert r.code == 2 and "argument --nmse: " in r.err
    r = cli("xdiff", tiny, "-dev", "CPU,CPU", "-ctv", "q8_0")
    assert r.code == 2 and "a quantized V cache requires flash attention" in r.err
    if not has_backend("vulkan"):
        r = cli("xdiff", tiny, "-dev", "CPU,Vulkan0", "--out", tmp_path / "x")
        assert r.code == 2 and "no vulkan backend" in r.err and not (tmp_path / "x").exists()
    assert list(tmp_dir.iterdir()) == []


@pytest.fixture
def served(monkeypatch):
    """rpc-server's arguments to ggml's server, which is not started; its signal settings recorded."""
    import graphgen.runtime.backends as B
    seen = {}

    def serve(host, port, threads, backend, on_ready=None):
        seen.update(host=host, port=port, threads=threads, backend=backend)
        on_ready()
    monkeypatch.setattr(B, "start_rpc_server", serve)
    sigs = {}
    monkeypatch.setattr(signal, "signal", lambda s, h: sigs.__setitem__(s, h))
    seen["signals"] = sigs
    return seen


def test_rpc_server_announces_what_it_serves(cli, served):
    r = cli("rpc-server", "-p", 50999, "-t", 3, "-dev", "Vulkan0")
    assert r.code == 0 and r.err == "ggml RPC server on 127.0.0.1:50999 (Vulkan0), Ctrl-C to stop\n"
    assert (served["host"], served["port"], served["threads"], served["backend"]) == ("127.0.0.1", 50999, 3,
                                                                                      "vulkan:0")
    # it serves inside ggml, where no Python handler runs: the signals end it at once
    assert served["signals"][signal.SIGINT] == signal.SIG_DFL and served["signals"][signal.SIGTERM] == signal.SIG_DFL


def test_rpc_server_warns_off_the_loopback(cli, served):
    r = cli("rpc-server", "-H", "0.0.0.0")
    assert r.err.splitlines() == ["graphgen: warning: serving on 0.0.0.0; the RPC protocol has no authentication",
                                  "ggml RPC server on 0.0.0.0:50052 (cpu), Ctrl-C to stop"]
    for host in ("localhost", "::1"):
        assert "warning" not in cli("rpc-server", "-H", host).err
