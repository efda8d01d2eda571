"""Reading inputs with errors that name the file and line, and writing outputs safely.

Every script reads user files through `read_lines` / `check_file` and writes every output through
`atomic_path` / `open_atomic` / `atomic_directory`, after `check_outputs` has refused any output
that is one of its inputs, so:
  - a bad input ends in one clear message (file, line, flag), never a traceback;
  - an interrupted run (an error, Ctrl-C, SIGTERM) never leaves a half-written file under its final
    name: outputs are written to an exclusively created temporary sibling and renamed when complete;
  - an input is never overwritten, and a directory is only replaced when it holds what we made.
(commands.run_main, every script's entry point, turns a `ReportedError`, an OS error and an
interruption into that one message and a non-zero exit.)
"""

import contextlib
import csv
import errno
import fcntl
import glob
import hashlib
import io
import json
import os
import re
import shutil
import stat
import sys
import tempfile

from absl import logging

from bert_tf2 import errors
from bert_tf2 import processes


# The reported errors and flag checks live in errors.py; these names stay until callers move.
ReportedError = errors.ReportedError
InputError = errors.InputError
require = errors.require
check_distinct = errors.check_distinct


def read_delimited(path, delimiter=",", quotechar='"', what="file"):
  """Rows of a quoted delimited file (csv module rules, strict) as (line number, fields) pairs,
  the line a row starts on; blank rows skipped. InputError naming the file and line for a
  malformed row, the byte for invalid UTF-8."""
  check_file(path, what)
  # The csv module refuses a field over 131,072 characters by default (a long document in a
  # valid file); the whole file is read into memory anyway, so its size is the only bound.
  csv.field_size_limit(sys.maxsize)
  rows = []
  try:
    with open_input(path, encoding="utf-8-sig", newline="") as f:
      reader = csv.reader(f, delimiter=delimiter, quotechar=quotechar, strict=True)
      start = 1
      for fields in reader:
        if fields:
          rows.append((start, fields))
        start = reader.line_num + 1
  except csv.Error as e:
    raise InputError(f"{path}:{start}: malformed row ({e})") from None
  except UnicodeDecodeError as e:
    raise InputError(f"{path}: invalid UTF-8 at byte {e.start}; re-encode the file as "
                     "UTF-8") from None
  return rows


# A URL's scheme: gs://, s3://, hdfs://, ram://.
_REMOTE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(path):
  """True for a path on a file system TensorFlow reaches by URL scheme (gs://, s3://, ram://):
  read and written through tf.io.gfile and object_store, never the local disk."""
  return bool(_REMOTE.match(os.fspath(path)))


def _first_line(error):
  text = (getattr(error, "message", None) or str(error)).strip()
  line = text.splitlines()[0] if text else type(error).__name__
  return line if len(line) <= 200 else line[:200] + "..."


def remote_problem(error, path):
  """What a tf.errors.OpError from `path`'s object store means, in words naming the fix."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  scheme = _REMOTE.match(os.fspath(path)).group(0)
  if isinstance(error, tf.errors.UnimplementedError):
    return (f"TensorFlow has no file system for {scheme} paths (gs:// is built in; s3://, "
            "hdfs:// and az:// come with `pip install tensorflow-io`)")
  if isinstance(error, tf.errors.PermissionDeniedError):
    return ("permission denied: the credentials in use may not access it (check "
            "GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`, and the "
            f"bucket's roles) ({_first_line(error)})")
  if isinstance(error, tf.errors.UnauthenticatedError):
    return ("no valid credentials (set GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth "
            f"application-default login`) ({_first_line(error)})")
  if isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError,
                        tf.errors.DeadlineExceededError, tf.errors.InternalError)) or (
                            "libcurl code" in str(error)):
    return ("the storage service could not be reached or kept failing after TensorFlow's "
            f"retries ({_first_line(error)})")
  if isinstance(error, tf.errors.NotFoundError):
    try:
      bucket = _bucket_missing(path)
    except (tf.errors.OpError, InputError):
      bucket = None
    if bucket:
      return f"the bucket {bucket} does not exist or is not visible to these credentials"
    return f"not found ({_first_line(error)})"
  return _first_line(error)


@contextlib.contextmanager
def remote_errors(path, what="file", label=None):
  """Turns a TensorFlow file-system error of the block into an InputError naming `what` and the
  remote `path` (or starting with `label`) and saying what it means (remote_problem)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  try:
    yield
  except tf.errors.OpError as e:
    raise InputError(f"{label or f'{what} {path}'}: {remote_problem(e, path)}") from None


def _gfile(path):
  """tf.io.gfile, with `path`'s scheme registered (object_store.register)."""
  from bert_tf2 import object_store  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  object_store.register(path)
  return object_store.tf.io.gfile


def _bucket_missing(path):
  """`gs://b` when the bucket of the missing `path` does not exist, else None."""
  root = _REMOTE.match(path).group(0) + path[len(_REMOTE.match(path).group(0)):].split("/")[0]
  return None if _gfile(path).isdir(root) else root


def exists(path, label=None):
  """os.path.exists, or for a remote path its object store's answer (an error names `label`, the
  flag that gave the path, when given)."""
  if is_remote(path):
    with remote_errors(path, label=label):
      return _gfile(path).exists(path)
  return os.path.exists(path)


