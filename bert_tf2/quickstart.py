"""The whole system end to end, in a few minutes on a laptop CPU, with nothing to download.

`make quickstart` (or `python quickstart.py`) builds its data from what every Python install has,
the docstrings of the standard library (read from the source files with `ast`, nothing imported),
and runs the project's own scripts on it, one subprocess each, exactly as a user would:

 1. corpus: one document per standard-library module, one sentence per line, in the pre-training
    format; and a small classification task: which area of the library a sentence documents
    (networking, files, concurrency or numbers), as train/dev/test .tsv files;
 2. build_vocab.py learns a WordPiece vocab from the corpus;
 3. create_pretraining_data.py writes masked-LM / next-sentence records;
 4. run_pretraining.py pre-trains a tiny BERT;
 5. run_classifier.py (--task_name=tsv) fine-tunes it on the task, evaluates and predicts;
 6. extract_features.py writes per-token vectors for two sentences;
 7. export_model.py exports the classifier (raw text in, label out) and the encoder (TF Hub
    layout) as SavedModels; the classifier is then queried with a raw string;
 8. the pre-training and fine-tuning losses are read back from the TensorBoard logs and drawn
    into a PNG (a small plotter below: no plotting library needed).

Every artefact goes under --output_dir (default ./quickstart_output), each step's log in its
logs/ folder, and a summary closes the run. --small only checks that every step runs (for the
tests; too little training to learn the task), in its own default folder.
"""

import argparse
import ast
import glob
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

from bert_tf2 import fileio
from bert_tf2 import processes
from bert_tf2 import run_dir
from bert_tf2 import tokenization

# The folder that holds the package bert_tf2 (the checkout, or site-packages when installed): on
# each step's PYTHONPATH, so that `python -m bert_tf2 SCRIPT` runs this same copy of the project.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = ".quickstart_output"

# The task's areas, by top-level module of the standard library (modules missing from this
# Python's version are skipped).
AREAS = {
    "net": ("http", "urllib", "email", "smtplib", "imaplib", "poplib", "ftplib", "socket",
            "socketserver", "ssl", "xmlrpc", "mailbox", "ipaddress", "nntplib", "wsgiref"),
    "files": ("os", "shutil", "pathlib", "glob", "fnmatch", "tarfile", "zipfile", "tempfile",
              "filecmp", "gzip", "bz2", "lzma", "ntpath", "posixpath", "genericpath", "stat",
              "fileinput", "zipimport", "dbm", "shelve"),
    "concurrency": ("threading", "multiprocessing", "concurrent", "asyncio", "queue", "sched",
                    "subprocess", "selectors", "_threading_local", "contextvars"),
    "numbers": ("decimal", "_pydecimal", "fractions", "statistics", "random", "numbers",
                "datetime", "_pydatetime", "calendar", "_strptime", "zoneinfo", "cmath", "math"),
}
# Parts of the standard library that are tests, tools or GUI demos rather than documentation.
_SKIPPED = {"test", "idlelib", "lib2to3", "site-packages", "tkinter", "turtledemo", "ensurepip",
            "pydoc_data", "this", "antigravity", "__phello__"}

SETTINGS = {
    # name: vocab size, sentences read for the vocab, hidden size, layers, sequence length,
    # pre-training steps, examples per area, fine-tuning epochs.
    "default": dict(vocab_size=3000, vocab_sentences=6000, hidden=64, layers=2, seq=64,
                    pretrain_steps=800, per_area=700, epochs=4.0),
    "small": dict(vocab_size=1200, vocab_sentences=2000, hidden=32, layers=1, seq=32,
                  pretrain_steps=40, per_area=60, epochs=1.0),
}

QUERIES = ["Open a connection to the mail server and send the message.",
           "Copy the directory tree and remove the temporary files.",
           "Round the number to the given precision and return the remainder.",
           "Start a worker thread and wait until the queue is empty."]


