"""build_vocab.py: a WordPiece vocab learned from the real corpus covers held-out text and a tiny
model pre-trains with it; a SentencePiece model loads into FullTokenizer."""

import collections
import json
import math
import os

import pytest

from conftest import SHARED, requires_shared, run_ok, run_script
from bert_tf2 import build_vocab
from bert_tf2 import fileio
from bert_tf2 import tokenization

CORPUS = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")


def _documents():
  documents, current = [], []
  for _, line in fileio.read_lines(CORPUS):
    if line.strip():
      current.append(line)
    elif current:
      documents.append(current)
      current = []
  return documents + ([current] if current else [])


@pytest.fixture(scope="module")
def split(tmp_path_factory):
  """The first 50 WikiText-2 documents to learn from (in the pre-training format), the other 10
  held out."""
  documents = _documents()
  assert len(documents) == 60
  path = tmp_path_factory.mktemp("corpus") / "train.txt"
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join("\n".join(d) + "\n" for d in documents[:50]))
  return str(path), [line for d in documents[50:] for line in d]


@pytest.fixture(scope="module")
def wordpiece(split, tmp_path_factory):
  out = tmp_path_factory.mktemp("vocab")
  result = run_ok(["build_vocab.py", f"--input_file={split[0]}", f"--output_dir={out}",
                 "--vocab_size=4000", "--num_unused=3"])
  assert "WordPiece vocab:" in result.stdout
  return str(out / "vocab.txt")


@requires_shared
def test_wordpiece_vocab_covers_held_out_text(wordpiece, split):
  with open(wordpiece, encoding="utf-8") as f:
    tokens = f.read().split("\n")[:-1]
  assert len(tokens) == 4000 == len(set(tokens))
  assert tokens[:8] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]",
                        "[unused2]"]
  assert "##s" in tokens and "the" in tokens and all(" " not in t and t for t in tokens)
  tokenizer = tokenization.FullTokenizer(wordpiece, do_lower_case=True)
  rate, pieces_per_word = build_vocab.unk_rate(tokenizer, split[1])
  # Measured: 0.04% of the 10 held-out documents' words (one character never seen in training),
  # 1.31 pieces per word.
  assert rate < 0.002 and pieces_per_word < 1.5
  # Every character of the training text is in the vocab alone and as a continuation.
  training_chars = {c for word in build_vocab.count_words(
      build_vocab.read_sentences([split[0]]), True) for c in word}
  assert all(c in tokenizer.vocab and "##" + c in tokenizer.vocab for c in training_chars)


@requires_shared
def test_word_counts_are_basic_tokenizer_words(split):
  sentences = list(build_vocab.read_sentences([split[0]]))
  for lower in (True, False):
    basic = tokenization.BasicTokenizer(do_lower_case=lower)
    expected = collections.Counter(w for s in sentences[:3000] for w in basic.tokenize(s))
    assert build_vocab.count_words(sentences[:3000], lower) == expected


def _records_and_config(text, vocab, tmp_path, vocab_size, name="records"):
  """Pre-training records of `text` at seq 64 with `vocab`, and a tiny BERT config for them."""
  records = tmp_path / f"{name}.tfrecord"
  run_ok(["create_pretraining_data.py", f"--input_file={text}", f"--output_file={records}",
          f"--vocab_file={vocab}", "--max_seq_length=64", "--max_predictions_per_seq=10",
          "--dupe_factor=1", "--num_workers=1"])
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64,
                                    max_position_embeddings=64, type_vocab_size=2)))
  return records, config


@requires_shared
def test_tiny_model_pretrains_with_the_learned_vocab(wordpiece, split, tmp_path):
  records, config = _records_and_config(split[0], wordpiece, tmp_path, 4000)
  out = tmp_path / "pretrain"
  run_ok(["run_pretraining.py", f"--input_file={records}", f"--output_dir={out}",
        f"--bert_config_file={config}", "--max_seq_length=64", "--max_predictions_per_seq=10",
        "--do_train", "--do_eval", "--train_batch_size=32", "--eval_batch_size=32",
        "--num_train_steps=60", "--num_warmup_steps=5", "--learning_rate=2e-3",
        "--max_eval_steps=5", "--iterations_per_loop=20", "--save_checkpoints_steps=60"])
  results = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().split("\n")
                 if line)
  assert int(results["global_step"]) == 60
  # Untrained, the masked-LM loss is about ln(4000) = 8.3; 60 steps learn the frequent tokens.
  assert float(results["masked_lm_loss"]) < math.log(4000) - 1.0


