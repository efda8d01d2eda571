"""run_pretraining --train_budget_minutes: a schedule over wall-clock time, resumable (#55 item 3)."""

import os
import re
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import (DEVNULL, ENV, PIPE, PYTHON, ROOT, SHARED, popen, requires_shared, run_ok,
                      run_script, run_workers)
from bert_tf2 import optimization
from bert_tf2 import time_budget

RECORDS = os.path.join(SHARED, "reference", "pretraining", "default.tfrecord")
TINY_CONFIG = ('{"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, '
               '"num_attention_heads": 2, "intermediate_size": 64, '
               '"max_position_embeddings": 128, "type_vocab_size": 2}')
SPENT = "optimizer/learning_rate/budget/spent/.ATTRIBUTES/VARIABLE_VALUE"
# A progress line's step and learning rate.
PROGRESS = re.compile(r"step (\d+)/(?:~\d+|\?) .*?learning_rate=(\S+) .*\| ETA (\S+) \(time budget, "
                      r"\d+% of \S+ spent\)")


def test_the_schedule_follows_the_time_spent_and_the_last_loop_ends_at_the_budget():
  peak = 1e-3
  budget = time_budget.TimeBudget(100.0)
  # 1,000 steps with 100 of warm-up: the first 10% of the budget warms up.
  schedule = budget.schedule(optimization.LinearWarmupLinearDecay(peak, 1000, 100))
  rate = lambda step: float(schedule(tf.constant(step, tf.int64)))
  assert rate(0) == 0.0
  # A first loop not yet timed: the clock stands still in it.
  assert budget.plan_loop(0, 1, None) == 1 and rate(0) == 0.0
  budget.end_loop(1, 0.0)
  # 2 s a step: 5 steps warm up (10 s), the rate peaks, then falls linearly within the loop.
  assert budget.plan_loop(1, 40, 2.0) == 40
  np.testing.assert_allclose(rate(3), peak * 4 / 10, rtol=1e-5)  # 4 s spent
  np.testing.assert_allclose(rate(6), peak * (1 - 10 / 100), rtol=1e-5)
  np.testing.assert_allclose(rate(26), peak * (1 - 50 / 100), rtol=1e-5)
  budget.end_loop(41, 81.0)  # the loop took 81 s, not the 80 estimated: the clock is the truth
  np.testing.assert_allclose(budget.spent_seconds(), 81.0)
  np.testing.assert_allclose(rate(41), peak * (1 - 81 / 100), rtol=1e-5)
  # 19 s left at 0.3 s a step: the last loop takes 64 steps (not the 100 asked), each counted as
  # 19 / 64 s, so that its last step begins just before the budget ends.
  assert budget.plan_loop(41, 100, 0.3) == 64
  np.testing.assert_allclose(rate(41 + 63), peak * (1 - (81 + 63 * 19 / 64) / 100), rtol=1e-4)
  assert rate(41 + 63) > 0
  budget.end_loop(105, 19.2)
  assert budget.is_spent() and rate(105) == 0.0 and rate(10**6) == 0.0
  with pytest.raises(ValueError):
    time_budget.TimeBudget(0)


def _args(tmp_path, out, budget=None, steps=100000, extra=()):
  config = tmp_path / "bert_config.json"
  config.write_text(TINY_CONFIG)
  return ["run_pretraining.py", f"--bert_config_file={config}", f"--input_file={RECORDS}",
          f"--output_dir={out}", "--do_train", "--train_batch_size=8",
          f"--num_train_steps={steps}", "--num_warmup_steps=10000", "--learning_rate=1e-3",
          "--iterations_per_loop=20", "--save_checkpoints_steps=100000", "--seed=3",
          *([f"--train_budget_minutes={budget}"] if budget else []), *extra]


def _spent(out):
  return float(tf.train.load_variable(tf.train.latest_checkpoint(str(out)), SPENT))


def _progress(stderr):
  return [(int(m.group(1)), float(m.group(2))) for m in PROGRESS.finditer(stderr)]


