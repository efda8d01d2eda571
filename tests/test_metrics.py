"""metrics.py against hand-computed values and independent formulas, on real GLUE and CoNLL data."""

import os

import numpy as np
import pytest

from conftest import SHARED, requires_shared

from bert_tf2 import metrics

GLUE = os.path.join(SHARED, "data", "glue")
CONLL = os.path.join(SHARED, "data", "conll2003")


def _column(path, index, skip_header):
  with open(path, encoding="utf-8-sig") as f:
    lines = f.read().splitlines()
  return [line.split("\t")[index] for line in lines[1 if skip_header else 0:] if line]


def test_accuracy_and_f1_hand_computed():
  labels = [1, 1, 0, 0, 1, 0, 1, 1]
  preds = [1, 0, 0, 1, 1, 0, 1, 0]
  # tp = 3 (positions 0, 4, 6), fp = 1 (3), fn = 2 (1, 7), tn = 2.
  assert metrics.accuracy(labels, preds) == pytest.approx(5 / 8)
  assert metrics.f1_binary(labels, preds) == pytest.approx(2 * 3 / (2 * 3 + 1 + 2))
  assert metrics.f1_binary([0, 0], [0, 0]) == 0.0  # no positive at all: F1 undefined -> 0


def test_matthews_hand_computed_and_degenerate():
  labels = [1, 1, 1, 1, 0, 0, 0, 1, 0, 1]
  preds = [1, 1, 0, 1, 0, 1, 0, 1, 0, 0]
  # tp = 4, tn = 3, fp = 1, fn = 2.
  expected = (4 * 3 - 1 * 2) / np.sqrt((4 + 1) * (4 + 2) * (3 + 1) * (3 + 2))
  assert metrics.matthews_corrcoef(labels, preds) == pytest.approx(expected)
  assert metrics.matthews_corrcoef([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0
  assert metrics.matthews_corrcoef(labels, labels) == pytest.approx(1.0)
  assert metrics.matthews_corrcoef(labels, [1 - x for x in labels]) == pytest.approx(-1.0)


@requires_shared
def test_matthews_on_real_cola_labels():
  labels = np.array([int(x) for x in _column(os.path.join(GLUE, "CoLA", "dev.tsv"), 1, False)])
  assert labels.size == 1043
  rng = np.random.default_rng(0)
  preds = np.where(rng.random(labels.size) < 0.2, 1 - labels, labels)
  tp = np.sum((preds == 1) & (labels == 1))
  tn = np.sum((preds == 0) & (labels == 0))
  fp = np.sum((preds == 1) & (labels == 0))
  fn = np.sum((preds == 0) & (labels == 1))
  expected = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
  assert metrics.matthews_corrcoef(labels, preds) == pytest.approx(expected, abs=1e-12)
  # The GLUE entry for CoLA is exactly this one metric.
  assert list(metrics.glue_metrics("CoLA", labels, preds)) == ["mcc"]


def test_spearman_hand_computed_with_ties():
  # Ranks of x with the tie averaged: [1, 2.5, 2.5, 4]; y: [1, 3, 2, 4]; deviations from 2.5:
  # dx = [-1.5, 0, 0, 1.5], dy = [-1.5, .5, -.5, 1.5]: sum dx*dy = 4.5, sum dx^2 = 4.5,
  # sum dy^2 = 5.
  assert metrics.rank_average_ties([10, 20, 20, 30]).tolist() == [1, 2.5, 2.5, 4]
  assert metrics.spearman([10, 20, 20, 30], [1, 3, 2, 4]) == pytest.approx(4.5 / np.sqrt(4.5 * 5))
  assert metrics.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)


def _average_ranks_slow(values):
  # Independent definition: rank = (#smaller) + (#equal + 1) / 2.
  values = list(values)
  return np.array([sum(v < x for v in values) + (sum(v == x for v in values) + 1) / 2
                   for x in values])


@requires_shared
def test_pearson_spearman_on_real_stsb_scores():
  scores = np.array([float(x) for x in _column(os.path.join(GLUE, "STS-B", "dev.tsv"), 9, True)])
  assert scores.size == 1500
  assert len(np.unique(scores)) < scores.size  # real ties, so the average rank rule matters
  rng = np.random.default_rng(1)
  preds = np.clip(scores + rng.normal(0, 1.0, scores.size), 0, 5).round(1)  # rounding adds ties
  assert metrics.pearson(scores, preds) == pytest.approx(np.corrcoef(scores, preds)[0, 1],
                                                         abs=1e-12)
  subset = slice(0, 400)  # the O(n^2) reference ranks stay fast on a slice
  expected = np.corrcoef(_average_ranks_slow(scores[subset]),
                         _average_ranks_slow(preds[subset]))[0, 1]
  assert metrics.spearman(scores[subset], preds[subset]) == pytest.approx(expected, abs=1e-12)
  np.testing.assert_array_equal(metrics.rank_average_ties(scores[subset]),
                                _average_ranks_slow(scores[subset]))
  result = metrics.glue_metrics("sts-b", scores, preds)
  assert list(result) == ["pearson", "spearman"]
  assert 0.7 < result["spearman"] < 1.0


def test_glue_metric_sets():
  labels, preds = [0, 1, 1, 0], [0, 1, 0, 0]
  assert list(metrics.glue_metrics("MRPC", labels, preds)) == ["f1", "accuracy"]
  assert list(metrics.glue_metrics("qqp", labels, preds)) == ["f1", "accuracy"]
  for task in ("sst-2", "mnli", "mnli-mm", "qnli", "rte", "wnli", "xnli"):
    assert list(metrics.glue_metrics(task, labels, preds)) == ["accuracy"]
  assert metrics.glue_metrics("mrpc", labels, preds)["f1"] == pytest.approx(2 / 3)
  assert list(metrics.glue_metrics("STS_B", [1.0, 2.0, 3.0], [1, 2, 4])) == ["pearson", "spearman"]
  assert list(metrics.glue_metrics("CoLA", labels, preds)) == ["mcc"]
  # Tasks outside GLUE: accuracy for classes, correlations for real-valued predictions.
  assert list(metrics.glue_metrics("tsv", labels, preds)) == ["accuracy"]
  assert list(metrics.glue_metrics("csv", [0.5, 1.0, 2.0], [0.4, 1.2, 1.9])) == [
      "pearson", "spearman"]


def test_conlleval_hand_computed():
  gold = [["B-PER", "I-PER", "O", "B-LOC"]]
  result = metrics.conll_evaluate(gold, [["B-PER", "I-PER", "O", "B-ORG"]])
  assert (result["precision"], result["recall"], result["f1"]) == (0.5, 0.5, 0.5)
  assert result["accuracy"] == 0.75
  # A chunk cut short is wrong: only LOC is correct, but two chunks were still found.
  result = metrics.conll_evaluate(gold, [["B-PER", "O", "O", "B-LOC"]])
  assert result["counts"].found_guessed == 2 and result["counts"].correct_chunks == 1
  # IOB1: an I- tag after O starts a chunk, so this prediction is fully correct.
  result = metrics.conll_evaluate(gold, [["I-PER", "I-PER", "O", "I-LOC"]])
  assert result["f1"] == 1.0
  # An I- of another type starts a new chunk: two predicted chunks, neither correct.
  result = metrics.conll_evaluate(gold, [["B-PER", "I-LOC", "O", "O"]])
  assert result["counts"].found_guessed == 2 and result["counts"].correct_chunks == 0
  # Chunks never run across sentence boundaries.
  result = metrics.conll_evaluate([["B-PER"], ["I-PER"]], [["B-PER"], ["I-PER"]])
  assert result["counts"].found_correct == 2 and result["f1"] == 1.0
  # Per type: PER right, LOC predicted as ORG.
  result = metrics.conll_evaluate(gold, [["B-PER", "I-PER", "O", "B-ORG"]])
  assert result["per_type"]["PER"]["f1"] == 1.0
  assert result["per_type"]["LOC"]["recall"] == 0.0
  assert result["per_type"]["ORG"]["precision"] == 0.0


def _conll_sentences(path):
  sentences, current = [], []
  with open(path, encoding="utf-8") as f:
    for line in f:
      fields = line.split()
      if not fields or fields[0] == "-DOCSTART-":
        if current:
          sentences.append(current)
        current = []
      else:
        current.append(fields[-1])
  if current:
    sentences.append(current)
  return sentences


@requires_shared
def test_conlleval_on_real_conll_dev():
  gold = _conll_sentences(os.path.join(CONLL, "valid.txt"))
  assert len(gold) == 3250
  # Independent chunk count for BIO: a chunk starts at every B- and at an I- whose predecessor
  # is O or of another type.
  starts = 0
  for tags in gold:
    previous = "O"
    for tag in tags:
      if tag.startswith("B-") or (tag.startswith("I-") and previous[2:] != tag[2:]):
        starts += 1
      previous = tag
  assert starts == 5942  # the CoNLL-2003 dev set's entity count
  perfect = metrics.conll_evaluate(gold, gold)
  assert perfect["f1"] == 1.0 and perfect["counts"].found_correct == 5942
  assert perfect["counts"].tokens == sum(len(t) for t in gold) == 51362

  # Damage known chunks and count the effect by hand.
  predicted = [list(tags) for tags in gold]
  retyped = dropped = 0
  for tags in predicted:
    for i, tag in enumerate(tags):
      if tag == "B-LOC" and (i + 1 == len(tags) or not tags[i + 1].startswith("I-")):
        if retyped < 100:  # a one-token LOC becomes ORG: one chunk wrong, counts unchanged
          tags[i] = "B-ORG"
          retyped += 1
      elif tag == "B-PER" and (i + 1 == len(tags) or not tags[i + 1].startswith("I-")):
        if dropped < 50:  # a one-token PER disappears: one chunk fewer found
          tags[i] = "O"
          dropped += 1
  assert (retyped, dropped) == (100, 50)
  result = metrics.conll_evaluate(gold, predicted)
  correct = 5942 - 150
  assert result["counts"].correct_chunks == correct
  assert result["counts"].found_guessed == 5942 - 50
  assert result["precision"] == pytest.approx(correct / (5942 - 50))
  assert result["recall"] == pytest.approx(correct / 5942)
  assert result["accuracy"] == pytest.approx((51362 - 150) / 51362)
  assert result["per_type"]["LOC"]["recall"] == pytest.approx(
      (perfect["counts"].found_correct_by_type["LOC"] - 100)
      / perfect["counts"].found_correct_by_type["LOC"])

  # The same chunks written in IOB1 (B- only between adjacent chunks of one type) score 100%.
  iob1 = []
  for tags in gold:
    out, previous = [], "O"
    for tag in tags:
      out.append("I-" + tag[2:] if tag.startswith("B-") and previous[2:] != tag[2:] else tag)
      previous = tag
    iob1.append(out)
  assert metrics.conll_evaluate(gold, iob1)["f1"] == 1.0
  assert "phrases; found: 5942 phrases; correct: 5942." in metrics.conll_report(perfect)


def test_cross_entropy_is_the_mean_nll_of_the_gold_class():
  probabilities = np.array([[0.7, 0.2, 0.1], [0.25, 0.25, 0.5], [1.0, 0.0, 0.0]])
  labels = [0, 2, 1]  # the last row gives its gold class probability 0: counted as 1e-30
  expected = -(np.log(0.7) + np.log(0.5) + np.log(1e-30)) / 3
  assert metrics.cross_entropy(probabilities, labels) == pytest.approx(expected, rel=1e-12)
  assert metrics.cross_entropy(probabilities[:2], np.array([0.0, 2.0])) == pytest.approx(
      -(np.log(0.7) + np.log(0.5)) / 2, rel=1e-12)


def test_weighted_nll_sums_the_labelled_positions_only():
  logits = np.array([[[2.0, 0.0], [0.0, 0.0], [5.0, -5.0]]])
  labels = np.array([[0, 1, 1]])
  weights = np.array([[1.0, 1.0, 0.0]])  # the third position is padding
  total, count = metrics.weighted_nll(logits, labels, weights)
  assert count == 2.0
  np.testing.assert_allclose(total, np.log1p(np.exp(-2.0)) + np.log(2.0), rtol=1e-12)
  # Logits far apart stay finite (log-sum-exp, not a softmax then a log).
  assert np.isfinite(metrics.weighted_nll([[1000.0, -1000.0]], [1], [1.0])[0])


def test_multi_label_metrics_hand_computed():
  # 3 examples x 3 labels; threshold 0.5 (strictly above: 0.5 itself is not predicted).
  labels = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]])
  probabilities = np.array([[0.9, 0.2, 0.4], [0.6, 0.7, 0.1], [0.8, 0.5, 0.0]])
  # predicted: [1,0,0], [1,1,0], [1,0,0]
  summary, per_label = metrics.multi_label_metrics(labels, probabilities)
  # label 0: tp 2 fp 1 fn 0; label 1: tp 1 fp 0 fn 1; label 2: tp 0 fp 0 fn 1.
  assert [(p["precision"], p["recall"], p["support"], p["predicted"]) for p in per_label] == [
      (2 / 3, 1.0, 2, 3), (1.0, 0.5, 2, 1), (0.0, 0.0, 1, 0)]
  assert per_label[0]["f1"] == pytest.approx(0.8)
  assert per_label[1]["f1"] == pytest.approx(2 / 3) and per_label[2]["f1"] == 0.0
  assert summary["macro_f1"] == pytest.approx((0.8 + 2 / 3 + 0) / 3)
  assert summary["micro_f1"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 2))  # tp 3, fp 1, fn 2
  assert summary["micro_precision"] == pytest.approx(3 / 4)
  assert summary["micro_recall"] == pytest.approx(3 / 5)
  assert summary["exact_match"] == 0.0
  # Per-label thresholds: label 2 at 0.3 catches example 0 (all three rows right but row 1's).
  summary, per_label = metrics.multi_label_metrics(labels, probabilities, [0.85, 0.45, 0.3])
  assert summary["exact_match"] == pytest.approx(2 / 3)
  assert [p["threshold"] for p in per_label] == [0.85, 0.45, 0.3]
  with pytest.raises(ValueError, match="must be"):
    metrics.multi_label_metrics(labels[:, :2], probabilities)