# ---------------------------------------------------------------------------------------------
# Data from the standard library's docstrings.


def stdlib_modules():
  """[(top-level module name, [its .py files])] of this Python's standard library, sorted."""
  stdlib = sysconfig.get_paths()["stdlib"]
  modules = []
  for name in sorted(os.listdir(stdlib)):
    path = os.path.join(stdlib, name)
    if name.endswith(".py") and name[:-3] not in _SKIPPED:
      modules.append((name[:-3], [path]))
    elif (os.path.isdir(path) and name not in _SKIPPED
          and os.path.exists(os.path.join(path, "__init__.py"))):
      files = []
      for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in ("test", "tests", "__pycache__"))
        files.extend(os.path.join(root, n) for n in sorted(names) if n.endswith(".py"))
      modules.append((name, files))
  return modules


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")


def docstring_sentences(files):
  """The prose sentences of the docstrings in `files` (module, class and function docstrings).

  Code examples, indented blocks, parameter lists and other non-prose lines are left out: a
  paragraph is kept when none of its lines is indented or an interactive example, and a
  sentence when it has 4 to 60 words and is mostly letters.
  """
  sentences = []
  for path in files:
    try:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError):
      continue
    for node in ast.walk(tree):
      if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      doc = ast.get_docstring(node)
      if not doc:
        continue
      for paragraph in re.split(r"\n\s*\n", doc):
        lines = paragraph.split("\n")
        if any(l.startswith((" ", "\t", ">>>", "...", ":", "-", "*")) for l in lines):
          continue
        for sentence in _SENTENCE_END.split(" ".join(l.strip() for l in lines)):
          words = sentence.split()
          letters = sum(c.isalpha() for c in sentence)
          if 4 <= len(words) <= 60 and letters >= 0.7 * len(sentence.replace(" ", "")):
            sentences.append(" ".join(words))
  return sentences


def build_data(data_dir, per_area, seed=12345):
  """Writes corpus.txt and task/{train,dev,test}.tsv; returns a dict of counts."""
  modules = [(name, docstring_sentences(files)) for name, files in stdlib_modules()]
  modules = [(name, sentences) for name, sentences in modules if sentences]
  os.makedirs(os.path.join(data_dir, "task"), exist_ok=True)
  corpus = os.path.join(data_dir, "corpus.txt")
  _write_text(corpus, "".join("\n".join(s) + "\n\n" for _, s in modules))

  area_of = {module: area for area, names in AREAS.items() for module in names}
  rng = random.Random(seed)
  rows = {"train": [], "dev": [], "test": []}
  for area in AREAS:
    pool = sorted({s for name, sentences in modules if area_of.get(name) == area
                   for s in sentences if "\t" not in s})
    rng.shuffle(pool)
    pool = pool[:per_area]
    cut_train, cut_dev = int(0.7 * len(pool)), int(0.85 * len(pool))
    rows["train"] += [(s, area) for s in pool[:cut_train]]
    rows["dev"] += [(s, area) for s in pool[cut_train:cut_dev]]
    rows["test"] += [(s, area) for s in pool[cut_dev:]]
  for split, examples in rows.items():
    rng.shuffle(examples)
    _write_text(os.path.join(data_dir, "task", f"{split}.tsv"),
                "sentence\tlabel\n" + "".join(f"{s}\t{a}\n" for s, a in examples))
  return {"documents": len(modules), "sentences": sum(len(s) for _, s in modules),
          **{f"{split}_examples": len(examples) for split, examples in rows.items()}}


def _write_text(path, text):
  """An exclusive temporary, then rename: a half-written file never appears under its name."""
  with fileio.open_atomic(path) as f:
    f.write(text)


# ---------------------------------------------------------------------------------------------
# Running the scripts.


