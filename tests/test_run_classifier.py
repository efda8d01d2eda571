"""run_classifier.py's data half: every GLUE processor on the real files, features, TFRecords."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import SHARED, VOCAB, import_script, requires_shared, run_ok, run_script

from bert_tf2 import checkpoints
from bert_tf2 import classifier_tasks
from bert_tf2 import fileio
from bert_tf2 import fine_tuning
from bert_tf2 import input_pipeline
from bert_tf2 import metrics
from bert_tf2 import modeling
from bert_tf2 import tokenization


run_classifier = import_script("run_classifier")

GLUE = os.path.join(SHARED, "data", "glue")


# task, directory, (train, dev, test) counts from ../shared/data/README.md, labels.
GLUE_TASKS = [
    ("mrpc", "MRPC", (3668, 408, 1725), ["0", "1"]),
    ("sst-2", "SST-2", (67349, 872, 1821), ["0", "1"]),
    ("cola", "CoLA", (8551, 1043, 1063), ["0", "1"]),
    ("sts-b", "STS-B", (5749, 1500, 1379), []),
    ("rte", "RTE", (2490, 277, 3000), ["entailment", "not_entailment"]),
    ("wnli", "WNLI", (635, 71, 146), ["0", "1"]),
]


@requires_shared
@pytest.mark.parametrize("task,directory,counts,labels", GLUE_TASKS)
def test_glue_processor_reads_real_files(task, directory, counts, labels):
  processor = classifier_tasks.get_processor(task)
  data_dir = os.path.join(GLUE, directory)
  train = processor.get_train_examples(data_dir)
  dev = processor.get_dev_examples(data_dir)
  test = processor.get_test_examples(data_dir)
  assert (len(train), len(dev), len(test)) == counts
  assert processor.get_labels() == labels
  if processor.is_regression:
    assert processor.num_labels() == 1
    scores = [e.label for e in train + dev]
    assert all(isinstance(s, float) and 0.0 <= s <= 5.0 for s in scores)
    assert len(set(scores)) > 100
  else:
    assert processor.num_labels() == len(labels)
    # Both classes occur in train and dev; test examples carry the placeholder label.
    assert {e.label for e in train} == set(labels) == {e.label for e in dev} | set(labels)
    assert {e.label for e in test} == {labels[0]}
  pair = task not in ("sst-2", "cola")
  assert all((e.text_b is not None) == pair for e in train[:50] + test[:50])
  assert all(e.text_a.strip() for e in train + dev + test)
  assert len({e.guid for e in train}) == len(train)


@requires_shared
def test_first_rows_and_header_handling():
  # MRPC train starts with a UTF-8 BOM before its header: the header is still recognized.
  mrpc = classifier_tasks.get_processor("MRPC").get_train_examples(os.path.join(GLUE, "MRPC"))
  assert mrpc[0].text_a.startswith("Amrozi accused his brother, whom he called \"the witness\"")
  assert (mrpc[0].label, mrpc[0].guid) == ("1", "train-1")
  # CoLA train/dev have no header: the very first line is an example.
  cola = classifier_tasks.get_processor("cola")
  dev = cola.get_dev_examples(os.path.join(GLUE, "CoLA"))
  assert (dev[0].text_a, dev[0].label) == ("The sailors rode the breeze clear of the rocks.", "1")
  test = cola.get_test_examples(os.path.join(GLUE, "CoLA"))
  assert test[0].text_a == "Bill whistled past the house."
  # SST-2 keeps the text as is (tokenization deals with the trailing space).
  sst = classifier_tasks.get_processor("SST2").get_dev_examples(os.path.join(GLUE, "SST-2"))
  assert sst[0].text_a == "it 's a charming and often affecting journey . "
  stsb = classifier_tasks.get_processor("STS_B").get_dev_examples(os.path.join(GLUE, "STS-B"))
  assert (stsb[0].text_a, stsb[0].text_b, stsb[0].label) == (
      "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)


@requires_shared
def test_mnli_and_qqp_samples():
  mnli = classifier_tasks.get_processor("mnli")
  train = mnli.get_train_examples(os.path.join(GLUE, "MNLI-sample"))
  dev = mnli.get_dev_examples(os.path.join(GLUE, "MNLI-sample"))
  assert (len(train), len(dev)) == (48, 48)
  assert {e.label for e in train + dev} <= set(mnli.get_labels())
  # MNLI guids carry the file's index column, as the original's did.
  assert dev[0].guid == "dev_matched-284269"
  assert dev[0].text_b == "Not many of them spoke Spanish."
  assert isinstance(classifier_tasks.get_processor("mnli-mm"), classifier_tasks.MnliMismatchedProcessor)
  qqp = classifier_tasks.get_processor("qqp")
  train = qqp.get_train_examples(os.path.join(GLUE, "QQP-sample"))
  dev = qqp.get_dev_examples(os.path.join(GLUE, "QQP-sample"))
  assert (len(train), len(dev)) == (32, 32)
  assert train[0].text_b == "Why is having a baby a blessing?" and train[0].label == "1"


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text, encoding="utf-8")
  return str(path)


def test_malformed_rows_name_file_and_line(tmp_path):
  header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
  data_dir = tmp_path / "mrpc"
  path = _write(data_dir / "train.tsv", header + "1\t1\t2\tA \"quoted\" text.\tAnother.\n"
                + "0\t3\t4\tOnly four columns\n")
  with pytest.raises(fileio.InputError,
                     match=f"{path}:3: expected 5 tab-separated columns, found 4"):
    classifier_tasks.get_processor("mrpc").get_train_examples(str(data_dir))
  path = _write(data_dir / "dev.tsv", header + "1\t1\t2\ta\tb\n\n" + "2\t3\t4\tc\td\n")
  with pytest.raises(fileio.InputError, match=f"{path}:4: unknown label '2'"):
    classifier_tasks.get_processor("mrpc").get_dev_examples(str(data_dir))
  stsb_dir = tmp_path / "stsb"
  path = _write(stsb_dir / "dev.tsv", "index\tsentence1\tsentence2\tscore\n0\ta\tb\thigh\n")
  with pytest.raises(fileio.InputError, match=f"{path}:2: label 'high' is not a number"):
    classifier_tasks.StsbProcessor().get_dev_examples(str(stsb_dir))
  path = _write(tmp_path / "rte" / "train.tsv", "id\tpremise\thypothesis\tlabel\n")
  with pytest.raises(fileio.InputError, match="expected a header row naming the columns"):
    classifier_tasks.RteProcessor().get_train_examples(str(tmp_path / "rte"))
  with pytest.raises(fileio.InputError, match="not a known task"):
    classifier_tasks.get_processor("squad")


def test_truncate_seq_pair_pops_from_the_longer():
  a, b = list(range(10)), list(range(4))
  tokenization.truncate_seq_pair(a, b, 8)
  assert (a, b) == (list(range(4)), list(range(4)))
  # Ties pop from b first: 5+5 -> b 4 -> a 4 -> b 3.
  a, b = list(range(5)), list(range(5))
  tokenization.truncate_seq_pair(a, b, 7)
  assert (len(a), len(b)) == (4, 3)


@requires_shared
def test_convert_single_example_layout(tokenizer):
  example = run_classifier.InputExample("x-0", "Did it snow in Denver?", "Yes, all night.", "1")
  feature = run_classifier.convert_single_example(0, example, ["0", "1"], 16, tokenizer)
  tokens = ["[CLS]", "did", "it", "snow", "in", "denver", "?", "[SEP]", "yes", ",", "all", "night",
            ".", "[SEP]"]
  assert feature.input_ids == tokenizer.convert_tokens_to_ids(tokens) + [0] * 2
  assert feature.segment_ids == [0] * 8 + [1] * 6 + [0] * 2
  assert feature.input_mask == [1] * 14 + [0] * 2
  assert feature.label_id == 1 and feature.is_real_example
  # Single sentence truncated to max_seq_length - 2 word pieces.
  single = run_classifier.InputExample("x-1", "one two three four five six seven", None, "0")
  feature = run_classifier.convert_single_example(0, single, ["0", "1"], 6, tokenizer)
  assert feature.input_ids == tokenizer.convert_tokens_to_ids(
      ["[CLS]", "one", "two", "three", "four", "[SEP]"])
  padding = run_classifier.convert_single_example(0, run_classifier.PaddingInputExample(),
                                                  ["0", "1"], 6, tokenizer)
  assert padding.input_ids == [0] * 6 and not padding.is_real_example
  with pytest.raises(fileio.InputError, match="unknown label 'maybe'"):
    run_classifier.convert_single_example(
        0, run_classifier.InputExample("x-2", "a", None, "maybe"), ["0", "1"], 6, tokenizer)


@requires_shared
@pytest.mark.parametrize("task,directory", [("mrpc", "MRPC"), ("cola", "CoLA")])
def test_batch_tokenized_features_equal_the_reference_path(task, directory, tokenizer,
                                                            monkeypatch):
  # The feature conversion tokenizes texts in chunks through tokenize_batch; every feature must
  # be the one the reference tokenize of each example gives (pairs, single texts, padding
  # examples, windows), chunk boundaries included.
  monkeypatch.setattr(run_classifier, "_TOKENIZE_CHUNK", 100)
  processor = classifier_tasks.get_processor(task)
  examples = processor.get_dev_examples(os.path.join(GLUE, directory))[:250]
  examples.insert(130, run_classifier.PaddingInputExample())
  labels = processor.get_labels()
  fresh = tokenization.FullTokenizer(VOCAB, do_lower_case=True)
  for seq_length, stride in ((128, None), (24, 8)):
    # (any iterable of examples: a generator for the windows)
    got = run_classifier.convert_examples_to_features(iter(examples) if stride else examples,
                                                      labels, seq_length, fresh,
                                                      doc_stride=stride)
    want = [f for i, e in enumerate(examples) for f in run_classifier.convert_example_windows(
        i, e, labels, seq_length, tokenizer, doc_stride=stride)]
    assert len(got) == len(want) > len(examples) - (stride is None)
    for g, w in zip(got, want):
      assert vars(g) == vars(w)
  assert any(getattr(e, "text_b", None) for e in examples) == (task == "mrpc")


@requires_shared
def test_tfrecord_round_trip_and_input_fn(tokenizer, tmp_path):
  processor = classifier_tasks.get_processor("mrpc")
  examples = processor.get_dev_examples(os.path.join(GLUE, "MRPC"))
  output_file = str(tmp_path / "eval.tf_record")
  count = run_classifier.file_based_convert_examples_to_features(
      examples, processor.get_labels(), 128, tokenizer, output_file)
  assert count == 408 and os.path.exists(output_file)
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left over

  spec = run_classifier.feature_spec(128)
  input_fn = fine_tuning.input_fn_builder(output_file, spec, False, drop_remainder=False)
  batches = list(input_fn(batch_size=100))
  assert [int(b["input_ids"].shape[0]) for b in batches] == [100, 100, 100, 100, 8]
  first = batches[0]
  assert set(first) == {"input_ids", "input_mask", "segment_ids", "label_ids", "is_real_example"}
  assert all(t.dtype == tf.int32 for t in first.values())
  expected = run_classifier.convert_single_example(0, examples[0], processor.get_labels(), 128,
                                                   tokenizer)
  np.testing.assert_array_equal(first["input_ids"][0], expected.input_ids)
  np.testing.assert_array_equal(first["segment_ids"][0], expected.segment_ids)
  labels = np.concatenate([b["label_ids"].numpy() for b in batches])
  np.testing.assert_array_equal(labels, [int(e.label) for e in examples])

  # Sharded per input pipeline; batch_size is per replica.
  context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                       num_replicas_in_sync=2)
  shard = list(input_fn(batch_size=32, input_context=context))
  assert int(shard[0]["input_ids"].shape[0]) == 32
  assert sum(int(b["input_ids"].shape[0]) for b in shard) == 204
  np.testing.assert_array_equal(shard[0]["label_ids"].numpy()[:3], labels[1:6:2])

  # Training: shuffled, repeated, fixed batch shape.
  train_fn = fine_tuning.input_fn_builder(output_file, spec, is_training=True, seed=1)
  for batch in train_fn(batch_size=256).take(3):
    assert batch["input_ids"].shape == (256, 128)


@requires_shared
def test_dynamic_padding_cuts_batches_after_their_longest_pair(tokenizer, tmp_path):
  """MRPC dev pairs at max_seq_length 128: each batch keeps every real token, ends on the step of
  16 at or above its longest pair, and the cut-off part was padding only."""
  processor = classifier_tasks.get_processor("mrpc")
  examples = processor.get_dev_examples(os.path.join(GLUE, "MRPC"))
  output_file = str(tmp_path / "eval.tf_record")
  run_classifier.file_based_convert_examples_to_features(
      examples, processor.get_labels(), 128, tokenizer, output_file)
  spec = run_classifier.feature_spec(128)
  full_fn = fine_tuning.input_fn_builder(output_file, spec, False, drop_remainder=False)
  cut_fn = fine_tuning.input_fn_builder(output_file, spec, False, False, pad_to_longest=True)
  cut_batches = cut_fn(batch_size=8)
  assert cut_batches.element_spec["input_ids"].shape.as_list() == [None, None]
  lengths = []
  for full, cut in zip(full_fn(batch_size=8), cut_batches):
    length = int(cut["input_ids"].shape[1])
    longest = int(tf.reduce_max(tf.reduce_sum(full["input_mask"], axis=1)))
    assert length % 16 == 0 and longest <= length < longest + 16
    for name in ("input_ids", "input_mask", "segment_ids"):
      np.testing.assert_array_equal(cut[name], full[name][:, :length])
      assert not full[name][:, length:].numpy().any()
    np.testing.assert_array_equal(cut["label_ids"], full["label_ids"])
    lengths.append(length)
  assert len(lengths) == 51 and max(lengths) <= 112 and min(lengths) >= 48, lengths
  # A batch of padding examples only (their masks all zero) keeps one step of 16.
  empty = {"input_mask": tf.zeros([2, 128], tf.int32), "label_ids": tf.zeros([2], tf.int32)}
  assert input_pipeline.trim_to_longest(empty, 16)["input_mask"].shape == (2, 16)


@requires_shared
def test_regression_features_are_float(tokenizer, tmp_path):
  processor = classifier_tasks.get_processor("sts-b")
  examples = processor.get_dev_examples(os.path.join(GLUE, "STS-B"))[:20]
  output_file = str(tmp_path / "stsb.tf_record")
  run_classifier.file_based_convert_examples_to_features(examples, processor.get_labels(), 64,
                                                         tokenizer, output_file,
                                                         is_regression=True)
  input_fn = fine_tuning.input_fn_builder(
      output_file, run_classifier.feature_spec(64, is_regression=True), False, False)
  batch = next(iter(input_fn(batch_size=20)))
  assert batch["label_ids"].dtype == tf.float32
  np.testing.assert_allclose(batch["label_ids"].numpy(), [e.label for e in examples], rtol=1e-6)


def test_custom_tsv_and_csv_tasks(tmp_path):
  data_dir = tmp_path / "reviews"
  _write(data_dir / "train.tsv", "id\treview\tstars\n1\tGreat phone\tpos\n2\tBroke in a day\tneg\n"
         "3\t\"Fine\" I guess\tneutral\n")
  _write(data_dir / "dev.tsv", "id\treview\tstars\n7\tWorks\tpos\n")
  _write(data_dir / "test.tsv", "id\treview\n9\tNo idea yet\n")
  processor = classifier_tasks.get_processor("tsv", delimited_options=dict(
      text_a_column="review", label_column="stars"))
  train = processor.get_train_examples(str(data_dir))
  assert processor.get_labels() == ["neg", "neutral", "pos"]
  assert train[2].text_a == "\"Fine\" I guess" and train[2].text_b is None
  assert [e.label for e in processor.get_dev_examples(str(data_dir))] == ["pos"]
  test = processor.get_test_examples(str(data_dir))
  assert (test[0].text_a, test[0].label) == ("No idea yet", "neg")
  path = _write(data_dir / "dev.tsv", "id\treview\tstars\n7\tWorks\tgreat\n")
  with pytest.raises(fileio.InputError, match=f"{path}:2: unknown label 'great'"):
    processor.get_dev_examples(str(data_dir))

  # CSV: quoted fields may hold commas, quotes and newlines; columns by number, no header.
  csv_dir = tmp_path / "pairs"
  _write(csv_dir / "train.csv", '"Hello, world",Hi,1\n"He said ""no""\nthen left",He left,0\n'
         "a,b,2\n")
  processor = classifier_tasks.get_processor("csv", delimited_options=dict(
      text_a_column="0", text_b_column="1", label_column="2", skip_header=False))
  train = processor.get_train_examples(str(csv_dir))
  assert processor.get_labels() == ["0", "1", "2"]  # numeric labels sort as numbers
  assert train[1].text_a == 'He said "no"\nthen left' and train[1].text_b == "He left"
  path = _write(csv_dir / "dev.csv", "x,y,1\n\"unterminated,y,1\n")
  with pytest.raises(fileio.InputError, match=path):
    processor.get_dev_examples(str(csv_dir))
  with pytest.raises(fileio.InputError, match="need a header row"):
    classifier_tasks.get_processor("tsv", delimited_options=dict(
        text_a_column="review", label_column="2", skip_header=False))


def test_xnli_language_rows(tmp_path):
  # XNLI's layout: translated MultiNLI training files and one all-languages dev/test file.
  _write(tmp_path / "multinli" / "multinli.train.de.tsv",
         "premise\thypo\tlabel\nEr kam spät.\tEr war pünktlich.\tcontradictory\n"
         "Sie lacht.\tSie ist froh.\tentailment\n")
  columns = ["language", "gold_label", "sentence1_binary_parse", "sentence2_binary_parse",
             "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "promptID", "pairID",
             "genre", "label1", "label2", "label3", "label4", "label5"]

  def row(language, label, premise, hypothesis):
    values = dict.fromkeys(columns, "x")
    values.update(language=language, gold_label=label, sentence1=premise, sentence2=hypothesis)
    return "\t".join(values[c] for c in columns) + "\n"

  _write(tmp_path / "xnli.dev.tsv", "\t".join(columns) + "\n"
         + row("en", "neutral", "He walked.", "He walked home.")
         + row("de", "neutral", "Er ging.", "Er ging nach Hause.")
         + row("de", "entailment", "Es regnet.", "Es ist nass."))
  processor = classifier_tasks.get_processor("xnli", xnli_language="de")
  train = processor.get_train_examples(str(tmp_path))
  assert [e.label for e in train] == ["contradiction", "entailment"]
  assert train[0].text_a == "Er kam spät."
  dev = processor.get_dev_examples(str(tmp_path))
  assert [(e.guid, e.text_a, e.label) for e in dev] == [
      ("dev-2", "Er ging.", "neutral"), ("dev-3", "Es regnet.", "entailment")]
  with pytest.raises(fileio.InputError, match="no rows for language 'fr'"):
    classifier_tasks.get_processor("xnli", xnli_language="fr").get_dev_examples(str(tmp_path))


# --- texts longer than one sequence: --doc_stride ---------------------------------------------


def _windows_of(tokenizer, example, max_seq_length, stride):
  """The token sequences of an example's windows, computed here without the script's code:
  the windowed text (text_b of a pair, else text_a) in windows of the tokens left after [CLS],
  text_a as truncate_seq_pair would keep it and the [SEP]s, starting at 0, stride, 2 * stride,
  ... until one reaches the text's end."""
  a = tokenizer.tokenize(example.text_a)
  b = tokenizer.tokenize(example.text_b) if example.text_b else []
  budget = max_seq_length - (3 if b else 2)
  if len(a) + len(b) <= budget:
    return [["[CLS]", *a, "[SEP]", *b, *(["[SEP]"] if b else [])]]
  if b:
    kept = list(a)
    tokenization.truncate_seq_pair(kept, list(b), budget)
    size, text = budget - len(kept), b
  else:
    kept, size, text = [], budget, a
  count = 1 + -(-(len(text) - size) // stride)
  windows = []
  for k in range(count):
    part = text[k * stride:k * stride + size]
    windows.append(["[CLS]", *kept, "[SEP]", *part, "[SEP]"] if b else ["[CLS]", *part, "[SEP]"])
  assert count == 1 or (k * stride + size >= len(text) > (k - 1) * stride + size)
  return windows


def test_doc_stride_windows_a_pair_at_the_smallest_sequence_length(tokenizer):
  """--max_seq_length=5, the least a pair may have (_check_flags refuses 4, whose one-token budget
  would leave text_b no window), with --doc_stride=1: text_a keeps a token and text_b is read
  whole, a token per window, as _windows_of cuts it."""
  example = run_classifier.InputExample("dev-1", "the cat sat", "a dog ran far", "1")
  features = run_classifier.convert_example_windows(1, example, ["0", "1"], 5, tokenizer,
                                                    doc_stride=1)
  windows = _windows_of(tokenizer, example, 5, 1)
  assert windows == [["[CLS]", "the", "[SEP]", word, "[SEP]"] for word in "a dog ran far".split()]
  assert [f.input_ids for f in features] == [tokenizer.convert_tokens_to_ids(w) for w in windows]
  assert [f.segment_ids for f in features] == [[0, 0, 0, 1, 1]] * 4


def _tiny_config(tmp_path, layers):
  """bert_config.json of a small BERT with the real vocabulary's size (trained from scratch)."""
  config = tmp_path / "bert_config.json"
  config.write_text(modeling.BertConfig(
      vocab_size=30522, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=64, type_vocab_size=2).to_json_string())
  return config


def _results(path):
  return {key: float(value) for key, value in
          (line.split(" = ") for line in path.read_text().splitlines())}


@requires_shared
@pytest.mark.parametrize("task,directory,max_seq_length",
                         [("mrpc", "MRPC", 40), ("rte", "RTE", 24)])
def test_doc_stride_trains_on_every_window_and_predicts_by_the_mean(task, directory,
                                                                    max_seq_length, tokenizer,
                                                                    tmp_path):
  """Real MRPC / RTE rows with a --max_seq_length that most (MRPC) or a third to a half (RTE,
  whose long text is text_a) of them exceed: the training records are every window with its
  example's label; eval_results.txt and test_results.tsv have one row per example, in input
  order, equal to the mean of the trained model's probabilities over the windows computed here
  (the loss and accuracy are those of these means)."""
  data = tmp_path / "data"
  data.mkdir()
  for split, rows in (("train", 41), ("dev", 31), ("test", 29)):  # header + examples
    with open(os.path.join(GLUE, directory, f"{split}.tsv"), "rb") as f:
      (data / f"{split}.tsv").write_bytes(b"".join(f.readline() for _ in range(rows)))
  config = _tiny_config(tmp_path, layers=2)
  stride = 5
  out = tmp_path / "out"
  run_ok(["run_classifier.py", f"--task_name={task}", f"--data_dir={data}",
          f"--vocab_file={VOCAB}", f"--bert_config_file={config}", f"--output_dir={out}",
          f"--max_seq_length={max_seq_length}", f"--doc_stride={stride}", "--do_train",
          "--do_eval", "--do_predict", "--train_batch_size=8", "--eval_batch_size=8",
          "--predict_batch_size=8", "--num_train_epochs=1", "--learning_rate=1e-3"])

  processor = classifier_tasks.get_processor(task)
  labels = processor.get_labels()
  model = modeling.BertClassifier(modeling.BertConfig.from_json_file(str(config)), len(labels))
  assert not checkpoints.init_from_checkpoint(model, str(out)).missing

  def mean_probabilities(examples):
    means, counts = [], []
    for example in examples:
      windows = _windows_of(tokenizer, example, max_seq_length, stride)
      ids = np.zeros([len(windows), max_seq_length], np.int32)
      types = np.zeros_like(ids)
      for row, tokens in enumerate(windows):
        ids[row, :len(tokens)] = tokenizer.convert_tokens_to_ids(tokens)
        types[row, tokens.index("[SEP]") + 1:len(tokens)] = 1
      logits = model({"input_ids": ids, "input_mask": (ids > 0).astype(np.int32),
                      "segment_ids": types})["logits"]
      means.append(tf.nn.softmax(logits).numpy().mean(axis=0))
      counts.append(len(windows))
    return np.array(means), counts

  # Training: every window a record, with its example's label, in input order.
  train = processor.get_train_examples(str(data))
  windows = [(tokens, labels.index(e.label)) for e in train
             for tokens in _windows_of(tokenizer, e, max_seq_length, stride)]
  records = list(fine_tuning.input_fn_builder(
      str(out / "train.tf_record"), run_classifier.feature_spec(max_seq_length), False,
      drop_remainder=False)(batch_size=1000))[0]
  assert len(records["label_ids"]) == len(windows) > len(train)
  assert records["label_ids"].numpy().tolist() == [label for _, label in windows]
  for row, (tokens, _) in zip(records["input_ids"].numpy(), windows):
    assert row.tolist() == tokenizer.convert_tokens_to_ids(tokens) + [0] * (
        max_seq_length - len(tokens))

  dev = processor.get_dev_examples(str(data))
  want, counts = mean_probabilities(dev)
  assert 0 < sum(c > 1 for c in counts) < len(dev), counts
  dev_labels = np.array([labels.index(e.label) for e in dev])
  results = _results(out / "eval_results.txt")
  assert results["eval_examples"] == len(dev)
  assert results["eval_accuracy"] == pytest.approx(np.mean(want.argmax(-1) == dev_labels))
  assert results["eval_loss"] == pytest.approx(metrics.cross_entropy(want, dev_labels), abs=1e-5)

  test = processor.get_test_examples(str(data))
  want, counts = mean_probabilities(test)
  assert 0 < sum(c > 1 for c in counts) < len(test), counts
  rows = [[float(v) for v in line.split("\t")]
          for line in (out / "test_results.tsv").read_text().splitlines()]
  assert len(rows) == len(test)
  np.testing.assert_allclose(rows, want, atol=1e-5, rtol=0)
  # The labelled file beside it: a header, each example's id, its predicted label, then the same
  # probabilities per label.
  lines = [line.split("\t") for line in (out / "test_predictions.tsv").read_text().splitlines()]
  assert lines[0] == ["id", "prediction"] + labels
  assert [line[0] for line in lines[1:]] == [e.guid.split("-", 1)[1] for e in test]
  assert [line[1] for line in lines[1:]] == [labels[i] for i in want.argmax(-1)]
  np.testing.assert_allclose([[float(v) for v in line[2:]] for line in lines[1:]], rows, rtol=0,
                             atol=0)


# --- Multi-label: GoEmotions and --multi_label tsv/csv tasks --------------------------------------

GOEMOTIONS = os.path.join(SHARED, "data", "goemotions")


@requires_shared
def test_goemotions_processor_reads_the_real_files():
  processor = classifier_tasks.get_processor("goemotions")
  assert processor.multi_label and not processor.is_pair
  train = processor.get_train_examples(GOEMOTIONS)
  labels = processor.get_labels()
  assert len(labels) == 28 and labels[0] == "admiration" and labels[27] == "neutral"
  assert (len(train), len(processor.get_dev_examples(GOEMOTIONS)),
          len(processor.get_test_examples(GOEMOTIONS))) == (43410, 5426, 5427)
  # The first training row: "My favourite food is ...", label id 27 (neutral), comment eebbqej.
  assert (train[0].guid, train[0].label) == ("train-eebbqej", ("neutral",))
  assert train[0].text_a.startswith("My favourite food is anything")
  counts = np.bincount([len(e.label) for e in train])
  assert counts[0] == 0 and counts[1] > 30000 and counts[2] > 4000 and len(counts) >= 4
  assert all(label in labels for e in train for label in e.label)


def test_multi_label_files_errors_name_file_and_line(tmp_path):
  data = tmp_path / "go"
  _write(data / "labels.txt", "joy\nanger\n")
  _write(data / "train.tsv", "so happy\t0\ta1\nhappy and mad\t0,1\ta2\n")
  processor = classifier_tasks.get_processor("goemotions")
  assert [e.label for e in processor.get_train_examples(str(data))] == [("joy",),
                                                                       ("joy", "anger")]
  for row, message in (("x\t2\ta3", "label ids '2' are not numbers below 2"),
                       ("x\tjoy\ta3", "label ids 'joy' are not numbers"),
                       ("x\t0,0\ta3", "a label is repeated"),
                       ("x\t0", "expected 3 tab-separated columns")):
    path = _write(data / "dev.tsv", f"fine\t1\tb1\n{row}\n")
    with pytest.raises(fileio.InputError, match=f"{path}:2: {message}"):
      classifier_tasks.get_processor("goemotions").get_dev_examples(str(data))
  # The release's own folder names the label file emotions.txt: read as labels.txt.
  os.rename(data / "labels.txt", data / "emotions.txt")
  processor = classifier_tasks.get_processor("goemotions")
  assert processor.get_labels(str(data)) == ["joy", "anger"]
  assert str(data / "emotions.txt") in processor.data_files(str(data))
  os.remove(data / "emotions.txt")
  with pytest.raises(fileio.InputError, match=f"{data / 'labels.txt'}"):
    classifier_tasks.get_processor("goemotions").get_labels(str(data))

  # tsv with --multi_label: labels separated by --label_delimiter, an empty field is no label.
  data = tmp_path / "tags"
  _write(data / "train.tsv", "text\ttags\nred apple\tfruit|red\nsky\t\nbanana\tfruit\n")
  processor = classifier_tasks.get_processor("tsv", delimited_options=dict(
      text_a_column="text", label_column="tags", multi_label=True, label_delimiter="|"))
  train = processor.get_train_examples(str(data))
  assert processor.get_labels() == ["fruit", "red"]
  assert [e.label for e in train] == [("fruit", "red"), (), ("fruit",)]
  features = run_classifier.convert_examples_to_features(
      train, processor.get_labels(), 8, _tiny_tokenizer(tmp_path), multi_label=True)
  assert [f.label_id for f in features] == [[1, 1], [0, 0], [1, 0]]
  path = _write(data / "dev.tsv", "text\ttags\nplum\tfruit|purple\n")
  with pytest.raises(fileio.InputError, match=f"{path}:2: unknown label 'purple'"):
    processor.get_dev_examples(str(data))
  with pytest.raises(fileio.InputError, match="exclude each other"):
    classifier_tasks.get_processor("tsv", delimited_options=dict(
        text_a_column="text", label_column="tags", multi_label=True, is_regression=True))


def _tiny_tokenizer(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "red", "apple", "sky",
                              "banana", "plum"]) + "\n")
  return tokenization.FullTokenizer(str(vocab))


