"""``etl_runtime.cluster.kube`` against the project's real control plane (tests/k8s)."""

from __future__ import annotations

from tests.k8s.fixtures import control_plane, k8s_namespace, kubelet  # noqa: F401
