"""Pre-training parity with HuggingFace (issue #30): the same BERT pre-trained from scratch on both
sides, held-out masked-LM loss against steps and wall-clock, then GLUE fine-tuning of each result.

Data. The text is ../shared's Wikipedia extract (one sentence per line, a blank line between
documents). The last --heldout_fraction of its documents are held out and never trained on
(--eval_text=FILE evaluates on another text of the same format instead; --max_train_docs caps the
training documents for a quick run). create_pretraining_data.py (seq --seq_length, 20 predictions
a sequence, BERT's uncased vocabulary) writes:

* `original` records: --mode=exact, the original script's records: static masks, MLM + NSP,
  --dupe_factor passes over the text, all instances shuffled together (the paper's). Exact mode,
  not fast: fast mode streams the text and shuffles only within a bounded buffer, so its records
  come out in the text's order, and a run that trains on a fraction of one pass (600 steps here
  read 3% of the instances) would learn from the first documents only (the first run of this
  benchmark did, and came out 1% worse: benchmarks/README.md);
* `modern` records: --mode=fast --dynamic_masking --pack_sequences --dupe_factor=1 (fast mode is
  what dynamic masking and packing need; its 600 steps read the first ~7% of the text in
  order, while the peer samples all of it; run_pretraining masks
  them anew at every read and keeps the packed instances apart). NSP is kept: this project's
  packed records carry one next-sentence label per packed instance (--max_instances_per_pack
  slots a sequence) and run_pretraining trains on them, so the two recipes differ only in
  masking and packing, and the held-out NSP accuracy stays comparable across all three runs (a
  packed step holds --train_batch_size sequences of 2-3 instances each: more text a step);
* `eval` records: the held-out text once (--dupe_factor=1), static masks, a fixed seed; both
  sides are scored on the first --eval_instances of them (whole --eval_batch_size batches).

Ours: the project's commands as a user runs them, each a child process: `run_pretraining.py
--do_train` per recipe (checkpoint every --eval_every steps: the save is part of its clock, as in
any run), then, after training, `run_pretraining.py --do_eval --init_checkpoint=<ckpt-N>
--input_file=<eval records>` for each saved checkpoint, so evaluating costs the training clock
nothing. A point's wall-clock is when its "Saved checkpoint" line arrived, counted from the
command's start (TensorFlow's start-up and tracing included).

Peer: HF `BertForPreTraining` (random init from the same config; hidden_act gelu_new, the tanh
GELU that ours' "gelu" is) in a plain torch loop in a child process of this script that imports no
TensorFlow: torch.optim.AdamW (eps 1e-8, as ours' --optimizer=adamw), weight decay 0.01 except
LayerNorm and biases, global-norm clipping 1.0, dropout 0.1, the same batch, peak learning rate,
warm-up and linear decay (run_pretraining's default `original` schedule, as a LambdaLR), the same
number of steps, and the same training instances: the `original` records, converted once to
.npz by a TensorFlow child (a seeded random sample of --steps x batch of them, shuffled). It
evaluates itself every --eval_every steps on the eval records' .npz with the clock paused, with
the definitions of modeling.pretraining_losses (summed masked-LM NLL / weight, argmax accuracy,
NSP accuracy); its final weights are also converted with `convert_checkpoint.py` and scored by
`run_pretraining.py --do_eval` (details.peer_final_eval_by_run_pretraining: the cross-check that
both evaluations agree). Its clock also counts from its process start (imports included).

Precision: --precision=auto is bf16 on both sides when the CPU has avx512_bf16 or AMX
(run_pretraining --mixed_precision=bf16, torch bf16 autocast), else fp32; recorded in settings.

Downstream: each side's final checkpoint (ours: the --downstream_recipes; HF: converted) and a
never-pre-trained model of the same size (run_classifier.py with --bert_config_file only) are
fine-tuned with `run_classifier.py` on --downstream_tasks, --seeds seeds each, dev scores (main
metric: MCC for CoLA, F1 for MRPC, Pearson for STS-B, accuracy otherwise). Each run is
--downstream_epochs epochs, capped at --downstream_max_steps steps (set through a fractional
--num_train_epochs).

--budget_minutes=M stops each pre-training run after M minutes of its own clock (ours by Ctrl-C,
which checkpoints and stops at the end of the current loop of at most 25 steps; HF after the step
that crosses it, with a last evaluation), instead of after --steps; the learning-rate schedule
still spans --steps, and mlm_loss_ratio then compares the two runs' last points.

Prints one JSON line (common.emit's layout) with, at its top level:
* mlm_loss_ratio: our original recipe's final held-out masked-LM loss / HF's (below 1: ours lower);
* speedup_to_hf_loss: HF's wall-clock to its final held-out loss / ours' to reach that loss
  (interpolated linearly between our eval points; when our first point is below it already, that
  point's time, so a lower bound; null when ours never reaches it);
* downstream_diff: our mean dev score - HF's, points (null when fine-tuning is skipped).
The same line is written to <work_dir>/pretraining_parity.json, and the curves (held-out MLM
loss against steps and against seconds) to --plot (default <work_dir>/pretraining_parity.png).

Duration. The defaults (BERT-Mini, seq 128, batch 32, --steps=600, 10 evaluations, both recipes
and HF, then 5 tasks x 3 seeds x 3 models of at most 60 fine-tuning steps) take about an hour on
the project's 2-core CPU, from short timings on it (Mini, bf16): records of the whole corpus ~2
min; ours ~2.0 steps/s (~5 min a recipe), ~12 s per checkpoint evaluation (a process each, 20 in
all); HF ~0.55 steps/s (~18 min; its MLM head projects every position onto the vocabulary, ours
only the masked ones) plus ~10 s per evaluation off its clock; fine-tuning ~8 s of start-up and
1.5-4 steps/s (~30 s a run, ~25 min for the 45). Larger settings fit a GPU: on one H100/H200-class
GPU BERT-base at --steps=20000 --train_batch_size=256 is a few hours a side, and BERT-Mini at
--steps=10000 well under an hour for the whole run.

  python benchmarks/pretraining_parity.py                       # the default, about an hour
  python benchmarks/pretraining_parity.py --model=tiny --steps=4 --eval_every=2 \
      --max_train_docs=50 --downstream_tasks= --nopeer --work_dir=/tmp/pp     # smoke test
"""

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

