"""run_pretraining.py: learning from scratch, strategies that agree, and resume after SIGKILL."""

import itertools
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import (DEVNULL, ENV, LONG_TRAINING, PIPE, PYTHON, ROOT, SHARED, VOCAB,
                      assert_same_checkpoints, kill_at_checkpoint, popen, requires_shared, run_ok,
                      run_script, run_workers)
import pretrain_worker

RECORDS = os.path.join(SHARED, "reference", "pretraining", "default.tfrecord")
TINY_CONFIG = ('{"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, '
               '"num_attention_heads": 2, "intermediate_size": 64, '
               '"max_position_embeddings": 128, "type_vocab_size": 2}')


def _record_ids():
  """input_ids of the first 64 reference records (what pretrain_worker.py reads), in order."""
  ids = []
  for record in tf.data.TFRecordDataset(RECORDS).take(64):
    example = tf.train.Example.FromString(record.numpy())
    ids.append(np.array(example.features.feature["input_ids"].int64_list.value))
  return ids


def _weights(path):
  return dict(np.load(path))


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("one") / "w.npz")
  run_ok(["tests/pretrain_worker.py", "default", out])
  return _weights(out)


def _assert_same_training(a, b):
  # Same global batches, different reduction order across devices: float32 round-off only.
  np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-6)
  # Weights, evaluation metrics and predictions alike.
  assert set(a) == set(b)
  for k in b:
    if k != "chief":
      np.testing.assert_allclose(a[k], b[k], atol=1e-5, err_msg=k)
  # Prediction saw every record once, in order (record i cut to cut_length(i) tokens), each
  # batch padded to its longest record (several replicas: the longest of theirs).
  expected = np.stack([np.pad(ids[:pretrain_worker.cut_length(i)],
                              (0, 128 - min(128, pretrain_worker.cut_length(i))))
                       for i, ids in enumerate(_record_ids())])
  np.testing.assert_array_equal(b["predict.input_ids"], expected)
  assert len(set(b["predict.lengths"])) > 1


@requires_shared
def test_mirrored_over_two_cpu_devices_matches_one_device(one_device, tmp_path):
  out = str(tmp_path / "w.npz")
  run_ok(["tests/pretrain_worker.py", "mirrored", out])
  mirrored = _weights(out)
  _assert_same_training(one_device, mirrored)


@pytest.mark.slow
@requires_shared
@pytest.mark.onednn_bf16
def test_mirrored_bf16_reads_and_writes_each_replicas_weight_copies(tmp_path):
  """bfloat16 under MirroredStrategy: each replica's weight copies (weight_copies) are written by
  the update with its own variables, and the steps are one device's up to bf16 round-off (the
  replicas' gradients are summed in float32)."""
  run_ok(["tests/pretrain_worker.py", "default", str(tmp_path / "one.npz"), "bfloat16"])
  run_ok(["tests/pretrain_worker.py", "mirrored", str(tmp_path / "two.npz"), "bfloat16"])
  one, two = _weights(tmp_path / "one.npz"), _weights(tmp_path / "two.npz")
  assert float(one["copies_off_by"]) == 0.0 and float(two["copies_off_by"]) == 0.0
  np.testing.assert_allclose(two["losses"], one["losses"], rtol=2e-3)
  assert one["losses"][-1] < one["losses"][0]


@requires_shared
def test_multi_worker_mirrored_two_processes_match_one_worker(one_device, tmp_path):
  run_workers(["tests/pretrain_worker.py", "multi_worker_mirrored", f"{tmp_path}/w{{index}}.npz"])
  w0, w1 = _weights(tmp_path / "w0.npz"), _weights(tmp_path / "w1.npz")
  _assert_same_training(one_device, w0)
  for k in w0:
    if k != "chief":  # the workers hold identical replicas, metrics and predictions
      np.testing.assert_array_equal(w0[k], w1[k])
  assert w0["chief"] and not w1["chief"]  # worker 0 writes the outputs


