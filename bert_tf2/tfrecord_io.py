"""Writing TFRecord files: the one home of record writing.

- Fine-tuning records: each record's features built with `int64_feature` / `float_feature`,
  written with `write_examples` (an iterable) or `ExampleWriter` (one at a time, for code that
  hands out features through a callback), through TensorFlow's writer.
- Pre-training records (create_pretraining_data): `ExampleEncoder` serializes Examples without
  building protos, and `write_sharded` / `write_framed` frame them as TFRecords here, byte for byte
  what tf.io.TFRecordWriter writes, so that a data-preparation process never imports TensorFlow
  (about 2.5 s of CPU, more than the whole preparation of a few MB of text). TensorFlow is
  imported only by the functions that use it.

Every file appears under its name only when it is complete, so an error, Ctrl-C or a full disk
leaves no partial file, and the same records give the same bytes in every run.
"""

import contextlib
import itertools
import resource
import struct

from absl import logging
import numpy as np

from bert_tf2 import fileio

# The feature names and their order, as the original's create_pretraining_data.py wrote them.
PRETRAINING_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                        "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")


def int64_feature(values):
  """A tf.train.Feature of int64 values."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def float_feature(values):
  """A tf.train.Feature of float values."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


class ExampleWriter:
  """A TFRecord file of tf.train.Examples written atomically: `write({name: Feature})` per
  record; the file appears at `close()` (or the end of a `with` block without an error)."""

  def __init__(self, path):
    self.path = path
    self.count = 0
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._tf = tf
    self._atomic = fileio.atomic_path(path)
    self._writer = tf.io.TFRecordWriter(self._atomic.__enter__())

  def write(self, features):
    if self.count % 10000 == 0 and self.count:
      logging.info("%s: %d examples written", self.path, self.count)
    tf = self._tf
    example = tf.train.Example(features=tf.train.Features(feature=features))
    # Deterministic: the same features give the same bytes in every run (map fields included).
    self._writer.write(example.SerializeToString(deterministic=True))
    self.count += 1

  def close(self, error=None):
    """Finishes the file (or, given the exception that interrupted writing, discards it)."""
    if self._writer is None:
      return
    self._writer.close()
    self._writer = None
    if error is None:
      self._atomic.__exit__(None, None, None)
    else:
      self._atomic.__exit__(type(error), error, error.__traceback__)

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc, tb):
    self.close(exc)
    return False


def write_examples(path, records):
  """Writes `records` (an iterable of {name: tf.train.Feature}) to `path`; returns how many."""
  with ExampleWriter(path) as writer:
    for features in records:
      writer.write(features)
  return writer.count


# --- Pre-training records, without TensorFlow -----------------------------------------------------


def _varint_table(size):
  """_varint(i) for i in range(size), built without a Python loop per byte."""
  table = [bytes((i,)) for i in range(min(size, 1 << 7))]
  table += [bytes((i & 0x7F | 0x80, i >> 7)) for i in range(1 << 7, min(size, 1 << 14))]
  table += [bytes((i & 0x7F | 0x80, (i >> 7) & 0x7F | 0x80, i >> 14))
            for i in range(1 << 14, min(size, 1 << 21))]
  return table + [_varint(i) for i in range(1 << 21, size)]


def _varint(value):
  out = bytearray()
  while value > 0x7F:
    out.append((value & 0x7F) | 0x80)
    value >>= 7
  out.append(value)
  return bytes(out)


