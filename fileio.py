"""Reading inputs with errors that name the file and line, and writing outputs atomically.

Every script reads user files through `read_lines` / `check_file` and writes every output through
`atomic_path` / `open_atomic`, so a bad input ends in one clear message (file, line, flag) and an
interrupted run never leaves a half-written file under its final name. `run_main` is the scripts'
entry point: it turns `InputError` into that one message and a non-zero exit instead of a traceback.
"""

import contextlib
import glob
import os
import sys

from absl import app
from absl import logging


class ReportedError(Exception):
  """An error `run_main` reports as one `error: ...` line, without a traceback."""


class InputError(ReportedError, ValueError):
  """A problem with the user's input (file, line, record or flag), reported without a traceback."""


def check_file(path, what="file"):
  """Raises InputError unless `path` is a readable regular file."""
  if not path:
    raise InputError(f"no {what} given")
  if not os.path.exists(path):
    raise InputError(f"{what} not found: {path}")
  if not os.path.isfile(path):
    raise InputError(f"{what} is not a regular file: {path}")
  if not os.access(path, os.R_OK):
    raise InputError(f"{what} is not readable: {path}")
  return path


def expand_file_patterns(patterns, what="input file"):
  """Comma-separated paths and glob patterns -> sorted-per-pattern list of files.

  Each pattern that matches nothing is an error naming it, as a silent empty input would hide a
  typo until training starts.
  """
  files = []
  for pattern in (p.strip() for p in patterns.split(",")):
    if not pattern:
      continue
    matches = sorted(glob.glob(pattern))
    if not matches:
      raise InputError(f"{what} pattern matches no file: {pattern}")
    files.extend(check_file(m, what) for m in matches)
  if not files:
    raise InputError(f"no {what} given")
  return files


def read_lines(path):
  """Yields (line_number, text) for a UTF-8 text file, line endings stripped.

  Invalid UTF-8 is rejected rather than silently altered: the error names the file, the line and
  the byte offset so the user can fix or re-encode the source. A UTF-8 byte-order mark at the start
  of the file is dropped (the GLUE MRPC files carry one).
  """
  check_file(path)
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise InputError(f"{path}:{number}: invalid UTF-8 at byte {e.start} of the line "
                         f"({raw[e.start:e.start + 4]!r}); re-encode the file as UTF-8") from None
      if number == 1 and text.startswith("\ufeff"):
        text = text[1:]
      yield number, text.rstrip("\r\n")


def _temporary_name(path):
  directory, base = os.path.split(os.path.abspath(path))
  return os.path.join(directory, f".{base}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path):
  """Yields a temporary path beside `path`; renames it onto `path` only if the block succeeds.

  The temporary file is a hidden sibling so the rename stays on one file system (atomic), and it is
  removed when the block raises, so a failed or interrupted run leaves the old output (or nothing).
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  tmp = _temporary_name(path)
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


@contextlib.contextmanager
def open_atomic(path, mode="w", **kwargs):
  """`open` for writing whose result appears under `path` only once the block has succeeded."""
  if "b" not in mode:
    kwargs.setdefault("encoding", "utf-8")
  with atomic_path(path) as tmp:
    with open(tmp, mode, **kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())


def run_main(main):
  """absl's app.run, with a ReportedError printed as `error: ...` instead of a traceback.

  The exit status is 2 for an InputError (the command or its files need fixing) and 1 for other
  reported errors (e.g. training.TrainingError: the run itself could not go on).
  """

  def guarded(argv):
    try:
      return main(argv)
    except ReportedError as e:
      logging.flush()
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2 if isinstance(e, InputError) else 1)

  app.run(guarded)


# --- TFRecord files without TensorFlow ------------------------------------------------------------
# A TFRecord is: uint64 length, masked CRC32C of those 8 bytes, the data, masked CRC32C of the data
# (all little-endian). Writing them here lets a data-preparation process (create_pretraining_data)
# skip importing TensorFlow, which costs more CPU time than the preparation itself on small inputs.

_CRC32C_TABLES = None


def _crc32c_tables():
  """(byte table, 16-bit tables LO / HI for four bytes at a time) of CRC-32C (Castagnoli)."""
  global _CRC32C_TABLES
  if _CRC32C_TABLES is None:
    import numpy as np  # pylint: disable=g-import-not-at-top
    byte = np.arange(256, dtype=np.uint32)
    for _ in range(8):
      byte = np.where(byte & 1, (byte >> 1) ^ np.uint32(0x82F63B78), byte >> 1).astype(np.uint32)
    # After the next four input bytes are XORed into the register, the register's update is a
    # linear map of it alone (four zero bytes); split into its low and high 16 bits.
    halves = []
    for shift in (0, 16):
      state = np.arange(1 << 16, dtype=np.uint32) << np.uint32(shift)
      for _ in range(4):
        state = byte[state & 0xFF] ^ (state >> 8)
      halves.append(state)
    _CRC32C_TABLES = (byte, halves[0], halves[1])
  return _CRC32C_TABLES


def crc32c_batch(items):
  """CRC-32C of each bytes object in `items`, as a numpy uint32 array, computed for all at once.

  The register update is linear, so each item's CRC is the CRC of its bytes from a zero register
  (which leading zero bytes leave at zero: the items are right-aligned in one zero-padded array
  and run four bytes a step across all rows) XORed with the effect of the initial all-ones
  register over that many bytes.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  _, low, high = _crc32c_tables()
  lengths = np.fromiter(map(len, items), np.int64, len(items))
  width = -(-int(lengths.max(initial=0)) // 4) * 4
  zeros = bytes(width)
  padded = np.frombuffer(b"".join(zeros[len(item):] + item for item in items), "<u4")
  words = np.ascontiguousarray(padded.reshape(len(items), width // 4).T)
  register = np.zeros(len(items), np.uint32)
  for word in words:
    mixed = register ^ word
    register = low[mixed & 0xFFFF] ^ high[mixed >> 16]
  return register ^ _initial_registers(width)[lengths] ^ np.uint32(0xFFFFFFFF)


_INITIAL_REGISTERS = []


def _initial_registers(width):
  """The all-ones initial register carried through n zero bytes, for n = 0..width (kept and
  extended across calls: every batch of records needs the same few hundred values)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  byte = _crc32c_tables()[0]
  registers = _INITIAL_REGISTERS
  state = registers[-1] if registers else None
  while len(registers) <= width:
    state = 0xFFFFFFFF if state is None else int(byte[state & 0xFF]) ^ (state >> 8)
    registers.append(state)
  return np.array(registers[:width + 1], np.uint32)


def _masked(crc):
  import numpy as np  # pylint: disable=g-import-not-at-top
  return ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)


def tfrecord_bytes(records):
  """The bytes of a TFRecord file holding `records` (a list of bytes), as TensorFlow writes it."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  if not records:
    return b""
  lengths = np.fromiter(map(len, records), "<u8", len(records))
  length_bytes = [x.tobytes() for x in lengths]
  headers = np.empty((len(records), 12), np.uint8)
  headers[:, :8] = lengths.view(np.uint8).reshape(-1, 8)
  headers[:, 8:] = _masked(crc32c_batch(length_bytes)).astype("<u4").view(np.uint8).reshape(-1, 4)
  footers = _masked(crc32c_batch(records)).astype("<u4").view(np.uint8).reshape(-1, 4)
  parts = []
  for header, record, footer in zip(headers, records, footers):
    parts += (header.tobytes(), record, footer.tobytes())
  return b"".join(parts)
