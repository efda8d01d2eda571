"""Training memory: gradient checkpointing, ours (--gradient_checkpointing) against HF's
(`model.gradient_checkpointing_enable()`), BERT-base classifier steps at seq 512.

Each run (ours / HF, plain / checkpointed, at --small_batch_size and --batch_size sequences of
--seq_length real tokens) is a child process of this script, so each has its own peak memory
(VmHWM, the kernel's high-water mark of resident memory): it builds the classifier and its AdamW
optimizer and takes --warmup + --repeats training steps. The activation memory per sequence is
(peak at --batch_size - peak at --small_batch_size) / the difference in sequences: the weights,
gradients, optimizer state, runtime and traced graphs are the same in both and cancel, leaving
what a step's activations (and the recomputation's) hold. An allocator that keeps freed memory
would hide nothing here: the peak is taken either way. Step time: the median of the --repeats
timed steps at --batch_size.

Ours is training.Trainer's compiled step over modeling.BertClassifier with
`Trainer(gradient_checkpointing=True)` as run_classifier.py --gradient_checkpointing sets it (each
Transformer layer recomputed in the backward pass by modeling._recomputed, the forward pass
inlined in the step), one dataset iterator for the whole run as the Trainer has; HF is
BertForSequenceClassification with torch.optim.AdamW, both with dropout 0.1 and global-norm
clipping to 1.0, fp32 or bf16 (--precision; ours bf16 compute dtype, HF bf16 autocast).

Targets (issue #34): ours checkpointed >= 2.5x less activation memory than ours plain, at <= 35%
more step time, and our checkpointed peak <= HF's checkpointed peak.

  python benchmarks/gradient_checkpointing.py                    # BERT-base, batch 6, seq 512
  python benchmarks/gradient_checkpointing.py --layers=2 --hidden_size=128 --num_heads=2 \\
      --intermediate_size=512 --seq_length=128 --repeats=1       # smoke test
"""

import time

from absl import app
from absl import flags
import numpy as np

import common

FLAGS = flags.FLAGS

common.define_model_flags()
flags.DEFINE_integer("batch_size", 6, "Sequences per step (the timed runs).")
flags.DEFINE_integer("small_batch_size", 2, "The smaller batch of the memory difference.")
flags.DEFINE_integer("seq_length", 512, "Tokens per sequence (all real).")
flags.DEFINE_enum("precision", "fp32", ["fp32", "bf16"], "Both sides' precision.")

_RUNS = ("plain", "checkpointed")


def _memory_kb(field):
  with open("/proc/self/status", encoding="utf-8") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise OSError(f"no {field} in /proc/self/status")


def _batch(batch, seq):
  rng = np.random.default_rng(0)
  return {"input_ids": rng.integers(1000, FLAGS.vocab_size, (batch, seq)).astype(np.int32),
          "input_mask": np.ones((batch, seq), np.int32),
          "segment_ids": np.zeros((batch, seq), np.int32),
          "label_ids": rng.integers(0, 2, (batch,)).astype(np.int32),
          "is_real_example": np.ones((batch,), np.int32)}


def _measure(step, batch):
  """Peak memory (MB) and step times of `step(batch)`."""
  times = []
  for i in range(FLAGS.warmup + FLAGS.repeats):
    start = time.perf_counter()
    step(batch)
    if i >= FLAGS.warmup:
      times.append(time.perf_counter() - start)
  return {"peak_mb": round(_memory_kb("VmHWM") / 1024, 1),
          "step_s": round(float(np.median(times)), 3), "times_s": [round(t, 3) for t in times]}


def _run_and_batch(variant):
  run, _, size = variant.partition(":")
  return run, int(size)


def _ours(variant):
  run, batch_size = _run_and_batch(variant)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  from bert_tf2 import optimization  # pylint: disable=g-import-not-at-top
  from bert_tf2 import training  # pylint: disable=g-import-not-at-top
  tf.random.set_seed(0)
  dtype = common.compute_dtype(FLAGS.precision)
  model = modeling.BertClassifier(modeling.BertConfig(**common.model_dims()), 2, dtype)
  optimizer = optimization.create_optimizer(2e-5, num_train_steps=1000, num_warmup_steps=100)
  trainer = training.Trainer(tf.distribute.get_strategy(), model,
                             modeling.classifier_losses(False), optimizer,
                             gradient_checkpointing=run == "checkpointed")

  batch = _batch(batch_size, FLAGS.seq_length)
  # One iterator for the whole run, as the Trainer's training loop has: an iterator made and
  # dropped in each timed call measured its teardown too, which now and then waited ~8 s (the
  # checkpointed steps alternated 12.3 / 20.5 s in one run; the step itself was 12.3 s each time).
  iterator = iter(trainer.distribute(lambda ctx: tf.data.Dataset.from_tensors(batch).repeat()))

  def step(unused_batch):
    stats = trainer._train_loop(iterator, tf.constant(1))  # pylint: disable=protected-access
    training.metrics_from_stats(stats)  # waits for the step

  return {**_measure(step, batch), "tensorflow": tf.__version__}


