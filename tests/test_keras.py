"""The exported SavedModels from Keras: Keras 3 (TensorFlow 2.21's `keras`) through
keras.layers.TFSMLayer (serving, a frozen encoder under a head), keras_encoder.EncoderLayer (an
encoder `fit` fine-tunes or leaves frozen) and a thin keras.Model that fine-tunes the encoder, and
tf-keras through hub.KerasLayer, on real MRPC pairs and SST-2 sentences and the real MiniLM
checkpoint (docs/features-and-serving.md, "From Keras")."""

import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import SHARED, import_script, minilm_dir, requires_shared
from bert_tf2 import classifier_tasks
from bert_tf2 import export_model
from bert_tf2 import modeling
from bert_tf2 import tokenization

MRPC = os.path.join(SHARED, "data", "glue", "MRPC")
SST2 = os.path.join(SHARED, "data", "glue", "SST-2")
ENCODER_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
  return export_model.export("encoder", str(tmp_path_factory.mktemp("keras") / "encoder"),
                             init_checkpoint=minilm_dir(), do_lower_case=True)


def _glue(task, directory, count, seq_length):
  """The first `count` training examples of a GLUE task, as run_classifier tokenizes them:
  (encoder inputs as numpy, labels, examples)."""
  run_classifier = import_script("run_classifier")
  examples = classifier_tasks.get_processor(task).get_train_examples(directory)[:count]
  tokenizer = tokenization.FullTokenizer(os.path.join(minilm_dir(), "vocab.txt"), True)
  features = [run_classifier.convert_single_example(i, e, ["0", "1"], seq_length, tokenizer)
              for i, e in enumerate(examples)]
  inputs = {"input_word_ids": np.array([f.input_ids for f in features], np.int32),
            "input_mask": np.array([f.input_mask for f in features], np.int32),
            "input_type_ids": np.array([f.segment_ids for f in features], np.int32)}
  labels = np.array([f.label_id for f in features], np.int32)
  return inputs, labels, examples


def _mrpc(count, seq_length=64):
  """The first `count` MRPC training pairs: (encoder inputs as numpy, labels, text pairs)."""
  return _glue("mrpc", MRPC, count, seq_length)


class EncoderClassifier:
  """The keras.Model subclass with its own train_step that docs/features-and-serving.md mentions,
  built on first use (keras is imported by the tests only)."""

  @staticmethod
  def build(encoder_dir, num_labels):
    import keras  # pylint: disable=g-import-not-at-top

    class Model(keras.Model):
      """A classifier on the exported encoder's pooled output that fine-tunes the encoder too:
      Keras 3 tracks only its own variables, so train_step adds the SavedModel's."""

      def __init__(self):
        super().__init__()
        self.encoder = tf.saved_model.load(encoder_dir)
        self.head = keras.layers.Dense(num_labels)

      def call(self, inputs, training=False):
        return self.head(self.encoder(inputs, training=training)["pooled_output"])

      def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
          y_pred = self(x, training=True)
          loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        variables = self.trainable_variables + list(self.encoder.trainable_variables)
        self.optimizer.apply(tape.gradient(loss, variables), variables)
        for metric in self.metrics:  # Keras 3's pattern for a train_step of one's own
          if metric.name == "loss":
            metric.update_state(loss)
          else:
            metric.update_state(y, y_pred)
        return {metric.name: metric.result() for metric in self.metrics}

    return Model()


