"""The original's `modeling` API (google-research/bert's modeling.py) on TensorFlow 2.

Code written against the original calls `modeling.BertModel(config, is_training, input_ids, ...)`
and reads its getters. Here that object is a thin front of the project's one model,
bert_tf2.modeling.BertModel: it builds the project's encoder (variables named as the original's
checkpoints, `bert/embeddings/word_embeddings`, `bert/encoder/layer_0/...`, `bert/pooler/...`),
runs it on the inputs at construction, eagerly or inside a tf.function, and keeps the outputs for
the getters. There is no TF1 graph to run again, so calling the object with a new batch returns a
new front that shares the weights (what `reuse=True` gave in TF1).

The original's functions that only compute (gelu, get_shape_list, the attention mask, ...) are
kept; those that created variables in the graph's variable scope (embedding_lookup,
transformer_model, ...) have no TF2 meaning outside a module and are gone: asking for one names
the module that holds that block now. docs/coming-from-the-original.md has the whole table.
"""

import collections

import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import kernels
from bert_tf2 import modeling

BertConfig = modeling.BertConfig

__all__ = ["BertConfig", "BertModel", "clear_traced_encoders", "gelu", "get_activation", "get_assignment_map_from_checkpoint",
           "init_from_checkpoint", "dropout", "layer_norm", "layer_norm_and_dropout",
           "create_initializer", "create_attention_mask_from_input_mask", "get_shape_list",
           "reshape_to_matrix", "reshape_from_matrix", "assert_rank",
           # (so that `from ... import *` gives the root module the pointers below too)
           "__getattr__"]


class BertModel(tf.Module):
  """The original's BertModel: built from the inputs, outputs read by getters.

      model = modeling.BertModel(config=config, is_training=True, input_ids=input_ids,
                                 input_mask=input_mask, token_type_ids=token_type_ids)
      pooled = model.get_pooled_output()      # [batch, hidden]
      sequence = model.get_sequence_output()  # [batch, seq, hidden]

  `is_training` False turns dropout off (the original copied the config with both dropout rates
  at 0). `use_one_hot_embeddings` is accepted and changes nothing: the one-hot matmul was a TPU
  speed trick with the same result as the gather. `scope` names the variables' first part
  ("bert" by default) as the original's variable scope did.

  Eagerly each BertModel made this way has weights of its own; inside a tf.function the weights
  are made at the first trace and found again by later traces (and by any BertModel built in a
  tf.function with the same scope and config), as TF1's variable scope found a graph's variables.

  `model(input_ids, input_mask, token_type_ids, is_training=...)` runs the same weights on another
  batch and returns a front whose getters hold those outputs. `model.bert` is the project's
  BertModel underneath (checkpoints.init_from_checkpoint, export, ...), `model.variables` its
  variables.
  """

  def __init__(self, config, is_training, input_ids, input_mask=None, token_type_ids=None,
               use_one_hot_embeddings=False, scope=None):
    del use_one_hot_embeddings  # a TPU speed trick; the gather gives the same embeddings
    name = scope or "bert"
    super().__init__(name=f"{name}_front")
    self.bert = _encoder(config, name)
    self.config = config
    self._run(is_training, input_ids, input_mask, token_type_ids)

  def __call__(self, input_ids, input_mask=None, token_type_ids=None, is_training=False):
    front = object.__new__(type(self))
    tf.Module.__init__(front, name=self.name)
    front.bert, front.config = self.bert, self.config
    front._run(is_training, input_ids, input_mask, token_type_ids)
    return front

  def _run(self, is_training, input_ids, input_mask, token_type_ids):
    outputs = self.bert(input_ids, input_mask, token_type_ids, training=bool(is_training))
    self.embedding_output = outputs["embedding_output"]
    self.all_encoder_layers = outputs["encoder_outputs"]
    self.sequence_output = outputs["sequence_output"]
    self.pooled_output = outputs["pooled_output"]
    self.embedding_table = self.bert.embedding_table

  def get_pooled_output(self):
    return self.pooled_output

  def get_sequence_output(self):
    """The last layer, [batch, seq, hidden]."""
    return self.sequence_output

  def get_all_encoder_layers(self):
    return self.all_encoder_layers

  def get_embedding_output(self):
    """The embeddings (word + position + segment, LayerNorm, dropout) the encoder reads."""
    return self.embedding_output

  def get_embedding_table(self):
    return self.embedding_table


