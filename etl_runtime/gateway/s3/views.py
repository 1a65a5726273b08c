"""ETL views over S3 (``etl_runtime.gateway.views``): reads transformed, writes refused.

A GetObject of a view's key is the source object's ETL GET at its owner;
the gateway follows the target's 307 to the transformer for the client
(botocore cannot follow one) and streams the answer back.

``Range`` is answered too, because S3 clients send it for whole-object reads:
the AWS CRT behind ``s3torchconnector`` asks for the first part
(``bytes=0-8388607``) to learn the size, and reads on in parts. The
transformed size is not known before the transform has run, so a ranged
read of a view runs it, keeps the output (up to ``RANGED_MAX`` bytes; 416
beyond, naming the view) and answers the slice with the real total in
``Content-Range``. Each range runs the transform again unless the ETL caches
its output (``cache: true``), which makes every range after the first a
cache hit; a whole-object GET without ``Range`` is streamed, never held.
A HeadObject runs the transform and counts its output, so it answers the
real ``Content-Length``: boto3's ``download_file``, the AWS CLI and pyarrow
size their reads by HEAD, and pyarrow read an object without one as empty.
The answer carries the view's ETag (``views.view_etag``: the source's ETag,
the ETL and its args, hashed; the CRT refuses an answer without one and
sends it back in ``If-Match`` for the next parts). Conditional headers are
not passed on: the source's validators are not the view's.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from etl_runtime.core.access import object_url
from etl_runtime.core.errors import NoTargets, RangeNotSatisfiable, S3Error
from etl_runtime.core.names import validate_names
from etl_runtime.gateway import views
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.placement import route
from etl_runtime.gateway.s3.errors import from_target
from etl_runtime.storage.ranges import byte_range

RANGED_MAX = 256 << 20  # bytes of transformed output a ranged read of a view may hold


async def _transformed_size(
    gw: Gateway, request: Request, bucket: str, key: str, view: dict[str, Any]
) -> int:
    """The length of the view's object: the transform is run and its output counted
    (streamed, not held); an ETL with ``cache: true`` keeps it for the GET that follows."""
    params = views.source_params(request, bucket, view)
    src = views.check_source(gw, bucket, view)
    url = object_url(route(gw, "GET", src, key).url, src, key)
    try:
        r = await views.follow(gw, "GET", f"{url}?{urlencode(params)}")
    except Exception as e:  # httpx errors: the owner or its transformer went away
        raise NoTargets(
            f"the owner of {src}/{key} (source of view {bucket!r}) did not answer "
            f"({type(e).__name__}); retry",
            bucket=bucket,
            object=key,
        ) from None
    try:
        if r.status_code >= 400:
            raise from_target(r, await r.aread())
        size = 0
        async for chunk in r.aiter_raw():
            size += len(chunk)
        return size
    finally:
        await r.aclose()


def refuse_write(bucket: str, key: str | None, what: str) -> S3Error:
    where = f"{bucket}/{key}" if key else bucket
    return S3Error(
        "AccessDenied",
        403,
        f"{what} {where}: bucket {bucket!r} is an ETL view, read-only; write to its source",
        bucket=bucket,
    )


async def get(
    gw: Gateway, request: Request, bucket: str, key: str, view: dict[str, Any], head: bool
) -> Response:
    """GetObject / HeadObject of a view's key."""
    validate_names(bucket, key)
    if head:
        out = await views.head(gw, bucket, view, key)
        out.headers["content-length"] = str(await _transformed_size(gw, request, bucket, key, view))
        return out
    params = views.source_params(request, bucket, view)
    src = views.check_source(gw, bucket, view)
    etag = views.view_etag(
        (await views.source_head(gw, bucket, view, key)).headers.get("etag", ""), view
    )
    query = urlencode(params)
    url = object_url(route(gw, "GET", src, key).url, src, key)
    try:
        r = await views.follow(gw, "GET", f"{url}?{query}")
    except Exception as e:  # httpx errors: the owner or its transformer went away
        raise NoTargets(
            f"the owner of {src}/{key} (source of view {bucket!r}) did not answer "
            f"({type(e).__name__}); retry",
            bucket=bucket,
            object=key,
        ) from None
    if r.status_code >= 400:
        body = await r.aread()
        await r.aclose()
        raise from_target(r, body)
    wanted = request.headers.get("range")
    if wanted is None:
        return StreamingResponse(
            r.aiter_raw(),
            200,
            headers={"ETag": etag},
            media_type="application/octet-stream",
            background=BackgroundTask(r.aclose),
        )
    data = bytearray()
    try:
        async for chunk in r.aiter_raw():
            data += chunk
            if len(data) > RANGED_MAX:
                raise RangeNotSatisfiable(
                    f"Range on {bucket}/{key}: a ranged read of an ETL view holds the "
                    f"transformed object, and it is over {RANGED_MAX} bytes; read it whole",
                    bucket=bucket,
                    object=key,
                )
    finally:
        await r.aclose()
    span = byte_range(wanted, len(data))
    if span is None:
        return Response(
            bytes(data), 200, headers={"ETag": etag}, media_type="application/octet-stream"
        )
    start, end = span
    return Response(
        bytes(data[start:end]),
        206,
        headers={"Content-Range": f"bytes {start}-{end - 1}/{len(data)}", "ETag": etag},
        media_type="application/octet-stream",
    )
