"""Task metrics for fine-tuning, computed the way the GLUE and CoNLL-2003 leaderboards report them.

GLUE scores each task with a fixed metric: Matthews correlation for CoLA, F1 of the positive class
and accuracy for MRPC and QQP, Pearson and Spearman correlation for STS-B, accuracy for the rest.
`glue_metrics` returns exactly that set per task, so a dev number printed here is the number a
paper or the leaderboard would quote. NER is scored on entities, not tokens, with the counting of
the CoNLL `conlleval` script (`conll_evaluate`), including its tolerance of IOB1 tags.

All values are fractions in [0, 1] (multiply by 100 for the leaderboard's percentages). Everything
is plain numpy so the metrics can run anywhere, without scipy or scikit-learn.
"""

import collections

import numpy as np


def _as_arrays(labels, predictions):
  labels = np.asarray(labels)
  predictions = np.asarray(predictions)
  if labels.shape != predictions.shape:
    raise ValueError(f"labels and predictions differ in shape: {labels.shape} vs "
                     f"{predictions.shape}")
  if labels.size == 0:
    raise ValueError("no examples to score")
  return labels, predictions


def accuracy(labels, predictions):
  """Fraction of predictions equal to the label."""
  labels, predictions = _as_arrays(labels, predictions)
  return float(np.mean(labels == predictions))


def f1_binary(labels, predictions, positive=1):
  """F1 of the positive class (GLUE's F1 for MRPC and QQP: paraphrase / duplicate = 1).

  0.0 when there is no true positive, as scikit-learn reports it (precision or recall undefined).
  """
  labels, predictions = _as_arrays(labels, predictions)
  true_pos = np.sum((predictions == positive) & (labels == positive))
  false_pos = np.sum((predictions == positive) & (labels != positive))
  false_neg = np.sum((predictions != positive) & (labels == positive))
  if true_pos == 0:
    return 0.0
  return float(2 * true_pos / (2 * true_pos + false_pos + false_neg))


def matthews_corrcoef(labels, predictions):
  """Matthews correlation coefficient (CoLA's metric), for two or more classes.

  Uses the K-class form from the confusion matrix C (Gorodkin 2004), which reduces to
  (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) for two classes. A degenerate case
  (all labels or all predictions one class) has no correlation and gives 0.0, which is also what
  a constant classifier scores on the CoLA leaderboard.
  """
  labels, predictions = _as_arrays(labels, predictions)
  classes, encoded = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
  y_true, y_pred = encoded[:labels.size], encoded[labels.size:]
  confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
  np.add.at(confusion, (y_true, y_pred), 1)
  true_per_class = confusion.sum(axis=1)
  pred_per_class = confusion.sum(axis=0)
  correct = np.trace(confusion)
  samples = confusion.sum()
  cov_ytyp = correct * samples - np.dot(true_per_class, pred_per_class)
  cov_ypyp = samples**2 - np.dot(pred_per_class, pred_per_class)
  cov_ytyt = samples**2 - np.dot(true_per_class, true_per_class)
  if cov_ypyp * cov_ytyt == 0:
    return 0.0
  return float(cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp))


def pearson(x, y):
  """Pearson correlation of two real-valued sequences (STS-B)."""
  x, y = _as_arrays(x, y)
  x = x.astype(np.float64) - np.mean(x, dtype=np.float64)
  y = y.astype(np.float64) - np.mean(y, dtype=np.float64)
  denominator = np.sqrt(np.dot(x, x) * np.dot(y, y))
  if denominator == 0:
    return 0.0
  return float(np.dot(x, y) / denominator)


def rank_average_ties(values):
  """1-based ranks, tied values sharing the mean of the ranks they span (scipy's 'average')."""
  values = np.asarray(values)
  order = np.argsort(values, kind="mergesort")
  sorted_values = values[order]
  # Start index of each run of equal values in sorted order, and the run each element belongs to.
  new_run = np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])
  run_id = np.cumsum(new_run) - 1
  run_starts = np.flatnonzero(new_run)
  run_ends = np.concatenate([run_starts[1:], [values.size]])
  # Ranks start+1 .. end inclusive average to (start + 1 + end) / 2.
  run_rank = (run_starts + 1 + run_ends) / 2.0
  ranks = np.empty(values.size, dtype=np.float64)
  ranks[order] = run_rank[run_id]
  return ranks


