"""Reliability of the command-line scripts: bad input, interruption, non-finite losses, determinism.

Every case runs a real script as a subprocess (its exit status and last stderr line are what a
user sees) on tiny inputs, and checks that nothing was written under the output's final name.
A bad input must end in one `error: ...` line naming the file and line, record or flag, exit
status 2 (1 for a training run that cannot go on) and no traceback.

Items of the reliability issue tested elsewhere, and not repeated here:
  - missing files: test_create_pretraining_data.test_command_line, test_build_vocab.test_bad_inputs,
    test_checkpoints.test_missing_checkpoint_is_a_clear_error, test_export_model (checkpoint not
    found), test_tokenization.test_missing_vocab_file;
  - do_lower_case vs a cased checkpoint: test_tokenization.test_validate_case_matches_checkpoint,
    test_export_model (a hub module's casing through run_classifier);
  - max_seq_length above max_position_embeddings: test_run_pretraining, test_run_squad and
    test_extract_features (command lines);
  - invalid UTF-8 naming file:line: test_tokenization (vocab), test_create_pretraining_data,
    test_extract_features (command line, no output written);
  - SQuAD answers whose offsets do not match the context, in the reader:
    test_run_squad.test_bad_answer_offsets_are_skipped_and_reported;
  - TFRecords of the wrong shape:
    test_run_pretraining.test_bad_flags_are_clear_errors_and_write_nothing;
  - pre-training killed with SIGKILL or SIGTERM, then resumed: test_run_pretraining;
  - non-finite losses skipped, then a stop with the checkpoint intact: test_training;
  - same seed, same data whatever the worker count: test_create_pretraining_data (fast mode).
Run_classifier and run_squad write their own TFRecords from text (atomically) and read no
TFRecord given by the user, so only run_pretraining has user TFRecords to check.
"""

import glob
import json
import os
import re
import shutil
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import (DEVNULL, ENV, PIPE, PYTHON, ROOT, SHARED, TINY, TINY_CKPT, TINY_VOCAB, VOCAB,
                      popen, requires_shared, run_ok, run_script)

SAMPLE_TEXT = os.path.join(SHARED, "reference", "pretraining", "sample_text.txt")
CORPUS = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")
# The tiny checkpoint's words; its vocab has nothing else but the special tokens.
WORDS = "all work and no play makes jack a dull boy".split()
# hidden_size 8 where the tiny checkpoint has 4: a config that does not match it.
TINY_CONFIG = {"vocab_size": 15, "hidden_size": 8, "num_hidden_layers": 1,
               "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 16,
               "type_vocab_size": 2}

pytestmark = requires_shared


def _error_line(result, status=2):
  """The one-line error a failed run ends with (after checking there was no traceback)."""
  assert result.returncode == status, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: "), result.stderr[-3000:]
  return last


def _leftovers(directory):
  """Files and directories under `directory` (relative paths), or [] when it does not exist."""
  found = []
  for root, dirs, files in os.walk(directory):
    found.extend(os.path.relpath(os.path.join(root, n), directory) for n in dirs + files)
  return sorted(found)


# Results a training script publishes in its output_dir; features it caches there (train.tf_record)
# and the config copy are complete files, not results.
_TRAINING_RESULTS = re.compile(r"(^|/)(checkpoint|ckpt-.*|eval_results\.txt|test_results\.tsv|"
                               r"predictions\.json|nbest_predictions\.json|test_predictions\.txt)$"
                               r"|\.tmp-")


def _no_training_results(output_dir):
  bad = [p for p in _leftovers(output_dir) if _TRAINING_RESULTS.search(p)]
  assert not bad, bad


def _text(path, lines):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return str(path)


def _sentences(n, seed):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=rng.integers(2, 9))) for _ in range(n)]


def _sst_dir(path, rows=None):
  """An SST-2 style task directory (sentence<TAB>label) on the tiny checkpoint's words."""
  rows = rows or [f"{s}\t{i % 2}" for i, s in enumerate(_sentences(24, 0))]
  _text(path / "train.tsv", ["sentence\tlabel", *rows])
  _text(path / "dev.tsv", ["sentence\tlabel", *rows[:8]])
  return str(path)


