"""Checkpoint I/O: original Google TF1 checkpoints, HuggingFace safetensors, this project's own.

Every model variable is named as in the original (see modeling.py), so:
- a Google TF1 checkpoint (`bert_model.ckpt`) loads by variable name, optimizer slots skipped;
- a HuggingFace checkpoint loads through a rule that rewrites those names (`layer_3` <->
  `layer.3`, `kernel` <-> transposed `weight`, ...), no torch needed;
- this project's training checkpoints (`tf.train.Checkpoint`, object-based) load by object path, so
  a fine-tuning model picks up the `bert` encoder of a pre-training checkpoint;
- any model exports back to the TF1 name format and to safetensors, for other tools.
`init_from_checkpoint` tells the formats apart and logs what was and was not initialised.
"""

import functools
import json
import os
import re
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf2 import fileio
from bert_tf2 import modeling
from bert_tf2 import run_dir

_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_EMBEDDING_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def variable_name(variable):
  """The original checkpoint name of a model variable ("bert/pooler/dense/kernel")."""
  return variable.name.split(":")[0]


def variables_by_name(module):
  return {variable_name(v): v for v in module.variables}


def tf1_to_hf_name(name):
  """Original name -> HuggingFace key, e.g. bert/encoder/layer_0/output/LayerNorm/gamma ->
  bert.encoder.layer.0.output.LayerNorm.weight. The `bert.` prefix is kept; loaders also try
  without it (HF's BertModel saves without, BertForPreTraining with)."""
  name = re.sub(r"layer_(\d+)", r"layer.\1", name)
  name = {"cls/predictions/output_bias": "cls/predictions/bias",
          "cls/seq_relationship/output_weights": "cls/seq_relationship/weight",
          "cls/seq_relationship/output_bias": "cls/seq_relationship/bias"}.get(name, name)
  parts = name.split("/")
  leaf = parts[-1]
  if leaf in ("kernel", "gamma"):
    parts[-1] = "weight"
  elif leaf == "beta":
    parts[-1] = "bias"
  elif leaf in _EMBEDDING_TABLES:
    parts.append("weight")
  return ".".join(parts)


def _hf_transposed(name):
  """HF (torch Linear) stores dense kernels [out, in]; the original [in, out]."""
  return name.endswith("/kernel")


def _check_shape(name, variable, value, source):
  if tuple(variable.shape) != tuple(value.shape):
    raise fileio.InputError(
        f"{source}: variable {name} has shape {list(value.shape)} in the checkpoint but "
        f"{variable.shape.as_list()} in the model; does the config match the checkpoint?")


class InitReport:
  """What `init_from_checkpoint` did: loaded / not-in-checkpoint / unused-in-checkpoint names."""

  def __init__(self, source, loaded, missing, unused):
    self.source, self.loaded, self.missing, self.unused = source, loaded, missing, unused

  def log(self):
    logging.info("Initialised %d variables from %s", len(self.loaded), self.source)
    for name in self.missing:
      logging.info("  not in checkpoint (left at random init): %s", name)
    for name in self.unused:
      logging.info("  in checkpoint but not used by this model: %s", name)


def _assign_all(targets, source):
  """targets: {model name: (variable, numpy value)}."""
  for name, (variable, value) in targets.items():
    _check_shape(name, variable, value, source)
    variable.assign(value.astype(variable.dtype.as_numpy_dtype))


def _is_optimizer_slot(name):
  return (name.endswith(("/adam_m", "/adam_v", "/lamb_m", "/lamb_v", "/Momentum"))
          or name == "global_step" or ".OPTIMIZER_SLOT" in name)


def checkpoint_files(path):
  """The files a checkpoint (anything `resolve_checkpoint` accepts) is read from: the index and
  data files of a prefix, or the safetensors file; for the outputs-vs-inputs check."""
  kind, resolved = resolve_checkpoint(path)
  if kind == "hf":
    return [resolved]
  return [resolved + ".index"] + sorted(tf.io.gfile.glob(resolved + ".data-*"))


