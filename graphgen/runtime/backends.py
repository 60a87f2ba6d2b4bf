"""ggml backends: which ones the loaded ggml has, and opening one from a spec string.

Specs: ``cpu``, ``vulkan`` / ``vulkan:N``, ``cuda`` / ``cuda:N``, ``metal``, ``rpc://HOST:PORT``,
``auto`` (the first GPU device, else the CPU). A backend that is requested but missing raises
BackendUnavailable saying how to get it; nothing here may abort the interpreter, so every probe
that ggml would assert on is checked first.
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass

from ..errors import GraphgenError
from ..ops import ggml as G

DEV_TYPE = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}

BUILD_HINT = {
    "vulkan": "--ggml $(tools/build_ggml.sh vulkan) (needs glslc, libvulkan-dev and a Vulkan driver, "
              "e.g. mesa-vulkan-drivers)",
    "cuda": "--ggml $(tools/build_ggml.sh cuda) (builds without a GPU, from PyPI's CUDA toolkit when the "
            "system has none; running needs an NVIDIA GPU and its driver)",
    "metal": "--ggml $(tools/build_ggml.sh metal) (macOS on Apple silicon)",
    "rpc": "--ggml pointing at a ggml build with RPC (tools/build_ggml.sh builds it in)",
}


class BackendUnavailable(GraphgenError, RuntimeError):
    """The requested backend is not built in, has no device, or cannot be reached."""


@dataclass
class Device:
    name: str
    description: str
    kind: str
    memory_free: int | None = None   # bytes: the device's report; for the CPU, the host's MemAvailable
    memory_total: int | None = None
    memory_free_source: str | None = None   # where memory_free comes from


def _fn(name: str):
    fn = getattr(G.lib, name, None)
    return fn


def has_backend(kind: str) -> bool:
    probe = {"vulkan": "ggml_backend_vk_init", "cuda": "ggml_backend_cuda_init",
             "metal": "ggml_backend_metal_init", "rpc": "ggml_backend_rpc_init"}.get(kind)
    return kind == "cpu" or (probe is not None and _fn(probe) is not None)


def _vk_count() -> int:
    # ggml-vulkan skips CPU-type devices (lavapipe) unless they are made visible
    os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    fn = _fn("ggml_backend_vk_get_device_count")
    fn.restype = ctypes.c_int
    return int(fn())


MEMINFO = "/proc/meminfo"


def host_available(path: str = MEMINFO) -> int | None:
    """The host's available memory in bytes (MemAvailable: free pages plus what the kernel can
    reclaim without swapping), or None where the file or the field is missing."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def devices() -> list[Device]:
    """Every device of the compiled-in backends, as ggml's device registry lists them. ggml's CPU
    device reports the host's total memory as its free memory (ggml-cpu: "free system memory is
    ill-defined ... assume that all of it is free"), so the CPU's free memory is read from
    /proc/meminfo's MemAvailable instead, where there is one."""
    if has_backend("vulkan"):
        _vk_count()
    out = []
    n = G.ggml_backend_dev_count()
    for i in range(n):
        d = G.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        G.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        dev = Device(G.ggml_backend_dev_name(d).decode(), G.ggml_backend_dev_description(d).decode(),
                     DEV_TYPE.get(G.ggml_backend_dev_type(d), "?"),
                     int(free.value) if total.value else None, int(total.value) or None)
        if dev.memory_total:
            dev.memory_free_source = "the device (ggml_backend_dev_memory)"
            if dev.kind == "cpu":
                avail = host_available()
                if avail is not None:
                    dev.memory_free, dev.memory_free_source = min(avail, dev.memory_total), f"MemAvailable in {MEMINFO}"
                else:
                    dev.memory_free_source = "ggml, which reports the CPU's total memory as free"
        out.append(dev)
    return out


def _check_rpc_endpoint(endpoint: str, timeout: float = 2.0):
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise BackendUnavailable(f"rpc endpoint {endpoint!r} must be HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise BackendUnavailable(f"cannot reach the ggml RPC server at {endpoint} ({e}); start one with "
                                 f"graphgen rpc-server --host {host} --port {port}") from None


