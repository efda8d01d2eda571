"""TFRecord files of tf.train.Examples (pre-training and fine-tuning): the parsing specs and the
tf.data pipelines that read them (tfrecord_io writes them).

One reader for every script: files are sharded across input pipelines (workers) when the data has
at least as many files, shuffled and interleaved when training, records parsed in parallel, and
batches of a fixed batch size (drop_remainder). Training data repeats forever; evaluation and
prediction data are read once, in order.

Records hold every sequence padded to max_seq_length (the original's format), but real text is
mostly far shorter: with `pad_to_longest` each batch is cut after its longest real sequence,
rounded up to a multiple of max_seq_length / 8 (`length_multiple`), so a function runs on at most
8 sequence lengths per max_seq_length. Padding is masked out of attention and carries no label, so
the outputs for real tokens are the same as at full length (up to float summation order).

Pre-training records come in the original's kind and in those of create_pretraining_data's
--dynamic_masking (unmasked: masked here, afresh each time they are read, by DynamicMasking) and
--pack_sequences (several instances per sequence, told apart by instance_ids); PretrainingRecords
tells them apart by their features.
"""

import contextlib
import dataclasses
import re

import numpy as np
import tensorflow as tf
from google.protobuf import message

from bert_tf2 import errors
from bert_tf2 import masking


def int_feature(length):
  return tf.io.FixedLenFeature([length], tf.int64)


def float_feature(length):
  return tf.io.FixedLenFeature([length], tf.float32)


PRETRAINING_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                        "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")


@dataclasses.dataclass(frozen=True)
class PretrainingRecords:
  """The kind of create_pretraining_data's records: `dynamic` ones (--dynamic_masking) hold
  token_kinds and mask_token_id instead of masks; packed ones (--pack_sequences) hold
  instance_ids and `max_instances` next-sentence slots (next_sentence_weights) per sequence.
  Packed dynamic ones also hold the `max_predictions` and `masked_lm_prob` the generator packed
  them for (0 where absent: masked records, unpacked ones, and those written before)."""
  dynamic: bool = False
  max_instances: int = 1
  packed: bool = False
  max_predictions: int = 0
  masked_lm_prob: float = 0.0
  # The size of the vocabulary dynamic records were written with (0: masked records, or written
  # before it was recorded).
  vocab_words: int = 0
  # --no_nsp records: single segments, no next-sentence task (told by the first record having no
  # segment-1 token: a pair's second segment is never empty).
  single_segment: bool = False

  @classmethod
  def of_file(cls, path):
    """The kind of the records in `path`, told by its first record's features."""
    try:
      feature = tf.train.Example.FromString(_first_record(path).numpy()).features.feature
    except message.DecodeError as e:
      raise errors.InputError(f"{path}: record 0 is not a tf.train.Example ({e})") from None
    packed = "instance_ids" in feature
    budget = {}
    if "max_predictions_per_seq" in feature and "masked_lm_prob" in feature:
      budget = dict(max_predictions=feature["max_predictions_per_seq"].int64_list.value[0],
                    masked_lm_prob=feature["masked_lm_prob"].float_list.value[0])
    words = feature["vocab_words"].int64_list.value if "vocab_words" in feature else [0]
    segments = feature["segment_ids"].int64_list.value if "segment_ids" in feature else [1]
    return cls(dynamic="token_kinds" in feature, packed=packed,
               max_instances=len(feature["next_sentence_labels"].int64_list.value) if packed
               else 1, vocab_words=int(words[0]) if words else 0,
               single_segment=1 not in segments, **budget)

  @classmethod
  def of_files(cls, input_files):
    """The kind of the records of every file in `input_files`; InputError naming two files whose
    kinds differ."""
    kinds = {path: cls.of_file(path) for path in input_files}
    first = input_files[0]
    for path, kind in kinds.items():
      if kind != kinds[first]:
        raise errors.InputError(
            f"{path} holds records of another kind ({kind.describe()}) than {first} "
            f"({kinds[first].describe()}); give files written with the same options")
    return kinds[first]

  def describe(self):
    kinds = [k for k, on in (("single segments, masked-LM only (--no_nsp)", self.single_segment),
                             ("unmasked (--dynamic_masking)", self.dynamic),
                             (f"packed, up to {self.max_instances} instances a sequence",
                              self.packed),
                             (f"for at most {self.max_predictions} predictions a sequence at "
                              f"masked_lm_prob {np.float32(self.masked_lm_prob)!s}",
                              self.max_predictions)) if on]
    return ", ".join(kinds) or "masked, one instance a sequence (the original's)"