def _damaged(prefix, error):
  """InputError for a checkpoint whose index or data file cannot be read (truncated, corrupt or
  missing shard), naming its files: TensorFlow's own message often names neither."""
  data = sorted(tf.io.gfile.glob(prefix + ".data-*")) or [prefix + ".data-00000-of-00001"]
  message = getattr(error, "message", None) or str(error) or type(error).__name__
  return fileio.InputError(f"checkpoint {prefix} is damaged or incomplete ({prefix}.index, "
                           f"{', '.join(data)}): {message.strip().splitlines()[0]}")


damaged = _damaged  # for the modules that restore a checkpoint themselves (fine_tuning's best/)


def _reader(prefix):
  try:
    return tf.train.load_checkpoint(prefix)
  except (tf.errors.OpError, ValueError, IndexError) as e:
    raise _damaged(prefix, e) from None


def _tensor(reader, name, prefix):
  # A truncated data file raises IndexError ("Read less bytes than requested"), a flipped byte a
  # DataLossError, a missing shard a NotFoundError.
  try:
    return reader.get_tensor(name)
  except (tf.errors.OpError, ValueError, IndexError) as e:
    raise _damaged(prefix, e) from None


def assign_from_tf1(prefix, assignment_map):
  """Assigns each variable of {checkpoint name: variable} its value in the name-based checkpoint
  `prefix`; a name the checkpoint lacks or a shape that differs is an error naming it."""
  reader = _reader(prefix)
  available = reader.get_variable_to_shape_map()
  absent = sorted(n for n in assignment_map if n not in available)
  if absent:
    raise fileio.InputError(f"checkpoint {prefix} has no variable {', '.join(absent)}")
  _assign_all({n: (v, _tensor(reader, n, prefix)) for n, v in assignment_map.items()}, prefix)


def load_tf1_checkpoint(module, prefix):
  """Loads an original Google (name-based) checkpoint into `module` by variable name."""
  available = _reader(prefix).get_variable_to_shape_map()
  model = variables_by_name(module)
  targets = {n: v for n, v in model.items() if n in available}
  assign_from_tf1(prefix, targets)
  return InitReport(prefix, sorted(targets), sorted(set(model) - set(targets)),
                    sorted(n for n in available if n not in model and not _is_optimizer_slot(n)))


def load_hf_checkpoint(module, path):
  """Loads HuggingFace BERT weights (`model.safetensors`) into `module`."""
  from safetensors.numpy import load, load_file  # pylint: disable=g-import-not-at-top
  try:
    if fileio.is_remote(path):  # safetensors reads local files only: the bytes, read here
      with fileio.open_input(path, "rb") as f:
        tensors = load(f.read())
    else:
      tensors = load_file(path)
  except Exception as e:  # safetensors raises its own error types for corrupt headers
    raise fileio.InputError(f"{path}: not a readable safetensors file: {e}") from None
  # Older HF checkpoints name LayerNorm parameters gamma/beta.
  tensors = {re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight",
                    re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)): v
             for k, v in tensors.items()}
  model = variables_by_name(module)
  targets, used = {}, set()
  for name, variable in model.items():
    key = tf1_to_hf_name(name)
    candidates = [key, key[len("bert."):]] if key.startswith("bert.") else [key]
    if name == "cls/predictions/output_bias":
      candidates.append("cls.predictions.decoder.bias")
    found = next((k for k in candidates if k in tensors), None)
    if found is None:
      continue
    value = tensors[found]
    targets[name] = (variable, value.T if _hf_transposed(name) else value)
    used.add(found)
  _assign_all(targets, path)
  unused = sorted(k for k in tensors if k not in used and not k.endswith("position_ids")
                  and k != "cls.predictions.decoder.weight")  # decoder is tied to the embeddings
  return InitReport(path, sorted(targets), sorted(set(model) - set(targets)), unused)


def _object_paths(module):
  """{object path ("bert/encoder/layers/0/..."): variable} as tf.train.Checkpoint names them."""
  paths = {}
  for path, variable in module._flatten(  # pylint: disable=protected-access
      predicate=lambda v: isinstance(v, tf.Variable), with_path=True):
    paths["/".join(str(p) for p in path)] = variable
  return paths


