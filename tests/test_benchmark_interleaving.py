"""benchmarks/common.interleaved: the two sides' calls taking turns in one process, on a fake
clock whose answer is known (the real benchmark needs torch, which CI does not install)."""

import json

from conftest import ENV, run_ok

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


def test_a_child_past_its_time_is_stopped_and_the_next_one_still_runs(tmp_path):
  """$BENCH_CHILD_TIMEOUT (a lent GPU's minutes): a child still starting after its seconds is
  stopped and its figure is an error naming the time; the children after it run. Its stderr went
  to $BENCH_CHILD_LOG as it came, under a header naming it."""
  log = tmp_path / "children.log"
  code = ("import json, sys, time\n"
          "sys.path.insert(0, 'benchmarks')\n"
          "import common\n"
          "common.FLAGS([sys.argv[0]] + [a for a in sys.argv[1:] if not a.startswith('--s')])\n"
          "if '--side=ours' in sys.argv:\n"
          "  print('ours on stdout', flush=True)\n"  # comes back as bytes from a timeout
          "  print('ours starts', file=sys.stderr, flush=True); time.sleep(60)\n"
          "elif '--side=peer' in sys.argv:\n"
          "  common._progress('peer call'); common.child_result({'per_s': 2.0})\n"
          "else:\n"
          "  print(json.dumps([common.run_child('ours'), common.run_child('peer')]))\n")
  script = tmp_path / "child_timeout.py"
  script.write_text(code)
  out = run_ok([str(script)], env={**ENV, "BENCH_CHILD_TIMEOUT": "3", "BENCH_CHILD_LOG": str(log)})
  ours, peer = json.loads(out.stdout.strip().splitlines()[-1])
  assert ours["error"].startswith("timed out after 3 s (BENCH_CHILD_TIMEOUT): ")
  assert "ours starts" in ours["error"]
  assert peer["per_s"] == 2.0
  text = log.read_text()
  assert "== child_timeout.py ours " in text and "ours starts" in text
  assert "== child_timeout.py peer " in text and "] peer call" in text
