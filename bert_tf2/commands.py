"""How a command runs: every script's entry point, and the commands that start the scripts.

`run_main` is every script's main loop: absl's app.run, with a bad flag, a
`errors.ReportedError`, an OS error on a named path (missing, read-only, disk full), Ctrl-C /
SIGTERM and, under multi_worker_mirrored, a worker that stopped answering each ending in one
`error: ...` line and an exit status instead of a traceback; the workers of a good
multi_worker_mirrored run leave together (`_leave_the_cluster_together`).

`run_script(NAME)` starts the script bert_tf2/NAME.py, and it is what every way of starting one
runs: the checkout's `python NAME.py`, the `bert-*` console commands of `pip install .` and
`python -m bert_tf2 NAME`. It makes Ctrl-C while the slow imports (TensorFlow) load end in one
line, then imports the script under its package name and runs its `cli()` (its flags, the
required ones, its main through run_main). One script runs per process, so the scripts' flags
never meet.
"""

import ast
import importlib
import importlib.abc
import importlib.machinery
import json
import logging as std_logging
import math
import os
import re
import sys
import textwrap

from absl import app
from absl import flags
from absl import logging

from bert_tf2 import errors
from bert_tf2 import processes


# --- Every script's entry point -------------------------------------------------------------------


def _flag_error(message):
  # absl lists several missing required flags on lines of their own: one line, as promised.
  print("error: " + "; ".join(str(message).strip().splitlines()), file=sys.stderr)
  sys.exit(2)


_HELP = ("--help", "-help", "-h", "--h", "-?", "--helpshort", "-helpshort")


def script_help(module_name):
  """--help of the script `module_name` (bert_tf2.NAME): its docstring's first paragraph, then
  every flag it takes with its default and bounds, its own flags first, then the shared ones by
  group (script_flags.GROUPS). Only the flags of this project: --helpfull adds absl's and
  TensorFlow's."""
  from bert_tf2 import script_flags  # pylint: disable=g-import-not-at-top
  script = module_name.rsplit(".", 1)[-1]
  module = sys.modules.get(module_name)
  summary = ((getattr(module, "__doc__", None) or "").strip().split("\n\n") or [""])[0]
  lines = [f"usage: python {script}.py --flag=value ...  (or bert-{script.replace('_', '-')}, "
           f"python -m bert_tf2 {script})", "", summary]
  by_module = flags.FLAGS.flags_by_module_dict()
  groups = {f"{script}.py": list(by_module.get(module_name, []))}
  for flag in by_module.get("bert_tf2.script_flags", []):
    groups.setdefault(script_flags.GROUPS.get(flag.name, "shared"), []).append(flag)
  for title, group in groups.items():
    if group:
      lines += ["", f"{title}:"]
    for flag in group:
      bounds = flag.parser.syntactic_help
      lines.append(f"  --{flag.name}={_default_text(flag.default)}"
                   + (f"  ({bounds})" if bounds else ""))
      lines += textwrap.wrap(flag.help, 96, initial_indent="      ", subsequent_indent="      ")
  lines += ["", "Booleans: --name or --noname. --helpfull adds absl's and TensorFlow's flags."]
  return "\n".join(lines)


def _default_text(value):
  if value is None:
    return ""
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, (list, tuple)):
    return ",".join(map(str, value))
  return str(value)


def _parse_flags(argv, positional=False, module_name=None):
  """absl's flag parsing, with a bad flag as one error line: unknown, unparsable, out of range,
  a float that is not finite (NaN or infinity: no flag of these scripts means it), and, unless
  the script takes `positional` arguments, a word that is not a flag (`--do_lower_case false`:
  absl would drop the `false` silently and keep the default). --help lists the script's flags
  (script_help); absl's own lists only those of the __main__ module, an entry point here."""
  if module_name and any(arg in _HELP for arg in argv[1:]):
    print(script_help(module_name))
    sys.exit(0)
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


