"""Evaluation during training (fine-tuning's --eval_every_steps): the dev metrics at each
evaluation, logged and written as TensorBoard scalars; the best checkpoint by a chosen metric kept
in output_dir/best/ (a whole model folder) with the record of every evaluation in
best_checkpoint.json, so a resumed run keeps its best model and its patience; early stopping
(--early_stopping_patience); and the best checkpoint restored for evaluating and predicting.

fine_tuning.eval_during_training builds it from a script's settings; Trainer.train calls it.
"""

import json
import os

from absl import logging
import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import fileio
from bert_tf2 import run_dir


def metric_key(name):
  """A dev metric as eval_results.txt names it: "accuracy" and "eval_accuracy" are the same."""
  return name if name.startswith("eval_") else f"eval_{name}"


class EvalDuringTraining:
  """`Trainer.train`'s `evaluate(step)`: evaluates the model on dev (`evaluate()` returns the
  eval_* metrics, as eval_results.txt has them), logs them and writes them as TensorBoard scalars
  (output_dir/eval, beside train/); with `metric` keeps the best checkpoint by it (lower is better
  for a loss) in output_dir/best/ (a whole model folder: the checkpoint, bert_config.json,
  vocab.txt, task.json), and with `patience` stops training after that many evaluations in a row
  without improvement.

  Every evaluation, the best value and step and the count of evaluations without improvement are
  kept in output_dir/best_checkpoint.json (written atomically after best/), so a run killed and
  resumed keeps its best model and its patience: the step it resumes at, always a saved
  checkpoint, is evaluated again only if it was not before.
  """

  def __init__(self, trainer, output_dir, evaluate, metric=None, patience=None,
               metric_names=None, model_files=(run_dir.CONFIG_FILE, run_dir.VOCAB_FILE, run_dir.TASK_FILE)):
    self.trainer, self.output_dir, self._evaluate = trainer, output_dir, evaluate
    self.metric = metric_key(metric) if metric else None  # (flags checked: check_eval_flags)
    if self.metric and metric_names is not None and self.metric not in metric_names:
      raise fileio.InputError(f"--keep_best_checkpoint_metric={metric}: this task's dev metrics "
                              f"are {', '.join(sorted(metric_names))}")
    self.patience = patience
    self.lower_is_better = bool(self.metric) and self.metric.endswith("loss")
    self.model_files = model_files
    _check_best_directory_is_free(output_dir)
    self.state_path = run_dir.best_state_file(output_dir)
    self.state = read_best_state(output_dir) or {"metric": self.metric, "best_value": None,
                                                 "best_step": None, "without_improvement": 0,
                                                 "evaluations": []}
    if self.metric and self.state.get("metric") not in (None, self.metric):
      raise fileio.InputError(
          f"{self.state_path}: this run's best checkpoint is kept by {self.state['metric']}, not "
          f"{self.metric}; keep that metric, or start in another --output_dir")
    self.state["metric"] = self.state.get("metric") or self.metric
    self.writer = None

  def _stop(self):
    return self.patience is not None and self.state["without_improvement"] >= self.patience

  def __call__(self, step):
    if any(e["step"] == step for e in self.state["evaluations"]):
      return self._stop()  # a resumed run at a step evaluated before
    last = self.trainer.last_checkpoint
    if not (last and last.endswith(f"ckpt-{step}")):
      last = self.trainer.save()  # best/ copies a checkpoint of exactly this step
    summary = self._evaluate()
    entry = {"step": step, **{k: float(v) for k, v in summary.items()
                              if k.startswith("eval_") and isinstance(v, (int, float))}}
    if self.trainer.is_chief:
      if self.writer is None:
        self.writer = tf.summary.create_file_writer(os.path.join(self.output_dir, "eval"))
      with self.writer.as_default(step=step):
        for key, value in entry.items():
          if key != "step":
            tf.summary.scalar(key, value)
      self.writer.flush()
    note = ""
    if self.metric:
      if self.metric not in entry:
        raise fileio.InputError(f"--keep_best_checkpoint_metric={self.metric}: the dev metrics "
                                f"are {', '.join(k for k in sorted(entry) if k != 'step')}")
      value, best = entry[self.metric], self.state["best_value"]
      if best is None or (value < best if self.lower_is_better else value > best):
        if self.trainer.is_chief and last:
          self._keep(last, step)
        self.state.update(best_value=value, best_step=step, without_improvement=0)
      else:
        self.state["without_improvement"] += 1
      note = (f" (best {self.metric}={self.state['best_value']:.4g} at step "
              f"{self.state['best_step']}" + (f"; {self.state['without_improvement']} of "
                                               f"{self.patience} evaluations without improvement"
                                               if self.patience is not None else "") + ")")
    self.state["evaluations"].append(entry)
    if self.trainer.is_chief:
      with fileio.open_atomic(self.state_path) as f:
        json.dump(self.state, f, indent=1)
    shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(entry.items()) if k != "step")
    logging.info("Dev at step %d: %s%s", step, shown, note)
    if self._stop():
      logging.info("Early stopping at step %d: %d evaluations without improvement of %s (best "
                   "%.4g at step %d)", step, self.state["without_improvement"], self.metric,
                   self.state["best_value"], self.state["best_step"])
      return True
    return False

  def _keep(self, checkpoint, step):
    """Copies checkpoint `checkpoint` (of `step`) and the model files into output_dir/best/,
    replacing the earlier best only once the new one is complete."""
    best = run_dir.best_directory(self.output_dir)
    with fileio.atomic_directory(best, replaceable=is_best_directory, flag="output_dir") as staging:
      for path in fileio.glob_files(fileio.escape(checkpoint) + ".*"):
        target = os.path.join(staging, os.path.basename(path))
        try:  # checkpoint files are never rewritten: a hard link costs no space and no time
          os.link(path, target)
        except OSError:
          fileio.copy_file(path, target)
      with open(run_dir.state_file(staging), "w", encoding="utf-8") as f:
        f.write(f'model_checkpoint_path: "ckpt-{step}"\n'
                f'all_model_checkpoint_paths: "ckpt-{step}"\n')
      for name in self.model_files:
        path = os.path.join(self.output_dir, name)
        if fileio.exists(path):
          fileio.copy_file(path, os.path.join(staging, name))


