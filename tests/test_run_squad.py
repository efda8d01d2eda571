"""run_squad.py on the real SQuAD dev files: reading, windows, spans, predictions, and a short
fine-tune of a real checkpoint that answers held-out questions far better than chance."""

import collections
import json
import logging
import os
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import (LONG_TRAINING, SHARED, VOCAB, import_script, minilm_dir, requires_shared,
                      run_ok, run_script)

from bert_tf2 import fileio
from bert_tf2 import fine_tuning
from bert_tf2 import metrics
from bert_tf2 import sliding_windows
from bert_tf2 import tfrecord_io
from bert_tf2 import tokenization


run_squad = import_script("run_squad")

SQUAD = os.path.join(SHARED, "data", "squad")
V1_DEV = os.path.join(SQUAD, "dev-v1.1.json")
V2_DEV = os.path.join(SQUAD, "dev-v2.0.Normans_subset.json")


@pytest.fixture(scope="module")
def v1_training_data(tokenizer):
  """The whole v1.1 dev set read as training data (first answer) and its 384/128 features."""
  skipped = []
  examples = run_squad.read_squad_examples(V1_DEV, is_training=True, skipped=skipped)
  features = []
  start = time.time()
  run_squad.convert_examples_to_features(examples, tokenizer, max_seq_length=384, doc_stride=128,
                                         max_query_length=64, is_training=True,
                                         output_fn=features.append)
  seconds = time.time() - start
  return examples, features, skipped, seconds


@requires_shared
def test_reads_whole_v1_dev(v1_training_data):
  examples, features, skipped, seconds = v1_training_data
  assert len(examples) == 10570 and skipped == []
  assert len(run_squad.read_squad_examples(V1_DEV, is_training=False)) == 10570
  # Whole dev set, 384 tokens with stride 128: one or more windows per question.
  assert len(features) == 10833
  assert seconds < 60
  assert [f.unique_id for f in features[:3]] == [1000000000, 1000000001, 1000000002]
  first = examples[0]
  assert first.qas_id == "56be4db0acb8001400a502ec"
  assert first.orig_answer_text == "Denver Broncos"
  assert " ".join(first.doc_tokens[first.start_position:first.end_position + 1]) == "Denver Broncos"


@requires_shared
def test_answer_spans_recovered_from_features(v1_training_data):
  """For 99.5% or more of dev questions (measured: 10533 of 10570, 99.65%), the answer tokens at
  the feature's start/end positions turn back into the annotated answer (modulo the official
  normalization) through the same de-tokenization as write_predictions. The rest are answers
  annotated inside a word that WordPiece keeps whole ("gold" in "golden", "8" in "20–18")."""
  examples, features, _, _ = v1_training_data
  by_example = collections.defaultdict(list)
  for feature in features:
    by_example[feature.example_index].append(feature)
  recovered = 0
  for index, example in enumerate(examples):
    containing = [f for f in by_example[index] if f.start_position > 0]
    assert containing, example.qas_id  # every answer fits in some window
    feature = containing[0]
    assert feature.tokens[0] == "[CLS]" and feature.segment_ids[feature.start_position] == 1
    assert feature.start_position <= feature.end_position
    text = run_squad.span_text(example, feature, feature.start_position, feature.end_position,
                               do_lower_case=True)
    if metrics.normalize_answer(text) == metrics.normalize_answer(
        example.orig_answer_text):
      recovered += 1
  assert recovered / len(examples) >= 0.995
  assert recovered == 10533


def _ideal_results(features):
  """RawResults whose logits put the model's mass on each window's labelled start and end."""
  results = []
  for feature in features:
    start_logits, end_logits = np.zeros(384, np.float32), np.zeros(384, np.float32)
    start_logits[feature.start_position] += 10.0
    end_logits[feature.end_position] += 10.0
    results.append(run_squad.RawResult(feature.unique_id, start_logits, end_logits))
  return results


