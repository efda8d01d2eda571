"""BERT fine-tuning for sentence and sentence-pair classification (GLUE, XNLI, your own TSV/CSV).

Reads a task's train/dev/test files into `InputExample`s with one processor per task, turns each
example into fixed-length features ([CLS] a [SEP] b [SEP], segment ids, mask, label id) exactly as
the original BERT did, writes them to a TFRecord file and reads that back as a tf.data pipeline.
Fine-tuning and evaluation themselves live in `training.py` and `modeling.py`.

A text longer than --max_seq_length is truncated, as in the original; with --doc_stride it is read
whole in overlapping windows (text_b of a pair, else text_a; see sliding_windows.py): training
takes every window as a record with its example's label, and evaluation and prediction give each
example the mean of its windows' probabilities (scores, for regression), so eval_results.txt and
test_results.tsv still hold one example per row, in input order.

Every standard GLUE file layout is read by its header's column names, so header/no-header and
column-order differences between GLUE releases do not matter; a row with the wrong number of
columns or an unknown label is reported with its file and line. A task of your own needs no code:
`--task_name=tsv` (or `csv`) with `--text_a_column`, `--text_b_column`, `--label_column`.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import dataclasses
import itertools
import math
import os
import re

from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import fine_tuning
from bert_tf2 import input_pipeline
from bert_tf2 import metrics
from bert_tf2 import modeling
from bert_tf2 import script_flags
from bert_tf2 import sliding_windows
from bert_tf2 import tfrecord_io
from bert_tf2 import tokenization
from bert_tf2 import training

FLAGS = flags.FLAGS


def define_flags():
  """The flags of run_classifier.py: the shared groups (script_flags), then its own."""
  script_flags.define_fine_tuning_flags()
  script_flags.define_litert_model_flag()
  script_flags.define_data_dir_flag()
  script_flags.define_labels_flag()
  script_flags.define_regression_flag()
  script_flags.define_multi_label_flag()
  script_flags.define_doc_stride_flag()

  # The task (--vocab_file, --output_dir and the rest are script_flags' shared groups).
  flags.DEFINE_string(
      "task_name", None,
      "Which task the data is: cola, mnli, mnli-mm (MNLI with the mismatched dev/test sets), mrpc, "
      "qnli, qqp, rte, sst-2, sts-b, wnli, xnli, or tsv / csv for your own data (see "
      "--text_a_column).")

  flags.DEFINE_string(
      "xnli_language", "zh",
      "XNLI only: the language whose machine-translated MultiNLI training file "
      "(multinli/multinli.train.<lang>.tsv) and whose dev/test rows (xnli.dev.tsv, xnli.test.tsv) "
      "are used.")

  ## Your own task: --task_name=tsv or csv reads train.tsv / dev.tsv / test.tsv (or .csv) in
  ## --data_dir. TSV is split on tabs with no quoting (like GLUE); CSV follows the usual quoting
  ## rules, so fields may contain commas, quotes and newlines.
  flags.DEFINE_string(
      "text_a_column", None,
      "tsv/csv tasks: column of the first text, by header name or 0-based index.")

  flags.DEFINE_string(
      "text_b_column", None,
      "tsv/csv tasks: column of the second text of a sentence-pair task (header name or 0-based "
      "index); leave unset for single-sentence tasks.")

  flags.DEFINE_string(
      "label_column", None,
      "tsv/csv tasks: column of the label (header name or 0-based index). Not read from the test "
      "file, which may leave it out.")

  flags.DEFINE_string(
      "label_delimiter", ",",
      "--multi_label tsv/csv tasks: what separates the labels of a row in the label column "
      "(\"joy,love\"; an empty field is no label).")

  ## Multi-label decisions: a label is predicted when its probability is above its threshold.
  flags.DEFINE_float(
      "threshold", 0.5,
      "--multi_label: the probability above which a label is predicted (eval metrics, "
      "test_predictions.tsv).", lower_bound=0.0, upper_bound=1.0)

  flags.DEFINE_bool(
      "tune_thresholds", False,
      "--multi_label: with --do_eval, also pick each label's threshold that maximises its F1 on "
      "dev, report the metrics at those thresholds (eval_tuned_*: optimistic, chosen on the same "
      "data) and write them to thresholds.json; --do_predict then uses the thresholds.json of "
      "the same checkpoint.")

  flags.DEFINE_enum(
      "classifier_pooling", "pooler", list(modeling.CLASSIFIER_POOLINGS),
      "What the output layer reads: pooler (the original's tanh pooler over [CLS]), or mean / "
      "cls / max of the last layer's token vectors (as sentence-transformers pools; for "
      "checkpoints whose pooler was never trained, such as all-MiniLM-L6-v2). Saved in task.json: "
      "evaluation, prediction and export_model.py use the training run's.")

  flags.DEFINE_bool(
      "skip_header", True,
      "tsv/csv tasks: the first row of each file is a header. Needed to name columns; with "
      "numeric columns set --noskip_header for files without one.")


@dataclasses.dataclass
class InputExample:
  """One example of a classification task, as raw text.

  Attributes:
    guid: an identifier such as "dev-12", used in logs.
    text_a: the first text, or the only one of a single-text task.
    text_b: the second text of a sentence-pair task; None otherwise.
    label: the label string (a float for regression). Test files have no labels, so their
      examples carry a placeholder.
  """

  guid: str
  text_a: str
  text_b: str | None = None
  label: object = None


class PaddingInputExample:
  """A stand-in that fills up the last batch of an eval or predict run.

  A fixed-shape eval or predict step (TPU, XLA with static shapes) needs every batch full; padding
  with these, marked is_real_example=0, keeps the last real examples instead of dropping them, and
  the metrics weight them out. A class rather than None, so padding is never mistaken for data.
  """


@dataclasses.dataclass
class InputFeatures:
  """What the model reads for one example (or one window of one, with --doc_stride): token ids,
  mask and segment ids, all padded to the same length, plus the label id and whether the example
  is real or padding."""

  input_ids: list
  input_mask: list
  segment_ids: list
  label_id: int | float | list
  is_real_example: bool = True
  # The example a window belongs to (--doc_stride); not written to the records.
  example_index: int = 0


class DataProcessor:
  """Reads one task's train, dev and test files in `data_dir` into lists of InputExample."""

  # Regression tasks predict one real number; `get_labels` is then empty.
  is_regression = False
  # Sentence-pair tasks put a second text in segment 1.
  is_pair = True
  # Multi-label tasks give each example a set of labels (a tuple of label strings, maybe empty).
  multi_label = False

  def get_train_examples(self, data_dir):
    """The training split."""
    raise NotImplementedError()

  def get_dev_examples(self, data_dir):
    """The dev split, used for evaluation."""
    raise NotImplementedError()

  def get_test_examples(self, data_dir):
    """The test split, for predictions only (placeholder labels)."""
    raise NotImplementedError()

  def get_labels(self, data_dir=None):
    """The label strings; a label's position in this list is its class id."""
    raise NotImplementedError()

  def split_file(self, data_dir, split):
    """The file a split ("train", "dev", "test") is read from."""
    raise NotImplementedError()

  def data_files(self, data_dir):
    return [self.split_file(data_dir, split) for split in ("train", "dev", "test")]

  def num_labels(self):
    """Output units of the classifier head: one per label, or one for a regression task."""
    return 1 if self.is_regression else len(self.get_labels())

  @classmethod
  def _read_tsv(cls, input_file, quotechar=None):
    """Rows of a tab-separated file as (line number, fields) pairs.

    With no quotechar (GLUE's files) a row is its line split on tabs, so the stray quotes in
    QQP, QNLI and SST-2 text stay part of the text. Blank lines are skipped.
    """
    if quotechar is None:
      return [(number, line.split("\t")) for number, line in fileio.read_lines(input_file) if line]
    return fileio.read_delimited(input_file, "\t", quotechar)


