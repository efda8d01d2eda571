"""A Keras 3 layer over an encoder exported by export_model.py, whose weights are the SavedModel's
own variables, so `model.fit` trains them (or, with `trainable=False`, leaves them frozen).

    import keras
    from bert_tf2 import keras_encoder
    encoder = keras_encoder.EncoderLayer("/tmp/encoder")           # trainable=False: frozen
    inputs = {k: keras.Input((None,), dtype="int32", name=k)
              for k in ("input_word_ids", "input_mask", "input_type_ids")}
    model = keras.Model(inputs, keras.layers.Dense(2)(encoder(inputs)["pooled_output"]))

Why not `keras.layers.TFSMLayer(path, call_endpoint="serve")`: with its weights trainable, Keras
3.15's `fit` fails before the first step with "'bert_embeddings_position_embeddings:0_momentum' is
not a valid scope name". TFSMLayer names each weight after the TensorFlow variable's name, ':0'
included (keras/src/export/tfsm_layer.py, `_add_existing_weight`: `name=weight.name.replace("/",
"_")`), the optimizer names its slot after the weight's path with only '/' replaced
(keras/src/optimizers/base_optimizer.py, `add_variable_from_reference`:
`name = f"{reference_variable.path.replace('/', '_')}_{name}"`), and `tf.Variable` refuses a name
with ':' inside the traced training step where the slots are built. A TensorFlow variable's name
always ends in ':0' (the SavedModel stores "bert/embeddings/word_embeddings", TensorFlow adds the
':0' when it loads it), so no export can avoid it. This layer names each weight after its
checkpoint name without the ':0', its path the checkpoint's scopes under the layer's name
(`encoder_layer/bert/encoder/layer_0/attention/self/query/kernel`), and calls the export's
`__call__(inputs, training)`, so dropout is on while `fit` trains the encoder (TFSMLayer's
`serve` is the inference graph: no dropout).

Keras 3 only (TensorFlow 2.21's `keras`, its TensorFlow backend); with tf-keras,
`hub.KerasLayer(path, trainable=True)` does the same. The fine-tuned encoder is kept with
`tf.saved_model.save(layer.encoder, DIR)`: the export's layout, under the export's variable names,
which the fine-tuning scripts take as `--hub_module_handle`.
"""

import contextlib

import keras
import tensorflow as tf


class EncoderLayer(keras.layers.Layer):
  """The exported encoder (export_model.py --model_type=encoder, or any SavedModel with its
  reusable API: `__call__(inputs, training)` and a `variables` list) as a Keras 3 layer.

  Called with a dict of int32 [batch, seq] `input_word_ids`, `input_mask` and `input_type_ids`,
  it returns the export's outputs: `pooled_output`, `sequence_output`, `encoder_outputs` (a list,
  one [batch, seq, hidden] per layer) and `default` (the pooled output).

  `trainable=True` (the default): `fit` fine-tunes every encoder weight, with dropout while
  training. `trainable=False`: a frozen feature extractor, its outputs those of inference (no
  dropout) in training too. `layer.encoder` is the loaded SavedModel; its variables are the
  layer's weights (the same objects), so a trained encoder is saved with
  `tf.saved_model.save(layer.encoder, DIR)`.
  """

  def __init__(self, export_dir, trainable=True, name=None, **kwargs):
    if keras.backend.backend() != "tensorflow":
      raise ValueError(f"EncoderLayer runs a TensorFlow SavedModel: it needs Keras's TensorFlow "
                       f"backend, not {keras.backend.backend()} (KERAS_BACKEND)")
    super().__init__(trainable=trainable, name=name, **kwargs)
    self.export_dir = str(export_dir)
    encoder = tf.saved_model.load(self.export_dir)
    variables = getattr(encoder, "variables", None)
    if not callable(encoder) or not isinstance(variables, (list, tuple)):
      raise ValueError(f"{self.export_dir} is not an exported encoder: EncoderLayer takes a "
                       "SavedModel of export_model.py --model_type=encoder (a callable with a "
                       "`variables` list)")
    self.encoder = encoder
    with keras.name_scope(self.name, caller=self):
      # Tracked as the layer's weights by assignment, in the export's order.
      self.encoder_weights = [_wrap(variable) for variable in variables]
    for weight in self.encoder_weights:  # As Keras flags the weights of a frozen layer.
      weight.trainable = weight.trainable and self.trainable
    self.built = True

  def call(self, inputs, training=None):
    # A frozen encoder is a feature extractor: inference outputs, no dropout, in training too.
    training = bool(training) and self.trainable
    return self.encoder({k: inputs[k] for k in ("input_word_ids", "input_mask",
                                                "input_type_ids")}, training=training)

  def get_config(self):
    return {**super().get_config(), "export_dir": self.export_dir}


def _wrap(variable):
  """A Keras variable over the TensorFlow `variable` itself (not a copy: Keras 3 keeps a
  tf.Variable given as the initializer), named by its checkpoint name without ':0', each scope a
  Keras name scope (Keras names hold no '/')."""
  *scopes, name = variable.name.rsplit(":", 1)[0].split("/")
  with contextlib.ExitStack() as stack:
    for scope in scopes:
      stack.enter_context(keras.name_scope(scope))
    wrapped = keras.Variable(initializer=variable, shape=variable.shape, dtype=variable.dtype,
                             trainable=variable.trainable, name=name)
  if wrapped.value is not variable:  # A Keras that copies would train a copy the export ignores.
    raise RuntimeError(f"keras {keras.__version__} copied {variable.name} instead of wrapping it")
  return wrapped
