"""BERT fine-tuning for extractive question answering on SQuAD 1.1 and 2.0.

The data half keeps the original BERT's rules so that scores stay comparable: the SQuAD JSON is
read into whitespace-split documents with character-to-word answer offsets, each document is cut
into overlapping windows ([CLS] question [SEP] window [SEP]) with the answer span re-aligned to
WordPiece tokens, the features go to a TFRecord file, and the model's start/end logits are turned
back into answer text (n-best search, projection of WordPiece spans onto the original text, the
SQuAD 2.0 no-answer threshold). `main` fine-tunes a `BertSpanLabeler` with the shared loop of
`training.py`, writes predictions.json / nbest_predictions.json (/ null_odds.json), and scores them
with `evaluate_squad.py` when the predict file has answers.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import collections
import dataclasses
import itertools
import json
import math
import os
import random

from absl import flags
from absl import logging
import tensorflow as tf

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
  """The flags of run_squad.py: the shared groups (script_flags), then its own."""
  script_flags.define_fine_tuning_flags(("train", "predict"), max_seq_length=384, min_seq_length=5)
  script_flags.define_squad_flags()
  script_flags.define_doc_stride_flag(128)

  flags.DEFINE_string("train_file", None, "SQuAD JSON to fine-tune on (e.g. train-v1.1.json).")

  flags.DEFINE_string(
      "predict_file", None,
      "SQuAD JSON to answer (e.g. dev-v1.1.json). When its questions carry answers, the "
      "predictions are also scored (eval_results.txt).")

  flags.DEFINE_bool(
      "verbose_logging", False,
      "Log every answer whose WordPiece text could not be mapped back onto the context (some are "
      "normal on SQuAD).")

  flags.DEFINE_bool(
      "version_2_with_negative", False,
      "SQuAD 2.0 data: questions may be unanswerable (is_impossible) and the model may answer "
      "nothing.")

  flags.DEFINE_float(
      "null_score_diff_threshold", 0.0,
      "SQuAD 2.0: answer nothing when the no-answer score exceeds the best span's score by more "
      "than this (any number; inf never answers nothing, -inf always does).")


@dataclasses.dataclass
class SquadExample:
  """One question on one context; start/end positions are whitespace-word indexes (-1 and -1
  for an unanswerable SQuAD 2.0 question)."""

  qas_id: str
  question_text: str
  doc_tokens: list
  orig_answer_text: str | None = None
  start_position: int | None = None
  end_position: int | None = None
  is_impossible: bool = False

  def __str__(self):
    return self.__repr__()

  def __repr__(self):
    s = f"qas_id: {tokenization.printable_text(self.qas_id)}"
    s += f", question_text: {tokenization.printable_text(self.question_text)}"
    s += f", doc_tokens: [{' '.join(self.doc_tokens)}]"
    if self.start_position is not None:
      s += f", start_position: {self.start_position}"
      s += f", end_position: {self.end_position}"
      s += f", is_impossible: {self.is_impossible!r}"
    return s


@dataclasses.dataclass
class InputFeatures:
  """The model inputs of one window of one question, and the maps back to its words."""

  unique_id: int
  example_index: int
  doc_span_index: int
  tokens: list
  token_to_orig_map: dict
  token_is_max_context: dict
  input_ids: list
  input_mask: list
  segment_ids: list
  start_position: int | None = None
  end_position: int | None = None
  is_impossible: bool | None = None


def _is_whitespace(c):
  # U+202F (narrow no-break space) separates words in some SQuAD contexts.
  return c == " " or c == "\t" or c == "\r" or c == "\n" or ord(c) == 0x202F


def _split_paragraph(paragraph_text):
  """Whitespace-split words of a context and, per character, the index of its word."""
  doc_tokens = []
  char_to_word_offset = []
  prev_is_whitespace = True
  for c in paragraph_text:
    if _is_whitespace(c):
      prev_is_whitespace = True
    else:
      if prev_is_whitespace:
        doc_tokens.append(c)
      else:
        doc_tokens[-1] += c
      prev_is_whitespace = False
    char_to_word_offset.append(len(doc_tokens) - 1)
  return doc_tokens, char_to_word_offset


def _line_of(raw_text, qas_id, occurrence=1):
  """1-based line where a question id appears (the n-th time) in the raw JSON, for messages (None
  if not found)."""
  position = -1
  for _ in range(occurrence):
    position = raw_text.find(json.dumps(qas_id), position + 1)
    if position < 0:
      return None
  return raw_text.count("\n", 0, position) + 1


def _field(container, key, kind, where, input_file):
  value = container.get(key) if isinstance(container, dict) else None
  if not isinstance(value, kind):
    raise fileio.InputError(f"{input_file}: {where}: missing or invalid \"{key}\"; is this a SQuAD "
                            f"JSON file?")
  return value


def read_squad_examples(input_file, is_training, version_2_with_negative=False, skipped=None):
  """SquadExamples of every question of a SQuAD JSON file.

  In training, each answerable question's first answer is located in the whitespace-split context.
  An answer whose offsets do not reproduce its text (a bad answer_start, or Unicode the split
  changed) cannot be trained on: it is logged with its file, line and question id and skipped, as
  the original did; their ids are appended to `skipped` when a list is given. When not training
  the answers are located too where possible (for diagnostics) but nothing is skipped.

  With version_2_with_negative, questions marked `is_impossible` become no-answer examples
  (positions -1); without it, such a question (or, in a file with answers, one without any) is an
  error naming the flag. A question id given twice is an error: predictions are keyed by id.
  """
  fileio.check_file(input_file, "SQuAD file")
  try:
    with fileio.open_input(input_file, encoding="utf-8-sig") as reader:
      raw_text = reader.read()
    input_json = json.loads(raw_text)
  except json.JSONDecodeError as e:
    raise fileio.InputError(f"{input_file}:{e.lineno}: not valid JSON ({e.msg}, column "
                            f"{e.colno})") from None
  except UnicodeDecodeError as e:
    raise fileio.InputError(f"{input_file}: not UTF-8 (byte {e.start})") from None
  input_data = _field(input_json, "data", list, "top level", input_file)

  examples = []
  num_skipped = 0
  num_multi_answer = 0
  seen_ids = collections.Counter()
  unanswered = None
  for entry_index, entry in enumerate(input_data):
    paragraphs = _field(entry, "paragraphs", list, f"data[{entry_index}]", input_file)
    for paragraph_index, paragraph in enumerate(paragraphs):
      where = f"data[{entry_index}].paragraphs[{paragraph_index}]"
      paragraph_text = _field(paragraph, "context", str, where, input_file)
      doc_tokens, char_to_word_offset = _split_paragraph(paragraph_text)

      for qa_index, qa in enumerate(_field(paragraph, "qas", list, where, input_file)):
        qa_where = f"{where}.qas[{qa_index}]"
        qas_id = qa.get("id") if isinstance(qa, dict) else None
        if not isinstance(qas_id, (str, int)):
          raise fileio.InputError(f"{input_file}: {qa_where}: missing \"id\"")
        seen_ids[qas_id] += 1
        if seen_ids[qas_id] > 1:
          raise fileio.InputError(
              f"{input_file}:{_line_of(raw_text, qas_id, seen_ids[qas_id])}: question id "
              f"{qas_id} is repeated (first at line {_line_of(raw_text, qas_id)}); predictions "
              "are keyed by id, so one would replace the other")
        if qa.get("is_impossible") and not version_2_with_negative:
          raise fileio.InputError(
              f"{input_file}:{_line_of(raw_text, qas_id)}: question {qas_id} is marked "
              "is_impossible, a SQuAD 2.0 question: pass --version_2_with_negative")
        question_text = _field(qa, "question", str, qa_where, input_file)
        start_position = None
        end_position = None
        orig_answer_text = None
        is_impossible = False
        if version_2_with_negative:
          is_impossible = bool(qa.get("is_impossible", False))
        answers = qa.get("answers") or []
        if not isinstance(answers, list):
          raise fileio.InputError(f"{input_file}: {qa_where}: \"answers\" must be a list of "
                                  "{\"text\", \"answer_start\"} objects")
        if not answers and not is_impossible and unanswered is None:
          unanswered = qas_id
        if is_training and not is_impossible:
          if not answers:
            raise fileio.InputError(f"{input_file}:{_line_of(raw_text, qas_id)}: question "
                                    f"{qas_id} has no answer to train on (an unanswerable SQuAD "
                                    "2.0 question? pass --version_2_with_negative)")
          # The original insisted on exactly one answer; the dev sets' duplicates are harmless.
          num_multi_answer += len(answers) > 1
        if is_impossible:
          start_position = -1
          end_position = -1
          orig_answer_text = ""
        elif answers:
          located = _locate_answer(answers[0], doc_tokens, char_to_word_offset)
          if located is None:
            if is_training:
              logging.warning("%s:%s: question %s: answer offsets do not match the context; "
                              "skipped", input_file, _line_of(raw_text, qas_id), qas_id)
              num_skipped += 1
              if skipped is not None:
                skipped.append(qas_id)
              continue
          else:
            orig_answer_text, start_position, end_position = located

        examples.append(SquadExample(
            qas_id=qas_id,
            question_text=question_text,
            doc_tokens=doc_tokens,
            orig_answer_text=orig_answer_text,
            start_position=start_position,
            end_position=end_position,
            is_impossible=is_impossible))

  if (unanswered is not None and not version_2_with_negative
      and any(example.orig_answer_text for example in examples)):
    # Answers elsewhere make the file one to score; an unanswered question there is SQuAD 2.0's.
    raise fileio.InputError(f"{input_file}:{_line_of(raw_text, unanswered)}: question "
                            f"{unanswered} has no answer while others have, as in SQuAD 2.0: "
                            "pass --version_2_with_negative")
  if num_skipped:
    logging.warning("%s: skipped %d questions whose answer could not be found in the context",
                    input_file, num_skipped)
  if num_multi_answer:
    logging.info("%s: %d questions have several answers; training uses the first", input_file,
                 num_multi_answer)
  return examples


def _locate_answer(answer, doc_tokens, char_to_word_offset):
  """(text, first word, last word) of an answer, or None when its offsets don't give its text."""
  if not isinstance(answer, dict):
    return None
  orig_answer_text = answer.get("text")
  answer_offset = answer.get("answer_start")
  if not isinstance(orig_answer_text, str) or not isinstance(answer_offset, int):
    return None
  answer_length = len(orig_answer_text)
  if answer_length == 0 or answer_offset < 0:
    return None
  if answer_offset + answer_length > len(char_to_word_offset):
    return None
  start_position = char_to_word_offset[answer_offset]
  end_position = char_to_word_offset[answer_offset + answer_length - 1]
  if start_position < 0:
    return None
  # Only keep answers whose text can be recovered from the document: if it can't, the offsets are
  # wrong or Unicode confused the split, and training on it would teach the wrong span.
  actual_text = " ".join(doc_tokens[start_position:(end_position + 1)])
  cleaned_answer_text = " ".join(tokenization.whitespace_tokenize(orig_answer_text))
  if actual_text.find(cleaned_answer_text) == -1:
    return None
  return orig_answer_text, start_position, end_position


