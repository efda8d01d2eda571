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
  `TextPreprocessor` for how the Unicode rules are reproduced with TF ops). Its `tokenize` and
  `bert_pack_inputs` follow TF Hub's BERT preprocessors, for sentence pairs.

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
import fileio  # pylint: disable=g-bad-import-order

import functools
import os
import tempfile
import unicodedata

import numpy as np
import tensorflow as tf
from absl import flags
from absl import logging

import checkpoints
import modeling
import script_flags
import tokenization

FLAGS = flags.FLAGS

# The character tables are computed from tokenization.py's own private predicates, so that they
# cannot drift from the reference tokenizer.
# pylint: disable=protected-access

# run_classifier / run_squad keep words up to this many characters; longer ones become [UNK].
_MAX_INPUT_CHARS_PER_WORD = 200
_SPACE = 0x20
_CAPITAL_SIGMA, _FINAL_SIGMA = 0x3A3, 0x3C2


def define_flags():
  """The script's flags; defined on demand so run_classifier.py can import this module."""
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
# The tokenizer's character rules as tables.


def _ranges(code_points):
  """Sorted code points -> (starts, ends) int32 arrays of the inclusive runs they form."""
  starts, ends = [], []
  for cp in code_points:
    if ends and cp == ends[-1] + 1:
      ends[-1] = cp
    else:
      starts.append(cp)
      ends.append(cp)
  return np.array(starts, np.int32), np.array(ends, np.int32)


def _is_final_sigma_context(text):
  return text.lower().endswith(chr(_FINAL_SIGMA))


@functools.lru_cache(maxsize=2)
def character_tables(do_lower_case):
  """The tables for one casing, built once per process (about 2 s with lower-casing)."""
  return CharacterTables(do_lower_case)


class CharacterTables:
  """tokenization.BasicTokenizer's per-character rules, computed from its own predicates.

  Everything BasicTokenizer does to a text is a function of each character alone, except
  lower-casing's final sigma (Python lower-cases U+03A3 to U+03C2 at the end of a word), so the
  rules become lookup tables:
  - `drop`: characters _clean_text deletes (NUL, U+FFFD, control and format characters);
  - `mapping`: character -> the code points it turns into: " " for whitespace (after cleaning,
    and the line/paragraph separators str.split() also splits on), the lower-cased, NFD-
    decomposed text without combining marks (Mn) when lower-casing, with every punctuation
    character spaced out, and CJK ideographs spaced out;
  - `cjk`: the CJK ranges, spaced out when not in `mapping`;
  - `cased` / `case_ignorable`: the Unicode properties of Python's final-sigma rule, found by
    asking Python's own str.lower(), so the tables agree with the reference on this Python.
  NFD over a whole word equals per-character decomposition except for the canonical reordering of
  combining marks; every reorderable mark is dropped (Mn) except 25 rare spacing marks (Mc with a
  combining class, e.g. Balinese/Tagalog viramas), whose relative order could differ.
  """

  def __init__(self, do_lower_case):
    self.do_lower_case = do_lower_case
    categories = list(map(unicodedata.category, map(chr, range(0x110000))))
    drop, mapping = [], {}
    cased, ignorable = [], []
    cjk_ranges = sorted(tokenization._CJK_RANGES)
    strip_accents = tokenization.BasicTokenizer(True)._run_strip_accents
    for cp, category in enumerate(categories):
      if category in ("Cn", "Co", "Cs"):
        continue  # Unassigned or private use (no rule applies), surrogate (not in UTF-8 text).
      char = chr(cp)
      cleaned = tokenization._cleaned_char(char)
      if cleaned == "":
        drop.append(cp)
        continue
      if cleaned == " " or char.isspace():
        mapping[cp] = [_SPACE]
        continue
      out = char
      if do_lower_case:
        out = strip_accents(char.lower())
        if _is_final_sigma_context(char + "\u03a3"):
          cased.append(cp)
        elif (_is_final_sigma_context("\u0391" + char + "\u03a3")
              and not _is_final_sigma_context("1" + char + "\u03a3")):
          ignorable.append(cp)
      pieces = []
      for c in out:
        if c.isspace():
          pieces.append(_SPACE)
        elif tokenization._is_punctuation(c):
          pieces.extend([_SPACE, ord(c), _SPACE])
        else:
          pieces.append(ord(c))
      if tokenization._is_chinese_char(cp):
        pieces = [_SPACE] + pieces + [_SPACE]
        if pieces == [_SPACE, cp, _SPACE]:
          continue  # The default rule for CJK.
      if pieces != [cp]:
        mapping[cp] = pieces
    self.drop = _ranges(drop)
    self.cjk = (np.array([lo for lo, _ in cjk_ranges], np.int32),
                np.array([hi for _, hi in cjk_ranges], np.int32))
    keys = sorted(mapping)
    self.keys = np.array(keys, np.int32)
    self.lengths = np.array([len(mapping[k]) for k in keys], np.int32)
    self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int32)
    self.values = np.array([cp for k in keys for cp in mapping[k]], np.int32)
    self.cased = _ranges(cased)
    self.case_ignorable = _ranges(ignorable)


