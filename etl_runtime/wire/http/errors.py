"""FastAPI's side of the error tree: every error answered as ``{"error", "kind", ...}`` JSON.

The gateway and the storage targets install these handlers, so a bad request,
an unknown route or a bug is answered in the shape the SDK reads
(``etl_runtime.core.errors``), never as an HTML page or a bare traceback.

A bug (an exception no handler expects) is answered by ``AnswerUnexpected``,
not by an exception handler for ``Exception``: Starlette runs that one in its
outermost middleware, answers, and then re-raises, and uvicorn closes a
connection whose request raised. A pooled client (the gateway, for a target)
then found its next request on that connection reset, and answered 503
"target unreachable" for a 500 that named nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from etl_runtime.core.errors import InvalidRequest, SluiceError

log = logging.getLogger(__name__)


def reason(exc: BaseException) -> str:
    """An unexpected exception, for an error body: an OSError without its file names
    (its ``str`` names the path, and no error body carries a filesystem path)."""
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or 'error'}"
    return repr(exc)


def error_response(err: SluiceError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


class AnswerUnexpected:
    """ASGI middleware: an unexpected exception before the answer began is a JSON 500
    naming this server (``context``, e.g. ``{"target": "t1"}``), and the connection
    stays open. After the first byte it is re-raised: the connection must break,
    so that no client takes a truncated answer for a whole one."""

    def __init__(self, app: Any, context: dict[str, Any] | None = None) -> None:
        self.app = app
        self.context = dict(context or {})
        self.who = " ".join(f"{k} {v!r}" for k, v in self.context.items()) or "this server"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            err = SluiceError(f"internal error on {self.who}: {reason(exc)}", **self.context)
            await error_response(err)(scope, receive, send)


def install_error_handlers(app: FastAPI, context: dict[str, Any] | None = None) -> None:
    """Answer every error as ``{"error", "kind", ...}`` JSON, never an HTML page.

    ``context`` names this server in the answer to a bug (``{"target": id}``)."""

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
        # Only what escapes AnswerUnexpected (a middleware outside it) gets here.
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(SluiceError(f"internal error: {reason(exc)}", **(context or {})))

    app.add_exception_handler(SluiceError, on_sluice_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
    app.add_middleware(AnswerUnexpected, context=context)
