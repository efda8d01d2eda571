"""Tests for tokenization.py: the original BERT tokenizer's behaviour, exactly, and the fast path.

Expected outputs below were checked by hand against the rules of google-research/bert's
tokenization.py; the strongest check is that the reference TFRecords written by the original
create_pretraining_data.py are reproduced segment by segment.
"""

import os
import unicodedata

from hypothesis import given, settings, strategies as st
import pytest

from conftest import SHARED, VOCAB, WIKITEXT, corpus_texts, requires_shared
from bert_tf2 import fileio
from bert_tf2 import tokenization

PRETRAINING = os.path.join(SHARED, "reference", "pretraining")
CONLL = os.path.join(SHARED, "data", "conll2003", "valid.txt")

# Characters whose handling differs between tokenizers: dropped (NUL, U+FFFD, controls, format
# characters such as the zero-width joiner and BOM), turned into spaces (tab, no-break space,
# ideographic space), splitting words without being spaces (line/paragraph separators), CJK,
# accents and combining marks, case-folding traps (ß, İ, final sigma, ligature), ASCII symbols
# that Unicode does not call punctuation, and astral-plane emoji.
EDGE_CHARS = ("\x00", "\ufffd", "\x07", "\x1c", "\x7f", "\x85", "\u200d", "\ufeff", "\t", "\n",
              "\r", "\x0b", "\u00a0", "\u3000", "\u2028", "\u2029", "你", "好", "\uf900",
              "\U00020000", "é", "e\u0301", "\u0301", "ß", "İ", "Σ", "ﬁ", "…", "½", "º", "$",
              "^", "`", "+", "~", "-", "'", "¿", "«", "🙂", "❤", "\u2764\ufe0f", " ", "A", "z",
              "0", "ü", "Ö")

EDGE_TEXTS = [
    "", "   ", "Héllo wörld", "HeLLo!how  \n Are yoU?", "你好世界", "ah\u535a\u63a8zz",
    "a\x00b\ufffd\x07c d\te\n", "I \u2764\ufe0f NY 🙂!", "$5.00 isn't 50%!", "x" * 201,
    "straße … ½ º", "İstanbul ΟΔΟΣ ΣΑΣ ﬁne", "a\u2028b\u2029c", "a\u200db\ufeffc",
    "e\u0301t\u00e9", "«¿Qué?» —dijo", "\u3000全角\u3000スペース", "UNwant\u00e9d,running",
]


def _write(path, lines):
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join(line + "\n" for line in lines))
  return str(path)


@pytest.fixture(scope="module")
def cased_vocab_file(tmp_path_factory):
  """A cased vocab built from the uncased one: every whole word also capitalized and upper-cased.

  No cased BERT vocab ships with the shared data; this one makes the do_lower_case=False path
  produce realistic cased tokens ("Paris", "NATO", "##ing") instead of mostly [UNK].
  """
  words = [line.rstrip("\n") for line in open(VOCAB, encoding="utf-8")]
  seen = set(words)
  extra = []
  for word in words:
    if word.isalpha() and not word.startswith("##"):
      for variant in (word.capitalize(), word.upper()):
        if variant not in seen:
          seen.add(variant)
          extra.append(variant)
  return _write(tmp_path_factory.mktemp("cased") / "vocab_cased.txt", words + extra)


@pytest.fixture(scope="module")
def cased(cased_vocab_file):
  return tokenization.FullTokenizer(cased_vocab_file, do_lower_case=False)


@pytest.fixture
def toy_vocab_file(tmp_path):
  # The original's unit-test vocabulary, plus the special tokens every vocab must have.
  return _write(tmp_path / "vocab.txt", [
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "want", "##want", "##ed", "wa", "un", "runn",
      "##ing", ",", "##aff", "##able"])


# --- The original's own unit-test facts --------------------------------------------------------


def test_full_tokenizer_on_toy_vocab(toy_vocab_file):
  tokenizer = tokenization.FullTokenizer(toy_vocab_file)
  tokens = tokenizer.tokenize("UNwant\u00e9d,running")
  assert tokens == ["un", "##want", "##ed", ",", "runn", "##ing"]
  assert tokenizer.convert_tokens_to_ids(tokens) == [9, 6, 7, 12, 10, 11]
  assert tokenizer.convert_ids_to_tokens([9, 6, 7, 12, 10, 11]) == tokens
  assert tokenizer.tokenize_batch(["UNwant\u00e9d,running"]) == [tokens]
  assert tokenizer.encode_batch(["UNwant\u00e9d,running", ""]) == [[9, 6, 7, 12, 10, 11], []]