def load_project_checkpoint(module, prefix):
  """Loads a checkpoint written by this project's training loop (tf.train.Checkpoint with the
  model under `model`) by object path; optimizer state and unknown heads are skipped."""
  reader = _reader(prefix)
  available = {k[len("model/"):-len(_VALUE_SUFFIX)]: k
               for k in reader.get_variable_to_shape_map()
               if k.startswith("model/") and k.endswith(_VALUE_SUFFIX) and ".OPTIMIZER_SLOT" not in k}
  paths = _object_paths(module)
  targets = {variable_name(v): (v, _tensor(reader, available[p], prefix))
             for p, v in paths.items() if p in available}
  _assign_all(targets, prefix)
  loaded_paths = set(p for p in paths if p in available)
  return InitReport(prefix, sorted(targets),
                    sorted(variable_name(v) for p, v in paths.items() if p not in available),
                    sorted(p for p in available if p not in loaded_paths))


# A fine-tuning run with --keep_best_checkpoint_metric keeps its best checkpoint in
# output_dir/best/ (a whole model folder) and every evaluation in output_dir/best_checkpoint.json.
BEST_DIRECTORY = run_dir.BEST_DIRECTORY
BEST_STATE = run_dir.BEST_STATE
_ANNOUNCED = set()  # the run folders whose best checkpoint the log has named


def read_best_state(output_dir):
  """output_dir/best_checkpoint.json (the record of evaluations during training), or None."""
  path = run_dir.best_state_file(output_dir)
  if not fileio.exists(path):
    return None
  state = fileio.load_json(path, "record of evaluations during training")
  if not (isinstance(state, dict) and isinstance(state.get("evaluations"), list)
          and isinstance(state.get("without_improvement"), int)
          and (state.get("best_step") is None or (isinstance(state["best_step"], int)
                                                  and not isinstance(state["best_step"], bool)))
          and isinstance(state.get("metric"), str)):
    raise fileio.InputError(f"{path}: not the record of evaluations during training (an object "
                            "with metric, evaluations, without_improvement and best_step); remove "
                            "it to start the record again")
  return state


def best_checkpoint(output_dir, instead):
  """(checkpoint path, step, metric, value) of the best checkpoint kept in output_dir/best/, or
  None when the run kept none. A best checkpoint its record names but best/ does not hold whole
  (deleted, its index gone) is an InputError saying so and what to give `instead` for the latest:
  never a quiet fallback to another checkpoint than the run's evaluation would use."""
  state = read_best_state(output_dir)
  if not state or state.get("best_step") is None:
    return None
  best = run_dir.best_directory(output_dir)
  path = tf.train.latest_checkpoint(best) if fileio.isdir(best) else None
  if not path:
    raise fileio.InputError(
        f"{best}: the best checkpoint of this run (step {state['best_step']}, by "
        f"{state['metric']}, recorded in {run_dir.best_state_file(output_dir)}) is missing or "
        f"incomplete; to use the latest checkpoint instead, give {instead}")
  step = int(path.rsplit("-", 1)[-1])
  return path, step, state["metric"], state["best_value"] if step == state["best_step"] else None


def resolve_checkpoint(path):
  """-> (format, path) with format "tf1", "project" or "hf". Accepts a checkpoint prefix, a
  `.safetensors` file, or a directory holding one of them.

  A fine-tuning run's folder that kept a best checkpoint means that one (the checkpoint its own
  evaluation and prediction use), said in the log; its other checkpoints are named by prefix
  (DIR/ckpt-N)."""
  if not path:
    raise fileio.InputError("no checkpoint given")
  if fileio.isdir(path):
    if fileio.exists(run_dir.hf_weights_file(path)):
      return "hf", run_dir.hf_weights_file(path)
    best = best_checkpoint(path, instead=f"the checkpoint's prefix ({path}/ckpt-N)")
    if best:
      if path not in _ANNOUNCED:  # once, though a script resolves its checkpoint several times
        _ANNOUNCED.add(path)
        logging.info("%s: the run's best checkpoint, %s (step %d, %s=%s)", path, best[0],
                     best[1], best[2], best[3])
      return resolve_checkpoint(best[0])
    latest = tf.train.latest_checkpoint(path)
    if latest:
      return resolve_checkpoint(latest)
    if fileio.exists(os.path.join(path, "bert_model.ckpt.index")):
      return "tf1", os.path.join(path, "bert_model.ckpt")
    raise fileio.InputError(f"no checkpoint found in directory {path} (looked for "
                            "model.safetensors, a `checkpoint` state file, bert_model.ckpt)")
  if path.endswith(".safetensors"):
    fileio.check_file(path, "checkpoint")
    return "hf", path
  if not fileio.exists(path + ".index"):
    raise fileio.InputError(f"checkpoint not found: {path} (no {path}.index)")
  try:
    keys = tf.train.list_variables(path)
  except (tf.errors.OpError, ValueError, IndexError) as e:
    raise _damaged(path, e) from None
  return ("project" if any(k == _OBJECT_GRAPH_KEY for k, _ in keys) else "tf1"), path


