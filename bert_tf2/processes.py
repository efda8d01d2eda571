"""What a process does with its stop signals and its stderr: Ctrl-C and SIGTERM as one line while
a script starts and as exceptions once it runs (so `finally` blocks remove temporaries), and
stderr held back and filtered while noisy libraries load or worker processes run.

Apart from commands.py (the scripts' entry point), so that what only needs these, such as the
Beam job's local workers (pretraining_data_beam.py), does not import the command runner.
"""

import contextlib
import os
import re
import signal
import sys
import tempfile


def alive(pid):
  """Whether process `pid` still runs (one of another user's counts as running)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class Interrupted(BaseException):
  """SIGTERM turned into an exception, so that `finally` blocks remove temporaries on the way out
  (a BaseException, as KeyboardInterrupt is, so that no `except Exception` swallows it)."""


def _raise_interrupted(signum, frame):
  del frame
  raise Interrupted(signal.Signals(signum).name)


# The terminal's stderr while filtered_stderr holds fd 2 (None otherwise).
_TERMINAL_FD = None


def cpp_log_line(source, message="", level="W"):
  """The regex (text) of a TensorFlow C++ log line of `source`.cc at `level` (I, W, E) starting
  with `message` (a regex), as filtered_stderr's noise: `W0000 00:00:1795.. 853 dataset.cc:997] ...`."""
  return rf"{level}\d{{4}} [\d:. ]+\d+ {source}\.cc:\d+\] {message}"


# What TensorFlow's C++ libraries print while they load, whatever TF_CPP_MIN_LOG_LEVEL says (they
# log through absl before its logging is set up): an absl notice, oneDNN's "custom operations
# are on" (twice: two libraries) and the CPU-feature note with its second line.
START_UP_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    # (At I, or at W as some builds and CPUs log the CPU-feature note.)
    rf"|{cpp_log_line('(port|cpu_feature_guard)', level='[IW]')}"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate")


def import_tensorflow_quietly():
  """Imports TensorFlow, when no one has yet, as the scripts do: without its start-up notices
  (START_UP_NOISE) and with its C++ INFO lines (XLA service and StreamExecutor lines at the first
  compiled call, ...) off unless TF_CPP_MIN_LOG_LEVEL is set. For code that imports the project
  through the original's API fronts (`import modeling` in a user's script), whose users read
  those lines as something wrong with their code. Warnings and errors still show."""
  if "tensorflow" in sys.modules:
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  with filtered_stderr(START_UP_NOISE):
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import,import-outside-toplevel


@contextlib.contextmanager
def filtered_stderr(noise, drop_all_if_stopped=False):
  """While the block runs, what is written to file descriptor 2 (this process' C++ libraries,
  child processes that inherit it) is held in a temporary file; afterwards the lines that do not
  match the regex `noise` come out as they were. With `drop_all_if_stopped`, a block ended by
  Ctrl-C or SIGTERM drops everything held (worker processes' tracebacks as they are stopped):
  the entry point's one line says what happened. TF_CPP_MIN_LOG_LEVEL=0 holds nothing back."""
  global _TERMINAL_FD
  if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0" or _TERMINAL_FD is not None:
    yield
    return
  sys.stderr.flush()
  _TERMINAL_FD = os.dup(2)
  capture = tempfile.TemporaryFile()
  os.dup2(capture.fileno(), 2)
  stopped = False
  try:
    yield
  except (KeyboardInterrupt, Interrupted):
    stopped = True
    raise
  finally:
    sys.stderr.flush()
    os.dup2(_TERMINAL_FD, 2)
    os.close(_TERMINAL_FD)
    _TERMINAL_FD = None
    capture.seek(0)
    text = capture.read().decode("utf-8", errors="replace")
    capture.close()
    kept = [] if stopped and drop_all_if_stopped else [
        line for line in text.splitlines(keepends=True) if not noise.match(line)]
    if kept:
      sys.stderr.write("".join(kept))
      sys.stderr.flush()


def _early_signal(signum, frame):
  del frame
  name = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
  message = f"error: stopped by {name} while starting; nothing was written\n"
  os.write(2 if _TERMINAL_FD is None else _TERMINAL_FD, message.encode())
  os._exit(130 if signum == signal.SIGINT else 143)  # pylint: disable=protected-access


def stop_quietly_while_starting():
  """Until run_main takes over, Ctrl-C or SIGTERM ends the process with one line (exit 130 /
  143) instead of a KeyboardInterrupt traceback from inside the slow imports (TensorFlow): a
  script's entry point (commands.run_script) calls it before them. Nothing has been written then, so nothing to clean."""
  for signum in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL):
      signal.signal(signum, _early_signal)


def raise_on_stop_signals():
  """From here on Ctrl-C raises KeyboardInterrupt and SIGTERM `Interrupted`, so `finally`
  blocks remove temporaries on the way out (handlers a caller set itself are kept)."""
  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None, _early_signal):
    signal.signal(signal.SIGTERM, _raise_interrupted)
  if signal.getsignal(signal.SIGINT) is _early_signal:
    signal.signal(signal.SIGINT, signal.default_int_handler)
