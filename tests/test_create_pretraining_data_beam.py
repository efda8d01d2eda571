"""Tests for create_pretraining_data --beam_pipeline_options: fast mode as an Apache Beam job.

The job runs on Beam's in-process runner (FnApiRunner; DirectRunner would first try to download
the Prism runner), with two worker processes where the records are compared, and must write the
multiset of records the local fast mode writes.
"""

import collections
import importlib.util
import os
import resource
import signal
import sys
import tempfile
import time

import pytest

from conftest import (DEVNULL, ENV, PIPE, ROOT, VOCAB, WIKITEXT, popen, requires_shared,
                      run_process, run_script)
from bert_tf2 import create_pretraining_data as cpd
from bert_tf2 import fileio
from bert_tf2 import pretraining_data as ptd
from bert_tf2 import pretraining_data_beam as ptd_beam

requires_beam = pytest.mark.skipif(
    importlib.util.find_spec("apache_beam") is None,
    reason="apache_beam is not installed (`pip install -r requirements-beam.txt`; make setup "
           "installs it)")

TWO_WORKERS = "--runner=FnApiRunner --direct_num_workers=2 --direct_running_mode=multi_processing"
# Small chunks, so that the 60 documents make 8 chunks for the two workers.
FAST = dict(mode="fast", dupe_factor=1, chunk_documents=8, shuffle_buffer_size=300,
            num_output_shards=3)


def tfrecords(path):
  """The records of a TFRecord file, from its framing (tfrecord_io.tfrecord_bytes writes it)."""
  with open(path, "rb") as f:
    data = f.read()
  records, i = [], 0
  while i < len(data):
    length = int.from_bytes(data[i:i + 8], "little")
    records.append(data[i + 12:i + 12 + length])
    i += 12 + length + 4
  return records


def options(tmp_path, name, **kwargs):
  kwargs = {"input_file": WIKITEXT, "vocab_file": VOCAB, "num_workers": 1, **FAST, **kwargs}
  return ptd.Options(output_file=os.path.join(str(tmp_path), name), **kwargs)


def test_pipeline_options_in_both_forms():
  assert ptd_beam.beam_pipeline_args("runner=DataflowRunner, project=p,region=europe-west4") == [
      "--runner=DataflowRunner", "--project=p", "--region=europe-west4"]
  assert ptd_beam.beam_pipeline_args(" --runner=FlinkRunner --flink_master='host:8081' "
                                "--experiments=a,b") == [
      "--runner=FlinkRunner", "--flink_master=host:8081", "--experiments=a,b"]


def test_without_beam_the_flag_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "apache_beam", None)  # `import apache_beam` fails
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\nsat\n.\n", encoding="utf-8")
  text = tmp_path / "text.txt"
  text.write_text("the cat sat.\nthe cat.\n\ncat sat.\nthe the cat.\n", encoding="utf-8")
  tiny = dict(input_file=str(text), vocab_file=str(vocab), max_seq_length=16,
              max_predictions_per_seq=2)
  with pytest.raises(fileio.InputError,
                     match=r"--beam_pipeline_options needs Apache Beam.*requirements-beam.txt"):
    cpd.run(options(tmp_path, "out/", beam_pipeline_options="runner=FnApiRunner", **tiny))
  assert not os.path.exists(tmp_path / "out")
  # Without the flag, fast mode runs as ever.
  assert cpd.run(options(tmp_path, "out/", **tiny)).instances > 0
  assert len(os.listdir(tmp_path / "out")) == 3


