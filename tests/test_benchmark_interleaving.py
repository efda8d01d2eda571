"""benchmarks/common.interleaved: the two sides' calls taking turns in one process, on a fake
clock whose answer is known (the real benchmark needs torch, which CI does not install)."""

import json

from conftest import run_ok

# A host whose speed drifts between pairs (x1, x3, x0.5, x2) but not within one: ours takes 1
# unit, the peer 2, so every pair's ratio is exactly 2 while each side's times spread 6x.
_CODE = """
import json, sys
sys.path.insert(0, 'benchmarks')
import common
common.FLAGS(['interleaving'])
clock, calls, speed = [0.0], [], [1.0, 3.0, 0.5, 2.0]
common.time.perf_counter = lambda: clock[0]
def side(name, cost):
  def run():
    calls.append(name)
    pair = (len(calls) - 3) // 2  # the first two calls are the warm-up
    clock[0] += cost * speed[max(pair, 0) % len(speed)]
  return run
result = common.interleaved(side('ours', 1.0), side('peer', 2.0), pairs=4, warmup=1)
print(json.dumps({'calls': calls, **result}))
"""


def test_pairs_take_turns_and_their_ratios_cancel_the_drift():
  result = json.loads(run_ok(["-c", _CODE]).stdout)
  # One warm-up call each, then the order alternates pair by pair.
  assert result["calls"] == ["ours", "peer", "ours", "peer", "peer", "ours", "ours", "peer",
                             "peer", "ours"]
  assert result["pair_ratios"] == [2.0, 2.0, 2.0, 2.0]
  assert abs(result["ratio"] - 2.0) < 1e-12 and abs(result["ratio_median"] - 2.0) < 1e-12
  assert result["log_ratio_se"] < 1e-12
  assert result["ours"]["times_s"] == [1.0, 3.0, 0.5, 2.0]
  assert result["peer"]["times_s"] == [2.0, 6.0, 1.0, 4.0]
  assert result["ours"]["median_s"] == 1.5 and result["peer"]["min_s"] == 1.0
