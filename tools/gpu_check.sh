#!/usr/bin/env bash
# The CUDA check to run on a machine with an NVIDIA GPU and no network, in one command:
#
#   bash tools/gpu_check.sh prepare     # here, with network: writes the bundle build/gpu-check/
#   bash tools/gpu_check.sh             # there: build ggml-cuda, then measure (below)
#   bash tools/gpu_check.sh --dry-run   # print what it would run, run nothing
#   bash tools/gpu_check.sh --cpu       # every step with the CPU in place of CUDA0, no build: a check
#                                       # of the script itself on a machine without a GPU
#
# The GPU machine has the CUDA compiler, CMake and a Python with numpy (and PyTorch's cuBLAS
# wheels) but nothing of graphgen's own: the bundle carries the ggml source (its CPU, RPC and CUDA
# backends only, xz-compressed), ggml-python's bindings and, for that machine's Python (3.12 by
# default: GPU_CHECK_PYTHON_VERSION), the wheels graphgen needs there (gguf, cffi, pycparser, and
# llama-cpp-py-sync without its multimodal library). About 3 MiB: the working tree is already
# near 59 MiB of the 64 that travel, so nothing else is carried, not even a target model: the real
# target's loop runs on a small random llama target written on the spot (byte vocabulary, 8
# layers of 256), with a random draft made for it.
#
# Steps, each with its output in one file of the report folder ($OUT/gpu-check when OUT is set,
# else build/gpu-check-report), and summary.txt last:
#   build        tools/build_ggml.sh cuda with the machine's nvcc, sm_90 only (GPU_CHECK_ARCHS), all
#                cores; cuBLAS from the system toolkit, else from a pip nvidia/cu13 folder
#   devices      graphgen devices must list CUDA0
#   xdiff        CPU against CUDA0, flash attention on and off, on every head (dflash, dflash2,
#                dspark, lilicorr) and every backbone of the heads that take one (base, dsv4, dsv41,
#                mistral-large4): each must pass, and CUDA0 must have run nodes of its block graph
#   check-batch  on CUDA0 where check-batch takes a device; where it does not, it runs on the
#                build's CPU and the step is NOT MEASURED
#   loop         the real target's loop (b11739's target, graphgen's draft) with the draft on the
#                CPU, then on CUDA0: greedy, so both must generate the same tokens
#   bench        graphgen's block and inject steps on CUDA0 and on the CPU, a realistic draft
# A step that fails, or that cannot measure what it should, makes the exit status 1; the run stops
# starting new steps once GPU_CHECK_DEADLINE seconds (default 560) have passed, so that the
# report is written inside a 10-minute limit. The build stays in build/gpu-check-cache
# (GPU_CHECK_CACHE), so a second run on the same machine starts measuring at once. Exit 2: a
# usage error.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

SDIST_GGML=xllamacpp-2026.10.11549-ggml    # tools/build_ggml.sh's source folder in the cache
BINDINGS=ggml-python-0.0.45                # graphgen/ops/runtime.py's bindings entry
BUNDLE=${GPU_CHECK_BUNDLE:-$repo/build/gpu-check}
TREE_LIMIT_MIB=64

usage() { echo "usage: tools/gpu_check.sh [prepare | run] [--dry-run] [--cpu] [--ggml DIR]" >&2; exit 2; }
log() { echo "gpu_check: $*" >&2; }
die() { echo "gpu_check: error: $*" >&2; exit 1; }