_STATUS_LINE = re.compile(r"[A-Z][A-Z_]+: \S")  # TensorFlow's "NOT_FOUND: ...", the detail


def _first_line(text):
  """One line of an error's text: its first, or for a heading that says nothing by itself
  (TensorFlow's "Graph execution error:") the status line under it."""
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  if not lines:
    return type(text).__name__
  if lines[0].endswith(":"):
    detail = [line for line in lines[1:] if _STATUS_LINE.match(line)]
    return f"{lines[0]} {(detail or lines[1:2])[0]}" if len(lines) > 1 else lines[0]
  return lines[0]




def run_main(main, positional=False):
  """absl's app.run, with errors a user can fix printed as one `error: ...` line.

  Exit status 2 for an InputError, a bad flag, or an OS error on a named path (missing, read-only,
  disk full, too many open files: the command or its environment needs fixing); 1 for other
  reported errors (e.g. training.TrainingError: the run itself could not go on) and for another
  worker of multi_worker_mirrored gone (`_lost_worker_line`); 130 / 143 for
  Ctrl-C / SIGTERM, after `finally` blocks have removed the run's temporaries. A traceback is
  shown only with --verbosity=1 or more (for debugging this program).
  """

  def guarded(argv):
    processes.raise_on_stop_signals()
    try:
      result = main(argv)
      _leave_the_cluster_together()
      return result
    except errors.ReportedError as e:
      _report(e, 2 if isinstance(e, errors.InputError) else 1)
    except OSError as e:
      where = e.filename or ""
      _report(f"{where}: {e.strerror or e}" if where else
              f"{e.strerror or e}{_while_writing()}", 2, e)
    except (KeyboardInterrupt, processes.Interrupted) as e:
      name = "SIGINT (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else str(e)
      _report(f"stopped by {name}; no incomplete output was left under its final name",
              130 if isinstance(e, KeyboardInterrupt) else 143)
    except Exception as e:  # pylint: disable=broad-except
      tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
      if tf_errors is not None and isinstance(e, tf_errors.OpError):
        lost = _lost_worker_line(e, tf_errors)
        if lost:  # a worker of the cluster is gone: the run cannot go on, a restart resumes it
          _report(lost, 1, e, at_once=True)
        # TensorFlow's I/O errors (disk full while saving a checkpoint, an unreadable file).
        _report(_first_line(e.message), 2, e)
      raise

  app.run(guarded, flags_parser=lambda argv: _parse_flags(argv, positional, main.__module__))


# --- Several workers (multi_worker_mirrored) ----------------------------------------------------

# What TensorFlow raises on the workers left when one is gone (killed, its machine lost): the
# collective under way, or the next one, fails with UnavailableError, and the end-of-run barrier
# with InternalError. Their text is a page (TensorFlow's "Graph execution error:", the node's
# Python stack, then the cause), the cause one of:
#  - the coordination service (in the chief) after its heartbeat timeout, 10 s:
#    "Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks
#    are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have
#    crashed. ..." (the barrier's: "Barrier failed because: ... Task /job:worker/replica:0/task:1
#    heartbeat timeout. ...");
#  - gRPC, at once, when the chief itself is gone: "Collective ops is aborted by: recvmsg:
#    Connection reset by peer\nAdditional GRPC error information from remote target
#    /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/CompleteInstance: ...",
#    or "Failed to send RPC to coordination service. Either the leader task was preempted/died
#    ...".
# (As TensorFlow 2.21 words them.) Each names the task that is gone.
_PEER_ERRORS = ("UnavailableError", "CancelledError", "AbortedError", "DeadlineExceededError",
                "InternalError")
_PEER_GONE = re.compile(r"Collective ops is aborted|coordination service|stopped sending "
                        r"heartbeats|heartbeat timeout|Barrier failed|remote target /job:")
