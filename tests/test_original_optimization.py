"""The original's optimization_test.py, ported to TensorFlow 2, then the original's update and
create_optimizer checked step by step against the formulas of the original's code.

The port (test_adam): every call into `optimization` is as written
(`optimization.AdamWeightDecayOptimizer(learning_rate=0.2)`,
`optimizer.apply_gradients(zip(grads, tvars), global_step)`), on the checkout's root
`optimization` module. What changed: TF1's tf.get_variable, tf.trainable_variables,
tf.gradients, tf.train.get_or_create_global_step and the session's 100 runs of the train op are
TF2's tf.Variable, the variables listed, a GradientTape and 100 eager steps.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import PYTHON, run_process
import optimization


def test_adam():
  w = tf.Variable([0.1, -0.2, -0.1], name="w")
  x = tf.constant([0.4, 0.2, -0.5])
  tvars = [w]
  global_step = tf.Variable(0, dtype=tf.int64, name="global_step")
  optimizer = optimization.AdamWeightDecayOptimizer(learning_rate=0.2)
  for _ in range(100):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(x - w))
    grads = tape.gradient(loss, tvars)
    optimizer.apply_gradients(zip(grads, tvars), global_step)
  np.testing.assert_allclose(w.numpy().flat, [0.4, 0.2, -0.5], rtol=1e-2, atol=1e-2)
  # As the original's: apply_gradients leaves the step alone (its create_optimizer advanced it).
  assert int(global_step) == 0


# --- beyond the port --------------------------------------------------------------------------

def _original_update(param, grad, m, v, lr, decay, beta_1=0.9, beta_2=0.999, epsilon=1e-6):
  """The original AdamWeightDecayOptimizer's arithmetic, in numpy: no bias correction, the decay
  added to the update."""
  m = beta_1 * m + (1 - beta_1) * grad
  v = beta_2 * v + (1 - beta_2) * grad ** 2
  update = m / (np.sqrt(v) + epsilon) + decay * param
  return param - lr * update, m, v


def test_the_update_is_the_originals_with_decay_and_exclusions():
  rng = np.random.default_rng(0)
  kernel = tf.Variable(rng.normal(size=[3, 2]).astype(np.float32), name="dense/kernel")
  bias = tf.Variable(rng.normal(size=[2]).astype(np.float32), name="dense/bias")
  gamma = tf.Variable(rng.normal(size=[2]).astype(np.float32), name="LayerNorm/gamma")
  lr = tf.Variable(0.01)
  optimizer = optimization.AdamWeightDecayOptimizer(
      learning_rate=lr, weight_decay_rate=0.1, exclude_from_weight_decay=["LayerNorm", "bias"])
  expected = {v.name: (v.numpy(), 0.0, 0.0) for v in (kernel, bias, gamma)}
  for step in range(5):
    grads = [rng.normal(size=v.shape).astype(np.float32) for v in (kernel, bias, gamma)]
    if step == 3:
      lr.assign(0.005)  # a tf.Variable rate is read at every step
    optimizer.apply_gradients(zip(grads, [kernel, bias, gamma]))
    for var, grad in zip((kernel, bias, gamma), grads):
      decay = 0.1 if var is kernel else 0.0
      expected[var.name] = _original_update(*expected[var.name][:1], grad,
                                             *expected[var.name][1:], float(lr.numpy()), decay)
      np.testing.assert_allclose(var.numpy(), expected[var.name][0], rtol=1e-5, atol=1e-6)


def test_a_none_gradient_is_left_out_and_the_variables_must_stay_the_same():
  a, b = tf.Variable([1.0], name="a"), tf.Variable([2.0], name="b")
  optimizer = optimization.AdamWeightDecayOptimizer(learning_rate=0.1)
  optimizer.apply_gradients([(tf.constant([1.0]), a), (None, b)])
  assert a.numpy()[0] < 1.0 and b.numpy()[0] == 2.0
  with pytest.raises(ValueError, match="differ from the first step's"):
    optimizer.apply_gradients([(tf.constant([1.0]), a), (tf.constant([1.0]), b)])


def _original_learning_rate(step, init_lr, num_train_steps, num_warmup_steps):
  """The original create_optimizer's rate at a (0-based) global step."""
  decayed = init_lr * (1 - min(step, num_train_steps) / num_train_steps)
  if step < num_warmup_steps:
    return init_lr * step / num_warmup_steps
  return decayed