def pretraining_features(max_seq_length, max_predictions_per_seq, records=PretrainingRecords()):
  """The feature spec of create_pretraining_data.py's records (of the kind `records`)."""
  features = {
      "input_ids": int_feature(max_seq_length),
      "input_mask": int_feature(max_seq_length),
      "segment_ids": int_feature(max_seq_length),
  }
  if records.dynamic:
    # vocab_words: the number of the vocabulary's tokens, the range of the 10% random
    # replacements; records written before it had this read 0 (then the config's vocab_size).
    features.update(token_kinds=int_feature(max_seq_length), mask_token_id=int_feature(1),
                    vocab_words=tf.io.FixedLenFeature([1], tf.int64, default_value=[0]))
  else:
    features.update(masked_lm_positions=int_feature(max_predictions_per_seq),
                    masked_lm_ids=int_feature(max_predictions_per_seq),
                    masked_lm_weights=float_feature(max_predictions_per_seq))
  features["next_sentence_labels"] = int_feature(records.max_instances)
  if records.packed:
    features.update(instance_ids=int_feature(max_seq_length),
                    next_sentence_weights=float_feature(records.max_instances))
  return features


def pretraining_value_limits(vocab_size, type_vocab_size, max_seq_length, config_source,
                             records=PretrainingRecords()):
  """{feature: (bound, what)}: the values of pre-training records the model can take lie in
  [0, bound). An id past an embedding table is an InvalidArgumentError deep in a CPU step and,
  on a GPU, a silent zero vector."""
  return {
      "input_ids": (vocab_size, f"vocab_size={vocab_size} of {config_source}"),
      "masked_lm_ids": (vocab_size, f"vocab_size={vocab_size} of {config_source}"),
      "mask_token_id": (vocab_size, f"vocab_size={vocab_size} of {config_source}"),
      "segment_ids": (type_vocab_size, f"type_vocab_size={type_vocab_size} of {config_source}"),
      "masked_lm_positions": (max_seq_length, f"--max_seq_length={max_seq_length}"),
      "next_sentence_labels": (2, "the two next-sentence classes"),
      "token_kinds": (3, "the three token kinds of --dynamic_masking"),
      "instance_ids": (records.max_instances + 1,
                       f"the {records.max_instances} instances a sequence of these records"),
  }