def isdir(path):
  if is_remote(path):
    with remote_errors(path):
      return _gfile(path).isdir(path)
  return os.path.isdir(path)


def isfile(path):
  if is_remote(path):
    with remote_errors(path):
      return _gfile(path).exists(path) and not _gfile(path).isdir(path)
  return os.path.isfile(path)


def listdir(path):
  """Names in directory `path` (a remote one's without the trailing `/` of its prefixes)."""
  if is_remote(path):
    with remote_errors(path, "directory"):
      return [name.rstrip("/") for name in _gfile(path).listdir(path)]
  return os.listdir(path)


def makedirs(path):
  if is_remote(path):
    with remote_errors(path, "directory"):
      _gfile(path).makedirs(path)
  else:
    os.makedirs(path, exist_ok=True)


def remove(path):
  """Removes the file `path` (local or remote)."""
  if is_remote(path):
    with remote_errors(path):
      _gfile(path).remove(path)
  else:
    os.remove(path)


def size(path):
  """os.path.getsize, or a remote file's length."""
  if is_remote(path):
    with remote_errors(path):
      return _gfile(path).stat(path).length
  return os.path.getsize(path)


def glob_files(pattern):
  """glob.glob, or for a remote pattern tf.io.gfile.glob."""
  if is_remote(pattern):
    with remote_errors(pattern):
      return _gfile(pattern).glob(pattern)
  return glob.glob(pattern)


def prefix_files(prefix, label=None):
  """The files named `prefix`.* (a checkpoint prefix's index and data files, its .meta); a remote
  error names `label` (the flag that gave the prefix) when given, not the pattern."""
  pattern = escape(prefix) + ".*"
  if is_remote(prefix):
    with remote_errors(prefix, label=label):
      return _gfile(prefix).glob(pattern)
  return glob.glob(pattern)


def escape(path):
  """glob.escape for a local path; a remote path as it is (gfile's patterns take `*` and `?`,
  which object names of ours do not hold)."""
  return path if is_remote(path) else glob.escape(path)


def copy_file(source, target):
  """Copies the file `source` to `target` (either may be remote), replacing it."""
  if is_remote(source) or is_remote(target):
    with remote_errors(target if is_remote(target) else source):
      _gfile(target if is_remote(target) else source).copy(source, target, overwrite=True)
  else:
    shutil.copyfile(source, target)


def remove_tree(path):
  """Removes the directory `path` and everything in it, if there (local or remote)."""
  if is_remote(path):
    with remote_errors(path, "directory"):
      if _gfile(path).exists(path):
        _gfile(path).rmtree(path)
  else:
    shutil.rmtree(path, ignore_errors=True)


def real_path(path):
  """os.path.realpath, or a remote path in its compared form."""
  return _remote_key(path) if is_remote(path) else os.path.realpath(path)


def absolute(path):
  """os.path.abspath for a local path; a remote one as compared (it has no working directory)."""
  return _remote_key(path) if is_remote(path) else os.path.abspath(path)


def parent(path):
  """The directory holding `path` (os.path.dirname of its absolute form, or the remote prefix)."""
  return _remote_key(path).rsplit("/", 1)[0] if is_remote(path) else os.path.dirname(
      os.path.abspath(path))


def open_input(path, mode="r", encoding="utf-8", newline=None):
  """`open` for reading a local file, or a remote one through tf.io.gfile (read whole for text,
  so that `encoding` and `newline` keep open's meaning)."""
  if not is_remote(path):
    if "b" in mode:
      return open(path, mode)  # pylint: disable=unspecified-encoding
    return open(path, mode, encoding=encoding, newline=newline)
  with remote_errors(path):
    handle = _gfile(path).GFile(path, "rb")
    if "b" in mode:
      return handle
    with handle:
      data = handle.read()
  return io.TextIOWrapper(io.BytesIO(data), encoding=encoding, newline=newline)


def check_file(path, what="file"):
  """Raises InputError unless `path` is a readable regular file (or a remote object)."""
  if not path:
    raise InputError(f"no {what} given")
  if is_remote(path):
    with remote_errors(path, what):
      gfile = _gfile(path)
      if not gfile.exists(path):
        bucket = _bucket_missing(path)
        if bucket:
          raise InputError(f"{what} not found: {path} (the bucket {bucket} does not exist or is "
                           "not visible to these credentials)")
        raise InputError(f"{what} not found: {path}")
      if gfile.isdir(path):
        raise InputError(f"{what} is not a regular file: {path} (a directory)")
    return path
  if not os.path.exists(path):
    raise InputError(f"{what} not found: {path}")
  if not os.path.isfile(path):
    raise InputError(f"{what} is not a regular file: {path}")
  if not os.access(path, os.R_OK):
    raise InputError(f"{what} is not readable: {path}")
  return path


