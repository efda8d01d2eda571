"""run_dir: a run folder's checkpoints by their files: the steps present, whole or not, newest
first, and the newest whole one (its .index written, which a save writes last)."""

import numpy as np
import tensorflow as tf

from bert_tf2 import run_dir


def test_checkpoints_are_found_by_their_files_and_the_newest_whole_one_is_resumed(tmp_path):
  assert run_dir.checkpoint_numbers(str(tmp_path / "missing")) == []
  assert run_dir.newest_checkpoint(str(tmp_path / "missing")) is None
  assert run_dir.newest_checkpoint(str(tmp_path)) is None
  step = tf.Variable(0, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(weights=tf.Variable(np.arange(6.0)), step=step)
  manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=5,
                                       step_counter=step)
  for n in (3, 20, 100):
    step.assign(n)
    manager.save(checkpoint_number=n)
  assert run_dir.checkpoint_numbers(str(tmp_path)) == [100, 20, 3]
  assert run_dir.newest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-100")
  assert run_dir.checkpoint_path(str(tmp_path), 20) == str(tmp_path / "ckpt-20")
  # A save killed before its index: its data counts as a step present, not as a whole checkpoint.
  (tmp_path / "ckpt-100.index").unlink()
  (tmp_path / "ckpt-250.data-00000-of-00001").write_bytes(b"partial")
  # Names that only look alike are not checkpoints.
  for name in ("ckpt-7.index.tmp", "ckpt-x.index", "best_ckpt-9.txt", "ckpt-8"):
    (tmp_path / name).write_bytes(b"")
  assert run_dir.checkpoint_numbers(str(tmp_path)) == [250, 100, 20, 3]
  newest = run_dir.newest_checkpoint(str(tmp_path))
  assert newest == str(tmp_path / "ckpt-20")
  assert tf.train.load_variable(newest, "step/.ATTRIBUTES/VARIABLE_VALUE") == 20
