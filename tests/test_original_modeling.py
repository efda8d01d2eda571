"""The original's modeling_test.py, ported to TensorFlow 2, then the front against the project's
model, Google checkpoints restored into it and a classifier head on it trained by the Trainer.

The port (the first class): every call into `modeling` is as the original's test writes it
(`modeling.BertConfig(...)`, `modeling.BertModel(config=..., is_training=..., input_ids=...,
input_mask=..., token_type_ids=..., scope=...)`, the four getters, `config.to_json_string()`),
on the checkout's root `modeling` module as its users import it. What changed: TF1's
`test_session()`, `sess.run` and the variable initializers are gone (TF2 runs eagerly and a
variable is initialised when made); the graph check that every op is reachable from the outputs
runs on the graph of create_model traced by tf.function, the TF2 graph; pytest instead of
tf.test's runner, a seeded random.Random for the ids.
"""

import collections
import json
import random
import re

import numpy as np
import pytest
import tensorflow as tf

import modeling
from bert_tf2 import checkpoints
from bert_tf2 import classifier_tasks
from bert_tf2 import errors
from bert_tf2 import modeling as project_modeling
from bert_tf2 import optimization as project_optimization
from bert_tf2 import run_classifier as project_run_classifier
from bert_tf2 import tokenization
from bert_tf2 import training
from conftest import SHARED, TINY, TINY_CKPT, TINY_VOCAB, requires_shared


def ids_tensor(shape, vocab_size, rng):
  """A random int32 tensor of `shape` with values in [0, vocab_size), as the original's."""
  values = [rng.randint(0, vocab_size - 1) for _ in range(int(np.prod(shape)))]
  return tf.constant(values, dtype=tf.int32, shape=shape)


class BertModelTester:
  """The original's tester: its sizes (hidden 32, 5 layers, 4 heads, intermediate 37)."""

  def __init__(self, batch_size=13, seq_length=7, is_training=True, use_input_mask=True,
               use_token_type_ids=True, vocab_size=99, hidden_size=32, num_hidden_layers=5,
               num_attention_heads=4, intermediate_size=37, hidden_act="gelu",
               hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
               max_position_embeddings=512, type_vocab_size=16, initializer_range=0.02,
               scope=None):
    self.__dict__.update({k: v for k, v in locals().items() if k != "self"})
    self.rng = random.Random(0)

  def create_model(self):
    input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size, self.rng)
    input_mask = None
    if self.use_input_mask:
      input_mask = ids_tensor([self.batch_size, self.seq_length], 2, self.rng)
    token_type_ids = None
    if self.use_token_type_ids:
      token_type_ids = ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size,
                                  self.rng)
    config = modeling.BertConfig(
        vocab_size=self.vocab_size,
        hidden_size=self.hidden_size,
        num_hidden_layers=self.num_hidden_layers,
        num_attention_heads=self.num_attention_heads,
        intermediate_size=self.intermediate_size,
        hidden_act=self.hidden_act,
        hidden_dropout_prob=self.hidden_dropout_prob,
        attention_probs_dropout_prob=self.attention_probs_dropout_prob,
        max_position_embeddings=self.max_position_embeddings,
        type_vocab_size=self.type_vocab_size,
        initializer_range=self.initializer_range)
    model = modeling.BertModel(
        config=config,
        is_training=self.is_training,
        input_ids=input_ids,
        input_mask=input_mask,
        token_type_ids=token_type_ids,
        scope=self.scope)
    return {
        "embedding_output": model.get_embedding_output(),
        "sequence_output": model.get_sequence_output(),
        "pooled_output": model.get_pooled_output(),
        "all_encoder_layers": model.get_all_encoder_layers(),
    }

  def check_output(self, result):
    assert list(result["embedding_output"].shape) == [
        self.batch_size, self.seq_length, self.hidden_size]
    assert list(result["sequence_output"].shape) == [
        self.batch_size, self.seq_length, self.hidden_size]
    assert list(result["pooled_output"].shape) == [self.batch_size, self.hidden_size]
    # (not in the original's check: one output per layer)
    assert len(result["all_encoder_layers"]) == self.num_hidden_layers


