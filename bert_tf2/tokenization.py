"""BERT's WordPiece tokenizer (and an ALBERT-style SentencePiece mode) behind one interface.

The released BERT checkpoints only work with text split exactly the way their pre-training data was
split, so `BasicTokenizer` and `WordpieceTokenizer` reproduce the original google-research/bert
rules character for character: which characters are dropped, which count as whitespace,
punctuation or CJK ideographs, how lower-casing strips accents, and when a word becomes [UNK].
`FullTokenizer.tokenize` runs those rules one text at a time and is the reference;
`FullTokenizer.tokenize_batch` / `encode_batch` give the same output much faster (see there).
"""

import collections
import gc
import itertools
import re
import unicodedata

from absl import logging

from bert_tf2 import fileio

# The special tokens of BERT's vocabularies (ids 0, 100-103 in Google's, 0-4 in build_vocab.py's).
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# The ones a WordPiece FullTokenizer requires, so that a vocab without them fails at load time with
# the file's name rather than as a KeyError deep inside feature conversion: [UNK] (a word without
# pieces becomes it), [CLS] and [SEP] (every sequence the scripts build holds them). Not [PAD]:
# sequences are padded with id 0 whatever token holds it, as the original's feature writers pad.
# Not [MASK]: only pre-training data needs it (checked there, check_special_tokens with a
# reason). The original's own test vocab has neither.
REQUIRED_TOKENS = ("[UNK]", "[CLS]", "[SEP]")

# The Google checkpoint directories whose casing is known; any other name is not checked.
_UNCASED_CHECKPOINTS = ("uncased_L-24_H-1024_A-16", "uncased_L-12_H-768_A-12",
                        "multilingual_L-12_H-768_A-12", "chinese_L-12_H-768_A-12")
_CASED_CHECKPOINTS = ("cased_L-12_H-768_A-12", "cased_L-24_H-1024_A-16",
                      "multi_cased_L-12_H-768_A-12")

# The code point blocks the original treats as CJK ideographs (each becomes its own word). Hangul,
# Hiragana and Katakana are written with spaces between words, so they are deliberately absent.
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))

# SentencePiece's word-boundary marker.
_SPIECE_UNDERLINE = "\u2581"


def validate_case_matches_checkpoint(do_lower_case, init_checkpoint):
  """Raises InputError when --do_lower_case contradicts a Google checkpoint's directory name.

  The casing is not recorded in bert_config.json, so the directory name (e.g.
  uncased_L-12_H-768_A-12/bert_model.ckpt) is the only evidence; a mismatch silently ruins
  fine-tuning, which is why it is an error rather than a warning.
  """
  if not init_checkpoint:
    return
  match = re.match(r"^.*?([A-Za-z0-9_-]+)/bert_model.ckpt", init_checkpoint)
  if match is None:
    return
  model_name = match.group(1)
  if model_name in _UNCASED_CHECKPOINTS and not do_lower_case:
    given, kind, wanted = "False", "lower-cased (uncased)", "True"
  elif model_name in _CASED_CHECKPOINTS and do_lower_case:
    given, kind, wanted = "True", "cased", "False"
  else:
    return
  raise fileio.InputError(
      f"--do_lower_case={given} does not match --init_checkpoint={init_checkpoint}: "
      f"`{model_name}` is a {kind} model, so pass --do_lower_case={wanted} to tokenize the way "
      f"it was pre-trained")


def convert_to_unicode(text):
  """Returns `text` as str, decoding bytes as UTF-8 and dropping undecodable bytes."""
  if isinstance(text, str):
    return text
  if isinstance(text, bytes):
    return text.decode("utf-8", "ignore")
  raise ValueError(f"expected text as str or UTF-8 bytes, got {type(text).__name__}")


def printable_text(text):
  """Returns `text` as str for printing or logging (same as convert_to_unicode on Python 3)."""
  return convert_to_unicode(text)


