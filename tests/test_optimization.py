"""One optimizer step against a hand computation of the original's update rule."""

import numpy as np
import pytest
import tensorflow as tf

from bert_tf2 import optimization


def _reference_adamw_step(params, grads, m, v, lr, decay_names, wd=0.01, b1=0.9, b2=0.999,
                          eps=1e-6, clip=1.0):
  """The original rule, written out in numpy."""
  norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
  scale = clip / max(norm, clip)
  out = {}
  for name, p in params.items():
    g = grads[name] * scale
    m2 = b1 * m[name] + (1 - b1) * g
    v2 = b2 * v[name] + (1 - b2) * g * g
    update = m2 / (np.sqrt(v2) + eps)
    if name in decay_names:
      update = update + wd * p
    out[name] = (p - lr * update, m2, v2)
  return out


def _reference_torch_adamw(params, grads_per_step, lrs, decay_names, wd=0.01, b1=0.9, b2=0.999,
                           eps=1e-8, clip=1.0):
  """torch.optim.AdamW.step (after torch.nn.utils.clip_grad_norm_), written out in numpy in the
  order torch computes it: decay multiplies the weights first, the bias-corrected step follows."""
  params = {n: p.copy() for n, p in params.items()}
  m = {n: np.zeros_like(p) for n, p in params.items()}
  v = {n: np.zeros_like(p) for n, p in params.items()}
  for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
    norm = np.sqrt(sum(np.sum(g ** 2) for g in grads.values()))
    scale = min(1.0, clip / (norm + 1e-6))
    for n, p in params.items():
      g = grads[n] * scale
      if n in decay_names:
        p *= 1 - lr * wd
      m[n] = b1 * m[n] + (1 - b1) * g
      v[n] = b2 * v[n] + (1 - b2) * g * g
      denom = np.sqrt(v[n]) / np.sqrt(1 - b2 ** t) + eps
      p -= lr / (1 - b1 ** t) * m[n] / denom
  return params


def _variables():
  rng = np.random.default_rng(0)
  with tf.name_scope("bert"):
    kernel = tf.Variable(rng.normal(size=(3, 4)).astype(np.float32), name="dense/kernel")
    bias = tf.Variable(rng.normal(size=(4,)).astype(np.float32), name="dense/bias")
    gamma = tf.Variable(rng.normal(size=(4,)).astype(np.float32), name="LayerNorm/gamma")
  return [kernel, bias, gamma]


def _assert_unscaled_steps(opt, scale, variables, plain, plain_vars, steps):
  """`steps` updates of `opt` on gradients times the loss `scale` equal `plain`'s, unscaled."""
  g = [tf.ones_like(v) * 0.01 for v in variables]
  for _ in range(steps):
    opt.apply_gradients([x * scale.scale for x in g], variables)
    plain.apply_gradients(g, plain_vars)
  for a, b in zip(variables, plain_vars):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


@pytest.mark.parametrize("grad_scale", [0.1, 10.0])  # below and above the clipping norm
def test_adamw_step_matches_hand_computation(grad_scale):
  variables = _variables()
  names = [v.name for v in variables]
  rng = np.random.default_rng(1)
  schedule = optimization.LinearWarmupLinearDecay(1e-3, num_train_steps=100, num_warmup_steps=10)
  opt = optimization.AdamWeightDecay(schedule)
  opt.build(variables)
  params = {n: v.numpy().astype(np.float64) for n, v in zip(names, variables)}
  m = {n: np.zeros_like(p) for n, p in params.items()}
  vv = {n: np.zeros_like(p) for n, p in params.items()}
  for step in range(3):
    grads = {n: grad_scale * rng.normal(size=p.shape) for n, p in params.items()}
    # Warm-up: lr = init_lr * step / warmup (0 at step 0, as the original).
    lr = 1e-3 * step / 10
    expected = _reference_adamw_step(params, grads, m, vv, lr,
                                     decay_names={"bert/dense/kernel:0"})
    opt.apply_gradients([tf.constant(grads[n], tf.float32) for n in names], variables)
    for n, var in zip(names, variables):
      params[n], m[n], vv[n] = expected[n]
      np.testing.assert_allclose(var.numpy(), params[n], rtol=1e-5, atol=1e-6)
  assert opt.iterations.numpy() == 3


