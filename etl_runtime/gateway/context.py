"""The gateway's collaborators and its fan-out to targets.

``Gateway`` holds what every handler needs — live targets (``TargetDiscovery``),
the cluster map (``ClusterMapStore``: members and buckets), the ETL write side
(``EtlBackend``), secrets, one pooled HTTP client — and ``fanout`` calls the
same internal path on every live target at once.

Without a cluster map (a gateway started without ``--cluster-map``)
placement and bucket existence follow the live targets, as before the map
existed; see docs/placement.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import Request

from etl_runtime.cluster.clustermap import ClusterMap, ClusterMapStore
from etl_runtime.cluster.records import EtlBackend, TargetDiscovery, TargetInfo
from etl_runtime.core import access, auth, tls
from etl_runtime.core.errors import NoTargets, SluiceError

if TYPE_CHECKING:
    from etl_runtime.gateway.membership import MembershipSource

FANOUT_TIMEOUT = 15.0


@dataclass
class Gateway:
    discovery: TargetDiscovery
    backend: EtlBackend
    token: str | None = None
    cluster_key: str | None = None
    cmap: ClusterMapStore | None = None
    read_token: str | None = None  # if set, reads need it (or the user token)
    members: list[str] | None = None  # configured members; default: every known target
    membership: MembershipSource | None = None  # Kubernetes: members from the StatefulSet
    rebalance_monitor: Any = field(default=None, repr=False)  # membership.RebalanceMonitor
    job_views: Any = field(default=None, repr=False)  # jobs.JobViews (jobs.job_views)
    _http: httpx.AsyncClient | None = field(default=None, repr=False)

    async def start(self) -> None:
        self._http = httpx.AsyncClient(
            trust_env=False,
            verify=tls.client_context(),  # SLUICE_CA (core/tls.py)
            timeout=FANOUT_TIMEOUT,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError("Gateway.start() was not called")
        return self._http

    # -- who may do what -------------------------------------------------------

    def caller_has_token(self, request: Request) -> bool:
        return auth.bearer_ok(request.headers.get("authorization"), self.token)

    def caller_may_read(self, request: Request) -> bool:
        return auth.read_ok(request.headers.get("authorization"), self.read_token, self.token)

    def token_records(self) -> Mapping[str, Any]:
        """The access tokens' records (revocation), from the cluster map."""
        return self.cmap.get().tokens if self.cmap is not None else {}

    def require_write(self, request: Request, *buckets: str | access.InBody) -> None:
        """``core/access.py``'s check: no bucket is a cluster-wide call."""
        access.check(self, request, "write", buckets)

    def require_read(self, request: Request, *buckets: str | access.InBody) -> None:
        """Also the source of each bucket that is an ETL view: reading one reads both
        (looked up for an access token only: every other credential reads every bucket)."""
        if access.carries_token(request):
            buckets = (*buckets, *self.view_sources(buckets))
        access.check(self, request, "read", buckets)

    def view_sources(self, buckets: tuple[str | access.InBody, ...]) -> list[str]:
        """The source bucket of each of ``buckets`` that is an ETL view."""
        if self.cmap is None or not buckets:
            return []
        known = self.cmap.get().buckets
        props = [known.get(b) for b in buckets if isinstance(b, str)]
        return [str(p.view["of"]) for p in props if p is not None and p.view.get("of")]

    def target_headers(self) -> dict[str, str]:
        """Headers for the gateway's own calls to targets (it holds the user token)."""
        held = self.token or self.read_token
        return {"Authorization": f"Bearer {held}"} if held else {}

    # -- targets ---------------------------------------------------------------

    def known_targets(self) -> list[TargetInfo]:
        """Every target we know an address for, reachable now or not.

        That is what discovery knows (on Kubernetes: every target pod with an
        IP, Ready or not) plus each member of the cluster map whose pod is gone
        right now, at its last address in the map: it is away, not forgotten.
        """
        found = list(getattr(self.discovery, "all_targets", self.discovery.targets)())
        if self.cmap is not None:
            cmap, have = self.cmap.get(), {t.id for t in found}
            found += [
                TargetInfo(id=m, url=cmap.urls[m])
                for m in cmap.members
                if m not in have and m in cmap.urls
            ]
        return found

    def alive_ids(self) -> set[str]:
        return {t.id for t in self.discovery.targets()}

    def suspect_ids(self) -> set[str]:
        """Targets slow to answer their health probe (reads prefer their copies)."""
        suspects = getattr(self.discovery, "suspect_ids", None)
        return suspects() if suspects is not None else set()

    def down_reasons(self) -> dict[str, str]:
        """Targets marked down (a crash loop) -> why; only discovery that knows says."""
        reasons = getattr(self.discovery, "down_reasons", None)
        return reasons() if reasons is not None else {}

    def target_info(self, target_id: str, cmap: ClusterMap | None = None) -> TargetInfo | None:
        for t in self.known_targets():
            if t.id == target_id:
                return t
        url = (cmap or (self.cmap.get() if self.cmap else ClusterMap())).urls.get(target_id)
        return TargetInfo(id=target_id, url=url) if url else None

    def read_owner(self, bucket: str, name: str) -> TargetInfo:
        """The target a read of ``bucket/name`` goes to (``getbatch.host.BatchHost``)."""
        from etl_runtime.gateway.placement import route  # placement builds on this module

        return route(self, "GET", bucket, name)

    def local_share(self, target_id: str) -> None:
        """No share is read in the gateway's process: it holds no data (``BatchHost``)."""
        return None

    def live_targets(self) -> list[TargetInfo]:
        targets = self.discovery.targets()
        if not targets:
            raise NoTargets("no storage target is alive; check `GET /v1/cluster` and retry")
        return targets

    async def fanout(
        self, method: str, path: str, **kwargs: Any
    ) -> list[tuple[TargetInfo, httpx.Response | httpx.HTTPError]]:
        """``method path`` on every live target; each answer or the error it raised."""
        targets = self.discovery.targets() if self.cmap is not None else self.live_targets()
        headers = {**self.target_headers(), **kwargs.pop("headers", {})}

        async def one(t: TargetInfo) -> httpx.Response | httpx.HTTPError:
            try:
                return await self.http.request(method, t.url + path, headers=headers, **kwargs)
            except httpx.HTTPError as e:
                return e

        answers = await asyncio.gather(*(one(t) for t in targets))
        return list(zip(targets, answers, strict=True))


def unreachable(target: TargetInfo, err: httpx.HTTPError | httpx.Response) -> NoTargets:
    what = f"answered {err.status_code}" if isinstance(err, httpx.Response) else repr(err)
    return NoTargets(f"target {target.id!r} ({target.url}) {what}; retry shortly", target=target.id)


def passthrough(r: httpx.Response) -> SluiceError:
    """A target's 4xx (or 507) answer, re-raised as-is."""
    try:
        body = r.json()
    except ValueError:
        body = {"error": r.text}
    err = SluiceError(str(body.get("error", r.text)))
    err.status, err.kind = r.status_code, str(body.get("kind", "TargetError"))
    err.context = {k: v for k, v in body.items() if k not in ("error", "kind")}
    return err