def test_multi_label_metrics_equal_per_label_binary_f1_on_random_data():
  # Against the single-label f1_binary, label by label, and a direct count for micro F1.
  rng = np.random.default_rng(0)
  labels = (rng.random((500, 7)) < np.linspace(0.02, 0.5, 7)).astype(int)
  labels[:, 3] = 0  # a label with no true example: F1 0 (scikit-learn's zero_division=0)
  probabilities = np.clip(labels * 0.3 + rng.random((500, 7)) * 0.7, 0, 1)
  summary, per_label = metrics.multi_label_metrics(labels, probabilities, 0.6)
  predicted = (probabilities > 0.6).astype(int)
  for j in range(7):
    want = metrics.f1_binary(labels[:, j], predicted[:, j]) if labels[:, j].any() else 0.0
    assert per_label[j]["f1"] == pytest.approx(want), j
  assert summary["macro_f1"] == pytest.approx(np.mean([p["f1"] for p in per_label]))
  tp = int((labels & predicted).sum())
  assert summary["micro_f1"] == pytest.approx(2 * tp / (labels.sum() + predicted.sum()))
  assert summary["exact_match"] == pytest.approx(np.mean((labels == predicted).all(1)))
  # Binary cross-entropy: the mean over every decision.
  want = -np.mean(labels * np.log(probabilities.clip(1e-30))
                  + (1 - labels) * np.log((1 - probabilities).clip(1e-30)))
  assert metrics.binary_cross_entropy(probabilities, labels) == pytest.approx(want)