mode=run; dry=0; cpu=0; ggml_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    prepare|run) mode=$1 ;;
    --dry-run) dry=1 ;;
    --cpu) cpu=1 ;;
    --ggml) [ $# -ge 2 ] || usage; ggml_dir=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) usage ;;
  esac
  shift
done

cache_default=${GRAPHGEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graphgen}

# --- prepare: the bundle, made where there is network ---------------------------------------------
if [ "$mode" = prepare ]; then
  pyver=${GPU_CHECK_PYTHON_VERSION:-3.12}
  PY=${PYTHON:-$([ -x .venv/bin/python ] && echo "$repo/.venv/bin/python" || echo python3)}
  src="$cache_default/src/$SDIST_GGML"
  if [ ! -f "$src/CMakeLists.txt" ]; then
    log "fetching the ggml source (tools/build_ggml.sh's configure-only run)"
    t=$(mktemp -d)
    GRAPHGEN_GGML_CONFIGURE_ONLY="$t/b" PYTHON="$PY" bash tools/build_ggml.sh cpu >/dev/null \
      || { rm -rf "$t"; die "could not fetch the ggml source"; }
    rm -rf "$t"
  fi
  [ -f "$src/CMakeLists.txt" ] || die "no ggml source in $src"
  [ -f "$cache_default/$BINDINGS/.complete" ] || "$PY" -m graphgen.ops.runtime >/dev/null || die "could not fetch ggml-python's bindings"
  rm -rf "$BUNDLE" && mkdir -p "$BUNDLE"
  # the CPU, RPC and CUDA backends are all the build uses: the other backends' folders stay behind
  others=()
  for d in "$src"/src/ggml-*/; do
    case "$(basename "$d")" in ggml-cpu|ggml-cuda|ggml-rpc) ;; *) others+=(--exclude="$SDIST_GGML/src/$(basename "$d")") ;; esac
  done
  tar -C "$(dirname "$src")" "${others[@]}" -cf - "$SDIST_GGML" | xz -9e -T0 > "$BUNDLE/ggml-src.tar.xz"
  tar -C "$cache_default" -cf - "$BINDINGS" | xz -9e > "$BUNDLE/ggml-python.tar.xz"
  site=$(mktemp -d)
  # a site folder for the GPU machine's Python, not this one's: binary wheels for its version
  "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-compile --only-binary=:all: --target "$site" \
      --python-version "$pyver" --implementation cp --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      "gguf==0.19.0" "llama-cpp-py-sync==0.11739" "cffi>=1.15" pycparser >&2 \
    || { rm -rf "$site"; die "pip could not fetch the wheels for Python $pyver"; }
  # graphgen opens libllama.so.0 and the four ggml libraries; the multimodal library and the
  # unversioned copy of libllama are a third of the wheel
  rm -f "$site/llama_cpp_py_sync/libmtmd.so" "$site/llama_cpp_py_sync/libllama.so"
  rm -rf "$site/bin"
  tar -C "$site" -cf - . | xz -9e -T0 > "$BUNDLE/site-cp${pyver/./}.tar.xz"
  rm -rf "$site"
  {
    echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) for Python $pyver"
    (cd "$BUNDLE" && sha256sum ./*.tar.xz)
  } > "$BUNDLE/MANIFEST"
  bundle_b=$(du -cb "$BUNDLE"/* | tail -n1 | cut -f1)
  tree_b=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r stat -c %s 2>/dev/null \
            | awk '{s += $1} END {print s + 0}')
  total=$(( bundle_b + tree_b ))
  log "bundle $BUNDLE: $(awk -v b="$bundle_b" 'BEGIN {printf "%.1f", b / 1048576}') MiB; with the working tree" \
      "$(awk -v b="$total" 'BEGIN {printf "%.1f", b / 1048576}') MiB of the $TREE_LIMIT_MIB that travel"
  [ "$total" -le $(( TREE_LIMIT_MIB * 1048576 )) ] || die "the working tree and the bundle are over $TREE_LIMIT_MIB MiB"
  printf '%s\n' "$BUNDLE"
  exit 0
fi

# --- run --------------------------------------------------------------------------------------------
t_start=$(date +%s)
deadline=${GPU_CHECK_DEADLINE:-560}
report=${OUT:+$OUT/gpu-check}
report=${report:-$repo/build/gpu-check-report}
dev=CUDA0; [ "$cpu" = 1 ] && dev=CPU
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
summary=()
failed=0

if [ "$dry" = 0 ]; then
  rm -rf "$report" && mkdir -p "$report"
fi
left() { echo $(( deadline - ($(date +%s) - t_start) )); }
# step NAME FILE CMD...: runs CMD with its output in the report's FILE, within the time left
step() {
  local name=$1 file=$2; shift 2
  if [ "$dry" = 1 ]; then printf '[%s] %s\n' "$name" "$*"; return 0; fi
  local budget rc t0
  budget=$(left)
  if [ "$budget" -le 5 ]; then
    echo "== $name: not run, the ${deadline} s deadline has passed" >> "$report/$file"
    return 124
  fi
  t0=$(date +%s)
  { echo "== $name: $*"; } >> "$report/$file"
  set +e
  timeout "$budget" "$@" >> "$report/$file" 2>&1
  rc=$?
  set -e
  echo "== $name: exit $rc in $(( $(date +%s) - t0 )) s" >> "$report/$file"
  return $rc
}
result() {   # result NAME STATUS WHAT: one line of the summary; anything but PASS fails the run
  summary+=("$(printf '%-12s %-13s %s' "$1" "$2" "$3")")
  [ "$2" = PASS ] || failed=1
  log "$1: $2 $3"
}

# --- the Python helpers the steps run -------------------------------------------------------------
cat > "$work/find_cublas.py" <<'EOF'
# a pip cuBLAS folder (nvidia/cu13, nvidia/cublas): its include/cublas_v2.h and lib/libcublas.so.*
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for r in roots:
    for h in sorted(glob.glob(os.path.join(r, "nvidia", "*", "include", "cublas_v2.h"))):
        d = os.path.dirname(os.path.dirname(h))
        if glob.glob(os.path.join(d, "lib", "libcublas.so.*")):
            print(d)
            sys.exit(0)
EOF
cat > "$work/nodes_on.py" <<'EOF'
# how many of the block graph's nodes the device ran, in the second backend's dump of an xdiff
import glob, json, os, sys
out, dev = sys.argv[1], sys.argv[2].lower()
dirs = sorted(d for d in glob.glob(os.path.join(out, "*")) if os.path.isdir(d))
mine = [d for d in dirs if os.path.basename(d).lower().startswith(dev[:4])] or dirs[-1:]
nodes = json.load(open(sorted(glob.glob(os.path.join(mine[-1], "*-block.json")))[0]))["nodes"]
on = sum(1 for n in nodes if (n.get("backend") or "").lower().startswith(dev[:4]))
print(f"{on}/{len(nodes)}")
EOF
cat > "$work/loop_verdict.py" <<'EOF'
# the loop's two runs (the draft on the CPU, then on the device): same tokens, and what differed
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a["tokens"] == b["tokens"]
drafts_same = sum(1 for x, y in zip(a["rounds_detail"], b["rounds_detail"]) if x.get("draft") == y.get("draft"))
print("same" if same else "differ",
      f"{b['generated_tokens']} tokens in {b['rounds']} rounds; drafts equal in {drafts_same}/{len(b['rounds_detail'])} rounds; "
      f"accepted {a['accepted_tokens']} (CPU draft) and {b['accepted_tokens']} ({sys.argv[2].rsplit('-', 1)[-1][:-5]} draft); "
      f"eval {a['eval']['tokens_per_s']:.1f} and {b['eval']['tokens_per_s']:.1f} tokens/s; "
      f"same tokens as the target alone: {a['same_tokens_as_target_alone']} and {b['same_tokens_as_target_alone']}")
EOF
cat > "$work/mk_target.py" <<'EOF'
import sys
import numpy as np
import gguf

# a random llama target: b11739 publishes its layer inputs; a SentencePiece vocabulary of the 256
# byte tokens (plus unk, bos, eos, a mask and the word boundary) tokenizes any text
n_embd, n_layer, n_head, n_head_kv, n_ff = 256, 8, 4, 2, 512
tokens = ["<unk>", "<s>", "</s>", "<mask>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
types = [2, 3, 3, 3] + [6] * 256 + [1]
w = gguf.GGUFWriter(sys.argv[1], "llama")
w.add_name("gpu-check-target")
w.add_context_length(4096)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff)
w.add_head_count(n_head)
w.add_head_count_kv(n_head_kv)
w.add_rope_dimension_count(n_embd // n_head)
w.add_layer_norm_rms_eps(1e-5)
w.add_rope_freq_base(10000.0)
w.add_vocab_size(len(tokens))
w.add_file_type(0)
w.add_tokenizer_model("llama")
w.add_tokenizer_pre("default")
w.add_token_list(tokens)
w.add_token_scores([0.0] * len(tokens))
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_unk_token_id(0)
w.add_add_bos_token(True)
rng = np.random.default_rng(7)


def normal(name, *shape, std=0.05):
    w.add_tensor(name, (rng.standard_normal(shape) * std).astype(np.float32))


normal("token_embd.weight", len(tokens), n_embd, std=1.0)
w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
hd = n_embd // n_head
for i in range(n_layer):
    w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
    normal(f"blk.{i}.attn_q.weight", n_embd, n_embd)
    normal(f"blk.{i}.attn_k.weight", n_head_kv * hd, n_embd)
    normal(f"blk.{i}.attn_v.weight", n_head_kv * hd, n_embd)
    normal(f"blk.{i}.attn_output.weight", n_embd, n_embd)
    normal(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
    normal(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
    normal(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
EOF

# --- the Python and graphgen, from the working tree ------------------------------------------------
PY=${GPU_CHECK_PYTHON:-${PYTHON:-}}
if [ -z "$PY" ]; then
  if [ "$cpu" = 1 ] && [ -x .venv/bin/python ]; then PY="$repo/.venv/bin/python"; else PY=python3; fi
fi
command -v "$PY" >/dev/null || die "no Python ($PY)"
# a virtual environment's own tools (pip's cmake and ninja) beside its Python
PATH="$(dirname "$(command -v "$PY")"):$PATH"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
if [ "$cpu" = 0 ] || [ -n "${GPU_CHECK_CACHE:-}" ]; then
  # a cache of its own, seeded from the bundle (nothing may be fetched there), kept in the tree so
  # that a second run on the same machine reuses the finished build
  export GRAPHGEN_CACHE=${GPU_CHECK_CACHE:-$repo/build/gpu-check-cache}
  mkdir -p "$GRAPHGEN_CACHE/src"
fi
cache=${GRAPHGEN_CACHE:-$cache_default}
if ! "$PY" -c "import gguf, cffi, llama_cpp_py_sync" 2>/dev/null; then
  pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
  [ -f "$BUNDLE/site-cp$pyver.tar.xz" ] || [ "$dry" = 1 ] \
    || die "$PY lacks graphgen's packages and $BUNDLE has none for Python $pyver: run tools/gpu_check.sh prepare (GPU_CHECK_PYTHON_VERSION=...) and carry build/gpu-check"
  if [ "$dry" = 0 ]; then
    mkdir -p "$work/site" && xz -dc "$BUNDLE/site-cp$pyver.tar.xz" | tar -C "$work/site" -xf -
    export PYTHONPATH="$PYTHONPATH:$work/site"
  fi
fi
for part in "src/$SDIST_GGML:ggml-src" "$BINDINGS:ggml-python"; do
  [ -e "$cache/${part%%:*}" ] && continue
  f="$BUNDLE/${part#*:}.tar.xz"
  [ -f "$f" ] || [ "$dry" = 1 ] || die "no $f: run tools/gpu_check.sh prepare and carry build/gpu-check"
  if [ "$dry" = 0 ] && [ -f "$f" ]; then
    dest="$cache"; [ "${part#*:}" = ggml-src ] && dest="$cache/src"
    mkdir -p "$dest" && xz -dc "$f" | tar -C "$dest" -xf -
  fi
done
# graphgen's command line, on the ggml being checked (set again once the build has made it)
GG=("$PY" -m graphgen.cli --quiet ${ggml_dir:+--ggml "$ggml_dir"})

if [ "$dry" = 0 ]; then
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   host: $(uname -srm)   cores: $(nproc)"
    echo "mode: $([ "$cpu" = 1 ] && echo "--cpu (CPU in place of CUDA0)" || echo "CUDA0")"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | wc -l | tr -d ' ') changed files"
    echo "python: $PY ($("$PY" --version 2>&1)); numpy $("$PY" -c 'import numpy; print(numpy.__version__)' 2>&1)"
    echo "cmake: $(cmake --version 2>/dev/null | head -n1)   ninja: $(ninja --version 2>/dev/null || echo none)"
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -n1 || echo none)"
    echo "nvidia-smi:"; nvidia-smi 2>&1 | head -n 20 || true
    [ -f "$BUNDLE/MANIFEST" ] && { echo "bundle:"; cat "$BUNDLE/MANIFEST"; }
  } > "$report/env.txt" 2>&1
fi

# --- build ----------------------------------------------------------------------------------------
if [ -z "$ggml_dir" ] && [ "$cpu" = 0 ]; then
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "no nvcc on this machine"
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  top=$("$nvcc" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1) || true
  [ -n "$top" ] || die "$nvcc does not say where its toolkit is (nvcc --dryrun)"
  # the toolkit's CUDA runtime, whether or not the loader's cache lists it
  export LD_LIBRARY_PATH="$top/lib64:$top/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  command -v make >/dev/null || command -v ninja >/dev/null || die "neither make nor ninja on this machine"
  cublas=""
  if [ -z "$(find -L "$top/include" "$top/targets" -maxdepth 3 -name cublas_v2.h 2>/dev/null | head -n1)" ]; then
    # the toolkit has no cuBLAS: PyTorch's pip wheels bring one (nvidia/cu13, or nvidia/cublas)
    cublas=$("$PY" "$work/find_cublas.py") || true
    [ -n "$cublas" ] || [ "$dry" = 1 ] || die "the CUDA toolkit in $top has no cuBLAS, and no pip nvidia/*/include/cublas_v2.h was found"
  fi
  archs=${GPU_CHECK_ARCHS:-90-real}
  if [ "$dry" = 1 ]; then
    echo "[build] CUDAARCHS=$archs GRAPHGEN_CUDA_CUBLAS=${cublas:-} tools/build_ggml.sh cuda (toolkit $top, $(nproc) jobs)"
    ggml_dir='$(build)'
    GG=("$PY" -m graphgen.cli --quiet --ggml "$ggml_dir")
  else
    log "building ggml-cuda for $archs with $top's nvcc${cublas:+, cuBLAS from $cublas} ($(nproc) jobs)"
    t0=$(date +%s)
    if step build build.txt env CUDAARCHS="$archs" ${cublas:+GRAPHGEN_CUDA_CUBLAS="$cublas"} PYTHON="$PY" \
         bash -c 'bash tools/build_ggml.sh cuda > "$0"' "$work/ggml-dir"; then
      ggml_dir=$(cat "$work/ggml-dir")
      GG=("$PY" -m graphgen.cli --quiet --ggml "$ggml_dir")
      cat "$ggml_dir/build-info.txt" >> "$report/build.txt"
      result build PASS "$(( $(date +%s) - t0 )) s, $(du -sh "$ggml_dir" | cut -f1), $ggml_dir"
    else
      tail -n 60 "$cache"/ggml/logs/cuda-*.log >> "$report/build.txt" 2>/dev/null || true
      result build FAIL "after $(( $(date +%s) - t0 )) s (build.txt)"
      printf '%s\n' "${summary[@]}" > "$report/summary.txt"
      exit 1
    fi
  fi
fi
[ "$cpu" = 1 ] && [ "$dry" = 0 ] && result build PASS "skipped (--cpu): ${ggml_dir:-the reference ggml}"

# --- devices ----------------------------------------------------------------------------------------
if step devices devices.txt "${GG[@]}" devices; then
  if [ "$dry" = 0 ]; then
    if grep -qE "^  $dev " "$report/devices.txt"; then result devices PASS "$dev listed"
    else result devices FAIL "no $dev in the device list (devices.txt)"; fi
  fi
else
  result devices FAIL "graphgen devices failed (devices.txt)"
fi

# --- xdiff: every head and backbone, flash attention on and off -----------------------------------
# 256 wide, heads of 64: a size CUDA's flash-attention kernels take (mistral-large4 sets its own)
drafts="dflash:base dflash:dsv4 dflash:dsv41 dflash:mistral-large4 dflash2:base dspark:base dspark:dsv4 dspark:dsv41 dspark:mistral-large4 lilicorr:base"
x_pass=0; x_fail=""; x_cpu_only=""
for vb in $drafts; do
  v=${vb%%:*}; b=${vb#*:}
  shape=(--n-embd 256 --heads 4 --heads-kv 2); [ "$b" = mistral-large4 ] || shape+=(--head-dim 64)
  model="$work/$v-$b.gguf"
  step make-model xdiff.txt "${GG[@]}" make-model "$model" --variant "$v" --backbone "$b" "${shape[@]}" || { x_fail+=" $v-$b(make-model)"; continue; }
  for fa in off on; do
    out="$work/x-$v-$b-$fa"
    if step "xdiff $v $b fa $fa" xdiff.txt "${GG[@]}" xdiff "$model" -dev "CPU,$dev" -fa "$fa" --out "$out"; then
      [ "$dry" = 1 ] && continue
      # where the block graph ran: a comparison the CPU ran alone has not measured the GPU
      ran=$("$PY" "$work/nodes_on.py" "$out" "$dev") || ran="?/?"
      echo "   $v $b fa $fa: block nodes on $dev: $ran" >> "$report/xdiff.txt"
      if [ "${ran%%/*}" = 0 ] || [ "${ran%%/*}" = "?" ]; then x_cpu_only+=" $v-$b-fa$fa"; else x_pass=$((x_pass + 1)); fi
    else
      x_fail+=" $v-$b-fa$fa"
    fi
    rm -rf "$out"
  done
done
if [ "$dry" = 0 ]; then
  if [ -n "$x_fail" ]; then result xdiff FAIL "$x_pass/20 passed; failed:$x_fail (xdiff.txt)"
  elif [ -n "$x_cpu_only" ]; then result xdiff "NOT MEASURED" "no block node ran on $dev:$x_cpu_only (xdiff.txt)"
  else result xdiff PASS "20/20 (10 drafts x fa on/off), CPU vs $dev"; fi
fi

# --- check-batch ------------------------------------------------------------------------------------
cb_model="$work/dflash-base.gguf"
# a block that depends on the batch is a finding, not a failure: exit 0 and 1 both measured it
cb_help=$("${GG[@]}" check-batch --help 2>/dev/null || true)
if printf '%s\n' "$cb_help" | grep -E '(^|[ ,])-dev[ ,]' >/dev/null; then
  step check-batch check-batch.txt "${GG[@]}" check-batch "$cb_model" -dev "$dev" --engine graphgen && rc=0 || rc=$?
  if [ "$dry" = 0 ]; then
    verdict=$(grep -E '^graphgen: ' "$report/check-batch.txt" | tail -n1 | cut -c1-160)
    case "$rc" in 0|1) result check-batch PASS "on $dev: ${verdict:-?}" ;; *) result check-batch FAIL "exit $rc on $dev (check-batch.txt)" ;; esac
  fi