def expand_file_patterns(patterns, what="input file"):
  """Comma-separated paths and glob patterns -> sorted-per-pattern list of files.

  A path that exists is taken literally (a file named `data[1].txt` is that file, not a pattern).
  Each pattern that matches nothing is an error naming it, as a silent empty input would hide a
  typo until training starts.
  """
  files = []
  for pattern in (p.strip() for p in patterns.split(",")):
    if not pattern:
      continue
    if is_remote(pattern):
      with remote_errors(pattern, what):
        gfile = _gfile(pattern)
        matches = [pattern] if gfile.exists(pattern) else sorted(gfile.glob(pattern))
    else:
      matches = [pattern] if os.path.lexists(pattern) else sorted(glob.glob(pattern))
    if not matches:
      raise InputError(f"{what} pattern matches no file: {pattern}")
    files.extend(check_file(m, what) for m in matches)
  if not files:
    raise InputError(f"no {what} given")
  return files


def read_lines(path, opener=None, span=None):
  """Yields (line_number, text) for a UTF-8 text file, line endings stripped.

  Invalid UTF-8 is rejected rather than silently altered: the error names the file, the line and
  the byte offset so the user can fix or re-encode the source. A UTF-8 byte-order mark at the start
  of the file is dropped (the GLUE MRPC files carry one). `opener(path)`, when given, opens the
  file for binary reading from elsewhere than the local file system (a Beam worker reads gs://
  paths through Beam's file systems). `span`, when given, is (start byte, its line number, end
  byte) of whole lines to read, and each line comes as (line_number, text, the byte after it).
  """
  if opener is None:
    check_file(path)
    if is_remote(path):
      with remote_errors(path):
        yield from read_lines(path, lambda p: _gfile(p).GFile(p, "rb"), span)
      return
  start, first_line, stop = span or (0, 1, None)
  with open(path, "rb") if opener is None else opener(path) as f:
    if start:
      f.seek(start)
    offset = start
    for number, raw in enumerate(f, start=first_line):
      if stop is not None and offset >= stop:
        break
      offset += len(raw)
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise InputError(f"{path}:{number}: invalid UTF-8 at byte {e.start} of the line "
                         f"({raw[e.start:e.start + 4]!r}); re-encode the file as UTF-8") from None
      if number == 1 and text.startswith("\ufeff"):
        text = text[1:]
      text = text.rstrip("\r\n")
      yield (number, text) if span is None else (number, text, offset)


def _unique_keys(pairs):
  """json object hook: a key given twice is an error (json.load would keep the last silently)."""
  result = {}
  for key, value in pairs:
    if key in result:
      raise InputError(f"{key!r} appears more than once")
    result[key] = value
  return result


def load_json(path, what, unique_keys=False):
  """The JSON content of `path`; InputError naming the file (and line) when it is not JSON, or,
  with `unique_keys`, when an object repeats a key (a question id given twice)."""
  check_file(path, what)
  try:
    with open_input(path, encoding="utf-8-sig") as f:
      return json.load(f, object_pairs_hook=_unique_keys if unique_keys else None)
  except InputError as e:
    raise InputError(f"{path}: {what}: {e}") from None
  except json.JSONDecodeError as e:
    raise InputError(f"{path}:{e.lineno}: {what} is not valid JSON ({e.msg}, column "
                            f"{e.colno})") from None
  except UnicodeDecodeError as e:
    raise InputError(f"{path}: {what} is not UTF-8 (byte {e.start})") from None



# --- Outputs: never an input, never what is not ours ---------------------------------------------


def _same(a, b):
  """True when paths `a` and `b` name the same file (after symlinks; hard links included)."""
  if os.path.realpath(a) == os.path.realpath(b):
    return True
  try:
    return os.path.samefile(a, b)
  except OSError:
    return False


def _inside(path, directory):
  real, top = os.path.realpath(path), os.path.realpath(directory)
  return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _flat(named_paths):
  """[(flag, path or list of paths or None)] -> [(flag, path)] without the empty ones."""
  out = []
  for flag, paths in named_paths:
    for path in ([paths] if isinstance(paths, (str, os.PathLike)) else paths or ()):
      if path:
        out.append((flag, os.fspath(path)))
  return out


def check_outputs(files=(), inputs=(), directories=(), replaced_directories=()):
  """Refuses outputs that would destroy an input or cannot be written, before any work is done.

  Each argument is a list of (flag name, path or list of paths):
    files: output files (written under a temporary name, then renamed onto the path);
    inputs: every file or directory the run reads;
    directories: output directories the run writes files into (existing content is kept);
    replaced_directories: output directories the run replaces as a whole.
  Raises InputError naming the flag and path when an output file is an input or an existing
  directory, two outputs are one file, an output directory is an input or an existing file (or
  holds an input, for a replaced one), or an output's parent cannot be made or written.
  """
  files, inputs = _flat(files), _flat(inputs)
  directories, replaced = _flat(directories), _flat(replaced_directories)
  _check_remote_outputs(files, inputs, directories, replaced)
  remote_inputs = [(flag, path) for flag, path in inputs if is_remote(path)]
  files, inputs = _local(files), _local(inputs)
  directories, replaced = _local(directories), _local(replaced)
  # The stale-temporary sweep before each write never removes one of these (_is_input).
  _INPUTS.extend(_remote_key(path) for _, path in remote_inputs)
  _INPUTS.extend(os.path.realpath(path) for _, path in inputs if os.path.lexists(path))
  for flag, path in files:
    for in_flag, in_path in inputs:
      if os.path.exists(in_path) and _same(path, in_path):
        raise InputError(f"--{flag}={path} is the input given by --{in_flag}={in_path}; "
                         "refusing to overwrite an input (choose another output path)")
    if os.path.isdir(path):
      raise InputError(f"--{flag}={path} is an existing directory; give a file path")
    if os.path.exists(path) and not os.path.isfile(path):
      raise InputError(f"--{flag}={path} exists and is not a regular file (a device, FIFO or "
                       "socket); refusing to replace it")
    _check_parent(flag, path)
    _check_name_length(flag, path)
  for i, (flag, path) in enumerate(files):
    for other_flag, other in files[:i]:
      if os.path.abspath(path) == os.path.abspath(other) or (
          os.path.exists(path) and _same(path, other)):
        raise InputError(f"--{flag}: the output {path} is given twice (also by --{other_flag})")
  for flag, path in directories + replaced:
    if os.path.lexists(path) and not os.path.isdir(path):
      raise InputError(f"--{flag}={path} exists and is not a directory")
    for in_flag, in_path in inputs:
      if os.path.exists(in_path) and os.path.isfile(in_path) and _same(path, in_path):
        raise InputError(f"--{flag}={path} is the input given by --{in_flag}")
    _check_parent(flag, path, directory=path)
  for flag, path in replaced:
    for in_flag, in_path in inputs:
      if os.path.exists(in_path) and (_inside(in_path, path) or _inside(path, in_path)):
        raise InputError(f"--{flag}={path} would replace a directory holding the input "
                         f"--{in_flag}={in_path}; choose another output directory")