class ExampleEncoder:
  """Serializes instances as tf.train.Example bytes directly, without building protos.

  Building an Example proto per record costs more than creating the instance, and the wire
  format of these seven features is simple: Example{features: Features{map entries}}, each entry
  {key, Feature{int64_list | float_list {packed values}}}. Every entry is its key and list tags,
  lengths and payload; the entries whose payload has a fixed length (input_mask, weights, the
  label) are precomputed whole. Parsing the result with tf.train.Example gives the features the
  original wrote (tests compare them); map entries are in PRETRAINING_FEATURES order.
  """

  def __init__(self, max_seq_length, max_predictions_per_seq, vocab_size):
    self.max_seq_length = max_seq_length
    self.max_predictions_per_seq = max_predictions_per_seq
    seq, preds = max_seq_length, max_predictions_per_seq
    self._varints = _varint_table(max(vocab_size, seq + 1))
    self._zeros = [b"\x00" * i for i in range(seq + 1)]
    self._ones = [b"\x01" * i for i in range(seq + 1)]
    self._prefixes = {name: {} for name in PRETRAINING_FEATURES}
    self._input_mask = [self._entry("input_mask", b"\x01" * n + b"\x00" * (seq - n))
                        for n in range(seq + 1)]
    one, zero = struct.pack("<f", 1.0), struct.pack("<f", 0.0)
    self._weights = [self._entry("masked_lm_weights", one * k + zero * (preds - k), is_float=True)
                     for k in range(preds + 1)]
    self._labels = [self._entry("next_sentence_labels", bytes([label])) for label in (0, 1)]
    self._segment_prefix = self._prefix("segment_ids", seq)

  def _prefix(self, name, payload_length, is_float=False):
    """The bytes of a map entry before its payload (the payload ends the entry)."""
    prefixes = self._prefixes.setdefault(name, {})
    prefix = prefixes.get(payload_length)
    if prefix is None:
      key = name.encode()
      values_header = b"\x0a" + _varint(payload_length)
      list_length = len(values_header) + payload_length
      feature_header = (b"\x12" if is_float else b"\x1a") + _varint(list_length)
      feature_length = len(feature_header) + list_length
      entry_body = (b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(feature_length) +
                    feature_header + values_header)
      prefix = b"\x0a" + _varint(len(entry_body) + payload_length) + entry_body
      prefixes[payload_length] = prefix
    return prefix

  def _entry(self, name, payload, is_float=False):
    return self._prefix(name, len(payload), is_float) + payload

  def encode(self, input_ids, segment_a_length, positions, label_ids, is_random_next):
    """One record from an instance's ids (unpadded lists); padding and weights are added here."""
    varint = self._varints
    zeros, ones = self._zeros, self._ones
    n, k = len(input_ids), len(positions)
    pad = self.max_seq_length - n
    missing = self.max_predictions_per_seq - k
    ids = b"".join([varint[i] for i in input_ids]) + zeros[pad]
    position_bytes = b"".join([varint[i] for i in positions]) + zeros[missing]
    label_bytes = b"".join([varint[i] for i in label_ids]) + zeros[missing]
    prefixes = self._prefixes
    features = b"".join((
        prefixes["input_ids"].get(len(ids)) or self._prefix("input_ids", len(ids)), ids,
        self._input_mask[n],
        self._segment_prefix, zeros[segment_a_length], ones[n - segment_a_length], zeros[pad],
        (prefixes["masked_lm_positions"].get(len(position_bytes)) or
         self._prefix("masked_lm_positions", len(position_bytes))), position_bytes,
        (prefixes["masked_lm_ids"].get(len(label_bytes)) or
         self._prefix("masked_lm_ids", len(label_bytes))), label_bytes,
        self._weights[k],
        self._labels[1 if is_random_next else 0],
    ))
    length = len(features)
    return b"\x0a" + (varint[length] if length < len(varint) else _varint(length)) + features

  def encode_batch(self, ids, lengths, segment_a_lengths, positions, label_ids, counts,
                   is_random_next):
    """Records for a batch of numpy rows (ids padded; positions and labels zero after counts).

    The varints of all rows are made at once with numpy, leaving a few slices and one join per
    record to Python.
    """
    ids_data, ids_sizes = _varint_rows(ids)
    positions_data, positions_sizes = _varint_rows(positions)
    labels_data, labels_sizes = _varint_rows(label_ids)
    varint = self._varints
    zeros, ones = self._zeros, self._ones
    seq = self.max_seq_length
    prefixes = self._prefixes
    records = []
    ids_end = positions_end = labels_end = 0
    for n, a, k, nsp, ids_size, positions_size, labels_size in zip(
        lengths.tolist(), segment_a_lengths.tolist(), counts.tolist(), is_random_next,
        ids_sizes.tolist(), positions_sizes.tolist(), labels_sizes.tolist()):
      ids_start, ids_end = ids_end, ids_end + ids_size
      positions_start, positions_end = positions_end, positions_end + positions_size
      labels_start, labels_end = labels_end, labels_end + labels_size
      features = b"".join((
          prefixes["input_ids"].get(ids_size) or self._prefix("input_ids", ids_size),
          ids_data[ids_start:ids_end],
          self._input_mask[n],
          self._segment_prefix, zeros[a], ones[n - a], zeros[seq - n],
          (prefixes["masked_lm_positions"].get(positions_size) or
           self._prefix("masked_lm_positions", positions_size)),
          positions_data[positions_start:positions_end],
          (prefixes["masked_lm_ids"].get(labels_size) or
           self._prefix("masked_lm_ids", labels_size)),
          labels_data[labels_start:labels_end],
          self._weights[k],
          self._labels[1 if nsp else 0],
      ))
      length = len(features)
      records.append(b"\x0a" + (varint[length] if length < len(varint) else _varint(length)) +
                     features)
    return records

  def encode_rows(self, columns):
    """Records of any features given as rows: `columns` is [(name, values [N, width], is_float)]
    (the records of --dynamic_masking and --pack_sequences, whose features differ from the
    original's seven). Varints and floats of each column are made at once with numpy."""
    encoded = []
    for name, values, is_float in columns:
      if is_float:
        data = np.ascontiguousarray(values, "<f4").tobytes()
        sizes = [values.shape[1] * 4] * len(values)
      else:
        data, sizes = _varint_rows(values)
        sizes = sizes.tolist()
      encoded.append((name, is_float, data, sizes))
    varint = self._varints
    records = []
    ends = [0] * len(encoded)
    for row in range(len(columns[0][1])):
      pieces = []
      for j, (name, is_float, data, sizes) in enumerate(encoded):
        start, size = ends[j], sizes[row]
        ends[j] = start + size
        pieces += (self._prefixes.get(name, {}).get(size) or self._prefix(name, size, is_float),
                   data[start:start + size])
      features = b"".join(pieces)
      length = len(features)
      records.append(b"\x0a" + (varint[length] if length < len(varint) else _varint(length)) +
                     features)
    return records


