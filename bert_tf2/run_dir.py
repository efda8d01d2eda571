"""A run's output folder (--output_dir) and the checkpoints in it: the one place that knows how a
checkpoint's files are named (`ckpt-N.index`, `ckpt-N.data-K-of-M`, N the step) and which of them
is the newest whole one.

The first piece of the run-folder room (issue #74): the rest of the folder's layout (the
`checkpoint` state file, `best/`, `task.json`, `thresholds.json`, the model files beside a
checkpoint, the lock) moves here from training.py, checkpoints.py and fine_tuning.py next.
"""

import os
import re

from bert_tf2 import fileio

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
