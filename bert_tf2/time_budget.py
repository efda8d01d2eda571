"""Training for a wall-clock budget (run_pretraining --train_budget_minutes), as cramming does.

The learning rate follows the share of the budget spent rather than the step: the step schedule
(optimization.LinearWarmupLinearDecay: warm-up, then linear decay to 0) is laid over the budget,
its --num_warmup_steps / --num_train_steps share of it warming up, and the run ends when the
budget is spent, with the rate at its end value (0). --num_train_steps stays a cap on the steps.

Only the training loops' time counts (the steps, their tracing and compilation, reading the
data), not checkpoint saves, evaluations or start-up: on a busy machine or after a restart the
model still gets its budget of training. The time spent is a variable of the checkpoint, so a
resumed run continues where the interrupted one stopped, on the same schedule.

Within a compiled loop of steps the time of each step is not known: the rate is computed from the
time spent when the loop started plus the steps taken in it times the measured seconds a step,
so it falls smoothly step by step and not in jumps at the loop boundaries; the last loop is sized
to end at the budget and its steps are spread over exactly what is left.
"""

import math

import tensorflow as tf


class TimeBudget(tf.Module):
  """The budget and the time spent of it (checkpointed), and the schedule laid over it."""

  def __init__(self, seconds):
    super().__init__(name="time_budget")
    if not seconds > 0:
      raise ValueError(f"a time budget must be positive, got {seconds} s")
    self.seconds = float(seconds)
    # One value for every replica: each replica computes the same rate from them. float64: a run
    # of days counts its seconds exactly enough.
    spec = dict(trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.spent = tf.Variable(0.0, dtype=tf.float64, name="spent_seconds", **spec)
    # The step the current loop started at, and the seconds each of its steps is taken to last.
    self.loop_start_step = tf.Variable(0, dtype=tf.int64, name="loop_start_step", **spec)
    self.seconds_per_step = tf.Variable(0.0, dtype=tf.float64, name="seconds_per_step", **spec)

  def progress(self, step):
    """The share of the budget spent when the step `step` (the optimizer's count) begins, in
    [0, 1] (a tensor: read inside the compiled loop)."""
    steps_in = tf.cast(tf.cast(step, tf.int64) - self.loop_start_step, tf.float64)
    seconds = self.spent + tf.maximum(steps_in, 0.0) * self.seconds_per_step
    return tf.cast(tf.clip_by_value(seconds / self.seconds, 0.0, 1.0), tf.float32)

  def schedule(self, steps_schedule):
    """`steps_schedule` (a function of the step over its `num_train_steps`) laid over the budget."""
    return BudgetSchedule(steps_schedule, self)

  # --- the training loop's side (plain Python, between loops) ---------------------------------

  def spent_seconds(self):
    return float(self.spent.numpy())

  def is_spent(self):
    return self.spent_seconds() >= self.seconds

  def remaining_seconds(self):
    return max(self.seconds - self.spent_seconds(), 0.0)

  def plan_loop(self, step, steps, step_seconds):
    """Sizes the loop about to start at `step` (at most `steps` steps, each measured at
    `step_seconds`; None before any was measured) to end at the budget at the latest, and sets
    the rate's clock for it. Returns the loop's steps."""
    remaining = self.remaining_seconds()
    seconds_per_step = step_seconds or 0.0
    if step_seconds:
      fit = max(1, math.ceil(remaining / step_seconds - 1e-9))
      if fit <= steps:
        # The last loop: its steps share exactly what is left, so that its last one begins just
        # before the budget ends (the rate after it is the end value).
        steps, seconds_per_step = fit, remaining / fit
    self.loop_start_step.assign(int(step))
    self.seconds_per_step.assign(seconds_per_step)
    return steps

  def end_loop(self, step, seconds):
    """Adds a loop's `seconds` to the time spent; the loop ended at `step`."""
    self.spent.assign_add(float(seconds))
    self.loop_start_step.assign(int(step))


def in_checkpoint(variable_names):
  """Whether a checkpoint of these variable names was trained over a time budget."""
  # A BudgetSchedule's budget is checkpointed as `.../budget/spent/...` (the attribute names).
  return any("/budget/spent/" in name for name in variable_names)


class BudgetSchedule(tf.Module):
  """A step schedule over a time budget: rate(step) = steps_schedule(progress * num_train_steps)."""

  def __init__(self, steps_schedule, budget):
    super().__init__(name="budget_schedule")
    self.steps_schedule = steps_schedule
    self.budget = budget

  def __call__(self, step):
    span = float(self.steps_schedule.num_train_steps)
    return self.steps_schedule(self.budget.progress(step) * span)
