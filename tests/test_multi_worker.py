"""Evaluation and prediction under multi_worker_mirrored: two worker processes on this machine
share the work and the chief writes the same outputs, in input order, as one process does."""

import json
import os
import shutil

import numpy as np

from conftest import SHARED, minilm_dir, requires_shared, run_ok, run_workers

pytestmark = requires_shared

MRPC = os.path.join(SHARED, "data", "glue", "MRPC")
WIKITEXT = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")


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


def test_classifier_eval_and_predict_on_two_workers_equal_one_process(tmp_path):
  data = _mrpc_subset(str(tmp_path / "data"))
  single, multi = tmp_path / "single", tmp_path / "multi"
  run_ok(_classifier_args(data, single, "--do_train", "--do_eval", "--do_predict"))
  # The fine-tuned checkpoint, scored again by two workers.
  os.makedirs(multi)
  for name in os.listdir(single):
    if name.startswith(("ckpt-", "checkpoint", "task.json")):
      shutil.copy(single / name, multi / name)
  run_workers(_classifier_args(data, multi, "--do_eval", "--do_predict",
                               "--distribution_strategy=multi_worker_mirrored"))

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
  # Only the chief wrote: no other worker's files or scratch directories are left.
  assert not [n for n in os.listdir(multi) if n.startswith(".worker_tmp")]


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
