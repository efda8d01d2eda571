"""Reliability of the data scripts (create_pretraining_data, build_vocab, extract_features,
evaluate_squad) run as real processes: an output that is an input, bad numeric flags, interruption
and killed parents with worker processes, a full disk, literal `[...]` file names, malformed
predictions. Each failure must be one `error: ...` line with exit status 2 (130 / 143 when
stopped), no traceback, no file under an output's final name, no temporary left, and every input
byte-identical afterwards.
"""

import functools
import glob
import hashlib
import json
import os
import resource
import shutil
import signal
import time

import pytest

from conftest import (ENV, PIPE, PYTHON, ROOT, SHARED, TINY, VOCAB, CompletedProcess,
                      concurrently, popen, requires_shared, run_script)

pytestmark = requires_shared

PRETRAINING = os.path.join(SHARED, "reference", "pretraining")
SAMPLE_TEXT = os.path.join(PRETRAINING, "sample_text.txt")
CORPUS = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")
SQUAD_V1 = os.path.join(SHARED, "data", "squad", "dev-v1.1.json")
SQUAD_V2 = os.path.join(SHARED, "data", "squad", "dev-v2.0.Normans_subset.json")


def _start(args, **kw):
  return popen([PYTHON, *args], cwd=ROOT, env=kw.pop("env", ENV), text=True, stdout=PIPE,
               stderr=PIPE, **kw)


def _run_all(commands, **kw):
  """Runs the commands side by side (run_script, its keywords); their CompletedProcesses."""
  return concurrently([functools.partial(run_script, args, **kw) for args in commands],
                      workers=len(commands))


def _error_line(result, status=2):
  assert result.returncode == status, (result.args, result.stderr[-3000:])
  assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, (
      result.args, result.stderr[-3000:])
  lines = result.stderr.strip().splitlines()
  assert lines and lines[-1].startswith("error: "), (result.args, result.stderr[-3000:])
  assert sum(line.startswith("error:") for line in lines) == 1, result.stderr[-3000:]
  return lines[-1]


def _hashes(*tops):
  """{path: sha256} of every file (symlinks as their target's text) under the given paths."""
  found = {}
  for top in tops:
    paths = [top] if os.path.isfile(top) else [
        os.path.join(root, name) for root, _, names in os.walk(top) for name in names]
    for path in paths:
      if os.path.islink(path):
        found[path] = "-> " + os.readlink(path)
      elif not os.path.isfile(path):  # a FIFO or device: opening it could block
        found[path] = f"special {os.stat(path).st_mode:o}"
      else:
        with open(path, "rb") as f:
          found[path] = hashlib.sha256(f.read()).hexdigest()
  return found


def _check_failures(cases, tops, **kw):
  """Runs (args, expected text (or texts) in the error line[, status]) cases side by side; each
  must fail with one error line, and the files under `tops` (inputs, outputs' directories) must
  be exactly as before: same bytes, no new file (no output, no temporary)."""
  before = _hashes(*tops)
  results = _run_all([case[0] for case in cases], **kw)
  for case, result in zip(cases, results):
    line = _error_line(result, *case[2:])
    for expected in [case[1]] if isinstance(case[1], str) else case[1]:
      assert expected in line, (expected, line)
  assert _hashes(*tops) == before


def _cpd(input_file, output_file, *extra, vocab=VOCAB):
  return ["create_pretraining_data.py", f"--input_file={input_file}", f"--vocab_file={vocab}",
          f"--output_file={output_file}", "--max_seq_length=32", "--max_predictions_per_seq=5",
          "--dupe_factor=2", "--num_workers=1", *extra]


def _extract(input_file, output_file, checkpoint_dir, *extra):
  return ["extract_features.py", f"--input_file={input_file}", f"--output_file={output_file}",
          f"--init_checkpoint={checkpoint_dir}/bert_model.ckpt",
          f"--vocab_file={checkpoint_dir}/vocab.txt", "--max_seq_length=16", "--layers=-1",
          *extra]


def _words_file(path, lines=("all work and no play", "makes jack ||| a dull boy")):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return str(path)


# --- Class 1: an output that is (or would replace) an input --------------------------------------


