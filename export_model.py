"""Exports SavedModels for serving and TF Hub: encoder, text preprocessor, classifier, SQuAD.

Four kinds of SavedModel, chosen with --model_type, each loadable with `tf.saved_model.load`,
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

Only core TensorFlow ops are in the graphs, so the models load wherever TensorFlow does: TF
Serving, `saved_model_cli`, a Python without tensorflow-text. The fine-tuned models carry the
preprocessing inside them, so clients send text.
* classifier: a fine-tuned run_classifier.py model whose `serving_default` takes raw text
  (`text_a`, plus `text_b` for sentence-pair tasks) and returns the label, its id and the
  probabilities of every label (or `score` for regression).
* squad: a fine-tuned run_squad.py model whose `serving_default` takes `question` and `context`
  and returns the best answer span: its start/end positions in the input sequence, the answer
  text (the context's whitespace-separated words the span covers) and its score. One window per example: a context
  longer than --max_seq_length is cut, where run_squad.py would slide windows over it.

Every SavedModel is written to a temporary directory beside --export_dir and renamed into place
when complete, so an interrupted export never leaves a half-written model under its final name.
An existing --export_dir is replaced only when it holds an earlier SavedModel (--overwrite forces
it); one that is or holds an input (the checkpoint, config or vocab) is always refused.
"""

# First, before the slow imports: Ctrl-C while they load ends in one error line.
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import os
import tempfile

import tensorflow as tf
from absl import flags
from absl import logging

from bert_tf2 import checkpoints
from bert_tf2 import graph_tokenization
from bert_tf2 import modeling
from bert_tf2 import script_flags
from bert_tf2 import tokenization

FLAGS = flags.FLAGS


def define_flags():
  """The script's flags (defined when it runs: build_vocab has another --model_type)."""
  flags.DEFINE_enum("model_type", "encoder", ["encoder", "preprocessor", "classifier", "squad"],
                    "What to export (see the module docstring).")
  flags.DEFINE_string("export_dir", None,
                      "Directory the SavedModel is written to. An existing one is replaced only "
                      "if it holds an earlier SavedModel (or with --overwrite).")
  script_flags.define_overwrite_flag()
  script_flags.define_checkpoint_flags()  # also: a fine-tuning --output_dir (its latest)
  script_flags.define_text_flags()  # --vocab_file default: vocab.txt beside --init_checkpoint
  script_flags.define_max_seq_length(128)  # the length the preprocessing pads to
  script_flags.define_labels_flag()
  script_flags.define_regression_flag()
  flags.DEFINE_bool("text_pairs", False,
                    "classifier: serving_default takes text_a and text_b (sentence-pair task); "
                    "the `pairs` signature takes both in any case.")
  script_flags.define_squad_flags()


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
  """A fine-tuned classifier on raw text: returns the label, its id and the probabilities."""

  def __init__(self, model, vocab_file, do_lower_case, seq_length, labels, is_regression,
               text_pairs):
    super().__init__(name="classifier")
    self.model = model
    self.preprocessor = graph_tokenization.TextPreprocessor(vocab_file, do_lower_case, seq_length)
    self.label_names = tf.Variable(labels or [""], trainable=False, name="labels")
    self.is_regression = is_regression
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


