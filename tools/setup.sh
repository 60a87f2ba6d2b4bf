#!/usr/bin/env bash
# Install graphgen, then run one job:
#   tools/setup.sh demo [ARGS]   -> graphgen demo
#   tools/setup.sh test [ARGS]   -> the test suite (pytest)
#   tools/setup.sh install       -> install only
#   tools/setup.sh torch         -> install with the graphgen[torch] extra (the draft authors' models)
# It installs into the active virtual environment, or else into the project's own .venv (made
# here), so a distribution python3 that refuses pip installs (PEP 668) is fine. Nothing is
# compiled for the CPU: graphgen computes on the reference wheel's own ggml.
# GRAPHGEN_GGML=vulkan|cuda|metal also builds that backend's ggml libraries (tools/build_ggml.sh)
# for the cross-backend tests; CI (CI=true) builds Vulkan, and a failed build fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:-test}; shift || true
case "$job" in demo|test|install|torch) ;; *) echo "usage: tools/setup.sh demo|test|install|torch [ARGS...]" >&2; exit 2 ;; esac
if [ "${CI:-}" = "true" ]; then gpu=${GRAPHGEN_GGML:-vulkan}; else gpu=${GRAPHGEN_GGML:-}; fi
[ "$gpu" = cpu ] && gpu=

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
else
  if [ ! -x .venv/bin/python ]; then
    base=${PYTHON:-python3}
    echo "creating the project's virtual environment in .venv" >&2
    if ! "$base" -m venv .venv >/dev/null 2>&1; then
      # Debian and Ubuntu ship venv's pip bootstrap separately
      rm -rf .venv
      as_root apt-get update -qq
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      "$base" -m venv .venv
    fi
  fi
  PY="$PWD/.venv/bin/python"
fi

# the demo needs graphgen alone; the tests need pytest and hypothesis too; the authors' models
# (graphgen[torch]) come with `torch`, and in CI, where their tests must run (GRAPHGEN_TORCH=1 too)
extras=
[ "$job" = test ] && extras=test
if [ "$job" = torch ] || [ "${CI:-}" = "true" ] || [ "${GRAPHGEN_TORCH:-}" = 1 ]; then
  [ "$job" = demo ] || extras=${extras:+$extras,}torch
fi
spec=".${extras:+[$extras]}"
echo "installing graphgen ($spec) into $("$PY" -c 'import sys; print(sys.prefix)')" >&2
"$PY" -m pip install -q --disable-pip-version-check -e "$spec"
case ",$extras," in *,torch,*)
  # speculators declares torchvision and torchaudio, whose PyPI wheels need CUDA torch and break
  # transformers' imports beside a CPU one: it goes in without them (pyproject.toml lists what
  # its model code imports)
  "$PY" -m pip install -q --disable-pip-version-check --no-deps "speculators==0.9.0"
  if [ "${CI:-}" = "true" ]; then export GRAPHGEN_REQUIRE_TORCH=1; fi ;;
esac
# fetch ggml-python's bindings (once) and check the ggml they will run on
"$PY" -m graphgen.ops.runtime >&2

if [ -n "$gpu" ]; then
  dir=$(bash tools/build_ggml.sh "$gpu")
  kind=$(echo "$gpu" | tr '[:lower:]' '[:upper:]')
  export "GRAPHGEN_${kind}_GGML_DIR=$dir"
  [ "${CI:-}" = "true" ] && export "GRAPHGEN_REQUIRE_${kind}=1"
fi

# the tests' yardstick of the speculative loop: llama.cpp b11549's own loop, built once (minutes,
# then cached; docs/llama-loop.md)
if [ "$job" = test ]; then
  PYTHON="$PY" bash tools/build_llama.sh >/dev/null || { echo "tools/build_llama.sh failed: the loop's tests need it" >&2; exit 1; }
fi

# CI also installs what the viewer tests drive (Graphviz, Chromium, Model Explorer), so they run
# rather than skip; elsewhere those tests skip when the tools are absent.
if [ "${CI:-}" = "true" ] && command -v apt-get >/dev/null; then
  { command -v dot >/dev/null && command -v chromium >/dev/null; } ||
    { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz chromium >/dev/null; } ||
    echo "could not install graphviz/chromium; their tests will skip" >&2
  "$PY" -m pip install -q --disable-pip-version-check -e '.[explorer]' ||
    echo "could not install the explorer extra; its test will skip" >&2
fi

case "$job" in
  demo)
    [ -z "${VIRTUAL_ENV:-}" ] && echo "graphgen is installed in .venv: run it as .venv/bin/graphgen, or 'source .venv/bin/activate' first" >&2
    exec "$PY" -m graphgen.cli demo "$@" ;;
  # both cores: the suite is CPU-bound, one test at a time per worker (-n 1 or -p no:xdist for one)
  test) exec "$PY" -m pytest -q -n "${GRAPHGEN_TEST_WORKERS:-2}" --dist worksteal "$@" ;;
  install|torch) [ -z "${VIRTUAL_ENV:-}" ] && echo "installed in .venv: run .venv/bin/graphgen" >&2; exit 0 ;;
esac
