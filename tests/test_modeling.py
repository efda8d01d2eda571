"""The encoder against HuggingFace's outputs of a real checkpoint, and the model's contracts."""

import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import devices
from bert_tf2 import errors
from bert_tf2 import kernels
from bert_tf2 import modeling
from conftest import ROOT, SHARED, minilm_dir, requires_shared


@pytest.fixture(scope="module")
def minilm():
  path = minilm_dir()
  config = modeling.BertConfig.from_json_file(os.path.join(path, "config.json"))
  model = modeling.BertModel(config)
  report = checkpoints.init_from_checkpoint(model, path, require_all=True)
  return model, report


def test_hf_config_gelu_is_the_exact_form():
  config = modeling.BertConfig.from_json_file(os.path.join(minilm_dir(), "config.json"))
  assert config.hidden_act == "gelu_exact"
  assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (384, 6, 12)


@requires_shared
@pytest.mark.parametrize("case", ["single", "pair", "unicode"])
def test_every_layer_and_pooled_output_match_huggingface(minilm, case):
  model, report = minilm
  assert len(report.loaded) == 103 and not report.missing
  ref = np.load(os.path.join(SHARED, "reference", "minilm_hf_reference.npz"))
  out = model(ref[f"{case}/input_ids"], ref[f"{case}/attention_mask"],
              ref[f"{case}/token_type_ids"])
  hidden = [out["embedding_output"]] + out["encoder_outputs"]
  expected = ref[f"{case}/all_hidden_states"]
  assert len(hidden) == expected.shape[0] == 7
  mask = ref[f"{case}/attention_mask"].astype(bool)
  for layer, (got, want) in enumerate(zip(hidden, expected)):
    diff = np.abs(got.numpy() - want)
    assert diff.max() < 1e-4, (layer, diff.max())
    assert diff[mask].max() < 2e-5, (layer, diff[mask].max())  # real tokens match even closer
  np.testing.assert_allclose(out["sequence_output"].numpy(), ref[f"{case}/sequence_output"],
                             atol=1e-4, rtol=0)
  np.testing.assert_allclose(out["pooled_output"].numpy(), ref[f"{case}/pooled_output"],
                             atol=1e-4, rtol=0)


def _tiny_config(**kw):
  d = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=32, max_position_embeddings=32, type_vocab_size=2)
  d.update(kw)
  return modeling.BertConfig(**d)


def test_variable_names_are_the_original_checkpoint_names():
  model = modeling.BertPretrainer(_tiny_config())
  names = set(checkpoints.variables_by_name(model))
  for expected in ["bert/embeddings/word_embeddings", "bert/embeddings/LayerNorm/gamma",
                   "bert/encoder/layer_1/attention/self/query/kernel",
                   "bert/encoder/layer_0/attention/output/LayerNorm/beta",
                   "bert/encoder/layer_0/intermediate/dense/kernel",
                   "bert/encoder/layer_0/output/dense/bias", "bert/pooler/dense/kernel",
                   "cls/predictions/transform/dense/kernel",
                   "cls/predictions/transform/LayerNorm/gamma", "cls/predictions/output_bias",
                   "cls/seq_relationship/output_weights", "cls/seq_relationship/output_bias"]:
    assert expected in names
  assert len(names) == 5 + 16 * 2 + 2 + 5 + 2


def test_padding_does_not_change_real_positions():
  tf.random.set_seed(0)
  model = modeling.BertModel(_tiny_config())
  ids = tf.constant([[2, 7, 9, 3]])
  short = model(ids, tf.ones_like(ids))["sequence_output"]
  padded_ids = tf.constant([[2, 7, 9, 3, 0, 0]])
  padded = model(padded_ids, tf.constant([[1, 1, 1, 1, 0, 0]]))["sequence_output"]
  np.testing.assert_allclose(short.numpy(), padded.numpy()[:, :4], atol=1e-5)


def test_dropout_only_in_training_and_reproducible_with_a_seed():
  model = modeling.BertModel(_tiny_config(hidden_dropout_prob=0.5))
  ids = tf.constant([[2, 7, 9, 3, 4]])
  a = model(ids)["sequence_output"]
  b = model(ids)["sequence_output"]
  np.testing.assert_array_equal(a.numpy(), b.numpy())
  seed = tf.constant([3, 0])
  t1 = model(ids, training=True, dropout_seed=seed)["sequence_output"]
  t2 = model(ids, training=True, dropout_seed=seed)["sequence_output"]
  t3 = model(ids, training=True, dropout_seed=tf.constant([4, 0]))["sequence_output"]
  np.testing.assert_array_equal(t1.numpy(), t2.numpy())
  assert not np.allclose(t1.numpy(), a.numpy()) and not np.allclose(t1.numpy(), t3.numpy())


def test_training_layer_norm_has_the_output_and_gradients_of_the_plain_one():
  layer = modeling.LayerNorm(48, 1e-12)
  layer.gamma.assign(tf.random.stateless_normal([48], [1, 1]))
  layer.beta.assign(tf.random.stateless_normal([48], [1, 2]))
  x = tf.random.stateless_normal([3, 5, 48], [1, 3]) * 4.0 + 2.0
  dy = tf.random.stateless_normal([3, 5, 48], [1, 4])
  for dtype, tolerance in [(tf.float32, 2e-5), (tf.bfloat16, 2e-2)]:
    results = []
    for training in (False, True):
      xs = tf.cast(x, dtype)
      with tf.GradientTape() as tape:
        tape.watch(xs)
        y = layer(xs, training=training)
      grads = tape.gradient(y, [xs, layer.gamma, layer.beta], output_gradients=tf.cast(dy, dtype))
      results.append([t.numpy().astype(np.float32) for t in [y, *grads]])
    assert results[1][0].dtype == np.float32 and y.dtype == dtype
    for plain, fused in zip(*results):
      np.testing.assert_allclose(fused, plain, rtol=tolerance, atol=tolerance * np.abs(plain).max())