def _regression_label(input_file, line, text):
  """A regression target: a finite number (a NaN or infinite one would poison every step)."""
  try:
    value = float(text)
  except ValueError:
    raise fileio.InputError(f"{input_file}:{line}: label {text!r} is not a number") from None
  if not math.isfinite(value):
    raise fileio.InputError(f"{input_file}:{line}: label {text!r} is not a finite number")
  return value


def _multi_labels(input_file, line, text, delimiter, labels):
  """A multi-label field ("joy,love"): the tuple of its labels, each checked against `labels`
  (when known); an empty field is the empty set."""
  found = tuple(part.strip() for part in text.split(delimiter) if part.strip())
  if labels is not None:
    unknown = [label for label in found if label not in labels]
    if unknown:
      raise fileio.InputError(f"{input_file}:{line}: unknown label {unknown[0]!r}; expected "
                              f"labels among {', '.join(labels)} separated by {delimiter!r}")
  if len(set(found)) != len(found):
    raise fileio.InputError(f"{input_file}:{line}: a label is repeated in {text!r}")
  return found


@dataclasses.dataclass
class _Columns:
  """Where a file's text and label columns are: found by header name, or at fixed positions."""

  text_a: int
  text_b: int | None
  label: int | None
  width: int
  has_header: bool


def _locate_columns(input_file, rows, names, positions, read_label):
  """Resolves a processor's column names against the file's header.

  `names` is (text_a, text_b, label) header names (text_b None for one text). If the first row
  holds text_a's name the file has a header and every column is looked up by name; otherwise
  `positions` (text_a, text_b, label, width) gives a header-less layout, or the file is refused.
  """
  if not rows:
    raise fileio.InputError(f"{input_file}: the file is empty")
  first_line, header = rows[0]
  if names[0] in header:
    def index(name, what):
      if name is None:
        return None
      if name not in header:
        raise fileio.InputError(f"{input_file}:{first_line}: the header has no {what} column "
                                f"{name!r} (columns: {', '.join(header)})")
      return header.index(name)
    return _Columns(index(names[0], "text"), index(names[1], "second text"),
                    index(names[2], "label") if read_label else None, len(header), True)
  if positions is None:
    raise fileio.InputError(
        f"{input_file}:{first_line}: expected a header row naming the columns "
        f"{', '.join(n for n in names if n)}; found {header!r}")
  text_a, text_b, label, width = positions
  return _Columns(text_a, text_b, label if read_label else None, width, False)


def _examples_from_rows(input_file, rows, columns, set_type, labels=None, label_aliases=None,
                        default_label=None, is_regression=False, guid_column=None):
  """InputExamples from rows, checking each row's width and label; errors name file:line."""
  examples = []
  for i, (line, fields) in enumerate(rows):
    if columns.has_header and i == 0:
      continue
    if len(fields) != columns.width:
      raise fileio.InputError(
          f"{input_file}:{line}: expected {columns.width} tab-separated columns, found "
          f"{len(fields)}")
    guid_value = fields[guid_column] if guid_column is not None else i
    guid = f"{set_type}-{guid_value}"
    text_a = tokenization.convert_to_unicode(fields[columns.text_a])
    text_b = None
    if columns.text_b is not None:
      text_b = tokenization.convert_to_unicode(fields[columns.text_b])
    if columns.label is None:
      label = default_label
    else:
      label = fields[columns.label].strip()
      if label_aliases:
        label = label_aliases.get(label, label)
      if is_regression:
        label = _regression_label(input_file, line, label)
      elif labels is not None and label not in labels:
        raise fileio.InputError(f"{input_file}:{line}: unknown label {label!r}; expected one of "
                                f"{', '.join(labels)}")
    examples.append(InputExample(guid=guid, text_a=text_a, text_b=text_b, label=label))
  return examples


class GlueProcessor(DataProcessor):
  """A GLUE task in its TSV files, described by file names, column names and labels.

  Subclasses only fill in the class attributes; columns are found by header name, so the same
  code reads every GLUE task.
  """

  train_file = "train.tsv"
  dev_file = "dev.tsv"
  test_file = "test.tsv"
  text_a_column = "sentence1"
  text_b_column = "sentence2"
  label_column = "label"
  labels = ("0", "1")
  # (text_a, text_b, label, number of columns) for files without a header, where the task has one.
  headerless_layout = None
  # Column whose value makes the guid (as the original for MNLI); default: the row's index.
  guid_column_name = None

  @property
  def is_pair(self):
    return self.text_b_column is not None

  def split_file(self, data_dir, split):
    return os.path.join(data_dir, getattr(self, f"{split}_file"))

  def get_train_examples(self, data_dir):
    return self._create_examples(os.path.join(data_dir, self.train_file), "train")

  def get_dev_examples(self, data_dir):
    return self._create_examples(os.path.join(data_dir, self.dev_file), "dev")

  def get_test_examples(self, data_dir):
    return self._create_examples(os.path.join(data_dir, self.test_file), "test")

  def get_labels(self, data_dir=None):
    return [] if self.is_regression else list(self.labels)

  def _create_examples(self, input_file, set_type):
    """The examples of one split's file; `set_type` starts their guids."""
    rows = self._read_tsv(input_file)
    read_label = set_type != "test"
    columns = _locate_columns(input_file, rows,
                              (self.text_a_column, self.text_b_column, self.label_column),
                              self.headerless_layout, read_label)
    guid_column = None
    if self.guid_column_name and columns.has_header and self.guid_column_name in rows[0][1]:
      guid_column = rows[0][1].index(self.guid_column_name)
    # Test sets have no labels; as in the original, they get a placeholder (the first label).
    default_label = 0.0 if self.is_regression else self.labels[0]
    return _examples_from_rows(input_file, rows, columns, set_type, labels=self.get_labels(),
                               default_label=default_label, is_regression=self.is_regression,
                               guid_column=guid_column)


class ColaProcessor(GlueProcessor):
  """CoLA: is one sentence grammatically acceptable (1) or not (0).

  Only the test set has a header ("index, sentence"); train and dev rows are
  (source, label, original mark, sentence).
  """

  text_a_column = "sentence"
  text_b_column = None
  headerless_layout = (3, None, 1, 4)


