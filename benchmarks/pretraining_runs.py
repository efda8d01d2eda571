"""What the pre-training benchmarks share (pretraining_parity.py, time_to_quality.py): their
flags, the records of each recipe, our pre-training runs scored on held-out records at every
checkpoint, GLUE fine-tuning of the results, and the curves.

Each step is the project's command as a user runs it, in a child process (create_pretraining_data,
run_pretraining --do_train, run_pretraining --do_eval per checkpoint, run_classifier), so this
process imports no TensorFlow. A recipe is a row: the generator's flags for its records and the
trainer's flags for its run; the benchmark scripts hold their tables.
"""

import contextlib
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

from absl import flags

import common

FLAGS = flags.FLAGS

# The published BERT sizes (Turc et al. 2019 and the paper): L, H, A, I.
MODELS = {"tiny": (2, 128, 2, 512), "mini": (4, 256, 4, 1024), "small": (4, 512, 8, 2048),
          "medium": (8, 512, 8, 2048), "base": (12, 768, 12, 3072)}

common.define_corpus_flags()
FLAGS.set_default("corpus", os.path.join(common.SHARED, "data", "corpus",
                                         "enwiki_pretrain.sent_per_line.txt"))
flags.DEFINE_enum("model", "mini", list(MODELS), "Model size (every run).")
flags.DEFINE_float("budget_minutes", 0.0, "Minutes of each pre-training run (each script says "
                   "how it keeps them).", lower_bound=0.0)
flags.DEFINE_list("recipes", ["original", "modern"], "Our recipes (each script's table).")
flags.DEFINE_integer("seeds", 3, "Fine-tuning seeds per task and model.", lower_bound=1)
flags.DEFINE_list("downstream_tasks", ["SST-2", "MRPC", "CoLA", "STS-B", "RTE"],
                  "GLUE tasks (folders of --glue_dir) to fine-tune on; empty: no fine-tuning.")
flags.DEFINE_float("downstream_epochs", 3.0, "Fine-tuning epochs.", lower_bound=0.0)
flags.DEFINE_integer("downstream_max_steps", 60, "Cap on each fine-tuning run's steps (0: none).",
                     lower_bound=0)
flags.DEFINE_float("downstream_learning_rate", 1e-4, "Fine-tuning peak learning rate.")
flags.DEFINE_string("glue_dir", os.path.join(common.SHARED, "data", "glue"), "GLUE task folders.")
flags.DEFINE_string("eval_text", None, "Evaluate on this text (same format) instead of the "
                    "held-out documents (which are then still not trained on).")
flags.DEFINE_float("heldout_fraction", 0.02, "Share of the corpus' documents (the last ones) "
                   "held out for evaluation.", lower_bound=0.0, upper_bound=0.5)
flags.DEFINE_integer("max_train_docs", 0, "Train on the first N documents only (0: all).",
                     lower_bound=0)
flags.DEFINE_integer("eval_every", 0, "Steps between evaluations (0: a tenth of the run).",
                     lower_bound=0)
flags.DEFINE_integer("eval_instances", 512, "Held-out instances scored (whole batches).",
                     lower_bound=1)
flags.DEFINE_integer("eval_batch_size", 64, "Evaluation batch size.", lower_bound=1)
flags.DEFINE_integer("train_batch_size", 32, "Pre-training batch size.", lower_bound=1)
flags.DEFINE_float("learning_rate", 5e-4, "Peak pre-training learning rate.")
flags.DEFINE_integer("seq_length", 128, "max_seq_length.", lower_bound=8)
flags.DEFINE_integer("max_predictions", 20, "max_predictions_per_seq at a 15% masking rate (the "
                     "held-out records and the original recipe).", lower_bound=1)
flags.DEFINE_integer("dupe_factor", 5, "create_pretraining_data --dupe_factor of the original "
                     "recipe (the others: 1, masks drawn anew each read).", lower_bound=1)
flags.DEFINE_integer("seed", 12345, "Seed of every pre-training run and of the data.")
flags.DEFINE_enum("precision", "auto", ["auto", "fp32", "bf16"],
                  "bf16 (ours --mixed_precision=bf16, a peer's bf16 autocast) or fp32; auto: "
                  "bf16 where the CPU has avx512_bf16 or AMX.")
flags.DEFINE_string("ours_flags", "", "Extra flags for run_pretraining.py --do_train, space "
                    "separated (e.g. --use_xla).")
