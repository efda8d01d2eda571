"""Tests for create_pretraining_data: the original's records exactly, fast mode, outputs, errors."""

import os
import random
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, SHARED, VOCAB, requires_shared, run_process
from bert_tf2 import create_pretraining_data as cpd
from bert_tf2 import fileio
from bert_tf2 import pretraining_data as ptd
from bert_tf2 import tfrecord_io
from bert_tf2 import tokenization

REFERENCE = os.path.join(SHARED, "reference", "pretraining")
SAMPLE_TEXT = os.path.join(REFERENCE, "sample_text.txt")
CORPUS = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")

# The flag sets in ../shared/reference/pretraining/FLAGS.txt (all with --do_lower_case=True).
REFERENCE_FLAGS = {
    "default": dict(max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15,
                    random_seed=12345, dupe_factor=10, short_seq_prob=0.1),
    "wwm_seq64": dict(max_seq_length=64, max_predictions_per_seq=10, masked_lm_prob=0.15,
                      random_seed=7, dupe_factor=3, short_seq_prob=0.2, do_whole_word_mask=True),
    "seq512": dict(max_seq_length=512, max_predictions_per_seq=80, masked_lm_prob=0.2,
                   random_seed=1, dupe_factor=2, short_seq_prob=0.0),
}


def read_records(*paths):
  return [r.numpy() for path in paths for r in tf.data.TFRecordDataset(path)]


def features(record):
  """Serialized Example -> {name: list of values}."""
  parsed = tf.train.Example.FromString(record).features.feature
  return {name: list(f.int64_list.value) if f.HasField("int64_list") else list(f.float_list.value)
          for name, f in parsed.items()}


def options(tmp_path, name="out.tfrecord", **kwargs):
  kwargs.setdefault("input_file", SAMPLE_TEXT)
  kwargs.setdefault("vocab_file", VOCAB)
  kwargs.setdefault("num_workers", 1)
  return ptd.Options(output_file=os.path.join(str(tmp_path), name), **kwargs)


# --- Exact mode: the original's records. -------------------------------------------------------


@requires_shared
@pytest.mark.parametrize("name", sorted(REFERENCE_FLAGS))
def test_exact_mode_reproduces_reference_records(tmp_path, name):
  stats = cpd.run(options(tmp_path, **REFERENCE_FLAGS[name]))
  ours = read_records(str(tmp_path / "out.tfrecord"))
  reference = read_records(os.path.join(REFERENCE, f"{name}.tfrecord"))
  assert len(ours) == len(reference) == stats.instances
  # Feature maps are serialized in an implementation-defined order, so compare parsed values.
  for i, (mine, theirs) in enumerate(zip(ours, reference)):
    assert features(mine) == features(theirs), f"record {i} of {name} differs"


@requires_shared
def test_exact_mode_same_records_through_reference_tokenizer_path(tmp_path, monkeypatch):
  cpd.run(options(tmp_path, "batch.tfrecord", **REFERENCE_FLAGS["wwm_seq64"]))
  # Without the batch tokenizer, lines go through tokenize() one by one.
  monkeypatch.delattr(tokenization.FullTokenizer, "encode_batch")
  cpd.run(options(tmp_path, "slow.tfrecord", **REFERENCE_FLAGS["wwm_seq64"]))
  assert (read_records(str(tmp_path / "batch.tfrecord")) ==
          read_records(str(tmp_path / "slow.tfrecord")))


@requires_shared
def test_exact_mode_same_records_with_parallel_tokenizing(tmp_path, monkeypatch):
  monkeypatch.setattr(cpd, "_PARALLEL_TOKENIZE_MIN_BYTES", 0)
  monkeypatch.setattr(ptd, "_TOKENIZE_BATCH_DOCUMENTS", 1)
  cpd.run(options(tmp_path, num_workers=2, **REFERENCE_FLAGS["seq512"]))
  assert list(map(features, read_records(str(tmp_path / "out.tfrecord")))) == list(
      map(features, read_records(os.path.join(REFERENCE, "seq512.tfrecord"))))