def _tokenize_words(tokenizer, words):
  """WordPiece tokens of each text of `words` (whitespace words, or a whole question): the batch
  path when the tokenizer has one, whose per-word cache lives as long as the tokenizer."""
  if hasattr(tokenizer, "tokenize_batch"):
    return tokenizer.tokenize_batch(words)
  return [tokenizer.tokenize(word) for word in words]


def convert_examples_to_features(examples, tokenizer, max_seq_length, doc_stride,
                                 max_query_length, is_training, output_fn):
  """Turns examples into windowed InputFeatures, passed one by one to `output_fn`.

  Returns the number of features. unique_ids count up from 1000000000 as in the original.
  """
  if max_seq_length <= max_query_length + 3:
    raise fileio.InputError(f"The max_seq_length ({max_seq_length}) must be greater than "
                            f"max_query_length ({max_query_length}) + 3")
  if doc_stride <= 0:
    raise fileio.InputError(f"doc_stride must be positive, not {doc_stride}")

  unique_id = 1000000000
  # Questions on one paragraph share its doc_tokens list, so each context is tokenized once.
  doc_cache_key = None
  doc_cache = None

  for (example_index, example) in enumerate(examples):
    (query_tokens,) = _tokenize_words(tokenizer, [example.question_text])

    if len(query_tokens) > max_query_length:
      query_tokens = query_tokens[0:max_query_length]

    if doc_cache_key is not example.doc_tokens:
      tok_to_orig_index = []
      orig_to_tok_index = []
      all_doc_tokens = []
      for (i, sub_tokens) in enumerate(_tokenize_words(tokenizer, example.doc_tokens)):
        orig_to_tok_index.append(len(all_doc_tokens))
        for sub_token in sub_tokens:
          tok_to_orig_index.append(i)
          all_doc_tokens.append(sub_token)
      doc_cache_key = example.doc_tokens
      doc_cache = (tok_to_orig_index, orig_to_tok_index, all_doc_tokens)
    tok_to_orig_index, orig_to_tok_index, all_doc_tokens = doc_cache

    tok_start_position = None
    tok_end_position = None
    if is_training and example.is_impossible:
      tok_start_position = -1
      tok_end_position = -1
    if is_training and not example.is_impossible:
      tok_start_position = orig_to_tok_index[example.start_position]
      if example.end_position < len(example.doc_tokens) - 1:
        tok_end_position = orig_to_tok_index[example.end_position + 1] - 1
      else:
        tok_end_position = len(all_doc_tokens) - 1
      (tok_start_position, tok_end_position) = _improve_answer_span(
          all_doc_tokens, tok_start_position, tok_end_position, tokenizer,
          example.orig_answer_text)

    # [CLS], [SEP] and [SEP] take three positions besides the question.
    max_tokens_for_doc = max_seq_length - len(query_tokens) - 3

    # Documents longer than the maximum sequence length are cut into overlapping windows of up to
    # that length, each starting `doc_stride` tokens after the previous one.
    doc_spans = sliding_windows.spans(len(all_doc_tokens), max_tokens_for_doc, doc_stride)

    for (doc_span_index, doc_span) in enumerate(doc_spans):
      tokens = []
      token_to_orig_map = {}
      token_is_max_context = {}
      segment_ids = []
      tokens.append("[CLS]")
      segment_ids.append(0)
      for token in query_tokens:
        tokens.append(token)
        segment_ids.append(0)
      tokens.append("[SEP]")
      segment_ids.append(0)

      for i in range(doc_span.length):
        split_token_index = doc_span.start + i
        token_to_orig_map[len(tokens)] = tok_to_orig_index[split_token_index]

        token_is_max_context[len(tokens)] = (
            sliding_windows.max_context(doc_spans, split_token_index) == doc_span_index)
        tokens.append(all_doc_tokens[split_token_index])
        segment_ids.append(1)
      tokens.append("[SEP]")
      segment_ids.append(1)

      input_ids, input_mask, segment_ids = fine_tuning.padded_ids(tokenizer, tokens, segment_ids,
                                                                  max_seq_length)

      start_position = None
      end_position = None
      if is_training and not example.is_impossible:
        # A window that does not contain the whole answer is trained to point at [CLS] (position
        # 0), i.e. "no answer in this window", instead of being thrown away.
        doc_start = doc_span.start
        doc_end = doc_span.start + doc_span.length - 1
        out_of_span = not (tok_start_position >= doc_start and tok_end_position <= doc_end)
        if out_of_span:
          start_position = 0
          end_position = 0
        else:
          doc_offset = len(query_tokens) + 2
          start_position = tok_start_position - doc_start + doc_offset
          end_position = tok_end_position - doc_start + doc_offset

      if is_training and example.is_impossible:
        start_position = 0
        end_position = 0

      if example_index < 20:  # the original's example dumps: --verbosity=1 shows them
        logging.debug("Feature of question %d, window %d:", example_index, doc_span_index)
        logging.debug("unique_id: %s", unique_id)
        logging.debug("example_index: %s", example_index)
        logging.debug("doc_span_index: %s", doc_span_index)
        logging.debug("tokens: %s", " ".join(tokenization.printable_text(x) for x in tokens))
        logging.debug("token_to_orig_map: %s",
                      " ".join(f"{x}:{y}" for (x, y) in token_to_orig_map.items()))
        logging.debug("token_is_max_context: %s",
                      " ".join(f"{x}:{y}" for (x, y) in token_is_max_context.items()))
        logging.debug("input_ids: %s", " ".join(str(x) for x in input_ids))
        logging.debug("input_mask: %s", " ".join(str(x) for x in input_mask))
        logging.debug("segment_ids: %s", " ".join(str(x) for x in segment_ids))
        if is_training and example.is_impossible:
          logging.debug("impossible example")
        if is_training and not example.is_impossible:
          answer_text = " ".join(tokens[start_position:(end_position + 1)])
          logging.debug("start_position: %d", start_position)
          logging.debug("end_position: %d", end_position)
          logging.debug("answer: %s", tokenization.printable_text(answer_text))

      feature = InputFeatures(
          unique_id=unique_id,
          example_index=example_index,
          doc_span_index=doc_span_index,
          tokens=tokens,
          token_to_orig_map=token_to_orig_map,
          token_is_max_context=token_is_max_context,
          input_ids=input_ids,
          input_mask=input_mask,
          segment_ids=segment_ids,
          start_position=start_position,
          end_position=end_position,
          is_impossible=example.is_impossible)

      output_fn(feature)

      unique_id += 1
  return unique_id - 1000000000


