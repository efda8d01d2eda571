"""gs:// for every path flag of every script, over a real GCS double (tests/gcs_emulator.py:
fake-gcs-server behind a local HTTPS proxy, reached by TensorFlow's own gs:// client), and the
data-safety promise on an object store (docs/reliability.md, "On an object store")."""

import itertools
import json
import os

import numpy as np
import pytest

from conftest import (ENV, ROOT, SHARED, TINY, VOCAB, WIKITEXT as CORPUS, assert_same_checkpoints,
                      kill_a_worker_at_checkpoint, requires_shared, run_script, run_workers)
from test_multi_worker import PRETRAINING_RECORDS as RECORDS, TINY_CONFIG

SST = os.path.join(SHARED, "data", "glue", "SST-2")


def _documents(count):
  with open(CORPUS, encoding="utf-8") as f:
    docs = [list(run) for nonblank, run in itertools.groupby(f, key=lambda l: bool(l.strip()))
            if nonblank]
  return "\n".join("".join(d) for d in docs[:count])


def _ok(args, env, timeout=600):
  result = run_script(args, env=env, timeout=timeout)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def _error(args, env, timeout=300):
  """The one `error:` line of a run that must fail."""
  result = run_script(args, env=env, timeout=timeout)
  assert result.returncode != 0, result.stderr[-2000:]
  lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  return lines[0]


def _temporaries(names):
  return [n for n in names if ".tmp-" in n or ".upload-" in n]


