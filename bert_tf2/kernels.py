"""The model's numerical kernels: the ops of modeling.py's blocks where TensorFlow's own were slow
or inexact, each with what was measured.

GELU as one compiled pass each way, seeded dropout (a counter hash, no mask held), BiasAdd with
a float32 bias gradient in bfloat16, LayerNorm's forward and backward passes, the attention's
masked softmax and its probabilities' dropout and gradient, and the masked-LM loss over the
vocabulary. Free functions of tensors: the variables, their names and the model's structure
stay in modeling.py.
"""

import math

import tensorflow as tf

from bert_tf2 import devices


# GELU(x) = x * Phi(x) (Phi, phi: the standard normal CDF and density), so its derivative is
# Phi(x) + x * phi(x); the tanh form's is the chain rule through 0.5 * x * (1 + tanh(u(x))).
# In float32 whatever x's dtype: the result is rounded once, in _gelu_grad.
def _gelu_derivative(x, approximate):
  x = tf.cast(x, tf.float32)
  if approximate:
    c = math.sqrt(2.0 / math.pi)
    t = tf.tanh(c * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
  return 0.5 * (1.0 + tf.math.erf(x * (1.0 / math.sqrt(2.0)))) + x * tf.exp(
      -0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))


# `approximate` is a Python bool, fixed when traced: one trace per GELU form. `bias`: added to x
# in float32 inside the pass (see `gelu_for_training`).
@tf.function(jit_compile=True)
def _gelu_forward(x, bias, approximate):
  return tf.cast(tf.nn.gelu(_plus(x, bias), approximate=approximate), x.dtype)


@tf.function(jit_compile=True)
def _gelu_grad(x, bias, dy, approximate):
  return tf.cast(tf.cast(dy, tf.float32) * _gelu_derivative(_plus(x, bias), approximate),
                 dy.dtype)


def _plus(x, bias):
  """float32(x) + float32(bias) (bias None: float32(x)), traced inside a compiled pass."""
  x = tf.cast(x, tf.float32)
  return x if bias is None else x + tf.cast(bias, tf.float32)


def gelu_for_training(approximate):
  """tf.nn.gelu computed in float32 and rounded once to x's dtype, as one compiled elementwise
  pass each way: tf.nn.gelu is not one kernel but five to seven ops (pow, multiplies, adds,
  tanh or erf), each a pass over the [tokens, intermediate] activations in the compute dtype
  (in bfloat16 each one rounding), and autodiff made ten or so more of its gradient. The
  gradient alone made the feed-forward block's backward about twice as fast on CPU (a BERT-base
  bf16 training step ~6% faster); the forward pass, 6% of a BERT-base bf16 step's op time on an
  AMX Xeon, went from 11.2 to 3.5 ms a layer (batch 8 x 128). Used only when training: inference
  keeps oneDNN's fused matmul + bias + GELU, which also computes in float32 and rounds once.

  The GELU returned takes (x, bias=None): GELU(x + bias), the bias added in the same pass (and
  its gradient, the sum of x's over the rows, see `_bias_gradient`), so that the matmul before
  it runs without oneDNN's bias epilogue (see `bias_add`; where `_bias_in_pass` says no, by
  `bias_add` first)."""

  @tf.custom_gradient
  def gelu(x):
    # Only x is kept for the backward pass, which recomputes the derivative from it: none of
    # the forward's intermediates (the erf / tanh terms) is held in memory in between.
    return _gelu_forward(x, None, approximate), lambda dy: _gelu_grad(x, None, dy, approximate)

  @tf.custom_gradient
  def gelu_plus(x, bias):
    def grad(dy):
      dx = _gelu_grad(x, bias, dy, approximate)
      return dx, _bias_gradient(dx)
    return _gelu_forward(x, bias, approximate), grad

  def gelu_(x, bias=None):
    if bias is not None and not _bias_in_pass(x.dtype):
      x, bias = bias_add(x, bias, True), None
    return gelu(x) if bias is None else gelu_plus(x, bias)

  return gelu_