_TASK = re.compile(r"/job:(chief|worker)/(?:replica:\d+/)?task:(\d+)\b")
# Where the coordination service lists the tasks it takes for dead (preferred to any other task
# the text names: in a cluster of more than two, a live worker may relay the abort).
_DEAD_TASKS = re.compile(r"stopped sending heartbeats\):\s*((?:/job:\S+\s*)+)"
                         r"|Task (/job:\S+) heartbeat timeout")


def _in_a_cluster():
  """Whether this run is a worker of multi_worker_mirrored (not a TPU's host, whose cluster is
  the TPU's workers)."""
  values = flags.FLAGS
  return ("distribution_strategy" in values
          and values.distribution_strategy == "multi_worker_mirrored"
          and not ("use_tpu" in values and values.use_tpu))


def _cluster_tasks():
  """(this task, every task) of TF_CONFIG, each as (job, index); (None, []) without one."""
  try:
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster = config["cluster"]
    tasks = [(job, i) for job in ("chief", "worker") for i in range(len(cluster.get(job) or ()))]
    return (config["task"]["type"], int(config["task"]["index"])), tasks
  except (ValueError, KeyError, TypeError, AttributeError):
    return None, []


def _task_names(tasks):
  names = ["the chief" if job == "chief" else f"worker {index}" for job, index in tasks]
  return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def _lost_worker_line(error, tf_errors):
  """For TensorFlow's error `error` on a worker of multi_worker_mirrored when another worker is
  gone: the line that says which, and what to do (None for any other error). The worker is the
  one the error names, or the one other worker of a cluster of two."""
  if not (_in_a_cluster()
          and isinstance(error, tuple(getattr(tf_errors, name) for name in _PEER_ERRORS))
          and _PEER_GONE.search(str(error.message))):
    return None
  own, tasks = _cluster_tasks()
  text = str(error.message)
  dead = " ".join(" ".join(m.groups("")) for m in _DEAD_TASKS.finditer(text))
  named = sorted({(job, int(index)) for job, index in _TASK.findall(dead or text)} - {own})
  others = [task for task in tasks if task != own]
  if not named and len(others) == 1:
    named = others
  who = _task_names(named) if named else "a worker"
  return (f"{who} stopped answering (killed or lost); restart every worker with the same "
          f"command{_resume_point()}")


def _resume_point():
  """': training resumes from OUTPUT_DIR/ckpt-N' (its newest whole checkpoint) when this run
  trains into --output_dir, or says it starts from the beginning without one; '' otherwise."""
  values = flags.FLAGS
  output_dir = values.output_dir if "output_dir" in values else None
  if not (output_dir and "do_train" in values and values.do_train):
    return ""
  from bert_tf2 import run_dir  # pylint: disable=g-import-not-at-top
  try:
    newest = run_dir.newest_checkpoint(output_dir)
  except Exception:  # pylint: disable=broad-except
    # (--output_dir unreadable now: the line still says what to do.)
    return f": training resumes from the newest checkpoint in {output_dir}"
  if newest:
    return f": training resumes from {newest}"
  return f": training starts again from the beginning (no checkpoint in {output_dir} yet)"


# The end-of-run barrier: its name, and how long a worker whose work is done waits there for the
# others (the chief may still be writing outputs the others do not write; a worker that is gone
# fails the barrier within the coordination service's heartbeat timeout instead).
_END_OF_RUN = "bert_tf2_end_of_run"
_END_OF_RUN_TIMEOUT_SECONDS = 6 * 3600


