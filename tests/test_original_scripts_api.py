"""The original's library functions of run_classifier, extract_features and create_pretraining_data,
as the checkout's root modules give them to code that imports them (`import run_classifier`), on
real data (../shared/data) against the original's behaviour:

- create_pretraining_data against the original's own code (../shared/reference/original, loaded
  into this process): the same instances from the same random.Random, the rng left in the same
  state, the same record bytes; and against the project's exact mode, record for record;
- run_classifier's processors on GLUE MRPC, CoLA and MNLI against the original's column rules, and
  its features against the original's recipe (on the original's tokenizer);
- extract_features' read_examples on a " ||| " file and its features against the script's own.
"""

import csv
import functools
import importlib.util
import os
import random
import sys
import types

from absl import flags as absl_flags
import pytest
import tensorflow as tf

import create_pretraining_data
import extract_features
import run_classifier
import tokenization
from bert_tf2 import classifier_tasks
from bert_tf2 import extract_features as project_extract_features
from bert_tf2 import fileio
from bert_tf2 import pretraining_data
from bert_tf2 import run_classifier as project_run_classifier
from conftest import SHARED, SQUAD, VOCAB, WIKITEXT, requires_shared

GLUE = os.path.join(SHARED, "data", "glue")
ORIGINAL = os.path.join(SHARED, "reference", "original")


# --- the original's code, loaded in this process ----------------------------------------------

class _OwnFlags:
  """absl.flags for the original's module: its DEFINE_* calls register in a FlagValues of its own
  (the scripts' flags, defined in this process by other tests, share absl's registry)."""

  def __init__(self):
    self.FLAGS = absl_flags.FlagValues()

  def __getattr__(self, name):
    return functools.partial(getattr(absl_flags, name), flag_values=self.FLAGS)


def _load(name, path):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def original():
  """The original's tokenization and create_pretraining_data modules, with `tensorflow` as
  tf.compat.v1 while they load (as run_original.py runs them), but their flags in a registry of
  their own, and a stand-in `six` where it is not installed (they read six.PY2 / PY3 only). The
  root `tokenization` module is put back once they have loaded."""
  names = ("tensorflow", "tokenization", "six")
  saved = {name: sys.modules.get(name) for name in names}
  tf_v1 = types.ModuleType("tensorflow")
  tf_v1.__getattr__ = lambda name: getattr(tf.compat.v1, name)
  tf_v1.flags = _OwnFlags()
  try:
    sys.modules["tensorflow"] = tf_v1
    if importlib.util.find_spec("six") is None:
      sys.modules["six"] = types.SimpleNamespace(PY2=False, PY3=True)
    original_tokenization = _load("tokenization", os.path.join(ORIGINAL, "tokenization.py"))
    cpd = _load("original_create_pretraining_data",
                os.path.join(ORIGINAL, "create_pretraining_data.py"))
  finally:
    for name, module in saved.items():
      if module is None:
        sys.modules.pop(name, None)
      else:
        sys.modules[name] = module
    sys.modules.pop("original_create_pretraining_data", None)
  cpd.FLAGS.mark_as_parsed()  # its defaults: do_whole_word_mask False
  return types.SimpleNamespace(
      tokenization=original_tokenization, cpd=cpd,
      tokenizer=original_tokenization.FullTokenizer(VOCAB, do_lower_case=True))


@pytest.fixture
def whole_word_flag(original):
  """Sets the original's --do_whole_word_mask (its masking reads the flag) for one test."""
  yield lambda value: setattr(original.cpd.FLAGS, "do_whole_word_mask", value)
  original.cpd.FLAGS.do_whole_word_mask = False


def _fields(instance):
  return (list(instance.tokens), list(instance.segment_ids), list(instance.masked_lm_positions),
          list(instance.masked_lm_labels), bool(instance.is_random_next))


@pytest.fixture(scope="module")
def wiki_files(tmp_path_factory):
  """WikiText's first four documents (264 lines) in two files, split inside the second document:
  the original reads a document on from one file into the next."""
  with open(WIKITEXT, encoding="utf-8") as f:
    lines = [next(f) for _ in range(264)]
  folder = tmp_path_factory.mktemp("wiki")
  paths = [str(folder / "part1.txt"), str(folder / "part2.txt")]
  for path, part in zip(paths, (lines[:100], lines[100:])):
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(part)
  return paths


