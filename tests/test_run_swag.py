"""run_swag.py on a small SWAG-format CSV (no SWAG data is shipped): reading, four-choice
features, and fine-tuning a real checkpoint until it has learned the rows."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import ENV, ROOT, import_script, minilm_dir, requires_shared, run_process

from bert_tf2 import fileio
from bert_tf2 import fine_tuning


run_swag = import_script("run_swag")


# SWAG's layout: an unnamed index column, then video-id, fold-ind, startphrase, sent1, sent2,
# gold-source, four endings and the label. Fields with commas or quotes are quoted.
HEADER = (",video-id,fold-ind,startphrase,sent1,sent2,gold-source,"
          "ending0,ending1,ending2,ending3,label\n")
ROWS = [
    '0,anetv_a1b2c3d4e5f,4821,"A man is standing on a ladder next to a house. He",'
    '"A man is standing on a ladder next to a house.",He,gold,'
    'scrapes old paint off the window frame.,jumps into the swimming pool below.,'
    '"eats a sandwich, then falls asleep.",drives the ladder down the street.,0\n',
    '1,lsmdc3005_PARIS-12345,17302,"Someone closes the door behind her. She",'
    '"Someone closes the door behind her.",She,gen,'
    '"turns on the lamp and looks around the room.",flies out through the chimney.,'
    '"pours the door into a cup.","says ""hello"" to the empty hallway.",3\n',
    '2,anetv_zz9yy8xx7ww,88,A girl holds a hula hoop around her waist. She,'
    'A girl holds a hula hoop around her waist.,She,gold,'
    'spins it around her hips several times.,throws the hoop into the lake and dives.,'
    'paints the hoop with a toothbrush.,reads a newspaper upside down.,0\n',
]


@pytest.fixture
def swag_dir(tmp_path):
  (tmp_path / "train.csv").write_text(HEADER + "".join(ROWS), encoding="utf-8")
  (tmp_path / "val.csv").write_text(HEADER + ROWS[1], encoding="utf-8")
  test_header = HEADER.replace(",label\n", "\n")
  test_rows = [row[:row.rstrip("\n").rfind(",")] + "\n" for row in ROWS[:2]]
  (tmp_path / "test.csv").write_text(test_header + "".join(test_rows), encoding="utf-8")
  return tmp_path


def test_reads_swag_rows(swag_dir):
  processor = run_swag.SwagProcessor()
  train = processor.get_train_examples(str(swag_dir))
  assert len(train) == 3 and len(processor.get_dev_examples(str(swag_dir))) == 1
  first = train[0]
  assert first.swag_id == "4821"
  assert first.context_sentence == "A man is standing on a ladder next to a house."
  assert first.start_ending == "He"
  assert first.endings[2] == "eats a sandwich, then falls asleep."
  assert first.label == 0
  assert train[1].endings[3] == 'says "hello" to the empty hallway.' and train[1].label == 3
  test = processor.get_test_examples(str(swag_dir))
  assert [e.label for e in test] == [None, None]


@requires_shared
def test_four_choice_features(swag_dir, tokenizer, tmp_path):
  example = run_swag.SwagProcessor().get_train_examples(str(swag_dir))[0]
  feature = run_swag.convert_single_example(0, example, 32, tokenizer)
  assert len(feature.input_ids) == run_swag.NUM_CHOICES and feature.label == 0
  context = tokenizer.tokenize(example.context_sentence)
  for choice, ending in enumerate(example.endings):
    second = tokenizer.tokenize(example.start_ending) + tokenizer.tokenize(ending)
    tokens = ["[CLS]"] + context + ["[SEP]"] + second + ["[SEP]"]
    assert len(tokens) <= 32
    ids = feature.input_ids[choice]
    assert ids[:len(tokens)] == tokenizer.convert_tokens_to_ids(tokens)
    assert ids[len(tokens):] == [0] * (32 - len(tokens))
    assert feature.segment_ids[choice][:len(tokens)] == [0] * (len(context) + 2) + [1] * (
        len(second) + 1)
    assert sum(feature.input_mask[choice]) == len(tokens)

  # Truncation: each choice trims the longer of context and ending to fit.
  short = run_swag.convert_single_example(0, example, 12, tokenizer)
  for choice in range(4):
    assert sum(short.input_mask[choice]) == 12
    assert tokenizer.convert_ids_to_tokens(short.input_ids[choice][:1]) == ["[CLS]"]

  output = str(tmp_path / "train.tf_record")
  examples = run_swag.SwagProcessor().get_train_examples(str(swag_dir))
  assert run_swag.file_based_convert_examples_to_features(examples, 32, tokenizer, output) == 3
  input_fn = fine_tuning.input_fn_builder(output, run_swag.feature_spec(32), False, False)
  batch = next(iter(input_fn(batch_size=3)))
  assert batch["input_ids"].shape == (3, 4, 32) and batch["input_ids"].dtype == tf.int32
  np.testing.assert_array_equal(batch["input_ids"].numpy()[0], feature.input_ids)
  np.testing.assert_array_equal(batch["label_ids"].numpy(), [0, 3, 0])


def test_malformed_swag_rows_name_file_and_line(tmp_path):
  path = tmp_path / "train.csv"
  path.write_text(HEADER + ROWS[0] + ROWS[1].replace(",3\n", ",4\n"), encoding="utf-8")
  with pytest.raises(fileio.InputError, match=f"{path}:3: label '4' is not a choice 0 to 3"):
    run_swag.read_swag_examples(str(path))
  path.write_text(HEADER + "0,vid,1,start,sent1,sent2,gold,a,b,c\n", encoding="utf-8")
  with pytest.raises(fileio.InputError, match=f"{path}:2: expected 12 fields"):
    run_swag.read_swag_examples(str(path))
  path.write_text("sent1,sent2,ending0\n", encoding="utf-8")
  with pytest.raises(fileio.InputError, match="no column ending1"):
    run_swag.read_swag_examples(str(path))


def _eval_results(path):
  with open(path, encoding="utf-8") as f:
    return {k: float(v) for k, v in (line.split(" = ") for line in f.read().splitlines())}


@requires_shared
def test_fine_tune_overfits_three_situations(tmp_path):
  """30 steps on the three fixture rows with the packaged MiniLM: the model learns them (accuracy
  1.0 on the same rows, loss far below a uniform guess's ln 4 = 1.386), the test rows (the same
  situations, no label) get those choices, and an eval-only rerun restores the checkpoint and
  gives the same numbers. Eval and predict batches do not divide the row counts: padding rows
  must not count."""
  model_dir = minilm_dir()
  data_dir = tmp_path / "swag"
  data_dir.mkdir()
  (data_dir / "train.csv").write_text(HEADER + "".join(ROWS), encoding="utf-8")
  (data_dir / "val.csv").write_text(HEADER + "".join(ROWS), encoding="utf-8")
  test_header = HEADER.replace(",label\n", "\n")
  (data_dir / "test.csv").write_text(
      test_header + "".join(row[:row.rstrip("\n").rfind(",")] + "\n" for row in ROWS[:2]),
      encoding="utf-8")
  output_dir = tmp_path / "out"
  common = [sys.executable, "run_swag.py", f"--data_dir={data_dir}", f"--output_dir={output_dir}",
            f"--init_checkpoint={model_dir}", f"--vocab_file={model_dir}/vocab.txt",
            "--max_seq_length=32", "--eval_batch_size=2", "--predict_batch_size=4"]
  result = run_process(
      common + ["--do_train", "--do_eval", "--do_predict", "--train_batch_size=3",
                "--num_train_epochs=30", "--learning_rate=1e-4", "--warmup_proportion=0.1",
                # Calibrated on the original's optimizer, whose uncorrected first steps are
                # several times larger: 30 steps of the bias-corrected default reach 0.36.
                "--optimizer=adam_weight_decay",
                "--iterations_per_loop=10"],
      cwd=ROOT, env=ENV, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  scores = _eval_results(output_dir / "eval_results.txt")
  assert scores["global_step"] == 30 and scores["eval_examples"] == 3
  assert scores["eval_accuracy"] == 1.0
  assert scores["eval_loss"] < 0.3, scores
  rows = [[float(x) for x in line.split("\t")]
          for line in (output_dir / "test_results.tsv").read_text().splitlines()]
  assert len(rows) == 2 and all(len(r) == 4 and abs(sum(r) - 1) < 1e-5 for r in rows)
  assert [int(np.argmax(r)) for r in rows] == [0, 3]

  (output_dir / "eval_results.txt").unlink()
  result = run_process(common + ["--do_eval"], cwd=ROOT, env=ENV, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  again = _eval_results(output_dir / "eval_results.txt")
  assert again["global_step"] == 30
  assert again["eval_loss"] == pytest.approx(scores["eval_loss"], rel=1e-5)


def test_missing_flag_is_one_line_error(tmp_path):
  result = run_process([sys.executable, "run_swag.py", "--do_eval", f"--data_dir={tmp_path}",
                        f"--output_dir={tmp_path}"], cwd=ROOT, env=ENV, timeout=300)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == "error: --vocab_file is required"
