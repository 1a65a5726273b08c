"""Errors of the object and ETL data path, each mapped to one HTTP status here.

Every failure a user can cause or observe is a ``SluiceError``; the class says
the HTTP status and the ``kind`` that appears in the JSON body, and the
instance carries the context (bucket, object, ETL, ...) so the message can
name the thing that went wrong::

    SluiceError
    ├── BadRequest (400)          InvalidName, InvalidRequest, InvalidSpec
    ├── Unauthorized (401)
    ├── NotFound (404)            BucketNotFound, ObjectNotFound, EtlNotFound
    ├── Conflict (409)            ObjectConflict, BucketExists, EtlStopped
    ├── PreconditionFailed (412)  ``If-Match`` names another version
    ├── RangeNotSatisfiable (416) ``Range`` starts past the end of the object
    ├── Unavailable (503)         EtlNotReady, NoTargets
    └── TransformerError          status and body chosen by the transformer

The gateway shares this hierarchy (``etl_runtime.gateway.errors`` re-exports it)
so both servers answer errors in the same ``{"error", "kind", ...}`` shape.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class SluiceError(Exception):
    status = 500
    kind = "InternalError"  # subclasses: their class name (see __init_subclass__)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = cls.__name__

    def __init__(self, message: str, headers: dict[str, str] | None = None, **context: Any):
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        self.context = {k: v for k, v in context.items() if v is not None}

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "kind": self.kind, **self.context}


class BadRequest(SluiceError):
    status = 400


class InvalidName(BadRequest):
    pass


class InvalidRequest(BadRequest):
    pass


class InvalidSpec(BadRequest):
    pass


class Unauthorized(SluiceError):
    status = 401

    def __init__(self, message: str = "", **context: Any):
        super().__init__(
            message or "this call changes data: send 'Authorization: Bearer <SLUICE_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
            **context,
        )


class NotFound(SluiceError):
    status = 404


class BucketNotFound(NotFound):
    pass


class ObjectNotFound(NotFound):
    pass


class EtlNotFound(NotFound):
    pass


class Conflict(SluiceError):
    status = 409


class ObjectConflict(Conflict):
    pass


class EtlStopped(Conflict):
    pass


class BucketExists(Conflict):
    pass


class PreconditionFailed(SluiceError):
    status = 412


class RangeNotSatisfiable(SluiceError):
    status = 416


def bucket_not_found(bucket: str) -> BucketNotFound:
    """The one message for a missing bucket.

    ``ais://<bucket>`` in the text is what the aistore SDK parses to raise
    ``ErrBckNotFound`` (and ``ais://<bucket>/<object>`` ``ErrObjNotFound``).
    """
    return BucketNotFound(
        f"bucket ais://{bucket} does not exist; create it with POST /v1/buckets/{bucket}",
        bucket=bucket,
    )


class Unavailable(SluiceError):
    status = 503

    def __init__(self, message: str, retry_after: int = 5, **context: Any):
        super().__init__(message, headers={"Retry-After": str(retry_after)}, **context)


class EtlNotReady(Unavailable):
    pass


class NoTargets(Unavailable):
    pass


class TransformerError(SluiceError):
    """A transformer answered an error: its status and JSON body are passed on."""

    def __init__(self, status: int, payload: dict[str, Any], **context: Any):
        super().__init__(str(payload.get("error") or f"transformer answered {status}"), **context)
        self.status = status
        self.payload = payload

    def body(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.payload, **self.context, "error": self.message}


def error_response(err: SluiceError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error as ``{"error", "kind", ...}`` JSON, never an HTML page."""

    async def on_sluice_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SluiceError)
        return error_response(exc)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        return error_response(InvalidRequest(f"bad request: {problems}"))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err = SluiceError(
            f"{request.method} {request.url.path}: {exc.detail}", headers=dict(exc.headers or {})
        )
        err.status, err.kind = exc.status_code, "NotFound" if exc.status_code == 404 else "HTTP"
        return error_response(err)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(SluiceError(f"internal error: {exc!r}"))

    app.add_exception_handler(SluiceError, on_sluice_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
