"""Evaluation and prediction under multi_worker_mirrored: two worker processes on this machine
share the work and the chief writes the same outputs, in input order, as one process does. And
the cluster's ends: a worker killed (the other stops with one line, a restart resumes) and the
end of a good run (the workers leave together)."""

import json
import os
import re
import shutil

import numpy as np
import pytest

from conftest import (ENV, SHARED, SQUAD, kill_a_worker_at_checkpoint, minilm_dir,
                      requires_shared, run_ok, run_workers)

pytestmark = requires_shared

MRPC = os.path.join(SHARED, "data", "glue", "MRPC")
WIKITEXT = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")
PRETRAINING_RECORDS = os.path.join(SHARED, "reference", "pretraining", "default.tfrecord")
TINY_CONFIG = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
               "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 128,
               "type_vocab_size": 2}


def _mrpc_subset(directory):
  """MRPC with 48 training pairs and odd-sized dev (37) and test (23) sets: the last batch is
  partly padding, and the two workers' batches differ in length."""
  os.makedirs(directory)
  for name, rows in (("train", 48), ("dev", 37), ("test", 23)):
    with open(os.path.join(MRPC, f"{name}.tsv"), encoding="utf-8") as f:
      lines = f.readlines()[:rows + 1]  # + the header
    with open(os.path.join(directory, f"{name}.tsv"), "w", encoding="utf-8") as f:
      f.writelines(lines)
  return directory


def _classifier_args(data_dir, output_dir, *modes):
  model = minilm_dir()
  return ["run_classifier.py", "--task_name=mrpc", f"--data_dir={data_dir}",
          f"--vocab_file={model}/vocab.txt", f"--init_checkpoint={model}",
          "--max_seq_length=64", "--train_batch_size=16", "--eval_batch_size=8",
          "--predict_batch_size=8", "--num_train_epochs=1", "--learning_rate=1e-4",
          f"--output_dir={output_dir}", *modes]


def _eval_results(directory):
  with open(os.path.join(directory, "eval_results.txt"), encoding="utf-8") as f:
    return {k: float(v) for k, v in (line.split(" = ") for line in f)}


def _score_on_two_workers(args, tmp_path, train, score):
  """Trains (the modes `train`) and scores (`score`) in one process, then scores the same
  checkpoint again with two multi_worker_mirrored workers: the one process's output directory and
  the workers'. `args(output_dir, *modes)`: the script's command line."""
  single, multi = tmp_path / "single", tmp_path / "multi"
  run_ok(args(single, *train, *score))
  os.makedirs(multi)
  for name in os.listdir(single):
    if name.startswith(("ckpt-", "checkpoint", "task.json", "bert_config.json")):
      shutil.copy(single / name, multi / name)
  run_workers(args(multi, *score, "--distribution_strategy=multi_worker_mirrored"))
  # Only the chief wrote: no other worker's files or scratch directories are left.
  assert not [n for n in os.listdir(multi) if n.startswith(".worker_tmp")]
  return single, multi


def test_classifier_eval_and_predict_on_two_workers_equal_one_process(tmp_path):
  data = _mrpc_subset(str(tmp_path / "data"))
  single, multi = _score_on_two_workers(lambda out, *modes: _classifier_args(data, out, *modes),
                                        tmp_path, ["--do_train"], ["--do_eval", "--do_predict"])

  expected, got = _eval_results(single), _eval_results(multi)
  assert expected.keys() == got.keys() and got["eval_examples"] == 37
  for k in expected:
    np.testing.assert_allclose(got[k], expected[k], atol=1e-5, err_msg=k)
  expected = np.loadtxt(single / "test_results.tsv")
  got = np.loadtxt(multi / "test_results.tsv")
  assert got.shape == (23, 2)
  # The model tells the pairs apart (otherwise order would not be tested), and each row is its
  # pair's: one process and two workers agree row by row.
  assert np.ptp(expected[:, 1]) > 1e-3
  np.testing.assert_allclose(got, expected, atol=1e-5)


