#!/usr/bin/env bash
# Build ggml's shared libraries for a GPU (or CPU) backend and print the folder that holds them.
#
#   dir=$(bash tools/build_ggml.sh cpu|vulkan|cuda|metal)
#
# graphgen loads its ggml bindings over a folder of ggml shared libraries. On the CPU the
# reference llama.cpp wheel's own libraries are used as they are; GPU backends have to be built
# from source. The source is the standalone ggml CMake project (ggml 0.26.0, llama.cpp b11549)
# found under thirdparty/llama.cpp/ggml/ in the PyPI sdist xllamacpp==2026.10.11549, the newest
# ggml source tree on PyPI. The sdist is fetched with pip, checked against a pinned sha256, and
# only the ggml subtree is extracted; both are kept under $GRAPHGEN_CACHE/src (default
# ~/.cache/graphgen), so a machine without network access only needs that folder copied in.
#
# The CPU code always gets the reference's flags (AVX/AVX2/FMA/F16C/BMI2, llamafile on,
# AVX512 off, no -march=native) and RPC is always on; the variant adds Vulkan, CUDA or Metal
# ("cpu" builds the CPU and RPC libraries only). Vulkan installs glslc and Mesa's CPU driver
# (lavapipe) with apt when they are missing and, when the system's Vulkan headers lack
# VK_EXT_layer_settings (Debian 12), compiles against Debian 13's headers, fetched through a
# private apt configuration that leaves the system's apt state and libvulkan untouched.
# $GRAPHGEN_GGML_CMAKE_ARGS adds further CMake arguments (they come last, so they win).
#
# CUDA needs no GPU to build. The toolkit is, in this order: $GRAPHGEN_CUDA_TOOLKIT when it is a
# folder (its bin/nvcc); the toolkit of $CUDACXX; a system toolkit (nvcc on PATH, /usr/local/cuda,
# /opt/cuda) that has cuBLAS, or whose missing cuBLAS $GRAPHGEN_CUDA_CUBLAS supplies (a folder
# with cuBLAS's include/ and lib/, such as a pip nvidia/cu13 folder); else NVIDIA's PyPI wheels of
# CUDA 13.5 (nvcc, runtime, cuBLAS, ~1.1 GB), installed once into $GRAPHGEN_CACHE/cuda-toolkit-*
# ($GRAPHGEN_CUDA_TOOLKIT=pypi always takes these). ggml-cuda is built with GGML_CUDA_NO_VMM=ON:
# its memory pool then grows with cudaMalloc instead of the driver's virtual-memory calls, so the
# library has no link to the driver's libcuda.so.1 at all (the CUDA runtime opens the driver when
# it starts). Nothing but a driver library can provide libcuda, none ships with the toolkit
# wheels, and a library that needs libcuda.so.1 could not even be loaded on a machine without a
# driver; the pool only changes how scratch memory is reserved, never a kernel or a result.
# Architectures: $CUDAARCHS, else $GGML_CUDA_ARCHITECTURES, else the GPUs nvidia-smi reports,
# else 75-virtual;80-real;86-real;89-real;90-real (each architecture compiles every kernel's
# device code once more, about half a one-architecture build apiece; 90-real alone took 19
# minutes on 2 shared cores, docs/backends.md). With the PyPI toolkit
# (or $GRAPHGEN_CUDA_CUBLAS) the folder also links the CUDA runtime and cuBLAS libraries it was
# built against (libcudart.so.13, libcublas.so.13, libcublasLt.so.13) from where they are, so it
# loads as it is; with a system toolkit they must be on the loader's path, as the toolkit's own
# installation puts them.
#
# The result goes to $GRAPHGEN_CACHE/ggml/<variant>-<key>, where the key hashes the sdist
# version, the CMake arguments and this script, so a change of any input builds a new folder and
# an unchanged one is reused at once. Each library is stored under its SONAME (libggml-base.so.0,
# which is what the others' DT_NEEDED entries ask for) and under its plain name
# (libggml-base.so, what the Python loader opens), the two being hard links of one file; the
# RUNPATH is $ORIGIN, so the libraries find each other inside the folder. build-info.txt
# records what was built and .complete, written last, marks a finished folder. The build runs
# in a temporary folder that is moved into place at the end, and a lock keeps two runs from
# building the same folder at once. $GRAPHGEN_CACHE/ggml/<variant> is a symlink to the latest
# build of that variant. Progress goes to stderr; stdout carries only the folder's absolute
# path. Exit status: 0 on success, 1 on failure, 2 on a usage error.
#
# GRAPHGEN_GGML_CONFIGURE_ONLY=DIR configures the build into DIR with the very arguments a build
# takes and stops there, printing DIR (and writing DIR/toolkit.env, the CUDA toolkit's paths), so
# that a check can compile a few of its files (tools/ci_cuda.sh); nothing is cached or published.
set -euo pipefail

