"""The one home of fine-tuning set-up: what the fine-tuning scripts (run_classifier, run_ner,
run_squad, run_swag) share around their own data. `Settings` holds their knobs (one field per
flag, built from the flags in one line by script_flags.settings); `run` is the context their
main opens (modes, the vocab of an exported encoder, required flags, the seed); then outputs
checked against inputs before any work (check_files_and_load), the model, optimizer and Trainer
(build_trainer), the config (of a checkpoint or an exported encoder) and the tokenizer checked against each
other, the start from --init_checkpoint or --hub_module_handle, the training steps and shuffle
buffer, the task record (task.json) and the label checks against it, padded sequences, reading
feature records, running a model over records padded to whole batches, and the evaluation during
training a script asks for (dev_evaluation.py's EvalDuringTraining: the best checkpoint
kept, early stopping).

Plain values in, plain values out (it reads no flag, and never calls a script back): each script
still reads its own data, turns it into features and reads top to bottom; what differs between
tasks stays in the task's script.
"""

import contextlib
import dataclasses
import json
import os

import numpy as np
import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import dev_evaluation
from bert_tf2 import devices
from bert_tf2 import fileio
from bert_tf2 import input_pipeline
from bert_tf2 import modeling
from bert_tf2 import run_dir
from bert_tf2 import tokenization
from bert_tf2 import training


@dataclasses.dataclass(frozen=True)
class Settings(training.Settings):
  """The knobs every fine-tuning script has (script_flags.define_fine_tuning_flags), one field
  per flag; a script adds its own fields in a subclass. Built in one line by
  script_flags.settings."""

  lr_schedule: str = "decay_after_warmup"  # HF's schedule (docs/fine-tuning.md)
  # The model and its text.
  init_checkpoint: str | None = None
  bert_config_file: str | None = None
  hub_module_handle: str | None = None  # an encoder SavedModel instead of --init_checkpoint
  litert_model: str | None = None  # a LiteRT model directory to predict with (run_classifier)
  vocab_file: str | None = None
  do_lower_case: bool = True
  max_seq_length: int = 128
  # What the run does.
  do_train: bool = False
  do_eval: bool = False
  do_predict: bool = False
  predict_batch_size: int = 8
  num_train_epochs: float = 3.0
  warmup_proportion: float = 0.1
  dynamic_padding: bool = True  # batches cut to their longest sequence (not on TPUs)
  # Evaluation during training (EvalDuringTraining).
  eval_every_steps: int | None = None
  keep_best_checkpoint_metric: str | None = None
  early_stopping_patience: int | None = None
  use_best_checkpoint: bool = True


@contextlib.contextmanager
def run(settings, modes, **required):
  """What every fine-tuning run opens with, as `with fine_tuning.run(settings, modes, ...) as
  settings:` around the script's work, in this order: one of the script's `modes` ("train",
  "eval", "predict") set; the vocab, --vocab_file or else the one the encoder SavedModel
  --hub_module_handle carries, the vocab.txt a training run saved beside its checkpoints in
  --output_dir, or the vocab.txt beside --init_checkpoint (a Google or HF model folder, a
  fine-tuning run's); the `required` flags (name=value), then --vocab_file and --output_dir,
  given (an InputError names the first that is missing); and TensorFlow's global seed. Yields
  the settings with the vocab found. A run that fails before writing leaves no empty output_dir
  behind (fileio.check_outputs makes it, to prove that it can)."""
  if not any(getattr(settings, f"do_{mode}") for mode in modes):
    raise fileio.InputError(f"at least one of {', '.join(f'--do_{m}' for m in modes)} must be set")
  check_eval_flags(settings)
  output_dir, hub_module_handle = settings.output_dir, settings.hub_module_handle
  vocab_file = hub_module_vocab(hub_module_handle, settings.vocab_file)
  if not vocab_file and not hub_module_handle:
    vocab_file = saved_beside_checkpoints(output_dir, "vocab.txt")
  if not vocab_file and not hub_module_handle:
    vocab_file = checkpoints.vocab_file_or_beside(None, settings.init_checkpoint)
  fileio.require(**required, vocab_file=vocab_file, output_dir=output_dir)
  tf.random.set_seed(settings.seed)
  with fileio.no_new_empty_directories(*[output_dir] if output_dir else []):
    yield dataclasses.replace(settings, vocab_file=vocab_file)


