"""Optimizers and the learning-rate schedule of the original, as tf.Modules (checkpointable).

- `LinearWarmupLinearDecay`: the original's schedule. Linear decay from `init_lr` to 0 over
  `num_train_steps` (power 1, *not* shifted by the warm-up), overridden during the first
  `num_warmup_steps` by a linear ramp `init_lr * step / num_warmup_steps`. With
  `decay_after_warmup`, HF's `get_linear_schedule_with_warmup` instead: the decay starts from
  `init_lr` at the end of the warm-up (after a 10% warm-up the original's rate is 0.9x HF's at
  every later step).
- `AdamW`: Adam with bias correction and decoupled weight decay, the update of torch.optim.AdamW
  (and of HuggingFace's and Model Garden's AdamW): `p -= lr * (m_hat / (sqrt(v_hat) + eps) +
  wd * p)` with `m_hat = m / (1 - beta_1^t)`, `v_hat = v / (1 - beta_2^t)`, epsilon 1e-8 (torch's).
  The default of every script (`--optimizer=adamw`).
- `AdamWeightDecay`: the original's Adam (`--optimizer=adam_weight_decay`): the same update
  *without* bias correction, epsilon 1e-6. Early on, m / sqrt(v) is then up to ~6x a
  bias-corrected step (0.1 / sqrt(0.001) at step 1, more at step 10), so a short fine-tuning
  warm-up hits its peak rate with steps several times too large: small GLUE sets (RTE) then
  often collapse to the majority class (Mosbach et al., ICLR 2021; benchmarks/README.md has our
  figures). Over pre-training's 10k-step warm-up the two agree to within a few percent once the
  rate is non-negligible, so the original's released checkpoints do not depend on it.
- `Lamb`: layer-wise adaptive moments (You et al. 2019) for large-batch pre-training.
- `DynamicLossScale`: fp16 loss scaling.

In all of them weight decay is *decoupled* (added to the update, not to the loss, so it does not
interact with the m/v statistics) and skipped for LayerNorm and bias variables. All clip gradients
to a global norm (1.0, as the original) and skip any step whose gradients are not finite, so one
bad batch never reaches the weights; `iterations` counts applied steps only. Updates go through
`strategy.extended.update`, the same code under every tf.distribute strategy (and none).
"""

import functools
import re

import tensorflow as tf

# The original's exclusions: LayerNorm's gamma / beta and the biases are per-feature scales
# and offsets, not the matrices whose size decay is meant to limit; decaying gamma
# (initialised at 1) would pull its feature towards 0.
DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


class LinearWarmupLinearDecay:
  """The original's learning rate as a function of the (0-based) global step."""

  def __init__(self, init_lr, num_train_steps, num_warmup_steps=0, decay_after_warmup=False):
    self.init_lr = float(init_lr)
    self.num_train_steps = int(num_train_steps)
    self.num_warmup_steps = int(num_warmup_steps)
    self.decay_after_warmup = decay_after_warmup

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    start = float(self.num_warmup_steps) if self.decay_after_warmup else 0.0
    decay_steps = float(max(self.num_train_steps - start, 1))
    # The original's polynomial_decay (power 1, end 0): the clip holds the rate at 0 from the
    # last step on.
    lr = self.init_lr * (1.0 - tf.clip_by_value(step - start, 0.0, decay_steps) / decay_steps)
    if self.num_warmup_steps:
      # The ramp starts at 0, as the original's: step 0's update changes only m and v.
      warmup_lr = self.init_lr * step / float(self.num_warmup_steps)
      lr = tf.where(step < self.num_warmup_steps, warmup_lr, lr)
    return lr


