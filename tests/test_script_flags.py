"""script_flags' values built from the machine: bf16 where the CPU would emulate it is warned
about (issue: a user on an AVX2-only CPU ran bf16 slower than fp32 without a word)."""

from bert_tf2 import script_flags


def test_bf16_is_emulated_without_bf16_instructions_or_with_onednn_held_below_them():
  zen3 = {"avx2", "fma", "f16c"}  # an AVX2-only EPYC
  zen5 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
  sapphire_rapids = {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
  assert script_flags.bf16_is_emulated(zen3, None, accelerated=False)
  assert not script_flags.bf16_is_emulated(zen5, None, accelerated=False)
  assert not script_flags.bf16_is_emulated(sapphire_rapids, None, accelerated=False)
  assert not script_flags.bf16_is_emulated({"avx512f", "amx_bf16"}, None, accelerated=False)
  # ONEDNN_MAX_CPU_ISA=AVX2 (how the benchmarks see an AVX2 machine on an AVX-512 one).
  assert script_flags.bf16_is_emulated(zen5, "AVX2", accelerated=False)
  assert script_flags.bf16_is_emulated(zen5, "avx512_core", accelerated=False)
  assert not script_flags.bf16_is_emulated(zen5, "AVX512_CORE_BF16", accelerated=False)
  assert not script_flags.bf16_is_emulated(zen5, "ALL", accelerated=False)
  # A GPU or TPU does the matrix work; unreadable CPU flags say nothing.
  assert not script_flags.bf16_is_emulated(zen3, None, accelerated=True)
  assert not script_flags.bf16_is_emulated(None, "AVX2", accelerated=False)


def test_cpu_flags_read_from_cpuinfo(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                     "flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16\n\nprocessor\t: 1\n")
  assert script_flags.cpu_flags(str(cpuinfo)) == {"fpu", "sse2", "avx2", "fma", "avx512f",
                                                  "avx512_bf16"}
  assert script_flags.cpu_flags(str(tmp_path / "missing")) is None
  assert script_flags.cpu_flags() is None or "sse2" in script_flags.cpu_flags()