def _squad_args(tmp_path):
  """run_squad.py on SQuAD v1.1 dev questions: 8 of a short paragraph to train on (one step),
  and 7 to predict of two paragraphs several 64-token windows long, so that the windows of a
  question are split between the workers."""
  with open(SQUAD, encoding="utf-8") as f:
    paragraphs = json.load(f)["data"][0]["paragraphs"]
  squad = lambda *parts: json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
      {"context": paragraphs[i]["context"], "qas": paragraphs[i]["qas"][:n]} for i, n in parts]}]})
  (tmp_path / "train.json").write_text(squad((2, 8)), encoding="utf-8")
  (tmp_path / "dev.json").write_text(squad((0, 4), (1, 3)), encoding="utf-8")
  model = minilm_dir()
  return lambda output_dir, *modes: [
      "run_squad.py", f"--train_file={tmp_path}/train.json",
      f"--predict_file={tmp_path}/dev.json", f"--vocab_file={model}/vocab.txt",
      f"--init_checkpoint={model}", "--max_seq_length=64", "--doc_stride=32",
      "--max_query_length=16", "--train_batch_size=8", "--predict_batch_size=8",
      "--num_train_epochs=1", "--learning_rate=1e-4", f"--output_dir={output_dir}", *modes]


def _swag_args(tmp_path):
  """run_swag.py on test_run_swag's three rows: trained on them (one step), evaluated on five
  rows (eval batches of 4 do not divide them) and predicting three."""
  from test_run_swag import HEADER, ROWS  # pylint: disable=g-import-not-at-top
  data = tmp_path / "swag"
  data.mkdir()
  (data / "train.csv").write_text(HEADER + "".join(ROWS), encoding="utf-8")
  (data / "val.csv").write_text(HEADER + "".join(ROWS + ROWS[:2]), encoding="utf-8")
  (data / "test.csv").write_text(HEADER.replace(",label\n", "\n") + "".join(
      row[:row.rstrip("\n").rfind(",")] + "\n" for row in ROWS), encoding="utf-8")
  model = minilm_dir()
  return lambda output_dir, *modes: [
      "run_swag.py", f"--data_dir={data}", f"--vocab_file={model}/vocab.txt",
      f"--init_checkpoint={model}", "--max_seq_length=32", "--train_batch_size=3",
      "--eval_batch_size=4", "--predict_batch_size=4", "--num_train_epochs=1",
      "--learning_rate=1e-4", f"--output_dir={output_dir}", *modes]


@pytest.mark.parametrize("args,score,outputs", [
    pytest.param(_squad_args, ["--do_predict"],
                 ["eval_results.txt", "predictions.json", "nbest_predictions.json"],
                 id="run_squad"),
    pytest.param(_swag_args, ["--do_eval", "--do_predict"],
                 ["eval_results.txt", "test_results.tsv"], id="run_swag"),
])
def test_squad_and_swag_on_two_workers_equal_one_process(args, score, outputs, tmp_path):
  """The chief's outputs are the one process's: metrics up to float round-off, the same answers
  (SQuAD: each question's windows gathered from both workers) and rows in input order."""
  single, multi = _score_on_two_workers(args(tmp_path), tmp_path, ["--do_train"], score)
  for name in outputs:
    if name == "eval_results.txt":
      expected, got = _eval_results(single), _eval_results(multi)
      assert expected.keys() == got.keys()
      for k in expected:
        np.testing.assert_allclose(got[k], expected[k], atol=1e-5, err_msg=k)
    elif name == "test_results.tsv":
      expected, got = np.loadtxt(single / name), np.loadtxt(multi / name)
      assert got.shape == (3, 4) and np.ptp(expected, axis=0).max() > 1e-4
      np.testing.assert_allclose(got, expected, atol=1e-5)
    else:
      with open(single / name, encoding="utf-8") as f:
        expected = json.load(f)
      with open(multi / name, encoding="utf-8") as f:
        got = json.load(f)
      assert list(got) == list(expected) and len(got) == 7
      if name == "predictions.json":
        assert got == expected
      else:  # n-best lists: the same candidates, their probabilities up to round-off
        for qid, candidates in expected.items():
          assert [c["text"] for c in got[qid]] == [c["text"] for c in candidates]
          np.testing.assert_allclose([c["probability"] for c in got[qid]],
                                     [c["probability"] for c in candidates], atol=1e-5)


