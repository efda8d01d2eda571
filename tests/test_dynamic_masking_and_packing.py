"""create_pretraining_data's --dynamic_masking and --pack_sequences, and how run_pretraining reads
them: masks drawn in the input pipeline by the generator's rules, packed sequences whose losses
are those of the same instances unpacked."""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import (VOCAB, WIKITEXT, assert_same_checkpoints, import_script, kill_at_checkpoint,
                      requires_shared, run_ok, run_script)
from bert_tf2 import fileio
from bert_tf2 import input_pipeline
from bert_tf2 import modeling
from bert_tf2 import pretraining_data as ptd

cpd = import_script("create_pretraining_data")

SEQ, PREDS = 128, 20
# Fast mode on WikiText-2: one pass; short_seq_prob 0.3 makes many short instances to pack.
FAST = dict(input_file=WIKITEXT, vocab_file=VOCAB, mode="fast", dupe_factor=1,
            chunk_documents=20, shuffle_buffer_size=500, max_seq_length=SEQ,
            max_predictions_per_seq=PREDS, short_seq_prob=0.3, num_workers=1)


def generate(tmp_path, name, **kwargs):
  """Runs the generator into tmp_path/name; returns (path, Stats)."""
  path = str(tmp_path / name)
  stats = cpd.run(ptd.Options(output_file=path, **{**FAST, **kwargs}))
  return path, stats


def read(path, seq=SEQ, preds=PREDS):
  """Every record of `path` parsed with the spec of its kind: {feature: numpy [N, ...]}."""
  records = input_pipeline.PretrainingRecords.of_file(path)
  spec = input_pipeline.pretraining_features(seq, preds, records)
  batches = [{k: v.numpy() for k, v in batch.items()} for batch in
             tf.data.TFRecordDataset(path).batch(4096).map(
                 lambda r: tf.io.parse_example(r, spec))]
  return {k: np.concatenate([b[k] for b in batches]) for k in spec}


def instances(features):
  """The instances of records (packed or not) as hashable tuples: (ids, segments, next-sentence
  label, masked positions relative to the instance, their labels, token kinds). Ids are the
  records' own (masked where the records are)."""
  instance_ids = features.get("instance_ids", features["input_mask"])
  out = []
  for row in range(len(instance_ids)):
    for slot in range(1, instance_ids[row].max() + 1):
      where = np.flatnonzero(instance_ids[row] == slot)
      start, end = where[0], where[-1] + 1
      assert len(where) == end - start  # contiguous
      predicted = ()
      if "masked_lm_positions" in features:
        positions = features["masked_lm_positions"][row]
        mine = (features["masked_lm_weights"][row] > 0) & (positions >= start) & (positions < end)
        predicted = (tuple(positions[mine] - start), tuple(features["masked_lm_ids"][row][mine]))
      kinds = tuple(features["token_kinds"][row, start:end]) if "token_kinds" in features else ()
      out.append((tuple(features["input_ids"][row, start:end]),
                  tuple(features["segment_ids"][row, start:end]),
                  int(features["next_sentence_labels"][row, slot - 1]), predicted, kinds))
  return out


def unmasked(instance):
  """An instance tuple with the masked tokens given back their labels, without masks."""
  ids, segments, label, (positions, labels), _ = instance
  ids = list(ids)
  for p, l in zip(positions, labels):
    ids[p] = l
  return tuple(ids), segments, label


# --- The generator. ------------------------------------------------------------------------------