def test_wordpiece_tokenizer(toy_vocab_file):
  vocab = tokenization.load_vocab(toy_vocab_file)
  wordpiece = tokenization.WordpieceTokenizer(vocab=vocab)
  assert wordpiece.tokenize("") == []
  assert wordpiece.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
  # One unmatched character makes the whole word [UNK], not just its tail.
  assert wordpiece.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]
  assert wordpiece.tokenize("unaffable") == ["un", "##aff", "##able"]
  assert wordpiece.max_input_chars_per_word == 200


def test_basic_tokenizer_lower_and_cased():
  text = " \tHeLLo!how  \n Are yoU?  "
  assert tokenization.BasicTokenizer(do_lower_case=True).tokenize(text) == [
      "hello", "!", "how", "are", "you", "?"]
  assert tokenization.BasicTokenizer(do_lower_case=False).tokenize(text) == [
      "HeLLo", "!", "how", "Are", "yoU", "?"]
  assert tokenization.BasicTokenizer().tokenize("H\u00e9llo") == ["hello"]
  assert tokenization.BasicTokenizer().tokenize("ah\u535a\u63a8zz") == [
      "ah", "\u535a", "\u63a8", "zz"]


def test_character_classes():
  for char in (" ", "\t", "\r", "\n", "\u00a0", "\u3000"):
    assert tokenization.is_whitespace(char), repr(char)
  for char in ("A", "-", "\u2028"):
    assert not tokenization.is_whitespace(char), repr(char)
  for char in ("\u0005", "\x7f", "\u200d", "\ufeff"):
    assert tokenization.is_control(char), repr(char)
  for char in ("A", " ", "\t", "\r", "\n", "\ue000"):  # Private use (Co) is kept.
    assert not tokenization.is_control(char), repr(char)
  for char in ("-", "$", "`", ".", "^", "~", "\u00bf", "\u2014", "\u300c"):
    assert tokenization.is_punctuation(char), repr(char)
  for char in ("A", " ", "5", "\u00a9", "\U0001f642"):  # (c) and emoji are symbols (S*), not P*.
    assert not tokenization.is_punctuation(char), repr(char)
  assert tokenization.is_chinese_char(ord("\u4e00")) and tokenization.is_chinese_char(0x2CEAF)
  assert not tokenization.is_chinese_char(ord("\u3042"))  # Hiragana is not split.
  assert not tokenization.is_chinese_char(ord("\uac00"))  # Nor is Hangul.


# --- Hand-checked outputs with the real uncased vocab ------------------------------------------