SDIST_NAME=xllamacpp
SDIST_VERSION=2026.10.11549
SDIST_SHA256=c17ee1163006f70726abb9f72137830818f3d8cb60bfc34cb232d08428eaa22b
SDIST_GGML_DIR=thirdparty/llama.cpp/ggml
LLAMA_CPP_BUILD=b11549

usage() { echo "usage: tools/build_ggml.sh cpu|vulkan|cuda|metal" >&2; exit 2; }
[ $# -eq 1 ] || usage
variant=$1
case "$variant" in cpu|vulkan|cuda|metal) ;; *) usage ;; esac

log() { echo "build_ggml: $*" >&2; }
die() { echo "build_ggml: error: $*" >&2; exit 1; }

self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
PY=${PYTHON:-python3}
os=$(uname -s)
if [ "$os" = Darwin ]; then so_ext=dylib; rpath='@loader_path'; else so_ext=so; rpath='$ORIGIN'; fi
[ "$variant" = metal ] && [ "$os" != Darwin ] && die "the metal variant builds only on macOS"

sha256() { if command -v sha256sum >/dev/null; then sha256sum "$@"; else shasum -a 256 "$@"; fi; }
ncpu() { nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2; }

cache=${GRAPHGEN_CACHE:-$HOME/.cache/graphgen}
mkdir -p "$cache/src" "$cache/ggml/logs" || die "cannot create the cache folder $cache"
cache=$(cd "$cache" && pwd)

# --- system packages (apt only; elsewhere whatever is installed is used) ---------------------
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=0
deb_missing() {   # prints the Debian packages among "$@" that are not installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || echo "$p"
  done
}
apt_install() {   # installs the packages among "$@" that are missing, quietly
  command -v apt-get >/dev/null || return 0
  local missing
  missing=$(deb_missing "$@")
  [ -n "$missing" ] || return 0
  log "installing with apt: $(echo $missing)"
  if [ "$apt_updated" = 0 ]; then
    as_root apt-get update -qq >&2 || die "apt-get update failed"
    apt_updated=1
  fi
  local aout
  # shellcheck disable=SC2086
  aout=$(as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        $missing 2>&1) || { printf '%s\n' "$aout" | tail -n 20 >&2; die "apt-get install $(echo $missing) failed"; }
}