def _goemotions_subset(tmp_path, rows=(160, 96, 64)):
  data = tmp_path / "goemotions"
  data.mkdir()
  for split, count in zip(("train", "dev", "test"), rows):
    with open(os.path.join(GOEMOTIONS, f"{split}.tsv"), "rb") as f:
      (data / f"{split}.tsv").write_bytes(b"".join(f.readline() for _ in range(count)))
  (data / "labels.txt").write_bytes(open(os.path.join(GOEMOTIONS, "labels.txt"), "rb").read())
  return data


@requires_shared
def test_multi_label_fine_tuning_eval_predict_and_export(tokenizer, tmp_path):
  """Real GoEmotions rows, a small BERT from scratch: the records carry 0/1 label rows; the eval
  metrics and loss are those of the trained model's sigmoid outputs computed here, at 0.5 and at
  the per-label thresholds tuned on dev (written to thresholds.json, used by the predictions and
  by the exported SavedModel, whose probabilities equal test_results.tsv). The model learns only
  the priors: tuning keeps the default, and the run says that its score is at the floor."""
  from bert_tf2 import export_model  # pylint: disable=g-import-not-at-top
  data = _goemotions_subset(tmp_path)
  config = _tiny_config(tmp_path, layers=1)
  out = tmp_path / "out"
  common = ["run_classifier.py", "--task_name=goemotions", f"--data_dir={data}",
            f"--vocab_file={VOCAB}", f"--output_dir={out}", "--max_seq_length=32",
            "--eval_batch_size=16", "--predict_batch_size=16"]
  trained = run_ok(common + [f"--bert_config_file={config}", "--do_train", "--do_eval",
                             "--do_predict", "--tune_thresholds", "--train_batch_size=16",
                             "--num_train_epochs=3", "--learning_rate=3e-3"])
  processor = classifier_tasks.get_processor("goemotions")
  labels = processor.get_labels(str(data))
  task = fine_tuning.task_record(str(out), None, False)
  assert task["multi_label"] and task["labels"] == labels

  train = processor.get_train_examples(str(data))
  records = list(fine_tuning.input_fn_builder(
      str(out / "train.tf_record"), run_classifier.feature_spec(32, False, len(labels)), False,
      drop_remainder=False)(batch_size=1000))[0]
  assert records["label_ids"].numpy().tolist() == [
      [int(label in e.label) for label in labels] for e in train]

  model = modeling.BertClassifier(modeling.BertConfig.from_json_file(str(config)), len(labels))
  assert not checkpoints.init_from_checkpoint(model, str(out)).missing

  def probabilities(examples):
    features = run_classifier.convert_examples_to_features(examples, labels, 32, tokenizer,
                                                           multi_label=True)
    logits = model({"input_ids": np.array([f.input_ids for f in features]),
                    "input_mask": np.array([f.input_mask for f in features]),
                    "segment_ids": np.array([f.segment_ids for f in features])})["logits"]
    return tf.sigmoid(logits).numpy()

  dev = processor.get_dev_examples(str(data))
  gold = np.array([[int(label in e.label) for label in labels] for e in dev])
  want = probabilities(dev)
  results = _results(out / "eval_results.txt")
  summary, _ = metrics.multi_label_metrics(gold, want)
  thresholds = metrics.tune_thresholds(gold, want)
  tuned, per_label = metrics.multi_label_metrics(gold, want, thresholds)
  for name in ("macro_f1", "micro_f1", "exact_match", "micro_precision", "macro_recall"):
    assert results[f"eval_{name}"] == pytest.approx(summary[name], abs=1e-6), name
    assert results[f"eval_tuned_{name}"] == pytest.approx(tuned[name], abs=1e-6), name
  # 160 examples teach a small BERT from scratch only the labels' priors: its outputs are the
  # same for every text. Tuning then finds nothing better than --threshold (each label's best F1
  # was "always", which put all 28 labels on every example), and the run says both in a line.
  assert np.ptp(want, axis=0).max() < 1e-3
  np.testing.assert_array_equal(thresholds, 0.5)
  assert results["eval_tuned_micro_f1"] == results["eval_micro_f1"] == 0.0
  assert "--tune_thresholds: no label's threshold beats --threshold=0.5 on dev" in trained.stderr
  assert "dev micro F1 is 0: the model predicts no true label" in trained.stderr
  assert results["eval_loss"] == pytest.approx(metrics.binary_cross_entropy(want, gold), abs=1e-5)
  table = [line.split("\t") for line in (out / "eval_per_label.tsv").read_text().splitlines()]
  assert table[0] == ["label", "precision", "recall", "f1", "support", "predicted", "threshold"]
  assert [row[0] for row in table[1:]] == labels
  assert [int(row[4]) for row in table[1:]] == gold.sum(0).tolist()
  np.testing.assert_allclose([float(row[3]) for row in table[1:]],
                             [p["f1"] for p in per_label], atol=1e-4)
  saved = json.loads((out / "thresholds.json").read_text())
  np.testing.assert_allclose([saved["thresholds"][label] for label in labels], thresholds)

  test = processor.get_test_examples(str(data))
  want = probabilities(test)
  rows = np.array([[float(v) for v in line.split("\t")]
                   for line in (out / "test_results.tsv").read_text().splitlines()])
  np.testing.assert_allclose(rows, want, atol=1e-5, rtol=0)
  lines = [line.split("\t") for line in (out / "test_predictions.tsv").read_text().splitlines()]
  assert lines[0] == ["id", "prediction"] + labels
  assert [line[0] for line in lines[1:]] == [e.guid.split("-", 1)[1] for e in test]
  chosen = [",".join(l for l, p, t in zip(labels, row, thresholds) if p > t) for row in rows]
  assert [line[1] for line in lines[1:]] == chosen and not any(chosen)

  # The exported classifier: raw text in, the same probabilities, the tuned thresholds' labels.
  export_dir = tmp_path / "export"
  export_model.export("classifier", str(export_dir), init_checkpoint=str(out),
                      max_seq_length=32)
  serving = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
  served = serving(text_a=tf.constant([e.text_a for e in test]))
  np.testing.assert_allclose(served["probabilities"].numpy(), rows, atol=1e-5, rtol=0)
  assert [s.decode() for s in served["label"].numpy()] == chosen
  np.testing.assert_array_equal(served["predicted"].numpy(), rows > thresholds)
  # As a LiteRT model (float32): the tuned thresholds ride along; run_classifier --litert_model
  # predicts the same probabilities and labels.
  litert_dir = tmp_path / "litert"
  export_model.export("classifier", str(litert_dir), init_checkpoint=str(out),
                      max_seq_length=32, export_format="litert")
  info = json.loads((litert_dir / "litert_model.json").read_text())
  assert info["multi_label"] and info["labels"] == labels
  np.testing.assert_allclose(info["thresholds"], thresholds, atol=1e-6)
  litert_out = tmp_path / "litert_out"
  run_ok(["run_classifier.py", "--task_name=goemotions", f"--data_dir={data}",
          f"--litert_model={litert_dir}", f"--output_dir={litert_out}", "--max_seq_length=32",
          "--predict_batch_size=16", "--do_predict"])
  litert_lines = [line.split("\t") for line in
                  (litert_out / "test_predictions.tsv").read_text().splitlines()]
  assert [line[:2] for line in litert_lines] == [line[:2] for line in lines]
  np.testing.assert_allclose([[float(v) for v in line[2:]] for line in litert_lines[1:]], rows,
                             atol=1e-5, rtol=0)
  # A --threshold given wins over the exported thresholds.
  run_ok(["run_classifier.py", "--task_name=goemotions", f"--data_dir={data}",
          f"--litert_model={litert_dir}", f"--output_dir={litert_out}", "--max_seq_length=32",
          "--predict_batch_size=16", "--do_predict", "--threshold=0.3"])
  litert_lines = [line.split("\t") for line in
                  (litert_out / "test_predictions.tsv").read_text().splitlines()]
  assert [line[1] for line in litert_lines[1:]] == [
      ",".join(l for l, p in zip(labels, row) if p > 0.3) for row in rows]

  # Predicting again with --tune_thresholds needs the thresholds of this checkpoint: after more
  # training they are stale, which is said in one line.
  run_ok(common + ["--do_train", "--num_train_epochs=4", "--train_batch_size=16"])
  result = run_script(common + ["--do_predict", "--tune_thresholds"])
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1].startswith("error: ")
  assert "was tuned at step 30, the checkpoint is at step 40" in result.stderr
  # The same rows as a tsv task of your own: label names joined by --label_delimiter. A
  # multi-label model is not evaluated as a single-label one.
  tsv = tmp_path / "tsv"
  tsv.mkdir()
  for split in ("train", "dev", "test"):
    rows = processor._create_examples(str(data), split)  # pylint: disable=protected-access
    (tsv / f"{split}.tsv").write_text("text\temotions\n" + "".join(
        f"{e.text_a}\t{'|'.join(e.label)}\n" for e in rows), encoding="utf-8")
  tsv_out = tmp_path / "tsv_out"
  tsv_flags = ["run_classifier.py", "--task_name=tsv", f"--data_dir={tsv}", "--text_a_column=text",
               "--label_column=emotions", f"--vocab_file={VOCAB}", f"--output_dir={tsv_out}",
               "--max_seq_length=32", "--eval_batch_size=16", "--predict_batch_size=16"]
  run_ok(tsv_flags + ["--multi_label", "--label_delimiter=|", f"--bert_config_file={config}",
                      "--do_train", "--do_predict", "--train_batch_size=16", "--threshold=0.2"])
  tsv_labels = fine_tuning.task_record(str(tsv_out), None, False)["labels"]
  assert sorted(tsv_labels) == sorted({l for e in train for l in e.label})
  lines = [line.split("\t") for line in (tsv_out / "test_predictions.tsv").read_text().splitlines()]
  predicted = [line[1] for line in lines[1:]]
  assert [p.split("|") if p else [] for p in predicted] == [
      [l for l, v in zip(tsv_labels, line[2:]) if float(v) > 0.2] for line in lines[1:]]
  assert any("|" in p for p in predicted)
  result = run_script(tsv_flags + ["--do_eval"])
  assert result.stderr.strip().splitlines() == [
      f"error: --output_dir={tsv_out} holds a multi-label classifier; run with --multi_label"]
  result = run_script(common[:1] + ["--task_name=mrpc", f"--data_dir={data}", "--multi_label",
                                    f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / 'x'}",
                                    "--do_eval"])
  assert result.stderr.strip().splitlines()[-1] == (
      "error: --multi_label is for --task_name=tsv or csv; --task_name=mrpc is a single-label "
      "task")


