"""benchmarks/profile_ops.py: its wall-time split (what holds a step up, not only what it costs)
on events whose answer is known, and the script end to end at a tiny size.

The tiny run's numbers mean nothing; what is checked is that the profile holds real ops, that
the wall-time shares add up and that a step's matmuls and its other ops both appear. The peer
is not run (--nopeer; CI has no torch).
"""

import json
import os

import pytest

from conftest import ROOT
from conftest import run_ok

SCRIPT = os.path.join(ROOT, "benchmarks", "profile_ops.py")

# In microseconds: a matmul 0-100, a cast 50-150 (beside the matmul for 50), nothing 150-200, a
# compiled function's fusion 200-260 and another cast 230-300 (the two side by side 230-260).
_EVENTS = [
    {"name": "_MklMatMul", "ts": 0, "dur": 100, "args": {}},
    {"name": "Cast", "ts": 50, "dur": 100, "args": {}},
    {"name": "add_select_fusion", "ts": 200, "dur": 60,
     "args": {"hlo_module": "a_inference__update_and_copy_123__.1"}},
    {"name": "Cast", "ts": 230, "dur": 70, "args": {}},
]


def test_wall_split_of_known_events():
  code = ("import json, sys; sys.path.insert(0, 'benchmarks'); import profile_ops; "
          "profile_ops.FLAGS(['profile_ops']); "
          "print(json.dumps(profile_ops._wall(json.loads(sys.stdin.read()))))")
  wall = json.loads(run_ok(["-c", code], input=json.dumps(_EVENTS)).stdout)
  assert wall["wall_ms"] == 0.3  # 0-300 us: every moment is in one of the three spans
  assert wall["shares"] == {"matmul": round(100 / 300, 4), "other ops only": round(150 / 300, 4),
                            "idle": round(50 / 300, 4)}
  alone = {name: share for name, _, share in wall["other_ops_alone"]}
  # The casts alone 100-150 and 260-300 and half of 230-260, shared with the fusion: 105 of the
  # 150 us; the fusion 200-230 and the other half: 45 (named by its compiled function).
  assert alone == {"Cast": 0.7, "_update_and_copy: add_select_fusion": 0.3}


@pytest.mark.onednn_bf16
def test_tiny_profile_reports_ops_and_wall_split():
  result = run_ok([SCRIPT, "--layers=2", "--hidden_size=128", "--num_heads=2",
                   "--intermediate_size=512", "--vocab_size=1000", "--steps_per_loop=2",
                   "--nopeer", "--top=200"], timeout=600)
  line = json.loads(result.stdout.strip().splitlines()[-1])
  ops = {name for name, _, _ in line["ours"]}
  assert any("MatMul" in name for name in ops), sorted(ops)
  wall = line["ours_wall"]
  assert wall["wall_ms"] > 0
  assert abs(sum(wall["shares"].values()) - 1.0) < 1e-3
  assert wall["shares"]["matmul"] > 0 and wall["shares"]["other ops only"] > 0
  alone = {name for name, _, _ in wall["other_ops_alone"]}
  # The optimizer's update runs after the last gradient, with no matmul beside it.
  assert any(name.startswith("_update_and_copy: ") for name in alone), sorted(alone)
  assert "--- ours: wall time of the profiled call" in result.stderr
  assert line["settings"]["profiled"] == "pre-training step"