def _pretrain_args(tmp_path, output_dir, steps, extra=()):
  config = tmp_path / "bert_config.json"
  config.write_text(TINY_CONFIG)
  return ["run_pretraining.py", f"--bert_config_file={config}", f"--input_file={RECORDS}",
          f"--output_dir={output_dir}", "--do_train", "--train_batch_size=8",
          f"--num_train_steps={steps}", "--num_warmup_steps=3", "--learning_rate=1e-3",
          "--iterations_per_loop=2", "--save_checkpoints_steps=4", "--seed=3", *extra]


@requires_shared
def test_sigkill_then_rerun_resumes_and_matches_an_uninterrupted_run(tmp_path):
  steps = 16
  straight = tmp_path / "straight"
  run_ok(_pretrain_args(tmp_path, straight, steps))

  killed = tmp_path / "killed"
  kill_at_checkpoint(_pretrain_args(tmp_path, killed, steps), killed, 8)
  assert not os.path.exists(killed / f"ckpt-{steps}.index")
  resumed = run_ok(_pretrain_args(tmp_path, killed, steps))
  assert "Resumed from" in resumed.stderr
  # Same data order (skipped batches), same stateless dropout masks: float round-off only.
  assert_same_checkpoints(straight, killed)


@requires_shared
def test_sigterm_saves_a_checkpoint_and_eval_writes_the_original_keys(tmp_path):
  out = tmp_path / "out"
  proc = popen([PYTHON] + _pretrain_args(tmp_path, out, 100000),
               cwd=ROOT, env=ENV, stdout=DEVNULL, stderr=PIPE, text=True)
  deadline = time.time() + 300
  while not os.path.exists(out / "ckpt-4.index"):
    assert proc.poll() is None and time.time() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  stderr = proc.communicate(timeout=120)[1]
  assert proc.returncode == 0, stderr[-2000:]
  assert "Stopped by SIGTERM" in stderr
  step = int(tf.train.latest_checkpoint(out).rsplit("-", 1)[1])
  assert step >= 4
  run_ok(_pretrain_args(tmp_path, out, 100000, ["--do_train=false", "--do_eval",
                                              "--max_eval_steps=3"]))
  lines = (out / "eval_results.txt").read_text().splitlines()
  keys = [line.split(" = ")[0] for line in lines]
  assert keys == ["global_step", "loss", "masked_lm_accuracy", "masked_lm_loss",
                  "next_sentence_accuracy", "next_sentence_loss"]
  assert f"global_step = {step}" in lines


@requires_shared
def test_bad_flags_are_clear_errors_and_write_nothing(tmp_path):
  args = _pretrain_args(tmp_path, tmp_path / "out", 10, ["--max_seq_length=512"])
  result = run_script(args, timeout=None)
  assert result.returncode == 2
  assert "--max_seq_length=512 is above max_position_embeddings=128" in result.stderr
  assert "Traceback" not in result.stderr
  result = run_script(_pretrain_args(tmp_path, tmp_path / "out", 10,
                                     ["--max_predictions_per_seq=30"]), timeout=None)
  assert result.returncode == 2 and "default.tfrecord: record 0 does not match" in result.stderr
  assert not os.path.exists(tmp_path / "out" / "checkpoint")


