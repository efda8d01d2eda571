"""Creates BERT pre-training examples (masked LM + next sentence prediction) as TFRecord files.

The input is plain text with one sentence per line and a blank line between documents: sentence
boundaries decide where segment A may end and segment B begin, and document boundaries keep the
"actual next" segment inside one document. Each record holds the features run_pretraining reads:
input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights (float)
and next_sentence_labels (1 = segment B was taken from a random document).

Two modes, chosen with --mode:

* exact (default) writes the records google-research/bert's create_pretraining_data.py writes for
  the same flags and input: same records, same order, same values. That script draws everything
  from one `random.Random(random_seed)` (document shuffle, then per duplicate and document the
  target lengths, segment splits, random documents, truncation sides and masks, then a shuffle of
  all instances), so this mode draws from the same stream in the same order. It is therefore
  sequential and keeps the corpus in memory, but as token ids and encoded records rather than
  Python strings, it tokenizes with the batch tokenizer and it encodes records without building
  protos, which makes it several times faster and many times leaner than the original.
* fast is for real corpora. The input is streamed in chunks of --chunk_documents documents; each
  chunk is tokenized, turned into instances and masked in one of --num_workers processes, with
  random generators seeded from --random_seed and the chunk's index, so the output depends on the
  seed but not on the number of workers. Records then pass through a bounded shuffle buffer that
  mixes chunks before they are written round-robin to the output shards. Memory depends on the
  chunk size, the number of workers and the buffer size, never on the corpus size. It differs from
  exact mode in ways that do not change what the model learns: documents end at the end of each
  input file (and are cut every 8 MiB), the random "next" segment comes from the same chunk,
  instances are shuffled within a chunk and the buffer rather than globally, and the random
  choices follow the same distributions with other draws (numpy for masking, closed-form
  truncation), which lets a whole batch of instances be assembled, masked and encoded at once.

With --beam_pipeline_options, fast mode runs as an Apache Beam pipeline (on Dataflow, Flink,
Spark or Beam's local runner) that writes the same multiset of records as the local run: the same
chunks from the same reader, turned into records by the same process_chunk (see "Fast mode as an
Apache Beam pipeline" below).

Beyond the original, --no_nsp writes single-segment [CLS] A [SEP] instances for MLM-only
pre-training (next_sentence_labels is still written, as 0, so every reader keeps working).

Fast mode has two more options, which run_pretraining recognizes from the records' features:

* --dynamic_masking writes the instances unmasked, with what masking needs: token_kinds (per
  token 0 = never masked: [CLS], [SEP], padding; 1 = a word's first WordPiece; 2 = a "##" piece
  of the word before) and mask_token_id; run_pretraining masks them afresh each time it reads
  them (RoBERTa's dynamic masking) with the same rules (input_pipeline.DynamicMasking).
* --pack_sequences puts several instances into one max_seq_length sequence (best fit, longest
  first, within a batch of a chunk's instances), so that short instances no longer leave most of
  a sequence as padding. instance_ids (per token 1, 2, ... for the instances, 0 for padding)
  keeps them apart: the model attends only within an instance and restarts positions for each.
  next_sentence_labels and next_sentence_weights have --max_instances_per_pack slots (weight 0
  for an unused one); masked-LM positions are in the packed sequence, at most
  --max_predictions_per_seq for the whole pack. Packing draws no random number: the same seed
  gives the same (masked) instances packed or not. Packed unmasked records also hold the
  max_predictions_per_seq and masked_lm_prob they were packed for, which run_pretraining's own
  flags must not outgrow.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import bisect
import collections
import concurrent.futures
import contextlib
import dataclasses
import io
import itertools
import logging as std_logging
import multiprocessing
import os
import random
import re
import secrets
import shlex
import signal
import struct
import sys
import threading
import time

from absl import flags
from absl import logging
import numpy as np

from bert_tf2 import script_flags
from bert_tf2 import tfrecord_io
from bert_tf2 import tokenization

FLAGS = flags.FLAGS

# Fast mode keeps a chunk (and a document) below this many bytes of text, so one huge document
# or a file without blank lines cannot make a worker's memory grow with the corpus.
_MAX_CHUNK_BYTES = 8 << 20

# Exact mode tokenizes this many documents per batch call (bounded transient memory), in worker
# processes only for inputs of at least this many bytes (starting them takes seconds).
_TOKENIZE_BATCH_DOCUMENTS = 2000
_PARALLEL_TOKENIZE_MIN_BYTES = 16 << 20
# Fast mode with the default --num_workers works in-process below this input size: starting the
# workers costs more than they save there (on 2 cores, 4.3 MB: 2.6 s in-process, 3.0 s with two
# workers; 13 MB: 7.3 s and 6.2 s). The output is the same either way.
_PARALLEL_FAST_MIN_BYTES = 8 << 20


def define_flags():
  """Defines the script's flags.

  They are defined when the script runs, not at import: the tests and benchmarks import this
  module's readers, maskers and writers without its flags.
  """
  script_flags.define_input_file_flag()
  script_flags.define_output_file_flag()
  script_flags.define_text_flags()
  script_flags.define_masking_flags()
  script_flags.define_max_seq_length(128, minimum=5)
  script_flags.define_max_predictions_flag()
  flags.DEFINE_integer("random_seed", 12345, "Random seed for data generation.")
  flags.DEFINE_integer(
      "dupe_factor", 10,
      "Number of times to go over the input, each time with different splits and masks.",
      lower_bound=1)
  flags.DEFINE_float(
      "short_seq_prob", 0.1,
      "Probability of a document aiming at a random length shorter than the maximum.",
      lower_bound=0.0, upper_bound=1.0)
  flags.DEFINE_enum(
      "mode", "exact", ["exact", "fast"],
      "exact: the original script's records, in its order, from one random stream (sequential, "
      "corpus held in memory). fast: streaming, parallel and bounded in memory, for large "
      "corpora; deterministic for a seed whatever --num_workers is (see the module docstring).")
  flags.DEFINE_bool(
      "no_nsp", False,
      "Write single-segment [CLS] A [SEP] instances for MLM-only pre-training; "
      "next_sentence_labels is written as 0.")
  flags.DEFINE_integer(
      "num_workers", 0,
      "Processes that tokenize and (in fast mode) create instances; 0 = one per CPU (in-process "
      "for inputs under 8 MB in fast mode, 16 MB in exact mode, where starting workers costs "
      "more than they save). The output is the same for any value.", lower_bound=0)
  flags.DEFINE_integer(
      "chunk_documents", 1000,
      "Fast mode: documents per chunk. A chunk is the unit of work and of document shuffling, "
      "and random next segments are drawn from it, so it should hold many documents.",
      lower_bound=1)
  flags.DEFINE_integer(
      "shuffle_buffer_size", 20000,
      "Fast mode: records held in the buffer that mixes records of different chunks before "
      "writing (0 = write in chunk order); a record is about 0.8 KB at --max_seq_length=128.",
      lower_bound=0)
  flags.DEFINE_integer(
      "num_output_shards", 8,
      "Number of files when --output_file is a {shard} pattern or a directory.", lower_bound=1)
  flags.DEFINE_float("progress_seconds", 30, "Seconds between progress log lines.",
                     lower_bound=0.0)
  flags.DEFINE_bool(
      "dynamic_masking", False,
      "Fast mode: write unmasked instances, with the word starts whole-word masking needs; "
      "run_pretraining masks them anew every time it reads them (with its --masked_lm_prob, "
      "--max_predictions_per_seq and --do_whole_word_mask). Use with --dupe_factor=1.")
  flags.DEFINE_bool(
      "pack_sequences", False,
      "Fast mode: pack several instances into each sequence (attention stays within an "
      "instance; one next-sentence prediction per instance) instead of padding short ones.")
  flags.DEFINE_integer(
      "max_instances_per_pack", 3,
      "With --pack_sequences: instances per sequence at most, 2 or more (next-sentence slots "
      "per record).",
      lower_bound=1)
  flags.DEFINE_string(
      "beam_pipeline_options", "",
      "Fast mode: run as an Apache Beam pipeline with these pipeline options, either "
      "comma-separated name=value pairs (runner=DataflowRunner,project=P,...) or Beam's own "
      "command-line form in one string (\"--runner=FnApiRunner --direct_num_workers=2\"). "
      "Without a runner: FnApiRunner, Beam's in-process local runner. Needs `pip install -r "
      "requirements-beam.txt`; the records are the same multiset as without the flag.")


@dataclasses.dataclass
class Options:
  """Everything a run depends on: the flags as plain values, so tests and workers need no FLAGS."""
  input_file: str
  output_file: str
  vocab_file: str
  do_lower_case: bool = True
  do_whole_word_mask: bool = False
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20
  random_seed: int = 12345
  dupe_factor: int = 10
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1
  mode: str = "exact"
  no_nsp: bool = False
  num_workers: int = 0
  chunk_documents: int = 1000
  shuffle_buffer_size: int = 20000
  num_output_shards: int = 8
  progress_seconds: float = 30
  dynamic_masking: bool = False
  pack_sequences: bool = False
  max_instances_per_pack: int = 3
  beam_pipeline_options: str = ""


def validate_options(options):
  """Raises InputError naming the flag for values the algorithm cannot honour."""
  if options.mode not in ("exact", "fast"):
    raise fileio.InputError(f"--mode must be exact or fast, got {options.mode!r}")
  if options.max_seq_length < 5:
    raise fileio.InputError(
        f"--max_seq_length={options.max_seq_length} is too small: an instance needs [CLS], "
        f"[SEP], [SEP] and at least one token per segment (use at least 5)")
  if not 1 <= options.max_predictions_per_seq <= options.max_seq_length:
    raise fileio.InputError(
        f"--max_predictions_per_seq={options.max_predictions_per_seq} must be between 1 and "
        f"--max_seq_length={options.max_seq_length}")
  if not 0.0 < options.masked_lm_prob <= 1.0:
    raise fileio.InputError(
        f"--masked_lm_prob={options.masked_lm_prob} must be in (0, 1] (0.15 in BERT)")
  if not 0.0 <= options.short_seq_prob <= 1.0:
    raise fileio.InputError(f"--short_seq_prob={options.short_seq_prob} must be in [0, 1]")
  if options.dupe_factor < 1:
    raise fileio.InputError(f"--dupe_factor={options.dupe_factor} must be at least 1")
  if options.num_workers < 0:
    raise fileio.InputError(f"--num_workers={options.num_workers} must be 0 (one per CPU) or more")
  if options.chunk_documents < 1:
    raise fileio.InputError(f"--chunk_documents={options.chunk_documents} must be at least 1")
  if options.shuffle_buffer_size < 0:
    raise fileio.InputError(
        f"--shuffle_buffer_size={options.shuffle_buffer_size} must be 0 or more")
  if options.num_output_shards < 1:
    raise fileio.InputError(f"--num_output_shards={options.num_output_shards} must be at least 1")
  for name in ("dynamic_masking", "pack_sequences"):
    if getattr(options, name) and options.mode != "fast":
      raise fileio.InputError(
          f"--{name} needs --mode=fast (--mode={options.mode} writes the original's records, "
          "which are masked once and hold one instance each)")
  if options.max_instances_per_pack < 1:
    raise fileio.InputError(
        f"--max_instances_per_pack={options.max_instances_per_pack} must be at least 1")
  if options.pack_sequences and options.max_instances_per_pack == 1:
    # Refused rather than honoured: the padded records of the packed kind, with nothing gained.
    raise fileio.InputError(
        "--max_instances_per_pack=1 packs nothing (one instance a sequence, padded as without "
        "packing); use 2 or more, or leave out --pack_sequences")
  if options.beam_pipeline_options and options.mode != "fast":
    raise fileio.InputError(
        f"--beam_pipeline_options runs fast mode; add --mode=fast (--mode={options.mode} draws "
        f"every record from one random stream, in one process)")


def resolve_output_files(output_file, num_output_shards):
  """--output_file (a comma list, a {shard} pattern or a directory) -> list of output paths."""
  if not output_file or not output_file.strip(" ,"):
    raise fileio.InputError("no --output_file given")
  if "{" in output_file:
    try:
      return [output_file.format(shard=i, num_shards=num_output_shards)
              for i in range(num_output_shards)]
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
      raise fileio.InputError(
          f"--output_file={output_file}: a pattern may only use the fields {{shard}} and "
          f"{{num_shards}} (e.g. {{shard:05d}}): {e!r}") from None
  if output_file.endswith(("/", os.sep)) or os.path.isdir(output_file):
    return [os.path.join(output_file, f"pretraining-{i:05d}-of-{num_output_shards:05d}.tfrecord")
            for i in range(num_output_shards)]
  return [path.strip() for path in output_file.split(",") if path.strip()]


class VocabIds:
  """The vocab facts instance creation needs, as ids, so instances never hold token strings."""

  def __init__(self, vocab):
    self.cls_id = vocab["[CLS]"]
    self.sep_id = vocab["[SEP]"]
    self.mask_id = vocab["[MASK]"]
    # The original replaces with `list(vocab.keys())[randint(...)]`; a token listed twice in the
    # vocab file is one key with its last id, so the draw is over keys, mapped to their ids.
    self.word_ids = [vocab[word] for word in vocab]
    self.word_ids_array = np.asarray(self.word_ids, dtype=np.int32)
    self.size = max(vocab.values()) + 1
    # Whole-word masking joins a "##" WordPiece to the word before it.
    self.is_subword = bytearray(self.size)
    for word, token_id in vocab.items():
      if word.startswith("##"):
        self.is_subword[token_id] = 1


# (i, bit_length(i + 1)) for the shuffle's steps: looked up rather than computed in its loop.
_SHUFFLE_STEPS = [(i, (i + 1).bit_length()) for i in range(4096)]


class ExactRandom:
  """Python's random.Random draws, reproduced draw for draw, with less call overhead.

  Exact mode has to consume the Mersenne Twister stream exactly as the original's calls did:
  random(); randint(a, b), which is a + randbelow(b - a + 1); shuffle, a Fisher-Yates pass from
  the back. CPython's randbelow(n) takes n.bit_length() bits per try and retries values >= n
  (randbelow(1) too). The library methods spend most of their time checking arguments and
  dispatching; these run the same loop inline, which makes the per-instance shuffle (the bulk of
  exact mode's work) two to three times faster. A test checks them against random.Random itself.
  """

  def __init__(self, seed):
    self._rng = random.Random(seed)
    self.random = self._rng.random
    self.getrandbits = self._rng.getrandbits

  def randbelow(self, n):
    k = n.bit_length()
    r = self.getrandbits(k)
    while r >= n:
      r = self.getrandbits(k)
    return r

  def randint(self, low, high):
    return low + self.randbelow(high - low + 1)

  def shuffle(self, items, keep=None):
    """random.shuffle(items). With `keep`, only items[:keep] end up as random.shuffle leaves
    them (the draws are the same): a step that finalizes a later position then need not write it,
    which saves a third of the work when only a few shuffled items are used."""
    getrandbits = self.getrandbits
    n = len(items)
    if n > len(_SHUFFLE_STEPS):
      steps = [(i, (i + 1).bit_length()) for i in range(n)]
    else:
      steps = _SHUFFLE_STEPS
    keep = n if keep is None else max(1, min(keep, n))
    for i, k in reversed(steps[keep:n]):
      j = getrandbits(k)
      while j > i:
        j = getrandbits(k)
      items[j] = items[i]
    for i, k in reversed(steps[1:keep]):
      j = getrandbits(k)
      while j > i:
        j = getrandbits(k)
      items[i], items[j] = items[j], items[i]


# ---------------------------------------------------------------------------------------------
# Reading documents.


def iter_document_lines(input_files, end_document_at_file_end=False, max_document_bytes=None,
                        opener=None, spans=False):
  """Yields (lines, nbytes) per document: its non-blank lines, stripped, and the bytes consumed.

  A blank (or all-whitespace) line ends a document. As in the original, a document otherwise
  continues from one file into the next unless `end_document_at_file_end`; `max_document_bytes`
  cuts longer documents so a file without blank lines still arrives in bounded pieces. `opener`
  opens files elsewhere than on the local disk (see fileio.read_lines).

  With `spans` (and `end_document_at_file_end`) a document comes as (lines, nbytes, span): span is
  (path, start byte, its line number, end byte), from the end of the document before it in its
  file to the end of its own last line. An input may be such a span instead of a path: reading
  the spans of consecutive documents gives the same documents back.
  """
  assert end_document_at_file_end or not spans, "a document's span lies in one file"
  lines = []
  nbytes = 0
  size = 0
  for source in input_files:
    path, span = (source[0], source[1:]) if isinstance(source, tuple) else (source, (0, 1, None))
    begin = span[:2]  # where the next document's span starts
    for number, text, end in fileio.read_lines(path, opener, span):
      length = len(text.encode("utf-8")) + 1
      nbytes += length
      text = text.strip()
      if not text:
        if lines:
          yield (lines, nbytes, (path, *begin, end)) if spans else (lines, nbytes)
          lines, nbytes, size, begin = [], 0, 0, (end, number + 1)
        continue
      lines.append(text)
      size += length
      if max_document_bytes and size >= max_document_bytes:
        yield (lines, nbytes, (path, *begin, end)) if spans else (lines, nbytes)
        lines, nbytes, size, begin = [], 0, 0, (end, number + 1)
    if end_document_at_file_end and lines:
      yield (lines, nbytes, (path, *begin, end)) if spans else (lines, nbytes)
      lines, nbytes, size = [], 0, 0
  if lines:
    yield lines, nbytes


def encode_lines(tokenizer, lines):
  """Lines -> lists of token ids, through the batch tokenizer when there is one.

  The batch path gives the same ids as tokenize() and the vocab one line at a time, only faster.
  """
  encode_batch = getattr(tokenizer, "encode_batch", None)
  if encode_batch is not None:
    return encode_batch(lines)
  vocab = tokenizer.vocab
  return [[vocab[token] for token in tokenizer.tokenize(line)] for line in lines]


def tokenize_documents(tokenizer, line_documents):
  """Documents of text lines -> documents of token-id sentences (lists of ints).

  Sentences without tokens are dropped, then documents without sentences, as in the original.
  Lists rather than arrays: instance creation copies ids out of them at list speed, and the batch
  tokenizer's ids are shared int objects, so a token costs about one 8-byte reference.
  """
  flat = [line for lines in line_documents for line in lines]
  encoded = iter(encode_lines(tokenizer, flat))
  documents = []
  for lines in line_documents:
    sentences = [ids for ids in itertools.islice(encoded, len(lines)) if ids]
    if sentences:
      documents.append(sentences)
  return documents


def read_corpus(input_files, tokenizer, pool=None, window=4, progress=None):
  """Reads and tokenizes every document of `input_files` in order into a Corpus, as the original.

  Tokenizing is the only part of exact mode that can run in parallel (it draws no random
  numbers), so with a `pool` (see worker_pool) batches of documents are tokenized in worker
  processes, at most `window` batches at a time, and collected in order.
  """
  corpus = Corpus()
  batches = _batched(iter_document_lines(input_files), _TOKENIZE_BATCH_DOCUMENTS)
  if pool is None:
    results = ((tokenize_documents(tokenizer, [lines for lines, _ in batch]),
                sum(n for _, n in batch)) for batch in batches)
  else:
    tasks = (([lines for lines, _ in batch], sum(n for _, n in batch)) for batch in batches)
    results = ordered_map(pool, _tokenize_task, tasks, window)
  done = 0
  for documents, nbytes in results:
    corpus.add_documents(documents)
    done += nbytes
    if progress:
      progress.update(done, f"{len(corpus.documents)} documents")
  return corpus


def _batched(iterable, size):
  iterator = iter(iterable)
  while batch := list(itertools.islice(iterator, size)):
    yield batch


# ---------------------------------------------------------------------------------------------
# Creating instances (before masking): which sentences form segments A and B.


class Corpus:
  """Token ids of many documents in one flat list, each document a list of sentence boundaries.

  Sentence j of document d is tokens[documents[d][j]:documents[d][j + 1]]. Segments A and B are
  runs of consecutive sentences, so every instance is two spans of `tokens`: instance creation
  moves offsets around and copies tokens only once, into the final sequence (exact mode slices
  the list, fast mode gathers a whole batch from it with numpy). The flat list also costs one
  reference per token instead of a list object per sentence.
  """

  def __init__(self):
    self.tokens = []
    self.documents = []

  def add_documents(self, documents):
    """Appends documents given as lists of sentences (lists of ids)."""
    tokens = self.tokens
    for sentences in documents:
      bounds = [len(tokens)]
      for sentence in sentences:
        tokens.extend(sentence)
        bounds.append(len(tokens))
      self.documents.append(bounds)


def truncate_seq_pair(a_start, a_end, b_start, b_end, max_num_tokens, rng):
  """Cuts the spans [a_start, a_end) and [b_start, b_end) to max_num_tokens tokens in all.

  One token at a time leaves the longer segment (B on a tie), from the front or the back at
  random: always cutting the back would teach the model that segments end mid-sentence only at
  one side. Returns the kept spans; the draws are the original's, one per token removed.
  """
  while (a_end - a_start) + (b_end - b_start) > max_num_tokens:
    if a_end - a_start > b_end - b_start:
      if rng.random() < 0.5:
        a_start += 1
      else:
        a_end -= 1
    else:
      if rng.random() < 0.5:
        b_start += 1
      else:
        b_end -= 1
  return a_start, a_end, b_start, b_end


def truncate_seq_pair_fast(a_start, a_end, b_start, b_end, max_num_tokens, rng):
  """truncate_seq_pair's result distribution in constant time (fast mode).

  The loop's final lengths do not depend on the draws: the longer segment loses tokens until the
  two are even, then they lose one each in turn, B first. Which of a segment's removed tokens
  come from the front is binomial(removed, 1/2): the number of set bits in as many random bits.
  """
  a_length, b_length = a_end - a_start, b_end - b_start
  excess = a_length + b_length - max_num_tokens
  if excess <= 0:
    return a_start, a_end, b_start, b_end
  if a_length > b_length:
    cut_a, cut_b = min(excess, a_length - b_length), 0
  else:
    cut_a, cut_b = 0, min(excess, b_length - a_length)
  rest = excess - cut_a - cut_b
  cut_a += rest // 2
  cut_b += rest - rest // 2
  front_a = bin(rng.getrandbits(cut_a)).count("1") if cut_a else 0
  front_b = bin(rng.getrandbits(cut_b)).count("1") if cut_b else 0
  return (a_start + front_a, a_end - (cut_a - front_a), b_start + front_b,
          b_end - (cut_b - front_b))


def create_instances_from_document(documents, document_index, max_seq_length, short_seq_prob,
                                   rng, truncate=truncate_seq_pair):
  """Yields one document's sentence-pair instances, unmasked, as spans of the corpus tokens.

  `documents` are Corpus.documents. Each instance is (a_start, a_end, b_start, b_end,
  is_random_next): the tokens of segments A and B, and whether B came from another document. It
  is a generator because the original masks each instance before drawing the next one's split:
  exact mode masks every instance as it is yielded, keeping that order of draws from `rng`.

  Sentences are gathered until they reach a target length; a random number of them becomes A.
  B is the rest, or, half the time (always when there is one sentence), text from a random other
  document, in which case the unused sentences are returned for the next instance. A and B are
  whole sentences rather than a random split of the token stream, which would make next sentence
  prediction too easy.
  """
  bounds = documents[document_index]
  num_sentences = len(bounds) - 1
  max_num_tokens = max_seq_length - 3
  # Mostly fill the whole sequence (padding is wasted computation), but sometimes aim shorter so
  # pre-training also sees the short inputs fine-tuning will give it.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)

  first = 0  # The current chunk is sentences first..i.
  i = 0
  while i < num_sentences:
    if i == num_sentences - 1 or bounds[i + 1] - bounds[first] >= target_seq_length:
      chunk_size = i - first + 1
      a_sentences = 1
      if chunk_size >= 2:
        a_sentences = rng.randint(1, chunk_size - 1)
      a_start, a_end = bounds[first], bounds[first + a_sentences]

      is_random_next = chunk_size == 1 or rng.random() < 0.5
      if is_random_next:
        target_b_length = target_seq_length - (a_end - a_start)
        # Ten tries at a different document; with one document it ends up using itself.
        for _ in range(10):
          random_index = rng.randint(0, len(documents) - 1)
          if random_index != document_index:
            break
        other = documents[random_index]
        j = rng.randint(0, len(other) - 2) + 1
        b_start = other[j - 1]
        while other[j] - b_start < target_b_length and j < len(other) - 1:
          j += 1
        b_end = other[j]
        # The chunk's unused sentences start the next chunk.
        i = first + a_sentences - 1
      else:
        b_start, b_end = a_end, bounds[i + 1]

      yield (*truncate(a_start, a_end, b_start, b_end, max_num_tokens, rng), is_random_next)
      first = i + 1
    i += 1


def create_single_segment_instances(bounds, max_seq_length, short_seq_prob, rng):
  """--no_nsp: yields a document's [CLS] A [SEP] instances, like the pair version (B empty).

  Consecutive sentences are packed up to the target length; tokens beyond max_seq_length - 2 are
  carried into the next instance instead of being thrown away.
  """
  max_num_tokens = max_seq_length - 2
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  start = bounds[0]
  last = len(bounds) - 1
  for i in range(1, len(bounds)):
    while bounds[i] > start and (bounds[i] - start >= target_seq_length or i == last):
      end = min(bounds[i], start + max_num_tokens)
      yield start, end, end, end, False
      start = end


def create_unmasked_instances(documents, document_index, options, rng,
                              truncate=truncate_seq_pair):
  """Yields one document's instance spans, pairs or (with --no_nsp) single segments."""
  if options.no_nsp:
    return create_single_segment_instances(documents[document_index], options.max_seq_length,
                                           options.short_seq_prob, rng)
  return create_instances_from_document(documents, document_index, options.max_seq_length,
                                        options.short_seq_prob, rng, truncate)


def instance_tokens(tokens, instance, vocab_ids):
  """An instance's ids: [CLS] A [SEP] B [SEP] (or [CLS] A [SEP] when B is empty), and the number
  of leading positions with segment id 0."""
  a_start, a_end, b_start, b_end, _ = instance
  cls_id, sep_id = vocab_ids.cls_id, vocab_ids.sep_id
  if b_end == b_start:
    return [cls_id, *tokens[a_start:a_end], sep_id], a_end - a_start + 2
  return ([cls_id, *tokens[a_start:a_end], sep_id, *tokens[b_start:b_end], sep_id],
          a_end - a_start + 2)


def assemble_batch(tokens, instances, max_seq_length, vocab_ids):
  """Fast mode: many instances' ids at once, gathered from the corpus tokens (a numpy array).

  Returns (ids [N, max_seq_length] zero-padded, lengths [N], segment A lengths [N]).
  """
  spans = np.array([instance[:4] for instance in instances], dtype=np.int64).reshape(-1, 4)
  a_start, a_end, b_start, b_end = spans.T
  a_length, b_length = a_end - a_start, b_end - b_start
  pair = b_length > 0
  lengths = a_length + b_length + 2 + pair
  columns = np.arange(max_seq_length)[None, :]
  la, lb = a_length[:, None], b_length[:, None]
  in_a = (columns >= 1) & (columns <= la)
  in_b = (columns >= la + 2) & (columns < la + 2 + lb)
  source = np.where(in_a, a_start[:, None] + columns - 1, b_start[:, None] + columns - la - 2)
  ids = np.where(in_a | in_b, tokens[np.where(in_a | in_b, source, 0)], 0).astype(np.int32)
  rows = np.arange(len(instances))
  ids[:, 0] = vocab_ids.cls_id
  ids[rows, a_length + 1] = vocab_ids.sep_id
  ids[rows[pair], lengths[pair] - 1] = vocab_ids.sep_id
  return ids, lengths, a_length + 2


# ---------------------------------------------------------------------------------------------
# Masking.


def create_masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab_ids, rng,
                                 do_whole_word_mask=False, segment_a_length=None):
  """Masks one instance; returns (masked tokens, positions, label ids), positions ascending.

  A random round(len * masked_lm_prob) positions (at least 1, at most max_predictions_per_seq)
  other than [CLS]/[SEP] are predicted. With whole-word masking a word is skipped when all its
  WordPieces would exceed that number. Of the predicted positions, 80% become [MASK], 10% a random
  word and 10% stay unchanged: [MASK] never occurs in fine-tuning, so the model must also learn
  real tokens at predicted positions, and keeping some unchanged ties the representation to the
  observed word.

  A caller that knows [CLS] and [SEP] occur only at their places in the layout (position 0,
  `segment_a_length` - 1 and the end) passes `segment_a_length` to skip looking for them.
  """
  cls_id, sep_id = vocab_ids.cls_id, vocab_ids.sep_id
  if do_whole_word_mask:
    # A "##" piece joins the previous candidate word, even across [SEP] (as in the original).
    is_subword = vocab_ids.is_subword
    candidates = []
    for i, token in enumerate(tokens):
      if token == cls_id or token == sep_id:
        continue
      if candidates and is_subword[token]:
        candidates[-1].append(i)
      else:
        candidates.append([i])
  elif segment_a_length is not None:
    candidates = [*range(1, segment_a_length - 1), *range(segment_a_length, len(tokens) - 1)]
  else:
    candidates = [i for i, token in enumerate(tokens) if token != cls_id and token != sep_id]
  num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
  # Without whole words only the first num_to_predict shuffled candidates are used.
  rng.shuffle(candidates, keep=None if do_whole_word_mask else num_to_predict)

  if do_whole_word_mask:
    chosen = []
    for word in candidates:
      if len(chosen) >= num_to_predict:
        break
      if len(chosen) + len(word) <= num_to_predict:
        chosen.extend(word)
  else:
    chosen = candidates[:num_to_predict]

  output = list(tokens)
  random_, randbelow = rng.random, rng.randbelow
  word_ids = vocab_ids.word_ids
  mask_id = vocab_ids.mask_id
  for index in chosen:
    if random_() < 0.8:
      output[index] = mask_id
    elif random_() >= 0.5:
      output[index] = word_ids[randbelow(len(word_ids))]
  chosen.sort()
  return output, chosen, [tokens[p] for p in chosen]


