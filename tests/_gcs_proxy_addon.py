"""mitmdump addon of tests/gcs_emulator.py: TensorFlow's requests for Google Cloud Storage go to
the local fake-gcs-server; nothing else is let through."""

import os

from mitmproxy import http

_PORT = int(os.environ["GCS_EMULATOR_PORT"])
_DENIED = os.environ.get("GCS_DENIED_BUCKET", "")
_HOSTS = ("www.googleapis.com", "storage.googleapis.com")


def _denied(flow):
  path = flow.request.path
  return _DENIED and (f"/b/{_DENIED}/" in path or path.endswith(f"/b/{_DENIED}")
                      or f"/b/{_DENIED}?" in path or path.startswith(f"/{_DENIED}/"))


def request(flow: http.HTTPFlow):
  host = flow.request.pretty_host
  if host not in _HOSTS:
    flow.response = http.Response.make(502, b"the GCS test double serves only Google Storage")
    return
  if _denied(flow):
    flow.response = http.Response.make(
        403, b'{"error": {"code": 403, "message": "caller does not have storage.objects access '
        b'to the Google Cloud Storage bucket. Permission denied."}}',
        {"Content-Type": "application/json"})
    return
  flow.request.scheme = "http"
  flow.request.host = "127.0.0.1"
  flow.request.port = _PORT
  # The emulator tells a download (storage.googleapis.com/BUCKET/OBJECT) by its Host header.
  flow.request.headers["Host"] = host
  # The emulator refuses chunked uploads (and any Transfer-Encoding but chunked): the whole body
  # is here, so give its length instead.
  if "Transfer-Encoding" in flow.request.headers:
    del flow.request.headers["Transfer-Encoding"]
    flow.request.headers["Content-Length"] = str(len(flow.request.raw_content or b""))
  if os.environ.get("GCS_PROXY_LOG"):
    with open(os.environ["GCS_PROXY_LOG"], "a", encoding="utf-8") as f:
      f.write(f"{flow.request.method} {host} {flow.request.path[:150]} "
              f"{dict(flow.request.headers)}\n")
