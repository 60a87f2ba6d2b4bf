"""`graphgen devices` with a ggml that has the CUDA backend but no CUDA device here (a CUDA build
made and loaded on a machine without an NVIDIA GPU or driver): the backend is said to be built in
and the missing device is named, with the reason, and the command succeeds."""

import ctypes
import json
import re

import pytest

from graphgen.runtime import backends


@pytest.fixture
def cuda_built_no_driver(monkeypatch):
    """The loaded ggml claims the CUDA backend; the machine has no driver library."""
    real_has, real_cdll = backends.has_backend, ctypes.CDLL

    def has_backend(kind):
        return kind == "cuda" or real_has(kind)

    def cdll(name, *a, **kw):
        if str(name).startswith("libcuda.so"):
            raise OSError(f"{name}: cannot open shared object file")
        return real_cdll(name, *a, **kw)

    monkeypatch.setattr(backends, "has_backend", has_backend)
    monkeypatch.setattr(ctypes, "CDLL", cdll)


def test_cuda_built_without_a_device_is_said_and_not_an_error(cli, cuda_built_no_driver):
    r = cli("devices")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    cuda = next(ln for ln in lines if ln.startswith("  cuda "))
    assert cuda.split()[1] == "yes"
    assert "built in, but no cuda device here: no NVIDIA driver on this machine (libcuda.so.1 not found)" in cuda
    devs = lines[lines.index("devices (llama.cpp's names, as -dev takes them):") + 1:]
    assert not any(ln.strip().startswith("CUDA") for ln in devs)
    assert devs[-1] == "  (no cuda devices: no NVIDIA driver on this machine (libcuda.so.1 not found); the backend is built in)"


def test_cuda_built_without_a_device_in_json(cli, cuda_built_no_driver):
    r = cli("devices", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["backends"]["cuda"] is True
    assert doc["backends_without_device"] == {"cuda": "no NVIDIA driver on this machine (libcuda.so.1 not found)"}


def test_a_cuda_device_present_is_listed_plainly(cli, monkeypatch):
    real_has, real_devices = backends.has_backend, backends.devices
    monkeypatch.setattr(backends, "has_backend", lambda kind: kind == "cuda" or real_has(kind))
    monkeypatch.setattr(backends, "devices", lambda: real_devices() + [
        backends.Device("CUDA0", "NVIDIA H200", "gpu", 140 << 30, 141 << 30, "the device (ggml_backend_dev_memory)")])
    r = cli("devices")
    assert r.code == 0, r.err
    assert next(ln for ln in r.out.splitlines() if ln.startswith("  cuda ")).split()[1:] == ["yes"]
    assert any(ln.split()[:2] == ["CUDA0", "gpu"] for ln in r.out.splitlines())
    assert "no cuda device" not in r.out


def test_bindings_import_over_a_cuda_library_lacking_some_of_their_functions(tmp_path):
    """ggml-python binds ggml_backend_cuda_split_buffer_type and ggml_backend_cuda_allreduce_tensor
    whenever the library has the CUDA backend; b11549's ggml-cuda has neither. A folder of stand-in
    libraries (every function graphgen needs, and a CUDA library without those two) must import."""
    import shutil
    import subprocess
    import sys

    from graphgen.ops import runtime
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None, "a C compiler is needed to build the stand-in libraries"
    text = (runtime.active().package_dir / "ggml.py").read_text()
    backend = ("cuda", "_vk_", "vulkan", "metal", "sycl", "kompute", "cann", "blas", "opencl")
    found = re.findall(r'@ggml_function\(\s*"(\w+)"', text) + re.findall(r"\blib\.(ggml_\w+)", text)
    names = sorted({n for n in found if not any(b in n for b in backend)})
    names += list(runtime.FUSED_FUNCTIONS)
    base = tmp_path / "base.c"
    base.write_text('const char * ggml_version(void) { return "0.0.1"; }\n'
                    + "\n".join(f"void {n}(void) {{}}" for n in sorted(set(names)) if n != "ggml_version") + "\n")
    cuda = tmp_path / "cuda.c"
    cuda.write_text("\n".join(f"void ggml_backend_cuda_{n}(void) {{}}" for n in
                              ("init", "buffer_type", "host_buffer_type", "get_device_count", "reg",
                               "get_device_description", "get_device_memory", "register_host_buffer",
                               "unregister_host_buffer")) + "\nvoid ggml_backend_is_cuda(void) {}\n")
    for lib, src in (("ggml", base), ("ggml-base", base), ("ggml-cpu", base), ("ggml-cuda", cuda)):
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / f"lib{lib}.so"), str(src)], check=True)
    code = ("from graphgen.ops import runtime; import sys; runtime.choose(sys.argv[1]); runtime.activate(); "
            "import ggml; print(ggml.GGML_USE_CUDA, ggml.GGML_USE_VULKAN)")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "False"]