def mask_instances_batch(ids, lengths, masked_lm_prob, max_predictions_per_seq, vocab_ids,
                         np_rng, do_whole_word_mask=False):
  """Fast mode's masking of many instances at once with numpy (same rules, other draws).

  `ids` [N, S] (see assemble_batch) are masked in place. Returns (positions [N, P], label ids
  [N, P], counts [N]); positions and labels are zero beyond each row's count.
  """
  n, seq = ids.shape
  preds = max_predictions_per_seq
  columns = np.arange(seq)
  candidate = _candidates(ids, lengths, vocab_ids)
  counts = np.minimum(num_to_predict(lengths, masked_lm_prob, preds), candidate.sum(axis=1))
  keys = np_rng.random((n, seq))
  if do_whole_word_mask:
    selected, counts = _choose_whole_words(ids, candidate, counts, keys, vocab_ids)
    # The selected positions, in order, first in each row.
    chosen = np.argsort(~selected, axis=1, kind="stable")[:, :preds]
  else:
    # A random subset of the candidates: those with the smallest random keys (the `preds`
    # smallest by partition, then sorted among themselves).
    keys[~candidate] = 2.0
    chosen = np.argpartition(keys, preds - 1, axis=1)[:, :preds] if preds < seq else (
        np.tile(columns, (n, 1)))
    chosen = np.take_along_axis(
        chosen, np.argsort(np.take_along_axis(keys, chosen, axis=1), axis=1), axis=1)
  valid = np.arange(preds) < counts[:, None]
  positions = np.sort(np.where(valid, chosen, seq), axis=1)
  positions[~valid] = 0
  labels = np.take_along_axis(ids, positions, axis=1)
  labels[~valid] = 0

  draw = np_rng.random((n, preds))
  random_words = vocab_ids.word_ids_array[np_rng.integers(0, len(vocab_ids.word_ids), (n, preds))]
  replacement = np.where(draw < 0.8, vocab_ids.mask_id, np.where(draw < 0.9, random_words, labels))
  row_index = np.nonzero(valid)[0]
  ids[row_index, positions[valid]] = replacement[valid]
  return positions, labels, counts