class Runner:
  """Runs each step as a subprocess of this Python, its output in logs/<step>.log."""

  def __init__(self, output_dir):
    self.log_dir = os.path.join(output_dir, "logs")
    os.makedirs(self.log_dir, exist_ok=True)
    path = os.environ.get("PYTHONPATH")
    self.env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1",
                    PYTHONPATH=os.pathsep.join([PACKAGE_PARENT] + ([path] if path else [])))
    self.timings = {}

  def __call__(self, step, script, **flags):
    args = [sys.executable, "-m", "bert_tf2", script[:-len(".py")]]
    args += [f"--{k}={v}" if not isinstance(v, bool) else (f"--{k}" if v else f"--no{k}")
             for k, v in flags.items()]
    log = os.path.join(self.log_dir, f"{step}.log")
    print(f"[{step}] {script} ...", flush=True)
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
      f.write(" ".join(args) + "\n\n")
      f.flush()
      # A signal that came while Popen() runs, after the fork, would raise out of it with the
      # child started and its handle lost (an orphan step): it is held until the handle exists.
      held = []
      previous = {signum: signal.signal(signum, lambda signum, _: held.append(signum))
                  for signum in (signal.SIGINT, signal.SIGTERM)}
      try:
        result = subprocess.Popen(args, env=self.env, stdout=f, stderr=subprocess.STDOUT)
      finally:
        for signum, handler in previous.items():
          signal.signal(signum, handler)
      with result:
        try:
          if held:
            signal.raise_signal(held[0])  # now handled as it would have been, the step stopped
          result.wait()
        except BaseException as e:
          # Ctrl-C or SIGTERM here: the step gets the same signal, to remove its temporaries
          # and end its own workers, and is waited for; it is never left running alone.
          result.send_signal(signal.SIGINT if isinstance(e, KeyboardInterrupt)
                             else signal.SIGTERM)
          try:
            result.wait(timeout=60)
          except subprocess.TimeoutExpired:
            result.kill()
          raise
    self.timings[step] = time.monotonic() - start
    if result.returncode != 0:
      with open(log, encoding="utf-8") as f:
        tail = f.read()[-3000:]
      raise SystemExit(f"\n[{step}] FAILED (exit {result.returncode}); end of {log}:\n{tail}")
    print(f"[{step}] done in {self.timings[step]:.0f} s (log: {log})", flush=True)
    return log


def _results(path):
  """eval_results.txt -> {key: float}."""
  with open(path, encoding="utf-8") as f:
    return {k: float(v) for k, v in (line.strip().split(" = ") for line in f if " = " in line)}


# ---------------------------------------------------------------------------------------------
# TensorBoard scalars and the loss plot.


def read_scalars(log_dir, tag):
  """[(step, value)] of a scalar written with tf.summary.scalar into `log_dir`'s event files."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.core.util import event_pb2  # pylint: disable=g-import-not-at-top
  points = {}
  for path in sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))):
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      for value in event.summary.value:
        if value.tag == tag:
          number = (float(tf.make_ndarray(value.tensor)) if value.HasField("tensor")
                    else value.simple_value)
          points[event.step] = number
  return sorted(points.items())


def plot_losses(path, panels):
  """One panel per (title, [(step, value)], color[, evaluation [(step, value)]]), side by side: the
  training loss as a line, the same loss of the evaluation (--do_eval: the dev set for
  fine-tuning) as black diamonds; drawn with
  matplotlib and written atomically as a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")  # files only: no display needed
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), dpi=100,
                              squeeze=False)
  for axis, (title, points, color, *dev) in zip(axes[0], panels):
    dev = dev[0] if dev else None
    axis.set_title(title)
    axis.set_xlabel("step")
    axis.grid(alpha=0.3)
    if points:
      axis.plot([s for s, _ in points], [v for _, v in points], color=color,
                marker="o" if len(points) == 1 else None, label="training")
    if dev:
      axis.plot([s for s, _ in dev], [v for _, v in dev], "D", color="black", label="evaluation")
      axis.legend(fontsize="small")
  figure.tight_layout()
  with fileio.open_atomic(path, "wb") as f:
    figure.savefig(f, format="png")
  plt.close(figure)
  return path


