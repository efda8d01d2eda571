"""Pre-trains BERT (masked LM + next-sentence prediction) on create_pretraining_data.py's records.

The original's flags, plus the shared training flags of script_flags.py (--distribution_strategy,
--use_xla, --mixed_precision, --gradient_accumulation_steps, --optimizer, ...). Rerunning the same
command after an interruption resumes from the last checkpoint in --output_dir.

The kind of records is read from their features: records written with --dynamic_masking are
masked as they are read (--masked_lm_prob, --max_predictions_per_seq, --do_whole_word_mask; new
masks at every pass, the same ones after a resume), and packed ones (--pack_sequences) keep
their instances apart in attention, positions and next-sentence prediction.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import json
import os

import numpy as np
import tensorflow as tf
from absl import flags
from absl import logging

from bert_tf2 import checkpoints
from bert_tf2 import input_pipeline
from bert_tf2 import masking
from bert_tf2 import modeling
from bert_tf2 import run_dir
from bert_tf2 import script_flags
from bert_tf2 import time_budget
from bert_tf2 import training

FLAGS = flags.FLAGS


def define_flags():
  """The flags of run_pretraining.py: the shared groups (script_flags), then its own."""
  script_flags.define_training_flags()
  script_flags.define_checkpoint_flags()
  script_flags.define_mode_flags("train", "eval")
  script_flags.define_max_seq_length(128, minimum=2)
  script_flags.define_max_predictions_flag()
  script_flags.define_masking_flags()
  script_flags.define_input_file_flag()
  flags.DEFINE_integer("num_train_steps", 100000, "Optimizer steps.", lower_bound=1,
                       upper_bound=training.MAX_STEPS)
  flags.DEFINE_integer("num_warmup_steps", 10000, "Linear warm-up steps.", lower_bound=0,
                       upper_bound=training.MAX_STEPS)
  flags.DEFINE_integer("max_eval_steps", 100, "Evaluation batches.", lower_bound=1)
  flags.DEFINE_float("train_budget_minutes", None, "Train for this many minutes of training "
                     "time: warm-up and decay follow the time spent, not the steps (the "
                     "--num_warmup_steps / --num_train_steps share of it warms up); the run ends "
                     "when it is spent, --num_train_steps a cap. Resumable (time_budget.py).",
                     upper_bound=training.MAX_STEPS)
  flags.register_validator("train_budget_minutes", lambda value: value is None or value > 0,
                           message="must be > 0")


# Keys that change no trained weight: a resumed run may change them.
_TRAINING_ONLY_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")


def validate_flags(config):
  checkpoints.check_seq_length(FLAGS.max_seq_length, config,
                               f"--bert_config_file={FLAGS.bert_config_file}")
  if FLAGS.num_warmup_steps > FLAGS.num_train_steps:
    logging.warning("--num_warmup_steps > --num_train_steps: the learning rate never decays")


def check_config_matches_output_dir(config, output_dir, config_file):
  """Refuses a config that differs from the one the checkpoints in output_dir were trained with,
  before its bert_config.json is replaced: a different size would fail to restore them, and a
  key that changes no shape (num_attention_heads, hidden_act) would train another model on top."""
  saved_path = run_dir.config_file(output_dir)
  if not run_dir.checkpoint_numbers(output_dir) or not fileio.isfile(saved_path):
    return
  try:
    with fileio.open_input(saved_path) as f:
      saved = json.load(f)
  except (OSError, ValueError, fileio.InputError):
    return  # the checkpoints' own shapes are still checked when they are restored
  new = config.to_dict()
  for key in sorted((set(saved) & set(new)) - set(_TRAINING_ONLY_KEYS)):
    if saved[key] != new[key]:
      raise fileio.InputError(
          f"--bert_config_file={config_file} has {key}={new[key]!r}, but the checkpoints in "
          f"--output_dir={output_dir} were trained with {key}={saved[key]!r} ({saved_path}); "
          "use that config, or a new --output_dir")


def check_run_matches_output_dir(records, timed, output_dir, records_file):
  """Refuses records whose task (masked-LM + next sentence, or masked-LM only) is not the one the
  checkpoints in output_dir were trained on (resuming would drop or add a head half-way), and a
  resume that switches between a schedule over steps and one over a time budget (`timed`; None
  when not training)."""
  # The newest checkpoint that reads, by its files (the `checkpoint` state file may be damaged:
  # the Trainer rebuilds it later, and skips a truncated checkpoint as this does).
  for step in run_dir.checkpoint_numbers(output_dir):
    latest = os.path.join(output_dir, f"ckpt-{step}")
    try:
      names = {name for name, _ in tf.train.list_variables(latest)}
      break
    except (tf.errors.OpError, ValueError):
      continue
  else:
    return
  trained_timed = time_budget.in_checkpoint(names)
  if timed is not None and trained_timed != timed:  # (None: not training, any schedule reads)
    raise fileio.InputError(
        f"--output_dir={output_dir} holds a run scheduled over "
        f"{'a time budget' if trained_timed else 'its steps'} ({latest}): resume it "
        f"{'with' if trained_timed else 'without'} --train_budget_minutes, or use a new "
        "--output_dir")
  trained_nsp = any(name.startswith("model/next_sentence/") for name in names)
  if trained_nsp == records.single_segment:
    trained = "masked LM and next sentence" if trained_nsp else "masked LM only"
    given = ("single segments (create_pretraining_data --no_nsp): masked LM only"
             if records.single_segment else "sentence pairs with next-sentence labels")
    raise fileio.InputError(
        f"--output_dir={output_dir} holds a model trained on {trained} ({latest}); "
        f"--input_file {records_file} holds {given}: give records of its kind, or a new "
        "--output_dir")


def check_prediction_budget(records, source):
  """Refuses masking flags that make more predictions in a packed sequence than the generator
  packed it for: its masker keeps the first --max_predictions_per_seq of a sequence, so the rest
  would be dropped unseen, most of them those of a sequence's later instances. None is with a
  budget at least the records' and a probability at most theirs: each instance's count is then
  at most the generator's, or, where the generator's was capped at its budget, the instance is
  alone in its sequence."""
  if not (records.dynamic and records.packed):
    return  # one instance a sequence: its count is capped at the flag, as in the original
  if not records.max_predictions:
    logging.warning("%s: packed unmasked records that do not say the --max_predictions_per_seq "
                    "and --masked_lm_prob they were packed for; give the generator's (larger "
                    "ones drop predictions), or write them again to have them checked", source)
    return
  if FLAGS.max_predictions_per_seq < records.max_predictions:
    raise fileio.InputError(
        f"--max_predictions_per_seq={FLAGS.max_predictions_per_seq} is below the "
        f"{records.max_predictions} predictions a sequence the packed records of {source} were "
        "made for (create_pretraining_data --max_predictions_per_seq): the fuller sequences "
        f"would lose predictions; use at least {records.max_predictions}")
  # Compared as the records store it (float32), so that the generator's own value passes.
  packed_prob = np.float32(records.masked_lm_prob)
  if np.float32(FLAGS.masked_lm_prob) > packed_prob:
    raise fileio.InputError(
        f"--masked_lm_prob={FLAGS.masked_lm_prob} is above the {packed_prob!s} the packed "
        f"records of {source} were made for (create_pretraining_data --masked_lm_prob): the "
        f"fuller sequences would lose predictions; use at most {packed_prob!s}")


def check_vocab_size(records, config, records_file, config_file):
  """The config's vocab_size against the vocabulary the records were written with (dynamic
  records say its size): more tokens than rows is an error; fewer, a warning naming both sizes
  (a config of BERT's 30,522 ids over a 7,632-token vocab trains 22,890 rows and output classes
  no token has)."""
  words = records.vocab_words
  if not words or words == config.vocab_size:
    return
  if words > config.vocab_size:
    raise fileio.InputError(
        f"{records_file}: written with a vocabulary of {words} tokens, more than vocab_size="
        f"{config.vocab_size} of {config_file}: set vocab_size to {words}")
  logging.warning("%s: vocab_size=%d, but the records were written with a vocabulary of %d "
                  "tokens: %d embedding rows and output classes will never be used; set "
                  "vocab_size to %d for a model of this vocabulary", config_file,
                  config.vocab_size, words, config.vocab_size - words, words)


def dynamic_masking(records, config, source):
  """The masking of records written with --dynamic_masking (None for masked records: the masking
  flags then change nothing, which a warning says when they were given)."""
  if not records.dynamic:
    given = [f"--{name}" for name in ("masked_lm_prob", "do_whole_word_mask", "mask_split")
             if FLAGS[name].present]
    if given:
      logging.warning("%s: ignored, the records are masked already (only records written with "
                      "--dynamic_masking are masked here)", " and ".join(given))
    return None
  if not 0.0 < FLAGS.masked_lm_prob <= 1.0:
    raise fileio.InputError(f"--masked_lm_prob={FLAGS.masked_lm_prob} must be in (0, 1]")
  if FLAGS.max_predictions_per_seq > FLAGS.max_seq_length:
    raise fileio.InputError(
        f"--max_predictions_per_seq={FLAGS.max_predictions_per_seq} must be at most "
        f"--max_seq_length={FLAGS.max_seq_length}")
  check_prediction_budget(records, source)
  return input_pipeline.DynamicMasking(FLAGS.masked_lm_prob, FLAGS.max_predictions_per_seq,
                                       config.vocab_size, FLAGS.do_whole_word_mask,
                                       masking.MaskSplit.parse(FLAGS.mask_split))


def _text(path):
  try:
    with fileio.open_input(path) as f:
      return f.read()
  except (OSError, ValueError, fileio.InputError):
    return None


def main(_):
  tf.random.set_seed(FLAGS.seed)
  if not FLAGS.do_train and not FLAGS.do_eval:
    raise fileio.InputError("at least one of --do_train / --do_eval must be set")
  fileio.require(bert_config_file=FLAGS.bert_config_file, input_file=FLAGS.input_file,
                 output_dir=FLAGS.output_dir)
  config = modeling.BertConfig.from_json_file(FLAGS.bert_config_file)
  validate_flags(config)
  input_files = fileio.expand_file_patterns(FLAGS.input_file, "--input_file")
  fileio.check_outputs(directories=[("output_dir", FLAGS.output_dir)],
                       inputs=[("input_file", input_files),
                               ("bert_config_file", FLAGS.bert_config_file)])
  check_config_matches_output_dir(config, FLAGS.output_dir, FLAGS.bert_config_file)
  # Before any TF op: --num_cpu_devices splits the CPU only while the runtime is uninitialised.
  strategy = script_flags.strategy()
  records = input_pipeline.PretrainingRecords.of_files(input_files)
  if records.max_instances > max(1, FLAGS.max_seq_length // 3):
    # Each slot is a next-sentence label and a [CLS] gathered in every batch: bounded by what
    # fits a sequence (an instance takes at least [CLS], a token and [SEP]).
    raise fileio.InputError(
        f"{input_files[0]}: packed records with {records.max_instances} next-sentence slots a "
        f"sequence, but at most {FLAGS.max_seq_length // 3} instances fit --max_seq_length="
        f"{FLAGS.max_seq_length}")
  check_vocab_size(records, config, input_files[0], FLAGS.bert_config_file)
  check_run_matches_output_dir(
      records, FLAGS.train_budget_minutes is not None if FLAGS.do_train else None,
      FLAGS.output_dir, input_files[0])
  masking = dynamic_masking(records, config, f"--input_file={FLAGS.input_file}")
  name_to_features = input_pipeline.pretraining_features(FLAGS.max_seq_length,
                                                         FLAGS.max_predictions_per_seq, records)
  limits = input_pipeline.pretraining_value_limits(config.vocab_size, config.type_vocab_size,
                                                   FLAGS.max_seq_length, FLAGS.bert_config_file,
                                                   records)
  input_pipeline.check_records(input_files, name_to_features, limits)
  logging.info("Reading %d input files: %s records", len(input_files), records.describe())
  if records.single_segment:
    logging.info("Training masked LM only: no next-sentence head (the records have no sentence "
                 "pairs); the pooler, which only that head reads, keeps its initial values")

  accumulation = FLAGS.gradient_accumulation_steps
  # Both batch sizes are checked now rather than the evaluation's after hours of training.
  train_batch = training.per_replica_batch_size(FLAGS.train_batch_size, strategy,
                                                "train_batch_size", accumulation)
  eval_batch = training.per_replica_batch_size(FLAGS.eval_batch_size, strategy,
                                               "eval_batch_size") if FLAGS.do_eval else None
  settings = script_flags.settings(training.Settings)  # the training loop's knobs
  with strategy.scope():
    model = modeling.BertPretrainer(config, script_flags.compute_dtype(),
                                    next_sentence=not records.single_segment)
    budget = (time_budget.TimeBudget(FLAGS.train_budget_minutes * 60)
              if FLAGS.train_budget_minutes is not None else None)
    optimizer = training.optimizer_for(settings, FLAGS.learning_rate, FLAGS.num_train_steps,
                                       FLAGS.num_warmup_steps, time_budget=budget)
  # Locks --output_dir and restores its newest checkpoint: one that does not fit the config is an
  # error here, before bert_config.json is replaced.
  trainer = training.Trainer.from_settings(strategy, model, modeling.pretraining_losses,
                                           optimizer, settings)
  init_fn = checkpoints.init_fn_for(model, FLAGS.init_checkpoint)
  trainer.restore_or_initialize(init_fn, for_training=FLAGS.do_train)
  config_path = run_dir.config_file(FLAGS.output_dir)
  if _text(config_path) != config.to_json_string():  # equal when resuming with that very file
    with fileio.open_atomic(config_path) as f:
      f.write(config.to_json_string())

  if FLAGS.do_train:
    # check_records saw each file's first records; a damaged one further in is named here.
    with input_pipeline.naming_bad_records(input_files, name_to_features, limits):
      trainer.train(
          lambda ctx: input_pipeline.pretraining_dataset(
              input_files, name_to_features, train_batch, is_training=True, input_context=ctx,
              seed=FLAGS.seed, value_limits=limits, masking=masking),
          FLAGS.num_train_steps, save_checkpoints_steps=FLAGS.save_checkpoints_steps,
          steps_per_loop=FLAGS.iterations_per_loop, examples_per_step=FLAGS.train_batch_size,
          init_fn=init_fn,
          summary_dir=os.path.join(FLAGS.output_dir, "train"),
          max_nonfinite_loops=FLAGS.max_nonfinite_loops, time_budget=budget)

  if FLAGS.do_eval:
    if FLAGS.do_train:
      logging.warning("--do_eval scores the training records (--input_file), as the original "
                      "did: for a held-out score, run again with --do_eval alone and "
                      "--input_file=<records of held-out text>")
    with input_pipeline.naming_bad_records(input_files, name_to_features, limits):
      metrics = trainer.evaluate(
          lambda ctx: input_pipeline.pretraining_dataset(
              input_files, name_to_features, eval_batch, is_training=False, input_context=ctx,
              seed=FLAGS.seed, drop_remainder=True, value_limits=limits, masking=masking),
          max_steps=FLAGS.max_eval_steps)
    metrics["global_step"] = int(optimizer.iterations.numpy())
    if trainer.is_chief:  # (under multi_worker_mirrored every worker has the metrics)
      training.write_eval_results(run_dir.eval_results_file(FLAGS.output_dir), metrics)


def cli():
  """The command line: `python run_pretraining.py` and the `bert-run-pretraining` command."""
  define_flags()
  commands.run_main(main)