@requires_shared
def test_several_output_files_get_records_round_robin(tmp_path):
  cpd.run(options(tmp_path, "single.tfrecord", **REFERENCE_FLAGS["seq512"]))
  cpd.run(options(tmp_path, "{shard}.tfrecord", num_output_shards=3,
                  **REFERENCE_FLAGS["seq512"]))
  single = read_records(str(tmp_path / "single.tfrecord"))
  shards = [read_records(str(tmp_path / f"{i}.tfrecord")) for i in range(3)]
  assert [len(s) for s in shards] == [4, 4, 3]
  assert [shards[i % 3][i // 3] for i in range(len(single))] == single


def test_exact_random_draws_like_random_random():
  for seed in (1, 7, 12345, "text seed"):
    ours, theirs = ptd.ExactRandom(seed), random.Random(seed)
    for n in list(range(0, 80)) + [5000]:
      a, b = list(range(n)), list(range(n))
      ours.shuffle(a)
      theirs.shuffle(b)
      assert a == b
      keep = n // 3 + 1
      a, b = list(range(n)), list(range(n))
      ours.shuffle(a, keep=keep)
      theirs.shuffle(b)
      assert a[:keep] == b[:keep]
      assert ours.randint(0, n) == theirs.randint(0, n)
      assert ours.randint(1, 1) == theirs.randint(1, 1)
      assert ours.random() == theirs.random()


def test_encoder_matches_tf_train_example():
  encoder = tfrecord_io.ExampleEncoder(max_seq_length=12, max_predictions_per_seq=4,
                                       vocab_size=30522)
  input_ids = [101, 2023, 103, 30000, 102, 16384, 127, 128, 102]
  record = encoder.encode(input_ids, 5, [2, 3], [2003, 1037], True)

  def int_list(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

  expected = tf.train.Example(features=tf.train.Features(feature={
      "input_ids": int_list(input_ids + [0] * 3),
      "input_mask": int_list([1] * 9 + [0] * 3),
      "segment_ids": int_list([0] * 5 + [1] * 4 + [0] * 3),
      "masked_lm_positions": int_list([2, 3, 0, 0]),
      "masked_lm_ids": int_list([2003, 1037, 0, 0]),
      "masked_lm_weights": tf.train.Feature(
          float_list=tf.train.FloatList(value=[1.0, 1.0, 0.0, 0.0])),
      "next_sentence_labels": int_list([1]),
  }))
  assert tf.train.Example.FromString(record) == expected
  parsed = tf.io.parse_single_example(record, ptd.example_feature_spec(12, 4))
  assert parsed["segment_ids"].numpy().tolist() == [0] * 5 + [1] * 4 + [0] * 3


@requires_shared
@pytest.mark.parametrize("no_nsp", [False, True])
def test_batch_assembly_and_encoding_match_the_per_instance_path(tokenizer, no_nsp):
  lines = [lines for lines, _ in ptd.iter_document_lines([SAMPLE_TEXT])]
  corpus = ptd.Corpus()
  corpus.add_documents(ptd.tokenize_documents(tokenizer, lines))
  vocab_ids = ptd.VocabIds(tokenizer.vocab)
  settings = ptd.Options("", "", "", max_seq_length=48, short_seq_prob=0.3, no_nsp=no_nsp)
  rng = ptd.ExactRandom(3)
  instances = [instance for _ in range(3) for d in range(len(corpus.documents))
               for instance in ptd.create_unmasked_instances(corpus.documents, d, settings, rng)]
  ids, lengths, segment_a = ptd.assemble_batch(np.array(corpus.tokens), instances, 48, vocab_ids)
  for row, instance in enumerate(instances):
    tokens, a = ptd.instance_tokens(corpus.tokens, instance, vocab_ids)
    assert 3 <= len(tokens) <= 48 and a <= len(tokens)
    assert ids[row].tolist() == tokens + [0] * (48 - len(tokens))
    assert (lengths[row], segment_a[row]) == (len(tokens), a)
  positions, labels, counts = ptd.mask_instances_batch(ids, lengths, 0.15, 7, vocab_ids,
                                                       np.random.default_rng(0))
  is_random_next = [instance[4] for instance in instances]
  encoder = tfrecord_io.ExampleEncoder(48, 7, vocab_ids.size)
  batch = encoder.encode_batch(ids, lengths, segment_a, positions, labels, counts,
                               is_random_next)
  for row, record in enumerate(batch):
    n, k = lengths[row], counts[row]
    assert record == encoder.encode(ids[row, :n].tolist(), segment_a[row],
                                    positions[row, :k].tolist(), labels[row, :k].tolist(),
                                    is_random_next[row])


def test_batch_whole_word_choice_follows_the_sequential_rule():
  vocab = {t: i for i, t in enumerate(
      ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "##x", "##y", "##z"])}
  vocab_ids = ptd.VocabIds(vocab)
  rng = np.random.default_rng(5)
  n, seq = 300, 24
  lengths = rng.integers(5, seq + 1, n)
  ids = rng.integers(5, 11, (n, seq))
  ids[np.arange(seq) >= lengths[:, None]] = 0
  ids[:, 0] = vocab["[CLS]"]
  middle = rng.integers(2, lengths - 2)
  ids[np.arange(n), middle] = ids[np.arange(n), lengths - 1] = vocab["[SEP]"]
  candidate = (np.arange(seq) < lengths[:, None]) & (ids > 4)
  counts = rng.integers(1, 8, n)
  keys = rng.random((n, seq))
  selected, totals = ptd._choose_whole_words(ids, candidate, counts, keys, vocab_ids)
  for row in range(n):
    words = []  # As create_masked_lm_predictions groups them.
    for i in np.flatnonzero(candidate[row]):
      if words and vocab_ids.is_subword[ids[row, i]]:
        words[-1].append(i)
      else:
        words.append([i])
    expected = []
    for word in sorted(words, key=lambda w: keys[row, w[0]]):
      if len(expected) >= counts[row]:
        break
      if len(expected) + len(word) <= counts[row]:
        expected.extend(word)
    assert sorted(expected) == np.flatnonzero(selected[row]).tolist()
    assert totals[row] == len(expected)


def test_documents_continue_across_files_only_in_exact_mode(tmp_path):
  first, second = tmp_path / "a.txt", tmp_path / "b.txt"
  first.write_text("one.\ntwo.\n\n  \nthree.\n", encoding="utf-8")
  second.write_text("four.\n\nfive.\n", encoding="utf-8")
  files = [str(first), str(second)]
  exact = [lines for lines, _ in ptd.iter_document_lines(files)]
  fast = [lines for lines, _ in ptd.iter_document_lines(files, end_document_at_file_end=True)]
  assert exact == [["one.", "two."], ["three.", "four."], ["five."]]
  assert fast == [["one.", "two."], ["three."], ["four."], ["five."]]


@requires_shared
def test_chunks_as_spans_read_back_as_the_same_documents(tmp_path):
  # What a Beam job sends between workers: a chunk as spans of its files, read where it runs.
  # A BOM, CRLF endings, runs of blank and whitespace-only lines (a no-break space, an
  # ideographic space), no newline at the end, a long document cut by max_chunk_bytes, and
  # real text.
  odd = tmp_path / "odd.txt"
  odd.write_bytes("\ufeffUn.\r\nDeux \u00e9t\u00e9.\r\n\r\n\u00a0\n\u3000\n\nTrois.\n".encode() +
                  ("Long line of a long document. " * 20 + "\n").encode() * 40 + b"\n\nlast")
  files = [str(odd), os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt"),
           str(odd)]
  for chunk_documents, max_chunk_bytes in [(1, 1 << 20), (3, 1500), (8, 1 << 20), (500, 1 << 30)]:
    chunks = list(ptd.iter_chunks(files, chunk_documents, max_chunk_bytes))
    spans = list(ptd.iter_chunks(files, chunk_documents, max_chunk_bytes, spans=True))
    assert [(i, n) for i, _, n in spans] == [(i, n) for i, _, n in chunks]
    for (_, documents, _), (_, chunk_spans, _) in zip(chunks, spans):
      assert ptd.read_chunk_spans(chunk_spans, max_chunk_bytes) == documents
      assert len(chunk_spans) <= len(documents)  # consecutive documents' spans are merged
  assert len(chunks) == 1 and len(spans[0][1]) == 3  # one span per file
  assert chunks[0][1][0] == ["Un.", "Deux \u00e9t\u00e9."]
  assert chunks[0][1][-1] == ["last"]


# --- Fast mode. ---------------------------------------------------------------------------------

FAST = dict(input_file=CORPUS, mode="fast", dupe_factor=1, chunk_documents=8,
            shuffle_buffer_size=500, max_seq_length=128, max_predictions_per_seq=20)


def check_records(records, max_seq_length, max_predictions_per_seq, vocab, pairs=True):
  """Asserts every record is well formed; returns (masked fraction, random-next fraction)."""
  cls_id, sep_id, mask_id = vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]
  masked = tokens = random_next = mask_tokens = 0
  for record in records:
    f = {k: np.array(v) for k, v in features(record).items()}
    assert f["input_ids"].shape == f["input_mask"].shape == f["segment_ids"].shape == (
        max_seq_length,)
    assert f["masked_lm_ids"].shape == f["masked_lm_weights"].shape == (max_predictions_per_seq,)
    n = int(f["input_mask"].sum())
    k = int(f["masked_lm_weights"].sum())
    assert (f["input_mask"] == (np.arange(max_seq_length) < n)).all()
    assert (f["input_ids"][n:] == 0).all() and (f["segment_ids"][n:] == 0).all()
    assert ((0 <= f["input_ids"]) & (f["input_ids"] < len(vocab))).all()
    ids, segments = f["input_ids"][:n], f["segment_ids"][:n]
    assert ids[0] == cls_id and ids[-1] == sep_id
    separators = np.flatnonzero(ids == sep_id)
    if pairs:
      a = separators[0] + 1
      assert len(separators) == 2 and 3 <= a < n - 1
      assert (segments[:a] == 0).all() and (segments[a:] == 1).all()
    else:
      assert len(separators) == 1 and (segments == 0).all()
      assert f["next_sentence_labels"][0] == 0
    positions = f["masked_lm_positions"][:k]
    assert 1 <= k and (np.diff(positions) > 0).all()
    assert (f["masked_lm_weights"][:k] == 1).all() and (f["masked_lm_positions"][k:] == 0).all()
    assert not np.isin(positions, separators).any() and (positions > 0).all()
    assert (positions < n).all() and (f["masked_lm_ids"][k:] == 0).all()
    # [MASK] appears only where a prediction is made.
    assert set(np.flatnonzero(ids == mask_id)) <= set(positions)
    mask_tokens += int((ids[positions] == mask_id).sum())
    masked, tokens = masked + k, tokens + n
    random_next += int(f["next_sentence_labels"][0])
  assert 0.7 < mask_tokens / masked < 0.9  # 80% [MASK], 10% random, 10% unchanged.
  return masked / tokens, random_next / len(records)


@requires_shared
def test_fast_mode_records_are_valid_and_balanced(tmp_path, tokenizer):
  stats = cpd.run(options(tmp_path, "fast/", num_output_shards=2, **FAST))
  paths = sorted(str(p) for p in (tmp_path / "fast").iterdir())
  assert [os.path.basename(p) for p in paths] == [
      "pretraining-00000-of-00002.tfrecord", "pretraining-00001-of-00002.tfrecord"]
  records = read_records(*paths)
  assert len(records) == stats.instances > 2000
  masked_fraction, random_next = check_records(records, 128, 20, tokenizer.vocab)
  assert 0.13 < masked_fraction < 0.16
  assert 0.45 < random_next < 0.55


@requires_shared
def test_fast_mode_is_deterministic_for_a_seed_whatever_the_worker_count(tmp_path):
  cpd.run(options(tmp_path, "a.tfrecord", **FAST))
  cpd.run(options(tmp_path, "b.tfrecord", **FAST))
  cpd.run(options(tmp_path, "c.tfrecord", **{**FAST, "num_workers": 2}))
  cpd.run(options(tmp_path, "d.tfrecord", **{**FAST, "random_seed": 99}))
  a, b, c, d = (open(tmp_path / f"{x}.tfrecord", "rb").read() for x in "abcd")
  assert a == b == c
  assert a != d


@requires_shared
def test_fast_mode_whole_word_masking(tmp_path, tokenizer):
  cpd.run(options(tmp_path, **{**FAST, "chunk_documents": 30, "max_seq_length": 64,
                              "max_predictions_per_seq": 10, "do_whole_word_mask": True}))
  records = read_records(str(tmp_path / "out.tfrecord"))
  check_records(records, 64, 10, tokenizer.vocab)
  # Words are masked whole: a masked "##" piece follows a masked piece, or starts its segment
  # (after [CLS]/[SEP], when truncation cut the word's start off).
  subword = {i for t, i in tokenizer.vocab.items() if t.startswith("##")}
  special = {tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]}
  checked = 0
  for record in records:
    f = features(record)
    positions = set(f["masked_lm_positions"][:int(sum(f["masked_lm_weights"]))])
    labels = dict(zip(f["masked_lm_positions"], f["masked_lm_ids"]))
    for p in positions:
      if labels[p] in subword:
        assert p - 1 in positions or f["input_ids"][p - 1] in special
        checked += 1
  assert checked > 1000