class SquadModule(_SavedModelRoot):
  """A fine-tuned SQuAD model on raw text: question + context -> the best answer span.

  The context is split into words and each word tokenized on its own, as run_squad.py does, so
  every token knows its word and the answer is returned as the context's words it covers. Only
  the first window is read: tokens beyond --max_seq_length are cut.
  """

  def __init__(self, model, vocab_file, do_lower_case, seq_length, max_query_length,
               max_answer_length):
    super().__init__(name="squad")
    if seq_length <= max_query_length + 3:
      raise fileio.InputError(f"--max_seq_length={seq_length} must be above "
                              f"--max_query_length={max_query_length} + 3")
    self.model = model
    self.preprocessor = graph_tokenization.TextPreprocessor(vocab_file, do_lower_case, seq_length)
    self.seq_length = seq_length
    self.max_query_length = max_query_length
    self.max_answer_length = max_answer_length
    self._set_tokenization_info(vocab_file, do_lower_case)
    self._set_reusable_attributes([model])

  def _answer(self, question, context):
    pre = self.preprocessor
    query = pre.tokenize_text(question).merge_dims(1, 2)
    query = query[:, :self.max_query_length]
    # [batch, (words)] -> [batch, (words), (pieces)]: each word of the context tokenized alone.
    words = tf.strings.split(tf.strings.regex_replace(context, _SQUAD_WHITESPACE, " "), " ")
    words = tf.ragged.boolean_mask(words, tf.not_equal(words, ""))
    pieces = pre.tokenize_text(words.flat_values).merge_dims(1, 2)
    doc = tf.RaggedTensor.from_row_splits(pieces, words.row_splits)
    word_of_token = doc.with_flat_values(
        tf.cast(doc.values.value_rowids(), tf.int32)).merge_dims(1, 2)  # Flat word index.
    doc = doc.merge_dims(1, 2)
    query_len = tf.cast(query.row_lengths(), tf.int32)
    budget = self.seq_length - 3 - query_len
    keep = tf.ragged.range(tf.cast(doc.row_lengths(), tf.int32)) < budget[:, None]
    doc = tf.ragged.boolean_mask(doc, keep)
    word_of_token = tf.ragged.boolean_mask(word_of_token, keep)
    features = pre.pack([query, doc], self.seq_length)
    outputs = self.model({"input_ids": features["input_word_ids"],
                          "input_mask": features["input_mask"],
                          "segment_ids": features["input_type_ids"]})
    # Score every (start, end) inside the context with end - start < max_answer_length.
    offset = query_len + 2  # [CLS] question [SEP]
    doc_len = tf.cast(doc.row_lengths(), tf.int32)
    positions = tf.range(self.seq_length)
    in_doc = ((positions[None, :] >= offset[:, None])
              & (positions[None, :] < (offset + doc_len)[:, None]))
    span = positions[None, :] - positions[:, None]  # [start, end] -> end - start
    allowed = (in_doc[:, :, None] & in_doc[:, None, :]
               & ((span >= 0) & (span < self.max_answer_length))[None])
    scores = (outputs["start_logits"][:, :, None] + outputs["end_logits"][:, None, :])
    scores = tf.where(allowed, scores, -1e30)
    flat = tf.argmax(tf.reshape(scores, [tf.shape(scores)[0], -1]), axis=-1,
                     output_type=tf.int32)
    start, end = flat // self.seq_length, flat % self.seq_length
    has_answer = tf.reduce_any(allowed, axis=[1, 2])
    token_start = tf.maximum(start - offset, 0)
    token_end = tf.maximum(end - offset, 0)
    first_word = tf.gather(word_of_token.flat_values,
                           tf.cast(word_of_token.row_starts(), tf.int32) + token_start)
    last_word = tf.gather(word_of_token.flat_values,
                          tf.cast(word_of_token.row_starts(), tf.int32) + token_end)
    word_index = tf.ragged.range(tf.cast(words.row_starts(), tf.int32),
                                 tf.cast(words.row_limits(), tf.int32))
    chosen = (word_index >= first_word[:, None]) & (word_index <= last_word[:, None])
    answer = tf.strings.reduce_join(
        tf.ragged.boolean_mask(words, chosen & has_answer[:, None]), axis=1, separator=" ")
    return {"answer": answer,
            "start_position": tf.where(has_answer, start, -1),
            "end_position": tf.where(has_answer, end, -1),
            "score": tf.where(has_answer, tf.reduce_max(tf.reshape(scores, [tf.shape(scores)[0],
                                                                              -1]), -1), 0.0)}

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
    names = set(os.listdir(path))
    variables = os.path.join(path, "variables")
    if "variables" in names and (os.path.islink(variables) or not os.path.isdir(variables)):
      return False
    extra = [n for n in (os.listdir(variables) if "variables" in names else [])
             if not n.startswith("variables.")]
  except OSError:
    return False
  return "saved_model.pb" in names and names <= _SAVED_MODEL_ENTRIES and not extra


