"""BERT fine-tuning for multiple choice on SWAG (Situations With Adversarial Generations).

The data half of the task: reading the SWAG CSV files (one row per situation: a first sentence,
the start of a second one and four candidate endings) and turning each row into four sequences,
[CLS] sent1 [SEP] sent2 + ending [SEP], one per choice, as in the BERT paper. The model scores the
four with one shared output unit and a softmax over the choices. `main` fine-tunes that
`BertMultipleChoice` model with the shared loop of `training.py`, reports dev accuracy
(eval_results.txt) and writes the test set's choice probabilities.
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

from bert_tf2 import fine_tuning
from bert_tf2 import metrics
from bert_tf2 import modeling
from bert_tf2 import run_dir
from bert_tf2 import script_flags
from bert_tf2 import tfrecord_io
from bert_tf2 import tokenization
from bert_tf2 import training

FLAGS = flags.FLAGS


def define_flags():
  """The flags of run_swag.py: the shared groups (script_flags), then its own."""
  script_flags.define_fine_tuning_flags(min_seq_length=5)
  script_flags.define_data_dir_flag()


NUM_CHOICES = 4

# Columns read from SWAG's header (the files also have video-id, startphrase, gold-source, and an
# unnamed leading index column in some releases; they are not needed).
_ENDING_COLUMNS = tuple(f"ending{i}" for i in range(NUM_CHOICES))


@dataclasses.dataclass
class SwagExample:
  """A single SWAG situation with its four candidate endings."""

  swag_id: str
  context_sentence: str
  start_ending: str
  endings: list
  label: int | None = None

  def __repr__(self):
    parts = [f"swag_id: {self.swag_id}", f"context_sentence: {self.context_sentence}",
             f"start_ending: {self.start_ending}"]
    parts += [f"ending_{i}: {ending}" for i, ending in enumerate(self.endings)]
    if self.label is not None:
      parts.append(f"label: {self.label}")
    return ", ".join(parts)


@dataclasses.dataclass
class InputFeatures:
  """The four sequences of one example: each list holds NUM_CHOICES lists of max_seq_length."""

  example_id: str
  input_ids: list
  input_mask: list
  segment_ids: list
  label: int
  is_real_example: bool = True


def read_swag_examples(input_file, is_training=True):
  """Reads a SWAG CSV (with its header) into SwagExamples.

  Columns are found by header name: fold-ind (id), sent1, sent2, ending0..ending3, label. The
  label is required for training and read when present otherwise (the test file has none). A row
  with the wrong number of fields or a label outside 0..3 is an error naming file and line.
  """
  rows = fileio.read_delimited(input_file, what="SWAG file")
  if not rows:
    raise fileio.InputError(f"{input_file}: the file is empty")

  header_line, header = rows[0]
  required = ("sent1", "sent2") + _ENDING_COLUMNS + (("label",) if is_training else ())
  missing = [name for name in required if name not in header]
  if missing:
    raise fileio.InputError(f"{input_file}:{header_line}: the header has no column "
                            f"{', '.join(missing)}; expected SWAG's video-id,fold-ind,startphrase,"
                            f"sent1,sent2,gold-source,ending0..ending3,label")
  column = {name: i for i, name in enumerate(header)}
  id_column = column.get("fold-ind")

  examples = []
  for i, (line, fields) in enumerate(rows[1:], start=1):
    if len(fields) != len(header):
      raise fileio.InputError(f"{input_file}:{line}: expected {len(header)} fields as in the "
                              f"header, found {len(fields)}")
    label = None
    if "label" in column:
      text = fields[column["label"]].strip()
      if text or is_training:
        if text not in {str(k) for k in range(NUM_CHOICES)}:
          raise fileio.InputError(f"{input_file}:{line}: label {text!r} is not a choice 0 to "
                                  f"{NUM_CHOICES - 1}")
        label = int(text)
    examples.append(SwagExample(
        swag_id=fields[id_column] if id_column is not None else str(i),
        context_sentence=fields[column["sent1"]],
        start_ending=fields[column["sent2"]],
        endings=[fields[column[name]] for name in _ENDING_COLUMNS],
        label=label))
  return examples


class SwagProcessor:
  """SWAG's train.csv, val.csv and test.csv in one directory."""

  FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}

  def get_train_examples(self, data_dir):
    return read_swag_examples(os.path.join(data_dir, self.FILES["train"]), is_training=True)

  def get_dev_examples(self, data_dir):
    return read_swag_examples(os.path.join(data_dir, self.FILES["dev"]), is_training=True)

  def get_test_examples(self, data_dir):
    return read_swag_examples(os.path.join(data_dir, self.FILES["test"]), is_training=False)