@pytest.mark.parametrize("grad_scale", [1e-3, 0.1, 10.0])  # eps-sized, below and above the clip
def test_bias_corrected_adamw_matches_torch_adamw_formula(grad_scale):
  variables = _variables()
  names = [v.name for v in variables]
  params = {n: v.numpy().astype(np.float64) for n, v in zip(names, variables)}
  rng = np.random.default_rng(2)
  steps = 6
  grads = [{n: grad_scale * rng.normal(size=p.shape) for n, p in params.items()}
           for _ in range(steps)]
  schedule = optimization.LinearWarmupLinearDecay(1e-2, num_train_steps=20, num_warmup_steps=2)
  opt = optimization.create_optimizer(1e-2, 20, 2, optimizer="adamw")
  assert isinstance(opt, optimization.AdamW) and opt.epsilon == 1e-8
  for g in grads:
    opt.apply_gradients([tf.constant(g[n], tf.float32) for n in names], variables)
  # torch's clip_grad_norm_ divides by norm + 1e-6 and ours by max(norm, clip): equal to 1e-6
  # relative, well inside the tolerance; the lr is the one our schedule gives at each step.
  expected = _reference_torch_adamw(params, grads, [float(schedule(t)) for t in range(steps)],
                                    decay_names={"bert/dense/kernel:0"})
  for n, var in zip(names, variables):
    moved = np.abs(expected[n] - params[n]).max()
    assert moved > 1e-3  # a test that the steps were taken at all (6 steps of up to 1e-2)
    np.testing.assert_allclose(var.numpy(), expected[n], rtol=1e-5, atol=1e-6)
  # Not the original's rule: without bias correction the first steps are several times larger.
  original = optimization.AdamWeightDecay(schedule)
  other = _variables()
  for g in grads:
    original.apply_gradients([tf.constant(g[n], tf.float32) for n in names], other)
  assert np.abs(other[0].numpy() - expected[names[0]]).max() > 1e-3
  assert opt.iterations.numpy() == steps


def test_adamw_keeps_the_shared_guards():
  """Non-finite skipping and fp16 unscaling are the shared path: the bias correction counts
  applied steps only, so a skipped step does not advance it."""
  variables = _variables()
  scale = optimization.DynamicLossScale(initial_scale=1024.0, growth_interval=100)
  opt = optimization.AdamW(optimization.LinearWarmupLinearDecay(1e-3, 10), loss_scale=scale)
  plain_vars = _variables()
  plain = optimization.AdamW(optimization.LinearWarmupLinearDecay(1e-3, 10))
  before = [v.numpy() for v in variables]
  applied, _ = opt.apply_gradients([tf.fill(v.shape, np.inf) for v in variables], variables)
  assert not bool(applied) and opt.iterations.numpy() == 0 and scale.scale.numpy() == 512.0
  for b, v in zip(before, variables):
    np.testing.assert_array_equal(b, v.numpy())
  _assert_unscaled_steps(opt, scale, variables, plain, plain_vars, 3)
  assert opt.iterations.numpy() == plain.iterations.numpy() == 3


def test_optimizer_names():
  for name, cls in [("adamw", optimization.AdamW), ("lamb", optimization.Lamb),
                    ("adam_weight_decay", optimization.AdamWeightDecay)]:
    opt = optimization.create_optimizer(1e-4, 10, 1, optimizer=name)
    assert type(opt) is cls
  assert optimization.AdamWeightDecay(None).epsilon == 1e-6  # the original's