class MnliProcessor(GlueProcessor):
  """MultiNLI: does the premise entail, contradict or leave open the hypothesis; evaluated on the
  matched dev and test sets (the training genres)."""

  dev_file = "dev_matched.tsv"
  test_file = "test_matched.tsv"
  label_column = "gold_label"
  labels = ("contradiction", "entailment", "neutral")
  guid_column_name = "index"

  def get_dev_examples(self, data_dir):
    return self._create_examples(os.path.join(data_dir, self.dev_file), "dev_matched")


class MnliMismatchedProcessor(MnliProcessor):
  """MultiNLI with the mismatched dev and test sets (genres unseen in training)."""

  dev_file = "dev_mismatched.tsv"
  test_file = "test_mismatched.tsv"

  def get_dev_examples(self, data_dir):
    return self._create_examples(os.path.join(data_dir, self.dev_file), "dev_mismatched")


class MrpcProcessor(GlueProcessor):
  """MRPC: are two news sentences paraphrases (1) or not (0)."""

  text_a_column = "#1 String"
  text_b_column = "#2 String"
  label_column = "Quality"


class Sst2Processor(GlueProcessor):
  """SST-2: sentiment of one movie-review sentence, negative (0) or positive (1)."""

  text_a_column = "sentence"
  text_b_column = None


class QqpProcessor(GlueProcessor):
  """QQP: do two Quora questions ask the same thing (1) or not (0)."""

  text_a_column = "question1"
  text_b_column = "question2"
  label_column = "is_duplicate"


class QnliProcessor(GlueProcessor):
  """QNLI: does the sentence contain the answer to the question."""

  text_a_column = "question"
  text_b_column = "sentence"
  labels = ("entailment", "not_entailment")


class RteProcessor(GlueProcessor):
  """RTE: does the first text entail the second."""

  labels = ("entailment", "not_entailment")


class WnliProcessor(GlueProcessor):
  """WNLI: does the second sentence follow from the first (Winograd schemas with a pronoun
  replaced)."""


class StsbProcessor(GlueProcessor):
  """STS-B: how similar two sentences are, a real score from 0 to 5 (regression)."""

  label_column = "score"
  is_regression = True


class XnliProcessor(DataProcessor):
  """XNLI in one language: trains on MultiNLI machine-translated into it, evaluates on its rows
  of the XNLI dev/test files."""

  labels = ("contradiction", "entailment", "neutral")

  def __init__(self, language="zh"):
    self.language = language

  def split_file(self, data_dir, split):
    if split == "train":
      return os.path.join(data_dir, "multinli", f"multinli.train.{self.language}.tsv")
    return os.path.join(data_dir, f"xnli.{split}.tsv")

  def get_train_examples(self, data_dir):
    input_file = self.split_file(data_dir, "train")
    rows = self._read_tsv(input_file)
    columns = _locate_columns(input_file, rows, ("premise", "hypo", "label"), None, True)
    # The translated training files spell one label differently.
    return _examples_from_rows(input_file, rows, columns, "train", labels=self.labels,
                               label_aliases={"contradictory": "contradiction"})

  def get_dev_examples(self, data_dir):
    return self._language_examples(os.path.join(data_dir, "xnli.dev.tsv"), "dev")

  def get_test_examples(self, data_dir):
    return self._language_examples(os.path.join(data_dir, "xnli.test.tsv"), "test")

  def get_labels(self, data_dir=None):
    return list(self.labels)

  def _language_examples(self, input_file, set_type):
    """The rows of one language from the all-languages XNLI dev/test file (it is labelled)."""
    rows = self._read_tsv(input_file)
    columns = _locate_columns(input_file, rows, ("sentence1", "sentence2", "gold_label"), None,
                              True)
    language_column = rows[0][1].index("language") if "language" in rows[0][1] else 0
    for line, fields in rows[1:]:
      if len(fields) != columns.width:
        raise fileio.InputError(f"{input_file}:{line}: expected {columns.width} tab-separated "
                                f"columns, found {len(fields)}")
    kept = [rows[0]] + [row for row in rows[1:] if row[1][language_column] == self.language]
    if len(kept) == 1:
      raise fileio.InputError(f"{input_file}: no rows for language {self.language!r} "
                              f"(--xnli_language)")
    examples = _examples_from_rows(input_file, kept, columns, set_type, labels=self.labels)
    # Keep the original's guids: the row's position in the whole file.
    for example, (line, _) in zip(examples, kept[1:]):
      example.guid = f"{set_type}-{line - rows[0][0]}"
    return examples


class GoEmotionsProcessor(DataProcessor):
  """GoEmotions (Demszky et al., 2020): Reddit comments, each with one or more of 27 emotions or
  "neutral" (a multi-label task).

  The release's files: train.tsv, dev.tsv and test.tsv without a header, rows (text, label ids
  comma-separated, comment id), and labels.txt with the label names, one per line, in id order.
  Examples carry label names and the comment id as their guid ("dev-eecwqtt").
  """

  is_pair = False
  multi_label = True

  def __init__(self):
    self._labels = None

  def split_file(self, data_dir, split):
    return os.path.join(data_dir, f"{split}.tsv")

  def data_files(self, data_dir):
    return super().data_files(data_dir) + [os.path.join(data_dir, "labels.txt")]

  def get_train_examples(self, data_dir):
    return self._create_examples(data_dir, "train")

  def get_dev_examples(self, data_dir):
    return self._create_examples(data_dir, "dev")

  def get_test_examples(self, data_dir):
    return self._create_examples(data_dir, "test")

  def get_labels(self, data_dir=None):
    if self._labels is None:
      if data_dir is None:
        raise fileio.InputError("goemotions: give --data_dir (its labels.txt names the labels)")
      path = os.path.join(data_dir, "labels.txt")
      names = [line.strip() for _, line in fileio.read_lines(path) if line.strip()]
      if not names:
        raise fileio.InputError(f"{path}: no label names")
      repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
      if repeated is not None:
        raise fileio.InputError(f"{path}: the label {repeated!r} is listed twice")
      self._labels = names
    return list(self._labels)

  def _create_examples(self, data_dir, set_type):
    labels = self.get_labels(data_dir)
    input_file = self.split_file(data_dir, set_type)
    examples = []
    for line, fields in self._read_tsv(input_file):
      if len(fields) != 3:
        raise fileio.InputError(f"{input_file}:{line}: expected 3 tab-separated columns (text, "
                                f"label ids, comment id), found {len(fields)}")
      ids = _multi_labels(input_file, line, fields[1], ",", None)
      if not all(i.isdigit() and int(i) < len(labels) for i in ids):
        raise fileio.InputError(f"{input_file}:{line}: label ids {fields[1]!r} are not numbers "
                                f"below {len(labels)} (the labels of labels.txt)")
      examples.append(InputExample(guid=f"{set_type}-{fields[2].strip()}",
                                   text_a=tokenization.convert_to_unicode(fields[0]),
                                   label=tuple(labels[int(i)] for i in ids)))
    if not examples:
      raise fileio.InputError(f"{input_file}: the file is empty")
    return examples


