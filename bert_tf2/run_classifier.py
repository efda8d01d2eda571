"""BERT fine-tuning for sentence and sentence-pair classification (GLUE, XNLI, GoEmotions, your
own TSV/CSV): single-label, regression (STS-B, --regression) or multi-label (--multi_label).

The script reads top to bottom as the original's does: its flags; the features of an example
([CLS] a [SEP] b [SEP], segment ids, mask, label id, exactly as the original BERT made them),
written to a TFRecord file and read back as a tf.data pipeline; what the three kinds of classifier
differ in (KINDS, one row each: outputs, dev metrics, prediction rows); then `main` in phases:
settings and the task, the model, training, evaluation, predictions. The task readers live in
classifier_tasks.py, the fine-tuning set-up all four fine-tuning scripts share in fine_tuning.py,
and the training loop in training.py.

A text longer than --max_seq_length is truncated, as in the original; with --doc_stride it is read
whole in overlapping windows (text_b of a pair, else text_a; see sliding_windows.py): training
takes every window as a record with its example's label, and evaluation and prediction give each
example the mean of its windows' probabilities (scores, for regression), so eval_results.txt and
test_results.tsv still hold one example per row, in input order.

A task of your own needs no code: `--task_name=tsv` (or `csv`) with `--text_a_column`,
`--text_b_column`, `--label_column`.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import dataclasses
import itertools
import os

from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import classifier_tasks
from bert_tf2 import dev_evaluation
from bert_tf2 import fine_tuning
from bert_tf2 import input_pipeline
from bert_tf2 import litert
from bert_tf2 import metrics
from bert_tf2 import modeling
from bert_tf2 import run_dir
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


# The original's names for the task readers, for code written against its run_classifier.py.
InputExample = classifier_tasks.InputExample
DataProcessor = classifier_tasks.DataProcessor
ColaProcessor = classifier_tasks.ColaProcessor
MnliProcessor = classifier_tasks.MnliProcessor
MrpcProcessor = classifier_tasks.MrpcProcessor
XnliProcessor = classifier_tasks.XnliProcessor


@dataclasses.dataclass(frozen=True)
class Settings(fine_tuning.Settings):
  """run_classifier's knobs: the fine-tuning ones and the task's, one field per flag (built from
  the flags in one line by script_flags.settings)."""

  task_name: str | None = None
  data_dir: str | None = None
  xnli_language: str = "zh"
  # Your own task (--task_name=tsv or csv).
  text_a_column: str | None = None
  text_b_column: str | None = None
  label_column: str | None = None
  labels: list | None = None
  skip_header: bool = True
  regression: bool = False
  multi_label: bool = False
  label_delimiter: str = ","
  # Multi-label decisions.
  threshold: float = 0.5
  tune_thresholds: bool = False
  # The model.
  classifier_pooling: str = "pooler"
  doc_stride: int | None = None


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


# --- What the three kinds of classifier differ in ------------------------------------------------


def _softmax(logits):
  return tf.nn.softmax(logits).numpy()


def _score(logits):
  return logits[:, 0]


def _sigmoid(logits):
  # Independent probabilities, in float64: 1 - p stays exact enough for the loss.
  return 1 / (1 + np.exp(-np.asarray(logits, np.float64)))


def _single_label_metrics(settings, examples, label_list, outputs):
  labels = np.array([label_list.index(e.label) for e in examples])
  scores = metrics.glue_metrics(settings.task_name, labels, outputs.argmax(-1))
  floor = metrics.at_the_floor(labels, outputs.argmax(-1))
  if floor:
    logging.warning("%s", floor)
  return ({f"eval_{k}": float(v) for k, v in scores.items()},
          metrics.cross_entropy(outputs, labels), None)


def _regression_metrics(settings, examples, label_list, outputs):
  del label_list
  labels = np.array([float(e.label) for e in examples])
  scores = metrics.glue_metrics(settings.task_name, labels, outputs)
  return ({f"eval_{k}": float(v) for k, v in scores.items()},
          float(np.mean((outputs - labels) ** 2)), None)


def _multi_label_metrics(settings, examples, label_list, outputs):
  """The metrics at --threshold and, with --tune_thresholds, at each label's threshold tuned on
  these examples (eval_tuned_*); the details are (per-label scores, tuned thresholds or None)."""
  labels = np.array([[int(label in e.label) for label in label_list] for e in examples])
  summary, per_label = metrics.multi_label_metrics(labels, outputs, settings.threshold)
  summary = {f"eval_{k}": v for k, v in summary.items()}
  tuned = None
  if settings.tune_thresholds:
    tuned = metrics.tune_thresholds(labels, outputs, settings.threshold)
    if (tuned == settings.threshold).all():
      logging.warning("--tune_thresholds: no label's threshold beats --threshold=%s on dev (nor "
                      "predicting it always): every label keeps %s", settings.threshold,
                      settings.threshold)
    tuned_summary, per_label = metrics.multi_label_metrics(labels, outputs, tuned)
    summary.update({f"eval_tuned_{k}": v for k, v in tuned_summary.items()})
  floor = metrics.at_the_floor(labels, outputs > (settings.threshold if tuned is None else tuned))
  if floor:
    logging.warning("%s", floor)
  return summary, metrics.binary_cross_entropy(outputs, labels), (per_label, tuned)


def _class_row(row, label_list, thresholds, delimiter):
  del thresholds, delimiter
  return [label_list[int(np.argmax(row))], *(f"{v:.8g}" for v in row)]


def _score_row(row, label_list, thresholds, delimiter):
  del label_list, thresholds, delimiter
  return [f"{row:.8g}"]


def _labels_row(row, label_list, thresholds, delimiter):
  # The predicted labels joined as in the input ("" for none), then each label's probability.
  chosen = [label for label, p, t in zip(label_list, row, thresholds) if p > t]
  return [delimiter.join(chosen), *(f"{v:.8g}" for v in row)]


@dataclasses.dataclass(frozen=True)
class Kind:
  """What a kind of classifier does with its logits: `outputs(logits)` the per-example outputs
  (probabilities, or a score); `metrics(settings, examples, label_list, outputs)` (dev eval_*
  metrics, dev loss, details); `metric_names(settings)` those it reports (without eval_);
  `prediction(row, label_list, thresholds, label_delimiter)` test_predictions.tsv's fields after
  the id."""

  outputs: object
  metrics: object
  metric_names: object
  prediction: object


KINDS = {
    "single_label": Kind(_softmax, _single_label_metrics,
                         lambda s: metrics.glue_metric_names(s.task_name, False), _class_row),
    "regression": Kind(_score, _regression_metrics,
                       lambda s: metrics.glue_metric_names(s.task_name, True), _score_row),
    "multi_label": Kind(_sigmoid, _multi_label_metrics,
                        lambda s: metrics.MULTI_LABEL_METRICS + tuple(
                            f"tuned_{n}" for n in metrics.MULTI_LABEL_METRICS
                            if s.tune_thresholds),
                        _labels_row),
}


def kind_of(processor):
  """The KINDS key of a task."""
  if processor.multi_label:
    return "multi_label"
  return "regression" if processor.is_regression else "single_label"


# --- main, in phases ------------------------------------------------------------------------------

MODES = ("train", "eval", "predict")
# What main writes in --output_dir besides checkpoints and the TensorBoard folder train/.
_OUTPUTS = ("train.tf_record", "eval.tf_record", "predict.tf_record", "eval_results.txt",
            "test_results.tsv", "test_predictions.tsv", "task.json", "eval_per_label.tsv",
            "thresholds.json")


def main(_):
  settings = script_flags.settings(Settings)
  runner, settings = _litert_runner(settings)
  with fine_tuning.run(settings, MODES, data_dir=settings.data_dir,
                       task_name=settings.task_name) as s:
    processor = processor_of(s)
    _check_flags(s, processor)
    pairs = (f"--task_name={s.task_name} gives sentence pairs (segment ids 0 and 1)"
             if processor.is_pair else None)
    has_checkpoint, config, tokenizer = fine_tuning.check_files_and_load(
        s, _OUTPUTS, [("data_dir", processor.data_files(s.data_dir))], pairs)
    label_list = _label_list(s, processor, has_checkpoint)
    _check_label_names(s, processor, label_list)
    if runner:
      _check_litert(s, runner, processor, label_list)
      training.lock_output_dir(s.output_dir)  # (a Trainer would take it)
    pooling = _classifier_pooling(s, has_checkpoint)

    strategy = script_flags.strategy()
    # The batch sizes of every phase asked for are checked before any feature writing or
    # training (the training batch with the steps, below).
    for mode in ("eval", "predict"):
      if getattr(s, f"do_{mode}"):
        training.per_replica_batch_size(getattr(s, f"{mode}_batch_size"), strategy,
                                        f"{mode}_batch_size")
    task = Classification(s, processor, label_list, tokenizer)
    train_examples = processor.get_train_examples(s.data_dir) if s.do_train else None
    train_records = task.training_records(train_examples)
    if runner:  # the LiteRT model predicts in the place of a trainer's model
      task.trainer, optimizer = runner, None
    else:
      steps, warmup_steps, batch = fine_tuning.train_steps(
          s, train_records, strategy, processor.split_file(s.data_dir, "train"))
      _, optimizer, task.trainer, init_fn = fine_tuning.build_trainer(
          s, strategy, lambda: modeling.BertClassifier(config, processor.num_labels(),
                                                       script_flags.compute_dtype(),
                                                       pooling=pooling),
          modeling.classifier_losses(processor.is_regression, processor.multi_label), steps,
          warmup_steps, has_checkpoint)

    evaluate = fine_tuning.eval_during_training(
        s, task.trainer, lambda: task.evaluate()[0], task.kind.metric_names(s) + ("loss",),
        read_dev=lambda: processor.get_dev_examples(s.data_dir))
    if s.do_train:
      train_file = os.path.join(s.output_dir, "train.tf_record")
      fileio.build_unless_current(train_file, task.records_key("train", "input"),
                                  lambda: task.write_training_records(train_examples,
                                                                      train_records, train_file))
      # Evaluating or predicting later without --labels reads the labels of this model here.
      _write_task_record(s, processor, label_list, pooling)
      fine_tuning.write_model_files(s.output_dir, config, s.vocab_file)
      logging.info("Training on %d examples (%d records), %d steps (%d warm-up), batch %d",
                   len(train_examples), len(train_records), steps, warmup_steps,
                   s.train_batch_size)
      fine_tuning.train_on_records(
          s, task.trainer, train_file, task.spec, batch, steps, init_fn,
          fine_tuning.pad_to_longest(s, strategy), fine_tuning.shuffle_buffer(len(train_records)),
          evaluate)
    elif not runner:
      task.trainer.restore_or_initialize(init_fn)

    # The step of the weights evaluated and predicted with: the best checkpoint's, when one was
    # kept (--keep_best_checkpoint_metric), else the latest (a LiteRT model's: its checkpoint's).
    global_step = ((runner.info.get("global_step") or 0) if runner
                   else fine_tuning.evaluated_step(s, task.trainer, optimizer))
    thresholds = _thresholds(s, runner, processor, label_list)
    if s.do_eval:
      summary, details = task.evaluate()
      summary.update(loss=summary["eval_loss"], global_step=global_step)
      if task.trainer.is_chief:  # (under multi_worker_mirrored every worker has the results)
        _write_eval_results(s, label_list, summary, details, global_step)
      if details and details[1] is not None:  # the thresholds tuned on dev
        thresholds = details[1]
    elif s.do_predict and processor.multi_label and s.tune_thresholds:
      thresholds = _read_thresholds(s, has_checkpoint, global_step, label_list)

    if s.do_predict:
      examples = processor.get_test_examples(s.data_dir)
      outputs = task.outputs("predict", "test", examples)
      if task.trainer.is_chief:
        _write_predictions(s, task, examples, outputs, thresholds)


def processor_of(settings):
  """The processor named by --task_name, configured by the XNLI and tsv/csv flags."""
  s = settings
  return classifier_tasks.get_processor(
      s.task_name, xnli_language=s.xnli_language,
      delimited_options=dict(text_a_column=s.text_a_column, text_b_column=s.text_b_column,
                             label_column=s.label_column, labels=s.labels,
                             skip_header=s.skip_header, is_regression=s.regression,
                             multi_label=s.multi_label, label_delimiter=s.label_delimiter))


@dataclasses.dataclass
class Classification:
  """A run's task with its model: turns examples into records and the model's outputs back into
  per-example outputs (`outputs`) and dev metrics (`evaluate`). `trainer` is a training.Trainer,
  or a LiteRT model (--litert_model), which predicts with the same contract."""

  settings: Settings
  processor: classifier_tasks.DataProcessor
  label_list: list
  tokenizer: tokenization.FullTokenizer
  trainer: object = None

  @property
  def kind(self):
    return KINDS[kind_of(self.processor)]

  @property
  def spec(self):
    """The records' features (feature_spec)."""
    return feature_spec(self.settings.max_seq_length, self.processor.is_regression,
                        len(self.label_list) if self.processor.multi_label else None)

  def features(self, examples):
    """The InputFeatures of `examples`: one per example, or a window each with --doc_stride."""
    return convert_examples_to_features(
        examples, self.label_list, self.settings.max_seq_length, self.tokenizer,
        self.processor.is_regression, self.settings.doc_stride, self.processor.multi_label)

  def training_records(self, train_examples):
    """What training steps count: the examples, or with --doc_stride every window (a training
    record with its example's label; an epoch is one pass over them all). None without
    training."""
    if train_examples is None or self.settings.doc_stride is None:
      return train_examples
    return self.features(train_examples)

  def write_training_records(self, train_examples, train_records, train_file):
    """Writes the training records: streamed from the examples, or the windows made already."""
    s, is_regression = self.settings, self.processor.is_regression
    if train_records is train_examples:
      return file_based_convert_examples_to_features(
          train_examples, self.label_list, s.max_seq_length, self.tokenizer, train_file,
          is_regression, self.processor.multi_label)
    return write_features(train_records, train_file, is_regression)

  def records_key(self, split, order):
    """What a split's feature records are made from: reused only when all of it is unchanged."""
    s = self.settings
    task = {name: getattr(s, name) for name in ("task_name", "xnli_language", "text_a_column",
                                                "text_b_column", "label_column", "skip_header",
                                                "regression")}
    return {"script": "run_classifier", "split": split, "task": task,
            "input": fileio.file_signature(self.processor.split_file(s.data_dir, split)),
            "vocab": fileio.file_signature(s.vocab_file), "do_lower_case": s.do_lower_case,
            "max_seq_length": s.max_seq_length, "doc_stride": s.doc_stride,
            "labels": self.label_list, "order": order,
            "multi_label": self.processor.multi_label,
            "label_delimiter": s.label_delimiter if self.processor.multi_label else None}

  def outputs(self, name, split, examples):
    """The probabilities (or scores; independent sigmoids for multi-label) of `examples` (of
    `split`) in input order, with --{name}_batch_size. With dynamic padding the records go by
    length (each batch then holds texts of about one length), then padding examples up to a
    multiple of the batch size. With --doc_stride the records are windows, and an example's
    outputs the mean of its windows'."""
    s, trainer = self.settings, self.trainer
    path = os.path.join(s.output_dir, f"{name}.tf_record")
    features = self.features(examples)
    by_length = fine_tuning.pad_to_longest(s, trainer.strategy)
    order = (input_pipeline.length_order([sum(f.input_mask) for f in features]) if by_length
             else np.arange(len(features)))
    write = lambda padded_to: write_features([features[i] for i in order] + _padding(
        len(features), padded_to, s.max_seq_length, self.processor.is_regression,
        self.label_list, self.processor.multi_label), path, self.processor.is_regression)
    outputs, real = [], []
    for batch in fine_tuning.predict(trainer, path,
                                     self.records_key(split, "length" if by_length else "input"),
                                     write, len(features), self.spec,
                                     getattr(s, f"{name}_batch_size"), f"{name}_batch_size",
                                     by_length):
      outputs.append(self.kind.outputs(batch["logits"]))
      real.append(batch["is_real_example"].astype(bool))
    outputs = input_pipeline.unsort(np.concatenate(outputs)[np.concatenate(real)], order)
    return mean_over_windows(outputs, [f.example_index for f in features], len(examples))

  def evaluate(self):
    """(the eval_* metrics and eval_loss of the model as it is now on dev, the kind's details:
    for multi-label the per-label scores and the tuned thresholds or None)."""
    examples = self.processor.get_dev_examples(self.settings.data_dir)
    outputs = self.outputs("eval", "dev", examples)
    summary, loss, details = self.kind.metrics(self.settings, examples, self.label_list, outputs)
    summary.update(eval_loss=loss, eval_examples=len(examples))
    return summary, details


