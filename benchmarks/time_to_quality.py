"""Time to quality (issue #55): the best model per hour of pre-training, recipe against recipe.

Each recipe pre-trains the same model (--model, BERT-Mini by default) from scratch for the same
wall-clock budget (--budget_minutes, run_pretraining --train_budget_minutes: warm-up and linear
decay laid over the budget, the run ending at it with the rate at 0), on the same training text
(../shared's Wikipedia extract but its last --heldout_fraction of documents), at the same batch,
peak learning rate (10% of the budget warming up), optimizer and precision. Recipes (RECIPES):

* `original`: the paper's. create_pretraining_data.py --mode=exact (the original script's records:
  all instances shuffled together), static masks, 15% of the tokens predicted (80% [MASK], 10%
  random, 10% kept), masked LM + next-sentence prediction on sentence pairs, --dupe_factor passes;
* `modern`: what RoBERTa, cramming, MosaicBERT and ModernBERT share, as one command a user can
  copy: masked LM only (--no_nsp: one segment of contiguous text an instance, no NSP head),
  masks drawn anew at every read (--dynamic_masking), several instances packed into each sequence
  (--pack_sequences: no padding), 30% of the tokens predicted (Wettig et al. 2023: 15% is too few
  for a short run), 80/10/10.

Every checkpoint (--eval_every steps; by default a tenth of the steps the budget holds, from a
short timing run) is scored by `run_pretraining.py --do_eval` on the same held-out records:
single segments of held-out text with fixed 15% masks (static, --random_seed=4242), so that
recipes trained at other masking rates, with or without pairs, are scored on one task. (The
original recipe's final checkpoint is also scored on held-out sentence pairs, the format it was
trained on: details.original_on_pairs shows what the single-segment format costs it.) A point's
wall-clock is when its checkpoint was saved, from the training command's start.

Then each recipe's final checkpoint and a never-pre-trained model of the same size (the floor)
are fine-tuned with run_classifier.py on --downstream_tasks (SST-2, MRPC, CoLA, STS-B, RTE),
--seeds seeds each, dev scores (MCC for CoLA, F1 for MRPC, Pearson for STS-B, accuracy
otherwise), --downstream_epochs capped at --downstream_max_steps steps.

Prints one JSON line (common.emit's layout; "ours" is the modern recipe, "peer" the original
one) with, at its top level:
* loss_speedup: the original recipe's wall-clock to its final held-out masked-LM loss / the modern
  recipe's to reach that loss (interpolated between its points; null when it never does);
* downstream_diff: the modern recipe's mean dev score over the tasks minus the original's, points
  (null when fine-tuning is skipped);
* above_floor: each recipe's mean minus the never-pre-trained model's, points.
The same line goes to <work_dir>/time_to_quality.json, the curves to --plot.

The HF peer (BertForMaskedLM at the same budget) is not run here: pretraining_parity.py compares
this project's pre-training with HF's step for step on the original recipe; adding an HF run of
each recipe's budget would double the benchmark's hour.

The fine-tuning half alone can be run again on an earlier run's checkpoints (other
--downstream_max_steps, more --seeds): --downstream_of=<that run's JSON line>.

Duration: 2 x --budget_minutes of training (45 each by default), plus the records (~3 min the
first time, reused after), ~12 s a checkpoint evaluation, and 5 tasks x --seeds x 3 models of
fine-tuning (~30 s each on 2 cores): about 2 h 15 min by default on the project's 2-core CPU.

  python benchmarks/time_to_quality.py                            # the default
  python benchmarks/time_to_quality.py --budget_minutes=15 --seeds=1   # an hour
  python benchmarks/time_to_quality.py --model=tiny --budget_minutes=0.3 --max_train_docs=50 \\
      --downstream_tasks= --work_dir=/tmp/ttq                    # smoke test
"""

import json
import os
import time

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top

import common  # pylint: disable=g-import-not-at-top
import pretraining_runs as runs  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS


