"""AIStore object calls the gateway answers itself: ``obj.copy(to_obj, etl=...)``.

``PUT /v1/objects/{b}/{o}?object_to=ais/@#/dst/name&latest-ver=false&synchronize=false``
(with ``etl_name`` / ``etl_pipeline`` / ``etl_args`` for a copy through ETLs)
reads the object at a target that holds it (through the ETLs, as a GET with
them would) and writes it to the destination's owner, with its copies. It
takes no body; ``latest-ver`` and ``synchronize`` are taken at ``false`` only
(a 400 naming them otherwise), and any other parameter is a 400 naming it.
"""

from __future__ import annotations

import httpx
from fastapi import Request
from fastapi.responses import Response

from etl_runtime.core.access import object_url
from etl_runtime.core.errors import InvalidRequest, NoTargets
from etl_runtime.core.names import validate_names
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway import views
from etl_runtime.gateway.context import Gateway, passthrough
from etl_runtime.gateway.placement import route

OBJECT_TO = "object_to"
COPY_PARAMS = (
    "provider",
    OBJECT_TO,
    "latest-ver",
    "synchronize",
    "etl_name",
    "etl_pipeline",
    "etl_args",
)
COPY_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


def is_copy(request: Request) -> bool:
    return request.method == "PUT" and OBJECT_TO in request.query_params


def destination(raw: str) -> tuple[str, str]:
    """``ais/@#/dst/name`` (the SDK's ``uname``) -> (``dst``, ``name``)."""
    parts = raw.split("/", 3)
    if len(parts) != 4 or parts[0] != "ais" or parts[1] not in ("@#", "@"):
        raise InvalidRequest(
            f"{OBJECT_TO}={raw!r}: name an 'ais' object without a namespace, "
            "e.g. ais/@#/bucket/object"
        )
    return validate_names(parts[2], parts[3])


async def copy_object(gw: Gateway, request: Request, bucket: str, name: str) -> Response:
    refuse_unknown(request, COPY_PARAMS, bucket=bucket, object=name)
    q = request.query_params
    for flag in ("latest-ver", "synchronize"):
        if q.get(flag, "false").lower() not in ("false", ""):
            raise InvalidRequest(
                f"{flag}={q[flag]!r} is not supported by an object copy (only false)",
                bucket=bucket,
                object=name,
            )
    if await request.body():
        raise InvalidRequest(
            f"PUT {bucket}/{name}?{OBJECT_TO}= copies the object: it takes no body",
            bucket=bucket,
            object=name,
        )
    dst_bucket, dst_name = destination(q[OBJECT_TO])
    if views.view_of(gw, dst_bucket) is not None:
        raise views.refuse_write(dst_bucket, dst_name, "PUT")
    params = {k: q[k] for k in ("etl_name", "etl_pipeline", "etl_args") if k in q}
    if (view := views.view_of(gw, bucket)) is not None:  # a view's object: its ETL'd source
        params.update(views.source_params(request, bucket, view))
        bucket = views.check_source(gw, bucket, view)
    gw.require_read(request, bucket)  # the source (a view's: its source bucket)
    gw.require_write(request, dst_bucket)
    src = route(gw, "GET", bucket, name)
    dst = route(gw, "PUT", dst_bucket, dst_name)
    headers = gw.target_headers()
    try:
        async with gw.http.stream(
            "GET",
            object_url(src.url, bucket, name),
            params=params,
            headers=headers,
            timeout=COPY_TIMEOUT,
            follow_redirects=True,  # a target may send an ETL's read to its transformer
        ) as got:
            if got.status_code != 200:
                await got.aread()
                raise passthrough(got)
            put = await gw.http.put(
                object_url(dst.url, dst_bucket, dst_name),
                content=got.aiter_bytes(),
                headers=headers,
                timeout=COPY_TIMEOUT,
            )
    except httpx.HTTPError as e:
        raise NoTargets(
            f"copying {bucket}/{name} to {dst_bucket}/{dst_name}: a target did not answer "
            f"({type(e).__name__}); retry",
            bucket=bucket,
            object=name,
        ) from None
    if put.status_code not in (200, 201):
        raise passthrough(put)
    return Response()
