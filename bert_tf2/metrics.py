"""Task metrics for fine-tuning, computed the way the GLUE and CoNLL-2003 leaderboards report them.

GLUE scores each task with a fixed metric: Matthews correlation for CoLA, F1 of the positive class
and accuracy for MRPC and QQP, Pearson and Spearman correlation for STS-B, accuracy for the rest.
`glue_metrics` returns exactly that set per task, so a dev number printed here is the number a
paper or the leaderboard would quote. NER is scored on entities, not tokens, with the counting of
the CoNLL `conlleval` script (`conll_evaluate`), including its tolerance of IOB1 tags.

All values are fractions in [0, 1] (multiply by 100 for the leaderboard's percentages). Everything
is plain numpy so the metrics can run anywhere, without scipy or scikit-learn. SQuAD is scored by
the official v1.1 and v2.0 rules (`evaluate_v1`, `evaluate_v2`), for run_squad.py and the
standalone evaluate_squad.py.
"""

import collections
import dataclasses
import re
import string

from absl import logging
import numpy as np

from bert_tf2 import errors


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
  n = confusion.sum()
  gold_counts = confusion.sum(axis=1)  # examples per true class
  guess_counts = confusion.sum(axis=0)  # examples per predicted class
  # With s_k = gold_counts, p_k = guess_counts and c = correct predictions:
  # MCC = (c*n - sum s_k p_k) / sqrt((n^2 - sum p_k^2) (n^2 - sum s_k^2)).
  agreement = np.trace(confusion) * n - np.dot(gold_counts, guess_counts)
  guess_spread = n**2 - np.dot(guess_counts, guess_counts)
  gold_spread = n**2 - np.dot(gold_counts, gold_counts)
  if guess_spread * gold_spread == 0:
    return 0.0
  return float(agreement / np.sqrt(gold_spread * guess_spread))


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


def cross_entropy(probabilities, labels):
  """Mean negative log-likelihood of the integer `labels` under rows of class `probabilities`
  (the evaluation loss of a classifier's predictions; a probability of 0 counts as 1e-30)."""
  probabilities = np.asarray(probabilities)
  chosen = probabilities[np.arange(len(labels)), np.asarray(labels).astype(int)]
  return float(-np.mean(np.log(np.maximum(chosen, 1e-30))))


def weighted_nll(logits, labels, weights):
  """(sum of the weighted negative log-likelihoods of integer `labels` under softmax(`logits`)
  over the last axis, sum of the weights): a token-level evaluation loss in numpy, where padding
  and unlabelled positions weigh 0."""
  logits = np.asarray(logits, np.float64)
  log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  gold = np.take_along_axis(log_probs, np.asarray(labels)[..., None].astype(int), axis=-1)[..., 0]
  weights = np.asarray(weights, np.float64)
  return float(-(gold * weights).sum()), float(weights.sum())


def glue_metric_names(task_name, is_regression=False):
  """The names glue_metrics gives a task's metrics (a custom task: accuracy, or Pearson and
  Spearman for a regression)."""
  key = task_name.lower().replace("-", "").replace("_", "")
  names = next((v for k, v in _GLUE_TASK_METRICS.items() if k.replace("-", "") == key), None)
  if names is None:
    names = ("pearson", "spearman") if is_regression else ("accuracy",)
  return tuple(names)


def glue_metrics(task_name, labels, predictions):
  """The leaderboard metrics of a GLUE task as an ordered dict (first entry is the main metric).

  `labels` and `predictions` are label ids (class index; 1 is the positive class for MRPC and QQP),
  or real scores for STS-B. Tasks outside GLUE (custom TSV/CSV tasks) get accuracy, or Pearson and
  Spearman when `predictions` are floats of a regression task.
  """
  # "SST-2", "sst2" and "sst_2" name the same task, as in run_classifier.
  names = glue_metric_names(task_name, np.asarray(predictions).dtype.kind == "f")
  return collections.OrderedDict((name, _METRIC_FUNCTIONS[name](labels, predictions))
                                 for name in names)


# --- Multi-label classification --------------------------------------------------------------


# The summary names multi_label_metrics returns.
MULTI_LABEL_METRICS = ("macro_f1", "micro_f1", "exact_match", "micro_precision", "micro_recall",
                       "macro_precision", "macro_recall")