# --- create_pretraining_data ------------------------------------------------------------------

@requires_shared
@pytest.mark.parametrize("whole_word", [False, True])
def test_create_training_instances_are_the_originals(original, tokenizer, wiki_files, whole_word,
                                                     whole_word_flag):
  whole_word_flag(whole_word)
  theirs_rng, ours_rng = random.Random(12345), random.Random(12345)
  theirs = original.cpd.create_training_instances(wiki_files, original.tokenizer, 128, 2, 0.1,
                                                  0.15, 20, theirs_rng)
  ours = create_pretraining_data.create_training_instances(
      wiki_files, tokenizer, 128, 2, 0.1, 0.15, 20, ours_rng, do_whole_word_mask=whole_word)
  assert len(ours) == len(theirs) > 100
  assert [_fields(i) for i in ours] == [_fields(i) for i in theirs]
  assert ours_rng.getstate() == theirs_rng.getstate()
  assert str(ours[0]) == str(theirs[0]) and repr(ours[-1]) == repr(theirs[-1])
  assert str(ours[0]).startswith("tokens: [CLS] ")
  assert sum(i.is_random_next for i in ours) > 10
  assert sum(len(i.masked_lm_positions) for i in ours) > 10 * len(ours)


@requires_shared
def test_written_records_are_the_originals_and_the_projects(original, tokenizer, wiki_files,
                                                            tmp_path):
  """The original's writer on its instances and ours on ours give the same records in each of
  three round-robin files; and the bytes of the project's exact mode with that seed."""
  instances = create_pretraining_data.create_training_instances(
      wiki_files, tokenizer, 64, 1, 0.1, 0.15, 10, random.Random(7))
  theirs = original.cpd.create_training_instances(wiki_files, original.tokenizer, 64, 1, 0.1,
                                                  0.15, 10, random.Random(7))
  ours_files = [str(tmp_path / f"ours-{i}.tfrecord") for i in range(3)]
  theirs_files = [str(tmp_path / f"theirs-{i}.tfrecord") for i in range(3)]
  assert create_pretraining_data.write_instance_to_example_files(
      instances, tokenizer, 64, 10, ours_files) == len(instances)
  original.cpd.write_instance_to_example_files(theirs, original.tokenizer, 64, 10, theirs_files)
  # A feature map is serialized in an implementation-defined order: records compared parsed.
  written = [list(tf.data.TFRecordDataset(path).as_numpy_iterator()) for path in ours_files]
  for ours_records, theirs_file in zip(written, theirs_files):
    theirs_records = list(tf.data.TFRecordDataset(theirs_file).as_numpy_iterator())
    assert len(ours_records) == len(theirs_records) > 10
    assert ([tf.train.Example.FromString(r) for r in ours_records] ==
            [tf.train.Example.FromString(r) for r in theirs_records])

  options = pretraining_data.Options(input_file=",".join(wiki_files), output_file="unused",
                                     vocab_file=VOCAB, max_seq_length=64,
                                     max_predictions_per_seq=10, random_seed=7, dupe_factor=1)
  corpus = pretraining_data.read_corpus(wiki_files, tokenizer)
  records, _ = pretraining_data.create_exact_records(corpus, options,
                                                     pretraining_data.VocabIds(tokenizer.vocab))
  assert [records[i::3] for i in range(3)] == written
  example = tf.train.Example.FromString(written[0][0]).features.feature
  assert example["input_ids"].int64_list.value[0] == tokenizer.vocab["[CLS]"]
  assert len(example["masked_lm_weights"].float_list.value) == 10


