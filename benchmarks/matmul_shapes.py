"""bf16 matmul on the shapes a BERT training step runs: TensorFlow against torch, interleaved.

matmul_peak.py measures one 4096^3 product, each library in its own child process. This one
measures the GEMMs of one encoder layer of BERT-base (or --hidden_size / --intermediate_size) at
--batch_size x --seq_length tokens, forward and backward:

  forward   x[T,H] . W[H,N]            for W in the four H x H projections, H x I and I x H
  backward  dY[T,N] . W^T  (dX)        and  x^T . dY  (dW, the T-long reduction)

Both libraries run in ONE process, one call of each in turn, and the figure is the median of the
per-pair ratios (torch's time / ours for the same shape, measured back to back). On a shared
virtual machine the cores' speed drifts by 2x within seconds (seen on a 2-core AMX VM,
2026-11-28), which swamps a figure taken in separate processes minutes apart; a pair of calls a few
milliseconds apart sees the same machine. torch's OpenMP threads are set to sleep when idle
(OMP_WAIT_POLICY=PASSIVE, set before torch loads) so that they never spin against
TensorFlow's threads.

Ours runs --chain products in one tf.function, each made to wait for the one before (as in a
model, where one layer's matmul waits for the last), so that TensorFlow neither overlaps them nor
pays its call overhead per product; torch runs the same products from Python, as in HF's model.

The head figure weights each shape by its FLOPs in a layer (the four H x H projections count four
times): the matmul time of a whole layer's training step, torch's over ours.

  python benchmarks/matmul_shapes.py [--batch_size=8 --seq_length=128 --pairs=30 --chain=6]
"""

import os
import statistics
import time

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS
common.define_pretraining_batch_flags()
flags.DEFINE_integer("hidden_size", 768, "H.")
flags.DEFINE_integer("intermediate_size", 3072, "I, the feed-forward width.")
flags.DEFINE_integer("pairs", 30, "Timed pairs (one call of each library) per shape.")
flags.DEFINE_integer("chain", 6, "Products per timed call.")


def gemms(tokens, hidden, intermediate):
  """(name, m, k, n, transpose_a, transpose_b, count per layer) of one layer's training step."""
  shapes = []
  for name, k, n, count in (("qkvo", hidden, hidden, 4), ("ffn_up", hidden, intermediate, 1),
                            ("ffn_down", intermediate, hidden, 1)):
    shapes += [(f"{name} forward", tokens, k, n, False, False, count),
               (f"{name} dX", tokens, n, k, False, True, count),
               (f"{name} dW", k, tokens, n, True, False, count)]
  return shapes


def main(argv):
  del argv
  if common.missing(["torch"]):
    common.emit("matmul_shapes", [common.figure("bf16 matmul, BERT layer GEMMs", "x", {}, {},
                                                "per_s")],
                settings={}, peer_missing=common.peer_missing_note(["torch"]))
    return
  # Before torch loads its OpenMP runtime (see the module docstring).
  os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  tokens = FLAGS.batch_size * FLAGS.seq_length
  chain = FLAGS.chain
  rows, ours_time, peer_time = [], 0.0, 0.0
  for name, m, k, n, ta, tb, count in gemms(tokens, FLAGS.hidden_size, FLAGS.intermediate_size):
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)
    tf_a = [tf.cast(tf.random.normal(a_shape, seed=i), tf.bfloat16) for i in range(chain)]
    tf_b = tf.cast(tf.random.normal(b_shape, seed=99), tf.bfloat16)

    @tf.function
    def ours(a_list, b, ta=ta, tb=tb):
      last, sums = None, []
      for a in a_list:
        if last is not None:
          with tf.control_dependencies([last]):
            a = tf.identity(a)
        last = tf.matmul(a, b, transpose_a=ta, transpose_b=tb)
        sums.append(tf.reduce_sum(tf.cast(last[:1], tf.float32)))
      return tf.add_n(sums)

    pt_a = [torch.from_numpy(tf.cast(a, tf.float32).numpy()).bfloat16() for a in tf_a]
    pt_b = torch.from_numpy(tf.cast(tf_b, tf.float32).numpy()).bfloat16()

    def peer(pt_a=pt_a, pt_b=pt_b, ta=ta, tb=tb):
      for a in pt_a:
        torch.matmul(a.t() if ta else a, pt_b.t() if tb else pt_b)

    def call_ours(tf_a=tf_a, tf_b=tf_b, ours=ours):
      ours(tf_a, tf_b).numpy()

    for _ in range(3):
      call_ours()
      peer()
    times_ours, times_peer, ratios = [], [], []
    for _ in range(FLAGS.pairs):
      t0 = time.perf_counter()
      call_ours()
      t1 = time.perf_counter()
      peer()
      t2 = time.perf_counter()
      times_ours.append(t1 - t0)
      times_peer.append(t2 - t1)
      ratios.append((t2 - t1) / (t1 - t0))
    gflop = 2 * m * k * n * chain / 1e9
    ratio = statistics.median(ratios)
    rows.append({"gemm": name, "m_k_n": [m, k, n], "per_layer": count,
                 "ours_gflops": round(gflop / statistics.median(times_ours), 1),
                 "peer_gflops": round(gflop / statistics.median(times_peer), 1),
                 "pair_ratio": round(ratio, 3)})
    # The layer's time, in units of this shape's median time on torch: ours takes 1/ratio of it.
    unit = statistics.median(times_peer) / chain * count
    peer_time += unit
    ours_time += unit / ratio
    print(f"[matmul_shapes.py] {name:18s} {m}x{k}x{n}: ours {rows[-1]['ours_gflops']:7.1f} "
          f"torch {rows[-1]['peer_gflops']:7.1f} GFLOP/s, pair ratio {ratio:.2f}", flush=True)

  layer = {"ours": {"ratio": peer_time / ours_time}}
  figures = [common.figure("bf16 matmul, one BERT layer's training GEMMs (torch time / ours)",
                           "x", layer, {"torch": {"ratio": 1.0}}, "ratio", target_ratio=0.9)]
  figures += [common.figure(f"bf16 matmul {row['gemm']} {'x'.join(map(str, row['m_k_n']))}",
                            "x", {"ours": {"ratio": row["pair_ratio"]}},
                            {"torch": {"ratio": 1.0}}, "ratio") for row in rows]
  common.emit("matmul_shapes", figures,
              settings={"batch_size": FLAGS.batch_size, "seq_length": FLAGS.seq_length,
                        "hidden_size": FLAGS.hidden_size,
                        "intermediate_size": FLAGS.intermediate_size, "pairs": FLAGS.pairs,
                        "chain": FLAGS.chain, "figure": "median of per-pair time ratios"},
              details={"gemms": rows, "tensorflow": tf.__version__, "torch": torch.__version__,
                       "torch_threads": torch.get_num_threads()},
              peer_name="torch (bf16 matmul, same process, interleaved)")


if __name__ == "__main__":
  app.run(main)
