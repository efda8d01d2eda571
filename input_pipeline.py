"""tf.data input pipelines over TFRecord files of tf.train.Examples (pre-training and fine-tuning).

One reader for every script: files are sharded across input pipelines (workers) when the data has
at least as many files, shuffled and interleaved when training, records parsed in parallel, and
batches of fixed shape (drop_remainder) so every step compiles once. Training data repeats forever;
evaluation and prediction data are read once, in order.
"""

import contextlib
import re

import tensorflow as tf

import fileio


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


def _decode(record, name_to_features):
  example = tf.io.parse_single_example(record, name_to_features)
  # int64 is what tf.train.Example stores; int32 is what every op downstream (and TPUs) want.
  return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in example.items()}


def _op_message(error):
  """The first line of a TF op error without its `{{function_node ...}}` and `[Op:...]` noise."""
  text = re.sub(r"\{\{[^}]*\}\}\s*", "", error.message.splitlines()[0])
  return re.sub(r"\s*\[Op:\w+\].*$", "", text).strip().rstrip(".")


def check_records(input_files, name_to_features):
  """Parses the first record of each file eagerly, so a missing or wrongly shaped feature, or a
  file that is not TFRecords at all, is an error naming the file before training starts rather
  than a stack trace inside tf.data."""
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


def _is_record_error(error):
  """Whether a tf.data error comes from the records (damaged bytes, features that do not parse)."""
  if isinstance(error, tf.errors.DataLossError):
    return True
  return isinstance(error, tf.errors.InvalidArgumentError) and any(
      word in error.message for word in ("Feature:", "Key:", "serialized Example"))


def find_bad_record(input_files, name_to_features):
  """The InputError for the first record of `input_files` that cannot be read or parsed (naming
  its file and index), or None. Reads everything up to it: for use after a failure only."""
  for path in input_files:
    index = 0
    try:
      for record in tf.data.TFRecordDataset(path):
        _decode(record, name_to_features)
        index += 1
    except tf.errors.DataLossError as e:
      return fileio.InputError(f"{path}: record {index} cannot be read ({_op_message(e)}); the "
                               "file is truncated or damaged: write it again")
    except tf.errors.InvalidArgumentError as e:
      return fileio.InputError(f"{path}: record {index} does not match the expected features: "
                               f"{_op_message(e)}")
  return None


@contextlib.contextmanager
def naming_bad_records(input_files, name_to_features):
  """Turns a tf.data error from a damaged or malformed record met while training or evaluating
  into an InputError naming the file and record (TF's own message names neither)."""
  try:
    yield
  except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
    bad = find_bad_record(input_files, name_to_features) if _is_record_error(e) else None
    if bad is None:
      raise
    raise bad from None


def tfrecord_dataset(input_files, name_to_features, batch_size, is_training, input_context=None,
                     seed=None, shuffle_buffer=1000, drop_remainder=None):
  """Batches of decoded features from TFRecord files.

  `batch_size` is per replica. Training shuffles files and records with `seed` (deterministic
  order for a seed, so a resumed run can skip exactly the batches it has seen) and repeats.
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
  ds = ds.map(lambda r: _decode(r, name_to_features), num_parallel_calls=tf.data.AUTOTUNE,
              deterministic=True)
  return ds.batch(batch_size, drop_remainder=is_training if drop_remainder is None
                  else drop_remainder)