class DelimitedProcessor(DataProcessor):
  """A task of your own in train/dev/test .tsv or .csv files; see the tsv/csv flags."""

  def __init__(self, delimiter, text_a_column, text_b_column=None, label_column=None,
               labels=None, skip_header=True, is_regression=False, multi_label=False,
               label_delimiter=","):
    if delimiter not in ("tsv", "csv"):
      raise ValueError(f"delimiter must be tsv or csv, not {delimiter!r}")
    if text_a_column is None or (label_column is None):
      raise fileio.InputError(f"--task_name={delimiter} needs --text_a_column and --label_column")
    self.extension = delimiter
    self.columns = (text_a_column, text_b_column, label_column)
    self.skip_header = skip_header
    self.is_regression = is_regression
    self.multi_label = multi_label
    self.label_delimiter = label_delimiter
    if is_regression and multi_label:
      raise fileio.InputError("--regression and --multi_label exclude each other")
    if multi_label and not label_delimiter:
      raise fileio.InputError("--label_delimiter must not be empty")
    self._labels = list(labels) if labels else None
    self._data_dir = None
    by_name = [c for c in self.columns if c is not None and not str(c).isdigit()]
    if by_name and not skip_header:
      raise fileio.InputError(f"columns named {', '.join(by_name)} need a header row; give "
                              f"0-based column numbers with --noskip_header")

  @property
  def is_pair(self):
    return self.columns[1] is not None

  def _path(self, data_dir, split):
    return os.path.join(data_dir, f"{split}.{self.extension}")

  split_file = _path

  def set_labels(self, labels):
    self._labels = list(labels)

  def get_train_examples(self, data_dir):
    return self._create_examples(self._path(data_dir, "train"), "train",
                                 self._checked_labels(data_dir))

  def get_dev_examples(self, data_dir):
    return self._create_examples(self._path(data_dir, "dev"), "dev", self._checked_labels(data_dir))

  def get_test_examples(self, data_dir):
    return self._create_examples(self._path(data_dir, "test"), "test",
                                 self._checked_labels(data_dir), read_label=False)

  def get_labels(self, data_dir=None):
    """The labels given, else those of the training file (so dev-only runs need it or --labels)."""
    if self.is_regression:
      return []
    if self._labels is None:
      data_dir = data_dir or self._data_dir
      if data_dir is None:
        raise fileio.InputError("give --labels, or --data_dir with a training file to read them "
                                "from")
      train_file = self._path(data_dir, "train")
      if not os.path.exists(train_file):
        raise fileio.InputError(f"give --labels: there is no {train_file} to read the labels "
                                "from, nor a task.json saved by a training run in --output_dir")
      examples = self._create_examples(train_file, "train", labels=None)
      if self.multi_label:
        found = {label for example in examples for label in example.label}
      else:
        found = {example.label for example in examples}
      if not found:
        raise fileio.InputError(f"{train_file}: no labelled rows to read the labels from; give "
                                "--labels")
      if all(re.fullmatch(r"-?[0-9]+", label) for label in found):
        self._labels = sorted(found, key=int)
      else:
        self._labels = sorted(found)
      logging.info("Labels from %s: %s", train_file, ", ".join(self._labels))
    return list(self._labels)

  def _checked_labels(self, data_dir):
    self._data_dir = data_dir
    return self.get_labels(data_dir) if not self.is_regression else []

  def _read_rows(self, input_file):
    if self.extension == "tsv":
      return self._read_tsv(input_file)
    return fileio.read_delimited(input_file, ",")

  def _create_examples(self, input_file, set_type, labels, read_label=True):
    rows = self._read_rows(input_file)
    if not rows:
      raise fileio.InputError(f"{input_file}: the file is empty")

    def index(column, header):
      if column is None:
        return None
      if str(column).isdigit():
        return int(column)
      if header is None or column not in header:
        raise fileio.InputError(f"{input_file}:{rows[0][0]}: the header has no column {column!r}"
                                + (f" (columns: {', '.join(header)})" if header else ""))
      return header.index(column)

    header = rows[0][1] if self.skip_header else None
    text_a, text_b = index(self.columns[0], header), index(self.columns[1], header)
    label = index(self.columns[2], header) if read_label else None
    # Test files may leave the label column out, so rows only need to reach the texts.
    needed = [text_a] + [c for c in (text_b,) if c is not None]
    if read_label:
      needed.append(label)
    examples = []
    for i, (line, fields) in enumerate(rows):
      if self.skip_header and i == 0:
        continue
      if header is not None and len(fields) != len(header):
        raise fileio.InputError(f"{input_file}:{line}: expected {len(header)} columns as in the "
                                f"header, found {len(fields)}")
      if max(needed) >= len(fields):
        raise fileio.InputError(f"{input_file}:{line}: expected at least {max(needed) + 1} "
                                f"columns, found {len(fields)}")
      value = None
      if read_label:
        value = fields[label].strip()
        if self.is_regression:
          value = _regression_label(input_file, line, value)
        elif self.multi_label:
          value = _multi_labels(input_file, line, value, self.label_delimiter, labels)
        elif labels is not None and value not in labels:
          raise fileio.InputError(f"{input_file}:{line}: unknown label {value!r}; expected one of "
                                  f"{', '.join(labels)}")
      elif self.multi_label:
        value = ()
      elif labels:
        value = labels[0]
      elif self.is_regression:
        value = 0.0
      examples.append(InputExample(
          guid=f"{set_type}-{i}", text_a=fields[text_a],
          text_b=fields[text_b] if text_b is not None else None, label=value))
    return examples


PROCESSORS = {
    "cola": ColaProcessor,
    "mnli": MnliProcessor,
    "mnli-mm": MnliMismatchedProcessor,
    "mrpc": MrpcProcessor,
    "qnli": QnliProcessor,
    "qqp": QqpProcessor,
    "rte": RteProcessor,
    "sst-2": Sst2Processor,
    "sts-b": StsbProcessor,
    "wnli": WnliProcessor,
    "xnli": XnliProcessor,
    "goemotions": GoEmotionsProcessor,
}


def _task_key(task_name):
  # "SST-2", "sst2" and "sst_2" all name the same task.
  return task_name.lower().replace("-", "").replace("_", "")


def get_processor(task_name, xnli_language="zh", delimited_options=None):
  """The processor for a task name (case, '-' and '_' ignored: SST-2 = sst2).

  `delimited_options` are DelimitedProcessor's keyword arguments for the tsv/csv tasks.
  """
  key = _task_key(task_name or "")
  if key in ("tsv", "csv"):
    return DelimitedProcessor(key, **(delimited_options or {}))
  for name, processor in PROCESSORS.items():
    if _task_key(name) == key:
      return processor(xnli_language) if processor is XnliProcessor else processor()
  raise fileio.InputError(f"--task_name={task_name} is not a known task; use one of "
                          f"{', '.join(PROCESSORS)}, tsv or csv")


def processor_from_flags():
  """The processor named by --task_name, configured by the XNLI and tsv/csv flags."""
  return get_processor(
      FLAGS.task_name, xnli_language=FLAGS.xnli_language,
      delimited_options=dict(text_a_column=FLAGS.text_a_column,
                             text_b_column=FLAGS.text_b_column,
                             label_column=FLAGS.label_column, labels=FLAGS.labels,
                             skip_header=FLAGS.skip_header, is_regression=FLAGS.regression,
                             multi_label=FLAGS.multi_label,
                             label_delimiter=FLAGS.label_delimiter))


