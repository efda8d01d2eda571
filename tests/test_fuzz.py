"""Property-based tests (hypothesis) of the tokenizer and every reader of user files.

For arbitrary Unicode text and arbitrary bytes: the tokenizer never fails, every token is in the
vocabulary, ids map back to the same tokens, and the pieces put back together give the text
(less what the tokenizer deliberately drops). The readers (fileio.read_lines, the GLUE and custom
TSV/CSV readers, the CoNLL reader, the SQuAD reader) either return well-formed examples or raise
fileio.InputError naming the file, never another exception. The fast batch tokenizer is checked
against the reference path on random text in test_tokenization.
"""

import json
import math
import os
import unicodedata

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from conftest import VOCAB, import_script, requires_shared
from bert_tf2 import classifier_tasks
from bert_tf2 import fileio
from bert_tf2 import tokenization


_import_script = import_script


run_classifier = _import_script("run_classifier")
run_ner = _import_script("run_ner")
run_squad = _import_script("run_squad")

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Characters tokenizers and readers treat specially: NUL, U+FFFD, controls, format characters
# (zero-width joiner, BOM), tab/newline/CR, separators Python splits on but Unicode does not call
# spaces, no-break spaces, CJK, combining accents, case-folding traps, an astral emoji, quotes.
EDGE = ["\x00", "\ufffd", "\x07", "\x1c", "\x7f", "\x85", "\u200b", "\u200d", "\ufeff", "\t",
        "\n", "\r", "\u2028", "\u00a0", "\u202f", "\u3000", "\u4e2d", "\u00e9", "e\u0301",
        "\u0130", "\u00df", "\u03a3", "\ufb01", "\U0001f600", '"', "'", "-", "##", "[CLS]"]
# Any Unicode scalar value (surrogates cannot be written to a UTF-8 file, or come out of one).
CHARS = st.characters(codec="utf-8")
TEXT = st.lists(st.one_of(st.sampled_from(EDGE), CHARS, st.sampled_from(
    ["the", "The", "running", "unaffable", "jack", " ", "  "])), max_size=30).map("".join)


@pytest.fixture(scope="module")
def tokenizers():
  if not os.path.exists(VOCAB):
    pytest.skip("../shared (real data and reference outputs) is not present beside the project")
  return {lower: tokenization.FullTokenizer(VOCAB, do_lower_case=lower) for lower in (True, False)}


# --- tokenizer ------------------------------------------------------------------------------------


def _kept(char):
  """Characters the basic tokenizer keeps (everything but NUL, U+FFFD, controls, format
  characters and whitespace), as the BERT tokenizer defines them."""
  if char in "\t\n\r":
    return False
  return not (char in "\x00\ufffd" or unicodedata.category(char) in ("Cc", "Cf")
              or char.isspace())


@requires_shared
@FUZZ
@given(TEXT)
def test_full_tokenizer_tokens_are_in_the_vocab_and_ids_round_trip(tokenizers, text):
  for tokenizer in tokenizers.values():
    tokens = tokenizer.tokenize(text)
    assert all(token in tokenizer.vocab for token in tokens)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    assert tokenizer.convert_ids_to_tokens(ids) == tokens
    assert tokenizer.encode_batch([text]) == [ids]
    # Each word's pieces rebuild it, or the word is one [UNK].
    for word in tokenizer.basic_tokenizer.tokenize(text):
      pieces = tokenizer.wordpiece_tokenizer.tokenize(word)
      if pieces != ["[UNK]"]:
        assert not pieces[0].startswith("##") and all(p.startswith("##") for p in pieces[1:])
        assert pieces[0] + "".join(p[2:] for p in pieces[1:]) == word


@FUZZ
@given(TEXT)
def test_basic_tokenizer_keeps_every_kept_character_in_order(text):
  cased = tokenization.BasicTokenizer(do_lower_case=False).tokenize(text)
  # Nothing but the dropped characters and whitespace goes missing, nothing is reordered.
  assert "".join(cased) == "".join(c for c in text if _kept(c))
  for word in cased:
    assert word and not any(c.isspace() or not _kept(c) for c in word)
    # Punctuation and CJK characters stand alone.
    if len(word) > 1:
      assert not any(tokenization.is_punctuation(c) or tokenization.is_chinese_char(ord(c))
                     for c in word)
  # Tokenizing the tokens again changes nothing.
  assert tokenization.BasicTokenizer(do_lower_case=False).tokenize(" ".join(cased)) == cased
  lower = tokenization.BasicTokenizer(do_lower_case=True).tokenize(text)
  for word in lower:
    assert word and not any(c.isspace() or unicodedata.category(c) == "Mn" for c in word)


# --- fileio.read_lines ----------------------------------------------------------------------------