@requires_shared
def test_dynamic_masking_writes_the_same_instances_unmasked_with_word_kinds(tmp_path, tokenizer):
  classic, _ = generate(tmp_path, "classic.tfrecord")
  dynamic, stats = generate(tmp_path, "dynamic.tfrecord", dynamic_masking=True)
  assert stats.masked == 0 and "unmasked (run_pretraining masks them)" in stats.summary()
  features = read(dynamic)
  assert set(features) == {"input_ids", "input_mask", "segment_ids", "token_kinds",
                           "mask_token_id", "vocab_words", "next_sentence_labels"}
  assert (features["vocab_words"] == len(tokenizer.vocab)).all()
  vocab = tokenizer.vocab
  assert (features["mask_token_id"] == vocab["[MASK]"]).all()
  assert not (features["input_ids"] == vocab["[MASK]"]).any()
  # Same seed, same instances: the classic records' with their masked tokens given back.
  ours = instances(features)
  assert sorted(i[:3] for i in ours) == sorted(map(unmasked, instances(read(classic))))
  # Token kinds: 0 exactly at [CLS], [SEP] and padding; 2 exactly at the "##" pieces after
  # an instance's first candidate.
  subword = np.zeros(len(tokenizer.inv_vocab), bool)
  subword[[i for t, i in vocab.items() if t.startswith("##")]] = True
  ids, kinds = features["input_ids"], features["token_kinds"]
  special = ((ids == vocab["[CLS]"]) | (ids == vocab["[SEP]"]) | (features["input_mask"] == 0))
  assert ((kinds == 0) == special).all()
  after_first = np.cumsum(~special, axis=1) > 1
  assert ((kinds == 2) == (subword[ids] & ~special & after_first)).all()
  assert (kinds == 2).sum() > 5000


@requires_shared
@pytest.mark.parametrize("dynamic", [False, True])
def test_packing_keeps_every_instance_and_its_masks(tmp_path, tokenizer, dynamic):
  plain, plain_stats = generate(tmp_path, "plain.tfrecord", dynamic_masking=dynamic)
  packed, stats = generate(tmp_path, "packed.tfrecord", dynamic_masking=dynamic,
                           pack_sequences=True, max_instances_per_pack=3)
  features = read(packed)
  # Packing draws nothing: the same instances, with the same masks when masked.
  assert sorted(instances(features)) == sorted(instances(read(plain)))
  assert stats.instances == plain_stats.instances and stats.records == len(features["input_ids"])
  assert stats.records < 0.9 * stats.instances  # short_seq_prob=0.3 leaves much to pack
  padding = 1 - features["input_mask"].sum() / features["input_mask"].size
  plain_padding = 1 - plain_stats.tokens / plain_stats.slots
  assert padding == pytest.approx(1 - stats.tokens / stats.slots)
  # Measured: 19.3% of the positions are padding unpacked, 5.3% packed.
  assert padding < 0.07 and plain_padding > 0.15, (padding, plain_padding)

  instance_ids, weights = features["instance_ids"], features["next_sentence_weights"]
  counts = instance_ids.max(axis=1)
  assert 2 <= counts.max() <= 3 and (weights.sum(axis=1) == counts).all()
  assert (weights == (np.arange(3) < counts[:, None])).all()
  assert (features["next_sentence_labels"][weights == 0] == 0).all()
  # Instances 1, 2, ... in order, then padding; [CLS] opens each.
  assert (np.diff(np.where(instance_ids == 0, 4, instance_ids), axis=1) >= 0).all()
  assert ((instance_ids > 0) == (features["input_mask"] == 1)).all()
  starts = np.diff(instance_ids, axis=1, prepend=0) > 0
  assert (features["input_ids"][starts] == tokenizer.vocab["[CLS]"]).all()
  assert starts.sum() == stats.instances
  if dynamic:
    # What run_pretraining will mask fits the predictions of a sequence.
    lengths = np.stack([(instance_ids == k).sum(axis=1) for k in (1, 2, 3)], axis=1)
    assert (ptd.num_to_predict(lengths, 0.15, PREDS) * (lengths > 0)).sum(axis=1).max() <= PREDS
  else:
    positions, k = features["masked_lm_positions"], features["masked_lm_weights"].sum(axis=1)
    valid = np.arange(PREDS) < k[:, None]
    assert (features["masked_lm_weights"] == valid).all()
    assert all((np.diff(p[:int(n)]) > 0).all() for p, n in zip(positions, k))


def test_new_options_need_fast_mode(tmp_path):
  for option in ("dynamic_masking", "pack_sequences"):
    with pytest.raises(fileio.InputError, match=f"--{option} needs --mode=fast"):
      ptd.validate_options(ptd.Options(WIKITEXT, str(tmp_path / "x"), VOCAB, mode="exact",
                                       **{option: True}))


