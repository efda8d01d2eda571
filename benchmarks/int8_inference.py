"""int8 CPU inference: a fine-tuned MiniLM classifier as an int8 LiteRT model (export_model.py
--format=litert --quantize=int8) against HuggingFace's CPU int8 path
(torch.ao.quantization.quantize_dynamic on the Linear layers) and HF fp32, same run.

For each task (SST-2, MRPC; GLUE dev sets from ../shared/data/glue):

1. Fine-tune the packaged all-MiniLM-L6-v2 with run_classifier.py (kept in --work_dir and reused:
   SST-2 seq 64 for --sst2_epochs, MRPC seq 128 for 3 epochs; batch 32, lr 5e-5, bf16 where the
   CPU has it) and export it twice with export_model.py --format=litert (float32, int8).
2. Accuracy: run_classifier.py --do_eval from the checkpoint (TensorFlow, float32) and with
   --litert_model for each export, as a user runs them. Issue #34's target: int8 within 1 point
   of float.
3. Speed, sentences (or pairs) per second over the whole dev set, texts in and probabilities
   out, each side in its own child process with every core: batches of --batch_size in order of
   length, each padded to its longest. Ours: the script's tokenizer (tokenization.FullTokenizer,
   run_classifier's features) and litert.Model. The peer: the same weights as HF
   BertForSequenceClassification (convert_checkpoint.py --output_format=hf for the encoder, the
   classifier layer copied), BertTokenizerFast, torch.inference_mode; fp32 and quantize_dynamic
   qint8. Each side's dev accuracy is in its result (HF fp32's equals ours float, a check of the
   conversion). Targets: >= 1.5x HF int8, >= 2x HF fp32. With --rounds=N every variant runs in
   N child processes, the variants taking turns, and its figure is the median of all their
   timed calls: on a shared host whose speed drifts by 20-30% over minutes, one process per side
   in a row gave ratios from 1.1x to 1.8x for the same two models.

  python benchmarks/int8_inference.py                       # fine-tunes first: ~20 min
  python benchmarks/int8_inference.py --tasks=mrpc --repeats=1 --warmup=0 --mrpc_epochs=0.1 \\
      --sst2_epochs=0.01 --work_dir=/tmp/int8_smoke        # smoke test
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags
import numpy as np

import common

FLAGS = flags.FLAGS

flags.DEFINE_list("tasks", ["sst2", "mrpc"], "GLUE tasks: sst2, mrpc.")
flags.DEFINE_string("work_dir", "/tmp/int8_inference", "Fine-tuned models and exports, reused.")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch, both sides.", lower_bound=1)
flags.DEFINE_float("sst2_epochs", 0.3, "Fine-tuning epochs on SST-2 (67k sentences).")
flags.DEFINE_float("mrpc_epochs", 3, "Fine-tuning epochs on MRPC.")
flags.DEFINE_string("mixed_precision", "bf16", "Fine-tuning --mixed_precision.")
flags.DEFINE_list("variants", ["int8", "none"], "Our LiteRT exports to time: int8, none.")
flags.DEFINE_list("peer_variants", ["fp32", "int8"], "HF: fp32, int8 (quantize_dynamic).")
flags.DEFINE_bool("measure", True, "False: only fine-tune, export and evaluate (the long part, "
                  "which needs no quiet machine).")

GLUE = os.path.join(common.SHARED, "data", "glue")
_TASKS = {"sst2": ("SST-2", "sst-2", 64), "mrpc": ("MRPC", "mrpc", 128)}


def _paths(task):
  base = os.path.join(FLAGS.work_dir, task)
  return {"model": os.path.join(base, "model"), "hf": os.path.join(base, "hf"),
          "none": os.path.join(base, "litert_none"), "int8": os.path.join(base, "litert_int8"),
          "eval": os.path.join(base, "eval")}


def _run(args):
  print("[int8_inference] " + " ".join(args), file=sys.stderr, flush=True)
  subprocess.run([sys.executable, *args], cwd=common.ROOT, check=True,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def _eval_results(directory):
  with open(os.path.join(directory, "eval_results.txt"), encoding="utf-8") as f:
    return {k: float(v) for k, v in (line.strip().split(" = ") for line in f)}


def _prepare(task):
  """Fine-tunes (unless done), exports, evaluates; returns the accuracies."""
  folder, name, seq = _TASKS[task]
  paths = _paths(task)
  epochs = FLAGS.sst2_epochs if task == "sst2" else FLAGS.mrpc_epochs
  common_flags = [f"--task_name={name}", f"--data_dir={GLUE}/{folder}", f"--max_seq_length={seq}",
                  "--eval_batch_size=64"]
  if not os.path.exists(os.path.join(paths["model"], "eval_results.txt")):
    model = common.minilm_dir()
    _run(["run_classifier.py", *common_flags, f"--init_checkpoint={model}",
          f"--vocab_file={model}/vocab.txt", f"--output_dir={paths['model']}", "--do_train",
          "--do_eval", "--train_batch_size=32", "--learning_rate=5e-5",
          f"--num_train_epochs={epochs}", f"--mixed_precision={FLAGS.mixed_precision}",
          "--seed=1"])
  # The training run evaluated in its --mixed_precision; the float32 figure is its own run.
  if not os.path.exists(os.path.join(f"{paths['eval']}_tf", "eval_results.txt")):
    _run(["run_classifier.py", *common_flags, f"--init_checkpoint={paths['model']}",
          f"--vocab_file={paths['model']}/vocab.txt", f"--output_dir={paths['eval']}_tf",
          "--do_eval", "--mixed_precision=none"])
  accuracy = {"tf_float32": _eval_results(f"{paths['eval']}_tf")["eval_accuracy"],
              f"tf_{FLAGS.mixed_precision}": _eval_results(paths["model"])["eval_accuracy"]}
  for quantize in ("none", "int8"):
    if not os.path.exists(paths[quantize]):
      _run(["export_model.py", "--format=litert", "--model_type=classifier",
            f"--quantize={quantize}", f"--init_checkpoint={paths['model']}",
            f"--export_dir={paths[quantize]}", f"--max_seq_length={seq}"])
    out = f"{paths['eval']}_{quantize}"
    if not os.path.exists(os.path.join(out, "eval_results.txt")):
      _run(["run_classifier.py", *common_flags, f"--litert_model={paths[quantize]}",
            f"--output_dir={out}", "--do_eval"])
    accuracy[f"litert_{quantize}"] = _eval_results(out)["eval_accuracy"]
  if not os.path.exists(paths["hf"]):
    _run(["convert_checkpoint.py", f"--input={paths['model']}", f"--output={paths['hf']}",
          "--output_format=hf"])
  return accuracy


def _dev(task):
  """(examples, label list, seq length) of the task's dev set."""
  from bert_tf2 import classifier_tasks  # pylint: disable=g-import-not-at-top
  folder, name, seq = _TASKS[task]
  processor = classifier_tasks.get_processor(name)
  examples = processor.get_dev_examples(os.path.join(GLUE, folder))
  return examples, processor.get_labels(), seq


