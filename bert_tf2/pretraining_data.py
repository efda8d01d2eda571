"""The algorithm of create_pretraining_data: text -> BERT pre-training records (masked LM + next
sentence prediction), in plain functions of plain values.

Every way of making the records calls this module: the script bert_tf2/create_pretraining_data.py
(its flags, its drivers and their local worker pool), the Apache Beam job in
pretraining_data_beam.py, and the tests and benchmarks. Nothing here reads absl FLAGS: a run's
settings come as an `Options`, whose fields are the script's flags (so that error messages can
name them). TensorFlow is not imported (example_feature_spec, for readers of the records, imports
it when called): the script starts fast and its worker processes stay small.

What it holds, in the order a run uses it:

- Options, their checks (validate_options) and the output paths (resolve_output_files);
- load_tokenizer, the tokenizer of a vocab that has [MASK] too (check_vocab);
- VocabIds, the vocab facts instance creation needs as ids, and ExactRandom, Python's
  random.Random draw for draw (exact mode must consume the original's random stream exactly);
- reading: iter_document_lines (documents as text lines, or as the spans of the input that hold
  them), tokenize_documents, and read_corpus into a Corpus (every document's token ids in one
  flat list, sentences as offsets into it);
- instances before masking: create_instances_from_document (sentence pairs, with the original's
  draws), create_single_segment_instances (--no_nsp), the two truncations (the original's loop,
  and its distribution in closed form for fast mode), assemble_batch (a batch's ids with numpy);
- masking: create_masked_lm_predictions (one instance, the original's draws, whole words too) and
  mask_instances_batch (a batch at once with numpy, fast mode);
- --dynamic_masking and --pack_sequences: token_kinds, pack_instances and encode_instances;
- Stats and Progress, the counts and log lines of a run;
- exact mode: create_exact_records, a whole Corpus -> the original's records in its order;
- fast mode: iter_chunks splits the input into chunks of documents, process_chunk turns one chunk
  into records with every random draw seeded from (random_seed, chunk index) alone, and
  shuffle_buffer mixes the records of consecutive chunks. What a worker process runs (init_worker,
  chunk_task) is here too, so that the script's worker pool and Beam's workers import the library
  by name and make the same records of a chunk.

What the two modes write and how they differ is told in the script's docstring.

Over the project's 1,000 lines, as one file on purpose: one algorithm, read top to bottom in the
order a run uses it, whose exact mode must make the original's random draws in the original's
order, and which the script, the Beam job, the tests and the benchmarks all call by these names.
If it grows further, the run's plumbing (Stats, Progress, the shard helpers, the worker and chunk
functions) would move to a module of its own, then fast mode's numpy batch functions.
"""

import bisect
import collections
import dataclasses
import itertools
import os
import random
import re
import signal
import threading
import time

from absl import logging
import numpy as np

from bert_tf2 import fileio
from bert_tf2 import masking
from bert_tf2 import tfrecord_io
from bert_tf2 import tokenization

# Fast mode keeps a chunk (and a document) below this many bytes of text, so one huge document
# or a file without blank lines cannot make a worker's memory grow with the corpus.
_MAX_CHUNK_BYTES = 8 << 20

# Exact mode tokenizes this many documents per batch call (bounded transient memory).
_TOKENIZE_BATCH_DOCUMENTS = 2000