def load_vocab(vocab_file):
  """Reads a vocab file (one token per line, id = line index) into an OrderedDict token -> id.

  As in the original, surrounding whitespace is stripped from each line, and a token that occurs
  twice keeps the id of its last occurrence while still using up a line index. Such a repeat is
  logged as one warning: the earlier id can never come out of the tokenizer, which usually means
  a vocab assembled by hand or two vocabs concatenated.
  """
  fileio.check_file(vocab_file, "vocab file")
  vocab = collections.OrderedDict()
  repeats = []
  for number, line in fileio.read_lines(vocab_file):
    token = line.strip()
    if token in vocab:
      repeats.append((token, vocab[token] + 1, number))
    vocab[token] = number - 1
  if repeats:
    token, first, again = repeats[0]
    more = f" ({len(repeats) - 1} more repeated line(s))" if len(repeats) > 1 else ""
    logging.warning("vocab file %s: token %r on line %d repeats line %d; the later line's id is "
                    "used%s", vocab_file, token, again, first, more)
  return vocab


def check_vocab_fits(vocab_size, config, vocab_file, config_source="the model config"):
  """Raises InputError when ids of a vocab of `vocab_size` tokens cannot be embedded by a model
  of `config` (an id >= config.vocab_size would fail deep inside the embedding lookup), naming
  both files. A smaller vocab is fine: it only leaves rows of the embedding unused."""
  if vocab_size > config.vocab_size:
    raise fileio.InputError(
        f"vocab file {vocab_file} has {vocab_size} tokens but {config_source} has vocab_size="
        f"{config.vocab_size}: ids from {config.vocab_size} up cannot be embedded; use the vocab "
        "the model was trained with")


def check_special_tokens(vocab, vocab_file, required=SPECIAL_TOKENS, reason=None):
  """Raises InputError naming `vocab_file` unless the vocab holds every token of `required`.

  With a `reason` (why they are needed, e.g. "pre-training data needs it for its masked
  positions") the message names the missing tokens of `required` and the reason; without one,
  every special token the vocab lacks, asking whether it is a BERT vocab at all.
  """
  if all(token in vocab for token in required):
    return
  if reason:
    missing = [token for token in required if token not in vocab]
    raise fileio.InputError(f"vocab file {vocab_file} has no {' '.join(missing)}: {reason}")
  missing = [token for token in SPECIAL_TOKENS if token not in vocab]
  raise fileio.InputError(
      f"vocab file {vocab_file} lacks the special token(s) {' '.join(missing)}; "
      f"is it a BERT WordPiece vocab (one token per line)?")


def convert_by_vocab(vocab, items):
  """Maps items through `vocab` (token->id or id->token); an unknown item raises KeyError."""
  return [vocab[item] for item in items]


def convert_tokens_to_ids(vocab, tokens):
  return convert_by_vocab(vocab, tokens)


def convert_ids_to_tokens(inv_vocab, ids):
  return convert_by_vocab(inv_vocab, ids)


