"""Exports SavedModels for serving and TF Hub: encoder, text preprocessor, classifier, SQuAD,
sentence embedder.

Five kinds of SavedModel, chosen with --model_type, each loadable with `tf.saved_model.load`,
`hub.load` and `hub.KerasLayer`, and runnable with `saved_model_cli run`:

* encoder: the BERT encoder in the TF Hub BERT convention. Called with a dict of int32
  [batch, seq] tensors `input_word_ids`, `input_mask`, `input_type_ids` (any batch and length),
  it returns `pooled_output`, `sequence_output` and `encoder_outputs` (every layer's output).
  The vocab rides along as the asset `vocab_file` and the casing as the variable `do_lower_case`,
  as on TF Hub, and the variables keep their original checkpoint names, so fine-tuning code can
  take the weights back by name (run_classifier.py --hub_module_handle).
* preprocessor: raw strings -> those three inputs, in the graph. Exactly tokenization.py's
  FullTokenizer and run_classifier's [CLS] a [SEP] b [SEP] layout and truncation (see
  graph_tokenization.py for how the Unicode rules are reproduced with TF ops). Its `tokenize`
  and `bert_pack_inputs` follow TF Hub's BERT preprocessors, for sentence pairs.
* classifier: a fine-tuned run_classifier.py model whose `serving_default` takes raw text
  (`text_a`, plus `text_b` for sentence-pair tasks) and returns the label, its id and the
  probabilities of every label (or `score` for regression). A multi-label model
  (`run_classifier --multi_label`, goemotions) returns each label's sigmoid probability,
  `predicted` (0/1 per label, above its threshold: the tuned thresholds.json of the run when it
  is this checkpoint's, else 0.5) and `label`, the predicted labels joined ("joy,love"; "" none).
* embedder: raw strings (`text`) -> sentence vectors (`embedding`, [batch, hidden] float32): the
  encoder's last layer pooled over the real tokens as --pooling says (mean by default; cls, max)
  and, with --normalize, scaled to unit length: sentence-transformers' encode() for a model
  such as all-MiniLM-L6-v2 (extract_features.py --pooling gives the same vectors). Texts longer
  than --max_seq_length are truncated. It tokenizes as the original does, so "[CLS]" written in
  a text is split into pieces (HuggingFace reads it as the token).
* squad: a fine-tuned run_squad.py model whose `serving_default` takes `question` and `context`
  and returns run_squad.py's answer over the whole context: the context is read in windows
  --doc_stride tokens apart, the best span over all of them is chosen by run_squad's rules
  (--n_best_size, --max_answer_length, the max-context window), and the outputs are its text
  (run_squad's projection onto the context), score (start + end logit), window and start/end
  positions in that window's input sequence. SQuAD 2.0's no-answer is not predicted.

Only core TensorFlow ops are in the graphs, so the models load wherever TensorFlow does: TF
Serving, `saved_model_cli`, a Python without tensorflow-text. The fine-tuned models carry the
preprocessing inside them, so clients send text.

Every SavedModel is written to a temporary directory beside --export_dir and renamed into place
when complete, so an interrupted export never leaves a half-written model under its final name.
An existing --export_dir is replaced only when it holds an earlier SavedModel (--overwrite forces
it); one that is or holds an input (the checkpoint, config or vocab) is always refused.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import json
import os
import tempfile

import numpy as np
import tensorflow as tf
from absl import flags
from absl import logging

from bert_tf2 import checkpoints
from bert_tf2 import fine_tuning
from bert_tf2 import graph_tokenization
from bert_tf2 import litert
from bert_tf2 import modeling
from bert_tf2 import run_dir
from bert_tf2 import script_flags
from bert_tf2 import sliding_windows
from bert_tf2 import tokenization

FLAGS = flags.FLAGS

MODEL_TYPES = ("encoder", "preprocessor", "classifier", "squad", "embedder")


def define_flags():
  """The flags of export_model.py: its own, then the shared groups (script_flags)."""
  script_flags.define_export_dir_flag()
  flags.DEFINE_enum("model_type", "encoder", list(MODEL_TYPES),
                    "What to export (see the module docstring).")
  flags.DEFINE_enum("format", "saved_model", ["saved_model", "litert"],
                    "saved_model: a TensorFlow SavedModel (text in for the fine-tuned kinds). "
                    "litert: a LiteRT (TFLite) model directory for CPU serving, token ids in "
                    "(encoder, embedder, classifier; see litert.py), run by extract_features.py "
                    "and run_classifier.py --litert_model.")
  flags.DEFINE_enum("quantize", "none", ["none", "int8"],
                    "--format=litert: int8 stores the matmul weights as int8 (dynamic-range "
                    "quantization: a quarter of the size, several times faster on CPU).")
  script_flags.define_overwrite_flag()
  # also: a fine-tuning --output_dir (its best checkpoint when it kept one, else its latest)
  script_flags.define_checkpoint_flags()
  script_flags.define_text_flags()  # --vocab_file default: vocab.txt beside --init_checkpoint
  script_flags.define_max_seq_length(128)  # the length the preprocessing pads to
  script_flags.define_labels_flag()
  script_flags.define_regression_flag()
  script_flags.define_multi_label_flag()
  flags.DEFINE_bool("text_pairs", False,
                    "classifier: serving_default takes text_a and text_b (sentence-pair task); "
                    "the `pairs` signature takes both in any case. Default: what the task.json "
                    "of the fine-tuning run beside --init_checkpoint says (also for --labels "
                    "and --regression), else false.")
  script_flags.define_squad_flags()
  script_flags.define_doc_stride_flag()  # squad: see _fine_tuned_module
  script_flags.define_pooling_flags()  # embedder (its default pooling: mean)


# ----------------------------------------------------------------------------------------------
# The exported modules.


def _int_inputs_spec():
  return {name: tf.TensorSpec([None, None], tf.int32, name=name)
          for name in ("input_word_ids", "input_mask", "input_type_ids")}


class _SavedModelRoot(tf.Module):
  """Root object of an exported SavedModel, with what TF Hub's reusable-SavedModel API reads.

  hub.KerasLayer takes the weights from the loaded object's `variables`, `trainable_variables`
  and `regularization_losses` attributes. tf.Module computes the first two as properties, which
  a SavedModel does not keep, so they are stored here as plain lists (shadowing the properties).
  """
  variables = None
  trainable_variables = None
  regularization_losses = None

  def _set_reusable_attributes(self, modules):
    variables = [v for m in modules for v in m.variables]
    self.variables = variables
    self.trainable_variables = [v for v in variables if v.trainable]
    self.regularization_losses = []

  def _set_tokenization_info(self, vocab_file, do_lower_case):
    # As TF Hub's BERT SavedModels: what a user needs to tokenize text for this model.
    self.vocab_file = tf.saved_model.Asset(vocab_file)
    self.do_lower_case = tf.Variable(do_lower_case, trainable=False, name="do_lower_case")


def _encoder_outputs(bert, inputs, training):
  outputs = bert(inputs["input_word_ids"], inputs["input_mask"], inputs["input_type_ids"],
                 training=training)
  return {
      "pooled_output": outputs["pooled_output"],
      "sequence_output": outputs["sequence_output"],
      "encoder_outputs": list(outputs["encoder_outputs"]),
      "default": outputs["pooled_output"],
  }


class EncoderModule(_SavedModelRoot):
  """The encoder SavedModel: `module(inputs_dict, training=False)` -> outputs dict."""

  def __init__(self, bert, vocab_file, do_lower_case, config_file):
    super().__init__(name="encoder")
    self.bert = bert
    self.bert_config_file = tf.saved_model.Asset(config_file)
    self._set_tokenization_info(vocab_file, do_lower_case)
    self._set_reusable_attributes([bert])

  @tf.function(autograph=False)
  def __call__(self, inputs, training=False):
    return _encoder_outputs(self.bert, inputs, training)

  @tf.function(input_signature=[_int_inputs_spec()], autograph=False)
  def serve(self, inputs):
    # Signatures return flat dicts of tensors: the per-layer outputs are stacked on a new first
    # axis, [num_layers, batch, seq, hidden].
    outputs = _encoder_outputs(self.bert, inputs, False)
    outputs["encoder_outputs"] = tf.stack(outputs["encoder_outputs"])
    return outputs

  def signatures(self):
    specs = _int_inputs_spec()
    for training in (False, True):
      self.__call__.get_concrete_function(specs, training=training)
    return {"serving_default": self.serve.get_concrete_function()}


class EmbedderModule(_SavedModelRoot):
  """Sentence vectors of raw text: `module(text)` / serving_default -> {"embedding": [batch,
  hidden] float32} (modeling.pool_tokens of the last layer)."""

  def __init__(self, bert, vocab_file, do_lower_case, seq_length, pooling, normalize):
    super().__init__(name="embedder")
    self.bert = bert
    self.preprocessor = graph_tokenization.TextPreprocessor(vocab_file, do_lower_case, seq_length)
    self.pooling = pooling
    self.normalize = normalize
    self.pooling_name = tf.Variable(pooling, trainable=False, name="pooling")
    self.normalized = tf.Variable(normalize, trainable=False, name="normalize")
    self._set_tokenization_info(vocab_file, do_lower_case)
    self._set_reusable_attributes([bert])

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")], autograph=False)
  def __call__(self, text):
    features = self.preprocessor.encode(text)
    outputs = self.bert(features["input_word_ids"], features["input_mask"],
                        features["input_type_ids"])
    return {"embedding": modeling.pool_tokens(outputs["sequence_output"],
                                              features["input_mask"], self.pooling,
                                              self.normalize)}

  def signatures(self):
    return {"serving_default": self.__call__.get_concrete_function()}


class PreprocessorModule(_SavedModelRoot):
  """The preprocessing SavedModel (TF Hub's BERT preprocessor layout).

  - `module(text)`: [batch] strings -> the encoder inputs, [batch, seq_length] int32 each;
  - `module.tokenize(text)`: [batch] strings -> int32 piece ids [batch, (words), (pieces)];
  - `module.bert_pack_inputs([ids_a, ids_b], seq_length)`: one or two tokenized segments ->
    the encoder inputs;
  - signatures `serving_default` (text) and `pairs` (text_a, text_b).
  """

  def __init__(self, vocab_file, do_lower_case, seq_length):
    super().__init__(name="preprocessor")
    self.preprocessor = graph_tokenization.TextPreprocessor(vocab_file, do_lower_case, seq_length)
    self.seq_length = tf.Variable(seq_length, trainable=False, name="seq_length")
    self._set_tokenization_info(vocab_file, do_lower_case)
    self._set_reusable_attributes([])

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
  def tokenize(self, text):
    return self.preprocessor.tokenize_text(text)

  @tf.function(autograph=False)
  def bert_pack_inputs(self, inputs, seq_length=None):
    if seq_length is None:
      seq_length = self.seq_length
    return self.preprocessor.pack(list(inputs), seq_length)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
  def __call__(self, text):
    return self.bert_pack_inputs([self.tokenize(text)])

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text_a"),
                                tf.TensorSpec([None], tf.string, name="text_b")],
               autograph=False)
  def pairs(self, text_a, text_b):
    return self.bert_pack_inputs([self.tokenize(text_a), self.tokenize(text_b)])

  def signatures(self):
    ragged = tf.RaggedTensorSpec([None, None, None], tf.int32, ragged_rank=2)
    for count in (1, 2):
      self.bert_pack_inputs.get_concrete_function([ragged] * count)
      self.bert_pack_inputs.get_concrete_function([ragged] * count,
                                                  tf.TensorSpec([], tf.int32))
    return {"serving_default": self.__call__.get_concrete_function(),
            "pairs": self.pairs.get_concrete_function()}


class ClassifierModule(_SavedModelRoot):
  """A fine-tuned classifier on raw text: returns the label, its id and the probabilities.

  A multi-label one returns each label's probability (independent sigmoids), `predicted` (0/1 per
  label: probability above the label's threshold) and `label`, the predicted labels joined by
  `label_delimiter` ("" for none).
  """

  def __init__(self, model, vocab_file, do_lower_case, seq_length, labels, is_regression,
               text_pairs, multi_label=False, thresholds=None, label_delimiter=","):
    super().__init__(name="classifier")
    self.model = model
    self.preprocessor = graph_tokenization.TextPreprocessor(vocab_file, do_lower_case, seq_length)
    self.label_names = tf.Variable(labels or [""], trainable=False, name="labels")
    self.is_regression = is_regression
    self.multi_label = multi_label
    if multi_label:
      values = [0.5] * len(labels) if thresholds is None else list(thresholds)
      self.thresholds = tf.Variable(values, dtype=tf.float32, trainable=False, name="thresholds")
      self.label_delimiter = label_delimiter
    self.text_pairs = text_pairs
    self._set_tokenization_info(vocab_file, do_lower_case)
    self._set_reusable_attributes([model])

  def _classify(self, text_a, text_b=None):
    features = self.preprocessor.encode(text_a, text_b)
    logits = self.model({"input_ids": features["input_word_ids"],
                         "input_mask": features["input_mask"],
                         "segment_ids": features["input_type_ids"]})["logits"]
    if self.is_regression:
      return {"score": logits[:, 0], "logits": logits}
    if self.multi_label:
      probabilities = tf.sigmoid(tf.cast(logits, tf.float32))
      predicted = probabilities > self.thresholds
      names = tf.ragged.boolean_mask(
          tf.broadcast_to(self.label_names, tf.shape(predicted)), predicted)
      return {"label": tf.strings.reduce_join(names, axis=-1, separator=self.label_delimiter),
              "predicted": tf.cast(predicted, tf.int32), "probabilities": probabilities,
              "logits": logits}
    probabilities = tf.nn.softmax(logits)
    label_id = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return {"label": tf.gather(self.label_names, label_id), "label_id": label_id,
            "probabilities": probabilities, "logits": logits}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text_a")],
               autograph=False)
  def __call__(self, text_a):
    return self._classify(text_a)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text_a"),
                                tf.TensorSpec([None], tf.string, name="text_b")],
               autograph=False)
  def pairs(self, text_a, text_b):
    return self._classify(text_a, text_b)

  def signatures(self):
    single = self.__call__.get_concrete_function()
    pairs = self.pairs.get_concrete_function()
    return {"serving_default": pairs if self.text_pairs else single, "single": single,
            "pairs": pairs}


_SQUAD_WHITESPACE = "[ \t\r\n\u202f]"  # run_squad's _is_whitespace.
# Windows the SQuAD model's encoder reads at a time: its memory is that of this many sequences
# whatever the length of the contexts it is given (the rest of a call is linear in them).
_SQUAD_WINDOWS_PER_RUN = 32
_SPACE = 32


def _context_windows(query_len, doc_len, seq_length, doc_stride):
  """run_squad's windows over each context (sliding_windows.spans) in TF ops: (example, index,
  start, length) of each window, contexts' windows in a row, and the number of windows of each
  context. A context of `doc_len` tokens after a question of `query_len` has windows of
  seq_length - 3 - query_len tokens starting doc_stride apart, the last one ending at its last
  token; an empty context has one empty window (run_squad none)."""
  max_tokens = seq_length - 3 - query_len
  step = tf.minimum(doc_stride, max_tokens)
  count = tf.where(doc_len > max_tokens, 1 + (doc_len - max_tokens + step - 1) // step, 1)
  example = tf.repeat(tf.range(tf.size(count)), count)
  index = tf.ragged.range(count).flat_values
  start = index * tf.gather(step, example)
  length = tf.minimum(tf.gather(max_tokens, example), tf.gather(doc_len, example) - start)
  return example, index, start, length, count


def _max_context(example, index, start, length, count, offset, seq_length, reach):
  """[windows, seq_length]: whether each position of each window is a context token that this
  window reads with the most context of all its context's windows (sliding_windows.max_context,
  the same float64 score, the first window on a tie); `offset` is each window's first context
  position. Only the `reach` windows on either side of a window can share a token with it
  (windows start a stride apart and hold at most seq_length tokens), so each window is compared
  with those 2 * reach + 1 only: work and memory linear in the number of windows, where
  comparing every pair of a context's windows grew with the square of a long context."""
  positions = tf.range(seq_length)[None, :] - offset[:, None]  # in the window's context tokens
  in_window = (positions >= 0) & (positions < length[:, None])
  token = start[:, None] + positions  # [windows, seq]: the context token at each position
  # The neighbours of each window in its context, by their index there: [windows, 2 reach + 1].
  ranks = index[:, None] + tf.range(-reach, reach + 1)[None, :]
  exists = (ranks >= 0) & (ranks < tf.gather(count, example)[:, None])
  other = tf.where(exists, tf.range(tf.size(example))[:, None] - index[:, None] + ranks, 0)
  other_start = tf.gather(start, other)[:, None, :]
  other_length = tf.gather(length, other)[:, None, :]
  left = token[:, :, None] - other_start
  right = other_start + other_length - 1 - token[:, :, None]
  holds = exists[:, None, :] & (left >= 0) & (right >= 0)
  score = (tf.cast(tf.minimum(left, right), tf.float64)
           + tf.constant(0.01, tf.float64) * tf.cast(other_length, tf.float64))
  score = tf.where(holds, score, -np.inf)
  best = tf.reduce_max(score, axis=-1, keepdims=True)
  first_best = tf.reduce_min(tf.where(holds & tf.equal(score, best), ranks[:, None, :],
                                      tf.int32.max), -1)
  return in_window, in_window & tf.equal(first_best, index[:, None])


