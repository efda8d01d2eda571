r"""SQuAD v1.1 and v2.0 evaluation with the official scripts' rules and output.

The numbers papers quote for SQuAD come from two small official scripts (evaluate-v1.1.py and
evaluate-v2.0.py); a score is only comparable when it is computed by their exact rules: answer
normalization (lower case, no punctuation, no articles a/an/the, single spaces), bag-of-tokens F1,
maximum over the gold answers, and for v2.0 the empty answer for unanswerable questions, the
no-answer probability threshold and the best-threshold search. This module reimplements those rules
and prints the same JSON, so it can stand in for them, and `run_squad.py` calls `evaluate_v1` /
`evaluate_v2` directly after writing its predictions.

Usage, as the official scripts (the version is read from the data unless --squad_version is given):

  python evaluate_squad.py dev-v1.1.json predictions.json
  python evaluate_squad.py dev-v2.0.json predictions.json --na-prob-file null_odds.json \
      [--na-prob-thresh 1.0] [--out-file eval.json]

Where the official scripts crash or write diagnostics to stdout, this one reports a clear error
(missing file, bad JSON, a question missing from the no-answer file) or logs to stderr, so stdout
stays valid JSON.
"""

import collections
import json
import re
import string
import sys

from absl import flags
from absl import logging

import fileio

# --- Official answer normalization and scores -------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text):
  """Lower case, drop ASCII punctuation, replace articles by a space, collapse whitespace."""
  text = text.lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def get_tokens(text):
  """Normalized tokens of an answer; none for an empty answer (v2.0's 'no answer')."""
  if not text:
    return []
  return normalize_answer(text).split()


def exact_match_v1(prediction, ground_truth):
  return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_v1(prediction, ground_truth):
  """v1.1 F1: token overlap; an empty side simply has no overlap (score 0)."""
  prediction_tokens = normalize_answer(prediction).split()
  ground_truth_tokens = normalize_answer(ground_truth).split()
  common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0
  precision = num_same / len(prediction_tokens)
  recall = num_same / len(ground_truth_tokens)
  return (2 * precision * recall) / (precision + recall)


def compute_exact(gold, prediction):
  return int(normalize_answer(gold) == normalize_answer(prediction))