@requires_shared
@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_no_nsp_writes_single_segments(tmp_path, tokenizer, mode):
  stats = cpd.run(options(tmp_path, no_nsp=True, mode=mode, dupe_factor=2, chunk_documents=2))
  records = read_records(str(tmp_path / "out.tfrecord"))
  assert len(records) == stats.instances > 10 and stats.random_next == 0
  masked_fraction, random_next = check_records(records, 128, 20, tokenizer.vocab, pairs=False)
  assert random_next == 0 and 0.12 < masked_fraction < 0.18


# --- Outputs are atomic; bad inputs are clear errors. -------------------------------------------


@requires_shared
def test_failure_midway_leaves_no_output_file(tmp_path, monkeypatch):
  encode_batch = tfrecord_io.ExampleEncoder.encode_batch
  calls = []

  def failing_encode_batch(self, *args):
    calls.append(1)
    if len(calls) == 3:
      raise RuntimeError("disk on fire")
    return encode_batch(self, *args)

  # Fast mode encodes while it writes: two chunks' records are written when the third fails.
  monkeypatch.setattr(tfrecord_io.ExampleEncoder, "encode_batch", failing_encode_batch)
  with pytest.raises(RuntimeError, match="disk on fire"):
    cpd.run(options(tmp_path, "out/{shard}.tfrecord", mode="fast", num_output_shards=2,
                    chunk_documents=1, shuffle_buffer_size=0))
  assert len(calls) == 3
  assert os.listdir(tmp_path / "out") == []


