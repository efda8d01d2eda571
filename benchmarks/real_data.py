"""End-to-end throughput on real text: from the files to the outputs, ours vs HuggingFace.

Each task reads real data from ../shared/data, tokenizes it, batches it, runs the model and
turns its outputs into results, all inside the timed call (a fresh tokenizer each time, as a new
run of a script has):

- sst2: SST-2 dev sentences -> class probabilities (seq 128).
- mrpc: MRPC dev sentence pairs -> class probabilities (seq 128).
- squad: the first --squad_questions questions of SQuAD v1.1 dev -> an answer string each
  (seq 384, doc stride 128, query 64, n-best 20, answers up to 30 tokens).
- features: the first --corpus_lines lines of the WikiText-2 corpus -> the last layer's vector of
  every token.

Ours is the path the scripts take, in memory instead of through their TFRecord files: the task's
reader and feature conversion (run_classifier / run_squad), batches sorted by length and cut to
their longest (input_pipeline.length_order / trim_to_longest, as every script's prediction and
extract_features do), training.Trainer.predict, and run_squad.write_predictions for the answers.
The peer is HF transformers as its users write it: BertTokenizerFast, pad-to-longest batches in
input order (DataCollatorWithPadding's rule), BertForSequenceClassification / BertForQuestionAnswering /
BertModel under torch.inference_mode, fp32 or bf16 autocast, and for SQuAD the common offset-based
post-processing (the best start/end pair within the context of each window). Both sides use
BERT-base-shaped random weights (--layers etc.) and the same batch size. Both sides run every
variant (fp32, bf16) and the figure takes each side's best. The top-level `ratio` is the geometric
mean over the tasks of ours / peer. Issue #13 target: >= 2.0.

  python benchmarks/real_data.py
  python benchmarks/real_data.py --tasks=sst2 --layers=2 --hidden_size=128 --num_heads=2 \
      --intermediate_size=512 --repeats=1 --warmup=0    # smoke test
"""

import json
import os
import tempfile

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS

common.define_model_flags()
FLAGS.set_default("variants", ["fp32", "bf16"])
FLAGS.set_default("peak", "none")
flags.DEFINE_list("tasks", ["sst2", "mrpc", "squad", "features"], "Tasks to measure.")
flags.DEFINE_integer("predict_batch", 32, "Sequences per batch, both sides.", lower_bound=1)
flags.DEFINE_integer("squad_questions", 300, "SQuAD v1.1 dev questions (the first ones).",
                     lower_bound=1)
flags.DEFINE_integer("corpus_lines", 2000, "WikiText corpus lines for `features` (the first "
                     "non-empty ones; 0: all 8,133).", lower_bound=0)

DATA = os.path.join(common.SHARED, "data")
VOCAB = os.path.join(common.SHARED, "reference", "pretraining", "vocab_uncased.txt")
CORPUS = os.path.join(DATA, "corpus", "wikitext2_valid.sent_per_line.txt")
SQUAD = os.path.join(DATA, "squad", "dev-v1.1.json")
_GLUE = {"sst2": "SST-2", "mrpc": "MRPC"}


def _squad_subset():
  """The first --squad_questions questions of SQuAD dev as a file (made once per process)."""
  path = os.path.join(tempfile.gettempdir(), f"real_data_squad_{FLAGS.squad_questions}.json")
  if not os.path.exists(path):
    with open(SQUAD, encoding="utf-8") as f:
      dataset = json.load(f)
    left, articles = FLAGS.squad_questions, []
    for article in dataset["data"]:
      paragraphs = []
      for paragraph in article["paragraphs"]:
        if left <= 0:
          break
        paragraphs.append(dict(paragraph, qas=paragraph["qas"][:left]))
        left -= len(paragraphs[-1]["qas"])
      if paragraphs:
        articles.append(dict(article, paragraphs=paragraphs))
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump({"version": dataset["version"], "data": articles}, f)
    os.replace(tmp, path)
  return path


def _corpus_lines():
  with open(CORPUS, encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip()]
  return lines[:FLAGS.corpus_lines] if FLAGS.corpus_lines else lines


