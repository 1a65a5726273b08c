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

With ``SLUICE_S3_DOMAIN=s3.example.com`` (and a wildcard DNS name for it), a
request for ``Host: BUCKET.s3.example.com`` is virtual-host style: its path
is the key, and it is routed as ``/s3/BUCKET/KEY``.

Only the routing path changes (``scope["path"]``, prefixed with ``/s3``): the
signature is checked over ``raw_path``, the path the client signed.
"""

from __future__ import annotations

import os

from starlette.types import ASGIApp, Receive, Scope, Send

DOMAIN_ENV = "SLUICE_S3_DOMAIN"
VHOST_KEY = "sluice.s3.vhost"  # the scope's bucket of a virtual-host-style request

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


def vhost_bucket(scope: Scope, domain: str) -> str | None:
    """The bucket of a virtual-host-style request (``Host: BUCKET.DOMAIN``), or None."""
    for name, value in scope["headers"]:
        if name == b"host":
            host = value.decode("latin-1").rsplit(":", 1)[0].lower()
            if host.endswith("." + domain) and len(host) > len(domain) + 1:
                return host[: -len(domain) - 1]
            return None
    return None


class S3AtRoot:
    """ASGI middleware: S3 requests at the root are routed as ``/s3/...``; with a
    ``domain`` (``SLUICE_S3_DOMAIN``), ``Host: BUCKET.DOMAIN`` requests as
    ``/s3/BUCKET/...`` (virtual-host style; a wildcard DNS name points at the gateway)."""

    def __init__(self, app: ASGIApp, domain: str | None = None) -> None:
        self.app = app
        given = os.environ.get(DOMAIN_ENV, "") if domain is None else domain
        self.domain = given.strip().lower().strip(".")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            bucket = vhost_bucket(scope, self.domain) if self.domain else None
            if bucket is not None:
                path: str = scope["path"]
                scope = dict(scope)
                scope["raw_path"] = scope.get("raw_path") or path.encode()
                scope["path"] = f"/s3/{bucket}{path}"
                scope[VHOST_KEY] = bucket
            elif is_root_s3(scope):
                path = scope["path"]
                scope = dict(scope)
                scope["raw_path"] = scope.get("raw_path") or path.encode()
                scope["path"] = "/s3" + path if path != "/" else "/s3"
        await self.app(scope, receive, send)