def compute_f1(gold, prediction):
  """v2.0 F1: as v1.1, except that when either side is empty it is 1 if both are, else 0."""
  gold_tokens = get_tokens(gold)
  prediction_tokens = get_tokens(prediction)
  if not gold_tokens or not prediction_tokens:
    return int(gold_tokens == prediction_tokens)
  common = collections.Counter(gold_tokens) & collections.Counter(prediction_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0
  precision = num_same / len(prediction_tokens)
  recall = num_same / len(gold_tokens)
  return (2 * precision * recall) / (precision + recall)


def _questions(dataset):
  for article in dataset:
    for paragraph in article["paragraphs"]:
      yield from paragraph["qas"]


def is_version_2(dataset_json):
  """True for SQuAD 2.0 data: a '2.x' version field, or any question with `is_impossible`."""
  version = str(dataset_json.get("version", ""))
  if version.lstrip("v").startswith("2"):
    return True
  if version.lstrip("v").startswith("1"):
    return False
  return any("is_impossible" in qa for qa in _questions(dataset_json["data"]))


# --- v1.1 -------------------------------------------------------------------------------------


def evaluate_v1(dataset, predictions):
  """The official v1.1 result {'exact_match', 'f1'} in percent.

  `dataset` is the data file's "data" list, `predictions` maps question id to answer text. A
  question without a prediction scores 0 and counts in the total, as in the official script.
  """
  exact_match = f1 = total = 0
  for qa in _questions(dataset):
    total += 1
    if qa["id"] not in predictions:
      logging.warning("Unanswered question %s will receive score 0.", qa["id"])
      continue
    ground_truths = [answer["text"] for answer in qa["answers"]]
    prediction = predictions[qa["id"]]
    exact_match += max(exact_match_v1(prediction, truth) for truth in ground_truths)
    f1 += max(f1_v1(prediction, truth) for truth in ground_truths)
  return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


# --- v2.0 -------------------------------------------------------------------------------------


def make_qid_to_has_ans(dataset):
  return {qa["id"]: bool(qa["answers"]) for qa in _questions(dataset)}


def get_raw_scores(dataset, predictions):
  """Per-question exact and F1 (0..1) before any no-answer threshold.

  Gold answers that normalize to nothing are dropped; a question left with none (unanswerable)
  has the empty string as its only correct answer. Questions without a prediction are left out of
  the scores (and so of every total), as in the official script.
  """
  exact_scores = {}
  f1_scores = {}
  for qa in _questions(dataset):
    qid = qa["id"]
    gold_answers = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
    if not gold_answers:
      gold_answers = [""]
    if qid not in predictions:
      logging.warning("Missing prediction for %s", qid)
      continue
    prediction = predictions[qid]
    exact_scores[qid] = max(compute_exact(a, prediction) for a in gold_answers)
    f1_scores[qid] = max(compute_f1(a, prediction) for a in gold_answers)
  return exact_scores, f1_scores


def apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
  """A question whose no-answer probability exceeds the threshold counts as answered 'no answer'."""
  new_scores = {}
  for qid, score in scores.items():
    if qid not in na_probs:
      raise fileio.InputError(f"no-answer probabilities have no entry for question {qid}")
    if na_probs[qid] > na_prob_thresh:
      new_scores[qid] = float(not qid_to_has_ans[qid])
    else:
      new_scores[qid] = score
  return new_scores


def make_eval_dict(exact_scores, f1_scores, qid_list=None):
  if qid_list is None:
    qid_list = list(exact_scores)
  total = len(qid_list)
  if not total:
    return collections.OrderedDict([("exact", 0.0), ("f1", 0.0), ("total", 0)])
  return collections.OrderedDict([
      ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
      ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
      ("total", total),
  ])


def find_best_thresh(predictions, scores, na_probs, qid_to_has_ans):
  """Best score over no-answer thresholds, and the threshold, as the official sweep finds them.

  Starting from 'answer nothing' (every unanswerable question right), questions are switched to
  their predicted answer in increasing order of no-answer probability; the best running total and
  the probability at which it was reached are kept. The percentage is over the scored questions.
  """
  num_no_ans = sum(1 for has_ans in qid_to_has_ans.values() if not has_ans)
  current = best = num_no_ans
  best_thresh = 0.0
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):
    if qid not in scores:
      continue
    if qid_to_has_ans[qid]:
      diff = scores[qid]
    else:
      diff = -1 if predictions[qid] else 0
    current += diff
    if current > best:
      best = current
      best_thresh = na_probs[qid]
  return 100.0 * best / len(scores), best_thresh


def evaluate_v2(dataset, predictions, na_probs=None, na_prob_thresh=1.0):
  """The official v2.0 result dict (percentages), with best thresholds when `na_probs` is given.

  Keys: exact, f1, total, then HasAns_exact/f1/total and NoAns_exact/f1/total when the data has
  such questions, then best_exact, best_exact_thresh, best_f1, best_f1_thresh with `na_probs`.
  Without `na_probs` every no-answer probability is 0, so the threshold never applies.
  """
  with_na_probs = na_probs is not None
  if not with_na_probs:
    na_probs = {k: 0.0 for k in predictions}
  qid_to_has_ans = make_qid_to_has_ans(dataset)
  exact_raw, f1_raw = get_raw_scores(dataset, predictions)
  if not exact_raw:
    raise fileio.InputError("no prediction matches a question of the data file")
  exact_thresh = apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
  f1_thresh = apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
  result = make_eval_dict(exact_thresh, f1_thresh)
  # The official script would crash on a missing prediction here; the subsets count only the
  # questions that were scored, like the overall total.
  has_ans_qids = [k for k, v in qid_to_has_ans.items() if v and k in exact_thresh]
  no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v and k in exact_thresh]
  if has_ans_qids:
    for key, value in make_eval_dict(exact_thresh, f1_thresh, has_ans_qids).items():
      result["HasAns_" + key] = value
  if no_ans_qids:
    for key, value in make_eval_dict(exact_thresh, f1_thresh, no_ans_qids).items():
      result["NoAns_" + key] = value
  if with_na_probs:
    result["best_exact"], result["best_exact_thresh"] = find_best_thresh(
        predictions, exact_raw, na_probs, qid_to_has_ans)
    result["best_f1"], result["best_f1_thresh"] = find_best_thresh(
        predictions, f1_raw, na_probs, qid_to_has_ans)
  return result


# --- Command line -----------------------------------------------------------------------------