START = time.time()  # a child's clock starts here, before its heavy imports

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS

# The published BERT sizes (Turc et al. 2019 and the paper): L, H, A, I.
MODELS = {"tiny": (2, 128, 2, 512), "mini": (4, 256, 4, 1024), "small": (4, 512, 8, 2048),
          "medium": (8, 512, 8, 2048), "base": (12, 768, 12, 3072)}
RECIPES = ("original", "modern")

common.define_corpus_flags()
FLAGS.set_default("corpus", os.path.join(common.SHARED, "data", "corpus",
                                         "enwiki_pretrain.sent_per_line.txt"))
flags.DEFINE_enum("model", "mini", list(MODELS), "Model size (both sides).")
flags.DEFINE_integer("steps", 600, "Optimizer steps of each pre-training run.", lower_bound=1)
flags.DEFINE_float("budget_minutes", 0.0, "If > 0: stop each pre-training run after this many "
                   "minutes of its own clock instead of after --steps.", lower_bound=0.0)
flags.DEFINE_list("recipes", list(RECIPES), "Our recipes: original (static masks, MLM + NSP) "
                  "and/or modern (dynamic masking + packed sequences, NSP kept).")
flags.DEFINE_integer("seeds", 3, "Fine-tuning seeds per task and model.", lower_bound=1)
flags.DEFINE_list("downstream_tasks", ["SST-2", "MRPC", "CoLA", "STS-B", "RTE"],
                  "GLUE tasks (folders of --glue_dir) to fine-tune on; empty: no fine-tuning.")
flags.DEFINE_list("downstream_recipes", ["original"], "Which of our recipes' checkpoints are "
                  "fine-tuned (HF's and the random-init floor always are).")
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
flags.DEFINE_integer("eval_every", 0, "Steps between evaluations (0: --steps / 10).",
                     lower_bound=0)
flags.DEFINE_integer("eval_instances", 512, "Held-out instances scored (whole batches).",
                     lower_bound=1)
flags.DEFINE_integer("eval_batch_size", 64, "Evaluation batch size.", lower_bound=1)
flags.DEFINE_integer("train_batch_size", 32, "Pre-training batch size.", lower_bound=1)
flags.DEFINE_float("learning_rate", 5e-4, "Peak pre-training learning rate.")
flags.DEFINE_integer("warmup_steps", -1, "Linear warm-up steps (-1: 10% of --steps).",
                     lower_bound=-1)
flags.DEFINE_integer("seq_length", 128, "max_seq_length.", lower_bound=8)
flags.DEFINE_integer("max_predictions", 20, "max_predictions_per_seq.", lower_bound=1)
flags.DEFINE_integer("dupe_factor", 5, "create_pretraining_data --dupe_factor of the original "
                     "recipe (the modern one: 1, masks drawn anew each read).", lower_bound=1)
flags.DEFINE_integer("seed", 12345, "Seed of both pre-training runs and of the data.")
flags.DEFINE_enum("precision", "auto", ["auto", "fp32", "bf16"],
                  "Both sides: bf16 (ours --mixed_precision=bf16, HF bf16 autocast) or fp32; auto: "
                  "bf16 where the CPU has avx512_bf16 or AMX.")
flags.DEFINE_string("ours_flags", "", "Extra flags for run_pretraining.py --do_train, space "
                    "separated (e.g. --use_xla).")
flags.DEFINE_string("work_dir", "/tmp/pretraining_parity", "Text, records, checkpoints, logs "
                    "(records are reused by a later run with the same settings).")
flags.DEFINE_string("plot", None, "PNG of the curves (default <work_dir>/pretraining_parity.png).")

# common's rounding of figures and the marker of a child's result line.
_round = common._round  # pylint: disable=protected-access
_RESULT = common._RESULT_PREFIX  # pylint: disable=protected-access
_SAVED = re.compile(r"Saved checkpoint \S*ckpt-(\d+)")
_STEP = re.compile(r"step (\d+)/(\d+) .*?\bloss=(\S+)")
_METRICS = ("masked_lm_loss", "masked_lm_accuracy", "next_sentence_accuracy")


