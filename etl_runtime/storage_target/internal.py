"""Internal target routes other targets call: copies, rebalance moves, neighbor reads.

``/v1/_replica/{bucket}/{object}`` reads and writes this target's own copy
only — no ownership check, no neighbor lookup, no copies — so that copies and
moves never recurse. ``PUT ?if_absent=1`` keeps an existing object
(``{"stored": false}``). Every call needs ``X-Sluice-Internal`` (derived from
the cluster key). ``GET /v1/_rebalance`` reports this target's rebalance.
"""

from __future__ import annotations

import json
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from etl_runtime.core import access, auth
from etl_runtime.core.errors import InvalidRequest, NotFound, Unauthorized
from etl_runtime.core.names import validate_names
from etl_runtime.core.params import refuse_unknown
from etl_runtime.storage import integrity
from etl_runtime.storage.integrity import XXH_HEADER
from etl_runtime.storage.peers import INTERNAL_HEADER
from etl_runtime.storage.rebalance import Rebalancer
from etl_runtime.storage.store import ObjectStore
from etl_runtime.storage_target.meta import INTERNAL as INTERNAL_META
from etl_runtime.storage_target.meta import internal_meta


def internal_router(
    store: ObjectStore,
    cluster_key: str | None,
    rebalancer: Rebalancer | None,
    holder: access.Holder | None = None,
) -> APIRouter:
    router = APIRouter()

    def require(request: Request, params: tuple[str, ...] = ()) -> None:
        if not auth.internal_ok(request.headers.get(INTERNAL_HEADER), cluster_key):
            raise Unauthorized("internal target route: only other targets may call it")
        refuse_unknown(request, params)  # and repeated ones: 400 naming them

    @router.get("/v1/_rebalance")
    async def rebalance_status(request: Request) -> dict[str, Any]:
        # Other targets, the gateway (its token) and decommission (the internal token).
        if holder is not None and not auth.internal_ok(
            request.headers.get(INTERNAL_HEADER), cluster_key
        ):
            access.check(holder, request, "read")
        refuse_unknown(request, ())
        if rebalancer is None:
            return {"state": "idle", "rebalance_id": None}
        return rebalancer.status()

    @router.put("/v1/_replica/{bucket}/{name:path}")
    async def put_copy(bucket: str, name: str, request: Request) -> dict[str, Any]:
        validate_names(bucket, name)
        require(request, ("if_absent",))
        flag = request.query_params.get("if_absent", "0")
        if flag not in ("0", "1"):
            raise InvalidRequest(f"if_absent must be 0 or 1, got {flag!r}", bucket=bucket)
        meta = internal_meta(request.headers.get(INTERNAL_META))
        # Checked against the sender's MD5 and checksum before it is published (a 400).
        expect = request.headers.get("x-sluice-etag"), request.headers.get(XXH_HEADER)
        info = await store.write_object(
            bucket, name, request.stream(), if_absent=flag == "1", meta=meta, expect=expect
        )
        return {"bucket": bucket, "object": name, "stored": info is not None}

    @router.head("/v1/_replica/{bucket}/{name:path}")
    async def head_copy(bucket: str, name: str, request: Request) -> Response:
        validate_names(bucket, name)
        require(request)
        info = await anyio.to_thread.run_sync(store.stat_object, bucket, name)
        return Response(headers={"ETag": f'"{info.etag}"', "Content-Length": str(info.size)})

    @router.get("/v1/_replica/{bucket}/{name:path}")
    async def get_copy(bucket: str, name: str, request: Request) -> Response:
        validate_names(bucket, name)
        require(request)
        f, info = await anyio.to_thread.run_sync(store.open_object, bucket, name)
        cs = info.checksum if integrity.verify_reads() else None
        if cs is not None and cs.size != info.size:
            f.close()
            integrity.found_bad(bucket, name, store.target_id)
            raise integrity.corrupted(bucket, name, store.target_id)

        def chunks():  # type: ignore[no-untyped-def]
            with f:
                while chunk := f.read(1 << 20):
                    yield chunk

        body = chunks()
        if cs is not None and integrity.VERIFIED.fresh(info.stamp, cs):
            pass  # matched lately and unchanged since: sent as it is
        elif cs is not None:  # a copy is never made from bad bytes: the stream is cut
            bad = integrity.BadRead(bucket, name, store.target_id)
            body = integrity.checked_blocks(body, cs, bad, info.stamp)
        headers = {"ETag": f'"{info.etag}"', "Content-Length": str(info.size)}
        if info.checksum is not None:
            headers[XXH_HEADER] = info.checksum.value
        if info.meta:
            headers[INTERNAL_META] = json.dumps(info.meta)
        return StreamingResponse(body, headers=headers, media_type="application/octet-stream")

    @router.delete("/v1/_replica/{bucket}/{name:path}")
    async def delete_copy(bucket: str, name: str, request: Request) -> dict[str, Any]:
        validate_names(bucket, name)
        require(request)
        try:
            await anyio.to_thread.run_sync(store.delete_object, bucket, name)
        except NotFound:
            return {"bucket": bucket, "object": name, "deleted": False}
        return {"bucket": bucket, "object": name, "deleted": True}

    return router
