"""S3 error answers: every error under ``/s3`` as S3's XML ``<Error>`` with S3's code.

``S3Error`` (``core/errors.py``) carries its code; any other ``SluiceError``
(raised here, or a target's JSON answer re-raised by ``from_target``) is
mapped by its ``kind``. A ``HEAD`` gets the status and no body, as from S3.
``S3Route`` is the route class of the S3 router: it catches errors in its
handlers, so the rest of the gateway keeps its JSON errors.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import httpx
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute

from etl_runtime.core.errors import S3Error, SluiceError
from etl_runtime.gateway.s3 import xml

log = logging.getLogger(__name__)

# Sluice kind -> (S3 code, status); the status of the Sluice class when None.
KIND_CODES: dict[str, tuple[str, int]] = {
    "BucketNotFound": ("NoSuchBucket", 404),
    "ObjectNotFound": ("NoSuchKey", 404),
    "NotFound": ("NoSuchKey", 404),
    "Unauthorized": ("AccessDenied", 403),
    "ViewReadOnly": ("AccessDenied", 403),
    "PreconditionFailed": ("PreconditionFailed", 412),
    "RangeNotSatisfiable": ("InvalidRange", 416),
    "InvalidName": ("InvalidArgument", 400),
    "InvalidRequest": ("InvalidRequest", 400),
    "BadRequest": ("InvalidRequest", 400),
    "BucketExists": ("BucketAlreadyOwnedByYou", 409),
    "ObjectConflict": ("InvalidArgument", 409),
    "InsufficientStorage": ("InsufficientStorage", 507),
    "NoTargets": ("ServiceUnavailable", 503),
    "TargetAway": ("ServiceUnavailable", 503),
    "Unavailable": ("ServiceUnavailable", 503),
}


def s3_error(err: SluiceError) -> S3Error:
    if isinstance(err, S3Error):
        return err
    # A kind with no S3 code keeps its name and status (EtlNotFound 404, EtlStopped 409,
    # TransformError 400...): S3 clients show any code, and a 4xx must not become a 500.
    fallback = err.kind if err.status < 500 and err.kind else "InternalError"
    code, status = KIND_CODES.get(err.kind, (fallback, err.status))
    out = S3Error(code, status, err.message, **err.context)
    out.headers = {k: v for k, v in err.headers.items() if k.lower() == "retry-after"}
    return out


def from_target(r: httpx.Response, body: bytes) -> S3Error:
    """A target's JSON error answer (``{"error", "kind", ...}``) as an S3 error."""
    return from_target_parts(r.status_code, r.headers, body)


def from_target_parts(status: int, headers: Mapping[str, str], body: bytes) -> S3Error:
    """``from_target`` for an answer of any client: status, headers (lower-case), body."""
    try:
        import json

        data = json.loads(body) if body else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    err = SluiceError(str(data.get("error") or f"a target answered {status}"))
    err.status = status
    err.kind = str(data.get("kind") or _kind_of_status(status))
    if "retry-after" in headers:
        err.headers = {"Retry-After": headers["retry-after"]}
    return s3_error(err)


def _kind_of_status(status: int) -> str:
    return {404: "ObjectNotFound", 412: "PreconditionFailed", 416: "RangeNotSatisfiable"}.get(
        status, "SluiceError" if status >= 500 else "BadRequest"
    )


def error_response(request: Request, err: S3Error) -> Response:
    headers = {"x-amz-request-id": uuid.uuid4().hex[:16].upper(), **err.headers}
    if _has_body(request):
        # The body may be unread (refused before it came, e.g. under ``Expect:
        # 100-continue``): closing keeps its bytes from being read as the next request.
        headers["Connection"] = "close"
    if request.method == "HEAD":
        return Response(status_code=err.status, headers=headers)
    resource = request.url.path.removeprefix("/s3") or "/"
    return Response(
        xml.error(err.code, err.message, resource, headers["x-amz-request-id"]),
        err.status,
        headers=headers,
        media_type="application/xml",
    )


def _has_body(request: Request) -> bool:
    h = request.headers
    return "transfer-encoding" in h or h.get("content-length", "0").strip() not in ("", "0")


async def answered(request: Request, call: Awaitable[Response]) -> Response:
    """``call``'s answer, or its error as S3 XML (the S3 routes' fast path: ``wire.fastpath``)."""
    try:
        return await call
    except SluiceError as e:
        return error_response(request, s3_error(e))
    except RequestValidationError as e:
        return error_response(request, S3Error("InvalidArgument", 400, str(e.errors())))
    except Exception as e:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(request, S3Error("InternalError", 500, repr(e)))


class S3Route(APIRoute):
    """A route whose errors are answered as S3 XML."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            return await answered(request, handler(request))

        return answer
