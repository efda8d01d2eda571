"""LiteRT models (export_model.py --format=litert, float32 and int8): extract_features.py and
run_classifier.py --litert_model give the checkpoint's outputs (float32: to rounding; int8:
close), on real text; bad uses are one error line."""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import SHARED, VOCAB, minilm_dir, requires_shared, run_ok, run_script
from bert_tf2 import checkpoints
from bert_tf2 import litert
from bert_tf2 import modeling

GLUE = os.path.join(SHARED, "data", "glue")
SMALL_CONFIG = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=128, type_vocab_size=2)


def _sst2_lines(path, count):
  with open(os.path.join(GLUE, "SST-2", "dev.tsv"), encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f][1:count + 1]
  path.write_text("".join(row[0] + "\n" for row in rows), encoding="utf-8")
  return str(path)


def _token_values(path):
  """{line: (tokens, [tokens, layers, hidden])} of an extract_features output."""
  out = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      record = json.loads(line)
      out[record["linex_index"]] = (
          [t["token"] for t in record["features"]],
          np.array([[layer["values"] for layer in t["layers"]] for t in record["features"]]))
  return out


def _embeddings(path):
  with open(path, encoding="utf-8") as f:
    return np.array([json.loads(line)["embedding"] for line in f])


def _mean_ranks(values):
  """0-based ranks, tied values given their mean rank (the gold scores have ties)."""
  order = np.argsort(values, kind="stable")
  ranks = np.empty(len(values))
  ranks[order] = np.arange(len(values))
  _, group, counts = np.unique(values, return_inverse=True, return_counts=True)
  return (np.bincount(group, ranks) / counts)[group]


def _cosines(a, b):
  return np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def minilm_litert(tmp_path_factory):
  """{"none": dir, "int8": dir}: the packaged all-MiniLM-L6-v2 encoder as LiteRT models."""
  model_dir = minilm_dir()
  base = tmp_path_factory.mktemp("litert")
  out = {}
  for quantize in ("none", "int8"):
    out[quantize] = str(base / quantize)
    run_ok(["export_model.py", "--format=litert", f"--quantize={quantize}",
            f"--init_checkpoint={model_dir}", f"--export_dir={out[quantize]}"])
  return out


@requires_shared
def test_litert_encoder_features_equal_the_checkpoints(minilm_litert, tmp_path):
  """extract_features.py on 40 SST-2 dev sentences, two layers: the float32 LiteRT model's
  values are the checkpoint's to the 6 decimals written (1e-5); int8's are close (every token
  vector within cosine 0.97 of float, mean above 0.99), from a model a quarter of the size."""
  model_dir = minilm_dir()
  lines = _sst2_lines(tmp_path / "lines.txt", 40)
  outputs = {}
  for name, flags in (("checkpoint", [f"--init_checkpoint={model_dir}",
                                      f"--vocab_file={model_dir}/vocab.txt"]),
                      ("none", [f"--litert_model={minilm_litert['none']}"]),
                      ("int8", [f"--litert_model={minilm_litert['int8']}"])):
    path = str(tmp_path / f"{name}.jsonl")
    run_ok(["extract_features.py", *flags, f"--input_file={lines}", f"--output_file={path}",
            "--layers=-1,-3", "--batch_size=8"])
    outputs[name] = _token_values(path)
  want = outputs["checkpoint"]
  assert sorted(want) == list(range(40))
  cosines = []
  for line, (tokens, values) in want.items():
    float_tokens, float_values = outputs["none"][line]
    assert float_tokens == tokens
    np.testing.assert_allclose(float_values, values, atol=1e-5, rtol=0)
    int8_tokens, int8_values = outputs["int8"][line]
    assert int8_tokens == tokens
    cosines.append(_cosines(int8_values, values).ravel())
  cosines = np.concatenate(cosines)
  print(f"int8 token vectors: cosine to float min {cosines.min():.4f} mean {cosines.mean():.4f}")
  assert cosines.min() > 0.97 and cosines.mean() > 0.99
  sizes = {q: os.path.getsize(os.path.join(d, litert.MODEL_FILE))
           for q, d in minilm_litert.items()}
  assert sizes["int8"] < 0.3 * sizes["none"]
  info = litert.read_info(minilm_litert["int8"])
  assert info["kind"] == "encoder" and info["quantize"] == "int8" and info["do_lower_case"]