@requires_shared
@requires_beam
def test_beam_job_on_two_workers_writes_the_local_fast_mode_records(tmp_path):
  local = cpd.run(options(tmp_path, "local/"))
  # From another directory, as a user would: the worker processes still import the project.
  done = run_process(
      [sys.executable, os.path.join(ROOT, "create_pretraining_data.py"),
       f"--input_file={WIKITEXT}", f"--vocab_file={VOCAB}", f"--output_file={tmp_path}/beam/",
       f"--beam_pipeline_options={TWO_WORKERS}",
       *[f"--{name}={value}" for name, value in FAST.items()]],
      cwd=str(tmp_path), env=ENV, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  names = [f"pretraining-{i:05d}-of-00003.tfrecord" for i in range(3)]
  assert sorted(os.listdir(tmp_path / "beam")) == names  # no temporaries left
  shards = [tfrecords(tmp_path / "beam" / name) for name in names]
  local_records = [r for name in names for r in tfrecords(tmp_path / "local" / name)]
  beam_records = [r for shard in shards for r in shard]
  assert len(beam_records) == local.instances > 500
  assert collections.Counter(beam_records) == collections.Counter(local_records)
  # Dealt evenly: each chunk's records go round the shards.
  assert max(map(len, shards)) - min(map(len, shards)) <= 8
  # The counts are reported as the local run reports them.
  assert f"Wrote {local.summary()}" in done.stderr
  assert "fast mode: 1.1/1.1 MB (100%)" in done.stderr
  # A quiet console: none of the ~20 start-up and shut-down lines each worker process logs.
  assert not [line for line in done.stderr.splitlines() if line.startswith("INFO:")], done.stderr
  # The shards' bytes do not depend on the runner or its number of workers: each is read from
  # its pieces in chunk order.
  cpd.run(options(tmp_path, "in_process/", beam_pipeline_options="runner=FnApiRunner"))
  for name in names:
    assert (tmp_path / "in_process" / name).read_bytes() == (tmp_path / "beam" / name).read_bytes()


@requires_shared
@requires_beam
def test_beam_job_outputs_and_counts_in_process(tmp_path):
  # The in-process runner without worker processes: the same records again, into a {shard}
  # pattern, and the same Stats.
  local = cpd.run(options(tmp_path, "local.tfrecord", num_output_shards=1, no_nsp=True))
  beam = cpd.run(options(tmp_path, "out/part-{shard}.tfrecord", num_output_shards=2,
                         no_nsp=True, beam_pipeline_options="runner=FnApiRunner"))
  assert beam == local
  assert sorted(os.listdir(tmp_path / "out")) == ["part-0.tfrecord", "part-1.tfrecord"]
  records = tfrecords(tmp_path / "out" / "part-0.tfrecord") + tfrecords(
      tmp_path / "out" / "part-1.tfrecord")
  assert collections.Counter(records) == collections.Counter(
      tfrecords(tmp_path / "local.tfrecord"))


@requires_shared
@requires_beam
def test_beam_job_with_more_shards_than_records_per_chunk(tmp_path):
  # One document per chunk and 200 shards: a chunk's records reach only some of the shards,
  # starting at the shard after the previous chunk's last.
  kwargs = dict(chunk_documents=1, num_output_shards=200)
  local = cpd.run(options(tmp_path, "local/", **kwargs))
  beam = cpd.run(options(tmp_path, "beam/", beam_pipeline_options="runner=FnApiRunner", **kwargs))
  assert beam == local
  names = sorted(os.listdir(tmp_path / "local"))
  assert sorted(os.listdir(tmp_path / "beam")) == names and len(names) == 200
  read = lambda d: collections.Counter(r for n in names for r in tfrecords(tmp_path / d / n))
  assert read("beam") == read("local") and sum(read("beam").values()) == local.instances


@requires_shared
@requires_beam
def test_beam_job_with_packed_sequences_writes_the_local_packed_records(tmp_path):
  # Packed, a record holds several instances: the commit checks the records written against the
  # records made (it compared them with the instances, and failed every packed job at the end).
  for dynamic_masking in (False, True):  # masked here, and unmasked for run_pretraining
    kwargs = dict(pack_sequences=True, dynamic_masking=dynamic_masking, num_output_shards=2)
    local_dir, beam_dir = f"local{int(dynamic_masking)}", f"beam{int(dynamic_masking)}"
    local = cpd.run(options(tmp_path, local_dir + "/", **kwargs))
    beam = cpd.run(options(tmp_path, beam_dir + "/", beam_pipeline_options="runner=FnApiRunner",
                           **kwargs))
    assert beam == local and local.records < local.instances
    names = sorted(os.listdir(tmp_path / local_dir))
    assert sorted(os.listdir(tmp_path / beam_dir)) == names and len(names) == 2
    read = lambda d: collections.Counter(r for n in names for r in tfrecords(tmp_path / d / n))
    assert read(beam_dir) == read(local_dir) and sum(read(beam_dir).values()) == local.records


@requires_shared
@requires_beam
def test_beam_job_bad_input_and_options_are_clear_errors(tmp_path, monkeypatch):
  # Beam makes a folder in the temporary directory for each pipeline it creates, which only
  # running the pipeline removes: a job refused before it runs must not leave one.
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(temporary))
  bad = tmp_path / "bad.txt"
  bad.write_bytes("Fine line.\n\nCaf\u00e9 ".encode() + b"\xff\xfe broken\n")
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"\n  \n\n")
  in_process = "runner=FnApiRunner"
  with pytest.raises(fileio.InputError, match=r"^\S*bad.txt:3: invalid UTF-8 at byte 6 of the "
                                              r"line \(b'\\xff\\xfe b'\); re-encode the file as "
                                              r"UTF-8$"):
    cpd.run(options(tmp_path, "out/", input_file=str(bad), beam_pipeline_options=in_process))
  with pytest.raises(fileio.InputError, match=r"^no documents in the input \(\S*empty.txt\): "
                                              r"it needs text .* between documents$"):
    cpd.run(options(tmp_path, "out/", input_file=str(empty), beam_pipeline_options=in_process))
  # Neither left a file (nor a temporary) or the directory it would have made.
  assert not os.path.exists(tmp_path / "out")
  for flag, message in [
      ("direct_num_worker=2", r"Beam \(runner FnApiRunner\) has no pipeline option "
                              r"--direct_num_worker$"),
      ("direct_running_mode=many", r"argument --direct_running_mode: invalid choice: 'many'"),
      ("runner=NoSuchRunner", "Unexpected pipeline runner: NoSuchRunner"),
  ]:
    with pytest.raises(fileio.InputError, match="^--beam_pipeline_options: " + message):
      cpd.run(options(tmp_path, "out/", beam_pipeline_options=flag))
  with pytest.raises(fileio.InputError, match="--beam_pipeline_options runs fast mode; add "
                                              "--mode=fast"):
    cpd.run(options(tmp_path, "out/", mode="exact", beam_pipeline_options=in_process))
  missing_vocab = str(tmp_path / "no_vocab.txt")
  with pytest.raises(fileio.InputError, match="no_vocab.txt"):
    cpd.run(options(tmp_path, "out/", vocab_file=missing_vocab, beam_pipeline_options=in_process))
  assert not [p for p in os.listdir(temporary) if p.startswith("beam-pipeline-temp")]


