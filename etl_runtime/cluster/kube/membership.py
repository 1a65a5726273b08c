"""``StatefulSetMembership``: the cluster map's members and addresses on Kubernetes.

On Kubernetes the members are the target StatefulSet's pods: ``spec.replicas``
= n gives the ids ``<sts>-0`` … ``<sts>-(n-1)`` (pod names are target ids).
Membership follows the StatefulSet, never pod readiness, so a pod that
restarts, fails its probes or is rescheduled keeps owning its objects (reads
go to a replica or answer 503 meanwhile; see ``gateway.placement``).

Every gateway replica runs one, after ``join`` (which seeds a brand-new map).
Twice a second it compares the map with what the watches say and, when they
differ, applies the change with ``ClusterMapStore.update``; changes are
idempotent, so two gateways converge on one version:

* scale down (``replicas`` drops): the ordinals at or above it leave at once
  (``ClusterMap.with_members``: a rebalance starts; the leaving pods hand
  their objects over before they exit, see ``target.decommission``);
* scale up: a new ordinal becomes a member once its pod has been Ready, so
  objects are not placed on a target that cannot take them yet; an ordinal
  already a member stays one whatever its pod does;
* ``urls``: every target pod with an IP, Ready or not, is written at its
  current address (``http`` container port). Addresses change on every pod
  restart; changing them is not a membership change and starts no rebalance.

Liveness (who answers now) is still ``KubeTargetDiscovery``'s Ready pods.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from kubernetes import client

from etl_runtime.cluster.clustermap import ClusterMap, ClusterMapStore
from etl_runtime.cluster.kube.config import api_client, default_namespace
from etl_runtime.cluster.kube.watch import WatchCache
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.eventloop import cancel_and_wait

log = logging.getLogger(__name__)
SYNC_SECONDS = 0.5


def ordinal_ids(statefulset: str, replicas: int) -> list[str]:
    return [f"{statefulset}-{i}" for i in range(replicas)]


class StatefulSetMembership:
    """Keeps ``members`` and ``urls`` of ``cmap`` in step with one StatefulSet.

    ``discovery`` is the gateway's ``KubeTargetDiscovery`` (its ``targets()``
    are the Ready pods, ``all_targets()`` every pod with an address).
    """

    def __init__(
        self,
        statefulset: str,
        discovery: Any,
        namespace: str | None = None,
        api: client.ApiClient | None = None,
        start: bool = True,
    ) -> None:
        self.statefulset = statefulset
        self.namespace = namespace or default_namespace()
        self.discovery = discovery
        self.cmap: ClusterMapStore | None = None
        self._api = api or api_client()
        self._task: asyncio.Task[None] | None = None
        self._cache = WatchCache(
            self._api,
            client.AppsV1Api(self._api).list_namespaced_stateful_set,
            what=f"statefulsets/{self.namespace}/{statefulset}",
            namespace=self.namespace,
            field_selector=f"metadata.name={statefulset}",
        )
        if start:
            self._cache.start()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._cache.wait_synced(timeout)

    def replicas(self) -> int | None:
        """``spec.replicas`` of the StatefulSet; None while it is not there."""
        sts = self._cache.objects.get(self.statefulset)
        if sts is None:
            return None
        n = (sts.get("spec") or {}).get("replicas")
        return 1 if n is None else int(n)

    def members(self, current: ClusterMap | None = None) -> list[str] | None:
        """The members the map should hold now (None: no StatefulSet, leave them be)."""
        n = self.replicas()
        if n is None:
            return None
        had = set(current.members) if current is not None else set()
        ready = {t.id for t in self.discovery.targets()}
        return [tid for tid in ordinal_ids(self.statefulset, n) if tid in had or tid in ready]

    def desired(self, m: ClusterMap) -> ClusterMap:
        """``m`` with this StatefulSet's members and its pods' addresses."""
        members = self.members(m)
        if members is not None:
            m = m.with_members(members)
        pods: list[TargetInfo] = self.discovery.all_targets()
        urls = {t.id: t.url for t in pods if m.urls.get(t.id) != t.url}
        if urls:
            m = replace(m, urls={**m.urls, **urls})
        return m

    def sync(self) -> ClusterMap | None:
        """One comparison; writes the map only when it differs (blocking I/O)."""
        if self.cmap is None:
            return None
        current = self.cmap.get()
        if self.desired(current) == current:
            return current
        new = self.cmap.update(self.desired)
        if new.members != current.members:
            log.warning(
                "StatefulSet %s: members %s (were %s); rebalance %d",
                self.statefulset,
                ",".join(new.members),
                ",".join(current.members),
                new.rebalance_id,
            )
        return new

    # -- running in the gateway (after join) ----------------------------------------

    async def start(self, cmap: ClusterMapStore) -> None:
        self.cmap = cmap
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="sluice-statefulset-members")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self._cache.stop()

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.sync)
            except Exception:  # the apiserver may be away for a moment: next round
                log.exception("syncing the cluster map with StatefulSet %s", self.statefulset)
            await asyncio.sleep(SYNC_SECONDS)


def ordinal_leaving(statefulset: str, pod: str, namespace: str | None = None) -> bool:
    """Is ``pod`` of ``statefulset`` being scaled away (ordinal >= ``spec.replicas``)?

    A target asks once, on SIGTERM: a restart (rolling update, eviction)
    keeps the ordinal; a scale-down removes it. RBAC: get on the StatefulSet.
    """
    prefix = f"{statefulset}-"
    if not pod.startswith(prefix) or not pod[len(prefix) :].isdigit():
        return False
    api = client.AppsV1Api(api_client())
    try:
        sts: Any = api.read_namespaced_stateful_set(statefulset, namespace or default_namespace())
    except client.ApiException as e:
        if e.status == 404:  # the StatefulSet itself is gone (uninstall): everyone leaves
            return False
        raise
    replicas = sts.spec.replicas if sts.spec.replicas is not None else 1
    return int(pod[len(prefix) :]) >= replicas
