"""Where the time of a BERT pre-training step (or, with --encode, of a forward pass) goes: ours
(TensorFlow profiler) and HF's (torch.profiler), op by op, on this machine. Not a speed figure:
profiling slows both sides.

--classifier profiles finetuning.py's classifier step instead (modeling.BertClassifier with 2
labels and classifier_losses in the Trainer; the peer's BertForSequenceClassification, AdamW, clip
1.0): pass its shape, e.g. --batch_size=32 --seq_length=128.

--encode profiles encode.py's work instead: ours `training.Trainer.predict` of a BertModel over
--steps_per_loop batches (the sequence output fetched to numpy), the peer's BertModel under
torch.inference_mode (and bf16 autocast), the same number of batches.

Ours runs the step pretraining_step.py times (common.ours_training_rate's Trainer, one
`_train_loop` call of --steps_per_loop steps) under tf.profiler; the trace's leaf events are summed
by op name on TensorFlow's compute and Eigen threads (an XLA-compiled part shows as its fusions;
the executor's and thread pools' wrapping events are left out), as a share of all that time. The peer's step (BertForPreTraining, AdamW,
bf16 autocast) runs under torch.profiler, its ops summed by self CPU time. Prints a table per side
on stderr and one JSON line: {"ours": [[op, ms, share], ...], "ours_wall": {...}, "peer": [...],
"machine": ...}.

Op time summed over threads counts work that runs beside a matmul as much as work that holds
the step up. "ours_wall" splits the profiled call's wall time into the time a matmul ran, the time
only other ops ran and idle time, and shares the "other ops only" time out among those ops: what
a cut outside the matmuls can save (benchmarks/log/2026-11-30.md, a second session).

  python benchmarks/profile_ops.py                        # BERT-base, batch 8, seq 128, bf16
  python benchmarks/profile_ops.py --precision=fp32 --nopeer --top=40   # --peer: common's flag
  python benchmarks/profile_ops.py --encode --nopeer       # the forward pass, batch 8, seq 128
  python benchmarks/profile_ops.py --classifier --batch_size=32 --precision=fp32   # fine-tuning
"""

import collections
import glob
import json
import sys
import tempfile

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS

common.define_model_flags()
common.define_pretraining_batch_flags()
flags.DEFINE_integer("steps_per_loop", 5, "Optimizer steps profiled.")
flags.DEFINE_enum("precision", "bf16", ["fp32", "bf16"], "Compute dtype of both sides.")
flags.DEFINE_integer("top", 25, "Ops listed per side.")
flags.DEFINE_bool("classifier", False, "Profile the classifier fine-tuning step (finetuning.py's "
                  "work), not the pre-training step.")
flags.DEFINE_bool("encode", False, "Profile the forward pass (encode.py's work), not a training "
                  "step; --steps_per_loop is then the number of batches.")

_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
             "masked_lm_weights", "next_sentence_labels")
_CLASSIFIER_FEATURES = ("input_ids", "input_mask", "segment_ids", "label_ids", "is_real_example")
# Events that wrap others (the executor, thread pools, an XLA call) rather than do work.
# ThunkExecutor::Execute holds the fusions of the XLA call it runs on its own thread (checked in a
# trace, 2026-11-29: its children covered 99.4% of it); it was counted beside them until then.
_WRAPPERS = {"ThreadpoolListener::Region", "ExecutorState::Process", "ParallelFor",
             "ExecutorState::ProcessAsync::Start", "BlockUntilReady", "_train_loop",
             "CpuExecutable::ExecuteAsyncOnStream", "ThunkExecutor::Execute"}
# The matrix products (oneDNN's and TensorFlow's own), for the wall-time split (_wall).
_MATMULS = {"_MklMatMul", "_MklNativeFusedMatMul", "_MklFusedMatMul", "_MklBatchMatMulV2",
            "_MklNativeFusedBatchMatMulV2", "MatMul", "BatchMatMulV2", "BatchMatMulV3"}