# --- settings -------------------------------------------------------------------------------------


def _dims():
  layers, hidden, heads, intermediate = MODELS[FLAGS.model]
  return dict(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
              num_attention_heads=heads, intermediate_size=intermediate,
              max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02,
              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def _precision():
  if FLAGS.precision != "auto":
    return FLAGS.precision
  isa = set(common.machine().get("isa", ()))
  return "bf16" if isa & {"avx512_bf16", "amx_bf16"} else "fp32"


def _warmup():
  return FLAGS.steps // 10 if FLAGS.warmup_steps < 0 else FLAGS.warmup_steps


def _eval_every():
  return FLAGS.eval_every or max(1, FLAGS.steps // 10)


def _eval_batches():
  return max(1, FLAGS.eval_instances // FLAGS.eval_batch_size)


def _path(*parts):
  return os.path.join(FLAGS.work_dir, *parts)


def _records(name):
  return _path("data", f"{name}.tfrecord")


def _script(name):
  return os.path.join(common.ROOT, name)


def _log(message):
  print(f"[pretraining_parity] {message}", file=sys.stderr, flush=True)


def _read_key_values(path):
  """eval_results.txt of run_pretraining / run_classifier: {key: float} of `key = value` lines."""
  out = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      key, _, value = line.partition("=")
      with contextlib.suppress(ValueError):
        out[key.strip()] = float(value)
  return out


# --- child processes with live progress -----------------------------------------------------------


def _stream(args, label, log_path, budget_s=None):
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
  with open(log_path, "w", encoding="utf-8") as log:
    for line in proc.stdout:
      lines.append((time.time() - start, line.rstrip("\n")))
      log.write(line)
      if not line.startswith(_RESULT):
        print(f"[{label}] {line.rstrip()}", file=sys.stderr, flush=True)
  proc.wait()
  if timer:
    timer.cancel()
  return proc.returncode, lines


def _quiet(args, log_path):
  """Runs `args` with its output to `log_path`; raises with the log's end if it fails."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
  with open(log_path, "w", encoding="utf-8") as log:
    code = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                          check=False).returncode
  if code:
    with open(log_path, encoding="utf-8", errors="replace") as f:
      tail = f.read()[-1500:]
    raise RuntimeError(f"{os.path.basename(args[1])} exit {code} (log {log_path}):\n{tail}")


# --- data -----------------------------------------------------------------------------------------


def _write_text(documents, path):
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(d) for d in documents) + "\n")


def _make_data():
  """The training / held-out text and the records of every recipe (kept when their settings
  are those of an earlier run)."""
  os.makedirs(_path("data"), exist_ok=True)
  documents = common.read_documents(FLAGS.corpus)
  held = max(1, round(len(documents) * FLAGS.heldout_fraction))
  train_docs, held_docs = documents[:-held], documents[-held:]
  if FLAGS.max_train_docs:
    train_docs = train_docs[:FLAGS.max_train_docs]
  if FLAGS.eval_text:
    held_docs = common.read_documents(FLAGS.eval_text)
  common_args = [f"--vocab_file={FLAGS.vocab_file}", "--do_lower_case",
                 f"--max_seq_length={FLAGS.seq_length}",
                 f"--max_predictions_per_seq={FLAGS.max_predictions}", "--masked_lm_prob=0.15",
                 "--short_seq_prob=0.1"]
  jobs = {"eval": (held_docs, ["--mode=fast", "--dupe_factor=1", "--random_seed=4242"])}
  if "original" in FLAGS.recipes or FLAGS.peer:
    jobs["original"] = (train_docs, ["--mode=exact", f"--dupe_factor={FLAGS.dupe_factor}",
                                     f"--random_seed={FLAGS.seed}"])
  if "modern" in FLAGS.recipes:
    jobs["modern"] = (train_docs, ["--mode=fast", "--dupe_factor=1", "--dynamic_masking", "--pack_sequences",
                                   f"--random_seed={FLAGS.seed}"])
  facts = {}
  for name, (docs, args) in jobs.items():
    text = _path("data", f"{name}.txt")
    key = json.dumps({"docs": len(docs), "first": docs[0][:2], "last": docs[-1][-2:],
                      "args": common_args + args, "corpus": FLAGS.eval_text if name == "eval"
                      else FLAGS.corpus})
    stamp = _records(name) + ".settings"
    if os.path.exists(_records(name)) and os.path.exists(stamp):
      with open(stamp, encoding="utf-8") as f:
        if f.read() == key:
          facts[name] = {"documents": len(docs), "records": common.count_records(_records(name)),
                         "reused": True}
          continue
    _write_text(docs, text)
    _log(f"creating the {name} records from {len(docs)} documents ...")
    start = time.time()
    _quiet([sys.executable, _script("create_pretraining_data.py"), f"--input_file={text}",
            f"--output_file={_records(name)}", *common_args, *args],
           _path("data", f"{name}.log"))
    with open(stamp, "w", encoding="utf-8") as f:
      f.write(key)
    facts[name] = {"documents": len(docs), "records": common.count_records(_records(name)),
                   "seconds": round(time.time() - start, 1)}
  return facts


def to_npz(variant):
  """--side=npz child (TensorFlow): records `variant` (original | eval) as compact arrays, the
  ones the peer reads: a seeded random sample of --steps x batch training records, or the first
  whole eval batches."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import input_pipeline  # pylint: disable=g-import-not-at-top
  path = _records(variant)
  spec = input_pipeline.pretraining_features(
      FLAGS.seq_length, FLAGS.max_predictions, input_pipeline.PretrainingRecords.of_file(path))
  total = common.count_records(path)
  if variant == "eval":
    keep = np.arange(min(total, _eval_batches() * FLAGS.eval_batch_size))
  else:
    need = FLAGS.steps * FLAGS.train_batch_size
    keep = np.sort(np.random.default_rng(FLAGS.seed).permutation(total)[:need])
  dtypes = {"input_ids": np.uint16, "input_mask": np.uint8, "segment_ids": np.uint8,
            "masked_lm_positions": np.int16, "masked_lm_ids": np.uint16,
            "masked_lm_weights": np.float32, "next_sentence_labels": np.uint8}
  parts = {k: [] for k in dtypes}
  seen = 0
  for batch in tf.data.TFRecordDataset(path).batch(4096).map(
      lambda r: tf.io.parse_example(r, spec)):
    n = int(batch["input_ids"].shape[0])
    rows = keep[(keep >= seen) & (keep < seen + n)] - seen
    for k, dtype in dtypes.items():
      parts[k].append(batch[k].numpy()[rows].astype(dtype))
    seen += n
  arrays = {k: np.concatenate(v) for k, v in parts.items()}
  out = _path("data", f"{variant}.npz")
  np.savez(out, **arrays)
  return {"records": total, "kept": int(len(keep)), "npz": out}


# --- ours -----------------------------------------------------------------------------------------


def _bert_config():
  path = _path("bert_config.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(dict(_dims(), hidden_act="gelu"), f, indent=2)  # ours' gelu: the tanh form
  return path


def _eval_with_run_pretraining(checkpoint, out_dir, precision):
  """run_pretraining.py --do_eval of `checkpoint` on the eval records: its metrics."""
  os.makedirs(out_dir, exist_ok=True)
  _quiet([sys.executable, _script("run_pretraining.py"), "--do_eval",
          f"--input_file={_records('eval')}", f"--init_checkpoint={checkpoint}",
          f"--bert_config_file={_path('bert_config.json')}", f"--output_dir={out_dir}",
          f"--eval_batch_size={FLAGS.eval_batch_size}", f"--max_eval_steps={_eval_batches()}",
          f"--max_seq_length={FLAGS.seq_length}",
          f"--max_predictions_per_seq={FLAGS.max_predictions}",
          "--mixed_precision=" + ("bf16" if precision == "bf16" else "none")],
         os.path.join(out_dir, "log.txt"))
  values = _read_key_values(os.path.join(out_dir, "eval_results.txt"))
  return {k: values.get(k) for k in _METRICS}


def _ours(recipe, precision):
  """run_pretraining.py --do_train on the recipe's records, then --do_eval of each checkpoint."""
  out = _path(f"ours-{recipe}")
  # A fresh run (its clock must not start from a resumed checkpoint), fresh evaluations.
  for folder in (out, _path(f"ours-{recipe}-eval")):
    shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(out)
  every = _eval_every()
  args = [sys.executable, _script("run_pretraining.py"), "--do_train",
          f"--input_file={_records(recipe)}", f"--output_dir={out}",
          f"--bert_config_file={_path('bert_config.json')}",
          f"--train_batch_size={FLAGS.train_batch_size}",
          f"--learning_rate={FLAGS.learning_rate}", f"--num_train_steps={FLAGS.steps}",
          f"--num_warmup_steps={_warmup()}", f"--save_checkpoints_steps={every}",
          # Under --budget_minutes, Ctrl-C stops at the end of a loop: short loops overshoot less.
          f"--iterations_per_loop={min(every, 25 if FLAGS.budget_minutes else 100)}",
          f"--keep_checkpoint_max={FLAGS.steps // every + 3}", f"--seed={FLAGS.seed}",
          f"--max_seq_length={FLAGS.seq_length}",
          f"--max_predictions_per_seq={FLAGS.max_predictions}", "--optimizer=adamw",
          "--mixed_precision=" + ("bf16" if precision == "bf16" else "none"),
          *FLAGS.ours_flags.split()]
  _log(f"ours/{recipe}: run_pretraining.py --do_train ({FLAGS.steps} steps) ...")
  code, lines = _stream(args, f"ours/{recipe}", os.path.join(out, "train_log.txt"),
                        FLAGS.budget_minutes * 60 or None)
  saved = {int(m.group(1)): t for t, line in lines if (m := _SAVED.search(line))}
  losses = [(int(m.group(1)), float(m.group(3)), round(t, 2)) for t, line in lines
            if (m := _STEP.search(line))]
  if code not in (0, 130) or not saved:
    tail = "\n".join(line for _, line in lines[-15:])
    return {"error": f"run_pretraining.py exit {code}: {tail[-1500:]}"}
  train_s = lines[-1][0] if lines else None
  _log(f"ours/{recipe}: evaluating {len(saved)} checkpoints with run_pretraining.py --do_eval ...")
  curve, eval_start = [], time.time()
  for step in sorted(saved):
    metrics = _eval_with_run_pretraining(os.path.join(out, f"ckpt-{step}"),
                                         _path(f"ours-{recipe}-eval", f"step{step}"), precision)
    curve.append({"step": step, "seconds": round(saved[step], 2), **metrics})
    _log(f"ours/{recipe} step {step}: {metrics}")
  return {"curve": curve, "training_losses": losses, "process_s": round(train_s, 1),
          "eval_s": round(time.time() - eval_start, 1), "exit_code": code,
          "final_checkpoint": os.path.join(out, f"ckpt-{max(saved)}")}


# --- the peer: HF BertForPreTraining in a torch loop (child process, no TensorFlow) ---------------


def _hf_batch(torch, data, rows, device):
  """HF keyword arguments of records `rows`: MLM labels -100 but at the masked positions."""
  positions = data["masked_lm_positions"][rows].astype(np.int64)
  weights = data["masked_lm_weights"][rows]
  labels = np.full((len(rows), FLAGS.seq_length), -100, np.int64)
  np.put_along_axis(labels, positions, np.where(weights > 0, data["masked_lm_ids"][rows], -100),
                    axis=1)
  labels[:, 0] = -100  # [CLS] is never masked; padding predictions (weight 0) point at it
  batch = {"input_ids": data["input_ids"][rows], "attention_mask": data["input_mask"][rows],
           "token_type_ids": data["segment_ids"][rows], "labels": labels,
           "next_sentence_label": data["next_sentence_labels"][rows].reshape(-1)}
  return {k: torch.from_numpy(np.asarray(v, np.int64)).to(device) for k, v in batch.items()}


def _hf_evaluate(torch, model, data, autocast, device):
  """modeling.pretraining_losses' metrics over the eval arrays, batch by batch (sums / counts)."""
  model.eval()
  nll = correct = count = nsp_correct = nsp_count = 0.0
  with torch.inference_mode():
    for i in range(0, len(data["input_ids"]), FLAGS.eval_batch_size):
      rows = np.arange(i, min(i + FLAGS.eval_batch_size, len(data["input_ids"])))
      batch = _hf_batch(torch, data, rows, device)
      with autocast():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
      positions = torch.from_numpy(data["masked_lm_positions"][rows].astype(np.int64)).to(device)
      logits = torch.gather(out.prediction_logits.float(), 1, positions[..., None].expand(
          -1, -1, out.prediction_logits.shape[-1]))
      log_probs = torch.log_softmax(logits, -1)
      ids = torch.from_numpy(data["masked_lm_ids"][rows].astype(np.int64)).to(device)
      weights = torch.from_numpy(data["masked_lm_weights"][rows]).to(device)
      nll += float(-(log_probs.gather(-1, ids[..., None])[..., 0] * weights).sum())
      correct += float(((log_probs.argmax(-1) == ids).float() * weights).sum())
      count += float(weights.sum())
      nsp = out.seq_relationship_logits.float().argmax(-1)
      nsp_correct += float((nsp == batch["next_sentence_label"]).sum())
      nsp_count += len(rows)
  model.train()
  return {"masked_lm_loss": nll / count, "masked_lm_accuracy": correct / count,
          "next_sentence_accuracy": nsp_correct / nsp_count}


def peer(variant):
  """--side=peer child: HF pre-training on the original records' .npz (`variant`: precision)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  train = dict(np.load(_path("data", "original.npz")))
  held = dict(np.load(_path("data", "eval.npz")))
  torch.manual_seed(FLAGS.seed)
  model = transformers.BertForPreTraining(transformers.BertConfig(**_dims(),
                                                                  hidden_act="gelu_new"))
  decay, no_decay = [], []
  for name, p in model.named_parameters():
    (no_decay if "bias" in name or "LayerNorm" in name else decay).append(p)
  optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=FLAGS.learning_rate, eps=1e-8)
  steps, warmup = FLAGS.steps, _warmup()
  # run_pretraining's default (`original`) schedule of the 0-based step: the warm-up ramp, then
  # the linear decay from step 0 to --steps that it overrides at the start.
  scheduler = torch.optim.lr_scheduler.LambdaLR(
      optimizer, lambda s: s / warmup if s < warmup else max(0.0, 1.0 - s / steps))
  # On a GPU (when torch sees one) the same loop runs there, bf16 autocast on that device.
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  model.to(device)
  autocast = (common.torch_autocast(variant) if device.type == "cpu" or variant != "bf16" else
              lambda: torch.autocast("cuda", dtype=torch.bfloat16))
  rng = np.random.default_rng(FLAGS.seed)
  n = len(train["input_ids"])
  order = np.concatenate([rng.permutation(n) for _ in range(
      math.ceil(steps * FLAGS.train_batch_size / n))])
  budget = FLAGS.budget_minutes * 60 or float("inf")
  every = _eval_every()
  paused = 0.0  # seconds spent evaluating, off the clock
  clock = lambda: time.time() - START - paused
  curve, losses, window = [], [], []
  last_print = time.time()
  model.train()
  setup_s = clock()
  step = 0
  while step < steps:
    rows = order[step * FLAGS.train_batch_size:(step + 1) * FLAGS.train_batch_size]
    with autocast():
      loss = model(**_hf_batch(torch, train, rows, device)).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    window.append(float(loss.detach()))
    over = clock() >= budget
    if step % every == 0 or step == steps or over:
      seconds = clock()
      losses.append((step, float(np.mean(window)), round(seconds, 2)))
      window = []
      start = time.time()
      metrics = _hf_evaluate(torch, model, held, autocast, device)
      paused += time.time() - start
      curve.append({"step": step, "seconds": round(seconds, 2), **metrics})
      print(f"eval at step {step}: {metrics}", file=sys.stderr, flush=True)
    if time.time() - last_print >= 30 or step == steps:
      done = clock() - setup_s
      rate = step / max(done, 1e-9)
      print(f"step {step}/{steps} loss={float(loss.detach()):.4f} | {rate:.2f} steps/s | "
            f"ETA {(steps - step) / max(rate, 1e-9):.0f}s", file=sys.stderr, flush=True)
      last_print = time.time()
    if over:
      break
  final = _path("peer", "final")
  model.save_pretrained(final)
  shutil.copy(FLAGS.vocab_file, os.path.join(final, "vocab.txt"))
  return {"curve": curve, "training_losses": losses, "setup_s": round(setup_s, 1),
          "process_s": round(time.time() - START, 1), "eval_s": round(paused, 1),
          "final_checkpoint": final, "steps": step, "precision": variant, "device": str(device),
          **common.torch_facts(model, torch, transformers)}


def _peer(precision):
  os.makedirs(_path("peer"), exist_ok=True)
  args = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--side=peer",
          f"--variant={precision}"]
  _log(f"peer: HF BertForPreTraining ({FLAGS.steps} steps) ...")
  code, lines = _stream(args, "peer", _path("peer", "log.txt"))
  results = [line for _, line in lines if line.startswith(_RESULT)]
  if code or not results:
    tail = "\n".join(line for _, line in lines[-15:])
    return {"error": f"exit {code}: {tail[-1500:]}"}
  result = json.loads(results[-1][len(_RESULT):])
  converted = _path("peer", "converted")
  shutil.rmtree(converted, ignore_errors=True)
  _quiet([sys.executable, _script("convert_checkpoint.py"), f"--input={result['final_checkpoint']}",
          f"--output={converted}", "--output_format=project"], _path("peer", "convert.log"))
  result["converted_checkpoint"] = converted
  result["final_eval_by_run_pretraining"] = _eval_with_run_pretraining(
      converted, _path("peer-eval-final"), precision)
  return result


# --- downstream -----------------------------------------------------------------------------------


def _main_metric(task):
  return {"cola": "mcc", "mrpc": "f1", "sts-b": "pearson"}.get(task.lower(), "accuracy")


def _train_examples(task):
  """Training examples of a GLUE task: train.tsv's lines but the header (CoLA has none); read
  here rather than with run_classifier's processors, which would import TensorFlow."""
  with open(os.path.join(FLAGS.glue_dir, task, "train.tsv"), encoding="utf-8") as f:
    lines = sum(1 for line in f if line.strip())
  return max(1, lines - (task.lower() != "cola"))


def _finetune(model_name, checkpoint, task, seed, epochs, precision):
  out = _path("downstream", model_name, task, f"seed{seed}")
  shutil.rmtree(out, ignore_errors=True)
  os.makedirs(out)
  args = [sys.executable, _script("run_classifier.py"), f"--task_name={task}",
          f"--data_dir={os.path.join(FLAGS.glue_dir, task)}", f"--vocab_file={FLAGS.vocab_file}",
          f"--bert_config_file={_path('bert_config.json')}", f"--output_dir={out}",
          "--do_train", "--do_eval", "--do_lower_case", f"--max_seq_length={FLAGS.seq_length}",
          "--train_batch_size=32", f"--learning_rate={FLAGS.downstream_learning_rate}",
          f"--num_train_epochs={epochs}", f"--seed={seed}",
          "--mixed_precision=" + ("bf16" if precision == "bf16" else "none"),
          *([f"--init_checkpoint={checkpoint}"] if checkpoint else [])]
  start = time.time()
  try:
    _quiet(args, os.path.join(out, "log.txt"))
  except RuntimeError as e:
    _log(f"downstream {model_name} {task} seed {seed} failed: {e}")
    return {"error": str(e)[-800:]}
  scores = {k[len("eval_"):]: v for k, v in
            _read_key_values(os.path.join(out, "eval_results.txt")).items()
            if k.startswith("eval_")}
  return {"score": scores.get(_main_metric(task)), "scores": scores,
          "seconds": round(time.time() - start, 1)}


def _downstream(checkpoints, precision):
  """{model: {task: {seed: result}}} of run_classifier runs, and each model's per-task means."""
  runs = {m: {} for m in checkpoints}
  for task in FLAGS.downstream_tasks:
    epochs = FLAGS.downstream_epochs
    if FLAGS.downstream_max_steps:
      epochs = min(epochs, FLAGS.downstream_max_steps * 32 / _train_examples(task))
    for seed in range(1, FLAGS.seeds + 1):
      for model_name, checkpoint in checkpoints.items():
        _log(f"downstream: {model_name} {task} seed {seed} ({epochs:.3g} epochs) ...")
        result = _finetune(model_name, checkpoint, task, seed, round(epochs, 4), precision)
        runs[model_name].setdefault(task, {})[seed] = result
        _log(f"  -> {result.get('score', result.get('error'))}")
  means = {m: {t: (statistics.mean(s) if (s := [r["score"] for r in seeds.values()
                                                 if r.get("score") is not None]) else None)
               for t, seeds in tasks.items()} for m, tasks in runs.items()}
  return runs, means


# --- curves, figures, plot ------------------------------------------------------------------------


def _time_to_loss(curve, target):
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


def _final(result, key="masked_lm_loss"):
  curve = (result or {}).get("curve") or []
  return curve[-1].get(key) if curve else None


def _plot(runs, path):
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
  fig.suptitle(f"BERT-{FLAGS.model} pre-training from scratch, seq {FLAGS.seq_length}, "
               f"batch {FLAGS.train_batch_size}")
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _figures(ours, peer, means):
  figures = []
  original, hf = ours.get("original") or {}, peer or {}
  for recipe, result in ours.items():
    for key, name, higher in (("masked_lm_loss", "held-out masked-LM loss", False),
                              ("masked_lm_accuracy", "held-out masked-LM accuracy", True),
                              ("next_sentence_accuracy", "held-out NSP accuracy", True)):
      figures.append(common.figure(
          f"{name}, final (ours: {recipe} recipe)", key.rsplit("_", 1)[-1],
          {recipe: {key: _final(result, key)}}, {"hf": {key: _final(hf, key)}}, key,
          higher_is_better=higher))
    steps = result.get("curve", [{}])[-1].get("step") if result.get("curve") else None
    ours_sps = steps / result["curve"][-1]["seconds"] if steps else None
    hf_curve = hf.get("curve") or []
    hf_sps = hf_curve[-1]["step"] / hf_curve[-1]["seconds"] if hf_curve else None
    figures.append(common.figure(f"pre-training steps/s, process start to last checkpoint "
                                 f"({recipe})", "steps/s", {recipe: {"v": ours_sps}},
                                 {"hf": {"v": hf_sps}}, "v"))
  hf_final, hf_time = _final(hf), (hf.get("curve") or [{}])[-1].get("seconds")
  speedups = {}
  for recipe, result in ours.items():
    curve = result.get("curve") or []
    t = _time_to_loss(curve, hf_final) if hf_final is not None else None
    speedups[recipe] = {"ours_s": t, "hf_s": hf_time,
                        "speedup": hf_time / t if t and hf_time else None}
    # At equal loss: the wall-clock each side needs to reach the worse of the two final losses
    # (defined even when one side ends a hair above the other).
    if hf_final is not None and _final(result) is not None:
      target = max(hf_final, _final(result))
      t_ours, t_hf = _time_to_loss(curve, target), _time_to_loss(hf.get("curve") or [], target)
      speedups[recipe].update(equal_loss=target, equal_loss_ours_s=t_ours, equal_loss_hf_s=t_hf,
                              speedup_at_equal_loss=t_hf / t_ours if t_ours and t_hf else None)
  for recipe, speedup in speedups.items():
    if speedup.get("equal_loss") is not None:
      figures.append({"name": f"wall-clock to the same held-out MLM loss "
                              f"({speedup['equal_loss']:.4g}, the worse final), ours ({recipe})",
                      "unit": "s", "ours": _round(speedup["equal_loss_ours_s"]),
                      "ours_variant": recipe, "peer": _round(speedup["equal_loss_hf_s"]),
                      "peer_variant": "hf", "ratio": _round(speedup["speedup_at_equal_loss"]),
                      "target_ratio": 2.0})
  figures.insert(0, {"name": "wall-clock to HF's final held-out MLM loss, ours (original)",
                     "unit": "s", "ours": _round(speedups.get("original", {}).get("ours_s")),
                     "ours_variant": "original", "peer": hf_time, "peer_variant": "hf",
                     "ratio": _round(speedups.get("original", {}).get("speedup")),
                     "target_ratio": None})
  diff = None
  if means:
    ours_name = next((m for m in means if m.startswith("ours")), None)
    pairs = []
    for task in FLAGS.downstream_tasks:
      o = means.get(ours_name, {}).get(task)
      p = means.get("hf", {}).get(task)
      figures.append({"name": f"{task} dev {_main_metric(task)}, mean of {FLAGS.seeds} seeds",
                      "unit": _main_metric(task), "ours": o, "ours_variant": ours_name,
                      "peer": p, "peer_variant": "hf",
                      "ratio": _round(o / p) if o and p else None,
                      "target_ratio": None,
                      "random_init": means.get("random_init", {}).get(task),
                      **{f"{m}_mean": v.get(task) for m, v in means.items()}})
      if o is not None and p is not None:
        pairs.append(o - p)
    diff = round(100 * statistics.mean(pairs), 2) if pairs else None
  loss_ratio = (_final(original) / hf_final if _final(original) and hf_final else None)
  return figures, {"mlm_loss_ratio": _round(loss_ratio),
                   "speedup_to_hf_loss": _round(
                       speedups.get("original", {}).get("speedup")),
                   "speedup_at_equal_loss": _round(
                       speedups.get("original", {}).get("speedup_at_equal_loss")),
                   "downstream_diff": diff}, speedups


# --- main -----------------------------------------------------------------------------------------


def main(argv):
  del argv
  if common.dispatch({"npz": to_npz, "peer": peer}):
    return
  unknown = [r for r in FLAGS.recipes if r not in RECIPES]
  if unknown:
    raise app.UsageError(f"--recipes: unknown {unknown} ({', '.join(RECIPES)})")
  FLAGS.work_dir = os.path.abspath(FLAGS.work_dir)
  os.makedirs(FLAGS.work_dir, exist_ok=True)
  precision = _precision()
  peer_missing = common.peer_missing_note(["torch", "transformers"])
  if not FLAGS.peer and not peer_missing:
    peer_missing = "--nopeer: the peer was not run"
  run_peer = FLAGS.peer and not common.missing(["torch", "transformers"])
  _bert_config()
  start = time.time()
  data = _make_data()
  if run_peer:
    data["npz"] = {v: common.run_child("npz", v) for v in ("original", "eval")}
  data["seconds"] = round(time.time() - start, 1)

  ours = {recipe: _ours(recipe, precision) for recipe in FLAGS.recipes}
  hf = _peer(precision) if run_peer else None

  checkpoints = {f"ours_{r}": ours[r].get("final_checkpoint") for r in FLAGS.downstream_recipes
                 if r in ours and ours[r].get("final_checkpoint")}
  if hf and hf.get("converted_checkpoint"):
    checkpoints["hf"] = hf["converted_checkpoint"]
  checkpoints["random_init"] = None
  downstream, means = (_downstream(checkpoints, precision) if FLAGS.downstream_tasks
                       else ({}, {}))

  plot = FLAGS.plot or _path("pretraining_parity.png")
  _plot({**{f"ours ({r})": v for r, v in ours.items()}, "HF (original records)": hf}, plot)
  figures, top, speedups = _figures(ours, hf, means)
  settings = {"model": FLAGS.model, **_dims(), "hidden_act": "tanh GELU on both sides",
              "seq_length": FLAGS.seq_length, "max_predictions_per_seq": FLAGS.max_predictions,
              "steps": FLAGS.steps, "budget_minutes": FLAGS.budget_minutes or None,
              "train_batch_size": FLAGS.train_batch_size, "learning_rate": FLAGS.learning_rate,
              "warmup_steps": _warmup(), "lr_schedule": "linear warm-up, linear decay from step "
              "0 to --steps (run_pretraining's original)", "weight_decay": 0.01,
              "weight_decay_excludes": "LayerNorm, bias", "clip_norm": 1.0, "dropout": 0.1,
              "optimizer": "AdamW eps 1e-8 (ours --optimizer=adamw; torch.optim.AdamW)",
              "precision": precision, "recipes": FLAGS.recipes, "eval_every": _eval_every(),
              "eval_instances": _eval_batches() * FLAGS.eval_batch_size,
              "eval_batch_size": FLAGS.eval_batch_size, "dupe_factor": FLAGS.dupe_factor,
              "original_recipe": "--mode=exact (the original script's records, shuffled "
                                 f"together), --dupe_factor={FLAGS.dupe_factor}",
              "modern_recipe": "--mode=fast --dynamic_masking --pack_sequences --dupe_factor=1, NSP kept "
                               "(one label per packed instance)",
              "corpus": FLAGS.corpus, "eval_text": FLAGS.eval_text or "held-out documents",
              "heldout_fraction": FLAGS.heldout_fraction, "max_train_docs": FLAGS.max_train_docs,
              "seed": FLAGS.seed, "downstream_tasks": FLAGS.downstream_tasks,
              "downstream_seeds": FLAGS.seeds, "downstream_epochs": FLAGS.downstream_epochs,
              "downstream_max_steps": FLAGS.downstream_max_steps,
              "downstream_learning_rate": FLAGS.downstream_learning_rate,
              "wall_clock": "seconds from each training process' start (imports, tracing and "
                            "our checkpoint saves included; evaluation excluded)",
              "plot": plot}
  details = {"data": data, "ours": ours, "peer": hf, "speedup_to_hf_loss": speedups,
             "downstream_means": means, "downstream_runs": downstream}
  captured = io.StringIO()
  with contextlib.redirect_stdout(captured):
    line = common.emit("pretraining_parity", figures, settings, details,
                       peer_name="HF transformers BertForPreTraining + torch.optim.AdamW "
                                 "(plain torch loop, the original recipe's records)",
                       peer_missing=peer_missing)
  line = {**{k: v for k, v in line.items() if k not in ("figures", "settings", "details",
                                                        "machine", "versions")},
          **top, **{k: line[k] for k in ("figures", "settings", "details", "machine",
                                         "versions")}}
  text = json.dumps(line)
  with open(_path("pretraining_parity.json"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
  print(text, flush=True)


if __name__ == "__main__":
  app.run(main)
