"""The original's tokenization_test.py, ported to TensorFlow 2 and pytest, on the checkout's root
`tokenization` module as the original's users import it; then a few checks beyond the port.

The port (the class TokenizationTest) is google-research/bert's tokenization_test.py (Copyright
2018 The Google AI Language Team Authors, Apache License 2.0) with every call into `tokenization`
as it was written, and these changes only: `import tokenization` (the checkout's root module) in
place of the package import; no `six` (Python 3 only: the vocab is written as UTF-8 bytes, the
original's Python 3 branch); no `tf.test.main()` (pytest runs the tf.test.TestCase class); the
`from __future__` lines and the license header dropped.
"""

import os
import tempfile

import pytest
import tensorflow as tf

import tokenization
from bert_tf2 import fileio
from bert_tf2 import pretraining_data


class TokenizationTest(tf.test.TestCase):

  def test_full_tokenizer(self):
    vocab_tokens = [
        "[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn",
        "##ing", ","
    ]
    with tempfile.NamedTemporaryFile(delete=False) as vocab_writer:
      vocab_writer.write("".join(
          [x + "\n" for x in vocab_tokens]).encode("utf-8"))

      vocab_file = vocab_writer.name

    tokenizer = tokenization.FullTokenizer(vocab_file)
    os.unlink(vocab_file)

    tokens = tokenizer.tokenize(u"UNwant\u00E9d,running")
    self.assertAllEqual(tokens, ["un", "##want", "##ed", ",", "runn", "##ing"])

    self.assertAllEqual(
        tokenizer.convert_tokens_to_ids(tokens), [7, 4, 5, 10, 8, 9])

  def test_chinese(self):
    tokenizer = tokenization.BasicTokenizer()

    self.assertAllEqual(
        tokenizer.tokenize(u"ah\u535A\u63A8zz"),
        [u"ah", u"\u535A", u"\u63A8", u"zz"])

  def test_basic_tokenizer_lower(self):
    tokenizer = tokenization.BasicTokenizer(do_lower_case=True)

    self.assertAllEqual(
        tokenizer.tokenize(u" \tHeLLo!how  \n Are yoU?  "),
        ["hello", "!", "how", "are", "you", "?"])
    self.assertAllEqual(tokenizer.tokenize(u"H\u00E9llo"), ["hello"])

  def test_basic_tokenizer_no_lower(self):
    tokenizer = tokenization.BasicTokenizer(do_lower_case=False)

    self.assertAllEqual(
        tokenizer.tokenize(u" \tHeLLo!how  \n Are yoU?  "),
        ["HeLLo", "!", "how", "Are", "yoU", "?"])

  def test_wordpiece_tokenizer(self):
    vocab_tokens = [
        "[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn",
        "##ing"
    ]

    vocab = {}
    for (i, token) in enumerate(vocab_tokens):
      vocab[token] = i
    tokenizer = tokenization.WordpieceTokenizer(vocab=vocab)

    self.assertAllEqual(tokenizer.tokenize(""), [])

    self.assertAllEqual(
        tokenizer.tokenize("unwanted running"),
        ["un", "##want", "##ed", "runn", "##ing"])

    self.assertAllEqual(
        tokenizer.tokenize("unwantedX running"), ["[UNK]", "runn", "##ing"])

  def test_convert_tokens_to_ids(self):
    vocab_tokens = [
        "[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn",
        "##ing"
    ]

    vocab = {}
    for (i, token) in enumerate(vocab_tokens):
      vocab[token] = i

    self.assertAllEqual(
        tokenization.convert_tokens_to_ids(
            vocab, ["un", "##want", "##ed", "runn", "##ing"]), [7, 4, 5, 8, 9])

  def test_is_whitespace(self):
    self.assertTrue(tokenization._is_whitespace(u" "))
    self.assertTrue(tokenization._is_whitespace(u"\t"))
    self.assertTrue(tokenization._is_whitespace(u"\r"))
    self.assertTrue(tokenization._is_whitespace(u"\n"))
    self.assertTrue(tokenization._is_whitespace(u"\u00A0"))

    self.assertFalse(tokenization._is_whitespace(u"A"))
    self.assertFalse(tokenization._is_whitespace(u"-"))

  def test_is_control(self):
    self.assertTrue(tokenization._is_control(u"\u0005"))

    self.assertFalse(tokenization._is_control(u"A"))
    self.assertFalse(tokenization._is_control(u" "))
    self.assertFalse(tokenization._is_control(u"\t"))
    self.assertFalse(tokenization._is_control(u"\r"))

  def test_is_punctuation(self):
    self.assertTrue(tokenization._is_punctuation(u"-"))
    self.assertTrue(tokenization._is_punctuation(u"$"))
    self.assertTrue(tokenization._is_punctuation(u"`"))
    self.assertTrue(tokenization._is_punctuation(u"."))

    self.assertFalse(tokenization._is_punctuation(u"A"))
    self.assertFalse(tokenization._is_punctuation(u" "))


# --- beyond the port --------------------------------------------------------------------------

_ORIGINAL_TEST_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn",
                        "##ing", ","]


def _vocab(path, tokens):
  path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
  return str(path)


def test_the_root_module_is_the_package_plus_the_private_names():
  from bert_tf2 import tokenization as project  # pylint: disable=g-import-not-at-top
  assert tokenization.FullTokenizer is project.FullTokenizer
  assert tokenization._is_whitespace is project.is_whitespace
  assert tokenization._is_control is project.is_control
  assert tokenization._is_punctuation is project.is_punctuation
  basic = tokenization.BasicTokenizer()
  assert basic._is_chinese_char(0x535A) and not basic._is_chinese_char(ord("a"))


def test_a_vocab_needs_unk_cls_and_sep_not_pad_or_mask(tmp_path):
  """[PAD] and [MASK] are asked for where they are used: padding is id 0 whatever token holds
  it, and only pre-training data needs [MASK], with an error naming the file there."""
  vocab_file = _vocab(tmp_path / "small.txt", _ORIGINAL_TEST_VOCAB)
  tokenizer = tokenization.FullTokenizer(vocab_file)
  assert tokenizer.vocab_file == vocab_file and len(tokenizer.vocab) == 11
  with pytest.raises(fileio.InputError) as error:
    pretraining_data.load_tokenizer(vocab_file)
  assert str(error.value) == (f"vocab file {vocab_file} has no [MASK]: pre-training data needs it "
                              "for its masked positions")
  # Without [SEP], no sequence can be built: refused at load, naming every special token missing.
  no_sep = _vocab(tmp_path / "no_sep.txt", [t for t in _ORIGINAL_TEST_VOCAB if t != "[SEP]"])
  with pytest.raises(fileio.InputError, match=r"no_sep\.txt lacks the special token\(s\) "
                                              r"\[PAD\] \[SEP\] \[MASK\];"):
    tokenization.FullTokenizer(no_sep)
