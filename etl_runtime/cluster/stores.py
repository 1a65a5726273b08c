"""Which store holds the cluster map: ``open_cluster_map(spec)``, from a server's flag.

Callers: the gateway's and the targets' ``__main__``. ``file:PATH`` is the
file store of ``cluster/clustermap.py`` (``sluice up``); ``kubernetes[:NAME]``
is the ConfigMap store of ``cluster/kube/clustermap.py``, imported only
when asked for, so a local cluster never loads the kubernetes client.
"""

from __future__ import annotations

import os

from etl_runtime.cluster.clustermap import ClusterMapStore, FileClusterMap


def open_cluster_map(spec: str | None) -> ClusterMapStore | None:
    """``file:PATH`` -> ``FileClusterMap``; ``kubernetes[:NAME]`` -> ``KubeClusterMap``
    (the ConfigMap NAME, default ``$SLUICE_CLUSTER_MAP_NAME`` or ``sluice-cluster-map``,
    in ``$SLUICE_NAMESPACE``); ``None``/empty -> no shared map."""
    if not spec:
        return None
    if spec.startswith("file:"):
        return FileClusterMap(spec[len("file:") :])
    kind, _, name = spec.partition(":")
    if kind == "kubernetes":
        from etl_runtime.cluster.kube import clustermap as kube  # the kubernetes client

        name = name or os.environ.get("SLUICE_CLUSTER_MAP_NAME") or kube.DEFAULT_NAME
        return kube.KubeClusterMap(name=name)  # its watch starts here
    raise ValueError(f"bad cluster map {spec!r}: use file:PATH or kubernetes[:CONFIGMAP]")