def truncate_seq_pair(tokens_a, tokens_b, max_length):
  """Shortens two token lists in place until together they hold at most `max_length` tokens.

  Each step drops the last token of whichever list is longer at that moment (of `tokens_b` on a
  tie), as the original does: a short text keeps its few, informative tokens while a long one
  loses its tail, rather than both losing the same share.
  """
  while len(tokens_a) + len(tokens_b) > max_length:
    (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def whitespace_tokenize(text):
  """Splits on runs of (Unicode) whitespace, dropping leading and trailing whitespace."""
  return text.split()


def is_whitespace(char):
  # Tab, newline and carriage return are control characters to Unicode but separate words.
  return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def is_control(char):
  if char in "\t\n\r":
    return False
  return unicodedata.category(char) in ("Cc", "Cf")


def is_punctuation(char):
  # The four ASCII ranges below are every printable character that is not a letter, digit or
  # space; nine of them (^ $ ` + < = > | ~) are symbols (S*) to Unicode but split words all the
  # same. Outside ASCII only the P* categories split.
  cp = ord(char)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")


def is_chinese_char(cp):
  for low, high in CJK_RANGES:
    if low <= cp <= high:
      return True
  return False


# The original's names of the three character rules (module-private there; its tests call them).
_is_whitespace = is_whitespace
_is_control = is_control
_is_punctuation = is_punctuation


def cleaned_char(char):
  """What `BasicTokenizer._clean_text` puts in place of one character ("" to drop it)."""
  if char in ("\x00", "\ufffd") or is_control(char):
    return ""
  return " " if is_whitespace(char) else char


class BasicTokenizer:
  """Cleans text and splits it into words: whitespace, punctuation, CJK ideographs, casing."""

  def __init__(self, do_lower_case=True):
    self.do_lower_case = do_lower_case

  def tokenize(self, text):
    words = []
    for word in self.whitespace_words(text):
      words.extend(self.split_word(word))
    return words

  def whitespace_words(self, text):
    """The text cleaned and split on whitespace, each CJK ideograph a word of its own: the words
    `split_word` takes (a vocabulary builder counts these once each)."""
    text = self._clean_text(convert_to_unicode(text))
    # Chinese puts no spaces between words, so each ideograph is made a word of its own. English
    # models do this too: their vocab has the ideographs that occur in English Wikipedia.
    return whitespace_tokenize(self._tokenize_chinese_chars(text))

  def split_word(self, word):
    """One whitespace-free word -> its lower-cased, accent-stripped, punctuation-split parts."""
    if self.do_lower_case:
      word = self._run_strip_accents(word.lower())
    # Joining with spaces and splitting again (as the original does) drops empty parts and splits
    # on any whitespace the normalization might produce.
    return whitespace_tokenize(" ".join(self._run_split_on_punc(word)))

  def _run_strip_accents(self, text):
    """Decomposes (NFD) and drops the combining marks (Mn): 'é' -> 'e', but 'ß' and 'ø' stay."""
    return "".join(c for c in unicodedata.normalize("NFD", text)
                   if unicodedata.category(c) != "Mn")

  def _run_split_on_punc(self, text):
    """Makes every punctuation character a part of its own: "don't" -> ["don", "'", "t"]."""
    parts = []
    current = []
    for char in text:
      if is_punctuation(char):
        if current:
          parts.append("".join(current))
          current = []
        parts.append(char)
      else:
        current.append(char)
    if current:
      parts.append("".join(current))
    return parts

  def _tokenize_chinese_chars(self, text):
    return "".join(f" {c} " if is_chinese_char(ord(c)) else c for c in text)

  def _is_chinese_char(self, cp):
    """The original's method name for is_chinese_char (a code point in CJK_RANGES)."""
    return is_chinese_char(cp)

  def _clean_text(self, text):
    """Drops NUL, U+FFFD and control/format characters; turns every whitespace into a space."""
    return "".join(map(cleaned_char, text))


class WordpieceTokenizer:
  """Splits words into vocab pieces, greedily taking the longest piece that matches first."""

  def __init__(self, vocab, unk_token="[UNK]", max_input_chars_per_word=200):
    self.vocab = vocab
    self.unk_token = unk_token
    self.max_input_chars_per_word = max_input_chars_per_word
    # No candidate longer than the longest vocab entry can match, so none is tried (same result).
    self._longest = max(map(len, vocab), default=0)

  def tokenize(self, text):
    """Whitespace-separated words -> pieces, e.g. "pretraining" -> ["pre", "##train", "##ing"].

    A word that cannot be covered completely by vocab pieces, or that is longer than
    `max_input_chars_per_word` characters, becomes a single `unk_token`: a partial split would
    suggest a meaning the model never saw.
    """
    output = []
    for word in whitespace_tokenize(convert_to_unicode(text)):
      output.extend(self.split_word(word))
    return output

  def split_word(self, word):
    """One whitespace-free word -> its pieces, or [unk_token]."""
    if len(word) > self.max_input_chars_per_word:
      return [self.unk_token]
    pieces = []
    start = 0
    while start < len(word):
      end = min(len(word), start + self._longest - (2 if start else 0))
      while end > start:
        piece = word[start:end] if start == 0 else "##" + word[start:end]
        if piece in self.vocab:
          break
        end -= 1
      else:
        return [self.unk_token]
      pieces.append(piece)
      start = end
    return pieces


# The batch path's versions of BasicTokenizer's character rules, as whole-string operations.
_MAX_CACHED_WORDS = 1 << 20
# ASCII characters that _clean_text drops; str.split() would instead split on some of them.
_ASCII_CLEAN_TABLE = {cp: None for cp in [*range(0, 9), 11, 12, *range(14, 32), 127]}
_ASCII_PARTS = re.compile("[A-Za-z0-9]+|[^A-Za-z0-9]")
_CJK_CHAR = re.compile("([" + "".join(f"{chr(low)}-{chr(high)}" for low, high in CJK_RANGES)
                       + "])")


class _CleanTable(dict):
  """str.translate table doing BasicTokenizer._clean_text: code point -> None (drop), " " or
  itself. Filled on demand, one code point at a time, by the reference predicates, so the two
  paths cannot drift apart and a new process pays only for the characters it meets."""

  def __missing__(self, cp):
    char = chr(cp)
    if cp == 0 or cp == 0xFFFD or is_control(char):
      value = None
    elif is_whitespace(char):
      value = " "
    else:
      value = cp
    self[cp] = value
    return value


_CLEAN_TABLE = _CleanTable()


def preprocess_for_sentencepiece(text, lower):
  """ALBERT's normalization before SentencePiece: collapse whitespace, strip accents, lower-case.

  Accents are stripped after compatibility decomposition (NFKD), as ALBERT's models saw them.
  """
  text = " ".join(text.split())
  text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
  return text.lower() if lower else text


def is_sentencepiece_model(vocab_file):
  """Whether `vocab_file` is a SentencePiece model (what build_vocab.py --vocab_type=sentencepiece
  writes as spm.model) rather than a WordPiece vocab.txt: named *.model, or not UTF-8 text (a
  model is a binary protocol buffer)."""
  if vocab_file.endswith(".model"):
    return True
  try:
    with fileio.open_input(vocab_file, "rb") as f:
      head = f.read(4096)
  except (OSError, fileio.InputError):
    return False  # load_vocab's check names the problem
  try:
    head.decode("utf-8")
  except UnicodeDecodeError as e:
    return e.start < len(head) - 4  # not a character cut by the 4096-byte read
  return b"\0" in head


def load_tokenizer(vocab_file, do_lower_case=True, check=True):
  """The FullTokenizer of a --vocab_file: a WordPiece vocab.txt, or a SentencePiece model (read
  with sentencepiece, its pieces as the vocab), so that either vocabulary build_vocab.py writes
  works in every script. With `check`, a WordPiece vocab that cannot make sense of text is
  refused or warned about (check_vocab_sense); worker processes pass False (their parent
  checked)."""
  if is_sentencepiece_model(vocab_file):
    tokenizer = FullTokenizer(None, do_lower_case, spm_model_file=vocab_file)
    check_special_tokens(tokenizer.vocab, vocab_file)
    return tokenizer
  tokenizer = FullTokenizer(vocab_file, do_lower_case)
  if check:
    check_vocab_sense(tokenizer.vocab, vocab_file, do_lower_case)
  return tokenizer


_BRACKETED = re.compile(r"\[[^\]]*\]")


def check_vocab_sense(vocab, vocab_file, do_lower_case):
  """InputError for a WordPiece vocab with no word pieces at all (only [UNK]-like bracketed
  entries: every word would become [UNK]); a warning for one that is nearly so, and for a casing
  that contradicts --do_lower_case (capitals in many pieces while the text is lower-cased, so
  those pieces never match; none in a large vocab while the text keeps its capitals, so every
  capitalised word splits or becomes [UNK])."""
  words = [token for token in vocab if token and not _BRACKETED.fullmatch(token)]
  if not words:
    raise fileio.InputError(
        f"vocab file {vocab_file} holds no word pieces, only bracketed entries like [UNK]: "
        f"every word would become [UNK]")
  if len(words) < 0.1 * len(vocab):
    logging.warning("vocab file %s: only %d of its %d entries are word pieces (the rest are "
                    "bracketed, like [UNK]): most words will become [UNK]", vocab_file,
                    len(words), len(vocab))
  alphabetic = [w for w in words if any(c.isalpha() for c in w)]
  cased = sum(w != w.lower() for w in alphabetic)
  if do_lower_case and cased >= max(1, 0.05 * len(alphabetic)):
    logging.warning(
        "vocab file %s looks cased (%d of its %d alphabetic pieces hold capitals) but "
        "--do_lower_case is true: the text is lower-cased and those pieces never match; a cased "
        "model needs --do_lower_case=false", vocab_file, cased, len(alphabetic))
  elif not do_lower_case and not cased and len(alphabetic) >= 1000:
    logging.warning(
        "vocab file %s looks uncased (none of its %d alphabetic pieces holds a capital) but "
        "--do_lower_case is false: capitalised words split into odd pieces or become [UNK]; an "
        "uncased model needs --do_lower_case=true", vocab_file, len(alphabetic))


class FullTokenizer:
  """Text -> tokens -> ids with a WordPiece vocab file, or with a SentencePiece model.

  A WordPiece vocab must hold REQUIRED_TOKENS ([UNK] [CLS] [SEP]); [PAD] and [MASK] are needed
  only where they are used (see REQUIRED_TOKENS), so the original's small test vocabs load.

  Attributes:
    vocab: OrderedDict token -> id.
    inv_vocab: dict id -> token.
    vocab_file: the vocab file (or SentencePiece model) it was loaded from.
  """

  def __init__(self, vocab_file, do_lower_case=True, spm_model_file=None):
    self.do_lower_case = do_lower_case
    # For messages about the vocab's tokens where they are needed (pre-training data's [MASK]).
    self.vocab_file = spm_model_file or vocab_file
    self.sp_model = None
    if spm_model_file:
      import sentencepiece as spm  # Only needed in this mode.
      fileio.check_file(spm_model_file, "SentencePiece model file")
      self.sp_model = spm.SentencePieceProcessor()
      try:
        if fileio.is_remote(spm_model_file):  # SentencePiece reads local files only
          with fileio.open_input(spm_model_file, "rb") as f:
            self.sp_model.LoadFromSerializedProto(f.read())
        else:
          self.sp_model.Load(spm_model_file)
      except (OSError, RuntimeError) as e:
        raise fileio.InputError(f"{spm_model_file}: not a SentencePiece model ({e})") from None
      # Callers read .vocab / .inv_vocab in either mode, so they are built from the model's pieces.
      self.vocab = collections.OrderedDict(
          (self.sp_model.IdToPiece(i), i) for i in range(self.sp_model.GetPieceSize()))
    else:
      self.vocab = load_vocab(vocab_file)
      check_special_tokens(self.vocab, vocab_file, REQUIRED_TOKENS)
      self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
      self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)
    self.inv_vocab = {i: token for token, i in self.vocab.items()}
    # Caches for the batch path: whitespace-separated word (as it appears after cleaning) -> its
    # tokens / ids. Natural text repeats a few tens of thousands of words, so after warming up
    # almost every word costs one dict lookup instead of the per-character reference rules.
    self._token_cache = {}
    self._id_cache = {}
    self._part_cache = {}

  def tokenize(self, text):
    """One text -> list of tokens (the reference path; see tokenize_batch for speed)."""
    if self.sp_model is not None:
      return self._sentencepiece_tokenize(text)
    tokens = []
    for word in self.basic_tokenizer.tokenize(text):
      tokens.extend(self.wordpiece_tokenizer.tokenize(word))
    return tokens

  def tokenize_batch(self, texts):
    """Texts -> list of token lists, equal to [self.tokenize(t) for t in texts] but much faster.

    The reference rules act on each whitespace-separated word independently once the text is
    cleaned, so each distinct word is run through them once and its tokens are reused. Cleaning
    and lower-casing of pure-ASCII texts (nearly all English text) is done with whole-string
    methods; only texts with other characters go through the full Unicode tables.
    """
    if self.sp_model is not None:
      return [self.tokenize(text) for text in texts]
    return self._run_batch(texts, self._token_cache, self._word_tokens)

  def tokenize_batch_keeping_special_tokens(self, texts):
    """tokenize_batch, but the special tokens written in a text ("[CLS]", "[SEP]", "[MASK]",
    "[PAD]", "[UNK]", exactly so cased) come out as those tokens, as HuggingFace's tokenizers
    (and so sentence-transformers) take them, where the original's BasicTokenizer splits them
    into "[", "cl", "##s", "]" (what tokenize_batch keeps)."""
    pattern = "|".join(re.escape(t) for t in SPECIAL_TOKENS if t in self.vocab)
    if not pattern:
      return self.tokenize_batch(texts)
    pattern = re.compile(f"({pattern})")
    parts = [pattern.split(text) for text in texts]
    # Every other part is a special token; the texts between them go through the batch path.
    pieces = iter(self.tokenize_batch([p for split in parts for p in split[::2]]))
    result = []
    for split in parts:
      tokens = []
      for i, part in enumerate(split):
        tokens.extend(next(pieces) if i % 2 == 0 else [part])
      result.append(tokens)
    return result

  def encode_batch(self, texts):
    """Texts -> list of id lists, equal to tokenizing each text and converting tokens to ids."""
    if self.sp_model is not None:
      return [self.convert_tokens_to_ids(self.tokenize(text)) for text in texts]
    return self._run_batch(texts, self._id_cache, self._word_ids)

  def _run_batch(self, texts, cache, word_fn):
    # The batch path makes hundreds of thousands of small lists and no reference cycles; with the
    # cyclic garbage collector paused it runs about a quarter faster (benchmarks/tokenization.py).
    enabled = gc.isenabled()
    gc.disable()
    try:
      return self._run_batch_unpaused(texts, cache, word_fn)
    finally:
      if enabled:
        gc.enable()

  def _run_batch_unpaused(self, texts, cache, word_fn):
    output = []
    lookup, get = cache.__getitem__, cache.get
    chain = itertools.chain.from_iterable
    for text in texts:
      words = self._clean_words(text)
      try:
        output.append(list(chain(map(lookup, words))))
      except KeyError:
        # Rare once warm: bound the memory on huge corpora of ever-new words (numbers, URLs).
        if len(cache) > _MAX_CACHED_WORDS:
          cache.clear()
          self._part_cache.clear()
        # One pass that looks each word up once (a cold pass meets a new word in most texts).
        ids = []
        for word in words:
          found = get(word)
          if found is None:
            found = cache[word] = word_fn(word)
          ids += found
        output.append(ids)
    return output

  def _clean_words(self, text):
    """The words BasicTokenizer.tokenize splits on whitespace, before per-word processing.

    ASCII texts are also lower-cased as a whole (the same as per word, and it makes "The" and
    "the" one cache entry); other texts keep their case here, as Unicode lower-casing can depend
    on the neighbouring characters, and are lower-cased word by word in `_word_tokens`.
    """
    if not isinstance(text, str):
      text = convert_to_unicode(text)
    # Every character _clean_text changes is non-printable to Python except U+FFFD, so the
    # common all-printable text skips the per-character translation.
    if text.isascii():
      if not text.isprintable():
        text = text.translate(_ASCII_CLEAN_TABLE)
      if self.do_lower_case:
        text = text.lower()
      return text.split()
    if not text.isprintable() or "\ufffd" in text:
      text = text.translate(_CLEAN_TABLE)
    if _CJK_CHAR.search(text):
      text = _CJK_CHAR.sub(r" \1 ", text)
    return text.split()

  def _word_tokens(self, word):
    if word.isascii():
      if self.do_lower_case:
        word = word.lower()
      # Most new words are whole vocab entries of letters and digits: nothing to split off,
      # and the longest match is the word itself.
      if word.isalnum() and word in self.vocab:
        return [word]
      # Nothing to strip from ASCII, and every ASCII character that is not a letter or digit is
      # punctuation (the cleaning has removed the rest).
      parts = _ASCII_PARTS.findall(word)
    else:
      parts = self.basic_tokenizer.split_word(word)
    tokens = []
    for part in parts:
      # Parts recur across words ("the" in "the," and "(the"), so they have a cache too.
      pieces = self._part_cache.get(part)
      if pieces is None:
        pieces = self._part_cache[part] = self.wordpiece_tokenizer.split_word(part)
      tokens.extend(pieces)
    return tokens

  def _word_ids(self, word):
    tokens = self._token_cache.get(word)
    if tokens is None:
      if word.isascii() and word.isalnum():
        # The common new word, a whole vocab entry (_word_tokens' first case), without the lists.
        token_id = self.vocab.get(word.lower() if self.do_lower_case else word)
        if token_id is not None:
          return [token_id]
      tokens = self._word_tokens(word)
    return convert_by_vocab(self.vocab, tokens)

  def convert_tokens_to_ids(self, tokens):
    if self.sp_model is not None:
      return [self.sp_model.PieceToId(printable_text(token)) for token in tokens]
    return convert_by_vocab(self.vocab, tokens)

  def convert_ids_to_tokens(self, ids):
    if self.sp_model is not None:
      return [self.sp_model.IdToPiece(int(i)) for i in ids]
    return convert_by_vocab(self.inv_vocab, ids)

  def _sentencepiece_tokenize(self, text):
    text = preprocess_for_sentencepiece(convert_to_unicode(text), self.do_lower_case)
    tokens = []
    for piece in self.sp_model.EncodeAsPieces(text):
      if len(piece) >= 2 and piece.endswith(",") and piece[-2].isdigit():
        tokens.extend(self._split_number_comma(piece))
      else:
        tokens.append(piece)
    return tokens

  def _split_number_comma(self, piece):
    """A piece such as "▁1990," -> the pieces of "1990" on its own, then "," (ALBERT's rule).

    Without it a number directly followed by a comma would get pieces unlike the bare number's.
    """
    number = piece[:-1].replace(_SPIECE_UNDERLINE, "")
    parts = list(self.sp_model.EncodeAsPieces(number))
    # Encoded alone, the number gets a word-start marker; a piece that continued a word had none.
    if parts and not piece.startswith(_SPIECE_UNDERLINE) and parts[0].startswith(_SPIECE_UNDERLINE):
      head = parts.pop(0)[1:]
      if head:
        parts.insert(0, head)
    return parts + [","]


