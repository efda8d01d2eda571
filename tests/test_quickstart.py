"""quickstart.py: the whole system end to end, from nothing but the standard library's docstrings.

Needs no ../shared and no download, as on a fresh machine: the test runs the real command (in its
--small setting) and checks every artefact it promises.
"""

import json
import os
import signal
import sys
import time

import pytest
import tensorflow as tf

from conftest import PIPE, ROOT, intercept_popen, popen, run_process
from bert_tf2 import quickstart
from bert_tf2 import tokenization


def _png_pixels(path):
  """The PNG's pixels [height, width, channels] (matplotlib reads it: a valid PNG)."""
  from matplotlib import image  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  return image.imread(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  out = tmp_path_factory.mktemp("quickstart")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  result = run_process([sys.executable, "quickstart.py", "--small", f"--output_dir={out}"],
                       cwd=ROOT, env=env, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return out, result.stdout


def test_quick_start_runs_green_and_leaves_every_artefact(run):
  out, stdout = run
  assert "=== Quick start summary ===" in stdout
  # The corpus: documents (modules) separated by blank lines, one sentence per line.
  with open(out / "data" / "corpus.txt", encoding="utf-8") as f:
    documents = [d for d in f.read().split("\n\n") if d.strip()]
  assert len(documents) > 50 and all("\n\n" not in d for d in documents)
  # The task: four areas, a header, no empty text.
  labels = set()
  for split in ("train", "dev", "test"):
    with open(out / "data" / "task" / f"{split}.tsv", encoding="utf-8") as f:
      rows = [line.rstrip("\n").split("\t") for line in f]
    assert rows[0] == ["sentence", "label"] and len(rows) > 20
    assert all(len(r) == 2 and r[0] for r in rows[1:])
    labels |= {r[1] for r in rows[1:]}
  assert labels == set(quickstart.AREAS)
  # Vocab, records, checkpoints, results, features, SavedModel, logs, plot.
  tokenizer = tokenization.FullTokenizer(str(out / "vocab" / "vocab.txt"))
  assert [tokenizer.vocab[t] for t in tokenization.SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
  assert os.path.getsize(out / "pretraining_data" / "pretraining.tfrecord") > 0
  assert tf.train.latest_checkpoint(str(out / "pretraining"))
  assert "masked_lm_accuracy" in (out / "pretraining" / "eval_results.txt").read_text()
  assert "eval_accuracy" in (out / "classifier" / "eval_results.txt").read_text()
  predictions = (out / "classifier" / "test_results.tsv").read_text().splitlines()
  assert len(predictions) > 20 and all(len(p.split("\t")) == len(labels) for p in predictions)
  with open(out / "features" / "features.jsonl", encoding="utf-8") as f:
    features = [json.loads(line) for line in f]
  assert [f["linex_index"] for f in features] == [0, 1]
  assert features[0]["features"][0]["token"] == "[CLS]"
  for step in ("vocab", "pretraining_data", "pretraining", "fine_tuning", "features",
               "export_classifier"):
    assert os.path.getsize(out / "logs" / f"{step}.log") > 0
  # Every query of the exported model got one of the labels.
  for query in quickstart.QUERIES:
    line = next(l for l in stdout.splitlines() if l.endswith(query))
    assert line.split()[0] in labels


def test_exported_classifier_serves_raw_text(run):
  out, _ = run
  serving = tf.saved_model.load(str(out / "export" / "classifier")).signatures["serving_default"]
  result = serving(text_a=tf.constant(["Read the next line from the file.", ""]))
  assert result["probabilities"].shape == (2, len(quickstart.AREAS))
  assert all(label.decode() in quickstart.AREAS for label in result["label"].numpy())


def test_loss_plot_and_tensorboard_logs(run):
  out, _ = run
  pretraining = quickstart.read_scalars(str(out / "pretraining" / "train"), "loss")
  fine_tuning = quickstart.read_scalars(str(out / "classifier" / "train"), "loss")
  assert len(pretraining) >= 5 and fine_tuning
  assert pretraining[-1][0] == quickstart.SETTINGS["small"]["pretrain_steps"]
  # Untrained, the masked-LM loss alone is about ln(vocab size); it falls during pre-training.
  assert pretraining[-1][1] < pretraining[0][1]
  pixels = _png_pixels(out / "losses.png")
  assert pixels.shape[:2] == (320, 840)
  colors = {tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::7].round(2)}
  assert len(colors) > 3  # Not a blank image: axes, text and both curves are drawn.


def test_docstring_sentences_leave_code_out(tmp_path):
  source = tmp_path / "mod.py"
  source.write_text('"""Tools for things.\n\nThis module reads files and writes them back. '
                    'It is short.\n\n    >>> read("x")\n    1\n\nArgs:\n  x: a thing\n"""\n'
                    'def f():\n  """Return the value of the thing, or None when missing."""\n')
  assert quickstart.docstring_sentences([str(source)]) == [
      "This module reads files and writes them back.",
      "Return the value of the thing, or None when missing."]


def test_loss_plot_draws_each_panel_in_its_color(tmp_path):
  path = str(tmp_path / "x.png")
  assert quickstart.plot_losses(path, [("a", [(0, 2.0), (10, 1.0)], "tab:blue"),
                                       ("b", [(5, 0.5)], "tab:orange")]) == path
  pixels = _png_pixels(path)[..., :3]
  assert pixels.shape[:2] == (320, 840)
  assert not [p for p in os.listdir(tmp_path) if p != "x.png"]  # no temporary left
  left, right = pixels[:, :420], pixels[:, 420:]
  blue, orange = (0.12, 0.47, 0.71), (1.0, 0.5, 0.05)  # tab:blue, tab:orange
  near = lambda part, rgb: (abs(part - rgb).max(axis=-1) < 0.05).sum()
  assert near(left, blue) > 50 and near(right, orange) > 10 and near(left, orange) == 0


def _connection_trouble(text):
  return any(m in text for m in ("NewConnectionError", "Temporary failure in name resolution",
                                 "Network is unreachable", "ConnectionError"))


def test_wheel_in_a_fresh_venv_gives_working_console_commands(tmp_path):
  """pyproject.toml, as a user meets it: the wheel built from the checkout, installed with its
  dependencies into a fresh venv (nothing of the checkout or of the project's .venv visible).
  The folder bert_tf2/ installs as the one package bert_tf2 (no generic top-level names in
  site-packages), each script has its bert-* command, the commands give one-line errors, the
  WordPiece commands name the tensorflow-text install line while it is missing, and once it is
  installed as that line says, `bert-quickstart --small` runs end to end."""
  import glob  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11+")
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)
  package = os.path.join(ROOT, "bert_tf2")
  modules = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(package, "*.py")))
  # bert_tf2 and its one subpackage, the original's API (bert_tf2.original_api).
  assert project["tool"]["setuptools"]["packages"] == ["bert_tf2", "bert_tf2.original_api"]
  original_api = sorted(os.path.basename(p)
                        for p in glob.glob(os.path.join(package, "original_api", "*.py")))
  scripts = project["project"]["scripts"]
  for name in ("create_pretraining_data", "run_pretraining", "run_classifier", "run_squad",
               "extract_features", "export_model", "build_vocab", "convert_checkpoint"):
    assert scripts["bert-" + name.replace("_", "-")] == f"bert_tf2.commands:{name}"
  # Build the wheel (no build isolation: setuptools is in the project's venv) from a copy, so the
  # checkout gets no build/ or egg-info.
  source = tmp_path / "source"
  source.mkdir()
  (source / "bert_tf2").mkdir()
  for name in modules:
    shutil.copy(os.path.join(package, f"{name}.py"), source / "bert_tf2")
  (source / "bert_tf2" / "original_api").mkdir()
  for name in original_api:
    shutil.copy(os.path.join(package, "original_api", name), source / "bert_tf2" / "original_api")
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(os.path.join(ROOT, name), source)
  pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
  run_process(pip + ["wheel", str(source), "--no-deps", "--no-build-isolation", "-w",
                     str(tmp_path / "dist")], check=True, cwd=None, env=None, text=False,
              timeout=300)
  wheel = next((tmp_path / "dist").glob("*.whl"))
  # A fresh venv, and the wheel with the dependencies it declares (from the package registry).
  venv = tmp_path / "venv"
  run_process([sys.executable, "-m", "venv", str(venv)], check=True, cwd=None, env=None,
              text=False, timeout=300)
  # The user's shell: no PYTHONPATH, no project venv on PATH; run away from the checkout.
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
  env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/bin", "/bin"])
  venv_pip = [str(venv / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
  result = run_process(venv_pip + ["install", str(wheel)], cwd=tmp_path, env=env, timeout=1200)
  if result.returncode != 0 and _connection_trouble(result.stderr):
    pytest.skip("the package registry cannot be reached: " + result.stderr.strip()[-300:])
  assert result.returncode == 0, result.stderr[-3000:]
  site = glob.glob(str(venv / "lib" / "python*" / "site-packages"))[0]
  assert os.path.isdir(os.path.join(site, "tensorflow")), "tensorflow-cpu came with the wheel"
  ours = [p for p in os.listdir(site) if p.startswith("bert_tf2")]
  assert sorted(p for p in ours if not p.endswith(".dist-info")) == ["bert_tf2"]
  assert not [p for p in os.listdir(site) if p in ("modeling", "modeling.py", "tokenization.py",
                                                   "run_classifier.py", "commands.py")]
  installed = os.listdir(os.path.join(site, "bert_tf2"))
  assert not [m for m in modules if f"{m}.py" not in installed]
  assert set(original_api) <= set(os.listdir(os.path.join(site, "bert_tf2", "original_api")))
  # A static tool (jedi) resolves each module of the installed package, from a user's file and
  # from inside the package (run_classifier.py's own imports).
  jedi = pytest.importorskip("jedi", reason="jedi is in requirements-test.txt")
  jproject = jedi.Project(str(tmp_path), sys_path=[site])
  for name in (m for m in modules if not m.startswith("__")):
    script = jedi.Script(f"from bert_tf2 import {name}\n", path=str(tmp_path / "user.py"),
                         project=jproject)
    assert ({str(n.module_path) for n in script.goto(1, 21, follow_imports=True)}
            == {os.path.join(site, "bert_tf2", f"{name}.py")}), name
  installed_script = os.path.join(site, "bert_tf2", "run_classifier.py")
  with open(installed_script, encoding="utf-8") as f:
    lines = f.read().splitlines()
  line = next(i for i, text in enumerate(lines, 1) if text == "from bert_tf2 import fine_tuning")
  script = jedi.Script("\n".join(lines), path=installed_script, project=jproject)
  assert ({str(n.module_path) for n in script.goto(line, 21, follow_imports=True)}
          == {os.path.join(site, "bert_tf2", "fine_tuning.py")})

  def command(name, *args, timeout=300):
    return run_process([str(venv / "bin" / name), *args], cwd=tmp_path, env=env, timeout=timeout)

  for name in scripts:
    assert os.access(venv / "bin" / name, os.X_OK), name
  result = command("bert-convert-checkpoint", "--output_format=hf")
  assert result.returncode == 2 and "error: --input and --output are required" in result.stderr
  # A missing required flag is a flag error like any other: one `error:` line, status 2.
  result = command("bert-create-pretraining-data")
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines() == [
      "error: --input_file, --output_file and --vocab_file are required"], result.stderr
  result = command("bert-run-classifier", "--help")
  assert result.returncode == 0 and "--task_name" in result.stdout
  # tensorflow-text is not a dependency of the wheel (see pyproject.toml): the commands that learn
  # a WordPiece vocabulary end in one line naming the install command, not a traceback.
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("The cat sat on the mat.\nA dog barked.\n\nAnother document here.\n")
  for name, args in (("bert-build-vocab", [f"--input_file={corpus}",
                                           f"--output_dir={tmp_path / 'vocab'}"]),
                     ("bert-quickstart", ["--small", f"--output_dir={tmp_path / 'qs'}"])):
    result = command(name, *args)
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: building a WordPiece vocabulary needs tensorflow-text"), result.stderr
    assert "pip install --no-deps tensorflow-text==2.21.1" in result.stderr
  assert not (tmp_path / "vocab").exists() and not (tmp_path / "qs").exists()
  # Done as the error line says, the quick start runs end to end from the installed command.
  result = run_process(venv_pip + ["install", "--no-deps", "tensorflow-text==2.21.1"],
                       cwd=tmp_path, env=env, timeout=1200)
  if result.returncode != 0 and _connection_trouble(result.stderr):
    pytest.skip("the package registry cannot be reached: " + result.stderr.strip()[-300:])
  assert result.returncode == 0, result.stderr[-3000:]
  result = command("bert-quickstart", "--small", f"--output_dir={tmp_path / 'qs'}", timeout=900)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  assert "Traceback" not in result.stderr and "=== Quick start summary ===" in result.stdout
  for artefact in ("vocab/vocab.txt", "losses.png", "export/classifier/saved_model.pb",
                   "classifier/test_results.tsv", "features/features.jsonl"):
    assert os.path.getsize(tmp_path / "qs" / artefact) > 0, artefact


def test_refuses_to_clear_a_directory_it_did_not_make(tmp_path):
  # A user's directory with folders named as the quick start's: nothing in it may be deleted.
  (tmp_path / "data").mkdir()
  (tmp_path / "data" / "thesis.txt").write_text("years of work")
  (tmp_path / "vocab").mkdir()
  result = run_process([sys.executable, "quickstart.py", "--small",
                        f"--output_dir={tmp_path}"], cwd=ROOT, env=None, timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith("error: --output_dir=")
  assert "Traceback" not in result.stderr
  assert (tmp_path / "data" / "thesis.txt").read_text() == "years of work"
  assert sorted(os.listdir(tmp_path)) == ["data", "vocab"]


def test_small_keeps_a_full_runs_output(tmp_path):
  """--small (a check that every step runs) never replaces a full run's folder: one error line,
  nothing touched; its default folder is its own."""
  full = tmp_path / "quickstart_output"
  (full / "classifier").mkdir(parents=True)
  (full / "classifier" / "model.txt").write_text("an hour of training")
  (full / quickstart.MARKER).write_text("Made by quickstart.py; a rerun replaces its "
                                        "sub-directories.\n")  # as a full run wrote it
  result = run_process([sys.executable, os.path.join(ROOT, "quickstart.py"), "--small",
                        f"--output_dir={full}"], cwd=ROOT, env=None, timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: --output_dir={full} holds a full quick-start run, which --small would replace: "
      "give --small another --output_dir (its default is ./quickstart_small_output)")
  assert (full / "classifier" / "model.txt").read_text() == "an hour of training"
  help_text = run_process([sys.executable, os.path.join(ROOT, "quickstart.py"), "--help"],
                          cwd=ROOT, env=None, timeout=120).stdout
  assert "--small ./quickstart_small_output" in " ".join(help_text.split())


def test_bad_argument_is_one_line_and_a_signal_stops_the_running_step(tmp_path):
  """`--bogus`: one error line, exit 2. SIGTERM while a step runs: the step gets it too (no
  orphan left running), one error line, exit 143."""
  result = run_process([sys.executable, "quickstart.py", "--bogus"], cwd=ROOT, env=None,
                       timeout=60)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == ["error: unrecognized arguments: --bogus"]
  out = tmp_path / "qs"
  proc = popen([sys.executable, "quickstart.py", "--small", f"--output_dir={out}"],
               cwd=ROOT, env=None, stdout=PIPE, stderr=PIPE, text=True)
  log = out / "logs" / "vocab.log"
  for _ in range(600):  # the first step has started once its log exists
    if log.exists():
      break
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err[-2000:]
  assert err.strip().splitlines()[-1] == "error: stopped by SIGTERM"
  assert "Traceback" not in err
  children = run_process(["pgrep", "-f", f"output_dir={out}/vocab"], cwd=None, env=None,
                         timeout=None)
  assert not children.stdout.strip(), children.stdout


def test_a_signal_while_a_step_is_being_started_stops_that_step_too(tmp_path, monkeypatch):
  """SIGTERM inside Popen(), after the fork (the window the test above can hit on a loaded
  machine): the step must still get the signal and be waited for, not be left running alone."""
  from bert_tf2 import processes  # pylint: disable=g-import-not-at-top
  started = []

  def signalled_while_starting(proc):
    started.append(proc.pid)
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(50):  # the handler runs at one of these, still inside the constructor
      time.sleep(0.001)

  corpus = tmp_path / "corpus.txt"
  corpus.write_text("one sentence here.\nanother sentence there.\n\nand a second document.\n")
  previous = signal.signal(signal.SIGTERM, processes._raise_interrupted)  # as run_main sets it
  intercept_popen(monkeypatch, signalled_while_starting)
  try:
    runner = quickstart.Runner(str(tmp_path / "out"))
    with pytest.raises(processes.Interrupted):
      runner("vocab", "build_vocab.py", input_file=str(corpus),
             output_dir=str(tmp_path / "out" / "vocab"), vocab_size=40)
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert len(started) == 1
  try:  # waited for (reaped) by the runner: no such child of ours any more
    pid, _ = os.waitpid(started[0], os.WNOHANG)
  except ChildProcessError:
    return
  os.kill(started[0], signal.SIGKILL)
  os.waitpid(started[0], 0)
  pytest.fail(f"the step {started[0]} was left running (waitpid gave {pid})")
