"""Bucket calls on the gateway: broadcast to every target, or gather and merge.

A bucket exists on every target (objects of one bucket spread over all of
them by HRW), so create and delete go to all live targets, and a listing asks
each target for its first ``limit`` names after ``start_after`` and merges:
the first ``limit`` names of the union are the first ``limit`` names of the
bucket.
"""

from __future__ import annotations

import heapq
from typing import Any

import httpx
from fastapi import APIRouter, Query, Request

from etl_runtime.gateway.context import Gateway, unreachable
from etl_runtime.gateway.errors import BucketNotFound, SluiceError
from etl_runtime.target.names import read_bucket_action, validate_bucket


def _not_found(bucket: str) -> BucketNotFound:
    return BucketNotFound(
        f"bucket {bucket!r} does not exist; create it with POST /v1/buckets/{bucket}",
        bucket=bucket,
    )


def _passthrough(r: httpx.Response) -> SluiceError:
    """A target's 4xx answer, re-raised as-is."""
    try:
        body = r.json()
    except ValueError:
        body = {"error": r.text}
    err = SluiceError(str(body.get("error", r.text)))
    err.status, err.kind = r.status_code, str(body.get("kind", "TargetError"))
    err.context = {k: v for k, v in body.items() if k not in ("error", "kind")}
    return err


def bucket_router(gw: Gateway) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/buckets")
    async def list_buckets() -> dict[str, Any]:
        names: set[str] = set()
        for t, r in await gw.fanout("GET", "/v1/buckets"):
            if not isinstance(r, httpx.Response) or r.status_code != 200:
                raise unreachable(t, r)
            names.update(r.json()["buckets"])
        return {"buckets": sorted(names)}

    @router.post("/v1/buckets/{bucket}")
    async def bucket_action(bucket: str, request: Request) -> dict[str, Any]:
        validate_bucket(bucket)
        gw.require_write(request)
        body = await read_bucket_action(bucket, request)
        created = False
        for t, r in await gw.fanout("POST", f"/v1/buckets/{bucket}", json=body):
            if not isinstance(r, httpx.Response) or r.status_code >= 500:
                raise unreachable(t, r)
            if r.status_code != 200:
                raise _passthrough(r)
            created = created or bool(r.json().get("created"))
        return {"bucket": bucket, "created": created}

    @router.delete("/v1/buckets/{bucket}")
    async def delete_bucket(bucket: str, request: Request) -> dict[str, Any]:
        validate_bucket(bucket)
        gw.require_write(request)
        found = False
        for t, r in await gw.fanout("DELETE", f"/v1/buckets/{bucket}"):
            if not isinstance(r, httpx.Response) or r.status_code >= 500:
                raise unreachable(t, r)
            if r.status_code == 200:
                found = True
            elif r.status_code != 404:
                raise _passthrough(r)
        if not found:
            raise _not_found(bucket)
        return {"bucket": bucket, "deleted": True}

    @router.get("/v1/buckets/{bucket}")
    async def list_objects(
        bucket: str,
        prefix: str = "",
        start_after: str = "",
        limit: int = Query(1000, ge=1, le=100_000),
    ) -> dict[str, Any]:
        validate_bucket(bucket)
        params = {"prefix": prefix, "start_after": start_after, "limit": limit}
        pages: list[list[dict[str, Any]]] = []
        more = False
        for t, r in await gw.fanout("GET", f"/v1/buckets/{bucket}", params=params):
            if not isinstance(r, httpx.Response) or r.status_code >= 500:
                raise unreachable(t, r)
            if r.status_code == 404:
                continue  # e.g. a target that joined after the bucket was made
            if r.status_code != 200:
                raise _passthrough(r)
            page = r.json()
            pages.append(page["objects"])
            more = more or page["next"] is not None
        if not pages:
            raise _not_found(bucket)
        merged = list(heapq.merge(*pages, key=lambda o: o["name"]))
        more = more or len(merged) > limit
        objects = merged[:limit]
        return {"objects": objects, "next": objects[-1]["name"] if more and objects else None}

    return router