def test_an_output_naming_an_input_is_refused_before_any_work(tmp_path):
  text = tmp_path / "text.txt"
  shutil.copy(SAMPLE_TEXT, text)
  vocab = tmp_path / "vocab.txt"
  shutil.copy(VOCAB, vocab)
  shutil.copy(SAMPLE_TEXT, tmp_path / "1.txt")
  os.symlink(text, tmp_path / "link.txt")
  (tmp_path / "v").mkdir()
  os.symlink(text, tmp_path / "v" / "vocab.txt")
  os.link(vocab, tmp_path / "hard.txt")
  (tmp_path / "a_directory").mkdir()
  (tmp_path / "a_file").write_text("not a directory\n")
  checkpoint = tmp_path / "checkpoint"
  shutil.copytree(TINY, checkpoint)
  words = _words_file(tmp_path / "words.txt")
  predictions = tmp_path / "predictions.json"
  predictions.write_text(json.dumps({"56be4db0acb8001400a502ec": "Denver Broncos"}))
  os.symlink(predictions, tmp_path / "predictions_link.json")
  cpd = lambda out, *extra: _cpd(text, out, *extra, vocab=vocab)
  cases = [
      (cpd(text), f"--output_file={text} is the input given by --input_file={text}"),
      (cpd(tmp_path / "link.txt"), "is the input given by --input_file"),
      (cpd(tmp_path / "hard.txt"), f"is the input given by --vocab_file={vocab}"),
      (cpd(f"{tmp_path}/x.tfrecord,{tmp_path}/x.tfrecord"), "is given twice"),
      (cpd(f"{tmp_path}/x.tfrecord,{tmp_path}/a_directory"), "is an existing directory"),
      (cpd(f"{tmp_path}/a_file/x.tfrecord"), f"{tmp_path}/a_file is not a directory"),
      (cpd(f"{tmp_path}/{{shard}}.txt", "--num_output_shards=2", f"--input_file={tmp_path}/1.txt"),
       f"--output_file={tmp_path}/1.txt is the input given by --input_file"),
      # build_vocab writes named files only: its corpus may sit in --output_dir, but never be
      # one of those files.
      (["build_vocab.py", f"--input_file={vocab}", f"--output_dir={tmp_path}"],
       f"--output_dir={vocab} is the input given by --input_file={vocab}"),
      # ... nor a link to it (v/vocab.txt -> text.txt).
      (["build_vocab.py", f"--input_file={tmp_path}/link.txt", f"--output_dir={tmp_path}/v"],
       f"--output_dir={tmp_path}/v/vocab.txt is the input given by --input_file"),
      (["build_vocab.py", f"--input_file={text}", f"--output_dir={tmp_path}/a_file"],
       f"{tmp_path}/a_file is not a directory"),
      (["evaluate_squad.py", SQUAD_V1, str(predictions),
        f"--out-file={tmp_path}/predictions_link.json"],
       f"is the input given by --pred_file={predictions}"),
      (["evaluate_squad.py", SQUAD_V1, str(predictions), f"--out-file={tmp_path}/a_directory"],
       "is an existing directory"),
      (_extract(words, checkpoint / "bert_config.json", checkpoint),
       f"is the input given by --bert_config_file={checkpoint}/bert_config.json"),
      (_extract(words, checkpoint / "bert_model.ckpt.index", checkpoint),
       "is the input given by --init_checkpoint"),
  ]
  _check_failures(cases, [str(tmp_path), SQUAD_V1])


def test_what_is_not_ours_beside_an_output_is_never_removed_or_replaced(tmp_path):
  """Files named like a dead run's temporary (`.NAME.tmp-PID-...`) that this program did not make
  (an input, a user's directory) survive a run; a real leftover of a SIGKILLed run (exactly the
  name pattern, of a process that is gone) is removed; a device or FIFO named as the output is
  refused untouched; an output name near the file system's 255-byte limit still works."""
  text = tmp_path / "text.txt"
  shutil.copy(SAMPLE_TEXT, text)
  looks_stale = tmp_path / ".out.tfrecord.tmp-999999-corpus"
  shutil.copy(SAMPLE_TEXT, looks_stale)
  user_dir = tmp_path / ".out.tfrecord.tmp-999998-mydir"
  user_dir.mkdir()
  (user_dir / "notes.txt").write_text("mine\n")
  input_lookalike = tmp_path / ".out.tfrecord.tmp-999997-abcdefgh"  # our pattern, but an input
  shutil.copy(SAMPLE_TEXT, input_lookalike)
  leftover = tmp_path / ".out.tfrecord.tmp-999996-k1l2m3n4"  # a killed run's, by every sign
  leftover.write_bytes(b"partial")
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  long_name = tmp_path / ("a" * 245 + ".tf")
  before = _hashes(str(tmp_path))
  results = _run_all([_cpd(f"{looks_stale},{input_lookalike},{text}", tmp_path / "out.tfrecord"),
                      _cpd(text, fifo), _cpd(text, long_name)])
  assert results[0].returncode == 0, results[0].stderr[-2000:]
  assert "exists and is not a regular file" in _error_line(results[1])
  assert results[2].returncode == 0, results[2].stderr[-2000:]
  after = _hashes(str(tmp_path))
  for path in (looks_stale, user_dir / "notes.txt", input_lookalike, text):
    assert after[str(path)] == before[str(path)], path
  assert not leftover.exists()
  assert os.path.exists(fifo) and not os.path.isfile(fifo)
  assert long_name.is_file() and (tmp_path / "out.tfrecord").is_file()
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      [looks_stale.name, user_dir.name, input_lookalike.name, "text.txt", "fifo",
       long_name.name, "out.tfrecord"])


@pytest.mark.parametrize("script", ["extract_features.py", "run_classifier.py"])
def test_ctrl_c_while_the_script_starts_is_one_line(script):
  """Ctrl-C during the imports (TensorFlow's take seconds): one error line and 130, not a
  KeyboardInterrupt traceback."""
  proc = _start([script, "--help"], preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                     signal.SIG_DFL))
  time.sleep(0.8)
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=60)
  line = _error_line(CompletedProcess(script, proc.returncode, out, err), 130)
  assert line == "error: stopped by SIGINT (Ctrl-C) while starting; nothing was written"


# --- Class 4: interruption of fast mode's worker processes --------------------------------------


