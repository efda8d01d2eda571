"""TFRecord files of tf.train.Examples (pre-training and fine-tuning): the Feature values the
fine-tuning scripts write, the parsing specs, and the tf.data pipelines that read them.

One reader for every script: files are sharded across input pipelines (workers) when the data has
at least as many files, shuffled and interleaved when training, records parsed in parallel, and
batches of a fixed batch size (drop_remainder). Training data repeats forever; evaluation and
prediction data are read once, in order.

Records hold every sequence padded to max_seq_length (the original's format), but real text is
mostly far shorter: with `pad_to_longest` each batch is cut after its longest real sequence,
rounded up to a multiple of max_seq_length / 8 (`length_multiple`), so a function runs on at most
8 sequence lengths per max_seq_length. Padding is masked out of attention and carries no label, so
the outputs for real tokens are the same as at full length (up to float summation order).
"""

import contextlib
import re

import numpy as np
import tensorflow as tf

from bert_tf2 import fileio


def int64_list_feature(values):
  """A tf.train.Feature of int64 values, for writing a record."""
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def float_list_feature(values):
  """A tf.train.Feature of float values, for writing a record."""
  return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def int_feature(length):
  return tf.io.FixedLenFeature([length], tf.int64)


def float_feature(length):
  return tf.io.FixedLenFeature([length], tf.float32)


PRETRAINING_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                        "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")


def pretraining_features(max_seq_length, max_predictions_per_seq):
  """The feature spec of create_pretraining_data.py's records."""
  return {
      "input_ids": int_feature(max_seq_length),
      "input_mask": int_feature(max_seq_length),
      "segment_ids": int_feature(max_seq_length),
      "masked_lm_positions": int_feature(max_predictions_per_seq),
      "masked_lm_ids": int_feature(max_predictions_per_seq),
      "masked_lm_weights": float_feature(max_predictions_per_seq),
      "next_sentence_labels": int_feature(1),
  }


def pretraining_value_limits(vocab_size, type_vocab_size, max_seq_length, config_source):
  """{feature: (bound, what)}: the values of pre-training records the model can take lie in
  [0, bound). An id past an embedding table is an InvalidArgumentError deep in a CPU step and,
  on a GPU, a silent zero vector."""
  return {
      "input_ids": (vocab_size, f"vocab_size={vocab_size} of {config_source}"),
      "masked_lm_ids": (vocab_size, f"vocab_size={vocab_size} of {config_source}"),
      "segment_ids": (type_vocab_size, f"type_vocab_size={type_vocab_size} of {config_source}"),
      "masked_lm_positions": (max_seq_length, f"--max_seq_length={max_seq_length}"),
      "next_sentence_labels": (2, "the two next-sentence classes"),
  }


# Marks the failure of the in-pipeline range check, which naming_bad_records turns into a message
# naming the record.
_OUT_OF_RANGE = "record value outside the range of the model"


def _decode(record, name_to_features, value_limits=None):
  example = tf.io.parse_single_example(record, name_to_features)
  # int64 is what tf.train.Example stores; int32 is what every op downstream (and TPUs) want.
  example = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in example.items()}
  if not value_limits:
    return example
  checks = [tf.debugging.Assert(tf.reduce_all((example[k] >= 0) & (example[k] < bound)),
                                [_OUT_OF_RANGE, k])
            for k, (bound, _) in value_limits.items() if k in example]
  with tf.control_dependencies(checks):
    return {k: tf.identity(v) for k, v in example.items()}


def _range_problem(values, value_limits):
  """The first value of `values` ({feature: numpy array}) outside its limit, described; or None."""
  for k, (bound, what) in (value_limits or {}).items():
    if k not in values:
      continue
    v = np.asarray(values[k]).reshape(-1)
    bad = np.flatnonzero((v < 0) | (v >= bound))
    if bad.size:
      return (f"{k} holds {int(v[bad[0]])} at position {int(bad[0])}, outside [0, {bound}) "
              f"({what}); were the records made for this model (its vocabulary and config)?")
  return None