flags.DEFINE_string("work_dir", None, "Text, records, checkpoints, logs (records are reused by "
                    "a later run with the same settings; default /tmp/<benchmark>).")
flags.DEFINE_string("plot", None, "PNG of the curves (default <work_dir>/<benchmark>.png).")

# common's rounding of figures and the marker of a child's result line.
round_figure = common._round  # pylint: disable=protected-access
RESULT = common._RESULT_PREFIX  # pylint: disable=protected-access
SAVED = re.compile(r"Saved checkpoint \S*ckpt-(\d+)")
STEP = re.compile(r"step (\d+)/(~?\d+|\?) .*?\bloss=(\S+)")  # /~N, /?: under a time budget
STEPS_PER_SECOND = re.compile(r"\| (\S+) steps/s")
METRICS = ("masked_lm_loss", "masked_lm_accuracy", "next_sentence_accuracy")


def benchmark_name():
  return os.path.splitext(os.path.basename(sys.argv[0]))[0]


def set_up_work_dir():
  """--work_dir (default /tmp/<benchmark>), absolute, created."""
  FLAGS.work_dir = os.path.abspath(FLAGS.work_dir or os.path.join("/tmp", benchmark_name()))
  os.makedirs(FLAGS.work_dir, exist_ok=True)


# --- settings -------------------------------------------------------------------------------------