def binary_cross_entropy(probabilities, labels):
  """Mean binary cross-entropy of 0/1 `labels` [examples, labels] under independent
  `probabilities` of the same shape, over every label of every example (torch's
  BCEWithLogitsLoss); a probability of 0 or 1 counts as 1e-30 away from it."""
  p = np.asarray(probabilities, np.float64)
  y = np.asarray(labels, np.float64)
  return float(-np.mean(y * np.log(np.maximum(p, 1e-30))
                        + (1 - y) * np.log(np.maximum(1 - p, 1e-30))))


def _label_counts(labels, predicted):
  """Per label (true positives, false positives, false negatives) of 0/1 [examples, labels]."""
  labels = np.asarray(labels).astype(bool)
  predicted = np.asarray(predicted).astype(bool)
  return ((labels & predicted).sum(0), (~labels & predicted).sum(0),
          (labels & ~predicted).sum(0))


def _ratio(numerator, denominator):
  """numerator / denominator, 0 where the denominator is 0 (scikit-learn's zero_division=0)."""
  numerator = np.asarray(numerator, np.float64)
  denominator = np.asarray(denominator, np.float64)
  return np.divide(numerator, denominator, out=np.zeros_like(numerator),
                   where=denominator > 0)


def multi_label_metrics(labels, probabilities, thresholds=0.5):
  """The scores of a multi-label classifier: a label is predicted when its probability is above
  its threshold (one for all, or one per label).

  Returns (summary, per_label): summary has micro_f1 (over every example-label decision), macro_f1
  (the unweighted mean of the labels' F1; a label with no true and no predicted example counts 0,
  as scikit-learn's f1_score(average="macro") does), micro and macro precision / recall, and
  exact_match (examples whose whole label set is right); per_label is a list of dicts (precision,
  recall, f1, support, predicted, threshold) in label order.
  """
  labels = np.asarray(labels)
  probabilities = np.asarray(probabilities)
  if labels.shape != probabilities.shape or labels.ndim != 2:
    raise ValueError(f"labels {labels.shape} and probabilities {probabilities.shape} must be "
                     "[examples, labels] alike")
  thresholds = np.broadcast_to(np.asarray(thresholds, np.float64), labels.shape[1:])
  predicted = probabilities > thresholds
  tp, fp, fn = _label_counts(labels, predicted)
  precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
  f1 = _ratio(2 * tp, 2 * tp + fp + fn)
  summary = collections.OrderedDict(
      macro_f1=float(f1.mean()),
      micro_f1=float(_ratio(2 * tp.sum(), 2 * tp.sum() + fp.sum() + fn.sum())),
      exact_match=float(np.mean(np.all(predicted == labels.astype(bool), axis=1))),
      micro_precision=float(_ratio(tp.sum(), tp.sum() + fp.sum())),
      micro_recall=float(_ratio(tp.sum(), tp.sum() + fn.sum())),
      macro_precision=float(precision.mean()),
      macro_recall=float(recall.mean()))
  per_label = [dict(precision=float(precision[i]), recall=float(recall[i]), f1=float(f1[i]),
                    support=int(tp[i] + fn[i]), predicted=int(tp[i] + fp[i]),
                    threshold=float(thresholds[i])) for i in range(labels.shape[1])]
  return summary, per_label


def at_the_floor(labels, predicted):
  """A warning (one line) when dev predictions score no better than a model that learnt nothing,
  else None. `labels` and `predicted` are class ids [examples] (single-label: the floor is always
  predicting the most frequent class) or 0/1 rows [examples, labels] (multi-label: the floor is
  predicting no label, micro F1 0)."""
  labels, predicted = np.asarray(labels), np.asarray(predicted)
  if labels.ndim == 2:
    tp, _, _ = _label_counts(labels.astype(bool), predicted.astype(bool))
    if labels.any() and tp.sum() == 0:
      return ("dev micro F1 is 0: the model predicts no true label (the all-negative floor), so "
              "it has learnt nothing usable yet; train longer (--num_train_epochs), check "
              "--learning_rate and --init_checkpoint" + _POOLER_HINT)
    return None
  if labels.size == 0:
    return None
  counts = np.bincount(labels)
  majority = counts.max() / labels.size
  accuracy = float(np.mean(labels == predicted))
  if len(counts) > 1 and accuracy <= majority:
    return (f"dev accuracy {accuracy:.4f} is no better than always predicting the most frequent "
            f"class ({majority:.4f}): the model has learnt nothing usable yet; train longer "
            "(--num_train_epochs), check --learning_rate and --init_checkpoint" + _POOLER_HINT)
  return None