def test_a_model_with_flipped_bytes_is_refused_by_its_checksum(minilm_litert, tmp_path):
  """litert_model.json records the SHA-256 of model.tflite; a copy with one byte flipped in the
  middle of its weights (which LiteRT loads and runs, giving other numbers) is refused in one
  line naming the file; the intact copy loads and runs."""
  import shutil  # pylint: disable=g-import-not-at-top
  original = minilm_litert["int8"]
  info = json.loads(open(os.path.join(original, litert.INFO_FILE), encoding="utf-8").read())
  with open(os.path.join(original, litert.MODEL_FILE), "rb") as f:
    content = f.read()
  assert info["model_sha256"] == litert.sha256(content)
  copy = tmp_path / "copy"
  shutil.copytree(original, copy)
  ids = np.array([[101, 7592, 102, 0]], np.int32)
  outputs = litert.Model(str(copy))(ids, (ids > 0).astype(np.int32), np.zeros_like(ids))
  assert np.isfinite(outputs["pooled_output"]).all()
  damaged = bytearray(content)
  damaged[len(damaged) // 2] ^= 0x40
  (copy / litert.MODEL_FILE).write_bytes(bytes(damaged))
  with pytest.raises(litert.fileio.InputError,
                     match=f"{copy}/model.tflite: its bytes are not those export_model.py wrote "
                           r"\(SHA-256 [0-9a-f]{12}\.\.\., litert_model.json records "
                           f"{info['model_sha256'][:12]}"):
    litert.Model(str(copy))


@requires_shared
def test_litert_sentence_embeddings_equal_sentence_transformers(minilm_litert, tmp_path):
  """--pooling=mean --normalize: from the float32 LiteRT encoder, sentence-transformers'
  reference vectors within 1e-5 (as from the checkpoint); an int8 embedder's within cosine 0.99.
  The embedder's own pooling must not be contradicted."""
  reference = np.load(os.path.join(SHARED, "reference", "minilm_sentence_embeddings.npz"))
  sentences = [str(s) for s in reference["sentences"]]
  keep = [i for i, s in enumerate(sentences) if "[" not in s]
  lines = tmp_path / "sentences.txt"
  lines.write_text("".join(sentences[i].replace("\n", " ") + "\n" for i in keep),
                   encoding="utf-8")
  want = reference["normalized"][keep]
  out = str(tmp_path / "float.jsonl")
  run_ok(["extract_features.py", f"--litert_model={minilm_litert['none']}",
          f"--input_file={lines}", f"--output_file={out}", "--pooling=mean", "--normalize",
          "--max_seq_length=256", "--batch_size=16"])
  got = _embeddings(out)
  assert got.shape == want.shape
  assert np.abs(got - want).max() < 1e-5

  embedder = str(tmp_path / "embedder")
  run_ok(["export_model.py", "--format=litert", "--quantize=int8", "--model_type=embedder",
          f"--init_checkpoint={minilm_dir()}", "--normalize", f"--export_dir={embedder}"])
  out = str(tmp_path / "int8.jsonl")
  run_ok(["extract_features.py", f"--litert_model={embedder}", f"--input_file={lines}",
          f"--output_file={out}", "--max_seq_length=256"])
  cosines = _cosines(_embeddings(out), want)
  print(f"int8 embedder: cosine to sentence-transformers min {cosines.min():.4f}")
  assert cosines.min() > 0.99
  # What users judge the vectors by: STS-B dev, the Spearman correlation of the pairs' cosines
  # with the gold scores. sentence-transformers' fp32 vectors give 0.8672 there, its bf16 0.8673,
  # torch's quantize_dynamic of its model 0.8622, its ONNX int8 model 0.8658
  # (benchmarks/sentence_embeddings.py); the int8 embedder must keep the float figure, within
  # 0.003.
  with open(os.path.join(GLUE, "STS-B", "dev.tsv"), encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f]
  head, rows = rows[0], rows[1:]
  pairs = tmp_path / "stsb.txt"
  pairs.write_text("".join(r[head.index(column)] + "\n" for column in ("sentence1", "sentence2")
                           for r in rows), encoding="utf-8")
  out = str(tmp_path / "stsb.jsonl")
  run_ok(["extract_features.py", f"--litert_model={embedder}", f"--input_file={pairs}",
          f"--output_file={out}", "--max_seq_length=256"])
  vectors = _embeddings(out)
  assert len(vectors) == 2 * len(rows) == 3000
  similarity = _cosines(vectors[:len(rows)], vectors[len(rows):])
  gold = np.array([float(r[head.index("score")]) for r in rows])
  spearman = np.corrcoef(_mean_ranks(similarity), _mean_ranks(gold))[0, 1]
  print(f"int8 embedder: STS-B dev Spearman {spearman:.4f}")
  assert abs(spearman - 0.8672) < 0.003
  # ... and these are int8 vectors, not a float model's.
  assert litert.read_info(embedder, "litert_model")["quantize"] == "int8"
  assert os.path.getsize(os.path.join(embedder, litert.MODEL_FILE)) < 30e6  # float: ~91 MB
  result = run_script(["extract_features.py", f"--litert_model={embedder}",
                       f"--input_file={lines}", f"--output_file={tmp_path / 'cls.jsonl'}",
                       "--pooling=cls"])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"error: --litert_model={embedder} is an embedder of --pooling=mean --normalize=True")
  assert not os.path.exists(tmp_path / "cls.jsonl")


