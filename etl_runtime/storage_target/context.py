"""What every request handler of one target needs: its id, store, registry, secrets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from etl_runtime.cluster.records import EtlRegistry
from etl_runtime.etl.forward import EtlForwarder
from etl_runtime.providers.cache import RemoteCache
from etl_runtime.storage.copies import Placement
from etl_runtime.storage.store import ObjectStore


@dataclass
class Target:
    id: str
    store: ObjectStore
    registry: EtlRegistry
    forwarder: EtlForwarder
    token: str | None = None
    cluster_key: str | None = None
    placement: Placement | None = None
    read_token: str | None = None
    remote: RemoteCache | None = None  # remote (aws) buckets; needs a cluster map
    events: Any = None  # cluster/kube/events.py PodEvents on Kubernetes (--events), else None

    def token_records(self) -> Mapping[str, Any]:
        """The access tokens' records (revocation, ``core/tokens.py``) from the cluster map."""
        cmap = self.placement.cmap if self.placement is not None else None
        return cmap.get().tokens if cmap is not None else {}

    def view_sources(self, buckets: tuple[Any, ...]) -> list[str]:
        """The source bucket of each of ``buckets`` that is an ETL view (``core/access.py``
        checks a token for both: a GetBatch of a view on a target reads its source)."""
        cmap = self.placement.cmap if self.placement is not None else None
        if cmap is None or not buckets:
            return []
        known = cmap.get().buckets
        props = [known.get(b) for b in buckets if isinstance(b, str)]
        return [str(p.view["of"]) for p in props if p is not None and p.view.get("of")]