@requires_shared
@requires_beam
def test_command_line_bad_line_is_one_error_line(tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"One sentence.\nAnother one.\n\n\xc3 cut\n")
  done = run_script([os.path.join(ROOT, "create_pretraining_data.py"), f"--input_file={bad}",
                     f"--vocab_file={VOCAB}", f"--output_file={tmp_path}/out/", "--mode=fast",
                     f"--beam_pipeline_options={TWO_WORKERS}"], env=ENV)
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.strip().splitlines()[-1] == (
      f"error: {bad}:4: invalid UTF-8 at byte 0 of the line (b'\\xc3 cu'); re-encode the file "
      f"as UTF-8")
  assert not os.path.exists(tmp_path / "out")


def _beam_workers(root):
  """Ids of the Beam SDK worker processes under process `root`, from /proc."""
  parents, commands = {}, {}
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
        parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        commands[int(entry)] = f.read()
    except (OSError, IndexError, ValueError):
      continue
  tree, frontier = set(), [root]
  while frontier:
    parent = frontier.pop()
    children = [pid for pid, ppid in parents.items() if ppid == parent]
    tree.update(children)
    frontier.extend(children)
  return {pid for pid in tree if b"sdk_worker_main" in commands.get(pid, b"")}


@requires_shared
@requires_beam
def test_a_full_disk_in_a_worker_is_one_error_line_naming_the_output(tmp_path):
  def limit():  # writes past 200 kB fail with EFBIG, as they would with ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

  done = run_script([os.path.join(ROOT, "create_pretraining_data.py"), f"--input_file={WIKITEXT}",
                     f"--vocab_file={VOCAB}", f"--output_file={tmp_path}/out/", "--mode=fast",
                     "--num_output_shards=1", f"--beam_pipeline_options={TWO_WORKERS}"],
                    env=ENV, preexec_fn=limit)
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.strip().splitlines()[-1] == f"error: {tmp_path}/out: File too large"
  assert not os.path.exists(tmp_path / "out")


@requires_shared
@requires_beam
def _start_two_worker_job(tmp_path, **popen_args):
  """A Beam job on two workers over 10x WikiText, once both workers run: (process, workers)."""
  corpus = tmp_path / "corpus.txt"
  with open(WIKITEXT, "rb") as f:
    corpus.write_bytes(f.read() * 10)
  proc = popen(
      [sys.executable, os.path.join(ROOT, "create_pretraining_data.py"), f"--input_file={corpus}",
       f"--vocab_file={VOCAB}", f"--output_file={tmp_path}/out/", "--mode=fast",
       f"--beam_pipeline_options={TWO_WORKERS}"],
      cwd=None, env=ENV, stdout=DEVNULL, stderr=PIPE, text=True, **popen_args)
  deadline = time.time() + 120
  while len(workers := _beam_workers(proc.pid)) < 2:  # the job is under way
    if proc.poll() is not None or time.time() > deadline:
      proc.kill()
      raise AssertionError(f"the job did not get going: {proc.communicate()[1][-3000:]}")
    time.sleep(0.1)
  return proc, workers


def test_sigterm_stops_the_job_its_workers_and_leaves_no_output(tmp_path):
  proc, workers = _start_two_worker_job(tmp_path)
  try:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 143, err[-3000:]
  assert err.strip().splitlines()[-1] == (
      "error: stopped by SIGTERM; no incomplete output was left under its final name")
  assert not os.path.exists(tmp_path / "out")
  time.sleep(0.5)
  assert not {pid for pid in workers if _running(pid)}, "workers outlived it"


def _running(pid):
  """Whether process `pid` exists and is not a zombie (ended, not yet reaped)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


@requires_shared
@requires_beam
def test_ctrl_c_to_the_whole_group_is_one_line_without_worker_tracebacks(tmp_path):
  """Ctrl-C in a terminal reaches every process of the group, the Beam workers too, which then
  printed their KeyboardInterrupt tracebacks around the one error line: now only that line."""
  proc, workers = _start_two_worker_job(tmp_path, start_new_session=True)
  try:
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  lines = err.strip().splitlines()
  assert lines[-1] == ("error: stopped by SIGINT (Ctrl-C); no incomplete output was left under "
                       "its final name")
  assert sum(line.startswith("error:") for line in lines) == 1
  assert not os.path.exists(tmp_path / "out")
  time.sleep(0.5)
  assert not {pid for pid in workers if _running(pid)}, "workers outlived it"