def _classifier_args(data_dir, output_dir, *extra):
  return ["run_classifier.py", "--task_name=sst-2", f"--data_dir={data_dir}",
          f"--output_dir={output_dir}", f"--vocab_file={TINY_VOCAB}",
          f"--init_checkpoint={TINY_CKPT}", "--max_seq_length=16", "--train_batch_size=4",
          "--num_train_epochs=1", "--do_train", *extra]


def _example(seq=16, pred=4, drop=None, nan=False, rng=None):
  rng = rng or np.random.default_rng(0)
  length = int(rng.integers(4, seq + 1))
  ids = [2, *rng.integers(5, 15, size=length - 2), 3] + [0] * (seq - length)
  positions = sorted(rng.choice(np.arange(1, length - 1), size=min(pred, length - 2),
                                replace=False))
  masked = [ids[p] for p in positions]
  pad = pred - len(positions)
  ints = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in v]))
  weight = float("nan") if nan else 1.0
  features = {
      "input_ids": ints(ids), "input_mask": ints([1] * length + [0] * (seq - length)),
      "segment_ids": ints([0] * seq), "masked_lm_positions": ints([*positions] + [0] * pad),
      "masked_lm_ids": ints(masked + [0] * pad),
      "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(
          value=[weight] * len(positions) + [0.0] * pad)),
      "next_sentence_labels": ints([int(rng.integers(0, 2))]),
  }
  if drop:
    del features[drop]
  return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def _records(path, n=32, **kw):
  rng = np.random.default_rng(1)
  with tf.io.TFRecordWriter(str(path)) as writer:
    for _ in range(n):
      writer.write(_example(rng=rng, **kw))
  return str(path)


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
  """A tiny config and 32 valid records of length 16 for run_pretraining."""
  d = tmp_path_factory.mktemp("pretraining")
  (d / "bert_config.json").write_text(json.dumps(TINY_CONFIG))
  return d, _records(d / "good.tfrecord")


def _pretraining_args(config_dir, records, output_dir, *extra):
  return ["run_pretraining.py", f"--bert_config_file={config_dir / 'bert_config.json'}",
          f"--input_file={records}", f"--output_dir={output_dir}", "--do_train",
          "--max_seq_length=16", "--max_predictions_per_seq=4", "--train_batch_size=4",
          "--num_train_steps=4", "--num_warmup_steps=1", "--learning_rate=1e-3",
          "--iterations_per_loop=2", "--save_checkpoints_steps=2", "--seed=7", *extra]


# --- bad input: data generation (create_pretraining_data imports TF only to write, so cheap) ----


def _cpd_args(input_file, vocab_file, output_file, *extra):
  return ["create_pretraining_data.py", f"--input_file={input_file}", f"--vocab_file={vocab_file}",
          f"--output_file={output_file}", "--max_seq_length=32", "--max_predictions_per_seq=5",
          "--dupe_factor=2", "--num_workers=1", *extra]


def test_create_pretraining_data_bad_inputs(tmp_path):
  out = tmp_path / "out.tfrecord"
  good = _text(tmp_path / "good.txt", ["All work and no play.", "Makes Jack a dull boy.", "",
                                       "Another document.", "With two lines."])
  not_a_file = tmp_path / "a_directory.txt"
  not_a_file.mkdir()
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  blank = tmp_path / "blank.txt"
  blank.write_bytes(b"\n\n   \n\t\r\n\n")
  latin1 = tmp_path / "latin1.txt"
  latin1.write_bytes("First line.\nSecond line.\nCaf\u00e9 au lait.\n".encode("latin-1"))
  specials = _text(tmp_path / "words.txt", ["[PAD]", "[UNK]", "all", "work", "play"])
  cases = [
      # Unreadable: tests run as root, for whom chmod 000 changes nothing; a directory where a
      # file is expected is unreadable as text to everyone.
      (_cpd_args(not_a_file, VOCAB, out), f"input file is not a regular file: {not_a_file}"),
      (_cpd_args(good, not_a_file, out), f"vocab file is not a regular file: {not_a_file}"),
      (_cpd_args(empty, VOCAB, out), f"no documents in the input ({empty})"),
      (_cpd_args(blank, VOCAB, out, "--mode=fast"), f"no documents in the input ({blank})"),
      (_cpd_args(latin1, VOCAB, out), f"{latin1}:3: invalid UTF-8 at byte 3"),
      (_cpd_args(good, specials, out), f"vocab file {specials} lacks the special token(s) "
                                       "[CLS] [SEP] [MASK]"),
  ]
  for args, message in cases:
    line = _error_line(run_script(args))
    assert message in line, (message, line)
    assert not os.path.exists(out) and not glob.glob(str(tmp_path / ".out.tfrecord*"))


