"""The tasks run_classifier.py reads: one processor per task turns its train, dev and test files
into `InputExample`s (raw text and label) for the script to convert into features.

- GLUE (CoLA, MNLI and MNLI-mm, MRPC, QNLI, QQP, RTE, SST-2, STS-B, WNLI): every GLUE file layout
  is read by its header's column names, so header/no-header and column-order differences between
  GLUE releases do not matter (GlueProcessor: a task is file names, column names and labels);
- XNLI in one language, GoEmotions (multi-label), and your own .tsv / .csv files
  (DelimitedProcessor: --task_name=tsv or csv with the column flags), single-label, regression or
  multi-label.

A row with the wrong number of columns, an unknown label or a label that is not a finite number
is an InputError naming its file and line. The task readers live apart from the script as HF's
`glue.py` does: a new task is a class here and a row of PROCESSORS, not a branch in the script.
"""

import dataclasses
import math
import os
import re

from absl import logging

from bert_tf2 import fileio
from bert_tf2 import tokenization


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
  comma-separated, comment id), and emotions.txt (or labels.txt) with the label names, one per
  line, in id order.
  Examples carry label names and the comment id as their guid ("dev-eecwqtt").
  """

  is_pair = False
  multi_label = True

  def __init__(self):
    self._labels = None

  def split_file(self, data_dir, split):
    return os.path.join(data_dir, f"{split}.tsv")

  def data_files(self, data_dir):
    return super().data_files(data_dir) + [self.labels_file(data_dir)]

  @staticmethod
  def labels_file(data_dir):
    """labels.txt, else emotions.txt: the name the release's data folder gives the file."""
    path = os.path.join(data_dir, "labels.txt")
    release = os.path.join(data_dir, "emotions.txt")
    return release if not fileio.exists(path) and fileio.exists(release) else path

  def get_train_examples(self, data_dir):
    return self._create_examples(data_dir, "train")

  def get_dev_examples(self, data_dir):
    return self._create_examples(data_dir, "dev")

  def get_test_examples(self, data_dir):
    return self._create_examples(data_dir, "test")

  def get_labels(self, data_dir=None):
    if self._labels is None:
      if data_dir is None:
        raise fileio.InputError("goemotions: give --data_dir (its labels.txt or emotions.txt names the labels)")
      path = self.labels_file(data_dir)
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
      # ASCII digits only: str.isdigit also takes '²', which int() refuses.
      if not all(re.fullmatch("[0-9]+", i) and int(i) < len(labels) for i in ids):
        raise fileio.InputError(f"{input_file}:{line}: label ids {fields[1]!r} are not numbers "
                                f"below {len(labels)} (the labels of "
                                f"{os.path.basename(self.labels_file(data_dir))})")
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
      if not fileio.exists(train_file):
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