@requires_shared
def test_write_predictions_from_ideal_logits(v1_training_data, tmp_path):
  """Logits that put the model's mass on the labelled start/end give back the gold answers."""
  examples, features, _, _ = v1_training_data
  examples = examples[:1000]
  features = [f for f in features if f.example_index < 1000]
  results = _ideal_results(features)
  prediction_file = str(tmp_path / "predictions.json")
  nbest_file = str(tmp_path / "nbest_predictions.json")
  predictions, nbest, _ = run_squad.write_predictions(
      examples, features, results, n_best_size=20, max_answer_length=30, do_lower_case=True,
      output_prediction_file=prediction_file, output_nbest_file=nbest_file,
      output_null_log_odds_file=None)
  with open(prediction_file, encoding="utf-8") as f:
    assert json.load(f) == predictions
  assert len(predictions) == 1000
  assert predictions["56be4db0acb8001400a502ec"] == "Denver Broncos"
  first = nbest["56be4db0acb8001400a502ec"]
  assert first[0]["text"] == "Denver Broncos" and len(first) <= 20
  assert sum(entry["probability"] for entry in first) == pytest.approx(1.0)

  with open(V1_DEV, encoding="utf-8") as f:
    dataset = json.load(f)["data"]
  ids = set(predictions)
  for article in dataset:
    for paragraph in article["paragraphs"]:
      paragraph["qas"] = [qa for qa in paragraph["qas"] if qa["id"] in ids]
  scores = metrics.evaluate_v1(dataset, predictions)
  # The 16 misses of these 1000 are all answers annotated inside a WordPiece-whole word ("8" in
  # "20–18"), which no span prediction can produce; the Super Bowl articles have many scores.
  assert scores["exact_match"] == pytest.approx(98.4)
  assert scores["f1"] >= scores["exact_match"]

  # Each prediction is the text of the labelled span, taken from a window where its first token
  # has maximum context.
  for example_index, example in enumerate(examples):
    feature = next(f for f in features if f.example_index == example_index and
                   f.start_position > 0 and f.token_is_max_context[f.start_position])
    assert predictions[example.qas_id] == run_squad.span_text(
        example, feature, feature.start_position, feature.end_position, True)


@requires_shared
def test_v2_subset_no_answer_examples_and_null_predictions(tokenizer, tmp_path):
  examples = run_squad.read_squad_examples(V2_DEV, is_training=True, version_2_with_negative=True)
  assert len(examples) == 208
  impossible = [e for e in examples if e.is_impossible]
  assert len(impossible) == 112
  assert all((e.start_position, e.end_position, e.orig_answer_text) == (-1, -1, "")
             for e in impossible)
  features = []
  run_squad.convert_examples_to_features(examples, tokenizer, 384, 128, 64, True, features.append)
  for feature in features:
    if feature.is_impossible:
      assert (feature.start_position, feature.end_position) == (0, 0)

  writer_file = str(tmp_path / "train.tf_record")
  assert tfrecord_io.write_examples(writer_file, (run_squad.squad_record(f, True)
                                               for f in features)) == len(features)
  input_fn = fine_tuning.input_fn_builder(writer_file, run_squad.feature_spec(384, False), False,
                                          drop_remainder=False)
  # Training records also hold the positions (read here through a training-mode pipeline).
  train_fn = fine_tuning.input_fn_builder(writer_file, run_squad.feature_spec(384, True), True)
  batch = next(iter(train_fn(batch_size=8)))
  assert set(batch) == {"unique_ids", "input_ids", "input_mask", "segment_ids",
                        "start_positions", "end_positions", "is_impossible"}
  first = next(iter(input_fn(batch_size=len(features))))
  np.testing.assert_array_equal(first["unique_ids"].numpy(), [f.unique_id for f in features])
  np.testing.assert_array_equal(first["input_ids"].numpy()[5], features[5].input_ids)

  # Logits shaped like the training targets: [CLS] for no answer, the span otherwise.
  results = _ideal_results(features)
  odds_file = str(tmp_path / "null_odds.json")
  predictions, _, score_diffs = run_squad.write_predictions(
      examples, features, results, 20, 30, True, str(tmp_path / "predictions.json"),
      str(tmp_path / "nbest.json"), odds_file, version_2_with_negative=True,
      null_score_diff_threshold=0.0)
  assert all(predictions[e.qas_id] == "" for e in impossible)
  assert all(score_diffs[e.qas_id] == pytest.approx(20.0) for e in impossible)
  with open(odds_file, encoding="utf-8") as f:
    assert json.load(f) == pytest.approx(score_diffs)
  with open(V2_DEV, encoding="utf-8") as f:
    dataset = json.load(f)["data"]
  scores = metrics.evaluate_v2(dataset, predictions, na_probs=score_diffs)
  assert (scores["NoAns_exact"], scores["NoAns_total"]) == (100.0, 112)
  assert scores["HasAns_exact"] == 100.0 and scores["best_exact"] == 100.0


