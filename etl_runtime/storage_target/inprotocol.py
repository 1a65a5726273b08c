"""The small plain GET and the small GetBatch share, answered inside the HTTP protocol.

``wire/http/inprotocol.py`` calls ``answerer`` with every request's head. A GetBatch
share (``POST /v1/_moss``, ``share_answerer``) of at most ``LOOP_ITEMS``
plain items whose bytes are all read with the manifest is answered once its
body is in, with the route's exact answer (``getbatch_share.py``'s ``ShareResponse``):
the share costs its target no uvicorn task, middleware or Starlette
``Request``/``Response``. Anything else (an ETL share, a bigger one, one with
a file to send by ``sendfile``, a bad body, a read without the token) is the
route's.

The small GET:

``GET /v1/objects/{bucket}/{name}`` of a local object of at most
``IN_PROTOCOL_MAX`` bytes, with no query, no ``Range`` or ``If-*`` header and no
body, whose ETag is stored beside it, on a target that owns it and keeps no
copy elsewhere: answered as soon as its head is parsed, with one ``pread``
and one write of head and body, the same status, headers and bytes the ASGI
route sends (``objects.py``). It is what the gateway sends the owner for an
S3 GetObject and what a native GET sends after the gateway's 307.

Everything else is declined (``None``) and served by the route, which also
says why a request fails: a missing object or bucket, a read without the
token, an object another target owns, a remote bucket, an object without a
stored ETag, one that changed while being read. Each answer is counted in the
request metrics as the route's (``sluice_http_*{route="/v1/objects/..."}``).

Measured on the 2-core VM, one signed 16 KiB S3 GetObject at a time relayed
by the gateway to its owner (``git show f8a3f49:docs/benchmarks.md``,
"Small GETs answered inline"): the owner's CPU per request (psutil, user + system) went
from 0.39–0.54 ms to 0.21–0.32 ms, and back-to-back requests from 890–1140
to 1060–1570 a second.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from etl_runtime.core import auth
from etl_runtime.core.errors import SluiceError
from etl_runtime.core.jsonbody import parse_json
from etl_runtime.core.metrics import HttpMetrics
from etl_runtime.core.names import validate_names
from etl_runtime.getbatch.exchange import SHARE_PATH, encode_manifest, padding
from etl_runtime.storage import integrity
from etl_runtime.storage.ranges import READ_CONDITIONS
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.getbatch_share import (
    LOOP_ITEMS,
    LOOP_READ_BUDGET,
    Share,
    share_chain,
    share_rows,
)
from etl_runtime.storage_target.objects import object_headers
from etl_runtime.wire.http.inprotocol import Answer, Answerer, WithBody, may_read

IN_PROTOCOL_MAX = 128 << 10  # bigger objects go by the route's sendfile
PREFIX = "/v1/objects/"
ROUTE = "/v1/objects/{bucket}/{name:path}"  # the route's template, for the metrics
# Headers that change the answer (the route's preconditions and ranges).
DECLINED = frozenset(h.encode() for h in READ_CONDITIONS)
_BODY = (b"content-length", b"transfer-encoding")


class _Route:
    path = ROUTE


_METRICS_SCOPE = {"route": _Route(), "method": "GET", "query_string": b""}


class _ShareRoute:
    path = SHARE_PATH


_SHARE_METRICS_SCOPE = {"route": _ShareRoute(), "method": "POST", "query_string": b""}
_PADS = [bytes(n) for n in range(512)]
_SHARE_HEADERS = [(b"content-type", b"application/octet-stream")]


def answerer(target: Target, metrics: HttpMetrics | None) -> Answerer:
    """The answerer for ``run_server``: the small plain GET, a small GetBatch share."""
    get, share = object_answerer(target, metrics), share_answerer(target, metrics)

    def answer(scope: dict[str, Any]) -> Answer | WithBody | None:
        return share(scope) if scope["method"] == "POST" else get(scope)

    return answer


def share_answerer(
    target: Target, metrics: HttpMetrics | None
) -> Callable[[dict[str, Any]], WithBody | None]:
    """``POST /v1/_moss`` of at most ``LOOP_ITEMS`` plain items whose bytes are all read
    with the manifest (``Share.open_all`` on the loop, as the route does for such a share):
    the route's answer, built once the body is in. A share through an ETL, a bigger one,
    one with a file to send by ``sendfile``, a body that is not a share, a caller
    without the token: the route's."""

    def answer(scope: dict[str, Any]) -> WithBody | None:
        if scope["path"] != SHARE_PATH or scope["query_string"]:
            return None
        if not may_read(scope, target.read_token, target.token):
            return None
        started = time.perf_counter()

        def with_body(raw: bytes) -> Answer | None:
            try:
                body = parse_json(raw, "a GetBatch share")
                items = share_rows(body)
                if share_chain(body)[0] or len(items) > LOOP_ITEMS:
                    return None
            except SluiceError:
                return None
            share = Share(target, body.get("placed"))
            try:
                share.open_all(items, int(time.time()), LOOP_READ_BUDGET)
                out = [encode_manifest(share.manifest)]
                for e in share.entries:
                    if e.data is None:  # a file to send by sendfile: the route's
                        return None
                    out += (e.head, e.data, _PADS[padding(e.size)])
            finally:
                share.close()
            length = sum(map(len, out))  # written in pieces (``wire/http/inprotocol.py``): no join
            headers = [(b"content-length", str(length).encode()), *_SHARE_HEADERS]
            if metrics is not None:
                seconds = time.perf_counter() - started
                metrics.observe(_SHARE_METRICS_SCOPE, 200, len(raw), length, seconds)
            return 200, headers, out

        return with_body

    return answer


def object_answerer(target: Target, metrics: HttpMetrics | None) -> Answerer:
    """The small plain GET, else None."""
    store, placement, remote = target.store, target.placement, target.remote

    def answer(scope: dict[str, Any]) -> Answer | None:
        path = scope["path"]
        if scope["method"] != "GET" or scope["query_string"] or not path.startswith(PREFIX):
            return None
        started = time.perf_counter()
        authorization = None
        for name, value in scope["headers"]:
            if name in DECLINED or (name in _BODY and value.strip() != b"0"):  # a body: the route
                return None
            if name == b"authorization":
                authorization = value.decode("latin-1")
        bucket, _, key = path[len(PREFIX) :].partition("/")
        try:
            validate_names(bucket, key)
        except SluiceError:
            return None
        if not auth.read_ok(authorization, target.read_token, target.token):
            return None
        if placement is not None and (
            placement.read_owner(bucket, key, False) is not None
            or placement.may_be_elsewhere(bucket)
        ):
            return None
        if remote is not None and remote.props(bucket) is not None:
            return None
        opened = store.open_if_tagged(bucket, key)
        if opened is None:
            return None
        f, info = opened
        with f:
            if info.size > IN_PROTOCOL_MAX:
                return None
            body = os.pread(f.fileno(), info.size, 0)
        if len(body) != info.size:  # rewritten under us: the route reads it again
            return None
        if integrity.verify_reads() and (
            info.checksum is None or not info.checksum.matches(body)
        ):  # the route says it (ObjectCorrupted), never these bytes, or makes its checksum
            return None
        headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in object_headers(info).items()
        ]
        if metrics is not None:
            metrics.observe(_METRICS_SCOPE, 200, 0, len(body), time.perf_counter() - started)
        return 200, headers, body

    return answer
