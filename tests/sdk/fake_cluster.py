"""A tiny gateway + target pair (real FastAPI apps) that speak the documented HTTP API.

Just enough of ``docs/http-api.md`` to pin down what the SDK puts on the
wire: the 307 dance, token handling, pagination, error bodies, ETL polling.
The real servers are exercised by ``tests/e2e``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.servers import serve_in_thread

TOKEN = "s3cret"


def error(status: int, message: str, kind: str, **context: Any) -> JSONResponse:
    return JSONResponse({"error": message, "kind": kind, **context}, status_code=status)


@dataclass
class State:
    token: str | None = None
    target_url: str = ""
    buckets: dict[str, dict[str, bytes]] = field(default_factory=dict)
    etls: dict[str, dict[str, Any]] = field(default_factory=dict)
    polls: dict[str, int] = field(default_factory=dict)
    gateway_bodies: list[bytes] = field(default_factory=list)
    target_puts: list[dict[str, Any]] = field(default_factory=list)

    def authorized(self, request: Request) -> bool:
        return not self.token or request.headers.get("authorization") == f"Bearer {self.token}"


def gateway_app(state: State) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/buckets")
    def buckets() -> dict[str, Any]:
        return {"buckets": sorted(state.buckets)}

    @app.post("/v1/buckets/{bucket}")
    async def create(bucket: str, request: Request) -> Any:
        if not state.authorized(request):
            return error(401, "missing or wrong token", "Unauthorized")
        if (await request.json()).get("action") != "create-bck":
            return error(400, "unknown action", "BadRequest", bucket=bucket)
        created = bucket not in state.buckets
        state.buckets.setdefault(bucket, {})
        return {"bucket": bucket, "created": created}

    @app.get("/v1/buckets/{bucket}")
    def list_objects(bucket: str, prefix: str = "", start_after: str = "", limit: int = 1000):
        if bucket not in state.buckets:
            return error(404, f"bucket {bucket!r} does not exist", "NotFound", bucket=bucket)
        names = sorted(n for n in state.buckets[bucket] if n.startswith(prefix) and n > start_after)
        page = names[:limit]
        objects = [
            {"name": n, "size": len(state.buckets[bucket][n]), "etag": f"e-{n}", "mtime": 1.5}
            for n in page
        ]
        return {"objects": objects, "next": page[-1] if len(names) > limit else None}

    @app.api_route("/v1/objects/{bucket}/{obj:path}", methods=["GET", "PUT", "HEAD", "DELETE"])
    async def redirect(bucket: str, obj: str, request: Request) -> Response:
        state.gateway_bodies.append(await request.body())
        if ".." in obj.split("/"):
            return error(400, f"invalid object name {obj!r}", "BadRequest", bucket=bucket)
        if request.method != "GET" and not state.authorized(request):
            return error(401, "missing or wrong token", "Unauthorized")
        query = request.url.query
        location = f"{state.target_url}{request.url.path}" + (f"?{query}" if query else "")
        return Response(status_code=307, headers={"location": location})

    @app.put("/v1/etl")
    async def init(request: Request) -> Any:
        body = await request.json()
        name, spec = body["name"], body["spec"]
        if spec.get("mode") not in ("object", "wds"):
            return error(400, "spec.mode must be one of ('object', 'wds')", "InvalidSpec", etl=name)
        state.etls[name] = spec
        state.polls[name] = 0
        return {"name": name, "phase": "Initializing", "ready": 0, "total": 3}

    @app.get("/v1/etl/{name}")
    def details(name: str, request: Request) -> Any:
        if name not in state.etls:
            return error(404, f"ETL {name!r} does not exist", "NotFound", etl=name)
        if name.startswith("old-gw") and "wait" in request.query_params:  # before ?wait=
            return error(400, f"unknown query parameter(s) wait for GET /v1/etl/{name}",
                         "InvalidRequest")  # fmt: skip
        state.polls[name] += 1
        if name.startswith("broken"):
            return {"name": name, "phase": "Error", "message": "boom: cannot load code"}
        if name.startswith("slow") or state.polls[name] < 3:
            return {"name": name, "phase": "Initializing", "ready": 1, "total": 3}
        return {"name": name, "phase": "Running", "ready": 3, "total": 3, "mode": "object"}

    return app


def target_app(state: State) -> FastAPI:
    app = FastAPI()

    @app.api_route("/v1/objects/{bucket}/{obj:path}", methods=["GET", "PUT", "HEAD", "DELETE"])
    async def objects(bucket: str, obj: str, request: Request) -> Response:
        ctx = {"bucket": bucket, "object": obj}
        if request.method in ("PUT", "DELETE") and not state.authorized(request):
            return error(401, "missing or wrong token", "Unauthorized")
        if bucket not in state.buckets:
            return error(404, f"bucket {bucket!r} does not exist", "NotFound", **ctx)
        store = state.buckets[bucket]
        if request.method == "PUT":
            data = await request.body()
            state.target_puts.append({"length": request.headers.get("content-length")})
            store[obj] = data
            return JSONResponse({"bucket": bucket, "object": obj, "size": len(data), "etag": "x1"})
        if obj.startswith("cut"):
            return cut_response("length" if obj == "cut-length" else "chunked")
        if obj not in store:
            return error(404, f"object {bucket}/{obj} does not exist", "NotFound", **ctx)
        if request.method == "DELETE":
            del store[obj]
            return JSONResponse({})
        data = store[obj]
        headers = {"etag": '"x1"', "last-modified": "Wed, 21 Oct 2015 07:28:00 GMT"}
        if request.method == "HEAD":
            return Response(headers={**headers, "content-length": str(len(data))})
        etl = request.query_params.get("etl_name")
        if etl == "echo-args":
            return Response(request.query_params.get("etl_args", "").encode())
        if etl == "fails":
            return error(
                422,
                "transform raised ValueError: bad",
                "TransformError",
                etl=etl,
                sample="s-007",
                detail="Traceback ...",
                **ctx,
            )
        if etl == "stopped":
            return error(409, f"ETL {etl!r} is stopped", "Conflict", etl=etl, **ctx)
        if etl is not None:
            return error(404, f"ETL {etl!r} does not exist", "NotFound", etl=etl, **ctx)
        return Response(data, headers=headers)

    return app


def cut_response(mode: str) -> Response:
    """A body that dies half way: chunked, or short of its Content-Length."""

    def chunks() -> Iterator[bytes]:
        yield b"x" * 1000
        raise RuntimeError("transformer died")

    headers = {"content-length": "5000"} if mode == "length" else {}
    return StreamingResponse(chunks(), headers=headers)


@contextlib.contextmanager
def fake_cluster(token: str | None = None) -> Iterator[tuple[str, State]]:
    state = State(token=token)
    with serve_in_thread(target_app(state)) as target_url:
        state.target_url = target_url
        with serve_in_thread(gateway_app(state)) as gateway_url:
            yield gateway_url, state
