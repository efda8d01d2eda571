"""Fast mode of create_pretraining_data as an Apache Beam pipeline (--beam_pipeline_options).

It is fast mode on another engine: one reader splits the input with pretraining_data.iter_chunks
(so the chunks and their indices are the local run's, whatever the number of files and workers),
Beam spreads the chunks over its workers, and each chunk becomes records in
pretraining_data.chunk_task / process_chunk, the code the local run calls. So the job writes the
same multiset of records as the local run. It is a module of its own, beside the library rather
than in the script, because Beam sends its steps to the workers by reference to their module: a
worker imports this module and the library by name, never a script (whose flags are its own).
apache_beam is imported only when the job runs: importing this module needs no Beam, nor does the
script without the flag.

The records are then dealt to the output shards by chunk and position (balanced, each shard
drawing from every chunk), grouped by shard (Beam's shuffle, across machines), mixed within a
shard by the local run's bounded shuffle buffer and written to hidden temporaries, which a last
step renames onto the outputs once every shard is complete. The workers read and write through
Beam's file systems (local paths, gs://, hdfs://, s3://), which fileio's local-disk helpers
cannot; the temporaries are named as fileio names its own, so a write error names the output.

run_beam(options) runs the job: the script calls it for --beam_pipeline_options, once
validate_options has passed, and it returns the Stats as the local run does.
"""

import contextlib
import dataclasses
import io
import itertools
import logging as std_logging
import os
import re
import secrets
import shlex
import shutil
import signal
import struct
import sys
import threading
import time

from absl import logging
import numpy as np

from bert_tf2 import processes
from bert_tf2 import fileio
from bert_tf2 import pretraining_data
from bert_tf2 import tfrecord_io

_BEAM_DEFAULT_RUNNER = "FnApiRunner"
_LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner",
                  "SwitchingDirectRunner")
# What the local runner's worker processes print about themselves: their Python logging's INFO
# lines and two warnings about optional Google Cloud packages and a directory they do not need.
_LOCAL_WORKER_NOISE = re.compile(r"INFO:|WARNING:root:apitools not found|"
                                 r"WARNING:__main__:No semi_persistent_directory found")
_BEAM_METRICS = "create_pretraining_data"


def beam_pipeline_args(text):
  """--beam_pipeline_options -> Beam's command-line arguments.

  Two forms: TFDS's comma-separated `name=value` pairs, or Beam's own `--name=value ...` in one
  string (for values with commas).
  """
  text = text.strip()
  if text.startswith("-"):
    try:
      return shlex.split(text)
    except ValueError as e:  # an unclosed quote
      raise fileio.InputError(f"--beam_pipeline_options={text}: {e}") from None
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
  pipeline = None
  try:
    with contextlib.redirect_stderr(parse_errors):
      # Creating the runner imports its module, which may define more options (Flink, Spark).
      pipeline = beam.Pipeline(options=options)
      known = options.get_all_options()
      given = options.get_all_options(retain_unknown_options=True)
  except (ValueError, ImportError) as e:
    _remove_local_tempdir(pipeline)
    raise fileio.InputError(f"--beam_pipeline_options: {e}") from None
  except SystemExit:  # argparse's report of a bad value, after its usage text
    _remove_local_tempdir(pipeline)
    lines = parse_errors.getvalue().strip().splitlines() or ["a value cannot be parsed"]
    raise fileio.InputError(
        f"--beam_pipeline_options: {lines[-1].split('error: ', 1)[-1]}") from None
  unknown = sorted(set(given) - set(known))
  if unknown:
    _remove_local_tempdir(pipeline)
    raise fileio.InputError(
        f"--beam_pipeline_options: Beam (runner {known['runner']}) has no pipeline option "
        f"{', '.join('--' + name for name in unknown)}")
  return pipeline


def _remove_local_tempdir(pipeline):
  """Removes the folder a beam.Pipeline makes in the system's temporary directory when it is
  created (its `local_tempdir`), which only its run() removes: a job stopped by an error before
  it runs would leave one behind for each attempt."""
  shutil.rmtree(getattr(pipeline, "local_tempdir", None) or "", ignore_errors=True)


def _is_local(path):
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  return FileSystems.get_scheme(path) is None


# The extra of apache-beam that brings the file system of a scheme.
_BEAM_EXTRAS = {"gs": "gcp", "s3": "aws", "az": "azure", "hdfs": "hadoop"}