BYTES = st.one_of(
    st.binary(max_size=120),
    st.lists(st.one_of(TEXT.map(lambda t: t.encode("utf-8")),
                       st.sampled_from([b"\n", b"\r\n", b"\xff", b"\xc3", b"\xe2\x82",
                                        b"\xed\xa0\x80", b"\xef\xbb\xbf", b"\x00", b"\t"])),
             max_size=12).map(b"".join))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return tmp_path_factory.mktemp("fuzz")


def _write(path, data):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(data)
  return path


@FUZZ
@given(BYTES)
def test_read_lines_returns_the_lines_or_names_the_first_bad_line(workdir, data):
  path = _write(str(workdir / "lines.txt"), data)
  raw_lines = data.split(b"\n")
  if data.endswith(b"\n"):
    raw_lines.pop()
  got = []
  try:
    for number, text in fileio.read_lines(path):
      got.append((number, text))
  except fileio.InputError as e:
    bad = next(i for i, raw in enumerate(raw_lines, 1) if not _decodes(raw))
    assert str(e).startswith(f"{path}:{bad}: invalid UTF-8 at byte ")
    assert len(got) == bad - 1
  else:
    assert all(_decodes(raw) for raw in raw_lines)
  for number, text in got:
    expected = raw_lines[number - 1].decode("utf-8").rstrip("\r")
    if number == 1 and expected.startswith("\ufeff"):
      expected = expected[1:]
    assert text == expected


def _decodes(raw):
  try:
    raw.decode("utf-8")
    return True
  except UnicodeDecodeError:
    return False


# --- GLUE and custom TSV/CSV readers --------------------------------------------------------------


# Label-like values (valid, unknown, non-numeric, non-finite, digits int() rejects), column
# names, quoting and separator characters, and anything.
FIELDS = st.one_of(
    st.sampled_from(["0", "1", "2", "-1", "\u00b2", "\u0661", "nan", "inf", "-inf", "1e999", "3.5",
                     "1_0", "entailment", "not_entailment", "contradictory", "neutral", "pos"]),
    st.sampled_from(["sentence", "label", "#1 String", "score", "language", "zh", "review",
                     "stars", '"', '""', '"a\tb"', "", " ", "a,b", '"x', "\r", "\x00"]),
    st.text(CHARS, max_size=6))

# Per task: the files its reader opens and their header rows (None: no header), and the delimiter.
TASK_FILES = {
    "cola": ({"train.tsv": None, "dev.tsv": None, "test.tsv": "index\tsentence"}, 4),
    "mnli": ({n: "index\tsentence1\tsentence2\tgold_label"
              for n in ("train.tsv", "dev_matched.tsv", "test_matched.tsv")}, 4),
    "mrpc": ({n: "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
              for n in ("train.tsv", "dev.tsv", "test.tsv")}, 5),
    "qnli": ({n: "index\tquestion\tsentence\tlabel" for n in ("train.tsv", "dev.tsv", "test.tsv")},
             4),
    "qqp": ({n: "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
             for n in ("train.tsv", "dev.tsv", "test.tsv")}, 6),
    "rte": ({n: "index\tsentence1\tsentence2\tlabel" for n in ("train.tsv", "dev.tsv", "test.tsv")},
            4),
    "sst-2": ({n: "sentence\tlabel" for n in ("train.tsv", "dev.tsv", "test.tsv")}, 2),
    "sts-b": ({n: "index\tsentence1\tsentence2\tscore"
               for n in ("train.tsv", "dev.tsv", "test.tsv")}, 4),
    "xnli": ({"multinli/multinli.train.zh.tsv": "premise\thypo\tlabel",
              "xnli.dev.tsv": "language\tgold_label\tsentence1\tsentence2",
              "xnli.test.tsv": "language\tgold_label\tsentence1\tsentence2"}, None),
    "tsv": ({n: "review\tstars" for n in ("train.tsv", "dev.tsv", "test.tsv")}, 2),
    "tsv-regression": ({n: "review\tstars" for n in ("train.tsv", "dev.tsv", "test.tsv")}, 2),
    "csv": ({n: None for n in ("train.csv", "dev.csv", "test.csv")}, 3),
}


def _processor(task):
  if task.startswith("tsv"):
    return classifier_tasks.get_processor("tsv", delimited_options=dict(
        text_a_column="review", label_column="stars", is_regression=task == "tsv-regression"))
  if task == "csv":
    return classifier_tasks.get_processor("csv", delimited_options=dict(
        text_a_column="0", text_b_column="1", label_column="2", skip_header=False))
  return classifier_tasks.get_processor(task)