def _in_chunks(model, features, seq_length, chunk):
  """model(features) over the rows of `features` `chunk` at a time (tf.map_fn, one chunk after
  the other), so that the encoder's activations stay those of `chunk` windows however long the
  contexts of a call are; the outputs are as of one call."""
  rows = tf.shape(features["input_ids"])[0]
  padded = (rows + chunk - 1) // chunk * chunk
  batches = {name: tf.reshape(tf.pad(value, [[0, padded - rows], [0, 0]]),
                              [-1, chunk, seq_length])
             for name, value in features.items()}
  spec = {name: tf.TensorSpec([chunk, seq_length], tf.float32)
          for name in ("start_logits", "end_logits")}
  outputs = tf.map_fn(lambda batch: {name: tf.cast(value, tf.float32)
                                     for name, value in model(batch).items() if name in spec},
                      batches, fn_output_signature=spec, parallel_iterations=1)
  return {name: tf.reshape(value, [padded, seq_length])[:rows]
          for name, value in outputs.items()}


def _gather_or(values, indices, ok, default):
  """values[indices] where `ok`, else `default` (no index is read there: `values` may be empty)."""
  padded = tf.concat([values, tf.fill([1], tf.cast(default, values.dtype))], 0)
  return tf.gather(padded, tf.where(ok, indices, tf.size(values)))