def test_create_optimizer_takes_the_originals_arguments_and_steps_as_it_did():
  w = tf.Variable([3.0, -4.0], name="output_weights")
  b = tf.Variable([0.5], name="output_bias")
  target = tf.constant([1.0, 1.0])
  loss = lambda: tf.reduce_sum(tf.square(w - target)) + tf.reduce_sum(tf.square(b))
  train_op = optimization.create_optimizer(loss, 0.1, 10, 3, False)
  m = {"w": np.zeros(2), "b": np.zeros(1)}
  v = {"w": np.zeros(2), "b": np.zeros(1)}
  w_np, b_np = w.numpy().astype(np.float64), b.numpy().astype(np.float64)
  step_fn = tf.function(train_op)  # a tf.function, as a training loop would run it
  for step in range(6):
    g_w, g_b = 2 * (w_np - 1.0), 2 * b_np
    norm = np.sqrt(np.sum(g_w ** 2) + np.sum(g_b ** 2))
    g_w, g_b = g_w * min(1.0, 1.0 / norm), g_b * min(1.0, 1.0 / norm)  # clipped to norm 1.0
    lr = _original_learning_rate(step, 0.1, 10, 3)
    returned = step_fn()
    np.testing.assert_allclose(float(returned), np.sum((w_np - 1) ** 2) + np.sum(b_np ** 2),
                               rtol=1e-5)
    # "output_weights" decays (0.01), "output_bias" is excluded, as the original's lists say.
    w_np, m["w"], v["w"] = _original_update(w_np, g_w, m["w"], v["w"], lr, 0.01)
    b_np, m["b"], v["b"] = _original_update(b_np, g_b, m["b"], v["b"], lr, 0.0)
    np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), b_np, rtol=1e-5)
    assert int(train_op.global_step) == step + 1
  with pytest.raises(TypeError, match="pass the loss as a function"):
    optimization.create_optimizer(loss(), 0.1, 10, 3, False)


def test_original_style_code_runs_without_notices_naming_the_projects_internals():
  """Code written against the original's API, run as a user's own script (no TF_CPP_MIN_LOG_LEVEL
  set): `import modeling, optimization`, a BertModel, and create_optimizer's train op for three
  eager steps over a head of a dozen shapes on its pooled output. Its stderr is empty: no TensorFlow start-up
  notices, no XLA service lines from the compiled kernels, and no "triggered tf.function
  retracing" warning naming the optimizer's `_update_and_copy` (issue #73)."""
  code = """
import modeling, optimization
import tensorflow as tf
config = modeling.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=2, intermediate_size=64)
ids = tf.constant([[5, 6, 7, 8], [9, 10, 11, 0]])
model = modeling.BertModel(config, True, ids, input_mask=tf.constant([[1] * 4, [1, 1, 1, 0]]))
pooled = model.get_pooled_output()
# A head of a dozen shapes over the pooled output, trained by the original's train op.
weights = [tf.Variable(tf.fill([32, i + 1], 0.1)) for i in range(12)]
loss = lambda: sum(tf.reduce_sum(tf.square(pooled @ w - 1.0)) for w in weights)
train = optimization.create_optimizer(loss, 1e-2, 10, 0)
losses = [float(train()) for _ in range(3)]
assert losses[2] < losses[0], losses
print("losses", losses, "step", int(train.global_step.numpy()))
"""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  result = run_process([PYTHON, "-c", code], env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "step 3" in result.stdout, result.stdout
  assert result.stderr == "", result.stderr[-3000:]