def _tensorflow_text_release():
  """tensorflow-text's release for the installed TensorFlow (its ops are built for one minor
  version: 2.21.1's fail to load under 2.20), read from the package metadata without importing
  TensorFlow."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  for name in ("tensorflow-cpu", "tensorflow", "tensorflow-tpu"):
    try:
      minor = ".".join(importlib.metadata.version(name).split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
      continue
    return {"2.20": "2.20.1"}.get(minor, "2.21.1")
  return "2.21.1"


# tensorflow-text is not a dependency of the package (its metadata asks for the full `tensorflow`
# wheel, which pip would install on top of tensorflow-cpu): a clear line when it is missing.
TEXT_INSTALL = ("building a WordPiece vocabulary needs tensorflow-text, which is not installed: "
                f"pip install --no-deps tensorflow-text=={_tensorflow_text_release()} (--no-deps: "
                "its metadata would pull the full tensorflow wheel on top of tensorflow-cpu)")


def wordpiece_learner():
  """tensorflow-text's WordPiece learner (its pure-Python module; importing it loads the ops);
  ReportedError naming the install line when tensorflow-text is missing."""
  try:
    # pylint: disable-next=g-import-not-at-top
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib
  except ImportError:
    raise fileio.ReportedError(TEXT_INSTALL) from None
  except Exception as e:  # pylint: disable=broad-except  (a release built for another TensorFlow)
    if type(e).__name__ != "NotFoundError":
      raise
    raise fileio.ReportedError(f"tensorflow-text does not fit the installed TensorFlow ("
                               f"{str(e).splitlines()[0][:120]}): {TEXT_INSTALL.split(': ', 1)[1]}"
                               ) from None
  return wordpiece_tokenizer_learner_lib
