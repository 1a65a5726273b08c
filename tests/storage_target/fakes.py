"""In-test stand-ins for the cluster protocols, and tiny real transformers.

The protocol fakes (``DictRegistry``) replace the local/Kubernetes registries;
the transformers are real FastAPI apps served by uvicorn on loopback that
speak the hpush protocol, so everything that moves bytes goes over sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from etl_runtime.cluster.records import EtlRecord, TransformerStatus
from etl_runtime.core import auth
from etl_runtime.core.spec import EtlSpec

CLUSTER_KEY = "test-cluster-key"
SOURCE = "def transform(data):\n    return data[::-1]\n"


class DictRegistry:
    """``EtlRegistry`` over a dict the test edits directly."""

    def __init__(self) -> None:
        self.records: dict[str, EtlRecord] = {}

    def get(self, name: str) -> EtlRecord | None:
        return self.records.get(name)

    def put(self, record: EtlRecord) -> None:
        self.records[record.name] = record


def record(
    name: str,
    endpoints: dict[str, str | None],
    *,
    ready: bool = True,
    phase: str = "Running",
    stopped: bool = False,
    arg_type: str = "",
    uid: str = "uid-1",
    mode: str = "object",
) -> EtlRecord:
    spec = EtlSpec.from_dict(
        {"code": {"source": SOURCE}, "argType": arg_type, "stopped": stopped, "mode": mode}
    )
    transformers = tuple(
        TransformerStatus(target=t, endpoint=ep, ready=ready, message=None if ready else "starting")
        for t, ep in endpoints.items()
    )
    return EtlRecord(name=name, uid=uid, spec=spec, phase=phase, transformers=transformers)


def transformer_app(
    etl: str, behavior: str = "reverse", uid: str = "uid-1", key: str = CLUSTER_KEY
) -> FastAPI:
    """A real hpush transformer: ``reverse`` bytes, ``abort`` mid-stream, or ``error`` 422."""
    app = FastAPI()
    expected = f"Bearer {auth.transformer_token(key, etl, uid)}"
    app.state.calls = []

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "etl": etl}

    @app.put("/{bucket}/{obj:path}")
    async def put(bucket: str, obj: str, request: Request) -> Response:
        if request.headers.get("authorization") != expected:
            return JSONResponse({"error": "bad transformer token", "etl": etl}, status_code=401)
        fqn = request.query_params.get("etl_fqn")
        data = await request.body()
        if fqn:
            with open(fqn, "rb") as f:
                data = f.read()
        app.state.calls.append(
            {
                "bucket": bucket,
                "object": obj,
                "args": request.query_params.get("etl_args"),
                "fqn": fqn,
                "body_len": len(await request.body()),
            }
        )
        if behavior == "error":
            return JSONResponse(
                {
                    "error": "ValueError: bad pixel",
                    "etl": etl,
                    "object": f"{bucket}/{obj}",
                    "sample": None,
                    "detail": "Traceback ...\nValueError: bad pixel",
                },
                status_code=422,
            )
        out = data[::-1]
        if behavior == "reverse" and len(out) < 65536:
            return Response(out, media_type="application/octet-stream")  # Content-Length

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(out), 65536):
                if behavior == "abort" and i >= 65536:
                    raise RuntimeError("user code crashed mid-stream")
                yield out[i : i + 65536]
                await asyncio.sleep(0)

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    @app.get("/stats")
    async def stats(request: Request) -> Response:
        if request.headers.get("authorization") != expected:
            return JSONResponse({"error": "bad transformer token"}, status_code=401)
        return JSONResponse(
            {
                "objects": len(app.state.calls),
                "samples": 0,
                "skipped": 1,
                "errors": 2,
                "bytes_in": 10,
                "bytes_out": 20,
                "last_errors": [{"time": 1.0, "object": "b/x", "sample": None, "error": "boom"}],
            }
        )

    @app.get("/logs")
    async def logs(request: Request, tail: int = 200) -> Response:
        if request.headers.get("authorization") != expected:
            return JSONResponse({"error": "bad transformer token"}, status_code=401)
        return PlainTextResponse(f"{etl} log line (tail={tail})\n")

    return app
