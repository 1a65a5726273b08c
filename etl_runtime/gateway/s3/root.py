"""S3 at the gateway's root as well as under ``/s3``: ``http://GATEWAY/BUCKET/KEY``.

Some S3 clients take no path in their endpoint (minio-py refuses one, as do
s3-tests and some Spark/Hadoop set-ups). ``S3AtRoot`` tells their requests
from the native API's and hands them to the ``/s3`` routes:

* a path under ``/v1`` (and ``/s3`` itself) is never rewritten: the native
  API and the prefixed S3 API keep their paths;
* a request signed as S3 signs (SigV4 ``Authorization: AWS4-HMAC-SHA256``,
  ``X-Amz-Algorithm`` in the query, or Signature V2's ``AWSAccessKeyId``)
  is S3, whatever its path;
* an unsigned one is S3 unless its first segment is one of the gateway's own
  pages (``NATIVE``: ``/ui``, ``/metrics``, the OpenAPI pages).

Only the routing path changes (``scope["path"]``, prefixed with ``/s3``): the
signature is checked over ``raw_path``, the path the client signed.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

NATIVE = frozenset({"v1", "s3", "ui", "metrics", "docs", "redoc", "openapi.json", "favicon.ico"})
_SIGNED_QUERY = (b"X-Amz-Algorithm=", b"AWSAccessKeyId=")


def _signed(scope: Scope) -> bool:
    query: bytes = scope.get("query_string", b"")
    if any(q in query for q in _SIGNED_QUERY):
        return True
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value.startswith((b"AWS4-HMAC-SHA256", b"AWS "))
    return False


def is_root_s3(scope: Scope) -> bool:
    path: str = scope["path"]
    first = path[1:].split("/", 1)[0]
    if first in ("v1", "s3"):
        return False
    return _signed(scope) or first not in NATIVE


class S3AtRoot:
    """ASGI middleware: S3 requests at the root are routed as ``/s3/...``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_root_s3(scope):
            path: str = scope["path"]
            scope = dict(scope)
            scope["raw_path"] = scope.get("raw_path") or path.encode()
            scope["path"] = "/s3" + path if path != "/" else "/s3"
        await self.app(scope, receive, send)