def final_text(preprocessor, pieces, orig_text):
  """run_squad.get_final_text in TF ops, for a batch: the part of `orig_text` ([batch] strings,
  the whitespace words a span covers, joined by spaces) that the span's WordPiece tokens
  (`pieces`, [batch, (tokens)] strings) came from.

  As the original: the tokens joined with "##" pieces glued back are searched (first occurrence,
  in characters) in the basic-tokenized orig_text joined by spaces; both texts without spaces
  are aligned character by character, so the answer keeps the context's casing and accents and
  drops the partly covered words' other characters. When the search fails or the texts differ in
  length without spaces (accents, cleaned characters), orig_text whole.
  """
  batch = tf.shape(orig_text)[0]
  pred = tf.strings.reduce_join(pieces, axis=1, separator=" ")
  pred = tf.strings.regex_replace(tf.strings.regex_replace(pred, " ##", ""), "##", "")
  pred = tf.strings.regex_replace(tf.strings.strip(pred), " +", " ")
  tok = tf.strings.reduce_join(preprocessor.words(orig_text), axis=1, separator=" ")
  pred_len = tf.strings.length(pred, unit="UTF8_CHAR")
  tok_len = tf.strings.length(tok, unit="UTF8_CHAR")
  # str.find: the first start where the substring of pred's length is pred.
  candidates = tf.ragged.range(tf.maximum(tok_len - pred_len + 1, 0))
  rows = tf.cast(candidates.value_rowids(), tf.int32)
  match = tf.equal(tf.strings.substr(tf.gather(tok, rows), candidates.flat_values,
                                     tf.gather(pred_len, rows), unit="UTF8_CHAR"),
                   tf.gather(pred, rows))
  found = tf.math.unsorted_segment_min(tf.where(match, candidates.flat_values, tf.int32.max),
                                       rows, batch)
  end = found + pred_len - 1
  # Characters other than " " counted up to each position, in both texts.
  tok_chars = tf.strings.unicode_decode(tok, "UTF-8")
  orig_chars = tf.strings.unicode_decode(orig_text, "UTF-8")
  tok_kept = tf.cast(tf.not_equal(tok_chars, _SPACE), tf.int32)
  orig_kept = tf.not_equal(orig_chars, _SPACE)
  tok_count = tf.reduce_sum(tok_kept, axis=1)
  orig_positions = tf.ragged.boolean_mask(
      tf.ragged.range(tf.cast(orig_chars.row_lengths(), tf.int32)), orig_kept)
  ok = ((found < tf.int32.max) & (pred_len > 0)
        & tf.equal(tok_count, tf.cast(orig_positions.row_lengths(), tf.int32)))
  tok_starts = tf.cast(tok_chars.row_starts(), tf.int32)
  before = (tf.cumsum(tok_kept.flat_values, exclusive=True)
            - tf.repeat(tf.cumsum(tok_count, exclusive=True), tok_chars.row_lengths()))
  orig_starts = tf.cast(orig_positions.row_starts(), tf.int32)
  bounds = []
  for position in (found, end):
    ok &= tf.equal(_gather_or(tok_kept.flat_values, tok_starts + position, ok, 0), 1)
    bounds.append(_gather_or(orig_positions.flat_values,
                             orig_starts + _gather_or(before, tok_starts + position, ok, 0), ok,
                             0))
  return tf.where(ok, tf.strings.substr(orig_text, bounds[0], bounds[1] - bounds[0] + 1,
                                        unit="UTF8_CHAR"), orig_text)