# Bounds of the sizes a user controls, checked before any work (validate_options).
MAX_SEQ_LENGTH = 65536
MAX_OUTPUT_SHARDS = 10000


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
  mask_split: str = masking.DEFAULT  # [MASK], random, kept, in percent (masking.MaskSplit)
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
  if options.max_seq_length > MAX_SEQ_LENGTH:
    raise fileio.InputError(
        f"--max_seq_length={options.max_seq_length} is larger than any BERT's position table "
        f"(at most {MAX_SEQ_LENGTH} here; BERT's is 512): every record would hold that many ids")
  if not 1 <= options.max_predictions_per_seq <= options.max_seq_length:
    raise fileio.InputError(
        f"--max_predictions_per_seq={options.max_predictions_per_seq} must be between 1 and "
        f"--max_seq_length={options.max_seq_length}")
  if not 0.0 < options.masked_lm_prob <= 1.0:
    raise fileio.InputError(
        f"--masked_lm_prob={options.masked_lm_prob} must be in (0, 1] (0.15 in BERT)")
  split = masking.MaskSplit.parse(options.mask_split)
  if options.dynamic_masking and split != masking.MaskSplit():
    raise fileio.InputError(f"--mask_split={options.mask_split} with --dynamic_masking: the "
                            "records are masked by run_pretraining, give it --mask_split there")
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
  if not 1 <= options.num_output_shards <= MAX_OUTPUT_SHARDS:
    raise fileio.InputError(
        f"--num_output_shards={options.num_output_shards} must be between 1 and "
        f"{MAX_OUTPUT_SHARDS} (each shard is a file open while the records are written)")
  for name in ("dynamic_masking", "pack_sequences"):
    if getattr(options, name) and options.mode != "fast":
      raise fileio.InputError(
          f"--{name} needs --mode=fast (--mode={options.mode} writes the original's records, "
          "which are masked once and hold one instance each)")
  if options.max_instances_per_pack < 1:
    raise fileio.InputError(
        f"--max_instances_per_pack={options.max_instances_per_pack} must be at least 1")
  most = options.max_seq_length // 3
  if options.pack_sequences and options.max_instances_per_pack > most:
    # Each slot is a next-sentence label of every packed record (and of every batch
    # run_pretraining reads), so an absurd value would cost memory for slots no instance fills.
    raise fileio.InputError(
        f"--max_instances_per_pack={options.max_instances_per_pack} must be between 1 and "
        f"{most}: an instance takes at least 3 of the --max_seq_length={options.max_seq_length} "
        f"tokens ([CLS], a token, [SEP])")
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
  if output_file.endswith(("/", os.sep)) or fileio.isdir(output_file):
    return [os.path.join(output_file, f"pretraining-{i:05d}-of-{num_output_shards:05d}.tfrecord")
            for i in range(num_output_shards)]
  return [path.strip() for path in output_file.split(",") if path.strip()]


def check_vocab(vocab, vocab_file):
  """InputError naming `vocab_file` unless the vocab has [MASK]: what pre-training data needs
  beyond the tokens any FullTokenizer requires (tokenization.REQUIRED_TOKENS)."""
  tokenization.check_special_tokens(vocab, vocab_file, ("[MASK]",),
                                    "pre-training data needs it for its masked positions")


def load_tokenizer(vocab_file, do_lower_case=True, check=True):
  """tokenization.load_tokenizer for pre-training data: its vocab checked for [MASK] too."""
  tokenizer = tokenization.load_tokenizer(vocab_file, do_lower_case, check)
  check_vocab(tokenizer.vocab, vocab_file)
  return tokenizer


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
    # Not len(vocab): a token listed twice leaves its first id unused, a gap below the last.
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
      # Position i is final after this step and never read again: only the item moving to j
      # needs writing.
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
  numbers), so with a `pool` (see create_pretraining_data.worker_pool) batches of documents are
  tokenized in worker processes, at most `window` batches at a time, and collected in order.
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
  # Then one each in turn, B first: B takes the odd one.
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
  # Room left by [CLS], [SEP] and [SEP].
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

      # Short-circuit as the original's: a one-sentence chunk draws nothing here.
      is_random_next = chunk_size == 1 or rng.random() < 0.5
      if is_random_next:
        target_b_length = target_seq_length - (a_end - a_start)
        # Ten tries at a different document; with one document it ends up using itself.
        for _ in range(10):
          random_index = rng.randint(0, len(documents) - 1)
          if random_index != document_index:
            break
        other = documents[random_index]
        # The original's random_start = randint(0, sentences - 1); j is the bound after it. Whole
        # sentences are then added until B reaches its target length (at least one sentence).
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
  # Room left by [CLS] and [SEP].
  max_num_tokens = max_seq_length - 2
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  start = bounds[0]
  last = len(bounds) - 1
  for i in range(1, len(bounds)):
    # A loop: text past max_num_tokens is cut off into further instances (or carried on, when
    # shorter than the target).
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
  # [CLS] and A's [SEP], plus B's [SEP] for a pair.
  lengths = a_length + b_length + 2 + pair
  columns = np.arange(max_seq_length)[None, :]
  la, lb = a_length[:, None], b_length[:, None]
  in_a = (columns >= 1) & (columns <= la)
  in_b = (columns >= la + 2) & (columns < la + 2 + lb)
  source = np.where(in_a, a_start[:, None] + columns - 1, b_start[:, None] + columns - la - 2)
  # The gather reads index 0 outside A and B (keeping it in bounds); the outer where zeroes it.
  ids = np.where(in_a | in_b, tokens[np.where(in_a | in_b, source, 0)], 0).astype(np.int32)
  rows = np.arange(len(instances))
  ids[:, 0] = vocab_ids.cls_id
  ids[rows, a_length + 1] = vocab_ids.sep_id
  ids[rows[pair], lengths[pair] - 1] = vocab_ids.sep_id
  return ids, lengths, a_length + 2