def _in_ranges(values, ranges):
  """Elementwise: is each int32 value inside one of the sorted inclusive (starts, ends) runs?"""
  starts, ends = ranges
  if len(starts) == 0:
    return tf.zeros_like(values, tf.bool)
  index = tf.searchsorted(tf.constant(starts), values, side="right") - 1
  return (index >= 0) & (values <= tf.gather(tf.constant(ends), tf.maximum(index, 0)))


def _final_sigmas(flat, row_ids, tables):
  """Which U+03A3 in `flat` Python lower-cases to the final form (U+03C2).

  Python's rule: the nearest character before it that is not case-ignorable is cased, and the
  nearest one after it that is not case-ignorable (if any, in the same word) is not cased.
  Words never span rows and whitespace is neither cased nor case-ignorable, so searching within
  the row is searching within the word.
  """
  relevant = tf.logical_not(_in_ranges(flat, tables.case_ignorable))
  cased = _in_ranges(flat, tables.cased)
  positions = tf.cast(tf.where(relevant)[:, 0], tf.int32)  # Indices of the relevant characters.
  count = tf.size(positions)
  inclusive = tf.cumsum(tf.cast(relevant, tf.int32))
  before = inclusive - tf.cast(relevant, tf.int32) - 1  # Rank of the previous relevant char.
  prev_pos = tf.gather(positions, tf.clip_by_value(before, 0, tf.maximum(count - 1, 0)))
  has_prev = (before >= 0) & (tf.gather(row_ids, prev_pos) == row_ids)
  prev_cased = has_prev & tf.gather(cased, prev_pos)
  after = inclusive  # Rank of the next relevant character after this one (for a relevant one).
  next_pos = tf.gather(positions, tf.clip_by_value(after, 0, tf.maximum(count - 1, 0)))
  has_next = (after < count) & (tf.gather(row_ids, next_pos) == row_ids)
  next_cased = has_next & tf.gather(cased, next_pos)
  return tf.equal(flat, _CAPITAL_SIGMA) & prev_cased & tf.logical_not(next_cased)