def _op_message(error):
  """The first line of a TF op error without its `{{function_node ...}}` and `[Op:...]` noise."""
  text = re.sub(r"\{\{[^}]*\}\}\s*", "", error.message.splitlines()[0])
  return re.sub(r"\s*\[Op:\w+\].*$", "", text).strip().rstrip(".")


def check_records(input_files, name_to_features, value_limits=None, scan=100):
  """Parses the first record of each file eagerly, so a missing or wrongly shaped feature, or a
  file that is not TFRecords at all, is an error naming the file before training starts rather
  than a stack trace inside tf.data. With `value_limits` (pretraining_value_limits), the first
  `scan` records of each file are also checked for ids the model cannot embed."""
  for path in input_files:
    try:
      records = list(tf.data.TFRecordDataset(path).take(1))
    except tf.errors.OpError as e:  # DataLossError: not a TFRecord file, or a corrupted one
      raise fileio.InputError(f"{path}: record 0 cannot be read ({_op_message(e)}); is it a "
                              "TFRecord file of tf.train.Examples?") from None
    if not records:
      raise fileio.InputError(f"{path}: holds no record")
    try:
      _decode(records[0], name_to_features)
    except tf.errors.InvalidArgumentError as e:
      expected = ", ".join(f"{k}[{', '.join(map(str, v.shape))}]"
                           for k, v in name_to_features.items())
      raise fileio.InputError(
          f"{path}: record 0 does not match the expected features ({expected}): "
          f"{_op_message(e)}; were the records written with the same "
          "max_seq_length / max_predictions_per_seq?") from None
    if value_limits:
      _scan_values(path, value_limits, scan)


def _scan_values(path, value_limits, scan):
  try:
    for index, record in enumerate(tf.data.TFRecordDataset(path).take(scan)):
      features = tf.train.Example.FromString(record.numpy()).features.feature
      values = {k: features[k].int64_list.value for k in value_limits if k in features}
      problem = _range_problem(values, value_limits)
      if problem:
        raise fileio.InputError(f"{path}: record {index}: {problem}")
  except tf.errors.OpError:
    pass  # a damaged record past the first: named by naming_bad_records when training meets it


def _is_record_error(error):
  """Whether a tf.data error comes from the records (damaged bytes, features that do not parse)."""
  if isinstance(error, tf.errors.DataLossError):
    return True
  return isinstance(error, tf.errors.InvalidArgumentError) and any(
      word in error.message for word in ("Feature:", "Key:", "serialized Example", _OUT_OF_RANGE))


def find_bad_record(input_files, name_to_features, value_limits=None):
  """The InputError for the first record of `input_files` that cannot be read or parsed, or holds
  a value outside `value_limits` (naming its file and index), or None. Reads everything up to it:
  for use after a failure only."""
  for path in input_files:
    index = 0
    try:
      for record in tf.data.TFRecordDataset(path):
        problem = _range_problem(_decode(record, name_to_features), value_limits)
        if problem:
          return fileio.InputError(f"{path}: record {index}: {problem}")
        index += 1
    except tf.errors.DataLossError as e:
      return fileio.InputError(f"{path}: record {index} cannot be read ({_op_message(e)}); the "
                               "file is truncated or damaged: write it again")
    except tf.errors.InvalidArgumentError as e:
      return fileio.InputError(f"{path}: record {index} does not match the expected features: "
                               f"{_op_message(e)}")
  return None


@contextlib.contextmanager
def naming_bad_records(input_files, name_to_features, value_limits=None):
  """Turns a tf.data error from a damaged, malformed or out-of-range record met while training
  or evaluating into an InputError naming the file and record (TF's own message names neither)."""
  try:
    yield
  except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
    bad = (find_bad_record(input_files, name_to_features, value_limits)
           if _is_record_error(e) else None)
    if bad is None:
      raise
    raise bad from None


