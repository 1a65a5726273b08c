"""``wire.fastpath``: hot routes answered ahead of FastAPI's routing, as FastAPI would answer them.

A real uvicorn on loopback, on both event loops. What a client or an operator
would notice if the shortcut differed from FastAPI: the answer, the error
answer, the metrics' route label, and which route a path goes to.
"""

from __future__ import annotations

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from etl_runtime.core.errors import ObjectNotFound
from etl_runtime.core.metrics import install_metrics
from etl_runtime.wire.http.errors import install_error_handlers
from etl_runtime.wire.http.fastpath import FastPathApp, FastRouter
from tests.servers import serve_in_thread


def make_app() -> FastPathApp:
    app = FastPathApp()
    install_error_handlers(app)
    install_metrics(app, "gateway")
    router = FastRouter()

    @router.get("/o/{bucket}/")
    async def listing(bucket: str, request: Request) -> Response:
        return JSONResponse({"listing": bucket})

    @router.get("/o/{bucket}/{name:path}")
    async def get(bucket: str, name: str, request: Request) -> Response:
        if name == "missing":
            raise ObjectNotFound(f"{bucket}/{name} does not exist", bucket=bucket, object=name)
        if name == "boom":
            raise RuntimeError("unexpected")
        return JSONResponse(
            {"bucket": bucket, "name": name, "fast": "sluice.fast" in request.scope}
        )

    async def wrapped(request: Request, call: object) -> Response:
        response: Response = await call  # type: ignore[misc]
        response.headers["x-wrapped"] = "1"
        return response

    @router.put("/o/{bucket}/{name:path}")
    async def put(bucket: str, name: str, request: Request) -> Response:
        return JSONResponse({"size": len(await request.body())})

    router.fast("/o/{bucket}/{name:path}", ["GET"])
    router.fast("/o/{bucket}/{name:path}", ["PUT"], wrap=wrapped)
    outer = FastRouter()
    outer.include_router(router)  # fast marks survive a nested include
    app.include_router(outer)
    return app


def test_fast_routes_answer_like_fastapi(loop_name: str) -> None:
    with serve_in_thread(make_app(), loop=loop_name) as url, httpx.Client(base_url=url) as c:
        r = c.get("/o/b/dir/x.jpg")
        assert r.status_code == 200
        assert r.json() == {"bucket": "b", "name": "dir/x.jpg", "fast": True}

        # An error before the answer: the app's handler, with its status and names.
        r = c.get("/o/b/missing")
        assert r.status_code == 404
        assert "b/missing" in r.json()["error"]

        # An empty parameter goes through FastAPI, which gives it to the earlier route.
        assert c.get("/o/b/").json() == {"listing": "b"}

        # A method with no fast route: FastAPI, unchanged.
        assert c.delete("/o/b/x").status_code == 405

        r = c.put("/o/b/x", content=b"12345")
        assert r.json() == {"size": 5} and r.headers["x-wrapped"] == "1"

        # The request metrics label a fast route by its template, like FastAPI's.
        text = c.get("/metrics").text
        lines = [ln for ln in text.splitlines() if ln.startswith("sluice_http_requests_total{")]
        assert any('route="/o/{bucket}/{name:path}"' in ln and 'status="200"' in ln for ln in lines)
        assert any('route="/o/{bucket}/{name:path}"' in ln and 'status="404"' in ln for ln in lines)


def test_an_unhandled_error_is_a_500_not_a_hang(loop_name: str) -> None:
    with serve_in_thread(make_app(), loop=loop_name) as url, httpx.Client(base_url=url) as c:
        r = c.get("/o/b/boom")
        assert r.status_code == 500
        assert c.get("/o/b/after").status_code == 200  # the server goes on
