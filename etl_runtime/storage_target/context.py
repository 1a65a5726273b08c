"""What every request handler of one target needs: its id, store, registry, secrets."""

from __future__ import annotations

from dataclasses import dataclass

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
