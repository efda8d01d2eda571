r"""SQuAD v1.1 and v2.0 evaluation with the official scripts' rules and output.

The numbers papers quote for SQuAD come from two small official scripts (evaluate-v1.1.py and
evaluate-v2.0.py); a score is only comparable when it is computed by their exact rules: answer
normalization (lower case, no punctuation, no articles a/an/the, single spaces), bag-of-tokens F1,
maximum over the gold answers, and for v2.0 the empty answer for unanswerable questions, the
no-answer probability threshold and the best-threshold search. Those rules live in metrics.py
(`evaluate_v1` / `evaluate_v2`, which run_squad.py also calls after writing its predictions); this
script reads the files and prints the same JSON, so it can stand in for the official ones.

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

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import json
import math
import sys

from absl import flags
from absl import logging

from bert_tf2 import metrics


# --- Command line -----------------------------------------------------------------------------


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
  for qa in metrics.squad_questions(dataset):
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
  dataset_json = fileio.load_json(data_file, "SQuAD data file")
  if not isinstance(dataset_json, dict) or not isinstance(dataset_json.get("data"), list):
    raise fileio.InputError(f"{data_file}: not a SQuAD data file (no top-level \"data\" list)")
  predictions = _check_mapping(fileio.load_json(pred_file, "predictions", unique_keys=True), pred_file,
                               "predictions")
  na_probs = None
  if na_prob_file:
    na_probs = _check_mapping(fileio.load_json(na_prob_file, "no-answer probabilities", unique_keys=True),
                              na_prob_file, "no-answer probabilities")
  if squad_version == "auto":
    v2 = metrics.is_version_2(dataset_json) or na_probs is not None
  else:
    v2 = squad_version.startswith("2")
  dataset = dataset_json["data"]
  try:
    _check_dataset(dataset, data_file, v2)
    if not any(qa["id"] in predictions for qa in metrics.squad_questions(dataset)):
      raise fileio.InputError(f"{pred_file}: no prediction matches a question of {data_file}")
    if v2:
      return metrics.evaluate_v2(dataset, predictions, na_probs, na_prob_thresh), True
    if str(dataset_json.get("version", "1.1")) != "1.1":
      logging.warning("%s declares version %s; scoring it by the v1.1 rules", data_file,
                      dataset_json.get("version"))
    return metrics.evaluate_v1(dataset, predictions), False
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


def cli():
  """The command line: `python evaluate_squad.py` and the `bert-evaluate-squad` command."""
  define_flags()
  commands.run_main(main, positional=True)