@requires_shared
def test_pretraining_from_scratch_beats_the_most_frequent_token(tmp_path):
  """A 2-layer BERT on WikiText-2 (50 documents train, 10 held out) for 1000 steps.

  The baseline is always predicting the most frequent masked token of the held-out records (about
  5%). Unigram statistics alone cannot beat it; beating it by 1.5x needs the token's context (or
  its own input in the 10% of unchanged positions), i.e. the encoder has learned something.
  Measured: 0.098 after 800 steps. With the standard initializer_range 0.02 a model this small
  sits on the unigram plateau (accuracy = baseline) for well over 1200 steps, a known slow start
  of post-LayerNorm Transformers; 0.2 leaves it within a few hundred, so the test uses that.
  """
  corpus = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")
  with open(corpus, encoding="utf-8") as f:  # documents: the runs of lines between blank ones
    docs = [list(run) for nonblank, run in itertools.groupby(f, key=lambda l: bool(l.strip()))
            if nonblank]
  for name, part in (("train", docs[:50]), ("eval", docs[50:])):
    (tmp_path / f"{name}.txt").write_text("\n".join("".join(d) for d in part), encoding="utf-8")
    run_ok(["create_pretraining_data.py", f"--input_file={tmp_path / name}.txt",
          f"--output_file={tmp_path / name}.tfrecord", f"--vocab_file={VOCAB}",
          "--max_seq_length=64", "--max_predictions_per_seq=10",
          f"--dupe_factor={5 if name == 'train' else 1}", "--num_workers=1"])
  config = tmp_path / "config.json"
  config.write_text('{"vocab_size": 30522, "hidden_size": 128, "num_hidden_layers": 2, '
                    '"num_attention_heads": 4, "intermediate_size": 512, '
                    '"max_position_embeddings": 64, "type_vocab_size": 2, '
                    '"initializer_range": 0.2, "hidden_dropout_prob": 0.0, '
                    '"attention_probs_dropout_prob": 0.0}')
  common = [f"--bert_config_file={config}", f"--output_dir={tmp_path / 'out'}",
            "--max_seq_length=64", "--max_predictions_per_seq=10"]
  run_ok(["run_pretraining.py", *common, f"--input_file={tmp_path / 'train.tfrecord'}",
        "--do_train", "--train_batch_size=32", "--num_train_steps=1000",
        "--num_warmup_steps=50", "--learning_rate=1e-3", "--iterations_per_loop=200",
        "--save_checkpoints_steps=1000"], timeout=LONG_TRAINING)
  run_ok(["run_pretraining.py", *common, f"--input_file={tmp_path / 'eval.tfrecord'}",
        "--do_eval", "--eval_batch_size=32", "--max_eval_steps=1000"])
  results = dict(line.split(" = ") for line in
                 (tmp_path / "out" / "eval_results.txt").read_text().splitlines())
  ids, weights = [], []
  for record in tf.data.TFRecordDataset(str(tmp_path / "eval.tfrecord")):
    ex = tf.train.Example.FromString(record.numpy()).features.feature
    ids.extend(ex["masked_lm_ids"].int64_list.value)
    weights.extend(ex["masked_lm_weights"].float_list.value)
  real = np.array(ids)[np.array(weights) > 0]
  baseline = np.bincount(real).max() / len(real)
  accuracy = float(results["masked_lm_accuracy"])
  print(f"masked LM accuracy {accuracy:.3f}, most-frequent-token baseline {baseline:.3f}")
  assert accuracy > 1.5 * baseline, (accuracy, baseline)


