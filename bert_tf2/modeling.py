"""The BERT model: the Transformer encoder, the pre-training heads and the fine-tuning heads with
their losses (its configuration, BertConfig, is config.py's).

Plain `tf.Module`s, one small class per block. Each block creates its variables inside its own name
scope, so every variable's name *is* its name in the original Google checkpoints
(`bert/encoder/layer_3/attention/self/query/kernel`, `cls/predictions/output_bias`, ...) and
checkpoint I/O needs no hand-written table (see checkpoints.py).

Variables are always float32. `compute_dtype` (float32, bfloat16 or float16) is the dtype of the
matrix work: weights are cast at use, while LayerNorm, softmax and the losses stay in float32 so
mixed precision changes speed, not the numerics that matter. The blocks' numerical kernels
(GELU's gradient, seeded dropout, LayerNorm's passes, ...) are kernels.py's; inference's weights
cast once reach the blocks as an argument (`InferenceWeights`).

One file on purpose: it is the model read top to bottom (blocks, BertModel, heads and their
losses), one small class per block, and the checkpoint names fall out of how those classes nest;
split, the name scopes would be spread over modules that must agree on them.
"""

import contextlib
import math

import tensorflow as tf

from bert_tf2 import config as bert_config
from bert_tf2 import kernels

# hidden_act names. The original's "gelu" is the tanh approximation; HuggingFace's "gelu" is the
# exact erf form. Configs keep the original meaning; HF configs are translated on load.
ACTIVATIONS = {
    "gelu": lambda x: tf.nn.gelu(x, approximate=True),
    "gelu_new": lambda x: tf.nn.gelu(x, approximate=True),
    "gelu_tanh": lambda x: tf.nn.gelu(x, approximate=True),
    "gelu_exact": lambda x: tf.nn.gelu(x, approximate=False),
    "relu": tf.nn.relu,
    "swish": tf.nn.silu,
    "silu": tf.nn.silu,
    "tanh": tf.tanh,
    "linear": tf.identity,
}

# When training: the same GELUs with a one-pass gradient, taking (x, bias)
# (kernels.gelu_for_training).
TRAINING_ACTIVATIONS = {"gelu": kernels.gelu_for_training(True),
                        "gelu_new": kernels.gelu_for_training(True),
                        "gelu_tanh": kernels.gelu_for_training(True),
                        "gelu_exact": kernels.gelu_for_training(False)}
# (Its home is config.py; the name stays for the original's API and the project's callers.)
BertConfig = bert_config.BertConfig
# Every activation a config may name has a function here.
assert set(ACTIVATIONS) == set(bert_config.ACTIVATION_NAMES), sorted(ACTIVATIONS)


def _initializer(config):
  stddev = config.initializer_range
  # The original's initializer: a normal cut at two standard deviations, no outlying weight.
  return lambda shape: tf.random.truncated_normal(shape, stddev=stddev)


def _cast_concat(variables, axis, dtype):
  return tf.cast(variables[0] if len(variables) == 1 else tf.concat(variables, axis), dtype)


def _weight_key(variables, dtype):
  return tuple(v.ref() for v in variables), dtype


def _weight(variables, dtype, inference_weights, axis=0):
  """`variables` (one, or several concatenated along `axis`) as one `dtype` tensor: the copy
  `inference_weights` (an InferenceWeights, or None) holds, else concatenated and cast here, at
  this call."""
  if inference_weights is not None:
    weight = inference_weights.get(variables, dtype, axis)
    if weight is not None:
      return weight
  return _cast_concat(variables, axis, dtype)


def _weight_groups(module):
  """(variables, axis, dtype) of each weight the BertModels in `module` cast or concatenate at
  every call (what `_weight` is asked for), in a fixed order."""
  groups = []
  for bert in [m for m in (module, *module.submodules) if isinstance(m, BertModel)]:
    dtype = bert.compute_dtype
    for layer in bert.submodules:
      for variables, axis in getattr(layer, "weight_groups", lambda: ())():
        # Only what a call would otherwise cast or concatenate: a float32 model reads a single
        # float32 weight as it is.
        if len(variables) > 1 or variables[0].dtype != dtype:
          groups.append((variables, axis, dtype))
  return groups


def cast_weights(module, transposed=False):
  """The weights `module`'s BertModels cast to their compute dtype (and the fused query / key /
  value matrices they concatenate) at every call, made once, as a list for `InferenceWeights`.

  Inference calls the model many times with the same weights: casting 85 M float32 parameters
  of BERT-base to bfloat16 at each call was 12% of a bf16 forward pass (batch 8 x 128 tokens),
  and more of a batch of short sentences. The copies hold the same values as the casts they
  replace (outputs are bit-identical) and take half the float32 weights' memory while in use.

  `transposed`: bfloat16 matrices stored [out, in] (torch's Linear layout), which the model then
  reads with transpose_b (pass the same to InferenceWeights). On an AMX CPU oneDNN's bf16 matmul
  reads its weight 5-11% faster so (BERT-base's 1,024-token products; the model's encode
  1.03-1.05x, bit-identical); with AVX512_BF16 alone it is 2% slower (devices.amx_matmul
  decides)."""
  weights = [_cast_concat(variables, axis, dtype)
             for variables, axis, dtype in _weight_groups(module)]
  return [tf.transpose(w) if _stored_transposed(w, transposed) else w for w in weights]


def _stored_transposed(weight, transposed):
  return transposed and weight.dtype == tf.bfloat16 and weight.shape.rank == 2


def _matmul(x, variables, inference_weights, axis=0):
  """x @ `variables` (one, or several concatenated along `axis`) in x's dtype: the copy
  `inference_weights` holds ([in, out], or [out, in] where its `get` answers transposed=True),
  else cast here."""
  if inference_weights is not None:
    for transposed in (True, False):
      weight = inference_weights.get(variables, x.dtype, axis, transposed=transposed)
      if weight is not None:
        return tf.matmul(x, weight, transpose_b=transposed)
  return tf.matmul(x, _cast_concat(variables, axis, x.dtype))


