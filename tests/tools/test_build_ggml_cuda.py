"""tools/build_ggml.sh's CUDA recipe without a GPU, a toolkit or the network: the choice of toolkit
and of cuBLAS, and the CMake arguments a build would take (GRAPHGEN_GGML_CONFIGURE_ONLY on a stand-in
ggml source and a stand-in nvcc); and tools/gpu_check.sh's plan and usage."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "build_ggml.sh"
SRC = "xllamacpp-2026.10.11549-ggml"   # the source folder build_ggml.sh keeps in the cache

# an nvcc that answers only what the script asks of it before CMake: its toolkit folder
# (--dryrun's TOP line) and its version
FAKE_NVCC = """#!/bin/sh
case "$*" in
  *--dryrun*) echo "#\\$ TOP=$(cd "$(dirname "$0")/.." && pwd)" >&2 ;;
  *--version*) echo "Cuda compilation tools, release 13.0, V13.0.88" ;;
esac
"""
# a CMake project that takes any arguments and compiles nothing, standing in for ggml's source
FAKE_SOURCE = """cmake_minimum_required(VERSION 3.14)
project(stand_in NONE)
set(GGML_VERSION_MAJOR 0)
set(GGML_VERSION_MINOR 26)
set(GGML_VERSION_PATCH 0)
"""


def run(env_extra, *args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDAARCHS", "GGML_CUDA_ARCHITECTURES", "CUDACXX", "GRAPHGEN_CUDA_TOOLKIT",
                        "GRAPHGEN_CUDA_CUBLAS", "GRAPHGEN_GGML_CMAKE_ARGS")}
    env.update(env_extra)
    return subprocess.run(["bash", str(BUILD), *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=120)


@pytest.fixture
def toolkit(tmp_path):
    """A toolkit folder without cuBLAS (as the system's /usr/local/cuda may be), and a cache whose
    ggml source is the stand-in."""
    tk = tmp_path / "cuda"
    (tk / "bin").mkdir(parents=True)
    (tk / "include").mkdir()
    nvcc = tk / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    cache = tmp_path / "cache"
    (cache / "src" / SRC).mkdir(parents=True)
    (cache / "src" / SRC / "CMakeLists.txt").write_text(FAKE_SOURCE)
    return tk, cache


def pip_cublas(tmp_path):
    """A pip nvidia/cu13 folder: cuBLAS beside another CUDA runtime's headers."""
    d = tmp_path / "site" / "nvidia" / "cu13"
    (d / "include").mkdir(parents=True)
    (d / "lib").mkdir()
    for h in ("cublas_v2.h", "cublas_api.h", "cublasLt.h", "cuda_runtime.h", "cuda_fp16.h"):
        (d / "include" / h).write_text(f"/* {h} */\n")
    for lib in ("libcublas.so.13", "libcublasLt.so.13", "libcudart.so.13"):
        (d / "lib" / lib).write_bytes(b"")
    return d


def cache_entries(build_dir: Path) -> dict:
    out = {}
    for line in (build_dir / "CMakeCache.txt").read_text().splitlines():
        if "=" in line and not line.startswith(("//", "#")):
            k, v = line.split("=", 1)
            out[k.split(":")[0]] = v
    return out


def test_a_bad_variant_is_a_usage_error():
    r = run({}, "rocm")
    assert r.returncode == 2 and "usage: tools/build_ggml.sh" in r.stderr and r.stdout == ""


def test_a_toolkit_folder_without_nvcc_is_refused(tmp_path):
    r = run({"GRAPHGEN_CACHE": str(tmp_path / "cache"), "GRAPHGEN_CUDA_TOOLKIT": str(tmp_path / "none")}, "cuda")
    assert r.returncode == 1 and "has no bin/nvcc" in r.stderr and r.stdout == ""


def test_a_toolkit_without_cublas_says_where_to_get_it(toolkit):
    tk, cache = toolkit
    r = run({"GRAPHGEN_CACHE": str(cache), "GRAPHGEN_CUDA_TOOLKIT": str(tk)}, "cuda")
    assert r.returncode == 1 and r.stdout == ""
    assert f"the CUDA toolkit in {tk} has no cuBLAS: set GRAPHGEN_CUDA_CUBLAS" in r.stderr


def test_the_recipe_with_cublas_from_a_pip_folder(toolkit, tmp_path):
    tk, cache = toolkit
    cublas = pip_cublas(tmp_path)
    b = tmp_path / "b"
    r = run({"GRAPHGEN_CACHE": str(cache), "GRAPHGEN_CUDA_TOOLKIT": str(tk), "GRAPHGEN_CUDA_CUBLAS": str(cublas),
             "CUDAARCHS": "90-real", "GRAPHGEN_GGML_CONFIGURE_ONLY": str(b)}, "cuda")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(b)
    c = cache_entries(b)
    assert c["GGML_CUDA"] == "ON" and c["GGML_CUDA_NO_VMM"] == "ON"  # no libcuda at link or load time
    assert c["GGML_CUDA_NCCL"] == "OFF" and c["GGML_CUDA_FA_ALL_QUANTS"] == "OFF"
    assert c["CMAKE_CUDA_ARCHITECTURES"] == "90-real"
    assert c["CMAKE_CUDA_COMPILER"] == str(tk / "bin" / "nvcc") and c["CUDAToolkit_ROOT"] == str(tk)
    # cuBLAS's headers alone: the pip folder's CUDA runtime headers must not shadow the compiler's
    farm = Path(c["CMAKE_CUDA_FLAGS"].removeprefix("-I")).parent
    assert sorted(p.name for p in (farm / "include").iterdir()) == ["cublasLt.h", "cublas_api.h", "cublas_v2.h"]
    assert c["CUDA_cublas_LIBRARY"] == str(farm / "lib" / "libcublas.so")
    assert os.path.realpath(farm / "lib" / "libcublas.so") == str(cublas / "lib" / "libcublas.so.13")
    env = (b / "toolkit.env").read_text()
    assert f"cuda_root={tk}" in env and f"cuda_runtime_path={farm / 'lib'}" in env


def test_architectures_come_from_cudaarchs_then_ggml_cuda_architectures(toolkit, tmp_path):
    tk, cache = toolkit
    cublas = pip_cublas(tmp_path)
    base = {"GRAPHGEN_CACHE": str(cache), "GRAPHGEN_CUDA_TOOLKIT": str(tk), "GRAPHGEN_CUDA_CUBLAS": str(cublas)}
    r = run({**base, "GGML_CUDA_ARCHITECTURES": "86-real", "GRAPHGEN_GGML_CONFIGURE_ONLY": str(tmp_path / "a")}, "cuda")
    assert r.returncode == 0, r.stderr
    assert cache_entries(tmp_path / "a")["CMAKE_CUDA_ARCHITECTURES"] == "86-real"
    r = run({**base, "GGML_CUDA_ARCHITECTURES": "86-real", "CUDAARCHS": "89-real;90-real",
             "GRAPHGEN_GGML_CONFIGURE_ONLY": str(tmp_path / "b")}, "cuda")
    assert r.returncode == 0, r.stderr
    assert cache_entries(tmp_path / "b")["CMAKE_CUDA_ARCHITECTURES"] == "89-real;90-real"


def test_gpu_check_plan_and_usage():
    script = ROOT / "tools" / "gpu_check.sh"
    r = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage: tools/gpu_check.sh" in r.stderr
    r = subprocess.run(["bash", str(script), "--dry-run", "--cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    steps = [ln.split("]")[0].lstrip("[") for ln in r.stdout.splitlines() if ln.startswith("[")]
    xdiffs = [s for s in steps if s.startswith("xdiff ")]
    assert len(xdiffs) == 20 and {s.split()[1] for s in xdiffs} == {"dflash", "dflash2", "dspark", "lilicorr"}
    assert {s.split()[2] for s in xdiffs} == {"base", "dsv4", "dsv41", "mistral-large4"}
    assert {"devices", "check-batch", "target", "loop -devd CPU", "bench CPU"} <= set(steps)