def length_multiple(max_seq_length):
  """The step of the sequence lengths batches are cut to: at most 8 lengths per max_seq_length
  (16 at 128, 48 at 384), each a multiple of 8 as the matrix kernels like."""
  return max(8, -(-max_seq_length // 64) * 8)


def trim_to_longest(batch, multiple, mask_key="input_mask"):
  """Cuts the per-token features of a batch (those shaped like `batch[mask_key]`: ids, mask,
  segments, token labels) after the batch's last real token, rounded up to `multiple`."""
  mask = batch[mask_key]
  full = tf.shape(mask)[-1]  # the padded length (cut already by the pipeline, when in a step)
  positions = tf.range(1, full + 1, dtype=tf.int32)
  # The last position whose mask is set, wherever it is (not the count of set positions).
  longest = tf.reduce_max(tf.where(tf.cast(mask, tf.bool), positions, 0))
  length = tf.minimum(tf.maximum(1, (longest + multiple - 1) // multiple) * multiple, full)
  per_token = mask.shape.as_list()
  return {k: v[..., :length] if v.shape.as_list() == per_token else v for k, v in batch.items()}


def pad_to_length(batch, length, mask_key="input_mask"):
  """The per-token features of a batch (shaped like `batch[mask_key]`) padded with zeros to
  `length` tokens (not cut: `length` is at least theirs); the padding is masked out."""
  per_token = batch[mask_key].shape.as_list()
  padding = length - tf.shape(batch[mask_key])[-1]

  def pad(v):
    return tf.pad(v, [[0, 0]] * (v.shape.rank - 1) + [[0, padding]])
  return {k: pad(v) if v.shape.as_list() == per_token else v for k, v in batch.items()}


def length_order(lengths):
  """The order (indices) that sorts examples by length, stable: written in this order,
  prediction batches cut to their longest (trim_to_longest) each hold texts of about one length.
  `unsort` puts the outputs back in input order."""
  return np.argsort(np.asarray(lengths), kind="stable")


def unsort(values, order):
  """`values` computed in `order` (a permutation of the input) -> the same rows in input order."""
  restored = np.empty_like(values)
  restored[order] = values
  return restored


def tfrecord_dataset(input_files, name_to_features, batch_size, is_training, input_context=None,
                     seed=None, shuffle_buffer=1000, drop_remainder=None, value_limits=None,
                     pad_to_longest=False):
  """Batches of decoded features from TFRecord files.

  `batch_size` is per replica. Training shuffles files and records with `seed` (deterministic
  order for a seed, so a resumed run can skip exactly the batches it has seen) and repeats.
  Records with values outside `value_limits` fail the pipeline (see naming_bad_records).
  `pad_to_longest` cuts each batch's per-token features after its longest sequence
  (trim_to_longest), making their sequence dimension unknown (None) to the functions downstream.
  """
  files = tf.data.Dataset.from_tensor_slices(list(input_files))
  if input_context and input_context.num_input_pipelines > 1:
    if len(input_files) >= input_context.num_input_pipelines:
      files = files.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
      sharded_by_file = True
    else:
      sharded_by_file = False
  else:
    sharded_by_file = True
  if is_training:
    files = files.shuffle(len(input_files), seed=seed, reshuffle_each_iteration=False).repeat()
    ds = files.interleave(tf.data.TFRecordDataset, cycle_length=min(len(input_files), 8),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  else:
    ds = tf.data.TFRecordDataset(files)
  if not sharded_by_file:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  if is_training:
    ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
  ds = ds.map(lambda r: _decode(r, name_to_features, value_limits),
              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  ds = ds.batch(batch_size, drop_remainder=is_training if drop_remainder is None
                else drop_remainder)
  if pad_to_longest:
    seq_length = next(v.shape[-1] for k, v in name_to_features.items() if k == "input_mask")
    multiple = length_multiple(seq_length)
    ds = ds.map(lambda batch: trim_to_longest(batch, multiple),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds
