"""Reliability of export_model.py and convert_checkpoint.py, and of the config, vocab and
checkpoint readers every model script shares, run as real processes (see test_reliability.py).

Checked for each bad case: exit status 2 with one `error:` line naming the flag, file or key and
no traceback; the inputs and the directory given as output byte-identical afterwards; no staging
directory left beside the output.
"""

import functools
import hashlib
import json
import os
import resource
import shutil
import signal
import time

import pytest

from conftest import (DEVNULL, ENV, PIPE, PYTHON, ROOT, concurrently, minilm_dir, popen,
                      requires_shared, run_ok, run_script)
from test_reliability import TINY, TINY_CKPT, TINY_VOCAB, _error_line

pytestmark = requires_shared


def _snapshot(top):
  """{relative path: sha256 of the bytes, "dir" or "-> target"} of `top` and everything under."""
  if not os.path.isdir(top) or os.path.islink(top):
    return {".": _entry(top)}
  found = {".": "dir"}
  for root, dirs, files in os.walk(top):
    for name in dirs + files:
      path = os.path.join(root, name)
      found[os.path.relpath(path, top)] = _entry(path)
  return found


def _entry(path):
  if os.path.islink(path):
    return "-> " + os.readlink(path)
  if os.path.isdir(path):
    return "dir"
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def _no_staging(directory):
  # Temporaries, and the writer lock beside an output (removed when its run ends).
  left = [n for n in os.listdir(directory) if ".tmp-" in n or (n.startswith(".")
                                                               and n.endswith(".lock"))]
  assert not left, left


def _run_all(argument_lists):
  return concurrently([functools.partial(run_script, args) for args in argument_lists], workers=3)


def _copy(source_dir, target, names=None):
  target.mkdir(parents=True)
  for name in names or os.listdir(source_dir):
    shutil.copyfile(os.path.join(source_dir, name), target / name)
  return target


def _export(export_dir, *extra, model_type="encoder"):
  args = ["export_model.py", f"--model_type={model_type}", f"--export_dir={export_dir}", *extra]
  if model_type != "preprocessor" and not any(a.startswith("--init_checkpoint=") for a in extra):
    args.append(f"--init_checkpoint={TINY_CKPT}")
  return args


@pytest.fixture(scope="module")
def earlier_export(tmp_path_factory):
  """A SavedModel exported from the tiny checkpoint, to be copied where a test needs one."""
  path = tmp_path_factory.mktemp("earlier") / "model"
  run_ok(_export(path))
  return path


def _earlier_export_at(path, earlier_export):
  shutil.copytree(earlier_export, path)
  return _snapshot(path)


# --- export_model: what --export_dir may replace -------------------------------------------------


def test_a_second_export_into_a_folder_being_written_is_refused(tmp_path, earlier_export):
  """While one run writes an export folder (it holds the folder's writer lock), a second export
  there is one error line and leaves the earlier model as it was; the lock goes with its run."""
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  path = tmp_path / "model"
  before = _earlier_export_at(path, earlier_export)
  with fileio.writer_lock(str(path), "export_dir"):
    result = run_script(_export(path))
  assert result.returncode == 2, result.stderr[-2000:]
  assert _error_line(result).startswith(
      f"error: --export_dir={path} is being written by another run"), result.stderr[-2000:]
  assert _snapshot(path) == before
  _no_staging(tmp_path)
  run_ok(_export(path))  # once it is free, the earlier export is replaced
  _no_staging(tmp_path)



def test_export_refuses_to_replace_what_is_not_an_earlier_saved_model(tmp_path):
  checkpoint_dir = _copy(TINY, tmp_path / "checkpoint_dir")  # not the input: a copy of it
  project = tmp_path / "project"
  (project / "src").mkdir(parents=True)
  (project / "src" / "train.py").write_text("print('mine')\n")
  (project / "README").write_text("notes\n")
  a_file = tmp_path / "model.txt"
  a_file.write_text("not a directory\n")
  own_input = _copy(TINY, tmp_path / "own_input")
  vocab_dir = _copy(TINY, tmp_path / "vocab_dir", ["vocab.txt"])
  cases = [
      (checkpoint_dir, _export(checkpoint_dir), "does not hold an earlier output"),
      (project, _export(project), "does not hold an earlier output"),
      (a_file, _export(a_file), "exists and is not a directory"),
      # Even --overwrite never replaces a directory holding an input.
      (own_input, _export(own_input, f"--init_checkpoint={own_input}/bert_model.ckpt",
                          "--overwrite"), "holding the input --init_checkpoint"),
      (vocab_dir, _export(vocab_dir, f"--vocab_file={vocab_dir}/vocab.txt", "--overwrite",
                          model_type="preprocessor"), "holding the input --vocab_file"),
  ]
  before = {str(path): _snapshot(path) for path, _, _ in cases}
  tiny = _snapshot(TINY)
  for (path, _, message), result in zip(cases, _run_all([args for _, args, _ in cases])):
    line = _error_line(result)
    assert f"--export_dir={path}" in line and message in line, line
    assert _snapshot(path) == before[str(path)], path
  assert _snapshot(TINY) == tiny
  _no_staging(tmp_path)


def test_export_overwrite_replaces_with_ordinary_permissions(tmp_path):
  target = tmp_path / "served"
  (target / "old").mkdir(parents=True)
  (target / "old" / "file").write_text("x")
  # Under umask 022 the model must come out 0755 / 0644, not mkdtemp's 0700.
  result = run_script(_export(target, "--overwrite"), timeout=300,
                      preexec_fn=lambda: os.umask(0o022))
  assert result.returncode == 0, result.stderr[-3000:]
  modes = {}
  for root, dirs, files in os.walk(target):
    modes.update({os.path.join(root, n): 0o755 for n in dirs})
    modes.update({os.path.join(root, n): 0o644 for n in files})
  modes[str(target)] = 0o755
  assert os.path.join(target, "saved_model.pb") in modes and not (target / "old").exists()
  for path, want in modes.items():
    assert os.stat(path).st_mode & 0o7777 == want, (path, oct(os.stat(path).st_mode))
  _no_staging(tmp_path)


def test_export_numeric_flags_are_one_error_line(tmp_path):
  out = tmp_path / "out"
  pre = dict(model_type="preprocessor")
  cases = [
      (_export(out, f"--vocab_file={TINY_VOCAB}", "--max_seq_length=0", **pre),
       "--max_seq_length=0"),
      (_export(out, f"--vocab_file={TINY_VOCAB}", "--max_seq_length=2", **pre),
       "--max_seq_length=2"),
      (_export(out, f"--vocab_file={TINY_VOCAB}", "--max_seq_length=x", **pre),
       "--max_seq_length"),
      (_export(out, "--max_query_length=0", model_type="squad"), "--max_query_length=0"),
      (_export(out, "--max_answer_length=-3", model_type="squad"), "--max_answer_length=-3"),
      (_export(out, "--doc_stride=61", model_type="squad"),
       "--doc_stride=61 must be below the 61 context tokens of a window (--max_seq_length=128 - "
       "--max_query_length=64 - 3)"),
      (_export(out, "--max_seq_length=67", model_type="squad"),
       "--max_seq_length=67 must be above --max_query_length=64 + 3"),
      (_export(out, "--labels=pos,neg,pos", model_type="classifier"),
       "--labels: 'pos' is given twice"),
  ]
  for (_, flag), result in zip(cases, _run_all([args for args, _ in cases])):
    assert flag in _error_line(result)
  assert os.listdir(tmp_path) == []


# --- configs, vocabs and checkpoints through a real script ----------------------------------------


GOOD_CONFIG = json.load(open(os.path.join(TINY, "bert_config.json"), encoding="utf-8"))
BAD_CONFIGS = [  # (key, value): every field, the bad kinds of value spread over them
    ("vocab_size", 0), ("hidden_size", -4), ("num_hidden_layers", 2.5),
    ("num_attention_heads", "4"), ("intermediate_size", True), ("max_position_embeddings", None),
    ("type_vocab_size", 2.0), ("hidden_size", 10**9), ("hidden_dropout_prob", 1.0),
    ("attention_probs_dropout_prob", -0.1), ("initializer_range", 0),
    ("layer_norm_eps", -1e-12), ("hidden_act", "mish"), ("num_attention_heads", 3),
]


