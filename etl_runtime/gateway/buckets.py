"""Bucket calls on the gateway: the cluster map's bucket table, plus the targets.

A bucket exists cluster-wide: it is an entry of the cluster map (with its
props, ``copies``), so a target that joins later or was away serves it too.
Create and delete change the map, then tell every live target (a target also
creates a bucket's directory on first use). A listing asks each reachable
target for its first ``limit`` names after ``start_after`` and merges them:
the first ``limit`` names of the union are the first ``limit`` names of the
bucket. Replicas and objects not yet moved by a rebalance appear once.
With a member away and ``copies = 1`` part of the bucket cannot be listed, so
the listing is a 503 naming it rather than a silently short page.

Without a cluster map (Kubernetes mode, for now) a bucket is what the live
targets say it is, as before.
"""

from __future__ import annotations

import heapq
import time
from typing import Any

import httpx
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from etl_runtime.cluster.clustermap import BACKEND_KEYS, MAX_COPIES, BucketProps
from etl_runtime.core.bucket_rules import broken_rule, check_new_bucket
from etl_runtime.core.errors import (
    BucketExists,
    BucketNotFound,
    Conflict,
    InvalidRequest,
    NoTargets,
    bucket_not_found,
)
from etl_runtime.core.names import read_bucket_action, validate_bucket
from etl_runtime.core.params import refuse_repeated, refuse_unknown
from etl_runtime.gateway import (
    ais_archive,
    ais_buckets,
    ais_shards,
    aiscompat,
    bucket_delete,
    views,
)
from etl_runtime.gateway import remote as remote_gateway
from etl_runtime.gateway.bucket_action import is_job_action as bucket_action_is_job
from etl_runtime.gateway.bucket_action import start_transform
from etl_runtime.gateway.context import Gateway, passthrough, unreachable
from etl_runtime.gateway.placement import RETRY_AFTER_SECONDS


def _not_found(bucket: str) -> BucketNotFound:
    return bucket_not_found(bucket)


def _unwell(status: int) -> bool:
    """A 5xx that says the target is unwell (502, 503, 504): answered as 503 ``NoTargets``.

    A 507 (``InsufficientStorage``: its disk is full) is an answer, passed on
    as it is: trying again cannot help, so it must not become a retryable 503.
    So is a 500: a bug on that target, whose JSON names it (``wire/http/errors.py``).
    """
    return status in (502, 503, 504)


def bucket_props(
    bucket: str, body: dict[str, Any], old: BucketProps | None, request: Request | None = None
) -> BucketProps:
    """``props`` of a create-bck / set-bprops body (``{"copies": 1..3}``; for a
    remote bucket also the backend props of ``etl_runtime.providers.props``)."""
    props = body.get("props") or {}
    if not isinstance(props, dict):
        raise InvalidRequest(f"'props' of bucket {bucket!r} must be an object", bucket=bucket)
    known = {"copies", "provider", *BACKEND_KEYS}
    unknown = sorted(set(props) - known)
    if unknown:
        raise InvalidRequest(
            f"unknown bucket props {unknown} for {bucket!r}; known: {', '.join(sorted(known))}",
            bucket=bucket,
        )
    remote = remote_gateway.create_props(bucket, request, props, old) if request else None
    if remote is not None:
        provider, backend = remote
        created = old.created if old else time.time()
        return BucketProps(copies=1, created=created, provider=provider, backend=backend)
    copies = props.get("copies", old.copies if old else 1)
    if not isinstance(copies, int) or isinstance(copies, bool) or not 1 <= copies <= MAX_COPIES:
        raise InvalidRequest(
            f"copies of bucket {bucket!r} must be 1..{MAX_COPIES}, got {copies!r}", bucket=bucket
        )
    return BucketProps(copies=copies, created=old.created if old else time.time())


