"""ETL views: a read-only bucket whose objects are another bucket's, transformed.

``POST /v1/buckets/VIEW {"action": "create-bck", "props": {"view_of": SRC,
"etl": NAME, "etl_args": ARGS}}`` (``sluice bucket create VIEW --view-of SRC
--etl NAME``, ``client.bucket(VIEW).create(view_of=SRC, etl=NAME)``) records
the view in the cluster map, beside the source's props. No object is copied
and no job runs: a read of ``VIEW/obj`` is a read of ``SRC/obj?etl_name=NAME
[&etl_args=ARGS]``, so it is computed on the target that holds the object,
object or wds mode alike, and takes every path an ETL GET takes (the 307 to
the transformer, the output cache). Any client reads a view unchanged: the
native API (the gateway's 307 names the source and the ETL), the aistore SDK,
``wds.WebDataset`` over ``http://`` URLs (curl follows the 307), and S3
clients (the S3 API follows it for them, as S3 clients cannot).

What a view refuses, and why:

* writes (PUT, DELETE, POST of an object, S3 uploads): 405 ``ViewReadOnly``
  naming the view (S3: 403 ``AccessDenied``); a view stores nothing.
* ``etl_name``/``etl_pipeline``/``etl_args`` on a read: 400, the view already
  names its ETL (reading the source with another ETL is the source's job).
* deleting a bucket that views read: 409 naming the views, so a view never
  answers for a source that is gone.
* a view of a view: 400 (read the source with a pipeline instead).

The ETL is looked up when the view is made (404 if it does not exist). After
that a stopped or deleted ETL makes every read of the view answer the
target's error naming the ETL (409 ``EtlStopped``, 404 ``EtlNotFound``),
never the source's bytes. A view's listing is its source's, with ``size``
null (the transformed size is not known until read) and ``source_size`` set;
the aistore and S3 listings, whose sizes are integers, give the source's size.
A ``HEAD`` of a view's object says it exists (the source object's) with no
``Content-Length`` or ``Accept-Ranges`` (the source's would be wrong for the
transformed bytes) and the view's own ``ETag``: a hash of the source's ETag,
the ETL's name and the args, so it changes when the source object or the
view does (S3 clients such as the AWS CRT need one). It does not change when
an ETL's code is replaced under the same name.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response

from etl_runtime.cluster.clustermap import BucketProps
from etl_runtime.core.access import object_url
from etl_runtime.core.errors import (
    BucketNotFound,
    Conflict,
    EtlNotFound,
    InvalidRequest,
    NoTargets,
    ViewReadOnly,
    bucket_not_found,
)
from etl_runtime.core.spec import validate_name
from etl_runtime.gateway.context import Gateway, passthrough
from etl_runtime.gateway.placement import route

VIEW_KEYS = ("view_of", "etl", "etl_args")
ETL_PARAMS = ("etl_name", "etl_pipeline", "etl_args")
MAX_REDIRECTS = 2


def view_of(gw: Gateway, bucket: str) -> dict[str, Any] | None:
    """The view props (``of``, ``etl``, ``args``) of ``bucket``, or None if it is no view."""
    if gw.cmap is None:
        return None
    props = gw.cmap.get().buckets.get(bucket)
    return dict(props.view) if props is not None and props.view else None


def views_reading(gw: Gateway, bucket: str) -> list[str]:
    """The views whose source is ``bucket``."""
    if gw.cmap is None:
        return []
    return sorted(b for b, p in gw.cmap.get().buckets.items() if p.view.get("of") == bucket)


async def view_props(
    gw: Gateway, bucket: str, props: dict[str, Any], old: BucketProps | None
) -> BucketProps:
    """The props of a create-bck that names ``view_of``; 400/404/409 when it cannot be one."""
    if gw.cmap is None:
        raise InvalidRequest(
            f"bucket {bucket!r}: ETL views need the cluster map (run with one)", bucket=bucket
        )
    others = sorted(set(props) - set(VIEW_KEYS))
    if others:
        raise InvalidRequest(
            f"view {bucket!r}: props {others} do not apply to a view (only {', '.join(VIEW_KEYS)})",
            bucket=bucket,
        )
    if old is not None and not old.view:
        raise Conflict(f"bucket {bucket!r} exists and is not a view", bucket=bucket)
    src, etl, args = props.get("view_of"), props.get("etl"), props.get("etl_args")
    if not isinstance(src, str) or not src:
        raise InvalidRequest(f"view {bucket!r}: view_of must name a bucket", bucket=bucket)
    if src == bucket:
        raise InvalidRequest(f"view {bucket!r} cannot be a view of itself", bucket=bucket)
    if not isinstance(etl, str) or not etl:
        raise InvalidRequest(
            f"view {bucket!r} of {src!r}: 'etl' must name the ETL that transforms its objects",
            bucket=bucket,
        )
    if args is not None and not isinstance(args, str):
        raise InvalidRequest(f"view {bucket!r}: etl_args must be a string", bucket=bucket)
    try:
        validate_name(etl)
    except ValueError as e:
        raise InvalidRequest(f"view {bucket!r}: {e}", bucket=bucket, etl=etl) from None
    source = gw.cmap.get().buckets.get(src)
    if source is None:
        raise BucketNotFound(
            f"view {bucket!r}: the source bucket ais://{src} does not exist", bucket=src
        )
    if source.view:
        raise InvalidRequest(
            f"view {bucket!r}: {src!r} is itself a view; make a view of "
            f"{source.view['of']!r} with an etl_pipeline instead",
            bucket=bucket,
        )
    if await gw.backend.get(etl) is None:
        raise EtlNotFound(f"view {bucket!r}: ETL {etl!r} does not exist", etl=etl, bucket=bucket)
    view = {"of": src, "etl": etl}
    if args:
        view["args"] = args
    return BucketProps(copies=1, created=old.created if old else time.time(), view=view)


def refuse_write(bucket: str, name: str | None, method: str) -> ViewReadOnly:
    what = f"{bucket}/{name}" if name else bucket
    return ViewReadOnly(
        f"{method} {what}: bucket {bucket!r} is an ETL view, read-only; write to its source",
        headers={"Allow": "GET, HEAD"},
        bucket=bucket,
        object=name,
    )


def source_params(request: Request, view: str, props: dict[str, Any]) -> list[tuple[str, str]]:
    """The query of a read of ``view``'s object, as a read of its source: the ETL added."""
    given = [k for k in ETL_PARAMS if k in request.query_params]
    if given:
        raise InvalidRequest(
            f"{given[0]}: view {view!r} already reads through ETL {props['etl']!r}; "
            f"read the source bucket {props['of']!r} to choose another",
            bucket=view,
            etl=props["etl"],
        )
    extra = [("etl_name", str(props["etl"]))]
    if props.get("args"):
        extra.append(("etl_args", str(props["args"])))
    return extra


