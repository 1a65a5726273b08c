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

from fastapi import FastAPI, Query, Request
from fastapi.responses import PlainTextResponse
from prometheus_client.registry import Collector

from etl_runtime.cluster.clustermap import ClusterMapStore
from etl_runtime.cluster.records import EtlRegistry
from etl_runtime.cluster.smap import smap_doc
from etl_runtime.core.access import CredentialGate, check, require_read
from etl_runtime.core.jsonbody import BodyLimit
from etl_runtime.core.metrics import RemoteCacheCollector, StorageCollector, install_metrics
from etl_runtime.core.params import refuse_unknown, refuse_what
from etl_runtime.etl.cacheindex import OutputCacheCollector
from etl_runtime.etl.forward import EtlForwarder
from etl_runtime.etl.outcache import OutputCache
from etl_runtime.providers.cache import RemoteCache
from etl_runtime.storage.copies import Placement
from etl_runtime.storage.integrity import IntegrityCollector
from etl_runtime.storage.peers import Peers
from etl_runtime.storage.rebalance import Rebalancer
from etl_runtime.storage.store import ObjectStore
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.fdbroker import FdBroker
from etl_runtime.storage_target.getbatch_routes import moss_router
from etl_runtime.storage_target.getbatch_share import batch_router
from etl_runtime.storage_target.handoff import FileHandoff, HandoffCollector
from etl_runtime.storage_target.inprotocol import answerer
from etl_runtime.storage_target.internal import internal_router
from etl_runtime.storage_target.multipart_sweep import MultipartSweep
from etl_runtime.storage_target.objects import object_router
from etl_runtime.storage_target.remote_routes import remote_router
from etl_runtime.wire.clients.duplex import DuplexClient
from etl_runtime.wire.http.errors import install_error_handlers
from etl_runtime.wire.http.fastpath import FastPathApp
from etl_runtime.wire.http.zerocopy import SendfileCollector


def _data_call(scope: dict[str, Any]) -> bool:
    """A call whose body is object data (an object PUT; its GET, HEAD and DELETE read
    none) or goes to an internal route (replicas, a job's shards: the servers' own)."""
    path: str = scope["path"]
    return path.startswith(("/v1/objects/", "/v1/_"))


def create_target_app(
    target_id: str,
    data_dir: Path | str,
    registry: EtlRegistry,
    token: str | None = None,
    cluster_key: str | None = None,
    cluster_map: ClusterMapStore | None = None,
    read_token: str | None = None,
) -> FastAPI:
    """A target; with ``cluster_map`` it keeps copies, rebalances and reads from neighbors."""
    peers = Peers(target_id, cluster_map, cluster_key) if cluster_map is not None else None
    store = ObjectStore(
        data_dir, bucket_known=lambda b: placement.bucket_known(b), target_id=target_id
    )
    placement = Placement(target_id, store, cluster_map, peers)
    rebalancer = (
        Rebalancer(target_id, store, cluster_map, peers)
        if cluster_map is not None and peers is not None
        else None
    )
    forwarder = EtlForwarder(target_id, registry, store, cluster_key)
    outcache = OutputCache(target_id, store)  # SLUICE_ETL_CACHE_BYTES; 0: none
    if outcache.budget:
        forwarder.cache = outcache
        store.on_change = outcache.drop  # a changed object's entries go at once
    target = Target(
        id=target_id,
        store=store,
        registry=registry,
        forwarder=forwarder,
        token=token or None,
        cluster_key=cluster_key or None,
        placement=placement,
        read_token=read_token or None,
        remote=RemoteCache(target_id, store, cluster_map) if cluster_map is not None else None,
    )

    from etl_runtime.storage_target.jobs import install_target_jobs  # jobs import target modules

    jobs = install_target_jobs(target, data_dir, cluster_map)

    moss_http = DuplexClient()  # a designated target's GETs of items outside shares
    sweep = MultipartSweep(store)  # abandoned S3 uploads: SLUICE_S3_UPLOAD_TTL (24 h)
    handoff = FileHandoff(target)  # S3 GETs' files to a gateway on this host (handoff.py)
    broker = FdBroker(target, cluster_key)  # objects' files to its transformers (fdbroker.py)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await forwarder.start()
        if forwarder.cache is not None:
            await forwarder.cache.start()
        if rebalancer is not None:
            await rebalancer.start()
        await jobs.manager.start()
        await sweep.start()
        await handoff.start()
        await broker.start()
        try:
            yield
        finally:
            await broker.stop()
            await handoff.stop()
            await sweep.stop()
            await jobs.manager.stop()
            if rebalancer is not None:
                await rebalancer.stop()
            if peers is not None:
                await peers.close()
            if forwarder.cache is not None:
                await forwarder.cache.stop()
            await forwarder.stop()
            await moss_http.aclose()

    # FastPathApp: the object GET/HEAD and GetBatch share routes skip FastAPI's routing.
    app = FastPathApp(title=f"Sluice target {target_id}", lifespan=lifespan)
    app.state.target = target
    install_error_handlers(app, {"target": target_id})
    # Inside the metrics: a call without credentials is a 401 before any route reads it.
    app.add_middleware(BodyLimit, unbounded=_data_call)  # 413 over 16 MiB (core/jsonbody.py)
    app.add_middleware(CredentialGate, holder=target)
    collectors: list[Collector] = [StorageCollector(target_id, data_dir)]
    if target.remote is not None:
        collectors.append(RemoteCacheCollector(target_id, target.remote.counters))
    collectors.append(SendfileCollector(target_id))
    collectors.append(HandoffCollector(target_id, handoff))
    collectors.append(IntegrityCollector(target_id))  # bad reads, repairs, scrub
    if forwarder.cache is not None:
        collectors.append(OutputCacheCollector(forwarder.cache.index))
    install_metrics(app, "target", *collectors)
    app.state.answerer = answerer(target, app.state.http_metrics)  # for run_server
    app.include_router(object_router(target))
    app.include_router(internal_router(store, cluster_key or None, rebalancer, target))
    app.include_router(remote_router(target))
    app.include_router(jobs.router)
    app.include_router(batch_router(target))  # GetBatch: this target's share
    app.include_router(moss_router(target, moss_http))  # GetBatch, as its designated target

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "role": "target", "id": target_id}

    @app.get("/v1/daemon")
    async def daemon(request: Request) -> dict[str, Any]:
        """AIStore's Smap from this target's map (the aistore SDK asks again after a 404)."""
        check(target, request, "read")  # the targets and their addresses: cluster-wide
        refuse_unknown(request, ("what",))
        refuse_what(request, ("smap",))
        if cluster_map is None:
            return smap_doc([(target_id, str(request.base_url), 0)], None, 0)
        m = cluster_map.get()
        return smap_doc([(t, m.urls[t], 0) for t in m.members if t in m.urls], None, m.version)

    def require_token(request: Request) -> None:
        """ETL stats and logs can carry user data (error messages): the token's holders only."""
        if token or read_token:
            require_read(request, read_token or token, token, None)

    @app.get("/v1/_etl/{name}/stats")
    async def etl_stats(name: str, request: Request) -> dict[str, Any]:
        require_token(request)
        refuse_unknown(request, (), etl=name)
        return await forwarder.stats(name)

    @app.get("/v1/_etl/{name}/logs", response_class=PlainTextResponse)
    async def etl_logs(
        name: str, request: Request, tail: int = Query(200, ge=1, le=100_000)
    ) -> str:
        require_token(request)
        refuse_unknown(request, ("tail",), etl=name)
        return await forwarder.logs(name, tail)

    return app