def check_files_and_load(settings, outputs, inputs, pairs=None):
  """What every fine-tuning run does after opening (`run`): check_files (`outputs` are the names
  the script writes in --output_dir, `inputs` its own (flag, path or paths) pairs), then
  load_config_and_tokenizer (`pairs` says why the task's texts are pairs, if they are). Without
  --bert_config_file, --init_checkpoint or --hub_module_handle, the bert_config.json a training
  run saved beside its checkpoints in --output_dir is the config. Returns (has_checkpoint,
  BertConfig, FullTokenizer)."""
  s = settings
  config_file = s.bert_config_file
  if not (config_file or s.init_checkpoint or s.hub_module_handle):
    config_file = saved_beside_checkpoints(s.output_dir, "bert_config.json")
  has_checkpoint = check_files(
      s.output_dir, outputs, [*inputs, ("hub_module_handle", s.hub_module_handle)],
      s.vocab_file, config_file, s.init_checkpoint)
  config, tokenizer = load_config_and_tokenizer(
      config_file, s.init_checkpoint, s.vocab_file, s.do_lower_case, s.max_seq_length, pairs,
      s.hub_module_handle)
  return has_checkpoint, config, tokenizer


def build_trainer(settings, strategy, build_model, loss_fn, num_train_steps, num_warmup_steps,
            has_checkpoint):
  """(model, optimizer, Trainer, init_fn) of a fine-tuning run: `build_model()` must match the
  checkpoint in output_dir (`has_checkpoint`: it holds one), and init_fn starts it from
  --init_checkpoint or --hub_module_handle (`init_fn`)."""
  with strategy.scope():
    model = checkpoints.check_checkpoint_matches(settings.output_dir, build_model())
    optimizer = training.optimizer_for(settings, settings.learning_rate, num_train_steps,
                                       num_warmup_steps)
  trainer = training.Trainer.from_settings(strategy, model, loss_fn, optimizer, settings)
  return model, optimizer, trainer, init_fn(
      model, settings.init_checkpoint, settings.hub_module_handle, settings.do_train,
      has_checkpoint, settings.output_dir)


def pad_to_longest(settings, strategy):
  """Whether batches are cut to their longest sequence (--dynamic_padding, not on TPUs)."""
  return devices.dynamic_padding(settings.dynamic_padding, strategy)


def train_on_records(settings, trainer, train_file, spec, batch, steps, init_fn, cut_batches,
                     buffer, evaluate=None):
  """`trainer.train` for `steps` on the records of `train_file` (parsed by `spec`, `batch` a
  replica's, through a shuffle `buffer`; `cut_batches`: pad_to_longest) with the seed and loop
  settings; `evaluate`: eval_during_training's, called every --eval_every_steps."""
  input_fn = input_fn_builder(train_file, spec, True, True, settings.seed, cut_batches, buffer)
  return trainer.train(
      lambda ctx: input_fn(batch, ctx), steps, init_fn=init_fn,
      save_checkpoints_steps=settings.save_checkpoints_steps,
      steps_per_loop=settings.iterations_per_loop, examples_per_step=settings.train_batch_size,
      max_nonfinite_loops=settings.max_nonfinite_loops,
      summary_dir=os.path.join(settings.output_dir, "train"), evaluate=evaluate,
      eval_every_steps=settings.eval_every_steps)