vulkan_packages() {
  # glslc compiles the shaders; lavapipe (Mesa's CPU Vulkan driver) lets graphs run without a GPU
  apt_install glslc libvulkan-dev mesa-vulkan-drivers spirv-headers
}
vulkan_headers() {   # fills $hdr_root with Debian 13's libvulkan-dev through a private apt state
  [ -n "${hdr_root:-}" ] || return 0
  grep -q VK_EXT_layer_settings "$hdr_root/usr/include/vulkan/vulkan_core.h" 2>/dev/null && return 0
  command -v apt-get >/dev/null \
    || die "the system's Vulkan headers lack VK_EXT_layer_settings; install Vulkan headers >= 1.3.261"
  log "fetching Debian 13's Vulkan headers (private apt state) into $hdr_root"
  local t
  t=$(mktemp -d)
  mkdir -p "$t/lists/partial" "$t/cache/archives/partial" "$t/etc"
  echo "deb http://deb.debian.org/debian trixie main" > "$t/etc/sources.list"
  local o=(-o Dir::Etc::sourcelist="$t/etc/sources.list" -o Dir::Etc::sourceparts=-
           -o Dir::State::Lists="$t/lists" -o Dir::Cache="$t/cache"
           -o Dir::State::status=/var/lib/dpkg/status -o APT::Get::List-Cleanup=0
           -o APT::Sandbox::User=root)
  apt-get "${o[@]}" update -qq >&2 || { rm -rf "$t"; die "apt-get update (Debian 13 sources) failed"; }
  (cd "$t" && apt-get "${o[@]}" download libvulkan-dev >/dev/null 2>&1) \
    || { rm -rf "$t"; die "downloading Debian 13's libvulkan-dev failed"; }
  rm -rf "$hdr_root" && mkdir -p "$hdr_root"
  dpkg-deb -x "$t"/libvulkan-dev_*.deb "$hdr_root" || { rm -rf "$t"; die "unpacking libvulkan-dev failed"; }
  rm -rf "$t"
  grep -q VK_EXT_layer_settings "$hdr_root/usr/include/vulkan/vulkan_core.h" \
    || die "Debian 13's libvulkan-dev lacks VK_EXT_layer_settings too"
}

# --- CUDA toolkit ------------------------------------------------------------------------------
# NVIDIA's PyPI wheels of one CUDA release land in one toolkit-shaped folder (nvidia/cu13/{bin,
# include,lib,nvvm}); cccl and cuBLAS have version numbers of their own
CUDA_PYPI_VERSION=13.5.37
CUDA_PYPI_PACKAGES=(nvidia-cuda-nvcc==13.5.37 nvidia-cuda-runtime==13.5.37 nvidia-cuda-crt==13.5.37
                    nvidia-nvvm==13.5.37 nvidia-cuda-nvrtc==13.5.37 nvidia-cuda-cccl==13.3.5.0.6
                    nvidia-cublas==13.10.0.20)
CUDA_DEFAULT_ARCHS='75-virtual;80-real;86-real;89-real;90-real'
cuda_root=""; cuda_nvcc=""; cuda_cublas=""; cuda_cublas_dir=""; cuda_runtime_dirs=()