def squad_doc_stride(seq_length, max_query_length, doc_stride=None):
  """The SQuAD model's --doc_stride: checked against the context tokens of a window, as
  run_squad.py checks it; by default run_squad's 128, or half a window's context tokens where
  they are no more than 128."""
  if seq_length <= max_query_length + 3:
    raise fileio.InputError(f"--max_seq_length={seq_length} must be above "
                            f"--max_query_length={max_query_length} + 3")
  context_tokens = seq_length - max_query_length - 3
  if doc_stride is None:
    return 128 if context_tokens > 128 else max(1, context_tokens // 2)
  sliding_windows.check_stride(
      doc_stride, context_tokens, f"context tokens of a window (--max_seq_length={seq_length} - "
      f"--max_query_length={max_query_length} - 3)")
  return doc_stride


class SquadModule(_SavedModelRoot):
  """A fine-tuned SQuAD model on raw text: question + context -> the answer run_squad.py predicts.

  As run_squad.py: the context is split into words, each word tokenized on its own, and read in
  windows [CLS] question [SEP] window [SEP] starting doc_stride tokens apart; the answer is the
  span with the highest start + end logit among each window's n_best_size best starts and ends,
  inside its context, at most max_answer_length tokens, starting at a token this window reads
  with the most context, and its text is the context's (get_final_text, `final_text`). SQuAD 2.0's
  no-answer is not predicted.
  """

  def __init__(self, model, vocab_file, do_lower_case, seq_length, max_query_length,
               max_answer_length, doc_stride=None, n_best_size=20):
    super().__init__(name="squad")
    doc_stride = squad_doc_stride(seq_length, max_query_length, doc_stride)
    self.model = model
    self.preprocessor = graph_tokenization.TextPreprocessor(vocab_file, do_lower_case, seq_length)
    self.seq_length = seq_length
    self.max_query_length = max_query_length
    self.max_answer_length = max_answer_length
    self.doc_stride = doc_stride
    self.n_best_size = min(n_best_size, seq_length)
    # Windows start at least min(doc_stride, their length) tokens apart, so a token is in at
    # most this many windows after the one that starts before it (the band _max_context reads).
    self.reach = -(-seq_length // doc_stride)
    vocab = tokenization.load_vocab(vocab_file)
    self._token_of_id = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(list(vocab.values()), tf.int32),
                                            tf.constant(list(vocab))), default_value="[UNK]")
    self._set_tokenization_info(vocab_file, do_lower_case)
    self._set_reusable_attributes([model])

  def _answer(self, question, context):
    pre = self.preprocessor
    query = pre.tokenize_text(question).merge_dims(1, 2)[:, :self.max_query_length]
    # [batch, (words)] -> [batch, (words), (pieces)]: each word of the context tokenized alone.
    words = tf.strings.split(tf.strings.regex_replace(context, _SQUAD_WHITESPACE, " "), " ")
    words = tf.ragged.boolean_mask(words, tf.not_equal(words, ""))
    pieces = pre.tokenize_text(words.flat_values).merge_dims(1, 2)
    doc = tf.RaggedTensor.from_row_splits(pieces, words.row_splits)
    word_of_token = doc.with_flat_values(
        tf.cast(doc.values.value_rowids(), tf.int32)).merge_dims(1, 2).flat_values  # Flat word.
    doc = doc.merge_dims(1, 2)
    doc_starts = tf.cast(doc.row_starts(), tf.int32)
    query_len = tf.cast(query.row_lengths(), tf.int32)
    example, index, start, length, count = _context_windows(
        query_len, tf.cast(doc.row_lengths(), tf.int32), self.seq_length, self.doc_stride)
    window_tokens = tf.ragged.range(start, start + length) + tf.gather(doc_starts, example)[:, None]
    features = pre.pack([tf.gather(query, example),
                         window_tokens.with_flat_values(tf.gather(doc.flat_values,
                                                                  window_tokens.flat_values))],
                        self.seq_length)
    outputs = _in_chunks(self.model, {"input_ids": features["input_word_ids"],
                                      "input_mask": features["input_mask"],
                                      "segment_ids": features["input_type_ids"]},
                         self.seq_length, _SQUAD_WINDOWS_PER_RUN)
    offset = tf.gather(query_len, example) + 2  # [CLS] question [SEP]
    in_window, max_context = _max_context(example, index, start, length, count, offset,
                                          self.seq_length, self.reach)
    # Each window's n_best_size best starts and ends among its own tokens (the original's
    # _get_best_indexes: the earlier position first on a tie, as top_k).
    real = tf.range(self.seq_length)[None, :] < tf.reduce_sum(features["input_mask"], 1)[:, None]
    best = [tf.math.top_k(tf.where(real, outputs[name], -np.inf), self.n_best_size).indices
            for name in ("start_logits", "end_logits")]
    logits = [tf.cast(tf.gather(outputs[name], indices, batch_dims=1), tf.float64)
              for name, indices in zip(("start_logits", "end_logits"), best)]
    span = best[1][:, None, :] - best[0][:, :, None]  # [window, start rank, end rank]
    allowed = (tf.gather(max_context, best[0], batch_dims=1)[:, :, None]
               & tf.gather(in_window, best[1], batch_dims=1)[:, None, :]
               & (span >= 0) & (span < self.max_answer_length))
    # Scores in run_squad's order (window, start rank, end rank): the first of the highest wins,
    # as its stable sort keeps it first.
    scores = tf.reshape(tf.where(allowed, logits[0][:, :, None] + logits[1][:, None, :],
                                 -np.inf), [-1])
    candidates = self.n_best_size**2
    owner = tf.repeat(example, candidates)
    batch = tf.size(count)
    top = tf.math.unsorted_segment_max(scores, owner, batch)
    has_answer = tf.math.unsorted_segment_max(tf.cast(tf.reshape(allowed, [-1]), tf.int32), owner,
                                              batch) > 0
    first = tf.math.unsorted_segment_min(
        tf.where(tf.equal(scores, tf.gather(top, owner)), tf.range(tf.size(scores)),
                 tf.int32.max), owner, batch)
    first = tf.where(has_answer, first, 0)
    window = first // candidates
    start_position = tf.gather_nd(best[0], tf.stack([window, first % candidates
                                                     // self.n_best_size], 1))
    end_position = tf.gather_nd(best[1], tf.stack([window, first % self.n_best_size], 1))
    # The span's context tokens (flat indexes), and the words they came from.
    to_token = tf.gather(start, window) - tf.gather(offset, window) + doc_starts
    first_token, last_token = to_token + start_position, to_token + end_position
    token_ids = tf.ragged.range(first_token, tf.where(has_answer, last_token + 1, first_token))
    tokens = token_ids.with_flat_values(self._token_of_id.lookup(
        tf.gather(doc.flat_values, token_ids.flat_values)))
    first_word = _gather_or(word_of_token, first_token, has_answer, 0)
    last_word = _gather_or(word_of_token, last_token, has_answer, -1)
    orig_text = tf.strings.reduce_join(
        tf.gather(words.flat_values, tf.ragged.range(first_word, last_word + 1)), axis=1,
        separator=" ")
    answer = final_text(pre, tokens, orig_text)
    return {"answer": tf.where(has_answer, answer, ""),
            "start_position": tf.where(has_answer, start_position, -1),
            "end_position": tf.where(has_answer, end_position, -1),
            "window": tf.where(has_answer, tf.gather(index, window), -1),
            "score": tf.where(has_answer, tf.cast(top, tf.float32), 0.0)}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question"),
                                tf.TensorSpec([None], tf.string, name="context")],
               autograph=False)
  def __call__(self, question, context):
    return self._answer(question, context)

  def signatures(self):
    return {"serving_default": self.__call__.get_concrete_function()}


# ----------------------------------------------------------------------------------------------
# Saving and loading.


# What tf.saved_model.save writes at the top of a SavedModel directory.
_SAVED_MODEL_ENTRIES = frozenset(("saved_model.pb", "fingerprint.pb", "variables", "assets",
                                  "assets.extra", "keras_metadata.pb"))


def is_saved_model_directory(path):
  """True when `path` holds a SavedModel and nothing else (so replacing it loses no user file):
  saved_model.pb, and only SavedModel entries beside it and variables.* files under variables/."""
  try:
    names = set(fileio.listdir(path))
    variables = os.path.join(path, "variables")
    if "variables" in names and (os.path.islink(variables) or not fileio.isdir(variables)):
      return False
    extra = [n for n in (fileio.listdir(variables) if "variables" in names else [])
             if not n.startswith("variables.")]
  except OSError:
    return False
  return "saved_model.pb" in names and names <= _SAVED_MODEL_ENTRIES and not extra


def _config_and_vocab_paths(init_checkpoint, bert_config_file=None, vocab_file=None):
  """(config path, vocab path): from the flags, else beside the checkpoint; nothing is read."""
  config_path = checkpoints.config_path(bert_config_file, init_checkpoint)
  vocab_path = vocab_file or (checkpoints.vocab_beside(init_checkpoint) if init_checkpoint
                              else None)
  if not vocab_path or not fileio.exists(vocab_path):
    raise fileio.InputError("--vocab_file is required (no vocab.txt beside --init_checkpoint)")
  fileio.check_file(vocab_path, "vocab file")
  return config_path, vocab_path


def find_config_and_vocab(init_checkpoint, bert_config_file=None, vocab_file=None):
  """(BertConfig, config path, vocab path): from the flags, else beside the checkpoint."""
  config_path, vocab_path = _config_and_vocab_paths(init_checkpoint, bert_config_file, vocab_file)
  return modeling.BertConfig.from_json_file(config_path), config_path, vocab_path


def _config_file_for_asset(config, staging_dir):
  """The config as an original-format bert_config.json file to ship as an asset."""
  path = run_dir.config_file(staging_dir)
  with open(path, "w", encoding="utf-8") as f:
    f.write(config.to_json_string())
  return path


def export(model_type, export_dir, init_checkpoint=None, bert_config_file=None, vocab_file=None,
           do_lower_case=True, max_seq_length=128, labels=None, regression=None,
           text_pairs=None, max_query_length=64, max_answer_length=30, doc_stride=None,
           n_best_size=20, overwrite=False, pooling="mean", normalize=False, multi_label=None,
           export_format="saved_model", quantize="none"):
  """Builds the `model_type` module from a checkpoint and writes it to `export_dir`.

  A fine-tuning run's output directory (or a checkpoint in it) needs nothing else: its
  bert_config.json and vocab.txt are found beside the checkpoint, and `labels`, `regression` and
  `text_pairs` and `multi_label` (None: not given) default to what its task.json says (else: the
  label count of the checkpoint, False, False, False). A multi-label classifier predicts a label
  above its threshold: those run_classifier --tune_thresholds left beside the checkpoint for the
  same step (thresholds.json), else 0.5.

  Every input is checked and `export_dir` is vetted before the model is built: it must not be or
  hold an input, and an existing one is replaced only if it is an earlier SavedModel (or with
  `overwrite`). The SavedModel is written to a staging directory beside it and renamed into place
  when complete, so an error, Ctrl-C, SIGTERM or a full disk leaves the previous export intact.

  `export_format` "litert": a LiteRT model directory instead (litert.py; `quantize` "int8" for
  int8 weights), of an encoder, embedder or classifier.
  """
  if not export_dir:
    raise fileio.InputError("--export_dir is required")
  if model_type not in MODEL_TYPES:
    raise fileio.InputError(f"unknown --model_type={model_type}")
  if export_format == "litert" and model_type not in litert.KINDS:
    raise fileio.InputError(
        f"--format=litert exports --model_type={', '.join(litert.KINDS)}, not {model_type}: "
        "the LiteRT models take token ids, and the "
        + ("preprocessor is tokenization itself" if model_type == "preprocessor" else
           "SQuAD model's windows and answer text need TensorFlow string ops"))
  if quantize != "none" and export_format != "litert":
    raise fileio.InputError(f"--quantize={quantize} is for --format=litert")
  if model_type == "embedder" and pooling not in modeling.POOLINGS:
    raise fileio.InputError(f"--pooling={pooling}: the embedder pools with one of "
                            f"{', '.join(modeling.POOLINGS)}")
  if normalize and model_type != "embedder":
    raise fileio.InputError(f"--normalize is for --model_type=embedder, not {model_type}")
  if model_type != "encoder" and max_seq_length < 3:
    raise fileio.InputError(f"--max_seq_length={max_seq_length} is too small for [CLS] x [SEP]")
  fileio.check_distinct(labels, "labels", "label")
  if model_type == "squad":
    squad_doc_stride(max_seq_length, max_query_length, doc_stride)
  if model_type == "preprocessor":
    if not vocab_file and init_checkpoint:
      vocab_file = checkpoints.vocab_beside(init_checkpoint)
    fileio.check_file(vocab_file, "vocab file (--vocab_file)")
    inputs = [("vocab_file", vocab_file)]
  else:
    if not init_checkpoint:
      raise fileio.InputError(f"--init_checkpoint is required for --model_type={model_type}")
    config_path, vocab_path = _config_and_vocab_paths(init_checkpoint, bert_config_file,
                                                      vocab_file)
    inputs = [("init_checkpoint", checkpoints.checkpoint_files(init_checkpoint)),
              ("bert_config_file", config_path), ("vocab_file", vocab_path)]
    # Read now, before export_dir is locked: a bad config is its own one-line error, even while
    # another export holds the lock (CI saw a lock error in its place).
    modeling.BertConfig.from_json_file(config_path)
  with fileio.no_new_empty_directories(export_dir):  # It appears only when complete.
    fileio.check_outputs(replaced_directories=[("export_dir", export_dir)], inputs=inputs)
  replaceable = (litert.is_litert_directory if export_format == "litert"
                 else is_saved_model_directory)
  with fileio.atomic_directory(export_dir, replaceable=replaceable,
                               overwrite=overwrite, flag="export_dir") as staging:
    with tempfile.TemporaryDirectory() as scratch:
      if model_type == "preprocessor":
        module = PreprocessorModule(vocab_file, do_lower_case, max_seq_length)
      else:
        module = _fine_tuned_module(model_type, init_checkpoint, config_path, vocab_path, scratch,
                                    do_lower_case, max_seq_length, labels, regression,
                                    text_pairs, max_query_length, max_answer_length, doc_stride,
                                    n_best_size, pooling, normalize, multi_label)
      try:
        if export_format == "litert":
          _write_litert(module, model_type, staging, quantize, init_checkpoint, config_path,
                        vocab_path, do_lower_case, max_seq_length)
        else:
          tf.saved_model.save(module, staging, signatures=module.signatures())
      except (OSError, tf.errors.OpError) as e:  # A full disk, a quota: TF names only the file.
        reason = (getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)).strip()
        reason = reason.splitlines()[0] if reason else type(e).__name__
        what = "LiteRT model" if export_format == "litert" else "SavedModel"
        raise fileio.InputError(f"--export_dir={export_dir}: cannot write the {what}, "
                                f"nothing was replaced: {reason}") from None
  export_dir = fileio.absolute(export_dir)
  logging.info("Wrote %s %s", "LiteRT model" if export_format == "litert" else "SavedModel",
               export_dir)
  return export_dir