def _litert_runner(settings):
  """(the LiteRT classifier of --litert_model, the settings with its vocab, config and casing),
  or (None, settings) without the flag."""
  s = settings
  if not s.litert_model:
    return None, s
  if s.do_train:
    raise fileio.InputError("--do_train with --litert_model: a LiteRT model only predicts; "
                            "train from a checkpoint, then export it (export_model.py "
                            "--format=litert)")
  runner = litert.open_for_script(
      s.litert_model, ("classifier",), "run_classifier.py",
      {name: getattr(s, name) for name in ("init_checkpoint", "bert_config_file", "vocab_file",
                                           "hub_module_handle")},
      s.do_lower_case if "do_lower_case" in s.given else None)
  return runner, dataclasses.replace(s, vocab_file=runner.vocab_file,
                                     bert_config_file=runner.config_file,
                                     do_lower_case=runner.do_lower_case)


def _check_litert(settings, runner, processor, label_list):
  """A LiteRT classifier (--litert_model) must be one of this task: its kind of outputs and
  labels."""
  s, info, where = settings, runner.info, f"--litert_model={settings.litert_model}"
  for key, ours in (("regression", processor.is_regression),
                    ("multi_label", processor.multi_label)):
    if bool(info.get(key)) != ours:
      raise fileio.InputError(f"{where} is {'' if info.get(key) else 'not '}a "
                              f"{key.replace('_', '-')} classifier, --task_name={s.task_name} "
                              f"is {'' if ours else 'not '}one")
  if bool(info.get("text_pairs")) != processor.is_pair:
    texts = lambda pairs: "sentence pairs" if pairs else "single texts"
    raise fileio.InputError(f"{where} classifies {texts(info.get('text_pairs'))}, "
                            f"--task_name={s.task_name} has {texts(processor.is_pair)}")
  pooling = info.get("classifier_pooling", "pooler")
  if "classifier_pooling" in s.given and s.classifier_pooling != pooling:
    raise fileio.InputError(f"{where} reads --classifier_pooling={pooling}, not "
                            f"{s.classifier_pooling}")
  if info.get("labels") and list(info["labels"]) != list(label_list):
    raise fileio.InputError(f"{where} predicts the labels {','.join(info['labels'])}, the task "
                            f"has {','.join(label_list)}")
  # What the model itself computes, whatever its description says (a description edited, or
  # copied beside another model).
  widths, want = runner.output_widths(), 1 if processor.is_regression else len(label_list)
  if widths.get("logits") != want:
    found = (f"logits for {widths['logits']} labels" if "logits" in widths
             else f"only {', '.join(sorted(widths))}")
    raise fileio.InputError(f"{where}: its {litert.MODEL_FILE} computes {found}, not the "
                            f"{want} {'output' if want == 1 else 'labels'} of its description "
                            f"and --task_name={s.task_name}; export the classifier again")
  if processor.multi_label and info.get("thresholds") is not None:
    fine_tuning.check_thresholds(info["thresholds"], label_list,
                                 os.path.join(s.litert_model, litert.INFO_FILE))


