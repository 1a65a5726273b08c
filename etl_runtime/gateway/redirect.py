"""Object calls on the gateway: a 307 to the target that owns the object.

The gateway validates the names and the query (so a bad name or an unknown
parameter is a 400 here, not on some target), picks the target by
``placement.route`` (the HRW owner over the cluster map's members, or a
reachable replica for a read) and redirects with the query string preserved.
307 keeps the method and body, so ``curl -L``, ``httpx(follow_redirects=True)``
and ``requests`` re-send the call to the target. Those clients drop
``Authorization`` when the port changes, so for a caller that showed a valid
token the gateway signs the redirect (``sluice_exp``/``sluice_sig``) for
exactly that method and object.

Uploads cross the wire once. A client that sends ``Expect: 100-continue``
(curl, for bodies over 1 MiB) has not sent the body yet: it gets the 307 and
sends the body to the target only. httpx and requests never wait for
``100 Continue``; they send the whole body before they read any answer, and on
loopback the kernel's socket buffers take megabytes of it before a 307 could
stop them, so a redirect would make them send it twice (once to the gateway,
which drops it, then to the target). For such a PUT the gateway streams the
body to the owner itself and passes the owner's answer back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from etl_runtime.core import auth
from etl_runtime.core.access import (
    SIGNATURE_PARAMS,
    carries_token,
    object_path,
    object_url,
    token_id,
)
from etl_runtime.core.errors import InvalidName, InvalidRequest, NoTargets
from etl_runtime.core.names import validate_names
from etl_runtime.core.params import refuse_unknown_object_params
from etl_runtime.etl.pipeline import check_chain_async, parse_chain
from etl_runtime.gateway import ais_objects, ais_props, ais_shards, ais_writes, views
from etl_runtime.gateway import remote as remote_gateway
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.placement import route
from etl_runtime.wire.http.fastpath import FastRouter
from etl_runtime.wire.http.routes import each_method

MUTATING = frozenset({"PUT", "POST", "DELETE", "PATCH"})
METHODS = ["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH"]
UPLOAD_TIMEOUT = httpx.Timeout(600.0, connect=10.0)  # per read/write, not for the whole body
# What the owner's answer to a proxied PUT keeps; the rest is hop-by-hop or ours.
PASSED_BACK = ("content-type", "retry-after", "www-authenticate", "etag")


def redirect_location(
    gw: Gateway, request: Request, bucket: str, name: str, extra: Sequence[tuple[str, str]] = ()
) -> str:
    owner = route(gw, request.method, bucket, name)
    query = [
        (k, v)
        for k, v in parse_qsl(request.url.query, keep_blank_values=True)
        if k not in SIGNATURE_PARAMS and not ais_writes.is_probe(request)  # sent again
    ]
    query += extra
    writes = request.method in MUTATING
    protected = gw.token if writes else gw.read_token
    allowed = gw.caller_has_token(request) if writes else gw.caller_may_read(request)
    allowed = allowed or carries_token(request)  # verified in scope by the route's check
    if protected and gw.cluster_key and allowed:
        path, tid = object_path(bucket, name), token_id(request)  # tid: revocation stops it
        query += list(auth.sign_redirect(gw.cluster_key, request.method, path, tid=tid).items())
    location = object_url(owner.url, bucket, name)
    return f"{location}?{urlencode(query)}" if query else location


def _expects_continue(request: Request) -> bool:
    return request.headers.get("expect", "").lower() == "100-continue"


def _has_body(request: Request) -> bool:
    """A body is on its way (``Content-Length`` > 0, or chunked)."""
    if "transfer-encoding" in request.headers:
        return True
    return request.headers.get("content-length", "0").strip() not in ("", "0")


def _should_proxy(request: Request) -> bool:
    """Proxy a PUT whose body is already on the wire; redirect everything else.

    A PUT without a body is never proxied: Sluice's SDK sends its first hop
    empty to learn the owner from the 307 and then sends the body straight to
    the target; proxying that probe would write an empty object, and if the
    real upload then failed, the probe would have replaced the last
    acknowledged version (an empty object is still created by a 307 to the
    target, which gets the same empty body).
    """
    if ais_writes.is_probe(request):  # the aistore SDK over HTTPS: no body comes here
        return False
    return request.method == "PUT" and not _expects_continue(request) and _has_body(request)


async def _proxy_put(gw: Gateway, request: Request, location: str, obj: str) -> Response:
    """Stream the body of a PUT to its owner and pass the owner's answer back."""
    headers = {
        k: v
        for k, v in request.headers.items()
        if k in ("content-length", "content-type", "authorization", "if-match", "if-none-match")
        or k.startswith("x-sluice-meta-")
    }
    try:
        upload = gw.http.build_request(
            "PUT", location, content=request.stream(), headers=headers, timeout=UPLOAD_TIMEOUT
        )
        r = await gw.http.send(upload)
    except ClientDisconnect:
        raise InvalidRequest(f"the client went away while uploading {obj}") from None
    except httpx.HTTPError as e:
        raise NoTargets(
            f"the owner of {obj} did not take the upload ({type(e).__name__}: {e}); retry",
            object=obj,
        ) from None
    kept = {k: v for k, v in r.headers.items() if k.lower() in PASSED_BACK}
    return Response(r.content, r.status_code, headers=kept)