def convert_single_example(ex_index, example, label_list, max_seq_length, tokenizer,
                           is_regression=False, multi_label=False):
  """The InputFeatures of one InputExample, truncated to one sequence (the original's): the one
  window of `convert_example_windows` without a stride; all zeros, marked not real, for
  padding."""
  (feature,) = convert_example_windows(ex_index, example, label_list, max_seq_length, tokenizer,
                                       is_regression, multi_label=multi_label)
  return feature


# Examples tokenized at once by the tokenizer's batch path (FullTokenizer.tokenize_batch: the
# reference tokens, several times faster, its speed from a per-word cache over many texts).
# Bounded so that a large training set streams through file writing in constant memory.
_TOKENIZE_CHUNK = 4096


def tokenized_examples(examples, tokenizer):
  """(index, example, (text_a tokens, text_b tokens)) of each example of an iterable, in order;
  tokens None for a PaddingInputExample."""
  examples, start = iter(examples), 0
  while chunk := list(itertools.islice(examples, _TOKENIZE_CHUNK)):
    real = [e for e in chunk if not isinstance(e, PaddingInputExample)]
    firsts = iter(tokenizer.tokenize_batch([e.text_a for e in real]))
    seconds = iter(tokenizer.tokenize_batch([e.text_b for e in real if e.text_b]))
    for offset, example in enumerate(chunk):
      tokens = None
      if not isinstance(example, PaddingInputExample):
        tokens = next(firsts), next(seconds) if example.text_b else []
      yield start + offset, example, tokens
    start += len(chunk)


def convert_example_windows(ex_index, example, label_list, max_seq_length, tokenizer,
                            is_regression=False, doc_stride=None, multi_label=False,
                            text_tokens=None):
  """The InputFeatures of one InputExample's windows, each with its label and `ex_index` as its
  example_index; one window of zeros, marked not real, for padding. The label id is the label's
  index in `label_list`, the number for regression, or with `multi_label` a 0/1 list as long as
  `label_list` (1 for each of the example's labels).

  Layout: "[CLS] a [SEP]" for one text, "[CLS] a [SEP] b [SEP]" for a pair, where segment id 0
  covers [CLS], a and the first [SEP] and segment id 1 covers b and the last [SEP]. The segment
  embeddings were pre-trained on exactly this arrangement, and the classifier reads the final
  hidden state at [CLS]. Behind the tokens come zeros up to `max_seq_length`, with mask 0 so
  attention ignores them. A text too long for one sequence is truncated (one window), or with
  `doc_stride` read whole in windows that many tokens apart (sliding_windows.sequence_windows:
  text_b of a pair, after the text_a that truncation keeps, else text_a). `ex_index` < 5 logs
  the example. `text_tokens`: the example's (text_a, text_b) tokens when tokenized already
  (tokenized_examples), else the tokenizer's reference path tokenizes them here.
  """
  if isinstance(example, PaddingInputExample):
    label_id = [0] * len(label_list) if multi_label else 0.0 if is_regression else 0
    return [InputFeatures(input_ids=[0] * max_seq_length, input_mask=[0] * max_seq_length,
                          segment_ids=[0] * max_seq_length, label_id=label_id,
                          is_real_example=False)]

  if text_tokens is not None:
    first, second = text_tokens
  else:
    first = tokenizer.tokenize(example.text_a)
    second = tokenizer.tokenize(example.text_b) if example.text_b else []
  first, second, spans = sliding_windows.sequence_windows(first, second, max_seq_length,
                                                          doc_stride)
  if is_regression:
    label_id = float(example.label)
  elif multi_label:
    unknown = [label for label in example.label if label not in label_list]
    if unknown:
      raise fileio.InputError(f"example {example.guid}: unknown label {unknown[0]!r}; expected "
                              f"labels among {', '.join(map(str, label_list))}")
    label_id = [int(label in example.label) for label in label_list]
  elif example.label in label_list:
    label_id = label_list.index(example.label)
  else:
    raise fileio.InputError(f"example {example.guid}: unknown label {example.label!r}; expected "
                            f"one of {', '.join(map(str, label_list))}")
  features = []
  for span in spans:
    tokens, segment_ids = sliding_windows.window_tokens(first, second, span)
    input_ids, input_mask, segment_ids = fine_tuning.padded_ids(tokenizer, tokens, segment_ids,
                                                                max_seq_length)
    if ex_index < 5:  # the original's example dumps: --verbosity=1 shows them
      logging.debug("example %s (window %d of %d), label %s (id %s)\n  tokens: %s\n  input_ids: "
                    "%s\n  input_mask: %s\n  segment_ids: %s", example.guid, len(features) + 1,
                    len(spans), example.label, label_id,
                    " ".join(map(tokenization.printable_text, tokens)), *(
                        " ".join(map(str, values)) for values in (input_ids, input_mask,
                                                                  segment_ids)))
    features.append(InputFeatures(input_ids=input_ids, input_mask=input_mask,
                                  segment_ids=segment_ids, label_id=label_id,
                                  is_real_example=True, example_index=ex_index))
  return features


def file_based_convert_examples_to_features(examples, label_list, max_seq_length, tokenizer,
                                            output_file, is_regression=False, multi_label=False):
  """Writes one tf.train.Example per InputExample (truncated to one sequence) to a TFRecord
  file; returns how many.

  Record fields (see `feature_spec`): input_ids, input_mask, segment_ids ([max_seq_length] int64),
  label_ids ([1] int64, float for regression, [labels] 0/1 int64 for multi-label) and
  is_real_example ([1] int64). The file appears under its name only once it is complete.
  """
  features = (feature for index, example, tokens in tokenized_examples(examples, tokenizer)
              for feature in convert_example_windows(index, example, label_list, max_seq_length,
                                                     tokenizer, is_regression,
                                                     multi_label=multi_label, text_tokens=tokens))
  return write_features(features, output_file, is_regression)


def write_features(features, output_file, is_regression=False):
  """Writes InputFeatures (an iterable) as records to a TFRecord file atomically; returns how
  many."""
  label_feature = tfrecord_io.float_feature if is_regression else tfrecord_io.int64_feature
  return tfrecord_io.write_examples(output_file, ({
      "input_ids": tfrecord_io.int64_feature(feature.input_ids),
      "input_mask": tfrecord_io.int64_feature(feature.input_mask),
      "segment_ids": tfrecord_io.int64_feature(feature.segment_ids),
      "label_ids": label_feature(feature.label_id if isinstance(feature.label_id, list)
                                 else [feature.label_id]),
      "is_real_example": tfrecord_io.int64_feature([int(feature.is_real_example)]),
  } for feature in features))


def feature_spec(seq_length, is_regression=False, num_multi_labels=None):
  """name -> tf.io feature of the records `file_based_convert_examples_to_features` writes;
  `num_multi_labels`: a multi-label task's label count (label_ids is then a 0/1 row)."""
  label_shape = [num_multi_labels] if num_multi_labels is not None else []
  return {
      "input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
      "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
      "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
      "label_ids": tf.io.FixedLenFeature(label_shape, tf.float32 if is_regression else tf.int64),
      "is_real_example": tf.io.FixedLenFeature([], tf.int64),
  }


