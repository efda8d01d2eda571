"""BERT fine-tuning for named-entity recognition on CoNLL-2003 style files.

The data half of the task: reading CoNLL column files (one "word POS chunk NER" line per token,
blank lines between sentences, -DOCSTART- lines between documents) into sentences, turning each
sentence into WordPiece features where a word's tag sits on its first sub-token (the other
sub-tokens, [CLS], [SEP] and padding get weight 0 and do not count in the loss or the scores, as
in the BERT paper), and mapping token predictions back to one tag per word so `metrics.py` can
score entities as conlleval does. `main` fine-tunes a `BertTokenClassifier` with the shared loop of
`training.py`, scores the dev set at entity level (eval_results.txt) and tags the test set.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import dataclasses
import os

from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from bert_tf2 import fine_tuning
from bert_tf2 import input_pipeline
from bert_tf2 import metrics
from bert_tf2 import modeling
from bert_tf2 import run_dir
from bert_tf2 import script_flags
from bert_tf2 import tfrecord_io
from bert_tf2 import tokenization
from bert_tf2 import training

FLAGS = flags.FLAGS


def define_flags():
  """The flags of run_ner.py: the shared groups (script_flags), then its own."""
  script_flags.define_fine_tuning_flags()
  script_flags.define_data_dir_flag()
  script_flags.define_labels_flag()


CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")

_DOCSTART = "-DOCSTART-"


@dataclasses.dataclass
class NerExample:
  """A sentence: its words and their tags (tags may be None when unknown)."""

  guid: str
  words: list
  labels: list | None = None
  # Line of the sentence's first word, for messages.
  line: int | None = None


@dataclasses.dataclass
class InputFeatures:
  """One sequence of a sentence (a long sentence gives several)."""

  input_ids: list
  input_mask: list
  segment_ids: list
  label_ids: list
  label_weights: list
  # Which sentence, its first word in this sequence, and each such word's first-token position.
  example_index: int
  word_start: int
  word_positions: list


def read_conll_examples(input_file, set_type, labels=CONLL2003_LABELS):
  """Sentences of a CoNLL column file: the first column is the word, the last its tag.

  Blank lines end sentences; -DOCSTART- lines (document breaks) are not sentences. All token lines
  of a file must have the same number of columns (CoNLL-2003: word, POS, chunk, NER), so a line
  that lost its tag is an error naming the file and line rather than a shifted column; so is a
  tag outside `labels` (None skips that check).
  """
  examples = []
  words, tags, first_line = [], [], None
  width = None
  label_set = set(labels) if labels is not None else None

  def finish():
    if words:
      examples.append(NerExample(f"{set_type}-{len(examples)}", list(words), list(tags),
                                 first_line))
      words.clear()
      tags.clear()

  for number, line in fileio.read_lines(input_file):
    fields = line.split()
    if not fields:
      finish()
      continue
    if fields[0] == _DOCSTART:
      finish()
      continue
    if width is None:
      width = len(fields)
      if width < 2:
        raise fileio.InputError(f"{input_file}:{number}: expected a word and its tag, found "
                                f"{line!r}")
    if len(fields) != width:
      raise fileio.InputError(f"{input_file}:{number}: expected {width} columns like the file's "
                              f"first token line, found {len(fields)} ({line!r}); a missing tag?")
    tag = fields[-1]
    if label_set is not None and tag not in label_set:
      raise fileio.InputError(f"{input_file}:{number}: unknown tag {tag!r}; expected one of "
                              f"{', '.join(labels)}")
    if not words:
      first_line = number
    words.append(fields[0])
    tags.append(tag)
  finish()
  return examples


class ConllProcessor:
  """The train/dev/test files of a CoNLL-2003 style data directory."""

  def __init__(self, labels=None):
    self.labels = tuple(labels) if labels else CONLL2003_LABELS

  def get_train_examples(self, data_dir):
    return read_conll_examples(os.path.join(data_dir, "train.txt"), "train", self.labels)

  @staticmethod
  def split_file(data_dir, split):
    """The file of a split ("train", "dev", "test"); dev is valid.txt, or dev.txt without one."""
    if split != "dev":
      return os.path.join(data_dir, f"{split}.txt")
    path = os.path.join(data_dir, "valid.txt")
    if not fileio.exists(path) and fileio.exists(os.path.join(data_dir, "dev.txt")):
      path = os.path.join(data_dir, "dev.txt")
    return path

  def get_dev_examples(self, data_dir):
    return read_conll_examples(self.split_file(data_dir, "dev"), "dev", self.labels)

  def get_test_examples(self, data_dir):
    return read_conll_examples(os.path.join(data_dir, "test.txt"), "test", self.labels)

  def get_labels(self):
    return list(self.labels)


def _word_pieces(tokenizer, words):
  """WordPiece tokens per word; a word the tokenizer drops entirely (e.g. only control
  characters) becomes [UNK] so every word still has a position to carry its tag."""
  if hasattr(tokenizer, "tokenize_batch"):
    pieces = tokenizer.tokenize_batch(words)
  else:
    pieces = [tokenizer.tokenize(word) for word in words]
  return [p if p else ["[UNK]"] for p in pieces]


def convert_examples_to_features(examples, label_list, max_seq_length, tokenizer):
  """Sentences -> InputFeatures, splitting long sentences into consecutive sequences.

  Each sequence is [CLS] word pieces [SEP]. label_ids holds the tag id at each word's first
  sub-token and 0 elsewhere; label_weights is 1.0 exactly at those first sub-tokens. A sentence
  longer than max_seq_length - 2 pieces is cut at word boundaries (no overlap), so each word is
  predicted once; a single word longer than that keeps only its first pieces.
  """
  if max_seq_length < 3:
    raise fileio.InputError(f"max_seq_length must be at least 3 ([CLS] word [SEP]), not "
                            f"{max_seq_length}")
  label_map = {label: i for i, label in enumerate(label_list)}
  max_pieces = max_seq_length - 2
  features = []
  for example_index, example in enumerate(examples):
    pieces = _word_pieces(tokenizer, example.words)
    word_start = 0
    while word_start < len(example.words) or (word_start == 0 and not example.words):
      tokens = ["[CLS]"]
      label_ids = [0]
      label_weights = [0.0]
      word_positions = []
      word = word_start
      while word < len(example.words):
        word_pieces = pieces[word][:max_pieces]
        if len(tokens) - 1 + len(word_pieces) > max_pieces:
          break
        word_positions.append(len(tokens))
        label = example.labels[word] if example.labels else None
        if label is not None and label not in label_map:
          raise fileio.InputError(f"sentence {example.guid} (line {example.line}): unknown tag "
                                  f"{label!r}")
        for i, piece in enumerate(word_pieces):
          tokens.append(piece)
          label_ids.append(label_map.get(label, 0) if i == 0 else 0)
          label_weights.append(1.0 if i == 0 and label is not None else 0.0)
        word += 1
      tokens.append("[SEP]")
      label_ids.append(0)
      label_weights.append(0.0)

      input_ids, input_mask, segment_ids = fine_tuning.padded_ids(
          tokenizer, tokens, [0] * len(tokens), max_seq_length)
      label_ids += [0] * (max_seq_length - len(tokens))
      label_weights += [0.0] * (max_seq_length - len(tokens))

      if example_index < 5:  # the original's example dumps: --verbosity=1 shows them
        logging.debug("Features of sentence %s:", example.guid)
        logging.debug("tokens: %s", " ".join(tokenization.printable_text(x) for x in tokens))
        logging.debug("label_ids: %s", " ".join(str(x) for x in label_ids))
        logging.debug("label_weights: %s", " ".join(str(int(x)) for x in label_weights))

      features.append(InputFeatures(input_ids, input_mask, segment_ids, label_ids, label_weights,
                                    example_index, word_start, word_positions))
      if not example.words:
        break
      word_start = word
  return features


def _padding_feature(max_seq_length):
  """A record of zeros with no labelled position (weight 0 everywhere): fills the last batch."""
  zeros = [0] * max_seq_length
  return InputFeatures(zeros, zeros, zeros, zeros, [0.0] * max_seq_length, -1, 0, [])


def file_based_convert_examples_to_features(examples, label_list, max_seq_length, tokenizer,
                                            output_file, pad_to_multiple=1):
  """Writes the features of `examples` to a TFRecord file atomically; returns the features.

  Records: input_ids, input_mask, segment_ids, label_ids ([max_seq_length] int64) and
  label_weights ([max_seq_length] float). The returned InputFeatures map predictions back to
  words (`word_predictions`). With `pad_to_multiple`, records of zeros (weight 0, not among the
  returned features) follow the real ones up to a multiple of it, so prediction batches all have
  one shape without dropping a sentence.
  """
  features = convert_examples_to_features(examples, label_list, max_seq_length, tokenizer)
  write_features(features, max_seq_length, output_file, pad_to_multiple)
  return features


def write_features(features, max_seq_length, output_file, pad_to_multiple=1):
  """Writes InputFeatures (then padding records, see above) to a TFRecord file atomically."""
  padding = [_padding_feature(max_seq_length)] * (-len(features) % pad_to_multiple)
  tfrecord_io.write_examples(output_file, ({
      "input_ids": tfrecord_io.int64_feature(feature.input_ids),
      "input_mask": tfrecord_io.int64_feature(feature.input_mask),
      "segment_ids": tfrecord_io.int64_feature(feature.segment_ids),
      "label_ids": tfrecord_io.int64_feature(feature.label_ids),
      "label_weights": tfrecord_io.float_feature(feature.label_weights),
  } for feature in features + padding))


def feature_spec(seq_length):
  """name -> tf.io feature of the records `file_based_convert_examples_to_features` writes."""
  return {
      "input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
      "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
      "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
      "label_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
      "label_weights": tf.io.FixedLenFeature([seq_length], tf.float32),
  }


def word_predictions(examples, features, predicted_ids, label_list):
  """One predicted tag per word of each sentence, from per-token predictions of the features.

  `predicted_ids` is indexable by feature (in `features` order) and then token position, e.g. the
  argmax of the logits, [num_features, max_seq_length]. Each word takes the prediction at its
  first sub-token.
  """
  sentences = [[None] * len(example.words) for example in examples]
  for feature, ids in zip(features, predicted_ids):
    tags = sentences[feature.example_index]
    for offset, position in enumerate(feature.word_positions):
      tags[feature.word_start + offset] = label_list[int(ids[position])]
  for example, tags in zip(examples, sentences):
    if None in tags:
      raise ValueError(f"sentence {example.guid}: no prediction for word {tags.index(None)}")
  return sentences


def write_conll_predictions(output_file, examples, predicted_tags):
  """'word gold predicted' lines with blank lines between sentences, the input conlleval reads."""
  with fileio.open_atomic(output_file) as writer:
    for example, tags in zip(examples, predicted_tags):
      gold = example.labels or ["O"] * len(example.words)
      for word, gold_tag, tag in zip(example.words, gold, tags):
        writer.write(f"{word} {gold_tag} {tag}\n")
      writer.write("\n")


def _tag(settings, trainer, examples, name, split, label_list, tokenizer):
  """Runs the model over `examples` (of `split`) with --{name}_batch_size; returns (one predicted
  tag per word per sentence, mean cross-entropy over the labelled words)."""
  max_seq_length = settings.max_seq_length
  record_file = os.path.join(settings.output_dir, f"{name}.tf_record")
  # The features are needed in memory to map predictions back to words, records or not.
  features = convert_examples_to_features(examples, label_list, max_seq_length, tokenizer)
  # With dynamic padding the records go by length, so that each batch holds sentences of about
  # one length; the predictions are put back in input order below.
  by_length = fine_tuning.pad_to_longest(settings, trainer.strategy)
  order = (input_pipeline.length_order([sum(f.input_mask) for f in features]) if by_length
           else np.arange(len(features)))
  write = lambda padded_to: write_features([features[i] for i in order], max_seq_length,
                                           record_file, padded_to)
  predicted, nll, count = [], 0.0, 0.0
  for batch in fine_tuning.predict(
      trainer, record_file, _records_key(settings, split, label_list,
                                         "length" if by_length else "input"),
      write, len(features), feature_spec(max_seq_length),
      getattr(settings, f"{name}_batch_size"), f"{name}_batch_size", by_length):
    logits = batch["logits"]
    # A batch cut to its longest sentence (--dynamic_padding) gets its padding back.
    predicted.append(np.pad(logits.argmax(-1), [(0, 0), (0, max_seq_length - logits.shape[1])]))
    batch_nll, batch_count = metrics.weighted_nll(logits, batch["label_ids"],
                                                  batch["label_weights"])
    nll, count = nll + batch_nll, count + batch_count
  # Padding records come last, beyond the real features that word_predictions reads.
  predicted = input_pipeline.unsort(np.concatenate(predicted)[:len(features)], order)
  tags = word_predictions(examples, features, predicted, label_list)
  return tags, nll / max(count, 1.0)


def _records_key(settings, split, label_list, order="input"):
  """What a split's feature records are made from: reused only when all of it is unchanged."""
  return {"script": "run_ner", "split": split,
          "input": fileio.file_signature(ConllProcessor.split_file(FLAGS.data_dir, split)),
          "vocab": fileio.file_signature(settings.vocab_file),
          "do_lower_case": settings.do_lower_case, "max_seq_length": settings.max_seq_length,
          "labels": label_list, "order": order}


