"""BERT pre-training step throughput (masked LM + next sentence, AdamW update included), seq/s.

Ours goes through the code run_pretraining.py runs: modeling.BertPretrainer and
modeling.pretraining_losses inside training.Trainer with optimization.create_optimizer, fed by a
tf.data dataset through Trainer.distribute, timed one `_train_loop` call (--steps_per_loop steps)
at a time. Variants: fp32 and bf16 compute dtype, each with and without XLA.

The peer is HuggingFace's BertForPreTraining with torch.optim.AdamW (and the same global-norm
clipping to 1.0 as ours), fp32 and bf16 autocast, MLM labels -100 at the unmasked positions. Its
MLM head projects every position onto the vocabulary, ours only the masked ones; the losses are
the same.

Both get the same random inputs (every position real, --max_predictions masked positions per
sequence) and dropout 0.1. Model FLOPs utilisation is against the bf16 matmul peak measured in
the same run (matmul_peak.py), with the FLOPs of common.bert_flops_per_sequence.
Issue #6 target: ours best >= 2.0x the peer's best.

--interleave_pairs=N runs both sides in this one process instead, one timed call of each in
turn (the order alternating), the first of --variants against the first of --peer_variants, and
the figure is the geometric mean of the N per-pair ratios, with their median and standard error
(common.run_interleaved says why).

  python benchmarks/pretraining_step.py      # BERT-base, batch 8, seq 128, 20 predictions
  python benchmarks/pretraining_step.py --variants=bf16 --peer_variants=bf16 \
      --interleave_pairs=12                  # one process, calls taking turns
  python benchmarks/pretraining_step.py --layers=2 --hidden_size=128 --num_heads=2 \
      --intermediate_size=512 --vocab_size=1000 --steps_per_loop=2 --repeats=1 \
      --matmul_size=256                      # smoke test
"""

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS

common.define_model_flags()
common.define_pretraining_batch_flags()
common.define_interleave_flag()
flags.DEFINE_integer("steps_per_loop", 5, "Optimizer steps per timed call.")
flags.DEFINE_enum("peer_adamw", "default", ["default", "foreach", "fused"],
                  "torch.optim.AdamW implementation of the peer (default: what a user gets).")

_NUM_BATCHES = 4  # distinct batches, cycled through
_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
             "masked_lm_weights", "next_sentence_labels")


def _batches():
  return common.synthetic_batches(_NUM_BATCHES, FLAGS.batch_size, FLAGS.seq_length,
                                  FLAGS.vocab_size, FLAGS.max_predictions)


def ours(variant, call=False):
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  features = {k: v for k, v in _batches().items() if k in _FEATURES}
  args = (modeling.BertPretrainer, modeling.pretraining_losses, features, variant,
          FLAGS.steps_per_loop)
  if call:
    return common.ours_training_call(*args)
  return common.ours_training_rate(*args, FLAGS.batch_size)


def peer(variant, call=False):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(common.hf_config(transformers))
  data = _batches()
  batches = []
  for i in range(_NUM_BATCHES):
    # HF's MLM labels: the original token at masked positions, -100 (ignored) elsewhere.
    labels = np.full((FLAGS.batch_size, FLAGS.seq_length), -100, np.int64)
    np.put_along_axis(labels, data["masked_lm_positions"][i], data["masked_lm_ids"][i], axis=1)
    batches.append(common.torch_inputs(
        data, i, common.torch_device(), labels=labels,
        next_sentence_label=data["next_sentence_labels"][i, :, 0]))
  if call:
    return common.peer_training_call(model, batches, variant, FLAGS.steps_per_loop,
                                     FLAGS.peer_adamw)
  return common.peer_training_rate(model, batches, variant, FLAGS.steps_per_loop,
                                   FLAGS.batch_size, FLAGS.peer_adamw)


def _settings():
  return {**common.model_dims(), "batch_size": FLAGS.batch_size,
          "seq_length": FLAGS.seq_length, "max_predictions_per_seq": FLAGS.max_predictions,
          "steps_per_timed_call": FLAGS.steps_per_loop, "dropout": 0.1,
          "optimizer": "ours: AdamW (bias-corrected, the default) + global-norm clip 1.0; peer: "
                       f"torch.optim.AdamW ({FLAGS.peer_adamw}) + clip_grad_norm_ 1.0"}


def main(argv):
  del argv
  if FLAGS.interleave_pairs > 0:
    common.run_interleaved(
        "pretraining_step", "pre-training step", lambda v: ours(v, call=True),
        lambda v: peer(v, call=True), FLAGS.steps_per_loop * FLAGS.batch_size, 2.0, _settings(),
        "HF transformers BertForPreTraining + torch.optim.AdamW (torch)")
    return
  flops = common.bert_flops_per_sequence(common.model_dims(), FLAGS.seq_length, training=True,
                                         masked_positions=FLAGS.max_predictions)
  common.run_model_benchmark(
      "pretraining_step",
      [{"name": "pre-training step", "prefix": "", "flops": flops, "target_ratio": 2.0}],
      {"ours": ours, "peer": peer},
      settings=_settings(),
      peer_name="HF transformers BertForPreTraining + torch.optim.AdamW (torch)",
      peer_modules=["torch", "transformers"])


if __name__ == "__main__":
  app.run(main)