@requires_shared
def test_the_helpers_draw_as_the_originals(original, tokenizer, whole_word_flag):
  """create_instances_from_document, create_masked_lm_predictions and truncate_seq_pair on token
  lists, with the same random.Random: the same results and the rng left in the same state."""
  with open(WIKITEXT, encoding="utf-8") as f:
    lines = [next(f).strip() for _ in range(264)]
  documents, current = [], []
  for line in lines:
    if line:
      current.append(tokenizer.tokenize(line))
    elif current:
      documents.append(current)
      current = []
  assert len(documents) == 4 and not current
  with pytest.raises(ValueError, match="an empty document"):  # the original drops them first
    create_pretraining_data.create_instances_from_document(documents + [[]], 0, 96, 0.3, 0.15, 12,
                                                           list(tokenizer.vocab), random.Random())
  vocab_words = list(tokenizer.vocab)
  for whole_word in (False, True):
    whole_word_flag(whole_word)
    ours_rng, theirs_rng = random.Random(3), random.Random(3)
    for index in range(len(documents)):
      ours = create_pretraining_data.create_instances_from_document(
          documents, index, 96, 0.3, 0.15, 12, vocab_words, ours_rng, whole_word)
      theirs = original.cpd.create_instances_from_document(
          documents, index, 96, 0.3, 0.15, 12, vocab_words, theirs_rng)
      assert [_fields(i) for i in ours] == [_fields(i) for i in theirs] and ours
    assert ours_rng.getstate() == theirs_rng.getstate()

    tokens = ["[CLS]", *documents[0][0], *documents[0][1], "[SEP]", *documents[1][0], "[SEP]"]
    for _ in range(20):
      ours = create_pretraining_data.create_masked_lm_predictions(tokens, 0.15, 20, vocab_words,
                                                                  ours_rng, whole_word)
      theirs = original.cpd.create_masked_lm_predictions(tokens, 0.15, 20, vocab_words,
                                                         theirs_rng)
      assert ours == theirs
    assert ours_rng.getstate() == theirs_rng.getstate()
    assert ours[1] and "[CLS]" not in ours[2] and ours[0][0] == "[CLS]"

  for a_length, b_length, budget in ((30, 5, 20), (5, 30, 20), (12, 12, 9), (3, 4, 10)):
    ours_a, ours_b = list(range(a_length)), list(range(100, 100 + b_length))
    theirs_a, theirs_b = list(ours_a), list(ours_b)
    create_pretraining_data.truncate_seq_pair(ours_a, ours_b, budget, ours_rng)
    original.cpd.truncate_seq_pair(theirs_a, theirs_b, budget, theirs_rng)
    assert (ours_a, ours_b) == (theirs_a, theirs_b)
    assert len(ours_a) + len(ours_b) == min(budget, a_length + b_length)
  assert ours_rng.getstate() == theirs_rng.getstate()


@requires_shared
def test_the_tokenizer_is_the_originals_on_real_text(original, tokenizer):
  with open(WIKITEXT, encoding="utf-8") as f:
    lines = [next(f) for _ in range(400)]
  lines += ["Caf\u00e9 \u535a\u63a8 na\u00efve \u00bd \ufb01 [CLS] don't", "\u00a0\t\r\x00",
            "\u00c5ngstr\u00f6m \u2014 \U0002070e\u3042 x\u0301"]
  assert tokenizer.tokenize(lines[-3])[-7:] == ["[", "cl", "##s", "]", "don", "'", "t"]
  assert tokenizer.tokenize(lines[-2]) == []
  assert ([tokenizer.tokenize(line) for line in lines] ==
          [original.tokenizer.tokenize(line) for line in lines])


def test_pretraining_data_needs_mask_and_names_the_vocab(tmp_path):
  """The original's small test vocab loads (no [PAD], no [MASK]); making pre-training instances
  with it is one error naming the file and the token."""
  vocab_file = tmp_path / "vocab.txt"
  vocab_file.write_text("[UNK]\n[CLS]\n[SEP]\nwant\n##want\n##ed\nwa\nun\nrunn\n##ing\n,\n",
                        encoding="utf-8")
  text = tmp_path / "text.txt"
  text.write_text("unwanted running\nwant\n\nrunning , unwanted\n", encoding="utf-8")
  tokenizer = tokenization.FullTokenizer(str(vocab_file))
  with pytest.raises(fileio.InputError) as error:
    create_pretraining_data.create_training_instances([str(text)], tokenizer, 16, 1, 0.1, 0.15,
                                                      3, random.Random(1))
  assert str(error.value) == (f"vocab file {vocab_file} has no [MASK]: pre-training data needs "
                              "it for its masked positions")