# A recipe: the generator's flags for its records (beyond the ones every record set shares) and
# the trainer's flags for its run (beyond the shared settings and the schedule).
RECIPES = {
    "original": {
        "records": ["--mode=exact", "--masked_lm_prob=0.15", "--max_predictions_per_seq=20"],
        "training": ["--max_predictions_per_seq=20"],
        "what": "static masks, 15%, 80/10/10, MLM + NSP on sentence pairs, --mode=exact, "
                "--dupe_factor passes",
    },
    "modern": {
        "records": ["--mode=fast", "--no_nsp", "--dynamic_masking", "--pack_sequences",
                    "--dupe_factor=1", "--masked_lm_prob=0.3", "--max_predictions_per_seq=40"],
        "training": ["--masked_lm_prob=0.3", "--max_predictions_per_seq=40",
                     "--mask_split=80,10,10"],
        "what": "MLM only (--no_nsp), dynamic masking at 30%, 80/10/10, packed sequences, "
                "one pass of records (masks anew each read)",
    },
}
FLAGS.set_default("budget_minutes", 45.0)
flags.DEFINE_integer("eval_points", 10, "Checkpoints scored per run when --eval_every is 0 "
                     "(about; from the steps a short timing run says the budget holds).",
                     lower_bound=1)
flags.DEFINE_string("downstream_of", None, "An earlier run's JSON line (its <work_dir>/"
                    "time_to_quality.json): fine-tune that run's final checkpoints beside the "
                    "floor instead of pre-training anew, its pre-training figures carried into the "
                    "new line (model, budget, recipes and precision are the earlier run's; the "
                    "--downstream_* flags and --seeds this run's).")

# The settings of an earlier line that --downstream_of takes over (they decide the model the
# checkpoints hold and what the carried figures mean).
CARRIED = ("model", "budget_minutes", "seq_length", "train_batch_size", "learning_rate")

def _recipe_records(train_docs, held_docs):
  jobs = {"eval": (held_docs, ["--mode=fast", "--no_nsp", "--masked_lm_prob=0.15",
                               f"--max_predictions_per_seq={FLAGS.max_predictions}",
                               "--dupe_factor=1", "--random_seed=4242"]),
          "eval_pairs": (held_docs, ["--mode=fast", "--masked_lm_prob=0.15",
                                     f"--max_predictions_per_seq={FLAGS.max_predictions}",
                                     "--dupe_factor=1", "--random_seed=4242"])}
  for recipe in FLAGS.recipes:
    extra = [f"--dupe_factor={FLAGS.dupe_factor}"] if recipe == "original" else []
    jobs[recipe] = (train_docs, [*RECIPES[recipe]["records"], *extra,
                                 f"--random_seed={FLAGS.seed}"])
  return runs.make_records(jobs)


def _schedule_args(every):
  budget = FLAGS.budget_minutes
  # The step counts only shape the schedule (10% warm-up) and cap the run far beyond the budget.
  return [f"--train_budget_minutes={budget}", "--num_train_steps=10000000",
          "--num_warmup_steps=1000000", f"--save_checkpoints_steps={every}",
          f"--iterations_per_loop={min(every, 100)}", "--keep_checkpoint_max=100000"]


def _probe_rate(recipe, variant):
  """Steps a second of `recipe` here, from a 40-step run (its last progress line)."""
  result = runs.pretrain("probe", variant, [
      "--num_train_steps=40", "--num_warmup_steps=4", "--save_checkpoints_steps=40",
      "--iterations_per_loop=20", *RECIPES[recipe]["training"]], records_name=recipe,
      evaluate=False)
  return result.get("steps_per_second")


def _eval_every(rate):
  if FLAGS.eval_every:
    return FLAGS.eval_every
  steps = (rate or 1.0) * FLAGS.budget_minutes * 60
  return max(1, round(steps / FLAGS.eval_points))