def _local(named_paths):
  return [(flag, path) for flag, path in named_paths if not is_remote(path)]


def _remote_key(path):
  """A remote path as compared with others: no trailing `/`, `//` collapsed after the scheme."""
  scheme = _REMOTE.match(path).group(0)
  return scheme + re.sub("/+", "/", path[len(scheme):]).rstrip("/")


def _remote_inside(path, directory):
  path, directory = _remote_key(path), _remote_key(directory)
  return path == directory or path.startswith(directory + "/")


_PROBED = set()


def _check_remote_outputs(files, inputs, directories, replaced):
  """check_outputs for the remote outputs: the same refusals, compared by name (an object store
  has no links), and each output's directory proven writable by writing and removing a probe
  object there, so that a missing bucket, a denied permission or an unreachable service is one
  error before any work."""
  remote_inputs = [(flag, path) for flag, path in inputs if is_remote(path)]
  # The output directories first: a missing bucket or a denied permission is then named by the
  # directory flag's own value, not by a file name the script appends to it.
  for flag, path in directories + replaced:
    if not is_remote(path):
      continue
    label = f"--{flag}={path}"
    for in_flag, in_path in remote_inputs:
      if _remote_key(path) == _remote_key(in_path) and isfile(in_path):
        raise InputError(f"--{flag}={path} is the input given by --{in_flag}")
    with remote_errors(path, label=label):
      if _gfile(path).exists(path) and not _gfile(path).isdir(path):
        raise InputError(f"--{flag}={path} exists and is not a directory")
    _probe_writable(flag, path, _remote_key(path))
  remote_files = [(flag, path) for flag, path in files if is_remote(path)]
  for i, (flag, path) in enumerate(remote_files):
    for in_flag, in_path in remote_inputs:
      if _remote_key(path) == _remote_key(in_path):
        raise InputError(f"--{flag}={path} is the input given by --{in_flag}={in_path}; "
                         "refusing to overwrite an input (choose another output path)")
    for other_flag, other in remote_files[:i]:
      if _remote_key(path) == _remote_key(other):
        raise InputError(f"--{flag}: the output {path} is given twice (also by --{other_flag})")
    if isdir(path):
      raise InputError(f"--{flag}={path} is an existing directory; give a file path")
    _probe_writable(flag, path, _remote_key(path).rsplit("/", 1)[0])
  for flag, path in replaced:
    for in_flag, in_path in remote_inputs:
      if is_remote(path) and (_remote_inside(in_path, path) or _remote_inside(path, in_path)):
        raise InputError(f"--{flag}={path} would replace a directory holding the input "
                         f"--{in_flag}={in_path}; choose another output directory")


def _probe_writable(flag, path, directory):
  if directory in _PROBED:
    return
  from bert_tf2 import object_store  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  probe = object_store.temporary_name(directory + "/x", ".probe")
  with remote_errors(path, label=f"--{flag}={path}"):
    gfile = _gfile(path)
    try:
      with gfile.GFile(probe, "w") as f:
        f.write("")
    except object_store.tf.errors.NotFoundError:
      bucket = _bucket_missing(path)
      if bucket:
        raise InputError(f"--{flag}={path}: the bucket {bucket} does not exist or is not "
                         "visible to these credentials") from None
      raise
    gfile.remove(probe)
  _PROBED.add(directory)


def _check_name_length(flag, path):
  """InputError for a file name longer than its file system takes (found at the final rename,
  after all the work, otherwise)."""
  name = os.fsencode(os.path.basename(os.fspath(path)))
  probe = os.path.dirname(os.path.abspath(path))
  while not os.path.isdir(probe):
    probe = os.path.dirname(probe)
  try:
    limit = os.pathconf(probe, "PC_NAME_MAX")
  except (OSError, ValueError):
    limit = 255
  if len(name) > limit:
    raise InputError(f"--{flag}={path}: the file name is {len(name)} bytes, over the {limit} "
                     "its file system takes")