# The flags that say how to read a task of your own files (DelimitedProcessor); the other tasks'
# processors know their files' columns and labels.
_DELIMITED_ONLY = ("labels", "text_a_column", "text_b_column", "label_column", "skip_header",
                   "regression")


def _check_label_names(settings, processor, label_list):
  """A multi-label task's labels are written joined by --label_delimiter (test_predictions.tsv,
  the exported model's `label` output): a label holding the delimiter could not be told from
  two."""
  if not processor.multi_label:
    return
  delimiter = settings.label_delimiter
  for label in label_list:
    if delimiter in label or "\t" in label or "\n" in label:
      held = repr(delimiter) if delimiter in label else "a tab or a line break"
      raise fileio.InputError(
          f"the label {label!r} (of {_label_source(settings, processor)}) holds {held}: joined "
          f"with the label delimiter {delimiter!r} it would read as other labels; "
          + ("choose another --label_delimiter" if delimiter in label else "rename the label"))


def _label_source(settings, processor):
  if settings.labels is not None:
    return "--labels"
  if isinstance(processor, classifier_tasks.GoEmotionsProcessor):
    return classifier_tasks.GoEmotionsProcessor.labels_file(settings.data_dir or "")
  return "the task"


def _check_flags(settings, processor):
  """Flag values absl's bounds cannot judge alone."""
  s = settings
  fileio.check_distinct(s.labels, "labels", "label")
  if s.multi_label and not isinstance(processor, classifier_tasks.DelimitedProcessor):
    raise fileio.InputError(
        f"--multi_label is for --task_name=tsv or csv; --task_name={s.task_name} is "
        + ("multi-label already" if processor.multi_label else "a single-label task"))
  if not isinstance(processor, classifier_tasks.DelimitedProcessor):
    for name in _DELIMITED_ONLY:
      if name in s.given:
        raise fileio.InputError(
            f"--{name} is for --task_name=tsv or csv (your own files); --task_name="
            f"{s.task_name} reads its own columns and labels, which the flag would not change: "
            "leave it out")
  for name in ("label_delimiter", "threshold", "tune_thresholds"):
    if name in s.given and not processor.multi_label:
      raise fileio.InputError(f"--{name} is for multi-label tasks (--multi_label, goemotions)")
  if "threshold" in s.given and not 0 < s.threshold < 1:
    raise fileio.InputError(
        f"--threshold={s.threshold:g} would predict {'every' if s.threshold <= 0 else 'no'} label "
        "for every example (a label is predicted when its probability is above it); give a value "
        "between 0 and 1")
  if s.tune_thresholds and not (s.do_eval or s.do_predict):
    raise fileio.InputError("--tune_thresholds picks thresholds with --do_eval (and --do_predict "
                            "uses them)")
  if processor.is_pair and s.max_seq_length < 5:
    raise fileio.InputError(f"--max_seq_length={s.max_seq_length} cannot hold a sentence pair "
                            f"of --task_name={s.task_name}: [CLS] a [SEP] b [SEP] needs 5")
  if s.doc_stride is not None:
    layout = "- 3 for [CLS] a [SEP] b [SEP]" if processor.is_pair else "- 2 for [CLS] text [SEP]"
    sliding_windows.check_stride(
        s.doc_stride, s.max_seq_length - (3 if processor.is_pair else 2),
        f"text tokens of a window (--max_seq_length={s.max_seq_length} {layout})")