@requires_shared
def test_load_vocab_and_special_ids(uncased):
  assert len(uncased.vocab) == 30522
  assert list(uncased.vocab)[:1] == ["[PAD]"]
  assert [uncased.vocab[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
      0, 100, 101, 102, 103]
  assert uncased.inv_vocab[2023] == "this"
  ids = uncased.convert_tokens_to_ids(["[CLS]", "hello", "world", "[SEP]"])
  assert uncased.convert_ids_to_tokens(ids) == ["[CLS]", "hello", "world", "[SEP]"]
  # Like the original, an out-of-vocab token is an error rather than a silent [UNK].
  with pytest.raises(KeyError):
    uncased.convert_tokens_to_ids(["Hello"])


@requires_shared
@pytest.mark.parametrize("text, expected", [
    ("Héllo wörld", ["hello", "world"]),
    ("Héllo, WÖRLD!", ["hello", ",", "world", "!"]),
    ("e\u0301t\u00e9", ["et", "##e"]),  # Precomposed and combining accents both go.
    ("你好世界", ["[UNK]", "[UNK]", "世", "[UNK]"]),  # One word per ideograph; 3 are not in vocab.
    ("a\x00b\ufffd\x07c d\te\n", ["abc", "d", "e"]),  # Dropped characters join their neighbours.
    ("a\u200db\ufeffc", ["abc"]),  # So do format characters (Cf).
    ("a\u2028b", ["a", "b"]),  # Not cleaned, but a separator to str.split().
    ("$5.00 isn't 50%!", ["$", "5", ".", "00", "isn", "'", "t", "50", "%", "!"]),
    ("I \u2764\ufe0f NY 🙂!", ["i", "[UNK]", "ny", "[UNK]", "!"]),  # Emoji are words, not punct.
    ("straße … ½", ["st", "##raße", "…", "½"]),  # No case folding: ß, …, ½ stay (tf-text: ss, ...).
    ("İstanbul", ["istanbul"]),  # lower() gives i + combining dot, which NFD stripping drops.
    ("unaffable", ["una", "##ffa", "##ble"]),  # Greedy longest-first, not linguistic.
    ("x" * 201, ["[UNK]"]),
    ("", []),
])
def test_uncased_hand_checked(uncased, text, expected):
  assert uncased.tokenize(text) == expected
  assert uncased.tokenize_batch([text]) == [expected]


@requires_shared
def test_long_words(uncased):
  # 200 characters is still split into pieces; 201 becomes one [UNK].
  tokens = uncased.tokenize("a" * 200)
  assert "[UNK]" not in tokens and "".join(t.replace("##", "") for t in tokens) == "a" * 200
  assert uncased.tokenize("b " + "a" * 201 + " c") == ["b", "[UNK]", "c"]
  # The limit applies to words after punctuation splitting.
  tokens = uncased.tokenize("a" * 150 + "." + "a" * 150)
  assert "[UNK]" not in tokens and tokens.count(".") == 1


@requires_shared
def test_cased_mode_keeps_case_and_accents(uncased, cased):
  basic = tokenization.BasicTokenizer(do_lower_case=False)
  assert basic.tokenize("Héllo wörld 你好") == ["Héllo", "wörld", "你", "好"]
  assert cased.tokenize("Paris is in FRANCE.") == ["Paris", "is", "in", "FRANCE", "."]
  # The uncased vocab has no capitals, so without lower-casing capitalized words are [UNK].
  no_lower = tokenization.FullTokenizer(VOCAB, do_lower_case=False)
  assert no_lower.tokenize("Hello world") == ["[UNK]", "world"]


# --- The original pipeline's output: the reference pre-training TFRecords ----------------------


@requires_shared
def test_reproduces_reference_pretraining_records(uncased):
  """Every A/B segment of the original's records is a run of our tokens of one document.

  The masked positions are restored from masked_lm_ids first, so every token of every record is
  checked; segments are contiguous slices of a document (truncation only cuts the ends).
  """
  import tensorflow as tf

  documents = [[]]
  for _, line in fileio.read_lines(os.path.join(PRETRAINING, "sample_text.txt")):
    if not line.strip():
      documents.append([])
    else:
      documents[-1].extend(uncased.convert_tokens_to_ids(uncased.tokenize(line)))
  haystacks = [" %s " % " ".join(map(str, doc)) for doc in documents if doc]
  assert len(haystacks) == 3

  features = {name: tf.io.VarLenFeature(tf.int64)
              for name in ("input_ids", "input_mask", "masked_lm_positions", "masked_lm_ids")}
  features["masked_lm_weights"] = tf.io.VarLenFeature(tf.float32)
  checked = 0
  for name in ("default", "wwm_seq64", "seq512"):
    for record in tf.data.TFRecordDataset(os.path.join(PRETRAINING, name + ".tfrecord")):
      example = {k: tf.sparse.to_dense(v).numpy()
                 for k, v in tf.io.parse_single_example(record, features).items()}
      ids = example["input_ids"].copy()
      real = example["masked_lm_weights"] > 0
      ids[example["masked_lm_positions"][real]] = example["masked_lm_ids"][real]
      ids = ids[:int(example["input_mask"].sum())].tolist()
      assert ids[0] == uncased.vocab["[CLS]"] and ids[-1] == uncased.vocab["[SEP]"]
      sep = ids.index(uncased.vocab["[SEP]"])
      for segment in (ids[1:sep], ids[sep + 1:-1]):
        needle = " %s " % " ".join(map(str, segment))
        assert any(needle in h for h in haystacks), (name, uncased.convert_ids_to_tokens(segment))
        checked += 1
  assert checked == 372


# --- Fast batch path == reference path ---------------------------------------------------------


def _real_texts():
  texts = corpus_texts()
  sentence = []
  for _, line in fileio.read_lines(CONLL):
    if line.strip():
      sentence.append(line.split(" ")[0])
    elif sentence:
      texts.append(" ".join(sentence))
      sentence = []
  return texts + EDGE_TEXTS


@pytest.mark.slow
@requires_shared
@pytest.mark.parametrize("mode", ["uncased", "cased"])
def test_fast_path_equals_reference_on_real_data(mode, request):
  tokenizer = request.getfixturevalue(mode)
  texts = _real_texts()
  assert len(texts) > 20000
  reference = [tokenizer.tokenize(text) for text in texts]
  assert tokenizer.tokenize_batch(texts) == reference
  assert tokenizer.tokenize_batch(texts) == reference  # Second pass: all from the cache.
  assert tokenizer.encode_batch(texts) == [tokenizer.convert_tokens_to_ids(t) for t in reference]
  # Bytes are accepted (decoded as UTF-8) by both paths, as in the original.
  assert tokenizer.tokenize_batch([t.encode("utf-8") for t in texts[:50]]) == reference[:50]


@requires_shared
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(st.sampled_from(EDGE_CHARS), st.characters()),
                         max_size=40).map("".join), max_size=4))