nvcc_top() {   # the toolkit folder an nvcc belongs to (an nvcc on PATH may be a wrapper script)
  local top
  top=$("$1" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1) || true
  [ -n "$top" ] && (cd "$top" 2>/dev/null && pwd -P)
}
has_cublas() {   # a toolkit folder with cuBLAS's header and its unversioned library
  [ -n "$(find -L "$1/include" "$1/targets" -maxdepth 3 -name cublas_v2.h 2>/dev/null | head -n1)" ] &&
    [ -n "$(find -L "$1/lib64" "$1/lib" "$1/targets" -maxdepth 3 -name libcublas.so 2>/dev/null | head -n1)" ]
}
cuda_pypi() {   # installs the wheels into the cache once; sets the toolkit's paths
  local dir="$cache/cuda-toolkit-$CUDA_PYPI_VERSION" tmp f b
  cuda_root="$dir/nvidia/cu13"
  cuda_nvcc="$cuda_root/bin/nvcc"
  cuda_runtime_dirs=("$cuda_root/lib")
  [ -f "$dir/.complete" ] && return 0
  if command -v flock >/dev/null; then
    exec 8>"$cache/.cuda-toolkit-$CUDA_PYPI_VERSION.lock"
    flock 8
    [ -f "$dir/.complete" ] && { exec 8>&-; return 0; }
  fi
  log "installing CUDA $CUDA_PYPI_VERSION's compiler, runtime and cuBLAS from PyPI into $dir (~1.1 GB, once)"
  tmp=$(mktemp -d "$cache/.cuda-toolkit.XXXXXX")
  "$PY" -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: --target "$tmp" \
        "${CUDA_PYPI_PACKAGES[@]}" >&2 || { rm -rf "$tmp"; die "pip install of the CUDA wheels failed"; }
  [ -x "$tmp/nvidia/cu13/bin/nvcc" ] || { rm -rf "$tmp"; die "the CUDA wheels left no nvidia/cu13/bin/nvcc"; }
  # the wheels ship versioned libraries only (libcudart.so.13); CMake looks for the plain names
  for f in "$tmp/nvidia/cu13/lib"/lib*.so.*; do
    b=$(basename "$f")
    [ -e "$tmp/nvidia/cu13/lib/${b%%.so.*}.so" ] || ln -s "$b" "$tmp/nvidia/cu13/lib/${b%%.so.*}.so"
  done
  date -u +%Y-%m-%dT%H:%M:%SZ > "$tmp/.complete"
  chmod 755 "$tmp"
  rm -rf "$dir" && mv "$tmp" "$dir"
  [ -e /dev/fd/8 ] && exec 8>&-
  return 0
}
cuda_cublas_from() {   # cuBLAS taken from another folder: its headers and libraries alone, linked
  local src farm tmp l v
  src=$(cd "$1" 2>/dev/null && pwd -P) || die "GRAPHGEN_CUDA_CUBLAS=$1 is not a folder"
  [ -f "$src/include/cublas_v2.h" ] || die "GRAPHGEN_CUDA_CUBLAS=$src has no include/cublas_v2.h"
  # only cuBLAS's own headers: such a folder (a pip nvidia/cu13) also holds a CUDA runtime's
  # headers, of another version than the compiler's
  farm="$cache/cuda-cublas-$(printf '%s' "$src" | sha256 | cut -c1-12)"
  tmp=$(mktemp -d "$cache/.cuda-cublas.XXXXXX")
  mkdir -p "$tmp/include" "$tmp/lib"
  ln -s "$src/include"/cublas*.h "$tmp/include/"
  for l in libcublas libcublasLt; do
    v=$(cd "$src/lib" && ls -1 "$l".so.* 2>/dev/null | awk '{ print length, $0 }' | sort -n | head -n1 | cut -d' ' -f2) || true
    [ -n "$v" ] || { rm -rf "$tmp"; die "GRAPHGEN_CUDA_CUBLAS=$src has no lib/$l.so.*"; }
    ln -s "$src/lib/$v" "$tmp/lib/$v"
    ln -s "$v" "$tmp/lib/$l.so"
  done
  chmod 755 "$tmp"
  rm -rf "$farm" && mv "$tmp" "$farm"
  cuda_cublas=$src
  cuda_cublas_dir=$farm
  cuda_runtime_dirs+=("$farm/lib")
}
cuda_system() {   # the toolkit at $1, with cuBLAS from it or from $GRAPHGEN_CUDA_CUBLAS
  cuda_root=$1
  cuda_nvcc="$1/bin/nvcc"
  if [ -n "${GRAPHGEN_CUDA_CUBLAS:-}" ]; then
    cuda_cublas_from "$GRAPHGEN_CUDA_CUBLAS"
  elif ! has_cublas "$1"; then
    die "the CUDA toolkit in $1 has no cuBLAS: set GRAPHGEN_CUDA_CUBLAS to a folder with cuBLAS's include/ and lib/, or GRAPHGEN_CUDA_TOOLKIT=pypi"
  fi
}
cuda_toolkit() {   # chooses the toolkit (see the header); sets cuda_root, cuda_nvcc and the rest
  local want=${GRAPHGEN_CUDA_TOOLKIT:-} n top
  case "$want" in
    pypi) cuda_pypi ;;
    "")
      if [ -n "${CUDACXX:-}" ]; then
        top=$(nvcc_top "$CUDACXX") || die "CUDACXX=$CUDACXX: not an nvcc that runs"
        cuda_system "$top"
        return 0
      fi
      for n in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc /opt/cuda/bin/nvcc; do
        [ -n "$n" ] && [ -x "$n" ] || continue
        top=$(nvcc_top "$n") || continue
        if [ -n "${GRAPHGEN_CUDA_CUBLAS:-}" ] || has_cublas "$top"; then
          cuda_system "$top"
          return 0
        fi
        log "the CUDA toolkit in $top has no cuBLAS (GRAPHGEN_CUDA_CUBLAS can name one); taking NVIDIA's PyPI wheels instead"
        break
      done
      cuda_pypi ;;
    *)
      [ -x "$want/bin/nvcc" ] || die "GRAPHGEN_CUDA_TOOLKIT=$want has no bin/nvcc"
      top=$(nvcc_top "$want/bin/nvcc") || die "$want/bin/nvcc does not run"
      cuda_system "$top" ;;
  esac
}