@requires_shared
def test_v2_data_needs_the_flag_for_training():
  # Training or predicting, without the flag its unanswerable questions would be mishandled
  # (trained on no span, scored as SQuAD 1.1): the error names the file, line and question.
  for is_training in (True, False):
    with pytest.raises(fileio.InputError, match=rf"^{V2_DEV}:\d+: question \w+ is marked "
                       "is_impossible, a SQuAD 2.0 question: pass --version_2_with_negative$"):
      run_squad.read_squad_examples(V2_DEV, is_training=is_training)
  assert len(run_squad.read_squad_examples(V2_DEV, is_training=False,
                                           version_2_with_negative=True)) == 208


@requires_shared
def test_sliding_windows_and_max_context(tokenizer):
  examples = run_squad.read_squad_examples(V1_DEV, is_training=False)
  longest = max(examples[:2000], key=lambda e: len(e.doc_tokens))
  features = []
  run_squad.convert_examples_to_features([longest], tokenizer, max_seq_length=128, doc_stride=32,
                                         max_query_length=16, is_training=False,
                                         output_fn=features.append)
  query_length = len(tokenizer.tokenize(longest.question_text)[:16])
  doc_tokens = [t for word in longest.doc_tokens for t in tokenizer.tokenize(word)]
  max_tokens_for_doc = 128 - query_length - 3
  assert len(features) == 1 + -(-(len(doc_tokens) - max_tokens_for_doc) // 32)
  # The question (tokenized through the batch path) is the reference path's tokens in every window.
  question = ["[CLS]"] + tokenizer.tokenize(longest.question_text)[:16] + ["[SEP]"]
  assert all(f.tokens[:query_length + 2] == question for f in features)
  max_context_count = collections.Counter()
  for index, feature in enumerate(features):
    doc_positions = sorted(feature.token_to_orig_map)
    assert doc_positions[0] == query_length + 2
    assert len(doc_positions) == min(max_tokens_for_doc, len(doc_tokens) - 32 * index)
    window = [feature.tokens[p] for p in doc_positions]
    assert window == doc_tokens[32 * index:32 * index + len(window)]
    for offset, position in enumerate(doc_positions):
      if feature.token_is_max_context[position]:
        max_context_count[32 * index + offset] += 1
  # Every document token is scored in exactly one window.
  assert sorted(max_context_count) == list(range(len(doc_tokens)))
  assert set(max_context_count.values()) == {1}


def test_original_helpers_hand_checked(tokenizer):
  # Spans A (0-4), B (3-7), C (6-10): token 7 has 4 left / 0 right context in B but 1 / 3 in C.
  spans = [sliding_windows.Span(0, 5), sliding_windows.Span(3, 5), sliding_windows.Span(6, 5)]
  assert sliding_windows.max_context(spans, 7) == 2
  assert sliding_windows.max_context(spans, 11) is None
  assert sliding_windows.spans(11, 5, 3) == spans
  # "(1895-1943)." is one whitespace word; WordPiece splits it so the answer "1895" is exact.
  doc = tokenizer.tokenize("(1895-1943).")
  assert doc == ["(", "1895", "-", "1943", ")", "."]
  assert run_squad._improve_answer_span(doc, 0, 5, tokenizer, "1895") == (1, 1)
  assert run_squad.get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
  assert run_squad.get_final_text("unrelated", "Steve Smith's", True) == "Steve Smith's"
  probs = run_squad._compute_softmax([1.0, 2.0, 3.0])
  assert sum(probs) == pytest.approx(1.0) and probs[2] > probs[1] > probs[0]
  assert run_squad._get_best_indexes([0.1, 3.0, 2.0, 3.0], 3) == [1, 3, 2]


def _squad_file(path, qas, context="The Normans were in Normandy in the 10th century."):
  data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context,
                                                                    "qas": qas}]}]}
  path.write_text(json.dumps(data, indent=1), encoding="utf-8")
  return str(path)


