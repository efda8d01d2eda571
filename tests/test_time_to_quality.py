"""Smoke test of benchmarks/time_to_quality.py (#55 item 4): both recipes pre-train for the same
time budget at the tiniest settings, are scored on the same held-out records and fine-tuned beside
the never-pre-trained floor, and the JSON line's figures follow from its own curves and scores.
The numbers mean nothing at this size; the real run is long and not part of the tests."""

import json
import math
import os
import shutil

import pytest
import tensorflow as tf

from conftest import requires_shared
from conftest import ROOT
from conftest import run_script
from conftest import run_ok

SCRIPT = os.path.join(ROOT, "benchmarks", "time_to_quality.py")
SPENT = "optimizer/learning_rate/budget/spent/.ATTRIBUTES/VARIABLE_VALUE"


@requires_shared
@pytest.mark.onednn_bf16
def test_tiny_run_trains_each_recipe_for_the_budget_and_reports_what_it_promises(tmp_path):
  work, plot = tmp_path / "work", tmp_path / "curves.png"
  budget_minutes = 0.25
  # --eval_every=20: each checkpoint is scored by a run_pretraining.py --do_eval process of its
  # own (~7 s); every 5 steps made 40 of them, 5 of this test's 7 minutes. 20 still gives each
  # curve several points on a slow host (the test needs two).
  result = run_ok([SCRIPT, "--model=tiny", f"--budget_minutes={budget_minutes}",
                   "--max_train_docs=40", "--heldout_fraction=0.001", "--eval_instances=32",
                   "--eval_batch_size=16", "--dupe_factor=1", "--eval_every=20",
                   "--downstream_tasks=RTE", "--seeds=1", "--downstream_max_steps=2",
                   f"--work_dir={work}", f"--plot={plot}"], timeout=1200)
  line = json.loads(result.stdout.strip().splitlines()[-1])
  for key in ("benchmark", "ours", "peer", "ratio", "figures", "machine", "settings", "details",
              "loss_speedup", "downstream_diff", "above_floor"):
    assert key in line, key
  assert line["benchmark"] == "time_to_quality"
  assert line["settings"]["budget_minutes"] == budget_minutes
  recipes = line["settings"]["recipes"]
  assert "--no_nsp" in recipes["modern"]["records"] and "--no_nsp" not in recipes["original"][
      "records"]

  ours = line["details"]["ours"]
  for recipe in ("original", "modern"):
    run = ours[recipe]
    assert "error" not in run, run.get("error")
    curve = run["curve"]
    assert len(curve) >= 2 and [p["step"] for p in curve] == sorted(p["step"] for p in curve)
    for point in curve:
      # Scored by run_pretraining --do_eval on the single-segment held-out records: a masked-LM
      # loss and accuracy, no next-sentence accuracy (no pairs to score).
      assert 5 < point["masked_lm_loss"] < 12 and 0 <= point["masked_lm_accuracy"] <= 1
      assert point["next_sentence_accuracy"] is None
    # Each run ended at its time budget (the schedule's own clock, in its last checkpoint).
    spent = tf.train.load_variable(run["final_checkpoint"], SPENT)
    assert budget_minutes * 60 <= spent < budget_minutes * 60 + 30
  # The masked-LM-only recipe trained no next-sentence head.
  heads = {recipe: any("next_sentence" in name for name, _ in
                       tf.train.list_variables(ours[recipe]["final_checkpoint"]))
           for recipe in ours}
  assert heads == {"original": True, "modern": False}
  assert line["details"]["original_on_pairs"]["next_sentence_accuracy"] is not None

  # loss_speedup from the curves: the original's time to its final loss over the modern one's.
  original, modern = ours["original"]["curve"], ours["modern"]["curve"]
  target = original[-1]["masked_lm_loss"]
  reached = [p for p in modern if p["masked_lm_loss"] <= target]
  if reached:
    assert line["loss_speedup"] is not None and line["loss_speedup"] > 0
    assert line["loss_speedup"] >= original[-1]["seconds"] / reached[0]["seconds"] * 0.999
  else:
    assert line["loss_speedup"] is None

  # Fine-tuning: every model, the floor included; the differences are of the reported means.
  means = line["details"]["downstream_means"]
  assert set(means) == {"original", "modern", "random_init"}
  scores = {m: 100 * v["RTE"] for m, v in means.items()}
  assert all(0 <= s <= 100 for s in scores.values())
  assert math.isclose(line["downstream_diff"], scores["modern"] - scores["original"],
                      abs_tol=0.01)
  assert math.isclose(line["above_floor"]["modern"], scores["modern"] - scores["random_init"],
                      abs_tol=0.01)

  assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 1000
  with open(work / "time_to_quality.json", encoding="utf-8") as f:
    assert json.load(f) == line

  # The fine-tuning half again on this run's checkpoints (--downstream_of): another task and
  # step cap, no pre-training; the earlier line's pre-training figures and settings carried.
  earlier = tmp_path / "earlier.json"
  shutil.copy(work / "time_to_quality.json", earlier)
  again_dir = tmp_path / "again"
  again = json.loads(run_ok([SCRIPT, f"--downstream_of={earlier}", "--model=mini",
                             "--budget_minutes=99", "--downstream_tasks=MRPC", "--seeds=1",
                             "--downstream_max_steps=3", f"--work_dir={again_dir}"],
                            timeout=900).stdout.strip().splitlines()[-1])
  assert again["details"]["ours"] == ours and again["loss_speedup"] == line["loss_speedup"]
  assert again["details"]["original_on_pairs"] == line["details"]["original_on_pairs"]
  settings = again["settings"]
  assert settings["model"] == "tiny" and settings["budget_minutes"] == budget_minutes
  assert settings["downstream_tasks"] == ["MRPC"] and settings["downstream_max_steps"] == 3
  assert settings["downstream_of"] == str(earlier)
  assert set(again["details"]["downstream_means"]) == {"original", "modern", "random_init"}
  assert all(set(v) == {"MRPC"} for v in again["details"]["downstream_means"].values())
  assert not any(p.name.startswith("ours-") for p in again_dir.iterdir())  # nothing pre-trained
  # A line whose checkpoints are gone, or the very line the run would write: one error line.
  modern_checkpoint = ours["modern"]["final_checkpoint"]
  os.rename(modern_checkpoint + ".index", modern_checkpoint + ".moved")
  failed = run_script([SCRIPT, f"--downstream_of={earlier}", f"--work_dir={again_dir}"])
  assert failed.returncode != 0
  assert failed.stderr.strip().splitlines()[-1] == (
      f"error: --downstream_of={earlier}: recipe modern's checkpoint {modern_checkpoint} is gone")
  failed = run_script([SCRIPT, f"--downstream_of={again_dir / 'time_to_quality.json'}",
                       f"--work_dir={again_dir}"])
  assert failed.returncode != 0
  assert "is the line this run writes" in failed.stderr.strip().splitlines()[-1]