def test_extract_features_on_two_workers_equals_one_process(tmp_path):
  lines = [line for line in open(WIKITEXT, encoding="utf-8").read().splitlines() if line][:27]
  text = tmp_path / "in.txt"
  text.write_text("\n".join(lines) + "\n", encoding="utf-8")
  model = minilm_dir()
  common = ["extract_features.py", f"--input_file={text}", f"--vocab_file={model}/vocab.txt",
            f"--init_checkpoint={model}", "--max_seq_length=64", "--batch_size=4",
            "--layers=-1,-2"]
  run_ok([*common, f"--output_file={tmp_path}/single.jsonl"])
  run_workers([*common, f"--output_file={tmp_path}/multi.jsonl",
               "--distribution_strategy=multi_worker_mirrored"])
  single = [json.loads(line) for line in open(tmp_path / "single.jsonl", encoding="utf-8")]
  multi = [json.loads(line) for line in open(tmp_path / "multi.jsonl", encoding="utf-8")]
  assert len(multi) == len(single) == 27
  for a, b in zip(single, multi):
    assert a["linex_index"] == b["linex_index"]
    assert [t["token"] for t in a["features"]] == [t["token"] for t in b["features"]]
    values = lambda line: np.array([[layer["values"] for layer in t["layers"]]
                                    for t in line["features"]])
    np.testing.assert_allclose(values(b), values(a), atol=2e-4)


def _split_records(path, counts, directory):
  """The first records of the TFRecord file `path` as files of `counts` records each (their
  paths). Frames are copied whole (the data's length in 8 bytes, little-endian, its CRC in 4,
  the data and its CRC in 4), so the test process needs no TensorFlow to cut the file."""
  with open(path, "rb") as f:
    data = f.read()
  paths, offset = [], 0
  for index, count in enumerate(counts):
    start = offset
    for _ in range(count):
      offset += 16 + int.from_bytes(data[offset:offset + 8], "little")
    assert offset <= len(data)
    paths.append(os.path.join(directory, f"part{index}.tfrecord"))
    with open(paths[-1], "wb") as f:
      f.write(data[start:offset])
  return paths


def test_pretraining_eval_on_two_workers_over_unequal_files_equals_one_process(tmp_path):
  """run_pretraining.py --do_eval with two workers and two record files, of 40 and 8 records:
  with as many files as workers the input is sharded by file, so after 2 batches of 4 the second
  worker's input is exhausted and it runs zero-row batches while the first reads 8 more (such a
  batch once failed a -1 reshape in the model). Both workers finish, and the chief's metrics
  are those of one process over both files."""
  files = _split_records(PRETRAINING_RECORDS, [40, 8], tmp_path)
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(TINY_CONFIG))
  args = lambda output_dir, *modes: [
      "run_pretraining.py", f"--bert_config_file={config}", f"--input_file={','.join(files)}",
      f"--output_dir={output_dir}", "--max_seq_length=128", "--max_predictions_per_seq=20",
      "--train_batch_size=8", "--eval_batch_size=8", "--num_train_steps=1",
      "--num_warmup_steps=0", "--seed=3", *modes]
  single, multi = _score_on_two_workers(args, tmp_path, ["--do_train"], ["--do_eval"])
  expected, got = _eval_results(single), _eval_results(multi)
  assert expected.keys() == got.keys() and got["global_step"] == 1
  for k in expected:
    np.testing.assert_allclose(got[k], expected[k], atol=1e-5, err_msg=k)