# --- bad input: run_pretraining and its TFRecords -----------------------------------------------


def test_run_pretraining_bad_records_and_flags(pretraining, tmp_path):
  config_dir, good = pretraining
  out = tmp_path / "out"
  garbage = tmp_path / "garbage.tfrecord"
  garbage.write_bytes(b"these are not TFRecords\n" * 10)
  empty = tmp_path / "empty.tfrecord"
  empty.write_bytes(b"")
  missing = _records(tmp_path / "missing.tfrecord", n=2, drop="next_sentence_labels")
  # The first records are fine (check_records passes); the file ends inside record 5.
  truncated = tmp_path / "truncated.tfrecord"
  truncated.write_bytes(open(good, "rb").read()[:1500])
  cases = [
      (_pretraining_args(config_dir, garbage, out),
       [f"{garbage}: record 0 cannot be read (corrupted record at 0"]),
      (_pretraining_args(config_dir, empty, out), [f"{empty}: holds no record"]),
      (_pretraining_args(config_dir, truncated, out),
       [f"{truncated}: record 5 cannot be read (truncated record at ",
        "the file is truncated or damaged"]),
      (_pretraining_args(config_dir, missing, out),
       [f"{missing}: record 0 does not match the expected features (input_ids[16], ",
        "next_sentence_labels (data type: int64) is required but could not be found"]),
      (_pretraining_args(config_dir, good, out, "--distribution_strategy=mirrored",
                         "--num_cpu_devices=2", "--train_batch_size=3"),
       ["--train_batch_size=3 is not divisible by 2 replicas x 1 gradient accumulation steps"]),
  ]
  for args, messages in cases:
    line = _error_line(run_script(args))
    for message in messages:
      assert message in line, (message, line)
    assert "{{function_node" not in line  # TF's op-internal noise is not shown to the user
    _no_training_results(out)
    shutil.rmtree(out, ignore_errors=True)
  # A config that does not match --init_checkpoint: the variable and both shapes are named.
  line = _error_line(run_script(_pretraining_args(config_dir, good, out,
                                            f"--init_checkpoint={TINY_CKPT}")))
  assert re.search(rf"{TINY_CKPT}: variable bert/\S+ has shape \[\d+, 4\] in the checkpoint but "
                   r"\[\d+, 8\] in the model; does the config match the checkpoint\?", line), line
  _no_training_results(out)


# --- bad input: the fine-tuning scripts -----------------------------------------------------------


