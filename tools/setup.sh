#!/usr/bin/env bash
# Install graphgen with ggml-python built for the reference's CPU flags, then run one job:
#   tools/setup.sh demo   -> graphgen demo
#   tools/setup.sh test   -> the test suite (pytest)
# ggml-python is rebuilt only when the installed build differs from the reference's flags
# (AVX/AVX2/FMA/F16C/BMI2, llamafile on, AVX512 off), so values compare bit for bit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
job=${1:-test}; shift || true

ggml_ok() {
  "$PY" - <<'PYEOF' 2>/dev/null
import ctypes, os, sys
import ggml
lib = ctypes.CDLL(os.path.join(os.path.dirname(ggml.__file__), "lib", "libggml-cpu.so"))
has = lambda f: bool(getattr(lib, "ggml_cpu_has_" + f)())
want = {"avx2": True, "fma": True, "f16c": True, "avx512": False, "llamafile": True}
from importlib.metadata import version
sys.exit(0 if version("ggml-python") == "0.0.45" and all(has(k) == v for k, v in want.items()) else 1)
PYEOF
}

if ! ggml_ok; then
  echo "building ggml-python 0.0.45 with the reference CPU flags (a few minutes)..." >&2
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_LLAMAFILE=ON" \
    "$PY" -m pip install -q --no-cache-dir --force-reinstall --no-deps --no-binary ggml-python ggml-python==0.0.45
fi
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
