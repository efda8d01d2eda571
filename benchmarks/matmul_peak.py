"""Matrix multiply peak of this machine in GFLOP/s: TensorFlow fp32 / bf16 (ours) against numpy
fp32 and torch fp32 / bf16 (the issue's reference figures: numpy fp32 237, torch bf16 766).

The bf16 peak is the yardstick of model FLOPs utilisation in pretraining_step.py, encode.py and
finetuning.py, which call the two measuring functions here in their own child processes.

  python benchmarks/matmul_peak.py [--matmul_size=4096 --repeats=3]
"""

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS


def _gflops(timing):
  n = FLAGS.matmul_size
  return round(2 * n ** 3 / timing["median_s"] / 1e9, 1)


def tf_peaks(variant=None):
  """TensorFlow matmul GFLOP/s, fp32 and bf16 (oneDNN on CPU)."""
  del variant
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  n = FLAGS.matmul_size
  common.compute_dtype("fp32")  # fp32 is float32 on a GPU too (TF32 off), as torch's

  # The inputs are arguments, not captured constants, so nothing can be folded at trace time;
  # the sum makes the call wait for the whole product at the cost of n^2 additions.
  @tf.function
  def multiply(a, b):
    return tf.reduce_sum(tf.cast(tf.matmul(a, b), tf.float32))

  def rate(dtype):
    a = tf.cast(tf.random.normal([n, n], seed=1), dtype)
    b = tf.cast(tf.random.normal([n, n], seed=2), dtype)
    return _gflops(common.timed(lambda: multiply(a, b).numpy()))

  return {"tf_fp32": rate(tf.float32), "tf_bf16": rate(tf.bfloat16), **common.tensorflow_facts(tf)}


def peer_peaks(variant=None):
  """numpy fp32 (its BLAS) and, when installed, torch fp32 / bf16 GFLOP/s."""
  del variant
  import numpy as np  # pylint: disable=g-import-not-at-top
  n = FLAGS.matmul_size
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
  c = np.empty((n, n), np.float32)
  out = {"numpy_fp32": _gflops(common.timed(lambda: np.matmul(a, b, out=c)))}
  if not common.missing(["torch"]):
    import torch  # pylint: disable=g-import-not-at-top
    device = common.torch_device()

    def rate(dtype):
      ta, tb = (torch.from_numpy(x).to(device=device, dtype=dtype) for x in (a, b))
      return _gflops(common.timed(lambda: (torch.matmul(ta, tb), common.torch_sync())))

    out.update(torch_fp32=rate(torch.float32), torch_bf16=rate(torch.bfloat16),
               torch_threads=torch.get_num_threads(), torch_device=device)
  return out


def main(argv):
  del argv
  if common.dispatch({"ours": tf_peaks, "peer": peer_peaks}):
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