@requires_shared
def test_gradient_checkpointing_trains_the_same_model(tmp_path):
  """run_classifier --gradient_checkpointing (dropout on) ends at the checkpoint of the plain
  run: weights, Adam moments and step (conftest.assert_same_checkpoints)."""
  from conftest import assert_same_checkpoints, concurrently  # pylint: disable=g-import-not-at-top
  data = tmp_path / "data"
  data.mkdir()
  for split, rows in (("train", 33), ("dev", 2)):
    with open(os.path.join(GLUE, "MRPC", f"{split}.tsv"), "rb") as f:
      (data / f"{split}.tsv").write_bytes(b"".join(f.readline() for _ in range(rows)))
  config = _tiny_config(tmp_path, layers=2)
  runs = [["run_classifier.py", "--task_name=mrpc", f"--data_dir={data}", f"--vocab_file={VOCAB}",
           f"--bert_config_file={config}", f"--output_dir={tmp_path / name}", "--do_train",
           "--max_seq_length=48", "--train_batch_size=8", "--num_train_epochs=1",
           "--learning_rate=1e-3", *extra]
          for name, extra in (("plain", []), ("checkpointed", ["--gradient_checkpointing"]))]
  for result in concurrently([lambda args=args: run_script(args) for args in runs]):
    assert result.returncode == 0, result.stderr[-2000:]
  assert_same_checkpoints(str(tmp_path / "plain"), str(tmp_path / "checkpointed"))


