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


_RUN_CODE = """
import json, sys
sys.path.insert(0, 'benchmarks')
import common
common.define_model_flags()
common.define_interleave_flag()
common.FLAGS(['interleaving', '--interleave_pairs=4', '--variants=bf16,fp32',
              '--peer_variants=fp32'])
common.missing = lambda modules: []  # torch is not needed: both sides are fakes
clock, asked = [0.0], []
common.time.perf_counter = lambda: clock[0]
def call(name, cost, speed):
  def make(variant):
    asked.append((name, variant))
    state = {'calls': 0}
    def run():
      clock[0] += cost * speed[state['calls'] % len(speed)]
      state['calls'] += 1
    return run, lambda: {'side': name}
  return make
common.FLAGS.warmup = 1
common.run_interleaved('fake', 'fake step', call('ours', 1.0, [1, 3, 0.5, 2, 1]),
                       call('peer', 4.0, [1, 3, 1, 2, 4]), 16, 2.0,
                       {'batch_size': 8}, 'a peer')
print(json.dumps(asked))
"""


def test_an_interleaved_model_benchmark_emits_the_pairs_geometric_mean():
  """common.run_interleaved (pretraining_step.py's and encode.py's --interleave_pairs): the first
  variant of each side, the head ratio the pairs' geometric mean, rates from the medians."""
  lines = run_ok(["-c", _RUN_CODE]).stdout.strip().splitlines()
  line, asked = json.loads(lines[-2]), json.loads(lines[-1])
  assert asked == [["ours", "bf16"], ["peer", "fp32"]]
  assert line["benchmark"] == "fake" and line["peer_name"] == "a peer, same process, interleaved"
  head = line["figures"][0]
  assert head["name"] == "fake step, interleaved" and head["target_ratio"] == 2.0
  # After one warm-up call each, ours takes 3, 0.5, 2, 1 units, the peer 12, 4, 8, 16: pair
  # ratios 4, 8, 4, 16, whose geometric mean (6.73) is neither their median (5.66, between 4 and
  # 8 on a log scale) nor the ratio of the two sides' medians (10 / 1.5 = 6.67).
  assert line["details"]["pair_ratios"] == [4.0, 8.0, 4.0, 16.0]
  assert head["ratio"] == line["ratio"] == round(2048 ** 0.25, 4)
  assert line["details"]["ratio_median"] == round(32 ** 0.5, 4)
  assert head["ours_variant"] == "bf16" and head["peer_variant"] == "fp32"
  assert line["details"]["ours"]["per_s"] == 16 / 1.5 and line["details"]["peer"]["per_s"] == 16 / 10
  assert line["details"]["ours"]["side"] == "ours"
  assert line["settings"]["interleave_pairs"] == 4 and line["settings"]["batch_size"] == 8


def test_an_interleaved_run_without_torch_is_a_usage_error():
  code = _RUN_CODE.replace("common.missing = lambda modules: []",
                           "common.missing = lambda modules: ['torch']")
  code = code.replace("common.run_interleaved(", "try:\n  common.run_interleaved(").replace(
      "'a peer')", "'a peer')\nexcept common.app.UsageError as e:\n  print('usage:', e)")
  out = run_ok(["-c", code]).stdout
  assert "usage: --interleave_pairs needs torch and transformers in this Python" in out
  assert '"benchmark"' not in out and '["ours", "bf16"]' not in out