def _leave_the_cluster_together():
  """Under multi_worker_mirrored, a worker whose main returned waits until every worker's has,
  then exits with them.

  Without it, TensorFlow's coordination service (run by the chief) takes a worker that has
  exited for a crashed one: a chief still running 10 s (its heartbeat timeout) after a worker
  left ends its log of a good run with "The following tasks are unhealthy (stopped sending
  heartbeats) ... The tasks have crashed", and a worker left running after the chief with
  "Failed to send RPC to coordination service. Either the leader task was preempted/died...".
  TensorFlow's own clean leave (its agent's shutdown barrier) is not reachable from Python, so
  this is a barrier of that service (the eager context's wait_at_barrier, TensorFlow's internal
  API: there is no public one); past it, every worker only exits."""
  if not _in_a_cluster():
    return
  context = sys.modules.get("tensorflow.python.eager.context")
  if context is None or getattr(context.context(), "coordination_service", None) is None:
    return  # no multi_worker_mirrored strategy was made: no cluster was joined
  context.context().wait_at_barrier(_END_OF_RUN, _END_OF_RUN_TIMEOUT_SECONDS * 1000)


# The flags that name a script's outputs, for an OS error that names no file (a write() on a full
# disk): the shared writers name their output, this is the net under any other write.
OUTPUT_FLAGS = ("output_dir", "output_file", "export_dir", "output")


def _while_writing():
  """' (while writing --output_dir=PATH)' for the output flags this run set, or ''."""
  values = flags.FLAGS
  named = [f"--{name}={getattr(values, name)}" for name in OUTPUT_FLAGS
           if name in values and getattr(values, name)]
  return f" (while writing {', '.join(named)})" if named else ""


def _report(message, status, error=None, at_once=False):
  logging.flush()
  if error is not None and logging.get_verbosity() >= logging.DEBUG:
    raise error
  # One line, whatever the error's text (a runner's or a library's may span several; the rest
  # is in the traceback --verbosity=1 shows).
  print(f"error: {_first_line(message)}", file=sys.stderr)
  if at_once:
    _exit_at_once(status)
  sys.exit(status)


def _exit_at_once(status):
  """Ends the process now, after its atexit handlers (a remote --output_dir's lock is released
  there), without tearing TensorFlow's runtime down: after a collective failed, TensorFlow's
  runtime cannot be used again ("Restart your program to reset"), and its teardown waits for the
  training input's tf.data autotuner to wake (a period that grows to a minute): the process
  lingered 12 to 63 s after its error line (measured), holding a restart back for nothing.
  Every `finally` block on the way up has run by now."""
  import atexit  # pylint: disable=g-import-not-at-top
  sys.stdout.flush()
  sys.stderr.flush()
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


# --- The commands: one per script --------------------------------------------------------------

SCRIPTS = ("create_pretraining_data", "run_pretraining", "run_classifier", "run_squad", "run_ner",
           "run_swag", "evaluate_squad", "extract_features", "export_model", "build_vocab",
           "convert_checkpoint", "query_model", "quickstart")


# The checkout (bert_tf2/, the root scripts, tests/): INFO lines logged from a file here are the
# project's own.
_PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_PACKAGES = f"{os.sep}site-packages{os.sep}"  # (a virtual environment inside the checkout)


def _tensorflow_warnings_only(record):
  """A filter of the loggers TensorFlow's Python code logs through (its own, and absl's, which it
  shares with the project): the project's lines, everyone's warnings and errors, and everything
  with --verbosity=1 or more."""
  return (record.levelno >= std_logging.WARNING
          or (record.pathname.startswith(_PROJECT) and _PACKAGES not in record.pathname)
          or logging.get_verbosity() >= logging.DEBUG)


class _QuietFirstImport(importlib.abc.MetaPathFinder):
  """TensorFlow's start-up notices for a script that imports it only when a step needs it
  (build_vocab's WordPiece learner, a record writer): the first import of these packages runs in
  the filter the script's own imports run in (a no-op inside it)."""

  NAMES = ("tensorflow", "tensorflow_text", "tensorflow_hub")

  def find_spec(self, name, path=None, target=None):
    del target
    if name not in self.NAMES:
      return None
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is not None and spec.loader is not None:
      spec.loader = _QuietLoader(spec.loader)
    return spec


