"""Reliability of the fine-tuning scripts (run_classifier, run_squad, run_ner, run_swag) as real
processes on small copies of real data (GLUE MRPC / RTE / SST-2, SQuAD v1.1 / v2.0, CoNLL-2003)
with the tiny TF1 checkpoint.

A bad command ends in exit status 2 and one `error: ...` line (no traceback) naming the flag, file
or record, and leaves every input byte-identical; outputs never overwrite inputs; an output_dir of
another task is refused before its cached records or checkpoints are touched; cached records are
reused only when made from the same inputs and settings, and are byte-identical across processes.
"""

import csv
import functools
import hashlib
import json
import os
import re

from conftest import (ENV, SHARED, TINY, TINY_CKPT, TINY_VOCAB, concurrently, requires_shared,
                      run_ok, run_script)

DATA = os.path.join(SHARED, "data")
V1_DEV = os.path.join(DATA, "squad", "dev-v1.1.json")
V2_DEV = os.path.join(DATA, "squad", "dev-v2.0.Normans_subset.json")
TINY_SIZES = {"hidden_size": 4, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 16, "max_position_embeddings": 16}
# The tiny vocab's words, for SWAG rows (there is no real SWAG data here).
WORDS = "all work and no play makes jack a dull boy".split()

pytestmark = requires_shared


def _run(script, *args, env=ENV):
  return run_script([script, *args], env=env)


def _ok(script, *args, env=ENV):
  return run_ok([script, *args], env=env)


def _error_line(result):
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: "), result.stderr[-3000:]
  return last


def _assert_messages(cases, results):
  for (_, message), result in zip(cases, results):
    line = _error_line(result)
    assert message in line, (message, line)


def _hashes(*tops):
  """{path: sha256} of every file under the given files or directories."""
  found = {}
  for top in map(str, tops):
    paths = [top] if os.path.isfile(top) else [os.path.join(r, n) for r, _, names in os.walk(top)
                                                for n in names]
    for path in paths:
      with open(path, "rb") as f:
        found[path] = hashlib.sha256(f.read()).hexdigest()
  return found


def _head(source, target, lines):
  """The first `lines` lines of a real file, copied byte for byte."""
  target.parent.mkdir(parents=True, exist_ok=True)
  with open(source, "rb") as f:
    target.write_bytes(b"".join(f.readline() for _ in range(lines)))
  return target


def _glue(tmp_path, task, rows=13, name=None):
  directory = tmp_path / (name or task)
  for split in ("train", "dev", "test"):
    _head(os.path.join(DATA, "glue", task, f"{split}.tsv"), directory / f"{split}.tsv", rows)
  return directory


def _conll(tmp_path, name="conll"):
  directory = tmp_path / name
  for split in ("train", "valid", "test"):
    _head(os.path.join(DATA, "conll2003", f"{split}.txt"), directory / f"{split}.txt", 40)
  return directory


def _squad(path, source=V1_DEV, paragraphs=2, edit=None):
  with open(source, encoding="utf-8") as f:
    data = json.load(f)
  data["data"] = data["data"][:1]
  data["data"][0]["paragraphs"] = data["data"][0]["paragraphs"][:paragraphs]
  if edit:
    edit(data["data"][0]["paragraphs"])
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(data, indent=1), encoding="utf-8")
  return path