def _improve_answer_span(doc_tokens, input_start, input_end, tokenizer, orig_answer_text):
  """The tightest WordPiece span whose text is the annotated answer (else the word span).

  Answers are annotated on characters and first projected to whitespace words, which can be
  wider than the answer: for "(1895-1943)." with answer "1895", the word is the whole thing. After
  WordPiece splits it into ( 1895 - 1943 ) . the exact answer can be matched, so the smallest
  sub-span whose tokens equal the answer's tokens is taken. When the answer is part of a word
  WordPiece keeps whole ("Japan" inside "Japanese"), the word span stays.
  """
  tok_answer_text = " ".join(tokenizer.tokenize(orig_answer_text))

  for new_start in range(input_start, input_end + 1):
    for new_end in range(input_end, new_start - 1, -1):
      text_span = " ".join(doc_tokens[new_start:(new_end + 1)])
      if text_span == tok_answer_text:
        return (new_start, new_end)

  return (input_start, input_end)


def squad_record(feature, is_training):
  """The record of one window: unique_ids ([1]), input_ids, input_mask, segment_ids
  ([max_seq_length]), and in training start_positions, end_positions, is_impossible ([1])."""
  fields = {"unique_ids": tfrecord_io.int64_feature([feature.unique_id]),
            "input_ids": tfrecord_io.int64_feature(feature.input_ids),
            "input_mask": tfrecord_io.int64_feature(feature.input_mask),
            "segment_ids": tfrecord_io.int64_feature(feature.segment_ids)}
  if is_training:
    fields["start_positions"] = tfrecord_io.int64_feature([feature.start_position])
    fields["end_positions"] = tfrecord_io.int64_feature([feature.end_position])
    fields["is_impossible"] = tfrecord_io.int64_feature([int(bool(feature.is_impossible))])
  return fields