class DynamicLossScale(tf.Module):
  """fp16 loss scale: halves on a non-finite step, doubles after `growth_interval` finite ones."""

  def __init__(self, initial_scale=2.0 ** 15, growth_interval=2000):
    super().__init__(name="loss_scale")
    self.scale = tf.Variable(float(initial_scale), trainable=False, name="scale",
                             aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps",
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.growth_interval = growth_interval

  def update(self, finite):
    grow = tf.logical_and(finite, self.good_steps + 1 >= self.growth_interval)
    # Halved on overflow (that step is skipped), never below 1; doubled after growth_interval
    # finite steps: kept as large as fp16 allows, so that small gradients do not underflow.
    new_scale = tf.where(finite, tf.where(grow, self.scale * 2.0, self.scale),
                         tf.maximum(self.scale / 2.0, 1.0))
    self.scale.assign(new_scale)
    self.good_steps.assign(tf.where(finite & ~grow, self.good_steps + 1,
                                    tf.zeros_like(self.good_steps)))


def _matches_any(name, patterns):
  # re.search: a pattern matches anywhere in the name, so "bias" also excludes
  # cls/predictions/output_bias.
  return any(re.search(p, name) for p in patterns)


class _Optimizer(tf.Module):
  """Shared plumbing: slots, clipping, non-finite skipping, distributed update."""

  slot_names = ("m", "v")

  def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
               epsilon=1e-6, exclude_from_weight_decay=DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY,
               clip_norm=1.0, loss_scale=None, jit_update=True, name="optimizer"):
    super().__init__(name=name)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
    self.exclude_from_weight_decay = tuple(exclude_from_weight_decay or ())
    self.clip_norm = clip_norm
    self.loss_scale = loss_scale
    self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations",
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.slots = None
    # The update of one variable is ~10 elementwise passes over it (moments, decay, the
    # non-finite guard, the assignments); XLA fuses them into one read and one in-place write of
    # each buffer, which matters on CPU where the optimizer is otherwise ~15% of a BERT step.
    self._jit_update = jit_update
    # One compiled update per kind of variable (_update_for), by a name of shape and dtypes.
    self._updates = {}

  def build(self, variables):
    """Creates the slot variables; call under the strategy's scope, before the first step."""
    if self.slots is not None:
      return
    self.slots = {n: [tf.Variable(tf.zeros_like(v), trainable=False, name=f"{n}_{i}")
                      for i, v in enumerate(variables)] for n in self.slot_names}

  def _decays(self, name):
    return self.weight_decay_rate > 0 and not _matches_any(name, self.exclude_from_weight_decay)

  def scale_loss(self, loss):
    """The loss to differentiate: times the fp16 loss scale when there is one (apply_gradients
    divides the gradients by it again)."""
    return loss * self.loss_scale.scale if self.loss_scale is not None else loss

  def apply_gradients(self, gradients, variables, copies=None):
    """Applies one update (or skips it if a gradient is not finite). Call from replica context
    with gradients that are already summed across replicas; returns (applied, global_norm).

    A gradient may be in a lower precision than its variable (a bf16 model's, with respect to
    the weight copy it read): the update casts it. `copies`: optional, aligned with `variables`:
    a variable (or None) that the update writes with the new weight cast to its dtype
    (weight_copies)."""
    self.build(variables)
    # Unscaling (fp16) and the original's clip_by_global_norm are one factor applied inside the
    # fused update; the norm is of the unscaled gradients.
    unscale = 1.0 / self.loss_scale.scale if self.loss_scale is not None else 1.0
    global_norm = _global_norm(gradients) * unscale
    finite = tf.math.is_finite(global_norm)
    factor = unscale
    if self.clip_norm:
      factor *= self.clip_norm / tf.maximum(global_norm, self.clip_norm)
    # A zero guard keeps a non-finite norm from spreading NaN into the discarded update.
    factor = tf.where(finite, factor, 0.0)
    # By applied steps: a skipped step does not advance the schedule.
    lr = self.learning_rate(self.iterations)
    copies = copies or [None] * len(variables)
    tf.distribute.get_replica_context().merge_call(
        self._distributed_apply, args=(gradients, variables, copies, lr, factor, finite))
    return finite, global_norm

  def _distributed_apply(self, strategy, gradients, variables, copies, lr, factor, finite):
    # The compiled update runs only without a tf.distribute strategy: under mirrored and
    # multi-worker strategies it updated the wrong copy of some variables (tests/
    # test_run_pretraining.py caught it), so there the plain ops run.
    compiled = self._jit_update and not tf.distribute.has_strategy()
    for i, (g, v, copy) in enumerate(zip(gradients, variables, copies)):
      slots = [self.slots[n][i] for n in self.slot_names]
      update = self._update_for(v, g, copy, self._decays(v.name)) if compiled else (
          self._update_and_copy)
      strategy.extended.update(
          v, update, args=(g, slots, copy, lr, factor, finite),
          kwargs=dict(decay=self._decays(v.name)), group=False)
    strategy.extended.update(self.iterations,
                             lambda it, f: it.assign_add(tf.cast(f, tf.int64)),
                             args=(finite,), group=False)
    if self.loss_scale is not None:
      # `finite` is the same on every replica (the norm is of gradients already summed across
      # them): the first replica's stands for all.
      self.loss_scale.update(strategy.experimental_local_results(finite)[0])

  def _update_for(self, var, grad, copy, decay):
    """The compiled update (_update_and_copy) for variables like `var`: a tf.function of its own
    for each shape, dtypes and decay, traced once. One tf.function for every variable retraced at
    each new shape, and called eagerly (the original's API front) TensorFlow warned "5 out of the
    last 5 calls to _update_and_copy triggered tf.function retracing", naming this project's
    internals as the user's mistake (issue #73). TensorFlow counts retracing per code object of
    the Python function; a functools.partial has none, so each partial counts on its own."""
    key = "_".join(str(part) for part in (
        "x".join(map(str, var.shape)), var.dtype.name, grad.dtype.name,
        copy.dtype.name if copy is not None else "none", decay))
    if key not in self._updates:
      update = functools.partial(self._update_and_copy)
      update.__name__ = "_update_and_copy"  # its compiled functions' name (profiles read it)
      self._updates[key] = tf.function(update, jit_compile=True)
    return self._updates[key]

  def _update_and_copy(self, var, grad, slots, copy, lr, factor, finite, decay):
    """The update of `var`, then `copy` (when not None) written from the new `var`, rounded, in
    the same compiled call. (XLA's CPU compiler writes it in a pass of its own: it does not fuse
    several outputs into one loop; benchmarks/log/2026-11-29.md.)"""
    self._update_variable(var, tf.cast(grad, var.dtype), *slots, lr, factor, finite, decay)
    if copy is not None:
      copy.assign(tf.cast(var, copy.dtype))

  def _update_variable(self, var, grad, m, v, lr, factor, finite, decay):
    """Updates `var` and its slots in place from the raw gradient times `factor`."""
    raise NotImplementedError

  def _moments(self, grad, m, v, finite):
    """Adam's new first and second moments, or the old ones on a non-finite step.

    A select rather than a tf.cond: the same ops run every step (fused under XLA), and a
    non-finite step writes the old values back. The step is then computed from these selected
    moments (on a finite step they are the new ones, bit for bit): when it recomputed them from the
    old m and v beside the in-place writes of m and v, XLA kept copies of the old buffers and ran
    the moments' arithmetic again, and the update of BERT-base's 108 M parameters took 1.5x as long
    (240 against 160 ms a step, 2 cores of a Xeon with AMX, 2026-11-28; benchmarks/log).
    """
    new_m = tf.where(finite, self.beta_1 * m + (1.0 - self.beta_1) * grad, m)
    new_v = tf.where(finite, self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad), v)
    return new_m, new_v