def test_bad_answer_offsets_are_skipped_and_reported(tmp_path, caplog):
  qas = [
      {"id": "good", "question": "Who?", "answers": [{"text": "Normans", "answer_start": 4}]},
      {"id": "shifted", "question": "Where?", "answers": [{"text": "Normandy", "answer_start": 3}]},
      {"id": "beyond", "question": "When?", "answers": [{"text": "10th", "answer_start": 400}]},
  ]
  path = _squad_file(tmp_path / "train.json", qas)
  skipped = []
  with caplog.at_level(logging.WARNING):
    examples = run_squad.read_squad_examples(path, is_training=True, skipped=skipped)
  assert [e.qas_id for e in examples] == ["good"] and skipped == ["shifted", "beyond"]
  lines = path_lines = open(path, encoding="utf-8").read().splitlines()
  shifted_line = next(i for i, line in enumerate(path_lines, 1) if '"shifted"' in line)
  assert f"{path}:{shifted_line}: question shifted" in caplog.text
  assert "skipped 2 questions" in caplog.text and lines
  # Not training: nothing is skipped.
  assert len(run_squad.read_squad_examples(path, is_training=False)) == 3


def test_malformed_squad_files(tmp_path):
  broken = tmp_path / "broken.json"
  broken.write_text('{"data": [\n {"paragraphs": ]}', encoding="utf-8")
  with pytest.raises(fileio.InputError, match=f"{broken}:2: not valid JSON"):
    run_squad.read_squad_examples(str(broken), is_training=False)
  no_context = tmp_path / "no_context.json"
  no_context.write_text(json.dumps({"data": [{"paragraphs": [{"qas": []}]}]}), encoding="utf-8")
  with pytest.raises(fileio.InputError, match=r"data\[0\]\.paragraphs\[0\]: missing or invalid "
                     r"\"context\""):
    run_squad.read_squad_examples(str(no_context), is_training=False)
  path = _squad_file(tmp_path / "no_answer.json", [{"id": "q", "question": "?", "answers": []}])
  with pytest.raises(fileio.InputError, match="question q has no answer to train on"):
    run_squad.read_squad_examples(path, is_training=True)
  with pytest.raises(fileio.InputError, match="must be greater than max_query_length"):
    run_squad.convert_examples_to_features([], None, 64, 128, 64, False, print)


def test_example_writer_leaves_no_partial_file(tmp_path):
  output = tmp_path / "eval.tf_record"
  with pytest.raises(RuntimeError):
    with tfrecord_io.ExampleWriter(str(output)) as writer:
      writer.write(run_squad.squad_record(
          run_squad.InputFeatures(1, 0, 0, [], {}, {}, [1, 2], [1, 1], [0, 0]), False))
      raise RuntimeError("interrupted")
  assert not list(tmp_path.iterdir())
  with tfrecord_io.ExampleWriter(str(output)) as writer:
    writer.write(run_squad.squad_record(
        run_squad.InputFeatures(7, 0, 0, [], {}, {}, [1, 2], [1, 1], [0, 0]), False))
  record = next(iter(tf.data.TFRecordDataset(str(output))))
  parsed = tf.train.Example.FromString(record.numpy()).features.feature
  assert sorted(parsed) == ["input_ids", "input_mask", "segment_ids", "unique_ids"]
  assert list(parsed["unique_ids"].int64_list.value) == [7]


def _eval_results(path):
  with open(path, encoding="utf-8") as f:
    return {k: float(v) for k, v in (line.split(" = ") for line in f.read().splitlines())}


def _short_paragraphs(articles, tokenizer, per_paragraph, max_tokens):
  """The paragraphs of `articles` whose context has at most `max_tokens` WordPiece tokens, with
  their first `per_paragraph` questions, as SQuAD "data"."""
  data = []
  for article in articles:
    paragraphs = [{"context": p["context"], "qas": p["qas"][:per_paragraph]}
                  for p in article["paragraphs"]
                  if len(tokenizer.tokenize(p["context"])) <= max_tokens]
    if paragraphs:
      data.append({"title": article["title"], "paragraphs": paragraphs})
  return data


def _leading_words_baseline(data):
  """Best EM and F1 of answering every question with the first k words of its context, k = 1 to
  20: what a model that learned nothing about the question could get from position alone."""
  best_exact, best_f1 = 0.0, 0.0
  for k in range(1, 21):
    predictions = {qa["id"]: " ".join(p["context"].split()[:k])
                   for article in data for p in article["paragraphs"] for qa in p["qas"]}
    scores = metrics.evaluate_v1(data, predictions)
    best_exact = max(best_exact, scores["exact_match"])
    best_f1 = max(best_f1, scores["f1"])
  return best_exact, best_f1


TINY_CONFIG = ('{"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, '
               '"num_attention_heads": 2, "intermediate_size": 64, '
               '"max_position_embeddings": 128, "type_vocab_size": 2}')