def test_fast_path_equals_reference_on_random_text(texts):
  for tokenizer in _random_text_tokenizers():
    assert tokenizer.tokenize_batch(texts) == [tokenizer.tokenize(t) for t in texts]


_TOKENIZERS = []


def _random_text_tokenizers():
  # Hypothesis forbids function-scoped fixtures; the vocab is loaded once per session instead.
  if not _TOKENIZERS:
    _TOKENIZERS.extend(tokenization.FullTokenizer(VOCAB, do_lower_case=lower)
                       for lower in (True, False))
  return _TOKENIZERS


def test_unicode_clean_table_matches_reference_rules():
  for cp in list(range(0x3000)) + [0xFEFF, 0xFFFD, 0xFFF9, 0xE0001, 0xE0020, 0x110BD, 0x1D173]:
    char = chr(cp)
    cleaned = char.translate(tokenization._CLEAN_TABLE)
    if cp == 0 or cp == 0xFFFD or tokenization.is_control(char):
      assert cleaned == "", hex(cp)
    elif tokenization.is_whitespace(char):
      assert cleaned == " ", hex(cp)
    else:
      assert cleaned == char, hex(cp)


# --- SentencePiece mode ------------------------------------------------------------------------


@requires_shared
def test_sentencepiece_mode(tmp_path):
  import sentencepiece as spm

  lines = [line for _, line in fileio.read_lines(WIKITEXT) if line.strip()][:3000]
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "sp"),
                                 vocab_size=500, model_type="unigram", num_threads=1,
                                 minloglevel=2)
  model = str(tmp_path / "sp.model")
  tokenizer = tokenization.FullTokenizer(None, do_lower_case=True, spm_model_file=model)
  processor = spm.SentencePieceProcessor(model_file=model)
  assert len(tokenizer.vocab) == 500 and tokenizer.inv_vocab[tokenizer.vocab["▁the"]] == "▁the"

  texts = lines[:200] + ["In 1990, the Café ``opened'' in Zürich\u00a0\ufb01ne."]
  for text in texts:
    tokens = tokenizer.tokenize(text)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    # Pieces for characters the model has not seen map to its <unk> id.
    assert tokens and tokenizer.convert_ids_to_tokens(ids) == [
        t if t in tokenizer.vocab else "<unk>" for t in tokens]
    assert all(0 <= i < 500 for i in ids)
    # The pieces spell out the lower-cased, accent-stripped text, whitespace collapsed.
    expected = "".join(c for c in unicodedata.normalize("NFKD", " ".join(text.split()))
                       if not unicodedata.combining(c))
    expected = expected.lower()
    assert "".join(tokens).replace("\u2581", " ").strip() == expected
  # ALBERT's rule: a number followed by a comma is split the same as the bare number, then ",".
  tokens = tokenizer.tokenize("In 1990, the")
  assert "," in tokens and tokens[tokens.index(",") - 1].endswith("0")
  assert tokenizer.tokenize_batch(texts) == [tokenizer.tokenize(t) for t in texts]
  assert tokenizer.encode_batch(texts[:5]) == [
      tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t)) for t in texts[:5]]