def test_tune_thresholds_maximises_each_labels_f1():
  rng = np.random.default_rng(1)
  labels = (rng.random((400, 5)) < 0.2).astype(int)
  labels[:, 4] = 0
  probabilities = np.clip(labels * rng.random((400, 5)) * 0.5 + rng.random((400, 5)) * 0.5, 0, 1)
  thresholds = metrics.tune_thresholds(labels, probabilities)
  assert thresholds[4] == 0.5  # no true example: the default
  grid = np.arange(1, 100) / 100
  for j in range(4):
    scores = [metrics.multi_label_metrics(labels[:, [j]], probabilities[:, [j]], t)[1][0]["f1"]
              for t in grid]
    best = max(scores)
    chosen = metrics.multi_label_metrics(labels[:, [j]], probabilities[:, [j]],
                                         thresholds[j])[1][0]["f1"]
    assert chosen == pytest.approx(best), j
    # Among thresholds of equal F1, the one nearest the default.
    ties = [t for t, s in zip(grid, scores) if s == pytest.approx(best)]
    assert abs(thresholds[j] - 0.5) == pytest.approx(min(abs(t - 0.5) for t in ties)), j
  tuned = metrics.multi_label_metrics(labels, probabilities, thresholds)[0]["macro_f1"]
  assert tuned >= metrics.multi_label_metrics(labels, probabilities)[0]["macro_f1"]