@requires_shared
def test_v2_predict_writes_null_odds_and_scores(tmp_path):
  """Prediction alone on SQuAD 2.0 data (a small random model: the plumbing, not the quality):
  every question gets an answer or "" and a null score difference, and the official v2.0 scores
  with the best-threshold sweep land in eval_results.txt. 54 windows do not fill batches of 8:
  the two padding windows must not produce answers."""
  config = tmp_path / "bert_config.json"
  config.write_text(TINY_CONFIG, encoding="utf-8")
  # Predicting needs weights to predict with, the span head's included: a randomly initialised
  # model's, saved first.
  from bert_tf2 import checkpoints  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  encoder = tmp_path / "random" / "bert_model.ckpt"
  checkpoints.export_tf1_checkpoint(
      modeling.BertSpanLabeler(modeling.BertConfig.from_json_file(str(config))), str(encoder))
  with open(V2_DEV, encoding="utf-8") as f:
    dataset = json.load(f)
  dataset["data"][0]["paragraphs"] = dataset["data"][0]["paragraphs"][:3]
  predict_file = tmp_path / "dev.json"
  predict_file.write_text(json.dumps(dataset), encoding="utf-8")
  questions = [qa["id"] for p in dataset["data"][0]["paragraphs"] for qa in p["qas"]]
  output_dir = tmp_path / "out"
  result = run_ok(["run_squad.py", f"--bert_config_file={config}", f"--vocab_file={VOCAB}",
                       f"--output_dir={output_dir}", f"--predict_file={predict_file}",
                       f"--init_checkpoint={encoder}", "--do_predict",
                       "--version_2_with_negative", "--max_seq_length=128",
                       "--max_query_length=32", "--doc_stride=64", "--predict_batch_size=8"])
  assert "Predicting 21 questions (54 windows)" in result.stderr
  with open(output_dir / "predictions.json", encoding="utf-8") as f:
    predictions = json.load(f)
  with open(output_dir / "null_odds.json", encoding="utf-8") as f:
    null_odds = json.load(f)
  with open(output_dir / "nbest_predictions.json", encoding="utf-8") as f:
    nbest = json.load(f)
  assert list(predictions) == questions and list(null_odds) == questions
  for qid in questions:
    # No-answer is always a candidate, added after the 20 best when it is not among them.
    assert any(entry["text"] == "" for entry in nbest[qid]) and len(nbest[qid]) <= 21
    assert sum(entry["probability"] for entry in nbest[qid]) == pytest.approx(1.0)
    assert (predictions[qid] == "") == (null_odds[qid] > 0.0)
  scores = _eval_results(output_dir / "eval_results.txt")
  expected = metrics.evaluate_v2(dataset["data"], predictions, na_probs=null_odds)
  for key in ("exact", "f1", "HasAns_f1", "NoAns_exact", "best_f1", "best_f1_thresh"):
    assert scores[key] == pytest.approx(expected[key])
  assert scores["total"] == len(questions) and scores["global_step"] == 0