def feature_spec(seq_length, is_training):
  """name -> tf.io feature of `squad_record`'s records (positions only for training)."""
  name_to_features = {
      "unique_ids": tf.io.FixedLenFeature([], tf.int64),
      "input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
      "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
      "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
  }
  if is_training:
    name_to_features["start_positions"] = tf.io.FixedLenFeature([], tf.int64)
    name_to_features["end_positions"] = tf.io.FixedLenFeature([], tf.int64)
    name_to_features["is_impossible"] = tf.io.FixedLenFeature([], tf.int64)
  return name_to_features


RawResult = collections.namedtuple("RawResult", ["unique_id", "start_logits", "end_logits"])

_PrelimPrediction = collections.namedtuple(
    "PrelimPrediction", ["feature_index", "start_index", "end_index", "start_logit", "end_logit"])

_NbestPrediction = collections.namedtuple("NbestPrediction", ["text", "start_logit", "end_logit"])

# A score for "no answer is better" when no span could be predicted at all (beyond any threshold).
_NO_SPAN_SCORE_DIFF = 1e6


def span_text(example, feature, start_index, end_index, do_lower_case, verbose_logging=False):
  """The answer text for tokens start_index..end_index of a feature, in the original's spelling.

  The WordPiece tokens are joined and de-tokenized ("##" pieces glued back), then projected onto
  the original words they came from (`get_final_text`), so the answer keeps the context's case,
  accents and punctuation but not the extra characters of partially covered words.
  """
  tok_tokens = feature.tokens[start_index:(end_index + 1)]
  orig_doc_start = feature.token_to_orig_map[start_index]
  orig_doc_end = feature.token_to_orig_map[end_index]
  orig_tokens = example.doc_tokens[orig_doc_start:(orig_doc_end + 1)]
  tok_text = " ".join(tok_tokens)

  # Glue "##" continuation pieces back onto their words, then normalise the spacing.
  tok_text = tok_text.replace(" ##", "")
  tok_text = tok_text.replace("##", "")

  tok_text = tok_text.strip()
  tok_text = " ".join(tok_text.split())
  orig_text = " ".join(orig_tokens)

  return get_final_text(tok_text, orig_text, do_lower_case, verbose_logging)