@requires_shared
def test_classifier_pooling_mean_trains_predicts_and_exports(tmp_path):
  """--classifier_pooling=mean: the output layer reads the masked mean of the last layer (the
  probabilities of test_results.tsv are those computed here from the checkpoint's encoder and
  output layer by hand, and differ from what the [CLS] pooler would give); task.json keeps the
  pooling, so prediction without the flag and the exported SavedModel use it, and a
  contradicting flag is one error line."""
  from bert_tf2 import export_model  # pylint: disable=g-import-not-at-top
  data = tmp_path / "data"
  data.mkdir()
  for split, rows in (("train", 97), ("dev", 33), ("test", 33)):
    with open(os.path.join(GLUE, "SST-2", f"{split}.tsv"), "rb") as f:
      (data / f"{split}.tsv").write_bytes(b"".join(f.readline() for _ in range(rows)))
  config = _tiny_config(tmp_path, layers=1)
  out = tmp_path / "out"
  common = ["run_classifier.py", "--task_name=sst-2", f"--data_dir={data}",
            f"--vocab_file={VOCAB}", f"--output_dir={out}", "--max_seq_length=32",
            "--predict_batch_size=8", "--eval_batch_size=8"]
  run_ok(common + [f"--bert_config_file={config}", "--do_train", "--train_batch_size=16",
                   "--num_train_epochs=2", "--learning_rate=3e-3", "--classifier_pooling=mean"])
  assert fine_tuning.task_record(str(out), None, False)["classifier_pooling"] == "mean"
  run_ok(common + ["--do_predict"])  # (no flag: the training run's pooling)
  rows = np.loadtxt(out / "test_results.tsv", delimiter="\t", ndmin=2)

  processor = classifier_tasks.get_processor("sst-2")
  tokenizer = tokenization.FullTokenizer(VOCAB)
  features = run_classifier.convert_examples_to_features(
      processor.get_test_examples(str(data)), ["0", "1"], 32, tokenizer)
  inputs = {"input_ids": np.array([f.input_ids for f in features]),
            "input_mask": np.array([f.input_mask for f in features]),
            "segment_ids": np.array([f.segment_ids for f in features])}
  model = modeling.BertClassifier(modeling.BertConfig.from_json_file(str(config)), 2)
  assert not checkpoints.init_from_checkpoint(model, str(out)).missing
  tokens = model.bert(inputs["input_ids"], inputs["input_mask"],
                      inputs["segment_ids"])["sequence_output"].numpy()
  mask = inputs["input_mask"][:, :, None]
  mean = (tokens * mask).sum(1) / mask.sum(1)
  weights = model.output_layer.output_weights.numpy()
  logits = mean @ weights.T + model.output_layer.output_bias.numpy()
  want = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  np.testing.assert_allclose(rows, want, atol=1e-5, rtol=0)
  pooler = tf.nn.softmax(model(inputs)["logits"]).numpy()  # the same weights through the pooler
  assert np.abs(pooler - want).max() > 1e-3

  export_dir = tmp_path / "export"
  export_model.export("classifier", str(export_dir), init_checkpoint=str(out),
                      max_seq_length=32)
  serving = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
  served = serving(text_a=tf.constant([e.text_a for e in processor.get_test_examples(str(data))]))
  np.testing.assert_allclose(served["probabilities"].numpy(), want, atol=1e-5, rtol=0)

  # As a LiteRT model (float32): the pooling rides along, the probabilities are the same.
  litert_dir = tmp_path / "litert"
  export_model.export("classifier", str(litert_dir), init_checkpoint=str(out),
                      max_seq_length=32, export_format="litert")
  assert json.loads((litert_dir / "litert_model.json").read_text())["classifier_pooling"] == "mean"
  litert_out = tmp_path / "litert_out"
  run_ok(["run_classifier.py", "--task_name=sst-2", f"--data_dir={data}",
          f"--litert_model={litert_dir}", f"--output_dir={litert_out}", "--max_seq_length=32",
          "--predict_batch_size=8", "--do_predict"])
  np.testing.assert_allclose(np.loadtxt(litert_out / "test_results.tsv", delimiter="\t",
                                        ndmin=2), want, atol=1e-5, rtol=0)

  # A contradicting flag, and a damaged task.json, are one error line each.
  result = run_script(common + ["--do_eval", "--classifier_pooling=cls"])
  assert result.stderr.strip().splitlines() == [
      f"error: --output_dir={out} holds a classifier trained with --classifier_pooling=mean, "
      "not cls; leave the flag out or choose another --output_dir"]
  result = run_script(["run_classifier.py", "--task_name=sst-2", f"--data_dir={data}",
                       f"--litert_model={litert_dir}", f"--output_dir={litert_out}",
                       "--max_seq_length=32", "--do_predict", "--classifier_pooling=pooler"])
  assert result.stderr.strip().splitlines() == [
      f"error: --litert_model={litert_dir} reads --classifier_pooling=mean, not pooler"]
  record = json.loads((out / "task.json").read_text())
  (out / "task.json").write_text(json.dumps({**record, "classifier_pooling": "average"}))
  result = run_script(common + ["--do_eval"])
  assert result.stderr.strip().splitlines() == [
      f"error: {out / 'task.json'}: classifier_pooling 'average' is not one of pooler, mean, "
      "cls, max"]
  with pytest.raises(fileio.InputError, match=r"task.json: classifier_pooling 'average' is not"):
    export_model.export("classifier", str(tmp_path / "export2"), init_checkpoint=str(out),
                        max_seq_length=32)
  assert not (tmp_path / "export2").exists()


