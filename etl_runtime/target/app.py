"""The storage target's FastAPI app: object API, ETL forwarding, internal ETL API.

``create_target_app`` takes its collaborators by injection — an ``EtlRegistry``
from the local cluster or from Kubernetes — so the same app serves both, and
tests can hand it a dict-backed registry.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import PlainTextResponse

from etl_runtime.cluster import EtlRegistry
from etl_runtime.target.context import Target
from etl_runtime.target.errors import install_error_handlers
from etl_runtime.target.etl_forward import EtlForwarder
from etl_runtime.target.objects import object_router
from etl_runtime.target.store import ObjectStore


def create_target_app(
    target_id: str,
    data_dir: Path | str,
    registry: EtlRegistry,
    token: str | None = None,
    cluster_key: str | None = None,
) -> FastAPI:
    store = ObjectStore(data_dir)
    forwarder = EtlForwarder(target_id, registry, store, cluster_key)
    target = Target(
        id=target_id,
        store=store,
        registry=registry,
        forwarder=forwarder,
        token=token or None,
        cluster_key=cluster_key or None,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await forwarder.start()
        try:
            yield
        finally:
            await forwarder.stop()

    app = FastAPI(title=f"Sluice target {target_id}", lifespan=lifespan)
    app.state.target = target
    install_error_handlers(app)
    app.include_router(object_router(target))

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "role": "target", "id": target_id}

    @app.get("/v1/_etl/{name}/stats")
    async def etl_stats(name: str) -> dict[str, Any]:
        return await forwarder.stats(name)

    @app.get("/v1/_etl/{name}/logs", response_class=PlainTextResponse)
    async def etl_logs(name: str, tail: int = Query(200, ge=1, le=100_000)) -> str:
        return await forwarder.logs(name, tail)

    return app
