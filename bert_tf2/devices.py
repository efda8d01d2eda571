"""Machine facts in one place: what the CPU can do, which precision the matrix work runs in, the
tf.distribute strategy and how the CPU is split for it, how many streams a prediction batch runs
in, and whether batches may be cut to their longest sequence.

Plain values in, plain values out: the scripts pass their flags' values (script_flags.strategy
and script_flags.compute_dtype are one-line calls into here), the benchmarks call it directly.
"""

import functools
import json
import os

from absl import logging
import tensorflow as tf

from bert_tf2 import errors

# --mixed_precision's values: the dtype of the model's matrix work (BertModel's compute_dtype).
COMPUTE_DTYPES = {"none": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}

# oneDNN's ISA levels (ONEDNN_MAX_CPU_ISA) below the first with bf16 dot products.
_NO_BF16_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                 "AVX512_CORE_VNNI")


# --- the CPU -----------------------------------------------------------------------------------


def cpu_flags(path="/proc/cpuinfo"):
  """The CPU's feature flags (Linux's /proc/cpuinfo), or None where they cannot be read."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return None


def bf16_is_emulated(flags_of_cpu, onednn_max_isa, accelerated):
  """Whether bf16 matrix work runs emulated: no accelerator, and a CPU without AVX512_BF16 or
  AMX-BF16, or oneDNN held below them. Unknown flags (not Linux): not said to be."""
  if accelerated or flags_of_cpu is None:
    return False
  if onednn_max_isa and onednn_max_isa.upper() in _NO_BF16_ISAS:
    return True
  return not flags_of_cpu & {"avx512_bf16", "amx_bf16"}


def onednn_crashes_on_bf16(flags_of_cpu, onednn_max_isa, accelerated=False):
  """Whether TensorFlow would hand bf16 ops to oneDNN kernels that cannot run them: oneDNN held
  below AVX-512 by ONEDNN_MAX_CPU_ISA on a CPU with AVX-512 (the way to see an AVX2-only CPU's
  kernels on an AVX-512 one). TensorFlow decides from the CPU itself (CPUID) that its oneDNN ops
  take bf16, and oneDNN, held to AVX2, has no bf16 kernel: a bf16 MatMul ends the process with a
  segmentation fault, a LayerNorm with an AbortedError (TensorFlow 2.21 on an AMD EPYC with
  AVX-512 bf16, issue #73). A real AVX2-only CPU never gets there: TensorFlow runs its bf16 ops in
  its own kernels."""
  if accelerated or flags_of_cpu is None or not onednn_max_isa:
    return False
  return ("avx512f" in flags_of_cpu
          and onednn_max_isa.upper() in ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"))


def native_bf16(flags_of_cpu, onednn_max_isa, tpu=False, gpu_capabilities=()):
  """Whether this machine computes bf16 matrix work natively (--mixed_precision=auto's bf16): a
  TPU; GPUs all of compute capability 8.0 or more (Ampere on; unknown: no); else a CPU whose
  flags are known to have AVX512_BF16 or AMX-BF16, oneDNN not held below them."""
  if tpu:
    return True
  if gpu_capabilities:
    return all(c is not None and tuple(c) >= (8, 0) for c in gpu_capabilities)
  return flags_of_cpu is not None and not bf16_is_emulated(flags_of_cpu, onednn_max_isa, False)


def runs_on_amx(flags_of_cpu, onednn_max_isa, accelerated):
  """Whether bf16 matmuls run on a CPU's AMX units: no accelerator, flags with amx_bf16, oneDNN
  not held below its AMX ISAs by ONEDNN_MAX_CPU_ISA."""
  isa = (onednn_max_isa or "").upper()
  return (not accelerated and "amx_bf16" in (flags_of_cpu or ())
          and (not isa or "AMX" in isa or isa in ("ALL", "DEFAULT")))


@functools.lru_cache(maxsize=None)
def amx_matmul():
  """runs_on_amx on this machine: where oneDNN reads a bf16 weight faster transposed
  (modeling.cast_weights)."""
  accelerated = bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))
  return runs_on_amx(cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA"), accelerated)


@functools.lru_cache(maxsize=None)
def onednn_cpu():
  """Whether TensorFlow computes on this machine's CPU with its oneDNN kernels and graph fusions
  (on x86 Linux unless TF_ENABLE_ONEDNN_OPTS=0; no GPU or TPU), where kernels.layer_norm's
  oneDNN form becomes one kernel."""
  if tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"):
    return False
  try:
    # TensorFlow's own answer (it also decides the default per platform); no public API has it.
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  except ImportError:
    return False
  return bool(_pywrap_util_port.IsMklEnabled())


def onednn_layer_norm_is_exact(dtype, flags_of_cpu, onednn_max_isa):
  """Whether kernels.layer_norm's oneDNN form, for x of `dtype`, is oneDNN's one kernel that
  computes in float32 and rounds once, on a CPU with these flags where TensorFlow runs oneDNN:
  float32 on every CPU; bfloat16 only with bf16 instructions (native_bf16). Without them the
  form is wrong or fails: on an AVX2-only CPU TensorFlow leaves the pattern unfused and its own
  bfloat16 batch normalisation rounds intermediates (0.035 off in the model test, against half a
  step of bfloat16, ~0.004, for the fused kernel: issue #73); with oneDNN held below AVX-512 by
  ONEDNN_MAX_CPU_ISA the graph is still rewritten and oneDNN cannot create the primitive (an
  AbortedError at the first batch). float16: not measured, so not taken."""
  if dtype == tf.float32:
    return True
  return dtype == tf.bfloat16 and native_bf16(flags_of_cpu, onednn_max_isa)


@functools.lru_cache(maxsize=None)
def onednn_layer_norm(dtype):
  """onednn_cpu and onednn_layer_norm_is_exact on this machine: where kernels.layer_norm takes
  its oneDNN form for x of `dtype` when asked to. Cached, as onednn_cpu is: the model asks at
  every LayerNorm it traces, and /proc/cpuinfo need not be read each time."""
  return onednn_cpu() and onednn_layer_norm_is_exact(
      tf.as_dtype(dtype), cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA"))


@functools.lru_cache(maxsize=None)
def on_gpu():
  """Whether TensorFlow computes on a GPU here (it places the model's ops there)."""
  return bool(tf.config.list_logical_devices("GPU"))


@functools.lru_cache(maxsize=None)
def bf16_accumulates_in_float32():
  """Whether TensorFlow's bfloat16 matmul and softmax kernels here compute in float32 and round
  once: on a CPU with bf16 instructions (oneDNN's AVX512_BF16 and AMX kernels; native_bf16).
  Where bf16 is emulated (an AVX2-only CPU, or oneDNN held below its bf16 ISAs), TensorFlow's
  fallback kernels round partial results to bfloat16: measured on an AVX2-only EPYC, a bias
  gradient summed as a matmul was 0.75% off and softmax probabilities more than one rounding
  step off. Not on a GPU either: on an H200 (CUDA 12.5 cuBLAS, 2026-11-30) a bias gradient
  summed as a [1, 1024] x [1024, 96] matmul was 1.7% off where the rows nearly cancel (cuBLAS
  sums parts of a long inner dimension apart and adds them in bfloat16), and the bf16 softmax
  0.43% off, over one rounding step (0.39%). kernels.py then takes its float32 paths."""
  if on_gpu():
    return False
  return native_bf16(cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA"))


# --- precision ---------------------------------------------------------------------------------


def compute_dtype(mixed_precision, tpu=False):
  """--mixed_precision (none, bf16, fp16, auto) as the dtype of the model's matrix work. bf16
  where it would be emulated (a CPU without bf16 instructions, no accelerator) is warned about;
  `auto` picks bf16 where the hardware has it (native_bf16), float32 elsewhere, and logs its
  choice. float32 is made true float32 on GPUs (float32_is_float32)."""
  gpus = tf.config.list_physical_devices("GPU")
  flags_of_cpu, onednn_max_isa = cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA")
  if mixed_precision == "auto":
    capabilities = [tf.config.experimental.get_device_details(gpu).get("compute_capability")
                    for gpu in gpus]
    bf16 = native_bf16(flags_of_cpu, onednn_max_isa, tpu, capabilities)
    logging.info("--mixed_precision=auto: %s on this machine (%s)", "bf16" if bf16 else "none",
                 "TPU" if tpu else f"GPU compute capability {capabilities}" if gpus
                 else "CPU " + ("with" if bf16 else "without") + " bf16 instructions")
    return tf.bfloat16 if bf16 else float32_is_float32(tf.float32)
  if mixed_precision == "bf16" and onednn_crashes_on_bf16(flags_of_cpu, onednn_max_isa,
                                                          tpu or bool(gpus)) and onednn_cpu():
    raise errors.InputError(
        f"--mixed_precision=bf16 with ONEDNN_MAX_CPU_ISA={onednn_max_isa} on this CPU with "
        "AVX-512: TensorFlow hands bf16 ops to oneDNN, which has no bf16 kernel below "
        "AVX512_CORE and would crash; unset ONEDNN_MAX_CPU_ISA or use --mixed_precision=none")
  if mixed_precision == "bf16" and bf16_is_emulated(flags_of_cpu, onednn_max_isa,
                                                    tpu or bool(gpus)):
    logging.warning(
        "--mixed_precision=bf16 on a CPU without bf16 instructions (AVX512_BF16 or AMX%s): its "
        "bf16 matrix work is emulated and slower than float32; --mixed_precision=none is faster "
        "here", ", or oneDNN held below them by ONEDNN_MAX_CPU_ISA"
        if onednn_max_isa else "")
  return float32_is_float32(COMPUTE_DTYPES[mixed_precision])


def float32_is_float32(dtype):
  """Returns `dtype`; when it is float32, first turns TensorFloat-32 off. TensorFlow multiplies
  float32 matrices in TF32 (10-bit mantissas) by default on Ampere and later GPUs, which would
  break --mixed_precision=none's promise of the checkpoint's float32 outputs (and torch keeps
  TF32 off for matmuls by default); bf16 and fp16 are the fast paths there. No effect on CPUs."""
  if dtype == tf.float32:
    tf.config.experimental.enable_tensor_float_32_execution(False)
  return dtype


# --- strategies ----------------------------------------------------------------------------------


def make_strategy(name, num_cpu_devices=0, tpu=None, tpu_zone=None, gcp_project=None):
  """The tf.distribute strategy `name` (default, one_device, mirrored, multi_worker_mirrored,
  tpu). `mirrored` with no GPU splits the CPU into `num_cpu_devices` logical devices (if set);
  `tpu` connects to the TPU `tpu` (name or grpc address). Call it before any TensorFlow op: the
  CPU can be split only while the runtime is uninitialised."""
  if name == "tpu":
    return _tpu_strategy(tpu, tpu_zone, gcp_project)
  if name == "multi_worker_mirrored":
    if "TF_CONFIG" not in os.environ:
      raise errors.InputError("--distribution_strategy=multi_worker_mirrored needs TF_CONFIG")
    return tf.distribute.MultiWorkerMirroredStrategy()
  _warn_of_an_unused_cluster(name)
  gpus = tf.config.list_physical_devices("GPU")
  if name == "mirrored":
    if gpus:
      return tf.distribute.MirroredStrategy()
    devices = split_cpu(num_cpu_devices) if num_cpu_devices else ["/cpu:0"]
    return tf.distribute.MirroredStrategy(devices)
  if name == "one_device":
    return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
  return tf.distribute.get_strategy()


def _warn_of_an_unused_cluster(name):
  """A TF_CONFIG that names several workers, read by no strategy but multi_worker_mirrored: each
  process would train alone (and all but one be refused their shared --output_dir), so say so."""
  try:
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
    workers = sum(len(cluster.get(kind) or ()) for kind in ("chief", "worker"))
  except (ValueError, AttributeError, TypeError):
    return
  if workers > 1:
    logging.warning("TF_CONFIG names a cluster of %d workers, but --distribution_strategy=%s "
                    "trains in this process alone: give --distribution_strategy="
                    "multi_worker_mirrored on every worker to train as one", workers, name)


def split_cpu(n):
  """Splits the physical CPU into `n` logical devices (before TF initialises its runtime)."""
  cpu = tf.config.list_physical_devices("CPU")[0]
  if len(tf.config.get_logical_device_configuration(cpu) or []) != n:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
  return [f"/cpu:{i}" for i in range(n)]


_TPU_NAMES = ("give --tpu_name: the TPU's name (with --tpu_zone and --gcp_project when it is "
              "not in this VM's zone and project), `local` on a TPU VM, or grpc://HOST:8470")


def _tpu_strategy(tpu, tpu_zone, gcp_project):
  """TPUStrategy on the TPU `tpu`; a TPU that cannot be found or reached is one InputError naming
  the flag and what to give (TensorFlow's own errors here are a 40-line traceback or a bare
  "Name or service not known")."""
  where = f"--tpu_name={tpu}" if tpu else "--distribution_strategy=tpu"
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=tpu, zone=tpu_zone, project=gcp_project)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except (ValueError, OSError, RuntimeError, tf.errors.OpError) as e:
    cause = (getattr(e, "message", None) or str(e) or type(e).__name__).strip().splitlines()[0]
    if not tpu:
      raise errors.InputError(f"{where} found no TPU ({cause}): {_TPU_NAMES}") from None
    raise errors.InputError(f"{where}: the TPU cannot be reached ({cause}); {_TPU_NAMES}") from None
  return tf.distribute.TPUStrategy(resolver)


def is_tpu(strategy):
  """Whether `strategy` runs on a TPU (whose programs need fixed shapes)."""
  return isinstance(strategy, tf.distribute.TPUStrategy)


def dynamic_padding(requested, strategy):
  """Whether batches are cut to their longest sequence: as `requested` (--dynamic_padding),
  except on TPUs, whose programs need fixed shapes."""
  return bool(requested) and not is_tpu(strategy)


def prediction_streams(strategy):
  """How many parts Trainer.predict and evaluate split a batch into: 2 where one replica
  computes on a CPU of several cores, else 1.

  Why: on CPUs the matrices of a prediction batch (a few sentences, or MiniLM's 384-wide layers
  on sentences of ~25 tokens) are too small to keep two cores busy inside one op (each op's
  threads meet at a barrier, and the LayerNorm and softmax pieces barely split), while two halves
  of the batch, which depend on nothing of each other, run side by side on the runtime's two
  inter-op threads: measured 5-15% more sentences/s (benchmarks/README.md). GPUs and TPUs take a
  batch whole; several replicas already run side by side."""
  if (strategy.num_replicas_in_sync > 1 or is_tpu(strategy)
      or tf.config.list_logical_devices("GPU")):
    return 1
  affinity = getattr(os, "sched_getaffinity", None)  # Linux only
  cores = len(affinity(0)) if affinity else (os.cpu_count() or 1)
  return 2 if cores >= 2 else 1