def test_packing_one_instance_a_sequence_is_refused(tmp_path):
  with pytest.raises(fileio.InputError, match=r"^--max_instances_per_pack=1 packs nothing .*"
                                              r"use 2 or more, or leave out --pack_sequences$"):
    ptd.validate_options(ptd.Options(WIKITEXT, str(tmp_path / "x"), VOCAB, mode="fast",
                                     pack_sequences=True, max_instances_per_pack=1))
  # Without --pack_sequences the flag means nothing, and is no error.
  ptd.validate_options(ptd.Options(WIKITEXT, str(tmp_path / "x"), VOCAB, mode="fast",
                                   max_instances_per_pack=1))


@requires_shared
def test_dynamic_masking_with_several_passes_warns(tmp_path, caplog):
  # Each pass of --dupe_factor writes every document again without masks (run_pretraining masks
  # every read afresh anyway): warned, with the value docs/pretraining-data.md gives, not changed.
  tiny = dict(chunk_documents=8, max_seq_length=32, max_predictions_per_seq=5)
  _, once = generate(tmp_path, "once.tfrecord", dynamic_masking=True, **tiny)
  assert "--dupe_factor" not in caplog.text
  _, twice = generate(tmp_path, "twice.tfrecord", dynamic_masking=True, dupe_factor=2, **tiny)
  assert twice.instances > 1.8 * once.instances
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert [w for w in warnings if w.startswith(
      "--dupe_factor=2 with --dynamic_masking writes every document 2 times") and
          "--dupe_factor=1" in w], warnings


# --- Masking in the input pipeline. ------------------------------------------------------------


def _rows(tokenizer, seq=64):
  """Real instances of WikiText-2 as assemble_batch's rows (ids, lengths)."""
  lines = [lines for lines, _ in ptd.iter_document_lines([WIKITEXT])][:20]
  corpus = ptd.Corpus()
  corpus.add_documents(ptd.tokenize_documents(tokenizer, lines))
  vocab_ids = ptd.VocabIds(tokenizer.vocab)
  options = ptd.Options("", "", "", max_seq_length=seq, short_seq_prob=0.3)
  rng = ptd.ExactRandom(5)
  spans = [instance for d in range(len(corpus.documents))
           for instance in ptd.create_unmasked_instances(corpus.documents, d, options, rng)]
  ids, lengths, _ = ptd.assemble_batch(np.array(corpus.tokens), spans, seq, vocab_ids)
  return ids, lengths, vocab_ids


@requires_shared
@pytest.mark.parametrize("whole_word", [False, True])
def test_pipeline_chooses_the_positions_the_generator_would(tokenizer, whole_word):
  """Given the same random keys, the TF choice is the generator's numpy one, position for
  position (whole words: visited by key, each taken when all its pieces still fit)."""
  ids, lengths, vocab_ids = _rows(tokenizer)
  assert len(ids) > 500
  # pylint: disable=protected-access
  candidate = ptd._candidates(ids, lengths, vocab_ids)
  counts = np.minimum(ptd.num_to_predict(lengths, 0.15, 10), candidate.sum(axis=1))
  keys = np.random.default_rng(0).random(ids.shape)
  if whole_word:
    expected, _ = ptd._choose_whole_words(ids, candidate, counts, keys, vocab_ids)
  else:
    ranks = np.argsort(np.argsort(np.where(candidate, keys, 2.0), axis=1), axis=1)
    expected = candidate & (ranks < counts[:, None])
  selected = input_pipeline.choose_masked_positions(
      tf.constant((np.arange(ids.shape[1]) < lengths[:, None]).astype(np.int32)),
      tf.constant(ptd.token_kinds(ids, lengths, vocab_ids).astype(np.int32)),
      tf.constant(counts[:, None].astype(np.int32)), tf.constant(keys), whole_word)
  np.testing.assert_array_equal(selected.numpy(), expected)
  assert expected.sum() > 5000


def _masked_batches(path, masking, seed=3, batch_size=64, is_training=False, preds=PREDS):
  records = input_pipeline.PretrainingRecords.of_file(path)
  spec = input_pipeline.pretraining_features(SEQ, preds, records)
  return input_pipeline.pretraining_dataset([path], spec, batch_size, is_training, seed=seed,
                                            drop_remainder=False, masking=masking)