@st.composite
def _table(draw, header, width, delimiter):
  """A header and rows, mostly as wide as the header (so the label gets read), as bytes; now
  and then with a broken byte, or just any bytes."""
  if header is not None:
    width = header.count("\t") + 1
  row = st.one_of(st.lists(FIELDS, min_size=width, max_size=width),
                  st.lists(FIELDS, min_size=width, max_size=width),
                  st.lists(FIELDS, max_size=width + 2)).map(delimiter.join)
  lines = draw(st.lists(row, min_size=1, max_size=5))
  text = "\n".join(([header.replace("\t", delimiter)] if header is not None else []) + lines)
  data = text.encode("utf-8")
  return draw(st.one_of(st.just(data), st.just(data), st.just(data), st.just(data + b"\n\xff"),
                        BYTES))


def _check_examples(examples, processor):
  for example in examples:
    assert isinstance(example.text_a, str)
    assert example.text_b is None or isinstance(example.text_b, str)
    if processor.is_regression:
      assert isinstance(example.label, float) and math.isfinite(example.label)
    else:
      assert example.label in processor.get_labels()


@pytest.mark.parametrize("task", sorted(TASK_FILES))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_classifier_readers_give_examples_or_an_input_error(workdir, task, data):
  files, width = TASK_FILES[task]
  data_dir = workdir / "glue" / task
  delimiter = "," if task == "csv" else "\t"
  for name, header in files.items():
    _write(str(data_dir / name), data.draw(_table(header, width or 4, delimiter), label=name))
  processor = _processor(task)
  for read in (processor.get_train_examples, processor.get_dev_examples,
               processor.get_test_examples):
    try:
      examples = read(str(data_dir))
    except fileio.InputError as e:
      assert str(data_dir) in str(e), str(e)
      continue
    _check_examples(examples, processor)


# --- CoNLL reader ---------------------------------------------------------------------------------


CONLL_FIELDS = st.one_of(st.sampled_from(["-DOCSTART-", "-X-", "O", "B-PER", "I-PER", "B-LOC",
                                          "I-MISC", "B-ACTION", "NNP", "jack", "EU", ".", "\u00a0",
                                          "\u2028", "\x00", "\x1c"]),
                         st.text(CHARS, max_size=5))
TOKEN_LINE = st.tuples(CONLL_FIELDS, CONLL_FIELDS, CONLL_FIELDS,
                       st.one_of(st.sampled_from(run_ner.CONLL2003_LABELS), CONLL_FIELDS))
CONLL_LINE = st.one_of(TOKEN_LINE.map(" ".join), TOKEN_LINE.map(" ".join), st.just(""),
                       st.just("-DOCSTART- -X- -X- O"),
                       st.lists(CONLL_FIELDS, max_size=5).map(" ".join))
CONLL = st.lists(CONLL_LINE, max_size=12).map(lambda lines: "\n".join(lines).encode("utf-8"))


@FUZZ
@given(st.one_of(CONLL, BYTES))
def test_conll_reader_gives_sentences_or_an_input_error(workdir, data):
  path = _write(str(workdir / "conll" / "train.txt"), data)
  try:
    examples = run_ner.read_conll_examples(path, "train")
  except fileio.InputError as e:
    assert str(e).startswith(f"{path}:")
    return
  for example in examples:
    assert example.words and len(example.words) == len(example.labels)
    assert all(tag in run_ner.CONLL2003_LABELS for tag in example.labels)
    assert all(word and not any(c.isspace() for c in word) for word in example.words)


# --- SQuAD reader ---------------------------------------------------------------------------------


KEYS = st.sampled_from(["data", "paragraphs", "context", "qas", "id", "question", "answers",
                        "text", "answer_start", "is_impossible", "title", "version"])
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(allow_nan=False),
                 st.text(CHARS, max_size=12))
JSONISH = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(KEYS, inner, max_size=4)),
                       max_leaves=12)
CONTEXT_TEXT = st.lists(st.sampled_from(["a", "b", "Jack", "dull", " ", "  ", "\t", "\n", ".",
                                         ",", "\u00a0", "\u202f", "\u00e9"]),
                        max_size=20).map("".join)


def _nodes(value):
  """Every (container, key) inside a JSON value."""
  if isinstance(value, dict):
    items = list(value.items())
  elif isinstance(value, list):
    items = list(enumerate(value))
  else:
    return
  for key, child in items:
    yield value, key
    yield from _nodes(child)