# ---------------------------------------------------------------------------------------------
# Masking.


def create_masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab_ids, rng,
                                 do_whole_word_mask=False, segment_a_length=None,
                                 split=masking.MaskSplit()):
  """Masks one instance; returns (masked tokens, positions, label ids), positions ascending.

  A random round(len * masked_lm_prob) positions (at least 1, at most max_predictions_per_seq)
  other than [CLS]/[SEP] are predicted. With whole-word masking a word is skipped when all its
  WordPieces would exceed that number. Of the predicted positions, 80% become [MASK], 10% a random
  word and 10% stay unchanged (`split`, a masking.MaskSplit): [MASK] never occurs in fine-tuning,
  so the model must also learn real tokens at predicted positions, and keeping some unchanged
  ties the representation to the observed word.

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
  # A list of single indices takes the same draws as the original's list of one-index lists:
  # a shuffle's draws depend on the length alone.
  rng.shuffle(candidates, keep=None if do_whole_word_mask else num_to_predict)

  if do_whole_word_mask:
    chosen = []
    for word in candidates:
      if len(chosen) >= num_to_predict:
        break
      # A word that would overflow is skipped, not cut, and later (shorter) words may still fit.
      # The original also skipped words with an index already covered: candidates are disjoint,
      # so that check never fires and is left out.
      if len(chosen) + len(word) <= num_to_predict:
        chosen.extend(word)
  else:
    chosen = candidates[:num_to_predict]

  output = list(tokens)
  random_, randbelow = rng.random, rng.randbelow
  word_ids = vocab_ids.word_ids
  mask_id = vocab_ids.mask_id
  # The original draws these while it selects; selecting draws nothing, so drawing afterwards
  # in the same order consumes the stream identically. random() >= 0.5 is its random-word
  # branch (randbelow(n) being its randint(0, n - 1)); below 0.5 it keeps the token. (Those are
  # the default split's thresholds, exactly.)
  mask_below, keep_below = split.mask_below, split.keep_of_rest
  for index in chosen:
    if random_() < mask_below:
      output[index] = mask_id
    elif random_() >= keep_below:
      output[index] = word_ids[randbelow(len(word_ids))]
  chosen.sort()
  return output, chosen, [tokens[p] for p in chosen]


def mask_instances_batch(ids, lengths, masked_lm_prob, max_predictions_per_seq, vocab_ids,
                         np_rng, do_whole_word_mask=False, split=masking.MaskSplit()):
  """Fast mode's masking of many instances at once with numpy (same rules, other draws).

  `ids` [N, S] (see assemble_batch) are masked in place. Returns (positions [N, P], label ids
  [N, P], counts [N]); positions and labels are zero beyond each row's count.
  """
  n, seq = ids.shape
  preds = max_predictions_per_seq
  columns = np.arange(seq)
  candidate = _candidates(ids, lengths, vocab_ids)
  # Capped at the candidates, as the original's loop is by running out of them.
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
  # The chosen positions ascending (the original sorts its predictions), unused slots pushed
  # past the end, then zeroed: the records' padding.
  positions = np.sort(np.where(valid, chosen, seq), axis=1)
  positions[~valid] = 0
  labels = np.take_along_axis(ids, positions, axis=1)
  labels[~valid] = 0

  draw = np_rng.random((n, preds))
  random_words = vocab_ids.word_ids_array[np_rng.integers(0, len(vocab_ids.word_ids), (n, preds))]
  # The original's 80% [MASK], 10% random word, 10% unchanged (`split`), with numpy's draws.
  replacement = np.where(draw < split.mask_below, vocab_ids.mask_id,
                         np.where(draw < split.random_below, random_words, labels))
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
    # Every row full: no later rank can add a word.
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
  # Longest first: the long instances open the sequences, the short ones fill what is left.
  for i in np.argsort(-lengths, kind="stable").tolist():
    length, count = int(lengths[i]), int(predictions[i])
    chosen = None
    # Best fit: the open sequence with the least room that still holds the instance; one whose
    # prediction budget it would overflow is passed over for the next.
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
    # Open only while it could take another instance: room for the shortest, a free slot and a
    # prediction to spare; a full sequence is never searched again.
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
            ("vocab_words", np.full((n, 1), vocab_ids.size), False),
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

  # 1-based: 0 stays padding (input_mask below, and the model's attention mask, read it so).
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
    # An instance's predictions follow those of the instances before it in its sequence, their
    # positions shifted by its offset there.
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
             ("vocab_words", np.full((m, 1), vocab_ids.size), False),
             ("max_predictions_per_seq", np.full((m, 1), preds), False),
             ("masked_lm_prob", np.full((m, 1), options.masked_lm_prob, np.float32), True)]
  sentence_labels, sentence_weights = np.zeros((m, k), np.int64), np.zeros((m, k), np.float32)
  # A next-sentence slot per instance place; the unused ones weigh 0 in the loss.
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
  # The original's example dumps: --verbosity=1 shows them.
  logging.debug("*** Example *** (is_random_next=%s, segment A length %d)\ntokens: %s\n"
                "masked_lm_positions: %s\nmasked_lm_labels: %s", is_random_next,
                segment_a_length, " ".join(words), " ".join(map(str, positions)),
                " ".join(tokenizer.inv_vocab.get(t, "?") for t in labels))


def progress_detail(stats, progress):
  """A fast-mode progress line's detail: documents and instances so far, instances a second."""
  return (f"{stats.documents} documents, {stats.instances} instances "
          f"({progress.per_second(stats.instances):.0f}/s)")