def _litert_function(module, model_type):
  """(the ids-in tf.function of `module` that litert.convert takes, the tf.Module of its
  variables (not the module, whose text preprocessing tables LiteRT cannot hold), its
  description)."""
  if model_type == "classifier":
    model = module.model

    @tf.function(input_signature=litert.input_signature(), autograph=False)
    def classify(input_word_ids, input_mask, input_type_ids):
      logits = model({"input_ids": input_word_ids, "input_mask": input_mask,
                      "segment_ids": input_type_ids})["logits"]
      return {"logits": tf.cast(logits, tf.float32)}
    info = {"labels": [] if module.is_regression else
                      [label.decode("utf-8") for label in module.label_names.numpy().tolist()],
            "regression": module.is_regression, "multi_label": module.multi_label,
            "text_pairs": module.text_pairs, "classifier_pooling": model.pooling}
    if module.multi_label:
      info.update(thresholds=module.thresholds.numpy().tolist(),
                  label_delimiter=module.label_delimiter)
    return classify, model, info
  bert = module.bert
  if model_type == "embedder":
    pooling, normalize = module.pooling, module.normalize

    @tf.function(input_signature=litert.input_signature(), autograph=False)
    def embed(input_word_ids, input_mask, input_type_ids):
      outputs = bert(input_word_ids, input_mask, input_type_ids)
      return {"embedding": modeling.pool_tokens(outputs["sequence_output"], input_mask, pooling,
                                                normalize)}
    return embed, bert, {"pooling": pooling, "normalize": normalize}

  @tf.function(input_signature=litert.input_signature(), autograph=False)
  def encode(input_word_ids, input_mask, input_type_ids):
    outputs = bert(input_word_ids, input_mask, input_type_ids)
    return {"sequence_output": outputs["sequence_output"],
            "pooled_output": outputs["pooled_output"],
            "encoder_outputs": tf.stack(outputs["encoder_outputs"], axis=1)}
  return encode, bert, {}