class InferenceWeights:
  """What a model called with training=False reads instead of casting its variables: its
  `inference_weights` argument, which BertModel hands down to every Dense and SelfAttention.

  - `weights`: `cast_weights(module, transposed)`, the copies the BertModels of `module` then
    take their matrices from. Make the InferenceWeights inside the tf.function that calls the
    model, from copies passed in as an argument of that function: traced with copies captured as
    constants, it would keep using them after the variables change.
  - `bf16_softmax`: bfloat16 attention adds its mask and takes its softmax in bfloat16 instead
    of float32 (see kernels.masked_softmax). Not under XLA: pass False.
  - `transposed`: what `cast_weights` was given.
  - `onednn_layer_norm`: LayerNorm as oneDNN's kernel (kernels.layer_norm); only where
    TensorFlow runs oneDNN (devices.onednn_cpu), not under XLA.
  """

  def __init__(self, module, weights, bf16_softmax=True, transposed=False,
               onednn_layer_norm=False):
    self._weights = {_weight_key(variables, dtype): (weight, _stored_transposed(weight, transposed))
                     for (variables, _, dtype), weight in zip(_weight_groups(module), weights)}
    self.bf16_softmax = bf16_softmax
    self.onednn_layer_norm = onednn_layer_norm

  def get(self, variables, dtype, axis=0, transposed=False):  # pylint: disable=unused-argument
    """The copy of `variables` (concatenated) in `dtype`, or None. A matrix stored [out, in] is
    answered only to transposed=True, every other copy only to transposed=False."""
    weight, stored_transposed = self._weights.get(_weight_key(variables, dtype), (None, None))
    return weight if transposed == stored_transposed else None


class Dense(tf.Module):
  """x @ kernel + bias, the kernel stored [in, out] as in the original's tf.layers.dense."""

  def __init__(self, in_dim, out_dim, config, activation=None, name="dense"):
    super().__init__(name=name)
    with self.name_scope:
      self.kernel = tf.Variable(_initializer(config)([in_dim, out_dim]), name="kernel")
      self.bias = tf.Variable(tf.zeros([out_dim]), name="bias")
    self.activation = activation

  def __call__(self, x, activation=None, training=False, inference_weights=None):
    """`activation` replaces the layer's own for this call; `inference_weights` (see
    InferenceWeights) may hold the kernel and bias in x's dtype."""
    # BiasAdd rather than `+`: grappler's oneDNN remapper then fuses matmul, bias and GELU into
    # one kernel in inference (the `+` form fused only the bias; GELU ran as separate ops).
    y = kernels.bias_add(*self.product(x, inference_weights), training)
    activation = activation or self.activation
    return activation(y) if activation else y

  def product(self, x, inference_weights=None):
    """(x @ kernel, bias in x's dtype), the bias not yet added: for a caller whose next pass
    adds it when training (kernels.gelu_for_training, kernels.dropout; kernels.bias_add says
    why)."""
    return (_matmul(x, [self.kernel], inference_weights),
            _weight([self.bias], x.dtype, inference_weights))

  def weight_groups(self):
    return [([self.kernel], 0), ([self.bias], 0)]


class LayerNorm(tf.Module):
  """Layer normalisation over the last axis, computed in float32 whatever the compute dtype."""

  def __init__(self, dim, eps, name="LayerNorm"):
    super().__init__(name=name)
    with self.name_scope:
      self.beta = tf.Variable(tf.zeros([dim]), name="beta")
      self.gamma = tf.Variable(tf.ones([dim]), name="gamma")
    self.eps = eps

  def __call__(self, x, training=False, inference_weights=None):
    onednn = not training and getattr(inference_weights, "onednn_layer_norm", False)
    return kernels.layer_norm(x, self.gamma, self.beta, self.eps, training, onednn)


class Embeddings(tf.Module):
  """Word + token-type + position embeddings, then LayerNorm and dropout."""

  def __init__(self, config, name="embeddings"):
    super().__init__(name=name)
    init = _initializer(config)
    with self.name_scope:
      self.word_embeddings = tf.Variable(init([config.vocab_size, config.hidden_size]),
                                         name="word_embeddings")
      self.token_type_embeddings = tf.Variable(init([config.type_vocab_size, config.hidden_size]),
                                               name="token_type_embeddings")
      self.position_embeddings = tf.Variable(
          init([config.max_position_embeddings, config.hidden_size]), name="position_embeddings")
      self.layer_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
    self.dropout_prob = config.hidden_dropout_prob

  def __call__(self, input_ids, segment_ids, training, seed, position_ids=None,
               inference_weights=None):
    if position_ids is None:
      positions = self.position_embeddings[tf.newaxis, :tf.shape(input_ids)[1]]
    else:
      positions = tf.gather(self.position_embeddings, position_ids)
    x = (tf.gather(self.word_embeddings, input_ids)
         + tf.gather(self.token_type_embeddings, segment_ids)
         + positions)
    return kernels.dropout(self.layer_norm(x, training, inference_weights), self.dropout_prob,
                           training, seed)