# Encoders made while a tf.function traces, by (scope, config): tf.function traces a function
# that makes variables twice and refuses new ones at the second trace, so the second (and any
# retrace) must find the first's, as TF1's variable scope let a graph find its variables by name.
_TRACED_ENCODERS = {}


def _encoder(config, name):
  """The project's BertModel named `name`; made fresh when eager (a Python object owns its
  weights), made once per scope and config when built inside a tf.function."""
  if tf.executing_eagerly():
    # Built outside the front's own name scope: the variables are then `bert/...`, the
    # original's names, not `bert_front/bert/...`.
    return modeling.BertModel(config, name=name)
  key = (name, config.to_json_string())
  if key not in _TRACED_ENCODERS:
    with tf.init_scope():  # the variables live outside the function, as any tf.function's
      _TRACED_ENCODERS[key] = modeling.BertModel(config, name=name)
  return _TRACED_ENCODERS[key]


def clear_traced_encoders():
  """Forgets the encoders made inside tf.functions (BertModel above), as TF1's
  tf.reset_default_graph() forgot a graph's variables: the next trace makes new weights."""
  _TRACED_ENCODERS.clear()


def gelu(x):
  """The original's GELU, the tanh approximation."""
  return modeling.ACTIVATIONS["gelu"](x)


# The original's names; the project's model accepts a few more (modeling.ACTIVATIONS).
def get_activation(activation_string):
  """An activation function by name: None for None, "" and "linear" (no activation), as the
  original; a non-string (already a function) is returned as it is."""
  if not isinstance(activation_string, str):
    return activation_string
  name = activation_string.lower()
  if name in ("", "linear"):
    return None
  if name not in modeling.ACTIVATIONS:
    raise ValueError(f"Unsupported activation: {activation_string}")
  return modeling.ACTIVATIONS[name]


def get_assignment_map_from_checkpoint(tvars, init_checkpoint):
  """(assignment_map, initialized_variable_names) for the variables `tvars` whose names (less the
  ":0") are in the checkpoint, as the original. TF2 has no graph-wide init_from_checkpoint, so
  the map's values are the variables themselves, ready for `init_from_checkpoint` below (the
  original's map held their names)."""
  names = {checkpoints.variable_name(v): v for v in tvars}
  _, prefix = checkpoints.resolve_checkpoint(init_checkpoint)
  in_checkpoint = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
  assignment_map = collections.OrderedDict()
  initialized_variable_names = {}
  for name in sorted(in_checkpoint):
    if name in names:
      assignment_map[name] = names[name]
      initialized_variable_names[name] = 1
      initialized_variable_names[name + ":0"] = 1
  return assignment_map, initialized_variable_names


def init_from_checkpoint(init_checkpoint, assignment_map):
  """TF1's tf.train.init_from_checkpoint for a map from get_assignment_map_from_checkpoint
  ({checkpoint name: variable}): assigns the values now (TF1 did at the initializer's run).
  A shape that differs is an error naming the variable."""
  _, prefix = checkpoints.resolve_checkpoint(init_checkpoint)
  checkpoints.assign_from_tf1(prefix, assignment_map)


def dropout(input_tensor, dropout_prob):
  """Dropout with the original's argument, the probability of dropping (None or 0: none)."""
  if dropout_prob is None or dropout_prob == 0.0:
    return input_tensor
  return tf.nn.dropout(input_tensor, rate=dropout_prob)


