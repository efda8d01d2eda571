"""Matrix multiply peak of this machine in GFLOP/s: TensorFlow fp32 / bf16 (ours) against numpy
fp32 and torch fp32 / bf16 (the issue's reference figures: numpy fp32 237, torch bf16 766).

The bf16 peak is the yardstick of model FLOPs utilisation in pretraining_step.py, encode.py and
finetuning.py (and the other model benchmarks with --peak=measure), which run the same two
measuring functions, common.tf_matmul_peaks and common.peer_matmul_peaks, in their own child
processes.

  python benchmarks/matmul_peak.py [--matmul_size=4096 --repeats=3]
"""

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS


def main(argv):
  del argv
  if common.dispatch({"ours": common.tf_matmul_peaks, "peer": common.peer_matmul_peaks}):
    return
  ours = common.run_child("ours")
  peer = common.run_child("peer") if FLAGS.peer else {}
  missing = common.peer_missing_note(["torch"])

  def pick(result, key):
    return {key: {"per_s": result.get(key)}} if result.get(key) else {}

  figures = [
      common.figure("bf16 matmul", "GFLOP/s", pick(ours, "tf_bf16"), pick(peer, "torch_bf16"),
                    "per_s"),
      common.figure("fp32 matmul", "GFLOP/s", pick(ours, "tf_fp32"), pick(peer, "numpy_fp32"),
                    "per_s"),
      common.figure("fp32 matmul, torch", "GFLOP/s", pick(ours, "tf_fp32"),
                    pick(peer, "torch_fp32"), "per_s"),
  ]
  common.emit("matmul_peak", figures,
              settings={"matmul_size": FLAGS.matmul_size, "repeats": FLAGS.repeats,
                        "warmup": FLAGS.warmup, "figure": "median of the timed calls"},
              details={"ours": ours, "peer": peer},
              peer_name="numpy (its BLAS) and torch (on the GPU when there is one)",
              peer_missing=missing)


if __name__ == "__main__":
  app.run(main)