def _write_litert(module, model_type, staging, quantize, init_checkpoint, config_path, vocab_path,
                  do_lower_case, max_seq_length):
  """A LiteRT model directory of `module` in `staging` (litert.py)."""
  function, owner, info = _litert_function(module, model_type)
  model = litert.convert(function, owner, quantize)
  with open(os.path.join(staging, litert.MODEL_FILE), "wb") as f:
    f.write(model)
  config = modeling.BertConfig.from_json_file(config_path)
  with open(run_dir.config_file(staging), "w", encoding="utf-8") as f:
    f.write(config.to_json_string())
  fileio.copy_file(vocab_path, run_dir.vocab_file(staging))
  info = {"kind": model_type, "quantize": quantize, "do_lower_case": do_lower_case,
          "max_seq_length": max_seq_length, "init_checkpoint": fileio.absolute(init_checkpoint),
          "global_step": checkpoints.global_step(init_checkpoint),
          "model_sha256": litert.sha256(model), **info}
  with open(os.path.join(staging, litert.INFO_FILE), "w", encoding="utf-8") as f:
    json.dump(info, f, indent=2)
    f.write("\n")


def _fine_tuned_module(model_type, init_checkpoint, config_path, vocab_path, scratch,
                       do_lower_case, max_seq_length, labels, regression, text_pairs,
                       max_query_length, max_answer_length, doc_stride, n_best_size,
                       pooling=None, normalize=False, multi_label=None):
  """The encoder, embedder, classifier or SQuAD module with the checkpoint's weights."""
  tokenization.validate_case_matches_checkpoint(do_lower_case, init_checkpoint)
  config = modeling.BertConfig.from_json_file(config_path)
  if tokenization.is_sentencepiece_model(vocab_path):
    # The SavedModels tokenize in the graph with WordPiece (graph_tokenization).
    raise fileio.InputError(
        f"--vocab_file={vocab_path} is a SentencePiece model: the exported models tokenize "
        "raw strings in the graph with a WordPiece vocab.txt only (the scripts read either)")
  tokenization.check_vocab_fits(len(tokenization.load_vocab(vocab_path)), config, vocab_path,
                                config_path)
  if model_type != "encoder":
    checkpoints.check_seq_length(max_seq_length, config, config_path)
  if model_type in ("encoder", "embedder"):
    holder = checkpoints.EncoderHolder(config, name="holder")
    checkpoints.init_from_checkpoint(holder, init_checkpoint, require_all=True)
    if model_type == "embedder":
      return EmbedderModule(holder.bert, vocab_path, do_lower_case, max_seq_length, pooling,
                            normalize)
    return EncoderModule(holder.bert, vocab_path, do_lower_case,
                         _config_file_for_asset(config, scratch))
  if model_type in ("classifier", "squad"):
    labels, regression, text_pairs, record = _task_defaults(model_type, init_checkpoint, labels,
                                                            regression, text_pairs)
  if model_type == "classifier":
    num_labels = 1 if regression else (len(labels) if labels else
                                       checkpoints.num_classifier_outputs(init_checkpoint))
    if not num_labels:
      raise fileio.InputError(f"give --labels: {init_checkpoint} has no classifier output_bias "
                              "to count the labels from")
    if regression:
      labels = []
    elif not labels:
      labels = [str(i) for i in range(num_labels)]
    pooling = fine_tuning.classifier_pooling(record,
                                             checkpoints.checkpoint_directory(init_checkpoint))
    model = modeling.BertClassifier(config, num_labels, pooling=pooling)
    report = checkpoints.init_from_checkpoint(model, init_checkpoint)
    if report.missing:
      raise fileio.InputError(f"{init_checkpoint} is not a fine-tuned classifier with "
                              f"{num_labels} outputs: it lacks {', '.join(report.missing[:5])}")
    multi_label = bool(record.get("multi_label")) if multi_label is None else multi_label
    if multi_label and regression:
      raise fileio.InputError("--multi_label and --regression exclude each other")
    thresholds = _tuned_thresholds(init_checkpoint, labels) if multi_label else None
    return ClassifierModule(model, vocab_path, do_lower_case, max_seq_length, labels, regression,
                            text_pairs, multi_label, thresholds,
                            record.get("label_delimiter") or ",")
  model = modeling.BertSpanLabeler(config)
  report = checkpoints.init_from_checkpoint(model, init_checkpoint)
  if report.missing:
    raise fileio.InputError(f"{init_checkpoint} is not a fine-tuned SQuAD model: it lacks "
                            f"{', '.join(report.missing[:5])}")
  return SquadModule(model, vocab_path, do_lower_case, max_seq_length, max_query_length,
                     max_answer_length, doc_stride, n_best_size)