def _unreachable_ops(graph, outputs):
  """The ops of `graph` that the outputs do not depend on: every input and output of an op is
  reachable once an output depends on one of the op's outputs."""
  producers = collections.defaultdict(list)
  for op in graph.get_operations():
    for y in op.outputs:
      producers[y.name].append(op)
  seen, stack = set(), [t.name for t in tf.nest.flatten(outputs)]
  while stack:
    name = stack.pop()
    if name in seen:
      continue
    seen.add(name)
    for op in producers[name]:
      stack += [t.name for t in list(op.inputs) + list(op.outputs)]
  # Control inputs (the variables' reads ordered after their creation) carry no tensor.
  return [op for op in graph.get_operations()
          if any(t.name not in seen for t in list(op.inputs) + list(op.outputs))]


def run_tester(tester):
  """The original's run_tester: build, run, check the shapes, and check that the graph holds no
  op the outputs do not need."""
  concrete = tf.function(tester.create_model).get_concrete_function()
  ignore = [re.compile(p) for p in (r"^.*/assert_less_equal/.*$", r"^.*/dilation_rate$",
                                    r"^.*/Tensordot/concat$", r"^.*/Tensordot/concat/axis$")]
  # TF2's own artefact, as the original ignored TF1's: tf.custom_gradient (the training GELU and
  # LayerNorm, kernels.py) leaves an unused Identity of each result beside the IdentityN the
  # graph goes on with.
  overridden = {t.name for op in concrete.graph.get_operations() if op.type == "IdentityN"
                for t in op.inputs}
  unreachable = [op.name for op in _unreachable_ops(concrete.graph, concrete.graph.outputs)
                 if not any(r.match(op.name) for r in ignore)
                 and not (op.type == "Identity" and op.inputs[0].name in overridden)]
  assert not unreachable, f"The following ops are unreachable: {' '.join(unreachable)}"
  tester.check_output(tester.create_model())


def test_default():
  run_tester(BertModelTester())


def test_config_to_json_string():
  config = modeling.BertConfig(vocab_size=99, hidden_size=37)
  obj = json.loads(config.to_json_string())
  assert obj["vocab_size"] == 99
  assert obj["hidden_size"] == 37


# --- beyond the port --------------------------------------------------------------------------

def test_the_config_is_checked_when_a_model_is_built():
  # hidden_size 37 with 12 heads is a config the original's test makes and never builds.
  config = modeling.BertConfig(vocab_size=99, hidden_size=37)
  with pytest.raises(errors.InputError,
                     match="hidden_size 37 is not a multiple of num_attention_heads 12"):
    modeling.BertModel(config=config, is_training=False, input_ids=tf.ones([1, 3], tf.int32))


def test_the_root_module_is_the_package_plus_the_original_api():
  assert modeling.BertConfig is project_modeling.BertConfig
  assert modeling.Dense is project_modeling.Dense
  assert modeling.BertModel is not project_modeling.BertModel
  with pytest.raises(AttributeError, match="use bert_tf2.modeling.Encoder"):
    modeling.transformer_model  # pylint: disable=pointless-statement
  with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
    modeling.no_such_name  # pylint: disable=pointless-statement


def _tiny_config():
  return modeling.BertConfig.from_json_file(f"{TINY}/bert_config.json")


def _mrpc_features(max_seq_length=16, count=24):
  """Real sentence pairs (MRPC's first training examples) as the tiny checkpoint's vocab reads
  them: the project's features, the original's recipe."""
  processor = classifier_tasks.get_processor("mrpc")
  examples = processor.get_train_examples(f"{SHARED}/data/glue/MRPC")[:count]
  tokenizer = tokenization.FullTokenizer(TINY_VOCAB, do_lower_case=True)
  features = project_run_classifier.convert_examples_to_features(
      examples, processor.get_labels(), max_seq_length, tokenizer)
  return {name: tf.constant([getattr(f, name) for f in features], tf.int32)
          for name in ("input_ids", "input_mask", "segment_ids", "label_id")}