def _candidates(ids, lengths, vocab_ids):
  """The positions masking may choose in rows of ids: the real tokens but [CLS] and [SEP]."""
  return ((np.arange(ids.shape[1]) < lengths[:, None]) & (ids != vocab_ids.cls_id) &
          (ids != vocab_ids.sep_id))


def num_to_predict(lengths, masked_lm_prob, max_predictions_per_seq):
  """Predictions per instance of `lengths` tokens, before the cap at its candidate count."""
  # np.rint rounds half to even like Python's round, on the same float64 product.
  return np.minimum(max_predictions_per_seq,
                    np.maximum(1, np.rint(lengths * masked_lm_prob).astype(np.int64)))


def _word_starts(ids, candidate, vocab_ids):
  """The candidates that start a word: all but a "##" piece, which joins the candidate before it
  (the row's first candidate starts a word whatever it is)."""
  subword = np.frombuffer(bytes(vocab_ids.is_subword), np.uint8).astype(bool)[ids] & candidate
  first_candidate = candidate & (np.cumsum(candidate, axis=1) == 1)
  return candidate & (~subword | first_candidate)


def _choose_whole_words(ids, candidate, counts, keys, vocab_ids):
  """Whole-word masking for a batch: which positions to predict, and how many per row.

  As in create_masked_lm_predictions: a "##" candidate belongs to the candidate word before it;
  words are visited in random order (by `keys`) and a word is taken if all its pieces still fit
  in the row's count, else skipped. The visit is a loop over word ranks, each step for all rows.
  """
  n, seq = ids.shape
  rows = np.arange(n)[:, None]
  starts = _word_starts(ids, candidate, vocab_ids)
  word = np.cumsum(starts, axis=1) - 1  # Word index of each candidate position.
  word_length = np.zeros((n, seq), np.int64)
  np.add.at(word_length, (np.broadcast_to(rows, (n, seq))[candidate], word[candidate]), 1)
  # Visit order: words sorted by the key of their first piece.
  start_keys = np.where(starts, keys, 2.0)
  order = np.argsort(start_keys, axis=1)  # Start positions by key; non-starts last.
  num_words = starts.sum(axis=1)
  visit_length = np.where(np.arange(seq) < num_words[:, None],
                          word_length[rows, word[rows, order]], 0)
  taken = np.zeros((n, seq), bool)
  total = np.zeros(n, np.int64)
  for rank in range(int(num_words.max(initial=0))):
    fits = (visit_length[:, rank] > 0) & (total + visit_length[:, rank] <= counts)
    taken[:, rank] = fits
    total += np.where(fits, visit_length[:, rank], 0)
    if (total >= counts).all():
      break
  # Back from visit ranks to words, then to positions.
  word_taken = np.zeros((n, seq), bool)
  taken_row, taken_rank = np.nonzero(taken)
  word_taken[taken_row, word[taken_row, order[taken_row, taken_rank]]] = True
  selected = candidate & word_taken[rows, np.maximum(word, 0)]
  return selected, total


