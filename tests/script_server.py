"""A warm start for the tests' script runs: conftest.run_script's processes, forked from a process
that has imported TensorFlow and the package already.

Each script the tests run (a few hundred of them) spends ~3 CPU-seconds importing TensorFlow and
`bert_tf2` before it reads its first flag; most of the error-line tests are nothing else. This
program imports them once, then forks a child for each script run: the child is a process of its
own (its own pid, process group, TensorFlow runtime, files), with the request's arguments,
working directory, stdin from /dev/null and stdout / stderr in the request's files, and runs the
script as `python SCRIPT ARGS` would (runpy, as `__main__`, sys.path[0] the script's folder), then
leaves the way Python does (SystemExit's code, a traceback and 1 on an exception, non-daemon
threads joined, atexit functions run, streams flushed).

What a fork cannot give, conftest does not ask of it: a run in an environment other than
conftest.ENV (environment variables that TensorFlow reads at import), with input on stdin or other
subprocess keywords, or of anything but a script path or `-m module` goes to a real process. Only
importing happens here before the fork (no TensorFlow op, no thread of TensorFlow's), so the child
starts its TensorFlow runtime the way a fresh process does.

Protocol, over a Unix socket (path in argv[1]): one connection per run; the client sends one JSON
line {"args", "cwd", "stdout", "stderr"}; the server answers "pid N" at once and "exit CODE" when
the child has ended (CODE as subprocess gives it: negative for a signal). The server ends when its
stdin (a pipe from the pytest worker) closes.
"""

import json
import os
import select
import signal
import socket
import sys

# What the scripts import, imported once here (importing has no side effect the scripts see: flags
# are defined by the scripts' own calls, TensorFlow's runtime starts at its first op).
import numpy  # pylint: disable=unused-import
import tensorflow  # pylint: disable=unused-import

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bert_tf2.fine_tuning  # pylint: disable=g-import-not-at-top,unused-import,wrong-import-position
import bert_tf2.script_flags  # pylint: disable=g-import-not-at-top,unused-import,wrong-import-position
import bert_tf2.training  # pylint: disable=g-import-not-at-top,unused-import,wrong-import-position
del sys.path[0]


def _run_child(request):
  """In the forked child: becomes the script's process and never returns."""
  os.setpgid(0, 0)
  code = 1
  try:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
      out = os.open(path, os.O_WRONLY | os.O_TRUNC)
      os.dup2(out, fd)
      os.close(out)
    os.close(null)
    os.chdir(request["cwd"])
    numpy.random.seed()  # a fresh process's global numpy state is not its parent's
    code = _run_main(request["args"])
  finally:
    if code < 0:
      signal.signal(-code, signal.SIG_DFL)
      os.kill(os.getpid(), -code)
    os._exit(code)  # pylint: disable=protected-access


def _run_main(args):
  import atexit  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  code = 0
  try:
    if args[0] == "-m":
      sys.argv = [args[1], *args[2:]]
      sys.path.insert(0, os.getcwd())
      runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
      sys.argv = list(args)
      sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
      runpy.run_path(args[0], run_name="__main__")
  except SystemExit as e:
    code = _exit_code(e.code)
  except KeyboardInterrupt:
    traceback.print_exc()
    code = -signal.SIGINT  # Python ends by its own SIGINT then (exit status 130 in a shell)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  try:
    threading._shutdown()  # pylint: disable=protected-access
  except BaseException:  # pylint: disable=broad-except
    pass
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  import gc  # pylint: disable=g-import-not-at-top
  gc.collect()  # what interpreter shutdown would finalize (an unclosed file's buffer)
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  return code


def _exit_code(value):
  """The process's exit status for sys.exit(value), as Python's own exit computes it."""
  if value is None:
    return 0
  if isinstance(value, int):
    return value & 0xFF
  print(value, file=sys.stderr)
  return 1


def main(path):
  server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  server.bind(path + ".tmp")
  server.listen(16)
  os.rename(path + ".tmp", path)  # the path appears when connections are taken
  running = {}  # pid: connection
  while True:
    readable, _, _ = select.select([server, sys.stdin], [], [], 0.05)
    if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1024):
      for pid in running:  # the pytest worker is gone: so are its runs
        _kill_group(pid)
      os.remove(path)
      os.rmdir(os.path.dirname(path))
      return
    if server in readable:
      conn, _ = server.accept()
      request = json.loads(conn.makefile("r").readline())
      pid = os.fork()
      if pid == 0:
        server.close()
        conn.close()
        _run_child(request)
      conn.sendall(f"pid {pid}\n".encode())
      running[pid] = conn
    while running:
      pid, status = os.waitpid(-1, os.WNOHANG)
      if pid == 0:
        break
      conn = running.pop(pid, None)
      if conn is not None:
        try:
          conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
        except OSError:
          pass
        conn.close()


def _kill_group(pid):
  try:
    os.killpg(pid, signal.SIGKILL)
  except OSError:
    pass


if __name__ == "__main__":
  main(sys.argv[1])