def _children(pid):
  """{pid: start time} of the live processes whose parent is `pid` (from /proc/*/stat)."""
  found = {}
  for stat in glob.glob("/proc/[0-9]*/stat"):
    try:
      with open(stat, encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
      continue
    if int(fields[1]) == pid and fields[0] != "Z":
      found[int(stat.split("/")[2])] = fields[19]
  return found


def _alive(processes):
  """Those of {pid: start time} that still run (not gone, not a zombie, not a reused pid)."""
  alive = []
  for pid, start in processes.items():
    try:
      with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if fields[19] == start and fields[0] != "Z":
      alive.append(pid)
  return alive


@pytest.mark.parametrize("signum, status, group", [
    (signal.SIGTERM, 143, False),
    (signal.SIGINT, 130, False),
    (signal.SIGINT, 130, True),  # Ctrl-C at a terminal: the workers get it too.
    (signal.SIGKILL, -signal.SIGKILL, False),
])
def test_stopping_fast_mode_ends_its_workers_and_leaves_no_output(tmp_path, signum, status, group):
  output = tmp_path / "out.tfrecord"
  inputs = _hashes(CORPUS, VOCAB)
  proc = _start(_cpd(CORPUS, output, "--mode=fast", "--num_workers=2", "--chunk_documents=2",
                     "--shuffle_buffer_size=100", "--dupe_factor=10", "--max_seq_length=64",
                     "--max_predictions_per_seq=10"), start_new_session=True)
  try:
    temporaries = lambda: glob.glob(str(tmp_path / ".out.tfrecord.tmp-*"))
    deadline = time.time() + 240
    # Mid-run: both workers started (and multiprocessing's resource tracker), records written.
    while len(_children(proc.pid)) < 2 or not any(os.path.getsize(t) for t in temporaries()):
      assert proc.poll() is None, proc.communicate()[1][-3000:]
      assert time.time() < deadline, "the run did not get going"
      time.sleep(0.05)
    children = _children(proc.pid)
    if group:
      os.killpg(proc.pid, signum)
    else:
      proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
  result = CompletedProcess(proc.args, proc.returncode, "", err)
  if signum == signal.SIGKILL:
    assert proc.returncode == status
    # Its temporary stays, named after its pid (the next run removes it); nothing else.
    assert all(f".tmp-{proc.pid}-" in path for path in temporaries())
  else:
    assert "stopped by SIG" in _error_line(result, status)
    assert not temporaries()
  assert not output.exists()
  deadline = time.time() + 5
  while _alive(children) and time.time() < deadline:
    time.sleep(0.1)
  assert not _alive(children), f"{_alive(children)} outlived their parent {proc.pid}"
  assert _hashes(CORPUS, VOCAB) == inputs


# --- Class 6: numeric flags ----------------------------------------------------------------------


def test_bad_numeric_flags_are_one_error_line_before_any_work(tmp_path):
  text = tmp_path / "text.txt"
  shutil.copy(SAMPLE_TEXT, text)
  out = tmp_path / "out.tfrecord"
  checkpoint = tmp_path / "checkpoint"
  shutil.copytree(TINY, checkpoint)
  words = _words_file(tmp_path / "words.txt")
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  bad_cpd = [
      ("--dupe_factor=two", "flag --dupe_factor=two"),
      ("--dupe_factor=0", "flag --dupe_factor=0"),
      ("--max_seq_length=4", "flag --max_seq_length=4"),
      ("--max_predictions_per_seq=0", "flag --max_predictions_per_seq=0"),
      ("--max_predictions_per_seq=33", "--max_predictions_per_seq=33 must be between 1 and "
                                       "--max_seq_length=32"),
      ("--masked_lm_prob=0", "--masked_lm_prob=0.0 must be in (0, 1]"),
      ("--masked_lm_prob=1.5", "flag --masked_lm_prob=1.5"),
      ("--masked_lm_prob=nan", "flag --masked_lm_prob=nan: must be a finite number"),
      ("--short_seq_prob=inf", "flag --short_seq_prob=inf"),
      ("--progress_seconds=inf", "flag --progress_seconds=inf: must be a finite number"),
      # A value after a space is not the flag's: absl would keep the default silently.
      ("--do_lower_case false".split()[1], "unexpected argument 'false': flags take their value"),
      (f"--output_file={tmp_path}/{{shard[0]}}.tfrecord", "a pattern may only use the fields"),
      (f"--output_file={tmp_path}/{{shard.x}}.tfrecord", "a pattern may only use the fields"),
      ("--short_seq_prob=-0.1", "flag --short_seq_prob=-0.1"),
      ("--num_workers=-1", "flag --num_workers=-1"),
      ("--chunk_documents=0", "flag --chunk_documents=0"),
      ("--shuffle_buffer_size=-1", "flag --shuffle_buffer_size=-1"),
      ("--num_output_shards=0", "flag --num_output_shards=0"),
  ]
  cases = [(_cpd(text, out, flag), message) for flag, message in bad_cpd]
  vocab = ["build_vocab.py", f"--input_file={text}", f"--output_dir={tmp_path}/vocab"]
  cases += [
      (vocab + ["--vocab_size=5"], "flag --vocab_size=5"),
      (vocab + ["--vocab_size=10", "--num_unused=5"], "--vocab_size=10 leaves no room beside"),
      (vocab + ["--num_unused=-1"], "flag --num_unused=-1"),
      (vocab + ["--max_unique_chars=0"], "flag --max_unique_chars=0"),
      (vocab + ["--max_sentences=-1"], "flag --max_sentences=-1"),
      (vocab + ["--model_type=sentencepiece", "--vocab_size=3000000000"],
       "flag --vocab_size=3000000000"),
      (["evaluate_squad.py", SQUAD_V2, str(text), "--na-prob-thresh=nan"],
       "flag --na_prob_thresh=nan: must be a finite number"),
      (["evaluate_squad.py", SQUAD_V2, str(text), "--na-prob-thresh=high"],
       "flag --na_prob_thresh=high"),
      # extract_features: an empty features file must not come out silently.
      (_extract(words, tmp_path / "f.jsonl", checkpoint, "--batch_size=0"), "flag --batch_size=0"),
      (_extract(words, tmp_path / "f.jsonl", checkpoint, "--max_seq_length=2"),
       "flag --max_seq_length=2"),
      (_extract(empty, tmp_path / "f.jsonl", checkpoint), f"--input_file={empty} is empty"),
  ]
  _check_failures(cases, [str(tmp_path), SQUAD_V2])


# --- Class 7: full disk, unwritable places -------------------------------------------------------


def _file_size_limit(limit):
  """preexec_fn: writes past `limit` bytes fail with EFBIG, as they would with ENOSPC."""
  def apply():
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  return apply


def test_full_disk_and_too_many_open_files_name_the_output_and_leave_nothing(tmp_path):
  (tmp_path / "out").mkdir()
  out = tmp_path / "out" / "pretraining.tfrecord"
  for mode, workers in (("exact", 1), ("fast", 2)):
    _check_failures([(_cpd(SAMPLE_TEXT, out, f"--mode={mode}", f"--num_workers={workers}",
                           "--dupe_factor=10"),
                      f"error: {out}: File too large")],
                    [str(tmp_path), SAMPLE_TEXT, VOCAB], preexec_fn=_file_size_limit(50000))
  predictions = tmp_path / "predictions.json"
  predictions.write_text(json.dumps({"56be4db0acb8001400a502ec": "Denver Broncos"}))
  _check_failures([(["evaluate_squad.py", SQUAD_V1, str(predictions),
                     f"--out-file={tmp_path}/out/eval.json"],
                    f"error: {tmp_path}/out/eval.json: File too large")],
                  [str(tmp_path), SQUAD_V1], preexec_fn=_file_size_limit(20))
  # Too many open files: 64 output shards under a hard limit of 32 descriptors, said before any
  # work, naming the outputs and the limit.
  _check_failures([(_cpd(SAMPLE_TEXT, f"{tmp_path}/out/{{shard}}.tfrecord",
                         "--num_output_shards=64"),
                    [f"error: {tmp_path}/out/0.tfrecord and 63 more: 64 output files cannot be "
                     "open at once here (the open-files limit is 32; `ulimit -n` raises it)"])],
                  [str(tmp_path), SAMPLE_TEXT, VOCAB],
                  preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32)))


