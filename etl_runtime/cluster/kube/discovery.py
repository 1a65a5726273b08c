"""``KubeTargetDiscovery``: the gateway's view of live storage target pods."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from etl_runtime.cluster.kube.config import api_client, default_namespace
from etl_runtime.cluster.kube.records import TARGET_SELECTOR, pod_is_ready, target_from_pod
from etl_runtime.cluster.kube.watch import WatchCache
from etl_runtime.cluster.records import TargetInfo


class KubeTargetDiscovery:
    """``TargetDiscovery`` over Ready pods matching ``selector`` in one namespace.

    ``targets()`` is a cached, sorted list (by id) that a pod watch rebuilds
    on every change; ``url`` uses the container port named ``http`` (else the
    first declared port). ``all_targets()`` also lists the pods that have an
    address but are not Ready (starting, failing probes, terminating): they
    are away, not gone.
    """

    def __init__(
        self,
        namespace: str | None = None,
        selector: str = TARGET_SELECTOR,
        api: client.ApiClient | None = None,
        start: bool = True,
    ) -> None:
        self.namespace = namespace or default_namespace()
        self.selector = selector
        self._api = api or api_client()
        self._targets: list[TargetInfo] = []
        self._all: list[TargetInfo] = []
        self._cache = WatchCache(
            self._api,
            client.CoreV1Api(self._api).list_namespaced_pod,
            what=f"pods/{self.namespace}[{selector}]",
            on_change=self._rebuild,
            namespace=self.namespace,
            label_selector=selector,
        )
        if start:
            self._cache.start()

    def start(self) -> KubeTargetDiscovery:
        self._cache.start()
        return self

    def close(self) -> None:
        self._cache.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._cache.wait_synced(timeout)

    def targets(self) -> list[TargetInfo]:
        return self._targets

    def all_targets(self) -> list[TargetInfo]:
        return self._all

    def _rebuild(self, pods: dict[str, dict[str, Any]]) -> None:
        ready = {name for name, p in pods.items() if pod_is_ready(p)}
        found = sorted(
            (t for t in map(target_from_pod, pods.values()) if t is not None), key=lambda t: t.id
        )
        self._all = found
        self._targets = [t for t in found if t.id in ready]
