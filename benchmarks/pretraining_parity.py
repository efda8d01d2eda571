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

import json
import math
import os
import shutil
import statistics
import sys
import time

START = time.time()  # a child's clock starts here, before its heavy imports

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import common  # pylint: disable=g-import-not-at-top,wrong-import-position
import pretraining_runs as runs  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS

# This benchmark's recipes: what create_pretraining_data writes for each (the held-out `eval`
# records too), beside the flags every record set shares (pretraining_runs.make_records).
RECIPES = {
    "original": ["--mode=exact", "--masked_lm_prob=0.15"],  # + --dupe_factor, --random_seed
    "modern": ["--mode=fast", "--masked_lm_prob=0.15", "--dupe_factor=1", "--dynamic_masking",
               "--pack_sequences"],
}

flags.DEFINE_integer("steps", 600, "Optimizer steps of each pre-training run.", lower_bound=1)
flags.DEFINE_list("downstream_recipes", ["original"], "Which of our recipes' checkpoints are "
                  "fine-tuned (HF's and the random-init floor always are).")
flags.DEFINE_integer("warmup_steps", -1, "Linear warm-up steps (-1: 10% of --steps).",
                     lower_bound=-1)

_round = runs.round_figure
_RESULT = runs.RESULT
_path = runs.path
_records = runs.records
_log = runs.log
_dims = runs.dims


# --- settings -------------------------------------------------------------------------------------


def _warmup():
  return FLAGS.steps // 10 if FLAGS.warmup_steps < 0 else FLAGS.warmup_steps