# ---------------------------------------------------------------------------------------------
# Unmasked instances (--dynamic_masking) and packed sequences (--pack_sequences).

# token_kinds values (run_pretraining's input_pipeline.DynamicMasking reads them).
NOT_MASKED, WORD_START, WORD_PIECE = 0, 1, 2


def token_kinds(ids, lengths, vocab_ids):
  """What masking needs to know of each position of rows of ids [N, S]: NOT_MASKED for [CLS],
  [SEP] and padding, WORD_START for a candidate that starts a word, WORD_PIECE for a "##" piece
  that joins the word before it (as the generator's own whole-word masking groups them)."""
  candidate = _candidates(ids, lengths, vocab_ids)
  starts = _word_starts(ids, candidate, vocab_ids)
  return np.where(starts, WORD_START, np.where(candidate, WORD_PIECE, NOT_MASKED))


@dataclasses.dataclass
class Packing:
  """Where each instance of a batch goes: its sequence (pack), its slot there (0, 1, ...), its
  first token's position and its first prediction's index; and how many sequences there are."""
  pack: np.ndarray
  slot: np.ndarray
  offset: np.ndarray
  prediction_offset: np.ndarray
  num_packs: int


def pack_instances(lengths, predictions, max_seq_length, max_predictions_per_seq,
                   max_instances_per_pack):
  """Best-fit decreasing: instances longest first, each into the open sequence with the least
  room that still holds its tokens and predictions (and fewer than max_instances_per_pack
  instances), else into a new one. Deterministic (no random draws).

  The instances of a sequence are in the order they joined it, so their tokens, positions and
  predictions ascend together.
  """
  n = len(lengths)
  pack, slot = np.zeros(n, np.int64), np.zeros(n, np.int64)
  offset, prediction_offset = np.zeros(n, np.int64), np.zeros(n, np.int64)
  used, predicted, members = [], [], []  # per sequence: tokens, predictions, instances
  open_by_room = collections.defaultdict(list)  # room left -> open sequences with that room
  rooms = []  # the sorted keys of open_by_room with an open sequence
  smallest = int(lengths.min(initial=max_seq_length))
  for i in np.argsort(-lengths, kind="stable").tolist():
    length, count = int(lengths[i]), int(predictions[i])
    chosen = None
    for room in rooms[bisect.bisect_left(rooms, length):]:
      for p in open_by_room[room]:
        if predicted[p] + count <= max_predictions_per_seq:
          chosen = p
          break
      if chosen is not None:
        open_by_room[room].remove(chosen)
        if not open_by_room[room]:
          del open_by_room[room]
          rooms.remove(room)
        break
    if chosen is None:
      chosen = len(used)
      used.append(0)
      predicted.append(0)
      members.append(0)
    pack[i], slot[i] = chosen, members[chosen]
    offset[i], prediction_offset[i] = used[chosen], predicted[chosen]
    used[chosen] += length
    predicted[chosen] += count
    members[chosen] += 1
    room = max_seq_length - used[chosen]
    if (room >= smallest and members[chosen] < max_instances_per_pack and
        predicted[chosen] < max_predictions_per_seq):
      if room not in open_by_room:
        bisect.insort(rooms, room)
      open_by_room[room].append(chosen)
  return Packing(pack, slot, offset, prediction_offset, len(used))


def encode_instances(encoder, options, vocab_ids, ids, lengths, segment_a_lengths,
                     is_random_next, masks=None):
  """The records of a batch of instances (rows of assemble_batch) with --dynamic_masking (no
  `masks`: written unmasked, with token_kinds) and/or --pack_sequences. `masks`: the
  (positions, labels, counts) of mask_instances_batch when masked here."""
  n, seq = ids.shape
  preds = options.max_predictions_per_seq
  columns = np.arange(seq)
  in_instance = columns < lengths[:, None]
  segments = (columns >= segment_a_lengths[:, None]) & in_instance
  labels = np.asarray(is_random_next, np.int64)
  if not options.pack_sequences:
    rows = [("input_ids", ids, False), ("input_mask", in_instance, False),
            ("segment_ids", segments, False),
            ("token_kinds", token_kinds(ids, lengths, vocab_ids), False),
            ("mask_token_id", np.full((n, 1), vocab_ids.mask_id), False),
            ("next_sentence_labels", labels[:, None], False)]
    return encoder.encode_rows(rows)

  # What run_pretraining will mask in an instance is at most what the generator would.
  counts = masks[2] if masks else num_to_predict(lengths, options.masked_lm_prob, preds)
  packing = pack_instances(lengths, counts, seq, preds, options.max_instances_per_pack)
  m, k = packing.num_packs, options.max_instances_per_pack
  # Every token of every instance, to its place in its sequence.
  token_rows = np.broadcast_to(packing.pack[:, None], (n, seq))[in_instance]
  token_columns = (packing.offset[:, None] + columns)[in_instance]

  def packed(values, dtype=np.int64):
    out = np.zeros((m, seq), dtype)
    out[token_rows, token_columns] = values[in_instance]
    return out

  instance_ids = packed(np.broadcast_to(packing.slot[:, None] + 1, (n, seq)))
  rows = [("input_ids", packed(ids), False), ("input_mask", instance_ids > 0, False),
          ("segment_ids", packed(segments), False), ("instance_ids", instance_ids, False)]
  if masks:
    positions, label_ids, counts = masks
    valid = np.arange(preds) < counts[:, None]
    prediction_rows = np.broadcast_to(packing.pack[:, None], valid.shape)[valid]
    prediction_columns = (packing.prediction_offset[:, None] + np.arange(preds))[valid]
    packed_positions, packed_ids = np.zeros((m, preds), np.int64), np.zeros((m, preds), np.int64)
    weights = np.zeros((m, preds), np.float32)
    packed_positions[prediction_rows, prediction_columns] = (
        positions + packing.offset[:, None])[valid]
    packed_ids[prediction_rows, prediction_columns] = label_ids[valid]
    weights[prediction_rows, prediction_columns] = 1.0
    rows += [("masked_lm_positions", packed_positions, False),
             ("masked_lm_ids", packed_ids, False), ("masked_lm_weights", weights, True)]
  else:
    # The budget these sequences were packed for: run_pretraining refuses masking flags that
    # would make more predictions than it (it could only drop the excess, unseen).
    rows += [("token_kinds", packed(token_kinds(ids, lengths, vocab_ids)), False),
             ("mask_token_id", np.full((m, 1), vocab_ids.mask_id), False),
             ("max_predictions_per_seq", np.full((m, 1), preds), False),
             ("masked_lm_prob", np.full((m, 1), options.masked_lm_prob, np.float32), True)]
  sentence_labels, sentence_weights = np.zeros((m, k), np.int64), np.zeros((m, k), np.float32)
  sentence_labels[packing.pack, packing.slot] = labels
  sentence_weights[packing.pack, packing.slot] = 1.0
  rows += [("next_sentence_labels", sentence_labels, False),
           ("next_sentence_weights", sentence_weights, True)]
  return encoder.encode_rows(rows)


