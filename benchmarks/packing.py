"""Packed sequences against padded ones in pre-training (issue #16): padding, effective tokens/s,
masked-LM accuracy after the same number of real tokens.

The records are made from the WikiText-2 corpus in ../shared by create_pretraining_data.py
--mode=fast (documents but the last --eval_documents for training), once as usual and once with
--pack_sequences, with the same seed: the same masked instances, padded one a sequence or packed
several a sequence. Here the "peer" of each figure is the padded records (ours = packed):

* padding: the fraction of the sequences' positions that are padding, at each --seq_lengths;
* effective tokens/s: real (non-padding) tokens per second of pre-training steps (MLM + NSP, the
  AdamW update included) through the code run_pretraining.py runs (input_pipeline's reader,
  modeling.BertPretrainer, training.Trainer), at --tokens_per_batch positions a batch, for the
  --variants' precisions (fp32 / bf16), one timed `_train_loop` of --steps_per_loop steps;
* masked-LM accuracy: a small model (--accuracy_* flags) trained from scratch, same seed, on
  --accuracy_tokens real tokens, then scored on the held-out documents' padded records, for each
  of --accuracy_seeds; the packed side's batches hold fewer sequences, as many real tokens as a
  padded batch, so both take the same optimizer steps (--noaccuracy_same_tokens_per_step: the
  same sequences a step, and the packed run fewer, larger steps; the warm-up is 10% of the steps
  either way). The figure is the mean over the seeds, with the packed - padded difference per
  seed and its standard error. The defaults (4M tokens, 6 seeds, both lengths) take about an
  hour on 2 cores; --accuracy_tokens=0 skips them.

Every measurement runs in a child process of this script (see common.py).

  python benchmarks/packing.py      # BERT-base throughput at 128 and 512, 4M-token accuracy runs
  python benchmarks/packing.py --layers=2 --hidden_size=64 --num_heads=2 --intermediate_size=128 \
      --tokens_per_batch=1024 --steps_per_loop=2 --repeats=1 --variants=fp32 \
      --accuracy_tokens=20000 --accuracy_seeds=0,1 --dupe_factor=1       # smoke test
(the model's vocab_size is at least --vocab_file's, whose ids the records hold)
"""

import os
import shutil
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

import common

FLAGS = flags.FLAGS

common.define_model_flags()
FLAGS.set_default("variants", ["fp32", "bf16"])
flags.DEFINE_list("seq_lengths", ["128", "512"], "--max_seq_length values to measure.")
flags.DEFINE_integer("tokens_per_batch", 4096,
                     "Positions (padding included) of a training batch: 32 sequences at 128.")
flags.DEFINE_integer("steps_per_loop", 5, "Optimizer steps per timed call.")
flags.DEFINE_integer("dupe_factor", 5, "create_pretraining_data --dupe_factor.")
flags.DEFINE_float("short_seq_prob", 0.1, "create_pretraining_data --short_seq_prob.")
flags.DEFINE_integer("max_instances_per_pack", 3,
                     "create_pretraining_data --max_instances_per_pack.")
flags.DEFINE_integer("eval_documents", 10, "Documents held out for the accuracy evaluation.")
flags.DEFINE_integer("accuracy_tokens", 4_000_000,
                     "Real tokens each accuracy run trains on (0: no accuracy runs).")
flags.DEFINE_list("accuracy_seeds", ["0", "1", "2", "3", "4", "5"],
                  "Seeds of the accuracy runs (initialisation and data order), one run per side "
                  "and seed; the figure is the mean over the seeds, with the packed - padded "
                  "difference per seed and its standard error. The seed-to-seed standard deviation "
                  "is 0.006-0.008 at 128 (benchmarks/README.md): one or two seeds cannot compare.")
flags.DEFINE_integer("accuracy_batch_size", 16, "Sequences a step in the accuracy runs.")
flags.DEFINE_bool("accuracy_same_tokens_per_step", True,
                  "Packed runs take fewer sequences a step, as many real tokens as a padded "
                  "step, so both sides take the same steps (else the same sequences a step, and "
                  "the packed run fewer, larger steps).")
flags.DEFINE_integer("accuracy_layers", 2, "num_hidden_layers of the accuracy runs' model.")
flags.DEFINE_integer("accuracy_hidden_size", 128, "hidden_size of the accuracy runs' model.")
flags.DEFINE_float("accuracy_learning_rate", 1e-3, "Peak learning rate of the accuracy runs.")
common.define_corpus_flags()
flags.DEFINE_string("work_dir", None, "Where the text and records go (default: a temporary "
                    "directory, removed at the end).")

_KINDS = ("padded", "packed")


def _predictions(seq):
  return max(1, round(seq * 20 / 128))  # 20 at 128, 80 at 512: BERT's