# --- CMake arguments ---------------------------------------------------------------------------
args=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=OFF -DGGML_RPC=ON
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
  -DGGML_AVX512=OFF -DGGML_LLAMAFILE=ON
  -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
  -DCMAKE_INSTALL_LIBDIR=lib "-DCMAKE_INSTALL_RPATH=$rpath"
)
backend_lib=""
key_extra=""   # what else decides the result: a system compiler's version
case "$variant" in
  cpu) ;;
  vulkan)
    backend_lib=libggml-vulkan
    vulkan_packages   # also needed at run time, so checked even when the build is reused
    # ggml-vulkan uses VK_EXT_layer_settings unguarded; Debian 12's headers (1.3.239) lack it,
    # so those builds take Debian 13's headers (fetched before the build, see vulkan_headers)
    if ! grep -q VK_EXT_layer_settings /usr/include/vulkan/vulkan_core.h 2>/dev/null; then
      hdr_root="$cache/vulkan-headers-trixie"
      args+=("-DVulkan_INCLUDE_DIR=$hdr_root/usr/include")
    fi
    args+=(-DGGML_VULKAN=ON)
    ;;
  cuda)
    backend_lib=libggml-cuda
    cuda_toolkit   # also needed at run time (the PyPI toolkit's libraries), so checked on reuse too
    # ggml's default without GGML_NATIVE is a long list of architectures, each a full device pass
    archs=${CUDAARCHS:-${GGML_CUDA_ARCHITECTURES:-}}
    if [ -z "$archs" ] && command -v nvidia-smi >/dev/null; then
      archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
              | tr -d ' .' | grep -E '^[0-9]+$' | sort -u | sed 's/$/-real/' | paste -sd';' || true)
    fi
    archs=${archs:-$CUDA_DEFAULT_ARCHS}
    # NCCL off: one device here, and a libnccl found on some machine would become a run-time need;
    # GGML_CUDA_CCCL_VERSION stays empty (set, it clones CCCL from the network)
    args+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_COMPILER=$cuda_nvcc" "-DCUDAToolkit_ROOT=$cuda_root"
           "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_NCCL=OFF
           -DGGML_CUDA_FA_ALL_QUANTS=OFF)
    if [ -n "$cuda_cublas" ]; then
      args+=("-DCMAKE_CUDA_FLAGS=-I$cuda_cublas_dir/include" "-DCUDA_cublas_LIBRARY=$cuda_cublas_dir/lib/libcublas.so"
             "-DCUDA_cublasLt_LIBRARY=$cuda_cublas_dir/lib/libcublasLt.so")
    fi
    key_extra="$("$cuda_nvcc" --version | tail -n1) cublas=$cuda_cublas"
    ;;
  metal)
    backend_lib=libggml-metal
    args+=(-DGGML_METAL=ON)
    ;;
esac
if [ -n "${GRAPHGEN_GGML_CMAKE_ARGS:-}" ]; then
  # shellcheck disable=SC2206
  args+=($GRAPHGEN_GGML_CMAKE_ARGS)
fi

key=$( { printf '%s==%s\n' "$SDIST_NAME" "$SDIST_VERSION"; printf '%s\n' "${args[@]}" "$key_extra"; cat "$self"; } \
       | sha256 | cut -c1-16)
name="$variant-$key"
out="$cache/ggml/$name"
link="$cache/ggml/$variant"

publish() {   # points <variant> at the keyed folder and prints the folder
  if [ -d "$link" ] && [ ! -L "$link" ]; then
    die "$link is a real folder; remove it so it can become a symlink"
  fi
  local tmp_link="$cache/ggml/.$variant.link.$$"
  ln -sfn "$name" "$tmp_link"
  mv -f -T "$tmp_link" "$link" 2>/dev/null || { rm -f "$tmp_link"; ln -sfn "$name" "$link"; }
  printf '%s\n' "$out"
}