# --- Bad input ---------------------------------------------------------------------------------


def test_missing_vocab_file(tmp_path):
  missing = str(tmp_path / "no_such_vocab.txt")
  with pytest.raises(fileio.InputError, match="no_such_vocab.txt"):
    tokenization.FullTokenizer(missing)


def test_vocab_without_special_tokens(tmp_path):
  path = _write(tmp_path / "words.txt", ["[PAD]", "[UNK]", "hello", "world"])
  with pytest.raises(fileio.InputError, match=r"words\.txt.*\[CLS\] \[SEP\] \[MASK\]"):
    tokenization.FullTokenizer(path)
  with pytest.raises(fileio.InputError, match="words.txt"):
    tokenization.check_special_tokens(tokenization.load_vocab(path), path)


def test_vocab_with_invalid_utf8(tmp_path):
  path = tmp_path / "latin1.txt"
  path.write_bytes(b"[PAD]\n[UNK]\ncaf\xe9\n")
  with pytest.raises(fileio.InputError, match=r"latin1\.txt:3"):
    tokenization.load_vocab(str(path))


def test_load_vocab_strips_and_numbers_lines(tmp_path):
  path = tmp_path / "v.txt"
  path.write_text("\ufeff[PAD]\n  [UNK] \r\nhello\nhello\nlast", encoding="utf-8")
  vocab = tokenization.load_vocab(str(path))
  # A repeated token keeps its last line's id; the id is always the line index.
  assert list(vocab.items()) == [("[PAD]", 0), ("[UNK]", 1), ("hello", 3), ("last", 4)]


def test_duplicate_vocab_tokens_get_one_warning_naming_file_token_and_lines(tmp_path, caplog):
  path = _write(tmp_path / "dup.txt", ["[PAD]", "[UNK]", "hello", "world", "hello", "world", "x"])
  with caplog.at_level("WARNING"):
    vocab = tokenization.load_vocab(path)
  assert (vocab["hello"], vocab["world"], len(vocab)) == (4, 5, 5)
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert warnings == [f"vocab file {path}: token 'hello' on line 5 repeats line 3; the later "
                      "line's id is used (1 more repeated line(s))"]
  caplog.clear()
  with caplog.at_level("WARNING"):
    tokenization.load_vocab(_write(tmp_path / "ok.txt", ["[PAD]", "[UNK]", "hello"]))
  assert not caplog.records


def test_validate_case_matches_checkpoint():
  check = tokenization.validate_case_matches_checkpoint
  check(True, "/models/uncased_L-12_H-768_A-12/bert_model.ckpt")
  check(False, "/models/cased_L-12_H-768_A-12/bert_model.ckpt")
  check(False, "/models/my_model/bert_model.ckpt")  # Unknown names are not checked.
  check(False, "")
  check(True, None)
  with pytest.raises(fileio.InputError, match=r"--do_lower_case=False.*--init_checkpoint="):
    check(False, "gs://bucket/uncased_L-24_H-1024_A-16/bert_model.ckpt")
  with pytest.raises(fileio.InputError, match=r"--do_lower_case=True.*multi_cased"):
    check(True, "/m/multi_cased_L-12_H-768_A-12/bert_model.ckpt-1000")
  with pytest.raises(fileio.InputError, match="chinese_L-12_H-768_A-12"):
    check(False, "chinese_L-12_H-768_A-12/bert_model.ckpt")


def test_convert_to_unicode_and_printable_text():
  assert tokenization.convert_to_unicode(b"caf\xc3\xa9") == "café"
  assert tokenization.convert_to_unicode(b"caf\xe9!") == "caf!"  # Undecodable bytes dropped.
  assert tokenization.printable_text("é") == "é"
  with pytest.raises(ValueError):
    tokenization.convert_to_unicode(5)
  assert tokenization.whitespace_tokenize("  a \t b\n") == ["a", "b"]
  assert tokenization.whitespace_tokenize("   ") == []