def _batches():
  return common.synthetic_batches(4, FLAGS.batch_size, FLAGS.seq_length, FLAGS.vocab_size,
                                  FLAGS.max_predictions)


def _table(times):
  total = sum(times.values())
  return [[name, round(t / 1e3, 1), round(t / total, 4)]
          for name, t in times.most_common(FLAGS.top)]


def ours():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.profiler.internal import _pywrap_profiler_plugin  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  from bert_tf2 import optimization  # pylint: disable=g-import-not-at-top
  from bert_tf2 import training  # pylint: disable=g-import-not-at-top

  features = {k: v for k, v in _batches().items()
              if k in (_CLASSIFIER_FEATURES if FLAGS.classifier else _FEATURES)}
  strategy = tf.distribute.get_strategy()
  config = modeling.BertConfig(**common.model_dims())
  if FLAGS.encode:
    trainer = training.Trainer(strategy, common.bert_encoder(FLAGS.precision), loss_fn=None)

    def run():
      dataset = tf.data.Dataset.from_tensor_slices(features).repeat().take(FLAGS.steps_per_loop)
      for batch in trainer.predict(lambda ctx: dataset, ["sequence_output"]):
        assert batch["sequence_output"].shape[-1] == config.hidden_size
  else:
    dtype = common.compute_dtype(FLAGS.precision)
    if FLAGS.classifier:
      model = modeling.BertClassifier(config, 2, dtype)
      loss_fn = modeling.classifier_losses(is_regression=False)
    else:
      model, loss_fn = modeling.BertPretrainer(config, dtype), modeling.pretraining_losses
    optimizer = optimization.create_optimizer(1e-4, num_train_steps=100000,
                                              num_warmup_steps=10000)
    trainer = training.Trainer(strategy, model, loss_fn, optimizer)
    iterator = iter(trainer.distribute(
        lambda ctx: tf.data.Dataset.from_tensor_slices(features).repeat()))
    steps = tf.constant(FLAGS.steps_per_loop)

    def run():
      training.metrics_from_stats(trainer._train_loop(iterator, steps))  # pylint: disable=protected-access
  for _ in range(2):  # compile, then warm up
    run()
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    run()
    tf.profiler.experimental.stop()
    path = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0]
    data, _ = _pywrap_profiler_plugin.xspace_to_tools_data([path], "trace_viewer@", {})
  events = json.loads(data)["traceEvents"]
  threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
  def compute_thread(e):
    # TensorFlow's compute and Eigen threads: not the Python thread's call into the step.
    thread = threads.get((e.get("pid"), e.get("tid")), "")
    return thread.startswith("tf_") and not thread.startswith("tf_data")

  ops = [e for e in events
         if e.get("ph") == "X" and e["name"] not in _WRAPPERS and compute_thread(e)]
  times = collections.Counter()
  for e in ops:
    times[e["name"]] += e["dur"]
  return _table(times), _wall(ops)


def _wall(ops):
  """Where the profiled call's wall time went: the time when a matmul ran (alone or beside other
  ops), when only other ops ran, and when none did; and the time of other ops alone, shared out
  among the ops running at each moment (a compiled function's fusions named by the function).
  Op time summed over threads counts work that overlaps a matmul; this counts what lengthens
  the step."""
  points = []
  for e in ops:
    name = e["name"]
    module = e.get("args", {}).get("hlo_module", "")
    if module:  # e.g. a_inference__update_and_copy_13553__.1 -> _update_and_copy: fusion
      name = f"{module.split('_inference_')[-1].rsplit('_', 3)[0]}: {name}"
    matmul = e["name"] in _MATMULS
    points += [(e["ts"], 1, matmul, name), (e["ts"] + e["dur"], -1, matmul, name)]
  points.sort(key=lambda p: (p[0], p[1]))
  spans = collections.Counter()
  alone = collections.Counter()
  running = collections.Counter()
  matmuls, last = 0, None
  for t, change, matmul, name in points:
    if last is not None and t > last:
      others = sum(running.values())
      spans["matmul" if matmuls else "other ops only" if others else "idle"] += t - last
      if not matmuls:
        for op, count in running.items():
          alone[op] += (t - last) * count / others
    if matmul:
      matmuls += change
    else:
      running[name] += change
      if not running[name]:
        del running[name]
    last = t
  total = sum(spans.values())
  return {"wall_ms": round(total / 1e3, 1),
          "shares": {k: round(v / total, 4) for k, v in spans.items()},
          "other_ops_alone": _table(alone)}


