#!/usr/bin/env bash
# Build llama.cpp b11549 (CPU) with its common library, and graphgen's loop program over
# common/speculative.cpp; print the folder that holds them.
#
#   dir=$(bash tools/build_llama.sh)
#
# The folder holds, flat: libllama.so, libllama-common.so and ggml's libraries (what
# `graphgen --llama DIR` loads), llama-completion and llama-speculative-simple (llama.cpp's own
# tools, for the benchmark and by hand), and graphgen-spec-loop, built from
# tools/spec_loop/spec_loop.cpp: llama.cpp's speculative loop driven by common/speculative.cpp,
# printing each round as a JSON line (graphgen/speculative/llamaloop.py reads them).
#
# The source is the llama.cpp tree inside the PyPI sdist xllamacpp==2026.10.11549 (the same
# sdist tools/build_ggml.sh builds ggml from), checked against a pinned sha256 and kept under
# $GRAPHGEN_CACHE/src (default ~/.cache/graphgen). The CPU code gets the reference wheel's flags
# (AVX/AVX2/FMA/F16C/BMI2, llamafile on, AVX512 off, no -march=native).
#
# Two stages, cached separately under $GRAPHGEN_CACHE/llama/:
#   b11549-cpu-<key>       libraries and llama.cpp's tools; the key hashes the sdist, the CMake
#                          arguments and RECIPE below (bump RECIPE when this stage changes).
#                          Minutes: 152 s on 2 cores here (twice that beside another job).
#   b11549-cpu-<key>-loop-<hash>
#                          the libraries (hard links) plus graphgen-spec-loop; the hash covers the
#                          program's source, so editing it rebuilds only the program (seconds).
# A folder is built in a temporary place and moved in whole; .complete, written last, marks it
# finished, and a lock keeps two runs from building one folder at once. Progress goes to stderr;
# stdout carries only the final folder's absolute path. Exit status: 0, 1 on failure, 2 on a
# usage error.
set -euo pipefail

SDIST_NAME=xllamacpp
SDIST_VERSION=2026.10.11549
SDIST_SHA256=c17ee1163006f70726abb9f72137830818f3d8cb60bfc34cb232d08428eaa22b
SDIST_LLAMA_DIR=thirdparty/llama.cpp
LLAMA_CPP_BUILD=b11549
RECIPE=1
TARGETS=(llama llama-common llama-completion llama-speculative-simple)

[ $# -eq 0 ] || { echo "usage: tools/build_llama.sh" >&2; exit 2; }
log() { echo "build_llama: $*" >&2; }
die() { echo "build_llama: error: $*" >&2; exit 1; }
[ "$(uname -s)" = Linux ] || die "this build is written for Linux"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
loop_src="$here/spec_loop/spec_loop.cpp"
[ -f "$loop_src" ] || die "missing $loop_src"
PY=${PYTHON:-python3}
sha256() { sha256sum "$@"; }
ncpu() { nproc 2>/dev/null || echo 2; }

cache=${GRAPHGEN_CACHE:-$HOME/.cache/graphgen}
mkdir -p "$cache/src" "$cache/llama/logs" || die "cannot create the cache folder $cache"
cache=$(cd "$cache" && pwd)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
for t in cmake make cc c++ readelf flock; do command -v "$t" >/dev/null || missing+=("$t"); done
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  log "installing build tools with apt (missing: ${missing[*]})"
  as_root apt-get update -qq >&2 || die "apt-get update failed"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    cmake make build-essential binutils util-linux >&2 || die "apt-get install of the build tools failed"
fi
for t in cmake make cc c++ readelf flock; do
  command -v "$t" >/dev/null || die "$t not found (install cmake, make, a C++17 compiler and binutils)"
done

args=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=OFF -DGGML_RPC=OFF
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
  -DGGML_AVX512=OFF -DGGML_LLAMAFILE=ON
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_SUBPROCESS=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  '-DCMAKE_BUILD_RPATH=$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN'
)
key=$( { printf '%s==%s\n' "$SDIST_NAME" "$SDIST_VERSION"; printf '%s\n' "${args[@]}" "${TARGETS[@]}";
         echo "recipe $RECIPE"; } | sha256 | cut -c1-16)