def _hf(variant):
  run, batch_size = _run_and_batch(variant)
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  model = transformers.BertForSequenceClassification(common.hf_config(transformers,
                                                                      num_labels=2))
  if run == "checkpointed":
    model.gradient_checkpointing_enable()
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
  autocast = common.torch_autocast(FLAGS.precision)

  def step(batch):
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["input_mask"],
              "token_type_ids": batch["segment_ids"], "labels": batch["label_ids"]}
    with autocast():
      loss = model(**{k: torch.as_tensor(v).long() for k, v in inputs.items()}).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

  return {**_measure(step, _batch(batch_size, FLAGS.seq_length)),
          **common.torch_facts(model, torch, transformers)}


def main(argv):
  del argv
  if common.dispatch({"ours": _ours, "peer": _hf}):
    return
  peer_missing = common.peer_missing_note(["torch", "transformers"])
  sizes = (FLAGS.small_batch_size, FLAGS.batch_size)
  runs = {}
  for side in ("ours",) + (() if peer_missing or not FLAGS.peer else ("peer",)):
    for run in _RUNS:
      small, large = (common.run_child(side, f"{run}:{size}") for size in sizes)
      result = {**large, "peak_mb_small_batch": small.get("peak_mb")}
      if large.get("peak_mb") and small.get("peak_mb"):
        result["activation_mb_per_sequence"] = round(
            (large["peak_mb"] - small["peak_mb"]) / (sizes[1] - sizes[0]), 1)
        result["activation_mb"] = round(result["activation_mb_per_sequence"] * sizes[1], 1)
      runs[(side, run)] = result
  results = runs
  get = lambda side, run, key: results.get((side, run), {}).get(key)
  ratio = lambda a, b: round(a / b, 3) if a and b else None
  saving = ratio(get("ours", "plain", "activation_mb"), get("ours", "checkpointed",
                                                              "activation_mb"))
  slower = ratio(get("ours", "checkpointed", "step_s"), get("ours", "plain", "step_s"))
  figures = [
      {"name": "activation memory, ours plain / ours checkpointed (x less)", "unit": "x",
       "ours": saving, "ours_variant": "checkpointed", "peer": ratio(
           get("peer", "plain", "activation_mb"), get("peer", "checkpointed", "activation_mb")),
       "peer_variant": "checkpointed", "ratio": None, "target_ratio": 2.5},
      {"name": "step time, checkpointed / plain", "unit": "x", "ours": slower,
       "ours_variant": "checkpointed", "peer": ratio(get("peer", "checkpointed", "step_s"),
                                                     get("peer", "plain", "step_s")),
       "peer_variant": "checkpointed", "ratio": None, "target_ratio": 1.35},
      {"name": "peak memory with checkpointing (MB; ratio: HF's / ours)", "unit": "MB",
       "ours": get("ours", "checkpointed", "peak_mb"), "ours_variant": "checkpointed",
       "peer": get("peer", "checkpointed", "peak_mb"), "peer_variant": "checkpointed",
       "ratio": ratio(get("peer", "checkpointed", "peak_mb"),
                      get("ours", "checkpointed", "peak_mb")), "target_ratio": 1.0},
      {"name": "step time with checkpointing (s; ratio: HF's / ours)", "unit": "s",
       "ours": get("ours", "checkpointed", "step_s"), "ours_variant": "checkpointed",
       "peer": get("peer", "checkpointed", "step_s"), "peer_variant": "checkpointed",
       "ratio": ratio(get("peer", "checkpointed", "step_s"),
                      get("ours", "checkpointed", "step_s")), "target_ratio": None},
  ]
  common.emit("gradient_checkpointing", figures,
              settings={"batch_size": FLAGS.batch_size,
                        "small_batch_size": FLAGS.small_batch_size, "seq_length": FLAGS.seq_length,
                        "precision": FLAGS.precision, "model": common.model_dims(),
                        "warmup": FLAGS.warmup, "repeats": FLAGS.repeats},
              details={f"{side}_{run}": r for (side, run), r in results.items()},
              peer_name="HF transformers BertForSequenceClassification + "
                        "gradient_checkpointing_enable()", peer_missing=peer_missing)


if __name__ == "__main__":
  app.run(main)