def check_eval_flags(settings):
  """The flags of evaluation during training that must go together, checked from the flags alone
  (in `run`, before output_dir is locked: a run refused for its flags is never told instead that
  another run holds the folder)."""
  if settings.eval_every_steps is None:
    for name in ("keep_best_checkpoint_metric", "early_stopping_patience"):
      if getattr(settings, name) is not None:
        raise fileio.InputError(f"--{name} needs --eval_every_steps (how often to evaluate)")
  elif not settings.do_train:
    raise fileio.InputError("--eval_every_steps evaluates during training: add --do_train")
  elif settings.early_stopping_patience is not None and not settings.keep_best_checkpoint_metric:
    raise fileio.InputError("--early_stopping_patience needs --keep_best_checkpoint_metric "
                            "(the dev metric that must improve)")


def eval_during_training(settings, trainer, evaluate, metric_names=None, read_dev=None):
  """The evaluation during training `settings` ask for (EvalDuringTraining over `evaluate()`,
  which returns the dev eval_* metrics; `metric_names` are those it can return, to check
  --keep_best_checkpoint_metric before training), or None.

  Everything an evaluation will need is checked here, before the first step, not found missing
  after training has run: `read_dev()` (the dev examples' reader) is called once, so a missing,
  unreadable, malformed or empty dev file is one error line now; and the best checkpoint's
  folder must be free for it (EvalDuringTraining)."""
  check_eval_flags(settings)
  if settings.eval_every_steps is None:
    return None
  if read_dev is not None and not read_dev():
    raise fileio.InputError("--eval_every_steps evaluates on the dev set, and it has no "
                            "examples: give a dev file with examples, or leave out "
                            "--eval_every_steps")
  return dev_evaluation.EvalDuringTraining(
      trainer, settings.output_dir, evaluate, settings.keep_best_checkpoint_metric,
      settings.early_stopping_patience,
      None if metric_names is None else [dev_evaluation.metric_key(n) for n in metric_names])


def evaluated_step(settings, trainer, optimizer):
  """The step of the weights a run evaluates and predicts with: with --use_best_checkpoint (the
  default) and --do_eval or --do_predict, the best checkpoint kept in output_dir/best/, whose
  weights are loaded into the model (restore_best); else the latest, the optimizer's step."""
  best = None
  if settings.use_best_checkpoint and (settings.do_eval or settings.do_predict):
    best = dev_evaluation.restore_best(trainer, settings.output_dir)
  return best if best is not None else int(optimizer.iterations.numpy())


def check_files(output_dir, outputs, inputs, vocab_file, bert_config_file, init_checkpoint):
  """fileio.check_outputs for a fine-tuning run, before any work: none of `outputs` (file names
  in output_dir; a record file's .key.json comes with it) may be an input: `inputs` ((flag, path
  or paths) pairs of the task's own), the vocab, the config or the checkpoint (prefix and files).
  Returns whether output_dir already holds checkpoints (a run to resume, a model to evaluate)."""
  names = [*outputs, *(f"{name}.key.json" for name in outputs if name.endswith(".tf_record"))]
  fileio.check_outputs(
      files=[("output_dir", [os.path.join(output_dir, name) for name in names])],
      inputs=[*inputs, ("vocab_file", vocab_file), ("bert_config_file", bert_config_file),
              ("init_checkpoint",
               [init_checkpoint, *fileio.prefix_files(init_checkpoint,
                                                      f"--init_checkpoint={init_checkpoint}")]
               if init_checkpoint else None)],
      directories=[("output_dir", output_dir)])
  return bool(run_dir.checkpoint_numbers(output_dir))


def saved_beside_checkpoints(output_dir, name):
  """`output_dir`/`name` (vocab.txt, bert_config.json) when output_dir holds the checkpoints of a
  training run that saved it there (write_model_files), else None: evaluating, predicting or
  resuming in a run's own folder needs neither flag again."""
  path = os.path.join(output_dir, name) if output_dir else None
  if path and fileio.isfile(path) and run_dir.checkpoint_numbers(output_dir):
    return path
  return None


def hub_module_vocab(hub_module_handle, vocab_file):
  """--vocab_file, or the vocab an exported encoder (--hub_module_handle) carries."""
  if hub_module_handle and not vocab_file:
    return checkpoints.load_tokenization_info(hub_module_handle)[0]
  return vocab_file


