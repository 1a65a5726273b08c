"""Object calls on the gateway: a 307 to the target that owns the object.

The gateway never touches object bytes. It validates the names (so a bad name
is a 400 here, not on some target), picks the target by ``placement.route``
(the HRW owner over the cluster map's members, or a reachable replica for a
read) and redirects with the query string preserved. 307 keeps the method and body, so
``curl -L``, ``httpx(follow_redirects=True)`` and ``requests`` re-send a PUT
to the target. Those clients drop ``Authorization`` when the port changes, so
for a caller that showed a valid token the gateway signs the redirect
(``sluice_exp``/``sluice_sig``) for exactly that method and object.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response

from etl_runtime import auth
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.errors import InvalidName
from etl_runtime.gateway.placement import route
from etl_runtime.target.access import SIGNATURE_PARAMS, object_path, object_url
from etl_runtime.target.names import validate_names

MUTATING = frozenset({"PUT", "POST", "DELETE", "PATCH"})
METHODS = ["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH"]


def redirect_location(gw: Gateway, request: Request, bucket: str, name: str) -> str:
    owner = route(gw, request.method, bucket, name)
    query = [
        (k, v)
        for k, v in parse_qsl(request.url.query, keep_blank_values=True)
        if k not in SIGNATURE_PARAMS
    ]
    if gw.token and gw.cluster_key and gw.caller_has_token(request):
        signed = auth.sign_redirect(gw.cluster_key, request.method, object_path(bucket, name))
        query += list(signed.items())
    location = object_url(owner.url, bucket, name)
    return f"{location}?{urlencode(query)}" if query else location


async def _drain(request: Request) -> None:
    """Read and drop a body the client already sends, so it can read our 307 cleanly.

    A client that asked ``Expect: 100-continue`` (curl, for big uploads) has
    not sent it: we answer without reading, and it sends the body to the target.
    """
    if request.headers.get("expect", "").lower() == "100-continue":
        return
    async for _ in request.stream():
        pass


def redirect_router(gw: Gateway) -> APIRouter:
    router = APIRouter()

    @router.api_route("/v1/objects/{bucket}", methods=METHODS)
    async def missing_object_name(bucket: str) -> None:
        raise InvalidName(f"missing object name: use /v1/objects/{bucket}/<object>", bucket=bucket)

    @router.api_route("/v1/objects/{bucket}/{name:path}", methods=METHODS)
    async def object_call(bucket: str, name: str, request: Request) -> Response:
        try:
            validate_names(bucket, name)
            if request.method in MUTATING:
                gw.require_write(request)
            location = redirect_location(gw, request, bucket, name)
        finally:  # also before an error answer, or the client may see a reset
            if request.method in MUTATING:
                await _drain(request)
        return Response(status_code=307, headers={"Location": location})

    return router