class SelfAttention(tf.Module):
  """Multi-head scaled dot-product attention of every position over the unmasked positions."""

  def __init__(self, config, name="self"):
    super().__init__(name=name)
    h = config.hidden_size
    with self.name_scope:
      self.query = Dense(h, h, config, name="query")
      self.key = Dense(h, h, config, name="key")
      self.value = Dense(h, h, config, name="value")
    self.num_heads = config.num_attention_heads
    self.head_size = h // config.num_attention_heads
    self.dropout_prob = config.attention_probs_dropout_prob

  def __call__(self, x, batch, seq, mask_adder, training, seed, queries=None,
               inference_weights=None):
    """`queries`: optional (rows [batch * n] of x, positions [batch, n]): only those positions
    attend (over every key), and the context is [batch * n, hidden]. `inference_weights`: see
    InferenceWeights."""
    # One [hidden, 3*hidden] matmul instead of three: better use of the matrix units, and one
    # transpose to the [batch, heads, seq, head_size] layout. The variables stay separate so the
    # checkpoint names are the original's.
    dense = [self.query, self.key, self.value] if queries is None else [self.key, self.value]
    projected = kernels.bias_add(
        _matmul(x, [d.kernel for d in dense], inference_weights, axis=1),
        _weight([d.bias for d in dense], x.dtype, inference_weights), training)
    projected = tf.reshape(projected, [batch, seq, len(dense), self.num_heads, self.head_size])
    # -> q, k, v, each [batch, heads, seq, head_size], the layout of the batched matmuls below.
    projected = tf.unstack(tf.transpose(projected, [2, 0, 3, 1, 4]))
    if queries is None:
      q, k, v = projected
      rows = seq
    else:
      (k, v), (query_rows, positions) = projected, queries
      rows = tf.shape(positions)[1]
      # Queries at the selected rows only: the scores are [n x seq] per head instead of [seq x seq].
      q = tf.transpose(tf.reshape(
          self.query(tf.gather(x, query_rows), inference_weights=inference_weights),
          [batch, rows, self.num_heads, self.head_size]), [0, 2, 1, 3])
      if mask_adder.shape[2] != 1:  # a mask per query (packed sequences): the queries' rows
        mask_adder = tf.gather(mask_adder, positions, axis=2, batch_dims=1)
    # Scaling q (seq x head_size values) is cheaper than scaling the seq x seq scores.
    scores = tf.matmul(q * tf.cast(1.0 / math.sqrt(self.head_size), q.dtype), k, transpose_b=True)
    bf16_softmax = not training and inference_weights is not None and inference_weights.bf16_softmax
    # Dropout as the original (from the Transformer paper): it drops whole keys, a random subset
    # of the tokens each query may attend to, rather than units of a hidden vector.
    probs = kernels.attention_probs(scores, mask_adder, self.dropout_prob, training, seed,
                                    bf16_softmax)
    context = tf.matmul(tf.cast(probs, v.dtype), v)
    # No -1 in the shape: a batch of 0 rows (a multi-worker job's exhausted worker) must work.
    return tf.reshape(tf.transpose(context, [0, 2, 1, 3]),
                      [batch * rows, self.num_heads * self.head_size])

  def weight_groups(self):
    """The fused query / key / value weights, and key / value alone (a layer with `queries`)."""
    return [(fused, axis) for dense in ([self.query, self.key, self.value], [self.key, self.value])
            for fused, axis in (([d.kernel for d in dense], 1), ([d.bias for d in dense], 0))]


class AttentionOutput(tf.Module):
  """Projection of the attention context, dropout, residual and LayerNorm."""

  def __init__(self, config, name="output"):
    super().__init__(name=name)
    with self.name_scope:
      self.dense = Dense(config.hidden_size, config.hidden_size, config)
      self.layer_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
    self.dropout_prob = config.hidden_dropout_prob

  def __call__(self, context, residual, training, seed, inference_weights=None):
    # The bias is added by dropout's pass (when training) or BiasAdd (kernels.dropout).
    projected, bias = self.dense.product(context, inference_weights)
    return self.layer_norm(kernels.dropout(projected, self.dropout_prob, training, seed, bias)
                           + residual, training, inference_weights)


class Attention(tf.Module):

  def __init__(self, config, name="attention"):
    super().__init__(name=name)
    with self.name_scope:
      self.self_attention = SelfAttention(config)
      self.output = AttentionOutput(config)

  def __call__(self, x, batch, seq, mask_adder, training, seeds, queries=None,
               inference_weights=None):
    context = self.self_attention(x, batch, seq, mask_adder, training, seeds[0], queries,
                                  inference_weights)
    # With queries the layer's output exists at those rows only: the residual is taken there too.
    residual = x if queries is None else tf.gather(x, queries[0])
    return self.output(context, residual, training, seeds[1], inference_weights)


class Intermediate(tf.Module):

  def __init__(self, config, name="intermediate"):
    super().__init__(name=name)
    with self.name_scope:
      self.dense = Dense(config.hidden_size, config.intermediate_size, config,
                         activation=ACTIVATIONS[config.hidden_act])
    # Training's GELU has a one-pass gradient and adds the bias in its pass; inference keeps the
    # layer's own, which oneDNN fuses with the matmul and bias (kernels.gelu_for_training).
    self.training_activation = TRAINING_ACTIVATIONS.get(config.hidden_act)

  def __call__(self, x, training=False, inference_weights=None):
    if training and self.training_activation:
      return self.training_activation(*self.dense.product(x, inference_weights))
    return self.dense(x, training=training, inference_weights=inference_weights)


class Output(tf.Module):
  """Feed-forward down-projection, dropout, residual and LayerNorm."""

  def __init__(self, config, name="output"):
    super().__init__(name=name)
    with self.name_scope:
      self.dense = Dense(config.intermediate_size, config.hidden_size, config)
      self.layer_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
    self.dropout_prob = config.hidden_dropout_prob

  def __call__(self, x, residual, training, seed, inference_weights=None):
    # The bias is added by dropout's pass (when training) or BiasAdd (kernels.dropout).
    projected, bias = self.dense.product(x, inference_weights)
    return self.layer_norm(
        kernels.dropout(projected, self.dropout_prob, training, seed, bias) + residual, training,
        inference_weights)


class TransformerLayer(tf.Module):

  def __init__(self, config, name):
    super().__init__(name=name)
    with self.name_scope:
      self.attention = Attention(config)
      self.intermediate = Intermediate(config)
      self.output = Output(config)

  def __call__(self, x, batch, seq, mask_adder, training, seeds, queries=None,
               inference_weights=None):
    """[batch * seq, hidden] -> the same, or with `queries` (see SelfAttention) [batch * n,
    hidden]: the layer's output at those positions only."""
    attention_output = self.attention(x, batch, seq, mask_adder, training, seeds[:2], queries,
                                      inference_weights)
    return self.output(self.intermediate(attention_output, training, inference_weights),
                       attention_output, training, seeds[2], inference_weights)