def write_predictions(all_examples, all_features, all_results, n_best_size, max_answer_length,
                      do_lower_case, output_prediction_file, output_nbest_file,
                      output_null_log_odds_file, version_2_with_negative=False,
                      null_score_diff_threshold=0.0, verbose_logging=False):
  """Writes final predictions (and n-best lists, and SQuAD 2.0 null log-odds) as JSON.

  Returns (predictions, nbest, scores_diff): question id -> answer text, -> n-best list of dicts
  (text, probability, start_logit, end_logit), and for v2.0 -> null score minus best span score.
  Any output file argument may be None to skip writing it. Files are written atomically.
  """
  logging.info("Predictions go to %s, n-best lists to %s", output_prediction_file,
               output_nbest_file)

  example_index_to_features = collections.defaultdict(list)
  for feature in all_features:
    example_index_to_features[feature.example_index].append(feature)

  unique_id_to_result = {}
  for result in all_results:
    unique_id_to_result[result.unique_id] = result

  all_predictions = collections.OrderedDict()
  all_nbest_json = collections.OrderedDict()
  scores_diff_json = collections.OrderedDict()

  for (example_index, example) in enumerate(all_examples):
    features = example_index_to_features[example_index]

    prelim_predictions = []
    # SQuAD 2.0: the no-answer score of a question is the lowest [CLS] start + end score over its
    # windows (the window most sure there is an answer); remember where it came from.
    score_null = 1000000
    min_null_feature_index = 0
    null_start_logit = 0
    null_end_logit = 0
    for (feature_index, feature) in enumerate(features):
      result = unique_id_to_result.get(feature.unique_id)
      if result is None:
        raise ValueError(f"no model output for feature {feature.unique_id} (question "
                         f"{example.qas_id})")
      start_indexes = _get_best_indexes(result.start_logits, n_best_size)
      end_indexes = _get_best_indexes(result.end_logits, n_best_size)
      if version_2_with_negative:
        feature_null_score = result.start_logits[0] + result.end_logits[0]
        if feature_null_score < score_null:
          score_null = feature_null_score
          min_null_feature_index = feature_index
          null_start_logit = result.start_logits[0]
          null_end_logit = result.end_logits[0]
      for start_index in start_indexes:
        for end_index in end_indexes:
          # Spans that start or end outside the document window (in the question, on [SEP] or
          # padding), end before they start, are too long, or start where this window is not the
          # token's max context are impossible or scored better elsewhere.
          if start_index >= len(feature.tokens):
            continue
          if end_index >= len(feature.tokens):
            continue
          if start_index not in feature.token_to_orig_map:
            continue
          if end_index not in feature.token_to_orig_map:
            continue
          if not feature.token_is_max_context.get(start_index, False):
            continue
          if end_index < start_index:
            continue
          length = end_index - start_index + 1
          if length > max_answer_length:
            continue
          prelim_predictions.append(
              _PrelimPrediction(
                  feature_index=feature_index,
                  start_index=start_index,
                  end_index=end_index,
                  start_logit=result.start_logits[start_index],
                  end_logit=result.end_logits[end_index]))

    if version_2_with_negative:
      prelim_predictions.append(
          _PrelimPrediction(
              feature_index=min_null_feature_index,
              start_index=0,
              end_index=0,
              start_logit=null_start_logit,
              end_logit=null_end_logit))
    prelim_predictions = sorted(
        prelim_predictions, key=lambda x: (x.start_logit + x.end_logit), reverse=True)

    seen_predictions = {}
    nbest = []
    for pred in prelim_predictions:
      if len(nbest) >= n_best_size:
        break
      feature = features[pred.feature_index]
      if pred.start_index > 0:  # a span; start 0 is [CLS], the no-answer choice
        final_text = span_text(example, feature, pred.start_index, pred.end_index, do_lower_case,
                               verbose_logging)
        if final_text in seen_predictions:
          continue

        seen_predictions[final_text] = True
      else:
        final_text = ""
        seen_predictions[final_text] = True

      nbest.append(
          _NbestPrediction(text=final_text, start_logit=pred.start_logit,
                           end_logit=pred.end_logit))

    # SQuAD 2.0: the no-answer choice is always a candidate, even below the n-best cut.
    if version_2_with_negative:
      if "" not in seen_predictions:
        nbest.append(
            _NbestPrediction(text="", start_logit=null_start_logit, end_logit=null_end_logit))
    # No valid span at all (possible with tiny windows): a placeholder keeps the outputs complete.
    if not nbest:
      nbest.append(_NbestPrediction(text="empty", start_logit=0.0, end_logit=0.0))

    assert len(nbest) >= 1

    total_scores = []
    best_non_null_entry = None
    for entry in nbest:
      total_scores.append(entry.start_logit + entry.end_logit)
      if not best_non_null_entry:
        if entry.text:
          best_non_null_entry = entry

    probs = _compute_softmax(total_scores)

    nbest_json = []
    for (i, entry) in enumerate(nbest):
      output = collections.OrderedDict()
      output["text"] = entry.text
      output["probability"] = probs[i]
      output["start_logit"] = float(entry.start_logit)
      output["end_logit"] = float(entry.end_logit)
      nbest_json.append(output)

    assert len(nbest_json) >= 1

    if not version_2_with_negative:
      all_predictions[example.qas_id] = nbest_json[0]["text"]
    elif best_non_null_entry is None:
      # Every candidate was the null answer (the original would crash here).
      scores_diff_json[example.qas_id] = _NO_SPAN_SCORE_DIFF
      all_predictions[example.qas_id] = ""
    else:
      # No answer wins when its score beats the best span's by more than the threshold.
      score_diff = score_null - best_non_null_entry.start_logit - (best_non_null_entry.end_logit)
      scores_diff_json[example.qas_id] = float(score_diff)
      if score_diff > null_score_diff_threshold:
        all_predictions[example.qas_id] = ""
      else:
        all_predictions[example.qas_id] = best_non_null_entry.text

    all_nbest_json[example.qas_id] = nbest_json

  outputs = [(output_prediction_file, all_predictions), (output_nbest_file, all_nbest_json)]
  if version_2_with_negative:
    outputs.append((output_null_log_odds_file, scores_diff_json))
  for path, value in outputs:
    if path:
      with fileio.open_atomic(path) as writer:
        writer.write(json.dumps(value, indent=4) + "\n")
  return all_predictions, all_nbest_json, scores_diff_json


