"""What the fine-tuning scripts (run_classifier, run_ner, run_squad, run_swag) share around their
own data: the checks a run starts with, outputs checked against inputs before any work, the config
and the tokenizer checked against each other, the training steps, padded sequences, writing and
reading feature records, and running a model over records padded to whole batches.

Plain values in, plain values out (it reads no flag): each script still reads its own data, turns
it into features and reads top to bottom; what differs between tasks stays in the task's script.
"""

import glob
import os

import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import fileio
from bert_tf2 import input_pipeline
from bert_tf2 import tokenization
from bert_tf2 import training


def run(main, seed, modes, output_dir, /, **required):
  """Calls a fine-tuning script's `main()` after what every run starts with: the flag checks (an
  InputError unless one of `modes`, {"do_train": value, ...}, is set, or naming the first of
  `required`, flag=value, without a value) and TensorFlow's global `seed`. A run that fails
  before writing leaves no empty `output_dir` behind (fileio.check_outputs makes it, to prove
  that it can)."""
  if not any(modes.values()):
    raise fileio.InputError(f"at least one of {', '.join(f'--{m}' for m in modes)} must be set")
  check_required(**required)
  tf.random.set_seed(seed)
  with fileio.no_new_empty_directories(*[output_dir] if output_dir else []):
    main()


def check_required(**values):
  """InputError naming the first flag (keyword) of `values` that has no value."""
  for name, value in values.items():
    if not value:
      raise fileio.InputError(f"--{name} is required")


def check_files(output_dir, outputs, inputs, vocab_file, bert_config_file, init_checkpoint):
  """fileio.check_outputs for a fine-tuning run, before any work: none of `outputs` (file names
  in output_dir; a record file's .key.json comes with it) may be an input: `inputs` ((flag, path
  or paths) pairs of the task's own), the vocab, the config or the checkpoint (prefix and files).
  Returns whether output_dir already holds checkpoints (a run to resume, a model to evaluate)."""
  names = [*outputs, *(f"{name}.key.json" for name in outputs if name.endswith(".tf_record"))]
  fileio.check_outputs(
      files=[("output_dir", [os.path.join(output_dir, name) for name in names])],
      inputs=[*inputs, ("vocab_file", vocab_file), ("bert_config_file", bert_config_file),
              ("init_checkpoint", [init_checkpoint, *glob.glob(glob.escape(init_checkpoint) + ".*")]
               if init_checkpoint else None)],
      directories=[("output_dir", output_dir)])
  return bool(training.checkpoint_numbers(output_dir))


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
    config, vocab_file = checkpoints.fine_tuning_setup(
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
    return training.init_fn_for(model, init_checkpoint)
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
  tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case)
  tokenization.check_vocab_fits(max(tokenizer.vocab.values(), default=-1) + 1, config, vocab_file,
                                config_source)
  if pairs and config.type_vocab_size < 2:
    raise fileio.InputError(f"{config_source}: type_vocab_size={config.type_vocab_size}, but "
                            f"{pairs}")
  return tokenizer


def train_steps(train_examples, strategy, train_batch_size, accumulation_steps, num_train_epochs,
                warmup_proportion):
  """(num_train_steps, num_warmup_steps, per-replica batch) of training on `train_examples`
  (training.fine_tuning_steps, training.per_replica_batch_size: checked before any record is
  written); (1, 0, None) without training (None): the optimizer is then only restored."""
  if train_examples is None:
    return 1, 0, None
  batch = training.per_replica_batch_size(train_batch_size, strategy, "train_batch_size",
                                          accumulation_steps)
  return (*training.fine_tuning_steps(len(train_examples), train_batch_size, num_train_epochs,
                                      warmup_proportion), batch)


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