def dropout(x, rate, training, seed, bias=None):
  """Dropout only when training. With a seed (a [2] int tensor, see modeling's
  `BertModel.__call__`) the mask is a pure function of that seed, so a resumed run draws the same
  masks as an uninterrupted one, and the backward pass (or gradient checkpointing's second
  forward) recomputes it rather than holding it.

  The seeded mask is drawn inside one compiled pass each way (_seeded_dropout): the random bits
  of an element are a hash of its index and the seed, kept where they are at least
  round(rate * 2^32), so the rate is exact to 2^-32; the kept values are scaled by 1 / (1 - rate)
  in float32 and rounded once (bfloat16's 1 / 0.9 would be 1.109, not 1.111).

  `bias` (optional, [x's last axis]): dropout of x + bias. With a seed (and `_bias_in_pass`) the
  bias is added in the same pass, in float32, and its gradient summed from the pass's, so that
  the matmul before it runs without oneDNN's bias epilogue (see `bias_add`); otherwise
  `bias_add` first.
  """
  if bias is not None and (not training or rate == 0.0 or seed is None
                           or not _bias_in_pass(x.dtype)):
    x, bias = bias_add(x, bias, training), None
  if not training or rate == 0.0:
    return x
  if seed is None:
    return tf.nn.dropout(x, rate=rate)
  threshold, scale, seed = _dropout_constants(rate, seed)

  @tf.custom_gradient
  def dropout_(x):
    # The gradient is the same mask and scale applied to dy: nothing but the seed is held.
    return (_seeded_dropout(x, seed, threshold, scale),
            lambda dy: _seeded_dropout(dy, seed, threshold, scale))

  @tf.custom_gradient
  def dropout_plus(x, bias):
    def grad(dy):
      dx = _seeded_dropout(dy, seed, threshold, scale)
      return dx, _bias_gradient(dx)
    return _seeded_dropout(x, seed, threshold, scale, bias=bias), grad

  return dropout_(x) if bias is None else dropout_plus(x, bias)


def _bias_in_pass(dtype):
  """Whether training adds a dense layer's bias in the compiled pass after its matmul rather than
  in oneDNN's epilogue of the matmul (`bias_add` says where each was measured faster): in float32
  and, on a CPU whose bf16 matmuls run on AMX, in bfloat16 / float16."""
  return dtype == tf.float32 or devices.amx_matmul()


def _dropout_constants(rate, seed):
  """(threshold, scale, seed) of a seeded dropout pass: see `dropout`."""
  return (tf.constant(min(round(rate * 2**32), 2**32 - 1), tf.uint32),
          tf.constant(1.0 / (1.0 - rate), tf.float32), tf.cast(seed, tf.int64))


def _mix32(h):
  """MurmurHash3's 32-bit finaliser: a bijection of uint32 whose every output bit depends on
  every input bit."""
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 16)) * tf.constant(0x85EBCA6B, tf.uint32)
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 13)) * tf.constant(0xC2B2AE35, tf.uint32)
  return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 16))


# Dropout's random bits made by hand rather than by TensorFlow's generator: its stateless Philox
# (StatelessRandomUniformFullIntV2) took 4 ns a 32-bit number on an AMX Xeon's two cores, 5% of a
# BERT-base bf16 pre-training step's op time for 37 dropout masks, and under XLA it is 4x slower
# still; a counter hash (two rounds of _mix32 over the element's index, keyed by the seed) is a
# few integer instructions per element, fused with the multiply and select in one compiled pass
# (a [1024, 768] dropout, forward and backward, 3.2 -> 1.9 ms). A dropout mask needs independent
# fair bits, not a cryptographic stream: tests/test_modeling.py checks the rate, neighbouring
# elements and seeds for independence.
def _kept(x, seed, threshold):
  """Dropout's mask for x: True where x's element is kept (traced inside a compiled pass)."""
  words = tf.bitwise.bitwise_xor(tf.bitcast(seed, tf.uint32), tf.constant(
      [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], tf.uint32, shape=[2, 2]))
  key = _mix32(words[:, 0] + _mix32(words[:, 1]))  # one uint32 from each of the seed's halves
  index = tf.cast(tf.range(tf.size(x)), tf.uint32)
  bits = _mix32(_mix32(index * tf.constant(0x9E3779B9, tf.uint32) + key[0]) ^ key[1])
  return tf.reshape(bits >= threshold, tf.shape(x))


