"""build_vocab.py: a WordPiece vocab learned from the real corpus covers held-out text and a tiny
model pre-trains with it; a SentencePiece model loads into FullTokenizer."""

import collections
import json
import math
import os
import subprocess

import pytest

from conftest import ENV, PYTHON, ROOT, SHARED, requires_shared, run_ok
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


@requires_shared
def test_tiny_model_pretrains_with_the_learned_vocab(wordpiece, split, tmp_path):
  records = tmp_path / "records.tfrecord"
  run_ok(["create_pretraining_data.py", f"--input_file={split[0]}", f"--output_file={records}",
        f"--vocab_file={wordpiece}", "--max_seq_length=64", "--max_predictions_per_seq=10",
        "--dupe_factor=1", "--num_workers=1"])
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(dict(vocab_size=4000, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64,
                                    max_position_embeddings=64, type_vocab_size=2)))
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
  result = subprocess.run([PYTHON, "build_vocab.py", f"--input_file={tmp_path}/missing*.txt",
                           f"--output_dir={tmp_path}"], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 2 and "matches no file" in result.stderr