def _eval_every():
  return FLAGS.eval_every or max(1, FLAGS.steps // 10)


# --- child processes with live progress -----------------------------------------------------------


# --- data -----------------------------------------------------------------------------------------


def _make_data():
  """The training / held-out text and the records of every recipe (kept when their settings
  are those of an earlier run)."""
  train_docs, held_docs = runs.split_corpus()
  predictions = f"--max_predictions_per_seq={FLAGS.max_predictions}"
  jobs = {"eval": (held_docs, ["--mode=fast", "--masked_lm_prob=0.15", "--dupe_factor=1",
                               "--random_seed=4242", predictions])}
  for recipe in RECIPES:
    if recipe in FLAGS.recipes or (recipe == "original" and FLAGS.peer):
      extra = ([f"--dupe_factor={FLAGS.dupe_factor}"] if recipe == "original" else [])
      jobs[recipe] = (train_docs, [*RECIPES[recipe], *extra, f"--random_seed={FLAGS.seed}",
                                   predictions])
  return runs.make_records(jobs)


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
    keep = np.arange(min(total, runs.eval_batches() * FLAGS.eval_batch_size))
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


def _ours(recipe, precision):
  """run_pretraining.py --do_train on the recipe's records for --steps (or --budget_minutes, by
  Ctrl-C), then --do_eval of each checkpoint."""
  every = _eval_every()
  return runs.pretrain(recipe, precision, [
      f"--num_train_steps={FLAGS.steps}", f"--num_warmup_steps={_warmup()}",
      f"--save_checkpoints_steps={every}",
      # Under --budget_minutes, Ctrl-C stops at the end of a loop: short loops overshoot less.
      f"--iterations_per_loop={min(every, 25 if FLAGS.budget_minutes else 100)}",
      f"--keep_checkpoint_max={FLAGS.steps // every + 3}",
      f"--max_predictions_per_seq={FLAGS.max_predictions}"],
      stop_after_s=FLAGS.budget_minutes * 60 or None)



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
  code, lines = runs.stream(args, "peer", _path("peer", "log.txt"))
  results = [line for _, line in lines if line.startswith(_RESULT)]
  if code or not results:
    tail = "\n".join(line for _, line in lines[-15:])
    return {"error": f"exit {code}: {tail[-1500:]}"}
  result = json.loads(results[-1][len(_RESULT):])
  converted = _path("peer", "converted")
  shutil.rmtree(converted, ignore_errors=True)
  runs.quiet([sys.executable, runs.script("convert_checkpoint.py"), f"--input={result['final_checkpoint']}",
          f"--output={converted}", "--output_format=project"], _path("peer", "convert.log"))
  result["converted_checkpoint"] = converted
  result["final_eval_by_run_pretraining"] = runs.evaluate_checkpoint(
      converted, _path("peer-eval-final"), precision)
  return result


# --- figures --------------------------------------------------------------------------------------


def _figures(ours, peer, means):
  figures = []
  original, hf = ours.get("original") or {}, peer or {}
  for recipe, result in ours.items():
    for key, name, higher in (("masked_lm_loss", "held-out masked-LM loss", False),
                              ("masked_lm_accuracy", "held-out masked-LM accuracy", True),
                              ("next_sentence_accuracy", "held-out NSP accuracy", True)):
      figures.append(common.figure(
          f"{name}, final (ours: {recipe} recipe)", key.rsplit("_", 1)[-1],
          {recipe: {key: runs.final(result, key)}}, {"hf": {key: runs.final(hf, key)}}, key,
          higher_is_better=higher))
    steps = result.get("curve", [{}])[-1].get("step") if result.get("curve") else None
    ours_sps = steps / result["curve"][-1]["seconds"] if steps else None
    hf_curve = hf.get("curve") or []
    hf_sps = hf_curve[-1]["step"] / hf_curve[-1]["seconds"] if hf_curve else None
    figures.append(common.figure(f"pre-training steps/s, process start to last checkpoint "
                                 f"({recipe})", "steps/s", {recipe: {"v": ours_sps}},
                                 {"hf": {"v": hf_sps}}, "v"))
  hf_final, hf_time = runs.final(hf), (hf.get("curve") or [{}])[-1].get("seconds")
  speedups = {}
  for recipe, result in ours.items():
    curve = result.get("curve") or []
    t = runs.time_to_loss(curve, hf_final) if hf_final is not None else None
    speedups[recipe] = {"ours_s": t, "hf_s": hf_time,
                        "speedup": hf_time / t if t and hf_time else None}
    # At equal loss: the wall-clock each side needs to reach the worse of the two final losses
    # (defined even when one side ends a hair above the other).
    if hf_final is not None and runs.final(result) is not None:
      target = max(hf_final, runs.final(result))
      t_ours, t_hf = runs.time_to_loss(curve, target), runs.time_to_loss(hf.get("curve") or [], target)
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
      figures.append({"name": f"{task} dev {runs.main_metric(task)}, mean of {FLAGS.seeds} seeds",
                      "unit": runs.main_metric(task), "ours": o, "ours_variant": ours_name,
                      "peer": p, "peer_variant": "hf",
                      "ratio": _round(o / p) if o and p else None,
                      "target_ratio": None,
                      "random_init": means.get("random_init", {}).get(task),
                      **{f"{m}_mean": v.get(task) for m, v in means.items()}})
      if o is not None and p is not None:
        pairs.append(o - p)
    diff = round(100 * statistics.mean(pairs), 2) if pairs else None
  loss_ratio = (runs.final(original) / hf_final if runs.final(original) and hf_final else None)
  return figures, {"mlm_loss_ratio": _round(loss_ratio),
                   "speedup_to_hf_loss": _round(
                       speedups.get("original", {}).get("speedup")),
                   "speedup_at_equal_loss": _round(
                       speedups.get("original", {}).get("speedup_at_equal_loss")),
                   "downstream_diff": diff}, speedups


# --- main -----------------------------------------------------------------------------------------


def main(argv):
  del argv
  runs.set_up_work_dir()
  if common.dispatch({"npz": to_npz, "peer": peer}):
    return
  unknown = [r for r in FLAGS.recipes if r not in RECIPES]
  if unknown:
    raise app.UsageError(f"--recipes: unknown {unknown} ({', '.join(RECIPES)})")
  precision = runs.precision()
  peer_missing = common.peer_missing_note(["torch", "transformers"])
  if not FLAGS.peer and not peer_missing:
    peer_missing = "--nopeer: the peer was not run"
  run_peer = FLAGS.peer and not common.missing(["torch", "transformers"])
  runs.write_bert_config()
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
  downstream, means = (runs.downstream(checkpoints, precision) if FLAGS.downstream_tasks
                       else ({}, {}))

  plot = FLAGS.plot or _path("pretraining_parity.png")
  runs.plot({**{f"ours ({r})": v for r, v in ours.items()}, "HF (original records)": hf}, plot,
            f"BERT-{FLAGS.model} pre-training from scratch, seq {FLAGS.seq_length}, "
            f"batch {FLAGS.train_batch_size}")
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
              "eval_instances": runs.eval_batches() * FLAGS.eval_batch_size,
              "eval_batch_size": FLAGS.eval_batch_size, "dupe_factor": FLAGS.dupe_factor,
              "original_recipe": "--mode=exact (the original script's records, shuffled "
                                 f"together), --dupe_factor={FLAGS.dupe_factor}",
              "modern_recipe": "--mode=fast --dynamic_masking --pack_sequences --dupe_factor=1, NSP kept "
                               "(one label per packed instance)",
              **runs.data_settings(),
              "wall_clock": "seconds from each training process' start (imports, tracing and "
                            "our checkpoint saves included; evaluation excluded)",
              "plot": plot}
  details = {"data": data, "ours": ours, "peer": hf, "speedup_to_hf_loss": speedups,
             "downstream_means": means, "downstream_runs": downstream}
  runs.emit(figures, settings, details, top,
            peer_name="HF transformers BertForPreTraining + torch.optim.AdamW (plain torch loop, "
                      "the original recipe's records)", peer_missing=peer_missing)

if __name__ == "__main__":
  app.run(main)