def _bf16_spacing(values):
  """The distance between neighbouring bfloat16 numbers at |values| (8 significant bits)."""
  return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(values), 1e-30))) - 7)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("static", [True, False])
def test_inference_layer_norm_in_onednn_form_is_exact_to_one_rounding(dtype, static):
  """kernels.layer_norm's oneDNN form (inference where TensorFlow runs oneDNN) against float64,
  on rows of varied spread and mean (four with a mean of ~30): the float32 result as close as the
  separate ops' (1e-6 of the largest value; both measured at 5.4e-7), the bfloat16 one a single
  rounding (half a step of bfloat16) of the exact value computed with gamma and beta in
  bfloat16: they are rounded, as every weight of a bf16 model. Static and unknown shapes alike
  (a static one must not let constant folding break the pattern: see
  test_inference_layer_norm_in_onednn_form_is_one_kernel).

  Where the form is not one exact kernel for the dtype (bfloat16 without bf16 instructions: an
  AVX2-only CPU, or oneDNN held below AVX-512; devices.onednn_layer_norm), asking for it must
  give the plain form's result bit for bit: the model never takes it there."""
  rng = np.random.default_rng(5)
  x = (rng.normal(size=(4, 24, 96)) * rng.uniform(0.5, 3.0, size=(4, 24, 1))
       + rng.normal(size=(4, 24, 1)) * 2.0)
  x[0, :4] += 30.0
  gamma = tf.constant(rng.normal(size=96) * 0.3 + 1.0, tf.float32)
  beta = tf.constant(rng.normal(size=96) * 0.2, tf.float32)
  xs = tf.cast(x, dtype)
  x64 = xs.numpy().astype(np.float64)
  g64, b64 = (tf.cast(t, dtype).numpy().astype(np.float64) for t in (gamma, beta))
  mean = x64.mean(-1, keepdims=True)
  exact = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + 1e-12) * g64 + b64
  spec = tf.TensorSpec(x.shape if static else [None, None, 96], dtype)
  outputs = {}
  for onednn in (True, False):
    # On the CPU: the oneDNN form is the CPU's (the model never builds it on a GPU, where
    # TensorFlow's graph rewrite still makes it a _MklLayerNorm, which has no GPU kernel).
    with tf.device("/CPU:0"):
      y = tf.function(lambda t, o=onednn: kernels.layer_norm(t, gamma, beta, 1e-12, onednn=o),
                      input_signature=[spec])(xs)
    assert y.dtype == dtype and y.shape == x.shape
    outputs[onednn] = y.numpy()
    error = np.abs(y.numpy().astype(np.float64) - exact)
    if dtype == tf.float32:
      assert error.max() < 1e-6 * np.abs(exact).max(), (onednn, error.max())
    elif onednn and devices.onednn_layer_norm(dtype):
      assert (error <= _bf16_spacing(exact) * 0.5 + 1e-6 * np.abs(exact)).all(), error.max()
  if not devices.onednn_layer_norm(dtype):
    np.testing.assert_array_equal(outputs[True], outputs[False])
  # No rows (a multi-worker job's exhausted worker predicts on an empty batch).
  with tf.device("/CPU:0"):
    empty = tf.function(lambda t: kernels.layer_norm(t, gamma, beta, 1e-12, onednn=True),
                        input_signature=[tf.TensorSpec([0, 24, 96] if static else spec.shape,
                                                       dtype)])(tf.zeros([0, 24, 96], dtype))
  assert empty.shape == (0, 24, 96) and empty.dtype == dtype


def test_onednn_layer_norm_form_is_taken_only_where_it_is_one_exact_kernel():
  """The three CPU kinds (flags as /proc/cpuinfo names them) and oneDNN held below them:
  float32 takes the oneDNN LayerNorm everywhere, bfloat16 only with bf16 instructions."""
  amx = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
  zen5 = {"avx2", "avx512f", "avx512_bf16"}
  avx2 = {"avx2", "fma"}
  exact = devices.onednn_layer_norm_is_exact
  for flags in (amx, zen5, avx2, None):
    for isa in (None, "AVX2", "AVX512_CORE_BF16"):
      assert exact(tf.float32, flags, isa)
      assert not exact(tf.float16, flags, isa)
  assert exact(tf.bfloat16, amx, None) and exact(tf.bfloat16, zen5, "AVX512_CORE_BF16")
  assert exact(tf.bfloat16, amx, "avx512_core_amx")
  assert not exact(tf.bfloat16, avx2, None) and not exact(tf.bfloat16, None, None)
  assert not exact(tf.bfloat16, zen5, "AVX2") and not exact(tf.bfloat16, amx, "AVX512_CORE")


@pytest.mark.skipif(not devices.onednn_cpu(), reason="TensorFlow runs without oneDNN here: "
                    "kernels.layer_norm's oneDNN form is not used")