@dataclasses.dataclass(frozen=True)
class DynamicMasking:
  """Masks records written with --dynamic_masking as they are read, with create_pretraining_data's
  rules: in each instance, min(max_predictions_per_seq, max(1, round(length * masked_lm_prob)))
  of its tokens other than [CLS] and [SEP] (capped at those it has) are predicted, chosen at
  random (with `whole_word_mask`, words in random order, each taken when all its WordPieces still
  fit, else skipped); a prediction becomes [MASK] 80% of the time, a random id of the vocabulary
  10%, and stays 10% (`split`, --mask_split). A packed sequence holds at most max_predictions_per_seq predictions in all:
  the generator packs so that its own flags' predictions fit, and run_pretraining refuses a
  larger masked_lm_prob or a smaller max_predictions_per_seq than the records were packed for
  (the last predictions of a sequence would be dropped).

  The draws are stateless, a function of the [2] `seed` a call gets: pretraining_dataset gives
  each batch its own from (seed, input pipeline, batch index), so that every pass over the data
  draws new masks and a resumed run the same ones as an uninterrupted run.
  """
  masked_lm_prob: float
  max_predictions_per_seq: int
  vocab_size: int
  whole_word_mask: bool = False
  split: masking.MaskSplit = masking.MaskSplit()  # [MASK] / random / kept (--mask_split)

  def __call__(self, batch, seed):
    """A batch of dynamic records -> the same batch masked, with masked_lm_positions,
    masked_lm_ids and masked_lm_weights, without token_kinds, mask_token_id and vocab_words."""
    seed = tf.cast(seed, tf.int64)
    ids, kinds = batch["input_ids"], batch["token_kinds"]
    # An unpacked record is one instance: its input_mask (1 on its tokens, 0 on padding) serves
    # as instance ids.
    instances = batch.get("instance_ids", batch["input_mask"])
    slots = batch["next_sentence_labels"].shape[-1]
    preds = self.max_predictions_per_seq
    n, seq = tf.shape(ids)[0], tf.shape(ids)[1]
    candidate = kinds > 0
    # Padding (id 0) becomes -1 here, whose one-hot row is all zeros: in no instance.
    in_instance = tf.one_hot(instances - 1, slots, dtype=tf.int32)  # [n, seq, slots]
    lengths = tf.reduce_sum(in_instance, axis=1)
    available = tf.reduce_sum(in_instance * tf.cast(candidate, tf.int32)[..., None], axis=1)
    # tf.round rounds half to even, as Python's round() in the generator, on the float64 product.
    counts = tf.cast(tf.round(tf.cast(lengths, tf.float64) * self.masked_lm_prob), tf.int32)
    counts = tf.minimum(tf.minimum(preds, tf.maximum(1, counts)), available)
    # fold_in(seed, 0 / 1 / 2): independent streams for the positions, the 80/10/10 draw and the
    # random ids, each a function of the batch's seed alone. float64 keys: they are sorted added
    # to instance ids (choose_masked_positions), where float32 would round off their low bits.
    keys = tf.random.stateless_uniform([n, seq], tf.random.experimental.stateless_fold_in(seed, 0),
                                       dtype=tf.float64)
    selected = choose_masked_positions(instances, kinds, counts, keys, self.whole_word_mask)

    columns = tf.range(seq)
    # Cuts nothing where a sequence holds one instance (its count is at most preds: the
    # original's per-instance cap) nor in a packed one within the budget it was packed for.
    positions = tf.sort(tf.where(selected, columns, seq), axis=1)[:, :preds]
    valid = positions < seq
    # Unused slots hold position 0 and label 0 with weight 0, as the original's records pad them.
    positions = tf.where(valid, positions, 0)
    labels = tf.where(valid, tf.gather(ids, positions, batch_dims=1), 0)
    draw = tf.random.stateless_uniform([n, preds],
                                       tf.random.experimental.stateless_fold_in(seed, 1))
    # A random token of the vocabulary the records were written with (a vocab of 8,000 tokens
    # under a config of 30,522 rows drew mostly ids no token has), at most the config's rows.
    words = tf.cast(batch["vocab_words"][:, :1], tf.int64) if "vocab_words" in batch else (
        tf.zeros([n, 1], tf.int64))
    words = tf.where((words > 0) & (words <= self.vocab_size), words, self.vocab_size)
    # Full-range 64-bit draws reduced modulo each row's range: a bias below 1e-14.
    random_ids = tf.cast(tf.math.floormod(tf.random.stateless_uniform(
        [n, preds], tf.random.experimental.stateless_fold_in(seed, 2), minval=None,
        maxval=None, dtype=tf.int64), words), ids.dtype)
    # 80% [MASK], 10% a random id, 10% unchanged, as the original: [MASK] never occurs in
    # fine-tuning, so the model also sees real tokens at predicted positions (random ones, and
    # unchanged ones, which keep the representation tied to the observed word).
    replacement = tf.where(draw < self.split.mask_below, batch["mask_token_id"][:, :1],
                           tf.where(draw < self.split.random_below, random_ids, labels))
    # Only the valid slots are written back: an unused slot's position 0 is [CLS]'s.
    chosen = tf.where(valid)  # [predictions, 2]: (row, slot)
    targets = tf.stack([chosen[:, 0], tf.cast(tf.gather_nd(positions, chosen), tf.int64)], 1)
    masked = {k: v for k, v in batch.items()
              if k not in ("token_kinds", "mask_token_id", "vocab_words")}
    masked.update(
        input_ids=tf.tensor_scatter_nd_update(ids, targets, tf.gather_nd(replacement, chosen)),
        masked_lm_positions=positions, masked_lm_ids=labels,
        masked_lm_weights=tf.cast(valid, tf.float32))
    return masked