def test_write_records_is_atomic(tmp_path):
  def records():
    for i in range(100):
      if i == 60:
        raise RuntimeError("interrupted")
      yield b"record %d" % i

  paths = [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]
  with pytest.raises(RuntimeError, match="interrupted"):
    tfrecord_io.write_sharded(records(), paths)
  assert os.listdir(tmp_path) == []
  assert tfrecord_io.write_sharded((b"record %d" % i for i in range(5)), paths) == 5
  assert read_records(*paths) == [b"record 0", b"record 2", b"record 4", b"record 1",
                                  b"record 3"]


def write(path, data):
  path.write_bytes(data)
  return str(path)


@requires_shared
@pytest.mark.parametrize("change, message", [
    (dict(input_file="/nonexistent/*.txt"), "input file pattern matches no file"),
    (dict(vocab_file="/nonexistent/vocab.txt"), "vocab file not found"),
    (dict(max_predictions_per_seq=0), "--max_predictions_per_seq=0 must be between 1"),
    (dict(max_predictions_per_seq=200), "--max_predictions_per_seq=200 must be between 1"),
    (dict(masked_lm_prob=0.0), r"--masked_lm_prob=0.0 must be in \(0, 1\]"),
    (dict(masked_lm_prob=1.5), r"--masked_lm_prob=1.5 must be in \(0, 1\]"),
    (dict(max_seq_length=4), "--max_seq_length=4 is too small"),
    (dict(dupe_factor=0), "--dupe_factor=0 must be at least 1"),
    (dict(output_file="out/{part}.tfrecord"), "may only use the fields"),
])
def test_bad_flags_and_files(tmp_path, change, message):
  with pytest.raises(fileio.InputError, match=message):
    cpd.run(ptd.Options(**{"input_file": SAMPLE_TEXT, "vocab_file": VOCAB,
                           "output_file": str(tmp_path / "out.tfrecord"), **change}))
  assert not os.path.exists(tmp_path / "out.tfrecord")


