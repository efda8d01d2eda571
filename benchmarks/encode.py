"""BERT encode throughput (forward only: the work of extract_features and of predict), seq/s.

Ours goes through training.Trainer.predict, the path of run_classifier / run_squad prediction: a
tf.data dataset of --steps batches per timed call, every batch's sequence output fetched to numpy.
Variants: fp32 and bf16 compute dtype, each with and without XLA. The peer is HuggingFace's
BertModel under torch.inference_mode, fp32 and bf16 autocast, its last_hidden_state taken to numpy
too. The same random inputs, every position real. Issue #6 target: ours best >= 1.3x the peer's.

--interleave_pairs=N runs both sides in this one process instead, one timed call of each in
turn (the order alternating), the first of --variants against the first of --peer_variants; the
figure is the geometric mean of the N per-pair ratios, with their median and standard error
(common.run_interleaved says why).

  python benchmarks/encode.py                 # BERT-base, batch 8, seq 128
  python benchmarks/encode.py --layers=2 --hidden_size=128 --num_heads=2 --intermediate_size=512 \
      --vocab_size=1000 --steps=2 --repeats=1 --matmul_size=256      # smoke test
  python benchmarks/encode.py --variants=bf16 --peer_variants=bf16 --interleave_pairs=20
"""

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS

common.define_model_flags()
common.define_interleave_flag()
flags.DEFINE_integer("batch_size", 8, "Sequences per batch.")
flags.DEFINE_integer("seq_length", 128, "Tokens per sequence.")
flags.DEFINE_integer("steps", 10, "Batches per timed call.")

_NUM_BATCHES = 4
_FEATURES = ("input_ids", "input_mask", "segment_ids")


def _batches():
  return common.synthetic_batches(_NUM_BATCHES, FLAGS.batch_size, FLAGS.seq_length,
                                  FLAGS.vocab_size)


def ours(variant, call=False):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import training  # pylint: disable=g-import-not-at-top

  precision, use_xla = common.parse_variant(variant)

  tf.random.set_seed(0)
  strategy = tf.distribute.get_strategy()
  with strategy.scope():
    model = common.bert_encoder(precision)
  trainer = training.Trainer(strategy, model, loss_fn=None, use_xla=use_xla)
  features = {k: v for k, v in _batches().items() if k in _FEATURES}
  shapes = []

  def run():
    shapes.clear()
    batches = trainer.predict(
        lambda ctx: tf.data.Dataset.from_tensor_slices(features).repeat().take(FLAGS.steps),
        ["sequence_output"])
    shapes.extend(np.shape(batch["sequence_output"]) for batch in batches)
    assert len(shapes) == FLAGS.steps, shapes

  return _result(run, lambda: {"output_shape": list(shapes[0]), **common.tensorflow_facts(tf)},
                 call)


def peer(variant, call=False):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  precision, _ = common.parse_variant(variant)
  torch.manual_seed(0)
  device = common.torch_device()
  model = transformers.BertModel(common.hf_config(transformers)).to(device)
  model.eval()
  data = _batches()
  batches = [common.torch_inputs(data, i, device) for i in range(_NUM_BATCHES)]
  autocast = common.torch_autocast(precision, device)
  shapes = []

  def run():
    shapes.clear()
    with torch.inference_mode(), autocast():
      for i in range(FLAGS.steps):
        output = model(**batches[i % _NUM_BATCHES]).last_hidden_state
        shapes.append(output.float().cpu().numpy().shape)  # to the host: waits for the GPU

  return _result(run, lambda: {"output_shape": list(shapes[0]),
                               **common.torch_facts(model, torch, transformers)}, call)


def _result(run, facts, call):
  """(run, facts) for --interleave_pairs; else `run` timed, as run_model_benchmark takes it."""
  if call:
    return run, facts
  timing = common.timed(run)
  per_s, best_per_s = common.rate(FLAGS.steps * FLAGS.batch_size, timing)
  return {"per_s": per_s, "best_per_s": best_per_s, "timing": timing, **facts()}


def main(argv):
  del argv
  settings = {**common.model_dims(), "batch_size": FLAGS.batch_size,
              "seq_length": FLAGS.seq_length, "batches_per_timed_call": FLAGS.steps,
              "path": "ours: training.Trainer.predict, sequence_output to numpy; peer: "
                      "BertModel under torch.inference_mode, last_hidden_state to numpy"}
  if FLAGS.interleave_pairs > 0:
    common.run_interleaved("encode", "encode", lambda v: ours(v, call=True),
                           lambda v: peer(v, call=True), FLAGS.steps * FLAGS.batch_size, 1.3,
                           settings, "HF transformers BertModel (torch)")
    return
  flops = common.bert_flops_per_sequence(common.model_dims(), FLAGS.seq_length, training=False)
  common.run_model_benchmark(
      "encode", [{"name": "encode", "prefix": "", "flops": flops, "target_ratio": 1.3}],
      {"ours": ours, "peer": peer}, settings=settings,
      peer_name="HF transformers BertModel (torch)", peer_modules=["torch", "transformers"])


if __name__ == "__main__":
  app.run(main)
