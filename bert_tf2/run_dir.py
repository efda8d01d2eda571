"""A run's output folder (--output_dir) and the model folders the project reads and writes: the one
place that names their files (each a constant, joined by the functions below; tests/test_layout.py
checks that no other module joins them) and knows how a checkpoint's files are named
(`ckpt-N.index`, `ckpt-N.data-K-of-M`, N the step) and which of them is the newest whole one.

An output folder holds the checkpoints and TensorFlow's `checkpoint` state file, the model files
beside them (`bert_config.json`, `vocab.txt`; a fine-tuned model's `task.json` and, for a
multi-label one, `thresholds.json`), `eval_results.txt`, and, when evaluation during training
keeps the best checkpoint, `best/` (a model folder of its own) with `best_checkpoint.json`.
A HuggingFace folder holds `config.json` and `model.safetensors`.

(Issue #74's run-folder room: the folder's names and checkpoints live here; removing partial
saves, repairing the state file, the lock and best/'s state are still training.py's,
checkpoints.py's and fine_tuning.py's, and move here next.)
"""

import os
import re

from bert_tf2 import fileio

CONFIG_FILE = "bert_config.json"  # the encoder's BertConfig (config.py)
VOCAB_FILE = "vocab.txt"
TASK_FILE = "task.json"  # a fine-tuned model's task: labels, pooling, ... (fine_tuning)
THRESHOLDS_FILE = "thresholds.json"  # a multi-label model's tuned thresholds
STATE_FILE = "checkpoint"  # TensorFlow's list of the checkpoints, newest first
EVAL_RESULTS_FILE = "eval_results.txt"
BEST_DIRECTORY = "best"  # the best checkpoint kept during training: a model folder
BEST_STATE = "best_checkpoint.json"  # every evaluation so far and the best one
HF_CONFIG_FILE = "config.json"
HF_WEIGHTS_FILE = "model.safetensors"


def _in(name):
  """A function of a folder giving the path of `name` in it."""
  return lambda directory: os.path.join(directory, name)


config_file = _in(CONFIG_FILE)
vocab_file = _in(VOCAB_FILE)
task_file = _in(TASK_FILE)
thresholds_file = _in(THRESHOLDS_FILE)
state_file = _in(STATE_FILE)
eval_results_file = _in(EVAL_RESULTS_FILE)
best_directory = _in(BEST_DIRECTORY)
best_state_file = _in(BEST_STATE)
hf_config_file = _in(HF_CONFIG_FILE)
hf_weights_file = _in(HF_WEIGHTS_FILE)


# A checkpoint's files: its index (written last by a save) and its data shards.
_CHECKPOINT_FILE = re.compile(r"ckpt-(\d+)\.(index|data-\d+-of-\d+)$")


def checkpoint_path(directory, step):
  """The path (prefix) of checkpoint `step` in `directory`: DIRECTORY/ckpt-STEP."""
  return os.path.join(directory, f"ckpt-{step}")


def checkpoint_numbers(directory):
  """The steps N of the ckpt-N files (index or data, whole or not) in `directory`, newest first."""
  if not fileio.isdir(directory):
    return []
  names = fileio.listdir(directory)
  return sorted({int(m.group(1)) for m in map(_CHECKPOINT_FILE.match, names) if m},
                reverse=True)


def newest_checkpoint(directory):
  """The path of the newest ckpt-N in `directory` with its .index (a save writes it last, after
  the data), or None: the checkpoint a rerun resumes from (unless it is damaged, which
  Trainer._restore_newest skips)."""
  for number in checkpoint_numbers(directory):
    path = checkpoint_path(directory, number)
    if fileio.exists(path + ".index"):
      return path
  return None
