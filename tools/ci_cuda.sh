#!/usr/bin/env bash
# CI's check of the CUDA recipe of tools/build_ggml.sh, without the whole build (19 minutes on 2
# cores for one architecture): the build is configured with build_ggml.sh's own arguments
# (GRAPHGEN_GGML_CONFIGURE_ONLY) and NVIDIA's PyPI toolkit, then three of its files are compiled
# for sm_90 with the generated rules: the backend's main file (ggml-cuda.cu, the one that calls
# the CUDA runtime, cuBLAS and, without GGML_CUDA_NO_VMM, the driver), one matrix-multiplication
# (mmq) instance and one flash-attention instance, among the cheapest of each kind. Then:
#   - the compiled objects must call no driver function (cu*): the recipe builds with
#     GGML_CUDA_NO_VMM=ON so that the library needs no libcuda.so.1, at link time or at load time;
#   - a small shared library that calls the CUDA runtime and cuBLAS is linked with -Wl,--no-undefined
#     against the toolkit's libraries, must not list libcuda among its needs, and must load here
#     and answer (no device, on a machine without a GPU) rather than fail to load.
# Everything it needs it installs: the PyPI toolkit into $GRAPHGEN_CACHE/cuda-toolkit-* (~1.1 GB,
# once), cmake through pip when the system has none (or one older than 3.18), the ggml source
# through build_ggml.sh.
#
# Measured on 2 cores (nice 19), from a cache without the toolkit: 45 s in all, 36 s of it the
# three compiles, with the wheels in pip's own cache; 131 s while another build shared the cores
# (and with cmake installed through pip). The first download of the 1.1 GB of wheels comes on
# top. Exit status: 0 when every step passed, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "ci_cuda: $*" >&2; }
die() { echo "ci_cuda: error: $*" >&2; exit 1; }

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -n "${VIRTUAL_ENV:-}" ]; then PY="$VIRTUAL_ENV/bin/python"
  elif [ -x .venv/bin/python ]; then PY="$PWD/.venv/bin/python"
  else PY=python3; fi
fi
export PYTHON=$PY
cache=${GRAPHGEN_CACHE:-$HOME/.cache/graphgen}
mkdir -p "$cache" && cache=$(cd "$cache" && pwd)
start=$(date +%s)

# cmake >= 3.18 (CMAKE_CUDA_ARCHITECTURES); pip's cmake goes into the cache, not the environment
cmake_ok() { command -v cmake >/dev/null && "$PY" - "$(cmake --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')" <<'EOF'
import sys
v = tuple(int(x) for x in (sys.argv[1] or "0").split(".")[:2])
sys.exit(0 if v >= (3, 18) else 1)
EOF
}
if ! cmake_ok; then
  tools="$cache/ci-tools"
  if [ ! -x "$tools/bin/cmake" ]; then
    log "installing cmake with pip into $tools"
    "$PY" -m pip install -q --disable-pip-version-check --only-binary=:all: --target "$tools/site" "cmake==3.31.6" >&2 \
      || die "pip install cmake failed"
    mkdir -p "$tools/bin"
    ln -sf "$tools/site/cmake/data/bin/cmake" "$tools/bin/cmake"
  fi
  PATH="$tools/bin:$PATH"
  cmake_ok || die "no usable cmake (>= 3.18)"
fi
command -v make >/dev/null || die "make not found"

work=$(mktemp -d "${TMPDIR:-/tmp}/ci_cuda.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- configure with build_ggml.sh's own arguments ----------------------------------------------
log "configuring the CUDA build (tools/build_ggml.sh cuda, PyPI toolkit, sm_90)"
dir=$(GRAPHGEN_CUDA_TOOLKIT=pypi CUDAARCHS=90-real GRAPHGEN_GGML_CONFIGURE_ONLY="$work/build" \
      bash tools/build_ggml.sh cuda) || die "tools/build_ggml.sh cuda could not configure the build"
# shellcheck disable=SC1091
. "$dir/toolkit.env"
grep -q '^GGML_CUDA_NO_VMM:BOOL=ON' "$dir/CMakeCache.txt" || die "the recipe no longer sets GGML_CUDA_NO_VMM=ON"
log "configured in $(( $(date +%s) - start )) s: nvcc $("$cuda_nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), archs $cuda_archs"