def test_weight_decay_skips_layer_norm_and_bias():
  variables = _variables()
  opt = optimization.AdamWeightDecay(optimization.LinearWarmupLinearDecay(1e-2, 100))
  before = [v.numpy() for v in variables]
  # With zero gradients (and fresh moments) only weight decay can move a variable.
  opt.apply_gradients([tf.zeros_like(v) for v in variables], variables)
  np.testing.assert_array_equal(variables[1].numpy(), before[1])  # bias
  np.testing.assert_array_equal(variables[2].numpy(), before[2])  # LayerNorm/gamma
  np.testing.assert_allclose(variables[0].numpy(), before[0] * (1 - 1e-2 * 0.01), rtol=1e-6)


def test_schedule_warmup_then_linear_decay_not_shifted():
  s = optimization.LinearWarmupLinearDecay(2e-5, num_train_steps=1000, num_warmup_steps=100)
  lr = lambda step: float(s(tf.constant(step, tf.int64)))
  assert lr(0) == 0.0
  np.testing.assert_allclose(lr(50), 1e-5, rtol=1e-6)
  # After warm-up the decay is measured from step 0, not from the end of warm-up.
  np.testing.assert_allclose(lr(100), 2e-5 * (1 - 100 / 1000), rtol=1e-6)
  np.testing.assert_allclose(lr(500), 1e-5, rtol=1e-6)
  assert lr(1000) == 0.0 and lr(2000) == 0.0


def test_schedule_decaying_after_warmup_is_hfs():
  """--lr_schedule=decay_after_warmup: transformers.get_linear_schedule_with_warmup's rate,
  step / warm-up then (total - step) / (total - warm-up); the original's is 0.9x it after a 10%
  warm-up."""
  hf = optimization.LinearWarmupLinearDecay(2e-5, 1000, 100, decay_after_warmup=True)
  original = optimization.LinearWarmupLinearDecay(2e-5, 1000, 100)
  for step in (0, 50, 99, 100, 101, 550, 999, 1000, 1500):
    expected = 2e-5 * (step / 100 if step < 100 else max(0.0, (1000 - step) / 900))
    np.testing.assert_allclose(float(hf(tf.constant(step, tf.int64))), expected, rtol=1e-6,
                               atol=1e-12, err_msg=str(step))
    if step >= 100:
      np.testing.assert_allclose(float(original(tf.constant(step, tf.int64))), 0.9 * expected,
                                 rtol=1e-6, atol=1e-12)


def test_non_finite_gradients_skip_the_step():
  variables = _variables()
  opt = optimization.AdamWeightDecay(optimization.LinearWarmupLinearDecay(1e-3, 10))
  before = [v.numpy() for v in variables]
  grads = [tf.fill(v.shape, np.nan) for v in variables]
  applied, _ = opt.apply_gradients(grads, variables)
  assert not bool(applied)
  for b, v in zip(before, variables):
    np.testing.assert_array_equal(b, v.numpy())
  assert opt.iterations.numpy() == 0
  assert all(np.all(s.numpy() == 0) for s in opt.slots["m"])


@pytest.mark.parametrize("name", sorted(optimization.OPTIMIZERS))
def test_a_skipped_step_midway_leaves_the_run_as_if_it_never_came(name):
  """Steps g1, g2, (one non-finite gradient), g3 end bit for bit where g1, g2, g3 do: weights,
  both moments and the step count, with decay, bias correction and LAMB's trust ratio in play."""
  rng = np.random.default_rng(3)
  steps = [[rng.standard_normal(v.shape).astype(np.float32) for v in _variables()]
           for _ in range(3)]
  poisoned = [g.copy() for g in steps[1]]
  poisoned[0].flat[0] = np.inf
  runs = []
  for sequence in (steps, steps[:2] + [poisoned] + steps[2:]):
    variables = _variables()
    opt = optimization.create_optimizer(1e-2, 100, 2, optimizer=name)
    step = tf.function(lambda grads, opt=opt, variables=variables:
                       opt.apply_gradients(grads, variables))
    applied = [bool(step([tf.constant(g) for g in grads])[0]) for grads in sequence]
    runs.append(([v.numpy() for v in variables] +
                 [s.numpy() for n in opt.slot_names for s in opt.slots[n]],
                 int(opt.iterations.numpy()), applied))
  (clean, clean_steps, _), (skipped, skipped_steps, applied) = runs
  assert applied == [True, True, False, True]
  assert clean_steps == skipped_steps == 3
  for a, b in zip(clean, skipped):
    np.testing.assert_array_equal(a, b)