def _model_dims():
  """common.model_dims with a vocabulary that holds every id of the records (--vocab_file's)."""
  with open(FLAGS.vocab_file, encoding="utf-8") as f:
    ids = sum(1 for _ in f)
  return dict(common.model_dims(), vocab_size=max(FLAGS.vocab_size, ids))


def _records(kind, seq):
  return os.path.join(FLAGS.work_dir, f"{kind}-{seq}.tfrecord")


# --- children ---------------------------------------------------------------------------------


def _spec(path, seq):
  from bert_tf2 import input_pipeline  # pylint: disable=g-import-not-at-top
  records = input_pipeline.PretrainingRecords.of_file(path)
  return input_pipeline.pretraining_features(seq, _predictions(seq), records)


def _token_counts(path, seq):
  """(sequences, instances, real tokens) of a records file."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = _spec(path, seq)
  sequences = instances = tokens = 0
  for batch in tf.data.TFRecordDataset(path).batch(1024).map(
      lambda r: tf.io.parse_example(r, spec)):
    sequences += int(batch["input_mask"].shape[0])
    tokens += int(tf.reduce_sum(batch["input_mask"]))
    instances += int(tf.reduce_sum(batch["next_sentence_weights"])) if (
        "next_sentence_weights" in batch) else int(batch["input_mask"].shape[0])
  return sequences, instances, tokens


def padding(variant):
  """The padding of the records of `variant` ("KIND/SEQ")."""
  kind, seq = variant.split("/")
  sequences, instances, tokens = _token_counts(_records(kind, seq), int(seq))
  return {"sequences": sequences, "instances": instances, "real_tokens": tokens,
          "padding_fraction": round(1 - tokens / (sequences * int(seq)), 4),
          "real_tokens_per_sequence": round(tokens / sequences, 1)}


def baseline(variant):
  """The masked-LM accuracy of always guessing the training records' most frequent masked token,
  on the held-out records at seq `variant`: what a model that has learned only word frequencies
  scores (an accuracy near it says the run was too short to compare anything)."""
  import collections  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  seq = int(variant)

  def labels(path):
    counts = collections.Counter()
    spec = _spec(path, seq)  # read eagerly (it reads the file's first record), not while tracing
    for batch in tf.data.TFRecordDataset(path).batch(1024).map(
        lambda r: tf.io.parse_example(r, spec)):
      ids = batch["masked_lm_ids"].numpy()[batch["masked_lm_weights"].numpy() > 0]
      counts.update(ids.tolist())
    return counts
  most_frequent = labels(_records("padded", seq)).most_common(1)[0][0]
  held_out = labels(_records("eval", seq))
  return {"masked_lm_accuracy": held_out[most_frequent] / sum(held_out.values()),
          "token_id": most_frequent}


def _with_real_tokens(loss_fn):
  """loss_fn plus a metric: real tokens a step (its value is the mean over the loop's steps).
  Training only: its count of 1 a call is not additive over the parts evaluate() splits a
  batch into (devices.prediction_streams), and nothing here reads it from evaluate()."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def losses(features, outputs):
    stats = loss_fn(features, outputs)
    stats["real_tokens"] = (tf.reduce_sum(tf.cast(features["input_mask"], tf.float32)),
                            tf.constant(1.0))
    return stats
  return losses


def _trainer(config, compute_dtype, learning_rate, num_train_steps, num_warmup_steps, seed=0):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  from bert_tf2 import optimization  # pylint: disable=g-import-not-at-top
  from bert_tf2 import training  # pylint: disable=g-import-not-at-top
  tf.random.set_seed(seed)
  strategy = tf.distribute.get_strategy()
  with strategy.scope():
    model = modeling.BertPretrainer(config, compute_dtype)
    optimizer = optimization.create_optimizer(learning_rate, num_train_steps, num_warmup_steps)
  return training.Trainer(strategy, model, _with_real_tokens(modeling.pretraining_losses),
                          optimizer, seed=seed)


def _training_data(path, seq, batch_size, seed=0):
  from bert_tf2 import input_pipeline  # pylint: disable=g-import-not-at-top
  spec = _spec(path, seq)
  return lambda ctx: input_pipeline.pretraining_dataset([path], spec, batch_size, True, ctx,
                                                        seed=seed)


def throughput(variant):
  """Training throughput on the records of `variant` ("KIND/SEQ/PRECISION")."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  kind, seq, precision = variant.split("/")
  seq = int(seq)
  batch_size = max(1, FLAGS.tokens_per_batch // seq)
  trainer = _trainer(modeling.BertConfig(**_model_dims()),
                     common.compute_dtype(precision), 1e-4, 100000, 10000)
  iterator = iter(trainer.distribute(_training_data(_records(kind, seq), seq, batch_size)))
  steps = tf.constant(FLAGS.steps_per_loop)
  tokens = []

  def run():
    stats = trainer._train_loop(iterator, steps)  # pylint: disable=protected-access
    tokens.append(float(stats["real_tokens"][0]))  # fetching it waits for the steps

  timing = common.timed(run)
  # The real tokens of the timed calls (after the warm-up ones), per call.
  real = sum(tokens[-len(timing["times_s"]):]) / len(timing["times_s"])
  per_s, best_per_s = common.rate(real, timing)
  return {"tokens_per_s": per_s, "best_tokens_per_s": best_per_s,
          "sequences_per_s": common.rate(FLAGS.steps_per_loop * batch_size, timing)[0],
          "real_tokens_per_sequence": real / (FLAGS.steps_per_loop * batch_size),
          "batch_size": batch_size, "timing": timing, "tensorflow": tf.__version__}


def accuracy(variant):
  """Masked-LM accuracy on the held-out records after --accuracy_tokens real tokens of training
  on the records of `variant` ("KIND/SEQ/SEED")."""
  from bert_tf2 import input_pipeline  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  kind, seq, seed = variant.split("/")
  seq, seed = int(seq), int(seed)
  path = _records(kind, seq)
  sequences, _, tokens = _token_counts(path, seq)
  batch_size = FLAGS.accuracy_batch_size
  if kind == "packed" and FLAGS.accuracy_same_tokens_per_step:
    # Fewer packed sequences a step, holding the padded batch's real tokens: both sides then take
    # the same number of optimizer steps of the same size, and only the packing differs.
    padded_sequences, _, padded_tokens = _token_counts(_records("padded", seq), seq)
    batch_size = max(1, round(batch_size * (padded_tokens / padded_sequences) /
                              (tokens / sequences)))
  steps = max(1, round(FLAGS.accuracy_tokens / (batch_size * tokens / sequences)))
  hidden = FLAGS.accuracy_hidden_size
  # The larger initializer_range leaves the unigram plateau sooner in a model this small (see
  # tests/test_run_pretraining.py); no dropout: a short run.
  config = modeling.BertConfig(
      vocab_size=_model_dims()["vocab_size"], hidden_size=hidden,
      num_hidden_layers=FLAGS.accuracy_layers,
      num_attention_heads=max(1, hidden // 32), intermediate_size=4 * hidden,
      max_position_embeddings=max(512, seq), type_vocab_size=2, initializer_range=0.2,
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  trainer = _trainer(config, tf.float32, FLAGS.accuracy_learning_rate, steps, steps // 10, seed)
  trained = trainer.train(_training_data(path, seq, batch_size, seed), steps,
                          steps_per_loop=min(steps, 100))
  eval_path = _records("eval", seq)
  spec = _spec(eval_path, seq)
  metrics = trainer.evaluate(lambda ctx: input_pipeline.pretraining_dataset(
      [eval_path], spec, 32, False, ctx, drop_remainder=False))
  return {"masked_lm_accuracy": metrics["masked_lm_accuracy"],
          "masked_lm_loss": metrics["masked_lm_loss"],
          "next_sentence_accuracy": metrics["next_sentence_accuracy"], "steps": steps,
          "batch_size": batch_size, "trained_real_tokens": round(steps * batch_size * tokens /
                                                                 sequences),
          "final_training_loss": trained.get("loss")}


# --- the parent --------------------------------------------------------------------------------


def _paired_difference(scores):
  """Packed minus padded accuracy per seed (the same initialisation), their mean and its
  standard error: whether packing is worse is judged against the seeds' spread."""
  seeds = [s for s in scores["padded"] if s in scores["packed"]]
  diffs = [scores["packed"][s]["masked_lm_accuracy"] - scores["padded"][s]["masked_lm_accuracy"]
           for s in seeds]
  error = float(np.std(diffs, ddof=1) / np.sqrt(len(diffs))) if len(diffs) > 1 else None
  return {"per_seed": {s: {k: round(scores[k][s]["masked_lm_accuracy"], 4) for k in _KINDS}
                       for s in seeds},
          "packed_minus_padded": round(float(np.mean(diffs)), 4) if diffs else None,
          "standard_error": round(error, 4) if error is not None else None}


def _make_records():
  """The text of the training and held-out documents, and the records of every kind."""
  documents = common.read_documents(FLAGS.corpus)
  texts = {"train": documents[:-FLAGS.eval_documents], "eval": documents[-FLAGS.eval_documents:]}
  for name, part in texts.items():
    with open(os.path.join(FLAGS.work_dir, f"{name}.txt"), "w", encoding="utf-8") as f:
      f.write("\n\n".join("\n".join(d) for d in part) + "\n")
  for seq in map(int, FLAGS.seq_lengths):
    for kind in (*_KINDS, "eval"):
      text = os.path.join(FLAGS.work_dir, "eval.txt" if kind == "eval" else "train.txt")
      args = [sys.executable, os.path.join(common.ROOT, "create_pretraining_data.py"),
              f"--input_file={text}", f"--output_file={_records(kind, seq)}",
              f"--vocab_file={FLAGS.vocab_file}", "--mode=fast", f"--max_seq_length={seq}",
              f"--max_predictions_per_seq={_predictions(seq)}", "--random_seed=12345",
              f"--dupe_factor={1 if kind == 'eval' else FLAGS.dupe_factor}",
              f"--short_seq_prob={FLAGS.short_seq_prob}"]
      if kind == "packed":
        args += ["--pack_sequences", f"--max_instances_per_pack={FLAGS.max_instances_per_pack}"]
      print(f"[packing] creating the {kind} records at seq {seq} ...", file=sys.stderr,
            flush=True)
      subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv):
  del argv
  if common.dispatch({"padding": padding, "throughput": throughput, "accuracy": accuracy,
                      "baseline": baseline}):
    return
  own_dir = FLAGS.work_dir is None
  if own_dir:
    FLAGS.work_dir = tempfile.mkdtemp(prefix="packing_")
    sys.argv.append(f"--work_dir={FLAGS.work_dir}")  # the children read the same records
  figures, details = [], {}
  try:
    _make_records()
    for seq in FLAGS.seq_lengths:
      pads = {kind: common.run_child("padding", f"{kind}/{seq}") for kind in _KINDS}
      figures.append(common.figure(f"padding fraction at seq {seq}", "fraction",
                                   {"packed": pads["packed"]}, {"padded": pads["padded"]},
                                   "padding_fraction", higher_is_better=False))
      speed = {kind: {p: common.run_child("throughput", f"{kind}/{seq}/{p}")
                      for p in FLAGS.variants} for kind in _KINDS}
      if FLAGS.variants:
        figures.append(common.figure(f"effective (non-padding) tokens/s at seq {seq}",
                                     "tokens/s", speed["packed"], speed["padded"],
                                     "tokens_per_s"))
      scores = ({kind: {s: common.run_child("accuracy", f"{kind}/{seq}/{s}")
                        for s in FLAGS.accuracy_seeds} for kind in _KINDS}
                if FLAGS.accuracy_tokens else {})
      unigram = common.run_child("baseline", seq) if scores else None
      if scores:
        mean = {kind: {"masked_lm_accuracy": float(np.mean(
            [r["masked_lm_accuracy"] for r in scores[kind].values()]))} for kind in _KINDS}
        figures.append(common.figure(
            f"masked-LM accuracy after {FLAGS.accuracy_tokens} real tokens at seq {seq}, mean "
            f"over {len(FLAGS.accuracy_seeds)} seed(s) (most-frequent-token baseline "
            f"{unigram.get('masked_lm_accuracy', float('nan')):.4f})", "accuracy",
            {"packed": mean["packed"]}, {"padded": mean["padded"]}, "masked_lm_accuracy"))
        figures[-1].update(_paired_difference(scores))
      details[f"seq {seq}"] = {"padding": pads, "throughput": speed, "accuracy": scores,
                               "most_frequent_token_baseline": unigram}
  finally:
    if own_dir:
      shutil.rmtree(FLAGS.work_dir, ignore_errors=True)
  common.emit("packing", figures, settings={
      **_model_dims(), "seq_lengths": FLAGS.seq_lengths,
      "tokens_per_batch": FLAGS.tokens_per_batch, "steps_per_timed_call": FLAGS.steps_per_loop,
      "variants": FLAGS.variants, "warmup_calls": FLAGS.warmup, "repeats": FLAGS.repeats,
      "dupe_factor": FLAGS.dupe_factor, "short_seq_prob": FLAGS.short_seq_prob,
      "max_instances_per_pack": FLAGS.max_instances_per_pack,
      "eval_documents": FLAGS.eval_documents, "accuracy_tokens": FLAGS.accuracy_tokens,
      "accuracy_seeds": FLAGS.accuracy_seeds,
      "accuracy_model": {"layers": FLAGS.accuracy_layers,
                         "hidden_size": FLAGS.accuracy_hidden_size,
                         "batch_size": FLAGS.accuracy_batch_size,
                         "learning_rate": FLAGS.accuracy_learning_rate},
      "corpus": os.path.basename(FLAGS.corpus)},
      details=details, peer_name="the same instances padded, one a sequence (create_pretraining_"
      "data without --pack_sequences); ours: packed with --pack_sequences")


if __name__ == "__main__":
  app.run(main)