@pytest.mark.skipif(os.geteuid() == 0, reason="run as root, for whom a directory's permission "
                    "bits do not stop writes; the output under a file (ENOTDIR) is tested below")
def test_read_only_output_directory(tmp_path):
  (tmp_path / "ro").mkdir()
  os.chmod(tmp_path / "ro", 0o555)
  try:
    _check_failures([(_cpd(SAMPLE_TEXT, tmp_path / "ro" / "out.tfrecord"), "is not writable")],
                    [str(tmp_path)])
  finally:
    os.chmod(tmp_path / "ro", 0o755)


def test_output_under_a_file_names_it(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("a file, not a directory\n")
  predictions = tmp_path / "predictions.json"
  predictions.write_text(json.dumps({"56be4db0acb8001400a502ec": "Denver Broncos"}))
  _check_failures([
      (_cpd(SAMPLE_TEXT, blocker / "sub" / "out.tfrecord"), f"{blocker} is not a directory"),
      (["evaluate_squad.py", SQUAD_V1, str(predictions), f"--out-file={blocker}/eval.json"],
       f"{blocker} is not a directory"),
  ], [str(tmp_path)])


# --- Class 8: literal names, predictions files, determinism -------------------------------------


def test_literal_file_names_with_brackets_are_read_as_such(tmp_path):
  text = tmp_path / "corpus[1].txt"
  shutil.copy(SAMPLE_TEXT, text)
  vocab = tmp_path / "vocab[uncased].txt"
  shutil.copy(VOCAB, vocab)
  predictions = tmp_path / "predictions[v1].json"
  predictions.write_text(json.dumps({"56be4db0acb8001400a502ec": "Denver Broncos"}))
  inputs = _hashes(str(text), str(vocab), str(predictions))
  results = _run_all([
      _cpd(text, tmp_path / "out[0].tfrecord", vocab=vocab),
      ["build_vocab.py", f"--input_file={text}", f"--output_dir={tmp_path}/v[1]",
       "--vocab_size=400"],
      ["evaluate_squad.py", SQUAD_V1, str(predictions)],
  ])
  for result in results:
    assert result.returncode == 0, (result.args, result.stderr[-3000:])
  assert os.path.getsize(tmp_path / "out[0].tfrecord") > 10_000
  assert "[CLS]" in (tmp_path / "v[1]" / "vocab.txt").read_text(encoding="utf-8")
  assert json.loads(results[2].stdout)["exact_match"] == pytest.approx(100 / 10570)
  assert _hashes(str(text), str(vocab), str(predictions)) == inputs


def test_evaluate_squad_predictions_and_data_files(tmp_path):
  with open(SQUAD_V2, encoding="utf-8") as f:
    v2 = json.load(f)
  qids = [qa["id"] for a in v2["data"] for p in a["paragraphs"] for qa in p["qas"]]
  first = qids[0]

  def write(name, text):
    (tmp_path / name).write_text(text, encoding="utf-8")
    return str(tmp_path / name)

  repeated = json.loads(json.dumps(v2))
  questions = repeated["data"][0]["paragraphs"][0]["qas"]
  questions.append(dict(questions[0]))
  repeated_file = write("repeated.json", json.dumps(repeated))
  partial = write("partial.json", json.dumps({first: "France"}))
  cases = [
      (["evaluate_squad.py", SQUAD_V2, write("empty.json", "")],
       "empty.json:1: predictions is not valid JSON"),
      (["evaluate_squad.py", SQUAD_V2, write("text.json", "France\n")], "is not valid JSON"),
      (["evaluate_squad.py", SQUAD_V2, write("list.json", json.dumps([first]))],
       "predictions must be a JSON object mapping question id to answer text"),
      (["evaluate_squad.py", SQUAD_V2, write("number.json", json.dumps({first: 1}))],
       f"the predictions entry of question {first} is 1, not answer text"),
      (["evaluate_squad.py", SQUAD_V2,
        write("twice.json", f'{{"{first}": "France", "{first}": "Normandy"}}')],
       f"'{first}' appears more than once"),
      (["evaluate_squad.py", SQUAD_V2, write("other.json", json.dumps({"nope": "France"}))],
       f"no prediction matches a question of {SQUAD_V2}"),
      (["evaluate_squad.py", repeated_file, partial],
       f"{repeated_file}: question id {first} appears more than once"),
      (["evaluate_squad.py", SQUAD_V2, partial, "--squad_version=1.1"],
       "has no gold answer, as in SQuAD 2.0 data"),
      (["evaluate_squad.py", SQUAD_V2, partial, "--na-prob-file",
        write("na.json", json.dumps({first: "high"}))],
       f"the no-answer probabilities entry of question {first} is \"high\", not a probability"),
  ]
  _check_failures(cases, [str(tmp_path), SQUAD_V2])
  # A partial predictions file: scored with the missing questions wrong, and one warning.
  [result] = _run_all([["evaluate_squad.py", SQUAD_V2, partial]])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  warnings = [line for line in result.stderr.splitlines() if "have no prediction" in line]
  assert len(warnings) == 1 and f"{len(qids) - 1} of {len(qids)} questions" in warnings[0]
  scores = json.loads(result.stdout)
  assert scores["total"] == len(qids) and scores["exact"] == pytest.approx(100 / len(qids))


def test_fast_mode_with_workers_is_byte_identical_across_hash_seeds(tmp_path):
  """Worker processes draw their own hash seeds; the records must not depend on them (exact and
  in-process fast mode: test_reliability.test_same_seed_same_data_files_in_separate_processes)."""
  outputs = [tmp_path / f"out-{seed}.tfrecord" for seed in ("1", "2")]
  results = [_run_all([_cpd(SAMPLE_TEXT, out, "--mode=fast", "--num_workers=2",
                            "--chunk_documents=1", "--do_whole_word_mask")],
                      env=dict(ENV, PYTHONHASHSEED=seed))[0]
             for out, seed in zip(outputs, ("1", "2"))]
  for result in results:
    assert result.returncode == 0, result.stderr[-3000:]
  assert outputs[0].stat().st_size > 10_000
  assert outputs[0].read_bytes() == outputs[1].read_bytes()


# --- Third round (issue #31): bounded sizes, our own leftovers, empty shards ---------------------


def test_sizes_a_user_controls_are_bounded_before_any_work(tmp_path):
  """Absurd sizes are one error line up front, not a MemoryError, GBs of records or hours."""
  out = tmp_path / "out"
  _check_failures([
      (_cpd(SAMPLE_TEXT, f"{out}/", "--num_output_shards=20000"),
       "flag --num_output_shards=20000"),
      (_cpd(SAMPLE_TEXT, out, "--max_seq_length=1000000000"), "flag --max_seq_length=1000000000"),
      (_cpd(SAMPLE_TEXT, out, "--mode=fast", "--pack_sequences", "--dynamic_masking",
            "--max_instances_per_pack=1000000000"),
       "--max_instances_per_pack=1000000000 must be between 1 and 10: an instance takes at least"),
  ], [str(tmp_path), SAMPLE_TEXT])
  # Packed records written with an absurd slot count (by hand, or an older version): refused by
  # run_pretraining before it builds batches of that many next-sentence slots.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  seq, slots = 32, 5000
  ints = lambda values: tf.train.Feature(int64_list=tf.train.Int64List(value=values))
  example = tf.train.Example(features=tf.train.Features(feature={
      "input_ids": ints([2, 5, 3] + [0] * (seq - 3)), "input_mask": ints([1] * 3 + [0] * (seq - 3)),
      "segment_ids": ints([0] * seq), "instance_ids": ints([1] * 3 + [0] * (seq - 3)),
      "masked_lm_positions": ints([1] + [0] * 4), "masked_lm_ids": ints([5] + [0] * 4),
      "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] + [0.0] * 4)),
      "next_sentence_labels": ints([0] * slots), "next_sentence_weights": tf.train.Feature(
          float_list=tf.train.FloatList(value=[1.0] + [0.0] * (slots - 1)))}))
  records = tmp_path / "packed.tfrecord"
  with tf.io.TFRecordWriter(str(records)) as writer:
    writer.write(example.SerializeToString())
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(dict(vocab_size=15, hidden_size=8, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=16,
                                    max_position_embeddings=64, type_vocab_size=2)))
  _check_failures([(["run_pretraining.py", f"--input_file={records}",
                     f"--output_dir={tmp_path}/pretrain", f"--bert_config_file={config}",
                     "--do_train", f"--max_seq_length={seq}", "--max_predictions_per_seq=5",
                     "--train_batch_size=2", "--num_train_steps=2"],
                    f"{records}: packed records with 5000 next-sentence slots a sequence, but at "
                    "most 10 instances fit --max_seq_length=32")], [str(tmp_path)])