def _count(task):
  if task == "features":
    return len(_corpus_lines())
  if task == "squad":
    return FLAGS.squad_questions
  with open(os.path.join(DATA, "glue", _GLUE[task], "dev.tsv"), encoding="utf-8") as f:
    return sum(1 for _ in f) - 1


# --- ours ------------------------------------------------------------------------------------------


def ours(variant):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import input_pipeline  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  from bert_tf2 import tokenization  # pylint: disable=g-import-not-at-top
  from bert_tf2 import training  # pylint: disable=g-import-not-at-top

  task, _, precision = variant.partition(":")
  dtype = common.compute_dtype(precision)
  config = modeling.BertConfig(**common.model_dims())
  tf.random.set_seed(0)
  strategy = tf.distribute.get_strategy()
  batch = FLAGS.predict_batch

  def predict(trainer, arrays, seq_length, keys):
    """Model outputs `keys` for the feature arrays, a row per example in input order: batched by
    length, each batch cut to its longest, so a per-token row is as long as its batch's longest
    example (each script keeps only an example's own tokens, as the callers below do)."""
    n = len(arrays["input_ids"])
    order = input_pipeline.length_order(arrays["input_mask"].sum(1))
    pad = -n % batch
    sorted_arrays = {k: np.concatenate([v[order], np.zeros((pad,) + v.shape[1:], v.dtype)])
                     for k, v in arrays.items()}
    dataset = tf.data.Dataset.from_tensor_slices(sorted_arrays).batch(batch)
    multiple = input_pipeline.length_multiple(seq_length)
    dataset = dataset.map(lambda b: input_pipeline.trim_to_longest(b, multiple))
    outputs = {k: [] for k in keys}
    for out in trainer.predict(lambda ctx: dataset, keys):
      for k in keys:
        outputs[k].extend(out[k])
    rows = {k: [None] * n for k in keys}
    for k in keys:
      for position, example in enumerate(order):
        rows[k][example] = outputs[k][position]
    return rows

  if task in _GLUE:
    from bert_tf2 import classifier_tasks  # pylint: disable=g-import-not-at-top
    from bert_tf2 import run_classifier  # pylint: disable=g-import-not-at-top
    with strategy.scope():
      model = modeling.BertClassifier(config, 2, dtype)
    trainer = training.Trainer(strategy, model, loss_fn=None)

    def run():
      processor = classifier_tasks.get_processor(task)
      examples = processor.get_dev_examples(os.path.join(DATA, "glue", _GLUE[task]))
      tokenizer = tokenization.FullTokenizer(VOCAB, True)
      features = run_classifier.convert_examples_to_features(examples, processor.get_labels(),
                                                             128, tokenizer)
      arrays = _arrays(features, ("input_ids", "input_mask", "segment_ids"))
      logits = np.stack(predict(trainer, arrays, 128, ["logits"])["logits"])
      return tf.nn.softmax(logits).numpy()

  elif task == "features":
    from bert_tf2 import classifier_tasks  # pylint: disable=g-import-not-at-top
    from bert_tf2 import run_classifier  # pylint: disable=g-import-not-at-top

    class LastLayer(tf.Module):

      def __init__(self):
        super().__init__(name="encoder")
        self.bert = modeling.BertModel(config, dtype)

      def __call__(self, features, training=False, dropout_seed=None, inference_weights=None):
        out = self.bert(features["input_ids"], features["input_mask"], features["segment_ids"],
                        training=training, inference_weights=inference_weights)
        return {"last": tf.cast(out["sequence_output"], tf.float32)}

    with strategy.scope():
      model = LastLayer()
    trainer = training.Trainer(strategy, model, loss_fn=None)

    def run():
      # extract_features' layout ([CLS] a [SEP], truncated to 128) through the same converter.
      examples = [run_classifier.InputExample(str(i), line, None, "0")
                  for i, line in enumerate(_corpus_lines())]
      tokenizer = tokenization.FullTokenizer(VOCAB, True)
      features = run_classifier.convert_examples_to_features(examples, ["0"], 128, tokenizer)
      arrays = _arrays(features, ("input_ids", "input_mask", "segment_ids"))
      # As extract_features: sorted by length (its group of held outputs takes these 2,000
      # lines of last-layer vectors whole), each batch cut to its longest.
      last = predict(trainer, arrays, 128, ["last"])["last"]
      return [v[:int(m.sum())] for v, m in zip(last, arrays["input_mask"])]

  else:
    from bert_tf2 import run_squad  # pylint: disable=g-import-not-at-top
    with strategy.scope():
      model = modeling.BertSpanLabeler(config, dtype)
    trainer = training.Trainer(strategy, model, loss_fn=None)
    squad_file = _squad_subset()

    def run():
      examples = run_squad.read_squad_examples(squad_file, is_training=False)
      tokenizer = tokenization.FullTokenizer(VOCAB, True)
      features = []
      run_squad.convert_examples_to_features(examples, tokenizer, 384, 128, 64, False,
                                             features.append)
      arrays = _arrays(features, ("input_ids", "input_mask", "segment_ids"))
      # As run_squad's prediction: by length, cut, each window's logits kept to its own tokens.
      logits = predict(trainer, arrays, 384, ["start_logits", "end_logits"])
      lengths = arrays["input_mask"].sum(1)
      results = [run_squad.RawResult(f.unique_id, s[:n].tolist(), e[:n].tolist())
                 for f, s, e, n in zip(features, logits["start_logits"], logits["end_logits"],
                                       lengths)]
      answers, _, _ = run_squad.write_predictions(examples, features, results, 20, 30, True,
                                                  None, None, None)
      return answers

  return _measure(run, task)