class Encoder(tf.Module):

  def __init__(self, config, name="encoder"):
    super().__init__(name=name)
    with self.name_scope:
      self.layers = [TransformerLayer(config, name=f"layer_{i}")
                     for i in range(config.num_hidden_layers)]


class Pooler(tf.Module):
  """tanh(dense) of the first ([CLS]) token: the sentence-level representation."""

  def __init__(self, config, name="pooler"):
    super().__init__(name=name)
    with self.name_scope:
      self.dense = Dense(config.hidden_size, config.hidden_size, config, activation=tf.tanh)

  def __call__(self, sequence_output, training=False, inference_weights=None):
    return self.dense(sequence_output[:, 0], training=training,
                      inference_weights=inference_weights)


POOLINGS = ("mean", "cls", "max")


def pool_tokens(sequence, input_mask, pooling, normalize=False):
  """Sentence vectors [batch, hidden] float32 from token vectors [batch, seq, hidden]:
  sentence-transformers' poolings over the real tokens (input_mask 1, [CLS] and [SEP] included):
  `mean` their average, `cls` the [CLS] vector, `max` their element-wise maximum; `normalize`
  scales each to unit L2 norm (as its Normalize module, x / max(|x|, 1e-12))."""
  sequence = tf.cast(sequence, tf.float32)
  mask = tf.expand_dims(tf.cast(input_mask, tf.float32), -1)  # (LiteRT has no new-axis slices)
  if pooling == "mean":
    vectors = tf.reduce_sum(sequence * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1e-9)
  elif pooling == "cls":
    vectors = sequence[:, 0]
  elif pooling == "max":
    vectors = tf.reduce_max(tf.where(mask > 0, sequence, -1e9), 1)
  else:
    raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
  if normalize:
    vectors /= tf.maximum(tf.norm(vectors, axis=-1, keepdims=True), 1e-12)
  return vectors


def _dropout_seeds(seed, count):
  """`count` distinct stateless seeds from one [2] seed (None stays None: stateful dropout)."""
  if seed is None:
    return [None] * count
  seed = tf.cast(seed, tf.int64)
  # fold_in gives each dropout site its own independent stream, all from the step's one seed.
  return [tf.random.experimental.stateless_fold_in(seed, i) for i in range(count)]


class BertModel(tf.Module):
  """The BERT encoder. Call with int [batch, seq] tensors; returns a dict of outputs:

  - `sequence_output` [batch, seq, hidden]: the last layer;
  - `pooled_output` [batch, hidden]: the tanh pooler over [CLS];
  - `encoder_outputs`: list of every layer's output, [batch, seq, hidden] each;
  - `embedding_output` [batch, seq, hidden]: embeddings after LayerNorm.
  Outputs are in `compute_dtype`.
  """

  def __init__(self, config, compute_dtype=tf.float32, name="bert"):
    super().__init__(name=name)
    config.validate()
    self.config = config
    self.compute_dtype = tf.as_dtype(compute_dtype)
    with self.name_scope:
      self.embeddings = Embeddings(config)
      self.encoder = Encoder(config)
      self.pooler = Pooler(config)
    # Training: keep only each layer's input for the backward pass and recompute the rest of the
    # layer there (_recomputed): activation memory of one layer instead of all of them,
    # for about one more forward pass. The same gradients: dropout is stateless (seeded).
    self.gradient_checkpointing = False

  @property
  def embedding_table(self):
    return self.embeddings.word_embeddings

  def __call__(self, input_ids, input_mask=None, segment_ids=None, training=False,
               dropout_seed=None, position_ids=None, instance_ids=None, output_positions=None,
               inference_weights=None):
    """`dropout_seed`: optional int [2] tensor; when given, dropout is stateless (reproducible
    across restarts). The training loop passes [step, replica].

    `inference_weights`: optional InferenceWeights (with training=False) or the training step's
    weight_copies.WeightCopies: the weights in the compute dtype that every layer reads instead
    of casting its variables at this call.

    Packed sequences (several instances in one row) give `instance_ids` [batch, seq] (1, 2, ...
    per instance, 0 for padding): a token then attends only to the tokens of its own instance.
    `position_ids` [batch, seq] replace 0, 1, 2, ... (packed_position_ids restarts them per
    instance), so that each instance gets the outputs it would get alone.

    `output_positions` [batch, n]: a head that reads a few positions ([CLS] for a classifier,
    [CLS] and the masked positions in pre-training) needs the last layer nowhere else, so the
    last layer runs only there (its keys and values still cover every position; a classifier
    step does 7% fewer FLOPs). `sequence_output` is then [batch, n, hidden], the last layer at
    those positions, `pooled_output` the pooler over the first of them, and there are no
    `encoder_outputs`."""
    input_ids = tf.convert_to_tensor(input_ids)
    if input_mask is None:
      input_mask = tf.ones_like(input_ids)
    if segment_ids is None:
      segment_ids = tf.zeros_like(input_ids)
    batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    # The embeddings' dropout, then three per layer: attention probabilities, attention output,
    # feed-forward output.
    seeds = _dropout_seeds(dropout_seed, 1 + 3 * self.config.num_hidden_layers)

    # The embeddings (their gathers, sum and LayerNorm) in float32; the encoder in compute_dtype.
    x = tf.cast(self.embeddings(input_ids, segment_ids, training, seeds[0], position_ids,
                                inference_weights), self.compute_dtype)
    embedding_output = x
    # Every query position attends to every non-padding key: 0 for real keys, -10000 for padding
    # (the original's constant; it underflows to exactly 0 after softmax).
    if instance_ids is None:
      # (a reshape rather than [:, tf.newaxis, tf.newaxis, :]: LiteRT has no new-axis slices)
      mask_adder = (1.0 - tf.reshape(tf.cast(input_mask, tf.float32), [batch, 1, 1, seq])) * (
          -10000.0)
    else:  # [batch, 1, seq, seq]: keys of the query's own instance only
      same = tf.equal(instance_ids[:, :, tf.newaxis], instance_ids[:, tf.newaxis, :]) & (
          instance_ids[:, tf.newaxis, :] > 0)
      # (A padding query, id 0, has every key masked alike, so its softmax is over all keys:
      # harmless, as no loss reads a padding position.)
      mask_adder = (1.0 - tf.cast(same, tf.float32)[:, tf.newaxis]) * -10000.0
    # The encoder works on [batch*seq, hidden] matrices: one big matmul per dense layer.
    x = tf.reshape(x, [batch * seq, self.config.hidden_size])
    queries = None
    if output_positions is not None:
      output_positions = tf.cast(output_positions, tf.int32)
      # Rows of the flattened x: position p of sequence b is row b * seq + p.
      queries = (tf.reshape(output_positions + tf.range(batch)[:, tf.newaxis] * seq, [-1]),
                 output_positions)
    encoder_outputs = []
    checkpointed = self.gradient_checkpointing and training
    if checkpointed and dropout_seed is None and self.config.hidden_dropout_prob + (
        self.config.attention_probs_dropout_prob) > 0:
      raise ValueError("gradient checkpointing recomputes dropout: it needs a dropout_seed")
    for i, layer in enumerate(self.encoder.layers):
      # Only the last layer can run at output_positions alone: every earlier layer's output is
      # the next one's keys and values, needed at every position.
      last = i == len(self.encoder.layers) - 1 and queries is not None
      layer_seeds = seeds[1 + 3 * i:4 + 3 * i]
      if checkpointed:
        x = _recomputed(layer, batch, seq, mask_adder, layer_seeds, queries if last else None)(x)
      else:
        x = layer(x, batch, seq, mask_adder, training, layer_seeds, queries if last else None,
                  inference_weights)
      rows = tf.shape(output_positions)[1] if last else seq
      encoder_outputs.append(tf.reshape(x, [batch, rows, self.config.hidden_size]))
    sequence_output = encoder_outputs[-1]
    if output_positions is not None:
      return {"sequence_output": sequence_output,
              "pooled_output": self.pooler(sequence_output, training, inference_weights),
              "embedding_output": embedding_output}
    return {
        "sequence_output": sequence_output,
        "pooled_output": self.pooler(sequence_output, training, inference_weights),
        "encoder_outputs": encoder_outputs,
        "embedding_output": embedding_output,
    }


