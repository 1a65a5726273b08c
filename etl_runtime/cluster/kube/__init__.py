"""The data plane's Kubernetes side: ETL custom resources and target pods.

kopf-free glue over the official ``kubernetes`` client, used by the targets
(``KubeEtlRegistry``), the gateway (``KubeTargetDiscovery``,
``KubeEtlBackend``) and the operator (``api_client``, ``record_from_cr``).
Reads are served from watch-fed caches so per-request lookups stay cheap.
"""

from __future__ import annotations

from etl_runtime.cluster.kube.backend import KubeEtlBackend
from etl_runtime.cluster.kube.config import api_client, default_namespace
from etl_runtime.cluster.kube.discovery import KubeTargetDiscovery
from etl_runtime.cluster.kube.records import (
    ETL_GROUP,
    ETL_PLURAL,
    ETL_VERSION,
    TARGET_SELECTOR,
    record_from_cr,
)
from etl_runtime.cluster.kube.registry import KubeEtlRegistry

__all__ = [
    "ETL_GROUP",
    "ETL_PLURAL",
    "ETL_VERSION",
    "TARGET_SELECTOR",
    "KubeEtlBackend",
    "KubeEtlRegistry",
    "KubeTargetDiscovery",
    "api_client",
    "default_namespace",
    "record_from_cr",
]