name="$LLAMA_CPP_BUILD-cpu-$key"
out="$cache/llama/$name"
loop_hash=$(sha256 "$loop_src" | cut -c1-12)
loop_out="$out-loop-$loop_hash"

lock() {   # lock NAME: one builder per folder; later runs wait for it
  exec 9>"$cache/llama/.$1.lock"
  flock -n 9 || { log "another build of $1 is running; waiting for it"; flock 9; }
}
unlock() { flock -u 9; exec 9>&-; }

if [ -f "$loop_out/.complete" ]; then
  log "reusing $loop_out"
  printf '%s\n' "$loop_out"
  exit 0
fi

# --- source ------------------------------------------------------------------------------------
src="$cache/src/$SDIST_NAME-$SDIST_VERSION-llama"
sdist="$cache/src/$SDIST_NAME-$SDIST_VERSION.tar.gz"
fetch_source() {
  [ -f "$src/.complete" ] && return 0
  if [ ! -f "$sdist" ]; then
    log "downloading the $SDIST_NAME==$SDIST_VERSION sdist"
    local dl
    dl=$(mktemp -d "$cache/src/.download.XXXXXX")
    "$PY" -m pip download -q --no-deps --no-binary "$SDIST_NAME" "$SDIST_NAME==$SDIST_VERSION" -d "$dl" >&2 \
      || { rm -rf "$dl"; die "pip download $SDIST_NAME==$SDIST_VERSION failed"; }
    [ -f "$dl/$(basename "$sdist")" ] || { rm -rf "$dl"; die "pip download did not produce $(basename "$sdist")"; }
    mv -f "$dl/$(basename "$sdist")" "$sdist"
    rm -rf "$dl"
  fi
  local got
  got=$(sha256 "$sdist" | cut -d' ' -f1)
  [ "$got" = "$SDIST_SHA256" ] || die "$sdist has sha256 $got, expected $SDIST_SHA256 (delete it to fetch it again)"
  log "extracting $SDIST_LLAMA_DIR/ from the sdist"
  local ex
  ex=$(mktemp -d "$cache/src/.extract.XXXXXX")
  tar -xzf "$sdist" -C "$ex" --strip-components=3 "$SDIST_NAME-$SDIST_VERSION/$SDIST_LLAMA_DIR/" \
    || { rm -rf "$ex"; die "extracting $SDIST_LLAMA_DIR/ from $sdist failed"; }
  [ -f "$ex/common/speculative.cpp" ] || { rm -rf "$ex"; die "no common/speculative.cpp in $sdist"; }
  # the sdist leaves out ggml.pc.in, which configure reads (for a pkg-config file not used here)
  [ -f "$ex/ggml/ggml.pc.in" ] || printf 'Name: ggml\nVersion: @GGML_VERSION@\n' > "$ex/ggml/ggml.pc.in"
  chmod 755 "$ex"
  touch "$ex/.complete"
  rm -rf "$src" && mv "$ex" "$src"
}

