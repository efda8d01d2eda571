"""conftest's warm start (tests/script_server.py): a script forked from it behaves as the same
script run by a fresh `python`: exit status, output, tracebacks, atexit, a process of its own with
TensorFlow's runtime not yet started, timeouts that kill it."""

import os
import pathlib
import textwrap
import time

import pytest

from conftest import PYTHON, ROOT, TimeoutExpired, run_process, run_script

PROBE = textwrap.dedent('''\
    """probe: what a test's script sees of its process."""
    import atexit, json, os, sys, threading
    import tensorflow as tf
    mode = sys.argv[1]
    if mode == "facts":
      # A runtime already started (a TensorFlow op run before the fork) would refuse this.
      tf.config.threading.set_intra_op_parallelism_threads(1)
      print(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "argv": sys.argv,
                        "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
                        "sum": float(tf.reduce_sum(tf.range(5.0))),
                        "stdin": sys.stdin.read()}))
    elif mode == "raise":
      raise ValueError("raised here")
    elif mode == "interrupt":
      raise KeyboardInterrupt
    elif mode == "message":
      sys.exit("error: a message")
    elif mode == "code":
      print("to stdout"); print("to stderr", file=sys.stderr); sys.exit(int(sys.argv[2]))
    elif mode == "finish":
      out = open(sys.argv[2], "w")  # never closed: interpreter shutdown flushes it
      out.write("written at shutdown")
      atexit.register(lambda: print("atexit ran"))
      threading.Thread(target=lambda: (__import__("time").sleep(1), print("thread ran"))).start()
    elif mode == "sleep":
      print(os.getpid(), flush=True)
      os.system("sleep 600 &")  # a grandchild in the same process group
      __import__("time").sleep(600)
''')


@pytest.fixture(name="probe")
def probe_fixture(tmp_path):
  path = tmp_path / "probe.py"
  path.write_text(PROBE, encoding="utf-8")
  return str(path)


def _both(args):
  """The warm run (run_script) and a fresh `python` (run_process) of the same arguments."""
  return run_script(args), run_process([PYTHON, *args])


def _last_line(text):
  return text.strip().splitlines()[-1]


def test_exit_status_output_and_tracebacks_match_a_fresh_python(probe):
  for args in ([probe, "code", "0"], [probe, "code", "3"], [probe, "code", "300"]):
    warm, cold = _both(args)
    assert (warm.returncode, warm.stdout, _last_line(warm.stderr)) == (
        cold.returncode, cold.stdout, _last_line(cold.stderr)), args
  assert warm.returncode == 300 % 256
  warm, cold = _both([probe, "message"])
  assert warm.returncode == cold.returncode == 1
  assert _last_line(warm.stderr) == _last_line(cold.stderr) == "error: a message"
  warm, cold = _both([probe, "raise"])
  assert warm.returncode == cold.returncode == 1
  for result in (warm, cold):
    assert "Traceback (most recent call last)" in result.stderr
    assert _last_line(result.stderr) == "ValueError: raised here"
  assert warm.args == [PYTHON, probe, "raise"]
  warm, cold = _both([probe, "interrupt"])
  assert warm.returncode == cold.returncode == -2  # Python ends by its own SIGINT
  assert _last_line(warm.stderr) == _last_line(cold.stderr) == "KeyboardInterrupt"
  warm = run_script([pathlib.Path(probe), "code", "4"])  # arguments as subprocess takes them
  assert warm.returncode == 4 and warm.stdout == "to stdout\n"


def test_each_run_is_a_process_of_its_own_with_a_fresh_runtime(probe):
  import json  # pylint: disable=g-import-not-at-top
  runs = [json.loads(run_script([probe, "facts"]).stdout) for _ in range(2)]
  cold = json.loads(run_process([PYTHON, probe, "facts"]).stdout)
  for facts in runs:
    assert facts["pid"] != os.getpid() and facts["pgid"] == facts["pid"]
    assert facts["argv"] == [probe, "facts"] and facts["cwd"] == ROOT
    assert facts["name"] == "__main__" and facts["sum"] == 10.0 and facts["stdin"] == ""
    assert facts["path0"] == cold["path0"] == os.path.dirname(probe)
  assert runs[0]["pid"] != runs[1]["pid"]


def test_shutdown_joins_threads_runs_atexit_and_flushes_files(probe, tmp_path):
  written = tmp_path / "written.txt"
  warm = run_script([probe, "finish", str(written)])
  assert warm.returncode == 0, warm.stderr
  assert warm.stdout.splitlines() == ["thread ran", "atexit ran"]
  assert written.read_text() == "written at shutdown"


def test_a_timeout_kills_the_run_and_its_process_group(probe):
  start = time.time()
  with pytest.raises(TimeoutExpired) as caught:
    run_script([probe, "sleep"], timeout=8)
  assert time.time() - start < 60
  pid = int(caught.value.output.split()[0])
  # The run and the `sleep` it left in its process group are gone.
  deadline = time.time() + 10
  while time.time() < deadline and _group_alive(pid):
    time.sleep(0.1)
  assert not _group_alive(pid)


def _group_alive(pgid):
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[2]) == pgid and fields[0] != "Z":
      return True
  return False
