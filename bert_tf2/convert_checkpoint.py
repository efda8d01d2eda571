"""Converts BERT checkpoints among Google TF1, HuggingFace safetensors and this project's format.

One command for every direction:

  python convert_checkpoint.py --input=uncased_L-12_H-768_A-12/bert_model.ckpt \\
      --output=bert-hf --output_format=hf

The input format is recognised (checkpoints.resolve_checkpoint): a TF1 checkpoint prefix, a
directory with `model.safetensors`, or one of this project's checkpoints (a prefix, or a training
--output_dir). The weights go through the project's model, so a conversion is exactly the loaders
and exporters of checkpoints.py: names map by rule, values are copied (HF kernels transposed).
What is converted is the encoder plus the masked-LM / next-sentence heads when the input has them;
fine-tuning heads and optimizer state are left out (and logged).

The config and vocab travel along: from --bert_config_file / --vocab_file, else those beside the
input; written as bert_config.json (TF1, project) or config.json (HF) and vocab.txt. In a TF1
config the tanh GELU is called "gelu", as the original code knows it.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import os
import shutil
import tempfile

import tensorflow as tf
from absl import flags
from absl import logging

from bert_tf2 import checkpoints
from bert_tf2 import modeling
from bert_tf2 import run_dir
from bert_tf2 import script_flags

FLAGS = flags.FLAGS

FORMATS = ("tf1", "hf", "project")
_TANH_GELUS = ("gelu_new", "gelu_tanh")


def define_flags():
  """The flags of convert_checkpoint.py: the shared groups (script_flags) and its own."""
  flags.DEFINE_string("input", None,
                      "Checkpoint to convert: TF1 prefix (bert_model.ckpt), HF directory or "
                      ".safetensors file, or a project checkpoint (prefix or directory).")
  flags.DEFINE_string("output", None,
                      "Where to write: a directory (tf1: DIR/bert_model.ckpt, hf: "
                      "DIR/model.safetensors, project: DIR/ckpt-0) or, for tf1, a prefix "
                      "ending in .ckpt.")
  flags.DEFINE_enum("output_format", None, list(FORMATS), "Format to write.")
  script_flags.define_config_flag()  # of --input
  script_flags.define_vocab_flag()  # copied along
  script_flags.define_overwrite_flag()


def find_sidecars(input_path, bert_config_file=None, vocab_file=None):
  """(config path, vocab path or None) for the input checkpoint."""
  config = checkpoints.config_path(bert_config_file, input_path, input_path)
  vocab = vocab_file or checkpoints.vocab_beside(input_path)
  if vocab_file:
    fileio.check_file(vocab_file, "vocab file")
  elif not fileio.exists(vocab):
    logging.warning("no vocab.txt beside %s: the output has no vocab", input_path)
    vocab = None
  return config, vocab


def _tf1_config(config):
  """The config as the original code reads it: its "gelu" is the tanh form."""
  config = modeling.BertConfig.from_dict(config.to_dict())
  if config.hidden_act in _TANH_GELUS:
    config.hidden_act = "gelu"
  elif config.hidden_act == "gelu_exact":
    logging.warning("hidden_act gelu_exact (erf) has no name in the original TF1 code, whose "
                    "\"gelu\" is the tanh form; bert_config.json keeps \"gelu_exact\"")
  return config


_PROJECT_PREFIX = "ckpt-0"


def write_project_checkpoint(model, directory, config, vocab_file):
  """A checkpoint as this project's training loop writes it (object-based, model=...), as
  ckpt-0 with its `checkpoint` state file.

  Saved in a staging directory and moved in file by file, the state file last: a
  CheckpointManager saving in `directory` itself would delete the checkpoints it finds there.
  """
  remote = fileio.is_remote(directory)
  fileio.makedirs(directory)
  # (A remote directory's staging is local: each file is then uploaded whole, atomic_path.)
  staging = tempfile.mkdtemp(prefix=".ckpt-0.tmp-", dir=None if remote else directory)
  try:
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), staging,
                                         max_to_keep=1)
    manager.save(checkpoint_number=0)
    produced = sorted(os.listdir(staging))
    for name in [n for n in produced if n != "checkpoint"] + ["checkpoint"]:
      if remote:
        with fileio.atomic_path(os.path.join(directory, name)) as tmp:
          shutil.copyfile(os.path.join(staging, name), tmp)
      else:
        os.replace(os.path.join(staging, name), os.path.join(directory, name))
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  with fileio.open_atomic(run_dir.config_file(directory)) as f:
    f.write(config.to_json_string())
  if vocab_file:
    with fileio.atomic_path(run_dir.vocab_file(directory)) as tmp:
      fileio.copy_file(vocab_file, tmp)
  return os.path.join(directory, _PROJECT_PREFIX)


def output_files(output, output_format, with_vocab):
  """Every file a conversion to `output_format` at `output` writes."""
  if output_format == "tf1":
    prefix = output if output.endswith(".ckpt") else os.path.join(output, "bert_model.ckpt")
    directory = fileio.parent(prefix)
    files = [prefix + ".index", prefix + ".data-00000-of-00001",
             run_dir.config_file(directory)]
  elif output_format == "hf":
    directory = output
    files = [run_dir.hf_weights_file(output), run_dir.hf_config_file(output)]
  else:
    directory = output
    files = [os.path.join(output, f"{_PROJECT_PREFIX}.{suffix}")
             for suffix in ("index", "data-00000-of-00001")]
    files += [run_dir.state_file(output), run_dir.config_file(output)]
  return files + ([run_dir.vocab_file(directory)] if with_vocab else [])


def _check_project_output(directory):
  """A project output directory must not hold other checkpoints: its `checkpoint` state file,
  rewritten to name ckpt-0, would hide them (a training run would resume from the conversion)."""
  others = sorted(n for n in (fileio.listdir(directory) if fileio.isdir(directory) else [])
                  if n.startswith("ckpt-") and not n.startswith(_PROJECT_PREFIX + "."))
  if others:
    raise fileio.InputError(f"--output={directory} holds other checkpoints ({others[0]} ...); "
                            "choose a new directory")


def _check_existing(files, output_format, output, overwrite):
  """Output files that exist already belong to another model (or an earlier conversion): refused
  unless `overwrite`, naming the first. With it, a TF1 prefix's stale `.meta` goes too, so the
  directory never mixes two models."""
  existing = [f for f in files if (fileio.exists if fileio.is_remote(f) else os.path.lexists)(f)]
  if existing and not overwrite:
    raise fileio.InputError(f"--output={output}: {existing[0]} exists (another model's "
                            f"checkpoint?); choose a new --output, or pass --overwrite")
  if overwrite and output_format == "tf1":
    meta = files[0][:-len(".index")] + ".meta"
    if fileio.isfile(meta):
      logging.info("Removing %s: it belongs to the checkpoint being replaced", meta)
      fileio.remove(meta)


def convert(input_path, output, output_format, bert_config_file=None, vocab_file=None,
            overwrite=False):
  """Converts `input_path` to `output_format` at `output`; returns the written path."""
  if output_format not in FORMATS:
    raise fileio.InputError(f"--output_format must be one of {', '.join(FORMATS)}")
  if not output:
    raise fileio.InputError("--output is required")
  directory = fileio.parent(output_files(output, output_format, False)[0])
  with fileio.no_new_empty_directories(directory):
    return _convert(input_path, output, output_format, bert_config_file, vocab_file, overwrite)


def _convert(input_path, output, output_format, bert_config_file, vocab_file, overwrite):
  kind, _ = checkpoints.resolve_checkpoint(input_path)
  config_path, vocab = find_sidecars(input_path, bert_config_file, vocab_file)
  # Before any work: no output file may be one of the input's (converting in place would drop
  # the optimizer slots and leave a stale .meta), compared by real path.
  input_files = checkpoints.checkpoint_files(input_path)
  state = run_dir.state_file(input_path)
  if fileio.isdir(input_path) and fileio.isfile(state):
    input_files.append(state)
  fileio.check_outputs(files=[("output", f) for f in output_files(output, output_format, vocab)],
                       inputs=[("input", input_files),
                               ("bert_config_file" if bert_config_file else "input", config_path),
                               ("vocab_file" if vocab_file else "input", vocab)])
  if output_format == "project":
    _check_project_output(output)
  _check_existing(output_files(output, output_format, vocab), output_format, output, overwrite)
  config = modeling.BertConfig.from_json_file(config_path)
  model = checkpoints.load_pretrainer_or_encoder(config, input_path)
  logging.info("Converting %s (%s) to %s: %s", input_path, kind, output_format, output)
  try:
    if output_format == "tf1":
      prefix = output if output.endswith(".ckpt") else os.path.join(output, "bert_model.ckpt")
      return checkpoints.export_tf1_checkpoint(model, prefix, _tf1_config(config), vocab)
    if output_format == "hf":
      return checkpoints.export_hf_checkpoint(model, output, config, vocab)
    return write_project_checkpoint(model, output, config, vocab)
  except tf.errors.OpError as e:  # A full disk: TensorFlow names only its temporary file.
    reason = e.message.split("}} ")[-1].strip().splitlines()[0]
    raise fileio.InputError(f"--output={output}: cannot write the checkpoint: {reason}") from None


def main(_):
  logging.set_verbosity(logging.INFO)
  fileio.require(input=FLAGS.input, output=FLAGS.output, output_format=FLAGS.output_format)
  path = convert(FLAGS.input, FLAGS.output, FLAGS.output_format, FLAGS.bert_config_file,
                 FLAGS.vocab_file, FLAGS.overwrite)
  print(f"Wrote {FLAGS.output_format} checkpoint: {path}")


def cli():
  """The command line: `python convert_checkpoint.py` and the `bert-convert-checkpoint` command."""
  define_flags()
  commands.run_main(main)