def test_many_shards_cost_one_directory_listing(tmp_path, monkeypatch):
  """The sweep for a killed run's temporaries lists the output directory once for all shards
  (it listed it once per shard: thousands of shards took minutes), and the records in memory
  stay bounded by the batch, not batch x shards."""
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  from bert_tf2 import tfrecord_io  # pylint: disable=g-import-not-at-top
  listings = []
  for module, name in ((os, "listdir"), (os, "scandir")):
    real = getattr(module, name)
    def counted(path=".", real=real):
      listings.append(str(path))
      return real(path)
    monkeypatch.setattr(module, name, counted)
  outputs = [str(tmp_path / f"shard-{i:05d}.tfrecord") for i in range(2000)]
  leftover = tmp_path / ".shard-01999.tfrecord.tmp-999996-k1l2m3n4"
  leftover.write_bytes(b"partial")
  count = tfrecord_io.write_sharded((b"record %d" % i for i in range(3000)), outputs)
  assert count == 3000
  assert listings.count(str(tmp_path)) == 1, len(listings)
  assert not leftover.exists()
  assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in outputs)
  assert os.path.getsize(outputs[0]) > os.path.getsize(outputs[-1]) > 0  # 2 records vs 1
  assert fileio  # the module whose sweep is counted


def test_a_rerun_with_fewer_shards_removes_the_earlier_runs_shards(tmp_path):
  """Rerun into the same directory (or {shard} pattern) with fewer shards: the first run's extra
  shards would be read by a later glob with the new ones (two corpora mixed); they are removed,
  with a warning, and only once the new shards are in. Files that are not our shards stay."""
  out = tmp_path / "records"
  first = _run_all([_cpd(SAMPLE_TEXT, f"{out}/", "--num_output_shards=4"),
                    _cpd(SAMPLE_TEXT, f"{tmp_path}/p-{{shard}}.tfrecord",
                         "--num_output_shards=4")])
  assert all(r.returncode == 0 for r in first), [r.stderr[-2000:] for r in first]
  (out / "pretraining-00000-of-00004.txt").write_text("a user's notes\n")
  (out / "README").write_text("mine\n")
  second = _run_all([_cpd(SAMPLE_TEXT, f"{out}/", "--num_output_shards=2"),
                     _cpd(SAMPLE_TEXT, f"{tmp_path}/p-{{shard}}.tfrecord",
                          "--num_output_shards=2")])
  # The directory's four -of-00004 shards all go; the pattern's p-2 and p-3 (p-0 and p-1 are
  # this run's, rewritten).
  for result, removed in zip(second, (4, 2)):
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"Removed {removed} shard(s) an earlier run" in result.stderr, result.stderr[-2000:]
  assert sorted(os.listdir(out)) == ["README", "pretraining-00000-of-00002.tfrecord",
                                     "pretraining-00000-of-00004.txt",
                                     "pretraining-00001-of-00002.tfrecord"]
  assert sorted(glob.glob(f"{tmp_path}/p-*.tfrecord")) == [f"{tmp_path}/p-0.tfrecord",
                                                         f"{tmp_path}/p-1.tfrecord"]