@requires_shared
def test_the_front_gives_the_project_models_outputs_with_the_same_weights():
  features = _mrpc_features()
  config = _tiny_config()
  front = modeling.BertModel(config=config, is_training=False, input_ids=features["input_ids"],
                             input_mask=features["input_mask"],
                             token_type_ids=features["segment_ids"])
  ours = project_modeling.BertModel(config)
  checkpoints.load_tf1_checkpoint(ours, TINY_CKPT)
  checkpoints.load_tf1_checkpoint(front.bert, TINY_CKPT)
  front = front(features["input_ids"], features["input_mask"], features["segment_ids"])
  outputs = ours(features["input_ids"], features["input_mask"], features["segment_ids"])
  pairs = [(front.get_embedding_output(), outputs["embedding_output"]),
           (front.get_sequence_output(), outputs["sequence_output"]),
           (front.get_pooled_output(), outputs["pooled_output"])]
  pairs += list(zip(front.get_all_encoder_layers(), outputs["encoder_outputs"]))
  for a, b in pairs:
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, rtol=0)
  np.testing.assert_array_equal(front.get_embedding_table().numpy(),
                                ours.embedding_table.numpy())
  # Not a copy: the front's model is the project's, its variables those of its `bert`.
  assert isinstance(front.bert, project_modeling.BertModel)
  assert {v.ref() for v in front.variables} == {v.ref() for v in front.bert.variables}
  assert len(front.variables) == len(front.bert.variables) == 39
  # Training mode: dropout (the config's 0.1) changes the outputs.
  training_front = front(features["input_ids"], features["input_mask"], features["segment_ids"],
                         is_training=True)
  assert not np.allclose(training_front.get_sequence_output(), outputs["sequence_output"])


@requires_shared
def test_a_google_checkpoint_restores_into_the_front_by_name():
  reader = tf.train.load_checkpoint(TINY_CKPT)
  ids = tf.constant([[2, 5, 6, 3, 0]])

  def fresh():
    return modeling.BertModel(config=_tiny_config(), is_training=False, input_ids=ids)

  def assert_restored(front):
    for v in front.variables:
      np.testing.assert_array_equal(v.numpy(), reader.get_tensor(v.name[:-2]), err_msg=v.name)

  names = {v.name[:-2] for v in fresh().variables}
  assert names == {n for n in reader.get_variable_to_shape_map() if n.startswith("bert/")
                   and not n.endswith(("/adam_m", "/adam_v"))}, "the original's names, every one"
  # 1. TF2's own tf.train.Checkpoint reads the original's name-based checkpoint by name.
  front = fresh()
  tf.train.Checkpoint(model=front).restore(TINY_CKPT)
  assert_restored(front)
  # 2. The project's loader.
  front = fresh()
  report = checkpoints.init_from_checkpoint(front, TINY_CKPT, require_all=True, log=False)
  assert len(report.loaded) == len(names)
  assert_restored(front)
  # 3. The original's recipe: an assignment map over the trainable variables, then the init.
  front = fresh()
  assignment_map, initialized = modeling.get_assignment_map_from_checkpoint(
      front.trainable_variables, TINY)
  assert set(assignment_map) == names and initialized["bert/pooler/dense/kernel:0"] == 1
  modeling.init_from_checkpoint(TINY, assignment_map)
  assert_restored(front)
  # Under another scope the names differ, as the original's did: nothing matches.
  other = modeling.BertModel(config=_tiny_config(), is_training=False, input_ids=ids,
                             scope="student")
  assert other.variables[0].name.startswith("student/embeddings/")
  assert modeling.get_assignment_map_from_checkpoint(other.trainable_variables, TINY)[0] == {}


class OriginalStyleClassifier(tf.Module):
  """A head written as the original's run_classifier.create_model writes it: the pooled output
  from the BertModel's getter, output_weights [labels, hidden], output_bias, dropout 0.1 while
  training. The front is built once from a first batch (TF1 built it in the model_fn's graph);
  each call runs it on the batch it is given."""

  def __init__(self, config, num_labels, first_batch):
    super().__init__(name="classifier")
    self.encoder = modeling.BertModel(
        config=config, is_training=False, input_ids=first_batch["input_ids"],
        input_mask=first_batch["input_mask"], token_type_ids=first_batch["segment_ids"])
    hidden = config.hidden_size
    self.output_weights = tf.Variable(
        modeling.create_initializer(0.02)([num_labels, hidden]), name="output_weights")
    self.output_bias = tf.Variable(tf.zeros([num_labels]), name="output_bias")

  def __call__(self, features, training=False, dropout_seed=None):
    del dropout_seed
    model = self.encoder(features["input_ids"], features["input_mask"], features["segment_ids"],
                         is_training=training)
    output_layer = model.get_pooled_output()
    if training:
      output_layer = modeling.dropout(output_layer, 0.1)
    logits = tf.matmul(output_layer, self.output_weights, transpose_b=True) + self.output_bias
    return {"logits": logits}