def _recomputed(layer, batch, seq, mask_adder, seeds, queries):
  """The training call of `layer` on x whose activations are recomputed in the backward pass
  rather than kept (gradient checkpointing); the same dropout seeds both times.

  Written here rather than with tf.recompute_grad, which saves as much memory but made the
  BERT-base seq-512 training step 2.2x the plain step's against 1.36x for this
  (benchmarks/gradient_checkpointing.py). The recomputation starts from x behind a control
  dependency on the incoming gradient, so it runs only when the backward pass reaches it and is
  never merged with the forward pass as a common subexpression. Inside a tf.function it saves
  memory only when the step's forward pass is not a nested tf.function of its own
  (training.Trainer inlines it then)."""
  run = lambda x: layer(x, batch, seq, mask_adder, True, seeds, queries)

  @tf.custom_gradient
  def checkpointed(x):

    def grad(dy, variables=None):
      # x_again cannot exist before dy, i.e. before the backward pass reaches this layer: the
      # recomputation is scheduled there, and grappler cannot merge it with the forward pass as a
      # common subexpression (which would keep every activation alive again).
      with tf.control_dependencies([dy]):
        x_again = tf.identity(x)
      with tf.GradientTape() as tape:
        tape.watch(x_again)
        y = run(x_again)
      # The same seeds draw the same dropout masks, so this y is the forward pass's y and these
      # are the gradients plain autodiff would give (tests/test_modeling.py checks it).
      grads = tape.gradient(y, [x_again, *variables], output_gradients=dy,
                            unconnected_gradients=tf.UnconnectedGradients.ZERO)
      return grads[0], grads[1:]

    # The backward pass reads only x and dy (grad recomputes the rest), so in the traced step
    # the layer's intermediate activations are freed as soon as its output is computed.
    return run(x), grad

  return checkpointed


def packed_position_ids(instance_ids):
  """Positions that restart at 0 with each instance of packed sequences ([batch, seq] ids of
  contiguous instances 1, 2, ..., then padding 0)."""
  batch, seq = tf.shape(instance_ids)[0], tf.shape(instance_ids)[1]
  columns = tf.broadcast_to(tf.range(seq), [batch, seq])
  # Runs of equal ids (the first position always starts one), numbered per row, then the first
  # position of each run.
  starts = tf.not_equal(instance_ids, tf.pad(instance_ids, [[0, 0], [1, 0]], constant_values=-1)
                        [:, :-1])
  run = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1
  first = tf.math.unsorted_segment_min(columns, tf.range(batch)[:, tf.newaxis] * seq + run,
                                       batch * seq)
  return columns - tf.gather(tf.reshape(first, [batch, seq]), run, batch_dims=1)


def instance_starts(instance_ids, num_instances):
  """[batch, num_instances]: the first position of instances 1 .. num_instances of packed
  sequences (their [CLS]); 0 for an instance a sequence lacks."""
  seq = tf.shape(instance_ids)[1]
  slots = tf.range(1, num_instances + 1)
  in_slot = tf.equal(instance_ids[:, tf.newaxis, :], slots[tf.newaxis, :, tf.newaxis])
  first = tf.reduce_min(tf.where(in_slot, tf.range(seq), seq), axis=-1)
  # A missing instance points at position 0: a valid row to read, and its next-sentence
  # weight is 0.
  return tf.where(first < seq, first, 0)


