"""LiteRT (TFLite) models for CPU serving: the encoder, the sentence embedder and a fine-tuned
classifier, in float32 or with int8 weights, converted here and run by extract_features.py and
run_classifier.py (--litert_model).

A LiteRT model directory (export_model.py --format=litert) holds `model.tflite`, the
`vocab.txt` and `bert_config.json` of its model and `litert_model.json`, what the model is (kind,
quantization, casing, labels, pooling, the checkpoint's step). The model takes token ids, not
text: its one signature `serving_default` has int32 [batch, seq] inputs `input_word_ids`,
`input_mask` and `input_type_ids`, any batch and length up to the config's positions, and the
host tokenizes (tokenization.FullTokenizer with the directory's vocab and casing). Raw-string
input cannot be kept: the in-graph tokenizer of the SavedModels (graph_tokenization.py) uses
TensorFlow string and regex ops that LiteRT's built-in op set lacks; they would need the
TensorFlow ("Flex") delegate, which the LiteRT runtime packages do not ship.

Quantization "int8" is LiteRT's dynamic-range quantization: every matmul weight is stored as
int8 with a per-channel scale and the activations are quantized per batch at run time, so no
calibration data is needed and the file is about a quarter of float32's. LayerNorm, softmax and
GELU stay float32. (Full-integer quantization, activations calibrated in advance, loses more
accuracy on BERT's LayerNorm and attention outputs and is not offered.)

The outputs by kind: encoder `sequence_output` [batch, seq, hidden], `pooled_output` [batch,
hidden] and `encoder_outputs` [batch, layers, seq, hidden] (every layer, batch first);
embedder `embedding` [batch, hidden]; classifier `logits` [batch, labels] float32.
"""

import hashlib
import json
import os
import re

import numpy as np
import tensorflow as tf

from bert_tf2 import fileio
from bert_tf2 import processes
from bert_tf2 import run_dir

MODEL_FILE = "model.tflite"
INFO_FILE = "litert_model.json"
ENTRIES = frozenset((MODEL_FILE, INFO_FILE, "vocab.txt", "bert_config.json"))
INPUTS = ("input_word_ids", "input_mask", "input_type_ids")
QUANTIZATIONS = ("none", "int8")
KINDS = ("encoder", "embedder", "classifier")
# The feature names of the scripts' pipelines for each model input.
_FEATURE_NAMES = {"input_word_ids": ("input_word_ids", "input_ids"),
                  "input_mask": ("input_mask",),
                  "input_type_ids": ("input_type_ids", "segment_ids")}


def input_signature():
  return [tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUTS]


def convert(function, owner, quantize):
  """The .tflite bytes of `function` (a tf.function of the three int32 inputs, input_signature
  given, returning a dict of float32 tensors; `owner` the module holding its variables): built-in
  LiteRT ops only, int8 weights when `quantize` is "int8"."""
  if quantize not in QUANTIZATIONS:
    raise fileio.InputError(f"--quantize={quantize}: one of {', '.join(QUANTIZATIONS)}")
  converter = converter_class().from_concrete_functions([function.get_concrete_function()], owner)
  converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
  if quantize == "int8":
    converter.optimizations = [tf.lite.Optimize.DEFAULT]  # dynamic range: int8 weights
  with processes.filtered_stderr(_CONVERTER_NOISE):
    return converter.convert()


# The converter's C++ warnings that every conversion prints: options its own Python front end
# passes and its MLIR back end ignores (TF_CPP_MIN_LOG_LEVEL=0 shows them).
_CONVERTER_NOISE = re.compile(processes.cpp_log_line(
    "tf_tfl_flatbuffer_helpers", r"Ignored (output_format|drop_control_dependency)\."))


def converter_class():
  """The TensorFlow-graph-to-LiteRT converter: tf.lite.TFLiteConverter, in the TensorFlow wheel
  (2.20 and 2.21 carry it). LiteRT's own packages run models but take no TensorFlow graph:
  ai-edge-litert is the runtime (interpreter.py), litert-converter builds models from MLIR /
  StableHLO, litert-torch converts PyTorch. A TensorFlow whose wheel no longer carries tf.lite
  is one line saying which one to export with (docs/features-and-serving.md)."""
  converter = getattr(getattr(tf, "lite", None), "TFLiteConverter", None)
  if converter is None:
    raise fileio.InputError(
        f"--format=litert: TensorFlow {tf.__version__} has no tf.lite converter (the LiteRT "
        "packages convert no TensorFlow graph); export the LiteRT model with TensorFlow 2.21 "
        "or 2.20 (requirements.txt), or export a SavedModel (--format=saved_model)")
  return converter


