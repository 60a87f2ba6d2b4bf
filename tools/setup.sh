#!/usr/bin/env bash
# Install graphgen with ggml-python built for the reference's CPU flags, then run one job:
#   tools/setup.sh demo   -> graphgen demo
#   tools/setup.sh test   -> the test suite (pytest)
# ggml-python is (re)built by tools/build_ggml.sh only when the installed build lacks the
# reference's CPU flags (AVX/AVX2/FMA/F16C/BMI2, llamafile on, AVX512 off) or a wanted backend.
# GRAPHGEN_GGML picks the extra backend: cpu (default), vulkan (CI's default), cuda or metal;
# RPC is always built in.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
job=${1:-test}; shift || true
if [ "${CI:-}" = "true" ]; then variant=${GRAPHGEN_GGML:-vulkan}; else variant=${GRAPHGEN_GGML:-cpu}; fi

ggml_ok() {
  "$PY" - "$1" <<'PYEOF' 2>/dev/null
import ctypes, os, sys
import ggml
from importlib.metadata import version
d = os.path.join(os.path.dirname(ggml.__file__), "lib")
cpu = ctypes.CDLL(os.path.join(d, "libggml-cpu.so"))
has = lambda f: bool(getattr(cpu, "ggml_cpu_has_" + f)())
want = {"avx2": True, "fma": True, "f16c": True, "avx512": False, "llamafile": True}
probe = {"cpu": [], "vulkan": ["ggml_backend_vk_init"], "cuda": ["ggml_backend_cuda_init"],
         "metal": ["ggml_backend_metal_init"]}[sys.argv[1]] + ["ggml_backend_rpc_init"]
ok = version("ggml-python") == "0.0.45" and all(has(k) == v for k, v in want.items())
ok = ok and all(hasattr(ggml.lib, f) for f in probe)
sys.exit(0 if ok else 1)
PYEOF
}

if ! ggml_ok "$variant"; then
  if ! bash tools/build_ggml.sh "$variant" --rpc; then
    [ "$variant" = cpu ] && exit 1
    echo "graphgen: the $variant build of ggml-python failed; falling back to the CPU build" >&2
    variant=cpu
    bash tools/build_ggml.sh cpu --rpc
  fi
fi
# what the installed build has, for the tests that must then run rather than skip
if [ "$variant" = vulkan ] && ggml_ok vulkan; then export GRAPHGEN_REQUIRE_VULKAN=1; fi
"$PY" -m pip install -q -e '.[reference,test]'
# CI also installs what the viewer tests drive (Graphviz, Chromium, Model Explorer), so they run
# rather than skip; elsewhere those tests skip when the tools are absent.
if [ "${CI:-}" = "true" ] && command -v apt-get >/dev/null; then
  { command -v dot >/dev/null && command -v chromium >/dev/null; } ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz chromium >/dev/null; } ||
    echo "could not install graphviz/chromium; their tests will skip" >&2
  "$PY" -m pip install -q -e '.[explorer]' || echo "could not install the explorer extra; its test will skip" >&2
fi

case "$job" in
  demo) exec graphgen demo "$@" ;;
  test) exec "$PY" -m pytest -q "$@" ;;
  install) ;;
  *) echo "usage: tools/setup.sh demo|test|install" >&2; exit 2 ;;
esac