class _QuietLoader(importlib.abc.Loader):
  """A package's own loader (every other attribute is its), executing the package in the filter
  of TensorFlow's start-up notices."""

  def __init__(self, loader):
    self._loader = loader

  def __getattr__(self, name):
    return getattr(self._loader, name)

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    with processes.filtered_stderr(processes.START_UP_NOISE):
      self._loader.exec_module(module)


def run_script(name):
  """Runs the script bert_tf2/NAME.py: what `python NAME.py` (the checkout's entry point), the
  `bert-NAME` command and `python -m bert_tf2 NAME` all do. The script is imported under its
  package name (never as __main__, so no module is loaded twice) and its cli() runs."""
  processes.stop_quietly_while_starting()  # Ctrl-C while the script's imports load: one line
  # TensorFlow's C++ INFO lines through the run (XLA service and StreamExecutor, "Compiled cluster
  # using XLA!", TFRecordDataset buffer sizes, collective and coordination chatter of the workers,
  # inherited by them) are not for a user: warnings and errors stay. TF_CPP_MIN_LOG_LEVEL=0 (or
  # any value the user sets) shows what it says.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  # The same for its Python INFO lines (a SavedModel's "Assets written to", "Writing fingerprint",
  # "Sharding callback duration" at every checkpoint, signature renames), printed twice once a
  # library adds a root handler: --verbosity=1 shows them.
  std_logging.getLogger("tensorflow").addFilter(_tensorflow_warnings_only)
  std_logging.getLogger("absl").addFilter(_tensorflow_warnings_only)
  sys.meta_path.insert(0, _QuietFirstImport())
  with processes.filtered_stderr(processes.START_UP_NOISE):  # TensorFlow's C++ start-up notices
    module = importlib.import_module("bert_tf2." + name)
  module.cli()


def _summary(name):
  """The first line of the script's docstring, read from its file: the list of scripts should not
  wait for TensorFlow to load."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
  with open(path, encoding="utf-8") as f:
    docstring = ast.get_docstring(ast.parse(f.read())) or ""
  return " ".join(docstring.split("\n\n")[0].split())


def usage():
  """What `python -m bert_tf2 --help` prints: how to run a script, then each script's summary."""
  lines = ["usage: python -m bert_tf2 SCRIPT [--flag=value ...]   (SCRIPT --help: its flags)", "",
           "scripts:"]
  lines += [f"  {name:<24}{_summary(name)}" for name in SCRIPTS]
  return "\n".join(lines)


def main():
  """`python -m bert_tf2 SCRIPT [--flag=value ...]`; `--help` (or `-h`, `help`) lists the
  scripts."""
  if len(sys.argv) == 2 and sys.argv[1] in ("--help", "-h", "-?", "help", "--helpfull"):
    print(usage())
    sys.exit(0)
  if len(sys.argv) < 2 or sys.argv[1] not in SCRIPTS:
    got = f"unknown script {sys.argv[1]!r}; " if len(sys.argv) > 1 else ""
    print(f"error: {got}usage: python -m bert_tf2 SCRIPT [--flag=value ...], SCRIPT one of "
          + ", ".join(SCRIPTS), file=sys.stderr)
    sys.exit(2)
  name = sys.argv.pop(1)
  sys.argv[0] = name + ".py"
  run_script(name)


def create_pretraining_data():
  run_script("create_pretraining_data")


def run_pretraining():
  run_script("run_pretraining")


def run_classifier():
  run_script("run_classifier")


def run_squad():
  run_script("run_squad")


def run_ner():
  run_script("run_ner")


def run_swag():
  run_script("run_swag")


def evaluate_squad():
  run_script("evaluate_squad")


def extract_features():
  run_script("extract_features")


def export_model():
  run_script("export_model")


def build_vocab():
  run_script("build_vocab")


def convert_checkpoint():
  run_script("convert_checkpoint")


def query_model():
  run_script("query_model")


def quickstart():
  run_script("quickstart")