# --- run_classifier ---------------------------------------------------------------------------

def _original_rows(path):
  """The rows of a GLUE file as the original's _read_tsv gives them (csv, tab, no quoting)."""
  with open(path, encoding="utf-8", newline="") as f:
    return list(csv.reader(f, delimiter="\t", quotechar=None))


def _original_examples(task, rows, set_type):
  """(guid, text_a, text_b, label) by the original's column rules of MRPC, CoLA and MNLI."""
  examples = []
  for i, line in enumerate(rows):
    if i == 0 and (task != "cola" or set_type == "test"):
      continue  # the header (CoLA's train and dev files have none)
    if task == "mrpc":
      label = "0" if set_type == "test" else line[0]
      examples.append((f"{set_type}-{i}", line[3], line[4], label))
    elif task == "cola":
      text, label = (line[1], "0") if set_type == "test" else (line[3], line[1])
      examples.append((f"{set_type}-{i}", text, None, label))
    else:
      label = "contradiction" if set_type == "test" else line[-1]
      examples.append((f"{set_type}-{line[0]}", line[8], line[9], label))
  return examples


def _tuples(examples):
  return [(e.guid, e.text_a, e.text_b, e.label) for e in examples]


@requires_shared
@pytest.mark.parametrize("task,folder,processor,splits,counts", [
    ("mrpc", "MRPC", "MrpcProcessor", {"train": "train", "dev": "dev", "test": "test"},
     (3668, 408, 1725)),
    ("cola", "CoLA", "ColaProcessor", {"train": "train", "dev": "dev", "test": "test"},
     (8551, 1043, 1063)),
    ("mnli", "MNLI-sample", "MnliProcessor", {"train": "train", "dev": "dev_matched"}, (48, 48)),
])
def test_the_glue_processors_read_as_the_originals(task, folder, processor, splits, counts):
  data_dir = os.path.join(GLUE, folder)
  processor = getattr(run_classifier, processor)()
  assert isinstance(processor, run_classifier.DataProcessor)
  for (split, set_type), count in zip(splits.items(), counts):
    path = os.path.join(data_dir, f"{set_type}.tsv")
    examples = getattr(processor, f"get_{split}_examples")(data_dir)
    theirs = _original_rows(path)
    assert len(examples) == count
    assert _tuples(examples) == _original_examples(task, theirs, set_type)
    # _read_tsv's rows are the original's (less the UTF-8 byte-order mark of MRPC's header).
    theirs[0][0] = theirs[0][0].lstrip("\ufeff")
    assert processor._read_tsv(path) == theirs
  assert processor.get_labels() == (["contradiction", "entailment", "neutral"] if task == "mnli"
                                    else ["0", "1"])


def test_the_xnli_processor_reads_its_language_and_the_attribute_counts(tmp_path):
  (tmp_path / "multinli").mkdir()
  (tmp_path / "multinli" / "multinli.train.zh.tsv").write_text(
      "premise\thypo\tlabel\n\u4f60\u597d\t\u518d\u89c1\tcontradictory\n"
      "\u662f\t\u5426\tneutral\n", encoding="utf-8")
  header = ["language", "gold_label", "s1_binary", "s2_binary", "s1_parse", "s2_parse",
            "sentence1", "sentence2", "promptID", "pairID", "genre", "label1"]
  rows = [["zh", "entailment", *"abcd", "\u4e00", "\u4e8c", *"xyzw"],
          ["de", "neutral", *"abcd", "eins", "zwei", *"xyzw"],
          ["zh", "neutral", *"abcd", "\u4e09", "\u56db", *"xyzw"]]
  (tmp_path / "xnli.dev.tsv").write_text(
      "".join("\t".join(row) + "\n" for row in [header] + rows), encoding="utf-8")
  processor = run_classifier.XnliProcessor()
  assert processor.language == "zh" and processor.get_labels() == [
      "contradiction", "entailment", "neutral"]
  assert _tuples(processor.get_train_examples(str(tmp_path))) == [
      ("train-1", "\u4f60\u597d", "\u518d\u89c1", "contradiction"),
      ("train-2", "\u662f", "\u5426", "neutral")]
  assert _tuples(processor.get_dev_examples(str(tmp_path))) == [
      ("dev-1", "\u4e00", "\u4e8c", "entailment"), ("dev-3", "\u4e09", "\u56db", "neutral")]
  processor.language = "de"
  assert _tuples(processor.get_dev_examples(str(tmp_path))) == [
      ("dev-2", "eins", "zwei", "neutral")]