@requires_shared
@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_empty_and_invalid_inputs(tmp_path, mode):
  empty = write(tmp_path / "empty.txt", b"\n  \n\n\t\n")
  with pytest.raises(fileio.InputError, match="no documents in the input"):
    cpd.run(options(tmp_path, input_file=empty, mode=mode))
  bad = write(tmp_path / "bad.txt", "Fine line.\n\nCaf\u00e9 ".encode() + b"\xff\xfe broken\n")
  with pytest.raises(fileio.InputError, match=r"bad.txt:3: invalid UTF-8"):
    cpd.run(options(tmp_path, input_file=bad, mode=mode))
  assert not os.path.exists(tmp_path / "out.tfrecord")


def test_vocab_without_special_tokens(tmp_path):
  vocab = write(tmp_path / "vocab.txt", b"[PAD]\nhello\nworld\n")
  text = write(tmp_path / "text.txt", b"hello world\n")
  with pytest.raises(fileio.InputError, match=r"lacks the special token\(s\) \[UNK\] \[CLS\]"):
    cpd.run(options(tmp_path, input_file=text, vocab_file=vocab))


@requires_shared
def test_command_line(tmp_path):
  script = os.path.join(ROOT, "create_pretraining_data.py")
  common = [sys.executable, script, f"--vocab_file={VOCAB}", "--dupe_factor=1"]
  # -X importtime lists every module the parent imports: TensorFlow must not be one (its import
  # costs more than preparing a few MB of text).
  done = run_process(common[:1] + ["-X", "importtime"] + common[1:] + [
      f"--input_file={SAMPLE_TEXT}", f"--output_file={tmp_path}/a.tfrecord,{tmp_path}/b.tfrecord",
      "--mode=fast", "--num_workers=2"], cwd=None, env=None, timeout=None)
  assert done.returncode == 0, done.stderr
  assert "instances from 3 documents" in done.stderr
  imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
              if line.startswith("import time:")]
  assert "numpy" in imported and "tensorflow" not in imported
  assert len(read_records(f"{tmp_path}/a.tfrecord", f"{tmp_path}/b.tfrecord")) > 5
  done = run_process(common + [f"--input_file={tmp_path}/missing.txt",
                               f"--output_file={tmp_path}/c.tfrecord"],
                     cwd=None, env=None, timeout=None)
  assert done.returncode == 2
  assert done.stderr.strip().endswith(
      f"error: input file pattern matches no file: {tmp_path}/missing.txt")


def test_tfrecord_framing_is_byte_identical_to_tensorflow_writer(tmp_path):
  # fileio writes the TFRecord framing (lengths, masked CRC-32C) itself so that
  # create_pretraining_data never imports TensorFlow; it must be what TensorFlow writes.
  rng = random.Random(3)
  sizes = [0, 1, 2, 3, 4, 5, 7, 8, 9, 255, 256, 1000, 4097]
  sizes += [rng.randrange(3000) for _ in range(40)]
  records = [bytes(rng.randrange(256) for _ in range(n)) for n in sizes]
  assert int(tfrecord_io.crc32c_batch([b"123456789"])[0]) == 0xE3069283  # the CRC-32C check value
  path = str(tmp_path / "tf.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for record in records:
      writer.write(record)
  with open(path, "rb") as f:
    assert tfrecord_io.tfrecord_bytes(records) == f.read()
  assert tfrecord_io.tfrecord_bytes([]) == b""
