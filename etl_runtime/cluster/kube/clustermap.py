"""``KubeClusterMap``: the cluster map kept in one ConfigMap, for Kubernetes.

The gateway replicas write it and every target reads it, as ``FileClusterMap``
does for the local cluster. The map is one JSON document under the data key
``cluster-map.json``.

* ``get()`` answers from a watch cache (``WatchCache`` on that one ConfigMap),
  so a request never waits on the apiserver. A map older than the one this
  process last wrote or saw is never served: versions only go up.
* ``update(change)`` is a read-modify-write with optimistic concurrency: read
  the ConfigMap, apply ``change``, write it back with the resourceVersion that
  was read (create it if absent); on ``409 Conflict`` read again and re-apply.
  Changes are functions of the map they are given, so when two gateways make
  the same change (both saw the StatefulSet scale, both create a bucket) the
  second one re-applies it to the first one's result, finds nothing to do and
  writes nothing: one version bump, one rebalance, no bucket lost.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from etl_runtime.cluster.clustermap import ClusterMap, bump_version
from etl_runtime.cluster.kube.config import api_client, default_namespace
from etl_runtime.cluster.kube.watch import WatchCache

log = logging.getLogger(__name__)

DATA_KEY = "cluster-map.json"
DEFAULT_NAME = "sluice-cluster-map"
UPDATE_ATTEMPTS = 20


class ClusterMapConflict(RuntimeError):
    """Too many concurrent writers: the map could not be updated."""


class KubeClusterMap:
    """``ClusterMapStore`` on the ConfigMap ``name`` of ``namespace``.

    RBAC: readers need get/list/watch on that ConfigMap; writers also update
    (and create, unless the chart made it).
    """

    def __init__(
        self,
        namespace: str | None = None,
        name: str = DEFAULT_NAME,
        api: client.ApiClient | None = None,
        start: bool = True,
    ) -> None:
        self.namespace = namespace or default_namespace()
        self.name = name
        self._api = api or api_client()
        self._core = client.CoreV1Api(self._api)
        self._cached = ClusterMap()
        self._lock = threading.Lock()
        self._cache = WatchCache(
            self._api,
            self._core.list_namespaced_config_map,
            what=f"configmaps/{self.namespace}/{name}",
            on_change=self._seen,
            namespace=self.namespace,
            field_selector=f"metadata.name={name}",
        )
        if start:
            self._cache.start()

    def start(self) -> KubeClusterMap:
        self._cache.start()
        return self

    def close(self) -> None:
        self._cache.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._cache.wait_synced(timeout)

    # -- reading -------------------------------------------------------------------

    def get(self) -> ClusterMap:
        return self._cached

    def refresh(self) -> ClusterMap:
        """Read the ConfigMap now (the watch may lag the apiserver by a while under
        load: a target told of a new bucket must not wait for it)."""
        obj = self._read()
        if obj is not None:
            self._offer(self._parse(obj))
        return self._cached

    def _offer(self, cmap: ClusterMap) -> None:
        with self._lock:
            if cmap.version >= self._cached.version:
                self._cached = cmap

    def _seen(self, objects: dict[str, dict[str, Any]]) -> None:
        obj = objects.get(self.name)
        if obj is not None:
            self._offer(self._parse(obj))

    def _parse(self, obj: dict[str, Any]) -> ClusterMap:
        text = (obj.get("data") or {}).get(DATA_KEY)
        if not text:
            return ClusterMap()
        try:
            return ClusterMap.from_dict(json.loads(text))
        except (ValueError, TypeError, KeyError) as e:
            # Someone edited it by hand: keep serving the last good map, say why.
            log.error("ConfigMap %s/%s: %s is not a cluster map: %s",
                      self.namespace, self.name, DATA_KEY, e)  # fmt: skip
            return self._cached

    def _read(self) -> dict[str, Any] | None:
        """The ConfigMap as stored now (not the cache: its resourceVersion matters)."""
        try:
            resp: Any = self._core.read_namespaced_config_map(
                self.name, self.namespace, _preload_content=False
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(json.loads(resp.data))

    # -- writing -------------------------------------------------------------------

    def update(self, change: Callable[[ClusterMap], ClusterMap]) -> ClusterMap:
        for attempt in range(UPDATE_ATTEMPTS):
            obj = self._read()
            old = self._parse(obj) if obj is not None else ClusterMap()
            new = bump_version(old, change(old))
            if new is old:
                self._offer(old)
                return old
            data = {DATA_KEY: json.dumps(new.to_dict(), indent=1)}
            try:
                if obj is None:
                    body: Any = {"metadata": {"name": self.name}, "data": data}
                    self._core.create_namespaced_config_map(self.namespace, body)
                else:
                    # obj carries the resourceVersion read above: a compare-and-swap,
                    # 409 Conflict if anyone wrote since.
                    body = {**obj, "data": {**(obj.get("data") or {}), **data}}
                    self._core.replace_namespaced_config_map(self.name, self.namespace, body)
            except ApiException as e:
                if e.status != 409:  # 409: Conflict, or AlreadyExists on create
                    raise
                time.sleep(random.uniform(0, 0.05 * (attempt + 1)))
                continue
            self._offer(new)
            return new
        raise ClusterMapConflict(
            f"ConfigMap {self.namespace}/{self.name}: gave up after {UPDATE_ATTEMPTS} "
            "conflicting writes"
        )