def _batches(lengths):
  order = np.argsort(np.asarray(lengths), kind="stable")
  return [order[i:i + FLAGS.batch_size] for i in range(0, len(order), FLAGS.batch_size)]


def ours(variant):
  task, quantize = variant.split("/")
  from bert_tf2 import litert  # pylint: disable=g-import-not-at-top
  from bert_tf2 import run_classifier  # pylint: disable=g-import-not-at-top
  from bert_tf2 import tokenization  # pylint: disable=g-import-not-at-top
  examples, labels, seq = _dev(task)
  model = litert.Model(_paths(task)[quantize])
  gold = np.array([labels.index(e.label) for e in examples])
  probabilities = []

  def run():
    probabilities.clear()
    tokenizer = tokenization.FullTokenizer(model.vocab_file, model.info["do_lower_case"])
    features = run_classifier.convert_examples_to_features(examples, labels, seq, tokenizer)
    out = np.zeros((len(features), len(labels)), np.float32)
    for rows in _batches([sum(f.input_mask) for f in features]):
      length = max(sum(features[i].input_mask) for i in rows)
      arrays = [np.array([getattr(features[i], name)[:length] for i in rows], np.int32)
                for name in ("input_ids", "input_mask", "segment_ids")]
      logits = model(*arrays)["logits"]
      e = np.exp(logits - logits.max(-1, keepdims=True))
      out[rows] = e / e.sum(-1, keepdims=True)
    probabilities.append(out)

  timing = common.timed(run)
  per_s, best_per_s = common.rate(len(examples), timing)
  accuracy = float(np.mean(probabilities[0].argmax(-1) == gold))
  return {"per_s": per_s, "best_per_s": best_per_s, "timing": timing, "accuracy": accuracy,
          "examples": len(examples), "model_mb": round(os.path.getsize(
              os.path.join(_paths(task)[quantize], litert.MODEL_FILE)) / 1e6, 1)}