def _config_and_vocab_paths(init_checkpoint, bert_config_file=None, vocab_file=None):
  """(config path, vocab path): from the flags, else beside the checkpoint; nothing is read."""
  directory = checkpoints.checkpoint_directory(init_checkpoint) if init_checkpoint else ""
  config_path = bert_config_file or (checkpoints.config_beside(init_checkpoint)
                                     if init_checkpoint else None)
  if not config_path:
    raise fileio.InputError("--bert_config_file is required (no bert_config.json / config.json "
                            "beside --init_checkpoint)")
  vocab_path = vocab_file or (os.path.join(directory, "vocab.txt") if directory else None)
  if not vocab_path or not os.path.exists(vocab_path):
    raise fileio.InputError("--vocab_file is required (no vocab.txt beside --init_checkpoint)")
  fileio.check_file(vocab_path, "vocab file")
  return config_path, vocab_path


def find_config_and_vocab(init_checkpoint, bert_config_file=None, vocab_file=None):
  """(BertConfig, config path, vocab path): from the flags, else beside the checkpoint."""
  config_path, vocab_path = _config_and_vocab_paths(init_checkpoint, bert_config_file, vocab_file)
  return modeling.BertConfig.from_json_file(config_path), config_path, vocab_path


def _config_file_for_asset(config, staging_dir):
  """The config as an original-format bert_config.json file to ship as an asset."""
  path = os.path.join(staging_dir, "bert_config.json")
  with open(path, "w", encoding="utf-8") as f:
    f.write(config.to_json_string())
  return path


def _num_outputs_in_checkpoint(init_checkpoint):
  """The classifier's label count: the length of output_bias in the checkpoint (any format)."""
  kind, path = checkpoints.resolve_checkpoint(init_checkpoint)
  if kind == "hf":
    return None
  for name, shape in tf.train.list_variables(path):
    if name in ("output_bias", "model/output_layer/output_bias" + checkpoints._VALUE_SUFFIX):
      return shape[0]
  return None


def export(model_type, export_dir, init_checkpoint=None, bert_config_file=None, vocab_file=None,
           do_lower_case=True, max_seq_length=128, labels=None, regression=False,
           text_pairs=False, max_query_length=64, max_answer_length=30, overwrite=False):
  """Builds the `model_type` module from a checkpoint and writes it to `export_dir`.

  Every input is checked and `export_dir` is vetted before the model is built: it must not be or
  hold an input, and an existing one is replaced only if it is an earlier SavedModel (or with
  `overwrite`). The SavedModel is written to a staging directory beside it and renamed into place
  when complete, so an error, Ctrl-C, SIGTERM or a full disk leaves the previous export intact.
  """
  if not export_dir:
    raise fileio.InputError("--export_dir is required")
  if model_type not in ("encoder", "preprocessor", "classifier", "squad"):
    raise fileio.InputError(f"unknown --model_type={model_type}")
  if model_type != "encoder" and max_seq_length < 3:
    raise fileio.InputError(f"--max_seq_length={max_seq_length} is too small for [CLS] x [SEP]")
  fileio.check_distinct(labels, "labels", "label")
  if model_type == "preprocessor":
    if not vocab_file and init_checkpoint:
      vocab_file = os.path.join(checkpoints.checkpoint_directory(init_checkpoint), "vocab.txt")
    fileio.check_file(vocab_file, "vocab file (--vocab_file)")
    inputs = [("vocab_file", vocab_file)]
  else:
    if not init_checkpoint:
      raise fileio.InputError(f"--init_checkpoint is required for --model_type={model_type}")
    config_path, vocab_path = _config_and_vocab_paths(init_checkpoint, bert_config_file,
                                                      vocab_file)
    inputs = [("init_checkpoint", checkpoints.checkpoint_files(init_checkpoint)),
              ("bert_config_file", config_path), ("vocab_file", vocab_path)]
  with fileio.no_new_empty_directories(export_dir):  # It appears only when complete.
    fileio.check_outputs(replaced_directories=[("export_dir", export_dir)], inputs=inputs)
  with fileio.atomic_directory(export_dir, replaceable=is_saved_model_directory,
                               overwrite=overwrite, flag="export_dir") as staging:
    with tempfile.TemporaryDirectory() as scratch:
      if model_type == "preprocessor":
        module = PreprocessorModule(vocab_file, do_lower_case, max_seq_length)
      else:
        module = _fine_tuned_module(model_type, init_checkpoint, config_path, vocab_path, scratch,
                                    do_lower_case, max_seq_length, labels, regression,
                                    text_pairs, max_query_length, max_answer_length)
      signatures = module.signatures()
      try:
        tf.saved_model.save(module, staging, signatures=signatures)
      except (OSError, tf.errors.OpError) as e:  # A full disk, a quota: TF names only the file.
        reason = (getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)).strip()
        reason = reason.splitlines()[0] if reason else type(e).__name__
        raise fileio.InputError(f"--export_dir={export_dir}: cannot write the SavedModel, "
                                f"nothing was replaced: {reason}") from None
  export_dir = os.path.abspath(export_dir)
  logging.info("Wrote SavedModel %s", export_dir)
  return export_dir


