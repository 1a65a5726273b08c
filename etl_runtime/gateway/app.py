"""The gateway's FastAPI app: redirects, buckets, the ETL API, cluster view.

``create_gateway_app`` takes a ``TargetDiscovery`` and an ``EtlBackend`` by
injection; ``__main__`` wires the local or Kubernetes implementations.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

from etl_runtime.cluster.clustermap import ClusterMapStore
from etl_runtime.cluster.records import EtlBackend, TargetDiscovery
from etl_runtime.core.access import CredentialGate
from etl_runtime.core.jsonbody import BodyLimit
from etl_runtime.core.metrics import TargetStateCollector, install_metrics
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway.aisjobs import cluster_router
from etl_runtime.gateway.buckets import bucket_router
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.dsort import dsort_router
from etl_runtime.gateway.etl_api import etl_router
from etl_runtime.gateway.getbatch_routes import batch_router
from etl_runtime.gateway.inprotocol import answerer as batch_answerer
from etl_runtime.gateway.job_monitor import JobMonitor
from etl_runtime.gateway.jobs import jobs_router
from etl_runtime.gateway.membership import MembershipSource, RebalanceMonitor, join
from etl_runtime.gateway.redirect import redirect_router
from etl_runtime.gateway.s3 import KeyStore, s3_router
from etl_runtime.gateway.s3.early import early_starter
from etl_runtime.gateway.s3.root import S3AtRoot
from etl_runtime.gateway.smap import check_ready, daemon_router
from etl_runtime.gateway.tokens_api import tokens_router
from etl_runtime.gateway.ui import ui_router
from etl_runtime.wire.clients.duplex import DuplexClient
from etl_runtime.wire.http.errors import install_error_handlers
from etl_runtime.wire.http.fastpath import FastPathApp


def _s3_call(scope: dict[str, Any]) -> bool:
    path: str = scope["path"]
    return path == "/s3" or path.startswith("/s3/")


def _data_call(scope: dict[str, Any]) -> bool:
    """A call whose body is object data (an object PUT, the S3 API with its own bounds),
    or an object call that reads none (GET, HEAD, DELETE: the data path, unwrapped)."""
    path: str = scope["path"]
    object_call = path.startswith("/v1/objects/") and scope["method"] not in ("POST", "PATCH")
    return object_call or _s3_call(scope)


def create_gateway_app(
    discovery: TargetDiscovery,
    etl_backend: EtlBackend,
    token: str | None = None,
    cluster_key: str | None = None,
    cluster_map: ClusterMapStore | None = None,
    members: list[str] | None = None,
    membership: MembershipSource | None = None,
    read_token: str | None = None,
    s3_keys: Path | KeyStore | None = None,
    batch_assembly: str = "target",
) -> FastAPI:
    """The gateway; with ``cluster_map`` placement is over its members (see placement).

    ``s3_keys``: the file of the S3 API's keys (``gateway/s3/keys.py``), or a
    ``KeyStore`` (Kubernetes: ``kubekeys.KubeKeyStore``); None: no keys.
    ``batch_assembly``: who assembles a GetBatch, ``target`` (a designated one,
    ``gateway/getbatch_routes.py``) or ``gateway``.
    """
    keys = s3_keys if isinstance(s3_keys, KeyStore) else KeyStore(s3_keys)
    gw = Gateway(
        discovery,
        etl_backend,
        token=token or None,
        cluster_key=cluster_key or None,
        cmap=cluster_map,
        members=members,
        membership=membership,
        read_token=read_token or None,
    )
    monitor = RebalanceMonitor(gw)
    job_monitor = JobMonitor(gw)  # fails a job whose member stays away (job_monitor.py)
    # GetBatch reads items with it, the S3 API its GETs: pooled per target, no scans.
    batch_http = DuplexClient()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        await join(gw)
        if membership is not None and cluster_map is not None:
            await membership.start(cluster_map)
        await monitor.start()
        await job_monitor.start()
        try:
            yield
        finally:
            await job_monitor.stop()
            await monitor.stop()
            if membership is not None:
                await membership.stop()
            await batch_http.aclose()
            await gw.stop()

    # FastPathApp: the object, S3 object and GetBatch routes skip FastAPI's routing.
    app = FastPathApp(title="Sluice gateway", lifespan=lifespan)
    app.state.gateway = gw
    app.state.starter = early_starter(gw)  # for run_server: S3 GetObject's owner GET, early
    install_error_handlers(app)
    # Inside the metrics and S3AtRoot (added after it): a call without credentials is a
    # 401 before any route reads it (core/access.py); the S3 API checks its signatures.
    app.add_middleware(BodyLimit, unbounded=_data_call)  # 413 over 16 MiB (core/jsonbody.py)
    app.add_middleware(CredentialGate, holder=gw, passes=_s3_call)

    def known() -> list[str]:
        members = gw.cmap.get().members if gw.cmap else []
        return list(dict.fromkeys([*members, *(t.id for t in gw.known_targets())]))

    install_metrics(app, "gateway", TargetStateCollector(known, gw.alive_ids, gw.down_reasons))
    # for run_server: GetBatch's 307 to its designated target, outside ASGI
    designates = batch_assembly == "target"
    app.state.answerer = batch_answerer(gw, app.state.http_metrics) if designates else None
    app.include_router(redirect_router(gw))
    app.include_router(bucket_router(gw))
    app.include_router(etl_router(gw))
    app.include_router(jobs_router(gw))
    app.include_router(dsort_router(gw))
    app.include_router(tokens_router(gw))  # /v1/tokens: access tokens scoped to buckets
    app.include_router(batch_router(gw, batch_http, batch_assembly))  # GetBatch: GET /v1/ml/moss
    app.include_router(ui_router(gw))  # /ui, the status page, and its /v1/ui/summary
    app.include_router(s3_router(gw, keys, batch_http))  # /s3/..., /v1/s3/keys
    app.add_middleware(S3AtRoot)  # S3 at the root too: /BUCKET/KEY as /s3/BUCKET/KEY
    app.include_router(cluster_router(gw))  # /v1/cluster: Sluice's view, AIStore's job queries
    app.include_router(daemon_router(gw))  # /v1/daemon?what=smap: AIStore's cluster map

    @app.get("/v1/health")
    async def health(request: Request) -> dict[str, Any]:
        refuse_unknown(request, ("prr",))
        if request.query_params.get("prr", "").lower() == "true":  # aistore SDK: is_ready()
            check_ready(gw)
        return {"status": "ok", "role": "gateway", "targets": len(discovery.targets())}

    return app