def convert_examples_to_features(examples, label_list, max_seq_length, tokenizer,
                                 is_regression=False, doc_stride=None, multi_label=False):
  """The InputFeatures of all `examples` as an in-memory list: one per example, or with
  `doc_stride` one per window (`convert_example_windows`), an example's windows in a row."""
  return [feature for i, example, tokens in tokenized_examples(examples, tokenizer)
          for feature in convert_example_windows(i, example, label_list, max_seq_length,
                                                 tokenizer, is_regression, doc_stride,
                                                 multi_label, tokens)]


def mean_over_windows(values, example_index, num_examples):
  """Each example's mean of its windows' `values` (probabilities or scores, [windows, ...]):
  `example_index` gives each window's example; an example of one window keeps its values."""
  sums = np.zeros((num_examples,) + values.shape[1:], np.float64)
  np.add.at(sums, example_index, values)
  counts = np.bincount(example_index, minlength=num_examples)
  return (sums / counts.reshape((-1,) + (1,) * (values.ndim - 1))).astype(values.dtype)


def _padding(count, batch_size, max_seq_length, is_regression, label_list=(),
             multi_label=False):
  """The padding examples' features that fill `count` real ones up to a multiple of the batch
  size: batches of one size (TPU, XLA) without dropping the last real examples, which the
  metrics then weight out."""
  feature = convert_single_example(0, PaddingInputExample(), list(label_list), max_seq_length,
                                   None, is_regression, multi_label)
  return [feature] * (-count % batch_size)


# What main writes in --output_dir besides checkpoints and the TensorBoard folder train/.
_OUTPUTS = ("train.tf_record", "eval.tf_record", "predict.tf_record", "eval_results.txt",
            "test_results.tsv", "test_predictions.tsv", "task.json", "eval_per_label.tsv",
            "thresholds.json")


def _check_flags(processor):
  """Flag values absl's bounds cannot judge alone."""
  fileio.check_distinct(FLAGS.labels, "labels", "label")
  if FLAGS.multi_label and not isinstance(processor, DelimitedProcessor):
    raise fileio.InputError(
        f"--multi_label is for --task_name=tsv or csv; --task_name={FLAGS.task_name} is "
        + ("multi-label already" if processor.multi_label else "a single-label task"))
  for name in ("label_delimiter", "threshold", "tune_thresholds"):
    if FLAGS[name].present and not processor.multi_label:
      raise fileio.InputError(f"--{name} is for multi-label tasks (--multi_label, goemotions)")
  if FLAGS.tune_thresholds and not (FLAGS.do_eval or FLAGS.do_predict):
    raise fileio.InputError("--tune_thresholds picks thresholds with --do_eval (and --do_predict "
                            "uses them)")
  if processor.is_pair and FLAGS.max_seq_length < 5:
    raise fileio.InputError(f"--max_seq_length={FLAGS.max_seq_length} cannot hold a sentence pair "
                            f"of --task_name={FLAGS.task_name}: [CLS] a [SEP] b [SEP] needs 5")
  if FLAGS.doc_stride is not None:
    layout = "- 3 for [CLS] a [SEP] b [SEP]" if processor.is_pair else "- 2 for [CLS] text [SEP]"
    sliding_windows.check_stride(
        FLAGS.doc_stride, FLAGS.max_seq_length - (3 if processor.is_pair else 2),
        f"text tokens of a window (--max_seq_length={FLAGS.max_seq_length} {layout})")


def _task():
  return f"run_classifier --task_name={FLAGS.task_name.lower()}"


def _label_list(processor, has_checkpoint):
  """The class labels: --labels; else, when training, those of the training file; else those the
  training run saved in output_dir (task.json), or beside a fine-tuned --init_checkpoint, which
  must agree with the model there."""
  record = fine_tuning.task_record(FLAGS.output_dir, _task(), has_checkpoint)
  init_record = fine_tuning.init_task_record(FLAGS.init_checkpoint, _task(),
                                          not FLAGS.do_train and not has_checkpoint)
  if processor.is_regression:
    return []
  for saved_record, where in (
      (record if has_checkpoint else None, f"--output_dir={FLAGS.output_dir}"),
      (init_record, f"--init_checkpoint={FLAGS.init_checkpoint}")):
    if saved_record and bool(saved_record.get("multi_label")) != processor.multi_label:
      kind = "multi-label" if saved_record.get("multi_label") else "single-label"
      raise fileio.InputError(f"{where} holds a {kind} classifier; run with"
                              f"{'' if saved_record.get('multi_label') else 'out'} --multi_label")
  saved = (record if has_checkpoint and record else init_record or record or {}).get("labels")
  if (saved is not None and FLAGS.labels is None and not FLAGS.do_train
      and isinstance(processor, DelimitedProcessor)):
    processor.set_labels(saved)
  labels = processor.get_labels(FLAGS.data_dir)
  fine_tuning.check_labels_match(labels, init_record, True, FLAGS.init_checkpoint, "labels",
                              "init_checkpoint")
  return fine_tuning.check_labels_match(labels, record, has_checkpoint, FLAGS.output_dir, "labels")


def _classifier_pooling(has_checkpoint):
  """--classifier_pooling, or the pooling of the fine-tuned model that will be read (the
  checkpoint in --output_dir, else a fine-tuned --init_checkpoint's): its output layer was
  trained on it, so a contradicting flag is an InputError."""
  if has_checkpoint:
    record, where = fine_tuning.task_record(FLAGS.output_dir, _task(), True), "output_dir"
  else:
    record, where = fine_tuning.init_task_record(FLAGS.init_checkpoint, _task(),
                                                 False), "init_checkpoint"
  if not record:
    return FLAGS.classifier_pooling
  saved = fine_tuning.classifier_pooling(
      record, checkpoints.checkpoint_directory(FLAGS[where].value))
  if FLAGS["classifier_pooling"].present and FLAGS.classifier_pooling != saved:
    raise fileio.InputError(
        f"--{where}={FLAGS[where].value} holds a classifier trained with "
        f"--classifier_pooling={saved}, not {FLAGS.classifier_pooling}; leave the flag out or "
        f"choose another --{where}")
  return saved


def _records_key(processor, split, label_list, vocab_file, order):
  """What a split's feature records are made from: reused only when all of it is unchanged."""
  task = {name: FLAGS[name].value for name in ("task_name", "xnli_language", "text_a_column",
                                               "text_b_column", "label_column", "skip_header",
                                               "regression")}
  return {"script": "run_classifier", "split": split, "task": task,
          "input": fileio.file_signature(processor.split_file(FLAGS.data_dir, split)),
          "vocab": fileio.file_signature(vocab_file), "do_lower_case": FLAGS.do_lower_case,
          "max_seq_length": FLAGS.max_seq_length, "doc_stride": FLAGS.doc_stride,
          "labels": label_list, "order": order, "multi_label": processor.multi_label,
          "label_delimiter": FLAGS.label_delimiter if processor.multi_label else None}