def test_fp16_loss_scale_halves_on_overflow_and_unscales():
  variables = _variables()
  scale = optimization.DynamicLossScale(initial_scale=1024.0, growth_interval=2)
  opt = optimization.AdamWeightDecay(optimization.LinearWarmupLinearDecay(1e-3, 10),
                                     loss_scale=scale)
  opt.apply_gradients([tf.fill(v.shape, np.inf) for v in variables], variables)
  assert scale.scale.numpy() == 512.0
  # Scaled gradients come back unscaled: the update equals that of the plain optimizer.
  plain_vars = _variables()  # same seed: same names (decay exclusions) and values
  plain = optimization.AdamWeightDecay(optimization.LinearWarmupLinearDecay(1e-3, 10))
  plain.iterations.assign(opt.iterations)
  _assert_unscaled_steps(opt, scale, variables, plain, plain_vars, 2)
  assert scale.scale.numpy() == 1024.0  # doubled after growth_interval finite steps


def test_lamb_trust_ratio_step():
  variables = _variables()
  opt = optimization.Lamb(optimization.LinearWarmupLinearDecay(1e-2, 100), clip_norm=None)
  w = variables[0].numpy().astype(np.float64)
  g = np.full(w.shape, 0.5)
  opt.apply_gradients([tf.constant(g, tf.float32)] + [tf.zeros_like(v) for v in variables[1:]],
                      variables)
  m_hat = (0.1 * g) / 0.1
  v_hat = (0.001 * g * g) / 0.001
  update = m_hat / (np.sqrt(v_hat) + 1e-6) + 0.01 * w
  ratio = np.linalg.norm(w) / np.linalg.norm(update)
  np.testing.assert_allclose(variables[0].numpy(), w - 1e-2 * ratio * update, rtol=1e-5)


def test_unknown_optimizer_name_is_an_error():
  with pytest.raises(ValueError, match="--optimizer"):
    optimization.create_optimizer(1e-4, 10, 1, optimizer="sgd")


def test_the_clip_norm_of_gradients_of_several_dtypes_is_global_norms_in_float32():
  """A bf16 model's gradients reach the optimizer in bf16 beside float32 ones (weight_copies):
  the clip's norm is tf.linalg.global_norm of them all in float32 (an L2Loss in bf16 would sum in
  bf16), None gradients left out as global_norm leaves them."""
  rng = np.random.default_rng(0)
  values = [rng.normal(size=s).astype(np.float32) for s in ([300, 7], [1000], [3, 4, 5])]
  mixed = [tf.cast(values[0], tf.bfloat16), tf.constant(values[1]), None,
           tf.cast(values[2], tf.float16)]
  rounded = [tf.cast(g, tf.float32) for g in mixed if g is not None]
  norm = optimization._global_norm(mixed)  # pylint: disable=protected-access
  assert norm.dtype == tf.float32
  assert float(norm) == pytest.approx(float(tf.linalg.global_norm(rounded)), rel=1e-6)
  # What the float32 sum guards against: an L2Loss in bf16 over the same 2,100 squares.
  in_bf16 = float(tf.nn.l2_loss(mixed[0]))
  in_float32 = float(tf.nn.l2_loss(rounded[0]))
  assert abs(in_bf16 - in_float32) > 1e-3 * in_float32
  assert float(optimization._global_norm([None])) == 0.0  # pylint: disable=protected-access