def test_tuned_thresholds_never_fire_every_label_nor_lose_to_the_default():
  """An untrained model (GoEmotions after 0.1 epoch) gives every label about its prior: each
  label's best F1 was then "always" (thresholds 0.07-0.13 that put all 28 labels on every
  example). Tuning now never picks a threshold that fires on every example, keeps the default
  where nothing beats it, and never lowers micro F1 below the default's."""
  rng = np.random.default_rng(4)
  priors = rng.uniform(0.02, 0.2, 28)
  labels = (rng.random((500, 28)) < priors).astype(int)
  probabilities = np.clip(priors + rng.normal(0, 0.005, (500, 28)), 0, 1)
  thresholds = metrics.tune_thresholds(labels, probabilities)
  fires = probabilities > thresholds
  assert not fires.all(axis=0).any(), "a label on every example"
  default = metrics.multi_label_metrics(labels, probabilities)[0]
  tuned = metrics.multi_label_metrics(labels, probabilities, thresholds)[0]
  assert tuned["micro_f1"] >= default["micro_f1"]
  # Noise around the prior carries no signal: nothing beats predicting no label at all.
  np.testing.assert_array_equal(thresholds, 0.5)
  # A useful model still gets its thresholds tuned (the test above), and a label every example
  # has may fire everywhere.
  labels[:, 0] = 1
  probabilities[:, 0] = 0.3
  assert metrics.tune_thresholds(labels, probabilities)[0] < 0.3