def _tsv_rows(path):
  with open(path, encoding="utf-8") as f:
    return [line.rstrip("\n").split("\t") for line in f]


def _eval_results(directory):
  with open(os.path.join(directory, "eval_results.txt"), encoding="utf-8") as f:
    return dict(line.strip().split(" = ") for line in f)


@requires_shared
def test_run_classifier_evaluates_and_predicts_with_a_litert_classifier(tmp_path):
  """A fine-tuned MRPC classifier exported to LiteRT: run_classifier --litert_model --do_eval
  --do_predict writes the checkpoint's metrics and probabilities (float32: within 1e-5; int8:
  the same predicted label on nearly every pair); the errors of bad uses are one line."""
  config = modeling.BertConfig(**SMALL_CONFIG)
  pretrained = str(tmp_path / "pretrained" / "bert_model.ckpt")
  checkpoints.export_tf1_checkpoint(modeling.BertModel(config), pretrained, config, VOCAB)
  trained = tmp_path / "mrpc"
  common = ["--task_name=mrpc", f"--data_dir={GLUE}/MRPC", "--max_seq_length=64",
            "--eval_batch_size=16", "--predict_batch_size=16"]
  run_ok(["run_classifier.py", *common, f"--vocab_file={VOCAB}",
          f"--init_checkpoint={pretrained}", f"--output_dir={trained}", "--do_train",
          "--do_eval", "--do_predict", "--train_batch_size=32", "--num_train_epochs=0.3",
          "--learning_rate=1e-3"])
  want = _eval_results(trained)
  want_rows = _tsv_rows(trained / "test_predictions.tsv")
  exported = {}
  for quantize in ("none", "int8"):
    exported[quantize] = str(tmp_path / f"litert_{quantize}")
    run_ok(["export_model.py", "--format=litert", "--model_type=classifier",
            f"--quantize={quantize}", f"--init_checkpoint={trained}",
            f"--export_dir={exported[quantize]}"])
  info = litert.read_info(exported["none"])
  assert info["labels"] == ["0", "1"] and info["text_pairs"] and info["kind"] == "classifier"
  assert info["global_step"] == int(want["global_step"])

  results = {}
  for quantize, directory in exported.items():
    out = tmp_path / f"eval_{quantize}"
    run_ok(["run_classifier.py", *common, f"--litert_model={directory}", f"--output_dir={out}",
            "--do_eval", "--do_predict"])
    results[quantize] = _eval_results(out), _tsv_rows(out / "test_predictions.tsv")
  # (The same checkpoint as --init_checkpoint, no --vocab_file: the vocab.txt beside it.)
  from_init = tmp_path / "from_init"
  run_ok(["run_classifier.py", *common, f"--init_checkpoint={trained}",
          f"--output_dir={from_init}", "--do_eval"])
  assert _eval_results(from_init)["eval_accuracy"] == want["eval_accuracy"]
  got, rows = results["none"]
  assert got["eval_accuracy"] == want["eval_accuracy"] and got["global_step"] == want[
      "global_step"] and got["eval_examples"] == want["eval_examples"] == "408"
  assert abs(float(got["eval_loss"]) - float(want["eval_loss"])) < 1e-5
  assert len(rows) == len(want_rows) == 1726
  assert [r[:2] for r in rows] == [r[:2] for r in want_rows]
  np.testing.assert_allclose(np.array([r[2:] for r in rows[1:]], float),
                             np.array([r[2:] for r in want_rows[1:]], float), atol=1e-5)
  got, rows = results["int8"]
  same = np.mean([a[1] == b[1] for a, b in zip(rows[1:], want_rows[1:])])
  print(f"int8: eval accuracy {got['eval_accuracy']} (float {want['eval_accuracy']}), "
        f"{same:.1%} of the test predictions the same")
  assert same > 0.95
  assert abs(float(got["eval_accuracy"]) - float(want["eval_accuracy"])) < 0.03

  # Bad uses: one error line each, nothing written.
  bad = tmp_path / "bad"
  # Truncated, and (as from an export before checksums were recorded) with no checksum to catch
  # it: the runtime's refusal is the one line. A recorded checksum is tested above.
  damaged = tmp_path / "damaged"
  damaged.mkdir()
  for name in os.listdir(exported["none"]):
    data = open(os.path.join(exported["none"], name), "rb").read()
    if name == litert.INFO_FILE:
      info = json.loads(data)
      del info["model_sha256"]
      data = json.dumps(info).encode("utf-8")
    (damaged / name).write_bytes(data[:1000] if name == litert.MODEL_FILE else data)
  truncated = tmp_path / "truncated"
  shutil.copytree(exported["none"], truncated)
  with open(truncated / litert.MODEL_FILE, "r+b") as f:
    f.truncate(1000)
  encoder = str(tmp_path / "encoder")
  run_ok(["export_model.py", "--format=litert", f"--init_checkpoint={trained}",
          f"--export_dir={encoder}"])
  for flags, message in (
      ([f"--litert_model={exported['none']}", "--do_train"],
       "error: --do_train with --litert_model: a LiteRT model only predicts"),
      ([f"--litert_model={exported['none']}", f"--init_checkpoint={pretrained}", "--do_eval"],
       "error: --init_checkpoint with --litert_model"),
      ([f"--litert_model={encoder}", "--do_eval"],
       f"error: --litert_model={encoder} is a LiteRT encoder; run_classifier.py needs a LiteRT "
       "classifier"),
      ([f"--litert_model={tmp_path / 'nowhere'}", "--do_eval"],
       f"error: --litert_model={tmp_path / 'nowhere'} is not a directory"),
      ([f"--litert_model={damaged}", "--do_eval"],
       f"error: {damaged / litert.MODEL_FILE}: not a LiteRT model this runtime can load"),
      ([f"--litert_model={truncated}", "--do_eval"],
       f"error: {truncated / litert.MODEL_FILE}: its bytes are not those export_model.py wrote"),
      ([f"--litert_model={exported['none']}", "--do_eval", "--nodo_lower_case"],
       "error: --do_lower_case=False does not match")):
    result = run_script(["run_classifier.py", *common, f"--output_dir={bad}", *flags])
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr[-2000:]
    assert not bad.exists()
  result = run_script(["run_classifier.py", "--task_name=sst-2", f"--data_dir={GLUE}/SST-2",
                       f"--litert_model={exported['none']}", f"--output_dir={bad}",
                       "--do_eval"])
  assert result.returncode == 2 and not bad.exists()
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: --litert_model={exported['none']} classifies sentence pairs, --task_name=sst-2 "
      "has single texts")

  # export: LiteRT kinds only, --quantize only for LiteRT; an existing LiteRT export is
  # replaced, a user's directory is not.
  for flags, message in (
      (["--format=litert", "--model_type=squad"], "error: --format=litert exports"),
      (["--quantize=int8"], "error: --quantize=int8 is for --format=litert")):
    result = run_script(["export_model.py", f"--init_checkpoint={trained}",
                         f"--export_dir={bad}", *flags])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr[-2000:]
    assert not bad.exists()
  before = os.path.getsize(os.path.join(exported["int8"], litert.MODEL_FILE))
  run_ok(["export_model.py", "--format=litert", "--model_type=classifier",
          f"--init_checkpoint={trained}", f"--export_dir={exported['int8']}"])
  assert os.path.getsize(os.path.join(exported["int8"], litert.MODEL_FILE)) > 2 * before
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("keep", encoding="utf-8")
  result = run_script(["export_model.py", "--format=litert", f"--init_checkpoint={trained}",
                       f"--export_dir={mine}"])
  assert result.returncode == 2 and (mine / "notes.txt").read_text(encoding="utf-8") == "keep"


