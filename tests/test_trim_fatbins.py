"""tools/trim_fatbins.py: CUDA libraries cut to one GPU architecture in place (what
tools/gpu_session.sh pack does to TensorFlow's GPU bundle). Checked on a shared library built
here with fat binaries in its `.nv_fatbin` section, in the layout NVIDIA's libraries use: the
entries kept are byte for byte the originals, the headers say their new size, the rest of the
section is zeros, every other byte of the file is unchanged and the library still loads."""

import ctypes
import os
import random
import shutil
import struct
import sys

import pytest

from conftest import PYTHON, ROOT, run_process

sys.path.insert(0, os.path.join(ROOT, "tools"))
import trim_fatbins  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc to build a library")

PTX, ELF = 1, 2


def entry(kind, arch, payload):
  """One fat binary entry: a 64-byte header (kind, header size, payload size, at byte 28 the
  architecture) and the payload, as cuobjdump reads them."""
  header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(payload), len(payload), 0,
                       arch % 10, arch // 10, arch, 0, 0, 0x2011, 0, len(payload))
  assert len(header) == 64
  return header + payload


def fatbin(entries):
  body = b"".join(entries)
  return struct.pack("<IHHQ", trim_fatbins.MAGIC, 1, 16, len(body)) + body


def build_library(path, fatbins):
  """A shared library whose .nv_fatbin section holds `fatbins`, 8-byte aligned, and whose
  function answer() returns 42."""
  source = path.with_suffix(".c")
  arrays = []
  for i, blob in enumerate(fatbins):
    data = ",".join(str(b) for b in blob)
    arrays.append(f'__attribute__((section(".nv_fatbin"), aligned(8), used)) '
                  f"static const unsigned char fatbin{i}[{len(blob)}] = {{{data}}};")
  source.write_text("\n".join(arrays) + "\nint answer(void) { return 42; }\n")
  run_process(["gcc", "-shared", "-fPIC", "-O1", "-o", str(path), str(source)], cwd=None,
              env=None, timeout=120, check=True)
  return path


def section(data, name=".nv_fatbin"):
  return trim_fatbins._sections(data)[name]  # pylint: disable=protected-access


def test_each_fat_binary_keeps_its_sm90_code_or_ptx_and_the_rest_of_the_file_is_unchanged(
    tmp_path):
  rng = random.Random(7)

  def payload(n):
    return rng.randbytes(n * 8)

  sass80, sass90, ptx90 = entry(ELF, 80, payload(40)), entry(ELF, 90, payload(30)), \
      entry(PTX, 90, payload(50))
  ptx80, sass70 = entry(PTX, 80, payload(20)), entry(ELF, 70, payload(25))
  old70, old89 = entry(ELF, 70, payload(11)), entry(ELF, 89, payload(13))
  bad = bytearray(fatbin([entry(ELF, 80, payload(9))]) + bytes(8))
  struct.pack_into("<Q", bad, 8, len(bad) - 16)  # 8 bytes of zeros where an entry should be
  fatbins = [fatbin([sass80, sass90, ptx90]),   # sm_90 machine code: it alone stays
             fatbin([sass70, ptx80]),           # no sm_90 code: the PTX stays
             fatbin([old70, old89]),            # nothing for sm_90: the highest stays
             fatbin([sass90]),                  # already sm_90 only: unchanged
             bytes(bad)]                # does not parse: unchanged
  library = build_library(tmp_path / "libfat.so", fatbins)
  before = library.read_bytes()
  offset, size = section(before)

  result = run_process([PYTHON, os.path.join(ROOT, "tools", "trim_fatbins.py"), "--arch", "90",
                        str(library)], cwd=None, env=None, timeout=60, check=False)
  assert result.returncode == 0, result.stderr
  freed = len(sass80) + len(ptx90) + len(sass70) + len(old70)
  assert f"5 fat binaries, 3 trimmed to sm_90, 1 left as they were, {freed / 1048576:.1f}" \
      in result.stdout
  after = library.read_bytes()
  assert len(after) == len(before)
  assert after[:offset] == before[:offset] and after[offset + size:] == before[offset + size:]

  expected = [[sass90], [ptx80], [old89], [sass90], None]
  for blob, kept in zip(fatbins, expected):
    at = before.index(blob)  # each fat binary starts where it did
    assert offset <= at < offset + size
    if kept is None:
      assert after[at:at + len(blob)] == blob
    else:
      body = b"".join(kept)
      assert after[at:at + 16] == fatbin(kept)[:16]  # magic, version, the new size
      assert after[at + 16:at + 16 + len(body)] == body
      assert after[at + 16 + len(body):at + len(blob)] == bytes(len(blob) - 16 - len(body))

  assert ctypes.CDLL(str(library)).answer() == 42  # the ELF file still loads and runs

  # A second run finds nothing more to take out; a file that is no ELF file is left alone.
  text = tmp_path / "libc.so"
  text.write_text("GROUP ( /lib/libc.so.6 )\n")
  again = run_process([PYTHON, os.path.join(ROOT, "tools", "trim_fatbins.py"), "--arch", "90",
                       str(library), str(text)], cwd=None, env=None, timeout=60, check=False)
  assert again.returncode == 0, again.stderr
  assert library.read_bytes() == after
  assert text.read_text() == "GROUP ( /lib/libc.so.6 )\n"
  assert "0 trimmed to sm_90" in again.stdout and "0.0 MiB of device code" in again.stdout