# --- stage 1: libraries and llama.cpp's tools ------------------------------------------------
build_libraries() {
  fetch_source
  local work buildlog start
  work=$(mktemp -d "$cache/llama/.build-$name.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  buildlog="$cache/llama/logs/$name.log"
  : > "$buildlog"
  fail() { echo "build_llama: error: $1; last lines of $buildlog:" >&2; tail -n 40 "$buildlog" >&2; exit 1; }
  start=$(date +%s)
  log "building llama.cpp $LLAMA_CPP_BUILD (CPU, key $key) with $(ncpu) jobs; log: $buildlog"
  GIT_CEILING_DIRECTORIES="$(dirname "$src")" cmake -S "$src" -B "$work/build" "${args[@]}" >>"$buildlog" 2>&1 \
    || fail "cmake configure failed"
  cmake --build "$work/build" --config Release -j"$(ncpu)" --target "${TARGETS[@]}" >>"$buildlog" 2>&1 \
    || fail "cmake build failed"
  log "compiled in $(( $(date +%s) - start )) s"
  local lib="$work/lib" f real soname plain
  mkdir -p "$lib"
  shopt -s nullglob
  for f in $(find "$work/build" -name 'lib*.so' -o -name 'lib*.so.*'); do
    real=$(readlink -f "$f")
    soname=$(readelf -d "$real" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    plain=$(basename "$f"); plain=${plain%%.so*}.so
    [ -n "$soname" ] || soname=$plain
    [ -f "$lib/$soname" ] || cp "$real" "$lib/$soname"
    [ -e "$lib/$plain" ] || ln "$lib/$soname" "$lib/$plain"
  done
  for f in llama-completion llama-speculative-simple; do
    cp "$work/build/bin/$f" "$lib/$f" || fail "the build produced no $f"
  done
  shopt -u nullglob
  for f in libllama libllama-common libggml libggml-base libggml-cpu; do
    [ -f "$lib/$f.so" ] || fail "the build produced no $f.so"
  done
  for f in "$lib"/*; do
    [ -f "$f" ] && [ -x "$f" ] || continue
    local miss
    miss=$(cd "$lib" && ldd "$f" 2>/dev/null | awk '/not found/ {print $1}' | paste -sd' ' || true)
    [ -z "$miss" ] || fail "$(basename "$f") cannot find $miss"
  done
  {
    echo "llama.cpp: $LLAMA_CPP_BUILD ($SDIST_NAME==$SDIST_VERSION sdist, $SDIST_LLAMA_DIR, sha256 $SDIST_SHA256)"
    echo "key: $key"
    echo "cmake_args: ${args[*]}"
    echo "targets: ${TARGETS[*]}"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "build_seconds: $(( $(date +%s) - start ))"
    echo "size_bytes: $(du -sb "$lib" | cut -f1)"
    echo "compiler: $(c++ --version 2>/dev/null | head -n1)"
    echo "source: $src"
  } > "$lib/build-info.txt"
  date -u +%Y-%m-%dT%H:%M:%SZ > "$lib/.complete"
  rm -rf "$out" && mv "$lib" "$out"
  rm -rf "$work"; trap - EXIT
  log "done: $out"
}

lock "$name"
[ -f "$out/.complete" ] && log "reusing $out" || build_libraries
unlock

# --- stage 2: graphgen's loop program ----------------------------------------------------------
lock "$name-loop-$loop_hash"
if [ ! -f "$loop_out/.complete" ]; then
  fetch_source
  tmp=$(mktemp -d "$cache/llama/.loop-$name.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  for f in "$out"/*; do
    case "$f" in */build-info.txt) cp "$f" "$tmp/" ;; *) ln "$f" "$tmp/" 2>/dev/null || cp -a "$f" "$tmp/" ;; esac
  done
  cp "$out/.complete" "$tmp/.libraries-complete"
  log "compiling graphgen-spec-loop"
  c++ -std=c++17 -O2 -o "$tmp/graphgen-spec-loop" "$loop_src" \
      -I"$src/include" -I"$src/common" -I"$src/ggml/include" -I"$src/vendor" \
      -L"$out" -lllama-common -lllama -lggml -lggml-base -lpthread '-Wl,-rpath,$ORIGIN' \
      2> "$tmp/compile.log" || { cat "$tmp/compile.log" >&2; die "compiling $loop_src failed"; }
  rm -f "$tmp/compile.log"
  echo "spec_loop: $loop_hash" >> "$tmp/build-info.txt"
  date -u +%Y-%m-%dT%H:%M:%SZ > "$tmp/.complete"
  rm -rf "$loop_out" && mv "$tmp" "$loop_out"
  trap - EXIT
  # builds of earlier versions of the program (hard links: the libraries stay in $out)
  for old in "$out"-loop-*; do [ "$old" = "$loop_out" ] || rm -rf "$old"; done
fi
unlock
log "done: $loop_out"
printf '%s\n' "$loop_out"