def test_inference_layer_norm_in_onednn_form_is_one_kernel(tmp_path):
  """Grappler replaces the pattern by oneDNN's layer normalisation (`_MklLayerNorm`), with a
  static shape too, where constant folding would otherwise have turned the fills into constants
  and left an unfused batch normalisation: the ops that ran, from a profile."""
  from tensorflow.python.profiler.internal import _pywrap_profiler_plugin  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  x = tf.random.stateless_normal([2, 16, 64], [1, 2])
  gamma, beta = tf.Variable(tf.ones([64])), tf.Variable(tf.zeros([64]))
  norm = tf.function(lambda t: kernels.layer_norm(t, gamma, beta, 1e-12, onednn=True),
                     input_signature=[tf.TensorSpec([2, 16, 64], tf.float32)])
  norm(x)
  tf.profiler.experimental.start(str(tmp_path))
  norm(x).numpy()
  tf.profiler.experimental.stop()
  path = next(tmp_path.glob("**/*.xplane.pb"))
  data, _ = _pywrap_profiler_plugin.xspace_to_tools_data([str(path)], "trace_viewer@", {})
  ran = {e.get("name") for e in json.loads(data)["traceEvents"] if e.get("ph") == "X"}
  assert "_MklLayerNorm" in ran, sorted(ran)
  assert not {name for name in ran if "BatchNorm" in name}, sorted(ran)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_masked_lm_loss_kernel_is_log_softmax_gather_and_argmax(dtype):
  """kernels.masked_lm_loss against what it replaced: -log_softmax(logits + bias)[label], argmax
  == label (ties to the first index: bfloat16 logits tie, here on purpose), and autodiff's
  gradients of a weighted sum of it, for the logits and the bias."""
  rng = np.random.default_rng(3)
  rows, vocab = 96, 3000
  values = rng.normal(size=(rows, vocab)) * 3.0
  bias = rng.normal(size=vocab) * 0.1
  # Rows 0-7: the largest logit + bias twice, at a lower and a higher index; the label is one of
  # them.
  for row in range(8):
    pair = sorted(rng.choice(vocab, 2, replace=False))
    values[row, pair] = values[row].max() + 1.0
    bias[pair] = 0.0
  logits, bias = tf.constant(values, dtype), tf.constant(bias, tf.float32)
  z = tf.cast(logits, tf.float32) + bias
  best = tf.argmax(z, -1, output_type=tf.int32)
  # Rows 0-7 labelled with a tied maximum (alternately the first, which argmax picks, and the
  # second, which it does not), rows 8-23 with their argmax, the rest at random.
  tied = [int(np.flatnonzero(z[row] == tf.reduce_max(z[row]))[row % 2]) for row in range(8)]
  labels = tf.constant(tied + list(best[8:24].numpy()) + list(rng.integers(0, vocab, rows - 24)),
                       tf.int32)
  weights = tf.constant(rng.random(rows), tf.float32)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([logits, bias])
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32) + bias)
    plain_nll = -tf.gather(log_probs, labels, batch_dims=1)
    plain_correct = tf.cast(tf.equal(tf.argmax(log_probs, -1, output_type=tf.int32), labels),
                            tf.float32)
    nll, correct = kernels.masked_lm_loss(logits, bias, labels)
    plain_loss, loss = tf.reduce_sum(plain_nll * weights), tf.reduce_sum(nll * weights)
  assert nll.dtype == correct.dtype == tf.float32
  np.testing.assert_allclose(nll.numpy(), plain_nll.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(correct.numpy(), plain_correct.numpy())
  assert correct.numpy()[:8].tolist() == [1.0, 0.0] * 4 and correct.numpy()[8:24].all()
  for variable in (logits, bias):
    plain, fused = tape.gradient(plain_loss, variable), tape.gradient(loss, variable)
    assert fused.dtype == variable.dtype
    np.testing.assert_allclose(tf.cast(fused, tf.float32).numpy(),
                               tf.cast(plain, tf.float32).numpy(), rtol=1e-5, atol=1e-6)
  empty_nll, empty_correct = kernels.masked_lm_loss(logits[:0], bias, labels[:0])
  assert empty_nll.shape == empty_correct.shape == (0,)


@pytest.mark.parametrize("act", ["gelu", "gelu_exact"])
def test_training_gelu_has_the_gradient_of_tf_nn_gelu(act):
  x = tf.constant(np.linspace(-8, 8, 4001), tf.float32)
  approximate = act == "gelu"
  # Where tanh saturates float32's autodiff makes exact zeros of derivatives of a few 1e-6.
  for dtype, tolerance in [(tf.float32, 1e-5), (tf.bfloat16, 1e-2)]:
    xs = tf.cast(x, dtype)
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(xs)
      ours = modeling.TRAINING_ACTIVATIONS[act](xs)
      reference = tf.nn.gelu(tf.cast(xs, tf.float32), approximate=approximate)
    # The layer's own GELU computed in float32 and rounded once to the dtype: in float32 to
    # rounding (where the tanh form's 1 + tanh cancels, below -4.5, TensorFlow's ops make 0 of
    # values under 1e-6), in bfloat16 to one rounding step (float32 tanh's last bits decide a
    # few roundings).
    np.testing.assert_allclose(ours.numpy().astype(np.float32),
                               tf.cast(tf.cast(reference, dtype), tf.float32).numpy(),
                               rtol=1e-6 if dtype == tf.float32 else 2**-7 + 1e-6, atol=1e-6)
    assert ours.dtype == dtype
    dy = tf.cast(tf.linspace(0.5, 1.5, 4001), dtype)
    got = tape.gradient(ours, xs, output_gradients=dy).numpy().astype(np.float32)
    want = tape.gradient(reference, xs, output_gradients=tf.cast(dy, tf.float32)).numpy()
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
  # Inside a compiled step, as run_pretraining --use_xla runs it.
  step = tf.function(lambda v: tf.gradients(modeling.TRAINING_ACTIVATIONS[act](v), v)[0],
                     jit_compile=True)
  with tf.GradientTape() as tape:
    tape.watch(x)
    reference = tf.nn.gelu(x, approximate=approximate)
  np.testing.assert_allclose(step(x).numpy(), tape.gradient(reference, x).numpy(), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("amx", [True, False])
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
def test_a_bias_handed_to_gelu_dropout_or_bias_add_is_added_in_their_pass(dtype, amx,
                                                                          monkeypatch):
  # Training hands a dense layer's bias to the compiled pass after its matmul (kernels.bias_add):
  # the result must be that pass applied to float32(x) + float32(bias), rounded once, and the
  # bias's gradient the float32 sum of x's gradient over the rows. In bf16 / fp16 without AMX
  # the bias is added first (BiasAdd, in x's dtype), then the pass.
  monkeypatch.setattr(devices, "amx_matmul", lambda: amx)
  x = tf.cast(tf.random.stateless_normal([1024, 96], [1, 2]), dtype)
  bias = tf.cast(tf.random.stateless_normal([96], [3, 4]), dtype)
  dy = tf.cast(tf.random.stateless_uniform([1024, 96], [5, 6], 0.5, 1.5), dtype)
  once = tf.cast(x, tf.float32) + tf.cast(bias, tf.float32)
  rounded = tf.cast(tf.nn.bias_add(x, bias), tf.float32)
  seed = tf.constant([7, 11], tf.int64)
  passes = {"gelu": (lambda v, b: modeling.TRAINING_ACTIVATIONS["gelu"](v, b),
                     modeling.TRAINING_ACTIVATIONS["gelu"]),
            "dropout": (lambda v, b: kernels.dropout(v, 0.1, True, seed, b),
                        lambda v: kernels.dropout(v, 0.1, True, seed)),
            "bias_add": (lambda v, b: kernels.bias_add(v, b, True), lambda v: v)}

  def expected(reference, summed):
    """The reference pass's output and input gradient at `summed`, rounded to dtype."""
    with tf.GradientTape() as tape:
      tape.watch(summed)
      want = reference(summed)
    want_dx = tape.gradient(want, summed, output_gradients=tf.cast(dy, tf.float32))
    return [tf.cast(tf.cast(t, dtype), tf.float32).numpy() for t in (want, want_dx)]

  for name, (ours, reference) in passes.items():
    for compiled in (False, True):  # eagerly, and inside an XLA step (run_pretraining --use_xla)
      def step(v, b):
        with tf.GradientTape() as tape:
          tape.watch([v, b])
          out = ours(v, b)
        return (out,) + tuple(tape.gradient(out, [v, b], output_gradients=dy))
      out, dx, dbias = tf.function(step, jit_compile=compiled)(x, bias)
      assert out.dtype == dx.dtype == dbias.dtype == dtype
      got = [tf.cast(t, tf.float32).numpy() for t in (out, dx)]
      if dtype == tf.float32:
        # GELU within float32's rounding of its tanh, which the compiler may compute its own
        # way; the others bit for bit.
        for g, want in zip(got, expected(reference, once)):
          np.testing.assert_allclose(g, want, rtol=1e-6 if name == "gelu" else 0, atol=1e-7)
      elif amx:
        for g, want in zip(got, expected(reference, once)):  # bit for bit
          np.testing.assert_array_equal(g, want)
      elif not compiled:
        for g, want in zip(got, expected(reference, rounded)):  # BiasAdd, then the pass
          np.testing.assert_array_equal(g, want)
      else:
        # BiasAdd, then the pass: XLA may fuse the two and skip BiasAdd's rounding, so each
        # value is one of the two forms', bit for bit.
        for g, a, b in zip(got, expected(reference, rounded), expected(reference, once)):
          assert np.all((g == a) | (g == b)), name
      rows = tf.cast(dx, tf.float64).numpy().sum(axis=0)
      np.testing.assert_allclose(tf.cast(dbias, tf.float64).numpy(), rows,
                                 rtol={tf.float32: 1e-5}.get(dtype, 2**-8), atol=1e-3)
  # Not training: the bias is added by BiasAdd, which inference's matmul fuses.
  np.testing.assert_array_equal(kernels.dropout(x, 0.1, False, seed, bias).numpy(),
                                tf.nn.bias_add(x, bias).numpy())


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_seeded_dropout_drops_at_the_rate_and_scales_the_rest(dtype, rate):
  x = tf.cast(tf.random.stateless_uniform([256, 1001], [1, 2], 1.0, 2.0), dtype)  # odd size
  seed = tf.constant([7, 11], tf.int64)
  y = kernels.dropout(x, rate, True, seed).numpy().astype(np.float32)
  kept = y != 0
  # 256,256 draws: the dropped fraction is within 5 standard deviations of the rate, in every
  # dtype (bfloat16 uniform floats would have made 0.1 into 0.1016, 16 standard deviations off).
  assert abs((1 - kept.mean()) - rate) < 5 * math.sqrt(rate * (1 - rate) / y.size)
  expected = x.numpy().astype(np.float32) / (1 - rate)
  np.testing.assert_allclose(y[kept], expected[kept], rtol={tf.float32: 1e-6}.get(dtype, 1e-2))
  np.testing.assert_array_equal(kernels.dropout(x, rate, True, seed).numpy().astype(np.float32), y)
  # Independent masks for seeds a bit apart in either word or either half of a word, and
  # independent neighbours along a row and down a column: each pair of masks agrees as often as
  # two independent draws would, within 5 standard deviations.
  def independent(a, b):
    both = (a & b).mean()
    assert abs(both - (1 - rate) ** 2) < 5 * math.sqrt((1 - rate) ** 2 / a.size), (both, rate)
  for other_seed in ([7, 12], [6, 11], [7 + 2**32, 11], [7, 11 + 2**40]):
    other = kernels.dropout(x, rate, True, tf.constant(other_seed, tf.int64)).numpy() != 0
    independent(kept, other)
  independent(kept[:, 1:], kept[:, :-1])
  independent(kept[1:], kept[:-1])
  # The gradient is the same mask and scale applied to the upstream gradient.
  dy = tf.cast(tf.random.stateless_uniform(x.shape, [3, 4], 1.0, 2.0), dtype)
  with tf.GradientTape() as tape:
    tape.watch(x)
    out = kernels.dropout(x, rate, True, seed)
  dx = tape.gradient(out, x, output_gradients=dy).numpy().astype(np.float32)
  np.testing.assert_array_equal(dx != 0, kept)
  np.testing.assert_allclose(dx[kept], dy.numpy().astype(np.float32)[kept] / (1 - rate),
                             rtol={tf.float32: 1e-6}.get(dtype, 1e-2))
  # Under XLA: the same mask.
  xla = tf.function(lambda v: kernels.dropout(v, rate, True, seed), jit_compile=True)
  np.testing.assert_array_equal(xla(x).numpy().astype(np.float32), y)


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_attention_probs_kernel_is_softmax_then_dropout_with_their_gradient(dtype):
  # Odd sizes; the second sequence's last 9 keys are padding.
  scores = tf.cast(tf.random.stateless_normal([2, 3, 17, 33], [5, 6], stddev=3.0), dtype)
  mask_adder = tf.constant(
      [[[[0.0] * 33]], [[[0.0] * 24 + [-10000.0] * 9]]], tf.float32)
  seed = tf.constant([7, 11], tf.int64)
  dy = tf.cast(tf.random.stateless_normal(scores.shape, [8, 9]), dtype)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(scores)
    ours = kernels.attention_probs(scores, mask_adder, 0.1, True, seed)
    # The chain it replaces: float32 softmax, the seeded dropout, the cast to the scores' dtype.
    reference = tf.cast(kernels.dropout(kernels.masked_softmax(scores, mask_adder), 0.1, True,
                                        seed), dtype)
  assert ours.dtype == dtype
  np.testing.assert_array_equal(ours.numpy(), reference.numpy())  # the same mask, one rounding
  kept = ours.numpy() != 0
  assert 0.8 < kept[..., :24].mean() < 0.97 and not kept[1, ..., 24:].any()
  got = tape.gradient(ours, scores, output_gradients=dy).numpy().astype(np.float32)
  want = tape.gradient(reference, scores, output_gradients=dy).numpy().astype(np.float32)
  # The same formula in one pass, to one rounding step of the dtype (the row sums' order
  # differs).
  step = {tf.bfloat16: 2**-7, tf.float16: 2**-10}[dtype]
  np.testing.assert_allclose(got, want, rtol=step, atol=step * np.abs(want).max())
  assert np.abs(want).max() > 0.1 and (got[1, ..., 24:] == 0).all()
  # Inference: the plain chain, no dropout.
  np.testing.assert_array_equal(
      kernels.attention_probs(scores, mask_adder, 0.1, False, seed).numpy(),
      tf.cast(kernels.masked_softmax(scores, mask_adder), dtype).numpy())
  # Inside a compiled step (run_pretraining --use_xla): the same mask, the probabilities to
  # rounding (XLA's softmax, not oneDNN's).
  compiled = tf.function(lambda s: kernels.attention_probs(s, mask_adder, 0.1, True, seed),
                         jit_compile=True)(scores).numpy().astype(np.float32)
  np.testing.assert_array_equal(compiled != 0, kept)
  np.testing.assert_allclose(compiled, ours.numpy().astype(np.float32), rtol=step, atol=1e-7)


@pytest.mark.parametrize("dtype", [pytest.param(tf.bfloat16, marks=pytest.mark.onednn_bf16),
                                   tf.float16])
def test_mixed_precision_is_close_to_float32(dtype):
  tf.random.set_seed(1)
  config = _tiny_config()
  ref = modeling.BertPretrainer(config)
  low = modeling.BertPretrainer(config, compute_dtype=dtype)
  for a, b in zip(ref.variables, low.variables):
    b.assign(a)
  assert all(v.dtype == tf.float32 for v in low.variables)
  features = {"input_ids": tf.constant([[2, 7, 9, 3, 4, 5]]), "input_mask": tf.ones([1, 6], tf.int32),
              "segment_ids": tf.constant([[0, 0, 0, 1, 1, 1]]),
              "masked_lm_positions": tf.constant([[1, 4]])}
  r, l = ref(features), low(features)
  assert l["sequence_output"].dtype == dtype
  assert l["masked_lm_log_probs"].dtype == tf.float32
  np.testing.assert_allclose(l["masked_lm_log_probs"].numpy(), r["masked_lm_log_probs"].numpy(),
                             atol=0.1)


@pytest.mark.onednn_bf16
def test_bfloat16_training_sums_bias_gradients_in_float32():
  # TensorFlow's BiasAddGrad sums bfloat16 rows in bfloat16: over 32k rows of small positive
  # values it lost 96% of the sum. The training path's bias gradient is the float32 sum, rounded,
  # on every CPU (where bf16 is emulated, its matmul's partial sums are bf16: 0.75% off).
  rng = np.random.default_rng(0)
  dense = modeling.Dense(8, 64, _tiny_config())
  x = tf.constant(rng.normal(size=[32768, 8]), tf.bfloat16)
  dy = tf.constant(rng.normal(size=[32768, 64]) * 1e-3 + 1e-3, tf.bfloat16)
  for training in (True, False):
    with tf.GradientTape() as tape:
      y = dense(x, training=training)
    grad = tape.gradient(y, dense.bias, output_gradients=dy).numpy()
    exact = dy.numpy().astype(np.float64).sum(axis=0)
    error = np.abs(grad - exact).max() / np.abs(exact).max()
    if training:
      assert grad.dtype == np.float32 and error < 2 ** -8, error
    elif devices.on_gpu():
      assert error > 2 ** -8  # the plain op on an H200: 0.85% off (its CUDA kernel does better)
    else:
      assert error > 0.5  # the plain op, as measured: if TensorFlow fixes it, drop the workaround


@pytest.mark.onednn_bf16
@pytest.mark.parametrize("gpu", [False, True])
def test_half_precision_bias_gradients_on_a_gpu_are_float32_sums(gpu, monkeypatch):
  """On a GPU the bias gradient of bf16 and fp16 training is the float32 sum of the rows, rounded
  once (an H200 summed a near-cancelling column 1.7% off as a bf16 matmul, and TensorFlow's fp16
  BiasAddGrad was 0.43% off); on a CPU it stays BiasAddGrad in fp16 (float32 accumulation) and a
  ones-matmul in bf16 where oneDNN accumulates in float32. Which ops the gradient is made of, as
  traced with the GPU's answers to devices' questions, and its value: the float32 sum rounded."""
  monkeypatch.setattr(devices, "on_gpu", lambda: gpu)
  monkeypatch.setattr(devices, "bf16_accumulates_in_float32", lambda: not gpu)
  rng = np.random.default_rng(4)
  rows = rng.normal(size=[1024, 96])
  rows[:, 3] -= rows[:, 3].mean()  # a column that nearly cancels
  for dtype, cpu_op in ((tf.bfloat16, "MatMul"), (tf.float16, "BiasAddGrad")):
    dy = tf.constant(rows, dtype)
    graph = tf.function(kernels._bias_gradient).get_concrete_function(  # pylint: disable=protected-access
        tf.TensorSpec([None, 96], dtype)).graph
    ops = {op.type for op in graph.get_operations()}
    if gpu:
      assert "Sum" in ops and not ops & {"MatMul", "BiasAddGrad"}, ops
    else:
      assert cpu_op in ops and "Sum" not in ops, ops
    want = tf.cast(tf.reduce_sum(tf.cast(dy, tf.float32), 0), dtype).numpy()
    got = kernels._bias_gradient(dy).numpy()  # pylint: disable=protected-access
    if gpu:
      np.testing.assert_array_equal(got, want)


@pytest.mark.onednn_bf16
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_bfloat16_training_gradients_are_close_to_float32_at_a_real_batch_size(dropout):
  tf.random.set_seed(3)
  # With dropout the biases of the attention's output and the feed-forward block are added in
  # dropout's pass (kernels.dropout); seeded, both models draw the same masks.
  config = _tiny_config(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
  seed = tf.constant([5, 6], tf.int64) if dropout else None
  ref = modeling.BertModel(config)
  low = modeling.BertModel(config, compute_dtype=tf.bfloat16)
  for a, b in zip(ref.variables, low.variables):
    b.assign(a)
  ids = tf.random.stateless_uniform([64, 32], [1, 2], 0, 50, tf.int32)  # 2,048 rows a matmul
  weights = tf.random.stateless_normal([64, 32, 16], [3, 4])

  def gradients(model):
    with tf.GradientTape() as tape:
      out = model(ids, training=True, dropout_seed=seed)["sequence_output"]
      loss = tf.reduce_sum(tf.cast(out, tf.float32) * weights)
    return {v.name: g for v, g in zip(model.trainable_variables,
                                      tape.gradient(loss, model.trainable_variables))}

  want, got = gradients(ref), gradients(low)
  # The keys' bias has no gradient but rounding noise (softmax ignores a constant per query).
  biases = [n for n in want if "encoder" in n and n.endswith("/bias:0") and "/key/" not in n]
  assert len(biases) == 10, biases
  for name in biases:
    error = np.linalg.norm(got[name] - want[name]) / np.linalg.norm(want[name])
    assert error < 0.02, (name, error)  # 0.003-0.006; BiasAddGrad: 0.03-0.05


def test_pretraining_heads_read_the_full_encoder_at_their_positions():
  """The pre-training model runs its last layer only at [CLS] and the masked positions; its
  outputs are the heads applied to the full encoder's output there."""
  model = modeling.BertPretrainer(_tiny_config())
  features = {"input_ids": tf.constant([[2, 7, 9, 3], [2, 8, 3, 0]]),
              "input_mask": tf.constant([[1, 1, 1, 1], [1, 1, 1, 0]]),
              "segment_ids": tf.zeros([2, 4], tf.int32),
              "masked_lm_positions": tf.constant([[1, 2, 0], [2, 0, 0]])}
  out = model(features)
  assert out["masked_lm_log_probs"].shape == (6, 50)
  full = model.bert(features["input_ids"], features["input_mask"], features["segment_ids"])
  # Row 1 of example 0 is the head applied to sequence position 2 of example 0.
  h = model.masked_lm.layer_norm(model.masked_lm.dense(full["sequence_output"][0:1, 2]))
  logits = tf.matmul(h, model.bert.embedding_table, transpose_b=True) + model.masked_lm.output_bias
  np.testing.assert_allclose(out["masked_lm_log_probs"][1].numpy(),
                             tf.nn.log_softmax(logits)[0].numpy(), atol=1e-5)
  np.testing.assert_allclose(out["next_sentence_log_probs"].numpy(),
                             model.next_sentence(full["pooled_output"]).numpy(), atol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_output_positions_give_the_full_last_layer_there_and_its_gradients(packed):
  """`output_positions` computes the last layer at those positions only: the same outputs as
  the full encoder gathered there, and the same gradients for every variable (training mode,
  dropout 0 so both paths are deterministic; packed sequences: a mask row per query)."""
  config = _tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  model = modeling.BertModel(config)
  ids = tf.constant([[2, 7, 9, 3, 5, 6], [2, 8, 3, 4, 0, 0]])
  mask = tf.constant([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
  positions = tf.constant([[0, 4, 2, 2], [0, 3, 1, 0]])  # repeats, as padded predictions
  kwargs = {}
  if packed:
    instance_ids = tf.constant([[1, 1, 1, 2, 2, 2], [1, 1, 2, 2, 0, 0]])
    kwargs = {"instance_ids": instance_ids,
              "position_ids": modeling.packed_position_ids(instance_ids)}
  weights = tf.random.stateless_normal([2, 4, 16], [1, 2])

  def losses(training):
    with tf.GradientTape(persistent=True) as tape:
      full = model(ids, mask, training=training, **kwargs)
      part = model(ids, mask, training=training, output_positions=positions, **kwargs)
      want = tf.gather(full["sequence_output"], positions, batch_dims=1)
      got = part["sequence_output"]
      loss_full = tf.reduce_sum(want * weights) + tf.reduce_sum(full["pooled_output"])
      loss_part = tf.reduce_sum(got * weights) + tf.reduce_sum(part["pooled_output"])
    return want, got, tape.gradient(loss_full, model.trainable_variables), tape.gradient(
        loss_part, model.trainable_variables)

  for training in (False, True):
    want, got, grads_full, grads_part = losses(training)
    assert got.shape == (2, 4, 16)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
    for v, a, b in zip(model.trainable_variables, grads_full, grads_part):
      a, b = (tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v) for g in (a, b))
      np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-4, err_msg=v.name)


GOOD_CONFIG = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=32, max_position_embeddings=32, type_vocab_size=2)

# (key, bad value, what the message says): every field of the config.
BAD_FIELDS = [
    ("vocab_size", 0, "positive integer"),
    ("hidden_size", -16, "positive integer"),
    ("num_hidden_layers", 2.5, "positive integer"),
    ("num_attention_heads", "4", "positive integer"),
    ("intermediate_size", True, "positive integer"),
    ("max_position_embeddings", None, "positive integer"),
    ("type_vocab_size", 2.0, "positive integer"),
    ("num_hidden_layers", [2], "positive integer"),
    ("hidden_size", 10**9, "at most 65536"),
    ("vocab_size", 10**30, "at most"),
    ("hidden_dropout_prob", 1.0, r"probability in \[0, 1\)"),
    ("attention_probs_dropout_prob", -0.1, "probability"),
    ("hidden_dropout_prob", "0.1", "probability"),
    ("hidden_dropout_prob", float("nan"), "probability"),
    ("initializer_range", 0, "positive number"),
    ("layer_norm_eps", -1e-12, "positive number"),
    ("layer_norm_eps", float("inf"), "positive number"),
    ("initializer_range", False, "positive number"),
    ("hidden_act", "mish", "one of"),
    ("hidden_act", ["gelu"], "one of"),
]


@pytest.mark.parametrize("key,value,message", BAD_FIELDS)
def test_every_config_field_is_validated_naming_the_key_and_file(key, value, message):
  with pytest.raises(errors.InputError, match=rf"^my/bert_config\.json: {key} must be "
                                                       rf".*{message}"):
    modeling.BertConfig.from_dict(dict(GOOD_CONFIG, **{key: value}), "my/bert_config.json")


def test_config_cross_field_and_size_errors():
  with pytest.raises(errors.InputError, match="c.json: hidden_size 10 is not a multiple "
                                                       "of num_attention_heads 3"):
    modeling.BertConfig.from_dict(dict(GOOD_CONFIG, hidden_size=10, num_attention_heads=3),
                                  "c.json")
  # Each size within its bound, the whole far beyond memory: refused before any variable is made.
  with pytest.raises(errors.InputError,
                     match=r"c.json: the model would have about 8.2e\+11 parameters"):
    modeling.BertConfig.from_dict(dict(GOOD_CONFIG, hidden_size=8192, num_hidden_layers=1024,
                                       intermediate_size=32768), "c.json")
  for key in ("vocab_size", "num_hidden_layers", "type_vocab_size"):
    d = dict(GOOD_CONFIG)
    del d[key]
    with pytest.raises(errors.InputError, match=f"c.json: the BERT config has no {key}"):
      modeling.BertConfig.from_dict(d, "c.json")
  # Every missing size named in the one error, not one per run.
  with pytest.raises(errors.InputError,
                     match="has no vocab_size, hidden_size, intermediate_size "):
    modeling.BertConfig.from_dict({k: v for k, v in GOOD_CONFIG.items() if k not in (
        "vocab_size", "hidden_size", "intermediate_size")}, "c.json")
  # A config made in Python is checked when a model is built from it (the original's order: its
  # tests make configs such as hidden_size 37 that no model is built from).
  config = modeling.BertConfig(vocab_size=-1)
  with pytest.raises(errors.InputError, match="vocab_size must be a positive integer"):
    modeling.BertModel(config)
  # The defaults of the Python constructor and of the original config's optional keys are valid.
  config = modeling.BertConfig.from_dict(GOOD_CONFIG, "c.json")
  assert (config.hidden_act, config.hidden_dropout_prob, config.layer_norm_eps) == (
      "gelu", 0.1, 1e-12)


@pytest.mark.parametrize("name,layers,hidden,heads", [
    ("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8), ("medium", 8, 512, 8),
    ("base", 12, 768, 12), ("large", 24, 1024, 16)])
def test_the_published_sizes_configs(name, layers, hidden, heads):
  """configs/bert_config_NAME.json: Google's released sizes (BERT-Tiny ... BERT-Large, uncased
  vocab), for pre-training from scratch."""
  config = modeling.BertConfig.from_json_file(os.path.join(ROOT, "configs",
                                                           f"bert_config_{name}.json"))
  assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
          config.intermediate_size, config.vocab_size) == (layers, hidden, heads, 4 * hidden, 30522)
  if name == "base":  # bert-base-uncased's 109,482,240 parameters, pooler included
    model = modeling.BertModel(config)
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == 109_482_240


def test_unknown_config_keys_are_warned_about_except_harmless_ones(caplog):
  with caplog.at_level("WARNING"):
    modeling.BertConfig.from_dict(dict(GOOD_CONFIG, num_hidden_layer=4, hiden_act="relu"),
                                  "typo.json")
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert warnings == ["typo.json: unknown key(s) hiden_act, num_hidden_layer in the BERT config "
                      "are ignored (misspelt?)"]
  caplog.clear()
  with caplog.at_level("WARNING"):
    if os.path.isdir(SHARED):  # The original's tiny config: pooler_*, directionality.
      modeling.BertConfig.from_json_file(
          os.path.join(SHARED, "data", "checkpoints", "tiny_tf1_test_checkpoint",
                       "bert_config.json"))
    modeling.BertConfig.from_json_file(os.path.join(minilm_dir(), "config.json"))
    modeling.BertConfig.from_hf_dict(modeling.BertConfig(**GOOD_CONFIG).to_hf_dict(), "hf.json")
  assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_config_file_errors_name_the_file(tmp_path):
  bad = tmp_path / "bert_config.json"
  bad.write_text('{"hidden_size": 8')
  with pytest.raises(errors.InputError, match="bert_config.json: not a JSON config"):
    modeling.BertConfig.from_json_file(str(bad))
  bad.write_text('{"vocab_size": 1' + "0" * 5000 + "}")
  with pytest.raises(errors.InputError, match="bert_config.json: not a JSON config"):
    modeling.BertConfig.from_json_file(str(bad))
  bad.write_text("[1, 2]")
  with pytest.raises(errors.InputError, match="a BERT config is a JSON object"):
    modeling.BertConfig.from_json_file(str(bad))
  bad.write_text(json.dumps(dict(GOOD_CONFIG, model_type="bert", hidden_act=["gelu"])))
  with pytest.raises(errors.InputError, match="bert_config.json: HuggingFace hidden_act"):
    modeling.BertConfig.from_json_file(str(bad))


def test_a_batch_of_zero_rows_gives_empty_outputs():
  """A multi-worker job hands an exhausted worker empty batches until every worker is done: the
  model must take them (a reshape with -1 could not)."""
  model = modeling.BertPretrainer(_tiny_config())
  empty = tf.zeros([0, 6], tf.int32)
  full = model.bert(empty, empty, empty)
  assert full["sequence_output"].shape == (0, 6, 16) and full["pooled_output"].shape == (0, 16)
  features = {"input_ids": empty, "input_mask": empty, "segment_ids": empty,
              "masked_lm_positions": tf.zeros([0, 3], tf.int32),
              "masked_lm_ids": tf.zeros([0, 3], tf.int32),
              "masked_lm_weights": tf.zeros([0, 3]), "next_sentence_labels": tf.zeros([0, 1])}
  out = model(features, training=True)
  assert out["masked_lm_log_probs"].shape == (0, 50)
  assert out["masked_lm_nll"].shape == out["masked_lm_correct"].shape == (0,)
  assert out["next_sentence_log_probs"].shape == (0, 2)
  losses = modeling.pretraining_losses(features, out)
  assert all(float(total) == float(count) == 0.0 for total, count in losses.values())


def test_bfloat16_softmax_is_the_float32_softmax_rounded():
  """Inference's bf16 attention softmax (kernels.masked_softmax as the Trainer asks for it) is
  taken in bf16 where TensorFlow's bf16 softmax kernel computes in float32 and rounds once
  (devices.bf16_accumulates_in_float32: CPUs with bf16 instructions), in float32 elsewhere:
  either way its probabilities must be the float32 softmax's within one bf16 rounding step (XLA's
  CPU softmax, which accumulates in bf16, is 4% off and would fail; so is TensorFlow's fallback
  kernel on an AVX2-only CPU, and its CUDA kernel on an H200, 0.43%). Scores of a seq-384
  attention with padded keys."""
  rng = np.random.default_rng(0)
  scores = tf.constant(rng.normal(0, 3, [2, 12, 384, 384]), tf.bfloat16)
  mask_adder = tf.constant((rng.random([2, 1, 1, 384]) < 0.2) * -10000.0, tf.float32)
  want = tf.nn.softmax(tf.cast(scores, tf.float32) + mask_adder).numpy()
  in_bf16 = devices.bf16_accumulates_in_float32()
  probabilities = kernels.masked_softmax(scores, mask_adder, bf16_softmax=in_bf16)
  assert probabilities.dtype == (tf.bfloat16 if in_bf16 else tf.float32)
  got = tf.cast(probabilities, tf.float32).numpy()
  assert np.all(got[np.broadcast_to(mask_adder.numpy() < 0, got.shape)] == 0)
  big = want > 1e-6
  assert np.max(np.abs(got - want)[big] / want[big]) <= 2.0 ** -8
  assert np.max(np.abs(got.sum(-1) - 1)) < 0.01


@pytest.mark.slow
@pytest.mark.parametrize("head", ["classifier", "pretrainer"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(head):
  """Recomputing each layer in the backward pass (dropout on, stateless seeds, inside a
  tf.function as the training loop runs it) gives the plain path's loss and gradients; the
  pre-trainer's last layer runs at the masked positions only, and is recomputed there."""
  config = _tiny_config(num_hidden_layers=3)
  rng = np.random.RandomState(0)
  ids = rng.randint(5, 50, (4, 16))
  mask = np.ones_like(ids)
  mask[:, 12:] = 0
  features = {"input_ids": tf.constant(ids * mask, tf.int32), "input_mask": tf.constant(mask),
              "segment_ids": tf.constant((np.arange(16) >= 6).astype(int)[None].repeat(4, 0))}
  if head == "classifier":
    model = modeling.BertClassifier(config, 3)
    features.update(label_ids=tf.constant([0, 1, 2, 1]), is_real_example=tf.ones([4]))
    loss_fn = modeling.classifier_losses(False)
  else:
    model = modeling.BertPretrainer(config)
    features.update(masked_lm_positions=tf.constant(rng.randint(1, 12, (4, 3))),
                    masked_lm_ids=tf.constant(rng.randint(5, 50, (4, 3))),
                    masked_lm_weights=tf.ones([4, 3]), next_sentence_labels=tf.constant(
                        [[0], [1], [1], [0]]))
    loss_fn = modeling.pretraining_losses

  def step(checkpointing):
    model.bert.gradient_checkpointing = checkpointing

    @tf.function
    def run():
      with tf.GradientTape() as tape:
        stats = loss_fn(features, model(features, training=True,
                                        dropout_seed=tf.constant([7, 0], tf.int64)))
        loss = tf.add_n([s / c for k, (s, c) in stats.items() if k.endswith("_loss")])
      return loss, tape.gradient(loss, model.trainable_variables)
    return run()

  loss, grads = step(False)
  loss_checkpointed, grads_checkpointed = step(True)
  assert float(loss_checkpointed) == pytest.approx(float(loss), abs=1e-6)
  assert len(grads) > 30 and all(g is not None for g in grads_checkpointed)
  assert all(float(tf.norm(g)) > 0 for g in grads[:-2])  # a loss that reaches the weights
  for name, a, b in zip([v.name for v in model.trainable_variables], grads, grads_checkpointed):
    np.testing.assert_allclose(tf.convert_to_tensor(b), tf.convert_to_tensor(a), atol=1e-6,
                               err_msg=name)
  # Stateful dropout would be drawn anew in the recomputation: refused.
  model.bert.gradient_checkpointing = True
  with pytest.raises(ValueError, match="needs a dropout_seed"):
    model(features, training=True)
