"""Smoke test of benchmarks/pretraining_parity.py (issue #30): the script runs end to end at the
tiniest settings and its JSON line holds what the benchmark promises. Its numbers mean nothing at
this size; the real run is long and not part of the tests.

The peer is not run (--nopeer; CI has no torch either): its side must then be null with a
peer_missing note.
"""

import json
import math
import os

import pytest

from conftest import requires_shared
from conftest import ROOT
from conftest import run_ok

SCRIPT = os.path.join(ROOT, "benchmarks", "pretraining_parity.py")


@requires_shared
@pytest.mark.onednn_bf16
def test_tiny_run_reports_curves_plot_and_no_peer(tmp_path):
  plot = tmp_path / "curves.png"
  result = run_ok([SCRIPT, "--model=tiny", "--steps=4", "--eval_every=2", "--max_train_docs=50",
                   "--recipes=original", "--downstream_tasks=", "--nopeer",
                   "--heldout_fraction=0.001", "--eval_instances=32", "--eval_batch_size=16",
                   "--dupe_factor=1", f"--work_dir={tmp_path / 'work'}", f"--plot={plot}"],
                  timeout=300)
  line = json.loads(result.stdout.strip().splitlines()[-1])
  for key in ("benchmark", "ours", "peer", "ratio", "figures", "machine", "settings", "details",
              "mlm_loss_ratio", "speedup_to_hf_loss", "downstream_diff"):
    assert key in line, key
  assert line["benchmark"] == "pretraining_parity"
  # No peer: its figures, and the ones comparing with it, are null, and the line says why.
  assert line["peer_missing"]
  assert line["mlm_loss_ratio"] is None and line["speedup_to_hf_loss"] is None
  assert line["downstream_diff"] is None and line["details"]["peer"] is None
  assert line["settings"]["model"] == "tiny" and line["settings"]["hidden_size"] == 128
  assert line["settings"]["precision"] in ("fp32", "bf16")

  ours = line["details"]["ours"]["original"]
  assert "error" not in ours, ours.get("error")
  curve = ours["curve"]
  assert [p["step"] for p in curve] == [2, 4]  # evaluated every --eval_every steps
  for point in curve:
    # Scored on held-out records by run_pretraining.py --do_eval: a real loss of an untrained
    # model (about ln(vocab) ~ 10.3, and no better than a few nats below) and accuracies.
    assert math.isfinite(point["masked_lm_loss"]) and 5 < point["masked_lm_loss"] < 12
    assert 0 <= point["masked_lm_accuracy"] <= 1
    assert 0 <= point["next_sentence_accuracy"] <= 1
    assert point["seconds"] > 0
  assert curve[0]["seconds"] < curve[1]["seconds"]
  assert all(math.isfinite(loss) for _, loss, _ in ours["training_losses"])
  head = next(f for f in line["figures"] if f["name"].startswith("held-out masked-LM loss"))
  assert math.isclose(head["ours"], curve[-1]["masked_lm_loss"], rel_tol=1e-3)
  assert head["peer"] is None

  data = line["details"]["data"]
  assert data["original"]["documents"] == 50 and data["original"]["records"] > 0
  assert data["eval"]["records"] >= 32  # the held-out documents' own records

  # The plot and the JSON copy beside the work.
  assert plot.stat().st_size > 1000
  assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with open(tmp_path / "work" / "pretraining_parity.json", encoding="utf-8") as f:
    assert json.load(f) == line