def _check_parent(flag, path, directory=None):
  """InputError unless the parent directory of `path` exists and is writable, or can be made:
  its nearest existing ancestor is a writable directory. Nothing is created here (the writers
  make the directories they need), so a run refused later leaves no empty directory behind."""
  # `newdir/../out`: the system resolves `..` only through a directory that exists (abspath
  # would drop the missing one, and the run would fail only at its end).
  # (An output directory is made with os.makedirs, which makes the missing one too.)
  parts = [] if directory else os.fspath(path).split(os.sep)
  for i in range(1, len(parts)):
    prefix = os.sep.join(parts[:i])
    if parts[i] != ".." or not prefix or os.path.basename(prefix) in ("..", "."):
      continue
    if not os.path.isdir(prefix):
      raise InputError(f"--{flag}={path}: {prefix} is not an existing directory, so "
                       f"{prefix}/.. cannot be followed; give the path without it")
  probe = os.path.abspath(directory or os.path.dirname(os.path.abspath(path)))
  while not os.path.lexists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise InputError(f"--{flag}={path}: {probe} is not a directory")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise InputError(f"--{flag}={path}: the directory {probe} is not writable")


def file_signature(path):
  """[real path, size, mtime in ns] of an input, for the key of an output derived from it (hashing
  the file would cost about as much as the conversion a reuse saves)."""
  if is_remote(path):
    with remote_errors(path, "input"):
      status = _gfile(path).stat(path)
    return [_remote_key(path), status.length, status.mtime_nsec]
  status = os.stat(path)
  return [os.path.realpath(path), status.st_size, status.st_mtime_ns]


def build_unless_current(path, key, build):
  """Calls `build()` to (re)write the derived file `path` unless its sidecar `PATH.key.json`
  holds `key` (a JSON description of every input and setting it was made from). The sidecar is
  removed before building and written after, so a stopped run never leaves a key beside records
  it does not describe. Returns whether it built."""
  import json  # pylint: disable=g-import-not-at-top
  key_file = path + ".key.json"
  key = json.loads(json.dumps(key))
  if isfile(path):
    try:
      with open_input(key_file) as f:
        if json.load(f) == key:
          logging.info("Reusing %s: made from the same inputs and settings", path)
          return False
    except (OSError, ValueError, InputError):
      pass
  if (exists if is_remote(key_file) else os.path.lexists)(key_file):
    remove(key_file)
  build()
  with open_atomic(key_file) as f:
    json.dump(key, f, indent=1, sort_keys=True)
  return True


@contextlib.contextmanager
def naming_output(path):
  """Gives an OSError of the block that names no file, or a temporary of output `path`, the name
  `path`: a write failing for a full disk or a file size limit (ENOSPC, EFBIG, EDQUOT) then says
  which output could not be written."""
  try:
    yield
  except OSError as e:
    name = os.path.basename(os.fspath(e.filename)) if e.filename is not None else None
    # The stem of this output's temporaries (shortened with a digest for a very long name).
    stem = _temporary_stem(os.fspath(path))[1]
    if e.errno is None or not (name is None or name.startswith(f"{stem}.tmp-")):
      raise
    raise OSError(e.errno, e.strerror, os.fspath(path)) from None


@contextlib.contextmanager
def no_new_empty_directories(*paths):
  """When the block ends, however it ends, removes those of `paths` and their parents that did
  not exist on entry and are still empty. check_outputs makes an output's parents (proving they
  can be made), so around it a run leaves no empty directory under an output's name: at once for
  a directory replaced later (atomic_directory), or when the run fails before writing."""
  new = []
  for path in paths:
    if is_remote(path):
      continue  # an object store has no empty directories to leave
    path = os.path.abspath(path)
    while not os.path.lexists(path):
      new.append(path)
      path = os.path.dirname(path)
  try:
    yield
  finally:
    for path in sorted(set(new), key=len, reverse=True):
      with contextlib.suppress(OSError):
        if os.listdir(path) == [".lock"]:
          _release_lock(path)  # the lock this run took on a directory it leaves empty
        os.rmdir(path)  # only an empty one


# --- Temporaries ---------------------------------------------------------------------------------


def _umask():
  mask = os.umask(0)
  os.umask(mask)
  return mask


_UMASK = _umask()


_INPUTS = []  # real paths of every input check_outputs was given in this process

# mkstemp / mkdtemp's random part: 8 characters of [a-z0-9_].
_RANDOM = r"[a-z0-9_]{8}"


def _temporary_stem(path):
  """(directory, the name temporaries of `path` start with, before `.tmp-`): `.NAME`, or for a
  name too long to take the suffix within the file system's 255 bytes, a shortened name with a
  digest of the whole one."""
  if is_remote(path):
    directory, base = _remote_key(path).rsplit("/", 1)
  else:
    directory, base = os.path.split(os.path.abspath(path))
  if len(os.fsencode(base)) > 200:
    digest = hashlib.sha1(os.fsencode(base)).hexdigest()[:16]
    base = os.fsdecode(os.fsencode(base)[:100]).rstrip("\ufffd") + "~" + digest
  return directory, "." + base


