"""A plain S3 GetObject's request to its owner, sent before the gateway checks anything else.

The gateway relays every GetObject (``objects.py`` says why), so a 16 KiB one
is a chain: the gateway parses the request, verifies its SigV4 signature,
asks the owner, waits, answers. Where the cluster lets anyone read without
a token, the owner's read is something any caller may cause anyway, so the
gateway sends it first and verifies while the owner reads: as soon as the
request's head is parsed (``wire/http/inprotocol.py``'s starter hook, before uvicorn
makes the request's task and before the middleware), or failing that at the
top of the route. A call then refused (bad signature, unknown key, a write
key's rights...) is refused as before, first: its early answer is closed
unread. Where reads need a token nothing is sent before the check.

Only a plain GET is sent early: no query (no sub-resource, part, upload or
presigned signature), a key outside the multipart area, a bucket that is not
an ETL view. Measured with boto3 one 16 KiB GetObject at a time
(docs/benchmarks.md, "S3 API"): boto3 on Sluice ÷ boto3 on MinIO from
0.90–0.97 to 1.05–1.14, together with the owner's inline answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request

from etl_runtime.core import tls
from etl_runtime.gateway import views
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.s3 import multipart, objects, spliced
from etl_runtime.getbatch.exchange import ShareBody
from etl_runtime.wire.http import splice, zerocopy
from etl_runtime.wire.http.inprotocol import Starter

EARLY = "sluice.s3.early"  # the scope key of a request's early answer
PREFIX = "/s3/"


def _plain(gw: Gateway, bucket: str, key: str) -> bool:
    return not multipart.is_hidden(key) and views.view_of(gw, bucket) is None


def early_starter(gw: Gateway) -> Starter:
    """``run_server``'s starter: the owner's GET of a plain GetObject, in the scope."""
    # The relay reads an early answer only where the server splices (``take``): with
    # SLUICE_SENDFILE=0, or no os.splice, nothing is sent early.
    relayed = zerocopy.enabled() and splice.available() and not tls.serving()  # TLS: no splice

    def start(scope: dict[str, Any]) -> Callable[[], None] | None:
        path = scope["path"]
        if not relayed or scope["method"] != "GET" or scope["query_string"]:
            return None
        if not path.startswith(PREFIX):
            return None
        bucket, _, key = path[len(PREFIX) :].partition("/")
        if not bucket or not key or scope.get("root_path") or not _plain(gw, bucket, key):
            return None
        if objects.may_hand_off(gw, bucket):  # the owner's file is asked for instead
            return None
        early = objects.send_early(gw, Request(scope), bucket, key)
        if early is None:
            return None
        scope[EARLY] = early
        return lambda: None if early.taken else early.close()

    return start


def take(gw: Gateway, request: Request, bucket: str, key: str) -> ShareBody | None:
    """This GetObject's early answer: the one the starter sent, or one sent now."""
    early: ShareBody | None = request.scope.pop(EARLY, None)
    if not spliced.offered(request):  # the relay without splice reads another way
        if early is not None:
            early.close()
        return None
    if early is None and request.method == "GET" and not request.scope["query_string"]:
        if _plain(gw, bucket, key) and not objects.may_hand_off(gw, bucket):
            early = objects.send_early(gw, request, bucket, key)
    return early