def _original_recipe(example, label_list, max_seq_length, tokenizer):
  """The original's convert_single_example, spelled out: [CLS] a [SEP] (b [SEP]), a pair cut one
  token at a time from the longer text (b on a tie), a single text cut to max_seq_length - 2,
  zeros after."""
  tokens_a = tokenizer.tokenize(example.text_a)
  tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else []
  if tokens_b:
    while len(tokens_a) + len(tokens_b) > max_seq_length - 3:
      (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()
  tokens_a = tokens_a[:max_seq_length - 2]
  tokens = ["[CLS]", *tokens_a, "[SEP]"] + ([*tokens_b, "[SEP]"] if tokens_b else [])
  segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens) - len(tokens_a) - 2)
  ids = tokenizer.convert_tokens_to_ids(tokens)
  padding = [0] * (max_seq_length - len(ids))
  return (ids + padding, [1] * len(ids) + padding, segment_ids + padding,
          label_list.index(example.label), True)


def _feature_tuple(feature):
  return (feature.input_ids, feature.input_mask, feature.segment_ids, feature.label_id,
          feature.is_real_example)


@requires_shared
def test_classifier_features_are_the_originals(original, tokenizer):
  """MRPC dev (pairs) at 40 tokens and CoLA dev (single texts) at 12, where many are cut: the
  original's recipe on the original's tokenizer, feature for feature."""
  for task, name, length in (("MRPC", "MrpcProcessor", 40), ("CoLA", "ColaProcessor", 12)):
    processor = getattr(run_classifier, name)()
    examples = processor.get_dev_examples(os.path.join(GLUE, task))
    labels = processor.get_labels()
    features = run_classifier.convert_examples_to_features(examples, labels, length, tokenizer)
    assert len(features) == len(examples)
    assert [_feature_tuple(f) for f in features] == [
        _original_recipe(e, labels, length, original.tokenizer) for e in examples]
    assert sum(f.input_mask[-1] for f in features) > 0.1 * len(features)  # some were cut
    single = run_classifier.convert_single_example(0, examples[0], labels, length, tokenizer)
    assert _feature_tuple(single) == _feature_tuple(features[0])
  # MRPC dev's first pair, "He said the foodservice pie business doesn't fit the company's
  # long-term growth strategy." / "\"The foodservice pie business does not fit our ...".
  first = run_classifier.convert_examples_to_features(
      run_classifier.MrpcProcessor().get_dev_examples(os.path.join(GLUE, "MRPC"))[:1],
      ["0", "1"], 16, tokenizer)[0]
  # A pair cut to 13 tokens: 7 of the first text, 6 of the second (cut last, on the tie).
  assert tokenizer.convert_ids_to_tokens(first.input_ids) == [
      "[CLS]", "he", "said", "the", "foods", "##er", "##vic", "##e", "[SEP]", "\"", "the",
      "foods", "##er", "##vic", "##e", "[SEP]"]
  assert first.input_ids == [101, 2002, 2056, 1996, 9440, 2121, 7903, 2063, 102, 1000, 1996, 9440,
                             2121, 7903, 2063, 102]
  assert first.segment_ids == [0] * 9 + [1] * 7 and first.label_id == 1


