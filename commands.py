"""How a command runs, and the console commands `pip install .` puts on the PATH.

`run_main` is every script's entry point (`python SCRIPT.py` and its console command alike): absl's
app.run, with a bad flag, a `fileio.ReportedError`, an OS error on a named path (missing,
read-only, disk full) and Ctrl-C / SIGTERM each ending in one `error: ...` line and an exit status
instead of a traceback. A script imports this module before its slow imports (TensorFlow), so that
Ctrl-C while they load ends in one line too.

Each console command runs the script's `cli()`, exactly what `python SCRIPT.py` runs (its flags,
the required ones, its main through run_main). One command runs per process, so the scripts'
flags never meet.
"""

import importlib
import math
import os
import signal
import sys

from absl import app
from absl import flags
from absl import logging

from bert_tf2 import fileio


class Interrupted(BaseException):
  """SIGTERM turned into an exception, so that `finally` blocks remove temporaries on the way out
  (a BaseException, as KeyboardInterrupt is, so that no `except Exception` swallows it)."""


# --- Every script's entry point -------------------------------------------------------------------


def _flag_error(message):
  # absl lists several missing required flags on lines of their own: one line, as promised.
  print("error: " + "; ".join(str(message).strip().splitlines()), file=sys.stderr)
  sys.exit(2)


def _parse_flags(argv, positional=False):
  """absl's flag parsing, with a bad flag as one error line: unknown, unparsable, out of range,
  a float that is not finite (NaN or infinity: no flag of these scripts means it), and, unless
  the script takes `positional` arguments, a word that is not a flag (`--do_lower_case false`:
  absl would drop the `false` silently and keep the default)."""
  try:
    argv = flags.FLAGS(argv)
  except flags.Error as e:
    _flag_error(e)
  for name in flags.FLAGS:  # names and short names
    flag = flags.FLAGS[name]
    if (isinstance(flag.parser, flags.FloatParser) and isinstance(flag.value, float)
        and not math.isfinite(flag.value)):
      _flag_error(f"flag --{flag.name}={flag.value}: must be a finite number")
  if not positional and len(argv) > 1:
    _flag_error(f"unexpected argument {argv[1]!r}: flags take their value after '=' "
                f"(e.g. --flag=value, --flag=false)")
  return argv


def _raise_interrupted(signum, frame):
  del frame
  raise Interrupted(signal.Signals(signum).name)


def _first_line(text):
  return str(text).strip().splitlines()[0] if str(text).strip() else type(text).__name__


def _early_signal(signum, frame):
  del frame
  name = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
  print(f"error: stopped by {name} while starting; nothing was written", file=sys.stderr)
  os._exit(130 if signum == signal.SIGINT else 143)  # pylint: disable=protected-access


def stop_quietly_while_starting():
  """Until run_main takes over, Ctrl-C or SIGTERM ends the process with one line (exit 130 /
  143) instead of a KeyboardInterrupt traceback from inside the slow imports (TensorFlow): a
  script imports this module before them. Nothing has been written then, so nothing to clean."""
  for signum in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL):
      signal.signal(signum, _early_signal)


def _main_is_a_script_here():
  main = sys.modules.get("__main__")
  path = getattr(main, "__file__", None)
  return bool(path) and os.path.dirname(os.path.abspath(path)) == os.path.dirname(
      os.path.abspath(__file__))


if _main_is_a_script_here():
  stop_quietly_while_starting()


def raise_on_stop_signals():
  """From here on Ctrl-C raises KeyboardInterrupt and SIGTERM `Interrupted`, so `finally`
  blocks remove temporaries on the way out (handlers a caller set itself are kept)."""
  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None, _early_signal):
    signal.signal(signal.SIGTERM, _raise_interrupted)
  if signal.getsignal(signal.SIGINT) is _early_signal:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def run_main(main, positional=False):
  """absl's app.run, with errors a user can fix printed as one `error: ...` line.

  Exit status 2 for an InputError, a bad flag, or an OS error on a named path (missing, read-only,
  disk full, too many open files: the command or its environment needs fixing); 1 for other
  reported errors (e.g. training.TrainingError: the run itself could not go on); 130 / 143 for
  Ctrl-C / SIGTERM, after `finally` blocks have removed the run's temporaries. A traceback is
  shown only with --verbosity=1 or more (for debugging this program).
  """

  def guarded(argv):
    raise_on_stop_signals()
    try:
      return main(argv)
    except fileio.ReportedError as e:
      _report(e, 2 if isinstance(e, fileio.InputError) else 1)
    except OSError as e:
      where = e.filename or ""
      _report(f"{where}: {e.strerror or e}" if where else (e.strerror or str(e)), 2, e)
    except (KeyboardInterrupt, Interrupted) as e:
      name = "SIGINT (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else str(e)
      _report(f"stopped by {name}; no incomplete output was left under its final name",
              130 if isinstance(e, KeyboardInterrupt) else 143)
    except Exception as e:  # pylint: disable=broad-except
      tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
      if tf_errors is not None and isinstance(e, tf_errors.OpError):
        # TensorFlow's I/O errors (disk full while saving a checkpoint, an unreadable file).
        _report(_first_line(e.message), 2, e)
      raise

  app.run(guarded, flags_parser=lambda argv: _parse_flags(argv, positional))


def _report(message, status, error=None):
  logging.flush()
  if error is not None and logging.get_verbosity() >= logging.DEBUG:
    raise error
  print(f"error: {message}", file=sys.stderr)
  sys.exit(status)


def _run(module_name):
  stop_quietly_while_starting()  # Ctrl-C while the script's imports load: one line
  importlib.import_module("bert_tf2." + module_name).cli()


def create_pretraining_data():
  _run("create_pretraining_data")


def run_pretraining():
  _run("run_pretraining")


def run_classifier():
  _run("run_classifier")


def run_squad():
  _run("run_squad")


def run_ner():
  _run("run_ner")


def run_swag():
  _run("run_swag")


def evaluate_squad():
  _run("evaluate_squad")


def extract_features():
  _run("extract_features")


def export_model():
  _run("export_model")


def build_vocab():
  _run("build_vocab")


def convert_checkpoint():
  _run("convert_checkpoint")


def quickstart():
  _run("quickstart")
