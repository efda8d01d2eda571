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
chunks from the same reader, turned into records by the same process_chunk (see
pretraining_data_beam.py).

Beyond the original, --no_nsp writes single-segment [CLS] A [SEP] instances for MLM-only
pre-training (next_sentence_labels is still written, as 0, so every reader keeps working).

Fast mode has two more options, which run_pretraining recognizes from the records' features:

* --dynamic_masking writes the instances unmasked, with what masking needs: token_kinds (per
  token 0 = never masked: [CLS], [SEP], padding; 1 = a word's first WordPiece; 2 = a "##" piece
  of the word before), mask_token_id and vocab_words (the vocabulary's size: the range of the
  random replacements); run_pretraining masks them afresh each time it reads
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

Where the code lives: this script holds the flags, the Options it builds from them and the
drivers (run: exact mode, and fast mode with its local worker pool). The algorithm that every
mode calls (reading, instances, masking, packing, encoding, chunks) is the library
bert_tf2/pretraining_data.py, and the Beam job is bert_tf2/pretraining_data_beam.py: tests and
benchmarks import those for the algorithm, and this script only to run it (run).
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import time

from absl import flags
from absl import logging

from bert_tf2 import pretraining_data
from bert_tf2 import pretraining_data_beam
from bert_tf2 import script_flags
from bert_tf2 import tfrecord_io

FLAGS = flags.FLAGS

# Exact mode tokenizes in worker processes only for inputs of at least this many bytes (starting
# them takes seconds).
_PARALLEL_TOKENIZE_MIN_BYTES = 16 << 20
# Fast mode with the default --num_workers works in-process below this input size: starting the
# workers costs more than they save there (on 2 cores, 4.3 MB: 2.6 s in-process, 3.0 s with two
# workers; 13 MB: 7.3 s and 6.2 s). The output is the same either way.
_PARALLEL_FAST_MIN_BYTES = 8 << 20