def _unmasked_and_masked(path, masking, seed=3):
  """(the records as written, the same records masked by the pipeline), both as numpy."""
  masked = [{k: v.numpy() for k, v in b.items()} for b in _masked_batches(path, masking, seed)]
  return read(path), {k: np.concatenate([b[k] for b in masked]) for k in masked[0]}


@requires_shared
def test_random_replacements_are_tokens_of_the_vocabulary_not_rows_of_the_config(tmp_path,
                                                                                 tokenizer):
  """The 10% random replacements are drawn among the records' vocabulary (its size is in each
  record), not up to the config's vocab_size: a 30,522-row config over a smaller vocab drew
  mostly ids no token has. Records without the size (written before it) draw up to the config's."""
  words = len(tokenizer.vocab)
  path, _ = generate(tmp_path, "dynamic.tfrecord", dynamic_masking=True)
  masking = input_pipeline.DynamicMasking(0.15, PREDS, 4 * words)
  original, masked = _unmasked_and_masked(path, masking)

  def replacements(original, masked):
    weights = masked["masked_lm_weights"] > 0
    rows = np.broadcast_to(np.arange(len(original["input_ids"]))[:, None], weights.shape)
    new = masked["input_ids"][rows[weights], masked["masked_lm_positions"][weights]]
    old = original["input_ids"][rows[weights], masked["masked_lm_positions"][weights]]
    return new[(new != tokenizer.vocab["[MASK]"]) & (new != old)]

  drawn = replacements(original, masked)
  assert len(drawn) > 2000 and drawn.max() < words and drawn.min() >= 0
  # Spread over the vocabulary, not a corner of it.
  assert np.histogram(drawn, bins=4, range=(0, words))[0].min() > 0.2 * len(drawn)
  # Without the field (older records), the config's range, as before.
  records = input_pipeline.PretrainingRecords.of_file(path)
  spec = input_pipeline.pretraining_features(SEQ, PREDS, records)
  batch = next(iter(tf.data.TFRecordDataset(path).batch(512).map(
      lambda r: tf.io.parse_example(r, spec))))
  unsized = {k: (tf.zeros_like(v) if k == "vocab_words" else v) for k, v in batch.items()}
  old_masked = {k: v.numpy() for k, v in masking(unsized, tf.constant([1, 2])).items()}
  old_drawn = replacements({k: v.numpy() for k, v in batch.items()}, old_masked)
  assert old_drawn.max() >= words, "the config's rows, 4x the vocabulary here"


@requires_shared
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("whole_word", [False, True])
def test_dynamic_masks_follow_the_generator_rules(tmp_path, tokenizer, packed, whole_word):
  path, stats = generate(tmp_path, "dynamic.tfrecord", dynamic_masking=True,
                         pack_sequences=packed, short_seq_prob=0.1)
  masking = input_pipeline.DynamicMasking(0.15, PREDS, len(tokenizer.vocab), whole_word)
  original, masked = _unmasked_and_masked(path, masking)
  kinds, ids = original["token_kinds"], original["input_ids"]
  instance_ids = original.get("instance_ids", original["input_mask"])
  positions, labels = masked["masked_lm_positions"], masked["masked_lm_ids"]
  weights = masked["masked_lm_weights"] > 0
  rows = np.broadcast_to(np.arange(len(ids))[:, None], positions.shape)
  predicted = np.zeros(ids.shape, bool)
  predicted[rows[weights], positions[weights]] = True
  # Only candidates are predicted ([CLS], [SEP] and padding never), labels are the tokens, and
  # every other token is left as it was.
  assert (kinds[predicted] > 0).all()
  np.testing.assert_array_equal(labels[weights], ids[predicted])
  assert (labels[~weights] == 0).all() and (positions[~weights] == 0).all()
  assert (masked["input_ids"][~predicted] == ids[~predicted]).all()
  # Per instance: the generator's count, min(20, max(1, round(0.15 * length))), capped at its
  # candidates; whole words may leave it short by less than a word.
  for slot in range(1, instance_ids.max() + 1):
    in_slot = instance_ids == slot
    lengths = in_slot.sum(axis=1)
    target = np.minimum(ptd.num_to_predict(lengths, 0.15, PREDS),
                        (in_slot & (kinds > 0)).sum(axis=1)) * (lengths > 0)
    got = (predicted & in_slot).sum(axis=1)
    if whole_word:
      assert (got <= target).all() and (got >= target - 3).all() and (got == target).mean() > 0.9
    else:
      np.testing.assert_array_equal(got, target)
  fraction = predicted.sum() / (kinds > 0).sum()
  assert 0.145 < fraction < 0.16, fraction
  # 80% [MASK], 10% a random token, 10% unchanged.
  new = masked["input_ids"][predicted]
  mask_share = (new == tokenizer.vocab["[MASK]"]).mean()
  kept_share = (new == ids[predicted]).mean()
  assert abs(mask_share - 0.8) < 0.01 and abs(kept_share - 0.1) < 0.01, (mask_share, kept_share)
  assert predicted.sum() > 40000
  if whole_word:
    # A word's pieces are predicted together: a "##" piece exactly when the candidate before it
    # is (the piece before, or, as in the original, the last one before a [SEP]).
    pieces = 0
    for row_kinds, row_predicted in zip(kinds, predicted):
      candidates = np.flatnonzero(row_kinds > 0)
      piece = row_kinds[candidates[1:]] == 2
      np.testing.assert_array_equal(row_predicted[candidates[1:]][piece],
                                    row_predicted[candidates[:-1]][piece])
      pieces += piece.sum()
    assert pieces > 5000