def _check_best_directory_is_free(output_dir):
  """InputError, before training, when output_dir/best/ could not take the best checkpoint: a
  file, a symbolic link, or a folder holding something else than a best checkpoint (a user's
  files would otherwise be found in the way at the first evaluation, after training had run)."""
  best = run_dir.best_directory(output_dir)
  if not fileio.is_remote(best) and os.path.islink(best):
    raise fileio.InputError(f"{best} is a symbolic link; the best checkpoint is kept in a folder "
                            "of this run's own there: remove the link, or choose another "
                            "--output_dir")
  if not fileio.exists(best):
    return
  if not fileio.isdir(best):
    raise fileio.InputError(f"{best} is a file; the best checkpoint is kept in a folder of that "
                            "name: move the file, or choose another --output_dir")
  if fileio.listdir(best) and not is_best_directory(best):
    raise fileio.InputError(f"{best} holds files that are not a best checkpoint of this run; it "
                            "would be replaced by one: move them, or choose another --output_dir")


def is_best_directory(path):
  """Whether `path` holds what EvalDuringTraining keeps (a `checkpoint` file and ckpt-N files)."""
  names = fileio.listdir(path)
  return "checkpoint" in names and any(n.startswith("ckpt-") for n in names)


# The record and the folder of the best checkpoint are checkpoints.py's (every script that reads a
# run folder takes its best checkpoint by the same rule).
read_best_state = checkpoints.read_best_state


def best_checkpoint(output_dir):
  """(path, step, metric, value) of the best checkpoint output_dir/best/ holds, or None when the
  run kept none; InputError when its record names one that is missing or damaged."""
  return checkpoints.best_checkpoint(
      output_dir, instead="--nouse_best_checkpoint (evaluate and predict with the latest)")


def restore_best(trainer, output_dir):
  """Loads the weights of output_dir/best/ into the trainer's model when a best checkpoint was
  kept (for evaluating and predicting with it); returns its step, or None."""
  found = best_checkpoint(output_dir)
  if not found:
    return None
  path, step, metric, value = found
  try:
    status = tf.train.Checkpoint(model=trainer.model).restore(path).expect_partial()
    status.assert_existing_objects_matched()
  except AssertionError as e:  # another model's variables, or shapes that differ
    raise fileio.InputError(f"{path}: the best checkpoint does not fit this model (another task's "
                            f"or another config's?): {str(e).strip().splitlines()[0][:200]}; "
                            "give --nouse_best_checkpoint to use the latest") from None
  except (tf.errors.OpError, ValueError, IndexError) as e:  # truncated or corrupt files
    raise checkpoints.damaged(path, e) from None
  logging.info("Using the best checkpoint %s (step %d, %s=%s)", path, step, metric, value)
  return step
