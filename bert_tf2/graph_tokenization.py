"""The WordPiece tokenizer as TensorFlow ops, for SavedModels that take raw text.

`TextPreprocessor` turns strings into BERT's inputs inside a graph: exactly tokenization.py's
FullTokenizer (BasicTokenizer, then greedy longest-match WordPiece) and run_classifier's
[CLS] a [SEP] b [SEP] layout and truncation. The per-character Unicode rules (cleaning, accents,
lower-casing, punctuation, CJK) are tables computed from tokenization.py's own predicates
(`CharacterTables`), so the graph cannot drift from the reference tokenizer. Only core
TensorFlow ops are used: the models load wherever TensorFlow does (TF Serving, saved_model_cli,
a Python without tensorflow-text). export_model.py builds its preprocessor, classifier and SQuAD
models on it.
"""

import functools
import unicodedata

import numpy as np
import tensorflow as tf

from bert_tf2 import tokenization

# run_classifier / run_squad keep words up to this many characters; longer ones become [UNK].
_MAX_INPUT_CHARS_PER_WORD = 200
_SPACE = 0x20
_CAPITAL_SIGMA, _FINAL_SIGMA = 0x3A3, 0x3C2


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
    cjk_ranges = sorted(tokenization.CJK_RANGES)
    strip_accents = tokenization.BasicTokenizer(True)._run_strip_accents
    for cp, category in enumerate(categories):
      if category in ("Cn", "Co", "Cs"):
        continue  # Unassigned or private use (no rule applies), surrogate (not in UTF-8 text).
      char = chr(cp)
      cleaned = tokenization.cleaned_char(char)
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
        elif tokenization.is_punctuation(c):
          pieces.extend([_SPACE, ord(c), _SPACE])
        else:
          pieces.append(ord(c))
      if tokenization.is_chinese_char(cp):
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