def test_a_damaged_or_missing_library_is_one_error_line_and_the_others_are_still_trimmed(
    tmp_path):
  sass80, sass90 = entry(ELF, 80, bytes(64)), entry(ELF, 90, bytes(64))
  library = build_library(tmp_path / "libfat.so", [fatbin([sass80, sass90])])
  good = tmp_path / "libgood.so"
  good.write_bytes(library.read_bytes())
  cut = tmp_path / "libcut.so"
  cut.write_bytes(library.read_bytes()[:4096])  # the section headers sit at the end of the file
  missing = tmp_path / "none.so"
  result = run_process([PYTHON, os.path.join(ROOT, "tools", "trim_fatbins.py"), "--arch", "90",
                        str(cut), str(missing), str(good)], cwd=None, env=None, timeout=60,
                       check=False)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines() == [
      f"error: {cut}: a damaged ELF file (its headers point past its end); left as it was",
      f"error: {missing}: No such file or directory"]
  assert cut.read_bytes() == library.read_bytes()[:4096] and not missing.exists()
  assert f"{good}: 1 fat binaries, 1 trimmed to sm_90" in result.stdout
  at = library.read_bytes().index(fatbin([sass80, sass90]))
  assert good.read_bytes()[at:at + 16] == fatbin([sass90])[:16]


def test_a_header_that_does_not_hold_together_leaves_the_rest_of_the_section_alone(tmp_path):
  """A fat binary header of size 0 (nothing would move the scan on: it used to loop forever) or
  one whose entries run past the section: it and what follows stay as they are."""
  zero = struct.pack("<IHHQ", trim_fatbins.MAGIC, 1, 0, 0) + bytes(8)
  overrun = bytearray(fatbin([entry(ELF, 80, bytes(64)), entry(ELF, 90, bytes(64))]))
  struct.pack_into("<Q", overrun, 8, len(overrun) + 4096)
  for name, blob in (("zero", zero), ("overrun", bytes(overrun))):
    library = build_library(tmp_path / f"lib{name}.so", [blob])
    before = library.read_bytes()
    result = run_process([PYTHON, os.path.join(ROOT, "tools", "trim_fatbins.py"), "--arch",
                          "90", str(library)], cwd=None, env=None, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "1 fat binaries, 0 trimmed to sm_90, 1 left as they were" in result.stdout, name
    assert library.read_bytes() == before, name