def _figures(results, means):
  original, modern = results.get("original") or {}, results.get("modern") or {}
  figures = []
  for key, name, higher in (("masked_lm_loss", "held-out masked-LM loss (fixed 15% masks)", False),
                            ("masked_lm_accuracy", "held-out masked-LM accuracy", True)):
    figures.append(common.figure(
        f"{name}, final, after {FLAGS.budget_minutes:g} minutes", key.rsplit("_", 1)[-1],
        {"modern": {key: runs.final(modern, key)}}, {"original": {key: runs.final(original, key)}},
        key, higher_is_better=higher))
  target = runs.final(original)
  t_original = (original.get("curve") or [{}])[-1].get("seconds")
  t_modern = runs.time_to_loss(modern.get("curve") or [], target) if target else None
  speedup = t_original / t_modern if t_original and t_modern else None
  figures.insert(0, {"name": "wall-clock to the original recipe's final held-out masked-LM loss",
                     "unit": "s", "ours": runs.round_figure(t_modern), "ours_variant": "modern",
                     "peer": t_original, "peer_variant": "original",
                     "ratio": runs.round_figure(speedup), "target_ratio": 2.0})
  scores = {m: runs.mean_score(task_means) for m, task_means in means.items()}
  for task in FLAGS.downstream_tasks:
    o, p = means.get("modern", {}).get(task), means.get("original", {}).get(task)
    figures.append({"name": f"{task} dev {runs.main_metric(task)}, mean of {FLAGS.seeds} seeds",
                    "unit": runs.main_metric(task), "ours": o, "ours_variant": "modern",
                    "peer": p, "peer_variant": "original",
                    "ratio": runs.round_figure(o / p) if o and p else None,
                    "target_ratio": None,
                    **{f"{m}_mean": v.get(task) for m, v in means.items()}})
  diff = None
  if scores.get("modern") is not None and scores.get("original") is not None:
    diff = round(scores["modern"] - scores["original"], 2)
  floor = scores.get("random_init")
  above = {m: (round(v - floor, 2) if v is not None and floor is not None else None)
           for m, v in scores.items() if m != "random_init"}
  return figures, {"loss_speedup": runs.round_figure(speedup), "downstream_diff": diff,
                   "mean_dev_scores": scores or None, "above_floor": above or None}


def _pretrain_recipes(variant):
  """Records, a timing probe, each recipe's run for the budget and its scored checkpoints."""
  start = time.time()
  train_docs, held_docs = runs.split_corpus()
  data = _recipe_records(train_docs, held_docs)
  data["seconds"] = round(time.time() - start, 1)
  rate = _probe_rate(FLAGS.recipes[0], variant) if not FLAGS.eval_every else None
  every = _eval_every(rate)
  results = {}
  for recipe in FLAGS.recipes:
    results[recipe] = runs.pretrain(recipe, variant,
                                    [*_schedule_args(every), *RECIPES[recipe]["training"]])
  original_on_pairs = None
  if results.get("original", {}).get("final_checkpoint"):
    original_on_pairs = runs.evaluate_checkpoint(
        results["original"]["final_checkpoint"], runs.path("ours-original-eval", "pairs"),
        variant, eval_records="eval_pairs")
  return data, results, original_on_pairs, rate, every


