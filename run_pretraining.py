"""Pre-trains BERT (masked LM + next-sentence prediction) on create_pretraining_data.py's records.

The original's flags, plus the shared training flags of training.py (--distribution_strategy,
--use_xla, --mixed_precision, --gradient_accumulation_steps, --optimizer, ...). Rerunning the same
command after an interruption resumes from the last checkpoint in --output_dir.
"""

import os

import tensorflow as tf
from absl import flags
from absl import logging

import fileio
import input_pipeline
import modeling
import training

FLAGS = flags.FLAGS

flags.DEFINE_string("bert_config_file", None, "bert_config.json (or a HuggingFace config.json).")
flags.DEFINE_string("input_file", None, "TFRecord files: comma-separated paths or globs.")
flags.DEFINE_string("output_dir", None, "Checkpoints, TensorBoard logs and eval_results.txt.")
flags.DEFINE_string("init_checkpoint", None,
                    "Initial weights: Google TF1 checkpoint, HF safetensors dir, or ours.")
flags.DEFINE_integer("max_seq_length", 128, "Must match the records.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Must match the records.")
flags.DEFINE_bool("do_train", False, "Train.")
flags.DEFINE_bool("do_eval", False, "Evaluate on --input_file; writes eval_results.txt.")
flags.DEFINE_integer("train_batch_size", 32, "Global batch size for training.")
flags.DEFINE_integer("eval_batch_size", 8, "Global batch size for evaluation.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate.")
flags.DEFINE_integer("num_train_steps", 100000, "Optimizer steps.")
flags.DEFINE_integer("num_warmup_steps", 10000, "Linear warm-up steps.")
flags.DEFINE_integer("max_eval_steps", 100, "Evaluation batches.")


def validate_flags(config):
  if not FLAGS.do_train and not FLAGS.do_eval:
    raise fileio.InputError("at least one of --do_train / --do_eval must be set")
  for name in ("bert_config_file", "input_file", "output_dir"):
    if not FLAGS[name].value:
      raise fileio.InputError(f"--{name} is required")
  if FLAGS.max_seq_length > config.max_position_embeddings:
    raise fileio.InputError(
        f"--max_seq_length={FLAGS.max_seq_length} is above max_position_embeddings="
        f"{config.max_position_embeddings} of --bert_config_file={FLAGS.bert_config_file}")
  if FLAGS.num_warmup_steps > FLAGS.num_train_steps:
    logging.warning("--num_warmup_steps > --num_train_steps: the learning rate never decays")


def main(_):
  tf.random.set_seed(FLAGS.seed)
  config = modeling.BertConfig.from_json_file(FLAGS.bert_config_file)
  validate_flags(config)
  input_files = fileio.expand_file_patterns(FLAGS.input_file, "--input_file")
  # Before any TF op: --num_cpu_devices splits the CPU only while the runtime is uninitialised.
  strategy = training.strategy_from_flags()
  name_to_features = input_pipeline.pretraining_features(FLAGS.max_seq_length,
                                                         FLAGS.max_predictions_per_seq)
  input_pipeline.check_records(input_files, name_to_features)
  logging.info("Reading %d input files", len(input_files))

  accumulation = FLAGS.gradient_accumulation_steps
  # Both batch sizes are checked now rather than the evaluation's after hours of training.
  train_batch = training.per_replica_batch_size(FLAGS.train_batch_size, strategy,
                                                "train_batch_size", accumulation)
  eval_batch = training.per_replica_batch_size(FLAGS.eval_batch_size, strategy,
                                               "eval_batch_size") if FLAGS.do_eval else None
  with strategy.scope():
    model = modeling.BertPretrainer(config, training.compute_dtype_from_flags())
    optimizer = training.create_optimizer_from_flags(FLAGS.learning_rate, FLAGS.num_train_steps,
                                                     FLAGS.num_warmup_steps)
  trainer = training.Trainer(strategy, model, modeling.pretraining_losses, optimizer,
                             output_dir=FLAGS.output_dir, use_xla=FLAGS.use_xla,
                             gradient_accumulation_steps=accumulation,
                             keep_checkpoint_max=FLAGS.keep_checkpoint_max, seed=FLAGS.seed)
  with fileio.open_atomic(os.path.join(FLAGS.output_dir, "bert_config.json")) as f:
    f.write(config.to_json_string())

  if FLAGS.do_train:
    # check_records saw each file's first record; a damaged one further in is named here.
    with input_pipeline.naming_bad_records(input_files, name_to_features):
      trainer.train(
          lambda ctx: input_pipeline.tfrecord_dataset(input_files, name_to_features, train_batch,
                                                      is_training=True, input_context=ctx,
                                                      seed=FLAGS.seed),
          FLAGS.num_train_steps, save_checkpoints_steps=FLAGS.save_checkpoints_steps,
          steps_per_loop=FLAGS.iterations_per_loop, examples_per_step=FLAGS.train_batch_size,
          init_fn=training.init_fn_for(model, FLAGS.init_checkpoint),
          summary_dir=os.path.join(FLAGS.output_dir, "train"),
          max_nonfinite_loops=FLAGS.max_nonfinite_loops)

  if FLAGS.do_eval:
    if not FLAGS.do_train:
      trainer.restore_or_initialize(training.init_fn_for(model, FLAGS.init_checkpoint))
    with input_pipeline.naming_bad_records(input_files, name_to_features):
      metrics = trainer.evaluate(
          lambda ctx: input_pipeline.tfrecord_dataset(input_files, name_to_features, eval_batch,
                                                      is_training=False, input_context=ctx,
                                                      drop_remainder=True),
          max_steps=FLAGS.max_eval_steps)
    metrics["global_step"] = int(optimizer.iterations.numpy())
    training.write_eval_results(os.path.join(FLAGS.output_dir, "eval_results.txt"), metrics)


if __name__ == "__main__":
  fileio.run_main(main)