def init_fn_for(module, init_checkpoint):
  """A callable that loads --init_checkpoint into `module` (None when no checkpoint given): what
  Trainer.restore_or_initialize and Trainer.train call when output_dir has no checkpoint yet."""
  if not init_checkpoint:
    return None
  return lambda: init_from_checkpoint(module, init_checkpoint)


def init_from_checkpoint(module, path, require_all=False, log=True):
  """Initialises `module`'s variables from any supported checkpoint and logs the outcome (unless
  not `log`: a probe whose report the caller acts on).

  With `require_all`, a model variable the checkpoint lacks is an error (for pure encoders,
  where a missing variable means the wrong checkpoint)."""
  kind, resolved = resolve_checkpoint(path)
  loader = {"tf1": load_tf1_checkpoint, "hf": load_hf_checkpoint,
            "project": load_project_checkpoint}[kind]
  report = loader(module, resolved)
  if log:
    report.log()
  if not report.loaded:
    raise fileio.InputError(f"checkpoint {resolved} shares no variable with the model")
  if require_all and report.missing:
    raise fileio.InputError(f"checkpoint {resolved} lacks variables: {', '.join(report.missing)}")
  return report


def _copy_sidecars(directory, config, vocab_file, config_name, hf=False):
  if config is not None:
    text = (json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n" if hf
            else config.to_json_string())
    with fileio.open_atomic(os.path.join(directory, config_name)) as f:
      f.write(text)
  if vocab_file:
    with fileio.atomic_path(run_dir.vocab_file(directory)) as tmp:
      fileio.copy_file(vocab_file, tmp)


def export_tf1_checkpoint(module, prefix, config=None, vocab_file=None, global_step=None):
  """Writes `module`'s variables under their original names (a name-based V2 checkpoint, as TF1's
  Saver wrote), plus bert_config.json and vocab.txt beside it when given."""
  directory = fileio.parent(prefix)
  fileio.makedirs(directory)
  remote = fileio.is_remote(prefix)
  named = variables_by_name(module)
  names = sorted(named)
  tensors = [tf.convert_to_tensor(named[n]) for n in names]
  if global_step is not None:
    names.append("global_step")
    tensors.append(tf.constant(global_step, tf.int64))
  # Write under a temporary prefix in the same directory, then rename each file into place (on an
  # object store: in a local one, then each file uploaded whole, fileio.atomic_path). Named as the
  # project's temporaries (`.bert_model.ckpt.tmp-PID-...`): one a SIGKILL leaves is swept by the
  # next export of the same prefix.
  if remote:
    staging = tempfile.mkdtemp(prefix=".export-")
  else:
    fileio.remove_stale_temporaries([prefix])
    staging = tempfile.mkdtemp(prefix=fileio.temporary_prefix(prefix), dir=directory)
  try:
    tmp_prefix = os.path.join(staging, "ckpt")
    tf.raw_ops.SaveV2(prefix=tmp_prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=tensors)
    for produced in sorted(os.listdir(staging)):
      if remote:
        with fileio.atomic_path(prefix + produced[len("ckpt"):]) as tmp:
          shutil.copyfile(os.path.join(staging, produced), tmp)
      else:
        os.replace(os.path.join(staging, produced),
                   os.path.abspath(prefix) + produced[len("ckpt"):])
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  _copy_sidecars(directory, config, vocab_file, "bert_config.json")
  return prefix


