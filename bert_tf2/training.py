"""The one training / evaluation / prediction loop every script shares, on tf.distribute.

A task gives three things: a model (a tf.Module called as `model(features, training,
dropout_seed)` -> dict of outputs; one that also takes `inference_weights`, as modeling's models
do, is given its weights cast once per evaluation or prediction), a `loss_fn(features, outputs)`
-> {name: (sum, count)} and a `dataset_fn(input_context)` -> tf.data.Dataset of per-replica
batches. This module does the rest: the strategy (default, one_device, mirrored,
multi_worker_mirrored, tpu), mixed precision, XLA, gradient accumulation, checkpoints with
automatic resume, SIGTERM handling, non-finite detection, TensorBoard scalars and a progress line;
on a CPU, prediction and evaluation batches run as two halves side by side
(devices.prediction_streams).

Losses are sums divided by the *global* count (all replicas), so a loss and its gradient do not
depend on how a batch is split across devices: one worker with batch 32 and two with 16 each take
the same step. Names ending in `_loss` are added into the training loss; the others are metrics
(e.g. accuracy = correct / count).
"""

import contextlib
import dataclasses
import gc
import inspect
import os
import re
import signal
import time

import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf2 import devices
from bert_tf2 import errors
from bert_tf2 import fileio
from bert_tf2 import input_pipeline
from bert_tf2 import modeling
from bert_tf2 import optimization
from bert_tf2 import processes
from bert_tf2 import run_dir
from bert_tf2 import weight_copies


# (Its home is errors.py; the name stays for callers.)
TrainingError = errors.TrainingError


@dataclasses.dataclass(frozen=True)
class Settings:
  """The knobs of a training run, one field per flag of script_flags' training group (each
  field's name is its flag's; script_flags.settings builds the record from the flags in one
  line). Plain values: `optimizer_for` and `Trainer.from_settings` read them, the scripts pass
  them on. fine_tuning.Settings adds the fine-tuning scripts' knobs."""

  output_dir: str | None = None
  train_batch_size: int = 32
  eval_batch_size: int = 8
  learning_rate: float = 5e-5
  gradient_accumulation_steps: int = 1  # micro-batches per optimizer step
  gradient_checkpointing: bool = False  # recompute each layer in the backward pass
  optimizer: str = "adamw"  # a key of optimization.OPTIMIZERS
  lr_schedule: str = "original"  # or decay_after_warmup (optimization.LinearWarmupLinearDecay)
  iterations_per_loop: int = 100  # steps inside one tf.function call, at most
  save_checkpoints_steps: int = 1000
  keep_checkpoint_max: int = 5
  max_nonfinite_loops: int = 3  # consecutive loops of non-finite losses that stop training
  use_xla: bool = False
  mixed_precision: str = "none"  # none, bf16, fp16, auto (devices.compute_dtype)
  seed: int = 12345
  # The flags set on the command line (script_flags.settings fills it in).
  given: frozenset = frozenset()


def optimizer_for(settings, learning_rate, num_train_steps, num_warmup_steps, time_budget=None):
  """The optimizer `settings` name (--optimizer) on --lr_schedule's warm-up and decay, over the
  steps or over `time_budget` (a time_budget.TimeBudget, given to train() too); fp16
  (--mixed_precision) also scales the loss dynamically (bf16 has float32's range and needs no
  scaling)."""
  loss_scale = (optimization.DynamicLossScale() if settings.mixed_precision == "fp16" else None)
  return optimization.create_optimizer(
      learning_rate, num_train_steps, num_warmup_steps, optimizer=settings.optimizer,
      loss_scale=loss_scale, decay_after_warmup=settings.lr_schedule == "decay_after_warmup",
      time_budget=time_budget)


def per_replica_batch_size(global_batch_size, strategy, flag_name, accumulation_steps=1):
  """Splits a global batch over replicas and accumulation steps, or explains why it can't."""
  parts = strategy.num_replicas_in_sync * accumulation_steps
  if global_batch_size % parts:
    raise fileio.InputError(
        f"--{flag_name}={global_batch_size} is not divisible by {strategy.num_replicas_in_sync} "
        f"replicas x {accumulation_steps} gradient accumulation steps")
  return global_batch_size // parts


def _is_chief(strategy):
  resolver = getattr(strategy, "cluster_resolver", None)
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
    return True
  return resolver.task_type in (None, "chief") or (
      resolver.task_type == "worker" and resolver.task_id == 0
      and "chief" not in resolver.cluster_spec().as_dict())


def _reduce_stats(strategy, per_replica):
  return {k: (strategy.reduce("SUM", s, axis=None), strategy.reduce("SUM", c, axis=None))
          for k, (s, c) in per_replica.items()}


def metrics_from_stats(stats):
  """{name: (sum, count)} -> {name: sum / count, "loss": sum of the *_loss values}."""
  values = {k: float(s) / max(float(c), 1e-12) for k, (s, c) in stats.items()}
  values["loss"] = sum(v for k, v in values.items() if k.endswith("_loss"))
  return values


class _StopSignals:
  """Turns SIGTERM and Ctrl-C (SIGINT) into a request to checkpoint and stop at the next loop
  boundary (`requested` names the signal). A second Ctrl-C stops at once (KeyboardInterrupt),
  for a user who will not wait for the loop to end."""

  def __init__(self):
    self.requested = None
    self._previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # not the main thread: leave signals alone
        break

  def _handle(self, signum, frame):
    del frame
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    name = signal.Signals(signum).name
    logging.warning("%s: saving a checkpoint and stopping after the current loop%s", name,
                    " (Ctrl-C again stops at once, without it)" if signum == signal.SIGINT else "")
    self.requested = name

  def restore(self):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)


