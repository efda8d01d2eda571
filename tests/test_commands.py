"""commands: how a script runs, as a user sees it: the console a script starts with (TensorFlow's
C++ start-up notices kept off it)."""

import os
import platform
import re

from conftest import PYTHON, ROOT, TINY, requires_shared, run_process


@requires_shared
def test_tensorflows_start_up_notices_are_kept_off_the_console(tmp_path):
  """TensorFlow's C++ libraries print an absl notice, "oneDNN custom operations are on" (twice)
  and a CPU-feature note while they load, whatever TF_CPP_MIN_LOG_LEVEL says: a script's console
  starts with its own lines instead. TF_CPP_MIN_LOG_LEVEL=0 keeps them (for debugging)."""
  words = tmp_path / "words.txt"
  words.write_text("all work and no play\n")
  args = [PYTHON, "extract_features.py", f"--input_file={words}",
          f"--output_file={tmp_path}/f.jsonl", f"--init_checkpoint={TINY}/bert_model.ckpt",
          f"--vocab_file={TINY}/vocab.txt", "--max_seq_length=16", "--layers=-1"]
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  quiet = run_process(args, cwd=ROOT, env=env, timeout=300)
  assert quiet.returncode == 0, quiet.stderr[-2000:]
  for noise in ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard"):
    assert noise not in quiet.stderr, quiet.stderr[:2000]
  assert "Wrote the features of 1 lines" in quiet.stderr
  # Nor TensorFlow's C++ INFO lines later in a run: a training step compiles its optimizer
  # update with XLA ("XLA service ...", "Compiled cluster using XLA!").
  records = tmp_path / "records.tfrecord"
  made = run_process([PYTHON, "create_pretraining_data.py", f"--input_file={words}",
                      f"--output_file={records}", f"--vocab_file={TINY}/vocab.txt",
                      "--max_seq_length=16", "--max_predictions_per_seq=2", "--dupe_factor=2",
                      "--short_seq_prob=1"], cwd=ROOT, env=env, timeout=300)
  assert made.returncode == 0, made.stderr[-2000:]
  train = [PYTHON, "run_pretraining.py", f"--input_file={records}",
           f"--output_dir={tmp_path}/run", f"--init_checkpoint={TINY}/bert_model.ckpt",
           f"--bert_config_file={TINY}/bert_config.json", "--do_train", "--max_seq_length=16",
           "--max_predictions_per_seq=2", "--train_batch_size=2", "--num_train_steps=2",
           "--num_warmup_steps=1"]
  trained = run_process(train, cwd=ROOT, env=env, timeout=300)
  assert trained.returncode == 0, trained.stderr[-2000:]
  cpp_info = re.compile(r"^I\d{4} [\d:. ]+\d+ \S+\.(cc|h):\d+\] ", re.M)
  assert not cpp_info.search(trained.stderr), trained.stderr[:3000]
  loud = run_process(train[:3] + [f"--output_dir={tmp_path}/loud"] + train[4:], cwd=ROOT,
                     env=dict(env, TF_CPP_MIN_LOG_LEVEL="0"), timeout=300)
  assert loud.returncode == 0 and "Compiled cluster using XLA" in loud.stderr, loud.stderr[-2000:]
  loud = run_process(args, cwd=ROOT, env=dict(env, TF_CPP_MIN_LOG_LEVEL="0"), timeout=300)
  assert loud.returncode == 0, loud.stderr[-2000:]
  if platform.machine() == "x86_64":
    # TensorFlow's x86 builds print the CPU-feature note everywhere; oneDNN's notice only where
    # its custom operations are on by default (not on an AVX2-only EPYC, say).
    assert "cpu_feature_guard" in loud.stderr, loud.stderr[:2000]