def _arrays(features, names):
  import numpy as np  # pylint: disable=g-import-not-at-top
  return {name: np.array([getattr(f, name) for f in features], np.int32) for name in names}


def _measure(run, task):
  outputs = []

  def timed_run():
    outputs[:] = [run()]

  timing = common.timed(timed_run)
  count = _count(task)
  per_s, best_per_s = common.rate(count, timing)
  return {"per_s": per_s, "best_per_s": best_per_s, "timing": timing, "examples": count,
          "outputs": len(outputs[0])}


# --- the peer --------------------------------------------------------------------------------------


def peer(variant):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  task, _, precision = variant.partition(":")
  torch.manual_seed(0)
  hf_config = common.hf_config(transformers, num_labels=2)
  autocast = common.torch_autocast(precision)
  batch = FLAGS.predict_batch
  collate = None

  def batches(encoded, names):
    """Pad-to-longest batches in input order, as DataCollatorWithPadding makes them."""
    rows = len(encoded["input_ids"])
    for start in range(0, rows, batch):
      chunk = [{k: encoded[k][i] for k in names} for i in range(start, min(start + batch, rows))]
      yield collate(chunk)

  def tokenizer():
    return transformers.BertTokenizerFast(VOCAB, do_lower_case=True)

  if task in _GLUE:
    model = transformers.BertForSequenceClassification(hf_config).eval()

    def run():
      columns = _glue_columns(task)
      tok = tokenizer()
      nonlocal collate
      collate = transformers.DataCollatorWithPadding(tok, return_tensors="pt")
      encoded = tok(*columns, truncation=True, max_length=128)
      probabilities = []
      with torch.inference_mode(), autocast():
        for inputs in batches(encoded, ("input_ids", "attention_mask", "token_type_ids")):
          probabilities.append(torch.softmax(model(**inputs).logits.float(), -1).numpy())
      return np.concatenate(probabilities)

  elif task == "features":
    model = transformers.BertModel(hf_config).eval()

    def run():
      lines = _corpus_lines()
      tok = tokenizer()
      nonlocal collate
      collate = transformers.DataCollatorWithPadding(tok, return_tensors="pt")
      encoded = tok(lines, truncation=True, max_length=128)
      vectors = []
      with torch.inference_mode(), autocast():
        for inputs in batches(encoded, ("input_ids", "attention_mask", "token_type_ids")):
          last = model(**inputs).last_hidden_state.float().numpy()
          lengths = inputs["attention_mask"].sum(1).tolist()
          vectors.extend(v[:n] for v, n in zip(last, lengths))
      return vectors

  else:
    model = transformers.BertForQuestionAnswering(hf_config).eval()

    def run():
      questions, contexts, ids = _squad_questions()
      tok = tokenizer()
      nonlocal collate
      collate = transformers.DataCollatorWithPadding(tok, return_tensors="pt")
      encoded = tok(questions, contexts, truncation="only_second", max_length=384, stride=128,
                    return_overflowing_tokens=True, return_offsets_mapping=True)
      starts, ends = [], []
      with torch.inference_mode(), autocast():
        for inputs in batches(encoded, ("input_ids", "attention_mask", "token_type_ids")):
          out = model(**inputs)
          starts.extend(out.start_logits.float().numpy())
          ends.extend(out.end_logits.float().numpy())
      return _hf_answers(encoded, starts, ends, contexts, ids)

  result = _measure(run, task)
  result.update(common.torch_facts(model, torch, transformers))
  return result