def _tuned_thresholds(init_checkpoint, labels):
  """The per-label thresholds run_classifier --tune_thresholds wrote beside the checkpoint
  (thresholds.json), when they are this checkpoint's (same step); else None (0.5 for all)."""
  directory = checkpoints.checkpoint_directory(init_checkpoint)
  found = fine_tuning.read_thresholds(directory, labels)
  if found is None:
    return None
  values, step = found
  path = run_dir.thresholds_file(directory)
  checkpoint_step = checkpoints.global_step(init_checkpoint)
  if checkpoint_step is not None and checkpoint_step != step:
    logging.warning("%s was tuned at step %d, the checkpoint is at step %d: exporting with 0.5 "
                    "for every label", path, step, checkpoint_step)
    return None
  logging.info("Per-label thresholds from %s", path)
  return values


def _task_defaults(model_type, init_checkpoint, labels, regression, text_pairs):
  """(labels, regression, text_pairs, task record): those given (not None), else the task.json of
  the fine-tuning run beside `init_checkpoint`, else None / False / False. InputError when that
  run trained another kind of model."""
  record = fine_tuning.task_record(checkpoints.checkpoint_directory(init_checkpoint), None,
                                   has_checkpoint=False, flag="init_checkpoint") or {}
  script = {"classifier": "run_classifier", "squad": "run_squad"}[model_type]
  if record and record["task"].split()[0] != script:
    raise fileio.InputError(f"--init_checkpoint={init_checkpoint} holds the model of "
                            f"{record['task']}, not of {script}: no --model_type={model_type}")
  if labels is None and not regression:
    labels = record.get("labels")
  return (labels, bool(record.get("regression")) if regression is None else regression,
          bool(record.get("text_pairs")) if text_pairs is None else text_pairs, record)


def main(_):
  logging.set_verbosity(logging.INFO)
  export(FLAGS.model_type, FLAGS.export_dir, init_checkpoint=FLAGS.init_checkpoint,
         bert_config_file=FLAGS.bert_config_file, vocab_file=FLAGS.vocab_file,
         do_lower_case=FLAGS.do_lower_case, max_seq_length=FLAGS.max_seq_length,
         labels=FLAGS.labels, regression=_given(FLAGS["regression"]),
         text_pairs=_given(FLAGS["text_pairs"]),
         max_query_length=FLAGS.max_query_length, max_answer_length=FLAGS.max_answer_length,
         doc_stride=FLAGS.doc_stride, n_best_size=FLAGS.n_best_size, overwrite=FLAGS.overwrite,
         pooling=FLAGS.pooling if FLAGS["pooling"].present else "mean",
         normalize=FLAGS.normalize, multi_label=_given(FLAGS["multi_label"]),
         export_format=FLAGS.format, quantize=FLAGS.quantize)


def _given(flag):
  """A flag's value when it is on the command line, else None (export then reads task.json)."""
  return flag.value if flag.present else None


def cli():
  """The command line: `python export_model.py` and the `bert-export-model` command."""
  define_flags()
  commands.run_main(main)
