"""Evaluation during training (--eval_every_steps), the best checkpoint by a dev metric
(--keep_best_checkpoint_metric) and early stopping (--early_stopping_patience), in every
fine-tuning script, on real data with small models trained from scratch."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import (SHARED, SQUAD, VOCAB, concurrently, kill_at_checkpoint, requires_shared,
                      run_ok, run_script)

from bert_tf2 import modeling
from bert_tf2 import run_dir

GLUE = os.path.join(SHARED, "data", "glue")
CONLL = os.path.join(SHARED, "data", "conll2003")


def _config(tmp_path):
  path = tmp_path / "bert_config.json"
  path.write_text(modeling.BertConfig(
      vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=64, type_vocab_size=2).to_json_string())
  return path


def _results(path):
  return {k: float(v) for k, v in (line.split(" = ") for line in path.read_text().splitlines())}


def _scalars(directory, tag):
  """{step: value} of the TensorBoard scalar `tag` in the event files of `directory`."""
  from bert_tf2 import quickstart  # pylint: disable=g-import-not-at-top
  return dict(quickstart.read_scalars(str(directory), tag))


def _mrpc(tmp_path, rows=(41, 25, 9)):
  data = tmp_path / "mrpc"
  data.mkdir()
  for split, count in zip(("train", "dev", "test"), rows):  # header + examples
    with open(os.path.join(GLUE, "MRPC", f"{split}.tsv"), "rb") as f:
      (data / f"{split}.tsv").write_bytes(b"".join(f.readline() for _ in range(count)))
  return data


def _classifier(data, config, out, *extra):
  # 40 examples, batch 8: 5 steps an epoch, 15 in all; evaluations at 4, 8, 12 and 15.
  return ["run_classifier.py", "--task_name=mrpc", f"--data_dir={data}", f"--vocab_file={VOCAB}",
          f"--bert_config_file={config}", f"--output_dir={out}", "--max_seq_length=48",
          "--train_batch_size=8", "--eval_batch_size=8", "--predict_batch_size=8",
          "--num_train_epochs=3", "--learning_rate=3e-3", "--eval_every_steps=4",
          "--save_checkpoints_steps=4", *extra]


@requires_shared
def test_best_checkpoint_by_dev_loss_survives_a_kill_and_predicts(tmp_path):
  """Every evaluation is recorded (best_checkpoint.json and TensorBoard scalars); best/ holds the
  checkpoint of the lowest dev loss as a whole model folder; --do_eval and --do_predict use it
  (eval_results.txt's loss is the recorded one at that step), --nouse_best_checkpoint the latest.
  A run killed at a checkpoint and resumed records the same evaluations as one that was not."""
  data, config = _mrpc(tmp_path), _config(tmp_path)
  out, resumed = tmp_path / "out", tmp_path / "resumed"
  flags = ["--keep_best_checkpoint_metric=loss", "--do_train", "--do_eval", "--do_predict"]
  result = run_ok(_classifier(data, config, out, *flags))
  state = json.loads((out / run_dir.BEST_STATE).read_text())
  steps = [e["step"] for e in state["evaluations"]]
  assert steps == [4, 8, 12, 15]
  losses = {e["step"]: e["eval_loss"] for e in state["evaluations"]}
  best = min(losses, key=losses.get)
  assert state["metric"] == "eval_loss" and state["best_step"] == best
  assert state["best_value"] == losses[best]
  assert sorted(os.listdir(out / "best")) == sorted(
      ["checkpoint", f"ckpt-{best}.index", f"ckpt-{best}.data-00000-of-00001",
       "bert_config.json", "vocab.txt", "task.json"])
  assert tf.train.latest_checkpoint(str(out / "best")).endswith(f"ckpt-{best}")
  assert _scalars(out / "eval", "eval_loss") == pytest.approx(
      {**losses, **{best: _results(out / "eval_results.txt")["eval_loss"]}}, abs=1e-6)
  assert f"Using the best checkpoint {out / 'best'}/ckpt-{best}" in result.stderr
  results = _results(out / "eval_results.txt")
  assert results["global_step"] == best
  assert results["eval_loss"] == pytest.approx(losses[best], abs=1e-5)
  assert results["eval_accuracy"] == pytest.approx(
      next(e for e in state["evaluations"] if e["step"] == best)["eval_accuracy"])
  best_predictions = (out / "test_results.tsv").read_text()
  run_ok([a for a in _classifier(data, config, out, "--do_eval", "--do_predict",
                                  "--nouse_best_checkpoint") if not a.startswith("--eval_every")])
  latest = _results(out / "eval_results.txt")
  assert latest["global_step"] == 15
  assert latest["eval_loss"] == pytest.approx(losses[15], abs=1e-5)
  assert ((out / "test_results.tsv").read_text() == best_predictions) == (best == 15)

  # The run folder means the checkpoint its evaluation used, for every script: export_model
  # exports the best one and says so (it silently took the latest, step 15).
  exported = run_ok(["export_model.py", "--model_type=classifier", f"--init_checkpoint={out}",
                     f"--export_dir={tmp_path / 'served'}", "--max_seq_length=48"])
  assert f"{out}: the run's best checkpoint, {out / 'best'}/ckpt-{best} (step {best}, " in (
      exported.stderr)
  assert f"Initialised 25 variables from {out / 'best'}/ckpt-{best}" in exported.stderr
  # best/ gone: an error that says so and what to give for the latest, not the latest quietly.
  shutil.move(str(out / "best"), str(tmp_path / "moved_best"))
  missing = run_script([a for a in _classifier(data, config, out, "--do_eval")
                        if not a.startswith("--eval_every")])
  assert missing.returncode == 2, missing.stderr[-2000:]
  assert missing.stderr.strip().splitlines()[-1] == (
      f"error: {out / 'best'}: the best checkpoint of this run (step {best}, by eval_loss, "
      f"recorded in {out / run_dir.BEST_STATE}) is missing or incomplete; to use the latest "
      "checkpoint instead, give --nouse_best_checkpoint (evaluate and predict with the latest)")
  refused = run_script(["export_model.py", "--model_type=classifier", f"--init_checkpoint={out}",
                        f"--export_dir={tmp_path / 'served2'}", "--max_seq_length=48"])
  assert refused.returncode == 2 and f"({out}/ckpt-N)" in refused.stderr, refused.stderr[-2000:]
  assert not (tmp_path / "served2").exists()
  # best/ back but its data file cut short: one line naming its files, not a traceback.
  shutil.move(str(tmp_path / "moved_best"), str(out / "best"))
  data_file = out / "best" / f"ckpt-{best}.data-00000-of-00001"
  data_file.write_bytes(data_file.read_bytes()[:1000])
  damaged = run_script([a for a in _classifier(data, config, out, "--do_eval")
                        if not a.startswith("--eval_every")])
  assert damaged.returncode == 2 and "Traceback" not in damaged.stderr, damaged.stderr[-2000:]
  assert damaged.stderr.strip().splitlines()[-1].startswith(
      f"error: checkpoint {out / 'best'}/ckpt-{best} is damaged or incomplete"), (
          damaged.stderr[-2000:])

  kill_at_checkpoint(_classifier(data, config, resumed, *flags), resumed, 8)
  run_ok(_classifier(data, config, resumed, *flags))
  again = json.loads((resumed / run_dir.BEST_STATE).read_text())
  assert [e["step"] for e in again["evaluations"]] == steps
  for first, second in zip(state["evaluations"], again["evaluations"]):
    assert second == pytest.approx(first, abs=1e-5)
  assert again["best_step"] == best


@requires_shared
def test_early_stopping_stops_and_a_rerun_keeps_the_count(tmp_path):
  """A learning rate too small to change a prediction: dev accuracy never improves on the first
  evaluation's, so patience 1 stops training at the second (step 8 of 15); the same command
  again trains no further; a larger patience carries on from the count kept."""
  data, config = _mrpc(tmp_path), _config(tmp_path)
  out = tmp_path / "out"
  command = _classifier(data, config, out, "--keep_best_checkpoint_metric=eval_accuracy",
                        "--early_stopping_patience=1", "--do_train", "--learning_rate=1e-12")
  result = run_ok(command)
  assert "Early stopping at step 8: 1 evaluations without improvement" in result.stderr
  assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-8")
  state = json.loads((out / run_dir.BEST_STATE).read_text())
  assert ([e["step"] for e in state["evaluations"]], state["best_step"],
          state["without_improvement"]) == ([4, 8], 4, 1)
  result = run_ok(command)
  assert "Early stopping ended this training run at step 8" in result.stderr
  assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-8")
  run_ok(command[:-3] + ["--early_stopping_patience=5", "--do_train", "--learning_rate=1e-12"])
  state = json.loads((out / run_dir.BEST_STATE).read_text())
  assert ([e["step"] for e in state["evaluations"]], state["without_improvement"]) == (
      [4, 8, 12, 15], 3)
  assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-15")


@requires_shared
def test_flag_errors_are_one_line_before_training(tmp_path):
  data, config = _mrpc(tmp_path), _config(tmp_path)
  out = tmp_path / "out"
  base = _classifier(data, config, out)
  cases = [
      (base + ["--do_train", "--keep_best_checkpoint_metric=bleu"],
       "error: --keep_best_checkpoint_metric=bleu: this task's dev metrics are eval_accuracy, "
       "eval_f1, eval_loss"),
      ([a for a in base if not a.startswith("--eval_every")] + [
          "--do_train", "--early_stopping_patience=2"],
       "error: --early_stopping_patience needs --eval_every_steps (how often to evaluate)"),
      (base + ["--do_train", "--early_stopping_patience=2"],
       "error: --early_stopping_patience needs --keep_best_checkpoint_metric (the dev metric "
       "that must improve)"),
      (base + ["--do_eval"], "error: --eval_every_steps evaluates during training: add "
                             "--do_train"),
  ]
  results = concurrently([lambda args=args: run_script(args) for args, _ in cases])
  for (_, message), result in zip(cases, results):
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [message]
  assert not os.path.exists(out) or not [n for n in os.listdir(out) if n.startswith("ckpt-")]

  # What the first evaluation needs is checked before the first step: the dev file (missing,
  # malformed, without examples) and a best/ folder free for the best checkpoint (not a file, a
  # link or a user's folder). One error line each, no checkpoint written.
  broken = {}
  for name, dev in (("missing", None), ("malformed", b"Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t2\n"),
                    ("empty", b"Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n")):
    folder = tmp_path / f"data_{name}"
    shutil.copytree(data, folder)
    os.remove(folder / "dev.tsv")
    if dev is not None:
      (folder / "dev.tsv").write_bytes(dev)
    broken[name] = folder
  outs = {name: tmp_path / f"out_{name}" for name in ("file", "link", "user")}
  for name, folder in outs.items():
    folder.mkdir()
  (outs["file"] / "best").write_text("a file\n")
  (outs["link"] / "best").symlink_to(tmp_path)
  (outs["user"] / "best").mkdir()
  (outs["user"] / "best" / "notes.txt").write_text("mine\n")
  cases = [
      (_classifier(broken["missing"], config, tmp_path / "o1", "--do_train"),
       f"{broken['missing'] / 'dev.tsv'}"),
      (_classifier(broken["malformed"], config, tmp_path / "o2", "--do_train"),
       f"{broken['malformed'] / 'dev.tsv'}:2"),
      (_classifier(broken["empty"], config, tmp_path / "o3", "--do_train"), "dev"),
      (_classifier(data, config, outs["file"], "--do_train"), f"{outs['file'] / 'best'} is a file"),
      (_classifier(data, config, outs["link"], "--do_train"),
       f"{outs['link'] / 'best'} is a symbolic link"),
      (_classifier(data, config, outs["user"], "--do_train"),
       f"{outs['user'] / 'best'} holds files that are not a best checkpoint"),
  ]
  results = concurrently([lambda args=args: run_script(args) for args, _ in cases])
  for (args, named), result in zip(cases, results):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[-1].startswith("error: ") and named in lines[-1], (
        args, result.stderr[-2000:])
    folder = [a.split("=", 1)[1] for a in args if a.startswith("--output_dir=")][0]
    assert not os.path.exists(folder) or not [n for n in os.listdir(folder)
                                              if n.startswith("ckpt-")], folder
  assert (outs["user"] / "best" / "notes.txt").read_text() == "mine\n"
  # The metric a run keeps its best checkpoint by stays that metric.
  run_ok(base + ["--do_train", "--keep_best_checkpoint_metric=f1", "--num_train_epochs=1"])
  result = run_script(base + ["--do_train", "--keep_best_checkpoint_metric=accuracy"])
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: {out / run_dir.BEST_STATE}: this run's best checkpoint is kept by eval_f1, "
      "not eval_accuracy; keep that metric, or start in another --output_dir")


def _conll_slice(source, target, sentences):
  lines, count = [], 0
  with open(source, encoding="utf-8") as f:
    for line in f:
      lines.append(line)
      if not line.strip() and lines[-2:-1] and lines[-2].strip() and \
          not lines[-2].startswith("-DOCSTART-"):
        count += 1
        if count == sentences:
          break
  target.write_text("".join(lines), encoding="utf-8")


@requires_shared
def test_ner_swag_and_squad_keep_their_best_checkpoint(tmp_path):
  """run_ner (entity F1 on a CoNLL slice), run_swag (accuracy) and run_squad (F1 on the predict
  file, its dev set) evaluate during training and use their best checkpoint: eval_results.txt is
  the recorded evaluation of the best step."""
  from test_run_swag import HEADER, ROWS  # pylint: disable=g-import-not-at-top
  config = _config(tmp_path)
  conll = tmp_path / "conll"
  conll.mkdir()
  for name, sentences in (("train.txt", 64), ("valid.txt", 40), ("test.txt", 8)):
    _conll_slice(os.path.join(CONLL, name), conll / name, sentences)
  swag = tmp_path / "swag"
  swag.mkdir()
  (swag / "train.csv").write_text(HEADER + "".join(ROWS), encoding="utf-8")
  (swag / "val.csv").write_text(HEADER + "".join(ROWS), encoding="utf-8")
  with open(SQUAD, encoding="utf-8") as f:
    dataset = json.load(f)
  dataset["data"] = dataset["data"][:1]
  dataset["data"][0]["paragraphs"] = dataset["data"][0]["paragraphs"][:4]
  squad = tmp_path / "squad.json"
  squad.write_text(json.dumps(dataset), encoding="utf-8")
  common = [f"--vocab_file={VOCAB}", f"--bert_config_file={config}", "--do_train", "--do_eval",
            "--eval_every_steps=2", "--learning_rate=3e-3", "--max_seq_length=64"]
  runs = {
      "ner": ["run_ner.py", f"--data_dir={conll}", f"--output_dir={tmp_path / 'ner'}",
              "--keep_best_checkpoint_metric=eval_loss", "--train_batch_size=16",
              "--num_train_epochs=2", *common],
      "swag": ["run_swag.py", f"--data_dir={swag}", f"--output_dir={tmp_path / 'swag_out'}",
               "--keep_best_checkpoint_metric=loss", "--train_batch_size=3",
               "--num_train_epochs=6", "--eval_batch_size=2", *common],
      "squad": ["run_squad.py", f"--train_file={squad}", f"--predict_file={squad}",
                f"--output_dir={tmp_path / 'squad_out'}", "--keep_best_checkpoint_metric=f1",
                "--do_predict", "--train_batch_size=8", "--num_train_epochs=1",
                "--max_query_length=24", "--doc_stride=32",
                *[c for c in common if c != "--do_eval"]],
  }
  results = concurrently([lambda args=args: run_script(args) for args in runs.values()])
  for (name, args), result in zip(runs.items(), results):
    assert result.returncode == 0, (name, result.stderr[-3000:])
    out = tmp_path / next(a for a in args if a.startswith("--output_dir=")).split("=", 1)[1]
    state = json.loads((out / run_dir.BEST_STATE).read_text())
    steps = [e["step"] for e in state["evaluations"]]
    assert len(steps) >= 3 and steps == sorted(steps) and steps[0] == 2, (name, steps)
    metric = state["metric"]
    values = {e["step"]: e[metric] for e in state["evaluations"]}
    chosen = (min if metric.endswith("loss") else max)(values.values())
    assert state["best_value"] == chosen and values[state["best_step"]] == chosen, name
    results_file = _results(out / "eval_results.txt")
    assert results_file["global_step"] == state["best_step"], name
    key = metric if name != "squad" else metric[len("eval_"):]
    assert results_file[key] == pytest.approx(chosen, abs=1e-5), name
  assert np.isfinite(json.loads((tmp_path / "squad_out" / run_dir.BEST_STATE).read_text())
                     ["best_value"])
  result = run_script(runs["squad"][:1] + [a for a in runs["squad"][1:] if a != "--do_predict"])
  assert result.stderr.strip().splitlines()[-1] == (
      "error: --eval_every_steps scores the answers to --predict_file during training: add "
      "--do_predict with a --predict_file that has answers")