def layer_norm(input_tensor, name=None):
  """Normalisation over the last axis with scale 1 and offset 0, the original's layer_norm at
  initialisation. In TF1 it also created the trained scale and offset in the graph; a function
  holds no variables in TF2, so a trained LayerNorm is a module (bert_tf2.modeling.LayerNorm)."""
  del name
  dim = input_tensor.shape[-1]
  # The original's epsilon (tf.contrib.layers.layer_norm's 1e-12).
  return kernels.layer_norm(input_tensor, tf.ones([dim]), tf.zeros([dim]), 1e-12)


def layer_norm_and_dropout(input_tensor, dropout_prob, name=None):
  return dropout(layer_norm(input_tensor, name), dropout_prob)


def create_initializer(initializer_range=0.02):
  """The original's weight initializer, a normal cut at two standard deviations: a function of
  (shape, dtype) giving the initial value."""
  return lambda shape, dtype=tf.float32: tf.random.truncated_normal(
      shape, stddev=initializer_range, dtype=dtype)


def create_attention_mask_from_input_mask(from_tensor, to_mask):
  """[batch, from_seq, to_seq] float32: 1 where a position of `from_tensor` may attend to a
  position of `to_mask` (its non-zero entries), as the original."""
  batch, from_seq = get_shape_list(from_tensor, expected_rank=[2, 3])[:2]
  to_seq = get_shape_list(to_mask, expected_rank=2)[1]
  to_mask = tf.cast(tf.reshape(to_mask, [batch, 1, to_seq]), tf.float32)
  return tf.ones([batch, from_seq, 1], tf.float32) * to_mask


def get_shape_list(tensor, expected_rank=None, name=None):
  """The shape as a list: Python ints where static, scalar tensors where not (a tf.function
  traced with a None dimension)."""
  if expected_rank is not None:
    assert_rank(tensor, expected_rank, name)
  static = tensor.shape.as_list()
  if all(d is not None for d in static):
    return static
  dynamic = tf.shape(tensor)
  return [d if d is not None else dynamic[i] for i, d in enumerate(static)]


def reshape_to_matrix(input_tensor):
  """A rank >= 2 tensor as a matrix [-1, last dimension]."""
  if input_tensor.shape.ndims < 2:
    raise ValueError(f"Input tensor must have at least rank 2. Shape = {input_tensor.shape}")
  if input_tensor.shape.ndims == 2:
    return input_tensor
  return tf.reshape(input_tensor, [-1, input_tensor.shape[-1]])


def reshape_from_matrix(output_tensor, orig_shape_list):
  """reshape_to_matrix undone: back to `orig_shape_list`'s leading dimensions."""
  if len(orig_shape_list) == 2:
    return output_tensor
  width = get_shape_list(output_tensor)[-1]
  return tf.reshape(output_tensor, orig_shape_list[:-1] + [width])


def assert_rank(tensor, expected_rank, name=None):
  """ValueError unless the tensor's rank is `expected_rank` (an int or a list of them)."""
  expected = {expected_rank} if isinstance(expected_rank, int) else set(expected_rank)
  if tensor.shape.ndims not in expected:
    label = name or getattr(tensor, "name", None) or "tensor"
    raise ValueError(f"For the tensor `{label}`, the actual rank `{tensor.shape.ndims}` (shape = "
                     f"{tensor.shape}) is not equal to the expected rank `{sorted(expected)}`")


# What the original's graph-building functions became: each created its variables with
# tf.get_variable in the enclosing variable scope, which TF2 has no more.
_GONE = {
    "embedding_lookup": "bert_tf2.modeling.Embeddings (the word embeddings)",
    "embedding_postprocessor": "bert_tf2.modeling.Embeddings (segment and position embeddings)",
    "attention_layer": "bert_tf2.modeling.SelfAttention",
    "transformer_model": "bert_tf2.modeling.Encoder, or BertModel for the whole encoder",
}


def __getattr__(name):
  if name in _GONE:
    raise AttributeError(
        f"modeling.{name} built TF1 graph variables and is gone in TensorFlow 2: use "
        f"{_GONE[name]} (docs/coming-from-the-original.md)")
  raise AttributeError(f"module 'modeling' has no attribute {name!r}")