class MaskedLMHead(tf.Module):
  """Masked-LM head: transform + LayerNorm, then logits against the (tied) word embeddings.

  It reads the masked positions only (BertModel's `output_positions`): with 20 predictions in
  128 tokens that is 6x less of the most expensive matmul in pre-training.
  """

  def __init__(self, config, name="predictions"):
    super().__init__(name=name)
    with self.name_scope:
      with tf.name_scope("transform"):
        self.dense = Dense(config.hidden_size, config.hidden_size, config,
                           activation=ACTIVATIONS[config.hidden_act])
        self.layer_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
      self.output_bias = tf.Variable(tf.zeros([config.vocab_size]), name="output_bias")

  def logits(self, x, embedding_table, training=False, inference_weights=None):
    """The last layer at the masked positions [batch * n, hidden] -> [batch * n, vocab] in x's
    dtype, without output_bias. `inference_weights`: see BertModel."""
    x = self.layer_norm(self.dense(x, training=training, inference_weights=inference_weights),
                        inference_weights=inference_weights)
    # Output weights tied to the input embeddings, as the original: no second vocab x hidden
    # matrix to learn and store.
    return tf.matmul(x, _weight([embedding_table], x.dtype, inference_weights), transpose_b=True)

  def log_probs(self, logits):
    """float32 log-probabilities [batch * n, vocab]."""
    return tf.nn.log_softmax(tf.cast(logits, tf.float32) + self.output_bias)

  def loss(self, logits, labels):
    """(nll, correct) float32 [batch * n] of `labels`: kernels.masked_lm_loss, the same numbers
    as from log_probs in two compiled passes."""
    return kernels.masked_lm_loss(logits, self.output_bias, tf.cast(labels, tf.int32))


class NextSentenceHead(tf.Module):
  """Is-next-sentence classifier on the pooled output (label 0 = real next, 1 = random)."""

  def __init__(self, config, name="seq_relationship"):
    super().__init__(name=name)
    with self.name_scope:
      self.output_weights = tf.Variable(_initializer(config)([2, config.hidden_size]),
                                        name="output_weights")
      self.output_bias = tf.Variable(tf.zeros([2]), name="output_bias")

  def __call__(self, pooled_output, inference_weights=None):
    logits = tf.matmul(pooled_output,
                       _weight([self.output_weights], pooled_output.dtype, inference_weights),
                       transpose_b=True)
    return tf.nn.log_softmax(tf.cast(logits, tf.float32) + self.output_bias)

  def weight_groups(self):
    return [([self.output_weights], 0)]


class BertPretrainer(tf.Module):
  """BertModel plus the two pre-training heads, named `bert/...` and `cls/...` as the original.

  `next_sentence=False`: masked-LM only (RoBERTa's and the later recipes'), for single-segment
  records (create_pretraining_data --no_nsp): no next-sentence head, and the pooler, which only
  that head reads, is in `unused_variables` (the training loop leaves it at its initial values).
  """

  def __init__(self, config, compute_dtype=tf.float32, next_sentence=True):
    super().__init__(name="pretrainer")
    self.bert = BertModel(config, compute_dtype)
    with tf.name_scope("cls"):
      self.masked_lm = MaskedLMHead(config)
      self.next_sentence = NextSentenceHead(config) if next_sentence else None

  @property
  def unused_variables(self):
    """Variables no loss reaches: masked-LM only, the pooler's."""
    return () if self.next_sentence else tuple(self.bert.pooler.trainable_variables)

  def weight_groups(self):
    """The tied output matrix, read in the compute dtype (see weight_copies)."""
    return [([self.bert.embedding_table], 0)]

  def __call__(self, features, training=False, dropout_seed=None, inference_weights=None):
    """Packed sequences (features with instance_ids and next_sentence_labels [batch, k]) get the
    next-sentence head on the [CLS] of each instance: next_sentence_log_probs [batch * k, 2].
    `inference_weights`: see BertModel."""
    # The heads read the last layer at the [CLS] of each instance (k of them) and at the masked
    # positions only: the model computes the last layer there alone.
    masked = tf.cast(features["masked_lm_positions"], tf.int32)
    instance_ids = features.get("instance_ids")
    if instance_ids is None:
      k, packing = 1, {}
      # One instance, whose [CLS] is position 0.
      starts = tf.zeros_like(masked[:, :1])
    else:
      instance_ids = tf.cast(instance_ids, tf.int32)
      k = features["next_sentence_labels"].shape[-1]
      packing = {"position_ids": packed_position_ids(instance_ids), "instance_ids": instance_ids}
      starts = instance_starts(instance_ids, k)
    if self.next_sentence is None:  # masked-LM only: no [CLS] is read
      k, starts = 0, starts[:, :0]
    outputs = self.bert(features["input_ids"], features["input_mask"], features["segment_ids"],
                        training=training, dropout_seed=dropout_seed,
                        output_positions=tf.concat([starts, masked], axis=1),
                        inference_weights=inference_weights, **packing)
    selected = outputs["sequence_output"]  # [batch, k + predictions, hidden]
    hidden = self.bert.config.hidden_size
    logits = self.masked_lm.logits(tf.reshape(selected[:, k:], [-1, hidden]),
                                   self.bert.embedding_table, training, inference_weights)
    # Inside a tf.function, what no one reads is pruned: a training step reads the loss's two
    # numbers a prediction, not the [batch * n, vocab] log-probabilities.
    outputs["masked_lm_log_probs"] = self.masked_lm.log_probs(logits)
    if "masked_lm_ids" in features:
      outputs["masked_lm_nll"], outputs["masked_lm_correct"] = self.masked_lm.loss(
          logits, tf.reshape(features["masked_lm_ids"], [-1]))
    if self.next_sentence is not None:
      # The pooler over every instance's [CLS], not outputs' pooled_output (the first one's).
      pooled = self.bert.pooler.dense(tf.reshape(selected[:, :k], [-1, hidden]),
                                      training=training, inference_weights=inference_weights)
      outputs["next_sentence_log_probs"] = self.next_sentence(pooled, inference_weights)
    return outputs