def _apply_mapping(flat, tables):
  """Each code point -> its replacement sequence; returns (values, lengths) per input point."""
  keys = tf.constant(tables.keys)
  index = tf.minimum(tf.searchsorted(keys, flat, side="left"), len(tables.keys) - 1)
  found = tf.equal(tf.gather(keys, index), flat)
  cjk = _in_ranges(flat, tables.cjk)
  n = tf.size(flat)
  num_values = len(tables.values)
  # Points not in the table come out as themselves, or spaced out (" x ") for CJK ideographs:
  # they are read from a [3n] array holding " x " for every input point.
  spaced = tf.reshape(tf.stack([tf.fill([n], _SPACE), flat, tf.fill([n], _SPACE)], axis=1), [-1])
  source = tf.concat([tf.constant(tables.values), spaced], axis=0)
  default_start = num_values + 3 * tf.range(n) + tf.where(cjk, 0, 1)
  start = tf.where(found, tf.gather(tf.constant(tables.offsets), index), default_start)
  length = tf.where(found, tf.gather(tf.constant(tables.lengths), index), tf.where(cjk, 3, 1))
  return tf.gather(source, tf.ragged.range(start, start + length).flat_values), length


# ----------------------------------------------------------------------------------------------
# The preprocessing SavedModel.


