"""``each_method``: one FastAPI route per HTTP method, for an endpoint that serves several.

``@router.api_route(path, methods=[...])`` is one route whose OpenAPI
operations all get the same ``operationId`` (FastAPI derives it from the
route's first method): FastAPI warns "Duplicate Operation ID" and the spec
schemathesis reads (``tests/fuzz``) names several operations alike. One route
per method gives each its own (``{endpoint}{path}_{method}``); requests are
routed as before (a method no route takes is still a 405).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastapi import APIRouter

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def each_method(
    router: APIRouter, path: str, methods: Sequence[str]
) -> Callable[[Endpoint], Endpoint]:
    """Decorator: register the endpoint at ``path`` once for each of ``methods``."""

    def register(endpoint: Endpoint) -> Endpoint:
        for method in methods:
            router.add_api_route(path, endpoint, methods=[method])
        return endpoint

    return register