def open_backend(spec: str, n_threads: int = 1):
    """Return (backend pointer, canonical name)."""
    spec = (spec or "cpu").strip()
    if spec == "auto":
        for kind in ("cuda", "metal", "vulkan"):
            if has_backend(kind):
                try:
                    return open_backend(kind, n_threads)
                except BackendUnavailable:
                    continue
        spec = "cpu"
    kind, _, arg = spec.partition(":")
    if spec.startswith("rpc://"):
        kind, arg = "rpc", spec[len("rpc://"):]
    if kind == "cpu":
        b = G.ggml_backend_cpu_init()
        G.ggml_backend_cpu_set_n_threads(b, n_threads)
        return b, "CPU"
    if kind not in BUILD_HINT:
        raise BackendUnavailable(f"unknown backend {spec!r}: use cpu, vulkan[:N], cuda[:N], metal, rpc://HOST:PORT or auto")
    if not has_backend(kind):
        raise BackendUnavailable(f"the loaded ggml ({G.RUNTIME.lib_dir}) has no {kind} backend: run with {BUILD_HINT[kind]}")
    if kind == "rpc":
        _check_rpc_endpoint(arg)
        fn = _fn("ggml_backend_rpc_init")
        fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_uint32]
        b = fn(arg.encode(), 0)
        if not b:
            raise BackendUnavailable(f"the ggml RPC server at {arg} did not accept a connection")
        return b, f"RPC[{arg}]"
    index = int(arg) if arg.isdigit() else 0
    if kind == "vulkan":
        count = _vk_count()
        if index >= count:
            raise BackendUnavailable(f"no Vulkan device {index} ({count} found); install a Vulkan driver "
                                     "(mesa-vulkan-drivers provides lavapipe) or set GGML_VK_VISIBLE_DEVICES")
        fn = _fn("ggml_backend_vk_init")
        fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        b = fn(index)
        name = f"Vulkan{index}"
    elif kind == "cuda":
        cnt = _fn("ggml_backend_cuda_get_device_count")
        cnt.restype = ctypes.c_int
        if index >= int(cnt()):
            raise BackendUnavailable(f"no CUDA device {index} ({int(cnt())} found)")
        fn = _fn("ggml_backend_cuda_init")
        fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_int]
        b = fn(index)
        name = f"CUDA{index}"
    else:
        fn = _fn("ggml_backend_metal_init")
        fn.restype = ctypes.c_void_p
        b = fn()
        name = "Metal"
    if not b:
        raise BackendUnavailable(f"the {kind} backend could not be initialised")
    return b, name


def backend_name(b) -> str:
    return G.ggml_backend_name(b).decode()


def start_rpc_server(host: str, port: int, n_threads: int = 1, backend: str = "cpu", on_ready=None):
    """Serve a ggml backend over RPC (blocks); loopback is the only sane host for tests.

    Everything ggml would fail on is checked first (RPC built in, the device, the address free),
    since ggml's server prints its failure and returns as if it had served; `on_ready()` runs
    once the checks pass, just before serving."""
    if not has_backend("rpc"):
        raise BackendUnavailable(f"the loaded ggml ({G.RUNTIME.lib_dir}) has no RPC support: run with {BUILD_HINT['rpc']}")
    kind = backend.split(":")[0]
    dev = None
    for i in range(G.ggml_backend_dev_count()):
        d = G.ggml_backend_dev_get(i)
        name = G.ggml_backend_dev_name(d).decode().lower()
        if (kind == "cpu" and name.startswith("cpu")) or (kind != "cpu" and name.startswith(kind[:3])):
            dev = d
            break
    if dev is None:
        raise BackendUnavailable(f"no {backend} device to serve over RPC")
    if not 0 < port < 65536:
        raise BackendUnavailable(f"port {port} is not a TCP port (1-65535)")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        raise BackendUnavailable(f"cannot serve on {host}:{port}: {e.strerror or e}") from None
    if on_ready is not None:
        on_ready()
    fn = _fn("ggml_backend_rpc_start_server")
    fn.restype = None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    devs = (ctypes.c_void_p * 1)(dev)
    fn(f"{host}:{port}".encode(), None, n_threads, 1, devs)