# What TensorFlow's coordination service logs when it takes a worker for a crashed one (after a
# good run too, when a worker exits 10 s or more before the chief), and what a worker logs when
# it outlives the chief.
_CRASH_NOISE = ("The tasks have crashed", "stopped sending heartbeats",
                "Failed to send RPC to coordination service")
# The scripts' own TensorFlow log level (warnings and errors of its C++ libraries: those lines
# among them), not the tests' silence.
_SCRIPTS_ENV = dict(ENV, TF_CPP_MIN_LOG_LEVEL="1")


def test_a_killed_worker_stops_the_other_with_one_line_and_a_restart_resumes(tmp_path):
  """Two run_pretraining.py workers; worker 1 is SIGKILLed once checkpoint 4 is written. The
  chief stops by itself within seconds (the coordination service's 10 s heartbeat timeout, then
  no teardown), its last line the one error line naming the dead worker, what to do and the
  checkpoint a restart resumes from. The same command restarted on both: both succeed, from that
  checkpoint, and the chief's log ends with its last save, not with TensorFlow's "The tasks have
  crashed"."""
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(TINY_CONFIG))
  out = tmp_path / "out"
  args = ["run_pretraining.py", f"--bert_config_file={config}",
          f"--input_file={PRETRAINING_RECORDS}", f"--output_dir={out}", "--do_train",
          "--train_batch_size=8", "--num_train_steps=40", "--num_warmup_steps=0",
          "--iterations_per_loop=2", "--save_checkpoints_steps=4", "--seed=3",
          "--max_seq_length=128", "--max_predictions_per_seq=20",
          "--distribution_strategy=multi_worker_mirrored"]
  (chief, _), (status, killed) = kill_a_worker_at_checkpoint(args, str(out), 4, _SCRIPTS_ENV,
                                                             os.path.exists, wait=30)
  assert killed == -9 and status == 1, chief[-3000:]  # (-9 after 30 s: it did not stop)
  saved = sorted(int(m.group(1)) for m in map(re.compile(r"ckpt-(\d+)\.index$").match,
                                              os.listdir(out)) if m)
  assert saved and saved[-1] < 40, saved
  lines = chief.strip().splitlines()
  assert lines[-1] == (f"error: worker 1 stopped answering (killed or lost); restart every "
                       f"worker with the same command: training resumes from "
                       f"{out}/ckpt-{saved[-1]}"), chief[-3000:]

  chief, worker = run_workers(args, env=_SCRIPTS_ENV)
  assert f"Resumed from {out}/ckpt-{saved[-1]} at step {saved[-1]}" in chief, chief[-3000:]
  assert chief.strip().splitlines()[-1].endswith(f"Saved checkpoint {out}/ckpt-40"), chief[-3000:]
  for output in (chief, worker):
    assert not [noise for noise in _CRASH_NOISE if noise in output], output[-3000:]


# A script's main under multi_worker_mirrored whose chief works on 15 s after the last
# collective (a chief writes outputs the other workers do not), through the scripts' run_main.
_LINGERING_CHIEF = """
import time
import tensorflow as tf
from absl import logging
from bert_tf2 import commands, script_flags

def main(_):
  strategy = script_flags.strategy()
  one = tf.function(lambda: strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
      "SUM", tf.constant(1.0))))
  total = float(strategy.experimental_local_results(one())[0])
  if strategy.cluster_resolver.task_id == 0:
    time.sleep(15)
  logging.info("done: %s workers", total)

script_flags.define_runtime_flags()
commands.run_main(main)
"""