def _temporary_prefix(path):
  """Hidden sibling of `path` named after it and this process: `.NAME.tmp-PID-`."""
  directory, stem = _temporary_stem(path)
  return directory, f"{stem}.tmp-{os.getpid()}-"


def temporary_prefix(path):
  """The name prefix of this process's temporaries of `path` (for tempfile's `prefix=`, in
  `path`'s directory): remove_stale_temporaries sweeps what a killed process left under it."""
  return _temporary_prefix(path)[1]


def _is_input(path):
  real = _remote_key(path) if is_remote(path) else os.path.realpath(path)
  return any(real == i or i.startswith(real.rstrip(os.sep) + os.sep) for i in _INPUTS)


# What a temporary of ours is named after its stem (`.NAME`): atomic_path's and
# atomic_directory's `.tmp-PID-` + mkstemp's random part (+ `.old`, a directory moved aside), and
# a Beam job's `.tmp-beam-PID-` + 16 hex digits (+ `.pieces`, its directory of pieces).
_TEMPORARY = re.compile(r"(?P<stem>\..+?)\.tmp-(?:(?P<pid>\d+)-" + _RANDOM + r"(?:\.old)?"
                        r"|beam-(?P<beam_pid>\d+)-[0-9a-f]{16}(?:\.pieces)?)")


def remove_stale_temporaries(paths):
  """Removes the temporaries of the outputs `paths` left by processes that no longer run (killed
  with SIGKILL): exactly the names this project creates (_TEMPORARY), of a dead process, owned by
  this user, and never an input of this run, so that a user's file that merely looks like one
  survives. Each directory is listed once, however many outputs it holds (thousands of shards
  cost one listing, not one each)."""
  stems = {}
  for path in paths:
    directory, stem = _temporary_stem(path)
    stems.setdefault(directory, set()).add(stem)
  for directory, names in stems.items():
    if is_remote(directory):
      # pylint: disable-next=g-import-not-at-top,import-outside-toplevel
      from bert_tf2 import object_store
      with remote_errors(directory, "directory"):
        object_store.remove_stale_temporaries(directory, names, keep=_is_input)
      continue
    try:
      entries = os.listdir(directory)
    except OSError:
      continue
    for entry in entries:
      match = _TEMPORARY.fullmatch(entry)
      if not match or match.group("stem") not in names:
        continue
      pid = int(match.group("pid") or match.group("beam_pid"))
      if pid == os.getpid() or processes.alive(pid):
        continue
      stale = os.path.join(directory, entry)
      try:
        if os.lstat(stale).st_uid != os.getuid() or _is_input(stale):
          continue
      except OSError:
        continue
      remove_path(stale)


def remove_path(path):
  """Removes a file, symlink or directory tree at `path`, if there (for leftovers of a run)."""
  if is_remote(path):
    with contextlib.suppress(InputError):
      if isdir(path):
        remove_tree(path)
      elif exists(path):
        remove(path)
    return
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    with contextlib.suppress(OSError):
      os.remove(path)


@contextlib.contextmanager
def atomic_path(path, sweep=True):
  """Yields a temporary path beside `path`; renames it onto `path` only if the block succeeds.

  The temporary file is a hidden sibling (so the rename stays on one file system and is atomic),
  created exclusively (a file or symlink planted at a predictable name cannot redirect the write),
  and removed when the block raises or is interrupted, so a failed run leaves the old output (or
  nothing). The result gets the permissions of an ordinary new file (0666 less the umask).
  Temporaries of `path` that a killed run left are removed first, unless `sweep` is False (the
  caller has called remove_stale_temporaries for all its outputs at once).
  """
  if is_remote(path):
    with _remote_atomic_path(path, sweep) as tmp:
      yield tmp
    return
  directory, prefix = _temporary_prefix(path)
  os.makedirs(directory, exist_ok=True)
  if sweep:
    remove_stale_temporaries([path])
  fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
  os.close(fd)
  try:
    with naming_output(path):  # a full disk while the block writes names the output
      yield tmp
    os.chmod(tmp, 0o666 & ~_UMASK)
    try:
      os.replace(tmp, path)
    except OSError as e:  # named after the output, not our hidden temporary (e.g. an output
      # through a missing `newdir/../`, or a name over the file system's limit)
      raise OSError(e.errno, e.strerror, os.fspath(path)) from None
  finally:
    if os.path.lexists(tmp):
      os.remove(tmp)


@contextlib.contextmanager
def _remote_atomic_path(path, sweep):
  """atomic_path for a remote `path`: the block writes a local temporary (named as a temporary of
  `path`, so that naming_output names `path` when the local disk is full), which is then uploaded
  so that `path` appears whole or not at all (object_store.publish_file)."""
  from bert_tf2 import object_store  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  if sweep:
    remove_stale_temporaries([path])
  stem = _temporary_stem(path)[1]
  fd, tmp = tempfile.mkstemp(prefix=f"{stem}.tmp-{os.getpid()}-")
  os.close(fd)
  try:
    yield tmp
    with remote_errors(path, "output"):
      object_store.publish_file(tmp, path, stem)
  finally:
    with contextlib.suppress(OSError):
      os.remove(tmp)