def _remove_partial_saves(directory, steps=None):
  """Removes what interrupted saves left: TensorFlow stages checkpoint N in `ckpt-N_temp/` and
  writes the `checkpoint` state file through `checkpoint.tmp<hex>` (all steps when None)."""
  patterns = [f"ckpt-{n}_temp" for n in steps] if steps is not None else ["ckpt-*_temp",
                                                                          "checkpoint.tmp*"]
  for pattern in patterns:
    for path in fileio.glob_files(os.path.join(fileio.escape(directory), pattern)):
      fileio.remove_path(path)


def _repair_checkpoint_state(directory):
  """Rebuilds a `checkpoint` state file that cannot be read from the ckpt-N files present.

  TensorFlow takes an unreadable state file for none at all (or fails on an empty one): training
  would start again at step 0 and save over the trained checkpoints. Resuming goes by the files
  themselves (Trainer._restore_newest); the state file only tells which ones to rotate out.
  """
  state = run_dir.state_file(directory)
  numbers = run_dir.checkpoint_numbers(directory)
  if not fileio.exists(state) and not numbers:
    return
  try:
    problem = None if tf.train.get_checkpoint_state(directory) else "it cannot be parsed"
  except (ValueError, tf.errors.OpError) as e:
    problem = _first_line(e)
  if not fileio.exists(state):
    problem = "it is missing"
  if problem is None:
    return
  if not numbers:
    logging.warning("%s names no checkpoint file present (%s); removing it", state, problem)
    fileio.remove(state)
    return
  logging.warning("The checkpoint state file %s is missing or damaged (%s); rebuilt it from the "
                  "checkpoint files in the directory (newest: ckpt-%d)", state, problem, numbers[0])
  with fileio.open_atomic(state) as f:
    f.write(f'model_checkpoint_path: "ckpt-{numbers[0]}"\n')
    f.writelines(f'all_model_checkpoint_paths: "ckpt-{n}"\n' for n in reversed(numbers))


def _first_line(error):
  text = str(getattr(error, "message", None) or error).strip()
  return text.splitlines()[0] if text else type(error).__name__


# How a checkpoint's keys name the fp16 loss scale (optimizer.loss_scale: DynamicLossScale).
_LOSS_SCALE_KEY = "optimizer/loss_scale/"


def _check_same_loss_scaling(path, optimizer, directory):
  """InputError when checkpoint `path` and this run differ in fp16 loss scaling: resuming an fp16
  run without it left the loss scale unread (six TensorFlow warnings at exit), and the reverse
  failed on TensorFlow's "Python objects not bound". A checkpoint that cannot be listed is left to
  the restore, which reports it as damaged."""
  try:
    saved = any(name.startswith(_LOSS_SCALE_KEY) for name, _ in tf.train.list_variables(path))
  except (tf.errors.OpError, ValueError, IndexError):
    return
  ours = getattr(optimizer, "loss_scale", None) is not None
  if saved and not ours:
    raise fileio.InputError(
        f"{path} was written by an fp16 run (it holds a loss scale); resume --output_dir="
        f"{directory} with --mixed_precision=fp16, or choose a new --output_dir")
  if ours and not saved:
    raise fileio.InputError(
        f"{path} was written without fp16 loss scaling (--mixed_precision none or bf16); resume "
        f"--output_dir={directory} with that precision, not fp16, or choose a new --output_dir")


def _quiet_failed_restores():
  """A restore that failed part-way leaves TensorFlow's record of its unrestored values alive
  until the process exits, when it warns about them at length, after the error line; the error
  already says why. (TF's own switch for that warning is status.expect_partial(), out of reach
  when restore() itself raised.)"""
  for obj in gc.get_objects():
    if type(obj).__name__ == "_CheckpointRestoreCoordinatorDeleter":
      obj.set_expect_partial(True)


# TensorFlow's C++ warning as a mirrored strategy (one worker's devices, or several workers) makes
# an iterator: its per-device generator datasets are not rewritten by tf.data's optimizer, which
# is harmless and said once per iterator and worker. TF_CPP_MIN_LOG_LEVEL=0 shows it.
_ITERATOR_NOISE = re.compile(processes.cpp_log_line(
    "dataset", "Input of GeneratorDatasetOp::Dataset will not be optimized"))


def _iterator(distributed):
  """iter() of a distributed dataset, without _ITERATOR_NOISE on the console."""
  with processes.filtered_stderr(_ITERATOR_NOISE):
    return iter(distributed)


_LOCKED = set()


def lock_output_dir(directory):
  """One run at a time per output_dir: a second one would rotate out and save over the first
  one's checkpoints, or write its results into a folder whose model is changing under it. (A
  process may build several Trainers on one directory; a script that predicts without a Trainer,
  from a LiteRT model, takes it here.)"""
  real = fileio.real_path(directory)
  if real not in _LOCKED:
    fileio.lock_directory(directory)
    _LOCKED.add(real)


def _float32_sum(parts):
  """The float32 sum of one variable's gradient parts (tensors, and an IndexedSlices at most).

  The word embeddings' gradient is the tied output matrix's, dense, plus their gather's rows. The
  rows are added into the dense sum where they fall, summed per distinct row first, rather than
  made a dense table of their own (unsorted_segment_sum) and added whole: BERT-base's 30,522 x 768
  table's sum and its L2Loss 33 -> 28 ms on 2 cores of a Xeon with AMX (tensor_scatter_nd_add
  copies its input; benchmarks/log/2026-11-30.md). The same numbers: a row's gradients add up in
  the same order, and the two sums meet in one addition either way."""
  rows = [p for p in parts if isinstance(p, tf.IndexedSlices)]
  dense = [tf.cast(p, tf.float32) for p in parts if not isinstance(p, tf.IndexedSlices)]
  if len(rows) != 1 or not dense:
    return tf.add_n([tf.cast(tf.convert_to_tensor(p), tf.float32) for p in parts])
  ids, at = tf.unique(rows[0].indices)
  summed = tf.math.unsorted_segment_sum(tf.cast(rows[0].values, tf.float32), at, tf.size(ids))
  return tf.tensor_scatter_nd_add(tf.add_n(dense), ids[:, tf.newaxis], summed)