def _refuse_existing(bucket: str, request: Request, created: bool) -> None:
    """409 for the aistore SDK's create of an existing bucket; Sluice's SDK gets ``created``.

    The aistore SDK always sends ``?provider=ais`` and expects ``ErrBckAlreadyExists``
    (which its ``create(exist_ok=True)`` swallows); Sluice's own SDK and ``curl``
    send no ``provider`` and read ``"created": false``.
    """
    if not created and "provider" in request.query_params:
        raise BucketExists(f"bucket ais://{bucket} already exists", bucket=bucket)


def bucket_router(gw: Gateway) -> APIRouter:
    router = APIRouter()

    async def bucket_names() -> list[str]:
        return await all_bucket_names(gw)

    @router.get("/v1/buckets", response_model=None)
    async def list_buckets(request: Request) -> dict[str, Any] | list[dict[str, Any]]:
        gw.require_read(request)  # cluster-wide
        if await aiscompat.list_action(request) is not None:  # the aistore SDK's form
            return aiscompat.bucket_models(await bucket_names())
        return {"buckets": await bucket_names()}

    @router.post("/v1/buckets/{bucket}", response_model=None)
    async def bucket_action(bucket: str, request: Request) -> dict[str, Any] | Response:
        gw.require_write(request, bucket)  # the credentials before any 400
        validate_bucket(bucket)
        if await bucket_action_is_job(request):  # etl-bck: etl_runtime.gateway.bucket_action
            return await start_transform(gw, bucket, request)
        if gw.cmap is not None:
            return await _map_bucket_action(bucket, request)
        body = await read_bucket_action(bucket, request)
        if broken_rule(bucket) and bucket not in await bucket_names():
            check_new_bucket(bucket)  # S3's rules for a new bucket; an old one stays usable
        created = False
        for t, r in await gw.fanout("POST", f"/v1/buckets/{bucket}", json=body):
            if not isinstance(r, httpx.Response) or _unwell(r.status_code):
                raise unreachable(t, r)
            if r.status_code != 200:
                raise passthrough(r)
            created = created or bool(r.json().get("created"))
        _refuse_existing(bucket, request, created)
        return {"bucket": bucket, "created": created}

    @router.put("/v1/buckets/{bucket}")
    async def bucket_put(bucket: str, request: Request) -> Response:
        """AIStore's ``archive`` (``objects(...).archive()``): a job; another action is a 400."""
        gw.require_write(request, bucket)
        validate_bucket(bucket)
        return await ais_archive.start_archive(gw, bucket, request, list_bucket_page)

    @router.head("/v1/buckets/{bucket}")
    async def head_bucket(bucket: str, request: Request) -> Response:
        gw.require_read(request, bucket)
        validate_bucket(bucket)
        if ais_buckets.is_info(request):  # bucket.info(): props, then the summary
            return await ais_buckets.info(gw, list_bucket_page, bucket, request)
        refuse_unknown(request, ("provider",), bucket=bucket)
        await remote_gateway.ensure_bucket(gw, request, bucket)
        if gw.cmap is not None:
            exists = bucket in gw.cmap.get().buckets
        else:
            exists = bucket in await bucket_names()
        if not exists:
            raise _not_found(bucket)
        return Response()

    @router.delete("/v1/buckets/{bucket}", response_model=None)
    async def delete_bucket(bucket: str, request: Request) -> dict[str, Any] | Response:
        gw.require_write(request, bucket)
        validate_bucket(bucket)
        refuse_unknown(request, ("provider",), bucket=bucket)
        # The body says what goes: the bucket, or a list/range of its objects (a job).
        if (job := await bucket_delete.objects_action(gw, bucket, request)) is not None:
            return job
        if gw.cmap is not None:
            return await map_delete_bucket(gw, bucket)
        found = False
        for t, r in await gw.fanout("DELETE", f"/v1/buckets/{bucket}"):
            if not isinstance(r, httpx.Response) or _unwell(r.status_code):
                raise unreachable(t, r)
            if r.status_code == 200:
                found = True
            elif r.status_code != 404:
                raise passthrough(r)
        if not found:
            raise _not_found(bucket)
        return {"bucket": bucket, "deleted": True}

    @router.get("/v1/buckets/{bucket}", response_model=None)
    async def list_objects(
        bucket: str,
        request: Request,
        prefix: str = "",
        start_after: str = "",
        limit: int = Query(1000, ge=1, le=100_000),
    ) -> dict[str, Any] | Response:
        gw.require_read(request, bucket)
        validate_bucket(bucket)
        refuse_repeated(request, bucket=bucket)
        await remote_gateway.ensure_bucket(gw, request, bucket)
        if (summ := ais_buckets.summary_action(await request.body(), bucket)) is not None:
            return await ais_buckets.summary(gw, list_bucket_page, bucket, summ)  # bucket.summary()
        action = await aiscompat.list_action(request, bucket)
        if action is not None:  # the aistore SDK's form: an LsoResult, msgpack if asked
            prefix, start_after, size = aiscompat.page_args(action, bucket)
            page = await list_page(bucket, prefix, start_after, size or aiscompat.DEFAULT_PAGE)
            uuid = str(action.get("uuid") or "")
            flags = aiscompat.list_flags(action, bucket)
            objects = aiscompat.finished(page["objects"])
            if "NO_RECURSION" in flags:
                objects = aiscompat.shallow(objects, prefix)
            if "ARCH_DIR" in flags:  # list_archive(): each shard's files after it
                objects = await ais_shards.expand(gw, bucket, objects)
            return aiscompat.lso_result(objects, page["next"], request, uuid, flags)
        return await list_page(bucket, prefix, start_after, limit)

    async def list_page(bucket: str, prefix: str, start_after: str, limit: int) -> dict[str, Any]:
        return await list_bucket_page(gw, bucket, prefix, start_after, limit)

    # -- with a cluster map ----------------------------------------------------------

    async def _map_bucket_action(bucket: str, request: Request) -> dict[str, Any]:
        assert gw.cmap is not None
        body = await read_bucket_action(bucket, request, ("create-bck", "set-bprops"))
        old = gw.cmap.get().buckets.get(bucket)
        if body["action"] == "set-bprops" and old is None:
            raise _not_found(bucket)
        raw = body.get("props")
        asked: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if "view_of" in asked or (old is not None and old.view):
            return await _map_view_action(bucket, request, body, asked, old)
        props = bucket_props(bucket, body, old, request)
        if old is None and not props.remote:
            check_new_bucket(bucket)  # S3's rules for a new bucket; an old one stays usable
        if body["action"] == "create-bck":
            _refuse_existing(bucket, request, old is None)
        if body["action"] == "create-bck" and old is not None and "props" not in body:
            props = old
        if props.remote and old is None:  # the backend must show it, with these props
            await remote_gateway.backend(bucket, props.backend, props.provider).check_bucket()
        gw.cmap.update(lambda m: m.with_bucket(bucket, props))
        # Tell the live targets now; one that is away creates it on first use.
        await gw.fanout("POST", f"/v1/buckets/{bucket}", json={"action": "create-bck"})
        return {"bucket": bucket, "created": old is None, "props": props.to_dict()}

    async def _map_view_action(
        bucket: str,
        request: Request,
        body: dict[str, Any],
        asked: dict[str, Any],
        old: BucketProps | None,
    ) -> dict[str, Any]:
        """create-bck of an ETL view (``views``); nothing to tell the targets: it stores nothing."""
        assert gw.cmap is not None
        if old is None:
            check_new_bucket(bucket)
        if body["action"] == "create-bck":
            _refuse_existing(bucket, request, old is None)
        if old is not None and not asked:  # create-bck of an existing view, nothing asked
            return {"bucket": bucket, "created": False, "props": old.to_dict()}
        if old is not None and "view_of" not in asked:
            raise InvalidRequest(
                f"bucket {bucket!r} is an ETL view: change it with view_of, etl and etl_args",
                bucket=bucket,
            )
        if isinstance(asked.get("view_of"), str):  # a view reads its source: so must its maker
            gw.require_read(request, asked["view_of"])  # (before its existence is told)
        props = await views.view_props(gw, bucket, asked, old)
        gw.cmap.update(lambda m: m.with_bucket(bucket, props))
        return {"bucket": bucket, "created": old is None, "props": props.to_dict()}

    return router