configure_only=${GRAPHGEN_GGML_CONFIGURE_ONLY:-}
if [ -z "$configure_only" ] && [ -f "$out/.complete" ]; then
  log "reusing $out"
  publish
  exit 0
fi

# one build per folder at a time: a second run waits, then finds the folder complete
if [ -z "$configure_only" ] && command -v flock >/dev/null; then
  exec 9>"$cache/ggml/.$name.lock"
  if ! flock -n 9; then
    log "another build of $name is running; waiting for it"
    flock 9
  fi
  if [ -f "$out/.complete" ]; then
    log "reusing $out"
    publish
    exit 0
  fi
fi

# --- build tools ---------------------------------------------------------------------------------
# make, or ninja where make is missing (a machine that cannot install packages may have only ninja)
gen=()
if ! command -v make >/dev/null && command -v ninja >/dev/null; then gen=(-G Ninja); fi
need_tools=()
for t in cmake cc c++; do command -v "$t" >/dev/null || need_tools+=("$t"); done
[ ${#gen[@]} -gt 0 ] || command -v make >/dev/null || need_tools+=(make)
if [ "$os" = Linux ] && ! command -v readelf >/dev/null; then need_tools+=(readelf); fi
if [ ${#need_tools[@]} -gt 0 ]; then
  apt_install cmake make build-essential binutils
  for t in "${need_tools[@]}"; do command -v "$t" >/dev/null || die "$t not found"; done
fi
if [ "$variant" = vulkan ]; then
  command -v glslc >/dev/null || die "glslc not found (it compiles ggml's Vulkan shaders)"
  vulkan_headers
fi

# --- source: the sdist, then its ggml subtree ------------------------------------------------
src="$cache/src/$SDIST_NAME-$SDIST_VERSION-ggml"
sdist="$cache/src/$SDIST_NAME-$SDIST_VERSION.tar.gz"
if [ ! -f "$src/CMakeLists.txt" ]; then
  if [ ! -f "$sdist" ]; then
    log "downloading the $SDIST_NAME==$SDIST_VERSION sdist"
    dl=$(mktemp -d "$cache/src/.download.XXXXXX")
    "$PY" -m pip download -q --no-deps --no-binary "$SDIST_NAME" "$SDIST_NAME==$SDIST_VERSION" -d "$dl" >&2 \
      || { rm -rf "$dl"; die "pip download $SDIST_NAME==$SDIST_VERSION failed"; }
    [ -f "$dl/$(basename "$sdist")" ] || { rm -rf "$dl"; die "pip download did not produce $(basename "$sdist")"; }
    mv -f "$dl/$(basename "$sdist")" "$sdist"
    rm -rf "$dl"
  fi
  got=$(sha256 "$sdist" | cut -d' ' -f1)
  [ "$got" = "$SDIST_SHA256" ] || die "$sdist has sha256 $got, expected $SDIST_SHA256 (delete it to fetch it again)"
  log "extracting $SDIST_GGML_DIR/ from the sdist"
  ex=$(mktemp -d "$cache/src/.extract.XXXXXX")
  tar -xzf "$sdist" -C "$ex" --strip-components=4 "$SDIST_NAME-$SDIST_VERSION/$SDIST_GGML_DIR/" \
    || { rm -rf "$ex"; die "extracting $SDIST_GGML_DIR/ from $sdist failed"; }
  [ -f "$ex/CMakeLists.txt" ] || { rm -rf "$ex"; die "no ggml CMakeLists.txt in $sdist"; }
  chmod 755 "$ex"
  rm -rf "$src" && mv "$ex" "$src"
fi
# the sdist leaves out ggml.pc.in, which a standalone configure needs (for a pkg-config file
# that is not used here)
if [ ! -f "$src/ggml.pc.in" ]; then
  cat > "$src/ggml.pc.in" <<'EOF'
prefix=@CMAKE_INSTALL_PREFIX@
exec_prefix=${prefix}
includedir=${prefix}/include
libdir=${prefix}/lib

Name: ggml
Description: The GGML Tensor Library for Machine Learning
Version: @GGML_VERSION@
Cflags: -I${includedir}
Libs: -L${libdir} -lggml
EOF
fi
ggml_version=$(sed -nE 's/^set\(GGML_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+)\).*/\2/p' "$src/CMakeLists.txt" | paste -sd. -)
[ -n "$ggml_version" ] || ggml_version=unknown

# --- configure, build, install into a staging prefix -----------------------------------------
if [ -n "$configure_only" ]; then
  mkdir -p "$configure_only" || die "cannot create $configure_only"
  configure_only=$(cd "$configure_only" && pwd)
  log "configuring ggml $ggml_version ($variant, key $key) into $configure_only"
  GIT_CEILING_DIRECTORIES="$(dirname "$src")" cmake ${gen[@]+"${gen[@]}"} -S "$src" -B "$configure_only" \
      "-DCMAKE_INSTALL_PREFIX=$configure_only/stage" "${args[@]}" > "$configure_only/configure.log" 2>&1 \
    || { tail -n 40 "$configure_only/configure.log" >&2; die "cmake configure failed (log: $configure_only/configure.log)"; }
  {
    printf 'cuda_root=%q\ncuda_nvcc=%q\ncuda_archs=%q\n' "$cuda_root" "$cuda_nvcc" "${archs:-}"
    printf 'cuda_runtime_path=%q\n' "$(IFS=:; echo "${cuda_runtime_dirs[*]:-}")"
  } > "$configure_only/toolkit.env"
  printf '%s\n' "$configure_only"
  exit 0
fi
work=$(mktemp -d "$cache/ggml/.build-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
buildlog="$cache/ggml/logs/$name.log"
: > "$buildlog"
fail() {
  echo "build_ggml: error: $1; last lines of $buildlog:" >&2
  tail -n 40 "$buildlog" >&2
  exit 1
}
log "building ggml $ggml_version ($variant, key $key) with $(ncpu) jobs; log: $buildlog"
start=$(date +%s)
log "configuring"
# GIT_CEILING_DIRECTORIES: the cache may lie inside some other git repository, whose commit
# ggml would otherwise take for its own
GIT_CEILING_DIRECTORIES="$(dirname "$src")" cmake ${gen[@]+"${gen[@]}"} -S "$src" -B "$work/build" "-DCMAKE_INSTALL_PREFIX=$work/stage" "${args[@]}" >>"$buildlog" 2>&1 \
  || fail "cmake configure failed"
log "compiling (this takes minutes)"
cmake --build "$work/build" --config Release -j"$(ncpu)" >>"$buildlog" 2>&1 || fail "cmake build failed"
cmake --install "$work/build" --config Release >>"$buildlog" 2>&1 || fail "cmake install failed"
log "compiled in $(( $(date +%s) - start )) s"

# --- collect the libraries: one file per library, under its SONAME and its plain name ---------
lib="$work/lib"
mkdir -p "$lib"
soname_of() {
  if [ "$os" = Darwin ]; then
    basename "$(otool -D "$1" | tail -n +2 | head -n1)"
  else
    readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'
  fi
}
shopt -s nullglob
for f in "$work/stage/lib"/lib*."$so_ext"; do
  real=$(readlink -f "$f")
  plain=$(basename "$f")
  soname=$(soname_of "$real")
  [ -n "$soname" ] || soname=$plain
  cp "$real" "$lib/$soname"
  if [ "$soname" != "$plain" ]; then
    ln "$lib/$soname" "$lib/$plain" 2>/dev/null || cp "$lib/$soname" "$lib/$plain"
  fi
done
shopt -u nullglob

for l in libggml-base libggml-cpu libggml-rpc libggml $backend_lib; do
  [ -f "$lib/$l.$so_ext" ] || fail "the build produced no $l.$so_ext"
done
# CUDA libraries from folders off the loader's path (the PyPI toolkit, $GRAPHGEN_CUDA_CUBLAS) are
# linked into the folder, relative to where it ends up, so that $ORIGIN finds the very libraries
# it was built against; until it is moved there, the checks below find them through
# LD_LIBRARY_PATH
rt_path=""
if [ "$os" = Linux ] && [ ${#cuda_runtime_dirs[@]} -gt 0 ]; then
  rt_path=$(IFS=:; echo "${cuda_runtime_dirs[*]}")
  scan=("$lib"/*.so)
  while [ ${#scan[@]} -gt 0 ]; do
    f=${scan[0]}; scan=("${scan[@]:1}")
    for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      [ -e "$lib/$n" ] || [ -L "$lib/$n" ] && continue
      for d in "${cuda_runtime_dirs[@]}"; do
        if [ -e "$d/$n" ]; then
          ln -s "$(realpath -m --relative-to="$out" "$d/$n")" "$lib/$n"
          scan+=("$d/$n")
          break
        fi
      done
    done
  done
fi
with_rt() { if [ -n "$rt_path" ]; then LD_LIBRARY_PATH="$rt_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; else "$@"; fi; }
if [ "$os" = Linux ]; then
  # every ggml library another one needs must be in the folder; other needs must resolve on
  # this system (CUDA's runtime libraries, libvulkan, libgomp)
  for f in "$lib"/*.so; do
    for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      case "$n" in libggml*) [ -f "$lib/$n" ] || fail "$(basename "$f") needs $n, which is not in the folder" ;; esac
    done
    [ "$(readelf -d "$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')" = '$ORIGIN' ] \
      || fail "$(basename "$f") does not have RUNPATH \$ORIGIN"
    missing=$(with_rt ldd "$f" 2>/dev/null | awk '/not found/ {print $1}' | paste -sd' ' || true)
    [ -z "$missing" ] || log "warning: $(basename "$f") needs $missing, not found on this system"
  done
fi
# a load test: the libraries open together in the order the Python loader uses and report
# their version (skipped when Python is missing, or when a backend's runtime is absent here)
if command -v "$PY" >/dev/null; then
  loaded=$(cd "$lib" && with_rt "$PY" - "$lib" "$so_ext" $backend_lib <<'EOF' 2>>"$buildlog"
import ctypes, os, sys
d, ext, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
for n in ["libggml-base", "libggml-cpu", "libggml-rpc"] + extra:
    ctypes.CDLL(os.path.join(d, f"{n}.{ext}"), mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(os.path.join(d, f"libggml.{ext}"))
g.ggml_version.restype = ctypes.c_char_p
print(g.ggml_version().decode())
EOF
  ) || loaded=""
  if [ "$loaded" = "$ggml_version" ]; then
    log "load test passed: ggml_version() = $loaded"
  elif [ -z "$loaded" ] && [ -n "$backend_lib" ] && [ -n "$(with_rt ldd "$lib/$backend_lib.$so_ext" 2>/dev/null | grep 'not found' || true)" ]; then
    log "warning: load test skipped, $backend_lib's runtime libraries are missing on this machine"
  else
    fail "load test failed (ggml_version() = '${loaded}', expected $ggml_version)"
  fi
fi

{
  echo "ggml_version: $ggml_version"
  echo "source: $SDIST_NAME==$SDIST_VERSION sdist ($SDIST_GGML_DIR, llama.cpp $LLAMA_CPP_BUILD), sha256 $SDIST_SHA256"
  echo "variant: $variant"
  echo "key: $key"
  echo "cmake_args: ${args[*]}"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "build_seconds: $(( $(date +%s) - start ))"
  echo "host: $(uname -srm)"
  echo "compiler: $(c++ --version 2>/dev/null | head -n1)"
  echo "cmake: $(cmake --version | head -n1)"
  [ -z "$cuda_nvcc" ] || echo "cuda: $cuda_root ($("$cuda_nvcc" --version | tail -n1))${cuda_cublas:+, cuBLAS from $cuda_cublas}"
  echo "files:"
  (cd "$lib" && ls -1 | sed 's/^/  /')
} > "$lib/build-info.txt"
date -u +%Y-%m-%dT%H:%M:%SZ > "$lib/.complete"

rm -rf "$out"
mv "$lib" "$out"
log "done: $out"
publish