def main(_):
  if FLAGS.litert_model and FLAGS.do_train:
    raise fileio.InputError("--do_train with --litert_model: a LiteRT model only predicts; "
                            "train from a checkpoint, then export it (export_model.py "
                            "--format=litert)")
  runner = script_flags.litert_model(("classifier",), "run_classifier.py")
  script_flags.run_fine_tuning(lambda vocab_file: _main(vocab_file, runner),
                               ("train", "eval", "predict"), data_dir=FLAGS.data_dir,
                               task_name=FLAGS.task_name)


def _check_litert(runner, processor, label_list):
  """A LiteRT classifier (--litert_model) must be one of this task: its kind of outputs and
  labels."""
  info, where = runner.info, f"--litert_model={FLAGS.litert_model}"
  for key, ours in (("regression", processor.is_regression),
                    ("multi_label", processor.multi_label)):
    if bool(info.get(key)) != ours:
      raise fileio.InputError(f"{where} is {'' if info.get(key) else 'not '}a "
                              f"{key.replace('_', '-')} classifier, --task_name={FLAGS.task_name} "
                              f"is {'' if ours else 'not '}one")
  if bool(info.get("text_pairs")) != processor.is_pair:
    texts = lambda pairs: "sentence pairs" if pairs else "single texts"
    raise fileio.InputError(f"{where} classifies {texts(info.get('text_pairs'))}, "
                            f"--task_name={FLAGS.task_name} has {texts(processor.is_pair)}")
  pooling = info.get("classifier_pooling", "pooler")
  if FLAGS["classifier_pooling"].present and FLAGS.classifier_pooling != pooling:
    raise fileio.InputError(f"{where} reads --classifier_pooling={pooling}, not "
                            f"{FLAGS.classifier_pooling}")
  if info.get("labels") and list(info["labels"]) != list(label_list):
    raise fileio.InputError(f"{where} predicts the labels {','.join(info['labels'])}, the task "
                            f"has {','.join(label_list)}")


