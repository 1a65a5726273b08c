"""GetBatch's redirect to its designated target, answered inside the HTTP protocol.

A GetBatch (``GET /v1/ml/moss[/{bucket}]``) costs the gateway one small
request: it checks the query and the caller, picks a designated target and
answers 307 (``getbatch_routes.py``). Through uvicorn's ASGI task, the
middleware, FastAPI and Starlette's ``Request``/``Response`` that was
0.45-0.5 ms of the gateway's CPU per batch (``bench/batch.py``, 64 items of
10 KiB): about 8% of all the CPU a batch item cost the cluster.

``answerer`` gives ``run_server`` (``wire/http/inprotocol.py``) the same redirect for
a request whose body is small (every batch of up to about a thousand plain
items): once the body is in, the route's exact answer (status, ``Location``,
headers), with the same checks, the same random choice of target and, where
reads need a token, the same signature over the route, query and body. It is
counted in the request metrics as the route's.

Whatever the route would answer otherwise is the route's: an unknown,
repeated or malformed query parameter (its 400 names it), a bad bucket name,
a read without the token, an ETL (``etl_name``, ``etl_pipeline``,
``etl_args``: the route checks that the ETLs exist, which waits on the ETL
backend), a cluster that is not all up (the gateway then assembles the batch
itself), ``--batch-assembly gateway``, a bigger or chunked body.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from etl_runtime.core import providers
from etl_runtime.core.access import SIGNATURE_PARAMS
from etl_runtime.core.errors import SluiceError
from etl_runtime.core.metrics import HttpMetrics
from etl_runtime.core.names import validate_bucket
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.getbatch_routes import designate, redirect_location
from etl_runtime.getbatch.serve import QUERY
from etl_runtime.wire.http.inprotocol import Answer, WithBody, may_read

PATH = "/v1/ml/moss"
ETL_PARAMS = frozenset({"etl_name", "etl_pipeline", "etl_args"})
KNOWN = frozenset(QUERY) - ETL_PARAMS | frozenset(SIGNATURE_PARAMS)
PROVIDERS = (*providers.spellings(), "")  # ``core/params.py``'s ``refuse_unknown``


class _Route:
    def __init__(self, path: str) -> None:
        self.path = path


_METRICS_SCOPES = {
    bucketed: {"route": _Route(PATH + "/{bucket}" if bucketed else PATH), "method": "GET"}
    for bucketed in (False, True)
}


def _query(raw: bytes) -> list[tuple[str, str]] | None:
    """The query as Starlette parses it, or None where the route would refuse it or
    would need the ETL backend: an unknown or repeated name, a provider not served, an
    ETL parameter."""
    items = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
    names = {k for k, _ in items}
    if len(names) != len(items) or not names <= KNOWN:
        return None
    for k, v in items:
        if k == "provider" and v not in PROVIDERS:
            return None
    return items


def answerer(
    gw: Gateway, metrics: HttpMetrics | None
) -> Callable[[dict[str, Any]], WithBody | None]:
    """``run_server``'s answerer for a gateway whose batches go to a designated target."""

    def answer(scope: dict[str, Any]) -> WithBody | None:
        path = scope["path"]
        if scope["method"] != "GET" or not path.startswith(PATH):
            return None
        bucket: str | None = None
        if len(path) > len(PATH):
            if path[len(PATH)] != "/":
                return None
            bucket = path[len(PATH) + 1 :]
            try:
                validate_bucket(bucket)
            except SluiceError:  # the route's 400 (or no route, for a name with a "/")
                return None
        query = _query(scope["query_string"])
        if query is None:
            return None
        if not may_read(scope, gw.read_token, gw.token):
            return None
        started = time.perf_counter()

        def with_body(body: bytes) -> Answer | None:
            dt = designate(gw)
            if dt is None:  # the gateway assembles the batch itself: the route
                return None
            location = redirect_location(gw, bucket, query, body, *dt)
            if metrics is not None:
                seconds = time.perf_counter() - started
                metrics.observe(_METRICS_SCOPES[bucket is not None], 307, len(body), 0, seconds)
            headers = [(b"location", location.encode("latin-1")), (b"content-length", b"0")]
            return 307, headers, b""

        return with_body

    return answer