def _task(settings):
  return f"run_classifier --task_name={settings.task_name.lower()}"


def _label_list(settings, processor, has_checkpoint):
  """The class labels: --labels; else, when training, those of the training file; else those the
  training run saved in output_dir (task.json), or beside a fine-tuned --init_checkpoint, which
  must agree with the model there."""
  s = settings
  record = fine_tuning.task_record(s.output_dir, _task(s), has_checkpoint)
  init_record = fine_tuning.init_task_record(s.init_checkpoint, _task(s),
                                             not s.do_train and not has_checkpoint)
  if processor.is_regression:
    return []
  for saved_record, where in (
      (record if has_checkpoint else None, f"--output_dir={s.output_dir}"),
      (init_record, f"--init_checkpoint={s.init_checkpoint}")):
    if saved_record and bool(saved_record.get("multi_label")) != processor.multi_label:
      kind = "multi-label" if saved_record.get("multi_label") else "single-label"
      raise fileio.InputError(f"{where} holds a {kind} classifier; run with"
                              f"{'' if saved_record.get('multi_label') else 'out'} --multi_label")
  saved = (record if has_checkpoint and record else init_record or record or {}).get("labels")
  if (saved is not None and s.labels is None and not s.do_train
      and isinstance(processor, classifier_tasks.DelimitedProcessor)):
    processor.set_labels(saved)
  labels = processor.get_labels(s.data_dir)
  fine_tuning.check_labels_match(labels, init_record, True, s.init_checkpoint, "labels",
                                 "init_checkpoint")
  return fine_tuning.check_labels_match(labels, record, has_checkpoint, s.output_dir, "labels")