# ---------------------------------------------------------------------------------------------
# Encoding and writing records.


def example_feature_spec(max_seq_length, max_predictions_per_seq):
  """The tf.io.parse_example spec of these records (for readers such as run_pretraining)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  fixed = tf.io.FixedLenFeature
  return {
      "input_ids": fixed([max_seq_length], tf.int64),
      "input_mask": fixed([max_seq_length], tf.int64),
      "segment_ids": fixed([max_seq_length], tf.int64),
      "masked_lm_positions": fixed([max_predictions_per_seq], tf.int64),
      "masked_lm_ids": fixed([max_predictions_per_seq], tf.int64),
      "masked_lm_weights": fixed([max_predictions_per_seq], tf.float32),
      "next_sentence_labels": fixed([1], tf.int64),
  }


# ---------------------------------------------------------------------------------------------
# Statistics and progress.


@dataclasses.dataclass
class Stats:
  """Counts for the progress lines and the final summary."""
  documents: int = 0
  input_bytes: int = 0
  instances: int = 0
  tokens: int = 0
  masked: int = 0
  random_next: int = 0
  records: int = 0  # sequences written: fewer than the instances when packed
  slots: int = 0  # token positions written, padding included

  def add(self, other):
    for field in dataclasses.fields(self):
      setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

  def summary(self):
    instances = max(self.instances, 1)
    packed = (f" in {self.records} packed sequences" if self.records != self.instances else "")
    masked = (f"{self.masked} masked ({self.masked / max(self.tokens, 1):.2%} of tokens)"
              if self.masked else "unmasked (run_pretraining masks them)")
    return (f"{self.instances} instances{packed} from {self.documents} documents; "
            f"{self.tokens} tokens ({self.tokens / instances:.1f} per instance, padding "
            f"{1 - self.tokens / max(self.slots, 1):.1%} of the sequences), {masked}, "
            f"next sentence random {self.random_next / instances:.1%} / "
            f"actual {1 - self.random_next / instances:.1%}")


class Progress:
  """Logs a phase's progress (done / total units, rate, ETA) at most every `interval` seconds."""

  def __init__(self, phase, total, unit, interval):
    self.phase, self.total, self.unit, self.interval = phase, total, unit, interval
    self.start = self._last = time.monotonic()

  def per_second(self, count):
    return count / max(time.monotonic() - self.start, 1e-9)

  def update(self, done, detail="", force=False):
    now = time.monotonic()
    if not force and now - self._last < self.interval:
      return
    self._last = now
    elapsed = max(now - self.start, 1e-9)
    rate = done / elapsed
    eta = (self.total - done) / rate if rate > 0 else float("inf")
    if self.unit == "B":
      amounts = f"{done / 1e6:.1f}/{self.total / 1e6:.1f} MB", f"{rate / 1e6:.2f} MB/s"
    else:
      amounts = f"{done}/{self.total} {self.unit}", f"{rate:.1f} {self.unit}/s"
    logging.info("%s: %s (%.0f%%), %s, %s elapsed, ETA %s%s", self.phase, amounts[0],
                 100 * done / max(self.total, 1), amounts[1], _duration(elapsed), _duration(eta),
                 f"; {detail}" if detail else "")


def _duration(seconds):
  if seconds == float("inf"):
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _log_example(tokens, segment_a_length, is_random_next, positions, labels, tokenizer):
  words = [tokenizer.inv_vocab.get(t, "?") for t in tokens]
  logging.info("*** Example *** (is_random_next=%s, segment A length %d)\ntokens: %s\n"
               "masked_lm_positions: %s\nmasked_lm_labels: %s", is_random_next,
               segment_a_length, " ".join(words), " ".join(map(str, positions)),
               " ".join(tokenizer.inv_vocab.get(t, "?") for t in labels))


# ---------------------------------------------------------------------------------------------
# Exact mode.


def create_exact_records(corpus, options, vocab_ids, tokenizer=None, progress_seconds=30):
  """Exact mode's records, in the original's order, from a Corpus (its documents get shuffled).

  Returns (serialized records, Stats). Records are encoded as soon as an instance is masked, so
  only their bytes wait in memory for the final shuffle.
  """
  rng = ExactRandom(options.random_seed)
  documents = corpus.documents
  rng.shuffle(documents)
  # Text never tokenizes to [CLS] or [SEP] (brackets are split off as punctuation); checked once
  # here so masking can take the candidate positions from the instance layout.
  layout_only = (vocab_ids.cls_id not in corpus.tokens and vocab_ids.sep_id not in corpus.tokens)
  encoder = tfrecord_io.ExampleEncoder(options.max_seq_length, options.max_predictions_per_seq,
                                       vocab_ids.size)
  stats = Stats(documents=len(documents))
  records = []
  progress = Progress("creating instances", options.dupe_factor * len(documents), "documents",
                      progress_seconds)
  for dupe in range(options.dupe_factor):
    for document_index in range(len(documents)):
      for instance in create_unmasked_instances(documents, document_index, options, rng):
        tokens, segment_a_length = instance_tokens(corpus.tokens, instance, vocab_ids)
        masked, positions, labels = create_masked_lm_predictions(
            tokens, options.masked_lm_prob, options.max_predictions_per_seq, vocab_ids, rng,
            options.do_whole_word_mask, segment_a_length if layout_only else None)
        is_random_next = instance[4]
        records.append(encoder.encode(masked, segment_a_length, positions, labels,
                                      is_random_next))
        stats.tokens += len(tokens)
        stats.masked += len(positions)
        stats.random_next += is_random_next
        if tokenizer is not None and len(records) <= 3:
          _log_example(masked, segment_a_length, is_random_next, positions, labels, tokenizer)
      progress.update(dupe * len(documents) + document_index + 1,
                      f"{len(records)} instances ({progress.per_second(len(records)):.0f}/s)")
  rng.shuffle(records)
  stats.instances = stats.records = len(records)
  stats.slots = len(records) * options.max_seq_length
  return records, stats


# ---------------------------------------------------------------------------------------------
# Worker processes (tokenizing in both modes, whole chunks in fast mode).

_worker = None


@dataclasses.dataclass
class _WorkerState:
  options: Options
  tokenizer: object
  vocab_ids: VocabIds
  encoder: tfrecord_io.ExampleEncoder


  @classmethod
  def create(cls, options, tokenizer=None):
    if tokenizer is None:
      tokenizer = tokenization.FullTokenizer(vocab_file=options.vocab_file,
                                             do_lower_case=options.do_lower_case)
    vocab_ids = VocabIds(tokenizer.vocab)
    encoder = tfrecord_io.ExampleEncoder(options.max_seq_length, options.max_predictions_per_seq,
                             vocab_ids.size)
    return cls(options, tokenizer, vocab_ids, encoder)


def _init_worker(options, parent_pid):
  """Pool initializer: builds the tokenizer and encoder once per worker process.

  A Ctrl-C at a terminal reaches the whole process group: workers ignore it and are ended by the
  main process (no KeyboardInterrupt traceback from each). They started with SIGINT blocked (see
  _WorkerPool), so it is ignored before it is unblocked. A watchdog thread ends the worker when
  its parent is gone (killed with SIGKILL, say), so no worker runs on as an orphan.
  """
  global _worker
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
  _worker = _WorkerState.create(options)


def _exit_with_parent(parent_pid, interval=0.5):
  while os.getppid() == parent_pid:
    time.sleep(interval)
  os._exit(1)  # pylint: disable=protected-access


def _tokenize_task(task):
  line_documents, nbytes = task
  return tokenize_documents(_worker.tokenizer, line_documents), nbytes