else
  # no device option: it runs for the record on this build's CPU (both engines, exit 1 only where
  # they differ), but CUDA is not measured
  step check-batch check-batch.txt "${GG[@]}" check-batch "$cb_model" --fail-on parity && rc=0 || rc=$?
  if [ "$dry" = 0 ]; then
    if [ "$cpu" = 1 ]; then
      [ "$rc" = 0 ] && result check-batch PASS "CPU, graphgen and b11739 bit-identical" || result check-batch FAIL "exit $rc (check-batch.txt)"
    else
      result check-batch "NOT MEASURED" "check-batch takes no device (-dev), so it cannot run on $dev; on the CPU it exited $rc (check-batch.txt)"
    fi
  fi
fi

# --- the real target's loop, the draft on the CPU and on the GPU ----------------------------------
target="$work/target.gguf"; draft="$work/loop-draft.gguf"
loop_ok=1
step target loop.txt "$PY" "$work/mk_target.py" "$target" || loop_ok=0
[ "$loop_ok" = 1 ] && { step make-model loop.txt "${GG[@]}" make-model "$draft" --target "$target" --layers 1 --block-size 8 || loop_ok=0; }
for d in CPU "$dev"; do
  [ "$loop_ok" = 1 ] || break
  step "loop -devd $d" loop.txt bash -c '"$@" > "$0"' "$work/loop-$d.json" "${GG[@]}" draft -m "$target" -md "$draft" -p "The capital of France is" \
      -p "def fib(n):" -np 2 -n 48 --temp 0 -devd "$d" --json || loop_ok=0