def _swag(tmp_path, name="swag"):
  directory = tmp_path / name
  directory.mkdir(parents=True)
  header = ["video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source", "ending0",
            "ending1", "ending2", "ending3", "label"]
  for split in ("train", "val", "test"):
    with open(directory / f"{split}.csv", "w", encoding="utf-8", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(header)
      for i in range(4):
        words = WORDS[i:] + WORDS[:i]
        writer.writerow([f"v{i}", str(i), "", " ".join(words[:3]), words[3], "gold",
                         *(" ".join(words[4 + k:6 + k]) for k in range(4)), str(i % 4)])
  return directory


def _tiny(*extra):
  return [f"--vocab_file={TINY_VOCAB}", f"--init_checkpoint={TINY_CKPT}", "--max_seq_length=16",
          "--train_batch_size=4", "--eval_batch_size=4", "--predict_batch_size=4",
          "--num_train_epochs=1", *extra]


def _with_head(directory, script):
  """The tiny checkpoint's encoder with a (random) output layer of `script`'s task, as a TF1
  checkpoint with its config and vocab beside it: evaluating needs a model that has the task's
  output layer (from the pre-trained encoder alone the scripts refuse)."""
  from bert_tf2 import checkpoints  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  config = modeling.BertConfig.from_json_file(os.path.join(TINY, "bert_config.json"))
  model = {"run_ner.py": lambda: modeling.BertTokenClassifier(config, 9),
           "run_swag.py": lambda: modeling.BertMultipleChoice(config),
           "run_squad.py": lambda: modeling.BertSpanLabeler(config)}[script]()
  checkpoints.init_from_checkpoint(model, TINY_CKPT)
  prefix = os.path.join(directory, "bert_model.ckpt")
  checkpoints.export_tf1_checkpoint(model, prefix, config, TINY_VOCAB)
  return prefix


def _squad_args(*extra):
  return _tiny("--max_query_length=4", "--doc_stride=4", *extra)


def _config(path, **changes):
  with open(os.path.join(TINY, "bert_config.json"), encoding="utf-8") as f:
    config = json.load(f)
  config.update(changes)
  path.write_text(json.dumps(config), encoding="utf-8")
  return path


# --- class 1 / 7: outputs never an input; output_dir must be a directory -----------------------


def test_outputs_that_are_inputs_or_not_directories_are_refused_before_any_work(tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  # A predict file kept where the predictions go.
  predict = _squad(out / "predictions.json")
  mrpc = _glue(tmp_path, "MRPC")
  # A dev file hard-linked as the test results the run would write.
  linked = _glue(tmp_path, "SST-2")
  os.makedirs(tmp_path / "linked_out")
  os.link(linked / "dev.tsv", tmp_path / "linked_out" / "eval_results.txt")
  conll = _conll(tmp_path)
  swag = _swag(tmp_path)
  os.makedirs(tmp_path / "swag_out")
  os.symlink(swag / "val.csv", tmp_path / "swag_out" / "test_results.tsv")
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory\n")
  before = _hashes(tmp_path)
  cases = [
      (["run_squad.py", *_squad_args(f"--output_dir={out}", "--do_predict",
                                     f"--predict_file={predict}")],
       f"--output_dir={out}/predictions.json is the input given by --predict_file={predict}"),
      (["run_classifier.py", *_tiny("--task_name=sst-2", f"--data_dir={linked}",
                                    f"--output_dir={tmp_path / 'linked_out'}", "--do_eval")],
       f"--output_dir={tmp_path / 'linked_out'}/eval_results.txt is the input given by "
       f"--data_dir={linked}/dev.tsv"),
      (["run_swag.py", *_tiny(f"--data_dir={swag}", f"--output_dir={tmp_path / 'swag_out'}",
                              "--do_predict")],
       f"--output_dir={tmp_path / 'swag_out'}/test_results.tsv is the input given by "
       f"--data_dir={swag}/val.csv"),
      (["run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                    f"--output_dir={a_file}", "--do_train")],
       f"--output_dir={a_file}/"),
      (["run_ner.py", *_tiny(f"--data_dir={conll}", f"--output_dir={a_file}/out", "--do_train")],
       f"{a_file} is not a directory"),
  ]
  results = concurrently([functools.partial(_run, *args) for args, _ in cases])
  _assert_messages(cases, results)
  assert _hashes(tmp_path) == before
  assert sorted(os.listdir(out)) == ["predictions.json"]
  assert sorted(os.listdir(tmp_path / "linked_out")) == ["eval_results.txt"]


# --- class 3: an output_dir of another task; cached records tied to their inputs ----------------


def test_output_dir_of_another_task_is_refused_and_records_are_reused_only_when_current(tmp_path):
  mrpc = _glue(tmp_path, "MRPC")
  out = tmp_path / "out"
  first = _ok("run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                         f"--output_dir={out}", "--do_train"))
  assert "Reusing" not in first.stderr
  assert json.loads((out / "task.json").read_text()) == {"task": "run_classifier --task_name=mrpc",
                                                         "labels": ["0", "1"], "text_pairs": True,
                                                         "regression": False,
                                                         "multi_label": False,
                                                         "classifier_pooling": "pooler"}
  key = json.loads((out / "train.tf_record.key.json").read_text())
  assert key["input"][0] == str(mrpc / "train.tsv") and key["max_seq_length"] == 16
  trained = _hashes(out)

  # RTE has two labels too, but other label names; a tsv task with three labels another head.
  rte = _glue(tmp_path, "RTE")
  three = tmp_path / "three"
  three.mkdir()
  rows = (mrpc / "train.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]
  (three / "train.tsv").write_text("".join(f"{r.split(chr(9))[3]}\t{'abc'[i % 3]}\n"
                                           for i, r in enumerate(rows)), encoding="utf-8")
  conll = _conll(tmp_path)
  cases = [
      (["run_classifier.py", *_tiny("--task_name=tsv", f"--data_dir={three}", "--text_a_column=0",
                                    "--label_column=1", "--noskip_header", f"--output_dir={out}",
                                    "--do_train")],
       f"--output_dir={out} holds the model of another task (run_classifier --task_name=mrpc, not "
       "run_classifier --task_name=tsv)"),
      (["run_classifier.py", *_tiny("--task_name=rte", f"--data_dir={rte}", f"--output_dir={out}",
                                    "--do_eval")],
       f"--output_dir={out} holds the model of another task (run_classifier --task_name=mrpc, not "
       "run_classifier --task_name=rte)"),
      # A token classifier has a head of the very shape of the sentence classifier's.
      (["run_ner.py", *_tiny(f"--data_dir={conll}", f"--output_dir={out}", "--do_eval")],
       f"--output_dir={out} holds the model of another task (run_classifier --task_name=mrpc, not "
       "run_ner)"),
  ]
  for args, message in cases:  # one at a time: each must leave `out` as the training left it
    line = _error_line(_run(*args))
    assert message in line, (message, line)
    assert _hashes(out) == trained, args
  # Without the task record (a run of an older version), the checkpoint's shapes tell where they
  # differ: one output unit per choice here, two labels there.
  os.rename(out / "task.json", tmp_path / "task.json")
  line = _error_line(_run("run_swag.py", *_tiny(f"--data_dir={_swag(tmp_path)}",
                                                f"--output_dir={out}", "--do_train")))
  assert re.search(rf"--output_dir={out}|{out}/ckpt-3", line), line
  assert re.search(r"ckpt-3(, a checkpoint of another model| does not fit the model)", line), line
  os.rename(tmp_path / "task.json", out / "task.json")
  assert _hashes(out) == trained

  # The same command again reuses the records; a changed training file rebuilds them.
  again = _ok("run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                         f"--output_dir={out}", "--do_train", "--do_eval"))
  assert f"Reusing {out}/train.tf_record" in again.stderr
  assert _hashes(out / "train.tf_record") == {k: v for k, v in trained.items()
                                              if k.endswith("train.tf_record")}
  _head(os.path.join(DATA, "glue", "MRPC", "train.tsv"), mrpc / "train.tsv", 9)
  changed = _ok("run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                           f"--output_dir={tmp_path / 'out2'}", "--do_train"))
  rebuilt = _ok("run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                           f"--output_dir={out}", "--do_train",
                                           "--num_train_epochs=3"))
  assert "Reusing" not in changed.stderr and f"Reusing {out}/train.tf_record" not in rebuilt.stderr
  assert (out / "train.tf_record").read_bytes() == (tmp_path / "out2" / "train.tf_record"
                                                    ).read_bytes()


# --- class 5 / 6: config against vocab and pairs; flag values -----------------------------------


def test_bad_flag_values_and_configs_are_one_error_line(tmp_path):
  mrpc = _glue(tmp_path, "MRPC", rows=5)
  conll = _conll(tmp_path)
  swag = _swag(tmp_path)
  squad = _squad(tmp_path / "dev.json")
  one_segment = _config(tmp_path / "one_segment.json", type_vocab_size=1)
  small_vocab = _config(tmp_path / "small_vocab.json", vocab_size=10)
  out = tmp_path / "out"
  before = _hashes(tmp_path)
  squad_predict = ["run_squad.py", f"--output_dir={out}", "--do_predict",
                   f"--predict_file={squad}"]
  cases = [
      (squad_predict + _squad_args("--doc_stride=0"),
       "error: flag --doc_stride=0"),
      (squad_predict + _squad_args("--doc_stride=9"),
       "--doc_stride=9 must be below the 9 context tokens of a window (--max_seq_length=16 - "
       "--max_query_length=4 - 3)"),
      (squad_predict + _squad_args("--n_best_size=0"), "flag --n_best_size=0"),
      (squad_predict + _squad_args("--max_answer_length=-1"), "flag --max_answer_length=-1"),
      (squad_predict + _squad_args("--max_query_length=0"), "flag --max_query_length=0"),
      (squad_predict + _squad_args("--max_query_length=13"),
       "--max_seq_length=16 must be greater than --max_query_length=13 + 3"),
      (squad_predict + _squad_args("--null_score_diff_threshold=nan"),
       "--null_score_diff_threshold=nan"),
      (["run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                    f"--output_dir={out}", "--do_train",
                                    "--num_train_epochs=1e30")],
       "--num_train_epochs=1e+30 makes 1e+30 training steps (more than 1e+09)"),
      (squad_predict + _squad_args(f"--bert_config_file={one_segment}"),
       f"{one_segment}: type_vocab_size=1, but SQuAD windows are pairs"),
      (["run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                    f"--output_dir={out}", "--do_train", "--max_seq_length=4")],
       "--max_seq_length=4 cannot hold a sentence pair of --task_name=mrpc: [CLS] a [SEP] b "
       "[SEP] needs 5"),
      (["run_classifier.py", *_tiny("--task_name=sst-2", f"--data_dir={mrpc}",
                                    f"--output_dir={out}", "--do_train", "--max_seq_length=2")],
       "flag --max_seq_length=2"),
      (["run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                    f"--output_dir={out}", "--do_train", "--doc_stride=13")],
       "--doc_stride=13 must be below the 13 text tokens of a window (--max_seq_length=16 - 3 "
       "for [CLS] a [SEP] b [SEP]), or windows would not overlap"),
      (["run_classifier.py", *_tiny("--task_name=sst-2", f"--data_dir={mrpc}",
                                    f"--output_dir={out}", "--do_eval", "--doc_stride=0")],
       "flag --doc_stride=0"),
      (["run_classifier.py", *_tiny("--task_name=tsv", f"--data_dir={mrpc}",
                                    "--text_a_column=#1 String", "--label_column=Quality",
                                    "--labels=0,1,0", f"--output_dir={out}", "--do_train")],
       "--labels: '0' is given twice"),
      (["run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                    f"--output_dir={out}", "--do_train",
                                    f"--bert_config_file={one_segment}")],
       f"{one_segment}: type_vocab_size=1, but --task_name=mrpc gives sentence pairs"),
      (["run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                    f"--output_dir={out}", "--do_train",
                                    f"--bert_config_file={small_vocab}")],
       f"vocab file {TINY_VOCAB} has 15 tokens but {small_vocab} has vocab_size=10"),
      (["run_ner.py", *_tiny(f"--data_dir={conll}", f"--output_dir={out}", "--do_train",
                             "--labels=O,B-PER,I-PER,O")], "--labels: 'O' is given twice"),
      (["run_swag.py", *_tiny(f"--data_dir={swag}", f"--output_dir={out}", "--do_train",
                              "--max_seq_length=4")], "flag --max_seq_length=4"),
      (["run_swag.py", *_tiny(f"--data_dir={swag}", f"--output_dir={out}", "--do_train",
                              f"--bert_config_file={one_segment}")],
       f"{one_segment}: type_vocab_size=1, but SWAG choices are pairs"),
  ]
  results = concurrently([functools.partial(_run, *args) for args, _ in cases])
  _assert_messages(cases, results)
  assert _hashes(tmp_path) == before
  assert not os.path.exists(out)  # nor an empty output_dir left behind


# --- class 8: labels by default, SQuAD 2.0 and repeated ids, nothing to evaluate ----------------


def test_tsv_labels_default_to_the_training_file_then_to_the_trained_model(tmp_path):
  data = tmp_path / "reviews"
  _head(os.path.join(DATA, "glue", "SST-2", "train.tsv"), data / "train.tsv", 13)
  _head(os.path.join(DATA, "glue", "SST-2", "dev.tsv"), data / "dev.tsv", 9)
  dev_only = tmp_path / "dev_only"
  _head(os.path.join(DATA, "glue", "SST-2", "dev.tsv"), dev_only / "dev.tsv", 9)
  columns = ["--task_name=tsv", "--text_a_column=sentence", "--label_column=label"]
  out = tmp_path / "out"
  _ok("run_classifier.py", *_tiny(*columns, f"--data_dir={data}", f"--output_dir={out}",
                                  "--do_train"))
  assert json.loads((out / "task.json").read_text())["labels"] == ["0", "1"]
  before = _hashes(data, dev_only)
  # Evaluating without the training file nor --labels: the labels the model was trained with.
  _ok("run_classifier.py", *_tiny(*columns, f"--data_dir={dev_only}", f"--output_dir={out}",
                                  "--do_eval"))
  assert "eval_examples = 8" in (out / "eval_results.txt").read_text()
  # Neither a training file nor a trained model's labels: a clear error.
  line = _error_line(_run("run_classifier.py", *_tiny(*columns, f"--data_dir={dev_only}",
                                                      f"--output_dir={tmp_path / 'fresh'}",
                                                      "--do_eval")))
  assert (f"give --labels: there is no {dev_only}/train.tsv to read the labels from, nor a "
          "task.json saved by a training run in --output_dir") in line
  assert _hashes(data, dev_only) == before


def test_squad_2_without_the_flag_and_repeated_ids_are_named(tmp_path):
  v2 = _squad(tmp_path / "v2.json", source=V2_DEV, paragraphs=3)

  def repeat(paragraphs):
    paragraphs[1]["qas"][0]["id"] = paragraphs[0]["qas"][1]["id"]

  repeated = _squad(tmp_path / "repeated.json", edit=repeat)
  with open(repeated, encoding="utf-8") as f:
    twice = json.load(f)["data"][0]["paragraphs"][1]["qas"][0]["id"]
  with open(v2, encoding="utf-8") as f:
    impossible = next(qa["id"] for p in json.load(f)["data"][0]["paragraphs"] for qa in p["qas"]
                      if qa.get("is_impossible"))
  before = _hashes(tmp_path)
  out = tmp_path / "out"
  cases = [
      (["--do_predict", f"--predict_file={v2}"],
       rf"^error: {v2}:\d+: question {impossible} is marked is_impossible, a SQuAD 2.0 question: "
       r"pass --version_2_with_negative$"),
      (["--do_train", f"--train_file={v2}"], rf"^error: {v2}:\d+: question {impossible} is "),
      (["--do_predict", f"--predict_file={repeated}"],
       rf"^error: {repeated}:\d+: question id {twice} is repeated \(first at line \d+\); "),
  ]
  for args, pattern in cases:
    line = _error_line(_run("run_squad.py", *_squad_args(f"--output_dir={out}", *args)))
    assert re.search(pattern, line), (pattern, line)
  assert _hashes(tmp_path) == before
  assert not os.path.exists(out)


def test_evaluating_with_no_checkpoint_anywhere_is_an_error(tmp_path):
  mrpc = _glue(tmp_path, "MRPC", rows=5)
  conll = _conll(tmp_path)
  swag = _swag(tmp_path)
  squad = _squad(tmp_path / "dev.json")
  config = f"--bert_config_file={TINY}/bert_config.json"
  common = [f"--vocab_file={TINY_VOCAB}", config, "--max_seq_length=16"]
  cases = [
      ("run_classifier.py", "--task_name=mrpc", f"--data_dir={mrpc}", "--do_eval"),
      ("run_ner.py", f"--data_dir={conll}", "--do_predict"),
      ("run_swag.py", f"--data_dir={swag}", "--do_eval"),
      ("run_squad.py", f"--predict_file={squad}", "--do_predict", "--max_query_length=4",
       "--doc_stride=4"),
  ]
  for i, (script, *args) in enumerate(cases):
    out = tmp_path / f"out{i}"
    line = _error_line(_run(script, *common, *args, f"--output_dir={out}"))
    assert line.startswith(f"error: nothing to evaluate: --output_dir={out} holds no checkpoint"), (
        script, line)
    # Nothing but the lock a run takes on its output_dir.
    assert not os.path.exists(out) or not set(os.listdir(out)) - {".lock"}, os.listdir(out)


def test_a_checkpoint_without_the_task_head_or_with_other_labels_is_not_evaluated(tmp_path):
  """Evaluating from a pre-trained checkpoint (no output layer for the task) would score random
  weights; evaluating from a fine-tuned --init_checkpoint with its labels in another order would
  swap the classes silently; another task's fine-tuned model is refused. Each is one line, and
  nothing is written."""
  mrpc = _glue(tmp_path, "MRPC", rows=5)
  conll = _conll(tmp_path)
  squad = _squad(tmp_path / "dev.json")
  columns = ["--task_name=tsv", f"--data_dir={mrpc}", "--text_a_column=#1 String",
             "--text_b_column=#2 String", "--label_column=Quality",
             f"--bert_config_file={TINY}/bert_config.json"]
  trained = tmp_path / "trained"
  _ok("run_classifier.py", *_tiny(*columns, "--labels=0,1", f"--output_dir={trained}",
                                  "--do_train"))
  before = _hashes(tmp_path)
  out = tmp_path / "out"
  cases = [
      (["run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}", "--do_eval")],
       f"the checkpoint {TINY_CKPT} has no weights for output_bias, output_weights (not trained "
       "for this task"),
      (["run_ner.py", *_tiny(f"--data_dir={conll}", "--do_predict")], "has no weights for "),
      (["run_squad.py", *_squad_args(f"--predict_file={squad}", "--do_predict")],
       "has no weights for cls/squad/"),
      (["run_classifier.py", *_tiny(*columns, "--labels=1,0", f"--init_checkpoint={trained}",
                                    "--do_eval")],
       f"the labels 1,0 differ from 0,1, those the model in --init_checkpoint={trained} was "
       "trained with"),
      (["run_classifier.py", *_tiny("--task_name=mrpc", f"--data_dir={mrpc}",
                                    f"--init_checkpoint={trained}", "--do_eval",
                                    f"--bert_config_file={TINY}/bert_config.json")],
       f"--init_checkpoint={trained} holds the model of another task (run_classifier "
       "--task_name=tsv, not run_classifier --task_name=mrpc)"),
  ]
  results = concurrently([functools.partial(_run, *args, f"--output_dir={out}{i}")
                          for i, (args, _) in enumerate(cases)])
  _assert_messages(cases, results)
  assert _hashes(tmp_path) == before
  # The labels it was trained with evaluate; a batch size far above the 4 dev pairs is cut to
  # what they need (instead of padding 10^8 examples).
  _ok("run_classifier.py", *_tiny(*columns, f"--init_checkpoint={trained}", "--do_eval",
                                  "--eval_batch_size=100000000", f"--output_dir={out}ok"))
  assert "eval_examples = 4" in (tmp_path / "outok" / "eval_results.txt").read_text()


# --- class 8: records byte-identical across processes -------------------------------------------


def test_records_are_byte_identical_across_processes_and_hash_seeds(tmp_path):
  mrpc = _glue(tmp_path, "MRPC")
  conll = _conll(tmp_path)
  swag = _swag(tmp_path)
  squad = _squad(tmp_path / "dev.json")
  runs = [
      ("run_classifier.py", ["--task_name=mrpc", f"--data_dir={mrpc}", "--do_train", "--do_eval",
                             "--do_predict"]),
      ("run_ner.py", [f"--data_dir={conll}", "--do_eval"]),
      ("run_swag.py", [f"--data_dir={swag}", "--do_eval"]),
      ("run_squad.py", [f"--predict_file={squad}", "--do_predict", "--max_query_length=4",
                        "--doc_stride=4"]),
  ]
  before = _hashes(tmp_path)
  for script, args in runs:
    outs = [tmp_path / f"{script}-{seed}" for seed in ("1", "2")]
    if "--do_train" not in args:
      args = [*args, f"--init_checkpoint={_with_head(tmp_path / f'{script}-model', script)}"]
    concurrently([functools.partial(_ok, script, *_tiny(*args, f"--output_dir={out}"),
                                    env=dict(ENV, PYTHONHASHSEED=out.name[-1])) for out in outs])
    records = [{name: (out / name).read_bytes() for name in os.listdir(out)
                if name.endswith(".tf_record")} for out in outs]
    assert records[0] and records[0] == records[1], script
    if script == "run_classifier.py":
      assert set(records[0]) == {"train.tf_record", "eval.tf_record", "predict.tf_record"}
  assert {k: v for k, v in _hashes(tmp_path).items() if k in before} == before


# --- round 4, classes 2 / 3: thresholds and labels read from files and flags ---------------------


def _goemotions(tmp_path, name="go", labels=None, rows=(24, 16, 12)):
  """Real GoEmotions rows (their first lines) with its labels.txt, or `labels` instead."""
  directory = tmp_path / name
  for split, count in zip(("train", "dev", "test"), rows):
    _head(os.path.join(DATA, "goemotions", f"{split}.tsv"), directory / f"{split}.tsv", count)
  if labels is None:
    _head(os.path.join(DATA, "goemotions", "labels.txt"), directory / "labels.txt", 28)
  else:
    (directory / "labels.txt").write_text("".join(f"{l}\n" for l in labels), encoding="utf-8")
  return directory


def _edited(source, target, name, edit):
  """A copy of the folder `source` whose JSON file `name` went through `edit(record)`."""
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(source, target)
  path = target / name
  record = json.loads(path.read_text(encoding="utf-8"))
  edit(record)
  path.write_text(json.dumps(record), encoding="utf-8")
  return target


def test_thresholds_and_label_names_from_files_and_flags_are_checked(tmp_path):
  """A multi-label model's decision thresholds, wherever they are read (thresholds.json for
  --do_predict --tune_thresholds and for export, a LiteRT model's description, --threshold), are
  numbers strictly between 0 and 1, one per label; a LiteRT classifier's model must compute the
  labels its description names; label names must not hold the label delimiter; GoEmotions label
  ids are ASCII digits; flags that only the tsv/csv tasks read are refused elsewhere. Each is
  one line naming the file or flag, and nothing is written."""
  go = _goemotions(tmp_path)
  labels = [l.strip() for l in (go / "labels.txt").read_text().splitlines()]
  run = tmp_path / "run"
  common = [f"--vocab_file={TINY_VOCAB}", "--max_seq_length=16", "--predict_batch_size=4",
            "--eval_batch_size=4"]
  _ok("run_classifier.py", "--task_name=goemotions", f"--data_dir={go}", *common,
      f"--init_checkpoint={TINY_CKPT}", f"--output_dir={run}", "--do_train", "--do_eval",
      "--tune_thresholds", "--train_batch_size=8", "--num_train_epochs=1")
  litert_dir = tmp_path / "litert"
  _ok("export_model.py", "--format=litert", "--model_type=classifier",
      f"--init_checkpoint={run}", f"--export_dir={litert_dir}", "--max_seq_length=16")
  encoder = tmp_path / "encoder"
  _ok("export_model.py", "--format=litert", f"--init_checkpoint={run}",
      f"--export_dir={encoder}", "--max_seq_length=16")

  def thresholds_file(name, edit):
    return _edited(run, tmp_path / name, "thresholds.json", edit)

  def set_threshold(value):
    return lambda record: record["thresholds"].update({labels[3]: value})

  def info(name, edit):
    return _edited(litert_dir, tmp_path / name, "litert_model.json", edit)

  def info_set(key, value):
    return lambda record: record.update({key: value})

  bad_runs = {
      "nan": (set_threshold(float("nan")), f"the threshold of label '{labels[3]}' is nan, not a "
                                           "number"),
      "string": (set_threshold("0.3"), f"the threshold of label '{labels[3]}' is '0.3', not a "
                                       "number"),
      "above": (set_threshold(1.5), f"the threshold of label '{labels[3]}' is 1.5: the label "
                                    "would be predicted for no example"),
      "zero": (set_threshold(0), f"the threshold of label '{labels[3]}' is 0: the label would be "
                                 "predicted for every example"),
      "few": (lambda record: record["thresholds"].pop(labels[0]),
              f"not the thresholds of these labels (none for '{labels[0]}')"),
      "step": (lambda record: record.update(global_step="30"), "not a thresholds file"),
  }
  # A LiteRT classifier whose model.tflite is an encoder's, and one whose description and data
  # name 27 labels while its model computes 28.
  swapped = info("swapped", lambda record: None)
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copy(encoder / "model.tflite", swapped / "model.tflite")
  swapped_info = json.loads((swapped / "litert_model.json").read_text())
  swapped_info["model_sha256"] = json.loads(
      (encoder / "litert_model.json").read_text())["model_sha256"]
  (swapped / "litert_model.json").write_text(json.dumps(swapped_info))
  fewer = info("fewer", lambda record: record.update(labels=record["labels"][:27],
                                                     thresholds=record["thresholds"][:27]))
  go27 = _goemotions(tmp_path, "go27", labels=labels[:27])
  lines = (go27 / "test.tsv").read_text().splitlines(keepends=True)
  (go27 / "test.tsv").write_text("".join(l for l in lines if "27" not in l.split("\t")[1]))
  bad_litert = {
      "strings": (info_set("thresholds", ["0.5"] * 28),
                  f"the threshold of label '{labels[0]}' is '0.5', not a number"),
      "nan": (info_set("thresholds", [float("nan")] * 28),
              f"the threshold of label '{labels[0]}' is nan, not a number"),
      "short": (info_set("thresholds", [0.5] * 3), "3 thresholds for 28 labels"),
      "labels": (info_set("labels", "admiration"), "not a LiteRT model description: labels is "
                                                   "'admiration', not a list of label names"),
      "flag": (info_set("multi_label", "yes"), "not a LiteRT model description: multi_label is "
                                               "'yes', not true or false"),
  }
  _write_rows = lambda path, text: (path.parent.mkdir(parents=True, exist_ok=True),
                                    path.write_text(text, encoding="utf-8"))
  superscript = _goemotions(tmp_path, "superscript")
  with open(superscript / "dev.tsv", "a", encoding="utf-8") as f:
    f.write("a squared comment\t\u00b2\teeeeeee\n")
  comma = _goemotions(tmp_path, "comma", labels=labels[:27] + ["neutral,calm"])
  tags = tmp_path / "tags"
  _write_rows(tags / "train.tsv", "text\ttags\nred apple\tfruit;red\nsky\t\n")
  _write_rows(tags / "dev.tsv", "text\ttags\nplum\tfruit\n")
  def predict(data, *flags):
    litert_model = any(flag.startswith("--litert_model=") for flag in flags)
    return ["run_classifier.py", "--task_name=goemotions", f"--data_dir={data}",
            *(common[1:] if litert_model else common), *flags]

  cases = [
      *[(predict(go, f"--init_checkpoint={thresholds_file(name, edit)}", "--do_predict",
                 "--tune_thresholds"),
         f"{tmp_path / name / 'thresholds.json'}: {message}")
        for name, edit_message in bad_runs.items() for edit, message in [edit_message]],
      (["export_model.py", "--model_type=classifier", f"--init_checkpoint={tmp_path / 'nan'}",
        "--max_seq_length=16"],
       f"{tmp_path / 'nan' / 'thresholds.json'}: the threshold of label"),
      *[(predict(go, f"--litert_model={info(f'litert_{name}', edit)}", "--do_predict"),
         f"{tmp_path / f'litert_{name}' / 'litert_model.json'}: {message}")
        for name, (edit, message) in bad_litert.items()],
      (predict(go, f"--litert_model={swapped}", "--do_predict"),
       f"--litert_model={swapped}: its model.tflite computes only "),
      (predict(go27, f"--litert_model={fewer}", "--do_predict"),
       f"--litert_model={fewer}: its model.tflite computes logits for 28 labels, not the 27 "
       "labels of its description"),
      (predict(go, f"--init_checkpoint={run}", "--do_predict", "--threshold=0"),
       "--threshold=0 would predict every label for every example"),
      (predict(go, f"--init_checkpoint={run}", "--do_predict", "--threshold=1"),
       "--threshold=1 would predict no label for every example"),
      (predict(go, f"--init_checkpoint={run}", "--do_predict", "--labels=joy,anger"),
       "--labels is for --task_name=tsv or csv (your own files); --task_name=goemotions reads "
       "its own columns and labels"),
      (["run_classifier.py", "--task_name=mrpc", f"--data_dir={go}", *common,
        f"--init_checkpoint={TINY_CKPT}", "--do_train", "--text_a_column=text"],
       "--text_a_column is for --task_name=tsv or csv"),
      (predict(superscript, f"--init_checkpoint={run}", "--do_eval"),
       f"{superscript / 'dev.tsv'}:17: label ids '\u00b2' are not numbers below 28"),
      (predict(comma, f"--init_checkpoint={TINY_CKPT}", "--do_train", "--train_batch_size=8"),
       f"the label 'neutral,calm' (of {comma / 'labels.txt'}) holds ','"),
      (["run_classifier.py", "--task_name=tsv", f"--data_dir={tags}", "--text_a_column=text",
        "--label_column=tags", "--multi_label", "--label_delimiter=;", "--labels=fruit;red,sky",
        *common, f"--init_checkpoint={TINY_CKPT}", "--do_train", "--train_batch_size=8"],
       "the label 'fruit;red' (of --labels) holds ';'"),
  ]
  before = _hashes(tmp_path)
  out = tmp_path / "out"
  results = concurrently([functools.partial(_run, *args, f"--output_dir={out}{i}")
                          if args[0] == "run_classifier.py" else
                          functools.partial(_run, *args, f"--export_dir={out}{i}")
                          for i, (args, _) in enumerate(cases)])
  _assert_messages(cases, results)
  assert _hashes(tmp_path) == before
  assert not any(name.startswith("out") for name in os.listdir(tmp_path))
  # The thresholds of this run, and a threshold strictly inside (0, 1), still predict.
  _ok(*predict(go, f"--init_checkpoint={run}", "--do_predict", "--tune_thresholds",
               f"--output_dir={out}ok"))
  _ok(*predict(go, f"--litert_model={litert_dir}", "--do_predict", "--threshold=0.01",
               f"--output_dir={out}ok2"))
  # Evaluating with a LiteRT model (no Trainer) into the folder of a training run in progress is
  # refused as a second Trainer would be: the run's .lock, held here as the training holds it.
  import fcntl  # pylint: disable=g-import-not-at-top
  with open(run / ".lock", "a+", encoding="utf-8") as held:
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    before = _hashes(run)
    line = _error_line(_run(*predict(go, f"--litert_model={litert_dir}", "--do_eval",
                                     f"--output_dir={run}")))
    assert line.startswith(f"error: --output_dir={run} is in use by another run"), line
    assert _hashes(run) == before