# The likeliest cause with a checkpoint made for sentence embeddings (MiniLM on MRPC: always
# "paraphrase"): its [CLS] pooler, which the default classifier reads, was never trained.
_POOLER_HINT = ("; a checkpoint whose [CLS] pooler was never trained (a sentence-embedding "
                "model) learns with --classifier_pooling=mean")


def tune_thresholds(labels, probabilities, default=0.5, grid=None):
  """Each label's threshold (from `grid`, default 0.01 ... 0.99) that maximises its F1 on these
  examples; among equal F1 the one nearest `default`, and `default` for a label with no true
  example (no F1 to gain there but false positives).

  Never worse than not tuning, and never a label on every example: a threshold at which a label
  fires for every example (unless every example has it) is no candidate, however its F1 (an
  untrained model's best F1 is often "always": 2p / (1 + p) for a label of prior p); a label keeps
  `default` unless a threshold beats its F1 there and by a tenth that of "always"; and if the tuned
  set's micro F1 is below the default's, every label keeps `default`."""
  labels = np.asarray(labels).astype(bool)
  probabilities = np.asarray(probabilities)
  grid = np.round(np.arange(1, 100) / 100, 2) if grid is None else np.asarray(grid, np.float64)
  # Nearest the default first, so that argmax's first maximum is the nearest among ties.
  grid = grid[np.argsort(np.abs(grid - default), kind="stable")]
  scores = np.stack([_ratio(2 * tp, 2 * tp + fp + fn) for tp, fp, fn in (
      _label_counts(labels, probabilities > t) for t in grid)])
  fires_always = np.stack([(probabilities > t).all(axis=0) for t in grid])
  scores = np.where(fires_always & ~labels.all(axis=0), -1.0, scores)
  tp, fp, fn = _label_counts(labels, probabilities > default)
  at_default = _ratio(2 * tp, 2 * tp + fp + fn)
  # What a threshold must beat: the default's F1, and by a tenth predicting the label on every
  # example (F1 2p / (1 + p) for a label of frequency p), which needs no model. A threshold no
  # better has found no signal, only the label's prior (noise around the prior beat it by a
  # hair, by chance, firing on nearly every example).
  frequency = labels.mean(axis=0)
  trivial = 2 * frequency / (1 + frequency)
  best = np.argmax(scores, axis=0)
  # (A label every example has: "always" is its right answer.)
  required = np.where(frequency < 1, np.maximum(at_default, 1.1 * trivial), at_default)
  improves = scores[best, np.arange(labels.shape[1])] > required
  tuned = np.where(labels.any(axis=0) & improves, grid[best], default)
  micro = lambda thresholds: multi_label_metrics(labels, probabilities, thresholds)[0]["micro_f1"]
  if micro(tuned) < micro(default):
    return np.full(labels.shape[1], default, np.float64)
  return tuned


# --- Entity-level scores as conlleval counts them ---------------------------------------------

# conlleval's chunk boundaries depend on the tag prefix (B, I, E, S, O, and the rarely used '.',
# '[' and ']') and on whether the entity type changes. The rules below are its rules; no chunk
# runs across a sentence break.


def _split_tag(tag, outside="O"):
  """A tag as (prefix, entity type): 'B-PER' -> ('B', 'PER'), the outside tag -> ('O', '').

  The type is everything after the first '-' (so 'B-A-B' has type 'A-B'); a tag without '-' has
  the empty type.
  """
  if tag == outside:
    return "O", ""
  prefix, _, kind = tag.partition("-")
  return prefix, kind


def _chunk_ends(prev_prefix, prefix, prev_type, kind):
  """True when the token before the current one was the last token of a chunk."""
  if prev_prefix in ("E", "S", "[", "]"):
    return True
  if prev_prefix in ("B", "I") and prefix in ("B", "S", "O"):
    return True
  # A new type closes the chunk even when the tag says I- (tags are read as IOB1 allows).
  return prev_prefix not in ("O", ".") and prev_type != kind


def _chunk_starts(prev_prefix, prefix, prev_type, kind):
  """True when the current token is the first token of a chunk."""
  if prefix in ("B", "S", "[", "]"):
    return True
  # IOB1 input: I- (or E-) right after O or after a chunk's last token begins a chunk.
  if prev_prefix in ("E", "S", "O") and prefix in ("E", "I"):
    return True
  return prefix not in ("O", ".") and prev_type != kind