@tf.function(jit_compile=True)
def _seeded_dropout(x, seed, threshold, scale, dtype=None, bias=None):
  """x (+ bias) dropped, in float32, rounded once to `dtype` (x's when None)."""
  return tf.cast(tf.where(_kept(x, seed, threshold), _plus(x, bias) * scale, 0.0),
                 dtype or x.dtype)


@tf.function(jit_compile=True)
def _attention_probs_grad(probs, seed, threshold, scale, dy, dtype):
  """The scores' gradient through dropout and the softmax (probs: its float32 output), in one
  pass: softmax's gradient is probs * (d - sum(d * probs)) for d the probabilities' gradient."""
  d = tf.where(_kept(probs, seed, threshold), tf.cast(dy, tf.float32) * scale, 0.0)
  return tf.cast(probs * (d - tf.reduce_sum(d * probs, -1, keepdims=True)), dtype)


def attention_probs(scores, mask_adder, rate, training, seed, bf16_softmax=False):
  """The attention's probabilities in scores' dtype: masked_softmax, then dropout when training.

  Training with a seed: the dropout and the cast to scores' dtype are one compiled pass, and the
  backward pass another (dropout's mask on the gradient, then the softmax's gradient, rounded
  once) from the float32 probabilities the forward pass keeps. Autodiff made eight passes of
  the backward's (a cast, dropout, TensorFlow's four softmax-gradient ops, a cast) and three of
  the forward's: 12 layers' attention probabilities of BERT-base at batch 8 x 128 (forward and
  backward, bf16) 67-73 -> 52-58 ms on 2 cores of a Xeon with AMX (benchmarks/log/2026-11-30.md).
  The same mask as `dropout` with this seed. Only for bfloat16 / float16 scores: in float32 there
  are no casts to save (the passes alone 1.06-1.08x, nothing a float32 step's A/B could see)."""
  if not training or rate == 0.0 or seed is None or scores.dtype == tf.float32:
    probs = dropout(masked_softmax(scores, mask_adder, bf16_softmax), rate, training, seed)
    return tf.cast(probs, scores.dtype)
  threshold, scale, seed = _dropout_constants(rate, seed)

  @tf.custom_gradient
  def probs_(scores):
    probs = masked_softmax(scores, mask_adder)
    return (_seeded_dropout(probs, seed, threshold, scale, scores.dtype),
            lambda dy: _attention_probs_grad(probs, seed, threshold, scale, dy, scores.dtype))

  return probs_(scores)


def _bias_gradient(dy):
  """The gradient of a bias added to every row of dy's last axis: the sum of dy's rows, taken
  in float32 and rounded once to dy's dtype.

  TensorFlow's BiasAddGrad sums bfloat16 rows in bfloat16: once the running sum is large, each
  new row falls below its rounding step. Measured on rows of small positive values (as a bias
  gradient often is): 22% off at 1,024 rows, 87% at 8,192 (a batch of 64 x 128 tokens), 96% at
  32,768 (pre-training's 256 x 128). float16 and float32 BiasAddGrads accumulate in float32.
  For bfloat16 the sum is a [1, rows] x [rows, n] matmul with a row of ones, which oneDNN
  accumulates in float32 and runs faster than BiasAddGrad (a [1024, 3072] bias gradient
  652 -> 387 us on the 2-core EPYC of benchmarks/README.md). On a GPU neither holds: there
  BiasAddGrad was 0.43% off in float16 and the matmul 1.7% off in bfloat16 (an H200,
  2026-11-30; devices.bf16_accumulates_in_float32), so both sum in float32 outright.
  """
  if dy.dtype in (tf.float32, tf.float64) or (dy.dtype == tf.float16 and not devices.on_gpu()):
    return tf.raw_ops.BiasAddGrad(out_backprop=dy)
  rows = tf.reshape(dy, [-1, tf.shape(dy)[-1]])
  if dy.dtype == tf.bfloat16 and devices.bf16_accumulates_in_float32():
    return tf.matmul(tf.ones([1, tf.shape(rows)[0]], dy.dtype), rows)[0]
  # Emulated bf16 (a CPU without bf16 instructions), whose matmul rounds partial sums to
  # bfloat16, and a GPU: the sum taken in float32 outright.
  return tf.cast(tf.reduce_sum(tf.cast(rows, tf.float32), 0), dy.dtype)