@requires_shared
def test_masked_lm_only_on_no_nsp_records_trains_no_next_sentence_head(tmp_path):
  """Single-segment records (create_pretraining_data --no_nsp), masked or unmasked and packed,
  train masked LM alone: no next-sentence head in the checkpoints and no next-sentence loss or
  accuracy (it was trained on the constant label 0, accuracy 1.0 counted in the loss); the
  pooler, which only that head reads, keeps its initial values while the encoder trains; the
  checkpoint fine-tunes. Resuming with records of the other task is one line, in both ways."""
  corpus = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")
  with open(corpus, encoding="utf-8") as f:
    docs = [list(run) for nonblank, run in itertools.groupby(f, key=lambda l: bool(l.strip()))
            if nonblank][:20]
  text = tmp_path / "corpus.txt"
  text.write_text("\n".join("".join(d) for d in docs), encoding="utf-8")
  config = tmp_path / "bert_config.json"
  config.write_text(TINY_CONFIG)
  kinds = {"masked": [], "packed": ["--mode=fast", "--dynamic_masking", "--pack_sequences"]}
  for kind, flags in kinds.items():
    records = tmp_path / f"{kind}.tfrecord"
    run_ok(["create_pretraining_data.py", f"--input_file={text}", f"--output_file={records}",
            f"--vocab_file={VOCAB}", "--max_seq_length=64", "--max_predictions_per_seq=10",
            "--no_nsp", "--num_workers=1", *flags])
    out = tmp_path / kind
    trained = run_ok(["run_pretraining.py", f"--bert_config_file={config}",
                      f"--input_file={records}", f"--output_dir={out}", "--do_train", "--do_eval",
                      "--train_batch_size=8", "--eval_batch_size=8", "--max_eval_steps=2",
                      "--num_train_steps=3", "--num_warmup_steps=1", "--learning_rate=1e-3",
                      "--save_checkpoints_steps=1", "--max_seq_length=64",
                      "--max_predictions_per_seq=10"])
    assert "single segments, masked-LM only (--no_nsp)" in trained.stderr, trained.stderr[-2000:]
    assert "next_sentence" not in trained.stderr, trained.stderr[-2000:]
    results = dict(line.split(" = ") for line in
                   (out / "eval_results.txt").read_text().splitlines())
    assert set(results) == {"global_step", "loss", "masked_lm_accuracy", "masked_lm_loss"}
    assert results["loss"] == results["masked_lm_loss"] and results["global_step"] == "3"
    first, last = (dict(tf.train.list_variables(str(out / f"ckpt-{n}"))) for n in (1, 3))
    assert not [name for name in last if "next_sentence" in name]
    values = lambda n, name: tf.train.load_variable(str(out / f"ckpt-{n}"), name)
    pooler = "model/bert/pooler/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"
    np.testing.assert_array_equal(values(1, pooler), values(3, pooler))
    assert not [name for name in last if "pooler" in name and "optimizer" in name]
    layer = next(name for name in first if "encoder" in name and "kernel" in name
                 and "optimizer" not in name)
    assert np.abs(values(1, layer) - values(3, layer)).max() > 0
  # The checkpoint fine-tunes (its pooler learns there, or --classifier_pooling=mean).
  mrpc = tmp_path / "mrpc"
  mrpc.mkdir()
  for split in ("train", "dev"):
    with open(os.path.join(SHARED, "data", "glue", "MRPC", f"{split}.tsv"), "rb") as f:
      (mrpc / f"{split}.tsv").write_bytes(b"".join(f.readline() for _ in range(17)))
  run_ok(["run_classifier.py", "--task_name=mrpc", f"--data_dir={mrpc}", f"--vocab_file={VOCAB}",
          f"--bert_config_file={config}", f"--init_checkpoint={tmp_path / 'masked'}",
          f"--output_dir={tmp_path / 'classifier'}", "--do_train", "--do_eval",
          "--max_seq_length=64", "--train_batch_size=8", "--num_train_epochs=1"])
  assert (tmp_path / "classifier" / "eval_results.txt").exists()
  # The other task's records into a run's folder: one line, nothing trained.
  pairs = run_ok(["run_pretraining.py", f"--bert_config_file={config}", f"--input_file={RECORDS}",
                  f"--output_dir={tmp_path / 'pairs'}", "--do_train", "--train_batch_size=8",
                  "--num_train_steps=1", "--num_warmup_steps=0"])
  del pairs
  for records, out, message in (
      (RECORDS, tmp_path / "masked", "holds a model trained on masked LM only"),
      (tmp_path / "masked.tfrecord", tmp_path / "pairs",
       "holds a model trained on masked LM and next sentence")):
    before = sorted(os.listdir(out))
    result = run_script(["run_pretraining.py", f"--bert_config_file={config}",
                         f"--input_file={records}", f"--output_dir={out}", "--do_train",
                         "--train_batch_size=8", "--num_train_steps=6", "--max_seq_length=64",
                         "--max_predictions_per_seq=10"])
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: --output_dir={out} {message}"), result.stderr[-2000:]
    assert sorted(os.listdir(out)) == before