def convert_single_example(ex_index, example, max_seq_length, tokenizer):
  """One SwagExample -> InputFeatures of its four [CLS] sent1 [SEP] sent2 ending [SEP] sequences."""
  context_tokens = tokenizer.tokenize(example.context_sentence)
  start_ending_tokens = tokenizer.tokenize(example.start_ending)

  input_ids, input_mask, segment_ids = [], [], []
  for ending_index, ending in enumerate(example.endings):
    # Each choice truncates its own copy: the context may keep more tokens next to a short ending.
    context_tokens_choice = context_tokens[:]
    ending_tokens = start_ending_tokens + tokenizer.tokenize(ending)
    # Three positions go to [CLS] and the two [SEP]s.
    tokenization.truncate_seq_pair(context_tokens_choice, ending_tokens, max_seq_length - 3)

    tokens = ["[CLS]"] + context_tokens_choice + ["[SEP]"] + ending_tokens + ["[SEP]"]
    choice_segment_ids = [0] * (len(context_tokens_choice) + 2) + [1] * (len(ending_tokens) + 1)
    choice_input_ids, choice_input_mask, choice_segment_ids = fine_tuning.padded_ids(
        tokenizer, tokens, choice_segment_ids, max_seq_length)

    input_ids.append(choice_input_ids)
    input_mask.append(choice_input_mask)
    segment_ids.append(choice_segment_ids)

    if ex_index < 3:  # the original's example dumps: --verbosity=1 shows them
      logging.debug("Features of example %s, choice %d:", example.swag_id, ending_index)
      logging.debug("tokens: %s", " ".join(tokenization.printable_text(x) for x in tokens))
      logging.debug("input_ids: %s", " ".join(str(x) for x in choice_input_ids))
      logging.debug("segment_ids: %s", " ".join(str(x) for x in choice_segment_ids))
  if ex_index < 3:
    logging.debug("label: %s", example.label)

  return InputFeatures(example.swag_id, input_ids, input_mask, segment_ids,
                       example.label if example.label is not None else 0)


def convert_examples_to_features(examples, max_seq_length, tokenizer):
  return [convert_single_example(i, example, max_seq_length, tokenizer)
          for i, example in enumerate(examples)]


def _padding_feature(max_seq_length):
  """Four all-zero sequences with is_real_example 0: fills the last batch and weighs nothing."""
  zeros = [[0] * max_seq_length for _ in range(NUM_CHOICES)]
  return InputFeatures("padding", zeros, zeros, zeros, 0, is_real_example=False)


def file_based_convert_examples_to_features(examples, max_seq_length, tokenizer, output_file,
                                            pad_to_multiple=1):
  """Writes the features of `examples` to a TFRecord file atomically; returns the record count.

  Records: input_ids, input_mask, segment_ids ([NUM_CHOICES * max_seq_length] int64, choice-major),
  label_ids ([1] int64, the correct choice; 0 where unknown) and is_real_example ([1] int64).
  With `pad_to_multiple`, padding records (is_real_example 0) follow the real ones up to a
  multiple of it, so evaluation batches all have one shape without dropping an example; the
  count returned is of the real records.
  """
  features = itertools.chain(
      (convert_single_example(i, example, max_seq_length, tokenizer)
       for i, example in enumerate(examples)),
      [_padding_feature(max_seq_length)] * (-len(examples) % pad_to_multiple))
  tfrecord_io.write_examples(output_file, ({
      "input_ids": tfrecord_io.int64_feature(sum(feature.input_ids, [])),
      "input_mask": tfrecord_io.int64_feature(sum(feature.input_mask, [])),
      "segment_ids": tfrecord_io.int64_feature(sum(feature.segment_ids, [])),
      "label_ids": tfrecord_io.int64_feature([feature.label]),
      "is_real_example": tfrecord_io.int64_feature([int(feature.is_real_example)]),
  } for feature in features))
  return len(examples)


def feature_spec(seq_length):
  """name -> tf.io feature of the records `file_based_convert_examples_to_features` writes:
  input_ids, input_mask, segment_ids come out [NUM_CHOICES, seq_length] per example."""
  return {
      "input_ids": tf.io.FixedLenFeature([NUM_CHOICES, seq_length], tf.int64),
      "input_mask": tf.io.FixedLenFeature([NUM_CHOICES, seq_length], tf.int64),
      "segment_ids": tf.io.FixedLenFeature([NUM_CHOICES, seq_length], tf.int64),
      "label_ids": tf.io.FixedLenFeature([], tf.int64),
      "is_real_example": tf.io.FixedLenFeature([], tf.int64),
  }


def _records_key(settings, split):
  """What a split's feature records are made from: reused only when all of it is unchanged."""
  path = os.path.join(FLAGS.data_dir, SwagProcessor.FILES[split])
  return {"script": "run_swag", "split": split, "input": fileio.file_signature(path),
          "vocab": fileio.file_signature(settings.vocab_file),
          "do_lower_case": settings.do_lower_case, "max_seq_length": settings.max_seq_length}