# ---------------------------------------------------------------------------------------------


class _ArgumentParser(argparse.ArgumentParser):
  """argparse with a bad argument as one `error:` line (exit 2), as the scripts' flags."""

  def error(self, message):
    self.exit(2, f"error: {message}\n")


def main(argv=None):
  """Runs the quick start; Ctrl-C or SIGTERM stops it (and its running step) with one line."""
  processes.raise_on_stop_signals()
  try:
    return _main(argv)
  except (KeyboardInterrupt, processes.Interrupted) as e:
    sigint = isinstance(e, KeyboardInterrupt)
    print(f"error: stopped by {'SIGINT (Ctrl-C)' if sigint else e}", file=sys.stderr)
    return 130 if sigint else 143


def _marked_setting(marker):
  """The setting ("default" or "small") a quick-start output's marker names ("default" for a
  marker written before markers named one)."""
  with open(marker, encoding="utf-8", errors="replace") as f:
    for line in f:
      if line.startswith("setting: "):
        return line.split(":", 1)[1].strip()
  return "default"


def _main(argv):
  parser = _ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--output_dir", default=None,
                      help="Where every artefact goes (default: ./quickstart_output, with "
                      "--small ./quickstart_small_output).")
  parser.add_argument("--small", action="store_true",
                      help="A check that every step runs (a minute or so, for the tests): too "
                      "little training to learn the task.")
  args = parser.parse_args(argv)
  setting = "small" if args.small else "default"
  if args.output_dir is None:
    args.output_dir = "quickstart_small_output" if args.small else "quickstart_output"
  if importlib.util.find_spec("tensorflow_text") is None:  # its first step builds a vocabulary
    parser.exit(2, f"error: {tokenization.TEXT_INSTALL}\n")
  if fileio.is_remote(args.output_dir):  # a look around on this machine: plots, logs, a demo
    parser.exit(2, f"error: --output_dir={args.output_dir}: the quick start writes a local "
                "folder; give a local path (every other script takes gs:// paths)\n")
  s = SETTINGS[setting]
  out = os.path.abspath(args.output_dir)
  # A rerun starts from scratch (the training scripts would otherwise resume from the
  # checkpoints a previous run left, with other settings perhaps), so it deletes its own
  # sub-directories: only in a directory that is new, empty or marked as ours by a first run,
  # never in a user's directory that happens to hold a `data` or `vocab` folder.
  marker = os.path.join(out, MARKER)
  if os.path.isdir(out) and os.listdir(out) and not os.path.isfile(marker):
    parser.exit(2, f"error: --output_dir={out} exists and is not a quick-start output (no "
                f"{MARKER} in it); refusing to delete anything there: choose a new directory\n")
  if os.path.lexists(out) and not os.path.isdir(out):
    parser.exit(2, f"error: --output_dir={out} exists and is not a directory\n")
  # A full run's output is not replaced by a --small check's (a marker without a setting is a
  # full run's, as every run wrote before).
  if args.small and os.path.isfile(marker) and _marked_setting(marker) != "small":
    parser.exit(2, f"error: --output_dir={out} holds a full quick-start run, which --small would "
                "replace: give --small another --output_dir (its default is "
                "./quickstart_small_output)\n")
  os.makedirs(out, exist_ok=True)
  _write_text(marker, "Made by quickstart.py; a rerun replaces its sub-directories.\n"
              f"setting: {setting}\n")
  paths = {name: os.path.join(out, name) for name in
           ("data", "vocab", "pretraining_data", "pretraining", "classifier", "features",
            "export")}
  for path in list(paths.values()) + [os.path.join(out, "logs")]:
    shutil.rmtree(path, ignore_errors=True)
  run = Runner(out)
  start = time.monotonic()

  print(f"[data] standard-library docstrings -> {paths['data']} ...", flush=True)
  t = time.monotonic()
  counts = build_data(paths["data"], s["per_area"])
  print(f"[data] {counts['documents']} modules, {counts['sentences']} sentences; task: "
        f"{counts['train_examples']} train / {counts['dev_examples']} dev / "
        f"{counts['test_examples']} test ({time.monotonic() - t:.0f} s)", flush=True)
  corpus = os.path.join(paths["data"], "corpus.txt")
  task_dir = os.path.join(paths["data"], "task")
  labels = ",".join(AREAS)

  run("vocab", "build_vocab.py", input_file=corpus, output_dir=paths["vocab"],
      vocab_size=s["vocab_size"], max_sentences=s["vocab_sentences"])
  vocab = run_dir.vocab_file(paths["vocab"])
  with open(vocab, encoding="utf-8") as f:
    vocab_size = sum(1 for _ in f)

  records = os.path.join(paths["pretraining_data"], "pretraining.tfrecord")
  seq, predictions = s["seq"], max(2, s["seq"] * 15 // 100)
  run("pretraining_data", "create_pretraining_data.py", input_file=corpus, output_file=records,
      vocab_file=vocab, max_seq_length=seq, max_predictions_per_seq=predictions, dupe_factor=2,
      num_workers=1)

  os.makedirs(paths["pretraining"], exist_ok=True)
  config_file = run_dir.config_file(paths["pretraining"])
  hidden = s["hidden"]
  # A wider initialisation (0.2 rather than BERT's 0.02) and no dropout: a model this small,
  # trained this briefly, otherwise stays on the plateau where it predicts only frequent tokens
  # (a known slow start of post-LayerNorm Transformers), and then has nothing to fine-tune.
  _write_text(config_file, json.dumps(dict(
      vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=s["layers"],
      num_attention_heads=max(1, hidden // 32), intermediate_size=4 * hidden,
      max_position_embeddings=max(64, seq), type_vocab_size=2, hidden_act="gelu",
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2),
      indent=2) + "\n")
  steps = s["pretrain_steps"]
  run("pretraining", "run_pretraining.py", input_file=records, output_dir=paths["pretraining"],
      bert_config_file=config_file, max_seq_length=seq, max_predictions_per_seq=predictions,
      do_train=True, do_eval=True, train_batch_size=32, eval_batch_size=32, learning_rate=1e-3,
      num_train_steps=steps, num_warmup_steps=steps // 10,
      iterations_per_loop=max(steps // 40, 1),
      save_checkpoints_steps=steps, max_eval_steps=10)
  pretrain_results = _results(run_dir.eval_results_file(paths["pretraining"]))

  run("fine_tuning", "run_classifier.py", task_name="tsv", data_dir=task_dir,
      text_a_column="sentence", label_column="label", labels=labels, vocab_file=vocab,
      bert_config_file=config_file, init_checkpoint=paths["pretraining"],
      output_dir=paths["classifier"], max_seq_length=seq, do_train=True, do_eval=True,
      do_predict=True, train_batch_size=16, learning_rate=5e-4,
      num_train_epochs=s["epochs"], iterations_per_loop=5, save_checkpoints_steps=100000)
  eval_results = _results(run_dir.eval_results_file(paths["classifier"]))

  features = os.path.join(paths["features"], "features.jsonl")
  os.makedirs(paths["features"], exist_ok=True)
  features_input = os.path.join(paths["features"], "input.txt")
  _write_text(features_input, f"{QUERIES[0]}\n{QUERIES[1]} ||| {QUERIES[2]}\n")
  run("features", "extract_features.py", input_file=features_input, output_file=features,
      vocab_file=vocab, bert_config_file=config_file, init_checkpoint=paths["pretraining"],
      max_seq_length=seq, layers="-1,-2" if s["layers"] > 1 else "-1", batch_size=8)

  classifier_model = os.path.join(paths["export"], "classifier")
  run("export_classifier", "export_model.py", model_type="classifier",
      init_checkpoint=paths["classifier"], bert_config_file=config_file, vocab_file=vocab,
      labels=labels, max_seq_length=seq, export_dir=classifier_model)
  encoder_model = os.path.join(paths["export"], "encoder")
  if not args.small:
    run("export_encoder", "export_model.py", model_type="encoder",
        init_checkpoint=paths["pretraining"], bert_config_file=config_file, vocab_file=vocab,
        export_dir=encoder_model)

  print("[query] loading the exported classifier ...", flush=True)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  serving = tf.saved_model.load(classifier_model).signatures["serving_default"]
  answers = serving(text_a=tf.constant(QUERIES))

  # The losses the training curves show (pre-training: masked LM + next sentence), and the same
  # loss of each run's --do_eval at its end (training.write_eval_results' TensorBoard scalars).
  plot = plot_losses(os.path.join(out, "losses.png"), [
      ("pre-training loss", read_scalars(os.path.join(paths["pretraining"], "train"), "loss"),
       "tab:blue", read_scalars(os.path.join(paths["pretraining"], "eval"), "loss")),
      ("fine-tuning loss", read_scalars(os.path.join(paths["classifier"], "train"), "loss"),
       "tab:orange", read_scalars(os.path.join(paths["classifier"], "eval"), "eval_loss")),
  ])

  print("\n=== Quick start summary ===")
  print(f"Corpus (stdlib docstrings):  {corpus}  ({counts['documents']} documents, "
        f"{counts['sentences']} sentences)")
  print(f"Task (which library area):   {task_dir}/{{train,dev,test}}.tsv  labels: {labels}")
  print(f"WordPiece vocab:             {vocab}  ({vocab_size} tokens)")
  print(f"Pre-training records:        {records}")
  print(f"Pre-trained BERT:            {paths['pretraining']}  (hidden {hidden}, "
        f"{s['layers']} layer(s), {steps} steps; masked-LM accuracy "
        f"{pretrain_results.get('masked_lm_accuracy', float('nan')):.3f}, loss (masked LM + "
        f"next sentence, as plotted) {pretrain_results.get('loss', float('nan')):.2f})")
  print(f"Fine-tuned classifier:       {paths['classifier']}  (dev loss "
        f"{eval_results.get('eval_loss', float('nan')):.2f}, accuracy "
        f"{eval_results.get('eval_accuracy', float('nan')):.3f} on "
        f"{int(eval_results.get('eval_examples', 0))} examples; chance is "
        f"{1 / len(AREAS):.2f}" + ("; --small checks that every step runs, with too little "
                                   "training to learn the task: run without it for a model "
                                   "that does" if args.small else "") + ")")
  print(f"Test-set predictions:        {os.path.join(paths['classifier'], 'test_results.tsv')}")
  if features:
    print(f"Token features (JSON lines): {features}")
  print(f"Classifier SavedModel:       {classifier_model}")
  if not args.small:
    print(f"Encoder SavedModel (TF Hub): {encoder_model}")
  print(f"TensorBoard logs:            tensorboard --logdir {out}")
  print(f"Loss plot:                   {plot}")
  print("Queries of the SavedModel with raw strings:")
  for text, label, probs in zip(QUERIES, answers["label"].numpy(),
                                answers["probabilities"].numpy()):
    print(f"  {label.decode():12s} p={probs.max():.2f}  {text}")
  print(f"Try it yourself: python query_model.py --export_dir={classifier_model} "
        "--feed='text_a=Read the next line from the file.'")
  timings = ", ".join(f"{k} {v:.0f} s" for k, v in run.timings.items())
  print(f"Steps: {timings}")
  print(f"Total: {time.monotonic() - start:.0f} s")
  return 0


def cli():
  """The command line: `python quickstart.py` and the `bert-quickstart` command."""
  sys.exit(main())