def pretraining_losses(features, outputs):
  """The paper's losses, masked-LM and next-sentence, as (sum, count) pairs.

  Sums rather than means so that the training loop can divide by the *global* count across
  replicas and accumulation steps: the loss of a batch is then the same however it is split. Names
  ending in `_loss` are added up into the training loss; the rest are metrics.
  """
  # Padding predictions (weight 0) exist to give a fixed shape; they must not count.
  label_weights = tf.cast(tf.reshape(features["masked_lm_weights"], [-1]), tf.float32)
  mlm_nll, mlm_correct = outputs["masked_lm_nll"], outputs["masked_lm_correct"]
  mlm_count = tf.reduce_sum(label_weights)
  losses = {"masked_lm_loss": (tf.reduce_sum(mlm_nll * label_weights), mlm_count),
            "masked_lm_accuracy": (tf.reduce_sum(mlm_correct * label_weights), mlm_count)}
  if "next_sentence_log_probs" not in outputs:  # masked-LM only
    return losses
  nsp_log_probs = outputs["next_sentence_log_probs"]
  nsp_labels = tf.cast(tf.reshape(features["next_sentence_labels"], [-1]), tf.int32)
  nsp_nll = -tf.gather(nsp_log_probs, nsp_labels, batch_dims=1)
  nsp_correct = tf.cast(tf.equal(tf.argmax(nsp_log_probs, -1, output_type=tf.int32), nsp_labels),
                        tf.float32)
  nsp_count = tf.cast(tf.size(nsp_labels), tf.float32)
  if "next_sentence_weights" in features:  # packed: the sequences' unused instance slots are 0
    nsp_weights = tf.cast(tf.reshape(features["next_sentence_weights"], [-1]), tf.float32)
    nsp_nll, nsp_correct = nsp_nll * nsp_weights, nsp_correct * nsp_weights
    nsp_count = tf.reduce_sum(nsp_weights)
  return {**losses, "next_sentence_loss": (tf.reduce_sum(nsp_nll), nsp_count),
          "next_sentence_accuracy": (tf.reduce_sum(nsp_correct), nsp_count)}


class OutputLayer(tf.Module):
  """The one new layer of fine-tuning: logits = x @ output_weights^T + output_bias (float32).

  Created outside any name scope by default, so the variables are `output_weights` /
  `output_bias` as in the original's run_classifier.py (SQuAD's live under `cls/squad`).
  """

  def __init__(self, config, num_outputs, scope=None):
    super().__init__(name="output_layer")
    with tf.name_scope(scope) if scope else contextlib.nullcontext():
      self.output_weights = tf.Variable(_initializer(config)([num_outputs, config.hidden_size]),
                                        name="output_weights")
      self.output_bias = tf.Variable(tf.zeros([num_outputs]), name="output_bias")

  def __call__(self, x, inference_weights=None):
    logits = tf.matmul(x, _weight([self.output_weights], x.dtype, inference_weights),
                       transpose_b=True)
    return tf.cast(logits, tf.float32) + self.output_bias

  def weight_groups(self):
    return [([self.output_weights], 0)]


def _head_seed(dropout_seed):
  """A dropout seed for the output layer distinct from every encoder dropout seed."""
  if dropout_seed is None:
    return None
  # 1 << 20 is past every index _dropout_seeds folds in (1 + 3 * num_hidden_layers, at most
  # 3073 within the config's bounds).
  return tf.random.experimental.stateless_fold_in(tf.cast(dropout_seed, tf.int64), 1 << 20)


class _FineTuningModel(tf.Module):
  """BertModel + one OutputLayer + dropout before it: what every fine-tuning head shares."""

  def __init__(self, config, num_outputs, compute_dtype, head_dropout, name, scope=None):
    super().__init__(name=name)
    self.bert = BertModel(config, compute_dtype)
    self.output_layer = OutputLayer(config, num_outputs, scope=scope)
    self.head_dropout = head_dropout

  def _encode(self, features, training, dropout_seed, inference_weights, input_shape=None,
              pooled_only=False):
    """`pooled_only`: the head reads `pooled_output` alone, so the last layer runs at [CLS] only
    (BertModel's `output_positions`). `inference_weights`: see BertModel."""
    reshape = (lambda t: tf.reshape(t, input_shape)) if input_shape is not None else tf.identity
    input_ids = reshape(features["input_ids"])
    cls = tf.zeros([tf.shape(input_ids)[0], 1], tf.int32) if pooled_only else None
    return self.bert(input_ids, reshape(features["input_mask"]), reshape(features["segment_ids"]),
                     training=training, dropout_seed=dropout_seed, output_positions=cls,
                     inference_weights=inference_weights)

  def _logits(self, x, training, dropout_seed, inference_weights):
    return self.output_layer(kernels.dropout(x, self.head_dropout, training,
                                             _head_seed(dropout_seed)), inference_weights)


CLASSIFIER_POOLINGS = ("pooler",) + POOLINGS


class BertClassifier(_FineTuningModel):
  """Sentence classification (softmax over `num_labels`, or independent sigmoids: the loss
  decides) or regression (`num_labels` = 1).

  `pooling`: what the output layer reads. `pooler` (the original's): the tanh pooler over
  [CLS], and then the last layer runs at [CLS] only. `mean` / `cls` / `max`: pool_tokens over
  the last layer's token vectors, the pooler unused: for checkpoints whose pooler was never
  trained, such as sentence-transformers models (all-MiniLM-L6-v2's is a random
  initialisation with outputs near 0, which a new output layer learns from very slowly).
  """

  def __init__(self, config, num_labels, compute_dtype=tf.float32, head_dropout=0.1,
               pooling="pooler"):
    super().__init__(config, num_labels, compute_dtype, head_dropout, name="classifier")
    if pooling not in CLASSIFIER_POOLINGS:
      raise ValueError(f"pooling {pooling!r} is not one of {', '.join(CLASSIFIER_POOLINGS)}")
    self.pooling = pooling

  def __call__(self, features, training=False, dropout_seed=None, inference_weights=None):
    if self.pooling == "pooler":
      outputs = self._encode(features, training, dropout_seed, inference_weights,
                             pooled_only=True)
      vectors = outputs["pooled_output"]
    else:
      outputs = self._encode(features, training, dropout_seed, inference_weights)
      vectors = pool_tokens(outputs["sequence_output"], features["input_mask"], self.pooling)
    outputs["logits"] = self._logits(vectors, training, dropout_seed, inference_weights)
    return outputs


