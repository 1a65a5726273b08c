"""``FastPathApp``: the per-object routes of a transformer, answered before FastAPI's routing.

A cheap transform costs less than FastAPI's way to its endpoint: Starlette's
error, telemetry and exception middleware, route matching against every
route, the endpoint wrapper and dependency solving come to more CPU per
request than an identity transform's whole call. ``FastPathApp`` is the
FastAPI app with one shortcut in front: a route added with
``add_fast_route(method, endpoint)`` (path ``/{bucket}/{object:path}``, or
another one: the batch ``POST``) is matched by its own compiled path regex
and its endpoint called directly as ``endpoint(request, bucket, object)``
(the path's parameters); every other request (``/health``,
``/stats``, ``/logs``, ``/metrics``, other methods) goes through FastAPI.

What a user sees does not change:

* the route is a FastAPI route too (OpenAPI, ``scope["route"]``), so
  ``/metrics`` labels it with its template;
* the app's own middleware (``add_middleware``: the request metrics) wraps
  the shortcut as it wraps FastAPI's routes;
* an exception raised before the answer starts goes to the app's exception
  handlers (``SluiceError`` -> its JSON body and status), looked up by
  the exception's class like Starlette does; one without a handler
  propagates, and uvicorn answers 500; an exception once the answer started
  propagates too, so uvicorn aborts the connection.

The endpoint must read what it needs from the request itself (query,
headers, body): no FastAPI parameters or dependencies are solved on this path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

OBJECT_PATH = "/{bucket}/{object:path}"
Endpoint = Callable[..., Awaitable[Response]]


class FastPathApp(FastAPI):
    """FastAPI, with ``add_fast_route`` routes served ahead of its routing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fast_routes: dict[str, tuple[APIRoute, Endpoint]] = {}
        self._fast_stack: ASGIApp | None = None

    def add_fast_route(self, method: str, endpoint: Endpoint, path: str = OBJECT_PATH) -> None:
        """Serve ``method path`` with ``endpoint(request, **path_params)``: for the object
        path ``endpoint(request, bucket, object)``."""
        self.add_api_route(path, endpoint, methods=[method])
        route = self.routes[-1]
        assert isinstance(route, APIRoute)
        self.fast_routes[method] = (route, endpoint)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in self.fast_routes:
            route, _ = self.fast_routes[scope["method"]]
            match = None if scope.get("root_path") else route.path_regex.match(scope["path"])
            if match is not None:
                scope["app"] = self
                scope["route"] = route
                scope["path_params"] = match.groupdict()
                if self._fast_stack is None:
                    self._fast_stack = self._build_fast_stack()
                await self._fast_stack(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _build_fast_stack(self) -> ASGIApp:
        app: ASGIApp = self._serve_fast
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return app

    async def _serve_fast(self, scope: Scope, receive: Receive, send: Send) -> None:
        _, endpoint = self.fast_routes[scope["method"]]
        params = scope["path_params"]
        request = Request(scope, receive)
        try:
            response = await endpoint(request, **params)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> Callable[..., Awaitable[Response]] | None:
        for cls in type(exc).__mro__:
            handler = self.exception_handlers.get(cls)
            if handler is not None:
                return handler  # type: ignore[return-value]
        return None
