"""devices: the machine facts the scripts' values are built from: the CPU's flags, bf16 where the
CPU would emulate it warned about (issue: a user on an AVX2-only CPU ran bf16 slower than fp32
without a word), what --mixed_precision=auto picks, TF32 off for float32, batches cut to their
longest sequence except on TPUs."""

import os

from conftest import ENV, TINY, requires_shared, run_script

from bert_tf2 import devices


def test_bf16_is_emulated_without_bf16_instructions_or_with_onednn_held_below_them():
  zen3 = {"avx2", "fma", "f16c"}  # an AVX2-only EPYC
  zen5 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
  sapphire_rapids = {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
  assert devices.bf16_is_emulated(zen3, None, accelerated=False)
  assert not devices.bf16_is_emulated(zen5, None, accelerated=False)
  assert not devices.bf16_is_emulated(sapphire_rapids, None, accelerated=False)
  assert not devices.bf16_is_emulated({"avx512f", "amx_bf16"}, None, accelerated=False)
  # ONEDNN_MAX_CPU_ISA=AVX2 (how the benchmarks see an AVX2 machine on an AVX-512 one).
  assert devices.bf16_is_emulated(zen5, "AVX2", accelerated=False)
  assert devices.bf16_is_emulated(zen5, "avx512_core", accelerated=False)
  assert not devices.bf16_is_emulated(zen5, "AVX512_CORE_BF16", accelerated=False)
  assert not devices.bf16_is_emulated(zen5, "ALL", accelerated=False)
  # A GPU or TPU does the matrix work; unreadable CPU flags say nothing.
  assert not devices.bf16_is_emulated(zen3, None, accelerated=True)
  assert not devices.bf16_is_emulated(None, "AVX2", accelerated=False)


def test_runs_on_amx_only_with_amx_flags_and_onednn_allowed_to_use_them():
  amx, avx512_bf16 = {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, {"avx512f", "avx512_bf16"}
  assert devices.runs_on_amx(amx, None, False)
  assert devices.runs_on_amx(amx, "avx512_core_amx", False)
  assert devices.runs_on_amx(amx, "ALL", False)
  assert not devices.runs_on_amx(amx, "AVX512_CORE_BF16", False)  # a Zen 5 seen on this CPU
  assert not devices.runs_on_amx(amx, "AVX2", False)
  assert not devices.runs_on_amx(amx, None, True)  # a GPU or TPU does the matrix work
  assert not devices.runs_on_amx(avx512_bf16, None, False)
  assert not devices.runs_on_amx(None, None, False)  # flags unknown: not assumed


def test_onednn_cpu_follows_tensorflows_own_switch():
  """TF_ENABLE_ONEDNN_OPTS=0 turns oneDNN's kernels and graph fusions off: devices.onednn_cpu then
  says so (kernels.layer_norm's oneDNN form would run unfused, 3x slower)."""
  code = ("import platform, tensorflow as tf; from bert_tf2 import devices; "
          "print('onednn', devices.onednn_cpu(), 'expected', platform.machine() == 'x86_64' "
          "and not tf.config.list_physical_devices('GPU'))")
  off = run_script(["-c", code], env={**ENV, "TF_ENABLE_ONEDNN_OPTS": "0"})
  assert "onednn False" in off.stdout, off.stderr[-2000:]
  on = run_script(["-c", code], env={**ENV, "TF_ENABLE_ONEDNN_OPTS": "1"})
  # On an x86 CPU without a GPU (oneDNN's home) it is on when asked for.
  assert ("onednn True expected True" in on.stdout
          or "expected False" in on.stdout), on.stdout + on.stderr[-2000:]


def test_cpu_flags_read_from_cpuinfo(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                     "flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16\n\nprocessor\t: 1\n")
  assert devices.cpu_flags(str(cpuinfo)) == {"fpu", "sse2", "avx2", "fma", "avx512f",
                                                  "avx512_bf16"}
  assert devices.cpu_flags(str(tmp_path / "missing")) is None
  assert devices.cpu_flags() is None or "sse2" in devices.cpu_flags()


def test_native_bf16_is_what_auto_precision_picks():
  zen3 = {"avx2", "fma", "f16c"}
  zen5 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
  assert devices.native_bf16(zen5, None)
  assert devices.native_bf16({"avx512f", "amx_bf16"}, None)
  assert not devices.native_bf16(zen3, None)
  assert not devices.native_bf16(zen5, "AVX2")  # oneDNN held below bf16
  assert not devices.native_bf16(None, None)  # unknown CPU: float32, the safe choice
  # Accelerators: a TPU; GPUs from Ampere (8.0) on, every one of them; the CPU then says nothing.
  assert devices.native_bf16(zen3, None, tpu=True)
  assert devices.native_bf16(zen3, None, gpu_capabilities=[(9, 0)])
  assert not devices.native_bf16(zen5, None, gpu_capabilities=[(7, 5)])
  assert not devices.native_bf16(zen5, None, gpu_capabilities=[(9, 0), (7, 0)])
  assert not devices.native_bf16(zen5, None, gpu_capabilities=[None])


def test_float32_turns_tensorfloat32_off_and_the_fast_dtypes_leave_it():
  """float32 is float32 on Ampere+ GPUs too (TensorFlow's default multiplies float32 matrices in
  TF32 there); bf16 / fp16 leave the setting as it was."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  was = tf.config.experimental.tensor_float_32_execution_enabled()
  try:
    tf.config.experimental.enable_tensor_float_32_execution(True)
    assert devices.float32_is_float32(tf.bfloat16) == tf.bfloat16
    assert devices.float32_is_float32(tf.float16) == tf.float16
    assert tf.config.experimental.tensor_float_32_execution_enabled()
    assert devices.float32_is_float32(tf.float32) == tf.float32
    assert not tf.config.experimental.tensor_float_32_execution_enabled()
  finally:
    tf.config.experimental.enable_tensor_float_32_execution(was)


@requires_shared
def test_auto_precision_runs_as_the_precision_it_picks(tmp_path):
  """--mixed_precision=auto logs its choice for this machine and writes exactly the features of
  that precision given by name; held to AVX2 (ONEDNN_MAX_CPU_ISA), it picks float32. The CPU's
  choice: GPUs are hidden (with one, `auto` follows its compute capability instead)."""
  words = tmp_path / "words.txt"
  words.write_text("all work and no play\nmakes jack a dull boy\n")

  def run(precision, name, **env):
    out = tmp_path / f"{name}.jsonl"
    result = run_script(
        ["extract_features.py", f"--input_file={words}", f"--output_file={out}",
         f"--init_checkpoint={TINY}/bert_model.ckpt", f"--vocab_file={TINY}/vocab.txt",
         "--max_seq_length=16", "--layers=-1", f"--mixed_precision={precision}"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return out.read_text(), result.stderr

  expected = ("bf16" if devices.native_bf16(devices.cpu_flags(),
                                                 os.environ.get("ONEDNN_MAX_CPU_ISA"))
              else "none")
  auto, log = run("auto", "auto")
  assert f"--mixed_precision=auto: {expected} on this machine" in log, log[-2000:]
  assert auto == run(expected, "named")[0]
  held, log = run("auto", "held", ONEDNN_MAX_CPU_ISA="AVX2")
  assert "--mixed_precision=auto: none on this machine" in log, log[-2000:]
  assert (held == auto) == (expected == "none")  # float32's features, or not bf16's


def test_onednn_bf16_below_avx512_on_an_avx512_cpu_is_known_to_crash():
  zen3 = {"avx2", "fma", "f16c"}
  zen5 = {"avx2", "avx512f", "avx512_bf16"}
  skylake = {"avx2", "avx512f"}
  for isa in ("AVX2", "avx2", "AVX", "SSE41", "AVX2_VNNI"):
    assert devices.onednn_crashes_on_bf16(zen5, isa)
    assert devices.onednn_crashes_on_bf16(skylake, isa)
    assert not devices.onednn_crashes_on_bf16(zen3, isa)  # TensorFlow's own bf16 kernels there
    assert not devices.onednn_crashes_on_bf16(zen5, isa, accelerated=True)
  for isa in (None, "", "AVX512_CORE", "AVX512_CORE_BF16", "ALL"):
    assert not devices.onednn_crashes_on_bf16(zen5, isa)
  assert not devices.onednn_crashes_on_bf16(None, "AVX2")


@requires_shared
def test_bf16_with_avx2_kernels_is_an_error_where_it_would_crash_and_close_to_float32_elsewhere(
    tmp_path):
  """extract_features in bf16 with oneDNN held to AVX2. On an AVX-512 CPU TensorFlow still hands
  oneDNN bf16 ops it cannot run (a segmentation fault at the first MatMul, an AbortedError in
  LayerNorm): one error line instead. On an AVX2-only CPU the run works, and its features are
  float32's within bf16's rounding (the oneDNN LayerNorm form, 0.035 off there in bf16, is not
  taken: issue #73)."""
  words = tmp_path / "words.txt"
  words.write_text("all work and no play\nmakes jack a dull boy\n")

  def run(precision, **env):
    out = tmp_path / f"{precision}.jsonl"
    result = run_script(
        ["extract_features.py", f"--input_file={words}", f"--output_file={out}",
         f"--init_checkpoint={TINY}/bert_model.ckpt", f"--vocab_file={TINY}/vocab.txt",
         "--max_seq_length=16", "--layers=-1", f"--mixed_precision={precision}"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "ONEDNN_MAX_CPU_ISA": "AVX2", **env},
        timeout=300)
    return result, out

  bf16, out = run("bf16")
  if devices.onednn_crashes_on_bf16(devices.cpu_flags(), "AVX2") and devices.onednn_cpu():
    assert bf16.returncode == 2, bf16.stderr[-2000:]
    lines = bf16.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --mixed_precision=bf16 with ONEDNN_MAX_CPU_ISA=AVX2"), \
        lines[-5:]
    assert not out.exists()
    return
  assert bf16.returncode == 0, bf16.stderr[-2000:]
  fp32, fp32_out = run("none")
  assert fp32.returncode == 0, fp32.stderr[-2000:]
  import json  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  def values(path):
    return np.array([layer["values"] for line in path.read_text().splitlines()
                     for token in json.loads(line)["features"] for layer in token["layers"]])

  low, high = values(out), values(fp32_out)
  assert low.shape == high.shape
  # A 2-layer model in bf16: each value within a few bf16 steps (2^-8 relative) of float32's.
  assert np.abs(low - high).max() < 0.05 * np.abs(high).max(), np.abs(low - high).max()


def test_dynamic_padding_as_asked_except_on_tpus():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  default = tf.distribute.get_strategy()
  assert devices.dynamic_padding(True, default)
  assert not devices.dynamic_padding(False, default)

  class Tpu(tf.distribute.TPUStrategy):  # isinstance is all that is asked of it
    def __init__(self):  # pylint: disable=super-init-not-called
      pass
  assert not devices.dynamic_padding(True, Tpu())