def dims():
  layers, hidden, heads, intermediate = MODELS[FLAGS.model]
  return dict(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
              num_attention_heads=heads, intermediate_size=intermediate,
              max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02,
              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def precision():
  if FLAGS.precision != "auto":
    return FLAGS.precision
  isa = set(common.machine().get("isa", ()))
  return "bf16" if isa & {"avx512_bf16", "amx_bf16"} else "fp32"


def mixed_precision_flag(variant):
  return "--mixed_precision=" + ("bf16" if variant == "bf16" else "none")


def eval_batches():
  return max(1, FLAGS.eval_instances // FLAGS.eval_batch_size)


def path(*parts):
  return os.path.join(FLAGS.work_dir, *parts)


def records(name):
  return path("data", f"{name}.tfrecord")


def script(name):
  return os.path.join(common.ROOT, name)


def log(message):
  print(f"[{benchmark_name()}] {message}", file=sys.stderr, flush=True)


def read_key_values(file_path):
  """eval_results.txt of run_pretraining / run_classifier: {key: float} of `key = value` lines."""
  out = {}
  with open(file_path, encoding="utf-8") as f:
    for line in f:
      key, _, value = line.partition("=")
      with contextlib.suppress(ValueError):
        out[key.strip()] = float(value)
  return out


# --- child processes with live progress -----------------------------------------------------------


def stream(args, label, log_path, budget_s=None):
  """Runs `args`, forwarding its output lines (prefixed with `label`) to stderr as they come and
  to `log_path`; with `budget_s`, sends it SIGINT once after that many seconds. Returns (exit
  status, [(seconds since start, line)])."""
  env = dict(os.environ, PYTHONUNBUFFERED="1",
             TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
  start = time.time()
  proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, errors="replace")
  timer = None
  if budget_s:
    timer = threading.Timer(budget_s, lambda: proc.poll() is None and proc.send_signal(
        signal.SIGINT))
    timer.start()
  lines = []
  with open(log_path, "w", encoding="utf-8") as log_file:
    for line in proc.stdout:
      lines.append((time.time() - start, line.rstrip("\n")))
      log_file.write(line)
      if not line.startswith(RESULT):
        print(f"[{label}] {line.rstrip()}", file=sys.stderr, flush=True)
  proc.wait()
  if timer:
    timer.cancel()
  return proc.returncode, lines


def quiet(args, log_path):
  """Runs `args` with its output to `log_path`; raises with the log's end if it fails."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
  with open(log_path, "w", encoding="utf-8") as log_file:
    code = subprocess.run(args, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                          check=False).returncode
  if code:
    with open(log_path, encoding="utf-8", errors="replace") as f:
      tail = f.read()[-1500:]
    raise RuntimeError(f"{os.path.basename(args[1])} exit {code} (log {log_path}):\n{tail}")


# --- data -----------------------------------------------------------------------------------------


def _write_text(documents, file_path):
  with open(file_path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(d) for d in documents) + "\n")


def split_corpus():
  """(training documents, held-out documents) of --corpus / --eval_text."""
  documents = common.read_documents(FLAGS.corpus)
  held = max(1, round(len(documents) * FLAGS.heldout_fraction))
  train_docs, held_docs = documents[:-held], documents[-held:]
  if FLAGS.max_train_docs:
    train_docs = train_docs[:FLAGS.max_train_docs]
  if FLAGS.eval_text:
    held_docs = common.read_documents(FLAGS.eval_text)
  return train_docs, held_docs


def make_records(jobs):
  """Writes records `name` from (documents, create_pretraining_data flags) for each of `jobs`
  (kept when their settings are those of an earlier run); returns facts about each."""
  os.makedirs(path("data"), exist_ok=True)
  common_args = [f"--vocab_file={FLAGS.vocab_file}", "--do_lower_case",
                 f"--max_seq_length={FLAGS.seq_length}", "--short_seq_prob=0.1"]
  facts = {}
  for name, (docs, args) in jobs.items():
    text = path("data", f"{name}.txt")
    key = json.dumps({"docs": len(docs), "first": docs[0][:2], "last": docs[-1][-2:],
                      "args": common_args + args, "corpus": FLAGS.eval_text if name == "eval"
                      else FLAGS.corpus})
    stamp = records(name) + ".settings"
    if os.path.exists(records(name)) and os.path.exists(stamp):
      with open(stamp, encoding="utf-8") as f:
        if f.read() == key:
          facts[name] = {"documents": len(docs), "records": common.count_records(records(name)),
                         "reused": True}
          continue
    _write_text(docs, text)
    log(f"creating the {name} records from {len(docs)} documents ...")
    start = time.time()
    quiet([sys.executable, script("create_pretraining_data.py"), f"--input_file={text}",
           f"--output_file={records(name)}", *common_args, *args], path("data", f"{name}.log"))
    with open(stamp, "w", encoding="utf-8") as f:
      f.write(key)
    facts[name] = {"documents": len(docs), "records": common.count_records(records(name)),
                   "seconds": round(time.time() - start, 1)}
  return facts


# --- ours -----------------------------------------------------------------------------------------


def write_bert_config():
  file_path = path("bert_config.json")
  with open(file_path, "w", encoding="utf-8") as f:
    json.dump(dict(dims(), hidden_act="gelu"), f, indent=2)  # ours' gelu: the tanh form
  return file_path


def evaluate_checkpoint(checkpoint, out_dir, variant, eval_records="eval"):
  """run_pretraining.py --do_eval of `checkpoint` on the held-out records: its metrics."""
  os.makedirs(out_dir, exist_ok=True)
  quiet([sys.executable, script("run_pretraining.py"), "--do_eval",
         f"--input_file={records(eval_records)}", f"--init_checkpoint={checkpoint}",
         f"--bert_config_file={path('bert_config.json')}", f"--output_dir={out_dir}",
         f"--eval_batch_size={FLAGS.eval_batch_size}", f"--max_eval_steps={eval_batches()}",
         f"--max_seq_length={FLAGS.seq_length}",
         f"--max_predictions_per_seq={FLAGS.max_predictions}", mixed_precision_flag(variant)],
        os.path.join(out_dir, "log.txt"))
  values = read_key_values(os.path.join(out_dir, "eval_results.txt"))
  return {k: values.get(k) for k in METRICS}


def pretrain(recipe, variant, args, stop_after_s=None, records_name=None, evaluate=True):
  """run_pretraining.py --do_train of recipe `recipe` (its records, or those of `records_name`;
  the shared settings, then `args`: the recipe's and the schedule's flags), then --do_eval of
  each checkpoint it saved (unless not `evaluate`). A point's wall-clock is when its "Saved
  checkpoint" line arrived, counted from the command's start (TensorFlow's start-up and tracing
  included); evaluating costs it nothing. `stop_after_s`: Ctrl-C after that many seconds (a
  checkpoint, then the end). The result's steps_per_second is its last progress line's."""
  out = path(f"ours-{recipe}")
  # A fresh run (its clock must not start from a resumed checkpoint), fresh evaluations.
  for folder in (out, path(f"ours-{recipe}-eval")):
    shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(out)
  command = [sys.executable, script("run_pretraining.py"), "--do_train",
             f"--input_file={records(records_name or recipe)}", f"--output_dir={out}",
             f"--bert_config_file={path('bert_config.json')}",
             f"--train_batch_size={FLAGS.train_batch_size}",
             f"--learning_rate={FLAGS.learning_rate}", f"--seed={FLAGS.seed}",
             f"--max_seq_length={FLAGS.seq_length}", "--optimizer=adamw",
             mixed_precision_flag(variant), *args, *FLAGS.ours_flags.split()]
  log(f"ours/{recipe}: run_pretraining.py --do_train {' '.join(args)} ...")
  code, lines = stream(command, f"ours/{recipe}", os.path.join(out, "train_log.txt"),
                       stop_after_s)
  saved = {int(m.group(1)): t for t, line in lines if (m := SAVED.search(line))}
  losses = [(int(m.group(1)), float(m.group(3)), round(t, 2)) for t, line in lines
            if (m := STEP.search(line))]
  if code not in (0, 130) or not saved:
    tail = "\n".join(line for _, line in lines[-15:])
    return {"error": f"run_pretraining.py exit {code}: {tail[-1500:]}"}
  train_s = lines[-1][0] if lines else None
  rates = [float(m.group(1)) for _, line in lines if (m := STEPS_PER_SECOND.search(line))]
  if not evaluate:
    return {"process_s": round(train_s, 1), "steps_per_second": rates[-1] if rates else None}
  log(f"ours/{recipe}: evaluating {len(saved)} checkpoints with run_pretraining.py --do_eval ...")
  curve, eval_start = [], time.time()
  for step in sorted(saved):
    metrics = evaluate_checkpoint(os.path.join(out, f"ckpt-{step}"),
                                  path(f"ours-{recipe}-eval", f"step{step}"), variant)
    curve.append({"step": step, "seconds": round(saved[step], 2), **metrics})
    log(f"ours/{recipe} step {step}: {metrics}")
  return {"curve": curve, "training_losses": losses, "process_s": round(train_s, 1),
          "steps_per_second": rates[-1] if rates else None,
          "eval_s": round(time.time() - eval_start, 1), "exit_code": code,
          "final_checkpoint": os.path.join(out, f"ckpt-{max(saved)}")}


# --- downstream -----------------------------------------------------------------------------------


def main_metric(task):
  return {"cola": "mcc", "mrpc": "f1", "sts-b": "pearson"}.get(task.lower(), "accuracy")


def _train_examples(task):
  """Training examples of a GLUE task: train.tsv's lines but the header (CoLA has none); read
  here rather than with run_classifier's processors, which would import TensorFlow."""
  with open(os.path.join(FLAGS.glue_dir, task, "train.tsv"), encoding="utf-8") as f:
    lines = sum(1 for line in f if line.strip())
  return max(1, lines - (task.lower() != "cola"))


def _finetune(model_name, checkpoint, task, seed, epochs, variant):
  out = path("downstream", model_name, task, f"seed{seed}")
  shutil.rmtree(out, ignore_errors=True)
  os.makedirs(out)
  args = [sys.executable, script("run_classifier.py"), f"--task_name={task}",
          f"--data_dir={os.path.join(FLAGS.glue_dir, task)}", f"--vocab_file={FLAGS.vocab_file}",
          f"--bert_config_file={path('bert_config.json')}", f"--output_dir={out}",
          "--do_train", "--do_eval", "--do_lower_case", f"--max_seq_length={FLAGS.seq_length}",
          "--train_batch_size=32", f"--learning_rate={FLAGS.downstream_learning_rate}",
          f"--num_train_epochs={epochs}", f"--seed={seed}", mixed_precision_flag(variant),
          *([f"--init_checkpoint={checkpoint}"] if checkpoint else [])]
  start = time.time()
  try:
    quiet(args, os.path.join(out, "log.txt"))
  except RuntimeError as e:
    log(f"downstream {model_name} {task} seed {seed} failed: {e}")
    return {"error": str(e)[-800:]}
  scores = {k[len("eval_"):]: v for k, v in
            read_key_values(os.path.join(out, "eval_results.txt")).items()
            if k.startswith("eval_")}
  return {"score": scores.get(main_metric(task)), "scores": scores,
          "seconds": round(time.time() - start, 1)}


def downstream(checkpoints, variant):
  """{model: {task: {seed: result}}} of run_classifier runs of each of `checkpoints` ({model:
  checkpoint, or None for a never-pre-trained model}), and each model's per-task means."""
  runs = {m: {} for m in checkpoints}
  for task in FLAGS.downstream_tasks:
    epochs = FLAGS.downstream_epochs
    if FLAGS.downstream_max_steps:
      epochs = min(epochs, FLAGS.downstream_max_steps * 32 / _train_examples(task))
    for seed in range(1, FLAGS.seeds + 1):
      for model_name, checkpoint in checkpoints.items():
        log(f"downstream: {model_name} {task} seed {seed} ({epochs:.3g} epochs) ...")
        result = _finetune(model_name, checkpoint, task, seed, round(epochs, 4), variant)
        runs[model_name].setdefault(task, {})[seed] = result
        log(f"  -> {result.get('score', result.get('error'))}")
  means = {m: {t: (statistics.mean(s) if (s := [r["score"] for r in seeds.values()
                                                 if r.get("score") is not None]) else None)
               for t, seeds in tasks.items()} for m, tasks in runs.items()}
  return runs, means


def mean_score(task_means):
  """The mean over --downstream_tasks of one model's per-task means, in points (None if any
  task has no score)."""
  values = [task_means.get(task) for task in FLAGS.downstream_tasks]
  return round(100 * statistics.mean(values), 2) if values and None not in values else None


# --- curves and plot ------------------------------------------------------------------------------


def time_to_loss(curve, target):
  """Seconds at which the eval curve first reaches `target` (linear between eval points)."""
  previous = None
  for point in curve:
    loss = point["masked_lm_loss"]
    if loss is not None and loss <= target:
      if previous is None or previous["masked_lm_loss"] is None:
        return point["seconds"]
      p0, p1 = previous, point
      share = (p0["masked_lm_loss"] - target) / max(p0["masked_lm_loss"] - loss, 1e-12)
      return p0["seconds"] + share * (p1["seconds"] - p0["seconds"])
    previous = point
  return None


def final(result, key="masked_lm_loss"):
  curve = (result or {}).get("curve") or []
  return curve[-1].get(key) if curve else None


def plot(runs, file_path, title):
  """Held-out masked-LM loss of each of `runs` ({label: result}) against steps and seconds."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for name, result in runs.items():
    curve = [p for p in (result or {}).get("curve") or [] if p["masked_lm_loss"] is not None]
    if not curve:
      continue
    loss = [p["masked_lm_loss"] for p in curve]
    style = "--" if name.startswith("HF") else "-"
    axes[0].plot([p["step"] for p in curve], loss, style, marker="o", label=name)
    axes[1].plot([p["seconds"] for p in curve], loss, style, marker="o", label=name)
  for ax, xlabel in zip(axes, ("step", "wall-clock seconds (process start)")):
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out masked-LM loss")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(file_path)), exist_ok=True)
  fig.savefig(file_path, dpi=100)
  plt.close(fig)


# --- the JSON line --------------------------------------------------------------------------------


def data_settings():
  """The settings of the text, the held-out scoring and the fine-tuning every such benchmark
  records."""
  return {"corpus": FLAGS.corpus, "eval_text": FLAGS.eval_text or "held-out documents",
          "heldout_fraction": FLAGS.heldout_fraction, "max_train_docs": FLAGS.max_train_docs,
          "seed": FLAGS.seed, "downstream_tasks": FLAGS.downstream_tasks,
          "downstream_seeds": FLAGS.seeds, "downstream_epochs": FLAGS.downstream_epochs,
          "downstream_max_steps": FLAGS.downstream_max_steps,
          "downstream_learning_rate": FLAGS.downstream_learning_rate}


def emit(figures, settings, details, top, peer_name, peer_missing=None):
  """common.emit's line with the benchmark's headline keys (`top`) after the first figure's,
  printed and written to <work_dir>/<benchmark>.json."""
  captured = io.StringIO()
  with contextlib.redirect_stdout(captured):
    line = common.emit(benchmark_name(), figures, settings, details, peer_name=peer_name,
                       peer_missing=peer_missing)
  rest = ("figures", "settings", "details", "machine", "versions")
  line = {**{k: v for k, v in line.items() if k not in rest}, **top,
          **{k: line[k] for k in rest}}
  text = json.dumps(line)
  with open(path(f"{benchmark_name()}.json"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
  print(text, flush=True)