def load_config_and_tokenizer(bert_config_file, init_checkpoint, vocab_file, do_lower_case,
                              max_seq_length, pairs=None, hub_module_handle=None):
  """(BertConfig, FullTokenizer): the config of `bert_config_file` or the one beside
  `init_checkpoint` or in the encoder SavedModel `hub_module_handle` (checkpoints.load_bert_config
  and fine_tuning_setup check max_seq_length against the position embeddings) and the tokenizer
  of `vocab_file` (default: the SavedModel's) checked against it (`tokenizer_for`); InputError
  when do_lower_case contradicts a Google checkpoint's name or the SavedModel's casing."""
  if hub_module_handle:
    config, vocab_file = _hub_module_config(
        hub_module_handle, bert_config_file, vocab_file, do_lower_case, init_checkpoint,
        max_seq_length)
    return config, tokenizer_for(config, bert_config_file or hub_module_handle, vocab_file,
                                 do_lower_case, pairs)
  tokenization.validate_case_matches_checkpoint(do_lower_case, init_checkpoint)
  config = checkpoints.load_bert_config(bert_config_file, init_checkpoint, max_seq_length)
  config_source = bert_config_file or f"the config beside --init_checkpoint={init_checkpoint}"
  return config, tokenizer_for(config, config_source, vocab_file, do_lower_case, pairs)


def init_fn(model, init_checkpoint, hub_module_handle, do_train, has_checkpoint, output_dir):
  """What starts `model` (its encoder as `model.bert`) when output_dir has no checkpoint: the
  weights of `init_checkpoint` or of the encoder SavedModel `hub_module_handle`, or None.
  InputError when only an encoder SavedModel would be evaluated: it has no task output layer."""
  if not hub_module_handle:
    return checkpoints.init_fn_for(model, init_checkpoint)
  if not do_train and not has_checkpoint:
    raise fileio.InputError(
        f"--hub_module_handle={hub_module_handle} is an encoder without this task's output "
        f"layer, and --output_dir={output_dir} holds no fine-tuned model: train first "
        "(--do_train)")
  return lambda: checkpoints.load_encoder_weights(model.bert, hub_module_handle)


def tokenizer_for(config, config_source, vocab_file, do_lower_case, pairs=None):
  """The FullTokenizer of `vocab_file`; InputError naming `config_source` when its ids do not fit
  the config's vocab_size, or when the task's texts are pairs (`pairs` says which, for the
  message) and the config has no second segment type."""
  tokenizer = tokenization.load_tokenizer(vocab_file, do_lower_case)
  tokenization.check_vocab_fits(max(tokenizer.vocab.values(), default=-1) + 1, config, vocab_file,
                                config_source)
  if pairs and config.type_vocab_size < 2:
    raise fileio.InputError(f"{config_source}: type_vocab_size={config.type_vocab_size}, but "
                            f"{pairs}")
  return tokenizer


def train_steps(settings, train_examples, strategy, train_file=None):
  """(num_train_steps, num_warmup_steps, per-replica batch) of training on `train_examples` (read
  from `train_file`) for --num_train_epochs at --train_batch_size with --warmup_proportion
  (_steps, training.per_replica_batch_size: checked before any record is written); (1, 0, None)
  without training (None): the optimizer is then only restored."""
  if train_examples is None:
    return 1, 0, None
  if not train_examples:
    raise fileio.InputError(f"{train_file or 'the training file'}: no training example in it")
  batch = training.per_replica_batch_size(settings.train_batch_size, strategy, "train_batch_size",
                                          settings.gradient_accumulation_steps)
  return (*_steps(len(train_examples), settings.train_batch_size, settings.num_train_epochs,
                  settings.warmup_proportion), batch)


def padded_ids(tokenizer, tokens, segment_ids, max_seq_length):
  """(input_ids, input_mask, segment_ids) of a sequence of `tokens`, each zero-padded to
  max_seq_length: attention sees the real tokens (mask 1), never the padding (mask 0)."""
  input_ids = tokenizer.convert_tokens_to_ids(tokens)
  padding = [0] * (max_seq_length - len(input_ids))
  assert len(input_ids) == len(segment_ids) <= max_seq_length
  return input_ids + padding, [1] * len(input_ids) + padding, segment_ids + padding


