"""evaluate_squad.py: the official SQuAD rules on the real dev files vs hand-computed scores."""

import json
import os
import sys

import pytest

from conftest import ROOT, SHARED, requires_shared, run_process

from bert_tf2 import fileio
from bert_tf2 import metrics

SQUAD = os.path.join(SHARED, "data", "squad")
V1_DEV = os.path.join(SQUAD, "dev-v1.1.json")
V2_DEV = os.path.join(SQUAD, "dev-v2.0.Normans_subset.json")


def _load(path):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _questions(dataset):
  return [qa for article in dataset for p in article["paragraphs"] for qa in p["qas"]]


def test_normalization_and_token_f1_rules():
  assert metrics.normalize_answer("The  Denver-Broncos!") == "denverbroncos"
  assert metrics.normalize_answer("an apple a day, the end") == "apple day end"
  assert metrics.normalize_answer("Theater") == "theater"  # articles only as words
  # v2.0: an empty side scores 1 only against another empty side.
  assert metrics.compute_f1("", "") == 1
  assert metrics.compute_f1("", "Normans") == 0
  assert metrics.compute_f1("Normans", "") == 0
  # "a" and "the" normalize away, so both sides are empty: still a match in v2.0, not in v1.1.
  assert metrics.compute_f1("the", "a") == 1
  assert metrics.f1_v1("the", "a") == 0
  # Bag of tokens: precision 2/3, recall 1.
  assert metrics.compute_f1("Denver Broncos",
                                   "the Denver Broncos team") == pytest.approx(0.8)


@requires_shared
def test_v1_exact_answers_score_100_and_empty_answers_0():
  dataset = _load(V1_DEV)["data"]
  questions = _questions(dataset)
  assert len(questions) == 10570
  gold = {qa["id"]: qa["answers"][0]["text"] for qa in questions}
  assert metrics.evaluate_v1(dataset, gold) == {"exact_match": 100.0, "f1": 100.0}
  # Under the v1.1 rules an empty answer still matches a gold answer that normalizes to nothing:
  # three dev questions have "." among their answers.
  dot_answers = [qa["id"] for qa in questions if any(a["text"] == "." for a in qa["answers"])]
  assert len(dot_answers) == 3
  empty = {qid: "" for qid in gold}
  assert metrics.evaluate_v1(dataset, empty) == {"exact_match": 100.0 * 3 / 10570,
                                                        "f1": 0.0}


@requires_shared
def test_v1_partial_answers_hand_computed():
  dataset = _load(V1_DEV)["data"]
  predictions = {qa["id"]: qa["answers"][0]["text"] for qa in _questions(dataset)}
  total = len(predictions)
  # Gold "Denver Broncos": prediction tokens denver broncos team -> P 2/3, R 1, F1 0.8.
  predictions["56be4db0acb8001400a502ec"] = "the Denver Broncos team"
  # Golds "Santa Clara, California" (F1 0.5), "Levi's Stadium" (P 2/5, R 1: 4/7) and "Levi's
  # Stadium in the San Francisco Bay Area at Santa Clara, California." (11 tokens without "the",
  # 5 shared: P 1, R 5/11, F1 10/16 = 0.625); the maximum counts.
  predictions["56be4db0acb8001400a502ee"] = "Levi's Stadium in Santa Clara"
  # Matches the second gold answer "February 7" exactly (the first is "February 7, 2016").
  predictions["56be8e613aeaaa14008c90d2"] = "February 7"
  # A missing prediction scores 0 and still counts in the total.
  del predictions["56beace93aeaaa14008c91e2"]
  result = metrics.evaluate_v1(dataset, predictions)
  assert result["exact_match"] == pytest.approx(100.0 * (total - 3) / total)
  assert result["f1"] == pytest.approx(100.0 * (total - 3 + 0.8 + 0.625) / total)