def spearman(x, y):
  """Spearman rank correlation (STS-B): Pearson of the tie-averaged ranks."""
  x, y = _as_arrays(x, y)
  return pearson(rank_average_ties(x), rank_average_ties(y))


# The metrics the GLUE leaderboard reports for each task, by the task names run_classifier uses.
_GLUE_TASK_METRICS = {
    "cola": ("mcc",),
    "sst-2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "qqp": ("f1", "accuracy"),
    "sts-b": ("pearson", "spearman"),
    "mnli": ("accuracy",),
    "mnli-mm": ("accuracy",),
    "xnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}

_METRIC_FUNCTIONS = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def glue_metrics(task_name, labels, predictions):
  """The leaderboard metrics of a GLUE task as an ordered dict (first entry is the main metric).

  `labels` and `predictions` are label ids (class index; 1 is the positive class for MRPC and QQP),
  or real scores for STS-B. Tasks outside GLUE (custom TSV/CSV tasks) get accuracy, or Pearson and
  Spearman when `predictions` are floats of a regression task.
  """
  # "SST-2", "sst2" and "sst_2" name the same task, as in run_classifier.
  key = task_name.lower().replace("-", "").replace("_", "")
  names = next((v for k, v in _GLUE_TASK_METRICS.items() if k.replace("-", "") == key), None)
  if names is None:
    is_real = np.asarray(predictions).dtype.kind == "f"
    names = ("pearson", "spearman") if is_real else ("accuracy",)
  return collections.OrderedDict((name, _METRIC_FUNCTIONS[name](labels, predictions))
                                 for name in names)


# --- Entity-level scores as conlleval counts them ---------------------------------------------


def _split_tag(tag, outside="O"):
  """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''). As in conlleval, the type is all after the first
  '-'."""
  if tag == outside:
    return "O", ""
  prefix, dash, kind = tag.partition("-")
  if not dash:
    return prefix, ""
  return prefix, kind


def _chunk_ends(prev_prefix, prefix, prev_type, kind):
  """Whether a chunk ended between the previous and the current token (conlleval's rules)."""
  if prev_prefix in ("E", "S", "[", "]"):
    return True
  if prev_prefix in ("B", "I") and prefix in ("B", "S", "O"):
    return True
  # A change of type closes the chunk, even with an I- tag (the IOB1 reading).
  return prev_prefix not in ("O", ".") and prev_type != kind


def _chunk_starts(prev_prefix, prefix, prev_type, kind):
  """Whether a chunk started at the current token (conlleval's rules)."""
  if prefix in ("B", "S", "[", "]"):
    return True
  # An I- (or E-) after O or after a finished chunk opens a new chunk: IOB1 input is accepted.
  if prev_prefix in ("E", "S", "O") and prefix in ("E", "I"):
    return True
  return prefix not in ("O", ".") and prev_type != kind


class ConllCounts:
  """Chunk and token counts accumulated over sentences, overall and per entity type."""

  def __init__(self):
    self.correct_chunks = 0
    self.found_correct = 0
    self.found_guessed = 0
    self.correct_tags = 0
    self.tokens = 0
    self.correct_by_type = collections.Counter()
    self.found_correct_by_type = collections.Counter()
    self.found_guessed_by_type = collections.Counter()


def conll_counts(true_sequences, pred_sequences, outside="O"):
  """Counts chunks over sentences of (gold, predicted) tags exactly as conlleval does.

  Sentences are separate lists; the break between them acts as an 'O' token (conlleval's blank
  line), so no chunk runs across sentences. A chunk is correct when gold and prediction start it on
  the same token with the same type and end it on the same token.
  """
  counts = ConllCounts()
  if len(true_sequences) != len(pred_sequences):
    raise ValueError(f"{len(true_sequences)} gold sentences but {len(pred_sequences)} predicted")
  for number, (gold_tags, pred_tags) in enumerate(zip(true_sequences, pred_sequences)):
    if len(gold_tags) != len(pred_tags):
      raise ValueError(f"sentence {number}: {len(gold_tags)} gold tags but {len(pred_tags)} "
                       f"predicted")
    # conlleval's state carries over sentence breaks, which are 'O O' tokens; starting each
    # sentence from 'O' and appending one boundary token at its end is the same thing.
    in_correct = False
    last_correct, last_correct_type = "O", ""
    last_guessed, last_guessed_type = "O", ""
    items = [(_split_tag(g, outside), _split_tag(p, outside), True)
             for g, p in zip(gold_tags, pred_tags)]
    items.append((("O", ""), ("O", ""), False))
    for (correct, correct_type), (guessed, guessed_type), is_token in items:
      end_correct = _chunk_ends(last_correct, correct, last_correct_type, correct_type)
      end_guessed = _chunk_ends(last_guessed, guessed, last_guessed_type, guessed_type)
      start_correct = _chunk_starts(last_correct, correct, last_correct_type, correct_type)
      start_guessed = _chunk_starts(last_guessed, guessed, last_guessed_type, guessed_type)
      if in_correct:
        if end_correct and end_guessed and last_guessed_type == last_correct_type:
          in_correct = False
          counts.correct_chunks += 1
          counts.correct_by_type[last_correct_type] += 1
        elif end_correct != end_guessed or guessed_type != correct_type:
          in_correct = False
      if start_correct and start_guessed and guessed_type == correct_type:
        in_correct = True
      if start_correct:
        counts.found_correct += 1
        counts.found_correct_by_type[correct_type] += 1
      if start_guessed:
        counts.found_guessed += 1
        counts.found_guessed_by_type[guessed_type] += 1
      if is_token:
        if correct == guessed and guessed_type == correct_type:
          counts.correct_tags += 1
        counts.tokens += 1
      last_correct, last_correct_type = correct, correct_type
      last_guessed, last_guessed_type = guessed, guessed_type
    # The boundary token closes every chunk, so in_correct is settled here.
  return counts


def _precision_recall_f1(correct, guessed, gold):
  precision = correct / guessed if guessed else 0.0
  recall = correct / gold if gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return precision, recall, f1


def conll_evaluate(true_sequences, pred_sequences, outside="O"):
  """Entity-level precision, recall, F1 (and token accuracy, per-type scores), as conlleval.

  Returns an ordered dict: precision, recall, f1, accuracy, and `per_type` mapping each entity type
  to its (precision, recall, f1, found-guessed count) dict. Fractions, not percentages.
  """
  counts = conll_counts(true_sequences, pred_sequences, outside)
  precision, recall, f1 = _precision_recall_f1(counts.correct_chunks, counts.found_guessed,
                                               counts.found_correct)
  result = collections.OrderedDict(
      precision=precision, recall=recall, f1=f1,
      accuracy=counts.correct_tags / counts.tokens if counts.tokens else 0.0)
  per_type = collections.OrderedDict()
  for kind in sorted(set(counts.found_correct_by_type) | set(counts.found_guessed_by_type)):
    p, r, f = _precision_recall_f1(counts.correct_by_type[kind], counts.found_guessed_by_type[kind],
                                   counts.found_correct_by_type[kind])
    per_type[kind] = collections.OrderedDict(precision=p, recall=r, f1=f,
                                             found=counts.found_guessed_by_type[kind])
  result["per_type"] = per_type
  result["counts"] = counts
  return result


def conll_report(result):
  """conlleval's text report (percentages) for a `conll_evaluate` result."""
  counts = result["counts"]
  lines = [
      f"processed {counts.tokens} tokens with {counts.found_correct} phrases; "
      f"found: {counts.found_guessed} phrases; correct: {counts.correct_chunks}.",
      f"accuracy: {100 * result['accuracy']:6.2f}%; precision: {100 * result['precision']:6.2f}%; "
      f"recall: {100 * result['recall']:6.2f}%; FB1: {100 * result['f1']:6.2f}",
  ]
  for kind, scores in result["per_type"].items():
    lines.append(f"{kind:>17}: precision: {100 * scores['precision']:6.2f}%; "
                 f"recall: {100 * scores['recall']:6.2f}%; FB1: {100 * scores['f1']:6.2f}  "
                 f"{scores['found']}")
  return "\n".join(lines)
