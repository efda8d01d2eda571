"""run_ner.py on the real CoNLL-2003 files: sentences, first-piece labels, windows, and a short
fine-tune of a real checkpoint that tags entities well above chance."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import (SHARED, import_script, minilm_dir, requires_shared, run_script,
                      run_workers)

from bert_tf2 import fileio
from bert_tf2 import fine_tuning
from bert_tf2 import metrics


run_ner = import_script("run_ner")

CONLL = os.path.join(SHARED, "data", "conll2003")


@pytest.fixture(scope="module")
def dev():
  return run_ner.ConllProcessor().get_dev_examples(CONLL)


@requires_shared
def test_reads_sentences_and_skips_docstart():
  processor = run_ner.ConllProcessor()
  train = processor.get_train_examples(CONLL)
  test = processor.get_test_examples(CONLL)
  dev = processor.get_dev_examples(CONLL)
  assert (len(train), len(dev), len(test)) == (14041, 3250, 3453)
  # The file starts with -DOCSTART- and a blank line; the first sentence follows.
  assert train[0].words == ["EU", "rejects", "German", "call", "to", "boycott", "British",
                            "lamb", "."]
  assert train[0].labels == ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]
  assert train[0].line == 3
  assert train[1].words == ["Peter", "Blackburn"] and train[1].labels == ["B-PER", "I-PER"]
  assert not any("-DOCSTART-" in e.words for e in train + dev + test)
  assert sum(len(e.words) for e in dev) == 51362
  tags = {t for e in train for t in e.labels}
  assert tags == set(run_ner.CONLL2003_LABELS)


def test_missing_tag_and_unknown_tag_name_file_and_line(tmp_path):
  path = tmp_path / "train.txt"
  path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP\n", encoding="utf-8")
  with pytest.raises(fileio.InputError, match=f"{path}:4: expected 4 columns.*missing tag"):
    run_ner.read_conll_examples(str(path), "train")
  path.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP B-ACTION\n", encoding="utf-8")
  with pytest.raises(fileio.InputError, match=f"{path}:2: unknown tag 'B-ACTION'"):
    run_ner.read_conll_examples(str(path), "train")
  # With a custom label set the same tag is fine.
  examples = run_ner.read_conll_examples(str(path), "train", labels=["O", "B-ORG", "B-ACTION"])
  assert examples[0].labels == ["B-ORG", "B-ACTION"]


@requires_shared
def test_labels_on_first_sub_tokens(tokenizer, dev):
  labels = run_ner.CONLL2003_LABELS
  features = run_ner.convert_examples_to_features(dev, labels, 128, tokenizer)
  # A few dev sentences are longer than 126 word pieces and take a second sequence.
  assert len(features) == 3253
  for feature in features[:300]:
    example = dev[feature.example_index]
    weights = np.array(feature.label_weights)
    assert weights.sum() == len(feature.word_positions)
    assert np.flatnonzero(weights).tolist() == feature.word_positions
    for offset, position in enumerate(feature.word_positions):
      word = example.words[feature.word_start + offset]
      pieces = tokenizer.tokenize(word) or ["[UNK]"]
      assert tokenizer.convert_ids_to_tokens([feature.input_ids[position]]) == pieces[:1]
      assert labels[feature.label_ids[position]] == example.labels[feature.word_start + offset]
  # Every word of every sentence gets exactly one labelled position overall.
  assert sum(len(f.word_positions) for f in features) == 51362
  predicted = run_ner.word_predictions(dev, features, [f.label_ids for f in features], labels)
  assert predicted == [e.labels for e in dev]
  result = metrics.conll_evaluate([e.labels for e in dev], predicted)
  assert result["f1"] == 1.0 and result["counts"].found_correct == 5942


@requires_shared
def test_long_sentences_split_at_word_boundaries(tokenizer, dev):
  labels = run_ner.CONLL2003_LABELS
  longest = max(dev, key=lambda e: len(e.words))
  features = run_ner.convert_examples_to_features([longest], labels, 16, tokenizer)
  assert len(features) > 1
  assert [f.word_start for f in features][0] == 0
  for feature, following in zip(features, features[1:]):
    assert following.word_start == feature.word_start + len(feature.word_positions)
    assert sum(feature.input_mask) <= 16
  assert features[-1].word_start + len(features[-1].word_positions) == len(longest.words)
  # Shifting each prediction by one tag shows the words are mapped back in order.
  shifted = [[(i + 1) % len(labels) if w else 0 for i, w in zip(f.label_ids, f.label_weights)]
             for f in features]
  predicted = run_ner.word_predictions([longest], features, shifted, labels)[0]
  assert predicted == [labels[(labels.index(t) + 1) % len(labels)] for t in longest.labels]


@requires_shared
def test_tfrecord_round_trip(tokenizer, dev, tmp_path):
  output = str(tmp_path / "dev.tf_record")
  features = run_ner.file_based_convert_examples_to_features(dev[:40], run_ner.CONLL2003_LABELS,
                                                             64, tokenizer, output)
  input_fn = fine_tuning.input_fn_builder(output, run_ner.feature_spec(64), False, False)
  batch = next(iter(input_fn(batch_size=len(features))))
  assert set(batch) == {"input_ids", "input_mask", "segment_ids", "label_ids", "label_weights"}
  assert batch["label_ids"].dtype == tf.int32 and batch["label_weights"].dtype == tf.float32
  np.testing.assert_array_equal(batch["label_ids"].numpy(), [f.label_ids for f in features])
  np.testing.assert_array_equal(batch["label_weights"].numpy(), [f.label_weights for f in features])
  out = tmp_path / "predictions.txt"
  run_ner.write_conll_predictions(str(out), dev[:2], [e.labels for e in dev[:2]])
  lines = out.read_text(encoding="utf-8").splitlines()
  assert lines[0] == f"{dev[0].words[0]} {dev[0].labels[0]} {dev[0].labels[0]}"
  assert lines[len(dev[0].words)] == ""


def _conll_slice(source, target, sentences):
  """The first `sentences` sentences of a CoNLL file (with its -DOCSTART- lines), as a file."""
  kept, count, in_sentence = [], 0, False
  with open(source, encoding="utf-8") as f:
    for line in f:
      if not line.strip():
        if in_sentence:
          count += 1
          in_sentence = False
          if count == sentences:
            kept.append(line)
            break
      elif not line.startswith("-DOCSTART-"):
        in_sentence = True
      kept.append(line)
  target.write_text("".join(kept), encoding="utf-8")


def _training_slice(tmp_path):
  """A CoNLL directory of the first 1200 training, 400 validation and 50 test sentences."""
  data_dir = tmp_path / "conll"
  data_dir.mkdir()
  for name, sentences in (("train.txt", 1200), ("valid.txt", 400), ("test.txt", 50)):
    _conll_slice(os.path.join(CONLL, name), data_dir / name, sentences)
  return data_dir


def _eval_results(path):
  with open(path, encoding="utf-8") as f:
    return {k: float(v) for k, v in (line.split(" = ") for line in f.read().splitlines())}


@requires_shared
def test_fine_tune_minilm_on_a_conll_slice(tmp_path):
  """Two epochs over the first 1200 training sentences (75 steps of 32, 48-token sequences), then
  the first 400 validation sentences (704 entities) and 50 test sentences. Chance finds next to
  no complete entity (one counts only when its type and both boundaries match): all-O scores
  F1 0, and an untrained model's tags scored F1 0.05 in a trial. Measured with the packaged
  MiniLM (6 layers, uncased; ~120 CPU-seconds): dev F1 0.52 on 2026-11-25 (the same at the
  session's first commit; an earlier session recorded 0.715). The bar is F1 0.5 on both: close
  to the measured figure, so a change that costs entity F1 shows here."""
  model_dir = minilm_dir()
  data_dir = _training_slice(tmp_path)
  output_dir = tmp_path / "out"
  result = run_script(
      ["run_ner.py", f"--data_dir={data_dir}", f"--output_dir={output_dir}",
       f"--init_checkpoint={model_dir}", f"--vocab_file={model_dir}/vocab.txt",
       "--do_train", "--do_eval", "--do_predict", "--max_seq_length=48",
       "--train_batch_size=32", "--eval_batch_size=64", "--predict_batch_size=16",
       "--learning_rate=1e-4", "--num_train_epochs=2", "--iterations_per_loop=20"],
      timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  scores = _eval_results(output_dir / "eval_results.txt")
  assert scores["global_step"] == 75
  assert scores["eval_examples"] == 400
  assert scores["eval_f1"] >= 0.5, scores
  assert 0 < scores["eval_loss"] < 0.5
  # test_predictions.txt: `word gold predicted` for every word, a blank line after each sentence.
  test = run_ner.ConllProcessor().get_test_examples(str(data_dir))
  lines = (output_dir / "test_predictions.txt").read_text(encoding="utf-8").splitlines()
  assert len(lines) == sum(len(e.words) + 1 for e in test)
  rows = [line.split(" ") for line in lines if line]
  assert [r[0] for r in rows] == [w for e in test for w in e.words]
  assert [r[1] for r in rows] == [t for e in test for t in e.labels]
  assert {r[2] for r in rows} <= set(run_ner.CONLL2003_LABELS)
  predicted = [[]]
  for line in lines:
    if line:
      predicted[-1].append(line.split(" ")[2])
    else:
      predicted.append([])
  assert metrics.conll_evaluate([e.labels for e in test], predicted[:-1])["f1"] >= 0.5

  # The same model's evaluation and tags from two multi_worker_mirrored workers (each tags every
  # other sentence, batches cut to different lengths; the chief writes): the same files.
  workers_dir = tmp_path / "workers"
  workers_dir.mkdir()
  for name in os.listdir(output_dir):
    if name.startswith(("ckpt-", "checkpoint", "task.json")):
      shutil.copy(output_dir / name, workers_dir / name)
  run_workers(["run_ner.py", f"--data_dir={data_dir}", f"--output_dir={workers_dir}",
               f"--init_checkpoint={model_dir}", f"--vocab_file={model_dir}/vocab.txt",
               "--do_eval", "--do_predict", "--max_seq_length=48", "--eval_batch_size=64",
               "--predict_batch_size=16", "--distribution_strategy=multi_worker_mirrored"])
  assert ((workers_dir / "test_predictions.txt").read_text(encoding="utf-8")
          == (output_dir / "test_predictions.txt").read_text(encoding="utf-8"))
  workers_scores = _eval_results(workers_dir / "eval_results.txt")
  assert workers_scores.keys() == scores.keys()
  for k, v in scores.items():
    assert abs(workers_scores[k] - v) < 1e-5, k


@requires_shared
def test_fine_tunes_from_an_exported_encoder(tmp_path):
  """The same slice and bar as above, but the encoder comes from an export_model.py SavedModel of
  the MiniLM checkpoint (--hub_module_handle, no --vocab_file or --init_checkpoint): it must carry
  the pre-trained weights, vocab and casing, since a randomly initialised encoder tags next to no
  entity after 75 steps."""
  from bert_tf2 import export_model  # pylint: disable=g-import-not-at-top
  encoder = export_model.export("encoder", str(tmp_path / "encoder"),
                                init_checkpoint=minilm_dir(), do_lower_case=True)
  data_dir = _training_slice(tmp_path)
  output_dir = tmp_path / "out"
  result = run_script(
      ["run_ner.py", f"--data_dir={data_dir}", f"--output_dir={output_dir}",
       f"--hub_module_handle={encoder}", "--do_train", "--do_eval", "--max_seq_length=48",
       "--train_batch_size=32", "--eval_batch_size=64", "--learning_rate=1e-4",
       "--num_train_epochs=2", "--iterations_per_loop=20"],
      timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  scores = _eval_results(output_dir / "eval_results.txt")
  assert scores["global_step"] == 75 and scores["eval_examples"] == 400
  assert scores["eval_f1"] >= 0.5, scores


def test_missing_flag_is_one_line_error(tmp_path):
  result = run_script(["run_ner.py", "--do_train", "--vocab_file=v", f"--output_dir={tmp_path}"],
                      timeout=300)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == "error: --data_dir is required"