def peer():
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  data = _batches()
  autocast = common.torch_autocast(FLAGS.precision)
  if FLAGS.encode:
    encoder = transformers.BertModel(common.hf_config(transformers))
    encoder.eval()
    batches = [common.torch_inputs(data, i) for i in range(len(data["input_ids"]))]

    def forward():
      with torch.inference_mode(), autocast():
        for i in range(FLAGS.steps_per_loop):
          encoder(**batches[i % len(batches)]).last_hidden_state.float().numpy()

    return _torch_profile(torch, forward, 1)
  if FLAGS.classifier:
    model = transformers.BertForSequenceClassification(common.hf_config(transformers,
                                                                        num_labels=2))
    inputs = common.torch_inputs(data, 0, labels=data["label_ids"][0])
  else:
    model = transformers.BertForPreTraining(common.hf_config(transformers))
    labels = np.full((FLAGS.batch_size, FLAGS.seq_length), -100, np.int64)
    np.put_along_axis(labels, data["masked_lm_positions"][0], data["masked_lm_ids"][0], axis=1)
    inputs = common.torch_inputs(data, 0, labels=labels,
                                 next_sentence_label=data["next_sentence_labels"][0, :, 0])
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

  def step():
    with autocast():
      loss = model(**inputs).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()

  return _torch_profile(torch, step, FLAGS.steps_per_loop)


def _torch_profile(torch, call, calls):
  """torch.profiler's self CPU time by op of `calls` calls of `call`, after two untimed ones."""
  for _ in range(2):
    call()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
    for _ in range(calls):
      call()
  times = collections.Counter()
  for event in profile.key_averages():
    times[event.key] += event.self_cpu_time_total
  return _table(times)


def main(argv):
  del argv
  if FLAGS.classifier and FLAGS.encode:
    raise app.UsageError("--classifier and --encode: choose one")
  ours_ops, ours_wall = ours()
  result = {"ours": ours_ops, "ours_wall": ours_wall}
  if FLAGS.peer and not common.missing(["torch", "transformers"]):
    result["peer"] = peer()
  for side, rows in [(k, result[k]) for k in ("ours", "peer") if k in result]:
    unit = "batches" if FLAGS.encode else "steps"
    print(f"--- {side}: op, ms over {FLAGS.steps_per_loop} {unit}, share of op time",
          file=sys.stderr)
    for name, ms, share in rows:
      print(f"  {name[:60]:60s} {ms:9.1f} {100 * share:5.1f}%", file=sys.stderr)
  wall = result["ours_wall"]
  print(f"--- ours: wall time of the profiled call, {wall['wall_ms']} ms: " + ", ".join(
      f"{k} {100 * v:.1f}%" for k, v in wall["shares"].items()), file=sys.stderr)
  print("--- ours: the other ops alone (no matmul running), ms, share of that time",
        file=sys.stderr)
  for name, ms, share in wall["other_ops_alone"]:
    print(f"  {name[:60]:60s} {ms:9.1f} {100 * share:5.1f}%", file=sys.stderr)
  result.update(settings={"batch_size": FLAGS.batch_size, "seq_length": FLAGS.seq_length,
                          "precision": FLAGS.precision, "steps": FLAGS.steps_per_loop,
                          "profiled": ("forward pass" if FLAGS.encode else "classifier step"
                                       if FLAGS.classifier else "pre-training step"),
                          **common.model_dims()},
                machine=common.machine(), versions=common.versions())
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  app.run(main)