def get_final_text(pred_text, orig_text, do_lower_case, verbose_logging=False):
  """The part of `orig_text` that the normalized prediction `pred_text` corresponds to.

  `orig_text` is the span of whitespace words the predicted tokens came from, which may be wider
  than the prediction: for pred_text "steve smith" the words may be "Steve Smith's". `pred_text`
  itself is normalized (lower case, accents stripped) and not what the context says. So both are
  aligned character by character after running the basic tokenizer over `orig_text` and removing
  spaces; when the alignment fails (lengths differ), `orig_text` is returned as is.
  """

  def _strip_spaces(text):
    ns_chars = []
    ns_to_s_map = collections.OrderedDict()
    for (i, c) in enumerate(text):
      if c == " ":
        continue
      ns_to_s_map[len(ns_chars)] = i
      ns_chars.append(c)
    ns_text = "".join(ns_chars)
    return (ns_text, ns_to_s_map)

  tokenizer = tokenization.BasicTokenizer(do_lower_case=do_lower_case)

  tok_text = " ".join(tokenizer.tokenize(orig_text))

  start_position = tok_text.find(pred_text)
  if start_position == -1:
    if verbose_logging:
      logging.info("prediction %r is not in the tokenized context %r", pred_text, orig_text)
    return orig_text
  end_position = start_position + len(pred_text) - 1

  (orig_ns_text, orig_ns_to_s_map) = _strip_spaces(orig_text)
  (tok_ns_text, tok_ns_to_s_map) = _strip_spaces(tok_text)

  if len(orig_ns_text) != len(tok_ns_text):
    if verbose_logging:
      logging.info("context and its tokenization differ in length without spaces: %r vs %r",
                   orig_ns_text, tok_ns_text)
    return orig_text

  # Same length without spaces: the i-th non-space characters correspond, so map the
  # prediction's first and last characters through that alignment.
  tok_s_to_ns_map = {}
  for (i, tok_index) in tok_ns_to_s_map.items():
    tok_s_to_ns_map[tok_index] = i

  orig_start_position = orig_ns_to_s_map.get(tok_s_to_ns_map.get(start_position))
  if orig_start_position is None:
    if verbose_logging:
      logging.info("the prediction's first character has no place in the context")
    return orig_text

  orig_end_position = orig_ns_to_s_map.get(tok_s_to_ns_map.get(end_position))
  if orig_end_position is None:
    if verbose_logging:
      logging.info("the prediction's last character has no place in the context")
    return orig_text

  output_text = orig_text[orig_start_position:(orig_end_position + 1)]
  return output_text


def _get_best_indexes(logits, n_best_size):
  """Indexes of the `n_best_size` largest logits, largest first."""
  index_and_score = sorted(enumerate(logits), key=lambda x: x[1], reverse=True)
  return [index for index, _ in index_and_score[:n_best_size]]


def _compute_softmax(scores):
  """Softmax of a list of scores, as Python floats."""
  if not scores:
    return []

  max_score = max(scores)
  exp_scores = [math.exp(score - max_score) for score in scores]
  # A plain running sum, not sum(): Python 3.12's compensated float sum() can differ in the
  # last bit from the original's probabilities.
  total_sum = 0.0
  for score in exp_scores:
    total_sum += score
  return [score / total_sum for score in exp_scores]