class Trainer:
  """Custom training loop: build once, then `train()`; `evaluate()` / `predict()` share it.

  With an output_dir, the Trainer locks it (a second run there is an InputError) and, when it
  holds checkpoints, restores the newest intact one at once, so that a checkpoint that does not
  fit the model is an error before a script writes anything there.
  """

  def __init__(self, strategy, model, loss_fn, optimizer=None, output_dir=None, use_xla=False,
               gradient_accumulation_steps=1, keep_checkpoint_max=5, seed=0, predict_streams=None,
               gradient_checkpointing=False):
    self.strategy = strategy
    # Training keeps only each Transformer layer's input for the backward pass and recomputes the
    # layer there (BertModel's gradient_checkpointing, which the model's encoder is told here).
    self.gradient_checkpointing = gradient_checkpointing
    if gradient_checkpointing:
      model.bert.gradient_checkpointing = True
    # predict() and evaluate() run a replica's batch as this many independent parts (None:
    # prediction_streams)
    self.predict_streams = (devices.prediction_streams(strategy) if predict_streams is None
                            else predict_streams)
    self.model = model
    self.loss_fn = loss_fn
    self.optimizer = optimizer
    self.output_dir = output_dir
    self.accumulation = gradient_accumulation_steps
    self.seed = seed
    self._use_xla = use_xla
    self._forward = tf.function(self._forward_impl, jit_compile=use_xla)
    self._step = tf.function(self._one_step)
    self._predict_forward = tf.function(self._inference, jit_compile=use_xla)
    # A model that takes them (modeling.InferenceWeights) is given its weights cast once per
    # evaluate() / predict() (each replica its own), not at every batch.
    self._takes_inference_weights = "inference_weights" in inspect.signature(model).parameters
    self._cast_weights = tf.function(self._replica_cast_weights)
    # Inference's bf16 matrices in the layout oneDNN's AMX kernels read fastest (cast_weights).
    self._transposed_weights = not use_xla and devices.amx_matmul()
    # Inference's LayerNorm as oneDNN's kernel where TensorFlow runs oneDNN (kernels.layer_norm).
    self._onednn_layer_norm = not use_xla and devices.onednn_cpu()
    # (A model's `unused_variables`, reached by no loss, are left as they are: no zero gradient,
    # no weight decay.)
    unused = {id(v) for v in getattr(model, "unused_variables", ())}
    self.variables = [v for v in model.trainable_variables if id(v) not in unused]
    # A bf16 / fp16 model reads compute-dtype copies of its weights that the optimizer's update
    # writes, instead of casting them at every use (weight_copies). Not with gradient
    # checkpointing, whose recomputed layers read the variables themselves.
    self.copies = None
    if optimizer is not None:
      with strategy.scope():
        optimizer.build(self.variables)
        if self._takes_inference_weights and not gradient_checkpointing:
          self.copies = weight_copies.WeightCopies.for_training(
              model, self.variables, weight_copies.compute_dtype(model))
    self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer) if optimizer else None
    self.manager = None
    self.last_checkpoint = None  # the newest checkpoint known to be whole
    self._initialized = False
    self._output_dir = output_dir
    if output_dir and self.checkpoint is not None:
      if _is_chief(strategy):
        directory = output_dir
        fileio.check_outputs(directories=[("output_dir", directory)])
        lock_output_dir(directory)
        _remove_partial_saves(directory)
        _repair_checkpoint_state(directory)
      else:
        # The other workers take part in every save (it is collective) into a scratch
        # directory, made by the save and removed after it.
        directory = os.path.join(output_dir, f".worker_tmp_{strategy.cluster_resolver.task_id}")
      self.manager = tf.train.CheckpointManager(self.checkpoint, directory,
                                                max_to_keep=keep_checkpoint_max,
                                                step_counter=optimizer.iterations)
      self.last_checkpoint = self._restore_newest()
      self._initialized = self.last_checkpoint is not None

  @classmethod
  def from_settings(cls, strategy, model, loss_fn, optimizer, settings):
    """A Trainer with the knobs of `settings` (a training.Settings): output_dir (locked, its
    newest checkpoint restored), XLA, gradient accumulation and checkpointing, checkpoints kept,
    the dropout seed."""
    return cls(strategy, model, loss_fn, optimizer, output_dir=settings.output_dir,
               use_xla=settings.use_xla,
               gradient_accumulation_steps=settings.gradient_accumulation_steps,
               keep_checkpoint_max=settings.keep_checkpoint_max, seed=settings.seed,
               gradient_checkpointing=settings.gradient_checkpointing)

  def _replica_cast_weights(self):
    if not self._takes_inference_weights:
      return []
    return self.strategy.run(modeling.cast_weights,
                             args=(self.model, self._transposed_weights))

  def _inference(self, features, weights):
    """The model's outputs; `weights` (the copies `_cast_weights` made) are an argument of the
    traced step, so a later evaluate() / predict() reads the weights of its moment."""
    if not self._takes_inference_weights:
      return self.model(features, training=False)
    return self.model(features, training=False, inference_weights=modeling.InferenceWeights(
        self.model, weights,
        bf16_softmax=not self._use_xla and devices.bf16_accumulates_in_float32(),
        transposed=self._transposed_weights, onednn_layer_norm=self._onednn_layer_norm))

  # --- one step ---------------------------------------------------------------------------

  def _forward_impl(self, features, dropout_seed):
    if self.copies is None:
      outputs = self.model(features, training=True, dropout_seed=dropout_seed)
    else:
      outputs = self.model(features, training=True, dropout_seed=dropout_seed,
                           inference_weights=self.copies)
    return self.loss_fn(features, outputs)

  def _replica_step(self, stack):
    """One optimizer step on this replica's `accumulation` micro-batches (leading axis)."""
    ctx = tf.distribute.get_replica_context()
    step = self.optimizer.iterations
    grads, totals = None, None
    # Each variable's copy or None, aligned with self.variables.
    aligned = [None if self.copies is None else self.copies.copy_of(v) for v in self.variables]
    copies = [c for c in aligned if c is not None]
    # Gradients with respect to the weight copies stay in the compute dtype up to the optimizer's
    # update, which casts them in its compiled pass, unless they are summed first: over
    # micro-batches or replicas the sums are taken in float32.
    keep_float32 = self.accumulation > 1 or ctx.num_replicas_in_sync > 1
    for i in range(self.accumulation):
      features = {k: v[i] for k, v in stack.items()}
      # A dropout seed per (micro-batch, replica) from --seed and the step: a resumed run draws
      # the masks an uninterrupted one would, and no two micro-batches or replicas share one.
      seed = tf.stack([self.seed + step * self.accumulation + i,
                       tf.cast(ctx.replica_id_in_sync_group, tf.int64)])
      forward = self._forward
      if self.gradient_checkpointing and not self._use_xla:
        # Inlined: the gradient of a nested tf.function call keeps the intermediates of its
        # forward pass for the backward one, recomputed layers included (measured: gradient
        # checkpointing then saved 12% of the activation memory instead of 55%).
        forward = self._forward_impl
      with tf.GradientTape() as tape:
        tape.watch(copies)
        stats = forward(features, seed)
        loss_names = sorted(k for k in stats if k.endswith("_loss"))
        # Each loss's count summed over the replicas: every replica divides its sum by the same
        # global count, so the gradients summed below are those of the global mean however the
        # batch is split. (max(c, 1e-12): a loss with nothing to count adds 0, not NaN.)
        counts = ctx.all_reduce("SUM", [stats[k][1] for k in loss_names])
        loss = tf.add_n([stats[k][0] / tf.maximum(c, 1e-12) for k, c in zip(loss_names, counts)])
        # Each micro-batch's mean weighs 1 / accumulation: its gradient is taken before the later
        # micro-batches' counts are known. With counts that differ between micro-batches (masked-LM
        # predictions) the step's loss is the mean of their means, not the mean over all of them.
        loss = self.optimizer.scale_loss(loss / self.accumulation)
      new = self._gradients(tape, loss, aligned, copies, float32=keep_float32)
      grads = new if grads is None else [a + g for a, g in zip(grads, new)]
      totals = stats if totals is None else {k: (totals[k][0] + s, totals[k][1] + c)
                                             for k, (s, c) in stats.items()}
    # A sum, not a mean: each replica's loss was already divided by the global count.
    grads = ctx.all_reduce("SUM", grads)
    applied, norm = self.optimizer.apply_gradients(grads, self.variables, copies=aligned)
    # Every replica holds the same value; the sum over replicas divided by the count is that value.
    share = tf.constant(1.0 / ctx.num_replicas_in_sync)
    totals["applied_steps"] = (tf.cast(applied, tf.float32) * share, share)
    totals["gradient_norm"] = (norm * share, share)
    return totals

  def _gradients(self, tape, loss, aligned, copies, float32):
    """The gradient of `loss` for each of self.variables (whose copies, or None, are `aligned`;
    `copies` the ones there are), as dense tensors: float32, or (not `float32`) in the compute
    dtype for a variable the model reads only through its copy."""
    # Variables the loss does not reach (the pooler under a span head) get zero gradients.
    # Dense tensors (an embedding's gather gives IndexedSlices), added up over micro-batches
    # and all-reduced as they are.
    found = tape.gradient(loss, [*self.variables, *copies],
                          unconnected_gradients=tf.UnconnectedGradients.NONE)
    through_copies = iter(found[len(self.variables):])
    grads = []
    for variable, copy, direct in zip(self.variables, aligned, found):
      parts = [] if direct is None else [direct]
      if copy is not None:
        through_copy = next(through_copies)
        if through_copy is not None:
          parts.append(tf.convert_to_tensor(through_copy))
      if not parts:
        grads.append(tf.zeros_like(variable))
      elif len(parts) == 1 and not float32:
        grads.append(tf.convert_to_tensor(parts[0]))
      else:  # (the word embeddings: their gather in float32, the tied output matrix's copy)
        grads.append(_float32_sum(parts))
    return grads

  def _one_step(self, features):
    return _reduce_stats(self.strategy, self.strategy.run(self._replica_step, args=(features,)))

  @tf.function
  def _train_loop(self, iterator, num_steps):
    # The step is traced once, as a function of its own, and called at one place, inside the
    # loop; the totals start at zeros of its outputs' structure. The step used to be written out
    # twice (a first step before the loop gave the totals their structure), which doubled the
    # graph TensorFlow optimizes and keeps: measured on BERT-base at seq 512 with gradient
    # checkpointing, 150-250 MB more peak memory and a first call ~10 s longer.
    if self.copies is not None:
      # The copies from the weights as they are now (a restore or another change since the last
      # call); within the loop the optimizer writes them with the weights.
      self.strategy.run(self.copies.refresh)
    step = self._step.get_concrete_function(iterator.element_spec)
    totals = tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype), step.structured_outputs)
    # A graph loop: one call runs num_steps steps without returning to Python, and num_steps is
    # a tensor, so loops of every length share one trace.
    for _ in tf.range(num_steps):
      totals = {k: (totals[k][0] + s, totals[k][1] + c)
                for k, (s, c) in self._step(next(iterator)).items()}
    return totals

  # --- the loop -----------------------------------------------------------------------------

  def _restore_newest(self):
    """Restores the newest checkpoint of the output_dir that reads back whole and returns its
    path (None when there is none). One whose .index or .data file is missing, truncated or
    damaged is skipped with a warning naming it; InputError when none can be read, or when one
    does not fit the model (another config or task)."""
    # Every worker restores the chief's checkpoints: the others save only to a scratch
    # directory they remove (the save is collective), so theirs hold nothing to resume from.
    directory = self._output_dir
    damaged, error = [], None
    for number in run_dir.checkpoint_numbers(directory):
      path = run_dir.checkpoint_path(directory, number)
      _check_same_loss_scaling(path, self.optimizer, directory)
      try:
        # Every value the model and optimizer hold is restored; the checkpoint may hold more
        # (a time budget's clock, read back by an evaluation with no schedule): not warned of.
        self.checkpoint.restore(path).assert_existing_objects_matched().expect_partial()
      except (tf.errors.OpError, IndexError) as e:  # IndexError: TF's "Read less bytes" (truncated)
        reason = _first_line(e) if fileio.exists(path + ".index") else "no .index file"
        logging.warning("Checkpoint %s is damaged (%s); falling back to the previous one", path,
                        reason)
        damaged.append(f"{os.path.basename(path)}: {reason}")
        continue
      except (ValueError, AssertionError) as e:
        error = (f"{path} does not fit the model: {_first_line(e)} (was --output_dir={directory} "
                 "written with another config or task? Choose a new --output_dir)")
        break
      logging.info("Resumed from %s at step %d", path, int(self.optimizer.iterations.numpy()))
      return path
    if damaged and not error:
      error = (f"no checkpoint in --output_dir={directory} can be read ({'; '.join(damaged)}); "
               "move the damaged files away to start again")
    if error:
      _quiet_failed_restores()
      raise fileio.InputError(error)
    return None

  def restore_or_initialize(self, init_fn=None, for_training=False, unused=()):
    """The weights to start from: the output_dir's newest intact checkpoint (restored when the
    Trainer was built), else `init_fn` (e.g. loading --init_checkpoint; it returns the loading
    report). Evaluating or predicting (`for_training` False) with neither, or from a checkpoint
    without some of the model's variables (a pre-trained model without the task's output layer),
    is an InputError: it would score random weights. `unused`: name prefixes of variables the
    outputs do not depend on (the pooler under a span head). Only the first call initialises.
    Returns the step training starts from."""
    if not self._initialized:
      if init_fn is not None:
        report = init_fn()
        missing = [n for n in getattr(report, "missing", ()) if not n.startswith(tuple(unused))]
        if missing and not for_training:
          raise fileio.InputError(
              f"nothing to evaluate: the checkpoint {report.source} has no weights for "
              f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} (not trained for "
              "this task: they would be random); train first (--do_train) or give a "
              "checkpoint fine-tuned for it")
      elif not for_training:
        where = f"--output_dir={self.manager.directory} holds no checkpoint" if self.manager \
            else "no output_dir with checkpoints was given"
        raise fileio.InputError(f"nothing to evaluate: {where} and no --init_checkpoint was "
                                "given; train first (--do_train) or give --init_checkpoint")
      self._initialized = True
    return int(self.optimizer.iterations.numpy())

  def distribute(self, dataset_fn, skip_batches=0, stack=1):
    """Distributed iterator over `dataset_fn`'s per-replica batches, `stack` of them at a time
    (gradient accumulation), skipping what a resumed run has already consumed."""

    def fn(input_context):
      ds = dataset_fn(input_context)
      if stack:
        # Micro-batches cut to their own longest sequence are padded to the longest of the stack.
        ds = ds.padded_batch(stack, drop_remainder=True)
      if skip_batches:
        ds = ds.skip(skip_batches)
      if not stack:
        # A finite dataset (evaluation, prediction) without tf.data's autotuning: with it, the
        # read past the last batch often waited for the autotuner's next wake-up (its period
        # doubles from 10 ms; measured, MRPC dev predictions ended exactly 10.26 s after the
        # iterator started in 6 runs of 10, 6.3 s of work), a stall every evaluation,
        # prediction and extract_features chunk paid. The pipeline's parallel stages then use
        # every core, and prefetching stays on.
        options = tf.data.Options()
        options.autotune.enabled = False
        ds = ds.with_options(options)
      return ds.prefetch(tf.data.AUTOTUNE)

    return self.strategy.distribute_datasets_from_function(fn)

  def train(self, dataset_fn, num_train_steps, save_checkpoints_steps=1000, steps_per_loop=100,
            examples_per_step=None, init_fn=None, summary_dir=None, max_nonfinite_loops=3,
            log_every_seconds=30, evaluate=None, eval_every_steps=None, time_budget=None):
    """Trains to `num_train_steps` optimizer steps, resuming if output_dir has a checkpoint.
    Returns the metrics of the last loop.

    With `time_budget` (the time_budget.TimeBudget the optimizer's schedule was laid over),
    training ends when the budget is spent or at `num_train_steps`, whichever comes first; the
    loops' time is added to it as they end (saved with the checkpoints), the last loop is sized
    to end at the budget, and the progress line's ETA is the budget left.

    `evaluate(step)`, when given, is called after each multiple of `eval_every_steps` and after
    the last step (loops end there), and when a resumed run starts at such a step (it is its own
    judge of whether that step was evaluated before); training stops early when it returns True.

    Progress (step, losses, rate, ETA) is logged after each loop of steps run in one call of the
    compiled loop: the first loop is one step, so a line comes as soon as the step is traced and
    has run; the others end at multiples of `steps_per_loop` and, in one process (every worker
    of multi_worker_mirrored must run the same loops), after about `log_every_seconds` of
    steps at the measured rate: a line every 30 s by default, whatever the loop size. The
    second loop is sized by the first one's time, an upper bound of a step's (it traced and
    compiled the step too), so no fixed count of steps of unknown length follows the first line
    (10 steps of BERT-base on 2 cores were 2-3 quiet minutes)."""
    start = self.restore_or_initialize(init_fn, for_training=True)
    budget = time_budget
    finished = lambda step: step >= num_train_steps or bool(budget and budget.is_spent())
    due = lambda step: evaluate and step > 0 and (step % eval_every_steps == 0 or finished(step))
    if due(start) and evaluate(start):
      logging.info("Early stopping ended this training run at step %d; not resuming", start)
      return {}
    if start >= num_train_steps:
      logging.info("Already at step %d >= num_train_steps %d", start, num_train_steps)
      return {}
    if finished(start):
      logging.info("The time budget of %s is spent (at step %d); not training further",
                   _duration(budget.seconds), start)
      return {}
    iterator = _iterator(self.distribute(dataset_fn, skip_batches=start,
                                         stack=self.accumulation))
    # The chief's scalars only: every worker's would be a second event file in one run.
    writer = (tf.summary.create_file_writer(summary_dir) if summary_dir and self.is_chief
              else None)
    stop = _StopSignals()
    step, metrics, bad_loops = start, {}, 0
    t0, s0 = time.time(), start
    step_seconds, loops = None, 0  # the step time of the loops after the first (it traces)
    first_loop_seconds = None  # the first loop's (one step, traced): sizes the second loop
    timed_loops = self.num_workers == 1 and log_every_seconds
    try:
      while not finished(step) and not stop.requested:
        next_save = (step // save_checkpoints_steps + 1) * save_checkpoints_steps
        n = min(steps_per_loop - step % steps_per_loop, num_train_steps - step, next_save - step)
        if evaluate:
          n = min(n, eval_every_steps - step % eval_every_steps)
        if loops == 0:
          n = 1
        elif timed_loops:
          n = min(n, max(1, int(log_every_seconds / (step_seconds or first_loop_seconds))))
        if budget:
          n = budget.plan_loop(step, n, step_seconds)
        loop_start = time.time()
        stats = self._train_loop(iterator, tf.constant(n))
        step = int(self.optimizer.iterations.numpy())
        elapsed = time.time() - loop_start
        if budget:
          # Every worker must size its loops alike: they agree on one clock.
          elapsed = self._agreed_seconds(elapsed)
          # Only training counts: the first loop's one step, which traces and compiles the step
          # (again after each resume), is counted at the next loop's rate.
          budget.end_loop(step, 0.0 if loops == 0 else elapsed * (n + 1) / n if loops == 1
                          else elapsed)
        # Summed over the loop's steps (each replica adding 1 / replicas): the steps applied.
        applied = int(round(float(stats.pop("applied_steps")[0])))
        metrics = metrics_from_stats(stats)
        metrics["learning_rate"] = float(self.optimizer.learning_rate(step))
        if loops:
          step_seconds = elapsed / n
        else:
          first_loop_seconds = max(elapsed, 1e-6)
        loops += 1
        metrics["steps_per_second"] = n / elapsed
        if examples_per_step:
          metrics["examples_per_second"] = n * examples_per_step / elapsed
        if applied == 0:
          bad_loops += 1
          logging.warning("step %d: all %d steps of this loop had non-finite values and were "
                          "skipped (loss %s)", step, n, metrics["loss"])
          if bad_loops >= max_nonfinite_loops:
            latest = self.last_checkpoint
            kept = (f"the last good checkpoint {latest} is intact" if latest
                    else "no checkpoint was written")
            raise TrainingError(
                f"loss stayed non-finite for {bad_loops} consecutive loops at step {step}; "
                f"stopping ({kept}). Check the input data, lower the learning rate, or use "
                "--mixed_precision=bf16 / fp16 loss scaling.")
          continue
        bad_loops = 0
        self._log_progress(step, num_train_steps, metrics, s0, t0, n - applied,
                           first=loops == 1, budget=budget)
        if loops == 1:
          # The first loop (one step) includes tracing and compiling the step: the rate, and so
          # the ETA, count from its end (step 1 of a 2-minute run once said 15 minutes).
          t0, s0 = time.time(), step
        if writer:
          with writer.as_default(step=step):
            for k, v in metrics.items():
              tf.summary.scalar(k, v)
          writer.flush()
        if self.manager and (step % save_checkpoints_steps == 0 or finished(step)):
          self.save()
        if due(step) and evaluate(step):
          break
      if stop.requested:
        self.save()
        logging.warning("Stopped by %s at step %d; rerun the same command to resume.",
                        stop.requested, step)
        # The process was asked to end: evaluating or predicting next would outlast the grace
        # period before SIGKILL, and would report on an unfinished model. SIGTERM (a scheduler's
        # preemption) is an orderly end; Ctrl-C keeps the shell's 130.
        raise SystemExit(0 if stop.requested == "SIGTERM" else 130)
    finally:
      stop.restore()
    return metrics

  def save(self):
    """Saves checkpoint N (the step); a save that fails (disk full) leaves no partial files and
    is an OSError naming the checkpoint, so a rerun resumes from the previous whole one."""
    if not self.manager:
      return None
    step = int(self.optimizer.iterations.numpy())
    prefix = run_dir.checkpoint_path(self.manager.directory, step)
    before = set(fileio.glob_files(fileio.escape(prefix) + ".*"))
    try:
      path = self.manager.save(checkpoint_number=step)
    except BaseException as e:
      _remove_partial_saves(self.manager.directory, [step])
      for partial in set(fileio.glob_files(fileio.escape(prefix) + ".*")) - before:
        with contextlib.suppress(OSError, fileio.InputError):
          fileio.remove(partial)
      if isinstance(e, (OSError, tf.errors.OpError)):
        # TF's message names a staging file now removed: keep the reason ("No space left").
        reason = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]$", "", _first_line(e))
        reason = reason.rsplit("; ", 1)[-1]
        raise OSError(f"cannot save the checkpoint {prefix}: {reason} (its partial files were "
                      "removed)") from e
      raise
    if not _is_chief(self.strategy):
      fileio.remove_tree(self.manager.directory)
      return None
    self.last_checkpoint = path
    logging.info("Saved checkpoint %s", path)
    return path

  def _agreed_seconds(self, seconds):
    """`seconds` measured by this process; under multi_worker_mirrored, the workers' mean (a
    collective every worker calls at the same point), so that they take the same decisions."""
    if self.num_workers == 1:
      return seconds
    return float(self._mean_over_replicas(tf.constant(seconds, tf.float32)))

  @tf.function
  def _mean_over_replicas(self, value):
    # (tf.identity: the value made on the replica's device, where the collective reads it.)
    per_replica = self.strategy.run(
        lambda v: tf.distribute.get_replica_context().all_reduce("MEAN", tf.identity(v)),
        args=(value,))
    return self.strategy.experimental_local_results(per_replica)[0]

  @staticmethod
  def _log_progress(step, total, metrics, s0, t0, skipped, first=False, budget=None):
    """One progress line. The ETA is at the rate since the first loop ended ("estimating" after
    the first, whose time is mostly compilation). Under a time budget (a TimeBudget), the ETA is
    the budget left with the share spent, and the step count is out of the steps the budget is
    expected to reach at the current rate (`step 120/~1840`; `/?` while estimating), not out of
    --num_train_steps, which is only a cap there."""
    rate = (step - s0) / max(time.time() - t0, 1e-9)
    eta = "estimating" if first and step < total else _duration(
        (total - step) / rate if rate > 0 else float("inf"))
    shown_total = str(total)
    if budget is not None:
      left = budget.remaining_seconds()
      eta = (f"{_duration(left)} (time budget, "
             f"{100.0 * (1.0 - left / budget.seconds):.0f}% of {_duration(budget.seconds)} spent)")
      shown_total = ("?" if first or rate <= 0 else
                     f"~{min(total, step + int(round(left * rate)))}")
    shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())
                     if k not in ("steps_per_second", "examples_per_second"))
    speed = f"{metrics['steps_per_second']:.2f} steps/s"
    if "examples_per_second" in metrics:
      speed += f" {metrics['examples_per_second']:.1f} examples/s"
    logging.info("step %d/%s %s | %s | ETA %s%s", step, shown_total, shown, speed, eta,
                 f" | {skipped} non-finite steps skipped" if skipped else "")

  # --- evaluation and prediction ------------------------------------------------------------

  # Evaluation and prediction take each batch from the iterator eagerly rather than inside the
  # step function. With the distributed iterator read in-graph, the forward pass often ran on a
  # thread of TensorFlow's intra-op pool, where oneDNN treats a kernel as nested parallelism and
  # runs it on one thread: bf16 BERT-base encode fell from 13.5 to 7.8 seq/s in about half the
  # runs on 2 cores (benchmarks/encode.py); taken eagerly, 1 run in 24. A smaller last batch
  # costs one retrace.

  def _finite_batches(self, dataset_fn):
    """The distributed batches of a finite dataset, and whether to cut each one to exactly its
    longest sequence in the step function.

    The input pipeline cuts a batch after its longest sequence rounded up to a multiple
    (input_pipeline.length_multiple), so that training and XLA compile few shapes. The evaluation
    and prediction steps take any length without retracing (reduce_retracing), and oneDNN runs
    odd lengths as fast per token, so they cut again to the exact length: measured, 12-27% less
    work on GLUE dev sets and WikiText lines. Not under XLA (a compilation per length), nor with
    several replicas, whose outputs are concatenated and must share a length; and only where the
    pipeline already cuts (its sequence length is None), so --nodynamic_padding runs full length.
    """
    dataset = self.distribute(dataset_fn, stack=0)
    spec = dataset.element_spec
    mask = spec.get("input_mask") if isinstance(spec, dict) else None
    # (Several replicas' specs are PerReplicaSpecs, with no shape: checked first.)
    cut = (not self._use_xla and self.strategy.num_replicas_in_sync == 1
           and isinstance(mask, tf.TensorSpec) and mask.shape[-1] is None)
    return dataset, cut

  @tf.function(reduce_retracing=True)
  def _eval_step(self, features, cut, weights):
    def replica_fn(features, weights):
      if cut:
        features = input_pipeline.trim_to_longest(features, 1)
      return self._eval_stats(features, weights)
    return _reduce_stats(self.strategy, self.strategy.run(replica_fn, args=(features, weights)))

  def evaluate(self, dataset_fn, max_steps=None):
    """Metrics over a finite dataset (or `max_steps` batches): {name: value, "loss": ...}."""
    totals, steps = None, 0
    dataset, cut = self._finite_batches(dataset_fn)
    weights = self._cast_weights()
    for features in _iterator(dataset):
      if max_steps is not None and steps >= max_steps:
        break
      stats = self._eval_step(features, cut, weights)
      stats = {k: (float(s), float(c)) for k, (s, c) in stats.items()}
      totals = stats if totals is None else {k: (totals[k][0] + s, totals[k][1] + c)
                                             for k, (s, c) in stats.items()}
      steps += 1
    if totals is None:
      raise fileio.InputError("the evaluation data produced no batch")
    return metrics_from_stats(totals)

  @property
  def num_workers(self):
    """How many processes (workers) share the replicas: 1 but under multi_worker_mirrored."""
    resolver = getattr(self.strategy, "cluster_resolver", None)
    if not isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy) or not resolver:
      return 1
    jobs = resolver.cluster_spec().as_dict()
    return max(1, sum(len(jobs.get(job, ())) for job in ("chief", "worker")))

  @property
  def is_chief(self):
    """Whether this process writes the outputs (one worker writes: the chief, or worker 0)."""
    return _is_chief(self.strategy)

  @tf.function(reduce_retracing=True)
  def _predict_step(self, features, output_keys, cut, weights):
    gather = self.strategy.num_replicas_in_sync > 1

    def replica_fn(features, weights):
      context = tf.distribute.get_replica_context()
      if cut:
        features = input_pipeline.trim_to_longest(features, 1)
      if gather:
        # Each replica's batch was cut to its own longest sequence by the pipeline: all take the
        # longest of them, so that the outputs can be stacked.
        # (tf.identity: a tensor straight from the input has no device, and a collective
        # all-gather must know where a value lives.)
        length = tf.reduce_max(context.all_gather(
            tf.identity(tf.shape(features["input_mask"])[-1:]), 0))
        features = input_pipeline.pad_to_length(features, length)
      kept = self._forward_in_streams(features, weights, output_keys)
      kept.update({k: v for k, v in features.items() if k not in kept})
      if gather:
        kept = {k: context.all_gather(tf.identity(v), axis=0) for k, v in kept.items()}
      return kept
    return self.strategy.run(replica_fn, args=(features, weights))

  def _streams(self, features):
    """A replica's batch as `predict_streams` parts that depend on nothing of each other, so
    that the runtime's inter-op threads run them side by side (devices.prediction_streams); None
    when it is not split: one stream, fewer rows than streams, or a batch size unknown when the step
    is traced (a pipeline that keeps a short last batch)."""
    streams = self.predict_streams
    batch = features["input_mask"].shape[0] if "input_mask" in features else None
    if streams <= 1 or batch is None or batch < streams:
      return None
    # As even as can be (the first batch % streams parts one row more); tf.split wants the sizes
    # when the step is traced, hence the static batch size above.
    sizes = [batch // streams + (i < batch % streams) for i in range(streams)]
    parts = {k: tf.split(v, sizes) for k, v in features.items()}
    return [{k: v[i] for k, v in parts.items()} for i in range(streams)]

  def _forward_in_streams(self, features, weights, output_keys):
    """The outputs named in `output_keys` of a replica's batch, its parts (_streams) run side by
    side and put back in order (what predict() returns has the batch as its leading axis; other
    outputs, such as the list of every layer's output, are left out)."""
    parts = self._streams(features)
    if parts is None:
      outputs = self._predict_forward(features, weights)
      return {k: outputs[k] for k in output_keys}
    # Each part is its own call of the traced forward pass, with no data passing between the
    # calls: the executor may run them at once, on its inter-op threads.
    outputs = [self._predict_forward(part, weights) for part in parts]
    return {k: tf.concat([o[k] for o in outputs], 0) for k in output_keys}

  def _eval_stats(self, features, weights):
    """loss_fn's {name: (sum, count)} of a replica's batch, its parts run side by side and their
    sums and counts added (they are additive by the loss_fn contract)."""
    parts = self._streams(features)
    if parts is None:
      return self.loss_fn(features, self._predict_forward(features, weights))
    stats = [self.loss_fn(part, self._predict_forward(part, weights)) for part in parts]
    # Sums and counts add up over the parts; the means are taken once, by metrics_from_stats.
    return {k: tuple(tf.add_n([s[k][i] for s in stats]) for i in range(2)) for k in stats[0]}

  def predict(self, dataset_fn, output_keys):
    """Yields dicts of numpy arrays (the model outputs named in `output_keys` plus the input
    features, both cut to the batch's longest sequence where the input pipeline cuts batches) for
    each batch of a finite dataset, in input order.

    With several replicas each replica's outputs are gathered (all-gather) to every replica
    and put back in input order: the replicas of one process take consecutive batches of its
    pipeline; several workers (multi_worker_mirrored) each read every num_workers-th record
    (input_pipeline.tfrecord_dataset does for one file) in batches of one size, so all take the
    same number of steps. Every worker gets every output; the chief writes them."""
    dataset, cut = self._finite_batches(dataset_fn)
    workers = self.num_workers
    weights = self._cast_weights()
    for features in _iterator(dataset):
      outputs = self._predict_step(features, tuple(output_keys), cut, weights)
      batch = {}
      for k, v in outputs.items():
        # Rows by worker, each worker's being consecutive records of its shard: record i of
        # the input is row i // workers of worker i % workers.
        rows = np.asarray(self.strategy.experimental_local_results(v)[0])
        by_worker = rows.reshape(workers, -1, *rows.shape[1:])
        batch[k] = np.swapaxes(by_worker, 0, 1).reshape(rows.shape)
      yield batch


def _duration(seconds):
  """H:MM:SS (hours beyond 24 included), or "?" when unknown or beyond a century."""
  if not np.isfinite(seconds) or seconds > 100 * 365 * 86400:
    return "?"
  minutes, secs = divmod(int(seconds), 60)
  return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def write_eval_results(path, metrics):
  """The original's eval_results.txt: `key = value` lines, sorted by key; the numbers also as
  TensorBoard scalars at global_step, in eval/ beside it (next to training's train/)."""
  with fileio.open_atomic(path) as f:
    for key in sorted(metrics):
      logging.info("  %s = %s", key, metrics[key])
      f.write(f"{key} = {metrics[key]}\n")
  logging.info("Wrote %s", path)
  writer = tf.summary.create_file_writer(os.path.join(os.path.dirname(path) or ".", "eval"))
  with writer.as_default(step=int(metrics.get("global_step", 0))):
    for key, value in sorted(metrics.items()):
      if key != "global_step" and isinstance(value, (int, float)) and not isinstance(value, bool):
        tf.summary.scalar(key, value)
  writer.close()


MAX_STEPS = 10**9  # more optimizer steps than any run could take is a typo, not a plan


def prediction_batch_size(global_batch_size, num_examples, strategy, flag_name):
  """The per-replica batch of an evaluation or prediction over `num_examples`: --flag_name, but
  no larger than the examples need (a batch is filled up with padding examples, so a batch size
  far above the data would spend its time on padding)."""
  replicas = strategy.num_replicas_in_sync
  needed = max(1, -(-num_examples // replicas)) * replicas
  if global_batch_size > needed:
    logging.info("--%s=%d is more than the %d examples need; using %d", flag_name,
                 global_batch_size, num_examples, needed)
    return per_replica_batch_size(needed, strategy, flag_name), needed
  return per_replica_batch_size(global_batch_size, strategy, flag_name), global_batch_size
