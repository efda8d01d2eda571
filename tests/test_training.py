"""The shared training loop: accumulation, non-finite losses, mixed precision, XLA."""

import logging as std_logging
import os
import re
import time

from absl import logging as absl_logging
import numpy as np
import pytest
import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import classifier_tasks
from bert_tf2 import devices
from bert_tf2 import fine_tuning
from bert_tf2 import input_pipeline
from bert_tf2 import modeling
from bert_tf2 import optimization
from bert_tf2 import tokenization
from bert_tf2 import training
from conftest import SHARED, minilm_dir, requires_shared

# bfloat16 as a parameter of a test whose bf16 case runs oneDNN's bf16 kernels in this process
# (skipped, saying why, where they would crash: conftest's onednn_bf16 marker).
BF16 = pytest.param(tf.bfloat16, marks=pytest.mark.onednn_bf16, id="bfloat16")

RECORDS = os.path.join(SHARED, "reference", "pretraining", "default.tfrecord")


def _config(**kw):
  d = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
           intermediate_size=64, max_position_embeddings=128, type_vocab_size=2,
           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  d.update(kw)
  return modeling.BertConfig(**d)


def _records(batch_size, poison=False):
  spec = input_pipeline.pretraining_features(128, 20)

  def dataset_fn(ctx):
    del ctx
    ds = tf.data.TFRecordDataset(RECORDS).take(64)
    ds = ds.map(lambda r: input_pipeline._decode(r, spec))  # pylint: disable=protected-access
    if poison:
      ds = ds.map(lambda f: dict(f, masked_lm_weights=f["masked_lm_weights"] * np.nan))
    return ds.repeat().batch(batch_size, drop_remainder=True)

  return dataset_fn


def _next_sentence_only(features, outputs):
  # Equal counts in every micro-batch: accumulation is then exactly one big batch.
  stats = modeling.pretraining_losses(features, outputs)
  return {"next_sentence_loss": stats["next_sentence_loss"]}