def is_litert_directory(path):
  """True when `path` holds a LiteRT model directory and nothing else (replacing it loses no
  user file)."""
  try:
    names = set(fileio.listdir(path))
  except OSError:
    return False
  return MODEL_FILE in names and INFO_FILE in names and names <= ENTRIES


def sha256(content):
  """The hex SHA-256 of a model's bytes, as litert_model.json records it."""
  return hashlib.sha256(content).hexdigest()


def _read_and_hash(path, keep):
  """(hex SHA-256 of the file's bytes, the bytes when `keep` else None), read in 1 MiB pieces."""
  digest, pieces = hashlib.sha256(), []
  with fileio.open_input(path, "rb") as f:
    while True:
      piece = f.read(1 << 20)
      if not piece:
        break
      digest.update(piece)
      if keep:
        pieces.append(piece)
  return digest.hexdigest(), (b"".join(pieces) if keep else None)


def read_info(directory, flag="litert_model"):
  """The litert_model.json of a LiteRT model directory; InputError naming the flag when it is
  not one."""
  path = os.path.join(directory, INFO_FILE)
  if not fileio.isdir(directory):
    raise fileio.InputError(f"--{flag}={directory} is not a directory (a LiteRT model directory "
                            "from export_model.py --format=litert)")
  for name in (MODEL_FILE, INFO_FILE, "vocab.txt"):
    if not fileio.isfile(os.path.join(directory, name)):
      raise fileio.InputError(f"--{flag}={directory} has no {name}: not a LiteRT model "
                              "directory of export_model.py --format=litert")
  try:
    with fileio.open_input(path) as f:
      info = json.load(f)
    if not isinstance(info, dict) or info.get("kind") not in KINDS:
      raise ValueError(f"its kind is not one of {', '.join(KINDS)}")
    for key, value in info.items():
      if key in _INFO_TYPES and value is not None and not _INFO_TYPES[key](value):
        raise ValueError(f"{key} is {value!r}, not {_INFO_TYPE_NAMES[key]}")
  except (OSError, ValueError, UnicodeDecodeError) as e:
    raise fileio.InputError(f"{path}: not a LiteRT model description: {e}") from None
  return info


# The fields of litert_model.json export_model.py writes, with the type each must have (a file
# edited by hand or by another program is refused in one line, not a traceback later).
_is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)
_INFO_TYPES = {
    "quantize": lambda v: v in QUANTIZATIONS, "do_lower_case": lambda v: isinstance(v, bool),
    "max_seq_length": _is_int, "global_step": _is_int,
    "model_sha256": lambda v: isinstance(v, str),
    "labels": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "regression": lambda v: isinstance(v, bool), "multi_label": lambda v: isinstance(v, bool),
    "text_pairs": lambda v: isinstance(v, bool), "classifier_pooling": lambda v: isinstance(v, str),
    "thresholds": lambda v: isinstance(v, list),  # each checked against the labels where used
    "label_delimiter": lambda v: isinstance(v, str) and v != "",
    "pooling": lambda v: isinstance(v, str), "normalize": lambda v: isinstance(v, bool)}
_INFO_TYPE_NAMES = {
    "quantize": f"one of {', '.join(QUANTIZATIONS)}", "max_seq_length": "an integer",
    "global_step": "an integer", "labels": "a list of label names", "thresholds": "a list",
    "label_delimiter": "a non-empty string", "model_sha256": "a string",
    "classifier_pooling": "a string", "pooling": "a string",
    **{key: "true or false" for key in ("do_lower_case", "regression", "multi_label",
                                        "text_pairs", "normalize")}}