def _probabilities(settings, trainer, examples, name, split, tokenizer):
  """Choice probabilities [len(examples), NUM_CHOICES] of `examples` (of `split`) with
  --{name}_batch_size."""
  record_file = os.path.join(settings.output_dir, f"{name}.tf_record")
  write = lambda padded_to: file_based_convert_examples_to_features(
      examples, settings.max_seq_length, tokenizer, record_file, pad_to_multiple=padded_to)
  probabilities, real = [], []
  for batch in fine_tuning.predict(trainer, record_file, _records_key(settings, split), write,
                                   len(examples), feature_spec(settings.max_seq_length),
                                   getattr(settings, f"{name}_batch_size"), f"{name}_batch_size",
                                   fine_tuning.pad_to_longest(settings, trainer.strategy)):
    probabilities.append(tf.nn.softmax(batch["logits"]).numpy())
    real.append(batch["is_real_example"].astype(bool))
  return np.concatenate(probabilities)[np.concatenate(real)]


def main(_):
  settings = script_flags.settings(fine_tuning.Settings)
  with fine_tuning.run(settings, ("train", "eval", "predict"), data_dir=FLAGS.data_dir) as s:
    out, data_dir = s.output_dir, FLAGS.data_dir
    has_checkpoint, config, tokenizer = fine_tuning.check_files_and_load(
        s, ("train.tf_record", "eval.tf_record", "predict.tf_record", "eval_results.txt",
            "test_results.tsv", "task.json"),
        [("data_dir", [os.path.join(data_dir, name) for name in SwagProcessor.FILES.values()])],
        "SWAG choices are pairs (context: segment 0, ending: segment 1)")
    fine_tuning.task_record(out, "run_swag", has_checkpoint)
    fine_tuning.init_task_record(s.init_checkpoint, "run_swag",
                                 not s.do_train and not has_checkpoint)
    processor = SwagProcessor()

    strategy = script_flags.strategy()
    train_examples = processor.get_train_examples(data_dir) if s.do_train else None
    num_train_steps, num_warmup_steps, batch = fine_tuning.train_steps(
        s, train_examples, strategy, os.path.join(data_dir, SwagProcessor.FILES["train"]))
    model, optimizer, trainer, init_fn = fine_tuning.build_trainer(
        s, strategy, lambda: modeling.BertMultipleChoice(config, script_flags.compute_dtype()),
        modeling.swag_losses, num_train_steps, num_warmup_steps, has_checkpoint)

    def dev_evaluation():
      """The eval_* metrics and eval_loss of the model as it is now on dev."""
      examples = processor.get_dev_examples(data_dir)
      probabilities = _probabilities(s, trainer, examples, "eval", "dev", tokenizer)
      labels = np.array([e.label for e in examples])
      return {"eval_accuracy": float(np.mean(probabilities.argmax(-1) == labels)),
              "eval_loss": metrics.cross_entropy(probabilities, labels),
              "eval_examples": len(examples)}

    evaluate = fine_tuning.eval_during_training(s, trainer, dev_evaluation, ("accuracy", "loss"),
                                                read_dev=lambda: processor.get_dev_examples(
                                                    data_dir))
    if s.do_train:
      train_file = os.path.join(out, "train.tf_record")
      fileio.build_unless_current(
          train_file, _records_key(s, "train"),
          lambda: file_based_convert_examples_to_features(train_examples, s.max_seq_length,
                                                          tokenizer, train_file))
      fine_tuning.write_task_record(out, "run_swag")
      fine_tuning.write_model_files(out, config, s.vocab_file)
      logging.info("Training on %d examples, %d steps (%d warm-up), batch %d",
                   len(train_examples), num_train_steps, num_warmup_steps, s.train_batch_size)
      fine_tuning.train_on_records(s, trainer, train_file, feature_spec(s.max_seq_length), batch,
                                   num_train_steps, init_fn,
                                   fine_tuning.pad_to_longest(s, strategy),
                                   fine_tuning.shuffle_buffer(len(train_examples)), evaluate)
    else:
      trainer.restore_or_initialize(init_fn)

    # The best checkpoint's weights when one was kept (--keep_best_checkpoint_metric).
    global_step = fine_tuning.evaluated_step(s, trainer, optimizer)
    if s.do_eval:
      summary = dev_evaluation()
      summary.update(loss=summary["eval_loss"], global_step=global_step)
      if trainer.is_chief:  # (under multi_worker_mirrored every worker has the results)
        training.write_eval_results(run_dir.eval_results_file(out), summary)

    if s.do_predict:
      examples = processor.get_test_examples(data_dir)
      probabilities = _probabilities(s, trainer, examples, "predict", "test", tokenizer)
    if s.do_predict and trainer.is_chief:
      output_file = os.path.join(out, "test_results.tsv")
      with fileio.open_atomic(output_file) as f:
        for row in probabilities:
          f.write("\t".join(f"{p:.8g}" for p in row) + "\n")
      logging.info("Wrote the choice probabilities of %d examples to %s", len(examples),
                   output_file)


def cli():
  """The command line: `python run_swag.py` and the `bert-run-swag` command."""
  define_flags()
  commands.run_main(main)