@requires_shared
def test_a_budget_run_ends_at_its_budget_with_the_rate_at_zero_and_resumes(tmp_path):
  out = tmp_path / "out"
  budget_s = 30.0
  # Interrupted early (SIGTERM: a checkpoint at the end of the loop), then resumed.
  proc = popen([PYTHON] + _args(tmp_path, out, budget_s / 60), cwd=ROOT, env=ENV,
               stdout=DEVNULL, stderr=PIPE, text=True)
  lines, deadline = [], time.time() + 300
  for line in proc.stderr:
    lines.append(line)
    match = PROGRESS.search(line)
    if match and int(match.group(1)) > 1:  # past the first (compiling) loop
      proc.send_signal(signal.SIGTERM)
      break
    assert time.time() < deadline
  stderr = "".join(lines) + proc.communicate(timeout=120)[1]
  assert proc.returncode == 0 and "Stopped by SIGTERM" in stderr, stderr[-2000:]
  first_spent = _spent(out)
  assert 0 < first_spent < budget_s
  first = _progress(stderr)
  # Warm-up (10,000 of 100,000 steps: the first 3 s of the budget), never above the peak.
  assert max(lr for _, lr in first) <= 1e-3 + 1e-9

  resumed = run_ok(_args(tmp_path, out, budget_s / 60)).stderr
  assert "Resumed from" in resumed
  second = _progress(resumed)
  steps = [s for s, _ in second]
  # The rate carries on from where it stopped (the clock was checkpointed: a schedule started
  # afresh would begin at 0), rises to its peak at 10% of the budget, then falls to 0 at the end.
  assert second[0][0] == first[-1][0] + 1 and second[0][1] > 0
  assert second[-1][1] == 0.0 and all(lr > 0 for _, lr in second[:-1])
  rates = [lr for _, lr in first + second]
  peak = rates.index(max(rates))
  assert rates[:peak + 1] == sorted(rates[:peak + 1])
  assert rates[peak:] == sorted(rates[peak:], reverse=True) and len(rates) - peak > 3
  # The budget is spent, overshot by no more than a misjudged last step or two (the last loop is
  # sized to end at it; a busy machine makes steps uneven); the cap of 100,000 steps was far from
  # reached.
  spent = _spent(out)
  assert budget_s <= spent < budget_s * 1.5, spent
  assert steps[-1] < 100000
  # The lines count toward the steps the budget is expected to reach, not the cap of 100,000
  # (a user read `step 11/10000000`), and say how much of it is spent.
  totals = re.findall(r"step (\d+)/(~\d+|\?) .*\(time budget, (\d+)% of 0:00:30 spent\)",
                      resumed)
  assert totals and all(t == "?" or int(s) <= int(t[1:]) < 100000 for s, t, _ in totals), totals
  shares = [int(p) for _, _, p in totals]
  assert shares == sorted(shares) and shares[-1] == 100, shares
  # Spent: a rerun trains no further; a larger budget continues.
  again = run_ok(_args(tmp_path, out, budget_s / 60)).stderr
  assert "time budget of 0:00:30 is spent" in again
  assert tf.train.latest_checkpoint(str(out)).endswith(f"ckpt-{steps[-1]}")

  # Evaluation reads the checkpoint without the flag, and without warnings of unread values.
  evaluated = run_ok(_args(tmp_path, out, extra=["--do_train=false", "--do_eval",
                                                 "--max_eval_steps=2"])).stderr
  assert "could not be found" not in evaluated and (out / "eval_results.txt").exists()
  # Switching a resumed run between a step schedule and a budget is one line, nothing written.
  before = sorted(os.listdir(out))
  result = run_script(_args(tmp_path, out))
  assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
      f"error: --output_dir={out} holds a run scheduled over a time budget "
      f"({out}/ckpt-{steps[-1]}): resume it with --train_budget_minutes, or use a new "
      "--output_dir"), result.stderr[-2000:]
  steps_out = tmp_path / "steps"
  run_ok(_args(tmp_path, steps_out, steps=4))
  result = run_script(_args(tmp_path, steps_out, budget_s / 60))
  assert result.returncode == 2 and "scheduled over its steps" in result.stderr
  assert "Traceback" not in result.stderr
  assert sorted(os.listdir(out)) == before
  for bad in ("0", "-1", "nan"):
    result = run_script(_args(tmp_path, tmp_path / "bad", bad))
    assert result.returncode != 0 and "--train_budget_minutes" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "bad").exists()


@requires_shared
def test_num_train_steps_caps_a_budget_run(tmp_path):
  out = tmp_path / "out"
  stderr = run_ok(_args(tmp_path, out, budget=60, steps=6)).stderr
  assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-6")
  assert _spent(out) < 60 * 60 and "ETA" in stderr


@requires_shared
def test_two_workers_agree_on_the_clock_and_end_together(tmp_path):
  out = tmp_path / "out"
  logs = run_workers(_args(tmp_path, out, 10 / 60, extra=["--distribution_strategy="
                                                         "multi_worker_mirrored"]))
  # Both ran the same loops: the same progress lines, the same last step.
  progress = [_progress(log) for log in logs]
  assert progress[0] and progress[0] == progress[1]
  assert progress[0][-1][1] == 0.0
  assert 10 <= _spent(out) < 15