@requires_shared
def test_a_sentence_transformers_checkpoint_is_read_by_its_own_pooling(tmp_path):
  """The README's MRPC command on MiniLM (a sentence-transformers folder, its [CLS] pooler never
  trained) read the pooler and learnt nothing: always "paraphrase" (issue #73). Without the flag
  the classifier now reads the pooling the folder names (mean), says so, and keeps it in
  task.json; --classifier_pooling=pooler given keeps the pooler."""
  from conftest import minilm_dir  # pylint: disable=g-import-not-at-top
  minilm = minilm_dir()
  data = tmp_path / "data"
  data.mkdir()
  for split, rows in (("train", 17), ("dev", 9)):
    with open(os.path.join(GLUE, "MRPC", f"{split}.tsv"), "rb") as f:
      (data / f"{split}.tsv").write_bytes(b"".join(f.readline() for _ in range(rows)))
  for pooling in (None, "pooler"):
    out = tmp_path / f"out_{pooling}"
    result = run_ok(["run_classifier.py", "--task_name=MRPC", f"--data_dir={data}",
                     f"--vocab_file={minilm}/vocab.txt", f"--init_checkpoint={minilm}",
                     f"--output_dir={out}", "--do_train", "--max_seq_length=32",
                     "--train_batch_size=8", "--num_train_epochs=1",
                     *([f"--classifier_pooling={pooling}"] if pooling else [])])
    record = fine_tuning.task_record(str(out), None, False)
    if pooling is None:
      assert record["classifier_pooling"] == "mean"
      assert "is a sentence-transformers model, trained on the mean of its token vectors" \
          in result.stderr, result.stderr[-2000:]
    else:
      assert record["classifier_pooling"] == "pooler"
      assert "sentence-transformers model" not in result.stderr