async def all_bucket_names(gw: Gateway) -> list[str]:
    if gw.cmap is not None:
        return sorted(gw.cmap.get().buckets)
    names: set[str] = set()
    for t, r in await gw.fanout("GET", "/v1/buckets"):
        if not isinstance(r, httpx.Response) or r.status_code != 200:
            raise unreachable(t, r)
        names.update(r.json()["buckets"])
    return sorted(names)


async def list_bucket_page(
    gw: Gateway, bucket: str, prefix: str, start_after: str, limit: int
) -> dict[str, Any]:
    """One page of a bucket's listing: the merge of every reachable target's page."""
    if (view := views.view_of(gw, bucket)) is not None:
        src = views.check_source(gw, bucket, view)
        page = await list_bucket_page(gw, src, prefix, start_after, limit)
        return {**page, "objects": views.listing_entries(page["objects"])}
    if (remote := remote_gateway.remote_props(gw, bucket)) is not None:
        return await remote_gateway.list_page(gw, bucket, remote, prefix, start_after, limit)
    if gw.cmap is not None:
        _check_listable(gw, bucket)
    params = {"prefix": prefix, "start_after": start_after, "limit": limit}
    pages: list[list[dict[str, Any]]] = []
    more = False
    for t, r in await gw.fanout("GET", f"/v1/buckets/{bucket}", params=params):
        if not isinstance(r, httpx.Response) or _unwell(r.status_code):
            raise unreachable(t, r)
        if r.status_code == 404:
            continue  # e.g. a target that joined after the bucket was made
        if r.status_code != 200:
            raise passthrough(r)
        page = r.json()
        pages.append(page["objects"])
        more = more or page["next"] is not None
    if not pages and gw.cmap is None:
        raise _not_found(bucket)
    merged: list[dict[str, Any]] = []
    for obj in heapq.merge(*pages, key=lambda o: o["name"]):
        if not merged or merged[-1]["name"] != obj["name"]:  # replicas, unmoved objects
            merged.append(obj)
    more = more or len(merged) > limit
    objects = merged[:limit]
    return {"objects": objects, "next": objects[-1]["name"] if more and objects else None}