@tf.function(jit_compile=True)
def _add(y, bias):
  return tf.cast(_plus(y, bias), y.dtype)


@tf.custom_gradient
def _bias_add_for_training(y, bias):
  """y + bias with the bias gradient of `_bias_gradient`; in bfloat16 / float16 on a CPU with
  AMX as a compiled pass of its own rather than BiasAdd (see `bias_add`)."""
  separate = y.dtype != tf.float32 and _bias_in_pass(y.dtype)
  out = _add(y, bias) if separate else tf.nn.bias_add(y, bias)
  return out, lambda dy: (dy, _bias_gradient(dy))


def bias_add(y, bias, training):
  """y + bias. Inference keeps BiasAdd, which grappler fuses with the matmul before it (with
  oneDNN: one kernel, and with GELU after it, one kernel too).

  When training (`_bias_add_for_training`), a caller whose next op is a compiled pass (GELU,
  dropout) hands it the bias (`gelu_for_training`, `dropout`), and on a CPU with AMX a
  bfloat16 / float16 bias with no such pass after it is added in a compiled pass of its own. On
  the AMX Xeon of benchmarks/log/2026-11-30.md, oneDNN's bf16 matmul with its bias epilogue
  (training's weights are [in, out]) took longer than the matmul alone and a separate pass over
  its output together: the query / key / value product 1.24x, the feed-forward up-projection
  with GELU 1.36x, the attention's output projection with dropout 1.37x (batch 8 x 128,
  BERT-base); the bf16 pre-training step 1.07x. Held to AVX512_BF16 (no AMX, a Zen 5's kernels)
  the same bf16 step was 0.95x: there bf16 keeps the epilogue (`_bias_in_pass`). In float32 a
  pass of its own was 0.95-0.98x, natively and held to AVX2, so float32 keeps BiasAdd where no
  pass follows; handed to GELU and dropout the bias was 1.01-1.05x (the step held to AVX2
  1.05x)."""
  if training:
    return _bias_add_for_training(y, bias)
  return tf.nn.bias_add(y, bias)


def layer_norm(x, gamma, beta, eps, training=False, onednn=False):
  """Layer normalisation of `x` over its last axis, computed in float32 whatever x's dtype (the
  result is in x's dtype); when training, as one compiled pass each way.

  `onednn` (inference on a CPU where TensorFlow runs oneDNN, not under XLA: the Trainer's
  choice, modeling.InferenceWeights): as oneDNN's layer normalisation (`_layer_norm_onednn`),
  where that is one exact kernel for x's dtype on this CPU (devices.onednn_layer_norm: not
  bfloat16 without bf16 instructions); elsewhere the plain form below."""
  if training:
    return _layer_norm_for_training(x, gamma, beta, eps)
  if onednn and devices.onednn_layer_norm(x.dtype):
    return _layer_norm_onednn(x, gamma, beta, eps)
  x32 = tf.cast(x, tf.float32)
  mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
  y = (x32 - mean) * tf.math.rsqrt(variance + eps) * gamma + beta
  return tf.cast(y, x.dtype)