def test_run_classifier_bad_inputs_and_contradicting_flags(tmp_path):
  data = _sst_dir(tmp_path / "sst")
  out = tmp_path / "out"
  sentences = _sentences(10, 1)
  wide = _sst_dir(tmp_path / "wide", [f"{s}\t{i % 2}" for i, s in enumerate(sentences[:4])]
                  + [f"{sentences[4]}\t1\tan extra column"] + [f"{s}\t0" for s in sentences[5:]])
  unknown = _sst_dir(tmp_path / "unknown", [f"{s}\t1" for s in sentences[:6]]
                     + [f"{sentences[6]}\tpositive"] + [f"{s}\t0" for s in sentences[7:]])
  holey = tmp_path / "holey"
  (holey / "train.tsv").mkdir(parents=True)  # unreadable as a file, even to root
  cased = tmp_path / "cased_L-12_H-768_A-12"
  os.symlink(TINY, cased)
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(TINY_CONFIG))
  specials = _text(tmp_path / "words.txt", WORDS)
  # (arguments, message, whether the training features may have been written before the error)
  cases = [
      (_classifier_args(data, out, f"--init_checkpoint={cased}/bert_model.ckpt"),
       f"--do_lower_case=True does not match --init_checkpoint={cased}/bert_model.ckpt: "
       "`cased_L-12_H-768_A-12` is a cased model", False),
      (_classifier_args(data, out, "--max_seq_length=32"),
       "--max_seq_length=32 is above max_position_embeddings=16 of ", False),
      (_classifier_args(data, out, "--distribution_strategy=mirrored", "--num_cpu_devices=2",
                        "--train_batch_size=3"),
       "--train_batch_size=3 is not divisible by 2 replicas x 1 gradient accumulation steps",
       False),
      (_classifier_args(data, out, f"--vocab_file={specials}"),
       f"vocab file {specials} lacks the special token(s) [PAD] [UNK] [CLS] [SEP] [MASK]", False),
      (_classifier_args(wide, out),
       f"{wide}/train.tsv:6: expected 2 tab-separated columns, found 3", False),
      (_classifier_args(unknown, out),
       f"{unknown}/train.tsv:8: unknown label 'positive'; expected one of 0, 1", False),
      (_classifier_args(holey, out), f"file is not a regular file: {holey}/train.tsv", False),
      # No TPU here: TensorFlow's own errors were a 40-line traceback and a bare resolver error.
      (_classifier_args(data, out, "--distribution_strategy=tpu"),
       "--distribution_strategy=tpu found no TPU (", False),
      (_classifier_args(data, out, "--use_tpu", "--tpu_name=my-tpu"),
       "--tpu_name=my-tpu: the TPU cannot be reached (", False),
      # The checkpoint is read when training starts, after the features are written (complete).
      (_classifier_args(data, out, f"--bert_config_file={config}"),
       f"{TINY_CKPT}: variable bert/", True),
  ]
  for args, message, features_written in cases:
    line = _error_line(run_script(args))
    assert message in line, (message, line)
    _no_training_results(out)
    assert features_written or not (out / "train.tf_record").exists(), args
  assert re.search(r"has shape \[\d+, 4\] in the checkpoint but \[\d+, 8\] in the model; does the "
                   r"config match the checkpoint\?", line), line


def test_run_squad_answers_off_their_offsets_are_named_skipped_and_counted(tmp_path):
  context = " ".join(WORDS)
  qas = [{"id": "q-shifted", "question": "who plays", "answers": [{"text": "jack",
                                                                   "answer_start": 3}]},
         {"id": "q-beyond", "question": "what", "answers": [{"text": "boy", "answer_start": 999}]}]
  train = tmp_path / "train.json"
  train.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
      {"context": context, "qas": qas}]}]}, indent=1), encoding="utf-8")
  out = tmp_path / "out"
  result = run_script(["run_squad.py", f"--vocab_file={TINY_VOCAB}", f"--init_checkpoint={TINY_CKPT}",
                 "--do_train", f"--train_file={train}", f"--output_dir={out}",
                 "--max_seq_length=16", "--max_query_length=4", "--doc_stride=4"])
  line = _error_line(result)
  assert re.search(rf"{train}:\d+: question q-shifted: answer offsets do not match the context; "
                   "skipped", result.stderr)
  assert re.search(rf"{train}:\d+: question q-beyond: answer offsets", result.stderr)
  assert f"{train}: skipped 2 questions" in result.stderr
  assert line == f"error: {train}: no training example in it"
  _no_training_results(out)


def test_conll_line_with_a_missing_tag(tmp_path):
  data = tmp_path / "conll"
  _text(data / "train.txt", ["-DOCSTART- -X- -X- O", "", "jack NNP B-NP B-PER",
                             "plays VBZ B-VP O", "all DT B-NP", "boy NN I-NP O", ""])
  out = tmp_path / "out"
  line = _error_line(run_script(["run_ner.py", f"--vocab_file={TINY_VOCAB}",
                           f"--init_checkpoint={TINY_CKPT}", "--do_train", f"--data_dir={data}",
                           f"--output_dir={out}", "--max_seq_length=16"]))
  assert f"{data}/train.txt:5: expected 4 columns like the file's first token line, found 3" in line
  assert "a missing tag?" in line
  _no_training_results(out)