def test_every_bad_config_field_is_one_error_line_naming_the_key_and_file(tmp_path):
  cases = []
  for i, (key, value) in enumerate(BAD_CONFIGS):
    path = tmp_path / f"config{i}.json"
    path.write_text(json.dumps(dict(GOOD_CONFIG, **{key: value})))
    cases.append((path, key, None))
  # A misspelt size: warned about by name, and the missing one is the error.
  misspelt = dict(GOOD_CONFIG, num_hidden_layer=2)
  del misspelt["num_hidden_layers"]
  path = tmp_path / "misspelt.json"
  path.write_text(json.dumps(misspelt))
  cases.append((path, "num_hidden_layers", "unknown key(s) num_hidden_layer"))
  results = _run_all([_export(tmp_path / "out", f"--bert_config_file={path}")
                      for path, _, _ in cases])
  for (path, key, warning), result in zip(cases, results):
    line = _error_line(result)
    assert line.startswith(f"error: {path}: ") and key in line, line
    if warning:
      assert f"{path}: {warning}" in result.stderr
  assert not (tmp_path / "out").exists()
  _no_staging(tmp_path)


def _truncated(path, size):
  with open(path, "r+b") as f:
    f.truncate(size)


def test_damaged_checkpoints_are_one_error_line_naming_the_file(tmp_path):
  index = _copy(TINY, tmp_path / "index")
  _truncated(index / "bert_model.ckpt.index", 300)
  data = _copy(TINY, tmp_path / "data")
  _truncated(data / "bert_model.ckpt.data-00000-of-00001", 2000)
  hf = _copy(minilm_dir(), tmp_path / "hf", ["config.json", "vocab.txt", "model.safetensors"])
  _truncated(hf / "model.safetensors", 1_000_000)
  cases = [(index, f"{index}/bert_model.ckpt.index"),
           (data, f"{data}/bert_model.ckpt.data-00000-of-00001"),
           (hf, f"{hf}/model.safetensors")]
  before = {str(d): _snapshot(d) for d, _ in cases}
  # Each into its own folder: runs at once into one folder are refused by its writer lock
  # before they read a checkpoint.
  results = _run_all([_export(tmp_path / f"out{i}", f"--init_checkpoint={d}")
                      for i, (d, _) in enumerate(cases)])
  for i, ((directory, named), result) in enumerate(zip(cases, results)):
    assert named in _error_line(result)
    assert _snapshot(directory) == before[str(directory)]
    assert not (tmp_path / f"out{i}").exists()
  _no_staging(tmp_path)


# --- convert_checkpoint: never over its input -----------------------------------------------------


def test_convert_refuses_to_write_over_its_input(tmp_path):
  tf1 = _copy(TINY, tmp_path / "tf1")  # with the .meta a rewrite in place would leave stale
  link = tmp_path / "link"
  link.symlink_to(tf1)
  hf = tmp_path / "hf"
  hf.mkdir()
  for name in ("config.json", "vocab.txt", "model.safetensors"):
    (hf / name).symlink_to(os.path.join(minilm_dir(), name))
  project = tmp_path / "project"
  run_ok(["convert_checkpoint.py", f"--input={TINY_CKPT}", f"--output={project}",
       "--output_format=project"])
  training = _copy(TINY, tmp_path / "training", ["bert_config.json", "vocab.txt"])
  (training / "ckpt-5.index").write_bytes(b"a training run's checkpoint")
  convert = lambda source, output, fmt: ["convert_checkpoint.py", f"--input={source}",
                                         f"--output={output}", f"--output_format={fmt}"]
  cases = [
      (convert(f"{tf1}/bert_model.ckpt", tf1, "tf1"), f"{tf1}/bert_model.ckpt.index"),
      (convert(f"{tf1}/bert_model.ckpt", f"{tf1}/bert_model.ckpt", "tf1"),
       f"{tf1}/bert_model.ckpt.index"),
      (convert(f"{tf1}/bert_model.ckpt", link, "tf1"), "bert_model.ckpt.index"),
      (convert(f"{tf1}/bert_model.ckpt", tf1, "hf"), f"{tf1}/vocab.txt"),
      (convert(hf, hf, "hf"), f"{hf}/model.safetensors"),
      (convert(project, project, "project"), f"{project}/ckpt-0.index"),
      (convert(TINY_CKPT, training, "project"), f"{training} holds other checkpoints"),
  ]
  before = {str(d): _snapshot(d) for d in (tf1, hf, project, training, TINY)}
  for (args, named), result in zip(cases, _run_all([args for args, _ in cases])):
    line = _error_line(result)
    assert named in line, line
  for directory, snapshot in before.items():
    assert _snapshot(directory) == snapshot, directory
  _no_staging(tmp_path)
  for directory in (tf1, project, training):
    _no_staging(directory)


