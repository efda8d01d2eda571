"""The original's `optimization` API (google-research/bert's optimization.py) on TensorFlow 2.

`AdamWeightDecayOptimizer` takes the original's arguments and `apply_gradients(grads_and_vars,
global_step)`; the update is the project's (bert_tf2.optimization.AdamWeightDecay: Adam without
bias correction, decoupled weight decay), not a second copy of it. `create_optimizer` takes the
original's arguments; TF2 has no loss tensor to differentiate after the fact, so `loss` is a
function returning the loss (what TF2's `minimize` takes) and the result is a train step to call
once per step, where TF1 returned a train op to run.
"""

import tensorflow as tf

from bert_tf2 import optimization

__all__ = ["AdamWeightDecayOptimizer", "create_optimizer", "TrainOp"]


class AdamWeightDecayOptimizer(optimization.AdamWeightDecay):
  """The original's optimizer and defaults (weight decay 0, epsilon 1e-6, nothing excluded).

  `learning_rate` is a number, a tensor or tf.Variable (read at each step, so assigning it
  changes the rate) or a schedule, a function of the step. As in the original the optimizer
  clips nothing (create_optimizer clips before) and `apply_gradients` leaves `global_step` alone
  (the original's create_optimizer advanced it). One difference: a step whose gradients are not
  finite is skipped rather than written into the weights (the project's optimizers all do).
  """

  def __init__(self, learning_rate, weight_decay_rate=0.0, beta_1=0.9, beta_2=0.999,
               epsilon=1e-6, exclude_from_weight_decay=None, name="AdamWeightDecayOptimizer"):
    schedule = learning_rate if callable(learning_rate) and not isinstance(
        learning_rate, (tf.Tensor, tf.Variable)) else (lambda step: learning_rate)
    super().__init__(schedule, weight_decay_rate=weight_decay_rate, beta_1=beta_1, beta_2=beta_2,
                     epsilon=epsilon, exclude_from_weight_decay=exclude_from_weight_decay,
                     clip_norm=None, name=name)
    self._variables = None

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):  # pylint: disable=arguments-renamed
    """One update of the variables of (gradient, variable) pairs; a pair whose gradient is None
    is left out, as the original. Returns whether the step was applied (finite gradients)."""
    del global_step, name  # the original's create_optimizer advanced the step, not this
    pairs = [(g, v) for g, v in grads_and_vars if g is not None and v is not None]
    variables = [v for _, v in pairs]
    refs = [v.ref() for v in variables]
    if self._variables is None:
      self._variables = refs
    elif refs != self._variables:
      # The slots (m, v) are one per variable, made at the first step: another set of variables
      # would pair gradients with another variable's moments.
      raise ValueError("AdamWeightDecayOptimizer.apply_gradients: the variables (or which of them "
                       "have gradients) differ from the first step's; make one optimizer per set")
    finite, _ = super().apply_gradients([g for g, _ in pairs], variables)
    return finite


class TrainOp(tf.Module):
  """What `create_optimizer` gives: call it once per step (eagerly or inside a tf.function);
  it computes `loss()`, its gradients over the trainable variables it read, clips them to a global
  norm of 1.0, applies the original's AdamWeightDecay update at the scheduled rate and advances
  `global_step`. Returns the loss."""

  def __init__(self, loss, init_lr, num_train_steps, num_warmup_steps):
    super().__init__(name="train_op")
    self.loss = loss
    self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    self.learning_rate = optimization.LinearWarmupLinearDecay(init_lr, num_train_steps,
                                                              num_warmup_steps)
    # The original's settings for pre-training and fine-tuning alike.
    self.optimizer = AdamWeightDecayOptimizer(
        learning_rate=lambda step: self.learning_rate(self.global_step), weight_decay_rate=0.01,
        beta_1=0.9, beta_2=0.999, epsilon=1e-6,
        exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"])

  def __call__(self):
    with tf.GradientTape() as tape:
      loss = self.loss()
    # The trainable variables the loss read: TF1's tf.trainable_variables() of the graph.
    tvars = tape.watched_variables()
    grads = tape.gradient(loss, tvars)
    grads, _ = tf.clip_by_global_norm(grads, clip_norm=1.0)
    self.optimizer.apply_gradients(zip(grads, tvars), global_step=self.global_step)
    self.global_step.assign_add(1)
    return loss


def create_optimizer(loss, init_lr, num_train_steps, num_warmup_steps, use_tpu=False):
  """The original's create_optimizer: AdamWeightDecay (weight decay 0.01 except LayerNorm and
  biases), a linear warm-up over `num_warmup_steps` then linear decay to 0 at `num_train_steps`,
  gradients clipped to a global norm of 1.0. `loss` is a function of no arguments returning the
  loss; the result is a TrainOp to call once per step. `use_tpu` changes nothing (the TPU's
  cross-shard sum is tf.distribute's business in TF2)."""
  del use_tpu
  if not callable(loss):
    raise TypeError("create_optimizer: in TensorFlow 2 pass the loss as a function of no "
                    "arguments (gradients need the computation, not its value), e.g. "
                    "create_optimizer(lambda: model_loss(batch), ...)")
  return TrainOp(loss, init_lr, num_train_steps, num_warmup_steps)