def export_hf_checkpoint(module, directory, config=None, vocab_file=None):
  """Writes `model.safetensors` with HuggingFace names (+ config.json, vocab.txt)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  named = variables_by_name(module)
  # HF's BertModel keys have no `bert.` prefix; BertForPreTraining (encoder + cls heads) has it.
  with_heads = any(n.startswith("cls/") for n in named)
  tensors = {}
  for name, variable in named.items():
    key = tf1_to_hf_name(name)
    if not with_heads and key.startswith("bert."):
      key = key[len("bert."):]
    value = variable.numpy()
    tensors[key] = np.ascontiguousarray(value.T if _hf_transposed(name) else value)
  fileio.makedirs(directory)
  path = run_dir.hf_weights_file(directory)
  with fileio.atomic_path(path) as tmp:
    try:
      save_file(tensors, tmp, metadata={"format": "pt"})
    except Exception as e:  # safetensors reports a full disk as its own error type
      raise fileio.InputError(f"{path}: cannot write: {e}") from None
  _copy_sidecars(directory, config, vocab_file, "config.json", hf=True)
  return directory


def check_checkpoint_matches(directory, module, flag="output_dir"):
  """InputError naming `directory` when its latest checkpoint (a tf.train.Checkpoint with the model
  under `model`, as training.Trainer writes) is not of `module`'s shape: another task's head or
  number of labels. Resuming would die on a shape mismatch after the run had replaced the cached
  records beside it; checked before any of that. An unreadable checkpoint is left to the restore.
  Returns `module`."""
  # The ckpt-N files themselves, not the `checkpoint` state file, which may be damaged or missing.
  latest = run_dir.newest_checkpoint(directory)
  if not latest:
    return module
  try:
    shapes = tf.train.load_checkpoint(latest).get_variable_to_shape_map()
  except (tf.errors.OpError, ValueError):
    return module
  prefix, suffix = "model/", "/.ATTRIBUTES/VARIABLE_VALUE"
  saved = {k[len(prefix):-len(suffix)]: list(s) for k, s in shapes.items()
           if k.startswith(prefix) and k.endswith(suffix) and ".OPTIMIZER_SLOT" not in k}
  flatten = module._flatten  # pylint: disable=protected-access
  ours = {"/".join(map(str, p)): v.shape.as_list()
          for p, v in flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True)}
  problems = [f"{p} has shape {saved[p]} there but {s} here" for p, s in sorted(ours.items())
              if p in saved and saved[p] != s]
  problems += [f"it has no {p}" for p in sorted(ours) if p not in saved]
  problems += [f"it has {p}, which this model lacks" for p in sorted(saved) if p not in ours]
  if problems:
    raise fileio.InputError(f"--{flag}={directory} holds {os.path.basename(latest)}, a checkpoint of "
                     f"another model ({problems[0]}): another task or number of labels? Choose "
                     f"another --{flag}")
  return module


# --- The files beside a checkpoint -------------------------------------------------------------

# The config file names beside a checkpoint: Google's, then HuggingFace's.
CONFIG_NAMES = (run_dir.CONFIG_FILE, run_dir.HF_CONFIG_FILE)


def checkpoint_directory(path):
  """The directory of a checkpoint given as a directory, a file or a prefix."""
  return path if fileio.isdir(path) else fileio.parent(path)


def config_beside(path):
  """The bert_config.json / config.json beside the checkpoint `path`, or None."""
  directory = checkpoint_directory(path)
  return next((os.path.join(directory, n) for n in CONFIG_NAMES
               if fileio.exists(os.path.join(directory, n))), None)


def sentence_transformers_pooling(path):
  """The pooling of a sentence-transformers model folder holding the checkpoint `path` (its
  modules.json's Pooling module, e.g. all-MiniLM-L6-v2's `1_Pooling/config.json`): "mean", "cls"
  or "max", or None for any other checkpoint or a pooling this project has no name for. Such a
  model was trained on that pooling of its token vectors, never on BERT's [CLS] pooler."""
  if not path:
    return None
  directory = checkpoint_directory(path)
  modules = os.path.join(directory, "modules.json")
  try:
    if not fileio.exists(modules):
      return None
    with fileio.open_input(modules) as f:
      listed = json.load(f)
    folder = next(m.get("path", "") for m in listed
                  if str(m.get("type", "")).endswith(".Pooling"))
    with fileio.open_input(run_dir.hf_config_file(os.path.join(directory, folder))) as f:
      config = json.load(f)
  except (OSError, ValueError, StopIteration, AttributeError, TypeError, fileio.InputError):
    return None
  # One mode on, and one this project pools by (not mean_sqrt_len, weighted, lasttoken, ...).
  on = [key for key, value in config.items() if key.startswith("pooling_mode_") and value is True]
  names = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
           "pooling_mode_max_tokens": "max"}
  return names.get(on[0]) if len(on) == 1 else None