def _labelled_loss(features, outputs):
  per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=features["label_id"], logits=outputs["logits"])
  count = tf.cast(tf.size(per_example), tf.float32)
  return {"classification_loss": (tf.reduce_sum(per_example), count)}


@requires_shared
def test_a_head_on_the_front_trains_with_the_trainer_from_a_google_checkpoint(tmp_path):
  features = _mrpc_features()
  config = _tiny_config()
  model = OriginalStyleClassifier(config, 2, features)
  checkpoints.init_from_checkpoint(model, TINY_CKPT, log=False)
  reader = tf.train.load_checkpoint(TINY_CKPT)
  google = model.encoder.bert.pooler.dense.kernel.numpy()
  np.testing.assert_array_equal(google, reader.get_tensor("bert/pooler/dense/kernel"))

  def dataset_fn(ctx):
    del ctx
    return tf.data.Dataset.from_tensor_slices(features).repeat().batch(8, drop_remainder=True)

  tf.random.set_seed(1)
  optimizer = project_optimization.create_optimizer(1e-2, 40, 4)
  trainer = training.Trainer(tf.distribute.get_strategy(), model, _labelled_loss, optimizer,
                             output_dir=str(tmp_path / "out"))
  head = model.output_weights.numpy()
  trainer.train(dataset_fn, 40, save_checkpoints_steps=40, steps_per_loop=10)
  # Both the head and the encoder restored from Google's checkpoint were trained. (Whether it
  # learns is the next test's: this checkpoint, hidden size 4 and a 15-word vocabulary, reads
  # MRPC as [UNK]s.)
  assert not np.allclose(model.encoder.bert.pooler.dense.kernel.numpy(), google)
  assert not np.allclose(model.output_weights.numpy(), head)
  # The Trainer's checkpoint restores into a new model of the same code, outputs and all.
  other = OriginalStyleClassifier(config, 2, features)
  tf.train.Checkpoint(model=other).restore(
      tf.train.latest_checkpoint(str(tmp_path / "out"))).expect_partial()
  np.testing.assert_allclose(other(features)["logits"].numpy(), model(features)["logits"].numpy(),
                             atol=1e-6)


@requires_shared
def test_a_head_on_the_front_learns_sst2_with_the_trainer(tmp_path):
  """The same head and Trainer on 64 real SST-2 sentences with a vocabulary of their words and a
  small random encoder: it learns them (the training loss falls from ln 2 to a fraction of it)."""
  processor = classifier_tasks.get_processor("sst-2")
  examples = processor.get_train_examples(f"{SHARED}/data/glue/SST-2")[:64]
  basic = tokenization.BasicTokenizer(do_lower_case=True)
  words = sorted({w for e in examples for w in basic.tokenize(e.text_a)})
  vocab_file = tmp_path / "vocab.txt"
  vocab_file.write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words]))
  tokenizer = tokenization.FullTokenizer(str(vocab_file), do_lower_case=True)
  converted = project_run_classifier.convert_examples_to_features(
      examples, processor.get_labels(), 32, tokenizer)
  features = {name: tf.constant([getattr(f, name) for f in converted], tf.int32)
              for name in ("input_ids", "input_mask", "segment_ids", "label_id")}
  assert 0.3 < np.mean(features["label_id"]) < 0.7  # both labels, so ln 2 is where it starts
  config = modeling.BertConfig(vocab_size=len(words) + 4, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=64,
                               max_position_embeddings=32)
  tf.random.set_seed(3)
  model = OriginalStyleClassifier(config, 2, features)

  def dataset_fn(ctx):
    del ctx
    return tf.data.Dataset.from_tensor_slices(features).repeat().batch(16, drop_remainder=True)

  trainer = training.Trainer(tf.distribute.get_strategy(), model, _labelled_loss,
                             project_optimization.create_optimizer(2e-3, 80, 8))
  first = trainer.evaluate(dataset_fn, max_steps=4)["loss"]
  trainer.train(dataset_fn, 80, steps_per_loop=20)
  last = trainer.evaluate(dataset_fn, max_steps=4)["loss"]
  assert abs(first - np.log(2)) < 0.05 and last < 0.3 * first, (first, last)