# --- bad input: the other scripts ----------------------------------------------------------------


def test_other_scripts_name_unreadable_files_and_mismatched_configs(tmp_path):
  not_a_file = tmp_path / "a_directory"
  not_a_file.mkdir()
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(TINY_CONFIG))
  text = _text(tmp_path / "lines.txt", ["all work", "and no play"])
  cases = [
      (["extract_features.py", f"--input_file={not_a_file}", f"--vocab_file={TINY_VOCAB}",
        f"--init_checkpoint={TINY_CKPT}", f"--output_file={tmp_path / 'features.jsonl'}",
        "--max_seq_length=16"],
       f"--input_file is not a regular file: {not_a_file}", tmp_path / "features.jsonl"),
      (["extract_features.py", f"--input_file={text}", f"--vocab_file={TINY_VOCAB}",
        f"--init_checkpoint={TINY_CKPT}", f"--bert_config_file={config}",
        f"--output_file={tmp_path / 'features.jsonl'}", "--max_seq_length=16", "--layers=-1"],
       f"{TINY_CKPT}: variable bert/embeddings/", tmp_path / "features.jsonl"),
      (["export_model.py", f"--init_checkpoint={TINY_CKPT}", f"--vocab_file={not_a_file}",
        f"--export_dir={tmp_path / 'exported'}"],
       f"vocab file is not a regular file: {not_a_file}", tmp_path / "exported"),
      (["build_vocab.py", f"--input_file={not_a_file}", f"--output_dir={tmp_path / 'vocab'}"],
       f"--input_file is not a regular file: {not_a_file}", tmp_path / "vocab"),
      (["convert_checkpoint.py", f"--input={TINY_CKPT}", f"--bert_config_file={config}",
        f"--output={tmp_path / 'converted'}", "--output_format=hf"],
       f"{TINY_CKPT}: variable bert/embeddings/", tmp_path / "converted"),
  ]
  for args, message, output in cases:
    line = _error_line(run_script(args))
    assert message in line, (message, line)
    assert not os.path.exists(output), (output, _leftovers(output))
  assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


# --- odd text: long lines, NUL and control characters --------------------------------------------


def test_long_lines_and_control_characters_give_the_same_records_as_clean_text(tmp_path):
  """Lines of 100 KB and NUL / control / format characters inside words are no problem: the
  tokenizer drops those characters, so the records equal those of the clean text, byte for byte,
  in both modes."""
  rng = np.random.default_rng(3)
  vocab_words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "house",
                 "river", "city", "music"]
  junk = ["\x00", "\x07", "\x1b", "\x7f", "\u200b", "\u200d", "\ufeff", "\x00\x00"]
  clean, noisy = [], []
  for doc in range(6):
    for sentence in range(int(rng.integers(3, 7))):
      # The first sentence of the third document is one line of about 100 KB.
      size = 20000 if (doc, sentence) == (2, 0) else int(rng.integers(3, 15))
      words = [str(w) for w in rng.choice(vocab_words, size=size)]
      clean.append(" ".join(words) + ".")
      cuts = rng.integers(0, 6, size=size)
      noisy.append(" ".join(w[:c] + str(rng.choice(junk)) + w[c:] for w, c in zip(words, cuts))
                   + ".")
    clean.append("")
    noisy.append("")
  assert max(len(line) for line in clean) > 100_000
  clean_file = _text(tmp_path / "clean.txt", clean)
  noisy_file = _text(tmp_path / "noisy.txt", noisy)
  for mode in ("exact", "fast"):
    outputs = []
    for name, source in (("clean", clean_file), ("noisy", noisy_file)):
      output = tmp_path / f"{name}-{mode}.tfrecord"
      run_ok(["create_pretraining_data.py", f"--input_file={source}", f"--vocab_file={VOCAB}",
           f"--output_file={output}", "--max_seq_length=64", "--max_predictions_per_seq=10",
           "--dupe_factor=2", f"--mode={mode}", "--num_workers=1", "--random_seed=5"])
      outputs.append(output.read_bytes())
    assert len(outputs[0]) > 10_000 and outputs[0] == outputs[1], mode


