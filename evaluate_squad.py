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
(missing file, bad JSON, a prediction that is not text, a question id given twice, a question
missing from the no-answer file) or logs to stderr, so stdout stays valid JSON. A question without
a prediction counts as wrong, with one warning for them all, by both versions' rules (the v1.1
script's; the v2.0 script fails on a partial predictions file).
"""

# First, before the slow imports: Ctrl-C while they load ends in one error line.
import fileio  # pylint: disable=g-bad-import-order

import collections
import json
import math
import re
import string
import sys

from absl import flags
from absl import logging


# --- Answer comparison --------------------------------------------------------------------------

# Comparison ignores ASCII punctuation and the English articles, wherever they are.
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLE_WORD = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text):
  """The form in which answers are compared: "The  Denver-Broncos!" -> "denverbroncos".

  Steps, in this order: lower-case, delete every ASCII punctuation character, put a space where an
  article (a, an, the) stood as a whole word, and reduce whitespace runs to single spaces.
  """
  no_punct = "".join(c for c in text.lower() if c not in _PUNCTUATION)
  return " ".join(_ARTICLE_WORD.sub(" ", no_punct).split())


def _words(text):
  return normalize_answer(text).split()


def _bag_f1(predicted_words, gold_words):
  """Harmonic mean of word precision and recall; a word shared n times counts n times."""
  shared = sum((collections.Counter(predicted_words) & collections.Counter(gold_words)).values())
  if shared == 0:
    return 0
  precision = shared / len(predicted_words)
  recall = shared / len(gold_words)
  return (2 * precision * recall) / (precision + recall)


def _same_answer(first, second):
  return int(normalize_answer(first) == normalize_answer(second))


def f1_v1(prediction, ground_truth):
  """F1 by the v1.1 rules: an answer that normalizes to nothing shares no word, so scores 0."""
  return _bag_f1(_words(prediction), _words(ground_truth))


def compute_f1(gold, prediction):
  """F1 by the v2.0 rules: 'no answer' (empty after normalization) on either side scores 1 when
  both sides are empty and 0 otherwise; other pairs score as in v1.1."""
  gold_words = _words(gold)
  predicted_words = _words(prediction)
  if gold_words and predicted_words:
    return _bag_f1(predicted_words, gold_words)
  return int(gold_words == predicted_words)


def _questions(dataset):
  for article in dataset:
    for paragraph in article["paragraphs"]:
      yield from paragraph["qas"]


def is_version_2(dataset_json):
  """True for SQuAD 2.0 data: a '2.x' version field, or any question with `is_impossible`."""
  version = str(dataset_json.get("version", "")).lstrip("v")
  if version.startswith("2"):
    return True
  if version.startswith("1"):
    return False
  return any("is_impossible" in qa for qa in _questions(dataset_json["data"]))


# --- v1.1 -------------------------------------------------------------------------------------


def _warn_missing(dataset, predictions):
  """One warning for the questions without a prediction (they score 0); an InputError when no
  prediction matches a question (the wrong predictions or data file)."""
  qids = [qa["id"] for qa in _questions(dataset)]
  missing = [qid for qid in qids if qid not in predictions]
  if qids and len(missing) == len(qids):
    raise fileio.InputError("no prediction matches a question of the data file")
  if missing:
    logging.warning("%d of %d questions have no prediction (%s%s); they count as wrong",
                    len(missing), len(qids), ", ".join(missing[:3]),
                    ", ..." if len(missing) > 3 else "")


def evaluate_v1(dataset, predictions):
  """The v1.1 result {'exact_match', 'f1'} in percent.

  `dataset` is the data file's "data" list, `predictions` maps question id to answer text. Each
  question takes its best score over its gold answers. A question with no prediction adds 0 but
  still counts in the denominator.
  """
  _warn_missing(dataset, predictions)
  exact_sum = f1_sum = 0
  asked = 0
  for qa in _questions(dataset):
    asked += 1
    qid = qa["id"]
    if qid not in predictions:
      continue
    answer = predictions[qid]
    golds = [gold["text"] for gold in qa["answers"]]
    exact_sum += max((_same_answer(answer, gold) for gold in golds), default=0)
    f1_sum += max((f1_v1(answer, gold) for gold in golds), default=0)
  return {"exact_match": 100.0 * exact_sum / max(asked, 1), "f1": 100.0 * f1_sum / max(asked, 1)}


# --- v2.0 -------------------------------------------------------------------------------------


def _answerable(dataset):
  """question id -> whether it has gold answers (False: the right answer is 'no answer')."""
  return {qa["id"]: bool(qa["answers"]) for qa in _questions(dataset)}


def _scores_v2(dataset, predictions):
  """Per-question (exact, F1) dicts for the predicted questions, before any no-answer threshold.

  Only gold answers that still say something after normalization count; when none does, the
  empty string is the one correct answer. Questions without a prediction get no entry here.
  """
  exact = {}
  f1 = {}
  for qa in _questions(dataset):
    qid = qa["id"]
    if qid not in predictions:
      continue
    golds = [gold["text"] for gold in qa["answers"] if normalize_answer(gold["text"])] or [""]
    answer = predictions[qid]
    exact[qid] = max(_same_answer(gold, answer) for gold in golds)
    f1[qid] = max(compute_f1(gold, answer) for gold in golds)
  return exact, f1


def _thresholded(scores, na_probs, answerable, na_prob_thresh):
  """Scores after treating each question whose no-answer probability is above the threshold as
  answered with nothing: 1 where that is right (no gold answer), else 0."""
  result = {}
  for qid, score in scores.items():
    if qid not in na_probs:
      raise fileio.InputError(f"no-answer probabilities have no entry for question {qid}")
    said_no_answer = na_probs[qid] > na_prob_thresh
    result[qid] = float(not answerable[qid]) if said_no_answer else score
  return result


def _averages(exact, f1, qids):
  """Mean exact and F1 over `qids` in percent, with their count (zeros for no questions)."""
  count = len(qids)
  if count == 0:
    return collections.OrderedDict([("exact", 0.0), ("f1", 0.0), ("total", 0)])
  return collections.OrderedDict([
      ("exact", 100.0 * sum(exact[qid] for qid in qids) / count),
      ("f1", 100.0 * sum(f1[qid] for qid in qids) / count),
      ("total", count),
  ])


def _best_threshold(predictions, scores, na_probs, answerable):
  """(best score in percent, the no-answer probability at which it is reached).

  Sweeps the threshold upwards: below every probability all questions are answered 'nothing',
  which earns one point per unanswerable question. Passing a question's probability switches it
  to its predicted answer, which earns its score if it is answerable and costs the point if it is
  not (unless the prediction is empty anyway). The first threshold with the highest total wins;
  the percentage is over all questions (one without a prediction is never right).
  """
  total = sum(1 for qid, has_answer in answerable.items() if not has_answer and qid in scores)
  best_total, best_thresh = total, 0.0
  for qid in sorted(na_probs, key=lambda q: na_probs[q]):
    if qid not in scores:
      continue
    if answerable[qid]:
      total += scores[qid]
    elif predictions[qid]:
      total -= 1
    if total > best_total:
      best_total, best_thresh = total, na_probs[qid]
  return 100.0 * best_total / len(answerable), best_thresh


def evaluate_v2(dataset, predictions, na_probs=None, na_prob_thresh=1.0):
  """The v2.0 result dict (percentages), with best thresholds when `na_probs` is given.

  Keys: exact, f1, total, then HasAns_exact/f1/total and NoAns_exact/f1/total when the data has
  such questions, then best_exact, best_exact_thresh, best_f1, best_f1_thresh with `na_probs`.
  Without `na_probs` every no-answer probability is 0, so the threshold never applies.
  """
  sweep = na_probs is not None
  if not sweep:
    na_probs = dict.fromkeys(predictions, 0.0)
  _warn_missing(dataset, predictions)
  answerable = _answerable(dataset)
  exact_raw, f1_raw = _scores_v2(dataset, predictions)
  exact = _thresholded(exact_raw, na_probs, answerable, na_prob_thresh)
  f1 = _thresholded(f1_raw, na_probs, answerable, na_prob_thresh)
  # A question without a prediction is wrong, "no answer" ones included: the official script
  # would fail on it, and leaving it out would score a file of the easy questions only as high.
  for qid in answerable:
    exact.setdefault(qid, 0.0)
    f1.setdefault(qid, 0.0)
  result = _averages(exact, f1, list(answerable))
  for prefix, wanted in (("HasAns_", True), ("NoAns_", False)):
    qids = [qid for qid, has_answer in answerable.items() if has_answer == wanted]
    if qids:
      result.update((prefix + key, value) for key, value in _averages(exact, f1, qids).items())
  if sweep:
    result["best_exact"], result["best_exact_thresh"] = _best_threshold(
        predictions, exact_raw, na_probs, answerable)
    result["best_f1"], result["best_f1_thresh"] = _best_threshold(
        predictions, f1_raw, na_probs, answerable)
  return result


# --- Command line -----------------------------------------------------------------------------


def _unique_keys(pairs):
  """json object hook: a key given twice is an error (json.load would keep the last silently)."""
  result = {}
  for key, value in pairs:
    if key in result:
      raise fileio.InputError(f"{key!r} appears more than once")
    result[key] = value
  return result


def load_json(path, what, unique_keys=False):
  """The JSON content of `path`; InputError naming the file (and line) when it is not JSON, or,
  with `unique_keys`, when an object repeats a key (a question id given twice)."""
  fileio.check_file(path, what)
  try:
    with open(path, encoding="utf-8-sig") as f:
      return json.load(f, object_pairs_hook=_unique_keys if unique_keys else None)
  except fileio.InputError as e:
    raise fileio.InputError(f"{path}: {what}: {e}") from None
  except json.JSONDecodeError as e:
    raise fileio.InputError(f"{path}:{e.lineno}: {what} is not valid JSON ({e.msg}, column "
                            f"{e.colno})") from None
  except UnicodeDecodeError as e:
    raise fileio.InputError(f"{path}: {what} is not UTF-8 (byte {e.start})") from None


def _check_mapping(value, path, what):
  """`value` as a dict of question id -> answer text (predictions) or a finite number (no-answer
  probabilities); InputError naming the file and the question otherwise."""
  texts = what == "predictions"
  expected = "answer text" if texts else "a probability"
  if not isinstance(value, dict):
    raise fileio.InputError(f"{path}: {what} must be a JSON object mapping question id to "
                            f"{expected}")
  for qid, item in value.items():
    if texts:
      good = isinstance(item, str)
    else:
      good = (isinstance(item, (int, float)) and not isinstance(item, bool) and
              math.isfinite(item))
    if not good:
      raise fileio.InputError(f"{path}: the {what} entry of question {qid} is "
                              f"{json.dumps(item)[:80]}, not {expected}")
  return value


def _check_dataset(dataset, data_file, v2):
  """InputError naming the file for a question id given twice (one of the two would silently
  share the other's prediction) or, by the v1.1 rules, a question without gold answers."""
  seen = set()
  for qa in _questions(dataset):
    qid = qa["id"]
    if qid in seen:
      raise fileio.InputError(f"{data_file}: question id {qid} appears more than once; each "
                              "question needs its own id")
    seen.add(qid)
    if not v2 and not qa["answers"]:
      raise fileio.InputError(
          f"{data_file}: question {qid} has no gold answer, as in SQuAD 2.0 data; score it by "
          "the v2.0 rules (--squad_version=2.0, or auto with a 2.0 version field)")


def evaluate_files(data_file, pred_file, na_prob_file=None, na_prob_thresh=1.0,
                   squad_version="auto"):
  """Reads the files and evaluates them; returns (result dict, is_v2)."""
  dataset_json = load_json(data_file, "SQuAD data file")
  if not isinstance(dataset_json, dict) or not isinstance(dataset_json.get("data"), list):
    raise fileio.InputError(f"{data_file}: not a SQuAD data file (no top-level \"data\" list)")
  predictions = _check_mapping(load_json(pred_file, "predictions", unique_keys=True), pred_file,
                               "predictions")
  na_probs = None
  if na_prob_file:
    na_probs = _check_mapping(load_json(na_prob_file, "no-answer probabilities", unique_keys=True),
                              na_prob_file, "no-answer probabilities")
  if squad_version == "auto":
    v2 = is_version_2(dataset_json) or na_probs is not None
  else:
    v2 = squad_version.startswith("2")
  dataset = dataset_json["data"]
  try:
    _check_dataset(dataset, data_file, v2)
    if not any(qa["id"] in predictions for qa in _questions(dataset)):
      raise fileio.InputError(f"{pred_file}: no prediction matches a question of {data_file}")
    if v2:
      return evaluate_v2(dataset, predictions, na_probs, na_prob_thresh), True
    if str(dataset_json.get("version", "1.1")) != "1.1":
      logging.warning("%s declares version %s; scoring it by the v1.1 rules", data_file,
                      dataset_json.get("version"))
    return evaluate_v1(dataset, predictions), False
  except (KeyError, TypeError, AttributeError) as e:
    raise fileio.InputError(f"{data_file}: not in the SQuAD format ({type(e).__name__}: "
                            f"{e})") from None


def define_flags():
  """The official scripts' options, under their own spellings and as absl-style names."""
  flags.DEFINE_string("na_prob_file", None,
                      "JSON mapping question id to the model's probability (or score) that it "
                      "has no answer, e.g. run_squad.py's null_odds.json. Adds best_exact/best_f1 "
                      "and their thresholds (v2.0).", short_name="n")
  flags.DEFINE_float("na_prob_thresh", 1.0,
                     "v2.0: a question whose no-answer probability is above this value counts "
                     "as answered with the empty string.", short_name="t")
  flags.DEFINE_string("out_file", None, "File for the result JSON; without it the JSON goes to "
                      "stdout.", short_name="o")
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
  if not math.isfinite(flags_values.na_prob_thresh):
    raise fileio.InputError(f"--na_prob_thresh={flags_values.na_prob_thresh} is not a number")
  fileio.check_outputs(files=[("out_file", flags_values.out_file)],
                       inputs=[("data_file", data_file), ("pred_file", pred_file),
                               ("na_prob_file", flags_values.na_prob_file)])
  result, is_v2 = evaluate_files(data_file, pred_file, flags_values.na_prob_file,
                                 flags_values.na_prob_thresh, flags_values.squad_version)
  out_file = flags_values.out_file
  if out_file:
    with fileio.naming_output(out_file), fileio.open_atomic(out_file) as f:
      json.dump(result, f)
  elif is_v2:
    print(json.dumps(result, indent=2))
  else:
    print(json.dumps(result))
  sys.stdout.flush()


if __name__ == "__main__":
  define_flags()
  fileio.run_main(main, positional=True)