def test_more_shards_than_records_warns_and_killed_beam_leftovers_are_removed(tmp_path):
  """A corpus smaller than the shard count writes empty shards: said, with the count that would
  not. A Beam job killed with SIGKILL leaves its hidden temporaries and pieces beside the outputs
  (named after its process): the next run into the same place removes them."""
  from bert_tf2 import pretraining_data_beam  # pylint: disable=g-import-not-at-top
  text = tmp_path / "one_document.txt"
  text.write_text("The first sentence here.\nAnd a second one.\nThen a third.\n")
  out = tmp_path / "records"
  out.mkdir()
  names = [str(out / f"pretraining-{i:05d}-of-00008.tfrecord") for i in range(8)]
  # What a Beam job that was killed would leave (pid 999996: a process that is gone).
  temporaries, pieces = pretraining_data_beam._beam_temporaries(names, "0123456789abcdef")
  dead = [path.replace(f"-{os.getpid()}-", "-999996-") for path in temporaries + [pieces]]
  assert all(f"-{os.getpid()}-" in path for path in temporaries + [pieces])
  for path in dead[:-1]:
    with open(path, "wb") as f:
      f.write(b"partial")
  os.makedirs(dead[-1])
  with open(os.path.join(dead[-1], "000000000-00000"), "wb") as f:
    f.write(b"x" * 100000)
  for extra in (["--mode=fast"], ["--mode=fast", "--pack_sequences", "--dynamic_masking"]):
    result = _run_all([_cpd(text, f"{out}/", *extra, "--dupe_factor=1")])[0]
    assert result.returncode == 0, result.stderr[-2000:]
    assert "of them are empty; --num_output_shards=" in result.stderr, result.stderr[-2000:]
    assert sorted(os.listdir(out)) == sorted(os.path.basename(n) for n in names)


