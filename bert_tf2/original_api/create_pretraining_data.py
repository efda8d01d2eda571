"""The original's `create_pretraining_data` library (google-research/bert's
create_pretraining_data.py) on the project's code.

`create_training_instances(input_files, tokenizer, ..., rng)` reads and tokenizes the documents,
splits them into sentence pairs and masks them with the project's functions of exact mode
(bert_tf2/pretraining_data.py), drawing from the caller's `rng` exactly as the original drew: the
same `random.Random(seed)` gives the original's instances, in its order, and leaves `rng` in the
same state. `write_instance_to_example_files` writes them as the original's records, round robin
over the output files (bert_tf2/tfrecord_io.py). The instances hold token strings, as the
original's; the project's own code works on ids.

The original read `--do_whole_word_mask` from its flags inside create_masked_lm_predictions; here
it is a keyword argument (default False, the flag's default) of the functions that mask.
"""

import collections
import dataclasses

from absl import logging
import numpy as np

from bert_tf2 import pretraining_data
from bert_tf2 import tfrecord_io
from bert_tf2 import tokenization

__all__ = ["TrainingInstance", "MaskedLmInstance", "write_instance_to_example_files",
           "create_int_feature", "create_float_feature", "create_training_instances",
           "create_instances_from_document", "create_masked_lm_predictions",
           "truncate_seq_pair"]

# tf.train.Feature builders (TensorFlow is imported when one is called).
create_int_feature = tfrecord_io.int64_feature
create_float_feature = tfrecord_io.float_feature
# A masked position and the token it held, as the original's masking collects them.
MaskedLmInstance = collections.namedtuple("MaskedLmInstance", ["index", "label"])


@dataclasses.dataclass(repr=False)
class TrainingInstance:
  """One sentence-pair instance, masked: its tokens ([CLS] A [SEP] B [SEP], masked tokens
  replaced), segment ids (0 up to the first [SEP], 1 after), the masked positions (ascending)
  with the tokens they held, and whether B came from another document."""

  tokens: list
  segment_ids: list
  masked_lm_positions: list
  masked_lm_labels: list
  is_random_next: bool

  def __str__(self):
    # The original's text: one "name: values" line per field, then a blank line.
    def line(name, values):
      return f"{name}: {' '.join(map(str, values))}\n"
    return (line("tokens", map(tokenization.printable_text, self.tokens)) +
            line("segment_ids", self.segment_ids) +
            f"is_random_next: {self.is_random_next}\n" +
            line("masked_lm_positions", self.masked_lm_positions) +
            line("masked_lm_labels", map(tokenization.printable_text, self.masked_lm_labels)) +
            "\n")

  def __repr__(self):
    return str(self)


class _Draws(pretraining_data.ExactRandom):
  """ExactRandom's methods over the caller's random.Random: the original's draws, from its
  stream (ExactRandom reproduces random(), randint() and shuffle() draw for draw)."""

  def __init__(self, rng):  # pylint: disable=super-init-not-called
    self._rng = rng
    self.random = rng.random
    self.getrandbits = rng.getrandbits


def _draws(rng):
  return rng if isinstance(rng, pretraining_data.ExactRandom) else _Draws(rng)


def _instances(corpus, document_index, max_seq_length, short_seq_prob, masked_lm_prob,
               max_predictions_per_seq, vocab_ids, rng, to_tokens, do_whole_word_mask):
  """One document's TrainingInstances: each pair split, then masked, before the next split is
  drawn (exact mode's order of draws, pretraining_data.create_exact_records)."""
  instances = []
  for instance in pretraining_data.create_instances_from_document(
      corpus.documents, document_index, max_seq_length, short_seq_prob, rng):
    ids, segment_a_length = pretraining_data.instance_tokens(corpus.tokens, instance, vocab_ids)
    masked, positions, labels = pretraining_data.create_masked_lm_predictions(
        ids, masked_lm_prob, max_predictions_per_seq, vocab_ids, rng, do_whole_word_mask)
    segment_ids = [0] * segment_a_length + [1] * (len(ids) - segment_a_length)
    instances.append(TrainingInstance(to_tokens(masked), segment_ids, positions,
                                      to_tokens(labels), instance[4]))
  return instances


def create_training_instances(input_files, tokenizer, max_seq_length, dupe_factor,
                              short_seq_prob, masked_lm_prob, max_predictions_per_seq, rng,
                              do_whole_word_mask=False):
  """The TrainingInstances of the text files (one sentence a line, a blank line between
  documents), as the original makes them with `rng`: documents shuffled, `dupe_factor` passes of
  splitting and masking each, then the instances shuffled."""
  pretraining_data.check_vocab(tokenizer.vocab,
                               getattr(tokenizer, "vocab_file", None) or "of the tokenizer")
  vocab_ids = pretraining_data.VocabIds(tokenizer.vocab)
  corpus = pretraining_data.read_corpus(list(input_files), tokenizer)
  rng = _draws(rng)
  rng.shuffle(corpus.documents)
  instances = []
  for _ in range(dupe_factor):
    for document_index in range(len(corpus.documents)):
      instances += _instances(corpus, document_index, max_seq_length, short_seq_prob,
                              masked_lm_prob, max_predictions_per_seq, vocab_ids, rng,
                              tokenizer.convert_ids_to_tokens, do_whole_word_mask)
  rng.shuffle(instances)
  return instances