def test_convert_refuses_another_models_checkpoint_unless_overwrite(tmp_path):
  """A TF1 checkpoint directory of another model (the tiny one) as --output: refused untouched;
  with --overwrite, replaced whole (its stale .meta, which would describe the other model, goes)."""
  other = _copy(TINY, tmp_path / "other")
  args = ["convert_checkpoint.py", f"--input={minilm_dir()}", f"--output={other}",
          "--output_format=tf1"]
  before = _snapshot(other)
  line = _error_line(_run_all([args])[0])
  assert f"{other}/bert_model.ckpt.index exists (another model's checkpoint?)" in line, line
  assert _snapshot(other) == before
  run_ok(args + ["--overwrite"])
  assert not (other / "bert_model.ckpt.meta").exists()
  with open(other / "bert_config.json", encoding="utf-8") as f:
    assert json.load(f)["hidden_size"] == 384  # MiniLM's now, not the tiny model's
  _no_staging(other)


# --- export_model interrupted or on a full disk ---------------------------------------------------


def _staging(path):
  return [n for n in os.listdir(os.path.dirname(path)) if n.startswith(f".{path.name}.tmp-")]


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_export_stopped_by_a_signal_leaves_no_staging_and_the_earlier_export(
    tmp_path, earlier_export, signum, status):
  target = tmp_path / "model"
  before = _earlier_export_at(target, earlier_export)
  # The preprocessor spends seconds building its character tables in Python after its staging
  # directory exists: the signal comes then.
  proc = popen([PYTHON, *_export(target, f"--vocab_file={TINY_VOCAB}",
                                 model_type="preprocessor")],
               cwd=ROOT, env=ENV, stdout=DEVNULL, stderr=PIPE, text=True)
  deadline = time.time() + 120
  while not _staging(target):
    assert proc.poll() is None and time.time() < deadline, "the export never started writing"
    time.sleep(0.02)
  proc.send_signal(signum)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == status, stderr[-3000:]
  assert "Traceback" not in stderr
  assert stderr.strip().splitlines()[-1].startswith("error: stopped by SIG")
  assert not _staging(target)
  assert _snapshot(target) == before


def _on_a_small_disk(args, limit):
  def small_disk():
    # Writes past `limit` bytes fail with EFBIG (as on a full disk) instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

  return run_script(args, timeout=300, preexec_fn=small_disk)


def test_export_on_a_full_disk_is_one_error_line_and_keeps_the_earlier_export(
    tmp_path, earlier_export):
  target = tmp_path / "model"
  before = _earlier_export_at(target, earlier_export)
  result = _on_a_small_disk(
      _export(target, f"--vocab_file={TINY_VOCAB}", model_type="preprocessor"), 100_000)
  line = _error_line(result)
  assert f"--export_dir={target}: cannot write the SavedModel" in line
  assert "File too large" in line
  assert not _staging(target)
  assert _snapshot(target) == before


def test_litert_export_on_a_full_disk_is_one_error_line_and_leaves_nothing(tmp_path):
  target = tmp_path / "litert"
  result = _on_a_small_disk(_export(target, "--format=litert", "--quantize=int8"), 20_000)
  line = _error_line(result)
  assert f"--export_dir={target}: cannot write the LiteRT model" in line
  assert "File too large" in line
  assert not _staging(target) and not target.exists()


@pytest.mark.parametrize("output_format,named", [("hf", "model.safetensors"),
                                                 ("project", "--output=")])
def test_convert_on_a_full_disk_is_one_error_line_and_leaves_nothing(tmp_path, output_format,
                                                                     named):
  output = tmp_path / "out" / "converted"
  result = _on_a_small_disk(["convert_checkpoint.py", f"--input={TINY_CKPT}",
                             f"--output={output}", f"--output_format={output_format}"], 4000)
  line = _error_line(result)
  assert named in line and str(output) in line and "File too large" in line, line
  assert os.listdir(tmp_path) == []