def _padding_feature(max_seq_length):
  """A record that only fills the last prediction batch (unique_id 0 matches no real window):
  every batch has the same shape, so TPUs and XLA compile once and no real window is dropped."""
  zeros = [0] * max_seq_length
  return InputFeatures(0, -1, 0, [], {}, {}, zeros, zeros, zeros)


def _has_answers(dataset):
  return any(qa.get("answers") for article in dataset for paragraph in article["paragraphs"]
             for qa in paragraph["qas"])


# What main writes in --output_dir besides checkpoints and the TensorBoard folder train/.
_OUTPUTS = ("train.tf_record", "eval.tf_record", "predictions.json", "nbest_predictions.json",
            "null_odds.json", "eval_results.txt", "task.json")


def _validate_flags():
  """Flag values absl's bounds cannot judge alone."""
  if FLAGS.do_train and not FLAGS.train_file:
    raise fileio.InputError("--do_train needs --train_file")
  if FLAGS.do_predict and not FLAGS.predict_file:
    raise fileio.InputError("--do_predict needs --predict_file")
  if FLAGS.max_seq_length <= FLAGS.max_query_length + 3:
    raise fileio.InputError(f"--max_seq_length={FLAGS.max_seq_length} must be greater than "
                            f"--max_query_length={FLAGS.max_query_length} + 3")
  sliding_windows.check_stride(
      FLAGS.doc_stride, FLAGS.max_seq_length - FLAGS.max_query_length - 3,
      f"context tokens of a window (--max_seq_length={FLAGS.max_seq_length} - "
      f"--max_query_length={FLAGS.max_query_length} - 3)")
  if math.isnan(FLAGS.null_score_diff_threshold):
    raise fileio.InputError("--null_score_diff_threshold=nan compares false with every score; "
                            "give a number")


def _records_key(input_file, is_training, vocab_file, order="input"):
  """What a feature file is made from: reused only when all of it is unchanged."""
  return {"script": "run_squad", "input": fileio.file_signature(input_file),
          "vocab": fileio.file_signature(vocab_file), "is_training": is_training,
          **{name: FLAGS[name].value for name in ("do_lower_case", "max_seq_length", "doc_stride",
                                                  "max_query_length", "version_2_with_negative")},
          # Training questions are shuffled with the seed; prediction records are padded.
          "seed": FLAGS.seed if is_training else None, "order": order}


def main(_):
  settings = script_flags.settings(fine_tuning.Settings)
  with fine_tuning.run(settings, ("train", "predict")) as s:
    _validate_flags()
    out, init_checkpoint = s.output_dir, s.init_checkpoint
    has_checkpoint, config, tokenizer = fine_tuning.check_files_and_load(
        s, _OUTPUTS, [("train_file", FLAGS.train_file if s.do_train else None),
                      ("predict_file", FLAGS.predict_file if s.do_predict else None)],
        "SQuAD windows are pairs (question: segment 0, context: segment 1)")
    fine_tuning.task_record(out, "run_squad", has_checkpoint)
    fine_tuning.init_task_record(init_checkpoint, "run_squad",
                                 not s.do_train and not has_checkpoint)

    strategy = script_flags.strategy()
    train_examples = None
    if s.do_train:
      train_examples = read_squad_examples(FLAGS.train_file, is_training=True,
                                           version_2_with_negative=FLAGS.version_2_with_negative)
      # The record file is read through a 1000-record shuffle buffer; shuffling the questions
      # first mixes articles that a big file keeps far apart.
      random.Random(s.seed).shuffle(train_examples)
    # The steps count questions, not windows, as in the original.
    num_train_steps, num_warmup_steps, batch = fine_tuning.train_steps(
        s, train_examples, strategy, FLAGS.train_file)
    if s.do_predict:
      # Read before any training, so that a bad predict file does not cost a training run.
      predict_examples = read_squad_examples(FLAGS.predict_file, is_training=False,
                                             version_2_with_negative=FLAGS.version_2_with_negative)
    model, optimizer, trainer, init_fn = fine_tuning.build_trainer(
        s, strategy, lambda: modeling.BertSpanLabeler(config, script_flags.compute_dtype()),
        modeling.squad_losses, num_train_steps, num_warmup_steps, has_checkpoint)

    def dev_evaluation():
      """The SQuAD scores of the model as it is now on --predict_file, as eval_* metrics."""
      scores = predict(s, trainer, tokenizer, int(optimizer.iterations.numpy()),
                       predict_examples, write_outputs=False)
      return {f"eval_{k}": float(v) for k, v in scores.items()}

    # SQuAD's dev set is the predict file: evaluating during training needs it read, with answers.
    if s.eval_every_steps is not None and (not s.do_predict or not _has_answers(
        fileio.load_json(FLAGS.predict_file, "SQuAD file")["data"])):
      raise fileio.InputError("--eval_every_steps scores the answers to --predict_file during "
                              "training: add --do_predict with a --predict_file that has answers")
    names = (("exact", "f1", "best_exact", "best_f1", "HasAns_exact", "HasAns_f1", "NoAns_exact",
              "NoAns_f1") if FLAGS.version_2_with_negative else ("exact_match", "f1"))
    evaluate = fine_tuning.eval_during_training(s, trainer, dev_evaluation, names)
    if s.do_train:
      train_file = os.path.join(out, "train.tf_record")

      def write_train_records():
        with tfrecord_io.ExampleWriter(train_file) as writer:
          convert_examples_to_features(train_examples, tokenizer, s.max_seq_length,
                                       FLAGS.doc_stride, FLAGS.max_query_length, is_training=True,
                                       output_fn=lambda f: writer.write(squad_record(f, True)))
        logging.info("%s: %d windows", train_file, writer.count)

      fileio.build_unless_current(train_file, _records_key(FLAGS.train_file, True, s.vocab_file),
                                  write_train_records)
      fine_tuning.write_task_record(out, "run_squad")
      fine_tuning.write_model_files(out, config, s.vocab_file)
      logging.info("Training on %d questions, %d steps (%d warm-up), batch %d",
                   len(train_examples), num_train_steps, num_warmup_steps, s.train_batch_size)
      del train_examples
      # Full-length batches: the span softmax of the training loss runs over every position.
      fine_tuning.train_on_records(s, trainer, train_file, feature_spec(s.max_seq_length, True),
                                   batch, num_train_steps, init_fn, cut_batches=False,
                                   buffer=1000, evaluate=evaluate)
    else:
      trainer.restore_or_initialize(init_fn, unused=("bert/pooler/",))

    if s.do_predict:
      # The best checkpoint's weights when one was kept (--keep_best_checkpoint_metric).
      predict(s, trainer, tokenizer, fine_tuning.evaluated_step(s, trainer, optimizer),
              predict_examples)