def _earlier_run(file_path):
  """The pre-training half of an earlier line (--downstream_of), its settings made this run's
  flags; a file that is not such a line, or whose checkpoints are gone, is one error line."""
  def fail(why):
    raise SystemExit(f"error: --downstream_of={file_path}: {why}")
  if os.path.realpath(file_path) == os.path.realpath(runs.path(f"{runs.benchmark_name()}.json")):
    fail("is the line this run writes (its --work_dir's): copy it elsewhere first")
  try:
    with open(file_path, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except OSError as e:
    fail(e.strerror or str(e))
  except UnicodeDecodeError:
    fail("not text (UTF-8)")
  filled = [n for n, text in enumerate(lines, 1) if text.strip()]
  if not filled:
    fail("empty file")
  try:
    line = json.loads(lines[filled[-1] - 1])
  except ValueError as e:
    fail(f"line {filled[-1]} is not JSON ({e})")
  if not isinstance(line, dict) or line.get("benchmark") != runs.benchmark_name():
    fail(f"not a {runs.benchmark_name()} line")
  settings, details = line.get("settings") or {}, line.get("details") or {}
  ours = details.get("ours") or {}
  if not ours or any(key not in settings for key in CARRIED) or settings["model"] not in \
      runs.MODELS:
    fail("its settings or pre-training results are missing")
  for key in CARRIED:
    setattr(FLAGS, key, settings[key])
  FLAGS.recipes = list(ours)
  for recipe, result in ours.items():
    checkpoint = result.get("final_checkpoint")
    if not checkpoint:
      fail(f"recipe {recipe} has no final checkpoint ({result.get('error', 'no result')})")
    if not os.path.exists(checkpoint + ".index"):
      fail(f"recipe {recipe}'s checkpoint {checkpoint} is gone")
  return settings, (details.get("data"), ours, details.get("original_on_pairs"),
                    settings.get("probe_steps_per_second"), settings.get("eval_every_steps"))


def main(argv):
  del argv
  runs.set_up_work_dir()
  earlier_settings, earlier = (_earlier_run(FLAGS.downstream_of) if FLAGS.downstream_of
                               else (None, None))
  unknown = [r for r in FLAGS.recipes if r not in RECIPES]
  if unknown or not FLAGS.recipes:
    raise app.UsageError(f"--recipes: unknown {unknown} ({', '.join(RECIPES)})")
  if FLAGS.budget_minutes <= 0:
    raise app.UsageError("--budget_minutes must be > 0")
  variant = earlier_settings.get("precision") if earlier else runs.precision()
  runs.write_bert_config()
  data, results, original_on_pairs, rate, every = earlier or _pretrain_recipes(variant)

  checkpoints = {r: v["final_checkpoint"] for r, v in results.items() if v.get("final_checkpoint")}
  checkpoints["random_init"] = None
  downstream, means = (runs.downstream(checkpoints, variant) if FLAGS.downstream_tasks
                       else ({}, {}))

  plot = FLAGS.plot or runs.path("time_to_quality.png")
  runs.plot(results, plot, f"BERT-{FLAGS.model}, {FLAGS.budget_minutes:g} minutes of "
                           f"pre-training a recipe, seq {FLAGS.seq_length}, batch "
                           f"{FLAGS.train_batch_size}")
  figures, top = _figures(results, means)
  settings = {"model": FLAGS.model, **runs.dims(), "budget_minutes": FLAGS.budget_minutes,
              "seq_length": FLAGS.seq_length, "train_batch_size": FLAGS.train_batch_size,
              "learning_rate": FLAGS.learning_rate, "warmup": "10% of the budget",
              "schedule": "run_pretraining --train_budget_minutes (linear warm-up, linear decay "
                          "to 0 at the budget)", "optimizer": "adamw", "precision": variant,
              "recipes": {r: {**RECIPES[r], "records": RECIPES[r]["records"] + (
                  [f"--dupe_factor={FLAGS.dupe_factor}"] if r == "original" else [])}
                          for r in FLAGS.recipes},
              "eval_every_steps": every, "probe_steps_per_second": rate,
              "eval": "single segments of held-out text, fixed 15% masks (80/10/10), "
                      f"{runs.eval_batches() * FLAGS.eval_batch_size} instances",
              **runs.data_settings(),
              "wall_clock": "seconds from each training command's start (start-up, tracing "
                            "and checkpoint saves included; evaluation excluded)",
              "plot": plot, "downstream_of": FLAGS.downstream_of}
  if earlier:  # what the carried figures were measured with; the fine-tuning is this run's
    settings = {**earlier_settings, **{k: v for k, v in settings.items()
                                       if k.startswith("downstream") or k == "plot"}}
  details = {"data": data, "ours": results, "original_on_pairs": original_on_pairs,
             "downstream_means": means, "downstream_runs": downstream}
  runs.emit(figures, settings, details, top,
            peer_name="this project's original recipe (the paper's)")

if __name__ == "__main__":
  app.run(main)