def test_errors_name_the_users_path_and_what_is_wrong(tmp_path):
  """An output through a missing `newdir/../` is refused up front naming the path (the run used to
  fail at its end naming our hidden temporary); so is a name over the file system's limit; a
  vocab file with ids the model cannot embed is named with the config before any graph runs (it
  was `error: Graph execution error:`); an unclosed quote in --beam_pipeline_options is one line
  (a ValueError traceback); a remote output (gs://) is refused, where it became a local folder
  named "gs:", and a Beam job to gs:// without Beam's gcp extra names the extra (a traceback)."""
  checkpoint = tmp_path / "checkpoint"
  shutil.copytree(TINY, checkpoint)
  words = _words_file(tmp_path / "words.txt")
  too_long = tmp_path / ("n" * 300 + ".tfrecord")
  _check_failures([
      (_cpd(SAMPLE_TEXT, tmp_path / "newdir" / ".." / "out.tfrecord"),
       f"error: --output_file={tmp_path}/newdir/../out.tfrecord: {tmp_path}/newdir is not an "
       "existing directory"),
      (_cpd(SAMPLE_TEXT, too_long),
       f"error: --output_file={too_long}: the file name is 309 bytes, over the 255 its file "
       "system takes"),
      (["extract_features.py", f"--input_file={words}", f"--output_file={tmp_path}/f.jsonl",
        f"--init_checkpoint={checkpoint}/bert_model.ckpt", f"--vocab_file={VOCAB}",
        "--max_seq_length=16", "--do_lower_case", "--layers=-1"],
       f"error: vocab file {VOCAB} has 30522 tokens but the config of --init_checkpoint="),
      (_cpd(SAMPLE_TEXT, tmp_path / "out.tfrecord", "--mode=fast",
            "--beam_pipeline_options=--runner='FnApiRunner"),
       "--beam_pipeline_options=--runner='FnApiRunner: No closing quotation"),
      (_cpd(SAMPLE_TEXT, "gs://no-bucket/records.tfrecord"),
       "error: --output_file=gs://no-bucket/records.tfrecord: the storage service could not be "
       "reached"),
      (_extract(words, "gs://no-bucket/f.jsonl", checkpoint),
       "error: --output_file=gs://no-bucket/f.jsonl: the storage service could not be reached"),
      (_cpd("gs://no-bucket/text.txt", tmp_path / "o.tfrecord"),
       "error: input file gs://no-bucket/text.txt: the storage service could not be reached"),
  ], [str(tmp_path), SAMPLE_TEXT])
  assert not os.path.exists(os.path.join(ROOT, "gs:"))
  import importlib.util  # pylint: disable=g-import-not-at-top
  has_beam = importlib.util.find_spec("apache_beam") is not None
  try:
    has_gcs = has_beam and importlib.util.find_spec("google.cloud.storage") is not None
  except ModuleNotFoundError:
    has_gcs = False
  if has_beam and not has_gcs:  # Beam without its gcp extra, as requirements-beam.txt installs it
    _check_failures([(_cpd(SAMPLE_TEXT, "gs://no-bucket/dir/", "--mode=fast",
                           "--beam_pipeline_options=runner=FnApiRunner"),
                      "error: --output_file=gs://no-bucket/dir/pretraining-00000-of-00008.tfrecord: "
                      "Beam has no file system for gs:// here; install it with `pip install "
                      "'apache-beam[gcp]'`")], [str(tmp_path)])


def test_vocab_that_makes_no_sense_of_text_is_refused_or_warned_about(tmp_path):
  """A vocab of only bracketed entries (every word [UNK]) is refused; a cased vocab with
  --do_lower_case, or an uncased one without it, is warned about (both ran silently)."""
  from bert_tf2 import tokenization  # pylint: disable=g-import-not-at-top
  brackets = tmp_path / "brackets.txt"
  brackets.write_text("".join(f"{t}\n" for t in tokenization.SPECIAL_TOKENS)
                      + "".join(f"[unused{i}]\n" for i in range(50)))
  cased = tmp_path / "cased.txt"
  with open(VOCAB, encoding="utf-8") as f:
    uncased_tokens = f.read().splitlines()
  cased.write_text("".join(f"{t.capitalize() if i > 2000 and i % 3 == 0 else t}\n"
                           for i, t in enumerate(uncased_tokens)))
  _check_failures([(_cpd(SAMPLE_TEXT, tmp_path / "out.tfrecord", vocab=brackets),
                    f"error: vocab file {brackets} holds no word pieces, only bracketed "
                    "entries like [UNK]")], [str(tmp_path)])
  results = _run_all([_cpd(SAMPLE_TEXT, tmp_path / "a.tfrecord", "--do_lower_case", vocab=cased),
                      _cpd(SAMPLE_TEXT, tmp_path / "b.tfrecord", "--do_lower_case=false"),
                      _cpd(SAMPLE_TEXT, tmp_path / "c.tfrecord", "--do_lower_case")])
  assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
  assert f"vocab file {cased} looks cased" in results[0].stderr
  assert f"vocab file {VOCAB} looks uncased" in results[1].stderr
  assert "looks cased" not in results[2].stderr and "looks uncased" not in results[2].stderr