def choose_masked_positions(instances, kinds, counts, keys, whole_word):
  """Which positions of rows [n, seq] to predict: in each instance (instance_ids 1, 2, ...),
  counts[row, instance - 1] of its candidates (token_kinds > 0), visiting its units (words with
  `whole_word`, else candidates) by increasing key of their first token and taking each one that
  still fits, as create_pretraining_data's maskers do. Returns a bool [n, seq]."""
  n, seq = tf.shape(kinds)[0], tf.shape(kinds)[1]
  slots = counts.shape[-1]
  candidate = kinds > 0
  starts = tf.equal(kinds, 1) if whole_word else candidate
  # The unit of each candidate (0 before the first, where there is none).
  unit = tf.maximum(tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1, 0)
  rows = tf.broadcast_to(tf.range(n)[:, None], [n, seq])
  segments = rows * seq + unit
  unit_length = tf.reshape(tf.math.unsorted_segment_sum(
      tf.cast(candidate, tf.int32), segments, n * seq), [n, seq])  # by unit index

  # The units' first tokens grouped by instance, in order of key within each.
  # One sort for every instance at once: instance id + key (key in [0, 1)) orders the units by
  # instance, then at random within it; tokens that start no unit (slots + 2) go last.
  order = tf.argsort(tf.where(starts, tf.cast(instances, tf.float64) + keys, slots + 2.0),
                     axis=1, stable=True)
  sorted_instance = tf.gather(instances, order, batch_dims=1)
  sorted_length = tf.where(tf.gather(starts, order, batch_dims=1),
                           tf.gather(unit_length, tf.gather(unit, order, batch_dims=1),
                                     batch_dims=1), 0)
  units = tf.reduce_sum(tf.one_hot(instances - 1, slots, dtype=tf.int32) *
                        tf.cast(starts, tf.int32)[..., None], axis=1)  # [n, slots]
  first = tf.cumsum(units, axis=1, exclusive=True)  # sorted index of each instance's first unit
  in_sorted = tf.range(seq)[None, :] < tf.reduce_sum(units, axis=1, keepdims=True)
  instance_slot = tf.maximum(sorted_instance - 1, 0)
  rank = tf.range(seq)[None, :] - tf.gather(first, instance_slot, batch_dims=1)

  if whole_word:
    # Greedy over ranks, all instances of all rows at once: a unit is taken if it still fits.
    def step(r, total, taken):
      index = tf.minimum(first + r, seq - 1)
      length = tf.gather(sorted_length, index, batch_dims=1)
      fits = (r < units) & (total + length <= counts)
      return r + 1, total + tf.where(fits, length, 0), taken.write(r, fits)

    def more(r, total, taken):
      del taken
      return tf.reduce_any((total < counts) & (r < units))

    steps, _, taken = tf.while_loop(
        more, step, (0, tf.zeros_like(counts), tf.TensorArray(tf.bool, size=0, dynamic_size=True,
                                                              element_shape=counts.shape)))
    # [n, slots, steps + 1]: whether the unit of each rank was taken (never past the last step).
    taken = tf.concat([tf.transpose(taken.stack(), [1, 2, 0]),
                       tf.zeros_like(counts, tf.bool)[..., None]], axis=2)
    sorted_taken = in_sorted & tf.gather_nd(
        taken, tf.stack([rows, instance_slot, tf.minimum(rank, steps)], axis=-1))
  else:
    # Single tokens always fit: the first `count` of the instance's random order, as the
    # generator's shuffle then slice.
    sorted_taken = in_sorted & (rank < tf.gather(counts, instance_slot, batch_dims=1))
  # Back from sorted order to the units' first tokens, then to every token of a taken unit.
  start_taken = tf.gather(sorted_taken, tf.argsort(order, axis=1), batch_dims=1) & starts
  unit_taken = tf.reshape(tf.math.unsorted_segment_max(
      tf.cast(start_taken, tf.int32), segments, n * seq), [n, seq]) > 0
  return candidate & tf.gather(unit_taken, unit, batch_dims=1)


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
  # The features pass through an identity behind the checks: none exists until its record's
  # checks have passed, so the pipeline fails at the bad record rather than in the model.
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