def process_chunk(chunk_index, line_documents, options, tokenizer, vocab_ids, encoder):
  """Fast mode: one chunk of documents (text lines) -> (serialized records, Stats).

  Everything random is seeded from (random_seed, chunk_index) alone, so a chunk's records do not
  depend on which process handles it or what it handled before.
  """
  corpus = Corpus()
  corpus.add_documents(tokenize_documents(tokenizer, line_documents))
  documents = corpus.documents
  stats = Stats(documents=len(documents))
  if not documents:
    return [], stats
  # A string seed is hashed with SHA-512 by random.Random: stable across runs and platforms.
  rng = ExactRandom(f"{options.random_seed}/chunk/{chunk_index}")
  np_rng = np.random.default_rng(rng.randbelow(1 << 63))
  rng.shuffle(documents)
  flat = np.asarray(corpus.tokens, dtype=np.int32)
  records = []
  pending = []

  def mask_and_encode():
    is_random_next = [instance[4] for instance in pending]
    ids, lengths, segment_a_lengths = assemble_batch(flat, pending, options.max_seq_length,
                                                     vocab_ids)
    if options.dynamic_masking:
      masks, counts = None, np.zeros(len(pending), np.int64)
    else:
      masks = positions, labels, counts = mask_instances_batch(
          ids, lengths, options.masked_lm_prob, options.max_predictions_per_seq, vocab_ids,
          np_rng, options.do_whole_word_mask)
    if options.dynamic_masking or options.pack_sequences:
      batch = encode_instances(encoder, options, vocab_ids, ids, lengths, segment_a_lengths,
                               is_random_next, masks)
    else:
      batch = encoder.encode_batch(ids, lengths, segment_a_lengths, positions, labels, counts,
                                   is_random_next)
    records.extend(batch)
    stats.records += len(batch)
    stats.slots += len(batch) * options.max_seq_length
    stats.tokens += int(lengths.sum())
    stats.masked += int(counts.sum())
    stats.random_next += sum(is_random_next)
    stats.instances += len(pending)
    pending.clear()

  for _ in range(options.dupe_factor):
    for document_index in range(len(documents)):
      pending.extend(create_unmasked_instances(documents, document_index, options, rng,
                                               truncate_seq_pair_fast))
      if len(pending) >= 4096:  # Bounds the size of the batch arrays.
        mask_and_encode()
  if pending:
    mask_and_encode()
  records = [records[i] for i in np_rng.permutation(len(records)).tolist()]
  return records, stats


def _chunk_task(task, state=None):
  chunk_index, line_documents, nbytes = task
  state = state or _worker
  records, stats = process_chunk(chunk_index, line_documents, state.options, state.tokenizer,
                                 state.vocab_ids, state.encoder)
  stats.input_bytes = nbytes
  return records, stats


def iter_chunks(input_files, chunk_documents, max_chunk_bytes=_MAX_CHUNK_BYTES, opener=None,
                spans=False):
  """Fast mode's units of work: (index, documents as text lines, bytes) in input order.

  With `spans`, a chunk's documents come as the spans of the input that hold them (see
  iter_document_lines; consecutive ones merged), for read_chunk_spans to read where the chunk is
  processed: a Beam job then never sends the text itself from one worker to another.
  """
  documents, count, nbytes, index = [], 0, 0, 0  # documents: their lines, or merged spans
  for lines, size, *span in iter_document_lines(input_files, end_document_at_file_end=True,
                                                max_document_bytes=max_chunk_bytes,
                                                opener=opener, spans=spans):
    if not spans:
      documents.append(lines)
    elif documents and documents[-1][0] == span[0][0] and documents[-1][3] == span[0][1]:
      documents[-1] = (*documents[-1][:3], span[0][3])
    else:
      documents.append(span[0])
    count += 1
    nbytes += size
    if count >= chunk_documents or nbytes >= max_chunk_bytes:
      yield index, documents, nbytes
      documents, count, nbytes, index = [], 0, 0, index + 1
  if documents:
    yield index, documents, nbytes


def read_chunk_spans(spans, max_chunk_bytes=_MAX_CHUNK_BYTES, opener=None):
  """The documents (as text lines) of a chunk that iter_chunks gave as spans."""
  return [lines for lines, _ in iter_document_lines(
      spans, end_document_at_file_end=True, max_document_bytes=max_chunk_bytes, opener=opener)]


def ordered_map(pool, function, tasks, window):
  """Like pool.map, in order, but with at most `window` tasks in flight.

  Executor.map and Pool.imap submit the whole input at once, which would hold the corpus in
  memory; here reading stays just ahead of the workers.
  """
  in_flight = collections.deque()
  for task in tasks:
    in_flight.append(pool.submit(function, task))
    if len(in_flight) >= window:
      yield in_flight.popleft().result()
  while in_flight:
    yield in_flight.popleft().result()


class _WorkerPool(concurrent.futures.ProcessPoolExecutor):
  """Spawns its workers (inside submit) with SIGINT blocked: the signal mask is inherited, so a
  Ctrl-C during a worker's start-up waits until _init_worker has made it ignore SIGINT."""

  def submit(self, *args, **kwargs):  # pylint: disable=arguments-differ
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
      return super().submit(*args, **kwargs)
    finally:
      signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextlib.contextmanager
def worker_pool(options, num_workers):
  """A pool of `num_workers` processes with a tokenizer each.

  Workers are spawned, not forked: a caller may already run threads (TensorFlow's), and a fresh
  interpreter imports only what tokenizing needs. A ProcessPoolExecutor rather than a Pool
  because a worker that dies (killed for memory, say) then fails the run instead of hanging it.
  When the run stops early (an error, Ctrl-C, SIGTERM) the workers are ended at once rather than
  left to finish their chunks.
  """
  before = set(multiprocessing.active_children())
  pool = _WorkerPool(num_workers, mp_context=multiprocessing.get_context("spawn"),
                     initializer=_init_worker, initargs=(options, os.getpid()))
  try:
    yield pool
  except BaseException as e:
    # Every process started since `before`, including one spawned but not yet registered by the
    # pool when the interruption came.
    workers = set(multiprocessing.active_children()) - before
    for process in workers:
      process.terminate()
    for process in workers:
      process.join(5)
      if process.is_alive():
        process.kill()
        process.join()
    # A worker ended while sending its result leaves the pool's manager thread waiting for the
    # rest of that message (and shutdown waiting for that thread) for ever: with the workers'
    # ends of the results pipe closed by their end, closing ours turns that wait into an EOF.
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None:
      writer.close()
    pool.shutdown(wait=True, cancel_futures=True)
    if isinstance(e, concurrent.futures.BrokenExecutor):
      raise fileio.ReportedError(
          "a worker process ended unexpectedly (killed, perhaps for lack of memory); lower "
          "--num_workers or --chunk_documents") from None
    raise
  pool.shutdown(wait=True)


def create_fast_records(input_files, options, stats, num_workers, tokenizer=None):
  """Fast mode: yields serialized records chunk by chunk, mixed by a bounded shuffle buffer.

  With one worker everything runs in this process (with `tokenizer` if given). `stats` is
  updated as chunks complete. Raises InputError when the input holds no document.
  """
  total_bytes = sum(os.path.getsize(path) for path in input_files)
  progress = Progress("fast mode", total_bytes, "B", options.progress_seconds)
  with contextlib.ExitStack() as stack:
    chunks = iter_chunks(input_files, options.chunk_documents)
    if num_workers <= 1:
      state = _WorkerState.create(options, tokenizer)
      results = (_chunk_task(chunk, state) for chunk in chunks)
    else:
      pool = stack.enter_context(worker_pool(options, num_workers))
      results = ordered_map(pool, _chunk_task, chunks, window=num_workers + 2)

    def chunk_records():
      for records, chunk_stats in results:
        stats.add(chunk_stats)
        progress.update(stats.input_bytes, _progress_detail(stats, progress))
        yield from records
      if not stats.documents:
        raise fileio.InputError(_no_documents_message(input_files))

    yield from shuffle_buffer(chunk_records(), options.shuffle_buffer_size,
                              ExactRandom(f"{options.random_seed}/output"))
  progress.update(stats.input_bytes, f"{stats.documents} documents, {stats.instances} instances",
                  force=True)


def shuffle_buffer(records, size, rng):
  """Yields `records` mixed by a buffer of `size` records (none: in order): each record past the
  first `size` takes the place of a random one, which is yielded; the rest leave shuffled."""
  if not size:
    yield from records
    return
  buffer = []
  for record in records:
    if len(buffer) < size:
      buffer.append(record)
    else:
      j = rng.randbelow(size)
      yield buffer[j]
      buffer[j] = record
  rng.shuffle(buffer)
  yield from buffer


def _progress_detail(stats, progress):
  return (f"{stats.documents} documents, {stats.instances} instances "
          f"({progress.per_second(stats.instances):.0f}/s)")


def _no_documents_message(input_files):
  return (f"no documents in the input ({', '.join(input_files)}): it needs text with one "
          f"sentence per line and blank lines between documents")


# ---------------------------------------------------------------------------------------------
# Fast mode as an Apache Beam pipeline (--beam_pipeline_options).
#
# It lives in this script, beside the local fast mode, because it is fast mode: one reader splits
# the input with iter_chunks (so the chunks and their indices are the local run's, whatever the
# number of files and workers), Beam spreads the chunks over its workers, and each chunk becomes
# records in _chunk_task / process_chunk, the code the local run calls. A library module could
# not call them (no module imports a script), and moving fast mode out of this script would split
# one algorithm over two files. apache_beam is imported only on this path: without the flag, the
# script needs no Beam.
#
# The records are then dealt to the output shards by chunk and position (balanced, each shard
# drawing from every chunk), grouped by shard (Beam's shuffle, across machines), mixed within a
# shard by the local run's bounded shuffle buffer and written to hidden temporaries, which a last
# step renames onto the outputs once every shard is complete. The workers read and write through
# Beam's file systems (local paths, gs://, hdfs://, s3://), which fileio's local-disk helpers
# cannot; the temporaries are named as fileio names its own, so a write error names the output.

_BEAM_DEFAULT_RUNNER = "FnApiRunner"
_BEAM_METRICS = "create_pretraining_data"


def beam_pipeline_args(text):
  """--beam_pipeline_options -> Beam's command-line arguments.

  Two forms: TFDS's comma-separated `name=value` pairs, or Beam's own `--name=value ...` in one
  string (for values with commas).
  """
  text = text.strip()
  if text.startswith("-"):
    return shlex.split(text)
  return ["--" + item.strip().lstrip("-") for item in text.split(",") if item.strip()]


def _import_beam():
  try:
    import apache_beam  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise fileio.InputError(
        f"--beam_pipeline_options needs Apache Beam, which cannot be imported here ({e}); "
        f"install it with `pip install -r requirements-beam.txt`, or leave the flag out to run "
        f"fast mode in this process") from None
  return apache_beam