def load_json(path, what):
  fileio.check_file(path, what)
  try:
    with open(path, encoding="utf-8-sig") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise fileio.InputError(f"{path}:{e.lineno}: {what} is not valid JSON ({e.msg}, column "
                            f"{e.colno})") from None
  except UnicodeDecodeError as e:
    raise fileio.InputError(f"{path}: {what} is not UTF-8 (byte {e.start})") from None


def _check_mapping(value, path, what):
  if not isinstance(value, dict):
    raise fileio.InputError(f"{path}: {what} must be a JSON object mapping question id to "
                            f"{'answer text' if what == 'predictions' else 'a probability'}")
  return value


def evaluate_files(data_file, pred_file, na_prob_file=None, na_prob_thresh=1.0,
                   squad_version="auto"):
  """Reads the files and evaluates them; returns (result dict, is_v2)."""
  dataset_json = load_json(data_file, "SQuAD data file")
  if not isinstance(dataset_json, dict) or not isinstance(dataset_json.get("data"), list):
    raise fileio.InputError(f"{data_file}: not a SQuAD data file (no top-level \"data\" list)")
  predictions = _check_mapping(load_json(pred_file, "predictions"), pred_file, "predictions")
  na_probs = None
  if na_prob_file:
    na_probs = _check_mapping(load_json(na_prob_file, "no-answer probabilities"), na_prob_file,
                              "no-answer probabilities")
  if squad_version == "auto":
    v2 = is_version_2(dataset_json) or na_probs is not None
  else:
    v2 = squad_version.startswith("2")
  dataset = dataset_json["data"]
  try:
    if v2:
      return evaluate_v2(dataset, predictions, na_probs, na_prob_thresh), True
    if str(dataset_json.get("version", "1.1")) != "1.1":
      logging.warning("Evaluation expects v-1.1, but got dataset with v-%s",
                      dataset_json.get("version"))
    return evaluate_v1(dataset, predictions), False
  except (KeyError, TypeError) as e:
    raise fileio.InputError(f"{data_file}: not in the SQuAD format ({type(e).__name__}: "
                            f"{e})") from None


def define_flags():
  """The official scripts' options, under their own spellings and as absl-style names."""
  flags.DEFINE_string("na_prob_file", None,
                      "JSON mapping question id to the model's probability (or score) that it "
                      "has no answer, e.g. run_squad.py's null_odds.json. Adds best_exact/best_f1 "
                      "and their thresholds (v2.0).", short_name="n")
  flags.DEFINE_float("na_prob_thresh", 1.0,
                     "Predict no answer where the no-answer probability exceeds this (v2.0).",
                     short_name="t")
  flags.DEFINE_string("out_file", None, "Write the result JSON here instead of stdout.",
                      short_name="o")
  flags.DEFINE_enum("squad_version", "auto", ["auto", "1.1", "2.0"],
                    "Scoring rules: auto reads the data's version field (and `is_impossible`).")
  flags.DEFINE_string("data_file", None, "SQuAD data JSON (or the first positional argument).")
  flags.DEFINE_string("pred_file", None, "Predictions JSON (or the second positional argument).")
  for name in ("na_prob_file", "na_prob_thresh", "out_file"):
    flags.DEFINE_alias(name.replace("_", "-"), name)


def main(argv):
  flags_values = flags.FLAGS
  positional = argv[1:]
  data_file = flags_values.data_file or (positional.pop(0) if positional else None)
  pred_file = flags_values.pred_file or (positional.pop(0) if positional else None)
  if positional:
    raise fileio.InputError(f"unexpected arguments: {' '.join(positional)}")
  if not data_file or not pred_file:
    raise fileio.InputError("usage: evaluate_squad.py DATA_FILE PRED_FILE [--na-prob-file F] "
                            "[--na-prob-thresh 1.0] [--out-file F]")
  result, is_v2 = evaluate_files(data_file, pred_file, flags_values.na_prob_file,
                                 flags_values.na_prob_thresh, flags_values.squad_version)
  if flags_values.out_file:
    with fileio.open_atomic(flags_values.out_file) as f:
      json.dump(result, f)
  elif is_v2:
    print(json.dumps(result, indent=2))
  else:
    print(json.dumps(result))
  sys.stdout.flush()


if __name__ == "__main__":
  define_flags()
  fileio.run_main(main)