def _main(vocab_file, runner=None):
  processor = processor_from_flags()
  _check_flags(processor)
  out = FLAGS.output_dir
  pairs = (f"--task_name={FLAGS.task_name} gives sentence pairs (segment ids 0 and 1)"
           if processor.is_pair else None)
  has_checkpoint, config, tokenizer = script_flags.check_files_and_load(
      _OUTPUTS, [("data_dir", processor.data_files(FLAGS.data_dir))], vocab_file, pairs)
  label_list = _label_list(processor, has_checkpoint)
  pooling = _classifier_pooling(has_checkpoint)
  is_regression = processor.is_regression
  multi_label = processor.multi_label
  spec = feature_spec(FLAGS.max_seq_length, is_regression,
                      len(label_list) if multi_label else None)

  strategy = script_flags.strategy()
  # The batch sizes of every phase asked for are checked before any feature writing or training
  # (the training batch with the steps, below).
  for mode in ("eval", "predict"):
    if FLAGS[f"do_{mode}"].value:
      training.per_replica_batch_size(FLAGS[f"{mode}_batch_size"].value, strategy,
                                      f"{mode}_batch_size")
  train_examples = processor.get_train_examples(FLAGS.data_dir) if FLAGS.do_train else None
  train_windows = None
  if train_examples is not None and FLAGS.doc_stride is not None:
    # Every window is a training record with its example's label, and an epoch is one pass over
    # them all: the steps count windows.
    train_windows = convert_examples_to_features(train_examples, label_list, FLAGS.max_seq_length,
                                                 tokenizer, is_regression, FLAGS.doc_stride,
                                                 multi_label)
  if runner:  # the LiteRT model predicts in the place of a trainer's model
    _check_litert(runner, processor, label_list)
    trainer = runner
  else:
    num_train_steps, num_warmup_steps, batch = fine_tuning.train_steps(
        train_examples if train_windows is None else train_windows, strategy,
        FLAGS.train_batch_size, FLAGS.gradient_accumulation_steps, FLAGS.num_train_epochs,
        FLAGS.warmup_proportion, processor.split_file(FLAGS.data_dir, "train"))
    model, optimizer, trainer, init_fn = script_flags.fine_tuning_trainer(
        strategy, lambda: modeling.BertClassifier(config, processor.num_labels(),
                                                  script_flags.compute_dtype(),
                                                  pooling=pooling),
        modeling.classifier_losses(is_regression, multi_label), num_train_steps,
        num_warmup_steps, has_checkpoint)

  def model_outputs(name, split, examples):
    """The probabilities (or scores; independent sigmoids for multi-label) of `examples` (of
    `split`) in input order, with
    --{name}_batch_size: the records go by length with dynamic padding (each batch then holds
    texts of about one length), then padding examples up to a multiple of the batch size. With
    --doc_stride the records are windows, and an example's outputs the mean of its windows'."""
    path = os.path.join(out, f"{name}.tf_record")
    features = convert_examples_to_features(examples, label_list, FLAGS.max_seq_length,
                                            tokenizer, is_regression, FLAGS.doc_stride,
                                            multi_label)
    by_length = script_flags.dynamic_padding(strategy)
    order = (input_pipeline.length_order([sum(f.input_mask) for f in features]) if by_length
             else np.arange(len(features)))
    write = lambda padded_to: write_features([features[i] for i in order] + _padding(
        len(features), padded_to, FLAGS.max_seq_length, is_regression, label_list,
        multi_label), path, is_regression)
    key = _records_key(processor, split, label_list, vocab_file, "length" if by_length else "input")
    outputs, real = [], []
    for batch in fine_tuning.predict(trainer, path, key, write, len(features), spec,
                                     FLAGS[f"{name}_batch_size"].value, f"{name}_batch_size",
                                     by_length):
      logits = batch["logits"]
      if multi_label:  # (in float64: 1 - p stays exact enough for the loss)
        outputs.append(1 / (1 + np.exp(-np.asarray(logits, np.float64))))
      else:
        outputs.append(logits[:, 0] if is_regression else tf.nn.softmax(logits).numpy())
      real.append(batch["is_real_example"].astype(bool))
    outputs = input_pipeline.unsort(np.concatenate(outputs)[np.concatenate(real)], order)
    return mean_over_windows(outputs, [f.example_index for f in features], len(examples))

  def dev_evaluation():
    """(the eval_* metrics and eval_loss of the model as it is now on dev, and for multi-label
    the per-label scores and the tuned thresholds or None)."""
    examples = processor.get_dev_examples(FLAGS.data_dir)
    outputs = model_outputs("eval", "dev", examples)
    details = None
    if multi_label:
      labels = np.array([[int(label in e.label) for label in label_list] for e in examples])
      summary, per_label = metrics.multi_label_metrics(labels, outputs, FLAGS.threshold)
      summary = {f"eval_{k}": v for k, v in summary.items()}
      tuned = None
      if FLAGS.tune_thresholds:
        tuned = metrics.tune_thresholds(labels, outputs, FLAGS.threshold)
        tuned_summary, per_label = metrics.multi_label_metrics(labels, outputs, tuned)
        summary.update({f"eval_tuned_{k}": v for k, v in tuned_summary.items()})
      loss = metrics.binary_cross_entropy(outputs, labels)
      details = per_label, tuned
    else:
      labels = np.array([float(e.label) if is_regression else label_list.index(e.label)
                         for e in examples])
      if is_regression:
        predictions, loss = outputs, float(np.mean((outputs - labels) ** 2))
      else:
        predictions = outputs.argmax(-1)
        loss = metrics.cross_entropy(outputs, labels)
      task_metrics = metrics.glue_metrics(FLAGS.task_name, labels, predictions)
      summary = {f"eval_{k}": float(v) for k, v in task_metrics.items()}
    summary.update(eval_loss=loss, eval_examples=len(examples))
    return summary, details

  if multi_label:
    names = metrics.MULTI_LABEL_METRICS + tuple(
        f"tuned_{n}" for n in metrics.MULTI_LABEL_METRICS if FLAGS.tune_thresholds)
  else:
    names = metrics.glue_metric_names(FLAGS.task_name, is_regression)
  evaluate = script_flags.eval_during_training(trainer, lambda: dev_evaluation()[0],
                                               names + ("loss",))
  if FLAGS.do_train:
    train_file = os.path.join(out, "train.tf_record")
    fileio.build_unless_current(
        train_file, _records_key(processor, "train", label_list, vocab_file, "input"),
        lambda: file_based_convert_examples_to_features(
            train_examples, label_list, FLAGS.max_seq_length, tokenizer, train_file,
            is_regression, multi_label) if train_windows is None else write_features(
                train_windows, train_file, is_regression))
    # Evaluating or predicting later without --labels reads the labels of this model here.
    fine_tuning.write_task_record(
        out, _task(), None if is_regression else label_list, text_pairs=processor.is_pair,
        regression=is_regression, multi_label=multi_label, classifier_pooling=pooling,
        **({"label_delimiter": FLAGS.label_delimiter} if multi_label else {}))
    fine_tuning.write_model_files(out, config, vocab_file)
    num_records = len(train_examples if train_windows is None else train_windows)
    logging.info("Training on %d examples (%d records), %d steps (%d warm-up), batch %d",
                 len(train_examples), num_records, num_train_steps, num_warmup_steps,
                 FLAGS.train_batch_size)
    script_flags.train_on_records(
        trainer, train_file, spec, batch,
        num_train_steps, init_fn, script_flags.dynamic_padding(strategy),
        fine_tuning.shuffle_buffer(num_records), evaluate)
  elif not runner:
    trainer.restore_or_initialize(init_fn)

  # The step of the weights evaluated and predicted with: the best checkpoint's, when one was
  # kept (--keep_best_checkpoint_metric), else the latest (a LiteRT model's: its checkpoint's).
  if runner:
    global_step = runner.info.get("global_step") or 0
  else:
    global_step = (script_flags.use_best_checkpoint(trainer) if FLAGS.do_eval or FLAGS.do_predict
                   else None) or int(optimizer.iterations.numpy())
  thresholds = np.full(len(label_list), FLAGS.threshold)
  if runner and multi_label and runner.info.get("thresholds") and not FLAGS["threshold"].present:
    thresholds = np.array(runner.info["thresholds"])
  if FLAGS.do_eval:
    summary, details = dev_evaluation()
    summary.update(loss=summary["eval_loss"], global_step=global_step)
    if trainer.is_chief:  # (under multi_worker_mirrored every worker has the results)
      training.write_eval_results(os.path.join(out, "eval_results.txt"), summary)
    if trainer.is_chief and multi_label:
      per_label, tuned = details
      with fileio.open_atomic(os.path.join(out, "eval_per_label.tsv")) as f:
        f.write("label\tprecision\trecall\tf1\tsupport\tpredicted\tthreshold\n")
        for label, scores in zip(label_list, per_label):
          f.write(f"{label}\t{scores['precision']:.4f}\t{scores['recall']:.4f}\t"
                  f"{scores['f1']:.4f}\t{scores['support']}\t{scores['predicted']}\t"
                  f"{scores['threshold']:.2f}\n")
      if tuned is not None:
        _write_thresholds(out, global_step, label_list, tuned)
    if multi_label and details[1] is not None:
      thresholds = details[1]
  elif FLAGS.do_predict and multi_label and FLAGS.tune_thresholds:
    thresholds = _read_thresholds(out, global_step, label_list)

  if FLAGS.do_predict:
    examples = processor.get_test_examples(FLAGS.data_dir)
    outputs = model_outputs("predict", "test", examples)
  if FLAGS.do_predict and trainer.is_chief:
    output_path = os.path.join(FLAGS.output_dir, "test_results.tsv")
    with fileio.open_atomic(output_path) as f:
      for row in outputs:
        values = [row] if is_regression else row
        f.write("\t".join(f"{v:.8g}" for v in values) + "\n")
    logging.info("Wrote %d predictions to %s", len(outputs), output_path)
    # Beside the original's bare probabilities (users' scripts read them as they are): each
    # example's id (its row, or the file's index column), the predicted label and, per label,
    # its probability, under a header.
    labelled_path = os.path.join(FLAGS.output_dir, "test_predictions.tsv")
    with fileio.open_atomic(labelled_path) as f:
      f.write("\t".join(["id", "prediction"] + ([] if is_regression else label_list)) + "\n")
      for example, row in zip(examples, outputs):
        example_id = example.guid.split("-", 1)[-1]
        if multi_label:  # the predicted labels joined as in the input ("" for none)
          chosen = [label for label, p, t in zip(label_list, row, thresholds) if p > t]
          f.write("\t".join([example_id, FLAGS.label_delimiter.join(chosen)]
                             + [f"{v:.8g}" for v in row]) + "\n")
        elif is_regression:
          f.write(f"{example_id}\t{row:.8g}\n")
        else:
          f.write("\t".join([example_id, label_list[int(np.argmax(row))]]
                             + [f"{v:.8g}" for v in row]) + "\n")
    logging.info("Wrote the labelled predictions to %s", labelled_path)


def _write_thresholds(out, global_step, label_list, thresholds):
  """thresholds.json for the checkpoint of `global_step`; also in the best/ model folder when
  they are its checkpoint's (export_model reads them there)."""
  best = fine_tuning.best_checkpoint(out)
  for directory in [out] + ([os.path.join(out, fine_tuning.BEST_DIRECTORY)]
                            if best and best[1] == global_step else []):
    fine_tuning.write_thresholds(directory, global_step, label_list, thresholds)


def _read_thresholds(out, global_step, label_list):
  """The tuned thresholds in `out`/thresholds.json, which must be those of this checkpoint."""
  path = os.path.join(out, "thresholds.json")
  found = fine_tuning.read_thresholds(out, label_list)
  if found is None:
    raise fileio.InputError(f"--tune_thresholds: {path} does not exist; add --do_eval to tune "
                            "the thresholds on dev")
  values, step = found
  if step != global_step:
    raise fileio.InputError(f"{path} was tuned at step {step}, the checkpoint is at step "
                            f"{global_step}; add --do_eval to tune them again")
  return np.array(values)


def cli():
  """The command line: `python run_classifier.py` and the `bert-run-classifier` command."""
  define_flags()
  commands.run_main(main)