# --- non-finite losses, through the command line -------------------------------------------------


def test_nonfinite_losses_stop_with_a_clear_message_and_the_checkpoint_intact(pretraining,
                                                                                tmp_path):
  config_dir, good = pretraining
  out = tmp_path / "out"
  run_ok(_pretraining_args(config_dir, good, out, "--num_train_steps=2"))
  before = _checkpoint_tensors(out)
  poisoned = _records(tmp_path / "nan.tfrecord", n=8, nan=True)  # NaN masked_lm_weights
  result = run_script(_pretraining_args(config_dir, poisoned, out, "--num_train_steps=20",
                                  "--max_nonfinite_loops=2"))
  line = _error_line(result, status=1)
  assert "loss stayed non-finite for 2 consecutive loops at step 2" in line
  assert f"the last good checkpoint {out / 'ckpt-2'} is intact" in line
  assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-2")
  after = _checkpoint_tensors(out)
  assert before.keys() == after.keys()
  for k in before:
    np.testing.assert_array_equal(before[k], after[k], err_msg=k)


def _checkpoint_tensors(directory):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(directory)))
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if "/.ATTRIBUTES/" in k and "save_counter" not in k}


# --- determinism ---------------------------------------------------------------------------------


def test_same_seed_same_pretraining_losses_and_weights(pretraining, tmp_path):
  """Two runs in separate processes (other hash seeds), dropout on: the same eval results and the
  same final weights and Adam moments, bit for bit."""
  config_dir, good = pretraining
  runs = []
  for i, hash_seed in enumerate(("1", "2")):
    out = tmp_path / f"run{i}"
    run_ok(_pretraining_args(config_dir, good, out, "--num_train_steps=6", "--do_eval",
                          "--eval_batch_size=4", "--max_eval_steps=4"),
        env=dict(ENV, PYTHONHASHSEED=hash_seed))
    runs.append(((out / "eval_results.txt").read_text(), _checkpoint_tensors(out)))
  (results_a, tensors_a), (results_b, tensors_b) = runs
  assert "global_step = 6" in results_a and results_a == results_b
  assert tensors_a.keys() == tensors_b.keys() and len(tensors_a) > 20
  for k in tensors_a:
    np.testing.assert_array_equal(tensors_a[k], tensors_b[k], err_msg=k)


def test_same_seed_same_data_files_in_separate_processes(tmp_path):
  """Exact and fast mode, each run twice in processes with different hash seeds (set and dict
  orders differ): byte-identical files. (Fast mode across worker counts: see
  test_create_pretraining_data.)"""
  for mode in ("exact", "fast"):
    files = []
    for hash_seed in ("1", "2"):
      output = tmp_path / f"{mode}-{hash_seed}.tfrecord"
      run_ok(_cpd_args(SAMPLE_TEXT, VOCAB, output, f"--mode={mode}", "--dupe_factor=3",
                    "--do_whole_word_mask", "--num_output_shards=1"),
          env=dict(ENV, PYTHONHASHSEED=hash_seed))
      files.append(output.read_bytes())
    assert len(files[0]) > 10_000 and files[0] == files[1], mode


# --- interruption -------------------------------------------------------------------------------


def _wait_for(condition, proc, what, timeout=240):
  deadline = time.time() + timeout
  while not condition():
    assert proc.poll() is None, f"the process ended before {what}"
    assert time.time() < deadline, f"timed out waiting for {what}"
    time.sleep(0.02)


