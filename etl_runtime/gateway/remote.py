"""The gateway's part of remote buckets: joining the map, props, and listing.

* ``ensure_bucket`` — a call with ``?provider=gcp`` (any remote provider of
  ``etl_runtime.core.providers``, or its alias) for a bucket the cluster map
  does not list adds it as a bucket of that provider once the backend shows it
  exists (AIStore's way: a remote bucket needs no create); another provider
  than the bucket's is a 400 naming it.
* ``create_props`` — the props of ``create-bck``/``set-bprops`` for a remote bucket.
* ``list_page`` — a listing of a remote bucket is the backend's listing (its
  pagination: ``start_after``/``next``), each object with ``cached``: whether
  a target holds it now (asked of every reachable target; one that does not
  answer counts as not caching anything).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import httpx
from fastapi import Request

from etl_runtime.cluster.clustermap import BucketProps
from etl_runtime.core import providers as registry
from etl_runtime.core.errors import InvalidRequest
from etl_runtime.gateway.context import Gateway
from etl_runtime.providers.backend import Backend, backend_class
from etl_runtime.providers.backend import remote_props as _remote_props
from etl_runtime.providers.props import check_backend_props

_backends: dict[tuple[str, str, str], Backend] = {}


def backend(bucket: str, props: Mapping[str, Any], provider: str) -> Backend:
    key = (provider, bucket, json.dumps(dict(props), sort_keys=True))
    found = _backends.get(key)
    if found is None:
        found = _backends[key] = backend_class(provider).for_bucket(bucket, props)
    return found


def remote_props(gw: Gateway, bucket: str) -> BucketProps | None:
    return _remote_props(gw.cmap, bucket)


async def ensure_bucket(gw: Gateway, request: Request, bucket: str) -> None:
    spelled = request.query_params.get("provider") or ""
    provider = registry.canonical(spelled)
    if not spelled or provider is None:
        return  # absent; an unknown one is refused by refuse_unknown
    if gw.cmap is None:
        if provider != registry.AIS:
            raise InvalidRequest(
                f"remote (provider={provider}) buckets need a cluster map: run the gateway and "
                "the "
                "targets with --cluster-map (sluice up and the chart do)",
                bucket=bucket,
            )
        return
    props = gw.cmap.get().buckets.get(bucket)
    if props is not None:
        if props.provider != provider:
            raise InvalidRequest(
                f"bucket {bucket!r} is a {props.provider!r} bucket, not {provider!r}: "
                f"use provider={props.provider} (bucket names are unique across providers)",
                bucket=bucket,
            )
        return
    if provider == registry.AIS:
        return  # the ordinary 404 follows
    await add_bucket(gw, bucket, BucketProps(created=time.time(), provider=provider))


async def add_bucket(gw: Gateway, bucket: str, props: BucketProps) -> bool:
    """Add ``bucket`` as a remote bucket once its backend shows it; True if new."""
    assert gw.cmap is not None
    await backend(bucket, props.backend, props.provider).check_bucket()
    old = gw.cmap.get().buckets.get(bucket)
    gw.cmap.update(lambda m: m.with_bucket(bucket, props))
    await gw.fanout("POST", f"/v1/buckets/{bucket}", json={"action": "create-bck"})
    return old is None


def create_props(
    bucket: str, request: Request, body_props: Mapping[str, Any], old: BucketProps | None
) -> tuple[str, dict[str, Any]] | None:
    """(provider, backend props) of a create/set-bprops call, or None for an ``ais`` bucket."""
    spelled = request.query_params.get("provider") or body_props.get("provider")
    provider = registry.canonical(spelled) if spelled and isinstance(spelled, str) else None
    if spelled and provider is None:
        raise InvalidRequest(
            f"provider {spelled!r} of bucket {bucket!r} is not supported: {registry.described()}",
            bucket=bucket,
        )
    if old is not None and provider and provider != old.provider:
        raise InvalidRequest(
            f"bucket {bucket!r} is a {old.provider!r} bucket; its provider cannot change",
            bucket=bucket,
        )
    provider = provider or (old.provider if old else registry.AIS)
    keys = set(body_props) - {"copies", "provider"}
    if provider == registry.AIS:
        if keys:
            raise InvalidRequest(
                f"bucket props {sorted(keys)} are for remote buckets; {bucket!r} is 'ais'",
                bucket=bucket,
            )
        return None
    if body_props.get("copies", 1) != 1:
        raise InvalidRequest(
            f"copies of {provider} bucket {bucket!r} must be 1: its backend keeps the data safe",
            bucket=bucket,
        )
    return provider, check_backend_props(bucket, body_props, old.backend if old else {}, provider)


async def list_page(
    gw: Gateway, bucket: str, props: BucketProps, prefix: str, start_after: str, limit: int
) -> dict[str, Any]:
    page, nxt = await backend(bucket, props.backend, props.provider).list_page(
        prefix, start_after, limit
    )
    names = [m.name for m in page]
    cached: set[str] = set()
    if names:
        for _t, r in await gw.fanout("POST", f"/v1/_remote/{bucket}/cached", json={"names": names}):
            if isinstance(r, httpx.Response) and r.status_code == 200:
                cached.update(r.json().get("cached") or ())
    objects = [
        {
            "name": m.name,
            "size": m.size,
            "etag": m.etag,
            "mtime": m.last_modified,
            "cached": m.name in cached,
        }
        for m in page
    ]
    return {"objects": objects, "next": nxt}