def _label_list(settings, has_checkpoint):
  """The tags: --labels; else, without training, those the training run saved in output_dir
  (task.json) or beside a fine-tuned --init_checkpoint; else CoNLL-2003's. They must agree with
  the model in output_dir and the one given by --init_checkpoint."""
  s = settings
  fileio.check_distinct(FLAGS.labels, "labels", "tag")
  record = fine_tuning.task_record(s.output_dir, "run_ner", has_checkpoint)
  init_record = fine_tuning.init_task_record(s.init_checkpoint, "run_ner",
                                             not s.do_train and not has_checkpoint)
  saved = (record if has_checkpoint and record else init_record or record or {}).get("labels")
  labels = FLAGS.labels or (saved if saved and not s.do_train else list(CONLL2003_LABELS))
  fine_tuning.check_labels_match(labels, init_record, True, s.init_checkpoint, "tags",
                                 "init_checkpoint")
  return fine_tuning.check_labels_match(labels, record, has_checkpoint, s.output_dir, "tags")


def main(_):
  settings = script_flags.settings(fine_tuning.Settings)
  with fine_tuning.run(settings, ("train", "eval", "predict"), data_dir=FLAGS.data_dir) as s:
    out, data_dir = s.output_dir, FLAGS.data_dir
    # What main writes in --output_dir besides checkpoints and the TensorBoard folder train/.
    has_checkpoint, config, tokenizer = fine_tuning.check_files_and_load(
        s, ("train.tf_record", "eval.tf_record", "predict.tf_record", "eval_results.txt",
            "test_predictions.txt", "task.json"),
        [("data_dir", [os.path.join(data_dir, name)
                       for name in ("train.txt", "valid.txt", "dev.txt", "test.txt")])])
    processor = ConllProcessor(_label_list(s, has_checkpoint))
    label_list = processor.get_labels()

    strategy = script_flags.strategy()
    train_examples = processor.get_train_examples(data_dir) if s.do_train else None
    num_train_steps, num_warmup_steps, batch = fine_tuning.train_steps(
        s, train_examples, strategy, os.path.join(data_dir, "train.txt"))
    model, optimizer, trainer, init_fn = fine_tuning.build_trainer(
        s, strategy, lambda: modeling.BertTokenClassifier(config, len(label_list),
                                                          script_flags.compute_dtype()),
        modeling.ner_losses, num_train_steps, num_warmup_steps, has_checkpoint)

    def dev_evaluation(report=False):
      """The eval_* metrics (entity level) and eval_loss of the model as it is now on dev."""
      examples = processor.get_dev_examples(data_dir)
      tags, loss = _tag(s, trainer, examples, "eval", "dev", label_list, tokenizer)
      result = metrics.conll_evaluate([e.labels for e in examples], tags)
      if report:
        logging.info("Dev set, entity level:\n%s", metrics.conll_report(result))
      summary = {f"eval_{k}": float(result[k]) for k in ("precision", "recall", "f1", "accuracy")}
      summary.update(eval_loss=loss, eval_examples=len(examples))
      return summary

    evaluate = fine_tuning.eval_during_training(
        s, trainer, dev_evaluation, ("precision", "recall", "f1", "accuracy", "loss"),
        read_dev=lambda: processor.get_dev_examples(data_dir))
    if s.do_train:
      train_file = os.path.join(out, "train.tf_record")
      fileio.build_unless_current(
          train_file, _records_key(s, "train", label_list),
          lambda: file_based_convert_examples_to_features(train_examples, label_list,
                                                          s.max_seq_length, tokenizer,
                                                          train_file))
      # Evaluating or tagging later without --labels reads the tags of this model here.
      fine_tuning.write_task_record(out, "run_ner", label_list)
      fine_tuning.write_model_files(out, config, s.vocab_file)
      logging.info("Training on %d sentences, %d steps (%d warm-up), batch %d",
                   len(train_examples), num_train_steps, num_warmup_steps, s.train_batch_size)
      fine_tuning.train_on_records(s, trainer, train_file, feature_spec(s.max_seq_length), batch,
                                   num_train_steps, init_fn,
                                   fine_tuning.pad_to_longest(s, strategy),
                                   fine_tuning.shuffle_buffer(len(train_examples)), evaluate)
    else:
      trainer.restore_or_initialize(init_fn, unused=("bert/pooler/",))

    # The best checkpoint's weights when one was kept (--keep_best_checkpoint_metric).
    global_step = fine_tuning.evaluated_step(s, trainer, optimizer)
    if s.do_eval:
      summary = dev_evaluation(report=True)
      summary.update(loss=summary["eval_loss"], global_step=global_step)
      if trainer.is_chief:  # (under multi_worker_mirrored every worker has the results)
        training.write_eval_results(run_dir.eval_results_file(out), summary)

    if s.do_predict:
      examples = processor.get_test_examples(data_dir)
      tags, _ = _tag(s, trainer, examples, "predict", "test", label_list, tokenizer)
    if s.do_predict and trainer.is_chief:
      output_file = os.path.join(out, "test_predictions.txt")
      write_conll_predictions(output_file, examples, tags)
      logging.info("Wrote the tags of %d sentences to %s", len(examples), output_file)


def cli():
  """The command line: `python run_ner.py` and the `bert-run-ner` command."""
  define_flags()
  commands.run_main(main)