@requires_shared
def test_file_based_features_and_padding_examples(tokenizer, tmp_path):
  examples = run_classifier.MrpcProcessor().get_dev_examples(os.path.join(GLUE, "MRPC"))[:7]
  examples.append(run_classifier.PaddingInputExample())
  path = str(tmp_path / "eval.tf_record")
  run_classifier.file_based_convert_examples_to_features(examples, ["0", "1"], 32, tokenizer,
                                                         path)
  features = run_classifier.convert_examples_to_features(examples, ["0", "1"], 32, tokenizer)
  records = [tf.train.Example.FromString(r).features.feature
             for r in tf.data.TFRecordDataset(path).as_numpy_iterator()]
  assert len(records) == 8
  for record, feature in zip(records, features):
    assert list(record["input_ids"].int64_list.value) == feature.input_ids
    assert list(record["input_mask"].int64_list.value) == feature.input_mask
    assert list(record["segment_ids"].int64_list.value) == feature.segment_ids
    assert list(record["label_ids"].int64_list.value) == [feature.label_id]
    assert list(record["is_real_example"].int64_list.value) == [int(feature.is_real_example)]
  assert _feature_tuple(features[-1]) == ([0] * 32, [0] * 32, [0] * 32, 0, False)
  assert [f.label_id for f in features[:7]] == [int(e.label) for e in examples[:7]]


def test_the_root_module_is_the_projects_objects_and_names_what_is_gone():
  assert run_classifier.InputExample is classifier_tasks.InputExample
  assert run_classifier.InputFeatures is project_run_classifier.InputFeatures
  assert (run_classifier.convert_examples_to_features is
          project_run_classifier.convert_examples_to_features)
  example = run_classifier.InputExample("g-1", "a text")
  assert (example.text_b, example.label) == (None, None)
  tokens_a, tokens_b = list("abcdefg"), list("xyz")
  run_classifier._truncate_seq_pair(tokens_a, tokens_b, 6)
  assert (tokens_a, tokens_b) == (list("abc"), list("xyz"))
  for name in ("model_fn_builder", "create_model", "input_fn_builder",
               "file_based_input_fn_builder"):
    with pytest.raises(AttributeError, match=f"run_classifier.{name} served tf.estimator"):
      getattr(run_classifier, name)
  with pytest.raises(AttributeError, match="extract_features.model_fn_builder served"):
    extract_features.model_fn_builder  # pylint: disable=pointless-statement
  with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
    run_classifier.no_such_name  # pylint: disable=pointless-statement


# --- extract_features -------------------------------------------------------------------------

@requires_shared
def test_read_examples_and_features_of_a_pair_file(tokenizer, tmp_path):
  """MRPC dev pairs as `a ||| b` lines, CoLA sentences alone, a blank line and a line with two
  separators: read as the original reads them, and the features the script makes of the lines."""
  pairs = run_classifier.MrpcProcessor().get_dev_examples(os.path.join(GLUE, "MRPC"))[:30]
  singles = run_classifier.ColaProcessor().get_dev_examples(os.path.join(GLUE, "CoLA"))[:30]
  lines = ["Who was Jim Henson ? ||| Jim Henson was a puppeteer", "",
           "  left ||| middle ||| right  "]
  lines += [f"{e.text_a} ||| {e.text_b}" for e in pairs] + [e.text_a for e in singles]
  path = tmp_path / "input.txt"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")

  examples = extract_features.read_examples(str(path))
  assert len(examples) == len(lines) == 63
  assert [e.unique_id for e in examples] == list(range(63))
  assert [(e.text_a, e.text_b) for e in examples[:3]] == [
      ("Who was Jim Henson ?", "Jim Henson was a puppeteer"), ("", None),
      ("left ||| middle", "right")]
  assert [(e.text_a, e.text_b) for e in examples[3:33]] == [(p.text_a, p.text_b) for p in pairs]
  assert [(e.text_a, e.text_b) for e in examples[33:]] == [(s.text_a, None) for s in singles]

  features = extract_features.convert_examples_to_features(examples, 32, tokenizer)
  script = project_extract_features.convert_lines_to_features(list(enumerate(lines)), 32,
                                                              tokenizer)
  for ours, theirs in zip(features, script, strict=True):
    assert (ours.unique_id, ours.tokens, ours.input_ids, ours.input_mask, ours.input_type_ids) == (
        theirs.unique_id, theirs.tokens, theirs.input_ids, theirs.input_mask,
        theirs.input_type_ids)
  assert features[0].tokens == ["[CLS]", "who", "was", "jim", "henson", "?", "[SEP]", "jim",
                                "henson", "was", "a", "puppet", "##eer", "[SEP]"]
  assert features[0].input_ids[:14] == [101, 2040, 2001, 3958, 27227, 1029, 102, 3958, 27227,
                                        2001, 1037, 13997, 11510, 102]
  assert features[0].input_type_ids[:15] == [0] * 7 + [1] * 7 + [0]
  assert features[1].tokens == ["[CLS]", "[SEP]"] and sum(features[1].input_mask) == 2
  assert sum(len(f.tokens) == 32 for f in features) > 5  # long pairs are cut to 32