def _beam_pipeline(beam, text):
  """A beam.Pipeline with the options `text` gives; InputError naming an option Beam does not
  know (it would otherwise drop it with a warning) or a value it cannot parse."""
  from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
  args = beam_pipeline_args(text)
  names = {arg.split("=", 1)[0] for arg in args}
  if "--runner" not in names:
    # Not Beam's default, DirectRunner: that first tries the Prism runner, a binary it downloads
    # at run time (offline it logs the failed download, then falls back to this runner).
    args.append(f"--runner={_BEAM_DEFAULT_RUNNER}")
  if "--default_sdk_harness_log_level" not in names:
    args.append("--default_sdk_harness_log_level=WARNING")  # Not every worker's start-up lines.
  options = pipeline_options.PipelineOptions(args)
  parse_errors = io.StringIO()
  try:
    with contextlib.redirect_stderr(parse_errors):
      # Creating the runner imports its module, which may define more options (Flink, Spark).
      pipeline = beam.Pipeline(options=options)
      known = options.get_all_options()
      given = options.get_all_options(retain_unknown_options=True)
  except (ValueError, ImportError) as e:
    raise fileio.InputError(f"--beam_pipeline_options: {e}") from None
  except SystemExit:  # argparse's report of a bad value, after its usage text
    lines = parse_errors.getvalue().strip().splitlines() or ["a value cannot be parsed"]
    raise fileio.InputError(
        f"--beam_pipeline_options: {lines[-1].split('error: ', 1)[-1]}") from None
  unknown = sorted(set(given) - set(known))
  if unknown:
    raise fileio.InputError(
        f"--beam_pipeline_options: Beam (runner {known['runner']}) has no pipeline option "
        f"{', '.join('--' + name for name in unknown)}")
  return pipeline


def _is_local(path):
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  return FileSystems.get_scheme(path) is None


def _beam_input_files(patterns):
  """--input_file -> (paths, total bytes): local paths and patterns as the local run expands
  them, others (gs://...) through Beam's file systems, with the same error for a pattern that
  matches nothing."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  files, total_bytes = [], 0
  for pattern in (p.strip() for p in patterns.split(",")):
    if not pattern:
      continue
    if _is_local(pattern):
      matches = fileio.expand_file_patterns(pattern)
      total_bytes += sum(os.path.getsize(path) for path in matches)
    else:
      try:
        metadata = sorted(FileSystems.match([pattern])[0].metadata_list, key=lambda m: m.path)
      except Exception as e:  # pylint: disable=broad-except
        raise fileio.InputError(f"input file pattern {pattern}: {e}") from None
      if not metadata:
        raise fileio.InputError(f"input file pattern matches no file: {pattern}")
      matches = [m.path for m in metadata]
      total_bytes += sum(m.size_in_bytes for m in metadata)
    files.extend(matches)
  if not files:
    raise fileio.InputError("no input file given")
  return files, total_bytes


def _beam_open(path):
  from apache_beam.io.filesystems import CompressionTypes  # pylint: disable=g-import-not-at-top
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _beam_read_chunks(input_files, chunk_documents):
  """The pipeline's first step, one call on one worker: the local run's chunks, in its order, as
  the spans of the input that hold them (the worker that takes a chunk reads its text)."""
  yield from iter_chunks(input_files, chunk_documents, opener=_beam_open, spans=True)


class _BeamChunkRecords:
  """The step run on every worker: a chunk (the spans of the input that hold it, read here) ->
  its records by _chunk_task (as in the local run), each sent to output shard (chunk index + its
  number) mod shards, and its Stats tagged "stats"; also counted in Beam metrics, which the
  launcher reads for its progress lines.

  The records go to files, one piece per chunk and shard, and only the pieces' names go through
  Beam's shuffle: neither text nor records pass between workers, so no worker (nor the local
  runner, which holds every collection between steps) holds more than its chunks in flight, and
  the shard writers stream the pieces.
  Beam gives each worker thread a copy of this object, so the tokenizer and encoder built on
  first use are that thread's own."""

  def __init__(self, options, tokenizer, num_shards, pieces):
    self._options, self._tokenizer, self._num_shards = options, tokenizer, num_shards
    self._pieces = pieces
    self._state = None

  def __call__(self, chunk):
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
    if self._state is None:
      self._state = _WorkerState.create(self._options, self._tokenizer)
    index, spans, nbytes = chunk
    records, stats = _chunk_task((index, read_chunk_spans(spans, opener=_beam_open), nbytes),
                                 self._state)
    for field in dataclasses.fields(stats):
      beam.metrics.Metrics.counter(_BEAM_METRICS, field.name).inc(getattr(stats, field.name))
    for j in range(min(self._num_shards, len(records))):  # record j, j + shards, ... go to
      shard = (index + j) % self._num_shards              # the same shard
      piece = _beam_piece_name(self._pieces, index, shard)
      _beam_write_piece(piece, records[j::self._num_shards])
      yield shard, (index, piece)
    yield beam.pvalue.TaggedOutput("stats", stats)


def _beam_piece_name(pieces, chunk_index, shard):
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  return FileSystems.join(pieces, f"{chunk_index:09d}-{shard:05d}")


def _beam_write_piece(path, records):
  """Writes `records` as (little-endian uint64 length, bytes) pairs: a file of this job's own,
  read back once by its shard's writer (no CRC: TFRecord's framing is for the final output)."""
  from apache_beam.io.filesystems import CompressionTypes  # pylint: disable=g-import-not-at-top
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  lengths = np.fromiter(map(len, records), "<u8", len(records))
  with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
    f.write(b"".join(itertools.chain.from_iterable(
        zip((n.tobytes() for n in lengths), records))))


def _beam_read_piece(path):
  """Yields the records of a piece that _beam_write_piece wrote, one at a time."""
  with _beam_open(path) as f:
    while header := f.read(8):
      length = struct.unpack("<Q", header)[0] if len(header) == 8 else -1  # -1: header cut
      record = f.read(max(length, 0))
      if len(record) != length:
        raise RuntimeError(f"{path}: truncated piece of records")
      yield record


def _add_stats(stats):
  total = Stats()
  for part in stats:
    total.add(part)
  return total


def _beam_temporaries(output_files, token):
  """(hidden siblings of the outputs for the workers to write, named as fileio.atomic_path names
  its temporaries, the hidden directory of the pieces beside the first output); `token`, the
  job's, is unpredictable."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  temporaries = []
  for path in output_files:
    directory, name = FileSystems.split(path)
    temporaries.append(FileSystems.join(directory, f".{name}.tmp-beam-{token}"))
  return temporaries, temporaries[0] + ".pieces"


def _beam_write_shard(shard_pieces, temporaries, output_files, shuffle_buffer_size, seed):
  """Writes one shard's records, read from its pieces in chunk order and mixed by the local run's
  shuffle buffer, to its temporary; returns (shard, number of records)."""
  from apache_beam.io.filesystems import CompressionTypes  # pylint: disable=g-import-not-at-top
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  shard, pieces = shard_pieces
  # In chunk order, so that the shard's bytes do not depend on the order the runner gives.
  paths = [path for _, path in sorted(piece for piece in pieces if piece is not None)]
  shard_records = shuffle_buffer(itertools.chain.from_iterable(map(_beam_read_piece, paths)),
                                 shuffle_buffer_size, ExactRandom(f"{seed}/output/{shard}"))
  with fileio.naming_output(output_files[shard]):
    with FileSystems.create(temporaries[shard],
                            compression_type=CompressionTypes.UNCOMPRESSED) as f:
      count = tfrecord_io.write_framed(f, shard_records)
  return shard, count


def _beam_remove(paths, pieces):
  """Removes those of the files `paths` that exist, and the directory `pieces` with its files."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  existing = [path for path in paths if FileSystems.exists(path)]
  if existing:
    FileSystems.delete(existing)
  if _is_local(pieces):
    fileio.remove_path(pieces)
  else:  # an object store has no directories: a name ending in "/" deletes what it prefixes
    with contextlib.suppress(Exception):
      FileSystems.delete([pieces + "/"])


def _beam_commit(counts, temporaries, pieces, output_files, stats, input_files):
  """The last step, once every shard is written: renames the temporaries onto the outputs and
  removes the pieces (or, when the input held no document, removes both and fails as the local
  run does)."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  if not stats.documents:
    _beam_remove(temporaries, pieces)
    raise fileio.InputError(_no_documents_message(input_files))
  written = sum(count for _, count in counts)
  # Records, not instances: a packed record holds several instances.
  if len(counts) != len(output_files) or written != stats.records:
    raise RuntimeError(f"{len(counts)} of {len(output_files)} shards with {written} records "
                       f"written, {stats.records} made")
  # A retried commit skips the shards it renamed before.
  pending = [(tmp, path) for tmp, path in zip(temporaries, output_files)
             if FileSystems.exists(tmp)]
  FileSystems.rename([tmp for tmp, _ in pending], [path for _, path in pending])
  _beam_remove([], pieces)


def _add_beam_steps(beam, pipeline, options, input_files, output_files, temporaries, pieces,
                    tokenizer):
  num_shards = len(output_files)
  chunks = (pipeline
            | "Input files" >> beam.Create([tuple(input_files)])
            | "Read chunks" >> beam.FlatMap(_beam_read_chunks, options.chunk_documents)
            | "Spread chunks" >> beam.Reshuffle())
  made = chunks | "Chunks to records" >> beam.FlatMap(
      _BeamChunkRecords(options, tokenizer, num_shards, pieces)).with_outputs(
          "stats", main="records")
  stats = made.stats | "Count" >> beam.CombineGlobally(_add_stats)
  # One (shard, None) per shard, so that a shard no record goes to is still written (empty).
  every_shard = pipeline | "Every shard" >> beam.Create([(i, None) for i in range(num_shards)])
  _ = ((made.records, every_shard)
       | "Flatten" >> beam.Flatten()
       | "Group by shard" >> beam.GroupByKey()
       | "Write shards" >> beam.Map(_beam_write_shard, temporaries, output_files,
                                    options.shuffle_buffer_size, options.random_seed)
       | "All shards" >> beam.combiners.ToList()
       | "Commit" >> beam.Map(_beam_commit, temporaries, pieces, output_files,
                              beam.pvalue.AsSingleton(stats), input_files))


def _beam_stats(result, committed=True):
  """The Stats from the job's metrics (attempted: including work a runner may yet retry)."""
  from apache_beam.metrics.metric import MetricsFilter  # pylint: disable=g-import-not-at-top
  stats = Stats()
  for counter in result.metrics().query(MetricsFilter().with_namespace(_BEAM_METRICS))["counters"]:
    value = counter.committed if committed and counter.committed is not None else counter.attempted
    name = counter.key.metric.name
    setattr(stats, name, getattr(stats, name) + (value or 0))
  return stats