def test_data_generation_killed_leaves_no_output_and_a_rerun_gives_the_same_file(tmp_path):
  output = tmp_path / "out.tfrecord"
  args = ["create_pretraining_data.py", f"--input_file={CORPUS}", f"--vocab_file={VOCAB}",
          f"--output_file={output}", "--mode=fast", "--num_workers=1", "--chunk_documents=2",
          "--shuffle_buffer_size=100", "--dupe_factor=8", "--max_seq_length=64",
          "--max_predictions_per_seq=10"]
  proc = popen([PYTHON, *args], cwd=ROOT, env=ENV, stdout=DEVNULL, stderr=DEVNULL)
  temporaries = lambda: glob.glob(str(tmp_path / ".out.tfrecord.tmp-*"))
  # Killed while writing: the temporary file has records in it.
  _wait_for(lambda: any(os.path.getsize(t) > 100_000 for t in temporaries()), proc,
            "the first records were written")
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  assert not output.exists()
  # The temporary file of the killed process stays (hidden, named after its pid); nothing else.
  [left] = [os.path.basename(p) for p in temporaries()]
  assert left.startswith(f".out.tfrecord.tmp-{proc.pid}-")
  run_ok(args, env=dict(ENV, PYTHONHASHSEED="3"))
  straight = tmp_path / "straight.tfrecord"
  run_ok([a if not a.startswith("--output_file=") else f"--output_file={straight}" for a in args],
      env=dict(ENV, PYTHONHASHSEED="4"))
  assert output.stat().st_size > 1_000_000
  assert output.read_bytes() == straight.read_bytes()


class _StderrLines:
  """Collects a process's stderr lines in a thread, so the test can wait for one."""

  def __init__(self, proc):
    self.lines = []
    self._thread = threading.Thread(target=lambda: self.lines.extend(proc.stderr), daemon=True)
    self._thread.start()

  def has(self, pattern):
    return any(re.search(pattern, line) for line in list(self.lines))

  def text(self):
    self._thread.join(timeout=60)
    return "".join(self.lines)


def test_fine_tuning_sigterm_saves_a_checkpoint_and_a_rerun_finishes(tmp_path):
  data = _sst_dir(tmp_path / "sst")
  out = tmp_path / "out"
  # 24 examples, batch 4, 25 epochs: 150 steps of one step per loop; SIGTERM comes at the first.
  args = _classifier_args(data, out, "--num_train_epochs=25", "--iterations_per_loop=1",
                          "--save_checkpoints_steps=100000", "--do_eval", "--eval_batch_size=4")
  proc = popen([PYTHON, *args], cwd=ROOT, env=ENV, stdout=DEVNULL, stderr=PIPE, text=True)
  stderr = _StderrLines(proc)
  _wait_for(lambda: stderr.has(r"step \d+/150 "), proc, "training started")
  proc.send_signal(signal.SIGTERM)
  proc.wait(timeout=120)
  text = stderr.text()
  assert proc.returncode == 0, text[-3000:]
  assert "Stopped by SIGTERM" in text and "Traceback" not in text
  step = int(tf.train.latest_checkpoint(str(out)).rsplit("-", 1)[1])
  assert 1 <= step < 150
  assert not (out / "eval_results.txt").exists()  # it stopped rather than evaluating
  resumed = run_ok(args)
  assert f"Resumed from {out / f'ckpt-{step}'} at step {step}" in resumed.stderr
  assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-150")
  results = (out / "eval_results.txt").read_text()
  assert "global_step = 150" in results and "eval_examples = 8" in results


def test_export_killed_leaves_no_saved_model_under_the_final_name(tmp_path):
  export_dir = tmp_path / "encoder"
  args = ["export_model.py", f"--init_checkpoint={TINY_CKPT}", f"--export_dir={export_dir}",
          "--model_type=encoder"]
  proc = popen([PYTHON, *args], cwd=ROOT, env=ENV, stdout=DEVNULL, stderr=DEVNULL)
  staging = lambda: glob.glob(str(tmp_path / ".encoder.tmp-*"))
  _wait_for(lambda: staging() or export_dir.exists(), proc, "the export started writing")
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  if export_dir.exists():  # finished first: then it is complete
    tf.saved_model.load(str(export_dir))
  else:
    assert staging(), "killed mid-write, the SavedModel is only in its hidden staging directory"
  run_ok(args)
  reloaded = tf.saved_model.load(str(export_dir))
  assert reloaded.signatures  # complete and loadable
  assert [p for p in os.listdir(tmp_path) if not p.startswith(".encoder.tmp-")] == ["encoder"]