_SHARD_NAME = re.compile(r"pretraining-(\d{5})-of-(\d{5})\.tfrecord")


def earlier_shards(output_file, output_files):
  """Shards an earlier run with another --num_output_shards left where this run writes: in an
  output directory, `pretraining-*-of-M.tfrecord` for another M; for a {shard} pattern, the
  pattern's files past this run's last index. A later glob of the directory or pattern would read
  them with this run's shards, two corpora mixed, so the run removes them once its own are in."""
  if "{" in output_file:
    stale = []
    for i in itertools.count(len(output_files)):
      try:
        path = output_file.format(shard=i, num_shards=len(output_files))
      except (KeyError, IndexError, ValueError):
        break
      if path in output_files or not fileio.isfile(path):
        break
      stale.append(path)
    return stale
  if not (output_file.endswith(("/", os.sep)) or fileio.isdir(output_file)):
    return []
  directory = os.path.dirname(output_files[0])
  try:
    names = fileio.listdir(directory)
  except OSError:
    return []
  count = f"{len(output_files):05d}"
  return sorted(os.path.join(directory, name) for name in names
                if (m := _SHARD_NAME.fullmatch(name)) and m.group(2) != count
                and fileio.isfile(os.path.join(directory, name)))


def remove_earlier_shards(stale):
  """Removes (and reports) the shards earlier_shards found, once this run's are written."""
  for path in stale:
    fileio.remove_path(path)
  if stale:
    logging.warning("Removed %d shard(s) an earlier run with another --num_output_shards left "
                    "beside this run's, so that a glob reads one corpus:\n  %s", len(stale),
                    "\n  ".join(stale))


def no_documents_message(input_files):
  """The error of a run whose input holds no document (every mode gives the same)."""
  return (f"no documents in the input ({', '.join(input_files)}): it needs text with one "
          f"sentence per line and blank lines between documents")


