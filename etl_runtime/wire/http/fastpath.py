"""``FastPathApp``: a server's hot routes, answered before FastAPI's routing.

A cheap request costs less than FastAPI's way to its endpoint: Starlette's
error, telemetry and exception middleware, route matching against every
route (with FastAPI 0.165's included routers, each one a nested match), the
endpoint wrapper and dependency solving. Measured on the 2-core VM
(``git show f8a3f49:docs/benchmarks.md``, "Hot routes ahead of FastAPI's
routing"): a GET of
a trivial endpoint behind 80 routes in 10 included routers costs 250-460 µs
through FastAPI, 96 µs as the only route, 4 µs here. ``FastPathApp`` is the
FastAPI app with one shortcut in front: a route marked fast is matched by its
own compiled path regex (the route's ``path_regex``) and its endpoint called
directly as ``endpoint(request=request, **path_params)``; every other request
goes through FastAPI.

Two ways to mark a route:

* ``app.add_fast_route(method, endpoint, path)``: add the route to the app and
  serve it fast (the transformer's per-object routes: ``webserver/app.py``);
* a ``FastRouter`` (an ``APIRouter``) whose ``fast(path, methods, endpoint=None)``
  marks routes it already has; ``app.include_router`` then serves them fast.
  Without ``endpoint`` the route's own endpoint is called, so its parameters
  must be ``request`` and the path's parameters only (no query parameters,
  no dependencies: those are solved by FastAPI alone). ``wrap(request, call)``
  answers the call's errors where the route's class does (the S3 routes' XML
  errors).

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

A path several fast routes of one method match goes to the first marked, as
FastAPI's own order would only if they were registered in that order: mark
routes whose paths cannot overlap (they are ``/s3/...``, ``/v1/objects/...``,
``/v1/ml/moss``, ``/v1/_moss``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

OBJECT_PATH = "/{bucket}/{object:path}"
Endpoint = Callable[..., Awaitable[Response]]
Wrap = Callable[[Request, Awaitable[Response]], Awaitable[Response]]


class FastRoute:
    """One route served fast: its FastAPI route, regex and endpoint."""

    __slots__ = ("route", "regex", "endpoint", "wrap")

    def __init__(self, route: APIRoute, endpoint: Endpoint, wrap: Wrap | None) -> None:
        self.route = route
        self.regex: re.Pattern[str] = route.path_regex
        self.endpoint = endpoint
        self.wrap = wrap


class FastRouter(APIRouter):
    """An ``APIRouter`` that marks some of its routes to be served fast by a ``FastPathApp``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fast_marks: list[tuple[str, FastRoute]] = []

    def fast(
        self,
        path: str,
        methods: Sequence[str],
        endpoint: Endpoint | None = None,
        wrap: Wrap | None = None,
    ) -> None:
        """Serve this router's routes at ``path`` for ``methods`` fast (see the module)."""
        for method in methods:
            route = self._route(path, method)
            call: Endpoint = endpoint or route.endpoint
            self.fast_marks.append((method, FastRoute(route, call, wrap)))

    def include_router(self, router: APIRouter, **kwargs: Any) -> None:  # type: ignore[override]
        """Include ``router``; a ``FastRouter``'s fast routes stay fast."""
        super().include_router(router, **kwargs)
        self.fast_marks.extend(_marks_of(router, kwargs))

    def _route(self, path: str, method: str) -> APIRoute:
        for route in self.routes:
            if (
                isinstance(route, APIRoute)
                and route.path == path
                and method in (route.methods or ())
            ):
                return route
        raise LookupError(f"no {method} {path} route to serve fast")


def _marks_of(router: APIRouter, kwargs: dict[str, Any]) -> list[tuple[str, FastRoute]]:
    if not isinstance(router, FastRouter):
        return []
    if kwargs.get("prefix") or router.prefix:
        raise ValueError("a FastRouter's fast routes are matched without a prefix")
    return router.fast_marks


class FastPathApp(FastAPI):
    """FastAPI, with fast routes served ahead of its routing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fast_routes: dict[str, list[FastRoute]] = {}
        self._fast_stack: ASGIApp | None = None

    def add_fast_route(self, method: str, endpoint: Endpoint, path: str = OBJECT_PATH) -> None:
        """Serve ``method path`` with ``endpoint(request=..., **path_params)``: for the object
        path ``endpoint(request, bucket, object)``."""
        self.add_api_route(path, endpoint, methods=[method])
        route = self.routes[-1]
        assert isinstance(route, APIRoute)
        self._mark(method, FastRoute(route, endpoint, None))

    def include_router(self, router: APIRouter, **kwargs: Any) -> None:  # type: ignore[override]
        super().include_router(router, **kwargs)
        for method, fast in _marks_of(router, kwargs):
            self._mark(method, fast)

    def _mark(self, method: str, fast: FastRoute) -> None:
        self.fast_routes.setdefault(method, []).append(fast)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            for fast in self.fast_routes.get(scope["method"], ()):
                match = fast.regex.match(scope["path"])
                if match is not None and all((params := match.groupdict()).values()):
                    scope["app"] = self
                    scope["route"] = fast.route
                    scope["path_params"] = params
                    scope["sluice.fast"] = fast
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
        fast: FastRoute = scope["sluice.fast"]
        request = Request(scope, receive)
        try:
            call = fast.endpoint(request=request, **scope["path_params"])
            response = await (call if fast.wrap is None else fast.wrap(request, call))
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