@contextlib.contextmanager
def open_atomic(path, mode="w", **kwargs):
  """`open` for writing whose result appears under `path` only once the block has succeeded."""
  if "b" not in mode:
    kwargs.setdefault("encoding", "utf-8")
  with atomic_path(path) as tmp:
    with open(tmp, mode, **kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_directory(path, replaceable=None, overwrite=False, flag="output"):
  """Yields an exclusively created temporary directory beside `path`; when the block succeeds,
  it replaces `path` (an existing directory is moved aside, then deleted once the new one is in).

  An existing `path` is replaced only if `replaceable(path)` says it holds what this program
  writes (e.g. a SavedModel), or `overwrite` is set; anything else there is an InputError, so a
  user's directory is never deleted. The result gets ordinary permissions (0777 / 0666 less the
  umask), readable by a serving process under another user. A second run writing the same
  `path` while this one does is refused (writer_lock), on the local disk and on an object store.
  """
  if is_remote(path):
    with writer_lock(path, flag), _remote_atomic_directory(path, replaceable, overwrite,
                                                           flag) as staging:
      yield staging
    return
  path = os.path.abspath(path)
  with writer_lock(path, flag), _local_atomic_directory(path, replaceable, overwrite,
                                                         flag) as staging:
    yield staging


@contextlib.contextmanager
def writer_lock(path, flag="output"):
  """One writer at a time for the output `path`: an exclusive flock on its hidden sibling
  `.NAME.lock`, removed when the block ends. A second run writing the same output is refused in
  one line instead of both succeeding, the last silently replacing the first (two exports, two
  vocabulary extensions into one folder). The kernel releases the lock however the process ends;
  a `.lock` left by a killed run is taken over (flock is free on it). Re-entrant within a process:
  a script may hold it for its whole run around atomic_directory, which takes it too. A remote
  path's lock is the object `.NAME.lock` beside it (object_store.Lock, as lock_directory's)."""
  directory, stem = _temporary_stem(path)
  lock_path = (directory + "/" if is_remote(path) else os.path.join(directory, "")) + stem + ".lock"
  if lock_path in _WRITER_LOCKS:
    yield
    return
  if is_remote(path):
    with _remote_writer_lock(path, flag, directory, stem + ".lock"):
      _WRITER_LOCKS.add(lock_path)
      try:
        yield
      finally:
        _WRITER_LOCKS.discard(lock_path)
    return
  os.makedirs(directory, exist_ok=True)
  while True:
    fd = _flocked(lock_path, f"--{flag}={path}: {lock_path}")
    if fd is None:
      raise InputError(f"--{flag}={path} is being written by another run (it holds "
                       f"{lock_path}); wait for it to finish or choose another directory")
    # The holder before us removes the file before it lets go: a lock taken on a removed file
    # guards nothing, so take the one at the path now.
    try:
      same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
      same = False
    if same:
      break
    os.close(fd)
  _WRITER_LOCKS.add(lock_path)
  try:
    yield
  finally:
    _WRITER_LOCKS.discard(lock_path)
    with contextlib.suppress(OSError):
      os.remove(lock_path)
    os.close(fd)


_WRITER_LOCKS = set()


@contextlib.contextmanager
def _remote_writer_lock(path, flag, directory, name):
  """writer_lock on an object store: the lock object `name` in `directory`, held (rewritten every
  30 s) until the block ends; another live run's is an InputError naming it."""
  from bert_tf2 import object_store  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  with remote_errors(path, label=f"--{flag}={path}"):
    try:
      lock = object_store.Lock(directory, name).acquire()
    except object_store.LockHeld as e:
      raise InputError(f"--{flag}={path} is being written by another run ({e}: its "
                       f"{directory}/{name} object); wait for it to finish or choose another "
                       "directory (a lock left by a killed run on another machine expires after "
                       f"{object_store.STALE_LOCK} s)") from None
  try:
    yield
  finally:
    lock.release()


@contextlib.contextmanager
def _local_atomic_directory(path, replaceable, overwrite, flag):
  if os.path.lexists(path) and not overwrite:
    if not os.path.isdir(path) or os.path.islink(path):
      raise InputError(f"--{flag}={path} exists and is not a directory; refusing to replace it")
    if os.listdir(path) and not (replaceable and replaceable(path)):
      raise InputError(f"--{flag}={path} exists and does not hold an earlier output of this "
                       "program; refusing to delete it (choose a new directory, or pass "
                       "--overwrite to replace it)")
  directory, prefix = _temporary_prefix(path)
  os.makedirs(directory, exist_ok=True)
  remove_stale_temporaries([path])
  staging = tempfile.mkdtemp(prefix=prefix, dir=directory)
  old = None
  try:
    try:
      yield staging
    except OSError as e:
      # A full disk while the block writes names the output folder (and the file in it), not a
      # hidden staging folder, nor nothing (a write() names no file).
      inside = os.fspath(e.filename) if e.filename is not None else None
      if e.errno is None or not (inside is None or inside.startswith(staging + os.sep)
                                 or inside == staging):
        raise
      where = path if inside in (None, staging) else os.path.join(
          path, os.path.relpath(inside, staging))
      raise OSError(e.errno, e.strerror, where) from None
    _ordinary_permissions(staging)
    if os.path.lexists(path):
      old = tempfile.mkdtemp(prefix=prefix, suffix=".old", dir=directory)
      os.rmdir(old)
      os.replace(path, old)
    try:
      os.replace(staging, path)
    except OSError as e:
      if old:
        os.replace(old, path)  # the earlier output back in place
        old = None
      raise OSError(e.errno, e.strerror, path) from None
  finally:
    if os.path.lexists(staging):
      shutil.rmtree(staging, ignore_errors=True)
    if old and os.path.lexists(old):
      if os.path.isdir(old) and not os.path.islink(old):
        shutil.rmtree(old, ignore_errors=True)
      else:
        os.remove(old)


@contextlib.contextmanager
def _remote_atomic_directory(path, replaceable, overwrite, flag):
  """atomic_directory for a remote `path`: the same refusals, a local staging directory, then
  object_store.publish_directory (the files at its top appear last)."""
  from bert_tf2 import object_store  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  with remote_errors(path, label=f"--{flag}={path}"):
    if not overwrite and exists(path):
      if isfile(path):
        raise InputError(f"--{flag}={path} exists and is not a directory; refusing to replace it")
      if listdir(path) and not (replaceable and replaceable(path)):
        raise InputError(f"--{flag}={path} exists and does not hold an earlier output of this "
                         "program; refusing to delete it (choose a new directory, or pass "
                         "--overwrite to replace it)")
    remove_stale_temporaries([path])
  stem = _temporary_stem(path)[1]
  staging = tempfile.mkdtemp(prefix=f"{stem}.tmp-{os.getpid()}-")
  try:
    yield staging
    with remote_errors(path, label=f"--{flag}={path}"):
      object_store.publish_directory(staging, path, stem)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def _ordinary_permissions(top):
  os.chmod(top, 0o777 & ~_UMASK)
  for root, dirs, files in os.walk(top):
    for name in dirs:
      os.chmod(os.path.join(root, name), 0o777 & ~_UMASK)
    for name in files:
      os.chmod(os.path.join(root, name), 0o666 & ~_UMASK)


# --- One run at a time in a directory ------------------------------------------------------------


def _flocked(lock_path, label):
  """The descriptor of `lock_path` (created if absent) with an exclusive flock taken, or None when
  another process holds it. Never through a symlink, and only a plain file of its own name: a lock
  file planted as a link to another file (an input) would otherwise be written or removed.
  `label` names the file in the InputError for those."""
  try:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise InputError(f"{label} is a symbolic link; refusing to use it (remove it)") from None
    raise
  status = os.fstat(fd)
  if not (stat.S_ISREG(status.st_mode) and status.st_nlink == 1):
    os.close(fd)
    raise InputError(f"{label} is not a plain file of its own (a hard link or a special file); "
                     "refusing to use it (remove it)")
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    os.close(fd)
    if e.errno in (errno.EAGAIN, errno.EACCES):
      return None
    raise
  return fd


def lock_directory(path, flag="output_dir"):
  """Takes an exclusive lock on directory `path` for the life of the process (a `.lock` file
  locked with flock, released by the kernel however the process ends); InputError naming the
  directory when another run holds it. Returns the open lock file (keep a reference). A remote
  directory's lock is an object (object_store.Lock), released at exit."""
  if is_remote(path):
    return _lock_remote(path, flag)
  os.makedirs(path, exist_ok=True)
  lock_path = os.path.join(path, ".lock")
  fd = _flocked(lock_path, f"--{flag}={path}: its .lock")
  if fd is None:
    raise InputError(f"--{flag}={path} is in use by another run (its .lock is held); wait for "
                     "it to finish or choose another directory")
  lock = os.fdopen(fd, "r+", encoding="utf-8")
  lock.seek(0)
  lock.truncate()
  lock.write(f"{os.getpid()}\n")
  lock.flush()
  _LOCKS.append((os.path.realpath(lock_path), lock))
  return lock


_LOCKS = []


def _lock_remote(path, flag):
  import atexit  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from bert_tf2 import object_store  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  with remote_errors(path, label=f"--{flag}={path}"):
    try:
      lock = object_store.Lock(path).acquire()
    except object_store.LockHeld as e:
      raise InputError(f"--{flag}={path} is in use by another run ({e}: its .lock object); wait "
                       "for it to finish or choose another directory (a lock left by a killed "
                       f"run on another machine expires after {object_store.STALE_LOCK} s)"
                       ) from None
  atexit.register(lock.release)
  return lock


def _release_lock(directory):
  """Removes the `.lock` this process holds on `directory` (none other)."""
  path = os.path.realpath(os.path.join(directory, ".lock"))
  for entry in list(_LOCKS):
    if entry[0] == path:
      os.remove(path)
      entry[1].close()
      _LOCKS.remove(entry)


def descendants(root=None):
  """Ids of the processes `root` (default: this one) started, and theirs, from /proc (empty
  where there is no /proc). /proc/PID/task/TID/children is absent on kernels built without
  CONFIG_PROC_CHILDREN, so the tree comes from every process's parent id."""
  parents = {}
  for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
    if entry.isdigit():
      with contextlib.suppress(OSError, IndexError, ValueError):
        with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
          parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
  found, frontier = set(), [os.getpid() if root is None else root]
  while frontier:
    parent = frontier.pop()
    children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
    found.update(children)
    frontier.extend(children)
  return found
