"""GetBatch on a designated target: ``GET /v1/ml/moss[/{bucket}]``, redirected by the gateway.

AIStore's design: the gateway redirects a GetBatch (307, method and body
kept) to a target it picks at random (``gateway/getbatch_routes.py``), and that
target assembles the whole answer with ``getbatch/`` (the gateway's own
code): it asks every other target for its share of the items, reads its own
in its own process (``getbatch_local.py``) and streams the archive to the
client. The gateway then handles one small request per batch and none of its
bytes, and the assembly of many clients' batches is spread over every
target's CPU.

The gateway designates a target only while every member of the cluster map
is up, so this target takes every member as reachable (``TargetHost``); a
member that fails during the batch fails its items as it would under the
gateway (503, naming it). The gateway has checked the query, the caller and
the ETLs; this route checks the caller again (a token, or the gateway's
signature over the route, query and body: ``getbatch/serve.py``) and reads its
cluster map past the cache when the gateway planned with a newer one.
"""

from __future__ import annotations

import anyio.to_thread
from fastapi import Request
from fastapi.responses import Response

from etl_runtime.cluster.clustermap import ClusterMap, ClusterMapStore
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.access import batch_buckets, check
from etl_runtime.core.errors import InvalidRequest, NoTargets, bucket_not_found
from etl_runtime.core.jsonbody import parse_json
from etl_runtime.core.names import validate_bucket
from etl_runtime.core.params import refuse_unknown
from etl_runtime.getbatch.host import LocalShare
from etl_runtime.getbatch.serve import MAP_PARAM, QUERY, answer, signed_path
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.getbatch_local import local_opener
from etl_runtime.wire.clients.duplex import DuplexClient
from etl_runtime.wire.http.fastpath import FastRouter


class TargetHost:
    """``getbatch.host.BatchHost`` on a target: the cluster map's members, all reachable."""

    def __init__(self, target: Target, cmap: ClusterMapStore) -> None:
        self._target = target
        self.cmap: ClusterMapStore | None = cmap

    def _map(self, cmap: ClusterMap | None = None) -> ClusterMap:
        return (
            cmap if cmap is not None else self.cmap.get() if self.cmap is not None else ClusterMap()
        )

    def alive_ids(self) -> set[str]:
        return set(self._map().members)

    def suspect_ids(self) -> set[str]:
        return set()

    def known_targets(self) -> list[TargetInfo]:
        cmap = self._map()
        return [TargetInfo(id=m, url=cmap.urls[m]) for m in cmap.members if m in cmap.urls]

    def live_targets(self) -> list[TargetInfo]:
        found = self.known_targets()
        if not found:
            raise NoTargets("the cluster map lists no member with an address; retry shortly")
        return found

    def target_info(self, target_id: str, cmap: ClusterMap | None = None) -> TargetInfo | None:
        url = self._map(cmap).urls.get(target_id)
        return TargetInfo(id=target_id, url=url) if url else None

    def target_headers(self) -> dict[str, str]:
        held = self._target.token or self._target.read_token
        return {"Authorization": f"Bearer {held}"} if held else {}

    def local_share(self, target_id: str) -> LocalShare | None:
        return local_opener(self._target) if target_id == self._target.id else None

    def read_owner(self, bucket: str, name: str) -> TargetInfo:
        cmap = self._map()
        if bucket not in cmap.buckets:
            raise bucket_not_found(bucket)
        for tid in cmap.owners(bucket, name):
            info = self.target_info(tid, cmap)
            if info is not None:
                return info
        raise NoTargets(
            f"no owner of {bucket}/{name} has an address in the cluster map; retry shortly",
            bucket=bucket,
            object=name,
        )


def moss_router(target: Target, http: DuplexClient) -> FastRouter:
    """``http``: the client items read with a GET use (the app closes it at shutdown)."""
    router = FastRouter()

    async def serve(request: Request, bucket: str | None) -> Response:
        body = await request.body()
        t = target
        signed = signed_path(bucket, request.query_params.multi_items(), body)
        check(t, request, "read", batch_buckets(request, body, bucket), signed)  # before any 400
        refuse_unknown(request, (*QUERY, MAP_PARAM), bucket=bucket)
        if bucket is not None:
            validate_bucket(bucket)
        store = t.placement.cmap if t.placement is not None else None
        if store is None:  # never designated (the gateway needs a map to): misdirected
            raise InvalidRequest(
                f"target {t.id} has no cluster map to assemble a GetBatch with; "
                "send it to the gateway",
                target=t.id,
            )
        cmap = store.get()
        planned = request.query_params.get(MAP_PARAM)
        if planned is not None and not (planned.isascii() and planned.isdigit()):
            raise InvalidRequest(
                f"{MAP_PARAM}={planned!r} is not a cluster map version", target=t.id
            )
        if planned is not None and cmap.version < int(planned):
            cmap = await anyio.to_thread.run_sync(store.refresh)
        host = TargetHost(t, store)
        return await answer(
            host, http, request, bucket, parse_json(body, "the GetBatch request"), cmap
        )

    @router.get("/v1/ml/moss")
    async def get_batch_any(request: Request) -> Response:
        return await serve(request, None)

    @router.get("/v1/ml/moss/{bucket}")
    async def get_batch_bucket(bucket: str, request: Request) -> Response:
        return await serve(request, bucket)

    router.fast("/v1/ml/moss", ["GET"])  # wire/http/fastpath.py
    router.fast("/v1/ml/moss/{bucket}", ["GET"])
    return router
