#!/usr/bin/env bash
# Build and install ggml-python 0.0.45 for graphgen.
#
#   tools/build_ggml.sh [cpu|vulkan|cuda|metal] [--rpc]
#
# The CPU backend always gets the reference's flags (AVX/AVX2/FMA/F16C/BMI2, llamafile on, AVX512
# off) so values compare bit for bit with llama.cpp b11739. Extra backends are added on top.
# The built wheel is cached under ~/.cache/graphgen/wheels (or $GRAPHGEN_CACHE/wheels), keyed by
# everything that goes into it (version, CMake arguments, this script), so a change of input
# rebuilds it and an unchanged one is reused. pip's own wheel cache is bypassed: it would hand
# back a wheel built with other CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=0.0.45
variant=${1:-cpu}; shift || true
rpc=off
for a in "$@"; do [ "$a" = "--rpc" ] && rpc=on; done

args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_LLAMAFILE=ON"
[ "$rpc" = on ] && args="$args -DGGML_RPC=ON"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

case "$variant" in
  cpu) ;;
  vulkan)
    # lavapipe (Mesa's CPU Vulkan driver) is enough to run graphs; glslc compiles the shaders
    if ! command -v glslc >/dev/null || ! [ -e /usr/include/vulkan/vulkan.h ] || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
      as_root apt-get update -qq
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq glslc libvulkan-dev mesa-vulkan-drivers spirv-headers >/dev/null
    fi
    # Debian 12's Vulkan headers (1.3.239) lack VK_EXT_layer_settings, which ggml-vulkan uses
    # unguarded: take the headers of Debian 13's libvulkan-dev through a private apt state,
    # leaving the system's apt configuration and libvulkan untouched
    hdr_root="${GRAPHGEN_CACHE:-$HOME/.cache/graphgen}/vulkan-headers-trixie"
    if ! grep -q "VK_EXT_layer_settings" "$hdr_root/usr/include/vulkan/vulkan_core.h" 2>/dev/null; then
      tmp=$(mktemp -d)
      mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/etc"
      echo "deb http://deb.debian.org/debian trixie main" > "$tmp/etc/sources.list"
      opts=(-o Dir::Etc::sourcelist="$tmp/etc/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$tmp/lists"
            -o Dir::Cache="$tmp/cache" -o Dir::State::status=/var/lib/dpkg/status -o APT::Get::List-Cleanup=0)
      apt-get "${opts[@]}" update -qq
      (cd "$tmp" && apt-get "${opts[@]}" download libvulkan-dev >/dev/null)
      rm -rf "$hdr_root" && mkdir -p "$hdr_root"
      dpkg-deb -x "$tmp"/libvulkan-dev_*.deb "$hdr_root"
      rm -rf "$tmp"
    fi
    args="$args -DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR=$hdr_root/usr/include"
    ;;
  cuda) args="$args -DGGML_CUDA=ON" ;;
  metal) args="$args -DGGML_METAL=ON" ;;
  *) echo "usage: tools/build_ggml.sh [cpu|vulkan|cuda|metal] [--rpc]" >&2; exit 2 ;;
esac

key=$(printf '%s\n%s\n%s\n' "$VERSION" "$args" "$(cat "$0")" | sha256sum | cut -c1-16)
wheel_dir="${GRAPHGEN_CACHE:-$HOME/.cache/graphgen}/wheels/ggml-python-$VERSION-$variant-$key"
if ! ls "$wheel_dir"/ggml_python-*.whl >/dev/null 2>&1; then
  echo "building ggml-python $VERSION ($variant, rpc $rpc); this takes a few minutes..." >&2
  rm -rf "$wheel_dir.tmp" && mkdir -p "$wheel_dir.tmp"
  CMAKE_ARGS="$args" "$PY" -m pip wheel -q --no-cache-dir --no-deps --no-binary ggml-python \
    -w "$wheel_dir.tmp" "ggml-python==$VERSION"
  rm -rf "$wheel_dir" && mv "$wheel_dir.tmp" "$wheel_dir"
fi
"$PY" -m pip install -q --no-cache-dir --force-reinstall --no-deps "$wheel_dir"/ggml_python-*.whl
echo "ggml-python $VERSION installed ($variant, rpc $rpc, key $key)" >&2