def _classifier_pooling(settings, has_checkpoint):
  """--classifier_pooling, or the pooling of the fine-tuned model that will be read (the
  checkpoint in --output_dir, else a fine-tuned --init_checkpoint's): its output layer was
  trained on it, so a contradicting flag is an InputError."""
  s = settings
  if has_checkpoint:
    record, where = fine_tuning.task_record(s.output_dir, _task(s), True), "output_dir"
  else:
    record, where = fine_tuning.init_task_record(s.init_checkpoint, _task(s),
                                                 False), "init_checkpoint"
  if not record:
    # A sentence-transformers folder (all-MiniLM-L6-v2, the README's model) was trained on its
    # own pooling, never on the [CLS] pooler: read what it was trained on unless told otherwise
    # (with the pooler MiniLM learnt nothing on MRPC: always "paraphrase", issue #73).
    trained_on = checkpoints.sentence_transformers_pooling(s.init_checkpoint)
    if trained_on and "classifier_pooling" not in s.given and s.classifier_pooling == "pooler":
      logging.info("--init_checkpoint=%s is a sentence-transformers model, trained on the %s of "
                   "its token vectors and not on the [CLS] pooler: the classifier reads that "
                   "(--classifier_pooling=%s; --classifier_pooling=pooler to read the pooler)",
                   s.init_checkpoint, trained_on, trained_on)
      return trained_on
    return s.classifier_pooling
  directory = getattr(s, where)
  saved = fine_tuning.classifier_pooling(record, checkpoints.checkpoint_directory(directory))
  if "classifier_pooling" in s.given and s.classifier_pooling != saved:
    raise fileio.InputError(
        f"--{where}={directory} holds a classifier trained with "
        f"--classifier_pooling={saved}, not {s.classifier_pooling}; leave the flag out or "
        f"choose another --{where}")
  return saved