def _fine_tuned_module(model_type, init_checkpoint, config_path, vocab_path, scratch,
                       do_lower_case, max_seq_length, labels, regression, text_pairs,
                       max_query_length, max_answer_length):
  """The encoder, classifier or SQuAD module with the checkpoint's weights."""
  tokenization.validate_case_matches_checkpoint(do_lower_case, init_checkpoint)
  config = modeling.BertConfig.from_json_file(config_path)
  tokenization.check_vocab_fits(len(tokenization.load_vocab(vocab_path)), config, vocab_path,
                                config_path)
  if model_type != "encoder":
    checkpoints.check_seq_length(max_seq_length, config, config_path)
  if model_type == "encoder":
    holder = checkpoints.EncoderHolder(config, name="holder")
    checkpoints.init_from_checkpoint(holder, init_checkpoint, require_all=True)
    return EncoderModule(holder.bert, vocab_path, do_lower_case,
                         _config_file_for_asset(config, scratch))
  if model_type == "classifier":
    num_labels = 1 if regression else (len(labels) if labels else
                                       _num_outputs_in_checkpoint(init_checkpoint))
    if not num_labels:
      raise fileio.InputError(f"give --labels: {init_checkpoint} has no classifier output_bias "
                              "to count the labels from")
    if regression:
      labels = []
    elif not labels:
      labels = [str(i) for i in range(num_labels)]
    model = modeling.BertClassifier(config, num_labels)
    report = checkpoints.init_from_checkpoint(model, init_checkpoint)
    if report.missing:
      raise fileio.InputError(f"{init_checkpoint} is not a fine-tuned classifier with "
                              f"{num_labels} outputs: it lacks {', '.join(report.missing[:5])}")
    return ClassifierModule(model, vocab_path, do_lower_case, max_seq_length, labels, regression,
                            text_pairs)
  model = modeling.BertSpanLabeler(config)
  report = checkpoints.init_from_checkpoint(model, init_checkpoint)
  if report.missing:
    raise fileio.InputError(f"{init_checkpoint} is not a fine-tuned SQuAD model: it lacks "
                            f"{', '.join(report.missing[:5])}")
  return SquadModule(model, vocab_path, do_lower_case, max_seq_length, max_query_length,
                     max_answer_length)


def main(_):
  logging.set_verbosity(logging.INFO)
  export(FLAGS.model_type, FLAGS.export_dir, init_checkpoint=FLAGS.init_checkpoint,
         bert_config_file=FLAGS.bert_config_file, vocab_file=FLAGS.vocab_file,
         do_lower_case=FLAGS.do_lower_case, max_seq_length=FLAGS.max_seq_length,
         labels=FLAGS.labels, regression=FLAGS.regression, text_pairs=FLAGS.text_pairs,
         max_query_length=FLAGS.max_query_length, max_answer_length=FLAGS.max_answer_length,
         overwrite=FLAGS.overwrite)


def run():
  """Console entry point."""
  define_flags()
  fileio.run_main(main)


if __name__ == "__main__":
  run()