class _TokenIds:
  """Token strings <-> ids for the functions given tokens and the original's `vocab_words`
  rather than a tokenizer: word i of vocab_words is id i (the random word is drawn over those),
  then the special tokens and the given tokens not among them."""

  def __init__(self, vocab_words, token_lists):
    if not vocab_words:
      raise ValueError("vocab_words is empty: a masked position may take a random word of it")
    self.words = list(vocab_words)
    # Words of list(vocab.keys()) are distinct; were one listed twice, both ids would name it.
    self.ids = {word: i for i, word in enumerate(self.words)}
    for token in ["[CLS]", "[SEP]", "[MASK]", *(t for tokens in token_lists for t in tokens)]:
      if token not in self.ids:
        self.ids[token] = len(self.words)
        self.words.append(token)
    self.vocab_ids = pretraining_data.VocabIds(self.ids)
    self.vocab_ids.word_ids = list(range(len(vocab_words)))
    self.vocab_ids.word_ids_array = np.arange(len(vocab_words), dtype=np.int32)

  def to_ids(self, tokens):
    return [self.ids[token] for token in tokens]

  def to_tokens(self, ids):
    return [self.words[i] for i in ids]


def create_instances_from_document(all_documents, document_index, max_seq_length,
                                   short_seq_prob, masked_lm_prob, max_predictions_per_seq,
                                   vocab_words, rng, do_whole_word_mask=False):
  """The TrainingInstances of one document of `all_documents` (documents as lists of sentences,
  sentences as lists of tokens), with the original's draws from `rng`."""
  if not all(all_documents):
    # The original removes them first (and would fail drawing from one).
    raise ValueError("all_documents holds an empty document")
  sentences = [sentence for document in all_documents for sentence in document]
  token_ids = _TokenIds(vocab_words, sentences)
  corpus = pretraining_data.Corpus()
  corpus.add_documents([[token_ids.to_ids(s) for s in document] for document in all_documents])
  return _instances(corpus, document_index, max_seq_length, short_seq_prob, masked_lm_prob,
                    max_predictions_per_seq, token_ids.vocab_ids, _draws(rng),
                    token_ids.to_tokens, do_whole_word_mask)


def create_masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab_words,
                                 rng, do_whole_word_mask=False):
  """(masked tokens, masked positions, the tokens they held) of one instance's tokens, with the
  original's draws from `rng`: [CLS] and [SEP] are never masked, a masked position becomes
  [MASK] 80% of the time, a random word of `vocab_words` 10%, stays 10%."""
  token_ids = _TokenIds(vocab_words, [tokens])
  masked, positions, labels = pretraining_data.create_masked_lm_predictions(
      token_ids.to_ids(tokens), masked_lm_prob, max_predictions_per_seq, token_ids.vocab_ids,
      _draws(rng), do_whole_word_mask)
  return token_ids.to_tokens(masked), positions, token_ids.to_tokens(labels)


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  """Cuts the two lists in place to `max_num_tokens` tokens in all: one token at a time from the
  longer (B on a tie), from its front or back at random (one rng.random() each)."""
  a_start, a_end, b_start, b_end = pretraining_data.truncate_seq_pair(
      0, len(tokens_a), 0, len(tokens_b), max_num_tokens, rng)
  tokens_a[:] = tokens_a[a_start:a_end]
  tokens_b[:] = tokens_b[b_start:b_end]


def _segment_a_length(instance):
  """Where segment B starts; ValueError for segment ids that are not 0s then 1s (the records
  hold segment ids in that form only)."""
  length = instance.segment_ids.count(0)
  if list(instance.segment_ids) != [0] * length + [1] * (len(instance.segment_ids) - length):
    raise ValueError(f"segment_ids must be 0s then 1s, got {instance.segment_ids}")
  return length


def write_instance_to_example_files(instances, tokenizer, max_seq_length,
                                    max_predictions_per_seq, output_files):
  """Writes the instances as the original's tf.train.Examples (input_ids, input_mask,
  segment_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights, next_sentence_labels,
  zero-padded), one file of `output_files` after the other in turn. Each file appears under its
  name only once complete. Returns how many were written."""
  encoder = tfrecord_io.ExampleEncoder(max_seq_length, max_predictions_per_seq,
                                       max(tokenizer.vocab.values()) + 1)

  def records():
    for instance in instances:
      # The original asserted these; the encoder needs them to pad.
      if len(instance.tokens) > max_seq_length or len(instance.segment_ids) != len(
          instance.tokens):
        raise ValueError(f"an instance of {len(instance.tokens)} tokens and "
                         f"{len(instance.segment_ids)} segment ids for max_seq_length="
                         f"{max_seq_length}")
      if len(instance.masked_lm_positions) > max_predictions_per_seq:
        raise ValueError(f"an instance of {len(instance.masked_lm_positions)} masked positions "
                         f"for max_predictions_per_seq={max_predictions_per_seq}")
      yield encoder.encode(tokenizer.convert_tokens_to_ids(instance.tokens),
                           _segment_a_length(instance), list(instance.masked_lm_positions),
                           tokenizer.convert_tokens_to_ids(instance.masked_lm_labels),
                           instance.is_random_next)

  count = tfrecord_io.write_sharded(records(), list(output_files))
  logging.info("Wrote %d total instances", count)
  return count
