"""script_flags: a settings record is the flags' values by field name, in one line; a field whose
flag the script lacks keeps its default; `given` names the flags set on the command line."""

import json
import sys

from conftest import ENV, ROOT, run_process


def test_settings_are_the_flags_values_by_field_name():
  code = """
import json
from absl import flags
from bert_tf2 import fine_tuning, run_squad, script_flags, training
run_squad.define_flags()
flags.FLAGS(["run_squad", "--learning_rate=3e-5", "--do_train", "--output_dir=/tmp/x"])
s = script_flags.settings(fine_tuning.Settings)
t = script_flags.settings(training.Settings)
print(json.dumps({"lr": s.learning_rate, "do_train": s.do_train, "do_eval": s.do_eval,
                  "max_seq_length": s.max_seq_length, "lr_schedule": s.lr_schedule,
                  "output_dir": s.output_dir, "given": sorted(s.given),
                  "training_lr": t.learning_rate, "training_fields": len(vars(t))}))
"""
  done = run_process([sys.executable, "-c", code], cwd=ROOT, env=ENV, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  got = json.loads(done.stdout.strip().splitlines()[-1])
  assert got["lr"] == got["training_lr"] == 3e-5
  assert got["do_train"] is True and got["output_dir"] == "/tmp/x"
  # run_squad has no --do_eval: the field keeps its default.
  assert got["do_eval"] is False
  assert got["max_seq_length"] == 384 and got["lr_schedule"] == "decay_after_warmup"
  assert got["given"] == ["do_train", "learning_rate", "output_dir"]
  assert got["training_fields"] > 10
