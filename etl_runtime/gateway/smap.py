"""AIStore's cluster map and readiness from the gateway, for the official ``aistore`` SDK.

The SDK learns the cluster from ``GET /v1/daemon?what=smap`` (``Cluster.get_info``,
``get_primary_url``, ``is_ready``, and every direct read: ``get_reader(direct=True)``
picks the target itself). The shape is ``cluster/smap.py``'s, built here from
the cluster map and discovery:

* ``tmap``: every member target with an address; a member the health loop
  sees as away carries AIStore's maintenance flag, so the SDK's own placement
  skips it; without a cluster map, the live targets;
* ``pmap`` and ``proxy_si`` (the primary): this gateway, as ``"gateway"``, at
  the URL the caller used to reach it (behind a Service, the Service's).

``GET /v1/health?prr=true`` (``Cluster.is_ready``, sent to the primary's URL)
is 200 only while the cluster serves: at least one member target, every member
reachable; else 503 naming the target that is away. Without ``prr`` the
health answer is the gateway's liveness, as before.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from etl_runtime.cluster.records import TargetInfo
from etl_runtime.cluster.smap import SNODE_MAINT, smap_doc
from etl_runtime.core.errors import NoTargets
from etl_runtime.core.params import refuse_unknown, refuse_what
from etl_runtime.gateway.context import Gateway

DAEMON_WHATS = ("smap",)
READY_RETRY_AFTER = 2


def serving_targets(gw: Gateway) -> tuple[list[TargetInfo], set[str], int]:
    """(the targets objects are placed on, the ids reachable now, the map's version)."""
    alive = gw.alive_ids()
    if gw.cmap is None:
        return list(gw.discovery.targets()), alive, 0
    cmap = gw.cmap.get()
    infos = [gw.target_info(tid, cmap) for tid in cmap.members]
    return [i for i in infos if i is not None], alive, cmap.version


def smap(gw: Gateway, request: Request) -> dict[str, Any]:
    """The cluster map in AIStore's ``Smap`` shape."""
    targets, alive, version = serving_targets(gw)
    flagged = [(t.id, t.url, 0 if t.id in alive else SNODE_MAINT) for t in targets]
    return smap_doc(flagged, str(request.base_url), version)


def check_ready(gw: Gateway) -> None:
    """Raise a 503 unless the cluster serves: member targets, every one reachable."""
    targets, alive, _ = serving_targets(gw)
    members = gw.cmap.get().members if gw.cmap is not None else [t.id for t in targets]
    if not members:
        raise NoTargets(
            "the cluster is not ready: it has no member targets yet",
            retry_after=READY_RETRY_AFTER,
        )
    away = [t for t in members if t not in alive]
    if away:
        raise NoTargets(
            f"the cluster is not ready: target {away[0]!r} is not reachable right now",
            retry_after=READY_RETRY_AFTER,
            target=away[0],
        )


def daemon_router(gw: Gateway) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/daemon")
    async def daemon(request: Request) -> dict[str, Any]:
        gw.require_read(request)  # the targets and their addresses: cluster-wide
        refuse_unknown(request, ("what",))
        refuse_what(request, DAEMON_WHATS)
        return smap(gw, request)

    return router