@requires_shared
def test_sentencepiece_model_loads_into_full_tokenizer(split, tmp_path):
  path = build_vocab.build_sentencepiece([split[0]], str(tmp_path), vocab_size=2000)
  assert sorted(os.listdir(tmp_path)) == ["spm.model", "spm.vocab"]
  tokenizer = tokenization.FullTokenizer(None, do_lower_case=True, spm_model_file=path)
  assert [tokenizer.vocab[t] for t in tokenization.SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
  pieces = [p for line in split[1] for p in tokenizer.tokenize(line)]
  ids = tokenizer.convert_tokens_to_ids(pieces)
  assert ids.count(1) / len(ids) < 0.002
  assert "".join(tokenizer.tokenize("The Lobster")).replace("\u2581", " ").strip() == "the lobster"


@requires_shared
def test_sentencepiece_model_from_build_vocab_runs_through_the_scripts(split, tmp_path):
  """The SentencePiece model build_vocab.py writes is a --vocab_file for every script (it was
  usable by none): its records hold its pieces' ids, a tiny model pre-trains on them, and
  extract_features reads that model with it; export_model, which builds WordPiece into the
  graph, says so in one line."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  run_ok(["build_vocab.py", f"--input_file={split[0]}", f"--output_dir={tmp_path}",
          "--vocab_type=sentencepiece", "--vocab_size=2000"])
  spm_model = str(tmp_path / "spm.model")
  records, config = _records_and_config(split[0], spm_model, tmp_path, 2000)
  tokenizer = tokenization.FullTokenizer(None, True, spm_model_file=spm_model)
  first = next(iter(tf.data.TFRecordDataset(str(records))))
  example = tf.train.Example.FromString(first.numpy())
  ids = [i for i in example.features.feature["input_ids"].int64_list.value if i]
  tokens = tokenizer.convert_ids_to_tokens(ids)
  assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2
  assert sum(t.startswith("\u2581") for t in tokens) > len(tokens) / 4  # SentencePiece's pieces
  out = tmp_path / "pretrain"
  run_ok(["run_pretraining.py", f"--input_file={records}", f"--output_dir={out}",
          f"--bert_config_file={config}", "--max_seq_length=64", "--max_predictions_per_seq=10",
          "--do_train", "--train_batch_size=16", "--num_train_steps=4", "--num_warmup_steps=1",
          "--save_checkpoints_steps=4"])
  lines = tmp_path / "lines.txt"
  lines.write_text("The lobster is a large crustacean .\nIt lives in the sea ||| and walks .\n")
  features = tmp_path / "features.jsonl"
  run_ok(["extract_features.py", f"--input_file={lines}", f"--output_file={features}",
          f"--vocab_file={spm_model}", f"--bert_config_file={config}",
          f"--init_checkpoint={out}", "--max_seq_length=32", "--layers=-1"])
  rows = [json.loads(line) for line in features.read_text().splitlines()]
  assert [f["token"] for f in rows[0]["features"]] == (
      ["[CLS]"] + tokenizer.tokenize("The lobster is a large crustacean .") + ["[SEP]"])
  assert np.isfinite(rows[1]["features"][0]["layers"][0]["values"]).all()
  result = run_script(
      ["export_model.py", f"--init_checkpoint={out}", f"--vocab_file={spm_model}",
       f"--bert_config_file={config}", f"--export_dir={tmp_path / 'export'}"], timeout=None)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"error: --vocab_file={spm_model} is a SentencePiece model"), result.stderr[-2000:]
  # --extend_vocab grows a WordPiece vocab: a SentencePiece model is one line (it was a
  # traceback), with or without a model to grow.
  for extra in ([], [f"--init_checkpoint={out}", f"--bert_config_file={config}"]):
    result = run_script(["build_vocab.py", f"--input_file={split[0]}",
                         f"--output_dir={tmp_path / 'extended'}", f"--extend_vocab={spm_model}",
                         *extra], timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: --extend_vocab={spm_model} is a SentencePiece model"), result.stderr[-2000:]
    assert not (tmp_path / "extended").exists()


def test_bad_inputs(tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n")
  with pytest.raises(fileio.InputError, match="no words"):
    build_vocab.build_wordpiece([str(empty)], str(tmp_path / "v.txt"), 100)
  small = tmp_path / "small.txt"
  small.write_text("abcdefghijklmnopqrstuvwxyz\n")
  with pytest.raises(fileio.InputError, match="smaller than"):
    build_vocab.build_wordpiece([str(small)], str(tmp_path / "v.txt"), 30)
  with pytest.raises(fileio.InputError, match="leaves no room"):
    build_vocab.learn_wordpiece({"a": 1}, 5)
  assert not os.path.exists(tmp_path / "v.txt")
  result = run_script(["build_vocab.py", f"--input_file={tmp_path}/missing*.txt",
                       f"--output_dir={tmp_path}"], timeout=300)
  assert result.returncode == 2 and "matches no file" in result.stderr


def test_a_corpus_with_no_usable_word_is_one_error_line(tmp_path):
  """Every word longer than the learner takes (50 characters): one line naming the corpus (it was
  a ValueError traceback from an empty max())."""
  long_words = tmp_path / "long.txt"
  long_words.write_text(("x" * 60 + " " + "y" * 70 + "\n") * 5 + "\n" + "z" * 80 + "\n")
  with pytest.raises(fileio.InputError, match="no word to learn pieces from"):
    build_vocab.learn_wordpiece({"a" * 60: 3, "b" * 51: 1}, 100)
  result = run_script(["build_vocab.py", f"--input_file={long_words}",
                       f"--output_dir={tmp_path / 'vocab'}", "--vocab_size=100"], timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: {long_words} has no word to learn pieces from: the learner skips words over 50 "
      "characters and words with a character outside the --max_unique_chars=1000 most "
      "frequent, and that leaves none")
  assert not (tmp_path / "vocab").exists()


@requires_shared
def test_extend_vocab_adds_domain_words_and_grows_the_model(wordpiece, split, tmp_path):
  """--extend_vocab with --init_checkpoint: the old vocab's lines first and unchanged, then the
  corpus' words that it split into the most pieces, each now one token; the model grows by their
  rows (each the mean of its old pieces' rows, the masked-LM bias too), the encoder's output for
  text tokenized with the old vocab is exactly the old model's, and pre-training continues from
  the extended checkpoint on records made with the new vocab."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import checkpoints  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  # A small model with the pre-training heads, trained a few steps with the learned vocab.
  records, config = _records_and_config(split[0], wordpiece, tmp_path, 4000)
  base = tmp_path / "base"
  run_ok(["run_pretraining.py", f"--input_file={records}", f"--output_dir={base}",
          f"--bert_config_file={config}", "--max_seq_length=64", "--max_predictions_per_seq=10",
          "--do_train", "--train_batch_size=16", "--num_train_steps=3", "--num_warmup_steps=1",
          "--save_checkpoints_steps=3"])
  domain = tmp_path / "domain.txt"
  domain.write_text("\n".join(split[1]) + "\n", encoding="utf-8")
  out = tmp_path / "extended"
  result = run_ok(["build_vocab.py", f"--input_file={domain}", f"--output_dir={out}",
                   f"--extend_vocab={wordpiece}", f"--init_checkpoint={base}",
                   f"--bert_config_file={config}", "--num_new_tokens=100"])
  assert "Extended model:" in result.stdout, result.stdout
  old_lines = open(wordpiece, encoding="utf-8").read().splitlines()
  new_lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
  assert new_lines[:4000] == old_lines and len(new_lines) == 4100
  added = new_lines[4000:]
  old_tok = tokenization.FullTokenizer(wordpiece, True)
  new_tok = tokenization.FullTokenizer(str(out / "vocab.txt"), True)
  counts = build_vocab.count_words(split[1], True)
  saved = [counts[w] * (len(old_tok.wordpiece_tokenizer.tokenize(w)) - 1) for w in added]
  assert saved == sorted(saved, reverse=True) and saved[-1] >= 1
  assert all(new_tok.tokenize(w) == [w] for w in added)
  grown = json.loads((out / "bert_config.json").read_text())
  assert grown["vocab_size"] == 4100

  old_model = modeling.BertPretrainer(modeling.BertConfig.from_json_file(str(config)))
  checkpoints.init_from_checkpoint(old_model, str(base), require_all=True)
  new_model = modeling.BertPretrainer(modeling.BertConfig.from_json_file(
      str(out / "bert_config.json")))
  checkpoints.init_from_checkpoint(new_model, str(out / "bert_model.ckpt"), require_all=True)
  old_table = old_model.bert.embeddings.word_embeddings.numpy()
  new_table = new_model.bert.embeddings.word_embeddings.numpy()
  np.testing.assert_array_equal(new_table[:4000], old_table)
  for row, word in enumerate(added[:10]):
    ids = old_tok.convert_tokens_to_ids(old_tok.wordpiece_tokenizer.tokenize(word))
    np.testing.assert_allclose(new_table[4000 + row], old_table[ids].mean(0), atol=1e-6)
    np.testing.assert_allclose(new_model.masked_lm.output_bias.numpy()[4000 + row],
                               old_model.masked_lm.output_bias.numpy()[ids].mean(), atol=1e-6)
  ids = [old_tok.convert_tokens_to_ids(["[CLS]"] + old_tok.tokenize(line)[:60] + ["[SEP]"])
         for line in split[1][:8]]
  width = max(map(len, ids))
  ids = tf.constant([i + [0] * (width - len(i)) for i in ids])
  mask = tf.cast(ids > 0, tf.int32)
  outputs = [m.bert(ids, mask, tf.zeros_like(ids))["sequence_output"].numpy()
             for m in (old_model, new_model)]
  np.testing.assert_array_equal(outputs[0], outputs[1])

  # Pre-training continues from the extended model on records made with the new vocab.
  new_records, _ = _records_and_config(domain, out / "vocab.txt", tmp_path, 4100, "new")
  run_ok(["run_pretraining.py", f"--input_file={new_records}", f"--output_dir={tmp_path / 'more'}",
          f"--init_checkpoint={out / 'bert_model.ckpt'}",
          f"--bert_config_file={out / 'bert_config.json'}", "--max_seq_length=64",
          "--max_predictions_per_seq=10", "--do_train", "--train_batch_size=16",
          "--num_train_steps=2", "--num_warmup_steps=1", "--save_checkpoints_steps=2"])
  assert os.path.exists(tmp_path / "more" / "ckpt-2.index")


def _base_model(tmp_path, vocab_size=4000, hidden=256):
  """A Google-style model folder (bert_model.ckpt.*, bert_config.json) of `vocab_size` ids, with
  the pre-training heads, made in-process (its weights are random: only the files matter here)."""
  from bert_tf2 import checkpoints  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  config = modeling.BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=2 * hidden,
                               max_position_embeddings=64)
  folder = tmp_path / "base_model"
  checkpoints.export_tf1_checkpoint(modeling.BertPretrainer(config),
                                    str(folder / "bert_model.ckpt"), config)
  return folder


def _listing(path):
  return sorted(os.listdir(path)) if os.path.isdir(path) else None


@requires_shared
def test_an_extended_model_folder_appears_whole_or_not_at_all(wordpiece, split, tmp_path):
  """--extend_vocab --init_checkpoint writes one model folder: killed at any point (SIGKILL,
  SIGTERM) it is absent or complete (vocab lines = the config's vocab_size = the checkpoint's
  rows), a later run sweeps what a killed one left; it never replaces a folder holding anything
  but an earlier extension (a corpus, another model), and a second run writing the same folder at
  the same time is refused. Each refusal is one error line and changes nothing."""
  import shutil  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from conftest import PIPE, PYTHON, popen  # pylint: disable=g-import-not-at-top
  base = _base_model(tmp_path)
  domain = tmp_path / "domain.txt"
  domain.write_text("\n".join(split[1]) + "\n", encoding="utf-8")

  def flags(out):
    return ["build_vocab.py", f"--input_file={domain}", f"--output_dir={out}",
            f"--extend_vocab={wordpiece}", f"--init_checkpoint={base / 'bert_model.ckpt'}",
            "--num_new_tokens=100"]

  def check_whole(out):
    lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    config = json.loads((out / "bert_config.json").read_text())
    rows = dict(tf.train.list_variables(str(out / "bert_model.ckpt")))
    assert len(lines) == config["vocab_size"] == 4100
    assert rows["bert/embeddings/word_embeddings"][0] == 4100
    assert sorted(os.listdir(out)) == sorted(build_vocab.EXTENSION_FOLDER_FILES)

  # Killed midway: as soon as the folder's staging copy has its vocab.txt, before the checkpoint.
  out = tmp_path / "extended"
  def staged():
    return {n for n in os.listdir(tmp_path) if n.startswith(".extended.tmp-")}

  midway = 0
  for sig in (signal.SIGKILL, signal.SIGTERM):
    earlier = staged()
    process = popen([PYTHON, *flags(out)], stdout=PIPE, stderr=PIPE)
    deadline = time.time() + 300
    while process.poll() is None and time.time() < deadline:
      if any(os.path.exists(tmp_path / n / "vocab.txt") for n in staged() - earlier):
        break
      time.sleep(0.005)
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    if os.path.exists(out):  # the rename came first: the whole folder
      check_whole(out)
      break
    midway += 1
    if sig == signal.SIGKILL:  # killed midway: only its hidden staging folder is left
      assert staged() - earlier
    else:  # a signal it handles: its temporaries go with it, one error line
      assert err.decode().strip().splitlines()[-1].startswith("error:"), err.decode()[-2000:]
      assert not staged() - earlier
  assert midway  # the kill did land between the vocab and the checkpoint
  run_ok(flags(out))
  check_whole(out)
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".extended")], os.listdir(tmp_path)
  # An earlier extension's folder is replaced by a new one, whole.
  run_ok(flags(out))
  check_whole(out)

  # Never over a folder holding something else; nothing there changes.
  corpus_folder = tmp_path / "corpus_folder"
  corpus_folder.mkdir()
  (corpus_folder / "notes.txt").write_text("mine\n")
  other_model = tmp_path / "other_model"
  shutil.copytree(base, other_model)
  for target in (corpus_folder, other_model):
    before = {n: (target / n).read_bytes() for n in os.listdir(target)}
    result = run_script(flags(target))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: --output_dir={target} holds files that are not an earlier --extend_vocab model "
        "folder"), result.stderr[-2000:]
    assert {n: (target / n).read_bytes() for n in os.listdir(target)} == before

  # Two at once: while another run writes the folder, a second is refused at once.
  with fileio.writer_lock(str(out), "output_dir"):
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    result = run_script(flags(out))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: --output_dir={out} is being written by another run"), result.stderr[-2000:]
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before
  assert not os.path.exists(tmp_path / ".extended.lock")


@requires_shared
def test_extension_keeps_a_vocab_line_that_str_splitlines_would_break(wordpiece, split, tmp_path):
  """Tokens holding U+2028, a form feed or U+0085 (lines the tokenizer's vocab reader keeps
  whole): the extended vocab keeps every old line as it was, so every old id stays."""
  lines = open(wordpiece, encoding="utf-8").read().split("\n")[:-1]
  unused = [i for i, line in enumerate(lines) if line.startswith("[unused")]
  for i, token in zip(unused, ("a\u2028b", "c\x0cd", "e\x85f")):
    lines[i] = token
  old = tmp_path / "odd_vocab.txt"
  old.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  domain = tmp_path / "domain.txt"
  domain.write_text("\n".join(split[1]) + "\n", encoding="utf-8")
  run_ok(["build_vocab.py", f"--input_file={domain}", f"--output_dir={tmp_path / 'out'}",
          f"--extend_vocab={old}", "--num_new_tokens=20"])
  new = (tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
  assert new[:len(lines)] == lines and len(new) == len(lines) + 20
  assert tokenization.load_vocab(str(tmp_path / "out" / "vocab.txt"))["e\x85f"] == unused[2]
