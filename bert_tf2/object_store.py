"""Files on an object store (gs://, and s3://, hdfs://... where a plugin registers them), read and
written through tf.io.gfile with the promises fileio keeps on a local disk.

An object store has no atomic rename (GCS renames by copy, then delete), no directories (a
"directory" is a name prefix) and no flock, so the local mechanisms are rebuilt here:
  - A file appears whole or not at all: it is written to a local temporary, uploaded to a hidden
    temporary object beside its final name (`.NAME.tmp-PID-RANDOM@HOST`), then copied onto the final
    name by the service (an object becomes visible only once complete) and the temporary deleted.
    A run killed midway leaves at most the temporary object, never a part under the final name.
  - A directory (an export, best/) is staged locally, uploaded under a temporary prefix, and its
    objects are then renamed into place, the files at its top last and a SavedModel's
    saved_model.pb or a checkpoint state file the very last, so a reader that opens it by those
    never sees a part of it. There is
    no moment-free swap of a whole prefix: an earlier output there is removed once the new one is
    uploaded, just before the renames.
  - One run per output directory: a `.lock` object holding the owner (host, process, a random
    token). A run writes it only when absent or stale, waits, and reads it back: if another run
    wrote in between, the later writer holds it and the other is refused. The owner rewrites it
    every HEARTBEAT seconds; it is stale when its process is gone (same host) or it has not been
    rewritten for STALE_LOCK seconds.
  - Temporaries of runs killed with SIGKILL are swept before a write: those of a dead process on
    this host at once, those of another host once STALE_TEMPORARY seconds old.
Transient failures (timeouts, 5xx, 429) are retried by TensorFlow's own GCS client (its
GCS_RETRY_CONFIG_* settings); everything here raises tf.errors.OpError for fileio to report.
"""

import contextlib
import os
import posixpath
import re
import socket
import threading
import time
import uuid

import tensorflow as tf

from bert_tf2 import processes

HEARTBEAT = 30  # seconds between rewrites of a held lock
STALE_LOCK = 180  # not rewritten for this long (6 heartbeats): its run is gone
SETTLE = 1.0  # seconds between writing a lock and reading it back
STALE_TEMPORARY = 24 * 3600  # another host's temporary this old is a leftover

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_HOST = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"
# A temporary of ours on an object store (the stem is `.NAME`, see fileio._temporary_stem).
TEMPORARY = re.compile(r"(?P<stem>\..+?)\.tmp-(?P<pid>\d+)-[a-z0-9]{8}@(?P<host>[A-Za-z0-9.-]+)")


def scheme(path):
  """`gs` for `gs://bucket/x`; None for a local path."""
  match = _SCHEME.match(os.fspath(path))
  return match.group(1).lower() if match else None


def register(path):
  """Makes sure TensorFlow has a file system for `path`'s scheme: gs:// is built in; s3://,
  hdfs://, az:// come from the tensorflow-io plugin, imported here when installed. Raises
  tf.errors.UnimplementedError (fileio names what to install) otherwise."""
  name = scheme(path)
  if name is None or name in _registered():
    return
  with contextlib.suppress(ImportError):
    # pylint: disable-next=g-import-not-at-top,import-outside-toplevel,unused-import
    import tensorflow_io
  if name not in _registered():
    raise tf.errors.UnimplementedError(None, None, f"File system scheme '{name}' not implemented")


def _registered():
  try:
    return set(tf.io.gfile.get_registered_schemes())
  except AttributeError:  # older TensorFlow: ask by trying
    return {"gs", "ram", "file"}


def split(path):
  """(parent, name) of an object path, like os.path.split but never touching the local disk."""
  path = os.fspath(path).rstrip("/")
  return posixpath.dirname(path), posixpath.basename(path)


def _random():
  return uuid.uuid4().hex[:8]


def temporary_name(path, stem):
  """A hidden sibling of `path` that the sweep recognizes: `STEM.tmp-PID-RANDOM@HOST`."""
  return posixpath.join(split(path)[0], f"{stem}.tmp-{os.getpid()}-{_random()}@{_HOST}")


def _remove_quietly(path):
  with contextlib.suppress(tf.errors.OpError):
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
    elif tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)


def publish_file(local, path, stem):
  """Uploads the local file `local` to `path` so that `path` is whole whenever it exists."""
  temporary = temporary_name(path, stem)
  try:
    tf.io.gfile.copy(local, temporary, overwrite=True)
    tf.io.gfile.rename(temporary, path, overwrite=True)
  finally:
    _remove_quietly(temporary)


# The files by which readers open a directory output, renamed into place last of all.
_COMPLETING = ("checkpoint", "saved_model.pb")


