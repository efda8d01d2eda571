#!/usr/bin/env bash
# A lent GPU machine's session (issue #35), scripted ahead so that it fits the device time: the
# machine has torch but no TensorFlow and no network, and a call carries at most 64 MiB.
#
# usage:
#   tools/gpu_session.sh pack BUNDLE_DIR [WHEEL...]        here: carry folders .gpu/p00, p01, ...
#   tools/gpu_session.sh fits                              here: each folder still fits one call
#   tools/gpu_session.sh probe                             there: the machine, the sm_90 trim checked
#   tools/gpu_session.sh stage .gpu/pNN                    there: keep one carried part in /tmp
#   tools/gpu_session.sh install                           there: unpack TensorFlow into /tmp/tf
#   tools/gpu_session.sh check                             there: TensorFlow sees the GPU, XLA runs
#   tools/gpu_session.sh test [PYTEST ARGS]                there: the GPU-relevant tests
#   tools/gpu_session.sh bench [smoke|quick|full|large|base]  there: GPU benchmarks, both sides
#   tools/gpu_session.sh finish SECONDS                    there: the last call, all of the above
#
# BUNDLE_DIR is what ../shared/gpu/make_bundle.sh wrote for the device's Python (3.12 there);
# WHEELs are the project's own wheels the device lacks: tf-keras, tensorflow-hub and setuptools<81
# for its pkg_resources (`pip download --no-deps --python-version 3.12 ...`; tensorflow-text,
# 60 MB, serves build_vocab only, which no GPU test runs, and the device's torch Python has the
# rest). `pack` keeps the device's GPU architecture alone in the bundle's CUDA libraries
# (trim_fatbins.py, PACK_CUDA_ARCH), recompresses it harder (zstd -19: 13 parts of 60 MiB
# become 7) and cuts it into the largest parts that
# fit one call beside the working tree with PACK_RESERVE_KIB to spare (the tree may grow a little
# before the session: `fits` checks again), one folder a part, each with the MANIFEST and the
# installer, the wheels in the last; it prints the calls.
# On the device, each call carries one folder (`carry: [".gpu/pNN"]`) and runs `stage` on it;
# the machine keeps /tmp only while warm (about 30 s after a call), so the calls follow each
# other without a pause, and each says how many parts are there. Results go to $OUT (the device
# tool's folder that comes back), or ./gpu_results elsewhere.
#
# Environment: TF_ROOT (default /tmp/tf), STAGE (default /tmp/bundle), CALL_MIB (default 64),
# PACK_LEVEL (zstd level of pack, default 19), PACK_RESERVE_KIB (default 512), PACK_CUDA_ARCH
# (the device's GPU architecture pack keeps, default 90; all: every one), BENCH_DEADLINE
# (seconds `bench` may take in all, default 480: one device call runs 10 minutes at most),
# BENCH_CHILD_SECONDS (the most one benchmark child may take, default 150), GPU_XLA_FLAGS (XLA
# flags of our children, default --xla_gpu_enable_triton_gemm=false), TEST_SECONDS and
# TEST_WORKERS (`test`: default 3600 and 4; 8 under `finish`), FINISH_LARGE_S and
# FINISH_TESTS_S (`finish`'s BERT-Large and tests, default 300 and 150).
# TensorFlow's variables (the bundle's env.sh: PYTHONPATH, CUDA 12 libraries) reach only the
# TensorFlow processes: the benchmarks' torch children run without them (BENCH_TF_ENV).
set -euo pipefail