done
if [ "$dry" = 0 ]; then
  if [ "$loop_ok" = 1 ]; then
    verdict=$("$PY" "$work/loop_verdict.py" "$work/loop-CPU.json" "$work/loop-$dev.json" 2>>"$report/loop.txt") \
      || verdict="unreadable output"
    echo "   $verdict" >> "$report/loop.txt"
    case "$verdict" in same*) result loop PASS "${verdict#same }" ;; *) result loop FAIL "the draft's device changed the text: $verdict (loop.txt)" ;; esac
  else
    result loop FAIL "the loop did not run (loop.txt)"
  fi
fi

# --- bench ---------------------------------------------------------------------------------------------
bench_model="$work/bench-dflash.gguf"
if step make-model bench.txt "${GG[@]}" make-model "$bench_model" --variant dflash --preset realistic; then
  b_ok=1
  step "bench $dev" bench.txt "${GG[@]}" bench "$bench_model" -dev "$dev" --engine graphgen --repeat 10 -np 1,4 -t "$(nproc)" || b_ok=0
  if [ "$dev" != CPU ]; then
    step "bench CPU" bench.txt "${GG[@]}" bench "$bench_model" -dev CPU --engine graphgen --repeat 10 -np 1,4 -t "$(nproc)" || b_ok=0
  fi
  if [ "$dry" = 0 ]; then
    line=$(grep -m1 -E '^  block ' "$report/bench.txt" | awk '{print $3 " ms (block of " $2 ")"}' || true)
    if [ "$b_ok" = 1 ]; then result bench PASS "realistic dflash at n_seq 1 on $dev: ${line:-?} (bench.txt)"
    else result bench FAIL "(bench.txt)"; fi
  fi
else
  [ "$dry" = 1 ] || result bench FAIL "make-model failed (bench.txt)"
fi

[ "$dry" = 1 ] && exit 0
{
  echo "gpu_check $([ "$failed" = 0 ] && echo PASSED || echo FAILED) in $(( $(date +%s) - t_start )) s ($([ "$cpu" = 1 ] && echo "--cpu" || echo "$dev"))"
  printf '%s\n' "${summary[@]}"
} > "$report/summary.txt"
cat "$report/summary.txt" >&2
log "report: $report"
exit "$failed"