def peer(variant):
  task, precision = variant.split("/")
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  examples, labels, seq = _dev(task)
  paths = _paths(task)
  model = transformers.BertForSequenceClassification.from_pretrained(
      paths["hf"], num_labels=len(labels))
  # The classifier layer (convert_checkpoint carries the encoder and pooler only).
  reader = tf.train.load_checkpoint(paths["model"])
  suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
  with torch.no_grad():
    model.classifier.weight.copy_(torch.from_numpy(
        reader.get_tensor("model/output_layer/output_weights" + suffix)))
    model.classifier.bias.copy_(torch.from_numpy(
        reader.get_tensor("model/output_layer/output_bias" + suffix)))
  model.eval()
  if precision == "int8":
    model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
  tokenizer = transformers.BertTokenizerFast(os.path.join(paths["hf"], "vocab.txt"),
                                             do_lower_case=True)
  gold = np.array([labels.index(e.label) for e in examples])
  probabilities = []

  def run():
    probabilities.clear()
    pairs = examples[0].text_b is not None
    encoded = tokenizer([e.text_a for e in examples],
                        [e.text_b for e in examples] if pairs else None,
                        truncation=True, max_length=seq)
    out = np.zeros((len(examples), len(labels)), np.float32)
    with torch.inference_mode():
      for rows in _batches([len(ids) for ids in encoded["input_ids"]]):
        batch = tokenizer.pad({k: [encoded[k][i] for i in rows] for k in encoded},
                              return_tensors="pt")
        out[rows] = torch.softmax(model(**batch).logits, -1).numpy()
    probabilities.append(out)

  timing = common.timed(run)
  per_s, best_per_s = common.rate(len(examples), timing)
  accuracy = float(np.mean(probabilities[0].argmax(-1) == gold))
  return {"per_s": per_s, "best_per_s": best_per_s, "timing": timing, "accuracy": accuracy,
          "threads": torch.get_num_threads(),
          "cpu_capability": torch.backends.cpu.get_cpu_capability(),
          "quantized_engine": torch.backends.quantized.engine}


def main(_):
  if common.dispatch({"ours": ours, "peer": peer}):
    return
  peer_missing = common.missing(("torch", "transformers"))
  figures, details = [], {}
  for task in FLAGS.tasks:
    if task not in _TASKS:
      raise SystemExit(f"--tasks: {task} is not one of {', '.join(_TASKS)}")
    accuracy = _prepare(task)
    if not FLAGS.measure:
      print(json.dumps({"task": task, "accuracy": accuracy}), flush=True)
      continue
    children = [("ours", f"{task}/{q}") for q in FLAGS.variants] + (
        [] if peer_missing else [("peer", f"{task}/{p}") for p in FLAGS.peer_variants])
    results = common.run_rounds(children)
    ours_results = {q: results[("ours", f"{task}/{q}")] for q in FLAGS.variants}
    peer_results = ({} if peer_missing else
                    {p: results[("peer", f"{task}/{p}")] for p in FLAGS.peer_variants})
    details[task] = {"accuracy": accuracy, "ours": ours_results, "peer": peer_results}
    int8 = {"int8": ours_results.get("int8", {})}
    figures.append(common.figure(f"{task} int8 vs HF int8", "examples/s", int8,
                                 {"int8": peer_results.get("int8", {})}, "per_s", 1.5))
    figures.append(common.figure(f"{task} int8 vs HF fp32", "examples/s", int8,
                                 {"fp32": peer_results.get("fp32", {})}, "per_s", 2.0))
    drop = accuracy["tf_float32"] - accuracy["litert_int8"]
    figures.append({"name": f"{task} dev accuracy, int8 LiteRT vs float32 (points lost)",
                    "unit": "points", "ours": round(100 * drop, 2), "target": "<= 1",
                    "float32": accuracy["tf_float32"], "int8": accuracy["litert_int8"],
                    "hf_int8": peer_results.get("int8", {}).get("accuracy")})
  if not figures:
    return
  ratios = [f["ratio"] for f in figures if f.get("ratio")]
  common.emit("int8_inference", figures,
              {"batch_size": FLAGS.batch_size, "tasks": FLAGS.tasks,
               "sst2_epochs": FLAGS.sst2_epochs, "mrpc_epochs": FLAGS.mrpc_epochs,
               "rounds": FLAGS.rounds, "repeats": FLAGS.repeats,
               "geomean_ratio": round(float(np.exp(np.mean(np.log(ratios)))), 3)
               if ratios else None},
              details, peer_name="HF transformers BertForSequenceClassification on torch "
              "(fp32, quantize_dynamic qint8)",
              peer_missing=common.peer_missing_note(("torch", "transformers"))
              if peer_missing else None)


if __name__ == "__main__":
  app.run(main)
