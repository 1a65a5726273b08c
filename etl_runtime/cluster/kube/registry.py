"""``KubeEtlRegistry``: the targets' view of ETL custom resources.

A target asks ``get(name)`` on every ``?etl_name=`` request, so the answer
comes from a dict that a background watch keeps current; each CR is converted
to an ``EtlRecord`` once, when it changes, not per request.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client

from etl_runtime.cluster.kube.config import api_client, default_namespace
from etl_runtime.cluster.kube.records import ETL_GROUP, ETL_PLURAL, ETL_VERSION, record_from_cr
from etl_runtime.cluster.kube.watch import WatchCache
from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core.spec import InvalidSpec

log = logging.getLogger(__name__)


class KubeEtlRegistry:
    """``EtlRegistry`` over the ETL CRs of one namespace (read-only RBAC: get/list/watch).

    The watch starts at construction; ``wait_synced()`` blocks until the first
    list has landed (``get()`` answers ``None`` before that).
    """

    def __init__(
        self,
        namespace: str | None = None,
        api: client.ApiClient | None = None,
        start: bool = True,
    ) -> None:
        self.namespace = namespace or default_namespace()
        self._api = api or api_client()
        self._records: dict[str, EtlRecord] = {}
        self._seen: dict[str, str] = {}  # name -> resourceVersion converted
        self._cache = WatchCache(
            self._api,
            client.CustomObjectsApi(self._api).list_namespaced_custom_object,
            what=f"etls/{self.namespace}",
            on_change=self._rebuild,
            group=ETL_GROUP,
            version=ETL_VERSION,
            namespace=self.namespace,
            plural=ETL_PLURAL,
        )
        if start:
            self._cache.start()

    def start(self) -> KubeEtlRegistry:
        self._cache.start()
        return self

    def close(self) -> None:
        self._cache.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._cache.wait_synced(timeout)

    def get(self, name: str) -> EtlRecord | None:
        return self._records.get(name)

    def names(self) -> list[str]:
        return sorted(self._records)

    def _rebuild(self, objects: dict[str, dict[str, Any]]) -> None:
        records: dict[str, EtlRecord] = {}
        seen: dict[str, str] = {}
        for name, obj in objects.items():
            version = str(obj["metadata"].get("resourceVersion"))
            old = self._records.get(name)
            if old is not None and self._seen.get(name) == version:
                records[name], seen[name] = old, version
                continue
            try:
                records[name] = record_from_cr(obj)
                seen[name] = version
            except (InvalidSpec, KeyError, TypeError, ValueError) as e:
                log.warning("ETL %s/%s has an unusable spec: %s", self.namespace, name, e)
        self._records, self._seen = records, seen
