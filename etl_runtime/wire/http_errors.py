"""FastAPI's side of the error tree: every error answered as ``{"error", "kind", ...}`` JSON.

The gateway and the storage targets install these handlers, so a bad request,
an unknown route or a bug is answered in the shape the SDK reads
(``etl_runtime.core.errors``), never as an HTML page or a bare traceback.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from etl_runtime.core.errors import InvalidRequest, SluiceError

log = logging.getLogger(__name__)


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