class TextPreprocessor(tf.Module):
  """Raw text -> BERT inputs in the graph, exactly as tokenization.FullTokenizer + run_classifier.

  Only core TensorFlow ops, so the SavedModels load wherever TensorFlow does (TF Serving,
  `saved_model_cli run`, a Python without tensorflow-text). tensorflow-text's own tokenizers
  would not do here anyway: BertTokenizer's lower-casing is NFKC case folding (ß -> ss, ½ -> 1/2,
  ﬁ -> fi, where the original keeps them), and its WordpieceTokenizer limits words in bytes, not
  in characters. The Unicode rules come from `CharacterTables`; the pieces from `_wordpiece`.
  """

  def __init__(self, vocab_file, do_lower_case, seq_length=128, name="preprocessor"):
    super().__init__(name=name)
    vocab = tokenization.load_vocab(vocab_file)
    tokenization.check_special_tokens(vocab, vocab_file)
    self._tables = character_tables(do_lower_case)
    self.do_lower_case_value = do_lower_case
    self.seq_length = seq_length
    tokens, ids = zip(*vocab.items())
    self._vocab_table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(tokens), tf.constant(ids, tf.int32)),
        default_value=-1)
    # No piece longer than the longest vocab entry can match (as WordpieceTokenizer._longest).
    self._longest = min(max(map(len, vocab)), _MAX_INPUT_CHARS_PER_WORD)
    self._special = {t: vocab[t] for t in tokenization.SPECIAL_TOKENS}

  def words(self, text):
    """[batch] strings -> RaggedTensor [batch, (words)] of BasicTokenizer's words."""
    text = tf.convert_to_tensor(text, tf.string)
    # Invalid UTF-8 becomes U+FFFD, which the cleaning drops: the reference drops invalid bytes.
    cps = tf.strings.unicode_decode(text, "UTF-8", errors="replace", replacement_char=0xFFFD)
    flat = cps.flat_values
    cps = tf.ragged.boolean_mask(
        cps, cps.with_flat_values(tf.logical_not(_in_ranges(flat, self._tables.drop))))
    flat = cps.flat_values
    if self.do_lower_case_value:
      flat = tf.where(_final_sigmas(flat, tf.cast(cps.value_rowids(), tf.int32), self._tables),
                      _FINAL_SIGMA, flat)
    values, lengths = _apply_mapping(flat, self._tables)
    per_char = tf.RaggedTensor.from_row_lengths(values, tf.cast(lengths, tf.int64))
    mapped = cps.with_flat_values(per_char).merge_dims(1, 2)
    strings = tf.strings.unicode_encode(mapped, "UTF-8")
    words = tf.strings.split(strings, " ")
    return tf.ragged.boolean_mask(words, tf.not_equal(words, ""))

  def tokenize_words(self, words):
    """RaggedTensor of words [..., (words)] -> int32 piece ids [..., (words), (pieces)]."""
    return words.with_flat_values(self._wordpiece(words.flat_values))

  def _wordpiece(self, words):
    """[n] words -> int32 RaggedTensor [n, (pieces)]: WordpieceTokenizer.split_word, in TF ops.

    Greedy longest-match-first, all words at once: each round looks up every candidate piece
    (1 .. longest characters from the word's current start, "##" before a non-initial one) of
    every unfinished word and takes the longest that is in the vocab. A word with a position no
    piece matches, or longer than 200 characters, becomes the single id of [UNK].
    """
    n = tf.size(words)
    lengths = tf.strings.length(words, unit="UTF8_CHAR")
    too_long = lengths > _MAX_INPUT_CHARS_PER_WORD
    sizes = tf.range(1, self._longest + 1)

    def round_(start, done, failed, word_ta, id_ta, step):
      active = tf.where(tf.logical_not(done))[:, 0]
      active32 = tf.cast(active, tf.int32)
      pos = tf.gather(start, active)
      word = tf.gather(words, active)
      remaining = tf.gather(lengths, active) - pos
      shape = tf.stack([tf.size(active), self._longest])
      candidates = tf.strings.substr(tf.broadcast_to(word[:, None], shape),
                                     tf.broadcast_to(pos[:, None], shape),
                                     tf.broadcast_to(sizes, shape), unit="UTF8_CHAR")
      candidates = tf.where(pos[:, None] > 0, tf.strings.join(["##", candidates]), candidates)
      ids = self._vocab_table.lookup(candidates)
      usable = (ids >= 0) & (sizes[None, :] <= remaining[:, None])
      best = tf.reduce_max(tf.where(usable, sizes[None, :], 0), axis=1)
      matched = best > 0
      best_id = tf.gather(ids, tf.maximum(best - 1, 0), batch_dims=1)
      word_ta = word_ta.write(step, tf.boolean_mask(active32, matched))
      id_ta = id_ta.write(step, tf.boolean_mask(best_id, matched))
      new_pos = pos + best
      finished = tf.logical_not(matched) | tf.equal(new_pos, tf.gather(lengths, active))
      start = tf.tensor_scatter_nd_update(start, active[:, None], new_pos)
      done = tf.tensor_scatter_nd_update(done, active[:, None], finished)
      failed = tf.tensor_scatter_nd_update(failed, active[:, None], tf.logical_not(matched))
      return start, done, failed, word_ta, id_ta, step + 1

    empty = tf.equal(lengths, 0)
    state = (tf.zeros([n], tf.int32), too_long | empty, tf.zeros([n], tf.bool),
             tf.TensorArray(tf.int32, size=0, dynamic_size=True, infer_shape=False,
                            element_shape=[None]),
             tf.TensorArray(tf.int32, size=0, dynamic_size=True, infer_shape=False,
                            element_shape=[None]),
             tf.constant(0))
    _, _, failed, word_ta, id_ta, _ = tf.while_loop(
        lambda start, done, *_: tf.logical_not(tf.reduce_all(done)), round_, state)
    piece_word = tf.reshape(word_ta.concat(), [-1])
    piece_id = tf.reshape(id_ta.concat(), [-1])
    # Pieces were emitted round by round; a stable sort by word puts each word's in order.
    unk = too_long | failed
    keep = tf.logical_not(tf.gather(unk, piece_word))
    piece_word, piece_id = tf.boolean_mask(piece_word, keep), tf.boolean_mask(piece_id, keep)
    unk_words = tf.cast(tf.where(unk)[:, 0], tf.int32)
    piece_word = tf.concat([piece_word, unk_words], 0)
    piece_id = tf.concat([piece_id, tf.fill(tf.shape(unk_words), self._special["[UNK]"])], 0)
    order = tf.argsort(piece_word, stable=True)
    return tf.RaggedTensor.from_value_rowids(tf.gather(piece_id, order),
                                             tf.cast(tf.gather(piece_word, order), tf.int64),
                                             nrows=tf.cast(n, tf.int64))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
  def tokenize_text(self, text):
    """[batch] strings -> int32 [batch, (words), (pieces)] (TF Hub's `tokenize` layout).

    A tf.function of its own, so a SavedModel holds one copy of the tokenizer graph however many
    signatures call it.
    """
    return self.tokenize_words(self.words(text))

  def pack(self, segments, seq_length):
    """Token ids of one or two segments -> the encoder's inputs (run_classifier's layout).

    `segments`: a list of one or two int RaggedTensors [batch, (tokens)] (or with a words axis,
    which is merged). With two, [CLS] a [SEP] b [SEP] truncated as
    tokenization.truncate_seq_pair does (the longer side loses a token until both fit), except
    that an empty b gives the single-segment layout, as in run_classifier where text_b
    tokenizes to nothing.
    """
    segments = [s.merge_dims(-2, -1) if s.ragged_rank > 1 else s for s in segments]
    seq_length = tf.cast(seq_length, tf.int32)
    a = tf.cast(segments[0], tf.int32)
    len_a = tf.cast(a.row_lengths(), tf.int32)
    if len(segments) == 1:
      b, len_b = tf.zeros_like(a), tf.zeros_like(len_a)
    else:
      b = tf.cast(segments[1], tf.int32)
      len_b = tf.cast(b.row_lengths(), tf.int32)
    has_b = len_b > 0
    budget = tf.where(has_b, seq_length - 3, seq_length - 2)
    # Closed form of popping from the longer side (b on ties) until len_a + len_b <= budget.
    pair_a = tf.minimum(len_a, tf.maximum((budget + 1) // 2, budget - len_b))
    keep_a = tf.where(len_a + len_b <= budget, len_a, tf.where(has_b, pair_a, budget))
    keep_b = tf.where(has_b, tf.minimum(len_b, budget - keep_a), 0)
    # Position j of the output holds [CLS] (j = 0), a[j - 1], [SEP], b[j - keep_a - 2], [SEP].
    j = tf.range(seq_length)[None, :]
    end_a = keep_a[:, None] + 1  # Position of the first [SEP].
    end_b = end_a + keep_b[:, None] + 1  # Position of the second [SEP] (when there is a b).
    in_a = (j >= 1) & (j < end_a)
    in_b = has_b[:, None] & (j > end_a) & (j < end_b)
    is_sep = tf.equal(j, end_a) | (has_b[:, None] & tf.equal(j, end_b))
    dense_a, dense_b = a.to_tensor(), b.to_tensor()

    def take(dense, index):
      width = tf.maximum(tf.shape(dense)[1], 1)
      dense = tf.pad(dense, [[0, 0], [0, width - tf.shape(dense)[1]]])
      return tf.gather(dense, tf.clip_by_value(index, 0, width - 1), batch_dims=1)

    batch_j = tf.broadcast_to(j, tf.stack([tf.shape(keep_a)[0], seq_length]))
    word_ids = tf.where(
        in_a, take(dense_a, batch_j - 1),
        tf.where(in_b, take(dense_b, batch_j - end_a - 1),
                 tf.where(is_sep, self._special["[SEP]"],
                          tf.where(tf.equal(batch_j, 0), self._special["[CLS]"], 0))))
    last = tf.where(has_b[:, None], end_b, end_a)
    return {
        "input_word_ids": word_ids,
        "input_mask": tf.cast(batch_j <= last, tf.int32),
        "input_type_ids": tf.cast((batch_j > end_a) & (batch_j <= last), tf.int32),
    }

  def encode(self, text_a, text_b=None, seq_length=None):
    segments = [self.tokenize_text(text_a)]
    if text_b is not None:
      segments.append(self.tokenize_text(text_b))
    return self.pack(segments, self.seq_length if seq_length is None else seq_length)


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
    self.preprocessor = TextPreprocessor(vocab_file, do_lower_case, seq_length)
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
    self.preprocessor = TextPreprocessor(vocab_file, do_lower_case, seq_length)
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
    self.preprocessor = TextPreprocessor(vocab_file, do_lower_case, seq_length)
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