def _run_and_wait(pipeline, total_bytes, progress_seconds):
  """Runs the job, logging progress lines as the local run does; returns the final Stats.

  Remote runners (Dataflow, Flink, Spark) run the job while this process polls its metrics; the
  local FnApiRunner has finished the job when pipeline.run() returns, so only the last line shows.
  """
  from apache_beam.runners.runner import PipelineState  # pylint: disable=g-import-not-at-top
  progress = Progress("fast mode", total_bytes, "B", progress_seconds)
  # pipeline.run() runs the whole job when the runner is local, waiting where a signal handler
  # may not get to run: it runs in a thread, so that Ctrl-C or SIGTERM stops this one at once.
  outcome = []
  thread = threading.Thread(target=lambda: outcome.append(_call(pipeline.run)), daemon=True)
  thread.start()
  while thread.is_alive():
    thread.join(0.5)
  result, error = outcome[0]
  if error is not None:
    raise error
  last = time.monotonic()
  while not PipelineState.is_terminal(result.state):
    time.sleep(1)
    if time.monotonic() - last >= progress_seconds:
      last = time.monotonic()
      stats = _beam_stats(result, committed=False)
      progress.update(stats.input_bytes, _progress_detail(stats, progress))
  result.wait_until_finish()
  if result.state != PipelineState.DONE:
    raise fileio.ReportedError(f"the Beam job ended in state {result.state}")
  stats = _beam_stats(result)
  progress.update(stats.input_bytes, f"{stats.documents} documents, {stats.instances} instances",
                  force=True)
  return stats


def _call(function):
  """(function(), None), or (None, the exception it raised)."""
  try:
    return function(), None
  except Exception as e:  # pylint: disable=broad-except
    return None, e


def _worker_error(error, output_directory):
  """The InputError (a bad input line, say) or OSError (a full disk) that a worker raised, from
  the runner's report of a failed job, which holds the worker's traceback as text; None if there
  is neither. An OSError that names no file (a write that found the disk full) is given the
  directory the job writes to."""
  # Beam appends the step's name to the message of an error it passes on.
  text = f"InputError: {error}" if isinstance(error, fileio.InputError) else str(error)
  match = re.search(r"InputError: (.+?)(?: \[while running '[^\n]*'\])*$", text, re.M)
  if match:
    return fileio.InputError(match.group(1))
  match = re.search(r"(?:OSError|IOError): \[Errno (\d+)\] ([^:\[\n]+?)(?:: '([^'\n]*)')?"
                    r"(?: \[while running|$)", text, re.M)
  if match:
    return OSError(int(match.group(1)), match.group(2), match.group(3) or output_directory)
  return None


@contextlib.contextmanager
def _beam_environment():
  """While Beam is set up and runs: the directory that holds the package bert_tf2 on PYTHONPATH,
  for the local runner's worker processes (they inherit the environment) to import this module by
  name; Beam's INFO lines kept out of the log but for Dataflow's (the job's console address), and
  the local runner's copies of its workers' logs too: an error they show ends the job, and it is
  reported then."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["bert_tf2"].__file__)))
  before = os.environ.get("PYTHONPATH")
  os.environ["PYTHONPATH"] = os.pathsep.join([root] + ([before] if before else []))
  levels = {"apache_beam": std_logging.WARNING, "apache_beam.runners.dataflow": std_logging.INFO,
            "apache_beam.runners.common": std_logging.CRITICAL,
            "apache_beam.runners.portability.local_job_service": std_logging.CRITICAL}
  saved = {name: std_logging.getLogger(name).level for name in levels}
  for name, level in levels.items():
    std_logging.getLogger(name).setLevel(level)
  try:
    yield
  finally:
    for name, level in saved.items():
      std_logging.getLogger(name).setLevel(level)
    if before is None:
      os.environ.pop("PYTHONPATH", None)
    else:
      os.environ["PYTHONPATH"] = before


def run_beam(options):
  """Fast mode as an Apache Beam job (--beam_pipeline_options); returns the Stats, as run does."""
  with _beam_environment():
    beam = _import_beam()
    pipeline = _beam_pipeline(beam, options.beam_pipeline_options)
    input_files, total_bytes = _beam_input_files(options.input_file)
    fileio.check_file(options.vocab_file, "vocab file")
    output_files = resolve_output_files(options.output_file, options.num_output_shards)
    local_outputs = [path for path in output_files if _is_local(path)]
    fileio.check_outputs(
        files=[("output_file", local_outputs)],
        inputs=[("input_file", [path for path in input_files if _is_local(path)]),
                ("vocab_file", options.vocab_file)])
    # Built here, so a bad vocab fails at once; the workers get it with the job, so they need no
    # access to the vocab file.
    tokenizer = tokenization.FullTokenizer(vocab_file=options.vocab_file,
                                           do_lower_case=options.do_lower_case)
    temporaries, pieces = _beam_temporaries(output_files, secrets.token_hex(8))
    _add_beam_steps(beam, pipeline, options, input_files, output_files, temporaries, pieces,
                    tokenizer)
    logging.info("*** Fast mode as a Beam job (runner %s) on %d input file(s) ***\n  %s",
                 pipeline.options.get_all_options()["runner"], len(input_files),
                 "\n  ".join(input_files))
    start = time.monotonic()
    before = fileio.descendants()
    # The temporaries and pieces are removed inside, so that a directory the job made is empty.
    with fileio.no_new_empty_directories(*map(os.path.dirname, local_outputs)):
      try:
        stats = _run_and_wait(pipeline, total_bytes, options.progress_seconds)
      except BaseException as e:
        # Stopped (Ctrl-C, SIGTERM), the local runner would leave its worker processes running,
        # and this process waiting for them: they are ended (a failed job has ended its own).
        # The runner's own threads then fail on their lost workers while this process exits;
        # their tracebacks and log lines would bury the one error line, so they are silenced.
        threading.excepthook = lambda args: None
        std_logging.getLogger("apache_beam").setLevel(std_logging.CRITICAL + 1)
        for pid in fileio.descendants() - before:
          with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
          _beam_remove(temporaries, pieces)
        error = (_worker_error(e, os.path.dirname(output_files[0]) or ".")
                 if isinstance(e, Exception) else None)
        if error is None:
          raise
        raise error from None
  _log_done(stats, start, output_files)
  return stats


# ---------------------------------------------------------------------------------------------
# Driver.


def run(options):
  """Creates the records for `options` and writes them; returns the Stats."""
  validate_options(options)
  if options.dynamic_masking and options.dupe_factor > 1:
    # Kept, not overridden: each pass still draws new splits and random next sentences. But the
    # passes exist to give the original's fixed masks variety, which run_pretraining's masking
    # (afresh at every read) gives already, so the flag's default of 10 is mostly disk.
    logging.warning(
        "--dupe_factor=%d with --dynamic_masking writes every document %d times (new splits, "
        "no masks: run_pretraining masks each read afresh), %dx the records; --dupe_factor=1 "
        "is usually enough", options.dupe_factor, options.dupe_factor, options.dupe_factor)
  if options.beam_pipeline_options:
    return run_beam(options)
  input_files = fileio.expand_file_patterns(options.input_file, "input file")
  fileio.check_file(options.vocab_file, "vocab file")
  output_files = resolve_output_files(options.output_file, options.num_output_shards)
  fileio.check_outputs(files=[("output_file", output_files)],
                       inputs=[("input_file", input_files), ("vocab_file", options.vocab_file)])
  num_workers = options.num_workers or os.cpu_count() or 1
  # Built here in both modes so a bad vocab fails at once, not inside a worker process.
  tokenizer = tokenization.FullTokenizer(vocab_file=options.vocab_file,
                                         do_lower_case=options.do_lower_case)
  vocab_ids = VocabIds(tokenizer.vocab)
  logging.info("*** Reading from %d input file(s) ***\n  %s", len(input_files),
               "\n  ".join(input_files))
  start = time.monotonic()

  total_bytes = sum(os.path.getsize(path) for path in input_files)
  if options.mode == "fast":
    if not options.num_workers and total_bytes < _PARALLEL_FAST_MIN_BYTES:
      num_workers = 1
    stats = Stats()
    # closing(): an error while writing stops the workers now, not when the generator is freed.
    records = create_fast_records(input_files, options, stats, num_workers, tokenizer)
    with contextlib.closing(records):
      count = tfrecord_io.write_sharded(records, output_files)
    assert count == stats.records
  else:
    workers = num_workers if total_bytes >= _PARALLEL_TOKENIZE_MIN_BYTES else 1
    progress = Progress("reading and tokenizing", total_bytes, "B", options.progress_seconds)
    if workers > 1:
      with worker_pool(options, workers) as pool:
        corpus = read_corpus(input_files, tokenizer, pool, workers + 2, progress)
    else:
      corpus = read_corpus(input_files, tokenizer, progress=progress)
    if not corpus.documents:
      raise fileio.InputError(_no_documents_message(input_files))
    logging.info("Read %d documents (%d tokens) in %.1f s", len(corpus.documents),
                 len(corpus.tokens), time.monotonic() - start)
    records, stats = create_exact_records(corpus, options, vocab_ids, tokenizer,
                                          options.progress_seconds)
    stats.input_bytes = total_bytes
    del corpus
    logging.info("*** Writing %d instances to %d output file(s) ***\n  %s", len(records),
                 len(output_files), "\n  ".join(output_files))
    tfrecord_io.write_sharded(records, output_files)

  _log_done(stats, start, output_files)
  return stats


def _log_done(stats, start, output_files):
  elapsed = time.monotonic() - start
  logging.info("Wrote %s in %.1f s (%.2f MB/s of text)", stats.summary(), elapsed,
               stats.input_bytes / 1e6 / max(elapsed, 1e-9))
  logging.info("Output file(s):\n  %s", "\n  ".join(output_files))


def main(_):
  logging.set_verbosity(logging.INFO)
  run(Options(**{field.name: getattr(FLAGS, field.name) for field in dataclasses.fields(Options)}))


def cli():
  """The command line: `python create_pretraining_data.py` and the `bert-create-pretraining-data` command."""
  define_flags()
  for name in ("input_file", "output_file", "vocab_file"):
    flags.mark_flag_as_required(name)
  commands.run_main(main)
