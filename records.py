"""Writing TFRecord files of tf.train.Examples: the one home of record writing.

The fine-tuning scripts build each record's features with `int64_feature` / `float_feature` and
write them with `write_examples` (an iterable) or `ExampleWriter` (one at a time, for code that
hands out features through a callback). Either way the file appears under its name only when it
is complete, so an error, Ctrl-C or a full disk leaves no partial file, and the same features
give the same bytes in every run.
"""

from absl import logging
import tensorflow as tf

from bert_tf2 import fileio


def int64_feature(values):
  """A tf.train.Feature of int64 values."""
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def float_feature(values):
  """A tf.train.Feature of float values."""
  return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


class ExampleWriter:
  """A TFRecord file of tf.train.Examples written atomically: `write({name: Feature})` per
  record; the file appears at `close()` (or the end of a `with` block without an error)."""

  def __init__(self, path):
    self.path = path
    self.count = 0
    self._atomic = fileio.atomic_path(path)
    self._writer = tf.io.TFRecordWriter(self._atomic.__enter__())

  def write(self, features):
    if self.count % 10000 == 0 and self.count:
      logging.info("%s: %d examples written", self.path, self.count)
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
