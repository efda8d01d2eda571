"""Reliability of training and its checkpoints, as real run_pretraining processes on tiny data.

A damaged `checkpoint` state file or a truncated latest checkpoint must not make training start
again and save over trained checkpoints; a second run in the same --output_dir is refused; a config
that does not fit the checkpoints fails before bert_config.json is replaced; evaluating nothing,
records the model cannot embed, bad numeric flags, an unusable --output_dir and a failed save are
one `error:` line; Ctrl-C saves a checkpoint as SIGTERM does.
"""

import glob
import hashlib
import json
import os
import resource
import shutil
import signal

import numpy as np
import pytest
import tensorflow as tf

from conftest import DEVNULL, ENV, PIPE, PYTHON, ROOT, popen, requires_shared, run_ok, run_script
from test_reliability import (TINY_CONFIG, _error_line, _example, _pretraining_args,
                              _StderrLines, _wait_for)

pytestmark = requires_shared


def _records(path, n=32, bad=None):
  """n valid records of length 16; `bad` = (index, feature, value) puts one value out of range."""
  rng = np.random.default_rng(1)
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i in range(n):
      record = _example(rng=rng)
      if bad and bad[0] == i:
        example = tf.train.Example.FromString(record)
        example.features.feature[bad[1]].int64_list.value[2] = bad[2]
        record = example.SerializeToString()
      writer.write(record)
  return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(config dir, records, an output_dir trained 4 steps holding ckpt-2 and ckpt-4)."""
  d = tmp_path_factory.mktemp("training")
  (d / "bert_config.json").write_text(json.dumps(TINY_CONFIG))
  records = _records(d / "good.tfrecord")
  run_ok(_pretraining_args(d, records, d / "trained"))
  assert os.path.exists(d / "trained" / "ckpt-4.index")
  return d, records, d / "trained"


def _copy(trained, tmp_path):
  out = tmp_path / "out"
  shutil.copytree(trained, out)
  return out


def _hashes(directory):
  """{relative path: sha256} of every file under `directory` (the lock file aside)."""
  found = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      if name != ".lock":
        with open(path, "rb") as f:
          found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return found


def _checkpoint_files(directory, step):
  return {k: v for k, v in _hashes(directory).items() if k.startswith(f"ckpt-{step}.")}


def test_damaged_state_file_resumes_from_the_newest_checkpoint(setup, tmp_path):
  config_dir, records, trained = setup
  state = (trained / "checkpoint").read_bytes()
  for case, damaged in (("garbage", b"\x00\xffnot a state }{\n"), ("empty", b""),
                        ("truncated", state[:len(state) // 3]), ("missing", None)):
    out = tmp_path / case
    shutil.copytree(trained, out)
    if damaged is None:
      os.remove(out / "checkpoint")
    else:
      (out / "checkpoint").write_bytes(damaged)
    before = {s: _checkpoint_files(out, s) for s in (2, 4)}
    result = run_ok(_pretraining_args(config_dir, records, out, "--num_train_steps=6"))
    assert f"checkpoint state file {out / 'checkpoint'} is missing or damaged" in result.stderr
    assert f"Resumed from {out / 'ckpt-4'} at step 4" in result.stderr, case
    for s in (2, 4):  # the trained checkpoints are untouched
      assert _checkpoint_files(out, s) == before[s] and before[s], (case, s)
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-6"), case
    assert not glob.glob(str(out / "ckpt-*_temp")), case


def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(setup, tmp_path):
  config_dir, records, trained = setup
  for case in ("truncated data", "missing index"):
    out = tmp_path / case.replace(" ", "_")
    shutil.copytree(trained, out)
    if case == "truncated data":
      data = out / "ckpt-4.data-00000-of-00001"
      data.write_bytes(data.read_bytes()[:-1000])
    else:
      os.remove(out / "ckpt-4.index")
    before = _checkpoint_files(out, 2)
    result = run_ok(_pretraining_args(config_dir, records, out, "--num_train_steps=4"))
    assert "Traceback" not in result.stderr
    assert f"Checkpoint {out / 'ckpt-4'} is damaged" in result.stderr, case
    assert f"Resumed from {out / 'ckpt-2'} at step 2" in result.stderr, case
    assert _checkpoint_files(out, 2) == before
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-4")  # written again, whole
    tf.train.load_checkpoint(str(out / "ckpt-4"))

  # Every checkpoint damaged: an error naming them, and nothing there is touched.
  out = tmp_path / "all"
  shutil.copytree(trained, out)
  for step in (2, 4):
    data = out / f"ckpt-{step}.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:100])
  before = _hashes(out)
  line = _error_line(run_script(_pretraining_args(config_dir, records, out, "--num_train_steps=6")))
  assert f"no checkpoint in --output_dir={out} can be read (ckpt-4: " in line, line
  assert "ckpt-2: " in line
  assert _hashes(out) == before


def test_second_run_is_refused_and_ctrl_c_saves_a_checkpoint(setup, tmp_path):
  config_dir, records, _ = setup
  out = tmp_path / "out"
  args = _pretraining_args(config_dir, records, out, "--num_train_steps=100000")
  first = popen([PYTHON, *args], cwd=ROOT, env=ENV, stdout=DEVNULL, stderr=PIPE, text=True)
  try:
    stderr = _StderrLines(first)
    _wait_for(lambda: os.path.exists(out / "ckpt-2.index"), first, "the first checkpoint")
    first.send_signal(signal.SIGSTOP)  # so that its files hold still while the second one runs
    before = _hashes(out)
    line = _error_line(run_script(args))
    assert f"--output_dir={out} is in use by another run" in line, line
    assert _hashes(out) == before
    first.send_signal(signal.SIGCONT)
    first.send_signal(signal.SIGINT)
    first.wait(timeout=120)
  finally:
    if first.poll() is None:
      first.kill()
      first.wait()
  text = stderr.text()
  assert first.returncode == 130, text[-3000:]
  assert "Stopped by SIGINT" in text and "Traceback" not in text and "KeyboardInterrupt" not in text
  step = int(tf.train.latest_checkpoint(str(out)).rsplit("-", 1)[1])
  assert step >= 2
  assert not glob.glob(str(out / "ckpt-*_temp"))
  resumed = run_ok(_pretraining_args(config_dir, records, out, f"--num_train_steps={step + 2}"))
  assert f"Resumed from {out / f'ckpt-{step}'} at step {step}" in resumed.stderr
  assert tf.train.latest_checkpoint(str(out)).endswith(f"ckpt-{step + 2}")


def test_config_that_does_not_fit_the_checkpoints_leaves_bert_config_json(setup, tmp_path):
  config_dir, records, trained = setup
  out = _copy(trained, tmp_path)
  before = _hashes(out)
  cases = [
      # A size: also named by the restore; checked first against the bert_config.json there.
      (dict(TINY_CONFIG, hidden_size=16), "has hidden_size=16, but the checkpoints in "
       f"--output_dir={out} were trained with hidden_size=8"),
      # No shape changes: only the saved config tells.
      (dict(TINY_CONFIG, num_attention_heads=4), "has num_attention_heads=4, but the "
       "checkpoints in"),
  ]
  for i, (config, message) in enumerate(cases):
    other = tmp_path / f"other{i}"
    other.mkdir()
    (other / "bert_config.json").write_text(json.dumps(config))
    line = _error_line(run_script(_pretraining_args(other, records, out, "--num_train_steps=6")))
    assert message in line, line
    assert _hashes(out) == before
  # Without the saved config, the checkpoint's own shapes: the variable and both shapes.
  os.remove(out / "bert_config.json")
  before = _hashes(out)
  line = _error_line(run_script(_pretraining_args(tmp_path / "other0", records, out,
                                            "--num_train_steps=6")))
  assert f"{out / 'ckpt-4'} does not fit the model: Received incompatible tensor with shape" in line
  assert _hashes(out) == before and not (out / "bert_config.json").exists()


@pytest.mark.onednn_bf16
def test_resuming_with_another_loss_scaling_names_the_precision(setup, tmp_path):
  """An fp16 run's checkpoints hold a loss scale: resumed without fp16 (it was six TensorFlow
  warnings about unread values), or a run without fp16 resumed with it (TensorFlow's "Python
  objects not bound"), is one line saying the precision differs, and nothing changes."""
  config_dir, records, trained = setup
  out = _copy(trained, tmp_path)  # trained without fp16
  before = _hashes(out)
  result = run_script(_pretraining_args(config_dir, records, out, "--num_train_steps=6",
                                        "--mixed_precision=fp16"))
  assert _error_line(result) == (
      f"error: {out / 'ckpt-4'} was written without fp16 loss scaling (--mixed_precision none or "
      f"bf16); resume --output_dir={out} with that precision, not fp16, or choose a new "
      "--output_dir"), result.stderr[-2000:]
  assert _hashes(out) == before
  fp16 = tmp_path / "fp16"
  run_ok(_pretraining_args(config_dir, records, fp16, "--mixed_precision=fp16"))
  before = _hashes(fp16)
  result = run_script(_pretraining_args(config_dir, records, fp16, "--num_train_steps=6",
                                        "--mixed_precision=bf16"))
  assert _error_line(result) == (
      f"error: {fp16 / 'ckpt-4'} was written by an fp16 run (it holds a loss scale); resume "
      f"--output_dir={fp16} with --mixed_precision=fp16, or choose a new --output_dir"
  ), result.stderr[-2000:]
  assert "Unresolved object" not in result.stderr and _hashes(fp16) == before
  run_ok(_pretraining_args(config_dir, records, fp16, "--num_train_steps=6",
                           "--mixed_precision=fp16"))
  assert os.path.exists(fp16 / "ckpt-6.index")


def test_evaluating_with_no_checkpoint_is_an_error(setup, tmp_path):
  config_dir, records, _ = setup
  out = tmp_path / "out"
  line = _error_line(run_script(_pretraining_args(config_dir, records, out, "--do_train=false",
                                            "--do_eval")))
  assert f"nothing to evaluate: --output_dir={out} holds no checkpoint" in line, line
  assert not (out / "eval_results.txt").exists() and not (out / "bert_config.json").exists()


def test_records_the_model_cannot_embed_are_named(setup, tmp_path):
  config_dir, _, trained = setup
  out = tmp_path / "out"
  # Found by the scan of the first records, before training.
  for feature, value, what in (("input_ids", 15, "vocab_size=15"),
                               ("segment_ids", 2, "type_vocab_size=2"),
                               ("masked_lm_ids", -1, "vocab_size=15")):
    records = _records(tmp_path / f"{feature}.tfrecord", bad=(3, feature, value))
    line = _error_line(run_script(_pretraining_args(config_dir, records, out)))
    assert f"{records}: record 3: {feature} holds {value} at position 2, outside [0, " in line
    assert what in line, line
    assert not glob.glob(str(out / "ckpt-*"))
  # Past the scan: found by the pipeline's check when evaluation reaches it.
  out = tmp_path / "trained"
  shutil.copytree(trained, out)
  records = _records(tmp_path / "late.tfrecord", n=120, bad=(110, "segment_ids", 5))
  line = _error_line(run_script(_pretraining_args(config_dir, records, out, "--do_train=false",
                                            "--do_eval", "--eval_batch_size=4",
                                            "--max_eval_steps=100")))
  assert f"{records}: record 110: segment_ids holds 5 at position 2" in line, line
  assert not (out / "eval_results.txt").exists()


def test_bad_numeric_flags_and_output_dirs_are_one_error_line(setup, tmp_path):
  config_dir, records, _ = setup
  out = tmp_path / "out"
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory\n")
  cases = [
      (_pretraining_args(config_dir, records, out, "--learning_rate=-1"),
       "flag --learning_rate=-1.0: must be > 0"),
      (_pretraining_args(config_dir, records, out, "--save_checkpoints_steps=0"),
       "flag --save_checkpoints_steps=0: 0 is not a positive integer"),
      (_pretraining_args(config_dir, records, out, "--gradient_accumulation_steps=0"),
       "flag --gradient_accumulation_steps=0"),
      (_pretraining_args(config_dir, records, a_file / "out"), f"{a_file} is not a directory"),
      (_pretraining_args(config_dir, records, a_file),
       f"--output_dir={a_file} exists and is not a directory"),
      (["run_classifier.py", "--warmup_proportion=1.5"], "flag --warmup_proportion=1.5"),
      (_pretraining_args(config_dir, records, out, "--learning_rate=inf"),
       "flag --learning_rate=inf: must be a finite number"),
      (_pretraining_args(config_dir, records, out, "--num_train_steps=9223372036854775807"),
       "flag --num_train_steps=9223372036854775807"),
  ]
  for args, message in cases:
    line = _error_line(run_script(args))
    assert message in line, (message, line)
  assert not out.exists() and a_file.read_text() == "not a directory\n"


def test_a_planted_lock_is_never_followed(setup, tmp_path):
  """A `.lock` in --output_dir that is a symbolic or hard link to another file (here the run's own
  records) is refused: the lock file is truncated when taken, and must only ever be our own."""
  config_dir, records, _ = setup
  victim = tmp_path / "records.tfrecord"
  shutil.copy(records, victim)
  before = victim.read_bytes()
  for kind in ("symbolic", "hard"):
    out = tmp_path / f"out_{kind}"
    out.mkdir()
    (os.symlink if kind == "symbolic" else os.link)(victim, out / ".lock")
    line = _error_line(run_script(_pretraining_args(config_dir, str(victim), out)))
    assert f"--output_dir={out}: its .lock is" in line, line
    assert victim.read_bytes() == before
    assert sorted(os.listdir(out)) == [".lock"]


def test_a_failed_save_leaves_no_partial_checkpoint(setup, tmp_path):
  """Writing past a file-size limit (EFBIG) stands in for a full disk: the save of ckpt-2 fails."""
  config_dir, records, _ = setup
  out = tmp_path / "out"
  limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (12_000, 12_000))
  result = run_script(_pretraining_args(config_dir, records, out), timeout=300, preexec_fn=limit)
  line = _error_line(result)
  assert f"cannot save the checkpoint {out / 'ckpt-2'}: File too large" in line, line
  assert not [p for p in os.listdir(out) if p.startswith("ckpt-") or p.startswith("checkpoint")]