def input_fn_builder(input_file, name_to_features, is_training, drop_remainder=True, seed=None,
                     pad_to_longest=False, shuffle_buffer=1000):
  """Returns `input_fn(batch_size, input_context=None)` -> tf.data.Dataset of the records of
  `input_file` (a path or a list), parsed by `name_to_features`: `batch_size` is per replica and
  `input_context` the `tf.distribute.InputContext`, as for `input_pipeline.tfrecord_dataset`,
  which does the reading (training data shuffled with `seed` and repeated). The scripts keep
  `drop_remainder`: their prediction records are padded to whole batches (see `predict`)."""
  input_files = [input_file] if isinstance(input_file, str) else list(input_file)
  return lambda batch_size, input_context=None: input_pipeline.tfrecord_dataset(
      input_files, name_to_features, batch_size, is_training, input_context=input_context,
      seed=seed, drop_remainder=drop_remainder, pad_to_longest=pad_to_longest,
      shuffle_buffer=shuffle_buffer)


def predict(trainer, record_file, key, write, num_features, name_to_features, batch_size,
            flag_name, pad_to_longest, output_names=("logits",)):
  """An iterator over the batches of `trainer`'s model (numpy dicts: its `output_names` and the
  records' features) over `num_features` features written to `record_file`.

  The global batch is --`flag_name` (`batch_size`), cut to what the features need
  (training.prediction_batch_size). `write(padded_to)` writes the records: the features, then
  padding records up to a multiple of `padded_to` (the global batch), so that every batch has one
  shape (TPU, XLA) and no real feature is dropped; it is not called when `record_file` holds the
  records of the same `key` and padding. `pad_to_longest` cuts each batch after its longest
  sequence.
  """
  per_replica, global_batch = training.prediction_batch_size(batch_size, num_features,
                                                             trainer.strategy, flag_name)
  fileio.build_unless_current(record_file, {**key, "padded_to": global_batch},
                              lambda: write(global_batch))
  input_fn = input_fn_builder(record_file, name_to_features, False, pad_to_longest=pad_to_longest)
  return trainer.predict(lambda ctx: input_fn(per_replica, ctx), output_names)


def _hub_module_config(handle, bert_config_file, vocab_file, do_lower_case, init_checkpoint,
                      max_seq_length):
  """(config, vocab file) of a fine-tuning run started from the encoder SavedModel `handle`
  (--hub_module_handle).

  As the original's run_classifier_with_tfhub.py, the vocab and casing come with the module:
  --vocab_file defaults to its vocab, and a --do_lower_case that contradicts its casing is an
  error (the casing the encoder was trained with is the only right one).
  """
  if init_checkpoint:
    raise fileio.InputError("give --init_checkpoint or --hub_module_handle, not both")
  module_vocab, module_lower = checkpoints.load_tokenization_info(handle)
  if module_lower != do_lower_case:
    raise fileio.InputError(f"--do_lower_case={do_lower_case} does not match the casing of "
                            f"--hub_module_handle={handle} (do_lower_case={module_lower})")
  config = (modeling.BertConfig.from_json_file(bert_config_file) if bert_config_file
            else checkpoints.encoder_config(handle))
  checkpoints.check_seq_length(max_seq_length, config, handle)
  return config, vocab_file or module_vocab


def _steps(num_examples, train_batch_size, num_train_epochs, warmup_proportion):
  """(num_train_steps, num_warmup_steps) as the original computes them."""
  num_train_steps = int(num_examples / train_batch_size * num_train_epochs)
  if num_train_steps < 1:
    raise fileio.InputError(
        f"{num_examples} training examples at --train_batch_size={train_batch_size} for "
        f"--num_train_epochs={num_train_epochs} make no training step")
  if num_train_steps > training.MAX_STEPS:
    raise fileio.InputError(
        f"--num_train_epochs={num_train_epochs} makes {num_train_steps:.3g} training steps "
        f"(more than {training.MAX_STEPS:.0e})")
  return num_train_steps, int(num_train_steps * warmup_proportion)