class _ChunkTracker:
  """Walks one tag sequence (gold or predicted) and reports where its chunks begin and end."""

  def __init__(self):
    self.prefix = "O"
    self.kind = ""

  def step(self, prefix, kind):
    """Moves on to a token; returns (chunk closed before it, chunk opens at it, previous type)."""
    closed = _chunk_ends(self.prefix, prefix, self.kind, kind)
    opened = _chunk_starts(self.prefix, prefix, self.kind, kind)
    previous_kind = self.kind
    self.prefix, self.kind = prefix, kind
    return closed, opened, previous_kind


@dataclasses.dataclass
class ConllCounts:
  """Chunk and token counts accumulated over sentences, overall and per entity type.

  correct_chunks: chunks predicted exactly (same first token, last token and type) as in the gold
  tags; found_correct: chunks in the gold tags; found_guessed: chunks in the predictions;
  correct_tags / tokens: token-level tag accuracy.
  """
  correct_chunks: int = 0
  found_correct: int = 0
  found_guessed: int = 0
  correct_tags: int = 0
  tokens: int = 0
  correct_by_type: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  found_correct_by_type: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)
  found_guessed_by_type: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)


def conll_counts(true_sequences, pred_sequences, outside="O"):
  """Counts chunks and tags over sentences of (gold, predicted) tags with conlleval's rules.

  Each sentence is scored from a fresh 'outside' state and followed by one extra 'outside'
  position, which is how conlleval's blank line between sentences acts; so no chunk spans two
  sentences.
  """
  if len(true_sequences) != len(pred_sequences):
    raise ValueError(f"{len(true_sequences)} gold sentences but {len(pred_sequences)} predicted")
  counts = ConllCounts()
  sentence_end = ("O", "")
  for number, (gold_tags, pred_tags) in enumerate(zip(true_sequences, pred_sequences)):
    if len(gold_tags) != len(pred_tags):
      raise ValueError(f"sentence {number}: {len(gold_tags)} gold tags but {len(pred_tags)} "
                       f"predicted")
    gold, pred = _ChunkTracker(), _ChunkTracker()
    # True while a gold and a predicted chunk that opened on the same token with the same type
    # are both still open and have agreed on every token so far.
    aligned = False
    positions = [(_split_tag(g, outside), _split_tag(p, outside))
                 for g, p in zip(gold_tags, pred_tags)]
    positions.append((sentence_end, sentence_end))
    for index, (gold_tag, pred_tag) in enumerate(positions):
      gold_closed, gold_opened, gold_before = gold.step(*gold_tag)
      pred_closed, pred_opened, pred_before = pred.step(*pred_tag)
      if aligned:
        if gold_closed and pred_closed and gold_before == pred_before:
          counts.correct_chunks += 1
          counts.correct_by_type[gold_before] += 1
          aligned = False
        elif gold_closed != pred_closed or gold_tag[1] != pred_tag[1]:
          aligned = False
      if gold_opened:
        counts.found_correct += 1
        counts.found_correct_by_type[gold_tag[1]] += 1
      if pred_opened:
        counts.found_guessed += 1
        counts.found_guessed_by_type[pred_tag[1]] += 1
      if gold_opened and pred_opened and gold_tag[1] == pred_tag[1]:
        aligned = True
      if index < len(gold_tags):
        counts.tokens += 1
        if gold_tag == pred_tag:
          counts.correct_tags += 1
    # The sentence-end position closes every chunk, so nothing is left aligned here.
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


# === SQuAD: the official v1.1 and v2.0 scores ===================================================

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


def squad_questions(dataset):
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
  return any("is_impossible" in qa for qa in squad_questions(dataset_json["data"]))


# --- v1.1 -------------------------------------------------------------------------------------


def _warn_missing(dataset, predictions):
  """One warning for the questions without a prediction (they score 0); an InputError when no
  prediction matches a question (the wrong predictions or data file)."""
  qids = [qa["id"] for qa in squad_questions(dataset)]
  missing = [qid for qid in qids if qid not in predictions]
  if qids and len(missing) == len(qids):
    raise errors.InputError("no prediction matches a question of the data file")
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
  for qa in squad_questions(dataset):
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
  return {qa["id"]: bool(qa["answers"]) for qa in squad_questions(dataset)}


def _scores_v2(dataset, predictions):
  """Per-question (exact, F1) dicts for the predicted questions, before any no-answer threshold.

  Only gold answers that still say something after normalization count; when none does, the
  empty string is the one correct answer. Questions without a prediction get no entry here.
  """
  exact = {}
  f1 = {}
  for qa in squad_questions(dataset):
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
      raise errors.InputError(f"no-answer probabilities have no entry for question {qid}")
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
