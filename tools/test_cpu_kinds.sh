#!/usr/bin/env bash
# `make test-cpu-kinds`: the test suite once for each CPU kind whose kernels this machine can show,
# the check before a change to kernels or numerics lands (docs/development.md "CPU kinds").
#
# The project's CPUs are of three kinds: an Intel Xeon with AMX, an AMD EPYC Zen 5 (AVX-512 with
# bf16) and an AMD EPYC with AVX2 only. A machine shows its own kind and those below it, by holding
# oneDNN (ONEDNN_MAX_CPU_ISA) and XLA's CPU compiler (--xla_cpu_max_isa) to their instructions:
#   AMX Xeon: amx (as it is), zen5 (AVX512_CORE_BF16), avx2 (AVX2)
#   Zen 5:    zen5 (as it is), avx2 (AVX2)
#   AVX2:     avx2 (as it is)
# (XLA names the Zen 5 level AVX512_BF16.) Each kind's ISA is checked to have taken (oneDNN's own report) before its run. What the avx2
# kind cannot show on an AVX-512 CPU: TensorFlow decides from the CPU itself that its oneDNN ops
# take bf16, and oneDNN held to AVX2 has no bf16 kernel (it crashes); the tests that run bf16 ops
# in oneDNN (marker `onednn_bf16`) skip there, saying so, and a real AVX2-only CPU runs them.
#
# Arguments go to pytest in place of the default `tests` (e.g. `-m "not process and not slow"
# tests`, the fast tier, for a quick look). Exits 1 when any kind failed, naming them.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(tests)
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { grep -qw "$1" <<<"$flags"; }
kinds=()
if has amx_bf16; then kinds+=("amx::"); fi
if has avx512_bf16; then
  if has amx_bf16; then kinds+=("zen5:AVX512_CORE_BF16:AVX512_BF16"); else kinds+=("zen5::"); fi
fi
if has avx512f; then kinds+=("avx2:AVX2:AVX2"); else kinds+=("avx2::"); fi
failed=()
for kind in "${kinds[@]}"; do
  IFS=: read -r name isa xla_isa <<<"$kind"
  if [ -n "$isa" ]; then
    export ONEDNN_MAX_CPU_ISA=$isa XLA_FLAGS="${XLA_FLAGS_BASE:-} --xla_cpu_max_isa=$xla_isa"
  else
    unset ONEDNN_MAX_CPU_ISA
    export XLA_FLAGS="${XLA_FLAGS_BASE:-}"
  fi
  took=$(ONEDNN_VERBOSE=1 TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c \
    "import tensorflow as tf; tf.matmul(tf.ones([64, 64]), tf.ones([64, 64]))" 2>&1 \
    | grep -m1 -o 'isa:.*' || true)
  echo "== CPU kind $name: ONEDNN_MAX_CPU_ISA=${isa:-unset}; oneDNN reports ${took:-nothing}"
  if { [ "$isa" = AVX2 ] && ! grep -q 'isa:Intel AVX2$' <<<"$took"; } \
     || { [ -n "$isa" ] && grep -q AMX <<<"$took"; }; then
    echo "error: oneDNN did not take ONEDNN_MAX_CPU_ISA=$isa (it reports '${took}')" >&2
    failed+=("$name"); continue
  fi
  "$PY" -m pytest -q -n 2 -p no:cacheprovider "${args[@]}" || failed+=("$name")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "error: the tests failed with the kernels of: ${failed[*]}" >&2
  exit 1
fi
echo "every CPU kind this machine can show passed: ${kinds[*]%%:*}"
