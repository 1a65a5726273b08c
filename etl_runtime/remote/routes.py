"""The target's remote-bucket routes the gateway calls (with the caller's token).

``POST /v1/_remote/{bucket}/cached``   ``{"names": [...]}`` -> which of them are cached here
``POST /v1/_remote/{bucket}/evict``    ``{"prefix": ""}`` -> drop this target's cached copies
``POST /v1/_remote/{bucket}/prefetch`` ``{"prefix": ""}`` -> warm the objects this target
                                       owns; answers when done with the counts
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request

from etl_runtime.remote.cache import RemoteCache
from etl_runtime.target.access import require_read, require_write
from etl_runtime.target.context import Target
from etl_runtime.target.errors import InvalidRequest
from etl_runtime.target.jsonbody import read_json
from etl_runtime.target.names import validate_bucket

PREFETCH_WORKERS = 4
MAX_NAMES = 100_000


def remote_router(target: Target) -> APIRouter:
    router = APIRouter()

    def cache_of(bucket: str) -> RemoteCache:
        validate_bucket(bucket)
        cache = target.remote
        if cache is None or cache.props(bucket) is None:
            raise InvalidRequest(
                f"bucket {bucket!r} is not a remote (provider=aws) bucket", bucket=bucket
            )
        return cache

    @router.post("/v1/_remote/{bucket}/cached")
    async def cached(bucket: str, request: Request) -> dict[str, Any]:
        require_read(request, target.read_token, target.token, target.cluster_key)
        cache = cache_of(bucket)
        body = await _body(request, bucket)
        names = body.get("names")
        if not isinstance(names, list) or len(names) > MAX_NAMES:
            raise InvalidRequest(f"'names' must be a list of up to {MAX_NAMES}", bucket=bucket)

        def which() -> list[str]:
            return [n for n in names if isinstance(n, str) and cache.is_cached(bucket, n)]

        return {"cached": await anyio.to_thread.run_sync(which)}

    @router.post("/v1/_remote/{bucket}/evict")
    async def evict(bucket: str, request: Request) -> dict[str, Any]:
        require_write(request, target.token, target.cluster_key)
        cache = cache_of(bucket)
        prefix = _prefix(await _body(request, bucket), bucket)
        objects, size = cache.evict(bucket, prefix)
        return {"target": target.id, "objects": objects, "bytes": size}

    @router.post("/v1/_remote/{bucket}/prefetch")
    async def prefetch(bucket: str, request: Request) -> dict[str, Any]:
        require_write(request, target.token, target.cluster_key)
        cache = cache_of(bucket)
        prefix = _prefix(await _body(request, bucket), bucket)
        return await prefetch_owned(target, cache, bucket, prefix)

    return router


async def _body(request: Request, bucket: str) -> dict[str, Any]:
    body = (
        await read_json(request, f"the body of {request.url.path}") if await request.body() else {}
    )
    if not isinstance(body, dict):
        raise InvalidRequest(f"the body of {request.url.path} must be a JSON object", bucket=bucket)
    return body


def _prefix(body: dict[str, Any], bucket: str) -> str:
    prefix = body.get("prefix", "")
    if not isinstance(prefix, str):
        raise InvalidRequest("'prefix' must be a string", bucket=bucket)
    return prefix


async def prefetch_owned(
    target: Target, cache: RemoteCache, bucket: str, prefix: str, progress: Any = None
) -> dict[str, Any]:
    """Fetch every backend object under ``prefix`` that this target owns and lacks."""
    props = cache.props(bucket)
    assert props is not None and cache.cmap is not None
    backend = cache.backend(bucket, props)
    fetched = skipped = size = 0
    start_after = ""
    sem = asyncio.Semaphore(PREFETCH_WORKERS)

    async def one(name: str, n: int) -> None:
        nonlocal fetched, skipped, size
        async with sem:
            if await cache.prefetch_one(bucket, name, props):
                fetched, size = fetched + 1, size + n
                if progress is not None:
                    progress(objects=1, bytes=n)
            else:
                skipped += 1

    while True:
        page, nxt = await backend.list_page(prefix, start_after, 1000)
        cmap = cache.cmap.get()
        mine = [m for m in page if cmap.owners(bucket, m.name)[0] == target.id]
        await asyncio.gather(*(one(m.name, m.size) for m in mine))
        if nxt is None:
            break
        start_after = nxt
    return {"target": target.id, "objects": fetched, "bytes": size, "cached_already": skipped}