def test_the_documented_embedder_command_runs_on_a_two_layer_model(tmp_path):
  """docs/features-and-serving.md's embedder commands, as written (no --layers, no --pooling),
  on a 2-layer model: the embedder pools its own last layer, so extract_features' default
  --layers of token features (-1,-2,-3,-4, which a 2-layer model has not) does not apply; one
  unit-length vector a line. Asking for a layer is still refused in one line."""
  config = modeling.BertConfig(**SMALL_CONFIG)
  pretrained = str(tmp_path / "pretrained" / "bert_model.ckpt")
  checkpoints.export_tf1_checkpoint(modeling.BertModel(config), pretrained, config, VOCAB)
  embedder = tmp_path / "embedder"
  run_ok(["export_model.py", "--format=litert", "--quantize=int8", "--model_type=embedder",
          f"--init_checkpoint={pretrained}", "--normalize", "--max_seq_length=64",
          f"--export_dir={embedder}"])
  lines = tmp_path / "sentences.txt"
  lines.write_text("a first sentence .\nand a second one\n", encoding="utf-8")
  out = tmp_path / "vectors.jsonl"
  run_ok(["extract_features.py", f"--litert_model={embedder}", f"--input_file={lines}",
          f"--output_file={out}", "--max_seq_length=64"])
  vectors = _embeddings(out)
  assert vectors.shape == (2, 32)
  np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
  result = run_script(["extract_features.py", f"--litert_model={embedder}",
                       f"--input_file={lines}", f"--output_file={tmp_path / 'no.jsonl'}",
                       "--layers=-2"])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"error: --litert_model={embedder} is an embedder of --pooling=mean"), result.stderr[-2000:]


def test_the_converter_is_tensorflows_and_a_wheel_without_it_is_one_line(monkeypatch):
  """LiteRT's packages run models but convert no TensorFlow graph, so the converter is the
  TensorFlow wheel's tf.lite.TFLiteConverter; a TensorFlow without tf.lite (announced to leave the
  wheel) makes --format=litert one line naming the versions that carry it, before any work."""
  import types  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  assert litert.converter_class() is tf.lite.TFLiteConverter
  monkeypatch.setattr(tf, "lite", types.SimpleNamespace(Interpreter=None))
  with pytest.raises(fileio.InputError, match=r"--format=litert: TensorFlow .* has no tf\.lite "
                     r"converter .*export the LiteRT model with TensorFlow 2\.21 or 2\.20"):
    litert.convert(None, None, "int8")