async def map_delete_bucket(gw: Gateway, bucket: str) -> dict[str, Any]:
    assert gw.cmap is not None
    props = gw.cmap.get().buckets.get(bucket)
    if props is None:
        raise _not_found(bucket)
    if readers := views.views_reading(gw, bucket):
        raise Conflict(
            f"bucket {bucket!r} is the source of ETL view(s) {', '.join(readers)}: "
            "delete them first",
            bucket=bucket,
            views=readers,
        )
    gw.cmap.update(lambda m: m.without_bucket(bucket))
    if props.view:  # a view stores nothing on the targets
        return {"bucket": bucket, "deleted": True}
    # Live targets drop the objects now; one that is away drops them when it
    # sees the map (a bucket dir that the map does not list is never served).
    await gw.fanout("DELETE", f"/v1/buckets/{bucket}")
    return {"bucket": bucket, "deleted": True}


def _check_listable(gw: Gateway, bucket: str) -> None:
    assert gw.cmap is not None
    cmap = gw.cmap.get()
    if bucket not in cmap.buckets:
        raise _not_found(bucket)
    away = [t for t in cmap.members if t not in gw.alive_ids()]
    if len(away) >= cmap.copies(bucket):
        raise NoTargets(
            f"cannot list bucket {bucket!r} completely: target(s) {', '.join(away)} "
            f"not reachable right now; retry in {RETRY_AFTER_SECONDS}s",
            retry_after=RETRY_AFTER_SECONDS,
            bucket=bucket,
            target=away[0],
        )