def _first_record(path):
  """The first record of a TFRecord file; InputError naming the file when there is none."""
  try:
    records = list(tf.data.TFRecordDataset(path).take(1))
  except tf.errors.OpError as e:  # DataLossError: not a TFRecord file, or a corrupted one
    raise errors.InputError(f"{path}: record 0 cannot be read ({_op_message(e)}); is it a "
                            "TFRecord file of tf.train.Examples?") from None
  if not records:
    raise errors.InputError(f"{path}: holds no record")
  return records[0]


def check_records(input_files, name_to_features, value_limits=None, scan=100):
  """Parses the first record of each file eagerly, so a missing or wrongly shaped feature, or a
  file that is not TFRecords at all, is an error naming the file before training starts rather
  than a stack trace inside tf.data. With `value_limits` (pretraining_value_limits), the first
  `scan` records of each file are also checked for ids the model cannot embed."""
  for path in input_files:
    record = _first_record(path)
    try:
      _decode(record, name_to_features)
    except tf.errors.InvalidArgumentError as e:
      expected = ", ".join(f"{k}[{', '.join(map(str, v.shape))}]"
                           for k, v in name_to_features.items())
      raise errors.InputError(
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
        raise errors.InputError(f"{path}: record {index}: {problem}")
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
          return errors.InputError(f"{path}: record {index}: {problem}")
        index += 1
    except tf.errors.DataLossError as e:
      return errors.InputError(f"{path}: record {index} cannot be read ({_op_message(e)}); the "
                               "file is truncated or damaged: write it again")
    except tf.errors.InvalidArgumentError as e:
      return errors.InputError(f"{path}: record {index} does not match the expected features: "
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
      # By file when every pipeline gets one; else (below) every pipeline reads every file and
      # keeps every num_input_pipelines-th record: still disjoint shares, at more reading.
      files = files.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
      sharded_by_file = True
    else:
      sharded_by_file = False
  else:
    sharded_by_file = True
  if is_training:
    files = files.shuffle(len(input_files), seed=seed, reshuffle_each_iteration=False).repeat()
    # deterministic=True here and in the maps: the order is a function of the seed alone, which
    # resuming by skipping the batches already seen relies on.
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
  # drop_remainder also gives the batch dimension a static size (repeated training data has no
  # last batch to drop).
  ds = ds.batch(batch_size, drop_remainder=is_training if drop_remainder is None
                else drop_remainder)
  if pad_to_longest:
    seq_length = next(v.shape[-1] for k, v in name_to_features.items() if k == "input_mask")
    multiple = length_multiple(seq_length)
    ds = ds.map(lambda batch: trim_to_longest(batch, multiple),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds


def pretraining_dataset(input_files, name_to_features, batch_size, is_training, input_context=None,
                        seed=None, drop_remainder=None, value_limits=None, masking=None):
  """tfrecord_dataset of pre-training records; with `masking` (a DynamicMasking, for records
  written with --dynamic_masking) each batch is masked as it is read, with draws that are a
  function of `seed`, the input pipeline and the batch's index alone: a run resumed by skipping
  the batches it has seen (training.Trainer) masks the rest as an uninterrupted run does."""
  ds = tfrecord_dataset(input_files, name_to_features, batch_size, is_training,
                        input_context=input_context, seed=seed, drop_remainder=drop_remainder,
                        value_limits=value_limits)
  if masking is None:
    return ds
  pipeline = input_context.input_pipeline_id if input_context else 0
  base = tf.constant([seed or 0, pipeline], tf.int64)
  # Indices counted before training.Trainer's skip(): a resumed run's batches keep their
  # indices, hence their seeds and masks.
  return ds.enumerate().map(
      lambda index, batch: masking(batch, tf.random.experimental.stateless_fold_in(base, index)),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