def shuffle_buffer(num_examples, limit=100_000):
  """Records held in the training shuffle buffer: the whole training set, so each step draws
  from all of it as HF's random sampler does (a 1000-record buffer draws the first steps of a
  small GLUE set from its first records only), up to `limit` (about 100 MB of records at seq
  128)."""
  return max(1, min(num_examples, limit))


# --- The task record (task.json) a training run leaves beside its checkpoints -------------------


def task_record(directory, task, has_checkpoint, flag="output_dir"):
  """The record `task.json` ({"task": ..., "labels": [...] or null}) a training run left in its
  output directory, or None. InputError naming the directory when its checkpoints are another
  task's: a head of the same shape (a sentence classifier's under a token classifier) would
  otherwise be evaluated as if it had been trained for this task."""
  path = run_dir.task_file(directory)
  if not fileio.exists(path):
    return None
  try:
    with fileio.open_input(path) as f:
      record = json.load(f)
  except (OSError, ValueError, fileio.InputError) as e:
    raise fileio.InputError(f"{path}: not the task record of a training run ({e})") from None
  labels = record.get("labels") if isinstance(record, dict) else None
  if not (isinstance(record, dict) and isinstance(record.get("task"), str) and (
      labels is None or isinstance(labels, list) and all(isinstance(x, str) for x in labels))):
    raise fileio.InputError(f"{path}: not the task record of a training run (a JSON object with "
                            "\"task\" and \"labels\")")
  if has_checkpoint and record["task"] != task:
    raise fileio.InputError(f"--{flag}={directory} holds the model of another task "
                            f"({record['task']}, not {task}); choose another --{flag}")
  return record


def check_labels_match(labels, record, has_checkpoint, output_dir, what="labels",
                       flag="output_dir"):
  """InputError when `labels` differ from those the model in `output_dir` (given by --`flag`)
  was trained with (its task record): class i would silently mean another label. Returns
  `labels`."""
  saved = record["labels"] if record else None
  if saved is not None and has_checkpoint and saved != labels:
    raise fileio.InputError(
        f"the {what} {','.join(labels)} differ from {','.join(saved)}, those the model in "
        f"--{flag}={output_dir} was trained with (task.json); give "
        f"--labels={','.join(saved)} or another --{flag}")
  return labels


def init_task_record(init_checkpoint, task, evaluating_only):
  """The task record (task.json) beside --init_checkpoint when it is a model fine-tuned by one of
  these scripts, or None. Only evaluating or predicting with it (`evaluating_only`) needs it to be
  this task's: starting training from another task's model is a choice; scoring this task with
  another task's output layer is an InputError."""
  if not init_checkpoint:
    return None
  directory = init_checkpoint if fileio.isdir(init_checkpoint) else fileio.parent(init_checkpoint)
  record = task_record(directory, task, has_checkpoint=False, flag="init_checkpoint")
  if record and evaluating_only and record["task"] != task:
    raise fileio.InputError(f"--init_checkpoint={init_checkpoint} holds the model of another "
                            f"task ({record['task']}, not {task})")
  return record if record and record["task"] == task else None


def classifier_pooling(record, directory):
  """What the output layer of the run_classifier model whose task record (task.json in
  `directory`) is `record` reads: its `classifier_pooling`, `pooler` for a record from before the
  flag or none at all (the original's checkpoints). InputError naming the file when it names no
  modeling.CLASSIFIER_POOLINGS."""
  pooling = (record or {}).get("classifier_pooling", "pooler")
  if pooling not in modeling.CLASSIFIER_POOLINGS:
    raise fileio.InputError(f"{run_dir.task_file(directory)}: classifier_pooling "
                            f"{pooling!r} is not one of {', '.join(modeling.CLASSIFIER_POOLINGS)}")
  return pooling