async def _drain(request: Request) -> None:
    """Read and drop a body the client already sends, so it can read our 307 cleanly.

    A client that asked ``Expect: 100-continue`` (curl, for big uploads) has
    not sent it: we answer without reading, and it sends the body to the target.
    """
    if _expects_continue(request) or ais_writes.is_probe(request):  # no body comes
        return
    try:
        async for _ in request.stream():
            pass
    except (RuntimeError, ClientDisconnect):  # already read (proxied), or the client left
        pass


async def _view_read(
    gw: Gateway, request: Request, bucket: str, name: str, view: dict[str, Any]
) -> Response:
    """A call on an ETL view's object: a read of the source's, through the view's ETL."""
    if request.method in MUTATING:
        raise views.refuse_write(bucket, name, request.method)
    if request.method == "HEAD":
        return await views.head(gw, bucket, view, name)
    extra = views.source_params(request, bucket, view)
    src = views.check_source(gw, bucket, view)
    gw.require_read(request, src)  # a view's reader must be allowed its source too
    location = redirect_location(gw, request, src, name, extra)
    return Response(status_code=307, headers={"Location": location})


def redirect_router(gw: Gateway) -> FastRouter:
    router = FastRouter()

    @each_method(router, "/v1/objects/{bucket}", METHODS)
    async def missing_object_name(bucket: str, request: Request) -> None:
        gw.require_read(request, bucket)  # the credentials first, like every route
        raise InvalidName(f"missing object name: use /v1/objects/{bucket}/<object>", bucket=bucket)

    @each_method(router, "/v1/objects/{bucket}/{name:path}", METHODS)
    async def object_call(bucket: str, name: str, request: Request) -> Response:
        proxy = _should_proxy(request)
        try:
            # The credentials first (core/access.py): a 401/403 before any 400. A copy
            # (POST) writes its source's bucket too, as far as a token is concerned: a
            # token has one permission, and the copy needs write for its destination.
            if request.method in MUTATING:
                gw.require_write(request, bucket)
            else:
                gw.require_read(request, bucket)
            validate_names(bucket, name)
            if ais_objects.is_copy(request):  # obj.copy(to_obj): read here, write there
                return await ais_objects.copy_object(gw, request, bucket, name)
            if ais_writes.is_ais_write(request):  # multipart, append: parts, then the object
                return await ais_writes.answer(gw, request, bucket, name)
            if ais_shards.is_arch_read(request):  # archpath / archregx: files in a shard
                return await ais_shards.read(gw, request, bucket, name)
            if ais_props.is_props_head(request):  # obj.head(props=): AIStore's headers
                return await ais_props.head(gw, request, bucket, name)
            if request.method == "PATCH":  # set_custom_props(): the object rewritten
                return await ais_props.set_custom(gw, request, bucket, name)
            refuse_unknown_object_params(request, bucket, name)
            if (view := views.view_of(gw, bucket)) is not None:
                return await _view_read(gw, request, bucket, name, view)
            await remote_gateway.ensure_bucket(gw, request, bucket)
            if "etl_pipeline" in request.query_params:  # every step known, modes alike (after auth)
                q = request.query_params
                await check_chain_async(
                    gw.backend.get, parse_chain(q.get("etl_name"), q["etl_pipeline"])
                )
            location = redirect_location(gw, request, bucket, name)
            if proxy:
                return await _proxy_put(gw, request, location, f"{bucket}/{name}")
        finally:  # also before an error answer, or the client may see a reset
            if request.method in MUTATING:
                await _drain(request)
        return Response(status_code=307, headers={"Location": location})

    router.fast("/v1/objects/{bucket}/{name:path}", METHODS)  # wire/http/fastpath.py
    return router