def test_python_m_bert_tf2_help_lists_the_scripts():
  """`python -m bert_tf2 --help` is a list of the scripts, each with its summary, and exit 0 (it
  was an error); without a script it is still the one-line usage error."""
  done = run_process([PYTHON, "-m", "bert_tf2", "--help"], cwd=ROOT, env=os.environ, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("usage: python -m bert_tf2 SCRIPT")
  assert "run_classifier          BERT fine-tuning for sentence and sentence-pair" in done.stdout
  assert len([line for line in done.stdout.splitlines() if line.startswith("  ")]) == 13
  bare = run_process([PYTHON, "-m", "bert_tf2"], cwd=ROOT, env=os.environ, timeout=120)
  assert bare.returncode == 2 and bare.stderr.startswith("error: usage:"), bare.stderr


def test_a_write_on_a_full_disk_names_the_output(tmp_path):
  """A write() that fails for a full disk names no file: the shared writers (a file written
  atomically, a folder staged and renamed) give the error their output's name, never a hidden
  temporary's; under any other write, the script's error line names its output flags."""
  import errno  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  full = OSError(errno.ENOSPC, "No space left on device")
  out = tmp_path / "out.txt"
  with pytest.raises(OSError) as caught:
    with fileio.open_atomic(out) as f:
      f.write("x")
      raise full
  assert caught.value.filename == str(out) and caught.value.errno == errno.ENOSPC
  folder = tmp_path / "model"
  for raised, named in ((full, folder), (None, folder / "variables" / "data")):
    with pytest.raises(OSError) as caught:
      with fileio.atomic_directory(str(folder)) as staging:
        if raised is None:
          raised = OSError(errno.ENOSPC, "No space left on device",
                           os.path.join(staging, "variables", "data"))
        raise raised
    assert caught.value.filename == str(named), caught.value
  assert sorted(os.listdir(tmp_path)) == []  # no temporaries, no lock, no half output

  script = ("import errno\n"
            "from absl import flags\n"
            "from bert_tf2 import commands\n"
            "flags.DEFINE_string('output_dir', None, 'out')\n"
            "def main(argv):\n"
            "  raise OSError(errno.ENOSPC, 'No space left on device')\n"
            "commands.run_main(main)\n")
  done = run_process([PYTHON, "-c", script, f"--output_dir={tmp_path / 'run'}"], cwd=ROOT,
                     timeout=120)
  assert done.returncode == 2
  assert done.stderr.strip().splitlines() == [
      f"error: No space left on device (while writing --output_dir={tmp_path / 'run'})"]


@requires_shared
def test_every_console_line_of_training_and_a_litert_export_is_the_projects(tmp_path):
  """At the default verbosity a run's console holds the project's own log lines only: none of
  TensorFlow's start-up notices when a script loads it late (build_vocab's learner), none of
  TensorFlow's Python INFO lines (a checkpoint's "Sharding callback duration", a SavedModel's
  "Assets written to" twice and its fingerprint, signature renames), nor the LiteRT converter's
  two C++ warnings, nor the mirrored strategy's warning about its iterator's generator datasets.
  --verbosity=1 shows TensorFlow's lines again. A TF_CONFIG cluster that the strategy flag
  ignores is one warning line."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  ours = {name[:-3] for name in os.listdir(os.path.join(ROOT, "bert_tf2")) if name.endswith(".py")}
  line_format = re.compile(r"^[IWE]\d{4} [\d:.]+ +\d+ (\w+)\.py:\d+\] ")

  def foreign(stderr):
    """The lines that are neither a project module's log line nor one's indented continuation
    (the file lists create_pretraining_data prints, as the original did)."""
    return [line for line in stderr.splitlines() if not line.startswith("  ") and not (
        line_format.match(line) and line_format.match(line).group(1) in ours)]

  words = tmp_path / "words.txt"
  words.write_text("all work and no play\nmakes jack a dull boy\n\nall play and no work\n")
  # A script that imports TensorFlow only when a step needs it (the WordPiece learner).
  learned = run_process([PYTHON, "build_vocab.py", f"--input_file={words}",
                         f"--output_dir={tmp_path}/vocab", "--vocab_size=40", "--num_unused=0"],
                        cwd=ROOT, env=env, timeout=300)
  assert learned.returncode == 0 and "Wrote" in learned.stderr, learned.stderr[-3000:]
  assert not foreign(learned.stderr), learned.stderr[-3000:]
  records = tmp_path / "records.tfrecord"
  made = run_process([PYTHON, "create_pretraining_data.py", f"--input_file={words}",
                      f"--output_file={records}", f"--vocab_file={TINY}/vocab.txt",
                      "--max_seq_length=16", "--max_predictions_per_seq=2", "--dupe_factor=4"],
                     cwd=ROOT, env=env, timeout=300)
  assert made.returncode == 0 and not foreign(made.stderr), made.stderr[-3000:]
  train = [PYTHON, "run_pretraining.py", f"--input_file={records}",
           f"--init_checkpoint={TINY}/bert_model.ckpt",
           f"--bert_config_file={TINY}/bert_config.json", "--do_train", "--do_eval",
           "--max_seq_length=16", "--max_predictions_per_seq=2", "--train_batch_size=2",
           "--eval_batch_size=2", "--max_eval_steps=2", "--num_train_steps=3",
           "--num_warmup_steps=1", "--save_checkpoints_steps=1",
           "--distribution_strategy=mirrored"]
  trained = run_process(train + [f"--output_dir={tmp_path}/run"], cwd=ROOT, env=env,
                        timeout=300)
  assert trained.returncode == 0 and "Saved checkpoint" in trained.stderr, trained.stderr[-3000:]
  assert not foreign(trained.stderr), trained.stderr[-3000:]
  loud = run_process(train + [f"--output_dir={tmp_path}/loud", "--verbosity=1"], cwd=ROOT,
                     env=env, timeout=300)
  assert loud.returncode == 0 and "Sharding callback duration" in loud.stderr, loud.stderr[-3000:]
  exported = run_process([PYTHON, "export_model.py", "--format=litert",
                          f"--init_checkpoint={tmp_path}/run", f"--export_dir={tmp_path}/litert",
                          f"--vocab_file={TINY}/vocab.txt", "--max_seq_length=16"], cwd=ROOT,
                         env=env, timeout=300)
  assert exported.returncode == 0 and "Wrote LiteRT model" in exported.stderr, \
      exported.stderr[-3000:]
  assert not foreign(exported.stderr), exported.stderr[-3000:]
  # TF_CONFIG naming two workers, with no --distribution_strategy=multi_worker_mirrored.
  cluster = ('{"cluster": {"worker": ["localhost:1", "localhost:2"]}, '
             '"task": {"type": "worker", "index": 0}}')
  alone = run_process(train[:-1] + [f"--output_dir={tmp_path}/alone"], cwd=ROOT,
                      env=dict(env, TF_CONFIG=cluster), timeout=300)
  assert alone.returncode == 0, alone.stderr[-3000:]
  warnings = [line for line in alone.stderr.splitlines() if "TF_CONFIG" in line]
  assert len(warnings) == 1 and warnings[0].startswith("W") and warnings[0].endswith(
      "TF_CONFIG names a cluster of 2 workers, but --distribution_strategy=default trains in "
      "this process alone: give --distribution_strategy=multi_worker_mirrored on every worker to "
      "train as one"), alone.stderr[-3000:]