# --- compile three of its files with the generated rules ------------------------------------------
# among the cheapest of each kind on sm_90 (about 20 and 10 s of the build here): q8_0's mmq
# instance and the tile flash attention for heads of 64, the size the GPU check's drafts use
files=(ggml-cuda.cu template-instances/mmq-instance-q8_0.cu template-instances/fattn-tile-instance-dkq64-dv64.cu)
objs=()
for f in "${files[@]}"; do
  [ -f "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$dir/CMakeCache.txt")/src/ggml-cuda/$f" ] \
    || die "ggml-cuda has no $f any more: pick another file of its kind"
  objs+=("$f.o")
done
t0=$(date +%s)
log "compiling ${files[*]}"
make -C "$dir/src/ggml-cuda" -j"$(nproc 2>/dev/null || echo 2)" "${objs[@]}" > "$work/compile.log" 2>&1 \
  || { tail -n 40 "$work/compile.log" >&2; die "compiling ggml-cuda's files failed"; }
log "compiled in $(( $(date +%s) - t0 )) s"

# --- no driver calls, and the link against the toolkit -------------------------------------------
od="$dir/src/ggml-cuda/CMakeFiles/ggml-cuda.dir"
for f in "${files[@]}"; do
  o="$od/$f.o"
  [ -s "$o" ] || die "no object $o"
  # grep reads all of readelf's output (with -q it would stop early, and pipefail would take
  # readelf's broken pipe for a failure)
  readelf -S "$o" | grep '\.nv_fatbin' >/dev/null || die "$f.o holds no device code"
  drv=$(nm -u "$o" | awk '{print $2}' | grep -E '^cu[A-Z]' | paste -sd' ' || true)
  [ -z "$drv" ] || die "$f.o calls the driver ($drv): the library would need libcuda.so.1"
done
cat > "$work/probe.cu" <<'EOF'
#include <cuda_runtime.h>
#include <cublas_v2.h>
__global__ void probe_kernel(float *x) { x[threadIdx.x] *= 2.0f; }
// the device count, or minus the CUDA runtime's error code when it has none to give
extern "C" int probe_devices(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) return -(int) err;
    cublasHandle_t h;
    if (n > 0 && cublasCreate(&h) == CUBLAS_STATUS_SUCCESS) cublasDestroy(h);
    return n;
}
extern "C" void probe_launch(float *x) { probe_kernel<<<1, 1>>>(x); }
EOF
cudalib="$cuda_root/lib"
"$cuda_nvcc" -arch=sm_90 -Xcompiler -fPIC -shared -o "$work/libprobe.so" "$work/probe.cu" \
    -Xlinker --no-undefined -L"$cudalib" -lcudart -lcublas > "$work/link.log" 2>&1 \
  || { cat "$work/link.log" >&2; die "linking a library against the toolkit's runtime and cuBLAS failed"; }
needed=$(readelf -d "$work/libprobe.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd' ')
case " $needed " in *" libcuda.so"*) die "the probe library needs the driver: $needed" ;; esac
case " $needed " in *" libcublas.so"*) ;; *) die "the probe library does not need cuBLAS: $needed" ;; esac
answer=$(LD_LIBRARY_PATH="$cuda_runtime_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PY" - "$work/libprobe.so" <<'EOF'
import ctypes, sys
print(ctypes.CDLL(sys.argv[1]).probe_devices())
EOF
) || die "the probe library does not load"
if [ "$answer" -lt 0 ]; then
  log "the probe loads without a driver and reports no device (CUDA runtime error $(( -answer )))"
else
  log "the probe loads and sees $answer CUDA device(s)"
fi
log "passed in $(( $(date +%s) - start )) s"
