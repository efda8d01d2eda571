"""Fine-tuning throughput, seq/s: sentence(-pair) classification and SQuAD span labelling.

Ours trains modeling.BertClassifier with modeling.classifier_losses (2 labels, as MRPC) and
modeling.BertSpanLabeler with modeling.squad_losses, each inside training.Trainer with
optimization.create_optimizer, as run_classifier.py / run_squad.py do (see
common.ours_training_rate). The peer trains HuggingFace's BertForSequenceClassification /
BertForQuestionAnswering with torch.optim.AdamW and the same clipping. Variants as in
pretraining_step.py; one figure per task.

  python benchmarks/finetuning.py   # classifier seq 128 batch 32, SQuAD seq 384 batch 8
  python benchmarks/finetuning.py --layers=2 --hidden_size=128 --num_heads=2 \
      --intermediate_size=512 --vocab_size=1000 --classifier_batch_size=4 --squad_batch_size=2 \
      --steps_per_loop=2 --repeats=1 --matmul_size=256           # smoke test
"""

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS

common.define_model_flags()
flags.DEFINE_list("tasks", ["classifier", "squad"], "classifier | squad.")
flags.DEFINE_integer("classifier_batch_size", 32, "Classifier sequences per step.")
flags.DEFINE_integer("classifier_seq_length", 128, "Classifier tokens per sequence.")
flags.DEFINE_integer("squad_batch_size", 8, "SQuAD sequences per step.")
flags.DEFINE_integer("squad_seq_length", 384, "SQuAD tokens per sequence.")
flags.DEFINE_integer("steps_per_loop", 3, "Optimizer steps per timed call.")

_NUM_BATCHES = 4
_NUM_LABELS = 2


def _shape(task):
  return {"classifier": (FLAGS.classifier_batch_size, FLAGS.classifier_seq_length),
          "squad": (FLAGS.squad_batch_size, FLAGS.squad_seq_length)}[task]


def _batches(task):
  batch_size, seq_length = _shape(task)
  return common.synthetic_batches(_NUM_BATCHES, batch_size, seq_length, FLAGS.vocab_size)


def ours(task_variant):
  task, _, variant = task_variant.partition(".")
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  data = _batches(task)
  if task == "classifier":
    make_model = lambda config, dtype: modeling.BertClassifier(config, _NUM_LABELS, dtype)
    loss_fn = modeling.classifier_losses(is_regression=False)
    names = ("label_ids", "is_real_example")
  else:
    make_model = modeling.BertSpanLabeler
    loss_fn = modeling.squad_losses
    names = ("start_positions", "end_positions")
  features = {k: data[k] for k in ("input_ids", "input_mask", "segment_ids") + names}
  return common.ours_training_rate(make_model, loss_fn, features, variant, FLAGS.steps_per_loop,
                                   _shape(task)[0])


def peer(task_variant):
  task, _, variant = task_variant.partition(".")
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  data = _batches(task)
  if task == "classifier":
    model = transformers.BertForSequenceClassification(
        common.hf_config(transformers, num_labels=_NUM_LABELS))
    batches = [common.torch_inputs(data, i, common.torch_device(), labels=data["label_ids"][i])
               for i in range(_NUM_BATCHES)]
  else:
    model = transformers.BertForQuestionAnswering(common.hf_config(transformers))
    batches = [common.torch_inputs(data, i, common.torch_device(),
                                   start_positions=data["start_positions"][i],
                                   end_positions=data["end_positions"][i])
               for i in range(_NUM_BATCHES)]
  return common.peer_training_rate(model, batches, variant, FLAGS.steps_per_loop,
                                   _shape(task)[0])


def main(argv):
  del argv
  dims = common.model_dims()
  groups = []
  for task in FLAGS.tasks:
    batch_size, seq_length = _shape(task)
    if task == "classifier":
      flops = common.bert_flops_per_sequence(dims, seq_length, training=True,
                                             head_outputs=_NUM_LABELS)
    elif task == "squad":
      flops = common.bert_flops_per_sequence(dims, seq_length, training=True, pooler=False,
                                             head_outputs=2 * seq_length)
    else:
      raise ValueError(f"--tasks: unknown task {task!r} (classifier | squad)")
    groups.append({"name": f"{task} fine-tuning, batch {batch_size}, seq {seq_length}",
                   "prefix": f"{task}.", "flops": flops})
  common.run_model_benchmark(
      "finetuning", groups, {"ours": ours, "peer": peer},
      settings={**dims, "tasks": FLAGS.tasks,
                "classifier": {"batch_size": FLAGS.classifier_batch_size,
                               "seq_length": FLAGS.classifier_seq_length,
                               "num_labels": _NUM_LABELS},
                "squad": {"batch_size": FLAGS.squad_batch_size,
                          "seq_length": FLAGS.squad_seq_length},
                "steps_per_timed_call": FLAGS.steps_per_loop, "dropout": 0.1,
                "optimizer": "ours: AdamW (bias-corrected, the default) + global-norm clip 1.0; peer: "
                             "torch.optim.AdamW + clip_grad_norm_ 1.0"},
      peer_name="HF transformers BertForSequenceClassification / BertForQuestionAnswering + "
                "torch.optim.AdamW (torch)",
      peer_modules=["torch", "transformers"])


if __name__ == "__main__":
  app.run(main)