class BertSpanLabeler(_FineTuningModel):
  """Start / end logits over the sequence (SQuAD): `cls/squad/output_{weights,bias}` [2, H].
  No dropout before the output layer, as the original."""

  def __init__(self, config, compute_dtype=tf.float32):
    super().__init__(config, 2, compute_dtype, 0.0, name="span_labeler", scope="cls/squad")

  def __call__(self, features, training=False, dropout_seed=None, inference_weights=None):
    outputs = self._encode(features, training, dropout_seed, inference_weights)
    logits = self._logits(outputs["sequence_output"], training, dropout_seed,
                          inference_weights)  # [b, seq, 2]
    outputs["start_logits"], outputs["end_logits"] = logits[..., 0], logits[..., 1]
    return outputs


class BertTokenClassifier(_FineTuningModel):
  """Per-token logits over `num_labels` (tagging, e.g. NER)."""

  def __init__(self, config, num_labels, compute_dtype=tf.float32, head_dropout=0.1):
    super().__init__(config, num_labels, compute_dtype, head_dropout, name="token_classifier")

  def __call__(self, features, training=False, dropout_seed=None, inference_weights=None):
    outputs = self._encode(features, training, dropout_seed, inference_weights)
    outputs["logits"] = self._logits(outputs["sequence_output"], training, dropout_seed,
                                     inference_weights)
    return outputs


class BertMultipleChoice(_FineTuningModel):
  """One score per choice from its [CLS] (SWAG); inputs are [batch, num_choices, seq]."""

  def __init__(self, config, compute_dtype=tf.float32, head_dropout=0.1):
    super().__init__(config, 1, compute_dtype, head_dropout, name="multiple_choice")

  def __call__(self, features, training=False, dropout_seed=None, inference_weights=None):
    num_choices = features["input_ids"].shape[1]
    # The choices folded into the batch: [batch * num_choices, seq] through the encoder, then one
    # score each, back to [batch, num_choices].
    outputs = self._encode(features, training, dropout_seed, inference_weights,
                           input_shape=[-1, tf.shape(features["input_ids"])[2]], pooled_only=True)
    logits = self._logits(outputs["pooled_output"], training, dropout_seed, inference_weights)
    outputs["logits"] = tf.reshape(logits, [-1, num_choices])
    return outputs


def softmax_cross_entropy(logits, labels, weights):
  """(sum of weighted negative log-likelihoods, sum of weights, weighted correct count)."""
  labels = tf.cast(labels, tf.int32)
  weights = tf.cast(weights, tf.float32)
  # batch_dims over every axis of the labels: [batch] (a class each) or [batch, seq] (tagging).
  nll = -tf.gather(tf.nn.log_softmax(logits), labels, batch_dims=len(labels.shape))
  correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
  return tf.reduce_sum(nll * weights), tf.reduce_sum(weights), tf.reduce_sum(correct * weights)


# The fine-tuning heads' losses, as training.py wants them: {name: (sum, count)}.


def classifier_losses(is_regression, multi_label=False):
  """The task loss as training.py wants it: {name: (sum, count)}, padding examples weighted 0.

  Multi-label (label_ids a 0/1 row per example): each label an independent sigmoid, the loss the
  binary cross-entropy averaged over labels and examples (as torch's BCEWithLogitsLoss, which HF's
  multi_label_classification uses).
  """

  def loss_fn(features, outputs):
    weights = tf.cast(features["is_real_example"], tf.float32)
    logits = outputs["logits"]
    if multi_label:
      logits = tf.cast(logits, tf.float32)
      targets = tf.cast(features["label_ids"], tf.float32)
      bce = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=targets,
                                                                   logits=logits), axis=-1)
      exact = tf.cast(tf.reduce_all(tf.equal(tf.cast(logits > 0, tf.float32), targets), -1),
                      tf.float32)
      count = tf.reduce_sum(weights)
      return {"classification_loss": (tf.reduce_sum(bce * weights), count),
              "exact_match": (tf.reduce_sum(exact * weights), count)}
    if is_regression:
      squared = tf.square(logits[:, 0] - tf.cast(features["label_ids"], tf.float32))
      return {"regression_loss": (tf.reduce_sum(squared * weights), tf.reduce_sum(weights))}
    nll, count, correct = softmax_cross_entropy(logits, features["label_ids"], weights)
    return {"classification_loss": (nll, count), "accuracy": (correct, count)}

  return loss_fn


def squad_losses(features, outputs):
  """The original's loss, the mean of the start and the end cross-entropies, as training.py wants
  it: {name: (sum, count)}; both halves are added into the training loss."""
  weights = tf.ones_like(features["start_positions"], tf.float32)
  start_nll, count, start_correct = softmax_cross_entropy(
      outputs["start_logits"], features["start_positions"], weights)
  end_nll, _, end_correct = softmax_cross_entropy(
      outputs["end_logits"], features["end_positions"], weights)
  return {
      # Halves: the training loss adds them up into the original's (start + end) / 2.
      "start_loss": (start_nll / 2.0, count),
      "end_loss": (end_nll / 2.0, count),
      "start_accuracy": (start_correct, count),
      "end_accuracy": (end_correct, count),
  }


def ner_losses(features, outputs):
  """Cross-entropy and accuracy over the labelled positions (each word's first sub-token) as
  training.py wants them: {name: (sum, count)}; other positions and padding weigh 0."""
  nll, count, correct = softmax_cross_entropy(outputs["logits"], features["label_ids"],
                                                       features["label_weights"])
  return {"ner_loss": (nll, count), "accuracy": (correct, count)}


def swag_losses(features, outputs):
  """Softmax cross-entropy over the four choices, and accuracy, as training.py wants them:
  {name: (sum, count)}; padding examples weigh 0."""
  weights = tf.cast(features["is_real_example"], tf.float32)
  nll, count, correct = softmax_cross_entropy(outputs["logits"], features["label_ids"],
                                                       weights)
  return {"multiple_choice_loss": (nll, count), "accuracy": (correct, count)}
