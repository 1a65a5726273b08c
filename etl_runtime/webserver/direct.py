"""The direct answer: ``GET /<bucket>/<object>?etl_fqn=...`` served to the client itself.

A target relaying a transformer's answer handles every byte twice (receive,
send) on its event loop; for a 1 MiB identity ETL that relay cost the target
2.8–3.2 ms of CPU per object against 1.5 ms for a plain GET, more than the
transformer's own work (docs/benchmarks.md). So for an object at least
``SLUICE_ETL_REDIRECT_BYTES`` big whose file the transformer can read, the
target answers the client's ETL GET with a 307 to this route, signed with the
ETL's transformer token over the object, the file and the arguments
(``auth.sign_direct``; valid for ``auth.REDIRECT_TTL_SECONDS``). The client
follows it like the gateway's 307 (SDK, ``curl -L``, ``requests``, the
``aistore`` SDK), and the transformer reads the file and answers it: the
bytes cross one socket, as for a plain GET.

Everything else is the hpush path with ``etl_fqn``: the same modes (inline,
worker processes, WebDataset), the same errors (JSON before the first byte,
an aborted connection after it), the same counters; an error body is shaped
as a target's (``bucket`` and ``object`` apart), so SDKs cannot tell who
answered. A query parameter other than those the target writes is refused
with 400 naming it: it would be silently dropped otherwise, and a client may
have meant it for the ETL; so is one of them given twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from etl_runtime.core import auth
from etl_runtime.core.errors import BadRequest, NotReady, SluiceError, Unauthorized
from etl_runtime.core.params import ETL_SKIP, refuse_repeated
from etl_runtime.etl import grants
from etl_runtime.webserver.fqn import FqnAccess, released
from etl_runtime.webserver.objects import transform_object
from etl_runtime.webserver.shards import skip_of, transform_shard

if TYPE_CHECKING:
    from etl_runtime.webserver.transformer import Transformer

PARAMS = frozenset({"etl_fqn", "etl_args", "sluice_exp", "sluice_sig", grants.PARAM, ETL_SKIP})


def check_signature(transformer: Transformer, obj: str, request: Request) -> tuple[str, str | None]:
    """``(etl_fqn, etl_args)`` of a direct GET the target signed; else a 400 or 401."""
    q = request.query_params
    unknown = sorted(set(q.keys()) - PARAMS)
    if unknown:
        raise BadRequest(
            f"unknown query parameter(s) {', '.join(unknown)} on a direct ETL GET of {obj!r} "
            f"(allowed: {', '.join(sorted(PARAMS))}); GET the object through the gateway "
            "with ?etl_name= instead"
        )
    refuse_repeated(request)  # the signature covers one value of each
    fqn = q.get("etl_fqn")
    if not fqn:
        raise BadRequest(
            f"a GET of {obj!r} on a transformer needs etl_fqn; GET the object through "
            "the gateway with ?etl_name= instead"
        )
    args = q.get("etl_args")
    token = transformer.token
    if token is not None and not auth.verify_direct(
        token, obj, fqn, args, q.get("sluice_exp"), q.get("sluice_sig")
    ):
        raise Unauthorized(
            f"this direct ETL GET of {obj!r} is not signed by a target, or its signature "
            "expired; GET the object through the gateway with ?etl_name= again"
        )
    return fqn, args


async def direct_answer(
    transformer: Transformer, request: Request, bucket: str, object: str, access: FqnAccess
) -> Response:
    """Transform the file a target pointed us at and answer the client."""
    obj = f"{bucket}/{object}"
    try:
        return await _answer(transformer, request, obj, access)
    except SluiceError as e:
        body = e.hpush_body(transformer.name, obj)
        body.update(bucket=bucket, object=object)  # as the target would have answered it
        return JSONResponse(body, status_code=e.status, headers=e.headers or None)


async def _answer(
    transformer: Transformer, request: Request, obj: str, access: FqnAccess
) -> Response:
    fqn, args = check_signature(transformer, obj, request)
    if not transformer.ready:
        name = transformer.name
        raise NotReady(transformer.fatal or f"ETL {name!r} is still starting; retry shortly")
    skip = skip_of(transformer, request.query_params.get(ETL_SKIP), obj)  # unsigned: it
    # (the skip only leaves samples out of what the signature allows; the grant, beside
    # it, is the broker's to check: etl/grants.py)
    grant = request.query_params.get(grants.PARAM)
    header = ("X-Sluice-Etl", transformer.name)
    return await transform_one(transformer, request, obj, args, fqn, grant, skip, access, header)


async def transform_one(
    transformer: Transformer,
    request: Request,
    obj: str,
    args: str | None,
    fqn: str | None,
    grant: str | None,
    skip: int,
    access: FqnAccess,
    header: tuple[str, str],
) -> Response:
    """One object's answer, from its file (``fqn``, opened as ``access`` allows) or the
    request's body, with ``header`` set: what an hpush PUT and a direct GET answer."""
    held: list[int] = []  # the handed file's descriptor, closed once answered
    try:
        if fqn is not None:
            fqn = await access.one(obj, fqn, grant, held)
        stats = transformer.stats
        if transformer.inline is not None:
            response = await transformer.inline.transform(stats, request, obj, args, fqn)
        elif transformer.spec.mode == "wds":
            response = await transform_shard(transformer, request, obj, args, fqn, skip)
        else:
            response = await transform_object(transformer.pool, stats, request, obj, args, fqn)
    except BaseException:
        grants.close_all(held)
        raise
    response.headers[header[0]] = header[1]
    return released(response, held)