def _layer_norm_onednn(x, gamma, beta, eps):
  """Inference's LayerNorm in the form TensorFlow's graph optimiser (grappler's remapper, with
  oneDNN) replaces by one `_MklLayerNorm` kernel: Keras's fused form, each row of x a channel of
  a batch normalisation in training mode (statistics from the data) with unit scale and zero
  offset, then gamma and beta. The pattern must match node for node (Reshape, FusedBatchNormV3
  fed by Fill and empty constants, Reshape, Mul, AddV2), and must survive constant folding at
  static shapes (see the comment at the fills).

  oneDNN takes the statistics and the normalisation in float32 and rounds the result once: on 2
  cores of a Xeon with AMX a [1,024, 768] LayerNorm took 0.5-0.8 ms against 1.7-2.1 ms for the
  separate ops (benchmarks/log/2026-11-30.md), as close or closer to a float64 reference in
  float32. In bfloat16 the kernel takes gamma and beta in x's dtype: they are rounded to
  bfloat16, as every other weight of a bf16 model is (the mean error against float64 1.4x the
  float32-gamma form's). Unfused (oneDNN off) the batch normalisation runs in TensorFlow's own
  kernel, 3x slower and less exact: the Trainer asks for this form only where oneDNN runs
  (devices.onednn_cpu)."""
  shape = tf.shape(x)
  rows = tf.reduce_prod(shape[:-1])
  channels = tf.reshape(x, tf.stack([1, rows, shape[-1], 1]))
  # With x's shape static, constant folding would turn the fills into constants and the pattern
  # would not match (the batch normalisation then runs unfused, 3x slower): a
  # PlaceholderWithDefault is never folded.
  size = tf.raw_ops.PlaceholderWithDefault(input=rows[tf.newaxis], shape=[1])
  empty = tf.constant([], tf.float32)
  normed = tf.raw_ops.FusedBatchNormV3(
      x=channels, scale=tf.fill(size, 1.0), offset=tf.fill(size, 0.0),
      mean=empty, variance=empty, epsilon=eps, data_format="NCHW", is_training=True)[0]
  return tf.reshape(normed, shape) * tf.cast(gamma, x.dtype) + tf.cast(beta, x.dtype)


@tf.function(jit_compile=True)
def _layer_norm_forward(x, gamma, beta, eps):
  x32 = tf.cast(x, tf.float32)
  centred = x32 - tf.reduce_mean(x32, -1, keepdims=True)
  # Two passes (the mean, then the mean squared deviation) rather than E[x^2] - E[x]^2, which
  # cancels catastrophically when a row's mean is large against its spread.
  rstd = tf.math.rsqrt(tf.reduce_mean(centred * centred, -1, keepdims=True) + eps)
  # rstd, one float32 per row, is all the backward pass needs besides x.
  return tf.cast(centred * rstd * gamma + beta, x.dtype), rstd


@tf.function(jit_compile=True)
def _layer_norm_backward(x, gamma, rstd, dy):
  """(dx, dgamma, dbeta) of LayerNorm, from its input and 1 / standard deviation."""
  x32, dy = tf.cast(x, tf.float32), tf.cast(dy, tf.float32)
  # normed is recomputed from x rather than saved by the forward pass: one float32 tensor of
  # x's size less to hold between the two passes.
  normed = (x32 - tf.reduce_mean(x32, -1, keepdims=True)) * rstd
  dnormed = dy * gamma
  # With g = dy * gamma: dx = rstd * (g - mean(g) - normed * mean(g * normed)), the two means
  # being the gradient's paths through the row's mean and through its variance.
  dx = rstd * (dnormed - tf.reduce_mean(dnormed, -1, keepdims=True)
               - normed * tf.reduce_mean(dnormed * normed, -1, keepdims=True))
  rows = lambda t: tf.reshape(t, [-1, tf.shape(t)[-1]])
  # gamma and beta serve every row: their gradients are sums over all rows, in float32, the
  # variables' dtype.
  return tf.cast(dx, x.dtype), tf.reduce_sum(rows(dy * normed), 0), tf.reduce_sum(rows(dy), 0)


def _layer_norm_for_training(x, gamma, beta, eps):
  """LayerNorm.__call__ with its forward and backward each one compiled pass (autodiff made a
  dozen elementwise ops and reductions of it): a BERT-base bf16 training step ~3% faster."""

  @tf.custom_gradient
  def layer_norm_(x, gamma, beta):
    y, rstd = _layer_norm_forward(x, gamma, beta, eps)
    return y, lambda dy: _layer_norm_backward(x, gamma, rstd, dy)

  return layer_norm_(x, gamma, beta)