def predict(settings, trainer, tokenizer, global_step, examples, write_outputs=True):
  """Answers --predict_file (its `examples`) into output_dir; scores the answers when the file
  has gold ones. Without `write_outputs` (evaluation during training) only the scores are
  returned."""
  features = []
  # The windows are needed in memory to map the logits back to text, records or not.
  convert_examples_to_features(examples, tokenizer, FLAGS.max_seq_length, FLAGS.doc_stride,
                               FLAGS.max_query_length, is_training=False,
                               output_fn=features.append)
  predict_file = os.path.join(FLAGS.output_dir, "eval.tf_record")
  # With dynamic padding the windows are written shortest first, and each batch is cut after its
  # longest: a question over a short paragraph no longer costs max_seq_length positions.
  by_length = fine_tuning.pad_to_longest(settings, trainer.strategy)
  order = (input_pipeline.length_order([sum(f.input_mask) for f in features]) if by_length
           else range(len(features)))

  def write_records(padded_to):
    padding = [_padding_feature(FLAGS.max_seq_length)] * (-len(features) % padded_to)
    tfrecord_io.write_examples(predict_file, (squad_record(f, False) for f in itertools.chain(
        (features[i] for i in order), padding)))

  logging.info("Predicting %d questions (%d windows)", len(examples), len(features))
  results = []
  for outputs in fine_tuning.predict(
      trainer, predict_file, _records_key(FLAGS.predict_file, False, settings.vocab_file,
                                          "length" if by_length else "input"),
      write_records, len(features), feature_spec(FLAGS.max_seq_length, False),
      FLAGS.predict_batch_size, "predict_batch_size", by_length, ["start_logits", "end_logits"]):
    for unique_id, start, end, mask in zip(outputs["unique_ids"], outputs["start_logits"],
                                           outputs["end_logits"], outputs["input_mask"]):
      if unique_id:
        # Cut batches leave a varying tail of padding positions; keeping only the window's own
        # tokens makes the n-best candidates independent of the batching (padding positions can
        # never be answers; at full length they can only take n-best slots, as in the original).
        length = int(mask.sum()) if by_length else len(start)
        # Python floats: the n-best probabilities are then computed in double precision.
        results.append(RawResult(int(unique_id), start[:length].tolist(), end[:length].tolist()))

  # Under multi_worker_mirrored every worker has the results; the chief writes them.
  output = lambda name: (os.path.join(FLAGS.output_dir, name)
                         if trainer.is_chief and write_outputs else None)
  predictions, _, scores_diff = write_predictions(
      examples, features, results, FLAGS.n_best_size, FLAGS.max_answer_length,
      FLAGS.do_lower_case, output("predictions.json"), output("nbest_predictions.json"),
      output("null_odds.json"), version_2_with_negative=FLAGS.version_2_with_negative,
      null_score_diff_threshold=FLAGS.null_score_diff_threshold,
      verbose_logging=FLAGS.verbose_logging)

  dataset = fileio.load_json(FLAGS.predict_file, "SQuAD file")["data"]
  if not _has_answers(dataset):
    logging.info("%s has no answers: predictions written, nothing to score", FLAGS.predict_file)
    return None
  if FLAGS.version_2_with_negative:
    scores = metrics.evaluate_v2(dataset, predictions, na_probs=scores_diff)
  else:
    scores = metrics.evaluate_v1(dataset, predictions)
  summary = {k: float(v) for k, v in scores.items()}
  summary.update(global_step=global_step, eval_examples=len(examples))
  if trainer.is_chief and write_outputs:
    training.write_eval_results(output("eval_results.txt"), summary)
  return scores


def cli():
  """The command line: `python run_squad.py` and the `bert-run-squad` command."""
  define_flags()
  commands.run_main(main)