def test_flag_errors(tmp_path):
  def error(*args):
    result = run_script(["run_squad.py", *args], timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    return result.stderr.strip().splitlines()[-1]

  config = tmp_path / "bert_config.json"
  config.write_text(TINY_CONFIG, encoding="utf-8")
  common = [f"--bert_config_file={config}", "--vocab_file=vocab.txt", f"--output_dir={tmp_path}"]
  assert error(*common, "--do_train") == "error: --do_train needs --train_file"
  assert error(*common, "--do_train", "--train_file=x.json", "--max_seq_length=256") == (
      f"error: --max_seq_length=256 is above max_position_embeddings=128 of {config}")
  predict_file = _squad_file(tmp_path / "dev.json", [{"id": "q1", "question": "Who?",
                                                       "answers": []}])
  common[1] = f"--vocab_file={VOCAB}"
  assert error(*common, "--do_predict", f"--predict_file={predict_file}",
               "--max_seq_length=128", "--doc_stride=32") == (
      f"error: nothing to evaluate: --output_dir={tmp_path} holds no checkpoint and no "
      "--init_checkpoint was given; train first (--do_train) or give --init_checkpoint")


@requires_shared
def test_fine_tune_minilm_answers_held_out_questions(tmp_path):
  """A short SQuAD v1.1 fine-tune of the packaged MiniLM (6 layers, uncased) on dev questions
  of the first 24 articles, evaluated on questions of the other 24 (different topics).

  Only paragraphs of at most 110 WordPiece tokens are used, two questions each (586 to train,
  206 to evaluate), so nearly every question fits one 128-token window; four epochs (146 steps
  of 16) take about 300 CPU-seconds. Chance, on the same questions: answering with the first k
  words of the context (best k from 1 to 20) scores at most EM 2.9 / F1 16.6, a random 3-word
  span about EM 0.5 / F1 5. Measured: EM 33.0 / F1 43.4 with the default seed; with --seed=2,
  the weakest seed tried, EM 21.8 / F1 35.0. The bar, EM 15 and F1 28, is five times the
  positional EM and 1.7 times its F1, with room for run-to-run variation across machines.
  """
  model_dir = minilm_dir()
  tokenizer = tokenization.FullTokenizer(os.path.join(model_dir, "vocab.txt"), True)
  with open(V1_DEV, encoding="utf-8") as f:
    articles = json.load(f)["data"]
  train = _short_paragraphs(articles[:24], tokenizer, per_paragraph=2, max_tokens=110)
  held_out = _short_paragraphs(articles[24:], tokenizer, per_paragraph=2, max_tokens=110)
  count = lambda data: sum(len(p["qas"]) for a in data for p in a["paragraphs"])
  assert (count(train), count(held_out)) == (586, 206)
  baseline_exact, baseline_f1 = _leading_words_baseline(held_out)
  assert baseline_exact < 3.0 and baseline_f1 < 17.0
  train_file, predict_file = tmp_path / "train.json", tmp_path / "dev.json"
  train_file.write_text(json.dumps({"version": "1.1", "data": train}), encoding="utf-8")
  predict_file.write_text(json.dumps({"version": "1.1", "data": held_out}), encoding="utf-8")

  output_dir = tmp_path / "out"
  run_ok(["run_squad.py", f"--init_checkpoint={model_dir}", f"--vocab_file={model_dir}/vocab.txt",
              f"--output_dir={output_dir}", f"--train_file={train_file}",
              f"--predict_file={predict_file}", "--do_train", "--do_predict",
              "--max_seq_length=128", "--doc_stride=64", "--max_query_length=32",
              "--train_batch_size=16", "--learning_rate=5e-5", "--num_train_epochs=4",
              # The figures above are the original optimizer's; the bias-corrected default
              # takes smaller first steps and reaches F1 27 in these 4 short epochs.
              "--optimizer=adam_weight_decay",
              "--predict_batch_size=32", "--iterations_per_loop=25"], timeout=LONG_TRAINING)
  scores = _eval_results(output_dir / "eval_results.txt")
  with open(output_dir / "predictions.json", encoding="utf-8") as f:
    predictions = json.load(f)
  assert len(predictions) == 206
  expected = metrics.evaluate_v1(held_out, predictions)
  assert scores["exact_match"] == pytest.approx(expected["exact_match"])
  assert scores["f1"] == pytest.approx(expected["f1"])
  assert scores["global_step"] == 146  # int(586 questions / 16 * 4 epochs)
  assert scores["exact_match"] >= 15.0, scores
  assert scores["f1"] >= 28.0, scores

  # Prediction cut each batch after its longest window (the default, sorted by length); at full
  # length, in input order, the answers and n-best lists are the same.
  full_dir = tmp_path / "full_length"
  run_ok(["run_squad.py", f"--init_checkpoint={output_dir}/ckpt-146",
              f"--bert_config_file={model_dir}/config.json", f"--vocab_file={model_dir}/vocab.txt",
              f"--output_dir={full_dir}", f"--predict_file={predict_file}", "--do_predict",
              "--max_seq_length=128", "--doc_stride=64", "--max_query_length=32",
              "--predict_batch_size=32", "--nodynamic_padding"])
  with open(full_dir / "predictions.json", encoding="utf-8") as f:
    assert json.load(f) == predictions
  nbest = {}
  for name in (output_dir, full_dir):
    with open(name / "nbest_predictions.json", encoding="utf-8") as f:
      nbest[name] = json.load(f)
  for qid, candidates in nbest[output_dir].items():
    assert [c["text"] for c in candidates] == [c["text"] for c in nbest[full_dir][qid]]
    assert [c["probability"] for c in candidates] == pytest.approx(
        [c["probability"] for c in nbest[full_dir][qid]], abs=1e-4)