def test_csv_fields_over_the_csv_modules_default_limit_are_read(tmp_path):
  """A valid row with a 300,000-character field (a long document) is read (the csv module's
  default limit of 131,072 refused it as a malformed row)."""
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  text = "a word, then another " * 15000
  path = tmp_path / "long.csv"
  path.write_text(f'label,sentence\n1,"{text}"\n0,short\n', encoding="utf-8")
  rows = fileio.read_delimited(str(path), ",")
  assert rows == [(1, ["label", "sentence"]), (2, ["1", text]), (3, ["0", "short"])]


def test_every_reported_error_prints_one_line(capsys):
  """Whatever the text of an error (a runner's or a library's of several lines, TensorFlow's
  "Graph execution error:" heading with its status line further down), the entry point prints
  one `error:` line, the informative one."""
  from bert_tf2 import commands  # pylint: disable=g-import-not-at-top
  cases = [
      ("Pipeline failed to start\n  caused by: port 8099 refused\n  more",
       "error: Pipeline failed to start"),
      ("Graph execution error:\n\nDetected at node 'x' defined at (most recent call last):\n"
       "  File a.py, line 3\nNOT_FOUND: /m/variables/variables.index; No such file\n\t [[{{n}}]]",
       "error: Graph execution error: NOT_FOUND: /m/variables/variables.index; No such file"),
      ("Unsuccessful TensorSliceReader constructor:\nFailed to find any matching files for x",
       "error: Unsuccessful TensorSliceReader constructor: Failed to find any matching files "
       "for x"),
  ]
  for text, line in cases:
    with pytest.raises(SystemExit) as stopped:
      commands._report(text, 2)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == line + "\n"


def test_damaged_hub_module_and_empty_training_files_are_one_line_naming_them(tmp_path):
  """A --hub_module_handle whose variables file is truncated (an IndexError traceback) or whose
  variables index is missing (two lines of TensorSliceReader); a training file with a header and
  no row, a CoNLL file of only -DOCSTART-, an empty SQuAD file: one line naming the file (it was
  "0 training examples ... make no training step", naming none)."""
  exported = tmp_path / "encoder"
  result = run_script(["export_model.py", f"--init_checkpoint={TINY}/bert_model.ckpt",
                       f"--export_dir={exported}"], timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  truncated, no_index = tmp_path / "truncated", tmp_path / "no_index"
  shutil.copytree(exported, truncated)
  shutil.copytree(exported, no_index)
  (data,) = glob.glob(str(truncated / "variables" / "variables.data-*"))
  with open(data, "r+b") as f:
    f.truncate(100)
  os.remove(no_index / "variables" / "variables.index")
  glue = tmp_path / "glue"
  glue.mkdir()
  (glue / "train.tsv").write_text("sentence\tlabel\n")
  conll = tmp_path / "conll"
  conll.mkdir()
  (conll / "train.txt").write_text("-DOCSTART- -X- -X- O\n\n")
  squad = tmp_path / "squad.json"
  squad.write_text('{"version": "1.1", "data": []}')
  classifier = ["run_classifier.py", "--task_name=tsv", "--text_a_column=sentence",
                "--label_column=label", f"--data_dir={glue}", "--max_seq_length=16",
                "--do_train", "--labels=0,1"]
  model = [f"--init_checkpoint={TINY}/bert_model.ckpt", f"--vocab_file={TINY}/vocab.txt"]
  _check_failures([
      (classifier + [f"--hub_module_handle={truncated}", f"--output_dir={tmp_path}/o1"],
       f"error: --hub_module_handle={truncated}: the SavedModel cannot be loaded"),
      (classifier + [f"--hub_module_handle={no_index}", f"--output_dir={tmp_path}/o2"],
       f"error: --hub_module_handle={no_index}: the SavedModel has no variables/variables.index"),
      (classifier + model + [f"--output_dir={tmp_path}/o3"],
       f"error: {glue}/train.tsv: no training example in it"),
      (["run_ner.py", f"--data_dir={conll}", "--max_seq_length=16", "--do_train", *model,
        f"--output_dir={tmp_path}/o4"], f"error: {conll}/train.txt: no training example in it"),
      (["run_squad.py", f"--train_file={squad}", "--max_seq_length=16", "--doc_stride=4",
        "--max_query_length=4", "--do_train", *model, f"--output_dir={tmp_path}/o5"],
       f"error: {squad}: no training example in it"),
  ], [str(tmp_path)])