def _glue_columns(task):
  """The dev file's text columns, as HF users read them."""
  import csv  # pylint: disable=g-import-not-at-top
  with open(os.path.join(DATA, "glue", _GLUE[task], "dev.tsv"), encoding="utf-8-sig") as f:
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  header, rows = rows[0], rows[1:]
  if task == "sst2":
    return ([r[header.index("sentence")] for r in rows],)
  return ([r[3] for r in rows], [r[4] for r in rows])


def _squad_questions():
  with open(_squad_subset(), encoding="utf-8") as f:
    data = json.load(f)["data"]
  questions, contexts, ids = [], [], []
  for article in data:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        questions.append(qa["question"].lstrip())
        contexts.append(paragraph["context"])
        ids.append(qa["id"])
  return questions, contexts, ids


def _hf_answers(encoded, starts, ends, contexts, ids, n_best=20, max_answer_length=30):
  """The usual post-processing of HF question answering: for each window the n_best start and end
  positions inside the context, the best-scoring valid span over an example's windows, its text
  from the offsets."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  best = {}
  for window, example in enumerate(encoded["overflow_to_sample_mapping"]):
    offsets = encoded["offset_mapping"][window]
    sequence_ids = encoded.sequence_ids(window)
    start_logits, end_logits = starts[window], ends[window]
    for s in np.argsort(start_logits[:len(offsets)])[::-1][:n_best]:
      for e in np.argsort(end_logits[:len(offsets)])[::-1][:n_best]:
        if (sequence_ids[s] != 1 or sequence_ids[e] != 1 or e < s
            or e - s + 1 > max_answer_length):
          continue
        score = start_logits[s] + end_logits[e]
        if example not in best or score > best[example][0]:
          best[example] = (score, contexts[example][offsets[s][0]:offsets[e][1]])
  return {ids[i]: best.get(i, (0, ""))[1] for i in range(len(ids))}


def main(argv):
  del argv
  groups = [{"name": f"{task}, end to end", "prefix": f"{task}:", "flops": 0.0}
            for task in FLAGS.tasks]
  FLAGS.peer_variants = list(FLAGS.variants)
  common.run_model_benchmark(
      "real_data", groups, {"ours": ours, "peer": peer},
      settings={**common.model_dims(), "tasks": list(FLAGS.tasks),
                "predict_batch": FLAGS.predict_batch, "squad_questions": FLAGS.squad_questions,
                "corpus_lines": FLAGS.corpus_lines,
                "weights": "random, BERT-base-shaped unless the flags say otherwise",
                "path": "from the data files to results, tokenizer made inside each timed call"},
      peer_name="HF transformers (BertTokenizerFast, DataCollatorWithPadding, Bert* models, "
                "torch CPU)", peer_modules=["torch", "transformers"], unit="examples/s",
      geometric_head=("real data end to end, geometric mean over tasks of ours / peer", 2.0))


if __name__ == "__main__":
  app.run(main)