@pytest.mark.slow
@requires_shared
def test_keras3_tfsmlayer_serves_the_encoder_and_the_classifier(encoder_dir, tmp_path):
  import keras  # pylint: disable=g-import-not-at-top
  assert keras.__version__.startswith("3.")
  inputs, _, examples = _mrpc(16)
  loaded = tf.saved_model.load(encoder_dir)
  want = loaded.serve({k: tf.constant(v) for k, v in inputs.items()})
  layer = keras.layers.TFSMLayer(encoder_dir, call_endpoint="serve")
  symbolic = {k: keras.Input((None,), dtype="int32", name=k) for k in inputs}
  model = keras.Model(symbolic, layer(symbolic)["sequence_output"])
  real = inputs["input_mask"].astype(bool)
  np.testing.assert_allclose(model.predict(inputs, verbose=0)[real],
                             want["sequence_output"].numpy()[real], atol=1e-5, rtol=0)
  # The pooled output of the first MRPC pair is not the zero vector a broken load would give.
  assert np.abs(want["pooled_output"].numpy()).max() > 0.1

  # A classifier on raw text: string inputs in a Keras 3 model, outputs as the signature's.
  tf.random.set_seed(1)
  classifier = modeling.BertClassifier(modeling.BertConfig.from_json_file(
      os.path.join(minilm_dir(), "config.json")), 2)
  directory = tmp_path / "mrpc"
  tf.train.Checkpoint(model=classifier).write(str(directory / "ckpt-1"))
  (directory / "bert_config.json").write_text(classifier.bert.config.to_json_string(),
                                              encoding="utf-8")
  path = export_model.export("classifier", str(tmp_path / "served"),
                             init_checkpoint=str(directory / "ckpt-1"),
                             vocab_file=os.path.join(minilm_dir(), "vocab.txt"),
                             max_seq_length=64, labels=["different", "paraphrase"],
                             text_pairs=True)
  text_a = keras.Input((), dtype="string", name="text_a")
  text_b = keras.Input((), dtype="string", name="text_b")
  # The `pairs` function (text_a, text_b); signatures take keyword arguments only, and a Keras
  # layer is called with its input first.
  served = keras.layers.TFSMLayer(path, call_endpoint="pairs")
  texts = {"text_a": np.array([e.text_a for e in examples], dtype=object),
           "text_b": np.array([e.text_b for e in examples], dtype=object)}
  got = keras.Model([text_a, text_b],
                    served(text_a, text_b=text_b)["probabilities"]).predict(
                        texts, verbose=0)
  signature = tf.saved_model.load(path).signatures["serving_default"](
      text_a=tf.constant(texts["text_a"]), text_b=tf.constant(texts["text_b"]))
  np.testing.assert_allclose(got, signature["probabilities"].numpy(), atol=1e-6, rtol=0)
  np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