def check_source(gw: Gateway, view: str, props: dict[str, Any]) -> str:
    """The source bucket; 404 naming both if it is gone (it cannot be, but a map can be edited)."""
    src = str(props["of"])
    if gw.cmap is not None and src not in gw.cmap.get().buckets:
        raise bucket_not_found(src)
    return src


def view_etag(source_etag: str, props: dict[str, Any]) -> str:
    """The quoted ETag of a view's object: the source's ETag, the ETL and its args, hashed."""
    key = "\0".join((source_etag.strip('"'), str(props["etl"]), str(props.get("args") or "")))
    return '"' + hashlib.md5(key.encode(), usedforsecurity=False).hexdigest() + '-v"'


async def head(gw: Gateway, view: str, props: dict[str, Any], name: str) -> Response:
    """HEAD of a view's object: it exists (the source's does), with the view's ETag, no size."""
    r = await source_head(gw, view, props, name)
    out = Response(status_code=200, headers={"X-Sluice-View": f"{props['of']}|{props['etl']}"})
    del out.headers["content-length"]
    out.headers["ETag"] = view_etag(r.headers.get("etag", ""), props)
    if "last-modified" in r.headers:
        out.headers["Last-Modified"] = r.headers["last-modified"]
    return out


async def source_head(gw: Gateway, view: str, props: dict[str, Any], name: str) -> httpx.Response:
    """The source object's HEAD at its owner; its error (404 naming it...) as it is."""
    src = check_source(gw, view, props)
    owner = route(gw, "HEAD", src, name)
    try:
        r = await gw.http.head(object_url(owner.url, src, name), headers=gw.target_headers())
    except httpx.HTTPError as e:
        raise NoTargets(
            f"the owner of {src}/{name} (source of view {view!r}) did not answer; retry",
            bucket=view,
            object=name,
        ) from e
    if r.status_code >= 400:
        raise passthrough(r)
    return r


async def follow(gw: Gateway, method: str, url: str) -> httpx.Response:
    """GET ``url`` on a target (the gateway's credentials), following its 307 to a transformer.

    The redirect's URL is signed for that object alone: no ``Authorization`` goes with it.
    The answer is streamed; the caller closes it.
    """
    r = await gw.http.send(
        gw.http.build_request(method, url, headers=gw.target_headers()), stream=True
    )
    for _ in range(MAX_REDIRECTS):
        location = r.headers.get("location")
        if r.status_code != 307 or not location:
            return r
        await r.aclose()
        r = await gw.http.send(gw.http.build_request(method, location), stream=True)
    return r


def listing_entries(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A source's listing entries as a view's: the transformed size is not known."""
    return [{**o, "size": None, "source_size": o.get("size"), "etag": ""} for o in objects]