def _global_norm(gradients):
  """tf.linalg.global_norm (the same sum, in float32) of gradients of any float dtypes."""
  halves = []
  for g in gradients:
    if g is None:  # (as global_norm: left out)
      continue
    g = g.values if isinstance(g, tf.IndexedSlices) else g  # (as global_norm: the values)
    # A bf16 / fp16 gradient is cast for its L2Loss (one in bf16 would add up in bf16); the cast
    # lives only for it: the update reads the 2-byte gradient. (A cast, square and sum instead
    # made three passes, 18 bytes a parameter against 10 for the cast and L2Loss.)
    halves.append(tf.nn.l2_loss(tf.cast(g, tf.float32)))
  return tf.sqrt(tf.reduce_sum(tf.stack(halves or [tf.constant(0.0)])) * 2.0)


class AdamWeightDecay(_Optimizer):
  """The original BERT optimizer (AdamWeightDecayOptimizer): Adam without bias correction."""

  bias_correction = False

  def _update_variable(self, var, grad, m, v, lr, factor, finite, decay):
    grad = tf.convert_to_tensor(grad) * factor
    new_m, new_v = self._moments(grad, m, v, finite)
    m_hat, v_hat = new_m, new_v
    # m and v start at 0, so early on they are biased towards 0 by a factor 1 - beta^t; dividing
    # by it removes the bias. t = iterations + 1: the first applied update is t = 1 (iterations
    # counts applied steps only, so t follows the moments' updates actually made).
    if self.bias_correction:
      step = tf.cast(self.iterations + 1, tf.float32)
      m_hat = new_m / (1.0 - tf.pow(self.beta_1, step))
      v_hat = new_v / (1.0 - tf.pow(self.beta_2, step))
    update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
    if decay:
      # Decoupled: added after Adam's normalisation, so every decayed weight shrinks by
      # lr * rate * w whatever its gradients' history (in the loss, the decay's gradient would be
      # divided by sqrt(v) like any other).
      update += self.weight_decay_rate * var
    m.assign(new_m)
    v.assign(new_v)
    var.assign(tf.where(finite, var - lr * update, var))