@pytest.mark.slow
@requires_shared
def test_dynamic_masks_are_reproducible_new_each_pass_and_resumable(tmp_path, tokenizer):
  path, _ = generate(tmp_path, "dynamic.tfrecord", dynamic_masking=True, pack_sequences=True,
                     chunk_documents=2, max_seq_length=64, max_predictions_per_seq=10)
  masking = input_pipeline.DynamicMasking(0.15, 10, len(tokenizer.vocab), True)
  records = input_pipeline.PretrainingRecords.of_file(path)
  spec = input_pipeline.pretraining_features(64, 10, records)
  total = sum(1 for _ in tf.data.TFRecordDataset(path))

  def batches(seed, skip=0, count=None):
    ds = input_pipeline.pretraining_dataset([path], spec, 16, True, seed=seed, masking=masking)
    return [{k: v.numpy() for k, v in b.items()}
            for b in ds.skip(skip).take(count or 3 * total // 16)]

  first, again = batches(3), batches(3)
  for a, b in zip(first, again):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  # A run resumed after 7 batches (training.Trainer skips what it has seen) draws the masks the
  # uninterrupted run drew.
  for a, b in zip(first[7:], batches(3, skip=7, count=10)):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  other_seed = batches(4, count=1)[0]
  assert not np.array_equal(first[0]["masked_lm_positions"], other_seed["masked_lm_positions"])
  # Each pass (three here) masks a sequence afresh.
  seen = collections.defaultdict(list)
  for batch in first:
    for row in range(16):
      predicted = batch["masked_lm_weights"][row] > 0
      positions = batch["masked_lm_positions"][row][predicted]
      ids = batch["input_ids"][row].copy()
      ids[positions] = batch["masked_lm_ids"][row][predicted]  # the sequence as written
      seen[tuple(ids) + tuple(batch["instance_ids"][row])].append(tuple(positions))
  repeated = [masks for masks in seen.values() if len(masks) >= 2]
  assert len(repeated) > total // 2
  assert np.mean([len(set(masks)) == len(masks) for masks in repeated]) > 0.9


# --- Packed sequences in the model. --------------------------------------------------------------


def _unpack(features, seq=SEQ, preds=PREDS):
  """A batch of packed sequences -> the batch of their instances, one a row, as the original's
  records hold them (positions relative to the instance, one next-sentence label)."""
  rows = collections.defaultdict(list)
  for ids, segments, label, (positions, labels), _ in instances(features):
    n, k = len(ids), len(positions)
    rows["input_ids"].append(np.pad(ids, (0, seq - n)))
    rows["input_mask"].append(np.pad(np.ones(n, np.int64), (0, seq - n)))
    rows["segment_ids"].append(np.pad(segments, (0, seq - n)))
    rows["masked_lm_positions"].append(np.pad(positions, (0, preds - k)))
    rows["masked_lm_ids"].append(np.pad(labels, (0, preds - k)))
    rows["masked_lm_weights"].append(np.pad(np.ones(k, np.float32), (0, preds - k)))
    rows["next_sentence_labels"].append([label])
  return {k: np.stack(v) for k, v in rows.items()}


@requires_shared
@pytest.mark.parametrize("dynamic", [False, True])
def test_packed_losses_equal_the_losses_of_the_same_instances_unpacked(tmp_path, tokenizer,
                                                                       dynamic):
  # Sentence pairs (masked by the generator); single sentences (masked by the pipeline), which
  # are short enough to make sequences of three instances.
  path, _ = generate(tmp_path, "packed.tfrecord", pack_sequences=True, dynamic_masking=dynamic,
                     short_seq_prob=0.9 if dynamic else 0.5, no_nsp=dynamic)
  if dynamic:
    masking = input_pipeline.DynamicMasking(0.15, PREDS, len(tokenizer.vocab), True)
    packed = next(iter(_masked_batches(path, masking, batch_size=4096)))
    packed = {k: v.numpy() for k, v in packed.items()}
  else:
    packed = read(path)
  # The 32 sequences with the most instances (2 or 3).
  fullest = np.argsort(-packed["instance_ids"].max(axis=1), kind="stable")[:32]
  packed = {k: v[fullest] for k, v in packed.items()}
  unpacked = _unpack(packed)
  assert len(unpacked["input_ids"]) > (80 if dynamic else 60)
  config = modeling.BertConfig(vocab_size=len(tokenizer.vocab), hidden_size=64,
                               num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                               max_position_embeddings=SEQ, type_vocab_size=2)
  tf.random.set_seed(1)
  model = modeling.BertPretrainer(config)
  packed_out = model({k: tf.constant(v) for k, v in packed.items()})
  unpacked_out = model({k: tf.constant(v) for k, v in unpacked.items()})
  packed_losses = modeling.pretraining_losses(packed, packed_out)
  unpacked_losses = modeling.pretraining_losses(unpacked, unpacked_out)
  for name, (total, count) in unpacked_losses.items():
    assert float(packed_losses[name][1]) == float(count) > 0, name
    np.testing.assert_allclose(float(packed_losses[name][0]), float(total), rtol=1e-5,
                               err_msg=name)
  # Prediction by prediction and instance by instance, in the order of the instances.
  weights = packed["masked_lm_weights"].reshape(-1) > 0
  np.testing.assert_allclose(
      packed_out["masked_lm_log_probs"].numpy()[weights],
      unpacked_out["masked_lm_log_probs"].numpy()[unpacked["masked_lm_weights"].reshape(-1) > 0],
      atol=2e-5)
  np.testing.assert_allclose(
      packed_out["next_sentence_log_probs"].numpy()[packed["next_sentence_weights"].reshape(-1)
                                                    > 0],
      unpacked_out["next_sentence_log_probs"].numpy(), atol=2e-5)


def test_packed_positions_and_instance_starts():
  instance_ids = tf.constant([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1],
                              [1, 2, 2, 2, 0, 0, 0, 0]])
  assert modeling.packed_position_ids(instance_ids).numpy().tolist() == [
      [0, 1, 2, 0, 1, 0, 0, 1], list(range(8)), [0, 0, 1, 2, 0, 1, 2, 3]]
  assert modeling.instance_starts(instance_ids, 3).numpy().tolist() == [
      [0, 3, 5], [0, 0, 0], [0, 1, 0]]


# --- run_pretraining. ----------------------------------------------------------------------------


def _pretrain(tmp_path, records, output_dir, steps, *extra):
  config = tmp_path / "bert_config.json"
  config.write_text('{"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, '
                    '"num_attention_heads": 2, "intermediate_size": 64, '
                    '"max_position_embeddings": 64, "type_vocab_size": 2}')
  return ["run_pretraining.py", f"--bert_config_file={config}", f"--input_file={records}",
          f"--output_dir={output_dir}", "--train_batch_size=8", "--max_seq_length=64",
          "--max_predictions_per_seq=10", f"--num_train_steps={steps}", "--num_warmup_steps=2",
          "--learning_rate=1e-3", "--iterations_per_loop=2", "--save_checkpoints_steps=2",
          "--seed=3", "--do_whole_word_mask", *extra]


@requires_shared
def test_run_pretraining_on_packed_unmasked_records_resumes_exactly(tmp_path):
  records, _ = generate(tmp_path, "records.tfrecord", dynamic_masking=True, pack_sequences=True,
                        chunk_documents=2, max_seq_length=64, max_predictions_per_seq=10)
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  steps = 30
  done = run_ok(_pretrain(tmp_path, records, straight, steps, "--do_train", "--do_eval",
                          "--max_eval_steps=2"))
  assert "unmasked (--dynamic_masking), packed, up to 3 instances a sequence" in done.stderr
  kill_at_checkpoint(_pretrain(tmp_path, records, resumed, steps, "--do_train"), resumed, 4)
  assert not os.path.exists(resumed / f"ckpt-{steps}.index")
  assert "Resumed from" in run_ok(_pretrain(tmp_path, records, resumed, steps,
                                            "--do_train")).stderr
  # Same batches, same masks, same dropout: float round-off only.
  assert_same_checkpoints(straight, resumed)
  results = dict(line.split(" = ") for line in
                 (straight / "eval_results.txt").read_text().splitlines())
  assert set(results) == {"global_step", "loss", "masked_lm_accuracy", "masked_lm_loss",
                          "next_sentence_accuracy", "next_sentence_loss"}
  # Records of two kinds are refused, naming both files.
  plain, _ = generate(tmp_path, "plain.tfrecord", chunk_documents=2, max_seq_length=64,
                      max_predictions_per_seq=10)
  failed = run_script(_pretrain(tmp_path, f"{records},{plain}", tmp_path / "mixed", 2,
                                "--do_train"))
  assert failed.returncode == 2 and "Traceback" not in failed.stderr
  assert f"error: {plain} holds records of another kind" in failed.stderr
  assert not os.path.exists(tmp_path / "mixed" / "checkpoint")


@requires_shared
def test_run_pretraining_refuses_masking_flags_that_drop_packed_predictions(tmp_path):
  # The generator packs each sequence to hold the predictions its own --max_predictions_per_seq
  # and --masked_lm_prob make for the instances; fewer a sequence or more an instance here, and
  # the pipeline would drop the last predictions of the fuller sequences without a word.
  records, _ = generate(tmp_path, "records.tfrecord", dynamic_masking=True, pack_sequences=True,
                        chunk_documents=2, max_seq_length=64, max_predictions_per_seq=10)
  kind = input_pipeline.PretrainingRecords.of_file(records)
  assert (kind.max_predictions, kind.masked_lm_prob) == (10, pytest.approx(0.15))
  for flag, message in [
      ("--max_predictions_per_seq=5",
       "--max_predictions_per_seq=5 is below the 10 predictions a sequence "),
      ("--masked_lm_prob=0.2", "--masked_lm_prob=0.2 is above the 0.15 "),
  ]:
    failed = run_script(_pretrain(tmp_path, records, tmp_path / "out", 2, "--do_train", flag))
    assert failed.returncode == 2, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: " + message) and str(records) in last, last
    assert "Traceback" not in failed.stderr
    assert not os.path.exists(tmp_path / "out")


@requires_shared
def test_a_config_larger_or_smaller_than_the_records_vocabulary_is_named(tmp_path, tokenizer,
                                                                          monkeypatch):
  """Dynamic records say the size of the vocabulary they were written with: run_pretraining
  refuses a config with fewer rows and warns, naming both sizes, about one with more (the stock
  30,522-row config over a smaller vocab trained rows no token has, silently)."""
  run_pretraining = import_script("run_pretraining")
  path, _ = generate(tmp_path, "dynamic.tfrecord", dynamic_masking=True)
  records = input_pipeline.PretrainingRecords.of_file(path)
  words = len(tokenizer.vocab)
  assert records.vocab_words == words
  warnings = []
  monkeypatch.setattr(run_pretraining.logging, "warning",
                      lambda fmt, *args: warnings.append(fmt % args))

  def config(vocab_size):
    return modeling.BertConfig(vocab_size=vocab_size, hidden_size=8, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=16)

  run_pretraining.check_vocab_size(records, config(words), path, "c.json")
  assert warnings == []
  run_pretraining.check_vocab_size(records, config(words + 500), path, "c.json")
  assert warnings == [f"c.json: vocab_size={words + 500}, but the records were written with a "
                      f"vocabulary of {words} tokens: 500 embedding rows and output classes will "
                      f"never be used; set vocab_size to {words} for a model of this vocabulary"]
  with pytest.raises(fileio.InputError, match=f"{path}: written with a vocabulary of {words} "
                     f"tokens, more than vocab_size={words - 1} of c.json"):
    run_pretraining.check_vocab_size(records, config(words - 1), path, "c.json")
  # Masked records (the original's) do not say: nothing to check.
  classic, _ = generate(tmp_path, "classic.tfrecord")
  run_pretraining.check_vocab_size(input_pipeline.PretrainingRecords.of_file(classic),
                                   config(words + 500), classic, "c.json")
  assert len(warnings) == 1


def _split_shares(inputs, labels, positions, weights, mask_id):
  """The shares of the real predictions whose input is [MASK], another token, or the label."""
  rows = np.broadcast_to(np.arange(len(inputs))[:, None], weights.shape)
  real = weights > 0
  seen = inputs[rows[real], positions[real]]
  label = labels[real]
  masked = seen == mask_id
  kept = ~masked & (seen == label)
  return np.array([masked.mean(), (~masked & ~kept).mean(), kept.mean()])


@requires_shared
@pytest.mark.parametrize("split", ["100,0,0", "50,50,0", "80,10,10"])
def test_mask_split_sets_what_predictions_become_in_every_masking_path(tmp_path, tokenizer,
                                                                       split):
  """--mask_split=MASK,RANDOM,KEEP (percent) in exact mode's static masks, fast mode's and
  run_pretraining's dynamic ones: the shares of [MASK], random and kept inputs at the predicted
  positions are the split's (within sampling error; 0 exactly where it says 0). BERT's 80,10,10
  stays the default, and exact mode's records at it stay the original's (its byte-identity tests).
  A malformed split, and one given to --dynamic_masking records' generator, are one line."""
  from bert_tf2 import masking  # pylint: disable=g-import-not-at-top
  want = np.array([int(p) for p in split.split(",")]) / 100
  mask_id = tokenizer.vocab["[MASK]"]
  shares = {}
  for mode in ("exact", "fast"):
    path, _ = generate(tmp_path, f"{mode}.tfrecord", mode=mode, mask_split=split)
    records = read(path)
    shares[mode] = _split_shares(records["input_ids"], records["masked_lm_ids"],
                                 records["masked_lm_positions"], records["masked_lm_weights"],
                                 mask_id)
  path, _ = generate(tmp_path, "dynamic.tfrecord", dynamic_masking=True)
  dynamic = input_pipeline.DynamicMasking(0.15, PREDS, len(tokenizer.vocab),
                                          split=masking.MaskSplit.parse(split))
  original, masked = _unmasked_and_masked(path, dynamic)
  del original
  shares["dynamic"] = _split_shares(masked["input_ids"], masked["masked_lm_ids"],
                                    masked["masked_lm_positions"], masked["masked_lm_weights"],
                                    mask_id)
  for where, got in shares.items():
    # A random replacement is its own label 1 time in ~30,000: within the tolerance.
    np.testing.assert_allclose(got, want, atol=0.02, err_msg=where)
    assert all(got[i] == 0 for i in (0, 1) if want[i] == 0), (where, got)
  assert masking.MaskSplit() == masking.MaskSplit.parse(masking.DEFAULT)
  for bad, message in (("80,10", "give MASK,RANDOM,KEEP"), ("80,10,5", "the three percentages sum to 95, not 100"),
                       ("0.8,0.1,0.1", "give MASK,RANDOM,KEEP")):
    with pytest.raises(fileio.InputError, match=f"--mask_split={bad}: {message}"):
      masking.MaskSplit.parse(bad)
  with pytest.raises(fileio.InputError, match="--mask_split=100,0,0 with --dynamic_masking"):
    generate(tmp_path, "refused.tfrecord", dynamic_masking=True, mask_split="100,0,0")