def masked_softmax(scores, mask_adder, bf16_softmax=False):
  """softmax(scores + mask_adder) over the last axis: the attention's probabilities, in float32.

  Softmax in float32: the -10000 mask adder and bf16's 8-bit mantissa do not mix well.

  With `bf16_softmax` (inference's choice, see modeling.InferenceWeights), bfloat16 scores get
  their mask added and their softmax taken in bfloat16 instead (the probabilities are then
  bfloat16). oneDNN's CPU kernels compute a bfloat16 softmax in float32 and round once: the
  probabilities are the float32 softmax's rounded to bfloat16, as they were (bit-identical on a
  seq-384 check; the test asserts one rounding step at most), without the two casts, and oneDNN
  fuses the mask add into the scores' batch matmul: a seq-384 attention 13.5 -> 7.3 ms. Not
  under XLA: its CPU softmax accumulates in bfloat16 (probabilities 4% off); nor where bf16 is
  emulated, nor on a GPU (devices.bf16_accumulates_in_float32: TensorFlow's fallback kernel and
  its CUDA kernel are more than one rounding step off). The Trainer makes that choice.
  """
  if bf16_softmax and scores.dtype == tf.bfloat16:
    # In bfloat16 the adder is 0 or -9984 (-10000 rounded): a masked key's exp still underflows
    # to exactly 0.
    return tf.nn.softmax(scores + tf.cast(mask_adder, scores.dtype))
  return tf.nn.softmax(tf.cast(scores, tf.float32) + mask_adder)


# The masked-LM loss over the vocabulary: per prediction, -log softmax(logits + bias)[label] and
# whether the label is the argmax. On BERT-Mini's 30,522-word head these rows are the largest
# tensors of a pre-training step (1,280 x 30,522 at 40 predictions a sequence). Autodiff of
# log_softmax + gather + argmax made a dozen passes over them, in TensorFlow's kernels (a cast, the
# bias add, log_softmax's four, argmax, the gather's scatter, log_softmax's gradient, the bias
# gradient, the cast back); here the forward pass is one compiled pass (max, then the sum of
# exponentials, the label's logit and the tie check) and the backward another (softmax minus the
# one-hot label, rounded once to the logits' dtype, and the bias gradient), recomputing the
# exponentials from the logits rather than holding a float32 copy of them between the passes.
# Measured on 2 cores of an AMX Xeon, bf16, 1,280 x 30,522: the head's forward + backward with
# its matmuls 349 -> 275 ms.
@tf.function(jit_compile=True)
def _masked_lm_forward(logits, bias, labels):
  z = tf.cast(logits, tf.float32) + bias
  top = tf.reduce_max(z, -1, keepdims=True)
  log_sum = top[:, 0] + tf.math.log(tf.reduce_sum(tf.exp(z - top), -1))
  picked = tf.gather(z, labels, batch_dims=1)
  # argmax == label exactly as tf.argmax decides it, ties going to the first index (bfloat16
  # logits tie often): the label's logit is the largest and no earlier one equals it. One
  # comparison pass instead of argmax's reduction, which alone cost more than the loss.
  earlier = tf.range(tf.shape(z)[-1])[None, :] < labels[:, None]
  tied_before = tf.reduce_any((z == top) & earlier, -1)
  correct = tf.cast((picked == top[:, 0]) & ~tied_before, tf.float32)
  return log_sum - picked, correct, log_sum


@tf.function(jit_compile=True)
def _masked_lm_backward(logits, bias, labels, log_sum, dnll):
  """(dlogits, dbias): softmax - one_hot(label), scaled by each row's upstream gradient."""
  z = tf.cast(logits, tf.float32) + bias
  one_hot = tf.cast(tf.equal(tf.range(tf.shape(z)[-1])[None, :], labels[:, None]), tf.float32)
  dz = (tf.exp(z - log_sum[:, None]) - one_hot) * dnll[:, None]
  return tf.cast(dz, logits.dtype), tf.reduce_sum(dz, 0)


def masked_lm_loss(logits, bias, labels):
  """(nll, correct), float32 [rows]: -log softmax(float32(logits) + bias)[labels] and 1.0 where
  argmax(logits + bias) == labels (tf.argmax's tie rule), 0.0 elsewhere. `logits` [rows, vocab]
  in the compute dtype, `bias` float32 [vocab], `labels` int32 [rows] in [0, vocab). Gradients
  reach logits and bias (nll's; correct has none)."""

  @tf.custom_gradient
  def loss_(logits, bias):
    nll, correct, log_sum = _masked_lm_forward(logits, bias, labels)

    def grad(dnll, unused_dcorrect):
      return _masked_lm_backward(logits, bias, labels, log_sum, dnll)

    return (nll, correct), grad

  return loss_(logits, bias)
