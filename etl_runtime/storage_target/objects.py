"""The target's object and bucket HTTP API (the data-holding half of the public API).

Handlers are thin: names are validated by ``names``, files handled by
``ObjectStore``, transformed reads by ``EtlForwarder``, ownership, copies and
get-from-neighbor by ``copies.Placement``; errors are raised as
``SluiceError`` and rendered by the handlers in ``errors``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio.to_thread
from fastapi import Query, Request
from fastapi.responses import Response

from etl_runtime.core import auth
from etl_runtime.core.access import (
    REDIRECTED_FROM,
    SIGNATURE_PARAMS,
    check,
    object_path,
    object_url,
    token_id,
)
from etl_runtime.core.errors import InvalidName, InvalidRequest, ObjectNotFound
from etl_runtime.core.names import read_bucket_action, validate_bucket, validate_names
from etl_runtime.core.params import (
    etl_skip_of,
    refuse_repeated,
    refuse_unknown,
    refuse_unknown_object_params,
)
from etl_runtime.etl.pipeline import parse_chain, pipeline_response
from etl_runtime.getbatch import archread
from etl_runtime.storage.ranges import preconditions
from etl_runtime.storage_target import remote_reads as remote
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.meta import meta_of_headers
from etl_runtime.storage_target.reads import (
    checked_info,
    not_modified_answer,
    object_headers,
    serve_local,
    verify_local,
)
from etl_runtime.storage_target.write_conditions import check_write
from etl_runtime.wire.http.fastpath import FastRouter
from etl_runtime.wire.http.routes import each_method
from etl_runtime.wire.http.zerocopy import offers_zerocopy

CHUNK = 1 << 20  # bytes of a shard read at a time for its files (archpath)


def stored_bytes(target: Target, bucket: str, name: str) -> archread.Source:
    """The bytes of ``bucket/name`` as this target stores them, read in a thread."""

    async def chunks() -> AsyncIterator[bytes]:
        f, info = await anyio.to_thread.run_sync(target.store.open_object, bucket, name)
        with f:
            left = info.size
            while left > 0 and (chunk := await anyio.to_thread.run_sync(f.read, min(left, CHUNK))):
                left -= len(chunk)
                yield chunk

    return chunks


def owner_redirect(target: Target, request: Request, bucket: str, name: str) -> Response | None:
    """A 307 to the owner for a read of an object this target does not own, else None.

    The aistore SDK's direct reads pick a target by AIStore's HRW, not Sluice's
    (``gateway/smap.py``). The query is kept; a caller that showed a token gets
    the redirect signed (clients drop ``Authorization`` when the port changes).
    """
    if target.placement is None:
        return None
    url = target.placement.read_owner(bucket, name, REDIRECTED_FROM in request.query_params)
    if url is None:
        return None
    query = [(k, v) for k, v in parse_qsl(request.url.query, keep_blank_values=True)]
    header = request.headers.get("authorization")
    if target.read_token and target.cluster_key and header:  # the caller passed check()
        path, tid = object_path(bucket, name), token_id(request)
        signed = auth.sign_redirect(target.cluster_key, request.method, path, tid=tid)
        query = [(k, v) for k, v in query if k not in SIGNATURE_PARAMS] + list(signed.items())
    query.append((REDIRECTED_FROM, target.id))
    location = f"{object_url(url, bucket, name)}?{urlencode(query)}"
    return Response(status_code=307, headers={"Location": location})


def object_router(target: Target) -> FastRouter:
    store = target.store
    placement = target.placement
    router = FastRouter()

    def require(request: Request, bucket: str, signed_path: str | None = None) -> None:
        check(target, request, "write", [bucket], signed_path)  # core/access.py

    def may_read(request: Request, bucket: str | None, signed_path: str | None = None) -> None:
        check(target, request, "read", [bucket] if bucket else None, signed_path)

    @router.get("/v1/buckets")
    async def list_buckets(request: Request) -> dict[str, Any]:
        may_read(request, None)
        return {"buckets": await anyio.to_thread.run_sync(store.list_buckets)}

    @router.post("/v1/buckets/{bucket}")
    async def bucket_action(bucket: str, request: Request) -> dict[str, Any]:
        require(request, bucket)  # the credentials before any 400 (core/access.py)
        validate_bucket(bucket)
        await read_bucket_action(bucket, request)
        created = await anyio.to_thread.run_sync(store.create_bucket, bucket)
        # The gateway wrote the map before telling us: answer only once our map shows
        # the bucket, so the create it acknowledges is one every live target serves.
        if placement is not None and placement.bucket_known(bucket) is False:
            await anyio.to_thread.run_sync(placement.learn_bucket, bucket)
        return {"bucket": bucket, "created": created}

    @router.delete("/v1/buckets/{bucket}")
    async def delete_bucket(bucket: str, request: Request) -> dict[str, Any]:
        require(request, bucket)
        validate_bucket(bucket)
        refuse_unknown(request, ("provider",), bucket=bucket)
        if await request.body():  # a list/range delete is the gateway's job, never this
            raise InvalidRequest(
                f"DELETE /v1/buckets/{bucket} on a target takes no body; to delete some "
                "objects send the action to the gateway; nothing was deleted",
                bucket=bucket,
            )
        await anyio.to_thread.run_sync(store.delete_bucket, bucket)
        return {"bucket": bucket, "deleted": True}

    @router.get("/v1/buckets/{bucket}")
    async def list_objects(
        bucket: str,
        request: Request,
        prefix: str = "",
        start_after: str = "",
        limit: int = Query(1000, ge=1, le=100_000),
    ) -> dict[str, Any]:
        may_read(request, bucket)
        refuse_repeated(request, bucket=bucket)
        page, nxt = await anyio.to_thread.run_sync(
            store.list_objects, bucket, prefix, start_after, limit
        )
        return {"objects": [o.to_dict() for o in page], "next": nxt}

    @each_method(router, "/v1/objects/{bucket}", ("GET", "HEAD", "PUT", "DELETE"))
    async def missing_object_name(bucket: str, request: Request) -> None:
        may_read(request, bucket)  # the credentials first, like every route
        raise InvalidName(f"missing object name: use /v1/objects/{bucket}/<object>", bucket=bucket)

    @router.head("/v1/buckets/{bucket}")
    async def head_bucket(bucket: str, request: Request) -> Response:
        may_read(request, bucket)
        validate_bucket(bucket)
        refuse_unknown(request, ("provider",), bucket=bucket)
        await anyio.to_thread.run_sync(store.bucket_dir, bucket)  # BucketNotFound: 404
        return Response()

    @router.put("/v1/objects/{bucket}/{name:path}")
    async def put_object(bucket: str, name: str, request: Request) -> dict[str, Any]:
        require(request, bucket, object_path(bucket, name))  # before any 400
        validate_names(bucket, name)
        refuse_unknown_object_params(request, bucket, name)
        others = placement.check_owner(bucket, name) if placement else []
        await check_write(target, request.headers, bucket, name)  # If-None-Match, If-Match
        copies = placement.write_through(bucket, name, others) if placement else None
        copies = remote.write_through(target.remote, bucket, name, copies)
        meta = meta_of_headers(request.headers, bucket, name)
        info = await store.write_object(
            bucket, name, request.stream(), before_publish=copies, meta=meta
        )
        assert info is not None  # only if_absent writes keep an existing object
        return {"bucket": bucket, "object": name, "size": info.size, "etag": info.etag}

    @router.get("/v1/objects/{bucket}/{name:path}")
    async def get_object(
        bucket: str,
        name: str,
        request: Request,
        etl_name: str | None = None,
        etl_args: str | None = None,
        etl_pipeline: str | None = None,
        etl_skip: str | None = None,
    ) -> Response:
        may_read(request, bucket, object_path(bucket, name))  # before any 400
        validate_names(bucket, name)
        if archread.is_arch_read(request):  # the aistore SDK's direct read of a shard's files
            return await arch_read(request, bucket, name)
        refuse_unknown_object_params(request, bucket, name)
        skip = etl_skip_of(etl_skip, bucket=bucket, object=name)  # refused: a 400 naming it
        if etl_skip is not None and not etl_name:
            raise InvalidRequest(
                f"etl_skip={etl_skip} needs etl_name (a wds ETL whose answer leaves out "
                "the shard's first samples); drop etl_skip, or name the ETL",
                bucket=bucket,
                object=name,
            )
        if etl_name and "range" in request.headers:
            raise InvalidRequest(
                f"Range is not supported with etl_name={etl_name!r}: the transformed "
                "object has no known size; read it whole, or apply the range without the ETL",
                bucket=bucket,
                object=name,
                etl=etl_name,
            )
        if (moved := owner_redirect(target, request, bucket, name)) is not None:
            return moved
        cold = await remote.get(
            target.remote, target.forwarder, request, bucket, name, etl_name, etl_args
        )
        if cold is not None:
            return cold
        if placement:
            await placement.ensure_local(bucket, name)
        if etl_pipeline is not None:  # etl_runtime.etl.pipeline: a, then b, then c
            chain = parse_chain(etl_name, etl_pipeline)
            return await pipeline_response(target.forwarder, bucket, name, chain, etl_args)
        if etl_name:
            await verify_local(target, bucket, name)  # the ETL never reads bad bytes
            zerocopy = offers_zerocopy(request.scope)  # a cached answer is sent as a file
            return await target.forwarder.transform(
                bucket, name, etl_name, etl_args, client=True, zerocopy=zerocopy, skip=skip
            )
        # Checked against the checksum stored at write time (storage_target/reads.py).
        return await serve_local(target, request, bucket, name)

    async def arch_read(request: Request, bucket: str, name: str) -> Response:
        """``archpath`` / ``archregx`` at this target (``gateway/ais_shards.py`` answers the
        same through the gateway): the shard read from this disk once checked whole."""
        may_read(request, bucket, object_path(bucket, name))
        refuse_unknown(
            request, (*archread.READ_PARAMS, REDIRECTED_FROM), bucket=bucket, object=name
        )
        plan = archread.parse(request.query_params, bucket, name)
        if (moved := owner_redirect(target, request, bucket, name)) is not None:
            return moved
        await remote.get(target.remote, target.forwarder, request, bucket, name, None, None)
        if placement:
            await placement.ensure_local(bucket, name)
        await verify_local(target, bucket, name)
        return await plan.answer(stored_bytes(target, bucket, name))

    @router.head("/v1/objects/{bucket}/{name:path}")
    async def head_object(bucket: str, name: str, request: Request) -> Response:
        may_read(request, bucket, object_path(bucket, name))  # before any 400
        validate_names(bucket, name)
        refuse_unknown_object_params(request, bucket, name)
        if (moved := owner_redirect(target, request, bucket, name)) is not None:
            return moved
        if (cold := await remote.head(target.remote, bucket, name)) is not None:
            return cold
        if placement:
            await placement.ensure_local(bucket, name)
        info = await checked_info(target, bucket, name)  # a bad object's HEAD is no 200
        headers = object_headers(info)
        not_modified, _ = preconditions(request.headers, info, headers["Last-Modified"])
        if not_modified:
            return not_modified_answer(headers)
        return Response(headers=headers, media_type="application/octet-stream")

    async def get_object_fast(request: Request, bucket: str, name: str) -> Response:
        q = request.query_params  # what FastAPI would have solved, read directly
        etl = q.get("etl_name"), q.get("etl_args"), q.get("etl_pipeline"), q.get("etl_skip")
        return await get_object(bucket, name, request, *etl)

    # The data path's GET and HEAD skip FastAPI's routing (wire/http/fastpath.py).
    router.fast("/v1/objects/{bucket}/{name:path}", ["GET"], get_object_fast)
    router.fast("/v1/objects/{bucket}/{name:path}", ["HEAD"])

    @router.delete("/v1/objects/{bucket}/{name:path}")
    async def delete_object(bucket: str, name: str, request: Request) -> dict[str, Any]:
        require(request, bucket, object_path(bucket, name))  # before any 400
        validate_names(bucket, name)
        refuse_unknown_object_params(request, bucket, name)
        if (deleted := await remote.delete(target.remote, bucket, name)) is not None:
            return deleted
        if placement is None:
            await anyio.to_thread.run_sync(store.delete_object, bucket, name)
            return {"bucket": bucket, "object": name, "deleted": True}
        others = placement.check_owner(bucket, name)
        elsewhere = await placement.delete_elsewhere(bucket, name, others)
        try:
            await anyio.to_thread.run_sync(store.delete_object, bucket, name)
        except ObjectNotFound:
            if not elsewhere:  # not here, and not at a previous owner either
                raise
        return {"bucket": bucket, "object": name, "deleted": True}

    return router