class AdamW(AdamWeightDecay):
  """Adam with bias correction and decoupled weight decay: torch.optim.AdamW's update, epsilon
  included (1e-8; it is added to sqrt(v_hat), as torch does). Same slots as the original's, so a
  checkpoint of either resumes with the other."""

  bias_correction = True

  def __init__(self, learning_rate, epsilon=1e-8, **kwargs):
    super().__init__(learning_rate, epsilon=epsilon, **kwargs)


class Lamb(_Optimizer):
  """LAMB: Adam with bias correction, decoupled decay, and a per-variable trust ratio
  ||w|| / ||update|| that keeps each layer's step proportional to its weights (large batches)."""

  def _update_variable(self, var, grad, m, v, lr, factor, finite, decay):
    grad = tf.convert_to_tensor(grad) * factor
    step = tf.cast(self.iterations + 1, tf.float32)
    new_m, new_v = self._moments(grad, m, v, finite)
    m_hat = new_m / (1.0 - tf.pow(self.beta_1, step))
    v_hat = new_v / (1.0 - tf.pow(self.beta_2, step))
    update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
    ratio = 1.0
    if decay:
      update += self.weight_decay_rate * var
      # Layer adaptation follows weight decay: LayerNorm and bias variables take plain Adam steps.
      # Trust ratio ||w|| / ||update||, per variable (the query, key and value kernels each have
      # their own): every such variable then moves by lr times its own norm, whatever the scale
      # of its gradients.
      w_norm, u_norm = tf.norm(var), tf.norm(update)
      # Ratio 1 (a plain step) when either norm is 0: a weight initialised at 0 would otherwise
      # never move. (The maximum only keeps the branch not taken from dividing by 0.)
      ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / tf.maximum(u_norm, 1e-30), 1.0)
    m.assign(new_m)
    v.assign(new_v)
    var.assign(tf.where(finite, var - lr * ratio * update, var))


OPTIMIZERS = {"adamw": AdamW, "adam_weight_decay": AdamWeightDecay, "lamb": Lamb}


def create_optimizer(init_lr, num_train_steps, num_warmup_steps, optimizer="adamw",
                     weight_decay_rate=0.01, clip_norm=1.0, loss_scale=None,
                     decay_after_warmup=False, time_budget=None):
  """The original's `create_optimizer`, returning an optimizer module; `optimizer` is a key of
  OPTIMIZERS (adamw: bias-corrected, adam_weight_decay: the original's, lamb);
  `decay_after_warmup` see LinearWarmupLinearDecay; `time_budget` (a time_budget.TimeBudget)
  lays the schedule over wall-clock time instead of the steps."""
  schedule = LinearWarmupLinearDecay(init_lr, num_train_steps, num_warmup_steps,
                                     decay_after_warmup)
  if time_budget is not None:
    schedule = time_budget.schedule(schedule)
  if optimizer not in OPTIMIZERS:
    raise ValueError(f"--optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
  return OPTIMIZERS[optimizer](schedule, weight_decay_rate=weight_decay_rate,
                               clip_norm=clip_norm, loss_scale=loss_scale)