@st.composite
def _squad(draw):
  """A well-formed SQuAD file with up to three of its values replaced by anything or removed."""
  answer = st.fixed_dictionaries({"text": CONTEXT_TEXT, "answer_start": st.integers(-2, 25)})
  qa = st.fixed_dictionaries({"id": st.text(CHARS, min_size=1, max_size=4),
                              "question": st.text(CHARS, max_size=8),
                              "answers": st.lists(answer, max_size=2),
                              "is_impossible": st.booleans()})
  paragraph = st.fixed_dictionaries({"context": CONTEXT_TEXT,
                                     "qas": st.lists(qa, min_size=1, max_size=3)})
  doc = {"version": "1.1", "data": [{"title": "t", "paragraphs": draw(
      st.lists(paragraph, min_size=1, max_size=2))}]}
  for _ in range(draw(st.integers(0, 3))):
    nodes = list(_nodes(doc))
    if not nodes:
      break
    container, key = draw(st.sampled_from(nodes))
    if draw(st.booleans()):
      container[key] = draw(JSONISH)
    elif isinstance(container, dict):
      del container[key]
  return doc


SQUAD = st.one_of(_squad(), _squad(), _squad(), JSONISH)


@FUZZ
@given(st.one_of(SQUAD.map(lambda d: json.dumps(d, indent=1).encode("utf-8")), BYTES),
       st.booleans(), st.booleans())
def test_squad_reader_gives_examples_or_an_input_error(workdir, data, is_training, version_2):
  path = _write(str(workdir / "squad.json"), data)
  try:
    examples = run_squad.read_squad_examples(path, is_training=is_training,
                                             version_2_with_negative=version_2)
  except fileio.InputError as e:
    assert str(e).startswith(path)
    return
  for example in examples:
    assert isinstance(example.question_text, str) and isinstance(example.doc_tokens, list)
    if is_training and not example.is_impossible:
      _assert_answer_in_its_span(example)


def _assert_answer_in_its_span(example):
  """The offsets are consistent: the answer's words hold its text."""
  span = " ".join(example.doc_tokens[example.start_position:example.end_position + 1])
  assert 0 <= example.start_position <= example.end_position < len(example.doc_tokens)
  assert " ".join(example.orig_answer_text.split()) in span


# Contexts whose whitespace both the SQuAD word split and str.split agree on.
PLAIN_CONTEXT = st.lists(st.sampled_from(["a", "b", "Jack", "dull", "\u00e9", ".", ",", " ", "  ",
                                          "\t", "\n"]), min_size=1, max_size=25).map("".join)


@FUZZ
@given(PLAIN_CONTEXT, st.data())
def test_squad_answers_at_their_offsets_are_always_kept(workdir, context, data):
  positions = [i for i, c in enumerate(context) if not c.isspace()]
  if not positions:
    return
  start = data.draw(st.sampled_from(positions))
  end = data.draw(st.sampled_from([i for i in positions if i >= start]))
  answer = context[start:end + 1]
  path = _write(str(workdir / "answer.json"), json.dumps({"data": [{"paragraphs": [
      {"context": context, "qas": [{"id": "q", "question": "?", "answers": [
          {"text": answer, "answer_start": start}]}]}]}]}).encode("utf-8"))
  skipped = []
  examples = run_squad.read_squad_examples(path, is_training=True, skipped=skipped)
  assert not skipped and len(examples) == 1
  assert examples[0].orig_answer_text == answer
  _assert_answer_in_its_span(examples[0])


# --- the cases fuzzing found, kept as plain examples ---------------------------------------------


def test_what_fuzzing_found(workdir):
  data_dir = workdir / "found"
  # A regression target of nan / inf would make every training step non-finite.
  path = _write(str(data_dir / "train.tsv"), b"index\tsentence1\tsentence2\tscore\n0\ta\tb\tnan\n")
  with pytest.raises(fileio.InputError, match=f"{path}:2: label 'nan' is not a finite number"):
    classifier_tasks.get_processor("sts-b").get_train_examples(str(data_dir))
  # A superscript two is a digit to str.isdigit but not to int().
  custom = classifier_tasks.get_processor("tsv", delimited_options=dict(text_a_column="review",
                                                                      label_column="stars"))
  _write(path, "review\tstars\ngood\t\u00b2\nbad\t1\n".encode("utf-8"))
  assert custom.get_labels(str(data_dir)) == ["1", "\u00b2"]
  # A training file with no rows gave an empty label list (a classifier with no output).
  custom = classifier_tasks.get_processor("tsv", delimited_options=dict(text_a_column="review",
                                                                      label_column="stars"))
  _write(path, b"review\tstars\n")
  with pytest.raises(fileio.InputError, match=f"{path}: no labelled rows to read the labels from"):
    custom.get_labels(str(data_dir))
  # "answers" as an object rather than a list.
  document = {"data": [{"paragraphs": [{"context": "a b", "qas": [
      {"id": "q", "question": "?", "answers": {"text": "a"}}]}]}]}
  squad = _write(str(data_dir / "squad.json"), json.dumps(document).encode("utf-8"))
  with pytest.raises(fileio.InputError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[0\]: \"answers\" "
                     "must be a list"):
    run_squad.read_squad_examples(squad, is_training=True)