def write_task_record(directory, task, labels=None, **details):
  """Writes `task.json` (see task_record) beside the checkpoints a training run writes; `details`
  (run_classifier: text_pairs, regression) are what export_model.py reads from it by default."""
  with fileio.open_atomic(run_dir.task_file(directory)) as f:
    json.dump({"task": task, "labels": labels, **details}, f)


def write_thresholds(directory, global_step, labels, thresholds):
  """thresholds.json: a multi-label classifier's per-label thresholds (run_classifier
  --tune_thresholds) for the checkpoint of `global_step`."""
  with fileio.open_atomic(run_dir.thresholds_file(directory)) as f:
    json.dump({"global_step": global_step,
               "thresholds": dict(zip(labels, map(float, thresholds)))}, f, indent=1)


def read_thresholds(directory, labels):
  """(per-label thresholds in `labels` order, the step they were tuned at) from
  directory/thresholds.json, or None when there is none; InputError when it does not hold
  these labels' thresholds (see check_thresholds) at an integer step."""
  path = run_dir.thresholds_file(directory)
  if not fileio.exists(path):
    return None
  record = fileio.load_json(path, "thresholds file")
  found = record.get("thresholds") if isinstance(record, dict) else None
  step = record.get("global_step") if isinstance(record, dict) else None
  if not isinstance(found, dict) or not _is_integer(step):
    raise fileio.InputError(f"{path}: not a thresholds file (an object with global_step, an "
                            "integer, and thresholds, one number per label)")
  missing = [label for label in labels if label not in found]
  if missing or len(found) != len(labels):
    extra = [label for label in found if label not in labels]
    raise fileio.InputError(
        f"{path}: not the thresholds of these labels ("
        + (f"none for {', '.join(map(repr, missing[:3]))}" if missing
           else f"also {', '.join(map(repr, extra[:3]))}")
        + "); add --do_eval --tune_thresholds to tune them for this model")
  return check_thresholds([found[label] for label in labels], labels, path), step


def check_thresholds(values, labels, where):
  """`values`, one decision threshold per label of `labels` (a label is predicted when its
  probability is above it), as a float array; InputError naming `where` unless each is a number
  strictly between 0 and 1: at 0 (or below) the label fires on every example, at 1 (or above)
  on none, and a NaN or a string is no threshold at all."""
  if not isinstance(values, (list, tuple)) or len(values) != len(labels):
    count = len(values) if isinstance(values, (list, tuple)) else "not a list of"
    raise fileio.InputError(f"{where}: {count} thresholds for {len(labels)} labels")
  for label, value in zip(labels, values):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
      raise fileio.InputError(f"{where}: the threshold of label {label!r} is {value!r}, not a "
                              "number")
    if not 0 < value < 1:
      raise fileio.InputError(
          f"{where}: the threshold of label {label!r} is {value!r}: the label would be predicted "
          f"for {'every' if value <= 0 else 'no'} example; a threshold is between 0 and 1")
  return np.array(values, np.float64)


def _is_integer(value):
  return isinstance(value, int) and not isinstance(value, bool)


def write_model_files(directory, config, vocab_file):
  """bert_config.json and vocab.txt beside the checkpoints a training run writes, so that the
  fine-tuned model is whole in its folder: export_model.py and the scripts' --init_checkpoint
  find them there by default. A file already there with the same content is left alone (it may
  be this run's own --bert_config_file or --vocab_file)."""
  path = run_dir.config_file(directory)
  if not (fileio.exists(path) and
          modeling.BertConfig.from_json_file(path).to_dict() == config.to_dict()):
    with fileio.open_atomic(path) as f:
      f.write(config.to_json_string())
  target = run_dir.vocab_file(directory)
  with fileio.open_input(vocab_file, "rb") as source:
    vocab = source.read()
  if not fileio.exists(target) or _read_bytes(target) != vocab:
    with fileio.open_atomic(target, "wb") as f:
      f.write(vocab)


def _read_bytes(path):
  with fileio.open_input(path, "rb") as f:
    return f.read()