def test_workers_of_a_good_run_leave_together():
  """A worker done 15 s before the chief waits for it at the end (a barrier of TensorFlow's
  coordination service): without it, the chief's log of a good run ended with the service's
  "The following tasks are unhealthy (stopped sending heartbeats) ... The tasks have crashed"
  (10 s after the worker left). Both succeed; each log ends with its own last line."""
  outputs = run_workers(["-c", _LINGERING_CHIEF, "--distribution_strategy=multi_worker_mirrored"],
                        env=_SCRIPTS_ENV)
  for output in outputs:
    assert output.strip().splitlines()[-1].endswith("done: 2.0 workers"), output[-3000:]
    assert not [noise for noise in _CRASH_NOISE if noise in output], output[-3000:]


# TensorFlow's errors on the workers left (their text as TensorFlow 2.21 raised them here).
_ABORTED = ("Graph execution error:\n\nDetected at node CollectiveReduceV2_1 defined at (most "
            "recent call last):\n  File \"run_pretraining.py\", line 11, in <module>\n\n")
_DEAD = ("The following tasks are unhealthy (stopped sending heartbeats):\n{}\nThe tasks have "
         "crashed. Check the task logs for an earlier error, or scheduler events (e.g. "
         "preemption, eviction) to debug further.\nThe error could be from a previous operation. "
         "Restart your program to reset.\n\t [[{{node CollectiveReduceV2_1}}]] "
         "[Op:__inference__train_loop_8025]")


@pytest.mark.parametrize("kind,text,workers,own,expected", [
    pytest.param("UnavailableError", _ABORTED + "Collective ops is aborted by: Error reported from "
                 "/job:worker/task:1: " + _DEAD.format("/job:worker/replica:0/task:1"),
                 2, 0, "worker 1", id="the chief, a worker gone"),
    pytest.param("UnavailableError", _ABORTED + "Collective ops is aborted by: recvmsg:Connection "
                 "reset by peer\nAdditional GRPC error information from remote target "
                 "/job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/"
                 "CompleteInstance:\n:UNKNOWN:Error received from peer  {grpc_status:14, "
                 "grpc_message:\"recvmsg:Connection reset by peer\"}\nThe error could be from a "
                 "previous operation. Restart your program to reset.", 2, 1, "worker 0",
                 id="a worker, the chief gone"),
    pytest.param("InternalError", "Barrier failed because: task is set to ERROR: UNAVAILABLE: Task "
                 "/job:worker/replica:0/task:1 heartbeat timeout. This indicates that the remote "
                 "task has failed, got preempted, or crashed unexpectedly. [type.googleapis.com/"
                 "tensorflow.CoordinationServiceError='']. Barrier Id: bert_tf2_end_of_run::0, "
                 "Task: /job:worker/replica:0/task:1\n\nRPC: /tensorflow.CoordinationService/"
                 "Barrier", 2, 0, "worker 1", id="the end-of-run barrier"),
    pytest.param("UnavailableError", "Collective ops is aborted by: Error reported from "
                 "/job:worker/task:0: " + _DEAD.format("/job:worker/replica:0/task:2"), 3, 1,
                 "worker 2", id="three workers, one relaying"),
    pytest.param("UnavailableError", "Collective ops is aborted by: Socket closed", 2, 0,
                 "worker 1", id="unnamed: the other of two"),
    pytest.param("UnavailableError", "Error executing an HTTP request: libcurl code 7 meaning "
                 "'Couldn't connect to server', when reading gs://bucket/records", 2, 0, None,
                 id="not a worker: the object store"),
])
def test_a_lost_worker_is_named_from_tensorflows_error(monkeypatch, kind, text, workers, own,
                                                        expected):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import commands  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": [f"host{i}:1" for i in range(workers)]},
      "task": {"type": "worker", "index": own}}))
  monkeypatch.setattr(commands, "_in_a_cluster", lambda: True)
  monkeypatch.setattr(commands, "_resume_point", lambda: ": RESUME")
  error = getattr(tf.errors, kind)(None, None, text)
  line = commands._lost_worker_line(error, tf.errors)  # pylint: disable=protected-access
  assert line == (expected and f"{expected} stopped answering (killed or lost); restart every "
                  "worker with the same command: RESUME")