def _write_task_record(settings, processor, label_list, pooling):
  """task.json: what export_model.py and later runs without --labels read of this model."""
  multi_label = processor.multi_label
  fine_tuning.write_task_record(
      settings.output_dir, _task(settings), None if processor.is_regression else label_list,
      text_pairs=processor.is_pair, regression=processor.is_regression, multi_label=multi_label,
      classifier_pooling=pooling,
      **({"label_delimiter": settings.label_delimiter} if multi_label else {}))


def _thresholds(settings, runner, processor, label_list):
  """Each label's decision threshold before any tuning: --threshold, or a LiteRT multi-label
  classifier's own (exported with the thresholds tuned for its checkpoint) unless the flag is
  given."""
  if (runner and processor.multi_label and runner.info.get("thresholds")
      and "threshold" not in settings.given):
    return np.array(runner.info["thresholds"], np.float64)
  return np.full(len(label_list), settings.threshold)


# --- The result files ----------------------------------------------------------------------------


def _write_eval_results(settings, label_list, summary, details, global_step):
  """eval_results.txt; for multi-label also eval_per_label.tsv and, tuned, thresholds.json."""
  out = settings.output_dir
  training.write_eval_results(run_dir.eval_results_file(out), summary)
  if details is None:
    return
  per_label, tuned = details
  with fileio.open_atomic(os.path.join(out, "eval_per_label.tsv")) as f:
    f.write("label\tprecision\trecall\tf1\tsupport\tpredicted\tthreshold\n")
    for label, scores in zip(label_list, per_label):
      f.write(f"{label}\t{scores['precision']:.4f}\t{scores['recall']:.4f}\t"
              f"{scores['f1']:.4f}\t{scores['support']}\t{scores['predicted']}\t"
              f"{scores['threshold']:.2f}\n")
  if tuned is not None:
    _write_thresholds(out, global_step, label_list, tuned)


