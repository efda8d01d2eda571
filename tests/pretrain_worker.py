"""Test helper process: a few pre-training steps under a given strategy; saves losses + weights,
and the trained model's evaluation metrics and predictions.

Run as `python tests/pretrain_worker.py STRATEGY OUT.npz [DTYPE]` (multi_worker_mirrored reads
TF_CONFIG; DTYPE the compute dtype, float32 by default).
The data order is fixed (no shuffling) and dropout is off, so every strategy sees the same global
batches and should take the same steps: tests/test_run_pretraining.py compares them.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

RECORDS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "shared", "reference", "pretraining", "default.tfrecord")
GLOBAL_BATCH, STEPS = 16, 4


def main(strategy_name, out, dtype="float32"):
  if strategy_name == "mirrored":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  elif strategy_name == "multi_worker_mirrored":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
  else:
    strategy = tf.distribute.get_strategy()
  from bert_tf2 import input_pipeline  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling
  from bert_tf2 import optimization
  from bert_tf2 import training
  tf.random.set_seed(7)
  config = modeling.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64,
                               max_position_embeddings=128, type_vocab_size=2,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  with strategy.scope():
    model = modeling.BertPretrainer(config, tf.as_dtype(dtype))
    optimizer = optimization.create_optimizer(1e-3, 100, 0)
  trainer = training.Trainer(strategy, model, modeling.pretraining_losses, optimizer)
  per_replica = GLOBAL_BATCH // strategy.num_replicas_in_sync
  spec = input_pipeline.pretraining_features(128, 20)

  def dataset_fn(ctx):
    # Step g uses records [16g, 16g+16) under every strategy: one device takes them as one
    # batch; mirrored hands consecutive per-replica batches of 8 to its two replicas; two workers
    # each read every other record (shard), 8 of them per step.
    ds = tf.data.TFRecordDataset(RECORDS).take(GLOBAL_BATCH * STEPS)
    ds = ds.map(lambda r: input_pipeline._decode(r, spec))  # pylint: disable=protected-access
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.batch(per_replica, drop_remainder=True)

  iterator = iter(trainer.distribute(dataset_fn))
  losses = []
  for _ in range(STEPS):
    stats = trainer._train_loop(iterator, tf.constant(1))  # pylint: disable=protected-access
    losses.append(training.metrics_from_stats(stats)["loss"])
  results = {"losses": np.array(losses)}
  if trainer.copies is not None:
    # The weight copies every replica read: each its own variable's, rounded, after the steps.
    results["copies_off_by"] = np.array(max(
        float(np.max(np.abs(c.numpy().astype(np.float32)
                            - tf.cast(v, c.dtype).numpy().astype(np.float32))))
        for variable in trainer.variables if trainer.copies.copy_of(variable) is not None
        for c, v in zip(strategy.experimental_local_results(trainer.copies.copy_of(variable)),
                        strategy.experimental_local_results(variable))))
  # The trained model on the same records: metrics over all of them, and per-record outputs in
  # record order (several replicas' and workers' results gathered). Prediction batches are cut
  # to their longest sequence, each replica's to its own, as the fine-tuning scripts' are.
  metrics = trainer.evaluate(dataset_fn)
  results["eval"] = np.array([metrics[k] for k in sorted(metrics)])
  predictions = list(trainer.predict(lambda ctx: predict_fn(ctx, dataset_fn),
                                     ["next_sentence_log_probs"]))
  results["predict.next_sentence_log_probs"] = np.concatenate(
      [p["next_sentence_log_probs"] for p in predictions])
  results["predict.input_ids"] = np.concatenate(
      [np.pad(p["input_ids"], [(0, 0), (0, 128 - p["input_ids"].shape[1])]) for p in predictions])
  results["predict.lengths"] = np.array([p["input_ids"].shape[1] for p in predictions])
  results["chief"] = np.array(trainer.is_chief)
  np.savez(out, **results,
           **{v.name.split(":")[0].replace("/", "."): v.numpy() for v in model.variables})


def predict_fn(ctx, dataset_fn):
  """dataset_fn's records with record i cut to cut_length(i) tokens, in batches cut to their
  longest record: the replicas' batches differ in length."""
  from bert_tf2 import input_pipeline  # pylint: disable=g-import-not-at-top
  ids = tf.data.Dataset.range(GLOBAL_BATCH * STEPS).shard(ctx.num_input_pipelines,
                                                          ctx.input_pipeline_id)
  per_replica = GLOBAL_BATCH // ctx.num_replicas_in_sync
  lengths = ids.map(cut_length).batch(per_replica, drop_remainder=True)

  def cut(batch, length):
    keep = tf.range(128, dtype=tf.int64)[tf.newaxis] < length[:, tf.newaxis]
    batch = {k: tf.where(keep, v, tf.zeros_like(v)) if k in ("input_ids", "input_mask",
                                                             "segment_ids") else v
             for k, v in batch.items()}
    # Masked positions past the cut would point outside the cut record: drop them.
    kept = tf.cast(batch["masked_lm_positions"], tf.int64) < length[:, tf.newaxis]
    for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
      batch[k] = tf.where(kept, batch[k], tf.zeros_like(batch[k]))
    return input_pipeline.trim_to_longest(batch, 1)
  return tf.data.Dataset.zip(dataset_fn(ctx), lengths).map(cut)


def cut_length(i):
  return 8 + (i * 29) % 120


if __name__ == "__main__":
  main(*sys.argv[1:4])