def num_classifier_outputs(init_checkpoint):
  """A classifier checkpoint's label count: the length of its output_bias (any format; None for
  a HuggingFace checkpoint or one without that variable)."""
  kind, path = resolve_checkpoint(init_checkpoint)
  if kind == "hf":
    return None
  for name, shape in tf.train.list_variables(path):
    if name in ("output_bias", "model/output_layer/output_bias" + _VALUE_SUFFIX):
      return shape[0]
  return None


def global_step(checkpoint):
  """The training step a checkpoint of these scripts was saved at (its optimizer's iterations),
  or None for a checkpoint without an optimizer (converted, HuggingFace, the original's)."""
  kind, path = resolve_checkpoint(checkpoint)
  if kind == "hf":
    return None
  name = "optimizer/iterations" + _VALUE_SUFFIX
  if name not in dict(tf.train.list_variables(path)):
    return None
  return int(tf.train.load_variable(path, name))


def config_path(bert_config_file, checkpoint, checkpoint_flag="--init_checkpoint"):
  """--bert_config_file, else the config beside `checkpoint`; InputError when neither is."""
  path = bert_config_file or (config_beside(checkpoint) if checkpoint else None)
  label = f"{checkpoint_flag}={checkpoint}"
  if not path and checkpoint and not (fileio.exists(checkpoint, label)
                                      or fileio.prefix_files(checkpoint, label)):
    # A mistyped path is named as such, not as a missing config.
    base = os.path.basename(checkpoint.rstrip("/"))
    raise fileio.InputError(
        f"{label}: no checkpoint there "
        + (f"(no object under that prefix, and no {base}.* objects)" if fileio.is_remote(checkpoint)
           else f"(no such folder, and no {base}.* files)"))
  if not path:
    raise fileio.InputError(f"--bert_config_file is required (no config.json / bert_config.json "
                            f"beside {checkpoint_flag})")
  return path


def vocab_beside(checkpoint):
  """The vocab.txt path in the checkpoint's directory (it may not exist)."""
  return run_dir.vocab_file(checkpoint_directory(checkpoint))


def vocab_file_or_beside(vocab_file, init_checkpoint):
  """--vocab_file when given, else the vocab.txt beside --init_checkpoint when there is one
  (said in the log), else None: every script that reads a checkpoint finds its vocab alike."""
  if vocab_file or not init_checkpoint:
    return vocab_file
  beside = vocab_beside(init_checkpoint)
  if not fileio.isfile(beside):
    return None
  logging.info("--vocab_file: %s (beside --init_checkpoint)", beside)
  return beside


def check_seq_length(max_seq_length, config, config_source):
  """InputError when --max_seq_length does not fit the model's position embeddings."""
  if max_seq_length > config.max_position_embeddings:
    raise fileio.InputError(f"--max_seq_length={max_seq_length} is above max_position_embeddings="
                            f"{config.max_position_embeddings} of {config_source}")


def load_bert_config(bert_config_file, init_checkpoint, max_seq_length):
  """The model config: --bert_config_file, else the config.json / bert_config.json beside
  --init_checkpoint (a HuggingFace directory needs no separate flag). Checks max_seq_length."""
  path = config_path(bert_config_file, init_checkpoint)
  config = modeling.BertConfig.from_json_file(path)
  check_seq_length(max_seq_length, config, path)
  return config


class EncoderHolder(tf.Module):
  """A BertModel held as `bert`, as the fine-tuning models hold it, so that this project's
  checkpoints (model/bert/...) load into the encoder alone by object path."""

  def __init__(self, config, name="encoder_holder"):
    super().__init__(name=name)
    self.bert = modeling.BertModel(config)