@requires_shared
def test_a_dev_score_at_the_floor_is_named():
  """Predictions no better than a model that learnt nothing get one warning line: always the
  most frequent MRPC dev class, or no GoEmotions label at all; a model that did learn gets none."""
  with open(os.path.join(SHARED, "data", "glue", "MRPC", "dev.tsv"), encoding="utf-8-sig") as f:
    labels = np.array([int(line.split("\t")[0]) for line in list(f)[1:]])
  majority = np.bincount(labels).argmax()
  message = metrics.at_the_floor(labels, np.full_like(labels, majority))
  assert message.startswith("dev accuracy 0.6838 is no better than always predicting the most "
                            "frequent class (0.6838)")
  assert "\n" not in message
  # The likeliest cause with a sentence-embedding checkpoint is named (issue #73: MiniLM on MRPC).
  assert message.endswith("learns with --classifier_pooling=mean"), message
  better = labels.copy()
  better[:10] = 1 - better[:10]  # 97.5% right
  assert metrics.at_the_floor(labels, better) is None
  with open(os.path.join(SHARED, "data", "goemotions", "dev.tsv"), encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t")[1].split(",") for line in f]
  multi = np.zeros((len(rows), 28), int)
  for i, ids in enumerate(rows):
    multi[i, [int(x) for x in ids]] = 1
  assert metrics.at_the_floor(multi, np.zeros_like(multi)).startswith("dev micro F1 is 0")
  assert "--classifier_pooling=mean" in metrics.at_the_floor(multi, np.zeros_like(multi))
  assert metrics.at_the_floor(multi, multi) is None