def log_done(stats, start, output_files):
  """Logs a finished run's summary (Stats.summary, time, speed) and its output files."""
  elapsed = time.monotonic() - start
  logging.info("Wrote %s in %.1f s (%.2f MB/s of text)", stats.summary(), elapsed,
               stats.input_bytes / 1e6 / max(elapsed, 1e-9))
  logging.info("Output file(s):\n  %s", "\n  ".join(output_files))
  if stats.records < len(output_files):
    logging.warning(
        "Only %d record(s) for %d output files: %d of them are empty; --num_output_shards=%d "
        "or fewer would leave none empty", stats.records, len(output_files),
        len(output_files) - stats.records, max(1, stats.records))


# ---------------------------------------------------------------------------------------------
# Exact mode.


def create_exact_records(corpus, options, vocab_ids, tokenizer=None, progress_seconds=30):
  """Exact mode's records, in the original's order, from a Corpus (its documents get shuffled).

  Returns (serialized records, Stats). Records are encoded as soon as an instance is masked, so
  only their bytes wait in memory for the final shuffle.
  """
  rng = ExactRandom(options.random_seed)
  split = masking.MaskSplit.parse(options.mask_split)
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
  # dupe_factor passes over the documents, each drawing other splits and masks: with masks
  # fixed in the records, the original's way of showing a sentence masked several ways.
  for dupe in range(options.dupe_factor):
    for document_index in range(len(documents)):
      for instance in create_unmasked_instances(documents, document_index, options, rng):
        tokens, segment_a_length = instance_tokens(corpus.tokens, instance, vocab_ids)
        masked, positions, labels = create_masked_lm_predictions(
            tokens, options.masked_lm_prob, options.max_predictions_per_seq, vocab_ids, rng,
            options.do_whole_word_mask, segment_a_length if layout_only else None, split)
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
  # Records in place of the original's instances: a list of the same length takes the same
  # draws, so the order is the original's.
  rng.shuffle(records)
  stats.instances = stats.records = len(records)
  stats.slots = len(records) * options.max_seq_length
  return records, stats


# ---------------------------------------------------------------------------------------------
# Worker processes (tokenizing in both modes, whole chunks in fast mode): what they run. The
# script's worker_pool starts them with init_worker; Beam's workers run chunk_task too.

_worker = None


@dataclasses.dataclass
class WorkerState:
  """What turning chunks into records takes, built once per worker process (or Beam worker
  thread): the Options, the tokenizer, its VocabIds and the record encoder."""
  options: Options
  tokenizer: object
  vocab_ids: VocabIds
  encoder: tfrecord_io.ExampleEncoder

  @classmethod
  def create(cls, options, tokenizer=None):
    if tokenizer is None:
      tokenizer = load_tokenizer(options.vocab_file, options.do_lower_case, check=False)
    vocab_ids = VocabIds(tokenizer.vocab)
    encoder = tfrecord_io.ExampleEncoder(options.max_seq_length, options.max_predictions_per_seq,
                                         vocab_ids.size)
    return cls(options, tokenizer, vocab_ids, encoder)


def init_worker(options, parent_pid):
  """Pool initializer: builds the tokenizer and encoder once per worker process.

  A Ctrl-C at a terminal reaches the whole process group: workers ignore it and are ended by the
  main process (no KeyboardInterrupt traceback from each). They started with SIGINT blocked (see
  create_pretraining_data._WorkerPool), so it is ignored before it is unblocked. A watchdog
  thread ends the worker when its parent is gone (killed with SIGKILL, say), so no worker runs on
  as an orphan.
  """
  global _worker
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
  _worker = WorkerState.create(options)


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
  # numpy's generator seeded from the chunk's own stream: both a function of (seed, chunk).
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
          np_rng, options.do_whole_word_mask, masking.MaskSplit.parse(options.mask_split))
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
  # Mixed within the chunk here; shuffle_buffer then mixes consecutive chunks' records.
  records = [records[i] for i in np_rng.permutation(len(records)).tolist()]
  return records, stats


def chunk_task(task, state=None):
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
    # A document starting where the last span ends, in its file, extends that span: one span
    # per run of consecutive documents.
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