def _train(steps, accumulation, loss_fn, compute_dtype=tf.float32, use_xla=False, lr=1e-3):
  tf.random.set_seed(5)
  model = modeling.BertPretrainer(_config(), compute_dtype)
  optimizer = optimization.create_optimizer(lr, 100, 0)
  trainer = training.Trainer(tf.distribute.get_strategy(), model, loss_fn, optimizer,
                             gradient_accumulation_steps=accumulation, use_xla=use_xla)
  iterator = iter(trainer.distribute(_records(16 // accumulation), stack=accumulation))
  losses = [training.metrics_from_stats(trainer._train_loop(iterator, tf.constant(1)))["loss"]
            for _ in range(steps)]
  return model, np.array(losses)


def _assert_same(first, second, rtol, atol):
  """Two _train runs, (model, losses) each, took the same steps: the losses, then the variables."""
  np.testing.assert_allclose(second[1], first[1], rtol=rtol)
  for a, b in zip(first[0].variables, second[0].variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=atol, err_msg=a.name)


@pytest.mark.slow
@requires_shared
def test_gradient_accumulation_equals_one_big_batch():
  _assert_same(_train(3, 1, _next_sentence_only), _train(3, 2, _next_sentence_only), 1e-5, 2e-6)


def _nodes(graph):
  """Nodes of a traced graph and of every function of its library (each function once)."""
  graph_def = graph.as_graph_def()
  return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)


@pytest.mark.slow
@requires_shared
def test_a_loop_of_steps_holds_the_step_once_and_equals_steps_one_at_a_time():
  """_train_loop(n) takes n steps of the one traced step (a copy of the step written out twice,
  before and inside the loop, cost 150-250 MB of resident memory at BERT-base size): the same
  weights and mean loss as n calls of one step, one trace of the step across iterators. With
  gradient checkpointing, whose forward pass is written into the step itself."""
  def trainer():
    tf.random.set_seed(5)
    model = modeling.BertPretrainer(_config(), tf.float32)
    return model, training.Trainer(tf.distribute.get_strategy(), model, _next_sentence_only,
                                   optimization.create_optimizer(1e-3, 100, 0),
                                   gradient_checkpointing=True)

  model, looped = trainer()
  iterator = iter(looped.distribute(_records(8)))
  stats = looped._train_loop(iterator, tf.constant(3))
  assert int(looped.optimizer.iterations.numpy()) == 3
  after_three = [v.numpy() for v in model.variables]
  # A second iterator retraces the loop, not the step.
  looped._train_loop(iter(looped.distribute(_records(8))), tf.constant(1))
  assert looped._step.experimental_get_tracing_count() == 1
  loop_graph = looped._train_loop.get_concrete_function(iterator, tf.constant(1)).graph
  step_graph = looped._step.get_concrete_function(iterator.element_spec).graph
  # The loop's own nodes (the iterator, the counter, the totals) are a few dozen; the step's
  # are ~2,100 here (the step written out twice made the loop ~1,300 nodes more than the step).
  assert _nodes(step_graph) > 1000
  assert _nodes(loop_graph) < _nodes(step_graph) + 100, (_nodes(loop_graph), _nodes(step_graph))

  other_model, single = trainer()
  iterator = iter(single.distribute(_records(8)))
  losses = [training.metrics_from_stats(single._train_loop(iterator, tf.constant(1)))["loss"]
            for _ in range(3)]
  assert training.metrics_from_stats(stats)["loss"] == pytest.approx(np.mean(losses), rel=1e-5)
  for a, b in zip(after_three, other_model.variables):
    np.testing.assert_allclose(a, b.numpy(), atol=2e-6, err_msg=b.name)


@pytest.mark.slow
@requires_shared
@pytest.mark.parametrize("dtype", [BF16, tf.float16])
def test_mixed_precision_training_tracks_float32(dtype):
  _, ref = _train(4, 1, modeling.pretraining_losses)
  _, low = _train(4, 1, modeling.pretraining_losses, compute_dtype=dtype)
  np.testing.assert_allclose(low, ref, rtol=0.02)


@pytest.mark.slow
@requires_shared
def test_xla_gives_the_same_steps():
  _assert_same(_train(3, 1, modeling.pretraining_losses),
               _train(3, 1, modeling.pretraining_losses, use_xla=True), 1e-5, 1e-5)


@pytest.mark.slow
@requires_shared
@pytest.mark.parametrize("dtype", [BF16, tf.float16])
def test_xla_with_mixed_precision_gives_the_same_steps(dtype):
  # The GPU recipe (--use_xla with --mixed_precision), exercised on CPU: the same compiled step
  # as without XLA, up to the low-precision round-off the two compilers order differently.
  _, plain = _train(3, 1, modeling.pretraining_losses, compute_dtype=dtype)
  _, xla = _train(3, 1, modeling.pretraining_losses, compute_dtype=dtype, use_xla=True)
  np.testing.assert_allclose(xla, plain, rtol=0.01)


def _copies_trainer(model, accumulation=1, copies=True, use_xla=False, **kwargs):
  trainer = training.Trainer(tf.distribute.get_strategy(), model, modeling.pretraining_losses,
                             optimization.create_optimizer(1e-3, 100, 0, **kwargs),
                             gradient_accumulation_steps=accumulation, use_xla=use_xla)
  if not copies:
    trainer.copies = None  # (before the first trace: every cast made at its use, as before)
  return trainer


def _loop(trainer, steps, batch_size=16, one_batch=False):
  dataset_fn = _records(batch_size // trainer.accumulation)
  if one_batch:  # the same batch at every step
    dataset_fn = lambda ctx, f=dataset_fn: f(ctx).take(1).repeat()
  iterator = iter(trainer.distribute(dataset_fn, stack=trainer.accumulation))
  return training.metrics_from_stats(trainer._train_loop(iterator, tf.constant(steps)))


@pytest.mark.slow
@requires_shared
@pytest.mark.parametrize("dtype,accumulation", [
    pytest.param(tf.bfloat16, 1, marks=pytest.mark.onednn_bf16), (tf.float16, 1),
    pytest.param(tf.bfloat16, 2, marks=pytest.mark.onednn_bf16)])
def test_weight_copies_take_the_steps_of_casting_at_every_use(dtype, accumulation):
  """A bf16 / fp16 model trains on weight copies the optimizer writes (weight_copies), with the
  gradients of the copies handed to the update uncast: bit for bit the steps of casting every
  float32 weight at each use, on the real records (masked LM and NSP: the tied word embeddings
  take a float32 gradient from their gather and a bf16 one from the output matrix), with
  gradient accumulation summing in float32. After the steps each copy is its weight rounded."""
  runs = []
  for copies in (False, True):
    tf.random.set_seed(5)
    model = modeling.BertPretrainer(_config(hidden_dropout_prob=0.1), dtype)
    trainer = _copies_trainer(model, accumulation, copies)
    runs.append((_loop(trainer, 3), model, trainer))
  (plain, plain_model, _), (copied, model, trainer) = runs
  assert copied["applied_steps"] == 1.0
  if accumulation == 1:
    assert copied == plain
    for a, b in zip(plain_model.variables, model.variables):
      np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
  else:  # the micro-batches' sums: an ulp here and there (9e-10 at most, seen)
    assert copied == pytest.approx(plain, rel=1e-6)
    for a, b in zip(plain_model.variables, model.variables):
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-8, err_msg=a.name)
  # Every matrix and bias the encoder and heads read in the compute dtype has a copy (the 6
  # Dense layers of each of the 2 layers, kernel and bias, the pooler's, the masked-LM
  # transform's, the tied word embeddings, the NSP output), and none of LayerNorm's or the other
  # embeddings'.
  copied_names = {v.name for v in trainer.variables if trainer.copies.copy_of(v) is not None}
  assert len(copied_names) == 2 * 12 + 2 + 2 + 1 + 1, sorted(copied_names)
  assert {"bert/embeddings/word_embeddings:0", "cls/seq_relationship/output_weights:0"} <= (
      copied_names)
  assert not any("LayerNorm" in n or "position_embeddings" in n for n in copied_names)
  for v in trainer.variables:
    if trainer.copies.copy_of(v) is not None:
      np.testing.assert_array_equal(trainer.copies.copy_of(v).numpy(),
                                    tf.cast(v, dtype).numpy(), err_msg=v.name)


@pytest.mark.slow
@requires_shared
@pytest.mark.onednn_bf16
def test_weight_copies_follow_weights_changed_between_loops():
  """Weights changed outside the training loop (a restored checkpoint, an assignment) are what the
  next loop's steps read: its loss is that of a fresh trainer on those weights."""
  tf.random.set_seed(5)
  model = modeling.BertPretrainer(_config(), tf.bfloat16)
  trainer = _copies_trainer(model)
  _loop(trainer, 1, one_batch=True)
  tf.random.set_seed(6)
  other = modeling.BertPretrainer(_config(), tf.bfloat16)
  for mine, theirs in zip(model.variables, other.variables):
    mine.assign(theirs)
  after_change = _loop(trainer, 1, one_batch=True)["loss"]
  fresh = _loop(_copies_trainer(other, copies=False), 1, one_batch=True)["loss"]
  assert after_change == fresh
  assert after_change != pytest.approx(_loop(trainer, 1, one_batch=True)["loss"], rel=1e-6)


@requires_shared
def test_word_embedding_gradient_adds_the_gathered_rows_into_the_dense_part_exactly():
  # A real batch's token ids (64 sequences: [PAD], [CLS], [SEP] and common words many times
  # over), the word embeddings' two gradient parts as a bf16 pre-training step has them: the
  # gather's rows (float32) and the tied output matrix's dense gradient (the copy's bfloat16).
  ids = next(iter(_records(64)(None)))["input_ids"]
  ids = tf.reshape(tf.cast(ids, tf.int32), [-1])
  assert tf.size(tf.unique(ids)[0]) < tf.size(ids) // 2
  rows = tf.IndexedSlices(tf.random.stateless_normal([tf.size(ids), 48], [1, 2]), ids,
                          tf.constant([30522, 48]))
  dense = tf.cast(tf.random.stateless_normal([30522, 48], [3, 4], stddev=1e-3), tf.bfloat16)
  before = tf.add_n([tf.cast(tf.convert_to_tensor(p), tf.float32) for p in (rows, dense)])
  summed = tf.function(training._float32_sum)  # pylint: disable=protected-access
  np.testing.assert_array_equal(summed([rows, dense]).numpy(), before.numpy())
  np.testing.assert_array_equal(summed([dense, rows]).numpy(), before.numpy())
  # Rows alone, or dense parts alone: their float32 sum as before.
  np.testing.assert_array_equal(summed([rows]).numpy(), tf.convert_to_tensor(rows).numpy())
  np.testing.assert_array_equal(summed([dense, dense]).numpy(),
                                (2 * tf.cast(dense, tf.float32)).numpy())


def test_no_weight_copies_for_float32_nor_under_gradient_checkpointing():
  for dtype, checkpointed in ((tf.float32, False), (tf.bfloat16, True)):
    trainer = training.Trainer(
        tf.distribute.get_strategy(), modeling.BertPretrainer(_config(), dtype),
        modeling.pretraining_losses, optimization.create_optimizer(1e-3, 100, 0),
        gradient_checkpointing=checkpointed)
    assert trainer.copies is None


@pytest.mark.slow
@requires_shared
def test_nonfinite_losses_are_skipped_then_stop_training_with_the_checkpoint_intact(tmp_path):
  tf.random.set_seed(5)
  model = modeling.BertPretrainer(_config())
  optimizer = optimization.create_optimizer(1e-3, 100, 0)
  trainer = training.Trainer(tf.distribute.get_strategy(), model, modeling.pretraining_losses,
                             optimizer, output_dir=str(tmp_path))
  trainer.train(_records(8), num_train_steps=2, save_checkpoints_steps=2, steps_per_loop=2)
  saved = {v.name: v.numpy() for v in model.variables}
  with pytest.raises(training.TrainingError, match="non-finite for 3 consecutive loops"):
    trainer.train(_records(8, poison=True), num_train_steps=10, save_checkpoints_steps=2,
                  steps_per_loop=2, max_nonfinite_loops=3)
  assert int(optimizer.iterations.numpy()) == 2  # every poisoned step was skipped
  for v in model.variables:
    np.testing.assert_array_equal(v.numpy(), saved[v.name])
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")


def test_batch_size_must_divide_over_replicas_and_accumulation():
  with pytest.raises(training.fileio.InputError,
                     match=r"--train_batch_size=30 is not divisible by 1 replicas x 4"):
    training.per_replica_batch_size(30, tf.distribute.get_strategy(), "train_batch_size", 4)
  assert training.per_replica_batch_size(32, tf.distribute.get_strategy(), "x", 4) == 8


def test_evaluating_with_no_checkpoint_nor_init_is_an_error(tmp_path):
  model = modeling.BertPretrainer(_config())
  optimizer = optimization.create_optimizer(1e-3, 100, 0)
  trainer = training.Trainer(tf.distribute.get_strategy(), model, modeling.pretraining_losses,
                             optimizer, output_dir=str(tmp_path / "out"))
  assert (tmp_path / "out" / ".lock").exists()  # the directory is this process's until it ends
  with pytest.raises(training.fileio.InputError,
                     match=rf"nothing to evaluate: --output_dir={tmp_path / 'out'} holds no "):
    trainer.restore_or_initialize()
  assert trainer.restore_or_initialize(for_training=True) == 0  # training from scratch is fine
  called = []
  other = training.Trainer(tf.distribute.get_strategy(), model, modeling.pretraining_losses,
                           optimizer, output_dir=str(tmp_path / "out"))  # same process: no refusal
  assert other.restore_or_initialize(lambda: called.append(1)) == 0 and called == [1]


def _mrpc_records(tmp_path, count=64):
  from conftest import import_script  # pylint: disable=g-import-not-at-top
  from bert_tf2 import tokenization  # pylint: disable=g-import-not-at-top
  run_classifier = import_script("run_classifier")
  processor = classifier_tasks.get_processor("mrpc")
  examples = processor.get_train_examples(os.path.join(SHARED, "data", "glue", "MRPC"))[:count]
  tokenizer = tokenization.FullTokenizer(
      os.path.join(SHARED, "reference", "pretraining", "vocab_uncased.txt"), True)
  path = str(tmp_path / "train.tf_record")
  run_classifier.file_based_convert_examples_to_features(examples, processor.get_labels(), 128,
                                                         tokenizer, path)
  return run_classifier, path


def _train_classifier(run_classifier, path, pad_to_longest, accumulation, head_dropout,
                      steps=3):
  tf.random.set_seed(5)
  model = modeling.BertClassifier(_config(), 2, head_dropout=head_dropout)
  optimizer = optimization.create_optimizer(1e-3, 100, 0)
  trainer = training.Trainer(tf.distribute.get_strategy(), model,
                             modeling.classifier_losses(False), optimizer,
                             gradient_accumulation_steps=accumulation)
  input_fn = fine_tuning.input_fn_builder(path, run_classifier.feature_spec(128), is_training=True,
                                          seed=3, pad_to_longest=pad_to_longest)
  iterator = iter(trainer.distribute(lambda ctx: input_fn(16 // accumulation, ctx),
                                     stack=accumulation))
  losses = [training.metrics_from_stats(trainer._train_loop(iterator, tf.constant(1)))["loss"]
            for _ in range(steps)]
  return model, np.array(losses)


@pytest.mark.slow
@requires_shared
def test_dynamic_padding_trains_as_full_length(tmp_path):
  """Classifier steps on real MRPC pairs with batches cut to their longest pair are the
  full-length steps: with the classifier's dropout (its mask is per example, so the same), and
  with gradient accumulation, whose micro-batches of different lengths are stacked (without
  dropout: two micro-batches draw other masks than one batch, by design)."""
  run_classifier, path = _mrpc_records(tmp_path)
  for accumulation, head_dropout in ((1, 0.1), (2, 0.0)):
    _assert_same(_train_classifier(run_classifier, path, False, 1, head_dropout),
                 _train_classifier(run_classifier, path, True, accumulation, head_dropout),
                 1e-5, 2e-6)


def _minilm_classifier(compute_dtype):
  """The real MiniLM checkpoint under a 3-label classifier head."""
  path = minilm_dir()
  config = modeling.BertConfig.from_json_file(os.path.join(path, "config.json"))
  tf.random.set_seed(3)
  model = modeling.BertClassifier(config, 3, compute_dtype)
  checkpoints.init_from_checkpoint(model.bert, path, require_all=True)
  return model


def _mrpc_features(count=24):
  """Token ids of real MRPC dev pairs (MiniLM's vocab), padded to the longest."""
  tokenizer = tokenization.FullTokenizer(os.path.join(minilm_dir(), "vocab.txt"), True)
  with open(os.path.join(SHARED, "data", "glue", "MRPC", "dev.tsv"), encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f][1:count + 1]
  ids = [tokenizer.convert_tokens_to_ids(["[CLS]", *tokenizer.tokenize(a), "[SEP]",
                                          *tokenizer.tokenize(b), "[SEP]"])
         for *_, a, b in rows]
  seq = max(map(len, ids))
  features = {"input_ids": np.zeros([count, seq], np.int32),
              "input_mask": np.zeros([count, seq], np.int32),
              "segment_ids": np.zeros([count, seq], np.int32)}
  for i, row in enumerate(ids):
    features["input_ids"][i, :len(row)] = row
    features["input_mask"][i, :len(row)] = 1
    sep = row.index(tokenizer.vocab["[SEP]"])
    features["segment_ids"][i, sep + 1:len(row)] = 1
  return features


@pytest.mark.slow
@requires_shared
@pytest.mark.parametrize("compute_dtype", [tf.float32, BF16])
def test_weights_cast_once_give_the_outputs_of_casting_at_every_call(compute_dtype):
  """Inference takes the model's weights cast (and the attention's fused) once, by
  modeling.cast_weights / InferenceWeights: the logits of real MRPC pairs through the real MiniLM
  are bit-identical to the model's own call, and the supplied copies are what the model reads
  (other values change the logits)."""
  model = _minilm_classifier(compute_dtype)
  features = _mrpc_features()
  plain = tf.function(lambda f: model(f)["logits"])(features).numpy()

  @tf.function
  def precast(f, weights):
    inference_weights = modeling.InferenceWeights(model, weights, bf16_softmax=False,
                                                  transposed=transposed)
    return model(f, inference_weights=inference_weights)["logits"]

  transposed = compute_dtype == tf.bfloat16  # as on an AMX CPU (devices.amx_matmul)
  weights = modeling.cast_weights(model, transposed)
  # bf16: every matrix and bias of the 6 layers and the pooler, plus each layer's fused query/key/
  # value and key/value (the classifier's last layer runs its queries at [CLS] only); float32:
  # the fused ones alone (the casts are no-ops).
  assert len(weights) == (6 * 16 + 2 if compute_dtype == tf.bfloat16 else 6 * 4)
  assert all(w.dtype == compute_dtype for w in weights)
  # Asked to, bf16 matrices are stored [out, in] (read with transpose_b, oneDNN's faster layout
  # on AMX), float32 ones always in the checkpoint's [in, out]: MiniLM's fused query/key/value is
  # 384 -> 1152, its feed-forward 384 -> 1536 -> 384.
  matrices = {tuple(w.shape) for w in weights if w.shape.rank == 2}
  if transposed:
    assert {(1152, 384), (768, 384), (1536, 384), (384, 1536)} <= matrices
    assert not {(384, 1152), (384, 768)} & matrices
  else:
    assert matrices == {(384, 1152), (384, 768)}
  np.testing.assert_array_equal(precast(features, weights).numpy(), plain)
  if transposed:  # the checkpoint's layout, asked for: the same logits
    @tf.function
    def untransposed(f, weights):
      return model(f, inference_weights=modeling.InferenceWeights(
          model, weights, bf16_softmax=False))["logits"]
    in_out = modeling.cast_weights(model)
    assert (384, 1152) in {tuple(w.shape) for w in in_out}
    np.testing.assert_array_equal(untransposed(features, in_out).numpy(), plain)
  halved = [w * tf.constant(0.5, w.dtype) for w in weights]
  assert np.abs(precast(features, halved).numpy() - plain).max() > 1e-2
  if compute_dtype == tf.bfloat16:  # the attention's softmax in bfloat16 too: within bf16 noise
    @tf.function
    def bf16_softmax(f, weights):
      return model(f, inference_weights=modeling.InferenceWeights(
          model, weights, transposed=transposed))["logits"]
    np.testing.assert_allclose(bf16_softmax(features, weights).numpy(), plain, atol=2e-3)
  # LayerNorm as oneDNN's kernel (kernels.layer_norm; the Trainer's choice where TensorFlow runs
  # oneDNN): float32 logits within float32 noise, bfloat16 ones within bf16 noise (gamma and
  # beta rounded to bfloat16 there).
  @tf.function
  def onednn_layer_norm(f, weights):
    return model(f, inference_weights=modeling.InferenceWeights(
        model, weights, bf16_softmax=False, transposed=transposed,
        onednn_layer_norm=True))["logits"]
  onednn = onednn_layer_norm(features, weights).numpy()
  np.testing.assert_allclose(onednn, plain, atol=1e-5 if compute_dtype == tf.float32 else 3e-2)
  if compute_dtype == tf.bfloat16:
    assert (onednn != plain).any()  # (the form was taken: gamma rounded)
  # Nothing is left behind: a new trace without the argument casts the variables again.
  np.testing.assert_array_equal(tf.function(lambda f: model(f)["logits"])(features).numpy(), plain)


def test_trainer_takes_onednn_layer_norm_where_tensorflow_runs_onednn_and_not_under_xla():
  model = modeling.BertModel(modeling.BertConfig(
      vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=16, max_position_embeddings=16))
  strategy = tf.distribute.get_strategy()
  assert training.Trainer(strategy, model, None)._onednn_layer_norm == devices.onednn_cpu()  # pylint: disable=protected-access
  assert not training.Trainer(strategy, model, None, use_xla=True)._onednn_layer_norm  # pylint: disable=protected-access


@pytest.mark.slow
@requires_shared
@pytest.mark.parametrize("compute_dtype,atol", [
    (tf.float32, 1e-5), pytest.param(tf.bfloat16, 2e-3, marks=pytest.mark.onednn_bf16)])
def test_predict_and_evaluate_read_the_weights_of_the_moment(compute_dtype, atol):
  """Trainer.predict / evaluate cast the weights at each call, not once for the model's life:
  after the weights change (training between evaluations), both see the new ones. (The value
  projections changed are in the fused query / key / value copies in both dtypes.)"""
  model = _minilm_classifier(compute_dtype)
  features = _mrpc_features()
  labels = np.arange(len(features["input_ids"])) % 3
  trainer = training.Trainer(tf.distribute.get_strategy(), model,
                             modeling.classifier_losses(False))

  def dataset_fn(ctx):
    del ctx
    return tf.data.Dataset.from_tensor_slices(
        dict(features, label_ids=labels, is_real_example=np.ones_like(labels))).batch(8)

  before = None
  for scale in (1.0, 0.5):
    for layer in model.bert.encoder.layers:
      value = layer.attention.self_attention.value
      value.kernel.assign(value.kernel * scale)
    want = tf.function(lambda f: model(f)["logits"])(features).numpy()
    got = np.concatenate([b["logits"] for b in trainer.predict(dataset_fn, ["logits"])])
    np.testing.assert_allclose(got, want, atol=atol)
    loss = -np.mean(tf.nn.log_softmax(want).numpy()[np.arange(len(labels)), labels])
    np.testing.assert_allclose(trainer.evaluate(dataset_fn)["loss"], loss, atol=atol)
    if before is not None:
      assert np.abs(got - before).max() > 10 * atol
    before = got


@pytest.mark.slow
@requires_shared
@pytest.mark.parametrize("batch_size", [7, 8])
def test_predict_and_evaluate_in_streams_give_each_example_its_own_outputs(batch_size):
  """Trainer.predict and evaluate split a batch into independent parts (two on a CPU of several
  cores): every example's outputs, loss and accuracy are those of the whole batch run at once,
  for odd batches (7: parts of 4 and 3) and batches the pipeline cuts to their longest sequence
  (real MRPC pairs, the packaged MiniLM); in input order, each row its own (rows would be
  swapped if the parts were put back in the wrong order)."""
  model = _minilm_classifier(tf.float32)
  features = _mrpc_features(22)  # 22 = 3 x 7 + 1, 2 x 8 + 6
  labels = np.arange(22) % 3

  def dataset_fn(ctx):
    del ctx
    return tf.data.Dataset.from_tensor_slices(
        dict(features, label_ids=labels, is_real_example=np.ones_like(labels))).batch(
            batch_size).map(lambda batch: input_pipeline.trim_to_longest(batch, 8))

  want = tf.function(lambda f: model(f)["logits"])(features).numpy()
  log_probs = tf.nn.log_softmax(want).numpy()[np.arange(22), labels]
  accuracy = np.mean(np.argmax(want, -1) == labels)
  for streams in (1, 2, 3):
    traced = _TracedBatches(model)
    trainer = training.Trainer(tf.distribute.get_strategy(), traced,
                               modeling.classifier_losses(False), predict_streams=streams)
    # evaluate() adds the parts' sums and counts: the whole data's mean loss and accuracy.
    metrics = trainer.evaluate(dataset_fn)
    np.testing.assert_allclose(metrics["loss"], -np.mean(log_probs), atol=1e-5)
    assert metrics["accuracy"] == pytest.approx(accuracy)
    batches = list(trainer.predict(dataset_fn, ["logits"]))
    got = np.concatenate([b["logits"] for b in batches])
    # It did split: the model ran on parts of the batch.
    assert max(b for b in traced.batches if b) == -(-batch_size // streams), (
        streams, traced.batches)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_array_equal(np.concatenate([b["input_ids"][:, :5] for b in batches]),
                                  features["input_ids"][:, :5])
    # Rows differ, so a swap would show.
    assert np.abs(want[1:] - want[:-1]).max(axis=1).min() > 1e-3


class _TracedBatches(tf.Module):
  """A model wrapper that records the batch sizes it is traced with (the parts it is run on)."""

  def __init__(self, model):
    super().__init__()
    self.model = model
    self.traced = []

  @property
  def batches(self):
    return set(self.traced)

  def __call__(self, features, training=False, dropout_seed=None, inference_weights=None):
    self.traced.append(features["input_ids"].shape[0])
    return self.model(features, training=training, dropout_seed=dropout_seed,
                      inference_weights=inference_weights)


@pytest.mark.slow
@pytest.mark.parametrize("use_xla", [False, True])
def test_span_and_token_models_predict_and_evaluate_odd_batches_in_streams(use_xla):
  """SQuAD's and NER's models (whose outputs also hold the list of every layer's output, which
  cannot be put back along the batch) on batches of 7 rows at full length, as with --use_xla or
  --nodynamic_padding: the batch runs as parts of 3, 2 and 2 rows (three streams) or 4 and 3
  (two), the last batch of 1 whole (its trace, for any batch size, does not split), and every
  row's logits, loss and accuracy are those of the whole batch at once."""
  tf.random.set_seed(2)
  rng = np.random.default_rng(0)
  seq, count = 24, 15  # 15 = 2 x 7 + 1
  lengths = rng.integers(5, seq + 1, count)
  mask = (np.arange(seq) < lengths[:, None]).astype(np.int32)
  features = {"input_ids": rng.integers(1, 1000, (count, seq)).astype(np.int32) * mask,
              "input_mask": mask, "segment_ids": np.zeros_like(mask),
              "start_positions": rng.integers(0, 5, count).astype(np.int32),
              "end_positions": rng.integers(0, 5, count).astype(np.int32),
              "label_ids": rng.integers(0, 3, (count, seq)).astype(np.int32),
              "label_weights": mask.astype(np.float32)}

  def dataset_fn(ctx):
    del ctx
    return tf.data.Dataset.from_tensor_slices(features).batch(7)

  cases = [(modeling.BertSpanLabeler(_config(vocab_size=1000)), modeling.squad_losses,
            ["start_logits", "end_logits"]),
           (modeling.BertTokenClassifier(_config(vocab_size=1000), 3, head_dropout=0.0),
            modeling.ner_losses, ["logits"])]
  for model, loss_fn, keys in cases:
    whole = tf.function(model)(features)
    want = {k: whole[k].numpy() for k in keys}
    want_stats = training.metrics_from_stats(loss_fn(features, whole))
    # (The last batch, of 1 row, makes the step generalise its trace to any batch size, which
    # runs whole: None.)
    for streams, parts in ((1, {7, None}), (2, {4, 3, None}), (3, {3, 2, None})):
      traced = _TracedBatches(model)
      trainer = training.Trainer(tf.distribute.get_strategy(), traced, loss_fn,
                                 use_xla=use_xla, predict_streams=streams)
      batches = list(trainer.predict(dataset_fn, keys))
      for k in keys:
        np.testing.assert_allclose(np.concatenate([b[k] for b in batches]), want[k], atol=1e-5)
      stats = trainer.evaluate(dataset_fn)
      for k, v in want_stats.items():
        np.testing.assert_allclose(stats[k], v, atol=1e-5, err_msg=k)
      assert traced.batches == parts, (streams, traced.batches)


def test_prediction_streams_only_where_one_replica_runs_on_a_cpu_of_several_cores():
  cores = len(os.sched_getaffinity(0))
  default = tf.distribute.get_strategy()
  if tf.config.list_logical_devices("GPU"):
    assert devices.prediction_streams(default) == 1
  else:
    assert devices.prediction_streams(default) == (2 if cores >= 2 else 1)
  assert training.Trainer(default, modeling.BertModel(_config()), None).predict_streams == (
      devices.prediction_streams(default))

  class TwoReplicas:  # mirrored over two devices: they already run side by side
    num_replicas_in_sync = 2
  assert devices.prediction_streams(TwoReplicas()) == 1


@requires_shared
@pytest.mark.slow
def test_progress_comes_at_the_first_step_and_then_by_the_clock():
  """A user sees a line as soon as the first step has run, then every `log_every_seconds`
  whatever --iterations_per_loop is (100 steps of a large model were minutes of silence); the
  loops still end at its multiples. Without the clock: the first step, then each full loop."""
  tf.random.set_seed(3)
  # The lines are caught on absl's own logger at INFO (other tests change its level and
  # propagation, so pytest's caplog alone saw nothing in the whole suite).
  messages = []
  handler = std_logging.Handler(std_logging.INFO)
  handler.emit = lambda record: messages.append(record.getMessage())
  logger = absl_logging.get_absl_logger()
  verbosity = absl_logging.get_verbosity()

  def logged_steps(**kw):
    model = modeling.BertPretrainer(_config())
    trainer = training.Trainer(tf.distribute.get_strategy(), model, modeling.pretraining_losses,
                               optimization.create_optimizer(1e-3, 100, 0))
    messages.clear()
    absl_logging.set_verbosity(absl_logging.INFO)
    logger.addHandler(handler)
    try:
      trainer.train(_records(8), num_train_steps=30, save_checkpoints_steps=1000, **kw)
    finally:
      logger.removeHandler(handler)
      absl_logging.set_verbosity(verbosity)
    return [int(m.group(1)) for m in re.finditer(r"step (\d+)/30 ", "\n".join(messages))]

  assert logged_steps(steps_per_loop=20, log_every_seconds=None) == [1, 20, 30]
  # One step, then loops sized by the clock from the start: the second by the first one's time
  # (it traced; a fixed 10 steps there were minutes of silence on a large model), then 1 a loop.
  steps = logged_steps(steps_per_loop=1000, log_every_seconds=1e-6)
  assert steps == list(range(1, 31))
  steps = logged_steps(steps_per_loop=1000, log_every_seconds=0.2)
  assert steps[0] == 1 and steps[-1] == 30 and 3 <= len(steps) < 30, steps


@requires_shared
def test_the_eta_counts_from_the_end_of_the_first_step_which_compiles():
  """The first line says "ETA estimating" (its step is mostly tracing and compiling); later ones
  estimate at the rate since: at step 10 of 30 the ETA is about 20 steps, well under the first
  step's time (at the old rate since the start it was twice that time)."""
  tf.random.set_seed(3)
  lines = []
  handler = std_logging.Handler(std_logging.INFO)
  handler.emit = lambda record: lines.append((time.time(), record.getMessage()))
  logger = absl_logging.get_absl_logger()
  verbosity = absl_logging.get_verbosity()
  model = modeling.BertPretrainer(_config())
  trainer = training.Trainer(tf.distribute.get_strategy(), model, modeling.pretraining_losses,
                             optimization.create_optimizer(1e-3, 100, 0))
  absl_logging.set_verbosity(absl_logging.INFO)
  logger.addHandler(handler)
  started = time.time()
  try:
    trainer.train(_records(8), num_train_steps=30, save_checkpoints_steps=1000,
                  steps_per_loop=10, log_every_seconds=None)
  finally:
    logger.removeHandler(handler)
    absl_logging.set_verbosity(verbosity)
  progress = [(t, m) for t, m in lines if re.match(r"step \d+/30 ", m)]
  assert [m.split("/")[0] for _, m in progress] == ["step 1", "step 10", "step 20", "step 30"]
  assert progress[0][1].endswith("ETA estimating"), progress[0][1]
  first_step_seconds = progress[0][0] - started
  h, m, sec = map(int, re.search(r"ETA (\d+):(\d\d):(\d\d)", progress[1][1]).groups())
  assert h * 3600 + m * 60 + sec < first_step_seconds, (progress[1][1], first_step_seconds)


def test_eval_results_are_tensorboard_scalars_too(tmp_path):
  """eval_results.txt as the original wrote it, and its numbers in TensorBoard (eval/ beside the
  file, at global_step), so a run's dev scores show next to its training curves."""
  from bert_tf2 import quickstart  # pylint: disable=g-import-not-at-top
  training.write_eval_results(str(tmp_path / "eval_results.txt"),
                              {"eval_accuracy": 0.75, "eval_loss": 0.5, "global_step": 12})
  assert (tmp_path / "eval_results.txt").read_text() == (
      "eval_accuracy = 0.75\neval_loss = 0.5\nglobal_step = 12\n")
  assert quickstart.read_scalars(str(tmp_path / "eval"), "eval_accuracy") == [(12, 0.75)]
  assert quickstart.read_scalars(str(tmp_path / "eval"), "eval_loss") == [(12, 0.5)]
  assert quickstart.read_scalars(str(tmp_path / "eval"), "global_step") == []