def load_pretrainer_or_encoder(config, path, log=True):
  """The model of checkpoint `path`: modeling.BertPretrainer with its weights when it has the
  pre-training heads, else the encoder alone (an EncoderHolder). A missing encoder variable is an
  error; heads it lacks are dropped on purpose, not "left at random init"."""
  model = modeling.BertPretrainer(config)
  report = init_from_checkpoint(model, path, log=False)  # a probe
  missing_encoder = [n for n in report.missing if not n.startswith("cls/")]
  if missing_encoder:
    raise fileio.InputError(f"{path} lacks encoder variables: {', '.join(missing_encoder[:5])}")
  if report.missing:
    if log:
      logging.info("%s has no pre-training heads: the encoder alone", path)
    model = EncoderHolder(config)
    init_from_checkpoint(model, path, require_all=True, log=log)
  elif log:
    report.log()
  return model


# --- Encoders exported by export_model.py (--hub_module_handle) ---------------------------------


def _load_saved_model(handle):
  """tf.saved_model.load of a --hub_module_handle, with one InputError naming the handle and the
  part that is missing or damaged (its variables index, a truncated variables file) where
  TensorFlow raises an IndexError, a two-line OpError or a ValueError."""
  if not fileio.isdir(handle) or not tf.saved_model.contains_saved_model(handle):
    raise fileio.InputError(f"--hub_module_handle={handle} is not a SavedModel directory")
  variables = os.path.join(handle, "variables")
  if fileio.isdir(variables) and not fileio.exists(os.path.join(variables,
                                                                   "variables.index")):
    raise fileio.InputError(f"--hub_module_handle={handle}: the SavedModel has no "
                            "variables/variables.index (copied incompletely?)")
  try:
    return tf.saved_model.load(handle)
  except (tf.errors.OpError, IndexError, ValueError, OSError) as e:
    detail = " ".join(str(getattr(e, "message", None) or e).split())[:300]
    raise fileio.InputError(f"--hub_module_handle={handle}: the SavedModel cannot be loaded "
                            f"(its variables are damaged or truncated?): {detail}") from None


@functools.lru_cache(maxsize=8)
def load_tokenization_info(handle):
  """(vocab file path, do_lower_case) of an exported SavedModel (as TF Hub BERT models carry).
  Kept per handle: a fine-tuning run asks twice (the default --vocab_file, then the casing check),
  and each load reads the whole SavedModel."""
  loaded = _load_saved_model(handle)
  if not hasattr(loaded, "vocab_file") or not hasattr(loaded, "do_lower_case"):
    raise fileio.InputError(f"{handle}: the SavedModel has no vocab_file / do_lower_case")
  return loaded.vocab_file.asset_path.numpy().decode("utf-8"), bool(loaded.do_lower_case.numpy())


def encoder_config(handle):
  """The BertConfig of an exported encoder SavedModel (its bert_config.json asset)."""
  path = run_dir.config_file(os.path.join(handle, "assets"))
  if not fileio.exists(path):
    raise fileio.InputError(f"{handle}: not an encoder exported by export_model.py (no "
                            "assets/bert_config.json)")
  return modeling.BertConfig.from_json_file(path)


def load_encoder_weights(bert, handle):
  """Copies an exported encoder SavedModel's weights into `bert` (a modeling.BertModel).

  The exported variables keep their checkpoint names (bert/encoder/layer_0/...), so this is a
  copy by name; a SavedModel lacking any of `bert`'s variables is an error naming them.
  """
  loaded = _load_saved_model(handle)
  source = {variable_name(v): v for v in (getattr(loaded, "variables", None) or [])}
  targets = variables_by_name(bert)
  missing = sorted(n for n in targets if n not in source)
  if missing:
    raise fileio.InputError(f"{handle} lacks the encoder variables {', '.join(missing[:5])}"
                            f"{' ...' if len(missing) > 5 else ''}")
  for name, variable in targets.items():
    value = source[name]
    if tuple(value.shape) != tuple(variable.shape):
      raise fileio.InputError(f"{handle}: {name} has shape {value.shape.as_list()}, the model "
                              f"{variable.shape.as_list()}")
    variable.assign(value)
  logging.info("Initialised %d encoder variables from %s", len(targets), handle)
