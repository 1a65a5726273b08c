"""The gateway's FastAPI app: redirects, buckets, the ETL API, cluster view.

``create_gateway_app`` takes a ``TargetDiscovery`` and an ``EtlBackend`` by
injection; ``__main__`` wires the local or Kubernetes implementations.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from etl_runtime.cluster import EtlBackend, TargetDiscovery, TargetInfo
from etl_runtime.gateway.buckets import bucket_router
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.errors import install_error_handlers
from etl_runtime.gateway.etl_api import etl_router
from etl_runtime.gateway.redirect import redirect_router


def create_gateway_app(
    discovery: TargetDiscovery,
    etl_backend: EtlBackend,
    token: str | None = None,
    cluster_key: str | None = None,
) -> FastAPI:
    gw = Gateway(discovery, etl_backend, token=token or None, cluster_key=cluster_key or None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(title="Sluice gateway", lifespan=lifespan)
    app.state.gateway = gw
    install_error_handlers(app)
    app.include_router(redirect_router(gw))
    app.include_router(bucket_router(gw))
    app.include_router(etl_router(gw))

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "role": "gateway", "targets": len(discovery.targets())}

    @app.get("/v1/cluster")
    async def cluster() -> dict[str, Any]:
        live = {t.id for t in discovery.targets()}
        # Discoveries that know dead targets too (StaticTargets) expose all_targets().
        everyone: list[TargetInfo] = getattr(discovery, "all_targets", discovery.targets)()
        return {
            "targets": [
                {"id": t.id, "url": t.url, "node": t.node, "alive": t.id in live} for t in everyone
            ]
        }

    return app