class Model:
  """A LiteRT model directory, run on the CPU by LiteRT's interpreter (XNNPACK kernels) with
  `num_threads` threads (default: one per CPU).

  `model(input_ids, input_mask, input_type_ids)` -> dict of numpy outputs. `predict` has
  training.Trainer.predict's contract (the scripts' prediction loops take either): batches of a
  dataset in, each cut to its longest real sequence, outputs and features out as numpy.
  """

  def __init__(self, directory, num_threads=None, flag="litert_model"):
    self.directory = directory
    self.info = read_info(directory, flag)
    self.kind = self.info["kind"]
    self.vocab_file = run_dir.vocab_file(directory)
    self.config_file = run_dir.config_file(directory)
    self.do_lower_case = bool(self.info.get("do_lower_case", True))
    model_path = os.path.join(directory, MODEL_FILE)
    # Checked against the checksum the export recorded: a model with bytes flipped in its weights
    # loads and runs, giving other numbers without a word.
    digest, content = _read_and_hash(model_path, keep=fileio.is_remote(model_path))
    recorded = self.info.get("model_sha256")
    if recorded is not None and recorded != digest:
      raise fileio.InputError(
          f"{model_path}: its bytes are not those export_model.py wrote (SHA-256 {digest[:12]}..., "
          f"{INFO_FILE} records {str(recorded)[:12]}...): damaged or replaced; export the model "
          "again")
    try:
      # The runtime reads local files only: a remote model's bytes, read here.
      source = {"model_content": content} if content is not None else {"model_path": model_path}
      self._interpreter = _interpreter_class()(**source, num_threads=num_threads or os.cpu_count())
      self._runner = self._interpreter.get_signature_runner("serving_default")
    except (ValueError, RuntimeError) as e:
      raise fileio.InputError(f"{model_path}: not a LiteRT model this runtime can load: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else e}"
                              ) from None
    # What the scripts ask of a trainer when they only predict.
    self.strategy = tf.distribute.get_strategy()
    self.is_chief = True
    self.num_workers = 1

  def output_widths(self):
    """{output name: its last dimension} of the model's signature (e.g. a classifier's logits:
    its label count), read from the model itself, not its description."""
    details = self._runner.get_output_details()
    return {name: int(d["shape"][-1]) if len(d["shape"]) else 1 for name, d in details.items()}

  def __call__(self, input_ids, input_mask, input_type_ids):
    inputs = {"input_word_ids": input_ids, "input_mask": input_mask,
              "input_type_ids": input_type_ids}
    return self._runner(**{k: np.ascontiguousarray(v, np.int32) for k, v in inputs.items()})

  def predict(self, dataset_fn, output_keys):
    """Yields, for each batch of `dataset_fn(input_context)`, a dict of numpy arrays: the outputs
    named in `output_keys` and the batch's features, cut to the batch's longest real sequence."""
    dataset = dataset_fn(tf.distribute.InputContext())
    for features in dataset.as_numpy_iterator():
      length = max(1, int(np.max(np.sum(features["input_mask"], axis=-1), initial=0)))
      batch = {k: (v[:, :length] if np.ndim(v) == 2 and k in _SEQUENCE_FEATURES else v)
               for k, v in features.items()}
      inputs = [_feature(batch, name) for name in INPUTS]
      outputs = self(*inputs)
      batch.update({k: outputs[k] for k in output_keys})
      yield batch


def open_for_script(directory, kinds, what, checkpoint_flags, do_lower_case=None):
  """The Model of a script's --litert_model=`directory`, which must be one of `kinds` (for `what`
  the script does). `checkpoint_flags` ({name: value}) are the flags that name a model another
  way (--init_checkpoint, --vocab_file, ...): none may be given besides it, since the directory
  holds the weights, config and vocab. `do_lower_case`: --do_lower_case when it was given, which
  must then be the casing the model was exported with (`Model.do_lower_case`)."""
  for name, value in checkpoint_flags.items():
    if value:
      raise fileio.InputError(f"--{name} with --litert_model: the LiteRT model directory holds "
                              "its weights, config and vocab; give one or the other")
  model = Model(directory)
  if model.kind not in kinds:
    raise fileio.InputError(f"--litert_model={directory} is a LiteRT {model.kind}; {what} needs "
                            f"a LiteRT {' or '.join(kinds)} (export_model.py --format=litert "
                            f"--model_type={kinds[0]})")
  if do_lower_case is not None and do_lower_case != model.do_lower_case:
    raise fileio.InputError(f"--do_lower_case={do_lower_case} does not match "
                            f"--litert_model={directory} (exported with "
                            f"do_lower_case={model.do_lower_case})")
  return model


def _interpreter_class():
  """LiteRT's interpreter (the ai-edge-litert package, requirements.txt); TensorFlow's
  tf.lite.Interpreter, the same runtime but deprecated, where that package is missing."""
  try:
    from ai_edge_litert import interpreter  # pylint: disable=g-import-not-at-top
    return interpreter.Interpreter
  except ImportError:
    return tf.lite.Interpreter


_SEQUENCE_FEATURES = frozenset(n for names in _FEATURE_NAMES.values() for n in names)


def _feature(features, input_name):
  for name in _FEATURE_NAMES[input_name]:
    if name in features:
      return features[name]
  if input_name == "input_type_ids":
    return np.zeros_like(features["input_mask"])
  raise KeyError(input_name)