def _check_file_systems(flag, paths):
  """InputError naming the flag, the path and the extra to install when Beam has no file system
  for a path's scheme here (gs:// without apache-beam[gcp]: a ValueError deep in the job)."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  for path in paths:
    try:
      FileSystems.get_filesystem(path)
    except ValueError:
      scheme = path.split("://", 1)[0]
      extra = _BEAM_EXTRAS.get(scheme)
      install = (f"install it with `pip install 'apache-beam[{extra}]'`" if extra
                 else "install the Beam extra that provides it")
      raise fileio.InputError(f"--{flag}={path}: Beam has no file system for {scheme}:// here; "
                              f"{install}") from None


def _beam_input_files(patterns):
  """--input_file -> (paths, total bytes): local paths and patterns as the local run expands
  them, others (gs://...) through Beam's file systems, with the same error for a pattern that
  matches nothing."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  files, total_bytes = [], 0
  for pattern in (p.strip() for p in patterns.split(",")):
    if not pattern:
      continue
    _check_file_systems("input_file", [pattern])
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
  yield from pretraining_data.iter_chunks(input_files, chunk_documents, opener=_beam_open,
                                         spans=True)


class _BeamChunkRecords:
  """The step run on every worker: a chunk (the spans of the input that hold it, read here) ->
  its records by chunk_task (as in the local run), each sent to output shard (chunk index + its
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
      self._state = pretraining_data.WorkerState.create(self._options, self._tokenizer)
    index, spans, nbytes = chunk
    lines = pretraining_data.read_chunk_spans(spans, opener=_beam_open)
    records, stats = pretraining_data.chunk_task((index, lines, nbytes), self._state)
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
  total = pretraining_data.Stats()
  for part in stats:
    total.add(part)
  return total


def _beam_temporaries(output_files, token):
  """(hidden siblings of the outputs for the workers to write, named as fileio.atomic_path names
  its temporaries, the hidden directory of the pieces beside the first output); `token`, the
  job's, is unpredictable. The names hold this process' id, so that a later run removes what a
  job killed with SIGKILL left (fileio.remove_stale_temporaries)."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  temporaries = []
  for path in output_files:
    directory, name = FileSystems.split(path)
    temporaries.append(FileSystems.join(directory, f".{name}.tmp-beam-{os.getpid()}-{token}"))
  return temporaries, temporaries[0] + ".pieces"


def _beam_write_shard(shard_pieces, temporaries, output_files, shuffle_buffer_size, seed):
  """Writes one shard's records, read from its pieces in chunk order and mixed by the local run's
  shuffle buffer, to its temporary; returns (shard, number of records)."""
  from apache_beam.io.filesystems import CompressionTypes  # pylint: disable=g-import-not-at-top
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  shard, pieces = shard_pieces
  # In chunk order, so that the shard's bytes do not depend on the order the runner gives.
  paths = [path for _, path in sorted(piece for piece in pieces if piece is not None)]
  shard_records = pretraining_data.shuffle_buffer(
      itertools.chain.from_iterable(map(_beam_read_piece, paths)), shuffle_buffer_size,
      pretraining_data.ExactRandom(f"{seed}/output/{shard}"))
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
    raise fileio.InputError(pretraining_data.no_documents_message(input_files))
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
  stats = pretraining_data.Stats()
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
  progress = pretraining_data.Progress("fast mode", total_bytes, "B", progress_seconds)
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
      progress.update(stats.input_bytes, pretraining_data.progress_detail(stats, progress))
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
    try:
      input_files, total_bytes = _beam_input_files(options.input_file)
      fileio.check_file(options.vocab_file, "vocab file")
      output_files = pretraining_data.resolve_output_files(options.output_file,
                                                           options.num_output_shards)
      _check_file_systems("output_file", output_files)
      local_outputs = [path for path in output_files if _is_local(path)]
      fileio.check_outputs(
          files=[("output_file", local_outputs)],
          inputs=[("input_file", [path for path in input_files if _is_local(path)]),
                  ("vocab_file", options.vocab_file)])
      # Built here, so a bad vocab fails at once; the workers get it with the job, so they need no
      # access to the vocab file.
      tokenizer = pretraining_data.load_tokenizer(options.vocab_file, options.do_lower_case)
      stale = ([] if len(local_outputs) < len(output_files) else
               pretraining_data.earlier_shards(options.output_file, output_files))
      fileio.remove_stale_temporaries(local_outputs)
      temporaries, pieces = _beam_temporaries(output_files, secrets.token_hex(8))
      _add_beam_steps(beam, pipeline, options, input_files, output_files, temporaries, pieces,
                      tokenizer)
      logging.info("*** Fast mode as a Beam job (runner %s) on %d input file(s) ***\n  %s",
                   pipeline.options.get_all_options()["runner"], len(input_files),
                   "\n  ".join(input_files))
      start = time.monotonic()
      before = fileio.descendants()
      runner = pipeline.options.get_all_options()["runner"]
      # A local runner's worker processes write their start-up and shut-down INFO lines (some 20
      # each) and, when stopped, tracebacks to the stderr they inherit: held back while the job
      # runs here (a remote runner's job is polled with progress lines, which must come as they
      # come).
      quiet = (processes.filtered_stderr(_LOCAL_WORKER_NOISE, drop_all_if_stopped=True)
               if runner in _LOCAL_RUNNERS else contextlib.nullcontext())
      # The temporaries and pieces are removed inside, so that a directory the job made is empty.
      with fileio.no_new_empty_directories(*map(os.path.dirname, local_outputs)), quiet:
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
          if not isinstance(e, Exception):
            raise  # Ctrl-C, SIGTERM: the entry point's one line
          error = _worker_error(e, os.path.dirname(output_files[0]) or ".")
          if error is None:
            # A runner that cannot start or a job that failed for another reason: its text (often
            # many lines; the entry point prints the first) after what failed.
            error = fileio.ReportedError(f"the Beam job failed ({type(e).__name__}): {e}")
          raise error from None
    finally:
      _remove_local_tempdir(pipeline)
  pretraining_data.remove_earlier_shards(stale)
  pretraining_data.log_done(stats, start, output_files)
  return stats