def _write_predictions(settings, task, examples, outputs, thresholds):
  """test_results.tsv, the original's bare probabilities (users' scripts read them as they are),
  and beside it test_predictions.tsv: each example's id (its row, or the file's index column),
  the predicted label(s) and, per label, its probability, under a header."""
  out, is_regression = settings.output_dir, task.processor.is_regression
  output_path = os.path.join(out, "test_results.tsv")
  with fileio.open_atomic(output_path) as f:
    for row in outputs:
      f.write("\t".join(f"{v:.8g}" for v in ([row] if is_regression else row)) + "\n")
  logging.info("Wrote %d predictions to %s", len(outputs), output_path)
  labelled_path = os.path.join(out, "test_predictions.tsv")
  with fileio.open_atomic(labelled_path) as f:
    f.write("\t".join(["id", "prediction"] + ([] if is_regression else task.label_list)) + "\n")
    for example, row in zip(examples, outputs):
      fields = task.kind.prediction(row, task.label_list, thresholds, settings.label_delimiter)
      f.write("\t".join([example.guid.split("-", 1)[-1], *fields]) + "\n")
  logging.info("Wrote the labelled predictions to %s", labelled_path)


def _write_thresholds(out, global_step, label_list, thresholds):
  """thresholds.json for the checkpoint of `global_step`; also in the best/ model folder when
  they are its checkpoint's (export_model reads them there)."""
  best = dev_evaluation.best_checkpoint(out)
  for directory in [out] + ([run_dir.best_directory(out)]
                            if best and best[1] == global_step else []):
    fine_tuning.write_thresholds(directory, global_step, label_list, thresholds)


def _read_thresholds(settings, has_checkpoint, global_step, label_list):
  """The tuned thresholds of the model that predicts: thresholds.json beside its checkpoints (in
  --output_dir, else beside a fine-tuned --init_checkpoint), which must be those of its
  checkpoint (the same step)."""
  directory = settings.output_dir
  if not has_checkpoint and settings.init_checkpoint:
    directory = checkpoints.checkpoint_directory(settings.init_checkpoint)
    global_step = checkpoints.global_step(settings.init_checkpoint)
  path = run_dir.thresholds_file(directory)
  found = fine_tuning.read_thresholds(directory, label_list)
  if found is None:
    raise fileio.InputError(f"--tune_thresholds: {path} does not exist; add --do_eval to tune "
                            "the thresholds on dev")
  values, step = found
  if global_step is not None and step != global_step:
    raise fileio.InputError(f"{path} was tuned at step {step}, the checkpoint is at step "
                            f"{global_step}; add --do_eval to tune them again")
  return values


def cli():
  """The command line: `python run_classifier.py` and the `bert-run-classifier` command."""
  define_flags()
  commands.run_main(main)