# --- run_squad ----------------------------------------------------------------------------------

@requires_shared
def test_squad_examples_windows_records_and_answers_the_originals_way(tokenizer, tmp_path):
  """The original's pipeline through the root module: read_squad_examples (training: each
  answer's words found in the context), convert_examples_to_features into a FeatureWriter (the
  file holds every window, the original's feature names), and write_predictions from RawResults
  whose logits point at the gold span gives back the gold answer text."""
  import json  # pylint: disable=g-import-not-at-top
  import run_squad  # pylint: disable=g-import-not-at-top
  from bert_tf2 import metrics  # pylint: disable=g-import-not-at-top
  from bert_tf2 import run_squad as project_run_squad  # pylint: disable=g-import-not-at-top
  assert run_squad.read_squad_examples is project_run_squad.read_squad_examples
  assert run_squad.RawResult._fields == ("unique_id", "start_logits", "end_logits")
  for name in ("model_fn_builder", "create_model", "input_fn_builder"):
    with pytest.raises(AttributeError, match=f"run_squad.{name} served tf.estimator"):
      getattr(run_squad, name)

  examples = run_squad.read_squad_examples(SQUAD, is_training=True)[:60]
  assert len(run_squad.read_squad_examples(SQUAD, is_training=False)) == 10570
  for example in examples:
    words = " ".join(example.doc_tokens[example.start_position:example.end_position + 1])
    assert " ".join(example.orig_answer_text.split()) in words, example

  path = tmp_path / "train.tf_record"
  writer = run_squad.FeatureWriter(str(path), is_training=True)
  features = []

  def output_fn(feature):
    features.append(feature)
    writer.process_feature(feature)

  count = run_squad.convert_examples_to_features(
      examples=examples, tokenizer=tokenizer, max_seq_length=128, doc_stride=64,
      max_query_length=32, is_training=True, output_fn=output_fn)
  writer.close()
  assert count == len(features) == writer.num_features > len(examples)
  records = [tf.train.Example.FromString(r.numpy()).features.feature
             for r in tf.data.TFRecordDataset(str(path))]
  assert len(records) == count
  assert {"unique_ids", "input_ids", "input_mask", "segment_ids", "start_positions",
          "end_positions", "is_impossible"} == set(records[0])
  for record, feature in zip(records, features):
    assert list(record["input_ids"].int64_list.value) == feature.input_ids
    assert list(record["start_positions"].int64_list.value) == [feature.start_position]

  # Predictions: each window's logits peak at its gold span (or at [CLS] where it holds none).
  eval_features, results = [], []
  count = run_squad.convert_examples_to_features(examples, tokenizer, 128, 64, 32, False,
                                                 eval_features.append)
  by_window = {(f.example_index, f.doc_span_index): f for f in features}
  for feature in eval_features:
    gold = by_window[(feature.example_index, feature.doc_span_index)]
    start, end = [-10.0] * 128, [-10.0] * 128
    start[gold.start_position] = end[gold.end_position] = 10.0 if gold.start_position else 0.0
    results.append(run_squad.RawResult(feature.unique_id, start, end))
  predictions_file = tmp_path / "predictions.json"
  run_squad.write_predictions(examples, eval_features, results, 20, 30, True,
                              str(predictions_file), str(tmp_path / "nbest.json"), None)
  predictions = json.loads(predictions_file.read_text())
  # The gold answer's text, or (where it is part of a word: "gold" of "golden") the whole words
  # its span covers, as the original's word-level positions give it.
  for example in examples:
    words = " ".join(example.doc_tokens[example.start_position:example.end_position + 1])
    assert metrics.normalize_answer(predictions[example.qas_id]) in (
        metrics.normalize_answer(example.orig_answer_text), metrics.normalize_answer(words)), (
            predictions[example.qas_id], example.orig_answer_text, words)