START_DIR=$PWD
cd "$(dirname "$0")/.."
TF_ROOT=${TF_ROOT:-/tmp/tf}
STAGE=${STAGE:-/tmp/bundle}
CALL_MIB=${CALL_MIB:-64}
RESULTS=${OUT:-$PWD/gpu_results}
PY=${PYTHON:-python3}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
die() { echo "error: $*" >&2; exit 1; }
absolute() { case $1 in /*) echo "$1" ;; *) echo "$START_DIR/$1" ;; esac; }

tree_bytes() {  # what a device call carries besides `carry`: tracked and untracked-not-ignored
  local f
  git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do { [ -f "$f" ] && stat -c %s -- "$f"; } || true; done \
    | awk '{n += $1} END {printf "%.0f\n", n}'
}

fits() {  # every carry folder beside the working tree as it is now, within one call
  local limit=$((CALL_MIB * 1048576)) tree folder bytes bad=0
  tree=$(tree_bytes)
  compgen -G ".gpu/p*" >/dev/null || die "no carry folders in .gpu: run pack first"
  for folder in .gpu/p*; do
    bytes=$(du -sb "$folder" | cut -f1)
    if [ $((bytes + tree)) -gt "$limit" ]; then
      echo "$folder: $((bytes + tree)) bytes with the $((tree / 1024)) KiB tree, over $CALL_MIB MiB"
      bad=1
    fi
  done
  [ "$bad" = 0 ] || die "the working tree grew since pack: make it smaller, or pack again"
  echo "every carry folder fits one call beside the $((tree / 1024)) KiB working tree"
}

pack() {
  local bundle wheel wheels=()
  bundle=$(absolute "$1"); shift
  for wheel in "$@"; do wheels+=("$(absolute "$wheel")"); done
  set -- "${wheels[@]+"${wheels[@]}"}"
  [ -f "$bundle/MANIFEST" ] && [ -f "$bundle/install_bundle.sh" ] \
    || die "$bundle: no MANIFEST and install_bundle.sh (make it with ../shared/gpu/make_bundle.sh)"
  local wheels_bytes=0
  for wheel in "$@"; do
    case $wheel in *.whl) [ -f "$wheel" ] || die "$wheel: no such wheel" ;;
      *) die "$wheel: not a .whl file" ;; esac
    wheels_bytes=$((wheels_bytes + $(stat -c %s "$wheel")))
  done
  git check-ignore -q .gpu/p00/part-000 \
    || die ".gpu is not ignored by git: it would travel in every call"
  [ ! -e .gpu ] || [ -z "$(ls -A .gpu)" ] || die ".gpu is not empty: remove it first"
  field() { awk -v k="$1" '$1 == k {print $2; exit}' "$bundle/MANIFEST"; }
  [ "$(field compression)" = zstd ] || die "$bundle: a zstd bundle is needed (BUNDLE_COMPRESS=zstd)"
  bash "$bundle/install_bundle.sh" --check "$bundle" >/dev/null \
    || die "$bundle: parts missing or damaged"
  # Fewer calls: the bundle recompressed harder (its -3 to -PACK_LEVEL, in the window every zstd
  # decoder takes by default, so install_bundle.sh unpacks it as it is) and cut into the largest
  # parts that fit one call beside the working tree, the installer and MANIFEST, with a reserve.
  local level=${PACK_LEVEL:-19} tree limit part_bytes
  tree=$(tree_bytes)
  limit=$((CALL_MIB * 1048576))
  part_bytes=$((limit - tree - $(stat -c %s "$bundle/install_bundle.sh") - 16384 \
    - ${PACK_RESERVE_KIB:-512} * 1024))
  [ "$part_bytes" -gt 65536 ] || die "the working tree leaves no room for a part in $CALL_MIB MiB"
  mkdir -p .gpu
  work=$(mktemp -d .gpu/.pack.XXXXXX)
  trap 'rm -rf "$work" .gpu/p[0-9]*' EXIT  # a failed pack leaves no folders behind
  local arch=${PACK_CUDA_ARCH:-90} tree_bytes=
  if [ "$arch" = all ]; then
    echo "recompressing $(($(field archive_bytes) / 1048576)) MiB at zstd -$level (minutes)"
    cat "$bundle"/part-* | zstd -dcq --long=27 | nice zstd -q -T0 "-$level" --long=27 \
      | split -b "$part_bytes" -d -a 3 - "$work/part-"
  else
    # Only the device's GPU architecture: the libraries' device code for the others (sm_50 to
    # sm_89, and PTX beside sm_90 machine code) is never read there, and the static symbol
    # tables of TensorFlow's libraries serve debuggers only (loading reads the dynamic ones):
    # together about 800 of 2,200 MiB, 11 carry folders down to 7.
    local unpacked=$work/tree
    mkdir "$unpacked"
    echo "unpacking $(($(field archive_bytes) / 1048576)) MiB to keep sm_$arch only"
    cat "$bundle"/part-* | zstd -dcq --long=27 | tar -x -C "$unpacked" -f -
    local libs=()
    mapfile -d '' libs < <(find "$unpacked" -type f \( -name '*.so' -o -name '*.so.*' \) -print0)
    [ ${#libs[@]} -eq 0 ] || "$PY" tools/trim_fatbins.py --arch "$arch" "${libs[@]}" | tail -n 1
    if [ -d "$unpacked/tensorflow" ]; then
      find "$unpacked/tensorflow" -type f \( -name '*.so' -o -name '*.so.*' \) -print0 \
        | xargs -0 -r strip --strip-unneeded
    fi
    (cd "$unpacked" && find . -type f ! -path ./.bundle/TREE.sha256 -print0 | LC_ALL=C sort -z \
      | xargs -0 sha256sum >.bundle/TREE.sha256)
    tree_bytes=$(du -sb "$unpacked" | cut -f1)
    echo "compressing $(du -sm "$unpacked" | cut -f1) MiB at zstd -$level (minutes)"
    tar -C "$unpacked" --sort=name --owner=0 --group=0 --numeric-owner -cf - . \
      | nice zstd -q -T0 "-$level" --long=27 | split -b "$part_bytes" -d -a 3 - "$work/part-"
    rm -rf "$unpacked"
  fi
  local parts=("$work"/part-*) archive_bytes archive_sha256
  archive_bytes=$(cat "${parts[@]}" | wc -c)
  archive_sha256=$(cat "${parts[@]}" | sha256sum | cut -d' ' -f1)
  {
    awk -v trimmed="$tree_bytes" '$1 != "archive_bytes" && $1 != "archive_sha256" \
      && $1 != "parts" && $1 != "part" && !(trimmed && $1 == "tree_bytes")' "$bundle/MANIFEST"
    [ "$arch" = all ] || echo "cuda_arch sm_$arch"
    [ -z "$tree_bytes" ] || echo "tree_bytes $tree_bytes"
    echo "archive_bytes $archive_bytes"
    echo "archive_sha256 $archive_sha256"
    echo "parts ${#parts[@]}"
    for part in "${parts[@]}"; do
      echo "part $(basename "$part") $(stat -c %s "$part") $(sha256sum "$part" | cut -d' ' -f1)"
    done
  } >"$work/MANIFEST"
  # The files of ../shared that the GPU tests read (18 MiB; ../shared itself does not travel):
  # without them 62 of the 177 tests skipped there (2026-11-30). They and the wheels ride with
  # the last part when they fit beside it, else in a folder of their own.
  local wanted=() path extras=("$@")
  for path in "${SHARED_FOR_TESTS[@]}"; do [ ! -e "../shared/$path" ] || wanted+=("$path"); done
  if [ ${#wanted[@]} -gt 0 ]; then
    tar -czf "$work/shared.tar.gz" -C ../shared "${wanted[@]}"
    extras+=("$work/shared.tar.gz")
    wheels_bytes=$((wheels_bytes + $(stat -c %s "$work/shared.tar.gz")))
  fi
  local i=0 folder bytes worst=0 last=$((${#parts[@]} - 1)) last_bytes
  last_bytes=$(stat -c %s "${parts[$last]}")
  [ $((last_bytes + wheels_bytes)) -le "$part_bytes" ] || parts+=("")
  for part in "${parts[@]}"; do
    folder=.gpu/$(printf 'p%02d' "$i")
    mkdir -p "$folder"
    [ -z "$part" ] || mv "$part" "$folder/"
    cp "$work/MANIFEST" "$bundle/install_bundle.sh" "$folder/"
    if [ ${#extras[@]} -gt 0 ] && [ "$i" = $((${#parts[@]} - 1)) ]; then
      cp "${extras[@]}" "$folder/"
    fi
    bytes=$(du -sb "$folder" | cut -f1)
    [ $((bytes + tree)) -le "$limit" ] \
      || die "$folder and the working tree are over one call's $CALL_MIB MiB"
    [ "$bytes" -le "$worst" ] || worst=$bytes
    i=$((i + 1))
  done
  rm -rf "$work"
  trap - EXIT
  echo "$i carry folders in .gpu ($((archive_bytes / 1048576)) MiB; the largest call" \
    "$(((worst + tree) / 1048576)) MiB with the $((tree / 1024)) KiB tree)."
  echo "Just before the session: bash tools/gpu_session.sh fits"
  echo "On the device, one call a folder, no pauses:"
  for ((j = 0; j < i; j++)); do
    printf '  run(carry=[".gpu/p%02d"], command="%s stage .gpu/p%02d")\n' "$j" \
      "bash tools/gpu_session.sh" "$j"
  done
  echo "the first with probe before stage; the last, after stage (timeout_s 598):"
  echo "  bash tools/gpu_session.sh finish 570"
}

stage() {
  local folder=${1%/}
  [ -d "$folder" ] || die "$folder: not carried into this call"
  mkdir -p "$STAGE"
  cp "$folder"/* "$STAGE/"
  # Says "N of M parts present and intact" and names the missing ones (exit 1 until all are in).
  bash "$STAGE/install_bundle.sh" --check "$STAGE" || true
}

SHARED_FOR_TESTS=(reference/pretraining data/corpus/wikitext2_valid.sent_per_line.txt
                  data/glue/MRPC data/glue/SST-2 data/squad/dev-v1.1.json
                  data/checkpoints/tiny_tf1_test_checkpoint)

probe() {  # the first call: the machine as found, and the fat-binary trim on its own cuBLAS
  mkdir -p "$RESULTS"
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    echo "cores $(nproc); $(df -h /tmp | tail -n 1)"
    "$PY" -c 'import sys, torch, transformers, numpy
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "numpy", numpy.__version__)'
    command -v cuobjdump || echo "no cuobjdump"
  } 2>&1 | tee "$RESULTS/probe.txt"
  # pack keeps only sm_90 in the bundle's libraries (tools/trim_fatbins.py). Torch's own cuBLAS,
  # trimmed the same way and preloaded, must give the same products bit for bit.
  local dir=/tmp/trimcheck lib
  rm -rf "$dir" && mkdir -p "$dir"
  lib=$("$PY" -c 'import torch
x = torch.ones(64, 64, device="cuda")
(x @ x).cpu()
print([l.split()[-1] for l in open("/proc/self/maps") if "libcublasLt.so" in l][0])')
  cp "$lib" "$(dirname "$lib")"/libcublas.so.* "$dir/"
  "$PY" tools/trim_fatbins.py --arch 90 "$dir"/libcublas*.so.* 2>&1 | tee -a "$RESULTS/probe.txt"
  local products='import hashlib, sys, torch
g = torch.Generator(device="cuda").manual_seed(0)
h = hashlib.sha256()
for m, k, n in [(4096, 1024, 4096), (1024, 4096, 1024), (8192, 768, 3072), (77, 333, 129)]:
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        a = torch.randn(m, k, device="cuda", generator=g).to(dt)
        b = torch.randn(k, n, device="cuda", generator=g).to(dt)
        h.update((a @ b).float().cpu().numpy().tobytes())
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libcublas" in l]
print(h.hexdigest(), sorted(set(maps)))'
  {
    echo "products, torch's cuBLAS:      $("$PY" -c "$products" 2>&1 | tail -n 1)"
    echo "products, trimmed and preloaded: $(LD_PRELOAD="$(ls "$dir"/libcublasLt.so.* \
      "$dir"/libcublas.so.* | tr '\n' ' ')" "$PY" -c "$products" 2>&1 | tail -n 1)"
    ! command -v cuobjdump >/dev/null || echo "cuobjdump lists $(cuobjdump --list-elf \
      "$dir"/libcublasLt.so.* 2>&1 | grep -c sm_) ELF images in the trimmed cuBLASLt"
  } | tee -a "$RESULTS/probe.txt"
}

env_file() { echo "$TF_ROOT/.bundle/env.sh"; }

install() {
  if [ -f "$(env_file)" ]; then
    echo "TensorFlow already unpacked in $TF_ROOT"
  else
    [ -f "$STAGE/MANIFEST" ] || die "no parts staged in $STAGE: run stage first"
    mkdir -p "$RESULTS"
    # Its whole report (TensorFlow's requirements as this Python meets them) comes back in $OUT.
    PYTHON=$PY bash "$STAGE/install_bundle.sh" "$STAGE" "$TF_ROOT" >"$RESULTS/install.txt"
    sed -n '/^unpacking/,/^Installed/p' "$RESULTS/install.txt" | sed '$d'  # requirements too
  fi
  if compgen -G "$STAGE/*.whl" >/dev/null; then
    # The project's own wheels (tf-keras, tensorflow-hub) beside TensorFlow, not in torch's Python.
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$TF_ROOT" \
      --upgrade "$STAGE"/*.whl
  fi
  # Several TensorFlow processes share the GPU (tests, benchmark children): take memory as needed.
  grep -q TF_FORCE_GPU_ALLOW_GROWTH "$(env_file)" \
    || echo "export TF_FORCE_GPU_ALLOW_GROWTH=true" >>"$(env_file)"
  # XLA flags of one run on top of the bundle's (bench sets GPU_XLA_FLAGS for our XLA variant).
  grep -q GPU_XLA_FLAGS "$(env_file)" \
    || echo 'export XLA_FLAGS="$XLA_FLAGS${GPU_XLA_FLAGS:+ $GPU_XLA_FLAGS}"' >>"$(env_file)"
}

with_tf() {  # a command with TensorFlow's variables
  [ -f "$(env_file)" ] || die "TensorFlow is not installed in $TF_ROOT: run install first"
  ( . "$(env_file)" && "$@" )
}

check() {
  [ -f "$(env_file)" ] || die "TensorFlow is not installed in $TF_ROOT: run install first"
  mkdir -p "$RESULTS"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
    2>&1 | tee "$RESULTS/nvidia_smi.txt" || true
  with_tf "$PY" - <<'PY' 2>&1 | tee "$RESULTS/check.txt"
import time
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
print("tensorflow", tf.__version__, "GPUs:", gpus)
for g in gpus:
    print(" ", tf.config.experimental.get_device_details(g))
if not gpus:
    raise SystemExit("error: TensorFlow sees no GPU (its log above says which library failed)")
x = tf.random.normal([4096, 4096])
start = time.perf_counter()
y = tf.matmul(x, x)
y.numpy()  # waits for the GPU
print("a float32 matmul on", y.device, f"{time.perf_counter() - start:.1f} s (first call: PTX JIT)")
f = tf.function(lambda a: tf.nn.gelu(tf.matmul(tf.cast(a, tf.bfloat16), tf.cast(a, tf.bfloat16))),
                jit_compile=True)
start = time.perf_counter()
z = f(x)
z.numpy()
print("XLA bf16 matmul + GELU:", z.dtype, z.device,
      f"{time.perf_counter() - start:.1f} s (compilation included)")
PY
}

run_tests() {
  [ -f "$(env_file)" ] || die "TensorFlow is not installed in $TF_ROOT: run install first"
  mkdir -p "$RESULTS"
  # What a GPU changes: the model's numbers (fp32 / bf16 / fp16 and loss scaling), XLA, the
  # training loop and its strategies, checkpoints, exports. The files of ../shared they read
  # come in pack's last folder; a test that needs more of it skips.
  local files=(tests/test_modeling.py tests/test_optimization.py tests/test_training.py
               tests/test_checkpoints.py tests/test_run_pretraining.py tests/test_keras.py
               tests/test_export_model.py tests/test_script_flags.py tests/test_devices.py)
  [ $# -eq 0 ] || files=("$@")
  if [ ! -e ../shared ] && [ -f "$STAGE/shared.tar.gz" ]; then  # carried by pack's last folder
    mkdir -p ../shared && tar -xzf "$STAGE/shared.tar.gz" -C ../shared
  fi
  # TEST_SECONDS: the run is interrupted then (pytest still prints what failed so far), so that
  # a call short of minutes brings back the tests that ran; -v names each as it ends.
  with_tf timeout -s INT -k 30 "${TEST_SECONDS:-3600}" "$PY" -m pytest -v -p no:cacheprovider \
    -n "${TEST_WORKERS:-4}" --durations=10 --junitxml="$RESULTS/tests.xml" "${files[@]}" 2>&1 \
    | tee "$RESULTS/tests.txt"
}

bench() {
  local size=${1:-quick} env
  mkdir -p "$RESULTS"
  env=$(env_file)
  [ -f "$env" ] || die "TensorFlow is not installed in $TF_ROOT: run install first"
  # Ours without and with XLA. XLA's default on the H200 (2026-11-30) autotuned its Triton
  # matmuls for minutes: a 2-layer step had not compiled after 110 s, and without autotuning
  # (--xla_gpu_autotune_level=0) its step ran 7x slower than TensorFlow's own kernels. So our XLA
  # variant runs with cuBLAS matmuls (GPU_XLA_FLAGS), and each child has BENCH_CHILD_SECONDS.
  local base=(--warmup=1 --repeats=3 --variants=bf16,bf16_xla --peer_variants=bf16)
  export GPU_XLA_FLAGS=${GPU_XLA_FLAGS---xla_gpu_enable_triton_gemm=false}
  local most=${BENCH_CHILD_SECONDS:-150} kids child
  echo "XLA flags added for our XLA variant: ${GPU_XLA_FLAGS:-none}; each child at most" \
    "$most s, and its share of the time left"
  local large=(--layers=24 --hidden_size=1024 --num_heads=16 --intermediate_size=4096)
  local tiny=(--layers=2 --hidden_size=128 --num_heads=2 --intermediate_size=512 --vocab_size=1000)
  # The card's bf16 matmul peak first: every model figure's MFU is against it (--peak below).
  # Then the issue's headline (BERT-Large, seq 128) before BERT-base: a call cut off at the
  # device's 10 minutes still brings back what $OUT holds by then.
  local peak_run="matmul_peak matmul_peak.py --matmul_size=8192"
  local batch=(--batch_size=256 --steps_per_loop=10)
  local large_run="pretrain_large_128 pretraining_step.py ${large[*]} ${batch[*]}"
  local base_run="pretrain_base_128 pretraining_step.py ${batch[*]}"
  # large: the peak and BERT-Large only; base: BERT-base only, against the peak measured before
  # (a session short of minutes runs the tests between the two).
  local runs
  case $size in
    large) runs=("$peak_run" "$large_run") ;;
    base) runs=("$base_run") ;;
    *) runs=("$peak_run" "$large_run" "$base_run") ;;
  esac
  if [ "$size" = smoke ]; then  # the plumbing, in a minute, anywhere (numbers mean nothing)
    runs=("matmul_peak matmul_peak.py --matmul_size=512"
          "pretrain_tiny_128 pretraining_step.py ${tiny[*]} --batch_size=8 --steps_per_loop=2")
  fi
  if [ "$size" = full ]; then
    runs+=(
      "pretrain_large_512 pretraining_step.py ${large[*]} --batch_size=32 --seq_length=512
       --max_predictions=80 --steps_per_loop=5"
      "squad_base_384 finetuning.py --tasks=squad --squad_batch_size=32 --steps_per_loop=10"
      "encode_base_128 encode.py --batch_size=256 --steps=20"
    )
  fi
  local run name script args peak=none left deadline=$((SECONDS + ${BENCH_DEADLINE:-480}))
  [ ! -s "$RESULTS/peak.txt" ] || peak=$(cat "$RESULTS/peak.txt")
  for run in "${runs[@]}"; do
    read -r name script args <<<"${run//$'\n'/ }"
    left=$((deadline - SECONDS))
    [ "$left" -gt 30 ] || { echo "== $name: skipped, BENCH_DEADLINE reached"; continue; }
    [ "$script" = matmul_peak.py ] || args+=" ${base[*]} --peak=$peak"
    echo "== $name: $script $args"
    # shellcheck disable=SC2086
    # Each child (ours without and with XLA, the peer; the peak's two) gets its share of the
    # time left, so that one stuck compiling cannot take the others' figures with it.
    kids=3
    [ "$script" != matmul_peak.py ] || kids=2
    child=$((left / kids))
    [ "$child" -le "$most" ] || child=$most
    BENCH_TF_ENV=$env BENCH_CHILD_LOG=$RESULTS/$name.children.log PYTHONUNBUFFERED=1 \
      BENCH_CHILD_TIMEOUT=$child timeout "$left" "$PY" "benchmarks/$script" $args \
      >"$RESULTS/$name.json" 2>"$RESULTS/$name.log" || echo "   failed: see $name.log"
    grep -h "^\[.*call\|failed" "$RESULTS/$name.log" "$RESULTS/$name.children.log" 2>/dev/null \
      | tail -n 12 | sed 's/^/   /' || true
    if [ "$script" = matmul_peak.py ]; then
      peak=$("$PY" -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["details"]
print(max(v for side in ("ours", "peer") for k, v in d[side].items()
          if k.endswith("bf16") and isinstance(v, (int, float))))' "$RESULTS/$name.json" \
        2>/dev/null) || peak=none
      echo "$peak" >"$RESULTS/peak.txt"
      echo "   bf16 matmul peak: $peak GFLOP/s"
    fi
    tail -n 1 "$RESULTS/$name.json" | "$PY" -c '
import json, sys
line = sys.stdin.read().strip()
if line:
    d = json.loads(line)
    for f in d["figures"][:3]:
        print("  ", f["name"], "| ours", f.get("ours"), f.get("ours_variant"), "| peer",
              f.get("peer"), f.get("peer_variant"), "| ratio", f.get("ratio"),
              "| MFU", f.get("mfu_ours"), f.get("mfu_peer"))' || true
  done
}

finish() {  # the last call: install, check, BERT-Large, the tests, BERT-base, in SECONDS at most
  local total=$1 back=${OUT:-$PWD/gpu_results} res
  case $total in ''|*[!0-9]*) die "finish takes the seconds the call may run, e.g. finish 540" ;; esac
  mkdir -p "$back"
  res=$(mktemp -d /tmp/gpu_session_results.XXXXXX)  # a run of its own, whatever else runs
  # 25 s are kept to pack the results: $OUT brings back 8 files at most, so they come back as
  # one archive, written even when a step ran out of time.
  local end=$((SECONDS + total - 25))
  left() { local n=$((end - SECONDS)); [ "$n" -lt "$1" ] || n=$1; echo "$n"; }
  step() {  # SECONDS COMMAND...: one command of this script, bounded, its results in $res
    local secs=$1; shift
    if [ "$secs" -lt 30 ]; then echo "== $*: not run, the call's time is spent"; return 1; fi
    echo "== $* ($secs s at most, $(date -u +%T))"
    OUT=$res timeout -k 10 "$secs" bash tools/gpu_session.sh "$@"
  }
  # The card's load and clocks every 5 s through the call: whether a slow step kept it busy.
  local dmon=
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi dmon -d 5 -s puc >"$res/dmon.txt" 2>&1 &
    dmon=$!
  fi
  {
    if step "$(left 120)" install && step "$(left 180)" check; then
      BENCH_DEADLINE=$(left "${FINISH_LARGE_S:-300}") step "$(left 100000)" bench large || true
      TEST_SECONDS=$(left "${FINISH_TESTS_S:-150}") TEST_WORKERS=${TEST_WORKERS:-8} \
        step "$(left 100000)" test || true
      BENCH_DEADLINE=$(left 100000) step "$(left 100000)" bench base || true
    fi
    echo "== done $(date -u +%T)"
  } 2>&1 | tee "$res/finish.txt" || true
  if [ -n "$dmon" ]; then kill "$dmon" 2>/dev/null || true; wait "$dmon" 2>/dev/null || true; fi
  tar -czf "$back/results.tar.gz" -C "$res" .
  echo "results: $back/results.tar.gz ($(du -k "$back/results.tar.gz" | cut -f1) KiB)"
  grep -h "^ \+pre-training\|^ \+bf16\|bf16 matmul peak\|GPUs:\|XLA bf16\|passed\|failed" \
    "$res"/*.txt 2>/dev/null | tail -n 40 || true
}

[ $# -ge 1 ] || usage
command=$1; shift
case $command in
  pack) [ $# -ge 1 ] || usage; pack "$@" ;;
  fits) [ $# -eq 0 ] || usage; fits ;;
  stage) [ $# -eq 1 ] || usage; stage "$1" ;;
  probe) [ $# -eq 0 ] || usage; probe ;;
  finish) [ $# -eq 1 ] || usage; finish "$1" ;;
  install) [ $# -eq 0 ] || usage; install ;;
  check) [ $# -eq 0 ] || usage; check ;;
  test) run_tests "$@" ;;
  bench) [ $# -le 1 ] || usage
    case ${1:-quick} in smoke|quick|full|large|base) ;; *) usage ;; esac
    bench "$@" ;;
  *) usage ;;
esac