@requires_shared
def test_v2_subset_answers_and_no_answers():
  dataset_json = _load(V2_DEV)
  assert metrics.is_version_2(dataset_json)
  assert not metrics.is_version_2(_load(V1_DEV))
  dataset = dataset_json["data"]
  questions = _questions(dataset)
  unanswerable = [qa["id"] for qa in questions if not qa["answers"]]
  answerable = [qa for qa in questions if qa["answers"]]
  assert (len(questions), len(unanswerable), len(answerable)) == (208, 112, 96)

  perfect = {qa["id"]: qa["answers"][0]["text"] for qa in answerable}
  perfect.update({qid: "" for qid in unanswerable})
  result = metrics.evaluate_v2(dataset, perfect)
  assert list(result) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                          "NoAns_exact", "NoAns_f1", "NoAns_total"]
  assert (result["exact"], result["f1"], result["total"]) == (100.0, 100.0, 208)
  assert (result["HasAns_total"], result["NoAns_total"]) == (96, 112)

  # Answering every unanswerable question with a plausible span loses exactly those.
  wrong = dict(perfect, **{qid: "Normans" for qid in unanswerable})
  result = metrics.evaluate_v2(dataset, wrong)
  assert result["exact"] == pytest.approx(100.0 * 96 / 208)
  assert result["f1"] == pytest.approx(100.0 * 96 / 208)
  assert (result["HasAns_exact"], result["NoAns_exact"], result["NoAns_f1"]) == (100.0, 0.0, 0.0)

  # No-answer probabilities: 0.9 on the unanswerable questions, 0.1 on the others.
  na_probs = {qid: 0.9 for qid in unanswerable}
  na_probs.update({qa["id"]: 0.1 for qa in answerable})
  # The default threshold 1.0 is never exceeded: the answers stand.
  result = metrics.evaluate_v2(dataset, wrong, na_probs)
  assert result["exact"] == pytest.approx(100.0 * 96 / 208)
  # Sweep: start at 112 (all no-answer right); the 96 answerable (prob 0.1) each add 1 -> 208 at
  # threshold 0.1; the unanswerable ones (0.9, non-empty answers) each subtract 1.
  assert result["best_exact"] == pytest.approx(100.0)
  assert result["best_exact_thresh"] == pytest.approx(0.1)
  assert result["best_f1"] == pytest.approx(100.0)
  assert result["best_f1_thresh"] == pytest.approx(0.1)
  # Threshold 0.5: the unanswerable questions are predicted as no answer and become right.
  result = metrics.evaluate_v2(dataset, wrong, na_probs, na_prob_thresh=0.5)
  assert (result["exact"], result["NoAns_exact"]) == (100.0, 100.0)
  # Threshold 0.05: every question is "no answer": only the unanswerable ones are right.
  result = metrics.evaluate_v2(dataset, wrong, na_probs, na_prob_thresh=0.05)
  assert result["exact"] == pytest.approx(100.0 * 112 / 208)
  assert result["HasAns_exact"] == 0.0

  # A partial answer on one answerable question: first question's gold is "France" x4.
  first = answerable[0]
  assert first["answers"][0]["text"] == "France"
  partial = dict(perfect, **{first["id"]: "northern France"})  # P 1/2, R 1 -> F1 2/3
  result = metrics.evaluate_v2(dataset, partial)
  assert result["exact"] == pytest.approx(100.0 * 207 / 208)
  assert result["f1"] == pytest.approx(100.0 * (207 + 2 / 3) / 208)
  assert result["HasAns_f1"] == pytest.approx(100.0 * (95 + 2 / 3) / 96)

  # A missing prediction counts as wrong (the official v2.0 script fails on it), even for a
  # question whose right answer is "no answer".
  fewer = dict(perfect)
  del fewer[unanswerable[0]]
  result = metrics.evaluate_v2(dataset, fewer)
  assert (result["total"], result["NoAns_total"]) == (208, 112)
  assert result["exact"] == pytest.approx(100.0 * 207 / 208)
  assert result["NoAns_exact"] == pytest.approx(100.0 * 111 / 112)
  result = metrics.evaluate_v2(dataset, fewer, dict.fromkeys(fewer, 0.5))
  assert result["best_exact"] == pytest.approx(100.0 * 207 / 208)


def _cli(*args):
  return run_process([sys.executable, os.path.join(ROOT, "evaluate_squad.py"), *args],
                     env=None, cwd=ROOT, timeout=120)


@requires_shared
def test_command_line_official_form(tmp_path):
  dataset = _load(V2_DEV)["data"]
  questions = _questions(dataset)
  predictions = {qa["id"]: (qa["answers"][0]["text"] if qa["answers"] else "Normans")
                 for qa in questions}
  na_probs = {qa["id"]: (0.9 if not qa["answers"] else 0.1) for qa in questions}
  pred_file = tmp_path / "predictions.json"
  na_file = tmp_path / "null_odds.json"
  pred_file.write_text(json.dumps(predictions))
  na_file.write_text(json.dumps(na_probs))

  run = _cli(V2_DEV, str(pred_file), "--na-prob-file", str(na_file), "--na-prob-thresh", "0.5")
  assert run.returncode == 0, run.stderr
  result = json.loads(run.stdout)
  assert result["exact"] == 100.0 and result["best_exact_thresh"] == pytest.approx(0.1)

  out_file = tmp_path / "eval.json"
  run = _cli(V2_DEV, str(pred_file), "-n", str(na_file), "-o", str(out_file))
  assert run.returncode == 0, run.stderr
  assert json.loads(out_file.read_text())["exact"] == pytest.approx(100.0 * 96 / 208)

  v1_predictions = tmp_path / "v1.json"
  v1_predictions.write_text(json.dumps({qa["id"]: qa["answers"][0]["text"]
                                        for qa in _questions(_load(V1_DEV)["data"])}))
  run = _cli(V1_DEV, str(v1_predictions))
  assert run.returncode == 0, run.stderr
  assert json.loads(run.stdout) == {"exact_match": 100.0, "f1": 100.0}

  bad = tmp_path / "bad.json"
  bad.write_text('{"a": "b",\n "c": }')
  run = _cli(V1_DEV, str(bad))
  assert run.returncode == 2
  assert f"{bad}:2:" in run.stderr and "Traceback" not in run.stderr


@requires_shared
def test_missing_no_answer_probability_is_a_clear_error():
  dataset = _load(V2_DEV)["data"]
  predictions = {qa["id"]: "" for qa in _questions(dataset)}
  with pytest.raises(fileio.InputError, match="no-answer probabilities have no entry"):
    metrics.evaluate_v2(dataset, predictions, na_probs={})