def define_flags():
  """Defines the script's flags.

  They are defined when the script runs, not at import: the tests import this module (its run)
  without its flags.
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
      "Number of files when --output_file is a {shard} pattern or a directory.", lower_bound=1,
      upper_bound=pretraining_data.MAX_OUTPUT_SHARDS)
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


# ---------------------------------------------------------------------------------------------
# The local worker processes (tokenizing in both modes, whole chunks in fast mode): the pool that
# starts them. What they run is the library's (pretraining_data.init_worker, chunk_task).


class _WorkerPool(concurrent.futures.ProcessPoolExecutor):
  """Spawns its workers (inside submit) with SIGINT blocked: the signal mask is inherited, so a
  Ctrl-C during a worker's start-up waits until pretraining_data.init_worker has made it ignore
  SIGINT."""

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
                     initializer=pretraining_data.init_worker, initargs=(options, os.getpid()))
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
  total_bytes = sum(fileio.size(path) for path in input_files)
  progress = pretraining_data.Progress("fast mode", total_bytes, "B", options.progress_seconds)
  with contextlib.ExitStack() as stack:
    chunks = pretraining_data.iter_chunks(input_files, options.chunk_documents)
    if num_workers <= 1:
      state = pretraining_data.WorkerState.create(options, tokenizer)
      results = (pretraining_data.chunk_task(chunk, state) for chunk in chunks)
    else:
      pool = stack.enter_context(worker_pool(options, num_workers))
      results = pretraining_data.ordered_map(pool, pretraining_data.chunk_task, chunks,
                                             window=num_workers + 2)

    def chunk_records():
      for records, chunk_stats in results:
        stats.add(chunk_stats)
        progress.update(stats.input_bytes, pretraining_data.progress_detail(stats, progress))
        yield from records
      if not stats.documents:
        raise fileio.InputError(pretraining_data.no_documents_message(input_files))

    yield from pretraining_data.shuffle_buffer(
        chunk_records(), options.shuffle_buffer_size,
        pretraining_data.ExactRandom(f"{options.random_seed}/output"))
  progress.update(stats.input_bytes, f"{stats.documents} documents, {stats.instances} instances",
                  force=True)


# ---------------------------------------------------------------------------------------------
# Driver.


def run(options):
  """Creates the records for `options` and writes them; returns the Stats."""
  pretraining_data.validate_options(options)
  if options.dynamic_masking and options.dupe_factor > 1:
    # Kept, not overridden: each pass still draws new splits and random next sentences. But the
    # passes exist to give the original's fixed masks variety, which run_pretraining's masking
    # (afresh at every read) gives already, so the flag's default of 10 is mostly disk.
    logging.warning(
        "--dupe_factor=%d with --dynamic_masking writes every document %d times (new splits, "
        "no masks: run_pretraining masks each read afresh), %dx the records; --dupe_factor=1 "
        "is usually enough", options.dupe_factor, options.dupe_factor, options.dupe_factor)
  if options.beam_pipeline_options:
    return pretraining_data_beam.run_beam(options)
  input_files = fileio.expand_file_patterns(options.input_file, "input file")
  fileio.check_file(options.vocab_file, "vocab file")
  output_files = pretraining_data.resolve_output_files(options.output_file,
                                                       options.num_output_shards)
  fileio.check_outputs(files=[("output_file", output_files)],
                       inputs=[("input_file", input_files), ("vocab_file", options.vocab_file)])
  tfrecord_io.check_open_files(output_files)
  stale = pretraining_data.earlier_shards(options.output_file, output_files)
  num_workers = options.num_workers or os.cpu_count() or 1
  # Built here in both modes so a bad vocab fails at once, not inside a worker process.
  tokenizer = pretraining_data.load_tokenizer(options.vocab_file, options.do_lower_case)
  vocab_ids = pretraining_data.VocabIds(tokenizer.vocab)
  logging.info("*** Reading from %d input file(s) ***\n  %s", len(input_files),
               "\n  ".join(input_files))
  start = time.monotonic()

  total_bytes = sum(fileio.size(path) for path in input_files)
  if options.mode == "fast":
    if not options.num_workers and total_bytes < _PARALLEL_FAST_MIN_BYTES:
      num_workers = 1
    stats = pretraining_data.Stats()
    # closing(): an error while writing stops the workers now, not when the generator is freed.
    records = create_fast_records(input_files, options, stats, num_workers, tokenizer)
    with contextlib.closing(records):
      count = tfrecord_io.write_sharded(records, output_files)
    assert count == stats.records
  else:
    workers = num_workers if total_bytes >= _PARALLEL_TOKENIZE_MIN_BYTES else 1
    progress = pretraining_data.Progress("reading and tokenizing", total_bytes, "B",
                                         options.progress_seconds)
    if workers > 1:
      with worker_pool(options, workers) as pool:
        corpus = pretraining_data.read_corpus(input_files, tokenizer, pool, workers + 2, progress)
    else:
      corpus = pretraining_data.read_corpus(input_files, tokenizer, progress=progress)
    if not corpus.documents:
      raise fileio.InputError(pretraining_data.no_documents_message(input_files))
    logging.info("Read %d documents (%d tokens) in %.1f s", len(corpus.documents),
                 len(corpus.tokens), time.monotonic() - start)
    records, stats = pretraining_data.create_exact_records(corpus, options, vocab_ids, tokenizer,
                                                           options.progress_seconds)
    stats.input_bytes = total_bytes
    del corpus
    logging.info("*** Writing %d instances to %d output file(s) ***\n  %s", len(records),
                 len(output_files), "\n  ".join(output_files))
    tfrecord_io.write_sharded(records, output_files)

  pretraining_data.remove_earlier_shards(stale)
  pretraining_data.log_done(stats, start, output_files)
  return stats


def main(_):
  logging.set_verbosity(logging.INFO)
  fileio.require(input_file=FLAGS.input_file, output_file=FLAGS.output_file,
                 vocab_file=FLAGS.vocab_file)
  run(script_flags.settings(pretraining_data.Options))


def cli():
  """The command line: `python create_pretraining_data.py` and the `bert-create-pretraining-data` command."""
  define_flags()
  commands.run_main(main)