@requires_shared
def test_create_pretraining_data_reads_and_writes_gs_paths_as_it_does_local_ones(gcs, tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(_documents(12), encoding="utf-8")
  remote_corpus = gcs.upload(corpus, "in/corpus.txt")
  remote_vocab = gcs.upload(VOCAB, "in/vocab.txt")
  common = ["--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=2",
            "--num_workers=2", "--random_seed=7"]
  _ok(["create_pretraining_data.py", f"--input_file={corpus}", f"--vocab_file={VOCAB}",
       f"--output_file={tmp_path}/a.tfrecord,{tmp_path}/b.tfrecord", *common], ENV)
  _ok(["create_pretraining_data.py", f"--input_file={remote_corpus}",
       f"--vocab_file={remote_vocab}",
       f"--output_file={gcs.path('out', 'a.tfrecord')},{gcs.path('out', 'b.tfrecord')}", *common],
      gcs.env)
  assert gcs.names("out/") == ["out/a.tfrecord", "out/b.tfrecord"]
  for name in ("a", "b"):
    local = (tmp_path / f"{name}.tfrecord").read_bytes()
    assert len(local) > 10000 and gcs.read(f"out/{name}.tfrecord") == local
  # An output that is an input is refused before any work, and the input is intact.
  line = _error(["create_pretraining_data.py", f"--input_file={remote_corpus}",
                 f"--vocab_file={remote_vocab}", f"--output_file={remote_corpus}", *common],
                gcs.env)
  assert remote_corpus in line and "input" in line, line
  assert gcs.read("in/corpus.txt") == corpus.read_bytes()
  assert not _temporaries(gcs.names())


def _head(path, lines):
  with open(path, encoding="utf-8") as f:
    return "".join(itertools.islice(f, lines))


@requires_shared
def test_end_to_end_on_gs_with_a_worker_killed(gcs, tmp_path):
  """The documented path with every file on gs://: records made by create_pretraining_data, a
  two-worker pre-training (MultiWorkerMirroredStrategy) whose worker is SIGKILLed at a checkpoint
  and the job restarted (same final values as an uninterrupted run), a fine-tune from the gs://
  checkpoint with its data on gs://, and an export to gs:// loaded back and queried."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(_documents(12), encoding="utf-8")
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(TINY_CONFIG))
  vocab = gcs.upload(VOCAB, "in/vocab.txt")
  records = gcs.path("records", "train.tfrecord")
  _ok(["create_pretraining_data.py", f"--input_file={gcs.upload(corpus, 'in/corpus.txt')}",
       f"--vocab_file={vocab}", f"--output_file={records}", "--max_seq_length=64",
       "--max_predictions_per_seq=10", "--dupe_factor=2", "--num_workers=2"], gcs.env)

  def pretrain(name):
    return ["run_pretraining.py", f"--bert_config_file={gcs.upload(config, 'in/config.json')}",
            f"--input_file={records}", f"--output_dir={gcs.path(name)}", "--do_train",
            "--train_batch_size=8", "--num_train_steps=16", "--num_warmup_steps=3",
            "--learning_rate=1e-3", "--iterations_per_loop=2", "--save_checkpoints_steps=4",
            "--seed=3", "--max_seq_length=64", "--max_predictions_per_seq=10",
            "--distribution_strategy=multi_worker_mirrored"]

  run_workers(pretrain("straight"), env=gcs.env)
  kill_a_worker_at_checkpoint(pretrain("killed"), gcs.path("killed"), 8, gcs.env, gcs.exists)
  assert not gcs.exists(gcs.path("killed", "ckpt-16.index"))
  chief = run_workers(pretrain("killed"), env=gcs.env)[0]
  assert "Resumed from" in chief, chief[-2000:]
  assert_same_checkpoints(gcs.download_tree(gcs.path("straight"), tmp_path / "straight"),
                          gcs.download_tree(gcs.path("killed"), tmp_path / "killed"))
  assert not _temporaries(gcs.names())
  assert not [n for n in gcs.names() if n.endswith(".lock")]  # released at the end

  for split, lines in (("train", 65), ("dev", 33)):
    (tmp_path / f"{split}.tsv").write_text(_head(os.path.join(SST, f"{split}.tsv"), lines))
    gcs.upload(tmp_path / f"{split}.tsv", f"glue/SST-2/{split}.tsv")
  classifier = gcs.path("classifier")
  _ok(["run_classifier.py", "--task_name=sst-2", f"--data_dir={gcs.path('glue', 'SST-2')}",
       f"--vocab_file={vocab}", f"--init_checkpoint={gcs.path('killed')}",
       f"--output_dir={classifier}", "--max_seq_length=32", "--do_train", "--do_eval",
       "--train_batch_size=8", "--eval_batch_size=8", "--num_train_epochs=1"], gcs.env)
  results = gcs.read("classifier/eval_results.txt").decode()
  assert "eval_accuracy = " in results and "global_step = 8" in results, results

  export = gcs.path("export")
  _ok(["export_model.py", "--model_type=classifier", f"--init_checkpoint={classifier}",
       f"--export_dir={export}", "--max_seq_length=32"], gcs.env)
  assert gcs.exists(gcs.path("export", "saved_model.pb"))
  query = ("import sys, tensorflow as tf; serve = tf.saved_model.load(sys.argv[1])"
           ".signatures['serving_default']; out = serve(text_a=tf.constant(['a fine film']));"
           "print(sorted(out), [round(float(v), 6) for v in "
           "tf.reshape(out['probabilities'], [-1])])")
  printed = _ok(["-c", query, export], gcs.env).stdout.strip().splitlines()[-1]
  names, probabilities = printed.split("] [")
  probabilities = [float(v) for v in probabilities.rstrip("]").split(",")]
  assert "probabilities" in names and len(probabilities) == 2, printed
  np.testing.assert_allclose(sum(probabilities), 1.0, atol=1e-5)
  assert not _temporaries(gcs.names())


@requires_shared
def test_ner_swag_and_squad_train_evaluate_and_keep_their_best_on_gs(gcs, tmp_path):
  """run_ner, run_swag and run_squad with their data, vocab and config on gs:// and their
  output_dir there: records, checkpoints, evaluation during training, best/ (a directory output)
  and eval_results.txt, as in test_eval_during_training's local run."""
  # pylint: disable-next=g-import-not-at-top
  from test_eval_during_training import _config, _conll_slice, CONLL
  from test_run_swag import HEADER, ROWS  # pylint: disable=g-import-not-at-top
  from conftest import SQUAD, concurrently  # pylint: disable=g-import-not-at-top
  conll = tmp_path / "conll"
  conll.mkdir()
  for name, sentences in (("train.txt", 64), ("valid.txt", 40), ("test.txt", 8)):
    _conll_slice(os.path.join(CONLL, name), conll / name, sentences)
  (tmp_path / "swag.csv").write_text(HEADER + "".join(ROWS), encoding="utf-8")
  with open(SQUAD, encoding="utf-8") as f:
    dataset = json.load(f)
  dataset["data"] = dataset["data"][:1]
  dataset["data"][0]["paragraphs"] = dataset["data"][0]["paragraphs"][:4]
  (tmp_path / "squad.json").write_text(json.dumps(dataset), encoding="utf-8")
  gcs.upload_tree(conll, "conll")
  gcs.upload(tmp_path / "swag.csv", "swag/train.csv")
  gcs.upload(tmp_path / "swag.csv", "swag/val.csv")
  squad = gcs.upload(tmp_path / "squad.json", "squad.json")
  common = [f"--vocab_file={gcs.upload(VOCAB, 'vocab.txt')}",
            f"--bert_config_file={gcs.upload(_config(tmp_path), 'config.json')}", "--do_train",
            "--do_eval", "--eval_every_steps=2", "--learning_rate=3e-3", "--max_seq_length=64"]
  runs = {
      "ner": ["run_ner.py", f"--data_dir={gcs.path('conll')}", f"--output_dir={gcs.path('ner')}",
              "--keep_best_checkpoint_metric=eval_loss", "--train_batch_size=16",
              "--num_train_epochs=2", "--do_predict", *common],
      "swag": ["run_swag.py", f"--data_dir={gcs.path('swag')}",
               f"--output_dir={gcs.path('swag_out')}",
               "--keep_best_checkpoint_metric=loss", "--train_batch_size=3",
               "--num_train_epochs=6", "--eval_batch_size=2", *common],
      "squad": ["run_squad.py", f"--train_file={squad}", f"--predict_file={squad}",
                f"--output_dir={gcs.path('squad_out')}", "--keep_best_checkpoint_metric=f1",
                "--do_predict", "--train_batch_size=8", "--num_train_epochs=1",
                "--max_query_length=24", "--doc_stride=32",
                *[c for c in common if c != "--do_eval"]],
  }
  results = concurrently([lambda args=args: run_script(args, env=gcs.env)
                          for args in runs.values()])
  for (name, args), result in zip(runs.items(), results):
    assert result.returncode == 0, (name, result.stderr[-3000:])
    out = gcs.name_of(next(a for a in args if a.startswith("--output_dir=")).split("=", 1)[1])
    state = json.loads(gcs.read(f"{out}/best_checkpoint.json"))
    assert len(state["evaluations"]) >= 3, (name, state)
    results_file = dict(line.split(" = ") for line in
                        gcs.read(f"{out}/eval_results.txt").decode().splitlines())
    assert int(results_file["global_step"]) == state["best_step"], name
    best = gcs.names(f"{out}/best/")
    assert f"{out}/best/checkpoint" in best, (name, best)
    assert f"{out}/best/ckpt-{state['best_step']}.index" in best, (name, best)
  predictions = json.loads(gcs.read("squad_out/predictions.json"))
  assert len(predictions) == sum(len(p["qas"]) for p in dataset["data"][0]["paragraphs"])
  tagged = gcs.read("ner/test_predictions.txt").decode().split("\n\n")
  assert len([s for s in tagged if s.strip()]) == 8  # the 8 test sentences, tagged
  assert not _temporaries(gcs.names())


@requires_shared
def test_features_exports_conversions_vocab_and_squad_metric_on_gs(gcs, tmp_path):
  """extract_features (the same bytes as a local run), export_model (encoder), convert_checkpoint
  (TF1 -> HF -> TF1), build_vocab and evaluate_squad, every path on gs://."""
  from test_evaluate_squad import V1_DEV  # pylint: disable=g-import-not-at-top
  tiny = gcs.upload_tree(TINY, "tiny")
  (tmp_path / "input.txt").write_text("the cat sat\nhello world ||| a dog\n", encoding="utf-8")
  text = gcs.upload(tmp_path / "input.txt", "input.txt")
  features = ["extract_features.py", "--max_seq_length=16", "--layers=-1,-2"]
  _ok([*features, f"--init_checkpoint={TINY}/bert_model.ckpt", f"--vocab_file={TINY}/vocab.txt",
       f"--bert_config_file={TINY}/bert_config.json", f"--input_file={tmp_path / 'input.txt'}",
       f"--output_file={tmp_path / 'features.jsonl'}"], ENV)
  _ok([*features, f"--init_checkpoint={tiny}/bert_model.ckpt", f"--vocab_file={tiny}/vocab.txt",
       f"--bert_config_file={tiny}/bert_config.json", f"--input_file={text}",
       f"--output_file={gcs.path('features.jsonl')}"], gcs.env)
  assert gcs.read("features.jsonl") == (tmp_path / "features.jsonl").read_bytes()

  _ok(["export_model.py", "--model_type=encoder", f"--init_checkpoint={tiny}/bert_model.ckpt",
       f"--export_dir={gcs.path('encoder')}"], gcs.env)
  assert gcs.exists(gcs.path("encoder", "saved_model.pb"))
  _ok(["convert_checkpoint.py", f"--input={tiny}/bert_model.ckpt", f"--output={gcs.path('hf')}",
       "--output_format=hf"], gcs.env)
  assert gcs.names("hf/") == ["hf/config.json", "hf/model.safetensors", "hf/vocab.txt"]
  _ok(["convert_checkpoint.py", f"--input={gcs.path('hf')}", f"--output={gcs.path('back')}",
       "--output_format=tf1"], gcs.env)
  _ok(["convert_checkpoint.py", f"--input={gcs.path('hf')}", f"--output={gcs.path('project')}",
       "--output_format=project"], gcs.env)
  assert {"project/checkpoint", "project/ckpt-0.index"} <= set(gcs.names("project/"))
  back = gcs.download_tree(gcs.path("back"), tmp_path / "back")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  original = tf.train.load_checkpoint(os.path.join(TINY, "bert_model.ckpt"))
  converted = tf.train.load_checkpoint(os.path.join(back, "bert_model.ckpt"))
  names = [n for n in original.get_variable_to_shape_map()
           if "adam" not in n.lower() and n != "global_step"]
  assert len(names) > 20
  for name in names:
    np.testing.assert_array_equal(original.get_tensor(name), converted.get_tensor(name))

  (tmp_path / "corpus.txt").write_text(_documents(20), encoding="utf-8")
  _ok(["build_vocab.py", f"--input_file={gcs.upload(tmp_path / 'corpus.txt', 'corpus.txt')}",
       f"--output_dir={gcs.path('vocab')}", "--vocab_size=2000", "--num_unused=3"], gcs.env)
  vocab = gcs.read("vocab/vocab.txt").decode().splitlines()
  assert vocab[:1] == ["[PAD]"] and 1000 < len(vocab) <= 2000 and "the" in vocab
  _ok(["build_vocab.py", f"--input_file={gcs.path('corpus.txt')}",
       f"--output_dir={gcs.path('spm')}", "--vocab_type=sentencepiece", "--vocab_size=500"],
      gcs.env)
  assert {"spm/spm.model", "spm/spm.vocab"} <= set(gcs.names("spm/"))

  with open(V1_DEV, encoding="utf-8") as f:
    questions = [qa for a in json.load(f)["data"] for p in a["paragraphs"] for qa in p["qas"]]
  (tmp_path / "pred.json").write_text(json.dumps({qa["id"]: qa["answers"][0]["text"]
                                                  for qa in questions}))
  _ok(["evaluate_squad.py", gcs.upload(V1_DEV, "dev.json"),
       gcs.upload(tmp_path / "pred.json", "pred.json"), "-o", gcs.path("eval.json")], gcs.env)
  assert json.loads(gcs.read("eval.json"))["exact_match"] == 100.0
  assert not _temporaries(gcs.names())


@requires_shared
def test_hostile_object_store_cases_each_one_error_line(gcs, gcs_emulator, tmp_path):
  """A missing bucket, a denied bucket, an unreachable service, an unregistered scheme, an output
  that is an input, a remote output_dir held by a live run (its .lock): each one `error:` line
  naming the path and the cause, before any work; a lock whose process is gone is taken over."""
  from gcs_emulator import DENIED_BUCKET  # pylint: disable=g-import-not-at-top
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(_documents(2), encoding="utf-8")
  remote = gcs.upload(corpus, "corpus.txt")
  vocab = gcs.upload(VOCAB, "vocab.txt")

  def make_data(input_file, output_file, env=gcs.env):
    return _error(["create_pretraining_data.py", f"--input_file={input_file}",
                   f"--vocab_file={vocab}", f"--output_file={output_file}"], env)

  line = make_data("gs://no-such-bucket-here/corpus.txt", gcs.path("out.tfrecord"))
  assert "gs://no-such-bucket-here/corpus.txt" in line and "does not exist" in line, line
  line = make_data(remote, "gs://no-such-bucket-here/out.tfrecord")
  assert "gs://no-such-bucket-here" in line and "does not exist" in line, line
  line = make_data(f"gs://{DENIED_BUCKET}/corpus.txt", gcs.path("out.tfrecord"))
  assert DENIED_BUCKET in line and "permission denied" in line, line
  line = make_data(remote, f"gs://{DENIED_BUCKET}/out.tfrecord")
  assert DENIED_BUCKET in line and "permission denied" in line, line
  line = make_data(remote, gcs.path("out.tfrecord"),
                   gcs_emulator.env(ENV, proxy_port=_closed_port()))
  assert remote in line and "could not be reached" in line, line
  line = make_data("s3://bucket/corpus.txt", gcs.path("out.tfrecord"))
  assert "s3://" in line and "tensorflow-io" in line, line
  assert gcs.names() == ["corpus.txt", "vocab.txt"]  # nothing written anywhere
  # A fine-tuning run names the flag and the path as typed: not the output_dir with the file the
  # script writes there appended, not the pattern of a checkpoint's files, and no "folder".
  def fine_tune(output_dir, init_checkpoint=os.path.join(TINY, "bert_model.ckpt")):
    return _error(["run_classifier.py", "--task_name=sst-2", f"--data_dir={SST}",
                   f"--vocab_file={TINY}/vocab.txt", f"--init_checkpoint={init_checkpoint}",
                   f"--output_dir={output_dir}", "--do_train", "--max_seq_length=16"], gcs.env)
  for bucket, cause in (("no-such-bucket-here", "does not exist"),
                        (DENIED_BUCKET, "permission denied")):
    line = fine_tune(f"gs://{bucket}/run")
    assert line.startswith(f"error: --output_dir=gs://{bucket}/run: ") and cause in line, line
    line = fine_tune(tmp_path / "run", f"gs://{bucket}/model")
    assert line.startswith(f"error: --init_checkpoint=gs://{bucket}/model: ") and cause in line, \
        line
  line = fine_tune(tmp_path / "run", gcs.path("nomodel"))
  assert line == (f"error: --init_checkpoint={gcs.path('nomodel')}: no checkpoint there (no "
                  "object under that prefix, and no nomodel.* objects)"), line
  assert gcs.names() == ["corpus.txt", "vocab.txt"] and not (tmp_path / "run").exists()

  # A remote output_dir whose .lock names a live process of this machine (this test's) is in use.
  import socket  # pylint: disable=g-import-not-at-top
  host = "".join(c if c.isalnum() or c in ".-" else "-" for c in socket.gethostname())
  config = tmp_path / "config.json"
  config.write_text(json.dumps(TINY_CONFIG))
  pretrain = ["run_pretraining.py", f"--bert_config_file={config}",
              f"--input_file={RECORDS}",
              f"--output_dir={gcs.path('held')}", "--do_train", "--train_batch_size=8",
              "--num_train_steps=2", "--num_warmup_steps=1", "--max_seq_length=128",
              "--max_predictions_per_seq=20"]
  tmp_lock = tmp_path / "lock"
  tmp_lock.write_text(f"{host} {os.getpid()} 0123abcd\n")
  gcs.upload(tmp_lock, "held/.lock")
  line = _error(pretrain, gcs.env)
  assert gcs.path("held") in line and "in use by another run" in line, line
  assert gcs.names("held/") == ["held/.lock"]
  # The same lock of a process that is gone (a killed run) is stale: the next run takes it over.
  tmp_lock.write_text(f"{host} {_dead_pid()} 0123abcd\n")
  gcs.upload(tmp_lock, "held/.lock")
  _ok(pretrain, gcs.env)
  assert gcs.exists(gcs.path("held", "ckpt-2.index")) and "held/.lock" not in gcs.names("held/")
  # Two writers of one model folder (an export): the second finds the first's `.NAME.lock`
  # object beside it and is refused; a killed writer's is taken over.
  export = ["export_model.py", f"--init_checkpoint={TINY}/bert_model.ckpt",
            f"--vocab_file={TINY}/vocab.txt", "--max_seq_length=16",
            f"--export_dir={gcs.path('models', 'encoder')}"]
  tmp_lock.write_text(f"{host} {os.getpid()} 4567cdef\n")
  gcs.upload(tmp_lock, "models/.encoder.lock")
  line = _error(export, gcs.env)
  assert line.startswith(f"error: --export_dir={gcs.path('models', 'encoder')} is being written "
                         f"by another run (process {os.getpid()} on {host}: its "), line
  assert gcs.names("models/") == ["models/.encoder.lock"]
  tmp_lock.write_text(f"{host} {_dead_pid()} 4567cdef\n")
  gcs.upload(tmp_lock, "models/.encoder.lock")
  _ok(export, gcs.env)
  assert gcs.exists(gcs.path("models", "encoder", "saved_model.pb"))
  assert "models/.encoder.lock" not in gcs.names("models/")


@requires_shared
def test_sigkill_between_upload_and_copy_leaves_the_old_output_and_the_rerun_sweeps(gcs):
  """A process killed with SIGKILL after its upload, before the service copies it onto the final
  name: the final object is still the earlier output (never a part of the new one), the hidden
  temporary is left, and the next run that writes the output removes it."""
  gcs.emulator.put(gcs.name, "out.txt", b"earlier output")
  write = ("import os, signal, sys\n"
           "import tensorflow as tf\n"
           "from bert_tf2 import fileio\n"
           "if sys.argv[2] == 'kill':\n"
           "  tf.io.gfile.rename = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
           "with fileio.open_atomic(sys.argv[1]) as f:\n"
           "  f.write('new output ' * 1000)\n")
  killed = run_script(["-c", write, gcs.path("out.txt"), "kill"], env=gcs.env, timeout=300)
  assert killed.returncode == -9, killed.stderr[-2000:]
  assert gcs.read("out.txt") == b"earlier output"
  left = _temporaries(gcs.names())
  assert len(left) == 1 and left[0].startswith(".out.txt.tmp-"), gcs.names()
  _ok(["-c", write, gcs.path("out.txt"), "write"], gcs.env)
  assert gcs.read("out.txt") == b"new output " * 1000
  assert gcs.names() == ["out.txt"]

def _closed_port():
  import socket  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _dead_pid():
  pid = 2 ** 22 - 7
  while True:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return pid
    except PermissionError:
      pass
    pid -= 1


# In-process checks of fileio / object_store on TensorFlow's in-memory file system (ram://), which
# has no atomic rename either: the mechanisms themselves, without a process.


def _ram(name):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = f"ram://{name}-{os.getpid()}"
  if tf.io.gfile.exists(path):
    tf.io.gfile.rmtree(path)
  tf.io.gfile.makedirs(path)
  return path, tf.io.gfile


def test_a_remote_output_appears_whole_or_not_at_all():
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  root, gfile = _ram("atomic")
  with fileio.open_atomic(f"{root}/out.txt") as f:
    f.write("first")
  with pytest.raises(KeyboardInterrupt):
    with fileio.open_atomic(f"{root}/out.txt") as f:
      f.write("half of the second")
      raise KeyboardInterrupt
  assert gfile.listdir(root) == ["out.txt"] and gfile.GFile(f"{root}/out.txt").read() == "first"
  # A directory output: the earlier one replaced only once the new one is complete.
  for content in ("old", "new"):
    with fileio.atomic_directory(f"{root}/export", replaceable=lambda p: True) as staging:
      os.makedirs(os.path.join(staging, "variables"))
      for name in ("saved_model.pb", "variables/v.index"):
        with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
          f.write(content)
  assert sorted(gfile.listdir(root)) == ["export", "out.txt"]
  assert gfile.GFile(f"{root}/export/variables/v.index").read() == "new"
  # A directory of the user's is never replaced.
  with gfile.GFile(f"{root}/mine/notes.txt", "w") as f:
    f.write("mine")
  with pytest.raises(fileio.InputError, match="does not hold an earlier output"):
    with fileio.atomic_directory(f"{root}/mine", replaceable=lambda p: False):
      pass
  assert gfile.GFile(f"{root}/mine/notes.txt").read() == "mine"


def test_remote_inputs_read_as_local_ones_and_outputs_never_overwrite_them():
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  root, gfile = _ram("inputs")
  with gfile.GFile(f"{root}/a.txt", "wb") as f:
    f.write("\ufeffone\r\ntwo\n".encode())
  with gfile.GFile(f"{root}/bad.txt", "wb") as f:
    f.write(b"fine\n\xff\n")
  assert list(fileio.read_lines(f"{root}/a.txt")) == [(1, "one"), (2, "two")]
  with pytest.raises(fileio.InputError, match=r"bad.txt:2: invalid UTF-8"):
    list(fileio.read_lines(f"{root}/bad.txt"))
  assert fileio.expand_file_patterns(f"{root}/*.txt") == [f"{root}/a.txt", f"{root}/bad.txt"]
  with pytest.raises(fileio.InputError, match="pattern matches no file"):
    fileio.expand_file_patterns(f"{root}/*.json")
  with pytest.raises(fileio.InputError, match="not found"):
    fileio.check_file(f"{root}/missing.txt")
  with pytest.raises(fileio.InputError, match="is the input given by --input_file"):
    fileio.check_outputs(files=[("output_file", f"{root}//a.txt")],
                         inputs=[("input_file", f"{root}/a.txt")])
  with pytest.raises(fileio.InputError, match="would replace a directory holding the input"):
    fileio.check_outputs(replaced_directories=[("export_dir", root)],
                         inputs=[("input_file", f"{root}/a.txt")])
  with pytest.raises(fileio.InputError, match=r"s3://.*tensorflow-io"):
    fileio.check_file("s3://bucket/a.txt")


def test_remote_lock_refuses_a_live_owner_and_the_sweep_keeps_live_and_input_temporaries():
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  from bert_tf2 import object_store  # pylint: disable=g-import-not-at-top
  root, gfile = _ram("lock")
  lock = object_store.Lock(f"{root}/out").acquire()
  try:
    with pytest.raises(object_store.LockHeld, match=f"process {os.getpid()}"):
      object_store.Lock(f"{root}/out").acquire()
  finally:
    lock.release()
  assert not gfile.exists(f"{root}/out/.lock")
  # (Taking over a dead run's lock rewrites the object, which ram:// appends to instead:
  # test_hostile_object_store_cases_each_one_error_line does it over the GCS double.)
  # Stale temporaries: a dead process's of this machine go; a live one's, and an input, stay.
  host = object_store._HOST  # pylint: disable=protected-access
  names = {"dead": f".out.txt.tmp-{_dead_pid()}-abcdefgh@{host}",
           "live": f".out.txt.tmp-{os.getpid()}-abcdefgh@{host}",
           "input": f".out.txt.tmp-{_dead_pid()}-ijklmnop@{host}"}
  for name in names.values():
    with gfile.GFile(f"{root}/{name}", "w") as f:
      f.write("x")
  fileio._INPUTS.append(f"{root}/{names['input']}")  # pylint: disable=protected-access
  fileio.remove_stale_temporaries([f"{root}/out.txt"])
  assert sorted(gfile.listdir(root)) == sorted(["out", names["live"], names["input"]])


def test_quickstart_keeps_its_local_folder_and_says_so_for_gs():
  """The quick start is a look around on this machine (plots, logs): a gs:// --output_dir is one
  line, not a local folder named `gs:`."""
  line = _error(["quickstart.py", "--output_dir=gs://bucket/quickstart"], ENV)
  assert "gs://bucket/quickstart" in line and "local" in line, line
  assert not os.path.lexists(os.path.join(ROOT, "gs:"))
