"""The target's remote-bucket route the gateway calls (with the caller's token).

``POST /v1/_remote/{bucket}/cached`` ``{"names": [...]}`` -> which of them are cached here
(the ``cached`` flags of a remote listing). Prefetch and evict are job kinds
(``etl_runtime.jobs.prefetch``).
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request

from etl_runtime.core.access import check
from etl_runtime.core.errors import InvalidRequest
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.names import validate_bucket
from etl_runtime.core.params import refuse_unknown
from etl_runtime.providers.cache import RemoteCache
from etl_runtime.storage_target.context import Target

PREFETCH_WORKERS = 4
MAX_NAMES = 100_000


def remote_router(target: Target) -> APIRouter:
    router = APIRouter()

    def cache_of(bucket: str) -> RemoteCache:
        validate_bucket(bucket)
        cache = target.remote
        if cache is None or cache.props(bucket) is None:
            raise InvalidRequest(f"bucket {bucket!r} is not a remote bucket", bucket=bucket)
        return cache

    @router.post("/v1/_remote/{bucket}/cached")
    async def cached(bucket: str, request: Request) -> dict[str, Any]:
        check(target, request, "read", [bucket])
        refuse_unknown(request, (), bucket=bucket)
        cache = cache_of(bucket)
        body = await _body(request, bucket)
        names = body.get("names")
        if not isinstance(names, list) or len(names) > MAX_NAMES:
            raise InvalidRequest(f"'names' must be a list of up to {MAX_NAMES}", bucket=bucket)

        def which() -> list[str]:
            return [n for n in names if isinstance(n, str) and cache.is_cached(bucket, n)]

        return {"cached": await anyio.to_thread.run_sync(which)}

    return router


async def _body(request: Request, bucket: str) -> dict[str, Any]:
    body = (
        await read_json(request, f"the body of {request.url.path}") if await request.body() else {}
    )
    if not isinstance(body, dict):
        raise InvalidRequest(f"the body of {request.url.path} must be a JSON object", bucket=bucket)
    return body