@pytest.mark.slow
@requires_shared
def test_keras3_model_fine_tunes_the_exported_encoder(encoder_dir, tmp_path):
  import keras  # pylint: disable=g-import-not-at-top
  inputs, labels, _ = _mrpc(64)
  keras.utils.set_random_seed(0)
  model = EncoderClassifier.build(encoder_dir, 2)
  model.compile(optimizer=keras.optimizers.Adam(1e-4),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
  encoder_before = {v.name: v.numpy().copy() for v in model.encoder.trainable_variables}
  history = model.fit(inputs, labels, batch_size=16, epochs=3, shuffle=False, verbose=0)
  # Learning: the training loss falls epoch after epoch on the same 64 pairs.
  losses = history.history["loss"]
  assert losses[2] < losses[1] < losses[0], losses
  # The encoder itself was fine-tuned, every layer of it, not just the new head.
  changed = {name for name, value in encoder_before.items()
             if not np.allclose(value, model.encoder.variables[
                 [v.name for v in model.encoder.variables].index(name)].numpy())}
  for layer in range(6):
    assert f"bert/encoder/layer_{layer}/attention/self/query/kernel:0" in changed
  assert "bert/embeddings/word_embeddings:0" in changed
  # Inference is deterministic (dropout only when training) and the predictions are the model's.
  logits = model.predict(inputs, verbose=0)
  np.testing.assert_allclose(logits, model.predict(inputs, verbose=0), atol=1e-6)
  assert logits.shape == (64, 2)
  # The fine-tuned encoder saved as docs/features-and-serving.md shows: the same outputs from its
  # signature, and the export's assets, so the fine-tuning scripts can start from it.
  tuned = str(tmp_path / "tuned")
  tf.saved_model.save(model.encoder, tuned)
  batch = {k: tf.constant(v[:8]) for k, v in inputs.items()}
  reloaded = tf.saved_model.load(tuned).signatures["serving_default"](**batch)["pooled_output"]
  np.testing.assert_allclose(reloaded.numpy(),
                             model.encoder(batch, training=False)["pooled_output"].numpy(),
                             atol=1e-5)
  assert not np.allclose(reloaded.numpy(), tf.saved_model.load(encoder_dir).signatures[
      "serving_default"](**batch)["pooled_output"].numpy(), atol=1e-4)
  assert sorted(os.listdir(os.path.join(tuned, "assets"))) == ["bert_config.json", "vocab.txt"]


@pytest.mark.slow
@requires_shared
def test_tf_keras_hub_keraslayer_fine_tunes_the_exported_encoder(encoder_dir):
  import tensorflow_hub as hub  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  inputs, labels, _ = _mrpc(64)
  tf.random.set_seed(0)
  encoder = hub.KerasLayer(encoder_dir, trainable=True)
  symbolic = {k: tf_keras.Input((None,), dtype=tf.int32, name=k) for k in inputs}
  model = tf_keras.Model(symbolic, tf_keras.layers.Dense(2)(encoder(symbolic)["pooled_output"]))
  model.compile(optimizer=tf_keras.optimizers.Adam(1e-4),
                loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  before = {v.name: v.numpy().copy() for v in encoder.trainable_weights}
  losses = model.fit(inputs, labels, batch_size=16, epochs=3, shuffle=False,
                     verbose=0).history["loss"]
  assert losses[2] < losses[1] < losses[0], losses
  changed = {v.name for v in encoder.trainable_weights
             if not np.allclose(v.numpy(), before[v.name])}
  for layer in range(6):
    assert f"bert/encoder/layer_{layer}/attention/self/query/kernel:0" in changed


def _issue_model(encoder, learning_rate=1e-3):
  """The Keras 3 model of issue #73: a Dense head on the encoder layer's pooled output."""
  import keras  # pylint: disable=g-import-not-at-top
  inputs = {k: keras.Input((None,), dtype="int32", name=k) for k in ENCODER_INPUTS}
  head = keras.layers.Dense(2)
  model = keras.Model(inputs, head(encoder(inputs)["pooled_output"]))
  model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model, head


def _fit(model, head, variables, inputs, labels):
  """Fits `model` 3 epochs on the same rows; (the losses of the epochs, the head's kernel moved,
  the names of `variables` that changed)."""
  before = [v.numpy().copy() for v in variables]
  kernel = head.kernel.numpy().copy()
  losses = model.fit(inputs, labels, batch_size=8, epochs=3, shuffle=False,
                     verbose=0).history["loss"]
  changed = {v.name for v, value in zip(variables, before) if not np.array_equal(v.numpy(), value)}
  return losses, not np.allclose(head.kernel.numpy(), kernel, atol=1e-6), changed


@requires_shared
def test_keras3_tfsmlayer_fits_a_head_on_the_frozen_encoder_only(encoder_dir):
  """Issue #73's model with the TFSMLayer frozen: `fit` trains the head on real SST-2 sentences
  and leaves the encoder as exported. Trainable, Keras 3.15's own naming stops `fit` (see
  keras_encoder.py); when a Keras fixes it, this says so and the docs change."""
  import keras  # pylint: disable=g-import-not-at-top
  inputs, labels, _ = _glue("sst-2", SST2, 16, 32)
  keras.utils.set_random_seed(0)
  layer = keras.layers.TFSMLayer(encoder_dir, call_endpoint="serve", trainable=False)
  model, head = _issue_model(layer)
  assert len(model.trainable_weights) == 2  # the head's kernel and bias only
  encoder = tf.saved_model.load(encoder_dir)  # a second copy, as exported
  losses, head_moved, changed = _fit(model, head, layer.weights, inputs, labels)
  assert losses[2] < losses[1] < losses[0], losses
  assert head_moved
  assert len(layer.weights) == len(encoder.variables) and not changed, sorted(changed)[:3]
  batch = {k: tf.constant(v) for k, v in inputs.items()}
  np.testing.assert_allclose(layer(batch)["pooled_output"].numpy(),
                             encoder.serve(batch)["pooled_output"].numpy(), atol=1e-5, rtol=0)

  trainable = keras.layers.TFSMLayer(encoder_dir, call_endpoint="serve")
  model, _ = _issue_model(trainable)
  with pytest.raises(ValueError, match=r":0_momentum' is not a valid scope name"):
    model.fit(inputs, labels, batch_size=8, epochs=1, verbose=0)


@pytest.mark.slow
@requires_shared
def test_keras3_encoder_layer_fine_tunes_or_freezes_the_exported_encoder(encoder_dir,
                                                                        tmp_path):
  """Issue #73's model with keras_encoder.EncoderLayer in the TFSMLayer's place: `fit` fine-tunes
  every encoder layer (the SavedModel's own variables, which tf.saved_model.save writes), or with
  trainable=False trains the head alone; real SST-2 sentences, the real MiniLM export."""
  import keras  # pylint: disable=g-import-not-at-top
  from bert_tf2 import keras_encoder  # pylint: disable=g-import-not-at-top (imports keras)
  assert keras.__version__.startswith("3.")
  inputs, labels, _ = _glue("sst-2", SST2, 16, 32)
  batch = {k: tf.constant(v) for k, v in inputs.items()}
  exported = tf.saved_model.load(encoder_dir)  # held: its functions read its variables
  want = exported.serve(batch)["pooled_output"].numpy()

  keras.utils.set_random_seed(0)
  layer = keras_encoder.EncoderLayer(encoder_dir)
  model, head = _issue_model(layer, learning_rate=1e-4)
  # The layer's weights are the SavedModel's variables, under their checkpoint names.
  assert [w.value for w in layer.weights] == list(layer.encoder.variables)
  assert (f"{layer.name}/bert/encoder/layer_0/attention/self/query/kernel"
          in [w.path for w in layer.trainable_weights])
  assert len(model.trainable_weights) == len(layer.encoder.trainable_variables) + 2
  np.testing.assert_allclose(model.predict(inputs, verbose=0),
                             head(tf.constant(want)).numpy(), atol=1e-5, rtol=0)
  losses, head_moved, changed = _fit(model, head, layer.encoder.variables, inputs, labels)
  assert losses[2] < losses[1] < losses[0], losses
  assert head_moved
  for i in range(6):
    assert f"bert/encoder/layer_{i}/attention/self/query/kernel:0" in changed
  assert "bert/embeddings/word_embeddings:0" in changed
  # Dropout in training only; inference is deterministic, and the encoder's outputs moved.
  tuned = layer(batch)["pooled_output"].numpy()
  np.testing.assert_allclose(tuned, layer(batch)["pooled_output"].numpy(), atol=1e-6)
  assert not np.allclose(layer(batch, training=True)["pooled_output"].numpy(), tuned, atol=1e-4)
  assert not np.allclose(tuned, want, atol=1e-4)
  # Kept as the docs say: the fine-tuned encoder's SavedModel gives the fine-tuned outputs.
  tf.saved_model.save(layer.encoder, str(tmp_path / "tuned"))
  reloaded = tf.saved_model.load(str(tmp_path / "tuned"))
  np.testing.assert_allclose(reloaded.serve(batch)["pooled_output"].numpy(), tuned, atol=1e-5,
                             rtol=0)
  # Under the export's variable names, which --hub_module_handle copies by (checkpoints.py).
  assert (sorted(v.name for v in reloaded.variables)
          == sorted(v.name for v in exported.variables))

  frozen = keras_encoder.EncoderLayer(encoder_dir, trainable=False)
  model, head = _issue_model(frozen)
  assert len(model.trainable_weights) == 2 and not frozen.trainable_weights
  losses, head_moved, changed = _fit(model, head, frozen.encoder.variables, inputs, labels)
  assert losses[2] < losses[1] < losses[0], losses
  assert head_moved and not changed, sorted(changed)[:3]
  # Frozen, a feature extractor: the exported outputs, with no dropout in training either.
  np.testing.assert_allclose(frozen(batch, training=True)["pooled_output"].numpy(), want,
                             atol=1e-5, rtol=0)