def publish_directory(local, path, stem):
  """Replaces the remote directory `path` by the local directory `local`: uploaded under a
  temporary prefix, the earlier content of `path` removed, then renamed into place with the files
  at its top last."""
  temporary = temporary_name(path, stem)
  names = sorted((os.path.relpath(os.path.join(root, name), local).replace(os.sep, "/")
                  for root, _, files in os.walk(local) for name in files),
                 key=lambda name: (name in _COMPLETING, "/" not in name, name))
  try:
    for name in names:
      target = posixpath.join(temporary, name)
      tf.io.gfile.makedirs(posixpath.dirname(target))
      tf.io.gfile.copy(os.path.join(local, name), target, overwrite=True)
    if tf.io.gfile.exists(path):
      tf.io.gfile.rmtree(path)
    tf.io.gfile.makedirs(path)
    for name in names:
      tf.io.gfile.makedirs(posixpath.dirname(posixpath.join(path, name)))
      tf.io.gfile.rename(posixpath.join(temporary, name), posixpath.join(path, name),
                         overwrite=True)
  finally:
    _remove_quietly(temporary)


def _age(path):
  return time.time() - tf.io.gfile.stat(path).mtime_nsec / 1e9


def _newest_age(path):
  """Seconds since the newest object at or under `path` was written."""
  if not tf.io.gfile.isdir(path):
    return _age(path)
  return min((_age(posixpath.join(root, name)) for root, _, names in tf.io.gfile.walk(path)
              for name in names), default=STALE_TEMPORARY)


def remove_stale_temporaries(directory, stems, keep=lambda path: False):
  """Removes the temporaries (TEMPORARY) of the names `stems` in the remote `directory` that
  killed runs left: a dead process's of this host, any host's older than STALE_TEMPORARY; never
  one that `keep(path)` (an input of this run)."""
  try:
    entries = tf.io.gfile.listdir(directory)
  except tf.errors.NotFoundError:
    return
  for entry in entries:
    match = TEMPORARY.fullmatch(entry.rstrip("/"))
    if not match or match.group("stem") not in stems:
      continue
    stale = posixpath.join(directory, entry.rstrip("/"))
    if keep(stale):
      continue
    pid = int(match.group("pid"))
    if match.group("host") == _HOST:
      if pid == os.getpid() or processes.alive(pid):
        continue
    else:
      try:
        if _newest_age(stale) < STALE_TEMPORARY:
          continue
      except tf.errors.OpError:
        continue
    _remove_quietly(stale)


class LockHeld(Exception):
  """Another run holds the lock; the message names its owner."""


class Lock:
  """The `.lock` object of a remote directory (or the object `name` in it: fileio.writer_lock's
  `.NAME.lock` beside an output), held by this process (see the module docstring)."""

  def __init__(self, directory, name=".lock"):
    self.path = posixpath.join(os.fspath(directory).rstrip("/"), name)
    self.owner = f"{_HOST} {os.getpid()} {uuid.uuid4().hex}\n"
    self._stop = threading.Event()
    self._thread = None

  def _read(self):
    try:
      with tf.io.gfile.GFile(self.path, "r") as f:
        return f.read()
    except tf.errors.NotFoundError:
      return None

  def _stale(self, owner):
    fields = owner.split()
    if len(fields) == 3 and fields[0] == _HOST and fields[1].isdigit():
      return not processes.alive(int(fields[1]))
    try:
      return _age(self.path) > STALE_LOCK
    except tf.errors.NotFoundError:
      return True

  def _write(self):
    with tf.io.gfile.GFile(self.path, "w") as f:
      f.write(self.owner)

  def acquire(self):
    tf.io.gfile.makedirs(posixpath.dirname(self.path))
    owner = self._read()
    if owner is not None and owner != self.owner and not self._stale(owner):
      raise LockHeld(_describe(owner))
    self._write()
    time.sleep(SETTLE)  # a run that found it absent at the same moment writes within this
    owner = self._read()
    if owner != self.owner:
      raise LockHeld(_describe(owner or ""))
    self._thread = threading.Thread(target=self._heartbeat, daemon=True, name="lock-heartbeat")
    self._thread.start()
    return self

  def _heartbeat(self):
    while not self._stop.wait(HEARTBEAT):
      with contextlib.suppress(tf.errors.OpError):
        if self._read() == self.owner:
          self._write()

  def release(self):
    self._stop.set()
    with contextlib.suppress(tf.errors.OpError):
      if self._read() == self.owner:
        tf.io.gfile.remove(self.path)


def _describe(owner):
  fields = owner.split()
  return (f"process {fields[1]} on {fields[0]}" if len(fields) == 3 else "another run")