def _varint_rows(values):
  """Varint encoding of every value of a 2-D array of ids (< 2**28): (all bytes, bytes per row).

  Byte plane p holds bits 7p..7p+6 with the continuation bit; only the planes the largest value
  needs are built, and a value's bytes are its planes up to its own length.
  """
  v = np.asarray(values, dtype=np.uint32)
  num_planes = max(1, (int(v.max(initial=0)).bit_length() + 6) // 7)
  planes = np.empty(v.shape + (num_planes,), np.uint8)
  keep = np.ones(v.shape + (num_planes,), bool)
  for p in range(num_planes):
    plane = (v >> (7 * p)) & 0x7F
    if p + 1 < num_planes:
      more = v >= (1 << (7 * (p + 1)))
      plane |= more.astype(np.uint32) << 7
      keep[..., p + 1] = more
    planes[..., p] = plane
  return planes[keep].tobytes(), keep.sum(axis=(1, 2))


def open_files_limit(needed):
  """Raises the soft limit of open files towards the hard one when `needed` files (plus a margin
  for the rest of the process) would not fit; returns whether they fit."""
  margin = 64
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft != resource.RLIM_INFINITY and needed + margin > soft:
    target = needed + margin if hard == resource.RLIM_INFINITY else min(hard, needed + margin)
    with contextlib.suppress(ValueError, OSError):
      resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
  return soft == resource.RLIM_INFINITY or needed + margin <= soft


def check_open_files(output_files):
  """InputError naming the outputs when they cannot all be open at once (write_sharded keeps
  them open), even after raising the soft limit: callers check before any work."""
  if len(output_files) > 1 and not open_files_limit(len(output_files)):
    raise fileio.InputError(
        f"{output_files[0]} and {len(output_files) - 1} more: {len(output_files)} output files "
        f"cannot be open at once here (the open-files limit is "
        f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}; `ulimit -n` raises it): write fewer")


def write_sharded(records, output_files, batch_size=4096):
  """Writes serialized records round-robin to `output_files`; returns how many were written.

  Each file is written under a temporary name and renamed only once every record is written, so
  an error or interruption never leaves a partial file under an output name. Work and memory are
  linear in the number of files: one listing of each directory for the temporaries a killed run
  left, and at most max(batch_size, number of files) records held at a time.
  """
  check_open_files(output_files)
  fileio.remove_stale_temporaries(output_files)
  count = 0
  with contextlib.ExitStack() as stack:
    files = []
    for path in output_files:
      with fileio.naming_output(path):  # Too many open files, say.
        files.append(stack.enter_context(open(
            stack.enter_context(fileio.atomic_path(path, sweep=False)), "wb")))
    for batch in _batched(records, max(batch_size, len(files))):
      # Record i of the whole output goes to file i mod len(files).
      offset = count % len(files)
      for i, (f, path) in enumerate(zip(files, output_files)):
        part = batch[(i - offset) % len(files)::len(files)]
        if part:
          with fileio.naming_output(path):
            f.write(tfrecord_bytes(part))
      count += len(batch)
    for f, path in zip(files, output_files):
      with fileio.naming_output(path):
        f.close()
  return count


def write_framed(f, records, batch_size=4096):
  """Writes serialized records (an iterable) to the open binary file `f`; returns how many."""
  count = 0
  for batch in _batched(records, batch_size):
    f.write(tfrecord_bytes(batch))
    count += len(batch)
  return count


def _batched(iterable, size):
  iterator = iter(iterable)
  while batch := list(itertools.islice(iterator, size)):
    yield batch


# --- TFRecord framing ----------------------------------------------------------------------------
# A TFRecord is: uint64 length, masked CRC32C of those 8 bytes, the data, masked CRC32C of the data
# (all little-endian).

_CRC32C_TABLES = None


def _crc32c_tables():
  """(byte table, 16-bit tables LO / HI for four bytes at a time) of CRC-32C (Castagnoli)."""
  global _CRC32C_TABLES
  if _CRC32C_TABLES is None:
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
  byte = _crc32c_tables()[0]
  registers = _INITIAL_REGISTERS
  state = registers[-1] if registers else None
  while len(registers) <= width:
    state = 0xFFFFFFFF if state is None else int(byte[state & 0xFF]) ^ (state >> 8)
    registers.append(state)
  return np.array(registers[:width + 1], np.uint32)


def _masked(crc):
  return ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)


def tfrecord_bytes(records):
  """The bytes of a TFRecord file holding `records` (a list of bytes), as TensorFlow writes it."""
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
