"""Runs a SavedModel that export_model.py wrote on inputs given as flags and prints its outputs.

The quiet way to query an export: `saved_model_cli run` prints about sixteen lines of TensorFlow's
start-up notices and deprecation warnings around the result; this prints one JSON object.

  python query_model.py --export_dir=/tmp/mrpc_served \\
      --feed='text_a=The cat sat.' --feed='text_b=A cat was sitting.'

Each --feed is NAME=VALUE for one input of the serving signature: a text input takes the text
(one example); a numeric one a JSON array, batch first (`--feed='input_word_ids=[[101, 102]]'`).
The output is one JSON object on stdout, each output of the signature as a (nested) list, texts
decoded as UTF-8. A LiteRT model directory is run by the scripts' --litert_model instead.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import json
import re

import tensorflow as tf
from absl import flags

from bert_tf2 import litert
from bert_tf2 import processes
from bert_tf2 import script_flags

FLAGS = flags.FLAGS

# What TensorFlow's C++ runtime prints when a call fails on its inputs (the error line says it).
_FAILED_CALL_NOISE = re.compile(processes.cpp_log_line("local_rendezvous") + r"|\t \[\[")


def define_flags():
  script_flags.define_export_dir_flag()
  flags.DEFINE_multi_string("feed", [], "NAME=VALUE, once per input of the signature: a text "
                            "for a string input, a JSON array (batch first) for a numeric one.")
  flags.DEFINE_string("signature", "serving_default", "The signature to run.")


def query(export_dir, inputs, signature_name="serving_default"):
  """{output name: value as plain Python} of the signature `signature_name` of the SavedModel
  in `export_dir`, run on `inputs` ([NAME=VALUE, ...], as the --feed flags)."""
  if fileio.isdir(export_dir) and litert.is_litert_directory(export_dir):
    raise fileio.InputError(f"--export_dir={export_dir} is a LiteRT model directory: run it with "
                            "a script's --litert_model (run_classifier.py, extract_features.py)")
  if not (fileio.isdir(export_dir) and tf.saved_model.contains_saved_model(export_dir)):
    raise fileio.InputError(f"--export_dir={export_dir} holds no SavedModel (saved_model.pb); "
                            "give a directory export_model.py wrote")
  model = tf.saved_model.load(export_dir)
  if signature_name not in model.signatures:
    raise fileio.InputError(f"--signature={signature_name}: {export_dir} has "
                            f"{', '.join(sorted(model.signatures)) or 'no signatures'}")
  signature = model.signatures[signature_name]
  values = _inputs(inputs, signature.structured_input_signature[1])
  try:
    with processes.filtered_stderr(_FAILED_CALL_NOISE):
      outputs = signature(**values)
  except (TypeError, ValueError, tf.errors.InvalidArgumentError) as e:
    # (The whole text: the one error line picks its status line, not "Graph execution error:".)
    message = (getattr(e, "message", None) or str(e)).strip()
    raise fileio.InputError(f"--feed: the model does not take these values: {message}") from None
  return {name: _plain(value.numpy()) for name, value in sorted(outputs.items())}


def _inputs(pairs, specs):
  """The tensors of the --feed NAME=VALUE pairs for the signature's input `specs`."""
  values = {}
  expected = ", ".join(f"{name} ({spec.dtype.name})" for name, spec in sorted(specs.items()))
  for pair in pairs:
    name, equals, text = pair.partition("=")
    if not equals or name not in specs:
      raise fileio.InputError(f"--feed={pair}: give NAME=VALUE for one of the inputs {expected}")
    if name in values:
      raise fileio.InputError(f"--feed: {name} is given twice")
    spec = specs[name]
    if spec.dtype == tf.string:
      value = [text] if spec.shape.rank == 1 else text
    else:
      try:
        value = json.loads(text)
      except ValueError:
        raise fileio.InputError(f"--feed={pair}: {name} ({spec.dtype.name}) takes a JSON array, "
                                "batch first, e.g. [[101, 102]]") from None
    try:
      values[name] = tf.constant(value, spec.dtype)
    except (TypeError, ValueError) as e:
      raise fileio.InputError(f"--feed={pair}: not {spec.dtype.name} values ({e})") from None
  missing = sorted(set(specs) - set(values))
  if missing:
    raise fileio.InputError(f"--feed: give {', '.join(missing)} too (the inputs are "
                            f"{expected})")
  return values


def _plain(value):
  """A numpy value as JSON-ready lists, bytes decoded as UTF-8."""
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  if hasattr(value, "tolist"):
    return _plain(value.tolist())
  if isinstance(value, list):
    return [_plain(v) for v in value]
  return value


def main(_):
  fileio.require(export_dir=FLAGS.export_dir)
  print(json.dumps(query(FLAGS.export_dir, FLAGS.feed, FLAGS.signature), ensure_ascii=False))


def cli():
  """The command line: `python query_model.py` and the `bert-query-model` command."""
  define_flags()
  commands.run_main(main)
